//! The `dcgm` collector: GPUs, MIG instances, AMD compute partitions, utilization and pod/job
//! evidence from the GPU exporters a cluster already runs: NVIDIA dcgm-exporter, AMD's
//! device-metrics-exporter and the Intel Gaudi metric exporter, read either by scraping
//! exporter endpoints or by querying a Prometheus that scrapes them (which also allows a
//! `query_range` backfill after gpuledger was down). Which exporter an endpoint is, is read off
//! the metric families it answers with; one Prometheus may hold all three.
//!
//! Read-only: it sends GET requests and nothing else. The families read, per exporter, are in
//! [`families`]; parsing and mapping in [`parse`].
//!
//! ```toml
//! [[collectors]]
//! type = "dcgm"
//! name = "dcgm-rdu"
//! endpoints = ["http://10.0.0.5:9400/metrics"]   # scrape mode, or instead:
//! # prometheus_url = "http://prometheus:9090"   # query mode
//! # matchers = 'cluster="rdu"'                  # query mode: narrow the series
//! # bearer_token_file = "/var/run/secrets/token"
//! timeout_secs = 10
//! backfill_max_hours = 24
//! backfill_step_secs = 60
//! ```

pub mod families;
pub mod parse;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpuledger_model::{AllocationKind, Observation, Provenance, PushAllocation, PushGpu};
use serde::Deserialize;

use crate::http::get_bytes;
use crate::{
    in_range, now_secs, CollectError, CollectFuture, CollectReport, Collector, PartProblem,
    ReportFuture,
};
use parse::{Hold, Mapped};

/// The kind string: config `type`, module name, test module.
pub const KIND: &str = "dcgm";

/// The largest answer read from an exporter or a Prometheus.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;
/// Points per series in one `query_range` request (Prometheus refuses more than 11,000).
const BACKFILL_POINTS_PER_REQUEST: i64 = 120;

/// The entry's own settings as written (the fields every entry shares are read by
/// [`crate::Entry`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    endpoints: Vec<String>,
    prometheus_url: Option<String>,
    matchers: Option<String>,
    timeout_secs: Option<u64>,
    backfill_max_hours: Option<u64>,
    backfill_step_secs: Option<u64>,
    bearer_token_file: Option<PathBuf>,
}

/// Where the collector reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// GET each exporter's `/metrics` endpoint.
    Scrape { endpoints: Vec<String> },
    /// Ask a Prometheus for the families read ([`families::query_metrics`]); `matchers` narrow
    /// them (`cluster="rdu"`).
    Query {
        prometheus_url: String,
        matchers: Option<String>,
    },
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct DcgmConfig {
    pub mode: Mode,
    pub timeout_secs: u64,
    /// Backfill never reaches further back than this.
    pub backfill_max_hours: u64,
    /// Resolution of backfilled samples.
    pub backfill_step_secs: u64,
    /// A file holding a bearer token, read on every request (so rotation needs no restart).
    pub bearer_token_file: Option<PathBuf>,
}

impl DcgmConfig {
    /// Read and check a `[[collectors]]` entry's TOML text.
    pub fn from_toml(text: &str) -> Result<DcgmConfig, CollectError> {
        DcgmConfig::from_settings(&crate::own_settings(text)?)
    }

