//! The demo fleet: a deterministic, simulated fleet of 400+ GPUs over AWS, GCP, Azure and
//! on-prem (Kubernetes and Slurm), eight teams and prod/dev/poc, with 30 days of history and
//! then live samples every minute. Every record goes through the real ingest path
//! ([`gpuledger_web::ingest_bytes`]): the same token check, validation and storage as any push.
//!
//! The history is shaped like a real fleet: working-hours and weekly rhythms, steady
//! inference, multi-day training runs, a team with bursts, GPUs idle for weeks, allocated but
//! idle notebooks, hosts that report no utilization (unknown), MIG instances, and one source
//! that stopped reporting three hours ago.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Datelike, Duration, TimeZone, Timelike, Utc};
use gpuledger_model::{
    AllocationKind, Cloud, PushAllocation, PushBody, PushGpu, PushSample, HOUR_SECS,
};
use gpuledger_store::Role;
use gpuledger_web::AppState;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How a host's GPUs are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// Inference serving: busy around the clock, higher in the day.
    Steady,
    /// Interactive development: busy on weekday working hours, idle otherwise.
    Workday,
    /// Multi-day training runs with idle gaps between them.
    Training,
    /// Mostly idle with short, intense bursts a few times a week.
    Bursty,
    /// Allocated to a long-running notebook or reservation that does almost nothing.
    AllocatedIdle,
    /// Nobody has used it for weeks.
    Idle,
    /// Reports memory and power but no utilization: activity unknown.
    NoUtil,
}

/// One simulated host and the source that reports it.
#[derive(Debug, Clone)]
pub struct Host {
    pub name: String,
    pub cluster: &'static str,
    pub cloud: Cloud,
    pub region: &'static str,
    pub instance_type: &'static str,
    pub model: &'static str,
    pub memory_mib: u64,
    pub gpus: u32,
    pub source: &'static str,
    pub team: Option<&'static str>,
    pub env: Option<&'static str>,
    pub profile: Profile,
    pub mig_profile: Option<&'static str>,
    pub kind: AllocationKind,
    /// Stable index for deterministic noise.
    pub index: u64,
}

/// A UUID-shaped name (`GPU-…` or `MIG-…`) from a hash; `salt` varies the last group.
fn uuid_from(prefix: &str, h: u64, salt: u64) -> String {
    format!(
        "{prefix}-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        h >> 32,
        (h >> 16) & 0xffff,
        h & 0xffff,
        (mix(h) >> 48) & 0xffff,
        mix(h ^ salt) & 0xffff_ffff_ffff
    )
}

impl Host {
    /// The cloud account, project or subscription the host is billed to.
    pub fn account(&self) -> Option<&'static str> {
        match self.cloud {
            Cloud::Aws => Some("111122223333"),
            Cloud::Gcp => Some("ml-platform-prod"),
            Cloud::Azure => Some("5f3c1a2e-9b7d-4c11-8e2f-0a6b3c4d5e6f"),
            _ => None,
        }
    }

    /// An AWS host's EC2 instance ID, which billing exports name it by.
    pub fn instance_id(&self) -> Option<String> {
        (self.cloud == Cloud::Aws).then(|| format!("i-0{:016x}", mix(self.index * 31 + 5)))
    }

    /// What ownership rules read of a workload on this host: the namespace and its `team`
    /// label for pods, the account and partition for Slurm jobs.
    fn workload_context(&self, workload: &str) -> gpuledger_model::WorkloadContext {
        let mut c = gpuledger_model::WorkloadContext::default();
        match self.kind {
            AllocationKind::Pod => {
                if let Some((ns, _)) = workload.split_once('/') {
                    c.namespace = Some(ns.to_string());
                    if let Some(t) = self.team {
                        c.namespace_labels.insert("team".into(), t.into());
                    }
                }
            }
            AllocationKind::SlurmJob => {
                c.slurm_account = self.team.map(String::from);
                c.slurm_partition = Some(
                    if self.model.contains("H200") {
                        "h200"
                    } else if self.model.starts_with("HL-") {
                        "gaudi"
                    } else {
                        "a100"
                    }
                    .into(),
                );
            }
            _ => {}
        }
        c
    }

    /// Who made the host's accelerators, by model name.
    pub fn vendor(&self) -> gpuledger_model::Vendor {
        if self.model.starts_with("AMD") {
            gpuledger_model::Vendor::Amd
        } else if self.model.starts_with("HL-") {
            gpuledger_model::Vendor::Intel
        } else {
            gpuledger_model::Vendor::Nvidia
        }
    }

    /// A GPU's board serial.
    pub fn serial(&self, gpu: u32) -> String {
        format!(
            "{:013}",
            mix(self.index * 97 + gpu as u64) % 10_000_000_000_000
        )
    }

    /// A GPU's identity: an NVIDIA UUID, or another vendor's from its serial, as the agent and
    /// the exporters name it (`gpuledger_model::accel`).
    pub fn uuid(&self, gpu: u32) -> String {
        let serial = self.serial(gpu);
        let named = match self.vendor() {
            gpuledger_model::Vendor::Amd => {
                gpuledger_model::accel::amd_uuid(Some(&serial), None, None, None, None)
            }
            gpuledger_model::Vendor::Intel => {
                gpuledger_model::accel::gaudi_uuid(Some(&serial), None, None, None)
            }
            _ => None,
        };
        named.unwrap_or_else(|| {
            uuid_from("GPU", mix(self.index * 1000 + gpu as u64 + 7), 0x5bd1e995)
        })
    }

    pub fn mig_uuid(&self, gpu: u32, instance: u32) -> String {
        let h = mix(self.index * 100_000 + gpu as u64 * 10 + instance as u64 + 3);
        uuid_from("MIG", h, 0x27d4eb2d)
    }
}

