//! Reading Azure Resource Manager answers: a page of the subscription's virtual machines (with
//! their instance view, `statusOnly=true`) and a page of `resourceSkus`.
//!
//! Every problem names the field it is about (`value[2].properties.priority`); a VM that cannot
//! be read is left out with its problem, the others are kept.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use crate::collectors::cloud::{InstanceState, Lifecycle};

/// One page of a Resource Manager list: its items with their JSON path, and the next page.
#[derive(Debug, Default)]
pub struct Page {
    pub items: Vec<(String, Value)>,
    pub next_link: Option<String>,
}

/// Read a list page (`{"value": [...], "nextLink": "..."}`). Fails only when the page as a
/// whole is unusable.
pub fn page(body: &[u8]) -> Result<Page, String> {
    let doc: Value =
        serde_json::from_slice(body).map_err(|e| format!("the answer is not JSON: {e}"))?;
    let Some(top) = doc.as_object() else {
        return Err(format!("expected a JSON object, got {}", kind(&doc)));
    };
    let next_link = match top.get("nextLink") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => return Err(format!("nextLink: expected a string, got {}", kind(other))),
    };
    let items = match top.get("value") {
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("value[{i}]"), v.clone()))
            .collect(),
        Some(other) => return Err(format!("value: expected a list, got {}", kind(other))),
        None => return Err("value: missing".into()),
    };
    Ok(Page { items, next_link })
}

/// The JSON type of `v`, for messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    crate::collectors::gcp::parse::kind(v)
}

/// One virtual machine as the list gives it; its GPUs come from its size.
#[derive(Debug, Clone, PartialEq)]
pub struct Vm {
    pub name: String,
    pub size: String,
    pub location: String,
    /// `eastus-1` for a VM in zone 1 of eastus, as Kubernetes names Azure zones.
    pub zone: Option<String>,
    pub computer_name: Option<String>,
    pub state: InstanceState,
    pub lifecycle: Lifecycle,
    pub created: Option<DateTime<Utc>>,
    pub tags: BTreeMap<String, String>,
}

struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    fn of(v: &'a Value, path: String) -> Result<Obj<'a>, String> {
        match v.as_object() {
            Some(map) => Ok(Obj { map, path }),
            None => Err(format!("{path}: expected an object, got {}", kind(v))),
        }
    }

    fn at(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn obj(&self, key: &str) -> Result<Option<Obj<'a>>, String> {
        self.get(key).map(|v| Obj::of(v, self.at(key))).transpose()
    }

    fn text(&self, key: &str) -> Result<Option<&'a str>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(format!(
                "{}: expected a string, got {}",
                self.at(key),
                kind(other)
            )),
        }
    }

    fn required(&self, key: &str) -> Result<&'a str, String> {
        match self.text(key)? {
            Some(s) if !s.trim().is_empty() => Ok(s),
            _ => Err(format!("{}: missing", self.at(key))),
        }
    }

    fn time(&self, key: &str) -> Result<Option<DateTime<Utc>>, String> {
        self.text(key)?
            .map(|s| {
                DateTime::parse_from_rfc3339(s)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(|e| format!("{}: `{s}` is not an RFC 3339 time ({e})", self.at(key)))
            })
            .transpose()
    }
}

