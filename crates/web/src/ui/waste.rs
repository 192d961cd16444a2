//! The Waste page: idle GPUs, GPUs nobody measures, allocated-but-idle workloads, GPUs whose
//! memory use stays far below capacity, missing GPUs, and GPU spend billed for instances no
//! source reports, each with its $ per month and a link to the evidence (`findings`).

use askama::Template;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use gpuledger_ledger::summary::round;
use gpuledger_ledger::waste::Finding;

use super::findings::{findings, findings_reads, Findings, Listing};
use super::{respond, usd0, Frame, Page, PageError, Table, Takes};
use crate::AppState;

#[derive(Template)]
#[template(path = "waste.html")]
pub struct WastePage {
    pub frame: Frame,
    pub idle_days: i64,
    pub idle_links: Vec<(String, String)>,
    pub total: String,
    pub idle: Table,
    pub unmeasured: Table,
    pub alloc_idle: Table,
    pub low_mem: Table,
    pub missing: Table,
    pub billed_unseen: Table,
}

/// How many rows of each table the Waste page shows (largest first); the CSV of a table has
/// them all.
pub const ROWS_SHOWN: usize = 100;

/// The Waste page's own parameter: `idle_days`.
pub struct WasteParams;
impl Takes for WasteParams {
    const PARAMS: &'static [&'static str] = &["idle_days"];
}

/// `GET /api/v1/savings`: the Waste page's findings as JSON — waste with its $ per month,
/// largest first, then GPUs with no activity data (no $: unknown is not waste) — each with its
/// kind, team, evidence link and the figures behind it. Errors are JSON, as for every API.
pub async fn savings_api(
    State(state): State<AppState>,
    page: Result<Page<WasteParams>, PageError>,
) -> Response {
    match load(&state, page, false).await {
        Ok((page, found, idle_days)) => {
            // Only the findings up to the page's end were written (`load`); the count and the
            // total are of every finding, the Waste page's total.
            let paging = page.p.paging;
            let items: Vec<Finding> = found
                .all
                .into_iter()
                .skip(paging.offset)
                .map(|mut x| {
                    x.usd_per_month = x.usd_per_month.map(|m| round(m, 2));
                    x
                })
                .collect();
            // Serialized straight from the findings, not through a `serde_json::Value`.
            #[derive(serde::Serialize)]
            struct Savings {
                count: usize,
                offset: usize,
                next_offset: Option<usize>,
                idle_days: i64,
                items: Vec<Finding>,
                usd_per_month: f64,
            }
            axum::Json(Savings {
                count: found.count,
                offset: paging.offset,
                next_offset: paging.next_offset(found.count),
                idle_days,
                usd_per_month: found.total_per_month,
                items,
            })
            .into_response()
        }
        Err(e) => e.json(),
    }
}

/// The page context, findings and `idle_days` for the page and the API; the findings' tables
/// filled only where `tables` (the page).
async fn load(
    state: &AppState,
    page: Result<Page<WasteParams>, PageError>,
    tables: bool,
) -> Result<(Page<WasteParams>, Findings, i64), PageError> {
    let page = page?;
    let idle_days = match page.p.extra.get("idle_days").map(|v| v.parse::<i64>()) {
        None => 7,
        Some(Ok(d)) if (1..=365).contains(&d) => d,
        Some(_) => {
            return Err(PageError::bad_request(
                "idle_days: must be a whole number of days within 1..=365",
            ))
        }
    };
    let listing = Listing {
        idle_days,
        tables,
        // The page shows its tables and the total, never the ranked list; the API lists
        // every finding, or those up to the end of the page it asks for (`limit`).
        top: if tables {
            Some(0)
        } else {
            let paging = page.p.paging;
            paging.limit.map(|l| paging.offset.saturating_add(l))
        },
        rows: (tables && !page.p.extra.contains_key("csv")).then_some(ROWS_SHOWN),
    };
    let (gpus, windows, reads) = tokio::try_join!(
        state.store.list_gpus_brief(&page.p.filters, page.now),
        state
            .store
            .gpu_totals_with_peak(page.window, &page.p.filters, page.now),
        findings_reads(state, &page.p, &listing),
    )?;
    let found = findings(state, &page.p, &page.frame, listing, &gpus, &windows, reads);
    Ok((page, found, idle_days))
}

pub async fn waste(
    State(state): State<AppState>,
    page: Result<Page<WasteParams>, PageError>,
) -> Result<Response, PageError> {
    let (page, found, idle_days) = load(&state, page, true).await?;
    let (p, f) = (page.p, page.frame);
    let total = found.total_per_month;
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
        unmeasured: found.unmeasured,
        alloc_idle: found.alloc_idle,
        low_mem: found.low_mem,
        missing: found.missing,
        billed_unseen: found.billed_unseen,
        frame: f,
    };
    let tables = [
        &page.idle,
        &page.unmeasured,
        &page.alloc_idle,
        &page.low_mem,
        &page.missing,
        &page.billed_unseen,
    ];
    respond(&page, &tables, &p)
}
