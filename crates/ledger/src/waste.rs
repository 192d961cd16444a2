//! Inefficiencies worth money, as typed findings with their $ per month: idle GPUs,
//! allocated-but-idle workloads, GPUs whose memory use stays far below capacity, missing GPUs
//! and billed spend no source reports — and GPUs whose activity nobody measures, which are a
//! finding of their own and never idle (BRIEF section 4: unknown is neither idle nor busy).
//!
//! The Waste page, the overview's top inefficiencies and `GET /api/v1/savings` all render the
//! values made here; nothing else prices a finding.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use gpuledger_model::{GpuState, GpuView, DAY_SECS};
use serde::{Serialize, Serializer};

use crate::summary::{round, GpuWindow};
use crate::usedby::user_team;

/// Hours in an average month, to turn hourly rates into $ per month.
pub const HOURS_PER_MONTH: f64 = 730.0;

/// A GPU whose peak memory use stays below this share of its memory is oversized.
pub const LOW_MEMORY_SHARE: f64 = 0.25;

/// What kind of inefficiency a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FindingKind {
    IdleGpu,
    AllocatedIdle,
    LowMemory,
    MissingGpu,
    BilledUnseen,
    /// No activity data: not waste, and never counted as waste, but worth a metrics source.
    NoActivityData,
}

impl FindingKind {
    pub fn label(self) -> &'static str {
        match self {
            FindingKind::IdleGpu => "idle GPU",
            FindingKind::AllocatedIdle => "allocated but idle",
            FindingKind::LowMemory => "memory far below capacity",
            FindingKind::MissingGpu => "missing GPU",
            FindingKind::BilledUnseen => "billed, not seen",
            FindingKind::NoActivityData => "no activity data",
        }
    }
}

impl Serialize for FindingKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.label())
    }
}

/// One finding: what, whose, why, where the evidence is, and what it costs per month.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub what: String,
    pub team: String,
    pub detail: String,
    /// The dashboard path that shows the evidence (the caller adds filters and range).
    pub evidence: String,
    /// What the waste costs per month; `None` where it cannot be priced (no rate) or is no
    /// waste (no activity data). Only `Some` values add up to the savings total.
    pub usd_per_month: Option<f64>,
}

/// $ per month of an hourly rate.
pub fn per_month(usd_per_hour: f64) -> f64 {
    usd_per_hour * HOURS_PER_MONTH
}

/// Scale a cost over `window_hours` to $ per month.
pub fn window_per_month(cost_usd: f64, window_hours: f64) -> f64 {
    cost_usd * HOURS_PER_MONTH / window_hours.max(1.0)
}

fn where_(g_model: &str, host: Option<&str>) -> String {
    format!("{g_model} on {}", host.unwrap_or(UNKNOWN_HOST))
}

/// The host a GPU's place names when it has none.
const UNKNOWN_HOST: &str = "unknown host";

/// Where a finding is, as [`rank`] orders it: a finding's written place ([`Finding::what`]),
/// or a GPU's model and host before they are written into one (`{model} on {host}`), ordered
/// byte for byte as that text would be.
#[derive(Debug, Clone, Copy)]
pub enum Place<'a> {
    Text(&'a str),
    Gpu {
        model: &'a str,
        host: Option<&'a str>,
    },
}

impl<'a> Place<'a> {
    /// The text's bytes, written or not.
    fn bytes(self) -> impl Iterator<Item = u8> + 'a {
        let (a, b, c) = match self {
            Place::Text(t) => (t, "", ""),
            Place::Gpu { model, host } => (model, " on ", host.unwrap_or(UNKNOWN_HOST)),
        };
        a.bytes().chain(b.bytes()).chain(c.bytes())
    }
}

impl Ord for Place<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.bytes().cmp(other.bytes())
    }
}

impl PartialOrd for Place<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Place<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Place<'_> {}

/// When a GPU was last busy and last measured, by UTC day start (from the day rollups).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActivityEvidence {
    /// The last day with a busy hour.
    pub last_busy_day: Option<i64>,
    /// The last day with an hour of known activity (busy or idle).
    pub last_known_day: Option<i64>,
}

/// Whole days from `from` to `now`.
fn days_since(from: i64, now: i64) -> i64 {
    (now - from).max(0) / DAY_SECS
}

/// Idle or unmeasured: the finding a present GPU gets from its activity, if any.
///
/// - Its activity is known recently (a known hour today or yesterday) and it had no busy hour
///   for `idle_days` or more (counted from its first sighting when it never had one): **idle
///   GPU**, worth its rate per month.
/// - Its activity has not been known for `idle_days` or more (or never was): **no activity
///   data** — it may be busy or idle, nobody measures it — with no $ of waste.
/// - Otherwise nothing.
///
/// With the finding, the days idle or unmeasured.
pub fn activity_finding(
    g: &GpuView,
    ev: ActivityEvidence,
    now: i64,
    idle_days: i64,
) -> Option<(Finding, i64)> {
    activity_candidate(g, ev, now, idle_days).map(|c| (c.finding(), c.days))
}

