//! Spend and capacity forecasts: month-end, next-month and next-quarter spend with a range, and
//! the GPU-hours demand trend, from daily cost and GPU-hours per group.
//!
//! The store gives one [`DayRow`] per UTC day and (team, env, cloud, model) from the same rows
//! the summary and the daily trend sum, so the month so far here is the summary's cost of the
//! same days. Every forecast figure is defined once, here (`docs/definitions.md`, "forecast"):
//!
//! - **Basis**: the group's last [`BASIS_DAYS`] complete UTC days before today, from its first
//!   day with a GPU-hour on (days after that without any count as $0: its GPUs were gone).
//!   Fewer than [`MIN_HISTORY_DAYS`] such days: no forecast ("not enough history"), never $0.
//! - **A day's projection** is by its kind, weekday (Monday–Friday) or weekend: expected = the
//!   mean cost of the basis days of that kind; low and high = their 10th and 90th percentiles
//!   (linear interpolation between ranks). Projecting every remaining day at the same
//!   percentile treats a high or low spell as lasting, which is how fleet spend moves (its
//!   level shifts with GPUs added or stopped), so the band is wide rather than falsely narrow.
//! - **Month end** = the month so far (today's hours included) + the rest of today (the
//!   expected day × the share of today's hours still to come) + each later day of the month.
//! - **Next month** and **next quarter** (the calendar quarter after the current one) = each of
//!   their days projected the same way: the current run rate, no growth assumed.
//! - **Demand trend**: the least-squares slope of daily GPU-hours over the basis days, in
//!   GPU-hours per day per day and as % of the basis mean per 30 days.
//! - Unpriced GPU-hours are left out of every $ figure and reported; a group whose basis has
//!   no priced GPU-hour gets no $ projection.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, Duration, NaiveDate, Utc, Weekday};
use gpuledger_model::UNKNOWN;
use serde::Serialize;

use crate::summary::{round, GpuWindow, GroupBy};

/// Complete days a forecast reads at most.
pub const BASIS_DAYS: i64 = 28;
/// Complete days of history a group needs for a forecast.
pub const MIN_HISTORY_DAYS: i64 = 7;
/// The percentiles of same-kind days that bound the range.
pub const LOW_PCT: f64 = 10.0;
pub const HIGH_PCT: f64 = 90.0;

/// How every forecast is made, in a sentence (the API's `basis.method`, the pages' hover text).
pub const METHOD: &str = "Each remaining day is projected by its kind (weekday or weekend): \
     expected = the mean cost of that kind of day over the last 28 complete UTC days, low and \
     high = their 10th and 90th percentiles; month end = month so far + the rest of today + \
     the later days. Next month and next quarter: every day at the same run rate. Unpriced \
     GPU-hours are left out of every $ figure.";

/// One UTC day's figures of one (team, env, cloud, model) as the store reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct DayRow {
    pub day: NaiveDate,
    pub team: String,
    pub env: String,
    pub cloud: Option<String>,
    pub model: String,
    pub gpu_hours: i64,
    /// Σ present hours × rate over the GPUs with a rate.
    pub cost_usd: f64,
    /// Present hours of GPUs without a rate.
    pub unpriced_gpu_hours: i64,
}

impl DayRow {
    fn key(&self, by: GroupBy) -> String {
        match by {
            GroupBy::Team => self.team.clone(),
            GroupBy::Env => self.env.clone(),
            GroupBy::Cloud => self.cloud.clone().unwrap_or_else(|| UNKNOWN.to_string()),
            GroupBy::Model => self.model.clone(),
            // Not in a day row: everything is one group.
            GroupBy::Cluster | GroupBy::Vendor => UNKNOWN.to_string(),
        }
    }
}

/// One day of a group: the sums of its rows.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Day {
    pub day: NaiveDate,
    pub gpu_hours: i64,
    pub cost_usd: f64,
    pub unpriced_gpu_hours: i64,
}

/// A projection with its range.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Band {
    pub low: f64,
    pub expected: f64,
    pub high: f64,
}

impl Band {
    fn add(self, o: Band) -> Band {
        Band {
            low: self.low + o.low,
            expected: self.expected + o.expected,
            high: self.high + o.high,
        }
    }