/// Read one VM; `path` names it in messages.
pub fn vm(path: &str, v: &Value) -> Result<Vm, String> {
    let top = Obj::of(v, path.to_string())?;
    let name = top.required("name")?.to_string();
    let top = Obj {
        map: top.map,
        path: format!("{path} ({name})"),
    };
    let location = top.required("location")?.to_string();
    let zone = match top.get("zones") {
        None => None,
        Some(Value::Array(z)) => match z.first() {
            None => None,
            Some(Value::String(z)) => Some(format!("{location}-{z}")),
            Some(other) => {
                return Err(format!(
                    "{}[0]: expected a string, got {}",
                    top.at("zones"),
                    kind(other)
                ))
            }
        },
        Some(other) => {
            return Err(format!(
                "{}: expected a list, got {}",
                top.at("zones"),
                kind(other)
            ))
        }
    };
    let mut tags = BTreeMap::new();
    if let Some(t) = top.obj("tags")? {
        for (k, v) in t.map {
            match v.as_str() {
                Some(s) => {
                    tags.insert(k.clone(), s.to_string());
                }
                None => return Err(format!("{}: expected a string, got {}", t.at(k), kind(v))),
            }
        }
    }
    let props = top
        .obj("properties")?
        .ok_or_else(|| format!("{}: missing", top.at("properties")))?;
    let size = props
        .obj("hardwareProfile")?
        .ok_or_else(|| format!("{}: missing", props.at("hardwareProfile")))?
        .required("vmSize")?
        .to_string();
    let computer_name = match props.obj("osProfile")? {
        Some(os) => os
            .text("computerName")?
            .filter(|s| !s.trim().is_empty())
            .map(str::to_string),
        None => None,
    };
    let created = props.time("timeCreated")?;
    let reserved = match props.obj("capacityReservation")? {
        Some(c) => match c.obj("capacityReservationGroup")? {
            Some(g) => g.text("id")?.is_some_and(|id| !id.trim().is_empty()),
            None => false,
        },
        None => false,
    };
    let lifecycle = match props.text("priority")? {
        Some(p) if p.eq_ignore_ascii_case("Spot") || p.eq_ignore_ascii_case("Low") => {
            Lifecycle::Spot
        }
        None => reserved_or_on_demand(reserved),
        Some(p) if p.eq_ignore_ascii_case("Regular") => reserved_or_on_demand(reserved),
        Some(other) => {
            return Err(format!(
                "{}: unknown priority `{other}` (expected Regular, Spot or Low)",
                props.at("priority")
            ))
        }
    };
    let state = power_state(&props)?;
    Ok(Vm {
        name,
        size,
        location,
        zone,
        computer_name,
        state,
        lifecycle,
        created,
        tags,
    })
}

fn reserved_or_on_demand(reserved: bool) -> Lifecycle {
    if reserved {
        Lifecycle::Reserved
    } else {
        Lifecycle::OnDemand
    }
}

/// The VM's state from its instance view's `PowerState/…` status. A VM that is `stopped` (shut
/// down from inside, still allocated) still holds its GPUs and is billed for them, so it counts
/// as running; `deallocating` and `deallocated` free them.
fn power_state(props: &Obj<'_>) -> Result<InstanceState, String> {
    let view = props
        .obj("instanceView")?
        .ok_or_else(|| format!("{}: missing (no power state)", props.at("instanceView")))?;
    let statuses = match view.get("statuses") {
        Some(Value::Array(l)) => l,
        Some(other) => {
            return Err(format!(
                "{}: expected a list, got {}",
                view.at("statuses"),
                kind(other)
            ))
        }
        None => return Err(format!("{}: missing (no power state)", view.at("statuses"))),
    };
    let mut power: Option<(&str, Option<DateTime<Utc>>)> = None;
    let mut provisioned: Option<DateTime<Utc>> = None;
    for (i, s) in statuses.iter().enumerate() {
        let s = Obj::of(s, format!("{}[{i}]", view.at("statuses")))?;
        let code = s.required("code")?;
        let time = s.time("time")?;
        if let Some(p) = code.strip_prefix("PowerState/") {
            power = Some((p, time));
        } else if code.starts_with("ProvisioningState/") {
            provisioned = time;
        }
    }
    let Some((word, time)) = power else {
        return Err(format!(
            "{}: no PowerState/… status, so whether the VM runs is not known",
            view.at("statuses")
        ));
    };
    Ok(match word {
        "running" | "starting" | "stopping" | "stopped" => InstanceState::Running,
        // When the power state has no time, the last operation's time (the deallocation,
        // unless the VM was changed since) is the best the API says.
        "deallocating" | "deallocated" => InstanceState::Stopped {
            since: time.or(provisioned),
            state: format!("PowerState/{word}"),
        },
        other => {
            return Err(format!(
                "{}: power state `{other}` is not one of running, starting, stopping, stopped, \
                 deallocating, deallocated",
                view.at("statuses")
            ))
        }
    })
}

