//! The `gcp` collector: the GPU virtual machines of Google Cloud projects, read with Compute
//! Engine's `instances.aggregatedList` (every zone of a project, page by page). GPUs come from
//! an instance's `guestAccelerators`, or from its machine type when the GPUs are built in
//! (A2, A3, A4, A4X, G2, G4; see [`parse::BUILT_IN_GPUS`]).
//!
//! Read-only: it asks for the `compute.readonly` scope and sends GET requests (and the POST
//! that exchanges a signed assertion for a token). Reading lives in [`parse`], tokens in
//! [`auth`].
//!
//! ```toml
//! [[collectors]]
//! type = "gcp"
//! name = "gcp-research"
//! projects = ["ml-research-1234", "ml-prod-5678"]
//! credentials_file = "/etc/gpuledger/gcp-reader.json"  # omit: the metadata server
//! interval_secs = 300
//! ```

pub mod auth;
pub mod parse;

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::collectors::cloud::CloudInstance;
use crate::http::get_bytes;
use crate::{
    in_range, CollectError, CollectFuture, CollectReport, Collector, PartProblem, ReportFuture,
};
pub use auth::GcpCredentials;

/// The kind string: config `type`, module name, test module.
pub const KIND: &str = "gcp";

/// Compute Engine API v1.
pub const DEFAULT_API_URL: &str = "https://compute.googleapis.com/compute/v1";
/// Google's OAuth 2.0 token endpoint (the `aud` of the assertion).
pub const DEFAULT_TOKEN_URL: &str = "https://oauth2.googleapis.com/token";
/// The metadata server, as VMs and GKE pods reach it.
pub const DEFAULT_METADATA_URL: &str = "http://metadata.google.internal/computeMetadata/v1";
/// The environment variable Google's tools read a key file's path from.
pub const CREDENTIALS_ENV: &str = "GOOGLE_APPLICATION_CREDENTIALS";

/// The largest page read (500 instances are about 2 MB).
const MAX_PAGE_BYTES: usize = 32 * 1024 * 1024;
/// Pages read per project per run, at most: 500 × 2,000 instances.
const MAX_PAGES: usize = 2000;

/// The entry's own settings as written (the fields every entry shares are read by
/// [`crate::Entry`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    projects: Option<Vec<String>>,
    credentials_file: Option<PathBuf>,
    api_url: Option<String>,
    token_url: Option<String>,
    metadata_url: Option<String>,
    page_size: Option<u64>,
    timeout_secs: Option<u64>,
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct GcpConfig {
    /// Project IDs, each read on its own.
    pub projects: Vec<String>,
    pub credentials: GcpCredentials,
    /// The Compute Engine API, up to `/compute/v1`.
    pub api_url: String,
    pub token_url: String,
    pub metadata_url: String,
    /// `maxResults` of each page, 1..=500.
    pub page_size: u64,
    pub timeout_secs: u64,
}

impl GcpConfig {
    /// Read and check a `[[collectors]]` entry's TOML text.
    pub fn from_toml(text: &str) -> Result<GcpConfig, CollectError> {
        GcpConfig::from_settings(&crate::own_settings(text)?)
    }

    /// Read and check an entry's own settings (the entry without [`crate::COMMON_KEYS`]).
    /// Without `credentials_file`, a key file named by `GOOGLE_APPLICATION_CREDENTIALS` is
    /// used, else the metadata server.
    pub fn from_settings(own: &toml_edit::Table) -> Result<GcpConfig, CollectError> {
        let raw: FileConfig = crate::read_settings(own)?;
        let projects = raw.projects.unwrap_or_default();
        if projects.is_empty() {
            return Err(CollectError::Config(
                "set `projects = [\"my-project-id\"]`: the project IDs whose instances to read"
                    .into(),
            ));
        }
        for (i, p) in projects.iter().enumerate() {
            let ok = !p.is_empty()
                && p.len() <= 100
                && p.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b':')
                });
            if !ok {
                return Err(CollectError::Config(format!(
                    "projects[{i}]: `{p}` is not a project ID (lowercase letters, digits and \
                     hyphens, like `ml-research-1234`)"
                )));
            }
        }
        let credentials = match raw.credentials_file {
            Some(path) => GcpCredentials::KeyFile(path),
            None => match std::env::var_os(CREDENTIALS_ENV).filter(|v| !v.is_empty()) {
                Some(path) => GcpCredentials::KeyFile(PathBuf::from(path)),
                None => GcpCredentials::MetadataServer,
            },
        };
        Ok(GcpConfig {
            projects,
            credentials,
            api_url: api_url(raw.api_url)?,
            token_url: url_setting("token_url", raw.token_url, DEFAULT_TOKEN_URL)?,
            metadata_url: url_setting("metadata_url", raw.metadata_url, DEFAULT_METADATA_URL)?,
            page_size: in_range("page_size", raw.page_size, 500, 1, 500)?,
            timeout_secs: in_range("timeout_secs", raw.timeout_secs, 30, 1, 300)?,
        })
    }

    /// The hosts this collector connects to, for the server's `collector_hosts` allow-list:
    /// the API and the token endpoint, or the metadata server.
    pub fn hosts(&self) -> Result<Vec<String>, CollectError> {
        let token = match self.credentials {
            GcpCredentials::KeyFile(_) => &self.token_url,
            GcpCredentials::MetadataServer => &self.metadata_url,
        };
        let mut out = Vec::new();
        for url in [&self.api_url, token] {
            let host = host_of(url)?;
            if !out.contains(&host) {
                out.push(host);
            }
        }
        Ok(out)
    }
}

