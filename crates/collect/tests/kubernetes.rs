//! Tests of the `kubernetes` collector: real corpus objects, the real kube-rs client.
//!
//! No Kubernetes API server can run here (it needs a container runtime), so the client talks to
//! [`support::kube_api::FakeApi`], a local HTTP server that serves the corpus's recorded Node and
//! Pod objects as list and watch responses: added, modified and deleted events, and 410 Gone.
//!
//! Map (add new tests to the matching section; name regressions after the bug they pin):
//! - `corpus_*`: every file in `<corpus>/kubernetes/` mapped, checked against values read off
//!   the files by hand; a new corpus file fails until it has its expectations.
//! - `watch_*`: the collector against the fake API server: first list, events, relist on 410.
//! - `load_*`: requests the collector makes in steady state.
//!
//! The corpus is found at `$GPULEDGER_CORPUS` or `<repo>/../shared/fixtures`; without it the
//! corpus tests say they were skipped.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuledger_collect::collectors::kubernetes::parse::{self, NodeGpus, PodGpus};
use gpuledger_collect::collectors::kubernetes::KubernetesCollector;
use gpuledger_collect::{CollectError, CollectReport};
use gpuledger_model::{Cloud, HostGpus, Observation, PushAllocation};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{json, Value};
use support::kube_api::FakeApi;

// ---------------------------------------------------------------------------------------------
// Helpers

fn corpus_k8s() -> Option<PathBuf> {
    let root = std::env::var_os("GPULEDGER_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"));
    let dir = root.join("kubernetes");
    if dir.is_dir() {
        Some(dir)
    } else if std::env::var_os("GPULEDGER_REQUIRE_CORPUS").is_some() {
        panic!(
            "GPULEDGER_REQUIRE_CORPUS is set but there is no kubernetes corpus at {}; set GPULEDGER_CORPUS to the fixtures folder",
            dir.display()
        );
    } else {
        eprintln!(
            "skipped: no kubernetes corpus at {} (set GPULEDGER_CORPUS to the fixtures folder)",
            dir.display()
        );
        None
    }
}

/// A corpus file as a full object. The `node-labels-*.json` files hold only a node's labels
/// (`kubectl get node -o json | jq .metadata.labels`); they become a Node with those labels.
fn object(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    let v: Value = serde_yaml::from_str(&text)
        .unwrap_or_else(|e| panic!("{}: not YAML/JSON: {e}", path.display()));
    if v.get("kind").is_some() {
        return v;
    }
    let name = v["kubernetes.io/hostname"].as_str().unwrap().to_string();
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": v}})
}

fn corpus_object(name: &str) -> Option<Value> {
    corpus_k8s().map(|d| object(&d.join(name)))
}

fn allocations(r: &CollectReport) -> Vec<&PushAllocation> {
    r.observations
        .iter()
        .filter_map(|o| match o {
            Observation::Allocation { allocation, .. } => Some(allocation),
            _ => None,
        })
        .collect()
}

fn host_counts(r: &CollectReport) -> BTreeMap<String, HostGpus> {
    r.observations
        .iter()
        .filter_map(|o| match o {
            Observation::HostGpuCount { gpus, .. } => Some((gpus.host.clone(), gpus.clone())),
            _ => None,
        })
        .collect()
}

fn collector(api: &FakeApi, dir: &Path, extra: &str) -> KubernetesCollector {
    let kc = api.kubeconfig(dir);
    KubernetesCollector::from_toml(
        "qa-cluster",
        &format!(
            "type = \"kubernetes\"\nname = \"qa-cluster\"\nkubeconfig = \"{}\"\nteam_keys = [\"team\", \"project\"]\nsync_timeout_secs = 10\n{extra}",
            kc.display()
        ),
    )
    .unwrap()
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuledger-k8s-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A namespace written for these tests (the corpus has none): Run:ai's project namespace.
fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

// ---------------------------------------------------------------------------------------------
// corpus_*

/// What each corpus file must map to, read off the files by hand.
enum Want {
    Node {
        physical: u32,
        model: &'static str,
        memory_mib: u64,
        mig: &'static [(&'static str, u32)],
        strategy: &'static str,
    },
    Pod {
        node: &'static str,
        slots: u32,
        gpus: u32,
        mig: &'static [(&'static str, u32)],
        fraction: Option<f64>,
        start: &'static str,
        owner: Option<&'static str>,
        user: Option<&'static str>,
    },
}

