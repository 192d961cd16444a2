//! Identity decisions: one GPU per physical device (BRIEF section 4). The store moves rows; what
//! it moves, and where to, is decided here.

use std::collections::BTreeMap;

use crate::merge::GpuRecord;

/// Whether a newly reported GPU takes over one of its host's placeholder GPUs (made by a source
/// that knows only counts). Only a physical GPU may: a MIG instance is never counted as a GPU,
/// so a placeholder's hours moved onto one would vanish from GPU-hours and cost.
pub fn may_absorb_placeholder(new: &GpuRecord) -> bool {
    !new.placeholder && new.mig_parent_uuid.is_none() && new.host.is_some()
}

/// Where slot `slot` of an allocation made on a host's GPU pool (`placeholder:<host>:<slot>`)
/// lands once the host has real GPUs: on a GPU where another source saw the same workload
/// (`evidence`), else on the host's physical GPUs in the order `physical` gives them (the store
/// gives PCI address order: slot `n` is the device Slurm and CUDA number `n`); `None` while the
/// host has no real GPU (the allocation stays on the pool).
pub fn pool_target<'a>(
    slot: u32,
    physical: &'a [String],
    evidence: &'a [String],
) -> Option<&'a str> {
    let targets = if evidence.is_empty() {
        physical
    } else {
        evidence
    };
    (!targets.is_empty()).then(|| targets[slot as usize % targets.len()].as_str())
}

/// Placeholder MIG instances for a host whose layout a count-only source knows (profile →
/// instances on the host) but whose instances no UUID-aware source has named: `(uuid, parent
/// GPU, profile)` for each, placed on the host's GPUs (`gpus`, in order) where their slices
/// still fit (`slices_per_gpu` each), else round the GPUs in turn.
pub fn mig_placeholders(
    host: &str,
    gpus: &[String],
    instances: &BTreeMap<String, u32>,
    slices_per_gpu: u32,
) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    if gpus.is_empty() {
        return out;
    }
    let mut free = vec![slices_per_gpu; gpus.len()];
    let mut next = 0usize;
    // Larger profiles first, so they find room before small ones fill it.
    let mut profiles: Vec<(&String, u32, u32)> = instances
        .iter()
        .map(|(p, n)| (p, *n, crate::mig::profile_slices(p).unwrap_or(1)))
        .collect();
    profiles.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(b.0)));
    for (profile, n, slices) in profiles {
        for k in 0..n {
            let at = match free.iter().position(|f| *f >= slices) {
                Some(i) => i,
                None => {
                    next = (next + 1) % gpus.len();
                    next
                }
            };
            free[at] = free[at].saturating_sub(slices);
            out.push((
                gpuledger_model::mig_placeholder_uuid(host, profile, k),
                gpus[at].clone(),
                profile.clone(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(uuid: &str, parent: Option<&str>) -> GpuRecord {
        GpuRecord {
            uuid: uuid.into(),
            host: Some("node-1".into()),
            mig_parent_uuid: parent.map(str::to_string),
            ..Default::default()
        }
    }

    /// The bug: a MIG instance reported with a host absorbed the host's placeholder, and its
    /// hours vanished from GPU-hours and cost.
    #[test]
    fn only_a_physical_gpu_takes_over_a_placeholder() {
        assert!(may_absorb_placeholder(&rec("GPU-1", None)));
        assert!(!may_absorb_placeholder(&rec(
            "MIG-GPU-1/1/0",
            Some("GPU-1")
        )));
        let mut ph = rec("placeholder:node-1:0", None);
        ph.placeholder = true;
        assert!(!may_absorb_placeholder(&ph));
        let mut hostless = rec("GPU-2", None);
        hostless.host = None;
        assert!(!may_absorb_placeholder(&hostless));
    }

    /// A node offering 3× 1g.5gb and 1× 2g.10gb on one A100: all four on it; 14× 1g.5gb on
    /// two GPUs: seven each.
    #[test]
    fn mig_layouts_fill_each_gpu_by_its_slices() {
        let one = vec!["GPU-a".to_string()];
        let layout = BTreeMap::from([("1g.5gb".to_string(), 3), ("2g.10gb".to_string(), 1)]);
        let got = mig_placeholders("n", &one, &layout, 7);
        assert_eq!(got.len(), 4);
        assert!(got.iter().all(|(_, parent, _)| parent == "GPU-a"));
        assert_eq!(got[0].0, "placeholder:n:mig-2g.10gb-0");
        let two = vec!["GPU-a".to_string(), "GPU-b".to_string()];
        let got = mig_placeholders("n", &two, &BTreeMap::from([("1g.5gb".to_string(), 14)]), 7);
        let on_b = got.iter().filter(|(_, p, _)| p == "GPU-b").count();
        assert_eq!((got.len(), on_b), (14, 7));
        assert!(mig_placeholders("n", &[], &layout, 7).is_empty());
    }

    #[test]
    fn pool_slots_prefer_evidence_then_spread_over_physical_gpus() {
        let physical = vec!["GPU-a".to_string(), "GPU-b".to_string()];
        assert_eq!(pool_target(3, &physical, &[]), Some("GPU-b"));
        let seen = vec!["GPU-b".to_string()];
        assert_eq!(pool_target(0, &physical, &seen), Some("GPU-b"));
        assert_eq!(pool_target(0, &[], &[]), None);
    }
}

/// Why a GPU cannot take work now although it may be present, from what its sources say: its
/// Slurm node is drained, draining or down (`slurm.available = false`, with the node's state in
/// `slurm.state`). `None` when nothing says so. The pages show it beside the GPU's state; it
/// changes no figure (an unavailable GPU still costs its hours).
pub fn unavailable(labels: &std::collections::BTreeMap<String, String>) -> Option<String> {
    (labels.get("slurm.available").map(String::as_str) == Some("false")).then(|| {
        match labels.get("slurm.state").filter(|s| !s.is_empty()) {
            Some(state) => format!("unavailable: Slurm node {state}"),
            None => "unavailable: Slurm node not available".to_string(),
        }
    })
}

#[cfg(test)]
mod unavailable_tests {
    use super::unavailable;

    #[test]
    fn a_drained_slurm_node_is_unavailable() {
        let l = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            unavailable(&l(&[
                ("slurm.available", "false"),
                ("slurm.state", "mixed+drain")
            ]))
            .as_deref(),
            Some("unavailable: Slurm node mixed+drain")
        );
        assert_eq!(
            unavailable(&l(&[("slurm.available", "true"), ("slurm.state", "idle")])),
            None
        );
        assert_eq!(unavailable(&l(&[])), None);
    }
}
