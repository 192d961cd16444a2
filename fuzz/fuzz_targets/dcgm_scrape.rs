//! Fuzz the dcgm collector's reader of dcgm-exporter `/metrics` (Prometheus text format) and
//! its mapping to GPUs, MIG instances, samples and holds: any bytes must come back as series
//! plus named problems, never a panic, and the mapping must keep only plausible values (a DCGM
//! sentinel such as 9223372036854775794, a negative or NaN reading is unknown, never a value).
//!
//! Run: `cargo +nightly fuzz run dcgm_scrape` (from the repository root).
#![no_main]

mod dcgm_checks;

use chrono::{TimeZone, Utc};
use gpuledger_collect::collectors::dcgm::parse::parse_text;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The collector reads the scrape body as lossy UTF-8.
    let text = String::from_utf8_lossy(data);
    let parsed = parse_text(&text);
    assert!(parsed.problems.len() <= 21);
    for s in &parsed.series {
        assert!(s.metric.starts_with("DCGM_FI_"));
        assert_eq!(s.values.len(), 1);
    }
    let now = Utc.with_ymd_and_hms(2026, 12, 3, 12, 0, 0).unwrap();
    dcgm_checks::map_and_check(&parsed.series, now);
});
