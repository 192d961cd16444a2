//! What the dcgm collector's mapping must satisfy, whatever the scrape or Prometheus said;
//! shared by the `dcgm_*` targets.

use chrono::{DateTime, Utc};
use gpuledger_collect::collectors::dcgm::parse::{map, Series};

/// Problems kept per parse (20) plus the "… and N more" line.
const MAX_PROBLEM_LINES: usize = 21;

/// Map `series` and check the result: GPUs before their MIG instances, samples only for GPUs
/// reported, every value finite and within its range (a DCGM sentinel or a negative or NaN
/// reading is unknown, never a value), holds that end after they start.
pub fn map_and_check(series: &[Series], default_ts: DateTime<Utc>) {
    let m = map(series, default_ts);
    assert!(m.problems.len() <= MAX_PROBLEM_LINES);
    for (i, g) in m.gpus.iter().enumerate() {
        assert!(!g.model.is_empty());
        assert!(g.memory_mib.is_none_or(|v| v > 0 && v <= 16 * 1024 * 1024));
        // Every identity is one the push API accepts.
        assert!(
            gpuledger_ledger::ingest::uuid_problem(&g.uuid).is_none(),
            "{}",
            g.uuid
        );
        if let Some(parent) = &g.mig_parent_uuid {
            // A MIG instance of an NVIDIA GPU, or a partition `<gpu>/P<n>` of an AMD one.
            assert!(
                (g.uuid.starts_with("MIG-") && parent.starts_with("GPU-"))
                    || (parent.starts_with("AMD-")
                        && g.uuid.strip_prefix(parent.as_str()).is_some_and(|rest| {
                            rest.strip_prefix("/P")
                                .is_some_and(|n| n.parse::<u32>().is_ok())
                        })),
                "{} under {parent}",
                g.uuid
            );
            assert!(m.gpus[..i]
                .iter()
                .any(|p| &p.uuid == parent && p.mig_parent_uuid.is_none()));
        } else {
            assert!(
                g.uuid.starts_with("GPU-") || g.uuid.starts_with("AMD-") || g.uuid.starts_with("HL-"),
                "{}",
                g.uuid
            );
        }
    }
    let within =
        |v: Option<f64>, hi: f64| v.is_none_or(|x| x.is_finite() && (0.0..=hi).contains(&x));
    for s in &m.samples {
        let gpu = m.gpus.iter().find(|g| g.uuid == s.gpu_uuid);
        let Some(gpu) = gpu else {
            panic!("a sample for {} which is not reported", s.gpu_uuid);
        };
        assert!(within(s.util_pct, 100.0), "util_pct {:?}", s.util_pct);
        assert!(within(s.sm_active, 1.0), "sm_active {:?}", s.sm_active);
        assert!(within(s.mem_used_mib, 16.0 * 1024.0 * 1024.0));
        assert!(within(s.power_w, 10_000.0), "power_w {:?}", s.power_w);
        // Board power belongs to the whole GPU, never to a MIG instance.
        assert!(gpu.mig_parent_uuid.is_none() || s.power_w.is_none());
        assert!(
            s.util_pct.is_some()
                || s.sm_active.is_some()
                || s.mem_used_mib.is_some()
                || s.power_w.is_some()
        );
    }
    for h in &m.holds {
        assert!(m.gpus.iter().any(|g| g.uuid == h.gpu_uuid));
        assert!(h.first <= h.last && h.last <= h.gpu_newest);
        assert!(!h.workload.is_empty() && h.workload.len() <= 256);
    }
    for a in m.allocations() {
        assert!(a.end.is_none_or(|e| e >= a.start));
    }
    for u in &m.unknown {
        assert!(m.gpus.iter().any(|g| g.uuid == u.gpu_uuid));
    }
}
