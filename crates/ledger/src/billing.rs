//! Billing reconciliation: FinOps FOCUS exports (the CSV that AWS, Azure, GCP and OCI export)
//! read line by line, GPU-looking lines matched to the GPUs' hosts by resource ID, and the
//! estimated cost compared with what was billed, per GPU, team and month.
//!
//! List price and billed price never mix: the estimate is gpuledger's rate × present hours,
//! the billed figure is the export's `EffectiveCost` (after discounts and commitments; its
//! `BilledCost` is kept beside it). Lines that look like GPU spend but match no known host are
//! listed, not dropped.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Datelike, NaiveDateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use crate::summary::GpuWindow;

/// One usable line of a FOCUS export.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BillingLine {
    /// Line number in the file (the header is line 1).
    pub line: usize,
    pub provider: Option<String>,
    pub service: Option<String>,
    pub resource_id: Option<String>,
    /// The resource ID's last part (`i-0abc` of an ARN, a VM name of an Azure ID), lower case.
    pub resource_key: Option<String>,
    pub description: Option<String>,
    pub charge_period_start: DateTime<Utc>,
    /// `ChargePeriodEnd` (exclusive); the end of the start's day when the export has none.
    pub charge_period_end: DateTime<Utc>,
    /// `YYYY-MM` of the charge period.
    pub month: String,
    pub effective_cost: f64,
    pub billed_cost: f64,
    /// A GPU instance type named by the line, when it names one.
    pub instance_type: Option<String>,
    /// Whether the line looks like GPU spend.
    pub gpu: bool,
}

/// Why a FOCUS file or line could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BillingError {
    #[error("{0}")]
    File(String),
}

/// Instance-type prefixes of GPU instances: AWS families, GCP accelerator-optimized machine
/// series, Azure N-series.
const GPU_FAMILIES: &[&str] = &[
    "p2.",
    "p3.",
    "p3dn.",
    "p4d.",
    "p4de.",
    "p5.",
    "p5e.",
    "p5en.",
    "p6-",
    "g3.",
    "g3s.",
    "g4dn.",
    "g4ad.",
    "g5.",
    "g5g.",
    "g6.",
    "g6e.",
    "g6f.",
    "gr6.",
    "gr6f.",
    "a2-",
    "a3-",
    "a4-",
    "g2-",
    "standard_nc",
    "standard_nd",
    "standard_nv",
    "bm.gpu",
    "vm.gpu",
];
const GPU_WORDS: &[&str] = &[
    "gpu", "nvidia", "a100", "h100", "h200", "l40s", "a10g", "tesla", "v100",
];

fn cell(row: &csv::StringRecord, i: Option<usize>) -> Option<String> {
    let v = row.get(i?)?.trim();
    (!v.is_empty() && !v.eq_ignore_ascii_case("null")).then(|| v.to_string())
}

fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.with_timezone(&Utc));
    }
    for f in [
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%d %H:%M:%S%.f",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, f) {
            return Some(Utc.from_utc_datetime(&t));
        }
    }
    chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| Utc.from_utc_datetime(&t))
}

/// The last part of a resource ID, lower case: what a host or instance ID is compared with.
pub fn resource_key(id: &str) -> String {
    id.trim()
        .rsplit(['/', ':'])
        .find(|p| !p.is_empty())
        .unwrap_or(id)
        .to_ascii_lowercase()
}

/// A GPU instance type a line names, from its words (`… per On Demand Linux p4d.24xlarge
/// Instance Hour`) or the catalog.
fn instance_type_of(text: &str) -> Option<String> {
    text.split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
        .map(|w| w.trim_matches(|c: char| c == '"' || c == '\''))
        .find(|w| {
            let l = w.to_ascii_lowercase();
            crate::catalog::instance_price(w).is_some()
                || GPU_FAMILIES
                    .iter()
                    .any(|f| l.starts_with(f) && l.len() > f.len())
        })
        .map(String::from)
}

