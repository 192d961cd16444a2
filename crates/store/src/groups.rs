//! Rollups per owner group (migration 16): per UTC day (`group_days`) and hour (`group_hours`)
//! and group of (owner team and environment, cloud, cluster, model, vendor), what the fleet-wide
//! per-day and per-hour figures read for the days they cover instead of one row per GPU.
//!
//! They are exact by construction rather than by upkeep: a day listed in `group_dirty` is read
//! from the per-GPU rows, as if there were no group rows; [`Store::refresh_groups`] rebuilds a
//! dirty day's group rows from the per-GPU rows and takes it off the list in one transaction.
//! Every re-roll of day rows lists its days ([`MARK_DIRTY`]); database triggers list the days a
//! changed group attribute, rate or owner period of a GPU, or a removed day row, touches. The
//! day of `now` is never rebuilt whole: it is only ever a window's partial edge, read from its
//! hours. On PostgreSQL its finished hours are built one by one instead
//! ([`Store::refresh_group_hours`]) and listed in `group_clean_hours` (migration 24), which
//! triggers keep exact by taking an hour off at any change to what its group rows sum; an
//! hour listed there is read from its group rows though its day is listed dirty.
//! How often a day is rebuilt is the caller's choice (`serve` paces it, see its maintenance);
//! it changes how fast the pages are, never what they show.

use gpuledger_model::{day_floor, hour_floor, DAY_SECS, HOUR_SECS};

use crate::{Backend, Filters, Result, Store};

/// List the days of GPUs `IDS`' day rows in `[$1, $2)` as dirty (run after re-rolling them).
pub(crate) const MARK_DIRTY: &str =
    "INSERT INTO group_dirty (day) SELECT DISTINCT day FROM gpu_days \
     WHERE gpu_id IN (IDS) AND day >= $1 AND day < $2 ON CONFLICT (day) DO NOTHING";

/// The group key of owner period `o` of GPU `g`: each value as `<length>:<value>`, `-` for
/// none, so distinct groups never share a key.
const GKEY: &str = "CAST(LENGTH(o.team) AS TEXT) || ':' || o.team \
     || CAST(LENGTH(o.env) AS TEXT) || ':' || o.env \
     || CAST(LENGTH(g.model) AS TEXT) || ':' || g.model \
     || COALESCE(CAST(LENGTH(g.cloud) AS TEXT) || ':' || g.cloud, '-') \
     || COALESCE(CAST(LENGTH(g.cluster) AS TEXT) || ':' || g.cluster, '-') \
     || COALESCE(CAST(LENGTH(g.vendor) AS TEXT) || ':' || g.vendor, '-')";

/// The owner periods of physical GPUs overlapping the day `[$1, $2)`.
const PERIODS: &str = "FROM gpu_owners o JOIN gpus g ON g.id = o.gpu_id \
     WHERE o.from_ts < $2 AND o.to_ts > $1 AND g.mig_parent_uuid IS NULL";

/// Make the groups of the day `[$1, $2)`'s owner periods that are missing.
fn new_groups_sql() -> String {
    format!(
        "INSERT INTO fleet_groups (gkey, team, env, cloud, cluster, model, vendor) \
         SELECT DISTINCT {GKEY}, o.team, o.env, g.cloud, g.cluster, g.model, g.vendor \
         {PERIODS} ON CONFLICT (gkey) DO NOTHING"
    )
}

/// Each owner period of the day `[$1, $2)` with its group and its GPU's rate (`m`).
fn periods_sql() -> String {
    format!(
        "SELECT o.gpu_id AS gpu_id, o.from_ts AS from_ts, o.to_ts AS to_ts, fg.id AS grp, \
         g.usd_per_hour AS rate {} ",
        PERIODS.replacen(
            "WHERE",
            &format!("JOIN fleet_groups fg ON fg.gkey = {GKEY} WHERE"),
            1
        )
    )
}

