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
    let labels: String = row.try_get("labels")?;
    let origin: String = row.try_get("rate_origin")?;
    let seen: String = row.try_get("attr_seen")?;
    let holders: String = row.try_get("holders")?;
    let rec = GpuRecord {
        uuid: row.try_get("uuid")?,
        model: row.try_get("model")?,
        memory_mib: row
            .try_get::<Option<i64>, _>("memory_mib")?
            .map(|m| m.max(0) as u64),
        host: row.try_get("host")?,
        cluster: row.try_get("cluster")?,
        cloud: row.try_get("cloud")?,
        region: row.try_get("region")?,
        instance_type: row.try_get("instance_type")?,
        account: row.try_get("account")?,
        serial: row.try_get("serial")?,
        pci_bus_id: row.try_get("pci_bus_id")?,
        mig_parent_uuid: row.try_get("mig_parent_uuid")?,
        mig_profile: row.try_get("mig_profile")?,
        labels: serde_json::from_str(&labels).unwrap_or_default(),
        source: row.try_get("source")?,
        placeholder: row.try_get::<i64, _>("placeholder")? != 0,
        first_seen: ts(row.try_get("first_seen")?),
        last_seen: ts(row.try_get("last_seen")?),
        team: row.try_get("team")?,
        env: row.try_get("env")?,
        owner_reason: row.try_get("owner_reason")?,
        rate: Rate {
            usd_per_hour: row.try_get("usd_per_hour")?,
            origin: serde_json::from_str(&origin).unwrap_or(RateOrigin::Unknown),
        },
        seen: serde_json::from_str(&seen).unwrap_or_default(),
        holders: serde_json::from_str(&holders).unwrap_or_default(),
    };
    Ok((row.try_get("id")?, rec))
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
