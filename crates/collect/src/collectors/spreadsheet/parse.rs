//! Reading an inventory sheet (CSV or XLSX) row by row into GPU records (a row with a UUID)
//! and host counts (a row with a host and a GPU count). A row that cannot be used is named with
//! its column, value and reason and left out; the other rows are kept.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, NaiveDate, Utc};
use gpuledger_model::{Cloud, HostGpus, Observation, Provenance, PushGpu};

use crate::CollectError;

/// The largest sheet read, in bytes.
pub const MAX_BYTES: usize = 32 * 1024 * 1024;
/// The most rows read from one sheet (a larger one is refused whole).
pub const MAX_ROWS: usize = 100_000;
/// The most characters of a cell used as text: the push API's bound on a text field or label.
const MAX_TEXT: usize = 256;
/// The most GPUs one host row may count.
const MAX_COUNT: i64 = 1024;
/// How many rows from the top are searched for the header row (title rows may come first).
const HEADER_SEARCH_ROWS: usize = 20;

/// What a column of the sheet says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    Host,
    Model,
    Count,
    Uuid,
    Serial,
    Cluster,
    Team,
    Env,
    PurchaseDate,
    PurchasePriceUsd,
    Notes,
    Cloud,
    InstanceType,
}

impl Field {
    pub const ALL: [Field; 13] = [
        Field::Host,
        Field::Model,
        Field::Count,
        Field::Uuid,
        Field::Serial,
        Field::Cluster,
        Field::Team,
        Field::Env,
        Field::PurchaseDate,
        Field::PurchasePriceUsd,
        Field::Notes,
        Field::Cloud,
        Field::InstanceType,
    ];

    /// The field's name in the `columns` mapping.
    pub fn name(self) -> &'static str {
        match self {
            Field::Host => "host",
            Field::Model => "model",
            Field::Count => "count",
            Field::Uuid => "uuid",
            Field::Serial => "serial",
            Field::Cluster => "cluster",
            Field::Team => "team",
            Field::Env => "env",
            Field::PurchaseDate => "purchase_date",
            Field::PurchasePriceUsd => "purchase_price_usd",
            Field::Notes => "notes",
            Field::Cloud => "cloud",
            Field::InstanceType => "instance_type",
        }
    }

    /// A field by its name (`location` is another name of `cluster`).
    pub fn parse(name: &str) -> Option<Field> {
        let name = name.trim().to_ascii_lowercase();
        if name == "location" {
            return Some(Field::Cluster);
        }
        Field::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The header names read as this field when the mapping does not name it, compared without
    /// case, spaces or punctuation.
    pub fn default_headers(self) -> &'static [&'static str] {
        match self {
            Field::Host => &["host", "hostname", "server", "node", "machine"],
            Field::Model => &["model", "gpu model", "gpu", "gpu type"],
            Field::Count => &[
                "count",
                "gpus",
                "gpu count",
                "number of gpus",
                "num gpus",
                "qty",
                "quantity",
            ],
            Field::Uuid => &["uuid", "gpu uuid"],
            Field::Serial => &["serial", "serial number", "gpu serial", "sn"],
            Field::Cluster => &["cluster", "location", "site", "datacenter", "dc"],
            Field::Team => &["team", "owner", "owning team"],
            Field::Env => &["env", "environment"],
            Field::PurchaseDate => &["purchase date", "purchased", "bought", "acquired"],
            Field::PurchasePriceUsd => &[
                "purchase price usd",
                "purchase price",
                "price usd",
                "price",
                "unit price",
            ],
            Field::Notes => &["notes", "note", "comment", "comments", "remarks"],
            Field::Cloud => &["cloud", "provider"],
            Field::InstanceType => &["instance type"],
        }
    }

    /// The field names, for messages.
    pub fn names() -> String {
        Field::ALL.map(Field::name).join(", ")
    }
}

/// A header compared without case, spaces or punctuation: `GPU UUID`, `gpu_uuid` and
/// `gpu-uuid` are one header.
fn norm(header: &str) -> String {
    header
        .chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

/// Which sheet header is read as which field; a field it does not name is found by its
/// [`Field::default_headers`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mapping {
    /// Header as written in the sheet → field.
    pub columns: BTreeMap<String, Field>,
}

