//! Notifications: findings told to the people who own them instead of waiting on a page.
//!
//! Each round ([`Notifier::round`]) evaluates the configured rules on the figures `ledger`
//! already defines (the Waste page's findings, the summary's idle cost, the sources' status),
//! resolves each finding's audience to targets (an e-mail address or a webhook), and sends what
//! is new or changed since the last message, and a "resolved" once a finding clears. What was
//! told is kept per finding and target (`notify_state`), every delivery attempt in the delivery
//! log (`notify_log`, the Notifications page). A target gets at most `rate_per_hour` messages an
//! hour; the rest wait for a later round. A failed delivery is retried with backoff within the
//! round, then again next round. Once a week each team's digest goes to its targets.

mod send;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Datelike, Timelike, Utc};
use gpuledger_ledger::waste::{Finding, FindingKind};
use gpuledger_ledger::GroupBy;
use gpuledger_model::{SourceStatus, UNOWNED};
use gpuledger_store::{Delivery, Filters, NotifyState, Window};

use crate::params::{Params, ReadScope};
use crate::AppState;

pub use send::{Message, Sender};

/// `[notifications]` in the config.
#[derive(Debug, Clone, PartialEq)]
pub struct NotifyConfig {
    /// The dashboard's address as people reach it (`https://gpuledger.example.com`): every
    /// message links to the view with the evidence.
    pub dashboard_url: String,
    /// Seconds between rounds in the server.
    pub every_secs: u64,
    /// Messages a target gets at most per hour.
    pub rate_per_hour: i64,
    /// Attempts per delivery in one round, and the first pause between them (doubling).
    pub attempts: u32,
    pub retry_base: Duration,
    pub smtp: Option<SmtpConfig>,
    /// Named webhooks (`[notifications.webhooks.<name>]`), for `webhook:<name>` audiences.
    pub webhooks: BTreeMap<String, WebhookConfig>,
    /// Who `central` is: targets like `email:gpu-platform@example.com`, `webhook:platform`.
    pub central: Vec<String>,
    pub rules: Vec<Rule>,
    /// The weekly team digest: its day and hour (UTC) and audience.
    pub digest: Option<DigestConfig>,
    /// Each team's contacts from the team registry (`[teams.<name>] email`, `webhook`).
    pub teams: BTreeMap<String, TeamContact>,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        NotifyConfig {
            dashboard_url: "http://127.0.0.1:8080".into(),
            every_secs: 300,
            rate_per_hour: 20,
            attempts: 3,
            retry_base: Duration::from_secs(2),
            smtp: None,
            webhooks: BTreeMap::new(),
            central: Vec::new(),
            rules: Vec::new(),
            digest: None,
            teams: BTreeMap::new(),
        }
    }
}

/// The SMTP server messages go through.
#[derive(Debug, Clone, PartialEq)]
pub struct SmtpConfig {
    pub host: String,
    pub port: u16,
    /// `starttls` (default, required), `tls` (implicit TLS, port 465) or `none` (only for a
    /// relay on the same machine).
    pub security: SmtpSecurity,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    pub from: String,
    /// A CA certificate (PEM) to trust besides the system's, for an internal relay.
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmtpSecurity {
    StartTls,
    Tls,
    None,
}

/// A webhook: its address and the shape of the JSON it takes.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookConfig {
    pub url: String,
    pub style: WebhookStyle,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookStyle {
    /// Slack incoming webhooks (and Mattermost, Rocket.Chat): `{"text": …}`.
    Slack,
    /// Microsoft Teams incoming webhooks: a MessageCard.
    Teams,
    /// Every field of the finding as JSON, for a receiver of one's own.
    Generic,
}

impl WebhookStyle {
    pub fn parse(s: &str) -> Option<WebhookStyle> {
        match s {
            "slack" => Some(WebhookStyle::Slack),
            "teams" => Some(WebhookStyle::Teams),
            "generic" => Some(WebhookStyle::Generic),
            _ => None,
        }
    }
}

/// A team's contacts in the registry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TeamContact {
    pub email: Vec<String>,
    pub webhook: Option<WebhookConfig>,
}

