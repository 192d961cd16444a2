//! The binary as a user runs it: real processes, a real SQLite file, real HTTP.
//!
//! Map: `serve_*` the hub end to end; `token_*` minting; `config_*` check-config and collect;
//! `demo_*` the simulated fleet.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;

use common::{bin, serve_file, serve_in, token, Server};

fn tempdir(name: &str) -> PathBuf {
    common::tempdir("cli", name)
}

/// Start `gpuledger serve` on a free port and return it with its base URL.
fn serve(dir: &Path, extra: &[&str]) -> (Server, String) {
    serve_with_env(dir, extra, &[])
}

/// [`serve`] with extra environment variables.
fn serve_with_env(dir: &Path, extra: &[&str], env: &[(&str, String)]) -> (Server, String) {
    let (server, url) = serve_in(dir, extra, env);
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    (server, url)
}

#[tokio::test]
async fn serve_default_sqlite_file_push_and_query() {
    let dir = tempdir("serve");
    let tok = token(&dir, &["--source", "cron", "--team", "nlp"]);
    assert!(tok.starts_with("glt_"), "{tok}");
    assert!(
        dir.join("gpuledger.db").exists(),
        "default database is gpuledger.db in the working directory"
    );
    let (_server, base) = serve(&dir, &[]);
    let now = chrono::Utc::now();
    let body = serde_json::json!({
        "gpus": [{"uuid": "GPU-11111111-2222-3333-4444-555555555555", "model": "NVIDIA L4",
                  "host": "h1", "labels": {"team": "nlp", "env": "dev"}, "observed_at": now}],
        "samples": [{"gpu_uuid": "GPU-11111111-2222-3333-4444-555555555555", "ts": now, "util_pct": 12.5}]
    });
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("{base}/api/v1/ingest"))
        .bearer_auth(&tok)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let gpus: serde_json::Value = client
        .get(format!("{base}/api/v1/gpus"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(gpus["items"][0]["team"], "nlp");
    assert_eq!(gpus["items"][0]["rate_origin"], "built-in default (L4)");
    let summary: serde_json::Value = client
        .get(format!("{base}/api/v1/summary?group_by=env"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(summary["groups"][0]["key"], "dev");
    assert_eq!(summary["total"]["avg_activity_pct"], 12.5);
    let html = client
        .get(format!("{base}/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("Fleet overview"));
    assert!(!html.contains("Demo data"));
}

#[tokio::test]
async fn serve_takes_database_and_config_from_environment() {
    let dir = tempdir("env");
    std::fs::write(dir.join("g.toml"), "[auth]\nread_requires_token = true\n").unwrap();
    let db = format!("sqlite://{}/other.db", dir.display());
    let config = dir.join("g.toml").display().to_string();
    let (server, base) = serve_with_env(
        &dir,
        &[],
        &[("GPULEDGER_DATABASE_URL", db), ("GPULEDGER_CONFIG", config)],
    );
    assert!(dir.join("other.db").exists());
    let status = reqwest::get(format!("{base}/api/v1/gpus"))
        .await
        .unwrap()
        .status();
    assert_eq!(
        status.as_u16(),
        401,
        "the config's read_requires_token applies"
    );
    drop(server);
}

#[test]
fn config_check_reports_every_problem_with_its_location() {
    let dir = tempdir("config");
    let good = dir.join("good.toml");
    std::fs::write(&good, "listen = \"127.0.0.1:9000\"\n[rates]\nH100 = 9.5\n").unwrap();
    let out = bin().arg("check-config").arg(&good).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("ok (0 collector(s), 1 rate override(s), 0 instance price(s)"));
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "listen = 8080\n[retention]\nraw_days = 0\nkeep = true\n",
    )
    .unwrap();
    let out = bin().arg("check-config").arg(&bad).output().unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with("bad.toml:1:10: listen: must be a string")),
        "{text}"
    );
    assert!(
        lines.iter().any(
            |l| l.contains("bad.toml:3:12: retention.raw_days: must be within 1..=3650, got 0")
        ),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("bad.toml:4:1: retention.keep: unknown key")),
        "{text}"
    );
}

#[test]
fn config_collect_with_zero_collectors_says_so() {
    let dir = tempdir("collect");
    let cfg = dir.join("c.toml");
    std::fs::write(&cfg, "# no collectors yet\n").unwrap();
    let out = bin()
        .args(["collect", "--once", "--dry-run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no collectors configured"));
    std::fs::write(&cfg, "[[collectors]]\ntype = \"lsf\"\nname = \"rdu\"\n").unwrap();
    let out = bin()
        .args(["collect", "--once", "--dry-run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown collector type `lsf`"));
}

#[test]
fn demo_loads_through_ingest_and_summarizes() {
    let dir = tempdir("demo");
    let db = format!("sqlite://{}/demo.db", dir.display());
    let out = bin()
        .args(["demo", "--days", "2", "--load-only", "--database-url", &db])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["total"]["gpus"], 450);
    let teams: Vec<&str> = s["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["key"].as_str().unwrap())
        .collect();
    assert_eq!(teams.len(), 9, "eight teams and unowned: {teams:?}");
    assert!(teams.contains(&"unowned"));
    let t = &s["total"];
    assert!(t["idle_hours"].as_i64().unwrap() > 0 && t["unknown_hours"].as_i64().unwrap() > 0);
    assert!(t["allocated_idle_hours"].as_i64().unwrap() > 0);
}

