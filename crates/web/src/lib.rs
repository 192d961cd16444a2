//! gpuledger's HTTP surface: the push API, the query API (JSON and CSV), the OpenAPI document
//! and the server-rendered pages, all on one axum router over a [`Store`].
//!
//! Reading needs no token by default (the server binds to localhost); `read_requires_token`
//! makes every read need a viewer token. Writing always needs an ingest token.

mod api;
mod contract;
mod csv;
mod forecast;
mod ingest;
mod limits;
mod metrics;
pub mod notify;
mod openapi;
mod params;
mod server;
mod tls;
mod ui;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use gpuledger_ledger::BodyLimits;
use gpuledger_store::{Role, Store};

pub use axum::http::StatusCode;
pub use ingest::{ingest_bytes, IngestReply};
pub use limits::{Limiter, RateLimit};
pub use metrics::Metrics;
pub use openapi::OPENAPI_JSON;
pub use params::ProxyIdentity;
pub use tls::TlsFiles;

/// How long a client may take and how many may be served at once (`[server]`): a client that
/// sends slowly, or not at all, cannot hold a connection for long, nor the server's file
/// descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Time to send a request's head, counted from when the server starts waiting for it: on a
    /// new connection and between requests on a kept-alive one (so it is the idle timeout too).
    pub header_timeout: std::time::Duration,
    /// Time to send a push body in full, once its head is in.
    pub body_timeout: std::time::Duration,
    /// Connections served at once; more wait in the listen backlog until one closes.
    pub max_connections: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            header_timeout: std::time::Duration::from_secs(10),
            body_timeout: std::time::Duration::from_secs(60),
            max_connections: 512,
        }
    }
}

/// Settings of the HTTP surface.
#[derive(Debug, Clone)]
pub struct WebConfig {
    pub limits: BodyLimits,
    /// How fast one source may push (`[ingest] records_per_sec`, `records_burst`); `None`: no
    /// limit.
    pub rate: Option<RateLimit>,
    pub server: ServerLimits,
    /// Serve HTTPS with this certificate and key (reloaded when they change); plain HTTP
    /// without.
    pub tls: Option<TlsFiles>,
    /// Reads (API and pages) need a viewer token.
    pub read_requires_token: bool,
    /// With `read_requires_token`, a request without a token may instead carry the user and
    /// groups an authenticating proxy in front of the server set.
    pub proxy: Option<ProxyIdentity>,
    /// Label every page as demo data.
    pub demo: bool,
    /// The team registry (`[teams.<name>]`), by team name.
    pub teams: std::collections::BTreeMap<String, gpuledger_model::TeamInfo>,
}

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig {
            limits: BodyLimits::default(),
            rate: Some(RateLimit::default()),
            server: ServerLimits::default(),
            tls: None,
            read_requires_token: false,
            proxy: None,
            demo: false,
            teams: Default::default(),
        }
    }
}

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub config: Arc<WebConfig>,
    /// The clock; tests and the demo may fix it.
    pub clock: Arc<dyn Fn() -> chrono::DateTime<chrono::Utc> + Send + Sync>,
    /// What `/metrics` reports.
    pub metrics: Arc<metrics::Metrics>,
    /// Push rate buckets and refusals not yet in the audit log.
    pub limiter: Arc<limits::Limiter>,
}

impl AppState {
    pub fn new(store: Store, config: WebConfig) -> AppState {
        AppState {
            store,
            config: Arc::new(config),
            clock: Arc::new(chrono::Utc::now),
            metrics: Default::default(),
            limiter: Default::default(),
        }
    }

    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        (self.clock)()
    }
}

/// A JSON error body: `{"error": "..."}` with a status.
pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

