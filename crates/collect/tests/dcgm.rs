//! Tests of the `dcgm` collector: one binary, real data, real servers.
//!
//! Map (add new tests to the matching section; name regressions after the bug they pin):
//! - `corpus_*`: every file in `<corpus>/dcgm/` parsed, checked against values read off the files
//!   by hand (see [`expectations`]); a new corpus file fails until it has its expectations.
//! - `accel_*`: AMD device-metrics-exporter and Intel Gaudi metric exporter answers: every
//!   `*.prom` file in `<corpus>/amd/` (see [`accel_expectations`]), and the two
//!   documentation-derived files in `tests/data/` (no recorded scrape of a current AMD
//!   exporter with pods, nor of the Gaudi exporter, is public).
//! - `mutated_*`: corrupted corpus bytes and API answers; the parser reports problems or partial
//!   results, never panics, and whatever it emits passes the push contract's validation.
//! - `scrape_*`: the collector in scrape mode against a local HTTP server serving corpus files.
//! - `prometheus_*`: a real Prometheus (Debian's `prometheus`) scrapes that server; the collector
//!   queries it, instant and `query_range` backfill. Skipped without the binary unless
//!   `GPULEDGER_REQUIRE_PROMETHEUS` is set.
//!
//! The corpus is found at `$GPULEDGER_CORPUS` or `<repo>/../shared/fixtures`; without it the
//! corpus tests say they were skipped, unless `GPULEDGER_REQUIRE_CORPUS` is set, when they fail.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use gpuledger_collect::collectors::dcgm::parse::{self, Mapped, UnknownKind};
use gpuledger_collect::collectors::dcgm::DcgmCollector;
use gpuledger_collect::{build, CollectError, Collector};
use gpuledger_model::{Observation, PushAllocation, PushGpu, PushSample, Vendor};

// ---------------------------------------------------------------------------------------------
// Helpers

/// `<corpus>/<kind>/`, or `None` (said) when there is no corpus, or a failure when
/// `GPULEDGER_REQUIRE_CORPUS` is set.
fn corpus_dir(kind: &str) -> Option<PathBuf> {
    let root = std::env::var_os("GPULEDGER_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"));
    let dir = root.join(kind);
    if dir.is_dir() {
        Some(dir)
    } else if std::env::var_os("GPULEDGER_REQUIRE_CORPUS").is_some() {
        panic!(
            "GPULEDGER_REQUIRE_CORPUS is set but there is no {kind} corpus at {}; set GPULEDGER_CORPUS to the fixtures folder",
            dir.display()
        );
    } else {
        eprintln!(
            "skipped: no {kind} corpus at {} (set GPULEDGER_CORPUS to the fixtures folder)",
            dir.display()
        );
        None
    }
}

fn corpus_dcgm() -> Option<PathBuf> {
    corpus_dir("dcgm")
}

fn corpus_amd() -> Option<PathBuf> {
    corpus_dir("amd")
}

/// This crate's `tests/data/`: files written for the tests (documentation-derived).
fn test_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// The AMD corpus's exporter scrapes (the folder also holds rocm-smi output, the agent's).
fn amd_scrapes(dir: &Path) -> Vec<PathBuf> {
    corpus_files(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "prom"))
        .collect()
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

fn at() -> DateTime<Utc> {
    "2026-12-02T12:00:00Z".parse().unwrap()
}

/// Everything emitted must pass the same validation as a push (gpuledger-ledger's rules), at
/// any time: the corpus was recorded on other days than today.
fn assert_valid(gpus: &[PushGpu], samples: &[PushSample], allocations: &[PushAllocation]) {
    let body = serde_json::json!({ "gpus": gpus, "samples": samples, "allocations": allocations });
    let any_time = gpuledger_ledger::TimeBounds {
        latest: DateTime::<Utc>::MAX_UTC,
        earliest_observation: DateTime::<Utc>::MIN_UTC,
        earliest_allocation: DateTime::<Utc>::MIN_UTC,
        ..gpuledger_ledger::TimeBounds::new(at(), &Default::default())
    };
    let v = any_time.validate_body(body.as_object().unwrap().clone());
    assert!(v.rejections.is_empty(), "rejected: {:?}", v.rejections);
}

fn assert_valid_observations(obs: &[Observation]) {
    let (mut g, mut s, mut a) = (Vec::new(), Vec::new(), Vec::new());
    for o in obs {
        match o {
            Observation::Gpu { gpu, .. } => g.push(gpu.clone()),
            Observation::Sample { sample, .. } => s.push(sample.clone()),
            Observation::Allocation { allocation, .. } => a.push(allocation.clone()),
            Observation::HostGpuCount { .. }
            | Observation::HostAlias { .. }
            | Observation::HostStopped { .. }
            | Observation::InventoryList { .. }
            | Observation::BillingExport { .. } => {
                panic!("dcgm reports UUIDs, not counts, aliases or billing exports")
            }
        }
    }
    assert_valid(&g, &s, &a);
}

fn map_file(path: &Path) -> Mapped {
    let text = std::fs::read_to_string(path).unwrap();
    let parsed = parse::parse_text(&text);
    assert!(
        parsed.problems.is_empty(),
        "{}: {:?}",
        file_name(path),
        parsed.problems
    );
    parse::map(&parsed.series, at())
}

// ---------------------------------------------------------------------------------------------
// corpus_*: expected values read off the files (grep UUID, modelName, GPU_I_*, pod, FB_*, ...)

struct Gpu {
    uuid: &'static str,
    model: &'static str,
    host: Option<&'static str>,
    pci_bus_id: Option<&'static str>,
    driver: Option<&'static str>,
    /// FB_USED + FB_FREE (+ FB_RESERVED)
    memory_mib: Option<u64>,
    /// GR_ENGINE_ACTIVE x 100, else GPU_UTIL
    util_pct: Option<f64>,
    power_w: Option<f64>,
}

struct Mig {
    parent: &'static str,
    gi: &'static str,
    profile: &'static str,
    memory_mib: Option<u64>,
    util_pct: Option<f64>,
}

