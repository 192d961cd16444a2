//! The Sources page: each source's kind, last success, lag against the 1-hour objective, last
//! error, and how many GPUs it reports.

use askama::Template;
use axum::extract::State;
use axum::response::Response;

use super::{col, count, lag, ncol, respond, status_text, Cell, Frame, Page, PageError, Table};
use crate::AppState;

#[derive(Template)]
#[template(path = "sources.html")]
pub struct SourcesPage {
    pub frame: Frame,
    pub table: Table,
}

pub async fn sources_page(
    State(state): State<AppState>,
    page: Page,
) -> Result<Response, PageError> {
    let Page {
        p,
        sources,
        frame: f,
        scope,
        ..
    } = page;
    // Sources' errors name GPUs and teams of every team.
    if scope.is_limited() {
        return Err(PageError::forbidden(scope.refusal("sources")));
    }
    let objective = state.store.settings().freshness_objective_secs;
    let mut table = Table::new("sources", &f, vec![
        col("Source", "The name its token or collector reports as."),
        col("Kind", "push, agent, demo, or a collector kind."),
        col("Status", "ok: succeeded within the objective; stale: older; error: its last attempt failed; never: no success yet."),
        col("Last success", "Its last accepted report (UTC)."),
        ncol("Lag", "Time since the last success."),
        ncol("Against 1 h objective", "Lag as a share of the freshness objective; over 100 % means figures rest on stale data."),
        ncol("GPUs", "Physical GPUs it reported first."),
        col("Last error", "The last problem it had, if any."),
    ]);
    for s in &sources {
        table.push(vec![
            Cell::text(s.name.clone()),
            Cell::text(s.kind.clone()),
            Cell::text(status_text(s.status)),
            Cell::text(
                s.last_success
                    .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
                    .unwrap_or_else(|| "never".into()),
            ),
            Cell::num(lag(s.lag_secs), s.lag_secs.unwrap_or(-1) as f64),
            Cell::num(
                s.lag_secs
                    .map(|l| format!("{:.0} %", l as f64 * 100.0 / objective as f64))
                    .unwrap_or_else(|| "unknown".into()),
                s.lag_secs.unwrap_or(-1) as f64,
            ),
            Cell::num(count(s.gpus), s.gpus as f64),
            Cell::text(s.last_error.clone().unwrap_or_default()),
        ]);
    }
    let page = SourcesPage { table, frame: f };
    let tables = [&page.table];
    respond(&page, &tables, &p)
}