/// The text of an export file as delivered: gzip-compressed (`.csv.gz`, as AWS Data Exports
/// write them) or plain, UTF-8 with or without a byte-order mark.
pub fn read_export(name: &str, bytes: &[u8]) -> Result<String, BillingError> {
    use std::io::Read;
    let mut raw = Vec::new();
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut raw)
            .map_err(|e| BillingError::File(format!("{name}: not a readable gzip file: {e}")))?;
        &raw[..]
    } else {
        bytes
    };
    let text = std::str::from_utf8(bytes).map_err(|e| {
        BillingError::File(format!(
            "{name}: not UTF-8 text at byte {}; FOCUS exports are UTF-8 CSV",
            e.valid_up_to()
        ))
    })?;
    Ok(text.strip_prefix('\u{feff}').unwrap_or(text).to_string())
}

/// Read a FOCUS CSV. A file without the FOCUS columns this needs is an error; a line that
/// cannot be read is named in the problems and the rest is kept.
pub fn parse_focus(
    name: &str,
    text: &str,
) -> Result<(Vec<BillingLine>, Vec<String>), BillingError> {
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_bytes());
    let header = reader
        .headers()
        .map_err(|e| BillingError::File(format!("{name}: cannot read the header: {e}")))?
        .clone();
    let col = |n: &str| header.iter().position(|h| h.trim() == n);
    let (Some(start_c), Some(eff_c), Some(billed_c)) = (
        col("ChargePeriodStart"),
        col("EffectiveCost"),
        col("BilledCost"),
    ) else {
        return Err(BillingError::File(format!(
            "{name}: not a FOCUS export: the header needs ChargePeriodStart, EffectiveCost and \
             BilledCost (FOCUS 1.0 columns)"
        )));
    };
    let end_c = col("ChargePeriodEnd");
    let (rid, provider, service, desc, sku, rtype) = (
        col("ResourceId"),
        col("ProviderName"),
        col("ServiceName"),
        col("ChargeDescription"),
        col("SkuId"),
        col("ResourceType"),
    );
    let mut lines = Vec::new();
    let mut problems = Vec::new();
    for (i, row) in reader.records().enumerate() {
        let line = i + 2;
        let row = match row {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("{name}:{line}: {e}"));
                continue;
            }
        };
        let money = |c: usize, field: &str| -> Result<f64, String> {
            let v = cell(&row, Some(c)).unwrap_or_else(|| "0".into());
            v.parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .ok_or_else(|| format!("{name}:{line}: {field}: `{v}` is not a number"))
        };
        let (effective_cost, billed_cost) =
            match (money(eff_c, "EffectiveCost"), money(billed_c, "BilledCost")) {
                (Ok(e), Ok(b)) => (e, b),
                (Err(p), _) | (_, Err(p)) => {
                    problems.push(p);
                    continue;
                }
            };
        let Some(start) = cell(&row, Some(start_c)) else {
            problems.push(format!("{name}:{line}: ChargePeriodStart: empty"));
            continue;
        };
        let Some(charge_period_start) = parse_time(&start) else {
            problems.push(format!(
                "{name}:{line}: ChargePeriodStart: `{start}` is not a date and time"
            ));
            continue;
        };
        let day_end = charge_period_start
            .date_naive()
            .succ_opt()
            .and_then(|d| d.and_hms_opt(0, 0, 0).map(|t| Utc.from_utc_datetime(&t)));
        let charge_period_end = match cell(&row, end_c) {
            None => day_end.unwrap_or(charge_period_start),
            Some(end) => match parse_time(&end) {
                Some(e) if e > charge_period_start => e,
                Some(_) => {
                    problems.push(format!(
                        "{name}:{line}: ChargePeriodEnd: `{end}` is not after ChargePeriodStart"
                    ));
                    continue;
                }
                None => {
                    problems.push(format!(
                        "{name}:{line}: ChargePeriodEnd: `{end}` is not a date and time"
                    ));
                    continue;
                }
            },
        };
        let description = cell(&row, desc);
        let words = [description.clone(), cell(&row, sku), cell(&row, rtype)]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" ");
        let instance_type = instance_type_of(&words);
        let service = cell(&row, service);
        let lower = format!("{words} {}", service.as_deref().unwrap_or("")).to_ascii_lowercase();
        let gpu = instance_type.is_some()
            || lower
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|w| GPU_WORDS.contains(&w));
        let resource_id = cell(&row, rid);
        lines.push(BillingLine {
            line,
            provider: cell(&row, provider),
            service,
            resource_key: resource_id.as_deref().map(resource_key),
            resource_id,
            description,
            month: format!(
                "{:04}-{:02}",
                charge_period_start.year(),
                charge_period_start.month()
            ),
            charge_period_start,
            charge_period_end,
            effective_cost,
            billed_cost,
            instance_type,
            gpu,
        });
    }
    Ok((lines, problems))
}

