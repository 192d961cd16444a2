//! Where GPU readings come from: NVML, `nvidia-smi -q -x` or `nvidia-smi --query-gpu` CSV, and
//! the one shape ([`Snapshot`]) they all produce.
//!
//! Unknown is not zero: every reading is an `Option`, and [`known`] and [`number`] turn
//! nvidia-smi's `[N/A]`, `Not Supported`, `[Unknown Error]`, ... and NVML/DCGM sentinel values
//! into `None` at the edge, so nothing downstream can mistake them for a measured 0.

pub mod nvml;
pub mod smi;
pub mod smi_csv;
pub mod smi_list;
pub mod smi_xml;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

/// `nvidia-smi -L` failing is said once at `warn`, then at `debug`, not every interval.
static LIST_FAILURE_SAID: AtomicBool = AtomicBool::new(false);

fn list_failed(e: &SourceError, consequence: &str) {
    if LIST_FAILURE_SAID.swap(true, Ordering::Relaxed) {
        tracing::debug!(error = %e, "`nvidia-smi -L` failed; {consequence}");
    } else {
        tracing::warn!(error = %e, "`nvidia-smi -L` failed; {consequence}");
    }
}

/// How to read the GPUs. `Auto` tries NVML, then `nvidia-smi -q -x`, then the CSV query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SourceKind {
    Auto,
    Nvml,
    #[value(name = "smi-xml")]
    SmiXml,
    #[value(name = "smi-csv")]
    SmiCsv,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Auto => "auto",
            SourceKind::Nvml => "nvml",
            SourceKind::SmiXml => "smi-xml",
            SourceKind::SmiCsv => "smi-csv",
        }
    }

    pub fn parse(s: &str) -> Option<SourceKind> {
        [
            SourceKind::Auto,
            SourceKind::Nvml,
            SourceKind::SmiXml,
            SourceKind::SmiCsv,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
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
    pub mig_parent_uuid: Option<String>,
    pub mig_profile: Option<String>,
    /// 0..=100, like `DCGM_FI_DEV_GPU_UTIL`.
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
    #[error("could not run `{cmd}`: {reason}; check that nvidia-smi is installed and on PATH, or pass --nvidia-smi PATH")]
    Command { cmd: String, reason: String },
    #[error("`{cmd}` exited with {status}: {stderr}")]
    Exit {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("no way to read GPUs on this host. {0}")]
    NoSource(String),
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

/// An opened source, ready to read every interval.
#[derive(Debug)]
pub struct Reader {
    how: How,
    /// The read `Auto` made to probe a source, handed out as the first read rather than thrown
    /// away (so nvidia-smi does not run twice at start, and no read goes unreported).
    primed: Option<Snapshot>,
}

#[derive(Debug)]
enum How {
    Nvml(Box<nvml::NvmlSource>),
    SmiXml(smi::Smi),
    SmiCsv(smi::Smi),
}

impl Reader {
    /// Open the source `kind`; `Auto` tries NVML, then `nvidia-smi -q -x`, then the CSV query,
    /// and logs why each one it skipped was not usable.
    pub fn open(kind: SourceKind, smi: smi::Smi) -> Result<Reader, SourceError> {
        let plain = |how| Reader { how, primed: None };
        match kind {
            SourceKind::Nvml => Ok(plain(How::Nvml(Box::new(nvml::NvmlSource::open()?)))),
            SourceKind::SmiXml => Ok(plain(How::SmiXml(smi))),
            SourceKind::SmiCsv => Ok(plain(How::SmiCsv(smi))),
            SourceKind::Auto => {
                let nvml_err = match nvml::NvmlSource::open() {
                    Ok(n) => return Ok(plain(How::Nvml(Box::new(n)))),
                    Err(e) => e,
                };
                tracing::info!(reason = %nvml_err, "NVML not usable; trying `nvidia-smi -q -x`");
                let mut xml = plain(How::SmiXml(smi.clone()));
                let xml_err = match xml.read() {
                    Ok(snap) => {
                        xml.primed = Some(snap);
                        return Ok(xml);
                    }
                    Err(e) => e,
                };
                tracing::info!(reason = %xml_err, "`nvidia-smi -q -x` not usable; trying `nvidia-smi --query-gpu`");
                let mut csv = plain(How::SmiCsv(smi));
                match csv.read() {
                    Ok(snap) => {
                        csv.primed = Some(snap);
                        Ok(csv)
                    }
                    Err(csv_err) => Err(SourceError::NoSource(format!(
                        "NVML: {nvml_err}. nvidia-smi -q -x: {xml_err}. nvidia-smi --query-gpu: {csv_err}"
                    ))),
                }
            }
        }
    }

    /// Which source this is (never `Auto`).
    pub fn kind(&self) -> SourceKind {
        match self.how {
            How::Nvml(_) => SourceKind::Nvml,
            How::SmiXml(_) => SourceKind::SmiXml,
            How::SmiCsv(_) => SourceKind::SmiCsv,
        }
    }

    /// Read every GPU once.
    pub fn read(&mut self) -> Result<Snapshot, SourceError> {
        if let Some(snap) = self.primed.take() {
            return Ok(snap);
        }
        match &mut self.how {
            How::Nvml(n) => n.read(),
            How::SmiXml(smi) => read_xml(smi),
            How::SmiCsv(smi) => read_csv(smi),
        }
    }
}

fn read_xml(smi: &smi::Smi) -> Result<Snapshot, SourceError> {
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

fn read_csv(smi: &smi::Smi) -> Result<Snapshot, SourceError> {
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