/// The sources of the demo, their kind, and the one that went stale.
pub const SOURCES: &[(&str, &str)] = &[
    ("aws-eks", "push"),
    ("gcp-gke", "push"),
    ("azure-aks", "push"),
    ("rdu-slurm", "push"),
    ("lab-agents", "agent"),
];
pub const STALE_SOURCE: &str = "lab-agents";
const STALE_FOR_SECS: i64 = 3 * 3600;

pub const TEAMS: [&str; 8] = [
    "nlp", "vision", "speech", "recsys", "research", "platform", "search", "robotics",
];

/// The demo's ownership rules: on GKE the owner is the `team` label of the namespace of the
/// pod holding the GPU, on Slurm the job's account, on EKS the node's `team` label. Each gives
/// the same team as the built-in label rule, so the fleet's figures do not depend on them, but
/// the reasons name the rule and the source value it matched.
pub fn ownership_rules() -> gpuledger_ledger::OwnershipRules {
    use gpuledger_ledger::ownership::{Attr, Rule, Setting};
    gpuledger_ledger::OwnershipRules {
        assignments: vec![],
        rules: vec![
            Rule {
                name: Some("gke namespace team".into()),
                when: vec![
                    (Attr::Cluster, "gcp-usc1-gke".into()),
                    (Attr::Namespace, "*".into()),
                ],
                team: Some(Setting::From(Attr::NamespaceLabel("team".into()))),
                env: None,
            },
            Rule {
                name: Some("slurm account".into()),
                when: vec![
                    (Attr::Cluster, "rdu-slurm".into()),
                    (Attr::SlurmPartition, "*".into()),
                ],
                team: Some(Setting::From(Attr::SlurmAccount)),
                env: None,
            },
            Rule {
                name: Some("eks node team label".into()),
                when: vec![
                    (Attr::Cluster, "aws-use1-eks".into()),
                    (Attr::Label("team".into()), "*".into()),
                ],
                team: Some(Setting::From(Attr::Label("team".into()))),
                env: None,
            },
        ],
    }
}

/// A FOCUS export of the AWS hosts' complete days in `[from, to)`, as AWS Data Exports would
/// deliver it: each instance-day billed at its on-demand price, the p5 hosts under a savings
/// plan (28 % off in `EffectiveCost`), plus an EBS volume (no GPU spend) and a g5.12xlarge
/// still billed that no source reports any more.
pub fn focus_export(hosts: &[Host], from: i64, to: i64) -> String {
    use std::fmt::Write;
    let mut out = String::from(
        "BillingAccountId,ChargePeriodStart,ChargePeriodEnd,BilledCost,EffectiveCost,\
         ResourceId,ChargeDescription,ServiceName,ProviderName\n",
    );
    let first = from.div_euclid(86_400) + 1;
    let last = to.div_euclid(86_400);
    let iso = |t: i64| {
        Utc.timestamp_opt(t, 0)
            .single()
            .unwrap_or_default()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    };
    for day in first..last {
        let (start, end) = (iso(day * 86_400), iso((day + 1) * 86_400));
        for h in hosts.iter().filter(|h| h.cloud == Cloud::Aws) {
            let (Some(id), Some(price)) = (
                h.instance_id(),
                gpuledger_ledger::catalog::instance_price(h.instance_type),
            ) else {
                continue;
            };
            let billed = price.usd_per_hour * 24.0;
            let (effective, what) = if h.instance_type.starts_with("p5.") {
                (billed * 0.72, "SavingsPlanCoveredUsage")
            } else {
                (billed, "On Demand Linux")
            };
            let _ = writeln!(
                out,
                "111122223333,{start},{end},{billed:.2},{effective:.2},\
                 arn:aws:ec2:us-east-1:111122223333:instance/{id},\
                 ${} per {what} {} Instance Hour,Amazon Elastic Compute Cloud,AWS",
                price.usd_per_hour, h.instance_type
            );
        }
        let _ = writeln!(
            out,
            "111122223333,{start},{end},136.13,136.13,\
             arn:aws:ec2:us-east-1:111122223333:instance/i-0decommissioned01,\
             $5.672 per On Demand Linux g5.12xlarge Instance Hour,Amazon Elastic Compute Cloud,AWS\n\
             111122223333,{start},{end},2.67,2.67,\
             arn:aws:ec2:us-east-1:111122223333:volume/vol-0data,\
             $0.08 per GB-month of General Purpose SSD (gp3),Amazon Elastic Compute Cloud,AWS"
        );
    }
    out
}

/// The name the history's billing export is imported under.
pub const BILLING_NAME: &str = "demo/focus-aws.csv";

/// The demo's team registry (`GET /api/v1/teams`).
pub fn team_registry() -> BTreeMap<String, gpuledger_model::TeamInfo> {
    let managers = [
        "Ana Ruiz",
        "Ken Ito",
        "Lea Brandt",
        "Omar Haddad",
        "Priya Nair",
        "Sam Okafor",
        "Tomás Silva",
        "Yun Park",
    ];
    TEAMS
        .iter()
        .zip(managers)
        .enumerate()
        .map(|(i, (t, m))| {
            (
                t.to_string(),
                gpuledger_model::TeamInfo {
                    display_name: Some(format!("{}{}", t[..1].to_uppercase(), &t[1..])),
                    manager: Some(m.to_string()),
                    cost_center: Some(format!("CC-{}", 4410 + 10 * i)),
                },
            )
        })
        .collect()
}

