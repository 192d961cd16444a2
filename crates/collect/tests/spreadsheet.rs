//! The `spreadsheet` collector: CSV and XLSX sheets read into GPU records and host counts, each
//! bad row named by row, column, value and reason while the rest is kept; the collector read
//! from a file and from an HTTP URL; damaged input never panics.
//!
//! The XLSX workbook is `tests/data/inventory.xlsx`, written by
//! `tests/data/make_inventory_xlsx.py` (python3's zipfile and XML text): a title row, a blank
//! row, the header on row 3, date and number cells, an `#N/A` formula result.

use std::path::PathBuf;

use chrono::{DateTime, TimeZone, Utc};
use gpuledger_collect::collectors::spreadsheet::{
    read_inventory, read_table, Field, Inventory, Mapping, ReadOptions, SpreadsheetCollector,
    SpreadsheetConfig,
};
use gpuledger_collect::CollectError;
use gpuledger_model::{Cloud, Observation};

fn at() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 2, 10, 0, 0).unwrap()
}

fn read(bytes: &[u8], sheet: Option<&str>, mapping: &Mapping) -> Result<Inventory, CollectError> {
    let table = read_table(bytes, sheet, b',')?;
    read_inventory(
        &table,
        &ReadOptions {
            file: "gpus.csv",
            mapping,
            observed_at: at(),
        },
    )
}

fn problems(inv: &Inventory) -> Vec<String> {
    inv.problems.iter().map(|p| p.to_string()).collect()
}

const CSV: &str = "\u{feff}Hostname,GPU UUID,Model,GPUs,Location,Team,Env,Purchase Date,Purchase Price (USD),Cloud,Notes,Rack\n\
dgx-01,GPU-aaaaaaaa-0000-0000-0000-000000000001,NVIDIA H100 80GB HBM3,,rdu-1,research,prod,2024-03-01,\"$35,040.00\",onprem,rack 4,R4\n\
dgx-01,gpu-aaaaaaaa-0000-0000-0000-000000000002,NVIDIA H100 80GB HBM3,1,rdu-1,research,prod,2024-03-01,35040,,,R4\n\
ws-07,,NVIDIA RTX A6000,2,lab-3,vision,dev,2023/06/15,4650,On-Prem,,\n\
,,,,,,,,,,,\n\
ws-08,,NVIDIA RTX A6000,eight,lab-3,vision,dev,,,,,\n\
ws-09,,NVIDIA RTX A6000,0,lab-3,,,,,,,\n\
ws-10,,NVIDIA RTX A6000,-2,lab-3,,,,,,,\n\
dgx-02,GPU-aaaaaaaa-0000-0000-0000-000000000001,NVIDIA H100 80GB HBM3,,rdu-1,,,,,,,\n\
dgx-03,GPU-bbbb,NVIDIA H100 80GB HBM3,,rdu-1,,,03/04/2023,,,,\n\
dgx-04,GPU-cccc,NVIDIA H100 80GB HBM3,,rdu-1,,,,,moon,,\n\
dgx-05,abc-123,NVIDIA H100 80GB HBM3,,rdu-1,,,,,,,\n\
dgx-06,MIG-dddd,NVIDIA H100 80GB HBM3,,rdu-1,,,,,,,\n\
,,NVIDIA L4,4,lab-3,,,,,,,\n\
dgx-07,GPU-eeee,,,rdu-1,,,,,,,\n\
ws-11,,,,lab-3,,,,,,,\n\
ws-07,,NVIDIA L4,1,lab-3,,,,,,,\n\
ws-12,,NVIDIA L4,3,lab-3,,,2999-12-03,0,,,\n\
dgx-08,GPU-ffff,NVIDIA H100 80GB HBM3,2,rdu-1,,,,,,,\n";

