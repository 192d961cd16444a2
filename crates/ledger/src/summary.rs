//! The summary arithmetic of BRIEF section 4, from per-GPU window aggregates to groups.
//!
//! The store counts, per physical GPU, its present, busy, idle, unknown, allocated and
//! allocated-idle hours in the window and the sum of its known hourly activities; this module
//! groups those counts and prices them. Keeping it pure means the definitions are tested once.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use gpuledger_model::{CostBasis, SummaryGroup, UNKNOWN};
use serde::Serialize;

/// What a summary groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupBy {
    Team,
    Env,
    Cloud,
    Cluster,
    Model,
    Vendor,
}

impl GroupBy {
    pub const NAMES: [&'static str; 6] = ["team", "env", "cloud", "cluster", "model", "vendor"];

    pub fn parse(s: &str) -> Option<GroupBy> {
        Some(match s {
            "team" => GroupBy::Team,
            "env" => GroupBy::Env,
            "cloud" => GroupBy::Cloud,
            "cluster" => GroupBy::Cluster,
            "model" => GroupBy::Model,
            "vendor" => GroupBy::Vendor,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::Team => "team",
            GroupBy::Env => "env",
            GroupBy::Cloud => "cloud",
            GroupBy::Cluster => "cluster",
            GroupBy::Model => "model",
            GroupBy::Vendor => "vendor",
        }
    }
}

/// One physical GPU's counts over a window, as the store computes them from rollups.
///
/// Its text is shared (`Arc<str>`), not owned: the store keeps today's rows of every GPU
/// between requests and gives each request its own rows, which at 100,000 GPUs copied eight
/// strings per GPU at each request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuWindow {
    pub uuid: Arc<str>,
    pub host: Option<Arc<str>>,
    pub memory_mib: Option<u64>,
    /// Highest memory use seen in the window; `None` when no sample gave it.
    pub mem_max_mib: Option<f64>,
    pub team: Arc<str>,
    pub env: Arc<str>,
    pub cloud: Option<Arc<str>>,
    pub cluster: Option<Arc<str>>,
    pub model: Arc<str>,
    /// `nvidia`, `amd`, `intel`, `other`; `None` when unknown.
    pub vendor: Option<Arc<str>>,
    pub usd_per_hour: Option<f64>,
    pub present_hours: i64,
    pub busy_hours: i64,
    pub idle_hours: i64,
    pub allocated_hours: i64,
    pub allocated_idle_hours: i64,
    /// Hours with known activity (busy + idle).
    pub known_hours: i64,
    /// Σ hourly activity over the known hours.
    pub activity_sum: f64,
    /// Present hours inside charge periods of an imported billing export.
    pub billed_hours: i64,
    /// What was billed for those hours (each GPU's share of a period spread over its present
    /// hours in the period).
    pub billed_usd: f64,
}

impl GpuWindow {
    /// Hours with unknown activity (present, neither busy nor idle).
    pub fn unknown_hours(&self) -> i64 {
        self.present_hours - self.known_hours
    }

    /// Mean hourly activity over the known hours; `None` when no hour is known (BRIEF section 4:
    /// unknown hours are left out, never counted as 0).
    pub fn avg_activity_pct(&self) -> Option<f64> {
        (self.known_hours > 0).then(|| self.activity_sum / self.known_hours as f64)
    }

    /// Σ present hours × rate; `None` when the GPU has no rate (its hours are unpriced).
    pub fn cost_usd(&self) -> Option<f64> {
        self.usd_per_hour.map(|r| r * self.present_hours as f64)
    }

    /// Σ idle hours × rate; `None` without a rate.
    pub fn idle_cost_usd(&self) -> Option<f64> {
        self.usd_per_hour.map(|r| r * self.idle_hours as f64)
    }

