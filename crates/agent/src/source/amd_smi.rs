//! Parsing `amd-smi static --json`, `amd-smi metric … --json` and `amd-smi process --json`
//! (ROCm 6.x and 7.x).
//!
//! Written from AMD's documented output and the shapes its users have published, not from
//! captured files: the corpus has no `amd-smi` output (see `shared/fixtures/SOURCES.md`). The
//! shapes read:
//!
//! - the GPUs as a list of objects (`[{"gpu": 0, …}, …]`, ROCm 6.0–6.3), wrapped in
//!   `{"gpu_data": […]}` (ROCm 6.4 and later), a single object for one GPU, or an object per GPU
//!   keyed by name (`{"gpu_0": {…}}`); the GPU's number is its `gpu` key, else the digits of its
//!   key, else its position;
//! - a value as `{"value": 42, "unit": "%"}`, a bare number, or text with a unit (`"42 %"`);
//!   `"N/A"` (and a whole section printed as `"N/A"`) is unknown. Memory in `B`, `KB`, `MB`
//!   (amd-smi's MB are MiB: it divides bytes by 1024²) or `GB`.
//!
//! | reading | where |
//! | --- | --- |
//! | model | static `asic.market_name`, else `board.product_name` |
//! | memory | static `vram.size`, else metric `mem_usage.total_vram` |
//! | identity | static `board.product_serial`, `asic.asic_serial` (the unique ID), `bus.bdf` |
//! | partition | static `partition.compute_partition` and `partition.partition_id` |
//! | activity | metric `usage.gfx_activity` |
//! | memory used | metric `mem_usage.used_vram` |
//! | power | metric `power.socket_power` (else `current_socket_power`, `average_socket_power`) |
//! | processes | process `process_list[].process_info` (or the item itself): `pid`, `name`, `memory_usage.vram_mem` |

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::amd::{identify, AmdDevice};
use super::rocm_smi::first_json;
use super::{
    is_sentinel, known_string, number, product_name, usable_id, GpuReading, ProcessReading,
    Snapshot, SourceError,
};

/// The arguments of the inventory read (everything `static` knows: its per-section flags differ
/// between versions, and the agent reads it only now and then).
pub const STATIC_ARGS: &[&str] = &["static", "--json"];
/// The arguments of the metrics read.
pub const METRIC_ARGS: &[&str] = &["metric", "--usage", "--power", "--mem-usage", "--json"];
/// The metrics read for an amd-smi that does not know those section flags.
pub const METRIC_ARGS_ALL: &[&str] = &["metric", "--json"];
/// The arguments of the process read.
pub const PROCESS_ARGS: &[&str] = &["process", "--json"];

/// The GPU objects of an amd-smi JSON document, with their numbers.
pub fn gpu_entries(v: &Value) -> Vec<(u32, &Map<String, Value>)> {
    fn index_of(m: &Map<String, Value>) -> Option<u32> {
        match m.get("gpu")? {
            Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    }
    match v {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| {
                let m = item.as_object()?;
                Some((index_of(m).unwrap_or(i as u32), m))
            })
            .collect(),
        Value::Object(m) => {
            if let Some(data) = m.get("gpu_data") {
                return gpu_entries(data);
            }
            if let Some(i) = index_of(m) {
                return vec![(i, m)];
            }
            m.iter()
                .enumerate()
                .filter_map(|(i, (k, item))| {
                    let inner = item.as_object()?;
                    let digits: String = k
                        .chars()
                        .rev()
                        .take_while(char::is_ascii_digit)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    let index = index_of(inner)
                        .or_else(|| digits.parse().ok())
                        .unwrap_or(i as u32);
                    // Only keys that name a GPU; anything else is not a device.
                    let named = k.to_ascii_lowercase().contains("gpu") || !digits.is_empty();
                    named.then_some((index, inner))
                })
                .collect()
        }
        _ => Vec::new(),
    }
}

/// The GPU numbers an amd-smi document lists, sorted; `None` when it is not JSON.
pub fn gpu_indices(text: &str) -> Option<Vec<u32>> {
    let doc = first_json(text, "amd-smi --json").ok()?;
    let mut ids: Vec<u32> = gpu_entries(&doc).into_iter().map(|(i, _)| i).collect();
    ids.sort_unstable();
    Some(ids)
}