/// splitmix64: deterministic noise from a key, independent of call order.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn unit(key: u64) -> f64 {
    (mix(key) >> 11) as f64 / (1u64 << 53) as f64
}

struct Group {
    cluster: &'static str,
    cloud: Cloud,
    region: &'static str,
    source: &'static str,
    instance_type: &'static str,
    model: &'static str,
    memory_mib: u64,
    gpus: u32,
    hosts: u32,
    prefix: &'static str,
    kind: AllocationKind,
}

const GROUPS: &[Group] = &[
    Group {
        cluster: "aws-use1-eks",
        cloud: Cloud::Aws,
        region: "us-east-1",
        source: "aws-eks",
        instance_type: "p5.48xlarge",
        model: "NVIDIA H100 80GB HBM3",
        memory_mib: 81559,
        gpus: 8,
        hosts: 8,
        prefix: "ip-10-1-0",
        kind: AllocationKind::Pod,
    },
    Group {
        cluster: "aws-use1-eks",
        cloud: Cloud::Aws,
        region: "us-east-1",
        source: "aws-eks",
        instance_type: "p4d.24xlarge",
        model: "NVIDIA A100-SXM4-40GB",
        memory_mib: 40960,
        gpus: 8,
        hosts: 4,
        prefix: "ip-10-1-1",
        kind: AllocationKind::Pod,
    },
    Group {
        cluster: "aws-use1-eks",
        cloud: Cloud::Aws,
        region: "us-east-1",
        source: "aws-eks",
        instance_type: "g6e.12xlarge",
        model: "NVIDIA L40S",
        memory_mib: 46068,
        gpus: 4,
        hosts: 6,
        prefix: "ip-10-1-2",
        kind: AllocationKind::Pod,
    },
    Group {
        cluster: "aws-use1-eks",
        cloud: Cloud::Aws,
        region: "us-east-1",
        source: "aws-eks",
        instance_type: "g6.xlarge",
        model: "NVIDIA L4",
        memory_mib: 23034,
        gpus: 1,
        hosts: 20,
        prefix: "ip-10-1-3",
        kind: AllocationKind::Pod,
    },
    Group {
        cluster: "gcp-usc1-gke",
        cloud: Cloud::Gcp,
        region: "us-central1",
        source: "gcp-gke",
        instance_type: "a3-highgpu-8g",
        model: "NVIDIA H100 80GB HBM3",
        memory_mib: 81559,
        gpus: 8,
        hosts: 4,
        prefix: "gke-a3-pool",
        kind: AllocationKind::Pod,
    },
    Group {
        cluster: "gcp-usc1-gke",
        cloud: Cloud::Gcp,
        region: "us-central1",
        source: "gcp-gke",
        instance_type: "g2-standard-48",
        model: "NVIDIA L4",
        memory_mib: 23034,
        gpus: 4,
        hosts: 6,
        prefix: "gke-g2-pool",
        kind: AllocationKind::Pod,
    },
    Group {
        cluster: "gcp-usc1-gke",
        cloud: Cloud::Gcp,
        region: "us-central1",
        source: "gcp-gke",
        instance_type: "n1-standard-16",
        model: "Tesla T4",
        memory_mib: 15360,
        gpus: 2,
        hosts: 10,
        prefix: "gke-t4-pool",
        kind: AllocationKind::Pod,
    },
    Group {
        cluster: "az-eastus-aks",
        cloud: Cloud::Azure,
        region: "eastus",
        source: "azure-aks",
        instance_type: "Standard_ND96isr_H200_v5",
        model: "NVIDIA H200",
        memory_mib: 143771,
        gpus: 8,
        hosts: 4,
        prefix: "aks-h200-vmss",
        kind: AllocationKind::Pod,
    },
    Group {
        cluster: "az-eastus-aks",
        cloud: Cloud::Azure,
        region: "eastus",
        source: "azure-aks",
        instance_type: "Standard_NC96ads_A100_v4",
        model: "NVIDIA A100 80GB PCIe",
        memory_mib: 81920,
        gpus: 4,
        hosts: 4,
        prefix: "aks-a100-vmss",
        kind: AllocationKind::Pod,
    },
    Group {
        cluster: "rdu-slurm",
        cloud: Cloud::Onprem,
        region: "rdu",
        source: "rdu-slurm",
        instance_type: "dgx-h200",
        model: "NVIDIA H200",
        memory_mib: 143771,
        gpus: 8,
        hosts: 10,
        prefix: "rdu-h200",
        kind: AllocationKind::SlurmJob,
    },
    Group {
        cluster: "rdu-slurm",
        cloud: Cloud::Onprem,
        region: "rdu",
        source: "rdu-slurm",
        instance_type: "dgx-a100",
        model: "NVIDIA A100-SXM4-80GB",
        memory_mib: 81920,
        gpus: 8,
        hosts: 4,
        prefix: "rdu-a100",
        kind: AllocationKind::SlurmJob,
    },
    Group {
        cluster: "lab-bench",
        cloud: Cloud::Onprem,
        region: "rdu",
        source: "lab-agents",
        instance_type: "workstation",
        model: "Tesla T4",
        memory_mib: 15360,
        gpus: 4,
        hosts: 8,
        prefix: "lab-ws",
        kind: AllocationKind::Process,
    },
    // Other vendors, after the NVIDIA groups so those keep their hosts and history: AMD
    // Instinct on Azure and beside the T4s of a lab workstation, Intel Gaudi on AWS and
    // on-prem under Slurm.
    Group {
        cluster: "az-eastus-aks",
        cloud: Cloud::Azure,
        region: "eastus",
        source: "azure-aks",
        instance_type: "Standard_ND96isr_MI300X_v5",
        model: "AMD Instinct MI300X",
        memory_mib: 196_592,
        gpus: 8,
        hosts: 2,
        prefix: "aks-mi300x-vmss",
        kind: AllocationKind::Pod,
    },
    Group {
        cluster: "aws-use1-eks",
        cloud: Cloud::Aws,
        region: "us-east-1",
        source: "aws-eks",
        instance_type: "dl1.24xlarge",
        model: "HL-205",
        memory_mib: 32_768,
        gpus: 8,
        hosts: 1,
        prefix: "ip-10-1-4",
        kind: AllocationKind::Pod,
    },
    Group {
        cluster: "rdu-slurm",
        cloud: Cloud::Onprem,
        region: "rdu",
        source: "rdu-slurm",
        instance_type: "gaudi2-node",
        model: "HL-225",
        memory_mib: 98_304,
        gpus: 8,
        hosts: 2,
        prefix: "rdu-gaudi2",
        kind: AllocationKind::SlurmJob,
    },
    Group {
        cluster: "lab-bench",
        cloud: Cloud::Onprem,
        region: "rdu",
        source: "lab-agents",
        instance_type: "workstation",
        model: "AMD Instinct MI210",
        memory_mib: 65_520,
        gpus: 2,
        hosts: 1,
        // The same name as the first T4 workstation: one host with NVIDIA and AMD GPUs side by
        // side, as the agent reads them.
        prefix: "lab-ws",
        kind: AllocationKind::Process,
    },
];