    /// Σ allocated-and-idle hours × rate; `None` without a rate.
    pub fn allocated_idle_cost_usd(&self) -> Option<f64> {
        self.usd_per_hour
            .map(|r| r * self.allocated_idle_hours as f64)
    }

    /// Add one hour rollup (activity `None` when unknown) with the idle threshold: the same
    /// arithmetic the day rollups do in SQL, for views that read a GPU's hours directly.
    pub fn add_hour(
        &mut self,
        activity_pct: Option<f64>,
        allocated: bool,
        idle_threshold_pct: f64,
    ) {
        self.present_hours += 1;
        if allocated {
            self.allocated_hours += 1;
        }
        if let Some(a) = activity_pct {
            self.known_hours += 1;
            self.activity_sum += a;
            if is_idle(a, idle_threshold_pct) {
                self.idle_hours += 1;
                if allocated {
                    self.allocated_idle_hours += 1;
                }
            } else {
                self.busy_hours += 1;
            }
        }
    }

    fn key(&self, by: GroupBy) -> &str {
        let v = match by {
            GroupBy::Team => Some(&*self.team),
            GroupBy::Env => Some(&*self.env),
            GroupBy::Cloud => self.cloud.as_deref(),
            GroupBy::Cluster => self.cluster.as_deref(),
            GroupBy::Model => Some(&*self.model),
            GroupBy::Vendor => self.vendor.as_deref(),
        };
        v.unwrap_or(UNKNOWN)
    }
}

/// A GPU's figures over its hour rollups, priced at `usd_per_hour` (see [`GpuFigures`]).
pub fn gpu_figures(
    hours: &[gpuledger_model::HourPoint],
    idle_threshold_pct: f64,
    usd_per_hour: Option<f64>,
    rate_basis: String,
) -> gpuledger_model::GpuFigures {
    let mut w = GpuWindow {
        usd_per_hour,
        ..Default::default()
    };
    for h in hours {
        w.add_hour(h.activity_pct, h.allocated, idle_threshold_pct);
    }
    gpuledger_model::GpuFigures {
        gpu_hours: w.present_hours,
        busy_hours: w.busy_hours,
        idle_hours: w.idle_hours,
        unknown_hours: w.unknown_hours(),
        allocated_hours: w.allocated_hours,
        allocated_idle_hours: w.allocated_idle_hours,
        avg_activity_pct: w.avg_activity_pct().map(|a| round(a, 2)),
        usd_per_hour,
        rate_basis,
        cost_usd: w.cost_usd().map(|c| round(c, 2)),
        idle_cost_usd: w.idle_cost_usd().map(|c| round(c, 2)),
        allocated_idle_cost_usd: w.allocated_idle_cost_usd().map(|c| round(c, 2)),
    }
}

/// What a GPU's activity measures, by vendor (`docs/definitions.md`, "activity per vendor"):
/// the text the GPU page shows beside its activity.
pub fn activity_basis(vendor: Option<gpuledger_model::Vendor>) -> &'static str {
    use gpuledger_model::Vendor;
    match vendor {
        Some(Vendor::Nvidia) => {
            "SM activity (DCGM SM_ACTIVE) where a source gives it, else utilization.gpu: \
             the share of time a kernel ran"
        }
        Some(Vendor::Amd) => {
            "GFX activity (rocm-smi GPU use, amd-smi gfx_activity, exporter gpu_gfx_activity): \
             the share of time the engine was busy, like NVIDIA's utilization.gpu, not SM activity"
        }
        Some(Vendor::Intel) => {
            "AIP utilization (hl-smi AIP-Util): the share of time the Gaudi was busy, like \
             NVIDIA's utilization.gpu"
        }
        Some(Vendor::Other) | None => {
            "the util_pct (busy-time percentage) or sm_active its sources send; which one \
             depends on the sender"
        }
    }
}

