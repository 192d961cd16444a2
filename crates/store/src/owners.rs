//! GPU records and their owner history: writing a merged GPU, the owner periods
//! (`gpu_owners`) it opens, and the workloads holding a GPU that ownership rules read.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use gpuledger_ledger::ownership::{holders_at, Holder};
use gpuledger_ledger::GpuRecord;
use gpuledger_model::{hour_floor, PushAllocation};
use sqlx::{Any, Transaction};

use crate::float::F64;
use crate::ingest::Principal;
use crate::rows::{gpu_from_row, ts, GPU_COLUMNS};
use crate::{Result, Store, OPEN_END};

/// An allocation as a holder: workload, kind, source, start, end, context.
pub(crate) type HolderRow = (String, String, String, i64, Option<i64>, Option<String>);

/// The columns of a [`HolderRow`].
pub(crate) const HOLDER_COLUMNS: &str = "SELECT workload, kind, source, start_ts, end_ts, context";

/// The holder candidates of the GPUs `IDS` ([`Store::holder_candidates_of`]), each row led by
/// the GPU's id. The last allocation of each member is found through its key, by start
/// (`allocations_gpu_start`).
const HOLDER_CANDIDATES: &str = "WITH fam (pid, gid) AS (\
       SELECT id, id FROM gpus WHERE id IN (IDS) UNION ALL \
       SELECT p.id, m.id FROM gpus p JOIN gpus m ON m.mig_parent_uuid = p.uuid \
       WHERE p.id IN (IDS)), \
     running AS (SELECT fam.pid, a.workload, a.kind, a.source, a.start_ts, a.end_ts, a.context, \
       ROW_NUMBER() OVER (PARTITION BY fam.pid ORDER BY a.start_ts, a.workload) AS n \
       FROM fam JOIN allocations a ON a.gpu_id = fam.gid WHERE a.end_ts IS NULL) \
     SELECT pid, workload, kind, source, start_ts, end_ts, context FROM running WHERE n <= 64 \
     UNION ALL \
     SELECT fam.pid, a.workload, a.kind, a.source, a.start_ts, a.end_ts, a.context \
     FROM fam JOIN allocations a ON a.id = (SELECT b.id FROM allocations b \
       WHERE b.gpu_id = fam.gid ORDER BY b.start_ts DESC, b.end_ts DESC LIMIT 1)";

/// The allocations of GPU `$1` (UUID `$2`) and of its MIG instances. One list of GPUs rather
/// than `gpu_id = $1 OR gpu_id IN (...)`: PostgreSQL answers that `OR` by reading every
/// allocation, milliseconds a call at 50,000 allocations.
pub(crate) const HOLDER_FAMILY: &str = "FROM allocations WHERE gpu_id IN \
     (SELECT CAST($1 AS BIGINT) UNION ALL SELECT id FROM gpus WHERE mig_parent_uuid = $2)";

/// When workload `$3` last held GPU `$1` (UUID `$2`) or one of its MIG instances: the end of
/// its latest allocation there, null while one runs or when none is stored. Each GPU's
/// allocations are read by key: a push that ends many holders asks once per GPU, and on
/// PostgreSQL tables not yet analyzed during a bulk load made even the list of
/// [`HOLDER_FAMILY`] a scan of every allocation.
const HOLDER_LAST_END: &str = "SELECT MAX(e) FROM (\
     SELECT MAX(end_ts) AS e FROM allocations WHERE gpu_id = $1 AND workload = $3 UNION ALL \
     SELECT (SELECT MAX(a.end_ts) FROM allocations a WHERE a.gpu_id = m.id AND a.workload = $3) \
     FROM gpus m WHERE m.mig_parent_uuid = $2) f";

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

pub(crate) fn secs(t: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(t, 0).unwrap_or_default()
}

/// Whether a write changes a GPU's owner or environment (a new GPU has none yet).
pub(crate) fn owner_changed(old: Option<&GpuRecord>, new: &GpuRecord) -> bool {
    old.is_none_or(|o| o.team != new.team || o.env != new.env)
}

