//! The inputs of the spend and capacity forecasts (`ledger::forecast`): cost and GPU-hours per
//! UTC day and (team, env, cloud, model), summed from the rows behind the summary and the daily
//! trend ([`crate::query::window_rows`]), so the forecast's month so far is the summary's cost of
//! the same days.

use crate::groups::CLEAN_DAYS;
use crate::query::{Window, SPLIT_DAYS};
use crate::wide::Col;
use crate::{Filters, Result, Store};
use chrono::{DateTime, NaiveDate, Utc};
use gpuledger_ledger::forecast::{forecasts, inputs_from, DayRow, Forecast};
use gpuledger_ledger::GroupBy;

/// A day's sums of [`crate::query::window_rows`]' rows `u` of GPUs `g`: present GPU-hours,
/// their cost over GPUs with a rate, and the hours of GPUs without one.
const DAY_COST: &str = "CAST(SUM(u.present) AS BIGINT) AS present, \
     CAST(SUM(CASE WHEN g.usd_per_hour IS NULL THEN 0 \
       ELSE u.present * g.usd_per_hour END) AS DOUBLE PRECISION) AS cost, \
     CAST(SUM(CASE WHEN g.usd_per_hour IS NULL THEN u.present ELSE 0 END) AS BIGINT) \
       AS unpriced";

/// [`DAY_COST`]'s columns summed again over the group rows and the per-GPU rows' sums.
const SUMS: &str = "CAST(SUM(present) AS BIGINT) AS present, \
     CAST(SUM(cost) AS DOUBLE PRECISION) AS cost, CAST(SUM(unpriced) AS BIGINT) AS unpriced";

/// The days a forecast as of `now` reads: from [`inputs_from`] to `now`.
/// The start of a row's day, in unix seconds.
fn day_start(r: &DayRow) -> i64 {
    r.day
        .and_hms_opt(0, 0, 0)
        .map(|d| d.and_utc().timestamp())
        .unwrap_or(i64::MIN)
}

fn inputs_window(now: DateTime<Utc>) -> Window {
    let from = inputs_from(now)
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc()
        .timestamp();
    Window {
        from,
        to: now.timestamp(),
    }
}

/// One row of day sums ([`DAY_COST`]) at `t` per (team, env, cloud, model), read wide
/// (`crate::wide`, [`GROUPED_COLUMNS`]).
#[derive(serde::Deserialize)]
struct GroupedDay(
    i64,
    String,
    String,
    Option<String>,
    String,
    i64,
    #[serde(deserialize_with = "crate::wide::real")] f64,
    i64,
);

/// The columns of [`GroupedDay`].
const GROUPED_COLUMNS: [Col; 8] = [
    Col::Plain("t"),
    Col::Plain("team"),
    Col::Plain("env"),
    Col::Plain("cloud"),
    Col::Plain("model"),
    Col::Plain("present"),
    Col::Real("cost"),
    Col::Plain("unpriced"),
];

/// One row of day sums ([`DAY_COST`]) at `t` of the one group of the total, read wide
/// ([`TOTAL_COLUMNS`]).
#[derive(serde::Deserialize)]
struct TotalDay(
    i64,
    i64,
    #[serde(deserialize_with = "crate::wide::real")] f64,
    i64,
);

/// The columns of [`TotalDay`].
const TOTAL_COLUMNS: [Col; 4] = [
    Col::Plain("t"),
    Col::Plain("present"),
    Col::Real("cost"),
    Col::Plain("unpriced"),
];

impl From<GroupedDay> for DayRow {
    fn from(r: GroupedDay) -> Self {
        DayRow {
            day: DateTime::from_timestamp(r.0, 0)
                .map(|d| d.date_naive())
                .unwrap_or(NaiveDate::MIN),
            team: r.1,
            env: r.2,
            cloud: r.3,
            model: r.4,
            gpu_hours: r.5,
            cost_usd: r.6,
            unpriced_gpu_hours: r.7,
        }
    }
}

impl From<TotalDay> for DayRow {
    fn from(r: TotalDay) -> Self {
        GroupedDay(
            r.0,
            String::new(),
            String::new(),
            None,
            String::new(),
            r.1,
            r.2,
            r.3,
        )
        .into()
    }
}

/// Today's forecast rows, summed from today's per-GPU rows `today`
/// (`ledger::forecast::day_rows`).
pub(crate) fn todays_day_rows(
    now: DateTime<Utc>,
    today: &[gpuledger_ledger::GpuWindow],
) -> Vec<DayRow> {
    let start = gpuledger_model::day_floor(now.timestamp());
    let day = DateTime::from_timestamp(start, 0)
        .unwrap_or_default()
        .date_naive();
    gpuledger_ledger::forecast::day_rows(day, today)
}

