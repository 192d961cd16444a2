//! The authorization matrix: every kind of token against every read endpoint and page, for a
//! GPU of the token's own team, of another team and of no team. Reads need a viewer token
//! (`read_requires_token`); a viewer token minted with `--team nlp` reads nlp's GPUs and their
//! figures only. Runs the real router on a socket over a fresh SQLite store.

use chrono::{DateTime, Duration, Utc};
use gpuledger_ledger::Settings;
use gpuledger_store::{Role, Store};
use gpuledger_web::{AppState, WebConfig};

const OWN: &str = "GPU-00000000-0000-0000-0000-0000000000a1";
const OTHER: &str = "GPU-00000000-0000-0000-0000-0000000000b2";
const UNOWNED: &str = "GPU-00000000-0000-0000-0000-0000000000c3";

fn now() -> DateTime<Utc> {
    "2026-12-02T12:00:00Z".parse().unwrap()
}

struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A server whose reads need a token (`config`), over a store with nlp's GPU, vision's GPU
/// and an unowned one, each with a sample: its base URL, the store, a client, an ingest token
/// and the temporary directory's guard.
async fn setup(name: &str, config: WebConfig) -> (String, Store, reqwest::Client, String, TempDir) {
    let dir = std::env::temp_dir().join(format!("gpuledger-authz-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = TempDir(dir.clone());
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
    let client = reqwest::Client::new();

    // nlp's GPU, vision's GPU and one nobody owns, with an hour of samples each.
    let ingest = store.create_token(Role::Ingest, "cron", &[]).await.unwrap();
    let t0 = now() - Duration::hours(2);
    let gpu = |uuid: &str, team: Option<&str>| {
        let labels = team
            .map(|t| serde_json::json!({ "team": t }))
            .unwrap_or(serde_json::json!({}));
        serde_json::json!({"uuid": uuid, "model": "NVIDIA L4", "host": format!("h-{}", &uuid[34..]),
                           "labels": labels, "observed_at": t0})
    };
    let samples: Vec<serde_json::Value> = [OWN, OTHER, UNOWNED]
        .iter()
        .map(|u| serde_json::json!({"gpu_uuid": u, "ts": t0, "util_pct": 2.0}))
        .collect();
    let body = serde_json::json!({
        "gpus": [gpu(OWN, Some("nlp")), gpu(OTHER, Some("vision")), gpu(UNOWNED, None)],
        "samples": samples,
    });
    let resp = client
        .post(format!("{base}/api/v1/ingest"))
        .bearer_auth(&ingest)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());

    (base, store, client, ingest, _cleanup)
}

#[tokio::test]
async fn authz_every_token_kind_against_every_read() {
    let config = WebConfig {
        read_requires_token: true,
        ..Default::default()
    };
    let (base, store, client, ingest, _cleanup) = setup("tokens", config).await;
    let viewer = store
        .create_token(Role::Viewer, "leads", &[])
        .await
        .unwrap();
    let nlp = store
        .create_token(Role::Viewer, "nlp-viewer", &["nlp".into()])
        .await
        .unwrap();
    let revoked = store.create_token(Role::Viewer, "gone", &[]).await.unwrap();
    let revoked_id = store.list_tokens().await.unwrap().last().unwrap().id;
    store
        .revoke_token(revoked_id, Utc::now().timestamp())
        .await
        .unwrap();
    let expired = store
        .create_token_expiring(Role::Viewer, "old", &[], Some(Utc::now().timestamp() - 1))
        .await
        .unwrap();

    let kinds: [(&str, Option<&str>); 6] = [
        ("none", None),
        ("ingest", Some(&ingest)),
        ("viewer", Some(&viewer)),
        ("viewer nlp", Some(&nlp)),
        ("revoked", Some(&revoked)),
        ("expired", Some(&expired)),
    ];
    // Per read: the status each kind gets, in the order above.
    let reads: Vec<(String, [u16; 6])> = vec![
        ("/api/v1/gpus".into(), [401, 401, 200, 200, 401, 401]),
        (
            "/api/v1/gpus?format=csv".into(),
            [401, 401, 200, 200, 401, 401],
        ),
        (
            "/api/v1/gpus?team=vision".into(),
            [401, 401, 200, 403, 401, 401],
        ),
        (
            format!("/api/v1/gpus/{OWN}"),
            [401, 401, 200, 200, 401, 401],
        ),
        (
            format!("/api/v1/gpus/{OTHER}"),
            [401, 401, 200, 404, 401, 401],
        ),
        (
            format!("/api/v1/gpus/{UNOWNED}"),
            [401, 401, 200, 404, 401, 401],
        ),
        ("/api/v1/summary".into(), [401, 401, 200, 200, 401, 401]),
        (
            "/api/v1/summary?format=csv".into(),
            [401, 401, 200, 200, 401, 401],
        ),
        (
            "/api/v1/summary?team=unowned".into(),
            [401, 401, 200, 403, 401, 401],
        ),
        ("/api/v1/used-by".into(), [401, 401, 200, 200, 401, 401]),
        ("/api/v1/savings".into(), [401, 401, 200, 200, 401, 401]),
        ("/api/v1/teams".into(), [401, 401, 200, 200, 401, 401]),
        ("/api/v1/sources".into(), [401, 401, 200, 403, 401, 401]),
        ("/api/v1/billing".into(), [401, 401, 200, 403, 401, 401]),
        ("/".into(), [401, 401, 200, 200, 401, 401]),
        ("/inventory".into(), [401, 401, 200, 200, 401, 401]),
        (
            "/inventory?csv=inventory".into(),
            [401, 401, 200, 200, 401, 401],
        ),
        ("/teams".into(), [401, 401, 200, 200, 401, 401]),
        ("/teams/nlp".into(), [401, 401, 200, 200, 401, 401]),
        ("/teams/vision".into(), [401, 401, 200, 403, 401, 401]),
        ("/usage".into(), [401, 401, 200, 200, 401, 401]),
        ("/waste".into(), [401, 401, 200, 200, 401, 401]),
        ("/sources".into(), [401, 401, 200, 403, 401, 401]),
        (format!("/gpus/{OWN}"), [401, 401, 200, 200, 401, 401]),
        (format!("/gpus/{OTHER}"), [401, 401, 200, 404, 401, 401]),
        ("/?team=vision".into(), [401, 401, 200, 403, 401, 401]),
    ];
    let mut table =
        String::from("| read | none | ingest | viewer | viewer nlp | revoked | expired |\n");
    table.push_str("| --- | --- | --- | --- | --- | --- | --- |\n");
    let mut failures = Vec::new();
    for (path, want) in &reads {
        let mut row = format!("| `{path}` |");
        for ((kind, token), want) in kinds.iter().zip(want) {
            let mut req = client.get(format!("{base}{path}"));
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let body = resp.text().await.unwrap();
            row.push_str(&format!(" {status} |"));
            if status != *want {
                failures.push(format!("{kind} {path}: {status}, want {want}: {body}"));
            }
            // What a 200 shows the nlp viewer holds nothing of the other GPUs or teams.
            if *kind == "viewer nlp" && status == 200 {
                for leak in [OTHER, UNOWNED, "vision"] {
                    if body.contains(leak) {
                        failures.push(format!("{kind} {path}: shows `{leak}`"));
                    }
                }
                if !path.contains("/gpus/") && !path.contains("used-by") && !body.contains("nlp") {
                    failures.push(format!("{kind} {path}: does not show nlp's own data"));
                }
            }
            // The unscoped viewer sees the other team: the leak check above can fail.
            if *kind == "viewer" && status == 200 && path == "/api/v1/gpus" {
                assert!(body.contains(OTHER) && body.contains(UNOWNED), "{body}");
            }
        }
        table.push_str(&row);
        table.push('\n');
    }
    println!("{table}");
    assert!(failures.is_empty(), "{}\n{table}", failures.join("\n"));

    // The sources page lists every token with its state and last use; one that never pushed
    // shows "never", and the page never shows a token itself.
    store
        .create_token(Role::Ingest, "idle-cron", &[])
        .await
        .unwrap();
    let page = client
        .get(format!("{base}/sources"))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let row = |source: &str| {
        page.split("<tr")
            .filter(|r| r.contains("<td>viewer</td>") || r.contains("<td>ingest</td>"))
            .find(|r| r.contains(&format!("<td>{source}</td>")))
            .unwrap_or_else(|| panic!("no token row for {source}"))
            .to_string()
    };
    assert!(row("idle-cron").contains(">never<"), "{}", row("idle-cron"));
    assert!(row("gone").contains(">revoked<"), "{}", row("gone"));
    assert!(row("old").contains(">expired<"), "{}", row("old"));
    let last_used = |source: &str| {
        let r = row(source);
        let cells: Vec<String> = r
            .split("<td")
            .skip(1)
            .map(|c| {
                let inner = c.split_once('>').map_or("", |x| x.1);
                inner.split("</td>").next().unwrap_or("").to_string()
            })
            .collect();
        cells.last().cloned().unwrap_or_default()
    };
    assert_eq!(last_used("idle-cron"), "never");
    assert!(last_used("cron").starts_with("20"), "{}", row("cron"));
    for secret in [&ingest, &viewer, &nlp, &revoked, &expired] {
        assert!(
            !page.contains(secret.as_str()),
            "a token is shown on the sources page"
        );
    }
}

/// People in a browser behind an authenticating proxy: the user and groups it sets read what
/// their groups map to (`*`: everything); a user in no mapped group gets 403; without the
/// headers or a token, 401; a token still works beside them.
#[tokio::test]
async fn authz_proxy_groups_read_their_teams() {
    let config = WebConfig {
        read_requires_token: true,
        proxy: Some(gpuledger_web::ProxyIdentity {
            user_header: "x-forwarded-user".into(),
            groups_header: "x-forwarded-groups".into(),
            groups: [
                ("nlp-eng".to_string(), vec!["nlp".to_string()]),
                ("platform".to_string(), vec!["*".to_string()]),
            ]
            .into_iter()
            .collect(),
        }),
        ..Default::default()
    };
    let (base, store, client, _, _cleanup) = setup("proxy", config).await;
    let get = |user: Option<&str>, groups: &str, path: &str| {
        let mut req = client.get(format!("{base}{path}"));
        if let Some(u) = user {
            req = req
                .header("X-Forwarded-User", u)
                .header("X-Forwarded-Groups", groups);
        }
        async move {
            let resp = req.send().await.unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }
    };
    let (status, body) = get(Some("ana"), "staff, nlp-eng", "/api/v1/gpus").await;
    assert_eq!(status, 200);
    assert!(
        body.contains(OWN) && !body.contains(OTHER) && !body.contains(UNOWNED),
        "{body}"
    );
    assert_eq!(get(Some("ana"), "nlp-eng", "/teams/vision").await.0, 403);
    assert_eq!(
        get(Some("ana"), "nlp-eng", &format!("/gpus/{OTHER}"))
            .await
            .0,
        404
    );
    let (status, body) = get(Some("root"), "platform", "/api/v1/gpus").await;
    assert_eq!(status, 200);
    assert!(body.contains(OTHER) && body.contains(UNOWNED), "{body}");
    let (status, body) = get(Some("eve"), "guests", "/api/v1/gpus").await;
    assert_eq!(status, 403);
    assert!(
        body.contains("user `eve` is in no group that reads a team"),
        "{body}"
    );
    assert_eq!(get(None, "", "/api/v1/gpus").await.0, 401);
    let viewer = store
        .create_token(Role::Viewer, "leads", &[])
        .await
        .unwrap();
    let resp = client
        .get(format!("{base}/api/v1/gpus"))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}
