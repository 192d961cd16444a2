//! Reading Compute Engine answers: an `aggregatedList` page into [`CloudInstance`]s, GPUs from
//! `guestAccelerators` or from the machine types whose GPUs are built in.
//!
//! Every problem names the field it is about (`items.zones/us-central1-a.instances[2].status`);
//! an instance that cannot be read is left out with its problem, the others are kept.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gpuledger_model::Cloud;
use serde_json::Value;

use crate::collectors::cloud::{CloudInstance, GpuSpec, InstanceState, Lifecycle};

/// One page of an `aggregatedList` answer: each item of every scope with its JSON path.
#[derive(Debug, Default)]
pub struct Aggregated {
    /// (path, item), the path naming the scope and index: `items.zones/us-east1-b.instances[0]`.
    pub items: Vec<(String, Value)>,
    /// The scopes holding items, in the answer's order (`zones/us-east1-b`).
    pub scopes_with_items: Vec<String>,
    /// Scopes that answered a `NO_RESULTS_ON_PAGE` warning: empty, not a problem.
    pub empty_scopes: usize,
    pub next_page_token: Option<String>,
    /// `unreachables`: scopes (zones) the API could not read this time.
    pub unreachable: Vec<String>,
    /// Other warnings and the items or scopes that could not be read, each naming its field.
    pub problems: Vec<String>,
}

/// Read one page of an `aggregatedList` answer whose scopes hold their items under `key`
/// (`instances`, `acceleratorTypes`, `machineTypes`). Fails only when the page as a whole is
/// unusable (not JSON, `items` not an object).
pub fn aggregated(body: &[u8], key: &str) -> Result<Aggregated, String> {
    let doc: Value =
        serde_json::from_slice(body).map_err(|e| format!("the answer is not JSON: {e}"))?;
    let Some(top) = doc.as_object() else {
        return Err(format!("expected a JSON object, got {}", kind(&doc)));
    };
    let mut out = Aggregated::default();
    match top.get("nextPageToken") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => out.next_page_token = Some(s.clone()),
        Some(other) => {
            return Err(format!(
                "nextPageToken: expected a string, got {}",
                kind(other)
            ))
        }
    }
    match top.get("unreachables") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for (i, v) in list.iter().enumerate() {
                match v.as_str() {
                    Some(s) => out.unreachable.push(s.to_string()),
                    None => out.problems.push(format!(
                        "unreachables[{i}]: expected a string, got {}",
                        kind(v)
                    )),
                }
            }
        }
        Some(other) => out.problems.push(format!(
            "unreachables: expected a list, got {}",
            kind(other)
        )),
    }
    if let Some(w) = top.get("warning") {
        out.problems.push(format!("warning: {}", warning_text(w)));
    }
    let items = match top.get("items") {
        // An empty project answers without `items`.
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Object(m)) => m,
        Some(other) => return Err(format!("items: expected an object, got {}", kind(other))),
    };
    for (scope, scoped) in items {
        let Some(scoped) = scoped.as_object() else {
            out.problems.push(format!(
                "items.{scope}: expected an object, got {}",
                kind(scoped)
            ));
            continue;
        };
        match scoped.get(key) {
            Some(Value::Array(list)) => {
                out.scopes_with_items.push(scope.clone());
                for (i, item) in list.iter().enumerate() {
                    out.items
                        .push((format!("items.{scope}.{key}[{i}]"), item.clone()));
                }
            }
            Some(other) => out.problems.push(format!(
                "items.{scope}.{key}: expected a list, got {}",
                kind(other)
            )),
            None => match scoped.get("warning") {
                Some(w) if w.get("code").and_then(Value::as_str) == Some("NO_RESULTS_ON_PAGE") => {
                    out.empty_scopes += 1
                }
                Some(w) => out
                    .problems
                    .push(format!("items.{scope}.warning: {}", warning_text(w))),
                None => out.empty_scopes += 1,
            },
        }
    }
    Ok(out)
}

fn warning_text(w: &Value) -> String {
    let code = w.get("code").and_then(Value::as_str).unwrap_or("?");
    let message = w.get("message").and_then(Value::as_str).unwrap_or("");
    format!("{code} {message}").trim().to_string()
}

/// The JSON type of `v`, for messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The last segment of a resource URL (`…/zones/us-central1-a/acceleratorTypes/nvidia-l4` →
/// `nvidia-l4`); a bare name stays as it is.
pub fn last_segment(url: &str) -> &str {
    url.trim_end_matches('/').rsplit('/').next().unwrap_or(url)
}

