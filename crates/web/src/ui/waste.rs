//! The Waste page: idle GPUs, allocated-but-idle workloads, GPUs whose memory use stays far
//! below capacity, missing GPUs, and GPU spend billed for instances no source reports, each
//! with its $ per month and a link to the evidence.

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};

use super::{col, count, frame, internal, ncol, parse, respond, usd0, Cell, Frame, Table};
use crate::params::Params;
use crate::AppState;

/// Hours in an average month, to turn hourly rates into $ per month.
pub const HOURS_PER_MONTH: f64 = 730.0;

/// One inefficiency worth money.
#[derive(Debug, Clone)]
pub struct Finding {
    pub kind: &'static str,
    pub what: String,
    pub href: String,
    pub team: String,
    pub detail: String,
    pub usd_per_month: f64,
}

pub struct Findings {
    pub idle: Table,
    pub alloc_idle: Table,
    pub low_mem: Table,
    pub missing: Table,
    pub billed_unseen: Table,
    pub all: Vec<Finding>,
}

fn days_between(a: DateTime<Utc>, b: DateTime<Utc>) -> i64 {
    (b - a).num_days()
}

/// Everything the Waste page lists, for the window and filters of `p`.
/// `gpus` and `windows` are the page's GPU list and per-GPU counts for the same filters.
pub async fn findings(
    state: &AppState,
    p: &Params,
    f: &Frame,
    idle_days: i64,
    gpus: &[gpuledger_model::GpuView],
    windows: &[gpuledger_ledger::GpuWindow],
) -> Result<Findings, Response> {
    let store = &state.store;
    let now = state.now();
    let window = p.window(now, 30);
    let range_hours = ((window.to.min(now.timestamp()) - window.from) as f64 / 3600.0).max(1.0);
    let per_month = HOURS_PER_MONTH / range_hours;
    let by_uuid: std::collections::HashMap<&str, &gpuledger_model::GpuView> =
        gpus.iter().map(|g| (g.uuid.as_str(), g)).collect();
    let (last_busy, workloads) = tokio::try_join!(
        store.last_busy_days(&p.filters),
        store.idle_workloads(window, &p.filters, now),
    )
    .map_err(internal)?;
    let mut all = Vec::new();

    let mut idle = Table::new("idle-gpus", f, vec![
        col("GPU", "The GPU's UUID; follow it for its timeline."),
        col("Host", "Where it runs."),
        col("Team", "Owner team (cost is charged to the owner)."),
        col("Model", "GPU model."),
        ncol("Idle for", "Days since the last day with a busy hour (activity at or above the idle threshold); 'no busy hour' when none is on record."),
        ncol("$/month", "Hourly rate × 730 h: what keeping it costs per month."),
    ]);
    let mut rows: Vec<(i64, &gpuledger_model::GpuView)> = Vec::new();
    for (uuid, day) in &last_busy {
        let Some(g) = by_uuid.get(uuid.as_str()) else {
            continue;
        };
        if g.state != gpuledger_model::GpuState::Present {
            continue;
        }
        let since = day
            .map(|d| days_between(d, now))
            .unwrap_or_else(|| days_between(g.first_seen, now));
        if since >= idle_days {
            rows.push((since, g));
        }
    }
    rows.sort_by(|a, b| {
        let ca = a.1.usd_per_hour.unwrap_or(0.0);
        let cb = b.1.usd_per_hour.unwrap_or(0.0);
        cb.total_cmp(&ca)
            .then(b.0.cmp(&a.0))
            .then(a.1.uuid.cmp(&b.1.uuid))
    });
    for (since, g) in rows {
        let month = g.usd_per_hour.map(|r| r * HOURS_PER_MONTH);
        let busy_known = last_busy.iter().any(|(u, d)| u == &g.uuid && d.is_some());
        let href = f.link(&format!("/gpus/{}", g.uuid));
        idle.push(vec![
            Cell::text(g.uuid.clone()).link(href.clone()),
            Cell::text(g.host.clone().unwrap_or_default()),
            Cell::text(g.team.clone()).link(f.link(&format!("/teams/{}", super::enc(&g.team)))),
            Cell::text(g.model.clone()),
            Cell::num(
                if busy_known {
                    format!("{since} d")
                } else {
                    format!("{since} d, no busy hour")
                },
                since as f64,
            ),
            Cell::num(
                month.map(usd0).unwrap_or_else(|| "unknown".into()),
                month.unwrap_or(0.0),
            ),
        ]);
        if let Some(m) = month {
            all.push(Finding {
                kind: "idle GPU",
                what: format!("{} on {}", g.model, g.host.clone().unwrap_or_default()),
                href,
                team: g.team.clone(),
                detail: format!("no busy hour for {since} days: release or reassign it"),
                usd_per_month: m,
            });
        }
    }

    let mut alloc_idle = Table::new(
        "allocated-idle",
        f,
        vec![
            col(
                "Workload",
                "The allocation (pod, job, process) holding the GPUs.",
            ),
            col("Kind", "pod, slurm_job, process, reservation or other."),
            col("Used by", "The team the allocation names."),
            col("Owner", "The team owning the GPUs."),
            ncol("GPUs", "GPUs it held while idle."),
            ncol(
                "Allocated-idle h",
                "Hours allocated to it and idle (activity below the threshold) in the range.",
            ),
            ncol(
                "$/month",
                "Allocated-idle hours × rate, scaled from the range to 730 h.",
            ),
        ],
    );
    for w in workloads.iter().take(100) {
        let month = w.cost_usd * per_month;
        let team = w.used_by.clone().unwrap_or_else(|| w.owner.clone());
        alloc_idle.push(vec![
            Cell::text(w.workload.clone()),
            Cell::text(w.kind.clone()),
            Cell::text(w.used_by.clone().unwrap_or_else(|| "unknown".into())),
            Cell::text(w.owner.clone()).link(f.link(&format!("/teams/{}", super::enc(&w.owner)))),
            Cell::num(count(w.gpus), w.gpus as f64),
            Cell::num(count(w.allocated_idle_hours), w.allocated_idle_hours as f64),
            Cell::num(usd0(month), month),
        ]);
        all.push(Finding {
            kind: "allocated but idle",
            what: w.workload.clone(),
            href: f.link(&format!("/teams/{}", super::enc(&w.owner))),
            team,
            detail: format!(
                "{} GPU-hours allocated and idle: tell the owner",
                count(w.allocated_idle_hours)
            ),
            usd_per_month: month,
        });
    }

    let mut low_mem = Table::new(
        "low-memory",
        f,
        vec![
            col("GPU", "The GPU's UUID."),
            col("Team", "Owner team."),
            col("Model", "GPU model and its memory."),
            ncol(
                "Peak memory used",
                "Highest memory use in the range, as a share of the GPU's memory.",
            ),
            ncol("Avg activity", "Mean hourly activity over known hours."),
            ncol(
                "$/month",
                "Hourly rate × 730 h; a smaller GPU or a MIG slice would cost a fraction.",
            ),
        ],
    );
    let mut lows: Vec<_> = windows
        .iter()
        .filter_map(|w| {
            let cap = w.memory_mib? as f64;
            let peak = w.mem_max_mib?;
            (w.present_hours >= 24 && cap > 0.0 && peak / cap < 0.25).then_some((w, peak / cap))
        })
        .collect();
    lows.sort_by(|a, b| {
        b.0.usd_per_hour
            .unwrap_or(0.0)
            .total_cmp(&a.0.usd_per_hour.unwrap_or(0.0))
            .then(a.0.uuid.cmp(&b.0.uuid))
    });
    for (w, frac) in lows {
        let month = w.usd_per_hour.map(|r| r * HOURS_PER_MONTH);
        let href = f.link(&format!("/gpus/{}", w.uuid));
        let act = (w.known_hours > 0).then(|| w.activity_sum / w.known_hours as f64);
        low_mem.push(vec![
            Cell::text(w.uuid.clone()).link(href.clone()),
            Cell::text(w.team.clone()),
            Cell::text(format!("{} ({} MiB)", w.model, w.memory_mib.unwrap_or(0))),
            Cell::num(format!("{:.0} %", frac * 100.0), frac * 100.0),
            Cell::num(super::pct(act), act.unwrap_or(-1.0)),
            Cell::num(
                month.map(usd0).unwrap_or_else(|| "unknown".into()),
                month.unwrap_or(0.0),
            ),
        ]);
        if let Some(m) = month {
            all.push(Finding {
                kind: "memory far below capacity",
                what: format!("{} on {}", w.model, w.host.clone().unwrap_or_default()),
                href,
                team: w.team.clone(),
                detail: format!(
                    "peak memory {:.0} % of capacity: a smaller GPU or a MIG profile would do",
                    frac * 100.0
                ),
                // A MIG half or a smaller GPU saves about half.
                usd_per_month: m * 0.5,
            });
        }
    }

    let mut missing = Table::new(
        "missing",
        f,
        vec![
            col("GPU", "The GPU's UUID."),
            col("Host", "Where it was last seen."),
            col("Team", "Owner team."),
            col("Source", "The source that reported it."),
            col(
                "Last seen",
                "Its last observation; missing after the stale window (2 h).",
            ),
            ncol(
                "$/month",
                "Hourly rate × 730 h, if it is still being paid for.",
            ),
        ],
    );
    for g in gpus
        .iter()
        .filter(|g| g.state == gpuledger_model::GpuState::Missing)
    {
        let month = g.usd_per_hour.map(|r| r * HOURS_PER_MONTH);
        let href = f.link(&format!("/gpus/{}", g.uuid));
        missing.push(vec![
            Cell::text(g.uuid.clone()).link(href.clone()),
            Cell::text(g.host.clone().unwrap_or_default()),
            Cell::text(g.team.clone()),
            Cell::text(g.source.clone()),
            Cell::text(g.last_seen.format("%Y-%m-%d %H:%M UTC").to_string()),
            Cell::num(
                month.map(usd0).unwrap_or_else(|| "unknown".into()),
                month.unwrap_or(0.0),
            ),
        ]);
        if let Some(m) = month {
            all.push(Finding {
                kind: "missing GPU",
                what: format!("{} on {}", g.model, g.host.clone().unwrap_or_default()),
                href,
                team: g.team.clone(),
                detail: format!(
                    "not seen since {}: still paid for? check source {}",
                    g.last_seen.format("%Y-%m-%d %H:%M"),
                    g.source
                ),
                usd_per_month: m,
            });
        }
    }
    let mut billed_unseen = Table::new(
        "billed-unseen",
        f,
        vec![
            col(
                "Resource",
                "The billing export's ResourceId: an instance no source reports.",
            ),
            col("Instance type", "As the export names it."),
            col("Billed", "First and last charge period in the range (UTC)."),
            ncol(
                "Billed in range",
                "EffectiveCost of its GPU lines in the range.",
            ),
            ncol(
                "$/month",
                "What it was billed per day in the range × 30.4 days.",
            ),
            col("Export", "The imported file (GET /api/v1/billing)."),
        ],
    );
    // Billing exports carry no team or GPU attributes: shown only without filters.
    if p.filters.is_empty() {
        let unseen = store
            .billed_unseen(window.from, window.to.min(now.timestamp()))
            .await
            .map_err(internal)?;
        for u in unseen {
            let days = ((u.last - u.first).num_seconds() as f64 / 86_400.0).max(1.0);
            let month = u.effective_cost / days * (HOURS_PER_MONTH / 24.0);
            billed_unseen.push(vec![
                Cell::text(u.resource_id.clone()),
                Cell::text(u.instance_type.clone().unwrap_or_else(|| "unknown".into())),
                Cell::text(format!(
                    "{} – {}",
                    u.first.format("%Y-%m-%d"),
                    u.last.format("%Y-%m-%d")
                )),
                Cell::num(super::usd(u.effective_cost), u.effective_cost),
                Cell::num(usd0(month), month),
                Cell::text(u.file.clone()),
            ]);
            all.push(Finding {
                kind: "billed, not seen",
                what: format!(
                    "{} ({})",
                    u.resource_id,
                    u.instance_type.as_deref().unwrap_or("GPU spend")
                ),
                href: "/api/v1/billing".into(),
                team: gpuledger_model::UNOWNED.to_string(),
                detail: format!(
                    "billed {} from {} to {} in {}, but no source reports it: find it or stop \
                     paying for it",
                    super::usd(u.effective_cost),
                    u.first.format("%Y-%m-%d"),
                    u.last.format("%Y-%m-%d"),
                    u.file
                ),
                usd_per_month: month,
            });
        }
    }
    all.sort_by(|a, b| b.usd_per_month.total_cmp(&a.usd_per_month));
    Ok(Findings {
        idle,
        alloc_idle,
        low_mem,
        missing,
        billed_unseen,
        all,
    })
}

