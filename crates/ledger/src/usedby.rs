//! "Used by": each present GPU-hour's cost split among the workloads that held the GPU in that
//! hour (BRIEF section 4: overlapping allocations are split evenly), charged to the team each
//! allocation names. Time-sliced pods on one GPU and the pods on its MIG instances share that
//! physical GPU's hour, so the shares of an hour add up to exactly that hour's cost, never
//! more. Hours no allocation covers go to the named bucket [`UNALLOCATED`]. The store computes
//! the split in SQL (`Store::used_by_cost`); these are the names it reports with.

use serde::Serialize;

/// The bucket for present GPU-hours no allocation covers.
pub const UNALLOCATED: &str = "unallocated";

/// A team's use of GPUs in a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsedBy {
    pub team: String,
    /// GPU-hours, fractions where an hour was shared.
    pub gpu_hours: f64,
    /// Cost of those hours; GPUs without a rate add hours, not cost.
    pub cost_usd: f64,
}