struct Expect {
    gpus: Vec<Gpu>,
    migs: Vec<Mig>,
    /// (GPU UUID, workload)
    pods: Vec<(&'static str, &'static str)>,
    /// (GPU or MIG UUID, field, kind)
    unknown: Vec<(String, &'static str, UnknownKind)>,
}

fn expectations() -> BTreeMap<&'static str, Expect> {
    const A100_MIG: &str = "GPU-473571f2-fb37-ef7e-50fe-9885b74a23cd";
    const DOCS_A100: &str = "GPU-34319582-d595-d1c7-d1d2-179bcfa61660";
    let only_mig = |uuid: &str| {
        ["activity", "mem_used_mib", "power_w", "memory_mib"]
            .into_iter()
            .map(|f| (uuid.to_string(), f, UnknownKind::OnlyMigSeries))
            .collect::<Vec<_>>()
    };
    let mig = |parent, gi, profile, memory_mib, util_pct| Mig {
        parent,
        gi,
        profile,
        memory_mib,
        util_pct,
    };
    BTreeMap::from([
        (
            "aws-kops-nvidia-l4-full-scrape.prom",
            Expect {
                gpus: vec![Gpu {
                    uuid: "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",
                    model: "NVIDIA L4",
                    host: Some("i-030791dc5a37cd257"),
                    pci_bus_id: Some("00000000:31:00.0"),
                    driver: Some("580.105.08"),
                    memory_mib: Some(23033), // 0 + 22563 + 470 reserved
                    util_pct: Some(0.0),
                    power_w: Some(16.365),
                }],
                migs: vec![],
                pods: vec![],
                unknown: vec![],
            },
        ),
        (
            "k8s-a100-sxm4-40gb-mig-4-instances.prom",
            Expect {
                gpus: vec![Gpu {
                    uuid: A100_MIG,
                    model: "NVIDIA A100-SXM4-40GB",
                    host: Some("nvidia-dcgm-exporter-tl46n"), // the exporter's pod: a stand-in
                    pci_bus_id: None,
                    driver: Some("520.56.06"),
                    memory_mib: None,
                    util_pct: None,
                    power_w: None,
                }],
                migs: vec![
                    mig(A100_MIG, "5", "2g.10gb", Some(9856), Some(0.0)),
                    mig(A100_MIG, "7", "1g.5gb", Some(4863), Some(0.0)),
                    mig(A100_MIG, "8", "1g.5gb", Some(4864), Some(40.8493)),
                    mig(A100_MIG, "9", "1g.5gb", Some(4863), Some(0.0)),
                ],
                pods: vec![], // pod labels present but empty
                unknown: only_mig(A100_MIG),
            },
        ),
        (
            "k8s-a100-sxm4-40gb-mig-disabled.prom",
            Expect {
                gpus: vec![Gpu {
                    uuid: "GPU-7099682b-a20d-2bcc-74ab-b9060454d81e",
                    model: "NVIDIA A100-SXM4-40GB",
                    host: Some("nvidia-dcgm-exporter-drqwq"),
                    pci_bus_id: None,
                    driver: Some("520.56.06"),
                    memory_mib: Some(40384),
                    util_pct: Some(0.0),
                    power_w: Some(45.999),
                }],
                migs: vec![],
                pods: vec![],
                unknown: vec![],
            },
        ),
        (
            "k8s-tesla-t4-2gpu-pod-labels.prom",
            Expect {
                gpus: vec![
                    Gpu {
                        uuid: "GPU-5f587dd4-6505-0873-c6db-8324dbfe5ba9",
                        model: "Tesla T4",
                        host: Some("nvidia-dcgm-exporter-s228n"),
                        pci_bus_id: None,
                        driver: Some("525.60.13"),
                        memory_mib: Some(14960),
                        util_pct: Some(0.0),
                        power_w: Some(17.035),
                    },
                    Gpu {
                        uuid: "GPU-7a2e92f2-be71-d37e-a744-541600ffc722",
                        model: "Tesla T4",
                        host: Some("nvidia-dcgm-exporter-s228n"),
                        pci_bus_id: None,
                        driver: Some("525.60.13"),
                        memory_mib: Some(14959),
                        util_pct: Some(0.0039),
                        power_w: Some(28.722),
                    },
                ],
                migs: vec![],
                pods: vec![(
                    "GPU-7a2e92f2-be71-d37e-a744-541600ffc722",
                    "runai-reservation/runai-reservation-gpu-qa-mig-worker-gpu-1-kvltw",
                )],
                unknown: vec![],
            },
        ),
        (
            "nvidia-docs-a100-mig-no-help-type.prom",
            Expect {
                gpus: vec![Gpu {
                    uuid: DOCS_A100,
                    model: "unknown", // no modelName label in the 2.x format
                    host: Some("ub20-a100-k8s"),
                    pci_bus_id: None,
                    driver: None,
                    memory_mib: Some(40535),
                    util_pct: Some(99.563),
                    power_w: Some(409.692),
                }],
                migs: vec![mig(DOCS_A100, "13", "1g.5gb", None, Some(99.5687))],
                pods: vec![],
                unknown: vec![
                    (
                        format!("MIG-{DOCS_A100}/13"),
                        "mem_used_mib",
                        UnknownKind::Absent,
                    ),
                    (
                        format!("MIG-{DOCS_A100}/13"),
                        "memory_mib",
                        UnknownKind::Absent,
                    ),
                ],
            },
        ),
        (
            "upcloud-k8s-nvidia-l40s-full-scrape.prom",
            Expect {
                gpus: vec![Gpu {
                    uuid: "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43",
                    model: "NVIDIA L40S",
                    host: Some("gpu1-wl8sg"),
                    pci_bus_id: Some("00000000:00:07.0"),
                    driver: Some("595.58.03"),
                    memory_mib: Some(46067), // 0 + 45459 + 608
                    util_pct: Some(0.0),
                    power_w: Some(35.686),
                }],
                migs: vec![],
                pods: vec![],
                unknown: vec![],
            },
        ),
        (
            "vsphere-vks-vgpu-grid-a100-40c.prom",
            Expect {
                gpus: vec![Gpu {
                    uuid: "GPU-0946f70c-659b-4c39-8b78-7e7600000000",
                    model: "GRID A100-40C",
                    host: Some("test-ai-1-node-pool-40c-d5ds8-br9r6-9tb2c"),
                    pci_bus_id: Some("00000000:03:00.0"),
                    driver: Some("580.126.09"),
                    memory_mib: Some(40959), // 0 + 37739 + 3220
                    util_pct: Some(0.0),     // GPU_UTIL: no DCGM_FI_PROF_* here
                    power_w: None,
                }],
                migs: vec![],
                pods: vec![],
                unknown: vec![(
                    "GPU-0946f70c-659b-4c39-8b78-7e7600000000".into(),
                    "power_w",
                    UnknownKind::Absent,
                )],
            },
        ),
    ])
}

fn close(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => (a - b).abs() < 1e-6,
        (None, None) => true,
        _ => false,
    }
}

/// Check one mapping (from a scrape or from a Prometheus) against a file's expectations.
fn check(file: &str, m: &Mapped, e: &Expect) {
    let physical: Vec<&PushGpu> = m.physical_gpus().collect();
    assert_eq!(physical.len(), e.gpus.len(), "{file}: physical GPUs");
    for want in &e.gpus {
        let g = physical
            .iter()
            .find(|g| g.uuid == want.uuid)
            .unwrap_or_else(|| panic!("{file}: no {}", want.uuid));
        assert_eq!(g.model, want.model, "{file}");
        assert_eq!(g.host.as_deref(), want.host, "{file}");
        assert_eq!(g.pci_bus_id.as_deref(), want.pci_bus_id, "{file}");
        assert_eq!(
            g.labels.get("driver_version").map(String::as_str),
            want.driver,
            "{file}"
        );
        assert_eq!(g.memory_mib, want.memory_mib, "{file} {}", want.uuid);
        let s = m.samples.iter().find(|s| s.gpu_uuid == want.uuid);
        assert!(
            close(s.and_then(|s| s.util_pct), want.util_pct),
            "{file} {}: util {:?}",
            want.uuid,
            s.map(|s| s.util_pct)
        );
        assert!(
            close(s.and_then(|s| s.power_w), want.power_w),
            "{file} {}: power {:?}",
            want.uuid,
            s.map(|s| s.power_w)
        );
    }
    let migs: Vec<&PushGpu> = m.mig_instances().collect();
    assert_eq!(migs.len(), e.migs.len(), "{file}: MIG instances");
    for want in &e.migs {
        let uuid = format!("MIG-{}/{}", want.parent, want.gi);
        let g = migs
            .iter()
            .find(|g| g.uuid == uuid)
            .unwrap_or_else(|| panic!("{file}: no {uuid}"));
        assert_eq!(g.mig_parent_uuid.as_deref(), Some(want.parent));
        assert_eq!(g.mig_profile.as_deref(), Some(want.profile));
        assert_eq!(g.memory_mib, want.memory_mib, "{file} {uuid}");
        let s = m.samples.iter().find(|s| s.gpu_uuid == uuid);
        assert!(
            close(s.and_then(|s| s.util_pct), want.util_pct),
            "{file} {uuid}"
        );
        assert_eq!(
            s.and_then(|s| s.power_w),
            None,
            "board power stays on the GPU"
        );
    }
    let mut pods: Vec<(String, String)> = m
        .allocations()
        .into_iter()
        .map(|a| (a.gpu_uuid, a.workload))
        .collect();
    pods.sort();
    let want: Vec<(String, String)> = e
        .pods
        .iter()
        .map(|(g, w)| (g.to_string(), w.to_string()))
        .collect();
    assert_eq!(pods, want, "{file}: allocations");
    let got: BTreeSet<(String, &str, UnknownKind)> = m
        .unknown
        .iter()
        .map(|u| (u.gpu_uuid.clone(), u.field, u.kind))
        .collect();
    let want: BTreeSet<(String, &str, UnknownKind)> = e.unknown.iter().cloned().collect();
    assert_eq!(got, want, "{file}: unknown fields");
}

#[test]
fn corpus_every_file_has_expected_gpus_mig_pods_and_unknowns() {
    let Some(dir) = corpus_dcgm() else { return };
    let expect = expectations();
    let files = corpus_files(&dir);
    assert!(!files.is_empty());
    for path in &files {
        let name = file_name(path);
        let e = expect
            .get(name.as_str())
            .unwrap_or_else(|| panic!("{name} is new in the corpus: add its expectations"));
        let m = map_file(path);
        assert!(m.problems.is_empty(), "{name}: {:?}", m.problems);
        check(&name, &m, e);
        assert_valid(&m.gpus, &m.samples, &m.allocations());
        // Parents come before their instances, as ingest wants.
        for (i, g) in m.gpus.iter().enumerate() {
            if let Some(p) = &g.mig_parent_uuid {
                assert!(m.gpus[..i].iter().any(|x| &x.uuid == p), "{name}");
            }
        }
    }
}

