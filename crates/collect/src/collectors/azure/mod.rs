//! The `azure` collector: the GPU virtual machines of Azure subscriptions, read from Resource
//! Manager's virtual machine list with each VM's power state (`statusOnly=true`). GPUs come from
//! the VM size: the N series table in [`sizes`], else the size's `GPUs` capability from
//! `resourceSkus` (asked once a day per subscription and region, only for N-series sizes the
//! table lacks).
//!
//! Read-only: GET requests, and the POST that asks Microsoft Entra ID for a token. Reading
//! lives in [`parse`], tokens in [`auth`].
//!
//! ```toml
//! [[collectors]]
//! type = "azure"
//! name = "azure-research"
//! subscriptions = ["00000000-0000-0000-0000-000000000000"]
//! credential = "client_secret"        # or "workload_identity", "managed_identity"
//! tenant_id = "11111111-1111-1111-1111-111111111111"
//! client_id = "22222222-2222-2222-2222-222222222222"
//! client_secret_file = "/etc/gpuledger/azure-secret"   # or client_secret_env = "NAME"
//! interval_secs = 300
//! ```

pub mod auth;
pub mod parse;
pub mod sizes;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpuledger_model::Cloud;
use serde::Deserialize;

use crate::collectors::cloud::{CloudInstance, GpuSpec};
use crate::collectors::gcp::auth::Token;
use crate::http::get_bytes;
use crate::{
    in_range, CollectError, CollectFuture, CollectReport, Collector, PartProblem, ReportFuture,
};
pub use auth::{AzureCredentials, SecretSource};

/// The kind string: config `type`, module name, test module.
pub const KIND: &str = "azure";

pub const DEFAULT_API_URL: &str = "https://management.azure.com";
pub const DEFAULT_LOGIN_URL: &str = "https://login.microsoftonline.com";
pub const DEFAULT_IMDS_URL: &str = "http://169.254.169.254";
pub const DEFAULT_RESOURCE: &str = "https://management.azure.com/";
/// The `api-version` of the virtual machine list.
pub const VM_API_VERSION: &str = "2024-07-01";
/// The `api-version` of `resourceSkus`.
pub const SKUS_API_VERSION: &str = "2021-07-01";

const MAX_PAGE_BYTES: usize = 32 * 1024 * 1024;
const MAX_PAGES: usize = 2000;
/// How long a region's `resourceSkus` answer is kept.
const SKUS_TTL: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    subscriptions: Option<Vec<String>>,
    credential: Option<String>,
    tenant_id: Option<String>,
    client_id: Option<String>,
    client_secret_file: Option<PathBuf>,
    client_secret_env: Option<String>,
    federated_token_file: Option<PathBuf>,
    api_url: Option<String>,
    login_url: Option<String>,
    imds_url: Option<String>,
    resource: Option<String>,
    timeout_secs: Option<u64>,
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct AzureConfig {
    /// Subscription IDs, each read on its own.
    pub subscriptions: Vec<String>,
    pub credentials: AzureCredentials,
    pub api_url: String,
    pub login_url: String,
    pub imds_url: String,
    /// The token audience for Resource Manager.
    pub resource: String,
    pub timeout_secs: u64,
}

