//! Fuzz the agent's readers of `/proc/<pid>/status`, `/proc/<pid>/stat`, `/proc/stat`,
//! `/proc/<pid>/cgroup` and `/etc/passwd`: any text must come back as facts or as unknown,
//! never a panic, and a container or pod found in a cgroup path must have its exact form.
//!
//! Run: `cargo +nightly fuzz run agent_procs` (from the repository root).
#![no_main]

use chrono::DateTime;
use gpuledger_agent::procs::{
    parse_btime, parse_cgroup, parse_passwd, parse_stat, parse_status_uid, USER_HZ,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The agent reads these files with `read_to_string`, so invalid UTF-8 is no text at all.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_status_uid(text);
    let (comm, ticks) = parse_stat(text);
    if let Some(comm) = comm {
        assert!(comm.len() < text.len());
    }
    // The start time as `ProcReader::inspect` computes it: boot time plus ticks since boot.
    if let (Some(boot), Some(t)) = (parse_btime(text), ticks) {
        let _ = DateTime::from_timestamp(boot.saturating_add((t / USER_HZ) as i64), 0);
    }
    for name in parse_passwd(text).values() {
        assert!(!name.is_empty() && !name.contains(':') && !name.contains('\n'));
    }
    let c = parse_cgroup(text);
    if let Some(id) = &c.container_id {
        assert!(
            id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id:?}"
        );
    }
    if let Some(uid) = &c.pod_uid {
        assert_eq!(uid.len(), 36, "{uid:?}");
        for (i, b) in uid.bytes().enumerate() {
            assert_eq!(matches!(i, 8 | 13 | 18 | 23), b == b'-', "{uid:?}");
            assert!(b == b'-' || b.is_ascii_hexdigit(), "{uid:?}");
        }
    }
});
