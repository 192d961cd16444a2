//! AWS credentials, found the way the AWS CLI and SDKs find them, first that answers wins:
//!
//! 1. the environment: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`;
//! 2. web identity (EKS IRSA and pod identity webhooks): `AWS_WEB_IDENTITY_TOKEN_FILE` and
//!    `AWS_ROLE_ARN`, exchanged with STS `AssumeRoleWithWebIdentity`;
//! 3. the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
//!    `~/.aws/credentials`), profile from the config, else `AWS_PROFILE`, else `default`;
//! 4. the container credentials endpoint (ECS, EKS Pod Identity):
//!    `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` or `AWS_CONTAINER_CREDENTIALS_FULL_URI`;
//! 5. the instance role, from the instance metadata service (IMDSv2, a session token first).
//!
//! An account with a `role_arn` is read with temporary credentials from STS `AssumeRole`,
//! signed with the credentials above. Temporary credentials are kept until five minutes before
//! they expire.

use std::collections::HashMap;
use std::path::PathBuf;

use chrono::{DateTime, Duration, Utc};
use tokio::sync::Mutex;

use super::{send, signed_post, xml, Account};
use crate::CollectError;

/// A key pair, with its session token and expiry when temporary.
#[derive(Clone, PartialEq)]
pub struct Credentials {
    pub key_id: String,
    pub secret: String,
    pub token: Option<String>,
    pub expires: Option<DateTime<Utc>>,
    /// Where they came from, for messages (`environment`, `profile default`, `instance role`).
    pub origin: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("key_id", &self.key_id)
            .field("origin", &self.origin)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    fn fresh(&self, now: DateTime<Utc>) -> bool {
        self.expires.is_none_or(|e| e - now > Duration::minutes(5))
    }
}

/// The credential chain and the roles assumed with it.
pub struct Chain {
    client: reqwest::Client,
    profile: Option<String>,
    sts: reqwest::Url,
    base: Mutex<Option<Credentials>>,
    roles: Mutex<HashMap<String, Credentials>>,
}

/// Where the instance metadata service and the container endpoint answer.
const IMDS: &str = "http://169.254.169.254";
const CONTAINER: &str = "http://169.254.170.2";

impl Chain {
    pub fn new(client: reqwest::Client, profile: Option<String>, sts: reqwest::Url) -> Chain {
        Chain {
            client,
            profile,
            sts,
            base: Mutex::new(None),
            roles: Mutex::new(HashMap::new()),
        }
    }

    /// The credentials to read `account` with.
    pub async fn for_account(&self, account: &Account) -> Result<Credentials, CollectError> {
        let base = self.base().await?;
        let Some(arn) = &account.role_arn else {
            return Ok(base);
        };
        let now = Utc::now();
        let mut roles = self.roles.lock().await;
        if let Some(c) = roles.get(arn).filter(|c| c.fresh(now)) {
            return Ok(c.clone());
        }
        let mut params = vec![
            ("Action".to_string(), "AssumeRole".to_string()),
            ("Version".into(), "2011-06-15".into()),
            ("RoleArn".into(), arn.clone()),
            ("RoleSessionName".into(), "gpuledger".into()),
            ("DurationSeconds".into(), "3600".into()),
        ];
        if let Some(x) = &account.external_id {
            params.push(("ExternalId".into(), x.clone()));
        }
        let what = format!("STS AssumeRole {arn}");
        let body = signed_post(
            &self.client,
            &base,
            self.sts.clone(),
            "us-east-1",
            "sts",
            &params,
            &what,
        )
        .await?;
        let c = temporary(&body, &what, format!("role {arn}"))?;
        roles.insert(arn.clone(), c.clone());
        Ok(c)
    }

    /// The chain's own credentials, kept while fresh.
    async fn base(&self) -> Result<Credentials, CollectError> {
        let mut base = self.base.lock().await;
        if let Some(c) = base.as_ref().filter(|c| c.fresh(Utc::now())) {
            return Ok(c.clone());
        }
        let c = self.find().await?;
        *base = Some(c.clone());
        Ok(c)
    }

