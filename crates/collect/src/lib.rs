//! Pull collectors: each reads one kind of source (a Kubernetes API, a Prometheus, a cloud API,
//! Slurm, ...) and reports [`Observation`]s with provenance. Collectors report; they never decide
//! ownership or cost, and never touch the store.
//!
//! A collector kind lives in `collectors/<kind>/` and is registered in [`KINDS`] and [`build`];
//! its kind string is also its config `type`, its telemetry tag and its test module.

pub mod collectors;
mod http;

use std::future::Future;
use std::pin::Pin;

use chrono::{DateTime, Utc};
use gpuledger_model::Observation;

/// Why a collector run (or one part of it) failed; the source turns `error` and the others go on.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// The source could not be read this time (network, timeout, a 5xx); try again next interval.
    #[error("{0}")]
    Transient(String),
    /// The configuration is wrong (bad URL, a 4xx, a missing setting); retrying will not help.
    #[error("{0}")]
    Config(String),
    /// The source answered, but part of the answer was unusable (bad lines, unexpected JSON).
    #[error("{0}")]
    Data(String),
}

impl CollectError {
    /// Worth retrying on the next interval.
    pub fn is_retryable(&self) -> bool {
        matches!(self, CollectError::Transient(_))
    }
}

/// One part of a source (an endpoint, a query window) that failed while the rest was read.
#[derive(Debug)]
pub struct PartProblem {
    /// Which part: an endpoint URL, or a query and its time window.
    pub part: String,
    pub error: CollectError,
}

impl std::fmt::Display for PartProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Most errors already name their request; say the part only when they do not.
        let error = self.error.to_string();
        if error.contains(&self.part) {
            f.write_str(&error)
        } else {
            write!(f, "{}: {error}", self.part)
        }
    }
}

/// What one run read: every observation it could, and a problem for each part that failed.
/// A run whose parts all failed is an `Err` instead, so the source is marked stale.
#[derive(Debug, Default)]
pub struct CollectReport {
    pub observations: Vec<Observation>,
    pub problems: Vec<PartProblem>,
}

/// The future a collector run returns.
pub type CollectFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Observation>, CollectError>> + Send + 'a>>;

/// The future of a run that reports partial failures.
pub type ReportFuture<'a> =
    Pin<Box<dyn Future<Output = Result<CollectReport, CollectError>> + Send + 'a>>;

/// One configured pull source.
pub trait Collector: Send + Sync {
    /// The kind string (`kubernetes`, `dcgm`, ...).
    fn kind(&self) -> &'static str;
    /// The source name its observations carry.
    fn name(&self) -> &str;
    /// Read the source once. A source with several parts (endpoints) returns what worked as long
    /// as one part did; [`Collector::collect_report`] also says which parts failed.
    fn collect(&self) -> CollectFuture<'_>;
    /// Read the source once and say which parts failed. The default wraps [`Collector::collect`].
    fn collect_report(&self) -> ReportFuture<'_> {
        Box::pin(async move {
            self.collect().await.map(|observations| CollectReport {
                observations,
                problems: Vec::new(),
            })
        })
    }
    /// Read what the source recorded from `since` until now, for sources that keep history
    /// (a Prometheus), so that a server can fill the gap after downtime. `None` (the default)
    /// when the source keeps no history.
    fn backfill(&self, since: DateTime<Utc>) -> Option<ReportFuture<'_>> {
        let _ = since;
        None
    }
}

/// Now, to the second: sample times are keys, and sub-second noise only makes duplicates.
pub(crate) fn now_secs() -> DateTime<Utc> {
    use chrono::TimeZone;
    Utc.timestamp_opt(Utc::now().timestamp(), 0)
        .single()
        .unwrap_or_else(Utc::now)
}

/// A setting within `lo..=hi`, or `default` when not given.
pub(crate) fn in_range(
    key: &str,
    v: Option<u64>,
    default: u64,
    lo: u64,
    hi: u64,
) -> Result<u64, CollectError> {
    match v {
        None => Ok(default),
        Some(v) if (lo..=hi).contains(&v) => Ok(v),
        Some(v) => Err(CollectError::Config(format!(
            "{key}: must be within {lo}..={hi}, got {v}"
        ))),
    }
}

/// The collector kinds this build knows.
pub const KINDS: &[&str] = &[
    collectors::billing::KIND,
    collectors::dcgm::KIND,
    collectors::kubernetes::KIND,
];

/// Whether `kind` names a collector of this build, with a message for config errors.
pub fn check_kind(kind: &str) -> Result<(), String> {
    if KINDS.contains(&kind) {
        Ok(())
    } else if KINDS.is_empty() {
        Err(format!(
            "unknown collector type `{kind}`: this build has no pull collectors yet; push through \
             POST /api/v1/ingest or run the agent instead"
        ))
    } else {
        Err(format!(
            "unknown collector type `{kind}`; known: {}",
            KINDS.join(", ")
        ))
    }
}

/// Build the collector for a config entry. `config_toml` is the entry's own TOML text.
pub fn build(
    kind: &str,
    name: &str,
    config_toml: &str,
) -> Result<Box<dyn Collector>, CollectError> {
    match kind {
        collectors::dcgm::KIND => Ok(Box::new(collectors::dcgm::DcgmCollector::from_toml(
            name,
            config_toml,
        )?)),
        collectors::kubernetes::KIND => Ok(Box::new(
            collectors::kubernetes::KubernetesCollector::from_toml(name, config_toml)?,
        )),
        collectors::billing::KIND => Ok(Box::new(
            collectors::billing::BillingCollector::from_toml(name, config_toml)?,
        )),
        _ => Err(CollectError::Config(
            check_kind(kind).err().unwrap_or_default(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kinds_are_explained() {
        let e = check_kind("kubernets").unwrap_err();
        assert!(e.contains("unknown collector type `kubernets`"), "{e}");
        assert!(e.contains("known: billing, dcgm, kubernetes"), "{e}");
        assert!(build("nope", "x", "").is_err());
    }

    #[test]
    fn dcgm_is_registered() {
        assert!(check_kind("dcgm").is_ok());
        let c = build(
            "dcgm",
            "gpu-farm",
            "type = \"dcgm\"\nname = \"gpu-farm\"\nendpoints = [\"http://127.0.0.1:9400/metrics\"]\n",
        )
        .unwrap();
        assert_eq!((c.kind(), c.name()), ("dcgm", "gpu-farm"));
        let c = build("kubernetes", "rdu", "kubeconfig = \"/etc/kc\"\n").unwrap();
        assert_eq!((c.kind(), c.name()), ("kubernetes", "rdu"));
    }
}
