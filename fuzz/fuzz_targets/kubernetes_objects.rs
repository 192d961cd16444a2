//! Fuzz the kubernetes collector's mapping: any bytes that decode as a Node or a Pod must map to
//! GPU facts (or to nothing) without a panic, whatever the labels, quantities and times say,
//! and a pod's workload context must stay within the push contract's limits.
//!
//! Run: `cargo +nightly fuzz run kubernetes_objects` (from the repository root).
#![no_main]

use gpuledger_collect::collectors::kubernetes::parse::{node_gpus, pod_gpus, workload_context};
use k8s_openapi::api::core::v1::{Node, Pod};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(node) = serde_json::from_slice::<Node>(data) {
        if let Some(g) = node_gpus(&node) {
            assert!(g.physical > 0 || !g.mig_profiles.is_empty());
        }
    }
    if let Ok(pod) = serde_json::from_slice::<Pod>(data) {
        if let Some(p) = pod_gpus(&pod) {
            assert!(p.slots() > 0);
            assert!(p.end.is_none() || p.end >= p.start);
            // What ownership rules read stays within the push contract's limits.
            let c = workload_context(&p, None);
            for (_, map) in c.maps() {
                assert!(map.len() <= 64);
                assert!(map.iter().all(|(k, v)| k.len() <= 256 && v.len() <= 256));
            }
        }
    }
});
