//! Query-string parameters shared by the API and the pages: filters (each may repeat, or hold
//! comma-separated values), the window, grouping and output format. Unknown parameters are
//! refused so that a typo never silently widens a query; the API's parameters are read as
//! its document (`openapi.json`) states them.

use chrono::{DateTime, Duration, NaiveDate, Utc};
use gpuledger_ledger::GroupBy;
use gpuledger_store::{Filters, Window};

use crate::contract::Operation;

/// What a team-scoped viewer token may read: its teams' GPUs and the figures of those GPUs.
/// The viewer middleware puts it in the request's extensions; absent, or with no teams, reads
/// are not limited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadScope(pub Option<Vec<String>>);

impl ReadScope {
    /// The scope of the request whose extensions are `ext`.
    pub fn of(ext: &axum::http::Extensions) -> ReadScope {
        ext.get::<ReadScope>().cloned().unwrap_or_default()
    }

    pub fn is_limited(&self) -> bool {
        self.0.is_some()
    }

    pub fn may_read(&self, team: &str) -> bool {
        self.0.as_ref().is_none_or(|t| t.iter().any(|x| x == team))
    }

    fn teams_text(&self) -> String {
        self.0.as_ref().map(|t| t.join(", ")).unwrap_or_default()
    }

    /// Limit `p` to the scope: no team filter becomes the scope's teams; a team outside it is
    /// refused (the message says which, for a 403).
    pub fn apply(&self, p: &mut Params) -> Result<(), String> {
        let Some(teams) = &self.0 else {
            return Ok(());
        };
        let asked = p.filters.values_mut("team").expect("team is a filter");
        if let Some(other) = asked.iter().find(|t| !teams.contains(t)) {
            return Err(format!(
                "team `{}`: this token reads only teams: {}",
                gpuledger_ledger::echo(other),
                self.teams_text()
            ));
        }
        if asked.is_empty() {
            asked.extend(teams.iter().cloned());
        }
        Ok(())
    }

    /// The refusal for what a scoped token may not read at all.
    pub fn refusal(&self, what: &str) -> String {
        format!(
            "{what} span every team; this token reads only teams: {} (ask for a viewer token \
             without --team)",
            self.teams_text()
        )
    }
}

/// People in a browser identified by an authenticating proxy in front of the server: the
/// header naming the user, the one listing their groups (comma-separated), and the teams each
/// group reads (`*`: every team). Only for a server the proxy is the only way into.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyIdentity {
    pub user_header: String,
    pub groups_header: String,
    pub groups: std::collections::BTreeMap<String, Vec<String>>,
}

impl ProxyIdentity {
    /// What the request's user may read, from its headers: `None` when the proxy named no
    /// user; `Err` (for a 403) when none of the user's groups reads any team.
    pub fn scope(&self, headers: &axum::http::HeaderMap) -> Option<Result<ReadScope, String>> {
        let user = headers
            .get(self.user_header.as_str())?
            .to_str()
            .ok()?
            .trim();
        if user.is_empty() {
            return None;
        }
        let groups: Vec<&str> = headers
            .get_all(self.groups_header.as_str())
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|g| !g.is_empty())
            .collect();
        let mut teams: Vec<String> = Vec::new();
        for g in &groups {
            for t in self.groups.get(*g).into_iter().flatten() {
                if t == "*" {
                    return Some(Ok(ReadScope(None)));
                }
                if !teams.contains(t) {
                    teams.push(t.clone());
                }
            }
        }
        if teams.is_empty() {
            return Some(Err(format!(
                "user `{}` is in no group that reads a team (groups: {}); ask the central team \
                 to map one in [auth.groups]",
                gpuledger_ledger::echo(user),
                gpuledger_ledger::echo(&groups.join(", "))
            )));
        }
        teams.sort();
        Some(Ok(ReadScope(Some(teams))))
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ReadScope {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(ReadScope::of(&parts.extensions))
    }
}

/// The range every page and endpoint shows when none is given.
pub const DEFAULT_RANGE_DAYS: i64 = 30;

