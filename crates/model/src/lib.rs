//! gpuledger's data model: the types every other crate speaks, with no IO.
//!
//! Units live in names (`_mib`, `_pct`, `_usd_per_hour`, `_secs`). Times are UTC. Values that a
//! source did not give are `None` ("unknown"), never 0.

pub mod accel;
pub mod observation;
pub mod push;
pub mod view;

pub use accel::Vendor;
pub use observation::{HostGpus, Observation, Provenance};
pub use push::{
    AllocationKind, Cloud, PushAllocation, PushBody, PushGpu, PushSample, WorkloadContext,
};
pub use view::{
    Allocation, AttributeProvenance, Conflict, CostBasis, GpuDetail, GpuFigures, GpuState, GpuView,
    HourPoint, OwnerPeriod, Rate, RateOrigin, SourceStatus, SourceView, Summary, SummaryGroup,
    TeamInfo, ORIGIN_ALLOCATION, ORIGIN_SAMPLES, UNKNOWN, UNOWNED,
};

/// Seconds in an hour: rollups are per clock hour (UTC).
pub const HOUR_SECS: i64 = 3600;
/// Seconds in a day: day rollups are per UTC day.
pub const DAY_SECS: i64 = 86_400;

/// Start of the clock hour holding `ts` (unix seconds).
pub fn hour_floor(ts: i64) -> i64 {
    ts.div_euclid(HOUR_SECS) * HOUR_SECS
}

/// Start of the UTC day holding `ts` (unix seconds).
pub fn day_floor(ts: i64) -> i64 {
    ts.div_euclid(DAY_SECS) * DAY_SECS
}

/// The UUID given to a placeholder GPU: a source that knows only that `host` has `count` GPUs
/// creates `placeholder:<host>:<index>` for each; a UUID-aware source reporting the same host
/// replaces them (BRIEF section 4).
pub fn placeholder_uuid(host: &str, index: u32) -> String {
    format!("placeholder:{host}:{index}")
}

/// The UUID given to the `k`-th placeholder MIG instance of profile `profile` on `host` (see
/// [`HostGpus::mig_instances`]): `placeholder:<host>:mig-<profile>-<k>`. It is a placeholder
/// ([`is_placeholder`]) but never a pool slot ([`parse_placeholder`] gives `None`).
pub fn mig_placeholder_uuid(host: &str, profile: &str, k: u32) -> String {
    format!("placeholder:{host}:mig-{profile}-{k}")
}

/// True for UUIDs made by [`placeholder_uuid`] and [`mig_placeholder_uuid`].
pub fn is_placeholder(uuid: &str) -> bool {
    uuid.starts_with("placeholder:")
}

/// The host and index of a placeholder UUID; `None` for any other UUID.
pub fn parse_placeholder(uuid: &str) -> Option<(&str, u32)> {
    let rest = uuid.strip_prefix("placeholder:")?;
    let (host, index) = rest.rsplit_once(':')?;
    Some((host, index.parse().ok()?)).filter(|(h, _)| !h.is_empty())
}

/// `*` matches any run of characters, `?` one character; everything else itself. The patterns
/// of ownership rules, contracts, assignments and file names.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_handle_negative_and_exact_boundaries() {
        assert_eq!(hour_floor(3600), 3600);
        assert_eq!(hour_floor(7199), 3600);
        assert_eq!(hour_floor(-1), -3600);
        assert_eq!(day_floor(86_399), 0);
        assert_eq!(day_floor(86_400), 86_400);
    }

    #[test]
    fn placeholder_uuids_are_recognised() {
        let u = placeholder_uuid("node-1", 3);
        assert_eq!(u, "placeholder:node-1:3");
        assert!(is_placeholder(&u));
        assert!(!is_placeholder("GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d5e"));
        assert_eq!(parse_placeholder(&u), Some(("node-1", 3)));
        assert_eq!(parse_placeholder("placeholder::3"), None);
        assert_eq!(parse_placeholder("placeholder:n:x"), None);
        assert_eq!(parse_placeholder("GPU-1"), None);
        let m = mig_placeholder_uuid("node-1", "1g.5gb", 2);
        assert!(is_placeholder(&m));
        assert_eq!(
            parse_placeholder(&m),
            None,
            "a MIG placeholder is no pool slot"
        );
    }
}
