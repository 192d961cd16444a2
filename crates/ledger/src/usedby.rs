//! "Used by": each allocated GPU-hour's cost split among the workloads that held the GPU in
//! that hour (BRIEF section 4: overlapping allocations are split evenly), charged to the team
//! each allocation names. Time-sliced pods on one GPU and MIG instances of one GPU share that
//! physical GPU's hour, so the shares of an hour add up to exactly that hour's cost, never
//! more. Hours no allocation covers go to the named bucket [`UNALLOCATED`].

use std::collections::BTreeMap;

use gpuledger_model::{HOUR_SECS, UNKNOWN};
use serde::Serialize;

/// The bucket for present GPU-hours no allocation covers.
pub const UNALLOCATED: &str = "unallocated";

/// An allocation on a physical GPU (or on one of its MIG instances), in unix seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct HourAlloc {
    pub start: i64,
    /// `None` while it runs.
    pub end: Option<i64>,
    pub workload: String,
    /// The team it names; `None` is charged to `unknown`.
    pub team: Option<String>,
}

/// One physical GPU: its rate, its present hours in the window, and the allocations on it and
/// its MIG instances.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuHours {
    pub usd_per_hour: Option<f64>,
    /// Start of each present hour in the window.
    pub hours: Vec<i64>,
    pub allocations: Vec<HourAlloc>,
}

/// A team's use.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsedBy {
    pub team: String,
    /// GPU-hours, fractions where an hour was shared.
    pub gpu_hours: f64,
    /// Cost of those hours; GPUs without a rate add hours, not cost.
    pub cost_usd: f64,
}

/// Split every present hour of `gpus` among the workloads that held each GPU in it.
pub fn used_by(gpus: &[GpuHours]) -> Vec<UsedBy> {
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for g in gpus {
        let rate = g.usd_per_hour.unwrap_or(0.0);
        for &h in &g.hours {
            // One share per workload: two sources reporting the same pod are one holder.
            let mut holders: BTreeMap<&str, &Option<String>> = BTreeMap::new();
            for a in &g.allocations {
                if a.start < h + HOUR_SECS && a.end.is_none_or(|e| e > h) {
                    holders.entry(a.workload.as_str()).or_insert(&a.team);
                }
            }
            if holders.is_empty() {
                let e = out.entry(UNALLOCATED.to_string()).or_default();
                e.0 += 1.0;
                e.1 += rate;
                continue;
            }
            let share = 1.0 / holders.len() as f64;
            for team in holders.values() {
                let team = team
                    .as_deref()
                    .map(|t| t.trim().to_ascii_lowercase())
                    .filter(|t| !t.is_empty())
                    .unwrap_or_else(|| UNKNOWN.to_string());
                let e = out.entry(team).or_default();
                e.0 += share;
                e.1 += rate * share;
            }
        }
    }
    out.into_iter()
        .map(|(team, (gpu_hours, cost_usd))| UsedBy {
            team,
            gpu_hours,
            cost_usd,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(start_h: i64, end_h: Option<i64>, w: &str, team: &str) -> HourAlloc {
        HourAlloc {
            start: start_h * HOUR_SECS,
            end: end_h.map(|e| e * HOUR_SECS),
            workload: w.into(),
            team: Some(team.into()),
        }
    }

    #[test]
    fn shared_hours_split_evenly_and_sum_to_the_gpu_cost() {
        let g = GpuHours {
            usd_per_hour: Some(0.35),
            hours: (8..13).map(|h| h * HOUR_SECS).collect(),
            allocations: vec![
                a(8, Some(10), "nlp/a", "nlp"),
                a(9, None, "vision/b", "vision"),
                a(9, None, "vision/b", "vision"), // the same pod from a second source
            ],
        };
        let rows = used_by(&[g]);
        let get = |t: &str| rows.iter().find(|r| r.team == t).unwrap();
        assert_eq!(get("nlp").gpu_hours, 1.5);
        assert!((get("nlp").cost_usd - 0.525).abs() < 1e-12);
        assert_eq!(get("vision").gpu_hours, 3.5);
        let total: f64 = rows.iter().map(|r| r.cost_usd).sum();
        assert!(
            (total - 5.0 * 0.35).abs() < 1e-12,
            "never more than the GPU's cost"
        );
        assert!(rows.iter().all(|r| r.team != UNALLOCATED));
        let idle = used_by(&[GpuHours {
            usd_per_hour: None,
            hours: vec![0],
            allocations: vec![],
        }]);
        assert_eq!(
            (idle[0].team.as_str(), idle[0].gpu_hours, idle[0].cost_usd),
            (UNALLOCATED, 1.0, 0.0)
        );
    }
}
