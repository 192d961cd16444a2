//! The config file (TOML): parsed with positions so that `check-config` can name every problem
//! with its line, column and key path, not just the first.
//!
//! ```toml
//! listen = "127.0.0.1:8080"
//! database_url = "sqlite://gpuledger.db"
//! [thresholds]
//! idle_pct = 5.0                # an hour below this activity is idle
//! stale_window_secs = 7200      # a GPU unobserved this long is missing
//! freshness_objective_secs = 3600
//! [retention]
//! raw_days = 14
//! rollup_days = 730
//! [auth]
//! read_requires_token = false
//! [ingest]
//! max_body_bytes = 8388608
//! max_decompressed_bytes = 67108864
//! [server]
//! header_timeout_secs = 10      # to send a request's head; also the keep-alive idle timeout
//! body_timeout_secs = 60        # to send a push body in full
//! max_connections = 512         # open at once; keep under the open-file limit
//! tls_cert = "/etc/gpuledger/tls.crt"   # HTTPS: certificate chain and key (PEM), reloaded
//! tls_key = "/etc/gpuledger/tls.key"    #   when they change; plain HTTP without them
//! [rates]                       # USD per GPU-hour, by family or exact model name
//! "H100" = 9.80
//! [[collectors]]
//! type = "..."                  # a collector kind
//! name = "..."                  # the source name it reports as
//! interval_secs = 60            # how often it runs (10..=3600)
//! ...                           # the kind's own settings
//! ```

use std::fmt;
use std::ops::Range;

use gpuledger_ledger::Settings;
use gpuledger_web::notify::{
    DigestConfig, NotifyConfig, Rule, RuleKind, SmtpConfig, SmtpSecurity, TeamContact,
    WebhookConfig, WebhookStyle,
};
use gpuledger_web::WebConfig;
use toml_edit::{ImDocument, Item, Table, Value};

/// Everything the config file can set.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub listen: Option<String>,
    pub database_url: Option<String>,
    pub settings: Settings,
    pub web: WebConfig,
    /// `[[collectors]]`, each checked as `serve` builds it.
    pub collectors: Vec<gpuledger_collect::Entry>,
    /// `collector_hosts`: the hosts collectors may read; empty: any.
    pub collector_hosts: gpuledger_collect::HostAllowList,
    /// `[ownership] assignments`: a CSV file, relative to the config file.
    pub assignments_file: Option<std::path::PathBuf>,
    /// `[notifications]`, with the team registry's contacts; `None`: no notifications.
    pub notifications: Option<NotifyConfig>,
}

/// One problem in a config file.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub line: usize,
    pub column: usize,
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}:{}: {}", self.line, self.column, self.message)
        } else {
            write!(
                f,
                "{}:{}: {}: {}",
                self.line, self.column, self.path, self.message
            )
        }
    }
}

struct Checker<'a> {
    text: &'a str,
    problems: Vec<Problem>,
}

impl Checker<'_> {
    fn position(&self, span: Option<Range<usize>>) -> (usize, usize) {
        let Some(span) = span else { return (1, 1) };
        let before = &self.text[..span.start.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
        (line, column)
    }

    fn problem(&mut self, span: Option<Range<usize>>, path: &str, message: impl Into<String>) {
        let (line, column) = self.position(span);
        self.problems.push(Problem {
            line,
            column,
            path: path.to_string(),
            message: message.into(),
        });
    }

    fn unknown_keys(&mut self, table: &Table, prefix: &str, known: &[&str]) {
        for (key, item) in table.iter() {
            if !known.contains(&key) {
                let span = table
                    .key(key)
                    .and_then(|k| k.span())
                    .or_else(|| item.span());
                self.problem(
                    span,
                    &join(prefix, key),
                    format!("unknown key; expected one of: {}", known.join(", ")),
                );
            }
        }
    }

    fn table<'t>(&mut self, root: &'t Table, key: &str) -> Option<&'t Table> {
        let item = root.get(key)?;
        match item.as_table() {
            Some(t) => Some(t),
            None => {
                self.problem(
                    item.span(),
                    key,
                    "must be a table, like [".to_string() + key + "]",
                );
                None
            }
        }
    }

    fn string(&mut self, table: &Table, prefix: &str, key: &str) -> Option<String> {
        let item = table.get(key)?;
        match item.as_str() {
            Some(s) if !s.trim().is_empty() => Some(s.to_string()),
            Some(_) => {
                self.problem(item.span(), &join(prefix, key), "must not be empty");
                None
            }
            None => {
                self.problem(item.span(), &join(prefix, key), "must be a string");
                None
            }
        }
    }

    fn number(&mut self, table: &Table, prefix: &str, key: &str, lo: f64, hi: f64) -> Option<f64> {
        let item = table.get(key)?;
        let v = match item.as_value() {
            Some(Value::Integer(i)) => Some(*i.value() as f64),
            Some(Value::Float(f)) => Some(*f.value()),
            _ => None,
        };
        match v {
            Some(v) if v >= lo && v <= hi => Some(v),
            Some(v) => {
                self.problem(
                    item.span(),
                    &join(prefix, key),
                    format!("must be within {lo}..={hi}, got {v}"),
                );
                None
            }
            None => {
                self.problem(item.span(), &join(prefix, key), "must be a number");
                None
            }
        }
    }

    fn integer(&mut self, table: &Table, prefix: &str, key: &str, lo: i64, hi: i64) -> Option<i64> {
        let item = table.get(key)?;
        match item.as_integer() {
            Some(v) if v >= lo && v <= hi => Some(v),
            Some(v) => {
                self.problem(
                    item.span(),
                    &join(prefix, key),
                    format!("must be within {lo}..={hi}, got {v}"),
                );
                None
            }
            None => {
                self.problem(item.span(), &join(prefix, key), "must be an integer");
                None
            }
        }
    }

    fn boolean(&mut self, table: &Table, prefix: &str, key: &str) -> Option<bool> {
        let item = table.get(key)?;
        match item.as_bool() {
            Some(b) => Some(b),
            None => {
                self.problem(item.span(), &join(prefix, key), "must be true or false");
                None
            }
        }
    }
}

/// `[rates.instance_types]`: `"p5.48xlarge" = 55.04` (per instance-hour, GPUs from the
/// catalog) or `"g6f.large" = { usd_per_hour = 0.2, gpus = 0.125 }`.
fn instance_rates(c: &mut Checker, item: &Item, rates: &mut gpuledger_ledger::RateTable) {
    let Some(t) = item.as_table() else {
        c.problem(
            item.span(),
            "rates.instance_types",
            "must be a table, like [rates.instance_types]",
        );
        return;
    };
    for (key, v) in t.iter() {
        let path = format!("rates.instance_types.{key}");
        let entry = match v.as_value() {
            Some(Value::InlineTable(inline)) => {
                let table = inline.clone().into_table();
                c.unknown_keys(&table, &path, &["usd_per_hour", "gpus"]);
                let price = c.number(&table, &path, "usd_per_hour", 0.0, 1_000_000.0);
                let gpus = c.number(&table, &path, "gpus", 0.001, 1024.0);
                if table.get("usd_per_hour").is_none() {
                    c.problem(v.span(), &path, "needs `usd_per_hour`");
                }
                price.map(|p| gpuledger_ledger::InstanceOverride {
                    usd_per_hour: p,
                    gpus,
                })
            }
            _ => {
                let price = c.number(t, "rates.instance_types", key, 0.0, 1_000_000.0);
                if price.is_some() && gpuledger_ledger::catalog::instance_price(key).is_none() {
                    c.problem(
                        v.span(),
                        &path,
                        format!(
                            "`{key}` is not in the built-in catalog, so its GPU count is \
                             unknown; write {{ usd_per_hour = N, gpus = N }}"
                        ),
                    );
                    None
                } else {
                    price.map(|p| gpuledger_ledger::InstanceOverride {
                        usd_per_hour: p,
                        gpus: None,
                    })
                }
            }
        };
        if let Some(e) = entry {
            rates.instance_overrides.insert(key.to_ascii_lowercase(), e);
        }
    }
}