pub(crate) fn bearer(req_headers: &axum::http::HeaderMap) -> Option<String> {
    let value = req_headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

/// With `read_requires_token`, a read needs a viewer token; a viewer token minted with
/// `--team` reads only those teams (its [`params::ReadScope`] goes with the request).
async fn require_viewer(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    if !state.config.read_requires_token {
        return next.run(req).await;
    }
    let Some(token) = bearer(req.headers()) else {
        if let Some(scope) = state
            .config
            .proxy
            .as_ref()
            .and_then(|p| p.scope(req.headers()))
        {
            return match scope {
                Ok(scope) => {
                    req.extensions_mut().insert(scope);
                    next.run(req).await
                }
                Err(why) => error(StatusCode::FORBIDDEN, why),
            };
        }
        return error(
            StatusCode::UNAUTHORIZED,
            "reading needs a viewer token: send `Authorization: Bearer <token>` \
             (mint one with `gpuledger token create --viewer --source NAME`)",
        );
    };
    match state.store.verify_token(&token).await {
        Ok(Some(info)) if info.role == Role::Viewer => {
            req.extensions_mut().insert(params::ReadScope(info.teams));
            next.run(req).await
        }
        Ok(_) => error(
            StatusCode::UNAUTHORIZED,
            "unknown, revoked or expired token, or not a viewer token",
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// How long `/readyz` waits for the database before it answers 503: shorter than a probe's
/// usual timeout, so the probe sees "not ready" rather than a hung request.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Readiness: 200 when the database answers a trivial query, 503 otherwise. `/healthz` says
/// only that the process serves HTTP (a liveness probe must not restart the server because its
/// database is away). The error goes to the log, not to the unauthenticated caller.
async fn readyz(State(state): State<AppState>) -> Response {
    let failure = match tokio::time::timeout(READY_TIMEOUT, state.store.ping()).await {
        Ok(Ok(())) => return (StatusCode::OK, "ready\n").into_response(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {} s", READY_TIMEOUT.as_secs()),
    };
    tracing::warn!(error = %failure, "not ready: the database did not answer");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "not ready: the database did not answer\n",
    )
        .into_response()
}

/// The content security policy of every answer: scripts and styles only from the server's own
/// files (`/static/…`), nothing inline, nothing from elsewhere, no framing. The pages hold no
/// inline script, style element or style attribute, so nothing needs a hash or a nonce.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// Security headers on every answer, pages and API alike (a handler's own value wins).
async fn security_headers(mut resp: Response) -> Response {
    use axum::http::header::{
        CONTENT_SECURITY_POLICY as CSP, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
    };
    use axum::http::HeaderValue;
    let h = resp.headers_mut();
    for (name, value) in [
        (CSP, CONTENT_SECURITY_POLICY),
        (X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (X_FRAME_OPTIONS, "DENY"),
        (REFERRER_POLICY, "no-referrer"),
    ] {
        h.entry(name).or_insert(HeaderValue::from_static(value));
    }
    resp
}

/// The whole router.
pub fn router(state: AppState) -> Router {
    let reads = Router::new()
        .route("/", get(ui::overview))
        .route("/inventory", get(ui::inventory))
        .route("/gpus/{uuid}", get(ui::gpu_page))
        .route("/teams", get(ui::teams))
        .route("/teams/{team}", get(ui::team_page))
        .route("/usage", get(ui::usage))
        .route("/waste", get(ui::waste))
        .route("/sources", get(ui::sources_page))
        .route("/api/v1/gpus", get(api::gpus))
        .route("/api/v1/gpus/{uuid}", get(api::gpu))
        .route("/api/v1/summary", get(api::summary))
        .route("/api/v1/sources", get(api::sources))
        .route("/api/v1/audit", get(api::audit))
        .route("/api/v1/teams", get(api::teams))
        .route("/api/v1/savings", get(ui::savings_api))
        .route("/api/v1/used-by", get(api::used_by))
        .route("/api/v1/billing", get(api::billing))
        .route("/api/v1/forecast", get(forecast::forecast))
        .route("/api/v1/openapi.json", get(openapi::serve))
        .route("/metrics", get(metrics::serve))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_viewer,
        ));
    Router::new()
        .merge(reads)
        .route(
            "/api/v1/ingest",
            post(ingest::handler).layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/static/{file}", get(ui::asset))
        .route("/readyz", get(readyz))
        .route_layer(middleware::from_fn(contract::refuse_unknown_query))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "no such page or endpoint; see /api/v1/openapi.json",
            )
        })
        .with_state(state)
        .layer(middleware::map_response(security_headers))
}

/// Serve until the future `shutdown` resolves, within `state.config.server`'s limits
/// ([`server::serve`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = state.config.server;
    let tls = match &state.config.tls {
        None => None,
        Some(files) => Some(std::sync::Arc::new(
            tls::Tls::load(files.clone())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
        )),
    };
    // Refused pushes reach the audit log in batches, and the last batch at shutdown.
    let flusher = {
        let state = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(limits::FLUSH_EVERY);
            loop {
                tick.tick().await;
                if let Err(e) = state.limiter.flush(&state.store).await {
                    tracing::warn!(error = %e, "could not write refusals to the audit log; will retry");
                }
            }
        })
    };
    let served = server::serve(listener, router(state.clone()), limits, tls, shutdown).await;
    flusher.abort();
    if let Err(e) = state.limiter.flush(&state.store).await {
        tracing::warn!(error = %e, "could not write the last refusals to the audit log");
    }
    served
}
