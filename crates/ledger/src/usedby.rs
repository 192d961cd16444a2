//! "Used by": each present GPU-hour's cost split among the workloads that held the GPU in that
//! hour (BRIEF section 4: overlapping allocations are split evenly), charged to the team each
//! allocation names. Time-sliced pods on one GPU and the pods on its MIG instances share that
//! physical GPU's hour, so the shares of an hour add up to exactly that hour's cost, never
//! more. Hours no allocation covers go to the named bucket [`UNALLOCATED`].
//!
//! The store reads, per physical GPU and allocating team, the sum of that team's shares of the
//! GPU's present hours (`1 / holders` per hour held); everything from there on — which team
//! name a share goes to, pricing, unpriced hours, the unallocated rest, GPUs per team — is
//! decided here, once, for `GET /api/v1/used-by`, the Teams page and the Waste page.

use std::collections::HashMap;
use std::sync::Arc;

use gpuledger_model::UNOWNED;
use serde::Serialize;

/// The bucket for present GPU-hours no allocation covers.
pub const UNALLOCATED: &str = "unallocated";

/// The team an allocation's hours are charged to: its `team`, trimmed and lower-cased like
/// owner teams, or [`UNOWNED`] when it names none (the same bucket, and the same meaning —
/// "no team is known for this" — as GPUs no ownership rule places).
pub fn user_team(team: Option<&str>) -> String {
    match team.map(|t| t.trim().to_ascii_lowercase()) {
        Some(t) if !t.is_empty() => t,
        _ => UNOWNED.to_string(),
    }
}

/// One physical GPU's hours held by one allocating team in a window: Σ over the GPU's present
/// hours of (this team's holders ÷ all holders of that hour).
#[derive(Debug, Clone, PartialEq)]
pub struct HeldShare {
    pub gpu_id: i64,
    /// The team the allocations name, as stored (normalized by [`user_team`]); shared, as
    /// the store keeps the shares of settled days between requests.
    pub team: Option<Arc<str>>,
    pub gpu_hours: f64,
}

/// A team's use of GPUs in a window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UsedBy {
    pub team: String,
    /// Distinct physical GPUs it held at some present hour (0 for [`UNALLOCATED`] is never
    /// reported: that row counts the GPUs with an unheld hour).
    pub gpus: i64,
    /// GPU-hours, fractions where an hour was shared.
    pub gpu_hours: f64,
    /// Cost of those hours over GPUs with a rate.
    pub cost_usd: f64,
    /// Of `gpu_hours`, the hours of GPUs without a rate: reported, never priced at $0.
    pub unpriced_gpu_hours: f64,
}

/// Split the present hours of the GPUs in `rates` (id → hourly rate, `None` when unknown; GPUs
/// not in it are outside the filter) among their holders. `present` gives each GPU's present
/// hours in the window; every share is of those hours only. Rows come sorted by team.
pub fn split(
    rates: &HashMap<i64, Option<f64>>,
    shares: &[HeldShare],
    present: &[(i64, i64)],
) -> Vec<UsedBy> {
    // Per team as [`user_team`] names it: its row and the GPUs it held. A fleet has a few
    // hundred thousand shares and a few dozen names as stored: each stored name is told once.
    let mut rows: Vec<(UsedBy, foldhash::HashSet<i64>)> = Vec::new();
    let mut by_name: HashMap<String, usize> = HashMap::new();
    let mut by_stored: foldhash::HashMap<Option<&str>, usize> = Default::default();
    let row_of = |rows: &mut Vec<(UsedBy, foldhash::HashSet<i64>)>,
                  by_name: &mut HashMap<String, usize>,
                  name: String|
     -> usize {
        let next = rows.len();
        let at = *by_name.entry(name.clone()).or_insert(next);
        if at == next {
            rows.push((
                UsedBy {
                    team: name,
                    ..Default::default()
                },
                Default::default(),
            ));
        }
        at
    };
    let add = |row: &mut (UsedBy, foldhash::HashSet<i64>), gpu_id, hours, rate| {
        let (u, gpus) = row;
        gpus.insert(gpu_id);
        u.gpu_hours += hours;
        match rate {
            Some(r) => u.cost_usd += hours * r,
            None => u.unpriced_gpu_hours += hours,
        }
    };
    // The shares of a held hour add up to one, so a GPU's shares add up to its held hours.
    let mut held: foldhash::HashMap<i64, f64> = Default::default();
    for s in shares {
        let Some(rate) = rates.get(&s.gpu_id) else {
            continue;
        };
        *held.entry(s.gpu_id).or_default() += s.gpu_hours;
        let stored = s.team.as_deref();
        let at = match by_stored.get(&stored) {
            Some(&at) => at,
            None => {
                let at = row_of(&mut rows, &mut by_name, user_team(stored));
                by_stored.insert(stored, at);
                at
            }
        };
        add(&mut rows[at], s.gpu_id, s.gpu_hours, *rate);
    }
    let mut unallocated = None;
    for (gpu_id, n) in present {
        let Some(rate) = rates.get(gpu_id) else {
            continue;
        };
        let free = *n - held.get(gpu_id).copied().unwrap_or(0.0).round() as i64;
        if free > 0 {
            let at = *unallocated
                .get_or_insert_with(|| row_of(&mut rows, &mut by_name, UNALLOCATED.to_string()));
            add(&mut rows[at], *gpu_id, free as f64, *rate);
        }
    }
    let mut out: Vec<UsedBy> = rows
        .into_iter()
        .map(|(mut u, gpus)| {
            u.gpus = gpus.len() as i64;
            u
        })
        .collect();
    out.sort_unstable_by(|a, b| a.team.cmp(&b.team));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(gpu_id: i64, team: Option<&str>, gpu_hours: f64) -> HeldShare {
        HeldShare {
            gpu_id,
            team: team.map(Into::into),
            gpu_hours,
        }
    }

    /// Two GPUs: GPU 1 ($2/h) present 4 h, held 1.5 h by `NLP ` and 1.5 h by vision (shared
    /// hours), 1 h free; GPU 2 (no rate) present 2 h, held 2 h by an allocation naming no team;
    /// GPU 3 is outside the filter.
    #[test]
    fn shares_are_priced_once_unpriced_hours_stay_unpriced_and_names_are_normalized() {
        let rates = HashMap::from([(1, Some(2.0)), (2, None)]);
        let rows = split(
            &rates,
            &[
                share(1, Some("NLP "), 1.5),
                share(1, Some("vision"), 1.5),
                share(2, None, 2.0),
                share(3, Some("nlp"), 9.0),
            ],
            &[(1, 4), (2, 2), (3, 9)],
        );
        let got: Vec<_> = rows
            .iter()
            .map(|u| {
                (
                    u.team.as_str(),
                    u.gpus,
                    u.gpu_hours,
                    u.cost_usd,
                    u.unpriced_gpu_hours,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("nlp", 1, 1.5, 3.0, 0.0),
                ("unallocated", 1, 1.0, 2.0, 0.0),
                ("unowned", 1, 2.0, 0.0, 2.0),
                ("vision", 1, 1.5, 3.0, 0.0),
            ]
        );
        let hours: f64 = rows.iter().map(|u| u.gpu_hours).sum();
        assert_eq!(hours, 6.0, "every present hour is split exactly once");
    }
}
