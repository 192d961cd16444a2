//! Pure parsing for the `dcgm` collector: a GPU exporter's `/metrics` text (NVIDIA
//! dcgm-exporter, AMD device-metrics-exporter, the Intel Gaudi metric exporter) or a Prometheus
//! API answer in, GPUs, MIG instances and partitions, samples and allocation evidence out. No
//! IO; every input is untrusted, so nothing here panics on bad bytes: bad lines become
//! problems, the rest is kept. Which families feed which field, per exporter, is in
//! [`super::families`].
//!
//! The scrape text is split into lines by `prometheus-parse` ([`LineInfo::parse`]); label sets are
//! read here, because that crate's own label reader splits on `,` and `=` without regard to
//! quotes and keeps escapes (`err_msg="a, b"` would lose its value).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeZone, Utc};
use gpuledger_model::{AllocationKind, PushAllocation, PushGpu, PushSample, Vendor, UNKNOWN};
use prometheus_parse::LineInfo;
use serde::Deserialize;

use super::families::{
    self, clip, is_exporter_container, is_exporter_pod, text, Device, Id, Memory, Profile, Unit,
    MAX_MIB, MAX_TEXT_BYTES,
};

/// DCGM's blank value for 32-bit integer fields (`DCGM_INT32_BLANK`); +1 not found, +2 not
/// supported, +3 not permissioned, and DCGM treats everything above as blank too.
pub const DCGM_INT32_BLANK: i128 = 0x7fff_fff0;
/// DCGM's blank value for 64-bit integer fields (`DCGM_INT64_BLANK`, 9223372036854775792); the
/// same offsets as for 32-bit fields, so 9223372036854775794 is "not supported".
pub const DCGM_INT64_BLANK: i128 = 0x7fff_ffff_ffff_fff0;
/// DCGM's blank value for floating-point fields (`DCGM_FP64_BLANK`, 2^47); the same offsets.
pub const DCGM_FP64_BLANK: f64 = 140_737_488_355_328.0;

/// Problems kept per parse; more are counted, not listed.
const MAX_PROBLEMS: usize = 20;
/// Timestamps past 9999-12-31 are damage, not data.
const MAX_TS_MILLIS: i64 = 253_402_300_799_999;

/// One time series: a metric, its labels and one value (a scrape) or many (a range query).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub metric: String,
    pub labels: BTreeMap<String, String>,
    pub values: Vec<Reading>,
}

/// One value of a series.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// When it was taken; `None` for a scrape line without a timestamp (read "now").
    pub ts: Option<DateTime<Utc>>,
    pub value: f64,
    /// The value as written, which keeps a 64-bit sentinel exact where `f64` cannot.
    pub raw: String,
}

/// The series of one scrape or one API answer, and what could not be read.
///
/// Problems say which line or result and what kind of problem, never the answer's text: they
/// are shown to every viewer as the source's last error, and a URL may answer anything (a
/// password file, an error page). What Prometheus itself said goes to `log`, for the server's
/// log only.
#[derive(Debug, Default)]
pub struct Parsed {
    pub series: Vec<Series>,
    pub problems: Vec<String>,
    /// Prometheus's warnings, for the server's log.
    pub log: Vec<String>,
}

/// Parse an exporter's `/metrics` text. Keeps only the series of the exporters gpuledger reads
/// (`DCGM_FI_*`, `gpu_*` and `amd_gpu_*`, `habanalabs_*`; see [`families::vendor_of`]). Blank
/// lines, `# HELP` and `# TYPE` lines, their absence and a missing final newline are all fine.
pub fn parse_text(text: &str) -> Parsed {
    let mut problems = Problems::default();
    let mut series = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        match LineInfo::parse(line) {
            LineInfo::Sample {
                metric_name,
                labels,
                value,
                timestamp,
            } => {
                if families::vendor_of(metric_name).is_none() {
                    continue;
                }
                let labels = match parse_labels(labels.unwrap_or("")) {
                    Ok(l) => l,
                    Err(e) => {
                        problems.push(format!("line {n}: {e}; line skipped"));
                        continue;
                    }
                };
                let Ok(v) = value.parse::<f64>() else {
                    problems.push(format!("line {n}: the value is not a number; line skipped"));
                    continue;
                };
                let ts = match timestamp {
                    None => None,
                    Some(t) => match t
                        .parse::<i64>()
                        .ok()
                        .filter(|ms| (0..=MAX_TS_MILLIS).contains(ms))
                        .and_then(|ms| Utc.timestamp_millis_opt(ms).single())
                    {
                        Some(ts) => Some(ts),
                        None => {
                            problems.push(format!(
                                "line {n}: the timestamp is not milliseconds since 1970 (up to year 9999); read as now"
                            ));
                            None
                        }
                    },
                };
                series.push(Series {
                    metric: metric_name.to_string(),
                    labels,
                    values: vec![Reading {
                        ts,
                        value: v,
                        raw: value.to_string(),
                    }],
                });
            }
            LineInfo::Ignored if !line.trim_start().starts_with('#') => {
                problems.push(format!(
                    "line {n} is not Prometheus text (a metric line); line skipped"
                ));
            }
            _ => {}
        }
    }
    Parsed {
        series,
        problems: problems.finish(),
        log: Vec::new(),
    }
}

/// Why a Prometheus API answer could not be used at all.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// Prometheus's `errorType` (`bad_data`, `timeout`, ...) when it gave one.
    pub error_type: Option<String>,
    pub message: String,
    /// Prometheus's own error message, for the server's log only (see [`Parsed`]).
    pub detail: Option<String>,
}

