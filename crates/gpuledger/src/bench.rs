//! `gpuledger bench`: a synthetic fleet of any size loaded through the real ingest path, then
//! every page and API endpoint timed from a client on the same machine. The figures in
//! `docs/benchmarks.md` come from it. It measures; it asserts nothing about time.
//!
//! The fleet is the demo's, copied as many times as the size asks (the same mix of clouds,
//! clusters, teams, environments, MIG instances, allocations, idle and unmeasured GPUs), with
//! one sample per GPU and hour.
//!
//! Besides the pages it measures freshness (how long a pushed sample takes to show in the
//! summary), can stream current samples through `POST /api/v1/ingest` over HTTP as a live
//! fleet pushes them and report the samples per second (`--stream`), can write the samples it pushed as an OpenMetrics file for Prometheus's backfill
//! (`--openmetrics`), and can ask a Prometheus holding them the same team question in PromQL
//! and compare answers and times (`--prometheus`; `scripts/bench-prometheus.sh` does all of it).

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{TimeZone, Utc};
use clap::Args;
use gpuledger_model::Summary;
use gpuledger_web::AppState;

use crate::demo;

#[derive(Args)]
pub struct BenchArgs {
    /// GPUs in the fleet (rounded up to whole copies of the 450-GPU demo fleet).
    #[arg(long, default_value_t = 2000)]
    gpus: u32,
    /// Days of history.
    #[arg(long, default_value_t = 30)]
    days: i64,
    /// Database (default: a fresh SQLite file in the temp directory). A PostgreSQL URL should
    /// name an empty database.
    #[arg(long)]
    database_url: Option<String>,
    /// Timed requests per page, after one warm-up.
    #[arg(long, default_value_t = 20)]
    requests: usize,
    /// Seed of the simulated fleet.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Time the pages over a database an earlier run of the same size and seed loaded, without
    /// loading it again.
    #[arg(long)]
    no_load: bool,
    /// Skip the page timings (load, storage and freshness only, plus what the options below
    /// ask for).
    #[arg(long)]
    no_pages: bool,
    /// Write the samples of the history as an OpenMetrics file for
    /// `promtool tsdb create-blocks-from openmetrics`: one gauge, `gpu_activity_percent`, per
    /// GPU with the labels uuid, host and team (the owner gpuledger attributes to the GPU).
    /// Hours whose activity is unknown have no sample.
    #[arg(long, value_name = "FILE")]
    openmetrics: Option<PathBuf>,
    /// A Prometheus holding that file's samples (`http://127.0.0.1:9090`): ask it the team
    /// question of the history's window (GPU-hours, idle hours, average activity) in PromQL,
    /// ask gpuledger's summary the same, time both and check that the answers agree.
    #[arg(long, value_name = "URL")]
    prometheus: Option<String>,
    /// Time only the pages whose name in the table contains this text (repeatable), such as
    /// `overview` or `90 days`: to measure one page while changing it.
    #[arg(long, value_name = "TEXT")]
    only: Vec<String>,
    /// Last, push this many minutes of one sample per GPU and minute (the agent's default
    /// interval), ending at the current minute, through `POST /api/v1/ingest` over HTTP, and
    /// report the samples per second: ingest as a live fleet sends it. 0: skip.
    #[arg(long, default_value_t = 0, value_name = "MINUTES")]
    stream: i64,
    /// Minutes of samples each push of `--stream` carries: 1, every source pushes its GPUs'
    /// current samples every minute; more, sources send what they buffered in batches.
    #[arg(long, default_value_t = 1, value_name = "MINUTES")]
    stream_batch: i64,
    /// Seconds between one GPU's samples during `--stream` (1 to 60): 60, one a minute, the
    /// agent's default; less, as a collector sampling every few seconds sends each minute's
    /// samples in one push.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    stream_every: i64,
    /// Pushes in flight at once during `--stream`, as several sources push side by side.
    #[arg(long, default_value_t = 2)]
    pushers: usize,
    /// After the load, import the history's billing export again as exports are delivered
    /// again, and time each: the same file forced (nothing changes), with its last day
    /// corrected (that day's bills 10 % lower), without its last day, and whole again (a
    /// month's export delivered each day with one more day). The bills end as loaded.
    #[arg(long)]
    billing_again: bool,
}

