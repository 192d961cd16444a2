//! gpuledger's node agent: reads the GPUs of one host (NVIDIA through NVML or `nvidia-smi`, AMD
//! through `amd-smi` or `rocm-smi`, Intel Gaudi through `hl-smi`) and pushes inventory, samples
//! and process allocations to a gpuledger server over the push API v1, buffering on disk
//! whatever the server has not acknowledged.
//!
//! It is built to be obviously harmless: read-only on the GPU, outbound HTTPS only, one thread,
//! a few MiB of memory, and every byte it would send printable with `--once --dry-run`.
//!
//! Map: [`config`] resolves flags, environment and config file; [`source`] reads GPUs;
//! [`procs`] names the processes on them; [`report`] turns reads into bodies; [`buffer`] is the
//! disk queue; [`send`] talks HTTP and decides what an answer means; [`run`] is the loop.

pub mod buffer;
pub mod config;
pub mod metadata;
pub mod procs;
pub mod report;
pub mod send;
pub mod source;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use gpuledger_model::PushBody;
use rand::Rng;

pub use config::{AgentArgs, Settings};

use buffer::Queue;
use procs::ProcReader;
use report::{NoProcs, OpenAllocation, ProcLookup, Reporter};
use send::{Backoff, Outcome, Sender};
use source::{smi::Smi, Reader, Tools};

/// One request carries at most this much buffered JSON when catching up after an outage.
const MAX_BATCH_BYTES: u64 = 256 * 1024;
/// ... and at most this many buffered bodies.
const MAX_BATCH_BODIES: usize = 120;
/// `--once` gives up after this many failed attempts and leaves the body buffered.
const ONCE_ATTEMPTS: u32 = 4;
/// The file that remembers running allocations across restarts, in the buffer directory.
const OPEN_ALLOCATIONS_FILE: &str = "open-allocations.json";

/// Run the agent until it fails to start (or, with `--once`, after one read).
pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&args)?;
    Agent::start(settings)?.run()
}

/// Where bodies go.
enum Output {
    /// `--dry-run`: printed to stdout.
    Print,
    /// Buffered on disk, then sent.
    Send(Box<Delivery>),
}

struct Delivery {
    queue: Queue,
    sender: Sender,
    backoff: Backoff,
    next_attempt: Instant,
    /// After a 400/413 on a merged batch, send bodies one at a time until the queue empties.
    one_at_a_time: bool,
    /// Failed attempts since the last success, for the log.
    failures: u32,
    last_error: Option<String>,
    /// Bodies the server refused for good (400, 413, 415, 422, a 403 naming records): logged
    /// and dropped, never retried; `--once` then exits non-zero.
    refused: u32,
    state_file: PathBuf,
}

struct Agent {
    settings: Settings,
    reader: Reader,
    reporter: Reporter,
    procs: Box<dyn ProcLookup>,
    output: Output,
}

fn merge(bodies: Vec<PushBody>) -> PushBody {
    let mut out = PushBody::default();
    let mut sample_keys = BTreeSet::new();
    for b in bodies {
        for g in b.gpus {
            out.gpus.retain(|x| x.uuid != g.uuid);
            out.gpus.push(g);
        }
        for s in b.samples {
            if sample_keys.insert((s.gpu_uuid.clone(), s.ts)) {
                out.samples.push(s);
            }
        }
        for a in b.allocations {
            // A later report of the same allocation (its end) replaces the earlier one.
            out.allocations.retain(|x| {
                (x.gpu_uuid.as_str(), x.workload.as_str(), x.start)
                    != (a.gpu_uuid.as_str(), a.workload.as_str(), a.start)
            });
            out.allocations.push(a);
        }
    }
    out
}

