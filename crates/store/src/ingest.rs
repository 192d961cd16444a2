//! Storing validated pushes: the ingest transaction. Scope checks, then the GPU records (merged
//! by `ledger::merge`, placed by `identity`, owned by `owners`), samples and allocations, then
//! the touched hours re-rolled (`rollup`).
//!
//! One body is one transaction. Records the token may not write are rejected with the reason
//! and flagged `forbidden`; the rest are stored. Samples are keyed by (GPU, ts) and allocations
//! by (GPU, workload, start), so a re-sent body stores nothing twice.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use gpuledger_ledger::identity::may_absorb_placeholder;
use gpuledger_ledger::merge::attributes;
use gpuledger_ledger::{merge_gpu, GpuRecord, Rejection, Validated};
use gpuledger_model::{hour_floor, PushAllocation, PushGpu, DAY_SECS, HOUR_SECS};
use serde::Serialize;
use sqlx::{Any, Transaction};

use crate::audit::{AuditCounts, AuditKey};
use crate::float::F64;
use crate::owners::owner_changed;
use crate::rollup::{mark_presence, values, widen, Touched, PRESENCE_CHUNK};
use crate::{Result, Store};

/// Who is writing: a token's source and, when scoped, its teams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub source: String,
    /// `None`: any team. `Some(list)`: only GPUs owned by these teams.
    pub teams: Option<Vec<String>>,
    /// The source's kind as shown on the sources page (`push`, `agent`, `demo`, ...).
    pub kind: String,
}

impl Principal {
    pub(crate) fn may_write(&self, team: &str) -> bool {
        self.teams
            .as_ref()
            .is_none_or(|t| t.iter().any(|x| x == team))
    }

    /// Whether a team's token writes (a push or the agent), whose writes the server's limits
    /// bound; collectors the administrator configured, and the demo, are not bounded.
    pub(crate) fn is_token(&self) -> bool {
        matches!(self.kind.as_str(), "push" | "agent")
    }

    pub(crate) fn teams_text(&self) -> String {
        self.teams
            .as_ref()
            .map(|t| t.join(", "))
            .unwrap_or_default()
    }
}

/// Per-list counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub gpus: u64,
    pub samples: u64,
    pub allocations: u64,
}

/// What happened to one body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IngestOutcome {
    /// Valid records kept (including ones already stored by an earlier identical push).
    pub accepted: Counts,
    /// Of the accepted, how many were already stored and changed nothing.
    pub duplicates: Counts,
    pub rejected: Vec<Rejection>,
}

impl IngestOutcome {
    /// True when nothing was allowed: no record accepted and at least one refused for scope.
    pub fn nothing_allowed(&self) -> bool {
        let a = self.accepted;
        a.gpus + a.samples + a.allocations == 0 && self.rejected.iter().any(|r| r.forbidden)
    }
}

/// What [`Store::note_new_samples`] vacuums and analyzes: the tables a push writes and its
/// re-rolls read.
const VACUUM_PUSHED: &str = "VACUUM (ANALYZE) gpu_hours, samples, allocations, gpu_days, \
     gpu_day_use, gpu_day_idle, gpu_owners";

/// Run the upkeep statement `sql` (a vacuum or an analysis pushes call for) in the
/// background, logging how long it took (`what` it does, and the `count` of rewritten rows or
/// new samples behind it), then `done`, whether it failed or not; the next pushes retry.
fn upkeep_in_background(
    pool: sqlx::AnyPool,
    sql: &'static str,
    what: &'static str,
    count: u64,
    done: impl FnOnce() + Send + 'static,
) {
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        match sqlx::query(sql).execute(&pool).await {
            Ok(_) => tracing::debug!(
                count,
                secs = started.elapsed().as_secs_f64(),
                "{what}: done"
            ),
            Err(e) => tracing::warn!(error = %e, "{what} failed; the next pushes retry"),
        }
        done();
    });
}

/// GPU rows rewritten by pushes after which `gpus` is vacuumed and analyzed on PostgreSQL
/// (about five minutes of a 10,000-GPU fleet pushing every minute).
pub(crate) const VACUUM_GPUS_AFTER: u64 = 50_000;

/// Samples pushes stored after which, on PostgreSQL, the tables pushes grow are vacuumed and
/// analyzed in the background (at the least: see `Store::note_new_samples`).
pub(crate) const ANALYZE_AFTER_SAMPLES: u64 = 100_000;

/// How far back from the current hour a push's new samples are added onto their hour rows
/// (`rollup::HourSum`) instead of their hours being rolled again from all their samples. Near
/// now is where samples keep arriving, a minute at a time from every agent: rolling the current
/// hour again read every sample it already held, each minute. History arrives in bulk, most of
/// an hour's samples at once, and rolling its hours from the samples just stored costs less
/// than carrying their sums: three days of hourly samples of 2,250 GPUs rolled in 0.4 s of
/// SQL, and took 1.1 s when added.
pub(crate) const ADD_WITHIN_SECS: i64 = DAY_SECS;