/// One GPU's month: its estimate and its share of what its host was billed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuMonth {
    pub month: String,
    pub uuid: String,
    pub host: String,
    pub team: String,
    pub gpu_hours: i64,
    /// Rate × present hours; `None` when the GPU has no rate.
    pub estimated_usd: Option<f64>,
    /// The host's `EffectiveCost`, shared by its GPUs in proportion to their present hours.
    pub billed_usd: f64,
    pub difference_usd: Option<f64>,
}

/// A team's month.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeamMonth {
    pub month: String,
    pub team: String,
    pub estimated_usd: f64,
    pub billed_usd: f64,
    pub difference_usd: f64,
    /// GPU-hours of GPUs without a rate (not in `estimated_usd`).
    pub unpriced_gpu_hours: i64,
}

/// A GPU-looking line no known host matched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unmatched {
    pub line: usize,
    pub month: String,
    pub resource_id: Option<String>,
    pub instance_type: Option<String>,
    pub description: Option<String>,
    pub effective_cost: f64,
    /// The line's charge period, unix seconds, `[start, end)`.
    #[serde(default)]
    pub period_start: i64,
    #[serde(default)]
    pub period_end: i64,
}

/// One GPU's share of one matched line: what the store keeps, so that any window's hours in
/// the charge period can show what was billed for them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BilledShare {
    pub uuid: String,
    /// The hours the share covers, unix seconds, `[start, end)`: the line's charge period, or
    /// its month when the GPU had no hour in the period.
    pub period_start: i64,
    pub period_end: i64,
    pub billed_usd: f64,
    /// The GPU's present hours in `[period_start, period_end)` the share is spread over (0:
    /// it covers none).
    pub hours: i64,
}

/// The reconciliation of one export.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Reconciliation {
    pub lines: usize,
    pub gpu_lines: usize,
    pub matched_lines: usize,
    pub gpus: Vec<GpuMonth>,
    pub teams: Vec<TeamMonth>,
    pub unmatched: Vec<Unmatched>,
    pub problems: Vec<String>,
    /// Per GPU and the hours it covers (not in the printed report: the per-month rows say it).
    #[serde(skip)]
    pub shares: Vec<BilledShare>,
}

/// Present hours per GPU UUID within each charge period `(start, end)` of the export's GPU
/// lines, from the store: a line's cost is shared among its host's GPUs by these.
pub type PeriodHours = HashMap<(i64, i64), HashMap<String, i64>>;

