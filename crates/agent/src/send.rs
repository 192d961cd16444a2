//! Sending bodies to `POST /api/v1/ingest` and deciding what an answer means: delivered,
//! refused for good (400, 413, 415, 422 when no record could be kept, a 403 naming records —
//! never retried, the server's reasons are logged), or worth retrying later (network errors,
//! 5xx, 429 with its `Retry-After`, 401).
//!
//! Retries wait with exponential backoff and jitter ([`Backoff`]) so that a fleet coming back
//! from an outage does not arrive all at once.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;

/// Bodies larger than this are gzip-compressed on the wire.
const GZIP_ABOVE_BYTES: usize = 4 * 1024;
/// The server's answer is small; anything larger is not read.
const MAX_REPLY_BYTES: u64 = 1024 * 1024;

/// Per-list counts in the server's answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Counts {
    #[serde(default)]
    pub gpus: u64,
    #[serde(default)]
    pub samples: u64,
    #[serde(default)]
    pub allocations: u64,
}

/// One record the server refused, with its JSON path and reason.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Rejected {
    pub path: String,
    pub reason: String,
}

impl Rejected {
    /// The server refused a sample or allocation because it has never seen its GPU (its
    /// database was reset, or the body with the inventory was dropped from a full buffer).
    pub fn is_unknown_gpu(&self) -> bool {
        self.path.ends_with(".gpu_uuid") && self.reason.contains("has been reported")
    }

    /// The list and index of the record: `samples[3].ts` → `("samples", 3)`.
    pub fn record(&self) -> Option<(&str, usize)> {
        let (list, rest) = self.path.split_once('[')?;
        let (idx, _) = rest.split_once(']')?;
        Some((list, idx.parse().ok()?))
    }
}

/// The server's JSON answer to an ingest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Reply {
    #[serde(default)]
    pub accepted: Counts,
    #[serde(default)]
    pub duplicates: Counts,
    #[serde(default)]
    pub rejected: Vec<Rejected>,
    #[serde(default)]
    pub error: Option<String>,
}

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// 200: stored (possibly with some records refused, listed in the reply).
    Delivered(Reply),
    /// Refused for good; sending it again would be refused again.
    Refused {
        status: u16,
        /// 413: the body may be accepted when split.
        too_large: bool,
        reply: Reply,
        message: String,
    },
    /// Try again later, not before `after` when the server said so.
    Retry {
        reason: String,
        after: Option<Duration>,
    },
}

/// `Retry-After` as seconds or an HTTP date, relative to `now`.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs.min(24 * 3600)));
    }
    let at = DateTime::parse_from_rfc2822(v).ok()?.with_timezone(&Utc);
    let secs = (at - now).num_seconds().clamp(0, 24 * 3600);
    Some(Duration::from_secs(secs as u64))
}

/// Decide what a status and reply body mean.
pub fn classify(status: u16, body: &str, retry_after: Option<Duration>) -> Outcome {
    let reply: Reply = serde_json::from_str(body).unwrap_or_default();
    let message = reply
        .error
        .clone()
        .unwrap_or_else(|| body.chars().take(300).collect());
    match status {
        200..=299 => Outcome::Delivered(reply),
        400 | 413 | 415 | 422 => Outcome::Refused {
            status,
            too_large: status == 413,
            reply,
            message,
        },
        // A 403 naming records: the token may not write them, now or later.
        403 if !reply.rejected.is_empty() => Outcome::Refused {
            status,
            too_large: false,
            reply,
            message,
        },
        401 | 403 => Outcome::Retry {
            reason: format!(
                "the server refused the token ({status}: {message}); check --token, the data stays buffered"
            ),
            after: retry_after.or(Some(Duration::from_secs(60))),
        },
        429 | 503 => Outcome::Retry {
            reason: format!("server busy ({status}: {message})"),
            after: retry_after,
        },
        _ => Outcome::Retry {
            reason: format!("server answered {status}: {message}"),
            after: retry_after,
        },
    }
}

/// Exponential backoff with jitter: the n-th wait is drawn from [d/2, d] with
/// d = min(max, base × 2^n).
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Backoff {
        Backoff {
            base,
            max,
            attempt: 0,
        }
    }

    /// The wait before the next attempt; `server_says` (a `Retry-After`) is a floor.
    /// `unit` in [0, 1) is the random draw, passed in so tests can fix it.
    pub fn next(&mut self, server_says: Option<Duration>, unit: f64) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let jittered = exp.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0));
        match server_says {
            // Never earlier than asked; a little later so that everyone told the same second
            // does not come back in the same second.
            Some(floor) => floor + floor.mul_f64(0.1 * unit).min(Duration::from_secs(30)),
            None => jittered,
        }
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    pub fn attempts(&self) -> u32 {
        self.attempt
    }
}

