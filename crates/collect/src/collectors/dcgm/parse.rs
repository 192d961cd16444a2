//! Pure parsing for the `dcgm` collector: dcgm-exporter's `/metrics` text or a Prometheus API
//! answer in, GPUs, MIG instances, samples and allocation evidence out. No IO; every input is
//! untrusted, so nothing here panics on bad bytes: bad lines become problems, the rest is kept.
//!
//! The scrape text is split into lines by `prometheus-parse` ([`LineInfo::parse`]); label sets are
//! read here, because that crate's own label reader splits on `,` and `=` without regard to
//! quotes and keeps escapes (`err_msg="a, b"` would lose its value).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeZone, Utc};
use gpuledger_model::{AllocationKind, PushAllocation, PushGpu, PushSample, UNKNOWN};
use prometheus_parse::LineInfo;
use serde::Deserialize;

/// Graphics-engine activity, a ratio 0..=1 (dcgm-exporter's HELP says "in %", the values are ratios).
pub const GR_ENGINE_ACTIVE: &str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE";
/// SM activity, a ratio 0..=1.
pub const SM_ACTIVE: &str = "DCGM_FI_PROF_SM_ACTIVE";
/// NVML's coarse utilization, percent 0..=100.
pub const GPU_UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
/// Framebuffer used, MiB.
pub const FB_USED: &str = "DCGM_FI_DEV_FB_USED";
/// Framebuffer free, MiB.
pub const FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";
/// Framebuffer reserved by the driver, MiB (DCGM 3.x and later).
pub const FB_RESERVED: &str = "DCGM_FI_DEV_FB_RESERVED";
/// Board power draw, W.
pub const POWER_USAGE: &str = "DCGM_FI_DEV_POWER_USAGE";

/// Every metric whose value gpuledger reads; the others only prove that a GPU exists.
pub const READ_METRICS: [&str; 7] = [
    GR_ENGINE_ACTIVE,
    SM_ACTIVE,
    GPU_UTIL,
    FB_USED,
    FB_FREE,
    FB_RESERVED,
    POWER_USAGE,
];

/// DCGM's blank value for 32-bit integer fields (`DCGM_INT32_BLANK`); +1 not found, +2 not
/// supported, +3 not permissioned, and DCGM treats everything above as blank too.
pub const DCGM_INT32_BLANK: i128 = 0x7fff_fff0;
/// DCGM's blank value for 64-bit integer fields (`DCGM_INT64_BLANK`, 9223372036854775792); the
/// same offsets as for 32-bit fields, so 9223372036854775794 is "not supported".
pub const DCGM_INT64_BLANK: i128 = 0x7fff_ffff_ffff_fff0;
/// DCGM's blank value for floating-point fields (`DCGM_FP64_BLANK`, 2^47); the same offsets.
pub const DCGM_FP64_BLANK: f64 = 140_737_488_355_328.0;

/// The metric-name prefix of DCGM fields.
const FIELD_PREFIX: &str = "DCGM_FI_";
/// The longest text the push contract accepts in a field or label value.
const MAX_TEXT_BYTES: usize = 256;
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

/// Parse dcgm-exporter's `/metrics` text. Keeps only `DCGM_FI_*` series. Blank lines, `# HELP`
/// and `# TYPE` lines, their absence and a missing final newline are all fine.
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
                if !metric_name.starts_with(FIELD_PREFIX) {
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

/// What gpuledger reports for one GPU (or MIG instance) field it could not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum UnknownKind {
    /// No series for it.
    Absent,
    /// The exporter sent a DCGM sentinel (blank, not found, not supported, not permissioned).
    Sentinel,
    /// A value outside what the field can hold (a ratio of 3, a negative power, NaN).
    Invalid,
    /// The GPU has MIG instance series only, so no value for the whole GPU.
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
    /// Physical GPUs, each followed by its MIG instances (parents first, as ingest wants).
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

    /// Physical GPUs (MIG instances are never counted as GPUs).
    pub fn physical_gpus(&self) -> impl Iterator<Item = &PushGpu> {
        self.gpus.iter().filter(|g| g.mig_parent_uuid.is_none())
    }

    /// MIG instances.
    pub fn mig_instances(&self) -> impl Iterator<Item = &PushGpu> {
        self.gpus.iter().filter(|g| g.mig_parent_uuid.is_some())
    }
}

/// How one reading of a read metric turned out.
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
    driver_version: Option<String>,
    gpu_index: Option<String>,
    profile: Option<String>,
}

