//! Parsing `rocm-smi … --json` (ROCm 4.x to 6.x, and the Hygon DCU fork of it) and
//! `rocm-smi --showpidgpus`.
//!
//! The JSON is one object per card (`card0`, `card1`, ...) of `"key": "text"` pairs, plus a
//! `system` object with the driver version and, with `--showpids`, one `PID<n>` entry per
//! process. Key spellings changed over the years (`Card series` → `Card Series`, `GPU ID` →
//! `Device ID`), so keys are matched without regard to case, and the few that matter have
//! fallbacks:
//!
//! | reading | keys |
//! | --- | --- |
//! | model | `Card Series`, `Device Name`, `Card Model` (unless a bare `0x…` ID), `Card SKU` |
//! | memory | `VRAM Total Memory (B)`, or `vram Total Memory (MiB)` (Hygon) |
//! | memory used | `VRAM Total Used Memory (B)` or `(MiB)` |
//! | activity | `GPU use (%)`, or `DCU use (%)` (Hygon) |
//! | power | `Average Graphics Package Power (W)`, `Current Socket Graphics Package Power (W)` |
//! | identity | `Serial Number`, `Unique ID`, `PCI Bus` (see [`super::amd`]) |
//!
//! `--showpids` gives each process's name and VRAM but only *how many* GPUs it uses; which ones
//! comes from `--showpidgpus`, which has no JSON form and is read as text:
//!
//! ```text
//! PID 1949829 is using 2 DRM device(s):
//! 0
//! 1
//! PID 78912 is using 0 DRM device(s)
//! ```

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::amd::{identify, AmdDevice};
use super::{
    known_string, number, product_name, usable_id, GpuReading, ProcessReading, Snapshot,
    SourceError,
};

/// The arguments of the JSON read.
pub const ARGS: &[&str] = &[
    "--showid",
    "--showproductname",
    "--showserial",
    "--showuniqueid",
    "--showbus",
    "--showuse",
    "--showmeminfo",
    "vram",
    "--showpower",
    "--showdriverversion",
    "--showpids",
    "--json",
];

/// The arguments of the process-to-GPU read.
pub const PID_GPUS_ARGS: &[&str] = &["--showpidgpus"];

const WHAT: &str = "rocm-smi --json";
const BYTES_PER_MIB: f64 = 1024.0 * 1024.0;

fn parse_error(reason: impl Into<String>) -> SourceError {
    SourceError::Parse {
        what: WHAT,
        reason: reason.into(),
    }
}

/// The first JSON value in `text`, skipping what rocm-smi prints before it (blank lines,
/// `WARNING: …` lines) and ignoring anything after it.
pub(crate) fn first_json(text: &str, what: &'static str) -> Result<Value, SourceError> {
    // The JSON starts the first line that starts with `{` or `[` (a warning may hold either).
    let mut offset = 0;
    let mut start = None;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        if t.starts_with('{') || t.starts_with('[') {
            start = Some(offset + (line.len() - t.len()));
            break;
        }
        offset += line.len();
    }
    let start = start.ok_or_else(|| SourceError::Parse {
        what,
        reason: "no JSON in the output".into(),
    })?;
    let mut values = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
    match values.next() {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(SourceError::Parse {
            what,
            reason: e.to_string(),
        }),
        None => Err(SourceError::Parse {
            what,
            reason: "no JSON in the output".into(),
        }),
    }
}

/// A card's fields by lower-case key. Only text (and number) values are fields; the empty key
/// some forks print is dropped.
fn fields(card: &Map<String, Value>) -> HashMap<String, String> {
    card.iter()
        .filter(|(k, _)| !k.trim().is_empty())
        .filter_map(|(k, v)| {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return None,
            };
            Some((k.trim().to_ascii_lowercase(), text))
        })
        .collect()
}

fn first<'a>(f: &'a HashMap<String, String>, keys: &[&str]) -> Option<&'a str> {
    keys.iter().find_map(|k| f.get(*k).map(String::as_str))
}

fn first_number(f: &HashMap<String, String>, keys: &[&str]) -> Option<f64> {
    keys.iter().find_map(|k| f.get(*k).and_then(|v| number(v)))
}

