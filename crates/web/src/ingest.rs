//! `POST /api/v1/ingest`: the push API v1 (BRIEF section 3).
//!
//! Order of checks: token (401), body size (413), decoding (400), then record by record. The
//! reply is 200 with per-list counts and every rejected record's path and reason, or 403 when
//! the token was not allowed to write anything in the body.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpuledger_ledger::{decode_body, DecodeError, TimeBounds};
use gpuledger_store::Role;
use serde_json::{json, Value};

use crate::{bearer, AppState};

/// The status and JSON body of one ingest, whether it came over HTTP or from inside the process.
#[derive(Debug, Clone)]
pub struct IngestReply {
    pub status: StatusCode,
    pub body: Value,
}

impl IntoResponse for IngestReply {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

fn reply(status: StatusCode, message: impl Into<String>) -> IngestReply {
    IngestReply {
        status,
        body: json!({ "error": message.into() }),
    }
}

/// The whole ingest path after the body is read: token, decoding, validation, storage. The
/// demo calls this too, so its data takes exactly the path of any push.
pub async fn ingest_bytes(
    state: &AppState,
    token: Option<&str>,
    content_encoding: Option<&str>,
    user_agent: Option<&str>,
    bytes: &[u8],
) -> IngestReply {
    let Some(token) = token else {
        return reply(
            StatusCode::UNAUTHORIZED,
            "missing token: send `Authorization: Bearer <token>` (mint one with `gpuledger token create --source NAME`)",
        );
    };
    let info = match state.store.verify_token(token).await {
        Ok(Some(info)) => info,
        Ok(None) => return reply(StatusCode::UNAUTHORIZED, "unknown token"),
        Err(e) => return reply(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    if info.role != Role::Ingest {
        return reply(
            StatusCode::FORBIDDEN,
            "a viewer token cannot write; use an ingest token",
        );
    }
    let body = match decode_body(bytes, content_encoding, state.config.limits) {
        Ok(b) => b,
        Err(e) => {
            let status = if e.is_too_large() {
                StatusCode::PAYLOAD_TOO_LARGE
            } else if matches!(e, DecodeError::UnsupportedEncoding(_)) {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            } else {
                StatusCode::BAD_REQUEST
            };
            return reply(status, e.to_string());
        }
    };
    let now = state.now();
    let validated = TimeBounds::new(now, state.store.settings()).validate_body(body);
    let kind = match user_agent {
        Some(ua) if ua.starts_with("gpuledger-agent") => "agent",
        Some(ua) if ua.starts_with("gpuledger-demo") => "demo",
        _ => "push",
    };
    let outcome = match state
        .store
        .ingest(&info.principal(kind), validated, now)
        .await
    {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(source = %info.source, error = %e, "ingest failed");
            return reply(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("could not store the body, nothing was kept; retry: {e}"),
            );
        }
    };
    if !outcome.rejected.is_empty() {
        tracing::info!(
            source = %info.source,
            rejected = outcome.rejected.len(),
            first = %outcome.rejected[0],
            "push had rejected records"
        );
    }
    let status = if outcome.nothing_allowed() {
        StatusCode::FORBIDDEN
    } else {
        StatusCode::OK
    };
    let mut body = serde_json::to_value(&outcome).unwrap_or_default();
    if status == StatusCode::FORBIDDEN {
        body["error"] = json!("this token may not write any record in the body; see `rejected`");
    }
    IngestReply { status, body }
}

pub async fn handler(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let token = bearer(&headers);
    // Authenticate before reading a possibly large body.
    if token.is_none() {
        return ingest_bytes(&state, None, None, None, &[])
            .await
            .into_response();
    }
    let limit = state.config.limits.max_body_bytes;
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            return reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body is over the limit of {limit} bytes; split it into smaller pushes"),
            )
            .into_response()
        }
    };
    let header_str = |name| {
        headers
            .get(name)
            .and_then(|v: &header::HeaderValue| v.to_str().ok())
    };
    ingest_bytes(
        &state,
        token.as_deref(),
        header_str(header::CONTENT_ENCODING),
        header_str(header::USER_AGENT),
        &bytes,
    )
    .await
    .into_response()
}
