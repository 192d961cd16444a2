//! Where GPU readings come from, and the one shape ([`Snapshot`]) they all produce.
//!
//! | vendor | `--source` | reads | parsed in |
//! | --- | --- | --- | --- |
//! | NVIDIA | `nvml` | NVML (`libnvidia-ml.so.1`) | [`nvml`] |
//! | NVIDIA | `smi-xml` | `nvidia-smi -q -x` (+ `-L` for MIG) | [`smi_xml`], [`smi_list`] |
//! | NVIDIA | `smi-csv` | `nvidia-smi --query-gpu`, `--query-compute-apps` | [`smi_csv`] |
//! | AMD | `amd-smi` | `amd-smi static`, `metric`, `process` (`--json`) | [`amd_smi`], [`amd`] |
//! | AMD | `rocm-smi` | `rocm-smi … --json`, `rocm-smi --showpidgpus` | [`rocm_smi`], [`amd`] |
//! | Intel Gaudi | `hl-smi` | `hl-smi -Q … -f csv` and plain `hl-smi`, or plain `hl-smi` alone | [`hl_smi`] |
//!
//! `auto` reads every vendor present on the host, each through the first of its sources that
//! works (NVML, then `-q -x`, then the CSV query; `amd-smi`, then `rocm-smi`; `hl-smi`), and
//! where none works says why each one did not. The tools are run here (through [`smi`]); the
//! other modules only parse text.
//!
//! Unknown is not zero: every reading is an `Option`, and [`known`] and [`number`] turn
//! `[N/A]`, `N/A`, `Not Supported`, `[Unknown Error]`, ... and NVML/DCGM sentinel values into
//! `None` at the edge, so nothing downstream can mistake them for a measured 0. Every reading
//! goes through [`sanitize`].

pub mod amd;
pub mod amd_smi;
pub mod hl_smi;
pub mod nvml;
pub mod rocm_smi;
pub mod smi;
pub mod smi_csv;
pub mod smi_list;
pub mod smi_xml;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpuledger_model::accel::is_usable_id;

use smi::Smi;

/// `nvidia-smi -L` failing is said once at `warn`, then at `debug`, not every interval.
static LIST_FAILURE_SAID: AtomicBool = AtomicBool::new(false);

fn list_failed(e: &SourceError, consequence: &str) {
    if LIST_FAILURE_SAID.swap(true, Ordering::Relaxed) {
        tracing::debug!(error = %e, "`nvidia-smi -L` failed; {consequence}");
    } else {
        tracing::warn!(error = %e, "`nvidia-smi -L` failed; {consequence}");
    }
}

/// How to read the GPUs. `Auto` reads every vendor present, each through the first of its
/// sources that works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SourceKind {
    Auto,
    Nvml,
    #[value(name = "smi-xml")]
    SmiXml,
    #[value(name = "smi-csv")]
    SmiCsv,
    #[value(name = "amd-smi")]
    AmdSmi,
    #[value(name = "rocm-smi")]
    RocmSmi,
    #[value(name = "hl-smi")]
    HlSmi,
}

impl SourceKind {
    pub const ALL: [SourceKind; 7] = [
        SourceKind::Auto,
        SourceKind::Nvml,
        SourceKind::SmiXml,
        SourceKind::SmiCsv,
        SourceKind::AmdSmi,
        SourceKind::RocmSmi,
        SourceKind::HlSmi,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Auto => "auto",
            SourceKind::Nvml => "nvml",
            SourceKind::SmiXml => "smi-xml",
            SourceKind::SmiCsv => "smi-csv",
            SourceKind::AmdSmi => "amd-smi",
            SourceKind::RocmSmi => "rocm-smi",
            SourceKind::HlSmi => "hl-smi",
        }
    }

    pub fn parse(s: &str) -> Option<SourceKind> {
        SourceKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One GPU or MIG instance as read: inventory attributes and this read's metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReading {
    pub uuid: String,
    /// The product name; `None` when the source did not say.
    pub model: Option<String>,
    pub memory_mib: Option<u64>,
    pub serial: Option<String>,
    pub pci_bus_id: Option<String>,
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    /// `Some(true)` when MIG mode is enabled; `None` when the GPU does not support MIG.
    pub mig_enabled: Option<bool>,
    /// The GPU a MIG instance or an AMD compute partition belongs to.
    pub mig_parent_uuid: Option<String>,
    /// A MIG profile (`1g.10gb`) or an AMD partition mode (`CPX`).
    pub mig_profile: Option<String>,
    /// The maker the tool names (rocm-smi `Card Vendor`, amd-smi `vendor_name`), sent as the
    /// `card_vendor` label: it tells a ROCm-family device of another maker (a Hygon DCU) from an
    /// AMD GPU. `None` where the tool does not say (NVIDIA's tools, hl-smi).
    pub card_vendor: Option<String>,
    /// 0..=100: the share of time the device was busy (NVIDIA `utilization.gpu`, AMD
    /// `GPU use (%)`/`gfx_activity`, Gaudi `utilization.aip`), like `DCGM_FI_DEV_GPU_UTIL`.
    pub util_pct: Option<f64>,
    pub mem_used_mib: Option<f64>,
    pub power_w: Option<f64>,
    /// 0..=1, like `DCGM_FI_PROF_SM_ACTIVE`.
    pub sm_active: Option<f64>,
}

