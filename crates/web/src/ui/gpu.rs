//! The GPU page, the drill-down target of every other page: each attribute with the source and
//! rule that gave it, hourly activity and memory over time, and who used it when.

use askama::Template;
use axum::extract::{Path, State};
use axum::response::Response;
use gpuledger_ledger::echo;

use super::charts::{lines, timeline, Series};
use super::{col, count, pct, respond, usd, Cell, Frame, Page, PageError, Table};
use crate::AppState;

#[derive(Template)]
#[template(path = "gpu.html")]
pub struct GpuPage {
    pub frame: Frame,
    pub uuid: String,
    pub attrs: Vec<(String, String, String)>,
    pub hours: String,
    pub activity: String,
    pub cost: String,
    pub cost_basis: String,
    pub alloc_idle_cost: String,
    pub activity_svg: String,
    pub memory_svg: String,
    pub timeline_svg: String,
    pub allocations: Table,
    pub provenance: Table,
    pub owners: Table,
}

pub async fn gpu_page(
    State(state): State<AppState>,
    Path(uuid): Path<String>,
    page: Page,
) -> Result<Response, PageError> {
    let Page {
        p,
        now,
        window,
        frame: mut f,
        scope,
        ..
    } = page;
    f.title = "GPU".into();
    // Another team's GPU is, to a scoped token, no GPU at all.
    let d = state
        .store
        .gpu_detail(&uuid, window, now)
        .await?
        .filter(|d| scope.may_read(&d.gpu.team))
        .ok_or_else(|| PageError::not_found(format!("no GPU with uuid `{}`", echo(&uuid))))?;
    let g = &d.gpu;
    let fig = &d.figures;
    let attrs = attributes(&d);
    let thr = state.store.settings().idle_threshold_pct;
    let labels: Vec<String> = d
        .hours
        .iter()
        .map(|h| h.hour.format("%m-%d %H:00").to_string())
        .collect();
    let activity_svg = lines(
        "Hourly activity",
        &labels,
        &[
            Series {
                name: "activity (% of hour, gaps = unknown)".into(),
                color: "var(--busy)".into(),
                values: d.hours.iter().map(|h| measured(h, true)).collect(),
            },
            Series {
                name: "a job's average where no sample measured the hour".into(),
                color: "var(--alloc)".into(),
                values: d.hours.iter().map(|h| measured(h, false)).collect(),
            },
            Series {
                name: format!("idle threshold {thr} %"),
                color: "var(--idle)".into(),
                values: d.hours.iter().map(|_| Some(thr)).collect(),
            },
        ],
        100.0,
        " %",
    );
    let mem_cap = g.memory_mib.map(|m| m as f64);
    let mem_max = d
        .hours
        .iter()
        .filter_map(|h| h.mem_used_mib_max)
        .fold(0.0, f64::max);
    let memory_svg = lines(
        "Peak memory used per hour",
        &labels,
        &[Series {
            name: "peak memory used (MiB)".into(),
            color: "var(--alloc)".into(),
            values: d.hours.iter().map(|h| h.mem_used_mib_max).collect(),
        }],
        mem_cap.unwrap_or(mem_max).max(1.0),
        "",
    );
    let end = window.to.min(now.timestamp());
    let rows: Vec<(String, i64, i64, bool)> = d
        .allocations
        .iter()
        .take(20)
        .map(|a| {
            let who = a
                .user
                .clone()
                .or(a.team.clone())
                .map(|u| format!(" ({u})"))
                .unwrap_or_default();
            (
                format!("{}{who}", a.workload),
                a.start.timestamp().max(window.from),
                a.end.map(|e| e.timestamp()).unwrap_or(end).min(end),
                a.end.is_none(),
            )
        })
        .collect();
    let timeline_svg = timeline("Allocations on this GPU", window.from, end, &rows);
    let (allocations, provenance, owners) = tables(&f, &d);
    let page = GpuPage {
        uuid: g.uuid.to_string(),
        attrs,
        hours: count(fig.gpu_hours),
        activity: pct(fig.avg_activity_pct),
        cost: fig.cost_usd.map(usd).unwrap_or_else(|| "unknown".into()),
        cost_basis: if d.billed_gpu_hours > 0 {
            format!(
                "{}: billed {} for {} of {} GPU-hours",
                d.cost_basis.as_str(),
                usd(d.billed_usd),
                count(d.billed_gpu_hours),
                count(fig.gpu_hours)
            )
        } else {
            "estimate: no billing export covers the range".into()
        },
        alloc_idle_cost: fig
            .allocated_idle_cost_usd
            .map(usd)
            .unwrap_or_else(|| "unknown".into()),
        activity_svg,
        memory_svg,
        timeline_svg,
        allocations,
        provenance,
        owners,
        frame: f,
    };
    let tables = [&page.allocations, &page.provenance, &page.owners];
    respond(&page, &tables, &p)
}