fn is_guid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl AzureConfig {
    /// Read and check a `[[collectors]]` entry's TOML text.
    pub fn from_toml(text: &str) -> Result<AzureConfig, CollectError> {
        AzureConfig::from_settings(&crate::own_settings(text)?)
    }

    /// Read and check an entry's own settings (the entry without [`crate::COMMON_KEYS`]).
    /// Without `credential`: a client secret when one is configured, else a workload identity
    /// when `federated_token_file` or `AZURE_FEDERATED_TOKEN_FILE` is set, else the managed
    /// identity. `tenant_id` and `client_id` default to `AZURE_TENANT_ID` and `AZURE_CLIENT_ID`.
    pub fn from_settings(own: &toml_edit::Table) -> Result<AzureConfig, CollectError> {
        let raw: FileConfig = crate::read_settings(own)?;
        let subscriptions = raw.subscriptions.unwrap_or_default();
        if subscriptions.is_empty() {
            return Err(CollectError::Config(
                "set `subscriptions = [\"00000000-0000-0000-0000-000000000000\"]`: the \
                 subscription IDs whose virtual machines to read"
                    .into(),
            ));
        }
        for (i, s) in subscriptions.iter().enumerate() {
            if !is_guid(s) {
                return Err(CollectError::Config(format!(
                    "subscriptions[{i}]: `{s}` is not a subscription ID (a GUID like \
                     00000000-0000-0000-0000-000000000000)"
                )));
            }
        }
        let secret = match (raw.client_secret_file, raw.client_secret_env) {
            (Some(_), Some(_)) => {
                return Err(CollectError::Config(
                    "set either `client_secret_file` or `client_secret_env`, not both".into(),
                ))
            }
            (Some(f), None) => Some(SecretSource::File(f)),
            (None, Some(e)) if e.trim().is_empty() => {
                return Err(CollectError::Config(
                    "client_secret_env: give the name of the environment variable holding \
                     the secret"
                        .into(),
                ))
            }
            (None, Some(e)) => Some(SecretSource::Env(e.trim().to_string())),
            (None, None) => None,
        };
        let federated = raw
            .federated_token_file
            .or_else(|| env_nonempty("AZURE_FEDERATED_TOKEN_FILE").map(PathBuf::from));
        let word = match raw.credential.as_deref() {
            Some(w) => w.to_string(),
            None if secret.is_some() => "client_secret".into(),
            None if federated.is_some() => "workload_identity".into(),
            None => "managed_identity".into(),
        };
        let tenant = || {
            raw.tenant_id
                .clone()
                .or_else(|| env_nonempty("AZURE_TENANT_ID"))
                .ok_or_else(|| {
                    CollectError::Config(format!(
                        "credential `{word}` needs `tenant_id` (or AZURE_TENANT_ID)"
                    ))
                })
        };
        let client = || {
            raw.client_id
                .clone()
                .or_else(|| env_nonempty("AZURE_CLIENT_ID"))
                .ok_or_else(|| {
                    CollectError::Config(format!(
                        "credential `{word}` needs `client_id` (or AZURE_CLIENT_ID)"
                    ))
                })
        };
        let credentials = match word.as_str() {
            "client_secret" => AzureCredentials::ClientSecret {
                tenant_id: tenant()?,
                client_id: client()?,
                secret: secret.ok_or_else(|| {
                    CollectError::Config(
                        "credential `client_secret` needs `client_secret_file` (a file holding \
                         the secret) or `client_secret_env` (the name of an environment \
                         variable holding it); the secret is never written in the config"
                            .into(),
                    )
                })?,
            },
            "workload_identity" => AzureCredentials::WorkloadIdentity {
                tenant_id: tenant()?,
                client_id: client()?,
                token_file: federated.ok_or_else(|| {
                    CollectError::Config(
                        "credential `workload_identity` needs `federated_token_file` (or \
                         AZURE_FEDERATED_TOKEN_FILE, which AKS sets)"
                            .into(),
                    )
                })?,
            },
            "managed_identity" => AzureCredentials::ManagedIdentity {
                client_id: raw.client_id.clone(),
            },
            other => {
                return Err(CollectError::Config(format!(
                    "credential: `{other}` is not one of client_secret, workload_identity, \
                     managed_identity"
                )))
            }
        };
        let login_default =
            env_nonempty("AZURE_AUTHORITY_HOST").unwrap_or_else(|| DEFAULT_LOGIN_URL.to_string());
        Ok(AzureConfig {
            subscriptions,
            credentials,
            api_url: api_url(raw.api_url)?,
            login_url: url_setting("login_url", raw.login_url, &login_default)?,
            imds_url: url_setting("imds_url", raw.imds_url, DEFAULT_IMDS_URL)?,
            resource: raw
                .resource
                .filter(|r| !r.trim().is_empty())
                .unwrap_or_else(|| DEFAULT_RESOURCE.to_string()),
            timeout_secs: in_range("timeout_secs", raw.timeout_secs, 30, 1, 300)?,
        })
    }

    /// The hosts this collector connects to, for the server's `collector_hosts` allow-list:
    /// Resource Manager, and the sign-in endpoint or the instance metadata service.
    pub fn hosts(&self) -> Result<Vec<String>, CollectError> {
        let token = match self.credentials {
            AzureCredentials::ManagedIdentity { .. } => &self.imds_url,
            _ => &self.login_url,
        };
        let mut out = Vec::new();
        for url in [&self.api_url, token] {
            let host = reqwest::Url::parse(url)
                .ok()
                .and_then(|u| u.host_str().map(str::to_string))
                .ok_or_else(|| CollectError::Config(format!("`{url}` names no host")))?;
            if !out.contains(&host) {
                out.push(host);
            }
        }
        Ok(out)
    }
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
    let given = v.is_some();
    let v = v.unwrap_or_else(|| default.to_string());
    let s = v.trim().trim_end_matches('/');
    match reqwest::Url::parse(s) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {
            Ok(s.to_string())
        }
        _ if given => Err(CollectError::Config(format!(
            "{key}: `{v}` is not an http:// or https:// URL (the default is {default})"
        ))),
        _ => Err(CollectError::Config(format!(
            "{key}: the default `{v}` (from AZURE_AUTHORITY_HOST) is not an http:// or https:// \
             URL"
        ))),
    }
}

