//! Notifications end to end over a week of a small fleet, with a clock the test moves: a real
//! SMTP server (aiosmtpd from PyPI, `scripts/smtp-test-server.py`: STARTTLS with a test
//! certificate and AUTH required) receives the e-mails, and a local HTTP receiver takes the
//! Slack- and Teams-style webhooks. Needs `GPULEDGER_SMTP_PYTHON` (a Python with aiosmtpd; the
//! test script sets it) and `openssl`; without the Python the test is skipped, or fails when
//! `GPULEDGER_REQUIRE_SMTP` is set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use gpuledger_ledger::{validate_body, Settings};
use gpuledger_store::{Principal, Store};
use gpuledger_web::notify::{
    DigestConfig, Notifier, NotifyConfig, Rule, RuleKind, SmtpConfig, SmtpSecurity, TeamContact,
    WebhookConfig, WebhookStyle,
};
use gpuledger_web::{AppState, WebConfig};

const A: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000001";
const B: &str = "GPU-bbbbbbbb-0000-0000-0000-000000000002";
const C: &str = "GPU-cccccccc-0000-0000-0000-000000000003";
const D: &str = "GPU-dddddddd-0000-0000-0000-000000000004";

fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

struct Smtp {
    child: Child,
    port: u16,
    dir: PathBuf,
    ca: PathBuf,
}

impl Drop for Smtp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The SMTP server, or `None` (skipped) when no Python with aiosmtpd is given.
fn start_smtp(dir: &Path) -> Option<Smtp> {
    let python = match std::env::var("GPULEDGER_SMTP_PYTHON") {
        Ok(p) => p,
        Err(_) if std::env::var_os("GPULEDGER_REQUIRE_SMTP").is_some() => {
            panic!("GPULEDGER_REQUIRE_SMTP is set but GPULEDGER_SMTP_PYTHON is not")
        }
        Err(_) => {
            eprintln!("skipped: set GPULEDGER_SMTP_PYTHON to a Python with aiosmtpd");
            return None;
        }
    };
    let (crt, key) = (dir.join("smtp.crt"), dir.join("smtp.key"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=127.0.0.1"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .args(["-addext", "extendedKeyUsage=serverAuth"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()
        .expect("openssl (Debian package openssl) makes the test certificate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let port = free_port();
    let mail = dir.join("mail");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/smtp-test-server.py");
    let mut child = Command::new(&python)
        .arg(script)
        .arg(port.to_string())
        .arg(&crt)
        .arg(&key)
        .args(["gpuledger", "s3cret"])
        .arg(&mail)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {python}: {e}"));
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "the SMTP server did not start");
    Some(Smtp {
        child,
        port,
        dir: mail,
        ca: crt,
    })
}

/// Every e-mail received so far: (To, Subject, body), in arrival order.
fn mails(dir: &Path) -> Vec<(String, String, String)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "eml"));
    files.sort();
    files
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
            let field = |name: &str| {
                head.lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                    .unwrap_or_default()
                    .to_string()
            };
            (
                field("To"),
                field("Subject"),
                quoted_printable(&body.replace("\r\n", "\n")),
            )
        })
        .collect()
}

