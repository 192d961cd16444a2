//! Server-rendered pages: one typed view struct per page, formatted here so templates only
//! place strings. Unknown figures read "unknown", never 0.

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use gpuledger_ledger::GroupBy;
use gpuledger_model::{GpuState, SourceStatus, SummaryGroup};

use crate::params::Params;
use crate::{error, AppState};

/// `$1,234.56`; negative numbers keep their sign.
pub fn usd(v: f64) -> String {
    let cents = (v.abs() * 100.0).round() as u64;
    let (whole, frac) = (cents / 100, cents % 100);
    let digits = whole.to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    format!("{}${grouped}.{frac:02}", if v < 0.0 { "-" } else { "" })
}

/// `12,345`.
pub fn count(v: i64) -> String {
    let digits = v.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0 {
        format!("-{out}")
    } else {
        out
    }
}

fn pct(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.1} %"))
        .unwrap_or_else(|| "unknown".into())
}

fn share(part: i64, whole: i64) -> Option<f64> {
    (whole > 0).then(|| part as f64 * 100.0 / whole as f64)
}

fn lag(secs: Option<i64>) -> String {
    match secs {
        None => "never".into(),
        Some(s) if s < 120 => format!("{s} s"),
        Some(s) if s < 7200 => format!("{} min", s / 60),
        Some(s) if s < 172_800 => format!("{} h", s / 3600),
        Some(s) => format!("{} d", s / 86_400),
    }
}

pub struct Row {
    pub key: String,
    pub gpus: String,
    pub gpu_hours: String,
    pub avg_activity: String,
    pub cost: String,
    pub idle_cost: String,
    pub alloc_idle_cost: String,
}

impl From<&SummaryGroup> for Row {
    fn from(g: &SummaryGroup) -> Row {
        Row {
            key: g.key.clone(),
            gpus: count(g.gpus),
            gpu_hours: count(g.gpu_hours),
            avg_activity: pct(g.avg_activity_pct),
            cost: usd(g.cost_usd),
            idle_cost: usd(g.idle_cost_usd),
            alloc_idle_cost: usd(g.allocated_idle_cost_usd),
        }
    }
}

pub struct SourceRow {
    pub name: String,
    pub kind: String,
    pub status: String,
    pub last_success: String,
    pub lag: String,
    pub gpus: String,
    pub last_error: String,
}

#[derive(Template)]
#[template(path = "overview.html")]
pub struct Overview {
    pub demo: bool,
    pub stale_sources: Vec<String>,
    pub range_label: String,
    pub filter_label: String,
    pub query_suffix: String,
    pub idle_threshold: String,
    pub gpus_present: String,
    pub gpus_missing: String,
    pub gpus_in_range: String,
    pub gpu_hours: String,
    pub avg_activity: String,
    pub cost: String,
    pub unpriced: String,
    pub idle_cost: String,
    pub idle_hours: String,
    pub alloc_idle_cost: String,
    pub alloc_idle_hours: String,
    pub busy_hours: String,
    pub unknown_hours: String,
    pub busy_pct: String,
    pub idle_pct: String,
    pub unknown_pct: String,
    pub busy_w: String,
    pub idle_w: String,
    pub busy_idle_w: String,
    pub unknown_w: String,
    pub by_team: Vec<Row>,
    pub by_env: Vec<Row>,
    pub sources: Vec<SourceRow>,
    pub rendered_at: String,
}

fn render(t: &impl Template) -> Response {
    match t.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("template: {e}")),
    }
}