impl Agent {
    fn start(mut settings: Settings) -> anyhow::Result<Agent> {
        if let Some(url) = &settings.cloud_metadata {
            match metadata::discover(url, std::time::Duration::from_secs(1)) {
                Some(i) => {
                    tracing::info!(instance = %i.instance_id, cloud = ?i.cloud, "cloud instance");
                    i.fill(&mut settings.host);
                }
                None => tracing::debug!("no cloud instance metadata service answered"),
            }
        }
        let tools = Tools {
            nvidia_smi: Smi::new(&settings.nvidia_smi, "--nvidia-smi"),
            amd_smi: Smi::new(&settings.amd_smi, "--amd-smi"),
            rocm_smi: Smi::new(&settings.rocm_smi, "--rocm-smi"),
            hl_smi: Smi::new(&settings.hl_smi, "--hl-smi"),
            host: settings.host.host.clone(),
        };
        let reader = Reader::open(settings.source, &tools)?;
        for (kind, what) in reader.sources() {
            tracing::info!(
                source = %kind,
                requested = %settings.source,
                "reading GPUs through {what}"
            );
        }
        let mut reporter = Reporter::new(
            settings.host.clone(),
            settings.inventory_secs,
            settings.processes,
        );
        let procs: Box<dyn ProcLookup> = if settings.processes {
            Box::new(ProcReader::new(
                settings.proc_root.clone(),
                settings.passwd_file.clone(),
            ))
        } else {
            Box::new(NoProcs)
        };
        let output = if settings.dry_run {
            Output::Print
        } else {
            let queue = Queue::open(&settings.buffer_dir, settings.buffer_max_bytes)?;
            let sender = Sender::new(
                settings.server.as_deref().unwrap_or_default(),
                settings.token.as_deref().unwrap_or_default(),
                settings.ca_file.as_deref(),
            )?;
            let state_file = settings.buffer_dir.join(OPEN_ALLOCATIONS_FILE);
            if let Ok(text) = std::fs::read_to_string(&state_file) {
                match serde_json::from_str::<Vec<OpenAllocation>>(&text) {
                    Ok(open) => reporter.restore_open(open),
                    Err(e) => {
                        tracing::warn!(file = %state_file.display(), error = %e, "ignoring an unreadable state file")
                    }
                }
            }
            tracing::info!(
                server = sender.url(),
                interval_secs = settings.interval_secs,
                buffer_dir = %queue.dir().display(),
                buffered_bodies = queue.len(),
                "sending to gpuledger"
            );
            Output::Send(Box::new(Delivery {
                queue,
                sender,
                backoff: Backoff::new(
                    Duration::from_secs(1),
                    Duration::from_secs(settings.retry_max_secs),
                ),
                next_attempt: Instant::now(),
                one_at_a_time: false,
                failures: 0,
                last_error: None,
                refused: 0,
                state_file,
            }))
        };
        Ok(Agent {
            settings,
            reader,
            reporter,
            procs,
            output,
        })
    }

    /// Read once and hand the body to the output. Returns false when nothing was read.
    fn read_once(&mut self) -> anyhow::Result<bool> {
        let Some(ts) = self.reporter.sample_time(Utc::now()) else {
            return Ok(false);
        };
        let snap = match self.reader.read() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(source = %self.reader, error = %e, "could not read the GPUs; no samples this interval (unknown, not zero)");
                return Ok(false);
            }
        };
        if snap.gpus.is_empty() {
            tracing::warn!(source = %self.reader, "no GPUs found");
        }
        let body = self.reporter.build(&snap, self.procs.as_mut(), ts);
        let json = serde_json::to_vec(&body).context("could not encode the body as JSON")?;
        match &mut self.output {
            Output::Print => {
                let mut out = std::io::stdout().lock();
                out.write_all(&json)?;
                out.write_all(b"\n")?;
                out.flush()?;
            }
            Output::Send(d) => {
                if !body.is_empty() {
                    if let Err(e) = d.queue.push(&json) {
                        // Without the buffer the body can still go out now; it is lost only if
                        // this one attempt fails too. Crashing would lose the next reads as well.
                        tracing::error!(
                            buffer_dir = %d.queue.dir().display(),
                            error = %e,
                            "could not write to the disk buffer (check free space and permissions); sending this read unbuffered"
                        );
                        match d.sender.send(&json) {
                            Outcome::Delivered(_) => {}
                            other => {
                                tracing::error!(outcome = ?other, "the unbuffered read was not delivered and is lost")
                            }
                        }
                    }
                }
                if let Some(open) = self.reporter.take_open_if_changed() {
                    save_open(&d.state_file, &open);
                }
            }
        }
        Ok(true)
    }

    fn run(mut self) -> anyhow::Result<()> {
        let interval = Duration::from_secs(self.settings.interval_secs);
        self.read_once()?;
        if self.settings.once {
            return self.flush_once();
        }
        // Each agent reads at its own random phase of the interval, so that a fleet started
        // together does not report in the same second.
        let phase = interval.mul_f64(rand::rng().random::<f64>());
        let started = Instant::now();
        let tick = |k: u32| started + phase + interval * k;
        let mut k = 0u32;
        loop {
            while tick(k) <= Instant::now() {
                k += 1;
            }
            let next_read = tick(k);
            if let Output::Send(d) = &mut self.output {
                deliver(d, &mut self.reporter, Some(next_read));
            }
            let wake = match &self.output {
                Output::Send(d) if !d.queue.is_empty() => d.next_attempt.min(next_read),
                _ => next_read,
            };
            let now = Instant::now();
            if wake > now {
                std::thread::sleep(wake - now);
            }
            if Instant::now() >= next_read {
                self.read_once()?;
            }
        }
    }

    /// `--once`: try to deliver everything buffered a few times, then give up loudly.
    fn flush_once(&mut self) -> anyhow::Result<()> {
        let Output::Send(d) = &mut self.output else {
            return Ok(());
        };
        loop {
            deliver(d, &mut self.reporter, None);
            if d.queue.is_empty() && d.refused > 0 {
                anyhow::bail!(
                    "the server refused {} bodies for good (their reasons are logged above); they \
                     were dropped, as sending them again would be refused again",
                    d.refused
                );
            }
            if d.queue.is_empty() {
                return Ok(());
            }
            if d.failures >= ONCE_ATTEMPTS {
                anyhow::bail!(
                    "could not deliver after {} attempts ({}); the unsent data ({} bodies) stays in {} and goes out with the next run",
                    d.failures,
                    d.last_error.as_deref().unwrap_or("no answer"),
                    d.queue.len(),
                    d.queue.dir().display()
                );
            }
            let now = Instant::now();
            if d.next_attempt > now {
                std::thread::sleep(d.next_attempt - now);
            }
        }
    }
}

