//! `POST /api/v1/ingest`: the push API v1 (BRIEF section 3).
//!
//! Order of checks: token (401, before a byte of the body is read), declared size (413, before
//! the body too), the body within the body timeout (408) and the size limit (413), decoding
//! (400), the body's shape (422 for a key other than the three lists, or a list that is not an
//! array: nothing kept), then record by record. The reply is 200 with per-list counts and
//! every rejected record's path and reason when any record was kept; when none was, 403 if the
//! token was not allowed to write them, else 422. A refusal sent before the whole body was read
//! closes the connection.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpuledger_ledger::{decode_body, DecodeError, TimeBounds};
use gpuledger_store::{IngestOutcome, Role, TokenInfo};
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
    match authenticate(state, token, user_agent).await {
        Ok(info) => ingest_authenticated(state, &info, content_encoding, user_agent, bytes).await,
        Err(refused) => refused,
    }
}

/// How the writer shows on the sources page and in the audit log, from its `User-Agent`.
fn actor(user_agent: Option<&str>) -> &'static str {
    match user_agent {
        Some(ua) if ua.starts_with("gpuledger-agent") => "agent",
        Some(ua) if ua.starts_with("gpuledger-demo") => "demo",
        _ => "push",
    }
}

/// Note in the audit log (and on `/metrics`) a push refused before it reached the database,
/// and pass the reply on.
fn refuse(state: &AppState, source: &str, user_agent: Option<&str>, r: IngestReply) -> IngestReply {
    let reason = r
        .status
        .canonical_reason()
        .unwrap_or("refused")
        .to_ascii_lowercase();
    let outcome = match r.status {
        StatusCode::UNAUTHORIZED if source.is_empty() => "401 unknown token".to_string(),
        s => format!("{} {reason}", s.as_u16()),
    };
    state
        .limiter
        .refused(state.now().timestamp(), source, actor(user_agent), &outcome);
    state.metrics.refused(source, r.status.as_u16());
    r
}