/// The HTTP side: where to send and with which token.
pub struct Sender {
    url: String,
    auth: String,
    agent: ureq::Agent,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// The ingest URL for a server base URL (`https://gpuledger.example` or with the path already).
pub fn ingest_url(server: &str) -> String {
    let s = server.trim().trim_end_matches('/');
    if s.ends_with("/api/v1/ingest") {
        s.to_string()
    } else {
        format!("{s}/api/v1/ingest")
    }
}

impl Sender {
    /// A sender for `server` with `token`; `ca_file` adds a PEM bundle of trusted roots (for a
    /// server behind an internal CA) instead of the built-in Mozilla roots.
    pub fn new(server: &str, token: &str, ca_file: Option<&Path>) -> anyhow::Result<Sender> {
        let url = ingest_url(server);
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            anyhow::bail!("--server must start with http:// or https://, got `{server}`");
        }
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(path) = ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("cannot read --ca-file {}: {e}", path.display()))?;
            let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                anyhow::bail!(
                    "--ca-file {} holds no PEM certificate; give the CA bundle of the server",
                    path.display()
                );
            }
            tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&certs));
        }
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_global(Some(Duration::from_secs(60)))
            .user_agent(format!("gpuledger-agent/{}", env!("CARGO_PKG_VERSION")))
            .max_idle_connections(1)
            .max_idle_connections_per_host(1)
            .tls_config(tls.build())
            .build();
        Ok(Sender {
            url,
            auth: format!("Bearer {}", token.trim()),
            agent: config.into(),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// POST one JSON body and classify the answer.
    pub fn send(&self, json: &[u8]) -> Outcome {
        let mut req = self
            .agent
            .post(&self.url)
            .header("Authorization", &self.auth)
            .header("Content-Type", "application/json");
        let compressed;
        let payload: &[u8] = if json.len() > GZIP_ABOVE_BYTES {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            match enc.write_all(json).and_then(|()| enc.finish()) {
                Ok(z) => {
                    compressed = z;
                    req = req.header("Content-Encoding", "gzip");
                    &compressed
                }
                Err(_) => json,
            }
        } else {
            json
        };
        let mut resp = match req.send(payload) {
            Ok(r) => r,
            Err(e) => {
                return Outcome::Retry {
                    reason: format!("could not reach {}: {e}", self.url),
                    after: None,
                }
            }
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, Utc::now()));
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_REPLY_BYTES)
            .read_to_string()
            .unwrap_or_default();
        classify(status, &body, retry_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_deliver_refuse_or_retry() {
        let ok = r#"{"accepted":{"gpus":1,"samples":2,"allocations":0},"duplicates":{"gpus":0,"samples":0,"allocations":0},"rejected":[{"path":"samples[1].util_pct","reason":"must be within 0..=100, got 250"}]}"#;
        match classify(200, ok, None) {
            Outcome::Delivered(r) => {
                assert_eq!(r.accepted.samples, 2);
                assert_eq!(r.rejected[0].record(), Some(("samples", 1)));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            classify(400, r#"{"error":"body is not valid JSON"}"#, None),
            Outcome::Refused {
                status: 400,
                too_large: false,
                ..
            }
        ));
        assert!(matches!(
            classify(
                422,
                r#"{"error":"no record in the body could be kept","rejected":[{"path":"samples[0].ts","reason":"is in the future"}]}"#,
                None
            ),
            Outcome::Refused { status: 422, reply, .. } if reply.rejected.len() == 1
        ));
        assert!(matches!(
            classify(413, "{}", None),
            Outcome::Refused {
                too_large: true,
                ..
            }
        ));
        assert!(matches!(
            classify(
                403,
                r#"{"error":"x","rejected":[{"path":"samples[0]","reason":"owned by team"}]}"#,
                None
            ),
            Outcome::Refused { status: 403, .. }
        ));
        assert!(matches!(
            classify(403, r#"{"error":"a viewer token cannot write"}"#, None),
            Outcome::Retry { .. }
        ));
        assert_eq!(
            classify(429, "", Some(Duration::from_secs(7))),
            Outcome::Retry {
                reason: "server busy (429: )".into(),
                after: Some(Duration::from_secs(7))
            }
        );
        assert!(matches!(classify(503, "{}", None), Outcome::Retry { .. }));
        assert!(matches!(
            classify(502, "<html>", None),
            Outcome::Retry { .. }
        ));
    }

    #[test]
    fn unknown_gpu_rejections_are_recognised() {
        let r = Rejected {
            path: "samples[3].gpu_uuid".into(),
            reason: "no GPU GPU-1 has been reported; send it in `gpus` first".into(),
        };
        assert!(r.is_unknown_gpu());
        assert_eq!(r.record(), Some(("samples", 3)));
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let now: DateTime<Utc> = "2026-12-02T10:00:00Z".parse().unwrap();
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Wed, 02 Dec 2026 10:00:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn backoff_grows_is_capped_jittered_and_honours_the_server() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        assert_eq!(b.next(None, 0.999_999).as_secs(), 0); // 1 s × [0.5, 1)
        assert_eq!(b.next(None, 0.0), Duration::from_secs(1)); // 2 s × 0.5
        assert_eq!(b.next(None, 0.0), Duration::from_secs(2));
        for _ in 0..20 {
            b.next(None, 0.5);
        }
        assert!(b.next(None, 1.0) <= Duration::from_secs(300));
        assert_eq!(
            b.next(Some(Duration::from_secs(30)), 0.0),
            Duration::from_secs(30)
        );
        assert!(b.next(Some(Duration::from_secs(30)), 0.9) >= Duration::from_secs(30));
        b.reset();
        assert_eq!(b.attempts(), 0);
        assert_eq!(ingest_url("http://h:8080/"), "http://h:8080/api/v1/ingest");
        assert_eq!(
            ingest_url("http://h/api/v1/ingest"),
            "http://h/api/v1/ingest"
        );
    }
}