fn at<'a>(m: &'a Map<String, Value>, path: &[&str]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    let mut v = m.get(*first)?;
    for p in rest {
        v = v.as_object()?.get(*p)?;
    }
    Some(v)
}

/// A value and its unit, from `{"value": …, "unit": …}`, a number, or text such as `"42 %"`.
fn value_unit(v: &Value) -> Option<(f64, Option<String>)> {
    match v {
        Value::Number(n) => n.as_f64().filter(|x| !is_sentinel(*x)).map(|x| (x, None)),
        Value::String(s) => {
            let x = number(s)?;
            let unit = s.split_whitespace().nth(1).map(str::to_string).or_else(|| {
                let t = s.trim();
                let at = t.find(|c: char| c.is_ascii_alphabetic() || c == '%')?;
                Some(t[at..].to_string())
            });
            Some((x, unit))
        }
        Value::Object(m) => {
            let (x, unit) = value_unit(m.get("value")?)?;
            let unit = m
                .get("unit")
                .and_then(Value::as_str)
                .map(str::to_string)
                .or(unit);
            Some((x, unit))
        }
        _ => None,
    }
}

fn plain(v: Option<&Value>) -> Option<f64> {
    value_unit(v?).map(|(x, _)| x)
}

/// A memory figure in MiB; `None` for a unit that is not a memory unit.
fn mib(v: Option<&Value>) -> Option<f64> {
    let (x, unit) = value_unit(v?)?;
    let factor = match unit.as_deref().map(str::to_ascii_uppercase).as_deref() {
        None | Some("MB") | Some("MIB") => 1.0,
        Some("B") => 1.0 / (1024.0 * 1024.0),
        Some("KB") | Some("KIB") => 1.0 / 1024.0,
        Some("GB") | Some("GIB") => 1024.0,
        _ => return None,
    };
    Some(x * factor).filter(|m| *m >= 0.0)
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => known_string(s),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn first_text(m: &Map<String, Value>, paths: &[&[&str]]) -> Option<String> {
    paths.iter().find_map(|p| text(at(m, p)))
}

/// Parse the three amd-smi documents into GPUs with identities (`host` is needed where only a
/// PCI address identifies a GPU). A GPU in `metric` but not in `static` has no identity and is
/// left out; one in `static` only is reported without metrics. Without `process` (or when it is
/// not amd-smi JSON) the process list is unknown.
pub fn parse(
    static_json: &str,
    metric_json: &str,
    process_json: Option<&str>,
    host: Option<&str>,
) -> Result<Snapshot, SourceError> {
    let statics = first_json(static_json, "amd-smi static --json")?;
    let metrics = first_json(metric_json, "amd-smi metric --json")?;
    let metric_by_gpu: BTreeMap<u32, &Map<String, Value>> =
        gpu_entries(&metrics).into_iter().collect();
    let static_entries = gpu_entries(&statics);
    if static_entries.is_empty() && !metric_by_gpu.is_empty() {
        return Err(SourceError::Parse {
            what: "amd-smi static --json",
            reason: "no GPU in it, while `amd-smi metric` lists some".into(),
        });
    }

    let mut devices = Vec::new();
    for (index, s) in static_entries {
        let m = metric_by_gpu.get(&index).copied();
        let metric = |path: &[&str]| m.and_then(|m| at(m, path));
        let model = [&["asic", "market_name"][..], &["board", "product_name"]]
            .iter()
            .find_map(|p| text(at(s, p)).and_then(|t| product_name(&t)));
        let reading = GpuReading {
            model,
            memory_mib: mib(at(s, &["vram", "size"]))
                .or_else(|| mib(at(s, &["vram", "vram_size"])))
                .or_else(|| mib(metric(&["mem_usage", "total_vram"])))
                .map(|v| v.round() as u64),
            serial: first_text(s, &[&["board", "product_serial"]]).and_then(|t| usable_id(&t)),
            pci_bus_id: first_text(s, &[&["bus", "bdf"], &["bdf"]]).and_then(|t| usable_id(&t)),
            driver_version: first_text(s, &[&["driver", "version"], &["driver", "driver_version"]]),
            card_vendor: first_text(s, &[&["asic", "vendor_name"]]),
            util_pct: plain(metric(&["usage", "gfx_activity"])),
            mem_used_mib: mib(metric(&["mem_usage", "used_vram"])),
            power_w: [
                &["power", "socket_power"][..],
                &["power", "current_socket_power"],
                &["power", "average_socket_power"],
            ]
            .iter()
            .find_map(|p| plain(metric(p))),
            ..Default::default()
        };
        devices.push(AmdDevice {
            index,
            unique_id: first_text(s, &[&["asic", "asic_serial"]]).and_then(|t| usable_id(&t)),
            partition_id: plain(at(s, &["partition", "partition_id"]))
                .filter(|p| *p >= 0.0 && p.fract() == 0.0)
                .map(|p| p as u32),
            partition_mode: first_text(
                s,
                &[
                    &["partition", "compute_partition"],
                    &["partition", "current_compute_partition"],
                ],
            ),
            reading,
        });
    }
    let (gpus, by_index) = identify(devices, host, "amd-smi");

    let processes = match process_json.map(|t| first_json(t, "amd-smi process --json")) {
        Some(Ok(doc)) => processes(&doc, &by_index),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "could not read amd-smi's process list; allocations are left as they were");
            None
        }
        None => None,
    };
    Ok(Snapshot {
        gpus,
        processes_failed: processes.is_none(),
        processes: processes.unwrap_or_default(),
    })
}

