//! Pull collectors: each reads one kind of source (a Kubernetes API, a Prometheus, a cloud API,
//! Slurm, ...) and reports [`Observation`]s with provenance. Collectors report; they never decide
//! ownership or cost, and never touch the store.
//!
//! A collector kind lives in `collectors/<kind>/` and is registered in [`KINDS`] and
//! [`Settings`]; its kind string is also its config `type`, its telemetry tag and its test
//! module. The fields every `[[collectors]]` entry shares are read once, by [`Entry::parse`];
//! [`Entry::expand`] turns an entry into the collectors it stands for (one per kubeconfig file
//! of a `kubeconfig_dir`).

pub mod collectors;
mod hosts;
mod http;

pub use hosts::HostAllowList;

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
    /// The source answered, but part of the answer was unusable (bad lines, unexpected JSON);
    /// its next answer may be usable.
    #[error("{0}")]
    Data(String),
}

impl CollectError {
    /// Worth retrying on the next interval: everything but a configuration error, which needs a
    /// person to change the entry (the server's runner stops that collector).
    pub fn is_retryable(&self) -> bool {
        !matches!(self, CollectError::Config(_))
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

/// The error of a run whose parts (`what`: endpoints, projects, subscriptions) all failed,
/// each told by `text`: a configuration error only when every one was, since a passing
/// failure of one part may clear on its own.
pub(crate) fn all_failed(
    failed: &[PartProblem],
    what: &str,
    text: impl Fn(&PartProblem) -> String,
) -> CollectError {
    let all_config = failed
        .iter()
        .all(|p| matches!(p.error, CollectError::Config(_)));
    let joined = failed.iter().map(text).collect::<Vec<_>>().join("; ");
    let msg = if failed.len() == 1 {
        joined
    } else {
        format!("all {} {what} failed: {joined}", failed.len())
    };
    if all_config {
        CollectError::Config(msg)
    } else {
        CollectError::Transient(msg)
    }
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
    collectors::aws::KIND,
    collectors::azure::KIND,
    collectors::billing::KIND,
    collectors::dcgm::KIND,
    collectors::gcp::KIND,
    collectors::kubernetes::KIND,
    collectors::slurm::KIND,
    collectors::spreadsheet::KIND,
];

/// Other names a `type` may give a kind: `gpu-metrics` is the vendor-neutral name of the
/// collector that reads GPU exporters (dcgm-exporter, AMD's device-metrics-exporter, the Gaudi
/// metric exporter), whose kind is `dcgm` for the configurations written before it read more.
pub const KIND_ALIASES: &[(&str, &str)] = &[("gpu-metrics", collectors::dcgm::KIND)];

/// The kind `kind` names: itself, or the kind an alias stands for.
pub fn canonical_kind(kind: &str) -> &str {
    KIND_ALIASES
        .iter()
        .find(|(alias, _)| *alias == kind)
        .map_or(kind, |(_, k)| k)
}

/// Whether `kind` names a collector of this build, with a message for config errors.
fn check_kind(kind: &str) -> Result<(), String> {
    let kind = canonical_kind(kind);
    if KINDS.contains(&kind) {
        Ok(())
    } else if KINDS.is_empty() {
        Err(format!(
            "unknown collector type `{kind}`: this build has no pull collectors yet; push through \
             POST /api/v1/ingest or run the agent instead"
        ))
    } else {
        let aliases: Vec<String> = KIND_ALIASES
            .iter()
            .map(|(alias, k)| format!("`{alias}` is another name for `{k}`"))
            .collect();
        Err(format!(
            "unknown collector type `{kind}`; known: {} ({})",
            KINDS.join(", "),
            aliases.join("; ")
        ))
    }
}

/// The keys every `[[collectors]]` entry has, whatever its kind. [`Entry::parse`] reads them;
/// a kind reads only the rest, so none of them is a kind's setting.
pub const COMMON_KEYS: &[&str] = &["type", "name", "interval_secs"];

/// How often a collector runs when its entry gives no `interval_secs`.
pub const DEFAULT_INTERVAL_SECS: u64 = 60;
/// The `interval_secs` a collector entry may give.
pub const INTERVAL_SECS_RANGE: std::ops::RangeInclusive<u64> = 10..=3600;

/// A checked `[[collectors]]` entry: the fields every kind shares, read once by
/// [`Entry::parse`], and the kind's own settings, checked by the kind. `serve` builds its
/// collectors from these, and `check-config` builds them the same way.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The source name its observations carry.
    pub name: String,
    pub interval_secs: u64,
    pub settings: Settings,
}

/// A kind's checked settings; the variant is the kind (the entry's `type`).
#[derive(Debug, Clone, PartialEq)]
pub enum Settings {
    Aws(collectors::aws::AwsConfig),
    Azure(collectors::azure::AzureConfig),
    Billing(collectors::billing::BillingConfig),
    Dcgm(collectors::dcgm::DcgmConfig),
    Gcp(collectors::gcp::GcpConfig),
    Kubernetes(collectors::kubernetes::KubernetesConfig),
    Slurm(collectors::slurm::SlurmConfig),
    Spreadsheet(collectors::spreadsheet::SpreadsheetConfig),
}

/// One problem with a `[[collectors]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryProblem {
    /// The common key it is about; `None` when it is about the entry as a whole or one of the
    /// kind's settings (the message then names the setting).
    pub key: Option<&'static str>,
    pub message: String,
}