/// `[[ownership.rules]]`: `when = { ATTR = "PATTERN", ... }`, then `team`/`team_from` and/or
/// `env`/`env_from`.
fn ownership_rules(c: &mut Checker, item: &Item, rules: &mut gpuledger_ledger::OwnershipRules) {
    use gpuledger_ledger::ownership::{Attr, Rule, Setting};
    let Some(list) = item.as_array_of_tables() else {
        c.problem(
            item.span(),
            "ownership.rules",
            "must be an array of tables, written [[ownership.rules]]",
        );
        return;
    };
    for (i, t) in list.iter().enumerate() {
        let path = format!("ownership.rules[{i}]");
        c.unknown_keys(
            t,
            &path,
            &["name", "when", "team", "team_from", "env", "env_from"],
        );
        let when = when_patterns(c, t, &path, true);
        let setting = |c: &mut Checker, fixed: &str, from: &str| -> Option<Setting> {
            match (c.string(t, &path, fixed), c.string(t, &path, from)) {
                (Some(_), Some(_)) => {
                    c.problem(
                        t.get(from).and_then(|i| i.span()),
                        &path,
                        format!("set `{fixed}` or `{from}`, not both"),
                    );
                    None
                }
                (Some(n), None) => Some(Setting::Name(n)),
                (None, Some(a)) => match Attr::parse(&a) {
                    Ok(a) => Some(Setting::From(a)),
                    Err(e) => {
                        c.problem(
                            t.get(from).and_then(|i| i.span()),
                            &format!("{path}.{from}"),
                            e,
                        );
                        None
                    }
                },
                (None, None) => None,
            }
        };
        let team = setting(c, "team", "team_from");
        let env = setting(c, "env", "env_from");
        if team.is_none()
            && env.is_none()
            && !["team", "team_from", "env", "env_from"]
                .iter()
                .any(|k| t.get(k).is_some())
        {
            c.problem(
                t.span(),
                &path,
                "sets nothing: give `team`, `team_from`, `env` or `env_from`",
            );
        }
        rules.rules.push(Rule {
            name: c.string(t, &path, "name"),
            when,
            team,
            env,
        });
    }
}

/// Read the assignments file named in the config (relative to the config file) into the
/// ownership rules. Returns the problems found; the good lines are kept.
pub fn read_assignments(cfg: &mut Config, config_path: &std::path::Path) -> Vec<String> {
    let Some(file) = &cfg.assignments_file else {
        return Vec::new();
    };
    let path = config_path
        .parent()
        .map(|d| d.join(file))
        .unwrap_or_else(|| file.clone());
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let name = path.display().to_string();
            let (list, problems) = gpuledger_ledger::ownership::parse_assignments(&name, &text);
            cfg.settings.ownership.assignments = list;
            problems
        }
        Err(e) => vec![format!(
            "ownership.assignments: cannot read {}: {e}",
            path.display()
        )],
    }
}

/// `when = { ATTR = "PATTERN", ... }` of a rule or contract; `workloads`: whether attributes of
/// the workload holding a GPU may be used.
fn when_patterns(
    c: &mut Checker,
    t: &toml_edit::Table,
    path: &str,
    workloads: bool,
) -> Vec<(gpuledger_ledger::ownership::Attr, String)> {
    use gpuledger_ledger::ownership::Attr;
    let mut when = Vec::new();
    let Some(w) = t.get("when") else {
        return when;
    };
    let table = match w {
        Item::Table(t) => Some(t.clone()),
        Item::Value(Value::InlineTable(i)) => Some(i.clone().into_table()),
        _ => None,
    };
    let Some(wt) = table else {
        c.problem(
            w.span(),
            &format!("{path}.when"),
            r#"must be a table, like when = { cluster = "rdu-*", "label.team" = "nlp" }"#,
        );
        return when;
    };
    for (k, v) in wt.iter() {
        let at = format!("{path}.when.{k}");
        match (Attr::parse(k), v.as_str()) {
            (Ok(a), _) if a.of_workload() && !workloads => c.problem(
                v.span().or(w.span()),
                &at,
                format!("`{k}` is an attribute of a workload; a price can match only the GPU's"),
            ),
            (Ok(Attr::Uuid | Attr::Source), _) if !workloads => c.problem(
                v.span().or(w.span()),
                &at,
                format!(
                    "a price cannot match `{k}`; use account, instance_type, cloud, region, \
                     cluster, host, model or label.<key>"
                ),
            ),
            (Ok(a), Some(p)) => when.push((a, p.to_string())),
            (Err(e), _) => c.problem(v.span().or(w.span()), &at, e),
            (_, None) => c.problem(
                v.span().or(w.span()),
                &at,
                "must be a string pattern (* and ? match any text)",
            ),
        }
    }
    when
}

/// `[[rates.contracts]]`: name, deal, `when`, and one of `usd_per_hour` (per instance, with
/// optional `gpus`), `usd_per_gpu_hour` or `discount_pct`.
fn contract_rates(c: &mut Checker, item: &Item, rates: &mut gpuledger_ledger::RateTable) {
    use gpuledger_ledger::rates::CONTRACT_DEALS;
    use gpuledger_ledger::{Contract, ContractPrice};
    let Some(list) = item.as_array_of_tables() else {
        c.problem(
            item.span(),
            "rates.contracts",
            "must be an array of tables, written [[rates.contracts]]",
        );
        return;
    };
    for (i, t) in list.iter().enumerate() {
        let path = format!("rates.contracts[{i}]");
        c.unknown_keys(
            t,
            &path,
            &[
                "name",
                "deal",
                "when",
                "usd_per_hour",
                "gpus",
                "usd_per_gpu_hour",
                "discount_pct",
            ],
        );
        let name = c.string(t, &path, "name");
        if name.is_none() && t.get("name").is_none() {
            c.problem(
                t.span(),
                &path,
                "needs `name` (it is shown as the rate's origin)",
            );
        }
        let deal = c.string(t, &path, "deal");
        match &deal {
            Some(d) if !CONTRACT_DEALS.contains(&d.as_str()) => c.problem(
                t.get("deal").and_then(|i| i.span()),
                &format!("{path}.deal"),
                format!("`{d}` is none of {}", CONTRACT_DEALS.join(", ")),
            ),
            None if t.get("deal").is_none() => c.problem(
                t.span(),
                &path,
                format!("needs `deal`: one of {}", CONTRACT_DEALS.join(", ")),
            ),
            _ => {}
        }
        let when = when_patterns(c, t, &path, false);
        if when.is_empty() && t.get("when").is_none() {
            c.problem(
                t.span(),
                &path,
                r#"needs `when`, like when = { account = "123456789012", instance_type = "p5.*" }"#,
            );
        }
        let instance = c.number(t, &path, "usd_per_hour", 0.0, 1_000_000.0);
        let gpus = c.number(t, &path, "gpus", 0.001, 1024.0);
        let per_gpu = c.number(t, &path, "usd_per_gpu_hour", 0.0, 10_000.0);
        let discount = c.number(t, &path, "discount_pct", 0.0, 100.0);
        let given = ["usd_per_hour", "usd_per_gpu_hour", "discount_pct"]
            .iter()
            .filter(|k| t.get(k).is_some())
            .count();
        if given != 1 {
            c.problem(
                t.span(),
                &path,
                "needs exactly one price: `usd_per_hour` (per instance), `usd_per_gpu_hour` or \
                 `discount_pct`",
            );
            continue;
        }
        if gpus.is_some() && instance.is_none() {
            c.problem(
                t.get("gpus").and_then(|i| i.span()),
                &format!("{path}.gpus"),
                "goes with `usd_per_hour` (the instance's price) only",
            );
        }
        let price = match (instance, per_gpu, discount) {
            (Some(usd_per_hour), _, _) => ContractPrice::Instance { usd_per_hour, gpus },
            (_, Some(usd_per_gpu_hour), _) => ContractPrice::Gpu { usd_per_gpu_hour },
            (_, _, Some(pct)) => ContractPrice::Discount { pct },
            _ => continue,
        };
        if let (Some(name), Some(deal)) = (name, deal) {
            rates.contracts.push(Contract {
                name,
                deal,
                when,
                price,
            });
        }
    }
}

