//! Integration tests of the agent against the real-world corpus and a real gpuledger server.
//!
//! Map: `corpus_*` parse every file in `../shared/fixtures/nvidia-smi/`, the `rocm-smi-*.json`
//! files of `amd/` and every file of `gaudi/` (the expected values were read off the files by
//! hand, not from the parser); `robust_*` feed mutated corpus bytes to every parser; `e2e_*`
//! run the real `gpuledger-agent` binary with fake `nvidia-smi`, `rocm-smi`, `amd-smi` and
//! `hl-smi` on PATH (shell scripts written here that print corpus files) against a real
//! `gpuledger` server on a fresh SQLite file; `outage_*` stop and restart that server under a
//! running agent, or put a proxy in front of it that delays requests, resets them mid-body,
//! loses the server's answers or fails requests in its place.
//!
//! Where the corpus is absent, the tests that need it say so and pass.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuledger_agent::source::{
    hl_smi, rocm_smi, smi_csv, smi_xml, GpuReading, ProcessReading, Snapshot,
};
use gpuledger_model::PushBody;
use gpuledger_store::{Role, Store};
use gpuledger_web::{AppState, WebConfig};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// Helpers

/// The corpus root (`…/shared/fixtures`) holding the folder `sub`: `$GPULEDGER_CORPUS`, else
/// `<repo>/../shared/fixtures`. Absent, it is `None` (the test skips), or a failure when
/// `GPULEDGER_REQUIRE_CORPUS` is set.
fn corpus_with(sub: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("GPULEDGER_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"));
    if !dir.join(sub).is_dir() && std::env::var_os("GPULEDGER_REQUIRE_CORPUS").is_some() {
        panic!(
            "GPULEDGER_REQUIRE_CORPUS is set but there is no corpus at {}; set GPULEDGER_CORPUS to shared/fixtures",
            dir.join(sub).display()
        );
    }
    dir.join(sub).is_dir().then_some(dir)
}

/// The corpus root, or return from the test saying why (`require_corpus!()` needs
/// `nvidia-smi/`, `require_corpus!("amd")` needs `amd/`).
macro_rules! require_corpus {
    () => {
        require_corpus!("nvidia-smi")
    };
    ($sub:expr) => {
        match corpus_with($sub) {
            Some(c) => c,
            None => {
                eprintln!(
                    "skipped: the corpus is not here (set GPULEDGER_CORPUS to shared/fixtures, \
                     or check out shared/ next to the repository)"
                );
                return;
            }
        }
    };
}

fn smi_file(corpus: &Path, name: &str) -> PathBuf {
    corpus.join("nvidia-smi").join(name)
}

fn read(corpus: &Path, name: &str) -> String {
    std::fs::read_to_string(smi_file(corpus, name)).unwrap()
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "gpuledger-agent-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A real NVIDIA driver on this machine (then `--source auto` would use NVML, not the fake).
fn nvml_here() -> bool {
    Path::new("/dev/nvidiactl").exists()
}

/// A fake `nvidia-smi` that prints corpus files chosen by environment variables:
/// `FAKE_SMI_XML` for `-q -x`, `FAKE_SMI_CSV` for `--query-gpu`, `FAKE_SMI_APPS` for
/// `--query-compute-apps`. With `FAKE_SMI_COUNT` it appends a line to that file per XML read and
/// stops answering after `FAKE_SMI_MAX` reads. Anything else (`-L`) fails, as on a host whose
/// nvidia-smi cannot list MIG devices.
fn fake_smi(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = bin.join("nvidia-smi");
    std::fs::write(
        &script,
        r#"#!/bin/sh
case "$1" in
  -q)
    [ -n "$FAKE_SMI_XML" ] || { echo "fake nvidia-smi: no FAKE_SMI_XML" >&2; exit 9; }
    if [ -n "$FAKE_SMI_COUNT" ]; then
      n=$(cat "$FAKE_SMI_COUNT" 2>/dev/null | wc -l)
      [ "$n" -lt "${FAKE_SMI_MAX:-1000000}" ] || { echo "fake nvidia-smi: read budget spent" >&2; exit 3; }
      echo read >> "$FAKE_SMI_COUNT"
    fi
    cat "$FAKE_SMI_XML" ;;
  --query-gpu=*)
    [ -n "$FAKE_SMI_CSV" ] || exit 9
    cat "$FAKE_SMI_CSV" ;;
  --query-compute-apps=*)
    [ -n "$FAKE_SMI_APPS" ] || exit 9
    cat "$FAKE_SMI_APPS" ;;
  *) echo "fake nvidia-smi: unsupported arguments: $*" >&2; exit 9 ;;
esac
"#,
    )
    .unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .unwrap();
    bin
}

const CONTAINER: &str = "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d";
const POD: &str = "2b9a6c3a-8e5e-4c0b-9a55-d7c1f3e0e0a1";
const BTIME: i64 = 1_764_662_400; // 2025-12-02T08:00:00Z

/// A fake /proc and passwd: PID 5762 (the T4 file's python) runs as alice in a pod container,
/// started 3,600 s after boot.
fn fake_proc(dir: &Path) -> (PathBuf, PathBuf) {
    let proc_root = dir.join("proc");
    let p = proc_root.join("5762");
    std::fs::create_dir_all(&p).unwrap();
    std::fs::write(
        proc_root.join("stat"),
        format!("cpu 0 0 0\nbtime {BTIME}\n"),
    )
    .unwrap();
    std::fs::write(
        p.join("status"),
        "Name:\tpython\nUid:\t1000\t1000\t1000\t1000\n",
    )
    .unwrap();
    std::fs::write(
        p.join("stat"),
        "5762 (python) S 1 5762 5762 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 360000 0 0",
    )
    .unwrap();
    std::fs::write(
        p.join("cgroup"),
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CONTAINER}.scope\n",
            POD.replace('-', "_")
        ),
    )
    .unwrap();
    let passwd = dir.join("passwd");
    std::fs::write(
        &passwd,
        "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n",
    )
    .unwrap();
    (proc_root, passwd)
}

/// A real gpuledger server (the web crate's router over a SQLite store) on its own runtime, so
/// that stopping it closes every socket and task it had.
struct Server {
    rt: tokio::runtime::Runtime,
    store: Store,
    port: u16,
}

impl Server {
    fn start(db: &Path, port: u16) -> Server {
        Server::start_at(db, port, chrono::Duration::zero())
    }

    /// A server whose clock is `behind` the real one: what the agent reads now is, to it, in
    /// the future.
    fn start_at(db: &Path, port: u16, behind: chrono::Duration) -> Server {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let url = format!("sqlite://{}", db.display());
        let (store, listener) = rt.block_on(async {
            let store = Store::open(&url, gpuledger_ledger::Settings::default())
                .await
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            let listener = loop {
                match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
                    Ok(l) => break l,
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("rebinding port {port}: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => panic!("cannot bind 127.0.0.1:{port}: {e}"),
                }
            };
            (store, listener)
        });
        let port = listener.local_addr().unwrap().port();
        let mut state = AppState::new(store.clone(), WebConfig::default());
        state.clock = Arc::new(move || chrono::Utc::now() - behind);
        rt.spawn(gpuledger_web::serve(
            listener,
            state,
            std::future::pending(),
        ));
        Server { rt, store, port }
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn token(&self, source: &str) -> String {
        self.rt
            .block_on(self.store.create_token(Role::Ingest, source, &[]))
            .unwrap()
    }

    fn stop(self) {
        let Server { rt, store, .. } = self;
        rt.block_on(store.close());
        drop(store);
        rt.shutdown_timeout(Duration::from_secs(5));
    }
}

fn http() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into()
}

