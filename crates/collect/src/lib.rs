//! Pull collectors: each reads one kind of source (a Kubernetes API, a Prometheus, a cloud API,
//! Slurm, ...) and reports [`Observation`]s with provenance. Collectors report; they never decide
//! ownership or cost, and never touch the store.
//!
//! A collector kind lives in `collectors/<kind>/` and is registered in [`KINDS`] and [`build`];
//! its kind string is also its config `type`, its telemetry tag and its test module. This build
//! ships no pull collector yet: teams push through the API or run the agent.

use std::future::Future;
use std::pin::Pin;

use gpuledger_model::Observation;

/// Why a collector run failed; the source turns `error` and the others go on.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("{0}")]
    Transient(String),
    #[error("{0}")]
    Config(String),
}

impl CollectError {
    /// Worth retrying on the next interval.
    pub fn is_retryable(&self) -> bool {
        matches!(self, CollectError::Transient(_))
    }
}

/// The future a collector run returns.
pub type CollectFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Observation>, CollectError>> + Send + 'a>>;

/// One configured pull source.
pub trait Collector: Send + Sync {
    /// The kind string (`kubernetes`, `dcgm`, ...).
    fn kind(&self) -> &'static str;
    /// The source name its observations carry.
    fn name(&self) -> &str;
    /// Read the source once.
    fn collect(&self) -> CollectFuture<'_>;
}

/// The collector kinds this build knows.
pub const KINDS: &[&str] = &[];

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
    // Each collector kind adds its arm here, e.g. `"kubernetes" => kubernetes::build(name, config_toml)`.
    let _ = (name, config_toml);
    Err(CollectError::Config(
        check_kind(kind).err().unwrap_or_default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kinds_are_explained() {
        let e = check_kind("kubernetes").unwrap_err();
        assert!(e.contains("unknown collector type `kubernetes`"));
        assert!(build("nope", "x", "").is_err());
    }
}
