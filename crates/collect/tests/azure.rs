//! Tests of the `azure` collector against a local server on 127.0.0.1 replaying Azure Resource
//! Manager's answers, with a fake Microsoft Entra ID token endpoint and a fake instance
//! metadata service.
//!
//! Which answers are recorded and which are built: **all are built from the API reference**.
//! The corpus holds no Azure recording (`SOURCES.md`: no usable `virtualMachines` or
//! `resourceSkus` response was found). Built: the virtual machine list with `statusOnly=true`
//! (`value`, `nextLink`; each VM's `name`, `location`, `zones`, `tags`, `properties` with
//! `hardwareProfile.vmSize`, `priority`, `capacityReservation`, `osProfile.computerName`,
//! `timeCreated` and `instanceView.statuses` with `ProvisioningState/…` and `PowerState/…`),
//! `resourceSkus` (`value` of `resourceType`, `name`, `locations`, `capabilities`), Resource
//! Manager's error bodies (`{"error": {"code", "message"}}`), the v2.0 token endpoint's answer
//! and the metadata service's (whose numbers are strings).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use gpuledger_collect::collectors::azure::AzureCollector;
use gpuledger_collect::collectors::cloud::{CloudInstance, InstanceState, Lifecycle};
use gpuledger_collect::{CollectError, Collector};
use gpuledger_model::Observation;
use serde_json::{json, Value};

const RESEARCH: &str = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b";
const DOWN: &str = "7a2b3c4d-5e6f-4a70-8b9c-0d1e2f3a4b5c";
const LOCKED: &str = "8b3c4d5e-6f70-4b81-9cad-1e2f3a4b5c6d";
const GARBLED: &str = "9c4d5e6f-7081-4c92-adbe-2f3a4b5c6d7e";
const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
const CLIENT: &str = "3e1d2c4b-5a69-4f78-9e0d-1c2b3a4d5e6f";
const SECRET: &str = "s3cret-from-a-file";
const FEDERATED: &str = "eyJhbGciOiJSUzI1NiJ9.federated-token-of-the-pod.sig";

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: BTreeMap<String, String>,
    authorization: Option<String>,
    form: BTreeMap<String, String>,
    metadata_header: Option<String>,
}

#[derive(Default)]
struct Fake {
    addr: Mutex<Option<SocketAddr>>,
    seen: Mutex<Vec<Seen>>,
}