fn get_json(base: &str, path: &str) -> Value {
    let mut resp = http().get(format!("{base}{path}")).call().unwrap();
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap();
    assert_eq!(status, 200, "GET {path}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// Percent-encode a UUID for a URL path segment (`/` in older MIG names).
fn seg(uuid: &str) -> String {
    uuid.replace('/', "%2F")
}

/// A query window from yesterday to tomorrow, so that an allocation that started this very
/// second is inside it.
fn window() -> String {
    let day = |d: i64| {
        (chrono::Utc::now() + chrono::Duration::days(d))
            .format("%Y-%m-%d")
            .to_string()
    };
    format!("from={}&to={}", day(-1), day(1))
}

/// Samples the server stored for a GPU (the sum of its hourly sample counts).
fn stored_samples(base: &str, uuid: &str) -> i64 {
    let d = get_json(base, &format!("/api/v1/gpus/{}?{}", seg(uuid), window()));
    d["hours"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["samples"].as_i64().unwrap())
        .sum()
}

fn agent(bin: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuledger-agent"));
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for var in [
        "GPULEDGER_SERVER",
        "GPULEDGER_TOKEN",
        "GPULEDGER_TOKEN_FILE",
        "GPULEDGER_AGENT_CONFIG",
        "GPULEDGER_BUFFER_DIR",
        "GPULEDGER_HOST",
        "GPULEDGER_CLUSTER",
        "STATE_DIRECTORY",
        "GPULEDGER_LOG",
    ] {
        c.env_remove(var);
    }
    c.env("PATH", path).stdin(Stdio::null());
    c
}

// ---------------------------------------------------------------------------------------------
// corpus_*: every nvidia-smi file, expected values read off the files

struct XmlExpect {
    file: &'static str,
    uuid: &'static str,
    model: &'static str,
    memory_mib: u64,
    serial: Option<&'static str>,
    pci_bus_id: &'static str,
    driver: &'static str,
    cuda: &'static str,
    mig_enabled: Option<bool>,
    util_pct: Option<f64>,
    mem_used_mib: f64,
    power_w: f64,
    /// (gpu instance id, compute instance id, memory MiB, used MiB)
    migs: &'static [(u32, u32, u64, f64)],
    /// (pid, name, type, used MiB)
    processes: &'static [(u32, &'static str, &'static str, u64)],
}

const XML: &[XmlExpect] = &[
    XmlExpect {
        file: "a100-sxm4-80gb-mig-enabled.xml",
        uuid: "GPU-513536b6-7d19-9063-b049-1e69664bb298",
        model: "NVIDIA A100-SXM4-80GB",
        memory_mib: 81920,
        serial: Some("1650522003820"),
        pci_bus_id: "00000000:01:00.0",
        driver: "535.54.03",
        cuda: "12.2",
        mig_enabled: Some(true),
        util_pct: None, // `N/A` under MIG
        mem_used_mib: 50.0,
        power_w: 67.03,
        migs: &[
            (3, 0, 19968, 12.0),
            (4, 0, 19968, 12.0),
            (5, 0, 19968, 12.0),
            (6, 0, 19968, 12.0),
        ],
        processes: &[],
    },
    XmlExpect {
        file: "tesla-t4.xml",
        uuid: "GPU-d37e67a5-91dd-3774-a5cb-99096249601a",
        model: "Tesla T4",
        memory_mib: 15360,
        serial: None, // 0000000000000
        pci_bus_id: "00000000:00:1E.0",
        driver: "515.105.01",
        cuda: "11.7",
        mig_enabled: None,
        util_pct: Some(0.0),
        mem_used_mib: 1032.0,
        power_w: 26.78,
        migs: &[],
        processes: &[
            (675, "/usr/lib/xorg/Xorg", "G", 22),
            (5762, "python", "C", 1005),
        ],
    },
    XmlExpect {
        file: "a10g.xml",
        uuid: "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94",
        model: "NVIDIA A10G",
        memory_mib: 23028,
        serial: None,
        pci_bus_id: "00000000:00:1E.0",
        driver: "515.105.01",
        cuda: "11.7",
        mig_enabled: None,
        util_pct: Some(0.0),
        mem_used_mib: 22.0,
        power_w: 25.58,
        migs: &[],
        processes: &[(725, "/usr/lib/xorg/Xorg", "G", 22)],
    },
    XmlExpect {
        file: "rtx-4000-sff-ada-driver-v13.xml",
        uuid: "GPU-37037c3f-65c8-ec4d-24a9-420204ad8026",
        model: "NVIDIA RTX 4000 SFF Ada Generation",
        memory_mib: 20475,
        serial: Some("REDACTED"),
        pci_bus_id: "00000000:06:00.0",
        driver: "595.84",
        cuda: "13.2",
        mig_enabled: None,
        util_pct: Some(0.0),
        mem_used_mib: 3534.0,
        power_w: 8.81, // average_power_draw (v13 has no plain power_draw)
        migs: &[],
        processes: &[
            (1842, "cosmic-comp", "G", 410),
            (3190, "/usr/bin/code", "G", 451),
            (4937, "python", "C", 160),
            (34626, "/usr/lib/chromium/chromium", "C+G", 183),
        ],
    },
    XmlExpect {
        file: "aws-kops-nvidia-l4-driver580-v13.xml",
        uuid: "GPU-8a0cb40d-f2e8-2199-64b0-33126c728d06",
        model: "NVIDIA L4",
        memory_mib: 23034,
        serial: Some("1653623019067"),
        pci_bus_id: "00000000:31:00.0",
        driver: "580.105.08",
        cuda: "13.0",
        mig_enabled: None,
        util_pct: Some(0.0),
        mem_used_mib: 0.0,
        power_w: 16.78,
        migs: &[],
        processes: &[],
    },
];

struct CsvExpect {
    file: &'static str,
    model: &'static str,
    memory_mib: u64,
    pci_bus_id: &'static str,
    driver: &'static str,
    mig_enabled: Option<bool>,
    util_pct: Option<f64>,
    mem_used_mib: f64,
    power_w: f64,
}

/// Every CSV capture's UUID and serial were masked by the capture tool.
const MASKED_UUID: &str = "GPU-00000000-0000-0000-0000-000000000000";

const CSV: &[CsvExpect] = &[
    CsvExpect {
        file: "query-gpu-full-h100-80gb-hbm3-idle.csv",
        model: "NVIDIA H100 80GB HBM3",
        memory_mib: 81559,
        pci_bus_id: "00000000:00:09.0",
        driver: "590.48.01",
        mig_enabled: Some(false),
        util_pct: Some(0.0),
        mem_used_mib: 0.0,
        power_w: 69.85,
    },
    CsvExpect {
        file: "query-gpu-full-h100-80gb-hbm3-load.csv",
        model: "NVIDIA H100 80GB HBM3",
        memory_mib: 81559,
        pci_bus_id: "00000000:00:09.0",
        driver: "590.48.01",
        mig_enabled: Some(false),
        util_pct: Some(100.0),
        mem_used_mib: 19818.0,
        power_w: 631.95,
    },
    CsvExpect {
        file: "query-gpu-full-h100-mig-load.csv",
        model: "NVIDIA H100 80GB HBM3",
        memory_mib: 81559,
        pci_bus_id: "00000000:00:09.0",
        driver: "590.48.01",
        mig_enabled: Some(true),
        util_pct: None, // `[N/A]` under MIG
        mem_used_mib: 11125.0,
        power_w: 433.78,
    },
    CsvExpect {
        file: "query-gpu-full-h200-load.csv",
        model: "NVIDIA H200",
        memory_mib: 143771,
        pci_bus_id: "00000000:83:00.0",
        driver: "590.48.01",
        mig_enabled: Some(false),
        util_pct: Some(100.0),
        mem_used_mib: 32362.0,
        power_w: 627.40,
    },
    CsvExpect {
        file: "query-gpu-full-h200-mig-load.csv",
        model: "NVIDIA H200",
        memory_mib: 143771,
        pci_bus_id: "00000000:83:00.0",
        driver: "590.48.01",
        mig_enabled: Some(true),
        util_pct: None,
        mem_used_mib: 16959.0,
        power_w: 295.01,
    },
    CsvExpect {
        file: "query-gpu-full-l40s-load.csv",
        model: "NVIDIA L40S",
        memory_mib: 46068,
        pci_bus_id: "00000000:01:00.0",
        driver: "595.80",
        mig_enabled: None, // `[N/A]`: no MIG on L40S
        util_pct: Some(9.0),
        mem_used_mib: 1235.0,
        power_w: 110.23,
    },
];

const APPS_FILE: &str = "query-compute-apps-h100-80gb-hbm3-load.csv";
const APPS: &[(u32, &str, u64)] = &[
    (11327, "/root/tools/memhog", 2566),
    (11328, "/root/tools/memhog", 1542),
    (11345, "./gpu_burn", 15690),
];

#[test]
fn corpus_every_nvidia_smi_file_has_expectations() {
    let c = require_corpus!();
    let mut known: Vec<&str> = XML.iter().map(|e| e.file).collect();
    known.extend(CSV.iter().map(|e| e.file));
    known.push(APPS_FILE);
    for entry in std::fs::read_dir(c.join("nvidia-smi")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            known.contains(&name.as_str()),
            "corpus file {name} has no expectations in this test; add them"
        );
    }
}

#[test]
fn corpus_xml_gpus_mig_instances_and_processes() {
    let c = require_corpus!();
    for e in XML {
        let snap = smi_xml::parse(&read(&c, e.file), &[])
            .unwrap_or_else(|err| panic!("{}: {err}", e.file));
        assert_eq!(snap.gpus.len(), 1 + e.migs.len(), "{}", e.file);
        let g = &snap.gpus[0];
        let want = GpuReading {
            uuid: e.uuid.into(),
            model: Some(e.model.into()),
            memory_mib: Some(e.memory_mib),
            serial: e.serial.map(Into::into),
            pci_bus_id: Some(e.pci_bus_id.into()),
            driver_version: Some(e.driver.into()),
            cuda_version: Some(e.cuda.into()),
            mig_enabled: e.mig_enabled,
            mig_parent_uuid: None,
            mig_profile: None,
            card_vendor: None,
            util_pct: e.util_pct,
            mem_used_mib: Some(e.mem_used_mib),
            power_w: Some(e.power_w),
            sm_active: None, // nvidia-smi never reports SM activity
        };
        assert_eq!(g, &want, "{}", e.file);
        for (child, (gi, ci, mem, used)) in snap.gpus[1..].iter().zip(e.migs) {
            assert_eq!(
                child.uuid,
                format!("MIG-{}/{gi}/{ci}", e.uuid),
                "{}",
                e.file
            );
            assert_eq!(child.mig_parent_uuid.as_deref(), Some(e.uuid));
            assert_eq!(child.model.as_deref(), Some(e.model));
            assert_eq!(child.memory_mib, Some(*mem));
            assert_eq!(child.mem_used_mib, Some(*used));
            // Utilization and power are not reported per MIG instance: unknown, not 0.
            assert_eq!((child.util_pct, child.power_w), (None, None));
            assert_eq!(child.mig_profile, None, "-q -x does not name profiles");
        }
        let want: Vec<ProcessReading> = e
            .processes
            .iter()
            .map(|(pid, name, kind, mib)| ProcessReading {
                gpu_uuid: e.uuid.into(),
                pid: *pid,
                name: Some((*name).into()),
                process_type: Some((*kind).into()),
                used_memory_mib: Some(*mib),
            })
            .collect();
        let got = &snap.processes;
        assert_eq!(got, &want, "{}", e.file);
    }
}

#[test]
fn corpus_xml_mig_instances_take_uuids_and_profiles_from_nvidia_smi_list() {
    let c = require_corpus!();
    let e = &XML[0];
    // `nvidia-smi -L` as NVIDIA's MIG guide shows it; the corpus has no capture of it, so these
    // MIG UUIDs are made up for this test.
    let list = format!(
        "GPU 0: {} (UUID: {})\n\
         \x20 MIG 1g.20gb     Device  0: (UUID: MIG-00000000-0000-5000-8000-000000000000)\n\
         \x20 MIG 1g.20gb     Device  1: (UUID: MIG-00000000-0000-5000-8000-000000000001)\n\
         \x20 MIG 1g.20gb     Device  2: (UUID: MIG-00000000-0000-5000-8000-000000000002)\n\
         \x20 MIG 1g.20gb     Device  3: (UUID: MIG-00000000-0000-5000-8000-000000000003)\n",
        e.model, e.uuid
    );
    let listed = gpuledger_agent::source::smi_list::parse(&list);
    let snap = smi_xml::parse(&read(&c, e.file), &listed).unwrap();
    let children: Vec<(&str, Option<&str>, Option<u64>)> = snap.gpus[1..]
        .iter()
        .map(|g| (g.uuid.as_str(), g.mig_profile.as_deref(), g.memory_mib))
        .collect();
    assert_eq!(
        children,
        (0..4)
            .map(|i| {
                (
                    [
                        "MIG-00000000-0000-5000-8000-000000000000",
                        "MIG-00000000-0000-5000-8000-000000000001",
                        "MIG-00000000-0000-5000-8000-000000000002",
                        "MIG-00000000-0000-5000-8000-000000000003",
                    ][i],
                    Some("1g.20gb"),
                    Some(19968),
                )
            })
            .collect::<Vec<_>>()
    );
}

#[test]
fn corpus_csv_query_gpu_and_compute_apps() {
    let c = require_corpus!();
    for e in CSV {
        let gpus = smi_csv::parse_gpus(&read(&c, e.file))
            .unwrap_or_else(|err| panic!("{}: {err}", e.file));
        assert_eq!(
            gpus,
            vec![GpuReading {
                uuid: MASKED_UUID.into(),
                model: Some(e.model.into()),
                memory_mib: Some(e.memory_mib),
                serial: None, // masked to 0000000000000
                pci_bus_id: Some(e.pci_bus_id.into()),
                driver_version: Some(e.driver.into()),
                cuda_version: None, // --query-gpu has no CUDA version field
                mig_enabled: e.mig_enabled,
                mig_parent_uuid: None,
                mig_profile: None,
                card_vendor: None,
                util_pct: e.util_pct,
                mem_used_mib: Some(e.mem_used_mib),
                power_w: Some(e.power_w),
                sm_active: None,
            }],
            "{}",
            e.file
        );
    }
    let apps = smi_csv::parse_apps(&read(&c, APPS_FILE)).unwrap();
    let want: Vec<ProcessReading> = APPS
        .iter()
        .map(|(pid, name, mib)| ProcessReading {
            gpu_uuid: MASKED_UUID.into(),
            pid: *pid,
            name: Some((*name).into()),
            process_type: Some("C".into()),
            used_memory_mib: Some(*mib),
        })
        .collect();
    assert_eq!(apps, want);
}

// ---------------------------------------------------------------------------------------------
// corpus_* for AMD (`amd/rocm-smi-*.json`) and Intel Gaudi (`gaudi/`)

/// The host name the AMD and Gaudi corpus tests give: GPUs without a usable serial are named by
/// their PCI address on it.
const HOST: &str = "node-a";
const AMD_VENDOR: &str = "Advanced Micro Devices, Inc. [AMD/ATI]";
const MI100: &str = "Arcturus GL-XL [Instinct MI100]";

/// One GPU as a corpus file gives it.
struct AmdGpu {
    uuid: &'static str,
    model: Option<&'static str>,
    memory_mib: u64,
    serial: Option<&'static str>,
    pci_bus_id: Option<&'static str>,
    util_pct: f64,
    mem_used_mib: f64,
    power_w: f64,
}

struct AmdExpect {
    file: &'static str,
    driver: Option<&'static str>,
    vendor: &'static str,
    gpus: &'static [AmdGpu],
}

const fn mi100(uuid: &'static str, bus: &'static str, used: f64, power_w: f64) -> AmdGpu {
    AmdGpu {
        uuid,
        model: Some(MI100),
        memory_mib: 32752, // 34342961152 B
        serial: None,      // `N/A` or `0`
        pci_bus_id: Some(bus),
        util_pct: 0.0,
        mem_used_mib: used,
        power_w,
    }
}

const ROCM: &[AmdExpect] = &[
    AmdExpect {
        file: "rocm-smi-json-mi100-x4-rocm602.json",
        driver: Some("6.3.6"),
        vendor: AMD_VENDOR,
        // Serial `N/A`: named by the unique ID. 6750208 B used.
        gpus: &[
            mi100("AMD-UID-79ccd55167a2124a", "0000:83:00.0", 6.4375, 36.0),
            mi100("AMD-UID-4edfb117a17a07d", "0000:A3:00.0", 6.4375, 44.0),
            mi100("AMD-UID-d4a9ec48d03d261d", "0000:C3:00.0", 6.4375, 43.0),
            mi100("AMD-UID-1b9dd972253c3736", "0000:E3:00.0", 6.4375, 39.0),
        ],
    },
    AmdExpect {
        file: "rocm-smi-json-mi100-x6-rocm571-leading-blank-line.json",
        driver: Some("6.2.4"),
        vendor: AMD_VENDOR,
        // Serial `0`, unique ID `N/A`: named by the PCI address on the host. 6782976 B used.
        gpus: &[
            mi100("AMD-PCI-node-a-0000:1e:00.0", "0000:1E:00.0", 6.46875, 39.0),
            mi100("AMD-PCI-node-a-0000:22:00.0", "0000:22:00.0", 6.46875, 37.0),
            mi100("AMD-PCI-node-a-0000:3f:00.0", "0000:3F:00.0", 6.46875, 35.0),
            mi100("AMD-PCI-node-a-0000:43:00.0", "0000:43:00.0", 6.46875, 39.0),
            mi100("AMD-PCI-node-a-0000:46:00.0", "0000:46:00.0", 6.46875, 39.0),
            mi100("AMD-PCI-node-a-0000:49:00.0", "0000:49:00.0", 6.46875, 40.0),
        ],
    },
    AmdExpect {
        file: "rocm-smi-json-radeon-rx6700xt-rocm612.json",
        driver: Some("6.3.6"),
        vendor: AMD_VENDOR,
        gpus: &[AmdGpu {
            uuid: "AMD-PCI-node-a-0000:07:00.0",
            model: Some("Navi 22 [Radeon RX 6700/6700 XT / 6800M]"),
            memory_mib: 12272, // 12868124672 B
            serial: None,      // N/A
            pci_bus_id: Some("0000:07:00.0"),
            util_pct: 0.0,
            mem_used_mib: 1499.88671875, // 1572745216 B
            power_w: 6.0,
        }],
    },
    AmdExpect {
        file: "rocm-smi-json-mi50-32gb-vega20-2021.json",
        driver: Some("5.9.17"),
        vendor: AMD_VENDOR,
        gpus: &[AmdGpu {
            uuid: "AMD-SN-692024000810",
            model: Some("Radeon Instinct MI50 32GB"), // `Card series`, 2021 spelling
            memory_mib: 32752,
            serial: Some("692024000810"),
            pci_bus_id: Some("0000:63:00.0"),
            util_pct: 0.0,
            mem_used_mib: 10.34765625, // 10850304 B
            power_w: 26.0,
        }],
    },
    AmdExpect {
        file: "rocm-smi-json-radeon-rx7800xt-rocm624-few-fields.json",
        driver: None, // no `system` object
        vendor: AMD_VENDOR,
        gpus: &[AmdGpu {
            uuid: "AMD-UID-5c88007d760374f3",
            model: Some("Navi 32 [Radeon RX 7700 XT / 7800 XT]"),
            memory_mib: 16368, // 17163091968 B
            serial: None,
            pci_bus_id: None, // not asked for (`--showbus` missing from that query)
            util_pct: 100.0,
            mem_used_mib: 11077.0, // 11615076352 B
            power_w: 53.0,
        }],
    },
    AmdExpect {
        file: "rocm-smi-json-hygon-dcu-masked-empty-key.json",
        driver: None,
        vendor: "Chengdu Haiguang IC Design Co., Ltd.",
        gpus: &[AmdGpu {
            uuid: "AMD-UID-7100fa8866904061", // serial masked (`TPXxxxx`): the unique ID
            model: None,                      // masked (`DCU xxxx`)
            memory_mib: 65520,                // `vram Total Memory (MiB)`
            serial: None,
            pci_bus_id: None,
            util_pct: 0.0, // `DCU use (%)`
            mem_used_mib: 2.0,
            power_w: 80.0,
        }],
    },
];

fn amd_file(c: &Path, name: &str) -> PathBuf {
    c.join("amd").join(name)
}

#[test]
fn corpus_every_rocm_smi_file_has_expectations() {
    let c = require_corpus!("amd");
    let known: Vec<&str> = ROCM.iter().map(|e| e.file).collect();
    let mut seen = 0;
    for entry in std::fs::read_dir(c.join("amd")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with("rocm-smi-") {
            seen += 1;
            assert!(
                known.contains(&name.as_str()),
                "corpus file {name} has no expectations in this test; add them"
            );
        }
    }
    assert_eq!(seen, ROCM.len());
}

#[test]
fn corpus_rocm_smi_json_gpus_field_by_field() {
    let c = require_corpus!("amd");
    for e in ROCM {
        let text = std::fs::read_to_string(amd_file(&c, e.file)).unwrap();
        let snap = rocm_smi::parse(&text, Some(""), Some(HOST))
            .unwrap_or_else(|err| panic!("{}: {err}", e.file));
        let want: Vec<GpuReading> = e
            .gpus
            .iter()
            .map(|g| GpuReading {
                uuid: g.uuid.into(),
                model: g.model.map(Into::into),
                memory_mib: Some(g.memory_mib),
                serial: g.serial.map(Into::into),
                pci_bus_id: g.pci_bus_id.map(Into::into),
                driver_version: e.driver.map(Into::into),
                cuda_version: None,
                mig_enabled: None,
                mig_parent_uuid: None,
                mig_profile: None,
                card_vendor: Some(e.vendor.into()),
                util_pct: Some(g.util_pct),
                mem_used_mib: Some(g.mem_used_mib),
                power_w: Some(g.power_w),
                sm_active: None,
            })
            .collect();
        assert_eq!(snap.gpus, want, "{}", e.file);
        assert!(
            snap.processes.is_empty() && !snap.processes_failed,
            "{}",
            e.file
        );
    }
}

#[test]
fn corpus_rocm_smi_processes_and_unknown_identities() {
    let c = require_corpus!("amd");
    // The 6-card file's `system` holds `"PID104225": "mlir-cpu-runner, 0, 0, 0, 0"`: a process
    // using no GPU (0 in the GPU count), as `--showpidgpus` would say too.
    let six = std::fs::read_to_string(amd_file(&c, ROCM[1].file)).unwrap();
    let snap = rocm_smi::parse(
        &six,
        Some("PID 104225 is using 0 DRM device(s)\n"),
        Some(HOST),
    )
    .unwrap();
    assert!(snap.processes.is_empty() && !snap.processes_failed);
    // Had it used card 2, it would be on that card, named from `--showpids`.
    let snap = rocm_smi::parse(
        &six,
        Some("PID 104225 is using 1 DRM device(s):\n2\n"),
        Some(HOST),
    )
    .unwrap();
    assert_eq!(
        snap.processes,
        vec![ProcessReading {
            gpu_uuid: "AMD-PCI-node-a-0000:3f:00.0".into(),
            pid: 104225,
            name: Some("mlir-cpu-runner".into()),
            process_type: Some("C".into()),
            used_memory_mib: Some(0),
        }]
    );
    // Without `--showpidgpus` the process list is unknown, not empty.
    assert!(
        rocm_smi::parse(&six, None, Some(HOST))
            .unwrap()
            .processes_failed
    );
    // Without a host name, a GPU that only its PCI address names cannot be told apart: left
    // out rather than given a made-up identity.
    assert!(rocm_smi::parse(&six, Some(""), None)
        .unwrap()
        .gpus
        .is_empty());
    let x4 = std::fs::read_to_string(amd_file(&c, ROCM[0].file)).unwrap();
    assert_eq!(rocm_smi::parse(&x4, Some(""), None).unwrap().gpus.len(), 4);
}

/// One Gaudi as a corpus table gives it: (bus, power W, MiB used).
type Gaudi = (&'static str, f64, f64);

struct GaudiExpect {
    file: &'static str,
    model: &'static str,
    driver: &'static str,
    memory_mib: u64,
    gpus: &'static [Gaudi],
    /// (bus of its Gaudi, pid, name, MiB); `None`: the table has no process section.
    processes: Option<&'static [(&'static str, u32, &'static str, u64)]>,
}

const GAUDI: &[GaudiExpect] = &[
    GaudiExpect {
        file: "hl-smi-table-8x-gaudi2-hl225-1.20.0-busy-with-process-row.txt",
        model: "HL-225",
        driver: "1.19.1-6f47ddd",
        memory_mib: 98304,
        gpus: &[
            ("0000:9a:00.0", 96.0, 768.0),
            ("0000:9b:00.0", 78.0, 768.0),
            ("0000:b3:00.0", 81.0, 768.0),
            ("0000:b4:00.0", 92.0, 96565.0),
            ("0000:33:00.0", 83.0, 768.0),
            ("0000:4e:00.0", 80.0, 96564.0),
            ("0000:34:00.0", 86.0, 768.0),
            ("0000:4d:00.0", 100.0, 17538.0),
        ],
        // AIP 7's row has no closing `|`.
        processes: Some(&[("0000:4d:00.0", 107684, "ray::_RayTrainW", 16770)]),
    },
    GaudiExpect {
        file: "hl-smi-table-8x-gaudi2-hl225-1.22.1-idle-perf-P0.txt",
        model: "HL-225",
        driver: "1.22.1-97ec1a4",
        memory_mib: 98304,
        gpus: &[
            ("0000:33:00.0", 88.0, 768.0),
            ("0000:9a:00.0", 83.0, 768.0),
            ("0000:34:00.0", 94.0, 768.0),
            ("0000:4d:00.0", 80.0, 768.0),
            ("0000:4e:00.0", 73.0, 768.0),
            ("0000:9b:00.0", 87.0, 768.0),
            ("0000:b3:00.0", 91.0, 768.0),
            ("0000:b4:00.0", 90.0, 768.0),
        ],
        processes: Some(&[]),
    },
    GaudiExpect {
        file: "hl-smi-table-gaudi2-hl225-1.15.1-1-device-processes.txt",
        model: "HL-225",
        driver: "1.15.1-62f612b",
        memory_mib: 98304,
        gpus: &[("0000:19:00.0", 93.0, 768.0)],
        processes: Some(&[]),
    },
    GaudiExpect {
        // Two logged tables: the second (768 MiB used, 81 W) counts, not the first (24065 MiB).
        file: "hl-smi-table-gaudi2-hl225-1.18.0-spdlog-prefixed-2-snapshots.log",
        model: "HL-225",
        driver: "1.18.0-ee698fb",
        memory_mib: 98304,
        gpus: &[("0000:4d:00.0", 81.0, 768.0)],
        processes: Some(&[]),
    },
    GaudiExpect {
        // `672MiB / 131072MiB` pushes its cell's `|` one column right.
        file: "hl-smi-table-gaudi3-hl325-1.18.0-overflowing-memory-column.txt",
        model: "HL-325",
        driver: "1.18.0-ee698fb",
        memory_mib: 131072,
        gpus: &[("0000:21:00.0", 264.0, 672.0)],
        processes: None,
    },
];

fn gaudi_uuid_on(bus: &str) -> String {
    format!("HL-PCI-{HOST}-{bus}")
}

#[test]
fn corpus_every_gaudi_file_has_expectations() {
    let c = require_corpus!("gaudi");
    let known: Vec<&str> = GAUDI.iter().map(|e| e.file).collect();
    for entry in std::fs::read_dir(c.join("gaudi")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            known.contains(&name.as_str()),
            "corpus file {name} has no expectations in this test; add them"
        );
    }
}

#[test]
fn corpus_hl_smi_tables_field_by_field() {
    let c = require_corpus!("gaudi");
    for e in GAUDI {
        let text = std::fs::read_to_string(c.join("gaudi").join(e.file)).unwrap();
        let snap: Snapshot = hl_smi::parse_table(&text, Some(HOST))
            .unwrap_or_else(|err| panic!("{}: {err}", e.file));
        let want: Vec<GpuReading> = e
            .gpus
            .iter()
            .map(|(bus, power, used)| GpuReading {
                // The table gives no serial or UUID: named by the PCI address on the host.
                uuid: gaudi_uuid_on(bus),
                model: Some(e.model.into()),
                memory_mib: Some(e.memory_mib),
                serial: None,
                pci_bus_id: Some((*bus).into()),
                driver_version: Some(e.driver.into()),
                cuda_version: None,
                mig_enabled: None,
                mig_parent_uuid: None,
                mig_profile: None,
                card_vendor: None,
                util_pct: Some(0.0), // AIP-Util 0% on every card of every file
                mem_used_mib: Some(*used),
                power_w: Some(*power),
                sm_active: None,
            })
            .collect();
        assert_eq!(snap.gpus, want, "{}", e.file);
        match e.processes {
            None => assert!(snap.processes_failed, "{}: unknown, not none", e.file),
            Some(p) => {
                assert!(!snap.processes_failed, "{}", e.file);
                let want: Vec<ProcessReading> = p
                    .iter()
                    .map(|(bus, pid, name, mib)| ProcessReading {
                        gpu_uuid: gaudi_uuid_on(bus),
                        pid: *pid,
                        name: Some((*name).into()),
                        process_type: Some("C".into()),
                        used_memory_mib: Some(*mib),
                    })
                    .collect();
                assert_eq!(snap.processes, want, "{}", e.file);
            }
        }
    }
}

#[test]
fn corpus_hl_smi_table_processes_join_csv_gaudis_by_pci_address() {
    let c = require_corpus!("gaudi");
    let e = &GAUDI[0];
    let table = std::fs::read_to_string(c.join("gaudi").join(e.file)).unwrap();
    // The corpus has no `hl-smi -Q` capture: this CSV is written for the test, with the
    // documented field names and the buses of the table (serials made up).
    let mut csv = String::from(
        "index, name, bus_id, serial, uuid, driver_version, utilization.aip [%], \
         memory.total [MiB], memory.used [MiB], power.draw [W]\n",
    );
    for (i, (bus, power, used)) in e.gpus.iter().enumerate() {
        csv.push_str(&format!(
            "{i}, HL-225, {bus}, AN1000{i}, N/A, {}, 0, 98304, {used}, {power}\n",
            e.driver
        ));
    }
    let gpus = hl_smi::parse_csv(&csv, Some(HOST)).unwrap();
    assert_eq!(gpus[7].uuid, "HL-SN-AN10007");
    let procs = hl_smi::processes_from_table(&gpus, &table).unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(
        (procs[0].gpu_uuid.as_str(), procs[0].pid),
        ("HL-SN-AN10007", 107684)
    );
    // The overflowing Gaudi 3 table has no process section: unknown.
    let g3 = std::fs::read_to_string(c.join("gaudi").join(GAUDI[4].file)).unwrap();
    assert_eq!(hl_smi::processes_from_table(&gpus, &g3), None);
}

// ---------------------------------------------------------------------------------------------
// robust_*: mutated corpus bytes never panic a parser

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

fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut b = input.to_vec();
    const INSERTS: &[&[u8]] = &[
        b"<",
        b">",
        b"</gpu>",
        b"<gpu>",
        b"&amp;",
        b"&#0;",
        b"&bogus;",
        b"[N/A]",
        b"9223372036854775794",
        b"-1",
        b"\"",
        b",",
        b"\n",
        b"\xff\xfe",
        b"1e309",
    ];
    for _ in 0..1 + rng.below(8) {
        if b.is_empty() {
            break;
        }
        let at = rng.below(b.len());
        match rng.below(5) {
            0 => b[at] = rng.next() as u8,
            1 => b.truncate(at),
            2 => {
                let s = INSERTS[rng.below(INSERTS.len())];
                b.splice(at..at, s.iter().copied());
            }
            3 => {
                let end = (at + rng.below(200)).min(b.len());
                b.drain(at..end);
            }
            _ => {
                let end = (at + rng.below(200)).min(b.len());
                let chunk = b[at..end].to_vec();
                let to = rng.below(b.len());
                b.splice(to..to, chunk);
            }
        }
    }
    b
}

