//! The `billing` collector: watches a folder where a cloud delivers its FinOps FOCUS billing
//! exports (AWS Data Exports, Azure Cost Management exports, GCP and OCI FOCUS exports, synced
//! to a local or mounted folder) and reports each new or changed file, so that the server
//! reconciles it with the estimates as `gpuledger import billing FILE` does.
//!
//! Read-only: it lists the folder and reads file metadata; the server reads the file.
//!
//! ```toml
//! [[collectors]]
//! type = "billing"
//! name = "aws-focus"
//! dir = "/exports/focus"          # searched recursively (BILLING_PERIOD=2026-11/ folders)
//! patterns = ["*.csv", "*.csv.gz"] # the default
//! settle_secs = 120                # skip files written less than this long ago
//! interval_secs = 3600
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use gpuledger_model::{glob_match, Observation, Provenance};
use serde::Deserialize;

use crate::{
    in_range, now_secs, CollectError, CollectFuture, CollectReport, Collector, PartProblem,
    ReportFuture,
};

/// The kind string: config `type`, module name, test module.
pub const KIND: &str = "billing";

/// How deep folders are searched below `dir`.
const MAX_DEPTH: usize = 8;
/// The most files one run reports (the rest come in later runs).
const MAX_FILES_PER_RUN: usize = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    dir: Option<PathBuf>,
    patterns: Option<Vec<String>>,
    settle_secs: Option<u64>,
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct BillingConfig {
    pub dir: PathBuf,
    /// File name patterns (`*` and `?`).
    pub patterns: Vec<String>,
    /// Files modified more recently than this are left for the next run: still being written.
    pub settle_secs: u64,
}

impl BillingConfig {
    /// Read and check a `[[collectors]]` entry's TOML text.
    pub fn from_toml(text: &str) -> Result<BillingConfig, CollectError> {
        BillingConfig::from_settings(&crate::own_settings(text)?)
    }

    /// Read and check an entry's own settings (the entry without [`crate::COMMON_KEYS`]).
    pub fn from_settings(own: &toml_edit::Table) -> Result<BillingConfig, CollectError> {
        let raw: FileConfig = crate::read_settings(own)?;
        let dir = raw.dir.ok_or_else(|| {
            CollectError::Config(
                "set `dir` to the folder the billing exports are delivered to".into(),
            )
        })?;
        let patterns = raw
            .patterns
            .unwrap_or_else(|| vec!["*.csv".into(), "*.csv.gz".into()]);
        if patterns.is_empty() || patterns.iter().any(|p| p.trim().is_empty()) {
            return Err(CollectError::Config(
                "patterns: give file name patterns, like [\"*.csv\", \"*.csv.gz\"]".into(),
            ));
        }
        Ok(BillingConfig {
            dir,
            patterns,
            settle_secs: in_range("settle_secs", raw.settle_secs, 120, 0, 86_400)?,
        })
    }
}

/// The collector: reports every settled export with its size and modification time; the
/// server imports the ones it has not imported with that size and time yet, so a file that
/// failed to import is tried again on the next run.
pub struct BillingCollector {
    name: String,
    config: BillingConfig,
}

impl BillingCollector {
    /// Build from a `[[collectors]]` entry's TOML text.
    pub fn from_toml(name: &str, text: &str) -> Result<BillingCollector, CollectError> {
        Ok(BillingCollector::new(name, BillingConfig::from_toml(text)?))
    }

    pub fn new(name: &str, config: BillingConfig) -> BillingCollector {
        BillingCollector {
            name: name.to_string(),
            config,
        }
    }

    /// One pass over the folder: the settled files, newest first (at most
    /// [`MAX_FILES_PER_RUN`]), and a problem for each folder that could not be listed.
    pub fn run(&self, now: SystemTime) -> Result<CollectReport, CollectError> {
        let dir = &self.config.dir;
        if !dir.is_dir() {
            return Err(CollectError::Config(format!(
                "dir {}: not a folder this server can read",
                dir.display()
            )));
        }
        let mut files = Vec::new();
        let mut problems = Vec::new();
        walk(dir, 0, &self.config.patterns, &mut files, &mut problems)?;
        files.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
        let settle = Duration::from_secs(self.config.settle_secs);
        let at = now_secs();
        let mut out = Vec::new();
        for (path, size, modified) in files {
            if out.len() >= MAX_FILES_PER_RUN {
                problems.push(PartProblem {
                    part: dir.display().to_string(),
                    error: CollectError::Data(format!(
                        "more than {MAX_FILES_PER_RUN} exports: the oldest wait for later runs"
                    )),
                });
                break;
            }
            if now.duration_since(modified).unwrap_or_default() < settle {
                continue; // Still being written, or just written: next run.
            }
            out.push(Observation::BillingExport {
                path: path.display().to_string(),
                size_bytes: size,
                modified: DateTime::<Utc>::from(modified),
                provenance: Provenance {
                    source: self.name.clone(),
                    observed_at: at,
                    raw_key: Some(path.display().to_string()),
                },
            });
        }
        Ok(CollectReport {
            observations: out,
            problems,
        })
    }
}

