//! Fuzz the agent's `nvidia-smi -L` reader, the only output naming MIG instances: any text must
//! come back as a (possibly empty) list, never a panic, with no GPU or instance lacking a UUID.
//!
//! Run: `cargo +nightly fuzz run agent_smi_list` (from the repository root).
#![no_main]

use gpuledger_agent::source::smi_list;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let listed = smi_list::parse(&text);
    assert!(listed.len() <= text.lines().count());
    for g in &listed {
        assert!(!g.uuid.is_empty() && g.uuid.trim() == g.uuid);
        for m in &g.migs {
            assert!(!m.uuid.is_empty() && m.uuid.trim() == m.uuid);
        }
    }
});