fn expectations() -> BTreeMap<&'static str, Want> {
    BTreeMap::from([
        (
            "node-a100-sxm4-40gb-mig-7g40gb.yaml",
            Want::Node {
                physical: 1,
                model: "NVIDIA A100 SXM4 40GB",
                memory_mib: 40960,
                mig: &[("7g.40gb", 1)],
                strategy: "mixed",
            },
        ),
        (
            "node-a100-sxm4-40gb-mig-mixed-gke.yaml",
            Want::Node {
                physical: 1,
                model: "NVIDIA A100 SXM4 40GB",
                memory_mib: 40960,
                mig: &[("1g.5gb", 2), ("2g.10gb", 1)],
                strategy: "mixed",
            },
        ),
        (
            "node-labels-h100-80gb-mig-mixed-strategy.json",
            Want::Node {
                physical: 1,
                model: "NVIDIA H100 80GB HBM3",
                memory_mib: 81559,
                mig: &[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)],
                strategy: "mixed",
            },
        ),
        (
            "node-labels-h100-80gb-mig-single-strategy.json",
            Want::Node {
                physical: 1,
                model: "NVIDIA H100 80GB HBM3",
                memory_mib: 81559,
                mig: &[],
                strategy: "single",
            },
        ),
        (
            "node-tesla-t4-2gpu-gke.yaml",
            Want::Node {
                physical: 2,
                model: "Tesla T4",
                memory_mib: 15360,
                mig: &[],
                strategy: "mixed",
            },
        ),
        (
            "pod-runai-fractional-gpu-0.5.yaml",
            Want::Pod {
                node: "i-0b498db53280b86a6",
                slots: 1,
                gpus: 0,
                mig: &[],
                fraction: Some(0.5),
                start: "2024-03-31T09:03:27Z",
                owner: Some("RunaiJob/frac-1"),
                user: Some("test@run.ai"),
            },
        ),
        (
            "pod-runai-mig-1g5gb.yaml",
            Want::Pod {
                node: "qa-mig-worker-gpu-a100",
                slots: 1,
                gpus: 0,
                mig: &[("1g.5gb", 1)],
                fraction: None,
                start: "2023-01-19T07:56:50Z",
                owner: Some("RunaiJob/job-2"),
                user: Some("guyshaibi"),
            },
        ),
        (
            "pod-runai-reservation-nvidia-gpu-1.yaml",
            Want::Pod {
                node: "i-0b498db53280b86a6",
                slots: 1,
                gpus: 1,
                mig: &[],
                fraction: None,
                start: "2024-03-31T09:03:25Z",
                owner: None,
                user: None,
            },
        ),
    ])
}