#[test]
fn csv_rows_become_gpus_and_host_counts_and_bad_rows_are_named() {
    let inv = read(CSV.as_bytes(), None, &Mapping::default()).unwrap();
    assert_eq!(inv.header_row, 1);
    assert_eq!(inv.rows, 17, "the blank row is not a row");
    assert_eq!(inv.ignored_columns, ["Rack"]);
    assert_eq!(
        inv.columns.iter().map(|(_, f)| *f).collect::<Vec<_>>(),
        [
            Field::Host,
            Field::Uuid,
            Field::Model,
            Field::Count,
            Field::Cluster,
            Field::Team,
            Field::Env,
            Field::PurchaseDate,
            Field::PurchasePriceUsd,
            Field::Cloud,
            Field::Notes,
        ]
    );
    assert_eq!(
        problems(&inv),
        [
            "row 6, column GPUs: `eight` is not a whole number",
            "row 7, column GPUs: `0` is not a GPU count: it must be at least 1 (leave out a host \
             without GPUs)",
            "row 8, column GPUs: `-2` is not a GPU count: it must be at least 1 (leave out a host \
             without GPUs)",
            "row 9, column GPU UUID: `GPU-aaaaaaaa-0000-0000-0000-000000000001` is also on row 2 \
             (the first is kept)",
            "row 10, column Purchase Date: `03/04/2023` is not a date: write it as YYYY-MM-DD \
             (2024-03-01)",
            "row 11, column Cloud: `moon` is not a known cloud: one of aws, gcp, azure, onprem, \
             other (or leave it empty)",
            "row 12, column GPU UUID: `abc-123` is not a GPU UUID: it must start with `GPU-`, as \
             `nvidia-smi -L` prints it",
            "row 13, column GPU UUID: `MIG-dddd` is a MIG instance: the sheet lists physical \
             GPUs; give the GPU's `GPU-…` UUID (its instances come from the sources that see \
             them)",
            "row 14: neither a uuid nor a host: a row is one GPU (its uuid) or one host (its host \
             and GPU count)",
            "row 15, column Model: empty: a row with a UUID needs the GPU's model",
            "row 16, column GPUs: empty: a host row without a uuid needs its GPU count",
            "row 17, column Hostname: `ws-07` is also counted on row 4 (the first is kept): give \
             one row per host with its total GPU count",
            "row 18, column Purchase Date: `2999-12-03` is in the future",
            "row 18, column Purchase Price (USD): `0` is not a price: it must be more than 0 \
             (leave it empty when unknown)",
            "row 19, column GPUs: `2` is more than one GPU on a row with a UUID: a UUID names one \
             GPU (leave count empty or 1)",
        ]
    );
    assert_eq!(inv.gpus.len(), 2);
    let g = &inv.gpus[0];
    assert_eq!(g.row, 2);
    assert_eq!(g.gpu.uuid, "GPU-aaaaaaaa-0000-0000-0000-000000000001");
    assert_eq!(g.gpu.model, "NVIDIA H100 80GB HBM3");
    assert_eq!(g.gpu.host.as_deref(), Some("dgx-01"));
    assert_eq!(g.gpu.cluster.as_deref(), Some("rdu-1"));
    assert_eq!(g.gpu.cloud, Some(Cloud::Onprem));
    assert_eq!(g.gpu.observed_at, at());
    let labels: Vec<(&str, &str)> = g
        .gpu
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        labels,
        [
            ("env", "prod"),
            ("notes", "rack 4"),
            ("purchase_date", "2024-03-01"),
            ("purchase_price_usd", "35040"),
            ("sheet", "gpus.csv"),
            ("sheet_row", "2"),
            ("team", "research"),
        ]
    );
    assert_eq!(
        inv.gpus[1].gpu.uuid, "GPU-aaaaaaaa-0000-0000-0000-000000000002",
        "a lower-case `gpu-` prefix is NVIDIA's `GPU-`"
    );
    assert_eq!(inv.gpus[1].gpu.cloud, None, "no cloud given: none assumed");
    assert_eq!(inv.hosts.len(), 1);
    let h = &inv.hosts[0];
    assert_eq!((h.row, h.host.host.as_str(), h.host.count), (4, "ws-07", 2));
    assert_eq!(h.host.model.as_deref(), Some("NVIDIA RTX A6000"));
    assert_eq!(h.host.cluster.as_deref(), Some("lab-3"));
    assert_eq!(h.host.cloud, Some(Cloud::Onprem));
    assert_eq!(h.host.labels["team"], "vision");
    assert_eq!(h.host.labels["purchase_date"], "2023-06-15");
    assert_eq!(h.host.labels["purchase_price_usd"], "4650");
    assert_eq!(h.host.labels["sheet_row"], "4");

    let obs = inv.observations("sheet:gpus.csv");
    assert_eq!(obs.len(), 3);
    assert!(matches!(&obs[0], Observation::HostGpuCount { gpus, .. } if gpus.host == "ws-07"));
    for o in &obs {
        assert_eq!(o.provenance().source, "sheet:gpus.csv");
        assert_eq!(o.provenance().observed_at, at());
    }
    assert_eq!(
        obs[1].provenance().raw_key.as_deref(),
        Some("gpus.csv row 2")
    );
}