impl Store {
    pub(crate) async fn load_gpus(
        &self,
        tx: &mut Transaction<'_, Any>,
        uuids: Vec<&str>,
    ) -> Result<HashMap<String, (i64, GpuRecord)>> {
        let uuids: Vec<String> = uuids.into_iter().map(str::to_string).collect();
        self.gpus_where(tx, "uuid", &uuids).await
    }

    /// The id and owning team of each stored GPU among `uuids`, by UUID, 500 to a statement:
    /// what a sample needs of its GPU.
    pub(crate) async fn gpu_owners_of(
        &self,
        tx: &mut Transaction<'_, Any>,
        uuids: Vec<&str>,
    ) -> Result<HashMap<String, (i64, String)>> {
        let mut out = HashMap::new();
        for chunk in uuids.chunks(500) {
            let marks: Vec<String> = (1..=chunk.len()).map(|n| format!("${n}")).collect();
            let sql = format!(
                "SELECT uuid, id, team FROM gpus WHERE uuid IN ({})",
                marks.join(",")
            );
            let sql = self.sql(&sql);
            let mut q = sqlx::query_as::<_, (String, i64, String)>(&sql).persistent(false);
            for u in chunk {
                q = q.bind(u.to_string());
            }
            for (uuid, id, team) in q.fetch_all(&mut **tx).await? {
                out.insert(uuid, (id, team));
            }
        }
        Ok(out)
    }

