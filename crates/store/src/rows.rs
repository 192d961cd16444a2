//! Decoding stored rows shared by the readers and the writers: a GPU record and an allocation.

use chrono::{DateTime, TimeZone, Utc};
use gpuledger_ledger::GpuRecord;
use gpuledger_model::{Allocation, Rate, RateOrigin};
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::Result;

pub(crate) fn ts(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, 0).single().unwrap_or_default()
}

pub(crate) const GPU_COLUMNS: &str = "id, uuid, model, memory_mib, host, cluster, cloud, region, \
    instance_type, serial, pci_bus_id, mig_parent_uuid, mig_profile, labels, source, placeholder, \
    first_seen, last_seen, team, env, owner_reason, usd_per_hour, rate_origin, attr_seen, account, \
    holders";

pub(crate) fn gpu_from_row(row: &AnyRow) -> Result<(i64, GpuRecord)> {
    Ok(GpuRow {
        id: row.try_get("id")?,
        uuid: row.try_get("uuid")?,
        model: row.try_get("model")?,
        memory_mib: row.try_get("memory_mib")?,
        host: row.try_get("host")?,
        cluster: row.try_get("cluster")?,
        cloud: row.try_get("cloud")?,
        region: row.try_get("region")?,
        instance_type: row.try_get("instance_type")?,
        serial: row.try_get("serial")?,
        pci_bus_id: row.try_get("pci_bus_id")?,
        mig_parent_uuid: row.try_get("mig_parent_uuid")?,
        mig_profile: row.try_get("mig_profile")?,
        labels: row.try_get("labels")?,
        source: row.try_get("source")?,
        placeholder: row.try_get("placeholder")?,
        first_seen: row.try_get("first_seen")?,
        last_seen: row.try_get("last_seen")?,
        team: row.try_get("team")?,
        env: row.try_get("env")?,
        owner_reason: row.try_get("owner_reason")?,
        usd_per_hour: row.try_get("usd_per_hour")?,
        rate_origin: row.try_get("rate_origin")?,
        attr_seen: row.try_get("attr_seen")?,
        account: row.try_get("account")?,
        holders: row.try_get("holders")?,
        vendor: None,
    }
    .record())
}

/// A stored GPU's columns ([`GPU_COLUMNS`], in that order): read from a row by name, or from a
/// wide read's array (`crate::wide`).
#[derive(serde::Deserialize)]
pub(crate) struct GpuRow {
    id: i64,
    uuid: String,
    model: String,
    memory_mib: Option<i64>,
    host: Option<String>,
    cluster: Option<String>,
    cloud: Option<String>,
    region: Option<String>,
    instance_type: Option<String>,
    serial: Option<String>,
    pci_bus_id: Option<String>,
    mig_parent_uuid: Option<String>,
    mig_profile: Option<String>,
    labels: String,
    source: String,
    placeholder: i64,
    first_seen: i64,
    last_seen: i64,
    team: String,
    env: String,
    owner_reason: String,
    #[serde(deserialize_with = "crate::wide::opt_real")]
    usd_per_hour: Option<f64>,
    rate_origin: String,
    attr_seen: String,
    account: Option<String>,
    holders: String,
    /// The `vendor` column as stored, where the read adds it after [`GPU_COLUMNS`] (the kept
    /// GPU lists, filtered by it: `crate::live`); the record's vendor is told from its UUID
    /// and labels instead.
    #[serde(default)]
    pub(crate) vendor: Option<String>,
}

impl GpuRow {
    /// The GPU's id and record.
    pub(crate) fn record(self) -> (i64, GpuRecord) {
        let rec = GpuRecord {
            uuid: self.uuid,
            model: self.model,
            memory_mib: self.memory_mib.map(|m| m.max(0) as u64),
            host: self.host,
            cluster: self.cluster,
            cloud: self.cloud,
            region: self.region,
            instance_type: self.instance_type,
            account: self.account,
            serial: self.serial,
            pci_bus_id: self.pci_bus_id,
            mig_parent_uuid: self.mig_parent_uuid,
            mig_profile: self.mig_profile,
            labels: serde_json::from_str(&self.labels).unwrap_or_default(),
            source: self.source,
            placeholder: self.placeholder != 0,
            first_seen: ts(self.first_seen),
            last_seen: ts(self.last_seen),
            team: self.team,
            env: self.env,
            owner_reason: self.owner_reason,
            rate: Rate {
                usd_per_hour: self.usd_per_hour,
                origin: serde_json::from_str(&self.rate_origin).unwrap_or(RateOrigin::Unknown),
            },
            seen: serde_json::from_str(&self.attr_seen).unwrap_or_default(),
            holders: serde_json::from_str(&self.holders).unwrap_or_default(),
        };
        (self.id, rec)
    }
}

/// An allocation row (`start_ts, end_ts, workload, kind, user_name, team, owner, source,
/// context, avg_util_pct, avg_mem_mib`) of `gpu_uuid`.
pub(crate) fn allocation_from_row(r: &AnyRow, gpu_uuid: String) -> Result<Allocation> {
    Ok(Allocation {
        gpu_uuid,
        start: ts(r.try_get("start_ts")?),
        end: r.try_get::<Option<i64>, _>("end_ts")?.map(ts),
        workload: r.try_get("workload")?,
        kind: r.try_get("kind")?,
        user: r.try_get("user_name")?,
        team: r.try_get("team")?,
        owner: r.try_get("owner")?,
        source: r.try_get("source")?,
        context: r
            .try_get::<Option<String>, _>("context")?
            .and_then(|c| serde_json::from_str(&c).ok())
            .unwrap_or_default(),
        avg_util_pct: r.try_get("avg_util_pct")?,
        avg_mem_used_mib: r.try_get("avg_mem_mib")?,
    })
}
