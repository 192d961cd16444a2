//! The `spreadsheet` collector: an inventory sheet (CSV or XLSX), read from a file or from an
//! HTTP(S) URL where the sheet is published as an export, on the collector's interval. Each
//! row with a GPU UUID becomes a GPU record; each row with a host and a GPU count becomes that
//! many GPUs of the host (placeholders until a UUID-aware source names them). A row that cannot
//! be used is named (row, column, value, reason) and left out; the other rows are kept.
//!
//! ```toml
//! [[collectors]]
//! type = "spreadsheet"
//! name = "lab-inventory"
//! path = "/srv/inventory/gpus.xlsx"   # or url = "https://…/export?format=csv"
//! sheet = "GPUs"                      # XLSX: the sheet to read (default: the first)
//! columns = { "Hostname" = "host", "Owner" = "team" }   # header → field; others by default names
//! authoritative = false
//! interval_secs = 3600
//! ```
//!
//! Read-only: it reads the file or URL and writes nothing anywhere.

pub mod parse;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

pub use parse::{
    read_inventory, read_table, Cell, Field, Inventory, Mapping, ReadOptions, RowProblem, SheetGpu,
    SheetHost, Table, MAX_BYTES,
};

use crate::{
    in_range, now_secs, CollectError, CollectFuture, CollectReport, Collector, PartProblem,
    ReportFuture,
};

/// The kind string: config `type`, module name, test module.
pub const KIND: &str = "spreadsheet";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    path: Option<PathBuf>,
    url: Option<String>,
    sheet: Option<String>,
    columns: Option<BTreeMap<String, String>>,
    authoritative: Option<bool>,
    delimiter: Option<String>,
    timeout_secs: Option<u64>,
}

/// Where the sheet is read from.
#[derive(Debug, Clone, PartialEq)]
pub enum Location {
    /// A file the server can read.
    Path(PathBuf),
    /// An HTTP(S) URL answering the sheet's bytes (a published CSV or XLSX export).
    Url(String),
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct SpreadsheetConfig {
    pub location: Location,
    /// XLSX: the sheet to read; the first when `None`.
    pub sheet: Option<String>,
    /// Which header is which field (the others by their default names).
    pub mapping: Mapping,
    /// Whether the sheet is the whole inventory of what it lists: a GPU that leaves it is gone.
    /// When false (the default) the sheet is one source among others.
    pub authoritative: bool,
    /// CSV: the field delimiter (default `,`).
    pub delimiter: u8,
    /// URL: how long one read may take.
    pub timeout_secs: u64,
}

impl SpreadsheetConfig {
    /// Read and check a `[[collectors]]` entry's TOML text.
    pub fn from_toml(text: &str) -> Result<SpreadsheetConfig, CollectError> {
        SpreadsheetConfig::from_settings(&crate::own_settings(text)?)
    }

    /// Read and check an entry's own settings (the entry without [`crate::COMMON_KEYS`]).
    pub fn from_settings(own: &toml_edit::Table) -> Result<SpreadsheetConfig, CollectError> {
        let raw: FileConfig = crate::read_settings(own)?;
        let location = match (raw.path, raw.url) {
            (Some(p), None) if !p.as_os_str().is_empty() => Location::Path(p),
            (None, Some(u)) => Location::Url(http_url(&u)?),
            (Some(_), Some(_)) => {
                return Err(CollectError::Config(
                    "give `path` or `url`, not both".into(),
                ))
            }
            _ => {
                return Err(CollectError::Config(
                    "set `path` to the sheet's file (CSV or XLSX) or `url` to where it is \
                     published as CSV or XLSX"
                        .into(),
                ))
            }
        };
        let mapping = Mapping::from_pairs(raw.columns.unwrap_or_default())
            .map_err(|e| CollectError::Config(format!("columns: {e}")))?;
        let delimiter = match raw.delimiter.as_deref() {
            None => b',',
            Some(d) => parse_delimiter(d).map_err(CollectError::Config)?,
        };
        if raw.sheet.as_deref().is_some_and(|s| s.trim().is_empty()) {
            return Err(CollectError::Config(
                "sheet: name the workbook's sheet, or leave it out for the first".into(),
            ));
        }
        Ok(SpreadsheetConfig {
            location,
            sheet: raw.sheet,
            mapping,
            authoritative: raw.authoritative.unwrap_or(false),
            delimiter,
            timeout_secs: in_range("timeout_secs", raw.timeout_secs, 30, 1, 600)?,
        })
    }