/// A process holding a GPU (or a MIG instance, then `gpu_uuid` is the instance's UUID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessReading {
    pub gpu_uuid: String,
    pub pid: u32,
    pub name: Option<String>,
    /// `C` (compute), `G` (graphics) or `C+G` as nvidia-smi prints it; `None` when not said.
    pub process_type: Option<String>,
    pub used_memory_mib: Option<u64>,
}

impl ProcessReading {
    /// A graphics-only process (a display server) is not a workload holding the GPU.
    pub fn is_graphics_only(&self) -> bool {
        self.process_type
            .as_deref()
            .is_some_and(|t| !t.to_ascii_uppercase().contains('C'))
    }
}

/// Everything one read of one source produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub gpus: Vec<GpuReading>,
    pub processes: Vec<ProcessReading>,
    /// True when the process list could not be read this time: running allocations are then
    /// left open rather than closed.
    pub processes_failed: bool,
}

/// Why a read failed. Every variant says what to try next.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("NVML is not usable: {0}; install the NVIDIA driver (libnvidia-ml.so.1) or pick `--source smi-xml`/`smi-csv`")]
    Nvml(String),
    #[error("`{program}` was not found; install it, or pass {flag} PATH where it is installed elsewhere")]
    NotInstalled { program: String, flag: &'static str },
    #[error("could not run `{cmd}`: {reason} (the program is set with {flag} PATH)")]
    Command {
        cmd: String,
        reason: String,
        flag: &'static str,
    },
    #[error("`{cmd}` exited with {status}: {stderr}")]
    Exit {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("{what} lists no devices")]
    NoDevices { what: String },
    #[error("no way to read GPUs on this host. {0}")]
    NoSource(String),
    #[error("no source could be read: {0}")]
    AllFailed(String),
    #[error("could not parse the output of {what}: {reason}")]
    Parse { what: &'static str, reason: String },
}

/// Texts nvidia-smi and exporters print instead of a value. Compared case-insensitively after
/// trimming and removing one pair of surrounding brackets.
const UNKNOWN_TEXTS: &[&str] = &[
    "",
    "n/a",
    "na",
    "none",
    "unknown",
    "not supported",
    "unknown error",
    "insufficient permissions",
    "no permission",
    "not available",
    "not found",
    "gpu is lost",
    "gpu requires reset",
    "requested functionality has been deprecated",
];

/// The text of a field, or `None` when it is one of nvidia-smi's "no value" markers. Anything in
/// square brackets is nvidia-smi's way of printing an error instead of a value, so it is unknown
/// too.
pub fn known(raw: &str) -> Option<&str> {
    let t = raw.trim();
    if t.starts_with('[') && t.ends_with(']') {
        return None;
    }
    let lower = t.to_ascii_lowercase();
    if UNKNOWN_TEXTS.contains(&lower.as_str()) {
        return None;
    }
    Some(t)
}

/// [`known`] as an owned string.
pub fn known_string(raw: &str) -> Option<String> {
    known(raw).map(str::to_string)
}

/// A product name as a tool printed it, or `None` for an unknown marker, a bare PCI ID
/// (`0x738c`) or a masked name (`DCU xxxx`, as sites redact output before sharing it).
pub fn product_name(raw: &str) -> Option<String> {
    let t = known(raw)?;
    let lower = t.to_ascii_lowercase();
    if lower.starts_with("0x") || lower.contains("xxxx") {
        return None;
    }
    Some(t.to_string())
}

/// An identifier (serial, unique ID, PCI address) that names something, or `None` for an
/// unknown marker, `0`, all zeros or a masked value (`gpuledger_model::accel::is_usable_id`).
pub fn usable_id(raw: &str) -> Option<String> {
    let t = known(raw)?;
    is_usable_id(t).then(|| t.to_string())
}

/// A number with an optional unit (`"19968 MiB"`, `"67.03 W"`, `"0 %"`), or `None` when the field
/// is unknown, not a number, or a sentinel value.
pub fn number(raw: &str) -> Option<f64> {
    let t = known(raw)?;
    let first = t.split_whitespace().next()?;
    if first.starts_with("0x") || first.starts_with("0X") {
        return None;
    }
    // Units glued to the number ("87%", "512W") are accepted too.
    let end = first
        .char_indices()
        .find(|&(i, c)| {
            !(c.is_ascii_digit() || c == '.' || ((c == '-' || c == '+') && i == 0) || c == 'e')
        })
        .map(|(i, _)| i)
        .unwrap_or(first.len());
    let v: f64 = first[..end].parse().ok()?;
    (!is_sentinel(v)).then_some(v)
}

/// DCGM's "blank" values (`DCGM_INT32_BLANK` 0x7ffffff0 and the three after it,
/// `DCGM_INT64_BLANK` 0x7ffffffffffffff0 and after, `DCGM_FP64_BLANK` 2^47 and after) and NVML's
/// `NVML_VALUE_NOT_AVAILABLE` (all bits set in 32 or 64 bits) mean "no value", never a reading.
pub fn is_sentinel(v: f64) -> bool {
    const INT32_BLANK: f64 = 2_147_483_632.0; // 0x7ffffff0
    const FP64_BLANK: f64 = 140_737_488_355_328.0; // 2^47
    !v.is_finite()
        || (INT32_BLANK..=2_147_483_647.0).contains(&v)
        || v == u32::MAX as f64
        || v >= FP64_BLANK
}

/// [`is_sentinel`] for integer values read from NVML.
pub fn is_sentinel_u64(v: u64) -> bool {
    v == u64::MAX
        || v == u32::MAX as u64
        || (0x7fff_fff0..=0x7fff_ffff).contains(&v)
        || v >= 0x7fff_ffff_ffff_fff0
}

/// A metric within its range, or `None`: a value outside what the metric can be is a broken
/// reading, and reporting it would either be refused by the server or counted as real.
pub fn in_range(v: Option<f64>, lo: f64, hi: f64) -> Option<f64> {
    v.filter(|x| x.is_finite() && *x >= lo && *x <= hi)
}

/// Clean the metrics of a reading so that only plausible values remain.
pub fn sanitize(g: &mut GpuReading) {
    g.util_pct = in_range(g.util_pct, 0.0, 100.0);
    g.sm_active = in_range(g.sm_active, 0.0, 1.0);
    g.mem_used_mib = in_range(g.mem_used_mib, 0.0, 16.0 * 1024.0 * 1024.0);
    g.power_w = in_range(g.power_w, 0.0, 10_000.0);
    g.memory_mib = g.memory_mib.filter(|m| *m > 0 && *m <= 16 * 1024 * 1024);
    // A serial of only zeros is what boards without a programmed serial (cloud passthrough,
    // vGPU) print; it identifies nothing.
    if g.serial
        .as_deref()
        .is_some_and(|s| s.chars().all(|c| c == '0'))
    {
        g.serial = None;
    }
}

/// How to run each vendor's tool, and what identities need.
#[derive(Debug, Clone)]
pub struct Tools {
    pub nvidia_smi: Smi,
    pub amd_smi: Smi,
    pub rocm_smi: Smi,
    pub hl_smi: Smi,
    /// This host's name: an AMD GPU or a Gaudi whose tool gives no usable serial is named by its
    /// PCI address on this host.
    pub host: Option<String>,
}

impl Default for Tools {
    fn default() -> Self {
        Tools {
            nvidia_smi: Smi::default(),
            amd_smi: Smi::new("amd-smi", "--amd-smi"),
            rocm_smi: Smi::new("rocm-smi", "--rocm-smi"),
            hl_smi: Smi::new("hl-smi", "--hl-smi"),
            host: None,
        }
    }
}

/// `amd-smi static` is re-read after this long (or at once when the GPUs listed change); what
/// it says (names, serials, memory sizes) does not change between reads.
const AMD_STATIC_MAX_AGE: Duration = Duration::from_secs(600);

/// The opened sources, one per vendor present, ready to read every interval.
#[derive(Debug)]
pub struct Reader {
    parts: Vec<Part>,
}

/// One source.
#[derive(Debug)]
struct Part {
    how: How,
    /// The read `Auto` made to probe a source, handed out as the first read rather than thrown
    /// away (so a tool does not run twice at start, and no read goes unreported).
    primed: Option<Snapshot>,
}

#[derive(Debug)]
enum How {
    Nvml(Box<nvml::NvmlSource>),
    SmiXml(Smi),
    SmiCsv(Smi),
    AmdSmi(Box<AmdSmi>),
    RocmSmi(Smi, Option<String>),
    HlSmi(Box<HlSmi>),
}

#[derive(Debug)]
struct AmdSmi {
    smi: Smi,
    host: Option<String>,
    /// The last `amd-smi static` output and when it was read.
    statics: Option<(String, Instant)>,
    metric_args: &'static [&'static str],
}

