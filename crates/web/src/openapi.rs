//! The OpenAPI document of every endpoint, served at `/api/v1/openapi.json`. It is written by
//! hand as the contract; tests check that it parses and names every route the router serves.

use axum::http::header;
use axum::response::IntoResponse;

/// The document's text.
pub const OPENAPI_JSON: &str = include_str!("../openapi.json");

pub async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_parses_and_names_every_api_route() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI_JSON).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        for route in [
            "/api/v1/ingest",
            "/api/v1/gpus",
            "/api/v1/gpus/{uuid}",
            "/api/v1/summary",
            "/api/v1/sources",
            "/api/v1/teams",
            "/api/v1/savings",
            "/api/v1/used-by",
            "/api/v1/billing",
            "/api/v1/openapi.json",
        ] {
            assert!(
                paths.contains_key(route),
                "{route} missing from openapi.json"
            );
        }
        // Every field of the push types is in the schema, and nothing more.
        let schemas = &doc["components"]["schemas"];
        let sample: gpuledger_model::PushSample = serde_json::from_value(serde_json::json!({
            "gpu_uuid": "GPU-1", "ts": "2026-12-02T10:59:00Z", "util_pct": 1.0,
            "mem_used_mib": 1.0, "power_w": 1.0, "sm_active": 0.1
        }))
        .unwrap();
        let fields = serde_json::to_value(sample).unwrap();
        let props = schemas["PushSample"]["properties"].as_object().unwrap();
        assert_eq!(
            fields.as_object().unwrap().keys().collect::<Vec<_>>(),
            props.keys().collect::<Vec<_>>()
        );
        // Every field the push types can carry is documented.
        let alloc: gpuledger_model::PushAllocation = serde_json::from_value(serde_json::json!({
            "gpu_uuid": "GPU-1", "start": "2026-12-02T08:00:00Z", "end": null,
            "workload": "ns/p", "kind": "pod", "user": "a", "team": "t", "owner": "Job/j",
            "context": {"namespace": "ns", "pod_labels": {"a": "b"}, "pod_annotations": {"a": "b"},
                "namespace_labels": {"a": "b"}, "namespace_annotations": {"a": "b"},
                "slurm_account": "x", "slurm_partition": "y"}
        }))
        .unwrap();
        let gpu: gpuledger_model::PushGpu = serde_json::from_value(serde_json::json!({
            "uuid": "GPU-1", "model": "m", "account": "123", "observed_at": "2026-12-02T08:00:00Z"
        }))
        .unwrap();
        for (schema, value) in [
            ("PushAllocation", serde_json::to_value(&alloc).unwrap()),
            (
                "WorkloadContext",
                serde_json::to_value(&alloc.context).unwrap(),
            ),
            ("PushGpu", serde_json::to_value(&gpu).unwrap()),
        ] {
            let props = schemas[schema]["properties"].as_object().unwrap();
            for k in value.as_object().unwrap().keys() {
                assert!(
                    props.contains_key(k),
                    "{schema}.{k} missing from openapi.json"
                );
            }
        }
    }
}
