//! Running pull collectors inside `serve`: each configured collector runs on its own interval,
//! its observations take the same validation and storage path as a push (as the source named
//! in its config entry), and a failing collector marks its source `error` and backs off while
//! the others go on; one whose configuration is wrong stops, saying what to fix. With several
//! replicas on one PostgreSQL database, the collectors run only in the replica that holds the
//! store's lease (see [`gpuledger_store::Lease`]): they stop when it is lost and start when it is
//! gained. [`Pulls`] keeps the running set, by source name, and reconciles it with the config
//! on a reload.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use gpuledger_collect::{CollectError, Collector, Entry, HostAllowList};
use gpuledger_ledger::TimeBounds;
use gpuledger_model::{Observation, PushBody};
use gpuledger_store::{IngestOutcome, Lease, Principal, Store};

/// Store one run's observations as `principal` would push them. Host aliases and GPU counts go
/// first, so that GPU counts see the GPUs reported under an alias and allocations on a host's
/// GPU pool find the placeholders they name.
pub async fn store_observations(
    store: &Store,
    principal: &Principal,
    observations: Vec<Observation>,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<IngestOutcome> {
    let mut body = PushBody::default();
    let mut counts = Vec::new();
    let mut aliases = Vec::new();
    let mut exports = Vec::new();
    let mut stopped = Vec::new();
    let mut listed = Vec::new();
    for o in observations {
        match o {
            Observation::Gpu { gpu, .. } => body.gpus.push(gpu),
            Observation::Sample { sample, .. } => body.samples.push(sample),
            Observation::Allocation { allocation, .. } => body.allocations.push(allocation),
            Observation::HostGpuCount { gpus, provenance } => {
                counts.push((gpus, provenance.observed_at))
            }
            Observation::HostAlias {
                alias,
                host,
                provenance,
            } => aliases.push((alias, host, provenance.observed_at)),
            Observation::HostStopped {
                host,
                instance_id,
                at,
                ..
            } => stopped.push((host, instance_id, at)),
            Observation::InventoryList {
                uuids,
                hosts,
                provenance,
            } => listed.push((uuids, hosts, provenance.observed_at)),
            Observation::BillingExport {
                path,
                size_bytes,
                modified,
                ..
            } => exports.push((path, size_bytes, modified)),
        }
    }
    // Billing exports: each reconciled and kept; one that cannot be read fails the run (the
    // source shows the reason) after the others are stored.
    let mut failed = Vec::new();
    for (path, size, modified) in &exports {
        // Imported before and unchanged since: nothing to read. A file that failed to import
        // has no stamp, so the next run tries it again.
        let stamp = (*size as i64, modified.timestamp());
        let name = canonical(path).await;
        match store.billing_stamp(&name).await {
            Ok(Some(s)) if s == stamp => continue,
            Ok(_) => {}
            Err(e) => {
                failed.push(format!("{path}: {e}"));
                continue;
            }
        }
        match import_export(store, path, now, false).await {
            Ok(done) => tracing::info!(
                source = %principal.source,
                file = %path,
                unchanged = done.unchanged,
                matched = done.report.matched_lines,
                unmatched = done.report.unmatched.len(),
                problems = done.report.problems.len(),
                "billing export reconciled"
            ),
            Err(e) => failed.push(format!("{path}: {e}")),
        }
    }
    for (alias, host, at) in &aliases {
        store
            .observe_host_alias(principal, alias, host, *at)
            .await?;
    }
    for (gpus, at) in &counts {
        store.observe_host_gpu_count(principal, gpus, *at).await?;
    }
    for (host, instance, at) in &stopped {
        store
            .observe_host_stopped(principal, host, instance.as_deref(), *at)
            .await?;
    }
    // The same checks as a push: a collector's bad record is refused with its reason.
    let value = serde_json::to_value(&body)?;
    let serde_json::Value::Object(map) = value else {
        anyhow::bail!("observations did not serialize to an object");
    };
    let validated = TimeBounds::new(now, store.settings()).validate_collected(map);
    let outcome = store.ingest(principal, validated, now).await?;
    // After the list's own records are stored, so that what it lists counts as seen.
    for (uuids, hosts, at) in &listed {
        store
            .observe_inventory_list(principal, uuids, hosts, *at)
            .await?;
    }
    if !failed.is_empty() {
        anyhow::bail!(
            "{} billing export(s) could not be imported: {}",
            failed.len(),
            failed.join("; ")
        );
    }
    Ok(outcome)
}

/// Read a billing export file (plain or gzip) and reconcile it into the store, under its
/// canonical path (so one file reached by two paths is one export).
pub async fn import_export(
    store: &Store,
    path: &str,
    now: chrono::DateTime<chrono::Utc>,
    force: bool,
) -> anyhow::Result<gpuledger_store::BillingImport> {
    let name = canonical(path).await;
    let meta = tokio::fs::metadata(&name).await?;
    let stamp = meta.modified().ok().map(|m| {
        (
            meta.len() as i64,
            chrono::DateTime::<chrono::Utc>::from(m).timestamp(),
        )
    });
    let bytes = tokio::fs::read(&name).await?;
    let text = gpuledger_ledger::billing::read_export(&name, &bytes)?;
    Ok(store
        .import_billing_file(&name, &text, stamp, now, force)
        .await?)
}

/// A file's canonical path, or the path as given when it has none.
async fn canonical(path: &str) -> String {
    tokio::fs::canonicalize(path)
        .await
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.to_string())
}

