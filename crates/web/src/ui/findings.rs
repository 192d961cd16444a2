//! The findings of the Waste page, as tables and as a ranked list with evidence links: the
//! Waste page, the overview's top inefficiencies and `GET /api/v1/savings` all show these.
//! Every finding and its $ per month comes from `ledger::waste`.

use gpuledger_ledger::waste::{
    activity_candidate, allocated_idle_finding, billed_unseen_finding, first_ranked,
    low_memory_candidate, missing_finding, per_month, rank, rank_order, total_per_month_of,
    ActivityCandidate, ActivityEvidence, BilledUnseen, Finding, FindingKind, FirstWorkloads,
    LowMemoryCandidate, Place,
};

use super::{col, count, ncol, usd0, Cell, Frame, Table};
use crate::params::Params;
use crate::AppState;

/// Every finding of the Waste page, with the tables that show them (empty unless asked for).
pub struct Findings {
    pub idle: Table,
    pub unmeasured: Table,
    pub alloc_idle: Table,
    pub low_mem: Table,
    pub missing: Table,
    pub billed_unseen: Table,
    /// Every finding (the first [`Listing::top`] where given), ranked by
    /// `ledger::waste::rank`, with evidence links carrying the page's filters and range.
    pub all: Vec<Finding>,
    /// `ledger::waste::total_per_month` of every finding, written or not.
    pub total_per_month: f64,
    /// How many findings there are, written or not.
    pub count: usize,
}

/// `$1,235`, or `unknown` where a finding cannot be priced (no rate).
fn month_cell(m: Option<f64>) -> Cell {
    Cell::num(
        m.map(usd0).unwrap_or_else(|| "unknown".into()),
        m.unwrap_or(-1.0),
    )
}

/// What [`findings`] lists: GPUs idle for `idle_days` or more, the rows of its tables only
/// where `tables`, and of the ranked findings only the first `top` where given.
pub struct Listing {
    pub idle_days: i64,
    pub tables: bool,
    /// The Overview shows eight findings: the idle and unmeasured GPUs' findings, tens of
    /// thousands at 100,000 GPUs, are then ranked without being written, and only the first
    /// `top` of all findings are written and linked.
    pub top: Option<usize>,
    /// Where [`Listing::tables`], only the first `rows` rows of each table are written (the
    /// rest are counted in [`Table::hidden`]): the Waste page at 100,000 GPUs would otherwise
    /// write tens of thousands of rows, 15 MB of HTML. Its CSV downloads write them all.
    pub rows: Option<usize>,
}

impl Listing {
    /// How many allocated-idle workloads are written out: those a table's rows or the first
    /// `top` findings may show (the most expensive); the others are only counted and priced.
    pub fn written(&self) -> usize {
        let rows = if self.tables {
            self.rows.unwrap_or(usize::MAX)
        } else {
            0
        };
        rows.max(self.top.unwrap_or(usize::MAX))
    }
}

/// The order the idle and unmeasured GPUs are listed in: $ per month (largest first), then
/// days (most first), then UUID.
fn listed(a: &ActivityCandidate, b: &ActivityCandidate) -> std::cmp::Ordering {
    b.usd_per_month
        .unwrap_or(-1.0)
        .total_cmp(&a.usd_per_month.unwrap_or(-1.0))
        .then(b.days.cmp(&a.days))
        .then_with(|| a.gpu().uuid.cmp(&b.gpu().uuid))
}

/// The order the low-memory GPUs are listed in: rate (largest first), then UUID.
fn listed_low(a: &LowMemoryCandidate, b: &LowMemoryCandidate) -> std::cmp::Ordering {
    let (a, b) = (a.window(), b.window());
    b.usd_per_hour
        .unwrap_or(0.0)
        .total_cmp(&a.usd_per_hour.unwrap_or(0.0))
        .then_with(|| a.uuid.cmp(&b.uuid))
}

/// A finding to rank: an idle or unmeasured GPU's or a low-memory GPU's, not yet written, or
/// any other.
enum Ranked<'a> {
    Gpu(&'a ActivityCandidate<'a>),
    Low(&'a LowMemoryCandidate<'a>),
    Other(Finding),
}