    /// A configuration for one file, as `gpuledger import inventory` reads it.
    pub fn for_file(path: PathBuf, mapping: Mapping, sheet: Option<String>) -> SpreadsheetConfig {
        SpreadsheetConfig {
            location: Location::Path(path),
            sheet,
            mapping,
            authoritative: false,
            delimiter: b',',
            timeout_secs: 30,
        }
    }

    /// The hosts this collector connects to, for the server's `collector_hosts` allow-list.
    pub fn hosts(&self) -> Result<Vec<String>, CollectError> {
        match &self.location {
            Location::Path(_) => Ok(Vec::new()),
            Location::Url(u) => reqwest::Url::parse(u)
                .ok()
                .and_then(|u| u.host_str().map(str::to_string))
                .map(|h| vec![h])
                .ok_or_else(|| CollectError::Config(format!("`{u}` names no host"))),
        }
    }

    /// The name the sheet's records carry as label `sheet`: the file's name, or the URL's
    /// last path segment (its host when the path has none).
    pub fn file_label(&self) -> String {
        match &self.location {
            Location::Path(p) => p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.display().to_string()),
            Location::Url(u) => reqwest::Url::parse(u)
                .ok()
                .and_then(|u| {
                    let last = u
                        .path_segments()
                        .and_then(|mut s| s.rfind(|x| !x.is_empty()).map(str::to_string));
                    last.or_else(|| u.host_str().map(str::to_string))
                })
                .unwrap_or_else(|| u.clone()),
        }
    }
}

/// A CSV delimiter setting: one ASCII character, or `tab`.
fn parse_delimiter(d: &str) -> Result<u8, String> {
    match d {
        "tab" | "\t" => Ok(b'\t'),
        d if d.len() == 1 && d.is_ascii() && d != "\"" && d != "\n" => Ok(d.as_bytes()[0]),
        d => Err(format!(
            "delimiter: `{d}` is not one character; use \",\", \";\", \"|\" or \"tab\""
        )),
    }
}

fn http_url(s: &str) -> Result<String, CollectError> {
    match reqwest::Url::parse(s.trim()) {
        Ok(u) if crate::http::is_link_local(&u) => Err(CollectError::Config(format!(
            "url: `{s}` is a link-local address, where clouds serve instance metadata and \
             credentials; a collector never reads it"
        ))),
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {
            Ok(s.trim().to_string())
        }
        Ok(_) => Err(CollectError::Config(format!(
            "url: `{s}` is not an http:// or https:// URL"
        ))),
        Err(e) => Err(CollectError::Config(format!(
            "url: `{s}` is not a URL ({e})"
        ))),
    }
}

/// The collector.
pub struct SpreadsheetCollector {
    name: String,
    config: SpreadsheetConfig,
    client: Option<reqwest::Client>,
}

impl SpreadsheetCollector {
    pub fn new(
        name: &str,
        config: SpreadsheetConfig,
    ) -> Result<SpreadsheetCollector, CollectError> {
        let client = match &config.location {
            Location::Path(_) => None,
            Location::Url(_) => Some(
                reqwest::Client::builder()
                    .timeout(Duration::from_secs(config.timeout_secs))
                    .connect_timeout(Duration::from_secs(config.timeout_secs.min(5)))
                    .user_agent(concat!("gpuledger-spreadsheet/", env!("CARGO_PKG_VERSION")))
                    .redirect(crate::http::same_origin_redirects())
                    .build()
                    .map_err(|e| {
                        CollectError::Config(format!("cannot set up the HTTP client: {e}"))
                    })?,
            ),
        };
        Ok(SpreadsheetCollector {
            name: name.to_string(),
            config,
            client,
        })
    }

    pub fn config(&self) -> &SpreadsheetConfig {
        &self.config
    }

    /// The sheet's bytes, from its file or URL.
    async fn bytes(&self) -> Result<Vec<u8>, CollectError> {
        match (&self.config.location, &self.client) {
            (Location::Url(u), Some(client)) => {
                crate::http::get_bytes(client.get(u), u, MAX_BYTES).await
            }
            (Location::Url(u), None) => Err(CollectError::Config(format!(
                "{u}: no HTTP client was set up"
            ))),
            (Location::Path(p), _) => {
                let meta = std::fs::metadata(p).map_err(|e| {
                    CollectError::Config(format!(
                        "path {}: not a file this server can read: {e}",
                        p.display()
                    ))
                })?;
                if !meta.is_file() {
                    return Err(CollectError::Config(format!(
                        "path {}: not a file",
                        p.display()
                    )));
                }
                if meta.len() > MAX_BYTES as u64 {
                    return Err(CollectError::Data(format!(
                        "{}: {} bytes, over the {MAX_BYTES} read",
                        p.display(),
                        meta.len()
                    )));
                }
                std::fs::read(p)
                    .map_err(|e| CollectError::Transient(format!("reading {}: {e}", p.display())))
            }
        }
    }