/// `gpuledger bench` (docs/benchmarks.md) at its smallest: one copy of the demo fleet over a
/// day, every page timed once, then the pages again with `--no-load`, a short live stream of
/// pushes over HTTP (which fails unless every streamed sample is stored as new) and the
/// billing export imported again (`--billing-again`). It measures; this only checks that it
/// runs and reports every part.
#[test]
fn bench_loads_a_scaled_fleet_and_times_every_page() {
    let dir = tempdir("bench");
    let db = format!("sqlite://{}/bench.db", dir.display());
    let run = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--gpus",
            "400",
            "--days",
            "1",
            "--requests",
            "1",
            "--database-url",
            &db,
        ];
        args.extend_from_slice(extra);
        let out = bin().args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let text = run(&[]);
    assert!(
        text.contains("fleet: 450 GPUs on 93 hosts, 1 days"),
        "{text}"
    );
    assert!(
        text.contains("samples/s") && text.contains("bytes per GPU-hour"),
        "{text}"
    );
    for page in [
        "overview",
        "waste, 90 days",
        "api used-by, team nlp",
        "api savings",
        "api forecast, team nlp",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(page)),
            "{page} missing: {text}"
        );
    }
    let again = run(&[
        "--no-load",
        "--stream",
        "3",
        "--stream-batch",
        "2",
        "--stream-every",
        "20",
        "--billing-again",
    ]);
    assert!(
        !again.contains("load:") && again.contains("overview"),
        "{again}"
    );
    for import in [
        "the same export, forced",
        "its last day corrected",
        "without its last day",
        "with one more day",
    ] {
        assert!(
            again
                .lines()
                .any(|l| l.starts_with(&format!("billing again, {import}: "))),
            "{import} missing: {again}"
        );
    }
    // Three minutes of 400-odd GPUs on the four live sources, two minutes a push: eight pushes,
    // three samples a GPU and minute.
    assert!(
        again.lines().any(|l| l.starts_with("stream: ")
            && l.contains("(3 minutes, 2 a push, one a GPU every 20 s) in 8 pushes")),
        "{again}"
    );
}

/// Whether `tool` is an executable on PATH.
fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .any(|d| d.join(tool).is_file())
}

/// `scripts/bench-prometheus.sh` (docs/benchmarks.md) at its smallest: the bench's OpenMetrics
/// file must backfill with promtool, and the per-team answers of a real Prometheus must equal
/// gpuledger's. Checked twice: the bench fails when they differ, and here from its table.
#[test]
fn bench_prometheus_script_backfills_and_agrees_per_team() {
    if !["prometheus", "promtool", "curl"]
        .iter()
        .all(|t| on_path(t))
    {
        if std::env::var_os("GPULEDGER_REQUIRE_PROMETHEUS").is_some() {
            panic!("GPULEDGER_REQUIRE_PROMETHEUS is set but prometheus, promtool or curl is not on PATH; install Debian's `prometheus` package");
        }
        eprintln!("skipped: bench_prometheus_script_backfills_and_agrees_per_team (no prometheus/promtool/curl on PATH)");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bench-prometheus.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["--gpus", "450", "--days", "2", "--requests", "1"])
        .env("GPULEDGER_BIN", env!("CARGO_BIN_EXE_gpuledger"))
        .env("TMPDIR", tempdir("bench-prometheus"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("promtool backfill:"), "{text}");
    assert!(text.contains("freshness: a sample pushed for"), "{text}");
    assert!(
        text.contains("ratio, Prometheus's time over gpuledger's:"),
        "{text}"
    );
    // The table: team, GPU-hours, unknown, measured, PromQL's GPU-hours, idle, PromQL's idle,
    // average activity, PromQL's average activity.
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("team "))
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with("agree:"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 9, "eight teams and unowned: {text}");
    let mut unknown = 0;
    for r in &rows {
        let n = |i: usize| r[i].parse::<i64>().unwrap();
        assert_eq!(n(1) - n(2), n(3), "{r:?}");
        assert_eq!(n(3), n(4), "Prometheus's GPU-hours differ: {r:?}");
        assert_eq!(n(5), n(6), "Prometheus's idle hours differ: {r:?}");
        assert_eq!(r[7], r[8], "Prometheus's average activity differs: {r:?}");
        assert!(n(3) > 0, "{r:?}");
        unknown += n(2);
    }
    assert!(unknown > 0, "the fleet has unmeasured hours: {text}");
    assert!(text.contains("agree: for every team"), "{text}");
}

#[tokio::test]
async fn serve_runs_a_configured_dcgm_collector() {
    let file = corpus_dir().join("dcgm/aws-kops-nvidia-l4-full-scrape.prom");
    let Ok(scrape) = std::fs::read_to_string(&file) else {
        eprintln!(
            "skipped: serve_runs_a_configured_dcgm_collector (no corpus at {})",
            file.display()
        );
        return;
    };
    let dir = tempdir("collector");
    let endpoint = serve_file(scrape);
    std::fs::write(
        dir.join("g.toml"),
        format!("[[collectors]]\ntype = \"dcgm\"\nname = \"dcgm-lab\"\ninterval_secs = 10\nendpoints = [\"{endpoint}\"]\n"),
    )
    .unwrap();
    let (_server, base) = serve(&dir, &["--config", "g.toml"]);
    let mut gpus = serde_json::Value::Null;
    // Polls for the collector's first run: up to 30 s, for a machine busy with other tests.
    for _ in 0..150 {
        gpus = reqwest::get(format!("{base}/api/v1/gpus"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if gpus["count"] == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(gpus["items"][0]["model"], "NVIDIA L4", "{gpus}");
    assert_eq!(gpus["items"][0]["source"], "dcgm-lab");
    let sources: serde_json::Value = reqwest::get(format!("{base}/api/v1/sources"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(sources["items"][0]["kind"], "dcgm");
    assert_eq!(sources["items"][0]["status"], "ok");
    // The run is counted on the server's own metrics.
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            r#"gpuledger_collector_runs_total{source="dcgm-lab",kind="dcgm",outcome="ok"}"#
        ),
        "{metrics}"
    );
}

/// The fake Kubernetes API server of the collect crate's tests: no real API server can run
/// here, so it serves the corpus's recorded Node and Pod objects as list and watch responses.
#[path = "../../collect/tests/support/kube_api.rs"]
mod kube_api;

/// The corpus root: `$GPULEDGER_CORPUS`, else `<repo>/../shared/fixtures`. Tests skip what it
/// lacks, unless `GPULEDGER_REQUIRE_CORPUS` is set: then a missing corpus fails here.
fn corpus_dir() -> PathBuf {
    let dir = std::env::var_os("GPULEDGER_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures")
        });
    if std::env::var_os("GPULEDGER_REQUIRE_CORPUS").is_some() {
        for sub in ["dcgm", "kubernetes", "billing"] {
            assert!(
                dir.join(sub).is_dir(),
                "GPULEDGER_REQUIRE_CORPUS is set but there is no corpus at {}; set GPULEDGER_CORPUS to the fixtures folder",
                dir.join(sub).display()
            );
        }
    }
    dir
}

fn corpus_yaml(rel: &str) -> Option<serde_json::Value> {
    let path = corpus_dir().join(rel);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if std::env::var_os("GPULEDGER_REQUIRE_CORPUS").is_some() => {
            panic!(
                "GPULEDGER_REQUIRE_CORPUS is set but {}: {e}",
                path.display()
            )
        }
        Err(_) => return None,
    };
    Some(serde_yaml::from_str(&text).unwrap())
}