/// A collector as configured: its entry, and the content of the file it reads only when it
/// starts (a kubeconfig), so that a reload can tell a rotated token from an unchanged file.
#[derive(Debug, Clone, PartialEq)]
struct Spec {
    entry: Entry,
    read_at_start: Option<Vec<u8>>,
}

impl Spec {
    fn of(entry: Entry) -> Spec {
        let read_at_start = entry.read_at_start().and_then(|p| std::fs::read(p).ok());
        Spec {
            entry,
            read_at_start,
        }
    }

    fn interval(&self) -> Duration {
        Duration::from_secs(self.entry.interval_secs)
    }
}

/// The collectors a config's `[[collectors]]` stand for: each `kubeconfig_dir` read, every
/// collector built as `serve` runs it.
pub struct Plan {
    collectors: Vec<(Spec, Box<dyn Collector>)>,
    /// Kubeconfig files left out, each naming the file and why; the others run.
    pub skipped: Vec<String>,
}

impl Plan {
    /// The collectors' entries, one per source, in config order.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.collectors.iter().map(|(s, _)| &s.entry)
    }
}

/// Read what `entries` stand for (see [`Entry::expand`]) and build every collector, as `serve`
/// runs them and `check-config` tries them. The error names every entry that could not be
/// read or built, every source name given twice, and every collector that reads a host
/// `allow` (`collector_hosts`) does not list; a bad file in a `kubeconfig_dir` is not an error
/// but a [`Plan::skipped`] line.
pub fn plan(entries: &[Entry], allow: &HostAllowList) -> anyhow::Result<Plan> {
    let mut collectors = Vec::with_capacity(entries.len());
    let mut skipped = Vec::new();
    let mut failed = Vec::new();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    for e in entries {
        let what = format!("collector `{}` ({})", e.name, e.kind());
        let expansion = match e.expand() {
            Ok(x) => x,
            Err(err) => {
                failed.push(format!("{what}: {err}"));
                continue;
            }
        };
        skipped.extend(expansion.skipped.iter().map(|s| format!("{what}: {s}")));
        for one in expansion.entries {
            if let Some(first) = names.insert(one.name.clone(), e.name.clone()) {
                failed.push(format!(
                    "{what}: source name `{}` is also given by entry `{first}`; names must differ",
                    one.name
                ));
                continue;
            }
            if let Err(err) = allow.check(&one) {
                failed.push(format!("collector `{}` ({}): {err}", one.name, one.kind()));
                continue;
            }
            match one.build() {
                Ok(c) => collectors.push((Spec::of(one), c)),
                Err(err) => {
                    failed.push(format!("collector `{}` ({}): {err}", one.name, one.kind()))
                }
            }
        }
    }
    if !failed.is_empty() {
        anyhow::bail!(
            "{} collector(s) could not be built:\n{}",
            failed.len(),
            failed.join("\n")
        );
    }
    Ok(Plan {
        collectors,
        skipped,
    })
}