/// The region of a zone (`us-central1-a` → `us-central1`).
pub fn region_of_zone(zone: &str) -> Option<&str> {
    zone.rsplit_once('-')
        .map(|(region, _)| region)
        .filter(|r| !r.is_empty())
}

/// Memory of one GPU of an accelerator type, MiB, as Google lists it (GB × 1024); `None`
/// for a type this build does not know (unknown, not zero).
pub fn accelerator_memory_mib(accelerator_type: &str) -> Option<u64> {
    let gb = match accelerator_type {
        "nvidia-tesla-k80" => 12,
        "nvidia-tesla-p4" | "nvidia-tesla-p4-vws" => 8,
        "nvidia-tesla-p100" | "nvidia-tesla-p100-vws" => 16,
        "nvidia-tesla-v100" => 16,
        "nvidia-tesla-t4" | "nvidia-tesla-t4-vws" => 16,
        "nvidia-tesla-a100" => 40,
        "nvidia-a100-80gb" => 80,
        "nvidia-l4" | "nvidia-l4-vws" => 24,
        "nvidia-h100-80gb" | "nvidia-h100-mega-80gb" => 80,
        "nvidia-h200-141gb" => 141,
        "nvidia-b200" => 180,
        "nvidia-gb200" => 186,
        "nvidia-rtx-pro-6000" | "nvidia-rtx-pro-6000-vws" => 96,
        _ => return None,
    };
    Some(gb * 1024)
}

/// Machine types whose GPUs come with the machine type (no `guestAccelerators` needed), from
/// Google's GPU machine type tables: (machine type, accelerator type, GPUs).
pub const BUILT_IN_GPUS: &[(&str, &str, u32)] = &[
    // A4X: NVIDIA GB200 Grace Blackwell.
    ("a4x-highgpu-4g", "nvidia-gb200", 4),
    // A4: NVIDIA B200.
    ("a4-highgpu-8g", "nvidia-b200", 8),
    // A3 Ultra: NVIDIA H200 141GB.
    ("a3-ultragpu-8g", "nvidia-h200-141gb", 8),
    // A3 Mega: NVIDIA H100 80GB (Mega).
    ("a3-megagpu-8g", "nvidia-h100-mega-80gb", 8),
    // A3 High and A3 Edge: NVIDIA H100 80GB.
    ("a3-highgpu-1g", "nvidia-h100-80gb", 1),
    ("a3-highgpu-2g", "nvidia-h100-80gb", 2),
    ("a3-highgpu-4g", "nvidia-h100-80gb", 4),
    ("a3-highgpu-8g", "nvidia-h100-80gb", 8),
    ("a3-edgegpu-8g", "nvidia-h100-80gb", 8),
    // A2 Standard: NVIDIA A100 40GB.
    ("a2-highgpu-1g", "nvidia-tesla-a100", 1),
    ("a2-highgpu-2g", "nvidia-tesla-a100", 2),
    ("a2-highgpu-4g", "nvidia-tesla-a100", 4),
    ("a2-highgpu-8g", "nvidia-tesla-a100", 8),
    ("a2-megagpu-16g", "nvidia-tesla-a100", 16),
    // A2 Ultra: NVIDIA A100 80GB.
    ("a2-ultragpu-1g", "nvidia-a100-80gb", 1),
    ("a2-ultragpu-2g", "nvidia-a100-80gb", 2),
    ("a2-ultragpu-4g", "nvidia-a100-80gb", 4),
    ("a2-ultragpu-8g", "nvidia-a100-80gb", 8),
    // G2: NVIDIA L4.
    ("g2-standard-4", "nvidia-l4", 1),
    ("g2-standard-8", "nvidia-l4", 1),
    ("g2-standard-12", "nvidia-l4", 1),
    ("g2-standard-16", "nvidia-l4", 1),
    ("g2-standard-24", "nvidia-l4", 2),
    ("g2-standard-32", "nvidia-l4", 1),
    ("g2-standard-48", "nvidia-l4", 4),
    ("g2-standard-96", "nvidia-l4", 8),
    // G4: NVIDIA RTX PRO 6000 Blackwell Server Edition.
    ("g4-standard-48", "nvidia-rtx-pro-6000", 1),
    ("g4-standard-96", "nvidia-rtx-pro-6000", 2),
    ("g4-standard-192", "nvidia-rtx-pro-6000", 4),
    ("g4-standard-384", "nvidia-rtx-pro-6000", 8),
];

