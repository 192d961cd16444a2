//! The cloud instance the agent runs on, from the cloud's instance metadata service: its
//! instance ID (which the server merges hosts by, so that the same machine listed by a cloud
//! collector, seen as a Kubernetes node and running the agent is one host), account, region,
//! zone and instance type.
//!
//! Asked once, at start, with short timeouts: AWS (IMDSv2, a session token first), then GCP
//! (`Metadata-Flavor: Google`), then Azure (`Metadata: true`), all at the link-local address
//! every one of them uses. A machine outside a cloud answers none, and the agent goes on
//! without. `cloud_metadata = false` turns it off.

use std::time::Duration;

use gpuledger_model::Cloud;

/// Where the metadata services answer (all three clouds use this address).
pub const DEFAULT_URL: &str = "http://169.254.169.254";

/// What the metadata service said about the instance.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Instance {
    pub cloud: Option<Cloud>,
    /// AWS `i-…`, the GCE instance name, the Azure VM name: what a Kubernetes node's
    /// `spec.providerID` ends with.
    pub instance_id: String,
    pub account: Option<String>,
    pub region: Option<String>,
    pub zone: Option<String>,
    pub instance_type: Option<String>,
}

/// Ask the metadata services at `base` in turn; `None` when none answers.
pub fn discover(base: &str, timeout: Duration) -> Option<Instance> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into();
    let base = base.trim_end_matches('/');
    // Asked at once, so a machine outside a cloud waits one timeout, not three.
    let (a, g, z) = std::thread::scope(|s| {
        let a = s.spawn(|| aws(&agent, base));
        let g = s.spawn(|| gcp(&agent, base));
        let z = s.spawn(|| azure(&agent, base));
        let join = |h: std::thread::ScopedJoinHandle<'_, Option<Instance>>| h.join().ok().flatten();
        (join(a), join(g), join(z))
    });
    a.or(g).or(z)
}