#[derive(Debug)]
struct HlSmi {
    smi: Smi,
    host: Option<String>,
    /// Decided by the first read that works: `false` when `hl-smi -Q` CSV works, `true` when
    /// only the table does. Fixed afterwards, so a Gaudi keeps one identity.
    table_only: Option<bool>,
}

impl How {
    fn kind(&self) -> SourceKind {
        match self {
            How::Nvml(_) => SourceKind::Nvml,
            How::SmiXml(_) => SourceKind::SmiXml,
            How::SmiCsv(_) => SourceKind::SmiCsv,
            How::AmdSmi(_) => SourceKind::AmdSmi,
            How::RocmSmi(..) => SourceKind::RocmSmi,
            How::HlSmi(_) => SourceKind::HlSmi,
        }
    }

    fn amd_smi(t: &Tools) -> How {
        How::AmdSmi(Box::new(AmdSmi {
            smi: t.amd_smi.clone(),
            host: t.host.clone(),
            statics: None,
            metric_args: amd_smi::METRIC_ARGS,
        }))
    }

    fn rocm_smi(t: &Tools) -> How {
        How::RocmSmi(t.rocm_smi.clone(), t.host.clone())
    }

    fn hl_smi(t: &Tools) -> How {
        How::HlSmi(Box::new(HlSmi {
            smi: t.hl_smi.clone(),
            host: t.host.clone(),
            table_only: None,
        }))
    }
}

