//! The `kubernetes` collector: GPU nodes (counts, models, MIG, time-slicing, where they run)
//! and the pods that hold GPUs ("who used which GPU when"), read from one cluster's API server
//! with a read-only ServiceAccount or kubeconfig.
//!
//! It lists nodes, pods and namespaces once, then keeps them current with watches (kube-rs
//! reflectors: relist on 410 Gone, back off on errors); each run reads the cached objects and
//! sends no request. Read-only: get, list and watch, nothing else. Mapping lives in [`parse`].
//!
//! ```toml
//! [[collectors]]
//! type = "kubernetes"
//! name = "rdu-ocp-1"
//! # cluster = "rdu-ocp-1"                       # defaults to the name
//! kubeconfig = "/etc/gpuledger/rdu.kubeconfig" # or in_cluster = true; neither: $KUBECONFIG,
//! # context = "rdu-admin"                      # ~/.kube/config, then in-cluster
//! # team_keys = ["team"]                       # pod label/annotation, then namespace's
//! # user_keys = ["gpuledger.io/user", "user", "owner"]
//! # sync_timeout_secs = 30
//! # watch_timeout_secs = 290
//! ```

pub mod parse;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use gpuledger_model::{
    placeholder_uuid, AllocationKind, HostGpus, Observation, Provenance, PushAllocation,
};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Deserialize;
use tokio::sync::OnceCell;
use tokio::task::JoinHandle;

use crate::{
    in_range, now_secs, CollectError, CollectFuture, CollectReport, Collector, PartProblem,
    ReportFuture,
};
use parse::PodGpus;

/// The kind string: config `type`, module name, test module.
pub const KIND: &str = "kubernetes";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    cluster: Option<String>,
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
    #[serde(default)]
    in_cluster: bool,
    team_keys: Option<Vec<String>>,
    user_keys: Option<Vec<String>>,
    sync_timeout_secs: Option<u64>,
    watch_timeout_secs: Option<u64>,
}

/// How the collector reaches the API server.
#[derive(Debug, Clone, PartialEq)]
pub enum Access {
    /// A kubeconfig file, optionally a context other than its current one.
    Kubeconfig {
        path: PathBuf,
        context: Option<String>,
    },
    /// The pod's ServiceAccount (running inside the cluster).
    InCluster,
    /// `$KUBECONFIG` or `~/.kube/config`, else in-cluster, as kubectl does.
    Infer { context: Option<String> },
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct KubernetesConfig {
    /// The cluster name GPUs carry (`cluster` filter).
    pub cluster: String,
    pub access: Access,
    /// Keys naming the team that uses a pod's GPUs: pod labels, pod annotations, then the
    /// namespace's labels and annotations.
    pub team_keys: Vec<String>,
    /// Keys naming the user, looked up the same way.
    pub user_keys: Vec<String>,
    /// How long a first run waits for the initial lists.
    pub sync_timeout_secs: u64,
    /// How long the API server keeps each watch open before the client renews it.
    pub watch_timeout_secs: u32,
}

impl KubernetesConfig {
    /// Read and check a `[[collectors]]` entry's TOML text; `name` is the entry's name.
    pub fn from_toml(name: &str, text: &str) -> Result<KubernetesConfig, CollectError> {
        KubernetesConfig::from_settings(name, &crate::own_settings(text)?)
    }

