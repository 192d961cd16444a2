//! Rollups: which hours a write touched, and re-rolling them — hour rows from raw samples, the
//! allocated flag of each hour from the allocations, day rows from hour rows.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use gpuledger_model::{day_floor, hour_floor, DAY_SECS, HOUR_SECS};
use sqlx::{Any, Row, Transaction};

use crate::float::F64;
use crate::{Result, Store};

/// Recompute day rollups from hour rollups for the GPUs `IDS` in `[$1, $2)`; `$3` is the idle
/// threshold. A row whose figures come out the same is left as it is (on PostgreSQL an update
/// writes a new row version even when nothing changed).
pub(crate) const REROLL_DAYS: &str =
    "INSERT INTO gpu_days (gpu_id, day, present_hours, known_hours, act_sum, \
     idle_hours, allocated_hours, allocated_idle_hours, mem_max, billed_hours, billed_usd) \
     SELECT gpu_id, (hour / 86400) * 86400, COUNT(*), \
     SUM(CASE WHEN act_n > 0 THEN 1 ELSE 0 END), \
     SUM(CASE WHEN act_n > 0 THEN act_sum / act_n ELSE 0 END), \
     SUM(CASE WHEN act_n > 0 AND act_sum < $3 * act_n THEN 1 ELSE 0 END), \
     SUM(allocated), \
     SUM(CASE WHEN allocated = 1 AND act_n > 0 AND act_sum < $3 * act_n THEN 1 ELSE 0 END), \
     MAX(mem_max), COUNT(billed_usd), CAST(COALESCE(SUM(billed_usd), 0) AS DOUBLE PRECISION) \
     FROM gpu_hours WHERE gpu_id IN (IDS) AND hour >= $1 AND hour < $2 \
     GROUP BY gpu_id, (hour / 86400) * 86400 \
     ON CONFLICT (day, gpu_id) DO UPDATE SET present_hours = excluded.present_hours, \
     known_hours = excluded.known_hours, act_sum = excluded.act_sum, \
     idle_hours = excluded.idle_hours, allocated_hours = excluded.allocated_hours, \
     allocated_idle_hours = excluded.allocated_idle_hours, mem_max = excluded.mem_max, \
     billed_hours = excluded.billed_hours, billed_usd = excluded.billed_usd \
     WHERE gpu_days.present_hours <> excluded.present_hours \
     OR gpu_days.known_hours <> excluded.known_hours OR gpu_days.act_sum <> excluded.act_sum \
     OR gpu_days.idle_hours <> excluded.idle_hours \
     OR gpu_days.allocated_hours <> excluded.allocated_hours \
     OR gpu_days.allocated_idle_hours <> excluded.allocated_idle_hours \
     OR gpu_days.mem_max IS DISTINCT FROM excluded.mem_max \
     OR gpu_days.billed_hours <> excluded.billed_hours \
     OR gpu_days.billed_usd <> excluded.billed_usd";

/// The running totals (`run_*`) of the day rows of GPUs `IDS` from day `$1` on (`$2`: past the
/// last), each continuing from the GPU's last row before `$1`: run after any change to those
/// rows, since every later row's totals include them. Rows whose totals come out the same are
/// not written. The row each GPU continues from is named by the GPUs asked for and `$1` too:
/// on PostgreSQL at 100,000 GPUs, with only the join on the GPU, the planner hashed every day
/// row of the table (1.3 million, 0.95 s a statement) to find 160 GPUs' rows. So are the rows
/// written: joined only with `r`, they were found by scanning the table whole (1.8 s).
pub(crate) const RUNNING_DAYS: &str =
    "UPDATE gpu_days SET run_present = r.p, run_known = r.k, run_act = r.a, run_idle = r.i, \
     run_alloc = r.al, run_alloc_idle = r.ai, run_b_hours = r.bh, run_b_usd = r.bu \
     FROM (SELECT d.gpu_id AS gid, d.day AS dday, \
       COALESCE(b.run_present, 0) + SUM(d.present_hours) OVER w AS p, \
       COALESCE(b.run_known, 0) + SUM(d.known_hours) OVER w AS k, \
       COALESCE(b.run_act, 0) + SUM(d.act_sum) OVER w AS a, \
       COALESCE(b.run_idle, 0) + SUM(d.idle_hours) OVER w AS i, \
       COALESCE(b.run_alloc, 0) + SUM(d.allocated_hours) OVER w AS al, \
       COALESCE(b.run_alloc_idle, 0) + SUM(d.allocated_idle_hours) OVER w AS ai, \
       COALESCE(b.run_b_hours, 0) + SUM(d.billed_hours) OVER w AS bh, \
       COALESCE(b.run_b_usd, 0) + SUM(d.billed_usd) OVER w AS bu \
       FROM gpu_days d LEFT JOIN gpu_days b ON b.gpu_id = d.gpu_id AND b.gpu_id IN (IDS) \
       AND b.day < $1 AND b.day = (\
         SELECT MAX(q.day) FROM gpu_days q WHERE q.gpu_id = d.gpu_id AND q.day < $1) \
       WHERE d.gpu_id IN (IDS) AND d.day >= $1 AND d.day < $2 \
       WINDOW w AS (PARTITION BY d.gpu_id ORDER BY d.day ROWS UNBOUNDED PRECEDING)) r \
     WHERE gpu_days.gpu_id = r.gid AND gpu_days.day = r.dday AND gpu_days.gpu_id IN (IDS) \
     AND gpu_days.day >= $1 AND gpu_days.day < $2 AND (gpu_days.run_present <> r.p \
     OR gpu_days.run_known <> r.k OR gpu_days.run_act <> r.a OR gpu_days.run_idle <> r.i \
     OR gpu_days.run_alloc <> r.al OR gpu_days.run_alloc_idle <> r.ai \
     OR gpu_days.run_b_hours <> r.bh OR gpu_days.run_b_usd <> r.bu)";