/// `[[rates.onprem]]`: model, optional hosts pattern, purchase price, life, power.
fn onprem_rates(c: &mut Checker, item: &Item, rates: &mut gpuledger_ledger::RateTable) {
    let Some(list) = item.as_array_of_tables() else {
        c.problem(
            item.span(),
            "rates.onprem",
            "must be an array of tables, written [[rates.onprem]]",
        );
        return;
    };
    for (i, t) in list.iter().enumerate() {
        let path = format!("rates.onprem[{i}]");
        c.unknown_keys(
            t,
            &path,
            &[
                "model",
                "hosts",
                "purchase_usd",
                "life_years",
                "watts",
                "usd_per_kwh",
                "pue",
            ],
        );
        let model = c.string(t, &path, "model");
        let purchase = c.number(t, &path, "purchase_usd", 0.0, 100_000_000.0);
        let life = c.number(t, &path, "life_years", 0.1, 50.0);
        for key in ["model", "purchase_usd", "life_years"] {
            if t.get(key).is_none() {
                c.problem(t.span(), &path, format!("needs `{key}`"));
            }
        }
        let watts = c.number(t, &path, "watts", 0.0, 100_000.0).unwrap_or(0.0);
        let kwh = c.number(t, &path, "usd_per_kwh", 0.0, 100.0).unwrap_or(0.0);
        let pue = c.number(t, &path, "pue", 1.0, 5.0).unwrap_or(1.0);
        if let (Some(model), Some(purchase_usd), Some(life_years)) = (model, purchase, life) {
            rates.onprem.push(gpuledger_ledger::OnPremRate {
                model,
                hosts: c.string(t, &path, "hosts"),
                purchase_usd,
                life_years,
                watts,
                usd_per_kwh: kwh,
                pue,
            });
        }
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// A list of strings, or one string as a list of one.
fn strings(c: &mut Checker, t: &Table, prefix: &str, key: &str) -> Vec<String> {
    let Some(item) = t.get(key) else {
        return Vec::new();
    };
    if let Some(s) = item.as_str() {
        return vec![s.to_string()];
    }
    match item.as_array().and_then(|a| {
        a.iter()
            .map(|v| v.as_str().map(String::from))
            .collect::<Option<Vec<_>>>()
    }) {
        Some(v) if v.iter().all(|s| !s.trim().is_empty()) => v,
        _ => {
            c.problem(
                item.span(),
                &join(prefix, key),
                "must be a string or a list of strings",
            );
            Vec::new()
        }
    }
}

/// A webhook's style, `slack` when not given.
fn webhook_style(c: &mut Checker, t: &Table, prefix: &str, key: &str) -> WebhookStyle {
    let Some(s) = c.string(t, prefix, key) else {
        return WebhookStyle::Slack;
    };
    WebhookStyle::parse(&s).unwrap_or_else(|| {
        c.problem(
            t.get(key).and_then(|i| i.span()),
            &join(prefix, key),
            format!("must be slack, teams or generic, got `{s}`"),
        );
        WebhookStyle::Slack
    })
}

/// A webhook URL: `https://`, or `http://` to a loopback address only.
fn webhook_url(c: &mut Checker, t: &Table, prefix: &str, key: &str) -> Option<String> {
    let url = c.string(t, prefix, key)?;
    let ok = match url::Url::parse(&url) {
        Ok(u) if u.scheme() == "https" => true,
        Ok(u) if u.scheme() == "http" => {
            matches!(
                u.host(),
                Some(url::Host::Ipv4(a)) if a.is_loopback()
            ) || u.host_str() == Some("localhost")
                || matches!(u.host(), Some(url::Host::Ipv6(a)) if a.is_loopback())
        }
        _ => false,
    };
    if !ok {
        c.problem(
            t.get(key).and_then(|i| i.span()),
            &join(prefix, key),
            "must be an https:// URL (http:// only to this machine)",
        );
        return None;
    }
    Some(url)
}

/// `[teams.<name>]`'s `email`, `webhook` and `webhook_style`.
fn team_contact(c: &mut Checker, t: &Table, path: &str) -> TeamContact {
    let email = strings(c, t, path, "email");
    for e in &email {
        if !e.contains('@') {
            c.problem(
                t.get("email").and_then(|i| i.span()),
                &join(path, "email"),
                format!("`{e}` is not an e-mail address"),
            );
        }
    }
    let webhook = webhook_url(c, t, path, "webhook").map(|url| WebhookConfig {
        url,
        style: webhook_style(c, t, path, "webhook_style"),
    });
    TeamContact { email, webhook }
}

/// An audience: `owner`, `central`, `email:<address>` or `webhook:<name>` of `webhooks`.
fn audience(
    c: &mut Checker,
    t: &Table,
    prefix: &str,
    key: &str,
    webhooks: &std::collections::BTreeMap<String, WebhookConfig>,
) -> Vec<String> {
    let to = strings(c, t, prefix, key);
    for a in &to {
        let ok = a == "owner"
            || a == "central"
            || a.strip_prefix("email:").is_some_and(|e| e.contains('@'))
            || a.strip_prefix("webhook:")
                .is_some_and(|w| webhooks.contains_key(w));
        if !ok {
            c.problem(
                t.get(key).and_then(|i| i.span()),
                &join(prefix, key),
                format!(
                    "`{a}`: must be owner, central, email:<address> or webhook:<name of a \
                     [notifications.webhooks.<name>]>"
                ),
            );
        }
    }
    to
}

/// `[notifications]`.
fn notifications(c: &mut Checker, t: &Table) -> NotifyConfig {
    let p = "notifications";
    c.unknown_keys(
        t,
        p,
        &[
            "dashboard_url",
            "every_secs",
            "rate_per_hour",
            "attempts",
            "retry_secs",
            "central",
            "smtp",
            "webhooks",
            "rules",
            "digest",
        ],
    );
    let mut n = NotifyConfig::default();
    match c.string(t, p, "dashboard_url") {
        Some(u) => match url::Url::parse(&u) {
            Ok(x) if x.scheme() == "http" || x.scheme() == "https" => n.dashboard_url = u,
            _ => c.problem(
                t.get("dashboard_url").and_then(|i| i.span()),
                "notifications.dashboard_url",
                "must be the dashboard's http(s):// address, like https://gpuledger.example.com",
            ),
        },
        None => c.problem(
            t.span(),
            "notifications.dashboard_url",
            "missing: the dashboard's address as people reach it (every message links to it)",
        ),
    }
    if let Some(v) = c.integer(t, p, "every_secs", 10, 86_400) {
        n.every_secs = v as u64;
    }
    if let Some(v) = c.integer(t, p, "rate_per_hour", 1, 10_000) {
        n.rate_per_hour = v;
    }
    if let Some(v) = c.integer(t, p, "attempts", 1, 10) {
        n.attempts = v as u32;
    }
    if let Some(v) = c.number(t, p, "retry_secs", 0.0, 600.0) {
        n.retry_base = std::time::Duration::from_secs_f64(v);
    }
    if let Some(w) = c.table(t, "webhooks") {
        for (name, item) in w.iter() {
            let path = format!("notifications.webhooks.{name}");
            let Some(hook) = item.as_table() else {
                c.problem(
                    item.span(),
                    &path,
                    format!("must be a table, like [{path}]"),
                );
                continue;
            };
            c.unknown_keys(hook, &path, &["url", "style"]);
            match webhook_url(c, hook, &path, "url") {
                Some(url) => {
                    let style = webhook_style(c, hook, &path, "style");
                    n.webhooks
                        .insert(name.to_string(), WebhookConfig { url, style });
                }
                None if hook.get("url").is_none() => {
                    c.problem(hook.span(), &join(&path, "url"), "missing")
                }
                None => {}
            }
        }
    }
    let webhooks = n.webhooks.clone();
    n.central = audience(c, t, p, "central", &webhooks);
    if n.central.iter().any(|a| a == "owner" || a == "central") {
        c.problem(
            t.get("central").and_then(|i| i.span()),
            "notifications.central",
            "must name addresses or webhooks (email:…, webhook:…), not owner or central",
        );
        n.central.retain(|a| a != "owner" && a != "central");
    }
    if let Some(s) = c.table(t, "smtp") {
        let sp = "notifications.smtp";
        c.unknown_keys(
            s,
            sp,
            &[
                "host",
                "port",
                "security",
                "username",
                "password_file",
                "from",
                "ca_file",
            ],
        );
        let security = match c.string(s, sp, "security").as_deref() {
            None | Some("starttls") => Some(SmtpSecurity::StartTls),
            Some("tls") => Some(SmtpSecurity::Tls),
            Some("none") => Some(SmtpSecurity::None),
            Some(other) => {
                c.problem(
                    s.get("security").and_then(|i| i.span()),
                    "notifications.smtp.security",
                    format!("must be starttls, tls or none, got `{other}`"),
                );
                None
            }
        };
        let host = c.string(s, sp, "host");
        let from = c.string(s, sp, "from");
        if host.is_none() {
            c.problem(s.span(), "notifications.smtp.host", "missing");
        }
        if from.is_none() {
            c.problem(
                s.span(),
                "notifications.smtp.from",
                "missing: the sender's address",
            );
        }
        let username = c.string(s, sp, "username");
        let password_file = c.string(s, sp, "password_file").map(Into::into);
        if username.is_some() != password_file.is_some() {
            c.problem(
                s.span(),
                "notifications.smtp.username",
                "username and password_file go together",
            );
        }
        let port = c.integer(s, sp, "port", 1, 65_535).map(|v| v as u16);
        if let (Some(host), Some(from), Some(security)) = (host, from, security) {
            n.smtp = Some(SmtpConfig {
                host,
                port: port.unwrap_or(match security {
                    SmtpSecurity::Tls => 465,
                    _ => 587,
                }),
                security,
                username,
                password_file,
                from,
                ca_file: c.string(s, sp, "ca_file").map(Into::into),
            });
        }
    }
    match t.get("rules") {
        Some(Item::ArrayOfTables(list)) => {
            for (i, r) in list.iter().enumerate() {
                let path = format!("notifications.rules[{i}]");
                c.unknown_keys(
                    r,
                    &path,
                    &[
                        "name",
                        "kind",
                        "to",
                        "days",
                        "min_usd_per_month",
                        "usd_per_week",
                    ],
                );
                let kind = c.string(r, &path, "kind");
                let min = c
                    .number(r, &path, "min_usd_per_month", 0.0, 1e9)
                    .unwrap_or(0.0);
                let kind = match kind.as_deref() {
                    Some("idle_gpu") => Some(RuleKind::IdleGpu {
                        days: c.integer(r, &path, "days", 1, 365).unwrap_or(7),
                        min_usd_per_month: min,
                    }),
                    Some("allocated_idle") => Some(RuleKind::AllocatedIdle {
                        min_usd_per_month: min,
                    }),
                    Some("team_idle_cost") => match c.number(r, &path, "usd_per_week", 0.0, 1e9) {
                        Some(v) => Some(RuleKind::TeamIdleCost { usd_per_week: v }),
                        None => {
                            c.problem(r.span(), &join(&path, "usd_per_week"), "missing");
                            None
                        }
                    },
                    Some("stale_source") => Some(RuleKind::StaleSource),
                    Some("unowned_gpus") => Some(RuleKind::UnownedGpus),
                    Some("billed_unseen") => Some(RuleKind::BilledUnseen {
                        min_usd_per_month: min,
                    }),
                    Some(other) => {
                        c.problem(
                            r.get("kind").and_then(|i| i.span()),
                            &join(&path, "kind"),
                            format!(
                                "`{other}`: must be idle_gpu, allocated_idle, team_idle_cost, \
                                 stale_source, unowned_gpus or billed_unseen"
                            ),
                        );
                        None
                    }
                    None => {
                        c.problem(r.span(), &join(&path, "kind"), "missing");
                        None
                    }
                };
                let to = audience(c, r, &path, "to", &webhooks);
                if to.is_empty() {
                    c.problem(
                        r.span(),
                        &join(&path, "to"),
                        "missing: whom to tell (owner, central, email:…, webhook:…)",
                    );
                }
                if let Some(kind) = kind {
                    n.rules.push(Rule {
                        name: c
                            .string(r, &path, "name")
                            .unwrap_or_else(|| kind.as_str().to_string()),
                        kind,
                        to,
                    });
                }
            }
        }
        Some(other) => c.problem(
            other.span(),
            "notifications.rules",
            "must be [[notifications.rules]] tables",
        ),
        None => {}
    }
    if let Some(d) = c.table(t, "digest") {
        let dp = "notifications.digest";
        c.unknown_keys(d, dp, &["weekday", "hour", "to"]);
        let day = c
            .string(d, dp, "weekday")
            .unwrap_or_else(|| "monday".into());
        let days = [
            "monday",
            "tuesday",
            "wednesday",
            "thursday",
            "friday",
            "saturday",
            "sunday",
        ];
        let weekday = days.iter().position(|x| *x == day.to_ascii_lowercase());
        if weekday.is_none() {
            c.problem(
                d.get("weekday").and_then(|i| i.span()),
                "notifications.digest.weekday",
                format!("must be a day of the week (monday … sunday), got `{day}`"),
            );
        }
        let hour = c.integer(d, dp, "hour", 0, 23).unwrap_or(8) as u32;
        let mut to = audience(c, d, dp, "to", &webhooks);
        if to.is_empty() {
            to = vec!["owner".into()];
        }
        n.digest = weekday.map(|w| DigestConfig {
            weekday: w as u32,
            hour,
            to,
        });
    }
    if n.rules.is_empty() && n.digest.is_none() {
        c.problem(
            t.span(),
            "notifications",
            "has neither [[notifications.rules]] nor [notifications.digest]: nothing to send",
        );
    }
    n
}

/// Parse a config file's text. Returns every problem found, not only the first.
pub fn parse(text: &str) -> Result<Config, Vec<Problem>> {
    let mut c = Checker {
        text,
        problems: Vec::new(),
    };
    let doc = match ImDocument::parse(text) {
        Ok(d) => d,
        Err(e) => {
            c.problem(
                e.span(),
                "",
                format!("not valid TOML: {}", e.message().trim()),
            );
            return Err(c.problems);
        }
    };
    let root = doc.as_table();
    let mut cfg = Config::default();
    c.unknown_keys(
        root,
        "",
        &[
            "listen",
            "database_url",
            "thresholds",
            "retention",
            "auth",
            "ingest",
            "server",
            "rates",
            "ownership",
            "teams",
            "collectors",
            "collector_hosts",
            "database",
            "notifications",
        ],
    );
    if let Some(item) = root.get("collector_hosts") {
        let list: Option<Vec<String>> = item
            .as_array()
            .and_then(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect());
        match list.map(|l| gpuledger_collect::HostAllowList::parse(&l)) {
            Some(Ok(allow)) => cfg.collector_hosts = allow,
            Some(Err(e)) => c.problem(item.span(), "collector_hosts", e),
            None => c.problem(
                item.span(),
                "collector_hosts",
                "must be a list of hosts, like [\"prometheus.monitoring.svc\", \"*.k8s.example.com\", \"10.0.0.0/8\"]",
            ),
        }
    }
    cfg.listen = c.string(root, "", "listen");
    if let (Some(l), Some(item)) = (&cfg.listen, root.get("listen")) {
        if l.parse::<std::net::SocketAddr>().is_err() {
            c.problem(
                item.span(),
                "listen",
                format!("must be an address like 127.0.0.1:8080, got `{l}`"),
            );
        }
    }
    cfg.database_url = c.string(root, "", "database_url");
    if let (Some(u), Some(item)) = (&cfg.database_url, root.get("database_url")) {
        if let Err(e) = gpuledger_store::normalize_url(u) {
            c.problem(item.span(), "database_url", e.to_string());
        }
    }
    let s = &mut cfg.settings;
    if let Some(t) = c.table(root, "thresholds") {
        c.unknown_keys(
            t,
            "thresholds",
            &["idle_pct", "stale_window_secs", "freshness_objective_secs"],
        );
        if let Some(v) = c.number(t, "thresholds", "idle_pct", 0.0, 100.0) {
            s.idle_threshold_pct = v;
        }
        if let Some(v) = c.integer(t, "thresholds", "stale_window_secs", 60, 30 * 86_400) {
            s.stale_window_secs = v;
        }
        if let Some(v) = c.integer(t, "thresholds", "freshness_objective_secs", 60, 86_400) {
            s.freshness_objective_secs = v;
        }
    }
    if let Some(t) = c.table(root, "retention") {
        c.unknown_keys(t, "retention", &["raw_days", "rollup_days", "audit_days"]);
        if let Some(v) = c.integer(t, "retention", "audit_days", 1, 36_500) {
            s.audit_retention_days = v;
        }
        if let Some(v) = c.integer(t, "retention", "raw_days", 1, 3650) {
            s.raw_retention_days = v;
        }
        if let Some(v) = c.integer(t, "retention", "rollup_days", 1, 36_500) {
            s.rollup_retention_days = v;
        }
        if s.rollup_retention_days < s.raw_retention_days {
            let span = t.get("rollup_days").and_then(|i| i.span());
            c.problem(
                span,
                "retention.rollup_days",
                "must be at least retention.raw_days",
            );
        }
    }
    if let Some(t) = c.table(root, "auth") {
        c.unknown_keys(
            t,
            "auth",
            &[
                "read_requires_token",
                "proxy_user_header",
                "proxy_groups_header",
                "groups",
            ],
        );
        if let Some(v) = c.boolean(t, "auth", "read_requires_token") {
            cfg.web.read_requires_token = v;
        }
        let user = c.string(t, "auth", "proxy_user_header");
        let groups_header = c.string(t, "auth", "proxy_groups_header");
        let mut groups = std::collections::BTreeMap::new();
        if let Some(g) = c.table(t, "groups") {
            for (group, item) in g.iter() {
                let teams: Option<Vec<String>> = item.as_array().and_then(|a| {
                    a.iter()
                        .map(|v| v.as_str().map(|s| s.trim().to_ascii_lowercase()))
                        .collect()
                });
                match teams {
                    Some(teams) if !teams.is_empty() && teams.iter().all(|t| !t.is_empty()) => {
                        groups.insert(group.to_string(), teams);
                    }
                    _ => c.problem(
                        item.span(),
                        &format!("auth.groups.{group}"),
                        "must be a list of team names, like [\"nlp\"] (or [\"*\"] for every team)",
                    ),
                }
            }
        }
        match (user, groups_header) {
            (Some(user_header), Some(groups_header)) => {
                if groups.is_empty() {
                    c.problem(
                        t.get("proxy_user_header").and_then(|i| i.span()),
                        "auth.groups",
                        "map at least one group to teams, like \"nlp-eng\" = [\"nlp\"]",
                    );
                }
                if !cfg.web.read_requires_token {
                    c.problem(
                        t.get("proxy_user_header").and_then(|i| i.span()),
                        "auth.proxy_user_header",
                        "needs read_requires_token = true (without it every read is open)",
                    );
                }
                cfg.web.proxy = Some(gpuledger_web::ProxyIdentity {
                    user_header: user_header.to_ascii_lowercase(),
                    groups_header: groups_header.to_ascii_lowercase(),
                    groups,
                });
            }
            (None, None) => {
                if !groups.is_empty() {
                    c.problem(
                        t.get("groups").and_then(|i| i.span()),
                        "auth.groups",
                        "needs proxy_user_header and proxy_groups_header",
                    );
                }
            }
            _ => c.problem(
                t.get("proxy_user_header")
                    .or_else(|| t.get("proxy_groups_header"))
                    .and_then(|i| i.span()),
                "auth.proxy_user_header",
                "set both proxy_user_header and proxy_groups_header, or neither",
            ),
        }
    }
    if let Some(t) = c.table(root, "database") {
        c.unknown_keys(
            t,
            "database",
            &["sqlite_synchronous", "sqlite_max_size_mib"],
        );
        if let Some(v) = c.integer(t, "database", "sqlite_max_size_mib", 0, 1 << 40) {
            s.sqlite_max_size_mib = (v > 0).then_some(v as u64);
        }
        if let Some(v) = c.string(t, "database", "sqlite_synchronous") {
            match v.to_ascii_lowercase().as_str() {
                "full" => s.sqlite_full_sync = true,
                "normal" => s.sqlite_full_sync = false,
                _ => c.problem(
                    t.get("sqlite_synchronous").and_then(|i| i.span()),
                    "database.sqlite_synchronous",
                    format!("must be \"normal\" or \"full\", got `{v}`"),
                ),
            }
        }
    }
    if let Some(t) = c.table(root, "ingest") {
        c.unknown_keys(
            t,
            "ingest",
            &[
                "max_body_bytes",
                "max_decompressed_bytes",
                "records_per_sec",
                "records_burst",
                "new_gpus_per_day",
            ],
        );
        // 0 turns a limit off.
        let rate = c.integer(t, "ingest", "records_per_sec", 0, 100_000_000);
        let burst = c.integer(t, "ingest", "records_burst", 1, 1_000_000_000);
        match (rate, cfg.web.rate) {
            (Some(0), _) => cfg.web.rate = None,
            (Some(r), Some(mut limit)) => {
                limit.records_per_sec = r as f64;
                cfg.web.rate = Some(limit);
            }
            _ => {}
        }
        if let (Some(b), Some(mut limit)) = (burst, cfg.web.rate) {
            limit.burst = b as f64;
            cfg.web.rate = Some(limit);
        }
        if let Some(v) = c.integer(t, "ingest", "new_gpus_per_day", 0, 100_000_000) {
            s.new_gpus_per_day = (v > 0).then_some(v as u64);
        }
        if let Some(v) = c.integer(t, "ingest", "max_body_bytes", 1024, 1 << 30) {
            cfg.web.limits.max_body_bytes = v as usize;
        }
        if let Some(v) = c.integer(t, "ingest", "max_decompressed_bytes", 1024, 4 << 30) {
            cfg.web.limits.max_decompressed_bytes = v as usize;
        }
    }
    if let Some(t) = c.table(root, "server") {
        c.unknown_keys(
            t,
            "server",
            &[
                "header_timeout_secs",
                "body_timeout_secs",
                "max_connections",
                "tls_cert",
                "tls_key",
            ],
        );
        let cert = c.string(t, "server", "tls_cert");
        let key = c.string(t, "server", "tls_key");
        match (cert, key) {
            (Some(cert), Some(key)) => {
                for (name, path) in [("tls_cert", &cert), ("tls_key", &key)] {
                    if !std::path::Path::new(path).is_file() {
                        let span = t.get(name).and_then(|i| i.span());
                        c.problem(span, &join("server", name), format!("no file at `{path}`"));
                    }
                }
                cfg.web.tls = Some(gpuledger_web::TlsFiles {
                    cert: cert.into(),
                    key: key.into(),
                });
            }
            (None, None) => {}
            (one, _) => {
                let name = if one.is_some() { "tls_cert" } else { "tls_key" };
                let span = t.get(name).and_then(|i| i.span());
                c.problem(
                    span,
                    &join("server", name),
                    "set both tls_cert and tls_key (PEM files), or neither",
                );
            }
        }
        let server = &mut cfg.web.server;
        if let Some(v) = c.integer(t, "server", "header_timeout_secs", 1, 3600) {
            server.header_timeout = std::time::Duration::from_secs(v as u64);
        }
        if let Some(v) = c.integer(t, "server", "body_timeout_secs", 1, 3600) {
            server.body_timeout = std::time::Duration::from_secs(v as u64);
        }
        if let Some(v) = c.integer(t, "server", "max_connections", 1, 1_000_000) {
            server.max_connections = v as usize;
        }
    }
    if let Some(t) = c.table(root, "rates") {
        for (key, item) in t.iter() {
            match key {
                "instance_types" => instance_rates(&mut c, item, &mut s.rates),
                "onprem" => onprem_rates(&mut c, item, &mut s.rates),
                "contracts" => contract_rates(&mut c, item, &mut s.rates),
                _ => {
                    if let Some(v) = c.number(t, "rates", key, 0.0, 10_000.0) {
                        s.rates.overrides.insert(key.to_string(), v);
                    }
                }
            }
        }
    }
    if let Some(t) = c.table(root, "ownership") {
        c.unknown_keys(t, "ownership", &["assignments", "rules"]);
        cfg.assignments_file = c.string(t, "ownership", "assignments").map(Into::into);
        if let Some(item) = t.get("rules") {
            ownership_rules(&mut c, item, &mut s.ownership);
        }
    }
    let mut contacts = std::collections::BTreeMap::new();
    if let Some(t) = c.table(root, "teams") {
        for (name, item) in t.iter() {
            let path = format!("teams.{name}");
            let Some(team) = item.as_table() else {
                c.problem(
                    item.span(),
                    &path,
                    format!("must be a table, like [teams.{name}]"),
                );
                continue;
            };
            c.unknown_keys(
                team,
                &path,
                &[
                    "display_name",
                    "manager",
                    "cost_center",
                    "email",
                    "webhook",
                    "webhook_style",
                ],
            );
            let info = gpuledger_model::TeamInfo {
                display_name: c.string(team, &path, "display_name"),
                manager: c.string(team, &path, "manager"),
                cost_center: c.string(team, &path, "cost_center"),
            };
            let contact = team_contact(&mut c, team, &path);
            if contact != TeamContact::default() {
                contacts.insert(name.to_ascii_lowercase(), contact);
            }
            cfg.web.teams.insert(name.to_ascii_lowercase(), info);
        }
    }
    if let Some(t) = c.table(root, "notifications") {
        let mut n = notifications(&mut c, t);
        n.teams = contacts;
        cfg.notifications = Some(n);
    }
    if let Some(item) = root.get("collectors") {
        match item {
            Item::ArrayOfTables(list) => {
                let mut names = std::collections::BTreeSet::new();
                for (i, t) in list.iter().enumerate() {
                    let prefix = format!("collectors[{i}]");
                    // Names must differ across entries, so this one check is made here.
                    let name = t.get("name").and_then(|n| n.as_str());
                    if let Some(n) = name.filter(|n| !n.trim().is_empty()) {
                        if !names.insert(n.to_string()) {
                            c.problem(
                                t.get("name").and_then(|i| i.span()),
                                &join(&prefix, "name"),
                                format!("duplicate source name `{n}`"),
                            );
                        }
                    }
                    match gpuledger_collect::Entry::parse(t) {
                        Ok(entry) => cfg.collectors.push(entry),
                        Err(problems) => {
                            for p in problems {
                                match p.key {
                                    Some(key) => c.problem(
                                        t.get(key).and_then(|i| i.span()).or(t.span()),
                                        &join(&prefix, key),
                                        p.message,
                                    ),
                                    None => c.problem(t.span(), &prefix, p.message),
                                }
                            }
                        }
                    }
                }
            }
            other => c.problem(
                other.span(),
                "collectors",
                "must be an array of tables, written [[collectors]]",
            ),
        }
    }
    if c.problems.is_empty() {
        Ok(cfg)
    } else {
        Err(c.problems)
    }
}

/// Read and parse a config file, with every problem prefixed by the file name.
pub fn load(path: &std::path::Path) -> anyhow::Result<Config> {
    load_text(path).map(|(cfg, _)| cfg)
}

/// [`load`], also returning the file's text.
pub fn load_text(path: &std::path::Path) -> anyhow::Result<(Config, String)> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
    let mut cfg = parse(&text).map_err(|problems| {
        let lines: Vec<String> = problems
            .iter()
            .map(|p| format!("{}:{p}", path.display()))
            .collect();
        anyhow::anyhow!(
            "config {} has {} problem(s):\n{}",
            path.display(),
            problems.len(),
            lines.join("\n")
        )
    })?;
    for p in read_assignments(&mut cfg, path) {
        // The good lines are kept: a bad line must not leave every GPU unowned.
        tracing::warn!(problem = %p, "assignments file");
    }
    Ok((cfg, text))
}

/// The top-level keys other than `collectors` whose values differ between two config texts
/// (comments, layout and key order aside): the settings a reload does not apply. A text that
/// does not parse counts as empty.
pub fn changed_outside_collectors(old: &str, new: &str) -> Vec<String> {
    let values = |text: &str| -> serde_json::Map<String, serde_json::Value> {
        match ImDocument::parse(text) {
            Ok(doc) => doc
                .as_table()
                .iter()
                .filter(|(k, _)| *k != "collectors" && *k != "collector_hosts")
                .map(|(k, item)| (k.to_string(), json_of_item(item)))
                .collect(),
            Err(_) => Default::default(),
        }
    };
    let (old, new) = (values(old), values(new));
    let mut keys: Vec<String> = old
        .keys()
        .chain(new.keys())
        .filter(|k| old.get(*k) != new.get(*k))
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// A TOML item as JSON: equal for equal values however they are written.
fn json_of_item(item: &Item) -> serde_json::Value {
    use serde_json::Value as J;
    let table = |t: &Table| {
        J::Object(
            t.iter()
                .map(|(k, v)| (k.to_string(), json_of_item(v)))
                .collect(),
        )
    };
    match item {
        Item::None => J::Null,
        Item::Value(v) => json_of_value(v),
        Item::Table(t) => table(t),
        Item::ArrayOfTables(a) => J::Array(a.iter().map(table).collect()),
    }
}

fn json_of_value(v: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Value::String(s) => J::from(s.value().as_str()),
        Value::Integer(i) => J::from(*i.value()),
        Value::Float(f) => J::from(*f.value()),
        Value::Boolean(b) => J::from(*b.value()),
        Value::Datetime(d) => J::from(d.value().to_string()),
        Value::Array(a) => J::Array(a.iter().map(json_of_value).collect()),
        Value::InlineTable(t) => J::Object(
            t.iter()
                .map(|(k, v)| (k.to_string(), json_of_value(v)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_config_parses() {
        let cfg = parse(
            r#"
listen = "127.0.0.1:9000"
database_url = "postgres://localhost/gpuledger"
[thresholds]
idle_pct = 3
stale_window_secs = 3600
[retention]
raw_days = 7
rollup_days = 365
audit_days = 90
[auth]
read_requires_token = true
[ingest]
max_body_bytes = 2048
records_per_sec = 500
records_burst = 5000
new_gpus_per_day = 0
[server]
header_timeout_secs = 5
body_timeout_secs = 30
max_connections = 2000
[rates]
"H100" = 9.8
"#,
        )
        .unwrap();
        assert_eq!(
            cfg.web.server,
            gpuledger_web::ServerLimits {
                header_timeout: std::time::Duration::from_secs(5),
                body_timeout: std::time::Duration::from_secs(30),
                max_connections: 2000,
            }
        );
        assert_eq!(
            parse("").unwrap().web.server,
            gpuledger_web::ServerLimits::default()
        );
        assert_eq!(cfg.listen.as_deref(), Some("127.0.0.1:9000"));
        assert_eq!(cfg.settings.idle_threshold_pct, 3.0);
        assert_eq!(cfg.settings.raw_retention_days, 7);
        assert!(cfg.web.read_requires_token);
        assert_eq!(cfg.web.limits.max_body_bytes, 2048);
        assert_eq!(
            cfg.web.rate,
            Some(gpuledger_web::RateLimit {
                records_per_sec: 500.0,
                burst: 5000.0
            })
        );
        assert_eq!(cfg.settings.new_gpus_per_day, None);
        assert_eq!(cfg.settings.audit_retention_days, 90);
        assert!(
            parse("collector_hosts = [\"*.example.com\", \"10.0.0.0/8\"]")
                .unwrap()
                .collector_hosts
                .allows("prom.example.com")
        );
        let e = parse("collector_hosts = [\"http://x\"]").unwrap_err();
        assert!(e[0].to_string().contains("collector_hosts"), "{e:?}");
        assert!(
            parse("[database]\nsqlite_synchronous = \"full\"")
                .unwrap()
                .settings
                .sqlite_full_sync
        );
        assert!(parse("[database]\nsqlite_synchronous = \"off\"").is_err());
        assert_eq!(
            parse("[database]\nsqlite_max_size_mib = 2048")
                .unwrap()
                .settings
                .sqlite_max_size_mib,
            Some(2048)
        );
        let defaults = parse("").unwrap();
        assert_eq!(defaults.web.rate, Some(gpuledger_web::RateLimit::default()));
        assert_eq!(defaults.settings.new_gpus_per_day, Some(10_000));
        assert!(parse("[ingest]\nrecords_per_sec = 0")
            .unwrap()
            .web
            .rate
            .is_none());
        assert_eq!(cfg.settings.rates.overrides["H100"], 9.8);
        assert!(parse("").unwrap().collectors.is_empty());
    }

    #[test]
    fn proxy_identity_maps_groups_to_teams() {
        let cfg = parse(
            "[auth]\nread_requires_token = true\nproxy_user_header = \"X-Forwarded-User\"\n\
             proxy_groups_header = \"X-Forwarded-Groups\"\n[auth.groups]\n\"nlp-eng\" = [\"NLP\"]\n\
             admins = [\"*\"]\n",
        )
        .unwrap();
        let p = cfg.web.proxy.unwrap();
        assert_eq!(p.user_header, "x-forwarded-user");
        assert_eq!(p.groups["nlp-eng"], vec!["nlp".to_string()]);
        assert_eq!(p.groups["admins"], vec!["*".to_string()]);
        let text: Vec<String> = parse(
            "[auth]\nproxy_user_header = \"X-User\"\nproxy_groups_header = \"X-Groups\"\n\
             [auth.groups]\nx = \"nlp\"\n",
        )
        .unwrap_err()
        .iter()
        .map(|p| p.to_string())
        .collect();
        assert!(
            text.iter()
                .any(|t| t.contains("auth.groups.x: must be a list of team names")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("needs read_requires_token = true")),
            "{text:?}"
        );
    }

    #[test]
    fn tls_needs_both_files_and_they_must_exist() {
        let text = |src: &str| -> Vec<String> {
            parse(src)
                .unwrap_err()
                .iter()
                .map(|p| p.to_string())
                .collect()
        };
        let one = text("[server]\ntls_cert = \"/etc/hosts\"\n");
        assert_eq!(one.len(), 1, "{one:?}");
        assert!(
            one[0].contains("server.tls_cert: set both tls_cert and tls_key"),
            "{one:?}"
        );
        let missing =
            text("[server]\ntls_cert = \"/etc/hosts\"\ntls_key = \"/nonexistent/k.pem\"\n");
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(
            missing[0].contains("server.tls_key: no file at `/nonexistent/k.pem`"),
            "{missing:?}"
        );
        let both =
            parse("[server]\ntls_cert = \"/etc/hosts\"\ntls_key = \"/etc/hostname\"\n").unwrap();
        assert_eq!(
            both.web.tls,
            Some(gpuledger_web::TlsFiles {
                cert: "/etc/hosts".into(),
                key: "/etc/hostname".into()
            })
        );
    }

    #[test]
    fn every_problem_is_reported_with_its_position() {
        let problems = parse(
            "listen = \"nowhere\"\nlisten_addr = 1\n[thresholds]\nidle_pct = 500\n[rates]\nH100 = \"cheap\"\n[[collectors]]\ntype = \"lsf\"\n",
        )
        .unwrap_err();
        let text: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(text.len(), 6, "{text:#?}");
        assert!(
            text[0].starts_with("2:1: listen_addr: unknown key"),
            "{text:#?}"
        );
        assert!(
            text[1].starts_with("1:10: listen: must be an address"),
            "{text:#?}"
        );
        assert!(
            text[2].starts_with("4:12: thresholds.idle_pct: must be within 0..=100, got 500"),
            "{text:#?}"
        );
        assert!(
            text[3].starts_with("6:8: rates.H100: must be a number"),
            "{text:#?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("collectors[0]: needs `name`")),
            "{text:#?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("collectors[0].type: unknown collector type")),
            "{text:#?}"
        );
    }

    #[test]
    fn instance_and_onprem_rates_parse_and_explain_mistakes() {
        let cfg = parse(
            "[rates]\nH100 = 9.8\n[rates.instance_types]\n\"p5.48xlarge\" = 55.04\n\"g6f.large\" = { usd_per_hour = 0.2, gpus = 0.125 }\n[[rates.onprem]]\nmodel = \"H100\"\nhosts = \"dgx-*\"\npurchase_usd = 35040\nlife_years = 4\nwatts = 700\nusd_per_kwh = 0.1\npue = 1.5\n",
        )
        .unwrap();
        let r = &cfg.settings.rates;
        assert_eq!(r.overrides["H100"], 9.8);
        assert_eq!(r.instance_overrides["p5.48xlarge"].usd_per_hour, 55.04);
        assert_eq!(r.instance_overrides["g6f.large"].gpus, Some(0.125));
        assert_eq!(r.onprem[0].hosts.as_deref(), Some("dgx-*"));
        assert!((r.onprem[0].usd_per_hour() - 1.105).abs() < 1e-9);
        let problems = parse(
            "[rates.instance_types]\n\"x9.huge\" = 3.0\n[[rates.onprem]]\nmodel = \"H100\"\nlife_years = 4\npue = 0.5\ncolour = 1\n",
        )
        .unwrap_err();
        let text: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        assert!(
            text.iter().any(|t| t.contains(
                "rates.instance_types.x9.huge: `x9.huge` is not in the built-in catalog"
            )),
            "{text:#?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("rates.onprem[0]: needs `purchase_usd`")),
            "{text:#?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("rates.onprem[0].pue: must be within 1..=5")),
            "{text:#?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("rates.onprem[0].colour: unknown key")),
            "{text:#?}"
        );
    }

    #[test]
    fn notifications_rules_channels_and_team_contacts() {
        let text = r#"
[teams.nlp]
manager = "Ana Ruiz"
email = ["ana@example.com", "nlp-leads@example.com"]
webhook = "https://hooks.slack.com/services/T0/B0/x"

[teams.vision]
webhook = "https://example.webhook.office.com/webhookb2/x"
webhook_style = "teams"

[notifications]
dashboard_url = "https://gpuledger.example.com"
central = ["email:gpu-platform@example.com", "webhook:platform"]
rate_per_hour = 5

[notifications.smtp]
host = "smtp.example.com"
username = "gpuledger"
password_file = "/etc/gpuledger/smtp-password"
from = "gpuledger <gpuledger@example.com>"

[notifications.webhooks.platform]
url = "https://hooks.slack.com/services/T0/B1/y"

[[notifications.rules]]
kind = "idle_gpu"
days = 3
min_usd_per_month = 500
to = "owner"

[[notifications.rules]]
name = "stale sources"
kind = "stale_source"
to = ["central"]

[notifications.digest]
weekday = "monday"
hour = 8
"#;
        let cfg = parse(text).unwrap();
        let n = cfg.notifications.unwrap();
        assert_eq!(n.rate_per_hour, 5);
        let smtp = n.smtp.unwrap();
        assert_eq!((smtp.port, smtp.security), (587, SmtpSecurity::StartTls));
        assert_eq!(n.rules.len(), 2);
        assert_eq!(
            n.rules[0].kind,
            RuleKind::IdleGpu {
                days: 3,
                min_usd_per_month: 500.0
            }
        );
        assert_eq!(n.rules[0].to, ["owner"]);
        assert_eq!(n.rules[1].name, "stale sources");
        assert_eq!(n.teams["nlp"].email.len(), 2);
        assert_eq!(
            n.teams["vision"].webhook.as_ref().map(|w| w.style),
            Some(WebhookStyle::Teams)
        );
        assert_eq!(
            n.digest,
            Some(DigestConfig {
                weekday: 0,
                hour: 8,
                to: vec!["owner".into()]
            })
        );
        let bad = parse(
            "[teams.x]\nwebhook = \"http://hooks.example.com/x\"\nemail = \"nobody\"\n\
             [notifications]\ncentral = [\"owner\"]\n[notifications.smtp]\nhost = \"h\"\n\
             username = \"u\"\n[[notifications.rules]]\nkind = \"idle\"\nto = \"webhook:nope\"\n\
             [[notifications.rules]]\nkind = \"team_idle_cost\"\nto = \"central\"\n",
        )
        .unwrap_err();
        let text: Vec<String> = bad.iter().map(|p| p.to_string()).collect();
        for want in [
            "teams.x.webhook: must be an https:// URL",
            "teams.x.email: `nobody` is not an e-mail address",
            "notifications.dashboard_url: missing",
            "notifications.central: must name addresses or webhooks",
            "notifications.smtp.from: missing",
            "notifications.smtp.username: username and password_file go together",
            "notifications.rules[0].kind: `idle`: must be idle_gpu",
            "notifications.rules[0].to: `webhook:nope`",
            "notifications.rules[1].usd_per_week: missing",
        ] {
            assert!(text.iter().any(|t| t.contains(want)), "{want}: {text:#?}");
        }
    }

    #[test]
    fn ownership_rules_teams_and_assignments() {
        let dir = std::env::temp_dir().join(format!("gpuledger-cfg-own-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("owners.csv"),
            "target,team,env\ndgx-*,research,lab\nbad\n",
        )
        .unwrap();
        let text = "[ownership]\nassignments = \"owners.csv\"\n\n[[ownership.rules]]\nname = \"rdu nlp\"\nwhen = { cluster = \"rdu-*\", namespace = \"nlp-*\" }\nteam = \"nlp\"\nenv = \"prod\"\n\n[[ownership.rules]]\nteam_from = \"label.squad\"\n\n[[ownership.rules]]\nwhen = { \"slurm.partition\" = \"a100*\" }\nteam_from = \"slurm.account\"\n\n[teams.nlp]\ndisplay_name = \"Language\"\nmanager = \"Ana Ruiz\"\ncost_center = \"CC-4410\"\n";
        std::fs::write(dir.join("g.toml"), text).unwrap();
        let mut cfg = parse(text).unwrap();
        let o = &cfg.settings.ownership;
        assert_eq!(o.rules.len(), 3);
        assert_eq!(o.rules[0].when.len(), 2);
        assert!(o.rules[0].reads_workloads() && !o.rules[1].reads_workloads());
        assert!(o.rules[2].reads_workloads());
        assert_eq!(cfg.web.teams["nlp"].cost_center.as_deref(), Some("CC-4410"));
        let problems = read_assignments(&mut cfg, &dir.join("g.toml"));
        assert_eq!(cfg.settings.ownership.assignments.len(), 1);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let bad = parse(
            "[[ownership.rules]]\nwhen = { kube_namespace = \"x\" }\nteam = \"a\"\nteam_from = \"label.t\"\n[[ownership.rules]]\nname = \"empty\"\n[teams.x]\nboss = \"y\"\n",
        )
        .unwrap_err();
        let text: Vec<String> = bad.iter().map(|p| p.to_string()).collect();
        for want in [
            "ownership.rules[0].when.kube_namespace: `kube_namespace` is no attribute a rule can read",
            "ownership.rules[0]: set `team` or `team_from`, not both",
            "ownership.rules[1]: sets nothing",
            "teams.x.boss: unknown key",
        ] {
            assert!(text.iter().any(|t| t.contains(want)), "{want}: {text:#?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn contracts_parse_and_explain_mistakes() {
        let cfg = parse(
            "[[rates.contracts]]\nname = \"p5 plan\"\ndeal = \"savings_plan\"\nwhen = { account = \"1111*\", instance_type = \"p5.*\" }\nusd_per_hour = 55.04\n\n[[rates.contracts]]\nname = \"cud\"\ndeal = \"committed\"\nwhen = { account = \"ml-prod\" }\ndiscount_pct = 37\n",
        )
        .unwrap();
        let c = &cfg.settings.rates.contracts;
        assert_eq!(c.len(), 2);
        assert_eq!(
            c[1].price,
            gpuledger_ledger::ContractPrice::Discount { pct: 37.0 }
        );
        let bad = parse(
            "[[rates.contracts]]\nname = \"x\"\ndeal = \"cheap\"\nwhen = { namespace = \"a\", uuid = \"GPU-1\" }\nusd_per_hour = 1\ndiscount_pct = 5\n[[rates.contracts]]\ndeal = \"spot\"\nusd_per_gpu_hour = 1\ngpus = 2\n",
        )
        .unwrap_err();
        let text: Vec<String> = bad.iter().map(|p| p.to_string()).collect();
        for want in [
            "rates.contracts[0].deal: `cheap` is none of spot, reserved",
            "rates.contracts[0].when.namespace: `namespace` is an attribute of a workload",
            "rates.contracts[0].when.uuid: a price cannot match `uuid`",
            "rates.contracts[0]: needs exactly one price",
            "rates.contracts[1]: needs `name`",
            "rates.contracts[1]: needs `when`",
            "rates.contracts[1].gpus: goes with `usd_per_hour`",
        ] {
            assert!(text.iter().any(|t| t.contains(want)), "{want}: {text:#?}");
        }
    }

    /// A reload applies only `[[collectors]]`: it names the other settings that changed, and
    /// not those merely rewritten (comments, layout, an inline table for a table).
    #[test]
    fn a_reload_names_the_settings_it_does_not_apply() {
        let old =
            "listen = \"127.0.0.1:9000\"\n[rates]\nH100 = 9.8\n[server]\nmax_connections = 10\n\
                   [[collectors]]\ntype = \"dcgm\"\nname = \"a\"\n";
        let same = "# moved around, commented\nserver = { max_connections = 10 }\nlisten = '127.0.0.1:9000'\n\
                    [rates]\n\"H100\" = 9.80   # the list price\n[[collectors]]\ntype = \"dcgm\"\nname = \"b\"\n";
        assert!(changed_outside_collectors(old, same).is_empty());
        let changed = "listen = \"127.0.0.1:9000\"\n[rates]\nH100 = 9.9\n[auth]\nread_requires_token = true\n";
        assert_eq!(
            changed_outside_collectors(old, changed),
            ["auth", "rates", "server"]
        );
    }

    #[test]
    fn syntax_errors_have_a_position() {
        let p = parse("listen = \n").unwrap_err();
        assert_eq!(p.len(), 1);
        assert!(p[0].to_string().starts_with("1:"), "{}", p[0]);
        assert!(p[0].message.contains("not valid TOML"));
    }
}
