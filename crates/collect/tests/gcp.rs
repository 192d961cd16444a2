//! Tests of the `gcp` collector against a local server on 127.0.0.1 replaying Compute Engine's
//! answers, with a fake token endpoint and metadata server.
//!
//! Which answers are recorded and which are built:
//! - **Recorded**: `<corpus>/cloud/gcp/compute-acceleratorTypes-aggregatedList-…json`, a real
//!   `acceleratorTypes.aggregatedList` answer (2018). `corpus_*` reads it whole with the
//!   collector's aggregated-list reader. The replayed instance pages reuse pieces of it: the
//!   `NO_RESULTS_ON_PAGE` warning scopes are copied from it verbatim (aggregated lists share
//!   that shape), and the `acceleratorType` URLs of attached GPUs are its `selfLink`s.
//! - **Built from the API reference** (no real `instances.aggregatedList` recording with GPUs
//!   exists in the corpus): the instance pages (`compute#instanceAggregatedList`: `items` by
//!   zone, `nextPageToken`, `unreachables`; instances with `guestAccelerators`, `scheduling`,
//!   `reservationAffinity`, `labels`, `status` and the `last*Timestamp` fields), the token
//!   endpoint's answer (`access_token`, `expires_in`, `token_type`) and the metadata server's.
//!   Without the corpus, the built pages use the same URL and warning shapes written inline.
//!
//! The corpus is found at `$GPULEDGER_CORPUS` or `<repo>/../shared/fixtures`; without it the
//! corpus test says it was skipped (`GPULEDGER_REQUIRE_CORPUS=1` makes that a failure).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use gpuledger_collect::collectors::cloud::{CloudInstance, InstanceState, Lifecycle};
use gpuledger_collect::collectors::gcp::{parse, GcpCollector};
use gpuledger_collect::{CollectError, Collector};
use gpuledger_model::Observation;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// The test's own service-account key (made for these tests with `openssl genpkey -algorithm
// RSA`; it signs nothing else) and its public key (PKCS #1 DER, base64), which the fake token
// endpoint verifies the assertion with.

const TEST_KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIIEuwIBADANBgkqhkiG9w0BAQEFAASCBKUwggShAgEAAoIBAQCVt9lUxBjvYghr
F/ux8mZrb9n1duAfYOduz/pYjfq9GO+fVZeKR5t11MT6IBJBJSN18ltqQH7rzXnw
BS1UqGLPdSXifmhSvjHR+Qh6GKH1qqwfDUi0Ev8g+HNs34iEinKj7EwN5yH+RzNy
mdQRw0pEGsmEKYYWH8nwRoV3A3osbHwQDRJ/ZCe5uVN7nX4QvrqY76fihnR/Y3Wm
dHBNsXa+ou9DqxqlCzPQJDq5ETpU2fxMMGm0momYcQ0qMtpnDWZxRx4u1lTxlmxt
q53RRRyLtSvA6zgJtPG5q+8h6sq+6PEdQmsRvHQmKYJDhFtuDS+mrPOv/MDalQWa
GpzjSU93AgMBAAECgf8HMu5eyaFdHkdViZrTsJEXmWe25dW8b5D6Z6QuMCubQW0H
QmWTLkv8G2mmbILVt3Nw3P+Ud8JloGlnP5uGxc7uT1hMJB01Y2m4tQnqKl1uhOTa
N9uWUyLAncP7QVaeXjqe1/S32v2o+VXDAkEFjXCpT5Q8azBu+EkY6SaaHpbHZ2lL
8HhAu+d8KW+SRQeGA1kAJlmUSxZmjQ0m6PRTdWsgCAhU78QJ0t4FKcVwEZZ1lglV
UREIXm8Ln5tZZ8KClDr63/mUpID7pGydZ4u73vYV4VrhcPwly+JS+1MhSZS2ZxJt
kpu0jX74j4U4no6C752MIz91InXqAbu2qJ+UQq0CgYEA041v1C/WEtbhIuHwtn6W
ks1bn7mwpPn6GKsiYFNN09nrBleIeWfjCMT5vwm73raZrKVDun53H9Pm3zFnSu8p
B3wrKiE0t+fR6JDhyUxRBmshLN0GrWDYJWqHIiE3IbZ7N5sXua6JE+9ZVwjh79Jt
0vDmge2wK/z7NURMf2EYvQ0CgYEAtSyXNVymDF6/GO8GyObv6R7RkgC4GTq7kbRT
UONwYMeOgNAOxmbe3ZQwToGkDcosGOFwAZIYuMvEafWSVFKj80Ud4aqhV5RYhHTm
Lb4kg/hMccnsSexLjOV+TOgWRIQRJ32sKt0hU1fNYMnNKv3RNe/kcz6NqiKcsQPf
3iIRhZMCgYASINykYjUGCEPiqVnnSZG9ortnRJJOkN1Nn9yiRIE21kW9lWKshKp/
5eFA7aSbwSoKEV9sa8npgE8YcTNYyIXLjmhkg9PwrnzeYQv4JAINesCtB4O698GN
80MBObdvvCNy8GdoEfzNKIWPX8N8uZuPp/UYzTV7j4I3XlLv13I3QQKBgQCbvQj+
RfY3C/sZY99hM6NnsaZU62lVxrcWOPylu90OVHybHj6VLjjGIGymD6sGb5QYjzHJ
J904fXEJ5J80/RUSOYfGRPcMYej1c8ep6plZGEgeSIVlxknrhBtd4OPDYgOc/trQ
veW3zvItEUvcePMueljW+B6u8bHgOIRoXsDRIQKBgCuGpaD6NUM6IZdxz0e/QYiv
mRfxrUeFBWPF4yZGBW5Vd3MU1WTlZ28mR2xzPu4tFqz3yPKAjnwFxb6eIEX3ytYm
d419sZismxuJv3OauQ7Y6cqzFzVvpqfFd7pyO/7lFIriejoG+a80IimDbB3DLiEb
YOHBClVSGJHHFkvq1C6p
-----END PRIVATE KEY-----
";

