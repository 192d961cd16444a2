//! `GET /metrics` on the real router: what pushes and requests it counts, the gauges it reads
//! from the store, the format (checked by Prometheus's own `promtool`), and that every metric
//! the Grafana dashboard under deploy/server draws is one the server exposes.

use chrono::{Duration, Utc};
use gpuledger_ledger::Settings;
use gpuledger_store::{Role, Store};
use gpuledger_web::{AppState, WebConfig};

struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The value of the sample `series` (name and labels exactly as exposed).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn metrics_count_pushes_records_requests_and_sources() {
    let dir = std::env::temp_dir().join(format!("gpuledger-metrics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = TempDir(dir.clone());
    let store = Store::open(
        &format!("sqlite://{}/t.db", dir.display()),
        Settings::default(),
    )
    .await
    .unwrap();
    let state = AppState::new(store.clone(), WebConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(gpuledger_web::serve(
        listener,
        state,
        std::future::pending(),
    ));
    let client = reqwest::Client::new();
    let token = store.create_token(Role::Ingest, "cron", &[]).await.unwrap();
    let now = Utc::now() - Duration::minutes(1);
    let uuid = "GPU-00000000-0000-0000-0000-0000000000a1";
    let body = serde_json::json!({
        "gpus": [{"uuid": uuid, "model": "NVIDIA L4", "host": "h1", "observed_at": now}],
        "samples": [{"gpu_uuid": uuid, "ts": now, "util_pct": 40.0},
                    {"gpu_uuid": "GPU-unknown", "ts": now, "util_pct": 1.0}],
    });
    for _ in 0..2 {
        let resp = client
            .post(format!("{base}/api/v1/ingest"))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let refused = client
        .post(format!("{base}/api/v1/ingest"))
        .bearer_auth("glt_wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    client
        .get(format!("{base}/gpus/{uuid}"))
        .send()
        .await
        .unwrap();

    let resp = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = resp.text().await.unwrap();
    let v = |s: &str| value(&text, s).unwrap_or_else(|| panic!("no `{s}` in\n{text}"));
    assert_eq!(
        v(r#"gpuledger_ingest_requests_total{outcome="partial"}"#),
        2.0
    );
    for (kind, outcome, n) in [
        ("gpus", "accepted", 2.0),
        ("samples", "accepted", 2.0),
        ("samples", "duplicate", 1.0),
        ("samples", "rejected", 2.0),
    ] {
        assert_eq!(
            v(&format!(
                r#"gpuledger_ingest_records_total{{source="cron",kind="{kind}",outcome="{outcome}"}}"#
            )),
            n,
            "{kind} {outcome}"
        );
    }
    assert_eq!(
        v(r#"gpuledger_http_requests_total{route="/api/v1/ingest",method="POST",status="401"}"#),
        1.0
    );
    // The route, never the GPU's UUID, is the label.
    assert_eq!(
        v(r#"gpuledger_http_requests_total{route="/gpus/{uuid}",method="GET",status="200"}"#),
        1.0
    );
    assert!(!text.contains(uuid));
    assert_eq!(
        v(r#"gpuledger_http_request_duration_seconds_count{route="/api/v1/ingest"}"#),
        3.0
    );
    assert_eq!(v(r#"gpuledger_source_up{source="cron",kind="push"}"#), 1.0);
    assert_eq!(
        v(r#"gpuledger_source_gpus{source="cron",kind="push"}"#),
        1.0
    );
    assert!(v(r#"gpuledger_source_lag_seconds{source="cron",kind="push"}"#) < 60.0);
    assert!(v(r#"gpuledger_db_pool_connections{state="idle"}"#) >= 0.0);
    // Only past days wait for their group rollups' rebuild: the pushed sample's day is today
    // (yesterday, a minute after midnight). A late sample lists its day; the rebuild takes it
    // off.
    let past = f64::from(u8::from(now.date_naive() < Utc::now().date_naive()));
    assert_eq!(v("gpuledger_group_rollup_backlog"), past);
    // At 01:00 three days ago: the hours it makes present (its hour and the stale window
    // after it) stay within that one day, whatever the time the test runs.
    let late_ts = (now - Duration::days(3))
        .date_naive()
        .and_hms_opt(1, 0, 0)
        .unwrap()
        .and_utc();
    let late = serde_json::json!({
        "samples": [{"gpu_uuid": uuid, "ts": late_ts, "util_pct": 5.0}],
    });
    let resp = client
        .post(format!("{base}/api/v1/ingest"))
        .bearer_auth(&token)
        .json(&late)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let pending = || async {
        let text = client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        value(&text, "gpuledger_group_rollup_backlog").unwrap()
    };
    assert_eq!(pending().await, past + 1.0);
    store.refresh_groups(Utc::now().timestamp()).await.unwrap();
    assert_eq!(pending().await, 0.0);
    // The teams' week, as the summary gives it: the pushed GPU has no owner.
    assert_eq!(v(r#"gpuledger_team_gpus{team="unowned"}"#), 1.0);
    assert!(text.contains("# TYPE gpuledger_team_idle_cost_usd gauge"));
    assert!(text.ends_with("# EOF\n"));

    // Every metric the dashboard draws is exposed.
    let dashboard: serde_json::Value = serde_json::from_str(include_str!(
        "../../../deploy/server/grafana-dashboard.json"
    ))
    .unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().clone())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(exprs.len(), 8);
    for expr in &exprs {
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("gpuledger_") {
                assert!(
                    text.lines().any(|l| l.starts_with(word)),
                    "the dashboard draws `{word}` (in `{expr}`), which /metrics does not expose"
                );
            }
        }
    }

    // Every metric the shipped alerting rules read is exposed.
    let rules = include_str!("../../../deploy/prometheus/gpuledger-alerts.yaml");
    let mut read = 0;
    for word in rules.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("gpuledger_") {
            read += 1;
            let family = word.trim_end_matches("_total");
            assert!(
                text.contains(&format!("# TYPE {family} ")),
                "an alerting rule reads `{word}`, which /metrics does not expose"
            );
        }
    }
    assert!(read >= 5, "the rules read gpuledger's metrics");

    // Prometheus's own checker reads it (OpenMetrics and the classic text format alike).
    match std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            use std::io::Write;
            // promtool reads the classic text format: the same lines without the EOF marker.
            let classic = text.trim_end_matches("# EOF\n");
            child
                .stdin
                .take()
                .unwrap()
                .write_all(classic.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            // The one lint the classic format raises on OpenMetrics: a counter's HELP names
            // the family (`x`), not the sample (`x_total`). Anything else (a parse error, a
            // bad name, a histogram without buckets) fails.
            let other: Vec<&str> = said
                .lines()
                .filter(|l| !l.trim().is_empty())
                .filter(|l| {
                    !(l.ends_with(" no help text")
                        && l.split(' ').next().is_some_and(|m| m.ends_with("_total")))
                })
                .collect();
            assert!(other.is_empty(), "promtool: {said}");
        }
        Err(e) => {
            assert!(
                std::env::var_os("GPULEDGER_REQUIRE_PROMETHEUS").is_none(),
                "GPULEDGER_REQUIRE_PROMETHEUS is set but promtool cannot run: {e}"
            );
            eprintln!("skipped: the promtool check (no promtool: {e})");
        }
    }
}
