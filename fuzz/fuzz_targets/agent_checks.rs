//! What every agent reading must satisfy, whatever the source printed; shared by the
//! `agent_*` targets.
#![allow(dead_code)]

use gpuledger_agent::source::{known, GpuReading};

/// Metrics within their ranges, and no "no value" marker (`[N/A]`, `Not Supported`, ...) kept
/// as if it were a value.
pub fn check_gpu(g: &GpuReading) {
    assert!(!g.uuid.trim().is_empty());
    let within =
        |v: Option<f64>, hi: f64| v.is_none_or(|x| x.is_finite() && (0.0..=hi).contains(&x));
    assert!(within(g.util_pct, 100.0), "util_pct {:?}", g.util_pct);
    assert!(within(g.sm_active, 1.0), "sm_active {:?}", g.sm_active);
    assert!(within(g.mem_used_mib, 16.0 * 1024.0 * 1024.0));
    assert!(within(g.power_w, 10_000.0), "power_w {:?}", g.power_w);
    assert!(g.memory_mib.is_none_or(|m| m > 0 && m <= 16 * 1024 * 1024));
    for t in [
        &g.model,
        &g.serial,
        &g.pci_bus_id,
        &g.driver_version,
        &g.cuda_version,
    ] {
        check_text(t);
    }
}

/// A text field is either unknown or a value, never an unknown marker kept as text.
pub fn check_text(t: &Option<String>) {
    if let Some(t) = t {
        assert_eq!(known(t), Some(t.as_str()), "an unknown marker kept as text");
    }
}
