//! Parsing Intel Gaudi's `hl-smi`: the CSV query (`hl-smi -Q … -f csv,nounits`) and the table
//! plain `hl-smi` prints, which is also the only output that lists processes.
//!
//! The CSV names each Gaudi by serial and UUID; the table names it by PCI address only, so a
//! Gaudi read through the table alone is `HL-PCI-<host>-<bus>` (`gpuledger_model::accel`). The
//! reader uses the CSV where it works and the table for processes; the table alone where the
//! CSV query does not work.
//!
//! The table, as hl-smi 1.15 to 1.22 print it:
//!
//! ```text
//! | AIP  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncor-Events|
//! | Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | AIP-Util  Compute M. |
//! |===============================+======================+======================|
//! |   0  HL-225              N/A  | 0000:9a:00.0     N/A |                   0  |
//! | N/A   22C   N/A  96W /  600W  |   768MiB /  98304MiB |     0%            0% |
//! |-------------------------------+----------------------+----------------------+
//! | Compute Processes:                                               AIP Memory |
//! |  AIP       PID   Type   Process name                             Usage      |
//! |=============================================================================|
//! |   7       107684     C   ray::_RayTrainW                         16770MiB    |
//! +=============================================================================+
//! ```
//!
//! Each device is two rows, read cell by cell between `|`s, not by column position: a 6-digit
//! memory total pushes the cell's closing `|` to the right. `AIP-Util` is the activity;
//! `Compute M.` is a memory-use percentage in these versions (98 % with 96,565 of 98,304 MiB in
//! use), not a compute mode, and is not read. Lines may carry hl-smi's log prefix
//! (`[2024-11-06 04:40:27.206] [hlsmi] [info] `); where one output holds several tables (a log of
//! `hl-smi -l`), the last complete one counts. A table cut off before its process section, or in
//! the middle of it, has an unknown process list.

use gpuledger_model::accel::gaudi_uuid;

use super::smi_csv::{first, first_number, parse_error, rows};
use super::{
    known_string, number, product_name, sanitize, usable_id, GpuReading, ProcessReading, Snapshot,
    SourceError,
};

/// The fields the agent asks `hl-smi -Q` for (Habana's documented query names).
pub const QUERY_FIELDS: &str = "index,name,bus_id,serial,uuid,driver_version,utilization.aip,\
                                memory.total,memory.used,power.draw";
/// The arguments of the CSV read.
pub const QUERY_ARGS: &[&str] = &["-Q", QUERY_FIELDS, "-f", "csv,nounits"];

const CSV_WHAT: &str = "hl-smi -Q";
const TABLE_WHAT: &str = "hl-smi";

/// The Gaudis of `hl-smi -Q … -f csv` (a header line, units allowed). A row without a usable
/// serial, UUID or PCI address (or with only a PCI address and no host name) is left out.
pub fn parse_csv(text: &str, host: Option<&str>) -> Result<Vec<GpuReading>, SourceError> {
    let rows = rows(text, CSV_WHAT)?;
    if let Some(row) = rows.first() {
        if !["bus_id", "serial", "uuid"]
            .iter()
            .any(|k| row.contains_key(*k))
        {
            return Err(parse_error(
                CSV_WHAT,
                "no bus_id, serial or uuid column; this is not `hl-smi -Q` CSV",
            ));
        }
    }
    let mut out = Vec::new();
    for row in rows {
        let serial = first(&row, &["serial"]).and_then(usable_id);
        let uuid = first(&row, &["uuid"]).and_then(usable_id);
        let bus = first(&row, &["bus_id"]).and_then(usable_id);
        let Some(id) = gaudi_uuid(serial.as_deref(), uuid.as_deref(), host, bus.as_deref()) else {
            tracing::warn!(
                "hl-smi -Q listed a Gaudi without a usable serial, UUID or PCI address; skipping it"
            );
            continue;
        };
        let mut g = GpuReading {
            uuid: id,
            model: first(&row, &["name"]).and_then(product_name),
            memory_mib: first_number(&row, &["memory.total"])
                .filter(|v| *v >= 0.0)
                .map(|v| v.round() as u64),
            serial,
            pci_bus_id: bus,
            driver_version: first(&row, &["driver_version"]).and_then(known_string),
            util_pct: first_number(&row, &["utilization.aip"]),
            mem_used_mib: first_number(&row, &["memory.used"]),
            power_w: first_number(&row, &["power.draw"]),
            ..Default::default()
        };
        sanitize(&mut g);
        out.push(g);
    }
    Ok(out)
}