/// Prints the per-file results table the docs carry (`cargo test -p gpuledger-collect --test dcgm
/// corpus_results_table -- --nocapture`).
#[test]
fn corpus_results_table() {
    let Some(dir) = corpus_dcgm() else { return };
    println!("| file | GPUs | MIG instances | allocations | unknown |");
    println!("| --- | --- | --- | --- | --- |");
    for path in corpus_files(&dir) {
        let m = map_file(&path);
        let gpus: Vec<String> = m
            .physical_gpus()
            .map(|g| format!("{} `{}`", g.model, &g.uuid[..12]))
            .collect();
        let migs: Vec<String> = m
            .mig_instances()
            .map(|g| {
                format!(
                    "{} (GI {})",
                    g.mig_profile.as_deref().unwrap_or("?"),
                    g.labels["gpu_instance_id"]
                )
            })
            .collect();
        let allocations: Vec<String> = m
            .allocations()
            .iter()
            .map(|a| format!("{} `{}`", a.kind.as_str(), a.workload))
            .collect();
        let unknown: Vec<String> = m
            .unknown
            .iter()
            .map(|u| {
                let who = if u.gpu_uuid.starts_with("MIG-") {
                    "MIG"
                } else {
                    "GPU"
                };
                format!("{who} {}: {}", u.field, u.detail)
            })
            .collect();
        let cell = |v: Vec<String>| {
            if v.is_empty() {
                "—".to_string()
            } else {
                v.join("; ")
            }
        };
        let mig_cell = if migs.is_empty() {
            "0".to_string()
        } else {
            format!("{}: {}", migs.len(), migs.join(", "))
        };
        println!(
            "| {} | {} | {mig_cell} | {} | {} |",
            file_name(&path),
            cell(gpus),
            cell(allocations),
            cell(unknown)
        );
    }
}

