//! Per-source push limits and the audit of refused pushes.
//!
//! Rate: each source (the tokens of one source share it) has a bucket of records that fills at
//! `records_per_sec` up to `burst`. A push is let in while the bucket is above zero and then
//! takes out every record it carried, so the bucket may go below zero; until it has filled
//! back above zero the source's pushes are answered 429 with `Retry-After`, before a byte of
//! their body is read. So one large body always goes through, and a source that sends faster
//! than its rate waits in proportion to what it sent. Each replica keeps its own buckets.
//!
//! Refusals that never reach the database are added up per minute in memory and written to the
//! audit log in one transaction every few seconds (and whenever the log is read), so a flood of
//! refused requests does not become a flood of writes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpuledger_store::{AuditCounts, AuditKey, Store};

/// `[ingest] records_per_sec` and `records_burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Records (GPUs, samples and allocations) per second a source may push, sustained.
    pub records_per_sec: f64,
    /// Records it may push at once after being quiet.
    pub burst: f64,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            records_per_sec: 10_000.0,
            burst: 600_000.0,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    level: f64,
    at: Instant,
}

/// The buckets of every source that pushed, and the refusals not yet in the audit log.
#[derive(Default)]
pub struct Limiter {
    buckets: Mutex<HashMap<String, Bucket>>,
    refusals: Mutex<HashMap<AuditKey, AuditCounts>>,
}

impl Limiter {
    fn refill(limit: &RateLimit, b: &mut Bucket, now: Instant) {
        let dt = now.saturating_duration_since(b.at).as_secs_f64();
        b.level = (b.level + dt * limit.records_per_sec).min(limit.burst);
        b.at = now;
    }

    /// `Ok` when `source` may push now, else how long it should wait.
    pub fn check(&self, limit: &RateLimit, source: &str, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let b = buckets.entry(source.to_string()).or_insert(Bucket {
            level: limit.burst,
            at: now,
        });
        Limiter::refill(limit, b, now);
        if b.level > 0.0 {
            return Ok(());
        }
        let secs = (-b.level / limit.records_per_sec).max(0.001);
        Err(Duration::from_secs_f64(secs.min(86_400.0)))
    }

    /// Take the records of a push `source` made out of its bucket.
    pub fn charge(&self, limit: &RateLimit, source: &str, records: u64, now: Instant) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let b = buckets.entry(source.to_string()).or_insert(Bucket {
            level: limit.burst,
            at: now,
        });
        Limiter::refill(limit, b, now);
        b.level -= records as f64;
    }

    /// Note a push refused before it reached the database.
    pub fn refused(&self, at: i64, source: &str, actor: &str, outcome: &str) {
        let key = AuditKey::new(at, source, actor, "refused", outcome);
        let mut pending = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        pending.entry(key).or_default().requests += 1;
    }

    /// Write the refusals noted so far to the audit log; on failure they are kept for the next
    /// try.
    pub async fn flush(&self, store: &Store) -> gpuledger_store::Result<()> {
        let events: Vec<(AuditKey, AuditCounts)> = {
            let mut pending = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
            pending.drain().collect()
        };
        if let Err(e) = store.audit(&events).await {
            let mut pending = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
            for (k, c) in events {
                pending.entry(k).or_default().requests += c.requests;
            }
            return Err(e);
        }
        Ok(())
    }
}

/// How often the refusals noted in memory are written to the audit log.
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_over_its_rate_waits_in_proportion_and_others_do_not() {
        let limit = RateLimit {
            records_per_sec: 100.0,
            burst: 1_000.0,
        };
        let l = Limiter::default();
        let t0 = Instant::now();
        assert!(l.check(&limit, "noisy", t0).is_ok());
        // One large body goes through, and leaves the bucket 1,500 records short.
        l.charge(&limit, "noisy", 2_500, t0);
        let wait = l.check(&limit, "noisy", t0).unwrap_err();
        assert!((wait.as_secs_f64() - 15.0).abs() < 0.01, "{wait:?}");
        // Ten seconds later it is still 500 short: 5 s more.
        let wait = l
            .check(&limit, "noisy", t0 + Duration::from_secs(10))
            .unwrap_err();
        assert!((wait.as_secs_f64() - 5.0).abs() < 0.01, "{wait:?}");
        assert!(l
            .check(&limit, "noisy", t0 + Duration::from_secs(16))
            .is_ok());
        // Another source is not affected.
        assert!(l.check(&limit, "quiet", t0).is_ok());
    }

    #[test]
    fn refusals_add_up_per_minute_and_outcome() {
        let l = Limiter::default();
        for _ in 0..1000 {
            l.refused(120, "nlp", "push", "429 rate limit");
        }
        l.refused(179, "nlp", "push", "429 rate limit");
        l.refused(180, "nlp", "push", "429 rate limit");
        let pending = l.refusals.lock().unwrap();
        assert_eq!(pending.len(), 2);
        assert_eq!(
            pending[&AuditKey::new(120, "nlp", "push", "refused", "429 rate limit")].requests,
            1001
        );
    }
}