    async fn find(&self) -> Result<Credentials, CollectError> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        if let (Some(key_id), Some(secret)) =
            (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"))
        {
            return Ok(Credentials {
                key_id,
                secret,
                token: env("AWS_SESSION_TOKEN"),
                expires: None,
                origin: "environment".into(),
            });
        }
        if let (Some(file), Some(arn)) = (env("AWS_WEB_IDENTITY_TOKEN_FILE"), env("AWS_ROLE_ARN")) {
            return self.web_identity(&file, &arn).await;
        }
        let profile = self
            .profile
            .clone()
            .or_else(|| env("AWS_PROFILE"))
            .unwrap_or_else(|| "default".into());
        let file = env("AWS_SHARED_CREDENTIALS_FILE")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".aws/credentials")));
        if let Some(file) = file.filter(|f| f.is_file()) {
            let text = std::fs::read_to_string(&file).map_err(|e| {
                CollectError::Config(format!("credentials file {}: {e}", file.display()))
            })?;
            match profile_keys(&text, &profile) {
                Some(Ok(c)) => return Ok(c),
                Some(Err(e)) => {
                    return Err(CollectError::Config(format!(
                        "credentials file {}: {e}",
                        file.display()
                    )))
                }
                None if self.profile.is_some() => {
                    return Err(CollectError::Config(format!(
                        "credentials file {} has no profile `{profile}`",
                        file.display()
                    )))
                }
                None => {}
            }
        } else if self.profile.is_some() {
            return Err(CollectError::Config(format!(
                "profile `{profile}` is set, but there is no shared credentials file"
            )));
        }
        if let Some(uri) = env("AWS_CONTAINER_CREDENTIALS_FULL_URI").or_else(|| {
            env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").map(|r| format!("{CONTAINER}{r}"))
        }) {
            return self.container(&uri).await;
        }
        self.instance_role().await.map_err(|e| {
            CollectError::Config(format!(
                "no AWS credentials found: none in the environment, no web identity, no \
                 profile `{profile}` in a shared credentials file, no container endpoint, and \
                 the instance metadata service: {e}"
            ))
        })
    }

    async fn web_identity(&self, file: &str, arn: &str) -> Result<Credentials, CollectError> {
        let token = std::fs::read_to_string(file).map_err(|e| {
            CollectError::Config(format!("AWS_WEB_IDENTITY_TOKEN_FILE {file}: {e}"))
        })?;
        let params = [
            ("Action", "AssumeRoleWithWebIdentity"),
            ("Version", "2011-06-15"),
            ("RoleArn", arn),
            ("RoleSessionName", "gpuledger"),
            ("WebIdentityToken", token.trim()),
        ];
        let what = format!("STS AssumeRoleWithWebIdentity {arn}");
        let body = send(self.client.post(self.sts.clone()).form(&params), &what).await?;
        temporary(&body, &what, format!("web identity {arn}"))
    }

    async fn container(&self, uri: &str) -> Result<Credentials, CollectError> {
        let mut req = self.client.get(uri);
        if let Ok(t) = std::env::var("AWS_CONTAINER_AUTHORIZATION_TOKEN") {
            req = req.header("authorization", t);
        } else if let Ok(f) = std::env::var("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
            let t = std::fs::read_to_string(&f).map_err(|e| {
                CollectError::Config(format!("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE {f}: {e}"))
            })?;
            req = req.header("authorization", t.trim());
        }
        let body = send(req, "the container credentials endpoint").await?;
        json_credentials(&body, "container credentials")
    }

    /// The instance role's credentials from the instance metadata service (IMDSv2: a session
    /// token first, then the role's name and its credentials).
    async fn instance_role(&self) -> Result<Credentials, CollectError> {
        let short = std::time::Duration::from_secs(2);
        let token = send(
            self.client
                .put(format!("{IMDS}/latest/api/token"))
                .header("x-aws-ec2-metadata-token-ttl-seconds", "21600")
                .timeout(short),
            "the instance metadata service",
        )
        .await?;
        let get = |path: String| {
            self.client
                .get(format!("{IMDS}{path}"))
                .header("x-aws-ec2-metadata-token", token.trim())
                .timeout(short)
        };
        let base = "/latest/meta-data/iam/security-credentials/";
        let roles = send(get(base.to_string()), "the instance metadata service").await?;
        let role = roles.lines().next().map(str::trim).unwrap_or_default();
        if role.is_empty() {
            return Err(CollectError::Config(
                "the instance has no IAM role attached".into(),
            ));
        }
        let body = send(
            get(format!("{base}{role}")),
            "the instance metadata service",
        )
        .await?;
        json_credentials(&body, &format!("instance role {role}"))
    }
}