/// The machine-type families whose GPUs are built in: a type of these families missing from
/// [`BUILT_IN_GPUS`] is a problem, not an instance without GPUs.
const BUILT_IN_FAMILIES: &[&str] = &["a2-", "a3-", "a4-", "a4x-", "g2-", "g4-"];

/// The GPUs built into `machine_type`, if its GPUs come with it.
pub fn built_in_gpus(machine_type: &str) -> Option<GpuSpec> {
    BUILT_IN_GPUS
        .iter()
        .find(|(m, _, _)| *m == machine_type)
        .map(|(_, accel, count)| GpuSpec {
            model: accel.to_string(),
            count: *count,
            memory_mib: accelerator_memory_mib(accel),
            fraction: None,
        })
}

/// Read one instance of project `project`; `path` names it in messages.
pub fn instance(project: &str, path: &str, v: &Value) -> Result<CloudInstance, String> {
    let Some(obj) = v.as_object() else {
        return Err(format!("{path}: expected an object, got {}", kind(v)));
    };
    let name = match obj.get("name") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(format!("{path}.name: missing"))
        }
        Some(other) => {
            return Err(format!(
                "{path}.name: expected a string, got {}",
                kind(other)
            ))
        }
    };
    let path = format!("{path} ({name})");
    let field = |f: &str| format!("{path}.{f}");
    let text = |name: &str| -> Result<Option<&str>, String> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(format!(
                "{}: expected a string, got {}",
                field(name),
                kind(other)
            )),
        }
    };
    let required = |name: &str| -> Result<&str, String> {
        match text(name)? {
            Some(s) if !s.trim().is_empty() => Ok(s),
            _ => Err(format!("{}: missing", field(name))),
        }
    };
    let time = |name: &str| -> Result<Option<DateTime<Utc>>, String> {
        text(name)?
            .map(|s| {
                DateTime::parse_from_rfc3339(s)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(|e| format!("{}: `{s}` is not an RFC 3339 time ({e})", field(name)))
            })
            .transpose()
    };

    let zone = last_segment(required("zone")?).to_string();
    let machine_type = last_segment(required("machineType")?).to_string();
    let status = required("status")?;
    let created = time("creationTimestamp")?;
    let started = time("lastStartTimestamp")?;
    let stopped = time("lastStopTimestamp")?;
    let suspended = time("lastSuspendedTimestamp")?;

    // A stop (or suspension) time from before the last start belongs to an earlier cycle:
    // then the API does not say when this one began.
    let after_start = |t: Option<DateTime<Utc>>| t.filter(|t| started.is_none_or(|s| *t >= s));
    let state = match status {
        "RUNNING" | "PROVISIONING" | "STAGING" | "REPAIRING" => InstanceState::Running,
        "STOPPING" | "STOPPED" | "TERMINATED" => InstanceState::Stopped {
            since: after_start(stopped),
            state: status.to_string(),
        },
        "SUSPENDING" | "SUSPENDED" => InstanceState::Stopped {
            since: after_start(suspended),
            state: status.to_string(),
        },
        other => {
            return Err(format!(
                "{}: unknown status `{other}` (expected RUNNING, PROVISIONING, STAGING, \
                 REPAIRING, STOPPING, STOPPED, SUSPENDING, SUSPENDED or TERMINATED)",
                field("status")
            ))
        }
    };

    let lifecycle = lifecycle(obj, &field)?;
    let tags = labels(obj.get("labels"), &field("labels"))?;
    let gpus = match guest_accelerators(obj.get("guestAccelerators"), &field("guestAccelerators"))?
    {
        Some(spec) => Some(spec),
        None => match built_in_gpus(&machine_type) {
            Some(spec) => Some(spec),
            None if BUILT_IN_FAMILIES
                .iter()
                .any(|f| machine_type.starts_with(f)) =>
            {
                return Err(format!(
                    "{}: `{machine_type}` is a machine type with built-in GPUs that this build \
                     does not know, so its GPUs are not counted",
                    field("machineType")
                ))
            }
            None => None,
        },
    };
    Ok(CloudInstance {
        cloud: Cloud::Gcp,
        account: project.to_string(),
        region: region_of_zone(&zone).map(str::to_string),
        zone: Some(zone),
        instance_id: name.clone(),
        host_name: Some(name),
        instance_type: machine_type,
        state,
        lifecycle,
        launch_time: started.or(created),
        tags,
        gpus,
    })
}

