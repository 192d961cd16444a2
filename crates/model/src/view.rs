//! What the query API, CSV and pages show: merged GPUs, rollups, allocations, sources, summaries.
//!
//! Named buckets: a GPU no rule places is owned by [`UNOWNED`]; an unknown environment is
//! [`UNKNOWN`]. Optional numbers are unknown, never zero.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The owner bucket for GPUs no rule can place.
pub const UNOWNED: &str = "unowned";
/// The bucket for an environment (or other attribute) no source gives.
pub const UNKNOWN: &str = "unknown";

/// Where a GPU's hourly rate came from (BRIEF section 4, first match wins).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RateOrigin {
    /// `[rates]` in the config, keyed by model family or exact model name.
    ConfigOverride { key: String },
    /// The built-in table of public on-demand prices.
    BuiltinModel { family: String, source: String },
    /// `[rates.instance_types]` in the config: a negotiated, spot, reserved or committed-use
    /// price per instance-hour, ÷ the instance's GPUs.
    InstanceOverride {
        instance_type: String,
        instance_usd_per_hour: f64,
        gpus: f64,
    },
    /// The built-in catalog: the instance type's on-demand price ÷ its GPUs.
    InstanceCatalog {
        instance_type: String,
        cloud: String,
        region: String,
        instance_usd_per_hour: f64,
        gpus: f64,
        source: String,
        as_of: String,
    },
    /// `[[rates.onprem]]`: purchase price amortized over its life, plus power.
    OnPrem {
        key: String,
        purchase_usd: f64,
        life_years: f64,
        watts: f64,
        usd_per_kwh: f64,
        pue: f64,
    },
    /// `[[rates.contracts]]`: a spot, reserved, committed-use, savings-plan or negotiated price
    /// for the GPUs it matches.
    Contract {
        name: String,
        /// spot, reserved, committed, savings_plan or negotiated.
        deal: String,
        /// The attribute values it matched.
        matched: String,
        /// The price: `p5.48xlarge $55.04/h ÷ 8`, `$1.5/GPU-h`, `37 % off catalog (…)`.
        detail: String,
    },
    /// No rate applies: cost is unknown.
    #[default]
    Unknown,
}

impl RateOrigin {
    /// A short label for tables and CSV.
    pub fn label(&self) -> String {
        match self {
            RateOrigin::ConfigOverride { key } => format!("config override ({key})"),
            RateOrigin::BuiltinModel { family, .. } => format!("built-in default ({family})"),
            RateOrigin::InstanceOverride {
                instance_type,
                instance_usd_per_hour,
                gpus,
            } => format!(
                "config instance price ({instance_type} ${instance_usd_per_hour}/h ÷ {gpus})"
            ),
            RateOrigin::InstanceCatalog {
                instance_type,
                cloud,
                region,
                instance_usd_per_hour,
                gpus,
                ..
            } => format!(
                "catalog ({instance_type} ${instance_usd_per_hour}/h ÷ {gpus}, {cloud} {region})"
            ),
            RateOrigin::OnPrem {
                key,
                purchase_usd,
                life_years,
                watts,
                usd_per_kwh,
                pue,
            } => format!(
                "on-prem ({key}: ${purchase_usd} over {life_years} y + {watts} W × \
                 ${usd_per_kwh}/kWh × PUE {pue})"
            ),
            RateOrigin::Contract {
                name,
                deal,
                matched,
                detail,
            } => {
                if matched.is_empty() {
                    format!("contract `{name}` ({deal}: {detail})")
                } else {
                    format!("contract `{name}` ({deal}; {matched}: {detail})")
                }
            }
            RateOrigin::Unknown => UNKNOWN.to_string(),
        }
    }
}

/// An hourly rate with its origin.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    pub usd_per_hour: Option<f64>,
    pub origin: RateOrigin,
}

/// Present until unobserved for the stale window, then missing (shown, never dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuState {
    Present,
    Missing,
}

impl GpuState {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuState::Present => "present",
            GpuState::Missing => "missing",
        }
    }
}