    /// Read and check an entry's own settings (the entry without [`crate::COMMON_KEYS`]).
    pub fn from_settings(own: &toml_edit::Table) -> Result<DcgmConfig, CollectError> {
        let raw: FileConfig = crate::read_settings(own)?;
        let mode =
            match (raw.endpoints.is_empty(), raw.prometheus_url) {
                (false, Some(_)) => return Err(CollectError::Config(
                    "set either `endpoints` (scrape dcgm-exporter) or `prometheus_url` (query a \
                     Prometheus), not both"
                        .into(),
                )),
                (true, None) => return Err(CollectError::Config(
                    "set `endpoints = [\"http://HOST:9400/metrics\"]` to scrape dcgm-exporter, or \
                     `prometheus_url = \"http://HOST:9090\"` to query a Prometheus"
                        .into(),
                )),
                (false, None) => {
                    let mut endpoints = Vec::with_capacity(raw.endpoints.len());
                    for (i, e) in raw.endpoints.iter().enumerate() {
                        endpoints.push(http_url(&format!("endpoints[{i}]"), e)?);
                    }
                    if raw.matchers.is_some() {
                        return Err(CollectError::Config(
                            "`matchers` narrows a Prometheus query; it needs `prometheus_url`"
                                .into(),
                        ));
                    }
                    Mode::Scrape { endpoints }
                }
                (true, Some(url)) => {
                    let url = http_url("prometheus_url", &url)?;
                    let base = url.trim_end_matches('/');
                    if base.ends_with("/api/v1") || base.contains("/api/v1/") {
                        return Err(CollectError::Config(format!(
                            "prometheus_url: give the server's URL without /api/v1 (`{}`)",
                            base.split("/api/v1").next().unwrap_or(base)
                        )));
                    }
                    let matchers = match raw.matchers.map(|m| m.trim().to_string()) {
                        Some(m) if m.is_empty() || m.contains(['{', '}']) => {
                            return Err(CollectError::Config(format!(
                                "matchers: `{m}` must be label matchers without braces, like \
                             `cluster=\"rdu\",job=\"dcgm\"`"
                            )))
                        }
                        m => m,
                    };
                    Mode::Query {
                        prometheus_url: base.to_string(),
                        matchers,
                    }
                }
            };
        Ok(DcgmConfig {
            mode,
            timeout_secs: in_range("timeout_secs", raw.timeout_secs, 10, 1, 300)?,
            backfill_max_hours: in_range("backfill_max_hours", raw.backfill_max_hours, 24, 1, 744)?,
            backfill_step_secs: in_range(
                "backfill_step_secs",
                raw.backfill_step_secs,
                60,
                1,
                3600,
            )?,
            bearer_token_file: raw.bearer_token_file,
        })
    }
}

fn http_url(key: &str, s: &str) -> Result<String, CollectError> {
    match reqwest::Url::parse(s.trim()) {
        Ok(u) if crate::http::is_link_local(&u) => Err(CollectError::Config(format!(
            "{key}: `{s}` is a link-local address, where clouds serve instance metadata and \
             credentials; a collector never reads it"
        ))),
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {
            Ok(s.trim().to_string())
        }
        Ok(_) => Err(CollectError::Config(format!(
            "{key}: `{s}` is not an http:// or https:// URL"
        ))),
        Err(e) => Err(CollectError::Config(format!(
            "{key}: `{s}` is not a URL ({e}); write it like http://HOST:PORT/PATH"
        ))),
    }
}

/// An allocation the collector has seen and keeps open until its labels disappear.
#[derive(Debug, Clone, Copy)]
struct Held {
    start: DateTime<Utc>,
    last: DateTime<Utc>,
    kind: AllocationKind,
    label: &'static str,
}