/// The hour's activity when it came from samples (`by_samples`) or from an allocation's
/// scheduler average (`!by_samples`), else nothing: the chart draws the two apart.
fn measured(h: &gpuledger_model::HourPoint, by_samples: bool) -> Option<f64> {
    let from_samples = h.activity_origin.as_deref() == Some(gpuledger_model::ORIGIN_SAMPLES);
    h.activity_pct.filter(|_| from_samples == by_samples)
}

/// Each attribute with its value and where it came from (the source and time, or the rule).
fn attributes(d: &gpuledger_model::GpuDetail) -> Vec<(String, String, String)> {
    let g = &d.gpu;
    let fig = &d.figures;
    let said_by = |attr: &str| {
        let by: Vec<String> = d
            .provenance
            .iter()
            .filter(|x| x.attribute == attr)
            .map(|x| format!("{} at {}", x.source, x.observed_at.format("%Y-%m-%d %H:%M")))
            .collect();
        if by.is_empty() {
            String::new()
        } else {
            format!("from {}", by.join("; "))
        }
    };
    let opt = |v: &Option<std::sync::Arc<str>>| v.as_deref().unwrap_or("unknown").to_string();
    let mut attrs = vec![
        (
            "Vendor".to_string(),
            g.vendor
                .map(|v| v.as_str().to_string())
                .unwrap_or_else(|| "unknown".into()),
            String::new(),
        ),
        ("Model".to_string(), g.model.to_string(), said_by("model")),
        (
            "Activity measures".to_string(),
            gpuledger_ledger::summary::activity_basis(g.vendor).to_string(),
            "definitions: activity per vendor".to_string(),
        ),
        (
            "Memory".into(),
            g.memory_mib
                .map(|m| format!("{} MiB", count(m as i64)))
                .unwrap_or_else(|| "unknown".into()),
            said_by("memory_mib"),
        ),
        ("Host".into(), opt(&g.host), said_by("host")),
        ("Cluster".into(), opt(&g.cluster), said_by("cluster")),
        (
            "Cloud / region".into(),
            format!("{} / {}", opt(&g.cloud), opt(&g.region)),
            said_by("cloud"),
        ),
        (
            "Instance type".into(),
            opt(&g.instance_type),
            said_by("instance_type"),
        ),
        ("Cloud account".into(), opt(&g.account), said_by("account")),
        ("Owner (team)".into(), g.team.to_string(), {
            let mut why = g.owner_reason.to_string();
            for c in d
                .conflicts
                .iter()
                .filter(|c| c.attribute == "labels.team" || c.attribute == "labels.env")
            {
                let said: Vec<String> = c
                    .values
                    .iter()
                    .map(|v| format!("`{}` from {}", v.value, v.source))
                    .collect();
                why.push_str(&format!(
                    "; sources disagree on {}: {} (the primary source's value is kept)",
                    c.attribute,
                    said.join(" vs ")
                ));
            }
            why
        }),
        (
            "Environment".into(),
            g.env.to_string(),
            said_by("labels.env"),
        ),
        (
            "State".into(),
            match gpuledger_ledger::identity::unavailable(&g.labels) {
                Some(why) => format!("{}, {why}", g.state.as_str()),
                None => g.state.as_str().to_string(),
            },
            format!(
                "first seen {}, last seen {}",
                g.first_seen.format("%Y-%m-%d %H:%M"),
                g.last_seen.format("%Y-%m-%d %H:%M UTC")
            ),
        ),
        (
            "Hourly rate".into(),
            fig.usd_per_hour
                .map(|r| format!("${r:.4}/h"))
                .unwrap_or_else(|| "unknown".into()),
            fig.rate_basis.clone(),
        ),
        (
            "Serial / PCI".into(),
            format!("{} / {}", opt(&g.serial), opt(&g.pci_bus_id)),
            said_by("serial"),
        ),
        (
            "Primary source".into(),
            g.source.to_string(),
            "the first source to report it; other sources only fill gaps".into(),
        ),
    ];
    if let Some(parent) = &g.mig_parent_uuid {
        attrs.push((
            "MIG instance of".into(),
            parent.to_string(),
            format!("profile {}", g.mig_profile.clone().unwrap_or_default()),
        ));
    }
    if !d.mig_children.is_empty() {
        attrs.push((
            "MIG instances".into(),
            d.mig_children.join(", "),
            String::new(),
        ));
    }
    let averaged = d
        .hours
        .iter()
        .filter(|h| h.activity_pct.is_some() && measured(h, false).is_some())
        .count();
    if averaged > 0 {
        attrs.push((
            "Hours from a job's average".into(),
            format!(
                "{} of {} hours with known activity",
                count(averaged as i64),
                count(d.hours.iter().filter(|h| h.activity_pct.is_some()).count() as i64)
            ),
            "no sample measured them; the allocation's scheduler average (Slurm gres/gpuutil) \
             fills them (definitions: activity of an hour)"
                .into(),
        ));
    }
    if g.placeholder {
        attrs.push((
            "Placeholder".into(),
            "yes".into(),
            "a count-only source knows this GPU exists; a UUID-aware source will name it".into(),
        ));
    }
    attrs
}