impl Mapping {
    /// A mapping from `header → field name` pairs; names an unknown field, an empty header
    /// and a field given twice.
    pub fn from_pairs<I, H, F>(pairs: I) -> Result<Mapping, String>
    where
        I: IntoIterator<Item = (H, F)>,
        H: AsRef<str>,
        F: AsRef<str>,
    {
        let mut columns = BTreeMap::new();
        let mut by_field: BTreeMap<Field, String> = BTreeMap::new();
        for (header, field) in pairs {
            let (header, field) = (header.as_ref().trim(), field.as_ref());
            if norm(header).is_empty() {
                return Err(format!(
                    "`{header}` is not a header: give the column's name as the sheet's header \
                     row writes it"
                ));
            }
            let f = Field::parse(field).ok_or_else(|| {
                format!(
                    "column `{header}`: `{field}` is not a field; fields: {}",
                    Field::names()
                )
            })?;
            if let Some(other) = by_field.insert(f, header.to_string()) {
                return Err(format!(
                    "columns `{other}` and `{header}` are both mapped to {}; map one column to \
                     each field",
                    f.name()
                ));
            }
            columns.insert(header.to_string(), f);
        }
        Ok(Mapping { columns })
    }
}

/// One cell as read.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Empty,
    Text(String),
    Number(f64),
    Date(NaiveDate),
    /// A cell that cannot be read, and why (an `#N/A` formula result, text that is not UTF-8).
    Bad(String),
}

impl Cell {
    fn text(s: &str) -> Cell {
        let s = s.trim();
        if s.is_empty() {
            Cell::Empty
        } else {
            Cell::Text(s.to_string())
        }
    }

    /// The value as a problem shows it.
    fn shown(&self) -> String {
        match self {
            Cell::Empty => String::new(),
            Cell::Text(s) => clip(s, 80),
            Cell::Number(n) => number_text(*n),
            Cell::Date(d) => d.to_string(),
            Cell::Bad(_) => "(unreadable)".into(),
        }
    }
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(n).collect();
        out.push('…');
        out
    }
}

/// A number as a sheet shows it: `8` for 8.0.
fn number_text(n: f64) -> String {
    if n.is_finite() && n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

/// The rows of one sheet, each with its row number as the spreadsheet shows it (from 1).
#[derive(Debug, Default)]
pub struct Table {
    pub rows: Vec<(usize, Vec<Cell>)>,
}

/// What the bytes are: an XLSX workbook (a ZIP file), or CSV text.
fn is_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04")
}

/// Read a sheet's cells: XLSX when the bytes are a ZIP file (the sheet named `sheet`, else the
/// first), otherwise CSV with `delimiter`.
pub fn read_table(bytes: &[u8], sheet: Option<&str>, delimiter: u8) -> Result<Table, CollectError> {
    if bytes.len() > MAX_BYTES {
        return Err(CollectError::Data(format!(
            "the sheet is {} bytes, over the {MAX_BYTES} read",
            bytes.len()
        )));
    }
    if bytes.starts_with(&[0xD0, 0xCF, 0x11, 0xE0]) {
        return Err(CollectError::Data(
            "an Excel 97-2003 workbook (.xls) is not read: save it as XLSX or CSV".into(),
        ));
    }
    if is_zip(bytes) {
        // The workbook reader is a library reading whatever the file holds: a panic in it on
        // a damaged file is that file's problem, not the server's.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_xlsx(bytes, sheet)))
            .unwrap_or_else(|_| {
                Err(CollectError::Data(
                    "not a readable XLSX workbook: the reader failed on its content".into(),
                ))
            })
    } else {
        // A CSV file is one sheet: a `sheet` name is for workbooks only.
        read_csv(bytes, delimiter)
    }
}

