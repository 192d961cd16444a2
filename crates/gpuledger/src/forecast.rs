//! `gpuledger forecast backtest`: the spend forecast (`ledger::forecast`) made as of a day of a
//! past month from the data before that day, against what the whole month cost, per team.

use anyhow::Context;
use chrono::{Datelike, Duration, NaiveDate, Utc};
use clap::{Args, Subcommand};
use gpuledger_ledger::forecast::{BASIS_DAYS, MIN_HISTORY_DAYS};
use gpuledger_ledger::GroupBy;
use gpuledger_store::{Filters, Store, Window};

#[derive(Subcommand)]
pub enum ForecastCommand {
    /// Make the month-end forecast as of day DAY of a past month from the data before that day
    /// and print, per team, its range and expected figure against the month's actual cost.
    Backtest(BacktestArgs),
}

#[derive(Args)]
pub struct BacktestArgs {
    /// Database: a SQLite file path or sqlite://PATH, or postgres://...
    #[arg(long = "db", alias = "database-url", env = "GPULEDGER_DATABASE_URL")]
    db: String,
    /// The month to test, `YYYY-MM` (default: the latest complete month with enough history
    /// before DAY).
    #[arg(long, value_parser = parse_month)]
    month: Option<NaiveDate>,
    /// The day of the month the forecast is made on, at 00:00 UTC (it reads the days before).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(2..=28))]
    day: u32,
}

fn parse_month(s: &str) -> Result<NaiveDate, String> {
    NaiveDate::parse_from_str(&format!("{s}-01"), "%Y-%m-%d")
        .map_err(|_| format!("must be a month like 2026-11, got `{s}`"))
}

fn next_month(d: NaiveDate) -> NaiveDate {
    let m = d.year() * 12 + d.month0() as i32 + 1;
    NaiveDate::from_ymd_opt(m.div_euclid(12), m.rem_euclid(12) as u32 + 1, 1).expect("day 1")
}

fn midnight(d: NaiveDate) -> chrono::DateTime<Utc> {
    d.and_hms_opt(0, 0, 0).expect("midnight").and_utc()
}

pub async fn run(command: ForecastCommand) -> anyhow::Result<()> {
    let ForecastCommand::Backtest(args) = command;
    let store = Store::open_for_tool(&args.db, gpuledger_ledger::Settings::default())
        .await
        .with_context(|| format!("opening database {}", crate::redacted(&args.db)))?;
    let out = backtest(&store, args.month, args.day).await;
    store.close().await;
    print!("{}", out?);
    Ok(())
}

/// The backtest's report: one line per team and the total.
pub async fn backtest(store: &Store, month: Option<NaiveDate>, day: u32) -> anyhow::Result<String> {
    let now = Utc::now();
    let all = Filters::default();
    let rows = store
        .forecast_days(
            Window {
                from: 0,
                to: now.timestamp(),
            },
            &all,
            now,
        )
        .await?;
    let (Some(first), Some(last)) = (
        rows.iter().map(|r| r.day).min(),
        rows.iter().map(|r| r.day).max(),
    ) else {
        anyhow::bail!("the database holds no GPU-hours: nothing to backtest");
    };
    // A month can be tested when its DAY is at least BASIS_DAYS complete days after the first
    // data and the month ended before the last (partial) day of data.
    let fits = |m: NaiveDate| {
        let as_of = m + Duration::days(i64::from(day) - 1);
        as_of - Duration::days(BASIS_DAYS) >= first && next_month(m) <= last
    };
    let month = match month {
        Some(m) if fits(m) => m,
        Some(m) => anyhow::bail!(
            "{}: the database holds {first} to {last}; a backtest needs the {BASIS_DAYS} days \
             before day {day} and the whole month (load more history, e.g. `gpuledger demo \
             --load-only --days 60`)",
            m.format("%Y-%m")
        ),
        None => {
            let mut m = NaiveDate::from_ymd_opt(last.year(), last.month(), 1).expect("day 1");
            loop {
                if fits(m) {
                    break m;
                }
                m = m.pred_opt().map_or(m, |d| d.with_day(1).expect("day 1"));
                if m < first {
                    anyhow::bail!(
                        "the database holds {first} to {last}: no month has the {BASIS_DAYS} \
                         days before day {day} and all its days (load more history, e.g. \
                         `gpuledger demo --load-only --days 60`)"
                    );
                }
            }
        }
    };
    let as_of = midnight(month + Duration::days(i64::from(day) - 1));
    let (groups, total) = store.forecast(&all, GroupBy::Team, as_of).await?;
    let actual = store
        .summary(
            Window {
                from: midnight(month).timestamp(),
                to: midnight(next_month(month)).timestamp(),
            },
            &all,
            GroupBy::Team,
            now,
        )
        .await?;
    let mut out = format!(
        "forecast made {} (from the days before it) against the actual cost of {}\n\
         method: {}\n{:<12} {:>12} {:>12} {:>12} {:>12} {:>11} {:>8}  {}\n",
        as_of.format("%Y-%m-%d 00:00 UTC"),
        month.format("%Y-%m"),
        gpuledger_ledger::forecast::METHOD,
        "team",
        "low",
        "expected",
        "high",
        "actual",
        "error",
        "error %",
        "in range",
    );
    let mut keys: Vec<&str> = groups.iter().map(|f| f.key.as_str()).collect();
    for g in &actual.groups {
        if !keys.contains(&g.key.as_str()) {
            keys.push(&g.key);
        }
    }
    let mut lines: Vec<(String, Option<&gpuledger_ledger::forecast::Projection>, f64)> = keys
        .iter()
        .map(|k| {
            let f = groups.iter().find(|f| f.key == *k);
            let a = actual.groups.iter().find(|g| g.key == *k);
            (
                k.to_string(),
                f.and_then(|f| f.month_end_usd.as_ref()),
                a.map_or(0.0, |a| a.cost_usd),
            )
        })
        .collect();
    lines.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
    lines.push((
        "total".into(),
        total.month_end_usd.as_ref(),
        actual.total.cost_usd,
    ));
    for (key, p, actual) in lines {
        match p {
            Some(p) => {
                let err = p.expected - actual;
                let pct = if actual > 0.0 {
                    format!("{:+.1}", err / actual * 100.0)
                } else {
                    "unknown".into()
                };
                out.push_str(&format!(
                    "{key:<12} {:>12.2} {:>12.2} {:>12.2} {actual:>12.2} {err:>+11.2} {pct:>8}  {}\n",
                    p.low,
                    p.expected,
                    p.high,
                    if p.low <= actual && actual <= p.high { "yes" } else { "no" },
                ));
            }
            None => out.push_str(&format!(
                "{key:<12} {:>12} {:>12} {:>12} {actual:>12.2} {:>11} {:>8}  (under {MIN_HISTORY_DAYS} days of history or no rate)\n",
                "unknown", "unknown", "unknown", "unknown", "unknown"
            )),
        }
    }
    Ok(out)
}
