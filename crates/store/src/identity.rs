//! Identity: one GPU per physical device. Placeholders from count-only sources, the real GPU
//! that takes one over, host aliases, and where an allocation made on a host's GPU pool lands.
//! The decisions are pure functions in `ledger::identity`; this module reads and moves rows.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use gpuledger_ledger::identity::{mig_placeholders, pool_target};
use gpuledger_ledger::merge_gpu;
use gpuledger_ledger::mig;
use gpuledger_model::{
    day_floor, hour_floor, HostGpus, PushAllocation, PushGpu, DAY_SECS, HOUR_SECS,
};
use sqlx::{Any, Transaction};

use crate::ingest::Principal;
use crate::owners::owner_changed;
use crate::rollup::{mark_presence, widen, Touched};
use crate::{Result, Store};

/// A GPU record of `host_gpus`' host as a count-only source describes it.
fn host_gpu(host_gpus: &HostGpus, uuid: &str, model: &str, observed_at: DateTime<Utc>) -> PushGpu {
    PushGpu {
        uuid: uuid.to_string(),
        model: model.to_string(),
        memory_mib: host_gpus.memory_mib,
        host: Some(host_gpus.host.clone()),
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
    }
}

/// The tables whose rows belong to one GPU (`gpu_id`).
const GPU_TABLES: [&str; 9] = [
    "gpu_hours",
    "gpu_days",
    "gpu_day_use",
    "gpu_day_idle",
    "allocations",
    "gpu_attrs",
    "samples",
    "gpu_owners",
    "billed_gpu_periods",
];

