//! What the cloud collectors (`aws`, `gcp`, `azure`) share: one cloud instance as read from the
//! cloud's API, in one shape, and how an instance becomes observations. Each cloud's module
//! reads its API into [`CloudInstance`]s; this module alone decides what gpuledger records.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gpuledger_model::Cloud;

/// One virtual machine (or bare-metal instance) of a cloud account, project or subscription.
#[derive(Debug, Clone, PartialEq)]
pub struct CloudInstance {
    pub cloud: Cloud,
    /// The AWS account ID, GCP project ID or Azure subscription ID.
    pub account: String,
    pub region: Option<String>,
    pub zone: Option<String>,
    /// The cloud's ID of the instance, as a Kubernetes node's `spec.providerID` ends and as
    /// billing exports name it: AWS `i-…`, the GCP instance name, the Azure VM name.
    pub instance_id: String,
    /// The host name the instance is known by, where the API says (AWS private DNS name, GCP
    /// instance name, Azure computer name); `None` to use the instance ID.
    pub host_name: Option<String>,
    /// The machine type, VM size or instance type (`p5.48xlarge`, `a3-highgpu-8g`,
    /// `Standard_ND96isr_H100_v5`).
    pub instance_type: String,
    pub state: InstanceState,
    pub lifecycle: Lifecycle,
    pub launch_time: Option<DateTime<Utc>>,
    /// The instance's tags (AWS), labels (GCP) or tags (Azure), as given.
    pub tags: BTreeMap<String, String>,
    /// Its accelerators; `None` when the instance has none the API names (not a GPU instance).
    pub gpus: Option<GpuSpec>,
}

/// What the API says about an instance's lifecycle state.
#[derive(Debug, Clone, PartialEq)]
pub enum InstanceState {
    /// Running, or starting (pending, provisioning, staging): it costs money.
    Running,
    /// Stopped, stopping, deallocated, suspended or terminated: its GPUs are gone since `since`
    /// (when the API says; `None` when it does not say when).
    Stopped {
        since: Option<DateTime<Utc>>,
        /// The API's word for the state (`stopped`, `TERMINATED`, `PowerState/deallocated`).
        state: String,
    },
}

/// How the instance is bought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    OnDemand,
    Spot,
    /// Reserved capacity (an AWS capacity reservation, a GCP reservation, an Azure
    /// capacity reservation group).
    Reserved,
    /// AWS EC2 Capacity Blocks for ML, GCP DWS calendar mode.
    CapacityBlock,
}

impl Lifecycle {
    /// The `lifecycle` label value (what `[[rates.contracts]]` rules match).
    pub fn label(self) -> &'static str {
        match self {
            Lifecycle::OnDemand => "on-demand",
            Lifecycle::Spot => "spot",
            Lifecycle::Reserved => "reserved",
            Lifecycle::CapacityBlock => "capacity-block",
        }
    }
}

/// An instance's GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSpec {
    /// The GPU model as the cloud names it (`H100`, `nvidia-h100-80gb`, `A100`), normalized by
    /// the server's catalog.
    pub model: String,
    /// Physical GPUs of the instance. A fractional GPU (a share of one GPU, like AWS `g6f`)
    /// counts as 1 with its [`GpuSpec::fraction`].
    pub count: u32,
    /// Memory of one GPU (or of the share of it), MiB.
    pub memory_mib: Option<u64>,
    /// The share of one physical GPU the instance gets, when below 1 (`0.125`).
    pub fraction: Option<f64>,
}

/// The label keys a cloud collector sets on an instance's GPUs; a tag with one of these keys
/// is kept under `tag.<key>` instead, so the collector's own facts are never overwritten.
pub const RESERVED_LABELS: [&str; 6] = [
    "instance_id",
    "zone",
    "lifecycle",
    "launch_time",
    "gpu_fraction",
    "instance_state",
];