#[test]
fn a_mapping_names_the_sheets_own_headers() {
    let csv = "Box,Card,Kind,N,Owner\nn1,GPU-1,L4,,nlp\nn2,,L4,4,vision\n";
    let none = read(csv.as_bytes(), None, &Mapping::default()).unwrap_err();
    assert!(
        none.to_string().contains("no header row") && none.to_string().contains("hostname"),
        "{none}"
    );
    let mapping = Mapping::from_pairs([
        ("box", "host"),
        ("Card", "uuid"),
        ("Kind", "model"),
        ("N", "count"),
    ])
    .unwrap();
    let inv = read(csv.as_bytes(), None, &mapping).unwrap();
    assert!(inv.problems.is_empty(), "{:?}", inv.problems);
    assert_eq!(inv.gpus[0].gpu.uuid, "GPU-1");
    assert_eq!(
        inv.gpus[0].gpu.labels["team"], "nlp",
        "`Owner` is a default of team"
    );
    assert_eq!(
        (inv.hosts[0].host.host.as_str(), inv.hosts[0].host.count),
        ("n2", 4)
    );

    let missing = Mapping::from_pairs([("Box", "host"), ("Serial No", "serial")]).unwrap();
    let e = read(csv.as_bytes(), None, &missing)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("column `Serial No` (mapped to serial) is not in the header row (row 1)"),
        "{e}"
    );
    let twice = "Host,Model,GPU\nn1,L4,L4\n";
    let e = read(twice.as_bytes(), None, &Mapping::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("columns `Model` and `GPU` are both read as model"),
        "{e}"
    );
}

#[test]
fn semicolons_and_non_utf8_cells() {
    let table = read_table(b"host;count;model\nn1;2;L4\nn2;3;\xff\xfe\n", None, b';').unwrap();
    let inv = read_inventory(
        &table,
        &ReadOptions {
            file: "x.csv",
            mapping: &Mapping::default(),
            observed_at: at(),
        },
    )
    .unwrap();
    assert_eq!(inv.hosts.len(), 1);
    assert_eq!(
        problems(&inv),
        ["row 3, column model: is not UTF-8 text; save the sheet as CSV UTF-8"]
    );
    let e = read(b"\xD0\xCF\x11\xE0rest", None, &Mapping::default()).unwrap_err();
    assert!(e.to_string().contains(".xls"), "{e}");
    let e = read(b"", None, &Mapping::default()).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
}

fn xlsx() -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/inventory.xlsx");
    std::fs::read(path).unwrap()
}

