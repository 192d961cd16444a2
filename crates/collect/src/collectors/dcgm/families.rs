//! The metric families the `dcgm` collector reads, per exporter: NVIDIA dcgm-exporter
//! (`DCGM_FI_*`), AMD's device-metrics-exporter (`gpu_*`) and the Intel Gaudi metric exporter
//! (`habanalabs_*`): each family's unit, which families feed which sample field, and how each
//! exporter's labels name a device. Pure data and label reading; [`super::parse`] maps series
//! to gpuledger's records with it.
//!
//! Sources of the names, units and labels: dcgm-exporter's `default-counters.csv`; AMD's
//! `docs/configuration/metricslist.md` and `configmap.md` (ROCm/device-metrics-exporter) and
//! the corpus; Intel's Gaudi metric exporter (`habanalabs_*` names and `Serial`, `UUID`,
//! `device`, `id`, `driver`, `pod_namespace`, `pod_name` labels, as its source declares them).

use std::collections::{BTreeMap, BTreeSet};

use gpuledger_model::accel::{self, Vendor};

/// Graphics-engine activity, a ratio 0..=1 (dcgm-exporter's HELP says "in %", the values are ratios).
pub const GR_ENGINE_ACTIVE: &str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE";
/// SM activity, a ratio 0..=1.
pub const SM_ACTIVE: &str = "DCGM_FI_PROF_SM_ACTIVE";
/// NVML's coarse utilization, percent 0..=100.
pub const GPU_UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
/// Framebuffer used, MiB.
pub const FB_USED: &str = "DCGM_FI_DEV_FB_USED";
/// Framebuffer free, MiB.
pub const FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";
/// Framebuffer reserved by the driver, MiB (DCGM 3.x and later).
pub const FB_RESERVED: &str = "DCGM_FI_DEV_FB_RESERVED";
/// Board power draw, W.
pub const POWER_USAGE: &str = "DCGM_FI_DEV_POWER_USAGE";
/// The metric-name prefix of DCGM fields.
pub const DCGM_PREFIX: &str = "DCGM_FI_";

/// AMD graphics-engine activity, percent of time busy (amd-smi's `gfx_activity`; on a
/// partitioned GPU, the partition's own).
pub const AMD_GFX_ACTIVITY: &str = "gpu_gfx_activity";
/// The early exporter's activity: "percentage of time the GPU is busy".
pub const AMD_USAGE: &str = "gpu_usage";
/// VRAM used, in amd-smi's MB (2^20 bytes).
pub const AMD_USED_VRAM: &str = "gpu_used_vram";
/// VRAM total, in amd-smi's MB (2^20 bytes).
pub const AMD_TOTAL_VRAM: &str = "gpu_total_vram";
/// The early exporter's VRAM total "in MB": 10^6 bytes (the corpus's 68702 is an MI210's
/// 68,702,699,520 bytes, which rocm-smi prints).
pub const AMD_TOTAL_MEMORY: &str = "gpu_total_memory";
/// Current socket power, W (MI3xx).
pub const AMD_PACKAGE_POWER: &str = "gpu_package_power";
/// GPU power usage, W (MI2xx, MI3xx).
pub const AMD_POWER_USAGE: &str = "gpu_power_usage";
/// Average socket power, W (MI2xx).
pub const AMD_AVERAGE_PACKAGE_POWER: &str = "gpu_average_package_power";
/// The prefix of every AMD family.
pub const AMD_PREFIX: &str = "gpu_";
/// The exporter's `MetricsFieldPrefix` setting puts a prefix before every family; `amd_` is the
/// one deployments are seen to use, and the only one recognized.
pub const AMD_OPTIONAL_PREFIX: &str = "amd_";

/// Gaudi utilization, percent of time busy (hl-smi's AIP utilization).
pub const GAUDI_UTILIZATION: &str = "habanalabs_utilization";
/// HBM used, bytes.
pub const GAUDI_MEMORY_USED: &str = "habanalabs_memory_used_bytes";
/// HBM total, bytes.
pub const GAUDI_MEMORY_TOTAL: &str = "habanalabs_memory_total_bytes";
/// Power draw, mW.
pub const GAUDI_POWER: &str = "habanalabs_power_mW";
/// The exporter's own pod and node (`podName`, `namespace`, `node`, ...): no device.
pub const GAUDI_KUBE_INFO: &str = "habanalabs_kube_info";
/// The prefix of every Gaudi family.
pub const GAUDI_PREFIX: &str = "habanalabs_";