/// [`activity_finding`] before its text is written: what ranks it (kind, $ per month, place)
/// and its days, so that a page showing the first few findings writes only theirs
/// ([`ActivityCandidate::finding`] writes it).
pub fn activity_candidate(
    g: &GpuView,
    ev: ActivityEvidence,
    now: i64,
    idle_days: i64,
) -> Option<ActivityCandidate<'_>> {
    if g.state != GpuState::Present || g.mig_parent_uuid.is_some() {
        return None;
    }
    let first = g.first_seen.timestamp();
    let today = now.div_euclid(DAY_SECS) * DAY_SECS;
    let known_recently = ev.last_known_day.is_some_and(|d| d >= today - DAY_SECS);
    let (kind, since, usd_per_month) = if known_recently {
        let since = days_since(ev.last_busy_day.map_or(first, |d| d + DAY_SECS), now);
        (FindingKind::IdleGpu, since, g.usd_per_hour.map(per_month))
    } else {
        let since = days_since(ev.last_known_day.map_or(first, |d| d + DAY_SECS), now);
        (FindingKind::NoActivityData, since, None)
    };
    (since >= idle_days).then_some(ActivityCandidate {
        g,
        ev,
        kind,
        days: since,
        usd_per_month,
    })
}

/// A GPU's idle or unmeasured finding, ranked but not yet written ([`activity_candidate`]).
#[derive(Debug, Clone)]
pub struct ActivityCandidate<'a> {
    g: &'a GpuView,
    ev: ActivityEvidence,
    pub kind: FindingKind,
    /// Days since the last busy day (idle) or the last measured one (no activity data).
    pub days: i64,
    /// As the finding's: the rate per month of an idle GPU, none where unmeasured.
    pub usd_per_month: Option<f64>,
}

impl ActivityCandidate<'_> {
    /// The GPU it is about.
    pub fn gpu(&self) -> &GpuView {
        self.g
    }

    /// What [`rank`] orders it by, as [`Finding::rank_key`].
    pub fn rank_key(&self) -> (FindingKind, Option<f64>, Place<'_>) {
        let place = Place::Gpu {
            model: &self.g.model,
            host: self.g.host.as_deref(),
        };
        (self.kind, self.usd_per_month, place)
    }

    /// The finding, written.
    pub fn finding(&self) -> Finding {
        let (g, since) = (self.g, self.days);
        let detail = match (self.kind, self.ev.last_busy_day, self.ev.last_known_day) {
            (FindingKind::IdleGpu, Some(_), _) => {
                format!("no busy hour for {since} days: release or reassign it")
            }
            (FindingKind::IdleGpu, None, _) => {
                format!("no busy hour since first seen {since} days ago: release or reassign it")
            }
            (_, _, known) => {
                let at_stake = g
                    .usd_per_hour
                    .map(|r| format!(" (${:.0}/month of GPU whose use is unknown)", per_month(r)))
                    .unwrap_or_default();
                match known {
                    Some(_) => format!(
                        "no activity data for {since} days: connect a metrics source \
                         (dcgm-exporter, the agent){at_stake}"
                    ),
                    None => format!(
                        "no activity data since first seen: connect a metrics source \
                         (dcgm-exporter, the agent){at_stake}"
                    ),
                }
            }
        };
        Finding {
            kind: self.kind,
            what: where_(&g.model, g.host.as_deref()),
            team: g.team.to_string(),
            detail,
            evidence: format!("/gpus/{}", g.uuid),
            usd_per_month: self.usd_per_month,
        }
    }
}

/// One physical GPU's allocated-and-idle hours held by one workload (its share where the hour
/// was shared), as the store reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct IdleShare {
    pub workload: String,
    pub kind: String,
    /// The team the allocation names.
    pub used_by: Option<String>,
    /// The GPU's owner at that hour.
    pub owner: String,
    pub gpu_id: i64,
    pub usd_per_hour: Option<f64>,
    pub hours: f64,
}

/// Allocated-but-idle hours of one workload in a window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IdleWorkload {
    pub workload: String,
    pub kind: String,
    /// The team the allocation names ([`user_team`]).
    pub used_by: String,
    /// The owner team of the GPUs.
    pub owner: String,
    pub gpus: i64,
    /// Its share of allocated-and-idle GPU-hours (a shared hour split evenly among holders).
    pub allocated_idle_hours: f64,
    /// Those hours × rate, over GPUs with a rate.
    pub cost_usd: f64,
    /// Of those hours, the ones on GPUs without a rate: unpriced, never $0.
    pub unpriced_hours: f64,
}