#[test]
fn corpus_sentinel_values_become_unknown() {
    let Some(dir) = corpus_dcgm() else { return };
    // The corpus's full scrapes carry no sentinel; put DCGM's in where a real exporter does.
    let text = std::fs::read_to_string(dir.join("aws-kops-nvidia-l4-full-scrape.prom")).unwrap();
    let text = text
        .lines()
        .map(|l| {
            let (head, _) = l.rsplit_once(' ').unwrap_or((l, ""));
            if l.starts_with("DCGM_FI_DEV_POWER_USAGE{") {
                format!("{head} 9223372036854775794") // int64 NOT_SUPPORTED
            } else if l.starts_with("DCGM_FI_PROF_GR_ENGINE_ACTIVE{") {
                format!("{head} 140737488355328.000000") // fp64 BLANK
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let m = parse::map(&parse::parse_text(&text).series, at());
    let s = &m.samples[0];
    assert_eq!(s.power_w, None);
    assert_eq!(s.util_pct, Some(0.0), "falls back to DCGM_FI_DEV_GPU_UTIL");
    let power = m.unknown.iter().find(|u| u.field == "power_w").unwrap();
    assert_eq!(power.kind, UnknownKind::Sentinel);
    assert!(power.detail.contains("NOT_SUPPORTED"), "{}", power.detail);
    assert_valid(&m.gpus, &m.samples, &m.allocations());
}

// ---------------------------------------------------------------------------------------------
// accel_*: AMD and Gaudi exporters; expected values read off the files

/// One device (a GPU, or a partition with `parent`) and its newest sample.
struct Dev {
    uuid: &'static str,
    parent: Option<&'static str>,
    /// `mig_profile`: a partition's mode.
    profile: Option<&'static str>,
    model: &'static str,
    host: Option<&'static str>,
    serial: Option<&'static str>,
    memory_mib: Option<u64>,
    util_pct: Option<f64>,
    mem_used_mib: Option<f64>,
    power_w: Option<f64>,
    /// Record labels checked (others may be there).
    labels: &'static [(&'static str, &'static str)],
}

struct AccelExpect {
    vendors: &'static [Vendor],
    devices: Vec<Dev>,
    /// (device, kind, workload)
    holds: Vec<(&'static str, &'static str, &'static str)>,
    /// (device, field, kind)
    unknown: Vec<(&'static str, &'static str, UnknownKind)>,
}

const OLD_AMD: &str = "AMD-SN-692247001282";
const MI300X_SPX: &str = "AMD-SN-692407005101";
const MI300X_CPX: &str = "AMD-SN-692407005126";
const GAUDI_0: &str = "HL-SN-AM50016789";
const GAUDI_1: &str = "HL-UUID-01P0-HL2080A0-15-TNF0C2-04-07-12";

/// Expectations for `<corpus>/amd/*.prom` and `tests/data/*.prom`, by file name.
fn accel_expectations() -> BTreeMap<&'static str, AccelExpect> {
    let dev = |uuid| Dev {
        uuid,
        parent: None,
        profile: None,
        model: "unknown",
        host: None,
        serial: None,
        memory_mib: None,
        util_pct: None,
        mem_used_mib: None,
        power_w: None,
        labels: &[],
    };
    let only_partitions = |uuid| {
        ["activity", "mem_used_mib", "power_w", "memory_mib"]
            .into_iter()
            .map(move |f| (uuid, f, UnknownKind::OnlyMigSeries))
    };
    let mi300x = "AMD Instinct MI300X OAM";
    BTreeMap::from([
        (
            // GPU 0 of an MI300X-class box, xGMI link counters only, every label masked to
            // "xxxx": no family gpuledger reads, no device named; nothing, and no problem.
            "dme-docs-xgmi-link-rx-tx-masked-labels.prom",
            AccelExpect {
                vendors: &[],
                devices: vec![],
                holds: vec![],
                unknown: vec![],
            },
        ),
        (
            // The early exporter: GPU_UUID and SERIAL_NUMBER upper-case, no card_model, no host.
            "dme-metrics-mini-old-uppercase-labels.prom",
            AccelExpect {
                vendors: &[Vendor::Amd],
                devices: vec![Dev {
                    serial: Some("692247001282"),
                    memory_mib: Some(65519), // gpu_total_memory 68702 MB (10^6 B) = 65519.3 MiB
                    util_pct: Some(0.0),     // gpu_usage
                    power_w: Some(41.0),     // gpu_power_usage (gpu_package_power absent)
                    labels: &[("gpu_uuid", "6699c0a8-4200-4242-037f-f97e6cae0f09")],
                    ..dev(OLD_AMD)
                }],
                holds: vec![],
                unknown: vec![(OLD_AMD, "mem_used_mib", UnknownKind::Absent)],
            },
        ),
        (
            "amd-dme-docs-derived-mi300x-cpx-pods.prom",
            AccelExpect {
                vendors: &[Vendor::Amd],
                devices: vec![
                    Dev {
                        model: mi300x,
                        host: Some("mi300x-node-7"),
                        serial: Some("692407005101"),
                        memory_mib: Some(196592),
                        util_pct: Some(87.0),
                        mem_used_mib: Some(150112.0),
                        power_w: Some(612.0),
                        labels: &[
                            ("card_model", "102-G30213-0C"),
                            ("gpu_index", "0"),
                            ("memory_partition", "nps1"),
                        ],
                        ..dev(MI300X_SPX)
                    },
                    Dev {
                        model: mi300x,
                        host: Some("mi300x-node-7"),
                        serial: Some("692407005126"),
                        ..dev(MI300X_CPX)
                    },
                    Dev {
                        parent: Some(MI300X_CPX),
                        profile: Some("CPX"),
                        model: mi300x,
                        host: Some("mi300x-node-7"),
                        memory_mib: Some(24574),
                        util_pct: Some(0.0),
                        mem_used_mib: Some(283.0),
                        labels: &[("partition_id", "0"), ("gpu_index", "8")],
                        ..dev("AMD-SN-692407005126/P0")
                    },
                    Dev {
                        parent: Some(MI300X_CPX),
                        profile: Some("CPX"),
                        model: mi300x,
                        host: Some("mi300x-node-7"),
                        memory_mib: Some(24574),
                        util_pct: Some(42.0),
                        mem_used_mib: Some(20480.0),
                        labels: &[("partition_id", "6"), ("gpu_index", "14")],
                        ..dev("AMD-SN-692407005126/P6")
                    },
                ],
                holds: vec![
                    (MI300X_SPX, "pod", "llm/finetune-0"),
                    ("AMD-SN-692407005126/P6", "slurm_job", "4711"),
                ],
                unknown: only_partitions(MI300X_CPX).collect(),
            },
        ),
        (
            "gaudi-metric-exporter-docs-derived.prom",
            AccelExpect {
                vendors: &[Vendor::Intel],
                devices: vec![
                    Dev {
                        host: Some("gaudi2-node-1"), // habanalabs_kube_info's node
                        serial: Some("AM50016789"),
                        memory_mib: Some(98304),
                        util_pct: Some(98.0),
                        mem_used_mib: Some(96565.0),
                        power_w: Some(351.0),
                        labels: &[("driver_version", "1.20.0-bd87f71"), ("gpu_index", "0")],
                        ..dev(GAUDI_0)
                    },
                    Dev {
                        host: Some("gaudi2-node-1"),
                        memory_mib: Some(98304),
                        util_pct: Some(0.0),
                        mem_used_mib: Some(768.0),
                        power_w: Some(93.0),
                        labels: &[("gpu_index", "1")],
                        ..dev(GAUDI_1) // Serial="N/A": named by its UUID
                    },
                ],
                holds: vec![(GAUDI_0, "pod", "ml-research/llama-train-0")],
                unknown: vec![],
            },
        ),
    ])
}

/// Check one mapping of an AMD or Gaudi answer against its expectations.
fn check_accel(file: &str, m: &Mapped, e: &AccelExpect) {
    assert!(m.problems.is_empty(), "{file}: {:?}", m.problems);
    assert_eq!(
        m.vendors.iter().copied().collect::<Vec<_>>(),
        e.vendors.to_vec(),
        "{file}: exporters detected"
    );
    let got: BTreeSet<&str> = m.gpus.iter().map(|g| g.uuid.as_str()).collect();
    let want: BTreeSet<&str> = e.devices.iter().map(|d| d.uuid).collect();
    assert_eq!(got, want, "{file}: devices");
    for want in &e.devices {
        let g = m.gpus.iter().find(|g| g.uuid == want.uuid).unwrap();
        let who = format!("{file} {}", want.uuid);
        assert_eq!(g.mig_parent_uuid.as_deref(), want.parent, "{who}");
        assert_eq!(g.mig_profile.as_deref(), want.profile, "{who}");
        assert_eq!(g.model, want.model, "{who}");
        assert_eq!(g.host.as_deref(), want.host, "{who}");
        assert_eq!(g.serial.as_deref(), want.serial, "{who}");
        assert_eq!(g.memory_mib, want.memory_mib, "{who}");
        for (k, v) in want.labels {
            assert_eq!(g.labels.get(*k).map(String::as_str), Some(*v), "{who}: {k}");
        }
        let s = m.samples.iter().find(|s| s.gpu_uuid == want.uuid);
        let field = |f: fn(&PushSample) -> Option<f64>| s.and_then(f);
        assert!(
            close(field(|s| s.util_pct), want.util_pct),
            "{who}: util {s:?}"
        );
        assert!(
            close(field(|s| s.mem_used_mib), want.mem_used_mib),
            "{who}: mem {s:?}"
        );
        assert!(
            close(field(|s| s.power_w), want.power_w),
            "{who}: power {s:?}"
        );
        assert_eq!(field(|s| s.sm_active), None, "{who}: no SM activity");
    }
    // Parents come before their partitions, as ingest wants.
    for (i, g) in m.gpus.iter().enumerate() {
        if let Some(p) = &g.mig_parent_uuid {
            assert!(m.gpus[..i].iter().any(|x| &x.uuid == p), "{file}");
        }
    }
    let mut holds: Vec<(String, &str, String)> = m
        .allocations()
        .into_iter()
        .map(|a| (a.gpu_uuid, a.kind.as_str(), a.workload))
        .collect();
    holds.sort();
    let mut want: Vec<(String, &str, String)> = e
        .holds
        .iter()
        .map(|(g, k, w)| (g.to_string(), *k, w.to_string()))
        .collect();
    want.sort();
    assert_eq!(holds, want, "{file}: allocations");
    let got: BTreeSet<(String, &str, UnknownKind)> = m
        .unknown
        .iter()
        .map(|u| (u.gpu_uuid.clone(), u.field, u.kind))
        .collect();
    let want: BTreeSet<(String, &str, UnknownKind)> = e
        .unknown
        .iter()
        .map(|(g, f, k)| (g.to_string(), *f, *k))
        .collect();
    assert_eq!(got, want, "{file}: unknown fields");
    assert_valid(&m.gpus, &m.samples, &m.allocations());
}

#[test]
fn accel_every_amd_corpus_scrape_has_expected_devices_and_unknowns() {
    let Some(dir) = corpus_amd() else { return };
    let expect = accel_expectations();
    let files = amd_scrapes(&dir);
    assert_eq!(files.len(), 2, "{files:?}");
    for path in &files {
        let name = file_name(path);
        let e = expect
            .get(name.as_str())
            .unwrap_or_else(|| panic!("{name} is new in the corpus: add its expectations"));
        check_accel(&name, &map_file(path), e);
    }
}

#[test]
fn accel_documentation_derived_amd_and_gaudi_answers_map() {
    let expect = accel_expectations();
    for name in [
        "amd-dme-docs-derived-mi300x-cpx-pods.prom",
        "gaudi-metric-exporter-docs-derived.prom",
    ] {
        check_accel(name, &map_file(&test_data().join(name)), &expect[name]);
    }
}

/// Prints the per-file results table the docs carry (`cargo test -p gpuledger-collect --test dcgm
/// accel_results_table -- --nocapture`).
#[test]
fn accel_results_table() {
    let mut files: Vec<PathBuf> = corpus_amd().map(|d| amd_scrapes(&d)).unwrap_or_default();
    files.extend(
        corpus_files(&test_data())
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "prom")),
    );
    println!("| file | devices | model | memory | activity | pods, jobs | unknown |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for path in files {
        let m = map_file(&path);
        let cell = |v: Vec<String>| {
            if v.is_empty() {
                "—".to_string()
            } else {
                v.join("; ")
            }
        };
        let devices = cell(
            m.gpus
                .iter()
                .map(|g| match &g.mig_profile {
                    Some(p) => format!("`{}` ({p})", g.uuid),
                    None => format!("`{}`", g.uuid),
                })
                .collect(),
        );
        let models: BTreeSet<&str> = m.gpus.iter().map(|g| g.model.as_str()).collect();
        let memory = cell(
            m.gpus
                .iter()
                .filter_map(|g| g.memory_mib.map(|v| format!("{v} MiB")))
                .collect(),
        );
        let activity = cell(
            m.samples
                .iter()
                .filter_map(|s| s.util_pct.map(|u| format!("{u} %")))
                .collect(),
        );
        let holds = cell(
            m.allocations()
                .iter()
                .map(|a| format!("{} `{}`", a.kind.as_str(), a.workload))
                .collect(),
        );
        let unknown = cell(
            m.unknown
                .iter()
                .map(|u| format!("{} {}: {}", u.gpu_uuid, u.field, u.detail))
                .collect(),
        );
        println!(
            "| {} | {devices} | {} | {memory} | {activity} | {holds} | {unknown} |",
            file_name(&path),
            cell(models.into_iter().map(String::from).collect()),
        );
    }
}

#[test]
fn accel_amd_not_applicable_values_and_impossible_ones_are_unknown() {
    let old = "gpu_power_usage{GPU_UUID=\"u-1\",SERIAL_NUMBER=\"692247001282\"} 65535\n\
               gpu_usage{GPU_UUID=\"u-1\",SERIAL_NUMBER=\"692247001282\"} 4294967295\n\
               gpu_used_vram{GPU_UUID=\"u-1\",SERIAL_NUMBER=\"692247001282\"} NaN\n\
               gpu_total_vram{GPU_UUID=\"u-1\",SERIAL_NUMBER=\"692247001282\"} 18446744073709551615\n";
    let m = parse::map_text(old, at());
    assert!(m.samples.is_empty(), "{:?}", m.samples);
    let kinds: BTreeMap<&str, (UnknownKind, String)> = m
        .unknown
        .iter()
        .map(|u| (u.field, (u.kind, u.detail.clone())))
        .collect();
    assert_eq!(kinds["power_w"].0, UnknownKind::Sentinel, "{kinds:?}");
    assert!(kinds["power_w"].1.contains("all bits set"), "{kinds:?}");
    assert_eq!(kinds["activity"].0, UnknownKind::Sentinel, "{kinds:?}");
    assert_eq!(kinds["mem_used_mib"].0, UnknownKind::Invalid, "{kinds:?}");
    assert_eq!(kinds["memory_mib"].0, UnknownKind::Sentinel, "{kinds:?}");
    assert_eq!(m.gpus[0].memory_mib, None);
    // A Gaudi power of 20 kW is no reading; mW are converted before the check.
    let m = parse::map_text(
        "habanalabs_power_mW{Serial=\"AM1\"} 20000000\nhabanalabs_utilization{Serial=\"AM1\"} 101\n",
        at(),
    );
    assert!(m.samples.is_empty(), "{:?}", m.samples);
    assert_eq!(m.unknown.len(), 4, "{:?}", m.unknown);
}

#[test]
fn accel_masked_or_missing_identities_are_skipped_with_a_problem() {
    // The docs file's masked labels on a family that is read: no GPU, and the run says why.
    let text = "gpu_gfx_activity{card_model=\"xxxx\",gpu_id=\"0\",hostname=\"xxxx\",serial_number=\"xxxx\"} 3\n\
                habanalabs_utilization{Serial=\"\",UUID=\"N/A\"} 5\n";
    let m = parse::map_text(text, at());
    assert!(m.gpus.is_empty());
    assert_eq!(m.problems.len(), 2, "{:?}", m.problems);
    assert!(
        m.problems[0].contains("1 AMD series name no GPU"),
        "{:?}",
        m.problems
    );
    assert!(
        m.problems[1].contains("1 Gaudi series name no device"),
        "{:?}",
        m.problems
    );
    // `gpu_*` is a common prefix: without one of AMD's read families, such series are not AMD's.
    let m = parse::map_text("gpu_temperature{serial_number=\"S1\"} 40\n", at());
    assert!(m.gpus.is_empty() && m.problems.is_empty() && m.vendors.is_empty());
    // With the exporter's `amd_` prefix they are.
    let m = parse::map_text(
        "amd_gpu_gfx_activity{serial_number=\"692407005101\",hostname=\"n1\"} 12\n",
        at(),
    );
    assert_eq!(m.gpus[0].uuid, "AMD-SN-692407005101");
    assert_eq!(m.samples[0].util_pct, Some(12.0));
}

#[test]
fn accel_one_answer_may_hold_all_three_exporters() {
    let Some(dcgm) = corpus_dcgm() else { return };
    let Some(amd) = corpus_amd() else { return };
    let mut text = std::fs::read_to_string(dcgm.join("k8s-tesla-t4-2gpu-pod-labels.prom")).unwrap();
    text.push('\n');
    text.push_str(
        &std::fs::read_to_string(amd.join("dme-metrics-mini-old-uppercase-labels.prom")).unwrap(),
    );
    text.push('\n');
    text.push_str(
        &std::fs::read_to_string(test_data().join("gaudi-metric-exporter-docs-derived.prom"))
            .unwrap(),
    );
    let m = parse::map_text(&text, at());
    assert!(m.problems.is_empty(), "{:?}", m.problems);
    assert_eq!(
        m.vendors.iter().copied().collect::<Vec<_>>(),
        [Vendor::Nvidia, Vendor::Amd, Vendor::Intel]
    );
    let by_vendor = |v: Vendor| {
        m.physical_gpus()
            .filter(|g| Vendor::of_uuid(&g.uuid) == Some(v))
            .count()
    };
    assert_eq!(
        (
            by_vendor(Vendor::Nvidia),
            by_vendor(Vendor::Amd),
            by_vendor(Vendor::Intel)
        ),
        (2, 1, 2)
    );
    assert_eq!(m.allocations().len(), 2, "the T4's pod and the Gaudi's");
    assert_valid(&m.gpus, &m.samples, &m.allocations());
}

// ---------------------------------------------------------------------------------------------
// mutated_*: damage must never panic, and what survives must still be valid

/// A small deterministic generator (xorshift64*), so failures reproduce.
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
    const JUNK: &[u8] = b"{}\",=\\\n #9eE.-+xNaInf\xff\x00";
    let mut b = bytes.to_vec();
    for _ in 0..1 + rng.below(4) {
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

/// Every exporter answer the tests have: the dcgm corpus, the AMD corpus's scrapes and the
/// documentation-derived files.
fn every_scrape(dcgm: &Path) -> Vec<PathBuf> {
    let mut files = corpus_files(dcgm);
    files.extend(corpus_amd().map(|d| amd_scrapes(&d)).unwrap_or_default());
    files.extend(
        corpus_files(&test_data())
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "prom")),
    );
    files
}