/// The unit a family's values are in; [`Unit::convert`] turns them into gpuledger's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// 0..=1, kept as a ratio.
    Ratio,
    /// 0..=100.
    Pct,
    /// MiB (2^20 bytes).
    Mib,
    /// MB of 10^6 bytes, converted to MiB.
    DecimalMb,
    /// Bytes, converted to MiB.
    Bytes,
    /// W.
    Watts,
    /// mW, converted to W.
    MilliWatts,
}

/// The most memory a device plausibly has, MiB (16 TiB).
pub const MAX_MIB: f64 = 16.0 * 1024.0 * 1024.0;
/// The most power a device plausibly draws, W.
pub const MAX_WATTS: f64 = 10_000.0;

impl Unit {
    /// The value in gpuledger's unit: a ratio, percent, MiB or W.
    pub fn convert(self, v: f64) -> f64 {
        match self {
            Unit::Ratio | Unit::Pct | Unit::Mib | Unit::Watts => v,
            Unit::DecimalMb => v * 1e6 / 1_048_576.0,
            Unit::Bytes => v / 1_048_576.0,
            Unit::MilliWatts => v / 1000.0,
        }
    }

    /// The range a converted value must be in, and how to say it. A ratio may be a hair over
    /// 1 (float noise, not a fault).
    pub fn range(self) -> (f64, f64, &'static str) {
        match self {
            Unit::Ratio => (0.0, 1.001, "0..=1"),
            Unit::Pct => (0.0, 100.0, "0..=100"),
            Unit::Mib | Unit::DecimalMb | Unit::Bytes => (0.0, MAX_MIB, "0..=16777216 MiB"),
            Unit::Watts | Unit::MilliWatts => (0.0, MAX_WATTS, "0..=10000 W"),
        }
    }
}

/// Every family whose value gpuledger reads, with its unit; the others only prove that a
/// device exists.
pub const READS: [(&str, Vendor, Unit); 19] = [
    (GR_ENGINE_ACTIVE, Vendor::Nvidia, Unit::Ratio),
    (SM_ACTIVE, Vendor::Nvidia, Unit::Ratio),
    (GPU_UTIL, Vendor::Nvidia, Unit::Pct),
    (FB_USED, Vendor::Nvidia, Unit::Mib),
    (FB_FREE, Vendor::Nvidia, Unit::Mib),
    (FB_RESERVED, Vendor::Nvidia, Unit::Mib),
    (POWER_USAGE, Vendor::Nvidia, Unit::Watts),
    (AMD_GFX_ACTIVITY, Vendor::Amd, Unit::Pct),
    (AMD_USAGE, Vendor::Amd, Unit::Pct),
    (AMD_USED_VRAM, Vendor::Amd, Unit::Mib),
    (AMD_TOTAL_VRAM, Vendor::Amd, Unit::Mib),
    (AMD_TOTAL_MEMORY, Vendor::Amd, Unit::DecimalMb),
    (AMD_PACKAGE_POWER, Vendor::Amd, Unit::Watts),
    (AMD_POWER_USAGE, Vendor::Amd, Unit::Watts),
    (AMD_AVERAGE_PACKAGE_POWER, Vendor::Amd, Unit::Watts),
    (GAUDI_UTILIZATION, Vendor::Intel, Unit::Pct),
    (GAUDI_MEMORY_USED, Vendor::Intel, Unit::Bytes),
    (GAUDI_MEMORY_TOTAL, Vendor::Intel, Unit::Bytes),
    (GAUDI_POWER, Vendor::Intel, Unit::MilliWatts),
];

/// The metric names a Prometheus is asked for: every read family (AMD's also with the `amd_`
/// prefix) and the Gaudi exporter's `habanalabs_kube_info`, which names its node.
pub fn query_metrics() -> Vec<String> {
    let mut out: Vec<String> = READS.iter().map(|(m, _, _)| m.to_string()).collect();
    out.extend(
        READS
            .iter()
            .filter(|(_, v, _)| *v == Vendor::Amd)
            .map(|(m, _, _)| format!("{AMD_OPTIONAL_PREFIX}{m}")),
    );
    out.push(GAUDI_KUBE_INFO.to_string());
    out
}