const TEST_PUBLIC_KEY_DER_B64: &str = "MIIBCgKCAQEAlbfZVMQY72IIaxf7sfJma2/Z9XbgH2Dnbs/6WI36vRjvn1WXikebddTE+iASQSUjdfJbakB+68158AUtVKhiz3Ul4n5oUr4x0fkIehih9aqsHw1ItBL/IPhzbN+IhIpyo+xMDech/kczcpnUEcNKRBrJhCmGFh/J8EaFdwN6LGx8EA0Sf2QnublTe51+EL66mO+n4oZ0f2N1pnRwTbF2vqLvQ6sapQsz0CQ6uRE6VNn8TDBptJqJmHENKjLaZw1mcUceLtZU8ZZsbaud0UUci7UrwOs4CbTxuavvIerKvujxHUJrEbx0JimCQ4Rbbg0vpqzzr/zA2pUFmhqc40lPdwIDAQAB";

const SA_EMAIL: &str = "gpuledger-reader@ml-research.iam.gserviceaccount.com";

// ---------------------------------------------------------------------------------------------
// Corpus

fn corpus_root() -> PathBuf {
    std::env::var_os("GPULEDGER_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"))
}

const RECORDING: &str =
    "cloud/gcp/compute-acceleratorTypes-aggregatedList-2018-k80-p4-p100-v100.json";

fn recording() -> Option<Value> {
    let path = corpus_root().join(RECORDING);
    match std::fs::read(&path) {
        Ok(bytes) => Some(serde_json::from_slice(&bytes).unwrap()),
        Err(_) if std::env::var_os("GPULEDGER_REQUIRE_CORPUS").is_some() => panic!(
            "GPULEDGER_REQUIRE_CORPUS is set but {} is missing; set GPULEDGER_CORPUS to the \
             fixtures folder",
            path.display()
        ),
        Err(_) => {
            eprintln!(
                "skipped: no GCP recording at {} (set GPULEDGER_CORPUS to the fixtures folder)",
                path.display()
            );
            None
        }
    }
}

/// An `acceleratorType` URL for `name`: the recording's `selfLink` for it when the corpus is
/// there, else one written in the same shape.
fn accelerator_url(rec: Option<&Value>, name: &str) -> String {
    rec.and_then(|r| {
        r["items"].as_object().unwrap().values().find_map(|scope| {
            scope["acceleratorTypes"]
                .as_array()?
                .iter()
                .find(|a| a["name"] == name)
                .and_then(|a| a["selfLink"].as_str().map(str::to_string))
        })
    })
    .unwrap_or_else(|| {
        format!(
            "https://www.googleapis.com/compute/v1/projects/ml-research/zones/us-central1-a/acceleratorTypes/{name}"
        )
    })
}

/// An empty zone's scope: the recording's own `NO_RESULTS_ON_PAGE` scope when the corpus is
/// there, else one written in the same shape.
fn empty_scope(rec: Option<&Value>) -> (String, Value) {
    rec.and_then(|r| {
        r["items"]
            .as_object()
            .unwrap()
            .iter()
            .find(|(_, v)| v.get("warning").is_some())
            .map(|(k, v)| (k.clone(), v.clone()))
    })
    .unwrap_or_else(|| {
        (
            "zones/europe-west1-c".into(),
            json!({"warning": {"code": "NO_RESULTS_ON_PAGE",
                "message": "There are no results for scope 'zones/europe-west1-c' on this page.",
                "data": [{"key": "scope", "value": "zones/europe-west1-c"}]}}),
        )
    })
}

