//! `GET /metrics`: the server's own metrics in the OpenMetrics text format, for the Prometheus
//! that watches it (deploy/server/grafana-dashboard.json reads them). Requests and their
//! latency by route, pushes by outcome, records by source, kind and outcome, and, read from the
//! store at each scrape, every source's lag and state and the database pool.

use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use gpuledger_store::IngestOutcome;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::AppState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PushLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RecordLabels {
    source: String,
    kind: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CollectorLabels {
    source: String,
    kind: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    source: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TeamLabels {
    team: String,
}

/// A gauge of dollars.
type Usd = Gauge<f64, std::sync::atomic::AtomicU64>;

type Latency = Family<RouteLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms to about 16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The metrics one server keeps.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Latency,
    pushes: Family<PushLabels, Counter>,
    records: Family<RecordLabels, Counter>,
    refused: Family<RefusedLabels, Counter>,
    collector_runs: Family<CollectorLabels, Counter>,
    source_lag: Family<SourceLabels, Gauge>,
    source_ok: Family<SourceLabels, Gauge>,
    source_gpus: Family<SourceLabels, Gauge>,
    pool: Family<PoolLabels, Gauge>,
    group_rollup_backlog: Gauge,
    team_gpus: Family<TeamLabels, Gauge>,
    team_idle_cost: Family<TeamLabels, Usd>,
    team_alloc_idle_cost: Family<TeamLabels, Usd>,
    /// One scrape at a time sets the gauges and encodes.
    scrape: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("gpuledger");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by route, method and status",
            requests.clone(),
        );
        let latency: Latency = Family::new_with_constructor(latency_histogram);
        registry.register(
            "http_request_duration_seconds",
            "Time to answer a request, by route",
            latency.clone(),
        );
        let pushes = Family::<PushLabels, Counter>::default();
        registry.register(
            "ingest_requests",
            "Pushes to /api/v1/ingest that reached the database, by outcome: stored (every \
             record kept), partial (some rejected), rejected (none kept), failed (the database \
             could not store it); pushes refused before (401, 413, ...) are in http_requests",
            pushes.clone(),
        );
        let records = Family::<RecordLabels, Counter>::default();
        registry.register(
            "ingest_records",
            "Pushed records by source, kind (gpus, samples, allocations) and outcome (accepted, \
             duplicate, rejected); duplicates are also counted as accepted",
            records.clone(),
        );
        let refused = Family::<RefusedLabels, Counter>::default();
        registry.register(
            "ingest_refused",
            "Pushes refused before they reached the database, by source (empty for a missing or \
             unknown token) and status: 401, 403, 408, 413, 429 (over the source's rate), ...",
            refused.clone(),
        );
        let collector_runs = Family::<CollectorLabels, Counter>::default();
        registry.register(
            "collector_runs",
            "Pull collector runs in this replica, by source, kind and outcome: ok, partial (some \
             parts failed, the rest stored), failed (retried with backoff), stopped (its \
             configuration is wrong; it waits for a reload)",
            collector_runs.clone(),
        );
        let source_lag = Family::<SourceLabels, Gauge>::default();
        registry.register(
            "source_lag_seconds",
            "Seconds since the source's last successful push or collection",
            source_lag.clone(),
        );
        let source_ok = Family::<SourceLabels, Gauge>::default();
        registry.register(
            "source_up",
            "1 when the source's last attempt succeeded within the freshness objective, else 0",
            source_ok.clone(),
        );
        let source_gpus = Family::<SourceLabels, Gauge>::default();
        registry.register(
            "source_gpus",
            "GPUs the source reports",
            source_gpus.clone(),
        );
        let pool = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "db_pool_connections",
            "Database connections by state (idle, busy)",
            pool.clone(),
        );
        let group_rollup_backlog = Gauge::default();
        registry.register(
            "group_rollup_backlog",
            "Past days whose group rollups await their rebuild (the trends, heatmap and \
             forecasts read those days from the per-GPU rows until then: the same figures, \
             slower at scale)",
            group_rollup_backlog.clone(),
        );
        let team_gpus = Family::<TeamLabels, Gauge>::default();
        registry.register(
            "team_gpus",
            "GPUs each owner team had over the last 7 days (the summary's figure; team \
             \"unowned\": GPUs no rule, assignment or label places)",
            team_gpus.clone(),
        );
        let team_idle_cost = Family::<TeamLabels, Usd>::default();
        registry.register(
            "team_idle_cost_usd",
            "Each owner team's idle cost over the last 7 days (idle hours × rate, as the \
             summary gives it; hours without a rate are not in it)",
            team_idle_cost.clone(),
        );
        let team_alloc_idle_cost = Family::<TeamLabels, Usd>::default();
        registry.register(
            "team_allocated_idle_cost_usd",
            "Each owner team's allocated-but-idle cost over the last 7 days",
            team_alloc_idle_cost.clone(),
        );
        Metrics {
            team_gpus,
            team_idle_cost,
            team_alloc_idle_cost,
            registry,
            requests,
            latency,
            pushes,
            records,
            refused,
            collector_runs,
            source_lag,
            source_ok,
            source_gpus,
            pool,
            group_rollup_backlog,
            scrape: Mutex::new(()),
        }
    }
}

/// The list a rejection's path names (`samples[3].ts` → `samples`).
fn kind_of(path: &str) -> &'static str {
    ["gpus", "samples", "allocations"]
        .into_iter()
        .find(|k| path.starts_with(k))
        .unwrap_or("body")
}