fn lifecycle(
    obj: &serde_json::Map<String, Value>,
    field: &dyn Fn(&str) -> String,
) -> Result<Lifecycle, String> {
    let scheduling = match obj.get("scheduling") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(other) => {
            return Err(format!(
                "{}: expected an object, got {}",
                field("scheduling"),
                kind(other)
            ))
        }
    };
    let model = match scheduling.and_then(|s| s.get("provisioningModel")) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(other) => {
            return Err(format!(
                "{}: expected a string, got {}",
                field("scheduling.provisioningModel"),
                kind(other)
            ))
        }
    };
    let preemptible = match scheduling.and_then(|s| s.get("preemptible")) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(format!(
                "{}: expected a boolean, got {}",
                field("scheduling.preemptible"),
                kind(other)
            ))
        }
    };
    let reservation = match obj.get("reservationAffinity") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => match m.get("consumeReservationType") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(other) => {
                return Err(format!(
                    "{}: expected a string, got {}",
                    field("reservationAffinity.consumeReservationType"),
                    kind(other)
                ))
            }
        },
        Some(other) => {
            return Err(format!(
                "{}: expected an object, got {}",
                field("reservationAffinity"),
                kind(other)
            ))
        }
    };
    Ok(match model {
        Some("SPOT") => Lifecycle::Spot,
        _ if preemptible => Lifecycle::Spot,
        // Runs only inside a reservation (future reservations, calendar-mode capacity).
        Some("RESERVATION_BOUND") => Lifecycle::Reserved,
        // A named reservation; ANY_RESERVATION (the default) does not say one was used.
        _ if reservation == Some("SPECIFIC_RESERVATION") => Lifecycle::Reserved,
        None | Some("STANDARD" | "FLEX_START") => Lifecycle::OnDemand,
        Some(other) => {
            return Err(format!(
                "{}: unknown provisioning model `{other}` (expected STANDARD, SPOT, FLEX_START \
                 or RESERVATION_BOUND)",
                field("scheduling.provisioningModel")
            ))
        }
    })
}

fn labels(v: Option<&Value>, path: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    match v {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                match v.as_str() {
                    Some(s) => {
                        out.insert(k.clone(), s.to_string());
                    }
                    None => return Err(format!("{path}.{k}: expected a string, got {}", kind(v))),
                }
            }
        }
        Some(other) => return Err(format!("{path}: expected an object, got {}", kind(other))),
    }
    Ok(out)
}