fn host_of(url: &str) -> Result<String, CollectError> {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .ok_or_else(|| CollectError::Config(format!("`{url}` names no host")))
}

/// The API's URL: what it answers is reported, so it is never a link-local address (where
/// clouds serve instance metadata); only tokens are asked of the metadata address.
fn api_url(v: Option<String>) -> Result<String, CollectError> {
    let url = url_setting("api_url", v, DEFAULT_API_URL)?;
    match reqwest::Url::parse(&url) {
        Ok(u) if crate::http::is_link_local(&u) => Err(CollectError::Config(format!(
            "api_url: `{url}` is a link-local address, where clouds serve instance metadata; \
             the API is read from its own host"
        ))),
        _ => Ok(url),
    }
}

fn url_setting(key: &str, v: Option<String>, default: &str) -> Result<String, CollectError> {
    let Some(v) = v else {
        return Ok(default.to_string());
    };
    let s = v.trim().trim_end_matches('/');
    match reqwest::Url::parse(s) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {
            Ok(s.to_string())
        }
        _ => Err(CollectError::Config(format!(
            "{key}: `{v}` is not an http:// or https:// URL (the default is {default})"
        ))),
    }
}

/// A configured `gcp` source.
pub struct GcpCollector {
    name: String,
    config: GcpConfig,
    client: reqwest::Client,
    token: tokio::sync::Mutex<Option<auth::Token>>,
}

impl GcpCollector {
    /// Build from a `[[collectors]]` entry's TOML text.
    pub fn from_toml(name: &str, text: &str) -> Result<GcpCollector, CollectError> {
        GcpCollector::new(name, GcpConfig::from_toml(text)?)
    }