/// The read family a metric name is (AMD's with or without `amd_`), as its canonical name.
pub fn read_family(metric: &str) -> Option<(&'static str, Vendor, Unit)> {
    let name = metric.strip_prefix(AMD_OPTIONAL_PREFIX).unwrap_or(metric);
    READS
        .iter()
        .find(|(m, v, _)| *m == name && (*v == Vendor::Amd || name.len() == metric.len()))
        .copied()
}

/// Which exporter a series comes from, by its name alone: `DCGM_FI_*` is dcgm-exporter's,
/// `habanalabs_*` the Gaudi exporter's, `gpu_*` (or `amd_gpu_*`) AMD's. `gpu_*` is a common
/// word, so AMD series are read only from answers that hold one of AMD's read families (see
/// [`vendors_present`]).
pub fn vendor_of(metric: &str) -> Option<Vendor> {
    if metric.starts_with(DCGM_PREFIX) {
        Some(Vendor::Nvidia)
    } else if metric.starts_with(GAUDI_PREFIX) {
        Some(Vendor::Intel)
    } else if metric
        .strip_prefix(AMD_OPTIONAL_PREFIX)
        .unwrap_or(metric)
        .starts_with(AMD_PREFIX)
    {
        Some(Vendor::Amd)
    } else {
        None
    }
}

/// The exporters an answer holds series of: a dcgm-exporter target, an AMD one, a Gaudi one,
/// or a Prometheus holding several.
pub fn vendors_present<'a>(metrics: impl IntoIterator<Item = &'a str>) -> BTreeSet<Vendor> {
    let mut out = BTreeSet::new();
    for m in metrics {
        match vendor_of(m) {
            // `gpu_*` is a common word: only AMD's read families tell its exporter.
            Some(Vendor::Amd) if read_family(m).is_none() => {}
            Some(Vendor::Intel) if m == GAUDI_KUBE_INFO => {}
            Some(v) => {
                out.insert(v);
            }
            None => {}
        }
    }
    out
}

/// What the families looked for are, for an error that found none of them.
pub const LOOKED_FOR: &str = "dcgm-exporter's `DCGM_FI_*`, AMD device-metrics-exporter's \
    `gpu_gfx_activity`, `gpu_usage`, `gpu_used_vram`, `gpu_total_vram`, `gpu_total_memory`, \
    `gpu_package_power`, `gpu_power_usage`, `gpu_average_package_power` (or `amd_gpu_*`), the \
    Gaudi metric exporter's `habanalabs_*`";

/// How total memory is known.
#[derive(Debug, Clone, Copy)]
pub enum Memory {
    /// used + free (+ reserved where reported), when used and free are known (DCGM).
    UsedPlusFree {
        used: &'static str,
        free: &'static str,
        reserved: &'static str,
    },
    /// The first known of these totals.
    Total(&'static [&'static str]),
}

/// One pod label spelling: (pod, namespace, container).
pub type PodSpelling = (&'static str, &'static str, &'static str);

/// Which families feed which sample field for one exporter, best first, and the labels that
/// name a workload.
#[derive(Debug)]
pub struct Profile {
    pub vendor: Vendor,
    /// Busy-time activity for `util_pct`, best first.
    pub activity: &'static [&'static str],
    /// SM activity (a ratio), where the exporter has it.
    pub sm_active: &'static [&'static str],
    pub mem_used: &'static [&'static str],
    pub power: &'static [&'static str],
    pub memory: Memory,
    /// Pod label spellings, in order of preference.
    pub pods: &'static [PodSpelling],
    /// The label naming an HPC (Slurm) job.
    pub job: Option<&'static str>,
    /// What a device with only child series (MIG instances, partitions) is said to have.
    pub only_children: &'static str,
}

/// The label spellings of a pod across dcgm-exporter versions and Prometheus relabelling, in
/// order of preference: Prometheus renames the exporter's `pod` to `exported_pod` when its own
/// target label (the exporter's pod) would clash.
const DCGM_PODS: [PodSpelling; 3] = [
    ("exported_pod", "exported_namespace", "exported_container"),
    ("pod", "namespace", "container"),
    ("pod_name", "pod_namespace", "container_name"),
];

/// AMD's exporter writes `pod`, `namespace`, `container` (upper-case in early versions, read
/// lower-cased); through a Prometheus, `exported_*` as for dcgm-exporter.
const AMD_PODS: [PodSpelling; 2] = [
    ("exported_pod", "exported_namespace", "exported_container"),
    ("pod", "namespace", "container"),
];