/// The `GPUs` capability of each VM size in a `resourceSkus` page: (size, `Some(value)`, or
/// `None` for a size without the capability), and a problem for each entry that cannot be read.
pub fn sku_gpus(items: &[(String, Value)]) -> (Vec<(String, Option<String>)>, Vec<String>) {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (path, v) in items {
        let read = || -> Result<Option<(String, Option<String>)>, String> {
            let o = Obj::of(v, path.clone())?;
            if o.text("resourceType")? != Some("virtualMachines") {
                return Ok(None);
            }
            let name = o.required("name")?.to_string();
            let mut gpus = None;
            match o.get("capabilities") {
                None => {}
                Some(Value::Array(caps)) => {
                    for (i, c) in caps.iter().enumerate() {
                        let c = Obj::of(c, format!("{}[{i}]", o.at("capabilities")))?;
                        if c.text("name")? == Some("GPUs") {
                            gpus = Some(c.required("value")?.to_string());
                        }
                    }
                }
                Some(other) => {
                    return Err(format!(
                        "{}: expected a list, got {}",
                        o.at("capabilities"),
                        kind(other)
                    ))
                }
            }
            Ok(Some((name, gpus)))
        };
        match read() {
            Ok(Some(entry)) => out.push(entry),
            Ok(None) => {}
            Err(m) => problems.push(m),
        }
    }
    (out, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "name": "vm1",
            "location": "eastus",
            "properties": {
                "hardwareProfile": {"vmSize": "Standard_NC24ads_A100_v4"},
                "instanceView": {"statuses": [
                    {"code": "ProvisioningState/succeeded", "time": "2026-11-30T10:00:00Z"},
                    {"code": "PowerState/running"}
                ]}
            }
        })
    }

    #[test]
    fn a_plain_vm_reads() {
        let v = vm("value[0]", &base()).unwrap();
        assert_eq!(v.state, InstanceState::Running);
        assert_eq!(v.lifecycle, Lifecycle::OnDemand);
        assert_eq!(v.zone, None);
    }

    #[test]
    fn deallocation_ends_at_the_last_operation_when_the_power_state_has_no_time() {
        let mut b = base();
        b["properties"]["instanceView"]["statuses"][1]["code"] = json!("PowerState/deallocated");
        let v = vm("value[0]", &b).unwrap();
        assert_eq!(
            v.state,
            InstanceState::Stopped {
                since: Some("2026-11-30T10:00:00Z".parse().unwrap()),
                state: "PowerState/deallocated".into()
            }
        );
        b["properties"]["instanceView"]["statuses"][1]["code"] = json!("PowerState/stopped");
        assert_eq!(vm("value[0]", &b).unwrap().state, InstanceState::Running);
    }

    #[test]
    fn bad_fields_are_named() {
        let cases: Vec<(Value, &str)> = vec![
            (json!({"name": "vm1"}), "value[0] (vm1).location: missing"),
            (
                json!({"name": "vm1", "location": "x", "properties": {"hardwareProfile": {"vmSize": 5}}}),
                "value[0] (vm1).properties.hardwareProfile.vmSize: expected a string, got a number",
            ),
            (
                json!({"name": "vm1", "location": "x", "tags": {"team": ["a"]}, "properties": {}}),
                "value[0] (vm1).tags.team: expected a string, got a list",
            ),
            (
                json!({"name": "vm1", "location": "x", "properties": {"hardwareProfile": {"vmSize": "s"}}}),
                "properties.instanceView: missing",
            ),
            (
                json!({"name": "vm1", "location": "x", "properties": {"hardwareProfile": {"vmSize": "s"}, "priority": "Cheap", "instanceView": {"statuses": []}}}),
                "unknown priority `Cheap`",
            ),
            (
                json!({"name": "vm1", "location": "x", "properties": {"hardwareProfile": {"vmSize": "s"}, "instanceView": {"statuses": [{"code": "PowerState/unknown"}]}}}),
                "power state `unknown`",
            ),
            (json!("vm"), "value[0]: expected an object, got a string"),
        ];
        for (v, want) in cases {
            let e = vm("value[0]", &v).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        assert!(page(b"{}").unwrap_err().contains("value: missing"));
        assert!(page(b"[").unwrap_err().contains("not JSON"));
    }
}