impl EntryProblem {
    fn at(key: &'static str, message: impl Into<String>) -> EntryProblem {
        EntryProblem {
            key: Some(key),
            message: message.into(),
        }
    }

    fn entry(message: impl Into<String>) -> EntryProblem {
        EntryProblem {
            key: None,
            message: message.into(),
        }
    }
}

impl Entry {
    /// Read and check one `[[collectors]]` table, common fields and the kind's settings, and
    /// say every problem found, not just the first.
    pub fn parse(table: &toml_edit::Table) -> Result<Entry, Vec<EntryProblem>> {
        let mut problems = Vec::new();
        let mut text = |key: &'static str, what: &str| match table.get(key) {
            None => {
                problems.push(EntryProblem::entry(format!("needs `{key}` ({what})")));
                None
            }
            Some(item) => match item.as_str() {
                Some(s) if !s.trim().is_empty() => Some(s.to_string()),
                Some(_) => {
                    problems.push(EntryProblem::at(key, "must not be empty"));
                    None
                }
                None => {
                    problems.push(EntryProblem::at(key, "must be a string"));
                    None
                }
            },
        };
        let kind = text("type", "the collector kind");
        let name = text("name", "the source name it reports as");
        let kind = kind
            .filter(|k| match check_kind(k) {
                Ok(()) => true,
                Err(e) => {
                    problems.push(EntryProblem::at("type", e));
                    false
                }
            })
            .map(|k| canonical_kind(&k).to_string());
        let (lo, hi) = (*INTERVAL_SECS_RANGE.start(), *INTERVAL_SECS_RANGE.end());
        let interval_secs = match table.get("interval_secs").map(|i| i.as_integer()) {
            None => DEFAULT_INTERVAL_SECS,
            Some(Some(v)) if v >= lo as i64 && v <= hi as i64 => v as u64,
            Some(Some(v)) => {
                problems.push(EntryProblem::at(
                    "interval_secs",
                    format!("must be within {lo}..={hi}, got {v}"),
                ));
                DEFAULT_INTERVAL_SECS
            }
            Some(None) => {
                problems.push(EntryProblem::at(
                    "interval_secs",
                    "must be an integer (seconds)",
                ));
                DEFAULT_INTERVAL_SECS
            }
        };
        // The kind's settings are checked even when the name is missing, so that one run of
        // check-config names every problem; a kind that defaults to the name sees a stand-in.
        let settings = kind.as_deref().and_then(|kind| {
            let named = name.as_deref().unwrap_or("unnamed");
            Settings::parse(kind, named, &without_common_keys(table))
                .map_err(|e| {
                    problems.push(EntryProblem::entry(format!(
                        "{kind} collector `{named}`: {e}"
                    )))
                })
                .ok()
        });
        match (name, settings) {
            (Some(name), Some(settings)) if problems.is_empty() => Ok(Entry {
                name,
                interval_secs,
                settings,
            }),
            _ => Err(problems),
        }
    }

    /// The kind string.
    pub fn kind(&self) -> &'static str {
        self.settings.kind()
    }

    /// Build the collector this entry configures.
    pub fn build(&self) -> Result<Box<dyn Collector>, CollectError> {
        self.settings.build(&self.name)
    }

    /// The collectors this entry stands for: itself, or for a `kubernetes` entry with
    /// `kubeconfig_dir`, one per kubeconfig file in the folder, named `<name>-<file stem>`
    /// (see [`collectors::kubernetes::read_kubeconfig_dir`]). The folder is read now, so that
    /// a reload sees the files added or removed since.
    pub fn expand(&self) -> Result<Expansion, CollectError> {
        let Settings::Kubernetes(template) = &self.settings else {
            return Ok(Expansion {
                entries: vec![self.clone()],
                skipped: Vec::new(),
            });
        };
        let dir = collectors::kubernetes::read_kubeconfig_dir(&self.name, template)?;
        Ok(Expansion {
            entries: dir
                .clusters
                .into_iter()
                .map(|(name, config)| Entry {
                    name,
                    interval_secs: self.interval_secs,
                    settings: Settings::Kubernetes(config),
                })
                .collect(),
            skipped: dir.skipped,
        })
    }

    /// A file the collector reads once, when it starts (a kubeconfig): a running collector
    /// does not see it change, so a reload restarts it when the file's content changed.
    pub fn read_at_start(&self) -> Option<&std::path::Path> {
        match &self.settings {
            Settings::Kubernetes(c) => match &c.access {
                collectors::kubernetes::Access::Kubeconfig { path, .. } => Some(path),
                _ => None,
            },
            _ => None,
        }
    }

    /// One line saying what this collector reads, for `check-config`.
    pub fn describe(&self) -> String {
        use collectors::kubernetes::Access;
        let what = match &self.settings {
            Settings::Kubernetes(c) => match &c.access {
                Access::Kubeconfig { path, .. } => {
                    format!(", cluster `{}`, kubeconfig {}", c.cluster, path.display())
                }
                Access::InCluster => format!(", cluster `{}`, in cluster", c.cluster),
                Access::Infer { .. } => {
                    format!(", cluster `{}`, kubeconfig as kubectl finds it", c.cluster)
                }
                Access::KubeconfigDir { dir, .. } => format!(", kubeconfig_dir {}", dir.display()),
            },
            _ => String::new(),
        };
        format!(
            "{} `{}`: every {} s{what}",
            self.kind(),
            self.name,
            self.interval_secs
        )
    }
}