fn read_csv(bytes: &[u8], delimiter: u8) -> Result<Table, CollectError> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(delimiter)
        .from_reader(bytes);
    let mut table = Table::default();
    // A row's number is the one a spreadsheet shows when it opens the file: its first line,
    // less the line breaks inside quoted cells of the rows before it (blank lines are rows).
    let mut breaks_before = 0usize;
    for (i, record) in reader.byte_records().enumerate() {
        if i >= MAX_ROWS + HEADER_SEARCH_ROWS {
            return Err(CollectError::Data(format!(
                "more than {MAX_ROWS} rows: split the sheet"
            )));
        }
        let record = record.map_err(|e| {
            let line = e.position().map_or(0, |p| p.line() as usize);
            CollectError::Data(format!(
                "row {}: not readable as CSV: {e}",
                line.saturating_sub(breaks_before).max(i + 1)
            ))
        })?;
        let line = record.position().map_or(i + 1, |p| p.line() as usize);
        let row = line.saturating_sub(breaks_before).max(1);
        breaks_before += record
            .iter()
            .map(|f| f.iter().filter(|b| **b == b'\n').count())
            .sum::<usize>();
        let cells = record
            .iter()
            .map(|b| match std::str::from_utf8(b) {
                Ok(s) => Cell::text(s),
                Err(_) => Cell::Bad("is not UTF-8 text; save the sheet as CSV UTF-8".into()),
            })
            .collect();
        table.rows.push((row, cells));
    }
    Ok(table)
}

fn read_xlsx(bytes: &[u8], sheet: Option<&str>) -> Result<Table, CollectError> {
    use calamine::{Data, Reader, Xlsx};
    let mut book: Xlsx<_> = Xlsx::new(std::io::Cursor::new(bytes))
        .map_err(|e| CollectError::Data(format!("not a readable XLSX workbook: {e}")))?;
    let names = book.sheet_names();
    let name = match sheet {
        Some(want) => names
            .iter()
            .find(|n| n.trim().eq_ignore_ascii_case(want.trim()))
            .cloned()
            .ok_or_else(|| {
                CollectError::Data(format!(
                    "the workbook has no sheet `{want}`; its sheets: {}",
                    names.join(", ")
                ))
            })?,
        None => names
            .first()
            .cloned()
            .ok_or_else(|| CollectError::Data("the workbook has no sheet".into()))?,
    };
    let range = book
        .worksheet_range(&name)
        .map_err(|e| CollectError::Data(format!("sheet `{name}`: not readable: {e}")))?;
    if range.height() > MAX_ROWS + HEADER_SEARCH_ROWS {
        return Err(CollectError::Data(format!(
            "sheet `{name}` has more than {MAX_ROWS} rows: split it"
        )));
    }
    let first_row = range.start().map_or(0, |(r, _)| r as usize);
    let mut table = Table::default();
    for (i, row) in range.rows().enumerate() {
        let cells = row
            .iter()
            .map(|d| match d {
                Data::Empty => Cell::Empty,
                Data::String(s) => Cell::text(s),
                Data::Int(n) => Cell::Number(*n as f64),
                Data::Float(f) => Cell::Number(*f),
                Data::Bool(b) => Cell::Text(if *b { "TRUE" } else { "FALSE" }.into()),
                Data::DateTime(dt) if dt.is_datetime() => {
                    let (y, m, d, ..) = dt.to_ymd_hms_milli();
                    NaiveDate::from_ymd_opt(y.into(), m.into(), d.into())
                        .map(Cell::Date)
                        .unwrap_or_else(|| Cell::Bad("is not a valid date".into()))
                }
                Data::DateTime(dt) => Cell::Number(dt.as_f64()),
                Data::DateTimeIso(s) => iso_date(s).map_or_else(|| Cell::text(s), Cell::Date),
                Data::DurationIso(s) => Cell::text(s),
                Data::Error(e) => Cell::Bad(format!("holds the error {e}")),
            })
            .collect();
        table.rows.push((first_row + i + 1, cells));
    }
    Ok(table)
}

/// The date of `YYYY-MM-DD`, `YYYY/MM/DD`, or an ISO 8601 time that starts with a date.
fn iso_date(s: &str) -> Option<NaiveDate> {
    let s = s.trim();
    let day = match s.get(10..11) {
        Some("T" | " ") => &s[..10],
        _ => s,
    };
    NaiveDate::parse_from_str(day, "%Y-%m-%d")
        .or_else(|_| NaiveDate::parse_from_str(day, "%Y/%m/%d"))
        .ok()
}

/// A row that cannot be used: where, what and why.
#[derive(Debug, Clone, PartialEq)]
pub struct RowProblem {
    pub row: usize,
    /// The column's header as the sheet writes it (or the field's name when the sheet has no
    /// such column); `None` when the problem is the row as a whole.
    pub column: Option<String>,
    pub value: Option<String>,
    pub reason: String,
}

