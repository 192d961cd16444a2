//! The `aws` collector: GPU instances of AWS accounts, read with a read-only role.
//!
//! Per account and region it calls EC2 `DescribeInstances` (paginated; every state but
//! `terminated`) and `DescribeInstanceTypes` for the `GpuInfo` of the instance types it found
//! (model, count, memory, fractional partitions), and reports each running GPU instance as a
//! host with that many GPUs ([`crate::collectors::cloud`]). Requests are signed with SigV4
//! ([`aws_sigv4`]); credentials come from the standard chain ([`creds`]), and an account may
//! name a role to assume with STS `AssumeRole`.
//!
//! ```toml
//! [[collectors]]
//! type = "aws"
//! name = "aws"
//! regions = ["us-east-1", "us-west-2"]
//! accounts = [
//!   { id = "111122223333", role_arn = "arn:aws:iam::111122223333:role/gpuledger-reader" },
//!   { id = "444455556666", role_arn = "arn:aws:iam::444455556666:role/gpuledger-reader", external_id = "gpuledger" },
//! ]
//! interval_secs = 300
//! ```
//!
//! Without `accounts` it reads the account its credentials belong to. `endpoint` and
//! `sts_endpoint` point it elsewhere (a VPC endpoint, or an emulator in tests).

pub mod creds;
pub mod xml;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use gpuledger_model::Cloud;
use serde::Deserialize;

use crate::collectors::cloud::{self, CloudInstance, GpuSpec, InstanceState, Lifecycle};
use crate::{
    in_range, CollectError, CollectFuture, CollectReport, Collector, PartProblem, ReportFuture,
};
use creds::{Chain, Credentials};

/// The kind string: config `type`, module name, test module.
pub const KIND: &str = "aws";

