//! Fuzz the readers of cloud APIs' answers and of inventory sheets: EC2's `DescribeInstances`
//! and `DescribeInstanceTypes` XML and STS credentials (`aws::xml`), Compute Engine's
//! `instances.aggregatedList` JSON and each instance in it (`gcp::parse`), Resource Manager's
//! VM list pages and each VM (`azure::parse`), and a CSV or XLSX sheet read as an inventory
//! (`spreadsheet::parse`). Any bytes must come back as records or an error naming what is
//! wrong, never a panic; what the cloud readers keep becomes observations that respect the
//! counts they read.
//!
//! Run: `cargo +nightly fuzz run cloud_answers` (from the repository root).
#![no_main]

use chrono::{TimeZone, Utc};
use gpuledger_collect::collectors::aws::xml;
use gpuledger_collect::collectors::cloud::{self, CloudInstance};
use gpuledger_collect::collectors::spreadsheet::parse::{read_inventory, read_table, ReadOptions};
use gpuledger_collect::collectors::spreadsheet::Mapping;
use gpuledger_collect::collectors::{azure, gcp};
use gpuledger_model::Observation;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let now = Utc.with_ymd_and_hms(2026, 12, 3, 12, 0, 0).unwrap();
    let text = String::from_utf8_lossy(data);
    if let Ok(page) = xml::instances(&text) {
        for i in &page.instances {
            assert!(!i.instance_id.is_empty() && !i.instance_type.is_empty());
        }
    }
    if let Ok(page) = xml::instance_types(&text) {
        for g in page.types.values().flatten() {
            assert!(g.count >= 1);
            assert!(g.fraction.is_none_or(|f| f > 0.0 && f < 1.0));
        }
    }
    let _ = xml::sts_credentials(&text);
    if let Some(code) = xml::error_code(&text) {
        assert!(code.len() <= 64 && !code.contains(' '));
    }

    let mut instances: Vec<CloudInstance> = Vec::new();
    if let Ok(agg) = gcp::parse::aggregated(data, "instances") {
        for (path, item) in &agg.items {
            if let Ok(i) = gcp::parse::instance("proj", path, item) {
                instances.push(i);
            }
        }
    }
    if let Ok(page) = azure::parse::page(data) {
        for (path, item) in &page.items {
            let _ = azure::parse::vm(path, item);
        }
    }
    let obs = cloud::observations("fuzz", &instances, now);
    for o in &obs {
        if let Observation::HostGpuCount { gpus, .. } = o {
            assert!(gpus.count >= 1);
            assert!(!gpus.host.is_empty());
        }
    }

    let mapping = Mapping::default();
    for delimiter in [b',', b';'] {
        if let Ok(table) = read_table(data, None, delimiter) {
            let opts = ReadOptions {
                file: "fuzz.csv",
                mapping: &mapping,
                observed_at: now,
            };
            if let Ok(inv) = read_inventory(&table, &opts) {
                for g in &inv.gpus {
                    assert!(g.gpu.uuid.starts_with("GPU-"));
                }
                for h in &inv.hosts {
                    assert!(h.host.count >= 1);
                }
                let _ = inv.observations("fuzz");
                let _ = inv.listing("fuzz");
            }
        }
    }
});