/// The workloads holding each present hour of the physical GPUs `IDS` in `[$1, $2)` (`x`, with
/// kind and team, `''` when none, and `n`, how many hold that hour): [`crate::query::held`]
/// for a few GPUs, driven from their allocations and their MIG instances'. `$hours` narrows
/// the hours (`h`) read; a condition on the hour keeps or drops all its holders, so `n` stays
/// their count. `n` is a window over the groups, not a join of `x` with its own counts: on
/// PostgreSQL, tables not yet analyzed during a bulk load made the planner expect one row of
/// `x` and join the two by nested loop, a few seconds a statement at 2,000 GPUs; and `a` is
/// materialized, since there the planner, expecting a row or two of hours, joined every
/// allocation of the range with every hour of it before keeping the GPUs asked for. The
/// hours are named by the GPUs asked for as well: joined only with `a`, whose GPUs the planner
/// cannot know, they were read by scanning every partition of the range whole (5 s a
/// statement at 100,000 GPUs × 30 days).
macro_rules! holders_of_ids {
    ($hours:literal) => {
        concat!(
            "WITH a AS MATERIALIZED (\
           SELECT COALESCE(p.id, c.id) AS gpu_id, al.start_ts, al.end_ts, al.workload, al.kind, \
           COALESCE(al.team, '') AS team \
           FROM allocations al JOIN gpus c ON c.id = al.gpu_id \
           LEFT JOIN gpus p ON p.uuid = c.mig_parent_uuid \
           WHERE al.gpu_id IN (SELECT g.id FROM gpus g WHERE g.id IN (IDS) UNION ALL \
           SELECT m.id FROM gpus m JOIN gpus q ON m.mig_parent_uuid = q.uuid WHERE q.id IN (IDS)) \
           AND al.start_ts < $2 AND (al.end_ts IS NULL OR al.end_ts > $1)), \
         x AS (\
           SELECT h.gpu_id, h.hour, a.workload, MIN(a.kind) AS kind, MAX(a.team) AS team, \
           COUNT(*) OVER (PARTITION BY h.gpu_id, h.hour) AS n \
           FROM a JOIN gpu_hours h ON h.gpu_id = a.gpu_id AND h.gpu_id IN (IDS) \
           AND +h.hour > a.start_ts - 3600 \
           AND +h.hour < COALESCE(a.end_ts, $2) AND h.hour >= $1 AND h.hour < $2",
            $hours,
            " GROUP BY h.gpu_id, h.hour, a.workload)"
        )
    };
}

/// Used-by per day (`gpu_day_use`) of the physical GPUs `IDS` for the days in `[$1, $2)`, from
/// the allocations and present hours (the same split as [`crate::query::held`]): run after
/// deleting those rows.
pub(crate) const REROLL_DAY_USE: &str = concat!(
    holders_of_ids!(""),
    " INSERT INTO gpu_day_use (gpu_id, day, team, held_hours) \
     SELECT x.gpu_id, (x.hour / 86400) * 86400, x.team, CAST(SUM(1.0 / x.n) AS DOUBLE PRECISION) \
     FROM x GROUP BY x.gpu_id, (x.hour / 86400) * 86400, x.team"
);

/// Allocated-but-idle hours per workload and day (`gpu_day_idle`) of the physical GPUs `IDS`
/// for the days in `[$1, $2)`, `$3` the idle threshold, each with the owner period the hour
/// fell in: run after deleting those rows.
pub(crate) const REROLL_DAY_IDLE: &str = concat!(
    holders_of_ids!(" AND h.allocated = 1 AND h.act_n > 0 AND h.act_sum < $3 * h.act_n"),
    " INSERT INTO gpu_day_idle (gpu_id, day, owner_from, workload, team, kind, hours) \
     SELECT x.gpu_id, (x.hour / 86400) * 86400, o.from_ts, x.workload, x.team, MIN(x.kind), \
     CAST(SUM(1.0 / x.n) AS DOUBLE PRECISION) \
     FROM x JOIN gpu_owners o ON o.gpu_id = x.gpu_id AND o.from_ts <= x.hour AND o.to_ts > x.hour \
     GROUP BY x.gpu_id, (x.hour / 86400) * 86400, o.from_ts, x.workload, x.team"
);

/// The allocated flag of the hours of GPUs `IDS` in `[$1, $2)`: an hour is allocated when an
/// allocation of the GPU or of one of its MIG instances overlaps it (definitions: "allocated
/// hour"). Only present hours have rows, so only present hours count.
pub(crate) const ALLOCATED: &str = "CASE WHEN EXISTS (SELECT 1 FROM allocations a \
     WHERE a.gpu_id = gpu_hours.gpu_id AND a.start_ts < gpu_hours.hour + 3600 \
     AND (a.end_ts IS NULL OR a.end_ts > gpu_hours.hour)) \
     OR EXISTS (SELECT 1 FROM gpus p JOIN gpus c ON c.mig_parent_uuid = p.uuid \
     JOIN allocations a ON a.gpu_id = c.id WHERE p.id = gpu_hours.gpu_id \
     AND a.start_ts < gpu_hours.hour + 3600 AND (a.end_ts IS NULL OR a.end_ts > gpu_hours.hour)) \
     THEN 1 ELSE 0 END";

/// The allocations of the GPUs `$ids` (SQL giving GPU ids) overlapping the hours `[$lo, $hi)`,
/// as the CTE `a (gid, start_ts, end_ts)`: the GPU's own, and its MIG instances' under the GPU.
/// Materialized: on PostgreSQL, tables not yet analyzed during a bulk load made the planner
/// join every allocation of the range with every hour of it.
macro_rules! allocations_over {
    ($ids:literal, $lo:literal, $hi:literal) => {
        concat!(
            "a AS MATERIALIZED (\
               SELECT al.gpu_id AS gid, al.start_ts, al.end_ts FROM allocations al \
               WHERE al.gpu_id IN (",
            $ids,
            ") AND al.start_ts < ",
            $hi,
            " AND (al.end_ts IS NULL OR al.end_ts > ",
            $lo,
            ") UNION ALL \
               SELECT q.id, al.start_ts, al.end_ts FROM gpus q JOIN gpus m ON m.mig_parent_uuid = q.uuid \
               JOIN allocations al ON al.gpu_id = m.id WHERE q.id IN (",
            $ids,
            ") AND al.start_ts < ",
            $hi,
            " AND (al.end_ts IS NULL OR al.end_ts > ",
            $lo,
            "))"
        )
    };
}