    /// Read and check an entry's own settings (the entry without [`crate::COMMON_KEYS`]);
    /// `name` is the entry's name, the default cluster name.
    pub fn from_settings(
        name: &str,
        own: &toml_edit::Table,
    ) -> Result<KubernetesConfig, CollectError> {
        let raw: FileConfig = crate::read_settings(own)?;
        let access = match (raw.kubeconfig, raw.in_cluster) {
            (Some(_), true) => {
                return Err(CollectError::Config(
                    "set either `kubeconfig` (a file) or `in_cluster = true` (the pod's \
                     ServiceAccount), not both"
                        .into(),
                ))
            }
            (Some(path), false) => Access::Kubeconfig {
                path,
                context: raw.context,
            },
            (None, true) => {
                if raw.context.is_some() {
                    return Err(CollectError::Config(
                        "`context` picks a kubeconfig context; in_cluster has none".into(),
                    ));
                }
                Access::InCluster
            }
            (None, false) => Access::Infer {
                context: raw.context,
            },
        };
        let keys = |field: &str, v: Option<Vec<String>>, default: &[&str]| {
            let v = v.unwrap_or_else(|| default.iter().map(|s| s.to_string()).collect());
            match v.iter().position(|k| k.trim().is_empty()) {
                Some(i) => Err(CollectError::Config(format!(
                    "{field}[{i}]: must not be empty"
                ))),
                None => Ok(v),
            }
        };
        let cluster = raw.cluster.unwrap_or_else(|| name.to_string());
        if cluster.trim().is_empty() {
            return Err(CollectError::Config("cluster: must not be empty".into()));
        }
        Ok(KubernetesConfig {
            cluster,
            access,
            team_keys: keys("team_keys", raw.team_keys, &["team"])?,
            user_keys: keys(
                "user_keys",
                raw.user_keys,
                &["gpuledger.io/user", "user", "owner"],
            )?,
            sync_timeout_secs: in_range("sync_timeout_secs", raw.sync_timeout_secs, 30, 1, 600)?,
            watch_timeout_secs: in_range(
                "watch_timeout_secs",
                raw.watch_timeout_secs,
                290,
                1,
                3600,
            )? as u32,
        })
    }
}

/// The last error each watch met, and pods' deletion times as the watch saw them.
#[derive(Debug, Default)]
struct Health {
    errors: BTreeMap<&'static str, (DateTime<Utc>, String)>,
    deleted: HashMap<String, DateTime<Utc>>,
}

/// The running watches and their caches.
struct Watching {
    nodes: Store<Node>,
    pods: Store<Pod>,
    namespaces: Store<Namespace>,
    health: Arc<Mutex<Health>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A pod allocation the collector reported open, to close when the pod goes.
#[derive(Debug, Clone)]
struct Open {
    node: String,
    allocations: Vec<PushAllocation>,
    last_seen: DateTime<Utc>,
    deleting: Option<DateTime<Utc>>,
}

/// Slots of a node's GPU pool held by pods, stable across runs.
#[derive(Debug, Default)]
struct Tracking {
    slots: BTreeMap<String, BTreeMap<String, Vec<u32>>>,
    open: BTreeMap<String, Open>,
}

/// A configured `kubernetes` source.
pub struct KubernetesCollector {
    name: String,
    config: KubernetesConfig,
    watching: OnceCell<Watching>,
    tracking: Mutex<Tracking>,
}

impl KubernetesCollector {
    /// Build from a `[[collectors]]` entry's TOML text.
    pub fn from_toml(name: &str, text: &str) -> Result<KubernetesCollector, CollectError> {
        Ok(KubernetesCollector::new(
            name,
            KubernetesConfig::from_toml(name, text)?,
        ))
    }

    pub fn new(name: &str, config: KubernetesConfig) -> KubernetesCollector {
        KubernetesCollector {
            name: name.to_string(),
            config,
            watching: OnceCell::new(),
            tracking: Mutex::new(Tracking::default()),
        }
    }

    pub fn config(&self) -> &KubernetesConfig {
        &self.config
    }

    async fn client(&self) -> Result<Client, CollectError> {
        let options = |context: &Option<String>| kube::config::KubeConfigOptions {
            context: context.clone(),
            ..Default::default()
        };
        let config = match &self.config.access {
            Access::Kubeconfig { path, context } => {
                let file = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                    CollectError::Config(format!("kubeconfig: cannot read {}: {e}", path.display()))
                })?;
                kube::Config::from_custom_kubeconfig(file, &options(context))
                    .await
                    .map_err(|e| {
                        CollectError::Config(format!("kubeconfig {}: {e}", path.display()))
                    })?
            }
            Access::InCluster => kube::Config::incluster().map_err(|e| {
                CollectError::Config(format!(
                    "in_cluster: {e}; run gpuledger in a pod with a ServiceAccount, or set \
                     `kubeconfig`"
                ))
            })?,
            Access::Infer { context: None } => kube::Config::infer().await.map_err(|e| {
                CollectError::Config(format!(
                    "no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a cluster: {e}; \
                     set `kubeconfig` or `in_cluster = true`"
                ))
            })?,
            Access::Infer { context } => kube::Config::from_kubeconfig(&options(context))
                .await
                .map_err(|e| CollectError::Config(format!("kubeconfig: {e}")))?,
        };
        Client::try_from(config)
            .map_err(|e| CollectError::Config(format!("cannot set up the Kubernetes client: {e}")))
    }

