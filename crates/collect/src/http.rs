//! HTTP for collectors: one GET with a timeout and a size cap, and errors that say what to do.

use std::error::Error as _;

use crate::CollectError;

/// Send `req` and read its body, refusing answers over `max_bytes`. `what` names the request in
/// errors (a URL, a query).
pub(crate) async fn get_bytes(
    req: reqwest::RequestBuilder,
    what: &str,
    max_bytes: usize,
) -> Result<Vec<u8>, CollectError> {
    let mut resp = req.send().await.map_err(|e| send_error(what, e))?;
    let read_failed = |e: reqwest::Error| {
        CollectError::Transient(format!(
            "{what}: reading the answer failed: {}",
            causes(&e.without_url())
        ))
    };
    let status = resp.status();
    if !status.is_success() {
        // What the answer says goes to the log, never into the error: the error is shown to
        // every viewer as the source's last error, and the URL may answer anything.
        let first = resp.chunk().await.map_err(read_failed)?.unwrap_or_default();
        let snippet: String = String::from_utf8_lossy(&first).chars().take(300).collect();
        tracing::warn!(request = %what, %status, answer = ?snippet.trim(), "non-success answer");
        let msg = format!("{what}: answered HTTP {status}");
        return Err(if status.is_client_error() && status.as_u16() != 429 {
            CollectError::Config(format!("{msg}; check the URL, the query and any token"))
        } else {
            CollectError::Transient(msg)
        });
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(read_failed)? {
        if body.len() + chunk.len() > max_bytes {
            return Err(CollectError::Data(format!(
                "{what}: the answer is over {max_bytes} bytes; narrow what it returns"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn send_error(what: &str, e: reqwest::Error) -> CollectError {
    // `what` already names the URL.
    let e = e.without_url();
    if e.is_timeout() {
        CollectError::Transient(format!(
            "{what}: timed out; check that it answers, or raise `timeout_secs`"
        ))
    } else if e.is_builder() {
        CollectError::Config(format!("{what}: cannot build the request: {}", causes(&e)))
    } else {
        CollectError::Transient(format!(
            "{what}: {}; check that it runs and that gpuledger can reach it",
            causes(&e)
        ))
    }
}

/// An error and its causes on one line: reqwest's own text hides the useful part
/// ("Connection refused") in its source chain.
fn causes(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Whether `url` names a link-local address literally (169.254.0.0/16, fe80::/10): where
/// clouds serve instance metadata and credentials, never a GPU exporter.
pub(crate) fn is_link_local(url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or("");
    match host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
    {
        Ok(std::net::IpAddr::V4(ip)) => ip.is_link_local(),
        Ok(std::net::IpAddr::V6(ip)) => (ip.segments()[0] & 0xffc0) == 0xfe80,
        Err(_) => false,
    }
}

/// Redirects a collector follows: up to 5, and only to the same scheme, host and port as the
/// URL it was configured with, so an endpoint cannot send the server to another host (a cloud
/// metadata address, an internal service) and have it report what that answered.
pub(crate) fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let first = attempt.previous().first().cloned();
        let to = attempt.url();
        let same = first.as_ref().is_some_and(|f| {
            f.scheme() == to.scheme()
                && f.host_str() == to.host_str()
                && f.port_or_known_default() == to.port_or_known_default()
        });
        if attempt.previous().len() > 5 {
            attempt.error("more than 5 redirects")
        } else if !same || is_link_local(to) {
            let msg = format!(
                "redirected to another host ({}); collectors follow redirects only on the host \
                 they were configured with",
                to.host_str().unwrap_or("?")
            );
            attempt.error(msg)
        } else {
            attempt.follow()
        }
    })
}