impl fmt::Display for RowProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "row {}", self.row)?;
        if let Some(c) = &self.column {
            write!(f, ", column {c}")?;
        }
        f.write_str(": ")?;
        match self.value.as_deref() {
            Some("") => write!(f, "empty: {}", self.reason),
            Some(v) => write!(f, "`{v}` {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

/// A GPU the sheet names by UUID, with its row.
#[derive(Debug, Clone, PartialEq)]
pub struct SheetGpu {
    pub row: usize,
    pub gpu: PushGpu,
}

/// A host the sheet counts GPUs on, with its row.
#[derive(Debug, Clone, PartialEq)]
pub struct SheetHost {
    pub row: usize,
    pub host: HostGpus,
}

/// What one sheet says, and the rows it could not use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    /// The file name its records carry as label `sheet`.
    pub file: String,
    /// The header row's number.
    pub header_row: usize,
    /// Each column read: its header and field, in sheet order.
    pub columns: Vec<(String, Field)>,
    /// Headers read as no field.
    pub ignored_columns: Vec<String>,
    /// Rows under the header that are not blank.
    pub rows: usize,
    pub gpus: Vec<SheetGpu>,
    pub hosts: Vec<SheetHost>,
    pub problems: Vec<RowProblem>,
    /// When the sheet was read: every record's `observed_at`.
    pub observed_at: DateTime<Utc>,
}

impl Inventory {
    /// What an authoritative sheet lists, as the observation that ends the presence of what it
    /// no longer lists; `None` when a row was left out (a broken row must not end its GPU) or
    /// nothing was read.
    pub fn listing(&self, source: &str) -> Option<Observation> {
        if !self.problems.is_empty() || (self.gpus.is_empty() && self.hosts.is_empty()) {
            return None;
        }
        Some(Observation::InventoryList {
            uuids: self.gpus.iter().map(|g| g.gpu.uuid.clone()).collect(),
            hosts: self.hosts.iter().map(|h| h.host.host.clone()).collect(),
            provenance: Provenance {
                source: source.to_string(),
                observed_at: self.observed_at,
                raw_key: Some(format!("{} (authoritative)", self.file)),
            },
        })
    }

    /// The records as observations of `source`.
    pub fn observations(&self, source: &str) -> Vec<Observation> {
        let prov = |row: usize| Provenance {
            source: source.to_string(),
            observed_at: self.observed_at,
            raw_key: Some(format!("{} row {row}", self.file)),
        };
        let mut out: Vec<Observation> = self
            .hosts
            .iter()
            .map(|h| Observation::HostGpuCount {
                gpus: h.host.clone(),
                provenance: prov(h.row),
            })
            .collect();
        out.extend(self.gpus.iter().map(|g| Observation::Gpu {
            gpu: g.gpu.clone(),
            provenance: prov(g.row),
        }));
        out
    }
}

/// How to read one sheet.
#[derive(Debug, Clone)]
pub struct ReadOptions<'a> {
    /// The file name its records carry as label `sheet`.
    pub file: &'a str,
    pub mapping: &'a Mapping,
    /// When the sheet was read: the records' `observed_at`; purchase dates after its day are
    /// refused.
    pub observed_at: DateTime<Utc>,
}