impl Store {
    /// Per UTC day of the window and (owner team and env at the hour, cloud, model): present
    /// GPU-hours, their cost over GPUs with a rate, and the hours of GPUs without one. Team
    /// and environment filters select the owner at the hour, as in the summary. Where the
    /// window runs to now from a day before ([`Store::shares_today`]), today's rows are summed
    /// from today's per-GPU rows (`ledger::forecast::day_rows` over [`Store::todays_windows`],
    /// kept between requests on PostgreSQL), as the Overview sums them, instead of read from
    /// today's day rows less the hours ahead of the clock at each request (at 100,000 GPUs,
    /// 0.35 to 0.65 s).
    pub async fn forecast_days(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<DayRow>> {
        let share = Self::shares_today(window, now);
        let days = self.split_at_today_with(
            format!("forecast days {filters:?}"),
            window,
            now,
            day_start,
            |w| self.forecast_days_read(w, filters, now),
            share,
        );
        self.with_todays_rows(days, share, window, filters, now)
            .await
    }

    /// The day rows `before` (without today's where `share`), and where `share` today's summed
    /// from today's per-GPU rows in `window` ([`Store::todays_windows`]), both read at once.
    async fn with_todays_rows(
        &self,
        before: impl std::future::Future<Output = Result<Vec<DayRow>>>,
        share: bool,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<DayRow>> {
        let (mut days, today) = tokio::try_join!(before, async {
            if share {
                self.todays_windows(window, filters, now).await
            } else {
                Ok(Vec::new())
            }
        })?;
        if share {
            days.extend(todays_day_rows(now, &today));
        }
        Ok(days)
    }

    /// [`Store::forecast_days`] read at once.
    async fn forecast_days_read(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<DayRow>> {
        // Whole days from the group rollups, except the days listed dirty and the GPU-days a
        // change of owner splits; those and the edges from the per-GPU rows.
        let (binds_at, union) = crate::query::dirty_window_rows(window, now, true);
        let (clause, binds) = filters.clause_with(8, "o");
        let groups = filters.group_clause(8);
        let sql = format!(
            "WITH {SPLIT_DAYS} \
             SELECT t, team, env, cloud, model, {SUMS} FROM (\
               SELECT gd.day AS t, fg.team AS team, fg.env AS env, fg.cloud AS cloud, \
               fg.model AS model, gd.present AS present, gd.cost AS cost, \
               gd.unpriced AS unpriced {CLEAN_DAYS}{groups} \
               UNION ALL \
               SELECT u.t AS t, o.team AS team, o.env AS env, g.cloud AS cloud, g.model AS model, \
               {DAY_COST} \
               FROM ({union}) u JOIN gpus g ON g.id = u.gpu_id \
               JOIN gpu_owners o ON o.gpu_id = u.gpu_id AND o.from_ts = u.o_from \
               WHERE g.mig_parent_uuid IS NULL{clause} \
               GROUP BY u.t, o.team, o.env, g.cloud, g.model) s \
             GROUP BY t, team, env, cloud, model"
        );
        let sql = self.wide_sql(&sql, &GROUPED_COLUMNS, "j.t");
        let rows: Vec<GroupedDay> = self.fetch_window_wide(&sql, binds_at, binds).await?;
        Ok(rows.into_iter().map(DayRow::from).collect())
    }

    /// The total's forecast alone (what the Overview and a team's page show), as
    /// [`Store::forecast`]'s total: without a team or environment filter the days are summed
    /// without the owner periods (as the daily trend's fast path does), which gives the same
    /// days at a fraction of the work.
    ///
    /// Today's rows are summed from today's per-GPU rows (kept between requests on
    /// PostgreSQL), as [`Store::forecast_days`] and the Overview sum them: a team's page read
    /// today's day rows of every GPU less the hours ahead to keep the team's (at 100,350 GPUs,
    /// 0.4 s of its 0.5).
    pub async fn forecast_total(&self, filters: &Filters, now: DateTime<Utc>) -> Result<Forecast> {
        let window = inputs_window(now);
        let share = Self::shares_today(window, now);
        let days = self.forecast_total_days_with(filters, now, share);
        let rows = self
            .with_todays_rows(days, share, window, filters, now)
            .await?;
        Ok(forecasts(&rows, GroupBy::Team, now).1)
    }

    /// The day rows of [`Store::forecast_total`], without today's where `today_apart`
    /// ([`Store::split_at_today_with`]).
    pub(crate) async fn forecast_total_days_with(
        &self,
        filters: &Filters,
        now: DateTime<Utc>,
        today_apart: bool,
    ) -> Result<Vec<DayRow>> {
        let window = inputs_window(now);
        if filters.by_owner() {
            return self
                .split_at_today_with(
                    format!("forecast days {filters:?}"),
                    window,
                    now,
                    day_start,
                    |w| self.forecast_days_read(w, filters, now),
                    today_apart,
                )
                .await;
        }
        self.split_at_today_with(
            format!("forecast total days {filters:?}"),
            window,
            now,
            day_start,
            |w| self.forecast_total_days(w, filters, now),
            today_apart,
        )
        .await
    }

    /// The days of [`Store::forecast_total`] without a team or environment filter, read at
    /// once.
    async fn forecast_total_days(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<DayRow>> {
        let (binds_at, union) = crate::query::dirty_window_rows(window, now, false);
        let (clause, binds) = filters.clause(8);
        let groups = filters.group_clause(8);
        let sql = format!(
            "WITH {SPLIT_DAYS} \
             SELECT t, {SUMS} FROM (\
               SELECT gd.day AS t, gd.present AS present, gd.cost AS cost, \
               gd.unpriced AS unpriced {CLEAN_DAYS}{groups} \
               UNION ALL \
               SELECT u.t AS t, {DAY_COST} \
               FROM ({union}) u JOIN gpus g ON g.id = u.gpu_id \
               WHERE g.mig_parent_uuid IS NULL{clause} GROUP BY u.t) s \
             GROUP BY t"
        );
        let sql = self.wide_sql(&sql, &TOTAL_COLUMNS, "j.t");
        let rows: Vec<TotalDay> = self.fetch_window_wide(&sql, binds_at, binds).await?;
        Ok(rows.into_iter().map(DayRow::from).collect())
    }

    /// The forecasts as of `now` per group of `by` and of the total (`ledger::forecast`), over
    /// the days they read ([`inputs_from`] to `now`).
    pub async fn forecast(
        &self,
        filters: &Filters,
        by: GroupBy,
        now: DateTime<Utc>,
    ) -> Result<(Vec<Forecast>, Forecast)> {
        let window = inputs_window(now);
        let rows = self.forecast_days(window, filters, now).await?;
        Ok(forecasts(&rows, by, now))
    }
}