fn kubernetes_entry(name: &str, kubeconfig: &Path) -> String {
    format!(
        "[[collectors]]\ntype = \"kubernetes\"\nname = \"{name}\"\ninterval_secs = 10\nkubeconfig = \"{}\"\nteam_keys = [\"team\", \"project\"]\n",
        kubeconfig.display()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn config_collect_dry_run_reads_a_kubernetes_api() {
    let (Some(t4), Some(a100), Some(pod)) = (
        corpus_yaml("kubernetes/node-tesla-t4-2gpu-gke.yaml"),
        corpus_yaml("kubernetes/node-a100-sxm4-40gb-mig-mixed-gke.yaml"),
        corpus_yaml("kubernetes/pod-runai-mig-1g5gb.yaml"),
    ) else {
        eprintln!("skipped: config_collect_dry_run_reads_a_kubernetes_api (no corpus)");
        return;
    };
    let api = kube_api::FakeApi::start(vec![t4, a100, pod]).await;
    let dir = tempdir("k8s-dry-run");
    let kc = api.kubeconfig(&dir);
    std::fs::write(dir.join("g.toml"), kubernetes_entry("qa-cluster", &kc)).unwrap();
    let out = tokio::task::spawn_blocking(move || {
        bin()
            .args(["collect", "--once", "--dry-run", "--config"])
            .arg(dir.join("g.toml"))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut counts: Vec<(&str, u64)> = lines
        .iter()
        .filter(|o| o["kind"] == "host_gpu_count")
        .map(|o| {
            (
                o["gpus"]["host"].as_str().unwrap(),
                o["gpus"]["count"].as_u64().unwrap(),
            )
        })
        .collect();
    counts.sort();
    assert_eq!(
        counts,
        vec![("qa-mig-worker-gpu-1", 2), ("qa-mig-worker-gpu-a100", 1)]
    );
    let alloc = lines.iter().find(|o| o["kind"] == "allocation").unwrap();
    assert_eq!(
        alloc["allocation"]["gpu_uuid"],
        "placeholder:qa-mig-worker-gpu-a100:0"
    );
    assert_eq!(alloc["allocation"]["workload"], "runai-team-a/job-2-0-0");
    assert_eq!(alloc["allocation"]["owner"], "RunaiJob/job-2");
    // Read-only: only GETs of the three resources.
    assert!(api
        .requests()
        .iter()
        .all(|(r, _)| ["nodes", "pods", "namespaces"].contains(&r.as_str())));
}

/// Identity merge: a node seen by Kubernetes (placeholders) and the same host's dcgm-exporter
/// (UUIDs, with the exporter pod's name as `Hostname`) end as one set of real GPUs, with the
/// pod's allocation on the GPU dcgm-exporter saw it on.
#[tokio::test(flavor = "multi_thread")]
async fn serve_merges_kubernetes_placeholders_with_dcgm_uuids() {
    let (Some(t4), Some(mut pod), Ok(scrape)) = (
        corpus_yaml("kubernetes/node-tesla-t4-2gpu-gke.yaml"),
        corpus_yaml("kubernetes/pod-runai-reservation-nvidia-gpu-1.yaml"),
        std::fs::read_to_string(corpus_dir().join("dcgm/k8s-tesla-t4-2gpu-pod-labels.prom")),
    ) else {
        eprintln!("skipped: serve_merges_kubernetes_placeholders_with_dcgm_uuids (no corpus)");
        return;
    };
    // Edited by this test to be the pod the T4 scrape names, on the T4 node, started an hour ago.
    pod["metadata"]["name"] = "runai-reservation-gpu-qa-mig-worker-gpu-1-kvltw".into();
    pod["spec"]["nodeName"] = "qa-mig-worker-gpu-1".into();
    let started = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    pod["status"]["startTime"] = started.into();
    // Written by this test: the exporter pod whose name the scrape carries in `Hostname`.
    let exporter = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "nvidia-dcgm-exporter-s228n", "namespace": "gpu-operator", "uid": "e1",
        "labels": {"app": "nvidia-dcgm-exporter"}},
        "spec": {"nodeName": "qa-mig-worker-gpu-1", "containers": [{"name": "nvidia-dcgm-exporter"}]}});
    let api = kube_api::FakeApi::start(vec![t4, pod, exporter]).await;
    let dir = tempdir("k8s-merge");
    let kc = api.kubeconfig(&dir);
    let endpoint = serve_file(scrape);
    std::fs::write(
        dir.join("g.toml"),
        format!(
            "{}\n[[collectors]]\ntype = \"dcgm\"\nname = \"dcgm-qa\"\ninterval_secs = 10\nendpoints = [\"{endpoint}\"]\n",
            kubernetes_entry("qa-cluster", &kc)
        ),
    )
    .unwrap();
    let (_server, base) = serve(&dir, &["--config", "g.toml"]);
    let get = |path: String| async move {
        reqwest::get(path)
            .await
            .unwrap()
            .json::<serde_json::Value>()
            .await
            .unwrap()
    };
    let on = |detail: &serde_json::Value, source: &str| -> Vec<String> {
        detail["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["source"] == source)
            .map(|a| a["workload"].as_str().unwrap().to_string())
            .collect()
    };
    let pod_name = "runai-reservation/runai-reservation-gpu-qa-mig-worker-gpu-1-kvltw";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    loop {
        let gpus = get(format!("{base}/api/v1/gpus")).await;
        let busy = get(format!(
            "{base}/api/v1/gpus/GPU-7a2e92f2-be71-d37e-a744-541600ffc722"
        ))
        .await;
        let free = get(format!(
            "{base}/api/v1/gpus/GPU-5f587dd4-6505-0873-c6db-8324dbfe5ba9"
        ))
        .await;
        let items = gpus["items"].as_array().cloned().unwrap_or_default();
        let merged = items.len() == 2
            && items.iter().all(|g| {
                g["placeholder"] == false
                    && g["host"] == "qa-mig-worker-gpu-1"
                    && g["cluster"] == "qa-cluster"
                    && g["model"] == "Tesla T4"
            });
        if merged
            && on(&busy, "qa-cluster") == [pod_name]
            && on(&busy, "dcgm-qa") == [pod_name]
            && on(&free, "qa-cluster").is_empty()
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not merged: {gpus}\nbusy: {busy}\nfree: {free}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// Load `days` of the demo fleet into a SQLite file in `dir`.
fn demo_db(dir: &Path, days: u32) -> PathBuf {
    let db = dir.join("demo.db");
    let out = bin()
        .args([
            "demo",
            "--load-only",
            "--days",
            &days.to_string(),
            "--database-url",
        ])
        .arg(&db)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    db
}

/// `import billing`: the corpus FOCUS sample (no GPU spend in it) and a file written here with
/// GPU lines for two demo hosts and one unknown instance, against the demo fleet.
#[test]
fn import_billing_reconciles_focus_lines_with_gpus() {
    let dir = tempdir("billing");
    let db = demo_db(&dir, 3);
    let import_raw = |file: &Path| {
        bin()
            .args(["import", "billing"])
            .arg(file)
            .arg("--database-url")
            .arg(&db)
            .output()
            .unwrap()
    };
    let import = |file: &Path| {
        let out = import_raw(file);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        println!("{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let sample = corpus_dir().join("billing/focus-1.0-sample-subset.csv");
    if sample.is_file() {
        let r = import(&sample);
        assert_eq!(r["lines"], 198);
        assert_eq!(
            r["gpu_lines"], 0,
            "the sample bills SQS, ELB, c5/m5/t2 instances, storage"
        );
        assert!(r["unmatched"].as_array().unwrap().is_empty());
    } else {
        eprintln!("skipped: the corpus FOCUS sample (no corpus)");
    }
    let day = (chrono::Utc::now() - chrono::Duration::days(1)).format("%Y-%m-%d 00:00:00");
    let file = dir.join("gpu.csv");
    std::fs::write(
        &file,
        format!(
            "BillingPeriodStart,ChargePeriodStart,BilledCost,EffectiveCost,ResourceId,ChargeDescription,ServiceName,ProviderName\n\
             x,{day},2359.68,1500.00,arn:aws:ec2:us-east-1:1:instance/ip-10-1-0-01,$98.32 per On Demand Linux p5.48xlarge Instance Hour,Amazon Elastic Compute Cloud,AWS\n\
             x,{day},786.54,786.54,ip-10-1-0-02,$98.32 per On Demand Linux p5.48xlarge Instance Hour,Amazon Elastic Compute Cloud,AWS\n\
             x,{day},0.20,0.20,ip-10-1-0-01,$0.09 per GB data transfer out,Amazon Elastic Compute Cloud,AWS\n\
             x,{day},24.14,24.14,i-0unknown,$1.006 per On Demand Linux g5.xlarge Instance Hour,Amazon Elastic Compute Cloud,AWS\n\
             x,{day},oops,1,i-0bad,,,AWS\n"
        ),
    )
    .unwrap();
    let r = import(&file);
    assert_eq!(
        (
            r["lines"].as_u64(),
            r["gpu_lines"].as_u64(),
            r["matched_lines"].as_u64()
        ),
        (Some(4), Some(3), Some(2))
    );
    assert_eq!(r["unmatched"][0]["resource_id"], "i-0unknown");
    assert!(r["problems"][0]
        .as_str()
        .unwrap()
        .ends_with(":6: BilledCost: `oops` is not a number"));
    let gpus = r["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 16, "8 GPUs on each of the two p5 hosts");
    let billed: f64 = gpus.iter().map(|g| g["billed_usd"].as_f64().unwrap()).sum();
    assert!(
        (billed - 2286.54).abs() < 0.05,
        "EffectiveCost of the two hosts: {billed}"
    );
    for g in gpus {
        let (e, b, d) = (
            g["estimated_usd"].as_f64().unwrap(),
            g["billed_usd"].as_f64().unwrap(),
            g["difference_usd"].as_f64().unwrap(),
        );
        assert!((b - e - d).abs() < 0.011, "{g}");
    }
    assert!(!r["teams"].as_array().unwrap().is_empty());
    // Kept: importing the same file again changes nothing.
    let out = import_raw(&file);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("nothing changed"), "{said}");
    // Not a FOCUS export: refused whole, with what is missing.
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "a,b\n1,2\n").unwrap();
    let out = import_raw(&bad);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("ChargePeriodStart"), "{said}");
}

/// `serve` with a `billing` collector: a gzip FOCUS export delivered into a BILLING_PERIOD
/// folder is found, reconciled against a pushed GPU and kept; the API lists it and the
/// summary shows what was billed beside the estimate.
#[tokio::test]
async fn serve_reconciles_billing_exports_a_folder_collector_finds() {
    use std::io::Write;
    let dir = tempdir("billing-collector");
    // First a GPU on host ip-10-9-9-9, present all of yesterday (hourly samples).
    let tok = token(&dir, &["--source", "cron"]);
    let yesterday = chrono::Utc::now().date_naive() - chrono::Days::new(1);
    let day0 = yesterday.and_hms_opt(0, 0, 0).unwrap().and_utc();
    let uuid = "GPU-99999999-0000-0000-0000-000000000001";
    let samples: Vec<serde_json::Value> = (0..24)
        .map(|h| {
            serde_json::json!({"gpu_uuid": uuid, "util_pct": 50,
                "ts": day0 + chrono::Duration::minutes(h * 60 + 30)})
        })
        .collect();
    let body = serde_json::json!({
        "gpus": [{"uuid": uuid, "model": "NVIDIA H100 80GB HBM3", "host": "ip-10-9-9-9",
                  "cloud": "aws", "instance_type": "p5.48xlarge", "labels": {"team": "nlp"},
                  "observed_at": day0}],
        "samples": samples
    });
    {
        let (_server, base) = serve(&dir, &[]);
        let resp = reqwest::Client::new()
            .post(format!("{base}/api/v1/ingest"))
            .bearer_auth(&tok)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
    }
    let period = dir.join(format!(
        "exports/BILLING_PERIOD={}",
        yesterday.format("%Y-%m")
    ));
    std::fs::create_dir_all(&period).unwrap();
    let csv = format!(
        "ChargePeriodStart,ChargePeriodEnd,BilledCost,EffectiveCost,ResourceId,ChargeDescription,ServiceName,ProviderName\n\
         {d}T00:00:00Z,{next}T00:00:00Z,2359.68,1500.00,arn:aws:ec2:us-east-1:1:instance/ip-10-9-9-9,$98.32 per On Demand Linux p5.48xlarge Instance Hour,Amazon Elastic Compute Cloud,AWS\n\
         {d}T00:00:00Z,{next}T00:00:00Z,24.14,24.14,i-0unknown,$1.006 per On Demand Linux g5.xlarge Instance Hour,Amazon Elastic Compute Cloud,AWS\n",
        d = yesterday.format("%Y-%m-%d"),
        next = (yesterday + chrono::Days::new(1)).format("%Y-%m-%d"),
    );
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(csv.as_bytes()).unwrap();
    std::fs::write(period.join("part-0001.csv.gz"), gz.finish().unwrap()).unwrap();
    std::fs::write(period.join("manifest.json"), "{}").unwrap();
    std::fs::write(
        dir.join("g.toml"),
        "[[collectors]]\ntype = \"billing\"\nname = \"aws-focus\"\ndir = \"exports\"\nsettle_secs = 0\ninterval_secs = 10\n",
    )
    .unwrap();
    let (_server, base) = serve(&dir, &["--config", "g.toml"]);
    let mut files = serde_json::Value::Null;
    for _ in 0..100 {
        files = reqwest::get(format!("{base}/api/v1/billing"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if files["items"].as_array().is_some_and(|i| !i.is_empty()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let items = files["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "only the export, not the manifest: {files}");
    let f = &items[0];
    assert!(
        f["name"].as_str().unwrap().ends_with("part-0001.csv.gz"),
        "{f}"
    );
    assert_eq!(f["report"]["matched_lines"], 1, "{f}");
    assert_eq!(f["report"]["gpus"][0]["uuid"], uuid);
    assert_eq!(f["report"]["unmatched"][0]["resource_id"], "i-0unknown");
    let summary: serde_json::Value = reqwest::get(format!("{base}/api/v1/summary?range=3d"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let total = &summary["total"];
    // Yesterday's 24 hours are billed; today's hours so far are estimates only.
    assert_eq!(total["cost_basis"], "partly_reconciled", "{total}");
    assert_eq!(total["billed_gpu_hours"], 24, "{total}");
    assert_eq!(total["billed_usd"], 1500.0, "{total}");
    assert_eq!(total["billed_estimate_usd"], 24.0 * 12.29, "{total}");
    let sources: serde_json::Value = reqwest::get(format!("{base}/api/v1/sources"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let src = sources["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "aws-focus")
        .cloned()
        .unwrap();
    assert_eq!(
        (src["kind"].as_str(), src["status"].as_str()),
        (Some("billing"), Some("ok"))
    );
}

/// `reattribute --from DATE` re-decides owners with the config's current rules from DATE on;
/// a second run changes nothing, and a bad date is named.
#[test]
fn reattribute_applies_changed_rules_to_history_from_a_date() {
    let dir = tempdir("reattribute");
    let db = demo_db(&dir, 2);
    let cfg = dir.join("gpuledger.toml");
    std::fs::write(
        &cfg,
        "[[ownership.rules]]\nname = \"aws\"\nwhen = { cloud = \"aws\" }\nteam = \"platform\"\n",
    )
    .unwrap();
    let from = (chrono::Utc::now() - chrono::Duration::days(2))
        .format("%Y-%m-%d")
        .to_string();
    let run = |from: &str| {
        bin()
            .args(["reattribute", "--from", from, "--config"])
            .arg(&cfg)
            .arg("--database-url")
            .arg(&db)
            .output()
            .unwrap()
    };
    let out = run(&from);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let n: u64 = said
        .strip_prefix("re-attributed ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!(n > 0, "the demo has AWS GPUs owned by other teams: {said}");
    let again = String::from_utf8_lossy(&run(&from).stdout).to_string();
    assert!(again.starts_with("re-attributed 0 GPU(s)"), "{again}");
    let bad = run("last tuesday");
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("is neither a date (2026-11-01) nor an RFC 3339 time"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// Regression: check-config said "ok" for collector entries that `serve` refused or that failed
/// at every run, and a bad entry's own settings were never checked before it ran. Now it checks
/// every entry as `serve` builds it and names every problem; `serve` refuses the same ones.
#[test]
fn config_check_names_every_bad_collector_entry_as_serve_does() {
    let dir = tempdir("config-collectors");
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        "[[collectors]]\ntype = \"dcgm\"\nname = \"dcgm-lab\"\nendpoints = [\"not a url\"]\n\n\
         [[collectors]]\ntype = \"kubernetes\"\nname = \"rdu\"\nkubeconfig = \"/k\"\n\
         in_cluster = true\ninterval_secs = 5\n\n\
         [[collectors]]\ntype = \"billing\"\nname = \"focus\"\ndir = \"exports\"\n",
    )
    .unwrap();
    let out = bin().arg("check-config").arg(&cfg).output().unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for want in [
        "c.toml:1:1: collectors[0]: dcgm collector `dcgm-lab`: endpoints[0]: `not a url` is not a URL",
        "c.toml:6:1: collectors[1]: kubernetes collector `rdu`: set either `kubeconfig`",
        "c.toml:11:17: collectors[1].interval_secs: must be within 10..=3600, got 5",
    ] {
        assert!(lines.iter().any(|l| l.contains(want)), "{want}\n{text}");
    }
    assert!(!text.contains("focus"), "the good entry passes: {text}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("3 problem(s)"));

    // `serve` refuses the same file with the same problems, before it opens a database.
    let mut child = bin()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .current_dir(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve started with the bad collector entries");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("collector `dcgm-lab`: endpoints[0]")
            && err.contains("collector `rdu`: set either")
            && err.contains("collectors[1].interval_secs"),
        "{err}"
    );
}

/// Logs for collectors: `GPULEDGER_LOG_FORMAT=json` gives one JSON object per line, without
/// colour codes, and a database password never appears in a log line or an error.
#[test]
fn serve_logs_json_without_colours_or_passwords() {
    let dir = tempdir("logs");
    let mut child = bin()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "gl.db",
        ])
        .env("GPULEDGER_LOG_FORMAT", "json")
        .current_dir(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _server = Server(child);
    assert!(!line.contains('\u{1b}'), "colour codes in {line:?}");
    let log: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    assert_eq!(log["fields"]["message"], "gpuledger serving", "{log}");
    assert_eq!(log["level"], "INFO", "{log}");

    let out = bin()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args([
            "--database-url",
            "postgres://gl:s3cret@127.0.0.1:1/gpuledger?sslmode=bogus",
        ])
        .current_dir(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("opening database postgres://gl:***@127.0.0.1:1/gpuledger?sslmode=bogus"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
}

/// `token list | rotate | revoke` as an operator runs them: the list shows a token's last use
/// (and a token that never pushed), a rotated token stops working at once and its replacement
/// works, a revoked one gets 401 on its next request.
#[tokio::test]
async fn token_lifecycle_create_use_rotate_revoke() {
    let dir = tempdir("token-life");
    let tok = token(&dir, &["--source", "cron", "--team", "nlp"]);
    let idle = token(&dir, &["--source", "never-pushed", "--expires-in", "90d"]);
    assert!(idle.starts_with("glt_"));
    let (_server, base) = serve(&dir, &[]);
    let client = reqwest::Client::new();
    let push = |tok: String| {
        let client = client.clone();
        let base = base.clone();
        async move {
            let now = chrono::Utc::now();
            let body = serde_json::json!({
                "gpus": [{"uuid": "GPU-11111111-2222-3333-4444-555555555555", "model": "NVIDIA L4",
                          "host": "h1", "labels": {"team": "nlp"}, "observed_at": now}]});
            client
                .post(format!("{base}/api/v1/ingest"))
                .bearer_auth(&tok)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(push(tok.clone()).await, 200);
    let cli = |args: &[&str]| {
        let out = bin()
            .arg("token")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let listed: Vec<serde_json::Value> = cli(&["list", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["source"], "cron");
    assert_eq!(listed[0]["teams"], serde_json::json!(["nlp"]));
    assert_eq!(listed[0]["state"], "active");
    assert!(listed[0]["last_used_at"].is_i64(), "{}", listed[0]);
    assert!(
        listed[1]["last_used_at"].is_null(),
        "never pushed: {}",
        listed[1]
    );
    assert!(listed[1]["expires_at"].is_i64());
    let table = cli(&["list"]);
    assert!(
        table.contains("never-pushed") && table.contains("never"),
        "{table}"
    );

    let id = listed[0]["id"].to_string();
    let rotated = cli(&["rotate", &id]);
    assert!(
        rotated.contains(&format!("token {id} revoked")),
        "{rotated}"
    );
    let new = rotated.lines().last().unwrap().trim().to_string();
    assert_eq!(push(tok.clone()).await, 401, "the rotated-out token");
    assert_eq!(push(new.clone()).await, 200, "its replacement");

    let new_id = cli(&["list", "--json"])
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|t| t["state"] == "active" && t["source"] == "cron")
        .unwrap()["id"]
        .to_string();
    let revoked = cli(&["revoke", &new_id]);
    assert!(revoked.contains("its next request gets 401"), "{revoked}");
    assert_eq!(push(new).await, 401);
    let out = bin()
        .args(["token", "revoke", "4242"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no token with id 4242"));
}

/// The summary a server on `db` answers for a fixed window (so two servers compare exactly).
async fn fixed_summary(dir: &Path, db: &str) -> serde_json::Value {
    let (_server, base) = serve(dir, &["--database-url", db]);
    let to = chrono::Utc::now() - chrono::Duration::hours(2);
    let from = to - chrono::Duration::days(2);
    let fmt = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%dT%H:00:00Z").to_string();
    reqwest::get(format!(
        "{base}/api/v1/summary?group_by=team&from={}&to={}",
        fmt(from),
        fmt(to)
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap()
}

/// `gpuledger backup` copies a SQLite database while the server runs on it, and a server on
/// the copy answers the same figures; an existing file is never overwritten.
#[tokio::test]
async fn backup_round_trip_sqlite_while_serving() {
    let dir = tempdir("backup");
    let db = demo_db(&dir, 2);
    let db = db.to_str().unwrap().to_string();
    let (_live, _) = serve(&dir, &["--database-url", &db]);
    let copy = dir.join("copy.db");
    let out = bin()
        .args(["backup", copy.to_str().unwrap(), "--database-url", &db])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("and checked"), "{stdout}");
    let original = fixed_summary(&dir, &db).await;
    assert!(
        original["total"]["gpu_hours"].as_i64().unwrap() > 10_000,
        "{original}"
    );
    assert_eq!(fixed_summary(&dir, copy.to_str().unwrap()).await, original);
    let again = bin()
        .args(["backup", copy.to_str().unwrap(), "--database-url", &db])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr)
        .contains("exists; a backup is written to a new file"));
}

/// PostgreSQL's backup is pg_dump and its restore pg_restore, as docs/deploy.md shows: a
/// server on the restored database answers the same figures (partitions included).
#[tokio::test]
async fn backup_round_trip_postgres_with_pg_dump() {
    let Ok(url) = std::env::var("GPULEDGER_TEST_PG_URL") else {
        assert!(
            std::env::var_os("GPULEDGER_REQUIRE_POSTGRES").is_none(),
            "GPULEDGER_REQUIRE_POSTGRES is set but GPULEDGER_TEST_PG_URL is not"
        );
        eprintln!("skipped: set GPULEDGER_TEST_PG_URL");
        return;
    };
    let dir = tempdir("backup-pg");
    let base = url.rsplit_once('/').unwrap().0.to_string();
    let (src, dst) = (
        format!("gl_backup_src_{}", std::process::id()),
        format!("gl_backup_dst_{}", std::process::id()),
    );
    let psql = |sql: &str| {
        let out = Command::new("psql")
            .args([&url, "-v", "ON_ERROR_STOP=1", "-qAtc", sql])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for db in [&src, &dst] {
        psql(&format!("DROP DATABASE IF EXISTS {db}"));
        psql(&format!("CREATE DATABASE {db}"));
    }
    let (src_url, dst_url) = (format!("{base}/{src}"), format!("{base}/{dst}"));
    let out = bin()
        .args([
            "demo",
            "--load-only",
            "--days",
            "2",
            "--database-url",
            &src_url,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = dir.join("gpuledger.dump");
    for (tool, args) in [
        (
            "pg_dump",
            vec![
                "--format=custom",
                "--file",
                dump.to_str().unwrap(),
                &src_url,
            ],
        ),
        (
            "pg_restore",
            vec!["--no-owner", "--dbname", &dst_url, dump.to_str().unwrap()],
        ),
    ] {
        let out = Command::new(tool).args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{tool}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let original = fixed_summary(&dir, &src_url).await;
    assert!(
        original["total"]["gpu_hours"].as_i64().unwrap() > 10_000,
        "{original}"
    );
    assert_eq!(fixed_summary(&dir, &dst_url).await, original);
    let refused = bin()
        .args([
            "backup",
            dir.join("x.db").to_str().unwrap(),
            "--database-url",
            &src_url,
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("back it up with pg_dump"));
    for db in [&src, &dst] {
        psql(&format!("DROP DATABASE IF EXISTS {db}"));
    }
}

/// [`serve_file`], counting the requests it answers.
fn serve_file_counting(body: String) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let counter = hits.clone();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (format!("http://{addr}/metrics"), hits)
}

/// Two `serve` replicas on one PostgreSQL database (a fresh schema, named in the URL's
/// `options`) with the same dcgm collector, each pointed at its own copy of the scrape so that
/// each copy's requests say which replica collected: only one collects, both answer with what
/// it stored, and when it is killed (SIGKILL, no goodbye to the database) the other takes the
/// collectors over. Prints the failover time.
#[tokio::test]
async fn serve_replicas_collect_in_one_and_fail_over_when_it_is_killed() {
    use std::sync::atomic::Ordering;
    let name = "serve_replicas_collect_in_one_and_fail_over_when_it_is_killed";
    let Ok(pg) = std::env::var("GPULEDGER_TEST_PG_URL") else {
        assert!(
            std::env::var_os("GPULEDGER_REQUIRE_POSTGRES").is_none(),
            "GPULEDGER_REQUIRE_POSTGRES is set but GPULEDGER_TEST_PG_URL is not ({name})"
        );
        eprintln!("skipped: {name} (set GPULEDGER_TEST_PG_URL to run it)");
        return;
    };
    let file = corpus_dir().join("dcgm/aws-kops-nvidia-l4-full-scrape.prom");
    let Ok(scrape) = std::fs::read_to_string(&file) else {
        eprintln!("skipped: {name} (no corpus at {})", file.display());
        return;
    };
    let schema = format!("cli_replicas_{}", std::process::id());
    gpuledger_store::Store::drop_schema(&pg, &schema)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {pg} (GPULEDGER_TEST_PG_URL): {e}"));
    // Made and migrated here: the replicas open it through the URL's search_path.
    gpuledger_store::Store::open_in_schema(&pg, Some(&schema), Default::default())
        .await
        .unwrap()
        .close()
        .await;
    let sep = if pg.contains('?') { '&' } else { '?' };
    let url = format!("{pg}{sep}options=-csearch_path%3D{schema}");

    let dir = tempdir("replicas");
    let retry_secs = 0.5;
    let start = |replica: &str| {
        let (endpoint, hits) = serve_file_counting(scrape.clone());
        std::fs::write(
            dir.join(format!("{replica}.toml")),
            format!("[[collectors]]\ntype = \"dcgm\"\nname = \"dcgm-lab\"\ninterval_secs = 10\nendpoints = [\"{endpoint}\"]\n"),
        )
        .unwrap();
        let (server, base) = serve_with_env(
            &dir,
            &["--config", &format!("{replica}.toml")],
            &[
                ("GPULEDGER_DATABASE_URL", url.clone()),
                ("GPULEDGER_LEASE_RETRY_SECS", retry_secs.to_string()),
            ],
        );
        (server, base, hits)
    };
    let wait_for = |what: &str, secs: u64, hits: &std::sync::atomic::AtomicUsize| {
        let t = std::time::Instant::now();
        while hits.load(Ordering::SeqCst) == 0 {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(secs),
                "{what} within {secs} s"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };

    let (mut a, _, hits_a) = start("a");
    wait_for("the first replica collects", 30, &hits_a);
    let (_b, base_b, hits_b) = start("b");
    // Ten of the follower's tries: it never collects while the leader lives, yet answers with
    // what the leader stored.
    tokio::time::sleep(std::time::Duration::from_secs_f64(retry_secs * 10.0)).await;
    assert_eq!(hits_b.load(Ordering::SeqCst), 0, "only the leader collects");
    let gpus: serde_json::Value = reqwest::get(format!("{base_b}/api/v1/gpus"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(gpus["items"][0]["source"], "dcgm-lab", "{gpus}");

    a.0.kill().unwrap();
    let killed = std::time::Instant::now();
    a.0.wait().unwrap();
    wait_for("the other replica takes over", 30, &hits_b);
    eprintln!(
        "failover: the follower collected {} ms after the leader was killed (lease retry {retry_secs} s)",
        killed.elapsed().as_millis()
    );
    let sources: serde_json::Value = reqwest::get(format!("{base_b}/api/v1/sources"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(sources["items"][0]["name"], "dcgm-lab", "{sources}");
    drop(a);
    let _ = gpuledger_store::Store::drop_schema(&pg, &schema).await;
}

/// HTTPS natively: `[server] tls_cert`/`tls_key` serve a push and a read over TLS (plain HTTP
/// on the same port gets nothing), and a renewed certificate written over the files is served
/// from the next connection on, without a restart.
#[tokio::test]
async fn serve_https_and_reload_a_renewed_certificate() {
    let dir = tempdir("tls");
    let make_cert = |name: &str| -> Vec<u8> {
        let (crt, key) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        let out = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args(["-nodes", "-days", "2", "-subj", &format!("/CN={name}")])
            .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
            .args(["-addext", "basicConstraints=critical,CA:FALSE"])
            .args(["-addext", "extendedKeyUsage=serverAuth"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&crt)
            .output()
            .expect("openssl (Debian package openssl) makes the test certificates");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Put in place as a renewal does: write beside, then rename over.
        for (from, to) in [(&crt, "tls.crt"), (&key, "tls.key")] {
            let tmp = dir.join(format!("{to}.new"));
            std::fs::copy(from, &tmp).unwrap();
            std::fs::rename(&tmp, dir.join(to)).unwrap();
        }
        std::fs::read(&crt).unwrap()
    };
    let first = make_cert("first");
    let cfg = dir.join("gpuledger.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
            dir.join("tls.crt").display(),
            dir.join("tls.key").display()
        ),
    )
    .unwrap();
    let token = token(&dir, &["--source", "cron"]);
    let (_server, base) = serve_in(&dir, &["--config", cfg.to_str().unwrap()], &[]);
    assert!(base.starts_with("https://127.0.0.1:"), "{base}");
    let trusting = |pem: &[u8]| {
        reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(pem).unwrap())
            .build()
            .unwrap()
    };
    let now = chrono::Utc::now();
    let body = serde_json::json!({
        "gpus": [{"uuid": "GPU-11111111-2222-3333-4444-555555555555", "model": "NVIDIA L4",
                  "host": "h1", "observed_at": now}]});
    let resp = trusting(&first)
        .post(format!("{base}/api/v1/ingest"))
        .bearer_auth(&token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Plain HTTP to the HTTPS port gets no answer.
    let plain = base.replacen("https://", "http://", 1);
    assert!(reqwest::get(format!("{plain}/healthz")).await.is_err());

    let second = make_cert("second");
    let gpus = trusting(&second)
        .get(format!("{base}/api/v1/gpus"))
        .send()
        .await
        .expect("the renewed certificate is served without a restart");
    assert_eq!(gpus.status(), 200);
    assert!(
        trusting(&first)
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_err(),
        "the old certificate is no longer served"
    );
}

/// `forecast backtest` on the demo: the forecast made on day 15 of the last complete month
/// against that month's cost, per team; each line's error is its expected figure less the
/// actual, the teams add up to the total, and a month without the history is refused saying
/// what it needs.
#[test]
fn forecast_backtest_on_the_demo() {
    use chrono::{Datelike, Duration, NaiveDate, Utc};
    let dir = tempdir("forecast-backtest");
    // The 28 days before the 15th of last month, and every day since.
    let today = Utc::now().date_naive();
    let this = NaiveDate::from_ymd_opt(today.year(), today.month(), 1).unwrap();
    let last = (this - Duration::days(1)).with_day(1).unwrap();
    let days = (today - (last - Duration::days(14))).num_days() + 2;
    let db = demo_db(&dir, days as u32);
    let out = bin()
        .args(["forecast", "backtest", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!(
            "forecast made {}-15 00:00 UTC",
            last.format("%Y-%m")
        )),
        "{text}"
    );
    let num = |s: &str| s.parse::<f64>().unwrap();
    let mut teams = 0.0;
    let mut total = None;
    let mut lines = 0;
    for l in text.lines().skip(3) {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f[1] == "unknown" {
            // No forecast (too little history): its actual still counts in the total.
            teams += num(f[4]);
            lines += 1;
            continue;
        }
        let (low, expected, high, actual, err) =
            (num(f[1]), num(f[2]), num(f[3]), num(f[4]), num(f[5]));
        assert!((expected - actual - err).abs() < 0.011, "{l}");
        assert_eq!(f[7] == "yes", low <= actual && actual <= high, "{l}");
        if f[0] == "total" {
            total = Some(actual);
        } else {
            teams += actual;
            lines += 1;
        }
    }
    assert!(lines >= 5, "{text}");
    assert!((total.unwrap() - teams).abs() < 0.1, "{text}");
    let out = bin()
        .args(["forecast", "backtest", "--month", "2001-01", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("2001-01") && err.contains("needs the 28 days"),
        "{err}"
    );
}
