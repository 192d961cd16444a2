//! Server-rendered pages. Each page is one typed view struct and one askama template; what
//! every page shares (navigation, the filter bar, banners) is a [`Frame`], and every table is a
//! [`Table`] so that its CSV download is exactly what the page shows. Unknown figures read
//! "unknown", never 0.

// Page helpers return the ready error response as their `Err`: it is built once per failed
// request and returned as is, so its size does not matter.
#![allow(clippy::result_large_err)]

pub mod charts;
pub(crate) mod findings;
mod forecast;
mod gpu;
mod inventory;
mod overview;
mod parts;
mod sources;
mod teams;
mod usage;
mod waste;

pub use gpu::gpu_page;
pub use inventory::inventory;
pub use overview::overview;
pub use sources::sources_page;
pub use teams::{team_page, teams};
pub use usage::usage;
pub use waste::{savings_api, waste};

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use gpuledger_ledger::echo;
use gpuledger_model::{SourceStatus, SourceView};

use crate::csv::Csv;
use crate::params::{Params, ReadScope, DEFAULT_RANGE_DAYS};
use crate::{error, AppState};

/// `$1,234.56`; negative numbers keep their sign.
pub fn usd(v: f64) -> String {
    let cents = (v.abs() * 100.0).round() as u64;
    format!(
        "{}${}.{:02}",
        if v < 0.0 { "-" } else { "" },
        group(cents / 100),
        cents % 100
    )
}

/// `$1,235` for large amounts where cents are noise.
pub fn usd0(v: f64) -> String {
    format!(
        "{}${}",
        if v < 0.0 { "-" } else { "" },
        group(v.abs().round() as u64)
    )
}

fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `12,345`.
pub fn count(v: i64) -> String {
    let g = group(v.unsigned_abs());
    if v < 0 {
        format!("-{g}")
    } else {
        g
    }
}

/// `41.5 %`, or `unknown`.
pub fn pct(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.1} %"))
        .unwrap_or_else(|| "unknown".into())
}

pub fn share(part: i64, whole: i64) -> Option<f64> {
    (whole > 0).then(|| part as f64 * 100.0 / whole as f64)
}

pub fn lag(secs: Option<i64>) -> String {
    match secs {
        None => "never".into(),
        Some(s) if s < 120 => format!("{s} s"),
        Some(s) if s < 7200 => format!("{} min", s / 60),
        Some(s) if s < 172_800 => format!("{} h", s / 3600),
        Some(s) => format!("{} d", s / 86_400),
    }
}

pub fn status_text(s: SourceStatus) -> &'static str {
    match s {
        SourceStatus::Ok => "ok",
        SourceStatus::Stale => "stale",
        SourceStatus::Error => "error",
        SourceStatus::Never => "never",
    }
}

/// Percent-encode a query value.
pub fn enc(v: &str) -> String {
    form_urlencoded::byte_serialize(v.as_bytes()).collect()
}

/// One cell: the text shown (and exported), a value to sort by, an optional link.
#[derive(Debug, Clone, Default)]
pub struct Cell {
    pub text: String,
    pub sort: Option<f64>,
    pub href: Option<String>,
    pub num: bool,
    pub title: Option<String>,
}

impl Cell {
    pub fn text(t: impl Into<String>) -> Cell {
        Cell {
            text: t.into(),
            ..Default::default()
        }
    }
    pub fn num(t: impl Into<String>, v: f64) -> Cell {
        Cell {
            text: t.into(),
            sort: Some(v),
            num: true,
            ..Default::default()
        }
    }
    pub fn link(mut self, href: impl Into<String>) -> Cell {
        self.href = Some(href.into());
        self
    }
    pub fn titled(mut self, t: impl Into<String>) -> Cell {
        self.title = Some(t.into());
        self
    }
}

/// A column header with its plain-language definition.
#[derive(Debug, Clone)]
pub struct Col {
    pub name: String,
    pub help: String,
    pub num: bool,
}

pub fn col(name: &str, help: &str) -> Col {
    Col {
        name: name.into(),
        help: help.into(),
        num: false,
    }
}

pub fn ncol(name: &str, help: &str) -> Col {
    Col {
        name: name.into(),
        help: help.into(),
        num: true,
    }
}

