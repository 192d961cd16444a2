//! The query API: `/api/v1/gpus`, `/api/v1/gpus/{uuid}`, `/api/v1/summary`, `/api/v1/sources`,
//! each as JSON or, with `format=csv`, as CSV with the same figures.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpuledger_ledger::{echo, GroupBy};
use gpuledger_model::{GpuView, SummaryGroup};

use crate::contract;
use crate::csv::Csv;
use crate::params::{Params, ReadScope};
use crate::{error, AppState};

fn bad_request(msg: String) -> Response {
    error(StatusCode::BAD_REQUEST, msg)
}

fn forbidden(msg: String) -> Response {
    error(StatusCode::FORBIDDEN, msg)
}

fn internal(e: impl std::fmt::Display) -> Response {
    tracing::error!(error = %e, "query failed");
    error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(ToString::to_string).unwrap_or_default()
}

const GPU_CSV_HEADER: [&str; 22] = [
    "uuid",
    "model",
    "memory_mib",
    "host",
    "cluster",
    "cloud",
    "region",
    "instance_type",
    "account",
    "team",
    "env",
    "owner_reason",
    "state",
    "first_seen",
    "last_seen",
    "usd_per_hour",
    "rate_origin",
    "mig_parent_uuid",
    "mig_profile",
    "placeholder",
    "source",
    "vendor",
];

fn gpu_csv_row(g: &GpuView) -> Vec<String> {
    vec![
        g.uuid.to_string(),
        g.model.to_string(),
        opt(&g.memory_mib),
        opt(&g.host),
        opt(&g.cluster),
        opt(&g.cloud),
        opt(&g.region),
        opt(&g.instance_type),
        opt(&g.account),
        g.team.to_string(),
        g.env.to_string(),
        g.owner_reason.to_string(),
        g.state.as_str().to_string(),
        g.first_seen.to_rfc3339(),
        g.last_seen.to_rfc3339(),
        opt(&g.usd_per_hour),
        g.rate_origin.to_string(),
        opt(&g.mig_parent_uuid),
        opt(&g.mig_profile),
        g.placeholder.to_string(),
        g.source.to_string(),
        g.vendor.map(|v| v.as_str().to_string()).unwrap_or_default(),
    ]
}

pub async fn gpus(
    State(state): State<AppState>,
    scope: ReadScope,
    RawQuery(q): RawQuery,
) -> Response {
    let mut p = match Params::parse_api(q.as_deref(), &contract::GPUS) {
        Ok(p) => p,
        Err(e) => return bad_request(e),
    };
    if let Err(e) = scope.apply(&mut p) {
        return forbidden(e);
    }
    let paging = p.paging;
    let (count, list) = match state
        .store
        .list_gpus_page(&p.filters, p.include_mig, |n| paging.range(n), state.now())
        .await
    {
        Ok(l) => l,
        Err(e) => return internal(e),
    };
    if p.csv {
        let mut csv = Csv::new("gpus", GPU_CSV_HEADER);
        for g in &list {
            csv.row(gpu_csv_row(g));
        }
        return csv.into_response();
    }
    // Serialized straight from the views: through a `serde_json::Value` first, 10,000 GPUs
    // cost as much again in building the tree as in writing it.
    #[derive(serde::Serialize)]
    struct Listed<'a> {
        count: usize,
        offset: usize,
        next_offset: Option<usize>,
        items: &'a [gpuledger_model::GpuView],
    }
    Json(Listed {
        count,
        offset: paging.offset,
        next_offset: paging.next_offset(count),
        items: &list,
    })
    .into_response()
}

pub async fn gpu(
    State(state): State<AppState>,
    Path(uuid): Path<String>,
    scope: ReadScope,
    RawQuery(q): RawQuery,
) -> Response {
    let p = match Params::parse_api(q.as_deref(), &contract::GPU) {
        Ok(p) => p,
        Err(e) => return bad_request(e),
    };
    let now = state.now();
    let detail = match state.store.gpu_detail(&uuid, p.window(now), now).await {
        // Another team's GPU is, to a scoped token, no GPU at all.
        Ok(Some(d)) if scope.may_read(&d.gpu.team) => d,
        Ok(_) => {
            return error(
                StatusCode::NOT_FOUND,
                format!("no GPU with uuid `{}`", echo(&uuid)),
            )
        }
        Err(e) => return internal(e),
    };
    if p.csv {
        let mut csv = Csv::new(
            &uuid,
            [
                "hour",
                "samples",
                "activity_pct",
                "activity_origin",
                "mem_used_mib_max",
                "mem_origin",
                "power_w_avg",
                "allocated",
            ],
        );
        for h in &detail.hours {
            csv.row([
                h.hour.to_rfc3339(),
                h.samples.to_string(),
                opt(&h.activity_pct),
                h.activity_origin.clone().unwrap_or_default(),
                opt(&h.mem_used_mib_max),
                h.mem_origin.clone().unwrap_or_default(),
                opt(&h.power_w_avg),
                h.allocated.to_string(),
            ]);
        }
        return csv.into_response();
    }
    Json(detail).into_response()
}