/// The `errorType`s Prometheus's HTTP API documents; any other is not repeated.
const ERROR_TYPES: &[&str] = &[
    "bad_data",
    "timeout",
    "canceled",
    "execution",
    "unavailable",
    "internal",
    "not_found",
    "not_acceptable",
];

const UNTERMINATED: &str = "a label value is not terminated";

#[derive(Deserialize)]
struct ApiAnswer {
    status: String,
    #[serde(default)]
    data: Option<ApiData>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
}

#[derive(Deserialize)]
struct ApiData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct ApiSeries {
    metric: BTreeMap<String, String>,
    #[serde(default)]
    value: Option<(f64, String)>,
    #[serde(default)]
    values: Vec<(f64, String)>,
}

/// Parse a Prometheus `/api/v1/query` (vector) or `/api/v1/query_range` (matrix) answer.
pub fn parse_api(body: &[u8]) -> Result<Parsed, ApiError> {
    let answer: ApiAnswer = serde_json::from_slice(body).map_err(|e| ApiError {
        error_type: None,
        detail: None,
        message: format!(
            "the answer is not Prometheus API JSON ({e}); point `prometheus_url` at the Prometheus \
             server itself (the URL before /api/v1)"
        ),
    })?;
    if answer.status != "success" {
        return Err(ApiError {
            message: format!(
                "Prometheus answered {}; its message is in gpuledger's log",
                match answer
                    .error_type
                    .as_deref()
                    .filter(|t| ERROR_TYPES.contains(t))
                {
                    Some(t) => format!("error `{t}`"),
                    None => "an error".into(),
                }
            ),
            detail: answer.error.map(|e| clip(&e)),
            error_type: answer.error_type,
        });
    }
    let Some(data) = answer.data else {
        return Err(ApiError {
            error_type: None,
            detail: None,
            message: "Prometheus answered success without `data`".into(),
        });
    };
    if data.result_type != "vector" && data.result_type != "matrix" {
        return Err(ApiError {
            error_type: None,
            detail: None,
            message: format!(
                "Prometheus answered a `{}`; expected a vector or a matrix of series",
                data.result_type
            ),
        });
    }
    let mut problems = Problems::default();
    if !answer.warnings.is_empty() {
        problems.push(format!(
            "Prometheus warned about the query ({} warning(s), in gpuledger's log)",
            answer.warnings.len()
        ));
    }
    let mut series = Vec::with_capacity(data.result.len());
    for (i, item) in data.result.into_iter().enumerate() {
        let s: ApiSeries = match serde_json::from_value(item) {
            Ok(s) => s,
            Err(_) => {
                problems.push(format!(
                    "result[{i}] is not a Prometheus series; series skipped"
                ));
                continue;
            }
        };
        let mut labels = s.metric;
        let Some(metric) = labels.remove("__name__") else {
            problems.push(format!("result[{i}]: no `__name__` label; series skipped"));
            continue;
        };
        let mut values = Vec::with_capacity(s.values.len() + 1);
        for (ts, raw) in s.value.into_iter().chain(s.values) {
            let Some(ts) = ts_from_secs(ts) else {
                problems.push(format!(
                    "result[{i}]: timestamp {ts} is out of range; value skipped"
                ));
                continue;
            };
            let Ok(value) = raw.parse::<f64>() else {
                problems.push(format!(
                    "result[{i}]: a value is not a number; value skipped"
                ));
                continue;
            };
            values.push(Reading {
                ts: Some(ts),
                value,
                raw,
            });
        }
        series.push(Series {
            metric,
            labels,
            values,
        });
    }
    Ok(Parsed {
        series,
        problems: problems.finish(),
        log: answer.warnings.iter().map(|w| clip(w)).collect(),
    })
}

fn ts_from_secs(secs: f64) -> Option<DateTime<Utc>> {
    let ms = (secs * 1000.0).round();
    if !(0.0..=MAX_TS_MILLIS as f64).contains(&ms) {
        return None;
    }
    Utc.timestamp_millis_opt(ms as i64).single()
}

