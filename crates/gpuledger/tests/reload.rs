//! Reloading `serve`'s collectors without a restart: the real binary, a real SQLite file, real
//! HTTP, and SIGHUP sent as an operator (or `systemctl reload`) sends it.
//!
//! Map: `reload_*` a running server re-reading its `[[collectors]]`; `kubeconfig_dir_*` one
//! entry standing for a folder of kubeconfig files, through `check-config`, `collect` and
//! `serve`. The server logs JSON here, and the tests read its log lines as the record of what
//! each reload did.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::bin;

fn tempdir(name: &str) -> PathBuf {
    common::tempdir("reload", name)
}

/// The corpus root: `$GPULEDGER_CORPUS`, else `<repo>/../shared/fixtures`. These tests need it
/// and fail, saying so, without it.
fn corpus(rel: &str) -> String {
    let dir = std::env::var_os("GPULEDGER_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures")
        });
    let path = dir.join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "the corpus file {} is needed ({e}); set GPULEDGER_CORPUS to the fixtures folder",
            path.display()
        )
    })
}

fn corpus_yaml(rel: &str) -> Value {
    serde_yaml::from_str(&corpus(rel)).unwrap()
}

/// A running `gpuledger serve` and its JSON log lines, read as they come.
struct Server {
    child: Child,
    base: String,
    logs: Arc<Mutex<Vec<Value>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Start `gpuledger serve --config CONFIG` in `dir` on a free port.
    fn start(dir: &Path, config: &Path) -> Server {
        let mut child = bin()
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .env("GPULEDGER_LOG_FORMAT", "json")
            .env("GPULEDGER_LOG", "info")
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let value = serde_json::from_str(&line).unwrap_or(Value::String(line));
                sink.lock().unwrap().push(value);
            }
        });
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let base = line.trim().rsplit(' ').next().unwrap().to_string();
        assert!(base.starts_with("http://127.0.0.1:"), "{line}");
        Server { child, base, logs }
    }

    /// Send SIGHUP, as `systemctl reload gpuledger` does.
    fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Log lines whose message is `message`, with their fields.
    fn logged(&self, message: &str) -> Vec<Value> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l["fields"]["message"] == message)
            .map(|l| l["fields"].clone())
            .collect()
    }

    /// Send SIGHUP and wait (up to 20 s) for the reload it starts to end, accepted or refused;
    /// returns that line's fields.
    fn reload(&self) -> Value {
        let done = |s: &Server| {
            s.logged("config reloaded").len()
                + s.logged("config reload refused; the running collectors go on unchanged")
                    .len()
        };
        let before = done(self);
        self.hangup();
        let deadline = Instant::now() + Duration::from_secs(20);
        while done(self) == before {
            assert!(
                Instant::now() < deadline,
                "no reload logged: {:#?}",
                self.logs.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let logs = self.logs.lock().unwrap();
        logs.iter()
            .rev()
            .find(|l| {
                let m = &l["fields"]["message"];
                m == "config reloaded"
                    || m == "config reload refused; the running collectors go on unchanged"
            })
            .map(|l| l["fields"].clone())
            .unwrap()
    }

    /// The sources as `GET /api/v1/sources` lists them, by name.
    async fn sources(&self, token: &str) -> std::collections::BTreeMap<String, Value> {
        let r = reqwest::Client::new()
            .get(format!("{}/api/v1/sources", self.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.unwrap();
        body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["name"].as_str().unwrap().to_string(), s.clone()))
            .collect()
    }

    /// Poll the sources (up to 30 s, for a machine busy with other tests) until `done` holds.
    async fn wait_sources(
        &self,
        token: &str,
        what: &str,
        done: impl Fn(&std::collections::BTreeMap<String, Value>) -> bool,
    ) -> std::collections::BTreeMap<String, Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let sources = self.sources(token).await;
            if done(&sources) {
                return sources;
            }
            assert!(Instant::now() < deadline, "{what}: {sources:#?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A viewer token (reads need one in these configs), minted before the server starts.
fn viewer_token(dir: &Path) -> String {
    let out = bin()
        .args(["token", "create", "--source", "ops", "--viewer"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .trim()
        .to_string()
}

/// Serve one file over HTTP on a free port from a thread, counting the requests it answers
/// and remembering when the first came.
fn serve_file_counting(body: String) -> (String, Arc<AtomicUsize>, Arc<Mutex<Option<Instant>>>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let first = Arc::new(Mutex::new(None));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (counter, first_at) = (hits.clone(), first.clone());
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            first_at.lock().unwrap().get_or_insert_with(Instant::now);
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (format!("http://{addr}/metrics"), hits, first)
}

fn dcgm_entry(name: &str, endpoint: &str) -> String {
    format!(
        "[[collectors]]\ntype = \"dcgm\"\nname = \"{name}\"\ninterval_secs = 10\nendpoints = [\"{endpoint}\"]\n\n"
    )
}

fn billing_entry(dir: &Path) -> String {
    format!(
        "[[collectors]]\ntype = \"billing\"\nname = \"focus\"\ninterval_secs = 10\ndir = \"{}\"\n\n",
        dir.display()
    )
}

const AUTH: &str = "[auth]\nread_requires_token = true\n\n";

/// Wait (up to 30 s) until `hits` exceeds `above`.
async fn wait_hits(hits: &AtomicUsize, above: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while hits.load(Ordering::SeqCst) <= above {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGHUP reconciles the running collectors with the file: an added entry starts and shows on
/// the sources page, the unchanged one goes on untouched (no restart, no extra scrape), a
/// collector stopped on a configuration error starts again once its entry is fixed, a removed
/// entry is no longer scraped, and a file that does not parse or build is refused whole while
/// the running collectors go on.
#[tokio::test(flavor = "multi_thread")]
async fn reload_starts_added_stops_removed_and_refuses_a_broken_config() {
    let scrape = corpus("dcgm/aws-kops-nvidia-l4-full-scrape.prom");
    let dir = tempdir("collectors");
    let token = viewer_token(&dir);
    let (a_url, a_hits, a_first) = serve_file_counting(scrape.clone());
    let (b_url, b_hits, _) = serve_file_counting(scrape);
    let exports = dir.join("exports");
    let config = dir.join("g.toml");
    // `focus` names a folder that is not there: a configuration error stops it.
    std::fs::write(
        &config,
        format!(
            "{AUTH}{}{}",
            dcgm_entry("dcgm-a", &a_url),
            billing_entry(&dir.join("exprots"))
        ),
    )
    .unwrap();
    let server = Server::start(&dir, &config);
    let sources = server
        .wait_sources(&token, "dcgm-a collects, focus stops", |s| {
            s.get("dcgm-a").is_some_and(|a| a["status"] == "ok")
                && s.get("focus").is_some_and(|f| {
                    f["last_error"]
                        .as_str()
                        .is_some_and(|e| e.starts_with("stopped: "))
                })
        })
        .await;
    let stopped = sources["focus"]["last_error"].as_str().unwrap();
    assert!(
        stopped.ends_with("reload gpuledger: systemctl reload gpuledger, or kill -HUP its pid"),
        "{stopped}"
    );
    let a_started = a_first.lock().unwrap().expect("dcgm-a scraped");

    // Add dcgm-b, fix focus's folder; dcgm-a's entry is the same, written elsewhere.
    std::fs::create_dir_all(&exports).unwrap();
    std::fs::write(
        &config,
        format!(
            "{AUTH}# dcgm-b added\n{}{}{}",
            billing_entry(&exports),
            dcgm_entry("dcgm-a", &a_url),
            dcgm_entry("dcgm-b", &b_url)
        ),
    )
    .unwrap();
    let done = server.reload();
    assert_eq!(
        (
            &done["started"],
            &done["restarted"],
            &done["unchanged"],
            &done["stopped"]
        ),
        (&1.into(), &1.into(), &1.into(), &0.into()),
        "{done}"
    );
    server
        .wait_sources(&token, "dcgm-b appears, focus runs again", |s| {
            s.get("dcgm-b").is_some_and(|b| b["status"] == "ok")
                && s.get("focus").is_some_and(|f| f["status"] == "ok")
        })
        .await;
    assert!(b_hits.load(Ordering::SeqCst) >= 1);
    // dcgm-a was not restarted: a restart scrapes at once, its schedule only every 10 s.
    let scheduled = 1 + (a_started.elapsed().as_secs() / 10) as usize;
    assert!(
        a_hits.load(Ordering::SeqCst) <= scheduled,
        "dcgm-a scraped {} times in {:?}: restarted by the reload",
        a_hits.load(Ordering::SeqCst),
        a_started.elapsed()
    );
    let restarted: Vec<Value> = server.logged("collector restarted");
    assert_eq!(restarted.len(), 1, "{restarted:#?}");
    assert_eq!(restarted[0]["source"], "focus");
    assert_eq!(
        restarted[0]["reason"], "its entry changed",
        "{restarted:#?}"
    );
    let started: Vec<Value> = server.logged("collector started");
    assert_eq!(
        started
            .iter()
            .map(|s| s["source"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["dcgm-a", "focus", "dcgm-b"]
    );

    // Remove dcgm-a.
    std::fs::write(
        &config,
        format!(
            "{AUTH}{}{}",
            billing_entry(&exports),
            dcgm_entry("dcgm-b", &b_url)
        ),
    )
    .unwrap();
    let done = server.reload();
    assert_eq!(
        (&done["stopped"], &done["unchanged"]),
        (&1.into(), &2.into()),
        "{done}"
    );
    assert_eq!(
        server.logged("collector stopped: its entry is no longer in the config")[0]["source"],
        "dcgm-a"
    );
    let a_at_removal = a_hits.load(Ordering::SeqCst);

    // A file that does not parse, then one that parses but names a folder that is not there:
    // each is refused as a whole, saying why, and nothing stops.
    std::fs::write(&config, format!("{AUTH}[[collectors]]\ntype = \n")).unwrap();
    let refused = server.reload();
    let error = refused["error"].as_str().unwrap();
    assert!(
        error.contains("g.toml:") && error.contains("not valid TOML"),
        "{refused}"
    );
    std::fs::write(
        &config,
        format!(
            "{AUTH}{}[[collectors]]\ntype = \"kubernetes\"\nname = \"k8s\"\nkubeconfig_dir = \"{}\"\n",
            dcgm_entry("dcgm-b", &b_url),
            dir.join("no-such-folder").display()
        ),
    )
    .unwrap();
    let refused = server.reload();
    let error = refused["error"].as_str().unwrap();
    assert!(
        error.contains("collector `k8s` (kubernetes): kubeconfig_dir")
            && error.contains("no-such-folder: cannot read the folder"),
        "{refused}"
    );
    assert_eq!(
        server
            .logged("collector stopped: its entry is no longer in the config")
            .len(),
        1
    );

    // dcgm-b goes on after the refused reloads (its next scrape, 10 s after its first), and
    // dcgm-a, past the time its next scrape was due, is not scraped again.
    let b_now = b_hits.load(Ordering::SeqCst);
    wait_hits(&b_hits, b_now, "dcgm-b stopped after a refused reload").await;
    let a_due = a_started + Duration::from_secs(10 * a_at_removal as u64 + 2);
    tokio::time::sleep(a_due.saturating_duration_since(Instant::now())).await;
    assert_eq!(
        a_hits.load(Ordering::SeqCst),
        a_at_removal,
        "a removed collector was scraped"
    );
    let sources = server.sources(&token).await;
    assert_eq!(sources["dcgm-b"]["status"], "ok", "{sources:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The stand-in Kubernetes API of the collect crate's tests: no real API server can run here,
/// so it serves the corpus's recorded Node objects as list and watch responses.
#[path = "../../collect/tests/support/kube_api.rs"]
mod kube_api;

/// A kubeconfig for `api`, written as `dir/name`.
fn kubeconfig(api: &kube_api::FakeApi, dir: &Path, name: &str) -> PathBuf {
    let scratch = tempdir(&format!("kc-{name}"));
    let path = dir.join(name);
    std::fs::rename(api.kubeconfig(&scratch), &path)
        .or_else(|_| std::fs::copy(scratch.join("kubeconfig"), &path).map(|_| ()))
        .unwrap();
    let _ = std::fs::remove_dir_all(&scratch);
    path
}

/// One `kubeconfig_dir` entry over a folder with two clusters' kubeconfigs is two sources,
/// `k8s-east` and `k8s-west`, each with its cluster: `check-config` lists them, `collect
/// --once --dry-run` reads both, a file that is no kubeconfig is named and left out while the
/// others run, and a file added to the folder starts its collector on SIGHUP.
#[tokio::test(flavor = "multi_thread")]
async fn kubeconfig_dir_is_one_source_per_file_and_reload_picks_up_new_files() {
    let east =
        kube_api::FakeApi::start(vec![corpus_yaml("kubernetes/node-tesla-t4-2gpu-gke.yaml")]).await;
    let west = kube_api::FakeApi::start(vec![corpus_yaml(
        "kubernetes/node-a100-sxm4-40gb-mig-mixed-gke.yaml",
    )])
    .await;
    let dir = tempdir("kubeconfig-dir");
    let token = viewer_token(&dir);
    let clusters = dir.join("clusters");
    std::fs::create_dir_all(&clusters).unwrap();
    kubeconfig(&east, &clusters, "east.kubeconfig");
    kubeconfig(&west, &clusters, "west.yaml");
    std::fs::write(clusters.join(".west.yaml.swp"), "editor swap file").unwrap();
    std::fs::write(clusters.join("README"), "one kubeconfig per cluster").unwrap();
    let config = dir.join("g.toml");
    std::fs::write(
        &config,
        format!(
            "{AUTH}[[collectors]]\ntype = \"kubernetes\"\nname = \"k8s\"\ninterval_secs = 10\nkubeconfig_dir = \"{}\"\nteam_keys = [\"team\", \"project\"]\n",
            clusters.display()
        ),
    )
    .unwrap();

    let run = |args: &[&str]| {
        let out = bin()
            .args(args)
            .arg(&config)
            .current_dir(&dir)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, text, err) = tokio::task::block_in_place(|| run(&["check-config"]));
    assert!(ok, "{text}{err}");
    assert!(text.contains("ok (2 collector(s)"), "{text}");
    for (name, cluster, file) in [
        ("k8s-east", "east", "east.kubeconfig"),
        ("k8s-west", "west", "west.yaml"),
    ] {
        let want = format!(
            "  collector kubernetes `{name}`: every 10 s, cluster `{cluster}`, kubeconfig {}",
            clusters.join(file).display()
        );
        assert!(text.lines().any(|l| l == want), "{want}\n{text}");
    }

    let (ok, out, err) =
        tokio::task::block_in_place(|| run(&["collect", "--once", "--dry-run", "--config"]));
    assert!(ok, "{err}");
    let mut counts: Vec<(String, String, String, u64)> = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|o| o["kind"] == "host_gpu_count")
        .map(|o| {
            (
                o["provenance"]["source"].as_str().unwrap().to_string(),
                o["gpus"]["cluster"].as_str().unwrap().to_string(),
                o["gpus"]["host"].as_str().unwrap().to_string(),
                o["gpus"]["count"].as_u64().unwrap(),
            )
        })
        .collect();
    counts.sort();
    let want = |source: &str, cluster: &str, host: &str, n: u64| {
        (source.to_string(), cluster.to_string(), host.to_string(), n)
    };
    assert_eq!(
        counts,
        [
            want("k8s-east", "east", "qa-mig-worker-gpu-1", 2),
            want("k8s-west", "west", "qa-mig-worker-gpu-a100", 1),
        ],
        "{err}"
    );

    // A file that is no kubeconfig: named; check-config fails, the others still collect.
    std::fs::write(clusters.join("broken.yaml"), "just: some yaml\n").unwrap();
    let (ok, text, _) = tokio::task::block_in_place(|| run(&["check-config"]));
    assert!(!ok);
    assert!(
        text.contains(&format!(
            "collector `k8s` (kubernetes): {}: not a usable kubeconfig: it sets no current-context",
            clusters.join("broken.yaml").display()
        )),
        "{text}"
    );

    // Serve with east and the broken file; west's file comes later.
    let parked = dir.join("west.yaml");
    std::fs::rename(clusters.join("west.yaml"), &parked).unwrap();
    let server = Server::start(&dir, &config);
    server
        .wait_sources(&token, "k8s-east collects", |s| {
            s.get("k8s-east").is_some_and(|e| e["status"] == "ok")
        })
        .await;
    let left_out = server.logged("kubeconfig file left out; fix or remove it and reload gpuledger");
    assert!(
        left_out
            .iter()
            .any(|l| l["problem"].as_str().unwrap().contains("broken.yaml")),
        "{left_out:#?}"
    );
    // Its three lists and three watches made, it sends nothing more until a watch expires.
    let deadline = Instant::now() + Duration::from_secs(10);
    while east.requests().iter().filter(|(_, watch)| *watch).count() < 3 {
        assert!(Instant::now() < deadline, "{:?}", east.requests());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let east_requests = east.requests().len();
    std::fs::rename(&parked, clusters.join("west.yaml")).unwrap();
    let done = server.reload();
    assert_eq!(
        (&done["started"], &done["unchanged"], &done["restarted"]),
        (&1.into(), &1.into(), &0.into()),
        "{done}"
    );
    let sources = server
        .wait_sources(&token, "k8s-west appears", |s| {
            s.get("k8s-west").is_some_and(|w| w["status"] == "ok")
        })
        .await;
    assert_eq!(sources["k8s-west"]["kind"], "kubernetes");
    assert!(!sources.contains_key("k8s-broken"), "{sources:#?}");
    assert_eq!(
        east.requests().len(),
        east_requests,
        "the unchanged cluster's collector sent no request: its watches go on"
    );
    let gpus: Value = reqwest::Client::new()
        .get(format!("{}/api/v1/gpus", server.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut seen: Vec<(&str, &str)> = gpus["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["cluster"].as_str().unwrap(), g["host"].as_str().unwrap()))
        .collect();
    seen.sort();
    seen.dedup();
    assert_eq!(
        seen,
        [
            ("east", "qa-mig-worker-gpu-1"),
            ("west", "qa-mig-worker-gpu-a100")
        ],
        "{gpus}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