#[test]
fn mutated_scrapes_never_panic_and_stay_valid() {
    let Some(dir) = corpus_dcgm() else { return };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut runs, mut with_problems) = (0, 0);
    for path in every_scrape(&dir) {
        let bytes = std::fs::read(&path).unwrap();
        for _ in 0..150 {
            let damaged = mutate(&mut rng, &bytes);
            let parsed = parse::parse_text(&String::from_utf8_lossy(&damaged));
            let m = parse::map(&parsed.series, at());
            assert_valid(&m.gpus, &m.samples, &m.allocations());
            runs += 1;
            if !parsed.problems.is_empty() || !m.problems.is_empty() {
                with_problems += 1;
            }
        }
    }
    assert!(
        with_problems > 0 && with_problems < runs,
        "{with_problems}/{runs}"
    );
}

#[test]
fn mutated_api_answers_never_panic_and_stay_valid() {
    let Some(dir) = corpus_dcgm() else { return };
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for path in every_scrape(&dir) {
        // A Prometheus answer holding this file's series, as /api/v1/query gives it.
        let parsed = parse::parse_text(&std::fs::read_to_string(&path).unwrap());
        let result: Vec<serde_json::Value> = parsed
            .series
            .iter()
            .map(|s| {
                let mut metric = s.labels.clone();
                metric.insert("__name__".into(), s.metric.clone());
                serde_json::json!({ "metric": metric, "value": [1764676800.5, s.values[0].raw] })
            })
            .collect();
        let answer = serde_json::json!({
            "status": "success",
            "data": { "resultType": "vector", "result": result }
        });
        let bytes = serde_json::to_vec(&answer).unwrap();
        let whole = parse::map(&parse::parse_api(&bytes).unwrap().series, at());
        assert_eq!(
            whole.gpus.len(),
            map_file(&path).gpus.len(),
            "{}",
            file_name(&path)
        );
        for _ in 0..100 {
            let damaged = mutate(&mut rng, &bytes);
            if let Ok(p) = parse::parse_api(&damaged) {
                let m = parse::map(&p.series, at());
                assert_valid(&m.gpus, &m.samples, &m.allocations());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A local HTTP server serving the corpus the way dcgm-exporter serves /metrics

struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serve `<dir>/<file>` at `/dcgm/<file>`; `/html` answers a web page, `/fail` a 500.
async fn serve_corpus(dir: PathBuf) -> Server {
    serve_dirs(BTreeMap::from([("dcgm", dir)])).await
}

/// Serve each `<dir>/<file>` at `/<name>/<file>`; `/html` answers a web page, `/fail` a 500.
async fn serve_dirs(dirs: BTreeMap<&'static str, PathBuf>) -> Server {
    use axum::extract::Path as UrlPath;
    use axum::http::{header, StatusCode};
    use axum::routing::get;

    let dirs = std::sync::Arc::new(dirs);
    let app = axum::Router::new()
        .route(
            "/{name}/{file}",
            get(move |UrlPath((name, file)): UrlPath<(String, String)>| {
                let dirs = dirs.clone();
                async move {
                    let Some(dir) = dirs.get(name.as_str()) else {
                        return Err(StatusCode::NOT_FOUND);
                    };
                    if file.contains('/') || file.starts_with('.') {
                        return Err(StatusCode::NOT_FOUND);
                    }
                    // Verbatim, including the files without a final newline (Prometheus 2.42
                    // takes them as they are).
                    let text = std::fs::read_to_string(dir.join(&file))
                        .map_err(|_| StatusCode::NOT_FOUND)?;
                    Ok((
                        [(
                            header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        text,
                    ))
                }
            }),
        )
        .route(
            "/html",
            get(|| async { "<html><body>Grafana</body></html>" }),
        )
        .route(
            "/fail",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "exporter broke") }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server { addr, task }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn gpu_uuids(obs: &[Observation], mig: bool) -> BTreeSet<String> {
    obs.iter()
        .filter_map(|o| match o {
            Observation::Gpu { gpu, .. } if gpu.mig_parent_uuid.is_some() == mig => {
                Some(gpu.uuid.clone())
            }
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// scrape_*

#[tokio::test]
async fn scrape_one_failing_endpoint_does_not_fail_the_others() {
    let Some(dir) = corpus_dcgm() else { return };
    let server = serve_corpus(dir).await;
    let base = format!("http://{}", server.addr);
    let refused = format!("http://127.0.0.1:{}/metrics", free_port());
    let toml = format!(
        "type = \"dcgm\"\nname = \"farm\"\ntimeout_secs = 5\nendpoints = [\"{base}/dcgm/k8s-tesla-t4-2gpu-pod-labels.prom\", \"{base}/dcgm/vsphere-vks-vgpu-grid-a100-40c.prom\", \"{base}/fail\", \"{base}/html\", \"{base}/dcgm/missing.prom\", \"{refused}\"]\n"
    );
    let c = build("dcgm", "farm", &toml).unwrap();
    let report = c.collect_report().await.unwrap();
    assert_eq!(gpu_uuids(&report.observations, false).len(), 3);
    assert_valid_observations(&report.observations);
    let problems: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(
        problems[0].contains("/fail") && problems[0].contains("HTTP 500"),
        "{problems:#?}"
    );
    assert!(problems[1].contains("no GPU found"), "{problems:#?}");
    assert!(
        problems[2].contains("HTTP 404") && problems[2].contains("check the URL"),
        "{problems:#?}"
    );
    assert!(problems[3].contains("check that it runs"), "{problems:#?}");
    assert!(report.problems[0].error.is_retryable());
    assert!(!report.problems[2].error.is_retryable());
    // Provenance names the source and the endpoint.
    let p = report.observations[0].provenance();
    assert_eq!(p.source, "farm");
    assert!(p
        .raw_key
        .as_deref()
        .unwrap()
        .ends_with("k8s-tesla-t4-2gpu-pod-labels.prom"));
    // The plain trait call keeps what worked too.
    assert!(!c.collect().await.unwrap().is_empty());
    assert!(
        c.backfill(Utc::now()).is_none(),
        "an exporter keeps no history"
    );

    let all_bad = build(
        "dcgm",
        "x",
        &format!("endpoints = [\"{base}/fail\", \"{refused}\"]\ntimeout_secs = 5\n"),
    )
    .unwrap();
    match all_bad.collect().await {
        Err(CollectError::Transient(m)) => {
            assert!(
                m.contains("all 2 parts failed") && m.contains("HTTP 500"),
                "{m}"
            )
        }
        other => panic!("expected a transient error, got {other:?}"),
    }
}

/// Issue 14: a collector copied the first non-metric line of whatever a URL answered (a
/// password file, an error page) into its error, which viewers read as the source's
/// `last_error`. Errors now name the URL, the status and the kind of problem, never the text.
#[tokio::test]
async fn scrape_errors_never_repeat_what_the_url_answered() {
    use axum::http::StatusCode;
    use axum::routing::get;
    const SECRET: &str = "hunter2";
    const UUID: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000001";
    let dcgm = format!(
        "DCGM_FI_DEV_GPU_UTIL{{UUID=\"{UUID}\"}} {SECRET}\n\
         DCGM_FI_DEV_GPU_UTIL{{{SECRET}}} 5\n\
         DCGM_FI_DEV_GPU_UTIL{{UUID=\"{UUID}\",{SECRET}=}} 5\n\
         DCGM_FI_DEV_GPU_UTIL{{UUID=\"{UUID}\"}} 5 {SECRET}\n\
         {SECRET} is here\n"
    );
    let broken_series = format!(
        r#"{{"status":"success","warnings":["{SECRET}"],"data":{{"resultType":"vector","result":[
            {{"metric":{{"__name__":"DCGM_FI_DEV_GPU_UTIL","UUID":"{UUID}"}},"value":[1,"{SECRET}"]}},
            {{"metric":"{SECRET}"}}]}}}}"#
    );
    let app = axum::Router::new()
        .route(
            "/passwd",
            get(|| async { format!("root:x:0:0:root:/root:/bin/bash\nTOKEN={SECRET}\n") }),
        )
        .route(
            "/fail",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, format!("oops {SECRET}")) }),
        )
        .route(
            "/denied",
            get(|| async { (StatusCode::FORBIDDEN, format!("no {SECRET}")) }),
        )
        .route("/bad-dcgm", get(move || async move { dcgm }))
        .route(
            "/prom/api/v1/query",
            get(|| async {
                (
                    StatusCode::BAD_REQUEST,
                    format!(r#"{{"status":"error","errorType":"bad_data","error":"{SECRET}"}}"#),
                )
            }),
        )
        .route(
            "/prom-ok/api/v1/query",
            get(|| async {
                format!(r#"{{"status":"error","errorType":"{SECRET}","error":"{SECRET}"}}"#)
            }),
        )
        .route(
            "/prom-series/api/v1/query",
            get(move || async move { broken_series }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut messages = Vec::new();
    for settings in [
        format!("endpoints = [\"{base}/passwd\", \"{base}/fail\", \"{base}/bad-dcgm\"]"),
        format!("endpoints = [\"{base}/denied\"]"),
        format!("prometheus_url = \"{base}/prom\""),
        format!("prometheus_url = \"{base}/prom-ok\""),
        format!("prometheus_url = \"{base}/prom-series\""),
    ] {
        let c = build("dcgm", "x", &format!("{settings}\ntimeout_secs = 5\n")).unwrap();
        match c.collect_report().await {
            Ok(r) => messages.extend(r.problems.iter().map(|p| p.to_string())),
            Err(e) => messages.push(e.to_string()),
        }
    }
    server.abort();
    let all = messages.join("\n");
    assert!(messages.len() >= 5, "{all}");
    assert!(!all.contains(SECRET) && !all.contains("root:x"), "{all}");
    // What is said instead: the URL, the status, the kind of problem and the line.
    assert!(all.contains(&format!("{base}/passwd")), "{all}");
    assert!(
        all.contains("HTTP 500") && all.contains("HTTP 403"),
        "{all}"
    );
    assert!(all.contains("line 1 is not Prometheus text"), "{all}");
    assert!(all.contains("line 1: the value is not a number"), "{all}");
    assert!(all.contains("line 4: the timestamp"), "{all}");
}

#[tokio::test]
async fn scrape_allocations_keep_their_start_across_runs() {
    let Some(dir) = corpus_dcgm() else { return };
    let server = serve_corpus(dir).await;
    let url = format!(
        "http://{}/dcgm/k8s-tesla-t4-2gpu-pod-labels.prom",
        server.addr
    );
    let c = build("dcgm", "x", &format!("endpoints = [\"{url}\"]")).unwrap();
    let start = |obs: Vec<Observation>| {
        obs.into_iter()
            .find_map(|o| match o {
                Observation::Allocation { allocation, .. } => Some(allocation),
                _ => None,
            })
            .unwrap()
    };
    let first = start(c.collect().await.unwrap());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = start(c.collect().await.unwrap());
    assert_eq!(
        first.start, second.start,
        "the same allocation, not a new one"
    );
    assert_eq!(second.end, None);
}

/// AMD and Gaudi exporters scraped like dcgm-exporter: the vendor is told by the families each
/// endpoint answers with, and an endpoint with none of them is a problem naming what was looked for.
#[tokio::test]
async fn scrape_reads_amd_and_gaudi_exporters_by_their_families() {
    let Some(dcgm) = corpus_dcgm() else { return };
    let Some(amd) = corpus_amd() else { return };
    let server = serve_dirs(BTreeMap::from([
        ("dcgm", dcgm),
        ("amd", amd),
        ("data", test_data()),
    ]))
    .await;
    let base = format!("http://{}", server.addr);
    let toml = format!(
        "type = \"dcgm\"\nname = \"mixed\"\ntimeout_secs = 5\nendpoints = [\
         \"{base}/dcgm/k8s-tesla-t4-2gpu-pod-labels.prom\", \
         \"{base}/amd/dme-metrics-mini-old-uppercase-labels.prom\", \
         \"{base}/data/amd-dme-docs-derived-mi300x-cpx-pods.prom\", \
         \"{base}/data/gaudi-metric-exporter-docs-derived.prom\", \
         \"{base}/amd/dme-docs-xgmi-link-rx-tx-masked-labels.prom\"]\n"
    );
    let c = build("dcgm", "mixed", &toml).unwrap();
    let report = c.collect_report().await.unwrap();
    assert_valid_observations(&report.observations);
    assert_eq!(
        gpu_uuids(&report.observations, false),
        [
            "GPU-5f587dd4-6505-0873-c6db-8324dbfe5ba9",
            "GPU-7a2e92f2-be71-d37e-a744-541600ffc722",
            OLD_AMD,
            MI300X_SPX,
            MI300X_CPX,
            GAUDI_0,
            GAUDI_1,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    );
    assert_eq!(
        gpu_uuids(&report.observations, true),
        BTreeSet::from([
            "AMD-SN-692407005126/P0".to_string(),
            "AMD-SN-692407005126/P6".to_string()
        ])
    );
    let problems: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(
        problems[0].contains("dme-docs-xgmi-link-rx-tx-masked-labels.prom")
            && problems[0].contains("no GPU found: none of the metric families gpuledger reads")
            && problems[0].contains("gpu_gfx_activity")
            && problems[0].contains("habanalabs_*"),
        "{problems:#?}"
    );
    let workloads: BTreeSet<String> = report
        .observations
        .iter()
        .filter_map(|o| match o {
            Observation::Allocation { allocation, .. } => Some(allocation.workload.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        workloads,
        BTreeSet::from([
            "runai-reservation/runai-reservation-gpu-qa-mig-worker-gpu-1-kvltw".to_string(),
            "llm/finetune-0".to_string(),
            "4711".to_string(),
            "ml-research/llama-train-0".to_string(),
        ])
    );
    // Watts from the Gaudi's milliwatts, MiB from its bytes.
    let gaudi = report
        .observations
        .iter()
        .find_map(|o| match o {
            Observation::Sample { sample, .. } if sample.gpu_uuid == GAUDI_0 => Some(sample),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        (gaudi.util_pct, gaudi.mem_used_mib, gaudi.power_w),
        (Some(98.0), Some(96565.0), Some(351.0))
    );
}

// ---------------------------------------------------------------------------------------------
// prometheus_*

/// A child process killed and reaped when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A temporary folder removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("gpuledger-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn find_prometheus() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file())
}

/// A Prometheus (Debian's `prometheus`) on 127.0.0.1 scraping `paths` of `server` every second,
/// one job each, with all targets up; `None` (said) without the binary, unless
/// `GPULEDGER_REQUIRE_PROMETHEUS` is set.
struct Prometheus {
    url: String,
    _running: Running,
    _tmp: TempDir,
}

async fn start_prometheus(server: SocketAddr, paths: &[String]) -> Option<Prometheus> {
    let Some(prometheus) = find_prometheus() else {
        if std::env::var_os("GPULEDGER_REQUIRE_PROMETHEUS").is_some() {
            panic!("GPULEDGER_REQUIRE_PROMETHEUS is set but no `prometheus` is on PATH; install Debian's `prometheus` package");
        }
        eprintln!("skipped: no `prometheus` on PATH (apt-get install prometheus)");
        return None;
    };
    let tmp = TempDir::new("prometheus");
    let mut config =
        String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n");
    for (i, path) in paths.iter().enumerate() {
        config.push_str(&format!(
            "  - job_name: \"job{i}\"\n    metrics_path: \"{path}\"\n    static_configs:\n      - targets: [\"{server}\"]\n"
        ));
    }
    std::fs::write(tmp.0.join("prometheus.yml"), config).unwrap();
    let port = free_port();
    let log = std::fs::File::create(tmp.0.join("prometheus.log")).unwrap();
    let running = Running(
        Command::new(&prometheus)
            .arg(format!(
                "--config.file={}",
                tmp.0.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.0.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = async {
            let v: serde_json::Value = http
                .get(format!("{url}/api/v1/targets"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let targets = v["data"]["activeTargets"].as_array()?.clone();
            Some(targets.len() == paths.len() && targets.iter().all(|t| t["health"] == "up"))
        }
        .await;
        if up == Some(true) {
            break;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(tmp.0.join("prometheus.log")).unwrap_or_default();
            panic!("Prometheus targets not all up within 60 s; its log:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Some(Prometheus {
        url,
        _running: running,
        _tmp: tmp,
    })
}

#[tokio::test]
async fn prometheus_scrapes_the_corpus_and_the_collector_queries_and_backfills() {
    let Some(dir) = corpus_dcgm() else { return };
    let files = corpus_files(&dir);
    let server = serve_corpus(dir.clone()).await;
    let since = Utc::now() - chrono::Duration::seconds(2);
    let paths: Vec<String> = files
        .iter()
        .map(|f| format!("/dcgm/{}", file_name(f)))
        .collect();
    let Some(prom) = start_prometheus(server.addr, &paths).await else {
        return;
    };
    let prom_url = prom.url.clone();
    // A few more scrapes, so that the backfill has a range to read.
    tokio::time::sleep(Duration::from_secs(4)).await;

    let toml = format!(
        "type = \"dcgm\"\nname = \"prom\"\nprometheus_url = \"{prom_url}\"\nbackfill_step_secs = 1\ntimeout_secs = 10\n"
    );
    let c = DcgmCollector::from_toml("prom", &toml).unwrap();
    let report = c.run().await.unwrap();
    let problems: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
    assert!(problems.is_empty(), "{problems:#?}");
    assert_valid_observations(&report.observations);

    // The same GPUs, instances, values and pods as parsing the files directly.
    let expect = expectations();
    let mut all = Mapped::default();
    for o in &report.observations {
        match o {
            Observation::Gpu { gpu, .. } => all.gpus.push(gpu.clone()),
            Observation::Sample { sample, .. } => all.samples.push(sample.clone()),
            _ => {}
        }
    }
    let physical: BTreeSet<&str> = expect
        .values()
        .flat_map(|e| e.gpus.iter().map(|g| g.uuid))
        .collect();
    assert_eq!(
        gpu_uuids(&report.observations, false),
        physical.iter().map(|s| s.to_string()).collect()
    );
    assert_eq!(gpu_uuids(&report.observations, true).len(), 5);
    for e in expect.values() {
        for want in &e.gpus {
            let g = all.gpus.iter().find(|g| g.uuid == want.uuid).unwrap();
            assert_eq!(g.model, want.model);
            assert_eq!(g.memory_mib, want.memory_mib, "{}", want.uuid);
            let s = all.samples.iter().find(|s| s.gpu_uuid == want.uuid);
            assert!(
                close(s.and_then(|s| s.util_pct), want.util_pct),
                "{}",
                want.uuid
            );
            assert!(
                close(s.and_then(|s| s.power_w), want.power_w),
                "{}",
                want.uuid
            );
        }
    }
    let pods: Vec<String> = report
        .observations
        .iter()
        .filter_map(|o| match o {
            Observation::Allocation { allocation, .. } => Some(allocation.workload.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        pods,
        ["runai-reservation/runai-reservation-gpu-qa-mig-worker-gpu-1-kvltw"]
    );

    // Backfill: query_range over the scraped period, one sample per GPU per second.
    let until = Utc::now();
    let backfill = c.backfill_range(since, until).await.unwrap();
    assert!(backfill.problems.is_empty(), "{:?}", backfill.problems);
    assert_valid_observations(&backfill.observations);
    assert_eq!(
        gpu_uuids(&backfill.observations, false).len(),
        physical.len()
    );
    let l4 = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c";
    let l4_samples: Vec<&PushSample> = backfill
        .observations
        .iter()
        .filter_map(|o| match o {
            Observation::Sample { sample, .. } if sample.gpu_uuid == l4 => Some(sample),
            _ => None,
        })
        .collect();
    assert!(l4_samples.len() >= 3, "{} samples", l4_samples.len());
    let times: BTreeSet<i64> = l4_samples.iter().map(|s| s.ts.timestamp()).collect();
    assert_eq!(times.len(), l4_samples.len(), "one sample per step");
    assert!(l4_samples.iter().all(|s| s.power_w == Some(16.365)));
    assert!(times
        .iter()
        .all(|t| *t >= since.timestamp() && *t <= until.timestamp()));
    let alloc = backfill
        .observations
        .iter()
        .find_map(|o| match o {
            Observation::Allocation { allocation, .. } => Some(allocation),
            _ => None,
        })
        .unwrap();
    assert!(alloc.start >= since && alloc.end.is_none(), "{alloc:?}");
    // The trait offers the same backfill to a server holding any collector.
    assert!(c.backfill(since).is_some());
}

/// A Prometheus scraping dcgm-exporter, AMD and Gaudi targets: the instant query and the
/// `query_range` backfill ask for all three exporters' families and find the same devices,
/// values and workloads as the files.
#[tokio::test]
async fn prometheus_holding_all_three_exporters_is_read_and_backfilled() {
    let Some(dcgm) = corpus_dcgm() else { return };
    let Some(amd) = corpus_amd() else { return };
    let server = serve_dirs(BTreeMap::from([
        ("dcgm", dcgm),
        ("amd", amd),
        ("data", test_data()),
    ]))
    .await;
    let since = Utc::now() - chrono::Duration::seconds(2);
    let paths = [
        "/dcgm/aws-kops-nvidia-l4-full-scrape.prom",
        "/amd/dme-metrics-mini-old-uppercase-labels.prom",
        "/amd/dme-docs-xgmi-link-rx-tx-masked-labels.prom",
        "/data/amd-dme-docs-derived-mi300x-cpx-pods.prom",
        "/data/gaudi-metric-exporter-docs-derived.prom",
    ]
    .map(String::from);
    let Some(prom) = start_prometheus(server.addr, &paths).await else {
        return;
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let c = DcgmCollector::from_toml(
        "prom",
        &format!(
            "prometheus_url = \"{}\"\nbackfill_step_secs = 1\ntimeout_secs = 10\n",
            prom.url
        ),
    )
    .unwrap();
    let report = c.run().await.unwrap();
    let problems: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
    assert!(problems.is_empty(), "{problems:#?}");
    assert_valid_observations(&report.observations);
    let l4 = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c";
    assert_eq!(
        gpu_uuids(&report.observations, false),
        [l4, OLD_AMD, MI300X_SPX, MI300X_CPX, GAUDI_0, GAUDI_1]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    let mut all = Mapped::default();
    for o in &report.observations {
        match o {
            Observation::Gpu { gpu, .. } => all.gpus.push(gpu.clone()),
            Observation::Sample { sample, .. } => all.samples.push(sample.clone()),
            _ => {}
        }
    }
    let expect = accel_expectations();
    for file in [
        "dme-metrics-mini-old-uppercase-labels.prom",
        "amd-dme-docs-derived-mi300x-cpx-pods.prom",
        "gaudi-metric-exporter-docs-derived.prom",
    ] {
        for want in &expect[file].devices {
            let g = all.gpus.iter().find(|g| g.uuid == want.uuid).unwrap();
            assert_eq!(
                (g.model.as_str(), g.host.as_deref(), g.memory_mib),
                (want.model, want.host, want.memory_mib),
                "{}",
                want.uuid
            );
            let s = all.samples.iter().find(|s| s.gpu_uuid == want.uuid);
            assert!(
                close(s.and_then(|s| s.util_pct), want.util_pct),
                "{}",
                want.uuid
            );
            assert!(
                close(s.and_then(|s| s.power_w), want.power_w),
                "{}",
                want.uuid
            );
            assert!(
                close(s.and_then(|s| s.mem_used_mib), want.mem_used_mib),
                "{}",
                want.uuid
            );
        }
    }
    let workloads: BTreeSet<&str> = report
        .observations
        .iter()
        .filter_map(|o| match o {
            Observation::Allocation { allocation, .. } => Some(allocation.workload.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        workloads,
        BTreeSet::from(["llm/finetune-0", "4711", "ml-research/llama-train-0"])
    );

    let until = Utc::now();
    let backfill = c.backfill_range(since, until).await.unwrap();
    assert!(backfill.problems.is_empty(), "{:?}", backfill.problems);
    assert_valid_observations(&backfill.observations);
    for uuid in [OLD_AMD, "AMD-SN-692407005126/P6", GAUDI_0] {
        let times: BTreeSet<i64> = backfill
            .observations
            .iter()
            .filter_map(|o| match o {
                Observation::Sample { sample, .. } if sample.gpu_uuid == uuid => {
                    Some(sample.ts.timestamp())
                }
                _ => None,
            })
            .collect();
        assert!(times.len() >= 3, "{uuid}: {} samples", times.len());
    }
}

/// Issue 14: an endpoint could redirect the collector to another host (a cloud metadata
/// address, an internal service) and the server would read it. Redirects are followed only on
/// the configured host; a link-local address (where clouds serve metadata) is refused as a URL.
#[tokio::test]
async fn collectors_follow_redirects_only_on_their_host_and_never_read_metadata_addresses() {
    use axum::response::Redirect;
    use axum::routing::get;
    const UUID: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000001";
    // The other host: a second listener, whose answer must never be read.
    let other = axum::Router::new().route(
        "/metrics",
        get(|| async { format!("DCGM_FI_DEV_GPU_UTIL{{UUID=\"{UUID}\"}} 99\n") }),
    );
    let other_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other_base = format!("http://localhost:{}", other_l.local_addr().unwrap().port());
    let other_srv = tokio::spawn(async move { axum::serve(other_l, other).await.unwrap() });
    let to_other = format!("{other_base}/metrics");
    let app = axum::Router::new()
        .route(
            "/away",
            get(move || {
                let to = to_other.clone();
                async move { Redirect::temporary(&to) }
            }),
        )
        .route("/moved", get(|| async { Redirect::permanent("/metrics") }))
        .route(
            "/metrics",
            get(|| async { format!("DCGM_FI_DEV_GPU_UTIL{{UUID=\"{UUID}\"}} 42\n") }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let c = build("dcgm", "x", &format!("endpoints = [\"{base}/away\"]\n")).unwrap();
    let err = match c.collect_report().await {
        Ok(r) => r
            .problems
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("redirected to another host (localhost)"),
        "{err}"
    );
    // A redirect on the same host is followed.
    let c = build("dcgm", "x", &format!("endpoints = [\"{base}/moved\"]\n")).unwrap();
    let obs = c.collect().await.unwrap();
    assert!(
        obs.iter().any(
            |o| matches!(o, Observation::Sample { sample, .. } if sample.util_pct == Some(42.0))
        ),
        "{obs:?}"
    );
    for url in [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]:9400/metrics",
    ] {
        let err = build("dcgm", "x", &format!("endpoints = [\"{url}\"]\n"))
            .err()
            .unwrap_or_else(|| panic!("{url} was accepted"))
            .to_string();
        assert!(err.contains("is a link-local address"), "{url}: {err}");
    }
    server.abort();
    other_srv.abort();
}

/// A pulled source that hangs (accepts the connection and never answers) is cut off at
/// `timeout_secs` as a passing failure, and one that answers without end is cut off at the
/// answer cap (64 MiB) without reading further; neither stops the other endpoints' parts.
#[tokio::test]
async fn scrape_a_hanging_or_endless_endpoint_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_addr = hang.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        loop {
            let (s, _) = hang.accept().await.unwrap();
            open.push(s);
        }
    });
    let endless = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endless_addr = endless.local_addr().unwrap();
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = written.clone();
    let flood = tokio::spawn(async move {
        loop {
            let (mut s, _) = endless.accept().await.unwrap();
            let counter = counter.clone();
            tokio::spawn(async move {
                // The request's head first, then an answer without end.
                let mut got = Vec::new();
                let mut buf = [0u8; 1024];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head =
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n";
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = "# HELP x y\n".repeat(100_000).into_bytes();
                while s.write_all(&chunk).await.is_ok() {
                    counter.fetch_add(chunk.len(), std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
    });
    let c = build(
        "dcgm",
        "x",
        &format!(
            "endpoints = [\"http://{hang_addr}/metrics\", \"http://{endless_addr}/metrics\"]\ntimeout_secs = 2\n"
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let report = c.collect_report().await;
    let took = started.elapsed();
    let problems: Vec<String> = match &report {
        Ok(r) => r.problems.iter().map(|p| p.to_string()).collect(),
        Err(e) => vec![e.to_string()],
    };
    let all = problems.join(" | ");
    assert!(all.contains("timed out"), "{all}");
    assert!(all.contains("over 67108864 bytes"), "{all}");
    assert!(
        took < std::time::Duration::from_secs(10),
        "the run took {took:?}"
    );
    // The endless answer was read up to the cap, not on and on.
    let sent = written.load(std::sync::atomic::Ordering::SeqCst);
    assert!(sent < 256 * 1024 * 1024, "{sent} bytes were sent");
    held.abort();
    flood.abort();
}