impl Ranked<'_> {
    fn rank_key(&self) -> (FindingKind, Option<f64>, Place<'_>) {
        match self {
            Ranked::Gpu(c) => c.rank_key(),
            Ranked::Low(c) => c.rank_key(),
            Ranked::Other(x) => x.rank_key(),
        }
    }

    /// The order [`findings`] lists findings of one kind in before ranking, for findings
    /// `rank` holds equal (so of one kind): the idle and unmeasured GPUs' by [`listed`], the
    /// low-memory GPUs' by [`listed_low`], the others, written (all of them where the tables
    /// are filled, as listed), `Equal` (their positions decide). Kinds apart, by variant, only
    /// to keep the order total.
    fn listed_order(&self, other: &Self) -> std::cmp::Ordering {
        match (self, other) {
            (Ranked::Gpu(a), Ranked::Gpu(b)) => listed(a, b),
            (Ranked::Low(a), Ranked::Low(b)) => listed_low(a, b),
            _ => self.variant().cmp(&other.variant()),
        }
    }

    fn variant(&self) -> u8 {
        match self {
            Ranked::Gpu(_) => 0,
            Ranked::Low(_) => 1,
            Ranked::Other(_) => 2,
        }
    }

    fn finding(self) -> Finding {
        match self {
            Ranked::Gpu(c) => c.finding(),
            Ranked::Low(c) => c.finding(),
            Ranked::Other(x) => x,
        }
    }
}

/// What the findings read besides the page's GPU list and per-GPU counts, for the window and
/// filters of `p`: read by [`findings_reads`] beside those, not after them.
pub struct FindingsReads {
    /// Each GPU's last busy and last measured day.
    evidence: Vec<(String, ActivityEvidence)>,
    /// The allocated-idle workloads: the first ones whole ([`Listing::written`]), the
    /// figures of the others.
    workloads: FirstWorkloads,
    /// Billed resources no source reports (read only without filters: exports carry no team
    /// or GPU attributes).
    unseen: Vec<gpuledger_store::UnseenSpend>,
}

/// The reads of [`FindingsReads`], side by side, for findings listed as `listing` says.
pub async fn findings_reads(
    state: &AppState,
    p: &Params,
    listing: &Listing,
) -> Result<FindingsReads, gpuledger_store::StoreError> {
    let store = &state.store;
    let now = state.now();
    let window = p.window(now);
    let unseen = async {
        if p.filters.is_empty() {
            store
                .billed_unseen(window.from, window.to.min(now.timestamp()))
                .await
        } else {
            Ok(Vec::new())
        }
    };
    let (evidence, workloads, unseen) = tokio::try_join!(
        store.activity_evidence(&p.filters, now),
        store.idle_workloads_first(window, &p.filters, now, listing.written()),
        unseen,
    )?;
    Ok(FindingsReads {
        evidence,
        workloads,
        unseen,
    })
}