/// What one ingest builds up as it goes through a body's lists.
struct Batch {
    out: IngestOutcome,
    /// The body's GPUs as stored: (id, record) by UUID.
    known: HashMap<String, (i64, GpuRecord)>,
    /// The GPUs the body only samples, as stored: (id, team) by UUID.
    owners: HashMap<String, (i64, String)>,
    touched: BTreeMap<i64, Touched>,
    stale: i64,
    /// The end of the last hour an observation now can mark present.
    horizon: i64,
    now_secs: i64,
    /// GPUs this body added.
    new_gpus: i64,
    /// How many more GPUs the writer may add (`Settings::new_gpus_per_day`); `None`: any.
    new_gpu_budget: Option<i64>,
}

/// Samples per INSERT statement (7 parameters each). Sources sampling every second push 60
/// samples per GPU a minute: at 128 a statement SQLite took 157,000 to 167,000 of them a
/// second, at 512 197,000 to 203,000 (PostgreSQL 3 to 7 % more); pushes of one sample per GPU
/// and history loads did not move. A chunk holding any sample stored before has its hours
/// rolled from their samples rather than added onto, so a body that repeats a few samples
/// rolls the hours of up to this many.
const SAMPLE_CHUNK: usize = 512;

/// Allocation keys per lookup statement, and allocations per INSERT.
const ALLOCATION_CHUNK: usize = 200;

/// An allocation's key: GPU id, workload, start.
type AllocationKey = (i64, String, i64);

/// A [`StoredAllocation`] led by its key, as read back.
type StoredRow = (
    i64,
    String,
    i64,
    Option<i64>,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<f64>,
    Option<f64>,
);

/// `end_ts, source, kind, user_name, team, owner, context, avg_util_pct, avg_mem_mib` of a
/// stored allocation.
type StoredAllocation = (
    Option<i64>,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<f64>,
    Option<f64>,
);

fn unknown_gpu(path: String, uuid: &str) -> Rejection {
    Rejection::new(
        path,
        format!(
            "no GPU {uuid} has been reported; send it in `gpus` first (in this body or an earlier one)"
        ),
    )
}

impl Store {
    /// Store a validated body for `who`. `now` is the server's clock.
    pub async fn ingest(
        &self,
        who: &Principal,
        mut body: Validated,
        now: DateTime<Utc>,
    ) -> Result<IngestOutcome> {
        let _writer = self.write_lock.lock().await;
        let now_secs = now.timestamp();
        let mut tx = self.writer_tx().await?;
        let stale = self.settings.stale_window_secs;
        let horizon = hour_floor(now_secs + stale) + HOUR_SECS;
        let mut touched: BTreeMap<i64, Touched> = BTreeMap::new();
        self.resolve_pool_allocations(&mut tx, who, &mut body.allocations, horizon, &mut touched)
            .await?;

        let mut uuids: BTreeSet<&str> = BTreeSet::new();
        uuids.extend(body.gpus.iter().map(|(_, g)| g.uuid.as_str()));
        uuids.extend(body.allocations.iter().map(|(_, a)| a.gpu_uuid.as_str()));
        // GPUs only sampled need their id and owner alone: a body of current samples (what
        // agents and collectors send every minute) reads no more of them.
        let sampled: BTreeSet<&str> = body
            .samples
            .iter()
            .map(|(_, s)| s.gpu_uuid.as_str())
            .filter(|u| !uuids.contains(u))
            .collect();
        let known = self.load_gpus(&mut tx, uuids.into_iter().collect()).await?;
        let owners = self
            .gpu_owners_of(&mut tx, sampled.into_iter().collect())
            .await?;
        // A GPU that names its cloud instance lands on the host that instance was first
        // reported under; its own host name becomes an alias of that host.
        let instances: BTreeSet<(String, String)> = body
            .gpus
            .iter()
            .filter(|(_, g)| g.mig_parent_uuid.is_none())
            .filter_map(|(_, g)| Some((g.host.clone()?, g.labels.get("instance_id")?.clone())))
            .collect();
        for (host, instance) in instances {
            let labels = BTreeMap::from([("instance_id".to_string(), instance)]);
            self.instance_host(&mut tx, who, &host, &labels, now, &mut touched)
                .await?;
        }
        let hosts: BTreeSet<String> = body
            .gpus
            .iter()
            .filter_map(|(_, g)| g.host.clone())
            .collect();
        let aliases = self.host_aliases(&mut tx, hosts).await?;
        let new_gpu_budget = match self.settings.new_gpus_per_day {
            Some(limit) if who.is_token() => {
                let added = self
                    .new_gpus_since(&mut tx, &who.source, now_secs - DAY_SECS)
                    .await?;
                Some((limit as i64 - added).max(0))
            }
            _ => None,
        };

        let mut b = Batch {
            out: IngestOutcome {
                rejected: std::mem::take(&mut body.rejections),
                ..Default::default()
            },
            known,
            owners,
            touched,
            stale,
            horizon,
            now_secs,
            new_gpus: 0,
            new_gpu_budget,
        };
        self.ingest_gpus(&mut tx, who, &mut b, &body.gpus, &aliases)
            .await?;
        self.ingest_samples(&mut tx, who, &mut b, &body.samples)
            .await?;
        self.ingest_allocations(&mut tx, who, &mut b, &body.allocations)
            .await?;
        let Batch {
            mut out,
            touched,
            new_gpus,
            ..
        } = b;
        // Rows of `gpus` this push rewrites: its GPU records, the last sighting of each GPU
        // it sampled, and owners that follow holders (counted by the GPUs they may move).
        let rewrites = out.accepted.gpus
            + touched.values().filter(|t| !t.sampled.is_empty()).count() as u64
            + touched
                .values()
                .filter(|t| t.flags.is_some() || t.holders)
                .count() as u64;

        // Owners that follow the workloads holding a GPU, then roll up what changed.
        let held: Vec<i64> = touched
            .iter()
            .filter(|(_, t)| t.flags.is_some() || t.holders)
            .map(|(id, _)| *id)
            .collect();
        for reason in self.refresh_holders(&mut tx, who, &held, now_secs).await? {
            out.rejected
                .push(Rejection::forbidden("allocations", reason));
        }
        self.reroll(&mut tx, &touched).await?;
        self.record_attempt(&mut tx, who, &out, now_secs).await?;
        self.audit_push(&mut tx, who, &out, new_gpus, now_secs)
            .await?;
        tx.commit().await?;
        self.note_gpu_rewrites(rewrites);
        self.note_new_samples(out.accepted.samples.saturating_sub(out.duplicates.samples));
        Ok(out)
    }

