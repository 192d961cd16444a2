//! `gpuledger import inventory`: the sample sheet of ten rows with three bad ones
//! (`docs/examples/inventory-sample.csv`) gives its validation report and what it would change,
//! stores nothing with `--dry-run`, stores its GPUs and host counts without it, and changes
//! nothing when imported again; a sheet that gives another team for a GPU another source
//! reported keeps both, as a conflict, without overwriting the first source's owner.

mod common;

use std::path::{Path, PathBuf};

use common::{bin, tempdir};
use gpuledger_model::GpuView;
use gpuledger_store::{Filters, Principal, Store, Window};

fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/examples/inventory-sample.csv")
        .canonicalize()
        .unwrap()
}

/// `gpuledger import inventory ARGS` against `db`: its stdout; it must succeed.
fn import(db: &Path, args: &[&str]) -> String {
    let out = bin()
        .args(["import", "inventory"])
        .args(args)
        .args(["--database-url", &db.display().to_string()])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

async fn gpus(db: &Path) -> Vec<GpuView> {
    let store = Store::open(&db.display().to_string(), Default::default())
        .await
        .unwrap();
    let gpus = store
        .list_gpus(&Filters::default(), false, chrono::Utc::now())
        .await
        .unwrap();
    store.close().await;
    gpus
}

/// What a GPU record says, less when it was seen (a re-import is a new sighting): its
/// `last_seen`, its state, and the minute in its owner reason's ` (from source …, seen
/// 2026-12-06 04:48 UTC)`, which moves when two imports fall on either side of a minute.
fn attributes(g: &GpuView) -> String {
    let mut v = serde_json::to_value(g).unwrap();
    let map = v.as_object_mut().unwrap();
    map.remove("last_seen");
    map.remove("state");
    let reason = map["owner_reason"].as_str().unwrap();
    let mut masked = String::new();
    let mut rest = reason;
    while let Some(at) = rest.find(", seen ") {
        let (head, tail) = rest.split_at(at + ", seen ".len());
        masked.push_str(head);
        masked.push_str("<minute>");
        let end = tail.find(" UTC)").expect("a seen minute ends with ` UTC)`");
        rest = &tail[end..];
    }
    masked.push_str(rest);
    map["owner_reason"] = serde_json::Value::String(masked);
    v.to_string()
}

const REPORT: &str = "\
inventory-sample.csv: 10 row(s) under the header (row 1): 5 GPU(s) by UUID, 2 host(s) by count, 3 row(s) left out
columns: Hostname → host, GPU UUID → uuid, Model → model, GPUs → count, Location → cluster, Team → team, Env → env, Purchase date → purchase_date, Purchase price (USD) → purchase_price_usd, Notes → notes
rows left out (the other rows are kept):
  row 7, column GPUs: `eight` is not a whole number
  row 9, column Purchase date: `20/11/2024` is not a date: write it as YYYY-MM-DD (2024-03-01)
  row 10, column GPU UUID: `GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d01` is also on row 2 (the first is kept)
against the store, as source `sheet:inventory-sample.csv`:
";

#[tokio::test]
async fn the_sample_sheet_reports_imports_and_imports_again_changing_nothing() {
    let dir = tempdir("inventory", "sample");
    let db = dir.join("gpuledger.db");
    let sample = sample();
    let file = sample.display().to_string();

    let dry = import(&db, &[&file, "--dry-run"]);
    assert!(dry.starts_with(REPORT), "{dry}");
    for line in [
        "  GPUs: 5 new, 0 changed, 0 unchanged",
        "  hosts: 2 new, 0 changed, 0 unchanged",
        "  row 2: GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d01 new: NVIDIA H100 80GB HBM3 on dgx-a01",
        "  row 8: GPU-7d2e0c9a-1b3f-4e5d-8a6b-9c0d1e2f3a01 new: NVIDIA L40S on l40s-01",
        "  row 11: host inference-3 new: 4 × NVIDIA L4, placeholders until a source that sees GPU \
         UUIDs names them",
        "dry run: nothing stored",
    ] {
        assert!(dry.lines().any(|l| l == line), "no line {line:?} in\n{dry}");
    }
    assert!(gpus(&db).await.is_empty(), "a dry run stores nothing");

    let first = import(&db, &[&file]);
    assert!(first.starts_with(REPORT), "{first}");
    assert!(
        first.contains("  GPUs: 5 new, 0 changed, 0 unchanged\n"),
        "{first}"
    );
    assert!(
        first.ends_with(
            "stored as source `sheet:inventory-sample.csv`: 5 GPU(s) by UUID, 2 host(s) by count\n"
        ),
        "{first}"
    );
    let stored = gpus(&db).await;
    let real: Vec<&GpuView> = stored.iter().filter(|g| !g.placeholder).collect();
    let placeholders: Vec<&GpuView> = stored.iter().filter(|g| g.placeholder).collect();
    assert_eq!((real.len(), placeholders.len()), (5, 6), "{stored:#?}");
    let d01 = real
        .iter()
        .find(|g| *g.uuid == *"GPU-5c1f4b2e-8a44-4b7a-9d0e-6a1f2b3c4d01")
        .unwrap();
    assert_eq!(&*d01.source, "sheet:inventory-sample.csv");
    assert_eq!(
        (d01.host.as_deref(), d01.cluster.as_deref()),
        (Some("dgx-a01"), Some("rdu-lab"))
    );
    assert_eq!(
        (&*d01.team, &*d01.env),
        ("research", "prod"),
        "the sheet's team and env are labels the ownership rules read"
    );
    for (k, v) in [
        ("purchase_date", "2024-03-01"),
        ("purchase_price_usd", "35040"),
        ("sheet", "inventory-sample.csv"),
        ("sheet_row", "2"),
        ("notes", "rack 4 slot 1"),
    ] {
        assert_eq!(d01.labels.get(k).map(String::as_str), Some(v), "{k}");
    }
    let ws: Vec<&&GpuView> = placeholders
        .iter()
        .filter(|g| g.host.as_deref() == Some("ws-vision-07"))
        .collect();
    assert_eq!(ws.len(), 2);
    assert_eq!(&*ws[0].model, "NVIDIA RTX A6000");
    assert_eq!(&*ws[0].team, "vision");
    assert_eq!(ws[0].labels["purchase_price_usd"], "4650");
    assert!(
        !stored
            .iter()
            .any(|g| g.host.as_deref() == Some("ws-vision-08")),
        "the bad rows are left out"
    );
    assert!(!stored
        .iter()
        .any(|g| *g.uuid == *"GPU-7d2e0c9a-1b3f-4e5d-8a6b-9c0d1e2f3a02"));

    let again = import(&db, &[&file]);
    assert!(again.starts_with(REPORT), "{again}");
    assert!(
        again.contains(
            "  GPUs: 0 new, 0 changed, 5 unchanged\n  hosts: 0 new, 0 changed, 2 unchanged\n\
             stored as source"
        ),
        "{again}"
    );
    let after = gpus(&db).await;
    assert_eq!(
        after.iter().map(attributes).collect::<Vec<_>>(),
        stored.iter().map(attributes).collect::<Vec<_>>(),
        "a second import changes no GPU"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A GPU another source reported with team `nlp`, listed in a sheet with team `vision`: the
/// import says so, the first source's owner stays, and the GPU's conflicts show both.
#[tokio::test]
async fn a_sheet_that_disagrees_with_another_source_is_kept_as_a_conflict() {
    let dir = tempdir("inventory", "conflict");
    let db = dir.join("gpuledger.db");
    let uuid = "GPU-0a0b0c0d-0000-4000-8000-000000000001";
    let now = chrono::Utc::now();
    {
        let store = Store::open(&db.display().to_string(), Default::default())
            .await
            .unwrap();
        let body = serde_json::json!({"gpus": [{
            "uuid": uuid, "model": "NVIDIA H100 80GB HBM3", "host": "dgx-b01",
            "labels": {"team": "nlp", "env": "prod"},
            "observed_at": now.to_rfc3339(),
        }]});
        let serde_json::Value::Object(map) = body else {
            unreachable!()
        };
        let principal = Principal {
            source: "agent-b01".into(),
            teams: None,
            kind: "agent".into(),
        };
        let out = store
            .ingest(
                &principal,
                gpuledger_ledger::validate_collected(map, now, 300),
                now,
            )
            .await
            .unwrap();
        assert_eq!(out.accepted.gpus, 1, "{:?}", out.rejected);
        store.close().await;
    }
    let sheet = dir.join("lab.csv");
    std::fs::write(
        &sheet,
        format!(
            "Host,UUID,Model,Team,Env,Purchase price\n\
             dgx-b01,{uuid},NVIDIA H100 80GB HBM3,vision,prod,35040\n"
        ),
    )
    .unwrap();
    let file = sheet.display().to_string();
    let dry = import(&db, &[&file, "--dry-run"]);
    assert!(
        dry.contains("  GPUs: 0 new, 1 changed, 0 unchanged\n"),
        "{dry}"
    );
    assert!(
        dry.contains(&format!(
            "  row 2: {uuid} disagrees: label team `vision` here, `nlp` kept from source \
             `agent-b01` (the GPU's first source); both are kept, shown as a conflict on the \
             GPU's page\n"
        )),
        "{dry}"
    );
    assert!(
        dry.contains("label purchase_price_usd: (none) → `35040`"),
        "what the first source lacks is filled in: {dry}"
    );
    import(&db, &[&file]);

    let store = Store::open(&db.display().to_string(), Default::default())
        .await
        .unwrap();
    let window = Window {
        from: now.timestamp() - 86_400,
        to: now.timestamp() + 3600,
    };
    let detail = store
        .gpu_detail(uuid, window, chrono::Utc::now())
        .await
        .unwrap()
        .unwrap();
    store.close().await;
    assert_eq!(&*detail.gpu.team, "nlp", "not overwritten by the sheet");
    assert_eq!(detail.gpu.labels["team"], "nlp");
    assert_eq!(&*detail.gpu.source, "agent-b01");
    assert_eq!(detail.gpu.labels["purchase_price_usd"], "35040");
    let conflict = detail
        .conflicts
        .iter()
        .find(|c| c.attribute == "labels.team")
        .unwrap_or_else(|| panic!("no team conflict: {:#?}", detail.conflicts));
    let mut said: Vec<(String, String)> = conflict
        .values
        .iter()
        .map(|p| (p.source.clone(), p.value.clone()))
        .collect();
    said.sort();
    assert_eq!(
        said,
        [
            ("agent-b01".to_string(), "team=nlp".to_string()),
            ("sheet:lab.csv".to_string(), "team=vision".to_string()),
        ]
    );
    assert!(
        !detail.conflicts.iter().any(|c| c.attribute == "labels.env"),
        "both say prod: {:#?}",
        detail.conflicts
    );
    let _ = std::fs::remove_dir_all(&dir);
}