impl IdleWorkload {
    /// The figures its finding is priced by.
    pub fn cost(&self) -> WorkloadCost {
        WorkloadCost {
            allocated_idle_hours: self.allocated_idle_hours,
            cost_usd: self.cost_usd,
            unpriced_hours: self.unpriced_hours,
        }
    }
}

/// An allocated-idle workload's figures without its names: what the findings' count and total
/// need of the workloads that are not written out.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WorkloadCost {
    pub allocated_idle_hours: f64,
    pub cost_usd: f64,
    pub unpriced_hours: f64,
}

impl WorkloadCost {
    /// Its finding's $ per month over a window of `window_hours`: unknown when every hour is on
    /// GPUs without a rate.
    pub fn usd_per_month(&self, window_hours: f64) -> Option<f64> {
        (self.allocated_idle_hours > self.unpriced_hours)
            .then(|| window_per_month(self.cost_usd, window_hours))
    }
}

/// The workloads of [`FoldedShares::first_less`]: the first ones whole, in
/// [`idle_workloads`]' order, and the figures of all the others (in no order), so that a count
/// or a total is of every workload.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FirstWorkloads {
    pub first: Vec<IdleWorkload>,
    pub rest: Vec<WorkloadCost>,
}

/// Fold per-GPU shares into workloads, most expensive first (then most hours, then name).
pub fn idle_workloads(shares: &[IdleShare]) -> Vec<IdleWorkload> {
    idle_workloads_less(shares, [])
}

/// [`idle_workloads`] of `shares` less the hours of the shares `outside` (a window's edge day
/// read as its day rows less the hours outside the window): the shares of one workload,
/// allocating team, owner and GPU are added up (the first one's kind and rate kept), those
/// outside taken off, and what is left with no hour (under 1e-9) is not counted, its GPU
/// neither. The shares are borrowed, in their order: what the store keeps between requests
/// is folded as it is.
pub fn idle_workloads_less<'a>(
    shares: impl IntoIterator<Item = &'a IdleShare>,
    outside: impl IntoIterator<Item = &'a IdleShare>,
) -> Vec<IdleWorkload> {
    // (workload, allocating team as stored, owner, GPU) → the first share and its hours.
    type ShareKey<'k> = (&'k str, Option<&'k str>, &'k str, i64);
    let key = |s: &'a IdleShare| -> ShareKey<'a> {
        (
            s.workload.as_str(),
            s.used_by.as_deref(),
            s.owner.as_str(),
            s.gpu_id,
        )
    };
    let mut at: HashMap<ShareKey<'a>, usize> = HashMap::new();
    let mut net: Vec<(&'a IdleShare, f64)> = Vec::new();
    for s in shares {
        match at.entry(key(s)) {
            Entry::Occupied(e) => net[*e.get()].1 += s.hours,
            Entry::Vacant(e) => {
                e.insert(net.len());
                net.push((s, s.hours));
            }
        }
    }
    for o in outside {
        if let Some(&i) = at.get(&key(o)) {
            net[i].1 -= o.hours;
        }
    }
    // (workload, kind, used by, owner) → the workload and the GPUs it held, in first-seen
    // order, then sorted.
    type Key<'k> = (&'k str, &'k str, String, &'k str);
    let mut by: HashMap<Key<'a>, usize> = HashMap::new();
    let mut out: Vec<(IdleWorkload, HashSet<i64>)> = Vec::new();
    for (s, hours) in net {
        if hours <= 1e-9 {
            continue;
        }
        let used_by = user_team(s.used_by.as_deref());
        let i = match by.entry((
            s.workload.as_str(),
            s.kind.as_str(),
            used_by,
            s.owner.as_str(),
        )) {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                out.push((
                    IdleWorkload {
                        workload: s.workload.clone(),
                        kind: s.kind.clone(),
                        used_by: e.key().2.clone(),
                        owner: s.owner.clone(),
                        ..Default::default()
                    },
                    HashSet::new(),
                ));
                *e.insert(out.len() - 1)
            }
        };
        let (w, gpus) = &mut out[i];
        gpus.insert(s.gpu_id);
        w.allocated_idle_hours += hours;
        match s.usd_per_hour {
            Some(r) => w.cost_usd += hours * r,
            None => w.unpriced_hours += hours,
        }
    }
    let mut out: Vec<IdleWorkload> = out
        .into_iter()
        .map(|(mut w, gpus)| {
            w.gpus = gpus.len() as i64;
            w
        })
        .collect();
    out.sort_by(workload_order);
    out
}

