//! Kubernetes objects to gpuledger facts, with no IO: a node's physical GPUs (capacity, GPU
//! Feature Discovery labels, MIG and sharing; AMD's and Intel Gaudi's device plugin
//! resources), where it runs (instance type, zone, provider ID), and which pods hold GPUs,
//! from when to when, for whom.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gpuledger_model::{Cloud, Vendor, WorkloadContext};
use k8s_openapi::api::core::v1::{Container, Namespace, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The device plugin's whole-GPU resource (also the time-slicing replica resource).
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// MIG resources in the mixed strategy: `nvidia.com/mig-1g.5gb`.
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";
/// AMD's device plugin resource: one GPU, or one compute partition of a partitioned GPU.
pub const AMD_GPU_RESOURCE: &str = "amd.com/gpu";
/// Intel's Gaudi device plugin resource: one Gaudi.
pub const GAUDI_RESOURCE: &str = "habana.ai/gaudi";
/// The whole-device resources of the other vendors' device plugins, counted like
/// [`GPU_RESOURCE`] on a node that has no NVIDIA GPUs.
pub const OTHER_RESOURCES: [(&str, Vendor); 2] = [
    (AMD_GPU_RESOURCE, Vendor::Amd),
    (GAUDI_RESOURCE, Vendor::Intel),
];
/// Every resource that is one whole device to a pod.
const WHOLE_DEVICE_RESOURCES: [&str; 3] = [GPU_RESOURCE, AMD_GPU_RESOURCE, GAUDI_RESOURCE];

/// Longest text kept from a label or annotation (the push contract's limit).
const MAX_TEXT: usize = 256;
/// Most labels kept per node (the push contract's limit).
const MAX_LABELS: usize = 64;

/// Label prefixes that describe the machine, not who owns it: never copied onto GPUs.
const SYSTEM_LABEL_PREFIXES: &[&str] = &[
    "feature.node.kubernetes.io/",
    "nvidia.com/",
    "amd.com/",
    "beta.amd.com/",
    "habana.ai/",
    "kubernetes.io/",
    "beta.kubernetes.io/",
    "node.kubernetes.io/",
    "node-role.kubernetes.io/",
    "topology.kubernetes.io/",
    "failure-domain.beta.kubernetes.io/",
    "topology.gke.io/",
    "cloud.google.com/",
    "eks.amazonaws.com/",
    "k8s.io/",
    "node.openshift.io/",
    "kubernetes.azure.com/",
];

/// What a node says about its GPUs and where it runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeGpus {
    pub node: String,
    /// Whose GPUs they are: NVIDIA's (GFD labels, `nvidia.com/gpu`), else the vendor whose
    /// device plugin resource the node advertises (`amd.com/gpu`, `habana.ai/gaudi`).
    pub vendor: Option<Vendor>,
    /// Physical GPUs: GFD's `gpu.count`, else capacity ÷ time-slicing replicas. MIG instances
    /// and replicas never add GPUs.
    pub physical: u32,
    /// The GPU model as GFD writes it with spaces for hyphens (`NVIDIA A100 SXM4 40GB`).
    pub model: Option<String>,
    pub memory_mib: Option<u64>,
    pub family: Option<String>,
    /// `single`, `mixed` or `none`, from `nvidia.com/mig.strategy`.
    pub mig_strategy: Option<String>,
    /// MIG instances per profile (`1g.5gb` → 2) the node offers.
    pub mig_profiles: BTreeMap<String, u32>,
    /// `time-slicing` or `mps` when the device plugin shares each GPU.
    pub sharing: Option<String>,
    /// Pods that may share one GPU (1 without sharing).
    pub replicas: u32,
    /// The counted resource's capacity and allocatable (`nvidia.com/gpu`, else `amd.com/gpu`
    /// or `habana.ai/gaudi`), as the device plugin advertises them.
    pub gpu_capacity: Option<u64>,
    pub gpu_allocatable: Option<u64>,
    pub instance_type: Option<String>,
    pub region: Option<String>,
    pub zone: Option<String>,
    pub provider_id: Option<String>,
    pub cloud: Option<Cloud>,
    /// The cloud's instance ID from the provider ID (`i-0b49…`, a GCE instance name).
    pub instance_id: Option<String>,
    /// The GCP project or Azure subscription from the provider ID.
    pub account: Option<String>,
    /// Labels that may say who owns the node (system labels left out).
    pub labels: BTreeMap<String, String>,
    /// What could not be read, naming the field.
    pub problems: Vec<String>,
}