/// Why a reload restarts a collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    EntryChanged,
    FileChanged,
    /// It had stopped on a configuration error: its cause may have been fixed outside
    /// gpuledger (RBAC applied, a file put in place), and a reload is the way to say so.
    WasStopped,
}

impl Why {
    fn text(self) -> &'static str {
        match self {
            Why::EntryChanged => "its entry changed",
            Why::FileChanged => "its kubeconfig changed",
            Why::WasStopped => "it had stopped on a configuration error",
        }
    }
}

/// What a reload does to one source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Start,
    Stop,
    Keep,
    Restart(Why),
}

/// What a reload does to one source, from what runs under its name (and whether it has
/// stopped) and what the config now says.
fn decide(running: Option<(&Spec, bool)>, wanted: Option<&Spec>) -> Action {
    match (running, wanted) {
        (None, _) => Action::Start,
        (Some(_), None) => Action::Stop,
        (Some((old, _)), Some(new)) if old.entry != new.entry => Action::Restart(Why::EntryChanged),
        (Some((old, _)), Some(new)) if old.read_at_start != new.read_at_start => {
            Action::Restart(Why::FileChanged)
        }
        (Some((_, true)), Some(_)) => Action::Restart(Why::WasStopped),
        (Some((_, false)), Some(_)) => Action::Keep,
    }
}

/// What one [`Pulls::apply`] did, by source name.
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    pub started: Vec<String>,
    pub stopped: Vec<String>,
    pub restarted: Vec<String>,
    pub unchanged: usize,
}

struct Running {
    spec: Spec,
    task: tokio::task::JoinHandle<CollectError>,
}

/// The collectors `serve` runs, by source name.
pub struct Pulls {
    store: Store,
    running: BTreeMap<String, Running>,
}

impl Pulls {
    pub fn new(store: Store) -> Pulls {
        Pulls {
            store,
            running: BTreeMap::new(),
        }
    }

    /// Make the running collectors those of `plan`: a new source starts, one no longer there
    /// stops, one whose entry or kubeconfig changed (or that had stopped on a configuration
    /// error) restarts, and every other one goes on untouched. Logs each change.
    pub async fn apply(&mut self, plan: Plan) -> Changes {
        let mut changes = Changes::default();
        let mut wanted: BTreeMap<String, (Spec, Box<dyn Collector>)> = plan
            .collectors
            .into_iter()
            .map(|(spec, c)| (spec.entry.name.clone(), (spec, c)))
            .collect();
        let names: std::collections::BTreeSet<String> =
            self.running.keys().chain(wanted.keys()).cloned().collect();
        for name in names {
            let new = wanted.remove(&name);
            let action = decide(
                self.running
                    .get(&name)
                    .map(|r| (&r.spec, r.task.is_finished())),
                new.as_ref().map(|(spec, _)| spec),
            );
            if action == Action::Keep {
                changes.unchanged += 1;
                continue;
            }
            if let Some(old) = self.running.remove(&name) {
                old.task.abort();
                let _ = old.task.await;
            }
            let Some((spec, collector)) = new else {
                tracing::info!(source = %name, "collector stopped: its entry is no longer in the config");
                changes.stopped.push(name);
                continue;
            };
            let (kind, interval_secs) = (spec.entry.kind(), spec.entry.interval_secs);
            if let Action::Restart(why) = action {
                tracing::info!(source = %name, kind = %kind, interval_secs, reason = why.text(), "collector restarted");
                changes.restarted.push(name.clone());
            } else {
                tracing::info!(source = %name, kind = %kind, interval_secs, "collector started");
                changes.started.push(name.clone());
            }
            let lease = lease(&self.store);
            let task = tokio::spawn(lead(self.store.clone(), collector, spec.interval(), lease));
            self.running.insert(name, Running { spec, task });
        }
        changes
    }
}

