//! `gpuledger import inventory FILE`: read an inventory sheet (CSV or XLSX) as the
//! `spreadsheet` collector reads it, print every row it cannot use (row, column, value, reason)
//! and what the rest would change in the store (GPUs and hosts new, changed, unchanged, and
//! where the sheet disagrees with another source), then store it the way pull collectors'
//! observations are stored, unless `--dry-run`. The same file imported again changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use gpuledger_collect::collectors::spreadsheet::{
    Inventory, Location, Mapping, SheetGpu, SheetHost, SpreadsheetCollector, SpreadsheetConfig,
};
use gpuledger_collect::Settings as Kind;
use gpuledger_ledger::{merge_gpu, GpuRecord};
use gpuledger_model::{GpuView, HostGpus, PushGpu};
use gpuledger_store::{Filters, Principal, Store};

#[derive(Args)]
pub struct InventoryArgs {
    /// The sheet: a CSV file or an XLSX workbook.
    file: PathBuf,
    /// Print the report and what would change; store nothing.
    #[arg(long)]
    dry_run: bool,
    /// Which column holds which field, `HEADER=FIELD` (repeat it, or separate pairs with
    /// commas); fields: host, model, count, uuid, serial, cluster (or location), team, env,
    /// purchase_date, purchase_price_usd, notes, cloud, instance_type. Columns not named are
    /// found by their usual headers (Hostname, GPU UUID, Model, GPUs, ...).
    #[arg(long, value_name = "HEADER=FIELD")]
    mapping: Vec<String>,
    /// XLSX: the sheet to read (default: the first).
    #[arg(long)]
    sheet: Option<String>,
}

/// Run `import inventory`.
pub async fn run(args: InventoryArgs, db: crate::DbArgs) -> anyhow::Result<()> {
    let cfg = crate::load_config(db.config.as_ref())?;
    let url = crate::database_url(db.database_url, &cfg);
    let (source, config) = sheet_config(&args, &cfg)?;
    let authoritative = config.authoritative;
    let collector = SpreadsheetCollector::new(&source, config)?;
    let inv = collector.read().await?;
    print_report(&inv);
    let store = Store::open_for_tool(&url, cfg.settings)
        .await
        .with_context(|| format!("opening database {}", crate::redacted(&url)))?;
    let done = compare_and_store(&store, &inv, &source, authoritative, args.dry_run).await;
    store.close().await;
    done
}

/// The source name and reading of the sheet: the config's `spreadsheet` entry for this file
/// when there is one (its name, columns and sheet), else `sheet:<file name>` with the flags'.
fn sheet_config(
    args: &InventoryArgs,
    cfg: &crate::config::Config,
) -> anyhow::Result<(String, SpreadsheetConfig)> {
    let flags = mapping_flags(&args.mapping)?;
    let entry = cfg.collectors.iter().find_map(|e| match &e.settings {
        Kind::Spreadsheet(c) => match &c.location {
            Location::Path(p) if same_file(p, &args.file) => Some((e.name.clone(), c.clone())),
            _ => None,
        },
        _ => None,
    });
    let (source, mut config) = match entry {
        Some(found) => found,
        None => {
            let name = args
                .file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| args.file.display().to_string());
            (
                format!("sheet:{name}"),
                SpreadsheetConfig::for_file(args.file.clone(), Mapping::default(), None),
            )
        }
    };
    if let Some(mapping) = flags {
        config.mapping = mapping;
    }
    if args.sheet.is_some() {
        config.sheet = args.sheet.clone();
    }
    config.location = Location::Path(args.file.clone());
    Ok((source, config))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// `--mapping` pairs, `None` when none is given.
fn mapping_flags(flags: &[String]) -> anyhow::Result<Option<Mapping>> {
    if flags.is_empty() {
        return Ok(None);
    }
    let mut pairs = Vec::new();
    for pair in flags.iter().flat_map(|f| f.split(',')) {
        if pair.trim().is_empty() {
            continue;
        }
        let Some((header, field)) = pair.rsplit_once('=') else {
            anyhow::bail!(
                "--mapping `{pair}`: write it as HEADER=FIELD, like --mapping 'Hostname=host'"
            );
        };
        pairs.push((header.trim().to_string(), field.trim().to_string()));
    }
    Mapping::from_pairs(pairs)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("--mapping: {e}"))
}