/// A pod that holds GPUs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodGpus {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub node: Option<String>,
    /// Whole GPUs requested (`nvidia.com/gpu`, `amd.com/gpu`, `habana.ai/gaudi`; replicas on a
    /// time-sliced node).
    pub gpus: u32,
    /// MIG instances requested per profile.
    pub mig: BTreeMap<String, u32>,
    /// A fraction of one GPU (Run:ai `gpu-fraction`).
    pub fraction: Option<f64>,
    /// When it got its node's GPUs: the pod's `status.startTime`.
    pub start: Option<DateTime<Utc>>,
    /// When it let them go: its containers' last finish when it succeeded or failed.
    pub end: Option<DateTime<Utc>>,
    /// Set once deletion began.
    pub deleting: Option<DateTime<Utc>>,
    /// The controlling workload, `Kind/name`.
    pub owner: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl PodGpus {
    /// `namespace/name`, as dcgm-exporter's pod labels name it too.
    pub fn workload(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// How many GPU slots the pod holds: whole GPUs, MIG instances, or one for a fraction.
    pub fn slots(&self) -> u32 {
        let mig: u32 = self.mig.values().sum();
        let n = self.gpus.saturating_add(mig);
        if n == 0 && self.fraction.is_some() {
            1
        } else {
            n
        }
    }
}

fn text(s: &str) -> Option<String> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let mut cut = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    Some(s[..cut].to_string())
}

/// A whole number of devices from a quantity (`"2"`, `"2k"` is refused).
fn count(q: &Quantity) -> Option<u64> {
    q.0.trim().parse::<u64>().ok()
}

/// GFD writes the product with hyphens for spaces (`NVIDIA-A100-SXM4-40GB`), and appends
/// `-SHARED` under time-slicing and `-MIG-<profile>` under the single MIG strategy.
fn model_from_product(product: &str) -> String {
    let p = product.trim();
    let p = p.strip_suffix("-SHARED").unwrap_or(p);
    let p = p.split("-MIG-").next().unwrap_or(p);
    p.replace('-', " ")
}

/// A node's provider ID read: cloud, instance ID, zone, and account (the GCP project or the
/// Azure subscription; an AWS provider ID names no account).
struct ProviderId {
    cloud: Option<Cloud>,
    instance: Option<String>,
    zone: Option<String>,
    account: Option<String>,
}

fn cloud_of_provider_id(id: &str) -> ProviderId {
    let none = ProviderId {
        cloud: None,
        instance: None,
        zone: None,
        account: None,
    };
    let Some((scheme, rest)) = id.split_once("://") else {
        return none;
    };
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    let part = |i: usize| parts.get(i).map(|s| s.to_string());
    match scheme {
        // aws:///us-east-1a/i-0b498db53280b86a6
        "aws" => ProviderId {
            cloud: Some(Cloud::Aws),
            instance: parts.last().map(|s| s.to_string()),
            zone: part(0).filter(|_| parts.len() > 1),
            account: None,
        },
        // gce://project/us-central1-a/instance-name
        "gce" => ProviderId {
            cloud: Some(Cloud::Gcp),
            instance: part(2),
            zone: part(1),
            account: part(0).filter(|_| parts.len() > 1),
        },
        // azure:///subscriptions/<id>/resourceGroups/…/virtualMachines/name (or
        // …/virtualMachineScaleSets/…/virtualMachines/7)
        "azure" => ProviderId {
            cloud: Some(Cloud::Azure),
            instance: parts.last().map(|s| s.to_string()),
            zone: None,
            account: part(1).filter(|_| {
                parts
                    .first()
                    .is_some_and(|p| p.eq_ignore_ascii_case("subscriptions"))
            }),
        },
        _ => none,
    }
}

