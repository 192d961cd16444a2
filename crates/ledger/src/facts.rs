//! The attribute vocabulary shared by ownership rules, contracts and the merge: which GPU and
//! workload attributes a rule may name, and who said an attribute's value when. It sits a floor
//! below `merge`, `ownership` and `rates` so that none of them imports another for it.

use chrono::{DateTime, Utc};

/// The source that gave an attribute its current value, and when it last reported it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Seen {
    pub value: String,
    pub source: String,
    pub at: DateTime<Utc>,
}

/// A GPU attribute a rule can match or take a value from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attr {
    /// `label.<key>`: a label of the GPU (node labels, cloud tags, pushed labels).
    Label(String),
    Host,
    Cluster,
    Cloud,
    Region,
    InstanceType,
    Model,
    /// The GPU's primary source (the first to report it).
    Source,
    /// `uuid`.
    Uuid,
    /// `account`: the cloud account, project or subscription.
    Account,
    /// `namespace`: the Kubernetes namespace of a workload holding the GPU.
    Namespace,
    /// `pod.label.<key>`.
    PodLabel(String),
    /// `pod.annotation.<key>`.
    PodAnnotation(String),
    /// `namespace.label.<key>`.
    NamespaceLabel(String),
    /// `namespace.annotation.<key>`.
    NamespaceAnnotation(String),
    /// `slurm.account`: the Slurm account of a job holding the GPU.
    SlurmAccount,
    /// `slurm.partition`.
    SlurmPartition,
}

/// The attribute names a rule may use, for error messages.
pub const ATTRIBUTE_NAMES: &str = "label.<key>, host, cluster, cloud, account, region, \
    instance_type, model, source, uuid (of the GPU), or namespace, pod.label.<key>, \
    pod.annotation.<key>, namespace.label.<key>, namespace.annotation.<key>, slurm.account, \
    slurm.partition (of the workload holding it)";

impl Attr {
    /// Read an attribute name as written in the config.
    pub fn parse(s: &str) -> Result<Attr, String> {
        let s = s.trim();
        let keyed = |prefix: &str, make: fn(String) -> Attr| {
            s.strip_prefix(prefix)
                .filter(|k| !k.is_empty())
                .map(|k| make(k.to_string()))
        };
        let attr = match s {
            "host" => Some(Attr::Host),
            "cluster" => Some(Attr::Cluster),
            "cloud" => Some(Attr::Cloud),
            "account" => Some(Attr::Account),
            "region" => Some(Attr::Region),
            "instance_type" => Some(Attr::InstanceType),
            "model" => Some(Attr::Model),
            "source" => Some(Attr::Source),
            "uuid" => Some(Attr::Uuid),
            "namespace" => Some(Attr::Namespace),
            "slurm.account" => Some(Attr::SlurmAccount),
            "slurm.partition" => Some(Attr::SlurmPartition),
            _ => keyed("label.", Attr::Label)
                .or_else(|| keyed("pod.label.", Attr::PodLabel))
                .or_else(|| keyed("pod.annotation.", Attr::PodAnnotation))
                .or_else(|| keyed("namespace.label.", Attr::NamespaceLabel))
                .or_else(|| keyed("namespace.annotation.", Attr::NamespaceAnnotation)),
        };
        attr.ok_or_else(|| format!("`{s}` is no attribute a rule can read; use {ATTRIBUTE_NAMES}"))
    }

    /// Whether the attribute is read from a workload holding the GPU, not from the GPU.
    pub fn of_workload(&self) -> bool {
        matches!(
            self,
            Attr::Namespace
                | Attr::PodLabel(_)
                | Attr::PodAnnotation(_)
                | Attr::NamespaceLabel(_)
                | Attr::NamespaceAnnotation(_)
                | Attr::SlurmAccount
                | Attr::SlurmPartition
        )
    }

    /// The key of this attribute in [`crate::GpuRecord::seen`].
    pub(crate) fn seen_key(&self) -> Option<String> {
        Some(match self {
            Attr::Label(k) => format!("label.{k}"),
            Attr::Host => "host".into(),
            Attr::Cluster => "cluster".into(),
            Attr::Cloud => "cloud".into(),
            Attr::Region => "region".into(),
            Attr::InstanceType => "instance_type".into(),
            Attr::Model => "model".into(),
            Attr::Account => "account".into(),
            _ => return None,
        })
    }

    /// How a reason names the attribute: `label `team``, `instance type`, `namespace`.
    pub fn describe(&self) -> String {
        self.name()
    }

    pub(crate) fn name(&self) -> String {
        match self {
            Attr::Label(k) => format!("label `{k}`"),
            Attr::Host => "host".into(),
            Attr::Cluster => "cluster".into(),
            Attr::Cloud => "cloud".into(),
            Attr::Account => "account".into(),
            Attr::Region => "region".into(),
            Attr::InstanceType => "instance type".into(),
            Attr::Model => "model".into(),
            Attr::Source => "source".into(),
            Attr::Uuid => "uuid".into(),
            Attr::Namespace => "namespace".into(),
            Attr::PodLabel(k) => format!("pod label `{k}`"),
            Attr::PodAnnotation(k) => format!("pod annotation `{k}`"),
            Attr::NamespaceLabel(k) => format!("namespace label `{k}`"),
            Attr::NamespaceAnnotation(k) => format!("namespace annotation `{k}`"),
            Attr::SlurmAccount => "Slurm account".into(),
            Attr::SlurmPartition => "Slurm partition".into(),
        }
    }
}
