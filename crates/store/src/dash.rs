//! Aggregates behind the dashboard: time series, the hour-of-day × weekday heatmap, idle
//! streaks, allocated-but-idle hours per workload and usage per allocating team. All of them
//! read the hour and day rollups and the allocations, never raw samples.

use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;
use sqlx::Row;

pub use gpuledger_ledger::summary::SeriesPoint;
use gpuledger_ledger::waste::{ActivityEvidence, FirstWorkloads, IdleShare, IdleWorkload};
use gpuledger_model::{day_floor, Summary, DAY_SECS};

use crate::groups::{dirty_hour_rows, CLEAN_DAYS, CLEAN_HOURS};
use crate::query::{held_idle, Window, SPLIT_DAYS};
use crate::{Filters, Result, Store};

/// A GPU's id and UUID with its last day from today on with a busy hour and with any known
/// activity ([`Store::activity_evidence`]).
#[derive(Clone, serde::Deserialize)]
pub(crate) struct EvidenceToday(i64, String, Option<i64>, Option<i64>);

impl crate::live::LiveRow for EvidenceToday {
    fn gpu_id(&self) -> i64 {
        self.0
    }
}

/// Mean activity per weekday (Monday = 0) and UTC hour of day, with the hours behind each cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Heatmap {
    pub cells: Vec<Vec<Option<f64>>>,
    pub hours: Vec<Vec<i64>>,
}

/// ` JOIN gpu_owners o ...`: the owner period of GPU `gpu` at time `at` (SQL expressions).
/// `+{at}`: the owner period never bounds the scan of the hours (see `query::window_rows`).
fn owner_join(gpu: &str, at: &str) -> String {
    format!(" JOIN gpu_owners o ON o.gpu_id = {gpu} AND o.from_ts <= +{at} AND o.to_ts > +{at}")
}

/// The last day of GPU `g` with a busy hour (`last_busy`) and with a measured one
/// (`last_known`) among its day rows where `{days}`: each GPU's day rows newest first
/// (`gpu_days_gpu`, which carries the known and idle hours: no lookup of the table), to the
/// first that qualifies, so a GPU busy or measured lately reads a row or two.
fn evidence_days(days: &str) -> String {
    format!(
        "(SELECT d.day FROM gpu_days d WHERE d.gpu_id = g.id AND {days} \
          AND d.known_hours > d.idle_hours ORDER BY d.day DESC LIMIT 1) AS last_busy, \
         (SELECT d.day FROM gpu_days d WHERE d.gpu_id = g.id AND {days} AND d.known_hours > 0 \
          ORDER BY d.day DESC LIMIT 1) AS last_known"
    )
}

/// A row of the allocated-idle shares (`workload, kind, used_by, owner, gpu_id,
/// usd_per_hour, hours`), read wide (`crate::wide`).
#[derive(serde::Deserialize)]
struct IdleShareRow(
    String,
    String,
    Option<String>,
    String,
    i64,
    #[serde(deserialize_with = "crate::wide::opt_real")] Option<f64>,
    #[serde(deserialize_with = "crate::wide::real")] f64,
);

/// The columns of [`IdleShareRow`].
const IDLE_SHARE_COLUMNS: [crate::wide::Col; 7] = [
    crate::wide::Col::Plain("workload"),
    crate::wide::Col::Plain("kind"),
    crate::wide::Col::Plain("used_by"),
    crate::wide::Col::Plain("owner"),
    crate::wide::Col::Plain("gpu_id"),
    crate::wide::Col::Real("usd_per_hour"),
    crate::wide::Col::Real("hours"),
];

impl crate::live::LiveRow for IdleShare {
    fn gpu_id(&self) -> i64 {
        self.gpu_id
    }
}

impl From<IdleShareRow> for IdleShare {
    fn from(r: IdleShareRow) -> Self {
        IdleShare {
            workload: r.0,
            kind: r.1,
            used_by: r.2,
            owner: r.3,
            gpu_id: r.4,
            usd_per_hour: r.5,
            hours: r.6,
        }
    }
}

fn point(r: &sqlx::any::AnyRow) -> Result<SeriesPoint> {
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
}

/// The order the kept allocated-idle shares are held in: by GPU, workload, allocating team
/// and owner.
fn idle_share_order(a: &IdleShare, b: &IdleShare) -> std::cmp::Ordering {
    (a.gpu_id, &a.workload, &a.used_by, &a.owner).cmp(&(
        b.gpu_id,
        &b.workload,
        &b.used_by,
        &b.owner,
    ))
}

/// A series point's columns summed per bucket `t` over the group rows' and the per-GPU rows'
/// sums (a subquery of columns named as [`point`] reads them).
const POINT_SUMS: &str = "SELECT t, CAST(SUM(gpus) AS BIGINT) AS gpus, \
     CAST(SUM(present) AS BIGINT) AS present, CAST(SUM(busy) AS BIGINT) AS busy, \
     CAST(SUM(idle) AS BIGINT) AS idle, CAST(SUM(known) AS BIGINT) AS known, \
     CAST(SUM(alloc) AS BIGINT) AS alloc, CAST(SUM(act) AS DOUBLE PRECISION) AS act";

