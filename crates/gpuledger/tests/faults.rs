//! Faults of the server process itself, with the real binary on a real SQLite file.
//!
//! `kill_9_under_load_loses_no_acknowledged_sample`: pushes run from two clients while the
//! server is killed with SIGKILL at a random moment, then restarted, round after round; at the
//! end every body the server had answered 200 is sent again, and the server must count every
//! one of its samples as a duplicate (it has them all). Rounds: `GPULEDGER_KILL_ROUNDS`
//! (default 4); as a soak, `GPULEDGER_KILL_ROUNDS=100` (docs/testing.md).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;

mod common;

use common::{serve_in, token, Server};

/// `gpuledger serve` on a free port, with no rate limit (the test pushes as fast as it can).
fn serve(dir: &Path) -> (Server, String) {
    std::fs::write(
        dir.join("gpuledger.toml"),
        "[ingest]\nrecords_per_sec = 0\n",
    )
    .unwrap();
    serve_in(dir, &["--config", "gpuledger.toml"], &[])
}

const GPUS: usize = 4;
const SAMPLES_PER_GPU: usize = 10;

/// Body `i`: four GPUs and ten samples each, at times no other body uses.
fn body(i: usize, base: chrono::DateTime<chrono::Utc>) -> String {
    let uuid = |g: usize| format!("GPU-00000000-0000-4000-8000-{g:012}");
    let at = |s: usize| (base + chrono::Duration::seconds(s as i64)).to_rfc3339();
    let gpus: Vec<String> = (0..GPUS)
        .map(|g| {
            format!(
                r#"{{"uuid":"{}","model":"NVIDIA L4","host":"k{g}","observed_at":"{}"}}"#,
                uuid(g),
                at(i * SAMPLES_PER_GPU)
            )
        })
        .collect();
    let samples: Vec<String> = (0..GPUS)
        .flat_map(|g| {
            (0..SAMPLES_PER_GPU).map(move |k| {
                format!(
                    r#"{{"gpu_uuid":"{}","ts":"{}","util_pct":{}}}"#,
                    uuid(g),
                    at(i * SAMPLES_PER_GPU + k),
                    (i + g + k) % 101
                )
            })
        })
        .collect();
    format!(
        r#"{{"gpus":[{}],"samples":[{}]}}"#,
        gpus.join(","),
        samples.join(",")
    )
}

async fn push(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    body: String,
) -> Option<serde_json::Value> {
    let resp = client
        .post(format!("{url}/api/v1/ingest"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .ok()?;
    if resp.status() != 200 {
        return None;
    }
    resp.json().await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_loses_no_acknowledged_sample() {
    let rounds: usize = std::env::var("GPULEDGER_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let dir = std::env::temp_dir().join(format!("gpuledger-faults-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let token = token(&dir, &["--source", "load"]);
    // Samples of the last few days: within the raw retention, whatever the rounds.
    let base = chrono::Utc::now() - chrono::Duration::days(3);
    let next = Arc::new(Mutex::new(0usize));
    let acked = Arc::new(Mutex::new(Vec::<usize>::new()));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut kills_mid_flight = 0;
    for round in 0..rounds {
        let (mut server, url) = serve(&dir);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut clients = Vec::new();
        for _ in 0..2 {
            let (next, acked, stop, client, url, token) = (
                next.clone(),
                acked.clone(),
                stop.clone(),
                client.clone(),
                url.clone(),
                token.clone(),
            );
            clients.push(tokio::spawn(async move {
                let mut failed = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let i = {
                        let mut n = next.lock().unwrap();
                        *n += 1;
                        *n - 1
                    };
                    match push(&client, &url, &token, body(i, base)).await {
                        Some(_) => acked.lock().unwrap().push(i),
                        None => failed += 1,
                    }
                }
                failed
            }));
        }
        let wait = rand::rng().random_range(300..1500);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        server.0.kill().unwrap(); // SIGKILL
        server.0.wait().unwrap();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for c in clients {
            kills_mid_flight += c.await.unwrap();
        }
        eprintln!(
            "round {round}: killed after {wait} ms; {} bodies acknowledged so far",
            acked.lock().unwrap().len()
        );
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= rounds,
        "too few pushes were acknowledged to test anything: {}",
        acked.len()
    );
    // Every acknowledged body again: the server must already have every sample of it.
    let (_server, url) = serve(&dir);
    let mut missing = Vec::new();
    for &i in &acked {
        let answer = push(&client, &url, &token, body(i, base))
            .await
            .unwrap_or_else(|| panic!("resending body {i} failed"));
        let dup = answer["duplicates"]["samples"].as_u64().unwrap();
        if dup != (GPUS * SAMPLES_PER_GPU) as u64 {
            missing.push((i, dup));
        }
    }
    eprintln!(
        "{rounds} kills: {} bodies ({} samples) acknowledged, {kills_mid_flight} requests failed \
         (cut off by a kill, or refused while the server was down); after restart, samples of \
         acknowledged bodies missing: {}",
        acked.len(),
        acked.len() * GPUS * SAMPLES_PER_GPU,
        missing.len()
    );
    assert!(
        missing.is_empty(),
        "acknowledged bodies not fully stored (body, samples found): {missing:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