fn cents(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// `[start, end)` (unix seconds) of the calendar month (UTC) of `t`.
pub fn month_range(t: DateTime<Utc>) -> (i64, i64) {
    let start = Utc
        .with_ymd_and_hms(t.year(), t.month(), 1, 0, 0, 0)
        .single()
        .unwrap_or(t);
    let (y, m) = if t.month() == 12 {
        (t.year() + 1, 1)
    } else {
        (t.year(), t.month() + 1)
    };
    let end = Utc.with_ymd_and_hms(y, m, 1, 0, 0, 0).single().unwrap_or(t);
    (start.timestamp(), end.timestamp())
}

/// Match `lines` to the GPUs of each month (`windows[month]`, from the store) by host, or by
/// an alias of a host (`aliases`: instance ID → host, lower case), and share each matched
/// line's cost among its host's GPUs by their present hours in the line's charge period
/// (`period_hours`); when none of them has an hour in the period, by their present hours in
/// the month (the share then covers the month); when none has one there either, evenly (the
/// share then covers no hour: it is in the report, in no cost). GPU-looking lines no host
/// matches are listed. The per GPU, team and month figures come from [`months`] once the
/// shares are spread over the hours.
pub fn reconcile(
    lines: &[BillingLine],
    windows: &BTreeMap<String, Vec<GpuWindow>>,
    period_hours: &PeriodHours,
    aliases: &HashMap<String, String>,
    problems: Vec<String>,
) -> Reconciliation {
    let mut r = Reconciliation {
        lines: lines.len(),
        problems,
        ..Default::default()
    };
    // Each month's GPUs by host name, case folded, in their order: a line's host is looked up
    // once, not searched for among every GPU of the month (lines times GPUs: at 100,350 GPUs
    // × 30 days some 250,000 lines against 100,000 GPUs a month).
    let by_host: HashMap<&str, HashMap<String, Vec<&GpuWindow>>> = windows
        .iter()
        .map(|(month, gpus)| {
            let mut hosts: HashMap<String, Vec<&GpuWindow>> = HashMap::new();
            for g in gpus {
                if let Some(h) = g.host.as_deref() {
                    hosts.entry(h.to_ascii_lowercase()).or_default().push(g);
                }
            }
            (month.as_str(), hosts)
        })
        .collect();
    for l in lines {
        if !l.gpu {
            continue; // A GPU host's other spend (transfer, storage) is no GPU cost.
        }
        r.gpu_lines += 1;
        let month_gpus = by_host.get(l.month.as_str());
        // The GPUs of the line's host (by an alias, or named as it is), under the spelling of
        // the first GPU found with that name in any case.
        let gpus: Option<Vec<&GpuWindow>> = l.resource_key.as_deref().and_then(|k| {
            let host = aliases.get(k).map(String::as_str).unwrap_or(k);
            let same = month_gpus?.get(&host.to_ascii_lowercase())?;
            let spelled = same.first()?.host.as_deref();
            Some(
                same.iter()
                    .filter(|g| g.host.as_deref() == spelled)
                    .copied()
                    .collect(),
            )
        });
        let Some(gpus) = gpus else {
            r.unmatched.push(Unmatched {
                line: l.line,
                month: l.month.clone(),
                resource_id: l.resource_id.clone(),
                instance_type: l.instance_type.clone(),
                description: l.description.clone(),
                effective_cost: l.effective_cost,
                period_start: l.charge_period_start.timestamp(),
                period_end: l.charge_period_end.timestamp(),
            });
            continue;
        };
        r.matched_lines += 1;
        let period = (
            l.charge_period_start.timestamp(),
            l.charge_period_end.timestamp(),
        );
        let in_period = period_hours.get(&period);
        let hours_in = |g: &GpuWindow| {
            in_period
                .and_then(|m| m.get(&*g.uuid))
                .copied()
                .unwrap_or(0)
        };
        // (weight, hours the share covers, the period they lie in)
        let split: Vec<(f64, i64, (i64, i64))> = if gpus.iter().any(|g| hours_in(g) > 0) {
            gpus.iter()
                .map(|g| (hours_in(g) as f64, hours_in(g), period))
                .collect()
        } else if gpus.iter().any(|g| g.present_hours > 0) {
            let month = month_range(l.charge_period_start);
            gpus.iter()
                .map(|g| (g.present_hours as f64, g.present_hours, month))
                .collect()
        } else {
            gpus.iter().map(|_| (1.0, 0, period)).collect()
        };
        let sum: f64 = split.iter().map(|s| s.0).sum();
        for (g, (w, hours, (start, end))) in gpus.iter().zip(split) {
            if w <= 0.0 {
                continue; // Not there in the period: no share.
            }
            r.shares.push(BilledShare {
                uuid: g.uuid.to_string(),
                period_start: start,
                period_end: end,
                billed_usd: l.effective_cost * w / sum,
                hours,
            });
        }
    }
    r
}

/// One GPU's billed hours under one owner in one charge period, as the store reads them back
/// once the shares are spread over the hours.
#[derive(Debug, Clone, PartialEq)]
pub struct BilledRow {
    /// `YYYY-MM` of the charge period.
    pub month: String,
    pub uuid: String,
    pub host: String,
    /// The owner at those hours.
    pub team: String,
    /// Hours the share covers (0 for a share that covers none).
    pub gpu_hours: i64,
    pub usd_per_hour: Option<f64>,
    pub billed_usd: f64,
}

/// Per GPU, team and month: what was billed and the estimate of the same hours (rate × the
/// hours the bill covers, not the whole month's), and the difference.
pub fn months(rows: &[BilledRow]) -> (Vec<GpuMonth>, Vec<TeamMonth>) {
    let mut gpus: BTreeMap<(String, String, String), GpuMonth> = BTreeMap::new();
    let mut teams: BTreeMap<(String, String), TeamMonth> = BTreeMap::new();
    for row in rows {
        let estimated = row.usd_per_hour.map(|r| r * row.gpu_hours as f64);
        let g = gpus
            .entry((row.month.clone(), row.uuid.clone(), row.team.clone()))
            .or_insert_with(|| GpuMonth {
                month: row.month.clone(),
                uuid: row.uuid.clone(),
                host: row.host.clone(),
                team: row.team.clone(),
                gpu_hours: 0,
                estimated_usd: Some(0.0),
                billed_usd: 0.0,
                difference_usd: None,
            });
        g.gpu_hours += row.gpu_hours;
        g.billed_usd += row.billed_usd;
        g.estimated_usd = match (g.estimated_usd, estimated) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        let t = teams
            .entry((row.month.clone(), row.team.clone()))
            .or_insert_with(|| TeamMonth {
                month: row.month.clone(),
                team: row.team.clone(),
                estimated_usd: 0.0,
                billed_usd: 0.0,
                difference_usd: 0.0,
                unpriced_gpu_hours: 0,
            });
        t.billed_usd += row.billed_usd;
        match estimated {
            Some(e) => t.estimated_usd += e,
            None => t.unpriced_gpu_hours += row.gpu_hours,
        }
    }
    let gpus = gpus
        .into_values()
        .map(|mut g| {
            g.difference_usd = g.estimated_usd.map(|e| cents(g.billed_usd - e));
            g.estimated_usd = g.estimated_usd.map(cents);
            g.billed_usd = cents(g.billed_usd);
            g
        })
        .collect();
    let teams = teams
        .into_values()
        .map(|mut t| {
            t.difference_usd = cents(t.billed_usd - t.estimated_usd);
            t.billed_usd = cents(t.billed_usd);
            t.estimated_usd = cents(t.estimated_usd);
            t
        })
        .collect();
    (gpus, teams)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "BilledCost,ChargePeriodStart,EffectiveCost,ResourceId,ChargeDescription,ServiceName,ProviderName";

    fn window(uuid: &str, host: &str, team: &str, hours: i64, rate: Option<f64>) -> GpuWindow {
        GpuWindow {
            uuid: uuid.into(),
            host: Some(host.into()),
            memory_mib: None,
            mem_max_mib: None,
            team: team.into(),
            env: "prod".into(),
            cloud: Some("aws".into()),
            cluster: None,
            model: "NVIDIA A100-SXM4-40GB".into(),
            vendor: Some("nvidia".into()),
            usd_per_hour: rate,
            present_hours: hours,
            busy_hours: 0,
            idle_hours: 0,
            allocated_hours: 0,
            allocated_idle_hours: 0,
            known_hours: 0,
            activity_sum: 0.0,
            ..Default::default()
        }
    }

    #[test]
    fn lines_are_read_and_bad_ones_named() {
        let text = format!(
            "{HEADER}\n\
             30.0,2026-11-03 10:00:00,28.5,arn:aws:ec2:us-east-1:1:instance/i-0GPU1,$32.77 per On Demand Linux p4d.24xlarge Instance Hour,Amazon Elastic Compute Cloud,AWS\n\
             0.34,2026-11-03 10:00:00,0.34,i-0cpu,$0.34 per On Demand Linux c5.2xlarge Instance Hour,Amazon Elastic Compute Cloud,AWS\n\
             x,2026-11-03 10:00:00,1,i-0bad,,,AWS\n\
             1,yesterday,1,i-0bad,,,AWS\n\
             5,2026-11-04T00:00:00Z,5,/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/virtualMachines/GPU-VM-2,NC24ads A100 v4,Virtual Machines,Microsoft\n"
        );
        let (lines, problems) = parse_focus("b.csv", &text).unwrap();
        assert_eq!(lines.len(), 3);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert_eq!(problems[0], "b.csv:4: BilledCost: `x` is not a number");
        assert_eq!(
            problems[1],
            "b.csv:5: ChargePeriodStart: `yesterday` is not a date and time"
        );
        assert_eq!(lines[0].resource_key.as_deref(), Some("i-0gpu1"));
        assert_eq!(lines[0].instance_type.as_deref(), Some("p4d.24xlarge"));
        assert!(lines[0].gpu && !lines[1].gpu && lines[2].gpu);
        assert_eq!(
            (lines[0].month.as_str(), lines[0].effective_cost),
            ("2026-11", 28.5)
        );
        assert_eq!(lines[2].resource_key.as_deref(), Some("gpu-vm-2"));
        assert!(parse_focus("x.csv", "a,b\n1,2\n")
            .unwrap_err()
            .to_string()
            .contains("not a FOCUS export"));
    }

    /// A line's cost goes to its host's GPUs by their hours in its charge period: a GPU that
    /// was there all month but not that day gets none of that day's bill.
    #[test]
    fn a_lines_cost_follows_the_gpus_present_in_its_charge_period() {
        let text = "ChargePeriodStart,ChargePeriodEnd,BilledCost,EffectiveCost,ResourceId,ChargeDescription\n\
             2026-11-02T00:00:00Z,2026-11-03T00:00:00Z,48,40,i-0aaa,p4d.24xlarge Instance Hour\n\
             2026-11-03T00:00:00Z,,10,10,i-0aaa,p4d.24xlarge Instance Hour\n\
             2026-11-04T00:00:00Z,2026-11-04T00:00:00Z,1,1,i-0aaa,p4d.24xlarge Instance Hour\n\
             2026-11-04T00:00:00Z,soon,1,1,i-0aaa,p4d.24xlarge Instance Hour\n";
        let (lines, problems) = parse_focus("p.csv", text).unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            problems,
            [
                "p.csv:4: ChargePeriodEnd: `2026-11-04T00:00:00Z` is not after ChargePeriodStart",
                "p.csv:5: ChargePeriodEnd: `soon` is not a date and time"
            ]
        );
        let day = |d: &str| d.parse::<DateTime<Utc>>().unwrap().timestamp();
        assert_eq!(
            lines[1].charge_period_end.timestamp(),
            day("2026-11-04T00:00:00Z"),
            "no ChargePeriodEnd: the end of its day"
        );
        let windows = BTreeMap::from([(
            "2026-11".to_string(),
            vec![
                window("GPU-1", "i-0aaa", "nlp", 100, Some(1.0)),
                window("GPU-2", "i-0aaa", "vision", 100, Some(1.0)),
            ],
        )]);
        let periods = PeriodHours::from([(
            (day("2026-11-02T00:00:00Z"), day("2026-11-03T00:00:00Z")),
            HashMap::from([("GPU-1".to_string(), 24), ("GPU-2".to_string(), 0)]),
        )]);
        let r = reconcile(&lines, &windows, &periods, &HashMap::new(), vec![]);
        let shares: Vec<(&str, f64, i64, i64)> = r
            .shares
            .iter()
            .map(|s| (s.uuid.as_str(), s.billed_usd, s.hours, s.period_start))
            .collect();
        // Day 2: all $40 to GPU-1, over its 24 hours. Day 3 (no hours known for it): by the
        // month's hours, $5 each, spread over the month.
        assert_eq!(
            shares,
            [
                ("GPU-1", 40.0, 24, day("2026-11-02T00:00:00Z")),
                ("GPU-1", 5.0, 100, day("2026-11-01T00:00:00Z")),
                ("GPU-2", 5.0, 100, day("2026-11-01T00:00:00Z")),
            ]
        );
        assert_eq!(r.shares[1].period_end, day("2026-12-01T00:00:00Z"));
    }

    /// Per GPU, team and month: billed against the estimate of the hours the bill covers; a
    /// GPU that changed owner has a row per owner; a GPU without a rate is unpriced.
    #[test]
    fn months_compare_billed_with_the_estimate_of_the_same_hours() {
        let row = |uuid: &str, team: &str, hours: i64, rate: Option<f64>, billed: f64| BilledRow {
            month: "2026-11".into(),
            uuid: uuid.into(),
            host: "h".into(),
            team: team.into(),
            gpu_hours: hours,
            usd_per_hour: rate,
            billed_usd: billed,
        };
        let (gpus, teams) = months(&[
            row("GPU-1", "nlp", 10, Some(4.0), 30.0),
            row("GPU-1", "nlp", 14, Some(4.0), 42.0),
            row("GPU-1", "vision", 24, Some(4.0), 72.0),
            row("GPU-2", "vision", 24, None, 10.0),
        ]);
        let g: Vec<_> = gpus
            .iter()
            .map(|g| {
                (
                    g.uuid.as_str(),
                    g.team.as_str(),
                    g.gpu_hours,
                    g.estimated_usd,
                    g.billed_usd,
                    g.difference_usd,
                )
            })
            .collect();
        assert_eq!(
            g,
            [
                ("GPU-1", "nlp", 24, Some(96.0), 72.0, Some(-24.0)),
                ("GPU-1", "vision", 24, Some(96.0), 72.0, Some(-24.0)),
                ("GPU-2", "vision", 24, None, 10.0, None),
            ]
        );
        let v = teams.iter().find(|t| t.team == "vision").unwrap();
        assert_eq!(
            (
                v.estimated_usd,
                v.billed_usd,
                v.difference_usd,
                v.unpriced_gpu_hours
            ),
            (96.0, 82.0, -14.0, 24)
        );
    }

    #[test]
    fn gpus_get_their_share_of_the_bill_and_unmatched_gpu_lines_are_listed() {
        let text = format!(
            "{HEADER}\n\
             100,2026-11-01 00:00:00,90,arn:aws:ec2:us-east-1:1:instance/i-0aaa,p4d.24xlarge Instance Hour,EC2,AWS\n\
             50,2026-11-02 00:00:00,45,i-0aaa,p4d.24xlarge Instance Hour,EC2,AWS\n\
             9,2026-11-02 00:00:00,9,i-0zzz,g5.xlarge Instance Hour,EC2,AWS\n\
             1,2026-11-02 00:00:00,1,i-0cpu,c5.large Instance Hour,EC2,AWS\n"
        );
        let (lines, problems) = parse_focus("b.csv", &text).unwrap();
        let windows = BTreeMap::from([(
            "2026-11".to_string(),
            vec![
                window("GPU-1", "gpu-node-1", "nlp", 30, Some(4.0)),
                window("GPU-2", "gpu-node-1", "vision", 10, Some(4.0)),
                window("GPU-3", "other", "nlp", 10, None),
            ],
        )]);
        let aliases = HashMap::from([("i-0aaa".to_string(), "gpu-node-1".to_string())]);
        let r = reconcile(&lines, &windows, &PeriodHours::new(), &aliases, problems);
        assert_eq!((r.lines, r.gpu_lines, r.matched_lines), (4, 3, 2));
        // 135 billed on the host (no hours known per day: by month hours): 3/4 to GPU-1 (30
        // of 40 h), 1/4 to GPU-2.
        let billed = |uuid: &str| -> f64 {
            r.shares
                .iter()
                .filter(|s| s.uuid == uuid)
                .map(|s| s.billed_usd)
                .sum()
        };
        assert_eq!((billed("GPU-1"), billed("GPU-2")), (101.25, 33.75));
        assert_eq!(r.unmatched.len(), 1);
        assert_eq!(r.unmatched[0].resource_id.as_deref(), Some("i-0zzz"));
        assert_eq!(r.unmatched[0].instance_type.as_deref(), Some("g5.xlarge"));
    }

    /// A line's host is found whatever its case, and its bill goes to the GPUs under the
    /// spelling found first: one host reported under two spellings is not billed twice.
    #[test]
    fn a_lines_host_is_matched_in_any_case_under_one_spelling() {
        let text = format!(
            "{HEADER}\n\
             60,2026-11-01 00:00:00,60,i-0bbb,p4d.24xlarge Instance Hour,EC2,AWS\n"
        );
        let (lines, problems) = parse_focus("b.csv", &text).unwrap();
        let windows = BTreeMap::from([(
            "2026-11".to_string(),
            vec![
                window("GPU-0", "other", "nlp", 10, None),
                window("GPU-4", "gpu-node-2", "nlp", 10, Some(4.0)),
                window("GPU-5", "gpu-node-2", "nlp", 10, Some(4.0)),
                window("GPU-6", "Gpu-Node-2", "nlp", 10, Some(4.0)),
            ],
        )]);
        let aliases = HashMap::from([("i-0bbb".to_string(), "GPU-NODE-2".to_string())]);
        let r = reconcile(&lines, &windows, &PeriodHours::new(), &aliases, problems);
        assert_eq!(r.matched_lines, 1);
        let shares: Vec<(&str, f64)> = r
            .shares
            .iter()
            .map(|s| (s.uuid.as_str(), s.billed_usd))
            .collect();
        assert_eq!(shares, [("GPU-4", 30.0), ("GPU-5", 30.0)]);
    }
}