/// Read a label set's inside (`a="x",b="y"`), with Prometheus's escapes (`\\`, `\"`, `\n`).
fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let mut it = s.chars().peekable();
    loop {
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.peek().is_none() {
            return Ok(out);
        }
        let mut name = String::new();
        while let Some(c) = it.next_if(|c| c.is_ascii_alphanumeric() || *c == '_') {
            name.push(c);
        }
        if name.is_empty() {
            return Err("a label has no name".into());
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.next() != Some('=') {
            return Err("a label has no `=`".into());
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.next() != Some('"') {
            return Err("a label has no quoted value".into());
        }
        let mut value = String::new();
        loop {
            match it.next() {
                None => return Err(UNTERMINATED.into()),
                Some('"') => break,
                Some('\\') => match it.next() {
                    Some('n') => value.push('\n'),
                    Some('\\') => value.push('\\'),
                    Some('"') => value.push('"'),
                    Some(c) => {
                        value.push('\\');
                        value.push(c);
                    }
                    None => return Err(UNTERMINATED.into()),
                },
                Some(c) => value.push(c),
            }
        }
        if out.insert(name.clone(), value).is_some() {
            return Err("a label appears twice".into());
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        match it.next() {
            None => return Ok(out),
            Some(',') => {}
            Some(_) => return Err("labels are not separated by `,`".into()),
        }
    }
}

/// The DCGM sentinel a value is, if it is one: `raw` is the value as written, which keeps
/// 64-bit integers exact. Values at or above a family's blank are blank, as DCGM's own
/// `DCGM_*_IS_BLANK` macros say.
pub fn sentinel(raw: &str, value: f64) -> Option<String> {
    const NAMES: [&str; 4] = ["BLANK", "NOT_FOUND", "NOT_SUPPORTED", "NOT_PERMISSIONED"];
    let name = |offset: i128| {
        usize::try_from(offset)
            .ok()
            .and_then(|o| NAMES.get(o))
            .copied()
            .unwrap_or("BLANK")
    };
    if let Ok(i) = raw.trim().parse::<i128>() {
        if i >= DCGM_INT64_BLANK {
            return Some(format!(
                "DCGM int64 {} sentinel",
                name(i - DCGM_INT64_BLANK)
            ));
        }
        if (DCGM_INT32_BLANK..=i128::from(i32::MAX)).contains(&i) {
            return Some(format!(
                "DCGM int32 {} sentinel",
                name(i - DCGM_INT32_BLANK)
            ));
        }
    }
    if value.is_finite() && value >= DCGM_FP64_BLANK {
        let offset = value - DCGM_FP64_BLANK;
        let offset = if offset.fract() == 0.0 && offset < 4.0 {
            offset as i128
        } else {
            -1
        };
        return Some(format!("DCGM fp64 {} sentinel", name(offset)));
    }
    None
}

/// AMD's "not applicable" value, if `value` is one: the exporter's gpuagent marks a field it
/// cannot read with all bits set for its width (255, 65535, 4294967295,
/// 18446744073709551615), and its own `IsValueApplicable` treats these as no value (so it never
/// exports them as readings). Compared as floats, so `4.294967295e+09` and what a Prometheus
/// stores for the 64-bit one (2^64) are recognized too.
pub fn amd_sentinel(value: f64) -> Option<String> {
    const ALL_ONES: [u64; 4] = [0xff, 0xffff, 0xffff_ffff, u64::MAX];
    ALL_ONES
        .iter()
        .any(|a| value == *a as f64)
        .then(|| "AMD not-applicable value (all bits set)".to_string())
}

/// What gpuledger reports for one device (or MIG instance, or partition) field it could not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum UnknownKind {
    /// No series for it.
    Absent,
    /// The exporter sent a "no value" sentinel: DCGM's blank, not found, not supported, not
    /// permissioned; AMD's all-bits-set.
    Sentinel,
    /// A value outside what the field can hold (a ratio of 3, a negative power, NaN).
    Invalid,
    /// The GPU has child series only (MIG instances, AMD compute partitions), so no value for
    /// the whole GPU.
    OnlyMigSeries,
}

/// One unknown field of one GPU or MIG instance, as of its newest reading.
#[derive(Debug, Clone, PartialEq)]
pub struct Unknown {
    pub gpu_uuid: String,
    /// `activity` (util_pct / sm_active), `mem_used_mib`, `power_w` or `memory_mib`.
    pub field: &'static str,
    pub kind: UnknownKind,
    pub detail: String,
}

/// Evidence that a workload held a GPU: the span of readings that carried its labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    pub gpu_uuid: String,
    pub kind: AllocationKind,
    pub workload: String,
    pub first: DateTime<Utc>,
    pub last: DateTime<Utc>,
    /// The GPU's newest reading: a hold whose `last` is older has ended.
    pub gpu_newest: DateTime<Utc>,
    /// The label it came from (`exported_pod`, `pod`, `pod_name`, `hpc_job`).
    pub label: &'static str,
}

impl Hold {
    /// The allocation this evidence shows: from the first reading with the labels, open while
    /// the GPU's newest reading still carries them.
    pub fn allocation(&self) -> PushAllocation {
        PushAllocation {
            context: Default::default(),
            gpu_uuid: self.gpu_uuid.clone(),
            start: self.first,
            end: (self.last < self.gpu_newest).then_some(self.last),
            workload: self.workload.clone(),
            kind: self.kind,
            user: None,
            team: None,
            owner: None,
            avg_util_pct: None,
            avg_mem_used_mib: None,
        }
    }

    /// Widen this hold with another piece of evidence for the same GPU and workload.
    pub fn merge(&mut self, other: &Hold) {
        self.first = self.first.min(other.first);
        self.last = self.last.max(other.last);
        self.gpu_newest = self.gpu_newest.max(other.gpu_newest);
    }
}

/// What a set of series says in gpuledger's terms.
#[derive(Debug, Default)]
pub struct Mapped {
    /// The exporters whose families the series held (see [`families::vendors_present`]).
    pub vendors: BTreeSet<Vendor>,
    /// Physical GPUs, each followed by its MIG instances or partitions (parents first, as
    /// ingest wants).
    pub gpus: Vec<PushGpu>,
    pub samples: Vec<PushSample>,
    pub holds: Vec<Hold>,
    pub unknown: Vec<Unknown>,
    pub problems: Vec<String>,
}

impl Mapped {
    /// The allocations the holds show.
    pub fn allocations(&self) -> Vec<PushAllocation> {
        self.holds.iter().map(Hold::allocation).collect()
    }

    /// Physical GPUs (MIG instances and partitions are never counted as GPUs).
    pub fn physical_gpus(&self) -> impl Iterator<Item = &PushGpu> {
        self.gpus.iter().filter(|g| g.mig_parent_uuid.is_none())
    }

    /// MIG instances and AMD compute partitions.
    pub fn mig_instances(&self) -> impl Iterator<Item = &PushGpu> {
        self.gpus.iter().filter(|g| g.mig_parent_uuid.is_some())
    }
}