/// The hour rows of the CTE `$r` (`gpu_id`, `hour`) that [`ALLOCATED`] flags, as the CTE
/// `f (gpu_id, hour)`, from the allocations `a` of [`allocations_over!`], which must cover
/// their hours. A join on the GPU: asked per row (`EXISTS` in the select list), each row read
/// every allocation of `a`, twice the time of the statement it went into ([`ROLL_HOURS`]).
macro_rules! allocated_rows {
    ($r:literal) => {
        concat!(
            "f AS (SELECT DISTINCT x.gpu_id, x.hour FROM ",
            $r,
            " x JOIN a ON a.gid = x.gpu_id AND a.start_ts < x.hour + 3600 \
             AND (a.end_ts IS NULL OR a.end_ts > x.hour))"
        )
    };
}

/// The hours of GPUs `IDS` in `[$1, $2)` that [`ALLOCATED`] flags, as `s (gid, hr)`, driven
/// from the allocations overlapping the range (`a`, [`allocations_over!`]): each reads its own
/// hours by key. [`ALLOCATED`] asks every hour for its allocations, and reads all earlier
/// allocations of the GPU to answer, so a GPU's re-roll grew with its history. Both are
/// materialized (see [`allocations_over!`]). The hours read are those of `IDS` by their key
/// too: on a PostgreSQL partition without statistics yet (a bulk load, a new week), the
/// planner read every GPU's hours of the range by the index by hour and sorted them to join
/// them with the allocations, 2.2 s a statement at 100,000 GPUs where the GPUs' own took 40 ms.
macro_rules! allocated_hours {
    () => {
        concat!(
            "WITH ",
            allocations_over!("IDS", "$1", "$2"),
            ", s AS MATERIALIZED (SELECT h.gpu_id AS gid, h.hour AS hr \
             FROM a CROSS JOIN gpu_hours h WHERE h.gpu_id = a.gid AND h.gpu_id IN (IDS) \
             AND h.hour >= $1 AND h.hour < $2 \
             AND h.hour > a.start_ts - 3600 AND (a.end_ts IS NULL OR h.hour < a.end_ts))"
        )
    };
}

/// The allocated flag ([`ALLOCATED`]) of the hours of GPUs `IDS` in `[$1, $2)`, set where it
/// is newly due and cleared where it no longer is, in one pass over the hours; rows that keep
/// their flag are not written. The flagged hours are materialized once and looked up by key
/// (SQLite ran `(gpu_id, hour) NOT IN (...)` as a scan of the list per row); setting and
/// clearing in two statements built that list twice. At 30 days of history this is half the
/// time of [`ALLOCATED`] per GPU and day on SQLite, and less than it on PostgreSQL too once
/// the allocations and hours are materialized (`allocated_hours!`).
pub(crate) const FLAG_ALLOCATED: &str = concat!(
    allocated_hours!(),
    " UPDATE gpu_hours SET allocated = 1 - allocated \
     WHERE gpu_id IN (IDS) AND hour >= $1 AND hour < $2 AND allocated <> CASE WHEN EXISTS \
     (SELECT 1 FROM s WHERE s.gid = gpu_hours.gpu_id AND s.hr = gpu_hours.hour) THEN 1 ELSE 0 END"
);

/// `gpu_hours.evidence` bit: the hour's activity is its allocations' scheduler average.
pub(crate) const EVIDENCE_ACTIVITY: i64 = 1;
/// `gpu_hours.evidence` bit: the hour's memory is its allocations' scheduler average.
pub(crate) const EVIDENCE_MEMORY: i64 = 2;

/// An allocation of `gpu_hours`' GPU overlapping its hour (the test [`ALLOCATED`] uses) that
/// carries the average `COL`.
macro_rules! averaged_allocations {
    ($col:literal) => {
        concat!(
            "FROM allocations a WHERE a.gpu_id = gpu_hours.gpu_id AND a.",
            $col,
            " IS NOT NULL AND a.start_ts < gpu_hours.hour + 3600 \
             AND (a.end_ts IS NULL OR a.end_ts > gpu_hours.hour)"
        )
    };
}

/// The scheduler averages of allocations fill the hours of GPUs `IDS` in `[$1, $2)` that no
/// sample measured (definitions: "activity of an hour"): first every figure an earlier roll
/// filled is taken back, since the allocations may have moved or changed; then the hours
/// without measured activity take the mean of their allocations' `avg_util_pct`, and those
/// without measured memory the largest `avg_mem_mib`. Run after the samples' roll and the
/// allocated flags, before the day rollups.
pub(crate) const FILL_FROM_ALLOCATIONS: [&str; 3] = [
    "UPDATE gpu_hours SET \
     act_n = CASE WHEN (evidence & 1) <> 0 THEN 0 ELSE act_n END, \
     act_sum = CASE WHEN (evidence & 1) <> 0 THEN 0 ELSE act_sum END, \
     mem_max = CASE WHEN (evidence & 2) <> 0 THEN NULL ELSE mem_max END, evidence = 0 \
     WHERE gpu_id IN (IDS) AND hour >= $1 AND hour < $2 AND evidence <> 0",
    concat!(
        "UPDATE gpu_hours SET act_n = 1, evidence = evidence + 1, act_sum = \
         (SELECT AVG(a.avg_util_pct) ",
        averaged_allocations!("avg_util_pct"),
        ") WHERE gpu_id IN (IDS) AND hour >= $1 AND hour < $2 AND act_n = 0 \
         AND EXISTS (SELECT 1 ",
        averaged_allocations!("avg_util_pct"),
        ")"
    ),
    concat!(
        "UPDATE gpu_hours SET evidence = evidence + 2, mem_max = \
         (SELECT MAX(a.avg_mem_mib) ",
        averaged_allocations!("avg_mem_mib"),
        ") WHERE gpu_id IN (IDS) AND hour >= $1 AND hour < $2 AND mem_max IS NULL \
         AND EXISTS (SELECT 1 ",
        averaged_allocations!("avg_mem_mib"),
        ")"
    ),
];

/// The per-day tables split from the allocations: used-by (`gpu_day_use`, [`REROLL_DAY_USE`])
/// and allocated-but-idle hours (`gpu_day_idle`, [`REROLL_DAY_IDLE`]).
#[derive(Clone, Copy)]
enum DayTable {
    Use,
    Idle,
}

/// (GPU, hour) presence rows per INSERT statement.
pub(crate) const PRESENCE_CHUNK: usize = 200;