/// The ingest token behind `token`, or the 401/403/500 reply that refuses the push.
async fn authenticate(
    state: &AppState,
    token: Option<&str>,
    user_agent: Option<&str>,
) -> Result<TokenInfo, IngestReply> {
    let Some(token) = token else {
        return Err(refuse(
            state,
            "",
            user_agent,
            reply(
                StatusCode::UNAUTHORIZED,
                "missing token: send `Authorization: Bearer <token>` (mint one with `gpuledger token create --source NAME`)",
            ),
        ));
    };
    let info = match state.store.verify_token(token).await {
        Ok(Some(info)) => info,
        Ok(None) => {
            return Err(refuse(
                state,
                "",
                user_agent,
                reply(StatusCode::UNAUTHORIZED, "unknown token"),
            ))
        }
        Err(e) => return Err(reply(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    };
    if info.role != Role::Ingest {
        return Err(refuse(
            state,
            &info.source,
            user_agent,
            reply(
                StatusCode::FORBIDDEN,
                "a viewer token cannot write; use an ingest token",
            ),
        ));
    }
    Ok(info)
}

/// Decoding, validation and storage of a body an ingest token sent.
async fn ingest_authenticated(
    state: &AppState,
    info: &TokenInfo,
    content_encoding: Option<&str>,
    user_agent: Option<&str>,
    bytes: &[u8],
) -> IngestReply {
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
            return refuse(
                state,
                &info.source,
                user_agent,
                reply(status, e.to_string()),
            );
        }
    };
    let now = state.now();
    let validated = TimeBounds::new(now, state.store.settings()).validate_body(body);
    if validated.malformed {
        let outcome = IngestOutcome {
            rejected: validated.rejections,
            ..Default::default()
        };
        return refuse(
            state,
            &info.source,
            user_agent,
            refused(
                StatusCode::UNPROCESSABLE_ENTITY,
                &outcome,
                "the body may carry only the lists `gpus`, `samples` and `allocations`, each an \
                 array; nothing was kept, see `rejected`",
            ),
        );
    }
    let kind = actor(user_agent);
    // What the push takes out of its source's rate bucket: every record it carried. The
    // demo's in-process loads are not pushes a team makes.
    if let (Some(limit), false) = (&state.config.rate, kind == "demo") {
        let records = validated.gpus.len()
            + validated.samples.len()
            + validated.allocations.len()
            + validated.rejections.len();
        state.limiter.charge(
            limit,
            &info.source,
            records as u64,
            std::time::Instant::now(),
        );
    }
    let outcome = match state
        .store
        .ingest(&info.principal(kind), validated, now)
        .await
    {
        Ok(o) => {
            state.metrics.ingested(&info.source, &o);
            o
        }
        Err(e) => {
            state.metrics.push_failed();
            tracing::error!(source = %info.source, error = %e, "ingest failed");
            return refuse(
                state,
                &info.source,
                user_agent,
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("could not store the body, nothing was kept; retry: {e}"),
                ),
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
    let a = outcome.accepted;
    if a.gpus + a.samples + a.allocations > 0 || outcome.rejected.is_empty() {
        return IngestReply {
            status: StatusCode::OK,
            body: serde_json::to_value(&outcome).unwrap_or_default(),
        };
    }
    // Nothing kept: a client, or `curl -f`, must notice.
    if outcome.nothing_allowed() {
        refused(
            StatusCode::FORBIDDEN,
            &outcome,
            "this token may not write any record in the body; see `rejected`",
        )
    } else {
        refused(
            StatusCode::UNPROCESSABLE_ENTITY,
            &outcome,
            "no record in the body could be kept; fix the records named in `rejected`",
        )
    }
}

/// A reply that kept nothing: the usual counts and rejections, and `error` saying why.
fn refused(status: StatusCode, outcome: &IngestOutcome, error: &str) -> IngestReply {
    let mut body = serde_json::to_value(outcome).unwrap_or_default();
    body["error"] = json!(error);
    IngestReply { status, body }
}

/// An answer sent before the body was read in full: the connection closes after it, so the
/// rest of the body is never waited for.
fn closing(reply: IngestReply) -> Response {
    let mut resp = reply.into_response();
    resp.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    resp
}

pub async fn handler(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let user_agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok());
    // The token first, then the source's rate and the declared size: none waits for a byte of
    // the body.
    let info = match authenticate(&state, bearer(&headers).as_deref(), user_agent).await {
        Ok(info) => info,
        Err(refused) => return closing(refused),
    };
    if let Some(limit) = &state.config.rate {
        if let Err(wait) = state
            .limiter
            .check(limit, &info.source, std::time::Instant::now())
        {
            let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
            let mut resp = closing(refuse(
                &state,
                &info.source,
                user_agent,
                reply(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "source `{}` pushes faster than its limit of {} records/s (`[ingest] \
                         records_per_sec`, bursts of {}); nothing was read or kept: retry after \
                         {secs} s",
                        info.source, limit.records_per_sec, limit.burst
                    ),
                ),
            ));
            resp.headers_mut().insert(
                header::RETRY_AFTER,
                header::HeaderValue::from_str(&secs.to_string())
                    .unwrap_or(header::HeaderValue::from_static("1")),
            );
            return resp;
        }
    }
    let limit = state.config.limits.max_body_bytes;
    let too_large = || {
        closing(refuse(
            &state,
            &info.source,
            user_agent,
            reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body is over the limit of {limit} bytes; split it into smaller pushes"),
            ),
        ))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large();
    }
    let timeout = state.config.server.body_timeout;
    let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return too_large(),
        Err(_) => {
            return closing(refuse(
                &state,
                &info.source,
                user_agent,
                reply(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the body did not arrive within {} s (`[server] body_timeout_secs`); \
                         send it at once, or in smaller pushes",
                        timeout.as_secs_f64()
                    ),
                ),
            ))
        }
    };
    let header_str = |name| {
        headers
            .get(name)
            .and_then(|v: &header::HeaderValue| v.to_str().ok())
    };
    ingest_authenticated(
        &state,
        &info,
        header_str(header::CONTENT_ENCODING),
        header_str(header::USER_AGENT),
        &bytes,
    )
    .await
    .into_response()
}