/// One device of the table.
#[derive(Debug, Clone, Default, PartialEq)]
struct TableDevice {
    aip: u32,
    name: Option<String>,
    bus: Option<String>,
    power_w: Option<f64>,
    mem_used_mib: Option<f64>,
    memory_mib: Option<f64>,
    util_pct: Option<f64>,
    /// Both rows were read.
    complete: bool,
}

/// One row of the process section that names a process.
#[derive(Debug, Clone, PartialEq)]
struct TableProcess {
    aip: u32,
    pid: u32,
    kind: Option<String>,
    name: Option<String>,
    used_mib: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum State {
    Preamble,
    DeviceHeader,
    Devices,
    ProcessHeader,
    Processes,
    Done,
}

/// One table.
#[derive(Debug)]
struct Table {
    driver: Option<String>,
    devices: Vec<TableDevice>,
    /// `None` when the table has no complete process section.
    processes: Option<Vec<TableProcess>>,
    state: State,
    rows: Vec<TableProcess>,
}

impl Table {
    fn new() -> Table {
        Table {
            driver: None,
            devices: Vec::new(),
            processes: None,
            state: State::Preamble,
            rows: Vec::new(),
        }
    }

    /// Complete: every device has both rows, and the device section was read to its end (or
    /// holds at least one device).
    fn complete(&self) -> bool {
        self.state >= State::Devices
            && self.devices.iter().all(|d| d.complete)
            && (!self.devices.is_empty() || self.state >= State::ProcessHeader)
    }
}

/// Without hl-smi's log prefix: `[2024-11-06 04:40:27.206] [hlsmi] [info] | …` → `| …`.
fn strip_log_prefix(line: &str) -> &str {
    let mut l = line;
    while let Some(rest) = l.strip_prefix('[') {
        match rest.find(']') {
            Some(i) => l = rest[i + 1..].trim_start_matches(' '),
            None => break,
        }
    }
    l
}

/// The cells of a table row, between `|`s (the closing one may be missing).
fn cells(line: &str) -> Option<Vec<&str>> {
    let rest = line.strip_prefix('|')?;
    let mut c: Vec<&str> = rest.split('|').collect();
    if c.last().is_some_and(|l| l.trim().is_empty()) && c.len() > 1 {
        c.pop();
    }
    Some(c)
}

/// A rule between rows: only `-`, `=`, `+` and spaces.
fn is_rule(cells: &[&str]) -> bool {
    cells
        .iter()
        .all(|c| c.chars().all(|ch| matches!(ch, '-' | '=' | '+' | ' ')))
}

fn device_first_row(cells: &[&str]) -> Option<TableDevice> {
    let words: Vec<&str> = cells.first()?.split_whitespace().collect();
    let aip = words.first()?.parse().ok()?;
    let name = match words.len() {
        0 | 1 => None,
        2 => product_name(words[1]),
        n => product_name(&words[1..n - 1].join(" ")),
    };
    Some(TableDevice {
        aip,
        name,
        bus: cells
            .get(1)
            .and_then(|c| c.split_whitespace().next())
            .and_then(usable_id),
        ..Default::default()
    })
}

/// `96W /  600W` → (`96W`, `600W`). The `/` between the two is a word of its own or glued to
/// both (`96W/600W`); the `/` of an `N/A` is not it.
fn used_and_total(cell: &str) -> Option<(&str, &str)> {
    let words: Vec<&str> = cell.split_whitespace().collect();
    if let Some(i) = words.iter().position(|w| *w == "/") {
        return Some((words.get(i.checked_sub(1)?)?, words.get(i + 1)?));
    }
    words
        .iter()
        .rev()
        .find(|w| w.contains('/') && !w.eq_ignore_ascii_case("n/a"))
        .and_then(|w| w.split_once('/'))
}

fn device_second_row(d: &mut TableDevice, cells: &[&str]) {
    // `N/A   22C   N/A  96W /  600W`: fan, temperature, performance state, power used / cap.
    d.power_w = cells
        .first()
        .and_then(|c| used_and_total(c))
        .and_then(|(used, _)| number(used));
    if let Some((used, total)) = cells.get(1).and_then(|c| used_and_total(c)) {
        d.mem_used_mib = number(used);
        d.memory_mib = number(total);
    }
    d.util_pct = cells
        .get(2)
        .and_then(|c| c.split_whitespace().next())
        .and_then(number);
    d.complete = true;
}

/// `|   7       107684     C   ray::_RayTrainW      16770MiB    |` (the closing `|` may be
/// missing); `None` for a row without a process (`N/A` PID).
fn process_row(line: &str) -> Option<TableProcess> {
    let inner = line.strip_prefix('|')?;
    let inner = inner.trim_end().strip_suffix('|').unwrap_or(inner);
    let words: Vec<&str> = inner.split_whitespace().collect();
    if words.len() < 4 {
        return None;
    }
    let aip = words[0].parse().ok()?;
    let pid = words[1].parse().ok().filter(|p| *p > 0)?;
    let last = words[words.len() - 1];
    let is_usage = |w: &str| {
        let lower = w.to_ascii_lowercase();
        lower.ends_with("mib") || lower == "n/a"
    };
    let (name_words, used_mib) = if words.len() >= 5 && is_usage(last) {
        (
            &words[3..words.len() - 1],
            number(last).filter(|v| *v >= 0.0).map(|v| v.round() as u64),
        )
    } else {
        (&words[3..], None)
    };
    Some(TableProcess {
        aip,
        pid,
        kind: known_string(words[2]),
        name: known_string(&name_words.join(" ")),
        used_mib,
    })
}

/// Every table in `text`, in order.
fn tables(text: &str) -> Vec<Table> {
    let mut out = Vec::new();
    let mut t = Table::new();
    for raw in text.lines() {
        let line = strip_log_prefix(raw).trim_end();
        let header = line.contains("AIP") && line.contains("Name") && line.contains("Bus-Id");
        let starts_table = line.contains("HL-SMI Version:") || header;
        if starts_table && t.state >= State::Devices {
            out.push(std::mem::replace(&mut t, Table::new()));
        }
        match t.state {
            State::Preamble | State::DeviceHeader => {
                if header {
                    t.state = State::DeviceHeader;
                } else if t.state == State::DeviceHeader && line.starts_with("|=") {
                    t.state = State::Devices;
                } else if let Some(c) = cells(line) {
                    if let Some(v) = c[0].trim().strip_prefix("Driver Version:") {
                        t.driver = known_string(v);
                    }
                }
            }
            State::Devices => {
                if line.contains("Compute Processes") {
                    t.state = State::ProcessHeader;
                    continue;
                }
                if line.starts_with('+') {
                    t.state = State::Done;
                    continue;
                }
                let Some(c) = cells(line) else { continue };
                let awaiting = t.devices.last().is_some_and(|d| !d.complete);
                if is_rule(&c) {
                    continue;
                }
                if awaiting {
                    if let Some(d) = t.devices.last_mut() {
                        device_second_row(d, &c);
                    }
                } else if let Some(d) = device_first_row(&c) {
                    t.devices.push(d);
                }
            }
            State::ProcessHeader => {
                if line.starts_with("|=") {
                    t.state = State::Processes;
                }
            }
            State::Processes => {
                if line.starts_with('+') {
                    t.processes = Some(std::mem::take(&mut t.rows));
                    t.state = State::Done;
                } else if let Some(p) = process_row(line) {
                    t.rows.push(p);
                }
            }
            State::Done => {}
        }
    }
    if t.state > State::Preamble {
        out.push(t);
    }
    out
}

/// The last complete table of `text`.
fn last_table(text: &str) -> Result<Table, SourceError> {
    let mut all = tables(text);
    if all.is_empty() {
        return Err(parse_error(
            TABLE_WHAT,
            "no device table (no `AIP  Name … Bus-Id` header)",
        ));
    }
    match all.iter().rposition(Table::complete) {
        Some(i) => Ok(all.swap_remove(i)),
        None => Err(parse_error(TABLE_WHAT, "the device table is cut off")),
    }
}

fn bus_key(bus: &str) -> String {
    // `0000:9a:00.0` and `00000000:9A:00.0` are the same device.
    let lower = bus.trim().to_ascii_lowercase();
    let parts: Vec<&str> = lower.rsplitn(3, ':').collect();
    match parts.as_slice() {
        [func, dev, _domain] => format!("{dev}:{func}"),
        _ => lower,
    }
}

/// Plain `hl-smi` output as GPUs (named by PCI address on `host`) and processes.
pub fn parse_table(text: &str, host: Option<&str>) -> Result<Snapshot, SourceError> {
    let t = last_table(text)?;
    let mut gpus = Vec::new();
    let mut by_aip = Vec::new();
    for d in &t.devices {
        let Some(uuid) = gaudi_uuid(None, None, host, d.bus.as_deref()) else {
            tracing::warn!(
                aip = d.aip,
                "a Gaudi in hl-smi's table has no PCI address or the host name is unknown; \
                 skipping it"
            );
            continue;
        };
        by_aip.push((d.aip, uuid.clone()));
        let mut g = GpuReading {
            uuid,
            model: d.name.clone(),
            memory_mib: d.memory_mib.filter(|v| *v >= 0.0).map(|v| v.round() as u64),
            pci_bus_id: d.bus.clone(),
            driver_version: t.driver.clone(),
            util_pct: d.util_pct,
            mem_used_mib: d.mem_used_mib,
            power_w: d.power_w,
            ..Default::default()
        };
        sanitize(&mut g);
        gpus.push(g);
    }
    let processes = t.processes.as_ref().map(|rows| {
        rows.iter()
            .filter_map(|p| {
                let uuid = by_aip.iter().find(|(a, _)| *a == p.aip)?.1.clone();
                Some(reading(p, uuid))
            })
            .collect::<Vec<_>>()
    });
    Ok(Snapshot {
        gpus,
        processes_failed: processes.is_none(),
        processes: processes.unwrap_or_default(),
    })
}

fn reading(p: &TableProcess, gpu_uuid: String) -> ProcessReading {
    ProcessReading {
        gpu_uuid,
        pid: p.pid,
        name: p.name.clone(),
        process_type: p.kind.clone(),
        used_memory_mib: p.used_mib,
    }
}

/// The processes of plain `hl-smi` output on `gpus` (read from the CSV), matched by PCI
/// address; `None` when the table has no complete process section.
pub fn processes_from_table(gpus: &[GpuReading], table: &str) -> Option<Vec<ProcessReading>> {
    let t = last_table(table).ok()?;
    let rows = t.processes.as_ref()?;
    let mut out = Vec::new();
    for p in rows {
        let Some(bus) = t
            .devices
            .iter()
            .find(|d| d.aip == p.aip)
            .and_then(|d| d.bus.as_deref())
        else {
            continue;
        };
        let key = bus_key(bus);
        let Some(g) = gpus
            .iter()
            .find(|g| g.pci_bus_id.as_deref().is_some_and(|b| bus_key(b) == key))
        else {
            continue;
        };
        out.push(reading(p, g.uuid.clone()));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_with_units_and_header_names_gaudis_by_serial() {
        // The header as hl-smi prints it (the shape published with hl-1.18.0 output); serial
        // and bus made up for this test.
        let text = "index, name, bus_id, serial, uuid, driver_version, utilization.aip [%], \
                    memory.total [MiB], memory.used [MiB], power.draw [W]\n\
                    0, HL-225, 0000:19:00.0, AN12345678, 01P0-HL2080A0-15-TNF3A7-02-07-09, 1.18.0-ee698fb, 15, 98304, 512, 103\n\
                    1, HL-225, 0000:1a:00.0, N/A, N/A, 1.18.0-ee698fb, N/A, 98304 MiB, 768 MiB, N/A\n";
        let g = parse_csv(text, Some("gaudi-1")).unwrap();
        assert_eq!(g[0].uuid, "HL-SN-AN12345678");
        assert_eq!(g[0].model.as_deref(), Some("HL-225"));
        assert_eq!((g[0].memory_mib, g[0].util_pct), (Some(98304), Some(15.0)));
        assert_eq!(
            (g[0].mem_used_mib, g[0].power_w),
            (Some(512.0), Some(103.0))
        );
        assert_eq!(g[1].uuid, "HL-PCI-gaudi-1-0000:1a:00.0");
        assert_eq!(
            (g[1].util_pct, g[1].power_w, g[1].serial.as_deref()),
            (None, None, None)
        );
        assert!(parse_csv("name, memory.total\nHL-225, 98304\n", None).is_err());
        assert!(parse_csv("", None).unwrap_or_default().is_empty());
    }

    #[test]
    fn process_rows_with_and_without_closing_bar_and_spaces_in_names() {
        let p = process_row(
            "|   7       107684     C   ray::_RayTrainW                         16770MiB    ",
        )
        .unwrap();
        assert_eq!((p.aip, p.pid, p.used_mib), (7, 107684, Some(16770)));
        assert_eq!(p.name.as_deref(), Some("ray::_RayTrainW"));
        let p = process_row("|   0   42   C   python3 train.py   N/A   |").unwrap();
        assert_eq!(
            (p.name.as_deref(), p.used_mib),
            (Some("python3 train.py"), None)
        );
        assert_eq!(
            process_row("|   0        N/A   N/A    N/A      N/A        |"),
            None
        );
        assert_eq!(bus_key("00000000:9A:00.0"), bus_key("0000:9a:00.0"));
        assert_eq!(
            used_and_total(" N/A   22C   N/A  96W /  600W "),
            Some(("96W", "600W"))
        );
        assert_eq!(
            used_and_total(" N/A  N/A  N/A  96W/600W "),
            Some(("96W", "600W"))
        );
        assert_eq!(
            used_and_total(" N/A   N/A   N/A   N/A / 600W "),
            Some(("N/A", "600W"))
        );
        assert_eq!(used_and_total(" N/A   22C   N/A "), None);
    }

    #[test]
    fn a_table_cut_in_the_device_section_falls_back_to_the_previous_one() {
        let one = "| AIP  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncor-Events|\n\
                   |===============================+======================+======================|\n\
                   |   0  HL-225              N/A  | 0000:9a:00.0     N/A |                   0  |\n\
                   | N/A   22C   N/A  96W /  600W  |   768MiB /  98304MiB |    40%            0% |\n\
                   |-------------------------------+----------------------+----------------------+\n";
        let cut = "| AIP  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncor-Events|\n\
                   |===============================+======================+======================|\n\
                   |   0  HL-225              N/A  | 0000:9a:00.0     N/A |                   0  |\n";
        let snap = parse_table(&format!("{one}{cut}"), Some("h")).unwrap();
        assert_eq!(snap.gpus.len(), 1);
        assert_eq!(snap.gpus[0].util_pct, Some(40.0));
        assert!(snap.processes_failed, "no process section: unknown");
        assert!(parse_table(cut, Some("h")).is_err());
        assert!(parse_table("garbage\n", Some("h")).is_err());
    }
}