fn region_of_zone(zone: &str) -> Option<String> {
    // us-east-1a → us-east-1; us-central1-a → us-central1; eastus-1 → eastus.
    let z = zone.trim();
    if let Some((region, suffix)) = z.rsplit_once('-') {
        if suffix.len() == 1 && suffix.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Some(region.to_string());
        }
    }
    let trimmed = z.trim_end_matches(|c: char| c.is_ascii_lowercase());
    (trimmed.len() < z.len() && trimmed.ends_with(|c: char| c.is_ascii_digit()))
        .then(|| trimmed.to_string())
}

/// What `node` says about its GPUs; `None` when it has none (no GPU resource, no GFD count).
pub fn node_gpus(node: &Node) -> Option<NodeGpus> {
    let name = node.metadata.name.clone()?;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let status = node.status.as_ref();
    let capacity = status.and_then(|s| s.capacity.as_ref());
    let allocatable = status.and_then(|s| s.allocatable.as_ref());
    let mut out = NodeGpus {
        node: name,
        replicas: 1,
        ..Default::default()
    };
    let label = |k: &str| labels.get(k).and_then(|v| text(v));
    let number = |k: &str, problems: &mut Vec<String>| -> Option<u64> {
        let v = labels.get(k)?;
        match v.trim().parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                problems.push(format!(
                    "node {}: label {k}: `{v}` is not a whole number",
                    out.node
                ));
                None
            }
        }
    };
    let mut problems = Vec::new();
    let gfd_count = number("nvidia.com/gpu.count", &mut problems);
    let replicas = number("nvidia.com/gpu.replicas", &mut problems).unwrap_or(0);
    let slices_gi = number("nvidia.com/gpu.slices.gi", &mut problems);
    out.memory_mib = number("nvidia.com/gpu.memory", &mut problems);
    out.family = label("nvidia.com/gpu.family");
    out.mig_strategy = label("nvidia.com/mig.strategy");
    let product = label("nvidia.com/gpu.product");
    out.model = product.as_deref().map(model_from_product);
    out.sharing = label("nvidia.com/gpu.sharing-strategy").filter(|s| s != "none");
    if replicas > 1 {
        out.replicas = replicas.min(u32::MAX as u64) as u32;
        out.sharing.get_or_insert_with(|| "time-slicing".into());
    }
    let resource = |m: Option<&BTreeMap<String, Quantity>>, key: &str| {
        m.and_then(|m| m.get(key)).and_then(count)
    };
    out.gpu_capacity = resource(capacity, GPU_RESOURCE);
    out.gpu_allocatable = resource(allocatable, GPU_RESOURCE);
    if let Some(bad) = capacity
        .and_then(|m| m.get(GPU_RESOURCE))
        .filter(|q| count(q).is_none())
    {
        problems.push(format!(
            "node {}: status.capacity.{GPU_RESOURCE}: `{}` is not a whole number",
            out.node, bad.0
        ));
    }
    // MIG instances on offer: the mixed strategy's resources, else GFD's per-profile counts.
    for (k, q) in capacity.into_iter().flatten() {
        if let Some(profile) = k.strip_prefix(MIG_RESOURCE_PREFIX) {
            if let Some(n) = count(q).filter(|n| *n > 0) {
                out.mig_profiles.insert(profile.to_string(), n as u32);
            }
        }
    }
    if out.mig_profiles.is_empty() {
        for (k, v) in &labels {
            if let Some(profile) = k
                .strip_prefix(MIG_RESOURCE_PREFIX)
                .and_then(|r| r.strip_suffix(".count"))
            {
                if let Some(n) = v.trim().parse::<u32>().ok().filter(|n| *n > 0) {
                    out.mig_profiles.insert(profile.to_string(), n);
                }
            }
        }
    }
    // Under the single strategy GFD names the MIG product and counts MIG devices.
    let single_mig = out.mig_strategy.as_deref() == Some("single")
        && product.as_deref().is_some_and(|p| p.contains("-MIG-"));
    if single_mig {
        if let (Some(p), Some(n)) = (product.as_deref(), gfd_count) {
            let profile = p.split("-MIG-").nth(1).unwrap_or_default().to_string();
            if !profile.is_empty() {
                out.mig_profiles.insert(profile, n as u32);
            }
        }
    }
    out.physical = match (gfd_count, out.gpu_capacity) {
        (Some(n), _) if single_mig => {
            // Seven compute slices per A100/H100-class GPU; `slices.gi` per instance.
            let per_gpu = (7 / slices_gi.unwrap_or(1).max(1)).max(1);
            problems.push(format!(
                "node {}: MIG single strategy: {n} MIG device(s) of {} slice(s) each, \
                 counted as {} physical GPU(s)",
                out.node,
                slices_gi.unwrap_or(1),
                n.div_ceil(per_gpu)
            ));
            n.div_ceil(per_gpu)
        }
        (Some(n), _) => n,
        (None, Some(c)) => c.div_ceil(out.replicas.max(1) as u64),
        (None, None) => 0,
    }
    .min(u32::MAX as u64) as u32;
    let others: Vec<(&str, Vendor, Option<u64>, Option<u64>)> = OTHER_RESOURCES
        .iter()
        .filter_map(|(r, v)| {
            let q = capacity.and_then(|m| m.get(*r))?;
            if count(q).is_none() {
                problems.push(format!(
                    "node {}: status.capacity.{r}: `{}` is not a whole number",
                    out.node, q.0
                ));
            }
            Some((*r, *v, count(q), resource(allocatable, r)))
        })
        .collect();
    if out.physical > 0 || !out.mig_profiles.is_empty() {
        out.vendor = Some(Vendor::Nvidia);
        for (r, ..) in others.iter().filter(|o| o.2.is_some_and(|n| n > 0)) {
            problems.push(format!(
                "node {}: advertises {r} besides {GPU_RESOURCE}; only the NVIDIA GPUs are \
                 counted for its GPU pool",
                out.node
            ));
        }
    } else if let Some((_, vendor, Some(n), allocatable)) =
        others.into_iter().find(|o| o.2.is_some_and(|n| n > 0))
    {
        // AMD's and Intel's device plugins: one resource unit per device (per compute
        // partition on a partitioned AMD GPU), no sharing or MIG labels.
        out.vendor = Some(vendor);
        out.physical = n.min(u32::MAX as u64) as u32;
        out.gpu_capacity = Some(n);
        out.gpu_allocatable = allocatable;
    }
    if out.physical == 0 && out.mig_profiles.is_empty() {
        return None;
    }
    if out.physical == 0 {
        problems.push(format!(
            "node {}: offers MIG instances but neither label nvidia.com/gpu.count nor \
             {GPU_RESOURCE} capacity says how many physical GPUs; run GPU Feature Discovery",
            out.node
        ));
    }
    out.instance_type = label("node.kubernetes.io/instance-type")
        .or_else(|| label("beta.kubernetes.io/instance-type"));
    out.zone = label("topology.kubernetes.io/zone")
        .or_else(|| label("failure-domain.beta.kubernetes.io/zone"));
    out.region = label("topology.kubernetes.io/region")
        .or_else(|| label("failure-domain.beta.kubernetes.io/region"));
    out.provider_id = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(text);
    if let Some(id) = &out.provider_id {
        let p = cloud_of_provider_id(id);
        out.cloud = p.cloud;
        out.instance_id = p.instance;
        out.account = p.account;
        if out.zone.is_none() {
            out.zone = p.zone;
        }
    }
    if out.region.is_none() {
        out.region = out.zone.as_deref().and_then(region_of_zone);
    }
    for (k, v) in &labels {
        // Room for the two the collector adds to a host's labels: `instance_id`, `vendor`.
        if out.labels.len() >= MAX_LABELS - 2 {
            break;
        }
        if SYSTEM_LABEL_PREFIXES.iter().any(|p| k.starts_with(p)) || k.len() > MAX_TEXT {
            continue;
        }
        if let Some(v) = text(v) {
            out.labels.insert(k.clone(), v);
        }
    }
    out.problems = problems;
    Some(out)
}

