//! The push API v1 wire types (BRIEF section 3): what teams, the agent and the demo send.
//!
//! Every struct rejects unknown fields so that a typo surfaces at once instead of being dropped.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One `POST /api/v1/ingest` body. Any of the three lists may be absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushBody {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<PushGpu>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<PushSample>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocations: Vec<PushAllocation>,
}

impl PushBody {
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty() && self.samples.is_empty() && self.allocations.is_empty()
    }
}

/// Where a GPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cloud {
    Aws,
    Gcp,
    Azure,
    Onprem,
    Other,
}

impl Cloud {
    pub const ALL: [Cloud; 5] = [
        Cloud::Aws,
        Cloud::Gcp,
        Cloud::Azure,
        Cloud::Onprem,
        Cloud::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cloud::Aws => "aws",
            Cloud::Gcp => "gcp",
            Cloud::Azure => "azure",
            Cloud::Onprem => "onprem",
            Cloud::Other => "other",
        }
    }

    pub fn parse(s: &str) -> Option<Cloud> {
        Cloud::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// An inventory record: one physical GPU, or a MIG instance when `mig_parent_uuid` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushGpu {
    pub uuid: String,
    pub model: String,
    #[serde(default)]
    pub memory_mib: Option<u64>,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub cluster: Option<String>,
    #[serde(default)]
    pub cloud: Option<Cloud>,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub instance_type: Option<String>,
    /// The cloud account it is billed to: an AWS account ID, a GCP project, an Azure
    /// subscription. Ownership rules and contract prices can match it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default)]
    pub serial: Option<String>,
    #[serde(default)]
    pub pci_bus_id: Option<String>,
    #[serde(default)]
    pub mig_parent_uuid: Option<String>,
    #[serde(default)]
    pub mig_profile: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub observed_at: DateTime<Utc>,
}

/// A utilization sample. Every metric is optional: absent means unknown, not zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushSample {
    pub gpu_uuid: String,
    pub ts: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub util_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_used_mib: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_w: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_active: Option<f64>,
}

impl PushSample {
    /// The sample's activity in percent: `sm_active × 100` where given, else `util_pct`
    /// (BRIEF section 4). `None` when the sample carries neither.
    pub fn activity_pct(&self) -> Option<f64> {
        self.sm_active.map(|s| s * 100.0).or(self.util_pct)
    }
}

/// What kind of thing held a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllocationKind {
    Pod,
    SlurmJob,
    Process,
    Reservation,
    Other,
}

impl AllocationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AllocationKind::Pod => "pod",
            AllocationKind::SlurmJob => "slurm_job",
            AllocationKind::Process => "process",
            AllocationKind::Reservation => "reservation",
            AllocationKind::Other => "other",
        }
    }

    pub fn parse(s: &str) -> Option<AllocationKind> {
        [
            AllocationKind::Pod,
            AllocationKind::SlurmJob,
            AllocationKind::Process,
            AllocationKind::Reservation,
            AllocationKind::Other,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// "Who used which GPU when": an interval, open while `end` is `None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushAllocation {
    pub gpu_uuid: String,
    pub start: DateTime<Utc>,
    #[serde(default)]
    pub end: Option<DateTime<Utc>>,
    pub workload: String,
    pub kind: AllocationKind,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub team: Option<String>,
    /// The workload that owns it, as `Kind/name` (`Deployment/llm-serve`, `Job/train-7`), when
    /// the source knows one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// What the source knows of the workload beyond its name, for ownership rules that place
    /// a GPU by the workload holding it.
    #[serde(default, skip_serializing_if = "WorkloadContext::is_empty")]
    pub context: WorkloadContext,
    /// The workload's average GPU utilization (percent, 0–100) over the whole allocation, as
    /// its scheduler's accounting measured it (Slurm's `gres/gpuutil`). It fills the
    /// allocation's hours on this GPU that no sample measured, marked as coming from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avg_util_pct: Option<f64>,
    /// The workload's average GPU memory in use (MiB) over the allocation, likewise (Slurm's
    /// `gres/gpumem`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avg_mem_used_mib: Option<f64>,
}

/// A workload's Kubernetes namespace with the labels and annotations of the pod and of the
/// namespace, or its Slurm account and partition. Every field is optional: what a source does
/// not say is unknown. Ownership rules match these as `namespace`, `pod.label.<key>`,
/// `pod.annotation.<key>`, `namespace.label.<key>`, `namespace.annotation.<key>`,
/// `slurm.account` and `slurm.partition`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub namespace_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub namespace_annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_partition: Option<String>,
    /// The Slurm job's QOS, name and final or current state (`COMPLETED`, `RUNNING`), as
    /// accounting records them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_qos: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_state: Option<String>,
}

impl WorkloadContext {
    pub fn is_empty(&self) -> bool {
        *self == WorkloadContext::default()
    }

    /// The label and annotation maps with their field names, for validation.
    pub fn maps(&self) -> [(&'static str, &BTreeMap<String, String>); 4] {
        [
            ("pod_labels", &self.pod_labels),
            ("pod_annotations", &self.pod_annotations),
            ("namespace_labels", &self.namespace_labels),
            ("namespace_annotations", &self.namespace_annotations),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brief_example_round_trips() {
        let body = r#"{
          "gpus": [{"uuid": "GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d5e", "model": "NVIDIA H100 80GB HBM3",
            "memory_mib": 81559, "host": "gpu-node-7", "cluster": "rdu-ocp-1", "cloud": "aws",
            "region": "us-east-1", "instance_type": "p5.48xlarge", "serial": "1654922000123",
            "pci_bus_id": "00000000:1B:00.0", "mig_parent_uuid": null, "mig_profile": null,
            "labels": {"team": "nlp", "env": "prod"}, "observed_at": "2026-12-02T11:00:00Z"}],
          "samples": [{"gpu_uuid": "GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d5e", "ts": "2026-12-02T10:59:00Z",
            "util_pct": 87.0, "mem_used_mib": 60210, "power_w": 512.4, "sm_active": 0.71}],
          "allocations": [{"gpu_uuid": "GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d5e",
            "start": "2026-12-02T08:00:00Z", "end": null, "workload": "nlp-prod/llm-ft-0",
            "kind": "pod", "user": "alice", "team": "nlp"}]
        }"#;
        let parsed: PushBody = serde_json::from_str(body).unwrap();
        assert_eq!(parsed.gpus[0].cloud, Some(Cloud::Aws));
        assert_eq!(parsed.samples[0].activity_pct(), Some(71.0));
        assert_eq!(parsed.allocations[0].kind, AllocationKind::Pod);
        let again: PushBody =
            serde_json::from_str(&serde_json::to_string(&parsed).unwrap()).unwrap();
        assert_eq!(again, parsed);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = serde_json::from_str::<PushSample>(
            r#"{"gpu_uuid":"GPU-1","ts":"2026-12-02T10:59:00Z","util":5}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("unknown field `util`"), "{err}");
    }

    #[test]
    fn activity_prefers_sm_active_and_stays_unknown_without_metrics() {
        let mut s: PushSample =
            serde_json::from_str(r#"{"gpu_uuid":"GPU-1","ts":"2026-12-02T10:59:00Z"}"#).unwrap();
        assert_eq!(s.activity_pct(), None);
        s.util_pct = Some(40.0);
        assert_eq!(s.activity_pct(), Some(40.0));
    }
}
