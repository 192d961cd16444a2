//! The audit log: writes and refusals per minute, source, actor, action and outcome.
//!
//! A push is counted in its own transaction (so the log and the data never disagree); refusals
//! that never reach the store (an unknown token, a rate limit) arrive in batches from the web
//! layer, which adds them up in memory first, so a flood of refused requests costs one row per
//! minute and outcome, not a write per request.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{Any, Transaction};

use crate::{Result, Store};

/// One row of the audit log: what happened in one minute, for one source, actor, action and
/// outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditRow {
    /// The minute's start.
    pub minute: DateTime<Utc>,
    /// The token's (or collector's) source; empty for a token the server does not know.
    pub source: String,
    /// How it wrote: `push`, `agent`, a collector's kind, or `cli` for token administration.
    pub actor: String,
    /// `push`, `refused`, `token.create`, `token.rotate` or `token.revoke`.
    pub action: String,
    /// `ok`, `partial` (some records rejected), `rejected` (none kept), or the refusal.
    pub outcome: String,
    pub requests: i64,
    /// Records kept.
    pub records: i64,
    /// Records refused, each with its reason in the push's answer.
    pub rejected: i64,
    /// Records kept that were already stored.
    pub duplicates: i64,
    /// GPUs the writes added.
    pub new_gpus: i64,
}

/// One event to add to the log.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AuditKey {
    pub minute: i64,
    pub source: String,
    pub actor: String,
    pub action: String,
    pub outcome: String,
}

impl AuditKey {
    /// The key of an event at `at` (seconds), floored to its minute.
    pub fn new(at: i64, source: &str, actor: &str, action: &str, outcome: &str) -> AuditKey {
        AuditKey {
            minute: at.div_euclid(60) * 60,
            source: gpuledger_ledger::clip(source, 128).into_owned(),
            actor: gpuledger_ledger::clip(actor, 64).into_owned(),
            action: action.to_string(),
            outcome: gpuledger_ledger::clip(outcome, 128).into_owned(),
        }
    }
}

/// The counts of an event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditCounts {
    pub requests: i64,
    pub records: i64,
    pub rejected: i64,
    pub duplicates: i64,
    pub new_gpus: i64,
}

const UPSERT: &str = "INSERT INTO audit_log (minute, source, actor, action, outcome, requests, \
     records, rejected, duplicates, new_gpus) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
     ON CONFLICT (minute, source, actor, action, outcome) DO UPDATE SET \
     requests = audit_log.requests + excluded.requests, \
     records = audit_log.records + excluded.records, \
     rejected = audit_log.rejected + excluded.rejected, \
     duplicates = audit_log.duplicates + excluded.duplicates, \
     new_gpus = audit_log.new_gpus + excluded.new_gpus";

impl Store {
    /// Add one event inside a writer's transaction.
    pub(crate) async fn audit_in(
        &self,
        tx: &mut Transaction<'_, Any>,
        key: &AuditKey,
        c: AuditCounts,
    ) -> Result<()> {
        sqlx::query(&self.sql(UPSERT))
            .bind(key.minute)
            .bind(key.source.clone())
            .bind(key.actor.clone())
            .bind(key.action.clone())
            .bind(key.outcome.clone())
            .bind(c.requests)
            .bind(c.records)
            .bind(c.rejected)
            .bind(c.duplicates)
            .bind(c.new_gpus)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Add a batch of events (the web layer's refusals, token administration) in one
    /// transaction.
    pub async fn audit(&self, events: &[(AuditKey, AuditCounts)]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let _writer = self.write_lock.lock().await;
        let mut tx = self.writer_tx().await?;
        for (key, counts) in events {
            self.audit_in(&mut tx, key, *counts).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The log from `from` (inclusive) to `to` (exclusive), newest first, for one source or
    /// all, at most `limit` rows.
    pub async fn audit_log(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        source: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AuditRow>> {
        type Row = (i64, String, String, String, String, i64, i64, i64, i64, i64);
        let rows: Vec<Row> = sqlx::query_as(&self.sql(
            "SELECT minute, source, actor, action, outcome, requests, records, rejected, \
             duplicates, new_gpus FROM audit_log WHERE minute >= $1 AND minute < $2 \
             AND ($3 = '' OR source = $4) \
             ORDER BY minute DESC, source, actor, action, outcome LIMIT $5",
        ))
        .bind(from.timestamp())
        .bind(to.timestamp())
        .bind(if source.is_some() { "1" } else { "" })
        .bind(source.unwrap_or_default().to_string())
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| AuditRow {
                minute: DateTime::from_timestamp(r.0, 0).unwrap_or_default(),
                source: r.1,
                actor: r.2,
                action: r.3,
                outcome: r.4,
                requests: r.5,
                records: r.6,
                rejected: r.7,
                duplicates: r.8,
                new_gpus: r.9,
            })
            .collect())
    }

    /// GPUs `source` added from `since` (seconds) on, as the log counts them.
    pub(crate) async fn new_gpus_since(
        &self,
        tx: &mut Transaction<'_, Any>,
        source: &str,
        since: i64,
    ) -> Result<i64> {
        let n: Option<i64> = sqlx::query_scalar(&self.sql(
            "SELECT CAST(SUM(new_gpus) AS BIGINT) FROM audit_log \
             WHERE source = $1 AND minute >= $2",
        ))
        .bind(source.to_string())
        .bind(since)
        .fetch_one(&mut **tx)
        .await?;
        Ok(n.unwrap_or(0))
    }

    /// Requests refused per source since `since` (seconds): what the sources page shows.
    pub async fn refusals_since(&self, since: i64) -> Result<Vec<(String, i64)>> {
        Ok(sqlx::query_as(&self.sql(
            "SELECT source, CAST(SUM(requests) AS BIGINT) FROM audit_log \
             WHERE action = 'refused' AND minute >= $1 GROUP BY source",
        ))
        .bind(since)
        .fetch_all(self.pool())
        .await?)
    }
}