/// The EC2 Query API version the requests and the parser follow.
const EC2_VERSION: &str = "2016-11-15";
/// The largest answer read from one call.
const MAX_ANSWER_BYTES: usize = 64 << 20;
/// Pages of one `DescribeInstances` walk at most (1,000 instances each).
const MAX_PAGES: usize = 1000;
/// The states asked for: all but `terminated`, which no longer costs and soon disappears.
const STATES: [&str; 5] = ["pending", "running", "shutting-down", "stopping", "stopped"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    regions: Option<Vec<String>>,
    accounts: Option<Vec<AccountFile>>,
    profile: Option<String>,
    endpoint: Option<String>,
    sts_endpoint: Option<String>,
    timeout_secs: Option<u64>,
    page_size: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AccountFile {
    id: String,
    role_arn: Option<String>,
    external_id: Option<String>,
}

/// One account to read: with a role to assume, or with the credentials themselves.
#[derive(Debug, Clone, PartialEq)]
pub struct Account {
    /// The 12-digit account ID; `None` for the credentials' own account (the ID is then read
    /// from the answers).
    pub id: Option<String>,
    pub role_arn: Option<String>,
    pub external_id: Option<String>,
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct AwsConfig {
    pub regions: Vec<String>,
    pub accounts: Vec<Account>,
    /// The profile of the shared credentials file to use (else `AWS_PROFILE`, else `default`).
    pub profile: Option<String>,
    /// The EC2 endpoint for every region, instead of `https://ec2.<region>.amazonaws.com`.
    pub endpoint: Option<reqwest::Url>,
    /// The STS endpoint, instead of `https://sts.amazonaws.com`.
    pub sts_endpoint: Option<reqwest::Url>,
    pub timeout: Duration,
    /// Instances asked for per `DescribeInstances` page (5..=1000, default 1000).
    pub page_size: u64,
}

fn url(key: &str, text: &str) -> Result<reqwest::Url, CollectError> {
    let u = reqwest::Url::parse(text)
        .map_err(|e| CollectError::Config(format!("{key}: `{text}` is not a URL: {e}")))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
        return Err(CollectError::Config(format!(
            "{key}: `{text}` must be an http(s) URL with a host"
        )));
    }
    Ok(u)
}

impl AwsConfig {
    /// Read and check a `[[collectors]]` entry's TOML text.
    pub fn from_toml(text: &str) -> Result<AwsConfig, CollectError> {
        AwsConfig::from_settings(&crate::own_settings(text)?)
    }

    /// Read and check an entry's own settings (the entry without [`crate::COMMON_KEYS`]).
    pub fn from_settings(own: &toml_edit::Table) -> Result<AwsConfig, CollectError> {
        let raw: FileConfig = crate::read_settings(own)?;
        let regions = raw.regions.unwrap_or_default();
        if regions.is_empty() {
            return Err(CollectError::Config(
                "set `regions` to the regions to read, like [\"us-east-1\"]".into(),
            ));
        }
        for (i, r) in regions.iter().enumerate() {
            let ok = !r.is_empty()
                && r.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !ok {
                return Err(CollectError::Config(format!(
                    "regions[{i}]: `{r}` is not a region name like `us-east-1`"
                )));
            }
        }
        let mut accounts = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, a) in raw.accounts.unwrap_or_default().into_iter().enumerate() {
            if a.id.len() != 12 || !a.id.chars().all(|c| c.is_ascii_digit()) {
                return Err(CollectError::Config(format!(
                    "accounts[{i}].id: `{}` is not a 12-digit account ID",
                    a.id
                )));
            }
            if !seen.insert(a.id.clone()) {
                return Err(CollectError::Config(format!(
                    "accounts[{i}].id: account {} is listed twice",
                    a.id
                )));
            }
            if let Some(arn) = &a.role_arn {
                if !(arn.starts_with("arn:aws") && arn.contains(":role/")) {
                    return Err(CollectError::Config(format!(
                        "accounts[{i}].role_arn: `{arn}` is not a role ARN like \
                         arn:aws:iam::111122223333:role/gpuledger-reader"
                    )));
                }
            }
            accounts.push(Account {
                id: Some(a.id),
                role_arn: a.role_arn,
                external_id: a.external_id,
            });
        }
        if accounts.is_empty() {
            accounts.push(Account {
                id: None,
                role_arn: None,
                external_id: None,
            });
        }
        Ok(AwsConfig {
            regions,
            accounts,
            profile: raw.profile,
            endpoint: raw
                .endpoint
                .as_deref()
                .map(|u| url("endpoint", u))
                .transpose()?,
            sts_endpoint: raw
                .sts_endpoint
                .as_deref()
                .map(|u| url("sts_endpoint", u))
                .transpose()?,
            timeout: Duration::from_secs(in_range("timeout_secs", raw.timeout_secs, 30, 1, 300)?),
            page_size: in_range("page_size", raw.page_size, 1000, 5, 1000)?,
        })
    }

    /// The EC2 endpoint of `region`.
    fn ec2_url(&self, region: &str) -> reqwest::Url {
        self.endpoint.clone().unwrap_or_else(|| {
            reqwest::Url::parse(&format!("https://ec2.{region}.amazonaws.com/"))
                .expect("a region name makes a valid host")
        })
    }

    fn sts_url(&self) -> reqwest::Url {
        self.sts_endpoint.clone().unwrap_or_else(|| {
            reqwest::Url::parse("https://sts.amazonaws.com/").expect("a valid URL")
        })
    }

    /// The hosts this collector connects to, for the server's `collector_hosts` allow-list:
    /// the EC2 endpoints, and STS when a role is assumed. The credential sources of the
    /// machine it runs on (the instance metadata service) are not listed.
    pub fn hosts(&self) -> Result<Vec<String>, CollectError> {
        let mut out: Vec<String> = self
            .regions
            .iter()
            .filter_map(|r| self.ec2_url(r).host_str().map(str::to_string))
            .collect();
        if self.accounts.iter().any(|a| a.role_arn.is_some()) {
            out.extend(self.sts_url().host_str().map(str::to_string));
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

/// The collector.
pub struct AwsCollector {
    name: String,
    config: AwsConfig,
    client: reqwest::Client,
    chain: Chain,
}

impl AwsCollector {
    pub fn new(name: &str, config: AwsConfig) -> Result<AwsCollector, CollectError> {
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .build()
            .map_err(|e| CollectError::Config(format!("cannot build an HTTP client: {e}")))?;
        let chain = Chain::new(client.clone(), config.profile.clone(), config.sts_url());
        Ok(AwsCollector {
            name: name.to_string(),
            config,
            client,
            chain,
        })
    }

    /// Every instance of every account and region, and a problem for each account and region
    /// that could not be read. An error when none could.
    pub async fn instances(&self) -> Result<(Vec<CloudInstance>, Vec<PartProblem>), CollectError> {
        let mut out = Vec::new();
        let mut problems = Vec::new();
        let (mut parts, mut failed) = (0, 0);
        for account in &self.config.accounts {
            let who = account
                .id
                .as_deref()
                .unwrap_or("(the credentials' account)");
            let creds = match self.chain.for_account(account).await {
                Ok(c) => c,
                Err(e) => {
                    parts += self.config.regions.len();
                    failed += self.config.regions.len();
                    problems.push(PartProblem {
                        part: format!("account {who}"),
                        error: e,
                    });
                    continue;
                }
            };
            for region in &self.config.regions {
                parts += 1;
                match self.read_region(&creds, account, region).await {
                    Ok(mut found) => out.append(&mut found),
                    Err(e) => {
                        failed += 1;
                        problems.push(PartProblem {
                            part: format!("account {who}, region {region}"),
                            error: e,
                        })
                    }
                }
            }
        }
        if parts > 0 && failed >= parts {
            // Every part failed: the run failed, with the first reason and a count.
            let first = problems.remove(0);
            let more = match failed - 1 {
                0 => String::new(),
                n => format!(" (and {n} more account/region parts failed)"),
            };
            let text = format!("{first}{more}");
            return Err(match first.error {
                CollectError::Config(_) => CollectError::Config(text),
                CollectError::Data(_) => CollectError::Data(text),
                CollectError::Transient(_) => CollectError::Transient(text),
            });
        }
        Ok((out, problems))
    }

    async fn read_region(
        &self,
        creds: &Credentials,
        account: &Account,
        region: &str,
    ) -> Result<Vec<CloudInstance>, CollectError> {
        let mut raw = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut params: Vec<(String, String)> = vec![
                ("Action".into(), "DescribeInstances".into()),
                ("Version".into(), EC2_VERSION.into()),
                ("MaxResults".into(), self.config.page_size.to_string()),
                ("Filter.1.Name".into(), "instance-state-name".into()),
            ];
            for (n, s) in STATES.iter().enumerate() {
                params.push((format!("Filter.1.Value.{}", n + 1), s.to_string()));
            }
            if let Some(t) = &token {
                params.push(("NextToken".into(), t.clone()));
            }
            let body = self
                .call(creds, region, "DescribeInstances", &params)
                .await?;
            let page = xml::instances(&body)
                .map_err(|e| CollectError::Data(format!("DescribeInstances in {region}: {e}")))?;
            raw.extend(page.instances);
            match page.next_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => break,
            }
        }
        let types: BTreeSet<String> = raw.iter().map(|i| i.instance_type.clone()).collect();
        let gpus = self.instance_types(creds, region, &types).await?;
        Ok(raw
            .into_iter()
            .map(|i| {
                let gpu = gpus.get(&i.instance_type).cloned().flatten();
                to_instance(i, account, region, gpu)
            })
            .collect())
    }

    /// The GPUs of each instance type (`None` for a type without GPUs), 100 types per call.
    async fn instance_types(
        &self,
        creds: &Credentials,
        region: &str,
        types: &BTreeSet<String>,
    ) -> Result<BTreeMap<String, Option<GpuSpec>>, CollectError> {
        let mut out = BTreeMap::new();
        let types: Vec<&String> = types.iter().collect();
        for chunk in types.chunks(100) {
            let mut token: Option<String> = None;
            for _ in 0..MAX_PAGES {
                let mut params: Vec<(String, String)> = vec![
                    ("Action".into(), "DescribeInstanceTypes".into()),
                    ("Version".into(), EC2_VERSION.into()),
                ];
                for (n, t) in chunk.iter().enumerate() {
                    params.push((format!("InstanceType.{}", n + 1), t.to_string()));
                }
                if let Some(t) = &token {
                    params.push(("NextToken".into(), t.clone()));
                }
                let body = self
                    .call(creds, region, "DescribeInstanceTypes", &params)
                    .await?;
                let page = xml::instance_types(&body).map_err(|e| {
                    CollectError::Data(format!("DescribeInstanceTypes in {region}: {e}"))
                })?;
                out.extend(page.types);
                match page.next_token {
                    Some(t) if !t.is_empty() => token = Some(t),
                    _ => break,
                }
            }
        }
        Ok(out)
    }

    /// One signed EC2 Query API call; its answer's body.
    async fn call(
        &self,
        creds: &Credentials,
        region: &str,
        action: &str,
        params: &[(String, String)],
    ) -> Result<String, CollectError> {
        let url = self.config.ec2_url(region);
        let what = format!("EC2 {action} in {region}");
        signed_post(&self.client, creds, url, region, "ec2", params, &what).await
    }
}

/// POST `params` as a form to `url`, signed with SigV4 for `service` in `region`; the answer's
/// body. An AWS error answer becomes an error naming its code (`UnauthorizedOperation`): a
/// 4xx other than throttling is the configuration's (permissions, credentials), the rest pass.
pub(crate) async fn signed_post(
    client: &reqwest::Client,
    creds: &Credentials,
    url: reqwest::Url,
    region: &str,
    service: &str,
    params: &[(String, String)],
    what: &str,
) -> Result<String, CollectError> {
    use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
    use aws_sigv4::sign::v4;
    let body = form(params);
    let content_type = "application/x-www-form-urlencoded; charset=utf-8";
    let host = match (url.host_str(), url.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        _ => return Err(CollectError::Config(format!("{what}: {url} names no host"))),
    };
    let identity = aws_credential_types::Credentials::new(
        creds.key_id.clone(),
        creds.secret.clone(),
        creds.token.clone(),
        None,
        "gpuledger",
    )
    .into();
    let params_v4 = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(std::time::SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| CollectError::Config(format!("{what}: cannot sign: {e}")))?
        .into();
    let headers = [("host", host.as_str()), ("content-type", content_type)];
    let signable = SignableRequest::new(
        "POST",
        url.as_str(),
        headers.iter().copied(),
        SignableBody::Bytes(body.as_bytes()),
    )
    .map_err(|e| CollectError::Config(format!("{what}: cannot sign: {e}")))?;
    let (instructions, _) = sign(signable, &params_v4)
        .map_err(|e| CollectError::Config(format!("{what}: cannot sign: {e}")))?
        .into_parts();
    let mut req = client
        .post(url.clone())
        .header("content-type", content_type)
        .body(body);
    for (name, value) in instructions.headers() {
        req = req.header(name, value);
    }
    send(req, what).await
}

/// Send a request and read its answer as text, turning AWS error answers into errors.
pub(crate) async fn send(req: reqwest::RequestBuilder, what: &str) -> Result<String, CollectError> {
    let resp = req.send().await.map_err(|e| {
        let e = e.without_url();
        if e.is_timeout() {
            CollectError::Transient(format!("{what}: timed out; raise `timeout_secs`"))
        } else {
            CollectError::Transient(format!("{what}: {e}; check that gpuledger can reach it"))
        }
    })?;
    let status = resp.status();
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| CollectError::Transient(format!("{what}: reading the answer failed: {e}")))?;
    if bytes.len() > MAX_ANSWER_BYTES {
        return Err(CollectError::Data(format!(
            "{what}: the answer is over {MAX_ANSWER_BYTES} bytes"
        )));
    }
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if status.is_success() {
        return Ok(text);
    }
    // Only the error's code is repeated (a word like `UnauthorizedOperation`); its message may
    // carry anything the endpoint says, so it goes to the log.
    let code = xml::error_code(&text);
    tracing::warn!(request = %what, %status, answer = %text.chars().take(300).collect::<String>(), "AWS error answer");
    let msg = match &code {
        Some(c) => format!("{what}: answered HTTP {status}, {c}"),
        None => format!("{what}: answered HTTP {status}"),
    };
    let throttled = code
        .as_deref()
        .is_some_and(|c| c.contains("Throttl") || c == "RequestLimitExceeded");
    Err(
        if status.is_client_error() && status.as_u16() != 429 && !throttled {
            CollectError::Config(format!(
                "{msg}; check the credentials and that the role grants the permissions in \
                 deploy/aws/gpuledger-reader-policy.json"
            ))
        } else {
            CollectError::Transient(msg)
        },
    )
}