/// The observations `instances` stand for, as source `source` at `now`: a running instance with
/// GPUs is a host with that many GPUs (placeholders until a UUID-aware source names them),
/// carrying the cloud, account, region, instance type and, as labels, its tags, instance ID,
/// zone, lifecycle and launch time. The host is named as the cloud names it; the server merges
/// it with the host a Kubernetes node or the agent reports for the same instance ID. A stopped
/// or terminated GPU instance whose stop time the API gives is a [`Observation::HostStopped`]:
/// its GPUs stop counting from then. One whose stop time is unknown, and an instance without
/// GPUs, yield nothing: GPUs no longer seen turn `missing` after the stale window.
pub fn observations(
    source: &str,
    instances: &[CloudInstance],
    now: DateTime<Utc>,
) -> Vec<gpuledger_model::Observation> {
    use gpuledger_model::{HostGpus, Observation, Provenance};
    let mut out = Vec::new();
    for i in instances {
        let host = i
            .host_name
            .clone()
            .filter(|h| !h.trim().is_empty())
            .unwrap_or_else(|| i.instance_id.clone());
        let provenance = Provenance {
            source: source.to_string(),
            observed_at: now,
            raw_key: Some(format!("instance/{}/{}", i.account, i.instance_id)),
        };
        if let (
            InstanceState::Stopped {
                since: Some(at),
                state,
            },
            Some(_),
        ) = (&i.state, &i.gpus)
        {
            out.push(Observation::HostStopped {
                host,
                instance_id: Some(i.instance_id.clone()),
                at: (*at).min(now),
                state: state.clone(),
                provenance,
            });
            continue;
        }
        let (InstanceState::Running, Some(gpus)) = (&i.state, &i.gpus) else {
            continue;
        };
        if gpus.count == 0 {
            continue;
        }
        let mut labels: BTreeMap<String, String> = BTreeMap::new();
        for (k, v) in &i.tags {
            if RESERVED_LABELS.contains(&k.as_str()) {
                labels.insert(format!("tag.{k}"), v.clone());
            } else {
                labels.insert(k.clone(), v.clone());
            }
        }
        labels.insert("instance_id".into(), i.instance_id.clone());
        labels.insert("lifecycle".into(), i.lifecycle.label().into());
        labels.insert("instance_state".into(), "running".into());
        if let Some(z) = &i.zone {
            labels.insert("zone".into(), z.clone());
        }
        if let Some(t) = i.launch_time {
            labels.insert(
                "launch_time".into(),
                t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            );
        }
        if let Some(f) = gpus.fraction.filter(|f| *f > 0.0 && *f < 1.0) {
            labels.insert("gpu_fraction".into(), format!("{f}"));
        }
        out.push(Observation::HostGpuCount {
            gpus: HostGpus {
                host,
                count: gpus.count,
                model: Some(gpus.model.clone()),
                memory_mib: gpus.memory_mib,
                cluster: None,
                cloud: Some(i.cloud),
                region: i.region.clone(),
                instance_type: Some(i.instance_type.clone()),
                account: Some(i.account.clone()),
                labels,
                mig_instances: BTreeMap::new(),
            },
            provenance,
        });
    }
    out
}

/// One run of a cloud collector as source `source`: the observations of the instances read
/// now, and the accounts, projects or subscriptions that failed.
pub fn report(
    source: &str,
    (instances, problems): (Vec<CloudInstance>, Vec<crate::PartProblem>),
) -> crate::CollectReport {
    crate::CollectReport {
        observations: observations(source, &instances, crate::now_secs()),
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use gpuledger_model::Observation;

    fn instance(id: &str, state: InstanceState, gpus: Option<GpuSpec>) -> CloudInstance {
        CloudInstance {
            cloud: Cloud::Aws,
            account: "123456789012".into(),
            region: Some("us-east-1".into()),
            zone: Some("us-east-1a".into()),
            instance_id: id.into(),
            host_name: None,
            instance_type: "p5.48xlarge".into(),
            state,
            lifecycle: Lifecycle::Spot,
            launch_time: Some(Utc.with_ymd_and_hms(2026, 11, 2, 10, 0, 0).unwrap()),
            tags: [
                ("team".to_string(), "nlp".to_string()),
                ("zone".into(), "x".into()),
            ]
            .into_iter()
            .collect(),
            gpus,
        }
    }

    /// Running GPU instances become hosts with their GPUs and facts; a stopped one says when it
    /// stopped where the API does, else nothing, like one without GPUs; a tag never overwrites
    /// what the collector says.
    #[test]
    fn running_gpu_instances_become_hosts() {
        let now = Utc.with_ymd_and_hms(2026, 12, 3, 12, 0, 0).unwrap();
        let h100 = GpuSpec {
            model: "H100".into(),
            count: 8,
            memory_mib: Some(81_920),
            fraction: None,
        };
        let out = observations(
            "aws-prod",
            &[
                instance("i-1", InstanceState::Running, Some(h100.clone())),
                instance(
                    "i-2",
                    InstanceState::Stopped {
                        since: None,
                        state: "stopped".into(),
                    },
                    Some(h100),
                ),
                instance("i-3", InstanceState::Running, None),
                instance(
                    "i-4",
                    InstanceState::Stopped {
                        since: Some(Utc.with_ymd_and_hms(2026, 12, 3, 11, 20, 0).unwrap()),
                        state: "stopped".into(),
                    },
                    Some(GpuSpec {
                        model: "L4".into(),
                        count: 1,
                        memory_mib: None,
                        fraction: None,
                    }),
                ),
            ],
            now,
        );
        assert_eq!(out.len(), 2, "{out:#?}");
        let Observation::HostStopped {
            host,
            instance_id,
            at,
            state,
            ..
        } = &out[1]
        else {
            panic!("{out:#?}")
        };
        assert_eq!(
            (host.as_str(), instance_id.as_deref(), state.as_str()),
            ("i-4", Some("i-4"), "stopped")
        );
        assert_eq!(*at, Utc.with_ymd_and_hms(2026, 12, 3, 11, 20, 0).unwrap());
        let Observation::HostGpuCount { gpus, provenance } = &out[0] else {
            panic!("{out:#?}")
        };
        assert_eq!((gpus.host.as_str(), gpus.count), ("i-1", 8));
        assert_eq!(gpus.account.as_deref(), Some("123456789012"));
        assert_eq!(gpus.labels["instance_id"], "i-1");
        assert_eq!(gpus.labels["zone"], "us-east-1a");
        assert_eq!(gpus.labels["tag.zone"], "x");
        assert_eq!(gpus.labels["team"], "nlp");
        assert_eq!(gpus.labels["lifecycle"], "spot");
        assert_eq!(gpus.labels["launch_time"], "2026-11-02T10:00:00Z");
        assert_eq!(provenance.source, "aws-prod");
        assert_eq!(provenance.observed_at, now);
    }
}
