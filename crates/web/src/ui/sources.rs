//! The Sources page: each source's kind, last success, lag against the 1-hour objective, last
//! error, and how many GPUs it reports; what each cloud collector found per account; then
//! every token with its source, state and last use
//! (one that never pushed shows "never"); and the notifications sent, with their outcome.

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
    pub accounts: Table,
    pub tokens: Table,
    pub deliveries: Table,
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
        ncol("Refused, 24 h", "Pushes refused before they were read in the last 24 hours: over its rate limit (429), too large, too slow, a viewer token. GET /api/v1/audit has each with its reason."),
    ]);
    // Refusals noted in memory first, so the page has every one up to now.
    if let Err(e) = state.limiter.flush(&state.store).await {
        tracing::warn!(error = %e, "could not write refusals to the audit log");
    }
    let refused: std::collections::HashMap<String, i64> = state
        .store
        .refusals_since(state.now().timestamp() - 86_400)
        .await?
        .into_iter()
        .collect();
    for s in &sources {
        let n = refused.get(&s.name).copied().unwrap_or(0);
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
            Cell::num(count(n), n as f64),
        ]);
    }
    let mut accounts = Table::new(
        "cloud-accounts",
        &f,
        vec![
            col(
                "Source",
                "The cloud collector (aws, gcp, azure) that read the account.",
            ),
            col("Kind", "aws, gcp or azure."),
            col(
                "Account",
                "The AWS account, GCP project or Azure subscription.",
            ),
            ncol(
                "GPUs",
                "Physical GPUs of its running GPU instances, wherever they were merged to.",
            ),
            ncol("Hosts", "The hosts they are on."),
            col(
                "Last found",
                "When the collector last reported a GPU of the account (UTC).",
            ),
        ],
    );
    for a in state.store.cloud_accounts().await? {
        accounts.push(vec![
            Cell::text(a.source),
            Cell::text(a.kind),
            Cell::text(a.account),
            Cell::num(count(a.gpus), a.gpus as f64),
            Cell::num(count(a.hosts), a.hosts as f64),
            Cell::text(a.last_seen.format("%Y-%m-%d %H:%M:%S").to_string()),
        ]);
    }
    let when = |t: Option<i64>| {
        t.and_then(|t| chrono::DateTime::from_timestamp(t, 0))
            .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
    };
    // Tokens expire by the wall clock, as the server checks them.
    let now = chrono::Utc::now().timestamp();
    let mut tokens = Table::new(
        "tokens",
        &f,
        vec![
            ncol("Id", "What `gpuledger token rotate` and `revoke` take."),
            col("Role", "ingest: pushes; viewer: reads."),
            col("Source", "The source its pushes report as."),
            col("Teams", "The teams it may write or read; any: all."),
            col("State", "active, expired or revoked."),
            col("Expires", "When it stops working, if it does."),
            col(
                "Last used",
                "When the server last accepted it (to the minute); never: not once.",
            ),
        ],
    );
    for t in state.store.list_tokens().await? {
        tokens.push(vec![
            Cell::num(t.id.to_string(), t.id as f64),
            Cell::text(t.role),
            Cell::text(t.source.clone()),
            Cell::text(if t.teams.is_empty() {
                "any".to_string()
            } else {
                t.teams.join(", ")
            }),
            Cell::text(t.state(now)),
            Cell::text(when(t.expires_at).unwrap_or_else(|| "never".into())),
            Cell::text(when(t.last_used_at).unwrap_or_else(|| "never".into())),
        ]);
    }
    let mut deliveries = Table::new(
        "notifications",
        &f,
        vec![
            col("When", "When it was sent or tried (UTC)."),
            col(
                "Event",
                "new, changed, resolved (the finding cleared) or digest (the weekly summary).",
            ),
            col(
                "To",
                "The e-mail address or the webhook's name (never its URL).",
            ),
            col("Subject", "What the message said."),
            col(
                "Outcome",
                "sent; failed (every attempt failed; tried again next round); rate_limited \
                 (the target had its messages for the hour; sent in a later round).",
            ),
            ncol(
                "Attempts",
                "Tries in that round, with backoff between them.",
            ),
            col("Error", "The last attempt's error."),
        ],
    );
    for d in state.store.deliveries(200).await? {
        deliveries.push(vec![
            Cell::text(d.at.format("%Y-%m-%d %H:%M").to_string()),
            Cell::text(d.event),
            Cell::text(d.recipient),
            Cell::text(d.subject),
            Cell::text(d.outcome),
            Cell::num(d.attempts.to_string(), d.attempts as f64),
            Cell::text(d.error.unwrap_or_default()),
        ]);
    }
    let page = SourcesPage {
        table,
        accounts,
        tokens,
        deliveries,
        frame: f,
    };
    let tables = [&page.table, &page.accounts, &page.tokens, &page.deliveries];
    respond(&page, &tables, &p)
}
