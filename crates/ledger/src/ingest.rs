//! Decoding and validating push API v1 bodies (BRIEF section 3).
//!
//! A body that cannot be read at all (not JSON, not an object, too large, bad gzip) is refused
//! whole with a [`DecodeError`]. Otherwise every record is checked on its own: valid records are
//! kept and each rejected one is named by its JSON path with a reason a person can act on.

use std::collections::BTreeMap;
use std::io::Read;

use chrono::{DateTime, Utc};
use flate2::read::GzDecoder;
use gpuledger_model::{PushAllocation, PushGpu, PushSample, Vendor, DAY_SECS};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// Limits on one request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// Bytes on the wire (after any gzip).
    pub max_body_bytes: usize,
    /// Bytes after gunzip.
    pub max_decompressed_bytes: usize,
}

impl Default for BodyLimits {
    fn default() -> Self {
        BodyLimits {
            max_body_bytes: 8 * 1024 * 1024,
            max_decompressed_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Why a whole body was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("body is {got} bytes, over the limit of {limit} bytes; split it into smaller pushes")]
    TooLarge { got: usize, limit: usize },
    #[error("body decompresses to more than {limit} bytes; split it into smaller pushes")]
    DecompressedTooLarge { limit: usize },
    #[error("unsupported Content-Encoding `{0}`; send plain JSON or gzip")]
    UnsupportedEncoding(String),
    #[error("body is not valid gzip: {0}")]
    BadGzip(String),
    #[error("body is not valid JSON: {0}")]
    NotJson(String),
    #[error("body must be a JSON object with any of `gpus`, `samples`, `allocations`")]
    NotObject,
}

impl DecodeError {
    /// True for the errors answered with 413.
    pub fn is_too_large(&self) -> bool {
        matches!(
            self,
            DecodeError::TooLarge { .. } | DecodeError::DecompressedTooLarge { .. }
        )
    }
}

/// Turn raw request bytes into a JSON object, enforcing both size limits.
pub fn decode_body(
    bytes: &[u8],
    content_encoding: Option<&str>,
    limits: BodyLimits,
) -> Result<serde_json::Map<String, Value>, DecodeError> {
    if bytes.len() > limits.max_body_bytes {
        return Err(DecodeError::TooLarge {
            got: bytes.len(),
            limit: limits.max_body_bytes,
        });
    }
    // Codings are case-insensitive; an empty one is no coding the document lists (415).
    let encoding = content_encoding
        .map(|e| e.trim().to_ascii_lowercase())
        .filter(|e| e != "identity");
    let owned;
    let json_bytes: &[u8] = match encoding.as_deref() {
        None => bytes,
        Some("gzip") | Some("x-gzip") => {
            let mut out = Vec::new();
            let cap = limits.max_decompressed_bytes as u64 + 1;
            GzDecoder::new(bytes)
                .take(cap)
                .read_to_end(&mut out)
                .map_err(|e| DecodeError::BadGzip(e.to_string()))?;
            if out.len() > limits.max_decompressed_bytes {
                return Err(DecodeError::DecompressedTooLarge {
                    limit: limits.max_decompressed_bytes,
                });
            }
            owned = out;
            &owned
        }
        Some(other) => return Err(DecodeError::UnsupportedEncoding(echo(other).into_owned())),
    };
    match serde_json::from_slice::<Value>(json_bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(DecodeError::NotObject),
        Err(e) => Err(DecodeError::NotJson(e.to_string())),
    }
}

/// One rejected record: its JSON path and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rejection {
    pub path: String,
    pub reason: String,
    /// True when the record was valid but the token may not write it.
    #[serde(skip)]
    pub forbidden: bool,
}

impl Rejection {
    /// A rejection of the record at `path`. Both are cut to [`PATH_CHARS`] and
    /// [`MESSAGE_CHARS`]: whatever a caller sent, what is answered and kept stays small.
    pub fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        let (path, reason) = (path.into(), reason.into());
        Rejection {
            path: clip(&path, PATH_CHARS).into_owned(),
            reason: clip(&reason, MESSAGE_CHARS).into_owned(),
            forbidden: false,
        }
    }

    pub fn forbidden(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Rejection {
            forbidden: true,
            ..Rejection::new(path, reason)
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

/// The most characters of a caller's own input (a field name, a value, a header) that any
/// message repeats back: a rejection, an error answer or a source's `last_error` stays small
/// whatever was sent.
pub const ECHO_CHARS: usize = 100;

/// The most characters of a rejection's path, and of a message kept about a source
/// (`last_error`), whatever went into them.
pub const PATH_CHARS: usize = 200;
pub const MESSAGE_CHARS: usize = 500;

/// `value` as a message may repeat it: at most [`ECHO_CHARS`] characters, cut with `…`.
pub fn echo(value: &str) -> std::borrow::Cow<'_, str> {
    clip(value, ECHO_CHARS)
}

/// `text` cut to at most `max_chars` characters (the last one `…` when cut).
pub fn clip(text: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max_chars) {
        None => text.into(),
        Some(_) => {
            let keep = max_chars.saturating_sub(1);
            let end = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
            format!("{}…", &text[..end]).into()
        }
    }
}