/// The recorded answer read with the collector's aggregated-list reader: every zone scope is
/// either a list or an empty zone's warning, and every accelerator type's URL gives its name,
/// which the memory table knows.
#[test]
fn corpus_accelerator_types_recording_reads_whole() {
    let Some(rec) = recording() else { return };
    let bytes = serde_json::to_vec(&rec).unwrap();
    let a = parse::aggregated(&bytes, "acceleratorTypes").unwrap();
    assert!(a.problems.is_empty(), "{:?}", a.problems);
    assert_eq!(a.scopes_with_items.len(), 29);
    assert_eq!(a.empty_scopes, 26);
    assert_eq!(a.next_page_token, None);
    let mut names = BTreeMap::<String, usize>::new();
    for (path, item) in &a.items {
        let name = item["name"].as_str().unwrap();
        let link = item["selfLink"].as_str().unwrap();
        assert_eq!(parse::last_segment(link), name, "{path}");
        let zone = parse::last_segment(item["zone"].as_str().unwrap());
        assert!(
            path.starts_with(&format!("items.zones/{zone}.acceleratorTypes[")),
            "{path}"
        );
        assert!(
            parse::accelerator_memory_mib(name).is_some(),
            "{path}: no memory for {name}"
        );
        *names.entry(name.to_string()).or_default() += 1;
    }
    assert_eq!(
        names.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "nvidia-tesla-k80",
            "nvidia-tesla-p100",
            "nvidia-tesla-p100-vws",
            "nvidia-tesla-p4",
            "nvidia-tesla-p4-vws",
            "nvidia-tesla-v100"
        ]
    );
    assert_eq!(a.items.len(), names.values().sum::<usize>());
    // A region is what is left of the zone.
    assert_eq!(parse::region_of_zone("us-central1-a"), Some("us-central1"));
}

// ---------------------------------------------------------------------------------------------
// The fake Compute Engine, token endpoint and metadata server

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: BTreeMap<String, String>,
    authorization: Option<String>,
}

#[derive(Default)]
struct Fake {
    pages: BTreeMap<(String, Option<String>), (StatusCode, String)>,
    seen: Mutex<Vec<Seen>>,
    /// Assertions the token endpoint accepted.
    assertions: Mutex<Vec<String>>,
    token_url: Mutex<String>,
}

fn query_of(q: Option<&str>) -> BTreeMap<String, String> {
    reqwest::Url::parse(&format!("http://x/?{}", q.unwrap_or("")))
        .unwrap()
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Check an RS256 JWT with the test's public key; its claims when it verifies.
fn verify_jwt(jwt: &str) -> Result<(Value, Value), String> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = jwt.split('.').collect();
    if parts.len() != 3 {
        return Err(format!("{} parts", parts.len()));
    }
    let json = |part: &str| -> Result<Value, String> {
        serde_json::from_slice(&b64.decode(part).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())
    };
    let (header, claims) = (json(parts[0])?, json(parts[1])?);
    let sig = b64.decode(parts[2]).map_err(|e| e.to_string())?;
    let der = base64::engine::general_purpose::STANDARD
        .decode(TEST_PUBLIC_KEY_DER_B64)
        .unwrap();
    ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, der)
        .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig)
        .map_err(|_| "bad signature".to_string())?;
    Ok((header, claims))
}

