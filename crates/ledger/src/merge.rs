//! One identity per GPU: merging what several sources say about the same UUID.
//!
//! The first source to report a GPU is its primary source. A later report from the primary
//! source updates the attributes it gives; a report from any other source only fills gaps, so no
//! source overwrites what another one owns. Every attribute's provenance is kept by the store.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gpuledger_model::{PushGpu, Rate};

pub use crate::facts::Seen;
use crate::ownership::{GpuFacts, Holder};
use crate::settings::Settings;

/// A GPU as stored: merged attributes plus derived owner, environment and rate.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuRecord {
    pub uuid: String,
    pub model: String,
    pub memory_mib: Option<u64>,
    pub host: Option<String>,
    pub cluster: Option<String>,
    pub cloud: Option<String>,
    pub region: Option<String>,
    pub instance_type: Option<String>,
    /// The cloud account, project or subscription.
    pub account: Option<String>,
    pub serial: Option<String>,
    pub pci_bus_id: Option<String>,
    pub mig_parent_uuid: Option<String>,
    pub mig_profile: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub source: String,
    pub placeholder: bool,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
    pub team: String,
    pub env: String,
    pub owner_reason: String,
    pub rate: Rate,
    /// Where each current attribute value came from, keyed `model`, `host`, ..., `label.<key>`.
    pub seen: BTreeMap<String, Seen>,
    /// The workloads holding the GPU or its MIG instances now, oldest first (or the last one
    /// that did, when none does); kept by the store from the allocations.
    pub holders: Vec<Holder>,
}

impl GpuRecord {
    /// Who made it: from its identity's prefix (`gpuledger_model::accel`), else (a
    /// placeholder of a count source) the `vendor` label that source gave; `None` when unknown.
    pub fn vendor(&self) -> Option<gpuledger_model::Vendor> {
        gpuledger_model::Vendor::of_uuid(&self.uuid).or_else(|| {
            self.labels
                .get("vendor")
                .and_then(|v| gpuledger_model::Vendor::parse(v))
        })
    }

    /// The current value of an attribute, by its `seen` key.
    fn attr_value(&self, key: &str) -> Option<String> {
        match key {
            "model" => Some(self.model.clone()),
            "memory_mib" => self.memory_mib.map(|m| m.to_string()),
            "host" => self.host.clone(),
            "cluster" => self.cluster.clone(),
            "cloud" => self.cloud.clone(),
            "region" => self.region.clone(),
            "instance_type" => self.instance_type.clone(),
            "account" => self.account.clone(),
            _ => key
                .strip_prefix("label.")
                .and_then(|k| self.labels.get(k).cloned()),
        }
    }

    /// Note that `source` reported these attributes at `at`: an attribute whose value is now the
    /// reported one is credited to the source that first gave that value, and that source's
    /// later reports refresh the time.
    fn note_seen(&mut self, reported: &[(String, String)], source: &str, at: DateTime<Utc>) {
        for (key, value) in reported {
            if self.attr_value(key).as_deref() != Some(value.as_str()) {
                continue;
            }
            let fresh = match self.seen.get(key) {
                None => true,
                Some(s) => s.value != *value || (s.source == source && at > s.at),
            };
            if fresh {
                self.seen.insert(
                    key.clone(),
                    Seen {
                        value: value.clone(),
                        source: source.to_string(),
                        at,
                    },
                );
            }
        }
        let keep: Vec<String> = self
            .seen
            .keys()
            .filter(|k| self.attr_value(k).is_some())
            .cloned()
            .collect();
        self.seen.retain(|k, _| keep.contains(k));
    }
}

/// The attributes of a report that ownership rules may read, keyed as in [`GpuRecord::seen`]:
/// [`attributes`] with labels keyed `label.<key>`, less those rules never read.
fn reported(g: &PushGpu) -> Vec<(String, String)> {
    const RULES_READ: [&str; 8] = [
        "model",
        "memory_mib",
        "host",
        "cluster",
        "cloud",
        "region",
        "instance_type",
        "account",
    ];
    let mut out: Vec<(String, String)> = attributes(g)
        .into_iter()
        .filter(|(k, _)| RULES_READ.contains(k))
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    out.extend(
        g.labels
            .iter()
            .map(|(k, v)| (format!("label.{k}"), v.clone())),
    );
    out
}