    /// Start the three watches and wait for their first lists.
    async fn start(&self) -> Result<Watching, CollectError> {
        let client = self.client().await?;
        let health = Arc::new(Mutex::new(Health::default()));
        let wc = watcher::Config::default().timeout(self.config.watch_timeout_secs);
        let (nodes, w_nodes) = reflector::store();
        let (pods, w_pods) = reflector::store();
        let (namespaces, w_namespaces) = reflector::store();
        let tasks = vec![
            watch(
                Api::<Node>::all(client.clone()),
                w_nodes,
                wc.clone(),
                "nodes",
                health.clone(),
            ),
            watch(
                Api::<Pod>::all(client.clone()),
                w_pods,
                wc.clone(),
                "pods",
                health.clone(),
            ),
            watch(
                Api::<Namespace>::all(client),
                w_namespaces,
                wc,
                "namespaces",
                health.clone(),
            ),
        ];
        let watching = Watching {
            nodes,
            pods,
            namespaces,
            health,
            tasks,
        };
        let ready = async {
            let _ = watching.nodes.wait_until_ready().await;
            let _ = watching.pods.wait_until_ready().await;
            let _ = watching.namespaces.wait_until_ready().await;
        };
        let timeout = Duration::from_secs(self.config.sync_timeout_secs);
        if tokio::time::timeout(timeout, ready).await.is_err() {
            let errors = watching
                .health
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .errors
                .iter()
                .map(|(what, (_, e))| format!("{what}: {e}"))
                .collect::<Vec<_>>();
            let msg = format!(
                "the API server did not list nodes, pods and namespaces within {}s{}",
                self.config.sync_timeout_secs,
                if errors.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", errors.join("; "))
                }
            );
            let forbidden = errors
                .iter()
                .any(|e| e.contains("403") || e.contains("forbidden"));
            return Err(if forbidden {
                CollectError::Config(format!(
                    "{msg}; grant get/list/watch on nodes, pods and namespaces \
                     (deploy/kubernetes/rbac.yaml)"
                ))
            } else {
                CollectError::Transient(msg)
            });
        }
        Ok(watching)
    }

    /// Read the cached objects once.
    pub async fn run(&self) -> Result<CollectReport, CollectError> {
        let watching = self.watching.get_or_try_init(|| self.start()).await?;
        let now = now_secs();
        let nodes = watching.nodes.state();
        let pods = watching.pods.state();
        let namespaces = watching.namespaces.state();
        let (deleted, errors) = {
            let mut h = watching.health.lock().unwrap_or_else(|e| e.into_inner());
            let deleted = std::mem::take(&mut h.deleted);
            let errors: Vec<(String, String)> = h
                .errors
                .iter()
                .filter(|(_, (at, _))| now - *at < chrono::Duration::minutes(10))
                .map(|(what, (_, e))| (what.to_string(), e.clone()))
                .collect();
            (deleted, errors)
        };
        let mut report = self.snapshot(&nodes, &pods, &namespaces, &deleted, now);
        for (what, e) in errors {
            report.problems.push(PartProblem {
                part: format!("watch {what}"),
                error: CollectError::Transient(format!(
                    "watch {what}: {e} (retrying with backoff; the cache may be behind)"
                )),
            });
        }
        Ok(report)
    }

    /// Observations for one view of the cluster. `deleted` holds pods' deletion times as the
    /// watch saw them.
    fn snapshot(
        &self,
        nodes: &[Arc<Node>],
        pods: &[Arc<Pod>],
        namespaces: &[Arc<Namespace>],
        deleted: &HashMap<String, DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> CollectReport {
        let mut report = CollectReport::default();
        let provenance = |raw_key: String, observed_at| Provenance {
            source: self.name.clone(),
            observed_at,
            raw_key: Some(raw_key),
        };
        let data = |part: String, msg: String| PartProblem {
            part,
            error: CollectError::Data(msg),
        };
        let mut physical: BTreeMap<String, u32> = BTreeMap::new();
        for node in nodes {
            let Some(g) = parse::node_gpus(node) else {
                continue;
            };
            let key = format!("node/{}", g.node);
            for p in &g.problems {
                report.problems.push(data(key.clone(), p.clone()));
            }
            physical.insert(g.node.clone(), g.physical);
            if g.physical == 0 {
                continue;
            }
            report.observations.push(Observation::HostGpuCount {
                gpus: HostGpus {
                    account: g.account.clone(),
                    host: g.node.clone(),
                    count: g.physical,
                    model: g.model.clone(),
                    memory_mib: g.memory_mib,
                    cluster: Some(self.config.cluster.clone()),
                    cloud: g.cloud,
                    region: g.region.clone(),
                    instance_type: g.instance_type.clone(),
                    labels: {
                        // The cloud's instance ID, which billing exports name the host by.
                        let mut l = g.labels.clone();
                        if let Some(id) = &g.instance_id {
                            l.insert("instance_id".into(), id.clone());
                        }
                        l
                    },
                    mig_instances: g.mig_profiles.clone(),
                },
                provenance: provenance(key, now),
            });
        }
        let ns: HashMap<String, &Namespace> = namespaces
            .iter()
            .map(|n| (n.name_any(), n.as_ref()))
            .collect();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut tracking = self.tracking.lock().unwrap_or_else(|e| e.into_inner());
        let mut running: Vec<(PodGpus, String)> = Vec::new();
        for pod in pods {
            if parse::is_dcgm_exporter(pod) {
                if let (Some(node), Some(name)) = (
                    pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                    pod.metadata.name.clone(),
                ) {
                    report.observations.push(Observation::HostAlias {
                        provenance: provenance(
                            format!("pod/{}/{name}", pod.namespace().unwrap_or_default()),
                            now,
                        ),
                        alias: name,
                        host: node,
                    });
                }
            }
            let Some(p) = parse::pod_gpus(pod) else {
                continue;
            };
            let (Some(node), Some(_)) = (p.node.clone(), p.start) else {
                continue; // Not scheduled or not started: it holds no GPU yet.
            };
            if !physical.contains_key(&node) {
                report.problems.push(data(
                    format!("pod/{}", p.workload()),
                    format!(
                        "pod {} holds {} GPU slot(s) on node {node}, which shows no GPUs; its \
                         allocation is not recorded",
                        p.workload(),
                        p.slots()
                    ),
                ));
                continue;
            }
            seen.insert(p.uid.clone());
            running.push((p, node));
        }
        // Pods already holding slots keep them; new ones take the lowest free slots.
        running.sort_by(|a, b| (a.0.start, &a.0.uid).cmp(&(b.0.start, &b.0.uid)));
        let Tracking { slots, open } = &mut *tracking;
        for held in slots.values_mut() {
            held.retain(|uid, _| seen.contains(uid));
        }
        for (p, node) in &running {
            let pool = physical.get(node).copied().unwrap_or(0);
            let held = slots.entry(node.clone()).or_default();
            let mine = match held.get(&p.uid) {
                Some(s) => s.clone(),
                None => {
                    let used: BTreeSet<u32> = held.values().flatten().copied().collect();
                    let mine: Vec<u32> = (0..)
                        .filter(|s| !used.contains(s))
                        .take(p.slots() as usize)
                        .collect();
                    held.insert(p.uid.clone(), mine.clone());
                    mine
                }
            };
            let namespace = ns.get(&p.namespace).copied();
            let team = parse::lookup(&self.config.team_keys, p, namespace).map(|t| t.0);
            let user = parse::lookup(&self.config.user_keys, p, namespace).map(|t| t.0);
            let context = parse::workload_context(p, namespace);
            let start = p.start.unwrap_or(now);
            let allocations: Vec<PushAllocation> = mine
                .iter()
                .map(|slot| PushAllocation {
                    context: context.clone(),
                    // The pool's slot: the store moves it to the exact GPU once one is known.
                    gpu_uuid: placeholder_uuid(node, if pool == 0 { *slot } else { slot % pool }),
                    start,
                    end: p.end,
                    workload: p.workload(),
                    kind: AllocationKind::Pod,
                    user: user.clone(),
                    team: team.clone(),
                    owner: p.owner.clone(),
                })
                .collect();
            for a in &allocations {
                report.observations.push(Observation::Allocation {
                    allocation: a.clone(),
                    provenance: provenance(format!("pod/{}", p.workload()), now),
                });
            }
            if p.end.is_some() {
                open.remove(&p.uid);
            } else {
                open.insert(
                    p.uid.clone(),
                    Open {
                        node: node.clone(),
                        allocations,
                        last_seen: now,
                        deleting: p.deleting,
                    },
                );
            }
        }
        // Pods that went away end when the watch saw them deleted, else when their deletion
        // began, else (gone during a relist) when this run no longer sees them.
        let gone: Vec<String> = open
            .keys()
            .filter(|uid| !seen.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            let Some(o) = open.remove(&uid) else { continue };
            let end = deleted
                .get(&uid)
                .copied()
                .or(o.deleting)
                .unwrap_or(now)
                .max(o.last_seen.min(now));
            if let Some(held) = slots.get_mut(&o.node) {
                held.remove(&uid);
            }
            for mut a in o.allocations {
                a.end = Some(end.max(a.start));
                report.observations.push(Observation::Allocation {
                    provenance: provenance(format!("pod/{}", a.workload), now),
                    allocation: a,
                });
            }
        }
        report
    }
}