#[test]
fn robust_mutated_corpus_never_panics_a_parser() {
    let c = require_corpus!();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut runs = 0;
    for entry in std::fs::read_dir(c.join("nvidia-smi")).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        for _ in 0..150 {
            let m = mutate(&mut rng, &bytes);
            let text = String::from_utf8_lossy(&m);
            // Results may be errors; what matters is no panic and no nonsense values.
            for snap in smi_xml::parse(&text, &[]).into_iter() {
                for g in &snap.gpus {
                    assert!(g.util_pct.is_none_or(|v| (0.0..=100.0).contains(&v)));
                    assert!(g.power_w.is_none_or(|v| (0.0..=10_000.0).contains(&v)));
                }
            }
            for gpus in smi_csv::parse_gpus(&text).into_iter() {
                for g in &gpus {
                    assert!(g.util_pct.is_none_or(|v| (0.0..=100.0).contains(&v)));
                }
            }
            let _ = smi_csv::parse_apps(&text);
            let _ = gpuledger_agent::source::smi_list::parse(&text);
            runs += 1;
        }
    }
    assert!(runs > 0);
}

#[test]
fn robust_mutated_amd_and_gaudi_corpus_never_panics_a_parser() {
    let c = require_corpus!("amd");
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut runs = 0;
    let in_range = |g: &GpuReading| {
        assert!(
            g.util_pct.is_none_or(|v| (0.0..=100.0).contains(&v)),
            "{g:?}"
        );
        assert!(
            g.power_w.is_none_or(|v| (0.0..=10_000.0).contains(&v)),
            "{g:?}"
        );
        assert!(!g.uuid.is_empty());
    };
    for sub in ["amd", "gaudi"] {
        let Ok(dir) = std::fs::read_dir(c.join(sub)) else {
            continue;
        };
        for entry in dir {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            for _ in 0..150 {
                let m = mutate(&mut rng, &bytes);
                let text = String::from_utf8_lossy(&m);
                let pids = Some("PID 1 is using 2 DRM device(s):\n0 1\n");
                if let Ok(snap) = rocm_smi::parse(&text, pids, Some(HOST)) {
                    snap.gpus.iter().for_each(in_range);
                }
                if let Ok(snap) =
                    gpuledger_agent::source::amd_smi::parse(&text, &text, Some(&text), None)
                {
                    snap.gpus.iter().for_each(in_range);
                }
                if let Ok(snap) = hl_smi::parse_table(&text, Some(HOST)) {
                    snap.gpus.iter().for_each(in_range);
                }
                if let Ok(gpus) = hl_smi::parse_csv(&text, Some(HOST)) {
                    gpus.iter().for_each(in_range);
                    let _ = hl_smi::processes_from_table(&gpus, &text);
                }
                runs += 1;
            }
        }
    }
    assert!(runs > 0);
}