impl Part {
    fn new(how: How) -> Part {
        Part { how, primed: None }
    }

    fn kind(&self) -> SourceKind {
        self.how.kind()
    }

    fn describe(&self) -> &'static str {
        match &self.how {
            How::Nvml(_) => "NVML (libnvidia-ml.so.1)",
            How::SmiXml(_) => "`nvidia-smi -q -x`",
            How::SmiCsv(_) => "`nvidia-smi --query-gpu --format=csv`",
            How::AmdSmi(_) => "`amd-smi static/metric/process --json`",
            How::RocmSmi(..) => "`rocm-smi --json`",
            How::HlSmi(h) => match h.table_only {
                Some(false) => "`hl-smi -Q … -f csv` (processes from `hl-smi`'s table)",
                Some(true) => "`hl-smi`'s table",
                None => "`hl-smi`",
            },
        }
    }

    fn read(&mut self) -> Result<Snapshot, SourceError> {
        if let Some(snap) = self.primed.take() {
            return Ok(snap);
        }
        match &mut self.how {
            How::Nvml(n) => n.read(),
            How::SmiXml(smi) => read_xml(smi),
            How::SmiCsv(smi) => read_csv(smi),
            How::AmdSmi(a) => read_amd_smi(a),
            How::RocmSmi(smi, host) => read_rocm_smi(smi, host.as_deref()),
            How::HlSmi(h) => read_hl_smi(h),
        }
    }

    /// Read once to see whether this source works here and finds devices; the read is kept as
    /// the first one.
    fn probe(how: How) -> Result<Part, SourceError> {
        let mut part = Part::new(how);
        let snap = part.read()?;
        if snap.gpus.is_empty() {
            return Err(SourceError::NoDevices {
                what: part.describe().to_string(),
            });
        }
        part.primed = Some(snap);
        Ok(part)
    }
}

