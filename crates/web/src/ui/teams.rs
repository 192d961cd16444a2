//! The Teams pages: per team, GPUs owned against GPUs used, cost, idle cost and the activity
//! trend week over week; one team's page lists its GPUs and the workloads on them.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Path, State};
use axum::response::Response;
use gpuledger_ledger::usedby::{UsedBy, UNALLOCATED};
use gpuledger_ledger::GroupBy;
use gpuledger_store::SeriesPoint;

use super::parts::{billed_text, spend_table};
use super::{col, count, ncol, pct, respond, usd, Cell, Frame, Page, PageError, Table};
use crate::AppState;

#[derive(Template)]
#[template(path = "teams.html")]
pub struct TeamsPage {
    pub frame: Frame,
    pub table: Table,
}

fn trend(this: Option<f64>, last: Option<f64>) -> (String, f64) {
    match (this, last) {
        (Some(a), Some(b)) => {
            let d = a - b;
            let arrow = if d > 0.5 {
                "▲"
            } else if d < -0.5 {
                "▼"
            } else {
                "="
            };
            (
                format!("{arrow} {d:+.1} pts ({} → {})", pct(Some(b)), pct(Some(a))),
                d,
            )
        }
        (Some(a), None) => (format!("new ({})", pct(Some(a))), 0.0),
        _ => ("unknown".into(), 0.0),
    }
}

pub async fn teams(State(state): State<AppState>, page: Page) -> Result<Response, PageError> {
    let Page {
        p,
        now,
        window,
        frame: f,
        ..
    } = page;
    let store = &state.store;
    // `range=7d` ending now, against the `range=7d` that ends where it starts.
    let this_week = crate::params::range_window(now, 7);
    let last_week = crate::params::range_window(
        chrono::DateTime::from_timestamp(this_week.from, 0).unwrap_or(now),
        7,
    );
    // Week over week needs only each team's activity: its daily trend per team, folded, reads
    // whole days from the group rollups where two summaries read every GPU.
    // Today's per-GPU rows are read once for the summary and this week's trend.
    let ((owned, [wk, prev]), used) = tokio::try_join!(
        store.summary_and_series_by_team(window, [this_week, last_week], &p.filters, now),
        store.used_by_cost(window, &p.filters, now),
    )?;
    let by_team = |days: Vec<(String, SeriesPoint)>| {
        let mut out: BTreeMap<String, SeriesPoint> = BTreeMap::new();
        for (team, day) in days {
            out.entry(team).or_default().absorb(&day);
        }
        out
    };
    let (wk, prev) = (by_team(wk), by_team(prev));
    let used: BTreeMap<&str, &UsedBy> = used
        .iter()
        .filter(|u| u.team != UNALLOCATED)
        .map(|u| (u.team.as_str(), u))
        .collect();
    // Rounded as the summary rounds a group's activity, so the figure is the one a summary
    // of that week shows.
    let act = |s: &BTreeMap<String, SeriesPoint>, k: &str| {
        s.get(k)
            .and_then(SeriesPoint::avg_activity_pct)
            .map(|a| gpuledger_ledger::summary::round(a, 2))
    };
    let mut table = Table::new(
        "teams",
        &f,
        vec![
            col(
                "Team",
                "Owner team, and the team its allocations name; follow it for its GPUs and \
                 workloads. `unowned`: GPUs no ownership rule places, and workloads that name no \
                 team — one bucket for \"no team is known\".",
            ),
            ncol(
                "GPUs owned",
                "Physical GPUs it owns that were present in the range.",
            ),
            ncol(
                "GPUs used",
                "Distinct GPUs its allocations held at a present hour of the range (any owner; \
                 an allocation on a MIG instance holds its GPU).",
            ),
            ncol(
                "GPU-hours used",
                "Its share of present GPU-hours in the range, on any team's GPUs: an hour shared \
                 by several workloads is split evenly (the same figure as GET /api/v1/used-by).",
            ),
            ncol(
                "Cost of use",
                "Those hours × rate: what its use cost, whoever owns the GPUs.",
            ),
            ncol(
                "Cost",
                "Σ present hours × rate of the GPUs it owns (charged to the owner).",
            ),
            ncol(
                "Billed",
                "What imported billing exports billed for its GPU-hours they cover (with those \
                 hours); '—' where its cost is an estimate only.",
            ),
            ncol("Idle cost", "Σ idle hours × rate of the GPUs it owns."),
            ncol(
                "Avg activity",
                "Mean hourly activity of its GPUs over known hours in the range.",
            ),
            ncol(
                "Week over week",
                "Average activity over the last 7 days (`range=7d`: the 7 whole days before today \
                 and today so far) against the 7 whole days before those.",
            ),
        ],
    );
    let mut keys: Vec<String> = owned.groups.iter().map(|g| g.key.clone()).collect();
    for k in used.keys() {
        if !keys.iter().any(|x| x == k) {
            keys.push(k.to_string());
        }
    }
    for k in keys {
        let g = owned
            .groups
            .iter()
            .find(|g| g.key == k)
            .cloned()
            .unwrap_or_default();
        let u = used.get(k.as_str());
        let (t, dv) = trend(act(&wk, &k), act(&prev, &k));
        table.push(vec![
            Cell::text(k.clone()).link(f.link(&format!("/teams/{}", super::enc(&k)))),
            Cell::num(count(g.gpus), g.gpus as f64),
            Cell::num(
                u.map(|u| count(u.gpus)).unwrap_or_else(|| "0".into()),
                u.map(|u| u.gpus as f64).unwrap_or(0.0),
            ),
            Cell::num(
                u.map(|u| format!("{:.1}", u.gpu_hours))
                    .unwrap_or_else(|| "0".into()),
                u.map(|u| u.gpu_hours).unwrap_or(0.0),
            ),
            Cell::num(
                u.map(|u| usd(u.cost_usd)).unwrap_or_else(|| usd(0.0)),
                u.map(|u| u.cost_usd).unwrap_or(0.0),
            ),
            Cell::num(usd(g.cost_usd), g.cost_usd),
            Cell::num(billed_text(&g), g.billed_usd),
            Cell::num(usd(g.idle_cost_usd), g.idle_cost_usd),
            Cell::num(pct(g.avg_activity_pct), g.avg_activity_pct.unwrap_or(-1.0)),
            Cell::num(t, dv),
        ]);
    }
    let page = TeamsPage { table, frame: f };
    let tables = [&page.table];
    respond(&page, &tables, &p)
}

