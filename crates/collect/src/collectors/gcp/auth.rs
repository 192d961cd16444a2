//! Access tokens for the Compute Engine API: a service-account key file (an RS256-signed JWT
//! exchanged at the token endpoint, RFC 7523) or the metadata server (the VM's or the GKE
//! workload identity's service account). Tokens are kept until a minute before they expire.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize;

use crate::http::get_bytes;
use crate::CollectError;

/// The only scope asked for: read-only Compute Engine.
pub const SCOPE: &str = "https://www.googleapis.com/auth/compute.readonly";
/// The grant type of a JWT bearer assertion.
const JWT_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// A token answer is small; anything bigger is not one.
const MAX_TOKEN_BYTES: usize = 64 * 1024;
/// Lifetime asked for in the assertion (Google's maximum).
const ASSERTION_SECS: i64 = 3600;

/// Where tokens come from.
#[derive(Debug, Clone, PartialEq)]
pub enum GcpCredentials {
    /// A service-account key file (`"type": "service_account"`), read at every token refresh
    /// so that a rotated key needs no restart.
    KeyFile(PathBuf),
    /// The metadata server: the VM's service account, or on GKE the workload identity's.
    MetadataServer,
}

/// A token and when to stop using it.
#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub value: String,
    pub refresh_at: Instant,
}

impl Token {
    pub fn fresh(&self) -> bool {
        Instant::now() < self.refresh_at
    }
}

#[derive(Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: Option<String>,
    private_key: Option<String>,
    private_key_id: Option<String>,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: Option<serde_json::Value>,
    expires_in: Option<serde_json::Value>,
}

/// Ask for a token.
pub(crate) async fn fetch(
    client: &reqwest::Client,
    credentials: &GcpCredentials,
    token_url: &str,
    metadata_url: &str,
) -> Result<Token, CollectError> {
    let (what, req) = match credentials {
        GcpCredentials::KeyFile(path) => {
            let assertion = assertion_from_file(path, token_url, chrono::Utc::now().timestamp())?;
            (
                format!("POST {token_url} (service account key {})", path.display()),
                client
                    .post(token_url)
                    .form(&[("grant_type", JWT_GRANT), ("assertion", assertion.as_str())]),
            )
        }
        GcpCredentials::MetadataServer => {
            let url = format!(
                "{}/instance/service-accounts/default/token",
                metadata_url.trim_end_matches('/')
            );
            (
                format!("GET {url} (metadata server)"),
                client.get(&url).header("Metadata-Flavor", "Google"),
            )
        }
    };
    let body = get_bytes(req, &what, MAX_TOKEN_BYTES)
        .await
        .map_err(|e| match e {
            CollectError::Config(m) => CollectError::Config(format!(
                "{m}: the credentials were refused; check the key file or the service account \
                 attached to this VM or workload"
            )),
            other => other,
        })?;
    token_answer(&body).map_err(|m| CollectError::Data(format!("{what}: {m}")))
}

/// Read a token endpoint's answer: `access_token` and `expires_in` (seconds).
pub(crate) fn token_answer(body: &[u8]) -> Result<Token, String> {
    let a: TokenAnswer =
        serde_json::from_slice(body).map_err(|e| format!("the answer is not a token: {e}"))?;
    let value = match a.access_token {
        Some(serde_json::Value::String(s)) if !s.trim().is_empty() => s,
        Some(other) => {
            return Err(format!(
                "access_token: expected a string, got {}",
                super::parse::kind(&other)
            ))
        }
        None => return Err("access_token: missing".into()),
    };
    // Some token services write the number as a string.
    let secs = match &a.expires_in {
        Some(serde_json::Value::Number(n)) => n.as_u64(),
        Some(serde_json::Value::String(s)) => s.trim().parse::<u64>().ok(),
        None => Some(ASSERTION_SECS as u64),
        Some(_) => None,
    }
    .ok_or_else(|| "expires_in: expected a whole number of seconds".to_string())?;
    Ok(Token {
        value,
        refresh_at: Instant::now() + Duration::from_secs(secs.saturating_sub(60).max(1)),
    })
}