/// What one `[[collectors]]` entry stands for once the folder it names, if any, is read.
#[derive(Debug, Default)]
pub struct Expansion {
    /// One entry per collector, each with its own source name.
    pub entries: Vec<Entry>,
    /// Files of the folder left out, each naming the file and why; the others are kept.
    pub skipped: Vec<String>,
}

impl Settings {
    /// Check the settings of a collector of `kind` named `name`: the entry without the
    /// [`COMMON_KEYS`].
    pub fn parse(kind: &str, name: &str, own: &toml_edit::Table) -> Result<Settings, CollectError> {
        use collectors::{aws, azure, billing, dcgm, gcp, kubernetes, slurm, spreadsheet};
        Ok(match canonical_kind(kind) {
            aws::KIND => Settings::Aws(aws::AwsConfig::from_settings(own)?),
            azure::KIND => Settings::Azure(azure::AzureConfig::from_settings(own)?),
            gcp::KIND => Settings::Gcp(gcp::GcpConfig::from_settings(own)?),
            slurm::KIND => Settings::Slurm(slurm::SlurmConfig::from_settings(own)?),
            spreadsheet::KIND => {
                Settings::Spreadsheet(spreadsheet::SpreadsheetConfig::from_settings(own)?)
            }
            billing::KIND => Settings::Billing(billing::BillingConfig::from_settings(own)?),
            dcgm::KIND => Settings::Dcgm(dcgm::DcgmConfig::from_settings(own)?),
            kubernetes::KIND => {
                Settings::Kubernetes(kubernetes::KubernetesConfig::from_settings(name, own)?)
            }
            _ => {
                return Err(CollectError::Config(
                    check_kind(kind).err().unwrap_or_default(),
                ))
            }
        })
    }