/// The order of [`idle_workloads`]: most expensive first, then most hours, then by name,
/// kind, allocating team and owner (a total order: no two workloads folded apart share all
/// four).
fn workload_order(a: &IdleWorkload, b: &IdleWorkload) -> std::cmp::Ordering {
    b.cost_usd
        .total_cmp(&a.cost_usd)
        .then(b.allocated_idle_hours.total_cmp(&a.allocated_idle_hours))
        .then(a.workload.cmp(&b.workload))
        .then(a.kind.cmp(&b.kind))
        .then(a.used_by.cmp(&b.used_by))
        .then(a.owner.cmp(&b.owner))
}

/// Allocated-and-idle shares folded once into workloads ([`idle_workloads`]) and kept with
/// them, so that a few more shares (and some to take off) fold with them again without going
/// through all of them: what the store keeps between requests for a window's settled days,
/// where a month of a large fleet holds a million shares and a request adds today's.
#[derive(Debug, Default)]
pub struct FoldedShares {
    shares: Vec<IdleShare>,
    /// `idle_workloads(&shares)`, in its order.
    workloads: Vec<IdleWorkload>,
    /// The positions in `shares` of each workload name's shares, in order.
    of_workload: foldhash::HashMap<String, Vec<usize>>,
    /// The positions in `workloads` of each workload name's workloads.
    folded_of: foldhash::HashMap<String, Vec<usize>>,
}

impl FoldedShares {
    pub fn new(shares: Vec<IdleShare>) -> Self {
        let workloads = idle_workloads(&shares);
        let of_workload = positions_by_name(shares.iter().map(|s| s.workload.as_str()));
        let folded_of = positions_by_name(workloads.iter().map(|w| w.workload.as_str()));
        FoldedShares {
            shares,
            workloads,
            of_workload,
            folded_of,
        }
    }

    /// The shares, in the order they were given.
    pub fn shares(&self) -> &[IdleShare] {
        &self.shares
    }

    /// The first `n` workloads of [`idle_workloads_less`] of these shares followed by `more`,
    /// less `outside`: the same workloads, to the last bit, in the same order, and the figures
    /// of the others. A workload's figures depend only on the shares naming it, in their order;
    /// so only the workloads that `more` and `outside` name are folded again (with their kept
    /// shares first), and the rest come from the kept fold, both merged in [`idle_workloads`]'
    /// order.
    pub fn first_less<'a>(
        &'a self,
        more: impl IntoIterator<Item = &'a IdleShare>,
        outside: impl IntoIterator<Item = &'a IdleShare>,
        n: usize,
    ) -> FirstWorkloads {
        let more: Vec<&IdleShare> = more.into_iter().collect();
        let outside: Vec<&IdleShare> = outside.into_iter().collect();
        let named: foldhash::HashSet<&str> = more
            .iter()
            .chain(&outside)
            .map(|s| s.workload.as_str())
            .collect();
        let mut at: Vec<usize> = named
            .iter()
            .filter_map(|w| self.of_workload.get(*w))
            .flatten()
            .copied()
            .collect();
        at.sort_unstable();
        let again = idle_workloads_less(at.iter().map(|&i| &self.shares[i]).chain(more), outside);
        // The kept workloads folded again are passed over by position, not by name: the rest
        // of a month's workloads are walked for their figures at every request.
        let mut folded_again = vec![false; self.workloads.len()];
        for i in named
            .iter()
            .filter_map(|w| self.folded_of.get(*w))
            .flatten()
        {
            folded_again[*i] = true;
        }
        let mut kept = self
            .workloads
            .iter()
            .zip(folded_again)
            .filter_map(|(w, again)| (!again).then_some(w))
            .peekable();
        let mut again = again.into_iter().peekable();
        let mut first = Vec::with_capacity(n.min(self.workloads.len() + again.len()));
        while first.len() < n {
            let next = match (kept.peek(), again.peek()) {
                (Some(k), Some(a)) => {
                    if workload_order(k, a).is_le() {
                        kept.next().cloned()
                    } else {
                        again.next()
                    }
                }
                (Some(_), None) => kept.next().cloned(),
                (None, _) => again.next(),
            };
            match next {
                Some(w) => first.push(w),
                None => break,
            }
        }
        let rest = kept
            .map(IdleWorkload::cost)
            .chain(again.map(|w| w.cost()))
            .collect();
        FirstWorkloads { first, rest }
    }
}

/// The positions of each name among `names`, in order.
fn positions_by_name<'a>(
    names: impl Iterator<Item = &'a str>,
) -> foldhash::HashMap<String, Vec<usize>> {
    let mut at: foldhash::HashMap<String, Vec<usize>> = Default::default();
    for (i, name) in names.enumerate() {
        match at.get_mut(name) {
            Some(list) => list.push(i),
            None => {
                at.insert(name.to_string(), vec![i]);
            }
        }
    }
    at
}