fn row_for_node(file: &str, g: &NodeGpus) -> String {
    let mig = if g.mig_profiles.is_empty() {
        "—".to_string()
    } else {
        g.mig_profiles
            .iter()
            .map(|(p, n)| format!("{n}× {p}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "| {file} | node `{}`: {} physical GPU(s), {} ({} MiB), MIG strategy {}, sharing {} | {mig} | — | {} |",
        g.node,
        g.physical,
        g.model.as_deref().unwrap_or("unknown model"),
        g.memory_mib.map_or("?".into(), |m| m.to_string()),
        g.mig_strategy.as_deref().unwrap_or("—"),
        g.sharing.as_deref().unwrap_or("none"),
        if g.instance_type.is_none() && g.cloud.is_none() {
            "instance type, cloud and region unknown (no labels, no providerID)"
        } else {
            "—"
        }
    )
}

fn row_for_pod(file: &str, p: &PodGpus) -> String {
    let what = if p.gpus > 0 {
        format!("{}× nvidia.com/gpu", p.gpus)
    } else if !p.mig.is_empty() {
        p.mig
            .iter()
            .map(|(k, n)| format!("{n}× MIG {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        format!("fraction {} of a GPU", p.fraction.unwrap_or_default())
    };
    let user = parse::lookup(&["user".to_string()], p, None).map(|u| u.0);
    format!(
        "| {file} | — | — | pod `{}` on `{}`: {what}, from {}, owner {}, user {} | end unknown (running) |",
        p.workload(),
        p.node.as_deref().unwrap_or("?"),
        p.start.map_or("?".into(), |s| s.to_rfc3339()),
        p.owner.as_deref().unwrap_or("none"),
        user.as_deref().unwrap_or("unknown"),
    )
}

#[test]
fn corpus_every_file_maps_to_what_it_says() {
    let Some(dir) = corpus_k8s() else { return };
    let want = expectations();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    println!("| file | GPUs | MIG instances | allocations | unknown |");
    println!("| --- | --- | --- | --- | --- |");
    for path in files {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let o = object(&path);
        let w = want
            .get(file.as_str())
            .unwrap_or_else(|| panic!("{file}: a new corpus file needs its expectations here"));
        match (o["kind"].as_str(), w) {
            (
                Some("Node"),
                Want::Node {
                    physical,
                    model,
                    memory_mib,
                    mig,
                    strategy,
                },
            ) => {
                let node: Node = serde_json::from_value(o).unwrap();
                let g = parse::node_gpus(&node).unwrap();
                assert_eq!(g.physical, *physical, "{file}");
                assert_eq!(g.model.as_deref(), Some(*model), "{file}");
                assert_eq!(g.memory_mib, Some(*memory_mib), "{file}");
                let got: Vec<(&str, u32)> = g
                    .mig_profiles
                    .iter()
                    .map(|(k, v)| (k.as_str(), *v))
                    .collect();
                assert_eq!(got, mig.to_vec(), "{file}");
                assert_eq!(g.mig_strategy.as_deref(), Some(*strategy), "{file}");
                assert_eq!(g.sharing, None, "{file}: replicas 0/1 is no sharing");
                assert!(g.problems.is_empty(), "{file}: {:?}", g.problems);
                assert!(
                    g.labels.is_empty(),
                    "{file}: only system labels, none about owners: {:?}",
                    g.labels
                );
                println!("{}", row_for_node(&file, &g));
            }
            (
                Some("Pod"),
                Want::Pod {
                    node,
                    slots,
                    gpus,
                    mig,
                    fraction,
                    start,
                    owner,
                    user,
                },
            ) => {
                let pod: Pod = serde_json::from_value(o).unwrap();
                let p = parse::pod_gpus(&pod).unwrap();
                assert_eq!(p.node.as_deref(), Some(*node), "{file}");
                assert_eq!((p.slots(), p.gpus), (*slots, *gpus), "{file}");
                let got: Vec<(&str, u32)> = p.mig.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                assert_eq!(got, mig.to_vec(), "{file}");
                assert_eq!(p.fraction, *fraction, "{file}");
                assert_eq!(p.start, Some(start.parse().unwrap()), "{file}");
                assert_eq!(p.end, None, "{file}: running");
                assert_eq!(p.owner.as_deref(), *owner, "{file}");
                let u = parse::lookup(&["user".to_string()], &p, None);
                assert_eq!(u.as_ref().map(|u| u.0.as_str()), *user, "{file}");
                println!("{}", row_for_pod(&file, &p));
            }
            (k, _) => panic!("{file}: kind {k:?} does not match its expectation"),
        }
    }
}

#[test]
fn corpus_mutations_never_panic() {
    let Some(dir) = corpus_k8s() else { return };
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let o = object(&e.unwrap().path());
        // Replace each leaf in turn with values of the wrong shape; what still decodes as a
        // Node or Pod must map without panicking.
        let mut leaves = Vec::new();
        collect_paths(&o, String::new(), &mut leaves);
        for (i, path) in leaves.iter().enumerate() {
            for bad in [
                json!("-1"),
                json!("x"),
                json!(""),
                json!(null),
                json!("99999999999999999999"),
            ] {
                let mut m = o.clone();
                if let Some(slot) = m.pointer_mut(path) {
                    *slot = bad;
                }
                if let Ok(node) = serde_json::from_value::<Node>(m.clone()) {
                    let _ = parse::node_gpus(&node);
                }
                if let Ok(pod) = serde_json::from_value::<Pod>(m) {
                    let _ = parse::pod_gpus(&pod);
                }
                n += 1;
            }
            if i > 400 {
                break;
            }
        }
    }
    assert!(n > 1000, "{n} mutations");
    println!("{n} mutated objects mapped without a panic");
}

fn collect_paths(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                collect_paths(
                    v,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                )
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                collect_paths(v, format!("{at}/{i}"), out)
            }
        }
        _ => out.push(at),
    }
}