#[derive(Template)]
#[template(path = "waste.html")]
pub struct WastePage {
    pub frame: Frame,
    pub idle_days: i64,
    pub idle_links: Vec<(String, String)>,
    pub total: String,
    pub idle: Table,
    pub alloc_idle: Table,
    pub low_mem: Table,
    pub missing: Table,
    pub billed_unseen: Table,
}

/// `GET /api/v1/savings`: the Waste page's findings as JSON, largest $ per month first, each
/// with its kind, team, evidence link and the figures behind it.
pub async fn savings_api(State(state): State<AppState>, RawQuery(q): RawQuery) -> Response {
    let (found, idle_days) = match load(&state, q.as_deref()).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut all = found.2.all;
    all.sort_by(|a, b| b.usd_per_month.total_cmp(&a.usd_per_month));
    let total: f64 = all.iter().map(|x| x.usd_per_month).sum();
    let items: Vec<serde_json::Value> = all
        .iter()
        .map(|x| {
            serde_json::json!({
                "kind": x.kind, "what": x.what, "team": x.team, "detail": x.detail,
                "evidence": x.href, "usd_per_month": (x.usd_per_month * 100.0).round() / 100.0,
            })
        })
        .collect();
    axum::Json(serde_json::json!({
        "idle_days": idle_days,
        "usd_per_month": (total * 100.0).round() / 100.0,
        "count": items.len(),
        "items": items,
    }))
    .into_response()
}