/// Bytes or MiB, whichever key the card has, in MiB.
fn mib(f: &HashMap<String, String>, bytes_key: &str, mib_key: &str) -> Option<f64> {
    first_number(f, &[bytes_key])
        .map(|b| b / BYTES_PER_MIB)
        .or_else(|| first_number(f, &[mib_key]))
        .filter(|v| *v >= 0.0)
}

/// One `PID<n>` entry of `system`: `name, gpu count, vram bytes, sdma, cu occupancy`.
struct PidEntry {
    name: Option<String>,
    vram_bytes: Option<f64>,
}

fn pid_entry(text: &str) -> PidEntry {
    // The name may itself hold commas; the four numbers are the last fields.
    let parts: Vec<&str> = text.split(',').collect();
    if parts.len() < 5 {
        return PidEntry {
            name: known_string(text),
            vram_bytes: None,
        };
    }
    let name = parts[..parts.len() - 4].join(",");
    PidEntry {
        name: known_string(&name),
        vram_bytes: number(parts[parts.len() - 3]).filter(|v| *v >= 0.0),
    }
}

/// `rocm-smi --showpidgpus`: each PID and the device indices it uses (none for a PID that holds
/// no GPU, such as a monitoring daemon).
pub fn parse_pid_gpus(text: &str) -> Vec<(u32, Vec<u32>)> {
    let mut out: Vec<(u32, Vec<u32>)> = Vec::new();
    let mut current: Option<usize> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("PID ") {
            current = rest
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
                .map(|pid| {
                    out.push((pid, Vec::new()));
                    out.len() - 1
                });
            continue;
        }
        if t.starts_with('=') || t.is_empty() {
            if t.starts_with('=') {
                current = None;
            }
            continue;
        }
        if let Some(i) = current {
            let ids: Vec<u32> = t.split_whitespace().map_while(|w| w.parse().ok()).collect();
            if ids.is_empty() {
                current = None;
            } else {
                out[i].1.extend(ids);
            }
        }
    }
    for (_, ids) in &mut out {
        ids.sort_unstable();
        ids.dedup();
    }
    out
}