/// The finding for an allocated-but-idle workload over a window of `window_hours`.
pub fn allocated_idle_finding(w: &IdleWorkload, window_hours: f64) -> Finding {
    let unpriced = if w.unpriced_hours > 0.0 {
        format!(
            " ({:.1} of them on GPUs without a rate, unpriced)",
            w.unpriced_hours
        )
    } else {
        String::new()
    };
    Finding {
        kind: FindingKind::AllocatedIdle,
        what: w.workload.clone(),
        team: if w.used_by == gpuledger_model::UNOWNED {
            w.owner.clone()
        } else {
            w.used_by.clone()
        },
        detail: format!(
            "{:.1} GPU-hours allocated and idle{unpriced}: tell the owner",
            w.allocated_idle_hours
        ),
        evidence: format!("/teams/{}", w.owner),
        usd_per_month: w.cost().usd_per_month(window_hours),
    }
}

/// A GPU present at least a day of the window whose peak memory use stays below
/// [`LOW_MEMORY_SHARE`] of its memory: the share, and the finding (a MIG half or a smaller GPU
/// saves about half its rate).
pub fn low_memory_finding(w: &GpuWindow) -> Option<(f64, Finding)> {
    low_memory_candidate(w).map(|c| (c.share, c.finding()))
}

/// [`low_memory_finding`] before its text is written, as [`activity_candidate`].
pub fn low_memory_candidate(w: &GpuWindow) -> Option<LowMemoryCandidate<'_>> {
    let cap = w.memory_mib? as f64;
    let peak = w.mem_max_mib?;
    let share = peak / cap;
    if w.present_hours < 24 || cap <= 0.0 || share >= LOW_MEMORY_SHARE {
        return None;
    }
    Some(LowMemoryCandidate { w, share })
}

/// A GPU's low-memory finding, ranked but not yet written ([`low_memory_candidate`]).
#[derive(Debug, Clone)]
pub struct LowMemoryCandidate<'a> {
    w: &'a GpuWindow,
    /// Its peak memory use as a share of its memory.
    pub share: f64,
}

impl LowMemoryCandidate<'_> {
    /// The GPU's counts it is about.
    pub fn window(&self) -> &GpuWindow {
        self.w
    }

    /// What [`rank`] orders it by, as [`Finding::rank_key`].
    pub fn rank_key(&self) -> (FindingKind, Option<f64>, Place<'_>) {
        let place = Place::Gpu {
            model: &self.w.model,
            host: self.w.host.as_deref(),
        };
        (FindingKind::LowMemory, self.usd_per_month(), place)
    }

    fn usd_per_month(&self) -> Option<f64> {
        self.w.usd_per_hour.map(|r| per_month(r) * 0.5)
    }

    /// The finding, written.
    pub fn finding(&self) -> Finding {
        let w = self.w;
        Finding {
            kind: FindingKind::LowMemory,
            what: where_(&w.model, w.host.as_deref()),
            team: w.team.to_string(),
            detail: format!(
                "peak memory {:.0} % of capacity: a smaller GPU or a MIG profile would do",
                self.share * 100.0
            ),
            evidence: format!("/gpus/{}", w.uuid),
            usd_per_month: self.usd_per_month(),
        }
    }
}

/// A GPU that stopped reporting: still paid for?
pub fn missing_finding(g: &GpuView) -> Option<Finding> {
    (g.state == GpuState::Missing && g.mig_parent_uuid.is_none()).then(|| Finding {
        kind: FindingKind::MissingGpu,
        what: where_(&g.model, g.host.as_deref()),
        team: g.team.to_string(),
        detail: format!(
            "not seen since {}: still paid for? check source {}",
            g.last_seen.format("%Y-%m-%d %H:%M"),
            g.source
        ),
        evidence: format!("/gpus/{}", g.uuid),
        usd_per_month: g.usd_per_hour.map(per_month),
    })
}

/// Spend an imported billing export shows for a resource no source reports.
#[derive(Debug, Clone, PartialEq)]
pub struct BilledUnseen {
    pub resource_id: String,
    pub instance_type: Option<String>,
    pub effective_cost: f64,
    pub first: i64,
    pub last: i64,
    pub file: String,
}

/// $ per month of billed-but-unseen spend: what it was billed per day × 730 / 24.
pub fn billed_unseen_per_month(u: &BilledUnseen) -> f64 {
    let days = ((u.last - u.first) as f64 / DAY_SECS as f64).max(1.0);
    u.effective_cost / days * (HOURS_PER_MONTH / 24.0)
}