    /// The kind string.
    pub fn kind(&self) -> &'static str {
        match self {
            Settings::Aws(_) => collectors::aws::KIND,
            Settings::Azure(_) => collectors::azure::KIND,
            Settings::Gcp(_) => collectors::gcp::KIND,
            Settings::Slurm(_) => collectors::slurm::KIND,
            Settings::Spreadsheet(_) => collectors::spreadsheet::KIND,
            Settings::Billing(_) => collectors::billing::KIND,
            Settings::Dcgm(_) => collectors::dcgm::KIND,
            Settings::Kubernetes(_) => collectors::kubernetes::KIND,
        }
    }

    /// Build the collector named `name`.
    pub fn build(&self, name: &str) -> Result<Box<dyn Collector>, CollectError> {
        use collectors::{aws, azure, billing, dcgm, gcp, kubernetes, slurm, spreadsheet};
        Ok(match self {
            Settings::Aws(c) => Box::new(aws::AwsCollector::new(name, c.clone())?),
            Settings::Azure(c) => Box::new(azure::AzureCollector::new(name, c.clone())?),
            Settings::Gcp(c) => Box::new(gcp::GcpCollector::new(name, c.clone())?),
            Settings::Slurm(c) => Box::new(slurm::SlurmCollector::new(name, c.clone())?),
            Settings::Spreadsheet(c) => {
                Box::new(spreadsheet::SpreadsheetCollector::new(name, c.clone())?)
            }
            Settings::Billing(c) => Box::new(billing::BillingCollector::new(name, c.clone())),
            Settings::Dcgm(c) => Box::new(dcgm::DcgmCollector::new(name, c.clone())?),
            Settings::Kubernetes(c) => {
                Box::new(kubernetes::KubernetesCollector::new(name, c.clone()))
            }
        })
    }
}

/// An entry without the [`COMMON_KEYS`]: what a kind's settings are read from.
fn without_common_keys(entry: &toml_edit::Table) -> toml_edit::Table {
    let mut own = entry.clone();
    for key in COMMON_KEYS {
        own.remove(key);
    }
    own
}

/// An entry's TOML text without the [`COMMON_KEYS`].
pub(crate) fn own_settings(config_toml: &str) -> Result<toml_edit::Table, CollectError> {
    let doc: toml_edit::DocumentMut = config_toml
        .parse()
        .map_err(|e: toml_edit::TomlError| CollectError::Config(one_line(&e.to_string())))?;
    Ok(without_common_keys(doc.as_table()))
}

/// Read a kind's settings (its `FileConfig`, which denies unknown fields) from the entry's own
/// table.
pub(crate) fn read_settings<T: serde::de::DeserializeOwned>(
    own: &toml_edit::Table,
) -> Result<T, CollectError> {
    use serde::de::IntoDeserializer;
    let value = toml_edit::Value::InlineTable(own.clone().into_inline_table());
    T::deserialize(value.into_deserializer())
        .map_err(|e| CollectError::Config(one_line(&e.to_string())))
}

fn one_line(text: &str) -> String {
    text.trim().replace('\n', " ")
}