    /// Read the sheet once: its records and the rows it could not use. The error is for a
    /// sheet that cannot be read at all.
    pub async fn read(&self) -> Result<Inventory, CollectError> {
        let bytes = self.bytes().await?;
        let file = self.config.file_label();
        let table = read_table(&bytes, self.config.sheet.as_deref(), self.config.delimiter)
            .map_err(|e| in_file(&file, e))?;
        read_inventory(
            &table,
            &ReadOptions {
                file: &file,
                mapping: &self.config.mapping,
                observed_at: now_secs(),
            },
        )
        .map_err(|e| in_file(&file, e))
    }

    /// One run: the observations of every usable row, and a problem per row left out. A sheet
    /// with no usable row is an error, so the source shows it.
    pub async fn run(&self) -> Result<CollectReport, CollectError> {
        let inv = self.read().await?;
        if inv.gpus.is_empty() && inv.hosts.is_empty() {
            return Err(CollectError::Data(match inv.problems.first() {
                Some(first) => format!(
                    "{}: no usable row; {} problem(s), first: {first}",
                    inv.file,
                    inv.problems.len()
                ),
                None => format!(
                    "{}: no rows under the header (row {})",
                    inv.file, inv.header_row
                ),
            }));
        }
        let mut observations = inv.observations(&self.name);
        if self.config.authoritative {
            observations.extend(inv.listing(&self.name));
        }
        Ok(CollectReport {
            observations,
            problems: inv
                .problems
                .iter()
                .map(|p| PartProblem {
                    part: inv.file.clone(),
                    error: CollectError::Data(p.to_string()),
                })
                .collect(),
        })
    }
}

/// `e` with the file named first.
fn in_file(file: &str, e: CollectError) -> CollectError {
    let named = |m: String| {
        if m.contains(file) {
            m
        } else {
            format!("{file}: {m}")
        }
    };
    match e {
        CollectError::Transient(m) => CollectError::Transient(named(m)),
        CollectError::Config(m) => CollectError::Config(named(m)),
        CollectError::Data(m) => CollectError::Data(named(m)),
    }
}

impl Collector for SpreadsheetCollector {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        let c = SpreadsheetConfig::from_toml("path = \"/srv/gpus.csv\"\n").unwrap();
        assert_eq!(c.location, Location::Path("/srv/gpus.csv".into()));
        assert!(!c.authoritative);
        assert_eq!((c.delimiter, c.timeout_secs), (b',', 30));
        assert_eq!(c.hosts().unwrap(), Vec::<String>::new());
        assert_eq!(c.file_label(), "gpus.csv");
        let c = SpreadsheetConfig::from_toml(
            "url = \"https://sheets.example.com/d/x/export?format=csv\"\nauthoritative = true\n\
             delimiter = \";\"\ncolumns = { \"Box\" = \"host\" }\n",
        )
        .unwrap();
        assert_eq!(c.hosts().unwrap(), ["sheets.example.com"]);
        assert_eq!(c.file_label(), "export");
        assert!(c.authoritative);
        assert_eq!(c.delimiter, b';');
        assert_eq!(c.mapping.columns.get("Box"), Some(&Field::Host));
        for (text, want) in [
            ("", "set `path`"),
            ("path = \"/a\"\nurl = \"http://x/\"\n", "not both"),
            ("url = \"ftp://x/a.csv\"\n", "not an http"),
            ("url = \"http://169.254.169.254/latest\"\n", "link-local"),
            (
                "path = \"/a\"\ncolumns = { \"A\" = \"hots\" }\n",
                "`hots` is not a field",
            ),
            ("path = \"/a\"\ndelimiter = \";;\"\n", "not one character"),
            ("path = \"/a\"\nfile = \"/b\"\n", "unknown field `file`"),
            ("path = \"/a\"\ntimeout_secs = 0\n", "timeout_secs"),
        ] {
            let e = SpreadsheetConfig::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