/// One rule: what to look for and whom to tell.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub name: String,
    pub kind: RuleKind,
    /// `owner` (the owning team's contacts, else `central`), `central`, `email:<address>`,
    /// `webhook:<name>`.
    pub to: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RuleKind {
    /// A GPU idle (no busy hour) for `days` days or more, worth at least `min_usd_per_month`
    /// (the Waste page's "idle GPU" finding).
    IdleGpu { days: i64, min_usd_per_month: f64 },
    /// A workload holding GPUs that stayed idle, worth at least `min_usd_per_month` over the
    /// last 7 days (the Waste page's "allocated but idle").
    AllocatedIdle { min_usd_per_month: f64 },
    /// A team's idle cost over the last 7 days at or above `usd_per_week` (the summary's idle
    /// cost).
    TeamIdleCost { usd_per_week: f64 },
    /// A source stale past the freshness objective or failing, until it is fresh again.
    StaleSource,
    /// Present GPUs no ownership rule, assignment or label places.
    UnownedGpus,
    /// Billed instances no source sees (the Waste page's "billed, not seen").
    BilledUnseen { min_usd_per_month: f64 },
}

impl RuleKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            RuleKind::IdleGpu { .. } => "idle_gpu",
            RuleKind::AllocatedIdle { .. } => "allocated_idle",
            RuleKind::TeamIdleCost { .. } => "team_idle_cost",
            RuleKind::StaleSource => "stale_source",
            RuleKind::UnownedGpus => "unowned_gpus",
            RuleKind::BilledUnseen { .. } => "billed_unseen",
        }
    }
}

/// When the weekly digest goes out, and to whom.
#[derive(Debug, Clone, PartialEq)]
pub struct DigestConfig {
    /// 0 = Monday … 6 = Sunday.
    pub weekday: u32,
    pub hour: u32,
    pub to: Vec<String>,
}

/// A finding worth telling: what the rules found this round.
#[derive(Debug, Clone, PartialEq)]
pub struct Alert {
    /// Stable across rounds while it is the same finding.
    pub key: String,
    pub rule: String,
    /// The owning team (for `owner`), when it has one.
    pub team: Option<String>,
    pub subject: String,
    pub lines: Vec<String>,
    /// The dashboard view with the evidence, absolute.
    pub link: String,
    pub usd_per_month: Option<f64>,
    /// A change here is worth a new message.
    pub fingerprint: String,
    pub to: Vec<String>,
}

/// Where a message goes: an e-mail address, or a webhook.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    Email(String),
    Webhook { id: String, url: String, style: u8 },
}

impl Target {
    /// The target as the state and the log name it (a webhook by its name, never its URL,
    /// which is a secret).
    pub fn id(&self) -> String {
        match self {
            Target::Email(a) => format!("email:{a}"),
            Target::Webhook { id, .. } => format!("webhook:{id}"),
        }
    }
}

fn style_code(s: WebhookStyle) -> u8 {
    match s {
        WebhookStyle::Slack => 0,
        WebhookStyle::Teams => 1,
        WebhookStyle::Generic => 2,
    }
}

fn style_of(code: u8) -> WebhookStyle {
    match code {
        0 => WebhookStyle::Slack,
        1 => WebhookStyle::Teams,
        _ => WebhookStyle::Generic,
    }
}

/// What one round did (or, dry, would do).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoundReport {
    /// Every message of the round: (event, target id, subject, link, outcome).
    pub messages: Vec<(String, String, String, String, String)>,
}

/// The notifier: the server's state, its config and a sender.
pub struct Notifier {
    pub state: AppState,
    pub config: NotifyConfig,
    pub sender: Sender,
}

/// A threshold finding already told clears only below this share of its threshold.
pub const CLEAR_BELOW: f64 = 0.9;

/// Whether fingerprint `new` is a lower step than `old` (both doubling steps of a threshold).
fn lower(new: &str, old: &str) -> bool {
    matches!((new.parse::<i64>(), old.parse::<i64>()), (Ok(n), Ok(o)) if n < o)
}

/// How far back the findings and idle costs look: the last 7 days.
const LOOKBACK_DAYS: i64 = 7;

impl Notifier {
    pub fn new(state: AppState, config: NotifyConfig) -> Notifier {
        let sender = Sender::new(&config);
        Notifier {
            state,
            config,
            sender,
        }
    }