// ---------------------------------------------------------------------------------------------
// e2e_*: the real agent binary, a fake nvidia-smi, a real server

#[test]
fn e2e_xml_files_appear_through_the_query_api_with_their_attributes() {
    let c = require_corpus!();
    let tmp = TempDir::new("e2e-xml");
    let bin = fake_smi(&tmp.0);
    let (proc_root, passwd) = fake_proc(&tmp.0);
    let server = Server::start(&tmp.0.join("g.db"), 0);
    let token = server.token("gpu-hosts");
    // Where a real driver is present, `auto` would rightly pick NVML and read the real GPUs.
    let auto = !nvml_here();
    for (i, e) in XML.iter().enumerate() {
        let out = agent(&bin)
            .args(["--source", if auto { "auto" } else { "smi-xml" }])
            .args(["--once", "--server", &server.base(), "--token", &token])
            .args(["--host", &format!("node-{i}"), "--cluster", "lab"])
            .args(["--label", "team=ml", "--label", "env=prod"])
            .arg("--buffer-dir")
            .arg(tmp.0.join(format!("buf-{i}")))
            .arg("--proc-root")
            .arg(&proc_root)
            .arg("--passwd-file")
            .arg(&passwd)
            .env("FAKE_SMI_XML", smi_file(&c, e.file))
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {log}", e.file);
        // The log says which source was used, and why NVML was not.
        assert!(!auto || log.contains("NVML not usable"), "{log}");
        assert!(
            log.contains("reading GPUs through `nvidia-smi -q -x`"),
            "{log}"
        );
    }
    let list = get_json(&server.base(), "/api/v1/gpus?include_mig=true");
    let items = list["items"].as_array().unwrap();
    let n: usize = XML.iter().map(|e| 1 + e.migs.len()).sum();
    assert_eq!(items.len(), n, "{list}");
    for (i, e) in XML.iter().enumerate() {
        let g = items.iter().find(|g| g["uuid"] == e.uuid).unwrap();
        assert_eq!(g["model"], e.model);
        assert_eq!(g["memory_mib"], e.memory_mib);
        assert_eq!(g["serial"].as_str(), e.serial);
        assert_eq!(g["pci_bus_id"], e.pci_bus_id);
        assert_eq!(g["host"], format!("node-{i}"));
        assert_eq!(g["cluster"], "lab");
        assert_eq!(g["team"], "ml");
        assert_eq!(g["env"], "prod");
        assert_eq!(g["state"], "present");
        assert_eq!(g["labels"]["driver_version"], e.driver);
        assert_eq!(g["labels"]["cuda_version"], e.cuda);
        assert!(g["mig_parent_uuid"].is_null());
        for (gi, ci, mem, _) in e.migs {
            let uuid = format!("MIG-{}/{gi}/{ci}", e.uuid);
            let m = items.iter().find(|g| g["uuid"] == uuid.as_str()).unwrap();
            assert_eq!(m["mig_parent_uuid"], e.uuid);
            assert_eq!(m["memory_mib"], *mem);
        }
        let d = get_json(
            &server.base(),
            &format!("/api/v1/gpus/{}?{}", e.uuid, window()),
        );
        let hours = d["hours"].as_array().unwrap();
        assert_eq!(
            hours
                .iter()
                .map(|h| h["samples"].as_i64().unwrap())
                .sum::<i64>(),
            1
        );
        let hour = hours.last().unwrap();
        // Unknown stays unknown: the MIG A100 reports no utilization, so its hour has no
        // activity, while the others report 0 %, which is known.
        match e.util_pct {
            None => assert!(hour["activity_pct"].is_null(), "{}: {hour}", e.file),
            Some(u) => assert_eq!(hour["activity_pct"].as_f64(), Some(u), "{}", e.file),
        }
        assert_eq!(hour["power_w_avg"].as_f64(), Some(e.power_w));
        let allocs = d["allocations"].as_array().unwrap();
        let compute: Vec<u32> = e
            .processes
            .iter()
            .filter(|p| p.2.contains('C'))
            .map(|p| p.0)
            .collect();
        assert_eq!(allocs.len(), compute.len(), "{}: {allocs:?}", e.file);
        for a in allocs {
            assert_eq!(a["kind"], "process");
            assert!(a["end"].is_null());
            assert_eq!(a["source"], "gpu-hosts");
        }
    }
    // The T4's python process: user, pod and container from the (fake) /proc, start from boot
    // time plus its start ticks.
    let d = get_json(
        &server.base(),
        &format!("/api/v1/gpus/{}?{}", XML[1].uuid, window()),
    );
    let a = &d["allocations"][0];
    assert_eq!(
        a["workload"],
        format!("python pid=5762 pod={POD} container={}", &CONTAINER[..12])
    );
    assert_eq!(a["user"], "alice");
    let start = chrono::DateTime::from_timestamp(BTIME + 3600, 0).unwrap();
    assert_eq!(a["start"], serde_json::to_value(start).unwrap());
    let sources = get_json(&server.base(), "/api/v1/sources");
    let s = sources["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "gpu-hosts")
        .unwrap();
    assert_eq!(s["kind"], "agent");
    assert_eq!(s["status"], "ok");
    server.stop();
}

#[test]
fn e2e_csv_source_reports_gpu_and_processes() {
    let c = require_corpus!();
    let tmp = TempDir::new("e2e-csv");
    let bin = fake_smi(&tmp.0);
    let server = Server::start(&tmp.0.join("g.db"), 0);
    let token = server.token("csv-hosts");
    let out = agent(&bin)
        .args([
            "--once",
            "--source",
            "smi-csv",
            "--server",
            &server.base(),
            "--token",
            &token,
        ])
        .args(["--host", "h100-node"])
        .arg("--buffer-dir")
        .arg(tmp.0.join("buf"))
        .arg("--proc-root")
        .arg(tmp.0.join("no-proc"))
        .env(
            "FAKE_SMI_CSV",
            smi_file(&c, "query-gpu-full-h100-80gb-hbm3-load.csv"),
        )
        .env("FAKE_SMI_APPS", smi_file(&c, APPS_FILE))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("reading GPUs through `nvidia-smi --query-gpu --format=csv`"),
        "{log}"
    );
    let d = get_json(
        &server.base(),
        &format!("/api/v1/gpus/{MASKED_UUID}?{}", window()),
    );
    assert_eq!(d["model"], "NVIDIA H100 80GB HBM3");
    assert_eq!(d["memory_mib"], 81559);
    assert_eq!(d["host"], "h100-node");
    assert!(d["serial"].is_null(), "a zero serial is unknown");
    assert_eq!(
        d["hours"].as_array().unwrap().last().unwrap()["activity_pct"],
        100.0
    );
    let mut workloads: Vec<String> = d["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["workload"].as_str().unwrap().to_string())
        .collect();
    workloads.sort();
    assert_eq!(
        workloads,
        [
            "./gpu_burn pid=11345",
            "/root/tools/memhog pid=11327",
            "/root/tools/memhog pid=11328"
        ]
    );
    server.stop();
}

#[test]
fn e2e_once_dry_run_prints_exactly_the_body_and_the_server_accepts_it_as_is() {
    let c = require_corpus!();
    let tmp = TempDir::new("e2e-dry");
    let bin = fake_smi(&tmp.0);
    let out = agent(&bin)
        .args(["--once", "--dry-run", "--host", "n1", "--no-processes"])
        .args(["--source", "smi-xml"])
        .arg("--buffer-dir")
        .arg(tmp.0.join("never"))
        .env("FAKE_SMI_XML", smi_file(&c, "tesla-t4.xml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one body, one line: {stdout}");
    let body: PushBody = serde_json::from_str(&stdout).unwrap();
    assert_eq!(body.gpus.len(), 1);
    assert_eq!(body.gpus[0].uuid, XML[1].uuid);
    assert_eq!(body.samples[0].util_pct, Some(0.0));
    assert!(body.allocations.is_empty());
    assert!(!tmp.0.join("never").exists(), "a dry run writes nothing");

    let server = Server::start(&tmp.0.join("g.db"), 0);
    let token = server.token("dry");
    let mut resp = http()
        .post(format!("{}/api/v1/ingest", server.base()))
        .header("Authorization", &format!("Bearer {token}"))
        .header("Content-Type", "application/json")
        .send(stdout.trim())
        .unwrap();
    let reply: Value = serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(reply["accepted"]["gpus"], 1, "{reply}");
    assert_eq!(reply["accepted"]["samples"], 1, "{reply}");
    assert_eq!(reply["rejected"], serde_json::json!([]));
    server.stop();
}

/// Recorded on a real NVIDIA H200 (driver 580.159.04, CUDA 13.0; `scripts/real-gpu-check.sh`,
/// files in `tests/data/h200`): the agent's body read through NVML there, and that host's
/// `nvidia-smi -q -x` of the same second. Replayed here through a fake `nvidia-smi`, the
/// `smi-xml` reader must report the GPU NVML reported: same identity, attributes and labels,
/// and the same readings to nvidia-smi's rounding.
#[test]
fn recorded_h200_smi_xml_reader_reports_what_nvml_reported() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/h200");
    let nvml: PushBody =
        serde_json::from_str(&std::fs::read_to_string(data.join("agent-nvml.json")).unwrap())
            .unwrap();
    let tmp = TempDir::new("h200");
    let bin = fake_smi(&tmp.0);
    let out = agent(&bin)
        .args(["--once", "--dry-run", "--host", "vm", "--no-processes"])
        .args(["--source", "smi-xml", "--no-cloud-metadata"])
        .arg("--buffer-dir")
        .arg(tmp.0.join("never"))
        .env("FAKE_SMI_XML", data.join("nvidia-smi-q.xml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let xml: PushBody = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((xml.gpus.len(), nvml.gpus.len()), (1, 1));
    let (a, b) = (&xml.gpus[0], &nvml.gpus[0]);
    assert_eq!(a.uuid, "GPU-05e118fe-42ae-2501-75e3-1b1d6de5d65a");
    assert_eq!(
        (&a.uuid, &a.model, a.memory_mib, &a.serial, &a.pci_bus_id),
        (&b.uuid, &b.model, b.memory_mib, &b.serial, &b.pci_bus_id)
    );
    assert_eq!(a.model, "NVIDIA H200");
    assert_eq!(a.memory_mib, Some(143_771));
    assert_eq!(a.mig_parent_uuid, None);
    assert_eq!(a.labels, b.labels, "driver, CUDA and MIG mode labels");
    let (x, n) = (&xml.samples[0], &nvml.samples[0]);
    assert_eq!((x.util_pct, n.util_pct), (Some(0.0), Some(0.0)));
    assert_eq!((x.mem_used_mib, n.mem_used_mib), (Some(0.0), Some(0.0)));
    let (px, pn) = (x.power_w.unwrap(), n.power_w.unwrap());
    assert!(
        (px - pn).abs() < 0.1,
        "power {px} W by nvidia-smi, {pn} W by NVML"
    );
}

/// Issue 19: a body the server refuses whole (422: no record could be kept, here because the
/// server's clock is a day behind and every reading is "in the future") is logged and dropped,
/// never retried, and `--once` exits non-zero.
#[test]
fn e2e_once_with_every_record_refused_logs_drops_and_fails() {
    let c = require_corpus!();
    let tmp = TempDir::new("e2e-422");
    let bin = fake_smi(&tmp.0);
    let server = Server::start_at(&tmp.0.join("g.db"), 0, chrono::Duration::days(1));
    let token = server.token("skewed");
    let buf = tmp.0.join("buf");
    let started = Instant::now();
    let out = agent(&bin)
        .args(["--once", "--server", &server.base(), "--token", &token])
        .args([
            "--source",
            "smi-xml",
            "--no-processes",
            "--retry-max-secs",
            "1",
        ])
        .arg("--buffer-dir")
        .arg(&buf)
        .env("FAKE_SMI_XML", smi_file(&c, "a10g.xml"))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("status=422"), "{log}");
    assert!(
        log.contains("is in the future"),
        "the reasons are logged: {log}"
    );
    assert!(log.contains("refused 1 bodies for good"), "{log}");
    assert!(
        buffered(&buf).is_empty(),
        "the refused body is dropped, not retried"
    );
    assert!(started.elapsed() < Duration::from_secs(30), "no retry loop");
    assert_eq!(get_json(&server.base(), "/api/v1/gpus")["count"], 0);
    server.stop();
}

#[test]
fn e2e_once_with_the_server_down_fails_loudly_and_keeps_the_body() {
    let c = require_corpus!();
    let tmp = TempDir::new("e2e-down");
    let bin = fake_smi(&tmp.0);
    // A port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let buf = tmp.0.join("buf");
    let out = agent(&bin)
        .args([
            "--once",
            "--source",
            "smi-xml",
            "--token",
            "t",
            "--retry-max-secs",
            "1",
            "--no-processes",
        ])
        .args(["--server", &format!("http://127.0.0.1:{port}")])
        .arg("--buffer-dir")
        .arg(&buf)
        .env("FAKE_SMI_XML", smi_file(&c, "a10g.xml"))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(log.contains("stays in"), "{log}");
    assert_eq!(
        buffered(&buf).len(),
        1,
        "the unsent body waits in the buffer"
    );
}

// ---------------------------------------------------------------------------------------------
// e2e_* on AMD and Gaudi hosts: fake `rocm-smi`, `amd-smi`, `hl-smi`

/// Fake `rocm-smi`, `amd-smi` and `hl-smi` in `<dir>/vendor-bin`, printing the files named by
/// environment variables: `FAKE_ROCM_JSON` (the `--json` read), `FAKE_ROCM_PIDGPUS`
/// (`--showpidgpus`); `FAKE_AMD_STATIC`, `FAKE_AMD_METRIC`, `FAKE_AMD_PROCESS` (the `static`,
/// `metric` and `process` reads); `FAKE_HL_CSV` (`-Q`) and `FAKE_HL_TABLE` (plain `hl-smi`).
/// Without its variable a tool fails as it does on a host without that vendor's devices. With
/// `FAKE_TOOL_LOG` each run appends its command line to that file.
fn fake_vendor_tools(dir: &Path) -> PathBuf {
    let bin = dir.join("vendor-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = r#"[ -n "$FAKE_TOOL_LOG" ] && echo "$(basename "$0") $*" >> "$FAKE_TOOL_LOG""#;
    let scripts = [
        (
            "rocm-smi",
            r#"case "$1" in
  --showpidgpus) [ -n "$FAKE_ROCM_PIDGPUS" ] || { echo "fake rocm-smi: no FAKE_ROCM_PIDGPUS" >&2; exit 9; }
    cat "$FAKE_ROCM_PIDGPUS" ;;
  *) [ -n "$FAKE_ROCM_JSON" ] || { echo "fake rocm-smi: ERROR: GPU[0] : no AMD GPU" >&2; exit 9; }
    cat "$FAKE_ROCM_JSON" ;;
esac"#,
        ),
        (
            "amd-smi",
            r#"case "$1" in
  static) f="$FAKE_AMD_STATIC" ;;
  metric) f="$FAKE_AMD_METRIC" ;;
  process) f="$FAKE_AMD_PROCESS" ;;
  *) f="" ;;
