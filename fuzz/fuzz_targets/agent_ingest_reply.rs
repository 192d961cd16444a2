//! Fuzz how the agent reads the server's answer to a push (`send::classify`, the `Retry-After`
//! header, the rejected records' paths): whatever a server or a proxy in front of it answers,
//! the agent must decide deliver, refuse or retry, never panic, and never wait over a day.
//!
//! The input's first two bytes are the HTTP status (big-endian), the rest the body; the body
//! read as lossy UTF-8 is also tried as a `Retry-After` value.
//!
//! Run: `cargo +nightly fuzz run agent_ingest_reply` (from the repository root).
#![no_main]

use std::time::Duration;

use chrono::{TimeZone, Utc};
use gpuledger_agent::send::{classify, parse_retry_after, Outcome};
use libfuzzer_sys::fuzz_target;

const DAY: Duration = Duration::from_secs(24 * 3600);

fuzz_target!(|data: &[u8]| {
    let (status, body) = match data {
        [a, b, rest @ ..] => (u16::from_be_bytes([*a, *b]), rest),
        _ => return,
    };
    // `Sender::send` reads the body with `read_to_string`: lossy text stands in for it here.
    let body = String::from_utf8_lossy(body);
    let now = Utc.with_ymd_and_hms(2026, 12, 3, 12, 0, 0).unwrap();
    let after = parse_retry_after(&body, now);
    if let Some(a) = after {
        assert!(a <= DAY, "{a:?}");
    }
    match classify(status, &body, after) {
        Outcome::Delivered(reply) => {
            assert!((200..=299).contains(&status));
            for r in &reply.rejected {
                let _ = r.is_unknown_gpu();
                let _ = r.record();
            }
        }
        Outcome::Refused {
            status: s,
            too_large,
            reply,
            ..
        } => {
            assert_eq!(s, status);
            assert_eq!(too_large, status == 413);
            for r in &reply.rejected {
                let _ = r.is_unknown_gpu();
                let _ = r.record();
            }
        }
        Outcome::Retry { after: a, .. } => {
            assert!(!(200..=299).contains(&status));
            assert!(a.is_none_or(|a| a <= DAY));
        }
    }
});