/// NVML, then `nvidia-smi -q -x`, then the CSV query; what each failure was when none works.
fn open_nvidia(smi: &Smi) -> Result<Part, String> {
    let nvml_err = match nvml::NvmlSource::open() {
        Ok(n) => return Ok(Part::new(How::Nvml(Box::new(n)))),
        Err(e) => e,
    };
    tracing::info!(reason = %nvml_err, "NVML not usable; trying `nvidia-smi -q -x`");
    let mut xml = Part::new(How::SmiXml(smi.clone()));
    let xml_err = match xml.read() {
        Ok(snap) => {
            xml.primed = Some(snap);
            return Ok(xml);
        }
        Err(e) => e,
    };
    if matches!(xml_err, SourceError::NotInstalled { .. }) {
        // No nvidia-smi: the usual case on another vendor's host, and the CSV query fails too.
        tracing::debug!(reason = %xml_err, "`nvidia-smi` not installed");
        return Err(format!(
            "NVML: {nvml_err}. nvidia-smi -q -x: {xml_err}. nvidia-smi --query-gpu: not tried"
        ));
    }
    tracing::info!(reason = %xml_err, "`nvidia-smi -q -x` not usable; trying `nvidia-smi --query-gpu`");
    let mut csv = Part::new(How::SmiCsv(smi.clone()));
    match csv.read() {
        Ok(snap) => {
            csv.primed = Some(snap);
            Ok(csv)
        }
        Err(csv_err) => {
            tracing::info!(reason = %csv_err, "`nvidia-smi --query-gpu` not usable");
            Err(format!(
                "NVML: {nvml_err}. nvidia-smi -q -x: {xml_err}. nvidia-smi --query-gpu: {csv_err}"
            ))
        }
    }
}

/// The first of `candidates` that works and finds devices; what each failure was when none does.
fn open_first(candidates: Vec<How>) -> Result<Part, String> {
    let mut why = Vec::new();
    for how in candidates {
        let kind = how.kind();
        match Part::probe(how) {
            Ok(p) => return Ok(p),
            Err(e) => {
                // A tool that is not installed is the usual case on another vendor's host.
                if matches!(e, SourceError::NotInstalled { .. }) {
                    tracing::debug!(source = %kind, reason = %e, "not usable");
                } else {
                    tracing::info!(source = %kind, reason = %e, "`{kind}` not usable");
                }
                why.push(format!("{kind}: {e}"));
            }
        }
    }
    Err(why.join(". "))
}

impl Reader {
    /// Open the source `kind`; `Auto` opens every vendor's first working source, logs why each
    /// one it skipped was not usable, and fails, saying why for each, only where none works.
    pub fn open(kind: SourceKind, tools: &Tools) -> Result<Reader, SourceError> {
        let one = |how| Reader {
            parts: vec![Part::new(how)],
        };
        Ok(match kind {
            SourceKind::Nvml => one(How::Nvml(Box::new(nvml::NvmlSource::open()?))),
            SourceKind::SmiXml => one(How::SmiXml(tools.nvidia_smi.clone())),
            SourceKind::SmiCsv => one(How::SmiCsv(tools.nvidia_smi.clone())),
            SourceKind::AmdSmi => one(How::amd_smi(tools)),
            SourceKind::RocmSmi => one(How::rocm_smi(tools)),
            SourceKind::HlSmi => one(How::hl_smi(tools)),
            SourceKind::Auto => {
                let mut parts = Vec::new();
                let mut why = Vec::new();
                for vendor in [
                    open_nvidia(&tools.nvidia_smi),
                    open_first(vec![How::amd_smi(tools), How::rocm_smi(tools)]),
                    open_first(vec![How::hl_smi(tools)]),
                ] {
                    match vendor {
                        Ok(p) => parts.push(p),
                        Err(w) => why.push(w),
                    }
                }
                if parts.is_empty() {
                    return Err(SourceError::NoSource(format!("{}.", why.join(". "))));
                }
                Reader { parts }
            }
        })
    }