    pub fn new(name: &str, config: GcpConfig) -> Result<GcpCollector, CollectError> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(config.timeout_secs))
            .connect_timeout(Duration::from_secs(config.timeout_secs.min(5)))
            .user_agent(concat!("gpuledger-gcp/", env!("CARGO_PKG_VERSION")))
            .redirect(crate::http::same_origin_redirects())
            .build()
            .map_err(|e| CollectError::Config(format!("cannot set up the HTTP client: {e}")))?;
        Ok(GcpCollector {
            name: name.to_string(),
            config,
            client,
            token: tokio::sync::Mutex::new(None),
        })
    }

    pub fn config(&self) -> &GcpConfig {
        &self.config
    }

    /// A token, from the cache while it is fresh.
    async fn token(&self) -> Result<String, CollectError> {
        let mut cached = self.token.lock().await;
        if let Some(t) = cached.as_ref().filter(|t| t.fresh()) {
            return Ok(t.value.clone());
        }
        let t = auth::fetch(
            &self.client,
            &self.config.credentials,
            &self.config.token_url,
            &self.config.metadata_url,
        )
        .await?;
        let value = t.value.clone();
        *cached = Some(t);
        Ok(value)
    }

    /// Every instance of every project, and a problem for each project, zone or instance that
    /// could not be read. An error when no project could be read.
    pub async fn instances(&self) -> Result<(Vec<CloudInstance>, Vec<PartProblem>), CollectError> {
        let token = self.token().await?;
        let results = futures_util::future::join_all(
            self.config
                .projects
                .iter()
                .map(|p| self.read_project(p, &token)),
        )
        .await;
        let mut instances = Vec::new();
        let mut problems = Vec::new();
        let mut failed = Vec::new();
        for (project, result) in self.config.projects.iter().zip(results) {
            match result {
                Ok((mut found, mut part_problems)) => {
                    instances.append(&mut found);
                    problems.append(&mut part_problems);
                }
                Err(error) => failed.push(PartProblem {
                    part: format!("project `{project}`"),
                    error,
                }),
            }
        }
        if failed
            .iter()
            .any(|p| matches!(p.error, CollectError::Config(_)))
        {
            // A refused token (revoked, or its permissions changed) is asked for anew next run.
            *self.token.lock().await = None;
        }
        if failed.len() == self.config.projects.len() {
            return Err(crate::all_failed(&failed, "projects", ToString::to_string));
        }
        problems.extend(failed);
        Ok((instances, problems))
    }

    /// One project, every page.
    async fn read_project(
        &self,
        project: &str,
        token: &str,
    ) -> Result<(Vec<CloudInstance>, Vec<PartProblem>), CollectError> {
        let part = format!("project `{project}`");
        let url = format!(
            "{}/projects/{project}/aggregated/instances",
            self.config.api_url
        );
        let mut instances = Vec::new();
        let mut problems = Vec::new();
        let mut page_token: Option<String> = None;
        for page in 0.. {
            if page == MAX_PAGES {
                return Err(CollectError::Data(format!(
                    "{part}: more than {MAX_PAGES} pages of instances; stopped reading"
                )));
            }
            let mut query = vec![
                ("maxResults", self.config.page_size.to_string()),
                ("returnPartialSuccess", "true".to_string()),
            ];
            if let Some(t) = &page_token {
                query.push(("pageToken", t.clone()));
            }
            let what = format!("{part}: GET {url} (page {})", page + 1);
            let req = self.client.get(&url).query(&query).bearer_auth(token);
            let body = get_bytes(req, &what, MAX_PAGE_BYTES)
                .await
                .map_err(|e| match e {
                    CollectError::Config(m) => CollectError::Config(format!(
                        "{m}; check the project ID, and that the credentials hold \
                         compute.instances.list in project `{project}` (the role in \
                         deploy/gcp/gpuledger-reader-role.yaml)"
                    )),
                    other => other,
                })?;
            let read = parse::aggregated(&body, "instances")
                .map_err(|m| CollectError::Data(format!("{what}: {m}")))?;
            for zone in &read.unreachable {
                problems.push(PartProblem {
                    part: part.clone(),
                    error: CollectError::Transient(format!(
                        "{part}: {zone} was unreachable; its instances are missing from this run"
                    )),
                });
            }
            for m in &read.problems {
                problems.push(PartProblem {
                    part: part.clone(),
                    error: CollectError::Data(format!("{part}: {m}")),
                });
            }
            for (path, item) in &read.items {
                match parse::instance(project, path, item) {
                    Ok(i) => instances.push(i),
                    Err(m) => problems.push(PartProblem {
                        part: part.clone(),
                        error: CollectError::Data(format!("{part}: {m}; instance left out")),
                    }),
                }
            }
            match read.next_page_token {
                Some(t) if page_token.as_deref() == Some(t.as_str()) => {
                    return Err(CollectError::Data(format!(
                        "{what}: nextPageToken repeats the page just read; stopped reading"
                    )))
                }
                Some(t) => page_token = Some(t),
                None => break,
            }
        }
        Ok((instances, problems))
    }

    /// Read every project once into observations.
    pub async fn run(&self) -> Result<CollectReport, CollectError> {
        Ok(crate::collectors::cloud::report(
            &self.name,
            self.instances().await?,
        ))
    }
}

impl Collector for GcpCollector {
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
        let c = GcpConfig::from_toml(
            "projects = [\"ml-1\"]\ncredentials_file = \"/k.json\"\napi_url = \"http://127.0.0.1:9/compute/v1/\"\n",
        )
        .unwrap();
        assert_eq!(c.api_url, "http://127.0.0.1:9/compute/v1");
        assert_eq!(c.credentials, GcpCredentials::KeyFile("/k.json".into()));
        assert_eq!(
            c.hosts().unwrap(),
            ["127.0.0.1".to_string(), "oauth2.googleapis.com".to_string()]
        );
        for (text, want) in [
            ("", "set `projects"),
            ("projects = []", "set `projects"),
            (
                "projects = [\"a/b\"]",
                "projects[0]: `a/b` is not a project ID",
            ),
            (
                "projects = [\"a\"]\nproject = \"b\"",
                "unknown field `project`",
            ),
            (
                "projects = [\"a\"]\npage_size = 501",
                "page_size: must be within 1..=500",
            ),
            (
                "projects = [\"a\"]\napi_url = \"http://169.254.169.254/computeMetadata/v1\"",
                "api_url: `http://169.254.169.254/computeMetadata/v1` is a link-local address",
            ),
            (
                "projects = [\"a\"]\ntoken_url = \"file:///x\"",
                "token_url: `file:///x` is not",
            ),
        ] {
            let e = GcpConfig::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
