//! Tests of the `slurm` collector: one binary, real data, a real cluster.
//!
//! Map (add new tests to the matching section; name regressions after the bug they pin):
//! - `corpus_*`: every file in `<corpus>/slurm/` parsed and checked against values read off the
//!   files by hand (awk over the columns); a new corpus file fails until it has expectations.
//! - `mutated_*`: corrupted corpus bytes; the readers report problems naming the line and the
//!   field, keep the valid rest, and never panic.
//! - `real_cluster_*`: a real one-node Slurm with accounting (started by
//!   `scripts/slurm-test-cluster.sh`): jobs submitted with `--gres=gpu:N` run and finish, the
//!   collector finds the node's GPUs and the jobs as allocations, and a new collector resumes
//!   from the state file without duplicates. Runs when `GPULEDGER_TEST_SLURM=1`; with
//!   `GPULEDGER_REQUIRE_SLURM=1` an unreachable cluster fails the test instead of skipping it.
//!
//! The corpus is found at `$GPULEDGER_CORPUS` or `<repo>/../shared/fixtures`; without it the
//! corpus tests say they were skipped (and fail when `GPULEDGER_REQUIRE_CORPUS` is set).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpuledger_collect::collectors::slurm::parse::{self, Nodes, Sacct};
use gpuledger_collect::collectors::slurm::{job_allocations, SlurmCollector, SlurmConfig};
use gpuledger_collect::{build, Collector};
use gpuledger_model::{AllocationKind, Observation, PushAllocation};

// ---------------------------------------------------------------------------------------------
// Helpers

fn corpus_slurm() -> Option<PathBuf> {
    let root = std::env::var_os("GPULEDGER_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"));
    let dir = root.join("slurm");
    if dir.is_dir() {
        Some(dir)
    } else if std::env::var_os("GPULEDGER_REQUIRE_CORPUS").is_some() {
        panic!(
            "GPULEDGER_REQUIRE_CORPUS is set but there is no slurm corpus at {}; set GPULEDGER_CORPUS to the fixtures folder",
            dir.display()
        );
    } else {
        eprintln!(
            "skipped: no slurm corpus at {} (set GPULEDGER_CORPUS to the fixtures folder)",
            dir.display()
        );
        None
    }
}

fn corpus_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// The corpus's `sacct` columns (its SOURCES.md entry: the origin's `generate_data.sh`).
const HABROK_SACCT_FIELDS: &[&str] = &[
    "JobID",
    "JobName",
    "User",
    "Partition",
    "NodeList",
    "NNodes",
    "NCPUs",
    "NTasks",
    "State",
    "Submit",
    "Start",
    "End",
    "Timelimit",
    "Elapsed",
    "TotalCPU",
    "CPUTime",
    "UserCPU",
    "SystemCPU",
    "ReqMem",
    "MaxRSS",
    "MaxVMSize",
    "ReqTRES",
    "AllocTRES",
    "TRESUsageInMax",
    "TRESUsageInTot",
    "TRESUsageOutTot",
    "MaxDiskRead",
    "MaxDiskWrite",
    "MaxRSSNode",
    "MaxRSSTask",
    "MaxVMSizeNode",
    "MaxVMSizeTask",
    "MaxDiskReadNode",
    "MaxDiskReadTask",
    "MaxDiskWriteNode",
    "MaxDiskWriteTask",
    "Comment",
];

/// What a corpus file reads as, for the summary and the expectations.
#[derive(Debug, Default, PartialEq)]
struct Summary {
    nodes: usize,
    gpu_nodes: usize,
    /// GPUs per GRES type over all nodes, or over all GPU jobs for `sacct`.
    gpus_by_type: BTreeMap<String, u32>,
    unavailable_nodes: usize,
    gpus_used: u32,
    jobs_with_gpus: usize,
    jobs_with_gpu_util: usize,
    problems: usize,
}

fn summarize_nodes(n: &Nodes) -> Summary {
    let mut s = Summary {
        nodes: n.nodes.len(),
        gpu_nodes: n.gpu_nodes().count(),
        problems: n.problems.len(),
        ..Summary::default()
    };
    for node in n.gpu_nodes() {
        for (t, c) in node.gpus_by_type() {
            *s.gpus_by_type.entry(t).or_default() += c;
        }
        if node.state.as_ref().and_then(|s| s.available) == Some(false) {
            s.unavailable_nodes += 1;
        }
        s.gpus_used += node.gpus_used.unwrap_or(0);
    }
    s
}

fn summarize_jobs(j: &Sacct) -> Summary {
    let mut s = Summary {
        jobs_with_gpus: j.jobs.len(),
        jobs_with_gpu_util: j.jobs.iter().filter(|j| j.gpu_util_pct.is_some()).count(),
        problems: j.problems.len(),
        ..Summary::default()
    };
    for job in &j.jobs {
        for (t, c) in job.gpus.pools() {
            *s.gpus_by_type
                .entry(t.unwrap_or_else(|| "(untyped)".into()))
                .or_default() += c;
        }
    }
    s
}