/// Parse `rocm-smi … --json` into GPUs with identities (`host` is needed where only a PCI
/// address identifies a GPU). With `pid_gpus` (the text of `--showpidgpus`), the processes of
/// `--showpids` become processes on their GPUs; without it the process list is unknown.
pub fn parse(
    json: &str,
    pid_gpus: Option<&str>,
    host: Option<&str>,
) -> Result<Snapshot, SourceError> {
    let root = first_json(json, WHAT)?;
    let root = root
        .as_object()
        .ok_or_else(|| parse_error("the output is not a JSON object of cards"))?;
    let system = root
        .get("system")
        .and_then(Value::as_object)
        .map(fields)
        .unwrap_or_default();
    let driver = first(&system, &["driver version"]).and_then(known_string);

    let mut cards: Vec<(u32, &Map<String, Value>)> = root
        .iter()
        .filter_map(|(k, v)| {
            let index = k.strip_prefix("card")?.parse().ok()?;
            Some((index, v.as_object()?))
        })
        .collect();
    cards.sort_by_key(|(i, _)| *i);

    let mut devices = Vec::new();
    for (index, card) in cards {
        let f = fields(card);
        let model = ["card series", "device name", "card model", "card sku"]
            .iter()
            .find_map(|k| f.get(*k).and_then(|v| product_name(v)));
        let reading = GpuReading {
            model,
            memory_mib: mib(&f, "vram total memory (b)", "vram total memory (mib)")
                .map(|m| m.round() as u64),
            serial: first(&f, &["serial number"]).and_then(usable_id),
            pci_bus_id: first(&f, &["pci bus"]).and_then(usable_id),
            driver_version: driver.clone(),
            card_vendor: first(&f, &["card vendor"]).and_then(known_string),
            util_pct: first_number(&f, &["gpu use (%)", "dcu use (%)"]),
            mem_used_mib: mib(
                &f,
                "vram total used memory (b)",
                "vram total used memory (mib)",
            ),
            power_w: first_number(
                &f,
                &[
                    "average graphics package power (w)",
                    "current socket graphics package power (w)",
                ],
            ),
            ..Default::default()
        };
        devices.push(AmdDevice {
            index,
            unique_id: first(&f, &["unique id"]).and_then(usable_id),
            partition_id: None,
            partition_mode: first(&f, &["compute partition"]).and_then(known_string),
            reading,
        });
    }
    let (gpus, by_index) = identify(devices, host, "rocm-smi");

    let Some(pid_gpus) = pid_gpus else {
        return Ok(Snapshot {
            gpus,
            processes: Vec::new(),
            processes_failed: true,
        });
    };
    let entries: HashMap<u32, PidEntry> = root
        .get("system")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            let pid = k.strip_prefix("PID")?.trim().parse().ok()?;
            Some((pid, pid_entry(v.as_str()?)))
        })
        .collect();
    let mut processes = Vec::new();
    for (pid, indices) in parse_pid_gpus(pid_gpus) {
        let entry = entries.get(&pid);
        for i in &indices {
            let Some(uuid) = by_index.get(i) else {
                continue;
            };
            processes.push(ProcessReading {
                gpu_uuid: uuid.clone(),
                pid,
                name: entry.and_then(|e| e.name.clone()),
                // KFD processes are compute processes.
                process_type: Some("C".into()),
                // rocm-smi gives a process's VRAM over all its GPUs: per GPU only with one.
                used_memory_mib: entry
                    .and_then(|e| e.vram_bytes)
                    .filter(|_| indices.len() == 1)
                    .map(|b| (b / BYTES_PER_MIB).round() as u64),
            });
        }
    }
    Ok(Snapshot {
        gpus,
        processes,
        processes_failed: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_before_the_json_and_unknowns() {
        let text = "WARNING: Unlocked monitor_devices lock; it should have already been unlocked.\n\
            {\"card0\": {\"Serial Number\": \"N/A\", \"Unique ID\": \"N/A\", \"PCI Bus\": \"0000:C9:00.0\", \
            \"GPU use (%)\": \"N/A\", \"Card series\": \"0x740c\", \"Card SKU\": \"D65209\", \
            \"VRAM Total Memory (B)\": \"68702699520\"}}\ntrailing text";
        let snap = parse(text, None, Some("h1")).unwrap();
        assert_eq!(snap.gpus.len(), 1);
        let g = &snap.gpus[0];
        assert_eq!(g.uuid, "AMD-PCI-h1-0000:c9:00.0");
        assert_eq!(g.model.as_deref(), Some("D65209"));
        assert_eq!(g.memory_mib, Some(65520));
        assert_eq!(
            (g.util_pct, g.power_w, g.serial.as_deref()),
            (None, None, None)
        );
        assert!(snap.processes_failed, "no --showpidgpus: processes unknown");
        assert!(parse("", None, None).is_err());
        assert!(parse("[1, 2]", None, None).is_err());
    }

    #[test]
    fn pid_gpus_on_one_line_or_many_and_processes_on_their_gpus() {
        let text = "==== GPUs Indexed by PID ====\nPID 78912 is using 0 DRM device(s)\n\
                    PID 79301 is using 1 DRM device(s):\n1 \nPID 1949829 is using 2 DRM device(s):\n\
                    0 \n1 \nPID 10678 is using 2 DRM device(s):\n0 1\n=====\n";
        assert_eq!(
            parse_pid_gpus(text),
            vec![
                (78912, vec![]),
                (79301, vec![1]),
                (1949829, vec![0, 1]),
                (10678, vec![0, 1])
            ]
        );
        let json = r#"{"card0": {"Unique ID": "0xa"}, "card1": {"Unique ID": "0xb"},
            "system": {"PID79301": "python, 1, 1048576, 0, 0", "PID1949829": "a, b, 2, 1048576, 0, 0"}}"#;
        let snap = parse(json, Some(text), None).unwrap();
        let got: Vec<(&str, u32, Option<&str>, Option<u64>)> = snap
            .processes
            .iter()
            .map(|p| {
                (
                    p.gpu_uuid.as_str(),
                    p.pid,
                    p.name.as_deref(),
                    p.used_memory_mib,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("AMD-UID-b", 79301, Some("python"), Some(1)),
                ("AMD-UID-a", 1949829, Some("a, b"), None),
                ("AMD-UID-b", 1949829, Some("a, b"), None),
                ("AMD-UID-a", 10678, None, None),
                ("AMD-UID-b", 10678, None, None),
            ]
        );
        assert!(!snap.processes_failed);
    }
}