/// `--billing-again`: the load's billing export imported again as exports come again, timed.
async fn billing_again(state: &AppState, hosts: &[demo::Host], days: i64) -> anyhow::Result<()> {
    let now = state.now();
    let from = gpuledger_model::hour_floor((now - chrono::Duration::days(days)).timestamp());
    // The load's export: the complete days of the history.
    let export = demo::focus_export(hosts, from, now.timestamp());
    let day_of = |line: &str| line.split(',').nth(1).map(str::to_string);
    let last = export.lines().skip(1).filter_map(day_of).max();
    let corrected: String = export
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            match (f.get(3), f.get(4)) {
                (Some(b), Some(e)) if day_of(l) == last && b.parse::<f64>().is_ok() => {
                    let less = |v: &str| format!("{:.2}", v.parse::<f64>().unwrap_or(0.0) * 0.9);
                    let mut f: Vec<String> = f.iter().map(|x| x.to_string()).collect();
                    (f[3], f[4]) = (less(b), less(e));
                    f.join(",") + "\n"
                }
                _ => format!("{l}\n"),
            }
        })
        .collect();
    let without_last: String = export
        .lines()
        .filter(|l| day_of(l) != last)
        .map(|l| format!("{l}\n"))
        .collect();
    // Last, the export as it was a day earlier, then as loaded: a month's export delivered
    // again with one more day. The database is left as the load left it.
    for (what, text, force) in [
        ("the same export, forced", &export, true),
        ("its last day corrected", &corrected, false),
        ("without its last day", &without_last, false),
        ("with one more day", &export, false),
    ] {
        let started = Instant::now();
        let done = state
            .store
            .import_billing(demo::BILLING_NAME, text, now, force)
            .await?;
        println!(
            "billing again, {what}: {:.1} s ({} lines matched)",
            started.elapsed().as_secs_f64(),
            done.report.matched_lines
        );
    }
    Ok(())
}

/// GPUs in one copy of the demo fleet.
const DEMO_GPUS: u32 = 450;

