//! Fuzz the agent's `nvidia-smi -q -x` reader: any bytes must come back as a snapshot or a
//! parse error, never a panic, and what comes back must hold only plausible, known values.
//!
//! The input is the XML, optionally preceded by `nvidia-smi -L` output and a NUL byte: the
//! agent reads `-L` too when a GPU has MIG enabled, to name its instances.
//!
//! Run: `cargo +nightly fuzz run agent_smi_xml` (from the repository root).
#![no_main]

mod agent_checks;

use agent_checks::{check_gpu, check_text};
use gpuledger_agent::source::{smi_list, smi_xml, Snapshot};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // nvidia-smi's output is read as lossy UTF-8 (`Smi::run`).
    let (list, xml) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    let list = smi_list::parse(&String::from_utf8_lossy(list));
    let xml = String::from_utf8_lossy(xml);
    if let Ok(snap) = smi_xml::parse(&xml, &[]) {
        check(&snap);
    }
    if !list.is_empty() {
        if let Ok(snap) = smi_xml::parse(&xml, &list) {
            check(&snap);
        }
    }
});

fn check(snap: &Snapshot) {
    for (i, g) in snap.gpus.iter().enumerate() {
        check_gpu(g);
        // A MIG instance comes after its physical GPU, and its parent is a physical GPU.
        if let Some(parent) = &g.mig_parent_uuid {
            assert!(snap.gpus[..i]
                .iter()
                .any(|p| &p.uuid == parent && p.mig_parent_uuid.is_none()));
        }
    }
    for p in &snap.processes {
        assert!(!p.gpu_uuid.is_empty());
        assert!(snap.gpus.iter().any(|g| g.uuid == p.gpu_uuid));
        check_text(&p.name);
        check_text(&p.process_type);
    }
}