#[test]
fn xlsx_reads_the_named_sheet_with_date_and_number_cells() {
    let inv = read(&xlsx(), Some("gpus"), &Mapping::default()).unwrap();
    assert_eq!(inv.header_row, 3, "a title row and a blank row come first");
    assert_eq!(inv.rows, 6);
    assert_eq!(
        problems(&inv),
        [
            "row 7, column GPUs: `0` is not a GPU count: it must be at least 1 (leave out a host \
             without GPUs)",
            "row 8, column GPU UUID: `gpu0` is not a GPU UUID: it must start with `GPU-`, as \
             `nvidia-smi -L` prints it",
            "row 9, column GPUs: holds the error #N/A",
        ]
    );
    let uuids: Vec<&str> = inv.gpus.iter().map(|g| g.gpu.uuid.as_str()).collect();
    assert_eq!(
        uuids,
        [
            "GPU-11111111-2222-3333-4444-555555555501",
            "GPU-11111111-2222-3333-4444-555555555502"
        ]
    );
    let g = &inv.gpus[0].gpu;
    assert_eq!(g.labels["purchase_date"], "2024-03-01", "a date cell");
    assert_eq!(g.labels["purchase_price_usd"], "35040", "a number cell");
    assert_eq!(g.labels["sheet_row"], "4");
    assert_eq!(g.labels["notes"], "rack 4");
    assert_eq!(g.cluster.as_deref(), Some("lab-3"));
    let h = &inv.hosts[0];
    assert_eq!((h.row, h.host.host.as_str(), h.host.count), (6, "ws-07", 2));
    assert_eq!(h.host.labels["purchase_date"], "2023-06-15", "a text date");
    assert_eq!(h.host.labels["purchase_price_usd"], "4650");

    let e = read(&xlsx(), None, &Mapping::default()).unwrap_err();
    assert!(
        e.to_string().contains("no header row"),
        "the first sheet is the read-me: {e}"
    );
    let e = read(&xlsx(), Some("Inventory"), &Mapping::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("the workbook has no sheet `Inventory`; its sheets: Read me, GPUs"),
        "{e}"
    );
}

/// The same rows as CSV and as XLSX read to the same records.
#[test]
fn xlsx_and_its_csv_export_agree() {
    let csv = "GPU inventory; lab 3\n\nHostname,GPU UUID,Model,GPUs,Location,Team,Env,Purchase date,Purchase price,Notes\n\
dgx-01,GPU-11111111-2222-3333-4444-555555555501,NVIDIA H100 80GB HBM3,,lab-3,research,prod,2024-03-01,35040,rack 4\n\
dgx-01,GPU-11111111-2222-3333-4444-555555555502,NVIDIA H100 80GB HBM3,1,lab-3,research,prod,2024-03-01,35040,\n\
ws-07,,NVIDIA RTX A6000,2,lab-3,vision,dev,2023-06-15,\"$4,650.00\",\n\
ws-08,,NVIDIA RTX A6000,0,lab-3,vision,dev,,,\n\
ws-09,gpu0,NVIDIA RTX A6000,,lab-3,,,,,\n\
ws-10,,NVIDIA RTX A6000,#N/A,lab-3,,,,,\n";
    let a = read(csv.as_bytes(), None, &Mapping::default()).unwrap();
    let b = read(&xlsx(), Some("GPUs"), &Mapping::default()).unwrap();
    assert_eq!(a.gpus, b.gpus);
    assert_eq!(a.hosts, b.hosts);
    assert_eq!(a.problems[..2], b.problems[..2]);
    assert_eq!(
        a.problems[2].to_string(),
        "row 9, column GPUs: `#N/A` is not a whole number"
    );
}

/// A tiny xorshift, so the mutations are the same on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(8) {
        match rng.below(5) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = rng.next() as u8;
            }
            1 if !out.is_empty() => {
                let len = rng.below(out.len());
                out.truncate(len);
            }
            2 => {
                let i = rng.below(out.len() + 1);
                let b = [b',', b'"', b'\n', b'\r', 0xff, b'-', b'0', b'G'][rng.below(8)];
                out.insert(i, b);
            }
            3 if out.len() > 2 => {
                let i = rng.below(out.len() - 1);
                let j = rng.below(out.len());
                out.swap(i, j);
            }
            _ => {
                let i = rng.below(out.len() + 1);
                out.splice(i..i, b"GPU-x,1e308,-0,NaN,".iter().copied());
            }
        }
    }
    out
}

/// Damaged sheets are read or refused, never a panic.
#[test]
fn mutated_input_never_panics() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mapping = Mapping::default();
    let csv = CSV.as_bytes();
    let xlsx = xlsx();
    let (mut ok, mut refused) = (0, 0);
    for i in 0..1500 {
        let input = if i % 3 == 0 {
            mutate(&mut rng, &xlsx)
        } else {
            mutate(&mut rng, csv)
        };
        for sheet in [None, Some("GPUs")] {
            match read(&input, sheet, &mapping) {
                Ok(inv) => {
                    ok += 1;
                    // Whatever was kept is a usable record.
                    for g in &inv.gpus {
                        assert!(g.gpu.uuid.starts_with("GPU-"), "{:?}", g.gpu.uuid);
                        assert!(!g.gpu.model.is_empty());
                    }
                    for h in &inv.hosts {
                        assert!(h.host.count >= 1 && !h.host.host.is_empty());
                    }
                }
                Err(_) => refused += 1,
            }
        }
    }
    assert!(ok > 100 && refused > 100, "ok {ok}, refused {refused}");
}