esac
[ -n "$f" ] || { echo "fake amd-smi: AMDSMI_STATUS_INIT_ERROR" >&2; exit 1; }
cat "$f""#,
        ),
        (
            "hl-smi",
            r#"if [ "$1" = "-Q" ]; then
  [ -n "$FAKE_HL_CSV" ] || { echo "fake hl-smi: -Q is not supported here" >&2; exit 2; }
  cat "$FAKE_HL_CSV"; exit 0
fi
[ -n "$FAKE_HL_TABLE" ] || { echo "fake hl-smi: no Gaudi device" >&2; exit 9; }
cat "$FAKE_HL_TABLE""#,
        ),
    ];
    for (name, body) in scripts {
        let script = bin.join(name);
        std::fs::write(&script, format!("#!/bin/sh\n{log}\n{body}\n")).unwrap();
        Command::new("chmod")
            .arg("+x")
            .arg(&script)
            .status()
            .unwrap();
    }
    bin
}

/// `--once --dry-run` with the fake vendor tools; the body printed and the log.
fn dry_run(bin: &Path, tmp: &Path, args: &[&str], env: &[(&str, PathBuf)]) -> (PushBody, String) {
    let mut cmd = agent(bin);
    cmd.args(["--once", "--dry-run", "--no-cloud-metadata"])
        .args(args)
        .arg("--buffer-dir")
        .arg(tmp.join("never"))
        .arg("--proc-root")
        .arg(tmp.join("no-proc"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{log}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one body, one line: {stdout}");
    (serde_json::from_str(&stdout).unwrap(), log)
}

#[test]
fn e2e_amd_host_falls_back_to_rocm_smi_and_dry_run_prints_its_gpus() {
    let c = require_corpus!("amd");
    let tmp = TempDir::new("e2e-amd");
    let bin = fake_vendor_tools(&tmp.0);
    let tool_log = tmp.0.join("tools.log");
    let (body, log) = dry_run(
        &bin,
        &tmp.0,
        &["--host", "amd-node"],
        &[
            ("FAKE_ROCM_JSON", amd_file(&c, ROCM[0].file)),
            ("FAKE_TOOL_LOG", tool_log.clone()),
        ],
    );
    // amd-smi fails here, so `auto` falls back to rocm-smi and says why.
    assert!(log.contains("`amd-smi` not usable"), "{log}");
    assert!(log.contains("AMDSMI_STATUS_INIT_ERROR"), "{log}");
    assert!(
        log.contains("reading GPUs through `rocm-smi --json`"),
        "{log}"
    );
    let amd: Vec<_> = body
        .gpus
        .iter()
        .filter(|g| g.uuid.starts_with("AMD-"))
        .collect();
    let want: Vec<&str> = ROCM[0].gpus.iter().map(|g| g.uuid).collect();
    assert_eq!(
        amd.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>(),
        want
    );
    for g in &amd {
        assert_eq!(g.model, MI100);
        assert_eq!(g.memory_mib, Some(32752));
        assert_eq!(g.host.as_deref(), Some("amd-node"));
        assert_eq!(g.labels["driver_version"], "6.3.6");
        assert_eq!(g.labels["card_vendor"], AMD_VENDOR);
        assert!(g.serial.is_none(), "`N/A` is no serial");
    }
    let samples: Vec<_> = body
        .samples
        .iter()
        .filter(|s| s.gpu_uuid.starts_with("AMD-"))
        .collect();
    assert_eq!(samples.len(), 4);
    assert!(
        samples.iter().all(|s| s.util_pct == Some(0.0)),
        "0 % is known"
    );
    assert_eq!(samples[0].power_w, Some(36.0));
    assert_eq!(samples[0].mem_used_mib, Some(6.4375));
    assert!(samples.iter().all(|s| s.sm_active.is_none()));
    assert!(body.allocations.is_empty());
    // The JSON read asks for what the parser reads; no process in it, so no `--showpidgpus`.
    let runs = std::fs::read_to_string(&tool_log).unwrap();
    assert!(
        runs.contains("rocm-smi --showid --showproductname --showserial --showuniqueid --showbus \
                       --showuse --showmeminfo vram --showpower --showdriverversion --showpids --json"),
        "{runs}"
    );
    assert!(!runs.contains("--showpidgpus"), "{runs}");
}

#[test]
fn e2e_gaudi_host_reads_the_hl_smi_table_when_the_csv_query_fails() {
    let c = require_corpus!("gaudi");
    let tmp = TempDir::new("e2e-gaudi");
    let bin = fake_vendor_tools(&tmp.0);
    let e = &GAUDI[0];
    let (body, log) = dry_run(
        &bin,
        &tmp.0,
        &["--host", "gaudi-node"],
        &[("FAKE_HL_TABLE", c.join("gaudi").join(e.file))],
    );
    assert!(log.contains("`hl-smi -Q` not usable"), "{log}");
    assert!(log.contains("-Q is not supported here"), "{log}");
    let gaudis: Vec<_> = body
        .gpus
        .iter()
        .filter(|g| g.uuid.starts_with("HL-"))
        .collect();
    assert_eq!(gaudis.len(), 8);
    for (g, (bus, _, _)) in gaudis.iter().zip(e.gpus) {
        assert_eq!(g.uuid, format!("HL-PCI-gaudi-node-{bus}"));
        assert_eq!(g.model, "HL-225");
        assert_eq!(g.memory_mib, Some(98304));
        assert_eq!(g.pci_bus_id.as_deref(), Some(*bus));
        assert_eq!(g.labels["driver_version"], "1.19.1-6f47ddd");
    }
    let used: Vec<Option<f64>> = body.samples.iter().map(|s| s.mem_used_mib).collect();
    assert_eq!(
        used,
        e.gpus.iter().map(|(_, _, u)| Some(*u)).collect::<Vec<_>>()
    );
    assert!(body.samples.iter().all(|s| s.util_pct == Some(0.0)));
    assert_eq!(body.samples[7].power_w, Some(100.0));
    // The process row without its closing bar becomes an allocation on AIP 7's Gaudi.
    assert_eq!(body.allocations.len(), 1, "{:?}", body.allocations);
    let a = &body.allocations[0];
    assert_eq!(a.gpu_uuid, "HL-PCI-gaudi-node-0000:4d:00.0");
    assert_eq!(a.workload, "ray::_RayTrainW pid=107684");
    assert!(a.end.is_none());
}

#[test]
fn e2e_gaudi_csv_query_names_gaudis_by_serial_and_takes_processes_from_the_table() {
    let c = require_corpus!("gaudi");
    let tmp = TempDir::new("e2e-gaudi-csv");
    let bin = fake_vendor_tools(&tmp.0);
    let e = &GAUDI[0];
    // No `hl-smi -Q` capture exists in the corpus: this CSV is written here with Habana's
    // documented field names, the table's buses and figures, and made-up serials.
    let mut csv = String::from(
        "index, name, bus_id, serial, uuid, driver_version, utilization.aip, memory.total, \
         memory.used, power.draw\n",
    );
    for (i, (bus, power, used)) in e.gpus.iter().enumerate() {
        csv.push_str(&format!(
            "{i}, HL-225, {bus}, AN1000{i}, N/A, {}, 0, 98304, {used}, {power}\n",
            e.driver
        ));
    }
    let csv_file = tmp.0.join("hl.csv");
    std::fs::write(&csv_file, csv).unwrap();
    let (body, log) = dry_run(
        &bin,
        &tmp.0,
        &["--source", "hl-smi"],
        &[
            ("FAKE_HL_CSV", csv_file),
            ("FAKE_HL_TABLE", c.join("gaudi").join(e.file)),
        ],
    );
    assert!(!log.contains("not usable"), "{log}");
    let uuids: Vec<&str> = body.gpus.iter().map(|g| g.uuid.as_str()).collect();
    assert_eq!(uuids[0], "HL-SN-AN10000");
    assert_eq!(body.gpus[0].serial.as_deref(), Some("AN10000"));
    assert_eq!(body.allocations.len(), 1);
    assert_eq!(body.allocations[0].gpu_uuid, "HL-SN-AN10007");
}

/// `amd-smi` documents for the e2e test: hand-written after AMD's documented JSON shape (the
/// ROCm 6.4+ `gpu_data` form), not captured output; the corpus has none.
const AMD_SMI_STATIC: &str = r#"{"gpu_data": [{"gpu": 0,
  "asic": {"market_name": "AMD Instinct MI300X", "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
           "asic_serial": "0x2A8F4E1C7B3D9055"},
  "bus": {"bdf": "0000:0c:00.0"}, "board": {"product_serial": "692251001124"},
  "driver": {"name": "amdgpu", "version": "6.10.5"},
  "vram": {"size": {"value": 196592, "unit": "MB"}}}]}"#;
