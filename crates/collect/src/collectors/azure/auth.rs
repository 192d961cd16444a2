//! Access tokens for Azure Resource Manager: a service principal's client secret or a workload
//! identity's federated token (both the OAuth 2.0 client credentials grant at Microsoft Entra
//! ID), or a managed identity (the instance metadata service). Secrets and federated tokens
//! are read at every refresh, so rotation needs no restart, and never kept in the config.

use std::path::PathBuf;

use crate::collectors::gcp::auth::{token_answer, Token};
use crate::http::get_bytes;
use crate::CollectError;

const MAX_TOKEN_BYTES: usize = 64 * 1024;
/// The assertion type of a federated token.
const JWT_ASSERTION: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// Where a client secret is read from, at every token refresh.
#[derive(Debug, Clone, PartialEq)]
pub enum SecretSource {
    File(PathBuf),
    /// The name of an environment variable holding it.
    Env(String),
}

/// How the collector signs in.
#[derive(Debug, Clone, PartialEq)]
pub enum AzureCredentials {
    /// A service principal and its client secret.
    ClientSecret {
        tenant_id: String,
        client_id: String,
        secret: SecretSource,
    },
    /// A workload identity: a federated token (AKS writes it to `AZURE_FEDERATED_TOKEN_FILE`)
    /// exchanged for the app registration's or managed identity's token.
    WorkloadIdentity {
        tenant_id: String,
        client_id: String,
        token_file: PathBuf,
    },
    /// The VM's managed identity: the system-assigned one, or the user-assigned one with
    /// `client_id`.
    ManagedIdentity { client_id: Option<String> },
}

impl AzureCredentials {
    /// The setting's word for it.
    pub fn word(&self) -> &'static str {
        match self {
            AzureCredentials::ClientSecret { .. } => "client_secret",
            AzureCredentials::WorkloadIdentity { .. } => "workload_identity",
            AzureCredentials::ManagedIdentity { .. } => "managed_identity",
        }
    }
}

/// Where tokens are asked for.
pub(crate) struct Endpoints<'a> {
    pub login_url: &'a str,
    pub imds_url: &'a str,
    /// The Resource Manager audience (`https://management.azure.com/`).
    pub resource: &'a str,
}

/// Ask for a token.
pub(crate) async fn fetch(
    client: &reqwest::Client,
    credentials: &AzureCredentials,
    at: &Endpoints<'_>,
) -> Result<Token, CollectError> {
    let scope = format!("{}/.default", at.resource.trim_end_matches('/'));
    let token_url = |tenant: &str| {
        format!(
            "{}/{tenant}/oauth2/v2.0/token",
            at.login_url.trim_end_matches('/')
        )
    };
    let (what, req) = match credentials {
        AzureCredentials::ClientSecret {
            tenant_id,
            client_id,
            secret,
        } => {
            let secret = read_secret(secret)?;
            let url = token_url(tenant_id);
            (
                format!("POST {url} (client secret of {client_id})"),
                client.post(&url).form(&[
                    ("grant_type", "client_credentials"),
                    ("client_id", client_id.as_str()),
                    ("client_secret", secret.as_str()),
                    ("scope", scope.as_str()),
                ]),
            )
        }
        AzureCredentials::WorkloadIdentity {
            tenant_id,
            client_id,
            token_file,
        } => {
            let assertion = std::fs::read_to_string(token_file).map_err(|e| {
                CollectError::Config(format!(
                    "federated_token_file {}: cannot read it: {e}",
                    token_file.display()
                ))
            })?;
            let url = token_url(tenant_id);
            (
                format!("POST {url} (workload identity {client_id})"),
                client.post(&url).form(&[
                    ("grant_type", "client_credentials"),
                    ("client_id", client_id.as_str()),
                    ("client_assertion_type", JWT_ASSERTION),
                    ("client_assertion", assertion.trim()),
                    ("scope", scope.as_str()),
                ]),
            )
        }
        AzureCredentials::ManagedIdentity { client_id } => {
            let url = format!(
                "{}/metadata/identity/oauth2/token",
                at.imds_url.trim_end_matches('/')
            );
            let mut query = vec![("api-version", "2018-02-01"), ("resource", at.resource)];
            if let Some(id) = client_id {
                query.push(("client_id", id.as_str()));
            }
            (
                format!("GET {url} (managed identity)"),
                client.get(&url).query(&query).header("Metadata", "true"),
            )
        }
    };
    let body = get_bytes(req, &what, MAX_TOKEN_BYTES)
        .await
        .map_err(|e| match e {
            CollectError::Config(m) => CollectError::Config(format!(
                "{m}: the credentials were refused; check the tenant, the client ID and the \
                 secret or identity"
            )),
            other => other,
        })?;
    token_answer(&body).map_err(|m| CollectError::Data(format!("{what}: {m}")))
}

fn read_secret(source: &SecretSource) -> Result<String, CollectError> {
    let secret = match source {
        SecretSource::File(path) => std::fs::read_to_string(path).map_err(|e| {
            CollectError::Config(format!(
                "client_secret_file {}: cannot read it: {e}",
                path.display()
            ))
        })?,
        SecretSource::Env(name) => std::env::var(name).map_err(|_| {
            CollectError::Config(format!(
                "client_secret_env: the environment variable `{name}` is not set"
            ))
        })?,
    };
    let secret = secret.trim().to_string();
    if secret.is_empty() {
        return Err(CollectError::Config(match source {
            SecretSource::File(p) => format!("client_secret_file {}: empty", p.display()),
            SecretSource::Env(n) => format!("client_secret_env: `{n}` is empty"),
        }));
    }
    Ok(secret)
}