/// The gauge of the OpenMetrics file and of the PromQL questions.
const METRIC: &str = "gpu_activity_percent";

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let (store, mut state, url) = demo::open(args.database_url.clone(), args.days, "bench").await?;
    // `--stream` pushes minutes of a source's samples in a second or less, faster than a
    // source sends them in life: the per-source limit (`[ingest] records_per_sec`, 10,000 by
    // default) would refuse that, as it should in production, so the bench's server has none.
    state.config = std::sync::Arc::new(gpuledger_web::WebConfig {
        rate: None,
        ..(*state.config).clone()
    });
    let copies = args.gpus.div_ceil(DEMO_GPUS).max(1);
    let hosts = demo::fleet_of(args.seed, copies);
    let gpus: u32 = hosts.iter().map(|h| h.gpus).sum();
    let samples = u64::from(gpus) * args.days as u64 * 24;
    println!(
        "fleet: {gpus} GPUs on {} hosts, {} days, about {samples} samples ({url})",
        // One lab workstation holds two groups' GPUs (NVIDIA and AMD): count names.
        hosts
            .iter()
            .map(|h| h.name.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        args.days
    );
    let fleet = if args.no_load {
        demo::Demo {
            hosts,
            tokens: Default::default(),
            push_token: String::new(),
            billing: Duration::ZERO,
        }
    } else {
        let started = Instant::now();
        let fleet = demo::load_hosts(&state, hosts, args.days).await?;
        let secs = started.elapsed().as_secs_f64();
        let billing = fleet.billing.as_secs_f64();
        println!(
            "load: {secs:.1} s through the ingest path, {:.0} samples/s \
             ({:.1} s of it the billing export's import; pushes alone {:.0} samples/s)",
            samples as f64 / secs,
            billing,
            samples as f64 / (secs - billing).max(1e-9)
        );
        fleet
    };
    // What the server's hourly maintenance does (PostgreSQL: ANALYZE), so plans fit the data,
    // and on PostgreSQL what autovacuum does after a bulk load (its dead row versions would
    // otherwise be read by every page; this machine may run with autovacuum off).
    store.analyze().await?;
    store.vacuum().await?;
    // What the server's refresher does every ten seconds: the group rollups of the days the
    // load changed (until then the pages read those days from the per-GPU rows).
    let started = Instant::now();
    let days = store.refresh_groups(state.now().timestamp()).await?;
    println!(
        "group rollups: {days} days rebuilt in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let mut hours = 0;
    loop {
        match store.refresh_group_hours(state.now().timestamp()).await? {
            0 => break,
            n => hours += n,
        }
    }
    println!(
        "group rollups: {hours} finished hours of today built in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let storage = store.storage().await?;
    let summary = store
        .summary(
            gpuledger_store::Window {
                from: (state.now() - chrono::Duration::days(args.days)).timestamp(),
                to: state.now().timestamp(),
            },
            &Default::default(),
            gpuledger_ledger::GroupBy::Team,
            state.now(),
        )
        .await?;
    let hours = summary.total.gpu_hours.max(1) as f64;
    println!(
        "storage: {} GPU-hours; hour rollups {:.1} bytes per GPU-hour (day rollups {:.1}, \
         used-by {:.1}); raw samples {:.1} bytes each; database {:.1} MiB",
        summary.total.gpu_hours,
        storage.hours as f64 / hours,
        storage.days as f64 / hours,
        storage.day_use as f64 / hours,
        storage.samples as f64 / samples.max(1) as f64,
        storage.total as f64 / 1_048_576.0
    );
    // Past the raw retention only the rollups stay: per sample that was pushed, their bytes
    // per GPU-hour spread over the samples of an hour at the agent's default interval (60 s);
    // this fleet pushes one sample an hour, so that is what a real agent's history costs.
    let kept = (storage.hours + storage.days + storage.day_use) as f64 / hours;
    println!(
        "after raw retention: {kept:.1} bytes of rollups per GPU-hour, {:.2} bytes per raw \
         sample at one sample a minute (the agent's default)",
        kept / 60.0
    );
    if args.billing_again {
        billing_again(&state, &fleet.hosts, args.days).await?;
    }
    let history = History::of(&state, &fleet, args.days).await?;
    if let Some(path) = &args.openmetrics {
        let started = Instant::now();
        let (written, series) = history.write_openmetrics(path)?;
        println!(
            "openmetrics: {written} samples of {series} GPUs from {} to {} written to {} in {:.1} s",
            rfc3339(history.from),
            rfc3339(history.to),
            path.display(),
            started.elapsed().as_secs_f64()
        );
    }
    let addr = start_server(state.clone()).await?;
    freshness(&state, addr, &fleet, args.days).await?;
    if let Some(prometheus) = &args.prometheus {
        side_by_side(addr, prometheus, &history, args.requests).await?;
    }
    if !args.no_pages {
        time_pages_at(addr, &fleet, args.requests, &args.only).await?;
    }
    if args.stream > 0 {
        stream(&state, addr, &fleet.hosts, &args).await?;
    }
    Ok(())
}

/// Sustained ingest (`--stream`): every source but the stale one pushes one sample per GPU and
/// minute (`--stream-every` seconds) for the last `--stream` minutes, `--stream-batch`
/// minutes a push (a push carries at most [`demo::MAX_RECORDS`] samples), in time order,
/// `--pushers` pushes at a time over HTTP. The bodies are serialized before the clock starts;
/// each reply must accept every sample. A minute's samples fall from 15 s past it to 15 s past
/// the next, never on a minute's first second, so none repeats one the load pushed (on the
/// half hour) or a freshness check's (on a minute): a second run within the same minutes would
/// find its samples stored, and fails.
async fn stream(
    state: &AppState,
    addr: SocketAddr,
    hosts: &[demo::Host],
    args: &BenchArgs,
) -> anyhow::Result<()> {
    let now = state.now().timestamp();
    let first = now - now.rem_euclid(60) - args.stream * 60 + 15;
    let batch = args.stream_batch.max(1);
    let every = args.stream_every.clamp(1, 60);
    let mut tokens = BTreeMap::new();
    let mut bodies: Vec<(String, Vec<u8>, u64)> = Vec::new();
    let mut minute = 0;
    while minute < args.stream {
        let minutes = batch.min(args.stream - minute);
        for (source, _) in demo::SOURCES {
            if *source == demo::STALE_SOURCE {
                continue;
            }
            let mut samples = Vec::new();
            for h in hosts.iter().filter(|h| h.source == *source) {
                for gpu in 0..h.gpus {
                    let uuid = h.uuid(gpu);
                    for m in minute..minute + minutes {
                        let at = first + m * 60;
                        for ts in (at..at + 60).step_by(every as usize) {
                            if ts.rem_euclid(60) != 0 {
                                samples.push(demo::sample(h, gpu, &uuid, ts));
                            }
                        }
                    }
                }
            }
            if samples.is_empty() {
                continue;
            }
            if !tokens.contains_key(source) {
                let token = state
                    .store
                    .create_token(gpuledger_store::Role::Ingest, source, &[])
                    .await?;
                tokens.insert(*source, token);
            }
            for chunk in samples.chunks(demo::MAX_RECORDS) {
                let body = gpuledger_model::PushBody {
                    samples: chunk.to_vec(),
                    ..Default::default()
                };
                bodies.push((
                    tokens[source].clone(),
                    serde_json::to_vec(&body)?,
                    chunk.len() as u64,
                ));
            }
        }
        minute += minutes;
    }
    let total: u64 = bodies.iter().map(|b| b.2).sum();
    let pushes = bodies.len();
    let queue = std::sync::Arc::new(std::sync::Mutex::new(
        bodies
            .into_iter()
            .collect::<std::collections::VecDeque<_>>(),
    ));
    let started = Instant::now();
    let mut pushers = tokio::task::JoinSet::new();
    for _ in 0..args.pushers.max(1) {
        let queue = queue.clone();
        pushers.spawn(async move {
            let mut times = Vec::new();
            let mut accepted = 0;
            loop {
                let next = queue
                    .lock()
                    .map_err(|_| anyhow::anyhow!("queue"))?
                    .pop_front();
                let Some((token, body, _)) = next else {
                    return anyhow::Ok((times, accepted));
                };
                let (ms, reply) =
                    timed(addr, "POST", "/api/v1/ingest".into(), Some(token), body).await?;
                let outcome: serde_json::Value = serde_json::from_slice(&reply.body)?;
                anyhow::ensure!(
                    outcome["rejected"].as_array().is_none_or(|r| r.is_empty())
                        && outcome["duplicates"]["samples"].as_u64() == Some(0),
                    "stream push not stored whole: {outcome}"
                );
                accepted += outcome["accepted"]["samples"].as_u64().unwrap_or(0);
                times.push(ms);
            }
        });
    }
    let mut times = Vec::new();
    let mut accepted = 0;
    while let Some(done) = pushers.join_next().await {
        let (t, a) = done??;
        times.extend(t);
        accepted += a;
    }
    let secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        accepted == total,
        "stream: {accepted} of {total} samples accepted"
    );
    times.sort_by(f64::total_cmp);
    println!(
        "stream: {total} samples ({} minutes, {batch} a push, one a GPU every {every} s) in \
         {pushes} pushes, {} at a time, over HTTP in {secs:.1} s: {:.0} samples/s (push p50 \
         {:.0} ms, p95 {:.0} ms)",
        args.stream,
        args.pushers.max(1),
        total as f64 / secs,
        quantile(&times, 0.5),
        quantile(&times, 0.95)
    );
    Ok(())
}

fn rfc3339(ts: i64) -> String {
    Utc.timestamp_opt(ts, 0)
        .single()
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The loaded history as the store holds it: the whole hours `[from, to)` the load covered
/// (from the GPUs' first sighting, which the load stamps with the history's start), each
/// host's last sample (a source that went stale stopped early), and the owner gpuledger
/// attributes to each GPU.
struct History {
    hosts: Vec<demo::Host>,
    from: i64,
    to: i64,
    /// uuid → (team, last seen).
    gpus: BTreeMap<String, (String, i64)>,
}

impl History {
    async fn of(state: &AppState, fleet: &demo::Demo, days: i64) -> anyhow::Result<History> {
        let list = state
            .store
            .list_gpus(&Default::default(), false, state.now())
            .await?;
        let gpus: BTreeMap<String, (String, i64)> = list
            .iter()
            .map(|g| {
                (
                    g.uuid.to_string(),
                    (g.team.to_string(), g.last_seen.timestamp()),
                )
            })
            .collect();
        // By key: a search of the list per host took minutes at 100,000 GPUs.
        let first_seen: HashMap<&str, i64> = list
            .iter()
            .map(|g| (&*g.uuid, g.first_seen.timestamp()))
            .collect();
        let from = fleet
            .hosts
            .iter()
            .filter_map(|h| first_seen.get(h.uuid(0).as_str()).copied())
            .min()
            .context("none of the fleet's GPUs is in the database: run the bench without --no-load first")?;
        let from = gpuledger_model::hour_floor(from);
        Ok(History {
            hosts: fleet.hosts.clone(),
            from,
            to: from + days * 86_400,
            gpus,
        })
    }

    /// Write every sample with a known activity, regenerated from the fleet as the load
    /// generated it, one series after the other in time order. Returns samples and series.
    fn write_openmetrics(&self, path: &std::path::Path) -> anyhow::Result<(u64, usize)> {
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        writeln!(
            out,
            "# HELP {METRIC} GPU activity per hour (percent of time busy), as pushed to gpuledger."
        )?;
        writeln!(out, "# TYPE {METRIC} gauge")?;
        let (mut written, mut series) = (0u64, 0usize);
        for h in &self.hosts {
            let seen = |gpu: u32| self.gpus.get(&h.uuid(gpu));
            // The host's last sample: what a source that stopped early last sent.
            let Some(last) = (0..h.gpus).filter_map(|g| seen(g).map(|s| s.1)).max() else {
                continue;
            };
            // From where the load started the host: a host that arrived during the history
            // has no samples before.
            let body = demo::history_body(h, demo::history_start(h, self.from, self.to), last + 1);
            let mut current = "";
            for s in &body.samples {
                let Some(pct) = s.util_pct else { continue };
                let Some((team, _)) = self.gpus.get(&s.gpu_uuid) else {
                    continue;
                };
                if current != s.gpu_uuid {
                    current = &s.gpu_uuid;
                    series += 1;
                }
                writeln!(
                    out,
                    "{METRIC}{{uuid=\"{}\",host=\"{}\",team=\"{}\"}} {pct} {}",
                    s.gpu_uuid,
                    h.name,
                    team,
                    s.ts.timestamp()
                )?;
                written += 1;
            }
        }
        writeln!(out, "# EOF")?;
        out.flush()?;
        Ok((written, series))
    }
}

/// Serve `state` on a free loopback port for as long as the process runs.
async fn start_server(state: AppState) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(gpuledger_web::serve(
        listener,
        state,
        std::future::pending(),
    ));
    Ok(addr)
}

/// One answer over HTTP: the status code, the whole response's size and the body.
struct Reply {
    code: u16,
    bytes: usize,
    body: Vec<u8>,
}

/// One HTTP/1.1 request over a fresh connection (`Connection: close`, as a browser's first
/// request would be), with an optional bearer token and JSON body.
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> anyhow::Result<Reply> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr)?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if !body.is_empty() {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(buf.len(), |p| p + 4);
    let head = String::from_utf8_lossy(&buf[..split]).to_ascii_lowercase();
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut payload = buf[split..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        payload = dechunk(&payload)?;
    }
    Ok(Reply {
        code,
        bytes: buf.len(),
        body: payload,
    })
}