/// The whole fleet for a seed.
pub fn fleet(seed: u64) -> Vec<Host> {
    fleet_of(seed, 1)
}

/// The fleet `copies` times over (the benchmark's larger fleets): each group has `copies` times
/// its hosts, named `<prefix>-NN` as in the demo and `<prefix>-cC-NN` for the copies, with the
/// same mix of profiles, teams and environments.
pub fn fleet_of(seed: u64, copies: u32) -> Vec<Host> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut hosts = Vec::new();
    for g in GROUPS {
        for n in 0..g.hosts * copies.max(1) {
            let (copy, i) = (n / g.hosts, n % g.hosts);
            let index = hosts.len() as u64 + seed.wrapping_mul(7919);
            // Slurm and the research-heavy H100/H200 pools train; small GPUs serve or develop.
            let profile = match (g.cluster, g.model, rng.random_range(0..100)) {
                (_, _, 0..=4) => Profile::Idle,
                (_, _, 5..=9) => Profile::AllocatedIdle,
                ("rdu-slurm", _, _) => Profile::Training,
                ("az-eastus-aks", "NVIDIA A100 80GB PCIe", 10..=60) => Profile::NoUtil,
                (_, "NVIDIA H100 80GB HBM3", 10..=49) => Profile::Training,
                (_, "NVIDIA L4" | "Tesla T4", 10..=59) => Profile::Steady,
                ("gcp-usc1-gke", _, 60..=79) => Profile::Bursty,
                (_, _, 10..=49) => Profile::Steady,
                _ => Profile::Workday,
            };
            let team = match profile {
                Profile::Bursty => Some("recsys"),
                Profile::Training if g.cluster == "rdu-slurm" => {
                    Some(["research", "nlp", "robotics"][rng.random_range(0..3)])
                }
                _ if rng.random_range(0..100) < 6 => None,
                _ => Some(TEAMS[rng.random_range(0..TEAMS.len())]),
            };
            let env = match (profile, rng.random_range(0..100)) {
                (_, 0..=3) => None,
                (Profile::Steady, _) => Some("prod"),
                (Profile::Workday | Profile::AllocatedIdle, 4..=69) => Some("dev"),
                (Profile::Workday | Profile::AllocatedIdle, _) => Some("poc"),
                (Profile::Idle, 4..=49) => Some("poc"),
                (_, 4..=59) => Some("prod"),
                _ => Some("dev"),
            };
            let mig = (g.model == "NVIDIA A100-SXM4-40GB" && i == 0).then_some("3g.20gb");
            hosts.push(Host {
                name: if copy == 0 {
                    format!("{}-{:02}", g.prefix, i + 1)
                } else {
                    format!("{}-c{copy}-{:02}", g.prefix, i + 1)
                },
                cluster: g.cluster,
                cloud: g.cloud,
                region: g.region,
                instance_type: g.instance_type,
                model: g.model,
                memory_mib: g.memory_mib,
                gpus: g.gpus,
                source: g.source,
                team,
                env,
                profile,
                mig_profile: mig,
                kind: g.kind,
                index,
            });
        }
    }
    hosts
}