    /// Vacuum and analyze the tables pushes grow after `samples` new samples instead of
    /// [`ANALYZE_AFTER_SAMPLES`] (tests).
    #[doc(hidden)]
    pub fn set_analyze_after(&self, samples: u64) {
        self.upkeep
            .analyze_after
            .store(samples, std::sync::atomic::Ordering::Relaxed);
    }

    /// Count the samples a push stored and, on PostgreSQL, vacuum and analyze the tables
    /// pushes grow in the background once they reach [`ANALYZE_AFTER_SAMPLES`] or a tenth of
    /// all this server stored before (autovacuum's rule: a tenth of the table). Until a table
    /// or a new partition is first analyzed, the planner takes it for nearly empty: in a bulk
    /// load of 100,350 GPUs with autovacuum off, each re-roll of 500 GPUs read every GPU's
    /// hours of its range by the index by hour (two million rows, 1.3 s a statement) instead of
    /// its own by their key. Each push rewrites its GPUs' day rows (and their running totals),
    /// and nothing else frees the versions it leaves where autovacuum is off or behind: 30
    /// days of 100,350 GPUs left 3.7 million dead versions beside 0.9 million day rows a third
    /// of the way in, and the load slowed from 13,100 samples/s to 3,800 (10,800 right after
    /// one vacuum of the day tables, 6 s). The vacuum also marks the new pages all-visible,
    /// which the index-only reads of hour rows need. The server's hourly maintenance does both
    /// too; autovacuum, where on, may come first. One runs at a time.
    fn note_new_samples(&self, samples: u64) {
        use std::sync::atomic::Ordering;
        if self.backend != crate::Backend::Postgres || samples == 0 {
            return;
        }
        let up = &self.upkeep;
        let since = up.new_samples.fetch_add(samples, Ordering::Relaxed) + samples;
        let due = up
            .analyze_after
            .load(Ordering::Relaxed)
            .max(up.analyzed_samples.load(Ordering::Relaxed) / 10);
        if since < due || up.analyzing.swap(true, Ordering::AcqRel) {
            return;
        }
        up.new_samples.fetch_sub(since, Ordering::Relaxed);
        up.analyzed_samples.fetch_add(since, Ordering::Relaxed);
        let up = self.upkeep.clone();
        upkeep_in_background(
            self.pool.clone(),
            VACUUM_PUSHED,
            "vacuuming and analyzing the tables pushes grow",
            since,
            move || up.analyzing.store(false, Ordering::Release),
        );
    }

    /// Vacuum `gpus` after `rewrites` rewrites of its rows instead of [`VACUUM_GPUS_AFTER`]
    /// (tests).
    #[doc(hidden)]
    pub fn set_vacuum_gpus_after(&self, rewrites: u64) {
        self.vacuum_gpus_after
            .store(rewrites, std::sync::atomic::Ordering::Relaxed);
    }