/// What a write's newly stored samples add to one hour row of their GPU: the figures the
/// activity roll computes from the hour's samples (`samples`, `act_n`, `act_sum`, `mem_max`,
/// `power_sum`, `power_n`), over these samples alone.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct HourSum {
    pub(crate) samples: i64,
    pub(crate) act_n: i64,
    pub(crate) act_sum: f64,
    pub(crate) mem_max: Option<f64>,
    pub(crate) power_sum: f64,
    pub(crate) power_n: i64,
}

impl HourSum {
    /// Count one sample, as the activity roll's SQL does.
    pub(crate) fn add(&mut self, s: &gpuledger_model::PushSample) {
        self.samples += 1;
        if let Some(act) = s.activity_pct() {
            self.act_n += 1;
            self.act_sum += act;
        }
        if let Some(m) = s.mem_used_mib {
            self.mem_max = Some(self.mem_max.map_or(m, |x| x.max(m)));
        }
        if let Some(p) = s.power_w {
            self.power_sum += p;
            self.power_n += 1;
        }
    }
}

/// Columns of one [`HourSum`] row of [`ADD_HOURS`].
const ADD_HOURS_COLS: usize = 8;

/// [`HourSum`]s added onto their hour rows (`VALUES` replaces `ROWS`): a new row takes them as
/// they are; a stored one adds them to its figures, except those an earlier roll filled from
/// the allocations (`evidence`), which held no measured figure, so the new samples' replace
/// them. `evidence` goes back to 0, as after the activity roll. Returns each row's GPU, hour,
/// samples and allocated flag as written, 1 where it still lacks a measured activity or
/// memory, which the schedulers' fills may give it, and its figures ([`HourFigures`]).
const ADD_HOURS: &str = "INSERT INTO gpu_hours (gpu_id, hour, samples, act_n, act_sum, mem_max, \
     power_sum, power_n) VALUES ROWS ON CONFLICT (gpu_id, hour) DO UPDATE SET \
     samples = gpu_hours.samples + excluded.samples, \
     act_n = excluded.act_n + CASE WHEN (gpu_hours.evidence & 1) <> 0 THEN 0 \
       ELSE gpu_hours.act_n END, \
     act_sum = excluded.act_sum + CASE WHEN (gpu_hours.evidence & 1) <> 0 THEN 0 \
       ELSE gpu_hours.act_sum END, \
     mem_max = CASE WHEN (gpu_hours.evidence & 2) <> 0 OR gpu_hours.mem_max IS NULL \
       OR excluded.mem_max > gpu_hours.mem_max THEN excluded.mem_max \
       ELSE gpu_hours.mem_max END, \
     power_sum = gpu_hours.power_sum + excluded.power_sum, \
     power_n = gpu_hours.power_n + excluded.power_n, evidence = 0 \
     RETURNING gpu_id, hour, samples, allocated, \
     CASE WHEN act_n = 0 OR mem_max IS NULL THEN 1 ELSE 0 END, act_n, act_sum, mem_max";

/// The hours of GPUs `IDS` in `[$1, $2)` rolled again from all their samples. A new row is
/// written with its allocated flag ([`ALLOCATED`]), so [`FLAG_ALLOCATED`] finds it right and
/// does not write it again; a stored one keeps its own, which [`FLAG_ALLOCATED`] sets where
/// the allocations changed. Each write of a row is a new row version on PostgreSQL, with an
/// entry in every index of the hour rollups until vacuum: a history loaded a day a push wrote
/// most of its allocated hours twice. (A new row [`ADD_HOURS`] stores still takes its flag
/// from [`FLAG_ALLOCATED`]: reading the allocations there cost more than the second write.
/// `WHERE true`: SQLite reads an `ON` after a `SELECT`'s `FROM` as a join's without it.)
const ROLL_HOURS: &str = concat!(
    "WITH ",
    allocations_over!("IDS", "$1", "$2"),
    ", r AS MATERIALIZED (SELECT gpu_id, (ts / 3600) * 3600 AS hour, COUNT(*) AS samples, \
     SUM(CASE WHEN sm_active IS NOT NULL OR util_pct IS NOT NULL THEN 1 ELSE 0 END) AS act_n, \
     COALESCE(SUM(COALESCE(sm_active * 100.0, util_pct)), 0) AS act_sum, \
     MAX(mem_used_mib) AS mem_max, COALESCE(SUM(power_w), 0) AS power_sum, \
     COUNT(power_w) AS power_n \
     FROM samples WHERE gpu_id IN (IDS) AND ts >= $1 AND ts < $2 \
     GROUP BY gpu_id, (ts / 3600) * 3600), ",
    allocated_rows!("r"),
    " INSERT INTO gpu_hours (gpu_id, hour, samples, act_n, act_sum, mem_max, power_sum, power_n, \
     allocated) SELECT r.gpu_id, r.hour, r.samples, r.act_n, r.act_sum, r.mem_max, r.power_sum, \
     r.power_n, CASE WHEN f.gpu_id IS NULL THEN 0 ELSE 1 END \
     FROM r LEFT JOIN f ON f.gpu_id = r.gpu_id AND f.hour = r.hour WHERE true \
     ON CONFLICT (gpu_id, hour) DO UPDATE SET samples = excluded.samples, \
     act_n = excluded.act_n, act_sum = excluded.act_sum, mem_max = excluded.mem_max, \
     power_sum = excluded.power_sum, power_n = excluded.power_n, evidence = 0"
);

/// Hours touched for one GPU during an ingest, to re-roll afterwards.
#[derive(Default)]
pub(crate) struct Touched {
    pub(crate) presence: BTreeSet<i64>,
    /// The hours of the samples this write stored (or found stored): the roll of
    /// [`Touched::activity`] writes their rows, so presence need not insert them first.
    pub(crate) sampled: BTreeSet<i64>,
    /// Hours to roll again from all their samples: where this write's samples are not added
    /// on ([`Touched::added`]), being older than the last day or in a batch some of whose
    /// samples were stored before.
    pub(crate) activity: Option<(i64, i64)>,
    /// What this write's new samples of the last day add to each hour's row ([`HourSum`]), by
    /// hour (`ingest::ADD_WITHIN_SECS`): adding them on costs the same however many samples
    /// the hour already holds, where rolling the hour again reads them all (at one sample a
    /// minute, each push of the current hour read the half hour before it, on average, again).
    pub(crate) added: BTreeMap<i64, HourSum>,
    pub(crate) flags: Option<(i64, i64)>,
    /// Allocations moved onto this GPU: its holders may have changed.
    pub(crate) holders: bool,
}