/// The validation report: what was read and every row left out.
fn print_report(inv: &Inventory) {
    let left_out: BTreeSet<usize> = inv.problems.iter().map(|p| p.row).collect();
    println!(
        "{}: {} row(s) under the header (row {}): {} GPU(s) by UUID, {} host(s) by count, {} \
         row(s) left out",
        inv.file,
        inv.rows,
        inv.header_row,
        inv.gpus.len(),
        inv.hosts.len(),
        left_out.len()
    );
    let columns: Vec<String> = inv
        .columns
        .iter()
        .map(|(h, f)| format!("{h} → {}", f.name()))
        .collect();
    print!("columns: {}", columns.join(", "));
    if !inv.ignored_columns.is_empty() {
        print!("; not read: {}", inv.ignored_columns.join(", "));
    }
    println!();
    if !inv.problems.is_empty() {
        println!("rows left out (the other rows are kept):");
        for p in &inv.problems {
            println!("  {p}");
        }
    }
}

/// What one record of the sheet does to the store.
#[derive(Debug, PartialEq)]
enum Change {
    New(String),
    Changed(Vec<String>),
    Unchanged,
}

/// A record's change and where the sheet disagrees with what another source keeps.
struct Planned {
    row: usize,
    what: String,
    change: Change,
    disagrees: Vec<String>,
}

async fn compare_and_store(
    store: &Store,
    inv: &Inventory,
    source: &str,
    authoritative: bool,
    dry_run: bool,
) -> anyhow::Result<()> {
    let now = inv.observed_at;
    let all = store.list_gpus(&Filters::default(), false, now).await?;
    let by_uuid: BTreeMap<&str, &GpuView> = all.iter().map(|g| (&*g.uuid, g)).collect();
    let mut by_host: BTreeMap<&str, Vec<&GpuView>> = BTreeMap::new();
    for g in &all {
        if let Some(h) = g.host.as_deref() {
            by_host.entry(h).or_default().push(g);
        }
    }
    let settings = store.settings();
    let gpus: Vec<Planned> = inv
        .gpus
        .iter()
        .map(|g| plan_gpu(g, &by_uuid, &by_host, source, settings))
        .collect();
    let hosts: Vec<Planned> = inv
        .hosts
        .iter()
        .map(|h| plan_host(h, &by_host, source, settings))
        .collect();
    let in_sheet: BTreeSet<&str> = inv.gpus.iter().map(|g| g.gpu.uuid.as_str()).collect();
    let counted: BTreeSet<&str> = inv.hosts.iter().map(|h| h.host.host.as_str()).collect();
    let gone: Vec<&GpuView> = all
        .iter()
        .filter(|g| *g.source == *source)
        .filter(|g| {
            if g.placeholder {
                !g.host.as_deref().is_some_and(|h| counted.contains(h))
            } else {
                !in_sheet.contains(&*g.uuid)
            }
        })
        .collect();

    println!("against the store, as source `{source}`:");
    for (what, plans) in [("GPUs", &gpus), ("hosts", &hosts)] {
        let count = |f: fn(&Change) -> bool| plans.iter().filter(|p| f(&p.change)).count();
        println!(
            "  {what}: {} new, {} changed, {} unchanged",
            count(|c| matches!(c, Change::New(_))),
            count(|c| matches!(c, Change::Changed(_))),
            count(|c| matches!(c, Change::Unchanged))
        );
    }
    for p in gpus.iter().chain(&hosts) {
        match &p.change {
            Change::New(how) => println!("  row {}: {} new: {how}", p.row, p.what),
            Change::Changed(diffs) => {
                println!("  row {}: {} changed: {}", p.row, p.what, diffs.join("; "))
            }
            Change::Unchanged => {}
        }
        for d in &p.disagrees {
            println!("  row {}: {} disagrees: {d}", p.row, p.what);
        }
    }
    let listing = if authoritative {
        inv.listing(source)
    } else {
        None
    };
    if !gone.is_empty() {
        println!(
            "  no longer in the sheet ({} GPU(s) this source reported before; {}):",
            gone.len(),
            match (authoritative, &listing) {
                (true, Some(_)) =>
                    "the sheet is authoritative: they stop counting as present \
                                    now, unless another source reported them within the stale \
                                    window",
                (true, None) =>
                    "the sheet is authoritative, but rows were left out, so this \
                                 import ends nothing; they go missing after the stale window \
                                 unless another source reports them",
                (false, _) =>
                    "they go missing after the stale window unless another source \
                               reports them",
            }
        );
        for g in &gone {
            println!(
                "    {} on {}",
                g.uuid,
                g.host.as_deref().unwrap_or("(no host)")
            );
        }
    }
    if dry_run {
        println!("dry run: nothing stored");
        return Ok(());
    }
    let principal = Principal {
        source: source.to_string(),
        teams: None,
        kind: gpuledger_collect::collectors::spreadsheet::KIND.to_string(),
    };
    let mut observations = inv.observations(source);
    observations.extend(listing);
    let outcome = crate::pull::store_observations(store, &principal, observations, now).await?;
    for r in &outcome.rejected {
        let row = r
            .path
            .strip_prefix("gpus[")
            .and_then(|rest| rest.split(']').next())
            .and_then(|i| i.parse::<usize>().ok())
            .and_then(|i| inv.gpus.get(i))
            .map_or_else(String::new, |g| format!("row {}: ", g.row));
        println!("  {row}not stored: {}: {}", r.path, r.reason);
    }
    println!(
        "stored as source `{source}`: {} GPU(s) by UUID, {} host(s) by count{}",
        outcome.accepted.gpus,
        inv.hosts.len(),
        if outcome.rejected.is_empty() {
            String::new()
        } else {
            format!(", {} refused", outcome.rejected.len())
        }
    );
    Ok(())
}