/// How often a follower tries the lease and the leader checks it, unless
/// `GPULEDGER_LEASE_RETRY_SECS` says otherwise (seconds, fractions allowed). It bounds the
/// failover after a leader dies.
const LEASE_RETRY: Duration = Duration::from_secs(5);

/// The server's metrics, where `serve` sets them: collector runs are counted there.
static METRICS: OnceLock<std::sync::Arc<gpuledger_web::Metrics>> = OnceLock::new();

/// Count collector runs on `metrics` (the server's `/metrics`) from now on.
pub fn count_runs_on(metrics: std::sync::Arc<gpuledger_web::Metrics>) {
    let _ = METRICS.set(metrics);
}

fn count_run(principal: &Principal, outcome: &str) {
    if let Some(m) = METRICS.get() {
        m.collector_run(&principal.source, &principal.kind, outcome);
    }
}

/// The process's lease, taken on the first collector's start: every collector of a replica
/// follows the same one.
static LEASE: OnceLock<Lease> = OnceLock::new();

/// The lease's retry interval: `GPULEDGER_LEASE_RETRY_SECS`, else [`LEASE_RETRY`].
fn lease_retry() -> Duration {
    let Ok(text) = std::env::var("GPULEDGER_LEASE_RETRY_SECS") else {
        return LEASE_RETRY;
    };
    match text.trim().parse::<f64>() {
        Ok(secs) if secs > 0.0 && secs.is_finite() => Duration::from_secs_f64(secs),
        _ => {
            tracing::warn!(value = %text, default_secs = LEASE_RETRY.as_secs(), "GPULEDGER_LEASE_RETRY_SECS is not a positive number of seconds; using the default");
            LEASE_RETRY
        }
    }
}

/// The process's lease, started (with a task that logs its changes) on the first call.
pub(crate) fn lease(store: &Store) -> Lease {
    LEASE
        .get_or_init(|| {
            let retry = lease_retry();
            let lease = store.lease(retry);
            // On SQLite the lease never changes hands: nothing to tell.
            if store.backend() == gpuledger_store::Backend::Postgres {
                let mut watch = lease.clone();
                tokio::spawn(async move {
                    tracing::info!(retry_ms = retry.as_millis() as u64, "pull collectors wait for the lease: one replica on this database runs them");
                    loop {
                        watch.wait_for(true).await;
                        tracing::info!("leading: the pull collectors run in this replica");
                        watch.wait_for(false).await;
                        tracing::info!("following: the pull collectors stopped here; another replica may take them over");
                    }
                });
            }
            lease
        })
        .clone()
}

/// Run one collector (see [`run`]) whenever `lease` is held, stopping it when the lease is lost
/// (a run cut short stores nothing more; the next leader's first run collects afresh); returns
/// the error of a configuration found wrong.
async fn lead(
    store: Store,
    collector: Box<dyn Collector>,
    interval: Duration,
    mut lease: Lease,
) -> CollectError {
    loop {
        lease.wait_for(true).await;
        tokio::select! {
            stopped = run(&store, &*collector, interval) => return stopped,
            () = lease.wait_for(false) => {
                tracing::debug!(source = %collector.name(), "collector stopped: the lease was lost");
            }
        }
    }
}