pub fn billed_unseen_finding(u: &BilledUnseen) -> Finding {
    let day = |t: i64| {
        chrono::DateTime::from_timestamp(t, 0)
            .map(|d| d.format("%Y-%m-%d").to_string())
            .unwrap_or_default()
    };
    Finding {
        kind: FindingKind::BilledUnseen,
        what: format!(
            "{} ({})",
            u.resource_id,
            u.instance_type.as_deref().unwrap_or("GPU spend")
        ),
        team: gpuledger_model::UNOWNED.to_string(),
        detail: format!(
            "billed ${:.2} from {} to {} in {}, but no source reports it: find it or stop paying \
             for it",
            u.effective_cost,
            day(u.first),
            day(u.last),
            u.file
        ),
        evidence: "/api/v1/billing".into(),
        usd_per_month: Some(billed_unseen_per_month(u)),
    }
}

/// Findings ranked for reading: priced waste by $ per month (largest first), then unpriced
/// waste, then the findings that are no waste (no activity data); then by kind and place.
/// Findings equal in all of those keep their order.
pub fn rank(findings: &mut [Finding]) {
    findings.sort_by(|a, b| rank_order(a.rank_key(), b.rank_key()));
}

/// The order of [`rank`], by each finding's [`Finding::rank_key`].
pub fn rank_order(
    (a_kind, a_usd, a_what): (FindingKind, Option<f64>, Place),
    (b_kind, b_usd, b_what): (FindingKind, Option<f64>, Place),
) -> std::cmp::Ordering {
    let waste = |k: FindingKind| k != FindingKind::NoActivityData;
    waste(b_kind)
        .cmp(&waste(a_kind))
        .then(b_usd.unwrap_or(-1.0).total_cmp(&a_usd.unwrap_or(-1.0)))
        .then(a_kind.cmp(&b_kind))
        .then_with(|| a_what.cmp(&b_what))
}

impl Finding {
    /// What [`rank`] orders findings by: kind, $ per month, place.
    pub fn rank_key(&self) -> (FindingKind, Option<f64>, Place<'_>) {
        (self.kind, self.usd_per_month, Place::Text(&self.what))
    }
}

/// The positions in `items` of the first `n` by `order` (ties by position in `items`, as a
/// stable sort keeps them), in that order: a stable sort of all of them, cut to `n`, without
/// ordering the rest (the Overview shows eight findings of tens of thousands).
pub fn first_ranked<T>(
    items: &[T],
    n: usize,
    order: impl Fn(&T, &T) -> std::cmp::Ordering,
) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let order = |i: &usize, j: &usize| order(&items[*i], &items[*j]).then(i.cmp(j));
    let mut at: Vec<usize> = (0..items.len()).collect();
    if at.len() > n {
        at.select_nth_unstable_by(n - 1, order);
        at.truncate(n);
    }
    at.sort_unstable_by(order);
    at
}

/// The savings total: Σ $ per month over priced findings (no-activity findings have none).
pub fn total_per_month(findings: &[Finding]) -> f64 {
    total_per_month_of(findings.iter().map(|f| f.usd_per_month))
}

