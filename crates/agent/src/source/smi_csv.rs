//! Parsing `nvidia-smi --query-gpu=… --format=csv` and `--query-compute-apps=… --format=csv`.
//!
//! Columns are found by their header name (units such as ` [MiB]` removed), so the parser reads
//! both the short field list the agent asks for and a capture of every field a driver offers,
//! whatever the order and whatever columns a newer driver adds.

use std::collections::HashMap;

use super::{known, known_string, number, sanitize, GpuReading, ProcessReading, SourceError};

/// The fields the agent asks `--query-gpu` for.
pub const GPU_FIELDS: &str = "uuid,name,memory.total,memory.used,utilization.gpu,power.draw,\
                              serial,pci.bus_id,driver_version,mig.mode.current";

/// The fields the agent asks `--query-compute-apps` for.
pub const APP_FIELDS: &str = "gpu_uuid,pid,process_name,used_gpu_memory";

pub(crate) fn parse_error(what: &'static str, reason: impl Into<String>) -> SourceError {
    SourceError::Parse {
        what,
        reason: reason.into(),
    }
}

/// `memory.total [MiB]` → `memory.total`.
fn column_key(header: &str) -> String {
    let h = header.trim();
    let h = match h.find(" [") {
        Some(i) if h.ends_with(']') => &h[..i],
        _ => h,
    };
    h.trim().to_ascii_lowercase()
}

/// Rows as maps from column key to raw text.
pub(crate) fn rows(
    text: &str,
    what: &'static str,
) -> Result<Vec<HashMap<String, String>>, SourceError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers: Vec<String> = reader
        .headers()
        .map_err(|e| parse_error(what, e.to_string()))?
        .iter()
        .map(column_key)
        .collect();
    if headers.iter().all(|h| h.is_empty()) {
        return Err(parse_error(what, "no header line"));
    }
    let mut out = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let record = record.map_err(|e| parse_error(what, format!("row {}: {e}", i + 1)))?;
        if record.iter().all(|f| f.trim().is_empty()) {
            continue;
        }
        let map = headers
            .iter()
            .zip(record.iter())
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect();
        out.push(map);
    }
    Ok(out)
}

pub(crate) fn first<'a>(row: &'a HashMap<String, String>, keys: &[&str]) -> Option<&'a str> {
    keys.iter()
        .find_map(|k| row.get(*k).map(String::as_str).and_then(known))
}

pub(crate) fn first_number(row: &HashMap<String, String>, keys: &[&str]) -> Option<f64> {
    keys.iter()
        .find_map(|k| row.get(*k).and_then(|v| number(v)))
}

/// Parse `--query-gpu` CSV (with its header line, units allowed). Rows without a UUID are
/// skipped with a warning.
pub fn parse_gpus(text: &str) -> Result<Vec<GpuReading>, SourceError> {
    const WHAT: &str = "nvidia-smi --query-gpu";
    let rows = rows(text, WHAT)?;
    if let Some(first_row) = rows.first() {
        if !first_row.contains_key("uuid") {
            return Err(parse_error(
                WHAT,
                "no `uuid` column; ask for --query-gpu=uuid,...",
            ));
        }
    }
    let mut out = Vec::new();
    for row in rows {
        let Some(uuid) = first(&row, &["uuid"]) else {
            tracing::warn!("nvidia-smi --query-gpu listed a GPU without a UUID; skipping it");
            continue;
        };
        let mig_enabled = match first(&row, &["mig.mode.current"]) {
            Some(m) if m.eq_ignore_ascii_case("enabled") => Some(true),
            Some(m) if m.eq_ignore_ascii_case("disabled") => Some(false),
            _ => None,
        };
        let mut g = GpuReading {
            uuid: uuid.to_string(),
            model: first(&row, &["name", "gpu_name"]).map(str::to_string),
            memory_mib: first_number(&row, &["memory.total"])
                .filter(|v| *v >= 0.0)
                .map(|v| v.round() as u64),
            serial: first(&row, &["serial"]).map(str::to_string),
            pci_bus_id: first(&row, &["pci.bus_id"]).map(str::to_string),
            driver_version: first(&row, &["driver_version"]).map(str::to_string),
            mig_enabled,
            util_pct: first_number(&row, &["utilization.gpu"]),
            mem_used_mib: first_number(&row, &["memory.used"]),
            power_w: first_number(
                &row,
                &["power.draw", "power.draw.average", "power.draw.instant"],
            ),
            ..Default::default()
        };
        sanitize(&mut g);
        out.push(g);
    }
    Ok(out)
}

/// Parse `--query-compute-apps` CSV. Rows without a GPU UUID or PID are skipped.
pub fn parse_apps(text: &str) -> Result<Vec<ProcessReading>, SourceError> {
    const WHAT: &str = "nvidia-smi --query-compute-apps";
    let mut out = Vec::new();
    if text.trim().is_empty() {
        return Ok(out);
    }
    for row in rows(text, WHAT)? {
        let (Some(gpu), Some(pid)) = (
            first(&row, &["gpu_uuid"]),
            first(&row, &["pid"]).and_then(|p| p.parse::<u32>().ok()),
        ) else {
            continue;
        };
        out.push(ProcessReading {
            gpu_uuid: gpu.to_string(),
            pid,
            name: row.get("process_name").and_then(|v| known_string(v)),
            process_type: Some("C".to_string()),
            used_memory_mib: first_number(&row, &["used_gpu_memory", "used_memory"])
                .filter(|v| *v >= 0.0)
                .map(|v| v.round() as u64),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_field_list_with_units_and_unknowns() {
        let text = "uuid, name, memory.total [MiB], memory.used [MiB], utilization.gpu [%], \
                    power.draw [W], serial, pci.bus_id, driver_version, mig.mode.current\n\
                    GPU-1, NVIDIA H100 80GB HBM3, 81559 MiB, 19818 MiB, [N/A], [Not Supported], \
                    1654922000123, 00000000:1B:00.0, 590.48.01, Enabled\n";
        let g = parse_gpus(text).unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].memory_mib, Some(81559));
        assert_eq!(g[0].mem_used_mib, Some(19818.0));
        assert_eq!(g[0].util_pct, None);
        assert_eq!(g[0].power_w, None);
        assert_eq!(g[0].mig_enabled, Some(true));
    }

    #[test]
    fn missing_uuid_column_is_an_error_and_empty_apps_are_none() {
        assert!(parse_gpus("name\nTesla T4\n").is_err());
        assert!(parse_apps("").unwrap().is_empty());
        assert!(parse_apps("gpu_uuid, pid\n").unwrap().is_empty());
    }
}