/// An hour whose known activity is below the threshold is idle; at or above it, busy (BRIEF
/// section 4). The SQL rollups compare `act_sum < threshold × act_n`, the same test.
pub fn is_idle(activity_pct: f64, idle_threshold_pct: f64) -> bool {
    activity_pct < idle_threshold_pct
}

/// Fold rows of the same GPU (one per owner period, in time order) into one row per GPU: counts
/// add up, the highest memory use wins, and the team and environment are the latest period's.
pub fn per_gpu(rows: Vec<GpuWindow>) -> Vec<GpuWindow> {
    let mut out: Vec<GpuWindow> = Vec::with_capacity(rows.len());
    for w in rows {
        match out.last_mut() {
            Some(last) if Arc::ptr_eq(&last.uuid, &w.uuid) || last.uuid == w.uuid => {
                last.present_hours += w.present_hours;
                last.busy_hours += w.busy_hours;
                last.idle_hours += w.idle_hours;
                last.allocated_hours += w.allocated_hours;
                last.allocated_idle_hours += w.allocated_idle_hours;
                last.known_hours += w.known_hours;
                last.activity_sum += w.activity_sum;
                last.billed_hours += w.billed_hours;
                last.billed_usd += w.billed_usd;
                last.mem_max_mib = match (last.mem_max_mib, w.mem_max_mib) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
                last.team = w.team;
                last.env = w.env;
            }
            _ => out.push(w),
        }
    }
    out
}

/// One point of a fleet time series: counts over one bucket (an hour or a day).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SeriesPoint {
    pub start: DateTime<Utc>,
    /// Physical GPUs present at some hour of the bucket.
    pub gpus: i64,
    pub gpu_hours: i64,
    pub busy_hours: i64,
    pub idle_hours: i64,
    pub known_hours: i64,
    pub allocated_hours: i64,
    /// Σ hourly activity over the known hours.
    pub activity_sum: f64,
}

impl SeriesPoint {
    /// Mean hourly activity over known hours, `None` when none is known.
    pub fn avg_activity_pct(&self) -> Option<f64> {
        (self.known_hours > 0).then(|| self.activity_sum / self.known_hours as f64)
    }

    /// Present hours with unknown activity.
    pub fn unknown_hours(&self) -> i64 {
        self.gpu_hours - self.known_hours
    }

    /// Add a later bucket into this one (days into weeks): hours add up; GPUs are the most
    /// present in any of the buckets.
    pub fn absorb(&mut self, d: &SeriesPoint) {
        self.gpus = self.gpus.max(d.gpus);
        self.gpu_hours += d.gpu_hours;
        self.busy_hours += d.busy_hours;
        self.idle_hours += d.idle_hours;
        self.known_hours += d.known_hours;
        self.allocated_hours += d.allocated_hours;
        self.activity_sum += d.activity_sum;
    }
}

/// The daily trend's point of the day starting at `start` from per-GPU windows over that day
/// alone (owner periods apart or folded): their hours summed over the windows with a present
/// hour, each GPU counted once, as the store sums its day rows. `None` when no GPU was present
/// that day: the trend then has no point for it.
pub fn day_point(start: DateTime<Utc>, windows: &[GpuWindow]) -> Option<SeriesPoint> {
    day_point_of(start, windows)
}

/// [`day_point`] per group `by` (each window counts under its own key, so a GPU whose owner
/// changed that day counts under each owner it had): the points of the groups with a GPU
/// present, by key.
pub fn day_points_by(
    start: DateTime<Utc>,
    windows: &[GpuWindow],
    by: GroupBy,
) -> Vec<(String, SeriesPoint)> {
    let mut groups: BTreeMap<&str, Vec<&GpuWindow>> = BTreeMap::new();
    for w in windows {
        groups.entry(w.key(by)).or_default().push(w);
    }
    groups
        .into_iter()
        .filter_map(|(k, ws)| day_point_of(start, ws).map(|p| (k.to_string(), p)))
        .collect()
}