const AMD_SMI_METRIC: &str = r#"{"gpu_data": [{"gpu": 0,
  "usage": {"gfx_activity": {"value": 87, "unit": "%"}},
  "power": {"socket_power": {"value": 612, "unit": "W"}},
  "mem_usage": {"used_vram": {"value": 150232, "unit": "MB"}}}]}"#;
const AMD_SMI_PROCESS: &str = r#"[{"gpu": 0, "process_list": [{"process_info": {"name": "python3",
  "pid": 40211, "memory_usage": {"vram_mem": {"value": 157286400000, "unit": "B"}}}}]}]"#;

#[test]
fn e2e_amd_smi_is_preferred_to_rocm_smi_where_it_works() {
    let tmp = TempDir::new("e2e-amd-smi");
    let bin = fake_vendor_tools(&tmp.0);
    let mut env = Vec::new();
    for (k, text) in [
        ("FAKE_AMD_STATIC", AMD_SMI_STATIC),
        ("FAKE_AMD_METRIC", AMD_SMI_METRIC),
        ("FAKE_AMD_PROCESS", AMD_SMI_PROCESS),
    ] {
        let f = tmp.0.join(k);
        std::fs::write(&f, text).unwrap();
        env.push((k, f));
    }
    let tool_log = tmp.0.join("tools.log");
    env.push(("FAKE_TOOL_LOG", tool_log.clone()));
    // rocm-smi would work too (it prints nothing usable here), but amd-smi comes first.
    let (body, log) = dry_run(&bin, &tmp.0, &["--host", "mi300-node"], &env);
    assert!(
        log.contains("reading GPUs through `amd-smi static/metric/process --json`"),
        "{log}"
    );
    let g = body
        .gpus
        .iter()
        .find(|g| g.uuid.starts_with("AMD-"))
        .unwrap();
    assert_eq!(g.uuid, "AMD-SN-692251001124");
    assert_eq!(g.model, "AMD Instinct MI300X");
    assert_eq!(g.memory_mib, Some(196_592));
    let s = body.samples.iter().find(|s| s.gpu_uuid == g.uuid).unwrap();
    assert_eq!(
        (s.util_pct, s.power_w, s.mem_used_mib),
        (Some(87.0), Some(612.0), Some(150_232.0))
    );
    assert_eq!(body.allocations.len(), 1);
    assert_eq!(body.allocations[0].workload, "python3 pid=40211");
    let runs = std::fs::read_to_string(&tool_log).unwrap();
    assert!(
        runs.contains("amd-smi metric --usage --power --mem-usage --json"),
        "{runs}"
    );
    assert!(runs.contains("amd-smi static --json"), "{runs}");
    assert!(runs.contains("amd-smi process --json"), "{runs}");
    assert!(!runs.contains("rocm-smi"), "{runs}");
}

#[test]
fn e2e_a_host_with_nvidia_and_amd_gpus_reports_both() {
    let c = require_corpus!();
    let Some(amd) = corpus_with("amd") else {
        return;
    };
    let tmp = TempDir::new("e2e-mixed");
    let nvidia_bin = fake_smi(&tmp.0);
    let amd_bin = fake_vendor_tools(&tmp.0);
    let bin = tmp.0.join("both");
    std::fs::create_dir_all(&bin).unwrap();
    for f in [nvidia_bin.join("nvidia-smi"), amd_bin.join("rocm-smi")] {
        std::fs::copy(&f, bin.join(f.file_name().unwrap())).unwrap();
    }
    let (body, log) = dry_run(
        &bin,
        &tmp.0,
        &["--host", "mixed", "--no-processes"],
        &[
            ("FAKE_SMI_XML", smi_file(&c, "tesla-t4.xml")),
            ("FAKE_ROCM_JSON", amd_file(&amd, ROCM[3].file)),
        ],
    );
    assert!(
        log.contains("reading GPUs through `rocm-smi --json`"),
        "{log}"
    );
    let uuids: Vec<&str> = body.gpus.iter().map(|g| g.uuid.as_str()).collect();
    assert!(uuids.contains(&"AMD-SN-692024000810"), "{uuids:?}");
    if !nvml_here() {
        assert!(
            log.contains("reading GPUs through `nvidia-smi -q -x`"),
            "{log}"
        );
        assert!(uuids.contains(&XML[1].uuid), "{uuids:?}");
        assert_eq!(body.samples.len(), 2);
    }
}

