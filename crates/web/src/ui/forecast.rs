//! The forecast block of the Overview and team pages: the month's daily spend so far, the
//! projected days to month end with their range (labelled as a forecast), and the month-end,
//! next-month and next-quarter figures, as `ledger::forecast` made them. Only formatting here.

use gpuledger_ledger::forecast::{Forecast, Projection, MIN_HISTORY_DAYS};

use super::charts::forecast_bars;
use super::usd;

/// What `templates/forecast.html` shows.
pub struct ForecastView {
    pub month: String,
    pub mtd: String,
    pub unpriced: String,
    pub month_end: String,
    pub month_end_range: String,
    pub next_month: String,
    pub next_month_range: String,
    pub next_month_label: String,
    pub next_quarter: String,
    pub next_quarter_range: String,
    pub next_quarter_label: String,
    /// Why there is no projection; empty when there is one.
    pub note: String,
    pub basis: String,
    pub method: &'static str,
    pub demand: String,
    pub svg: String,
}

fn figure(p: &Option<Projection>) -> (String, String) {
    match p {
        Some(p) => (
            usd(p.expected),
            format!("range {} to {}", usd(p.low), usd(p.high)),
        ),
        None => (
            "unknown".into(),
            format!("needs {MIN_HISTORY_DAYS} complete days with priced GPUs"),
        ),
    }
}

fn label(p: &Option<Projection>, fmt: &str) -> String {
    p.as_ref()
        .map(|p| {
            let last = p.to.pred_opt().unwrap_or(p.to);
            format!("{} to {}", p.from.format(fmt), last.format(fmt))
        })
        .unwrap_or_default()
}

pub fn view(f: &Forecast) -> ForecastView {
    let (month_end, month_end_range) = figure(&f.month_end_usd);
    let (next_month, next_month_range) = figure(&f.next_month_usd);
    let (next_quarter, next_quarter_range) = figure(&f.next_quarter_usd);
    let labels: Vec<String> = f
        .month_days
        .iter()
        .map(|d| d.date.format("%d").to_string())
        .collect();
    let actual: Vec<Option<f64>> = f.month_days.iter().map(|d| d.actual_usd).collect();
    let bands: Vec<_> = f
        .month_days
        .iter()
        .map(|d| d.forecast_usd.map(|b| (b.low, b.expected, b.high)))
        .collect();
    let month = f
        .month_days
        .first()
        .map(|d| d.date.format("%B %Y").to_string())
        .unwrap_or_default();
    ForecastView {
        svg: forecast_bars(
            &format!("Spend per day in {month}: spent so far, and the forecast to month end"),
            &labels,
            &actual,
            &bands,
            " $",
        ),
        mtd: usd(f.month_to_date_usd),
        unpriced: if f.unpriced_gpu_hours > 0 {
            format!(
                "{} GPU-hours have no known rate (not in any $ figure)",
                super::count(f.unpriced_gpu_hours)
            )
        } else {
            "every GPU-hour priced".into()
        },
        month_end,
        month_end_range,
        next_month,
        next_month_range,
        next_month_label: label(&f.next_month_usd, "%Y-%m-%d"),
        next_quarter,
        next_quarter_range,
        next_quarter_label: label(&f.next_quarter_usd, "%Y-%m-%d"),
        note: f.note.clone().unwrap_or_default(),
        basis: format!(
            "{} complete days from {} ({} weekdays, {} weekend days)",
            f.basis.days, f.basis.from, f.basis.weekdays, f.basis.weekend_days
        ),
        method: f.basis.method,
        demand: match &f.demand {
            Some(d) => format!(
                "{:.1} GPU-hours/day, trend {:+.2} GPU-hours/day per day ({})",
                d.gpu_hours_per_day,
                d.slope_gpu_hours_per_day,
                d.pct_per_month
                    .map(|p| format!("{p:+.1} % per month"))
                    .unwrap_or_else(|| "unknown % per month".into())
            ),
            None => "unknown (not enough history)".into(),
        },
        month,
    }
}
