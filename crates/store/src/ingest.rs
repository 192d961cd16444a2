//! Storing validated pushes: scope checks, identity merge, idempotent writes and rollups.
//!
//! One body is one transaction. Records the token may not write are rejected with the reason
//! and flagged `forbidden`; the rest are stored. Samples are keyed by (GPU, ts) and allocations
//! by (GPU, workload, start), so a re-sent body stores nothing twice.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use gpuledger_ledger::merge::attributes;
use gpuledger_ledger::ownership::{holders_at, Holder};
use gpuledger_ledger::{merge_gpu, GpuRecord, Rejection, Validated};
use gpuledger_model::{
    day_floor, hour_floor, HostGpus, PushAllocation, PushGpu, DAY_SECS, HOUR_SECS,
};
use serde::Serialize;
use sqlx::{Any, Transaction};

use crate::query::{gpu_from_row, GPU_COLUMNS};
use crate::{Result, Store, OPEN_END};

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
    fn may_write(&self, team: &str) -> bool {
        self.teams
            .as_ref()
            .is_none_or(|t| t.iter().any(|x| x == team))
    }

    fn teams_text(&self) -> String {
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

/// Recompute day rollups from hour rollups for the GPUs `IDS` in `[$1, $2)`; `$3` is the idle
/// threshold.
pub(crate) const REROLL_DAYS: &str =
    "INSERT INTO gpu_days (gpu_id, day, present_hours, known_hours, act_sum, \
     idle_hours, allocated_hours, allocated_idle_hours, mem_max, billed_hours, billed_usd) \
     SELECT gpu_id, (hour / 86400) * 86400, COUNT(*), \
     SUM(CASE WHEN act_n > 0 THEN 1 ELSE 0 END), \
     SUM(CASE WHEN act_n > 0 THEN act_sum / act_n ELSE 0 END), \
     SUM(CASE WHEN act_n > 0 AND act_sum < $3 * act_n THEN 1 ELSE 0 END), \
     SUM(allocated), \
     SUM(CASE WHEN allocated = 1 AND act_n > 0 AND act_sum < $3 * act_n THEN 1 ELSE 0 END), \
     MAX(mem_max), COUNT(billed_usd), CAST(COALESCE(SUM(billed_usd), 0) AS DOUBLE PRECISION) \
     FROM gpu_hours WHERE gpu_id IN (IDS) AND hour >= $1 AND hour < $2 \
     GROUP BY gpu_id, (hour / 86400) * 86400 \
     ON CONFLICT (day, gpu_id) DO UPDATE SET present_hours = excluded.present_hours, \
     known_hours = excluded.known_hours, act_sum = excluded.act_sum, \
     idle_hours = excluded.idle_hours, allocated_hours = excluded.allocated_hours, \
     allocated_idle_hours = excluded.allocated_idle_hours, mem_max = excluded.mem_max, \
     billed_hours = excluded.billed_hours, billed_usd = excluded.billed_usd";

/// (GPU, hour) presence rows per INSERT statement.
const PRESENCE_CHUNK: usize = 200;

/// Samples per INSERT statement.
const SAMPLE_CHUNK: usize = 32;

/// Hours touched for one GPU during an ingest, to re-roll afterwards.
#[derive(Default)]
struct Touched {
    presence: BTreeSet<i64>,
    activity: Option<(i64, i64)>,
    flags: Option<(i64, i64)>,
    /// Allocations moved onto this GPU: its holders may have changed.
    holders: bool,
}

fn widen(r: &mut Option<(i64, i64)>, lo: i64, hi: i64) {
    *r = Some(match *r {
        None => (lo, hi),
        Some((a, b)) => (a.min(lo), b.max(hi)),
    });
}

fn values(rows: usize, cols: usize) -> String {
    let mut s = String::with_capacity(rows * cols * 5);
    for r in 0..rows {
        if r > 0 {
            s.push(',');
        }
        s.push('(');
        for c in 0..cols {
            if c > 0 {
                s.push(',');
            }
            s.push('$');
            s.push_str(&(r * cols + c + 1).to_string());
        }
        s.push(')');
    }
    s
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
        let mut out = IngestOutcome {
            rejected: std::mem::take(&mut body.rejections),
            ..Default::default()
        };
        let mut tx = self.pool().begin().await?;
        let stale = self.settings.stale_window_secs;
        let horizon = hour_floor(now_secs + stale) + HOUR_SECS;
        let mut touched: BTreeMap<i64, Touched> = BTreeMap::new();
        self.resolve_pool_allocations(&mut tx, who, &mut body.allocations, horizon, &mut touched)
            .await?;

        let mut uuids: BTreeSet<&str> = BTreeSet::new();
        uuids.extend(body.gpus.iter().map(|(_, g)| g.uuid.as_str()));
        uuids.extend(body.samples.iter().map(|(_, s)| s.gpu_uuid.as_str()));
        uuids.extend(body.allocations.iter().map(|(_, a)| a.gpu_uuid.as_str()));
        let mut known = self.load_gpus(&mut tx, uuids.into_iter().collect()).await?;
        let hosts: BTreeSet<String> = body
            .gpus
            .iter()
            .filter_map(|(_, g)| g.host.clone())
            .collect();
        let aliases = self.host_aliases(&mut tx, hosts).await?;

        // Inventory.
        for (i, g) in &body.gpus {
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
            let existing = known.get(&g.uuid).map(|(_, r)| r);
            if let Some(old) = existing {
                if !who.may_write(&old.team) {
                    out.rejected.push(Rejection::forbidden(
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
            if !who.may_write(&merged.team) {
                out.rejected.push(Rejection::forbidden(
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
            let unchanged = existing == Some(&merged);
            let owner_at = owner_changed(existing, &merged).then(|| g.observed_at.timestamp());
            let id = self.upsert_gpu(&mut tx, &merged, owner_at).await?;
            self.record_attributes(&mut tx, id, &who.source, g).await?;
            if is_new {
                if let Some(host) = &merged.host {
                    self.absorb_placeholder(&mut tx, id, host, &mut touched)
                        .await?;
                }
            }
            let t = touched.entry(id).or_default();
            mark_presence(t, g.observed_at.timestamp(), stale);
            out.accepted.gpus += 1;
            if unchanged {
                out.duplicates.gpus += 1;
            }
            known.insert(g.uuid.clone(), (id, merged));
        }

        // Samples.
        let cutoff = self.raw_cutoff(now_secs);
        let mut rows: Vec<(i64, &gpuledger_model::PushSample)> = Vec::new();
        for (i, s) in &body.samples {
            let Some((id, rec)) = known.get(&s.gpu_uuid) else {
                out.rejected
                    .push(unknown_gpu(format!("samples[{i}].gpu_uuid"), &s.gpu_uuid));
                continue;
            };
            if !who.may_write(&rec.team) {
                out.rejected.push(Rejection::forbidden(
                    format!("samples[{i}]"),
                    format!(
                        "GPU {} is owned by team `{}`; this token may write only teams: {}",
                        s.gpu_uuid,
                        rec.team,
                        who.teams_text()
                    ),
                ));
                continue;
            }
            let ts = s.ts.timestamp();
            if ts < cutoff {
                out.rejected.push(Rejection::new(
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
        let source_id = self.source_id(&mut tx, who).await?;
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
                    .bind(s.util_pct)
                    .bind(s.mem_used_mib)
                    .bind(s.power_w)
                    .bind(s.sm_active)
                    .bind(source_id);
            }
            let inserted = q.execute(&mut *tx).await?.rows_affected();
            out.accepted.samples += chunk.len() as u64;
            out.duplicates.samples += chunk.len() as u64 - inserted;
        }
        // A sample is an observation too: it keeps its GPU present.
        let mut latest: BTreeMap<i64, i64> = BTreeMap::new();
        for (id, s) in &rows {
            let e = latest.entry(*id).or_insert(i64::MIN);
            *e = (*e).max(s.ts.timestamp());
        }
        for (id, ts) in latest {
            sqlx::query(&self.sql(
                "UPDATE gpus SET last_seen = CASE WHEN last_seen < $2 THEN $2 ELSE last_seen END \
                 WHERE id = $1",
            ))
            .bind(id)
            .bind(ts)
            .execute(&mut *tx)
            .await?;
        }
        for (id, s) in &rows {
            let ts = s.ts.timestamp();
            let t = touched.entry(*id).or_default();
            mark_presence(t, ts, stale);
            widen(&mut t.activity, hour_floor(ts), hour_floor(ts) + HOUR_SECS);
        }

        // Allocations.
        for (i, a) in &body.allocations {
            let Some((id, rec)) = known.get(&a.gpu_uuid) else {
                out.rejected.push(unknown_gpu(
                    format!("allocations[{i}].gpu_uuid"),
                    &a.gpu_uuid,
                ));
                continue;
            };
            if !who.may_write(&rec.team) {
                out.rejected.push(Rejection::forbidden(
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
                if let Some((uuid, team)) = self.owner_with(&mut tx, rec, a).await? {
                    if !who.may_write(&team) {
                        out.rejected.push(Rejection::forbidden(
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
            let old: Option<StoredAllocation> = sqlx::query_as(&self.sql(
                "SELECT end_ts, source, kind, user_name, team, owner, context FROM allocations \
                     WHERE gpu_id = $1 AND workload = $2 AND start_ts = $3",
            ))
            .bind(*id)
            .bind(a.workload.clone())
            .bind(start)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some((old_end, old_source, kind, user, team, owner, old_context)) = &old {
                if old_source != &who.source {
                    out.rejected.push(Rejection::forbidden(
                        format!("allocations[{i}]"),
                        format!(
                            "this allocation was reported by source `{old_source}`; a source may \
                             not change another source's allocations"
                        ),
                    ));
                    continue;
                }
                out.accepted.allocations += 1;
                if *old_end == end
                    && kind == a.kind.as_str()
                    && user == &a.user
                    && team == &a.team
                    && owner == &a.owner
                    && old_context == &context
                {
                    out.duplicates.allocations += 1;
                    continue;
                }
            } else {
                out.accepted.allocations += 1;
            }
            sqlx::query(&self.sql(
                "INSERT INTO allocations (gpu_id, start_ts, end_ts, workload, kind, user_name, team, \
                 source, owner, context) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                 ON CONFLICT (gpu_id, workload, start_ts) DO UPDATE SET end_ts = excluded.end_ts, \
                 kind = excluded.kind, user_name = excluded.user_name, team = excluded.team, \
                 owner = excluded.owner, context = excluded.context",
            ))
            .bind(*id)
            .bind(start)
            .bind(end)
            .bind(a.workload.clone())
            .bind(a.kind.as_str())
            .bind(a.user.clone())
            .bind(a.team.clone())
            .bind(who.source.clone())
            .bind(a.owner.clone())
            .bind(context)
            .execute(&mut *tx)
            .await?;
            let old_end = old.and_then(|o| o.0);
            let hi = match (end, old_end) {
                (Some(e), Some(o)) => e.max(o),
                (Some(e), None) => e,
                _ => horizon,
            };
            let t = touched.entry(*id).or_default();
            widen(
                &mut t.flags,
                hour_floor(start),
                hi.min(horizon).max(hour_floor(start) + 1),
            );
        }

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
        tx.commit().await?;
        Ok(out)
    }

    /// A count-only source says a host has `count` physical GPUs: keep that many GPUs on the
    /// host, making placeholders for those no UUID-aware source has named yet (BRIEF section 4),
    /// and let the real GPUs already named on the host take the attributes they lack (instance
    /// type, cloud, region, cluster, labels): that source only fills gaps. Returns how many
    /// placeholders the host holds now.
    pub async fn observe_host_gpu_count(
        &self,
        who: &Principal,
        host_gpus: &HostGpus,
        observed_at: DateTime<Utc>,
    ) -> Result<u32> {
        let _writer = self.write_lock.lock().await;
        let mut tx = self.pool().begin().await?;
        let host = host_gpus.host.as_str();
        let count = host_gpus.count;
        let real: Vec<String> = sqlx::query_scalar(&self.sql(
            "SELECT uuid FROM gpus WHERE host = $1 AND placeholder = 0 AND mig_parent_uuid IS NULL \
             ORDER BY uuid",
        ))
        .bind(host.to_string())
        .fetch_all(&mut *tx)
        .await?;
        let wanted = (count as usize).saturating_sub(real.len());
        // Refresh the host's existing placeholders first, then make new ones on unused indexes.
        let existing: Vec<String> = sqlx::query_scalar(
            &self.sql("SELECT uuid FROM gpus WHERE host = $1 AND placeholder = 1 ORDER BY uuid"),
        )
        .bind(host.to_string())
        .fetch_all(&mut *tx)
        .await?;
        let mut uuids: Vec<String> = existing.iter().take(wanted).cloned().collect();
        let mut index = 0;
        while uuids.len() < wanted {
            let candidate = gpuledger_model::placeholder_uuid(host, index);
            if !existing.contains(&candidate) {
                uuids.push(candidate);
            }
            index += 1;
        }
        let known = self
            .load_gpus(
                &mut tx,
                uuids.iter().chain(&real).map(String::as_str).collect(),
            )
            .await?;
        let template = |uuid: &str, model: Option<&str>| PushGpu {
            uuid: uuid.to_string(),
            model: model
                .or(host_gpus.model.as_deref())
                .unwrap_or("unknown")
                .to_string(),
            memory_mib: host_gpus.memory_mib,
            host: Some(host.to_string()),
            cluster: host_gpus.cluster.clone(),
            cloud: host_gpus.cloud,
            region: host_gpus.region.clone(),
            instance_type: host_gpus.instance_type.clone(),
            account: host_gpus.account.clone(),
            serial: None,
            pci_bus_id: None,
            mig_parent_uuid: None,
            mig_profile: None,
            labels: host_gpus.labels.clone(),
            observed_at,
        };
        let mut touched: BTreeMap<i64, Touched> = BTreeMap::new();
        for uuid in uuids.iter().chain(&real) {
            let old = known.get(uuid).map(|(_, r)| r);
            let placeholder = gpuledger_model::is_placeholder(uuid);
            let g = template(uuid, old.map(|r| r.model.as_str()).filter(|_| !placeholder));
            let mut rec = if placeholder {
                // Placeholders are the count source's own: it updates all they carry.
                let mut rec = merge_gpu(None, &g, &who.source, &self.settings);
                if let Some(old) = old {
                    rec.first_seen = old.first_seen.min(observed_at);
                    rec.last_seen = old.last_seen.max(observed_at);
                    rec.holders = old.holders.clone();
                }
                rec.placeholder = true;
                rec.rederive(&self.settings);
                rec
            } else {
                merge_gpu(old, &g, &who.source, &self.settings)
            };
            if !placeholder && old == Some(&rec) {
                continue;
            }
            rec.last_seen = rec.last_seen.max(observed_at);
            let owner_at = owner_changed(old, &rec).then(|| observed_at.timestamp());
            let id = self.upsert_gpu(&mut tx, &rec, owner_at).await?;
            self.record_attributes(&mut tx, id, &who.source, &g).await?;
            mark_presence(
                touched.entry(id).or_default(),
                observed_at.timestamp(),
                self.settings.stale_window_secs,
            );
        }
        self.reroll(&mut tx, &touched).await?;
        tx.commit().await?;
        Ok(wanted as u32)
    }

    /// `alias` is another name of `host` (an exporter pod's name for its node): GPUs stored on
    /// the alias move to the host, taking over the host's placeholders, and GPUs reported on
    /// the alias from now on are stored on the host.
    pub async fn observe_host_alias(
        &self,
        who: &Principal,
        alias: &str,
        host: &str,
        observed_at: DateTime<Utc>,
    ) -> Result<()> {
        if alias == host {
            return Ok(());
        }
        let _writer = self.write_lock.lock().await;
        let mut tx = self.pool().begin().await?;
        sqlx::query(&self.sql(
            "INSERT INTO host_aliases (alias, host, source, observed_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (alias) DO UPDATE SET host = excluded.host, source = excluded.source, \
             observed_at = excluded.observed_at",
        ))
        .bind(alias.to_string())
        .bind(host.to_string())
        .bind(who.source.clone())
        .bind(observed_at.timestamp())
        .execute(&mut *tx)
        .await?;
        let moved: Vec<(i64, Option<String>)> = sqlx::query_as(&self.sql(
            "SELECT id, mig_parent_uuid FROM gpus WHERE host = $1 AND placeholder = 0 ORDER BY uuid",
        ))
        .bind(alias.to_string())
        .fetch_all(&mut *tx)
        .await?;
        if moved.is_empty() {
            return Ok(tx.commit().await?);
        }
        sqlx::query(&self.sql("UPDATE gpus SET host = $2 WHERE host = $1"))
            .bind(alias.to_string())
            .bind(host.to_string())
            .execute(&mut *tx)
            .await?;
        let mut touched: BTreeMap<i64, Touched> = BTreeMap::new();
        for (id, parent) in moved {
            if parent.is_none() {
                self.absorb_placeholder(&mut tx, id, host, &mut touched)
                    .await?;
            }
        }
        self.reroll(&mut tx, &touched).await?;
        Ok(tx.commit().await?)
    }

    /// The hosts that some of `hosts` are aliases of.
    async fn host_aliases(
        &self,
        tx: &mut Transaction<'_, Any>,
        hosts: BTreeSet<String>,
    ) -> Result<HashMap<String, String>> {
        let mut out = HashMap::new();
        let hosts: Vec<String> = hosts.into_iter().collect();
        for chunk in hosts.chunks(500) {
            let marks: Vec<String> = (1..=chunk.len()).map(|n| format!("${n}")).collect();
            let text = format!(
                "SELECT alias, host FROM host_aliases WHERE alias IN ({})",
                marks.join(",")
            );
            let sql = self.sql(&text);
            let mut q = sqlx::query_as::<_, (String, String)>(&sql).persistent(false);
            for h in chunk {
                q = q.bind(h.clone());
            }
            out.extend(q.fetch_all(&mut **tx).await?);
        }
        Ok(out)
    }

    /// Allocations a count-only source made on a host's GPU pool (`placeholder:<host>:<slot>`)
    /// go to exact GPUs once the host has real ones: to the GPUs or MIG instances where another
    /// source saw the same workload (dcgm-exporter's pod labels), else to the host's physical
    /// GPUs in UUID order, slot by slot. Rows this source left for the same allocation on the
    /// host's other GPUs are removed, so an allocation moves to its exact GPU and never doubles.
    async fn resolve_pool_allocations(
        &self,
        tx: &mut Transaction<'_, Any>,
        who: &Principal,
        allocations: &mut [(usize, PushAllocation)],
        horizon: i64,
        touched: &mut BTreeMap<i64, Touched>,
    ) -> Result<()> {
        let mut groups: BTreeMap<(String, String, i64), Vec<usize>> = BTreeMap::new();
        for (pos, (_, a)) in allocations.iter().enumerate() {
            if let Some((host, _)) = gpuledger_model::parse_placeholder(&a.gpu_uuid) {
                groups
                    .entry((host.to_string(), a.workload.clone(), a.start.timestamp()))
                    .or_default()
                    .push(pos);
            }
        }
        // (id, uuid, placeholder, MIG instance) of every GPU on a host, by host.
        let mut hosts: HashMap<String, Vec<(i64, String, bool, bool)>> = HashMap::new();
        for ((host, workload, start), positions) in groups {
            if !hosts.contains_key(&host) {
                let rows: Vec<(i64, String, i64, Option<String>)> = sqlx::query_as(&self.sql(
                    "SELECT id, uuid, placeholder, mig_parent_uuid FROM gpus WHERE host = $1 \
                     ORDER BY uuid",
                ))
                .bind(host.clone())
                .fetch_all(&mut **tx)
                .await?;
                let rows = rows
                    .into_iter()
                    .map(|(id, uuid, ph, parent)| (id, uuid, ph != 0, parent.is_some()))
                    .collect();
                hosts.insert(host.clone(), rows);
            }
            let gpus = &hosts[&host];
            let physical: Vec<String> = gpus
                .iter()
                .filter(|g| !g.2 && !g.3)
                .map(|g| g.1.clone())
                .collect();
            if physical.is_empty() {
                continue; // No real GPU yet: the allocation stays on the pool's placeholders.
            }
            let ends: Vec<Option<i64>> = positions
                .iter()
                .map(|&p| allocations[p].1.end.map(|e| e.timestamp()))
                .collect();
            let end = ends.iter().copied().collect::<Option<Vec<i64>>>();
            let end = end.and_then(|e| e.into_iter().max());
            let evidence: Vec<String> = sqlx::query_scalar(&self.sql(
                "SELECT DISTINCT g.uuid FROM allocations a JOIN gpus g ON g.id = a.gpu_id \
                 WHERE g.host = $1 AND g.placeholder = 0 AND a.workload = $2 AND a.source <> $3 \
                 AND (a.end_ts IS NULL OR a.end_ts >= $4) AND a.start_ts <= $5 ORDER BY g.uuid",
            ))
            .bind(host.clone())
            .bind(workload.clone())
            .bind(who.source.clone())
            .bind(start)
            .bind(end.unwrap_or(i64::MAX))
            .fetch_all(&mut **tx)
            .await?;
            let targets = if evidence.is_empty() {
                &physical
            } else {
                &evidence
            };
            let mut keep = BTreeSet::new();
            for &p in &positions {
                let a = &mut allocations[p].1;
                let slot = gpuledger_model::parse_placeholder(&a.gpu_uuid).map_or(0, |(_, s)| s);
                a.gpu_uuid = targets[slot as usize % targets.len()].clone();
                keep.insert(a.gpu_uuid.clone());
            }
            for (id, uuid, _, _) in gpus {
                if keep.contains(uuid) {
                    continue;
                }
                let removed: Option<Option<i64>> = sqlx::query_scalar(&self.sql(
                    "DELETE FROM allocations WHERE gpu_id = $1 AND workload = $2 AND start_ts = $3 \
                     AND source = $4 RETURNING end_ts",
                ))
                .bind(*id)
                .bind(workload.clone())
                .bind(start)
                .bind(who.source.clone())
                .fetch_optional(&mut **tx)
                .await?;
                if let Some(old_end) = removed {
                    let hi = old_end.unwrap_or(horizon).min(horizon);
                    widen(
                        &mut touched.entry(*id).or_default().flags,
                        hour_floor(start),
                        hi.max(hour_floor(start) + 1),
                    );
                }
            }
        }
        Ok(())
    }

    /// Record where each attribute of `g` came from.
    async fn record_attributes(
        &self,
        tx: &mut Transaction<'_, Any>,
        id: i64,
        source: &str,
        g: &PushGpu,
    ) -> Result<()> {
        for (attr, value) in attributes(g) {
            let attr = match attr {
                "labels" => format!("labels.{}", value.split('=').next().unwrap_or_default()),
                other => other.to_string(),
            };
            sqlx::query(&self.sql(
                "INSERT INTO gpu_attrs (gpu_id, attribute, source, value, observed_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (gpu_id, attribute, source) DO UPDATE \
                 SET value = excluded.value, observed_at = excluded.observed_at \
                 WHERE excluded.observed_at >= gpu_attrs.observed_at",
            ))
            .bind(id)
            .bind(attr)
            .bind(source.to_string())
            .bind(value)
            .bind(g.observed_at.timestamp())
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }

    pub(crate) async fn load_gpus(
        &self,
        tx: &mut Transaction<'_, Any>,
        uuids: Vec<&str>,
    ) -> Result<HashMap<String, (i64, GpuRecord)>> {
        let mut out = HashMap::new();
        for chunk in uuids.chunks(500) {
            let marks: Vec<String> = (1..=chunk.len()).map(|n| format!("${n}")).collect();
            let sql = format!(
                "SELECT {GPU_COLUMNS} FROM gpus WHERE uuid IN ({})",
                marks.join(",")
            );
            let sql = self.sql(&sql);
            let mut q = sqlx::query(&sql).persistent(false);
            for u in chunk {
                q = q.bind(u.to_string());
            }
            for row in q.fetch_all(&mut **tx).await? {
                let (id, rec) = gpu_from_row(&row)?;
                out.insert(rec.uuid.clone(), (id, rec));
            }
        }
        Ok(out)
    }

    /// Write a GPU; with `owner_at`, its owner changed at that time (or it is new) and the owner
    /// history follows (see [`Store::record_owner`]).
    pub(crate) async fn upsert_gpu(
        &self,
        tx: &mut Transaction<'_, Any>,
        r: &GpuRecord,
        owner_at: Option<i64>,
    ) -> Result<i64> {
        let labels = serde_json::to_string(&r.labels).unwrap_or_else(|_| "{}".into());
        let seen = serde_json::to_string(&r.seen).unwrap_or_else(|_| "{}".into());
        let holders = serde_json::to_string(&r.holders).unwrap_or_else(|_| "[]".into());
        let origin = serde_json::to_string(&r.rate.origin).unwrap_or_else(|_| "{}".into());
        let id: i64 = sqlx::query_scalar(&self.sql(
            "INSERT INTO gpus (uuid, model, memory_mib, host, cluster, cloud, region, instance_type, \
             serial, pci_bus_id, mig_parent_uuid, mig_profile, labels, source, placeholder, \
             first_seen, last_seen, team, env, owner_reason, usd_per_hour, rate_origin, attr_seen, \
             account, holders) \
             VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22,$23, \
             $24,$25) \
             ON CONFLICT (uuid) DO UPDATE SET model = excluded.model, memory_mib = excluded.memory_mib, \
             host = excluded.host, cluster = excluded.cluster, cloud = excluded.cloud, \
             region = excluded.region, instance_type = excluded.instance_type, serial = excluded.serial, \
             pci_bus_id = excluded.pci_bus_id, mig_parent_uuid = excluded.mig_parent_uuid, \
             mig_profile = excluded.mig_profile, labels = excluded.labels, source = excluded.source, \
             placeholder = excluded.placeholder, first_seen = excluded.first_seen, \
             last_seen = excluded.last_seen, team = excluded.team, env = excluded.env, \
             owner_reason = excluded.owner_reason, usd_per_hour = excluded.usd_per_hour, \
             rate_origin = excluded.rate_origin, attr_seen = excluded.attr_seen, \
             account = excluded.account, holders = excluded.holders RETURNING id",
        ))
        .bind(r.uuid.clone())
        .bind(r.model.clone())
        .bind(r.memory_mib.map(|m| m as i64))
        .bind(r.host.clone())
        .bind(r.cluster.clone())
        .bind(r.cloud.clone())
        .bind(r.region.clone())
        .bind(r.instance_type.clone())
        .bind(r.serial.clone())
        .bind(r.pci_bus_id.clone())
        .bind(r.mig_parent_uuid.clone())
        .bind(r.mig_profile.clone())
        .bind(labels)
        .bind(r.source.clone())
        .bind(r.placeholder as i64)
        .bind(r.first_seen.timestamp())
        .bind(r.last_seen.timestamp())
        .bind(r.team.clone())
        .bind(r.env.clone())
        .bind(r.owner_reason.clone())
        .bind(r.rate.usd_per_hour)
        .bind(origin)
        .bind(seen)
        .bind(r.account.clone())
        .bind(holders)
        .fetch_one(&mut **tx)
        .await?;
        if let Some(at) = owner_at {
            self.record_owner(tx, id, r, at).await?;
        }
        Ok(id)
    }

    /// Keep the owner history in step with a GPU's current owner: a GPU's first period covers
    /// all its history; a change of team or environment closes the open period at the hour of
    /// `at` and opens a new one (a second change within the same hour replaces the first). A
    /// period keeps the reason that opened it; the GPU's record has the latest one.
    async fn record_owner(
        &self,
        tx: &mut Transaction<'_, Any>,
        id: i64,
        r: &GpuRecord,
        at: i64,
    ) -> Result<()> {
        let open: Option<(i64, String, String)> = sqlx::query_as(
            &self.sql("SELECT from_ts, team, env FROM gpu_owners WHERE gpu_id = $1 AND to_ts = $2"),
        )
        .bind(id)
        .bind(OPEN_END)
        .fetch_optional(&mut **tx)
        .await?;
        let at = hour_floor(at).max(0);
        match open {
            None => {
                sqlx::query(&self.sql(
                    "INSERT INTO gpu_owners (gpu_id, from_ts, to_ts, team, env, reason) \
                     VALUES ($1, 0, $2, $3, $4, $5)",
                ))
                .bind(id)
                .bind(OPEN_END)
                .bind(r.team.clone())
                .bind(r.env.clone())
                .bind(r.owner_reason.clone())
                .execute(&mut **tx)
                .await?;
            }
            Some((_, team, env)) if team == r.team && env == r.env => {}
            Some((from, ..)) if at <= from => {
                sqlx::query(&self.sql(
                    "UPDATE gpu_owners SET team = $3, env = $4, reason = $5 \
                     WHERE gpu_id = $1 AND from_ts = $2",
                ))
                .bind(id)
                .bind(from)
                .bind(r.team.clone())
                .bind(r.env.clone())
                .bind(r.owner_reason.clone())
                .execute(&mut **tx)
                .await?;
            }
            Some((from, ..)) => {
                sqlx::query(
                    &self
                        .sql("UPDATE gpu_owners SET to_ts = $3 WHERE gpu_id = $1 AND from_ts = $2"),
                )
                .bind(id)
                .bind(from)
                .bind(at)
                .execute(&mut **tx)
                .await?;
                sqlx::query(&self.sql(
                    "INSERT INTO gpu_owners (gpu_id, from_ts, to_ts, team, env, reason) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                ))
                .bind(id)
                .bind(at)
                .bind(OPEN_END)
                .bind(r.team.clone())
                .bind(r.env.clone())
                .bind(r.owner_reason.clone())
                .execute(&mut **tx)
                .await?;
            }
        }
        Ok(())
    }

    /// Keep the holders of the GPUs `ids` (and of the physical GPUs of MIG instances among
    /// them) in step with their allocations (see [`holders_at`]). Ownership rules on
    /// namespaces, pod labels or Slurm accounts read them, so a GPU whose owner changes with
    /// its holders opens a new owner period when the holders changed: the start of a holder
    /// that came, or the end of one that left (`now` when neither is known). A change that
    /// would place a GPU in a team `who` may not write is refused and named; the GPU keeps
    /// its owner.
    pub(crate) async fn refresh_holders(
        &self,
        tx: &mut Transaction<'_, Any>,
        who: &Principal,
        ids: &[i64],
        now: i64,
    ) -> Result<Vec<String>> {
        let mut refused = Vec::new();
        let mut targets: BTreeSet<i64> = ids.iter().copied().collect();
        for chunk in ids.chunks(500) {
            let marks: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
            let sql = format!(
                "SELECT p.id FROM gpus c JOIN gpus p ON p.uuid = c.mig_parent_uuid \
                 WHERE c.id IN ({})",
                marks.join(",")
            );
            let sql = self.sql(&sql);
            let mut q = sqlx::query_scalar::<_, i64>(&sql);
            for id in chunk {
                q = q.bind(*id);
            }
            targets.extend(q.fetch_all(&mut **tx).await?);
        }
        for id in targets {
            let Some(row) =
                sqlx::query(&self.sql(&format!("SELECT {GPU_COLUMNS} FROM gpus WHERE id = $1")))
                    .bind(id)
                    .fetch_optional(&mut **tx)
                    .await?
            else {
                continue;
            };
            let (id, old) = gpu_from_row(&row)?;
            let candidates = self.holder_candidates(tx, id, &old.uuid).await?;
            let holders = holders_at(&candidates, i64::MAX);
            if holders == old.holders {
                continue;
            }
            let mut rec = old.clone();
            rec.holders = holders;
            rec.rederive(&self.settings);
            let changed = owner_changed(Some(&old), &rec);
            if changed && !who.may_write(&rec.team) {
                refused.push(format!(
                    "the workloads now holding GPU {} would place it in team `{}`; this token \
                     may write only teams: {}; it stays `{}`'s",
                    rec.uuid,
                    rec.team,
                    who.teams_text(),
                    old.team
                ));
                continue;
            }
            let mut at: Option<i64> = None;
            for h in &rec.holders {
                if !old.holders.iter().any(|o| o.workload == h.workload) {
                    at = at.max(Some(h.start.timestamp()));
                }
            }
            for o in &old.holders {
                if rec.holders.iter().any(|h| h.workload == o.workload) {
                    continue;
                }
                let end: Option<i64> = sqlx::query_scalar(&self.sql(&format!(
                    "SELECT MAX(end_ts) {HOLDER_FAMILY} AND workload = $3"
                )))
                .bind(id)
                .bind(old.uuid.clone())
                .bind(o.workload.clone())
                .fetch_one(&mut **tx)
                .await?;
                at = at.max(Some(end.unwrap_or(now)));
            }
            let owner_at = changed.then(|| at.unwrap_or(now));
            self.upsert_gpu(tx, &rec, owner_at).await?;
        }
        Ok(refused)
    }

    /// The allocations the current holders of GPU `id` (UUID `uuid`) can come from: the
    /// running ones of the GPU and its MIG instances, and the last one to start.
    async fn holder_candidates(
        &self,
        tx: &mut Transaction<'_, Any>,
        id: i64,
        uuid: &str,
    ) -> Result<Vec<Holder>> {
        let mut rows: Vec<HolderRow> = sqlx::query_as(&self.sql(&format!(
            "{HOLDER_COLUMNS} {HOLDER_FAMILY} AND end_ts IS NULL ORDER BY start_ts LIMIT 64"
        )))
        .bind(id)
        .bind(uuid.to_string())
        .fetch_all(&mut **tx)
        .await?;
        rows.extend(
            sqlx::query_as::<_, HolderRow>(&self.sql(&format!(
                "{HOLDER_COLUMNS} {HOLDER_FAMILY} ORDER BY start_ts DESC, end_ts DESC LIMIT 1"
            )))
            .bind(id)
            .bind(uuid.to_string())
            .fetch_all(&mut **tx)
            .await?,
        );
        Ok(rows.into_iter().map(holder_of).collect())
    }

    /// The physical GPU `a` lands on (the GPU itself, or a MIG instance's parent) and the team
    /// that would own it once `a` holds it too, or `None` when that GPU is unknown.
    async fn owner_with(
        &self,
        tx: &mut Transaction<'_, Any>,
        rec: &GpuRecord,
        a: &PushAllocation,
    ) -> Result<Option<(String, String)>> {
        let uuid = rec
            .mig_parent_uuid
            .clone()
            .unwrap_or_else(|| rec.uuid.clone());
        let Some(row) =
            sqlx::query(&self.sql(&format!("SELECT {GPU_COLUMNS} FROM gpus WHERE uuid = $1")))
                .bind(uuid.clone())
                .fetch_optional(&mut **tx)
                .await?
        else {
            return Ok(None);
        };
        let (id, mut gpu) = gpu_from_row(&row)?;
        let mut candidates = self.holder_candidates(tx, id, &uuid).await?;
        candidates.push(Holder {
            workload: a.workload.clone(),
            kind: a.kind.as_str().to_string(),
            source: String::new(),
            start: a.start,
            end: a.end,
            context: a.context.clone(),
        });
        gpu.holders = holders_at(&candidates, i64::MAX);
        gpu.rederive(&self.settings);
        Ok(Some((uuid, gpu.team)))
    }

    /// A real GPU first reported on `host` takes over one placeholder of that host: its hours
    /// and allocations move to the real GPU and the placeholder goes away (BRIEF section 4).
    async fn absorb_placeholder(
        &self,
        tx: &mut Transaction<'_, Any>,
        real_id: i64,
        host: &str,
        touched: &mut BTreeMap<i64, Touched>,
    ) -> Result<()> {
        let ph: Option<(i64, i64, i64)> = sqlx::query_as(&self.sql(
            "SELECT g.id, COALESCE((SELECT MIN(hour) FROM gpu_hours WHERE gpu_id = g.id), 0), \
             COALESCE((SELECT MAX(hour) FROM gpu_hours WHERE gpu_id = g.id), 0) \
             FROM gpus g WHERE g.placeholder = 1 AND g.host = $1 ORDER BY g.uuid LIMIT 1",
        ))
        .bind(host.to_string())
        .fetch_optional(&mut **tx)
        .await?;
        let Some((ph_id, lo, hi)) = ph else {
            return Ok(());
        };
        // What the count source knew of the host and the real GPU's source did not say.
        let mut fill = String::from("UPDATE gpus SET ");
        for (i, col) in [
            "memory_mib",
            "cluster",
            "cloud",
            "region",
            "instance_type",
            "account",
        ]
        .iter()
        .enumerate()
        {
            if i > 0 {
                fill.push_str(", ");
            }
            fill.push_str(&format!(
                "{col} = COALESCE({col}, (SELECT p.{col} FROM gpus p WHERE p.id = $2))"
            ));
        }
        fill.push_str(" WHERE id = $1");
        sqlx::query(&self.sql(&fill))
            .bind(real_id)
            .bind(ph_id)
            .execute(&mut **tx)
            .await?;
        for sql in [
            "INSERT INTO gpu_hours (gpu_id, hour, samples, act_n, act_sum, mem_max, power_sum, power_n, \
             allocated, billed_usd) \
             SELECT $1, hour, samples, act_n, act_sum, mem_max, power_sum, power_n, allocated, billed_usd \
             FROM gpu_hours WHERE gpu_id = $2 ON CONFLICT (gpu_id, hour) DO NOTHING",
            "INSERT INTO billed_gpu_periods (file_id, gpu_id, period_start, period_end, billed_usd, hours) \
             SELECT file_id, $1, period_start, period_end, billed_usd, hours \
             FROM billed_gpu_periods WHERE gpu_id = $2 \
             ON CONFLICT (file_id, gpu_id, period_start, period_end) DO NOTHING",
            "INSERT INTO allocations (gpu_id, start_ts, end_ts, workload, kind, user_name, team, \
             source, owner, context) \
             SELECT $1, start_ts, end_ts, workload, kind, user_name, team, source, owner, context \
             FROM allocations WHERE gpu_id = $2 ON CONFLICT (gpu_id, workload, start_ts) DO NOTHING",
        ] {
            sqlx::query(&self.sql(sql))
                .bind(real_id)
                .bind(ph_id)
                .execute(&mut **tx)
                .await?;
        }
        for table in [
            "gpu_hours",
            "gpu_days",
            "allocations",
            "gpu_attrs",
            "samples",
            "gpu_owners",
            "billed_gpu_periods",
        ] {
            sqlx::query(&self.sql(&format!("DELETE FROM {table} WHERE gpu_id = $1")))
                .bind(ph_id)
                .execute(&mut **tx)
                .await?;
        }
        sqlx::query(&self.sql("DELETE FROM gpus WHERE id = $1"))
            .bind(ph_id)
            .execute(&mut **tx)
            .await?;
        let t = touched.entry(real_id).or_default();
        t.holders = true;
        if hi >= lo && hi > 0 {
            widen(&mut t.flags, lo, hi + HOUR_SECS);
        }
        Ok(())
    }

    /// Re-roll the touched hours and days of every touched GPU. GPUs with the same touched
    /// range share one statement (`gpu_id IN (...)`), so a body of a thousand GPUs' current
    /// samples costs a handful of statements, not thousands.
    async fn reroll(
        &self,
        tx: &mut Transaction<'_, Any>,
        touched: &BTreeMap<i64, Touched>,
    ) -> Result<()> {
        // Presence: one row per (GPU, hour), new rows only.
        let pairs: Vec<(i64, i64)> = touched
            .iter()
            .flat_map(|(id, t)| t.presence.iter().map(move |h| (*id, *h)))
            .collect();
        for chunk in pairs.chunks(PRESENCE_CHUNK) {
            let sql = format!(
                "INSERT INTO gpu_hours (gpu_id, hour) VALUES {} ON CONFLICT (gpu_id, hour) DO NOTHING",
                values(chunk.len(), 2)
            );
            let sql = self.sql(&sql);
            let mut q = sqlx::query(&sql).persistent(chunk.len() == PRESENCE_CHUNK);
            for (id, h) in chunk {
                q = q.bind(*id).bind(*h);
            }
            q.execute(&mut **tx).await?;
        }
        let mut activity: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
        let mut flags: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
        let mut days: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
        for (id, t) in touched {
            if let Some(r) = t.activity {
                activity.entry(r).or_default().push(*id);
            }
            // Every hour whose row may be new or whose allocations changed gets its flag again.
            let mut range = t.flags;
            if let (Some(&lo), Some(&hi)) = (t.presence.first(), t.presence.last()) {
                widen(&mut range, lo, hi + HOUR_SECS);
            }
            if let Some((lo, hi)) = t.activity {
                widen(&mut range, lo, hi);
            }
            if let Some((lo, hi)) = range {
                flags.entry((lo, hi)).or_default().push(*id);
                days.entry((day_floor(lo), day_floor(hi - 1) + DAY_SECS))
                    .or_default()
                    .push(*id);
            }
        }
        for ((lo, hi), ids) in &activity {
            self.for_ids(tx, ids, *lo, *hi, None,
                "INSERT INTO gpu_hours (gpu_id, hour, samples, act_n, act_sum, mem_max, power_sum, power_n, allocated) \
                 SELECT gpu_id, (ts / 3600) * 3600, COUNT(*), \
                 SUM(CASE WHEN sm_active IS NOT NULL OR util_pct IS NOT NULL THEN 1 ELSE 0 END), \
                 COALESCE(SUM(COALESCE(sm_active * 100.0, util_pct)), 0), MAX(mem_used_mib), \
                 COALESCE(SUM(power_w), 0), COUNT(power_w), 0 \
                 FROM samples WHERE gpu_id IN (IDS) AND ts >= $1 AND ts < $2 \
                 GROUP BY gpu_id, (ts / 3600) * 3600 \
                 ON CONFLICT (gpu_id, hour) DO UPDATE SET samples = excluded.samples, \
                 act_n = excluded.act_n, act_sum = excluded.act_sum, mem_max = excluded.mem_max, \
                 power_sum = excluded.power_sum, power_n = excluded.power_n",
            )
            .await?;
        }
        for ((lo, hi), ids) in &flags {
            self.for_ids(
                tx,
                ids,
                *lo,
                *hi,
                None,
                "UPDATE gpu_hours SET allocated = CASE WHEN EXISTS (SELECT 1 FROM allocations a \
                 WHERE a.gpu_id = gpu_hours.gpu_id AND a.start_ts < gpu_hours.hour + 3600 \
                 AND (a.end_ts IS NULL OR a.end_ts > gpu_hours.hour)) THEN 1 ELSE 0 END \
                 WHERE gpu_id IN (IDS) AND hour >= $1 AND hour < $2",
            )
            .await?;
        }
        for ((lo, hi), ids) in &days {
            self.for_ids(
                tx,
                ids,
                *lo,
                *hi,
                Some(self.settings.idle_threshold_pct),
                REROLL_DAYS,
            )
            .await?;
        }
        Ok(())
    }

    /// Run `sql` with `$1`, `$2` = `lo`, `hi`, `$3` = `extra` when given, and `IDS` replaced by
    /// the GPU ids (in chunks).
    pub(crate) async fn for_ids(
        &self,
        tx: &mut Transaction<'_, Any>,
        ids: &[i64],
        lo: i64,
        hi: i64,
        extra: Option<f64>,
        sql: &str,
    ) -> Result<()> {
        let first = if extra.is_some() { 4 } else { 3 };
        for chunk in ids.chunks(500) {
            let marks: Vec<String> = (0..chunk.len())
                .map(|n| format!("${}", n + first))
                .collect();
            let text = sql.replace("IDS", &marks.join(","));
            let text = self.sql(&text);
            let mut q = sqlx::query(&text)
                .persistent(chunk.len() == 1)
                .bind(lo)
                .bind(hi);
            if let Some(x) = extra {
                q = q.bind(x);
            }
            for id in chunk {
                q = q.bind(*id);
            }
            q.execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// Rebuild every day rollup (after the idle threshold changed).
    pub(crate) async fn rebuild_days(&self) -> Result<()> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("DELETE FROM gpu_days")
            .execute(&mut *tx)
            .await?;
        // SQLite needs a WHERE in INSERT ... SELECT ... ON CONFLICT; `1 = 1` keeps one.
        let all = REROLL_DAYS.replace("gpu_id IN (IDS)", "1 = 1");
        sqlx::query(&self.sql(&all))
            .bind(i64::MIN / 2)
            .bind(i64::MAX / 2)
            .bind(self.settings.idle_threshold_pct)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn source_id(&self, tx: &mut Transaction<'_, Any>, who: &Principal) -> Result<i64> {
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

    async fn record_attempt(
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

/// An allocation as stored: end, source, kind, user, team.
/// `end_ts, source, kind, user_name, team, owner` of a stored allocation.
/// An allocation as a holder: workload, kind, source, start, end, context.
pub(crate) type HolderRow = (String, String, String, i64, Option<i64>, Option<String>);

/// The columns of a [`HolderRow`].
pub(crate) const HOLDER_COLUMNS: &str = "SELECT workload, kind, source, start_ts, end_ts, context";

/// The allocations of GPU `$1` (UUID `$2`) and of its MIG instances.
pub(crate) const HOLDER_FAMILY: &str = "FROM allocations WHERE (gpu_id = $1 OR gpu_id IN \
     (SELECT id FROM gpus WHERE mig_parent_uuid = $2))";

pub(crate) fn holder_of(r: HolderRow) -> Holder {
    let (workload, kind, source, start, end, context) = r;
    Holder {
        workload,
        kind,
        source,
        start: secs(start),
        end: end.map(secs),
        context: context
            .and_then(|c| serde_json::from_str(&c).ok())
            .unwrap_or_default(),
    }
}

fn secs(t: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(t, 0).unwrap_or_default()
}

type StoredAllocation = (
    Option<i64>,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// Whether a write changes a GPU's owner or environment (a new GPU has none yet).
fn owner_changed(old: Option<&GpuRecord>, new: &GpuRecord) -> bool {
    old.is_none_or(|o| o.team != new.team || o.env != new.env)
}

fn mark_presence(t: &mut Touched, ts: i64, stale: i64) {
    let mut h = hour_floor(ts);
    let last = hour_floor(ts + stale.max(1) - 1);
    while h <= last {
        t.presence.insert(h);
        h += HOUR_SECS;
    }
}

fn unknown_gpu(path: String, uuid: &str) -> Rejection {
    Rejection::new(
        path,
        format!(
            "no GPU {uuid} has been reported; send it in `gpus` first (in this body or an earlier one)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_covers_the_stale_window() {
        let mut t = Touched::default();
        mark_presence(&mut t, 3600 * 10 + 59 * 60, 7200);
        assert_eq!(
            t.presence.iter().copied().collect::<Vec<_>>(),
            vec![36000, 39600, 43200]
        );
        let mut t = Touched::default();
        mark_presence(&mut t, 3600 * 10, 7200);
        assert_eq!(t.presence.len(), 2);
    }

    #[test]
    fn values_numbers_placeholders_row_major() {
        assert_eq!(values(2, 2), "($1,$2),($3,$4)");
    }
}