/// A stored GPU as the merge sees it.
fn record_of(v: &GpuView) -> GpuRecord {
    GpuRecord {
        uuid: v.uuid.to_string(),
        model: v.model.to_string(),
        memory_mib: v.memory_mib,
        host: v.host.as_deref().map(str::to_string),
        cluster: v.cluster.as_deref().map(str::to_string),
        cloud: v.cloud.as_deref().map(str::to_string),
        region: v.region.as_deref().map(str::to_string),
        instance_type: v.instance_type.as_deref().map(str::to_string),
        account: v.account.as_deref().map(str::to_string),
        serial: v.serial.as_deref().map(str::to_string),
        pci_bus_id: v.pci_bus_id.as_deref().map(str::to_string),
        mig_parent_uuid: v.mig_parent_uuid.as_deref().map(str::to_string),
        mig_profile: v.mig_profile.as_deref().map(str::to_string),
        labels: (*v.labels).clone(),
        source: v.source.to_string(),
        placeholder: v.placeholder,
        first_seen: v.first_seen,
        last_seen: v.last_seen,
        ..GpuRecord::default()
    }
}

/// The attributes a record keeps, by name (labels as `label <key>`).
fn attrs(r: &GpuRecord) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert("model".to_string(), r.model.clone());
    for (k, v) in [
        ("memory_mib", r.memory_mib.map(|m| m.to_string())),
        ("host", r.host.clone()),
        ("cluster", r.cluster.clone()),
        ("cloud", r.cloud.clone()),
        ("region", r.region.clone()),
        ("instance_type", r.instance_type.clone()),
        ("account", r.account.clone()),
        ("serial", r.serial.clone()),
    ] {
        if let Some(v) = v {
            out.insert(k.to_string(), v);
        }
    }
    for (k, v) in &r.labels {
        out.insert(format!("label {k}"), v.clone());
    }
    out
}

/// What differs between two records, as `name: old → new`.
fn diff(old: &GpuRecord, new: &GpuRecord) -> Vec<String> {
    let (a, b) = (attrs(old), attrs(new));
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            let show = |v: Option<&String>| v.map_or("(none)".to_string(), |v| format!("`{v}`"));
            format!("{k}: {} → {}", show(a.get(k)), show(b.get(k)))
        })
        .collect()
}

/// What the sheet says that the merged record does not keep: another source is the GPU's
/// primary and says otherwise.
fn disagreements(sheet: &PushGpu, merged: &GpuRecord) -> Vec<String> {
    let mut said = attrs(&GpuRecord {
        model: sheet.model.clone(),
        host: sheet.host.clone(),
        cluster: sheet.cluster.clone(),
        cloud: sheet.cloud.map(|c| c.as_str().to_string()),
        instance_type: sheet.instance_type.clone(),
        serial: sheet.serial.clone(),
        labels: sheet.labels.clone(),
        ..GpuRecord::default()
    });
    // Where the sheet found the GPU is its own.
    said.remove("label sheet");
    said.remove("label sheet_row");
    let kept = attrs(merged);
    said.into_iter()
        .filter_map(|(k, v)| {
            let other = kept.get(&k)?;
            (*other != v).then(|| {
                format!(
                    "{k} `{v}` here, `{other}` kept from source `{}` (the GPU's first source); \
                     both are kept, shown as a conflict on the GPU's page",
                    merged.source
                )
            })
        })
        .collect()
}