/// Run one collector until its configuration is found wrong: first a backfill since the
/// source's last success when it has been down for more than two intervals (collectors that
/// keep history, e.g. Prometheus), then on its interval when healthy, with exponential backoff
/// (up to ten intervals) after failures that may pass. An error that is not retryable (a bad
/// URL, a missing credentials file, a 4xx) stops it: retrying would only repeat the error, so
/// the sources page and the log say what to fix, and the other collectors go on. Returns that
/// error.
pub async fn run(store: &Store, collector: &dyn Collector, interval: Duration) -> CollectError {
    let principal = Principal {
        source: collector.name().to_string(),
        teams: None,
        kind: collector.kind().to_string(),
    };
    let mut failures: u32 = 0;
    // After downtime, fill the gap from the source's history where it keeps one.
    let since = store
        .sources(chrono::Utc::now())
        .await
        .ok()
        .and_then(|all| all.into_iter().find(|s| s.name == principal.source))
        .and_then(|s| s.last_success)
        .filter(|t| {
            chrono::Utc::now() - *t > chrono::Duration::from_std(interval * 2).unwrap_or_default()
        });
    if let Some(since) = since {
        if let Some(backfill) = collector.backfill(since) {
            let now = chrono::Utc::now();
            match backfill.await {
                Ok(report) => {
                    let n = report.observations.len();
                    match store_observations(store, &principal, report.observations, now).await {
                        Ok(_) => {
                            tracing::info!(source = %principal.source, since = %since, observations = n, "backfilled after downtime")
                        }
                        Err(e) => {
                            tracing::warn!(source = %principal.source, error = %e, "backfill could not be stored")
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(source = %principal.source, error = %e, "backfill failed")
                }
            }
        }
    }
    loop {
        let now = chrono::Utc::now();
        let mut partly = false;
        let result = match collector.collect_report().await {
            Ok(report) => {
                // Parts that failed are named on the sources page; what worked is kept.
                if let Some(first) = report.problems.first() {
                    partly = true;
                    let msg = format!("{} part(s) failed; first: {first}", report.problems.len());
                    tracing::warn!(source = %principal.source, problems = report.problems.len(), first = %first, "collector run partly failed");
                    record_error(store, &principal, &msg, now).await;
                }
                store_observations(store, &principal, report.observations, now).await
            }
            Err(e) if !e.is_retryable() => {
                tracing::error!(source = %principal.source, kind = %principal.kind, error = %e, "collector stopped: its configuration is wrong; fix it and reload gpuledger (systemctl reload gpuledger, or kill -HUP its pid)");
                let msg = format!("stopped: {e}; {FIX_AND_RELOAD}");
                record_error(store, &principal, &msg, now).await;
                count_run(&principal, "stopped");
                return e;
            }
            Err(e) => Err(e.into()),
        };
        match result {
            Ok(outcome) => {
                failures = 0;
                count_run(&principal, if partly { "partial" } else { "ok" });
                tracing::debug!(
                    source = %principal.source,
                    gpus = outcome.accepted.gpus,
                    samples = outcome.accepted.samples,
                    rejected = outcome.rejected.len(),
                    "collector run stored"
                );
            }
            Err(e) => {
                failures += 1;
                count_run(&principal, "failed");
                tracing::warn!(source = %principal.source, kind = %principal.kind, error = %e, failures, "collector run failed");
                record_error(store, &principal, &e.to_string(), now).await;
            }
        }
        let wait = interval * 2u32.saturating_pow(failures.min(4)).min(10);
        tokio::time::sleep(wait).await;
    }
}

/// What the sources page says to do about a collector stopped on a configuration error.
const FIX_AND_RELOAD: &str = "fix this collector's [[collectors]] entry (or what it names) and \
     reload gpuledger: systemctl reload gpuledger, or kill -HUP its pid";

/// Mark the source `error` with `msg` on the sources page, cut to
/// [`gpuledger_ledger::MESSAGE_CHARS`]: every viewer reads it, whatever the source answered.
async fn record_error(
    store: &Store,
    principal: &Principal,
    msg: &str,
    now: chrono::DateTime<chrono::Utc>,
) {
    let msg = gpuledger_ledger::clip(msg, gpuledger_ledger::MESSAGE_CHARS);
    if let Err(e) = store
        .record_source_error(&principal.source, &principal.kind, &msg, now)
        .await
    {
        tracing::warn!(source = %principal.source, error = %e, "could not record the collector's error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::{HostGpus, Provenance, PushGpu, PushSample};

    #[tokio::test]
    async fn observations_take_the_push_path_and_counts_make_placeholders() {
        let dir = std::env::temp_dir().join(format!("gpuledger-pull-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = Store::open(
            &format!("sqlite://{}/p.db", dir.display()),
            Default::default(),
        )
        .await
        .unwrap();
        let now = chrono::Utc::now();
        let prov = Provenance {
            source: "k".into(),
            observed_at: now,
            raw_key: None,
        };
        let gpu = PushGpu {
            account: None,
            uuid: "GPU-1".into(),
            model: "NVIDIA L4".into(),
            memory_mib: None,
            host: Some("n1".into()),
            cluster: None,
            cloud: None,
            region: None,
            instance_type: None,
            serial: None,
            pci_bus_id: None,
            mig_parent_uuid: None,
            mig_profile: None,
            labels: Default::default(),
            observed_at: now,
        };
        let good = PushSample {
            gpu_uuid: "GPU-1".into(),
            ts: now,
            util_pct: Some(50.0),
            mem_used_mib: None,
            power_w: None,
            sm_active: None,
        };
        let bad = PushSample {
            util_pct: Some(250.0),
            ..good.clone()
        };
        let obs = vec![
            Observation::Gpu {
                gpu,
                provenance: prov.clone(),
            },
            Observation::Sample {
                sample: good,
                provenance: prov.clone(),
            },
            Observation::Sample {
                sample: bad,
                provenance: prov.clone(),
            },
            Observation::HostGpuCount {
                gpus: HostGpus {
                    host: "n2".into(),
                    count: 2,
                    model: Some("NVIDIA L4".into()),
                    ..Default::default()
                },
                provenance: prov,
            },
        ];
        let who = Principal {
            source: "k".into(),
            teams: None,
            kind: "kubernetes".into(),
        };
        let out = store_observations(&store, &who, obs, now).await.unwrap();
        assert_eq!((out.accepted.gpus, out.accepted.samples), (1, 1));
        assert_eq!(out.rejected[0].path, "samples[1].util_pct");
        let gpus = store
            .list_gpus(&Default::default(), false, now)
            .await
            .unwrap();
        assert_eq!(gpus.len(), 3);
        assert_eq!(gpus.iter().filter(|g| g.placeholder).count(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod billing_exports {
    use super::*;
    use gpuledger_model::Provenance;

    /// An export that cannot be imported fails the run (the source shows why) and is tried
    /// again on the next run; once imported, the same file with the same size and time is not
    /// read again.
    #[tokio::test]
    async fn a_failed_export_is_retried_and_an_imported_one_skipped() {
        let dir = std::env::temp_dir().join(format!("gpuledger-pull-bill-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = Store::open(
            &format!("sqlite://{}/p.db", dir.display()),
            Default::default(),
        )
        .await
        .unwrap();
        let who = Principal {
            source: "focus".into(),
            teams: None,
            kind: "billing".into(),
        };
        let file = dir.join("nov.csv");
        let observe = |file: &std::path::Path| {
            let meta = std::fs::metadata(file).unwrap();
            vec![Observation::BillingExport {
                path: file.display().to_string(),
                size_bytes: meta.len(),
                modified: meta.modified().unwrap().into(),
                provenance: Provenance {
                    source: "focus".into(),
                    observed_at: chrono::Utc::now(),
                    raw_key: None,
                },
            }]
        };
        std::fs::write(&file, "not,a,focus,file\n1,2,3,4\n").unwrap();
        let err = store_observations(&store, &who, observe(&file), chrono::Utc::now())
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("1 billing export(s) could not be imported")
                && err.to_string().contains("ChargePeriodStart"),
            "{err}"
        );
        assert!(store.billing_files().await.unwrap().is_empty());
        // Fixed: the next run imports it.
        std::fs::write(
            &file,
            "ChargePeriodStart,BilledCost,EffectiveCost,ResourceId,ChargeDescription\n\
             2026-11-02T00:00:00Z,9,9,i-0zzz,g5.xlarge Instance Hour\n",
        )
        .unwrap();
        store_observations(&store, &who, observe(&file), chrono::Utc::now())
            .await
            .unwrap();
        assert_eq!(store.billing_files().await.unwrap().len(), 1);
        // The same size and time: not read again (garbage of the same length with the old
        // time goes unnoticed, as an unchanged file would).
        let meta = std::fs::metadata(&file).unwrap();
        std::fs::write(&file, "x".repeat(meta.len() as usize)).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(meta.modified().unwrap())
            .unwrap();
        store_observations(&store, &who, observe(&file), chrono::Utc::now())
            .await
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod runner {
    use super::*;
    use gpuledger_collect::CollectFuture;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// A source that fails every run with the same error, counting its runs.
    struct Failing {
        name: &'static str,
        error: fn() -> CollectError,
        runs: Arc<AtomicU32>,
    }

    impl Collector for Failing {
        fn kind(&self) -> &'static str {
            "dcgm"
        }

        fn name(&self) -> &str {
            self.name
        }

        fn collect(&self) -> CollectFuture<'_> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            let error = (self.error)();
            Box::pin(async move { Err(error) })
        }
    }

    /// Regression: a collector whose configuration was wrong retried forever on its interval
    /// with a warning each time. Now a configuration error stops it after one run, with the
    /// reason on the sources page, while a collector with a passing failure keeps retrying.
    #[tokio::test]
    async fn a_config_error_stops_its_collector_instead_of_retrying_forever() {
        let dir = std::env::temp_dir().join(format!("gpuledger-pull-run-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = Store::open(
            &format!("sqlite://{}/p.db", dir.display()),
            Default::default(),
        )
        .await
        .unwrap();
        let interval = Duration::from_millis(10);

        let bad_runs = Arc::new(AtomicU32::new(0));
        let bad = Failing {
            name: "bad-url",
            error: || CollectError::Config("endpoints[0]: `nope` is not a URL".into()),
            runs: bad_runs.clone(),
        };
        let flaky_runs = Arc::new(AtomicU32::new(0));
        let flaky = Failing {
            name: "flaky",
            error: || CollectError::Transient("connection refused".into()),
            runs: flaky_runs.clone(),
        };
        let flaky = tokio::spawn({
            let store = store.clone();
            async move { run(&store, &flaky, interval).await }
        });

        let stopped = tokio::time::timeout(Duration::from_secs(10), run(&store, &bad, interval))
            .await
            .expect("a configuration error stops the collector");
        assert!(matches!(stopped, CollectError::Config(_)), "{stopped:?}");
        assert_eq!(bad_runs.load(Ordering::SeqCst), 1, "not retried");
        let sources = store.sources(chrono::Utc::now()).await.unwrap();
        let shown = sources.iter().find(|s| s.name == "bad-url").unwrap();
        let error = shown.last_error.as_deref().unwrap_or_default();
        assert!(
            error.starts_with("stopped: endpoints[0]: `nope` is not a URL")
                && error.ends_with(
                    "reload gpuledger: systemctl reload gpuledger, or kill -HUP its pid"
                ),
            "{error}"
        );

        // The other collector goes on, retrying its passing failure.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while flaky_runs.load(Ordering::SeqCst) < 3 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "a retryable error is retried"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!flaky.is_finished());
        flaky.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod reconcile {
    use super::*;

    fn entry(text: &str) -> Entry {
        let doc: toml_edit::DocumentMut = text.parse().unwrap();
        Entry::parse(doc.as_table()).unwrap()
    }

    /// A dcgm entry whose endpoint refuses connections: a passing failure, so it keeps running.
    fn dcgm(name: &str, interval_secs: u64) -> Entry {
        entry(&format!(
            "type = \"dcgm\"\nname = \"{name}\"\ninterval_secs = {interval_secs}\nendpoints = [\"http://127.0.0.1:9/metrics\"]\n"
        ))
    }

    fn plan_of(entries: &[Entry]) -> Plan {
        plan(entries, &HostAllowList::default()).unwrap()
    }

    #[test]
    fn a_collector_reading_a_host_outside_collector_hosts_is_refused() {
        let only = |host: &str| HostAllowList::parse(&[host.to_string()]).unwrap();
        let err = plan(&[dcgm("d", 60)], &only("prom.internal"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("collector `d` (dcgm)")
                && err.contains("`127.0.0.1`")
                && err.contains("collector_hosts"),
            "{err}"
        );
        assert!(plan(&[dcgm("d", 60)], &only("127.0.0.0/8")).is_ok());
    }

    /// The task of each running source: the same task is a collector left alone.
    fn tasks(p: &Pulls) -> BTreeMap<String, tokio::task::Id> {
        p.running
            .iter()
            .map(|(n, r)| (n.clone(), r.task.id()))
            .collect()
    }

    #[test]
    fn a_reload_decides_per_source() {
        let a = Spec {
            entry: dcgm("a", 60),
            read_at_start: None,
        };
        let slower = Spec {
            entry: dcgm("a", 120),
            ..a.clone()
        };
        let rotated = Spec {
            read_at_start: Some(b"token: new".to_vec()),
            ..a.clone()
        };
        assert_eq!(decide(None, Some(&a)), Action::Start);
        assert_eq!(decide(Some((&a, false)), None), Action::Stop);
        assert_eq!(decide(Some((&a, false)), Some(&a)), Action::Keep);
        assert_eq!(
            decide(Some((&a, false)), Some(&slower)),
            Action::Restart(Why::EntryChanged)
        );
        assert_eq!(
            decide(Some((&a, false)), Some(&rotated)),
            Action::Restart(Why::FileChanged)
        );
        assert_eq!(
            decide(Some((&a, true)), Some(&a)),
            Action::Restart(Why::WasStopped)
        );
    }

    /// Sources in both configs keep their task; added ones start, removed
    /// ones stop (their task ends), changed ones restart, and one stopped on a configuration
    /// error starts again.
    #[tokio::test]
    async fn apply_starts_stops_and_restarts_only_what_changed() {
        let dir = std::env::temp_dir().join(format!("gpuledger-pull-apply-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = Store::open(
            &format!("sqlite://{}/p.db", dir.display()),
            Default::default(),
        )
        .await
        .unwrap();
        let mut pulls = Pulls::new(store);
        let missing = dir.join("exports");
        let billing = entry(&format!(
            "type = \"billing\"\nname = \"focus\"\ndir = \"{}\"\n",
            missing.display()
        ));

        let first = pulls
            .apply(plan_of(&[dcgm("a", 60), dcgm("b", 60), billing.clone()]))
            .await;
        assert_eq!(first.started, ["a", "b", "focus"]);
        let before = tasks(&pulls);
        // The billing folder is missing: a configuration error stops that collector.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !pulls.running["focus"].task.is_finished() {
            assert!(tokio::time::Instant::now() < deadline, "focus did not stop");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        std::fs::create_dir_all(&missing).unwrap();

        let second = pulls
            .apply(plan_of(&[
                dcgm("a", 60),
                dcgm("b", 120),
                dcgm("c", 60),
                billing.clone(),
            ]))
            .await;
        assert_eq!(
            second,
            Changes {
                started: vec!["c".into()],
                stopped: vec![],
                restarted: vec!["b".into(), "focus".into()],
                unchanged: 1,
            }
        );
        let after = tasks(&pulls);
        assert_eq!(after["a"], before["a"], "a is left alone");
        assert_ne!(after["b"], before["b"]);
        assert!(!pulls.running["focus"].task.is_finished());

        let a_task = pulls.running["a"].task.abort_handle();
        let third = pulls.apply(plan_of(&[dcgm("c", 60)])).await;
        assert_eq!(third.stopped, ["a", "b", "focus"]);
        assert_eq!(third.unchanged, 1);
        assert!(a_task.is_finished(), "a removed source's task ends");
        assert_eq!(pulls.running.keys().collect::<Vec<_>>(), ["c"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Two entries that would run under one source name are refused, naming both.
    #[test]
    fn a_plan_refuses_one_source_name_twice() {
        let dir = std::env::temp_dir().join(format!("gpuledger-pull-dup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("rdu.kubeconfig"),
            "current-context: x\nclusters:\n- name: c\n  cluster:\n    server: https://rdu\ncontexts:\n- name: x\n  context:\n    cluster: c\n",
        )
        .unwrap();
        let k8s = entry(&format!(
            "type = \"kubernetes\"\nname = \"k8s\"\nkubeconfig_dir = \"{}\"\n",
            dir.display()
        ));
        let literal = entry("type = \"kubernetes\"\nname = \"k8s-rdu\"\nkubeconfig = \"/k\"\n");
        let err = plan(&[literal, k8s], &HostAllowList::default())
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("collector `k8s` (kubernetes): source name `k8s-rdu` is also given by entry `k8s-rdu`"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