/// `application/x-www-form-urlencoded` text of `params`.
fn form(params: &[(String, String)]) -> String {
    let mut s = reqwest::Url::parse("http://x/").expect("a valid URL");
    s.query_pairs_mut()
        .extend_pairs(params.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    s.query().unwrap_or_default().to_string()
}

/// An instance of a `DescribeInstances` answer, as read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawInstance {
    pub instance_id: String,
    pub instance_type: String,
    pub owner_id: Option<String>,
    pub zone: Option<String>,
    pub private_dns_name: Option<String>,
    pub launch_time: Option<DateTime<Utc>>,
    pub state: String,
    pub state_transition_reason: Option<String>,
    pub lifecycle: Option<String>,
    pub capacity_reservation_id: Option<String>,
    pub tags: BTreeMap<String, String>,
}

/// When a stop or termination happened, from `stateTransitionReason`
/// (`User initiated (2026-11-02 10:00:00 GMT)`; some emulators write `UTC`).
fn transition_time(reason: &str) -> Option<DateTime<Utc>> {
    let open = reason.rfind('(')?;
    let inner = reason[open + 1..].strip_suffix(')')?;
    let inner = inner
        .strip_suffix(" GMT")
        .or_else(|| inner.strip_suffix(" UTC"))
        .unwrap_or(inner);
    NaiveDateTime::parse_from_str(inner.trim(), "%Y-%m-%d %H:%M:%S")
        .ok()
        .map(|t| t.and_utc())
}