/// Devices a container asks for: limits (extended resources must set them), else requests.
fn container_devices(c: &Container) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let r = c.resources.as_ref();
    for map in [
        r.and_then(|r| r.limits.as_ref()),
        r.and_then(|r| r.requests.as_ref()),
    ]
    .into_iter()
    .flatten()
    {
        for (k, q) in map {
            if WHOLE_DEVICE_RESOURCES.contains(&k.as_str()) || k.starts_with(MIG_RESOURCE_PREFIX) {
                if let Some(n) = count(q) {
                    out.entry(k.clone()).or_insert(n);
                }
            }
        }
    }
    out
}

/// A Kubernetes time to the second (API times carry no more).
fn time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), 0).unwrap_or_default()
}

/// The pod's GPUs and lifetime; `None` when it holds no GPU (no GPU or MIG resource, no
/// fraction annotation).
pub fn pod_gpus(pod: &Pod) -> Option<PodGpus> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref()?;
    // Containers run together (sum); init containers run one at a time before them (max).
    let mut devices: BTreeMap<String, u64> = BTreeMap::new();
    for c in &spec.containers {
        for (k, n) in container_devices(c) {
            *devices.entry(k).or_default() += n;
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, n) in container_devices(c) {
            let e = devices.entry(k).or_default();
            *e = (*e).max(n);
        }
    }
    let annotations = meta.annotations.clone().unwrap_or_default();
    let mut out = PodGpus {
        uid: meta.uid.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
        name: meta.name.clone()?,
        node: spec.node_name.clone(),
        gpus: WHOLE_DEVICE_RESOURCES
            .iter()
            .filter_map(|r| devices.get(*r))
            .fold(0u64, |a, n| a.saturating_add(*n))
            .min(u64::from(u32::MAX)) as u32,
        ..Default::default()
    };
    for (k, n) in &devices {
        if let Some(profile) = k.strip_prefix(MIG_RESOURCE_PREFIX) {
            if *n > 0 {
                out.mig.insert(profile.to_string(), *n as u32);
            }
        }
    }
    // Run:ai places MIG instances and fractions by annotation instead of resources.
    if out.gpus == 0 && out.mig.is_empty() {
        for (k, v) in &annotations {
            if let Some(profile) = k.strip_prefix(MIG_RESOURCE_PREFIX) {
                if let Some(n) = v.trim().parse::<u32>().ok().filter(|n| *n > 0) {
                    out.mig.insert(profile.to_string(), n);
                }
            }
        }
        out.fraction = annotations
            .get("gpu-fraction")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|f| *f > 0.0 && *f <= 1.0);
    }
    if out.slots() == 0 {
        return None;
    }
    let status = pod.status.as_ref();
    out.start = status.and_then(|s| s.start_time.as_ref()).map(time);
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
    if matches!(phase, "Succeeded" | "Failed") {
        let finished = status
            .into_iter()
            .flat_map(|s| {
                s.container_statuses
                    .iter()
                    .flatten()
                    .chain(s.init_container_statuses.iter().flatten())
            })
            .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
            .map(time)
            .max();
        let ready_changed = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.last_transition_time.as_ref())
            .map(time);
        out.end = finished
            .or(ready_changed)
            .or(meta.deletion_timestamp.as_ref().map(time))
            .or(out.start)
            .map(|e| out.start.map_or(e, |s| e.max(s)));
    }
    out.deleting = meta.deletion_timestamp.as_ref().map(time);
    out.owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| {
            // A ReplicaSet named `<deployment>-<pod-template-hash>` belongs to that Deployment.
            let hash = meta
                .labels
                .as_ref()
                .and_then(|l| l.get("pod-template-hash"));
            match (o.kind.as_str(), hash) {
                ("ReplicaSet", Some(h)) if o.name.ends_with(&format!("-{h}")) => {
                    format!("Deployment/{}", &o.name[..o.name.len() - h.len() - 1])
                }
                _ => format!("{}/{}", o.kind, o.name),
            }
        })
        .and_then(|o| text(&o));
    out.labels = meta.labels.clone().unwrap_or_default();
    out.annotations = annotations;
    Some(out)
}