/// Everything the Waste page lists, for the window and filters of `p`.
/// `gpus` and `windows` are the page's GPU list and per-GPU counts for the same filters, `reads`
/// the rest ([`findings_reads`]). The tables are filled only where [`Listing::tables`] (the Waste page):
/// the Overview and `GET /api/v1/savings` show the findings alone, and at 10,000 GPUs the
/// rows of thousands of idle GPUs are most of the work.
pub fn findings(
    state: &AppState,
    p: &Params,
    f: &Frame,
    Listing {
        idle_days,
        tables,
        top,
        rows,
    }: Listing,
    gpus: &[gpuledger_model::GpuView],
    windows: &[gpuledger_ledger::GpuWindow],
    reads: FindingsReads,
) -> Findings {
    let now = state.now();
    let window = p.window(now);
    let window_hours = ((window.to.min(now.timestamp()) - window.from) as f64 / 3600.0).max(1.0);
    let FindingsReads {
        evidence,
        workloads,
        unseen,
    } = reads;
    let evidence: foldhash::HashMap<&str, ActivityEvidence> =
        evidence.iter().map(|(u, e)| (u.as_str(), *e)).collect();
    let mut all: Vec<Ranked> = Vec::new();
    let link = |x: &Finding| -> String {
        if x.evidence.starts_with("/api/") {
            x.evidence.clone()
        } else {
            f.link(&x.evidence)
        }
    };

    let gpu_cols = |last: (&str, &str)| {
        vec![
            col("GPU", "The GPU's UUID; follow it for its timeline."),
            col("Host", "Where it runs."),
            col("Team", "Owner team (cost is charged to the owner)."),
            col("Model", "GPU model."),
            ncol(last.0, last.1),
            ncol(
                "$/month",
                "Hourly rate × 730 h: what keeping it costs per month.",
            ),
        ]
    };
    let mut idle = Table::new(
        "idle-gpus",
        f,
        gpu_cols((
            "Idle for",
            "Days since the last day with a busy hour (activity at or above the idle \
             threshold), counted from its first sighting when it never had one. Only GPUs \
             whose activity is measured are listed.",
        )),
    );
    let mut unmeasured = Table::new(
        "no-activity-data",
        f,
        gpu_cols((
            "Unmeasured for",
            "Days without any activity data: no source reports its utilization. Not counted \
             as idle and not in the total; connect a metrics source to know.",
        )),
    );
    let mut found: Vec<ActivityCandidate> = gpus
        .iter()
        .filter_map(|g| {
            let ev = evidence.get(&*g.uuid).copied().unwrap_or_default();
            activity_candidate(g, ev, now.timestamp(), idle_days)
        })
        .collect();
    // Listed in order where all are written; else ranked by the same order as a tie-break.
    if tables || top.is_none() {
        found.sort_unstable_by(listed);
    }
    // Whether a table has room for one more row of the page.
    let room = |t: &Table| tables && rows.is_none_or(|n| t.rows.len() < n);
    for c in &found {
        let table = match c.kind {
            FindingKind::IdleGpu => &mut idle,
            _ => &mut unmeasured,
        };
        table.hidden += usize::from(tables && !room(table));
        if room(table) {
            // Written once, for its row's link and the list.
            let x = c.finding();
            let (g, days) = (c.gpu(), c.days);
            table.push(vec![
                Cell::text(&*g.uuid).link(link(&x)),
                Cell::text(g.host.as_deref().unwrap_or_default()),
                Cell::text(&*g.team).link(f.link(&format!("/teams/{}", super::enc(&g.team)))),
                Cell::text(&*g.model),
                Cell::num(format!("{days} d"), days as f64),
                month_cell(g.usd_per_hour.map(per_month)),
            ]);
            all.push(Ranked::Other(x));
        } else {
            all.push(Ranked::Gpu(c));
        }
    }

    let mut alloc_idle = Table::new(
        "allocated-idle",
        f,
        vec![
            col(
                "Workload",
                "The allocation (pod, job, process) holding the GPUs.",
            ),
            col("Kind", "pod, slurm_job, process, reservation or other."),
            col(
                "Used by",
                "The team the allocation names (`unowned` when it names none).",
            ),
            col("Owner", "The team owning the GPUs."),
            ncol("GPUs", "GPUs it held while idle."),
            ncol(
                "Allocated-idle h",
                "Its hours allocated and idle (activity below the threshold) in the range; an \
                 hour shared with other workloads counts its share.",
            ),
            ncol(
                "$/month",
                "Allocated-idle hours × rate, scaled from the range to 730 h; unknown when \
                 every hour is on GPUs without a rate.",
            ),
        ],
    );
    for w in &workloads.first {
        let x = allocated_idle_finding(w, window_hours);
        alloc_idle.hidden += usize::from(tables && !room(&alloc_idle));
        if room(&alloc_idle) {
            alloc_idle.push(vec![
                Cell::text(&*w.workload),
                Cell::text(&*w.kind),
                Cell::text(&*w.used_by),
                Cell::text(&*w.owner).link(f.link(&format!("/teams/{}", super::enc(&w.owner)))),
                Cell::num(count(w.gpus), w.gpus as f64),
                Cell::num(
                    format!("{:.1}", w.allocated_idle_hours),
                    w.allocated_idle_hours,
                ),
                month_cell(x.usd_per_month),
            ]);
        }
        all.push(Ranked::Other(x));
    }
    // The workloads not written: below every written one, so never among the first `top`
    // nor in a table's rows, but in its hidden rows, the count and the total.
    if tables {
        alloc_idle.hidden += workloads.rest.len();
    }
    let rest_per_month: Vec<Option<f64>> = workloads
        .rest
        .iter()
        .map(|c| c.usd_per_month(window_hours))
        .collect();

    let mut low_mem = Table::new(
        "low-memory",
        f,
        vec![
            col("GPU", "The GPU's UUID."),
            col("Team", "Owner team."),
            col("Model", "GPU model and its memory."),
            ncol(
                "Peak memory used",
                "Highest memory use in the range, as a share of the GPU's memory.",
            ),
            ncol("Avg activity", "Mean hourly activity over known hours."),
            ncol(
                "$/month",
                "Hourly rate × 730 h; a smaller GPU or a MIG slice would cost a fraction.",
            ),
        ],
    );
    let mut lows: Vec<LowMemoryCandidate> =
        windows.iter().filter_map(low_memory_candidate).collect();
    if tables || top.is_none() {
        lows.sort_by(listed_low);
    }
    for c in &lows {
        low_mem.hidden += usize::from(tables && !room(&low_mem));
        if room(&low_mem) {
            let x = c.finding();
            let (w, share) = (c.window(), c.share);
            let act = w.avg_activity_pct();
            low_mem.push(vec![
                Cell::text(w.uuid.to_string()).link(link(&x)),
                Cell::text(w.team.to_string()),
                Cell::text(format!("{} ({} MiB)", w.model, w.memory_mib.unwrap_or(0))),
                Cell::num(format!("{:.0} %", share * 100.0), share * 100.0),
                Cell::num(super::pct(act), act.unwrap_or(-1.0)),
                month_cell(w.usd_per_hour.map(per_month)),
            ]);
            all.push(Ranked::Other(x));
        } else {
            all.push(Ranked::Low(c));
        }
    }

    let mut missing = Table::new(
        "missing",
        f,
        vec![
            col("GPU", "The GPU's UUID."),
            col("Host", "Where it was last seen."),
            col("Team", "Owner team."),
            col("Source", "The source that reported it."),
            col(
                "Last seen",
                "Its last observation; missing after the stale window (2 h).",
            ),
            ncol(
                "$/month",
                "Hourly rate × 730 h, if it is still being paid for.",
            ),
        ],
    );
    for (g, x) in gpus
        .iter()
        .filter_map(|g| missing_finding(g).map(|x| (g, x)))
    {
        missing.hidden += usize::from(tables && !room(&missing));
        if room(&missing) {
            missing.push(vec![
                Cell::text(&*g.uuid).link(link(&x)),
                Cell::text(g.host.as_deref().unwrap_or_default()),
                Cell::text(&*g.team),
                Cell::text(&*g.source),
                Cell::text(g.last_seen.format("%Y-%m-%d %H:%M UTC").to_string()),
                month_cell(x.usd_per_month),
            ]);
        }
        all.push(Ranked::Other(x));
    }
    let mut billed_unseen = Table::new(
        "billed-unseen",
        f,
        vec![
            col(
                "Resource",
                "The billing export's ResourceId: an instance no source reports.",
            ),
            col("Instance type", "As the export names it."),
            col("Billed", "First and last charge period in the range (UTC)."),
            ncol(
                "Billed in range",
                "EffectiveCost of its GPU lines in the range.",
            ),
            ncol(
                "$/month",
                "What it was billed per day in the range × 30.4 days.",
            ),
            col("Export", "The imported file (GET /api/v1/billing)."),
        ],
    );
    // Billing exports carry no team or GPU attributes: read only without filters.
    for u in unseen {
        let b = BilledUnseen {
            resource_id: u.resource_id.clone(),
            instance_type: u.instance_type.clone(),
            effective_cost: u.effective_cost,
            first: u.first.timestamp(),
            last: u.last.timestamp(),
            file: u.file.clone(),
        };
        let x = billed_unseen_finding(&b);
        billed_unseen.hidden += usize::from(tables && !room(&billed_unseen));
        if room(&billed_unseen) {
            billed_unseen.push(vec![
                Cell::text(u.resource_id.clone()),
                Cell::text(u.instance_type.clone().unwrap_or_else(|| "unknown".into())),
                Cell::text(format!(
                    "{} – {}",
                    u.first.format("%Y-%m-%d"),
                    u.last.format("%Y-%m-%d")
                )),
                Cell::num(super::usd(u.effective_cost), u.effective_cost),
                month_cell(x.usd_per_month),
                Cell::text(u.file.clone()),
            ]);
        }
        all.push(Ranked::Other(x));
    }
    let total_per_month = total_per_month_of(
        all.iter()
            .map(|r| r.rank_key().1)
            .chain(rest_per_month.iter().copied()),
    );
    let count = all.len() + rest_per_month.len();
    let mut all: Vec<Finding> = match top {
        Some(n) => {
            let first = first_ranked(&all, n, |a, b| {
                rank_order(a.rank_key(), b.rank_key()).then_with(|| a.listed_order(b))
            });
            let mut slots: Vec<Option<Ranked>> = all.into_iter().map(Some).collect();
            first
                .into_iter()
                .filter_map(|at| slots[at].take())
                .map(Ranked::finding)
                .collect()
        }
        None => {
            let mut all: Vec<Finding> = all.into_iter().map(Ranked::finding).collect();
            rank(&mut all);
            all
        }
    };
    for x in &mut all {
        x.evidence = link(x);
    }
    Findings {
        idle,
        unmeasured,
        alloc_idle,
        low_mem,
        missing,
        billed_unseen,
        all,
        total_per_month,
        count,
    }
}