/// Parsed query parameters.
#[derive(Debug, Clone, Default)]
pub struct Params {
    pub filters: Filters,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub group_by: Option<GroupBy>,
    pub csv: bool,
    pub include_mig: bool,
    /// `limit` and `offset`: one page of a list ([`Paging`]).
    pub paging: Paging,
    /// `range=7d` (1 to 730 days): the window's length when `from` is not given.
    pub range_days: Option<i64>,
    /// Page-specific parameters (sorting, paging, the table to export) by name.
    pub extra: std::collections::BTreeMap<String, String>,
    /// `source=`: one source's entries (the audit log).
    pub source: Option<String>,
}

/// `source`: a source's name as tokens are minted for it. The document states it as this
/// pattern; a test holds the parser to it.
#[cfg(test)]
pub const SOURCE_PATTERN: &str = "^[A-Za-z0-9._:-]{1,128}$";

/// `range`: a number of days from 1 to [`MAX_RANGE_DAYS`], written without a sign or leading
/// zeros (`7d`). The document states it as this pattern; a test holds the parser to it.
#[cfg(test)]
pub const RANGE_PATTERN: &str = "^([1-9]|[1-9][0-9]|[1-6][0-9][0-9]|7[0-2][0-9]|730)d$";
pub const MAX_RANGE_DAYS: i64 = 730;

/// The most items one page of a list may ask for (`limit`).
pub const MAX_LIMIT: usize = 10_000;
/// The furthest a page may start (`offset`): a bound for the document, far past any list.
pub const MAX_OFFSET: usize = 1_000_000_000;

/// One page of a list (`GET /api/v1/gpus`, `GET /api/v1/savings`): `limit` items from the
/// `offset`-th, in the list's own order; the whole list when `limit` is not given. The answer
/// says how many there are in all (`count`) and where the next page starts (`next_offset`,
/// `null` on the last), so a client reads a list of 100,000 GPUs a page at a time instead of
/// in one answer of 100 MB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Paging {
    pub offset: usize,
    pub limit: Option<usize>,
}

impl Paging {
    /// The indexes of this page in a list of `total` items (empty past its end).
    pub fn range(&self, total: usize) -> std::ops::Range<usize> {
        let start = self.offset.min(total);
        let end = self
            .limit
            .map_or(total, |l| start.saturating_add(l).min(total));
        start..end
    }

    /// Where the page after this one starts, or `None` when this one reaches the end.
    pub fn next_offset(&self, total: usize) -> Option<usize> {
        let end = self.range(total).end;
        (end < total).then_some(end)
    }
}

/// A whole number written as digits alone (no sign, no leading zero but `0` itself) within
/// `bounds`: how `limit` and `offset` are read.
fn parse_count(v: &str, bounds: std::ops::RangeInclusive<usize>) -> Option<usize> {
    if v.is_empty() || (v.len() > 1 && v.starts_with('0')) || !v.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    v.parse::<usize>().ok().filter(|n| bounds.contains(n))
}

/// How an empty value reads. On a page an empty form field (an unset date in the filter bar)
/// is not given; the API refuses it like any other malformed value, as its document says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Empty {
    Absent,
    Refused,
}

impl Params {
    /// A page's query: `allowed` names the page's own parameters (filters are always allowed),
    /// and an empty `from`, `to` or `range` is not given.
    pub fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<Params, String> {
        Params::parse_with(raw, Empty::Absent, |name| {
            if Filters::KEYS.contains(&name) || allowed.contains(&name) {
                return None;
            }
            let mut known = Filters::KEYS.to_vec();
            known.extend_from_slice(allowed);
            Some(format!(
                "unknown query parameter `{}`; this endpoint takes: {}",
                gpuledger_ledger::echo(name),
                known.join(", ")
            ))
        })
    }

    /// An API operation's query, by its entry in the contract: only the parameters it takes,
    /// each value as its document states it (an empty one is refused).
    pub fn parse_api(raw: Option<&str>, op: &Operation) -> Result<Params, String> {
        Params::parse_with(raw, Empty::Refused, |name| op.unknown(name))
    }