/// The allocations, provenance and owner-history tables.
fn tables(f: &Frame, d: &gpuledger_model::GpuDetail) -> (Table, Table, Table) {
    let mut allocations = Table::new(
        "allocations",
        f,
        vec![
            col(
                "Workload",
                "Pod, job, process or reservation holding the GPU.",
            ),
            col("Kind", "pod, slurm_job, process, reservation or other."),
            col(
                "Owner",
                "The workload that owns it (Deployment/name, Job/name), when the source says.",
            ),
            col("User", "Who ran it, when the source says."),
            col("Used by", "The team the allocation names."),
            col(
                "Context",
                "Namespace, or Slurm account and partition, as the source gave them; \
                 ownership rules may read these and the labels behind them.",
            ),
            col("Start", "When it started (UTC)."),
            col("End", "When it ended; 'running' while open."),
            col("Source", "Which source reported it."),
            col(
                "Scheduler's average",
                "The average utilization and memory the scheduler's accounting measured over \
                 the allocation (Slurm gres/gpuutil, gres/gpumem); '—' when it gave none.",
            ),
        ],
    );
    for a in &d.allocations {
        allocations.push(vec![
            Cell::text(a.workload.clone()),
            Cell::text(a.kind.clone()),
            Cell::text(a.owner.clone().unwrap_or_else(|| "—".into())),
            Cell::text(a.user.clone().unwrap_or_else(|| "unknown".into())),
            Cell::text(gpuledger_ledger::usedby::user_team(a.team.as_deref())),
            Cell::text(context_text(&a.context)),
            Cell::text(a.start.format("%Y-%m-%d %H:%M").to_string()),
            Cell::text(
                a.end
                    .map(|e| e.format("%Y-%m-%d %H:%M").to_string())
                    .unwrap_or_else(|| "running".into()),
            ),
            Cell::text(a.source.clone()),
            Cell::text(average_text(a)),
        ]);
    }
    let mut provenance = Table::new(
        "provenance",
        f,
        vec![
            col("Attribute", "The attribute as the source sent it."),
            col("Value", "What the source said."),
            col("Source", "Which source said it."),
            col("Observed", "When it was observed (UTC)."),
        ],
    );
    for x in &d.provenance {
        provenance.push(vec![
            Cell::text(x.attribute.clone()),
            Cell::text(x.value.clone()),
            Cell::text(x.source.clone()),
            Cell::text(x.observed_at.format("%Y-%m-%d %H:%M").to_string()),
        ]);
    }
    let mut owners = Table::new(
        "owners",
        f,
        vec![
            col(
                "From",
                "Start of the period (UTC); 'first seen' for the first one.",
            ),
            col("To", "End of the period; 'now' while it is open."),
            col("Owner", "The team that owned the GPU in the period."),
            col("Environment", "Its environment in the period."),
            col(
                "Why",
                "The rule or label that decided it when the period opened.",
            ),
        ],
    );
    for o in &d.owner_history {
        owners.push(vec![
            Cell::text(
                o.from
                    .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
                    .unwrap_or_else(|| "first seen".into()),
            ),
            Cell::text(
                o.to.map(|t| t.format("%Y-%m-%d %H:%M").to_string())
                    .unwrap_or_else(|| "now".into()),
            ),
            Cell::text(o.team.clone()),
            Cell::text(o.env.clone()),
            Cell::text(o.reason.clone()),
        ]);
    }
    (allocations, provenance, owners)
}

/// `namespace nlp-prod` / `Slurm account speech, partition a100`, or `—`.
fn context_text(c: &gpuledger_model::WorkloadContext) -> String {
    let mut parts = Vec::new();
    if let Some(ns) = &c.namespace {
        parts.push(format!("namespace {ns}"));
    }
    if let Some(a) = &c.slurm_account {
        parts.push(format!("Slurm account {a}"));
    }
    if let Some(p) = &c.slurm_partition {
        parts.push(format!("partition {p}"));
    }
    if parts.is_empty() {
        "—".into()
    } else {
        parts.join(", ")
    }
}

/// An allocation's scheduler averages as the allocations table shows them.
fn average_text(a: &gpuledger_model::Allocation) -> String {
    let mut parts = Vec::new();
    if let Some(u) = a.avg_util_pct {
        parts.push(format!("{u:.1} % utilization"));
    }
    if let Some(m) = a.avg_mem_used_mib {
        parts.push(format!("{} MiB memory", count(m.round() as i64)));
    }
    if parts.is_empty() {
        "—".into()
    } else {
        parts.join(", ")
    }
}