/// Read a sheet's rows into GPUs and host counts. The error is for a sheet that cannot be
/// read at all (no header row, a mapped column missing); a bad row is a [`RowProblem`].
pub fn read_inventory(table: &Table, opts: &ReadOptions<'_>) -> Result<Inventory, CollectError> {
    let (header_at, header) = find_header(table, opts.mapping)?;
    let columns = assign_columns(header, opts.mapping, table.rows[header_at].0)?;
    let mut inv = Inventory {
        file: opts.file.to_string(),
        header_row: table.rows[header_at].0,
        observed_at: opts.observed_at,
        columns: columns
            .iter()
            .filter_map(|(i, f)| f.map(|f| (header_text(&header[*i]), f)))
            .collect(),
        ignored_columns: columns
            .iter()
            .filter(|(i, f)| f.is_none() && header[*i] != Cell::Empty)
            .map(|(i, _)| header_text(&header[*i]))
            .collect(),
        ..Inventory::default()
    };
    let index: BTreeMap<Field, (usize, String)> = columns
        .iter()
        .filter_map(|(i, f)| f.map(|f| (f, (*i, header_text(&header[*i])))))
        .collect();
    let today = opts.observed_at.date_naive();
    let mut uuids: BTreeMap<String, usize> = BTreeMap::new();
    let mut hosts: BTreeMap<String, usize> = BTreeMap::new();
    for (row, cells) in &table.rows[header_at + 1..] {
        if cells.iter().all(|c| *c == Cell::Empty) {
            continue;
        }
        inv.rows += 1;
        let mut r = RowReader {
            row: *row,
            cells,
            index: &index,
            problems: Vec::new(),
        };
        let record = r.record(today, opts);
        let RowReader { mut problems, .. } = r;
        if let Some(record) = record.filter(|_| problems.is_empty()) {
            match record {
                Record::Gpu(gpu) => match uuids.get(&gpu.uuid) {
                    Some(first) => problems.push(RowProblem {
                        row: *row,
                        column: Some(column_name(&index, Field::Uuid)),
                        value: Some(gpu.uuid.clone()),
                        reason: format!("is also on row {first} (the first is kept)"),
                    }),
                    None => {
                        uuids.insert(gpu.uuid.clone(), *row);
                        inv.gpus.push(SheetGpu { row: *row, gpu });
                    }
                },
                Record::Host(host) => match hosts.get(&host.host) {
                    Some(first) => problems.push(RowProblem {
                        row: *row,
                        column: Some(column_name(&index, Field::Host)),
                        value: Some(host.host.clone()),
                        reason: format!(
                            "is also counted on row {first} (the first is kept): give one row per \
                             host with its total GPU count"
                        ),
                    }),
                    None => {
                        hosts.insert(host.host.clone(), *row);
                        inv.hosts.push(SheetHost { row: *row, host });
                    }
                },
            }
        }
        inv.problems.extend(problems);
    }
    Ok(inv)
}

fn header_text(c: &Cell) -> String {
    match c {
        Cell::Text(s) => s.clone(),
        other => other.shown(),
    }
}

/// The name a problem gives a field's column: its header, else the field's name.
fn column_name(index: &BTreeMap<Field, (usize, String)>, f: Field) -> String {
    index
        .get(&f)
        .map_or_else(|| f.name().to_string(), |(_, h)| h.clone())
}

/// The field `header` is read as: the mapping's, else a default for a field the mapping does
/// not name.
fn field_of(header: &str, mapping: &Mapping) -> Option<Field> {
    let n = norm(header);
    if n.is_empty() {
        return None;
    }
    if let Some((_, f)) = mapping.columns.iter().find(|(h, _)| norm(h) == n) {
        return Some(*f);
    }
    let mapped: Vec<Field> = mapping.columns.values().copied().collect();
    Field::ALL
        .into_iter()
        .filter(|f| !mapped.contains(f))
        .find(|f| norm(f.name()) == n || f.default_headers().iter().any(|d| norm(d) == n))
}

/// The header row: the first of the top rows with a column read as `host` or `uuid`.
fn find_header<'t>(
    table: &'t Table,
    mapping: &Mapping,
) -> Result<(usize, &'t [Cell]), CollectError> {
    for (i, (_, cells)) in table.rows.iter().enumerate().take(HEADER_SEARCH_ROWS) {
        let names_one = cells.iter().any(|c| {
            matches!(c, Cell::Text(t)
                if matches!(field_of(t, mapping), Some(Field::Host | Field::Uuid)))
        });
        if names_one {
            return Ok((i, cells));
        }
    }
    if table
        .rows
        .iter()
        .all(|(_, c)| c.iter().all(|c| *c == Cell::Empty))
    {
        return Err(CollectError::Data("the sheet is empty".into()));
    }
    let looked: Vec<String> = [Field::Host, Field::Uuid]
        .iter()
        .flat_map(|f| {
            let mapped: Vec<String> = mapping
                .columns
                .iter()
                .filter(|(_, g)| *g == f)
                .map(|(h, _)| h.clone())
                .collect();
            if mapped.is_empty() {
                f.default_headers().iter().map(|s| s.to_string()).collect()
            } else {
                mapped
            }
        })
        .collect();
    Err(CollectError::Data(format!(
        "no header row: none of the first {HEADER_SEARCH_ROWS} rows names a host or uuid column \
         (looked for: {}); name yours in `columns` (or --mapping)",
        looked.join(", ")
    )))
}