/// A message that quotes input between backticks or double quotes (serde's "unknown field
/// `…`", "invalid type: string \"…\""), with every quoted part cut by [`echo`]: the rest of the
/// message, which says what to do, is kept whole.
fn echo_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(2 * MESSAGE_CHARS));
    let mut rest = message;
    while let Some(open) = rest.find(['`', '"']) {
        let quote = rest.as_bytes()[open] as char;
        out.push_str(&rest[..=open]);
        let inner = &rest[open + 1..];
        // The closing quote; a double-quoted string may escape quotes inside.
        let mut close = None;
        let mut escaped = false;
        for (i, c) in inner.char_indices() {
            match c {
                '\\' if quote == '"' && !escaped => escaped = true,
                c if c == quote && !escaped => {
                    close = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let Some(close) = close else {
            out.push_str(&echo(inner));
            return out;
        };
        out.push_str(&echo(&inner[..close]));
        out.push(quote);
        rest = &inner[close + 1..];
    }
    out.push_str(rest);
    out
}

/// The valid records of a body, each with its index in its list, and the rejected ones.
#[derive(Debug, Default)]
pub struct Validated {
    pub gpus: Vec<(usize, PushGpu)>,
    pub samples: Vec<(usize, PushSample)>,
    pub allocations: Vec<(usize, PushAllocation)>,
    pub rejections: Vec<Rejection>,
    /// The body itself is malformed: it has a key other than the three lists, or a list that
    /// is not an array. Such a body is refused whole, so that a misspelt list name never
    /// passes as a partly accepted push.
    pub malformed: bool,
}

/// The most characters of a text field, a label's key or a label's value (characters, as the
/// document's `maxLength` counts them).
const MAX_TEXT: usize = 256;
/// The most entries of a map of labels or annotations.
const MAX_LABELS: usize = 64;

/// The oldest and newest times a pushed or collected record may carry, from the server's
/// settings at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeBounds {
    /// Newest of any timestamp: now plus the clock-skew allowance.
    pub latest: DateTime<Utc>,
    /// Oldest GPU `observed_at` (and sample `ts`, which the store checks): the start of the
    /// first hour whose raw samples are all within the raw retention, so that late data never
    /// touches an hour whose samples were pruned.
    pub earliest_observation: DateTime<Utc>,
    pub raw_retention_days: i64,
    /// Oldest allocation `start`: the rollup retention, since allocated hours are kept with
    /// the rollups (a pod may well run for longer than the raw retention).
    pub earliest_allocation: DateTime<Utc>,
    pub rollup_retention_days: i64,
}

impl TimeBounds {
    pub fn new(now: DateTime<Utc>, settings: &crate::Settings) -> TimeBounds {
        let at = |secs: i64| DateTime::from_timestamp(secs, 0).unwrap_or(DateTime::UNIX_EPOCH);
        let now_secs = now.timestamp();
        TimeBounds {
            latest: now + chrono::Duration::seconds(settings.max_future_skew_secs),
            earliest_observation: at(raw_cutoff(now_secs, settings.raw_retention_days)),
            raw_retention_days: settings.raw_retention_days,
            earliest_allocation: at(now_secs - settings.rollup_retention_days * DAY_SECS),
            rollup_retention_days: settings.rollup_retention_days,
        }
    }

    /// Check every record of a decoded push body against the contract.
    pub fn validate_body(&self, body: serde_json::Map<String, Value>) -> Validated {
        validate(body, self, false)
    }

    /// [`TimeBounds::validate_body`] for what a pull collector inside the server reported: an
    /// allocation may also name a host's GPU pool by placeholder UUID
    /// (`placeholder:<host>:<slot>`), which the store moves to a real GPU of that host once
    /// one is known. Pushes may not.
    pub fn validate_collected(&self, body: serde_json::Map<String, Value>) -> Validated {
        validate(body, self, true)
    }
}

/// The earliest sample time still accepted at `now_secs`: the start of the first hour whose
/// raw samples are all within retention (so a late sample never re-rolls a half-pruned hour).
pub fn raw_cutoff(now_secs: i64, raw_retention_days: i64) -> i64 {
    gpuledger_model::hour_floor(now_secs - raw_retention_days * DAY_SECS)
        + gpuledger_model::HOUR_SECS
}

/// [`TimeBounds::validate_body`] with the default retention: for tests and fuzzing. The
/// server uses its configured settings.
pub fn validate_body(
    body: serde_json::Map<String, Value>,
    now: DateTime<Utc>,
    max_future_skew_secs: i64,
) -> Validated {
    default_bounds(now, max_future_skew_secs).validate_body(body)
}

/// [`TimeBounds::validate_collected`] with the default retention: for tests.
pub fn validate_collected(
    body: serde_json::Map<String, Value>,
    now: DateTime<Utc>,
    max_future_skew_secs: i64,
) -> Validated {
    default_bounds(now, max_future_skew_secs).validate_collected(body)
}

fn default_bounds(now: DateTime<Utc>, max_future_skew_secs: i64) -> TimeBounds {
    TimeBounds::new(
        now,
        &crate::Settings {
            max_future_skew_secs,
            ..Default::default()
        },
    )
}

fn validate(
    body: serde_json::Map<String, Value>,
    bounds: &TimeBounds,
    pool_allocations: bool,
) -> Validated {
    let mut out = Validated::default();
    for (key, value) in body {
        // A list that is not an array (`each` names it) leaves the body malformed.
        out.malformed |= !matches!(value, Value::Array(_) | Value::Null);
        match key.as_str() {
            "gpus" => each(&key, value, &mut out.rejections, |path, gpu: PushGpu| {
                check_gpu(path, &gpu, bounds).map(|()| gpu)
            })
            .into_iter()
            .for_each(|r| out.gpus.push(r)),
            "samples" => each(&key, value, &mut out.rejections, |path, s: PushSample| {
                check_sample(path, &s, bounds.latest).map(|()| s)
            })
            .into_iter()
            .for_each(|r| out.samples.push(r)),
            "allocations" => each(
                &key,
                value,
                &mut out.rejections,
                |path, a: PushAllocation| {
                    check_allocation(path, &a, bounds, pool_allocations).map(|()| a)
                },
            )
            .into_iter()
            .for_each(|r| out.allocations.push(r)),
            other => {
                out.malformed = true;
                out.rejections.push(Rejection::new(
                    if other.is_empty() {
                        "\"\"".into()
                    } else {
                        echo(other)
                    },
                    "unknown field; a body may carry only `gpus`, `samples` and `allocations`",
                ))
            }
        }
    }
    out
}

fn each<T: DeserializeOwned>(
    list: &str,
    value: Value,
    rejections: &mut Vec<Rejection>,
    check: impl Fn(&str, T) -> Result<T, Rejection>,
) -> Vec<(usize, T)> {
    let items = match value {
        Value::Array(items) => items,
        Value::Null => return Vec::new(),
        other => {
            rejections.push(Rejection::new(
                list,
                format!("must be an array of records, got {}", kind_of(&other)),
            ));
            return Vec::new();
        }
    };
    let mut kept = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let path = format!("{list}[{i}]");
        let parsed: Result<T, _> = serde_path_to_error::deserialize(item);
        match parsed {
            Ok(record) => match check(&path, record) {
                Ok(record) => kept.push((i, record)),
                Err(rejection) => rejections.push(rejection),
            },
            Err(err) => {
                let inner = err.path().to_string();
                let full = if inner.is_empty() || inner == "." {
                    path
                } else {
                    format!("{path}.{}", echo(&inner))
                };
                rejections.push(Rejection::new(full, clean_serde_message(err.inner())));
            }
        }
    }
    kept
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// serde_json appends "at line 1 column 2" positions that mean nothing for a value already
/// parsed; drop them so the reason reads cleanly. The field names and values it quotes are cut
/// by [`echo`].
fn clean_serde_message(err: &serde_json::Error) -> String {
    let msg = err.to_string();
    let msg = match msg.rfind(" at line ") {
        Some(pos) => &msg[..pos],
        None => &msg,
    };
    echo_quoted(msg)
}

/// Why a GPU UUID is not acceptable, if it is not. Accepts NVIDIA's `GPU-…` and `MIG-…` forms
/// (including the older `MIG-GPU-…/gi/ci` form) and the other vendors' identities of
/// `gpuledger_model::accel` (`AMD-…`, `HL-…`, `ACC-…`).
pub fn uuid_problem(uuid: &str) -> Option<String> {
    if uuid.is_empty() {
        return Some("must not be empty".into());
    }
    if uuid.len() > 128 {
        return Some(format!(
            "must be at most 128 characters, got {}",
            uuid.len()
        ));
    }
    let Some(vendor) = Vendor::of_uuid(uuid) else {
        return Some(format!(
            "must be a GPU identity: an NVIDIA UUID starting with `GPU-` or `MIG-` (as nvidia-smi -L \
             prints), or `AMD-…`, `HL-…` (Intel Gaudi) or `ACC-…` (any other accelerator) as the \
             push API describes; got `{}`",
            echo(uuid)
        ));
    };
    // NVIDIA UUIDs are hex and dashes (`/` in the old MIG form); the other vendors' identities
    // also carry serials and PCI addresses.
    let extra: &[char] = match vendor {
        Vendor::Nvidia => &['-', '/'],
        _ => &['-', '/', '.', ':', '_'],
    };
    if let Some(bad) = uuid
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || extra.contains(c)))
    {
        let allowed = match vendor {
            Vendor::Nvidia => "only letters, digits, `-` and `/` are allowed",
            _ => "only letters, digits, `-`, `/`, `.`, `:` and `_` are allowed",
        };
        return Some(format!("contains `{bad}`; {allowed}"));
    }
    let rest = uuid.split_once('-').map_or("", |(_, r)| r);
    if vendor != Vendor::Nvidia && rest.is_empty() {
        return Some(format!(
            "has nothing after its `{}` prefix",
            echo(&uuid[..uuid.len().min(8)])
        ));
    }
    None
}