#[derive(Template)]
#[template(path = "team.html")]
pub struct TeamPage {
    pub frame: Frame,
    pub team: String,
    pub summary: Table,
    pub gpus: Table,
    pub workloads: Table,
    pub forecast: super::forecast::ForecastView,
}

pub async fn team_page(
    State(state): State<AppState>,
    Path(team): Path<String>,
    page: Page,
) -> Result<Response, PageError> {
    let Page {
        mut p,
        now,
        window,
        frame: mut f,
        scope,
        ..
    } = page;
    if !scope.may_read(&team) {
        let mut asked = p.clone();
        asked.filters.team = vec![team.clone()];
        return Err(PageError::forbidden(
            scope.apply(&mut asked).err().unwrap_or_default(),
        ));
    }
    f.title = format!("Team {team}");
    let store = &state.store;
    p.filters.team = vec![team.clone()];
    let (windows, gpus, allocs, forecast) = tokio::try_join!(
        store.gpu_windows_without_peak(window, &p.filters, now),
        store.list_gpus_brief(&p.filters, now),
        store.allocations_in(window, &p.filters, 200),
        // The filters hold only this team: the total is the team's forecast.
        store.forecast_total(&p.filters, now),
    )?;
    // One read of the per-GPU counts serves the summary by environment and the GPUs' table.
    let by_env = store.summary_of(&windows, window, GroupBy::Env, now);
    let windows = gpuledger_ledger::summary::per_gpu(windows);
    let mut groups = by_env.groups.clone();
    let mut total = by_env.total.clone();
    total.key = "total".into();
    groups.push(total);
    let summary = spend_table("team-by-env", &f, "Environment", &groups, |_| None);
    let by_uuid: BTreeMap<&str, &gpuledger_ledger::GpuWindow> =
        windows.iter().map(|w| (&*w.uuid, w)).collect();
    let mut table = Table::new(
        "team-gpus",
        &f,
        vec![
            col("GPU", "Follow it for its timeline."),
            col("Model", "GPU model."),
            col("Host", "Host."),
            col("Env", "Environment."),
            col("State", "present or missing."),
            ncol(
                "Activity",
                "Mean hourly activity over known hours in the range.",
            ),
            ncol("Cost", "Present hours × rate in the range."),
        ],
    );
    // The first rows only, as on the Waste page: the largest team of a 100,000-GPU fleet has
    // tens of thousands of GPUs, megabytes of HTML. The table's CSV has them all.
    let shown = if p.extra.contains_key("csv") {
        gpus.len()
    } else {
        super::waste::ROWS_SHOWN
    };
    table.hidden = gpus.len().saturating_sub(shown);
    table.order = "by host";
    for g in gpus.iter().take(shown) {
        let w = by_uuid.get(&*g.uuid);
        let a = w.and_then(|w| w.avg_activity_pct());
        let c = w.and_then(|w| w.cost_usd());
        table.push(vec![
            Cell::text(&*g.uuid).link(f.link(&format!("/gpus/{}", g.uuid))),
            Cell::text(&*g.model),
            Cell::text(g.host.as_deref().unwrap_or_default()),
            Cell::text(&*g.env),
            Cell::text(g.state.as_str()),
            Cell::num(pct(a), a.unwrap_or(-1.0)),
            Cell::num(
                c.map(usd).unwrap_or_else(|| "unknown".into()),
                c.unwrap_or(-1.0),
            ),
        ]);
    }
    let mut workloads = Table::new(
        "team-workloads",
        &f,
        vec![
            col("Workload", "Allocation on one of the team's GPUs."),
            col("Kind", "pod, slurm_job, process, reservation or other."),
            col("GPU", "The GPU it held."),
            col("User", "Who ran it."),
            col("Used by", "The team the allocation names."),
            col("Start", "UTC."),
            col("End", "UTC, or running."),
        ],
    );
    for a in &allocs {
        workloads.push(vec![
            Cell::text(a.workload.clone()),
            Cell::text(a.kind.clone()),
            Cell::text(a.gpu_uuid.clone()).link(f.link(&format!("/gpus/{}", a.gpu_uuid))),
            Cell::text(a.user.clone().unwrap_or_else(|| "unknown".into())),
            Cell::text(gpuledger_ledger::usedby::user_team(a.team.as_deref())),
            Cell::text(a.start.format("%Y-%m-%d %H:%M").to_string()),
            Cell::text(
                a.end
                    .map(|e| e.format("%Y-%m-%d %H:%M").to_string())
                    .unwrap_or_else(|| "running".into()),
            ),
        ]);
    }
    let page = TeamPage {
        team,
        summary,
        gpus: table,
        workloads,
        forecast: super::forecast::view(&forecast),
        frame: f,
    };
    let tables = [&page.summary, &page.gpus, &page.workloads];
    respond(&page, &tables, &p)
}