    /// The absolute link of a dashboard path with the round's range.
    fn link(&self, path: &str, extra: &str) -> String {
        let base = self.config.dashboard_url.trim_end_matches('/');
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut q = format!("range={LOOKBACK_DAYS}d");
        if !extra.is_empty() {
            q.push('&');
            q.push_str(extra);
        }
        format!("{base}{path}{sep}{q}")
    }

    /// Every finding the rules give now.
    pub async fn evaluate(&self, now: DateTime<Utc>) -> anyhow::Result<Vec<Alert>> {
        self.evaluate_with(now, &BTreeSet::new()).await
    }

    /// Every finding the rules give now; `open` are the keys of findings already told and not
    /// resolved, which a threshold rule keeps until their figure falls [`CLEAR_BELOW`] of the
    /// way under the threshold, so a figure wavering around it does not flap.
    async fn evaluate_with(
        &self,
        now: DateTime<Utc>,
        open: &BTreeSet<String>,
    ) -> anyhow::Result<Vec<Alert>> {
        let store = &self.state.store;
        let mut out = Vec::new();
        let window = Window {
            from: now.timestamp() - LOOKBACK_DAYS * 86_400,
            to: now.timestamp(),
        };
        let mut findings_by_days: BTreeMap<i64, Vec<Finding>> = BTreeMap::new();
        for rule in &self.config.rules {
            let days = match &rule.kind {
                RuleKind::IdleGpu { days, .. } => Some(*days),
                RuleKind::AllocatedIdle { .. } | RuleKind::BilledUnseen { .. } => Some(7),
                _ => None,
            };
            if let Some(d) = days {
                if let std::collections::btree_map::Entry::Vacant(e) = findings_by_days.entry(d) {
                    e.insert(self.findings(d).await?);
                }
            }
        }
        for rule in &self.config.rules {
            let alert = |key: String,
                         team: Option<String>,
                         subject: String,
                         lines: Vec<String>,
                         link: String,
                         usd: Option<f64>,
                         fingerprint: String| Alert {
                key: format!("{}:{key}", rule.kind.as_str()),
                rule: rule.name.clone(),
                team,
                subject,
                lines,
                link,
                usd_per_month: usd,
                fingerprint,
                to: rule.to.clone(),
            };
            match &rule.kind {
                RuleKind::IdleGpu {
                    days,
                    min_usd_per_month,
                } => {
                    for x in &findings_by_days[days] {
                        let Some(usd) = x.usd_per_month.filter(|m| *m >= *min_usd_per_month) else {
                            continue;
                        };
                        if x.kind != FindingKind::IdleGpu {
                            continue;
                        }
                        out.push(alert(
                            x.evidence.clone(),
                            owned(&x.team),
                            format!(
                                "Idle GPU {}: {} ({}, ${usd:.0}/month)",
                                short_gpu(&x.evidence),
                                x.what,
                                x.team
                            ),
                            vec![
                                format!("{}: {}", x.kind.label(), x.detail),
                                format!("Team: {}", x.team),
                                format!("Worth ${usd:.0} per month while it stays idle."),
                            ],
                            self.link(&x.evidence, ""),
                            Some(usd),
                            // The same GPU idle at the same rate is the same finding.
                            format!("{usd:.0}"),
                        ));
                    }
                }
                RuleKind::AllocatedIdle { min_usd_per_month } => {
                    for x in &findings_by_days[&7] {
                        let Some(usd) = x.usd_per_month.filter(|m| *m >= *min_usd_per_month) else {
                            continue;
                        };
                        if x.kind != FindingKind::AllocatedIdle {
                            continue;
                        }
                        out.push(alert(
                            x.what.clone(),
                            owned(&x.team),
                            format!("Allocated but idle: {} (${usd:.0}/month)", x.what),
                            vec![
                                format!("{}: {}", x.kind.label(), x.detail),
                                format!("Team: {}", x.team),
                            ],
                            self.link(&x.evidence, ""),
                            Some(usd),
                            bucket(usd, *min_usd_per_month),
                        ));
                    }
                }
                RuleKind::BilledUnseen { min_usd_per_month } => {
                    for x in &findings_by_days[&7] {
                        if x.kind != FindingKind::BilledUnseen {
                            continue;
                        }
                        let usd = x.usd_per_month;
                        if usd.unwrap_or(0.0) < *min_usd_per_month {
                            continue;
                        }
                        out.push(alert(
                            x.what.clone(),
                            owned(&x.team),
                            format!("Billed but not seen: {}", x.what),
                            vec![format!("{}: {}", x.kind.label(), x.detail)],
                            self.link(&x.evidence, ""),
                            usd,
                            String::new(),
                        ));
                    }
                }
                RuleKind::TeamIdleCost { usd_per_week } => {
                    let s = store
                        .summary(window, &Filters::default(), GroupBy::Team, now)
                        .await?;
                    for g in &s.groups {
                        let told = open.contains(&format!("{}:{}", rule.kind.as_str(), g.key));
                        let bar = if told {
                            *usd_per_week * CLEAR_BELOW
                        } else {
                            *usd_per_week
                        };
                        if g.key == UNOWNED || g.idle_cost_usd < bar {
                            continue;
                        }
                        out.push(alert(
                            g.key.clone(),
                            Some(g.key.clone()),
                            format!(
                                "Team {}: ${:.0} of idle GPU time in the last 7 days",
                                g.key, g.idle_cost_usd
                            ),
                            vec![
                                format!(
                                    "{} GPUs, {} GPU-hours, {} idle hours ({} allocated but idle).",
                                    g.gpus, g.gpu_hours, g.idle_hours, g.allocated_idle_hours
                                ),
                                format!(
                                    "Idle cost ${:.0} (threshold ${usd_per_week:.0} per week); \
                                     allocated-but-idle cost ${:.0}.",
                                    g.idle_cost_usd, g.allocated_idle_cost_usd
                                ),
                            ],
                            self.link("/waste", &format!("team={}", enc(&g.key))),
                            None,
                            bucket(g.idle_cost_usd, *usd_per_week),
                        ));
                    }
                }
                RuleKind::StaleSource => {
                    for s in store.sources(now).await? {
                        let word = match s.status {
                            SourceStatus::Stale => "stale",
                            SourceStatus::Error => "failing",
                            _ => continue,
                        };
                        let last = s
                            .last_success
                            .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
                            .unwrap_or_else(|| "never".into());
                        let mut lines = vec![format!("Last success: {last}.")];
                        if let Some(e) = &s.last_error {
                            lines.push(format!("Last error: {e}"));
                        }
                        out.push(alert(
                            s.name.clone(),
                            None,
                            format!("Source {} is {word}", s.name),
                            lines,
                            self.link("/sources", ""),
                            None,
                            word.to_string(),
                        ));
                    }
                }
                RuleKind::UnownedGpus => {
                    let f = Filters {
                        team: vec![UNOWNED.to_string()],
                        ..Filters::default()
                    };
                    let gpus: Vec<_> = store
                        .list_gpus(&f, false, now)
                        .await?
                        .into_iter()
                        .filter(|g| g.state == gpuledger_model::GpuState::Present)
                        .collect();
                    if gpus.is_empty() {
                        continue;
                    }
                    let uuids: BTreeSet<&str> = gpus.iter().map(|g| &*g.uuid).collect();
                    let mut lines: Vec<String> = gpus
                        .iter()
                        .take(10)
                        .map(|g| {
                            format!(
                                "{} ({} on {})",
                                g.uuid,
                                g.model,
                                g.host.as_deref().unwrap_or("unknown host")
                            )
                        })
                        .collect();
                    if gpus.len() > 10 {
                        lines.push(format!("… and {} more", gpus.len() - 10));
                    }
                    out.push(alert(
                        "fleet".into(),
                        None,
                        match gpus.len() {
                            1 => "1 GPU has no owner".to_string(),
                            n => format!("{n} GPUs have no owner"),
                        },
                        lines,
                        self.link("/inventory", &format!("team={UNOWNED}")),
                        None,
                        // A new unowned GPU is worth a new message; one placed is not.
                        short_hash(&uuids.into_iter().collect::<Vec<_>>().join(",")),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// The Waste page's findings over the last 7 days, fleet-wide.
    async fn findings(&self, idle_days: i64) -> anyhow::Result<Vec<Finding>> {
        let state = &self.state;
        let now = state.now();
        let p = Params {
            range_days: Some(LOOKBACK_DAYS),
            ..Params::default()
        };
        let store = &state.store;
        let sources = store.sources(now).await?;
        let frame = crate::ui::frame(
            state,
            &p,
            &ReadScope::default(),
            "/waste",
            "Waste",
            &sources,
        )
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
        let window = p.window(now);
        // The findings alone: a digest shows no table.
        let listing = crate::ui::findings::Listing {
            idle_days,
            tables: false,
            top: None,
            rows: None,
        };
        let (gpus, windows, reads) = tokio::try_join!(
            store.list_gpus_brief(&p.filters, now),
            store.gpu_totals_with_peak(window, &p.filters, now),
            crate::ui::findings::findings_reads(state, &p, &listing),
        )?;
        let found =
            crate::ui::findings::findings(state, &p, &frame, listing, &gpus, &windows, reads);
        // Evidence paths without the page's query: the message adds its own range.
        Ok(found
            .all
            .into_iter()
            .map(|mut x| {
                x.evidence = x.evidence.split('?').next().unwrap_or_default().to_string();
                x
            })
            .collect())
    }

    /// The targets an audience list names for a finding of `team`: `owner` is the team's
    /// contacts, else (with `fallback`) the central team.
    pub fn targets(&self, to: &[String], team: Option<&str>, fallback: bool) -> Vec<Target> {
        let mut out = BTreeSet::new();
        for a in to {
            self.resolve(a, team, fallback, &mut out, 0);
        }
        out.into_iter().collect()
    }

    fn resolve(
        &self,
        a: &str,
        team: Option<&str>,
        fallback: bool,
        out: &mut BTreeSet<Target>,
        depth: u8,
    ) {
        if depth > 2 {
            return;
        }
        if a == "owner" {
            let contact = team.and_then(|t| self.config.teams.get(t));
            match contact {
                Some(c) if !c.email.is_empty() || c.webhook.is_some() => {
                    for e in &c.email {
                        out.insert(Target::Email(e.clone()));
                    }
                    if let Some(w) = &c.webhook {
                        out.insert(Target::Webhook {
                            id: format!("team:{}", team.unwrap_or_default()),
                            url: w.url.clone(),
                            style: style_code(w.style),
                        });
                    }
                }
                // A team without contacts (or no team): the central team hears of it.
                _ if fallback => {
                    for c in self.config.central.clone() {
                        self.resolve(&c, None, false, out, depth + 1);
                    }
                }
                _ => {}
            }
        } else if a == "central" {
            for c in self.config.central.clone() {
                self.resolve(&c, None, false, out, depth + 1);
            }
        } else if let Some(addr) = a.strip_prefix("email:") {
            out.insert(Target::Email(addr.to_string()));
        } else if let Some(name) = a.strip_prefix("webhook:") {
            if let Some(w) = self.config.webhooks.get(name) {
                out.insert(Target::Webhook {
                    id: name.to_string(),
                    url: w.url.clone(),
                    style: style_code(w.style),
                });
            }
        }
    }

    /// One round at `now`: what is new or changed goes out, what cleared is resolved, and the
    /// weekly digests when due. `dry`: nothing is sent or recorded; the report says what would be.
    pub async fn round(&self, now: DateTime<Utc>, dry: bool) -> anyhow::Result<RoundReport> {
        let mut report = RoundReport::default();
        let states: BTreeMap<(String, String), NotifyState> = self
            .state
            .store
            .notify_states()
            .await?
            .into_iter()
            .map(|s| ((s.key.clone(), s.audience.clone()), s))
            .collect();
        let open: BTreeSet<String> = states
            .values()
            .filter(|s| s.resolved_at.is_none() && s.sent_at.is_some())
            .map(|s| s.key.clone())
            .collect();
        let alerts = self.evaluate_with(now, &open).await?;
        let mut wanted = BTreeSet::new();
        for a in &alerts {
            for t in self.targets(&a.to, a.team.as_deref(), true) {
                let id = t.id();
                wanted.insert((a.key.clone(), id.clone()));
                let old = states.get(&(a.key.clone(), id.clone()));
                let event = match old {
                    None => "new",
                    Some(s) if s.resolved_at.is_some() => "new",
                    Some(s) if s.sent_at.is_none() => {
                        if s.fingerprint == a.fingerprint {
                            "new"
                        } else {
                            "changed"
                        }
                    }
                    // A figure that falls back a step is no news; one that rises is.
                    Some(s) if lower(&a.fingerprint, &s.fingerprint) => continue,
                    Some(s) if s.fingerprint != a.fingerprint => "changed",
                    Some(_) => continue,
                };
                let msg = Message::of_alert(a, event);
                let outcome = self.deliver(&t, &a.key, event, &msg, now, dry).await?;
                report.messages.push((
                    event.into(),
                    id.clone(),
                    msg.subject.clone(),
                    a.link.clone(),
                    outcome.clone(),
                ));
                if dry {
                    continue;
                }
                let sent = outcome == "sent";
                let opened = match old {
                    Some(s) if s.resolved_at.is_none() => s.opened_at,
                    _ => now.timestamp(),
                };
                self.state
                    .store
                    .put_notify_state(&NotifyState {
                        key: a.key.clone(),
                        audience: id,
                        rule: a.rule.clone(),
                        fingerprint: a.fingerprint.clone(),
                        subject: a.subject.clone(),
                        opened_at: opened,
                        sent_at: if sent {
                            Some(now.timestamp())
                        } else {
                            old.and_then(|s| s.sent_at.filter(|_| s.resolved_at.is_none()))
                        },
                        resolved_at: None,
                    })
                    .await?;
            }
        }
        // What cleared: a "resolved" to everyone who was told; nothing to those never told.
        for ((key, audience), s) in &states {
            if wanted.contains(&(key.clone(), audience.clone())) || key.starts_with("digest:") {
                continue;
            }
            if s.resolved_at.is_some() {
                // Forget it a month after it was resolved.
                if !dry && s.resolved_at.unwrap_or(0) < now.timestamp() - 30 * 86_400 {
                    self.state.store.drop_notify_state(key, audience).await?;
                }
                continue;
            }
            if s.sent_at.is_none() {
                if !dry {
                    self.state.store.drop_notify_state(key, audience).await?;
                }
                continue;
            }
            let Some(t) = self.target_of(audience, s) else {
                continue;
            };
            let msg = Message::resolved(s, &self.link_for_state(s));
            let outcome = self.deliver(&t, key, "resolved", &msg, now, dry).await?;
            report.messages.push((
                "resolved".into(),
                audience.clone(),
                msg.subject.clone(),
                msg.link.clone(),
                outcome.clone(),
            ));
            if !dry && outcome == "sent" {
                let mut s = s.clone();
                s.resolved_at = Some(now.timestamp());
                self.state.store.put_notify_state(&s).await?;
            }
        }
        self.digests(now, dry, &states, &mut report).await?;
        Ok(report)
    }

    /// The target a state row names, when the config still knows it.
    fn target_of(&self, audience: &str, _s: &NotifyState) -> Option<Target> {
        if let Some(a) = audience.strip_prefix("email:") {
            return Some(Target::Email(a.to_string()));
        }
        let id = audience.strip_prefix("webhook:")?;
        let w = match id.strip_prefix("team:") {
            Some(team) => self.config.teams.get(team)?.webhook.as_ref()?,
            None => self.config.webhooks.get(id)?,
        };
        Some(Target::Webhook {
            id: id.to_string(),
            url: w.url.clone(),
            style: style_code(w.style),
        })
    }

    /// The link of a cleared finding: the view its messages linked to.
    fn link_for_state(&self, s: &NotifyState) -> String {
        match s.key.split_once(':') {
            Some(("stale_source", _)) => self.link("/sources", ""),
            Some(("idle_gpu", evidence)) if evidence.starts_with('/') => self.link(evidence, ""),
            Some(("unowned_gpus", _)) => self.link("/inventory", &format!("team={UNOWNED}")),
            Some(("team_idle_cost", team)) => self.link("/waste", &format!("team={}", enc(team))),
            _ => self.link("/waste", ""),
        }
    }

    /// Send `msg` to `t` (unless `dry`) with retries and the rate limit; log the outcome.
    async fn deliver(
        &self,
        t: &Target,
        key: &str,
        event: &str,
        msg: &Message,
        now: DateTime<Utc>,
        dry: bool,
    ) -> anyhow::Result<String> {
        let id = t.id();
        if dry {
            return Ok("dry run".into());
        }
        let store = &self.state.store;
        let channel = match t {
            Target::Email(_) => "smtp",
            Target::Webhook { .. } => "webhook",
        };
        let mut d = Delivery {
            at: now,
            key: key.to_string(),
            event: event.to_string(),
            audience: id.clone(),
            channel: channel.into(),
            recipient: id.clone(),
            subject: msg.subject.clone(),
            outcome: String::new(),
            attempts: 0,
            error: None,
        };
        if store.sent_since(&id, now.timestamp() - 3600).await? >= self.config.rate_per_hour {
            d.outcome = "rate_limited".into();
            store.log_delivery(&d).await?;
            return Ok(d.outcome);
        }
        let mut pause = self.config.retry_base;
        for attempt in 1..=self.config.attempts.max(1) {
            d.attempts = attempt as i64;
            let sent = match t {
                Target::Email(addr) => self.sender.email(addr, msg).await,
                Target::Webhook { url, style, .. } => {
                    self.sender.webhook(url, style_of(*style), msg).await
                }
            };
            match sent {
                Ok(()) => {
                    d.outcome = "sent".into();
                    d.error = None;
                    break;
                }
                Err(e) => {
                    d.outcome = "failed".into();
                    d.error = Some(e);
                    if attempt < self.config.attempts {
                        tokio::time::sleep(pause).await;
                        pause *= 2;
                    }
                }
            }
        }
        if d.outcome == "failed" {
            tracing::warn!(target = %id, key, error = ?d.error, "notification not delivered; retried next round");
        }
        store.log_delivery(&d).await?;
        Ok(d.outcome)
    }

    /// The weekly digest of each team, once per week at the configured day and hour.
    async fn digests(
        &self,
        now: DateTime<Utc>,
        dry: bool,
        states: &BTreeMap<(String, String), NotifyState>,
        report: &mut RoundReport,
    ) -> anyhow::Result<()> {
        let Some(cfg) = &self.config.digest else {
            return Ok(());
        };
        let due = now.weekday().num_days_from_monday() == cfg.weekday && now.hour() >= cfg.hour;
        if !due {
            return Ok(());
        }
        let week = now.iso_week();
        let store = &self.state.store;
        let this = Window {
            from: now.timestamp() - 7 * 86_400,
            to: now.timestamp(),
        };
        let last = Window {
            from: this.from - 7 * 86_400,
            to: this.from,
        };
        let all = Filters::default();
        let (cur, prev) = tokio::try_join!(
            store.summary(this, &all, GroupBy::Team, now),
            store.summary(last, &all, GroupBy::Team, now),
        )?;
        let findings = self.findings(7).await?;
        let (forecasts, _) = store.forecast(&all, GroupBy::Team, now).await?;
        for g in &cur.groups {
            if g.key == UNOWNED {
                continue;
            }
            let key = format!("digest:{}-W{:02}:{}", week.year(), week.week(), g.key);
            let before = prev.groups.iter().find(|p| p.key == g.key);
            let change = |now_v: f64, then: Option<f64>| match then {
                Some(t) => format!("{:+.0} vs the week before", now_v - t),
                None => "no figure for the week before".into(),
            };
            let mut lines = vec![
                format!("GPUs owned: {} ({} GPU-hours)", g.gpus, g.gpu_hours),
                format!(
                    "Cost: ${:.0} ({})",
                    g.cost_usd,
                    change(g.cost_usd, before.map(|b| b.cost_usd))
                ),
                format!(
                    "Idle cost: ${:.0} ({})",
                    g.idle_cost_usd,
                    change(g.idle_cost_usd, before.map(|b| b.idle_cost_usd))
                ),
                format!(
                    "Allocated but idle: {} hours, ${:.0}",
                    g.allocated_idle_hours, g.allocated_idle_cost_usd
                ),
            ];
            if let Some(f) = forecasts.iter().find(|f| f.key == g.key) {
                lines.push(match &f.month_end_usd {
                    Some(p) => format!(
                        "Month-end forecast: ${:.0} (range ${:.0} to ${:.0}; ${:.0} so far)",
                        p.expected, p.low, p.high, f.month_to_date_usd
                    ),
                    None => format!(
                        "Month-end forecast: none yet ({})",
                        f.note.as_deref().unwrap_or("not enough history")
                    ),
                });
            }
            if g.unpriced_gpu_hours > 0 {
                lines.push(format!(
                    "{} GPU-hours have no known rate and are not in the cost.",
                    g.unpriced_gpu_hours
                ));
            }
            let top: Vec<&Finding> = findings
                .iter()
                .filter(|x| x.team == g.key && x.usd_per_month.is_some())
                .take(5)
                .collect();
            if top.is_empty() {
                lines.push("No findings worth money this week.".into());
            } else {
                lines.push("Top findings:".into());
                for x in top {
                    lines.push(format!(
                        "- {} {}: ${:.0}/month",
                        x.kind.label(),
                        x.what,
                        x.usd_per_month.unwrap_or_default()
                    ));
                }
            }
            let alert = Alert {
                key: key.clone(),
                rule: "digest".into(),
                team: Some(g.key.clone()),
                subject: format!("Weekly GPU digest for team {}", g.key),
                lines,
                link: self.link(&format!("/teams/{}", enc(&g.key)), ""),
                usd_per_month: None,
                fingerprint: String::new(),
                to: cfg.to.clone(),
            };
            // A team without contacts gets no digest: the central team did not ask for
            // every team's week (name `central` in the digest's `to` for that).
            for t in self.targets(&alert.to, alert.team.as_deref(), false) {
                let id = t.id();
                if states.contains_key(&(key.clone(), id.clone())) {
                    continue;
                }
                let msg = Message::of_alert(&alert, "digest");
                let outcome = self.deliver(&t, &key, "digest", &msg, now, dry).await?;
                report.messages.push((
                    "digest".into(),
                    id.clone(),
                    msg.subject.clone(),
                    alert.link.clone(),
                    outcome.clone(),
                ));
                if !dry && outcome == "sent" {
                    store
                        .put_notify_state(&NotifyState {
                            key: key.clone(),
                            audience: id,
                            rule: "digest".into(),
                            fingerprint: String::new(),
                            subject: alert.subject.clone(),
                            opened_at: now.timestamp(),
                            sent_at: Some(now.timestamp()),
                            resolved_at: Some(now.timestamp()),
                        })
                        .await?;
                }
            }
        }
        Ok(())
    }
}

/// A GPU's identity cut for a subject line (`GPU-5c1f4b2e`) from its evidence path.
fn short_gpu(evidence: &str) -> String {
    let uuid = evidence.rsplit('/').next().unwrap_or_default();
    uuid.char_indices()
        .nth(12)
        .map_or(uuid, |(i, _)| &uuid[..i])
        .to_string()
}

/// The team as an owner: `None` for unowned.
fn owned(team: &str) -> Option<String> {
    (team != UNOWNED).then(|| team.to_string())
}

/// Which doubling of `threshold` `v` is in (1×, 2×, 4× …): a figure that doubles is a change
/// worth a new message; one that drifts is not.
fn bucket(v: f64, threshold: f64) -> String {
    if threshold <= 0.0 || v <= threshold {
        return "1".into();
    }
    format!("{}", (v / threshold).log2().floor() as i64 + 1)
}

fn short_hash(s: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    format!("{:016x}", h.finish())
}

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_higher_step_is_news() {
        assert!(lower("1", "2"));
        assert!(!lower("3", "2"));
        assert!(!lower("2", "2"));
        // Not steps (a GPU set's hash): any change is news.
        assert!(!lower("00ab", "00ff"));
    }

    #[test]
    fn a_figure_is_new_again_only_when_it_doubles() {
        assert_eq!(bucket(900.0, 1000.0), "1");
        assert_eq!(bucket(1000.0, 1000.0), "1");
        assert_eq!(bucket(1900.0, 1000.0), "1");
        assert_eq!(bucket(2000.0, 1000.0), "2");
        assert_eq!(bucket(4100.0, 1000.0), "3");
    }
}