/// The Gaudi exporter writes `pod_name` and `pod_namespace`; a `pod` label on its series is a
/// Prometheus target label (the exporter's own pod), never the workload's.
const GAUDI_PODS: [PodSpelling; 1] = [("pod_name", "pod_namespace", "container_name")];

pub const DCGM: Profile = Profile {
    vendor: Vendor::Nvidia,
    activity: &[GR_ENGINE_ACTIVE, GPU_UTIL],
    sm_active: &[SM_ACTIVE],
    mem_used: &[FB_USED],
    power: &[POWER_USAGE],
    memory: Memory::UsedPlusFree {
        used: FB_USED,
        free: FB_FREE,
        reserved: FB_RESERVED,
    },
    pods: &DCGM_PODS,
    job: Some("hpc_job"),
    only_children: "only MIG instance series: no value for the whole GPU",
};

pub const AMD: Profile = Profile {
    vendor: Vendor::Amd,
    activity: &[AMD_GFX_ACTIVITY, AMD_USAGE],
    sm_active: &[],
    mem_used: &[AMD_USED_VRAM],
    power: &[
        AMD_PACKAGE_POWER,
        AMD_POWER_USAGE,
        AMD_AVERAGE_PACKAGE_POWER,
    ],
    memory: Memory::Total(&[AMD_TOTAL_VRAM, AMD_TOTAL_MEMORY]),
    pods: &AMD_PODS,
    job: Some("job_id"),
    only_children: "only compute partition series: no value for the whole GPU",
};

pub const GAUDI: Profile = Profile {
    vendor: Vendor::Intel,
    activity: &[GAUDI_UTILIZATION],
    sm_active: &[],
    mem_used: &[GAUDI_MEMORY_USED],
    power: &[GAUDI_POWER],
    memory: Memory::Total(&[GAUDI_MEMORY_TOTAL]),
    pods: &GAUDI_PODS,
    job: None,
    only_children: "only child series: no value for the whole device",
};

pub fn profile(vendor: Vendor) -> &'static Profile {
    match vendor {
        Vendor::Amd => &AMD,
        Vendor::Intel => &GAUDI,
        Vendor::Nvidia | Vendor::Other => &DCGM,
    }
}

/// The longest text the push contract accepts in a field or label value.
pub const MAX_TEXT_BYTES: usize = 256;

/// A label's value when it is usable as text: not blank, at most 256 bytes.
pub fn text(labels: &BTreeMap<String, String>, key: &str) -> Option<String> {
    let v = labels.get(key)?.trim();
    (!v.is_empty() && v.len() <= MAX_TEXT_BYTES).then(|| v.to_string())
}

/// A label's value when it names something: usable text that is not masked (`xxxx`), `N/A`
/// or `0` (see [`accel::is_usable_id`]), nor an all-zero UUID (a virtual function's
/// `gpu_uuid="00000000-0000-0000-0000-000000000000"`).
pub fn known(labels: &BTreeMap<String, String>, key: &str) -> Option<String> {
    text(labels, key).filter(|v| accel::is_usable_id(v) && !v.chars().all(|c| c == '0' || c == '-'))
}

/// The first of `keys` that is [`known`].
fn first_known(labels: &BTreeMap<String, String>, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| known(labels, k))
}

/// An exporter's pod name (dcgm-exporter under the GPU Operator `nvidia-dcgm-exporter-x2x9z`,
/// from its Helm chart `dcgm-exporter-…`; AMD's and Intel's metrics exporters `…-metrics-exporter-…`,
/// `…metric-exporter-…`): a Prometheus target label, or a dcgm-exporter `Hostname`, that
/// names the exporter itself, not a workload or a host.
pub fn is_exporter_pod(name: &str) -> bool {
    name.starts_with("nvidia-dcgm-exporter-")
        || name.starts_with("dcgm-exporter-")
        || name.contains("metrics-exporter-")
        || name.contains("metric-exporter-")
}

pub fn is_exporter_container(name: &str) -> bool {
    matches!(
        name,
        "nvidia-dcgm-exporter"
            | "dcgm-exporter"
            | "metrics-exporter"
            | "metric-exporter"
            | "device-metrics-exporter"
    )
}