/// One GPU as the query API lists it: merged attributes, owner with its reason, rate with origin.
///
/// Its text and labels are shared (`Arc`), not owned: the store keeps the list of every GPU
/// between requests and gives each request its own copy, which at 100,000 GPUs copied a dozen
/// strings per GPU at each request. Serialized as plain strings and a map.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    pub uuid: Arc<str>,
    /// `nvidia`, `amd`, `intel` or `other` (see `accel`); `None` when unknown (a placeholder
    /// whose source did not say).
    #[serde(default)]
    pub vendor: Option<crate::Vendor>,
    pub model: Arc<str>,
    pub memory_mib: Option<u64>,
    pub host: Option<Arc<str>>,
    pub cluster: Option<Arc<str>>,
    pub cloud: Option<Arc<str>>,
    pub region: Option<Arc<str>>,
    pub instance_type: Option<Arc<str>>,
    /// The cloud account, project or subscription.
    #[serde(default)]
    pub account: Option<Arc<str>>,
    pub serial: Option<Arc<str>>,
    pub pci_bus_id: Option<Arc<str>>,
    pub team: Arc<str>,
    pub env: Arc<str>,
    pub owner_reason: Arc<str>,
    pub state: GpuState,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
    pub usd_per_hour: Option<f64>,
    pub rate_origin: Arc<str>,
    pub mig_parent_uuid: Option<Arc<str>>,
    pub mig_profile: Option<Arc<str>>,
    pub placeholder: bool,
    pub source: Arc<str>,
    pub labels: Arc<BTreeMap<String, String>>,
}

/// One attribute of a GPU with the source that said it and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttributeProvenance {
    pub attribute: String,
    pub value: String,
    pub source: String,
    pub observed_at: DateTime<Utc>,
}

/// Sources that disagree on one attribute of a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conflict {
    pub attribute: String,
    pub values: Vec<AttributeProvenance>,
}

/// One clock hour of one GPU. `activity_pct` is `None` when nothing measured it: no sample
/// carried activity and no allocation of the hour came with its scheduler's average.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HourPoint {
    pub hour: DateTime<Utc>,
    pub samples: i64,
    pub activity_pct: Option<f64>,
    /// Where `activity_pct` comes from: [`ORIGIN_SAMPLES`] or [`ORIGIN_ALLOCATION`]; `None`
    /// with it.
    #[serde(default)]
    pub activity_origin: Option<String>,
    pub mem_used_mib_max: Option<f64>,
    /// Where `mem_used_mib_max` comes from, likewise.
    #[serde(default)]
    pub mem_origin: Option<String>,
    pub power_w_avg: Option<f64>,
    pub allocated: bool,
}

/// An hour figure measured by the GPU's own samples.
pub const ORIGIN_SAMPLES: &str = "samples";
/// An hour figure no sample measured, taken from the average a workload's scheduler measured
/// over the allocation holding the GPU (Slurm's `gres/gpuutil`, `gres/gpumem`).
pub const ORIGIN_ALLOCATION: &str = "allocation average";

/// An allocation interval as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    pub gpu_uuid: String,
    pub start: DateTime<Utc>,
    pub end: Option<DateTime<Utc>>,
    pub workload: String,
    pub kind: String,
    pub user: Option<String>,
    pub team: Option<String>,
    /// The owning workload (`Deployment/llm-serve`), when the source named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub source: String,
    /// The namespace, labels and annotations, or Slurm account and partition the source gave.
    #[serde(default, skip_serializing_if = "crate::WorkloadContext::is_empty")]
    pub context: crate::WorkloadContext,
    /// The workload's average utilization over the allocation, as its scheduler measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avg_util_pct: Option<f64>,
    /// The workload's average GPU memory in use, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avg_mem_used_mib: Option<f64>,
}

/// A GPU with its history in a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuDetail {
    #[serde(flatten)]
    pub gpu: GpuView,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub provenance: Vec<AttributeProvenance>,
    /// Attributes that sources disagree on (two sources give two teams), each with what every
    /// source said. The primary source's value is the one kept; rules then decide in order.
    #[serde(default)]
    pub conflicts: Vec<Conflict>,
    /// Who owned the GPU when, oldest first; the last period is open (`to` is null).
    #[serde(default)]
    pub owner_history: Vec<OwnerPeriod>,
    /// Present hours of the window in charge periods of an imported billing export, and what
    /// was billed for them (see [`SummaryGroup::billed_usd`]).
    #[serde(default)]
    pub billed_gpu_hours: i64,
    #[serde(default)]
    pub billed_usd: f64,
    /// Whether the window's cost is an estimate only or (partly) reconciled with billing.
    #[serde(default)]
    pub cost_basis: CostBasis,
    pub mig_children: Vec<String>,
    /// The window's figures of this GPU, by the same definitions as the summary.
    #[serde(default)]
    pub figures: GpuFigures,
    pub hours: Vec<HourPoint>,
    pub allocations: Vec<Allocation>,
}