fn to_instance(
    i: RawInstance,
    account: &Account,
    region: &str,
    gpus: Option<GpuSpec>,
) -> CloudInstance {
    let state = match i.state.as_str() {
        "pending" | "running" => InstanceState::Running,
        other => InstanceState::Stopped {
            since: i
                .state_transition_reason
                .as_deref()
                .and_then(transition_time),
            state: other.to_string(),
        },
    };
    let lifecycle = match i.lifecycle.as_deref() {
        Some("spot") => Lifecycle::Spot,
        Some("capacity-block") => Lifecycle::CapacityBlock,
        _ if i.capacity_reservation_id.is_some() => Lifecycle::Reserved,
        _ => Lifecycle::OnDemand,
    };
    CloudInstance {
        cloud: Cloud::Aws,
        account: account
            .id
            .clone()
            .or(i.owner_id.clone())
            .unwrap_or_else(|| "unknown".into()),
        region: Some(region.to_string()),
        zone: i.zone,
        instance_id: i.instance_id,
        host_name: i.private_dns_name.filter(|h| !h.is_empty()),
        instance_type: i.instance_type,
        state,
        lifecycle,
        launch_time: i.launch_time,
        tags: i.tags,
        gpus,
    }
}

impl AwsCollector {
    async fn report(&self) -> Result<CollectReport, CollectError> {
        Ok(cloud::report(&self.name, self.instances().await?))
    }
}

