//! The Overview page: fleet totals and their trend, spend by team and environment, the top
//! inefficiencies with $ per month, and a freshness strip of every source.

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::response::Response;
use gpuledger_ledger::{summarize, GroupBy};
use gpuledger_model::{GpuState, SummaryGroup};

use super::charts::{stacked, Series};
use super::{
    col, count, frame, internal, ncol, parse, pct, respond, share, status_text, usd, usd0, Cell,
    Frame, Table,
};
use crate::AppState;

#[derive(Template)]
#[template(path = "overview.html")]
pub struct Overview {
    pub frame: Frame,
    pub gpus_present: String,
    pub gpus_missing: String,
    pub gpus_in_range: String,
    pub gpu_hours: String,
    pub avg_activity: String,
    pub cost: String,
    pub unpriced: String,
    /// `estimate only`, or what was billed for the reconciled GPU-hours.
    pub cost_basis: String,
    pub idle_cost: String,
    pub idle_hours: String,
    pub alloc_idle_cost: String,
    pub alloc_idle_hours: String,
    pub busy_hours: String,
    pub unknown_hours: String,
    pub busy_pct: String,
    pub idle_pct: String,
    pub unknown_pct: String,
    pub busy_w: String,
    pub idle_w: String,
    pub busy_idle_w: String,
    pub unknown_w: String,
    pub bucket: &'static str,
    pub trend_svg: String,
    pub by_team: Table,
    pub by_env: Table,
    pub top_waste: Table,
    pub freshness: Vec<(String, &'static str, String)>,
    pub waste_href: String,
    pub sources_href: String,
}

/// A spend table (team or environment) with links to drill down.
pub fn spend_table(
    id: &str,
    f: &Frame,
    first: &str,
    groups: &[SummaryGroup],
    link: impl Fn(&str) -> Option<String>,
) -> Table {
    let mut t = Table::new(
        id,
        f,
        vec![
            col(
                first,
                "The group; `unowned` / `unknown` are GPUs no rule places.",
            ),
            ncol("GPUs", "Physical GPUs present at some hour of the range."),
            ncol("GPU-hours", "Hours each GPU was present in the range."),
            ncol(
                "Avg activity",
                "Mean hourly activity over the hours whose activity is known.",
            ),
            ncol("Cost", "Σ present hours × rate (estimate)."),
            ncol(
                "Billed",
                "What imported billing exports billed for the group's GPU-hours they cover (with \
                 those hours); '—' where the cost is an estimate only.",
            ),
            ncol("Idle cost", "Σ idle hours × rate."),
            ncol(
                "Allocated-idle cost",
                "Σ hours both allocated and idle × rate.",
            ),
        ],
    );
    for g in groups {
        let mut key = Cell::text(g.key.clone());
        if let Some(h) = link(&g.key) {
            key = key.link(h);
        }
        t.push(vec![
            key,
            Cell::num(count(g.gpus), g.gpus as f64),
            Cell::num(count(g.gpu_hours), g.gpu_hours as f64),
            Cell::num(pct(g.avg_activity_pct), g.avg_activity_pct.unwrap_or(-1.0)),
            Cell::num(usd(g.cost_usd), g.cost_usd),
            Cell::num(billed_text(g), g.billed_usd),
            Cell::num(usd(g.idle_cost_usd), g.idle_cost_usd),
            Cell::num(usd(g.allocated_idle_cost_usd), g.allocated_idle_cost_usd),
        ]);
    }
    t
}

pub async fn overview(State(state): State<AppState>, RawQuery(q): RawQuery) -> Response {
    let p = match parse(q.as_deref(), &[]) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let now = state.now();
    let window = p.window(now);
    let store = &state.store;
    let daily = window.to.min(now.timestamp()) - window.from > 2 * 86_400;
    let (windows, gpus, sources, series) = match tokio::try_join!(
        store.gpu_windows(window, &p.filters, now),
        store.list_gpus(&p.filters, false, now),
        store.sources(now),
        store.series(window, &p.filters, daily, now),
    ) {
        Ok(v) => v,
        Err(e) => return internal(e),
    };
    // One read of the per-GPU counts serves both groupings and the waste findings.
    let (team_groups, total) = summarize(&windows, GroupBy::Team);
    let (env_groups, _) = summarize(&windows, GroupBy::Env);
    let f = match frame(&state, &p, "/", "Fleet overview", &sources).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let per_gpu = gpuledger_ledger::summary::per_gpu(windows.clone());
    let found = match super::waste::findings(&state, &p, &f, 7, &gpus, &per_gpu).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let t = &total;
    let present = gpus.iter().filter(|g| g.state == GpuState::Present).count() as i64;
    let width = |part: i64| {
        share(part, t.gpu_hours)
            .map(|s| format!("{:.1}", s * 10.0))
            .unwrap_or_else(|| "0".into())
    };
    let labels: Vec<String> = series
        .iter()
        .map(|s| {
            if daily {
                s.start.format("%m-%d").to_string()
            } else {
                s.start.format("%H:00").to_string()
            }
        })
        .collect();
    let trend_svg = stacked(
        "GPU-hours per bucket: busy, idle, unknown",
        &labels,
        &[
            Series {
                name: "busy".into(),
                color: "var(--busy)".into(),
                values: series.iter().map(|s| Some(s.busy_hours as f64)).collect(),
            },
            Series {
                name: "idle".into(),
                color: "var(--idle)".into(),
                values: series.iter().map(|s| Some(s.idle_hours as f64)).collect(),
            },
            Series {
                name: "unknown".into(),
                color: "var(--unknown)".into(),
                values: series
                    .iter()
                    .map(|s| Some(s.unknown_hours() as f64))
                    .collect(),
            },
        ],
        " h",
    );
    let mut top_waste = Table::new(
        "top-inefficiencies",
        &f,
        vec![
            col("Finding", "What kind of waste."),
            col("Where", "The GPU or workload; follow it for the evidence."),
            col("Team", "The team to talk to."),
            col("Why", "The evidence in a sentence."),
            ncol(
                "$/month",
                "What it costs per month (see the Waste page for how); unknown where no rate \
                 is known or, for GPUs without activity data, where nobody knows if it is waste.",
            ),
        ],
    );
    for x in found.all.iter().take(8) {
        top_waste.push(vec![
            Cell::text(x.kind.label()),
            Cell::text(x.what.clone()).link(x.evidence.clone()),
            Cell::text(x.team.clone()),
            Cell::text(x.detail.clone()),
            Cell::num(
                x.usd_per_month
                    .map(usd0)
                    .unwrap_or_else(|| "unknown".into()),
                x.usd_per_month.unwrap_or(-1.0),
            ),
        ]);
    }
    let team_link = |k: &str| Some(f.link(&format!("/teams/{}", super::enc(k))));
    let env_link = |k: &str| {
        let rest = if f.carry.is_empty() {
            String::new()
        } else {
            format!("&{}", f.carry)
        };
        Some(format!("/inventory?env={}{rest}", super::enc(k)))
    };
    let page = Overview {
        gpus_present: count(present),
        gpus_missing: count(gpus.len() as i64 - present),
        gpus_in_range: count(t.gpus),
        gpu_hours: count(t.gpu_hours),
        avg_activity: pct(t.avg_activity_pct),
        cost: usd(t.cost_usd),
        unpriced: if t.unpriced_gpu_hours > 0 {
            format!(
                "{} GPU-hours have no known rate",
                count(t.unpriced_gpu_hours)
            )
        } else {
            "every GPU-hour priced".into()
        },
        cost_basis: cost_basis_text(t),
        idle_cost: usd(t.idle_cost_usd),
        idle_hours: count(t.idle_hours),
        alloc_idle_cost: usd(t.allocated_idle_cost_usd),
        alloc_idle_hours: count(t.allocated_idle_hours),
        busy_hours: count(t.busy_hours),
        unknown_hours: count(t.unknown_hours),
        busy_pct: pct(share(t.busy_hours, t.gpu_hours)),
        idle_pct: pct(share(t.idle_hours, t.gpu_hours)),
        unknown_pct: pct(share(t.unknown_hours, t.gpu_hours)),
        busy_w: width(t.busy_hours),
        idle_w: width(t.idle_hours),
        busy_idle_w: width(t.busy_hours + t.idle_hours),
        unknown_w: width(t.unknown_hours),
        bucket: if daily { "day" } else { "hour" },
        trend_svg,
        by_team: spend_table("spend-by-team", &f, "Team", &team_groups, team_link),
        by_env: spend_table("spend-by-env", &f, "Environment", &env_groups, env_link),
        top_waste,
        freshness: sources
            .iter()
            .map(|s| {
                (
                    s.name.clone(),
                    status_text(s.status),
                    format!("last success {} ago", super::lag(s.lag_secs)),
                )
            })
            .collect(),
        waste_href: f.link("/waste"),
        sources_href: f.link("/sources"),
        frame: f,
    };
    let tables = [&page.by_team, &page.by_env, &page.top_waste];
    respond(&page, &tables, &p)
}

/// `$1,234.00 (410 h)`: what was billed for a group's reconciled GPU-hours, or `—`.
pub fn billed_text(g: &SummaryGroup) -> String {
    if g.billed_gpu_hours > 0 {
        format!("{} ({} h)", usd(g.billed_usd), count(g.billed_gpu_hours))
    } else {
        "—".into()
    }
}

/// The cost card's basis: an estimate, or partly or wholly reconciled with billing.
pub fn cost_basis_text(t: &SummaryGroup) -> String {
    match t.cost_basis {
        gpuledger_model::CostBasis::Estimate => {
            "estimate: no billing export covers the range".into()
        }
        basis => format!(
            "{}: billed {} for {} of {} GPU-hours (estimated {} for those)",
            basis.as_str(),
            usd(t.billed_usd),
            count(t.billed_gpu_hours),
            count(t.gpu_hours),
            usd(t.billed_estimate_usd)
        ),
    }
}