    /// Parse `raw`; `unknown` gives the refusal of a name that is not taken.
    fn parse_with(
        raw: Option<&str>,
        empty: Empty,
        unknown: impl Fn(&str) -> Option<String>,
    ) -> Result<Params, String> {
        let mut p = Params::default();
        for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            if let Some(refusal) = unknown(&k) {
                return Err(refusal);
            }
            if let Some(list) = p.filters.values_mut(&k) {
                for part in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    if !list.iter().any(|x| x == part) {
                        list.push(part.to_string());
                    }
                }
                continue;
            }
            if v.is_empty() && empty == Empty::Absent && ["from", "to", "range"].contains(&&*k) {
                continue;
            }
            p.set(&k, &v)?;
        }
        Ok(p)
    }

    /// Set parameter `k` (not a filter) from its value `v`.
    fn set(&mut self, k: &str, v: &str) -> Result<(), String> {
        let e = gpuledger_ledger::echo(v);
        match k {
            "from" => self.from = Some(parse_time("from", v)?),
            "to" => self.to = Some(parse_time("to", v)?),
            "group_by" => {
                self.group_by = Some(GroupBy::parse(v).ok_or_else(|| {
                    format!(
                        "group_by: must be one of {}, got `{e}`",
                        GroupBy::NAMES.join(", ")
                    )
                })?)
            }
            "format" => {
                self.csv = match v {
                    "csv" => true,
                    "json" => false,
                    _ => return Err(format!("format: must be `json` or `csv`, got `{e}`")),
                }
            }
            "range" => {
                self.range_days = Some(parse_range(v).ok_or_else(|| {
                    format!(
                        "range: must be a number of days like `7d` (1d to {MAX_RANGE_DAYS}d, no \
                         leading zeros), got `{e}`"
                    )
                })?)
            }
            "include_mig" => {
                self.include_mig = match v {
                    "true" => true,
                    "false" => false,
                    _ => return Err(format!("include_mig: must be `true` or `false`, got `{e}`")),
                }
            }
            "limit" => {
                self.paging.limit = Some(parse_count(v, 1..=MAX_LIMIT).ok_or_else(|| {
                    format!("limit: must be a whole number from 1 to {MAX_LIMIT}, got `{e}`")
                })?)
            }
            "offset" => {
                self.paging.offset = parse_count(v, 0..=MAX_OFFSET).ok_or_else(|| {
                    format!("offset: must be a whole number from 0 to {MAX_OFFSET}, got `{e}`")
                })?
            }
            "source" => {
                let ok = (1..=128).contains(&v.chars().count())
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c));
                if !ok {
                    return Err(format!(
                        "source: must be a source's name (1 to 128 letters, digits, `.`, `_`, \
                         `:` or `-`), got `{e}`"
                    ));
                }
                self.source = Some(v.to_string());
            }
            other => {
                self.extra.insert(other.to_string(), v.to_string());
            }
        }
        Ok(())
    }

    /// The window, defaulting to the [`DEFAULT_RANGE_DAYS`] before `now` ([`range_window`]):
    /// one default for every page and endpoint, so a figure reads the same wherever it is
    /// shown. A `from` at or after `to` (given, or now) makes an empty window, answered with
    /// nothing in it.
    pub fn window(&self, now: DateTime<Utc>) -> Window {
        let to = self.to.unwrap_or(now);
        match self.from {
            Some(from) => Window {
                from: from.timestamp().min(to.timestamp()),
                to: to.timestamp(),
            },
            None => range_window(to, self.range_days.unwrap_or(DEFAULT_RANGE_DAYS)),
        }
    }
}

/// The window of `range=Nd` ending at `to`: from midnight UTC of the day `days` days before
/// `to`, so the whole days before `to`'s day and that day up to `to`. Its days are whole days,
/// as billing exports and the daily trend count them, and its figures for past days stay the
/// same all day long instead of sliding with every hour.
pub fn range_window(to: DateTime<Utc>, days: i64) -> Window {
    let start = gpuledger_model::day_floor((to - Duration::days(days)).timestamp());
    Window {
        from: start.min(to.timestamp()),
        to: to.timestamp(),
    }
}

/// `range`'s days, when `v` matches [`RANGE_PATTERN`].
fn parse_range(v: &str) -> Option<i64> {
    let digits = v.strip_suffix('d')?;
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits
        .parse::<i64>()
        .ok()
        .filter(|d| (1..=MAX_RANGE_DAYS).contains(d))
}

