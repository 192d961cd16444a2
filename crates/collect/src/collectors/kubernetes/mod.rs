//! The `kubernetes` collector: GPU nodes (counts, models, MIG, time-slicing, where they run;
//! NVIDIA's, AMD's `amd.com/gpu` and Intel Gaudi's `habana.ai/gaudi`) and the pods that hold
//! GPUs ("who used which GPU when"), read from one cluster's API server with a read-only
//! ServiceAccount or kubeconfig.
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
//! # kubeconfig_dir = "/etc/gpuledger/clusters" # instead of kubeconfig: one collector per file
//! # team_keys = ["team"]                       # pod label/annotation, then namespace's
//! # user_keys = ["gpuledger.io/user", "user", "owner"]
//! # sync_timeout_secs = 30
//! # watch_timeout_secs = 290
//! ```

pub mod parse;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
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
    kubeconfig_dir: Option<PathBuf>,
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
    /// A folder of kubeconfig files, one cluster each: a template that
    /// [`read_kubeconfig_dir`] turns into one [`Access::Kubeconfig`] per file.
    KubeconfigDir {
        dir: PathBuf,
        context: Option<String>,
    },
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct KubernetesConfig {
    /// The cluster name GPUs carry (`cluster` filter). In a [`Access::KubeconfigDir`] template,
    /// the entry's name: each file names its own cluster.
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
        let access = match (raw.kubeconfig, raw.kubeconfig_dir, raw.in_cluster) {
            (Some(_), Some(_), _) => {
                return Err(CollectError::Config(
                    "set either `kubeconfig` (one cluster) or `kubeconfig_dir` (a folder of \
                     kubeconfig files, one cluster each), not both"
                        .into(),
                ))
            }
            (None, Some(_), true) => {
                return Err(CollectError::Config(
                    "set either `kubeconfig_dir` (a folder of kubeconfig files) or \
                     `in_cluster = true` (the pod's ServiceAccount), not both"
                        .into(),
                ))
            }
            (None, Some(dir), false) => {
                if raw.cluster.is_some() {
                    return Err(CollectError::Config(
                        "`cluster` names one cluster; with `kubeconfig_dir` each file is one \
                         cluster, named by its file name without the extension (or by a \
                         `gpuledger` extension in the file)"
                            .into(),
                    ));
                }
                Access::KubeconfigDir {
                    dir,
                    context: raw.context,
                }
            }
            (Some(_), None, true) => {
                return Err(CollectError::Config(
                    "set either `kubeconfig` (a file) or `in_cluster = true` (the pod's \
                     ServiceAccount), not both"
                        .into(),
                ))
            }
            (Some(path), None, false) => Access::Kubeconfig {
                path,
                context: raw.context,
            },
            (None, None, true) => {
                if raw.context.is_some() {
                    return Err(CollectError::Config(
                        "`context` picks a kubeconfig context; in_cluster has none".into(),
                    ));
                }
                Access::InCluster
            }
            (None, None, false) => Access::Infer {
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

/// The file names a `kubeconfig_dir` reads (their extensions); hidden files are skipped.
pub const KUBECONFIG_EXTENSIONS: &[&str] = &["kubeconfig", "yaml", "yml"];

/// The name of the kubeconfig cluster extension that names the cluster for gpuledger
/// (`extension: {cluster: <name>}`), where the file name does not.
pub const CLUSTER_EXTENSION: &str = "gpuledger";

/// What a `kubeconfig_dir` holds: a collector configuration per kubeconfig file, with its
/// source name, and each file left out, with why.
#[derive(Debug, Default)]
pub struct DirClusters {
    pub clusters: Vec<(String, KubernetesConfig)>,
    pub skipped: Vec<String>,
}

/// Read the folder of a [`Access::KubeconfigDir`] template named `name`: every
/// `*.kubeconfig`, `*.yaml` and `*.yml` file that is not hidden becomes a collector named
/// `<name>-<file stem>` for the cluster `<file stem>` (or the one the file's [`CLUSTER_EXTENSION`]
/// names), with the template's other settings. Links are followed, so a Secret mounted as a
/// folder works (its hidden `..data` folder is skipped). A file that is no usable kubeconfig is
/// left out, named in [`DirClusters::skipped`], and the others kept; a folder that cannot be
/// read or holds no kubeconfig file is an error. Any other configuration is returned as it is.
pub fn read_kubeconfig_dir(
    name: &str,
    template: &KubernetesConfig,
) -> Result<DirClusters, CollectError> {
    let Access::KubeconfigDir { dir, context } = &template.access else {
        return Ok(DirClusters {
            clusters: vec![(name.to_string(), template.clone())],
            skipped: Vec::new(),
        });
    };
    let folder_error = |e: std::io::Error| {
        CollectError::Config(format!(
            "kubeconfig_dir {}: cannot read the folder: {e}",
            dir.display()
        ))
    };
    let mut files = Vec::new();
    let mut out = DirClusters::default();
    for item in std::fs::read_dir(dir).map_err(folder_error)? {
        let path = item.map_err(folder_error)?.path();
        let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let wanted = Path::new(file_name)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| {
                KUBECONFIG_EXTENSIONS
                    .iter()
                    .any(|k| k.eq_ignore_ascii_case(e))
            });
        if file_name.starts_with('.') || !wanted {
            continue;
        }
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => files.push(path),
            Ok(_) => {}
            Err(e) => out
                .skipped
                .push(format!("{}: cannot read: {e}", path.display())),
        }
    }
    if files.is_empty() && out.skipped.is_empty() {
        return Err(CollectError::Config(format!(
            "kubeconfig_dir {}: no kubeconfig file in the folder (names ending in {})",
            dir.display(),
            KUBECONFIG_EXTENSIONS
                .iter()
                .map(|e| format!(".{e}"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    files.sort();
    let mut taken: BTreeMap<String, PathBuf> = BTreeMap::new();
    for path in files {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let source = format!("{name}-{stem}");
        if let Some(first) = taken.get(&source) {
            out.skipped.push(format!(
                "{}: its source name `{source}` is already {}'s; rename one of them",
                path.display(),
                first.display()
            ));
            continue;
        }
        match cluster_named_in(&path, context.as_deref()) {
            Ok(named) => {
                taken.insert(source.clone(), path.clone());
                out.clusters.push((
                    source,
                    KubernetesConfig {
                        cluster: named.unwrap_or(stem),
                        access: Access::Kubeconfig {
                            path,
                            context: context.clone(),
                        },
                        ..template.clone()
                    },
                ));
            }
            Err(why) => out.skipped.push(format!(
                "{}: not a usable kubeconfig: {why}",
                path.display()
            )),
        }
    }
    Ok(out)
}

/// Check that `path` is a kubeconfig whose context (`context`, else its current one) names a
/// cluster with a server, and return the cluster name its [`CLUSTER_EXTENSION`] gives, if any.
fn cluster_named_in(path: &Path, context: Option<&str>) -> Result<Option<String>, String> {
    let file = kube::config::Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    let want = context
        .map(str::to_string)
        .or(file.current_context.clone())
        .ok_or("it sets no current-context (set one, or `context` in the entry)")?;
    let cluster = file
        .contexts
        .iter()
        .find(|c| c.name == want)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .ok_or_else(|| format!("it has no context `{want}`"))?;
    let Some(details) = file
        .clusters
        .iter()
        .find(|c| c.name == cluster)
        .and_then(|c| c.cluster.as_ref())
    else {
        return Err(format!(
            "context `{want}` names cluster `{cluster}`, which it does not define"
        ));
    };
    if details.server.is_none() {
        return Err(format!("cluster `{cluster}` has no server"));
    }
    let Some(ext) = details
        .extensions
        .iter()
        .flatten()
        .find(|e| e.name == CLUSTER_EXTENSION)
    else {
        return Ok(None);
    };
    match ext.extension.get("cluster").and_then(|c| c.as_str()) {
        Some(c) if !c.trim().is_empty() => Ok(Some(c.trim().to_string())),
        _ => Err(format!(
            "cluster `{cluster}`'s `{CLUSTER_EXTENSION}` extension needs `cluster: <name>`"
        )),
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
            Access::KubeconfigDir { dir, .. } => {
                return Err(CollectError::Config(format!(
                    "kubeconfig_dir {}: a folder stands for one collector per file; read it \
                     with read_kubeconfig_dir",
                    dir.display()
                )))
            }
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
                        // Placeholder GPUs have no identity whose prefix names the vendor.
                        if let Some(v) = g.vendor {
                            l.insert("vendor".into(), v.as_str().into());
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
                    avg_util_pct: None,
                    avg_mem_used_mib: None,
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

    fn kubeconfig(server: &str, extension: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: reader\nclusters:\n- name: c\n  \
             cluster:\n    server: {server}\n{extension}contexts:\n- name: reader\n  context:\n    \
             cluster: c\n    user: reader\nusers:\n- name: reader\n  user:\n    token: t\n"
        )
    }

    fn fresh_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpuledger-kdir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn template(dir: &Path, extra: &str) -> KubernetesConfig {
        KubernetesConfig::from_toml(
            "k8s",
            &format!(
                "kubeconfig_dir = \"{}\"\nteam_keys = [\"squad\"]\n{extra}",
                dir.display()
            ),
        )
        .unwrap()
    }

    /// A folder of kubeconfigs is one collector per file: named `<entry>-<stem>`, cluster the
    /// stem unless the file's `gpuledger` extension names it, the template's other settings on
    /// each; hidden files and other names are not read, and a bad file is named and left out
    /// while the others are kept.
    #[test]
    fn a_kubeconfig_dir_is_one_collector_per_file() {
        let dir = fresh_dir("expand");
        std::fs::write(
            dir.join("rdu.kubeconfig"),
            kubeconfig("https://rdu:6443", ""),
        )
        .unwrap();
        std::fs::write(
            dir.join("fra.yaml"),
            kubeconfig(
                "https://fra:6443",
                "    extensions:\n    - name: gpuledger\n      extension:\n        cluster: fra-prod-2\n",
            ),
        )
        .unwrap();
        std::fs::write(dir.join("notes.txt"), "not read").unwrap();
        std::fs::write(dir.join(".old.yaml"), "hidden: true").unwrap();
        std::fs::create_dir(dir.join("..data")).unwrap();
        std::fs::write(dir.join("broken.yml"), "{ not: [yaml").unwrap();
        std::fs::write(dir.join("empty.yaml"), "").unwrap();
        let t = template(&dir, "");
        let got = read_kubeconfig_dir("k8s", &t).unwrap();
        let names: Vec<(&str, &str)> = got
            .clusters
            .iter()
            .map(|(n, c)| (n.as_str(), c.cluster.as_str()))
            .collect();
        assert_eq!(names, [("k8s-fra", "fra-prod-2"), ("k8s-rdu", "rdu")]);
        let (_, rdu) = &got.clusters[1];
        assert_eq!(
            rdu.access,
            Access::Kubeconfig {
                path: dir.join("rdu.kubeconfig"),
                context: None
            }
        );
        assert_eq!(rdu.team_keys, ["squad"], "the template's settings apply");
        assert_eq!(got.skipped.len(), 2, "{:#?}", got.skipped);
        assert!(
            got.skipped[0].contains("broken.yml: not a usable kubeconfig"),
            "{:#?}",
            got.skipped
        );
        assert!(
            got.skipped[1]
                .contains("empty.yaml: not a usable kubeconfig: it sets no current-context"),
            "{:#?}",
            got.skipped
        );

        // A context the template names must be in each file.
        let got = read_kubeconfig_dir("k8s", &template(&dir, "context = \"admin\"\n")).unwrap();
        assert!(got.clusters.is_empty());
        assert!(
            got.skipped.iter().any(|s| s
                .contains("rdu.kubeconfig: not a usable kubeconfig: it has no context `admin`")),
            "{:#?}",
            got.skipped
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_kubeconfig_dir_that_is_missing_or_empty_is_an_error() {
        let dir = fresh_dir("empty");
        std::fs::write(dir.join("README.md"), "kubeconfigs go here").unwrap();
        let e = read_kubeconfig_dir("k8s", &template(&dir, ""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "no kubeconfig file in the folder (names ending in .kubeconfig, .yaml, .yml)"
            ),
            "{e}"
        );
        let gone = dir.join("nope");
        let e = read_kubeconfig_dir("k8s", &template(&gone, ""))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "kubeconfig_dir {}: cannot read the folder",
                gone.display()
            )),
            "{e}"
        );
        // Two files with one stem would be one source: the second is left out, named.
        std::fs::write(dir.join("rdu.yaml"), kubeconfig("https://a", "")).unwrap();
        std::fs::write(dir.join("rdu.yml"), kubeconfig("https://b", "")).unwrap();
        let got = read_kubeconfig_dir("k8s", &template(&dir, "")).unwrap();
        assert_eq!(got.clusters.len(), 1);
        assert!(
            got.skipped[0].contains("rdu.yml: its source name `k8s-rdu` is already"),
            "{:#?}",
            got.skipped
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The shipped template for the read-only ServiceAccount, filled as the docs say, is a
    /// kubeconfig the folder reads; with its `extensions` lines kept, the cluster is named there.
    #[test]
    fn the_shipped_reader_template_filled_in_is_read() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../deploy/kubernetes/reader.kubeconfig.template"),
        )
        .unwrap();
        assert!(text.contains("${TOKEN}") && text.contains("${CA_DATA}"));
        let filled = text
            .replace("${CLUSTER_NAME}", "rdu-ocp-1")
            .replace("${SERVER}", "https://api.rdu-ocp-1.example:6443")
            .replace("${CA_DATA}", "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==")
            .replace("${TOKEN}", "eyJhbGciOiJSUzI1NiJ9.e30.c2ln");
        let dir = fresh_dir("template");
        std::fs::write(dir.join("rdu.kubeconfig"), &filled).unwrap();
        std::fs::write(
            dir.join("fra.kubeconfig"),
            filled
                .replace("      # ", "      ")
                .replace("rdu-ocp-1", "fra-2"),
        )
        .unwrap();
        let got = read_kubeconfig_dir("k8s", &template(&dir, "")).unwrap();
        assert!(got.skipped.is_empty(), "{:#?}", got.skipped);
        let names: Vec<(&str, &str)> = got
            .clusters
            .iter()
            .map(|(n, c)| (n.as_str(), c.cluster.as_str()))
            .collect();
        assert_eq!(names, [("k8s-fra", "fra-2"), ("k8s-rdu", "rdu")]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_kubeconfig_dir_template_refuses_what_names_one_cluster() {
        assert!(err("kubeconfig = \"/k\"\nkubeconfig_dir = \"/d\"").contains("not both"));
        assert!(err("kubeconfig_dir = \"/d\"\nin_cluster = true").contains("not both"));
        assert!(err("kubeconfig_dir = \"/d\"\ncluster = \"x\"")
            .contains("with `kubeconfig_dir` each file is one cluster"));
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