fn save_open(path: &std::path::Path, open: &[OpenAllocation]) {
    let tmp = path.with_extension("json.tmp");
    let result = serde_json::to_vec(open)
        .map_err(std::io::Error::other)
        .and_then(|bytes| std::fs::write(&tmp, bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = result {
        tracing::warn!(file = %path.display(), error = %e, "could not save running allocations; after a restart they are reported again");
    }
}

/// Send buffered bodies, oldest first, until the queue is empty, an attempt fails, or `until`.
fn deliver(d: &mut Delivery, reporter: &mut Reporter, until: Option<Instant>) {
    while !d.queue.is_empty() && Instant::now() >= d.next_attempt {
        if until.is_some_and(|u| Instant::now() >= u) {
            return;
        }
        let max_bodies = if d.one_at_a_time { 1 } else { MAX_BATCH_BODIES };
        let batch = d.queue.peek(MAX_BATCH_BYTES, max_bodies);
        let mut seqs = Vec::with_capacity(batch.len());
        let mut bodies = Vec::with_capacity(batch.len());
        for (seq, bytes) in batch {
            match serde_json::from_slice::<PushBody>(&bytes) {
                Ok(b) => {
                    seqs.push(seq);
                    bodies.push(b);
                }
                Err(e) => {
                    tracing::warn!(seq, error = %e, "a buffered body is not valid JSON; dropping it");
                    d.queue.ack(&[seq]);
                }
            }
        }
        if bodies.is_empty() {
            continue;
        }
        let body = merge(bodies);
        let json = match serde_json::to_vec(&body) {
            Ok(j) => j,
            Err(e) => {
                tracing::error!(error = %e, "could not encode a merged body; dropping it");
                d.queue.ack(&seqs);
                continue;
            }
        };
        match d.sender.send(&json) {
            Outcome::Delivered(reply) => {
                if d.failures > 0 {
                    tracing::info!(
                        failed_attempts = d.failures,
                        buffered_bodies = d.queue.len(),
                        "server reachable again; sending the buffered backlog"
                    );
                }
                d.failures = 0;
                d.last_error = None;
                d.backoff.reset();
                tracing::debug!(
                    bodies = seqs.len(),
                    samples = reply.accepted.samples,
                    duplicate_samples = reply.duplicates.samples,
                    "delivered"
                );
                for r in reply.rejected.iter().take(10) {
                    tracing::warn!(path = %r.path, reason = %r.reason, "the server refused a record");
                }
                repair_unknown_gpus(d, reporter, &body, &reply);
                d.queue.ack(&seqs);
            }
            Outcome::Refused {
                status,
                too_large,
                reply,
                message,
            } => {
                if seqs.len() > 1 {
                    tracing::warn!(status, bodies = seqs.len(), error = %message, "the server refused a merged batch; sending the bodies one at a time");
                    d.one_at_a_time = true;
                    continue;
                }
                // Records of GPUs the server forgot are sent again with their inventory; a body
                // refused for that alone is repaired, not lost.
                let repaired = repair_unknown_gpus(d, reporter, &body, &reply);
                if !(repaired && reply.rejected.iter().all(send::Rejected::is_unknown_gpu)) {
                    d.refused += 1;
                }
                tracing::error!(
                    status,
                    too_large,
                    error = %message,
                    reasons = ?reply.rejected.iter().take(10).map(|r| format!("{}: {}", r.path, r.reason)).collect::<Vec<_>>(),
                    "the server refused a body for good; dropping it (it would be refused again)"
                );
                d.queue.ack(&seqs);
            }
            Outcome::Retry { reason, after } => {
                d.failures += 1;
                let wait = d.backoff.next(after, rand::rng().random::<f64>());
                // The first failure, then one line a minute or so at the longest waits.
                if d.failures == 1 || d.failures & 7 == 0 {
                    tracing::warn!(
                        error = %reason,
                        failed_attempts = d.failures,
                        retry_in_secs = wait.as_secs_f64(),
                        buffered_bodies = d.queue.len(),
                        buffered_bytes = d.queue.total_bytes(),
                        dropped_bodies = d.queue.dropped(),
                        "could not deliver; keeping the data buffered"
                    );
                }
                d.last_error = Some(reason);
                d.next_attempt = Instant::now() + wait;
                return;
            }
        }
        if d.queue.is_empty() {
            d.one_at_a_time = false;
        }
    }
}

/// When the server refused samples or allocations because it does not know their GPU (its
/// database was reset, or the inventory body was dropped from a full buffer), send the
/// inventory again together with exactly those records, ahead of everything else. True when
/// such a repair body was queued.
fn repair_unknown_gpus(
    d: &mut Delivery,
    reporter: &mut Reporter,
    body: &PushBody,
    reply: &send::Reply,
) -> bool {
    let mut fix = PushBody::default();
    let mut uuids = BTreeSet::new();
    for r in reply.rejected.iter().filter(|r| r.is_unknown_gpu()) {
        match r.record() {
            Some(("samples", i)) => {
                if let Some(s) = body.samples.get(i) {
                    uuids.insert(s.gpu_uuid.clone());
                    fix.samples.push(s.clone());
                }
            }
            Some(("allocations", i)) => {
                if let Some(a) = body.allocations.get(i) {
                    uuids.insert(a.gpu_uuid.clone());
                    fix.allocations.push(a.clone());
                }
            }
            _ => {}
        }
    }
    // If the body already carried those GPUs, sending them again would not help.
    uuids.retain(|u| !body.gpus.iter().any(|g| &g.uuid == u));
    if uuids.is_empty() {
        return false;
    }
    fix.gpus = reporter.inventory_for(uuids.iter().map(String::as_str));
    reporter.force_inventory();
    if fix.gpus.is_empty() {
        return false;
    }
    tracing::info!(
        gpus = fix.gpus.len(),
        samples = fix.samples.len(),
        allocations = fix.allocations.len(),
        "the server did not know some GPUs; re-sending their inventory with the refused records"
    );
    match serde_json::to_vec(&fix) {
        Ok(json) => match d.queue.push_front(&json) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, "could not buffer the repair body");
                false
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "could not encode the repair body");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::{AllocationKind, PushAllocation, PushSample};

    #[test]
    fn merge_keeps_order_dedups_and_lets_later_allocation_reports_win() {
        let t0 = "2026-12-02T10:00:00Z".parse().unwrap();
        let t1 = "2026-12-02T10:01:00Z".parse().unwrap();
        let s = |ts| PushSample {
            gpu_uuid: "GPU-a".into(),
            ts,
            util_pct: Some(1.0),
            mem_used_mib: None,
            power_w: None,
            sm_active: None,
        };
        let a = |end| PushAllocation {
            context: Default::default(),
            gpu_uuid: "GPU-a".into(),
            start: t0,
            end,
            workload: "pid=1".into(),
            kind: AllocationKind::Process,
            user: None,
            team: None,
            owner: None,
            avg_util_pct: None,
            avg_mem_used_mib: None,
        };
        let merged = merge(vec![
            PushBody {
                samples: vec![s(t0)],
                allocations: vec![a(None)],
                ..Default::default()
            },
            PushBody {
                samples: vec![s(t0), s(t1)],
                allocations: vec![a(Some(t1))],
                ..Default::default()
            },
        ]);
        assert_eq!(merged.samples.len(), 2);
        assert_eq!(merged.allocations, vec![a(Some(t1))]);
    }
}