/// The instance's attached GPUs; `None` when it has none attached.
fn guest_accelerators(v: Option<&Value>, path: &str) -> Result<Option<GpuSpec>, String> {
    let list = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(l)) => l,
        Some(other) => return Err(format!("{path}: expected a list, got {}", kind(other))),
    };
    let mut by_type: BTreeMap<String, u32> = BTreeMap::new();
    for (i, a) in list.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let ty = match a.get("acceleratorType") {
            Some(Value::String(s)) if !s.trim().is_empty() => last_segment(s).to_string(),
            Some(other) => {
                return Err(format!(
                    "{at}.acceleratorType: expected a string, got {}",
                    kind(other)
                ))
            }
            None => return Err(format!("{at}.acceleratorType: missing")),
        };
        let count = match a.get("acceleratorCount") {
            Some(Value::Number(n)) => match n.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(c) => c,
                None => {
                    return Err(format!(
                        "{at}.acceleratorCount: `{n}` is not a whole number of GPUs"
                    ))
                }
            },
            Some(other) => {
                return Err(format!(
                    "{at}.acceleratorCount: expected a number, got {}",
                    kind(other)
                ))
            }
            None => return Err(format!("{at}.acceleratorCount: missing")),
        };
        if count > 0 {
            *by_type.entry(ty).or_default() += count;
        }
    }
    if by_type.len() > 1 {
        return Err(format!(
            "{path}: GPUs of {} types ({}); one host carries one GPU model",
            by_type.len(),
            by_type.keys().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(by_type.into_iter().next().map(|(model, count)| GpuSpec {
        memory_mib: accelerator_memory_mib(&model),
        model,
        count,
        fraction: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "name": "train-1",
            "zone": "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a",
            "machineType": "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a/machineTypes/n1-standard-8",
            "status": "RUNNING",
            "creationTimestamp": "2026-10-01T08:00:00.000-07:00",
        })
    }

    #[test]
    fn zones_give_their_region() {
        assert_eq!(region_of_zone("us-central1-a"), Some("us-central1"));
        assert_eq!(region_of_zone("europe-west4-b"), Some("europe-west4"));
        assert_eq!(region_of_zone("nozone"), None);
        assert_eq!(last_segment("a/b/c/"), "c");
        assert_eq!(last_segment("c"), "c");
    }

    /// Every built-in machine type names an accelerator whose memory is known.
    #[test]
    fn the_built_in_table_is_complete() {
        for (m, accel, n) in BUILT_IN_GPUS {
            assert!(accelerator_memory_mib(accel).is_some(), "{m}: {accel}");
            assert!(*n > 0, "{m}");
            assert!(BUILT_IN_FAMILIES.iter().any(|f| m.starts_with(f)), "{m}");
        }
        let a3 = built_in_gpus("a3-highgpu-8g").unwrap();
        assert_eq!((a3.model.as_str(), a3.count), ("nvidia-h100-80gb", 8));
        assert_eq!(a3.memory_mib, Some(81_920));
        assert_eq!(built_in_gpus("n1-standard-8"), None);
    }

    #[test]
    fn an_instance_without_gpus_has_none() {
        let i = instance("p", "x", &base()).unwrap();
        assert_eq!(i.gpus, None);
        assert_eq!(i.region.as_deref(), Some("us-central1"));
        assert_eq!(i.lifecycle, Lifecycle::OnDemand);
        assert_eq!(i.launch_time, Some("2026-10-01T15:00:00Z".parse().unwrap()));
    }

    /// Each malformed field is named; nothing panics.
    #[test]
    fn bad_fields_are_named() {
        let cases: &[(&str, Value, &str)] = &[
            (
                "status",
                json!(7),
                "x (train-1).status: expected a string, got a number",
            ),
            ("status", json!("ASLEEP"), "unknown status `ASLEEP`"),
            ("name", json!(""), "x.name: missing"),
            (
                "guestAccelerators",
                json!([{"acceleratorType": "nvidia-l4", "acceleratorCount": "two"}]),
                "guestAccelerators[0].acceleratorCount: expected a number, got a string",
            ),
            (
                "guestAccelerators",
                json!([{"acceleratorType": "nvidia-l4", "acceleratorCount": -1}]),
                "acceleratorCount: `-1` is not a whole number",
            ),
            (
                "labels",
                json!({"team": 3}),
                "labels.team: expected a string",
            ),
            (
                "lastStopTimestamp",
                json!("yesterday"),
                "lastStopTimestamp: `yesterday` is not",
            ),
            (
                "scheduling",
                json!({"provisioningModel": "AUCTION"}),
                "unknown provisioning model `AUCTION`",
            ),
            (
                "machineType",
                json!("zones/z/machineTypes/a3-futuregpu-8g"),
                "`a3-futuregpu-8g` is a machine type with built-in GPUs",
            ),
        ];
        for (key, value, want) in cases {
            let mut v = base();
            v[*key] = value.clone();
            let e = instance("p", "x", &v).unwrap_err();
            assert!(e.contains(want), "{key}: {e}");
        }
        assert!(instance("p", "x", &json!([])).is_err());
    }

    #[test]
    fn a_stop_before_the_last_start_is_not_this_stop() {
        let mut v = base();
        v["status"] = json!("TERMINATED");
        v["lastStartTimestamp"] = json!("2026-11-02T00:00:00Z");
        v["lastStopTimestamp"] = json!("2026-11-01T00:00:00Z");
        let i = instance("p", "x", &v).unwrap();
        assert_eq!(
            i.state,
            InstanceState::Stopped {
                since: None,
                state: "TERMINATED".into()
            }
        );
        v["lastStopTimestamp"] = json!("2026-11-03T00:00:00Z");
        let i = instance("p", "x", &v).unwrap();
        assert_eq!(
            i.state,
            InstanceState::Stopped {
                since: Some("2026-11-03T00:00:00Z".parse().unwrap()),
                state: "TERMINATED".into()
            }
        );
    }

    #[test]
    fn pages_that_are_not_lists_are_refused() {
        assert!(aggregated(b"<html>", "instances")
            .unwrap_err()
            .contains("not JSON"));
        assert!(aggregated(br#"{"items": []}"#, "instances")
            .unwrap_err()
            .contains("items: expected an object"));
        let a = aggregated(
            br#"{"items": {"zones/a": {"instances": 3}, "zones/b": {"warning": {"code": "NO_RESULTS_ON_PAGE"}}}}"#,
            "instances",
        )
        .unwrap();
        assert_eq!(a.empty_scopes, 1);
        assert_eq!(
            a.problems,
            ["items.zones/a.instances: expected a list, got a number"]
        );
    }
}