/// The binds `$1..$6` of the per-hour figures: the window's whole days (`$1..$2`) and its
/// partial edge days (`$3..$4`, `$5..$6`), as [`dirty_hour_rows`] and [`CLEAN_HOURS`] take them.
fn hour_binds(window: Window, now: DateTime<Utc>) -> [i64; 6] {
    let (lo, hi) = window.hours(now.timestamp());
    let ((d_lo, d_hi), [e1, e2]) = crate::query::whole_days(lo, hi);
    [d_lo, d_hi, e1.0, e1.1, e2.0, e2.1]
}

fn ts(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, 0).single().unwrap_or_default()
}

/// The daily trend's sums of [`crate::query::window_rows`]' rows `u`, per day `u.t`.
const DAY_SUMS: &str = "SELECT u.t AS t, COUNT(DISTINCT u.gpu_id) AS gpus, \
     CAST(SUM(u.present) AS BIGINT) AS present, \
     CAST(SUM(u.known - u.idle) AS BIGINT) AS busy, CAST(SUM(u.idle) AS BIGINT) AS idle, \
     CAST(SUM(u.known) AS BIGINT) AS known, CAST(SUM(u.alloc) AS BIGINT) AS alloc, \
     CAST(SUM(u.act) AS DOUBLE PRECISION) AS act";

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
        if daily {
            return self.daily_series(window, filters, now).await;
        }
        // Hours of whole days from the group rollups, except the days listed dirty; those
        // and the partial edge days from the hour rows.
        let (join, clause, binds) = self.owned_clause(filters, 8, "h.gpu_id", "h.hour");
        let groups = filters.group_clause(8);
        let hours = dirty_hour_rows(self.backend());
        // Without filters, skip the join to the GPUs (a scan of every GPU's row): MIG
        // instances are the only GPUs to leave out, and they are few.
        let scope = if filters.is_empty() {
            format!(
                "FROM {hours} WHERE h.hour >= r.lo AND h.hour < r.hi \
                 AND h.gpu_id NOT IN (SELECT id FROM gpus WHERE mig_parent_uuid IS NOT NULL)"
            )
        } else {
            format!(
                "FROM {hours} JOIN gpus g ON g.id = h.gpu_id{join} \
                 WHERE h.hour >= r.lo AND h.hour < r.hi AND g.mig_parent_uuid IS NULL{clause}"
            )
        };
        let sql = format!(
            "{POINT_SUMS} FROM (\
               SELECT gh.hour AS t, gh.present AS gpus, gh.present AS present, \
               gh.known - gh.idle AS busy, gh.idle AS idle, gh.known AS known, \
               gh.alloc AS alloc, gh.act AS act {CLEAN_HOURS}{groups} \
               UNION ALL \
               SELECT h.hour AS t, COUNT(*) AS gpus, COUNT(*) AS present, \
               SUM(CASE WHEN h.act_n > 0 AND h.act_sum >= $7 * h.act_n THEN 1 ELSE 0 END) AS busy, \
               SUM(CASE WHEN h.act_n > 0 AND h.act_sum < $7 * h.act_n THEN 1 ELSE 0 END) AS idle, \
               SUM(CASE WHEN h.act_n > 0 THEN 1 ELSE 0 END) AS known, \
               SUM(h.allocated) AS alloc, \
               SUM(CASE WHEN h.act_n > 0 THEN h.act_sum / h.act_n ELSE 0 END) AS act \
               {scope} GROUP BY h.hour) s GROUP BY t ORDER BY t"
        );
        self.fetch_window_rows(&sql, hour_binds(window, now), binds)
            .await?
            .iter()
            .map(point)
            .collect()
    }

    /// The daily trend: the rows behind the summary ([`crate::query::window_rows`]) summed per
    /// UTC day, clipped to the window, so the bars add up to the headline figures. A GPU counts
    /// under its owner at each hour, as in the summary. Whole days come from the group rollups
    /// (`crate::groups`) except the days listed dirty and the GPU-days a change of owner
    /// splits, which come from the per-GPU rows with the window's edges. Where the window
    /// runs to now from a day before ([`Store::shares_today`]), today's point is summed from
    /// today's per-GPU rows (`ledger::summary::day_point` over [`Store::todays_windows`], kept
    /// between requests on PostgreSQL), as the Overview sums it, instead of read from today's
    /// day rows less the hours ahead of the clock at each request (at 100,000 GPUs, 0.4 s).
    async fn daily_series(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<SeriesPoint>> {
        if !Self::shares_today(window, now) {
            return self.daily_series_with(window, filters, now, false).await;
        }
        let (mut series, today) = tokio::try_join!(
            self.daily_series_with(window, filters, now, true),
            self.todays_windows(window, filters, now),
        )?;
        series.extend(gpuledger_ledger::summary::day_point(
            ts(day_floor(now.timestamp())),
            &today,
        ));
        Ok(series)
    }

    /// [`Store::daily_series`], without today's point where `today_apart`
    /// ([`Store::split_at_today_with`]).
    async fn daily_series_with(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
        today_apart: bool,
    ) -> Result<Vec<SeriesPoint>> {
        self.split_at_today_with(
            format!(
                "daily series {filters:?} threshold {}",
                self.settings.idle_threshold_pct
            ),
            window,
            now,
            |p: &SeriesPoint| p.start.timestamp(),
            |w| self.daily_series_read(w, filters, now),
            today_apart,
        )
        .await
    }

    /// What the Overview reads of its window: the per-GPU windows with peak memory
    /// ([`Store::gpu_windows`]), the fleet trend ([`Store::series`], by day when `daily`) and
    /// the total's forecast ([`Store::forecast_total`]), with the same figures. Where the
    /// window runs to now ([`Store::shares_today`]) today's per-GPU rows are read once, with
    /// the windows, and today's point of the daily trend and day of the forecast are summed
    /// from them (`ledger::summary::day_point`, `ledger::forecast::day_rows`) rather than
    /// read twice more; the days before today are kept as each read keeps them.
    pub async fn windows_trend_forecast(
        &self,
        window: Window,
        filters: &Filters,
        daily: bool,
        now: DateTime<Utc>,
    ) -> Result<(
        Vec<gpuledger_ledger::GpuWindow>,
        Vec<SeriesPoint>,
        gpuledger_ledger::forecast::Forecast,
    )> {
        let share = Self::shares_today(window, now);
        let series = async {
            if daily {
                self.daily_series_with(window, filters, now, share).await
            } else {
                self.series(window, filters, false, now).await
            }
        };
        let ((windows, today), mut series, mut days) = tokio::try_join!(
            self.gpu_windows_split(window, filters, now, true, share),
            series,
            self.forecast_total_days_with(filters, now, share),
        )?;
        if share {
            let start = day_floor(now.timestamp());
            if daily {
                series.extend(gpuledger_ledger::summary::day_point(ts(start), &today));
            }
            days.extend(crate::forecast::todays_day_rows(now, &today));
        }
        let forecast =
            gpuledger_ledger::forecast::forecasts(&days, gpuledger_ledger::GroupBy::Team, now).1;
        Ok((windows, series, forecast))
    }

    /// [`Store::daily_series`] read at once.
    async fn daily_series_read(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<SeriesPoint>> {
        let owned = filters.by_owner();
        let (binds_at, union) = crate::query::dirty_window_rows(window, now, owned);
        let groups = filters.group_clause(8);
        let rows = if owned {
            let (clause, _) = filters.clause_with(8, "o");
            format!(
                "{DAY_SUMS} FROM ({union}) u JOIN gpus g ON g.id = u.gpu_id \
                 JOIN gpu_owners o ON o.gpu_id = u.gpu_id AND o.from_ts = u.o_from \
                 WHERE u.present > 0 AND g.mig_parent_uuid IS NULL{clause} GROUP BY u.t"
            )
        } else {
            // Neither team nor environment filtered: the rows need no owner period, only the
            // GPUs the filters select (physical ones), looked up once.
            let (clause, _) = filters.clause(8);
            format!(
                "{DAY_SUMS} FROM ({union}) u WHERE u.present > 0 AND u.gpu_id IN (\
                   SELECT g.id FROM gpus g WHERE g.mig_parent_uuid IS NULL{clause}) \
                 GROUP BY u.t"
            )
        };
        let sql = format!(
            "WITH {SPLIT_DAYS} \
             {POINT_SUMS} FROM (\
               SELECT gd.day AS t, gd.gpus AS gpus, gd.present AS present, \
               gd.known - gd.idle AS busy, gd.idle AS idle, gd.known AS known, \
               gd.alloc AS alloc, gd.act AS act {CLEAN_DAYS}{groups} \
               UNION ALL {rows}) s GROUP BY t ORDER BY t"
        );
        let (_, binds) = filters.clause(8);
        self.fetch_window_rows(&sql, binds_at, binds)
            .await?
            .iter()
            .map(point)
            .collect()
    }

    /// The daily trend ([`Store::series`] by day) per owner team at each hour: `(team,
    /// point)` per day of the window and team, whose points add up (each day's) to the
    /// summary grouped by team. Whole days come from the group rollups; the days listed dirty,
    /// the split GPU-days and the edges from the per-GPU rows, as for the trend of one team.
    /// Where the window runs to now ([`Store::shares_today`]) today's points are summed from
    /// today's per-GPU rows (`ledger::summary::day_points_by`), which the summary reads too.
    pub async fn daily_series_by_team(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<(String, SeriesPoint)>> {
        let (mut points, today) = tokio::try_join!(
            self.daily_series_by_team_before(window, filters, now),
            self.todays_windows(window, filters, now),
        )?;
        Self::add_todays_points_by_team(&mut points, &today, now);
        Ok(points)
    }

    /// What the Teams page reads: the summary by team over `window` ([`Store::summary`]) and
    /// the daily trend per team ([`Store::daily_series_by_team`]) over each of `weeks`, with
    /// the same figures. Today's per-GPU rows are read once for all of them that run to now
    /// ([`Store::shares_today`]: each such read has the same rows of today), with the
    /// summary's windows where it runs to now too.
    pub async fn summary_and_series_by_team(
        &self,
        window: Window,
        weeks: [Window; 2],
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<(Summary, [Vec<(String, SeriesPoint)>; 2])> {
        let shares = weeks.map(|w| Self::shares_today(w, now));
        // Where the summary's window does not run to now, a week that does reads its own.
        let own_today = async {
            match weeks.iter().zip(shares).find(|(_, s)| *s) {
                Some((w, _)) if !Self::shares_today(window, now) => {
                    self.todays_windows(*w, filters, now).await
                }
                _ => Ok(Vec::new()),
            }
        };
        let ((windows, summary_today), mut this, mut last, own) = tokio::try_join!(
            self.gpu_windows_split(window, filters, now, false, true),
            self.daily_series_by_team_before(weeks[0], filters, now),
            self.daily_series_by_team_before(weeks[1], filters, now),
            own_today,
        )?;
        let today = if Self::shares_today(window, now) {
            summary_today
        } else {
            own
        };
        for (points, share) in [&mut this, &mut last].into_iter().zip(shares) {
            if share {
                Self::add_todays_points_by_team(points, &today, now);
            }
        }
        let summary = self.summary_of(&windows, window, gpuledger_ledger::GroupBy::Team, now);
        Ok((summary, [this, last]))
    }

    /// Today's points of the daily trend per team, summed from today's per-GPU rows `today`
    /// (none where the window does not run to now).
    fn add_todays_points_by_team(
        points: &mut Vec<(String, SeriesPoint)>,
        today: &[gpuledger_ledger::GpuWindow],
        now: DateTime<Utc>,
    ) {
        points.extend(gpuledger_ledger::summary::day_points_by(
            ts(day_floor(now.timestamp())),
            today,
            gpuledger_ledger::GroupBy::Team,
        ));
    }

    /// [`Store::daily_series_by_team`] without today's points where the window runs to now
    /// ([`Store::shares_today`]; the caller sums them from today's per-GPU rows).
    async fn daily_series_by_team_before(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<(String, SeriesPoint)>> {
        self.split_at_today_with(
            format!(
                "daily series by team {filters:?} threshold {}",
                self.settings.idle_threshold_pct
            ),
            window,
            now,
            |(_, p): &(String, SeriesPoint)| p.start.timestamp(),
            |w| self.daily_series_by_team_read(w, filters, now),
            Self::shares_today(window, now),
        )
        .await
    }

    /// [`Store::daily_series_by_team`] read at once.
    async fn daily_series_by_team_read(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<(String, SeriesPoint)>> {
        let (binds_at, union) = crate::query::dirty_window_rows(window, now, true);
        let (clause, binds) = filters.clause_with(8, "o");
        let groups = filters.group_clause(8);
        let sums = POINT_SUMS.replacen("SELECT t,", "SELECT t, team,", 1);
        let rows = DAY_SUMS.replacen("SELECT u.t AS t,", "SELECT u.t AS t, o.team AS team,", 1);
        let sql = format!(
            "WITH {SPLIT_DAYS} \
             {sums} FROM (\
               SELECT gd.day AS t, fg.team AS team, gd.gpus AS gpus, gd.present AS present, \
               gd.known - gd.idle AS busy, gd.idle AS idle, gd.known AS known, \
               gd.alloc AS alloc, gd.act AS act {CLEAN_DAYS}{groups} \
               UNION ALL \
               {rows} FROM ({union}) u JOIN gpus g ON g.id = u.gpu_id \
               JOIN gpu_owners o ON o.gpu_id = u.gpu_id AND o.from_ts = u.o_from \
               WHERE u.present > 0 AND g.mig_parent_uuid IS NULL{clause} \
               GROUP BY u.t, o.team) s \
             GROUP BY t, team ORDER BY t, team"
        );
        self.fetch_window_rows(&sql, binds_at, binds)
            .await?
            .iter()
            .map(|r| Ok((r.try_get("team")?, point(r)?)))
            .collect()
    }

    /// Mean hourly activity per weekday × hour of day (UTC) over the window.
    pub async fn heatmap(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Heatmap> {
        let hours = self
            .split_at_today(
                format!("heatmap hours {filters:?}"),
                window,
                now,
                |(hour, _, _): &(i64, i64, f64)| *hour,
                |w| self.heatmap_hours(w, filters, now),
            )
            .await?;
        let mut sums = vec![vec![0.0f64; 24]; 7];
        let mut map = Heatmap {
            cells: vec![vec![None; 24]; 7],
            hours: vec![vec![0; 24]; 7],
        };
        for (hour, n, act) in hours {
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

    /// The heatmap's clock hours in the window: `(hour, measured GPU-hours, activity sum)`.
    async fn heatmap_hours(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<(i64, i64, f64)>> {
        let (join, clause, binds) = self.owned_clause(filters, 7, "h.gpu_id", "h.hour");
        let groups = filters.group_clause(7);
        let hours = dirty_hour_rows(self.backend());
        // Hours of whole days from the group rollups, except the days listed dirty; those and
        // the partial edge days summed per clock hour in SQL (a streaming scan of the covering
        // hour index). The hours are folded into weekday × hour of day here. Without filters,
        // skip the join: MIG instances are the only GPUs to leave out, and they are few.
        let scope = if filters.is_empty() {
            format!(
                "FROM {hours} WHERE h.hour >= r.lo \
                 AND h.hour < r.hi AND h.act_n > 0 \
                 AND h.gpu_id NOT IN (SELECT id FROM gpus WHERE mig_parent_uuid IS NOT NULL)"
            )
        } else {
            format!(
                "FROM {hours} JOIN gpus g ON g.id = h.gpu_id\
                 {join} WHERE h.hour >= r.lo AND h.hour < r.hi AND h.act_n > 0 \
                 AND g.mig_parent_uuid IS NULL{clause}"
            )
        };
        let sql = format!(
            "SELECT hour, CAST(SUM(n) AS BIGINT) AS n, CAST(SUM(act) AS DOUBLE PRECISION) AS act \
             FROM (SELECT gh.hour AS hour, gh.known AS n, gh.act AS act {CLEAN_HOURS} \
               AND gh.known > 0{groups} \
               UNION ALL SELECT h.hour AS hour, COUNT(*) AS n, SUM(h.act_sum / h.act_n) AS act \
               {scope} GROUP BY h.hour) s GROUP BY hour"
        );
        let sql = self.sql(&sql);
        let mut q = sqlx::query(&sql).persistent(false);
        for b in hour_binds(window, now) {
            q = q.bind(b);
        }
        for b in binds {
            q = q.bind(b);
        }
        q.fetch_all(self.pool())
            .await?
            .iter()
            .map(|r| Ok((r.try_get("hour")?, r.try_get("n")?, r.try_get("act")?)))
            .collect()
    }

    /// For each physical GPU matching the filters, the last UTC day with a busy hour and the
    /// last with any known activity (`None`: none within the rollup retention), as of `now`:
    /// what `ledger::waste::activity_finding` tells idle from unmeasured GPUs by.
    ///
    /// The days before today are settled (`crate::settled`): their answer, for every GPU, is
    /// kept while none of them changes. Each request reads only today's (and any later) day
    /// rows of the GPUs selected, and a day there wins over the kept one.
    pub async fn activity_evidence(
        &self,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<(String, ActivityEvidence)>> {
        let today = day_floor(now.timestamp());
        let kept = self
            .settled(
                format!(
                    "activity evidence threshold {}",
                    self.settings.idle_threshold_pct
                ),
                (i64::MIN, today),
                || self.activity_evidence_before(today),
            )
            .await?;
        let rows = if self.keeps_live() {
            // The whole fleet's answer of today is kept between requests (`crate::live`):
            // each request reads again the GPUs whose day rows of today were written since.
            // A filtered request keeps the GPUs of the kept GPU list its filters pass, as the
            // same filters read from the database select them (the `gpus` row's columns).
            let all = &Filters::default();
            let changed = format!(
                "SELECT string_agg(DISTINCT CAST(d.gpu_id AS TEXT), ',') FROM gpu_days d \
                 WHERE d.day >= $2 AND {}",
                crate::live::written_since("d")
            );
            let rows = self
                .live_rows(
                    &self.live.evidence,
                    format!(
                        "today's activity evidence threshold {} today {today}",
                        self.settings.idle_threshold_pct
                    ),
                    &changed,
                    &[today],
                    |a: &EvidenceToday, b: &EvidenceToday| a.0.cmp(&b.0),
                    |only| async move {
                        self.activity_evidence_today(today, all, only.as_deref())
                            .await
                    },
                )
                .await?;
            if filters.is_empty() {
                rows
            } else {
                let ids: foldhash::HashSet<i64> = self
                    .kept_list(false, true, now)
                    .await?
                    .iter()
                    .filter(|g| filters.admits(g.filter_values()))
                    .map(|g| g.id)
                    .collect();
                std::sync::Arc::new(
                    rows.iter()
                        .filter(|r| ids.contains(&r.0))
                        .cloned()
                        .collect(),
                )
            }
        } else {
            std::sync::Arc::new(self.activity_evidence_today(today, filters, None).await?)
        };
        Ok(rows
            .iter()
            .map(|EvidenceToday(id, uuid, busy, known)| {
                let before = kept.get(id).copied().unwrap_or_default();
                (
                    uuid.clone(),
                    ActivityEvidence {
                        last_busy_day: busy.or(before.last_busy_day),
                        last_known_day: known.or(before.last_known_day),
                    },
                )
            })
            .collect())
    }

    /// Each physical GPU matching the filters (of `only` alone where given: PostgreSQL only,
    /// they are written in place as an array) with the last day from `today` on with a busy
    /// hour and with any known activity.
    async fn activity_evidence_today(
        &self,
        today: i64,
        filters: &Filters,
        only: Option<&[i64]>,
    ) -> Result<Vec<EvidenceToday>> {
        let (clause, binds) = self.filtered_ids_clause(filters, 2);
        let (only, only_days) = match only {
            Some(ids) => {
                let ids = crate::live::id_array(ids);
                (
                    format!(" AND g.id = ANY({ids})"),
                    format!(" AND d.gpu_id = ANY({ids})"),
                )
            }
            None => Default::default(),
        };
        // Today's day rows are one or two per GPU: read once for all GPUs and grouped, not
        // looked up GPU by GPU as the settled days are (at 100,350 GPUs on PostgreSQL, 0.3
        // against 0.9 s).
        let sql = format!(
            "SELECT g.id, g.uuid, t.last_busy, t.last_known FROM gpus g LEFT JOIN \
             (SELECT d.gpu_id, MAX(CASE WHEN d.known_hours > d.idle_hours THEN d.day END) \
                AS last_busy, MAX(CASE WHEN d.known_hours > 0 THEN d.day END) AS last_known \
              FROM gpu_days d WHERE d.day >= $1{only_days} GROUP BY d.gpu_id) t \
             ON t.gpu_id = g.id WHERE g.mig_parent_uuid IS NULL{only}{clause}"
        );
        use crate::wide::Col::Plain;
        let sql = self.wide_sql(
            &sql,
            &[
                Plain("id"),
                Plain("uuid"),
                Plain("last_busy"),
                Plain("last_known"),
            ],
            "",
        );
        let sql = self.sql(&sql);
        let mut q = sqlx::query_scalar(&sql).persistent(false).bind(today);
        for b in binds {
            q = q.bind(b);
        }
        Self::wide_rows(q.fetch_one(self.pool()).await?)
    }

    /// [`Store::activity_evidence`] over the days before `today`, of every physical GPU, by
    /// GPU id.
    async fn activity_evidence_before(
        &self,
        today: i64,
    ) -> Result<std::collections::HashMap<i64, ActivityEvidence>> {
        let sql = format!(
            "SELECT g.id, {} FROM gpus g WHERE g.mig_parent_uuid IS NULL",
            evidence_days("d.day < $1")
        );
        use crate::wide::Col::Plain;
        let sql = self.wide_sql(
            &sql,
            &[Plain("id"), Plain("last_busy"), Plain("last_known")],
            "",
        );
        let sql = self.sql(&sql);
        let json = sqlx::query_scalar(&sql)
            .persistent(false)
            .bind(today)
            .fetch_one(self.pool())
            .await?;
        let rows: Vec<(i64, Option<i64>, Option<i64>)> = Self::wide_rows(json)?;
        Ok(rows
            .into_iter()
            .map(|(id, last_busy_day, last_known_day)| {
                (
                    id,
                    ActivityEvidence {
                        last_busy_day,
                        last_known_day,
                    },
                )
            })
            .collect())
    }

    /// Allocated-but-idle hours per workload over the window (filters select the GPUs' owners
    /// at the hour), each shared hour split evenly among the workloads holding the GPU or its
    /// MIG instances then, priced by `ledger::waste::idle_workloads`; most expensive first.
    /// Whole days come from the day rollup (`gpu_day_idle`), the partial edge days from the
    /// allocations.
    pub async fn idle_workloads(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<IdleWorkload>> {
        Ok(self
            .idle_workloads_first(window, filters, now, usize::MAX)
            .await?
            .first)
    }

    /// The first `n` of [`Store::idle_workloads`], and the figures of the others (for a count
    /// and a total of all of them): the settled days' shares are kept folded
    /// (`ledger::waste::FoldedShares`), and only the workloads today's shares and the edges
    /// name are folded again, so a request over a month of a large fleet does not go through a
    /// million shares.
    pub async fn idle_workloads_first(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
        n: usize,
    ) -> Result<FirstWorkloads> {
        let (lo, hi) = window.hours(now.timestamp());
        let ((d_lo, d_hi), [e1, e2]) = crate::query::whole_days(lo, hi);
        // An edge day may be its day rows less the day's shares outside the window
        // (`edges_by_day_of`): then the day rows' span takes it in.
        let (first, last) = crate::query::edges_by_day_of(
            [d_lo, d_hi, e1.0, e1.1, e2.0, e2.1],
            window.to >= now.timestamp(),
        );
        let day_lo = if first { d_lo - DAY_SECS } else { d_lo };
        let day_hi = if last { d_hi + DAY_SECS } else { d_hi };
        // The days before today are read once while they stay as they are (`crate::settled`);
        // today's rows each time.
        let today = gpuledger_model::day_floor(now.timestamp()).clamp(day_lo, day_hi);
        let kept = self
            .settled(
                format!(
                    "idle shares {filters:?} threshold {}",
                    self.settings.idle_threshold_pct
                ),
                (day_lo, today),
                || async {
                    Ok(gpuledger_ledger::waste::FoldedShares::new(
                        self.idle_day_shares(day_lo, today, filters).await?,
                    ))
                },
            )
            .await?;
        // The settled days' shares are kept folded, never copied. The whole fleet's kept
        // shares of today serve a team filter too: it selects the shares' owner at the hour,
        // which they carry (`owned`), as the SQL's `o.team IN (...)` does.
        let from_kept = self.keeps_live()
            && Filters {
                team: Vec::new(),
                ..filters.clone()
            }
            .is_empty();
        let owned = |s: &&IdleShare| filters.team.is_empty() || filters.team.contains(&s.owner);
        let mut live: Vec<IdleShare> = Vec::new();
        let mut today_kept = None;
        if today < day_hi {
            if from_kept && day_hi - today == DAY_SECS {
                today_kept = Some(self.idle_day_shares_kept(today).await?);
            } else {
                live.extend(self.idle_day_shares(today, day_hi, filters).await?);
            }
        }
        let today_kept = today_kept.unwrap_or_default();
        let mut outside = Vec::new();
        let mut ahead = None;
        let ends_now = window.to >= now.timestamp();
        for (last_edge, by_day, (e_lo, e_hi), (o_lo, o_hi)) in [
            (false, first, e1, (day_lo, e1.0)),
            (true, last, e2, (e2.1, day_hi)),
        ] {
            if by_day && last_edge && ends_now && from_kept {
                // The hours ahead of the clock, the same for every window ending now.
                ahead = Some(self.idle_shares_kept(o_lo, o_hi, now).await?);
            } else if by_day {
                outside.extend(self.idle_shares_unrolled(o_lo, o_hi, filters, now).await?);
            } else if e_lo < e_hi {
                live.extend(self.idle_shares_unrolled(e_lo, e_hi, filters, now).await?);
            }
        }
        let ahead = ahead.unwrap_or_default();
        Ok(kept.first_less(
            today_kept.iter().filter(owned).chain(&live),
            outside.iter().chain(ahead.iter().filter(owned)),
            n,
        ))
    }

    /// The whole fleet's allocated-and-idle shares of `[lo, hi)` ([`Store::idle_shares_unrolled`])
    /// kept between requests on PostgreSQL (`crate::live`), for the hours ahead of the clock
    /// that the allocated-idle workloads take out of today's day rows: at 100,000 GPUs a read
    /// of the open allocations and their hours there, a tenth of a second at each request.
    /// Read again: the GPUs whose hours in `[lo, hi)`, or whose day rows from `lo`'s day on
    /// (which pick the GPUs walked), were written since, and those with an allocation (on them
    /// or their MIG instances) written since; a removed allocation, a changed owner period or
    /// rate reads the whole answer again (migrations 22 and 23).
    async fn idle_shares_kept(
        &self,
        lo: i64,
        hi: i64,
        now: DateTime<Utc>,
    ) -> Result<std::sync::Arc<Vec<IdleShare>>> {
        let changed = format!(
            "SELECT string_agg(CAST(gpu_id AS TEXT), ',') FROM (\
             SELECT h.gpu_id FROM gpu_hours h WHERE h.hour >= $2 AND h.hour < $3 AND {} \
             UNION SELECT d.gpu_id FROM gpu_days d WHERE d.day >= $2 - ($2 % 86400) \
               AND d.day < $3 AND {} \
             UNION SELECT COALESCE(m.parent, al.gpu_id) AS gpu_id FROM allocations al {}\
             WHERE {}) f",
            crate::live::written_since("h"),
            crate::live::written_since("d"),
            crate::query::MIG_PARENTS,
            crate::live::written_since("al"),
        );
        let all = &Filters::default();
        self.live_rows(
            &self.live.idle_ahead,
            format!(
                "allocated-idle shares of hours {lo}..{hi} threshold {}",
                self.settings.idle_threshold_pct
            ),
            &changed,
            &[lo, hi],
            idle_share_order,
            |only| async move {
                match only {
                    None => self.idle_shares_unrolled(lo, hi, all, now).await,
                    Some(ids) => {
                        let held = crate::query::HELD_IDLE_OF_GPUS
                            .replace("{ids}", &crate::live::id_array(&ids));
                        self.idle_shares_of(&held, lo, hi, all).await
                    }
                }
            },
        )
        .await
    }

    /// The whole fleet's allocated-and-idle day rows of day `day` ([`Store::idle_day_shares`])
    /// kept between requests on PostgreSQL (`crate::live`): at 100,000 GPUs today's are a read
    /// of tens of thousands of rows, 0.08 s at each request of the Overview, the Waste page and
    /// the savings. Read again: the GPUs whose rows of that day or day row were written since
    /// (a re-roll writes a GPU-day's rows anew, and one that leaves none changes its day row's
    /// allocated-idle hours), and those with an allocation (on them or their MIG instances)
    /// written since; a removed allocation or day row, a changed owner period or rate reads
    /// the whole answer again (migrations 22 and 23).
    async fn idle_day_shares_kept(&self, day: i64) -> Result<std::sync::Arc<Vec<IdleShare>>> {
        let changed = crate::query::day_table_changed("gpu_day_idle");
        let all = &Filters::default();
        self.live_rows(
            &self.live.idle_today,
            format!(
                "allocated-idle day rows of {day} threshold {}",
                self.settings.idle_threshold_pct
            ),
            &changed,
            &[day],
            idle_share_order,
            |only| async move {
                self.idle_day_shares_of(day, day + DAY_SECS, all, only.as_deref())
                    .await
            },
        )
        .await
    }

    /// The allocated-and-idle day rows of the days `[lo, hi)` per workload, allocating team,
    /// owner and GPU, of the GPUs matching `filters` (by the owner period of the rows).
    async fn idle_day_shares(&self, lo: i64, hi: i64, filters: &Filters) -> Result<Vec<IdleShare>> {
        self.idle_day_shares_of(lo, hi, filters, None).await
    }

    /// [`Store::idle_day_shares`], of the GPUs `only` alone where given (PostgreSQL only: they
    /// are written in place as an array).
    async fn idle_day_shares_of(
        &self,
        lo: i64,
        hi: i64,
        filters: &Filters,
        only: Option<&[i64]>,
    ) -> Result<Vec<IdleShare>> {
        if lo >= hi {
            return Ok(Vec::new());
        }
        let (clause, binds) = filters.clause_with(3, "o");
        let clause = match only {
            Some(ids) => format!(
                "{clause} AND d.gpu_id = ANY({})",
                crate::live::id_array(ids)
            ),
            None => clause,
        };
        let sql = format!(
            "SELECT d.workload, MIN(d.kind) AS kind, d.team AS used_by, o.team AS owner, \
             d.gpu_id, g.usd_per_hour, CAST(SUM(d.hours) AS DOUBLE PRECISION) AS hours \
             FROM gpu_day_idle d JOIN gpus g ON g.id = d.gpu_id \
             JOIN gpu_owners o ON o.gpu_id = d.gpu_id AND o.from_ts = d.owner_from \
             WHERE d.day >= $1 AND d.day < $2{clause} \
             GROUP BY d.workload, d.team, o.team, d.gpu_id, g.usd_per_hour"
        );
        let sql = self.wide_sql(&sql, &IDLE_SHARE_COLUMNS, "");
        let sql = self.sql(&sql);
        let mut q = sqlx::query_scalar(&sql).persistent(false).bind(lo).bind(hi);
        for b in &binds {
            q = q.bind(b.clone());
        }
        Ok(
            Self::wide_rows::<IdleShareRow>(q.fetch_one(self.pool()).await?)?
                .into_iter()
                .map(IdleShare::from)
                .collect(),
        )
    }

    /// [`Store::idle_workloads`] computed from the allocations for the whole window, never
    /// from the day rollup: the reference the rollup is tested against.
    #[doc(hidden)]
    pub async fn idle_workloads_unrolled(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<IdleWorkload>> {
        let (lo, hi) = window.hours(now.timestamp());
        let shares = self.idle_shares_unrolled(lo, hi, filters, now).await?;
        Ok(gpuledger_ledger::waste::idle_workloads(&shares))
    }

    /// Allocated-and-idle hours per workload and GPU in the clock hours `[lo, hi)`, from the
    /// allocations ([`held_idle`]).
    async fn idle_shares_unrolled(
        &self,
        lo: i64,
        hi: i64,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<IdleShare>> {
        let by_end = self.allocations_by_end(lo, hi, now).await?;
        self.idle_shares_with(lo, hi, filters, by_end).await
    }

    /// [`Store::idle_shares_unrolled`] with the allocations found by end or by start
    /// ([`held_idle`]).
    pub(crate) async fn idle_shares_with(
        &self,
        lo: i64,
        hi: i64,
        filters: &Filters,
        by_end: bool,
    ) -> Result<Vec<IdleShare>> {
        self.idle_shares_of(held_idle(by_end), lo, hi, filters)
            .await
    }

    /// [`Store::idle_shares_with`] after the CTEs `held_idle` ([`held_idle`] or
    /// [`crate::query::HELD_IDLE_OF_GPUS`]).
    async fn idle_shares_of(
        &self,
        held_idle: &str,
        lo: i64,
        hi: i64,
        filters: &Filters,
    ) -> Result<Vec<IdleShare>> {
        let (clause, binds) = filters.clause_with(4, "o");
        let join = owner_join("x.gpu_id", "x.hour");
        let sql = format!(
            "{held_idle} SELECT x.workload, MIN(x.kind) AS kind, x.team AS used_by, \
             o.team AS owner, x.gpu_id, g.usd_per_hour, \
             CAST(SUM(1.0 / n.n) AS DOUBLE PRECISION) AS hours \
             FROM x JOIN n ON n.gpu_id = x.gpu_id AND n.hour = x.hour \
             JOIN gpus g ON g.id = x.gpu_id{join} WHERE 1 = 1{clause} \
             GROUP BY x.workload, x.team, o.team, x.gpu_id, g.usd_per_hour"
        );
        let sql = self.wide_sql(&sql, &IDLE_SHARE_COLUMNS, "");
        let sql = self.sql(&sql);
        let mut q = sqlx::query_scalar(&sql)
            .persistent(false)
            .bind(lo)
            .bind(hi)
            .bind(self.settings.idle_threshold_pct);
        for b in binds {
            q = q.bind(b);
        }
        Ok(
            Self::wide_rows::<IdleShareRow>(q.fetch_one(self.pool()).await?)?
                .into_iter()
                .map(IdleShare::from)
                .collect(),
        )
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
             a.source, a.context, a.avg_util_pct, a.avg_mem_mib \
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
            .map(|r| crate::rows::allocation_from_row(r, r.try_get("uuid")?))
            .collect()
    }
}