/// Decode a chunked HTTP/1.1 body.
fn dechunk(mut raw: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("truncated chunked body")?;
        let size_text = String::from_utf8_lossy(&raw[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("bad chunk size `{size_text}`"))?;
        if size == 0 {
            return Ok(out);
        }
        let start = eol + 2;
        anyhow::ensure!(raw.len() >= start + size, "truncated chunk");
        out.extend_from_slice(&raw[start..start + size]);
        raw = raw.get(start + size + 2..).unwrap_or_default();
    }
}

/// [`http`] from a blocking thread, timed in milliseconds; fails on any status but 200.
async fn timed(
    addr: SocketAddr,
    method: &'static str,
    path: String,
    token: Option<String>,
    body: Vec<u8>,
) -> anyhow::Result<(f64, Reply)> {
    let t = Instant::now();
    let reply = tokio::task::spawn_blocking({
        let path = path.clone();
        move || http(addr, method, &path, token.as_deref(), &body)
    })
    .await??;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        reply.code == 200,
        "{method} {path} answered {}: {}",
        reply.code,
        String::from_utf8_lossy(&reply.body)
    );
    Ok((ms, reply))
}

async fn get_summary(addr: SocketAddr, path: String) -> anyhow::Result<(f64, Summary)> {
    let (ms, reply) = timed(addr, "GET", path.clone(), None, Vec::new()).await?;
    let summary = serde_json::from_slice(&reply.body).with_context(|| format!("reading {path}"))?;
    Ok((ms, summary))
}

