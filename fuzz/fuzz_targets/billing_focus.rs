//! Fuzz the FOCUS billing reader and the assignments reader: any text must come back as lines
//! plus named problems, or a refusal of the whole file, never a panic.
//!
//! Run: `cargo +nightly fuzz run billing_focus` (from the repository root).
#![no_main]

use gpuledger_ledger::billing::{parse_focus, read_export, reconcile};
use gpuledger_ledger::ownership::parse_assignments;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok((lines, problems)) = parse_focus("f.csv", &text) {
        let r = reconcile(
            &lines,
            &Default::default(),
            &Default::default(),
            &Default::default(),
            problems,
        );
        assert!(r.matched_lines + r.unmatched.len() == r.gpu_lines);
    }
    let _ = parse_assignments("a.csv", &text);
    // Plain or gzip bytes: text or a named refusal.
    let _ = read_export("f.csv.gz", data);
});
