//! Aggregates behind the dashboard: time series, the hour-of-day × weekday heatmap, idle
//! streaks, allocated-but-idle hours per workload and usage per allocating team. All of them
//! read the hour and day rollups and the allocations, never raw samples.

use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;
use sqlx::Row;

use crate::query::Window;
use crate::{Filters, Result, Store};

/// One point of a fleet time series: counts over one bucket (an hour or a day).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SeriesPoint {
    pub start: DateTime<Utc>,
    /// Physical GPUs present at some hour of the bucket.
    pub gpus: i64,
    pub gpu_hours: i64,
    pub busy_hours: i64,
    pub idle_hours: i64,
    pub known_hours: i64,
    pub allocated_hours: i64,
    /// Σ hourly activity over the known hours.
    pub activity_sum: f64,
}

impl SeriesPoint {
    /// Mean hourly activity over known hours, `None` when none is known.
    pub fn avg_activity_pct(&self) -> Option<f64> {
        (self.known_hours > 0).then(|| self.activity_sum / self.known_hours as f64)
    }
}

/// Mean activity per weekday (Monday = 0) and UTC hour of day, with the hours behind each cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Heatmap {
    pub cells: Vec<Vec<Option<f64>>>,
    pub hours: Vec<Vec<i64>>,
}

/// Allocated-but-idle hours of one workload in a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IdleWorkload {
    pub workload: String,
    pub kind: String,
    /// The team the allocation names (who used it), if any.
    pub used_by: Option<String>,
    /// The owner team of the GPUs.
    pub owner: String,
    pub gpus: i64,
    pub allocated_idle_hours: i64,
    pub cost_usd: f64,
}

/// Allocation hours of one allocating team (the "used by" side) in a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsedBy {
    pub team: String,
    pub gpus: i64,
    pub allocated_hours: f64,
}

/// ` JOIN gpu_owners o ...`: the owner period of GPU `gpu` at time `at` (SQL expressions).
fn owner_join(gpu: &str, at: &str) -> String {
    format!(" JOIN gpu_owners o ON o.gpu_id = {gpu} AND o.from_ts <= {at} AND o.to_ts > {at}")
}

fn ts(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, 0).single().unwrap_or_default()
}

impl Store {
    fn filtered_ids_clause(&self, filters: &Filters, first: usize) -> (String, Vec<String>) {
        filters.clause(first)
    }

    /// Filters with team and environment read from the owner at time `at` of GPU `gpu` (SQL
    /// expressions): the join to add after the FROM list, then the clause.
    fn owned_clause(
        &self,
        filters: &Filters,
        first: usize,
        gpu: &str,
        at: &str,
    ) -> (String, String, Vec<String>) {
        if !filters.by_owner() {
            let (clause, binds) = filters.clause(first);
            return (String::new(), clause, binds);
        }
        let (clause, binds) = filters.clause_with(first, "o");
        (owner_join(gpu, at), clause, binds)
    }

