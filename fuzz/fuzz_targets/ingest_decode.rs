//! Fuzz the push API decoder and validator: any bytes, plain or as gzip, must come back as a
//! decode error or as kept records plus rejections, never a panic.
//!
//! Run: `cargo +nightly fuzz run ingest_decode` (from the repository root).
#![no_main]

use gpuledger_ledger::{decode_body, validate_body, BodyLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = BodyLimits { max_body_bytes: 1 << 20, max_decompressed_bytes: 4 << 20 };
    let now = chrono::DateTime::from_timestamp(1_796_212_800, 0).unwrap();
    // The first byte picks the encoding so one corpus covers both paths.
    let (encoding, body) = match data.split_first() {
        Some((b, rest)) if b % 2 == 1 => (Some("gzip"), rest),
        Some((_, rest)) => (None, rest),
        None => (None, data),
    };
    if let Ok(map) = decode_body(body, encoding, limits) {
        let v = validate_body(map, now, 300);
        for r in &v.rejections {
            assert!(!r.path.is_empty() && !r.reason.is_empty());
        }
    }
});