/// An RFC 3339 date-time (`2026-12-02T10:00:00Z`, any offset) or a full date (`2026-12-02`,
/// midnight UTC): the document's `date-time` and `date` formats, and nothing looser.
fn parse_time(name: &str, v: &str) -> Result<DateTime<Utc>, String> {
    let b = v.as_bytes();
    let date_shaped = b.len() >= 10
        && b[..10].iter().enumerate().all(|(i, c)| {
            if i == 4 || i == 7 {
                *c == b'-'
            } else {
                c.is_ascii_digit()
            }
        });
    if date_shaped && b.len() > 10 && matches!(b[10], b'T' | b't') {
        if let Ok(t) = DateTime::parse_from_rfc3339(v) {
            return Ok(t.with_timezone(&Utc));
        }
    }
    if date_shaped && b.len() == 10 {
        if let Ok(d) = NaiveDate::parse_from_str(v, "%Y-%m-%d") {
            return Ok(d.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc());
        }
    }
    Err(format!(
        "{name}: must be an RFC 3339 time like 2026-12-02T10:00:00Z or a date like 2026-12-02, \
         got `{}`",
        gpuledger_ledger::echo(v)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_repeat_and_split_on_commas() {
        let p = Params::parse(
            Some("team=a&team=b,c&model=NVIDIA%20L4&format=csv"),
            &["format"],
        )
        .unwrap();
        assert_eq!(p.filters.team, ["a", "b", "c"]);
        assert_eq!(p.filters.model, ["NVIDIA L4"]);
        assert!(p.csv);
    }

    #[test]
    fn limit_and_offset_page_a_list() {
        let p = Params::parse(Some("limit=2&offset=3"), &["limit", "offset"]).unwrap();
        let page = p.paging;
        assert_eq!((page.offset, page.limit), (3, Some(2)));
        assert_eq!(page.range(10), 3..5);
        assert_eq!(page.next_offset(10), Some(5));
        // The last page, a short one, and one past the end.
        assert_eq!(page.range(5), 3..5);
        assert_eq!(page.next_offset(5), None);
        assert_eq!(page.range(4), 3..4);
        assert_eq!(page.next_offset(4), None);
        assert_eq!(page.range(2), 2..2);
        assert_eq!(page.next_offset(2), None);
        // No limit: everything from the offset.
        let all = Paging::default();
        assert_eq!(all.range(7), 0..7);
        assert_eq!(all.next_offset(7), None);
        let far = Paging {
            offset: MAX_OFFSET,
            limit: Some(MAX_LIMIT),
        };
        assert_eq!(far.range(usize::MAX), MAX_OFFSET..MAX_OFFSET + MAX_LIMIT);
        for (q, refusal) in [
            (
                "limit=0",
                "limit: must be a whole number from 1 to 10000, got `0`",
            ),
            ("limit=10001", "limit: must be"),
            ("limit=-1", "limit: must be"),
            ("limit=+5", "limit: must be"),
            ("limit=05", "limit: must be"),
            ("limit=1.5", "limit: must be"),
            (
                "offset=-1",
                "offset: must be a whole number from 0 to 1000000000, got `-1`",
            ),
            ("offset=1000000001", "offset: must be"),
            ("offset=99999999999999999999999", "offset: must be"),
        ] {
            let e = Params::parse(Some(q), &["limit", "offset"]).unwrap_err();
            assert!(e.starts_with(refusal), "{q}: {e}");
        }
        assert_eq!(
            Params::parse(Some("offset=0"), &["offset"]).unwrap().paging,
            Paging::default()
        );
    }

    #[test]
    fn range_and_page_parameters() {
        let p = Params::parse(
            Some("range=7d&sort=cost&page=2"),
            &["range", "sort", "page"],
        )
        .unwrap();
        assert_eq!(p.range_days, Some(7));
        assert_eq!(p.extra["sort"], "cost");
        assert!(Params::parse(Some("range=forever"), &["range"])
            .unwrap_err()
            .starts_with("range:"));
    }

    #[test]
    fn bad_parameters_name_themselves() {
        assert!(Params::parse(Some("tem=a"), &[])
            .unwrap_err()
            .contains("unknown query parameter `tem`"));
        assert!(Params::parse(Some("from=yesterday"), &["from"])
            .unwrap_err()
            .starts_with("from:"));
        assert!(Params::parse(Some("group_by=x"), &["group_by"])
            .unwrap_err()
            .starts_with("group_by:"));
        let p = Params::parse(Some("from=2026-12-01&to="), &["from", "to"]).unwrap();
        assert!(p.to.is_none(), "an empty form field is not given");
        assert_eq!(p.from.unwrap().to_rfc3339(), "2026-12-01T00:00:00+00:00");
    }

    #[test]
    fn the_api_refuses_empty_values_and_names_what_it_does_not_take() {
        use crate::contract::{GPU, SUMMARY};
        for q in ["range=", "from=", "to=", "format=", "group_by="] {
            let e = Params::parse_api(Some(q), &SUMMARY).unwrap_err();
            assert!(e.starts_with(q.trim_end_matches('=')), "{q}: {e}");
        }
        let e = Params::parse_api(Some("team=nlp"), &GPU).unwrap_err();
        assert!(e.contains("unknown query parameter `team`"), "{e}");
        let long = "x".repeat(500);
        let e = Params::parse_api(Some(&format!("{long}=1")), &GPU).unwrap_err();
        assert!(e.len() < 300, "the echoed name is bounded: {e}");
    }

    #[test]
    fn a_reversed_window_is_empty() {
        let now: DateTime<Utc> = "2026-12-02T12:00:00Z".parse().unwrap();
        let p = Params::parse(Some("from=2026-12-02&to=2026-12-01"), &["from", "to"]).unwrap();
        let w = p.window(now);
        assert_eq!(w.from, w.to);
        let p = Params::parse(Some("from=2030-01-01"), &["from"]).unwrap();
        assert_eq!(p.window(now).from, now.timestamp());
    }

    #[test]
    fn a_range_starts_at_midnight_that_many_days_back() {
        let at = |t: &str| t.parse::<DateTime<Utc>>().unwrap().timestamp();
        let window = |q: &str, now: &str| {
            let p = Params::parse(Some(q), &["range", "to"]).unwrap();
            let w = p.window(now.parse().unwrap());
            (w.from, w.to)
        };
        let now = "2026-12-05T10:00:00Z";
        assert_eq!(
            window("range=7d", now),
            (at("2026-11-28T00:00:00Z"), at(now))
        );
        // The default range is 30 days, counted the same way.
        assert_eq!(window("", now).0, at("2026-11-05T00:00:00Z"));
        // A day asked just after midnight still holds the whole day before.
        assert_eq!(
            window("range=1d", "2026-12-05T00:05:00Z").0,
            at("2026-12-04T00:00:00Z")
        );
        // At midnight it is exactly that many days.
        assert_eq!(
            window("range=7d", "2026-12-05T00:00:00Z").0,
            at("2026-11-28T00:00:00Z")
        );
        // Ending at `to`: the week before a week starts where that week starts.
        assert_eq!(
            window("range=7d&to=2026-11-28", now),
            (at("2026-11-21T00:00:00Z"), at("2026-11-28T00:00:00Z"))
        );
    }

    #[test]
    fn range_is_exactly_its_pattern() {
        let pattern = regex::Regex::new(RANGE_PATTERN).unwrap();
        let mut candidates: Vec<String> = (0..=1000).map(|n| format!("{n}d")).collect();
        candidates.extend(
            [
                "", "d", "7", "07d", "+7d", "-7d", " 7d", "7d ", "7D", "1e2d", "٣d", "0730d",
            ]
            .map(String::from),
        );
        for c in &candidates {
            assert_eq!(
                parse_range(c).is_some(),
                pattern.is_match(c),
                "range `{c}`: the parser and the document's pattern disagree"
            );
        }
        assert_eq!(parse_range("730d"), Some(MAX_RANGE_DAYS));
    }

    #[test]
    fn times_are_date_time_or_date_and_nothing_looser() {
        for ok in [
            "2026-12-02T10:00:00Z",
            "2026-12-02t10:00:00z",
            "2026-12-02T10:00:00.123456+05:30",
            "0001-01-01T00:00:00+23:59",
            "9999-12-31T23:59:59-23:59",
            "2026-12-02",
        ] {
            assert!(parse_time("from", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "2026-12-02 10:00:00Z",
            "2026-12-02T10:00:00",
            "2024-01-01T12:99:00Z",
            "2024-13-01",
            "2026-1-2",
            "+2026-12-02",
            "20261202",
            "yesterday",
        ] {
            assert!(parse_time("from", bad).is_err(), "{bad}");
        }
    }
}