    fn scale(self, f: f64) -> Band {
        Band {
            low: self.low * f,
            expected: self.expected * f,
            high: self.high * f,
        }
    }

    fn rounded(self) -> Band {
        Band {
            low: round(self.low, 2),
            expected: round(self.expected, 2),
            high: round(self.high, 2),
        }
    }

    const ZERO: Band = Band {
        low: 0.0,
        expected: 0.0,
        high: 0.0,
    };
}

/// A projection over the days `[from, to)`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Projection {
    pub from: NaiveDate,
    /// The first day after it.
    pub to: NaiveDate,
    pub low: f64,
    pub expected: f64,
    pub high: f64,
}

impl Projection {
    fn of(from: NaiveDate, to: NaiveDate, b: Band) -> Projection {
        let b = b.rounded();
        Projection {
            from,
            to,
            low: b.low,
            expected: b.expected,
            high: b.high,
        }
    }
}

/// The GPU-hours demand trend over the basis days.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Demand {
    /// Mean GPU-hours per day over the basis days.
    pub gpu_hours_per_day: f64,
    /// Least-squares slope: the change of daily GPU-hours per day.
    pub slope_gpu_hours_per_day: f64,
    /// The slope over 30 days as % of the mean; `None` when the mean is 0.
    pub pct_per_month: Option<f64>,
}

/// What a forecast rests on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Basis {
    /// The complete days read: `[from, to)`; `to` is today.
    pub from: NaiveDate,
    pub to: NaiveDate,
    pub days: i64,
    pub weekdays: i64,
    pub weekend_days: i64,
    pub method: &'static str,
}

/// One day of the current month: what it cost (today: so far), and for today and later days
/// the projected full day.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MonthDay {
    pub date: NaiveDate,
    /// `None` for days still to come.
    pub actual_usd: Option<f64>,
    /// Today's (its hours so far + the rest) and each later day's projection; `None` before today.
    pub forecast_usd: Option<Band>,
}

/// Every forecast figure of one group (or the total).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Forecast {
    pub key: String,
    /// Cost of the current UTC month so far (today's hours included), over GPUs with a rate.
    pub month_to_date_usd: f64,
    /// GPU-hours of the month so far without a rate: left out of every $ figure.
    pub unpriced_gpu_hours: i64,
    pub month_end_usd: Option<Projection>,
    pub next_month_usd: Option<Projection>,
    pub next_quarter_usd: Option<Projection>,
    pub demand: Option<Demand>,
    /// Why there is no projection (`None` when there is).
    pub note: Option<String>,
    pub basis: Basis,
    pub month_days: Vec<MonthDay>,
}

/// The first day a forecast as of `now` reads: the basis's first possible day or the month's
/// first, whichever is earlier. Its inputs are the days from there to `now`.
pub fn inputs_from(now: DateTime<Utc>) -> NaiveDate {
    let today = now.date_naive();
    (today - Duration::days(BASIS_DAYS)).min(month_start(today))
}

/// The rows summed per day and group key of `by`.
pub fn group_days(rows: &[DayRow], by: Option<GroupBy>) -> BTreeMap<String, Vec<Day>> {
    let mut acc: BTreeMap<String, BTreeMap<NaiveDate, Day>> = BTreeMap::new();
    for r in rows {
        let key = by.map_or_else(|| "total".to_string(), |b| r.key(b));
        let d = acc.entry(key).or_default().entry(r.day).or_insert(Day {
            day: r.day,
            ..Default::default()
        });
        d.gpu_hours += r.gpu_hours;
        d.cost_usd += r.cost_usd;
        d.unpriced_gpu_hours += r.unpriced_gpu_hours;
    }
    acc.into_iter()
        .map(|(k, days)| (k, days.into_values().collect()))
        .collect()
}