/// One region's sizes from `resourceSkus`: size (lowercase) → its GPUs capability.
struct SkuTable {
    read_at: Instant,
    gpus: HashMap<String, Option<String>>,
}

/// A configured `azure` source.
pub struct AzureCollector {
    name: String,
    config: AzureConfig,
    client: reqwest::Client,
    token: tokio::sync::Mutex<Option<Token>>,
    /// `resourceSkus` answers by (subscription, region).
    skus: Mutex<HashMap<(String, String), SkuTable>>,
}

/// What a subscription's run found.
type Found = (Vec<CloudInstance>, Vec<PartProblem>);

impl AzureCollector {
    /// Build from a `[[collectors]]` entry's TOML text.
    pub fn from_toml(name: &str, text: &str) -> Result<AzureCollector, CollectError> {
        AzureCollector::new(name, AzureConfig::from_toml(text)?)
    }

    pub fn new(name: &str, config: AzureConfig) -> Result<AzureCollector, CollectError> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(config.timeout_secs))
            .connect_timeout(Duration::from_secs(config.timeout_secs.min(5)))
            .user_agent(concat!("gpuledger-azure/", env!("CARGO_PKG_VERSION")))
            .redirect(crate::http::same_origin_redirects())
            .build()
            .map_err(|e| CollectError::Config(format!("cannot set up the HTTP client: {e}")))?;
        Ok(AzureCollector {
            name: name.to_string(),
            config,
            client,
            token: tokio::sync::Mutex::new(None),
            skus: Mutex::new(HashMap::new()),
        })
    }

    pub fn config(&self) -> &AzureConfig {
        &self.config
    }

    async fn token(&self) -> Result<String, CollectError> {
        let mut cached = self.token.lock().await;
        if let Some(t) = cached.as_ref().filter(|t| t.fresh()) {
            return Ok(t.value.clone());
        }
        let t = auth::fetch(
            &self.client,
            &self.config.credentials,
            &auth::Endpoints {
                login_url: &self.config.login_url,
                imds_url: &self.config.imds_url,
                resource: &self.config.resource,
            },
        )
        .await?;
        let value = t.value.clone();
        *cached = Some(t);
        Ok(value)
    }

    /// Every VM of every subscription, and a problem for each subscription, page or VM that
    /// could not be read. An error when no subscription could be read.
    pub async fn instances(&self) -> Result<Found, CollectError> {
        let token = self.token().await?;
        let results = futures_util::future::join_all(
            self.config
                .subscriptions
                .iter()
                .map(|s| self.read_subscription(s, &token)),
        )
        .await;
        let mut instances = Vec::new();
        let mut problems = Vec::new();
        let mut failed = Vec::new();
        for (sub, result) in self.config.subscriptions.iter().zip(results) {
            match result {
                Ok((mut found, mut part)) => {
                    instances.append(&mut found);
                    problems.append(&mut part);
                }
                Err(error) => failed.push(PartProblem {
                    part: format!("subscription `{sub}`"),
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
        if failed.len() == self.config.subscriptions.len() {
            return Err(crate::all_failed(
                &failed,
                "subscriptions",
                ToString::to_string,
            ));
        }
        problems.extend(failed);
        Ok((instances, problems))
    }

    /// Every page of a Resource Manager list starting at `url` with `query`: the items, each
    /// with its page and path. `nextLink` is followed only on the API's own host.
    async fn list(
        &self,
        part: &str,
        url: &str,
        query: &[(&str, &str)],
        token: &str,
        hint: &str,
    ) -> Result<Vec<(String, serde_json::Value)>, CollectError> {
        let api = reqwest::Url::parse(&self.config.api_url)
            .map_err(|e| CollectError::Config(format!("api_url: {e}")))?;
        let mut items = Vec::new();
        let mut next: Option<String> = None;
        for page in 0.. {
            if page == MAX_PAGES {
                return Err(CollectError::Data(format!(
                    "{part}: more than {MAX_PAGES} pages from {url}; stopped reading"
                )));
            }
            let (what, req) = match &next {
                None => (
                    format!("{part}: GET {url}"),
                    self.client.get(url).query(query),
                ),
                Some(link) => (
                    format!("{part}: GET {url} (page {})", page + 1),
                    self.client.get(link),
                ),
            };
            let body = get_bytes(req.bearer_auth(token), &what, MAX_PAGE_BYTES)
                .await
                .map_err(|e| match e {
                    CollectError::Config(m) => CollectError::Config(format!("{m}; {hint}")),
                    other => other,
                })?;
            let read =
                parse::page(&body).map_err(|m| CollectError::Data(format!("{what}: {m}")))?;
            items.extend(
                read.items
                    .into_iter()
                    .map(|(path, v)| (format!("page {} {path}", page + 1), v)),
            );
            match read.next_link {
                None => break,
                Some(link) => {
                    let same = reqwest::Url::parse(&link).is_ok_and(|l| {
                        l.scheme() == api.scheme()
                            && l.host_str() == api.host_str()
                            && l.port_or_known_default() == api.port_or_known_default()
                    });
                    if !same {
                        return Err(CollectError::Data(format!(
                            "{what}: nextLink `{link}` is not on {}; stopped reading",
                            self.config.api_url
                        )));
                    }
                    if next.as_deref() == Some(link.as_str()) {
                        return Err(CollectError::Data(format!(
                            "{what}: nextLink repeats the page just read; stopped reading"
                        )));
                    }
                    next = Some(link);
                }
            }
        }
        Ok(items)
    }

    async fn read_subscription(&self, sub: &str, token: &str) -> Result<Found, CollectError> {
        let part = format!("subscription `{sub}`");
        let url = format!(
            "{}/subscriptions/{sub}/providers/Microsoft.Compute/virtualMachines",
            self.config.api_url
        );
        let hint = format!(
            "check the subscription ID, and that the credentials hold \
             Microsoft.Compute/virtualMachines/read on subscription `{sub}` (the role in \
             deploy/azure/gpuledger-reader-role.json)"
        );
        let items = self
            .list(
                &part,
                &url,
                &[("api-version", VM_API_VERSION), ("statusOnly", "true")],
                token,
                &hint,
            )
            .await?;
        let mut problems = Vec::new();
        let mut vms = Vec::new();
        for (path, v) in &items {
            match parse::vm(path, v) {
                Ok(vm) => vms.push(vm),
                Err(m) => problems.push(PartProblem {
                    part: part.clone(),
                    error: CollectError::Data(format!("{part}: {m}; VM left out")),
                }),
            }
        }
        // N-series sizes the table lacks, by region: asked of resourceSkus.
        let mut unknown: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for vm in &vms {
            if sizes::is_gpu_series(&vm.size) && sizes::gpus_of_size(&vm.size).is_none() {
                unknown
                    .entry(vm.location.to_ascii_lowercase())
                    .or_default()
                    .insert(vm.size.to_ascii_lowercase());
            }
        }
        for region in unknown.keys() {
            if let Err(e) = self.load_skus(sub, region, token).await {
                problems.push(PartProblem {
                    part: part.clone(),
                    error: e,
                });
            }
        }
        let mut instances = Vec::with_capacity(vms.len());
        for vm in vms {
            let gpus = match self.gpus(sub, &vm) {
                Ok(g) => g,
                Err(m) => {
                    problems.push(PartProblem {
                        part: part.clone(),
                        error: CollectError::Data(format!("{part}: VM `{}`: {m}", vm.name)),
                    });
                    continue;
                }
            };
            instances.push(CloudInstance {
                cloud: Cloud::Azure,
                account: sub.to_string(),
                region: Some(vm.location),
                zone: vm.zone,
                instance_id: vm.name,
                host_name: vm.computer_name,
                instance_type: vm.size,
                state: vm.state,
                lifecycle: vm.lifecycle,
                launch_time: vm.created,
                tags: vm.tags,
                gpus,
            });
        }
        Ok((instances, problems))
    }

    /// The GPUs of a VM from its size: the table, else the region's `resourceSkus`.
    fn gpus(&self, sub: &str, vm: &parse::Vm) -> Result<Option<GpuSpec>, String> {
        if let Some(g) = sizes::gpus_of_size(&vm.size) {
            return Ok(Some(g));
        }
        if !sizes::is_gpu_series(&vm.size) {
            return Ok(None);
        }
        let skus = self.skus.lock().unwrap_or_else(|p| p.into_inner());
        let key = (sub.to_string(), vm.location.to_ascii_lowercase());
        let Some(table) = skus.get(&key) else {
            return Err(format!(
                "size `{}` is not in this build's table and resourceSkus for {} could not be \
                 read, so its GPUs are not known",
                vm.size, vm.location
            ));
        };
        match table.gpus.get(&vm.size.to_ascii_lowercase()) {
            Some(Some(value)) => sizes::gpus_of_capability(&vm.size, value)
                .map_err(|m| format!("resourceSkus `{}` GPUs capability: {m}", vm.size)),
            Some(None) => Ok(None),
            None => Err(format!(
                "size `{}` is neither in this build's table nor in resourceSkus for {}, so its \
                 GPUs are not known",
                vm.size, vm.location
            )),
        }
    }

    /// Read `resourceSkus` for a region unless a fresh answer is kept.
    async fn load_skus(&self, sub: &str, region: &str, token: &str) -> Result<(), CollectError> {
        let key = (sub.to_string(), region.to_string());
        {
            let skus = self.skus.lock().unwrap_or_else(|p| p.into_inner());
            if skus
                .get(&key)
                .is_some_and(|t| t.read_at.elapsed() < SKUS_TTL)
            {
                return Ok(());
            }
        }
        let part = format!("subscription `{sub}`");
        let url = format!(
            "{}/subscriptions/{sub}/providers/Microsoft.Compute/skus",
            self.config.api_url
        );
        let filter = format!("location eq '{region}'");
        let hint = format!(
            "check that the credentials hold Microsoft.Compute/skus/read on subscription \
             `{sub}`"
        );
        let items = self
            .list(
                &part,
                &url,
                &[
                    ("api-version", SKUS_API_VERSION),
                    ("$filter", filter.as_str()),
                ],
                token,
                &hint,
            )
            .await?;
        let (entries, bad) = parse::sku_gpus(&items);
        for m in bad {
            tracing::warn!(source = %self.name, problem = %m, "resourceSkus entry not read");
        }
        let table = SkuTable {
            read_at: Instant::now(),
            gpus: entries
                .into_iter()
                .map(|(size, gpus)| (size.to_ascii_lowercase(), gpus))
                .collect(),
        };
        self.skus
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, table);
        Ok(())
    }

    /// Read every subscription once into observations.
    pub async fn run(&self) -> Result<CollectReport, CollectError> {
        Ok(crate::collectors::cloud::report(
            &self.name,
            self.instances().await?,
        ))
    }
}

impl Collector for AzureCollector {
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

    const SUB: &str = "0b1f6471-1bf0-4dda-aec3-cb9272f09590";

    #[test]
    fn settings_are_checked() {
        let c = AzureConfig::from_toml(&format!(
            "subscriptions = [\"{SUB}\"]\ncredential = \"client_secret\"\ntenant_id = \"t\"\n\
             client_id = \"c\"\nclient_secret_env = \"GPULEDGER_TEST_AZ_SECRET\"\n"
        ))
        .unwrap();
        assert_eq!(
            c.credentials,
            AzureCredentials::ClientSecret {
                tenant_id: "t".into(),
                client_id: "c".into(),
                secret: SecretSource::Env("GPULEDGER_TEST_AZ_SECRET".into())
            }
        );
        assert_eq!(c.hosts().unwrap()[0], "management.azure.com");
        let c = AzureConfig::from_toml(&format!(
            "subscriptions = [\"{SUB}\"]\ncredential = \"managed_identity\"\n"
        ))
        .unwrap();
        assert_eq!(
            c.hosts().unwrap(),
            [
                "management.azure.com".to_string(),
                "169.254.169.254".to_string()
            ]
        );
        for (text, want) in [
            (String::new(), "set `subscriptions"),
            (
                "subscriptions = [\"prod\"]".into(),
                "subscriptions[0]: `prod` is not",
            ),
            (
                format!("subscriptions = [\"{SUB}\"]\nclient_secret = \"s3cret\""),
                "unknown field `client_secret`",
            ),
            (
                format!(
                    "subscriptions = [\"{SUB}\"]\ncredential = \"managed_identity\"\n\
                     api_url = \"http://169.254.169.254\""
                ),
                "api_url: `http://169.254.169.254` is a link-local address",
            ),
            (
                format!("subscriptions = [\"{SUB}\"]\ncredential = \"password\""),
                "credential: `password` is not one of",
            ),
            (
                format!(
                    "subscriptions = [\"{SUB}\"]\ntenant_id = \"t\"\nclient_id = \"c\"\n\
                     client_secret_file = \"/a\"\nclient_secret_env = \"B\""
                ),
                "not both",
            ),
            (
                format!(
                    "subscriptions = [\"{SUB}\"]\ncredential = \"client_secret\"\n\
                     tenant_id = \"t\"\nclient_id = \"c\""
                ),
                "never written in the config",
            ),
        ] {
            let e = AzureConfig::from_toml(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