#[test]
fn e2e_no_reader_works_and_the_error_says_why_for_each() {
    if nvml_here() {
        eprintln!("skipped: a real NVIDIA driver is here, so NVML would work");
        return;
    }
    let tmp = TempDir::new("e2e-none");
    let empty = tmp.0.join("empty-bin");
    std::fs::create_dir_all(&empty).unwrap();
    let out = agent(&empty)
        // Only the empty folder on PATH: no tool of any vendor.
        .env("PATH", &empty)
        .args(["--once", "--dry-run", "--no-cloud-metadata"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no way to read GPUs on this host"), "{err}");
    for part in [
        "NVML: NVML is not usable",
        "nvidia-smi -q -x: `nvidia-smi` was not found; install it, or pass --nvidia-smi PATH",
        "amd-smi: `amd-smi` was not found; install it, or pass --amd-smi PATH",
        "rocm-smi: `rocm-smi` was not found; install it, or pass --rocm-smi PATH",
        "hl-smi: `hl-smi` was not found; install it, or pass --hl-smi PATH",
    ] {
        assert!(err.contains(part), "{part}: {err}");
    }
}

#[test]
fn e2e_amd_and_gaudi_gpus_reach_a_real_server() {
    let c = require_corpus!("amd");
    let Some(g) = corpus_with("gaudi") else {
        return;
    };
    let tmp = TempDir::new("e2e-vendors-server");
    let bin = fake_vendor_tools(&tmp.0);
    let server = Server::start(&tmp.0.join("g.db"), 0);
    let token = server.token("accel-hosts");
    let hosts = [
        // The six MI100 named by PCI address on `HOST`, and the MI50 by its serial.
        (HOST, vec![("FAKE_ROCM_JSON", amd_file(&c, ROCM[1].file))]),
        (
            "mi50-node",
            vec![("FAKE_ROCM_JSON", amd_file(&c, ROCM[3].file))],
        ),
        (
            "gaudi-node",
            vec![("FAKE_HL_TABLE", g.join("gaudi").join(GAUDI[0].file))],
        ),
    ];
    for (i, (host, env)) in hosts.iter().enumerate() {
        let mut cmd = agent(&bin);
        cmd.args(["--once", "--no-cloud-metadata", "--server", &server.base()])
            .args(["--token", &token, "--host", host, "--cluster", "lab"])
            .args(["--label", "team=ml"])
            .arg("--buffer-dir")
            .arg(tmp.0.join(format!("buf-{i}")))
            .arg("--proc-root")
            .arg(tmp.0.join("no-proc"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{host}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let list = get_json(&server.base(), "/api/v1/gpus");
    let items = list["items"].as_array().unwrap();
    let find = |uuid: &str| {
        items
            .iter()
            .find(|g| g["uuid"] == uuid)
            .unwrap_or_else(|| panic!("{uuid} not listed: {list}"))
    };
    for e in ROCM[1].gpus.iter().chain(ROCM[3].gpus) {
        let gpu = find(e.uuid);
        assert_eq!(gpu["model"], e.model.unwrap());
        assert_eq!(gpu["memory_mib"], e.memory_mib);
        assert_eq!(gpu["team"], "ml");
        assert_eq!(gpu["state"], "present");
        assert_eq!(gpu["labels"]["card_vendor"], AMD_VENDOR);
        assert_eq!(gpu["vendor"], "amd");
    }
    assert_eq!(find("AMD-SN-692024000810")["serial"], "692024000810");
    assert_eq!(find("AMD-SN-692024000810")["host"], "mi50-node");
    for (bus, _, _) in GAUDI[0].gpus {
        let gpu = find(&format!("HL-PCI-gaudi-node-{bus}"));
        assert_eq!(gpu["model"], "HL-225");
        assert_eq!(gpu["memory_mib"], 98304);
        assert_eq!(gpu["host"], "gaudi-node");
        assert_eq!(gpu["vendor"], "intel");
    }
    // Activity: a measured 0 % is known, not missing.
    let d = get_json(
        &server.base(),
        &format!("/api/v1/gpus/{}?{}", seg("AMD-SN-692024000810"), window()),
    );
    let hour = d["hours"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(hour["activity_pct"].as_f64(), Some(0.0), "{hour}");
    assert_eq!(hour["power_w_avg"].as_f64(), Some(26.0), "{hour}");
    let d = get_json(
        &server.base(),
        &format!(
            "/api/v1/gpus/{}?{}",
            seg("HL-PCI-gaudi-node-0000:4d:00.0"),
            window()
        ),
    );
    let allocs = d["allocations"].as_array().unwrap();
    assert_eq!(allocs.len(), 1, "{d}");
    assert_eq!(allocs[0]["workload"], "ray::_RayTrainW pid=107684");
    assert_eq!(allocs[0]["source"], "accel-hosts");
    server.stop();
}

// ---------------------------------------------------------------------------------------------
// outage_*: the server goes away under a running agent and comes back, or fails now and then

/// A TCP proxy between agent and server that can drop the server's replies after the server
/// has stored the body: an acknowledgement lost in flight.
struct Proxy {
    port: u16,
    swallow: Arc<AtomicU32>,
    swallowed: Arc<AtomicU32>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start(backend: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let swallow = Arc::new(AtomicU32::new(0));
        let swallowed = Arc::new(AtomicU32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (sw, sd, st) = (swallow.clone(), swallowed.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let (sw, sd) = (sw.clone(), sd.clone());
                std::thread::spawn(move || Proxy::serve(client, backend, &sw, &sd));
            }
        });
        Proxy {
            port,
            swallow,
            swallowed,
            stop,
        }
    }

    fn serve(mut client: TcpStream, backend: u16, swallow: &AtomicU32, swallowed: &AtomicU32) {
        // Server down: close the client's connection, as a dead host would.
        let Ok(mut server) = TcpStream::connect(("127.0.0.1", backend)) else {
            return;
        };
        let (Ok(mut c_read), Ok(mut s_write)) = (client.try_clone(), server.try_clone()) else {
            return;
        };
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut c_read, &mut s_write);
            let _ = s_write.shutdown(std::net::Shutdown::Write);
        });
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match server.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let take = swallow
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
                .is_ok();
            if take {
                swallowed.fetch_add(1, Ordering::SeqCst);
                break;
            }
            if client.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = client.shutdown(std::net::Shutdown::Both);
        let _ = server.shutdown(std::net::Shutdown::Both);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// What [`FaultProxy`] does with a request: pass it to the server, or answer it itself with a
/// status (and a `Retry-After` in seconds) so that the server never sees it; or pass it on only
/// after a delay (latency), reset the connection part-way through its body (nothing reaches the
/// server), or pass it on and drop the server's answer (a lost acknowledgement: stored, but the
/// agent never hears so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Forward,
    Status(u16, Option<u32>),
    Delay(Duration),
    ResetMidBody,
    LoseReply,
}

/// The server's counts of samples in its answer to a forwarded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stored {
    samples: u64,
    duplicate_samples: u64,
}

/// One request as [`FaultProxy`] saw it.
#[derive(Clone, Copy, Debug)]
struct Seen {
    /// When its head had arrived.
    at: Instant,
    answer: Answer,
    /// When the proxy began writing its own answer (forwarded requests: `None`).
    answered: Option<Instant>,
    /// `Content-Length`, and how much of the body the proxy read before acting.
    length: usize,
    body_read: usize,
    /// When it was passed to the server (never: `None`).
    forwarded: Option<Instant>,
    /// What the server answered, passed on to the agent or not.
    stored: Option<Stored>,
}

/// A loopback HTTP proxy that reads each request and, following a script indexed by request
/// number, forwards it to the server or answers it itself: a server that fails now and then.
/// Every connection carries one request (`Connection: close` both ways), so that the script
/// sees every request the agent makes.
struct FaultProxy {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    fn start(backend: u16, script: Vec<Answer>) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (sn, st) = (seen.clone(), stop.clone());
        let script = Arc::new(script);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let (sn, script) = (sn.clone(), script.clone());
                std::thread::spawn(move || FaultProxy::serve(client, backend, &script, &sn));
            }
        });
        FaultProxy { port, seen, stop }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn serve(mut client: TcpStream, backend: u16, script: &[Answer], seen: &Mutex<Vec<Seen>>) {
        let _ = client.set_read_timeout(Some(Duration::from_secs(30)));
        let Some((head, length)) = FaultProxy::read_head(&mut client) else {
            return;
        };
        let (idx, answer) = {
            let mut seen = seen.lock().unwrap();
            let answer = script.get(seen.len()).copied().unwrap_or(Answer::Forward);
            seen.push(Seen {
                at: Instant::now(),
                answer,
                answered: None,
                length,
                body_read: 0,
                forwarded: None,
                stored: None,
            });
            (seen.len() - 1, answer)
        };
        // A reset takes the first half of the body and leaves the rest unread in the socket.
        let want = match answer {
            Answer::ResetMidBody => (length / 2).max(1),
            _ => length,
        };
        let body = FaultProxy::read_body(&mut client, want);
        seen.lock().unwrap()[idx].body_read = body.as_ref().map_or(0, Vec::len);
        let Some(body) = body else {
            return;
        };
        match answer {
            Answer::Status(status, retry_after) => {
                let body = format!(r#"{{"error":"injected {status}"}}"#);
                let retry_after = retry_after
                    .map(|s| format!("Retry-After: {s}\r\n"))
                    .unwrap_or_default();
                let reply = format!(
                    "HTTP/1.1 {status} Injected\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n{retry_after}\r\n{body}",
                    body.len()
                );
                // Stamped before writing: the agent cannot have the answer any earlier.
                seen.lock().unwrap()[idx].answered = Some(Instant::now());
                let _ = client.write_all(reply.as_bytes());
                let _ = client.flush();
            }
            Answer::ResetMidBody => {
                // Let the rest of the body arrive, then close with it unread: the kernel
                // answers with a reset, not an orderly close. Nothing went to the server.
                std::thread::sleep(Duration::from_millis(200));
                drop(client);
                return;
            }
            Answer::Forward | Answer::Delay(_) | Answer::LoseReply => {
                if let Answer::Delay(d) = answer {
                    std::thread::sleep(d);
                }
                let mut request = head;
                request.extend_from_slice(&body);
                if let Ok(mut server) = TcpStream::connect(("127.0.0.1", backend)) {
                    seen.lock().unwrap()[idx].forwarded = Some(Instant::now());
                    let mut reply = Vec::new();
                    if server.write_all(&request).is_ok() {
                        let _ = server.read_to_end(&mut reply);
                    }
                    let _ = server.shutdown(std::net::Shutdown::Both);
                    seen.lock().unwrap()[idx].stored = FaultProxy::counts(&reply);
                    // A lost acknowledgement: the server has stored the body and answered
                    // (read in full above); the agent gets a closed connection instead.
                    if answer != Answer::LoseReply {
                        let _ = client.write_all(&reply);
                    }
                }
            }
        }
        let _ = client.shutdown(std::net::Shutdown::Both);
    }

    /// A request's head, up to and including its blank line and rewritten to
    /// `Connection: close`, and its `Content-Length`. Read a byte at a time, so that none of
    /// the body is taken from the socket yet.
    fn read_head(client: &mut TcpStream) -> Option<(Vec<u8>, usize)> {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            if buf.len() > 64 * 1024 {
                return None;
            }
            let n = client.read(&mut byte).ok().filter(|n| *n > 0)?;
            buf.extend_from_slice(&byte[..n]);
        }
        let head = String::from_utf8_lossy(&buf).into_owned();
        let header = |name: &str| {
            head.lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
                .map(|(_, v)| v.trim().to_string())
        };
        assert!(
            header("transfer-encoding").is_none(),
            "the proxy reads Content-Length bodies only:\n{head}"
        );
        let length: usize = header("content-length").and_then(|v| v.parse().ok())?;
        let mut out = String::new();
        for line in head.split("\r\n").filter(|l| !l.is_empty()) {
            if !line.to_ascii_lowercase().starts_with("connection:") {
                out.push_str(line);
                out.push_str("\r\n");
            }
        }
        out.push_str("Connection: close\r\n\r\n");
        Some((out.into_bytes(), length))
    }

    /// Exactly `length` bytes of body (`None` when the client went away first).
    fn read_body(client: &mut TcpStream, length: usize) -> Option<Vec<u8>> {
        let mut body = vec![0u8; length];
        client.read_exact(&mut body).ok()?;
        Some(body)
    }

    /// The sample counts in a server's `200` answer (`None` for anything else).
    fn counts(reply: &[u8]) -> Option<Stored> {
        let text = String::from_utf8_lossy(reply);
        let (head, body) = text.split_once("\r\n\r\n")?;
        if !head.starts_with("HTTP/1.1 200") {
            return None;
        }
        let v: Value = serde_json::from_str(body).ok()?;
        Some(Stored {
            samples: v["accepted"]["samples"].as_u64()?,
            duplicate_samples: v["duplicates"]["samples"].as_u64()?,
        })
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// A child process that is stopped when the test ends, whether it passed or panicked.
struct Killed(std::process::Child);

impl Killed {
    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The bodies waiting in a buffer directory (`<20 digits>.json`).
fn buffered(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.len() == 25 && n.ends_with(".json"))
                .collect()
        })
        .unwrap_or_default()
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Wait until `ok`, at most `timeout`; false when it timed out.
fn wait_for(timeout: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !ok() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

#[test]
fn outage_every_sample_arrives_exactly_once() {
    let c = require_corpus!();
    let tmp = TempDir::new("outage");
    let bin = fake_smi(&tmp.0);
    let db = tmp.0.join("g.db");
    let server = Server::start(&db, 0);
    let port = server.port;
    let token = server.token("outage-host");
    let proxy = Proxy::start(port);
    let count = tmp.0.join("reads");
    let buf = tmp.0.join("buf");
    let log_path = tmp.0.join("agent.log");
    // The A100 file: the GPU and its 4 MIG instances each give one sample per read (memory used
    // everywhere, power on the GPU; utilization is `N/A` under MIG).
    let e = &XML[0];
    let uuids: Vec<String> = std::iter::once(e.uuid.to_string())
        .chain(
            e.migs
                .iter()
                .map(|(gi, ci, _, _)| format!("MIG-{}/{gi}/{ci}", e.uuid)),
        )
        .collect();
    let per_read = uuids.len();
    const READS: usize = 16;
    let mut child = Killed(
        agent(&bin)
            .args(["--server", &format!("http://127.0.0.1:{}", proxy.port)])
            .args(["--source", "smi-xml"])
            .args([
                "--token",
                &token,
                "--interval-secs",
                "1",
                "--retry-max-secs",
                "2",
            ])
            .args(["--host", "outage-node", "--no-processes"])
            .arg("--buffer-dir")
            .arg(&buf)
            .env("FAKE_SMI_XML", smi_file(&c, e.file))
            .env("FAKE_SMI_COUNT", &count)
            .env("FAKE_SMI_MAX", READS.to_string())
            .env("GPULEDGER_LOG", "gpuledger_agent=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );

    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    // Up: a few reads arrive.
    let up = wait_for(Duration::from_secs(30), || {
        lines(&count) >= 3 && stored_samples(&server.base(), e.uuid) >= 3
    });
    assert!(up, "timed out waiting for the first deliveries\n{}", log());
    // Down: the server process goes away for a stretch; the agent keeps reading.
    server.stop();
    let reads_before = lines(&count);
    let read = wait_for(Duration::from_secs(30), || {
        lines(&count) >= reads_before + 5
    });
    assert!(
        read,
        "timed out waiting for reads during the outage\n{}",
        log()
    );
    let reads_after = lines(&count);
    let queued = buffered(&buf).len();
    assert!(
        queued >= 4,
        "bodies wait on disk during the outage ({queued})"
    );
    // Back, on the same port and database; its first two answers are lost on the way back.
    proxy.swallow.store(2, Ordering::SeqCst);
    let server = Server::start(&db, port);
    let stored_now = |server: &Server| -> i64 {
        uuids
            .iter()
            .map(|u| stored_samples(&server.base(), u))
            .sum()
    };
    let caught_up = wait_for(Duration::from_secs(60), || {
        lines(&count) >= READS && stored_now(&server) >= (READS * per_read) as i64
    });
    assert!(
        caught_up,
        "timed out waiting for every read to be delivered: {} reads, {} stored\n{}",
        lines(&count),
        stored_now(&server),
        log()
    );
    // Let any in-flight re-send land, then stop the agent.
    std::thread::sleep(Duration::from_millis(1500));
    child.stop();

    let produced = lines(&count) * per_read;
    let stored = stored_now(&server);
    let log = log();
    let absorbed: u64 = log
        .lines()
        .filter(|l| l.contains(" delivered"))
        .filter_map(|l| l.split("duplicate_samples=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    let during = (reads_after - reads_before) * per_read;
    eprintln!(
        "outage: samples produced {produced} ({during} while the server was down), \
         delivered {stored}, duplicated {}, lost {}; acknowledgements lost in flight {}, \
         samples re-sent and absorbed as duplicates by the server {absorbed}",
        (stored - produced as i64).max(0),
        (produced as i64 - stored).max(0),
        proxy.swallowed.load(Ordering::SeqCst),
    );
    assert_eq!(stored, produced as i64, "every sample exactly once\n{log}");
    assert!(
        proxy.swallowed.load(Ordering::SeqCst) >= 1,
        "an acknowledgement was lost"
    );
    assert!(
        absorbed >= 1,
        "the re-send after a lost acknowledgement was absorbed\n{log}"
    );
    let left = buffered(&buf);
    assert!(left.is_empty(), "nothing left unsent: {left:?}");
    server.stop();
}

/// What a run of the real agent through a [`FaultProxy`] left.
struct FaultRun {
    /// The requests the proxy saw, in order.
    seen: Vec<Seen>,
    /// Samples the agent read.
    produced: usize,
    /// Samples the server stored for the agent's GPUs.
    stored: i64,
    /// The agent's log.
    log: String,
    /// Samples re-sent and counted by the server as duplicates, as the agent logged them.
    absorbed: u64,
    /// Whether the agent was still running when the run ended (it is stopped then).
    running: bool,
}

/// Run the real agent (the corpus's MIG A100, `reads` reads 1 s apart, retries capped at 2 s)
/// through a [`FaultProxy`] playing `script` in front of `server`, until the script is played,
/// every read is stored (within `within_secs`) and the buffer is empty (within 5 s more); then
/// stop it.
#[allow(clippy::too_many_arguments)]
fn through_faults(
    corpus: &Path,
    tmp: &Path,
    bin: &Path,
    server: &Server,
    token: &str,
    host: &str,
    script: &[Answer],
    reads: usize,
    within_secs: u64,
) -> FaultRun {
    let proxy = FaultProxy::start(server.port, script.to_vec());
    let count = tmp.join("reads");
    let buf = tmp.join("buf");
    let log_path = tmp.join("agent.log");
    let e = &XML[0];
    let uuids: Vec<String> = std::iter::once(e.uuid.to_string())
        .chain(
            e.migs
                .iter()
                .map(|(gi, ci, _, _)| format!("MIG-{}/{gi}/{ci}", e.uuid)),
        )
        .collect();
    let per_read = uuids.len();
    let mut child = Killed(
        agent(bin)
            .args(["--server", &format!("http://127.0.0.1:{}", proxy.port)])
            .args(["--source", "smi-xml"])
            .args([
                "--token",
                token,
                "--interval-secs",
                "1",
                "--retry-max-secs",
                "2",
            ])
            .args(["--host", host, "--no-processes"])
            .arg("--buffer-dir")
            .arg(&buf)
            .env("FAKE_SMI_XML", smi_file(corpus, e.file))
            .env("FAKE_SMI_COUNT", &count)
            .env("FAKE_SMI_MAX", reads.to_string())
            .env("GPULEDGER_LOG", "gpuledger_agent=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );

    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let stored_now = || -> i64 {
        uuids
            .iter()
            .map(|u| stored_samples(&server.base(), u))
            .sum()
    };
    let done = wait_for(Duration::from_secs(within_secs), || {
        proxy.seen().len() > script.len()
            && lines(&count) >= reads
            && stored_now() >= (reads * per_read) as i64
    });
    assert!(
        done,
        "timed out: {} requests seen (the script has {}), {} reads, {} samples stored\n{}",
        proxy.seen().len(),
        script.len(),
        lines(&count),
        stored_now(),
        log()
    );
    // The last acknowledgement empties the buffer a moment after the server stored the body.
    assert!(
        wait_for(Duration::from_secs(5), || buffered(&buf).is_empty()),
        "nothing left unsent: {:?}\n{}",
        buffered(&buf),
        log()
    );
    let running = child.0.try_wait().unwrap().is_none();
    child.stop();

    let log = log();
    let absorbed = log
        .lines()
        .filter(|l| l.contains(" delivered"))
        .filter_map(|l| l.split("duplicate_samples=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    FaultRun {
        seen: proxy.seen(),
        produced: lines(&count) * per_read,
        stored: stored_now(),
        log,
        absorbed,
        running,
    }
}

#[test]
fn outage_intermittent_5xx_and_429_are_retried_and_every_sample_arrives_once() {
    use Answer::{Forward as F, Status as S};

    let c = require_corpus!();
    let started = Instant::now();
    let tmp = TempDir::new("faults");
    let bin = fake_smi(&tmp.0);
    let server = Server::start(&tmp.0.join("g.db"), 0);
    let token = server.token("faults-host");
    // By request number. The 429 follows a delivered request, which resets the backoff: had
    // the agent ignored `Retry-After`, its next request would come within 1 s (the first wait
    // is drawn from [0.5, 1] s); honouring it, no sooner than 2 s.
    const RETRY_AFTER: u32 = 2;
    let script = vec![
        F,
        S(503, None),
        S(500, None),
        F,
        S(502, None),
        F,
        S(429, Some(RETRY_AFTER)),
    ];
    let injected = script.iter().filter(|a| **a != F).count();
    // The script takes about 7 s (at most about 11) of 1 s reads; the rest is margin.
    let FaultRun {
        seen,
        produced,
        stored,
        log,
        absorbed,
        ..
    } = through_faults(
        &c,
        &tmp.0,
        &bin,
        &server,
        &token,
        "faults-node",
        &script,
        15,
        40,
    );
    let i429 = seen
        .iter()
        .position(|s| s.answer == S(429, Some(RETRY_AFTER)))
        .unwrap();
    let gap = seen[i429 + 1].at - seen[i429].answered.unwrap();
    eprintln!(
        "faults: {} requests, {injected} answered by the proxy ({:?}); samples produced \
         {produced}, stored {stored}, re-sent and absorbed as duplicates {absorbed}; next \
         request {:.2} s after the 429 with Retry-After: {RETRY_AFTER}; {:.1} s in all",
        seen.len(),
        seen.iter()
            .filter_map(|s| match s.answer {
                S(status, _) => Some(status),
                _ => None,
            })
            .collect::<Vec<_>>(),
        gap.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    // Every injected failure was answered and the agent came back after each.
    assert_eq!(
        seen.iter().filter(|s| s.answered.is_some()).count(),
        injected
    );
    assert_eq!(seen[i429 - 1].answer, F, "the 429 follows a delivery");
    assert!(
        gap >= Duration::from_millis(u64::from(RETRY_AFTER) * 1000 - 100),
        "the agent came back {:.2} s after a 429 with Retry-After: {RETRY_AFTER}\n{log}",
        gap.as_secs_f64()
    );
    // Failed requests never reached the server and no answer was lost: nothing was re-sent
    // that the server already had, and every sample is stored exactly once.
    assert_eq!(absorbed, 0, "no sample was stored twice\n{log}");
    assert_eq!(stored, produced as i64, "every sample exactly once\n{log}");
    server.stop();
}

#[test]
fn outage_latency_and_resets_mid_body_lose_and_duplicate_nothing() {
    use Answer::{Delay, Forward as F, LoseReply, ResetMidBody};

    let c = require_corpus!();
    let started = Instant::now();
    let tmp = TempDir::new("resets");
    let bin = fake_smi(&tmp.0);
    let server = Server::start(&tmp.0.join("g.db"), 0);
    let token = server.token("resets-host");
    // By request number: a slow hop, a connection reset half-way through a body, and an
    // acknowledgement lost after the server stored the body; each followed by a plain request.
    const LATENCY: Duration = Duration::from_millis(1500);
    let script = vec![F, Delay(LATENCY), F, ResetMidBody, F, LoseReply, F];
    let at = |a: Answer| script.iter().position(|s| *s == a).unwrap();
    let (slow, reset, lost) = (at(Delay(LATENCY)), at(ResetMidBody), at(LoseReply));
    // The script takes about 8 s of 1 s reads; the rest is margin.
    let FaultRun {
        seen,
        produced,
        stored,
        log,
        absorbed,
        running,
    } = through_faults(
        &c,
        &tmp.0,
        &bin,
        &server,
        &token,
        "resets-node",
        &script,
        12,
        30,
    );
    // Through every fault the agent kept running; it is stopped here, as in the other tests.
    assert!(running, "the agent is still running\n{log}");
    let failures = log
        .lines()
        .filter(|l| l.contains("could not deliver"))
        .count();
    let counts = |i: usize| {
        seen[i]
            .stored
            .unwrap_or_else(|| panic!("{:?}\n{log}", seen[i]))
    };
    let accepted: u64 = seen
        .iter()
        .filter_map(|s| s.stored)
        .map(|s| s.samples)
        .sum();
    let duplicated: u64 = seen
        .iter()
        .filter_map(|s| s.stored)
        .map(|s| s.duplicate_samples)
        .sum();
    eprintln!(
        "resets: {} requests; forwarded {:.2} s late; reset after {} of {} body bytes; an \
         answer to {} stored samples lost; samples produced {produced}, stored {stored}, \
         re-sent and absorbed as duplicates {duplicated} (agent log {absorbed}); {:.1} s in all",
        seen.len(),
        (seen[slow].forwarded.unwrap() - seen[slow].at).as_secs_f64(),
        seen[reset].body_read,
        seen[reset].length,
        counts(lost).samples,
        started.elapsed().as_secs_f64()
    );
    // Latency: the slow request waited and was delivered as it was, not given up and re-sent.
    assert!(seen[slow].forwarded.unwrap() - seen[slow].at >= LATENCY);
    assert!(counts(slow).samples > 0 && counts(slow).duplicate_samples == 0);
    assert_eq!(counts(slow + 1).duplicate_samples, 0, "{log}");
    // Reset mid-body: part of the body was read, none of it reached the server, and the retry
    // that carried it again found none of its samples stored.
    assert!(
        0 < seen[reset].body_read && seen[reset].body_read < seen[reset].length,
        "{:?}",
        seen[reset]
    );
    assert!(seen[reset].forwarded.is_none() && seen[reset].stored.is_none());
    assert_eq!(counts(reset + 1).duplicate_samples, 0, "{log}");
    assert!(counts(reset + 1).samples > 0);
    // Lost acknowledgement: the server stored the body; the agent sent it again and the server
    // counted every one of those samples as a duplicate.
    assert!(counts(lost).samples > 0);
    assert_eq!(
        counts(lost + 1).duplicate_samples,
        counts(lost).samples,
        "{log}"
    );
    assert!(duplicated > 0);
    assert_eq!(duplicated, counts(lost).samples, "nothing else was re-sent");
    assert_eq!(
        absorbed, duplicated,
        "the agent logged what the server said"
    );
    // The two failed attempts, and no other: latency was not taken for a failure.
    assert_eq!(failures, 2, "{log}");
    // Every sample exactly once: in the database, and in the server's answers (which count
    // the duplicates among the samples they accept).
    assert_eq!(stored, produced as i64, "every sample exactly once\n{log}");
    assert_eq!(accepted - duplicated, produced as u64, "{log}");
    server.stop();
}

#[test]
fn outage_a_day_of_8_gpus_is_buffered_within_the_cap_and_replayed_exactly_once() {
    use gpuledger_agent::buffer::Queue;
    use gpuledger_agent::report::{HostInfo, NoProcs, Reporter};

    let c = require_corpus!();
    let tmp = TempDir::new("day");
    let bin = fake_smi(&tmp.0);
    let buf = tmp.0.join("buf");
    // A day of reads of an 8-GPU host made while the server was away, with the clock injected:
    // the T4 of the corpus, eight times over with distinct UUIDs.
    let t4 = smi_xml::parse(&read(&c, "tesla-t4.xml"), &[]).unwrap();
    let mut snap = t4.clone();
    snap.processes.clear();
    snap.gpus = (0..8)
        .map(|i| GpuReading {
            uuid: format!("GPU-d37e67a5-91dd-3774-a5cb-9909624960{i:02}"),
            ..t4.gpus[0].clone()
        })
        .collect();
    let uuids: Vec<String> = snap.gpus.iter().map(|g| g.uuid.clone()).collect();
    let host = HostInfo {
        host: Some("day-node".into()),
        ..Default::default()
    };
    let mut reporter = Reporter::new(host, 600, false);
    let mut queue = Queue::open(&buf, 64 * 1024 * 1024).unwrap();
    let now = chrono::Utc::now();
    let start = chrono::DateTime::from_timestamp(now.timestamp() - 24 * 3600, 0).unwrap();
    const READS: i64 = 24 * 60;
    for k in 0..READS {
        for g in &mut snap.gpus {
            g.util_pct = Some((k % 101) as f64);
        }
        let ts = start + chrono::Duration::seconds(60 * k);
        let body = reporter.build(&snap, &mut NoProcs, ts);
        queue.push(&serde_json::to_vec(&body).unwrap()).unwrap();
    }
    assert_eq!(queue.dropped(), 0);
    let day_bytes = queue.total_bytes();
    drop(queue);

    // The server comes back; the agent starts, reads once and sends everything, in order.
    let server = Server::start(&tmp.0.join("g.db"), 0);
    let token = server.token("day-host");
    let started = Instant::now();
    let out = agent(&bin)
        .args(["--once", "--server", &server.base(), "--token", &token])
        .args([
            "--host",
            "day-node",
            "--no-processes",
            "--source",
            "smi-xml",
        ])
        .arg("--buffer-dir")
        .arg(&buf)
        .env("FAKE_SMI_XML", smi_file(&c, "tesla-t4.xml"))
        .output()
        .unwrap();
    let replay = started.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let per_gpu: Vec<i64> = uuids
        .iter()
        .map(|u| stored_samples(&server.base(), u))
        .collect();
    eprintln!(
        "day-long outage: {} reads of 8 GPUs buffered in {:.2} MiB of the 64 MiB cap; replayed in \
         {:.1} s; stored per GPU {per_gpu:?}",
        READS,
        day_bytes as f64 / (1024.0 * 1024.0),
        replay.as_secs_f64()
    );
    assert!(per_gpu.iter().all(|n| *n == READS), "{per_gpu:?}");
    assert_eq!(stored_samples(&server.base(), XML[1].uuid), 1);
    assert!(buffered(&buf).is_empty());
    server.stop();
}