/// The day `$1`'s group rows from its day rows, leaving out the GPU-days a change of owner
/// splits (an owner period starting inside the day, not at its midnight).
fn day_rows_sql() -> String {
    format!(
        "INSERT INTO group_days (day, grp, gpus, present, known, idle, alloc, act, cost, unpriced) \
         SELECT d.day, m.grp, COUNT(*), SUM(d.present_hours), SUM(d.known_hours), \
         SUM(d.idle_hours), SUM(d.allocated_hours), SUM(d.act_sum), \
         SUM(CASE WHEN m.rate IS NULL THEN 0 ELSE d.present_hours * m.rate END), \
         SUM(CASE WHEN m.rate IS NULL THEN d.present_hours ELSE 0 END) \
         FROM ({}) m JOIN gpu_days d ON d.gpu_id = m.gpu_id AND d.day = $1 \
         WHERE m.from_ts <= $1 AND m.to_ts > $1 AND NOT EXISTS (\
           SELECT 1 FROM gpu_owners s WHERE s.gpu_id = m.gpu_id AND s.from_ts > $1 \
           AND s.from_ts < $2) \
         GROUP BY d.day, m.grp",
        periods_sql()
    )
}

/// The day `[$1, $2)`'s hourly group rows from its hour rows, each hour under its owner's
/// group; `$3` is the idle threshold.
fn hour_rows_sql() -> String {
    format!(
        "INSERT INTO group_hours (hour, grp, present, known, idle, alloc, act) \
         SELECT h.hour, m.grp, COUNT(*), SUM(CASE WHEN h.act_n > 0 THEN 1 ELSE 0 END), \
         SUM(CASE WHEN h.act_n > 0 AND h.act_sum < $3 * h.act_n THEN 1 ELSE 0 END), \
         SUM(h.allocated), SUM(CASE WHEN h.act_n > 0 THEN h.act_sum / h.act_n ELSE 0 END) \
         FROM ({}) m JOIN gpu_hours h ON h.gpu_id = m.gpu_id AND h.hour >= $1 AND h.hour < $2 \
         AND h.hour >= m.from_ts AND h.hour < m.to_ts \
         GROUP BY h.hour, m.grp",
        periods_sql()
    )
}

/// Whole days of a window answered by the group rows: `group_days gd` of the days in
/// `[$1, $2)` not listed dirty, joined to their group `fg` (append the filters' clause).
pub(crate) const CLEAN_DAYS: &str = "FROM group_days gd JOIN fleet_groups fg ON fg.id = gd.grp \
     WHERE gd.day >= $1 AND gd.day < $2 \
     AND NOT EXISTS (SELECT 1 FROM group_dirty x WHERE x.day = gd.day)";

/// Hours of a window answered by the group rows: `group_hours gh` of the hours in the whole
/// days `[$1, $2)` not listed dirty, and of the hours listed clean (`group_clean_hours`,
/// migration 24) of the days listed dirty, in those days or the partial edge days (`$3..$4`,
/// `$5..$6`); joined to their group `fg` (append the filters' clause, ` AND ...`).
pub(crate) const CLEAN_HOURS: &str = "FROM (\
       SELECT g1.* FROM group_hours g1 WHERE g1.hour >= $1 AND g1.hour < $2 \
       AND NOT EXISTS (SELECT 1 FROM group_dirty x WHERE x.day = g1.hour - g1.hour % 86400) \
       UNION ALL SELECT g2.* FROM group_clean_hours c JOIN group_hours g2 ON g2.hour = c.hour \
       WHERE ((c.hour >= $1 AND c.hour < $2) OR (c.hour >= $3 AND c.hour < $4) \
         OR (c.hour >= $5 AND c.hour < $6)) \
       AND EXISTS (SELECT 1 FROM group_dirty x WHERE x.day = c.hour - c.hour % 86400)) gh \
     JOIN fleet_groups fg ON fg.id = gh.grp WHERE 1 = 1";