impl Attrs {
    fn fill(&mut self, labels: &BTreeMap<String, String>) {
        fn set(slot: &mut Option<String>, v: Option<String>) {
            if slot.is_none() {
                *slot = v;
            }
        }
        set(&mut self.model, text(labels, "modelName"));
        set(&mut self.host, host(labels));
        set(&mut self.cluster, text(labels, "cluster"));
        set(&mut self.pci_bus_id, text(labels, "pci_bus_id"));
        set(
            &mut self.driver_version,
            text(labels, "DCGM_FI_DRIVER_VERSION"),
        );
        set(&mut self.gpu_index, text(labels, "gpu"));
        set(&mut self.profile, text(labels, "GPU_I_PROFILE"));
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
    /// Whether any series was for this entity itself (for a GPU: without `GPU_I_ID`).
    own_series: bool,
    holds: BTreeMap<HoldKey, Span>,
}

impl Entity {
    fn newest(&self) -> Option<DateTime<Utc>> {
        self.readings.keys().next_back().copied()
    }
}

/// A MIG instance's key under its GPU: numeric ids in numeric order.
type InstanceKey = (u64, String);

#[derive(Debug, Default)]
struct Gpu {
    entity: Entity,
    instances: BTreeMap<InstanceKey, Entity>,
}

/// Map series to GPUs, MIG instances, samples and holds. Readings without a time are taken at
/// `default_ts` (a scrape's observation time).
pub fn map(series: &[Series], default_ts: DateTime<Utc>) -> Mapped {
    let mut problems = Problems::default();
    let mut gpus: BTreeMap<String, Gpu> = BTreeMap::new();
    let mut without_uuid = 0usize;
    let mut bad_uuids = BTreeSet::new();
    for s in series {
        if !s.metric.starts_with(FIELD_PREFIX) {
            continue;
        }
        let Some(uuid) = text(&s.labels, "UUID") else {
            without_uuid += 1;
            continue;
        };
        if !gpu_uuid_ok(&uuid) {
            if bad_uuids.insert(uuid.clone()) {
                problems.push(if uuid.starts_with("MIG-") {
                    format!(
                        "UUID `{}` is a MIG instance without its GPU's UUID; its series are skipped",
                        clip(&uuid)
                    )
                } else {
                    format!(
                        "UUID `{}` is not an NVIDIA `GPU-…` UUID; its series are skipped",
                        clip(&uuid)
                    )
                });
            }
            continue;
        }
        let instance = match text(&s.labels, "GPU_I_ID") {
            None => None,
            Some(gi) if gi.len() <= 6 && gi.chars().all(|c| c.is_ascii_digit()) => {
                Some((gi.parse::<u64>().unwrap_or(u64::MAX), gi))
            }
            Some(gi) => {
                if bad_uuids.insert(format!("{uuid}/{gi}")) {
                    problems.push(format!(
                        "GPU_I_ID `{}` on {uuid} is not a GPU instance number; its series are skipped",
                        clip(&gi)
                    ));
                }
                continue;
            }
        };
        let gpu = gpus.entry(uuid).or_default();
        gpu.entity.attrs.fill(&s.labels);
        let entity = match instance {
            None => {
                gpu.entity.own_series = true;
                &mut gpu.entity
            }
            Some(key) => {
                let e = gpu.instances.entry(key).or_default();
                e.attrs.fill(&s.labels);
                e
            }
        };
        let read = READ_METRICS.iter().find(|m| **m == s.metric).copied();
        let holders = holders(&s.labels);
        for r in &s.values {
            let ts = r.ts.unwrap_or(default_ts);
            let slots = entity.readings.entry(ts).or_default();
            if let Some(metric) = read {
                slots.insert(metric, classify(metric, r));
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
    let mut out = Mapped::default();
    if gpus.is_empty() && without_uuid > 0 {
        problems.push(format!(
            "{without_uuid} DCGM series have no `UUID` label; dcgm-exporter always sets it"
        ));
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
        .chain(gpu.instances.values().filter_map(Entity::newest))
        .max();
    let Some(newest) = newest else {
        return; // series without values: nothing was observed
    };
    let model = e.attrs.model.clone().unwrap_or_else(|| UNKNOWN.to_string());
    let mut labels = BTreeMap::new();
    if let Some(v) = &e.attrs.driver_version {
        labels.insert("driver_version".to_string(), v.clone());
    }
    if let Some(v) = &e.attrs.gpu_index {
        labels.insert("gpu_index".to_string(), v.clone());
    }
    let latest = e.readings.values().next_back();
    out.gpus.push(PushGpu {
        account: None,
        uuid: uuid.to_string(),
        model: model.clone(),
        memory_mib: latest.and_then(memory_mib),
        host: e.attrs.host.clone(),
        cluster: e.attrs.cluster.clone(),
        cloud: None,
        region: None,
        instance_type: None,
        serial: None,
        pci_bus_id: e.attrs.pci_bus_id.clone(),
        mig_parent_uuid: None,
        mig_profile: None,
        labels: labels.clone(),
        observed_at: newest,
    });
    if e.own_series {
        emit_readings(out, uuid, e, true);
    } else {
        for field in ["activity", "mem_used_mib", "power_w", "memory_mib"] {
            out.unknown.push(Unknown {
                gpu_uuid: uuid.to_string(),
                field,
                kind: UnknownKind::OnlyMigSeries,
                detail: "only MIG instance series: no value for the whole GPU".into(),
            });
        }
    }
    for ((_, gi), inst) in &gpu.instances {
        let Some(inst_newest) = inst.newest() else {
            continue;
        };
        let mig_uuid = format!("MIG-{uuid}/{gi}");
        let mut inst_labels = labels.clone();
        inst_labels.insert("gpu_instance_id".to_string(), gi.clone());
        out.gpus.push(PushGpu {
            account: None,
            uuid: mig_uuid.clone(),
            model: model.clone(),
            memory_mib: inst.readings.values().next_back().and_then(memory_mib),
            host: e.attrs.host.clone(),
            cluster: e.attrs.cluster.clone(),
            cloud: None,
            region: None,
            instance_type: None,
            serial: None,
            pci_bus_id: e.attrs.pci_bus_id.clone(),
            mig_parent_uuid: Some(uuid.to_string()),
            mig_profile: inst.attrs.profile.clone(),
            labels: inst_labels,
            observed_at: inst_newest,
        });
        emit_readings(out, &mig_uuid, inst, false);
    }
}

/// Samples, unknowns and holds of one GPU or instance. `whole_gpu` is false for MIG instances:
/// DCGM reports board power on instance series too, but it belongs to the whole GPU.
fn emit_readings(out: &mut Mapped, uuid: &str, e: &Entity, whole_gpu: bool) {
    for (ts, slots) in &e.readings {
        let get = |m: &str| slots.get(m).and_then(Slot::known);
        let sample = PushSample {
            gpu_uuid: uuid.to_string(),
            ts: *ts,
            // Rounded to 1e-6 so that 0.995687 reads 99.5687, not 99.56869999999999.
            util_pct: get(GR_ENGINE_ACTIVE)
                .map(|r| ((r * 1e8).round() / 1e6).clamp(0.0, 100.0))
                .or_else(|| get(GPU_UTIL)),
            mem_used_mib: get(FB_USED),
            power_w: if whole_gpu { get(POWER_USAGE) } else { None },
            sm_active: get(SM_ACTIVE),
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
        let mut fields: Vec<(&'static str, &[&'static str])> = vec![
            ("activity", &[GR_ENGINE_ACTIVE, SM_ACTIVE, GPU_UTIL]),
            ("mem_used_mib", &[FB_USED]),
        ];
        if whole_gpu {
            fields.push(("power_w", &[POWER_USAGE]));
        }
        fields.push(("memory_mib", &[FB_USED, FB_FREE]));
        for (field, metrics) in fields {
            let known: Vec<bool> = metrics
                .iter()
                .map(|m| slots.get(m).and_then(Slot::known).is_some())
                .collect();
            // Activity needs one of its metrics; total memory needs both of its.
            let is_known = if field == "memory_mib" {
                known.iter().all(|k| *k)
            } else {
                known.iter().any(|k| *k)
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

/// Total framebuffer: used + free (+ reserved where reported), when used and free are known.
fn memory_mib(slots: &BTreeMap<&'static str, Slot>) -> Option<u64> {
    let get = |m: &str| slots.get(m).and_then(Slot::known);
    let total = get(FB_USED)? + get(FB_FREE)? + get(FB_RESERVED).unwrap_or(0.0);
    let total = total.round();
    (1.0..=16.0 * 1024.0 * 1024.0)
        .contains(&total)
        .then_some(total as u64)
}

/// Check one reading of a read metric: sentinels and impossible values become unknown.
fn classify(metric: &'static str, r: &Reading) -> Slot {
    if let Some(s) = sentinel(&r.raw, r.value) {
        return Slot::Unknown(
            UnknownKind::Sentinel,
            format!("{metric} = {}: {s}", clip(&r.raw)),
        );
    }
    let v = r.value;
    if !v.is_finite() {
        return Slot::Unknown(
            UnknownKind::Invalid,
            format!("{metric} = {}: not a finite number", clip(&r.raw)),
        );
    }
    let (lo, hi, hint) = match metric {
        // Ratios: a hair over 1 is float noise, not a fault.
        GR_ENGINE_ACTIVE | SM_ACTIVE => (0.0, 1.001, "0..=1"),
        GPU_UTIL => (0.0, 100.0, "0..=100"),
        POWER_USAGE => (0.0, 10_000.0, "0..=10000 W"),
        _ => (0.0, 16.0 * 1024.0 * 1024.0, "0..=16777216 MiB"),
    };
    if v < lo || v > hi {
        return Slot::Unknown(
            UnknownKind::Invalid,
            format!("{metric} = {}: outside {hint}", clip(&r.raw)),
        );
    }
    Slot::Known(match metric {
        GR_ENGINE_ACTIVE | SM_ACTIVE => v.min(1.0),
        _ => v,
    })
}

/// The label spellings of a pod across dcgm-exporter versions and Prometheus relabelling, in
/// order of preference: Prometheus renames the exporter's `pod` to `exported_pod` when its own
/// target label (the exporter's pod) would clash.
const POD_SPELLINGS: [(&str, &str, &str); 3] = [
    ("exported_pod", "exported_namespace", "exported_container"),
    ("pod", "namespace", "container"),
    ("pod_name", "pod_namespace", "container_name"),
];

/// Who held the GPU of a series, by its labels: a pod and/or an HPC job.
fn holders(labels: &BTreeMap<String, String>) -> Vec<(AllocationKind, String, &'static str)> {
    let mut out = Vec::new();
    for (pod_label, ns_label, container_label) in POD_SPELLINGS {
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
            out.push((AllocationKind::Pod, workload, pod_label));
        }
        break;
    }
    if let Some(job) = text(labels, "hpc_job") {
        out.push((AllocationKind::SlurmJob, job, "hpc_job"));
    }
    out
}

/// dcgm-exporter in Kubernetes names its pods after itself (`nvidia-dcgm-exporter-x2x9z` under
/// the GPU Operator, `dcgm-exporter-…` from its Helm chart); older versions put that pod name
/// in `Hostname`, which is then no host at all.
fn is_exporter_pod(name: &str) -> bool {
    name.starts_with("nvidia-dcgm-exporter-") || name.starts_with("dcgm-exporter-")
}

fn is_exporter_container(name: &str) -> bool {
    name == "nvidia-dcgm-exporter" || name == "dcgm-exporter"
}

/// The GPU's host: `Hostname` (dcgm-exporter), `hostname` (some relabellings), then `node` or
/// `kubernetes_node` (Prometheus relabelling), preferring any of them to an exporter pod's
/// name. An exporter pod's name is kept only as a stand-in: a kubernetes source maps it to the
/// node the pod runs on (a host alias), and the store then files the GPU under that node.
fn host(labels: &BTreeMap<String, String>) -> Option<String> {
    let names: Vec<String> = ["Hostname", "hostname", "node", "kubernetes_node"]
        .iter()
        .filter_map(|k| text(labels, k))
        .collect();
    names
        .iter()
        .find(|h| !is_exporter_pod(h))
        .or(names.first())
        .cloned()
}

/// A label's value when it is usable as text: not blank, at most 256 bytes.
fn text(labels: &BTreeMap<String, String>, key: &str) -> Option<String> {
    let v = labels.get(key)?.trim();
    (!v.is_empty() && v.len() <= MAX_TEXT_BYTES).then(|| v.to_string())
}

/// An NVIDIA physical GPU UUID, short enough that `MIG-<uuid>/<gi>` still fits the contract.
fn gpu_uuid_ok(uuid: &str) -> bool {
    uuid.starts_with("GPU-")
        && uuid.len() <= 116
        && uuid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// At most 80 characters of untrusted text for a message.
fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(80).collect();
    if out.len() < s.len() {
        out.push('…');
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
        let h = holders(&labels(&[
            ("pod", "nvidia-dcgm-exporter-x2x9z"),
            ("namespace", "gpu-operator"),
            ("exported_pod", "train-0"),
            ("exported_namespace", "ml"),
        ]));
        assert_eq!(
            h,
            vec![(AllocationKind::Pod, "ml/train-0".into(), "exported_pod")]
        );
        let h = holders(&labels(&[
            ("pod", "nvidia-dcgm-exporter-x2x9z"),
            ("namespace", "gpu-operator"),
        ]));
        assert!(h.is_empty());
        let h = holders(&labels(&[
            ("pod_name", "legacy-0"),
            ("pod_namespace", "old"),
            ("hpc_job", "4242"),
        ]));
        assert_eq!(
            h,
            vec![
                (AllocationKind::Pod, "old/legacy-0".into(), "pod_name"),
                (AllocationKind::SlurmJob, "4242".into(), "hpc_job"),
            ]
        );
        assert!(holders(&labels(&[("pod", ""), ("namespace", "")])).is_empty());
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