/// Activity (percent) of one GPU at `ts`, or `None` for hosts that report no utilization.
pub fn activity(h: &Host, gpu: u32, ts: i64) -> Option<f64> {
    let t = Utc.timestamp_opt(ts, 0).single()?;
    let key = h.index * 1_000_003 + gpu as u64;
    let noise = unit(key ^ (ts as u64 / 60)) * 6.0 - 3.0;
    // Teams work US Eastern hours: 09:00–18:00 = 14:00–23:00 UTC, Monday to Friday.
    let local = (t - Duration::hours(5)).with_timezone(&Utc);
    let weekday = local.weekday().num_days_from_monday() < 5;
    let work = weekday && (9..18).contains(&local.hour());
    let day = ts.div_euclid(86_400) as u64;
    let v = match h.profile {
        Profile::NoUtil => return None,
        Profile::Idle => unit(key ^ day) * 1.5,
        Profile::AllocatedIdle => 0.5 + unit(key ^ (ts as u64 / 3600)) * 2.5,
        Profile::Steady => {
            let diurnal = if work {
                18.0
            } else if weekday {
                4.0
            } else {
                -8.0
            };
            55.0 + diurnal + unit(key ^ day) * 12.0 + noise
        }
        Profile::Workday => {
            if work {
                45.0 + unit(key ^ (ts as u64 / 3600)) * 45.0
            } else {
                unit(key ^ (ts as u64 / 3600)) * 3.0
            }
        }
        Profile::Training => {
            if training_running(h, ts) {
                88.0 + unit(key ^ (ts as u64 / 3600)) * 10.0 + noise / 2.0
            } else {
                unit(key ^ day) * 2.0
            }
        }
        Profile::Bursty => {
            if burst(h, ts) {
                90.0 + unit(key ^ (ts as u64 / 3600)) * 8.0
            } else {
                1.0 + unit(key ^ (ts as u64 / 3600)) * 3.0
            }
        }
    };
    Some(v.clamp(0.0, 100.0))
}

/// Training runs of one host: blocks of 2–5 days with up to 2 idle days between, anchored to
/// a fixed epoch so that live samples continue the history.
fn training_blocks(h: &Host, to: i64) -> impl Iterator<Item = (i64, i64)> + '_ {
    const EPOCH: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z
    let mut t = EPOCH + (unit(h.index ^ 0xabc) * 86_400.0) as i64;
    let mut n = 0u64;
    std::iter::from_fn(move || {
        if t >= to {
            return None;
        }
        let run = ((2.0 + unit(h.index * 31 + n) * 3.0) * 86_400.0) as i64;
        let gap = (unit(h.index * 37 + n) * 2.0 * 86_400.0) as i64 + 1800;
        let block = (t, t + run);
        t += run + gap;
        n += 1;
        Some(block)
    })
}

fn training_running(h: &Host, ts: i64) -> bool {
    training_blocks(h, ts + 1).any(|(s, e)| ts >= s && ts < e)
}

/// Bursts: on about three days a week, 6–12 hours of heavy use starting mid-morning.
fn burst_window(h: &Host, day: i64) -> Option<(i64, i64)> {
    let d = day as u64;
    if unit(h.index ^ (d * 13)) > 0.45 {
        return None;
    }
    let start = day * 86_400 + 14 * 3600 + (unit(h.index ^ d) * 4.0 * 3600.0) as i64;
    let len = 6 * 3600 + (unit((h.index * 3) ^ d) * 6.0 * 3600.0) as i64;
    Some((start, start + len))
}

fn burst(h: &Host, ts: i64) -> bool {
    burst_window(h, ts.div_euclid(86_400)).is_some_and(|(s, e)| ts >= s && ts < e)
}

/// Allocation intervals of one GPU in `[from, to)`; `None` end = still running at `to`.
pub fn allocations(h: &Host, gpu: u32, from: i64, to: i64) -> Vec<(i64, Option<i64>, String)> {
    let team = h.team.unwrap_or("shared");
    let ns = format!("{team}-{}", h.env.unwrap_or("dev"));
    let mut out = Vec::new();
    match h.profile {
        Profile::Idle => {}
        Profile::Steady | Profile::NoUtil => {
            out.push((from, None, format!("{ns}/serve-{}-{gpu}", h.name)));
        }
        Profile::AllocatedIdle => {
            out.push((from, None, format!("{ns}/notebook-{}", h.name)));
        }
        Profile::Workday => {
            let mut d = from.div_euclid(86_400) * 86_400;
            while d < to {
                let s = d + 14 * 3600;
                let e = d + 23 * 3600;
                let date = Utc.timestamp_opt(d, 0).single().unwrap_or_default();
                if date.weekday().num_days_from_monday() < 5 && s >= from && s < to {
                    let end = (e <= to).then_some(e);
                    out.push((
                        s,
                        end,
                        format!("{ns}/dev-{}-{}", h.name, date.format("%m%d")),
                    ));
                }
                d += 86_400;
            }
        }
        Profile::Training => {
            for (s, e) in training_blocks(h, to).filter(|(_, e)| *e > from) {
                let end = (e <= to).then_some(e);
                let id = if h.kind == AllocationKind::SlurmJob {
                    format!(
                        "{}",
                        400_000 + (h.index % 1000) * 1000 + ((s / 3600) % 1000) as u64
                    )
                } else {
                    format!("{ns}/train-{}-{}", h.name, s / 3600)
                };
                out.push((s, end, id));
            }
        }
        Profile::Bursty => {
            for day in from.div_euclid(86_400)..=to.div_euclid(86_400) {
                if let Some((s, e)) = burst_window(h, day).filter(|(s, _)| *s >= from && *s < to) {
                    out.push((
                        s,
                        (e <= to).then_some(e),
                        format!("{ns}/burst-{}-{day}", h.name),
                    ));
                }
            }
        }
    }
    out
}