/// The processes of `amd-smi process --json` on the GPUs `by_index` names.
fn processes(doc: &Value, by_index: &BTreeMap<u32, String>) -> Option<Vec<ProcessReading>> {
    let entries = gpu_entries(doc);
    let a_list = doc.is_array() || doc.get("gpu_data").is_some_and(Value::is_array);
    if entries.is_empty() && !a_list {
        // Not a list of GPUs, not even an empty one: not a process list this parser knows.
        return None;
    }
    let mut out = Vec::new();
    for (index, entry) in entries {
        let Some(uuid) = by_index.get(&index) else {
            continue;
        };
        let items = entry
            .get("process_list")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for item in items {
            // `{"process_info": {…}}`, or the fields directly; `{"process_info": "No running
            // processes detected"}` means none.
            let Some(p) = item
                .get("process_info")
                .unwrap_or(item)
                .as_object()
                .filter(|p| p.contains_key("pid"))
            else {
                continue;
            };
            let Some(pid) = plain(p.get("pid"))
                .filter(|x| *x > 0.0 && x.fract() == 0.0 && *x <= u32::MAX as f64)
                .map(|x| x as u32)
            else {
                continue;
            };
            out.push(ProcessReading {
                gpu_uuid: uuid.clone(),
                pid,
                name: text(p.get("name")),
                // amd-smi lists the processes holding the GPU through the compute driver (KFD).
                process_type: Some("C".into()),
                used_memory_mib: mib(at(p, &["memory_usage", "vram_mem"]))
                    .or_else(|| mib(p.get("mem")))
                    .map(|m| m.round() as u64),
            });
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    //! Hand-written documents modelled on AMD's documentation and published output, not
    //! captured from a host (the corpus has no amd-smi output).

    use super::*;

    /// `amd-smi static --json` for two MI300X, the ROCm 6.4+ `gpu_data` form, trimmed to the
    /// sections read.
    const STATIC_NEW: &str = r#"{"gpu_data": [
      {"gpu": 0,
       "asic": {"market_name": "AMD Instinct MI300X", "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
                "device_id": "0x74a1", "asic_serial": "0x2A8F4E1C7B3D9055"},
       "bus": {"bdf": "0000:0c:00.0", "max_pcie_width": 16},
       "board": {"model_number": "102-G30211-00", "product_serial": "692251001124", "product_name": "AMD Instinct MI300X OAM"},
       "driver": {"name": "amdgpu", "version": "6.10.5"},
       "vram": {"type": "HBM", "vendor": "N/A", "size": {"value": 196592, "unit": "MB"}, "bit_width": 8192},
       "partition": {"compute_partition": "SPX", "memory_partition": "NPS1", "partition_id": 0}},
      {"gpu": 1,
       "asic": {"market_name": "AMD Instinct MI300X", "asic_serial": "N/A"},
       "bus": {"bdf": "0000:22:00.0"},
       "board": {"product_serial": "N/A"},
       "driver": {"name": "amdgpu", "version": "6.10.5"},
       "vram": {"size": {"value": 196592, "unit": "MB"}}}
    ]}"#;

    /// `amd-smi metric --usage --power --mem-usage --json`, same two GPUs; GPU 1's power is
    /// not available.
    const METRIC_NEW: &str = r#"{"gpu_data": [
      {"gpu": 0, "usage": {"gfx_activity": {"value": 87, "unit": "%"}, "umc_activity": {"value": 31, "unit": "%"}},
       "power": {"socket_power": {"value": 612, "unit": "W"}, "gfx_voltage": "N/A"},
       "mem_usage": {"total_vram": {"value": 196592, "unit": "MB"}, "used_vram": {"value": 150232, "unit": "MB"}}},
      {"gpu": 1, "usage": {"gfx_activity": {"value": 0, "unit": "%"}},
       "power": {"socket_power": "N/A"},
       "mem_usage": {"used_vram": {"value": 283, "unit": "MB"}}}
    ]}"#;

    /// `amd-smi process --json` in the older `process_info` form, GPU 1 idle.
    const PROCESS_OLD: &str = r#"[
      {"gpu": 0, "process_list": [
        {"process_info": {"name": "python3", "pid": 40211,
          "memory_usage": {"gtt_mem": {"value": 2097152, "unit": "B"}, "cpu_mem": {"value": 0, "unit": "B"},
                           "vram_mem": {"value": 157286400000, "unit": "B"}}}}]},
      {"gpu": 1, "process_list": [{"process_info": "No running processes detected"}]}
    ]"#;

    #[test]
    fn gpu_data_form_with_identities_metrics_and_processes() {
        let snap = parse(STATIC_NEW, METRIC_NEW, Some(PROCESS_OLD), Some("mi300-1")).unwrap();
        assert_eq!(snap.gpus.len(), 2);
        let g = &snap.gpus[0];
        assert_eq!(g.uuid, "AMD-SN-692251001124");
        assert_eq!(g.model.as_deref(), Some("AMD Instinct MI300X"));
        assert_eq!(g.memory_mib, Some(196_592));
        assert_eq!(g.serial.as_deref(), Some("692251001124"));
        assert_eq!(g.pci_bus_id.as_deref(), Some("0000:0c:00.0"));
        assert_eq!(g.driver_version.as_deref(), Some("6.10.5"));
        assert_eq!(
            (g.util_pct, g.power_w, g.mem_used_mib),
            (Some(87.0), Some(612.0), Some(150_232.0))
        );
        assert_eq!(g.mig_parent_uuid, None, "SPX is not partitioned");
        let g = &snap.gpus[1];
        // No serial, no unique ID: the PCI address on this host.
        assert_eq!(g.uuid, "AMD-PCI-mi300-1-0000:22:00.0");
        assert_eq!((g.util_pct, g.power_w), (Some(0.0), None));
        assert_eq!(
            snap.processes,
            vec![ProcessReading {
                gpu_uuid: "AMD-SN-692251001124".into(),
                pid: 40211,
                name: Some("python3".into()),
                process_type: Some("C".into()),
                used_memory_mib: Some(150_000),
            }]
        );
        assert!(!snap.processes_failed);
    }

    #[test]
    fn older_list_form_text_values_and_the_newer_process_form() {
        // ROCm 6.0-6.3: a bare list; values as text with units in some versions.
        let statics = r#"[{"gpu": 0, "asic": {"market_name": "AMD Radeon PRO W7700", "asic_serial": "0x5C88007D760374F3"},
                           "bus": {"bdf": "0000:03:00.0"}, "board": {"product_serial": ""}, "vram": {"size": "16368 MB"}}]"#;
        let metrics = r#"[{"gpu": 0, "usage": {"gfx_activity": 42}, "power": {"socket_power": "20 W"},
                           "mem_usage": {"used_vram": "1024 MB"}}]"#;
        let procs = r#"[{"gpu": 0, "process_list": [{"name": "ollama", "pid": "7001",
                         "mem": {"value": 536870912, "unit": "B"}}]}]"#;
        let snap = parse(statics, metrics, Some(procs), None).unwrap();
        let g = &snap.gpus[0];
        assert_eq!(g.uuid, "AMD-UID-5c88007d760374f3");
        assert_eq!(g.memory_mib, Some(16368));
        assert_eq!(
            (g.util_pct, g.power_w, g.mem_used_mib),
            (Some(42.0), Some(20.0), Some(1024.0))
        );
        assert_eq!(snap.processes[0].pid, 7001);
        assert_eq!(snap.processes[0].used_memory_mib, Some(512));
    }

    #[test]
    fn dict_per_gpu_single_gpu_and_unknowns() {
        let statics = r#"{"gpu_0": {"asic": {"market_name": "N/A", "asic_serial": "0x0"},
                                     "board": {"product_serial": "0", "product_name": "AMD Instinct MI210"},
                                     "bus": "N/A"}}"#;
        let metrics = r#"{"gpu": 0, "usage": "N/A", "power": {"socket_power": {"value": 65535, "unit": "W"}}}"#;
        let snap = parse(statics, metrics, None, Some("h")).unwrap();
        // Serial `0`, unique ID `0x0`, no bus: nothing identifies it.
        assert!(snap.gpus.is_empty());
        assert!(snap.processes_failed, "no process list: unknown");

        let statics = r#"{"gpu_0": {"asic": {"market_name": "N/A", "asic_serial": "0x1234"},
                                     "board": {"product_name": "AMD Instinct MI210"}}}"#;
        let snap = parse(statics, metrics, Some("not json"), None).unwrap();
        let g = &snap.gpus[0];
        assert_eq!(g.uuid, "AMD-UID-1234");
        assert_eq!(g.model.as_deref(), Some("AMD Instinct MI210"));
        assert_eq!(
            (g.util_pct, g.power_w, g.memory_mib),
            (None, None, None),
            "65535 W is no reading"
        );
        assert!(snap.processes_failed);
        assert!(parse("{}", r#"[{"gpu": 0}]"#, None, None).is_err());
        assert!(parse("", "", None, None).is_err());
    }

    #[test]
    fn cpx_partitions_are_children() {
        let statics: String = format!(
            "[{}]",
            (0..8)
                .map(|i| format!(
                    r#"{{"gpu": {i}, "asic": {{"market_name": "AMD Instinct MI300X", "asic_serial": "0x2A8F4E1C7B3D9055"}},
                        "board": {{"product_serial": "692251001124"}}, "bus": {{"bdf": "0000:0c:00.{i}"}},
                        "partition": {{"compute_partition": "CPX", "partition_id": {i}}}}}"#
                ))
                .collect::<Vec<_>>()
                .join(",")
        );
        let metrics = r#"[{"gpu": 5, "usage": {"gfx_activity": {"value": 100, "unit": "%"}}}]"#;
        let procs =
            r#"[{"gpu": 5, "process_list": [{"process_info": {"pid": 9, "name": "train"}}]}]"#;
        let snap = parse(&statics, metrics, Some(procs), None).unwrap();
        assert_eq!(snap.gpus.len(), 9);
        assert_eq!(snap.gpus[0].uuid, "AMD-SN-692251001124");
        assert_eq!(snap.gpus[6].uuid, "AMD-SN-692251001124/P5");
        assert_eq!(snap.gpus[6].mig_profile.as_deref(), Some("CPX"));
        assert_eq!(snap.gpus[6].util_pct, Some(100.0));
        assert_eq!(snap.processes[0].gpu_uuid, "AMD-SN-692251001124/P5");
    }
}