    /// The sources in use (never `Auto`), each with what it runs, in the order they are read.
    pub fn sources(&self) -> Vec<(SourceKind, &'static str)> {
        self.parts
            .iter()
            .map(|p| (p.kind(), p.describe()))
            .collect()
    }

    /// Read every GPU once. With several sources (an NVIDIA and an AMD GPU in one host), one
    /// that fails leaves its GPUs out of this read, and the process list counts as unknown
    /// (running allocations stay open); the read fails only when every source fails.
    pub fn read(&mut self) -> Result<Snapshot, SourceError> {
        if let [part] = self.parts.as_mut_slice() {
            return part.read();
        }
        let mut out = Snapshot::default();
        let mut failures = Vec::new();
        for p in &mut self.parts {
            match p.read() {
                Ok(s) => {
                    out.gpus.extend(s.gpus);
                    out.processes.extend(s.processes);
                    out.processes_failed |= s.processes_failed;
                }
                Err(e) => {
                    tracing::warn!(source = %p.kind(), error = %e, "could not read these GPUs; no samples from them this interval (unknown, not zero)");
                    out.processes_failed = true;
                    failures.push(format!("{}: {e}", p.kind()));
                }
            }
        }
        if failures.len() == self.parts.len() {
            return Err(SourceError::AllFailed(failures.join(". ")));
        }
        Ok(out)
    }
}

impl fmt::Display for Reader {
    /// `smi-xml`, or `nvml+rocm-smi` on a host with two vendors' GPUs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            f.write_str(p.kind().as_str())?;
        }
        Ok(())
    }
}

fn read_xml(smi: &Smi) -> Result<Snapshot, SourceError> {
    let xml = smi.run(&["-q", "-x"])?;
    let snap = smi_xml::parse(&xml, &[])?;
    if !snap.gpus.iter().any(|g| g.mig_enabled == Some(true)) {
        return Ok(snap);
    }
    // MIG instances are named only by `-L`; without it they keep their older names.
    match smi.run(&["-L"]) {
        Ok(list) => smi_xml::parse(&xml, &smi_list::parse(&list)),
        Err(e) => {
            list_failed(
                &e,
                "MIG instances are named MIG-<GPU UUID>/<GI>/<CI> and their profiles are unknown",
            );
            Ok(snap)
        }
    }
}

fn read_csv(smi: &Smi) -> Result<Snapshot, SourceError> {
    let q = format!("--query-gpu={}", smi_csv::GPU_FIELDS);
    let mut gpus = smi_csv::parse_gpus(&smi.run(&[&q, "--format=csv"])?)?;
    if gpus.iter().any(|g| g.mig_enabled == Some(true)) {
        match smi.run(&["-L"]) {
            Ok(list) => add_listed_migs(&mut gpus, &smi_list::parse(&list)),
            Err(e) => list_failed(&e, "MIG instances are not reported"),
        }
    }
    let q = format!("--query-compute-apps={}", smi_csv::APP_FIELDS);
    let apps = smi
        .run(&[&q, "--format=csv"])
        .and_then(|text| smi_csv::parse_apps(&text));
    let (processes, processes_failed) = match apps {
        Ok(p) => (p, false),
        Err(e) => {
            tracing::warn!(error = %e, "could not list GPU processes; allocations are left as they were");
            (Vec::new(), true)
        }
    };
    Ok(Snapshot {
        gpus,
        processes,
        processes_failed,
    })
}

fn read_amd_smi(a: &mut AmdSmi) -> Result<Snapshot, SourceError> {
    let metric = match a.smi.run(a.metric_args) {
        Ok(m) => m,
        Err(first @ SourceError::Exit { .. }) if a.metric_args == amd_smi::METRIC_ARGS => {
            // An amd-smi that does not know the section flags: ask for every metric.
            match a.smi.run(amd_smi::METRIC_ARGS_ALL) {
                Ok(m) => {
                    a.metric_args = amd_smi::METRIC_ARGS_ALL;
                    m
                }
                Err(_) => return Err(first),
            }
        }
        Err(e) => return Err(e),
    };
    let fresh = a.statics.as_ref().is_some_and(|(text, at)| {
        at.elapsed() < AMD_STATIC_MAX_AGE
            && amd_smi::gpu_indices(text) == amd_smi::gpu_indices(&metric)
    });
    if !fresh {
        a.statics = Some((a.smi.run(amd_smi::STATIC_ARGS)?, Instant::now()));
    }
    let statics = a
        .statics
        .as_ref()
        .map(|(t, _)| t.as_str())
        .unwrap_or_default();
    let process = match a.smi.run(amd_smi::PROCESS_ARGS) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "could not list AMD GPU processes; allocations are left as they were");
            None
        }
    };
    amd_smi::parse(statics, &metric, process.as_deref(), a.host.as_deref())
}