/// Params, frame and findings for the page and the API.
async fn load(
    state: &AppState,
    q: Option<&str>,
) -> Result<((Params, Frame, Findings), i64), Response> {
    let p = parse(q, &["idle_days"])?;
    let idle_days = match p.extra.get("idle_days").map(|v| v.parse::<i64>()) {
        None => 7,
        Some(Ok(d)) if (1..=365).contains(&d) => d,
        Some(_) => {
            return Err(crate::error(
                axum::http::StatusCode::BAD_REQUEST,
                "idle_days: must be a whole number of days within 1..=365",
            ))
        }
    };
    let sources = state.store.sources(state.now()).await.map_err(internal)?;
    let f = frame(state, &p, "/waste", "Waste", &sources).await?;
    let now = state.now();
    let (gpus, windows) = tokio::try_join!(
        state.store.list_gpus(&p.filters, false, now),
        state.store.gpu_totals(p.window(now, 30), &p.filters, now),
    )
    .map_err(internal)?;
    let found = findings(state, &p, &f, idle_days, &gpus, &windows).await?;
    Ok(((p, f, found), idle_days))
}

pub async fn waste(State(state): State<AppState>, RawQuery(q): RawQuery) -> Response {
    let ((p, f, found), idle_days) = match load(&state, q.as_deref()).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let total: f64 = found.all.iter().map(|x| x.usd_per_month).sum();
    let page = WastePage {
        idle_links: [3, 7, 14, 30]
            .iter()
            .map(|d| {
                (
                    format!("{d} days"),
                    f.with(&[("idle_days", &d.to_string())]),
                )
            })
            .collect(),
        total: usd0(total),
        idle_days,
        idle: found.idle,
        alloc_idle: found.alloc_idle,
        low_mem: found.low_mem,
        missing: found.missing,
        billed_unseen: found.billed_unseen,
        frame: f,
    };
    let tables = [
        &page.idle,
        &page.alloc_idle,
        &page.low_mem,
        &page.missing,
        &page.billed_unseen,
    ];
    respond(&page, &tables, &p)
}
