//! What the notifier told whom: one state row per open finding and audience (so a finding is
//! sent once until it changes or clears, then resolved once), and the delivery log.

use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;
use sqlx::Row;

use crate::{Result, Store};

/// A finding as last announced to one audience.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyState {
    /// The finding's stable key (`idle_gpu:GPU-…`, `stale_source:rdu-k8s`).
    pub key: String,
    /// Who hears of it (`team:nlp`, `address:ops@example.com`, `central`).
    pub audience: String,
    /// The rule that found it.
    pub rule: String,
    /// What of the finding, when it changes, makes it worth a new message.
    pub fingerprint: String,
    /// The message's subject when it was last sent.
    pub subject: String,
    pub opened_at: i64,
    /// When the last message about it went out; `None`: never yet (every delivery failed, or
    /// the audience's rate limit held it back).
    pub sent_at: Option<i64>,
    /// When it cleared; set once its "resolved" message went out.
    pub resolved_at: Option<i64>,
}

/// One delivery attempted: what, to whom, when and how it went.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delivery {
    pub at: DateTime<Utc>,
    pub key: String,
    /// `new`, `changed`, `resolved` or `digest`.
    pub event: String,
    pub audience: String,
    /// The channel's name in the config.
    pub channel: String,
    /// The address or webhook host it went to.
    pub recipient: String,
    pub subject: String,
    /// `sent`, `failed` (every attempt failed; retried next round) or `rate_limited`.
    pub outcome: String,
    pub attempts: i64,
    pub error: Option<String>,
}

fn ts(s: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(s, 0).single().unwrap_or_default()
}

impl Store {
    /// Every state row (open findings, and cleared ones already resolved).
    pub async fn notify_states(&self) -> Result<Vec<NotifyState>> {
        let rows = sqlx::query(
            "SELECT key, audience, rule, fingerprint, subject, opened_at, sent_at, resolved_at \
             FROM notify_state ORDER BY key, audience",
        )
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(NotifyState {
                    key: r.try_get("key")?,
                    audience: r.try_get("audience")?,
                    rule: r.try_get("rule")?,
                    fingerprint: r.try_get("fingerprint")?,
                    subject: r.try_get("subject")?,
                    opened_at: r.try_get("opened_at")?,
                    sent_at: r.try_get("sent_at")?,
                    resolved_at: r.try_get("resolved_at")?,
                })
            })
            .collect()
    }

    /// Write a state row (insert or replace).
    pub async fn put_notify_state(&self, s: &NotifyState) -> Result<()> {
        let _writer = self.write_lock.lock().await;
        sqlx::query(&self.sql(
            "INSERT INTO notify_state (key, audience, rule, fingerprint, subject, opened_at, \
             sent_at, resolved_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (key, audience) DO UPDATE SET rule = excluded.rule, \
             fingerprint = excluded.fingerprint, subject = excluded.subject, \
             opened_at = excluded.opened_at, sent_at = excluded.sent_at, \
             resolved_at = excluded.resolved_at",
        ))
        .bind(s.key.clone())
        .bind(s.audience.clone())
        .bind(s.rule.clone())
        .bind(s.fingerprint.clone())
        .bind(s.subject.clone())
        .bind(s.opened_at)
        .bind(s.sent_at)
        .bind(s.resolved_at)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Forget a state row (a cleared finding nobody was told of, or one resolved long ago).
    pub async fn drop_notify_state(&self, key: &str, audience: &str) -> Result<()> {
        let _writer = self.write_lock.lock().await;
        sqlx::query(&self.sql("DELETE FROM notify_state WHERE key = $1 AND audience = $2"))
            .bind(key.to_string())
            .bind(audience.to_string())
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Record a delivery attempt.
    pub async fn log_delivery(&self, d: &Delivery) -> Result<()> {
        let _writer = self.write_lock.lock().await;
        sqlx::query(&self.sql(
            "INSERT INTO notify_log (at, key, event, audience, channel, recipient, subject, \
             outcome, attempts, error) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        ))
        .bind(d.at.timestamp())
        .bind(d.key.clone())
        .bind(d.event.clone())
        .bind(d.audience.clone())
        .bind(d.channel.clone())
        .bind(d.recipient.clone())
        .bind(d.subject.clone())
        .bind(d.outcome.clone())
        .bind(d.attempts)
        .bind(d.error.clone())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The latest deliveries, newest first.
    pub async fn deliveries(&self, limit: i64) -> Result<Vec<Delivery>> {
        let rows = sqlx::query(&self.sql(
            "SELECT at, key, event, audience, channel, recipient, subject, outcome, attempts, \
             error FROM notify_log ORDER BY at DESC, id DESC LIMIT $1",
        ))
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Delivery {
                    at: ts(r.try_get("at")?),
                    key: r.try_get("key")?,
                    event: r.try_get("event")?,
                    audience: r.try_get("audience")?,
                    channel: r.try_get("channel")?,
                    recipient: r.try_get("recipient")?,
                    subject: r.try_get("subject")?,
                    outcome: r.try_get("outcome")?,
                    attempts: r.try_get("attempts")?,
                    error: r.try_get("error")?,
                })
            })
            .collect()
    }

    /// Messages sent to `recipient` at or after `since` (the rate limit's count).
    pub async fn sent_since(&self, recipient: &str, since: i64) -> Result<i64> {
        Ok(sqlx::query_scalar(&self.sql(
            "SELECT COUNT(*) FROM notify_log WHERE recipient = $1 AND at >= $2 \
             AND outcome = 'sent'",
        ))
        .bind(recipient.to_string())
        .bind(since)
        .fetch_one(self.pool())
        .await?)
    }
}