/// Whether `uuid` names a child of a GPU (a MIG instance `MIG-…`, an AMD partition
/// `<gpu>/P<n>`) rather than a physical device.
pub fn is_child_uuid(uuid: &str) -> bool {
    match Vendor::of_uuid(uuid) {
        Some(Vendor::Nvidia) => uuid.starts_with("MIG-"),
        Some(_) => uuid.contains('/'),
        None => false,
    }
}

fn text(path: &str, field: &str, value: Option<&str>) -> Result<(), Rejection> {
    if let Some(v) = value {
        if v.trim().is_empty() {
            return Err(Rejection::new(
                format!("{path}.{field}"),
                "must not be blank; leave it out when unknown",
            ));
        }
        let chars = v.chars().count();
        if chars > MAX_TEXT {
            return Err(Rejection::new(
                format!("{path}.{field}"),
                format!("must be at most {MAX_TEXT} characters, got {chars}"),
            ));
        }
    }
    Ok(())
}

fn not_future(
    path: &str,
    field: &str,
    ts: DateTime<Utc>,
    latest: DateTime<Utc>,
) -> Result<(), Rejection> {
    if ts > latest {
        return Err(Rejection::new(
            format!("{path}.{field}"),
            format!(
                "is in the future ({}): the latest time accepted now is {} (the server's clock \
                 and its allowance for skew); check the sender's clock",
                ts.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                latest.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
        ));
    }
    Ok(())
}

/// `ts` at or after `earliest`; `why` names the retention and what to do, as
/// "is older than <why>: must be at or after <earliest>, got <ts>; <what to do>".
fn not_older(
    path: &str,
    field: &str,
    ts: DateTime<Utc>,
    earliest: DateTime<Utc>,
    why: impl FnOnce() -> (String, &'static str),
) -> Result<(), Rejection> {
    if ts < earliest {
        let (retention, todo) = why();
        let secs = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        return Err(Rejection::new(
            format!("{path}.{field}"),
            format!(
                "is older than {retention}: must be at or after {}, got {}; {todo}",
                secs(earliest),
                secs(ts)
            ),
        ));
    }
    Ok(())
}

/// The most memory a sample or an allocation's average may give (16 TiB, in MiB).
const MAX_MEM_MIB: f64 = 16.0 * 1024.0 * 1024.0;

fn range(
    path: &str,
    field: &str,
    value: Option<f64>,
    lo: f64,
    hi: f64,
    hint: &str,
) -> Result<(), Rejection> {
    if let Some(v) = value {
        if !v.is_finite() || v < lo || v > hi {
            return Err(Rejection::new(
                format!("{path}.{field}"),
                format!("must be within {hint}, got {v}"),
            ));
        }
    }
    Ok(())
}

fn check_gpu(path: &str, g: &PushGpu, bounds: &TimeBounds) -> Result<(), Rejection> {
    if let Some(p) = uuid_problem(&g.uuid) {
        return Err(Rejection::new(format!("{path}.uuid"), p));
    }
    text(path, "model", Some(&g.model))?;
    for (field, v) in [
        ("host", &g.host),
        ("cluster", &g.cluster),
        ("region", &g.region),
        ("instance_type", &g.instance_type),
        ("account", &g.account),
        ("serial", &g.serial),
        ("pci_bus_id", &g.pci_bus_id),
        ("mig_profile", &g.mig_profile),
    ] {
        text(path, field, v.as_deref())?;
    }
    if let Some(mib) = g.memory_mib {
        if mib == 0 || mib > 16 * 1024 * 1024 {
            return Err(Rejection::new(
                format!("{path}.memory_mib"),
                format!("must be within 1..=16777216 MiB, got {mib}; leave it out when unknown"),
            ));
        }
    }
    match &g.mig_parent_uuid {
        Some(parent) => {
            if let Some(p) = uuid_problem(parent) {
                return Err(Rejection::new(format!("{path}.mig_parent_uuid"), p));
            }
            if is_child_uuid(parent) {
                return Err(Rejection::new(
                    format!("{path}.mig_parent_uuid"),
                    "must be the physical GPU's identity (`GPU-…`, `AMD-…`, `HL-…`, `ACC-…`), \
                     not an instance's or partition's",
                ));
            }
            if Vendor::of_uuid(parent) != Vendor::of_uuid(&g.uuid) {
                return Err(Rejection::new(
                    format!("{path}.mig_parent_uuid"),
                    "must be of the same vendor as `uuid`: an instance or partition belongs \
                     to its own vendor's GPU",
                ));
            }
            if parent == &g.uuid {
                return Err(Rejection::new(
                    format!("{path}.mig_parent_uuid"),
                    "must differ from `uuid`: a GPU is not its own MIG parent",
                ));
            }
        }
        None => {
            if is_child_uuid(&g.uuid) {
                return Err(Rejection::new(
                    format!("{path}.mig_parent_uuid"),
                    "is required for a MIG instance (`MIG-…` UUID) or a partition \
                     (`…/P<n>`): give the physical GPU's identity",
                ));
            }
            if g.mig_profile.is_some() {
                return Err(Rejection::new(
                    format!("{path}.mig_profile"),
                    "is set only on MIG instances; give `mig_parent_uuid` as well",
                ));
            }
        }
    }
    labels(&format!("{path}.labels"), &g.labels)?;
    not_future(path, "observed_at", g.observed_at, bounds.latest)?;
    not_older(
        path,
        "observed_at",
        g.observed_at,
        bounds.earliest_observation,
        || {
            (
                format!(
                    "the raw-sample retention ({} days), the floor samples have too",
                    bounds.raw_retention_days
                ),
                "send the GPU as observed now",
            )
        },
    )
}

/// A map of labels: at most [`MAX_LABELS`] entries, keys and values of bounded size.
fn labels(path: &str, map: &BTreeMap<String, String>) -> Result<(), Rejection> {
    if map.len() > MAX_LABELS {
        return Err(Rejection::new(
            path,
            format!("must have at most {MAX_LABELS} entries, got {}", map.len()),
        ));
    }
    for (k, v) in map {
        let too_long = |s: &str| s.chars().count() > MAX_TEXT;
        if k.is_empty() || too_long(k) || too_long(v) {
            return Err(Rejection::new(
                format!("{path}.{}", echo(k)),
                format!(
                    "keys must be 1..={MAX_TEXT} characters and values at most {MAX_TEXT} \
                     characters"
                ),
            ));
        }
    }
    Ok(())
}

fn check_sample(path: &str, s: &PushSample, latest: DateTime<Utc>) -> Result<(), Rejection> {
    if let Some(p) = uuid_problem(&s.gpu_uuid) {
        return Err(Rejection::new(format!("{path}.gpu_uuid"), p));
    }
    not_future(path, "ts", s.ts, latest)?;
    range(path, "util_pct", s.util_pct, 0.0, 100.0, "0..=100")?;
    range(
        path,
        "sm_active",
        s.sm_active,
        0.0,
        1.0,
        "0..=1 (a fraction, like DCGM_FI_PROF_SM_ACTIVE)",
    )?;
    range(
        path,
        "mem_used_mib",
        s.mem_used_mib,
        0.0,
        MAX_MEM_MIB,
        "0..=16777216",
    )?;
    range(path, "power_w", s.power_w, 0.0, 10_000.0, "0..=10000")?;
    Ok(())
}

fn check_allocation(
    path: &str,
    a: &PushAllocation,
    bounds: &TimeBounds,
    pool_allocations: bool,
) -> Result<(), Rejection> {
    let latest = bounds.latest;
    let pool = pool_allocations && gpuledger_model::is_placeholder(&a.gpu_uuid);
    if let Some(p) = uuid_problem(&a.gpu_uuid).filter(|_| !pool) {
        return Err(Rejection::new(format!("{path}.gpu_uuid"), p));
    }
    text(path, "workload", Some(&a.workload))?;
    text(path, "user", a.user.as_deref())?;
    text(path, "owner", a.owner.as_deref())?;
    text(path, "team", a.team.as_deref())?;
    let ctx = &a.context;
    let cpath = format!("{path}.context");
    text(&cpath, "namespace", ctx.namespace.as_deref())?;
    text(&cpath, "slurm_account", ctx.slurm_account.as_deref())?;
    text(&cpath, "slurm_partition", ctx.slurm_partition.as_deref())?;
    text(&cpath, "slurm_qos", ctx.slurm_qos.as_deref())?;
    text(&cpath, "slurm_job_name", ctx.slurm_job_name.as_deref())?;
    text(&cpath, "slurm_state", ctx.slurm_state.as_deref())?;
    for (field, map) in ctx.maps() {
        labels(&format!("{cpath}.{field}"), map)?;
    }
    range(path, "avg_util_pct", a.avg_util_pct, 0.0, 100.0, "0..=100")?;
    range(
        path,
        "avg_mem_used_mib",
        a.avg_mem_used_mib,
        0.0,
        MAX_MEM_MIB,
        "0..=16777216",
    )?;
    not_future(path, "start", a.start, latest)?;
    not_older(path, "start", a.start, bounds.earliest_allocation, || {
        (
            format!(
                "the rollup retention ({} days), which keeps no hours that old",
                bounds.rollup_retention_days
            ),
            "give a `start` within it",
        )
    })?;
    if let Some(end) = a.end {
        if end < a.start {
            return Err(Rejection::new(
                format!("{path}.end"),
                "must not be before `start`; use null while the allocation runs",
            ));
        }
        not_future(path, "end", end, latest)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn now() -> DateTime<Utc> {
        "2026-12-02T12:00:00Z".parse().unwrap()
    }

    fn validate(json: &str) -> Validated {
        let map = decode_body(json.as_bytes(), None, BodyLimits::default()).unwrap();
        validate_body(map, now(), 300)
    }

    #[test]
    fn one_bad_sample_among_good_ones_is_named_and_the_rest_kept() {
        let v = validate(
            r#"{"samples":[
              {"gpu_uuid":"GPU-a","ts":"2026-12-02T10:00:00Z","util_pct":50},
              {"gpu_uuid":"GPU-a","ts":"2026-12-02T10:01:00Z","util_pct":250},
              {"gpu_uuid":"GPU-a","ts":"2026-12-02T10:02:00Z","util_pct":5}]}"#,
        );
        assert_eq!(v.samples.len(), 2);
        assert_eq!(
            v.rejections[0].to_string(),
            "samples[1].util_pct: must be within 0..=100, got 250"
        );
    }

    #[test]
    fn unknown_fields_and_wrong_types_name_the_field() {
        let v = validate(
            r#"{"samples":[{"gpu_uuid":"GPU-a","ts":"2026-12-02T10:00:00Z","utl_pct":5},
                           {"gpu_uuid":"GPU-a","ts":"2026-12-02T10:00:00Z","util_pct":"high"}],
                "sample":[]}"#,
        );
        assert!(v.samples.is_empty());
        let text: Vec<String> = v.rejections.iter().map(|r| r.to_string()).collect();
        assert!(
            text.iter()
                .any(|t| t.starts_with("samples[0].utl_pct: unknown field `utl_pct`")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.starts_with("samples[1].util_pct: invalid type")),
            "{text:?}"
        );
        assert!(
            text.iter().any(|t| t.starts_with("sample: unknown field")),
            "{text:?}"
        );
    }

    #[test]
    fn gpu_checks_cover_uuid_mig_and_clock() {
        let v = validate(
            r#"{"gpus":[
              {"uuid":"abc","model":"T4","observed_at":"2026-12-02T10:00:00Z"},
              {"uuid":"MIG-1","model":"A100","observed_at":"2026-12-02T10:00:00Z"},
              {"uuid":"GPU-1","model":"A100","observed_at":"2026-12-03T10:00:00Z"},
              {"uuid":"GPU-2","model":"A100","cloud":"moon","observed_at":"2026-12-02T10:00:00Z"},
              {"uuid":"GPU-3","model":"A100","memory_mib":40960,"observed_at":"2026-12-02T10:00:00Z"}]}"#,
        );
        assert_eq!(v.gpus.len(), 1);
        let paths: Vec<&str> = v.rejections.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "gpus[0].uuid",
                "gpus[1].mig_parent_uuid",
                "gpus[2].observed_at",
                "gpus[3].cloud"
            ]
        );
    }

    #[test]
    fn other_vendors_identities_are_accepted_and_checked() {
        let v = validate(
            r#"{"gpus":[
              {"uuid":"AMD-SN-692024000810","model":"AMD Instinct MI300X","observed_at":"2026-12-02T10:00:00Z"},
              {"uuid":"AMD-SN-692024000810/P1","model":"AMD Instinct MI300X","mig_parent_uuid":"AMD-SN-692024000810","mig_profile":"CPX","observed_at":"2026-12-02T10:00:00Z"},
              {"uuid":"HL-PCI-gaudi-1.example-0000:9a:00.0","model":"HL-225","observed_at":"2026-12-02T10:00:00Z"},
              {"uuid":"ACC-tpu_v5e-3","model":"TPU v5e","observed_at":"2026-12-02T10:00:00Z"},
              {"uuid":"AMD-","model":"MI300X","observed_at":"2026-12-02T10:00:00Z"},
              {"uuid":"AMD-SN-1 2","model":"MI300X","observed_at":"2026-12-02T10:00:00Z"},
              {"uuid":"AMD-SN-1/P0","model":"MI300X","observed_at":"2026-12-02T10:00:00Z"},
              {"uuid":"AMD-SN-1/P0","model":"MI300X","mig_parent_uuid":"GPU-1","observed_at":"2026-12-02T10:00:00Z"},
              {"uuid":"HL-SN-2/P0","model":"HL-225","mig_parent_uuid":"HL-SN-2/P1","observed_at":"2026-12-02T10:00:00Z"},
              {"uuid":"GPU-5","model":"A100","observed_at":"2026-12-02T10:00:00Z"}],
             "samples":[{"gpu_uuid":"HL-PCI-gaudi-1.example-0000:9a:00.0","ts":"2026-12-02T10:00:00Z","util_pct":0}]}"#,
        );
        let kept: Vec<&str> = v.gpus.iter().map(|g| g.1.uuid.as_str()).collect();
        assert_eq!(
            kept,
            [
                "AMD-SN-692024000810",
                "AMD-SN-692024000810/P1",
                "HL-PCI-gaudi-1.example-0000:9a:00.0",
                "ACC-tpu_v5e-3",
                "GPU-5"
            ]
        );
        assert_eq!(v.samples.len(), 1);
        let why: Vec<(&str, &str)> = v
            .rejections
            .iter()
            .map(|r| (r.path.as_str(), r.reason.as_str()))
            .collect();
        assert_eq!(why.len(), 5, "{why:?}");
        assert_eq!(why[0].0, "gpus[4].uuid");
        assert!(why[0].1.contains("nothing after"), "{}", why[0].1);
        assert_eq!(why[1].0, "gpus[5].uuid");
        assert!(why[1].1.contains("contains ` `"), "{}", why[1].1);
        assert_eq!(why[2].0, "gpus[6].mig_parent_uuid");
        assert!(why[2].1.contains("partition"), "{}", why[2].1);
        assert_eq!(why[3].0, "gpus[7].mig_parent_uuid");
        assert!(why[3].1.contains("same vendor"), "{}", why[3].1);
        assert_eq!(why[4].0, "gpus[8].mig_parent_uuid");
        assert!(why[4].1.contains("physical GPU"), "{}", why[4].1);
    }

    #[test]
    fn echoes_are_cut_and_say_so() {
        assert_eq!(echo("short"), "short");
        let cut = echo(&"é".repeat(5000)).into_owned();
        assert_eq!(cut.chars().count(), ECHO_CHARS);
        assert!(cut.ends_with('…'));
        assert_eq!(clip("abcdef", 4), "abc…");
        assert_eq!(clip("abcd", 4), "abcd");
        let long = "x".repeat(300);
        assert_eq!(
            echo_quoted(&format!("unknown field `{long}`, expected one of `a`, `b`")),
            format!("unknown field `{}`, expected one of `a`, `b`", echo(&long))
        );
        assert_eq!(
            echo_quoted(&format!(
                r#"invalid type: string "a\"{long}", expected f64"#
            )),
            format!(
                r#"invalid type: string "{}", expected f64"#,
                echo(&format!(r#"a\"{long}"#))
            )
        );
        assert_eq!(echo_quoted("open `quote"), "open `quote");
    }

    #[test]
    fn a_huge_field_name_or_value_is_not_echoed_whole() {
        let huge = "k".repeat(1 << 20);
        let v = validate(&format!(
            r#"{{"{huge}":[],"samples":[{{"gpu_uuid":"GPU-a","ts":"2026-12-02T10:00:00Z","{huge}":1}},
               {{"gpu_uuid":"GPU-a","ts":"2026-12-02T10:00:00Z","util_pct":"{huge}"}}],
               "gpus":[{{"uuid":"GPU-b","model":"T4","labels":{{"{huge}":"v"}},"observed_at":"2026-12-02T10:00:00Z"}}]}}"#
        ));
        assert_eq!(v.rejections.len(), 4, "{:?}", v.rejections);
        for r in &v.rejections {
            assert!(
                r.path.chars().count() <= PATH_CHARS && r.reason.chars().count() <= MESSAGE_CHARS
            );
            assert!(!r.to_string().contains(&"k".repeat(ECHO_CHARS + 1)), "{r}");
        }
        assert!(v
            .rejections
            .iter()
            .any(|r| r.reason.contains("expected one of")));
    }

    #[test]
    fn observations_and_allocations_from_1970_are_refused_with_the_retention() {
        let v = validate(
            r#"{"gpus":[{"uuid":"GPU-a","model":"T4","observed_at":"1970-01-01T00:00:00Z"},
                        {"uuid":"GPU-b","model":"T4","observed_at":"2026-11-18T13:00:00Z"}],
                "allocations":[{"gpu_uuid":"GPU-a","start":"1970-01-01T00:00:00Z","workload":"w","kind":"pod"},
                               {"gpu_uuid":"GPU-a","start":"2026-10-01T00:00:00Z","workload":"w","kind":"pod"}]}"#,
        );
        let text: Vec<String> = v.rejections.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            text,
            [
                "allocations[0].start: is older than the rollup retention (730 days), which keeps \
                 no hours that old: must be at or after 2024-12-02T12:00:00Z, got \
                 1970-01-01T00:00:00Z; give a `start` within it",
                "gpus[0].observed_at: is older than the raw-sample retention (14 days), the floor \
                 samples have too: must be at or after 2026-11-18T13:00:00Z, got \
                 1970-01-01T00:00:00Z; send the GPU as observed now"
            ]
        );
        assert_eq!(
            (v.gpus.len(), v.allocations.len()),
            (1, 1),
            "the floor itself is kept"
        );
        let b = TimeBounds::new(now(), &crate::Settings::default());
        assert_eq!(
            b.earliest_observation.timestamp(),
            raw_cutoff(now().timestamp(), 14)
        );
    }

    #[test]
    fn allocation_end_before_start_is_rejected() {
        let v = validate(
            r#"{"allocations":[{"gpu_uuid":"GPU-a","start":"2026-12-02T10:00:00Z",
               "end":"2026-12-02T09:00:00Z","workload":"w","kind":"pod"}]}"#,
        );
        assert_eq!(v.rejections[0].path, "allocations[0].end");
    }

    #[test]
    fn gzip_bodies_and_both_limits() {
        let json = br#"{"samples":[]}"#;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(json).unwrap();
        let gz = enc.finish().unwrap();
        assert!(decode_body(&gz, Some("gzip"), BodyLimits::default()).is_ok());
        let small = BodyLimits {
            max_body_bytes: 5,
            max_decompressed_bytes: 100,
        };
        assert!(decode_body(json, None, small).unwrap_err().is_too_large());
        let tight = BodyLimits {
            max_body_bytes: 1000,
            max_decompressed_bytes: 5,
        };
        assert_eq!(
            decode_body(&gz, Some("gzip"), tight).unwrap_err(),
            DecodeError::DecompressedTooLarge { limit: 5 }
        );
        assert!(matches!(
            decode_body(b"not gzip", Some("gzip"), BodyLimits::default()),
            Err(DecodeError::BadGzip(_))
        ));
        assert_eq!(
            decode_body(b"[1]", None, BodyLimits::default()).unwrap_err(),
            DecodeError::NotObject
        );
        assert!(matches!(
            decode_body(b"{", None, BodyLimits::default()),
            Err(DecodeError::NotJson(_))
        ));
    }
}