/// The value at quantile `q` of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    quantile(&v, 0.5)
}

/// Freshness: push one sample of the current minute through `POST /api/v1/ingest` for a GPU
/// whose current hour has no known activity (a GPU that reports no utilization), then ask the
/// summary until that hour counts as busy. The summary's window is fixed for the measurement
/// (the history's length, ending at the next hour), so nothing else moves its figures. The
/// sample falls on the current minute's first second, where `--stream` pushes none.
async fn freshness(
    state: &AppState,
    addr: SocketAddr,
    fleet: &demo::Demo,
    days: i64,
) -> anyhow::Result<()> {
    let now = state.now();
    let hour = gpuledger_model::hour_floor(now.timestamp());
    let mut gpu = None;
    for h in fleet
        .hosts
        .iter()
        .filter(|h| h.profile == demo::Profile::NoUtil && h.source != demo::STALE_SOURCE)
    {
        for g in 0..h.gpus {
            let uuid = h.uuid(g);
            let window = gpuledger_store::Window {
                from: hour,
                to: hour + 3600,
            };
            let known = state
                .store
                .gpu_detail(&uuid, window, now)
                .await?
                .is_some_and(|d| d.hours.iter().any(|p| p.activity_pct.is_some()));
            if !known {
                gpu = Some(uuid);
                break;
            }
        }
        if gpu.is_some() {
            break;
        }
    }
    let Some(gpu) = gpu else {
        println!("freshness: skipped (no GPU of the fleet has an unmeasured current hour)");
        return Ok(());
    };
    let token = state
        .store
        .create_token(gpuledger_store::Role::Ingest, "bench-freshness", &[])
        .await?;
    let path = format!(
        "/api/v1/summary?group_by=team&from={}&to={}",
        rfc3339(hour + 3600 - days * 86_400),
        rfc3339(hour + 3600)
    );
    let (_, before) = get_summary(addr, path.clone()).await?;
    let body = serde_json::to_vec(&serde_json::json!({
        "samples": [{"gpu_uuid": gpu, "ts": rfc3339(now.timestamp() - now.timestamp().rem_euclid(60)), "util_pct": 50.0}]
    }))?;
    let started = Instant::now();
    let (push_ms, _) = timed(addr, "POST", "/api/v1/ingest".into(), Some(token), body).await?;
    let mut polls = 0;
    loop {
        let (_, after) = get_summary(addr, path.clone()).await?;
        polls += 1;
        if after.total.busy_hours > before.total.busy_hours {
            println!(
                "freshness: a sample pushed for {gpu} (activity unknown that hour until then) \
                 counted in the summary after {:.0} ms (push answered in {push_ms:.0} ms, \
                 {polls} summary requests)",
                started.elapsed().as_secs_f64() * 1000.0
            );
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "freshness: the pushed sample was not in the summary after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Percent-encode a query parameter.
fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One PromQL instant query at `at`: team → value.
async fn promql(
    addr: SocketAddr,
    query: &str,
    at: i64,
) -> anyhow::Result<(f64, BTreeMap<String, f64>)> {
    let path = format!("/api/v1/query?query={}&time={at}", query_escape(query));
    let (ms, reply) = timed(addr, "GET", path, None, Vec::new()).await?;
    let v: serde_json::Value = serde_json::from_slice(&reply.body)?;
    anyhow::ensure!(v["status"] == "success", "Prometheus answered {v}");
    let mut out = BTreeMap::new();
    for r in v["data"]["result"].as_array().into_iter().flatten() {
        let team = r["metric"]["team"].as_str().unwrap_or_default().to_string();
        let value: f64 = r["value"][1].as_str().unwrap_or("NaN").parse()?;
        out.insert(team, value);
    }
    Ok((ms, out))
}

/// The team × window question asked of gpuledger (`GET /api/v1/summary`, one request) and of
/// Prometheus (three PromQL queries), `requests` times each after a warm-up, from the same
/// client; then the answers compared team by team.
async fn side_by_side(
    gpuledger: SocketAddr,
    prometheus: &str,
    history: &History,
    requests: usize,
) -> anyhow::Result<()> {
    let host = prometheus
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let prom: SocketAddr = host
        .parse()
        .with_context(|| format!("--prometheus {prometheus}: expected http://IP:PORT"))?;
    let days = (history.to - history.from) / 86_400;
    let path = format!(
        "/api/v1/summary?group_by=team&from={}&to={}",
        rfc3339(history.from),
        rfc3339(history.to)
    );
    let (_, summary) = get_summary(gpuledger, path.clone()).await?;
    let threshold = summary.idle_threshold_pct;
    let questions = [
        (
            "GPU-hours",
            format!("sum by (team) (count_over_time({METRIC}[{days}d]))"),
        ),
        (
            "idle hours",
            format!(
                "sum by (team) (count_over_time((last_over_time({METRIC}[1h]) < {threshold})[{days}d:1h]))"
            ),
        ),
        (
            "average activity",
            format!(
                "sum by (team) (sum_over_time({METRIC}[{days}d])) / sum by (team) (count_over_time({METRIC}[{days}d]))"
            ),
        ),
    ];
    let mut answers = Vec::new();
    for (_, q) in &questions {
        answers.push(promql(prom, q, history.to).await?.1);
    }
    let (mut ours, mut theirs, mut each) = (Vec::new(), Vec::new(), vec![Vec::new(); 3]);
    for _ in 0..requests.max(1) {
        ours.push(get_summary(gpuledger, path.clone()).await?.0);
        let mut total = 0.0;
        for (i, (_, q)) in questions.iter().enumerate() {
            let ms = promql(prom, q, history.to).await?.0;
            each[i].push(ms);
            total += ms;
        }
        theirs.push(total);
    }
    let ours = median(ours);
    let theirs = median(theirs);
    let slowest = each.iter().map(|v| median(v.clone())).fold(0.0, f64::max);
    println!(
        "side by side: team x {days} days from {} to {}, p50 of {} requests after a warm-up",
        rfc3339(history.from),
        rfc3339(history.to),
        requests.max(1)
    );
    println!("  gpuledger  GET {path}: {ours:.1} ms");
    for ((name, q), times) in questions.iter().zip(&each) {
        println!("  prometheus {name}: {:.1} ms  {q}", median(times.clone()));
    }
    println!("  prometheus, the three queries in turn: {theirs:.1} ms");
    println!(
        "  ratio, Prometheus's time over gpuledger's: {:.1} (its slowest query alone: {:.1})",
        theirs / ours,
        slowest / ours
    );
    // The check: per team, Prometheus's sample count is gpuledger's measured hours (GPU-hours
    // less the unknown ones, which have no sample), and idle hours and average activity match.
    println!(
        "  {:<12} {:>10} {:>8} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8}",
        "team", "GPU-hours", "unknown", "measured", "promql", "idle", "promql", "avg %", "promql"
    );
    let mut disagree = Vec::new();
    let mut teams: Vec<&str> = summary.groups.iter().map(|g| g.key.as_str()).collect();
    for t in answers[0].keys() {
        if !teams.contains(&t.as_str()) {
            teams.push(t);
        }
    }
    for team in teams {
        let ours = summary.groups.iter().find(|g| g.key == team);
        let get = |i: usize| answers[i].get(team).copied();
        let (hours, unknown, idle) =
            ours.map_or((0, 0, 0), |g| (g.gpu_hours, g.unknown_hours, g.idle_hours));
        let avg = ours.and_then(|g| g.avg_activity_pct);
        let measured = hours - unknown;
        let p_hours = get(0).unwrap_or(0.0);
        let p_idle = get(1).unwrap_or(0.0);
        let p_avg = get(2);
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        println!(
            "  {team:<12} {hours:>10} {unknown:>8} {measured:>10} {p_hours:>10} {idle:>8} {p_idle:>8} {:>8} {:>8}",
            fmt(avg),
            fmt(p_avg)
        );
        let avg_agrees = match (avg, p_avg) {
            (Some(a), Some(b)) => (a - b).abs() <= 0.006,
            (a, b) => a.is_none() && b.is_none(),
        };
        if p_hours != measured as f64 || p_idle != idle as f64 || !avg_agrees {
            disagree.push(team.to_string());
        }
    }
    let unknown = summary.total.unknown_hours;
    anyhow::ensure!(
        disagree.is_empty(),
        "side by side: gpuledger and Prometheus disagree for {}",
        disagree.join(", ")
    );
    println!(
        "  agree: for every team, Prometheus's GPU-hours are gpuledger's measured hours, and idle \
         hours and average activity are equal; gpuledger also counts {unknown} GPU-hours whose \
         activity is unknown (no utilization reported, or present within the stale window after \
         the last sample), which have no sample in Prometheus"
    );
    Ok(())
}

/// Time each page and endpoint: the server renders every request from the store (keeping only
/// the answers over settled days, which the untimed warm-up reads), so this is the server's
/// work plus a loopback hop. p50, p95 and max of `requests` requests after one warm-up, and
/// the response size.
pub async fn time_pages(
    state: AppState,
    fleet: &demo::Demo,
    requests: usize,
) -> anyhow::Result<()> {
    let addr = start_server(state).await?;
    time_pages_at(addr, fleet, requests, &[]).await
}

async fn time_pages_at(
    addr: SocketAddr,
    fleet: &demo::Demo,
    requests: usize,
    only: &[String],
) -> anyhow::Result<()> {
    let gpu = fleet.hosts[0].uuid(0);
    let mut pages: Vec<(String, String)> = Vec::new();
    for (range, q) in [
        ("", ""),
        (", 90 days", "range=90d"),
        (", team nlp", "team=nlp"),
    ] {
        let with = |path: &str| {
            if q.is_empty() {
                path.to_string()
            } else if path.contains('?') {
                format!("{path}&{q}")
            } else {
                format!("{path}?{q}")
            }
        };
        for (name, path) in [
            ("overview", "/".to_string()),
            ("inventory", "/inventory".to_string()),
            ("inventory csv", "/inventory?csv=inventory".to_string()),
            ("gpu", format!("/gpus/{gpu}")),
            ("teams", "/teams".to_string()),
            ("team", "/teams/nlp".to_string()),
            ("usage", "/usage".to_string()),
            ("waste", "/waste".to_string()),
            ("sources", "/sources".to_string()),
            ("api summary", "/api/v1/summary".to_string()),
            ("api summary csv", "/api/v1/summary?format=csv".to_string()),
            ("api gpus", "/api/v1/gpus".to_string()),
            (
                "api gpus page",
                "/api/v1/gpus?limit=1000&offset=1000".to_string(),
            ),
            ("api used-by", "/api/v1/used-by".to_string()),
            ("api savings", "/api/v1/savings".to_string()),
            (
                "api savings page",
                "/api/v1/savings?limit=100&offset=100".to_string(),
            ),
            ("api forecast", "/api/v1/forecast".to_string()),
        ] {
            // One GPU, the sources and a team's page take no team filter; the GPU list and the
            // forecast (always of the current month) take no range.
            if (q.starts_with("team") && matches!(name, "gpu" | "sources" | "team"))
                || (q.starts_with("range") && name.starts_with("api gpus"))
                || (q.starts_with("range") && name == "api forecast")
            {
                continue;
            }
            let name = format!("{name}{range}");
            if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
                continue;
            }
            pages.push((name, with(&path)));
        }
    }
    println!(
        "{:<30} {:>9} {:>9} {:>9} {:>9}",
        "page", "p50 ms", "p95 ms", "max ms", "KiB"
    );
    for (name, path) in pages {
        let mut times = Vec::new();
        let mut size = 0;
        for i in 0..=requests.max(1) {
            let (ms, reply) = timed(addr, "GET", path.clone(), None, Vec::new()).await?;
            if i > 0 {
                times.push(ms);
            }
            size = reply.bytes;
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{name:<30} {:>9.1} {:>9.1} {:>9.1} {:>9}",
            quantile(&times, 0.5),
            quantile(&times, 0.95),
            times[times.len() - 1],
            size / 1024
        );
    }
    Ok(())
}