    /// Count GPU rows a push rewrote and, on PostgreSQL, vacuum and analyze `gpus` in the
    /// background once they reach [`VACUUM_GPUS_AFTER`]. Each push rewrites the row of every
    /// GPU it names (its last sighting), so a fleet pushing every minute leaves dead row
    /// versions by the hundred thousand an hour, and every page and re-roll reads past them: at
    /// 10,350 GPUs a bulk load with autovacuum off grew the table to 468 MB, and its scans with
    /// it. A fleet registering leaves the planner's statistics at the empty table: at 100,350
    /// GPUs the look for a host's placeholder, made for every new GPU, read every GPU's entry
    /// of the index by MIG parent (the planner took `IS NULL` for rare) instead of the host's
    /// few, 6 ms a GPU at 67,000. The server's hourly maintenance does both too; autovacuum,
    /// where on, may come first.
    fn note_gpu_rewrites(&self, rewrites: u64) {
        use std::sync::atomic::Ordering;
        if self.backend != crate::Backend::Postgres {
            return;
        }
        let total = self.gpu_rewrites.fetch_add(rewrites, Ordering::Relaxed) + rewrites;
        if total < self.vacuum_gpus_after.load(Ordering::Relaxed) {
            return;
        }
        self.gpu_rewrites.store(0, Ordering::Relaxed);
        upkeep_in_background(
            self.pool.clone(),
            "VACUUM (ANALYZE) gpus",
            "vacuuming and analyzing gpus",
            total,
            || {},
        );
    }

    /// The body's GPU records: scope checks, merge, placement (a new GPU may take over a
    /// placeholder), attributes by source, presence.
    async fn ingest_gpus(
        &self,
        tx: &mut Transaction<'_, Any>,
        who: &Principal,
        b: &mut Batch,
        gpus: &[(usize, PushGpu)],
        aliases: &HashMap<String, String>,
    ) -> Result<()> {
        // Inventory.
        for (i, g) in gpus {
            let aliased;
            let g = match g.host.as_ref().and_then(|h| aliases.get(h)) {
                Some(host) => {
                    aliased = PushGpu {
                        host: Some(host.clone()),
                        ..g.clone()
                    };
                    &aliased
                }
                None => g,
            };
            let existing = b.known.get(&g.uuid).map(|(_, r)| r);
            if let Some(old) = existing {
                if !who.may_write(&old.team) {
                    b.out.rejected.push(Rejection::forbidden(
                        format!("gpus[{i}]"),
                        format!(
                            "GPU {} is owned by team `{}`; this token may write only teams: {}",
                            g.uuid,
                            old.team,
                            who.teams_text()
                        ),
                    ));
                    continue;
                }
            }
            let merged = merge_gpu(existing, g, &who.source, &self.settings);
            // A MIG instance's allocations hold its parent GPU, so a token writes an instance
            // only under a GPU it may write.
            if let Some(parent) = &merged.mig_parent_uuid {
                let team = match b.known.get(parent) {
                    Some((_, p)) => Some(p.team.clone()),
                    None => self.gpu_team(tx, parent).await?,
                };
                if let Some(team) = team.filter(|t| !who.may_write(t)) {
                    b.out.rejected.push(Rejection::forbidden(
                        format!("gpus[{i}].mig_parent_uuid"),
                        format!(
                            "MIG instance {}: its parent GPU {parent} is owned by team `{team}`; \
                             this token may write only teams: {}",
                            g.uuid,
                            who.teams_text()
                        ),
                    ));
                    continue;
                }
            }
            if !who.may_write(&merged.team) {
                b.out.rejected.push(Rejection::forbidden(
                    format!("gpus[{i}].labels.team"),
                    format!(
                        "would place GPU {} in team `{}`; this token may write only teams: {} \
                     (set labels.team to one of them)",
                        g.uuid,
                        merged.team,
                        who.teams_text()
                    ),
                ));
                continue;
            }
            let is_new = existing.is_none();
            if is_new && b.new_gpu_budget.is_some_and(|left| b.new_gpus >= left) {
                b.out.rejected.push(Rejection::new(
                    format!("gpus[{i}]"),
                    format!(
                        "GPU {} is new, and source `{}` has added the most GPUs it may in 24 \
                         hours ({}, `[ingest] new_gpus_per_day`); it is refused until the \
                         count of the last 24 hours is under that, or the limit is raised",
                        g.uuid,
                        who.source,
                        self.settings.new_gpus_per_day.unwrap_or_default()
                    ),
                ));
                continue;
            }
            let unchanged = existing == Some(&merged);
            let owner_at = owner_changed(existing, &merged).then(|| g.observed_at.timestamp());
            let id = self.upsert_gpu(tx, &merged, owner_at).await?;
            self.record_attributes(tx, id, &who.source, g).await?;
            if let (true, Some(host)) = (is_new, &merged.host) {
                if may_absorb_placeholder(&merged) {
                    self.absorb_placeholder(tx, id, host, &mut b.touched)
                        .await?;
                } else if merged.mig_parent_uuid.is_some() && !merged.placeholder {
                    self.drop_mig_placeholders(tx, host).await?;
                }
            }
            let t = b.touched.entry(id).or_default();
            mark_presence(t, g.observed_at.timestamp(), b.stale);
            b.out.accepted.gpus += 1;
            b.new_gpus += is_new as i64;
            if unchanged {
                b.out.duplicates.gpus += 1;
            }
            b.known.insert(g.uuid.clone(), (id, merged));
        }

        Ok(())
    }