/// Each header column's field; names two columns read as one field, and a mapped header that
/// the row lacks.
fn assign_columns(
    header: &[Cell],
    mapping: &Mapping,
    header_row: usize,
) -> Result<Vec<(usize, Option<Field>)>, CollectError> {
    let mut out = Vec::with_capacity(header.len());
    let mut seen: BTreeMap<Field, String> = BTreeMap::new();
    for (i, cell) in header.iter().enumerate() {
        let field = match cell {
            Cell::Text(t) => field_of(t, mapping),
            _ => None,
        };
        if let Some(f) = field {
            let text = header_text(cell);
            if let Some(first) = seen.insert(f, text.clone()) {
                return Err(CollectError::Data(format!(
                    "row {header_row}: columns `{first}` and `{text}` are both read as {}; map \
                     the one to use in `columns` (or --mapping)",
                    f.name()
                )));
            }
        }
        out.push((i, field));
    }
    let present: Vec<String> = header
        .iter()
        .filter_map(|c| match c {
            Cell::Text(t) => Some(norm(t)),
            _ => None,
        })
        .collect();
    for (h, f) in &mapping.columns {
        if !present.contains(&norm(h)) {
            return Err(CollectError::Data(format!(
                "column `{h}` (mapped to {}) is not in the header row (row {header_row})",
                f.name()
            )));
        }
    }
    Ok(out)
}

enum Record {
    Gpu(PushGpu),
    Host(HostGpus),
}

struct RowReader<'r> {
    row: usize,
    cells: &'r [Cell],
    index: &'r BTreeMap<Field, (usize, String)>,
    problems: Vec<RowProblem>,
}