/// The day rows of `day` from per-GPU windows over that day alone, one per (team, env, cloud,
/// model): present hours, their cost over the GPUs with a rate ([`GpuWindow::cost_usd`]) and
/// the hours of GPUs without one, as the store sums them from its day rows.
pub fn day_rows(day: NaiveDate, windows: &[GpuWindow]) -> Vec<DayRow> {
    type Key<'a> = (&'a str, &'a str, Option<&'a str>, &'a str);
    // A GPU's neighbours mostly share its row (a host's GPUs): the last row is tried first,
    // by the shared texts' addresses, before the map; the rows are then put in key order.
    let same = |a: &Key, b: &Key| {
        let text = |x: &str, y: &str| std::ptr::eq(x, y) || x == y;
        text(a.0, b.0)
            && text(a.1, b.1)
            && match (a.2, b.2) {
                (Some(x), Some(y)) => text(x, y),
                (x, y) => x.is_none() && y.is_none(),
            }
            && text(a.3, b.3)
    };
    let mut rows: Vec<(Key, DayRow)> = Vec::new();
    let mut at: foldhash::HashMap<Key, usize> = Default::default();
    let mut last: Option<(Key, usize)> = None;
    for w in windows.iter().filter(|w| w.present_hours > 0) {
        let key = (&*w.team, &*w.env, w.cloud.as_deref(), &*w.model);
        let i = match last {
            Some((k, i)) if same(&k, &key) => i,
            _ => *at.entry(key).or_insert_with(|| {
                rows.push((
                    key,
                    DayRow {
                        day,
                        team: w.team.to_string(),
                        env: w.env.to_string(),
                        cloud: w.cloud.as_deref().map(str::to_string),
                        model: w.model.to_string(),
                        gpu_hours: 0,
                        cost_usd: 0.0,
                        unpriced_gpu_hours: 0,
                    },
                ));
                rows.len() - 1
            }),
        };
        last = Some((key, i));
        let r = &mut rows[i].1;
        r.gpu_hours += w.present_hours;
        match w.cost_usd() {
            Some(c) => r.cost_usd += c,
            None => r.unpriced_gpu_hours += w.present_hours,
        }
    }
    rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    rows.into_iter().map(|(_, r)| r).collect()
}

fn is_weekend(d: NaiveDate) -> bool {
    matches!(d.weekday(), Weekday::Sat | Weekday::Sun)
}

fn month_start(d: NaiveDate) -> NaiveDate {
    d.with_day(1).expect("day 1 exists")
}

/// The first day of the month `n` months after `d`'s.
fn months_after(d: NaiveDate, n: u32) -> NaiveDate {
    let m0 = d.year() * 12 + d.month0() as i32 + n as i32;
    NaiveDate::from_ymd_opt(m0.div_euclid(12), m0.rem_euclid(12) as u32 + 1, 1)
        .expect("day 1 exists")
}

/// The `p`th percentile of `v` (sorted ascending, not empty), linear between ranks.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let pos = p / 100.0 * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Least-squares slope of `ys` over x = 0, 1, …; `None` under two points.
pub fn slope(ys: &[f64]) -> Option<f64> {
    let n = ys.len() as f64;
    if ys.len() < 2 {
        return None;
    }
    let mx = (n - 1.0) / 2.0;
    let my = ys.iter().sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (i, y) in ys.iter().enumerate() {
        let dx = i as f64 - mx;
        sxy += dx * (y - my);
        sxx += dx * dx;
    }
    Some(sxy / sxx)
}

/// A day's projection by kind, from the basis days' costs of that kind.
fn band_of(costs: &[f64]) -> Band {
    let mut s = costs.to_vec();
    s.sort_by(f64::total_cmp);
    Band {
        low: percentile(&s, LOW_PCT),
        expected: s.iter().sum::<f64>() / s.len() as f64,
        high: percentile(&s, HIGH_PCT),
    }
}