    /// The stored GPUs whose `column` is one of `values`, by UUID, 500 to a statement.
    pub(crate) async fn gpus_where<T>(
        &self,
        tx: &mut Transaction<'_, Any>,
        column: &str,
        values: &[T],
    ) -> Result<HashMap<String, (i64, GpuRecord)>>
    where
        T: Clone + Send + for<'q> sqlx::Encode<'q, Any> + sqlx::Type<Any> + 'static,
    {
        let mut out = HashMap::new();
        for chunk in values.chunks(500) {
            let marks: Vec<String> = (1..=chunk.len()).map(|n| format!("${n}")).collect();
            let sql = format!(
                "SELECT {GPU_COLUMNS} FROM gpus WHERE {column} IN ({})",
                marks.join(",")
            );
            let sql = self.sql(&sql);
            let mut q = sqlx::query(&sql).persistent(false);
            for v in chunk {
                q = q.bind(v.clone());
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
             account, holders, vendor) \
             VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22,$23, \
             $24,$25,$26) \
             ON CONFLICT (uuid) DO UPDATE SET model = excluded.model, memory_mib = excluded.memory_mib, \
             host = excluded.host, cluster = excluded.cluster, cloud = excluded.cloud, \
             region = excluded.region, instance_type = excluded.instance_type, serial = excluded.serial, \
             pci_bus_id = excluded.pci_bus_id, mig_parent_uuid = excluded.mig_parent_uuid, \
             mig_profile = excluded.mig_profile, labels = excluded.labels, source = excluded.source, \
             placeholder = excluded.placeholder, first_seen = excluded.first_seen, \
             last_seen = excluded.last_seen, team = excluded.team, env = excluded.env, \
             owner_reason = excluded.owner_reason, usd_per_hour = excluded.usd_per_hour, \
             rate_origin = excluded.rate_origin, attr_seen = excluded.attr_seen, \
             account = excluded.account, holders = excluded.holders, vendor = excluded.vendor \
             RETURNING id",
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
        .bind(F64(r.rate.usd_per_hour))
        .bind(origin)
        .bind(seen)
        .bind(r.account.clone())
        .bind(holders)
        .bind(r.vendor().map(|v| v.as_str().to_string()))
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
    pub(crate) async fn record_owner(
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
                // Allocated-idle day rows name the period of their hours: the days from the
                // change on fall in the new one.
                if r.mig_parent_uuid.is_none() {
                    self.reroll_day_use(tx, &[id], gpuledger_model::day_floor(at), i64::MAX / 2)
                        .await?;
                }
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
        let targets: Vec<i64> = targets.into_iter().collect();
        let gpus: BTreeMap<i64, GpuRecord> = self
            .gpus_where(tx, "id", &targets)
            .await?
            .into_iter()
            .map(|(_, (id, rec))| (id, rec))
            .collect();
        let mut candidates = self.holder_candidates_of(tx, &targets).await?;
        for (id, old) in gpus {
            let candidates = candidates.remove(&id).unwrap_or_default();
            let holders = holders_at(&candidates, i64::MAX);
            if holders == old.holders {
                continue;
            }
            let mut rec = old.clone();
            rec.holders = holders;
            rec.rederive(&self.settings);
            let changed = owner_changed(Some(&old), &rec);
            // A scoped token moves a GPU neither into nor out of a team it may not write.
            if changed && !(who.may_write(&rec.team) && who.may_write(&old.team)) {
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
                let end: Option<i64> = sqlx::query_scalar(&self.sql(HOLDER_LAST_END))
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

    /// The allocations the current holders of GPU `id` can come from: the running ones of
    /// the GPU and its MIG instances, and the last one to start.
    pub(crate) async fn holder_candidates(
        &self,
        tx: &mut Transaction<'_, Any>,
        id: i64,
    ) -> Result<Vec<Holder>> {
        Ok(self
            .holder_candidates_of(tx, &[id])
            .await?
            .remove(&id)
            .unwrap_or_default())
    }

    /// [`Store::holder_candidates`] of many GPUs, a few statements per 500 of them: the
    /// running allocations of each GPU's family (the GPU and its MIG instances), the first 64
    /// by start, and the last allocation to start of each member. [`holders_at`] takes the
    /// running ones, or when none runs the last of those to start, which is the family's.
    pub(crate) async fn holder_candidates_of(
        &self,
        tx: &mut Transaction<'_, Any>,
        ids: &[i64],
    ) -> Result<BTreeMap<i64, Vec<Holder>>> {
        let mut out: BTreeMap<i64, Vec<Holder>> = BTreeMap::new();
        for chunk in ids.chunks(500) {
            let marks: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
            let sql = HOLDER_CANDIDATES.replace("IDS", &marks.join(","));
            let sql = self.sql(&sql);
            let mut q = sqlx::query_as::<
                _,
                (
                    i64,
                    String,
                    String,
                    String,
                    i64,
                    Option<i64>,
                    Option<String>,
                ),
            >(&sql);
            for id in chunk {
                q = q.bind(*id);
            }
            for (id, workload, kind, source, start, end, context) in q.fetch_all(&mut **tx).await? {
                out.entry(id)
                    .or_default()
                    .push(holder_of((workload, kind, source, start, end, context)));
            }
        }
        Ok(out)
    }

    /// The physical GPU `a` lands on (the GPU itself, or a MIG instance's parent) and the team
    /// that would own it once `a` holds it too, or `None` when that GPU is unknown.
    pub(crate) async fn owner_with(
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
        let mut candidates = self.holder_candidates(tx, id).await?;
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

    /// Re-decide owner and environment of every GPU from `from` on with the current rules,
    /// rewriting the owner history after `from` (`gpuledger reattribute --from DATE`); history
    /// before `from` keeps the owners it had. Returns how many GPUs' history changed.
    pub async fn reattribute(&self, from: DateTime<Utc>) -> Result<usize> {
        use gpuledger_ledger::ownership::holders_at;
        let _writer = self.write_lock.lock().await;
        let from = hour_floor(from.timestamp()).max(0);
        let rows = sqlx::query(&format!("SELECT {GPU_COLUMNS} FROM gpus"))
            .fetch_all(self.pool())
            .await?;
        let by_workload = self.settings.ownership.reads_workloads();
        let mut tx = self.writer_tx().await?;
        let mut changed = 0;
        for row in &rows {
            let (id, stored) = gpu_from_row(row)?;
            let mut rec = stored.clone();
            rec.rederive(&self.settings);
            if rec != stored {
                self.upsert_gpu(&mut tx, &rec, None).await?;
            }
            // The owner from `from` on: one period when rules read only the GPU; when they read
            // the workloads holding it, replayed through the holders' changes since `from`.
            let mut periods: Vec<(i64, GpuRecord)> = Vec::new();
            if by_workload {
                let allocations: Vec<gpuledger_ledger::ownership::Holder> =
                    sqlx::query_as::<_, HolderRow>(
                        &self.sql(&format!("{HOLDER_COLUMNS} {HOLDER_FAMILY}")),
                    )
                    .bind(id)
                    .bind(rec.uuid.clone())
                    .fetch_all(&mut *tx)
                    .await?
                    .into_iter()
                    .map(holder_of)
                    .collect();
                let mut events: BTreeSet<i64> = BTreeSet::from([from]);
                for a in &allocations {
                    events.insert(a.start.timestamp());
                    events.extend(a.end.map(|e| e.timestamp()));
                }
                for t in events.into_iter().filter(|t| *t >= from) {
                    let mut at = rec.clone();
                    at.holders = holders_at(&allocations, t);
                    at.rederive(&self.settings);
                    let hour = hour_floor(t);
                    match periods.last_mut() {
                        // Several changes within an hour: the hour goes to the last.
                        Some(last) if last.0 == hour => last.1 = at,
                        Some(last) if last.1.team == at.team && last.1.env == at.env => {}
                        _ => periods.push((hour, at)),
                    }
                }
                // Merging within an hour may leave neighbours with the same owner.
                periods.dedup_by(|b, a| a.1.team == b.1.team && a.1.env == b.1.env);
            } else {
                periods.push((from, rec.clone()));
            }
            let after: Vec<(i64, String, String)> = sqlx::query_as(&self.sql(
                "SELECT from_ts, team, env FROM gpu_owners WHERE gpu_id = $1 AND to_ts > $2 \
                 ORDER BY from_ts",
            ))
            .bind(id)
            .bind(from)
            .fetch_all(&mut *tx)
            .await?;
            let same =
                after.len() == periods.len()
                    && after.iter().zip(&periods).enumerate().all(|(i, (a, p))| {
                        (i == 0 || a.0 == p.0) && a.1 == p.1.team && a.2 == p.1.env
                    });
            if same {
                continue;
            }
            changed += 1;
            sqlx::query(&self.sql("DELETE FROM gpu_owners WHERE gpu_id = $1 AND from_ts >= $2"))
                .bind(id)
                .bind(from)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                &self.sql("UPDATE gpu_owners SET to_ts = $2 WHERE gpu_id = $1 AND to_ts > $2"),
            )
            .bind(id)
            .bind(from)
            .execute(&mut *tx)
            .await?;
            for (i, (start, p)) in periods.iter().enumerate() {
                let end = periods.get(i + 1).map(|n| n.0).unwrap_or(OPEN_END);
                sqlx::query(&self.sql(
                    "INSERT INTO gpu_owners (gpu_id, from_ts, to_ts, team, env, reason) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                ))
                .bind(id)
                .bind(*start)
                .bind(end)
                .bind(p.team.clone())
                .bind(p.env.clone())
                .bind(format!(
                    "{} (re-attributed from {})",
                    p.owner_reason,
                    ts(from).format("%Y-%m-%d %H:%M UTC")
                ))
                .execute(&mut *tx)
                .await?;
            }
        }
        if changed > 0 {
            // Allocated-idle day rows name the owner period of their hours.
            self.reroll_all_day_use(&mut tx).await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// Re-derive owner, environment and rate of every GPU from its stored attributes.
    pub(crate) async fn rederive_all_gpus(&self) -> Result<()> {
        let rows = sqlx::query(&format!("SELECT {GPU_COLUMNS} FROM gpus"))
            .fetch_all(self.pool())
            .await?;
        let mut changed: BTreeMap<i64, GpuRecord> = BTreeMap::new();
        for row in &rows {
            let (id, rec) = gpu_from_row(row)?;
            let mut again = rec.clone();
            again.rederive(&self.settings);
            if again != rec {
                changed.insert(id, again);
            }
        }
        if changed.is_empty() {
            return Ok(());
        }
        tracing::info!(
            gpus = changed.len(),
            "re-derived owner, environment or rate"
        );
        let at = Utc::now().timestamp();
        let old: HashMap<i64, GpuRecord> = rows
            .iter()
            .filter_map(|r| gpu_from_row(r).ok())
            .filter(|(id, _)| changed.contains_key(id))
            .collect();
        let mut tx = self.pool().begin().await?;
        for (id, rec) in &changed {
            let moved = old
                .get(id)
                .is_none_or(|o| o.team != rec.team || o.env != rec.env);
            self.upsert_gpu(&mut tx, rec, moved.then_some(at)).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