fn plan_gpu(
    g: &SheetGpu,
    by_uuid: &BTreeMap<&str, &GpuView>,
    by_host: &BTreeMap<&str, Vec<&GpuView>>,
    source: &str,
    settings: &gpuledger_ledger::Settings,
) -> Planned {
    let what = g.gpu.uuid.clone();
    let Some(stored) = by_uuid.get(g.gpu.uuid.as_str()) else {
        let host = g.gpu.host.as_deref();
        let placeholders = host
            .and_then(|h| by_host.get(h))
            .is_some_and(|on| on.iter().any(|v| v.placeholder));
        let mut how = format!("{} on {}", g.gpu.model, host.unwrap_or("no host"));
        if placeholders {
            how.push_str(&format!(
                " (takes over a placeholder GPU of {})",
                host.unwrap_or_default()
            ));
        }
        return Planned {
            row: g.row,
            what,
            change: Change::New(how),
            disagrees: Vec::new(),
        };
    };
    let old = record_of(stored);
    let merged = merge_gpu(Some(&old), &g.gpu, source, settings);
    let diffs = diff(&old, &merged);
    Planned {
        row: g.row,
        what,
        change: if diffs.is_empty() {
            Change::Unchanged
        } else {
            Change::Changed(diffs)
        },
        disagrees: disagreements(&g.gpu, &merged),
    }
}

/// A host's GPU record as a count-only source gives it (as the store makes it).
fn host_gpu(h: &HostGpus, uuid: &str, model: &str, at: chrono::DateTime<chrono::Utc>) -> PushGpu {
    PushGpu {
        uuid: uuid.to_string(),
        model: model.to_string(),
        memory_mib: h.memory_mib,
        host: Some(h.host.clone()),
        cluster: h.cluster.clone(),
        cloud: h.cloud,
        region: h.region.clone(),
        instance_type: h.instance_type.clone(),
        account: h.account.clone(),
        serial: None,
        pci_bus_id: None,
        mig_parent_uuid: None,
        mig_profile: None,
        labels: h.labels.clone(),
        observed_at: at,
    }
}

fn plan_host(
    h: &SheetHost,
    by_host: &BTreeMap<&str, Vec<&GpuView>>,
    source: &str,
    settings: &gpuledger_ledger::Settings,
) -> Planned {
    let hg = &h.host;
    let what = format!("host {}", hg.host);
    let model = hg.model.as_deref().unwrap_or("unknown");
    let on_host = by_host.get(hg.host.as_str()).cloned().unwrap_or_default();
    if on_host.is_empty() {
        return Planned {
            row: h.row,
            what,
            change: Change::New(format!(
                "{} × {model}, placeholders until a source that sees GPU UUIDs names them",
                hg.count
            )),
            disagrees: Vec::new(),
        };
    }
    let real: Vec<&GpuView> = on_host.iter().copied().filter(|g| !g.placeholder).collect();
    let placeholders: Vec<&GpuView> = on_host.iter().copied().filter(|g| g.placeholder).collect();
    let wanted = (hg.count as usize).saturating_sub(real.len());
    let mut diffs = Vec::new();
    if wanted != placeholders.len() {
        diffs.push(format!(
            "{} GPU(s) named by UUID, placeholders {} → {wanted}",
            real.len(),
            placeholders.len()
        ));
    }
    // As the store applies a count: its own placeholders take what it says, the host's other
    // GPUs only the attributes they lack.
    let mut seen = BTreeSet::new();
    for g in placeholders.iter().take(wanted).chain(&real) {
        let old = record_of(g);
        let own = g.placeholder && *g.source == *source;
        let template = host_gpu(
            hg,
            &g.uuid,
            if g.placeholder { model } else { &g.model },
            g.last_seen,
        );
        let new = if own {
            merge_gpu(None, &template, source, settings)
        } else {
            merge_gpu(Some(&old), &template, source, settings)
        };
        for d in diff(&old, &new) {
            if seen.insert(d.clone()) {
                diffs.push(d);
            }
        }
    }
    Planned {
        row: h.row,
        what,
        change: if diffs.is_empty() {
            Change::Unchanged
        } else {
            Change::Changed(diffs)
        },
        disagrees: Vec::new(),
    }
}