/// A quoted-printable body as text (soft line breaks joined, `=XX` decoded).
fn quoted_printable(s: &str) -> String {
    let joined = s.replace("=\n", "");
    let b = joined.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'=' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&joined[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A webhook receiver: every JSON body by path; `/platform` fails its first two requests.
#[derive(Clone, Default)]
struct Hooks {
    got: Arc<Mutex<Vec<(String, serde_json::Value)>>>,
    platform_failures: Arc<AtomicU32>,
}

async fn start_hooks() -> (String, Hooks) {
    use axum::extract::{Path as AxPath, State};
    use axum::http::StatusCode;
    let hooks = Hooks::default();
    hooks.platform_failures.store(2, Ordering::SeqCst);
    async fn take(
        State(h): State<Hooks>,
        AxPath(name): AxPath<String>,
        axum::Json(body): axum::Json<serde_json::Value>,
    ) -> StatusCode {
        if name == "platform"
            && h.platform_failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        h.got.lock().unwrap().push((name, body));
        StatusCode::OK
    }
    let app = axum::Router::new()
        .route("/hook/{name}", axum::routing::post(take))
        .with_state(hooks.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, hooks)
}

async fn push(store: &Store, source: &str, body: serde_json::Value, at: DateTime<Utc>) {
    let p = Principal {
        source: source.into(),
        teams: None,
        kind: "push".into(),
    };
    let out = store
        .ingest(
            &p,
            validate_body(body.as_object().unwrap().clone(), at, 300),
            at,
        )
        .await
        .unwrap();
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
}

/// GPU A's samples for the hours in `[from, to)` at `util` percent, with its record, and B's
/// record (a GPU with no owner) unless `without_b`.
fn a_hours(from: DateTime<Utc>, to: DateTime<Utc>, util: f64) -> serde_json::Value {
    let mut v = a_only(from, to, util);
    v["gpus"].as_array_mut().unwrap().push(serde_json::json!(
        {"uuid": B, "model": "NVIDIA L4", "host": "lab-1", "observed_at": to - chrono::Duration::minutes(1)}
    ));
    v
}

fn a_only(from: DateTime<Utc>, to: DateTime<Utc>, util: f64) -> serde_json::Value {
    let mut samples = Vec::new();
    let mut h = from.timestamp();
    while h < to.timestamp() {
        let ts = Utc
            .timestamp_opt((h + 600).min(to.timestamp() - 60), 0)
            .unwrap();
        samples.push(serde_json::json!({"gpu_uuid": A, "ts": ts, "util_pct": util}));
        h += 3600;
    }
    serde_json::json!({
        "gpus": [{"uuid": A, "model": "NVIDIA H100 80GB HBM3", "host": "gpu-a", "cloud": "aws",
                  "labels": {"team": "nlp"}, "observed_at": from}],
        "samples": samples,
    })
}

fn rows(r: &gpuledger_web::notify::RoundReport) -> Vec<(String, String, String)> {
    // What each round sent, for `-- --nocapture`.
    for (event, to, subject, link, outcome) in &r.messages {
        eprintln!("  {outcome:<12} {event:<8} {to:<34} {subject}  <{link}>");
    }
    let mut v: Vec<(String, String, String)> = r
        .messages
        .iter()
        .map(|(event, to, subject, _, outcome)| {
            (
                format!("{event} {outcome}"),
                to.clone(),
                subject.split(" (").next().unwrap_or_default().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

fn row(event: &str, to: &str, subject: &str) -> (String, String, String) {
    (event.into(), to.into(), subject.into())
}

#[tokio::test]
async fn a_week_of_notifications_by_mail_and_webhook() {
    let dir = std::env::temp_dir().join(format!("gpuledger-notify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let Some(smtp) = start_smtp(&dir) else { return };
    let (hooks_base, hooks) = start_hooks().await;
    std::fs::write(dir.join("smtp-password"), "s3cret\n").unwrap();

    let store = Store::open(
        &format!("sqlite://{}/t.db", dir.display()),
        Settings::default(),
    )
    .await
    .unwrap();
    let clock = Arc::new(AtomicI64::new(0));
    let mut state = AppState::new(store.clone(), WebConfig::default());
    let c = clock.clone();
    state.clock = Arc::new(move || Utc.timestamp_opt(c.load(Ordering::SeqCst), 0).unwrap());
    let hook = |name: &str, style| WebhookConfig {
        url: format!("{hooks_base}/hook/{name}"),
        style,
    };
    let config = NotifyConfig {
        dashboard_url: "https://gpuledger.example.com".into(),
        rate_per_hour: 2,
        attempts: 3,
        retry_base: Duration::from_millis(20),
        smtp: Some(SmtpConfig {
            host: "127.0.0.1".into(),
            port: smtp.port,
            security: SmtpSecurity::StartTls,
            username: Some("gpuledger".into()),
            password_file: Some(dir.join("smtp-password")),
            from: "gpuledger <gpuledger@example.com>".into(),
            ca_file: Some(smtp.ca.clone()),
        }),
        webhooks: BTreeMap::from([("platform".into(), hook("platform", WebhookStyle::Teams))]),
        central: vec![
            "email:gpu-platform@example.com".into(),
            "webhook:platform".into(),
        ],
        rules: vec![
            Rule {
                name: "idle GPUs".into(),
                kind: RuleKind::IdleGpu {
                    days: 7,
                    min_usd_per_month: 100.0,
                },
                to: vec!["owner".into()],
            },
            Rule {
                name: "stale sources".into(),
                kind: RuleKind::StaleSource,
                to: vec!["email:gpu-platform@example.com".into()],
            },
            Rule {
                name: "no owner".into(),
                kind: RuleKind::UnownedGpus,
                to: vec!["central".into()],
            },
        ],
        digest: Some(DigestConfig {
            weekday: 0,
            hour: 8,
            to: vec!["owner".into()],
        }),
        teams: BTreeMap::from([(
            "nlp".into(),
            TeamContact {
                email: vec!["ana@example.com".into()],
                webhook: Some(hook("nlp", WebhookStyle::Slack)),
            },
        )]),
        ..NotifyConfig::default()
    };
    let n = Notifier::new(state.clone(), config);
    let set = |at: DateTime<Utc>| {
        eprintln!("round at {}", at.format("%a %Y-%m-%d %H:%M UTC"));
        clock.store(at.timestamp(), Ordering::SeqCst)
    };

    // The fleet: A (nlp, H100) idle at 1 % for eight days and B with no owner, both from
    // agent-a; C (nlp) of source rack-7 and D (nlp) of source lab, which report once.
    let t0 = t("2026-11-30T09:00:00Z"); // a Monday
    push(
        &store,
        "agent-a",
        a_hours(t0 - chrono::Duration::days(8), t0, 1.0),
        t0,
    )
    .await;
    push(
        &store,
        "lab",
        serde_json::json!({"gpus": [{"uuid": D, "model": "NVIDIA L4", "host": "lab-2",
            "labels": {"team": "nlp"}, "observed_at": t0 - chrono::Duration::minutes(10)}]}),
        t0,
    )
    .await;
    let rack7 = |at: DateTime<Utc>| {
        serde_json::json!({"gpus": [{"uuid": C, "model": "NVIDIA A100-SXM4-80GB", "host": "r7",
            "labels": {"team": "nlp"}, "observed_at": at}]})
    };
    push(
        &store,
        "rack-7",
        rack7(t0 - chrono::Duration::minutes(30)),
        t0,
    )
    .await;

    // Monday 09:00: the idle GPU to its team (e-mail and Slack), the unowned GPU to the central
    // team (e-mail and Teams, whose receiver fails twice first), and the team's weekly digest.
    set(t0);
    let r = n.round(t0, false).await.unwrap();
    let idle = "Idle GPU GPU-aaaaaaaa: NVIDIA H100 80GB HBM3 on gpu-a".to_string();
    assert_eq!(
        rows(&r),
        vec![
            row(
                "digest sent",
                "email:ana@example.com",
                "Weekly GPU digest for team nlp"
            ),
            row(
                "digest sent",
                "webhook:team:nlp",
                "Weekly GPU digest for team nlp"
            ),
            row("new sent", "email:ana@example.com", &idle),
            row(
                "new sent",
                "email:gpu-platform@example.com",
                "1 GPU has no owner"
            ),
            row("new sent", "webhook:platform", "1 GPU has no owner"),
            row("new sent", "webhook:team:nlp", &idle),
        ]
    );
    let got = mails(&smtp.dir);
    assert_eq!(got.len(), 3);
    let idle_mail = got
        .iter()
        .find(|m| m.0.contains("ana@") && m.1.contains("Idle GPU"))
        .expect("the idle GPU's mail");
    assert!(
        idle_mail.2.contains(&format!(
            "Evidence: https://gpuledger.example.com/gpus/{A}?range=7d"
        )),
        "{}",
        idle_mail.2
    );
    let digest = got.iter().find(|m| m.1.contains("digest")).unwrap();
    assert!(digest.2.contains("GPUs owned: 3"), "{}", digest.2);
    assert!(digest.2.contains("Top findings:"), "{}", digest.2);
    // Eight days of history: the month-end forecast is in the digest, with its range.
    assert!(digest.2.contains("Month-end forecast: $"), "{}", digest.2);
    {
        let h = hooks.got.lock().unwrap();
        let slack = h
            .iter()
            .find(|(n, b)| n == "nlp" && b["text"].as_str().unwrap_or("").contains("Idle GPU"))
            .unwrap();
        assert!(slack.1["text"]
            .as_str()
            .unwrap()
            .contains("|Open in gpuledger>"));
        let teams = h.iter().find(|(n, _)| n == "platform").unwrap();
        assert_eq!(teams.1["@type"], "MessageCard");
        assert_eq!(
            teams.1["potentialAction"][0]["targets"][0]["uri"],
            "https://gpuledger.example.com/inventory?range=7d&team=unowned"
        );
    }
    let log = store.deliveries(50).await.unwrap();
    let platform = log
        .iter()
        .find(|d| d.recipient == "webhook:platform")
        .unwrap();
    assert_eq!(
        (platform.outcome.as_str(), platform.attempts),
        ("sent", 3),
        "two failures, then sent, in one round"
    );

    // Ten minutes later: nothing new, nothing sent again.
    let t1 = t0 + chrono::Duration::minutes(10);
    push(&store, "agent-a", a_hours(t0, t1, 1.0), t1).await;
    set(t1);
    assert_eq!(rows(&n.round(t1, false).await.unwrap()), vec![]);

    // 12:00: rack-7 and lab said nothing for 3 hours: stale, to the platform's address.
    let t2 = t0 + chrono::Duration::hours(3);
    push(&store, "agent-a", a_hours(t1, t2, 1.0), t2).await;
    set(t2);
    assert_eq!(
        rows(&n.round(t2, false).await.unwrap()),
        vec![
            row(
                "new sent",
                "email:gpu-platform@example.com",
                "Source lab is stale"
            ),
            row(
                "new sent",
                "email:gpu-platform@example.com",
                "Source rack-7 is stale"
            ),
        ]
    );
    // A dry run says what would go out and sends and records nothing.
    let t3 = t2 + chrono::Duration::minutes(10);
    push(&store, "agent-a", a_hours(t2, t3, 90.0), t3).await;
    push(&store, "rack-7", rack7(t3), t3).await;
    set(t3);
    let dry = n.round(t3, true).await.unwrap();
    assert_eq!(dry.messages.len(), 3, "{:?}", dry.messages);
    assert!(dry.messages.iter().all(|m| m.4 == "dry run"));
    assert_eq!(mails(&smtp.dir).len(), 5);
    // The GPU is busy now and rack-7 is back: both resolved (lab stays stale: nothing new).
    // The platform address had two messages this hour (its limit), so its "resolved" waits;
    // the team's go out.
    let r = n.round(t3, false).await.unwrap();
    assert_eq!(
        rows(&r),
        vec![
            row(
                "resolved rate_limited",
                "email:gpu-platform@example.com",
                "Resolved: Source rack-7 is stale"
            ),
            row(
                "resolved sent",
                "email:ana@example.com",
                &format!("Resolved: {idle}")
            ),
            row(
                "resolved sent",
                "webhook:team:nlp",
                &format!("Resolved: {idle}")
            ),
        ]
    );
    // An hour later the limit lets it through, once.
    let t4 = t3 + chrono::Duration::minutes(61);
    push(&store, "agent-a", a_hours(t3, t4, 90.0), t4).await;
    push(&store, "rack-7", rack7(t4), t4).await;
    set(t4);
    assert_eq!(
        rows(&n.round(t4, false).await.unwrap()),
        vec![row(
            "resolved sent",
            "email:gpu-platform@example.com",
            "Resolved: Source rack-7 is stale"
        )]
    );
    set(t4 + chrono::Duration::minutes(5));
    assert_eq!(
        rows(
            &n.round(t4 + chrono::Duration::minutes(5), false)
                .await
                .unwrap()
        ),
        vec![]
    );

    // A week later: agent-a no longer reports B, which went missing (the unowned finding
    // clears), and the next digest is due; lab is still stale, which was told once.
    let t5 = t0 + chrono::Duration::days(7);
    push(
        &store,
        "agent-a",
        a_only(t5 - chrono::Duration::hours(3), t5, 90.0),
        t5,
    )
    .await;
    push(&store, "rack-7", rack7(t5), t5).await;
    set(t5);
    let r = n.round(t5, false).await.unwrap();
    assert_eq!(
        rows(&r),
        vec![
            row(
                "digest sent",
                "email:ana@example.com",
                "Weekly GPU digest for team nlp"
            ),
            row(
                "digest sent",
                "webhook:team:nlp",
                "Weekly GPU digest for team nlp"
            ),
            row(
                "resolved sent",
                "email:gpu-platform@example.com",
                "Resolved: 1 GPU has no owner"
            ),
            row(
                "resolved sent",
                "webhook:platform",
                "Resolved: 1 GPU has no owner"
            ),
        ]
    );
    let log = store.deliveries(100).await.unwrap();
    eprintln!("delivery log, newest first:");
    for d in &log {
        eprintln!(
            "  {} {:<12} {:<8} {:<34} attempts {} {}",
            d.at.format("%a %H:%M"),
            d.outcome,
            d.event,
            d.recipient,
            d.attempts,
            d.subject
        );
    }
    let sent = log.iter().filter(|d| d.outcome == "sent").count();
    let limited = log.iter().filter(|d| d.outcome == "rate_limited").count();
    assert_eq!((sent, limited), (15, 1));
    // A "resolved" links to the view its finding's messages linked to.
    assert!(r
        .messages
        .iter()
        .any(|m| m.4 == "sent"
            && m.3 == "https://gpuledger.example.com/inventory?range=7d&team=unowned"));
    assert_eq!(mails(&smtp.dir).len(), 9);
    let _ = std::fs::remove_dir_all(&dir);
}