pub(crate) const SUMMARY_CSV_HEADER: [&str; 18] = [
    "key",
    "gpus",
    "gpu_hours",
    "busy_hours",
    "idle_hours",
    "unknown_hours",
    "allocated_hours",
    "allocated_idle_hours",
    "avg_activity_pct",
    "cost_usd",
    "idle_cost_usd",
    "allocated_idle_cost_usd",
    "unpriced_gpu_hours",
    "cost_basis",
    "billed_gpu_hours",
    "billed_usd",
    "billed_estimate_usd",
    "is_total",
];

fn summary_csv_row(g: &SummaryGroup, total: bool) -> Vec<String> {
    vec![
        g.key.clone(),
        g.gpus.to_string(),
        g.gpu_hours.to_string(),
        g.busy_hours.to_string(),
        g.idle_hours.to_string(),
        g.unknown_hours.to_string(),
        g.allocated_hours.to_string(),
        g.allocated_idle_hours.to_string(),
        opt(&g.avg_activity_pct),
        format!("{:.2}", g.cost_usd),
        format!("{:.2}", g.idle_cost_usd),
        format!("{:.2}", g.allocated_idle_cost_usd),
        g.unpriced_gpu_hours.to_string(),
        g.cost_basis.as_str().to_string(),
        g.billed_gpu_hours.to_string(),
        format!("{:.2}", g.billed_usd),
        format!("{:.2}", g.billed_estimate_usd),
        total.to_string(),
    ]
}

pub async fn summary(
    State(state): State<AppState>,
    scope: ReadScope,
    RawQuery(q): RawQuery,
) -> Response {
    let mut p = match Params::parse_api(q.as_deref(), &contract::SUMMARY) {
        Ok(p) => p,
        Err(e) => return bad_request(e),
    };
    if let Err(e) = scope.apply(&mut p) {
        return forbidden(e);
    }
    let now = state.now();
    let by = p.group_by.unwrap_or(GroupBy::Team);
    let s = match state
        .store
        .summary(p.window(now), &p.filters, by, now)
        .await
    {
        Ok(s) => s,
        Err(e) => return internal(e),
    };
    if p.csv {
        let mut csv = Csv::new("summary", SUMMARY_CSV_HEADER);
        for g in &s.groups {
            csv.row(summary_csv_row(g, false));
        }
        csv.row(summary_csv_row(&s.total, true));
        return csv.into_response();
    }
    Json(s).into_response()
}

pub async fn sources(
    State(state): State<AppState>,
    scope: ReadScope,
    RawQuery(q): RawQuery,
) -> Response {
    // Sources' errors name GPUs and teams of every team.
    if scope.is_limited() {
        return forbidden(scope.refusal("sources"));
    }
    let p = match Params::parse_api(q.as_deref(), &contract::SOURCES) {
        Ok(p) => p,
        Err(e) => return bad_request(e),
    };
    let list = match state.store.sources(state.now()).await {
        Ok(l) => l,
        Err(e) => return internal(e),
    };
    if p.csv {
        let mut csv = Csv::new(
            "sources",
            [
                "name",
                "kind",
                "last_success",
                "lag_secs",
                "status",
                "last_error",
                "gpus",
            ],
        );
        for s in &list {
            csv.row([
                s.name.clone(),
                s.kind.clone(),
                s.last_success.map(|t| t.to_rfc3339()).unwrap_or_default(),
                opt(&s.lag_secs),
                serde_json::to_value(s.status)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                opt(&s.last_error),
                s.gpus.to_string(),
            ]);
        }
        return csv.into_response();
    }
    Json(serde_json::json!({ "items": list })).into_response()
}

/// Rows the audit log answers with at most; `truncated` says when there were more.
const AUDIT_ROWS: i64 = 10_000;

/// `GET /api/v1/audit`: the audit log for the window (30 days by default), newest first:
/// pushes per minute, source, actor and outcome with their record counts, pushes refused
/// before they reached the database, and token administration. Readers limited to teams get
/// 403: the log names every team's sources.
pub async fn audit(
    State(state): State<AppState>,
    scope: ReadScope,
    RawQuery(q): RawQuery,
) -> Response {
    if scope.is_limited() {
        return forbidden(scope.refusal("the audit log"));
    }
    let p = match Params::parse_api(q.as_deref(), &contract::AUDIT) {
        Ok(p) => p,
        Err(e) => return bad_request(e),
    };
    // Refusals noted in memory first, so the answer has every one up to now.
    if let Err(e) = state.limiter.flush(&state.store).await {
        return internal(e);
    }
    let w = p.window(state.now());
    let at = |t| chrono::DateTime::from_timestamp(t, 0).unwrap_or_default();
    let (from, to) = (at(w.from), at(w.to));
    let mut rows = match state
        .store
        .audit_log(from, to, p.source.as_deref(), AUDIT_ROWS + 1)
        .await
    {
        Ok(r) => r,
        Err(e) => return internal(e),
    };
    let truncated = rows.len() as i64 > AUDIT_ROWS;
    rows.truncate(AUDIT_ROWS as usize);
    if p.csv {
        let mut csv = Csv::new(
            "audit",
            [
                "minute",
                "source",
                "actor",
                "action",
                "outcome",
                "requests",
                "records",
                "rejected",
                "duplicates",
                "new_gpus",
            ],
        );
        for r in &rows {
            csv.row([
                r.minute.to_rfc3339(),
                r.source.clone(),
                r.actor.clone(),
                r.action.clone(),
                r.outcome.clone(),
                r.requests.to_string(),
                r.records.to_string(),
                r.rejected.to_string(),
                r.duplicates.to_string(),
                r.new_gpus.to_string(),
            ]);
        }
        return csv.into_response();
    }
    Json(serde_json::json!({
        "from": from,
        "to": to,
        "truncated": truncated,
        "items": rows,
    }))
    .into_response()
}

