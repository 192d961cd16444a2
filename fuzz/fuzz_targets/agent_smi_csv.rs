//! Fuzz the agent's `nvidia-smi --query-gpu` and `--query-compute-apps` CSV readers: any bytes
//! must come back as readings or a parse error, never a panic; a `[N/A]`-style field must become
//! unknown, never 0, and every metric must stay within its range.
//!
//! The input is the CSV, optionally preceded by `nvidia-smi -L` output and a NUL byte: with MIG
//! enabled, the agent adds the instances `-L` lists to the GPUs the CSV gave.
//!
//! Run: `cargo +nightly fuzz run agent_smi_csv` (from the repository root).
#![no_main]

mod agent_checks;

use agent_checks::{check_gpu, check_text};
use gpuledger_agent::source::{add_listed_migs, is_sentinel, known, number, smi_csv, smi_list};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // nvidia-smi's output is read as lossy UTF-8 (`Smi::run`).
    let (list, csv) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    let list = smi_list::parse(&String::from_utf8_lossy(list));
    let csv = String::from_utf8_lossy(csv);

    // The field readers on every cell: a bracketed field is nvidia-smi's error text, so unknown.
    for field in csv.lines().flat_map(|l| l.split(',')) {
        let t = field.trim();
        if t.len() >= 2 && t.starts_with('[') && t.ends_with(']') {
            assert_eq!(known(field), None, "{field:?}");
            assert_eq!(number(field), None, "{field:?}");
        }
        if let Some(v) = number(field) {
            assert!(v.is_finite() && !is_sentinel(v), "{field:?} read as {v}");
        }
    }

    if let Ok(mut gpus) = smi_csv::parse_gpus(&csv) {
        for g in &gpus {
            check_gpu(g);
            assert!(g.mig_parent_uuid.is_none());
        }
        let physical = gpus.len();
        add_listed_migs(&mut gpus, &list);
        assert!(gpus.len() >= physical);
        for (i, g) in gpus.iter().enumerate() {
            check_gpu(g);
            if let Some(parent) = &g.mig_parent_uuid {
                assert!(gpus[..i]
                    .iter()
                    .any(|p| &p.uuid == parent && p.mig_parent_uuid.is_none()));
            }
        }
    }
    if let Ok(apps) = smi_csv::parse_apps(&csv) {
        for p in &apps {
            assert!(known(&p.gpu_uuid).is_some());
            check_text(&p.name);
        }
    }
});
