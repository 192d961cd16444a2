//! `collector_hosts`: the hosts pull collectors may read, when the administrator lists them.
//!
//! Collector configuration is trusted (whoever edits the server's config chooses what it
//! reads); the list is a second check for a shared config file or a reviewed change: a
//! collector whose URL or kubeconfig names a host outside it is refused when the config is
//! read, with the host named. Link-local addresses are refused whatever the list says.

use std::net::IpAddr;

use crate::collectors::kubernetes::Access;
use crate::{CollectError, Entry, Settings};

/// One allowed host: a name (`prometheus.monitoring.svc`), every name under a domain
/// (`*.example.com`, not `example.com` itself), an address, or a CIDR range (`10.0.0.0/8`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Name(String),
    Suffix(String),
    Net(IpAddr, u8),
}

/// The hosts collectors may read; empty: any (but link-local addresses).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostAllowList {
    patterns: Vec<Pattern>,
}

impl HostAllowList {
    /// Read the list as written in the config; the error names the first entry that is
    /// none of the four forms.
    pub fn parse(list: &[String]) -> Result<HostAllowList, String> {
        let mut patterns = Vec::with_capacity(list.len());
        for raw in list {
            let s = raw.trim().to_ascii_lowercase();
            let bad = || {
                format!(
                    "`{}` is not a host name, `*.domain`, an IP address or a CIDR range like \
                     10.0.0.0/8",
                    raw.chars().take(100).collect::<String>()
                )
            };
            let p = if let Some(domain) = s.strip_prefix("*.") {
                if !is_name(domain) {
                    return Err(bad());
                }
                Pattern::Suffix(format!(".{domain}"))
            } else if let Some((addr, bits)) = s.split_once('/') {
                let addr: IpAddr = addr.parse().map_err(|_| bad())?;
                let bits: u8 = bits.parse().map_err(|_| bad())?;
                let max = if addr.is_ipv4() { 32 } else { 128 };
                if bits > max {
                    return Err(bad());
                }
                Pattern::Net(addr, bits)
            } else if let Ok(addr) = s.trim_matches(['[', ']']).parse::<IpAddr>() {
                Pattern::Net(addr, if addr.is_ipv4() { 32 } else { 128 })
            } else if is_name(&s) {
                Pattern::Name(s)
            } else {
                return Err(bad());
            };
            patterns.push(p);
        }
        Ok(HostAllowList { patterns })
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether `host` (a name or an address, as a URL carries it) is allowed.
    pub fn allows(&self, host: &str) -> bool {
        if self.patterns.is_empty() {
            return true;
        }
        let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
        let addr = host.parse::<IpAddr>().ok();
        self.patterns.iter().any(|p| match (p, addr) {
            (Pattern::Name(n), None) => *n == host,
            (Pattern::Suffix(s), None) => host.ends_with(s.as_str()),
            (Pattern::Net(net, bits), Some(a)) => in_net(a, *net, *bits),
            _ => false,
        })
    }

    /// Refuse `entry` (after `kubeconfig_dir` is expanded) when it reads a host outside the
    /// list.
    pub fn check(&self, entry: &Entry) -> Result<(), CollectError> {
        if self.is_empty() {
            return Ok(());
        }
        for host in hosts(entry)? {
            if !self.allows(&host) {
                return Err(CollectError::Config(format!(
                    "it reads host `{host}`, which `collector_hosts` does not list; add it \
                     there, or point the collector at a listed host"
                )));
            }
        }
        Ok(())
    }
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

fn in_net(a: IpAddr, net: IpAddr, bits: u8) -> bool {
    let (a, net, width) = match (a, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => (u32::from(a) as u128, u32::from(n) as u128, 32),
        (IpAddr::V6(a), IpAddr::V6(n)) => (u128::from(a), u128::from(n), 128),
        _ => return false,
    };
    if bits == 0 {
        return true;
    }
    let shift = width - bits as u32;
    (a >> shift) == (net >> shift)
}

/// The hosts `entry` reads: a `dcgm` entry's endpoints or Prometheus, a `kubernetes` entry's
/// API server (from its kubeconfig; in the cluster, `KUBERNETES_SERVICE_HOST`); a `billing`
/// entry reads files and no host.
fn hosts(entry: &Entry) -> Result<Vec<String>, CollectError> {
    let host_of = |url: &str| -> Result<String, CollectError> {
        reqwest::Url::parse(url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string))
            .ok_or_else(|| CollectError::Config(format!("`{url}` names no host")))
    };
    match &entry.settings {
        Settings::Billing(_) => Ok(Vec::new()),
        Settings::Aws(c) => c.hosts(),
        Settings::Azure(c) => c.hosts(),
        Settings::Gcp(c) => c.hosts(),
        Settings::Slurm(c) => c.hosts(),
        Settings::Spreadsheet(c) => c.hosts(),
        Settings::Dcgm(c) => match &c.mode {
            crate::collectors::dcgm::Mode::Scrape { endpoints } => {
                endpoints.iter().map(|u| host_of(u)).collect()
            }
            crate::collectors::dcgm::Mode::Query { prometheus_url, .. } => {
                Ok(vec![host_of(prometheus_url)?])
            }
        },
        Settings::Kubernetes(k) => {
            let from_file = |kc: kube::config::Kubeconfig, context: &Option<String>| {
                let name = context.clone().or(kc.current_context.clone());
                let cluster = kc
                    .contexts
                    .iter()
                    .find(|c| Some(&c.name) == name.as_ref())
                    .and_then(|c| c.context.as_ref())
                    .map(|c| c.cluster.clone());
                kc.clusters
                    .iter()
                    .find(|c| Some(&c.name) == cluster.as_ref())
                    .and_then(|c| c.cluster.as_ref())
                    .and_then(|c| c.server.clone())
                    .ok_or_else(|| {
                        CollectError::Config(
                            "its kubeconfig names no API server for its context".into(),
                        )
                    })
            };
            let in_cluster = || {
                std::env::var("KUBERNETES_SERVICE_HOST")
                    .unwrap_or_else(|_| "kubernetes.default.svc".into())
            };
            match &k.access {
                Access::Kubeconfig { path, context } => {
                    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                        CollectError::Config(format!("kubeconfig {}: {e}", path.display()))
                    })?;
                    Ok(vec![host_of(&from_file(kc, context)?)?])
                }
                Access::InCluster => Ok(vec![in_cluster()]),
                Access::Infer { context } => match kube::config::Kubeconfig::read() {
                    Ok(kc) => Ok(vec![host_of(&from_file(kc, context)?)?]),
                    Err(_) => Ok(vec![in_cluster()]),
                },
                // Checked per file, once the folder is read.
                Access::KubeconfigDir { .. } => Ok(Vec::new()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> HostAllowList {
        HostAllowList::parse(&items.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn names_domains_addresses_and_ranges() {
        let l = list(&[
            "prometheus.monitoring.svc",
            "*.k8s.example.com",
            "10.20.0.0/16",
            "192.0.2.7",
            "fd00::/8",
        ]);
        for ok in [
            "prometheus.monitoring.svc",
            "PROMETHEUS.monitoring.svc",
            "api.rdu.k8s.example.com",
            "10.20.3.4",
            "192.0.2.7",
            "[fd00::1]",
        ] {
            assert!(l.allows(ok), "{ok}");
        }
        for no in [
            "prometheus.monitoring.svc.evil.com",
            "k8s.example.com",
            "evilk8s.example.com",
            "10.21.0.1",
            "192.0.2.8",
            "169.254.169.254",
            "fe80::1",
        ] {
            assert!(!l.allows(no), "{no}");
        }
        assert!(HostAllowList::default().allows("anything"));
        for bad in ["", "http://x", "10.0.0.0/33", "*.", "a b", "1.2.3.4/x"] {
            let e = HostAllowList::parse(&[bad.to_string()]).unwrap_err();
            assert!(e.contains("not a host name"), "{bad}: {e}");
        }
    }

    #[test]
    fn an_entry_outside_the_list_is_refused_with_its_host() {
        let entry = |toml: &str| {
            let doc: toml_edit::DocumentMut = toml.parse().unwrap();
            Entry::parse(doc.as_table()).unwrap()
        };
        let l = list(&["prom.internal", "10.0.0.0/8"]);
        let dcgm = |url: &str| {
            entry(&format!(
                "type = \"dcgm\"\nname = \"d\"\nendpoints = [\"{url}\"]"
            ))
        };
        assert!(l.check(&dcgm("http://prom.internal:9400/metrics")).is_ok());
        assert!(l.check(&dcgm("http://10.1.2.3:9400/metrics")).is_ok());
        let e = l
            .check(&dcgm("http://metrics.other.net:9400/metrics"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`metrics.other.net`") && e.contains("collector_hosts"),
            "{e}"
        );
        let q = entry("type = \"dcgm\"\nname = \"q\"\nprometheus_url = \"https://prom.internal\"");
        assert!(l.check(&q).is_ok());

        // A kubeconfig's API server.
        let dir = std::env::temp_dir().join(format!("gpuledger-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kc = dir.join("c.kubeconfig");
        std::fs::write(
            &kc,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster:\n    server: https://api.other.net:6443\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    token: t\n",
        )
        .unwrap();
        let k = entry(&format!(
            "type = \"kubernetes\"\nname = \"k\"\nkubeconfig = \"{}\"",
            kc.display()
        ));
        let e = l.check(&k).unwrap_err().to_string();
        assert!(e.contains("`api.other.net`"), "{e}");
        assert!(list(&["*.other.net"]).check(&k).is_ok());
        // Billing reads files only.
        let b = entry(&format!(
            "type = \"billing\"\nname = \"b\"\ndir = \"{}\"",
            dir.display()
        ));
        assert!(l.check(&b).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
