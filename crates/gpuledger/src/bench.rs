//! `gpuledger bench`: a synthetic fleet of any size loaded through the real ingest path, then
//! every page and API endpoint timed from a client on the same machine. The figures in
//! `docs/benchmarks.md` come from it. It measures; it asserts nothing.
//!
//! The fleet is the demo's, copied as many times as the size asks (the same mix of clouds,
//! clusters, teams, environments, MIG instances, allocations, idle and unmeasured GPUs), with
//! one sample per GPU and hour.

use std::time::Instant;

use clap::Args;
use gpuledger_web::AppState;

use crate::demo;

#[derive(Args)]
pub struct BenchArgs {
    /// GPUs in the fleet (rounded up to whole copies of the 408-GPU demo fleet).
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
}

/// GPUs in one copy of the demo fleet.
const DEMO_GPUS: u32 = 408;

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let (store, state, url) = demo::open(args.database_url.clone(), args.days, "bench").await?;
    let copies = args.gpus.div_ceil(DEMO_GPUS).max(1);
    let hosts = demo::fleet_of(args.seed, copies);
    let gpus: u32 = hosts.iter().map(|h| h.gpus).sum();
    let samples = u64::from(gpus) * args.days as u64 * 24;
    println!(
        "fleet: {gpus} GPUs on {} hosts, {} days, about {samples} samples ({url})",
        hosts.len(),
        args.days
    );
    let fleet = if args.no_load {
        demo::Demo {
            hosts,
            tokens: Default::default(),
            push_token: String::new(),
        }
    } else {
        let started = Instant::now();
        let fleet = demo::load_hosts(&state, hosts, args.days).await?;
        let secs = started.elapsed().as_secs_f64();
        println!(
            "load: {secs:.1} s through the ingest path, {:.0} samples/s",
            samples as f64 / secs
        );
        fleet
    };
    // What the server's hourly maintenance does (PostgreSQL: ANALYZE), so plans fit the data.
    store.analyze().await?;
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
    time_pages(state, &fleet, args.requests).await
}

/// GET `path` over a plain HTTP/1.1 connection; returns the status line's code and body size.
fn http_get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<(u16, usize)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let head = String::from_utf8_lossy(&buf[..buf.len().min(64)]).to_string();
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, buf.len()))
}

/// The value at quantile `q` of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Time each page and endpoint: the server renders every request from the store (no caching),
/// so this is the server's work plus a loopback hop. p50, p95 and max of `requests` requests
/// after one warm-up, and the response size.
pub async fn time_pages(
    state: AppState,
    fleet: &demo::Demo,
    requests: usize,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(gpuledger_web::serve(
        listener,
        state,
        std::future::pending(),
    ));
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
            ("api used-by", "/api/v1/used-by".to_string()),
            ("api savings", "/api/v1/savings".to_string()),
        ] {
            // One GPU, the sources and a team's page take no team filter; the GPU list takes
            // no range.
            if (q.starts_with("team") && matches!(name, "gpu" | "sources" | "team"))
                || (q.starts_with("range") && name == "api gpus")
            {
                continue;
            }
            pages.push((format!("{name}{range}"), with(&path)));
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
            let t = Instant::now();
            let (code, bytes) = tokio::task::spawn_blocking({
                let path = path.clone();
                move || http_get(addr, &path)
            })
            .await??;
            anyhow::ensure!(code == 200, "{path} answered {code}");
            if i > 0 {
                times.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            size = bytes;
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
