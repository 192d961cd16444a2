//! Fuzz the agent's Gaudi readers: `hl-smi -Q … -f csv` and hl-smi's table (with its process
//! section, log-prefixed lines and several snapshots). Any bytes must come back as readings or
//! a parse error, never a panic; every device gets a Gaudi identity the push API accepts
//! (`HL-…`), metrics stay within their ranges, and a process names a device that was read.
//!
//! Run: `cargo +nightly fuzz run agent_hl_smi` (from the repository root).
#![no_main]

mod agent_checks;

use agent_checks::check_gpu;
use gpuledger_agent::source::{hl_smi, GpuReading};
use libfuzzer_sys::fuzz_target;

fn check(gpus: &[GpuReading]) {
    for g in gpus {
        check_gpu(g);
        assert!(g.uuid.starts_with("HL-"), "{}", g.uuid);
        assert!(
            gpuledger_ledger::ingest::uuid_problem(&g.uuid).is_none(),
            "{}",
            g.uuid
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for host in [None, Some("gaudi-1")] {
        if let Ok(gpus) = hl_smi::parse_csv(&text, host) {
            check(&gpus);
        }
        if let Ok(s) = hl_smi::parse_table(&text, host) {
            check(&s.gpus);
            for p in &s.processes {
                assert!(s.gpus.iter().any(|g| g.uuid == p.gpu_uuid), "{p:?}");
            }
            let _ = hl_smi::processes_from_table(&s.gpus, &text);
        }
    }
});