/// (part, GPU UUID, allocation kind, workload)
type HeldKey = (String, String, &'static str, String);

/// A configured `dcgm` source.
pub struct DcgmCollector {
    name: String,
    config: DcgmConfig,
    client: reqwest::Client,
    /// Open allocations by where they were seen, so that one that disappears is closed at the
    /// last time it was seen, and one still there keeps the start it was first seen at.
    held: Mutex<BTreeMap<HeldKey, Held>>,
}

impl DcgmCollector {
    /// Build from a `[[collectors]]` entry's TOML text.
    pub fn from_toml(name: &str, text: &str) -> Result<DcgmCollector, CollectError> {
        DcgmCollector::new(name, DcgmConfig::from_toml(text)?)
    }

    pub fn new(name: &str, config: DcgmConfig) -> Result<DcgmCollector, CollectError> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(config.timeout_secs))
            .connect_timeout(Duration::from_secs(config.timeout_secs.min(5)))
            .user_agent(concat!("gpuledger-dcgm/", env!("CARGO_PKG_VERSION")))
            .redirect(crate::http::same_origin_redirects())
            .build()
            .map_err(|e| CollectError::Config(format!("cannot set up the HTTP client: {e}")))?;
        Ok(DcgmCollector {
            name: name.to_string(),
            config,
            client,
            held: Mutex::new(BTreeMap::new()),
        })
    }

    pub fn config(&self) -> &DcgmConfig {
        &self.config
    }

    /// Read every endpoint (or the Prometheus) once.
    pub async fn run(&self) -> Result<CollectReport, CollectError> {
        match &self.config.mode {
            Mode::Scrape { endpoints } => self.scrape_all(endpoints).await,
            Mode::Query {
                prometheus_url,
                matchers,
            } => self.query_now(prometheus_url, matchers.as_deref()).await,
        }
    }

    async fn scrape_all(&self, endpoints: &[String]) -> Result<CollectReport, CollectError> {
        let observed_at = now_secs();
        let results = futures_util::future::join_all(
            endpoints
                .iter()
                .map(|url| self.scrape_one(url, observed_at)),
        )
        .await;
        let mut report = CollectReport::default();
        let mut failed = Vec::new();
        for (url, result) in endpoints.iter().zip(results) {
            match result {
                Ok(mapped) => self.add(&mut report, url, mapped, observed_at),
                Err(error) => failed.push(PartProblem {
                    part: url.clone(),
                    error,
                }),
            }
        }
        if failed.len() == endpoints.len() {
            return Err(crate::all_failed(&failed, "parts", |p| p.error.to_string()));
        }
        report.problems.extend(failed);
        Ok(report)
    }

    async fn scrape_one(
        &self,
        url: &str,
        observed_at: DateTime<Utc>,
    ) -> Result<Mapped, CollectError> {
        let what = format!("GET {url}");
        let body = get_bytes(
            self.authorized(self.client.get(url))?,
            &what,
            MAX_ANSWER_BYTES,
        )
        .await?;
        let mapped = parse::map_text(&String::from_utf8_lossy(&body), observed_at);
        if mapped.gpus.is_empty() {
            let why = if mapped.problems.is_empty() {
                String::new()
            } else {
                format!(" ({})", mapped.problems.join("; "))
            };
            let found = if mapped.vendors.is_empty() {
                format!(
                    "none of the metric families gpuledger reads ({})",
                    families::LOOKED_FOR
                )
            } else {
                format!("{} series name no device", exporters(&mapped.vendors))
            };
            return Err(CollectError::Data(format!(
                "{what}: no GPU found: {found}{why}; point `endpoints` at dcgm-exporter's \
                 /metrics (port 9400 by default), AMD device-metrics-exporter's (5000) or the \
                 Gaudi metric exporter's (41611)"
            )));
        }
        Ok(mapped)
    }

    /// The series selector for a Prometheus: every metric gpuledger reads, narrowed by `matchers`.
    fn selector(matchers: Option<&str>) -> String {
        format!(
            "{{__name__=~\"{}\"{}}}",
            families::query_metrics().join("|"),
            matchers.map(|m| format!(",{m}")).unwrap_or_default()
        )
    }

    async fn query_now(
        &self,
        base: &str,
        matchers: Option<&str>,
    ) -> Result<CollectReport, CollectError> {
        let selector = Self::selector(matchers);
        let url = format!("{base}/api/v1/query");
        let what = format!("GET {url}?query={selector}");
        let req = self.client.get(&url).query(&[("query", selector.as_str())]);
        let parsed = self.api(req, &what).await?;
        let mut mapped = parse::map(&parsed.series, now_secs());
        mapped.problems.splice(0..0, parsed.problems);
        if mapped.gpus.is_empty() {
            return Err(CollectError::Data(format!(
                "{what}: Prometheus has no series of the families gpuledger reads that name a \
                 device; check that it scrapes dcgm-exporter, AMD device-metrics-exporter or the \
                 Gaudi metric exporter{}",
                if matchers.is_some() {
                    " and that `matchers` match them"
                } else {
                    ""
                }
            )));
        }
        let observed_at = mapped
            .gpus
            .iter()
            .map(|g| g.observed_at)
            .max()
            .unwrap_or_else(now_secs);
        let mut report = CollectReport::default();
        self.add(&mut report, base, mapped, observed_at);
        Ok(report)
    }

    async fn api(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<parse::Parsed, CollectError> {
        let body = get_bytes(self.authorized(req)?, what, MAX_ANSWER_BYTES).await?;
        let parsed = parse::parse_api(&body).map_err(|e| {
            if let Some(detail) = &e.detail {
                tracing::warn!(request = %what, error_type = ?e.error_type, message = ?detail, "Prometheus answered an error");
            }
            let msg = format!("{what}: {e}");
            match e.error_type.as_deref() {
                Some("bad_data") => CollectError::Config(format!("{msg}; check `matchers`")),
                Some("timeout" | "unavailable" | "canceled") => CollectError::Transient(msg),
                _ => CollectError::Data(msg),
            }
        })?;
        for warning in &parsed.log {
            tracing::warn!(request = %what, warning = ?warning, "Prometheus warned about the query");
        }
        Ok(parsed)
    }

    fn authorized(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::RequestBuilder, CollectError> {
        let Some(path) = &self.config.bearer_token_file else {
            return Ok(req);
        };
        let token = std::fs::read_to_string(path).map_err(|e| {
            CollectError::Config(format!(
                "bearer_token_file: cannot read {}: {e}",
                path.display()
            ))
        })?;
        Ok(req.bearer_auth(token.trim()))
    }

    /// Read the samples and allocations a Prometheus recorded between `since` and `until`, in
    /// `query_range` windows of [`BACKFILL_POINTS_PER_REQUEST`] steps. Never reaches back more
    /// than `backfill_max_hours`. A window that fails is reported; the others are kept.
    pub async fn backfill_range(
        &self,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<CollectReport, CollectError> {
        let Mode::Query {
            prometheus_url: base,
            matchers,
        } = &self.config.mode
        else {
            return Err(CollectError::Config(
                "backfill needs `prometheus_url`: a dcgm-exporter endpoint keeps no history".into(),
            ));
        };
        let step = self.config.backfill_step_secs as i64;
        let earliest = until.timestamp() - self.config.backfill_max_hours as i64 * 3600;
        // Whole steps, so that a rerun yields the same sample times (samples are keyed by time).
        let mut start = (since.timestamp().max(earliest) + step - 1).div_euclid(step) * step;
        let end_all = until.timestamp();
        let selector = Self::selector(matchers.as_deref());
        let url = format!("{base}/api/v1/query_range");

        let mut gpus: BTreeMap<(String, bool, String), PushGpu> = BTreeMap::new();
        let mut samples = Vec::new();
        let mut holds: BTreeMap<(String, &'static str, String), Hold> = BTreeMap::new();
        let mut report = CollectReport::default();
        let (mut windows, mut failed) = (0usize, Vec::new());
        while start <= end_all {
            let end = (start + step * (BACKFILL_POINTS_PER_REQUEST - 1)).min(end_all);
            windows += 1;
            let what = format!("GET {url}?query={selector}&start={start}&end={end}&step={step}");
            let req = self.client.get(&url).query(&[
                ("query", selector.clone()),
                ("start", start.to_string()),
                ("end", end.to_string()),
                ("step", step.to_string()),
            ]);
            match self.api(req, &what).await {
                Ok(parsed) => {
                    let mapped = parse::map(&parsed.series, until);
                    for p in parsed.problems.into_iter().chain(mapped.problems) {
                        report.problems.push(PartProblem {
                            part: what.clone(),
                            error: CollectError::Data(p),
                        });
                    }
                    for g in mapped.gpus {
                        let key = (
                            g.mig_parent_uuid.clone().unwrap_or_else(|| g.uuid.clone()),
                            g.mig_parent_uuid.is_some(),
                            g.uuid.clone(),
                        );
                        match gpus.get(&key) {
                            Some(old) if old.observed_at >= g.observed_at => {}
                            _ => {
                                gpus.insert(key, g);
                            }
                        }
                    }
                    samples.extend(mapped.samples);
                    for h in mapped.holds {
                        let key = (h.gpu_uuid.clone(), h.kind.as_str(), h.workload.clone());
                        match holds.get_mut(&key) {
                            Some(old) => old.merge(&h),
                            None => {
                                holds.insert(key, h);
                            }
                        }
                    }
                }
                Err(error) => failed.push(PartProblem { part: what, error }),
            }
            start = end + step;
        }
        if windows > 0 && failed.len() == windows {
            return Err(crate::all_failed(&failed, "parts", |p| p.error.to_string()));
        }
        report.problems.extend(failed);
        let provenance = |observed_at| Provenance {
            source: self.name.clone(),
            observed_at,
            raw_key: Some(base.clone()),
        };
        let obs = &mut report.observations;
        for gpu in gpus.into_values() {
            obs.push(Observation::Gpu {
                provenance: provenance(gpu.observed_at),
                gpu,
            });
        }
        for sample in samples {
            obs.push(Observation::Sample {
                provenance: provenance(sample.ts),
                sample,
            });
        }
        for hold in holds.into_values() {
            obs.push(Observation::Allocation {
                provenance: Provenance {
                    raw_key: Some(format!("{base} {}", hold.label)),
                    ..provenance(hold.last)
                },
                allocation: hold.allocation(),
            });
        }
        Ok(report)
    }

    /// Turn one part's mapping into observations, carrying allocations across runs.
    fn add(
        &self,
        report: &mut CollectReport,
        part: &str,
        mapped: Mapped,
        observed_at: DateTime<Utc>,
    ) {
        let provenance = |observed_at| Provenance {
            source: self.name.clone(),
            observed_at,
            raw_key: Some(part.to_string()),
        };
        for p in &mapped.problems {
            report.problems.push(PartProblem {
                part: part.to_string(),
                error: CollectError::Data(p.clone()),
            });
        }
        let allocations = self.track(part, &mapped.holds);
        let obs = &mut report.observations;
        for gpu in mapped.gpus {
            obs.push(Observation::Gpu {
                provenance: provenance(gpu.observed_at),
                gpu,
            });
        }
        for sample in mapped.samples {
            obs.push(Observation::Sample {
                provenance: provenance(sample.ts),
                sample,
            });
        }
        for (allocation, label) in allocations {
            obs.push(Observation::Allocation {
                provenance: Provenance {
                    raw_key: Some(format!("{part} {label}")),
                    ..provenance(observed_at)
                },
                allocation,
            });
        }
    }

    /// Allocations for this run of `part`: each seen hold starts when the collector first saw
    /// it (across runs), and a hold seen before but not now is closed at its last sighting.
    /// Each allocation comes with the label that showed it.
    fn track(&self, part: &str, holds: &[Hold]) -> Vec<(PushAllocation, &'static str)> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for h in holds {
            let key = (
                part.to_string(),
                h.gpu_uuid.clone(),
                h.kind.as_str(),
                h.workload.clone(),
            );
            let entry = held.entry(key.clone()).or_insert(Held {
                start: h.first,
                last: h.last,
                kind: h.kind,
                label: h.label,
            });
            entry.last = entry.last.max(h.last);
            let mut a = h.allocation();
            a.start = entry.start;
            if a.end.is_some() {
                held.remove(&key);
            }
            seen.insert(key);
            out.push((a, h.label));
        }
        let gone: Vec<HeldKey> = held
            .keys()
            .filter(|k| k.0 == part && !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            if let Some(h) = held.remove(&key) {
                let a = PushAllocation {
                    context: Default::default(),
                    gpu_uuid: key.1,
                    start: h.start,
                    end: Some(h.last),
                    workload: key.3,
                    kind: h.kind,
                    user: None,
                    team: None,
                    owner: None,
                    avg_util_pct: None,
                    avg_mem_used_mib: None,
                };
                out.push((a, h.label));
            }
        }
        out
    }
}

/// The exporters `vendors` stand for, for messages.
fn exporters(vendors: &std::collections::BTreeSet<gpuledger_model::Vendor>) -> String {
    use gpuledger_model::Vendor;
    vendors
        .iter()
        .map(|v| match v {
            Vendor::Nvidia => "dcgm-exporter",
            Vendor::Amd => "AMD device-metrics-exporter",
            Vendor::Intel => "Gaudi metric exporter",
            Vendor::Other => "other",
        })
        .collect::<Vec<_>>()
        .join(" and ")
}

impl Collector for DcgmCollector {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn collect(&self) -> CollectFuture<'_> {
        Box::pin(async move { self.run().await.map(|r| r.observations) })
    }

    fn collect_report(&self) -> ReportFuture<'_> {
        Box::pin(self.run())
    }

    fn backfill(&self, since: DateTime<Utc>) -> Option<ReportFuture<'_>> {
        match self.config.mode {
            Mode::Query { .. } => Some(Box::pin(self.backfill_range(since, Utc::now()))),
            Mode::Scrape { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn err(text: &str) -> String {
        DcgmConfig::from_toml(text).unwrap_err().to_string()
    }

    #[test]
    fn config_takes_one_mode_and_says_what_to_write() {
        let c = DcgmConfig::from_toml(
            "type = \"dcgm\"\nname = \"x\"\nendpoints = [\"http://a:9400/metrics\", \"https://b:9400/metrics\"]\n",
        )
        .unwrap();
        assert_eq!(
            c.mode,
            Mode::Scrape {
                endpoints: vec![
                    "http://a:9400/metrics".into(),
                    "https://b:9400/metrics".into()
                ]
            }
        );
        assert_eq!(
            (c.timeout_secs, c.backfill_max_hours, c.backfill_step_secs),
            (10, 24, 60)
        );
        let c = DcgmConfig::from_toml(
            "prometheus_url = \"http://prom:9090/\"\nmatchers = 'cluster=\"rdu\"'\ntimeout_secs = 3\n",
        )
        .unwrap();
        assert_eq!(
            c.mode,
            Mode::Query {
                prometheus_url: "http://prom:9090".into(),
                matchers: Some("cluster=\"rdu\"".into())
            }
        );
        assert!(err("").contains("set `endpoints = "));
        assert!(
            err("endpoints = [\"http://a\"]\nprometheus_url = \"http://b\"").contains("not both")
        );
        assert!(err("endpoint = [\"http://a\"]").contains("unknown field `endpoint`"));
        assert!(err("endpoints = [\"a:9400\"]").contains("endpoints[0]"));
        assert!(err("endpoints = [\"ftp://a/metrics\"]").contains("not an http://"));
        assert!(err("prometheus_url = \"http://p:9090/api/v1/query\"").contains("without /api/v1"));
        assert!(
            err("prometheus_url = \"http://p\"\nmatchers = '{a=\"b\"}'").contains("without braces")
        );
        assert!(err("endpoints = [\"http://a\"]\nmatchers = 'a=\"b\"'")
            .contains("needs `prometheus_url`"));
        assert!(err("endpoints = [\"http://a\"]\ntimeout_secs = 0")
            .contains("timeout_secs: must be within 1..=300"));
    }

    #[test]
    fn selector_names_every_read_metric() {
        let s = DcgmCollector::selector(Some("job=\"dcgm\""));
        assert!(
            s.starts_with("{__name__=~\"DCGM_FI_PROF_GR_ENGINE_ACTIVE|"),
            "{s}"
        );
        for family in [
            "DCGM_FI_DEV_POWER_USAGE",
            "gpu_gfx_activity",
            "amd_gpu_used_vram",
            "habanalabs_utilization",
            "habanalabs_kube_info",
        ] {
            assert!(
                s.contains(&format!("|{family}|")) || s.contains(&format!("|{family}\"")),
                "{family}: {s}"
            );
        }
        assert!(s.ends_with("\",job=\"dcgm\"}"), "{s}");
    }

    #[tokio::test]
    async fn an_unreadable_token_file_is_a_config_error() {
        let c = DcgmCollector::from_toml(
            "x",
            "prometheus_url = \"http://127.0.0.1:9\"\nbearer_token_file = \"/nonexistent/token\"",
        )
        .unwrap();
        match c.run().await {
            Err(CollectError::Config(m)) => {
                assert!(
                    m.contains("bearer_token_file: cannot read /nonexistent/token"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn allocations_keep_their_first_start_and_close_when_gone() {
        let c = DcgmCollector::from_toml("x", "endpoints = [\"http://a/metrics\"]").unwrap();
        let t = |s: i64| Utc.timestamp_opt(1_764_676_800 + s, 0).unwrap();
        let hold = |ts| Hold {
            gpu_uuid: "GPU-a".into(),
            kind: AllocationKind::Pod,
            workload: "ns/p".into(),
            first: ts,
            last: ts,
            gpu_newest: ts,
            label: "pod",
        };
        let a = c.track("http://a/metrics", &[hold(t(0))]);
        assert_eq!((a[0].0.start, a[0].0.end, a[0].1), (t(0), None, "pod"));
        let a = c.track("http://a/metrics", &[hold(t(60))]);
        assert_eq!(
            (a[0].0.start, a[0].0.end),
            (t(0), None),
            "start is the first sighting"
        );
        // Another endpoint's run does not close it.
        assert!(c.track("http://b/metrics", &[]).is_empty());
        let a = c.track("http://a/metrics", &[]);
        assert_eq!(
            (a[0].0.start, a[0].0.end, a[0].0.kind),
            (t(0), Some(t(60)), AllocationKind::Pod),
            "closed at its last sighting"
        );
        assert!(c.track("http://a/metrics", &[]).is_empty(), "closed once");
    }
}
