//! Pieces more than one page shows: the spend table and the billed and cost-basis texts of
//! a summary group. Pages import these, never each other.

use gpuledger_model::SummaryGroup;

use super::{col, count, ncol, pct, usd, Cell, Frame, Table};

/// A spend table (team or environment) with links to drill down.
pub fn spend_table(
    id: &str,
    f: &Frame,
    first: &str,
    groups: &[SummaryGroup],
    link: impl Fn(&str) -> Option<String>,
) -> Table {
    let mut t = Table::new(
        id,
        f,
        vec![
            col(
                first,
                "The group; `unowned` / `unknown` are GPUs no rule places.",
            ),
            ncol("GPUs", "Physical GPUs present at some hour of the range."),
            ncol("GPU-hours", "Hours each GPU was present in the range."),
            ncol(
                "Avg activity",
                "Mean hourly activity over the hours whose activity is known.",
            ),
            ncol("Cost", "Σ present hours × rate (estimate)."),
            ncol(
                "Billed",
                "What imported billing exports billed for the group's GPU-hours they cover (with \
                 those hours); '—' where the cost is an estimate only.",
            ),
            ncol("Idle cost", "Σ idle hours × rate."),
            ncol(
                "Allocated-idle cost",
                "Σ hours both allocated and idle × rate.",
            ),
        ],
    );
    for g in groups {
        let mut key = Cell::text(&*g.key);
        if let Some(h) = link(&g.key) {
            key = key.link(h);
        }
        t.push(vec![
            key,
            Cell::num(count(g.gpus), g.gpus as f64),
            Cell::num(count(g.gpu_hours), g.gpu_hours as f64),
            Cell::num(pct(g.avg_activity_pct), g.avg_activity_pct.unwrap_or(-1.0)),
            Cell::num(usd(g.cost_usd), g.cost_usd),
            Cell::num(billed_text(g), g.billed_usd),
            Cell::num(usd(g.idle_cost_usd), g.idle_cost_usd),
            Cell::num(usd(g.allocated_idle_cost_usd), g.allocated_idle_cost_usd),
        ]);
    }
    t
}

/// `$1,234.00 (410 h)`: what was billed for a group's reconciled GPU-hours, or `—`.
pub fn billed_text(g: &SummaryGroup) -> String {
    if g.billed_gpu_hours > 0 {
        format!("{} ({} h)", usd(g.billed_usd), count(g.billed_gpu_hours))
    } else {
        "—".into()
    }
}

/// The cost card's basis: an estimate, or partly or wholly reconciled with billing.
pub fn cost_basis_text(t: &SummaryGroup) -> String {
    match t.cost_basis {
        gpuledger_model::CostBasis::Estimate => {
            "estimate: no billing export covers the range".into()
        }
        basis => format!(
            "{}: billed {} for {} of {} GPU-hours (estimated {} for those)",
            basis.as_str(),
            usd(t.billed_usd),
            count(t.billed_gpu_hours),
            count(t.gpu_hours),
            usd(t.billed_estimate_usd)
        ),
    }
}
