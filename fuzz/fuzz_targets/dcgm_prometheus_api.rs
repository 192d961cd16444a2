//! Fuzz the dcgm collector's reader of Prometheus HTTP API answers (`/api/v1/query` vectors,
//! `/api/v1/query_range` matrices) and the mapping of their series: any bytes must come back as
//! series plus named problems or one refusal, never a panic, with only plausible values mapped.
//!
//! Run: `cargo +nightly fuzz run dcgm_prometheus_api` (from the repository root).
#![no_main]

mod dcgm_checks;

use chrono::{TimeZone, Utc};
use gpuledger_collect::collectors::dcgm::parse::parse_api;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse_api(data) {
        Ok(parsed) => {
            assert!(parsed.problems.len() <= 21);
            for s in &parsed.series {
                assert!(s.values.iter().all(|r| r.ts.is_some()));
            }
            let now = Utc.with_ymd_and_hms(2026, 12, 3, 12, 0, 0).unwrap();
            dcgm_checks::map_and_check(&parsed.series, now);
        }
        Err(e) => assert!(!e.message.is_empty()),
    }
});