pub(crate) fn widen(r: &mut Option<(i64, i64)>, lo: i64, hi: i64) {
    *r = Some(match *r {
        None => (lo, hi),
        Some((a, b)) => (a.min(lo), b.max(hi)),
    });
}

pub(crate) fn values(rows: usize, cols: usize) -> String {
    let mut s = String::with_capacity(rows * cols * 5);
    for r in 0..rows {
        if r > 0 {
            s.push(',');
        }
        s.push('(');
        for c in 0..cols {
            if c > 0 {
                s.push(',');
            }
            s.push('$');
            s.push_str(&(r * cols + c + 1).to_string());
        }
        s.push(')');
    }
    s
}

pub(crate) fn mark_presence(t: &mut Touched, ts: i64, stale: i64) {
    let mut h = hour_floor(ts);
    let last = hour_floor(ts + stale.max(1) - 1);
    while h <= last {
        t.presence.insert(h);
        h += HOUR_SECS;
    }
}

/// An hour row's figures the day rows count ([`REROLL_DAYS`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct HourFigures {
    pub(crate) act_n: i64,
    pub(crate) act_sum: f64,
    pub(crate) mem_max: Option<f64>,
}

impl HourFigures {
    /// Whether the hour's activity is known, as [`REROLL_DAYS`] counts `known_hours`.
    fn known(&self) -> bool {
        self.act_n > 0
    }

    /// The hour's average activity as [`REROLL_DAYS`] sums it (0 where unknown).
    fn average(&self) -> f64 {
        if self.act_n > 0 {
            self.act_sum / self.act_n as f64
        } else {
            0.0
        }
    }

    /// Whether the hour is idle, as [`REROLL_DAYS`] counts `idle_hours`.
    fn idle(&self, threshold: f64) -> bool {
        self.act_n > 0 && self.act_sum < threshold * self.act_n as f64
    }
}

/// What samples added onto a GPU's stored hours of one day change in its day row: the figures
/// [`REROLL_DAYS`] counts (known hours, the sum of the hours' averages, idle and allocated idle
/// hours), each as the difference the hours' change makes, and the largest memory of the hours
/// added to. The day's running totals, and those of every later day of the GPU, move by as
/// much ([`ADD_DAYS`]). Present and allocated hours do not change: the hours were stored, and
/// adding samples moves no allocation.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct DayDelta {
    pub(crate) day: i64,
    pub(crate) known: i64,
    pub(crate) act: f64,
    pub(crate) idle: i64,
    pub(crate) alloc_idle: i64,
    pub(crate) mem_max: Option<f64>,
}

impl DayDelta {
    /// Count one hour's change from `was` to `now`. Returns whether the hour is allocated and
    /// turned idle or busy, which moves its allocated-idle hours per workload.
    pub(crate) fn add(
        &mut self,
        was: &HourFigures,
        now: &HourFigures,
        allocated: bool,
        threshold: f64,
    ) -> bool {
        self.known += i64::from(now.known()) - i64::from(was.known());
        self.act += now.average() - was.average();
        let moved = i64::from(now.idle(threshold)) - i64::from(was.idle(threshold));
        self.idle += moved;
        if allocated {
            self.alloc_idle += moved;
        }
        if let Some(m) = now.mem_max {
            self.mem_max = Some(self.mem_max.map_or(m, |x| x.max(m)));
        }
        allocated && moved != 0
    }
}

/// Columns of one [`DayDelta`] row of [`ADD_DAYS`].
const ADD_DAYS_COLS: usize = 7;

/// [`DayDelta`]s added onto their day rows and onto the running totals of those and every
/// later day row of the GPU (`VALUES` replaces `ROWS`): what [`REROLL_DAYS`] and
/// [`RUNNING_DAYS`] would write, without reading the day's hours again. Returns the rows
/// written, so a GPU whose day row is missing is rolled instead.
const ADD_DAYS: &str = "WITH v (gid, vday, dk, dact, didle, dai, mem) AS (VALUES ROWS) \
     UPDATE gpu_days SET \
     known_hours = known_hours + CASE WHEN day = v.vday THEN v.dk ELSE 0 END, \
     act_sum = act_sum + CASE WHEN day = v.vday THEN v.dact ELSE 0 END, \
     idle_hours = idle_hours + CASE WHEN day = v.vday THEN v.didle ELSE 0 END, \
     allocated_idle_hours = allocated_idle_hours + CASE WHEN day = v.vday THEN v.dai ELSE 0 END, \
     mem_max = CASE WHEN day = v.vday AND v.mem > COALESCE(mem_max, v.mem - 1) THEN v.mem \
       ELSE mem_max END, \
     run_known = run_known + v.dk, run_act = run_act + v.dact, run_idle = run_idle + v.didle, \
     run_alloc_idle = run_alloc_idle + v.dai \
     FROM v WHERE gpu_days.gpu_id = v.gid AND gpu_days.day >= v.vday \
     RETURNING gpu_days.gpu_id, gpu_days.day";