/// How one reading of a read metric turned out (in gpuledger's unit: ratio, %, MiB, W).
#[derive(Debug, Clone)]
enum Slot {
    Known(f64),
    Unknown(UnknownKind, String),
}

impl Slot {
    fn known(&self) -> Option<f64> {
        match self {
            Slot::Known(v) => Some(*v),
            Slot::Unknown(..) => None,
        }
    }
}

/// Text attributes of a GPU or instance: the first non-empty value seen wins.
#[derive(Debug, Default)]
struct Attrs {
    model: Option<String>,
    host: Option<String>,
    cluster: Option<String>,
    pci_bus_id: Option<String>,
    serial: Option<String>,
    profile: Option<String>,
    labels: BTreeMap<&'static str, String>,
}

impl Attrs {
    fn fill(&mut self, facts: &families::Facts, profile: Option<&String>) {
        fn set(slot: &mut Option<String>, v: Option<&String>) {
            if slot.is_none() {
                *slot = v.cloned();
            }
        }
        set(&mut self.model, facts.model.as_ref());
        set(&mut self.host, facts.host.as_ref());
        set(&mut self.cluster, facts.cluster.as_ref());
        set(&mut self.pci_bus_id, facts.pci_bus_id.as_ref());
        set(&mut self.serial, facts.serial.as_ref());
        set(&mut self.profile, profile);
        for (k, v) in &facts.labels {
            self.labels.entry(k).or_insert_with(|| v.clone());
        }
    }
}