impl Store {
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
        let mut tx = self.writer_tx().await?;
        // The host may be known under another name: an alias, or the same cloud instance
        // reported first under another host name (see `instance_host`).
        let mut resolved = host_gpus.clone();
        let mut touched: BTreeMap<i64, Touched> = BTreeMap::new();
        resolved.host = self
            .instance_host(
                &mut tx,
                who,
                &host_gpus.host,
                &host_gpus.labels,
                observed_at,
                &mut touched,
            )
            .await?;
        let host_gpus = &resolved;
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
        let existing: Vec<String> = sqlx::query_scalar(&self.sql(
            "SELECT uuid FROM gpus WHERE host = $1 AND placeholder = 1 \
                 AND mig_parent_uuid IS NULL ORDER BY uuid",
        ))
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
        let template = |uuid: &str, model: Option<&str>| {
            host_gpu(
                host_gpus,
                uuid,
                model.or(host_gpus.model.as_deref()).unwrap_or("unknown"),
                observed_at,
            )
        };
        for uuid in uuids.iter().chain(&real) {
            let old = known.get(uuid).map(|(_, r)| r);
            let placeholder = gpuledger_model::is_placeholder(uuid);
            let g = template(uuid, old.map(|r| r.model.as_str()).filter(|_| !placeholder));
            // Placeholders another count source made (a Kubernetes node's, for the instance a
            // cloud collector also lists) are that source's: this one only fills their gaps,
            // like a real GPU's.
            let foreign = placeholder && old.is_some_and(|o| o.source != who.source);
            let mut rec = if placeholder && !foreign {
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
            } else if foreign {
                let mut rec = merge_gpu(old, &g, &who.source, &self.settings);
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
        let parents: Vec<String> = uuids.iter().chain(&real).cloned().collect();
        self.sync_mig_placeholders(&mut tx, who, host_gpus, &parents, observed_at)
            .await?;
        self.reroll(&mut tx, &touched).await?;
        tx.commit().await?;
        Ok(wanted as u32)
    }

    /// The cloud says the instance on `host` (or, when another source named it first, on the
    /// host it was first reported under) stopped at `at`: its GPUs that no source saw after
    /// `at` stop counting as present from the hour after `at` (present hours are whole hours,
    /// so the hour it stopped in counts). Hours with a measured sample or a billed cost stay;
    /// only the hours presence alone filled (a report marks the stale window after it as
    /// present) go. Returns how many GPU-hours went.
    pub async fn observe_host_stopped(
        &self,
        who: &Principal,
        host: &str,
        instance_id: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<u64> {
        let _writer = self.write_lock.lock().await;
        let mut tx = self.writer_tx().await?;
        let claimed: Option<String> = match instance_id {
            Some(i) => {
                sqlx::query_scalar(
                    &self.sql("SELECT host FROM host_instances WHERE instance_id = $1"),
                )
                .bind(i.trim().to_ascii_lowercase())
                .fetch_optional(&mut *tx)
                .await?
            }
            None => None,
        };
        let host = match claimed {
            Some(h) => self.resolve_host(&mut tx, &h).await?,
            None => self.resolve_host(&mut tx, host).await?,
        };
        let at = at.timestamp();
        let ids: Vec<i64> = sqlx::query_scalar(&self.sql(
            "SELECT id FROM gpus WHERE host = $1 AND mig_parent_uuid IS NULL AND last_seen <= $2",
        ))
        .bind(host.clone())
        .bind(at)
        .fetch_all(&mut *tx)
        .await?;
        let mut touched: BTreeMap<i64, Touched> = BTreeMap::new();
        let mut gone = 0;
        for id in ids {
            gone += self.end_presence(&mut tx, id, at, &mut touched).await?;
        }
        self.reroll(&mut tx, &touched).await?;
        tx.commit().await?;
        if gone > 0 {
            tracing::info!(source = %who.source, %host, gpu_hours = gone, "stopped instance: presence ended");
        }
        Ok(gone)
    }

    /// An authoritative inventory lists `uuids` and `hosts` at `at`: the physical GPUs this
    /// source reported first that it no longer lists (a GPU by UUID, a placeholder by its
    /// host), and that no other source reported within the stale window, stop counting as
    /// present from the hour after `at`, as [`Store::observe_host_stopped`] ends them.
    /// Returns how many GPU-hours went.
    pub async fn observe_inventory_list(
        &self,
        who: &Principal,
        uuids: &[String],
        hosts: &[String],
        at: DateTime<Utc>,
    ) -> Result<u64> {
        let _writer = self.write_lock.lock().await;
        let mut tx = self.writer_tx().await?;
        let at = at.timestamp();
        let rows: Vec<(i64, String, Option<String>, i64)> = sqlx::query_as(&self.sql(
            "SELECT g.id, g.uuid, g.host, g.placeholder FROM gpus g \
             WHERE g.source = $1 AND g.mig_parent_uuid IS NULL AND g.last_seen <= $2 \
             AND NOT EXISTS (SELECT 1 FROM gpu_attrs a WHERE a.gpu_id = g.id \
               AND a.source <> $1 AND a.observed_at > $3)",
        ))
        .bind(who.source.clone())
        .bind(at)
        .bind(at - self.settings.stale_window_secs)
        .fetch_all(&mut *tx)
        .await?;
        let uuids: BTreeSet<&str> = uuids.iter().map(String::as_str).collect();
        let mut listed_hosts: BTreeSet<String> = BTreeSet::new();
        for h in hosts {
            listed_hosts.insert(self.resolve_host(&mut tx, h).await?);
        }
        let mut touched: BTreeMap<i64, Touched> = BTreeMap::new();
        let mut gone = 0;
        for (id, uuid, host, placeholder) in rows {
            let listed = if placeholder != 0 {
                host.is_some_and(|h| listed_hosts.contains(&h))
            } else {
                uuids.contains(uuid.as_str())
            };
            if !listed {
                gone += self.end_presence(&mut tx, id, at, &mut touched).await?;
            }
        }
        self.reroll(&mut tx, &touched).await?;
        tx.commit().await?;
        Ok(gone)
    }

    /// GPU `id` is gone since `at`: its hours after the one `at` falls in that only presence
    /// filled (no measured sample, no billed cost) go, and its days from then are rolled
    /// again (a day left without hours keeps no row). Returns how many hours went.
    async fn end_presence(
        &self,
        tx: &mut Transaction<'_, Any>,
        id: i64,
        at: i64,
        touched: &mut BTreeMap<i64, Touched>,
    ) -> Result<u64> {
        let cut = hour_floor(at) + HOUR_SECS;
        let last: Option<i64> = sqlx::query_scalar(
            &self.sql("SELECT MAX(hour) FROM gpu_hours WHERE gpu_id = $1 AND hour >= $2"),
        )
        .bind(id)
        .bind(cut)
        .fetch_one(&mut **tx)
        .await?;
        let Some(last) = last else { return Ok(0) };
        let n = sqlx::query(&self.sql(
            "DELETE FROM gpu_hours WHERE gpu_id = $1 AND hour >= $2 AND samples = 0 \
             AND billed_usd IS NULL",
        ))
        .bind(id)
        .bind(cut)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        if n == 0 {
            return Ok(0);
        }
        let (lo, hi) = (day_floor(cut), day_floor(last) + DAY_SECS);
        sqlx::query(&self.sql("DELETE FROM gpu_days WHERE gpu_id = $1 AND day >= $2 AND day < $3"))
            .bind(id)
            .bind(lo)
            .bind(hi)
            .execute(&mut **tx)
            .await?;
        widen(&mut touched.entry(id).or_default().flags, lo, hi);
        Ok(n)
    }

    /// Keep a host's placeholder MIG instances in line with the layout a count-only source
    /// reported (`ledger::identity::mig_placeholders`): made, re-parented or dropped as the
    /// layout changes, and none at all once a UUID-aware source has named a real instance on
    /// the host. They are MIG instances, so they count in no figure; they show the host's
    /// partitioning in the inventory before the instances are named.
    pub(crate) async fn sync_mig_placeholders(
        &self,
        tx: &mut Transaction<'_, Any>,
        who: &Principal,
        host_gpus: &HostGpus,
        parents: &[String],
        observed_at: DateTime<Utc>,
    ) -> Result<()> {
        let host = host_gpus.host.as_str();
        let real_mig: i64 = sqlx::query_scalar(&self.sql(
            "SELECT COUNT(*) FROM gpus WHERE host = $1 AND placeholder = 0 \
             AND mig_parent_uuid IS NOT NULL",
        ))
        .bind(host.to_string())
        .fetch_one(&mut **tx)
        .await?;
        let model = host_gpus.model.as_deref().unwrap_or("unknown");
        let wanted = if real_mig > 0 {
            Vec::new()
        } else {
            mig_placeholders(
                host,
                parents,
                &host_gpus.mig_instances,
                mig::slices_of_model(model),
            )
        };
        let existing: Vec<(i64, String)> = sqlx::query_as(&self.sql(
            "SELECT id, uuid FROM gpus WHERE host = $1 AND placeholder = 1 \
             AND mig_parent_uuid IS NOT NULL",
        ))
        .bind(host.to_string())
        .fetch_all(&mut **tx)
        .await?;
        for (id, uuid) in &existing {
            if !wanted.iter().any(|(u, _, _)| u == uuid) {
                self.delete_gpu(tx, *id).await?;
            }
        }
        let known = self
            .load_gpus(tx, wanted.iter().map(|(u, _, _)| u.as_str()).collect())
            .await?;
        for (uuid, parent, profile) in wanted {
            let g = PushGpu {
                memory_mib: None,
                mig_parent_uuid: Some(parent),
                mig_profile: Some(profile),
                ..host_gpu(host_gpus, &uuid, model, observed_at)
            };
            let old = known.get(&uuid).map(|(_, r)| r);
            let mut rec = merge_gpu(None, &g, &who.source, &self.settings);
            if let Some(old) = old {
                rec.first_seen = old.first_seen.min(observed_at);
                rec.last_seen = old.last_seen.max(observed_at);
            }
            rec.placeholder = true;
            rec.rederive(&self.settings);
            let owner_at = owner_changed(old, &rec).then(|| observed_at.timestamp());
            self.upsert_gpu(tx, &rec, owner_at).await?;
        }
        Ok(())
    }

    /// Remove a GPU and every row that hangs off it.
    pub(crate) async fn delete_gpu(&self, tx: &mut Transaction<'_, Any>, id: i64) -> Result<()> {
        for table in GPU_TABLES {
            sqlx::query(&self.sql(&format!("DELETE FROM {table} WHERE gpu_id = $1")))
                .bind(id)
                .execute(&mut **tx)
                .await?;
        }
        sqlx::query(&self.sql("DELETE FROM gpus WHERE id = $1"))
            .bind(id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// A real MIG instance was named on `host`: the host's placeholder instances go.
    pub(crate) async fn drop_mig_placeholders(
        &self,
        tx: &mut Transaction<'_, Any>,
        host: &str,
    ) -> Result<()> {
        let ids: Vec<i64> = sqlx::query_scalar(&self.sql(
            "SELECT id FROM gpus WHERE host = $1 AND placeholder = 1 \
             AND mig_parent_uuid IS NOT NULL",
        ))
        .bind(host.to_string())
        .fetch_all(&mut **tx)
        .await?;
        for id in ids {
            self.delete_gpu(tx, id).await?;
        }
        Ok(())
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
        let mut tx = self.writer_tx().await?;
        let mut touched: BTreeMap<i64, Touched> = BTreeMap::new();
        self.alias_host(&mut tx, who, alias, host, observed_at, &mut touched)
            .await?;
        self.reroll(&mut tx, &touched).await?;
        Ok(tx.commit().await?)
    }

    /// Record `alias` as another name of `host` (itself resolved through the aliases, so that
    /// every alias names a host that is no alias) and move the GPUs stored on the alias to the
    /// host, real ones taking over the host's placeholders.
    pub(crate) async fn alias_host(
        &self,
        tx: &mut Transaction<'_, Any>,
        who: &Principal,
        alias: &str,
        host: &str,
        observed_at: DateTime<Utc>,
        touched: &mut BTreeMap<i64, Touched>,
    ) -> Result<()> {
        let host = self.resolve_host(tx, host).await?;
        if alias == host {
            return Ok(());
        }
        sqlx::query(&self.sql(
            "INSERT INTO host_aliases (alias, host, source, observed_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (alias) DO UPDATE SET host = excluded.host, source = excluded.source, \
             observed_at = excluded.observed_at",
        ))
        .bind(alias.to_string())
        .bind(host.clone())
        .bind(who.source.clone())
        .bind(observed_at.timestamp())
        .execute(&mut **tx)
        .await?;
        // Names that pointed at the alias now point at the host.
        sqlx::query(&self.sql("UPDATE host_aliases SET host = $2 WHERE host = $1"))
            .bind(alias.to_string())
            .bind(host.clone())
            .execute(&mut **tx)
            .await?;
        sqlx::query(&self.sql("UPDATE host_instances SET host = $2 WHERE host = $1"))
            .bind(alias.to_string())
            .bind(host.clone())
            .execute(&mut **tx)
            .await?;
        let moved: Vec<(i64, Option<String>)> = sqlx::query_as(&self.sql(
            "SELECT id, mig_parent_uuid FROM gpus WHERE host = $1 AND placeholder = 0 ORDER BY uuid",
        ))
        .bind(alias.to_string())
        .fetch_all(&mut **tx)
        .await?;
        if moved.is_empty() {
            return Ok(());
        }
        sqlx::query(&self.sql("UPDATE gpus SET host = $2 WHERE host = $1"))
            .bind(alias.to_string())
            .bind(host.clone())
            .execute(&mut **tx)
            .await?;
        for (id, parent) in moved {
            if parent.is_none() {
                self.absorb_placeholder(tx, id, &host, touched).await?;
            }
        }
        Ok(())
    }

    /// The host `host` is an alias of, or `host` itself.
    pub(crate) async fn resolve_host(
        &self,
        tx: &mut Transaction<'_, Any>,
        host: &str,
    ) -> Result<String> {
        let to: Option<String> =
            sqlx::query_scalar(&self.sql("SELECT host FROM host_aliases WHERE alias = $1"))
                .bind(host.to_string())
                .fetch_optional(&mut **tx)
                .await?;
        Ok(to.unwrap_or_else(|| host.to_string()))
    }

    /// The host a report about `host` lands on: `host` resolved through the aliases, then, when
    /// `labels` name a cloud instance (`instance_id`), the host that instance was first
    /// reported under, which `host` becomes an alias of. So a cloud instance listed by a cloud
    /// collector, seen as a Kubernetes node and running the agent is one host, whichever came
    /// first. Every instance a stored GPU names has its row (migration 21 recorded those stored
    /// before instances were), so one lookup by key finds it, whatever the fleet's size.
    pub(crate) async fn instance_host(
        &self,
        tx: &mut Transaction<'_, Any>,
        who: &Principal,
        host: &str,
        labels: &BTreeMap<String, String>,
        observed_at: DateTime<Utc>,
        touched: &mut BTreeMap<i64, Touched>,
    ) -> Result<String> {
        let host = self.resolve_host(tx, host).await?;
        let Some(instance) = labels
            .get("instance_id")
            .map(|i| i.trim().to_ascii_lowercase())
            .filter(|i| !i.is_empty())
        else {
            return Ok(host);
        };
        let first: Option<String> =
            sqlx::query_scalar(&self.sql("SELECT host FROM host_instances WHERE instance_id = $1"))
                .bind(instance.clone())
                .fetch_optional(&mut **tx)
                .await?;
        match first {
            Some(f) if f != host => {
                self.alias_host(tx, who, &host, &f, observed_at, touched)
                    .await?;
                Ok(f)
            }
            _ => {
                sqlx::query(&self.sql(
                    "INSERT INTO host_instances (instance_id, host, source, observed_at) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT (instance_id) DO NOTHING",
                ))
                .bind(instance)
                .bind(host.clone())
                .bind(who.source.clone())
                .bind(observed_at.timestamp())
                .execute(&mut **tx)
                .await?;
                Ok(host)
            }
        }
    }

    /// The hosts that some of `hosts` are aliases of.
    pub(crate) async fn host_aliases(
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
    /// GPUs in PCI address order (UUID order where no address is known), slot by slot: the
    /// order Slurm's GPU indexes (`IDX`) and CUDA's `PCI_BUS_ID` numbering follow. Rows this source left for the same allocation on the
    /// host's other GPUs are removed, so an allocation moves to its exact GPU and never doubles.
    pub(crate) async fn resolve_pool_allocations(
        &self,
        tx: &mut Transaction<'_, Any>,
        who: &Principal,
        allocations: &mut [(usize, PushAllocation)],
        horizon: i64,
        touched: &mut BTreeMap<i64, Touched>,
    ) -> Result<()> {
        let mut groups: BTreeMap<(String, String, i64), Vec<usize>> = BTreeMap::new();
        // A pool named by a host that is now an alias (a node whose cloud instance was first
        // reported under another name) is that host's pool.
        let mut resolved: HashMap<String, String> = HashMap::new();
        for (_, a) in allocations.iter_mut() {
            if let Some((host, slot)) = gpuledger_model::parse_placeholder(&a.gpu_uuid) {
                let host = host.to_string();
                if !resolved.contains_key(&host) {
                    let to = self.resolve_host(tx, &host).await?;
                    resolved.insert(host.clone(), to);
                }
                let to = &resolved[&host];
                if *to != host {
                    a.gpu_uuid = gpuledger_model::placeholder_uuid(to, slot);
                }
            }
        }
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
                     ORDER BY CASE WHEN pci_bus_id IS NULL THEN 1 ELSE 0 END, LOWER(pci_bus_id), uuid",
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
            let mut keep = BTreeSet::new();
            for &p in &positions {
                let a = &mut allocations[p].1;
                let slot = gpuledger_model::parse_placeholder(&a.gpu_uuid).map_or(0, |(_, s)| s);
                if let Some(target) = pool_target(slot, &physical, &evidence) {
                    a.gpu_uuid = target.to_string();
                }
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

    /// A real GPU first reported on `host` takes over one placeholder of that host: its hours
    /// and allocations move to the real GPU and the placeholder goes away (BRIEF section 4).
    pub(crate) async fn absorb_placeholder(
        &self,
        tx: &mut Transaction<'_, Any>,
        real_id: i64,
        host: &str,
        touched: &mut BTreeMap<i64, Touched>,
    ) -> Result<()> {
        let ph: Option<(i64, i64, i64)> = sqlx::query_as(&self.sql(
            "SELECT g.id, COALESCE((SELECT MIN(hour) FROM gpu_hours WHERE gpu_id = g.id), 0), \
             COALESCE((SELECT MAX(hour) FROM gpu_hours WHERE gpu_id = g.id), 0) \
             FROM gpus g WHERE g.placeholder = 1 AND g.host = $1 AND g.mig_parent_uuid IS NULL \
             ORDER BY g.uuid LIMIT 1",
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
             allocated, billed_usd, evidence) \
             SELECT $1, hour, samples, act_n, act_sum, mem_max, power_sum, power_n, allocated, \
             billed_usd, evidence \
             FROM gpu_hours WHERE gpu_id = $2 ON CONFLICT (gpu_id, hour) DO NOTHING",
            "INSERT INTO billed_gpu_periods (file_id, gpu_id, period_start, period_end, billed_usd, hours) \
             SELECT file_id, $1, period_start, period_end, billed_usd, hours \
             FROM billed_gpu_periods WHERE gpu_id = $2 \
             ON CONFLICT (file_id, gpu_id, period_start, period_end) DO NOTHING",
            "INSERT INTO allocations (gpu_id, start_ts, end_ts, workload, kind, user_name, team, \
             source, owner, context, avg_util_pct, avg_mem_mib) \
             SELECT $1, start_ts, end_ts, workload, kind, user_name, team, source, owner, context, \
             avg_util_pct, avg_mem_mib \
             FROM allocations WHERE gpu_id = $2 ON CONFLICT (gpu_id, workload, start_ts) DO NOTHING",
        ] {
            sqlx::query(&self.sql(sql))
                .bind(real_id)
                .bind(ph_id)
                .execute(&mut **tx)
                .await?;
        }
        // Its placeholder MIG instances now belong to the real GPU.
        sqlx::query(&self.sql(
            "UPDATE gpus SET mig_parent_uuid = (SELECT uuid FROM gpus WHERE id = $1) \
             WHERE mig_parent_uuid = (SELECT uuid FROM gpus WHERE id = $2)",
        ))
        .bind(real_id)
        .bind(ph_id)
        .execute(&mut **tx)
        .await?;
        self.delete_gpu(tx, ph_id).await?;
        let t = touched.entry(real_id).or_default();
        t.holders = true;
        if hi >= lo && hi > 0 {
            widen(&mut t.flags, lo, hi + HOUR_SECS);
        }
        Ok(())
    }
}
