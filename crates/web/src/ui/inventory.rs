//! The Inventory page: every GPU in a sortable, paginated table with its activity and cost over
//! the range, MIG instances folded under their GPU.

use std::collections::HashMap;

use askama::Template;
use axum::extract::State;
use axum::response::Response;
use gpuledger_ledger::echo;

use super::{col, count, ncol, pct, respond, usd, Cell, Frame, Page, PageError, Table, Takes};
use crate::AppState;

pub const PAGE_SIZE: usize = 100;

#[derive(Template)]
#[template(path = "inventory.html")]
pub struct InventoryPage {
    pub frame: Frame,
    pub total: String,
    pub table: Table,
    pub sorts: Vec<(String, String, bool)>,
    pub pages: Vec<(String, String, bool)>,
}

const SORTS: [(&str, &str); 6] = [
    ("cost", "cost"),
    ("activity", "activity"),
    ("host", "host"),
    ("team", "team"),
    ("model", "model"),
    ("state", "state"),
];

/// The Inventory's own parameters.
pub struct InventoryParams;
impl Takes for InventoryParams {
    const PARAMS: &'static [&'static str] = &["sort", "page"];
}

pub async fn inventory(
    State(state): State<AppState>,
    page: Page<InventoryParams>,
) -> Result<Response, PageError> {
    let Page {
        p,
        now,
        window,
        frame: f,
        ..
    } = page;
    let sort = p.extra.get("sort").map(String::as_str).unwrap_or("host");
    if !SORTS.iter().any(|(k, _)| *k == sort) {
        return Err(PageError::bad_request(format!(
            "sort: must be one of cost, activity, host, team, model, state; got `{}`",
            echo(sort)
        )));
    }
    let page_no: usize = match p.extra.get("page").map(|v| v.parse::<usize>()) {
        None => 1,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => return Err(PageError::bad_request("page: must be a page number from 1")),
    };
    let store = &state.store;
    let (gpus, windows) = tokio::try_join!(
        store.list_gpus(&p.filters, true, now),
        store.gpu_totals(window, &p.filters, now),
    )?;
    let by_uuid: HashMap<&str, &gpuledger_ledger::GpuWindow> =
        windows.iter().map(|w| (&*w.uuid, w)).collect();
    let mut children: HashMap<&str, Vec<&gpuledger_model::GpuView>> = HashMap::new();
    let mut physical = Vec::new();
    for g in &gpus {
        match &g.mig_parent_uuid {
            Some(parent) => children.entry(&**parent).or_default().push(g),
            None => physical.push(g),
        }
    }
    let act = |u: &str| by_uuid.get(u).and_then(|w| w.avg_activity_pct());
    let cost = |u: &str| by_uuid.get(u).and_then(|w| w.cost_usd());
    match sort {
        "cost" => physical.sort_by(|a, b| {
            cost(&b.uuid)
                .unwrap_or(-1.0)
                .total_cmp(&cost(&a.uuid).unwrap_or(-1.0))
        }),
        "activity" => physical.sort_by(|a, b| {
            act(&b.uuid)
                .unwrap_or(-1.0)
                .total_cmp(&act(&a.uuid).unwrap_or(-1.0))
        }),
        "team" => physical.sort_by(|a, b| a.team.cmp(&b.team).then(a.host.cmp(&b.host))),
        "model" => physical.sort_by(|a, b| a.model.cmp(&b.model).then(a.host.cmp(&b.host))),
        "state" => physical.sort_by(|a, b| {
            b.state
                .as_str()
                .cmp(a.state.as_str())
                .then(a.host.cmp(&b.host))
        }),
        _ => {}
    }
    let pages = physical.len().div_ceil(PAGE_SIZE).max(1);
    if page_no > pages {
        return Err(PageError::bad_request(format!(
            "page: there are {pages} page(s)"
        )));
    }
    let mut table = Table::new("inventory", &f, vec![
        col("GPU", "NVIDIA UUID (MIG instances indented under their GPU); follow it for the GPU's timeline."),
        col("Model", "GPU model."),
        col("Host", "Host it runs on."),
        col("Cluster", "Cluster."),
        col("Cloud / region", "Where it runs."),
        col("Team", "Owner team; `unowned` when no rule places it."),
        col("Env", "Environment; `unknown` when no source gives it."),
        col("State", "present, or missing when unobserved for longer than the stale window (2 h); unavailable when its source says it cannot take work (a drained or down Slurm node)."),
        ncol("Activity", "Mean hourly activity over the range's known hours; unknown when no hour is known."),
        ncol("$/h", "Hourly rate; hover for its origin."),
        ncol("Cost", "Present hours in the range × rate (estimate)."),
    ]);
    let shown: Vec<_> = physical
        .iter()
        .skip((page_no - 1) * PAGE_SIZE)
        .take(PAGE_SIZE)
        .collect();
    for g in shown {
        let href = f.link(&format!("/gpus/{}", g.uuid));
        let a = act(&g.uuid);
        let c = cost(&g.uuid);
        table.push(vec![
            Cell::text(&*g.uuid).link(href),
            Cell::text(&*g.model),
            Cell::text(g.host.as_deref().unwrap_or_default()),
            Cell::text(g.cluster.as_deref().unwrap_or_default()),
            Cell::text(format!(
                "{} / {}",
                g.cloud.clone().unwrap_or_else(|| "unknown".into()),
                g.region.clone().unwrap_or_else(|| "unknown".into())
            )),
            Cell::text(&*g.team).link(f.link(&format!("/teams/{}", super::enc(&g.team)))),
            Cell::text(&*g.env),
            Cell::text(match gpuledger_ledger::identity::unavailable(&g.labels) {
                Some(why) => format!("{}, {why}", g.state.as_str()),
                None => g.state.as_str().to_string(),
            }),
            Cell::num(pct(a), a.unwrap_or(-1.0)),
            Cell::num(
                g.usd_per_hour
                    .map(|r| format!("{r:.4}"))
                    .unwrap_or_else(|| "unknown".into()),
                g.usd_per_hour.unwrap_or(-1.0),
            )
            .titled(&*g.rate_origin),
            Cell::num(
                c.map(usd).unwrap_or_else(|| "unknown".into()),
                c.unwrap_or(-1.0),
            ),
        ]);
        for m in children.get(&*g.uuid).into_iter().flatten() {
            table.push_child(vec![
                Cell::text(format!(
                    "{} ({})",
                    m.uuid,
                    m.mig_profile.clone().unwrap_or_default()
                )),
                Cell::text(format!("MIG {}", m.mig_profile.clone().unwrap_or_default())),
                Cell::text(m.host.as_deref().unwrap_or_default()),
                Cell::text(m.cluster.as_deref().unwrap_or_default()),
                Cell::text(""),
                Cell::text(&*m.team),
                Cell::text(&*m.env),
                Cell::text(m.state.as_str()),
                Cell::num("part of its GPU", -1.0),
                Cell::num("", -1.0),
                Cell::num("", -1.0),
            ]);
        }
    }
    let page = InventoryPage {
        total: format!(
            "{} GPUs ({} present, {} missing), {} MIG instances",
            count(physical.len() as i64),
            count(
                physical
                    .iter()
                    .filter(|g| g.state == gpuledger_model::GpuState::Present)
                    .count() as i64
            ),
            count(
                physical
                    .iter()
                    .filter(|g| g.state == gpuledger_model::GpuState::Missing)
                    .count() as i64
            ),
            count(children.values().map(|v| v.len() as i64).sum()),
        ),
        sorts: SORTS
            .iter()
            .map(|(k, l)| (l.to_string(), f.with(&[("sort", k)]), *k == sort))
            .collect(),
        pages: (1..=pages)
            .map(|n| {
                (
                    n.to_string(),
                    f.with(&[("sort", sort), ("page", &n.to_string())]),
                    n == page_no,
                )
            })
            .collect(),
        table,
        frame: f,
    };
    let tables = [&page.table];
    respond(&page, &tables, &p)
}