/// Build the collector for an entry given as TOML text (its `type` and `name` may be in it;
/// `kind` and `name` are what count).
pub fn build(
    kind: &str,
    name: &str,
    config_toml: &str,
) -> Result<Box<dyn Collector>, CollectError> {
    Settings::parse(kind, name, &own_settings(config_toml)?)?.build(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kinds_are_explained() {
        let e = check_kind("kubernets").unwrap_err();
        assert!(e.contains("unknown collector type `kubernets`"), "{e}");
        assert!(
            e.contains("known: aws, azure, billing, dcgm, gcp, kubernetes, slurm, spreadsheet"),
            "{e}"
        );
        assert!(build("nope", "x", "").is_err());
    }

    #[test]
    fn gpu_metrics_is_another_name_for_dcgm() {
        assert!(check_kind("gpu-metrics").is_ok());
        let c = build(
            "gpu-metrics",
            "mixed-farm",
            "type = \"gpu-metrics\"\nname = \"mixed-farm\"\nendpoints = [\"http://127.0.0.1:9400/metrics\"]\n",
        )
        .unwrap();
        assert_eq!((c.kind(), c.name()), ("dcgm", "mixed-farm"));
        let e = check_kind("gpu-metric").unwrap_err();
        assert!(
            e.contains("`gpu-metrics` is another name for `dcgm`"),
            "{e}"
        );
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

    fn table(text: &str) -> toml_edit::Table {
        text.parse::<toml_edit::DocumentMut>()
            .unwrap()
            .as_table()
            .clone()
    }

    /// `type`, `name` and `interval_secs` are read once, here; the kind sees only its own
    /// settings, and every problem of an entry is named at once.
    #[test]
    fn entries_read_the_common_fields_once_and_name_every_problem() {
        let e = Entry::parse(&table(
            "type = \"kubernetes\"\nname = \"rdu\"\ninterval_secs = 30\nkubeconfig = \"/k\"\n",
        ))
        .unwrap();
        assert_eq!(
            (e.kind(), e.name.as_str(), e.interval_secs),
            ("kubernetes", "rdu", 30)
        );
        let Settings::Kubernetes(k) = &e.settings else {
            panic!("{e:?}")
        };
        assert_eq!(k.cluster, "rdu", "the cluster defaults to the entry's name");
        let c = e.build().unwrap();
        assert_eq!((c.kind(), c.name()), ("kubernetes", "rdu"));
        let e = Entry::parse(&table("type = \"billing\"\nname = \"f\"\ndir = \"/x\"\n")).unwrap();
        assert_eq!(e.interval_secs, DEFAULT_INTERVAL_SECS);

        let problems = Entry::parse(&table(
            "type = \"dcgm\"\ninterval_secs = 5\nendpoints = [\"nope\"]\n",
        ))
        .unwrap_err();
        let text: Vec<String> = problems
            .iter()
            .map(|p| format!("{:?}: {}", p.key, p.message))
            .collect();
        assert_eq!(text.len(), 3, "{text:#?}");
        assert!(text[0].starts_with("None: needs `name`"), "{text:#?}");
        assert!(
            text[1].starts_with("Some(\"interval_secs\"): must be within 10..=3600, got 5"),
            "{text:#?}"
        );
        assert!(
            text[2]
                .starts_with("None: dcgm collector `unnamed`: endpoints[0]: `nope` is not a URL"),
            "{text:#?}"
        );
        let problems =
            Entry::parse(&table("type = \"lsf\"\nname = 3\ninterval_secs = \"1m\"\n")).unwrap_err();
        let keys: Vec<_> = problems.iter().map(|p| p.key).collect();
        assert_eq!(
            keys,
            [Some("name"), Some("type"), Some("interval_secs")],
            "{problems:#?}"
        );
        let e = Entry::parse(&table(
            "type = \"billing\"\nname = \"f\"\nfolder = \"/x\"\n",
        ))
        .unwrap_err();
        assert!(
            e[0].message.contains("unknown field `folder`") && e[0].message.contains("`dir`"),
            "{e:#?}"
        );
    }

    /// A `kubeconfig_dir` entry stands for one entry per file, each with the template's
    /// interval; any other entry stands for itself.
    #[test]
    fn entries_expand_a_kubeconfig_dir_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("gpuledger-expand-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for stem in ["a", "b"] {
            std::fs::write(
                dir.join(format!("{stem}.kubeconfig")),
                format!(
                    "current-context: x\nclusters:\n- name: c\n  cluster:\n    server: https://{stem}\n\
                     contexts:\n- name: x\n  context:\n    cluster: c\n"
                ),
            )
            .unwrap();
        }
        let e = Entry::parse(&table(&format!(
            "type = \"kubernetes\"\nname = \"k8s\"\ninterval_secs = 30\nkubeconfig_dir = \"{}\"\n",
            dir.display()
        )))
        .unwrap();
        assert_eq!(e.read_at_start(), None);
        let x = e.expand().unwrap();
        assert!(x.skipped.is_empty(), "{:?}", x.skipped);
        let got: Vec<String> = x.entries.iter().map(Entry::describe).collect();
        assert_eq!(
            got,
            [
                format!(
                    "kubernetes `k8s-a`: every 30 s, cluster `a`, kubeconfig {}",
                    dir.join("a.kubeconfig").display()
                ),
                format!(
                    "kubernetes `k8s-b`: every 30 s, cluster `b`, kubeconfig {}",
                    dir.join("b.kubeconfig").display()
                ),
            ]
        );
        assert_eq!(
            x.entries[1].read_at_start(),
            Some(dir.join("b.kubeconfig").as_path())
        );
        let one = Entry::parse(&table("type = \"billing\"\nname = \"f\"\ndir = \"/x\"\n")).unwrap();
        assert_eq!(one.expand().unwrap().entries, std::slice::from_ref(&one));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Only a configuration error stops a collector; what the source answered may be usable
    /// next time.
    #[test]
    fn only_config_errors_are_final() {
        assert!(CollectError::Transient("timeout".into()).is_retryable());
        assert!(CollectError::Data("no GPU found".into()).is_retryable());
        assert!(!CollectError::Config("bad URL".into()).is_retryable());
    }
}