// ---------------------------------------------------------------------------------------------
// watch_*

/// The corpus T4 node, A100 MIG node and MIG pod, and the namespace of that pod's project.
fn cluster_objects() -> Option<Vec<Value>> {
    Some(vec![
        corpus_object("node-tesla-t4-2gpu-gke.yaml")?,
        corpus_object("node-a100-sxm4-40gb-mig-mixed-gke.yaml")?,
        corpus_object("pod-runai-mig-1g5gb.yaml")?,
        namespace("runai-team-a", json!({"runai/queue": "team-a"})),
    ])
}

/// The corpus reservation pod, moved (by this test) to the T4 node under another name.
fn reservation_on_t4(name: &str, uid: &str) -> Option<Value> {
    let mut p = corpus_object("pod-runai-reservation-nvidia-gpu-1.yaml")?;
    p["metadata"]["name"] = json!(name);
    p["metadata"]["uid"] = json!(uid);
    p["spec"]["nodeName"] = json!("qa-mig-worker-gpu-1");
    p["metadata"]["labels"]["team"] = json!("infra");
    Some(p)
}

async fn run(c: &KubernetesCollector) -> CollectReport {
    c.run()
        .await
        .unwrap_or_else(|e| panic!("collector run failed: {e}"))
}

/// Run until `ok` holds for a report (watch events arrive asynchronously).
async fn run_until(
    c: &KubernetesCollector,
    what: &str,
    ok: impl Fn(&CollectReport) -> bool,
) -> CollectReport {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = run(c).await;
        if ok(&r) {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            r.observations
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn watch_lists_nodes_and_pods_then_follows_events_and_relists_on_410() {
    let Some(objects) = cluster_objects() else {
        return;
    };
    let api = FakeApi::start(objects).await;
    let dir = tempdir("watch");
    let c = collector(&api, &dir, "");

    // First run: the lists.
    let r = run(&c).await;
    let hosts = host_counts(&r);
    assert_eq!(hosts.len(), 2, "{hosts:?}");
    let t4 = &hosts["qa-mig-worker-gpu-1"];
    assert_eq!((t4.count, t4.model.as_deref()), (2, Some("Tesla T4")));
    assert_eq!(t4.cluster.as_deref(), Some("qa-cluster"));
    assert_eq!(t4.memory_mib, Some(15360));
    // MIG instances are not extra GPUs: the mixed-strategy A100 is one GPU, and its layout is
    // reported with it (it used to be parsed and dropped).
    let a100 = &hosts["qa-mig-worker-gpu-a100"];
    assert_eq!(a100.count, 1);
    assert_eq!(
        a100.mig_instances,
        BTreeMap::from([("1g.5gb".to_string(), 2), ("2g.10gb".to_string(), 1)])
    );
    assert!(t4.mig_instances.is_empty());
    let a = allocations(&r);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].gpu_uuid, "placeholder:qa-mig-worker-gpu-a100:0");
    assert_eq!(a[0].workload, "runai-team-a/job-2-0-0");
    assert_eq!(
        a[0].start,
        "2023-01-19T07:56:50Z"
            .parse::<chrono::DateTime<chrono::Utc>>()
            .unwrap()
    );
    assert_eq!(a[0].end, None);
    assert_eq!(a[0].owner.as_deref(), Some("RunaiJob/job-2"));
    assert_eq!(
        a[0].user.as_deref(),
        Some("guyshaibi"),
        "pod annotation `user`"
    );
    assert_eq!(a[0].team.as_deref(), Some("team-a"), "pod label `project`");
    // What ownership rules on namespaces read: the namespace and its labels, the pod's labels.
    let ctx = &a[0].context;
    assert_eq!(ctx.namespace.as_deref(), Some("runai-team-a"));
    assert_eq!(
        ctx.namespace_labels.get("runai/queue").map(String::as_str),
        Some("team-a")
    );
    assert_eq!(
        ctx.pod_labels.get("project").map(String::as_str),
        Some("team-a")
    );
    assert!(ctx.pod_annotations.contains_key("user"), "{ctx:?}");

    // ADDED: a pod on the T4 node; MODIFIED: the A100 node's MIG layout changes.
    api.apply(reservation_on_t4("resv-a", "uid-a").unwrap());
    api.apply(corpus_object("node-a100-sxm4-40gb-mig-7g40gb.yaml").unwrap());
    let r = run_until(&c, "the added pod", |r| allocations(r).len() == 2).await;
    let resv = allocations(&r)
        .into_iter()
        .find(|a| a.workload == "runai-reservation/resv-a")
        .cloned()
        .unwrap();
    assert_eq!(resv.gpu_uuid, "placeholder:qa-mig-worker-gpu-1:0");
    assert_eq!(resv.team.as_deref(), Some("infra"));
    // A second pod on the same node takes the next slot of the pool.
    api.apply(reservation_on_t4("resv-b", "uid-b").unwrap());
    let r = run_until(&c, "the second pod", |r| allocations(r).len() == 3).await;
    let b = allocations(&r)
        .into_iter()
        .find(|a| a.workload == "runai-reservation/resv-b")
        .cloned()
        .unwrap();
    assert_eq!(b.gpu_uuid, "placeholder:qa-mig-worker-gpu-1:1");

    // DELETED: the allocation ends, once.
    api.delete("pods", "runai-reservation", "resv-a");
    let r = run_until(&c, "the deleted pod's end", |r| {
        allocations(r)
            .iter()
            .any(|a| a.workload == "runai-reservation/resv-a" && a.end.is_some())
    })
    .await;
    let ended = allocations(&r)
        .into_iter()
        .find(|a| a.workload == "runai-reservation/resv-a")
        .unwrap();
    assert_eq!(
        ended.start, resv.start,
        "same key: the stored allocation is closed"
    );
    let r = run(&c).await;
    assert!(
        !allocations(&r)
            .iter()
            .any(|a| a.workload == "runai-reservation/resv-a"),
        "reported closed once"
    );

    // 410 Gone: the watch must list again. A pod deleted meanwhile is closed after the relist.
    let lists_before = api
        .requests()
        .iter()
        .filter(|(r, w)| r == "pods" && !w)
        .count();
    api.delete("pods", "runai-reservation", "resv-b");
    api.expire("pods");
    let r = run_until(&c, "the relist", |r| {
        allocations(r)
            .iter()
            .any(|a| a.workload == "runai-reservation/resv-b" && a.end.is_some())
    })
    .await;
    assert!(!r.observations.is_empty());
    let deadline = Instant::now() + Duration::from_secs(10);
    while api
        .requests()
        .iter()
        .filter(|(r, w)| r == "pods" && !w)
        .count()
        == lists_before
    {
        assert!(
            Instant::now() < deadline,
            "no relist after 410: {:?}",
            api.requests()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The MIG pod is still open after the relist.
    let r = run(&c).await;
    assert!(allocations(&r)
        .iter()
        .any(|a| a.workload == "runai-team-a/job-2-0-0" && a.end.is_none()));
}

#[tokio::test]
async fn watch_maps_dcgm_exporter_pods_to_their_node() {
    let Some(mut objects) = cluster_objects() else {
        return;
    };
    // Written for this test: the exporter pod whose name the T4 scrape carries in `Hostname`.
    objects.push(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "nvidia-dcgm-exporter-s228n", "namespace": "gpu-operator", "uid": "x",
        "labels": {"app": "nvidia-dcgm-exporter"}},
        "spec": {"nodeName": "qa-mig-worker-gpu-1", "containers": [{"name": "nvidia-dcgm-exporter"}]}}));
    let api = FakeApi::start(objects).await;
    let c = collector(&api, &tempdir("alias"), "");
    let r = run(&c).await;
    let aliases: Vec<(&str, &str)> = r
        .observations
        .iter()
        .filter_map(|o| match o {
            Observation::HostAlias { alias, host, .. } => Some((alias.as_str(), host.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        aliases,
        vec![("nvidia-dcgm-exporter-s228n", "qa-mig-worker-gpu-1")]
    );
}

/// The corpus T4 node, modified by this test into an AMD node: its NVIDIA labels (GPU Feature
/// Discovery's) and `nvidia.com/gpu` resources removed, `amd.com/gpu: 8` advertised instead,
/// as AMD's device plugin does. No recorded AMD node is public.
fn amd_node_from_t4(name: &str) -> Option<Value> {
    let mut n = corpus_object("node-tesla-t4-2gpu-gke.yaml")?;
    n["metadata"]["name"] = json!(name);
    let labels = n["metadata"]["labels"].as_object_mut().unwrap();
    labels.retain(|k, _| !k.starts_with("nvidia.com/"));
    labels.insert("kubernetes.io/hostname".into(), json!(name));
    for part in ["capacity", "allocatable"] {
        let m = n["status"][part].as_object_mut().unwrap();
        m.remove("nvidia.com/gpu");
        m.insert("amd.com/gpu".into(), json!("8"));
    }
    Some(n)
}

/// The corpus reservation pod, modified by this test to request `amd.com/gpu` on `node`.
fn amd_pod_from_reservation(node: &str, gpus: u32) -> Option<Value> {
    let mut p = reservation_on_t4("amd-resv", "uid-amd")?;
    p["spec"]["nodeName"] = json!(node);
    let r = &mut p["spec"]["containers"][0]["resources"];
    for part in ["limits", "requests"] {
        r[part] = json!({ "amd.com/gpu": gpus.to_string() });
    }
    Some(p)
}

#[tokio::test]
async fn watch_counts_amd_gpus_and_labels_each_pool_with_its_vendor() {
    let (Some(t4), Some(amd), Some(pod)) = (
        corpus_object("node-tesla-t4-2gpu-gke.yaml"),
        amd_node_from_t4("mi300x-node-7"),
        amd_pod_from_reservation("mi300x-node-7", 2),
    ) else {
        return;
    };
    let api = FakeApi::start(vec![t4, amd, pod]).await;
    let c = collector(&api, &tempdir("amd"), "");
    let r = run(&c).await;
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let hosts = host_counts(&r);
    let amd = &hosts["mi300x-node-7"];
    assert_eq!((amd.count, amd.model.as_deref()), (8, None));
    assert_eq!(amd.labels.get("vendor").map(String::as_str), Some("amd"));
    assert!(amd.mig_instances.is_empty());
    // The NVIDIA node is counted as before, and now says whose it is too.
    let t4 = &hosts["qa-mig-worker-gpu-1"];
    assert_eq!((t4.count, t4.model.as_deref()), (2, Some("Tesla T4")));
    assert_eq!(t4.labels.get("vendor").map(String::as_str), Some("nvidia"));
    let mut slots: Vec<&str> = allocations(&r)
        .iter()
        .filter(|a| a.workload == "runai-reservation/amd-resv")
        .map(|a| a.gpu_uuid.as_str())
        .collect();
    slots.sort();
    assert_eq!(
        slots,
        ["placeholder:mi300x-node-7:0", "placeholder:mi300x-node-7:1"]
    );
}

#[tokio::test]
async fn watch_reads_cloud_facts_from_node_labels_and_provider_id() {
    let Some(mut t4) = corpus_object("node-tesla-t4-2gpu-gke.yaml") else {
        return;
    };
    // Added by this test: what GKE puts on such a node.
    t4["metadata"]["labels"]["node.kubernetes.io/instance-type"] = json!("n1-standard-8");
    t4["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!("us-central1-a");
    t4["metadata"]["labels"]["team"] = json!("vision");
    t4["spec"]["providerID"] = json!("gce://qa-proj/us-central1-a/qa-mig-worker-gpu-1");
    let api = FakeApi::start(vec![t4]).await;
    let c = collector(&api, &tempdir("cloud"), "cluster = \"gke-qa\"");
    let h = host_counts(&run(&c).await)
        .remove("qa-mig-worker-gpu-1")
        .unwrap();
    assert_eq!(h.cloud, Some(Cloud::Gcp));
    assert_eq!(h.region.as_deref(), Some("us-central1"));
    assert_eq!(h.instance_type.as_deref(), Some("n1-standard-8"));
    assert_eq!(h.cluster.as_deref(), Some("gke-qa"));
    assert_eq!(h.labels.get("team").map(String::as_str), Some("vision"));
    assert_eq!(
        h.labels.get("instance_id").map(String::as_str),
        Some("qa-mig-worker-gpu-1"),
        "from the providerID, for billing exports"
    );
}

#[tokio::test]
async fn watch_an_unreachable_api_server_is_a_clear_transient_error() {
    let dir = tempdir("down");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kc = dir.join("kc");
    std::fs::write(
        &kc,
        format!("apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters:\n- name: x\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: x\n  context:\n    cluster: x\n    user: u\nusers:\n- name: u\n  user: {{}}\n"),
    )
    .unwrap();
    let c = KubernetesCollector::from_toml(
        "x",
        &format!("kubeconfig = \"{}\"\nsync_timeout_secs = 2", kc.display()),
    )
    .unwrap();
    match c.run().await {
        Err(CollectError::Transient(m)) => {
            assert!(
                m.contains("did not list nodes, pods and namespaces within 2s"),
                "{m}"
            )
        }
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("collected from nothing"),
    }
}

// ---------------------------------------------------------------------------------------------
// load_*

/// Runs read the watch caches: in steady state the API server sees only watch renewals, one
/// per resource per `watch_timeout_secs` (290 s by default). Prints the measured figure.
#[tokio::test]
async fn load_steady_state_is_watch_renewals_only() {
    let Some(objects) = cluster_objects() else {
        return;
    };
    let api = FakeApi::start(objects).await;
    let timeout_secs = 2u64;
    let c = collector(
        &api,
        &tempdir("load"),
        &format!("watch_timeout_secs = {timeout_secs}"),
    );
    run(&c).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = Instant::now();
    let before = api.requests().len();
    for _ in 0..30 {
        run(&c).await;
    }
    assert_eq!(api.requests().len(), before, "a run sends no request");
    let window = Duration::from_secs(8);
    tokio::time::sleep(window.saturating_sub(start.elapsed())).await;
    let n = api.requests_since(start);
    let expected = 3.0 * window.as_secs_f64() / timeout_secs as f64;
    assert!(
        (n as f64) >= expected - 3.0 && (n as f64) <= expected + 3.0,
        "{n} requests in {window:?}, expected about {expected}: {:?}",
        api.requests()
    );
    let per_min_at_default = n as f64 / window.as_secs_f64() * timeout_secs as f64 / 290.0 * 60.0;
    println!(
        "steady state: {n} requests in {}s with watch_timeout_secs = {timeout_secs} (all watch \
         renewals, 30 runs added none) = {per_min_at_default:.2} requests/min at the default 290 s",
        window.as_secs()
    );
}
