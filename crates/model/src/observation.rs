//! Observations: what any source (push, agent, pull collector) reports, with its provenance.
//!
//! Push and pull produce the same observation types, so nothing downstream can tell them apart.
//! Collectors report observations; they never decide ownership or cost.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::push::{PushAllocation, PushGpu, PushSample};

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
        host: String,
        count: u32,
        model: Option<String>,
        cluster: Option<String>,
        provenance: Provenance,
    },
}

impl Observation {
    pub fn provenance(&self) -> &Provenance {
        match self {
            Observation::Gpu { provenance, .. }
            | Observation::Sample { provenance, .. }
            | Observation::Allocation { provenance, .. }
            | Observation::HostGpuCount { provenance, .. } => provenance,
        }
    }
}