pub fn sample(h: &Host, gpu: u32, uuid: &str, ts: i64) -> PushSample {
    let act = activity(h, gpu, ts);
    let load = act.unwrap_or(40.0 + unit(h.index ^ ts as u64) * 20.0) / 100.0;
    let mem = (h.memory_mib as f64 * (0.04 + 0.85 * load)).round();
    let power = match h.model {
        m if m.contains("H100") || m.contains("H200") => 70.0 + 600.0 * load,
        m if m.contains("A100") => 55.0 + 340.0 * load,
        m if m.contains("L40S") => 35.0 + 310.0 * load,
        m if m.contains("MI300X") => 140.0 + 610.0 * load,
        m if m.contains("HL-2") => 80.0 + 520.0 * load,
        _ => 16.0 + 55.0 * load,
    };
    PushSample {
        gpu_uuid: uuid.to_string(),
        ts: Utc.timestamp_opt(ts, 0).single().unwrap_or_default(),
        util_pct: act.map(|a| (a * 10.0).round() / 10.0),
        mem_used_mib: Some(mem),
        power_w: Some((power * 10.0_f64).round() / 10.0),
        sm_active: None,
    }
}

/// Inventory records of a host at `at`: its GPUs and any MIG instances.
pub fn inventory(h: &Host, at: DateTime<Utc>) -> Vec<PushGpu> {
    let mut out = Vec::new();
    for gpu in 0..h.gpus {
        let mut labels = BTreeMap::new();
        if let Some(t) = h.team {
            labels.insert("team".to_string(), t.to_string());
        }
        if let Some(e) = h.env {
            labels.insert("env".to_string(), e.to_string());
        }
        if let Some(id) = h.instance_id() {
            labels.insert("instance_id".to_string(), id);
        }
        let uuid = h.uuid(gpu);
        out.push(PushGpu {
            account: h.account().map(String::from),
            uuid: uuid.clone(),
            model: h.model.to_string(),
            memory_mib: Some(h.memory_mib),
            host: Some(h.name.clone()),
            cluster: Some(h.cluster.to_string()),
            cloud: Some(h.cloud),
            region: Some(h.region.to_string()),
            instance_type: Some(h.instance_type.to_string()),
            serial: Some(h.serial(gpu)),
            pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + gpu * 0x10)),
            mig_parent_uuid: None,
            mig_profile: None,
            labels: labels.clone(),
            observed_at: at,
        });
        if let Some(profile) = h.mig_profile {
            for inst in 0..2 {
                out.push(PushGpu {
                    account: h.account().map(String::from),
                    uuid: h.mig_uuid(gpu, inst),
                    model: h.model.to_string(),
                    memory_mib: Some(h.memory_mib / 2 - 512),
                    host: Some(h.name.clone()),
                    cluster: Some(h.cluster.to_string()),
                    cloud: Some(h.cloud),
                    region: Some(h.region.to_string()),
                    instance_type: None,
                    serial: None,
                    pci_bus_id: None,
                    mig_parent_uuid: Some(uuid.clone()),
                    mig_profile: Some(profile.to_string()),
                    labels: labels.clone(),
                    observed_at: at,
                });
            }
        }
    }
    out
}

/// One body per host with its inventory, hourly samples and allocations over `[from, to)`.
pub fn history_body(h: &Host, from: i64, to: i64) -> PushBody {
    let at = Utc.timestamp_opt(from, 0).single().unwrap_or_default();
    let mut body = PushBody {
        gpus: inventory(h, at),
        ..Default::default()
    };
    for gpu in 0..h.gpus {
        let uuid = h.uuid(gpu);
        let mut ts = gpuledger_model::hour_floor(from) + 30 * 60;
        while ts < to {
            body.samples.push(sample(h, gpu, &uuid, ts));
            ts += HOUR_SECS;
        }
        for (s, e, workload) in allocations(h, gpu, from, to) {
            body.allocations.push(PushAllocation {
                context: h.workload_context(&workload),
                gpu_uuid: uuid.clone(),
                start: Utc.timestamp_opt(s, 0).single().unwrap_or_default(),
                end: e.and_then(|e| Utc.timestamp_opt(e, 0).single()),
                workload,
                kind: h.kind,
                user: h.team.map(|t| {
                    format!(
                        "{t}-{}",
                        ["ana", "bo", "chen", "dev"][(h.index % 4) as usize]
                    )
                }),
                team: h.team.map(String::from),
                owner: None,
                avg_util_pct: None,
                avg_mem_used_mib: None,
            });
        }
    }
    body
}

/// For a host installed during the history, how many days before its end it arrived: the
/// MI300X capacity came 12 days ago, so the fleet's daily cost steps up mid-history (and a
/// forecast made before then misses it, as a real one would). `None`: there all along.
pub fn arrived_days_ago(h: &Host) -> Option<i64> {
    h.model.contains("MI300X").then_some(12)
}

/// Where a host's part of the history `[from, to)` starts: `from`, or the hour it arrived
/// ([`arrived_days_ago`]).
pub fn history_start(h: &Host, from: i64, to: i64) -> i64 {
    arrived_days_ago(h).map_or(from, |d| {
        gpuledger_model::hour_floor(to - d * 86_400).max(from)
    })
}