/// A table as shown; `?csv=<id>` on the page's URL downloads exactly these rows as CSV.
#[derive(Debug, Clone)]
pub struct Table {
    pub id: String,
    pub cols: Vec<Col>,
    pub rows: Vec<Vec<Cell>>,
    /// `?<query>&csv=<id>` for the download link.
    pub csv_href: String,
    pub empty: String,
    /// Rows indented under the row before them (MIG instances under their GPU).
    pub child: Vec<bool>,
    /// Rows left out of the page after the first ones (the CSV of the table has them all).
    pub hidden: usize,
    /// The order the rows shown are the first of, as the note on [`Table::hidden`] says it.
    pub order: &'static str,
}

impl Table {
    pub fn new(id: &str, frame: &Frame, cols: Vec<Col>) -> Table {
        Table {
            id: id.into(),
            cols,
            rows: Vec::new(),
            csv_href: frame.with(&[("csv", id)]),
            empty: "nothing in this range and filter".into(),
            child: Vec::new(),
            hidden: 0,
            order: "largest first",
        }
    }

    pub fn push(&mut self, row: Vec<Cell>) {
        self.rows.push(row);
        self.child.push(false);
    }

    /// [`Table::hidden`], written as the page writes counts.
    pub fn hidden_text(&self) -> String {
        count(self.hidden as i64)
    }

    pub fn push_child(&mut self, row: Vec<Cell>) {
        self.rows.push(row);
        self.child.push(true);
    }

    fn to_csv(&self) -> Response {
        let mut csv = Csv::new(&self.id, self.cols.iter().map(|c| c.name.as_str()));
        for row in &self.rows {
            csv.row(row.iter().map(|c| c.text.as_str()));
        }
        csv.into_response()
    }
}

/// A filter's choices for the bar.
pub struct FilterOpt {
    pub name: &'static str,
    pub label: &'static str,
    pub options: Vec<(String, bool)>,
}

pub struct NavItem {
    pub label: &'static str,
    pub href: String,
    pub active: bool,
}

/// What every page shares.
pub struct Frame {
    pub title: String,
    pub demo: bool,
    pub stale: Vec<String>,
    pub nav: Vec<NavItem>,
    pub filters: Vec<FilterOpt>,
    pub ranges: Vec<(String, String, bool)>,
    pub path: String,
    /// The filter and range part of the query, to carry between pages.
    pub carry: String,
    pub from_value: String,
    pub to_value: String,
    pub range_label: String,
    pub rendered_at: String,
    pub idle_threshold: String,
}

impl Frame {
    /// `path?carry&extra…` with page-specific pairs added.
    pub fn with(&self, extra: &[(&str, &str)]) -> String {
        let mut q = self.carry.clone();
        for (k, v) in extra {
            if !q.is_empty() {
                q.push('&');
            }
            q.push_str(k);
            q.push('=');
            q.push_str(&enc(v));
        }
        if q.is_empty() {
            self.path.clone()
        } else {
            format!("{}?{q}", self.path)
        }
    }

    /// A link to another page keeping filters and range.
    pub fn link(&self, path: &str) -> String {
        if self.carry.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{}", self.carry)
        }
    }
}

/// The pages of the navigation, in order.
const PAGES: [(&str, &str); 7] = [
    ("Overview", "/"),
    ("Inventory", "/inventory"),
    ("Teams", "/teams"),
    ("Usage", "/usage"),
    ("Waste", "/waste"),
    ("Sources", "/sources"),
    ("API", "/api/v1/openapi.json"),
];

/// Why a page could not be shown, rendered as a small HTML page with the status and a message
/// that says what to change. Every page handler returns `Result<Response, PageError>` and uses
/// `?`; nothing else builds error pages.
#[derive(Debug)]
pub struct PageError {
    status: StatusCode,
    pub(crate) message: String,
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    status: &'a str,
    message: &'a str,
}

impl PageError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> PageError {
        PageError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> PageError {
        PageError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> PageError {
        PageError::new(StatusCode::NOT_FOUND, message)
    }

    pub fn forbidden(message: impl Into<String>) -> PageError {
        PageError::new(StatusCode::FORBIDDEN, message)
    }

    /// The same error as the API gives it: `{"error": ...}`.
    pub fn json(self) -> Response {
        error(self.status, self.message)
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = self.status.to_string();
        let page = ErrorPage {
            status: &status,
            message: &self.message,
        };
        match page.render() {
            Ok(html) => (self.status, Html(html)).into_response(),
            Err(_) => (self.status, self.message).into_response(),
        }
    }
}

impl From<gpuledger_store::StoreError> for PageError {
    fn from(e: gpuledger_store::StoreError) -> PageError {
        tracing::error!(error = %e, "page query failed");
        PageError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }
}

/// The page-specific query parameters a page takes besides filters and the range.
pub trait Takes {
    const PARAMS: &'static [&'static str];
}

