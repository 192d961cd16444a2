//! Fuzz the dcgm collector's reader of GPU exporters' `/metrics` (Prometheus text format:
//! dcgm-exporter, AMD's device-metrics-exporter, the Gaudi metric exporter) and its mapping to
//! GPUs, MIG instances and AMD partitions, samples and holds: any bytes must come back as series
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
        assert!(
            gpuledger_collect::collectors::dcgm::families::vendor_of(&s.metric).is_some(),
            "{} is no GPU exporter's family",
            s.metric
        );
        assert_eq!(s.values.len(), 1);
    }
    let now = Utc.with_ymd_and_hms(2026, 12, 3, 12, 0, 0).unwrap();
    dcgm_checks::map_and_check(&parsed.series, now);
});
