//! Observations: what any source (push, agent, pull collector) reports, with its provenance.
//!
//! Push and pull produce the same observation types, so nothing downstream can tell them apart.
//! Collectors report observations; they never decide ownership or cost.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::push::{Cloud, PushAllocation, PushGpu, PushSample};

/// What a count-only source knows about one host's GPUs: how many physical GPUs it has, and
/// the attributes they share. Placeholders take these attributes; real GPUs already named on
/// the host take the ones they lack (another source only fills gaps).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostGpus {
    pub host: String,
    /// Physical GPUs (MIG instances and time-slicing replicas are not extra GPUs).
    pub count: u32,
    pub model: Option<String>,
    pub memory_mib: Option<u64>,
    pub cluster: Option<String>,
    pub cloud: Option<Cloud>,
    pub region: Option<String>,
    pub instance_type: Option<String>,
    /// The cloud account, project or subscription (see [`crate::PushGpu::account`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// MIG instances the host's GPUs are partitioned into, per profile (`1g.5gb` → 3), when
    /// the source knows the layout but not the instances' UUIDs (a Kubernetes node under the
    /// mixed or single MIG strategy). They show as placeholder MIG instances of the host's
    /// GPUs until a UUID-aware source names the real ones.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mig_instances: BTreeMap<String, u32>,
}

/// Which source said it, when, and under which raw key (a metric name, an object path).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub source: String,
    pub observed_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_key: Option<String>,
}

/// One normalized fact from a source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Observation {
    Gpu {
        gpu: PushGpu,
        provenance: Provenance,
    },
    Sample {
        sample: PushSample,
        provenance: Provenance,
    },
    Allocation {
        allocation: PushAllocation,
        provenance: Provenance,
    },
    /// A source that knows only how many GPUs a host has (a Kubernetes node's
    /// `nvidia.com/gpu: 8`, a `p5.48xlarge` instance): it yields placeholder GPUs for the host.
    HostGpuCount {
        gpus: HostGpus,
        provenance: Provenance,
    },
    /// `alias` is another name of `host`: dcgm-exporter labels its series with the exporter
    /// pod's name, which a Kubernetes source knows runs on node `host`.
    HostAlias {
        alias: String,
        host: String,
        provenance: Provenance,
    },
    /// A cloud instance the cloud's API says was stopped or terminated at `at`: the GPUs of
    /// its host that no source saw after `at` stop counting as present from the hour after.
    /// `instance_id` finds the host when another source named it first.
    HostStopped {
        host: String,
        instance_id: Option<String>,
        at: DateTime<Utc>,
        /// The API's word for the state (`stopped`, `TERMINATED`, `deallocated`).
        state: String,
        provenance: Provenance,
    },
    /// Everything an authoritative inventory (a sheet marked `authoritative`) lists now: the
    /// GPUs it names by UUID and the hosts it counts. A GPU this source reported first that is
    /// in neither, and that no other source saw within the stale window, stops counting as
    /// present from the hour after `provenance.observed_at`.
    InventoryList {
        uuids: Vec<String>,
        hosts: Vec<String>,
        provenance: Provenance,
    },
    /// A billing export (FinOps FOCUS CSV) that is new or changed at `path`: the server reads
    /// and reconciles it.
    BillingExport {
        path: String,
        size_bytes: u64,
        modified: DateTime<Utc>,
        provenance: Provenance,
    },
}

impl Observation {
    pub fn provenance(&self) -> &Provenance {
        match self {
            Observation::Gpu { provenance, .. }
            | Observation::Sample { provenance, .. }
            | Observation::Allocation { provenance, .. }
            | Observation::HostGpuCount { provenance, .. }
            | Observation::HostAlias { provenance, .. }
            | Observation::HostStopped { provenance, .. }
            | Observation::InventoryList { provenance, .. }
            | Observation::BillingExport { provenance, .. } => provenance,
        }
    }
}