/// `/`: fleet totals over the range (default: the last 30 days) and source freshness.
pub async fn overview(State(state): State<AppState>, RawQuery(q): RawQuery) -> Response {
    let p = match Params::parse(q.as_deref(), &["from", "to"]) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let now = state.now();
    let window = p.window(now, 30);
    let store = &state.store;
    let (by_team, by_env, gpus, sources) = match tokio::try_join!(
        store.summary(window, &p.filters, GroupBy::Team, now),
        store.summary(window, &p.filters, GroupBy::Env, now),
        store.list_gpus(&p.filters, false, now),
        store.sources(now),
    ) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let t = &by_team.total;
    let present = gpus.iter().filter(|g| g.state == GpuState::Present).count() as i64;
    let width = |part: i64| {
        share(part, t.gpu_hours)
            .map(|s| format!("{:.1}", s * 10.0))
            .unwrap_or_else(|| "0".into())
    };
    let filter_label = {
        let f = &p.filters;
        let mut parts = Vec::new();
        for (name, vals) in [
            ("team", &f.team),
            ("env", &f.env),
            ("cloud", &f.cloud),
            ("cluster", &f.cluster),
            ("model", &f.model),
        ] {
            if !vals.is_empty() {
                parts.push(format!("{name}: {}", vals.join(", ")));
            }
        }
        parts.join(" · ")
    };
    let query_suffix = q
        .as_deref()
        .filter(|q| !q.is_empty())
        .map(|q| format!("&{q}"))
        .unwrap_or_default();
    let days = (window.to - window.from) as f64 / 86_400.0;
    let page = Overview {
        demo: state.config.demo,
        stale_sources: sources
            .iter()
            .filter(|s| matches!(s.status, SourceStatus::Stale | SourceStatus::Error))
            .map(|s| format!("{} ({})", s.name, lag(s.lag_secs)))
            .collect(),
        range_label: if p.from.is_none() && p.to.is_none() {
            "last 30 days".into()
        } else {
            format!(
                "{:.0} days to {}",
                days,
                chrono::DateTime::from_timestamp(window.to, 0)
                    .unwrap_or(now)
                    .format("%Y-%m-%d %H:%M UTC")
            )
        },
        filter_label,
        query_suffix,
        idle_threshold: format!("{}", store.settings().idle_threshold_pct),
        gpus_present: count(present),
        gpus_missing: count(gpus.len() as i64 - present),
        gpus_in_range: count(t.gpus),
        gpu_hours: count(t.gpu_hours),
        avg_activity: pct(t.avg_activity_pct),
        cost: usd(t.cost_usd),
        unpriced: if t.unpriced_gpu_hours > 0 {
            format!(
                "{} GPU-hours have no known rate",
                count(t.unpriced_gpu_hours)
            )
        } else {
            "every GPU-hour priced".into()
        },
        idle_cost: usd(t.idle_cost_usd),
        idle_hours: count(t.idle_hours),
        alloc_idle_cost: usd(t.allocated_idle_cost_usd),
        alloc_idle_hours: count(t.allocated_idle_hours),
        busy_hours: count(t.busy_hours),
        unknown_hours: count(t.unknown_hours),
        busy_pct: pct(share(t.busy_hours, t.gpu_hours)),
        idle_pct: pct(share(t.idle_hours, t.gpu_hours)),
        unknown_pct: pct(share(t.unknown_hours, t.gpu_hours)),
        busy_w: width(t.busy_hours),
        idle_w: width(t.idle_hours),
        busy_idle_w: width(t.busy_hours + t.idle_hours),
        unknown_w: width(t.unknown_hours),
        by_team: by_team.groups.iter().map(Row::from).collect(),
        by_env: by_env.groups.iter().map(Row::from).collect(),
        sources: sources
            .iter()
            .map(|s| SourceRow {
                name: s.name.clone(),
                kind: s.kind.clone(),
                status: serde_json::to_value(s.status)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                last_success: s
                    .last_success
                    .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
                    .unwrap_or_else(|| "never".into()),
                lag: lag(s.lag_secs),
                gpus: count(s.gpus),
                last_error: s.last_error.clone().unwrap_or_default(),
            })
            .collect(),
        rendered_at: now.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    };
    render(&page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_and_counts_group_thousands() {
        assert_eq!(usd(1234567.891), "$1,234,567.89");
        assert_eq!(usd(0.0), "$0.00");
        assert_eq!(usd(-5.5), "-$5.50");
        assert_eq!(count(1234), "1,234");
        assert_eq!(count(12), "12");
        assert_eq!(pct(None), "unknown");
    }
}