type HoldKey = (&'static str, String);

/// When a workload's labels were seen on one GPU or instance, and under which label.
#[derive(Debug)]
struct Span {
    first: DateTime<Utc>,
    last: DateTime<Utc>,
    kind: AllocationKind,
    label: &'static str,
}

#[derive(Debug, Default)]
struct Entity {
    attrs: Attrs,
    /// Per reading time, the read metrics' slots (an empty map still proves presence then).
    readings: BTreeMap<DateTime<Utc>, BTreeMap<&'static str, Slot>>,
    /// Whether any series was for this entity itself (for a GPU: not a child's).
    own_series: bool,
    holds: BTreeMap<HoldKey, Span>,
}

impl Entity {
    fn newest(&self) -> Option<DateTime<Utc>> {
        self.readings.keys().next_back().copied()
    }
}

/// A child (MIG instance, partition) under its GPU: numeric ids in numeric order.
type InstanceKey = (u64, String);

#[derive(Debug)]
struct Instance {
    uuid: String,
    label: (&'static str, String),
    entity: Entity,
}

#[derive(Debug)]
struct Gpu {
    profile: &'static Profile,
    entity: Entity,
    instances: BTreeMap<InstanceKey, Instance>,
}

/// Parse an exporter's `/metrics` text and map it ([`parse_text`] then [`map`]), the parse's
/// problems first. Readings without a time are taken at `default_ts`.
pub fn map_text(text: &str, default_ts: DateTime<Utc>) -> Mapped {
    let parsed = parse_text(text);
    let mut mapped = map(&parsed.series, default_ts);
    mapped.problems.splice(0..0, parsed.problems);
    mapped
}

/// The node each Gaudi exporter runs on, by its Prometheus `instance` (`""` for a scrape):
/// its `habanalabs_kube_info` series names it in `node`.
fn gaudi_nodes(series: &[Series]) -> BTreeMap<String, String> {
    series
        .iter()
        .filter(|s| s.metric == families::GAUDI_KUBE_INFO)
        .filter_map(|s| {
            let node = families::known(&s.labels, "node")?;
            Some((text(&s.labels, "instance").unwrap_or_default(), node))
        })
        .collect()
}

/// Map series to GPUs, MIG instances, partitions, samples and holds. Readings without a time
/// are taken at `default_ts` (a scrape's observation time). Which exporters the series come
/// from is read off the families present (see [`families::vendors_present`]): one answer may
/// hold dcgm-exporter's, AMD's and the Gaudi exporter's series (a Prometheus scraping all three).
pub fn map(series: &[Series], default_ts: DateTime<Utc>) -> Mapped {
    let mut problems = Problems::default();
    let vendors = families::vendors_present(series.iter().map(|s| s.metric.as_str()));
    let nodes = gaudi_nodes(series);
    let mut gpus: BTreeMap<String, Gpu> = BTreeMap::new();
    let mut unnamed: BTreeMap<Vendor, usize> = BTreeMap::new();
    let mut bad = BTreeSet::new();
    for s in series {
        let Some(vendor) = families::vendor_of(&s.metric).filter(|v| vendors.contains(v)) else {
            continue;
        };
        let read = families::read_family(&s.metric);
        let lowered;
        let labels = if vendor == Vendor::Amd {
            lowered = families::lower_case(&s.labels);
            &lowered
        } else {
            &s.labels
        };
        let id = match vendor {
            Vendor::Amd => families::amd(labels),
            Vendor::Intel => {
                if s.metric == families::GAUDI_KUBE_INFO {
                    continue;
                }
                let target = text(labels, "instance").unwrap_or_default();
                families::gaudi(labels, nodes.get(&target).map(String::as_str))
            }
            Vendor::Nvidia | Vendor::Other => families::nvidia(labels),
        };
        let device = match id {
            Id::Device(d) => *d,
            Id::Unnamed => {
                // dcgm-exporter always names its GPUs; the others' other families (link
                // counters, node totals) may name nothing, and only read families count.
                if vendor == Vendor::Nvidia || read.is_some() {
                    *unnamed.entry(vendor).or_default() += 1;
                }
                continue;
            }
            Id::Bad { key, problem } => {
                if bad.insert(key) {
                    problems.push(problem);
                }
                continue;
            }
        };
        let profile = families::profile(device.vendor);
        let Device {
            uuid, child, facts, ..
        } = device;
        let gpu = gpus.entry(uuid).or_insert_with(|| Gpu {
            profile,
            entity: Entity::default(),
            instances: BTreeMap::new(),
        });
        gpu.entity.attrs.fill(&facts, None);
        let entity = match child {
            None => {
                gpu.entity.own_series = true;
                &mut gpu.entity
            }
            Some(c) => {
                let inst = gpu.instances.entry(c.key).or_insert_with(|| Instance {
                    uuid: c.uuid,
                    label: c.label,
                    entity: Entity::default(),
                });
                inst.entity.attrs.fill(&facts, c.profile.as_ref());
                &mut inst.entity
            }
        };
        let holders = holders(labels, profile);
        for r in &s.values {
            let ts = r.ts.unwrap_or(default_ts);
            let slots = entity.readings.entry(ts).or_default();
            if let Some((metric, v, unit)) = read {
                slots.insert(metric, classify(metric, v, unit, r));
            }
            for (kind, workload, label) in &holders {
                let e = entity
                    .holds
                    .entry((kind.as_str(), workload.clone()))
                    .or_insert(Span {
                        first: ts,
                        last: ts,
                        kind: *kind,
                        label,
                    });
                e.first = e.first.min(ts);
                e.last = e.last.max(ts);
            }
        }
    }
    let mut out = Mapped {
        vendors,
        ..Mapped::default()
    };
    for (vendor, n) in unnamed {
        let has_gpus = gpus.values().any(|g| g.profile.vendor == vendor);
        match vendor {
            Vendor::Nvidia if !has_gpus => problems.push(format!(
                "{n} DCGM series have no `UUID` label; dcgm-exporter always sets it"
            )),
            Vendor::Amd => problems.push(format!(
                "{n} AMD series name no GPU: `serial_number`, `gpu_uuid` and `hostname` with \
                 `pci_bus_id` are all absent, empty, masked or N/A; they are skipped"
            )),
            Vendor::Intel => problems.push(format!(
                "{n} Gaudi series name no device: `Serial`, `UUID` and a host with `bus_id` \
                 are all absent, empty, masked or N/A; they are skipped"
            )),
            _ => {}
        }
    }
    for (uuid, gpu) in &gpus {
        emit_gpu(&mut out, uuid, gpu);
    }
    out.problems = problems.finish();
    out
}

fn emit_gpu(out: &mut Mapped, uuid: &str, gpu: &Gpu) {
    let e = &gpu.entity;
    let newest = e
        .newest()
        .into_iter()
        .chain(gpu.instances.values().filter_map(|i| i.entity.newest()))
        .max();
    let Some(newest) = newest else {
        return; // series without values: nothing was observed
    };
    let profile = gpu.profile;
    let model = e.attrs.model.clone().unwrap_or_else(|| UNKNOWN.to_string());
    let labels: BTreeMap<String, String> = e
        .attrs
        .labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let latest = e.readings.values().next_back();
    out.gpus.push(PushGpu {
        account: None,
        uuid: uuid.to_string(),
        model: model.clone(),
        memory_mib: latest.and_then(|s| memory_mib(s, profile)),
        host: e.attrs.host.clone(),
        cluster: e.attrs.cluster.clone(),
        cloud: None,
        region: None,
        instance_type: None,
        serial: e.attrs.serial.clone(),
        pci_bus_id: e.attrs.pci_bus_id.clone(),
        mig_parent_uuid: None,
        mig_profile: None,
        labels: labels.clone(),
        observed_at: newest,
    });
    if e.own_series {
        emit_readings(out, uuid, e, true, profile);
    } else {
        for field in ["activity", "mem_used_mib", "power_w", "memory_mib"] {
            out.unknown.push(Unknown {
                gpu_uuid: uuid.to_string(),
                field,
                kind: UnknownKind::OnlyMigSeries,
                detail: profile.only_children.into(),
            });
        }
    }
    for inst in gpu.instances.values() {
        let Some(inst_newest) = inst.entity.newest() else {
            continue;
        };
        // The GPU's labels, with what the child's own series say instead (a partition's
        // `gpu_index`), and the child's number.
        let mut inst_labels = labels.clone();
        for (k, v) in &inst.entity.attrs.labels {
            inst_labels.insert(k.to_string(), v.clone());
        }
        inst_labels.insert(inst.label.0.to_string(), inst.label.1.clone());
        out.gpus.push(PushGpu {
            account: None,
            uuid: inst.uuid.clone(),
            model: model.clone(),
            memory_mib: inst
                .entity
                .readings
                .values()
                .next_back()
                .and_then(|s| memory_mib(s, profile)),
            host: e.attrs.host.clone(),
            cluster: e.attrs.cluster.clone(),
            cloud: None,
            region: None,
            instance_type: None,
            serial: None,
            pci_bus_id: e.attrs.pci_bus_id.clone(),
            mig_parent_uuid: Some(uuid.to_string()),
            mig_profile: inst.entity.attrs.profile.clone(),
            labels: inst_labels,
            observed_at: inst_newest,
        });
        emit_readings(out, &inst.uuid, &inst.entity, false, profile);
    }
}

/// The first known value of `metrics` in `slots`, with the family it came from.
fn first(
    slots: &BTreeMap<&'static str, Slot>,
    metrics: &[&'static str],
) -> Option<(&'static str, f64)> {
    metrics
        .iter()
        .find_map(|m| slots.get(m).and_then(Slot::known).map(|v| (*m, v)))
}

/// Samples, unknowns and holds of one GPU or child. `whole_gpu` is false for MIG instances and
/// partitions: exporters report board power on their series too, but it belongs to the GPU.
fn emit_readings(out: &mut Mapped, uuid: &str, e: &Entity, whole_gpu: bool, profile: &Profile) {
    for (ts, slots) in &e.readings {
        let util_pct = first(slots, profile.activity).map(|(m, v)| {
            if families::read_family(m).is_some_and(|(_, _, u)| u == Unit::Ratio) {
                // Rounded to 1e-6 so that 0.995687 reads 99.5687, not 99.56869999999999.
                ((v * 1e8).round() / 1e6).clamp(0.0, 100.0)
            } else {
                v
            }
        });
        let sample = PushSample {
            gpu_uuid: uuid.to_string(),
            ts: *ts,
            util_pct,
            mem_used_mib: first(slots, profile.mem_used).map(|(_, v)| v),
            power_w: if whole_gpu {
                first(slots, profile.power).map(|(_, v)| v)
            } else {
                None
            },
            sm_active: first(slots, profile.sm_active).map(|(_, v)| v),
        };
        if sample.util_pct.is_some()
            || sample.sm_active.is_some()
            || sample.mem_used_mib.is_some()
            || sample.power_w.is_some()
        {
            out.samples.push(sample);
        }
    }
    if let Some(slots) = e.readings.values().next_back() {
        let activity: Vec<&'static str> = profile
            .activity
            .iter()
            .chain(profile.sm_active)
            .copied()
            .collect();
        let mut fields: Vec<(&'static str, Vec<&'static str>, bool)> = vec![
            ("activity", activity, false),
            ("mem_used_mib", profile.mem_used.to_vec(), false),
        ];
        if whole_gpu {
            fields.push(("power_w", profile.power.to_vec(), false));
        }
        // Total memory from used + free needs both.
        fields.push(match profile.memory {
            Memory::UsedPlusFree { used, free, .. } => ("memory_mib", vec![used, free], true),
            Memory::Total(totals) => ("memory_mib", totals.to_vec(), false),
        });
        for (field, metrics, all) in fields {
            let mut known = metrics
                .iter()
                .map(|m| slots.get(m).and_then(Slot::known).is_some());
            let is_known = if all {
                known.all(|k| k)
            } else {
                known.any(|k| k)
            };
            if is_known {
                continue;
            }
            let (kind, detail) = metrics
                .iter()
                .find_map(|m| match slots.get(m) {
                    Some(Slot::Unknown(kind, detail)) => Some((*kind, detail.clone())),
                    _ => None,
                })
                .unwrap_or_else(|| {
                    let missing: Vec<&str> = metrics
                        .iter()
                        .filter(|m| !slots.contains_key(*m))
                        .copied()
                        .collect();
                    (UnknownKind::Absent, format!("no {}", missing.join(", ")))
                });
            out.unknown.push(Unknown {
                gpu_uuid: uuid.to_string(),
                field,
                kind,
                detail,
            });
        }
    }
    if let Some(newest) = e.newest() {
        for ((_, workload), span) in &e.holds {
            out.holds.push(Hold {
                gpu_uuid: uuid.to_string(),
                kind: span.kind,
                workload: workload.clone(),
                first: span.first,
                last: span.last,
                gpu_newest: newest,
                label: span.label,
            });
        }
    }
}

/// Total memory, MiB: DCGM's used + free (+ reserved where reported) when used and free are
/// known; the others' first known total.
fn memory_mib(slots: &BTreeMap<&'static str, Slot>, profile: &Profile) -> Option<u64> {
    let get = |m: &str| slots.get(m).and_then(Slot::known);
    let total = match profile.memory {
        Memory::UsedPlusFree {
            used,
            free,
            reserved,
        } => get(used)? + get(free)? + get(reserved).unwrap_or(0.0),
        Memory::Total(totals) => first(slots, totals)?.1,
    };
    let total = total.round();
    (1.0..=MAX_MIB).contains(&total).then_some(total as u64)
}

/// Check one reading of a read metric: sentinels and impossible values become unknown; the
/// value is converted to gpuledger's unit.
fn classify(metric: &'static str, vendor: Vendor, unit: Unit, r: &Reading) -> Slot {
    let sentinel = match vendor {
        Vendor::Nvidia => sentinel(&r.raw, r.value),
        Vendor::Amd => amd_sentinel(r.value),
        _ => None,
    };
    if let Some(s) = sentinel {
        return Slot::Unknown(
            UnknownKind::Sentinel,
            format!("{metric} = {}: {s}", clip(&r.raw)),
        );
    }
    if !r.value.is_finite() {
        return Slot::Unknown(
            UnknownKind::Invalid,
            format!("{metric} = {}: not a finite number", clip(&r.raw)),
        );
    }
    let v = unit.convert(r.value);
    let (lo, hi, hint) = unit.range();
    if v < lo || v > hi {
        return Slot::Unknown(
            UnknownKind::Invalid,
            format!("{metric} = {}: outside {hint}", clip(&r.raw)),
        );
    }
    Slot::Known(match unit {
        Unit::Ratio => v.min(1.0),
        _ => v,
    })
}

/// Who held the GPU of a series, by its labels: a pod (in `profile`'s spellings) and/or an
/// HPC job.
fn holders(
    labels: &BTreeMap<String, String>,
    profile: &Profile,
) -> Vec<(AllocationKind, String, &'static str)> {
    let mut out = Vec::new();
    for (pod_label, ns_label, container_label) in profile.pods {
        let Some(pod) = text(labels, pod_label) else {
            continue;
        };
        let container = text(labels, container_label);
        // A Prometheus target label names the exporter's own pod; that is no workload.
        if is_exporter_pod(&pod)
            || container.as_deref().is_some_and(is_exporter_container)
            || [text(labels, "Hostname"), text(labels, "hostname")]
                .iter()
                .any(|h| h.as_deref() == Some(pod.as_str()))
        {
            continue;
        }
        let workload = match text(labels, ns_label) {
            Some(ns) => format!("{ns}/{pod}"),
            None => pod,
        };
        if workload.len() <= MAX_TEXT_BYTES {
            out.push((AllocationKind::Pod, workload, *pod_label));
        }
        break;
    }
    if let Some(job_label) = profile.job {
        if let Some(job) = text(labels, job_label) {
            out.push((AllocationKind::SlurmJob, job, job_label));
        }
    }
    out
}

/// Problems, the first few listed and the rest counted.
#[derive(Default)]
struct Problems {
    list: Vec<String>,
    more: usize,
}

impl Problems {
    fn push(&mut self, p: String) {
        if self.list.len() < MAX_PROBLEMS {
            self.list.push(p);
        } else {
            self.more += 1;
        }
    }

    fn finish(mut self) -> Vec<String> {
        if self.more > 0 {
            self.list.push(format!("… and {} more problems", self.more));
        }
        self.list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        "2026-12-02T12:00:00Z".parse().unwrap()
    }

    const T4: &str = r#"DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",modelName="Tesla T4",Hostname="node-1"} 42
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",modelName="Tesla T4",Hostname="node-1"} 100
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a",modelName="Tesla T4",Hostname="node-1"} 15000
"#;

    #[test]
    fn labels_keep_commas_equals_and_escapes() {
        let l = parse_labels(r#"a="x, y=z",b="q\"uote\\",c="line\nbreak","#).unwrap();
        assert_eq!(l["a"], "x, y=z");
        assert_eq!(l["b"], "q\"uote\\");
        assert_eq!(l["c"], "line\nbreak");
        assert!(parse_labels(r#"a="open"#).is_err());
        assert!(parse_labels(r#"a=1"#).is_err());
        assert!(parse_labels(r#"a="1",a="2""#).is_err());
        assert!(parse_labels("").unwrap().is_empty());
    }

    #[test]
    fn sentinels_are_named_and_exact() {
        assert_eq!(
            sentinel("9223372036854775794", 9.223372036854776e18).as_deref(),
            Some("DCGM int64 NOT_SUPPORTED sentinel")
        );
        assert_eq!(
            sentinel("9223372036854775792", 9.223372036854776e18).as_deref(),
            Some("DCGM int64 BLANK sentinel")
        );
        assert_eq!(
            sentinel("9223372036854775795", 9.223372036854776e18).as_deref(),
            Some("DCGM int64 NOT_PERMISSIONED sentinel")
        );
        // What a Prometheus gives back after storing it as a float.
        assert!(sentinel("9223372036854775808", 9.223372036854776e18).is_some());
        assert_eq!(
            sentinel("2147483633", 2147483633.0).as_deref(),
            Some("DCGM int32 NOT_FOUND sentinel")
        );
        assert_eq!(
            sentinel("140737488355330.000000", 140737488355330.0).as_deref(),
            Some("DCGM fp64 NOT_SUPPORTED sentinel")
        );
        assert!(sentinel("1.40737488355328e+14", 140737488355328.0).is_some());
        for plain in ["0", "42", "5551899580", "0.995630", "2147483631"] {
            assert_eq!(sentinel(plain, plain.parse().unwrap()), None, "{plain}");
        }
    }

    #[test]
    fn sentinel_and_absent_metrics_are_unknown_not_zero() {
        let text = format!(
            "{T4}DCGM_FI_DEV_POWER_USAGE{{gpu=\"0\",UUID=\"GPU-a\"}} 9223372036854775794\n"
        );
        let m = map(&parse_text(&text).series, now());
        assert_eq!(m.samples.len(), 1);
        let s = &m.samples[0];
        assert_eq!(
            (s.util_pct, s.mem_used_mib, s.power_w, s.sm_active),
            (Some(42.0), Some(100.0), None, None)
        );
        assert_eq!(m.gpus[0].memory_mib, Some(15100));
        let power = m.unknown.iter().find(|u| u.field == "power_w").unwrap();
        assert_eq!(power.kind, UnknownKind::Sentinel);
        assert!(power.detail.contains("NOT_SUPPORTED"), "{}", power.detail);

        let m = map(&parse_text(T4).series, now());
        let power = m.unknown.iter().find(|u| u.field == "power_w").unwrap();
        assert_eq!(power.kind, UnknownKind::Absent);
        assert_eq!(power.detail, "no DCGM_FI_DEV_POWER_USAGE");
    }

    #[test]
    fn gr_engine_active_wins_over_gpu_util_and_sm_active_is_kept() {
        let text = format!(
            "{T4}DCGM_FI_PROF_GR_ENGINE_ACTIVE{{UUID=\"GPU-a\"}} 0.5\nDCGM_FI_PROF_SM_ACTIVE{{UUID=\"GPU-a\"}} 0.25\n"
        );
        let m = map(&parse_text(&text).series, now());
        assert_eq!(m.samples[0].util_pct, Some(50.0));
        assert_eq!(m.samples[0].sm_active, Some(0.25));
        assert_eq!(m.samples[0].activity_pct(), Some(25.0));
    }

    #[test]
    fn impossible_values_are_unknown() {
        let m = map(
            &parse_text("DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 250\nDCGM_FI_DEV_FB_USED{UUID=\"GPU-a\"} NaN\n")
                .series,
            now(),
        );
        assert!(m.samples.is_empty());
        let kinds: Vec<_> = m.unknown.iter().map(|u| (u.field, u.kind)).collect();
        assert!(
            kinds.contains(&("activity", UnknownKind::Invalid)),
            "{kinds:?}"
        );
        assert!(
            kinds.contains(&("mem_used_mib", UnknownKind::Invalid)),
            "{kinds:?}"
        );
    }

    #[test]
    fn pod_labels_prefer_exported_and_skip_the_exporter_itself() {
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let h = holders(
            &labels(&[
                ("pod", "nvidia-dcgm-exporter-x2x9z"),
                ("namespace", "gpu-operator"),
                ("exported_pod", "train-0"),
                ("exported_namespace", "ml"),
            ]),
            &families::DCGM,
        );
        assert_eq!(
            h,
            vec![(AllocationKind::Pod, "ml/train-0".into(), "exported_pod")]
        );
        let h = holders(
            &labels(&[
                ("pod", "nvidia-dcgm-exporter-x2x9z"),
                ("namespace", "gpu-operator"),
            ]),
            &families::DCGM,
        );
        assert!(h.is_empty());
        let h = holders(
            &labels(&[
                ("pod_name", "legacy-0"),
                ("pod_namespace", "old"),
                ("hpc_job", "4242"),
            ]),
            &families::DCGM,
        );
        assert_eq!(
            h,
            vec![
                (AllocationKind::Pod, "old/legacy-0".into(), "pod_name"),
                (AllocationKind::SlurmJob, "4242".into(), "hpc_job"),
            ]
        );
        assert!(holders(&labels(&[("pod", ""), ("namespace", "")]), &families::DCGM).is_empty());
    }

    #[test]
    fn exporter_pod_names_are_hosts_only_as_a_stand_in() {
        let m = map(
            &parse_text(
                "DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\",Hostname=\"nvidia-dcgm-exporter-s228n\",kubernetes_node=\"gpu-7\"} 1\n\
                 DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-b\",Hostname=\"nvidia-dcgm-exporter-s228n\"} 1\n",
            )
            .series,
            now(),
        );
        assert_eq!(m.gpus[0].host.as_deref(), Some("gpu-7"));
        assert_eq!(
            m.gpus[1].host.as_deref(),
            Some("nvidia-dcgm-exporter-s228n")
        );
    }

    #[test]
    fn bad_lines_and_uuids_are_problems_and_the_rest_is_kept() {
        let text = format!(
            "{T4}DCGM_FI_DEV_GPU_UTIL{{UUID=\"GPU-a\" 3\nDCGM_FI_DEV_GPU_UTIL{{UUID=\"GPU-b\"}} many\nDCGM_FI_DEV_GPU_UTIL{{UUID=\"nope\"}} 1\nDCGM_FI_DEV_GPU_UTIL{{UUID=\"GPU-c\",GPU_I_ID=\"x/y\"}} 1\n"
        );
        let p = parse_text(&text);
        assert_eq!(p.problems.len(), 2, "{:?}", p.problems);
        assert!(p.problems[0].starts_with("line 4 "), "{:?}", p.problems);
        assert!(
            !p.problems
                .iter()
                .any(|p| p.contains("GPU-a") || p.contains("many")),
            "the answer's text is never repeated: {:?}",
            p.problems
        );
        let m = map(&p.series, now());
        assert_eq!(
            m.gpus.len(),
            1,
            "GPU-a; GPU-c had only a bad GPU_I_ID series"
        );
        assert_eq!(m.problems.len(), 2, "{:?}", m.problems);
    }

    #[test]
    fn api_answers_parse_and_errors_say_why() {
        let body = br#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","UUID":"GPU-a","pod":"p","namespace":"n"},
             "values":[[1764676800,"10"],[1764676860,"20"]]},
            {"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","UUID":"GPU-a"},
             "values":[[1764676920,"30"]]},
            {"metric":{"UUID":"GPU-x"},"values":[[1,"1"]]},
            {"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL"},"values":"nonsense"}]}}"#;
        let p = parse_api(body).unwrap();
        assert_eq!(p.series.len(), 2);
        assert_eq!(p.problems.len(), 2, "{:?}", p.problems);
        let m = map(&p.series, now());
        let utils: Vec<_> = m.samples.iter().map(|s| s.util_pct.unwrap()).collect();
        assert_eq!(utils, [10.0, 20.0, 30.0]);
        let a = m.allocations();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].workload, "n/p");
        assert_eq!(a[0].start.timestamp(), 1764676800);
        assert_eq!(
            a[0].end.map(|e| e.timestamp()),
            Some(1764676860),
            "ended before the newest"
        );

        let e = parse_api(br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#)
            .unwrap_err();
        assert_eq!(e.error_type.as_deref(), Some("bad_data"));
        assert!(e.message.contains("error `bad_data`"), "{}", e.message);
        assert!(
            !e.message.contains("parse error"),
            "only in the log: {}",
            e.message
        );
        assert_eq!(e.detail.as_deref(), Some("parse error"));
        assert!(parse_api(b"<html>")
            .unwrap_err()
            .message
            .contains("prometheus_url"));
        assert!(
            parse_api(br#"{"status":"success","data":{"resultType":"scalar","result":[]}}"#)
                .is_err()
        );
    }
}
