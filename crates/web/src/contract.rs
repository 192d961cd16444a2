//! The API contract as data: every operation the OpenAPI document (`openapi.json`) describes,
//! with the query parameters it takes, the statuses it may answer and who may call it.
//! Handlers parse their queries by it, [`refuse_unknown_query`] applies its one rule for
//! unknown query parameters to every operation, and the tests in `openapi.rs` fail when the
//! document and this table (or the router) disagree. The pages and their files are out of it.

use axum::extract::{MatchedPath, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use gpuledger_store::Filters;

/// Who may call an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub enum Auth {
    /// Nobody needs a token (probes).
    Open,
    /// A viewer token, only where the server sets `read_requires_token`; one minted with
    /// `--team` answers 403 for other teams.
    Read,
    /// Always an ingest token.
    Ingest,
}

/// One operation of the contract. `method` and `auth` are read by the document's tests; the
/// router and the viewer middleware apply them.
#[derive(Debug, Clone, Copy)]
pub struct Operation {
    #[cfg_attr(not(test), allow(dead_code))]
    pub method: &'static str,
    /// The router's path, `{name}` for a path parameter.
    pub path: &'static str,
    /// Takes the GPU filters (`team`, `env`, `cloud`, `cluster`, `model`).
    pub filters: bool,
    /// Its own query parameters besides the filters.
    pub params: &'static [&'static str],
    /// Every status it may answer.
    pub statuses: &'static [u16],
    #[cfg_attr(not(test), allow(dead_code))]
    pub auth: Auth,
}

impl Operation {
    /// Every query parameter it takes, filters first.
    pub fn query_names(&self) -> Vec<&'static str> {
        let mut names = if self.filters {
            Filters::KEYS.to_vec()
        } else {
            Vec::new()
        };
        names.extend_from_slice(self.params);
        names
    }

    /// The refusal of a query parameter it does not take, or `None` when it takes it.
    pub fn unknown(&self, name: &str) -> Option<String> {
        let names = self.query_names();
        (!names.contains(&name)).then(|| {
            format!(
                "unknown query parameter `{}`; this endpoint takes: {}",
                gpuledger_ledger::echo(name),
                if names.is_empty() {
                    "no query parameters".to_string()
                } else {
                    names.join(", ")
                }
            )
        })
    }
}

/// The statuses of a read: a bad parameter, no token where one is needed, a reader limited to
/// teams asking for another (or allowed none), a failed query.
const READ: &[u16] = &[200, 400, 401, 403, 500];

pub const INGEST: Operation = Operation {
    method: "post",
    path: "/api/v1/ingest",
    filters: false,
    params: &[],
    statuses: &[200, 400, 401, 403, 408, 413, 415, 422, 429, 500, 503],
    auth: Auth::Ingest,
};
pub const GPUS: Operation = Operation {
    method: "get",
    path: "/api/v1/gpus",
    filters: true,
    params: &["format", "include_mig", "limit", "offset"],
    statuses: READ,
    auth: Auth::Read,
};
/// Another team's GPU is, to a scoped token, no GPU at all: 404, not 403.
pub const GPU: Operation = Operation {
    method: "get",
    path: "/api/v1/gpus/{uuid}",
    filters: false,
    params: &["from", "to", "range", "format"],
    statuses: &[200, 400, 401, 403, 404, 500],
    auth: Auth::Read,
};
pub const SUMMARY: Operation = Operation {
    method: "get",
    path: "/api/v1/summary",
    filters: true,
    params: &["from", "to", "range", "group_by", "format"],
    statuses: READ,
    auth: Auth::Read,
};
pub const SOURCES: Operation = Operation {
    method: "get",
    path: "/api/v1/sources",
    filters: false,
    params: &["format"],
    statuses: READ,
    auth: Auth::Read,
};
pub const TEAMS: Operation = Operation {
    method: "get",
    path: "/api/v1/teams",
    filters: true,
    params: &[],
    statuses: READ,
    auth: Auth::Read,
};
pub const SAVINGS: Operation = Operation {
    method: "get",
    path: "/api/v1/savings",
    filters: true,
    params: &["from", "to", "range", "idle_days", "limit", "offset"],
    statuses: READ,
    auth: Auth::Read,
};
pub const USED_BY: Operation = Operation {
    method: "get",
    path: "/api/v1/used-by",
    filters: true,
    params: &["from", "to", "range"],
    statuses: READ,
    auth: Auth::Read,
};
pub const BILLING: Operation = Operation {
    method: "get",
    path: "/api/v1/billing",
    filters: false,
    params: &[],
    statuses: READ,
    auth: Auth::Read,
};
pub const FORECAST: Operation = Operation {
    method: "get",
    path: "/api/v1/forecast",
    filters: true,
    params: &["group_by"],
    statuses: READ,
    auth: Auth::Read,
};
pub const AUDIT: Operation = Operation {
    method: "get",
    path: "/api/v1/audit",
    filters: false,
    params: &["from", "to", "range", "source", "format"],
    statuses: READ,
    auth: Auth::Read,
};
pub const OPENAPI: Operation = Operation {
    method: "get",
    path: "/api/v1/openapi.json",
    filters: false,
    params: &[],
    statuses: &[200, 400, 401, 403],
    auth: Auth::Read,
};
pub const METRICS: Operation = Operation {
    method: "get",
    path: "/metrics",
    filters: false,
    params: &[],
    statuses: &[200, 400, 401, 403, 503],
    auth: Auth::Read,
};
pub const HEALTHZ: Operation = Operation {
    method: "get",
    path: "/healthz",
    filters: false,
    params: &[],
    statuses: &[200, 400],
    auth: Auth::Open,
};
pub const READYZ: Operation = Operation {
    method: "get",
    path: "/readyz",
    filters: false,
    params: &[],
    statuses: &[200, 400, 503],
    auth: Auth::Open,
};

/// Every operation of the contract.
pub const OPERATIONS: [Operation; 15] = [
    INGEST, GPUS, GPU, SUMMARY, SOURCES, TEAMS, SAVINGS, USED_BY, BILLING, FORECAST, AUDIT,
    OPENAPI, METRICS, HEALTHZ, READYZ,
];

/// The routes the router serves outside the contract: the dashboard's pages (their CSV
/// downloads included) and their files.
#[cfg(test)]
pub const PAGES: [&str; 9] = [
    "/",
    "/inventory",
    "/gpus/{uuid}",
    "/teams",
    "/teams/{team}",
    "/usage",
    "/waste",
    "/sources",
    "/static/{file}",
];

/// The operation the router matched, if it is one of the contract's.
pub fn operation(path: &str) -> Option<&'static Operation> {
    OPERATIONS.iter().find(|op| op.path == path)
}

/// One rule for every operation: a query parameter it does not take is refused with 400
/// naming it, before the handler runs, so that a typo never silently widens a query and
/// nothing is ignored without a word. Pages check theirs in their own extractor. An answer
/// with a status the contract does not list is logged: the document would not say it.
pub async fn refuse_unknown_query(path: Option<MatchedPath>, req: Request, next: Next) -> Response {
    let Some(op) = path.and_then(|p| operation(p.as_str())) else {
        return next.run(req).await;
    };
    for (name, _) in form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()) {
        if let Some(refusal) = op.unknown(&name) {
            return crate::error(StatusCode::BAD_REQUEST, refusal);
        }
    }
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    if !op.statuses.contains(&status) {
        tracing::warn!(
            path = op.path,
            status,
            "answered a status the API contract does not list"
        );
    }
    resp
}