fn day_point_of<'a, I>(start: DateTime<Utc>, windows: I) -> Option<SeriesPoint>
where
    I: IntoIterator<Item = &'a GpuWindow>,
    I::IntoIter: Clone,
{
    let mut p = SeriesPoint {
        start,
        ..Default::default()
    };
    let windows = windows.into_iter();
    let mut uuids = Seen::for_rows(windows.clone());
    for w in windows.filter(|w| w.present_hours > 0) {
        if uuids.insert(&w.uuid) {
            p.gpus += 1;
        }
        p.gpu_hours += w.present_hours;
        p.busy_hours += w.busy_hours;
        p.idle_hours += w.idle_hours;
        p.known_hours += w.known_hours;
        p.allocated_hours += w.allocated_hours;
        p.activity_sum += w.activity_sum;
    }
    (p.gpus > 0).then_some(p)
}

struct Acc<'a> {
    g: SummaryGroup,
    activity_sum: f64,
    known_hours: i64,
    /// GPUs counted, so a GPU with two owner periods in a group counts once: the last GPU
    /// added where the rows come with each GPU's rows together, else every GPU added.
    seen: Seen<'a>,
}

/// The GPUs a group has counted ([`Acc::seen`]).
enum Seen<'a> {
    /// Each GPU's rows come together: a GPU's rows in a group are then together too, so a row
    /// of the GPU counted last adds no GPU. No hashing, where a set of 100,000 UUIDs was most
    /// of the time [`summarize`] took.
    Last(Option<&'a str>),
    All(foldhash::HashSet<Uuid<'a>>),
}

/// A GPU's UUID as a set's key, hashed by its length and last eight bytes alone (UUIDs differ
/// there; equal keys are still told by their whole text): hashing all of 100,000 UUIDs was
/// most of the time [`Seen::for_rows`] took.
#[derive(PartialEq, Eq)]
struct Uuid<'a>(&'a str);

impl std::hash::Hash for Uuid<'_> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let b = self.0.as_bytes();
        let mut tail = [0u8; 8];
        let n = b.len().min(8);
        tail[8 - n..].copy_from_slice(&b[b.len() - n..]);
        h.write_u64(u64::from_le_bytes(tail) ^ (b.len() as u64).rotate_left(59));
    }
}

impl<'a> Seen<'a> {
    /// Where each GPU's rows come together in `rows` ([`Seen::Last`]), else a set: the rows
    /// of the store come by GPU (its id, not its UUID), so together, and one pass over the
    /// first row of each run of a UUID tells it, instead of a set per group.
    fn for_rows(rows: impl Iterator<Item = &'a GpuWindow>) -> Self {
        let mut heads: foldhash::HashSet<Uuid> =
            foldhash::HashSet::with_capacity_and_hasher(rows.size_hint().0, Default::default());
        let mut last: Option<&Arc<str>> = None;
        for w in rows {
            if last.is_some_and(|l| Arc::ptr_eq(l, &w.uuid) || **l == *w.uuid) {
                continue;
            }
            last = Some(&w.uuid);
            if !heads.insert(Uuid(&w.uuid)) {
                return Seen::All(Default::default());
            }
        }
        Seen::Last(None)
    }

    /// Whether `uuid` is new to the group.
    fn insert(&mut self, uuid: &'a str) -> bool {
        match self {
            Seen::Last(last) => {
                let new = *last != Some(uuid);
                *last = Some(uuid);
                new
            }
            Seen::All(set) => set.insert(Uuid(uuid)),
        }
    }

    /// An empty one of the same kind.
    fn fresh(&self) -> Self {
        match self {
            Seen::Last(_) => Seen::Last(None),
            Seen::All(_) => Seen::All(Default::default()),
        }
    }
}

impl<'a> Acc<'a> {
    fn new(seen: Seen<'a>) -> Self {
        Acc {
            g: SummaryGroup::default(),
            activity_sum: 0.0,
            known_hours: 0,
            seen,
        }
    }