fn read(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned()
}

// ---------------------------------------------------------------------------------------------
// corpus_*

/// Every corpus file has expectations; a new file fails here until it gets them.
#[test]
fn corpus_every_file_reads_as_expected() {
    let Some(dir) = corpus_slurm() else { return };
    for path in corpus_files(&dir) {
        let name = file_name(&path);
        let text = read(&path);
        let got = if name.starts_with("sacct-") {
            summarize_jobs(&parse::parse_sacct(&text, HABROK_SACCT_FIELDS, "☃"))
        } else if name.starts_with("scontrol-show-nodes") {
            summarize_nodes(&parse::parse_scontrol_nodes(&text))
        } else if name.starts_with("sinfo-") {
            summarize_nodes(&parse::parse_sinfo(&text))
        } else {
            panic!("{name}: no reader for this corpus file; add one and its expectations")
        };
        println!("{name}: {got:?}");
        let want = match name.as_str() {
            // awk -F'☃' '$1 !~ /\./ && $23 ~ /gres\/gpu/': 9 jobs; 4 × v100=1, a100 1+2+1+4+2;
            // the two RUNNING ones have no step usage yet.
            "sacct-habrok-gpu-jobs-parsable-snowman-delimited.txt" => Summary {
                gpus_by_type: BTreeMap::from([("a100".into(), 10), ("v100".into(), 4)]),
                jobs_with_gpus: 9,
                jobs_with_gpu_util: 7,
                ..Summary::default()
            },
            // 183 lines (the last without a newline); 6 × gres/gpu:a100=4, 34 ×
            // gres/gpu:v100=1; no State in this file.
            "scontrol-show-nodes-cfgtres-habrok.txt" => Summary {
                nodes: 183,
                gpu_nodes: 40,
                gpus_by_type: BTreeMap::from([("a100".into(), 24), ("v100".into(), 34)]),
                ..Summary::default()
            },
            // 298 nodes, 296 with gpu:a100 (248 × 2, 24 × 3, 24 × 4); gresused adds to 627;
            // a0023 and a0133 draining@, a0235 drained*.
            "sinfo-ahNO-nodehost-gres-gresused-statelong-osc-ascend-dedup.txt" => Summary {
                nodes: 298,
                gpu_nodes: 296,
                gpus_by_type: BTreeMap::from([("a100".into(), 664)]),
                unavailable_nodes: 3,
                gpus_used: 627,
                ..Summary::default()
            },
            _ => panic!("{name}: no expectations yet; read them off the file and add them"),
        };
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn corpus_sacct_jobs_carry_users_times_and_measured_use() {
    let Some(dir) = corpus_slurm() else { return };
    let text = read(&dir.join("sacct-habrok-gpu-jobs-parsable-snowman-delimited.txt"));
    let s = parse::parse_sacct(&text, HABROK_SACCT_FIELDS, "☃");
    let job = |id: &str| s.jobs.iter().find(|j| j.id == id).unwrap();
    let j = job("7965768");
    assert_eq!(j.user.as_deref(), Some("user427"));
    assert_eq!(j.partition.as_deref(), Some("gpulong"));
    assert_eq!(
        j.state, "CANCELLED",
        "`CANCELLED by 10314909` is a CANCELLED job"
    );
    assert_eq!(j.start.unwrap().to_rfc3339(), "2024-04-04T21:45:17+00:00");
    assert_eq!(j.end.unwrap().to_rfc3339(), "2024-04-05T13:13:39+00:00");
    assert_eq!(
        j.gpu_util_pct,
        Some(90.0),
        "the batch step's, not the extern step's 0"
    );
    assert_eq!(j.gpu_mem_mib, Some(20_500_736.0 / 1024.0));
    assert_eq!(job("8150389").gpu_mem_mib, Some(37956.0));
    let running = job("8298012");
    assert_eq!(
        (running.end, running.gpu_util_pct),
        (None, None),
        "unknown, not 0"
    );
    let multi = job("7971484");
    assert_eq!(multi.nodes, ["a100gpu2", "a100gpu4"]);
    assert_eq!(multi.gpus.total, 4);
    assert_eq!(multi.gpu_util_pct, Some(0.0), "measured 0 is kept as 0");
}

/// The same cluster's node list and jobs: each job's GPUs land on its node's placeholders, two
/// per node for the job spread over two nodes.
#[test]
fn corpus_habrok_jobs_become_allocations_on_their_nodes() {
    let Some(dir) = corpus_slurm() else { return };
    let nodes =
        parse::parse_scontrol_nodes(&read(&dir.join("scontrol-show-nodes-cfgtres-habrok.txt")));
    let s = parse::parse_sacct(
        &read(&dir.join("sacct-habrok-gpu-jobs-parsable-snowman-delimited.txt")),
        HABROK_SACCT_FIELDS,
        "☃",
    );
    let (allocations, problems) = job_allocations(&s, &nodes, &[]);
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(allocations.len(), 14, "one per GPU held");
    assert!(allocations
        .iter()
        .all(|a| a.kind == AllocationKind::SlurmJob));
    let of = |id: &str| -> Vec<String> {
        allocations
            .iter()
            .filter(|a| a.workload == id)
            .map(|a| a.gpu_uuid.clone())
            .collect()
    };
    assert_eq!(
        of("7971484"),
        [
            "placeholder:a100gpu2:0",
            "placeholder:a100gpu2:1",
            "placeholder:a100gpu4:0",
            "placeholder:a100gpu4:1"
        ]
    );
    let a = allocations
        .iter()
        .find(|a| a.workload == "8150389")
        .unwrap();
    assert_eq!(a.user.as_deref(), Some("user498"));
    assert_eq!(a.context.slurm_partition.as_deref(), Some("gpulong"));
    // What accounting measured travels as each allocation's averages, for the server to fill
    // the hours no sample measured; a job it did not measure carries none (unknown, not 0).
    assert_eq!(a.avg_mem_used_mib, Some(37956.0));
    let canceled = allocations
        .iter()
        .find(|a| a.workload == "7965768")
        .unwrap();
    assert_eq!(canceled.avg_util_pct, Some(90.0));
    let running = allocations
        .iter()
        .find(|a| a.workload == "8298012")
        .unwrap();
    assert_eq!(
        (running.avg_util_pct, running.avg_mem_used_mib),
        (None, None)
    );
    assert!(
        of("7971484").len() == 4
            && allocations
                .iter()
                .filter(|a| a.workload == "7971484")
                .all(|a| a.avg_util_pct == Some(0.0))
    );
    assert_eq!(
        a.context.slurm_account, None,
        "the corpus asked sacct for no Account"
    );
    // Jobs on one node at the same time hold different GPUs.
    let on_a100gpu2: Vec<&PushAllocation> = allocations
        .iter()
        .filter(|a| a.gpu_uuid.starts_with("placeholder:a100gpu2:"))
        .collect();
    for (i, x) in on_a100gpu2.iter().enumerate() {
        for y in &on_a100gpu2[i + 1..] {
            let overlap = x.start < y.end.unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
                && y.start < x.end.unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC);
            assert!(
                !(overlap && x.gpu_uuid == y.gpu_uuid && x.workload != y.workload),
                "{x:?} {y:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// mutated_*

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, bytes: &[u8]) -> Vec<u8> {
    const JUNK: &[u8] = b"[]()=,:|-+*@~ \n\t9xN/AIDX\xff\x00";
    let mut b = bytes.to_vec();
    for _ in 0..1 + rng.below(6) {
        if b.is_empty() {
            break;
        }
        let i = rng.below(b.len());
        match rng.below(6) {
            0 => b[i] = JUNK[rng.below(JUNK.len())],
            1 => b.truncate(i),
            2 => {
                b.remove(i);
            }
            3 => b.insert(i, JUNK[rng.below(JUNK.len())]),
            4 => {
                let j = (i + rng.below(64)).min(b.len());
                let chunk = b[i..j].to_vec();
                b.splice(i..i, chunk);
            }
            _ => b[i] = (rng.next() & 0xff) as u8,
        }
    }
    b
}

/// Damaged output never panics; whatever goes wrong is named by line and field, and the lines
/// left whole are still read.
#[test]
fn mutated_outputs_never_panic_and_name_their_problems() {
    let Some(dir) = corpus_slurm() else { return };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut runs, mut with_problems) = (0, 0);
    for path in corpus_files(&dir) {
        let name = file_name(&path);
        let bytes = std::fs::read(&path).unwrap();
        let lines = bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count();
        for _ in 0..300 {
            let damaged = String::from_utf8_lossy(&mutate(&mut rng, &bytes)).into_owned();
            let (problems, kept): (Vec<parse::Problem>, usize) = if name.starts_with("sacct-") {
                let s = parse::parse_sacct(&damaged, HABROK_SACCT_FIELDS, "☃");
                let nodes = parse::parse_scontrol_nodes("NodeName=a100gpu2 CfgTRES=gres/gpu=4");
                let _ = job_allocations(&s, &nodes, &[]);
                (s.problems, s.rows)
            } else if name.starts_with("sinfo-") {
                let n = parse::parse_sinfo(&damaged);
                (n.problems, n.nodes.len())
            } else {
                let n = parse::parse_scontrol_nodes(&damaged);
                (n.problems, n.nodes.len())
            };
            runs += 1;
            if !problems.is_empty() {
                with_problems += 1;
            }
            for p in &problems {
                assert!(p.line <= lines + 64, "{name}: {p}");
                assert!(
                    !p.field.is_empty() && !p.message.is_empty(),
                    "{name}: {p:?}"
                );
            }
            assert!(
                kept <= lines + 64,
                "{name}: {kept} records from {lines} lines"
            );
        }
    }
    assert!(
        with_problems > 0 && with_problems < runs,
        "{with_problems}/{runs}"
    );
}

/// One bad field costs one job, named by its line and field; the other jobs stay.
#[test]
fn mutated_sacct_field_names_line_and_field_and_keeps_the_rest() {
    let Some(dir) = corpus_slurm() else { return };
    let text = read(&dir.join("sacct-habrok-gpu-jobs-parsable-snowman-delimited.txt"));
    let line = text
        .lines()
        .position(|l| l.starts_with("8150389☃"))
        .unwrap()
        + 1;
    let bad = text.replacen(
        "billing=16,cpu=16,gres/gpu:a100=2,gres/gpu=2,mem=32G,node=1",
        "billing=16,cpu=16,gres/gpu:a100=two,gres/gpu=2,mem=32G,node=1",
        1,
    );
    let s = parse::parse_sacct(&bad, HABROK_SACCT_FIELDS, "☃");
    assert_eq!(s.jobs.len(), 8);
    assert_eq!(s.problems.len(), 1, "{:?}", s.problems);
    let p = &s.problems[0];
    assert_eq!((p.line, p.field.as_str()), (line, "AllocTRES"));
    assert!(
        p.to_string().contains("job 8150389") && p.to_string().contains("`two`"),
        "{p}"
    );
    let short = text.replacen("☃gpulong☃a100gpu3☃", "☃gpulong☃", 1);
    let s = parse::parse_sacct(&short, HABROK_SACCT_FIELDS, "☃");
    assert_eq!(s.problems[0].field, "line");
    assert!(
        s.problems[0].message.starts_with("37 fields, expected 38"),
        "{}",
        s.problems[0]
    );
}

// ---------------------------------------------------------------------------------------------
// real_cluster_*

const TEST_CLUSTER: &str = "gpuledger-test";
const TEST_NODE: &str = "gpuledger-node1";

fn slurm_wanted() -> bool {
    if std::env::var_os("GPULEDGER_TEST_SLURM").is_none()
        && std::env::var_os("GPULEDGER_REQUIRE_SLURM").is_none()
    {
        eprintln!("skipped: set GPULEDGER_TEST_SLURM=1 after scripts/slurm-test-cluster.sh to run against a real Slurm");
        return false;
    }
    let up = Command::new("scontrol")
        .arg("ping")
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("UP"));
    match up {
        Ok(true) => true,
        other => {
            let why = format!("Slurm is not reachable (`scontrol ping`: {other:?}); run scripts/slurm-test-cluster.sh");
            if std::env::var_os("GPULEDGER_REQUIRE_SLURM").is_some() {
                panic!("GPULEDGER_REQUIRE_SLURM is set: {why}");
            }
            eprintln!("skipped: {why}");
            false
        }
    }
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Submit a job as `user` and give its ID.
fn submit(user: &str, gres: &str, secs: u32) -> String {
    let wrap = format!("sleep {secs}");
    let gres = format!("--gres={gres}");
    run(
        "runuser",
        &[
            "-u",
            user,
            "--",
            "sbatch",
            "--parsable",
            "--output=/dev/null",
            "--chdir=/tmp",
            "--job-name=gl-test",
            &gres,
            "--wrap",
            &wrap,
        ],
    )
    .trim()
    .split(';')
    .next()
    .unwrap()
    .to_string()
}

/// (state, start, end) of a job as accounting has it, asked the way the collector asks: over a
/// window ending now. (`sacct -j ID` can show a job's end a moment before a window query
/// does — the lag the collector's `overlap_secs` covers — and the tests wait for what the
/// collector will see.)
fn accounted(id: &str) -> Option<(String, i64, Option<i64>)> {
    let out = Command::new("sacct")
        .args([
            "-a",
            "-X",
            "-n",
            "-P",
            "--starttime=now-2hours",
            "--endtime=now",
            "--format=JobID,State,Start,End",
        ])
        .env("LC_ALL", "C")
        .env("SLURM_TIME_FORMAT", "%s")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.split('|').next() == Some(id))?;
    let mut f = line.split('|').skip(1);
    let state = f.next()?.split_whitespace().next()?.to_string();
    let start = f.next()?.parse().ok()?;
    let end = f.next()?.parse().ok();
    Some((state, start, end))
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn allocations_of<'a>(obs: &'a [Observation], job: &str) -> Vec<&'a PushAllocation> {
    obs.iter()
        .filter_map(|o| match o {
            Observation::Allocation { allocation, .. } if allocation.workload == job => {
                Some(allocation)
            }
            _ => None,
        })
        .collect()
}

fn print_run(title: &str, obs: &[Observation], jobs: &BTreeSet<String>) {
    println!("--- {title}: {} observation(s)", obs.len());
    for o in obs {
        match o {
            Observation::HostGpuCount { gpus, provenance } => println!(
                "host {} cluster {:?}: {} GPU(s), model {:?}, labels {:?} [{}]",
                gpus.host,
                gpus.cluster,
                gpus.count,
                gpus.model,
                gpus.labels,
                provenance.raw_key.as_deref().unwrap_or("")
            ),
            Observation::Allocation {
                allocation: a,
                provenance,
            } if jobs.contains(&a.workload) => {
                println!(
                "allocation job {} on {}: user {:?}, account {:?}, partition {:?}, {} .. {} [{}]",
                a.workload,
                a.gpu_uuid,
                a.user,
                a.context.slurm_account,
                a.context.slurm_partition,
                a.start.to_rfc3339(),
                a.end.map(|e| e.to_rfc3339()).unwrap_or_else(|| "open".into()),
                provenance.raw_key.as_deref().unwrap_or("")
            )
            }
            Observation::Allocation { .. } => {}
            other => println!("{other:?}"),
        }
    }
}

/// Jobs submitted with `--gres=gpu:N` run and finish; the collector reports the node's GPUs and
/// each job's GPUs as allocations with its user, account, partition and times, exact GPU
/// indexes for a running job, and a new collector on the same state file reports a finished
/// job once and never again.
#[test]
fn real_cluster_jobs_become_allocations_and_the_cursor_survives_a_restart() {
    if !slurm_wanted() {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = std::env::temp_dir().join(format!("gpuledger-slurm-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("cursor.json");
    let config = format!(
        "type = \"slurm\"\nname = \"slurm-test\"\ncluster = \"{TEST_CLUSTER}\"\nstate_file = \"{}\"\nlookback_hours = 1\noverlap_secs = 300\ntimeout_secs = 30\n",
        state.display()
    );
    let first = build("slurm", "slurm-test", &config).unwrap();

    let a = submit("gl-alice", "gpu:2", 2);
    let b = submit("gl-bob", "gpu:h100:1", 2);
    let r = submit("gl-alice", "gpu:1", 12);
    let ours: BTreeSet<String> = [a.clone(), b.clone(), r.clone()].into();
    wait_for(
        "jobs A and B to finish in accounting and R to run",
        Duration::from_secs(90),
        || {
            let done =
                |id: &str| matches!(accounted(id), Some((s, _, Some(_))) if s == "COMPLETED");
            done(&a) && done(&b) && matches!(accounted(&r), Some((s, _, None)) if s == "RUNNING")
        },
    );
    // The exact GPUs R holds, as scontrol shows them.
    let detail = run("scontrol", &["--oneliner", "--details", "show", "job", &r]);
    let idx = detail
        .split("(IDX:")
        .nth(1)
        .and_then(|i| i.split(')').next())
        .unwrap_or_else(|| panic!("no GPU index in {detail}"))
        .to_string();

    let report = rt.block_on(first.collect_report()).unwrap();
    print_run("first run", &report.observations, &ours);
    for p in &report.problems {
        println!("problem: {p}");
    }
    let node = report
        .observations
        .iter()
        .find_map(|o| match o {
            Observation::HostGpuCount { gpus, .. } if gpus.host == TEST_NODE => Some(gpus.clone()),
            _ => None,
        })
        .expect("the node's GPUs");
    assert_eq!(
        (node.count, node.model.as_deref(), node.cluster.as_deref()),
        (4, Some("h100"), Some(TEST_CLUSTER))
    );
    assert_eq!(
        node.labels.get("slurm.partitions").map(String::as_str),
        Some("gpu")
    );
    assert_eq!(
        node.labels.get("slurm.available").map(String::as_str),
        Some("true")
    );
    assert!(node.labels.contains_key("slurm.state"), "{:?}", node.labels);

    for (job, user, account, gpus) in [
        (&a, "gl-alice", "gl-speech", 2),
        (&b, "gl-bob", "gl-vision", 1),
    ] {
        let got = allocations_of(&report.observations, job);
        assert_eq!(got.len(), gpus, "job {job}: {got:#?}");
        let (_, start, end) = accounted(job).unwrap();
        for x in &got {
            assert_eq!(x.kind, AllocationKind::SlurmJob);
            assert_eq!(x.user.as_deref(), Some(user));
            assert_eq!(x.context.slurm_account.as_deref(), Some(account));
            assert_eq!(x.context.slurm_partition.as_deref(), Some("gpu"));
            assert_eq!(x.context.slurm_state.as_deref(), Some("COMPLETED"), "{x:?}");
            assert!(x.context.slurm_qos.is_some(), "{x:?}");
            assert!(x.context.slurm_job_name.is_some(), "{x:?}");
            assert_eq!(x.start.timestamp(), start);
            assert_eq!(x.end.map(|e| e.timestamp()), end);
            assert!(
                x.gpu_uuid.starts_with(&format!("placeholder:{TEST_NODE}:")),
                "{x:?}"
            );
        }
    }
    let ra = allocations_of(&report.observations, &r);
    assert_eq!(ra.len(), 1);
    assert_eq!(ra[0].end, None, "R is still running");
    assert_eq!(
        ra[0].gpu_uuid,
        format!("placeholder:{TEST_NODE}:{idx}"),
        "R sits on the GPU scontrol names"
    );
    // Jobs that ran at the same time hold different GPUs (A, B and R usually all overlap; other
    // tests' jobs on the node may delay one of them).
    let all: Vec<&PushAllocation> = report
        .observations
        .iter()
        .filter_map(|o| match o {
            Observation::Allocation { allocation, .. } => Some(allocation),
            _ => None,
        })
        .collect();
    let far = chrono::DateTime::<chrono::Utc>::MAX_UTC;
    let mut overlapping = 0;
    for x in all.iter().filter(|x| ours.contains(&x.workload)) {
        for y in all.iter().filter(|y| y.workload != x.workload) {
            if x.start < y.end.unwrap_or(far) && y.start < x.end.unwrap_or(far) {
                overlapping += 1;
                assert_ne!(x.gpu_uuid, y.gpu_uuid, "{x:?} and {y:?} overlap on one GPU");
            }
        }
    }
    assert!(overlapping > 0, "A, B and R ran together");

    // The same collector again: A and B are not reported twice; R, still open, is.
    let again = rt.block_on(first.collect()).unwrap();
    assert!(allocations_of(&again, &a).is_empty() && allocations_of(&again, &b).is_empty());
    drop(first);

    wait_for(
        "job R to finish in accounting",
        Duration::from_secs(60),
        || matches!(accounted(&r), Some((s, _, Some(_))) if s == "COMPLETED"),
    );
    // A new collector (a restart) on the same state file.
    let cursor_before: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    let second =
        SlurmCollector::new("slurm-test", SlurmConfig::from_toml(&config).unwrap()).unwrap();
    assert_eq!(second.state_file(), state.as_path());
    let after = rt.block_on(second.collect_report()).unwrap();
    print_run("after a restart", &after.observations, &ours);
    assert!(
        allocations_of(&after.observations, &a).is_empty(),
        "A was reported before the restart"
    );
    assert!(
        allocations_of(&after.observations, &b).is_empty(),
        "B was reported before the restart"
    );
    let rr = allocations_of(&after.observations, &r);
    assert_eq!(rr.len(), 1, "{rr:#?}");
    let (_, r_start, r_end) = accounted(&r).unwrap();
    assert_eq!(
        (rr[0].start.timestamp(), rr[0].end.map(|e| e.timestamp())),
        (r_start, r_end)
    );
    assert_eq!(
        rr[0].gpu_uuid, ra[0].gpu_uuid,
        "R's end lands on the GPU its start was on"
    );
    let cursor_after: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    println!(
        "cursor before the restart {} → after {}",
        cursor_before["cursor"], cursor_after["cursor"]
    );
    assert!(cursor_after["cursor"].as_i64() >= cursor_before["cursor"].as_i64());
    let last = rt.block_on(second.collect()).unwrap();
    for job in &ours {
        assert!(
            allocations_of(&last, job).is_empty(),
            "job {job} reported twice"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// slurmrestd (API v0.0.38, JWT) gives the same node and the same finished jobs as the
/// commands: users, accounts, partitions, times and GPU counts agree job by job.
#[test]
fn real_cluster_slurmrestd_agrees_with_the_commands() {
    if !slurm_wanted() {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = std::env::temp_dir().join(format!("gpuledger-slurm-restd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let token = run("scontrol", &["token", "username=gl-reader", "lifespan=900"]);
    let token_file = dir.join("jwt");
    std::fs::write(&token_file, token.trim()).unwrap();
    let job = submit("gl-bob", "gpu:h100:2", 1);
    wait_for(
        "the job to finish in accounting",
        Duration::from_secs(60),
        || matches!(accounted(&job), Some((s, _, Some(_))) if s == "COMPLETED"),
    );
    let common = "cluster = \"gpuledger-test\"\nlookback_hours = 1\ntimeout_secs = 30\n";
    let restd = build(
        "slurm",
        "slurm-restd",
        &format!(
            "{common}restd_url = \"http://127.0.0.1:6820\"\nrestd_user = \"gl-reader\"\nrestd_token_file = \"{}\"\nstate_file = \"{}\"\n",
            token_file.display(),
            dir.join("restd.json").display()
        ),
    )
    .unwrap();
    let commands = build(
        "slurm",
        "slurm-commands",
        &format!(
            "{common}state_file = \"{}\"\n",
            dir.join("commands.json").display()
        ),
    )
    .unwrap();
    let by_rest = rt.block_on(restd.collect_report()).unwrap();
    let by_cmd = rt.block_on(commands.collect_report()).unwrap();
    for p in &by_rest.problems {
        println!("slurmrestd problem: {p}");
    }
    print_run("slurmrestd", &by_rest.observations, &[job.clone()].into());
    let node = |obs: &[Observation]| {
        obs.iter()
            .find_map(|o| match o {
                Observation::HostGpuCount { gpus, .. } if gpus.host == TEST_NODE => {
                    Some(gpus.clone())
                }
                _ => None,
            })
            .expect("the node's GPUs")
    };
    let (a, b) = (node(&by_rest.observations), node(&by_cmd.observations));
    assert_eq!(
        (a.count, &a.model, &a.cluster),
        (b.count, &b.model, &b.cluster)
    );
    assert_eq!(
        a.labels.get("slurm.partitions"),
        b.labels.get("slurm.partitions")
    );
    assert_eq!(
        a.labels.get("slurm.available"),
        b.labels.get("slurm.available")
    );
    // Finished jobs, as (job, start, end, user, account, partition, GPUs).
    type Row = (
        String,
        i64,
        i64,
        Option<String>,
        Option<String>,
        Option<String>,
        usize,
    );
    let finished = |obs: &[Observation]| -> BTreeSet<Row> {
        // (job, start, end) → (user, account, partition, GPUs)
        type Who = (Option<String>, Option<String>, Option<String>, usize);
        let mut gpus: BTreeMap<(String, i64, i64), Who> = BTreeMap::new();
        for o in obs {
            if let Observation::Allocation { allocation: x, .. } = o {
                if let Some(end) = x.end {
                    let e = gpus
                        .entry((x.workload.clone(), x.start.timestamp(), end.timestamp()))
                        .or_insert((
                            x.user.clone(),
                            x.context.slurm_account.clone(),
                            x.context.slurm_partition.clone(),
                            0,
                        ));
                    e.3 += 1;
                }
            }
        }
        gpus.into_iter()
            .map(|((w, s, e), (u, a, p, n))| (w, s, e, u, a, p, n))
            .collect()
    };
    let (rest_rows, cmd_rows) = (
        finished(&by_rest.observations),
        finished(&by_cmd.observations),
    );
    let ours: Vec<&Row> = rest_rows.iter().filter(|r| r.0 == job).collect();
    assert_eq!(ours.len(), 1, "{rest_rows:#?}");
    let (_, start, end) = accounted(&job).unwrap();
    assert_eq!(
        ours[0],
        &(
            job.clone(),
            start,
            end.unwrap(),
            Some("gl-bob".into()),
            Some("gl-vision".into()),
            Some("gpu".into()),
            2
        )
    );
    // Jobs near the window's edge may be in one answer only; those in both must agree.
    let ids = |rows: &BTreeSet<Row>| rows.iter().map(|r| r.0.clone()).collect::<BTreeSet<_>>();
    let both: BTreeSet<String> = ids(&rest_rows)
        .intersection(&ids(&cmd_rows))
        .cloned()
        .collect();
    assert!(both.contains(&job));
    let pick = |rows: &BTreeSet<Row>| {
        rows.iter()
            .filter(|r| both.contains(&r.0))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(pick(&rest_rows), pick(&cmd_rows));
    // A second run reports the finished job no more.
    let again = rt.block_on(restd.collect()).unwrap();
    assert!(allocations_of(&again, &job).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A private sshd on 127.0.0.1 (the machine's own `sshd`, key login only), stopped on drop.
struct Sshd {
    child: std::process::Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_sshd(dir: &Path) -> Option<Sshd> {
    let sshd = Path::new("/usr/sbin/sshd");
    if !sshd.exists() {
        let why = "no /usr/sbin/sshd (Debian's openssh-server; scripts/slurm-test-cluster.sh installs it)";
        if std::env::var_os("GPULEDGER_REQUIRE_SLURM").is_some() {
            panic!("GPULEDGER_REQUIRE_SLURM is set: {why}");
        }
        eprintln!("skipped: {why}");
        return None;
    }
    std::fs::create_dir_all(dir).unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    for key in ["host", "client"] {
        let path = dir.join(key);
        run(
            "ssh-keygen",
            &[
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-f",
                path.to_str().unwrap(),
            ],
        );
    }
    std::fs::copy(dir.join("client.pub"), dir.join("authorized_keys")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        dir.join("sshd_config"),
        format!(
            "ListenAddress 127.0.0.1:{port}\nHostKey {d}/host\nAuthorizedKeysFile {d}/authorized_keys\n\
             PidFile {d}/sshd.pid\nStrictModes no\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nUsePAM no\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let host_pub = std::fs::read_to_string(dir.join("host.pub")).unwrap();
    let mut pub_key = host_pub.split_whitespace();
    std::fs::write(
        dir.join("known_hosts"),
        format!(
            "[127.0.0.1]:{port} {} {}\n",
            pub_key.next().unwrap(),
            pub_key.next().unwrap()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("empty_known_hosts"), "").unwrap();
    let child = Command::new(sshd)
        .args(["-D", "-e", "-f"])
        .arg(dir.join("sshd_config"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let sshd = Sshd {
        child,
        port,
        dir: dir.to_path_buf(),
    };
    wait_for("sshd to listen", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    Some(sshd)
}

/// (GPU, start, end, user, account) of a job's allocations.
type Seen = (String, i64, Option<i64>, Option<String>, Option<String>);

/// Over SSH (key login, `BatchMode`, a pinned known_hosts file) the collector reads what it
/// reads locally; an unknown host key is refused at once, never asked about.
#[test]
fn real_cluster_over_ssh_agrees_with_local_commands_and_never_prompts() {
    if !slurm_wanted() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("gpuledger-slurm-ssh-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let Some(sshd) = start_sshd(&dir.join("sshd")) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let job = submit("gl-alice", "gpu:1", 1);
    wait_for(
        "the job to finish in accounting",
        Duration::from_secs(60),
        || matches!(accounted(&job), Some((s, _, Some(_))) if s == "COMPLETED"),
    );
    let ssh_config = |known: &str, state: &str| {
        format!(
            "cluster = \"gpuledger-test\"\nlookback_hours = 1\ntimeout_secs = 30\n\
             ssh_host = \"127.0.0.1\"\nssh_port = {}\nssh_user = \"root\"\nssh_key = \"{}\"\n\
             ssh_known_hosts = \"{}\"\nstate_file = \"{}\"\n",
            sshd.port,
            sshd.dir.join("client").display(),
            sshd.dir.join(known).display(),
            dir.join(state).display()
        )
    };
    let over_ssh = build("slurm", "slurm-ssh", &ssh_config("known_hosts", "ssh.json")).unwrap();
    let local = build(
        "slurm",
        "slurm-local",
        &format!(
            "cluster = \"gpuledger-test\"\nlookback_hours = 1\nstate_file = \"{}\"\n",
            dir.join("local.json").display()
        ),
    )
    .unwrap();
    let by_ssh = rt.block_on(over_ssh.collect_report()).unwrap();
    assert!(by_ssh.problems.is_empty(), "{:?}", by_ssh.problems);
    let by_local = rt.block_on(local.collect_report()).unwrap();
    print_run("over ssh", &by_ssh.observations, &[job.clone()].into());
    let mine = |obs: &[Observation]| -> Vec<Seen> {
        allocations_of(obs, &job)
            .iter()
            .map(|a| {
                (
                    a.gpu_uuid.clone(),
                    a.start.timestamp(),
                    a.end.map(|e| e.timestamp()),
                    a.user.clone(),
                    a.context.slurm_account.clone(),
                )
            })
            .collect()
    };
    assert_eq!(mine(&by_ssh.observations).len(), 1);
    assert_eq!(mine(&by_ssh.observations)[0].3.as_deref(), Some("gl-alice"));
    let counts = |obs: &[Observation]| {
        obs.iter()
            .filter_map(|o| match o {
                Observation::HostGpuCount { gpus, .. } => {
                    Some((gpus.host.clone(), gpus.count, gpus.model.clone()))
                }
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(counts(&by_ssh.observations), counts(&by_local.observations));
    let (ssh_job, local_job) = (mine(&by_ssh.observations), mine(&by_local.observations));
    assert_eq!(
        ssh_job
            .iter()
            .map(|x| (x.1, x.2, &x.3, &x.4))
            .collect::<Vec<_>>(),
        local_job
            .iter()
            .map(|x| (x.1, x.2, &x.3, &x.4))
            .collect::<Vec<_>>()
    );
    // A host key the pinned file does not hold: refused, as a configuration problem.
    let stranger = build(
        "slurm",
        "slurm-ssh-2",
        &ssh_config("empty_known_hosts", "ssh2.json"),
    )
    .unwrap();
    let t = Instant::now();
    let err = rt.block_on(stranger.collect_report()).unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "it waited: {:?}",
        t.elapsed()
    );
    assert!(!err.is_retryable(), "{err}");
    assert!(
        err.to_string().contains("Host key verification failed"),
        "{err}"
    );
    drop(sshd);
    let _ = std::fs::remove_dir_all(&dir);
}