    /// Fleet series over the window in buckets of an hour (`daily = false`) or a day.
    pub async fn series(
        &self,
        window: Window,
        filters: &Filters,
        daily: bool,
        now: DateTime<Utc>,
    ) -> Result<Vec<SeriesPoint>> {
        let (lo, hi) = window.hours(now.timestamp());
        let (join_d, clause_d, binds_d) = self.owned_clause(filters, 4, "d.gpu_id", "d.day");
        let (join_h, clause_h, binds_h) = self.owned_clause(filters, 4, "h.gpu_id", "h.hour");
        // A day bucket counts a GPU under its owner at the start of the day.
        let binds = if daily { binds_d } else { binds_h };
        let sql = if daily {
            let (join, clause) = (join_d, clause_d);
            format!(
                "SELECT d.day AS t, COUNT(*) AS gpus, CAST(SUM(d.present_hours) AS BIGINT) AS present, \
                 CAST(SUM(d.known_hours - d.idle_hours) AS BIGINT) AS busy, \
                 CAST(SUM(d.idle_hours) AS BIGINT) AS idle, CAST(SUM(d.known_hours) AS BIGINT) AS known, \
                 CAST(SUM(d.allocated_hours) AS BIGINT) AS alloc, \
                 CAST(SUM(d.act_sum) AS DOUBLE PRECISION) AS act \
                 FROM gpu_days d JOIN gpus g ON g.id = d.gpu_id{join} \
                 WHERE d.day >= $1 AND d.day < $2 AND $3 = $3 AND g.mig_parent_uuid IS NULL{clause} \
                 GROUP BY d.day ORDER BY d.day"
            )
        } else {
            let (join, clause) = (join_h, clause_h);
            format!(
                "SELECT h.hour AS t, COUNT(*) AS gpus, COUNT(*) AS present, \
                 CAST(SUM(CASE WHEN h.act_n > 0 AND h.act_sum >= $3 * h.act_n THEN 1 ELSE 0 END) AS BIGINT) AS busy, \
                 CAST(SUM(CASE WHEN h.act_n > 0 AND h.act_sum < $3 * h.act_n THEN 1 ELSE 0 END) AS BIGINT) AS idle, \
                 CAST(SUM(CASE WHEN h.act_n > 0 THEN 1 ELSE 0 END) AS BIGINT) AS known, \
                 CAST(SUM(h.allocated) AS BIGINT) AS alloc, \
                 CAST(SUM(CASE WHEN h.act_n > 0 THEN h.act_sum / h.act_n ELSE 0 END) AS DOUBLE PRECISION) AS act \
                 FROM gpu_hours h JOIN gpus g ON g.id = h.gpu_id{join} \
                 WHERE h.hour >= $1 AND h.hour < $2 AND g.mig_parent_uuid IS NULL{clause} \
                 GROUP BY h.hour ORDER BY h.hour"
            )
        };
        let (from, to) = if daily {
            (gpuledger_model::day_floor(lo), hi)
        } else {
            (lo, hi)
        };
        let sql = self.sql(&sql);
        let mut q = sqlx::query(&sql)
            .persistent(false)
            .bind(from)
            .bind(to)
            .bind(self.settings.idle_threshold_pct);
        for b in binds {
            q = q.bind(b);
        }
        q.fetch_all(self.pool())
            .await?
            .iter()
            .map(|r| {
                Ok(SeriesPoint {
                    start: ts(r.try_get("t")?),
                    gpus: r.try_get("gpus")?,
                    gpu_hours: r.try_get("present")?,
                    busy_hours: r.try_get("busy")?,
                    idle_hours: r.try_get("idle")?,
                    known_hours: r.try_get("known")?,
                    allocated_hours: r.try_get("alloc")?,
                    activity_sum: r.try_get("act")?,
                })
            })
            .collect()
    }