impl Store {
    /// Re-roll the touched hours and days of every touched GPU. GPUs with the same touched
    /// range share one statement (`gpu_id IN (...)`), so a body of a thousand GPUs' current
    /// samples costs a handful of statements, not thousands.
    pub(crate) async fn reroll(
        &self,
        tx: &mut Transaction<'_, Any>,
        touched: &BTreeMap<i64, Touched>,
    ) -> Result<()> {
        // What the write changed, per GPU, beyond the figures of hours it already had: a new
        // hour row (presence), allocations (`flags`, `holders`), hours rolled again from all
        // their samples (`activity`). Such GPUs have every step below. The others only added
        // samples onto stored hours: their present hours, allocated flags and holders are as
        // they were, so used-by and the flags stay; allocated-but-idle hours change only where
        // an allocated hour they added to turned idle or busy, the schedulers' fills only where
        // an hour they added to still lacks a measured figure, and their day rows and running
        // totals by what the added samples changed in those hours (`DayDelta`).
        let mut grew: BTreeSet<i64> = touched
            .iter()
            .filter(|(_, t)| t.flags.is_some() || t.holders || t.activity.is_some())
            .map(|(id, _)| *id)
            .collect();
        let mut unfilled: BTreeSet<i64> = BTreeSet::new();
        // What the added samples change in each GPU's day row (`DayDelta`), where that can be
        // added on: every hour they went onto was stored, held no schedulers' fill, and lies in
        // one day. The GPUs in `whole` have their days rolled again instead.
        let mut deltas: BTreeMap<i64, DayDelta> = BTreeMap::new();
        let mut whole: BTreeSet<i64> = BTreeSet::new();
        // GPUs an allocated hour of which turned idle or busy: their allocated-idle hours move.
        let mut idle_moved: BTreeSet<i64> = BTreeSet::new();
        let threshold = self.settings.idle_threshold_pct;
        // New samples onto their hour rows, before any hour is rolled again from all its
        // samples (which counts them too). A row whose samples are now just these is new
        // (or held none before): its GPU grew.
        let added: Vec<(i64, i64, &HourSum)> = touched
            .iter()
            .flat_map(|(id, t)| t.added.iter().map(move |(h, sum)| (*id, *h, sum)))
            .collect();
        for chunk in added.chunks(PRESENCE_CHUNK) {
            let before = self.hours_before(tx, chunk).await?;
            let rows = format!("VALUES {}", values(chunk.len(), ADD_HOURS_COLS));
            let sql = ADD_HOURS.replace("VALUES ROWS", &rows);
            let sql = self.sql(&sql);
            let mut q = sqlx::query(&sql).persistent(chunk.len() == PRESENCE_CHUNK);
            for (id, h, sum) in chunk {
                q = q
                    .bind(*id)
                    .bind(*h)
                    .bind(sum.samples)
                    .bind(sum.act_n)
                    .bind(sum.act_sum)
                    .bind(F64(sum.mem_max))
                    .bind(sum.power_sum)
                    .bind(sum.power_n);
            }
            let sums: BTreeMap<(i64, i64), i64> = chunk
                .iter()
                .map(|(id, h, s)| ((*id, *h), s.samples))
                .collect();
            for row in q.fetch_all(&mut **tx).await? {
                let (id, hour): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
                let (samples, alloc, unmeasured): (i64, i64, i64) =
                    (row.try_get(2)?, row.try_get(3)?, row.try_get(4)?);
                let now = HourFigures {
                    act_n: row.try_get(5)?,
                    act_sum: row.try_get(6)?,
                    mem_max: row.try_get(7)?,
                };
                if sums.get(&(id, hour)) == Some(&samples) {
                    grew.insert(id);
                }
                if unmeasured != 0 {
                    unfilled.insert(id);
                }
                match before.get(&(id, hour)) {
                    Some((was, 0)) => {
                        let d = deltas.entry(id).or_insert_with(|| DayDelta {
                            day: day_floor(hour),
                            ..Default::default()
                        });
                        if d.day != day_floor(hour) {
                            whole.insert(id);
                        }
                        let moved = d.add(was, &now, alloc != 0, threshold);
                        if moved {
                            idle_moved.insert(id);
                        }
                    }
                    // A new row (its GPU grew), or one a schedulers' fill held: its figures
                    // before are not the samples', so its day is rolled again, and its
                    // allocated-idle hours where allocated.
                    _ => {
                        whole.insert(id);
                        if alloc != 0 {
                            idle_moved.insert(id);
                        }
                    }
                }
            }
        }
        // Presence: one row per (GPU, hour), new rows only. The hours holding a sample get
        // theirs above or from the activity roll below.
        let pairs: Vec<(i64, i64)> = touched
            .iter()
            .flat_map(|(id, t)| t.presence.difference(&t.sampled).map(move |h| (*id, *h)))
            .collect();
        for chunk in pairs.chunks(PRESENCE_CHUNK) {
            let sql = format!(
                "INSERT INTO gpu_hours (gpu_id, hour) VALUES {} ON CONFLICT (gpu_id, hour) \
                 DO NOTHING RETURNING gpu_id",
                values(chunk.len(), 2)
            );
            let sql = self.sql(&sql);
            let mut q = sqlx::query_scalar(&sql).persistent(chunk.len() == PRESENCE_CHUNK);
            for (id, h) in chunk {
                q = q.bind(*id).bind(*h);
            }
            let new: Vec<i64> = q.fetch_all(&mut **tx).await?;
            grew.extend(new);
        }
        let mut activity: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
        let mut flags: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
        let mut fills: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
        let mut days: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
        let mut day_use: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
        let mut day_idle: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
        let mut day_deltas: Vec<(i64, &DayDelta)> = Vec::new();
        for (id, t) in touched {
            if let Some(r) = t.activity {
                activity.entry(r).or_default().push(*id);
            }
            // Every hour whose row may be new or whose allocations changed gets its flag again.
            let mut range = t.flags;
            if let (Some(&lo), Some(&hi)) = (t.presence.first(), t.presence.last()) {
                widen(&mut range, lo, hi + HOUR_SECS);
            }
            if let Some((lo, hi)) = t.activity {
                widen(&mut range, lo, hi);
            }
            let Some((lo, hi)) = range else { continue };
            let day_range = (day_floor(lo), day_floor(hi - 1) + DAY_SECS);
            let full = grew.contains(id);
            if full {
                flags.entry((lo, hi)).or_default().push(*id);
                day_use.entry(day_range).or_default().push(*id);
            }
            let fill = full || unfilled.contains(id);
            if fill {
                fills.entry((lo, hi)).or_default().push(*id);
            }
            if full || idle_moved.contains(id) {
                day_idle.entry(day_range).or_default().push(*id);
            }
            match deltas.get(id) {
                Some(d) if !fill && !whole.contains(id) => day_deltas.push((*id, d)),
                _ => days.entry(day_range).or_default().push(*id),
            }
        }
        for ((lo, hi), ids) in &activity {
            self.for_ids(tx, ids, *lo, *hi, None, ROLL_HOURS).await?;
        }
        for ((lo, hi), ids) in &flags {
            self.for_ids(tx, ids, *lo, *hi, None, FLAG_ALLOCATED)
                .await?;
        }
        for ((lo, hi), ids) in &fills {
            for sql in FILL_FROM_ALLOCATIONS {
                self.for_ids(tx, ids, *lo, *hi, None, sql).await?;
            }
        }
        for ((lo, hi), ids) in &days {
            self.reroll_days(tx, ids, *lo, *hi).await?;
        }
        self.add_day_deltas(tx, &day_deltas).await?;
        for ((lo, hi), ids) in &day_use {
            self.reroll_day_table(tx, ids, *lo, *hi, DayTable::Use)
                .await?;
        }
        for ((lo, hi), ids) in &day_idle {
            self.reroll_day_table(tx, ids, *lo, *hi, DayTable::Idle)
                .await?;
        }
        Ok(())
    }