    fn add(&mut self, w: &'a GpuWindow) {
        if w.present_hours == 0 {
            return;
        }
        let g = &mut self.g;
        if self.seen.insert(&w.uuid) {
            g.gpus += 1;
        }
        g.gpu_hours += w.present_hours;
        g.busy_hours += w.busy_hours;
        g.idle_hours += w.idle_hours;
        g.unknown_hours += w.unknown_hours();
        g.allocated_hours += w.allocated_hours;
        g.allocated_idle_hours += w.allocated_idle_hours;
        match (w.cost_usd(), w.idle_cost_usd(), w.allocated_idle_cost_usd()) {
            (Some(cost), Some(idle), Some(alloc_idle)) => {
                g.cost_usd += cost;
                g.idle_cost_usd += idle;
                g.allocated_idle_cost_usd += alloc_idle;
            }
            _ => g.unpriced_gpu_hours += w.present_hours,
        }
        if w.billed_hours > 0 {
            g.billed_gpu_hours += w.billed_hours;
            g.billed_usd += w.billed_usd;
            if let Some(rate) = w.usd_per_hour {
                g.billed_estimate_usd += w.billed_hours as f64 * rate;
            }
        }
        self.activity_sum += w.activity_sum;
        self.known_hours += w.known_hours;
    }

    fn finish(mut self, key: String) -> SummaryGroup {
        self.g.key = key;
        self.g.avg_activity_pct =
            (self.known_hours > 0).then(|| round(self.activity_sum / self.known_hours as f64, 2));
        self.g.cost_usd = round(self.g.cost_usd, 2);
        self.g.idle_cost_usd = round(self.g.idle_cost_usd, 2);
        self.g.allocated_idle_cost_usd = round(self.g.allocated_idle_cost_usd, 2);
        self.g.billed_usd = round(self.g.billed_usd, 2);
        self.g.billed_estimate_usd = round(self.g.billed_estimate_usd, 2);
        self.g.cost_basis = CostBasis::of(self.g.billed_gpu_hours, self.g.gpu_hours);
        self.g
    }
}

/// `v` rounded to `places` decimals: how every figure is reported.
pub fn round(v: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (v * f).round() / f
}