fn text(resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Option<String> {
    let mut resp = resp.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let body = resp
        .body_mut()
        .with_config()
        .limit(1 << 20)
        .read_to_string()
        .ok()?;
    let body = body.trim().to_string();
    (!body.is_empty()).then_some(body)
}

fn aws(agent: &ureq::Agent, base: &str) -> Option<Instance> {
    let token = text(
        agent
            .put(format!("{base}/latest/api/token"))
            .header("x-aws-ec2-metadata-token-ttl-seconds", "60")
            .send_empty(),
    )?;
    let get = |path: &str| {
        text(
            agent
                .get(format!("{base}/latest/meta-data/{path}"))
                .header("x-aws-ec2-metadata-token", &token)
                .call(),
        )
    };
    let doc: serde_json::Value = serde_json::from_str(&text(
        agent
            .get(format!("{base}/latest/dynamic/instance-identity/document"))
            .header("x-aws-ec2-metadata-token", &token)
            .call(),
    )?)
    .ok()?;
    let field = |k: &str| doc.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let instance_id = field("instanceId").or_else(|| get("instance-id"))?;
    Some(Instance {
        cloud: Some(Cloud::Aws),
        instance_id,
        account: field("accountId"),
        region: field("region"),
        zone: field("availabilityZone"),
        instance_type: field("instanceType"),
    })
}

/// The last path segment of a GCP metadata value (`projects/123/zones/us-central1-a`).
fn last_segment(v: &str) -> String {
    v.rsplit('/').next().unwrap_or(v).to_string()
}

fn gcp(agent: &ureq::Agent, base: &str) -> Option<Instance> {
    let get = |path: &str| {
        text(
            agent
                .get(format!("{base}/computeMetadata/v1/{path}"))
                .header("Metadata-Flavor", "Google")
                .call(),
        )
    };
    let name = get("instance/name")?;
    let zone = get("instance/zone").map(|z| last_segment(&z));
    Some(Instance {
        cloud: Some(Cloud::Gcp),
        instance_id: name,
        account: get("project/project-id"),
        region: zone
            .as_deref()
            .and_then(|z| z.rsplit_once('-'))
            .map(|(r, _)| r.to_string()),
        zone,
        instance_type: get("instance/machine-type").map(|m| last_segment(&m)),
    })
}

fn azure(agent: &ureq::Agent, base: &str) -> Option<Instance> {
    let body = text(
        agent
            .get(format!(
                "{base}/metadata/instance/compute?api-version=2021-02-01"
            ))
            .header("Metadata", "true")
            .call(),
    )?;
    let doc: serde_json::Value = serde_json::from_str(&body).ok()?;
    let field = |k: &str| {
        doc.get(k)
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .filter(|s| !s.is_empty())
    };
    Some(Instance {
        cloud: Some(Cloud::Azure),
        instance_id: field("name")?,
        account: field("subscriptionId"),
        region: field("location"),
        zone: field("zone"),
        instance_type: field("vmSize"),
    })
}

impl Instance {
    /// Fill what the configuration did not say: the instance ID goes into the labels (unless
    /// one is configured), cloud, account, region and instance type where unset.
    pub fn fill(&self, host: &mut crate::report::HostInfo) {
        host.labels
            .entry("instance_id".into())
            .or_insert_with(|| self.instance_id.clone());
        if let Some(z) = &self.zone {
            host.labels
                .entry("zone".into())
                .or_insert_with(|| z.clone());
        }
        host.cloud = host.cloud.or(self.cloud);
        host.account = host.account.clone().or(self.account.clone());
        host.region = host.region.clone().or(self.region.clone());
        host.instance_type = host.instance_type.clone().or(self.instance_type.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};

    /// A metadata service answering `routes` (method, path, required header, body), each
    /// documented shape of one cloud; anything else is a 404, as the services answer.
    fn serve(routes: Vec<(&'static str, &'static str, &'static str, &'static str)>) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let mut headers = String::new();
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap() == 0 || h == "\r\n" {
                        break;
                    }
                    headers.push_str(&h.to_ascii_lowercase());
                }
                let mut parts = line.split_whitespace();
                let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                let found = routes.iter().find(|(m, p, h, _)| {
                    *m == method && *p == path && headers.contains(&h.to_ascii_lowercase())
                });
                let (status, body) = match found {
                    Some((_, _, _, b)) => ("200 OK", *b),
                    None => ("404 Not Found", ""),
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        url
    }

    #[test]
    fn aws_instance_identity() {
        let url = serve(vec![
            (
                "PUT",
                "/latest/api/token",
                "x-aws-ec2-metadata-token-ttl-seconds: 60",
                "tok",
            ),
            (
                "GET",
                "/latest/dynamic/instance-identity/document",
                "x-aws-ec2-metadata-token: tok",
                r#"{"accountId":"111122223333","availabilityZone":"us-east-1a","instanceId":"i-0abc","instanceType":"p5.48xlarge","region":"us-east-1"}"#,
            ),
        ]);
        let i = discover(&url, Duration::from_secs(2)).unwrap();
        assert_eq!(
            i,
            Instance {
                cloud: Some(Cloud::Aws),
                instance_id: "i-0abc".into(),
                account: Some("111122223333".into()),
                region: Some("us-east-1".into()),
                zone: Some("us-east-1a".into()),
                instance_type: Some("p5.48xlarge".into()),
            }
        );
        let mut host = crate::report::HostInfo::default();
        host.labels
            .insert("instance_id".into(), "configured".into());
        i.fill(&mut host);
        assert_eq!(
            host.labels["instance_id"], "configured",
            "the configuration wins"
        );
        assert_eq!(host.account.as_deref(), Some("111122223333"));
    }

    #[test]
    fn gcp_and_azure_instances() {
        let url = serve(vec![
            (
                "GET",
                "/computeMetadata/v1/instance/name",
                "metadata-flavor: google",
                "gke-a3-pool-1",
            ),
            (
                "GET",
                "/computeMetadata/v1/instance/zone",
                "metadata-flavor: google",
                "projects/123456/zones/us-central1-a",
            ),
            (
                "GET",
                "/computeMetadata/v1/project/project-id",
                "metadata-flavor: google",
                "ml-prod",
            ),
            (
                "GET",
                "/computeMetadata/v1/instance/machine-type",
                "metadata-flavor: google",
                "projects/123456/machineTypes/a3-highgpu-8g",
            ),
        ]);
        let i = discover(&url, Duration::from_secs(2)).unwrap();
        assert_eq!(i.cloud, Some(Cloud::Gcp));
        assert_eq!(i.instance_id, "gke-a3-pool-1");
        assert_eq!(i.region.as_deref(), Some("us-central1"));
        assert_eq!(i.instance_type.as_deref(), Some("a3-highgpu-8g"));
        assert_eq!(i.account.as_deref(), Some("ml-prod"));

        let url = serve(vec![(
            "GET",
            "/metadata/instance/compute?api-version=2021-02-01",
            "metadata: true",
            r#"{"location":"eastus","name":"nd-h100-0","subscriptionId":"00000000-1111-2222-3333-444444444444","vmSize":"Standard_ND96isr_H100_v5","zone":"1"}"#,
        )]);
        let i = discover(&url, Duration::from_secs(2)).unwrap();
        assert_eq!(i.cloud, Some(Cloud::Azure));
        assert_eq!(i.instance_id, "nd-h100-0");
        assert_eq!(i.instance_type.as_deref(), Some("Standard_ND96isr_H100_v5"));

        // Nothing answers: no instance, and no wait beyond the timeout.
        let started = std::time::Instant::now();
        assert_eq!(discover(&serve(vec![]), Duration::from_secs(2)), None);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