/// The history of several hosts split into one body per UTC day: inventory in the first,
/// each sample in its day's body, each allocation in the body of the day it starts. A host
/// that arrived during `[from, to)` ([`arrived_days_ago`]) starts there.
pub fn daily_bodies(hosts: &[&Host], from: i64, to: i64) -> Vec<PushBody> {
    let first_day = from.div_euclid(86_400);
    let days = (to.div_euclid(86_400) - first_day + 1).max(1) as usize;
    let mut out: Vec<PushBody> = vec![PushBody::default(); days];
    let day_of = |ts: i64| ((ts.div_euclid(86_400) - first_day).max(0) as usize).min(days - 1);
    for h in hosts {
        let body = history_body(h, history_start(h, from, to), to);
        out[0].gpus.extend(body.gpus);
        for s in body.samples {
            out[day_of(s.ts.timestamp())].samples.push(s);
        }
        for a in body.allocations {
            out[day_of(a.start.timestamp())].allocations.push(a);
        }
    }
    out.retain(|b| !b.is_empty());
    out.into_iter().flat_map(split_body).collect()
}

/// Records per body at most, so a large fleet's day stays under the push size limit.
pub const MAX_RECORDS: usize = 20_000;

/// `body` as pushes of at most [`MAX_RECORDS`] records each, in order: its GPUs first (a
/// sample's GPU is then known), then its samples and allocations. A small day stays one body,
/// as a source would send it.
fn split_body(body: PushBody) -> Vec<PushBody> {
    if body.gpus.len() + body.samples.len() + body.allocations.len() <= MAX_RECORDS {
        return vec![body];
    }
    let mut out: Vec<PushBody> = Vec::new();
    for chunk in body.gpus.chunks(MAX_RECORDS / 4) {
        out.push(PushBody {
            gpus: chunk.to_vec(),
            ..Default::default()
        });
    }
    for chunk in body.samples.chunks(MAX_RECORDS) {
        out.push(PushBody {
            samples: chunk.to_vec(),
            ..Default::default()
        });
    }
    for chunk in body.allocations.chunks(MAX_RECORDS) {
        out.push(PushBody {
            allocations: chunk.to_vec(),
            ..Default::default()
        });
    }
    out
}

/// The demo's tokens, one per source.
pub struct Demo {
    pub hosts: Vec<Host>,
    pub tokens: BTreeMap<&'static str, String>,
    pub push_token: String,
    /// How long the history's billing export took to import, within [`load_hosts`].
    pub billing: std::time::Duration,
}

async fn send(state: &AppState, token: &str, body: &PushBody) -> anyhow::Result<()> {
    let bytes = serde_json::to_vec(body)?;
    let reply =
        gpuledger_web::ingest_bytes(state, Some(token), None, Some("gpuledger-demo"), &bytes).await;
    if reply.status != gpuledger_web::StatusCode::OK {
        anyhow::bail!("demo push refused ({}): {}", reply.status, reply.body);
    }
    if let Some(rejected) = reply.body["rejected"].as_array().filter(|r| !r.is_empty()) {
        anyhow::bail!(
            "demo push had rejected records: {}",
            serde_json::Value::Array(rejected.clone())
        );
    }
    Ok(())
}

/// The store and server state the demo and the benchmark run on: demo ownership rules and
/// team registry, raw samples kept for the whole history (`days`), on `url` or a fresh SQLite
/// file named after `what` in the temp directory. Returns the URL used too.
pub async fn open(
    url: Option<String>,
    days: i64,
    what: &str,
) -> anyhow::Result<(gpuledger_store::Store, AppState, String)> {
    use anyhow::Context;
    let mut settings = gpuledger_ledger::Settings::default();
    // The history is pushed as raw samples, so keep raw samples that long.
    settings.raw_retention_days = settings.raw_retention_days.max(days + 2);
    settings.ownership = ownership_rules();
    let url = url.unwrap_or_else(|| {
        let path = std::env::temp_dir().join(format!("gpuledger-{what}-{}.db", std::process::id()));
        path.display().to_string()
    });
    let store = gpuledger_store::Store::open(&url, settings)
        .await
        .with_context(|| format!("opening database {url}"))?;
    let state = AppState::new(
        store.clone(),
        gpuledger_web::WebConfig {
            demo: true,
            teams: team_registry(),
            ..Default::default()
        },
    );
    Ok((store, state, url))
}

/// Mint tokens and load 30 days of history through the ingest path.
pub async fn load(state: &AppState, seed: u64, days: i64) -> anyhow::Result<Demo> {
    load_hosts(state, fleet(seed), days).await
}