/// `GET /api/v1/billing`: the imported billing exports, newest first, each with its
/// reconciliation as at import (per GPU, team and month: estimated, billed, difference; the
/// GPU spend no known host matched; the lines that could not be read).
pub async fn billing(
    State(state): State<AppState>,
    scope: ReadScope,
    RawQuery(q): RawQuery,
) -> Response {
    if scope.is_limited() {
        return forbidden(scope.refusal("billing exports"));
    }
    if let Err(e) = Params::parse_api(q.as_deref(), &contract::BILLING) {
        return bad_request(e);
    }
    match state.store.billing_files().await {
        Ok(files) => Json(serde_json::json!({ "items": files })).into_response(),
        Err(e) => internal(e),
    }
}

/// `GET /api/v1/teams`: the team registry, and the teams that own GPUs without being in it.
pub async fn teams(
    State(state): State<AppState>,
    scope: ReadScope,
    RawQuery(q): RawQuery,
) -> Response {
    let mut p = match Params::parse_api(q.as_deref(), &contract::TEAMS) {
        Ok(p) => p,
        Err(e) => return bad_request(e),
    };
    if let Err(e) = scope.apply(&mut p) {
        return forbidden(e);
    }
    let gpus = match state.store.list_gpus_brief(&p.filters, state.now()).await {
        Ok(g) => g,
        Err(e) => return internal(e),
    };
    let mut owning: std::collections::BTreeMap<String, u64> = Default::default();
    for g in &gpus {
        *owning.entry(g.team.to_string()).or_default() += 1;
    }
    let registry = &state.config.teams;
    let mut names: std::collections::BTreeSet<&String> =
        registry.keys().filter(|t| scope.may_read(t)).collect();
    names.extend(owning.keys());
    let items: Vec<serde_json::Value> = names
        .into_iter()
        .map(|name| {
            let info = registry.get(name).cloned().unwrap_or_default();
            serde_json::json!({
                "name": name,
                "registered": registry.contains_key(name),
                "display_name": info.display_name,
                "manager": info.manager,
                "cost_center": info.cost_center,
                "gpus": owning.get(name).copied().unwrap_or(0),
            })
        })
        .collect();
    Json(serde_json::json!({"count": items.len(), "items": items})).into_response()
}

/// `GET /api/v1/used-by`: who used the GPUs matching the filters (filters select owners), and
/// what that use cost: each present GPU-hour split evenly among the workloads that held the GPU
/// or its MIG instances, by the team each allocation names (`ledger::usedby::split`); hours
/// nobody held are `unallocated`. The rows' costs add up to the GPUs' cost in the window.
pub async fn used_by(
    State(state): State<AppState>,
    scope: ReadScope,
    RawQuery(q): RawQuery,
) -> Response {
    let mut p = match Params::parse_api(q.as_deref(), &contract::USED_BY) {
        Ok(p) => p,
        Err(e) => return bad_request(e),
    };
    if let Err(e) = scope.apply(&mut p) {
        return forbidden(e);
    }
    let now = state.now();
    let window = p.window(now);
    let rows = match state.store.used_by_cost(window, &p.filters, now).await {
        Ok(r) => r,
        Err(e) => return internal(e),
    };
    let total: f64 = rows.iter().map(|r| r.cost_usd).sum();
    let round = |v: f64, k: f64| (v * k).round() / k;
    let items: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "team": r.team,
                "gpus": r.gpus,
                "gpu_hours": round(r.gpu_hours, 1000.0),
                "cost_usd": round(r.cost_usd, 100.0),
                "unpriced_gpu_hours": round(r.unpriced_gpu_hours, 1000.0),
            })
        })
        .collect();
    Json(serde_json::json!({
        "from": chrono::DateTime::from_timestamp(window.from, 0),
        "to": chrono::DateTime::from_timestamp(window.to.min(now.timestamp()), 0),
        "cost_usd": round(total, 100.0),
        "items": items,
    }))
    .into_response()
}