/// The device's host: `Hostname` (dcgm-exporter), `hostname` (AMD, some relabellings), then
/// `node` or `kubernetes_node` (Prometheus relabelling), preferring any of them to an exporter
/// pod's name. An exporter pod's name is kept only as a stand-in: a kubernetes source maps it
/// to the node the pod runs on (a host alias), and the store then files the GPU under that node.
pub fn host(labels: &BTreeMap<String, String>) -> Option<String> {
    let names: Vec<String> = ["Hostname", "hostname", "node", "kubernetes_node"]
        .iter()
        .filter_map(|k| text(labels, k))
        .collect();
    names
        .iter()
        .find(|h| !is_exporter_pod(h))
        .or(names.first())
        .cloned()
}

/// An NVIDIA physical GPU UUID, short enough that `MIG-<uuid>/<gi>` still fits the contract.
fn gpu_uuid_ok(uuid: &str) -> bool {
    uuid.starts_with("GPU-")
        && uuid.len() <= 116
        && uuid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// What a series says about its device, beyond its identity.
#[derive(Debug, Default, Clone)]
pub struct Facts {
    pub model: Option<String>,
    pub host: Option<String>,
    pub cluster: Option<String>,
    pub pci_bus_id: Option<String>,
    pub serial: Option<String>,
    /// Labels for the GPU record (`driver_version`, `gpu_index`, `card_model`, ...).
    pub labels: BTreeMap<&'static str, String>,
}

/// A child of a device: a MIG instance or an AMD compute partition.
#[derive(Debug, Clone)]
pub struct Child {
    /// Numeric ids in numeric order.
    pub key: (u64, String),
    pub uuid: String,
    /// `mig_profile`: a MIG profile (`1g.5gb`) or a partition mode (`CPX`).
    pub profile: Option<String>,
    /// The label naming it on the child's record (`gpu_instance_id`, `partition_id`).
    pub label: (&'static str, String),
}

/// A device a series is about.
#[derive(Debug, Clone)]
pub struct Device {
    pub vendor: Vendor,
    /// The physical device's identity.
    pub uuid: String,
    pub child: Option<Child>,
    pub facts: Facts,
}

/// Whom a series is about, if anyone.
#[derive(Debug)]
pub enum Id {
    Device(Box<Device>),
    /// No label names a device (absent, empty, masked, `N/A`).
    Unnamed,
    /// A label names something unusable: the problem, once per `key`.
    Bad {
        key: String,
        problem: String,
    },
}

/// At most 80 characters of untrusted text for a message.
pub fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(80).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// Whom a dcgm-exporter series is about: `UUID` (`GPU-…`), with `GPU_I_ID` a MIG instance.
pub fn nvidia(labels: &BTreeMap<String, String>) -> Id {
    let Some(uuid) = text(labels, "UUID") else {
        return Id::Unnamed;
    };
    if !gpu_uuid_ok(&uuid) {
        let problem = if uuid.starts_with("MIG-") {
            format!(
                "UUID `{}` is a MIG instance without its GPU's UUID; its series are skipped",
                clip(&uuid)
            )
        } else {
            format!(
                "UUID `{}` is not an NVIDIA `GPU-…` UUID; its series are skipped",
                clip(&uuid)
            )
        };
        return Id::Bad { key: uuid, problem };
    }
    let child = match text(labels, "GPU_I_ID") {
        None => None,
        Some(gi) if gi.len() <= 6 && gi.chars().all(|c| c.is_ascii_digit()) => Some(Child {
            key: (gi.parse::<u64>().unwrap_or(u64::MAX), gi.clone()),
            uuid: format!("MIG-{uuid}/{gi}"),
            profile: text(labels, "GPU_I_PROFILE"),
            label: ("gpu_instance_id", gi),
        }),
        Some(gi) => {
            return Id::Bad {
                key: format!("{uuid}/{gi}"),
                problem: format!(
                    "GPU_I_ID `{}` on {uuid} is not a GPU instance number; its series are skipped",
                    clip(&gi)
                ),
            }
        }
    };
    let mut facts = Facts {
        model: text(labels, "modelName"),
        host: host(labels),
        cluster: text(labels, "cluster"),
        pci_bus_id: text(labels, "pci_bus_id"),
        ..Facts::default()
    };
    if let Some(v) = text(labels, "DCGM_FI_DRIVER_VERSION") {
        facts.labels.insert("driver_version", v);
    }
    if let Some(v) = text(labels, "gpu") {
        facts.labels.insert("gpu_index", v);
    }
    Id::Device(Box::new(Device {
        vendor: Vendor::Nvidia,
        uuid,
        child,
        facts,
    }))
}

/// AMD's labels lower-cased: early exporters wrote `GPU_UUID`, `SERIAL_NUMBER`, `POD`; a
/// lower-case spelling wins over an upper-case one.
pub fn lower_case(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in labels {
        let lower = k.to_ascii_lowercase();
        let keep_old = out
            .get(&lower)
            .is_some_and(|old| !old.trim().is_empty() && (v.trim().is_empty() || lower != *k));
        if !keep_old {
            out.insert(lower, v.clone());
        }
    }
    out
}

/// Compute partition modes that split a GPU; `spx` (one partition) and `none` do not.
fn splits(mode: &str) -> bool {
    !matches!(mode, "" | "spx" | "none" | "n/a" | "na")
}

/// Whom an AMD device-metrics-exporter series is about (`labels` already [`lower_case`]d):
/// the GPU whose board serial (`serial_number`), else `gpu_uuid`, else PCI address on its host
/// names it through [`accel::amd_uuid`]; a compute partition of it when the partition mode
/// splits the GPU (`gpu_compute_partition_type` `dpx`, `qpx`, `cpx`, ...).
pub fn amd(labels: &BTreeMap<String, String>) -> Id {
    let serial = known(labels, "serial_number");
    let gpu_uuid = known(labels, "gpu_uuid");
    let host = host(labels).filter(|h| accel::is_usable_id(h));
    let pci = known(labels, "pci_bus_id");
    let Some(uuid) = accel::amd_uuid(
        serial.as_deref(),
        None,
        gpu_uuid.as_deref(),
        host.as_deref(),
        pci.as_deref(),
    ) else {
        return Id::Unnamed;
    };
    let mode = text(labels, "gpu_compute_partition_type")
        .unwrap_or_default()
        .to_ascii_lowercase();
    let child = if splits(&mode) {
        match text(labels, "gpu_partition_id").map(|p| (p.parse::<u32>(), p)) {
            Some((Ok(n), p)) if n < u32::MAX => Some(Child {
                key: (u64::from(n), p.clone()),
                uuid: accel::partition_uuid(&uuid, n),
                profile: Some(mode.to_ascii_uppercase()),
                label: ("partition_id", p),
            }),
            other => {
                return Id::Bad {
                    key: format!("{uuid}/partition"),
                    problem: format!(
                        "{uuid} is in compute partition mode `{}` but gpu_partition_id `{}` is \
                         not a partition number; its series are skipped",
                        clip(&mode),
                        clip(&other.map(|(_, p)| p).unwrap_or_default())
                    ),
                }
            }
        }
    } else {
        None
    };
    let mut facts = Facts {
        model: first_known(labels, &["card_series", "card_model"]),
        host,
        cluster: first_known(labels, &["cluster", "cluster_name"]),
        pci_bus_id: pci,
        serial,
        ..Facts::default()
    };
    if let Some(v) = text(labels, "gpu_id") {
        facts.labels.insert("gpu_index", v);
    }
    for (label, key) in [
        ("driver_version", "driver_version"),
        ("card_model", "card_model"),
        ("gpu_uuid", "gpu_uuid"),
        ("memory_partition", "gpu_memory_partition_type"),
    ] {
        if let Some(v) = known(labels, key) {
            facts.labels.insert(label, v);
        }
    }
    Id::Device(Box::new(Device {
        vendor: Vendor::Amd,
        uuid,
        child,
        facts,
    }))
}

/// Whom a Gaudi metric exporter series is about: the device whose `Serial` (else `UUID`, else
/// PCI address on its host) names it through [`accel::gaudi_uuid`]. `node_of_target` is the
/// node the exporter's `habanalabs_kube_info` names for the series' target, if any.
pub fn gaudi(labels: &BTreeMap<String, String>, node_of_target: Option<&str>) -> Id {
    let serial = first_known(labels, &["Serial", "serial"]);
    let id = first_known(labels, &["UUID", "uuid"]);
    let host = host(labels)
        .filter(|h| accel::is_usable_id(h))
        .or_else(|| node_of_target.map(str::to_string));
    let pci = first_known(labels, &["bus_id", "pci_bus_id", "pci_id"]);
    let Some(uuid) = accel::gaudi_uuid(
        serial.as_deref(),
        id.as_deref(),
        host.as_deref(),
        pci.as_deref(),
    ) else {
        return Id::Unnamed;
    };
    let mut facts = Facts {
        model: first_known(labels, &["product_name", "model"]),
        host,
        cluster: known(labels, "cluster"),
        pci_bus_id: pci,
        serial,
        ..Facts::default()
    };
    if let Some(v) = known(labels, "driver") {
        facts.labels.insert("driver_version", v);
    }
    if let Some(v) = text(labels, "id") {
        facts.labels.insert("gpu_index", v);
    }
    Id::Device(Box::new(Device {
        vendor: Vendor::Intel,
        uuid,
        child: None,
        facts,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn units_convert_to_mib_and_watts() {
        assert_eq!(Unit::Bytes.convert(1_048_576.0 * 3.0), 3.0);
        assert_eq!(Unit::MilliWatts.convert(93_000.0), 93.0);
        assert_eq!(Unit::DecimalMb.convert(68702.0).round(), 65519.0);
        assert_eq!(Unit::Mib.convert(5.0), 5.0);
    }

    #[test]
    fn families_name_their_exporter() {
        assert_eq!(
            read_family("amd_gpu_gfx_activity").map(|f| f.0),
            Some(AMD_GFX_ACTIVITY)
        );
        assert_eq!(read_family("amd_DCGM_FI_DEV_GPU_UTIL"), None);
        assert_eq!(read_family("gpu_xgmi_link_rx"), None);
        let present = vendors_present(["gpu_xgmi_link_rx", "habanalabs_kube_info"]);
        assert!(present.is_empty(), "{present:?}");
        let present = vendors_present([GPU_UTIL, AMD_USED_VRAM, GAUDI_POWER]);
        assert_eq!(present.len(), 3);
        let q = query_metrics();
        assert!(q.contains(&"amd_gpu_used_vram".to_string()));
        assert!(q.contains(&GAUDI_KUBE_INFO.to_string()));
    }

    #[test]
    fn amd_labels_of_either_case_name_the_gpu_by_serial() {
        let l = lower_case(&labels(&[
            ("GPU_UUID", "6699c0a8-4200-4242-037f-f97e6cae0f09"),
            ("SERIAL_NUMBER", "692247001282"),
        ]));
        let Id::Device(d) = amd(&l) else {
            panic!("no device")
        };
        assert_eq!(d.uuid, "AMD-SN-692247001282");
        assert!(d.child.is_none());
        // Masked serial and host: the exporter's gpu_uuid, else nothing.
        let masked = labels(&[
            ("serial_number", "xxxx"),
            ("hostname", "xxxx"),
            ("card_model", "xxxx"),
            ("gpu_id", "0"),
        ]);
        assert!(matches!(amd(&masked), Id::Unnamed));
        // CPX: a partition of the GPU its serial names.
        let cpx = labels(&[
            ("serial_number", "692407005126"),
            ("gpu_compute_partition_type", "cpx"),
            ("gpu_partition_id", "6"),
            ("gpu_id", "14"),
            ("card_model", "102-G30213-0C"),
        ]);
        let Id::Device(d) = amd(&cpx) else {
            panic!("no device")
        };
        let c = d.child.unwrap();
        assert_eq!(c.uuid, "AMD-SN-692407005126/P6");
        assert_eq!(c.profile.as_deref(), Some("CPX"));
        assert_eq!(d.facts.model.as_deref(), Some("102-G30213-0C"));
        // A virtual function: partition id N/A, no serial, zero UUID: unnamed.
        let vf = labels(&[
            ("serial_number", ""),
            ("gpu_uuid", "00000000-0000-0000-0000-000000000000"),
            ("gpu_partition_id", "4294967295"),
            ("gpu_compute_partition_type", "spx"),
        ]);
        assert!(matches!(amd(&vf), Id::Unnamed));
    }

    #[test]
    fn gaudi_devices_are_named_by_serial_then_uuid() {
        let Id::Device(d) = gaudi(
            &labels(&[("Serial", "AN12345"), ("UUID", "01P4-HL2080A0")]),
            Some("gaudi-node-1"),
        ) else {
            panic!("no device")
        };
        assert_eq!(d.uuid, "HL-SN-AN12345");
        assert_eq!(d.facts.host.as_deref(), Some("gaudi-node-1"));
        assert!(matches!(
            gaudi(&labels(&[("Serial", "N/A")]), None),
            Id::Unnamed
        ));
    }
}