/// Files under `dir` whose names match a pattern, with size and modification time. A folder
/// below `dir` that cannot be listed is named in `problems`; the rest is read.
fn walk(
    dir: &Path,
    depth: usize,
    patterns: &[String],
    out: &mut Vec<(PathBuf, u64, SystemTime)>,
    problems: &mut Vec<PartProblem>,
) -> Result<(), CollectError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if depth == 0 => {
            return Err(CollectError::Transient(format!(
                "listing {}: {e}",
                dir.display()
            )))
        }
        Err(e) => {
            problems.push(PartProblem {
                part: dir.display().to_string(),
                error: CollectError::Transient(format!("listing {}: {e}", dir.display())),
            });
            return Ok(());
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            if depth < MAX_DEPTH {
                walk(&path, depth + 1, patterns, out, problems)?;
            }
            continue;
        }
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if meta.is_file() && patterns.iter().any(|p| glob_match(p, &name)) {
            out.push((
                path,
                meta.len(),
                meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            ));
        }
    }
    Ok(())
}

impl Collector for BillingCollector {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn collect(&self) -> CollectFuture<'_> {
        Box::pin(async move { self.run(SystemTime::now()).map(|r| r.observations) })
    }

    fn collect_report(&self) -> ReportFuture<'_> {
        Box::pin(async move { self.run(SystemTime::now()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        let c = BillingConfig::from_toml("dir = \"/x\"\n").unwrap();
        assert_eq!(c.patterns, ["*.csv", "*.csv.gz"]);
        assert_eq!(c.settle_secs, 120);
        let e = BillingConfig::from_toml("patterns = [\"*.csv\"]\n").unwrap_err();
        assert!(e.to_string().contains("set `dir`"), "{e}");
        let e = BillingConfig::from_toml("dir = \"/x\"\npatterns = []\n").unwrap_err();
        assert!(e.to_string().contains("patterns:"), "{e}");
        let e = BillingConfig::from_toml("dir = \"/x\"\nfolder = \"/y\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown field `folder`"), "{e}");
    }

    /// Every settled export is reported, each run (the server skips what it imported with the
    /// same size and time); files still being written wait; other files are left alone.
    #[test]
    fn a_run_reports_settled_exports_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("gpuledger-billing-{}", std::process::id()));
        let period = dir.join("BILLING_PERIOD=2026-11");
        std::fs::create_dir_all(&period).unwrap();
        std::fs::write(period.join("part-1.csv.gz"), b"x").unwrap();
        std::fs::write(dir.join("focus.csv"), b"y").unwrap();
        std::fs::write(period.join("manifest.json"), b"{}").unwrap();
        let entry = |settle: u64| {
            BillingCollector::from_toml(
                "c",
                &format!("dir = \"{}\"\nsettle_secs = {settle}\n", dir.display()),
            )
            .unwrap()
        };
        let paths = |r: CollectReport| -> Vec<String> {
            let mut p: Vec<String> = r
                .observations
                .iter()
                .map(|o| match o {
                    Observation::BillingExport { path, .. } => path.clone(),
                    _ => panic!("only exports"),
                })
                .collect();
            p.sort();
            p
        };
        let later = SystemTime::now() + Duration::from_secs(10);
        let c = entry(0);
        let first = paths(c.run(later).unwrap());
        assert_eq!(first.len(), 2, "{first:?}");
        assert!(first[0].ends_with("part-1.csv.gz") && first[1].ends_with("focus.csv"));
        assert_eq!(paths(c.run(later).unwrap()), first, "stateless: every run");
        assert!(
            entry(3600).run(later).unwrap().observations.is_empty(),
            "just written: not settled"
        );
        let gone = BillingCollector::from_toml("c", "dir = \"/nonexistent/exports\"\n").unwrap();
        assert!(gone
            .run(later)
            .unwrap_err()
            .to_string()
            .contains("not a folder"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn patterns_match_file_names() {
        assert!(glob_match("*.csv", "focus-2026-11.csv"));
        assert!(glob_match("*.csv.gz", "part-0001.csv.gz"));
        assert!(!glob_match("*.csv", "focus.csv.gz"));
        assert!(!glob_match("*.csv", "manifest.json"));
    }
}