/// The first of `keys` found in the pod's labels, then its annotations, then its namespace's
/// labels and annotations, with where it was found.
pub fn lookup(
    keys: &[String],
    pod: &PodGpus,
    namespace: Option<&Namespace>,
) -> Option<(String, String)> {
    let ns_labels = namespace.and_then(|n| n.metadata.labels.as_ref());
    let ns_annotations = namespace.and_then(|n| n.metadata.annotations.as_ref());
    for key in keys {
        let found = [
            (Some(&pod.labels), "pod label"),
            (Some(&pod.annotations), "pod annotation"),
            (ns_labels, "namespace label"),
            (ns_annotations, "namespace annotation"),
        ]
        .into_iter()
        .find_map(|(map, what)| {
            map.and_then(|m| m.get(key))
                .and_then(|v| text(v))
                .map(|v| (v, format!("{what} {key}")))
        });
        if found.is_some() {
            return found;
        }
    }
    None
}

/// Annotations that carry whole objects, not facts about ownership: never copied.
const BULKY_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration"];

/// At most [`MAX_LABELS`] entries of a label or annotation map, each within the push
/// contract's limits; what is too long is left out rather than cut.
fn bounded(map: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    map.into_iter()
        .flatten()
        .filter(|(k, v)| {
            !k.is_empty()
                && k.len() <= MAX_TEXT
                && v.len() <= MAX_TEXT
                && !BULKY_ANNOTATIONS.contains(&k.as_str())
        })
        .take(MAX_LABELS)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// What ownership rules may read of a pod: its namespace and the labels and annotations of
/// the pod and of the namespace.
pub fn workload_context(pod: &PodGpus, namespace: Option<&Namespace>) -> WorkloadContext {
    WorkloadContext {
        namespace: text(&pod.namespace),
        pod_labels: bounded(Some(&pod.labels)),
        pod_annotations: bounded(Some(&pod.annotations)),
        namespace_labels: bounded(namespace.and_then(|n| n.metadata.labels.as_ref())),
        namespace_annotations: bounded(namespace.and_then(|n| n.metadata.annotations.as_ref())),
        ..Default::default()
    }
}

/// Whether a pod is a dcgm-exporter, whose name dcgm-exporter puts in its `Hostname` label.
pub fn is_dcgm_exporter(pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    matches!(label("app"), Some("nvidia-dcgm-exporter" | "dcgm-exporter"))
        || label("app.kubernetes.io/name") == Some("dcgm-exporter")
        || pod.metadata.name.as_deref().is_some_and(|n| {
            n.starts_with("nvidia-dcgm-exporter-") || n.starts_with("dcgm-exporter-")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> Node {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn time_slicing_replicas_are_not_extra_gpus() {
        let n = node(serde_json::json!({
            "metadata": {"name": "ts-1", "labels": {
                "nvidia.com/gpu.count": "1", "nvidia.com/gpu.replicas": "4",
                "nvidia.com/gpu.product": "NVIDIA-A10G-SHARED",
                "nvidia.com/gpu.sharing-strategy": "time-slicing",
                "node.kubernetes.io/instance-type": "g5.xlarge",
                "topology.kubernetes.io/zone": "us-east-1a", "team": "nlp"}},
            "spec": {"providerID": "aws:///us-east-1a/i-0abc"},
            "status": {"capacity": {"nvidia.com/gpu": "4"}}
        }));
        let g = node_gpus(&n).unwrap();
        assert_eq!((g.physical, g.replicas, g.gpu_capacity), (1, 4, Some(4)));
        assert_eq!(g.model.as_deref(), Some("NVIDIA A10G"));
        assert_eq!(g.sharing.as_deref(), Some("time-slicing"));
        assert_eq!(g.cloud, Some(Cloud::Aws));
        assert_eq!(g.instance_id.as_deref(), Some("i-0abc"));
        assert_eq!(g.region.as_deref(), Some("us-east-1"));
        assert_eq!(g.labels.len(), 1, "{:?}", g.labels);
        // Without GFD, capacity ÷ replicas.
        let n = node(serde_json::json!({
            "metadata": {"name": "ts-2", "labels": {"nvidia.com/gpu.replicas": "4"}},
            "status": {"capacity": {"nvidia.com/gpu": "8"}}
        }));
        assert_eq!(node_gpus(&n).unwrap().physical, 2);
    }

    #[test]
    fn single_strategy_mig_counts_physical_gpus() {
        let n = node(serde_json::json!({
            "metadata": {"name": "mig-1", "labels": {
                "nvidia.com/gpu.count": "14", "nvidia.com/mig.strategy": "single",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
                "nvidia.com/gpu.slices.gi": "1"}},
            "spec": {"providerID": "gce://proj/us-central1-a/mig-1"},
            "status": {"capacity": {"nvidia.com/gpu": "14"}}
        }));
        let g = node_gpus(&n).unwrap();
        assert_eq!(g.physical, 2);
        assert_eq!(g.mig_profiles.get("1g.5gb"), Some(&14));
        assert_eq!(g.model.as_deref(), Some("NVIDIA A100 SXM4 40GB"));
        assert_eq!(
            (g.cloud, g.region.as_deref()),
            (Some(Cloud::Gcp), Some("us-central1"))
        );
        assert_eq!(g.account.as_deref(), Some("proj"), "the GCP project");
    }

    #[test]
    fn provider_ids_name_the_account_where_they_can() {
        let azure = cloud_of_provider_id(
            "azure:///subscriptions/5a1c-77/resourceGroups/mc_rg/providers/Microsoft.Compute/\
             virtualMachineScaleSets/aks-gpu-1/virtualMachines/3",
        );
        assert_eq!(azure.account.as_deref(), Some("5a1c-77"));
        assert_eq!(azure.instance.as_deref(), Some("3"));
        assert_eq!(
            cloud_of_provider_id("aws:///us-east-1a/i-0abc").account,
            None
        );
        assert_eq!(cloud_of_provider_id("gce://only").account, None);
        assert_eq!(cloud_of_provider_id("kind://docker/x").cloud, None);
    }

    #[test]
    fn a_pods_context_keeps_labels_and_drops_bulky_annotations() {
        let pod = PodGpus {
            namespace: "nlp-prod".into(),
            labels: [("app".to_string(), "llm".to_string())].into(),
            annotations: [
                ("owner".to_string(), "ana".to_string()),
                (
                    "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                    "{}".to_string(),
                ),
                ("huge".to_string(), "x".repeat(MAX_TEXT + 1)),
            ]
            .into(),
            ..Default::default()
        };
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "nlp-prod", "labels": {"team": "nlp"},
                "annotations": {"openshift.io/requester": "ana"}}
        }))
        .unwrap();
        let c = workload_context(&pod, Some(&ns));
        assert_eq!(c.namespace.as_deref(), Some("nlp-prod"));
        assert_eq!(c.pod_labels.get("app").map(String::as_str), Some("llm"));
        assert_eq!(c.pod_annotations.len(), 1, "{:?}", c.pod_annotations);
        assert_eq!(
            c.namespace_labels.get("team").map(String::as_str),
            Some("nlp")
        );
        assert_eq!(c.namespace_annotations.len(), 1);
        assert!(workload_context(&pod, None).namespace_labels.is_empty());
    }

    #[test]
    fn nodes_without_gpus_and_bad_numbers() {
        let n = node(
            serde_json::json!({"metadata": {"name": "cpu"}, "status": {"capacity": {"cpu": "8"}}}),
        );
        assert!(node_gpus(&n).is_none());
        let n = node(serde_json::json!({
            "metadata": {"name": "odd", "labels": {"nvidia.com/gpu.count": "two"}},
            "status": {"capacity": {"nvidia.com/gpu": "2"}}
        }));
        let g = node_gpus(&n).unwrap();
        assert_eq!(g.physical, 2);
        assert!(
            g.problems[0].contains("label nvidia.com/gpu.count: `two` is not a whole number"),
            "{:?}",
            g.problems
        );
    }

    #[test]
    fn amd_and_gaudi_device_plugin_resources_are_counted_like_nvidias() {
        let n = node(serde_json::json!({
            "metadata": {"name": "mi300x-1", "labels": {
                "amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM", "team": "llm"}},
            "status": {"capacity": {"amd.com/gpu": "8"}, "allocatable": {"amd.com/gpu": "7"}}
        }));
        let g = node_gpus(&n).unwrap();
        assert_eq!(g.vendor, Some(Vendor::Amd));
        assert_eq!(
            (g.physical, g.gpu_capacity, g.gpu_allocatable),
            (8, Some(8), Some(7))
        );
        assert_eq!(g.model, None);
        assert_eq!(
            g.labels.len(),
            1,
            "amd.com/ labels are system labels: {:?}",
            g.labels
        );
        let n = node(serde_json::json!({
            "metadata": {"name": "gaudi-1"},
            "status": {"capacity": {"habana.ai/gaudi": "8"}}
        }));
        assert_eq!(node_gpus(&n).unwrap().vendor, Some(Vendor::Intel));
        // NVIDIA's count wins on a node with both, and the other is named.
        let n = node(serde_json::json!({
            "metadata": {"name": "both", "labels": {"nvidia.com/gpu.count": "2"}},
            "status": {"capacity": {"nvidia.com/gpu": "2", "amd.com/gpu": "1"}}
        }));
        let g = node_gpus(&n).unwrap();
        assert_eq!((g.vendor, g.physical), (Some(Vendor::Nvidia), 2));
        assert!(
            g.problems[0].contains("advertises amd.com/gpu"),
            "{:?}",
            g.problems
        );
        let n = node(serde_json::json!({
            "metadata": {"name": "odd"},
            "status": {"capacity": {"amd.com/gpu": "1k"}}
        }));
        assert!(node_gpus(&n).is_none());
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train-0", "namespace": "llm"},
            "spec": {"nodeName": "mi300x-1", "containers": [
                {"name": "a", "resources": {"limits": {"amd.com/gpu": "2"}}},
                {"name": "b", "resources": {"requests": {"habana.ai/gaudi": "1"}}}]}
        }))
        .unwrap();
        assert_eq!(pod_gpus(&p).unwrap().slots(), 3);
    }

    #[test]
    fn pods_sum_containers_and_take_the_largest_init() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train-0", "namespace": "nlp", "uid": "u1",
                "labels": {"pod-template-hash": "7d9f"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "train-7d9f", "uid": "r", "controller": true}]},
            "spec": {"nodeName": "n1",
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "3"}}}],
                "containers": [
                    {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.5gb": "1"}}}]},
            "status": {"phase": "Succeeded", "startTime": "2026-12-02T08:00:00Z",
                "containerStatuses": [{"name": "a", "image": "x", "imageID": "", "ready": false,
                    "restartCount": 0, "state": {"terminated": {"exitCode": 0,
                    "finishedAt": "2026-12-02T09:30:00Z"}}}]}
        }))
        .unwrap();
        let g = pod_gpus(&p).unwrap();
        assert_eq!((g.gpus, g.slots()), (3, 4));
        assert_eq!(g.owner.as_deref(), Some("Deployment/train"));
        assert_eq!(g.end, Some("2026-12-02T09:30:00Z".parse().unwrap()));
        assert_eq!(g.workload(), "nlp/train-0");
        let cpu: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"}, "spec": {"containers": [{"name": "w"}]}
        }))
        .unwrap();
        assert!(pod_gpus(&cpu).is_none());
    }
}