async fn handle(
    State(fake): State<Arc<Fake>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: String,
) -> Response {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let query = query_of(uri.query());
    fake.seen.lock().unwrap().push(Seen {
        method: method.to_string(),
        path: uri.path().to_string(),
        query: query.clone(),
        authorization: auth.clone(),
    });
    let path = uri.path();
    if method == Method::POST && path == "/token" {
        let form = query_of(Some(&body));
        if form.get("grant_type").map(String::as_str)
            != Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
        {
            return (StatusCode::BAD_REQUEST, "unsupported_grant_type").into_response();
        }
        let assertion = form.get("assertion").cloned().unwrap_or_default();
        let (_, claims) = match verify_jwt(&assertion) {
            Ok(c) => c,
            Err(e) => {
                return (StatusCode::BAD_REQUEST, format!("invalid_grant: {e}")).into_response()
            }
        };
        if claims["iss"] == "refused@ml-research.iam.gserviceaccount.com" {
            return (StatusCode::BAD_REQUEST, r#"{"error":"invalid_grant"}"#).into_response();
        }
        if claims["aud"] != *fake.token_url.lock().unwrap() {
            return (StatusCode::BAD_REQUEST, "invalid_grant: aud").into_response();
        }
        fake.assertions.lock().unwrap().push(assertion);
        return axum::Json(
            json!({"access_token": "ya29.test-sa", "expires_in": 3599, "token_type": "Bearer"}),
        )
        .into_response();
    }
    if method == Method::GET
        && path == "/computeMetadata/v1/instance/service-accounts/default/token"
    {
        if headers.get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
            return (
                StatusCode::FORBIDDEN,
                "Missing Metadata-Flavor:Google header",
            )
                .into_response();
        }
        return axum::Json(
            json!({"access_token": "ya29.test-md", "expires_in": 3599, "token_type": "Bearer"}),
        )
        .into_response();
    }
    let Some(project) = path
        .strip_prefix("/compute/v1/projects/")
        .and_then(|p| p.strip_suffix("/aggregated/instances"))
    else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if !auth
        .as_deref()
        .is_some_and(|a| a.starts_with("Bearer ya29.test-"))
    {
        return (StatusCode::UNAUTHORIZED, "no token").into_response();
    }
    match fake
        .pages
        .get(&(project.to_string(), query.get("pageToken").cloned()))
    {
        Some((status, body)) => (
            *status,
            [("content-type", "application/json")],
            body.clone(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such page").into_response(),
    }
}

async fn serve(fake: Arc<Fake>) -> SocketAddr {
    let app = axum::Router::new().fallback(handle).with_state(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn zone_url(zone: &str) -> String {
    format!("https://www.googleapis.com/compute/v1/projects/ml-research/zones/{zone}")
}

fn machine_type_url(zone: &str, mt: &str) -> String {
    format!("{}/machineTypes/{mt}", zone_url(zone))
}

/// The `ml-research` project's two pages (built from the API reference; see the file's head).
fn research_pages(rec: Option<&Value>) -> [String; 2] {
    let (empty_name, empty) = empty_scope(rec);
    let mut page1 = serde_json::Map::new();
    page1.insert(
        "zones/us-central1-a".into(),
        json!({"instances": [
            {
                "kind": "compute#instance",
                "id": "4567890123456789012",
                "name": "v100-train-1",
                "zone": zone_url("us-central1-a"),
                "machineType": machine_type_url("us-central1-a", "n1-standard-32"),
                "status": "RUNNING",
                "creationTimestamp": "2026-10-01T08:00:00.000-07:00",
                "lastStartTimestamp": "2026-11-20T09:30:00.000-08:00",
                "guestAccelerators": [
                    {"acceleratorType": accelerator_url(rec, "nvidia-tesla-v100"), "acceleratorCount": 4}
                ],
                "scheduling": {"onHostMaintenance": "TERMINATE", "automaticRestart": true, "preemptible": false, "provisioningModel": "STANDARD"},
                "reservationAffinity": {"consumeReservationType": "ANY_RESERVATION"},
                "labels": {"team": "nlp", "env": "prod", "cost-center": "cc-101"}
            },
            {
                "kind": "compute#instance",
                "id": "4567890123456789013",
                "name": "h100-spot-1",
                "zone": zone_url("us-central1-a"),
                "machineType": machine_type_url("us-central1-a", "a3-highgpu-8g"),
                "status": "RUNNING",
                "creationTimestamp": "2026-11-30T23:00:00.000-08:00",
                "scheduling": {"provisioningModel": "SPOT", "preemptible": false, "instanceTerminationAction": "STOP"},
                "labels": {"team": "vision"}
            }
        ]}),
    );
    page1.insert(empty_name, empty);
    let page1 = json!({
        "kind": "compute#instanceAggregatedList",
        "id": "projects/ml-research/aggregated/instances",
        "items": page1,
        "nextPageToken": "Cg1wYWdlLXR3by10b2tlbg",
        "selfLink": "https://www.googleapis.com/compute/v1/projects/ml-research/aggregated/instances"
    });
    let page2 = json!({
        "kind": "compute#instanceAggregatedList",
        "id": "projects/ml-research/aggregated/instances",
        "items": {
            "zones/europe-west4-b": {"instances": [
                {
                    "name": "l4-infer-1",
                    "zone": "https://www.googleapis.com/compute/v1/projects/ml-research/zones/europe-west4-b",
                    "machineType": "https://www.googleapis.com/compute/v1/projects/ml-research/zones/europe-west4-b/machineTypes/g2-standard-24",
                    "status": "STAGING",
                    "creationTimestamp": "2026-12-01T10:00:00.000+01:00",
                    "lastStartTimestamp": "2026-12-03T07:00:00.000+01:00",
                    "reservationAffinity": {"consumeReservationType": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name", "values": ["l4-inference"]},
                    "labels": {"team": "search", "env": "prod"}
                },
                {
                    "name": "a100-old-1",
                    "zone": "https://www.googleapis.com/compute/v1/projects/ml-research/zones/europe-west4-b",
                    "machineType": "https://www.googleapis.com/compute/v1/projects/ml-research/zones/europe-west4-b/machineTypes/a2-ultragpu-2g",
                    "status": "TERMINATED",
                    "creationTimestamp": "2026-09-01T10:00:00.000+02:00",
                    "lastStartTimestamp": "2026-11-01T10:00:00.000+01:00",
                    "lastStopTimestamp": "2026-12-02T18:45:12.345+01:00",
                    "scheduling": {"preemptible": true},
                    "labels": {"team": "nlp"}
                },
                {
                    "name": "k80-broken",
                    "zone": "https://www.googleapis.com/compute/v1/projects/ml-research/zones/europe-west4-b",
                    "machineType": "https://www.googleapis.com/compute/v1/projects/ml-research/zones/europe-west4-b/machineTypes/n1-standard-8",
                    "status": "RUNNING",
                    "guestAccelerators": [
                        {"acceleratorType": accelerator_url(rec, "nvidia-tesla-k80"), "acceleratorCount": "eight"}
                    ]
                },
                {
                    "name": "web-1",
                    "zone": "https://www.googleapis.com/compute/v1/projects/ml-research/zones/europe-west4-b",
                    "machineType": "https://www.googleapis.com/compute/v1/projects/ml-research/zones/europe-west4-b/machineTypes/e2-standard-4",
                    "status": "RUNNING",
                    "labels": {"team": "web"}
                }
            ]}
        },
        "unreachables": ["zones/asia-east1-c"]
    });
    [page1.to_string(), page2.to_string()]
}

struct Setup {
    fake: Arc<Fake>,
    addr: SocketAddr,
    dir: PathBuf,
}

async fn setup(name: &str) -> Setup {
    let rec = recording();
    let [p1, p2] = research_pages(rec.as_ref());
    let mut pages = BTreeMap::new();
    let ok = StatusCode::OK;
    pages.insert(("ml-research".to_string(), None), (ok, p1));
    pages.insert(
        (
            "ml-research".to_string(),
            Some("Cg1wYWdlLXR3by10b2tlbg".to_string()),
        ),
        (ok, p2),
    );
    pages.insert(
        ("ml-prod".to_string(), None),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":{"code":503,"message":"Backend Error"}}"#.to_string(),
        ),
    );
    pages.insert(
        ("locked-proj".to_string(), None),
        (
            StatusCode::FORBIDDEN,
            r#"{"error":{"code":403,"message":"Required 'compute.instances.list' permission for 'projects/locked-proj'","errors":[{"reason":"forbidden"}]}}"#.to_string(),
        ),
    );
    pages.insert(
        ("garbled".to_string(), None),
        (
            StatusCode::OK,
            r#"{"items": {"zones/us-east1-b": {"instances": [{"name": "x""#.to_string(),
        ),
    );
    pages.insert(
        ("listed".to_string(), None),
        (StatusCode::OK, r#"{"items": [{"name": "x"}]}"#.to_string()),
    );
    let fake = Arc::new(Fake {
        pages,
        ..Fake::default()
    });
    let addr = serve(fake.clone()).await;
    *fake.token_url.lock().unwrap() = format!("http://{addr}/token");
    let dir = std::env::temp_dir().join(format!("gpuledger-gcp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, email) in [
        ("key.json", SA_EMAIL),
        (
            "refused.json",
            "refused@ml-research.iam.gserviceaccount.com",
        ),
    ] {
        std::fs::write(
            dir.join(file),
            json!({
                "type": "service_account",
                "project_id": "ml-research",
                "private_key_id": "0123456789abcdef0123456789abcdef01234567",
                "private_key": TEST_KEY_PEM,
                "client_email": email,
                "client_id": "100000000000000000001",
                "token_uri": "https://oauth2.googleapis.com/token"
            })
            .to_string(),
        )
        .unwrap();
    }
    Setup { fake, addr, dir }
}

fn collector(s: &Setup, projects: &[&str], key: Option<&str>) -> GcpCollector {
    let addr = s.addr;
    let creds = key
        .map(|k| format!("credentials_file = \"{}\"\n", s.dir.join(k).display()))
        .unwrap_or_default();
    GcpCollector::from_toml(
        "gcp-test",
        &format!(
            "projects = {projects:?}\n{creds}api_url = \"http://{addr}/compute/v1\"\n\
             token_url = \"http://{addr}/token\"\nmetadata_url = \"http://{addr}/computeMetadata/v1\"\n\
             page_size = 2\ntimeout_secs = 5\n"
        ),
    )
    .unwrap()
}

fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn by_id(instances: &[CloudInstance]) -> BTreeMap<&str, &CloudInstance> {
    instances
        .iter()
        .map(|i| (i.instance_id.as_str(), i))
        .collect()
}

/// One line per instance: what the report to the lead summarizes.
fn summary(i: &CloudInstance) -> String {
    let gpus = i
        .gpus
        .as_ref()
        .map(|g| format!("{}x{} {:?}MiB", g.count, g.model, g.memory_mib))
        .unwrap_or_else(|| "no GPUs".into());
    format!(
        "{} {} {} {} {:?} {:?} {:?}",
        i.account, i.instance_id, i.instance_type, gpus, i.lifecycle, i.state, i.tags
    )
}

// ---------------------------------------------------------------------------------------------
// replay_*

/// Two pages of one project, a project that answers 503, a service-account key whose RS256
/// assertion the fake token endpoint verifies with the public key.
#[tokio::test]
async fn replay_reads_every_page_and_keeps_going_past_a_failed_project() {
    let s = setup("pages").await;
    let c = collector(&s, &["ml-research", "ml-prod"], Some("key.json"));
    let (instances, problems) = c.instances().await.unwrap();
    for i in &instances {
        eprintln!("{}", summary(i));
    }
    let got = by_id(&instances);
    assert_eq!(
        got.keys().copied().collect::<Vec<_>>(),
        [
            "a100-old-1",
            "h100-spot-1",
            "l4-infer-1",
            "v100-train-1",
            "web-1"
        ],
        "k80-broken is left out with its problem"
    );

    // Attached GPUs, labels, on-demand, launch time from the last start.
    let v = got["v100-train-1"];
    let g = v.gpus.as_ref().unwrap();
    assert_eq!(
        (g.model.as_str(), g.count, g.memory_mib, g.fraction),
        ("nvidia-tesla-v100", 4, Some(16_384), None)
    );
    assert_eq!(
        (v.account.as_str(), v.zone.as_deref(), v.region.as_deref()),
        ("ml-research", Some("us-central1-a"), Some("us-central1"))
    );
    assert_eq!(v.instance_type, "n1-standard-32");
    assert_eq!(v.host_name.as_deref(), Some("v100-train-1"));
    assert_eq!(
        v.lifecycle,
        Lifecycle::OnDemand,
        "ANY_RESERVATION says no reservation was used"
    );
    assert_eq!(v.launch_time, Some(t("2026-11-20T17:30:00Z")));
    assert_eq!(v.state, InstanceState::Running);
    assert_eq!(
        v.tags,
        [("cost-center", "cc-101"), ("env", "prod"), ("team", "nlp")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    );

    // Built-in GPUs, spot, launch time from creation when never restarted.
    let h = got["h100-spot-1"];
    let g = h.gpus.as_ref().unwrap();
    assert_eq!(
        (g.model.as_str(), g.count, g.memory_mib),
        ("nvidia-h100-80gb", 8, Some(81_920))
    );
    assert_eq!(h.lifecycle, Lifecycle::Spot);
    assert_eq!(h.launch_time, Some(t("2026-12-01T07:00:00Z")));

    // G2 with its L4s built in, a specific reservation, starting (STAGING) counts as running.
    let l = got["l4-infer-1"];
    let g = l.gpus.as_ref().unwrap();
    assert_eq!(
        (g.model.as_str(), g.count, g.memory_mib),
        ("nvidia-l4", 2, Some(24_576))
    );
    assert_eq!(l.lifecycle, Lifecycle::Reserved);
    assert_eq!(l.state, InstanceState::Running);
    assert_eq!(
        (l.zone.as_deref(), l.region.as_deref()),
        (Some("europe-west4-b"), Some("europe-west4"))
    );

    // Stopped: its GPUs end at the stop time the API gives.
    let a = got["a100-old-1"];
    assert_eq!(
        a.state,
        InstanceState::Stopped {
            since: Some(t("2026-12-02T17:45:12.345Z")),
            state: "TERMINATED".into()
        }
    );
    assert_eq!(a.gpus.as_ref().unwrap().count, 2);
    assert_eq!(a.gpus.as_ref().unwrap().model, "nvidia-a100-80gb");
    assert_eq!(a.lifecycle, Lifecycle::Spot, "legacy preemptible is spot");

    assert_eq!(got["web-1"].gpus, None);

    // Problems: the unreadable instance (naming its field), the unreachable zone, the 503.
    let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(problems.len(), 3, "{text:#?}");
    assert!(
        text.iter().any(|p| p.contains("project `ml-research`")
            && p.contains("items.zones/europe-west4-b.instances[2] (k80-broken).guestAccelerators[0].acceleratorCount: expected a number, got a string")),
        "{text:#?}"
    );
    assert!(matches!(
        problems
            .iter()
            .find(|p| p.to_string().contains("k80-broken"))
            .unwrap()
            .error,
        CollectError::Data(_)
    ));
    assert!(
        text.iter()
            .any(|p| p.contains("zones/asia-east1-c was unreachable")),
        "{text:#?}"
    );
    let prod = problems
        .iter()
        .find(|p| p.part == "project `ml-prod`")
        .expect("the 503 project is a part problem");
    assert!(matches!(prod.error, CollectError::Transient(_)), "{prod}");
    assert!(prod.to_string().contains("503"), "{prod}");

    // The requests: paging with maxResults and pageToken, a bearer token from the assertion.
    let seen = s.fake.seen.lock().unwrap().clone();
    let research: Vec<&Seen> = seen
        .iter()
        .filter(|r| r.path == "/compute/v1/projects/ml-research/aggregated/instances")
        .collect();
    assert_eq!(research.len(), 2);
    assert!(research.iter().all(|r| r.method == "GET"
        && r.query.get("maxResults").map(String::as_str) == Some("2")
        && r.query.get("returnPartialSuccess").map(String::as_str) == Some("true")
        && r.authorization.as_deref() == Some("Bearer ya29.test-sa")));
    assert_eq!(research[0].query.get("pageToken"), None);
    assert_eq!(
        research[1].query.get("pageToken").map(String::as_str),
        Some("Cg1wYWdlLXR3by10b2tlbg")
    );

    // The assertion the collector sent verifies with the public key and says the right things.
    let assertions = s.fake.assertions.lock().unwrap().clone();
    assert_eq!(assertions.len(), 1);
    let (header, claims) = verify_jwt(&assertions[0]).unwrap();
    assert_eq!(header["alg"], "RS256");
    assert_eq!(header["kid"], "0123456789abcdef0123456789abcdef01234567");
    assert_eq!(claims["iss"], SA_EMAIL);
    assert_eq!(
        claims["scope"],
        "https://www.googleapis.com/auth/compute.readonly"
    );
    assert_eq!(claims["aud"], format!("http://{}/token", s.addr));
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        3600
    );
    let now = Utc::now().timestamp();
    assert!((claims["iat"].as_i64().unwrap() - now).abs() < 60);
    // A tampered assertion does not verify: the check can fail.
    let mut tampered: Vec<char> = assertions[0].chars().collect();
    let at = tampered.len() - 20;
    tampered[at] = if tampered[at] == 'A' { 'B' } else { 'A' };
    let tampered: String = tampered.into_iter().collect();
    assert_eq!(verify_jwt(&tampered).unwrap_err(), "bad signature");

    // A second run reuses the token; its report has the observations of running GPU instances.
    let report = c.collect_report().await.unwrap();
    assert_eq!(
        s.fake.assertions.lock().unwrap().len(),
        1,
        "the token is kept"
    );
    for o in &report.observations {
        eprintln!("{}", serde_json::to_string(o).unwrap());
    }
    let mut hosts: Vec<(String, u32, Option<String>)> = Vec::new();
    let mut stopped = Vec::new();
    for o in &report.observations {
        match o {
            Observation::HostGpuCount { gpus, provenance } => {
                assert_eq!(provenance.source, "gcp-test");
                assert_eq!(gpus.account.as_deref(), Some("ml-research"));
                hosts.push((gpus.host.clone(), gpus.count, gpus.model.clone()))
            }
            Observation::HostStopped { host, at, .. } => {
                stopped.push((host.clone(), at.to_rfc3339()))
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        stopped,
        [(
            "a100-old-1".to_string(),
            "2026-12-02T17:45:12.345+00:00".to_string()
        )],
        "the terminated instance says since when"
    );
    hosts.sort();
    assert_eq!(
        hosts,
        [
            (
                "h100-spot-1".to_string(),
                8,
                Some("nvidia-h100-80gb".to_string())
            ),
            ("l4-infer-1".to_string(), 2, Some("nvidia-l4".to_string())),
            (
                "v100-train-1".to_string(),
                4,
                Some("nvidia-tesla-v100".to_string())
            ),
        ],
        "the one without GPUs reports nothing"
    );
    assert_eq!(report.problems.len(), 3);
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// Without a key file the token comes from the metadata server, asked with its header.
#[tokio::test]
async fn replay_metadata_server_token() {
    if std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS").is_some() {
        eprintln!("skipped: GOOGLE_APPLICATION_CREDENTIALS is set, so a key file is used");
        return;
    }
    let s = setup("metadata").await;
    let c = collector(&s, &["ml-research"], None);
    let (instances, _) = c.instances().await.unwrap();
    assert_eq!(instances.len(), 5);
    let seen = s.fake.seen.lock().unwrap().clone();
    assert_eq!(
        seen[0].path,
        "/computeMetadata/v1/instance/service-accounts/default/token"
    );
    assert!(seen[1..]
        .iter()
        .all(|r| r.authorization.as_deref() == Some("Bearer ya29.test-md")));
    assert!(s.fake.assertions.lock().unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// A 403 is a configuration error naming the project; alone it fails the run, beside a
/// readable project it is that project's problem.
#[tokio::test]
async fn replay_forbidden_project_is_a_config_error_naming_it() {
    let s = setup("forbidden").await;
    let e = collector(&s, &["locked-proj"], Some("key.json"))
        .instances()
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, CollectError::Config(_)), "{e:?}");
    assert!(
        text.contains("project `locked-proj`") && text.contains("403"),
        "{text}"
    );
    assert!(text.contains("compute.instances.list"), "{text}");
    assert!(!e.is_retryable());

    let (instances, problems) = collector(&s, &["locked-proj", "ml-research"], Some("key.json"))
        .instances()
        .await
        .unwrap();
    assert_eq!(instances.len(), 5);
    let p = problems
        .iter()
        .find(|p| p.part == "project `locked-proj`")
        .unwrap();
    assert!(matches!(p.error, CollectError::Config(_)));
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// Answers that are not instance lists are data errors that say what was wrong.
#[tokio::test]
async fn replay_malformed_answers_are_data_errors_naming_the_field() {
    let s = setup("malformed").await;
    let e = collector(&s, &["garbled"], Some("key.json"))
        .instances()
        .await
        .unwrap_err();
    // One project that failed with a data error: the run is worth retrying.
    assert!(matches!(e, CollectError::Transient(_)), "{e:?}");
    assert!(
        e.to_string().contains("project `garbled`") && e.to_string().contains("not JSON"),
        "{e}"
    );
    let (_, problems) = collector(&s, &["listed", "ml-research"], Some("key.json"))
        .instances()
        .await
        .unwrap();
    let p = problems
        .iter()
        .find(|p| p.part == "project `listed`")
        .unwrap();
    assert!(matches!(p.error, CollectError::Data(_)), "{p}");
    assert!(
        p.to_string()
            .contains("items: expected an object, got a list"),
        "{p}"
    );
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// A key the token endpoint refuses, and a key file that is not one, are configuration errors.
#[tokio::test]
async fn replay_refused_or_unreadable_keys_are_config_errors() {
    let s = setup("refused").await;
    let e = collector(&s, &["ml-research"], Some("refused.json"))
        .instances()
        .await
        .unwrap_err();
    assert!(matches!(e, CollectError::Config(_)), "{e:?}");
    assert!(
        e.to_string().contains("/token") && e.to_string().contains("400"),
        "{e}"
    );
    std::fs::write(
        s.dir.join("user.json"),
        r#"{"type": "authorized_user", "client_id": "x"}"#,
    )
    .unwrap();
    let e = collector(&s, &["ml-research"], Some("user.json"))
        .instances()
        .await
        .unwrap_err();
    assert!(matches!(e, CollectError::Config(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains("`authorized_user` credentials are not read"),
        "{e}"
    );
    let e = collector(&s, &["ml-research"], Some("missing.json"))
        .instances()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot read it"), "{e}");
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// The kind is registered: `type = "gcp"` builds this collector through the registry.
#[test]
fn registered_as_gcp() {
    let c = gpuledger_collect::build(
        "gcp",
        "gcp-prod",
        "projects = [\"ml-prod\"]\ncredentials_file = \"/k.json\"\n",
    )
    .unwrap();
    assert_eq!((c.kind(), c.name()), ("gcp", "gcp-prod"));
}

// ---------------------------------------------------------------------------------------------
// mutated_*: every node of the replayed pages replaced by each JSON type, and the pages cut at
// every length: the reader answers or names a problem, never panics.

/// Every JSON pointer in `v`.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(c, p, out);
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(c, p, out);
            }
        }
        _ => {}
    }
}

/// Read a page the way the collector does; the number of instances read and problems named.
fn read_page(body: &[u8]) -> Result<(usize, usize), String> {
    let a = parse::aggregated(body, "instances")?;
    let mut ok = 0;
    let mut bad = a.problems.len();
    for (path, item) in &a.items {
        match parse::instance("ml-research", path, item) {
            Ok(_) => ok += 1,
            Err(m) => {
                assert!(
                    m.starts_with(path.as_str()),
                    "a problem names its instance: {m}"
                );
                bad += 1;
            }
        }
    }
    Ok((ok, bad))
}

#[test]
fn mutated_pages_never_panic_and_name_their_problems() {
    let rec = recording();
    let mut tried = 0;
    for page in research_pages(rec.as_ref()) {
        let v: Value = serde_json::from_str(&page).unwrap();
        let mut ps = Vec::new();
        pointers(&v, String::new(), &mut ps);
        for p in &ps {
            for replacement in [
                json!(null),
                json!(7),
                json!(-1.5),
                json!("x"),
                json!([]),
                json!({}),
                json!(true),
            ] {
                let mut m = v.clone();
                *m.pointer_mut(p).unwrap() = replacement;
                let _ = read_page(m.to_string().as_bytes());
                tried += 1;
            }
        }
        let bytes = page.as_bytes();
        for cut in 0..bytes.len() {
            let _ = read_page(&bytes[..cut]);
        }
    }
    assert!(tried > 500, "{tried}");
}