impl Metrics {
    /// Count a stored push of `source`.
    pub fn ingested(&self, source: &str, out: &IngestOutcome) {
        let (a, d) = (out.accepted, out.duplicates);
        let kept = a.gpus + a.samples + a.allocations;
        let outcome = match (kept, out.rejected.is_empty()) {
            (_, true) => "stored",
            (0, false) => "rejected",
            _ => "partial",
        };
        self.pushes
            .get_or_create(&PushLabels {
                outcome: outcome.into(),
            })
            .inc();
        let add = |kind: &str, outcome: &str, n: u64| {
            if n > 0 {
                self.records
                    .get_or_create(&RecordLabels {
                        source: source.into(),
                        kind: kind.into(),
                        outcome: outcome.into(),
                    })
                    .inc_by(n);
            }
        };
        for (kind, acc, dup) in [
            ("gpus", a.gpus, d.gpus),
            ("samples", a.samples, d.samples),
            ("allocations", a.allocations, d.allocations),
        ] {
            add(kind, "accepted", acc);
            add(kind, "duplicate", dup);
        }
        for r in &out.rejected {
            add(kind_of(&r.path), "rejected", 1);
        }
    }

    /// Count a pull collector's run.
    pub fn collector_run(&self, source: &str, kind: &str, outcome: &str) {
        self.collector_runs
            .get_or_create(&CollectorLabels {
                source: source.into(),
                kind: kind.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Count a push refused before it reached the database.
    pub fn refused(&self, source: &str, status: u16) {
        self.refused
            .get_or_create(&RefusedLabels {
                source: source.into(),
                status: status.to_string(),
            })
            .inc();
    }

    /// Count a push the database could not store.
    pub fn push_failed(&self) {
        self.pushes
            .get_or_create(&PushLabels {
                outcome: "failed".into(),
            })
            .inc();
    }
}

/// Middleware: count and time every request by its route (the matched pattern, never the
/// raw path, so a GPU's UUID does not become a label).
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().as_str().to_string();
    let started = Instant::now();
    let resp = next.run(req).await;
    let m = &state.metrics;
    m.latency
        .get_or_create(&RouteLabels {
            route: route.clone(),
        })
        .observe(started.elapsed().as_secs_f64());
    m.requests
        .get_or_create(&RequestLabels {
            route,
            method,
            status: resp.status().as_u16().to_string(),
        })
        .inc();
    resp
}

/// `GET /metrics`.
pub async fn serve(State(state): State<AppState>) -> Response {
    let now = state.now();
    let sources = match state.store.sources(now).await {
        Ok(s) => s,
        Err(e) => return crate::error(axum::http::StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    // The teams' figures of the last 7 days, as the summary defines them.
    let week = gpuledger_store::Window {
        from: now.timestamp() - 7 * 86_400,
        to: now.timestamp(),
    };
    let teams = match state
        .store
        .summary(
            week,
            &gpuledger_store::Filters::default(),
            gpuledger_ledger::GroupBy::Team,
            now,
        )
        .await
    {
        Ok(s) => s.groups,
        Err(e) => return crate::error(axum::http::StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let pending = match state.store.dirty_group_days_before(now.timestamp()).await {
        Ok(days) => days.len() as i64,
        Err(e) => return crate::error(axum::http::StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let (size, idle) = state.store.pool_stats();
    let m = &state.metrics;
    let mut text = String::new();
    {
        let _one = m.scrape.lock().unwrap_or_else(|e| e.into_inner());
        for s in &sources {
            let labels = SourceLabels {
                source: s.name.clone(),
                kind: s.kind.clone(),
            };
            if let Some(lag) = s.lag_secs {
                m.source_lag.get_or_create(&labels).set(lag);
            }
            let up = matches!(s.status, gpuledger_model::SourceStatus::Ok);
            m.source_ok.get_or_create(&labels).set(i64::from(up));
            m.source_gpus.get_or_create(&labels).set(s.gpus);
        }
        // Teams gone from the week's summary drop out, rather than keep their last value.
        m.team_gpus.clear();
        m.team_idle_cost.clear();
        m.team_alloc_idle_cost.clear();
        for g in &teams {
            let labels = TeamLabels {
                team: g.key.clone(),
            };
            m.team_gpus.get_or_create(&labels).set(g.gpus);
            m.team_idle_cost.get_or_create(&labels).set(g.idle_cost_usd);
            m.team_alloc_idle_cost
                .get_or_create(&labels)
                .set(g.allocated_idle_cost_usd);
        }
        m.group_rollup_backlog.set(pending);
        let busy = i64::from(size).saturating_sub(idle as i64).max(0);
        m.pool
            .get_or_create(&PoolLabels {
                state: "idle".into(),
            })
            .set(idle as i64);
        m.pool
            .get_or_create(&PoolLabels {
                state: "busy".into(),
            })
            .set(busy);
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &m.registry) {
            return crate::error(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
        }
    }
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_rejection_is_counted_under_its_list() {
        assert_eq!(super::kind_of("samples[3].ts"), "samples");
        assert_eq!(super::kind_of("gpus[0].labels.team"), "gpus");
        assert_eq!(super::kind_of("allocations[1]"), "allocations");
        assert_eq!(super::kind_of("body"), "body");
    }
}
