//! The tunables that the definitions of BRIEF section 4 depend on.

use crate::ownership::OwnershipRules;
use crate::rates::RateTable;

/// Thresholds, windows and retention shared by ingest, rollups and queries.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// An hour whose activity is below this is idle (BRIEF section 4, default 5 %).
    pub idle_threshold_pct: f64,
    /// A GPU not observed for this long is missing (default 2 h).
    pub stale_window_secs: i64,
    /// A source whose last success is older than this is stale (default 1 h).
    pub freshness_objective_secs: i64,
    /// Raw samples are kept this long (default 14 days).
    pub raw_retention_days: i64,
    /// Hourly and daily rollups are kept this long (default 2 years).
    pub rollup_retention_days: i64,
    /// Timestamps further than this in the future are refused (clock skew guard).
    pub max_future_skew_secs: i64,
    /// The most GPUs one source may add in 24 hours; `None`: no limit. A record past it is
    /// refused with the reason, the source's other records are kept.
    pub new_gpus_per_day: Option<u64>,
    /// The audit log is kept this long (default 400 days).
    pub audit_retention_days: i64,
    /// SQLite commits with `synchronous = FULL`: a committed write survives a power loss or an
    /// operating-system crash, at the cost of a flush per commit. Off (`NORMAL`, the default),
    /// a commit survives the process being killed, but the last commits before a power loss
    /// may be rolled back (the database stays consistent). PostgreSQL keeps its own setting.
    pub sqlite_full_sync: bool,
    /// The most a SQLite database file may grow to, in MiB (`None`: until the disk is full).
    /// At the cap, as on a full disk, a push is refused with 503 and nothing kept, and reads go
    /// on; a higher cap, or space freed, lets writes resume.
    pub sqlite_max_size_mib: Option<u64>,
    pub rates: RateTable,
    /// Ordered ownership rules and explicit assignments.
    pub ownership: OwnershipRules,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            idle_threshold_pct: 5.0,
            stale_window_secs: 2 * 3600,
            freshness_objective_secs: 3600,
            raw_retention_days: 14,
            rollup_retention_days: 730,
            max_future_skew_secs: 300,
            new_gpus_per_day: Some(10_000),
            audit_retention_days: 400,
            sqlite_full_sync: false,
            sqlite_max_size_mib: None,
            rates: RateTable::default(),
            ownership: OwnershipRules::default(),
        }
    }
}