/// The forecast of one group from its days (any order, any range; days absent cost $0) as of
/// `now`.
pub fn forecast(key: &str, days: &[Day], now: DateTime<Utc>) -> Forecast {
    let today = now.date_naive();
    let m_start = month_start(today);
    let m_end = months_after(today, 1);
    let by_day: BTreeMap<NaiveDate, Day> = days.iter().map(|d| (d.day, *d)).collect();
    let in_month = by_day.range(m_start..=today).map(|(_, d)| d);
    let (mut mtd, mut unpriced) = (0.0, 0);
    for d in in_month {
        mtd += d.cost_usd;
        unpriced += d.unpriced_gpu_hours;
    }
    // The basis: complete days before today, from the group's first day with a GPU-hour. A
    // group whose history starts inside the lookback started that day part-way (the hour its
    // first source reported), so its basis starts the day after: a partial day read as a
    // whole one would pull the mean of its kind of day down.
    let lookback = today - Duration::days(BASIS_DAYS);
    let first = by_day
        .range(lookback..today)
        .find(|(_, d)| d.gpu_hours > 0)
        .map(|(day, _)| *day);
    let started_inside =
        first.is_some_and(|f| f > lookback && !by_day.range(..f).any(|(_, d)| d.gpu_hours > 0));
    let basis_from = match first {
        Some(f) if started_inside => f + Duration::days(1),
        Some(f) => f,
        None => today,
    };
    let basis: Vec<Day> = basis_from
        .iter_days()
        .take_while(|d| *d < today)
        .map(|d| {
            by_day.get(&d).copied().unwrap_or(Day {
                day: d,
                ..Default::default()
            })
        })
        .collect();
    let weekend: Vec<f64> = basis
        .iter()
        .filter(|d| is_weekend(d.day))
        .map(|d| d.cost_usd)
        .collect();
    let weekday: Vec<f64> = basis
        .iter()
        .filter(|d| !is_weekend(d.day))
        .map(|d| d.cost_usd)
        .collect();
    let n = basis.len() as i64;
    let priced = basis.iter().any(|d| d.gpu_hours > d.unpriced_gpu_hours);
    let note = if n < MIN_HISTORY_DAYS {
        Some(format!(
            "not enough history: {n} complete days with GPUs ({MIN_HISTORY_DAYS} needed)"
        ))
    } else if !priced {
        Some("no GPU-hour of the basis has a known rate: spend cannot be projected".to_string())
    } else {
        None
    };
    // Seven consecutive days hold both kinds, so both bands exist whenever `note` is `None`.
    let kinds = note
        .is_none()
        .then(|| (band_of(&weekday), band_of(&weekend)));
    let day_band = |d: NaiveDate| kinds.map(|(wd, we)| if is_weekend(d) { we } else { wd });
    let over = |from: NaiveDate, to: NaiveDate| -> Option<Band> {
        from.iter_days()
            .take_while(|d| *d < to)
            .try_fold(Band::ZERO, |acc, d| Some(acc.add(day_band(d)?)))
    };
    // Hours of today already counted: those starting in [midnight, now).
    let midnight = today.and_hms_opt(0, 0, 0).expect("midnight").and_utc();
    let elapsed_h = ((now - midnight).num_seconds() + 3599) / 3600;
    let rest_of_today = day_band(today).map(|b| b.scale((24 - elapsed_h) as f64 / 24.0));
    let tomorrow = today + Duration::days(1);
    let month_end = rest_of_today.and_then(|r| {
        let later = over(tomorrow, m_end)?;
        Some(Band::ZERO.add(r).add(later).add(Band {
            low: mtd,
            expected: mtd,
            high: mtd,
        }))
    });
    let next_m = months_after(today, 1);
    let q_start = months_after(today, 3 - today.month0() % 3);
    let q_end = months_after(q_start, 3);
    let month_days = m_start
        .iter_days()
        .take_while(|d| *d < m_end)
        .map(|d| {
            let actual = (d <= today).then(|| round(by_day.get(&d).map_or(0.0, |x| x.cost_usd), 2));
            let forecast = if d == today {
                rest_of_today.map(|r| {
                    let so_far = by_day.get(&d).map_or(0.0, |x| x.cost_usd);
                    r.add(Band {
                        low: so_far,
                        expected: so_far,
                        high: so_far,
                    })
                    .rounded()
                })
            } else if d > today {
                day_band(d).map(Band::rounded)
            } else {
                None
            };
            MonthDay {
                date: d,
                actual_usd: actual,
                forecast_usd: forecast,
            }
        })
        .collect();
    let demand = (n >= MIN_HISTORY_DAYS).then(|| {
        let hours: Vec<f64> = basis.iter().map(|d| d.gpu_hours as f64).collect();
        let mean = hours.iter().sum::<f64>() / hours.len() as f64;
        let s = slope(&hours).unwrap_or(0.0);
        Demand {
            gpu_hours_per_day: round(mean, 2),
            slope_gpu_hours_per_day: round(s, 3),
            pct_per_month: (mean > 0.0).then(|| round(s * 30.0 / mean * 100.0, 1)),
        }
    });
    Forecast {
        key: key.to_string(),
        month_to_date_usd: round(mtd, 2),
        unpriced_gpu_hours: unpriced,
        month_end_usd: month_end.map(|b| Projection::of(m_start, m_end, b)),
        next_month_usd: over(next_m, months_after(next_m, 1))
            .map(|b| Projection::of(next_m, months_after(next_m, 1), b)),
        next_quarter_usd: over(q_start, q_end).map(|b| Projection::of(q_start, q_end, b)),
        demand,
        note,
        basis: Basis {
            from: basis_from,
            to: today,
            days: n,
            weekdays: weekday.len() as i64,
            weekend_days: weekend.len() as i64,
            method: METHOD,
        },
        month_days,
    }
}