/// One GPU's figures over a window (BRIEF section 4): the GPU page and `GET /api/v1/gpus/{uuid}`
/// show these, and they equal the GPU's row in the inventory for the same range. A MIG
/// instance is priced at its share of its GPU's rate (`rate_basis` says how).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuFigures {
    pub gpu_hours: i64,
    pub busy_hours: i64,
    pub idle_hours: i64,
    pub unknown_hours: i64,
    pub allocated_hours: i64,
    pub allocated_idle_hours: i64,
    pub avg_activity_pct: Option<f64>,
    /// The rate the costs use: the GPU's own, or a MIG instance's share of its GPU's.
    pub usd_per_hour: Option<f64>,
    /// Where that rate comes from, in words.
    pub rate_basis: String,
    /// `None` when no rate is known: unpriced, never $0.
    pub cost_usd: Option<f64>,
    pub idle_cost_usd: Option<f64>,
    pub allocated_idle_cost_usd: Option<f64>,
}

/// One period of a GPU's owner history: `[from, to)`, hour-aligned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwnerPeriod {
    /// Null for the first period: it covers all history before the first change.
    pub from: Option<DateTime<Utc>>,
    /// Null while the period is open.
    pub to: Option<DateTime<Utc>>,
    pub team: String,
    pub env: String,
    pub reason: String,
}

/// Freshness of a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceStatus {
    /// Succeeded within the freshness objective.
    Ok,
    /// Last success older than the freshness objective.
    Stale,
    /// Its last attempt failed.
    Error,
    /// Never succeeded.
    Never,
}

/// One source with its freshness (BRIEF section 2: freshness is a first-class fact).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceView {
    pub name: String,
    pub kind: String,
    pub last_success: Option<DateTime<Utc>>,
    pub lag_secs: Option<i64>,
    pub status: SourceStatus,
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTime<Utc>>,
    pub gpus: i64,
}

/// One group of the summary, with the figures of BRIEF section 4.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SummaryGroup {
    pub key: String,
    /// Physical GPUs present at some hour of the window.
    pub gpus: i64,
    pub gpu_hours: i64,
    pub busy_hours: i64,
    pub idle_hours: i64,
    pub unknown_hours: i64,
    pub allocated_hours: i64,
    pub allocated_idle_hours: i64,
    /// Mean hourly activity over the hours whose activity is known; `None` if none is.
    pub avg_activity_pct: Option<f64>,
    /// Σ present hours × rate over GPUs with a known rate.
    pub cost_usd: f64,
    /// Σ idle hours × rate over GPUs with a known rate.
    pub idle_cost_usd: f64,
    /// Σ allocated-and-idle hours × rate over GPUs with a known rate.
    pub allocated_idle_cost_usd: f64,
    /// GPU-hours left out of the costs because no rate is known for the GPU.
    pub unpriced_gpu_hours: i64,
    /// Whether the costs above are estimates only, or some or all of their GPU-hours were
    /// reconciled with a billing export.
    #[serde(default)]
    pub cost_basis: CostBasis,
    /// GPU-hours inside charge periods of an imported billing export.
    #[serde(default)]
    pub billed_gpu_hours: i64,
    /// What the exports billed for those GPU-hours (`EffectiveCost`, shared per GPU and charge
    /// period, spread over the period's present hours). List and billed prices are never
    /// mixed: `cost_usd` stays the estimate.
    #[serde(default)]
    pub billed_usd: f64,
    /// The estimate for the same GPU-hours, to compare with `billed_usd`.
    #[serde(default)]
    pub billed_estimate_usd: f64,
}

/// Whether a cost rests on estimates or on a billing export.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostBasis {
    /// Rate × present hours only.
    #[default]
    Estimate,
    /// Some GPU-hours fall in charge periods of an imported billing export.
    PartlyReconciled,
    /// Every GPU-hour does.
    Reconciled,
}

impl CostBasis {
    /// From the GPU-hours reconciled out of all GPU-hours.
    pub fn of(billed_gpu_hours: i64, gpu_hours: i64) -> CostBasis {
        if billed_gpu_hours <= 0 {
            CostBasis::Estimate
        } else if billed_gpu_hours >= gpu_hours {
            CostBasis::Reconciled
        } else {
            CostBasis::PartlyReconciled
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CostBasis::Estimate => "estimate",
            CostBasis::PartlyReconciled => "partly reconciled",
            CostBasis::Reconciled => "reconciled",
        }
    }
}

/// `GET /api/v1/summary`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub group_by: String,
    pub idle_threshold_pct: f64,
    pub groups: Vec<SummaryGroup>,
    pub total: SummaryGroup,
}

/// A team of the config's registry (`[teams.<name>]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TeamInfo {
    pub display_name: Option<String>,
    pub manager: Option<String>,
    pub cost_center: Option<String>,
}
