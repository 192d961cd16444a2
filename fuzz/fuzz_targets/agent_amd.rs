//! Fuzz the agent's AMD readers: `rocm-smi --json` (with `--showpidgpus` text) and amd-smi's
//! `static`, `metric` and `process` JSON. Any bytes must come back as readings or a parse error,
//! never a panic; every GPU gets an AMD identity the push API accepts (`AMD-…`, a partition
//! `<gpu>/P<n>` under its GPU), never one built from `N/A`, `0` or a masked serial, and every
//! metric stays within its range.
//!
//! The input is split at NUL bytes: rocm-smi JSON, its `--showpidgpus` text, then amd-smi's
//! static, metric and process documents (missing parts are empty).
//!
//! Run: `cargo +nightly fuzz run agent_amd` (from the repository root).
#![no_main]

mod agent_checks;

use agent_checks::check_gpu;
use gpuledger_agent::source::{amd_smi, rocm_smi, Snapshot};
use libfuzzer_sys::fuzz_target;

fn check(s: &Snapshot) {
    for g in &s.gpus {
        check_gpu(g);
        assert!(g.uuid.starts_with("AMD-"), "{}", g.uuid);
        assert!(
            gpuledger_ledger::ingest::uuid_problem(&g.uuid).is_none(),
            "{}",
            g.uuid
        );
        // Never an identity built from `N/A`, `0`, all zeros or a masked serial.
        let physical = g.uuid.split('/').next().unwrap_or_default();
        for prefix in ["AMD-SN-", "AMD-UID-", "AMD-UUID-"] {
            if let Some(id) = physical.strip_prefix(prefix) {
                assert!(
                    gpuledger_model::accel::is_usable_id(id),
                    "{}",
                    g.uuid
                );
            }
        }
        if let Some(parent) = &g.mig_parent_uuid {
            assert!(g.uuid.starts_with(&format!("{parent}/P")), "{}", g.uuid);
            assert!(s.gpus.iter().any(|p| &p.uuid == parent));
        }
    }
    for p in &s.processes {
        assert!(s.gpus.iter().any(|g| g.uuid == p.gpu_uuid), "{p:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let mut next = || parts.next().unwrap_or("");
    let (rocm, pids, stat, metric, process) = (next(), next(), next(), next(), next());
    let pids = (!pids.is_empty()).then_some(pids);
    let process = (!process.is_empty()).then_some(process);
    for host in [None, Some("node-1")] {
        if let Ok(s) = rocm_smi::parse(rocm, pids, host) {
            check(&s);
        }
        let _ = rocm_smi::parse_pid_gpus(pids.unwrap_or(""));
        if let Ok(s) = amd_smi::parse(stat, metric, process, host) {
            check(&s);
        }
        let _ = amd_smi::gpu_indices(stat);
    }
});
