//! The OpenAPI document of the API contract, served at `/api/v1/openapi.json`. It is written by
//! hand, and held to the server by the tests below: the operations, their query parameters,
//! statuses and authentication are those of [`crate::contract`], which the handlers and the
//! router use; the routes are those `lib.rs` serves; every parameter's schema is the rule its
//! parser applies; every push field's constraints are the rules `gpuledger_ledger` validates.
//! `crates/web/tests/http.rs` (`contract_*`) probes a running server with every parameter the
//! document lists, and `scripts/api-contract.sh` runs schemathesis against the demo.

use axum::http::header;
use axum::response::IntoResponse;

/// The document's text.
pub const OPENAPI_JSON: &str = include_str!("../openapi.json");

pub async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::{json, Map, Value};

    use super::*;
    use crate::contract::{Auth, OPERATIONS, PAGES};
    use crate::params::{Params, RANGE_PATTERN, SOURCE_PATTERN};

    fn doc() -> Value {
        serde_json::from_str(OPENAPI_JSON).expect("openapi.json parses")
    }

    /// `v`, or what its `$ref` points at.
    fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
        match v["$ref"].as_str() {
            Some(r) => doc
                .pointer(r.trim_start_matches('#'))
                .unwrap_or_else(|| panic!("{r} points at nothing")),
            None => v,
        }
    }

    const METHODS: [&str; 8] = [
        "get", "put", "post", "delete", "options", "head", "patch", "trace",
    ];

    #[test]
    fn the_document_lists_exactly_the_contracts_operations() {
        let doc = doc();
        let documented: BTreeSet<(String, String)> = doc["paths"]
            .as_object()
            .unwrap()
            .iter()
            .flat_map(|(path, item)| {
                item.as_object()
                    .unwrap()
                    .keys()
                    .filter(|m| METHODS.contains(&m.as_str()))
                    .map(move |m| (m.clone(), path.clone()))
            })
            .collect();
        let served: BTreeSet<(String, String)> = OPERATIONS
            .iter()
            .map(|op| (op.method.to_string(), op.path.to_string()))
            .collect();
        assert_eq!(
            documented, served,
            "openapi.json and contract::OPERATIONS name different operations"
        );
    }

    #[test]
    fn every_operation_documents_its_parameters_statuses_and_authentication() {
        let doc = doc();
        for op in OPERATIONS {
            let o = &doc["paths"][op.path][op.method];
            let at = format!("{} {}", op.method, op.path);
            let params: Vec<&Value> = o["parameters"]
                .as_array()
                .map(|ps| ps.iter().map(|p| resolve(&doc, p)).collect())
                .unwrap_or_default();
            let named = |place: &str| -> BTreeSet<String> {
                params
                    .iter()
                    .filter(|p| p["in"] == place)
                    .map(|p| p["name"].as_str().unwrap().to_string())
                    .collect()
            };
            let takes: BTreeSet<String> = op.query_names().iter().map(|s| s.to_string()).collect();
            assert_eq!(named("query"), takes, "{at}: query parameters");
            let placeholders: BTreeSet<String> = op
                .path
                .split('/')
                .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
                .map(String::from)
                .collect();
            assert_eq!(named("path"), placeholders, "{at}: path parameters");

            let responses = o["responses"].as_object().unwrap();
            let documented: BTreeSet<u16> = responses.keys().map(|k| k.parse().unwrap()).collect();
            let answered: BTreeSet<u16> = op.statuses.iter().copied().collect();
            assert_eq!(documented, answered, "{at}: statuses");
            for (code, r) in responses {
                let r = resolve(&doc, r);
                assert!(r["description"].is_string(), "{at} {code}: no description");
                if code.starts_with('2') {
                    continue;
                }
                // Every error answer is `{"error": ...}` (a push's carries its counts beside
                // it), except the probe's plain-text "not ready".
                let content = r["content"].as_object().unwrap();
                if op.path == "/readyz" && code == "503" {
                    assert!(content.contains_key("text/plain"), "{at} {code}");
                    continue;
                }
                let schema = resolve(&doc, &content["application/json"]["schema"]);
                assert!(
                    schema["required"]
                        .as_array()
                        .is_some_and(|r| r.contains(&json!("error")))
                        || schema["properties"]["error"]["type"] == "string",
                    "{at} {code}: the error body is not {{\"error\": ...}}"
                );
            }

            let security = match op.auth {
                Auth::Open => json!([]),
                Auth::Read => json!([{}, {"bearer": []}]),
                Auth::Ingest => json!([{"bearer": []}]),
            };
            assert_eq!(o["security"], security, "{at}: security");
        }
    }

    /// The `(method, path)` of every `.route("PATH", METHOD(…))` in `lib.rs`.
    fn routes_in_lib_rs() -> BTreeSet<(String, String)> {
        let src = include_str!("lib.rs");
        let mut routes = BTreeSet::new();
        for (i, _) in src.match_indices(".route(") {
            let rest = src[i + ".route(".len()..].trim_start();
            let Some(rest) = rest.strip_prefix('"') else {
                continue;
            };
            let (path, rest) = rest.split_once('"').unwrap();
            let method = METHODS
                .iter()
                .filter_map(|m| rest.find(&format!("{m}(")).map(|at| (at, *m)))
                .min()
                .map(|(_, m)| m)
                .unwrap_or_else(|| panic!("route {path}: no method"));
            routes.insert((method.to_string(), path.to_string()));
        }
        routes
    }

    #[test]
    fn the_router_serves_the_contract_and_the_pages_and_nothing_else() {
        let mut expected: BTreeSet<(String, String)> = OPERATIONS
            .iter()
            .map(|op| (op.method.to_string(), op.path.to_string()))
            .collect();
        expected.extend(PAGES.iter().map(|p| ("get".to_string(), p.to_string())));
        assert_eq!(
            routes_in_lib_rs(),
            expected,
            "a route in lib.rs is neither in contract::OPERATIONS (and so in openapi.json) nor \
             in contract::PAGES, or one of them is no longer served"
        );
    }

    /// A query parameter's values that its schema allows and that it forbids, from the schema
    /// alone; the server must take the first and refuse the second.
    fn probes(schema: &Value) -> (Vec<String>, Vec<String>) {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        if let Some(values) = schema["enum"].as_array() {
            let ok = values
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            return (ok, s(&["__not_in_enum__", ""]));
        }
        if let Some(any) = schema["anyOf"].as_array() {
            let formats: Vec<&str> = any.iter().map(|a| a["format"].as_str().unwrap()).collect();
            assert_eq!(formats, ["date-time", "date"], "{schema}");
            return (
                s(&[
                    "2026-12-01T10:00:00Z",
                    "2026-12-01T10:00:00.5-03:30",
                    "2026-12-01",
                ]),
                s(&[
                    "2024-01-01T12:99:00Z",
                    "2024-13-01",
                    "2026-12-01 10:00:00Z",
                    "",
                ]),
            );
        }
        match schema["type"].as_str().unwrap() {
            "boolean" => (s(&["true", "false"]), s(&["1", "yes", ""])),
            "string" if schema["pattern"].is_string() => {
                let example = schema["example"].as_str().unwrap();
                (s(&[example]), s(&["", &format!("{example}*")]))
            }
            "array" => (s(&["anything", "a,b", ""]), vec![]),
            "integer" => {
                let bound = |k: &str| schema[k].as_i64().unwrap();
                let (min, max) = (bound("minimum"), bound("maximum"));
                (
                    vec![min.to_string(), max.to_string()],
                    vec![
                        (min - 1).to_string(),
                        (max + 1).to_string(),
                        "1.5".into(),
                        "x".into(),
                        String::new(),
                    ],
                )
            }
            other => panic!("no probes for a {other} parameter: {schema}"),
        }
    }

    #[test]
    fn every_query_parameter_is_parsed_as_its_schema_says() {
        let doc = doc();
        for op in OPERATIONS {
            let Some(params) = doc["paths"][op.path][op.method]["parameters"].as_array() else {
                continue;
            };
            for p in params.iter().map(|p| resolve(&doc, p)) {
                let name = p["name"].as_str().unwrap();
                // `idle_days` is read by the Waste page's findings (tests/http.rs probes it).
                if p["in"] != "query" || name == "idle_days" {
                    continue;
                }
                let (ok, bad) = probes(&p["schema"]);
                for v in ok {
                    let q = form_urlencoded::Serializer::new(String::new())
                        .append_pair(name, &v)
                        .finish();
                    if let Err(e) = Params::parse_api(Some(&q), &op) {
                        panic!(
                            "{}: `{q}` is allowed by the document, refused: {e}",
                            op.path
                        );
                    }
                }
                for v in bad {
                    let q = form_urlencoded::Serializer::new(String::new())
                        .append_pair(name, &v)
                        .finish();
                    match Params::parse_api(Some(&q), &op) {
                        Ok(_) => panic!("{}: `{q}` is forbidden by the document, taken", op.path),
                        Err(e) => assert!(e.starts_with(name), "{}: `{q}`: {e}", op.path),
                    }
                }
            }
        }
        let range = &doc["components"]["parameters"]["range"]["schema"]["pattern"];
        assert_eq!(
            range, RANGE_PATTERN,
            "the range pattern is params::RANGE_PATTERN"
        );
        let source = &doc["components"]["parameters"]["source"]["schema"]["pattern"];
        assert_eq!(
            source, SOURCE_PATTERN,
            "the source pattern is params::SOURCE_PATTERN"
        );
    }

    // -----------------------------------------------------------------------------------------
    // The push schemas against the validator.

    fn now() -> chrono::DateTime<chrono::Utc> {
        "2026-12-02T12:00:00Z".parse().unwrap()
    }

    /// Whether the validator keeps `record` as the only item of `list`.
    fn kept(list: &str, record: &Value) -> bool {
        let body = json!({ list: [record] });
        let v = gpuledger_ledger::validate_body(body.as_object().unwrap().clone(), now(), 300);
        v.rejections.is_empty()
    }

    /// A value that meets `schema` except for its bound `key`, at the bound (`at`) or just
    /// past it, built like `base`.
    fn at_bound(schema: &Value, key: &str, base: &Value, past: bool) -> Option<Value> {
        let n = schema[key].as_f64()?;
        let integer = schema["type"] == "integer";
        let step = if integer { 1.0 } else { 0.001 };
        Some(match key {
            "minimum" => num(if past { n - step } else { n }, integer),
            "maximum" => num(if past { n + step } else { n }, integer),
            "maxLength" => {
                let len = n as usize + usize::from(past);
                let text = base.as_str().unwrap_or("x");
                // Multi-byte characters where the pattern allows them: the bound counts
                // characters, not bytes.
                let multi_byte = schema["pattern"]
                    .as_str()
                    .is_none_or(|p| regex::Regex::new(p).unwrap().is_match("é"));
                let fill = if multi_byte { "é" } else { "a" };
                let keep: String = text.chars().take(len).collect();
                Value::String(format!("{keep}{}", fill.repeat(len - keep.chars().count())))
            }
            "maxProperties" => {
                let len = n as usize + usize::from(past);
                Value::Object((0..len).map(|i| (format!("k{i}"), json!("v"))).collect())
            }
            _ => return None,
        })
    }

    fn num(v: f64, integer: bool) -> Value {
        if integer {
            json!(v as i64)
        } else {
            json!(v)
        }
    }

    /// Strings to try against a `pattern`: the validator must keep exactly those it matches.
    const PATTERN_PROBES: [&str; 16] = [
        "",
        " ",
        "\t\n",
        "\u{a0}",
        "x",
        " x ",
        "GPU-",
        "GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d5e",
        "MIG-GPU-5c1f4b2e/1/0",
        "MIG-5c1f",
        "gpu-5c1f",
        "GPU-5c1f_4b",
        "GPU-5c1f é",
        "GPU-5c1f\n",
        "placeholder:n1:0",
        "-GPU-1",
    ];

    /// `record` with `field` (of its `scope` object, or its own) removed or set to `value`.
    fn with(record: &Value, scope: Option<&str>, field: &str, value: Option<Value>) -> Value {
        let mut r = record.clone();
        let m = match scope {
            Some(s) => r[s].as_object_mut().unwrap(),
            None => r.as_object_mut().unwrap(),
        };
        match value {
            Some(v) => m.insert(field.to_string(), v),
            None => m.remove(field),
        };
        r
    }

    /// Check the properties of schema `name` that `base` (a record of `list` the validator
    /// keeps) carries, at its top level or in its `scope` object, against the validator.
    /// `cross` names properties that another one decides (a MIG instance needs its parent),
    /// which the document states in words: their absence, null and pattern matches are not
    /// checked. Returns the properties checked.
    fn check_record(
        doc: &Value,
        list: &str,
        name: &str,
        base: &Value,
        scope: Option<&str>,
        cross: &[&str],
    ) -> BTreeSet<String> {
        let schema = &doc["components"]["schemas"][name];
        let keeps =
            |field: &str, value: Option<Value>| kept(list, &with(base, scope, field, value));
        assert!(kept(list, base), "{name}: the base record is refused");
        assert_eq!(
            schema["additionalProperties"], false,
            "{name}: unknown fields"
        );
        assert!(
            !keeps("typo_field", Some(json!(1))),
            "{name}: an unknown field is taken"
        );
        let required: BTreeSet<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().map(|v| v.as_str().unwrap()).collect())
            .unwrap_or_default();
        let fields = match scope {
            Some(s) => &base[s],
            None => base,
        };
        let mut checked = BTreeSet::new();
        for (field, prop) in schema["properties"].as_object().unwrap() {
            let (f, prop) = (field.as_str(), resolve(doc, prop));
            let base_value = &fields[f];
            if base_value.is_null() || prop["$ref"].is_string() || prop["properties"].is_object() {
                continue;
            }
            checked.insert(field.clone());
            let at = format!("{name}.{field}");
            let cross = cross.contains(&f);
            if !cross {
                assert_eq!(
                    keeps(f, None),
                    !required.contains(f),
                    "{at}: required in the document iff the validator needs it"
                );
                assert_eq!(
                    keeps(f, Some(Value::Null)),
                    prop["nullable"] == true,
                    "{at}: nullable in the document iff the validator takes null"
                );
            }
            for key in ["minimum", "maximum", "maxLength", "maxProperties"] {
                let (Some(edge), Some(past)) = (
                    at_bound(prop, key, base_value, false),
                    at_bound(prop, key, base_value, true),
                ) else {
                    continue;
                };
                assert!(keeps(f, Some(edge.clone())), "{at}: {key}, {edge} refused");
                assert!(
                    !keeps(f, Some(past.clone())),
                    "{at}: past {key}, {past} taken"
                );
            }
            if let Some(pattern) = prop["pattern"].as_str() {
                let re = regex::Regex::new(pattern).unwrap();
                for probe in PATTERN_PROBES {
                    if cross && re.is_match(probe) {
                        continue;
                    }
                    assert_eq!(
                        keeps(f, Some(json!(probe))),
                        re.is_match(probe),
                        "{at}: {probe:?} against the pattern {pattern}"
                    );
                }
            }
            if let Some(values) = prop["enum"].as_array() {
                for v in values {
                    assert!(keeps(f, Some(v.clone())), "{at}: {v} refused");
                }
                assert!(
                    !keeps(f, Some(json!("__not_in_enum__"))),
                    "{at}: not in enum"
                );
            }
            if prop["format"] == "date-time" {
                assert!(
                    !keeps(f, Some(json!("2026-12-02T11:99:00Z"))),
                    "{at}: bad time"
                );
            }
            if let Some(names) = prop.get("propertyNames") {
                let one = |k: String, v: String| Some(json!({ k: v }));
                let v = || "v".to_string();
                assert_eq!(names["minLength"], 1, "{at}: keys are not empty");
                assert!(!keeps(f, one(String::new(), v())), "{at}: an empty key");
                let max = names["maxLength"].as_u64().unwrap() as usize;
                assert!(keeps(f, one("é".repeat(max), v())), "{at}: the longest key");
                assert!(
                    !keeps(f, one("é".repeat(max + 1), v())),
                    "{at}: a longer key"
                );
                let max = prop["additionalProperties"]["maxLength"].as_u64().unwrap() as usize;
                assert!(
                    keeps(f, one("k".into(), "é".repeat(max))),
                    "{at}: the longest value"
                );
                assert!(
                    !keeps(f, one("k".into(), "é".repeat(max + 1))),
                    "{at}: a longer value"
                );
            }
        }
        checked
    }

    #[test]
    fn every_push_field_is_validated_as_the_document_says() {
        let doc = doc();
        let recent = "2026-12-02T11:00:00Z";
        let gpu = json!({
            "uuid": "GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d5e", "model": "NVIDIA H100 80GB HBM3",
            "memory_mib": 81559, "host": "gpu-node-7", "cluster": "rdu-ocp-1", "cloud": "aws",
            "region": "us-east-1", "instance_type": "p5.48xlarge", "account": "123456789012",
            "serial": "1654922000123", "pci_bus_id": "00000000:1B:00.0",
            "labels": {"team": "nlp"}, "observed_at": recent
        });
        // A `MIG-` uuid needs a parent, and only a MIG instance has a profile.
        let mut checked = check_record(&doc, "gpus", "PushGpu", &gpu, None, &["uuid"]);
        let mig = json!({
            "uuid": "MIG-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d5f", "model": "NVIDIA H100 80GB HBM3",
            "mig_parent_uuid": "GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d5e",
            "mig_profile": "1g.10gb", "observed_at": recent
        });
        checked.extend(check_record(
            &doc,
            "gpus",
            "PushGpu",
            &mig,
            None,
            &["uuid", "mig_parent_uuid"],
        ));
        assert!(!kept("gpus", &with(&mig, None, "mig_parent_uuid", None)));
        assert!(!kept(
            "gpus",
            &with(&gpu, None, "mig_profile", Some(json!("1g.10gb")))
        ));
        let all = |name: &str| -> BTreeSet<String> {
            doc["components"]["schemas"][name]["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect()
        };
        assert_eq!(checked, all("PushGpu"), "every PushGpu field checked");

        let sample = json!({
            "gpu_uuid": "GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d5e", "ts": recent,
            "util_pct": 87.0, "mem_used_mib": 60210, "power_w": 512.4, "sm_active": 0.71
        });
        let checked = check_record(&doc, "samples", "PushSample", &sample, None, &[]);
        assert_eq!(checked, all("PushSample"));

        let alloc = json!({
            "gpu_uuid": "GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d5e", "start": "2026-12-02T08:00:00Z",
            "end": recent, "workload": "nlp-prod/llm-ft-0", "kind": "pod", "user": "alice",
            "team": "nlp", "owner": "Job/train-7", "avg_util_pct": 41.5, "avg_mem_used_mib": 8192,
            "context": {
                "namespace": "nlp-prod", "pod_labels": {"a": "b"}, "pod_annotations": {"a": "b"},
                "namespace_labels": {"a": "b"}, "namespace_annotations": {"a": "b"},
                "slurm_account": "speech", "slurm_partition": "a100-long",
                "slurm_qos": "normal", "slurm_job_name": "train", "slurm_state": "COMPLETED"
            }
        });
        let mut checked = check_record(&doc, "allocations", "PushAllocation", &alloc, None, &[]);
        checked.insert("context".into());
        assert_eq!(checked, all("PushAllocation"));
        let checked = check_record(
            &doc,
            "allocations",
            "WorkloadContext",
            &alloc,
            Some("context"),
            &[],
        );
        assert_eq!(checked, all("WorkloadContext"));
    }

    #[test]
    fn the_push_body_is_as_the_document_says() {
        let doc = doc();
        let body = &doc["components"]["schemas"]["PushBody"];
        assert_eq!(body["additionalProperties"], false);
        let lists: BTreeSet<&str> = body["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(lists, BTreeSet::from(["gpus", "samples", "allocations"]));
        let validate =
            |b: Value| gpuledger_ledger::validate_body(b.as_object().unwrap().clone(), now(), 300);
        for list in lists {
            let nullable = body["properties"][list]["nullable"] == true;
            assert_eq!(
                !validate(json!({ list: null })).malformed,
                nullable,
                "{list}: null"
            );
            assert!(
                validate(json!({ list: {} })).malformed,
                "{list}: not an array"
            );
        }
        assert!(validate(json!({"sampels": []})).malformed);
        // Every field the wire types carry is documented, and nothing more.
        for (name, fields) in [
            (
                "PushGpu",
                wire_fields::<gpuledger_model::PushGpu>(json!({
                    "uuid": "GPU-1", "model": "m", "memory_mib": 1, "host": "h", "cluster": "c",
                    "cloud": "aws", "region": "r", "instance_type": "i", "account": "a",
                    "serial": "s", "pci_bus_id": "p", "mig_parent_uuid": "GPU-2",
                    "mig_profile": "1g", "labels": {"a": "b"}, "observed_at": "2026-12-02T08:00:00Z"
                })),
            ),
            (
                "PushSample",
                wire_fields::<gpuledger_model::PushSample>(json!({
                    "gpu_uuid": "GPU-1", "ts": "2026-12-02T10:59:00Z", "util_pct": 1.0,
                    "mem_used_mib": 1.0, "power_w": 1.0, "sm_active": 0.1
                })),
            ),
            (
                "PushAllocation",
                wire_fields::<gpuledger_model::PushAllocation>(json!({
                    "gpu_uuid": "GPU-1", "start": "2026-12-02T08:00:00Z", "end": null,
                    "workload": "ns/p", "kind": "pod", "user": "a", "team": "t", "owner": "Job/j",
                    "context": {"namespace": "ns"}, "avg_util_pct": 1.0, "avg_mem_used_mib": 1.0
                })),
            ),
            (
                "WorkloadContext",
                wire_fields::<gpuledger_model::WorkloadContext>(json!({
                    "namespace": "ns", "pod_labels": {"a": "b"}, "pod_annotations": {"a": "b"},
                    "namespace_labels": {"a": "b"}, "namespace_annotations": {"a": "b"},
                    "slurm_account": "x", "slurm_partition": "y", "slurm_qos": "q",
                    "slurm_job_name": "j", "slurm_state": "RUNNING"
                })),
            ),
        ] {
            let props: BTreeSet<String> = doc["components"]["schemas"][name]["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            assert_eq!(
                props, fields,
                "{name}: the document's fields and the wire type's"
            );
        }
    }

    /// The fields of `T`: those of a full value, which must read back as `T`.
    fn wire_fields<T: serde::de::DeserializeOwned + serde::Serialize>(
        full: Value,
    ) -> BTreeSet<String> {
        let keys: BTreeSet<String> = full.as_object().unwrap().keys().cloned().collect();
        let value: T = serde_json::from_value(full).expect("a full value reads");
        let back: Map<String, Value> =
            serde_json::from_value(serde_json::to_value(value).unwrap()).unwrap();
        assert!(
            back.keys().all(|k| keys.contains(k)),
            "a field the full value lacks"
        );
        keys
    }
}