fn read_rocm_smi(smi: &Smi, host: Option<&str>) -> Result<Snapshot, SourceError> {
    let json = smi.run(rocm_smi::ARGS)?;
    // `--showpids` put a `PID<n>` entry per process in the JSON; without any there is no process
    // to place on a GPU, and no need to ask which GPUs they use.
    let pid_gpus = if json.contains("\"PID") {
        match smi.run(rocm_smi::PID_GPUS_ARGS) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "could not list which AMD GPUs processes use; allocations are left as they were");
                None
            }
        }
    } else {
        Some(String::new())
    };
    rocm_smi::parse(&json, pid_gpus.as_deref(), host)
}

fn read_hl_smi(h: &mut HlSmi) -> Result<Snapshot, SourceError> {
    match h.table_only {
        Some(false) => return read_hl_csv(h),
        Some(true) => return read_hl_table(h),
        None => {}
    }
    let csv_err = match read_hl_csv(h) {
        Ok(snap) => {
            h.table_only = Some(false);
            return Ok(snap);
        }
        Err(e @ SourceError::NotInstalled { .. }) => return Err(e),
        Err(e) => e,
    };
    match read_hl_table(h) {
        Ok(snap) => {
            tracing::info!(reason = %csv_err, "`hl-smi -Q` not usable; reading hl-smi's table, which names Gaudis by PCI address, not by serial");
            h.table_only = Some(true);
            Ok(snap)
        }
        Err(table_err) => Err(SourceError::AllFailed(format!(
            "hl-smi -Q: {csv_err}. hl-smi (table): {table_err}"
        ))),
    }
}

fn read_hl_csv(h: &HlSmi) -> Result<Snapshot, SourceError> {
    let host = h.host.as_deref();
    let gpus = hl_smi::parse_csv(&h.smi.run(hl_smi::QUERY_ARGS)?, host)?;
    // Only the table lists processes.
    let processes = match h.smi.run(&[]) {
        Ok(table) => {
            let p = hl_smi::processes_from_table(&gpus, &table);
            if p.is_none() {
                tracing::warn!("hl-smi's table has no complete process list; allocations are left as they were");
            }
            p
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not list Gaudi processes; allocations are left as they were");
            None
        }
    };
    Ok(Snapshot {
        gpus,
        processes_failed: processes.is_none(),
        processes: processes.unwrap_or_default(),
    })
}

fn read_hl_table(h: &HlSmi) -> Result<Snapshot, SourceError> {
    let snap = hl_smi::parse_table(&h.smi.run(&[])?, h.host.as_deref())?;
    if snap.processes_failed {
        tracing::warn!(
            "hl-smi's table has no complete process list; allocations are left as they were"
        );
    }
    Ok(snap)
}