/// Temporary credentials from an STS answer.
fn temporary(body: &str, what: &str, origin: String) -> Result<Credentials, CollectError> {
    let (key_id, secret, token, expires) =
        xml::sts_credentials(body).map_err(|e| CollectError::Data(format!("{what}: {e}")))?;
    Ok(Credentials {
        key_id,
        secret,
        token: Some(token),
        expires: Some(expires),
        origin,
    })
}

/// Credentials from the JSON the container endpoint and the instance metadata service answer
/// (`AccessKeyId`, `SecretAccessKey`, `Token`, `Expiration`).
fn json_credentials(body: &str, origin: &str) -> Result<Credentials, CollectError> {
    let v: serde_json::Value = serde_json::from_str(body)
        .map_err(|e| CollectError::Data(format!("{origin}: the answer is not JSON: {e}")))?;
    let get = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_str())
            .map(str::to_string)
            .ok_or_else(|| CollectError::Data(format!("{origin}: `{k}` is missing")))
    };
    let expires = match v.get("Expiration").and_then(|x| x.as_str()) {
        None => None,
        Some(t) => Some(
            DateTime::parse_from_rfc3339(t)
                .map_err(|e| CollectError::Data(format!("{origin}: Expiration `{t}`: {e}")))?
                .with_timezone(&Utc),
        ),
    };
    Ok(Credentials {
        key_id: get("AccessKeyId")?,
        secret: get("SecretAccessKey")?,
        token: get("Token").ok(),
        expires,
        origin: origin.to_string(),
    })
}

/// The static keys of `profile` in a shared credentials file (INI); `None` when the file has
/// no such profile.
fn profile_keys(text: &str, profile: &str) -> Option<Result<Credentials, String>> {
    let mut section: Option<&str> = None;
    let mut found = false;
    let mut keys: HashMap<&str, &str> = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(name.trim());
            found |= section == Some(profile);
            continue;
        }
        if section == Some(profile) {
            if let Some((k, v)) = line.split_once('=') {
                keys.insert(k.trim(), v.trim());
            }
        }
    }
    if !found {
        return None;
    }
    let get = |k: &str| keys.get(k).map(|v| v.to_string());
    Some(
        match (get("aws_access_key_id"), get("aws_secret_access_key")) {
            (Some(key_id), Some(secret)) => Ok(Credentials {
                key_id,
                secret,
                token: get("aws_session_token"),
                expires: None,
                origin: format!("profile {profile}"),
            }),
            _ => Err(format!(
                "profile `{profile}` has no aws_access_key_id and aws_secret_access_key (profiles \
             that assume a role or use SSO are not read; give the role as an account's \
             `role_arn` instead)"
            )),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_read_from_the_credentials_file() {
        let text = "[default]\naws_access_key_id = AKIA1\naws_secret_access_key = s1\n\n# c\n[prod]\naws_access_key_id=AKIA2\naws_secret_access_key=s2\naws_session_token = t2\n[sso]\nsso_session = x\n";
        let c = profile_keys(text, "prod").unwrap().unwrap();
        assert_eq!(
            (c.key_id.as_str(), c.token.as_deref()),
            ("AKIA2", Some("t2"))
        );
        assert_eq!(
            profile_keys(text, "default").unwrap().unwrap().key_id,
            "AKIA1"
        );
        assert!(profile_keys(text, "nope").is_none());
        let e = profile_keys(text, "sso").unwrap().unwrap_err();
        assert!(e.contains("profile `sso` has no aws_access_key_id"), "{e}");
    }

    #[test]
    fn metadata_credentials_are_read_or_named() {
        let c = json_credentials(
            r#"{"Code":"Success","AccessKeyId":"ASIA1","SecretAccessKey":"s","Token":"t","Expiration":"2026-12-03T12:00:00Z"}"#,
            "instance role r",
        )
        .unwrap();
        assert_eq!(c.key_id, "ASIA1");
        assert!(c.expires.is_some());
        let e = json_credentials(r#"{"AccessKeyId":"A"}"#, "instance role r").unwrap_err();
        assert!(
            e.to_string()
                .contains("instance role r: `SecretAccessKey` is missing"),
            "{e}"
        );
        let c = Credentials {
            key_id: "AKIA".into(),
            secret: "very-secret".into(),
            token: None,
            expires: None,
            origin: "environment".into(),
        };
        assert!(!format!("{c:?}").contains("very-secret"));
    }
}