    /// The figures and `evidence` of the stored hour rows among `chunk`'s (GPU, hour) keys,
    /// before samples are added onto them.
    async fn hours_before(
        &self,
        tx: &mut Transaction<'_, Any>,
        chunk: &[(i64, i64, &HourSum)],
    ) -> Result<HashMap<(i64, i64), (HourFigures, i64)>> {
        let keys: HashSet<(i64, i64)> = chunk.iter().map(|(id, h, _)| (*id, *h)).collect();
        let ids: BTreeSet<i64> = keys.iter().map(|k| k.0).collect();
        let hours: BTreeSet<i64> = keys.iter().map(|k| k.1).collect();
        // Both lists, hours first: SQLite reads each row by its key (hour, GPU), where a range
        // of hours led it to the index by GPU and from there to the row.
        let marks = |from: usize, n: usize| {
            (from..from + n)
                .map(|i| format!("${i}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let text = format!(
            "SELECT gpu_id, hour, act_n, act_sum, mem_max, evidence FROM gpu_hours \
             WHERE hour IN ({}) AND gpu_id IN ({})",
            marks(1, hours.len()),
            marks(1 + hours.len(), ids.len())
        );
        let sql = self.sql(&text);
        let mut q = sqlx::query(&sql).persistent(chunk.len() == PRESENCE_CHUNK && hours.len() == 1);
        for h in &hours {
            q = q.bind(*h);
        }
        for id in &ids {
            q = q.bind(*id);
        }
        let mut out = HashMap::new();
        for row in q.fetch_all(&mut **tx).await? {
            let key: (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
            if keys.contains(&key) {
                let was = HourFigures {
                    act_n: row.try_get(2)?,
                    act_sum: row.try_get(3)?,
                    mem_max: row.try_get(4)?,
                };
                out.insert(key, (was, row.try_get(5)?));
            }
        }
        Ok(out)
    }

    /// Add [`DayDelta`]s onto their day rows and running totals ([`ADD_DAYS`]) and list their
    /// days as changed for the group rollups; a GPU whose day row is missing has its days
    /// rolled from its hours instead.
    async fn add_day_deltas(
        &self,
        tx: &mut Transaction<'_, Any>,
        deltas: &[(i64, &DayDelta)],
    ) -> Result<()> {
        let mut missing: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
        for chunk in deltas.chunks(PRESENCE_CHUNK) {
            let rows = format!("VALUES {}", values(chunk.len(), ADD_DAYS_COLS));
            let text = ADD_DAYS.replace("VALUES ROWS", &rows);
            let sql = self.sql(&text);
            let mut q = sqlx::query(&sql).persistent(chunk.len() == PRESENCE_CHUNK);
            for (id, d) in chunk {
                q = q
                    .bind(*id)
                    .bind(d.day)
                    .bind(d.known)
                    .bind(d.act)
                    .bind(d.idle)
                    .bind(d.alloc_idle)
                    .bind(F64(d.mem_max));
            }
            let mut written: HashSet<(i64, i64)> = HashSet::new();
            for row in q.fetch_all(&mut **tx).await? {
                written.insert((row.try_get(0)?, row.try_get(1)?));
            }
            for (id, d) in chunk {
                if !written.contains(&(*id, d.day)) {
                    missing.entry(d.day).or_default().push(*id);
                }
            }
        }
        for (day, ids) in &missing {
            self.reroll_days(tx, ids, *day, day + DAY_SECS).await?;
        }
        let days: BTreeSet<i64> = deltas.iter().map(|(_, d)| d.day).collect();
        let days: Vec<i64> = days.into_iter().collect();
        for chunk in days.chunks(PRESENCE_CHUNK) {
            let text = format!(
                "INSERT INTO group_dirty (day) VALUES {} ON CONFLICT (day) DO NOTHING",
                values(chunk.len(), 1)
            );
            let sql = self.sql(&text);
            let mut q = sqlx::query(&sql);
            for day in chunk {
                q = q.bind(*day);
            }
            q.execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// The day rows of GPUs `ids` for the days in `[lo, hi)` again from their hour rows, and
    /// the running totals of every day row of theirs from `lo` on.
    pub(crate) async fn reroll_days(
        &self,
        tx: &mut Transaction<'_, Any>,
        ids: &[i64],
        lo: i64,
        hi: i64,
    ) -> Result<()> {
        let threshold = Some(self.settings.idle_threshold_pct);
        self.for_ids(tx, ids, lo, hi, threshold, REROLL_DAYS)
            .await?;
        self.for_ids(tx, ids, lo, hi, None, crate::groups::MARK_DIRTY)
            .await?;
        self.for_ids(tx, ids, lo, i64::MAX / 2, None, RUNNING_DAYS)
            .await
    }

    /// Used-by per day of GPUs `ids` for the days in `[lo, hi)`, again from the allocations.
    pub(crate) async fn reroll_day_use(
        &self,
        tx: &mut Transaction<'_, Any>,
        ids: &[i64],
        lo: i64,
        hi: i64,
    ) -> Result<()> {
        self.reroll_day_table(tx, ids, lo, hi, DayTable::Use)
            .await?;
        self.reroll_day_table(tx, ids, lo, hi, DayTable::Idle).await
    }

    /// One of the tables split from the allocations per day ([`DayTable`]) for GPUs `ids` and
    /// the days in `[lo, hi)`: their rows deleted and rolled again.
    async fn reroll_day_table(
        &self,
        tx: &mut Transaction<'_, Any>,
        ids: &[i64],
        lo: i64,
        hi: i64,
        table: DayTable,
    ) -> Result<()> {
        let (name, sql, threshold) = match table {
            DayTable::Use => ("gpu_day_use", REROLL_DAY_USE, None),
            DayTable::Idle => (
                "gpu_day_idle",
                REROLL_DAY_IDLE,
                Some(self.settings.idle_threshold_pct),
            ),
        };
        self.for_ids(
            tx,
            ids,
            lo,
            hi,
            None,
            &format!("DELETE FROM {name} WHERE gpu_id IN (IDS) AND day >= $1 AND day < $2"),
        )
        .await?;
        self.for_ids(tx, ids, lo, hi, threshold, sql).await
    }

    /// Whether the one-off step `key` of `meta` is done.
    async fn done_once(&self, key: &str) -> Result<bool> {
        let done: Option<String> =
            sqlx::query_scalar(&self.sql("SELECT value FROM meta WHERE key = $1"))
                .bind(key.to_string())
                .fetch_optional(self.pool())
                .await?;
        Ok(done.is_some())
    }

    /// A database from before used-by was rolled up per day, or from before a workload two
    /// sources report counted for the team one of them names, gets its rows (again) once.
    pub(crate) async fn fill_day_use_once(&self) -> Result<()> {
        if self.done_once("day_use_named_team").await? {
            return Ok(());
        }
        let _writer = self.write_lock.lock().await;
        let mut tx = self.writer_tx().await?;
        self.reroll_all_day_use(&mut tx).await?;
        sqlx::query("INSERT INTO meta (key, value) VALUES ('day_use_named_team', '3')")
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Every used-by and allocated-idle day row again, for every physical GPU.
    pub(crate) async fn reroll_all_day_use(&self, tx: &mut Transaction<'_, Any>) -> Result<()> {
        let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM gpus WHERE mig_parent_uuid IS NULL")
            .fetch_all(&mut **tx)
            .await?;
        for chunk in ids.chunks(200) {
            self.reroll_day_use(tx, chunk, i64::MIN / 2, i64::MAX / 2)
                .await?;
        }
        // Every day's used-by may have changed: list them all, so that no answer kept over
        // them is used again (`crate::settled`) until the refresher has been through.
        sqlx::query(
            "INSERT INTO group_dirty (day) SELECT DISTINCT day FROM gpu_days WHERE true \
             ON CONFLICT (day) DO NOTHING",
        )
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Run `sql` with `$1`, `$2` = `lo`, `hi`, `$3` = `extra` when given, and `IDS` replaced by
    /// the GPU ids (in chunks).
    pub(crate) async fn for_ids(
        &self,
        tx: &mut Transaction<'_, Any>,
        ids: &[i64],
        lo: i64,
        hi: i64,
        extra: Option<f64>,
        sql: &str,
    ) -> Result<()> {
        let first = if extra.is_some() { 4 } else { 3 };
        for chunk in ids.chunks(500) {
            let marks: Vec<String> = (0..chunk.len())
                .map(|n| format!("${}", n + first))
                .collect();
            let text = sql.replace("IDS", &marks.join(","));
            let text = self.sql(&text);
            let mut q = sqlx::query(&text)
                .persistent(chunk.len() == 1)
                .bind(lo)
                .bind(hi);
            if let Some(x) = extra {
                q = q.bind(x);
            }
            for id in chunk {
                q = q.bind(*id);
            }
            q.execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// Recompute every allocated flag once, with the day rollups after it: rollups written
    /// before an allocation on a MIG instance made its GPU's hour allocated, or before a
    /// closed allocation's later hours were re-flagged, hold flags the definitions no longer
    /// give. Only hours flagged allocated and the hours of GPUs with MIG instances can change.
    pub(crate) async fn refresh_allocated_once(&self) -> Result<()> {
        if self.done_once("allocated_flags").await? {
            return Ok(());
        }
        let _writer = self.write_lock.lock().await;
        let mut tx = self.writer_tx().await?;
        let changed = sqlx::query(&format!(
            "UPDATE gpu_hours SET allocated = {ALLOCATED} WHERE (allocated = 1 OR gpu_id IN \
             (SELECT p.id FROM gpus p JOIN gpus c ON c.mig_parent_uuid = p.uuid)) \
             AND allocated <> {ALLOCATED}"
        ))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if changed > 0 {
            tracing::info!(
                hours = changed,
                "re-flagged allocated hours; rebuilding day rollups"
            );
            self.reroll_all_days(&mut tx).await?;
            self.reroll_all_day_use(&mut tx).await?;
        }
        sqlx::query("INSERT INTO meta (key, value) VALUES ('allocated_flags', '2')")
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Rebuild every day rollup (after the idle threshold changed).
    pub(crate) async fn rebuild_days(&self) -> Result<()> {
        let mut tx = self.pool().begin().await?;
        self.reroll_all_days(&mut tx).await?;
        self.reroll_all_day_use(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Every day rollup again from the hour rollups.
    async fn reroll_all_days(&self, tx: &mut Transaction<'_, Any>) -> Result<()> {
        sqlx::query("DELETE FROM gpu_days")
            .execute(&mut **tx)
            .await?;
        // SQLite needs a WHERE in INSERT ... SELECT ... ON CONFLICT; `1 = 1` keeps one.
        let all = REROLL_DAYS.replace("gpu_id IN (IDS)", "1 = 1");
        sqlx::query(&self.sql(&all))
            .bind(i64::MIN / 2)
            .bind(i64::MAX / 2)
            .bind(self.settings.idle_threshold_pct)
            .execute(&mut **tx)
            .await?;
        let running = RUNNING_DAYS
            .replace("d.gpu_id IN (IDS)", "1 = 1")
            .replace("b.gpu_id IN (IDS)", "1 = 1")
            .replace("gpu_days.gpu_id IN (IDS)", "1 = 1");
        sqlx::query(&self.sql(&running))
            .bind(i64::MIN / 2)
            .bind(i64::MAX / 2)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_covers_the_stale_window() {
        let mut t = Touched::default();
        mark_presence(&mut t, 3600 * 10 + 59 * 60, 7200);
        assert_eq!(
            t.presence.iter().copied().collect::<Vec<_>>(),
            vec![36000, 39600, 43200]
        );
        let mut t = Touched::default();
        mark_presence(&mut t, 3600 * 10, 7200);
        assert_eq!(t.presence.len(), 2);
    }

    #[test]
    fn values_numbers_placeholders_row_major() {
        assert_eq!(values(2, 2), "($1,$2),($3,$4)");
    }
}