/// Pages that take nothing but filters and the range.
pub struct Plain;
impl Takes for Plain {
    const PARAMS: &'static [&'static str] = &[];
}

/// What every page starts from, extracted once per request: its parameters (refused with 400
/// when unknown or malformed), the clock, the window, the sources (for the freshness banner)
/// and the frame (navigation, filter bar, banners). The frame's path is the request's; a page
/// whose title depends on its path sets `frame.title`.
pub struct Page<K = Plain> {
    pub p: Params,
    /// What the request's token may read (its team filter is already applied to `p`).
    pub scope: ReadScope,
    pub now: chrono::DateTime<chrono::Utc>,
    pub window: gpuledger_store::Window,
    pub sources: Vec<SourceView>,
    pub frame: Frame,
    kind: std::marker::PhantomData<K>,
}

impl<K: Takes + Send> axum::extract::FromRequestParts<AppState> for Page<K> {
    type Rejection = PageError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        // An API operation on a page's extractor (`/api/v1/savings`) reads its query as the
        // contract says; a page also takes `csv` and treats empty form fields as not given.
        let mut p = match crate::contract::operation(parts.uri.path()) {
            Some(op) => Params::parse_api(parts.uri.query(), op),
            None => {
                let mut allowed = vec!["from", "to", "range", "csv"];
                allowed.extend_from_slice(K::PARAMS);
                Params::parse(parts.uri.query(), &allowed)
            }
        }
        .map_err(PageError::bad_request)?;
        let scope = ReadScope::of(&parts.extensions);
        scope.apply(&mut p).map_err(PageError::forbidden)?;
        let now = state.now();
        let sources = state.store.sources(now).await?;
        let path = parts.uri.path().to_string();
        let title = match path.as_str() {
            "/" => "Fleet overview",
            "/usage" => "Usage patterns",
            p => PAGES
                .iter()
                .find(|(_, href)| *href == p)
                .map_or("gpuledger", |(label, _)| *label),
        };
        let frame = frame(state, &p, &scope, &path, title, &sources).await?;
        Ok(Page {
            window: p.window(now),
            p,
            scope,
            now,
            sources,
            frame,
            kind: std::marker::PhantomData,
        })
    }
}