/// Add the MIG instances `nvidia-smi -L` lists as children of the GPUs already read.
pub fn add_listed_migs(gpus: &mut Vec<GpuReading>, listed: &[smi_list::ListedGpu]) {
    let mut out = Vec::with_capacity(gpus.len());
    for g in gpus.drain(..) {
        let children: Vec<GpuReading> = listed
            .iter()
            .filter(|l| l.uuid == g.uuid)
            .flat_map(|l| l.migs.iter())
            .map(|m| GpuReading {
                uuid: m.uuid.clone(),
                model: g.model.clone(),
                pci_bus_id: g.pci_bus_id.clone(),
                driver_version: g.driver_version.clone(),
                cuda_version: g.cuda_version.clone(),
                mig_enabled: Some(true),
                mig_parent_uuid: Some(g.uuid.clone()),
                mig_profile: Some(m.profile.clone()),
                ..Default::default()
            })
            .collect();
        out.push(g);
        out.extend(children);
    }
    *gpus = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_markers_are_none() {
        for raw in [
            "[N/A]",
            "N/A",
            "Not Supported",
            "[Not Supported]",
            "[Unknown Error]",
            "[Insufficient Permissions]",
            "",
            "   ",
            "[Requested functionality has been deprecated]",
            "[GPU requires reset]",
        ] {
            assert_eq!(known(raw), None, "{raw:?}");
            assert_eq!(number(raw), None, "{raw:?}");
        }
        assert_eq!(known(" Tesla T4 "), Some("Tesla T4"));
    }

    #[test]
    fn source_kinds_round_trip_and_masked_names_are_unknown() {
        for k in SourceKind::ALL {
            assert_eq!(SourceKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(SourceKind::parse("rocm"), None);
        assert_eq!(product_name("DCU xxxx"), None);
        assert_eq!(product_name("0x738c"), None);
        assert_eq!(product_name("N/A"), None);
        assert_eq!(
            product_name(" Arcturus GL-XL [Instinct MI100] ").as_deref(),
            Some("Arcturus GL-XL [Instinct MI100]")
        );
        for id in ["TPXxxxx", "0", "N/A", "[N/A]", "0x0000", ""] {
            assert_eq!(usable_id(id), None, "{id:?}");
        }
        assert_eq!(usable_id(" 692024000810 ").as_deref(), Some("692024000810"));
    }

    #[test]
    fn a_missing_tool_is_not_installed_and_names_its_flag() {
        let smi = Smi::new("/nonexistent/gpuledger-test/rocm-smi", "--rocm-smi");
        let err = smi.run(&["--json"]).unwrap_err();
        assert!(matches!(err, SourceError::NotInstalled { .. }), "{err}");
        assert!(err.to_string().contains("--rocm-smi PATH"), "{err}");
        let tools = Tools {
            nvidia_smi: Smi::new("/nonexistent/nvidia-smi", "--nvidia-smi"),
            amd_smi: Smi::new("/nonexistent/amd-smi", "--amd-smi"),
            rocm_smi: Smi::new("/nonexistent/rocm-smi", "--rocm-smi"),
            hl_smi: Smi::new("/nonexistent/hl-smi", "--hl-smi"),
            host: None,
        };
        // An explicit source opens without running anything; its first read says why it fails.
        let mut r = Reader::open(SourceKind::HlSmi, &tools).unwrap();
        assert_eq!(r.to_string(), "hl-smi");
        assert!(matches!(r.read(), Err(SourceError::NotInstalled { .. })));
    }

    #[test]
    fn numbers_keep_their_value_and_drop_units() {
        assert_eq!(number("19968 MiB"), Some(19968.0));
        assert_eq!(number("67.03 W"), Some(67.03));
        assert_eq!(number("0 %"), Some(0.0));
        assert_eq!(number("87%"), Some(87.0));
        assert_eq!(number("high"), None);
        assert_eq!(number("0x0000"), None);
        assert_eq!(number("-"), None);
    }

    #[test]
    fn sentinels_are_unknown_not_huge() {
        for v in [
            "9223372036854775794",
            "9223372036854775792",
            "2147483632",
            "2147483634",
            "4294967295",
            "140737488355328",
            "18446744073709551615",
        ] {
            assert_eq!(number(v), None, "{v}");
        }
        assert!(is_sentinel_u64(u64::MAX));
        assert!(is_sentinel_u64(0x7fff_ffff_ffff_fff2));
        assert!(!is_sentinel_u64(85_899_345_920)); // 80 GiB in bytes is a real value
    }

    #[test]
    fn sanitize_drops_out_of_range_and_zero_serials() {
        let mut g = GpuReading {
            uuid: "GPU-1".into(),
            util_pct: Some(250.0),
            sm_active: Some(0.5),
            power_w: Some(-1.0),
            serial: Some("0000000000000".into()),
            memory_mib: Some(0),
            ..Default::default()
        };
        sanitize(&mut g);
        assert_eq!(g.util_pct, None);
        assert_eq!(g.sm_active, Some(0.5));
        assert_eq!(g.power_w, None);
        assert_eq!(g.serial, None);
        assert_eq!(g.memory_mib, None);
    }
}