/// Mint tokens and load `days` of history of `hosts` through the ingest path.
pub async fn load_hosts(state: &AppState, hosts: Vec<Host>, days: i64) -> anyhow::Result<Demo> {
    let mut tokens = BTreeMap::new();
    for (source, _) in SOURCES {
        tokens.insert(
            *source,
            state.store.create_token(Role::Ingest, source, &[]).await?,
        );
    }
    let push_token = state
        .store
        .create_token(Role::Ingest, "demo-push", &[])
        .await?;
    let now = state.now();
    let from = gpuledger_model::hour_floor((now - Duration::days(days)).timestamp());
    for (source, _) in SOURCES {
        let stale = *source == STALE_SOURCE;
        let to = if stale {
            now.timestamp() - STALE_FOR_SECS
        } else {
            now.timestamp()
        };
        let mine: Vec<&Host> = hosts.iter().filter(|h| h.source == *source).collect();
        // A day per body, in time order, as a source catching up would send it.
        for body in daily_bodies(&mine, from, to) {
            if stale {
                // This source really did last report three hours ago: its pushes carry that clock.
                let then = now - Duration::seconds(STALE_FOR_SECS);
                let past = AppState {
                    clock: Arc::new(move || then),
                    ..state.clone()
                };
                send(&past, &tokens[source], &body).await?;
            } else {
                send(state, &tokens[source], &body).await?;
            }
        }
    }
    // What AWS billed for the complete days, so costs show what was billed beside them.
    let export = focus_export(&hosts, from, now.timestamp());
    let started = std::time::Instant::now();
    let done = state
        .store
        .import_billing(BILLING_NAME, &export, now, false)
        .await?;
    tracing::info!(
        matched = done.report.matched_lines,
        unmatched = done.report.unmatched.len(),
        "demo billing export reconciled"
    );
    Ok(Demo {
        hosts,
        tokens,
        push_token,
        billing: started.elapsed(),
    })
}

/// One live round: a sample per GPU (all sources but the stale one), and inventory every
/// tenth minute.
pub async fn live_round(state: &AppState, demo: &Demo, at: DateTime<Utc>) -> anyhow::Result<()> {
    let mut bodies: BTreeMap<&str, PushBody> = BTreeMap::new();
    let with_inventory = at.minute().is_multiple_of(10);
    for h in demo.hosts.iter().filter(|h| h.source != STALE_SOURCE) {
        let body = bodies.entry(h.source).or_default();
        if with_inventory {
            body.gpus.extend(inventory(h, at));
        }
        for gpu in 0..h.gpus {
            body.samples
                .push(sample(h, gpu, &h.uuid(gpu), at.timestamp()));
        }
    }
    for (source, body) in bodies {
        send(state, &demo.tokens[source], &body).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_is_deterministic_and_large_enough() {
        let a = fleet(42);
        let b = fleet(42);
        assert_eq!(a.len(), b.len());
        assert!(a
            .iter()
            .zip(&b)
            .all(|(x, y)| x.name == y.name && x.team == y.team && x.profile == y.profile));
        let gpus: u32 = a.iter().map(|h| h.gpus).sum();
        assert!(gpus >= 400, "{gpus}");
        let teams: std::collections::BTreeSet<_> = a.iter().filter_map(|h| h.team).collect();
        assert_eq!(teams.len(), 8, "{teams:?}");
        for p in [
            Profile::Idle,
            Profile::AllocatedIdle,
            Profile::Bursty,
            Profile::Training,
            Profile::Steady,
            Profile::Workday,
            Profile::NoUtil,
        ] {
            assert!(a.iter().any(|h| h.profile == p), "{p:?} missing");
        }
        assert!(a.iter().any(|h| h.mig_profile.is_some()));
        assert_ne!(fleet(7)[0].uuid(0), a[0].uuid(0));
    }

    #[test]
    fn hosts_that_arrived_during_the_history_start_there() {
        let hosts = fleet(42);
        let mi300x: Vec<&Host> = hosts
            .iter()
            .filter(|h| h.model.contains("MI300X"))
            .collect();
        let other: Vec<&Host> = hosts
            .iter()
            .filter(|h| h.model.contains("H100"))
            .take(1)
            .collect();
        assert!(!mi300x.is_empty());
        let to = 1_764_633_600 + 30 * 86_400;
        let from = to - 30 * 86_400;
        let first = |hs: &[&Host]| {
            daily_bodies(hs, from, to)
                .iter()
                .flat_map(|b| b.samples.iter().map(|s| s.ts.timestamp()))
                .min()
                .unwrap()
        };
        assert_eq!(first(&mi300x) / 3600 * 3600, to - 12 * 86_400);
        assert_eq!(first(&other) / 3600 * 3600, from);
    }

    #[test]
    fn history_bodies_are_valid_pushes() {
        let hosts = fleet(42);
        let now = Utc::now().timestamp();
        for h in hosts.iter().take(20) {
            let body = history_body(h, now - 3 * 86_400, now);
            let json = serde_json::to_vec(&body).unwrap();
            let map = gpuledger_ledger::decode_body(&json, None, Default::default()).unwrap();
            let v = gpuledger_ledger::validate_body(map, Utc::now(), 300);
            assert!(v.rejections.is_empty(), "{}: {:?}", h.name, v.rejections);
        }
    }

    #[test]
    fn workday_hosts_are_busier_in_working_hours() {
        let hosts = fleet(42);
        let h = hosts
            .iter()
            .find(|h| h.profile == Profile::Workday)
            .unwrap();
        // Wednesday 2026-12-02: 16:00 UTC is 11:00 Eastern; 06:00 UTC is 01:00 Eastern.
        let day = Utc
            .with_ymd_and_hms(2026, 12, 2, 16, 0, 0)
            .unwrap()
            .timestamp();
        let night = Utc
            .with_ymd_and_hms(2026, 12, 2, 6, 0, 0)
            .unwrap()
            .timestamp();
        assert!(activity(h, 0, day).unwrap() > 40.0);
        assert!(activity(h, 0, night).unwrap() < 5.0);
    }
}