impl GpuRecord {
    /// Re-derive owner, environment and rate from the merged attributes (after a merge, or when
    /// the config's rates change).
    pub fn rederive(&mut self, settings: &Settings) {
        let o = settings.ownership.decide(&GpuFacts {
            uuid: &self.uuid,
            labels: &self.labels,
            host: self.host.as_deref(),
            cluster: self.cluster.as_deref(),
            cloud: self.cloud.as_deref(),
            region: self.region.as_deref(),
            instance_type: self.instance_type.as_deref(),
            model: &self.model,
            source: &self.source,
            account: self.account.as_deref(),
            seen: Some(&self.seen),
            holders: &self.holders,
        });
        self.team = o.team;
        self.env = o.env;
        self.owner_reason = if self.placeholder {
            format!(
                "placeholder: a GPU of {} counted by source {}, not yet named by a UUID-aware \
                 source; {}",
                self.host.as_deref().unwrap_or("an unnamed host"),
                self.source,
                o.reason
            )
        } else {
            o.reason
        };
        self.rate = settings.rates.rate_for(&self.rate_facts());
    }

    /// What this GPU's rate depends on.
    pub fn rate_facts(&self) -> crate::rates::RateFacts<'_> {
        crate::rates::RateFacts {
            model: &self.model,
            cloud: self.cloud.as_deref(),
            instance_type: self.instance_type.as_deref(),
            host: self.host.as_deref(),
            account: self.account.as_deref(),
            region: self.region.as_deref(),
            cluster: self.cluster.as_deref(),
            labels: Some(&self.labels),
        }
    }
}