fn collector(toml: &str) -> SpreadsheetCollector {
    SpreadsheetCollector::new("lab", SpreadsheetConfig::from_toml(toml).unwrap()).unwrap()
}

#[tokio::test]
async fn the_collector_reads_a_file_and_names_each_bad_row() {
    use gpuledger_collect::Collector;
    let dir = std::env::temp_dir().join(format!("gpuledger-sheet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("lab.csv");
    std::fs::write(&file, CSV).unwrap();
    let c = collector(&format!("path = \"{}\"\n", file.display()));
    assert_eq!((c.kind(), c.name()), ("spreadsheet", "lab"));
    let report = c.collect_report().await.unwrap();
    assert_eq!(report.observations.len(), 3);
    assert!(report
        .observations
        .iter()
        .all(|o| o.provenance().source == "lab"));
    assert_eq!(report.problems.len(), 15);
    assert_eq!(
        report.problems[0].to_string(),
        "lab.csv: row 6, column GPUs: `eight` is not a whole number"
    );

    // No usable row: the run fails, naming the first problem.
    std::fs::write(&file, "host,count\nn1,zero\n").unwrap();
    let e = c.collect_report().await.unwrap_err();
    assert!(
        matches!(&e, CollectError::Data(m) if m.contains("lab.csv: no usable row; 1 problem(s), first: row 2, column count: `zero` is not a whole number")),
        "{e}"
    );
    std::fs::write(&file, "host,count\n").unwrap();
    let e = c.collect_report().await.unwrap_err().to_string();
    assert!(e.contains("no rows under the header (row 1)"), "{e}");

    let gone = collector("path = \"/nonexistent/lab.csv\"\n");
    let e = gone.collect_report().await.unwrap_err();
    assert!(
        matches!(&e, CollectError::Config(m) if m.contains("not a file this server can read")),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sheet published as an export: read over HTTP, its host listed for `collector_hosts`.
#[tokio::test]
async fn the_collector_reads_a_published_export_over_http() {
    use gpuledger_collect::Collector;
    let body = xlsx();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&body);
        }
    });
    let c = collector(&format!(
        "url = \"http://{addr}/sheets/export\"\nsheet = \"GPUs\"\n"
    ));
    assert_eq!(c.config().hosts().unwrap(), ["127.0.0.1"]);
    let report = c.collect_report().await.unwrap();
    assert_eq!(report.observations.len(), 3, "two GPUs and one host");
    assert_eq!(report.problems.len(), 3);
    let Observation::Gpu { gpu, .. } = &report.observations[1] else {
        panic!("{:?}", report.observations[1])
    };
    assert_eq!(gpu.labels["sheet"], "export");
}

/// An authoritative sheet's listing names every GPU and host it read, and there is none when a
/// row was left out: a broken row must not end its GPU.
#[test]
fn the_listing_of_an_authoritative_sheet_needs_every_row() {
    let good = "Hostname,GPU UUID,Model,GPUs\n\
                dgx-1,GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d01,H100,\n\
                spare-7,,A100,2\n";
    let inv = read(good.as_bytes(), None, &Mapping::default()).unwrap();
    let Some(Observation::InventoryList {
        uuids,
        hosts,
        provenance,
    }) = inv.listing("sheet:inv.csv")
    else {
        panic!("{inv:#?}")
    };
    assert_eq!(uuids, ["GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d01"]);
    assert_eq!(hosts, ["spare-7"]);
    assert_eq!(provenance.source, "sheet:inv.csv");
    let bad = format!("{good}spare-8,,A100,eight\n");
    let inv = read(bad.as_bytes(), None, &Mapping::default()).unwrap();
    assert_eq!(problems(&inv).len(), 1, "{:?}", problems(&inv));
    assert!(inv.listing("sheet:inv.csv").is_none());
}