impl RowReader<'_> {
    fn cell(&self, f: Field) -> &Cell {
        self.index
            .get(&f)
            .and_then(|(i, _)| self.cells.get(*i))
            .unwrap_or(&Cell::Empty)
    }

    fn problem(&mut self, f: Field, reason: impl Into<String>) {
        let cell = self.cell(f);
        let value = match cell {
            Cell::Bad(_) => None,
            c => Some(c.shown()),
        };
        self.problems.push(RowProblem {
            row: self.row,
            column: Some(column_name(self.index, f)),
            value,
            reason: reason.into(),
        });
    }

    /// A text field: `None` when empty.
    fn text(&mut self, f: Field) -> Option<String> {
        let value = match self.cell(f) {
            Cell::Empty => return None,
            Cell::Bad(why) => {
                let why = why.clone();
                self.problem(f, why);
                return None;
            }
            Cell::Text(s) => s.clone(),
            Cell::Number(n) => number_text(*n),
            Cell::Date(d) => d.to_string(),
        };
        let chars = value.chars().count();
        if chars > MAX_TEXT {
            self.problem(
                f,
                format!("is {chars} characters long; at most {MAX_TEXT} are kept"),
            );
            return None;
        }
        Some(value)
    }

    fn uuid(&mut self) -> Option<String> {
        let text = self.text(Field::Uuid)?;
        let upper = text.to_ascii_uppercase();
        let uuid = if upper.starts_with("GPU-") || upper.starts_with("MIG-") {
            format!("{}{}", &upper[..4], &text[4..])
        } else {
            self.problem(
                Field::Uuid,
                "is not a GPU UUID: it must start with `GPU-`, as `nvidia-smi -L` prints it",
            );
            return None;
        };
        if uuid.starts_with("MIG-") {
            self.problem(
                Field::Uuid,
                "is a MIG instance: the sheet lists physical GPUs; give the GPU's `GPU-…` UUID \
                 (its instances come from the sources that see them)",
            );
            return None;
        }
        if uuid.len() > 128 {
            self.problem(Field::Uuid, "is longer than 128 characters: not a GPU UUID");
            return None;
        }
        if let Some(bad) = uuid
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            self.problem(
                Field::Uuid,
                format!("contains `{bad}`: a GPU UUID has only letters, digits and `-`"),
            );
            return None;
        }
        Some(uuid)
    }

    fn count(&mut self) -> Option<i64> {
        let n = match self.cell(Field::Count) {
            Cell::Empty => return None,
            Cell::Number(n) => Some(*n),
            Cell::Text(s) => s.trim().parse::<f64>().ok(),
            Cell::Date(_) => None,
            Cell::Bad(why) => {
                let why = why.clone();
                self.problem(Field::Count, why);
                return None;
            }
        };
        match n {
            Some(n) if n.is_finite() && n.fract() == 0.0 => {
                let n = n as i64;
                if n < 1 {
                    self.problem(
                        Field::Count,
                        "is not a GPU count: it must be at least 1 (leave out a host without GPUs)",
                    );
                    None
                } else if n > MAX_COUNT {
                    self.problem(
                        Field::Count,
                        format!("is over {MAX_COUNT} GPUs: give one host's own count"),
                    );
                    None
                } else {
                    Some(n)
                }
            }
            _ => {
                self.problem(Field::Count, "is not a whole number");
                None
            }
        }
    }

    fn purchase_date(&mut self, today: NaiveDate) -> Option<NaiveDate> {
        let date = match self.cell(Field::PurchaseDate) {
            Cell::Empty => return None,
            Cell::Date(d) => Some(*d),
            Cell::Text(s) => iso_date(s),
            Cell::Number(_) => {
                self.problem(
                    Field::PurchaseDate,
                    "is a number, not a date: write it as YYYY-MM-DD or format the cell as a date",
                );
                return None;
            }
            Cell::Bad(why) => {
                let why = why.clone();
                self.problem(Field::PurchaseDate, why);
                return None;
            }
        };
        match date {
            Some(d) if d > today => {
                self.problem(Field::PurchaseDate, "is in the future");
                None
            }
            Some(d) => Some(d),
            None => {
                self.problem(
                    Field::PurchaseDate,
                    "is not a date: write it as YYYY-MM-DD (2024-03-01)",
                );
                None
            }
        }
    }

    fn price(&mut self) -> Option<f64> {
        let price = match self.cell(Field::PurchasePriceUsd) {
            Cell::Empty => return None,
            Cell::Number(n) => Some(*n),
            Cell::Text(s) => {
                let t = s.trim();
                let t = t.strip_prefix("USD").unwrap_or(t);
                let t = t.strip_suffix("USD").unwrap_or(t).trim();
                let t = t.strip_prefix('$').unwrap_or(t);
                let t: String = t
                    .chars()
                    .filter(|c| !matches!(c, ',' | ' ' | '_'))
                    .collect();
                t.parse::<f64>().ok()
            }
            Cell::Date(_) => None,
            Cell::Bad(why) => {
                let why = why.clone();
                self.problem(Field::PurchasePriceUsd, why);
                return None;
            }
        };
        match price {
            Some(p) if p.is_finite() && p > 0.0 && p < 1e9 => Some(p),
            Some(p) if p.is_finite() && p <= 0.0 => {
                self.problem(
                    Field::PurchasePriceUsd,
                    "is not a price: it must be more than 0 (leave it empty when unknown)",
                );
                None
            }
            _ => {
                self.problem(
                    Field::PurchasePriceUsd,
                    "is not an amount in USD (like 35040 or $35,040.00)",
                );
                None
            }
        }
    }

    fn cloud(&mut self) -> Option<Cloud> {
        let text = self.text(Field::Cloud)?;
        let lower = text.trim().to_ascii_lowercase();
        let cloud = match lower.as_str() {
            "on-prem" | "on prem" | "on-premises" | "on premises" | "onprem" => Some(Cloud::Onprem),
            "amazon" | "ec2" => Some(Cloud::Aws),
            "google" | "gce" => Some(Cloud::Gcp),
            "microsoft" => Some(Cloud::Azure),
            other => Cloud::parse(other),
        };
        if cloud.is_none() {
            self.problem(
                Field::Cloud,
                format!(
                    "is not a known cloud: one of {} (or leave it empty)",
                    Cloud::ALL.map(Cloud::as_str).join(", ")
                ),
            );
        }
        cloud
    }

    /// The row's record; the problems found are in `self.problems`.
    fn record(&mut self, today: NaiveDate, opts: &ReadOptions<'_>) -> Option<Record> {
        let uuid_given = *self.cell(Field::Uuid) != Cell::Empty;
        let uuid = self.uuid();
        let host = self.text(Field::Host);
        let model = self.text(Field::Model);
        let count = self.count();
        let serial = self.text(Field::Serial);
        let cluster = self.text(Field::Cluster);
        let instance_type = self.text(Field::InstanceType);
        let cloud = self.cloud();
        let date = self.purchase_date(today);
        let price = self.price();
        let mut labels = BTreeMap::new();
        for (f, key) in [
            (Field::Team, "team"),
            (Field::Env, "env"),
            (Field::Notes, "notes"),
        ] {
            if let Some(v) = self.text(f) {
                labels.insert(key.to_string(), v);
            }
        }
        if let Some(d) = date {
            labels.insert("purchase_date".into(), d.to_string());
        }
        if let Some(p) = price {
            labels.insert("purchase_price_usd".into(), number_text(p));
        }
        labels.insert("sheet".into(), clip(opts.file, MAX_TEXT - 1));
        labels.insert("sheet_row".into(), self.row.to_string());
        if uuid_given {
            let uuid = uuid?;
            if count.is_some_and(|c| c != 1) {
                self.problem(
                    Field::Count,
                    "is more than one GPU on a row with a UUID: a UUID names one GPU (leave count \
                     empty or 1)",
                );
            }
            let Some(model) = model else {
                self.problem(Field::Model, "a row with a UUID needs the GPU's model");
                return None;
            };
            return Some(Record::Gpu(PushGpu {
                uuid,
                model,
                memory_mib: None,
                host,
                cluster,
                cloud,
                region: None,
                instance_type,
                account: None,
                serial,
                pci_bus_id: None,
                mig_parent_uuid: None,
                mig_profile: None,
                labels,
                observed_at: opts.observed_at,
            }));
        }
        let Some(host) = host else {
            if *self.cell(Field::Host) == Cell::Empty {
                self.problems.push(RowProblem {
                    row: self.row,
                    column: None,
                    value: None,
                    reason: "neither a uuid nor a host: a row is one GPU (its uuid) or one host \
                             (its host and GPU count)"
                        .into(),
                });
            }
            return None;
        };
        // On a host's row the serial is the machine's: kept as a label of its GPUs.
        if let Some(serial) = serial {
            labels.insert("serial".into(), serial);
        }
        let Some(count) = count else {
            if *self.cell(Field::Count) == Cell::Empty {
                self.problem(
                    Field::Count,
                    "a host row without a uuid needs its GPU count",
                );
            }
            return None;
        };
        Some(Record::Host(HostGpus {
            host,
            count: count as u32,
            model,
            memory_mib: None,
            cluster,
            cloud,
            region: None,
            instance_type,
            account: None,
            labels,
            mig_instances: BTreeMap::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_match_without_case_or_punctuation() {
        let m = Mapping::default();
        assert_eq!(field_of("GPU UUID", &m), Some(Field::Uuid));
        assert_eq!(field_of("gpu_uuid", &m), Some(Field::Uuid));
        assert_eq!(
            field_of("Purchase Price (USD)", &m),
            Some(Field::PurchasePriceUsd)
        );
        assert_eq!(field_of("Hostname", &m), Some(Field::Host));
        assert_eq!(field_of("Rack", &m), None);
        let m = Mapping::from_pairs([("Box", "host"), ("GPU", "count")]).unwrap();
        assert_eq!(field_of("box", &m), Some(Field::Host));
        assert_eq!(field_of("Hostname", &m), None, "host is mapped: no default");
        assert_eq!(field_of("GPU", &m), Some(Field::Count));
        let e = Mapping::from_pairs([("A", "hots")]).unwrap_err();
        assert!(e.contains("`hots` is not a field"), "{e}");
        let e = Mapping::from_pairs([("A", "host"), ("B", "host")]).unwrap_err();
        assert!(e.contains("both mapped to host"), "{e}");
    }

    #[test]
    fn dates_and_numbers_read_as_sheets_write_them() {
        assert_eq!(iso_date("2024-03-01"), NaiveDate::from_ymd_opt(2024, 3, 1));
        assert_eq!(iso_date("2024/03/01"), NaiveDate::from_ymd_opt(2024, 3, 1));
        assert_eq!(
            iso_date("2024-03-01T00:00:00"),
            NaiveDate::from_ymd_opt(2024, 3, 1)
        );
        assert_eq!(iso_date("03/01/2024"), None);
        assert_eq!(iso_date("2024-13-01"), None);
        assert_eq!(number_text(8.0), "8");
        assert_eq!(number_text(35040.5), "35040.5");
    }
}