/// The attributes a push record gives, as (name, value) pairs for provenance.
pub fn attributes(g: &PushGpu) -> Vec<(&'static str, String)> {
    let mut out = vec![("model", g.model.clone())];
    let opt = [
        ("memory_mib", g.memory_mib.map(|m| m.to_string())),
        ("host", g.host.clone()),
        ("cluster", g.cluster.clone()),
        ("cloud", g.cloud.map(|c| c.as_str().to_string())),
        ("region", g.region.clone()),
        ("instance_type", g.instance_type.clone()),
        ("account", g.account.clone()),
        ("serial", g.serial.clone()),
        ("pci_bus_id", g.pci_bus_id.clone()),
        ("mig_parent_uuid", g.mig_parent_uuid.clone()),
        ("mig_profile", g.mig_profile.clone()),
    ];
    out.extend(opt.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
    out.extend(g.labels.iter().map(|(k, v)| ("labels", format!("{k}={v}"))));
    out
}

fn pick<T: Clone>(primary: bool, old: &Option<T>, new: &Option<T>) -> Option<T> {
    if primary {
        new.clone().or_else(|| old.clone())
    } else {
        old.clone().or_else(|| new.clone())
    }
}

/// Merge one report from `source` into what is stored (if anything).
pub fn merge_gpu(
    existing: Option<&GpuRecord>,
    g: &PushGpu,
    source: &str,
    settings: &Settings,
) -> GpuRecord {
    let seen = g.observed_at;
    let mut rec = match existing {
        None => GpuRecord {
            uuid: g.uuid.clone(),
            model: g.model.clone(),
            memory_mib: g.memory_mib,
            host: g.host.clone(),
            cluster: g.cluster.clone(),
            cloud: g.cloud.map(|c| c.as_str().to_string()),
            region: g.region.clone(),
            instance_type: g.instance_type.clone(),
            account: g.account.clone(),
            serial: g.serial.clone(),
            pci_bus_id: g.pci_bus_id.clone(),
            mig_parent_uuid: g.mig_parent_uuid.clone(),
            mig_profile: g.mig_profile.clone(),
            labels: g.labels.clone(),
            source: source.to_string(),
            placeholder: false,
            first_seen: seen,
            last_seen: seen,
            team: String::new(),
            env: String::new(),
            owner_reason: String::new(),
            rate: Rate {
                usd_per_hour: None,
                origin: gpuledger_model::RateOrigin::Unknown,
            },
            seen: BTreeMap::new(),
            holders: Vec::new(),
        },
        Some(old) => {
            let primary = old.source == source;
            let mut labels = old.labels.clone();
            for (k, v) in &g.labels {
                if primary || !labels.contains_key(k) {
                    labels.insert(k.clone(), v.clone());
                }
            }
            GpuRecord {
                uuid: old.uuid.clone(),
                model: if primary {
                    g.model.clone()
                } else {
                    old.model.clone()
                },
                memory_mib: pick(primary, &old.memory_mib, &g.memory_mib),
                host: pick(primary, &old.host, &g.host),
                cluster: pick(primary, &old.cluster, &g.cluster),
                cloud: pick(
                    primary,
                    &old.cloud,
                    &g.cloud.map(|c| c.as_str().to_string()),
                ),
                region: pick(primary, &old.region, &g.region),
                instance_type: pick(primary, &old.instance_type, &g.instance_type),
                account: pick(primary, &old.account, &g.account),
                serial: pick(primary, &old.serial, &g.serial),
                pci_bus_id: pick(primary, &old.pci_bus_id, &g.pci_bus_id),
                mig_parent_uuid: pick(primary, &old.mig_parent_uuid, &g.mig_parent_uuid),
                mig_profile: pick(primary, &old.mig_profile, &g.mig_profile),
                labels,
                source: old.source.clone(),
                placeholder: false,
                first_seen: old.first_seen.min(seen),
                last_seen: old.last_seen.max(seen),
                team: String::new(),
                env: String::new(),
                owner_reason: String::new(),
                rate: old.rate.clone(),
                seen: old.seen.clone(),
                holders: old.holders.clone(),
            }
        }
    };
    rec.note_seen(&reported(g), source, seen);
    rec.rederive(settings);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(model: &str, host: Option<&str>, team: &str, at: &str) -> PushGpu {
        PushGpu {
            uuid: "GPU-1".into(),
            model: model.into(),
            memory_mib: None,
            host: host.map(String::from),
            cluster: None,
            cloud: None,
            region: None,
            instance_type: None,
            account: None,
            serial: None,
            pci_bus_id: None,
            mig_parent_uuid: None,
            mig_profile: None,
            labels: [("team".to_string(), team.to_string())].into(),
            observed_at: at.parse().unwrap(),
        }
    }

    #[test]
    fn another_source_only_fills_gaps() {
        let s = Settings::default();
        let a = merge_gpu(
            None,
            &push("NVIDIA H100 80GB HBM3", None, "nlp", "2026-12-02T10:00:00Z"),
            "a",
            &s,
        );
        assert_eq!(a.team, "nlp");
        assert_eq!(a.rate.usd_per_hour, Some(12.29));
        let b = merge_gpu(
            Some(&a),
            &push("H100", Some("n7"), "vision", "2026-12-02T11:00:00Z"),
            "b",
            &s,
        );
        assert_eq!(b.model, "NVIDIA H100 80GB HBM3");
        assert_eq!(b.host.as_deref(), Some("n7"));
        assert_eq!(b.team, "nlp");
        assert_eq!(
            b.last_seen,
            "2026-12-02T11:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        let a2 = merge_gpu(
            Some(&b),
            &push(
                "NVIDIA H100 80GB HBM3",
                None,
                "speech",
                "2026-12-02T09:00:00Z",
            ),
            "a",
            &s,
        );
        assert_eq!(a2.team, "speech");
        assert_eq!(a2.host.as_deref(), Some("n7"));
        assert_eq!(
            a2.first_seen,
            "2026-12-02T09:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
    }
}