impl Collector for AwsCollector {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn collect(&self) -> CollectFuture<'_> {
        Box::pin(async move { self.report().await.map(|r| r.observations) })
    }

    fn collect_report(&self) -> ReportFuture<'_> {
        Box::pin(self.report())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reader policy in deploy/aws grants exactly the EC2 calls this module makes.
    #[test]
    fn the_reader_policy_grants_exactly_the_calls_made() {
        let code = include_str!("mod.rs");
        let called: BTreeSet<String> =
            ["DescribeInstances", "DescribeInstanceTypes", "RunInstances"]
                .into_iter()
                .filter(|a| code.contains(&format!("(\"Action\".into(), \"{a}\".into())")))
                .map(|a| format!("ec2:{a}"))
                .collect();
        let policy: serde_json::Value = serde_json::from_str(include_str!(
            "../../../../../deploy/aws/gpuledger-reader-policy.json"
        ))
        .unwrap();
        let granted: BTreeSet<String> = policy["Statement"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["Action"].as_array().unwrap().iter())
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        assert_eq!(called, granted);
    }

    #[test]
    fn settings_are_checked() {
        let c = AwsConfig::from_toml("regions = [\"us-east-1\"]\n").unwrap();
        assert_eq!(c.accounts.len(), 1);
        assert_eq!(c.accounts[0].id, None);
        assert_eq!(c.hosts().unwrap(), ["ec2.us-east-1.amazonaws.com"]);
        let c = AwsConfig::from_toml(
            "regions = [\"us-east-1\", \"eu-west-1\"]\naccounts = [{ id = \"111122223333\", role_arn = \"arn:aws:iam::111122223333:role/r\" }]\n",
        )
        .unwrap();
        assert_eq!(
            c.hosts().unwrap(),
            [
                "ec2.eu-west-1.amazonaws.com",
                "ec2.us-east-1.amazonaws.com",
                "sts.amazonaws.com"
            ]
        );
        for (text, want) in [
            ("", "set `regions`"),
            ("regions = [\"US East\"]\n", "regions[0]: `US East`"),
            (
                "regions = [\"us-east-1\"]\naccounts = [{ id = \"12\" }]\n",
                "accounts[0].id: `12` is not a 12-digit",
            ),
            (
                "regions = [\"us-east-1\"]\naccounts = [{ id = \"111122223333\", role_arn = \"gpuledger\" }]\n",
                "accounts[0].role_arn",
            ),
            (
                "regions = [\"us-east-1\"]\nendpoint = \"ftp://x\"\n",
                "endpoint: `ftp://x` must be an http(s) URL",
            ),
            ("regions = [\"us-east-1\"]\nregion = \"x\"\n", "unknown field `region`"),
        ] {
            let e = AwsConfig::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn stop_times_are_read_from_the_transition_reason() {
        assert_eq!(
            transition_time("User initiated (2026-11-02 10:00:00 GMT)").map(|t| t.to_rfc3339()),
            Some("2026-11-02T10:00:00+00:00".into())
        );
        assert!(transition_time("User initiated (2026-11-02 10:00:00 UTC)").is_some());
        assert_eq!(transition_time("Server.SpotInstanceTermination"), None);
        assert_eq!(transition_time("User initiated (yesterday)"), None);
    }
}