/// The hour rows `h` (columns `gpu_id`, `hour`, `act_n`, `act_sum`, `allocated`) a window's
/// per-hour figures read from the per-GPU rows, each with its range `r` (`r.lo`, `r.hi`; the
/// caller keeps `h.hour >= r.lo AND h.hour < r.hi`): its partial edge days (`$3..$4`,
/// `$5..$6`) and its whole days in `[$1, $2)` listed dirty, less the hours [`CLEAN_HOURS`]
/// reads from the group rows. On PostgreSQL each hour is a range of its own, those listed
/// clean left out, and each range is read by its own scan of the hour index (a lateral
/// subquery the planner cannot flatten: estimating a thousand ranges, it would otherwise
/// scan every hour row once and match them to the ranges). The ranges are listed before any
/// is read (`OFFSET 0`): else the planner may read every hour of today and only then drop
/// those listed clean (at 30,150 GPUs, 1.2 s for no row where all of today's were clean,
/// 55 ms listed first). SQLite lists no hour clean
/// (migration 24) and joins the ranges whole.
pub(crate) fn dirty_hour_rows(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => {
            "(SELECT s.hr AS lo, s.hr + 3600 AS hi FROM (\
               SELECT $3 AS lo, $4 AS hi UNION ALL SELECT $5, $6 \
               UNION ALL SELECT day, day + 86400 FROM group_dirty WHERE day >= $1 AND day < $2) b \
             CROSS JOIN LATERAL generate_series(b.lo, b.hi - 1, CAST(3600 AS BIGINT)) s(hr) \
             WHERE NOT EXISTS (SELECT 1 FROM group_clean_hours c \
               JOIN group_dirty x ON x.day = c.hour - c.hour % 86400 WHERE c.hour = s.hr) \
               OFFSET 0) r \
             CROSS JOIN LATERAL (SELECT h.gpu_id, h.hour, h.act_n, h.act_sum, h.allocated \
               FROM gpu_hours h WHERE h.hour >= r.lo AND h.hour < r.hi OFFSET 0) h"
        }
        Backend::Sqlite => {
            "(SELECT $3 AS lo, $4 AS hi UNION ALL SELECT $5, $6 \
             UNION ALL SELECT day, day + 86400 FROM group_dirty WHERE day >= $1 AND day < $2) r \
             CROSS JOIN gpu_hours h"
        }
    }
}

/// How long after its end an hour of today waits before the refresher builds its group rows
/// ([`Store::refresh_group_hours`]): sources push each minute or so, and their samples of an
/// hour's last minutes arrive after it ends (each would take it off the list again).
pub const CLEAN_HOUR_GRACE_SECS: i64 = 120;

/// How many hours [`Store::refresh_group_hours`] builds in one writing transaction, oldest
/// first: at 100,000 GPUs an hour takes about 0.3 s, so a start late in the day does not hold
/// the writer for all of the day's hours at once.
pub const CLEAN_HOURS_PER_BUILD: usize = 4;

impl Filters {
    /// The filters' clause on the group `fg` (every key a column of it), numbered from
    /// `first` in the order of [`Filters::clause`], so it can share that clause's binds.
    pub(crate) fn group_clause(&self, first: usize) -> String {
        self.clause_on(first, "fg", "fg").0
    }
}

impl Store {
    /// Rebuild the group rows of every dirty day before `now`'s day, newest first, each in
    /// its own writing transaction; returns how many days were rebuilt.
    pub async fn refresh_groups(&self, now_secs: i64) -> Result<usize> {
        let mut rebuilt = 0;
        for day in self.dirty_group_days_before(now_secs).await? {
            rebuilt += usize::from(self.refresh_group_day(day).await?);
        }
        Ok(rebuilt)
    }

    /// The days listed dirty before `now`'s day (the one never rebuilt), newest first.
    pub async fn dirty_group_days_before(&self, now_secs: i64) -> Result<Vec<i64>> {
        Ok(sqlx::query_scalar(
            &self.sql("SELECT day FROM group_dirty WHERE day < $1 ORDER BY day DESC"),
        )
        .bind(day_floor(now_secs))
        .fetch_all(self.pool())
        .await?)
    }

