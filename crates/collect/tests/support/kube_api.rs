//! A stand-in for a Kubernetes API server, for tests only: no real API server can run here (it
//! needs a container runtime), so this serves recorded real objects (the corpus's Node and Pod
//! objects) over HTTP the way the API server does, and the real kube-rs client talks to it.
//!
//! It answers `GET /api/v1/{nodes,pods,namespaces}` as a list (with a `resourceVersion`) and,
//! with `watch=true`, as a watch stream of `ADDED`/`MODIFIED`/`DELETED` events newer than the
//! asked version, held open until `timeoutSeconds` like the real server. [`FakeApi::expire`]
//! makes the open and next watch of a resource answer `410 Gone` ("too old resource version"),
//! after which a client must list again. Every request is logged for load figures.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// The three resources the collector reads.
pub const RESOURCES: [&str; 3] = ["nodes", "pods", "namespaces"];

#[derive(Default)]
struct Inner {
    version: u64,
    /// Current objects by resource, keyed `namespace/name`.
    objects: BTreeMap<&'static str, BTreeMap<String, Value>>,
    /// Every change: (version, resource, type, object).
    events: Vec<(u64, &'static str, &'static str, Value)>,
    /// Resources whose watches must answer 410 Gone once.
    expired: BTreeMap<&'static str, bool>,
    /// Requests seen: (when, resource, watch?).
    requests: Vec<(Instant, String, bool)>,
}

/// A running fake API server; it stops when the test's runtime ends.
#[derive(Clone)]
pub struct FakeApi {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
}

fn resource_of(kind: &str) -> &'static str {
    match kind {
        "Node" => "nodes",
        "Pod" => "pods",
        "Namespace" => "namespaces",
        other => panic!("the fake API server serves no {other}"),
    }
}

fn key_of(o: &Value) -> String {
    let m = &o["metadata"];
    format!(
        "{}/{}",
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().expect("objects need metadata.name")
    )
}

fn list_kind(resource: &str) -> &'static str {
    match resource {
        "nodes" => "NodeList",
        "pods" => "PodList",
        _ => "NamespaceList",
    }
}

impl FakeApi {
    /// Serve `objects` (each a full object with `kind`) on a free port of 127.0.0.1.
    pub async fn start(objects: Vec<Value>) -> FakeApi {
        let api = FakeApi {
            addr: "127.0.0.1:0".parse().unwrap(),
            inner: Arc::new(Mutex::new(Inner::default())),
        };
        for o in objects {
            api.apply(o);
        }
        let app = axum::Router::new()
            .route("/api/v1/{resource}", axum::routing::get(handle))
            .with_state(api.inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeApi { addr, ..api }
    }

    /// Add or replace an object (an `ADDED` or `MODIFIED` event).
    pub fn apply(&self, mut o: Value) {
        let mut inner = self.inner.lock().unwrap();
        inner.version += 1;
        let v = inner.version;
        o["metadata"]["resourceVersion"] = json!(v.to_string());
        let resource = resource_of(o["kind"].as_str().expect("objects need a kind"));
        let key = key_of(&o);
        let old = inner
            .objects
            .entry(resource)
            .or_default()
            .insert(key, o.clone());
        let kind = if old.is_some() { "MODIFIED" } else { "ADDED" };
        inner.events.push((v, resource, kind, o));
    }

    /// Delete an object (a `DELETED` event).
    pub fn delete(&self, resource: &'static str, namespace: &str, name: &str) {
        let mut inner = self.inner.lock().unwrap();
        inner.version += 1;
        let v = inner.version;
        let mut o = inner
            .objects
            .get_mut(resource)
            .and_then(|m| m.remove(&format!("{namespace}/{name}")))
            .expect("deleting an object that is not there");
        o["metadata"]["resourceVersion"] = json!(v.to_string());
        inner.events.push((v, resource, "DELETED", o));
    }

    /// The resource's watches answer 410 Gone, as the API server does once its history no
    /// longer reaches the client's version.
    pub fn expire(&self, resource: &'static str) {
        self.inner.lock().unwrap().expired.insert(resource, true);
    }

    /// Requests so far: (resource, is a watch).
    pub fn requests(&self) -> Vec<(String, bool)> {
        let inner = self.inner.lock().unwrap();
        inner
            .requests
            .iter()
            .map(|(_, r, w)| (r.clone(), *w))
            .collect()
    }

    /// Requests since `since`.
    pub fn requests_since(&self, since: Instant) -> usize {
        let inner = self.inner.lock().unwrap();
        inner
            .requests
            .iter()
            .filter(|(t, _, _)| *t >= since)
            .count()
    }

    /// A kubeconfig file pointing at this server, written into `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: reader\nusers:\n- name: reader\n  user:\n    token: read-only-test-token\n",
                self.addr
            ),
        )
        .unwrap();
        path
    }
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    UrlPath(resource): UrlPath<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let Some(resource) = RESOURCES.iter().copied().find(|r| *r == resource) else {
        return (axum::http::StatusCode::NOT_FOUND, "no such resource").into_response();
    };
    let watch = q.get("watch").map(String::as_str) == Some("true");
    let mut guard = inner.lock().unwrap();
    guard
        .requests
        .push((Instant::now(), resource.to_string(), watch));
    if !watch {
        let items: Vec<Value> = guard
            .objects
            .get(resource)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        let body = json!({
            "kind": list_kind(resource), "apiVersion": "v1",
            "metadata": {"resourceVersion": guard.version.to_string()},
            "items": items,
        });
        return axum::Json(body).into_response();
    }
    drop(guard);
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = Duration::from_secs(
        q.get("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(290),
    );
    let started = Instant::now();
    // One step per 50 ms: send what is new, a 410 when expired, end at the timeout.
    let stream = futures_util::stream::unfold(
        (inner, from, false),
        move |(inner, cursor, done)| async move {
            if done {
                return None;
            }
            loop {
                {
                    let mut g = inner.lock().unwrap();
                    if g.expired.get(resource).copied().unwrap_or(false) {
                        g.expired.insert(resource, false);
                        let status = json!({"type": "ERROR", "object": {
                            "kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "reason": "Expired", "code": 410,
                            "message": format!("too old resource version: {cursor} ({})", g.version)}});
                        let line = Bytes::from(format!("{status}\n"));
                        return Some((
                            Ok::<_, std::convert::Infallible>(line),
                            (inner.clone(), cursor, true),
                        ));
                    }
                    let new: Vec<&(u64, &str, &str, Value)> = g
                        .events
                        .iter()
                        .filter(|(v, r, _, _)| *v > cursor && *r == resource)
                        .collect();
                    if !new.is_empty() {
                        let mut text = String::new();
                        let mut last = cursor;
                        for (v, _, kind, o) in new {
                            text.push_str(&json!({"type": kind, "object": o}).to_string());
                            text.push('\n');
                            last = *v;
                        }
                        return Some((Ok(Bytes::from(text)), (inner.clone(), last, false)));
                    }
                }
                if started.elapsed() >= timeout {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        },
    );
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}