/// Keep `writer`'s cache of `api`'s objects current: list, then watch; the watcher relists on
/// 410 Gone and the backoff spaces out retries after errors. Errors are kept for the run to
/// report; pods' deletions are timed.
fn watch<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    config: watcher::Config,
    what: &'static str,
    health: Arc<Mutex<Health>>,
) -> JoinHandle<()>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    tokio::spawn(async move {
        let stream = watcher(api, config).default_backoff().modify(|o: &mut K| {
            // The cache keeps what the mapping reads, not server-side bookkeeping.
            o.meta_mut().managed_fields = None;
            if let Some(a) = o.meta_mut().annotations.as_mut() {
                a.remove("kubectl.kubernetes.io/last-applied-configuration");
            }
        });
        let stream = reflector::reflector(writer, stream);
        futures_util::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let mut h = health.lock().unwrap_or_else(|e| e.into_inner());
            match event {
                Ok(watcher::Event::Delete(o)) => {
                    if let Some(uid) = o.meta().uid.clone() {
                        h.deleted.insert(uid, now_secs());
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    h.errors.remove(what);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(resource = what, error = %e, "kubernetes watch failed; retrying");
                    h.errors.insert(what, (now_secs(), e.to_string()));
                }
            }
        }
    })
}

impl Collector for KubernetesCollector {
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