    /// Rebuild day `day`'s group rows from its per-GPU rows and take it off the dirty list,
    /// in one writing transaction; `false` when it was not listed (nothing to do).
    pub async fn refresh_group_day(&self, day: i64) -> Result<bool> {
        let _writer = self.write_lock.lock().await;
        let mut tx = self.writer_tx().await?;
        let listed = sqlx::query(&self.sql("DELETE FROM group_dirty WHERE day = $1"))
            .bind(day)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if listed == 0 {
            tx.commit().await?;
            return Ok(false);
        }
        let end = day + DAY_SECS;
        sqlx::query(&self.sql("DELETE FROM group_days WHERE day = $1"))
            .bind(day)
            .execute(&mut *tx)
            .await?;
        for sql in [
            "DELETE FROM group_hours WHERE hour >= $1 AND hour < $2",
            // The day is off the list: all of its hours are read from the group rows.
            "DELETE FROM group_clean_hours WHERE hour >= $1 AND hour < $2",
        ] {
            sqlx::query(&self.sql(sql))
                .bind(day)
                .bind(end)
                .execute(&mut *tx)
                .await?;
        }
        for sql in [new_groups_sql(), day_rows_sql()] {
            sqlx::query(&self.sql(&sql))
                .bind(day)
                .bind(end)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query(&self.sql(&hour_rows_sql()))
            .bind(day)
            .bind(end)
            .bind(self.settings.idle_threshold_pct)
            .execute(&mut *tx)
            .await?;
        // The day goes off the list of changed days: answers kept over it are read again.
        sqlx::query(crate::settled::BUMP).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Build the group rows of the finished hours of `now`'s day not listed clean, the oldest
    /// [`CLEAN_HOURS_PER_BUILD`] of them, and list them (`group_clean_hours`), in one writing
    /// transaction; returns how many hours were built (call again until none is). An hour is
    /// built once it ended [`CLEAN_HOUR_GRACE_SECS`] ago. PostgreSQL only (SQLite lists no
    /// hour clean, see migration 24): elsewhere nothing is built.
    ///
    /// Like a day's rebuild, it is exact by construction: the writers' lock is held, so every
    /// write before it is seen, and any later write to an hour takes the hour off the list
    /// (the triggers of migration 24) in the writing transaction.
    pub async fn refresh_group_hours(&self, now_secs: i64) -> Result<usize> {
        let today = day_floor(now_secs);
        let end = hour_floor(now_secs - CLEAN_HOUR_GRACE_SECS - HOUR_SECS) + HOUR_SECS;
        if self.backend() != Backend::Postgres || end <= today {
            return Ok(0);
        }
        let _writer = self.write_lock.lock().await;
        let mut tx = self.writer_tx().await?;
        // The hours to build: of today (listed dirty: the day is not rebuilt until it has
        // passed), finished, not listed clean.
        let hours: Vec<i64> = sqlx::query_scalar(
            "SELECT s.hr FROM generate_series(CAST($1 AS BIGINT), $2 - 1, CAST(3600 AS BIGINT)) \
             s(hr) WHERE EXISTS (SELECT 1 FROM group_dirty WHERE day = $1) \
             AND NOT EXISTS (SELECT 1 FROM group_clean_hours c WHERE c.hour = s.hr) \
             ORDER BY s.hr LIMIT $3",
        )
        .bind(today)
        .bind(end)
        .bind(CLEAN_HOURS_PER_BUILD as i64)
        .fetch_all(&mut *tx)
        .await?;
        // Each run of consecutive hours in one statement of each.
        let mut runs: Vec<(i64, i64)> = Vec::new();
        for h in &hours {
            match runs.last_mut() {
                Some((_, hi)) if *hi == *h => *hi += HOUR_SECS,
                _ => runs.push((*h, h + HOUR_SECS)),
            }
        }
        for (lo, hi) in runs {
            for sql in [
                "DELETE FROM group_hours WHERE hour >= $1 AND hour < $2".to_string(),
                new_groups_sql(),
            ] {
                sqlx::query(&sql)
                    .bind(lo)
                    .bind(hi)
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query(&hour_rows_sql())
                .bind(lo)
                .bind(hi)
                .bind(self.settings.idle_threshold_pct)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO group_clean_hours (hour) \
                 SELECT generate_series($1, $2 - 1, CAST(3600 AS BIGINT))",
            )
            .bind(lo)
            .bind(hi)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(hours.len())
    }

    /// The hours listed clean (`group_clean_hours`), oldest first (for tests).
    #[doc(hidden)]
    pub async fn clean_group_hours(&self) -> Result<Vec<i64>> {
        Ok(
            sqlx::query_scalar("SELECT hour FROM group_clean_hours ORDER BY hour")
                .fetch_all(self.pool())
                .await?,
        )
    }

    /// The days listed dirty (their group rows not rebuilt since they last changed).
    pub async fn dirty_group_days(&self) -> Result<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM group_dirty")
            .fetch_one(self.pool())
            .await?)
    }
}

impl Store {
    /// List every day with day rows as dirty, so every figure reads the per-GPU rows until the
    /// next refresh: the reference the group rollups are tested against.
    #[doc(hidden)]
    pub async fn mark_all_groups_dirty(&self) -> Result<()> {
        let _writer = self.write_lock.lock().await;
        let mut tx = self.writer_tx().await?;
        for sql in [
            "INSERT INTO group_dirty (day) SELECT DISTINCT day FROM gpu_days WHERE true \
             ON CONFLICT (day) DO NOTHING",
            "DELETE FROM group_clean_hours",
        ] {
            sqlx::query(sql).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