/// Mutated real bodies must be refused or partly kept, never panic. (The `fuzz/` target does
/// the same coverage-guided; this runs in every `cargo test`.)
#[cfg(test)]
mod mutation {
    use super::*;

    const SEED: &str = r#"{"gpus":[{"uuid":"GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d5e","model":"NVIDIA H100 80GB HBM3",
      "memory_mib":81559,"host":"gpu-node-7","cloud":"aws","mig_parent_uuid":null,"labels":{"team":"nlp"},
      "observed_at":"2026-12-02T11:00:00Z"}],
      "samples":[{"gpu_uuid":"GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d5e","ts":"2026-12-02T10:59:00Z",
      "util_pct":87.0,"mem_used_mib":60210,"power_w":512.4,"sm_active":0.71}],
      "allocations":[{"gpu_uuid":"GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d5e","start":"2026-12-02T08:00:00Z",
      "end":null,"workload":"nlp-prod/llm-ft-0","kind":"pod","user":"alice","team":"nlp"}]}"#;

    #[test]
    fn mutated_bodies_never_panic() {
        let now: DateTime<Utc> = "2026-12-02T12:00:00Z".parse().unwrap();
        let seed = SEED.as_bytes();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let tokens: [&[u8]; 8] = [
            b"null",
            b"-1e999",
            b"\"\"",
            b"[]",
            b"{}",
            b"1e308",
            b"\"\\u0000\"",
            b"9223372036854775794",
        ];
        let mut kept = 0;
        for _ in 0..20_000 {
            let mut body = seed.to_vec();
            for _ in 0..(next() % 4 + 1) {
                let at = (next() as usize) % body.len().max(1);
                match next() % 4 {
                    0 if !body.is_empty() => body[at] = next() as u8,
                    1 => body.truncate(at),
                    2 => {
                        let t = tokens[(next() % tokens.len() as u64) as usize];
                        body.splice(at..at, t.iter().copied());
                    }
                    _ => {
                        let end = (at + (next() % 16) as usize).min(body.len());
                        body.drain(at..end);
                    }
                }
            }
            if let Ok(map) = decode_body(&body, None, BodyLimits::default()) {
                let v = validate_body(map, now, 300);
                kept += v.gpus.len() + v.samples.len() + v.allocations.len();
                for r in &v.rejections {
                    assert!(
                        !r.path.is_empty() && !r.reason.is_empty(),
                        "{r:?} from {}",
                        String::from_utf8_lossy(&body)
                    );
                }
            }
        }
        assert!(kept > 0, "some mutations leave valid records");
    }
}