fn pairs(q: Option<&str>) -> BTreeMap<String, String> {
    reqwest::Url::parse(&format!("http://x/?{}", q.unwrap_or("")))
        .unwrap()
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn vm_id(sub: &str, rg: &str, name: &str) -> String {
    format!("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}")
}

/// A VM as the list with `statusOnly=true` gives it.
fn vm(name: &str, size: &str, power: &str, extra: Value) -> Value {
    let mut v = json!({
        "name": name,
        "id": vm_id(RESEARCH, "rg-ml", name),
        "type": "Microsoft.Compute/virtualMachines",
        "location": "eastus",
        "properties": {
            "vmId": format!("00000000-0000-4000-8000-{:012x}", name.len()),
            "hardwareProfile": {"vmSize": size},
            "provisioningState": "Succeeded",
            "timeCreated": "2026-11-02T10:15:30.1234567+00:00",
            "osProfile": {"computerName": name, "adminUsername": "azureuser"},
            "instanceView": {"statuses": [
                {"code": "ProvisioningState/succeeded", "level": "Info", "displayStatus": "Provisioning succeeded", "time": "2026-12-01T06:00:00.0000000+00:00"},
                {"code": format!("PowerState/{power}"), "level": "Info", "displayStatus": format!("VM {power}")}
            ]}
        }
    });
    merge(&mut v, extra);
    v
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

fn research_page(n: u32, addr: SocketAddr) -> Value {
    match n {
        1 => json!({
            "value": [
                vm("nd-h100-01", "Standard_ND96isr_H100_v5", "running", json!({
                    "zones": ["2"],
                    "tags": {"team": "llm", "env": "prod"}
                })),
                vm("nc-a100-spot", "Standard_NC24ads_A100_v4", "running", json!({
                    "tags": {"team": "vision"},
                    "properties": {"priority": "Spot", "evictionPolicy": "Deallocate", "billingProfile": {"maxPrice": -1}}
                })),
                vm("nv-a10-desk", "Standard_NV12ads_A10_v5", "running", json!({
                    "tags": {"team": "design"},
                    "properties": {"priority": "Regular"}
                }))
            ],
            "nextLink": format!(
                "http://{addr}/subscriptions/{RESEARCH}/providers/Microsoft.Compute/virtualMachines?api-version=2024-07-01&statusOnly=true&%24skiptoken=page2"
            )
        }),
        _ => json!({
            "value": [
                vm("mi300x-01", "Standard_ND96isr_MI300X_v5", "running", json!({
                    "tags": {"team": "llm"},
                    "properties": {"capacityReservation": {"capacityReservationGroup": {"id": format!("/subscriptions/{RESEARCH}/resourceGroups/rg-ml/providers/Microsoft.Compute/capacityReservationGroups/crg-mi300x")}}}
                })),
                vm("nc-t4-dealloc", "Standard_NC4as_T4_v3", "deallocated", json!({"tags": {"team": "nlp"}})),
                vm("ng-v620", "Standard_NG32ads_V620_v1", "running", json!({"tags": {"team": "design"}})),
                vm("nc-v100-stopped", "Standard_NC6s_v3", "stopped", json!({})),
                vm("d4-web", "Standard_D4s_v5", "running", json!({"tags": {"team": "web"}})),
                vm("broken", "Standard_NC6s_v3", "running", json!({"properties": {"priority": 7}}))
            ]
        }),
    }
}

fn skus_page() -> Value {
    json!({"value": [
        {"resourceType": "disks", "name": "Premium_LRS", "locations": ["eastus"]},
        {"resourceType": "virtualMachines", "name": "Standard_NG32ads_V620_v1", "tier": "Standard",
         "size": "NG32ads_V620_v1", "family": "StandardNGADSV620v1Family", "locations": ["eastus"],
         "capabilities": [{"name": "vCPUs", "value": "32"}, {"name": "MemoryGB", "value": "64"}, {"name": "GPUs", "value": "1"}]},
        {"resourceType": "virtualMachines", "name": "Standard_D4s_v5", "locations": ["eastus"],
         "capabilities": [{"name": "vCPUs", "value": "4"}]}
    ]})
}

fn json_response(status: StatusCode, v: Value) -> Response {
    (status, axum::Json(v)).into_response()
}

async fn handle(
    State(fake): State<Arc<Fake>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: String,
) -> Response {
    let header = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let query = pairs(uri.query());
    let form = if method == Method::POST {
        pairs(Some(&body))
    } else {
        BTreeMap::new()
    };
    fake.seen.lock().unwrap().push(Seen {
        method: method.to_string(),
        path: uri.path().to_string(),
        query: query.clone(),
        authorization: header("authorization"),
        form: form.clone(),
        metadata_header: header("metadata"),
    });
    let addr = fake.addr.lock().unwrap().unwrap();
    let path = uri.path();
    let get = |k: &str| form.get(k).map(String::as_str);

    if method == Method::POST && path == format!("/{TENANT}/oauth2/v2.0/token") {
        let ok_scope = get("scope") == Some("https://management.azure.com/.default");
        let ok_client =
            get("grant_type") == Some("client_credentials") && get("client_id") == Some(CLIENT);
        let token = if !ok_scope || !ok_client {
            None
        } else if get("client_secret") == Some(SECRET) {
            Some("az-token-sp")
        } else if get("client_assertion_type")
            == Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
            && get("client_assertion") == Some(FEDERATED)
        {
            Some("az-token-wi")
        } else {
            None
        };
        return match token {
            Some(t) => json_response(
                StatusCode::OK,
                json!({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": t}),
            ),
            None => json_response(
                StatusCode::UNAUTHORIZED,
                json!({"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret provided."}),
            ),
        };
    }
    if method == Method::GET && path == "/metadata/identity/oauth2/token" {
        if header("metadata").as_deref() != Some("true")
            || query.get("api-version").map(String::as_str) != Some("2018-02-01")
            || query.get("resource").map(String::as_str) != Some("https://management.azure.com/")
        {
            return json_response(
                StatusCode::BAD_REQUEST,
                json!({"error": "invalid_request", "error_description": "Required metadata header not specified"}),
            );
        }
        return json_response(
            StatusCode::OK,
            json!({
                "access_token": "az-token-mi", "client_id": CLIENT, "expires_in": "86399",
                "expires_on": "1796300000", "ext_expires_in": "86399", "not_before": "1796213300",
                "resource": "https://management.azure.com/", "token_type": "Bearer"
            }),
        );
    }
    if !header("authorization").is_some_and(|a| a.starts_with("Bearer az-token-")) {
        return json_response(
            StatusCode::UNAUTHORIZED,
            json!({"error": {"code": "AuthenticationFailed", "message": "no token"}}),
        );
    }
    let vms =
        |sub: &str| format!("/subscriptions/{sub}/providers/Microsoft.Compute/virtualMachines");
    let skus = format!("/subscriptions/{RESEARCH}/providers/Microsoft.Compute/skus");
    if path == vms(RESEARCH) {
        if query.get("api-version").map(String::as_str) != Some("2024-07-01")
            || query.get("statusOnly").map(String::as_str) != Some("true")
        {
            return json_response(
                StatusCode::BAD_REQUEST,
                json!({"error": {"code": "InvalidApiVersionParameter", "message": "x"}}),
            );
        }
        let page = if query.get("$skiptoken").map(String::as_str) == Some("page2") {
            2
        } else {
            1
        };
        return json_response(StatusCode::OK, research_page(page, addr));
    }
    if path == skus {
        if query.get("$filter").map(String::as_str) != Some("location eq 'eastus'")
            || query.get("api-version").map(String::as_str) != Some("2021-07-01")
        {
            return json_response(
                StatusCode::BAD_REQUEST,
                json!({"error": {"code": "BadRequest", "message": "filter"}}),
            );
        }
        return json_response(StatusCode::OK, skus_page());
    }
    if path == vms(DOWN) {
        return json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": {"code": "InternalServerError", "message": "Encountered internal server error."}}),
        );
    }
    if path == vms(LOCKED) {
        return json_response(
            StatusCode::FORBIDDEN,
            json!({"error": {"code": "AuthorizationFailed", "message": format!("The client '{CLIENT}' does not have authorization to perform action 'Microsoft.Compute/virtualMachines/read' over scope '/subscriptions/{LOCKED}'")}}),
        );
    }
    if path == vms(GARBLED) {
        return (
            StatusCode::OK,
            [("content-type", "application/json")],
            r#"{"value": {"name": "vm"}}"#,
        )
            .into_response();
    }
    json_response(
        StatusCode::NOT_FOUND,
        json!({"error": {"code": "NotFound", "message": path}}),
    )
}

struct Setup {
    fake: Arc<Fake>,
    addr: SocketAddr,
    dir: PathBuf,
}

async fn setup(name: &str) -> Setup {
    let fake = Arc::new(Fake::default());
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    *fake.addr.lock().unwrap() = Some(addr);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let dir = std::env::temp_dir().join(format!("gpuledger-azure-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("secret"), format!("{SECRET}\n")).unwrap();
    std::fs::write(dir.join("wrong-secret"), "not-it\n").unwrap();
    std::fs::write(dir.join("federated"), FEDERATED).unwrap();
    Setup { fake, addr, dir }
}

fn collector(s: &Setup, subs: &[&str], credential: &str) -> AzureCollector {
    let addr = s.addr;
    AzureCollector::from_toml(
        "azure-test",
        &format!(
            "subscriptions = {subs:?}\n{credential}\napi_url = \"http://{addr}\"\n\
             login_url = \"http://{addr}\"\nimds_url = \"http://{addr}\"\ntimeout_secs = 5\n"
        ),
    )
    .unwrap()
}

fn service_principal(s: &Setup, secret_file: &str) -> String {
    format!(
        "credential = \"client_secret\"\ntenant_id = \"{TENANT}\"\nclient_id = \"{CLIENT}\"\n\
         client_secret_file = \"{}\"",
        s.dir.join(secret_file).display()
    )
}

fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn summary(i: &CloudInstance) -> String {
    let gpus = i
        .gpus
        .as_ref()
        .map(|g| {
            format!(
                "{}x{} {:?}MiB fraction {:?}",
                g.count, g.model, g.memory_mib, g.fraction
            )
        })
        .unwrap_or_else(|| "no GPUs".into());
    format!(
        "{} {} {} {} {:?} {:?} {:?}",
        i.account, i.instance_id, i.instance_type, gpus, i.lifecycle, i.state, i.tags
    )
}

/// Two pages of one subscription (nextLink followed), sizes from the table and from
/// resourceSkus, a fractional size, spot, a capacity reservation, a deallocated VM, and a
/// subscription answering 500 that does not stop the other.
#[tokio::test]
async fn replay_reads_every_page_and_keeps_going_past_a_failed_subscription() {
    let s = setup("pages").await;
    let c = collector(&s, &[RESEARCH, DOWN], &service_principal(&s, "secret"));
    let (instances, problems) = c.instances().await.unwrap();
    for i in &instances {
        eprintln!("{}", summary(i));
    }
    let got: BTreeMap<&str, &CloudInstance> = instances
        .iter()
        .map(|i| (i.instance_id.as_str(), i))
        .collect();
    assert_eq!(
        got.keys().copied().collect::<Vec<_>>(),
        [
            "d4-web",
            "mi300x-01",
            "nc-a100-spot",
            "nc-t4-dealloc",
            "nc-v100-stopped",
            "nd-h100-01",
            "ng-v620",
            "nv-a10-desk"
        ],
        "`broken` is left out with its problem"
    );

    let h = got["nd-h100-01"];
    let g = h.gpus.as_ref().unwrap();
    assert_eq!(
        (g.model.as_str(), g.count, g.memory_mib, g.fraction),
        ("NVIDIA H100 80GB HBM3", 8, Some(81_920), None)
    );
    assert_eq!(
        (h.account.as_str(), h.region.as_deref(), h.zone.as_deref()),
        (RESEARCH, Some("eastus"), Some("eastus-2"))
    );
    assert_eq!(h.instance_type, "Standard_ND96isr_H100_v5");
    assert_eq!(h.host_name.as_deref(), Some("nd-h100-01"));
    assert_eq!(h.lifecycle, Lifecycle::OnDemand);
    assert_eq!(h.launch_time, Some(t("2026-11-02T10:15:30.1234567Z")));
    assert_eq!(h.state, InstanceState::Running);
    assert_eq!(
        h.tags,
        [("env", "prod"), ("team", "llm")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    );

    assert_eq!(got["nc-a100-spot"].lifecycle, Lifecycle::Spot);
    assert_eq!(got["nc-a100-spot"].gpus.as_ref().unwrap().count, 1);

    // A fractional size: one A10, a third of it, 8 GiB.
    let a10 = got["nv-a10-desk"].gpus.as_ref().unwrap();
    assert_eq!(
        (a10.model.as_str(), a10.count, a10.memory_mib),
        ("NVIDIA A10", 1, Some(8192))
    );
    assert!((a10.fraction.unwrap() - 1.0 / 3.0).abs() < 1e-9, "{a10:?}");

    // The AMD size keeps its vendor in the model; a capacity reservation group is reserved.
    let mi = got["mi300x-01"];
    assert_eq!(mi.gpus.as_ref().unwrap().model, "AMD Instinct MI300X");
    assert_eq!(mi.gpus.as_ref().unwrap().count, 8);
    assert_eq!(mi.lifecycle, Lifecycle::Reserved);

    // Deallocated: ends at the time of the last operation, the deallocation.
    assert_eq!(
        got["nc-t4-dealloc"].state,
        InstanceState::Stopped {
            since: Some(t("2026-12-01T06:00:00Z")),
            state: "PowerState/deallocated".into()
        }
    );
    // Stopped but still allocated: the GPUs are still held (and billed).
    assert_eq!(got["nc-v100-stopped"].state, InstanceState::Running);

    // A size the table lacks: its count from resourceSkus, the model from its name.
    let ng = got["ng-v620"].gpus.as_ref().unwrap();
    assert_eq!(
        (ng.model.as_str(), ng.count, ng.memory_mib),
        ("V620", 1, None)
    );
    assert_eq!(got["d4-web"].gpus, None);

    // Problems: the unreadable VM (naming its field) and the 500.
    let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(problems.len(), 2, "{text:#?}");
    assert!(
        text.iter()
            .any(|p| p.contains(&format!("subscription `{RESEARCH}`"))
                && p.contains(
                    "page 2 value[5] (broken).properties.priority: expected a string, got a number"
                )),
        "{text:#?}"
    );
    let down = problems
        .iter()
        .find(|p| p.part == format!("subscription `{DOWN}`"))
        .unwrap();
    assert!(matches!(down.error, CollectError::Transient(_)), "{down}");
    assert!(down.to_string().contains("500"), "{down}");

    // The requests: the secret went to the token endpoint as a form, once; the list asked
    // for the status; the nextLink was followed; resourceSkus asked once for eastus.
    let seen = s.fake.seen.lock().unwrap().clone();
    let token_calls: Vec<&Seen> = seen
        .iter()
        .filter(|r| r.path.ends_with("/oauth2/v2.0/token"))
        .collect();
    assert_eq!(token_calls.len(), 1);
    assert_eq!(token_calls[0].method, "POST");
    assert_eq!(
        token_calls[0].form.get("client_secret").map(String::as_str),
        Some(SECRET)
    );
    let lists: Vec<&Seen> = seen
        .iter()
        .filter(|r| {
            r.path.ends_with(&format!(
                "{RESEARCH}/providers/Microsoft.Compute/virtualMachines"
            ))
        })
        .collect();
    assert_eq!(lists.len(), 2);
    assert_eq!(
        lists[1].query.get("$skiptoken").map(String::as_str),
        Some("page2")
    );
    assert!(lists
        .iter()
        .all(|r| r.authorization.as_deref() == Some("Bearer az-token-sp")));
    let sku_calls = seen
        .iter()
        .filter(|r| r.path.ends_with("/Microsoft.Compute/skus"))
        .count();
    assert_eq!(sku_calls, 1);

    // A second run: the token and the skus are kept; the report's observations are the
    // running GPU VMs.
    let report = c.collect_report().await.unwrap();
    let seen = s.fake.seen.lock().unwrap().clone();
    assert_eq!(
        seen.iter()
            .filter(|r| r.path.ends_with("/oauth2/v2.0/token"))
            .count(),
        1
    );
    assert_eq!(
        seen.iter()
            .filter(|r| r.path.ends_with("/Microsoft.Compute/skus"))
            .count(),
        1
    );
    for o in &report.observations {
        eprintln!("{}", serde_json::to_string(o).unwrap());
    }
    let mut hosts: Vec<(String, u32)> = Vec::new();
    let mut stopped = Vec::new();
    for o in &report.observations {
        match o {
            Observation::HostGpuCount { gpus, .. } => hosts.push((gpus.host.clone(), gpus.count)),
            Observation::HostStopped { host, at, .. } => {
                stopped.push((host.clone(), at.to_rfc3339()))
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        stopped,
        [(
            "nc-t4-dealloc".to_string(),
            "2026-12-01T06:00:00+00:00".to_string()
        )],
        "the deallocated VM says since when"
    );
    hosts.sort();
    assert_eq!(
        hosts,
        [
            ("mi300x-01".to_string(), 8),
            ("nc-a100-spot".to_string(), 1),
            ("nc-v100-stopped".to_string(), 1),
            ("nd-h100-01".to_string(), 8),
            ("ng-v620".to_string(), 1),
            ("nv-a10-desk".to_string(), 1),
        ]
    );
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// A workload identity sends the federated token as the client assertion.
#[tokio::test]
async fn replay_workload_identity_token() {
    let s = setup("wi").await;
    let cred = format!(
        "credential = \"workload_identity\"\ntenant_id = \"{TENANT}\"\nclient_id = \"{CLIENT}\"\n\
         federated_token_file = \"{}\"",
        s.dir.join("federated").display()
    );
    let (instances, _) = collector(&s, &[RESEARCH], &cred).instances().await.unwrap();
    assert_eq!(instances.len(), 8);
    let seen = s.fake.seen.lock().unwrap().clone();
    assert_eq!(
        seen[0].form.get("client_assertion").map(String::as_str),
        Some(FEDERATED)
    );
    assert_eq!(seen[0].form.get("client_secret"), None);
    assert_eq!(seen[1].authorization.as_deref(), Some("Bearer az-token-wi"));
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// A managed identity asks the metadata service, with its header, for Resource Manager.
#[tokio::test]
async fn replay_managed_identity_token() {
    let s = setup("mi").await;
    let (instances, _) = collector(&s, &[RESEARCH], "credential = \"managed_identity\"")
        .instances()
        .await
        .unwrap();
    assert_eq!(instances.len(), 8);
    let seen = s.fake.seen.lock().unwrap().clone();
    assert_eq!(seen[0].path, "/metadata/identity/oauth2/token");
    assert_eq!(seen[0].metadata_header.as_deref(), Some("true"));
    assert_eq!(seen[1].authorization.as_deref(), Some("Bearer az-token-mi"));
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// A 403 is a configuration error naming the subscription; a refused secret is one too.
#[tokio::test]
async fn replay_forbidden_subscription_and_refused_secret_are_config_errors() {
    let s = setup("forbidden").await;
    let e = collector(&s, &[LOCKED], &service_principal(&s, "secret"))
        .instances()
        .await
        .unwrap_err();
    assert!(matches!(e, CollectError::Config(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&format!("subscription `{LOCKED}`")) && text.contains("403"),
        "{text}"
    );
    assert!(
        text.contains("Microsoft.Compute/virtualMachines/read"),
        "{text}"
    );

    let (found, problems) = collector(&s, &[LOCKED, RESEARCH], &service_principal(&s, "secret"))
        .instances()
        .await
        .unwrap();
    assert_eq!(found.len(), 8);
    assert!(problems
        .iter()
        .any(|p| p.part == format!("subscription `{LOCKED}`")
            && matches!(p.error, CollectError::Config(_))));

    let e = collector(&s, &[RESEARCH], &service_principal(&s, "wrong-secret"))
        .instances()
        .await
        .unwrap_err();
    assert!(matches!(e, CollectError::Config(_)), "{e:?}");
    assert!(
        e.to_string().contains("401") && e.to_string().contains("credentials were refused"),
        "{e}"
    );
    let e = collector(&s, &[RESEARCH], &service_principal(&s, "no-such-file"))
        .instances()
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("client_secret_file") && e.to_string().contains("cannot read it"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// A page whose `value` is not a list is a data error naming the field.
#[tokio::test]
async fn replay_malformed_page_is_a_data_error_naming_the_field() {
    let s = setup("malformed").await;
    let (_, problems) = collector(&s, &[GARBLED, RESEARCH], &service_principal(&s, "secret"))
        .instances()
        .await
        .unwrap();
    let p = problems
        .iter()
        .find(|p| p.part == format!("subscription `{GARBLED}`"))
        .unwrap();
    assert!(matches!(p.error, CollectError::Data(_)), "{p}");
    assert!(
        p.to_string()
            .contains("value: expected a list, got an object"),
        "{p}"
    );
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// The kind is registered: `type = "azure"` builds this collector through the registry.
#[test]
fn registered_as_azure() {
    let c = gpuledger_collect::build(
        "azure",
        "azure-prod",
        &format!("subscriptions = [\"{RESEARCH}\"]\ncredential = \"managed_identity\"\n"),
    )
    .unwrap();
    assert_eq!((c.kind(), c.name()), ("azure", "azure-prod"));
}

// ---------------------------------------------------------------------------------------------
// mutated_*: every node of the replayed pages replaced by each JSON type, and the pages cut at
// every length: the reader answers or names a problem, never panics.

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

fn read_page(body: &[u8]) -> Result<usize, String> {
    use gpuledger_collect::collectors::azure::parse;
    let page = parse::page(body)?;
    let mut ok = 0;
    for (path, item) in &page.items {
        match parse::vm(path, item) {
            Ok(_) => ok += 1,
            Err(m) => assert!(m.starts_with(path.as_str()), "a problem names its VM: {m}"),
        }
    }
    let _ = parse::sku_gpus(&page.items);
    Ok(ok)
}

#[test]
fn mutated_pages_never_panic_and_name_their_problems() {
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let mut tried = 0;
    for page in [research_page(1, addr), research_page(2, addr), skus_page()] {
        let mut ps = Vec::new();
        pointers(&page, String::new(), &mut ps);
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
                let mut m = page.clone();
                *m.pointer_mut(p).unwrap() = replacement;
                let _ = read_page(m.to_string().as_bytes());
                tried += 1;
            }
        }
        let bytes = page.to_string().into_bytes();
        for cut in 0..bytes.len() {
            let _ = read_page(&bytes[..cut]);
        }
    }
    assert!(tried > 500, "{tried}");
}