/// The signed assertion for the key file at `path`, for the token endpoint `aud`.
fn assertion_from_file(path: &Path, aud: &str, now: i64) -> Result<String, CollectError> {
    let at = |m: String| CollectError::Config(format!("credentials_file {}: {m}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| at(format!("cannot read it: {e}")))?;
    let key: KeyFile = serde_json::from_str(&text)
        .map_err(|e| at(format!("not a service account key (JSON): {e}")))?;
    match key.kind.as_deref() {
        Some("service_account") => {}
        Some(other) => {
            return Err(at(format!(
                "type: `{other}` credentials are not read; give a service account key \
                 (`\"type\": \"service_account\"`), or leave `credentials_file` out to use the \
                 metadata server (workload identity)"
            )))
        }
        None => return Err(at("type: missing; expected `service_account`".into())),
    }
    let email = key
        .client_email
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| at("client_email: missing".into()))?;
    let pem = key
        .private_key
        .ok_or_else(|| at("private_key: missing".into()))?;
    assertion(&email, key.private_key_id.as_deref(), &pem, aud, now)
        .map_err(|m| at(format!("private_key: {m}")))
}

/// An RS256 JWT asserting `email` for [`SCOPE`] at `aud`, signed with the PEM key `pem`
/// (PKCS #8 `PRIVATE KEY`, or PKCS #1 `RSA PRIVATE KEY`).
pub(crate) fn assertion(
    email: &str,
    key_id: Option<&str>,
    pem: &str,
    aud: &str,
    now: i64,
) -> Result<String, String> {
    let (label, der) = pem_body(pem)?;
    let key = match label.as_str() {
        "PRIVATE KEY" => ring::signature::RsaKeyPair::from_pkcs8(&der),
        "RSA PRIVATE KEY" => ring::signature::RsaKeyPair::from_der(&der),
        other => return Err(format!("a PEM `{other}` block is not an RSA private key")),
    }
    .map_err(|e| format!("not a usable RSA key: {e}"))?;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
    if let Some(kid) = key_id.filter(|k| !k.is_empty()) {
        header["kid"] = serde_json::Value::String(kid.to_string());
    }
    let claims = serde_json::json!({
        "iss": email,
        "scope": SCOPE,
        "aud": aud,
        "iat": now,
        "exp": now + ASSERTION_SECS,
    });
    let signing_input = format!(
        "{}.{}",
        b64.encode(header.to_string()),
        b64.encode(claims.to_string())
    );
    let mut signature = vec![0u8; key.public().modulus_len()];
    key.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        signing_input.as_bytes(),
        &mut signature,
    )
    .map_err(|_| "signing failed".to_string())?;
    Ok(format!("{signing_input}.{}", b64.encode(signature)))
}

/// The label and the decoded body of the first PEM block in `pem`.
fn pem_body(pem: &str) -> Result<(String, Vec<u8>), String> {
    let mut lines = pem.lines().map(str::trim).skip_while(|l| l.is_empty());
    let label = lines
        .next()
        .and_then(|l| l.strip_prefix("-----BEGIN "))
        .and_then(|l| l.strip_suffix("-----"))
        .ok_or("not a PEM block (expected `-----BEGIN PRIVATE KEY-----`)")?
        .to_string();
    let end = format!("-----END {label}-----");
    let mut b64 = String::new();
    let mut ended = false;
    for l in lines {
        if l == end {
            ended = true;
            break;
        }
        b64.push_str(l);
    }
    if !ended {
        return Err(format!("the PEM block has no `{end}` line"));
    }
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("the PEM body is not base64: {e}"))?;
    Ok((label, der))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_answers_name_their_bad_fields() {
        let t =
            token_answer(br#"{"access_token":"ya29.x","expires_in":3599,"token_type":"Bearer"}"#)
                .unwrap();
        assert_eq!(t.value, "ya29.x");
        assert!(t.fresh());
        let t = token_answer(br#"{"access_token":"x","expires_in":"3599"}"#).unwrap();
        assert_eq!(t.value, "x");
        for (body, want) in [
            (&br#"{"expires_in":10}"#[..], "access_token: missing"),
            (br#"{"access_token":5}"#, "access_token: expected a string"),
            (br#"{"access_token":"x","expires_in":"soon"}"#, "expires_in"),
            (b"nope", "not a token"),
        ] {
            let e = token_answer(body).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn keys_that_are_not_rsa_pem_are_refused() {
        for (pem, want) in [
            ("hello", "not a PEM block"),
            (
                "-----BEGIN PRIVATE KEY-----\nAAAA\n",
                "no `-----END PRIVATE KEY-----`",
            ),
            (
                "-----BEGIN PRIVATE KEY-----\n!!\n-----END PRIVATE KEY-----\n",
                "not base64",
            ),
            (
                "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
                "not a usable RSA key",
            ),
            (
                "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n",
                "not an RSA",
            ),
        ] {
            let e = assertion("a@b", None, pem, "https://t", 0).unwrap_err();
            assert!(e.contains(want), "{pem}: {e}");
        }
    }
}
