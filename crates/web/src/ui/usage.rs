//! The Usage patterns page: activity and allocated GPUs over time (hours, days or weeks as the
//! range grows), an hour-of-day × weekday heatmap, and the distribution of per-GPU activity,
//! so rhythms, bursts and long-idle GPUs are visible.

use askama::Template;
use axum::extract::State;
use axum::response::Response;
use gpuledger_store::SeriesPoint;

use super::charts::{heatmap, lines, stacked, Series};
use super::{col, count, ncol, pct, respond, Cell, Frame, Page, PageError, Table};
use crate::AppState;

#[derive(Template)]
#[template(path = "usage.html")]
pub struct UsagePage {
    pub frame: Frame,
    pub bucket: &'static str,
    pub activity_svg: String,
    pub heatmap_svg: String,
    pub histogram_svg: String,
    pub series: Table,
    pub histogram: Table,
}

/// Merge day points into ISO weeks (Monday start) for long ranges.
fn weekly(days: Vec<SeriesPoint>) -> Vec<SeriesPoint> {
    let mut out: Vec<SeriesPoint> = Vec::new();
    for d in days {
        let day = d.start.timestamp().div_euclid(86_400);
        let monday = day - (day + 3).rem_euclid(7);
        let start = chrono::DateTime::from_timestamp(monday * 86_400, 0).unwrap_or(d.start);
        match out.last_mut() {
            Some(w) if w.start == start => w.absorb(&d),
            _ => out.push(SeriesPoint { start, ..d }),
        }
    }
    out
}

pub async fn usage(State(state): State<AppState>, page: Page) -> Result<Response, PageError> {
    let Page {
        p,
        now,
        window,
        frame: f,
        ..
    } = page;
    let store = &state.store;
    let span_days = (window.to.min(now.timestamp()) - window.from) / 86_400;
    let daily = span_days > 2;
    let (series, map, windows) = tokio::try_join!(
        store.series(window, &p.filters, daily, now),
        store.heatmap(window, &p.filters, now),
        store.gpu_totals(window, &p.filters, now),
    )?;
    let (series, bucket) = if span_days > 60 {
        (weekly(series), "week")
    } else if daily {
        (series, "day")
    } else {
        (series, "hour")
    };
    let bucket_hours = match bucket {
        "hour" => 1.0,
        "day" => 24.0,
        _ => 168.0,
    };
    let labels: Vec<String> = series
        .iter()
        .map(|s| match bucket {
            "hour" => s.start.format("%m-%d %H:00").to_string(),
            _ => s.start.format("%m-%d").to_string(),
        })
        .collect();
    let activity_svg = lines(
        "Average activity and GPUs allocated over time",
        &labels,
        &[
            Series {
                name: "avg activity (%)".into(),
                color: "var(--busy)".into(),
                values: series.iter().map(|s| s.avg_activity_pct()).collect(),
            },
            Series {
                name: "GPUs allocated (% of present)".into(),
                color: "var(--alloc)".into(),
                values: series
                    .iter()
                    .map(|s| {
                        (s.gpu_hours > 0)
                            .then(|| s.allocated_hours as f64 * 100.0 / s.gpu_hours as f64)
                    })
                    .collect(),
            },
            Series {
                name: "idle share (% of present)".into(),
                color: "var(--idle)".into(),
                values: series
                    .iter()
                    .map(|s| {
                        (s.gpu_hours > 0).then(|| s.idle_hours as f64 * 100.0 / s.gpu_hours as f64)
                    })
                    .collect(),
            },
        ],
        100.0,
        " %",
    );
    let mut table = Table::new(
        "usage-series",
        &f,
        vec![
            col(
                match bucket {
                    "hour" => "Hour (UTC)",
                    "day" => "Day (UTC)",
                    _ => "Week of (UTC)",
                },
                "Bucket start.",
            ),
            ncol(
                "GPUs present (avg)",
                "Present GPU-hours ÷ hours in the bucket.",
            ),
            ncol("GPU-hours", "Present hours in the bucket."),
            ncol("Busy h", "Hours at or above the idle threshold."),
            ncol("Idle h", "Hours below the idle threshold."),
            ncol("Unknown h", "Hours without activity data."),
            ncol("Allocated h", "Hours covered by an allocation."),
            ncol("Avg activity", "Mean hourly activity over known hours."),
        ],
    );
    for (s, l) in series.iter().zip(&labels) {
        let a = s.avg_activity_pct();
        table.push(vec![
            Cell::text(l.clone()),
            Cell::num(
                format!("{:.1}", s.gpu_hours as f64 / bucket_hours),
                s.gpu_hours as f64,
            ),
            Cell::num(count(s.gpu_hours), s.gpu_hours as f64),
            Cell::num(count(s.busy_hours), s.busy_hours as f64),
            Cell::num(count(s.idle_hours), s.idle_hours as f64),
            Cell::num(count(s.unknown_hours()), s.unknown_hours() as f64),
            Cell::num(count(s.allocated_hours), s.allocated_hours as f64),
            Cell::num(pct(a), a.unwrap_or(-1.0)),
        ]);
    }
    // Distribution of per-GPU average activity over the range.
    const BINS: [(&str, f64, f64); 6] = [
        ("0–5 % (idle)", 0.0, 5.0),
        ("5–20 %", 5.0, 20.0),
        ("20–40 %", 20.0, 40.0),
        ("40–60 %", 40.0, 60.0),
        ("60–80 %", 60.0, 80.0),
        ("80–100 %", 80.0, 100.1),
    ];
    let mut counts = [0i64; 7];
    for w in windows.iter().filter(|w| w.present_hours > 0) {
        match w.avg_activity_pct() {
            Some(a) => {
                let i = BINS
                    .iter()
                    .position(|(_, lo, hi)| a >= *lo && a < *hi)
                    .unwrap_or(5);
                counts[i] += 1;
            }
            None => counts[6] += 1,
        }
    }
    let mut bin_labels: Vec<String> = BINS.iter().map(|b| b.0.to_string()).collect();
    bin_labels.push("unknown".into());
    let histogram_svg = stacked(
        "GPUs by their average activity over the range",
        &bin_labels,
        &[
            Series {
                name: "GPUs".into(),
                color: "var(--busy)".into(),
                values: counts[..6]
                    .iter()
                    .map(|c| Some(*c as f64))
                    .chain([None])
                    .collect(),
            },
            Series {
                name: "GPUs with unknown activity".into(),
                color: "var(--unknown)".into(),
                values: (0..6)
                    .map(|_| None)
                    .chain([Some(counts[6] as f64)])
                    .collect(),
            },
        ],
        "",
    );
    let mut histogram = Table::new(
        "activity-distribution",
        &f,
        vec![
            col(
                "Average activity",
                "Per-GPU mean hourly activity over the range's known hours.",
            ),
            ncol(
                "GPUs",
                "Physical GPUs present in the range with that average.",
            ),
        ],
    );
    for (l, c) in bin_labels.iter().zip(counts) {
        histogram.push(vec![Cell::text(l.clone()), Cell::num(count(c), c as f64)]);
    }
    let page = UsagePage {
        bucket,
        activity_svg,
        heatmap_svg: heatmap("Mean activity by weekday and hour of day (UTC)", &map.cells),
        histogram_svg,
        series: table,
        histogram,
        frame: f,
    };
    let tables = [&page.series, &page.histogram];
    respond(&page, &tables, &p)
}
