//! Query-string parameters shared by the API and the pages: filters (each may repeat, or hold
//! comma-separated values), the window, grouping and output format. Unknown parameters are
//! refused so that a typo never silently widens a query.

use chrono::{DateTime, Duration, NaiveDate, Utc};
use gpuledger_ledger::GroupBy;
use gpuledger_store::{Filters, Window};

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
    /// `range=7d` (1 to 730 days): the window's length when `from` is not given.
    pub range_days: Option<i64>,
    /// Page-specific parameters (sorting, paging, the table to export) by name.
    pub extra: std::collections::BTreeMap<String, String>,
}

impl Params {
    /// Parse `raw` allowing only the names in `allowed` (filters are always allowed).
    pub fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<Params, String> {
        let mut p = Params::default();
        for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            let list = p.filters.values_mut(&k);
            if let Some(list) = list {
                for part in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    if !list.iter().any(|x| x == part) {
                        list.push(part.to_string());
                    }
                }
                continue;
            }
            // An empty form field (an unset date in the filter bar) means "not given".
            if v.is_empty()
                && ["from", "to", "range"].contains(&k.as_ref())
                && allowed.contains(&k.as_ref())
            {
                continue;
            }
            if !allowed.contains(&k.as_ref()) {
                let mut known = Filters::KEYS.to_vec();
                known.extend_from_slice(allowed);
                return Err(format!(
                    "unknown query parameter `{k}`; this endpoint takes: {}",
                    known.join(", ")
                ));
            }
            match k.as_ref() {
                "from" => p.from = Some(parse_time("from", &v)?),
                "to" => p.to = Some(parse_time("to", &v)?),
                "group_by" => {
                    p.group_by = Some(GroupBy::parse(&v).ok_or_else(|| {
                        format!(
                            "group_by: must be one of {}, got `{v}`",
                            GroupBy::NAMES.join(", ")
                        )
                    })?)
                }
                "format" => {
                    p.csv = match v.as_ref() {
                        "csv" => true,
                        "json" => false,
                        other => {
                            return Err(format!("format: must be `json` or `csv`, got `{other}`"))
                        }
                    }
                }
                "range" => {
                    let days = v
                        .strip_suffix('d')
                        .and_then(|d| d.parse::<i64>().ok())
                        .filter(|d| (1..=730).contains(d));
                    p.range_days = Some(days.ok_or_else(|| {
                        format!("range: must be a number of days like `7d` (1d to 730d), got `{v}`")
                    })?);
                }
                "include_mig" => {
                    p.include_mig = match v.as_ref() {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        other => {
                            return Err(format!(
                                "include_mig: must be `true` or `false`, got `{other}`"
                            ))
                        }
                    }
                }
                other => {
                    p.extra.insert(other.to_string(), v.to_string());
                }
            }
        }
        if let (Some(f), Some(t)) = (p.from, p.to) {
            if f >= t {
                return Err("from: must be before `to`".into());
            }
        }
        Ok(p)
    }

    /// The window, defaulting to the [`DEFAULT_RANGE_DAYS`] before `now`: one default for
    /// every page and endpoint, so a figure reads the same wherever it is shown.
    pub fn window(&self, now: DateTime<Utc>) -> Window {
        let to = self.to.unwrap_or(now);
        let from = self
            .from
            .unwrap_or(to - Duration::days(self.range_days.unwrap_or(DEFAULT_RANGE_DAYS)));
        Window {
            from: from.timestamp(),
            to: to.timestamp(),
        }
    }
}

/// RFC 3339 (`2026-12-02T10:00:00Z`) or a date (`2026-12-02`, midnight UTC).
fn parse_time(name: &str, v: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(v) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(d) = NaiveDate::parse_from_str(v, "%Y-%m-%d") {
        return Ok(d.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc());
    }
    Err(format!(
        "{name}: must be an RFC 3339 time like 2026-12-02T10:00:00Z or a date like 2026-12-02, got `{v}`"
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
        assert!(Params::parse(Some("from=2026-12-02&to=2026-12-01"), &["from", "to"]).is_err());
        let p = Params::parse(Some("from=2026-12-01&to="), &["from", "to"]).unwrap();
        assert!(p.to.is_none(), "an empty form field is not given");
        assert_eq!(p.from.unwrap().to_rfc3339(), "2026-12-01T00:00:00+00:00");
    }
}
