//! Fuzz the slurm collector's readers of `scontrol show node --oneliner`, `sinfo`, `sacct
//! --parsable2`, `scontrol show job -d --oneliner` and slurmrestd's JSON answers, and the
//! placing of jobs' GPUs on their nodes: any bytes must come back as records plus problems
//! naming a line (or JSON path) and a field, never a panic, and whatever is placed must be a
//! plausible allocation (end not before start, on a placeholder of a node it names).
//!
//! Run: `cargo +nightly fuzz run slurm_parse` (from the repository root).
#![no_main]

use std::collections::BTreeMap;

use gpuledger_collect::collectors::slurm::job_allocations;
use gpuledger_collect::collectors::slurm::parse::{
    parse_restd_accounting, parse_restd_nodes, parse_restd_running, parse_sacct,
    parse_scontrol_jobs, parse_scontrol_nodes, parse_sinfo, Nodes, SACCT_FIELDS,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The collector reads command output as lossy UTF-8.
    let text = String::from_utf8_lossy(data);
    let lines = text.lines().count();
    let nodes = parse_scontrol_nodes(&text);
    let sinfo = parse_sinfo(&text);
    for n in [&nodes, &sinfo] {
        assert!(n.nodes.len() <= lines);
        for p in &n.problems {
            assert!(p.line >= 1 && p.line <= lines && !p.field.is_empty());
        }
        for node in n.gpu_nodes() {
            assert!(node.physical_gpus() > 0 || node.gpus.values().all(|c| *c == 0));
        }
    }
    // The collector's own delimiter, and `|` (what a fuzzer reaches more easily).
    for delimiter in ["\u{1f}", "|"] {
        let sacct = parse_sacct(&text, SACCT_FIELDS, delimiter);
        assert!(sacct.rows <= lines && sacct.jobs.len() <= sacct.rows);
        for p in &sacct.problems {
            assert!(p.line >= 1 && p.line <= lines && !p.field.is_empty());
        }
        for job in &sacct.jobs {
            assert!(job.gpus.total > 0);
            if let Some(u) = job.gpu_util_pct {
                assert!(u.is_finite() && u >= 0.0);
            }
        }
        let (jobs, _) = parse_scontrol_jobs(&text);
        let (allocations, _) = job_allocations(&sacct, &nodes, &jobs);
        let mut per_node: BTreeMap<(&str, i64), usize> = BTreeMap::new();
        for a in &allocations {
            assert!(a.end.is_none_or(|e| e >= a.start));
            assert!(a.gpu_uuid.starts_with("placeholder:"));
            let host = a.gpu_uuid["placeholder:".len()..]
                .rsplit_once(':')
                .map_or("", |(h, _)| h);
            *per_node.entry((host, a.start.timestamp())).or_default() += 1;
        }
        for ((host, _), n) in per_node {
            let size: u32 = nodes
                .nodes
                .iter()
                .filter(|x| x.name == host)
                .map(|x| x.physical_gpus() + x.mig_instances().values().sum::<u32>())
                .max()
                .unwrap_or(0);
            // One start second may hold several jobs, each within the node's GPUs.
            assert!(n <= size as usize * sacct.jobs.len().max(1));
        }
    }
    // slurmrestd: the same invariants for JSON answers.
    let nodes = parse_restd_nodes(data).unwrap_or_else(|_| Nodes::default());
    if let Ok(sacct) = parse_restd_accounting(data) {
        let jobs = parse_restd_running(data)
            .map(|(j, _)| j)
            .unwrap_or_default();
        for p in &sacct.problems {
            assert!(p.line == 0 && p.field.starts_with("jobs["));
        }
        let (allocations, _) = job_allocations(&sacct, &nodes, &jobs);
        for a in &allocations {
            assert!(a.end.is_none_or(|e| e >= a.start));
            assert!(a.gpu_uuid.starts_with("placeholder:"));
        }
    }
});