    /// Mean hourly activity per weekday × hour of day (UTC) over the window.
    pub async fn heatmap(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Heatmap> {
        let (lo, hi) = window.hours(now.timestamp());
        let (join, clause, binds) = self.owned_clause(filters, 3, "h.gpu_id", "h.hour");
        // Sum per clock hour in SQL (a streaming scan of the covering hour index) and fold the
        // hours into weekday × hour of day here. Without filters, skip the join: MIG instances
        // are the only GPUs to leave out, and they are few.
        let scope = if filters.is_empty() {
            "FROM gpu_hours h WHERE h.hour >= $1 AND h.hour < $2 AND h.act_n > 0 \
             AND h.gpu_id NOT IN (SELECT id FROM gpus WHERE mig_parent_uuid IS NOT NULL)"
                .to_string()
        } else {
            format!(
                "FROM gpu_hours h JOIN gpus g ON g.id = h.gpu_id{join} WHERE h.hour >= $1 \
                 AND h.hour < $2 AND h.act_n > 0 AND g.mig_parent_uuid IS NULL{clause}"
            )
        };
        let sql = format!(
            "SELECT h.hour AS hour, COUNT(*) AS n, \
             CAST(SUM(h.act_sum / h.act_n) AS DOUBLE PRECISION) AS act {scope} GROUP BY h.hour"
        );
        let sql = self.sql(&sql);
        let mut q = sqlx::query(&sql).persistent(false).bind(lo).bind(hi);
        for b in binds {
            q = q.bind(b);
        }
        let mut sums = vec![vec![0.0f64; 24]; 7];
        let mut map = Heatmap {
            cells: vec![vec![None; 24]; 7],
            hours: vec![vec![0; 24]; 7],
        };
        for r in q.fetch_all(self.pool()).await? {
            let hour: i64 = r.try_get("hour")?;
            let n: i64 = r.try_get("n")?;
            let act: f64 = r.try_get("act")?;
            // 1970-01-01 was a Thursday: (days + 3) % 7 is 0 on Mondays.
            let wd = (hour.div_euclid(86_400) + 3).rem_euclid(7) as usize;
            let hd = (hour.rem_euclid(86_400) / 3600) as usize;
            map.hours[wd][hd] += n;
            sums[wd][hd] += act;
        }
        for (cells, (hours, sums)) in map.cells.iter_mut().zip(map.hours.iter().zip(&sums)) {
            for (cell, (n, sum)) in cells.iter_mut().zip(hours.iter().zip(sums)) {
                *cell = (*n > 0).then(|| sum / *n as f64);
            }
        }
        Ok(map)
    }

    /// For each physical GPU, the start of the last UTC day with a busy hour (`None`: no busy
    /// hour within the rollup retention).
    pub async fn last_busy_days(
        &self,
        filters: &Filters,
    ) -> Result<Vec<(String, Option<DateTime<Utc>>)>> {
        let (clause, binds) = self.filtered_ids_clause(filters, 1);
        let sql = format!(
            "SELECT g.uuid, (SELECT MAX(d.day) FROM gpu_days d WHERE d.gpu_id = g.id \
             AND d.known_hours > d.idle_hours) AS last_busy \
             FROM gpus g WHERE g.mig_parent_uuid IS NULL{clause}"
        );
        let sql = self.sql(&sql);
        let mut q = sqlx::query(&sql).persistent(false);
        for b in binds {
            q = q.bind(b);
        }
        q.fetch_all(self.pool())
            .await?
            .iter()
            .map(|r| {
                Ok((
                    r.try_get("uuid")?,
                    r.try_get::<Option<i64>, _>("last_busy")?.map(ts),
                ))
            })
            .collect()
    }

    /// Allocated-but-idle hours per workload over the window, most expensive first.
    pub async fn idle_workloads(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<IdleWorkload>> {
        let (lo, hi) = window.hours(now.timestamp());
        let (clause, binds) = filters.clause_with(4, "o");
        let join = owner_join("h.gpu_id", "h.hour");
        let sql = format!(
            "SELECT a.workload, a.kind, a.team AS used_by, o.team AS owner, \
             COUNT(DISTINCT h.gpu_id) AS gpus, COUNT(*) AS hours, \
             CAST(SUM(COALESCE(g.usd_per_hour, 0)) AS DOUBLE PRECISION) AS cost \
             FROM gpu_hours h JOIN gpus g ON g.id = h.gpu_id{join} \
             JOIN allocations a ON a.gpu_id = h.gpu_id AND a.start_ts < h.hour + 3600 \
             AND (a.end_ts IS NULL OR a.end_ts > h.hour) \
             WHERE h.hour >= $1 AND h.hour < $2 AND h.allocated = 1 AND h.act_n > 0 \
             AND h.act_sum < $3 * h.act_n AND g.mig_parent_uuid IS NULL{clause} \
             GROUP BY a.workload, a.kind, a.team, o.team"
        );
        let sql = self.sql(&sql);
        let mut q = sqlx::query(&sql)
            .persistent(false)
            .bind(lo)
            .bind(hi)
            .bind(self.settings.idle_threshold_pct);
        for b in binds {
            q = q.bind(b);
        }
        let mut out: Vec<IdleWorkload> = q
            .fetch_all(self.pool())
            .await?
            .iter()
            .map(|r| {
                Ok(IdleWorkload {
                    workload: r.try_get("workload")?,
                    kind: r.try_get("kind")?,
                    used_by: r.try_get("used_by")?,
                    owner: r.try_get("owner")?,
                    gpus: r.try_get("gpus")?,
                    allocated_idle_hours: r.try_get("hours")?,
                    cost_usd: r.try_get("cost")?,
                })
            })
            .collect::<Result<_>>()?;
        out.sort_by(|a, b| {
            b.cost_usd
                .total_cmp(&a.cost_usd)
                .then(a.workload.cmp(&b.workload))
        });
        Ok(out)
    }

    /// Allocation hours per allocating team (who used GPUs), clipped to the window. Overlapping
    /// allocations on one GPU are counted once per allocation here.
    pub async fn used_by(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<UsedBy>> {
        let (lo, hi) = window.hours(now.timestamp());
        let (clause, binds) = self.filtered_ids_clause(filters, 3);
        let sql = format!(
            "SELECT COALESCE(a.team, 'unknown') AS team, COUNT(DISTINCT a.gpu_id) AS gpus, \
             CAST(SUM((CASE WHEN a.end_ts IS NULL OR a.end_ts > $2 THEN $2 ELSE a.end_ts END) - \
             (CASE WHEN a.start_ts < $1 THEN $1 ELSE a.start_ts END)) AS DOUBLE PRECISION) / 3600.0 AS hours \
             FROM allocations a JOIN gpus g ON g.id = a.gpu_id \
             WHERE a.start_ts < $2 AND (a.end_ts IS NULL OR a.end_ts > $1) \
             AND g.mig_parent_uuid IS NULL{clause} \
             GROUP BY COALESCE(a.team, 'unknown') ORDER BY hours DESC"
        );
        let sql = self.sql(&sql);
        let mut q = sqlx::query(&sql).persistent(false).bind(lo).bind(hi);
        for b in binds {
            q = q.bind(b);
        }
        q.fetch_all(self.pool())
            .await?
            .iter()
            .map(|r| {
                Ok(UsedBy {
                    team: r.try_get("team")?,
                    gpus: r.try_get("gpus")?,
                    allocated_hours: r.try_get("hours")?,
                })
            })
            .collect()
    }

    /// Allocations of the GPUs matching the filters that overlap the window, newest first.
    pub async fn allocations_in(
        &self,
        window: Window,
        filters: &Filters,
        limit: i64,
    ) -> Result<Vec<gpuledger_model::Allocation>> {
        let (clause, binds) = self.filtered_ids_clause(filters, 4);
        let sql = format!(
            "SELECT g.uuid, a.start_ts, a.end_ts, a.workload, a.kind, a.user_name, a.team, a.owner, \
             a.source, a.context \
             FROM allocations a JOIN gpus g ON g.id = a.gpu_id \
             WHERE a.start_ts < $2 AND (a.end_ts IS NULL OR a.end_ts > $1){clause} \
             ORDER BY a.start_ts DESC, a.workload LIMIT $3"
        );
        let sql = self.sql(&sql);
        let mut q = sqlx::query(&sql)
            .persistent(false)
            .bind(window.from)
            .bind(window.to)
            .bind(limit);
        for b in binds {
            q = q.bind(b);
        }
        q.fetch_all(self.pool())
            .await?
            .iter()
            .map(|r| crate::query::allocation_from_row(r, r.try_get("uuid")?))
            .collect()
    }
}