/// Build the frame: navigation, filter choices, banners.
pub async fn frame(
    state: &AppState,
    p: &Params,
    scope: &ReadScope,
    path: &str,
    title: &str,
    sources: &[SourceView],
) -> Result<Frame, PageError> {
    let store = &state.store;
    let now = state.now();
    // A scoped token's choices come from its teams' GPUs only.
    let visible = if scope.is_limited() {
        Some(store.list_gpus_brief(&p.filters, now).await?)
    } else {
        None
    };
    let mut filters = Vec::new();
    for (name, selected) in p.filters.iter() {
        let label = match name {
            "env" => "Environment",
            "team" => "Team",
            "cloud" => "Cloud",
            "cluster" => "Cluster",
            "model" => "Model",
            "vendor" => "Vendor",
            other => other,
        };
        let values = match &visible {
            None => store.distinct(name).await?,
            Some(gpus) => gpus
                .iter()
                .filter_map(|g| match name {
                    "team" => Some(&*g.team),
                    "env" => Some(&*g.env),
                    "cloud" => g.cloud.as_deref(),
                    "cluster" => g.cluster.as_deref(),
                    _ => Some(&*g.model),
                })
                .collect::<std::collections::BTreeSet<&str>>()
                .into_iter()
                .map(str::to_string)
                .collect(),
        };
        let mut options: Vec<(String, bool)> = values
            .into_iter()
            .map(|v| {
                let on = selected.contains(&v);
                (v, on)
            })
            .collect();
        for s in selected {
            if !options.iter().any(|(v, _)| v == s) {
                options.push((s.clone(), true));
            }
        }
        filters.push(FilterOpt {
            name,
            label,
            options,
        });
    }
    let mut carry_pairs: Vec<(String, String)> = Vec::new();
    for (name, vals) in p.filters.iter() {
        for v in vals {
            carry_pairs.push((name.into(), v.clone()));
        }
    }
    // Every link carries the range, the default one too: a GPU's cost on its own page is
    // then the same figure as on the page that linked to it.
    if let Some(d) = p
        .range_days
        .or((p.from.is_none() && p.to.is_none()).then_some(DEFAULT_RANGE_DAYS))
    {
        carry_pairs.push(("range".into(), format!("{d}d")));
    }
    if let Some(f) = p.from {
        carry_pairs.push(("from".into(), f.to_rfc3339()));
    }
    if let Some(t) = p.to {
        carry_pairs.push(("to".into(), t.to_rfc3339()));
    }
    let carry = carry_pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect::<Vec<_>>()
        .join("&");
    let nav = PAGES
        .iter()
        .map(|(label, href)| NavItem {
            label,
            href: if href.starts_with("/api") || carry.is_empty() {
                href.to_string()
            } else {
                format!("{href}?{carry}")
            },
            active: *href == path
                || (path.starts_with("/gpus/") && *href == "/inventory")
                || (path.starts_with("/teams/") && *href == "/teams"),
        })
        .collect();
    let window = p.window(now);
    let days = (window.to.min(now.timestamp()) - window.from) as f64 / 86_400.0;
    let custom = p.from.is_some() || p.to.is_some();
    let ranges = [1, 7, 30, 90]
        .iter()
        .map(|d| {
            let on = !custom && p.range_days.unwrap_or(DEFAULT_RANGE_DAYS) == *d;
            (format!("{d}d"), format!("{d} days"), on)
        })
        .collect();
    let stale = sources
        .iter()
        .filter(|s| matches!(s.status, SourceStatus::Stale | SourceStatus::Error))
        .map(|s| {
            format!(
                "{} ({}, last success {} ago)",
                s.name,
                status_text(s.status),
                lag(s.lag_secs)
            )
        })
        .collect();
    Ok(Frame {
        title: title.to_string(),
        demo: state.config.demo,
        stale,
        nav,
        filters,
        ranges,
        path: path.to_string(),
        carry,
        from_value: p
            .from
            .map(|f| f.format("%Y-%m-%d").to_string())
            .unwrap_or_default(),
        to_value: p
            .to
            .map(|t| t.format("%Y-%m-%d").to_string())
            .unwrap_or_default(),
        range_label: if custom {
            format!(
                "{} to {} ({days:.0} days)",
                chrono::DateTime::from_timestamp(window.from, 0)
                    .unwrap_or(now)
                    .format("%Y-%m-%d %H:%M"),
                chrono::DateTime::from_timestamp(window.to.min(now.timestamp()), 0)
                    .unwrap_or(now)
                    .format("%Y-%m-%d %H:%M UTC"),
            )
        } else {
            format!("last {} days", p.range_days.unwrap_or(DEFAULT_RANGE_DAYS))
        },
        rendered_at: now.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        idle_threshold: format!("{}", store.settings().idle_threshold_pct),
    })
}

/// `GET /static/{file}`: the pages' stylesheet and script, as files because the content
/// security policy allows no inline style or script. They need no token: they hold no data.
pub async fn asset(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    let (content_type, body) = match file.as_str() {
        "gpuledger.css" => (
            "text/css; charset=utf-8",
            include_str!("../../static/gpuledger.css"),
        ),
        "sort.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../../static/sort.js"),
        ),
        _ => return error(StatusCode::NOT_FOUND, "no such file"),
    };
    (
        [
            (axum::http::header::CONTENT_TYPE, content_type),
            (axum::http::header::CACHE_CONTROL, "public, max-age=300"),
        ],
        body,
    )
        .into_response()
}

/// Render a page, or the table named by `?csv=` as CSV.
pub fn respond(page: &impl Template, tables: &[&Table], p: &Params) -> Result<Response, PageError> {
    if let Some(id) = p.extra.get("csv") {
        return match tables.iter().find(|t| &t.id == id) {
            Some(t) => Ok(t.to_csv()),
            None => Err(PageError::bad_request(format!(
                "csv: no table `{}` on this page; tables: {}",
                echo(id),
                tables
                    .iter()
                    .map(|t| t.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        };
    }
    page.render()
        .map(|html| Html(html).into_response())
        .map_err(|e| PageError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("template: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_and_counts_group_thousands() {
        assert_eq!(usd(1234567.891), "$1,234,567.89");
        assert_eq!(usd(0.0), "$0.00");
        assert_eq!(usd(-5.5), "-$5.50");
        assert_eq!(usd0(1234.6), "$1,235");
        assert_eq!(count(1234), "1,234");
        assert_eq!(count(12), "12");
        assert_eq!(pct(None), "unknown");
    }
}