    fn err(text: &str) -> String {
        KubernetesConfig::from_toml("c", text)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn config_defaults_and_errors() {
        let c =
            KubernetesConfig::from_toml("rdu", "type = \"kubernetes\"\nname = \"rdu\"\n").unwrap();
        assert_eq!(c.cluster, "rdu");
        assert_eq!(c.access, Access::Infer { context: None });
        assert_eq!(c.team_keys, vec!["team"]);
        assert_eq!((c.sync_timeout_secs, c.watch_timeout_secs), (30, 290));
        let c = KubernetesConfig::from_toml(
            "x",
            "kubeconfig = \"/k\"\ncontext = \"a\"\ncluster = \"prod-1\"\nteam_keys = [\"squad\", \"team\"]",
        )
        .unwrap();
        assert_eq!(
            c.access,
            Access::Kubeconfig {
                path: "/k".into(),
                context: Some("a".into())
            }
        );
        assert_eq!(c.cluster, "prod-1");
        assert!(err("kubeconfig = \"/k\"\nin_cluster = true").contains("not both"));
        assert!(err("in_cluster = true\ncontext = \"a\"").contains("in_cluster has none"));
        assert!(err("kube_config = \"/k\"").contains("unknown field `kube_config`"));
        assert!(err("team_keys = [\"\"]").contains("team_keys[0]: must not be empty"));
        assert!(err("watch_timeout_secs = 0").contains("watch_timeout_secs: must be within"));
    }

    #[tokio::test]
    async fn an_unreadable_kubeconfig_is_a_config_error() {
        let c = KubernetesCollector::from_toml("x", "kubeconfig = \"/nonexistent/kc\"").unwrap();
        match c.run().await {
            Err(CollectError::Config(m)) => {
                assert!(m.contains("kubeconfig: cannot read /nonexistent/kc"), "{m}")
            }
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("read a missing kubeconfig"),
        }
    }
}