/// Forecasts per group of `by` (largest expected month end first, then key) and of the total.
pub fn forecasts(rows: &[DayRow], by: GroupBy, now: DateTime<Utc>) -> (Vec<Forecast>, Forecast) {
    let mut groups: Vec<Forecast> = group_days(rows, Some(by))
        .iter()
        .map(|(k, days)| forecast(k, days, now))
        .collect();
    groups.sort_by(|a, b| {
        let e = |f: &Forecast| f.month_end_usd.as_ref().map_or(-1.0, |p| p.expected);
        e(b).total_cmp(&e(a))
            .then(b.month_to_date_usd.total_cmp(&a.month_to_date_usd))
            .then(a.key.cmp(&b.key))
    });
    let total_days = group_days(rows, None).remove("total").unwrap_or_default();
    (groups, forecast("total", &total_days, now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> NaiveDate {
        s.parse().unwrap()
    }

    fn day(s: &str, cost: f64, hours: i64) -> Day {
        Day {
            day: d(s),
            gpu_hours: hours,
            cost_usd: cost,
            unpriced_gpu_hours: 0,
        }
    }

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn percentile_and_slope_by_hand() {
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0, 5.0], 10.0), 1.4);
        assert_eq!(percentile(&[10.0, 20.0], 90.0), 19.0);
        assert_eq!(percentile(&[7.0], 10.0), 7.0);
        assert_eq!(slope(&[1.0, 3.0, 5.0]), Some(2.0));
        assert_eq!(slope(&[4.0, 4.0, 4.0, 4.0]), Some(0.0));
        assert_eq!(slope(&[1.0]), None);
    }

    /// 2026-12-10 12:00 (a Thursday). History from 2026-11-12 (Thursday) on: weekdays cost
    /// $100 in November and $120 in December, weekends $40 and $50.
    /// Basis = 2026-11-12 ..= 2026-12-09: 28 days, 20 weekdays, 8 weekend days.
    /// Weekdays: 13 November ones (11-12,13,16..20,23..27,30) at 100, 7 December (12-01..04,
    /// 07..09) at 120: mean = (1300 + 840) / 20 = 107; sorted [100 × 13, 120 × 7]: p10 at rank
    /// 1.9 = 100, p90 at rank 17.1 = 120.
    /// Weekends: 11-14,15,21,22,28,29 at 40; 12-05,06 at 50: mean = (240 + 100) / 8 = 42.5;
    /// sorted [40 × 6, 50 × 2]: p10 at rank 0.7 = 40, p90 at rank 6.3 = 50 (ranks 6 and 7 are 50).
    #[test]
    fn month_end_by_hand() {
        let mut days = Vec::new();
        for x in d("2026-11-12")
            .iter_days()
            .take_while(|x| *x < d("2026-12-11"))
        {
            let dec = x.month() == 12;
            let cost = match (is_weekend(x), dec) {
                (false, false) => 100.0,
                (false, true) => 120.0,
                (true, false) => 40.0,
                (true, true) => 50.0,
            };
            // Today (12-10) so far: 12 of 24 hours.
            let cost = if x == d("2026-12-10") { 60.0 } else { cost };
            days.push(day(&x.to_string(), cost, 10));
        }
        let f = forecast("nlp", &days, at("2026-12-10T12:00:00Z"));
        assert_eq!(f.note, None);
        assert_eq!(
            (f.basis.days, f.basis.weekdays, f.basis.weekend_days),
            (28, 20, 8)
        );
        assert_eq!(f.basis.from, d("2026-11-12"));
        // Month so far: 12-01..09 = 7 × 120 + 2 × 50 = 940, plus today's 60.
        assert_eq!(f.month_to_date_usd, 1000.0);
        // Rest of today: half a weekday: 53.5 (50, 60). Later: 12-11..31 = 15 weekdays
        // (11, 14-18, 21-25, 28-31) and 6 weekend days (12,13,19,20,26,27).
        // expected = 1000 + 53.5 + 15 × 107 + 6 × 42.5 = 2913.5
        // low = 1000 + 50 + 15 × 100 + 6 × 40 = 2790; high = 1000 + 60 + 15 × 120 + 6 × 50 = 3160
        let me = f.month_end_usd.clone().unwrap();
        assert_eq!((me.low, me.expected, me.high), (2790.0, 2913.5, 3160.0));
        assert_eq!((me.from, me.to), (d("2026-12-01"), d("2027-01-01")));
        // January 2027: 21 weekdays, 10 weekend days: 21 × 107 + 10 × 42.5 = 2672.
        let nm = f.next_month_usd.clone().unwrap();
        assert_eq!((nm.low, nm.expected, nm.high), (2500.0, 2672.0, 3020.0));
        // Next quarter: 2027-01-01 .. 2027-04-01 (90 days: 64 weekdays, 26 weekend days).
        let nq = f.next_quarter_usd.clone().unwrap();
        assert_eq!((nq.from, nq.to), (d("2027-01-01"), d("2027-04-01")));
        assert_eq!(nq.expected, 64.0 * 107.0 + 26.0 * 42.5);
        // The month's days: actual through today, and the days' projections add up to the
        // month end.
        assert_eq!(f.month_days.len(), 31);
        assert_eq!(f.month_days[9].actual_usd, Some(60.0));
        assert_eq!(f.month_days[9].forecast_usd.unwrap().expected, 113.5);
        assert_eq!(f.month_days[10].actual_usd, None);
        let sum: f64 = f.month_days[..9]
            .iter()
            .map(|m| m.actual_usd.unwrap())
            .chain(
                f.month_days[9..]
                    .iter()
                    .map(|m| m.forecast_usd.unwrap().expected),
            )
            .sum();
        assert!((sum - me.expected).abs() < 1e-6, "{sum}");
        // Steady GPU-hours: no trend.
        let dm = f.demand.unwrap();
        assert_eq!(
            (dm.gpu_hours_per_day, dm.slope_gpu_hours_per_day),
            (10.0, 0.0)
        );
        assert_eq!(dm.pct_per_month, Some(0.0));
    }

    #[test]
    fn too_little_history_is_unknown_not_zero() {
        let days: Vec<Day> = ["2026-12-05", "2026-12-06", "2026-12-07"]
            .iter()
            .map(|s| day(s, 50.0, 24))
            .collect();
        let f = forecast("new", &days, at("2026-12-08T06:00:00Z"));
        assert_eq!(f.month_to_date_usd, 150.0);
        assert_eq!(f.month_end_usd, None);
        assert_eq!(f.next_month_usd, None);
        assert_eq!(f.next_quarter_usd, None);
        assert_eq!(f.demand, None);
        // Its first day was partial (it started that day): the basis reads the two after it.
        assert_eq!(f.basis.days, 2);
        assert!(f.note.unwrap().contains("not enough history"));
        assert!(f.month_days.iter().all(|m| m.forecast_usd.is_none()));
    }

    #[test]
    fn unpriced_hours_are_reported_and_never_projected_as_zero() {
        let days: Vec<Day> = d("2026-11-20")
            .iter_days()
            .take(18)
            .map(|x| Day {
                day: x,
                gpu_hours: 24,
                cost_usd: 0.0,
                unpriced_gpu_hours: 24,
            })
            .collect();
        let f = forecast("mystery", &days, at("2026-12-07T10:30:00Z"));
        assert_eq!(f.unpriced_gpu_hours, 24 * 7);
        assert_eq!(f.month_end_usd, None);
        assert!(f.note.unwrap().contains("no GPU-hour"));
        // The demand trend needs no rate.
        assert_eq!(f.demand.unwrap().gpu_hours_per_day, 24.0);
    }

    #[test]
    fn a_group_that_stopped_counts_its_empty_days_and_growth_shows_as_a_trend() {
        // GPU-hours 10, 20, …, 100 over ten days, then today.
        let days: Vec<Day> = d("2026-12-01")
            .iter_days()
            .take(10)
            .enumerate()
            .map(|(i, x)| Day {
                day: x,
                gpu_hours: 10 * (i as i64 + 1),
                cost_usd: 1.0,
                unpriced_gpu_hours: 0,
            })
            .collect();
        let f = forecast("grow", &days, at("2026-12-11T00:00:00Z"));
        let dm = f.demand.unwrap();
        // The group started on the 1st (a partial day): the basis is the 2nd to the 10th.
        assert_eq!(f.basis.days, 9);
        assert_eq!(dm.slope_gpu_hours_per_day, 10.0);
        assert_eq!(dm.gpu_hours_per_day, 60.0);
        assert_eq!(dm.pct_per_month, Some(round(10.0 * 30.0 / 60.0 * 100.0, 1)));
        // At midnight all of today is to come: a weekday (Friday) at $1.
        assert_eq!(f.month_days[10].forecast_usd.unwrap().expected, 1.0);
        // A group whose GPUs left three days ago: the empty days count as $0.
        let gone: Vec<Day> = d("2026-12-01")
            .iter_days()
            .take(7)
            .map(|x| day(&x.to_string(), 70.0, 24))
            .collect();
        let f = forecast("gone", &gone, at("2026-12-11T00:00:00Z"));
        assert_eq!(f.basis.days, 9);
        let me = f.month_end_usd.unwrap();
        // From 12-02 (the 1st was its partial first day): weekdays 12-02..04, 07 at $70 and
        // 08..10 at $0: mean 40, p10 0; the weekend 12-05, 06 at $70. To come (today
        // included): 15 weekdays, 6 weekend days.
        assert_eq!(
            (me.low, me.expected),
            (490.0 + 6.0 * 70.0, 490.0 + 15.0 * 40.0 + 420.0)
        );
    }

    #[test]
    fn groups_and_total_from_rows() {
        let row = |day: &str, team: &str, cost: f64, unpriced: i64| DayRow {
            day: d(day),
            team: team.into(),
            env: "prod".into(),
            cloud: None,
            model: "m".into(),
            gpu_hours: 24,
            cost_usd: cost,
            unpriced_gpu_hours: unpriced,
        };
        let mut rows = Vec::new();
        for x in d("2026-11-01").iter_days().take(39) {
            let s = x.to_string();
            rows.push(row(&s, "a", 10.0, 0));
            rows.push(row(&s, "b", 1.0, 5));
        }
        let (groups, total) = forecasts(&rows, GroupBy::Team, at("2026-12-10T00:00:00Z"));
        assert_eq!(
            groups.iter().map(|g| g.key.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(groups[0].month_to_date_usd, 90.0);
        assert_eq!(total.month_to_date_usd, 99.0);
        assert_eq!(total.unpriced_gpu_hours, 45);
        // Every day costs the same: the range is a point, 31 days × $11.
        let me = total.month_end_usd.unwrap();
        assert_eq!((me.low, me.expected, me.high), (341.0, 341.0, 341.0));
        let (by_cloud, _) = forecasts(&rows, GroupBy::Cloud, at("2026-12-10T00:00:00Z"));
        assert_eq!(by_cloud[0].key, UNKNOWN);
    }
}