/// Group per-GPU windows; groups are sorted by cost (then GPU-hours) descending, then key.
/// GPUs not present in the window are left out.
pub fn summarize(windows: &[GpuWindow], by: GroupBy) -> (Vec<SummaryGroup>, SummaryGroup) {
    let seen = Seen::for_rows(windows.iter());
    // A GPU's neighbours mostly share its group (a host's GPUs): the last group is tried
    // first, by the shared text's address, before the map.
    let mut groups: Vec<(&str, Acc)> = Vec::new();
    let mut at: foldhash::HashMap<&str, usize> = Default::default();
    let mut last: Option<(&str, usize)> = None;
    let mut total = Acc::new(seen.fresh());
    for w in windows {
        let key = w.key(by);
        let i = match last {
            Some((k, i)) if std::ptr::eq(k, key) || k == key => i,
            _ => *at.entry(key).or_insert_with(|| {
                groups.push((key, Acc::new(seen.fresh())));
                groups.len() - 1
            }),
        };
        last = Some((key, i));
        groups[i].1.add(w);
        total.add(w);
    }
    let mut out: Vec<SummaryGroup> = groups
        .into_iter()
        .filter(|(_, a)| a.g.gpus > 0)
        .map(|(k, a)| a.finish(k.to_string()))
        .collect();
    out.sort_by(|a, b| {
        b.cost_usd
            .total_cmp(&a.cost_usd)
            .then(b.gpu_hours.cmp(&a.gpu_hours))
            .then(a.key.cmp(&b.key))
    });
    (out, total.finish("total".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(team: &str, rate: Option<f64>, present: i64, busy: i64, idle: i64, act: f64) -> GpuWindow {
        GpuWindow {
            team: team.into(),
            env: "prod".into(),
            model: "m".into(),
            vendor: None,
            usd_per_hour: rate,
            present_hours: present,
            busy_hours: busy,
            idle_hours: idle,
            known_hours: busy + idle,
            activity_sum: act,
            ..Default::default()
        }
    }

    #[test]
    fn a_gpu_counts_once_per_group_whether_its_rows_come_together_or_not() {
        let row = |uuid: &str, team: &str| GpuWindow {
            uuid: uuid.into(),
            ..w(team, Some(1.0), 2, 1, 1, 50.0)
        };
        // Together (by GPU, not by UUID), then apart: the same groups either way.
        let together = [row("GPU-b", "x"), row("GPU-b", "y"), row("GPU-a", "x")];
        let apart = [row("GPU-b", "x"), row("GPU-a", "x"), row("GPU-b", "x")];
        let (groups, total) = summarize(&together, GroupBy::Team);
        let got: Vec<_> = groups.iter().map(|g| (g.key.as_str(), g.gpus)).collect();
        assert_eq!((got, total.gpus), (vec![("x", 2), ("y", 1)], 2));
        let (groups, total) = summarize(&apart, GroupBy::Team);
        let got: Vec<_> = groups
            .iter()
            .map(|g| (g.key.as_str(), g.gpus, g.gpu_hours))
            .collect();
        assert_eq!((got, total.gpus), (vec![("x", 2, 6)], 2));
    }

    #[test]
    fn unknown_hours_are_left_out_of_average_and_unpriced_hours_of_cost() {
        let ws = [
            w("a", Some(2.0), 10, 4, 2, 4.0 * 50.0 + 2.0 * 1.0),
            GpuWindow {
                uuid: "GPU-2".into(),
                ..w("a", None, 5, 0, 0, 0.0)
            },
            w("b", Some(1.0), 0, 0, 0, 0.0),
        ];
        let (groups, total) = summarize(&ws, GroupBy::Team);
        assert_eq!(groups.len(), 1);
        let a = &groups[0];
        assert_eq!((a.gpus, a.gpu_hours, a.unknown_hours), (2, 15, 9));
        assert_eq!(a.avg_activity_pct, Some(33.67));
        assert_eq!(
            (a.cost_usd, a.idle_cost_usd, a.unpriced_gpu_hours),
            (20.0, 4.0, 5)
        );
        assert_eq!(total.gpus, 2);
        let (_, none) = summarize(&[w("x", None, 3, 0, 0, 0.0)], GroupBy::Team);
        assert_eq!(none.avg_activity_pct, None);
    }

    /// A GPU that changed owner in the window has a row per owner: each team gets its hours,
    /// the total counts the GPU once, and the per-GPU fold keeps the latest owner.
    #[test]
    fn a_gpu_with_two_owners_splits_its_hours_and_counts_once() {
        let rows = vec![
            w("nlp", Some(2.0), 3, 3, 0, 150.0),
            GpuWindow {
                mem_max_mib: Some(10.0),
                ..w("vision", Some(2.0), 2, 1, 1, 51.0)
            },
        ];
        let (groups, total) = summarize(&rows, GroupBy::Team);
        let got: Vec<_> = groups
            .iter()
            .map(|g| (g.key.as_str(), g.gpus, g.gpu_hours, g.cost_usd))
            .collect();
        assert_eq!(got, [("nlp", 1, 3, 6.0), ("vision", 1, 2, 4.0)]);
        assert_eq!((total.gpus, total.gpu_hours, total.cost_usd), (1, 5, 10.0));
        let one = per_gpu(rows);
        assert_eq!(one.len(), 1);
        assert_eq!(
            (&*one[0].team, one[0].present_hours, one[0].busy_hours),
            ("vision", 5, 4)
        );
        assert_eq!(
            (one[0].activity_sum, one[0].mem_max_mib),
            (201.0, Some(10.0))
        );
    }

    #[test]
    fn day_points_by_team_count_a_gpu_under_each_owner_and_leave_absent_groups_out() {
        let start = DateTime::from_timestamp(1_796_256_000, 0).unwrap();
        let gpu = |uuid: &str, w: GpuWindow| GpuWindow {
            uuid: uuid.into(),
            ..w
        };
        // GPU-1 moved from nlp to vision that day; GPU-2 stayed in nlp; GPU-3 (infra) was
        // not present.
        let rows = vec![
            gpu("GPU-1", w("nlp", Some(2.0), 3, 3, 0, 150.0)),
            gpu("GPU-1", w("vision", Some(2.0), 2, 1, 1, 51.0)),
            gpu("GPU-2", w("nlp", None, 4, 0, 4, 0.0)),
            gpu("GPU-3", w("infra", None, 0, 0, 0, 0.0)),
        ];
        let got: Vec<_> = day_points_by(start, &rows, GroupBy::Team)
            .into_iter()
            .map(|(k, p)| (k, p.start, p.gpus, p.gpu_hours, p.busy_hours, p.idle_hours))
            .collect();
        assert_eq!(
            got,
            [
                ("nlp".to_string(), start, 2, 7, 3, 4),
                ("vision".to_string(), start, 1, 2, 1, 1)
            ]
        );
        // Each team's point is the fleet's point of that team's rows.
        let nlp: Vec<GpuWindow> = rows.iter().filter(|r| &*r.team == "nlp").cloned().collect();
        assert_eq!(
            day_points_by(start, &rows, GroupBy::Team)[0].1,
            day_point(start, &nlp).unwrap()
        );
    }

    #[test]
    fn a_gpu_counts_once_per_group_in_any_row_order() {
        let start = DateTime::from_timestamp(1_796_256_000, 0).unwrap();
        let gpu = |uuid: &str, w: GpuWindow| GpuWindow {
            uuid: uuid.into(),
            ..w
        };
        // GPU-1 went nlp, vision, nlp again: two periods in nlp, one in vision. GPU-2 had two
        // periods in nlp; GPU-3 one in vision.
        let in_order = vec![
            gpu("GPU-1", w("nlp", Some(2.0), 3, 3, 0, 150.0)),
            gpu("GPU-1", w("vision", Some(2.0), 2, 1, 1, 51.0)),
            gpu("GPU-1", w("nlp", Some(2.0), 1, 0, 1, 2.0)),
            gpu("GPU-2", w("nlp", None, 4, 0, 4, 0.0)),
            gpu("GPU-2", w("nlp", None, 2, 2, 0, 120.0)),
            gpu("GPU-3", w("vision", Some(1.0), 5, 5, 0, 400.0)),
        ];
        // The same rows with each GPU's rows apart: counted through a set instead.
        let mut apart = in_order.clone();
        apart.swap(1, 3);
        apart.swap(0, 5);
        assert!(!apart.is_sorted_by(|a, b| a.uuid <= b.uuid));
        for rows in [&in_order, &apart] {
            let (groups, total) = summarize(rows, GroupBy::Team);
            let got: Vec<_> = groups
                .iter()
                .map(|g| (g.key.as_str(), g.gpus, g.gpu_hours))
                .collect();
            assert_eq!(got, [("vision", 2, 7), ("nlp", 2, 10)], "{rows:?}");
            assert_eq!((total.gpus, total.gpu_hours), (3, 17));
            let points = day_points_by(start, rows, GroupBy::Team);
            let got: Vec<_> = points.iter().map(|(k, p)| (k.as_str(), p.gpus)).collect();
            assert_eq!(got, [("nlp", 2), ("vision", 2)]);
            assert_eq!(day_point(start, rows).unwrap().gpus, 3);
        }
    }
}
