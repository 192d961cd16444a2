//! The Overview page: fleet totals and their trend, spend by team and environment, the top
//! inefficiencies with $ per month, and a freshness strip of every source.

use askama::Template;
use axum::extract::State;
use axum::response::Response;
use gpuledger_ledger::{summarize, GroupBy};
use gpuledger_model::GpuState;

use super::charts::{stacked, Series};
use super::findings::{findings, findings_reads, Listing};
use super::parts::{cost_basis_text, spend_table};
use super::{
    col, count, ncol, pct, respond, share, status_text, usd, usd0, Cell, Frame, Page, PageError,
    Table,
};
use crate::AppState;

/// How many of the ranked findings the Overview shows (the rest are on the Waste page).
const TOP_FINDINGS: usize = 8;

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
    pub forecast: super::forecast::ForecastView,
    pub by_team: Table,
    pub by_env: Table,
    pub top_waste: Table,
    pub freshness: Vec<(String, &'static str, String)>,
    pub waste_href: String,
    pub sources_href: String,
}

pub async fn overview(State(state): State<AppState>, page: Page) -> Result<Response, PageError> {
    let Page {
        p,
        now,
        window,
        sources,
        frame: f,
        ..
    } = page;
    let store = &state.store;
    let daily = window.to.min(now.timestamp()) - window.from > 2 * 86_400;
    // Eight findings are shown: only they are written.
    let listing = Listing {
        idle_days: 7,
        tables: false,
        top: Some(TOP_FINDINGS),
        rows: None,
    };
    // The per-GPU counts, the trend and the forecast share one read of today.
    let ((windows, series, forecast), gpus, reads) = tokio::try_join!(
        store.windows_trend_forecast(window, &p.filters, daily, now),
        store.list_gpus_brief(&p.filters, now),
        findings_reads(&state, &p, &listing),
    )?;
    // One read of the per-GPU counts serves both groupings and the waste findings.
    let (team_groups, total) = summarize(&windows, GroupBy::Team);
    let (env_groups, _) = summarize(&windows, GroupBy::Env);
    let per_gpu = gpuledger_ledger::summary::per_gpu(windows);
    let found = findings(&state, &p, &f, listing, &gpus, &per_gpu, reads);
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
    for x in &found.all {
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
        forecast: super::forecast::view(&forecast),
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