    /// The owner of the stored GPU `uuid`, if there is one.
    async fn gpu_team(&self, tx: &mut Transaction<'_, Any>, uuid: &str) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar(&self.sql("SELECT team FROM gpus WHERE uuid = $1"))
                .bind(uuid.to_string())
                .fetch_optional(&mut **tx)
                .await?,
        )
    }

    /// The body's samples: scope and retention checks, idempotent inserts, presence and the
    /// hours to re-roll.
    async fn ingest_samples(
        &self,
        tx: &mut Transaction<'_, Any>,
        who: &Principal,
        b: &mut Batch,
        samples: &[(usize, gpuledger_model::PushSample)],
    ) -> Result<()> {
        // Samples.
        let cutoff = self.raw_cutoff(b.now_secs);
        let mut rows: Vec<(i64, &gpuledger_model::PushSample)> = Vec::new();
        for (i, s) in samples {
            let gpu = match b.known.get(&s.gpu_uuid) {
                Some((id, rec)) => Some((id, &rec.team)),
                None => b.owners.get(&s.gpu_uuid).map(|(id, team)| (id, team)),
            };
            let Some((id, team)) = gpu else {
                b.out
                    .rejected
                    .push(unknown_gpu(format!("samples[{i}].gpu_uuid"), &s.gpu_uuid));
                continue;
            };
            if !who.may_write(team) {
                b.out.rejected.push(Rejection::forbidden(
                    format!("samples[{i}]"),
                    format!(
                        "GPU {} is owned by team `{}`; this token may write only teams: {}",
                        s.gpu_uuid,
                        team,
                        who.teams_text()
                    ),
                ));
                continue;
            }
            let ts = s.ts.timestamp();
            if ts < cutoff {
                b.out.rejected.push(Rejection::new(
                    format!("samples[{i}].ts"),
                    format!(
                        "is older than the raw-sample retention ({} days); such history can no \
                     longer be rolled up",
                        self.settings.raw_retention_days
                    ),
                ));
                continue;
            }
            rows.push((*id, s));
        }
        let source_id = self.source_id(tx, who).await?;
        let recent = hour_floor(b.now_secs) - ADD_WITHIN_SECS;
        for chunk in rows.chunks(SAMPLE_CHUNK) {
            let sql = format!(
            "INSERT INTO samples (gpu_id, ts, util_pct, mem_used_mib, power_w, sm_active, source_id) \
             VALUES {} ON CONFLICT (gpu_id, ts) DO NOTHING",
            values(chunk.len(), 7)
        );
            let sql = self.sql(&sql);
            // Full chunks share one cached prepared statement.
            let mut q = sqlx::query(&sql).persistent(chunk.len() == SAMPLE_CHUNK);
            for (id, s) in chunk {
                q = q
                    .bind(*id)
                    .bind(s.ts.timestamp())
                    .bind(F64(s.util_pct))
                    .bind(F64(s.mem_used_mib))
                    .bind(F64(s.power_w))
                    .bind(F64(s.sm_active))
                    .bind(source_id);
            }
            let inserted = q.execute(&mut **tx).await?.rows_affected();
            b.out.accepted.samples += chunk.len() as u64;
            b.out.duplicates.samples += chunk.len() as u64 - inserted;
            // Samples of the last day ([`ADD_WITHIN_SECS`]), all new: added onto their hours.
            // The others' hours are rolled again from all their samples; so are these where
            // some were stored before, since which is not known here.
            for (id, s) in chunk {
                let hour = hour_floor(s.ts.timestamp());
                let t = b.touched.entry(*id).or_default();
                if inserted == chunk.len() as u64 && hour >= recent {
                    t.added.entry(hour).or_default().add(s);
                } else {
                    widen(&mut t.activity, hour, hour + HOUR_SECS);
                }
            }
        }
        // A sample is an observation too: it keeps its GPU present.
        let mut latest: BTreeMap<i64, i64> = BTreeMap::new();
        for (id, s) in &rows {
            let e = latest.entry(*id).or_insert(i64::MIN);
            *e = (*e).max(s.ts.timestamp());
        }
        let latest: Vec<(i64, i64)> = latest.into_iter().collect();
        for chunk in latest.chunks(PRESENCE_CHUNK) {
            let sql = format!(
                "WITH v (id, ts) AS (VALUES {}) UPDATE gpus SET last_seen = v.ts FROM v \
                 WHERE gpus.id = v.id AND v.ts > gpus.last_seen",
                values(chunk.len(), 2)
            );
            let sql = self.sql(&sql);
            let mut q = sqlx::query(&sql).persistent(chunk.len() == PRESENCE_CHUNK);
            for (id, ts) in chunk {
                q = q.bind(*id).bind(*ts);
            }
            q.execute(&mut **tx).await?;
        }
        for (id, s) in &rows {
            let ts = s.ts.timestamp();
            let t = b.touched.entry(*id).or_default();
            mark_presence(t, ts, b.stale);
            t.sampled.insert(hour_floor(ts));
        }

        Ok(())
    }

    /// The body's allocations: scope checks (a team-scoped token may not move a GPU out of its
    /// teams through workload facts), one source per allocation, the hours to re-flag.
    async fn ingest_allocations(
        &self,
        tx: &mut Transaction<'_, Any>,
        who: &Principal,
        b: &mut Batch,
        allocations: &[(usize, PushAllocation)],
    ) -> Result<()> {
        // What is stored of the body's allocations, by key; writes wait in `pending` and go
        // many to a statement (a row per allocation cost three statements a row).
        let keys: BTreeSet<AllocationKey> = allocations
            .iter()
            .filter_map(|(_, a)| {
                let (id, _) = b.known.get(&a.gpu_uuid)?;
                Some((*id, a.workload.clone(), a.start.timestamp()))
            })
            .collect();
        let mut stored = self.stored_allocations(tx, keys).await?;
        let mut pending: Vec<(AllocationKey, StoredAllocation)> = Vec::new();
        let mut parents: HashMap<String, Option<i64>> = HashMap::new();
        for (i, a) in allocations {
            let Some((id, rec)) = b.known.get(&a.gpu_uuid) else {
                b.out.rejected.push(unknown_gpu(
                    format!("allocations[{i}].gpu_uuid"),
                    &a.gpu_uuid,
                ));
                continue;
            };
            if !who.may_write(&rec.team) {
                b.out.rejected.push(Rejection::forbidden(
                    format!("allocations[{i}]"),
                    format!(
                        "GPU {} is owned by team `{}`; this token may write only teams: {}",
                        a.gpu_uuid,
                        rec.team,
                        who.teams_text()
                    ),
                ));
                continue;
            }
            // A team-scoped token may not move a GPU out of its teams through the workload
            // facts ownership rules read.
            if who.teams.is_some()
                && !a.context.is_empty()
                && self.settings.ownership.reads_workloads()
            {
                // The holders it reads include this body's earlier allocations.
                self.write_allocations(tx, &mut pending).await?;
                if let Some((uuid, team)) = self.owner_with(tx, rec, a).await? {
                    if !who.may_write(&team) {
                        b.out.rejected.push(Rejection::forbidden(
                            format!("allocations[{i}].context"),
                            format!(
                                "would place GPU {uuid} in team `{team}` through the ownership \
                             rules; this token may write only teams: {}",
                                who.teams_text()
                            ),
                        ));
                        continue;
                    }
                }
            }
            let start = a.start.timestamp();
            let end = a.end.map(|e| e.timestamp());
            let context = (!a.context.is_empty())
                .then(|| serde_json::to_string(&a.context).unwrap_or_default());
            let key = (*id, a.workload.clone(), start);
            let old: Option<StoredAllocation> = stored.get(&key).cloned();
            if let Some((old_end, old_source, kind, user, team, owner, old_context, util, mem)) =
                &old
            {
                if old_source != &who.source {
                    b.out.rejected.push(Rejection::forbidden(
                        format!("allocations[{i}]"),
                        format!(
                            "this allocation was reported by source `{old_source}`; a source may \
                         not change another source's allocations"
                        ),
                    ));
                    continue;
                }
                b.out.accepted.allocations += 1;
                if *old_end == end
                    && kind == a.kind.as_str()
                    && user == &a.user
                    && team == &a.team
                    && owner == &a.owner
                    && old_context == &context
                    && util == &a.avg_util_pct
                    && mem == &a.avg_mem_used_mib
                {
                    b.out.duplicates.allocations += 1;
                    continue;
                }
            } else {
                b.out.accepted.allocations += 1;
            }
            let row: StoredAllocation = (
                end,
                who.source.clone(),
                a.kind.as_str().to_string(),
                a.user.clone(),
                a.team.clone(),
                a.owner.clone(),
                context,
                a.avg_util_pct,
                a.avg_mem_used_mib,
            );
            stored.insert(key.clone(), row.clone());
            pending.push((key, row));
            // Re-flag every hour the allocation covers now or ever covered: an open one that
            // gets its end (late, or when its pod goes with its GPU) leaves allocated hours
            // behind otherwise.
            let hi = match (end, &old) {
                (None, _) | (_, Some((None, ..))) => b.horizon,
                (Some(e), Some((Some(o), ..))) => e.max(*o),
                (Some(e), None) => e,
            };
            let range = (
                hour_floor(start),
                hi.min(b.horizon).max(hour_floor(start) + 1),
            );
            widen(
                &mut b.touched.entry(*id).or_default().flags,
                range.0,
                range.1,
            );
            // An allocation on a MIG instance makes its physical GPU's hour allocated.
            if let Some(parent) = &rec.mig_parent_uuid {
                let parent_id = match parents.get(parent) {
                    Some(p) => *p,
                    None => {
                        let p: Option<i64> =
                            sqlx::query_scalar(&self.sql("SELECT id FROM gpus WHERE uuid = $1"))
                                .bind(parent.clone())
                                .fetch_optional(&mut **tx)
                                .await?;
                        parents.insert(parent.clone(), p);
                        p
                    }
                };
                if let Some(pid) = parent_id {
                    widen(
                        &mut b.touched.entry(pid).or_default().flags,
                        range.0,
                        range.1,
                    );
                }
            }
        }
        self.write_allocations(tx, &mut pending).await
    }

    /// What is stored of the allocations `keys`.
    async fn stored_allocations(
        &self,
        tx: &mut Transaction<'_, Any>,
        keys: BTreeSet<AllocationKey>,
    ) -> Result<HashMap<AllocationKey, StoredAllocation>> {
        let keys: Vec<AllocationKey> = keys.into_iter().collect();
        let mut out = HashMap::new();
        for chunk in keys.chunks(ALLOCATION_CHUNK) {
            let sql = format!(
                "WITH k (g, w, s) AS (VALUES {}) \
                 SELECT a.gpu_id, a.workload, a.start_ts, a.end_ts, a.source, a.kind, a.user_name, \
                 a.team, a.owner, a.context, a.avg_util_pct, a.avg_mem_mib \
                 FROM k JOIN allocations a ON a.gpu_id = k.g AND a.workload = k.w \
                 AND a.start_ts = k.s",
                values(chunk.len(), 3)
            );
            let sql = self.sql(&sql);
            let mut q = sqlx::query_as::<_, StoredRow>(&sql);
            for (id, workload, start) in chunk {
                q = q.bind(*id).bind(workload.clone()).bind(*start);
            }
            for r in q.fetch_all(&mut **tx).await? {
                out.insert(
                    (r.0, r.1, r.2),
                    (r.3, r.4, r.5, r.6, r.7, r.8, r.9, r.10, r.11),
                );
            }
        }
        Ok(out)
    }

    /// Write the allocations waiting in `pending`, the last of each key (a later one in a body
    /// replaces an earlier one, as one statement each would have).
    async fn write_allocations(
        &self,
        tx: &mut Transaction<'_, Any>,
        pending: &mut Vec<(AllocationKey, StoredAllocation)>,
    ) -> Result<()> {
        let mut last: HashMap<&AllocationKey, usize> = HashMap::new();
        for (n, (key, _)) in pending.iter().enumerate() {
            last.insert(key, n);
        }
        let rows: Vec<&(AllocationKey, StoredAllocation)> = pending
            .iter()
            .enumerate()
            .filter(|(n, (key, _))| last.get(key) == Some(n))
            .map(|(_, r)| r)
            .collect();
        for chunk in rows.chunks(ALLOCATION_CHUNK) {
            let sql = format!(
                "INSERT INTO allocations (gpu_id, start_ts, end_ts, workload, kind, user_name, \
                 team, source, owner, context, avg_util_pct, avg_mem_mib) VALUES {} \
                 ON CONFLICT (gpu_id, workload, start_ts) DO UPDATE SET end_ts = excluded.end_ts, \
                 kind = excluded.kind, user_name = excluded.user_name, team = excluded.team, \
                 owner = excluded.owner, context = excluded.context, \
                 avg_util_pct = excluded.avg_util_pct, avg_mem_mib = excluded.avg_mem_mib",
                values(chunk.len(), 12)
            );
            let sql = self.sql(&sql);
            let mut q = sqlx::query(&sql).persistent(chunk.len() == ALLOCATION_CHUNK);
            for (
                (id, workload, start),
                (end, source, kind, user, team, owner, context, util, mem),
            ) in chunk.iter().copied()
            {
                q = q
                    .bind(*id)
                    .bind(*start)
                    .bind(*end)
                    .bind(workload.clone())
                    .bind(kind.clone())
                    .bind(user.clone())
                    .bind(team.clone())
                    .bind(source.clone())
                    .bind(owner.clone())
                    .bind(context.clone())
                    .bind(F64(*util))
                    .bind(F64(*mem));
            }
            q.execute(&mut **tx).await?;
        }
        pending.clear();
        Ok(())
    }

    /// Record where each attribute of `g` came from.
    pub(crate) async fn record_attributes(
        &self,
        tx: &mut Transaction<'_, Any>,
        id: i64,
        source: &str,
        g: &PushGpu,
    ) -> Result<()> {
        // One statement per record: its attributes are distinct (labels by key).
        let attrs: Vec<(String, String)> = attributes(g)
            .into_iter()
            .map(|(attr, value)| {
                let attr = match attr {
                    "labels" => format!("labels.{}", value.split('=').next().unwrap_or_default()),
                    other => other.to_string(),
                };
                (attr, value)
            })
            .collect();
        for chunk in attrs.chunks(ALLOCATION_CHUNK) {
            let sql = format!(
                "INSERT INTO gpu_attrs (gpu_id, attribute, source, value, observed_at) \
                 VALUES {} ON CONFLICT (gpu_id, attribute, source) DO UPDATE \
                 SET value = excluded.value, observed_at = excluded.observed_at \
                 WHERE excluded.observed_at >= gpu_attrs.observed_at",
                values(chunk.len(), 5)
            );
            let sql = self.sql(&sql);
            let mut q = sqlx::query(&sql);
            for (attr, value) in chunk {
                q = q
                    .bind(id)
                    .bind(attr.clone())
                    .bind(source.to_string())
                    .bind(value.clone())
                    .bind(g.observed_at.timestamp());
            }
            q.execute(&mut **tx).await?;
        }
        Ok(())
    }

    pub(crate) async fn source_id(
        &self,
        tx: &mut Transaction<'_, Any>,
        who: &Principal,
    ) -> Result<i64> {
        let id: i64 = sqlx::query_scalar(&self.sql(
            "INSERT INTO sources (name, kind) VALUES ($1, $2) \
             ON CONFLICT (name) DO UPDATE SET kind = excluded.kind RETURNING id",
        ))
        .bind(who.source.clone())
        .bind(who.kind.clone())
        .fetch_one(&mut **tx)
        .await?;
        Ok(id)
    }

    pub(crate) async fn record_attempt(
        &self,
        tx: &mut Transaction<'_, Any>,
        who: &Principal,
        out: &IngestOutcome,
        now: i64,
    ) -> Result<()> {
        let a = out.accepted;
        let ok = a.gpus + a.samples + a.allocations > 0 || out.rejected.is_empty();
        let error = out
            .rejected
            .first()
            .map(|r| format!("{} record(s) rejected; first: {r}", out.rejected.len()));
        sqlx::query(&self.sql(
            "UPDATE sources SET last_attempt = $2, \
             last_success = CASE WHEN $3 = 1 THEN $2 ELSE last_success END, \
             last_error = CASE WHEN $4 = 1 THEN $5 ELSE last_error END, \
             last_error_at = CASE WHEN $4 = 1 THEN $2 ELSE last_error_at END \
             WHERE name = $1",
        ))
        .bind(who.source.clone())
        .bind(now)
        .bind(ok as i64)
        .bind(error.is_some() as i64)
        .bind(error)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Count the push in the audit log, in its transaction.
    async fn audit_push(
        &self,
        tx: &mut Transaction<'_, Any>,
        who: &Principal,
        out: &IngestOutcome,
        new_gpus: i64,
        now: i64,
    ) -> Result<()> {
        let (a, d) = (out.accepted, out.duplicates);
        let records = (a.gpus + a.samples + a.allocations) as i64;
        let outcome = match (records, out.rejected.len()) {
            (_, 0) => "ok",
            (0, _) => "rejected",
            _ => "partial",
        };
        let key = AuditKey::new(now, &who.source, &who.kind, "push", outcome);
        let counts = AuditCounts {
            requests: 1,
            records,
            rejected: out.rejected.len() as i64,
            duplicates: (d.gpus + d.samples + d.allocations) as i64,
            new_gpus,
        };
        self.audit_in(tx, &key, counts).await
    }

    /// Record a pull collector's failed run: the source turns `error` until its next success.
    pub async fn record_source_error(
        &self,
        name: &str,
        kind: &str,
        error: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(&self.sql(
            "INSERT INTO sources (name, kind, last_attempt, last_error, last_error_at) \
             VALUES ($1, $2, $3, $4, $3) ON CONFLICT (name) DO UPDATE SET \
             last_attempt = excluded.last_attempt, last_error = excluded.last_error, \
             last_error_at = excluded.last_error_at",
        ))
        .bind(name.to_string())
        .bind(kind.to_string())
        .bind(now.timestamp())
        .bind(error.to_string())
        .execute(self.pool())
        .await?;
        Ok(())
    }
}