/// [`total_per_month`] of the findings' $ per month alone (`None`: not priced), so that a
/// page can total findings it does not write. Summed smallest first, whatever order they come
/// in: the Waste page and `GET /api/v1/savings` list the same findings in different orders,
/// and their totals are the same to the last bit.
pub fn total_per_month_of(values: impl IntoIterator<Item = Option<f64>>) -> f64 {
    let mut priced: Vec<f64> = values.into_iter().flatten().collect();
    priced.sort_unstable_by(f64::total_cmp);
    round(priced.iter().sum(), 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    const NOW: i64 = 1_764_900_000; // 2025-12-05 01:20 UTC

    fn gpu(first_days_ago: i64, rate: Option<f64>) -> GpuView {
        GpuView {
            vendor: None,
            uuid: "GPU-1".into(),
            model: "NVIDIA A100-SXM4-80GB".into(),
            memory_mib: None,
            host: Some("h1".into()),
            cluster: None,
            cloud: None,
            region: None,
            instance_type: None,
            account: None,
            serial: None,
            pci_bus_id: None,
            team: "nlp".into(),
            env: "prod".into(),
            owner_reason: "".into(),
            state: GpuState::Present,
            first_seen: Utc
                .timestamp_opt(NOW - first_days_ago * DAY_SECS, 0)
                .unwrap(),
            last_seen: Utc.timestamp_opt(NOW, 0).unwrap(),
            usd_per_hour: rate,
            rate_origin: "".into(),
            mig_parent_uuid: None,
            mig_profile: None,
            placeholder: false,
            source: "s".into(),
            labels: Default::default(),
        }
    }

    fn day(days_ago: i64) -> Option<i64> {
        Some((NOW - days_ago * DAY_SECS).div_euclid(DAY_SECS) * DAY_SECS)
    }

    /// The bug: a GPU with no activity data at all was "idle — no busy hour for 30 days" with
    /// $/month. It is its own finding, worth no waste.
    #[test]
    fn unknown_activity_is_never_idle_and_never_priced_as_waste() {
        let g = gpu(30, Some(4.0));
        let (f, since) = activity_finding(&g, ActivityEvidence::default(), NOW, 7).unwrap();
        assert_eq!(f.kind, FindingKind::NoActivityData);
        assert_eq!(f.usd_per_month, None);
        assert_eq!(since, 30);
        assert!(
            f.detail.contains("connect a metrics source"),
            "{}",
            f.detail
        );
        // Measured until 10 days ago (idle then), unknown since: still not idle.
        let ev = ActivityEvidence {
            last_busy_day: day(20),
            last_known_day: day(10),
        };
        let (f, _) = activity_finding(&g, ev, NOW, 7).unwrap();
        assert_eq!(f.kind, FindingKind::NoActivityData);
        assert_eq!(total_per_month(&[f]), 0.0);
    }

    #[test]
    fn measured_and_not_busy_for_the_idle_days_is_idle_with_its_rate() {
        let g = gpu(30, Some(4.0));
        let ev = ActivityEvidence {
            last_busy_day: day(12),
            last_known_day: day(0),
        };
        let (f, since) = activity_finding(&g, ev, NOW, 7).unwrap();
        assert_eq!((f.kind, since), (FindingKind::IdleGpu, 11));
        assert_eq!(f.usd_per_month, Some(2920.0));
        // Busy two days ago: nothing; a rate-less idle GPU is idle but unpriced.
        let busy = ActivityEvidence {
            last_busy_day: day(2),
            last_known_day: day(0),
        };
        assert!(activity_finding(&g, busy, NOW, 7).is_none());
        let (f, _) = activity_finding(&gpu(30, None), ev, NOW, 7).unwrap();
        assert_eq!((f.kind, f.usd_per_month), (FindingKind::IdleGpu, None));
    }

    /// Two workloads share a $2/h GPU's idle hours half and half; a third holds a GPU without a
    /// rate. Each pays its share; the unpriced hours stay unpriced.
    #[test]
    fn shared_idle_hours_are_split_and_unpriced_hours_are_not_zero_dollars() {
        let s = |w: &str, gpu_id, rate, hours| IdleShare {
            workload: w.into(),
            kind: "pod".into(),
            used_by: Some("NLP".into()),
            owner: "nlp".into(),
            gpu_id,
            usd_per_hour: rate,
            hours,
        };
        let ws = idle_workloads(&[
            s("a", 1, Some(2.0), 1.5),
            s("b", 1, Some(2.0), 1.5),
            s("c", 2, None, 3.0),
        ]);
        let got: Vec<_> = ws
            .iter()
            .map(|w| {
                (
                    w.workload.as_str(),
                    w.used_by.as_str(),
                    w.allocated_idle_hours,
                    w.cost_usd,
                    w.unpriced_hours,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", "nlp", 1.5, 3.0, 0.0),
                ("b", "nlp", 1.5, 3.0, 0.0),
                ("c", "nlp", 3.0, 0.0, 3.0)
            ]
        );
        assert_eq!(allocated_idle_finding(&ws[2], 730.0).usd_per_month, None);
        assert_eq!(
            allocated_idle_finding(&ws[0], 730.0).usd_per_month,
            Some(3.0)
        );
    }

    #[test]
    fn kept_folds_with_more_shares_as_all_of_them_folded_at_once() {
        // Random fleets of shares: the kept fold plus a request's shares, less those outside,
        // against the whole fold of all of them, for every cut.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..300 {
            let share = |next: &mut dyn FnMut(u64) -> u64| IdleShare {
                workload: format!("w{}", next(12)),
                kind: ["pod", "slurm_job"][next(2) as usize].into(),
                used_by: [None, Some("NLP".to_string()), Some("vision".to_string())]
                    [next(3) as usize]
                    .clone(),
                owner: ["nlp", "vision"][next(2) as usize].into(),
                gpu_id: next(6) as i64,
                usd_per_hour: [None, Some(2.0), Some(3.5)][next(3) as usize],
                hours: [0.25, 0.5, 1.0, 1.0 / 3.0, 7.0][next(5) as usize],
            };
            let kept: Vec<IdleShare> = (0..next(40)).map(|_| share(&mut next)).collect();
            let more: Vec<IdleShare> = (0..next(8)).map(|_| share(&mut next)).collect();
            // Some outside shares take off what kept or more hold, some name nothing held.
            let mut outside: Vec<IdleShare> = (0..next(4)).map(|_| share(&mut next)).collect();
            for s in kept.iter().chain(&more) {
                if next(5) == 0 {
                    outside.push(IdleShare {
                        hours: s.hours * [1.0, 0.5][next(2) as usize],
                        ..s.clone()
                    });
                }
            }
            let whole = idle_workloads_less(kept.iter().chain(&more), &outside);
            let folded = FoldedShares::new(kept.clone());
            assert_eq!(folded.shares(), &kept[..]);
            for n in [0, 1, 3, whole.len(), whole.len() + 5] {
                let got = folded.first_less(&more, &outside, n);
                let cut = n.min(whole.len());
                assert_eq!(
                    got.first,
                    whole[..cut],
                    "kept {kept:?} more {more:?} outside {outside:?} n {n}"
                );
                // The others' figures, every one of them once, in any order.
                let key = |c: &WorkloadCost| {
                    (
                        c.cost_usd.to_bits(),
                        c.allocated_idle_hours.to_bits(),
                        c.unpriced_hours.to_bits(),
                    )
                };
                let mut rest: Vec<_> = got.rest.iter().map(key).collect();
                let mut want: Vec<_> = whole[cut..].iter().map(|w| key(&w.cost())).collect();
                rest.sort_unstable();
                want.sort_unstable();
                assert_eq!(
                    rest, want,
                    "kept {kept:?} more {more:?} outside {outside:?} n {n}"
                );
            }
        }
    }

    #[test]
    fn ranking_puts_priced_waste_first_and_no_data_last() {
        let f = |kind, usd| Finding {
            kind,
            what: String::new(),
            team: String::new(),
            detail: String::new(),
            evidence: String::new(),
            usd_per_month: usd,
        };
        let mut all = vec![
            f(FindingKind::NoActivityData, None),
            f(FindingKind::IdleGpu, None),
            f(FindingKind::MissingGpu, Some(10.0)),
            f(FindingKind::IdleGpu, Some(20.0)),
        ];
        rank(&mut all);
        let kinds: Vec<_> = all.iter().map(|x| (x.kind, x.usd_per_month)).collect();
        assert_eq!(
            kinds,
            [
                (FindingKind::IdleGpu, Some(20.0)),
                (FindingKind::MissingGpu, Some(10.0)),
                (FindingKind::IdleGpu, None),
                (FindingKind::NoActivityData, None)
            ]
        );
        assert_eq!(total_per_month(&all), 30.0);
    }

    /// The first findings picked without ranking the rest are `rank`'s first, ties and all:
    /// many findings equal in kind, $ and place (one model on one host at one rate), kept in
    /// their order as `rank`'s stable sort keeps them.
    #[test]
    fn first_ranked_is_the_head_of_rank_whatever_the_ties() {
        let kinds = [
            FindingKind::IdleGpu,
            FindingKind::LowMemory,
            FindingKind::MissingGpu,
            FindingKind::NoActivityData,
        ];
        let mut seed = 7u64;
        let mut next = |m: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        for round in 0..50 {
            let len = next(60) as usize;
            let items: Vec<Finding> = (0..len)
                .map(|i| Finding {
                    kind: kinds[next(4) as usize],
                    what: format!("T4 on h{}", next(3)),
                    team: String::new(),
                    // The detail tells the items apart; it is no part of the order.
                    detail: i.to_string(),
                    evidence: String::new(),
                    usd_per_month: [None, Some(10.0), Some(25.0)][next(3) as usize],
                })
                .collect();
            let mut ranked = items.clone();
            rank(&mut ranked);
            for n in [0, 1, 8, len.saturating_sub(1), len, len + 3] {
                let by_rank = |a: &Finding, b: &Finding| rank_order(a.rank_key(), b.rank_key());
                let first: Vec<Finding> = first_ranked(&items, n, by_rank)
                    .into_iter()
                    .map(|i| items[i].clone())
                    .collect();
                assert_eq!(first, ranked[..n.min(len)], "round {round}, n {n}");
            }
        }
    }

    /// A GPU's place not yet written orders as its text would, against written places and
    /// other GPUs' (a model that is a prefix of another, no host, a text equal to it).
    #[test]
    fn a_place_orders_as_its_text() {
        let models = ["T4", "T4 on", "T4 on h", "A100", "", "T4 on h1"];
        let hosts = [None, Some("h"), Some("h1"), Some(""), Some("unknown")];
        let mut places = Vec::new();
        for model in models {
            for host in hosts {
                places.push((Place::Gpu { model, host }, where_(model, host)));
            }
        }
        let texts: Vec<String> = places.iter().map(|(_, t)| t.clone()).collect();
        for t in &texts {
            places.push((Place::Text(t), t.clone()));
        }
        for (a, at) in &places {
            for (b, bt) in &places {
                assert_eq!(a.cmp(b), at.cmp(bt), "{at:?} against {bt:?}");
            }
        }
    }
}
