//! The `gpuledger` binary: flags are parsed first, then one subcommand wires the crates
//! together. Everything else lives in the library crates.

mod bench;
mod config;
mod demo;
mod forecast;
mod inventory;
mod pull;
mod tokens;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use gpuledger_store::Store;
use gpuledger_web::AppState;

#[derive(Parser)]
#[command(
    name = "gpuledger",
    version,
    about = "Know every GPU you have: inventory, utilization, allocations and cost in one place"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process; the size of the agent's arguments does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the hub: push API, query API and dashboard.
    Serve(ServeArgs),
    /// Manage tokens.
    Token {
        #[command(subcommand)]
        command: tokens::TokenCommand,
    },
    /// Run the hub on a simulated fleet (30 days of history, live samples every minute).
    Demo(DemoArgs),
    /// Load a synthetic fleet of any size through the ingest path, then time every page and
    /// endpoint (p50, p95, max, bytes); `docs/benchmarks.md` has the figures.
    Bench(bench::BenchArgs),
    /// Report this host's GPUs to a gpuledger server (the node agent; read-only, outbound only).
    Agent(gpuledger_agent::AgentArgs),
    /// Run the configured pull collectors.
    Collect(CollectArgs),
    /// Import data files: `import billing FILE` reconciles a FOCUS billing export;
    /// `import inventory FILE` reads an inventory sheet (CSV or XLSX).
    Import {
        #[command(subcommand)]
        command: ImportCommand,
    },
    /// Re-decide every GPU's owner and environment with the config's current rules from DATE on,
    /// rewriting the owner history after DATE (history before it keeps its owners). Without
    /// this, a rule change applies from the hour the server starts with it.
    Reattribute {
        /// From when: a date (`2026-11-01`, midnight UTC) or an RFC 3339 time; rounded down to
        /// the hour.
        #[arg(long, value_parser = parse_from)]
        from: chrono::DateTime<chrono::Utc>,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Copy the SQLite database, while the server runs, to a new file, and check the copy.
    /// (PostgreSQL: use pg_dump; see docs/deploy.md.)
    Backup {
        /// The copy to write (must not exist).
        file: PathBuf,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Run one round of notifications now (`[notifications]` in the config): send what is new,
    /// changed or resolved, and the weekly digests when due. `--dry-run` prints what would be
    /// sent and sends and records nothing. `serve` runs rounds by itself.
    Notify {
        /// Print the messages of this round instead of sending them.
        #[arg(long)]
        dry_run: bool,
        /// Run the round as of this time (a date or an RFC 3339 time) instead of now: for
        /// replaying a database whose data ends then (`demo --load-only --until`).
        #[arg(long, value_parser = parse_from)]
        at: Option<chrono::DateTime<chrono::Utc>>,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Spend forecasts: `forecast backtest --db URL` tests the month-end forecast made on day 15
    /// of a past month against what the month cost, per team.
    Forecast {
        #[command(subcommand)]
        command: forecast::ForecastCommand,
    },
    /// Validate a config file and print every problem with its location.
    CheckConfig {
        /// The config file (TOML).
        file: PathBuf,
    },
}

#[derive(Args)]
struct DbArgs {
    /// Database: a SQLite file path or sqlite://PATH (default gpuledger.db), or postgres://...
    #[arg(long, env = "GPULEDGER_DATABASE_URL")]
    database_url: Option<String>,
    /// Config file (TOML); see docs/configuration.md.
    #[arg(long, env = "GPULEDGER_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on (default 127.0.0.1:8080).
    #[arg(long)]
    listen: Option<String>,
    #[command(flatten)]
    db: DbArgs,
}

#[derive(Subcommand)]
enum ImportCommand {
    /// Reconcile a FinOps FOCUS billing export (CSV, plain or gzip) with the stored GPUs and
    /// keep it: per GPU, team and month the estimated cost, the billed EffectiveCost and the
    /// difference, and the GPU-looking lines no known host matched. Prints the report as JSON.
    Billing {
        /// The FOCUS CSV file.
        file: PathBuf,
        /// Reconcile again even if this file was imported with the same content (after new
        /// GPUs or instance IDs became known).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Import an inventory sheet (CSV or XLSX; see docs/collectors/spreadsheet.md): prints
    /// every row it cannot use (row, column, value, reason) and what the rest changes (GPUs and
    /// hosts new, changed, unchanged), then stores it as the `spreadsheet` collector would.
    /// Importing the same file again changes nothing.
    Inventory {
        #[command(flatten)]
        args: inventory::InventoryArgs,
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Args)]
struct DemoArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Seed of the simulated fleet.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Days of history to load.
    #[arg(long, default_value_t = 30)]
    days: i64,
    /// Database for the demo (default: a fresh SQLite file in the temp directory).
    #[arg(long)]
    database_url: Option<String>,
    /// Load the history, print the summary and exit instead of serving.
    #[arg(long)]
    load_only: bool,
    /// With --load-only: the history ends at this time (a date or an RFC 3339 time) instead of
    /// now, as if the demo ran then; loading again with a later time adds the days between
    /// (replays of the notifications over a week of the demo, docs/notifications.md).
    #[arg(long, value_parser = parse_from, requires = "load_only")]
    until: Option<chrono::DateTime<chrono::Utc>>,
    /// Load the history, time every dashboard page (median of 10 renders) and exit.
    #[arg(long)]
    bench_pages: bool,
}

#[derive(Args)]
struct CollectArgs {
    /// Config file naming the collectors.
    #[arg(long, env = "GPULEDGER_CONFIG")]
    config: PathBuf,
    /// Run each collector once and exit.
    #[arg(long)]
    once: bool,
    /// Print observations as JSON lines instead of storing them.
    #[arg(long)]
    dry_run: bool,
}

/// Logs to stderr: `GPULEDGER_LOG` filters (default `info`); colours only on a terminal;
/// `GPULEDGER_LOG_FORMAT=json` writes one JSON object per line for log collectors.
fn init_tracing() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPULEDGER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    if std::env::var("GPULEDGER_LOG_FORMAT").is_ok_and(|f| f == "json") {
        logs.json().init();
    } else {
        logs.init();
    }
}

/// `url` with any password replaced by `***`, for logs and error messages (a SQLite path is
/// returned as it is).
fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

fn load_config(path: Option<&PathBuf>) -> anyhow::Result<config::Config> {
    match path {
        Some(p) => config::load(p),
        None => Ok(config::Config::default()),
    }
}

fn database_url(flag: Option<String>, cfg: &config::Config) -> String {
    flag.or_else(|| cfg.database_url.clone())
        .unwrap_or_else(|| "gpuledger.db".to_string())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
}

/// Log each kubeconfig file a `kubeconfig_dir` left out; the other files' collectors run.
fn log_skipped(skipped: &[String]) {
    for s in skipped {
        tracing::error!(problem = %s, "kubeconfig file left out; fix or remove it and reload gpuledger");
    }
}

/// On SIGHUP, re-read the config file and reconcile the running collectors with its
/// `[[collectors]]` (see [`pull::Pulls::apply`]). A file that fails to parse, or whose
/// collectors cannot be read or built, is refused as a whole and the running collectors go
/// on. Only `[[collectors]]` reload: other settings take effect at the next start, and a
/// reload that changes them says so. `started` is the config text `serve` started with.
fn spawn_reloads(
    config: Option<PathBuf>,
    started: String,
    mut pulls: pull::Pulls,
) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups =
            signal(SignalKind::hangup()).context("listening for SIGHUP (config reload)")?;
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                let Some(path) = &config else {
                    tracing::warn!(
                        "SIGHUP: serve runs without --config; there is nothing to reload"
                    );
                    continue;
                };
                tracing::info!(config = %path.display(), "SIGHUP: reloading the config's [[collectors]]");
                if let Err(e) = reload(path, &started, &mut pulls).await {
                    tracing::error!(config = %path.display(), error = %format!("{e:#}"), "config reload refused; the running collectors go on unchanged");
                }
            }
        });
    }
    #[cfg(not(unix))]
    let _ = (config, started, pulls);
    Ok(())
}

/// One reload: see [`spawn_reloads`].
async fn reload(
    path: &std::path::Path,
    started: &str,
    pulls: &mut pull::Pulls,
) -> anyhow::Result<()> {
    let (cfg, text) = config::load_text(path)?;
    let plan = pull::plan(&cfg.collectors, &cfg.collector_hosts)?;
    let changed = config::changed_outside_collectors(started, &text);
    if !changed.is_empty() {
        tracing::warn!(settings = %changed.join(", "), "settings outside [[collectors]] differ from those serve started with; only [[collectors]] reload, the rest apply at the next restart");
    }
    log_skipped(&plan.skipped);
    let changes = pulls.apply(plan).await;
    tracing::info!(
        started = changes.started.len(),
        stopped = changes.stopped.len(),
        restarted = changes.restarted.len(),
        unchanged = changes.unchanged,
        "config reloaded"
    );
    Ok(())
}

/// Prune past retention every hour while serving, and rebuild the group rollups of the days
/// changed since (see [`refresh_groups`]).
fn spawn_maintenance(store: Store) {
    tokio::spawn(refresh_groups(store.clone()));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
        loop {
            tick.tick().await;
            match store.prune(chrono::Utc::now().timestamp()).await {
                Ok((raw, hours)) => tracing::debug!(raw, hours, "pruned past retention"),
                Err(e) => tracing::warn!(error = %e, "pruning failed; will retry"),
            }
            if let Err(e) = store.analyze().await {
                tracing::warn!(error = %e, "refreshing planner statistics failed; will retry");
            }
        }
    });
}

/// Rebuild the group rollups of the past days listed as changed (`Store::refresh_groups`)
/// and build those of today's finished hours (`Store::refresh_group_hours`): looked for every
/// ten seconds, today's hours first, then the days newest first. Until a day is rebuilt the pages read it
/// from the per-GPU rows, with the same figures, so the pace only trades page speed against
/// writer time: a day rebuilt within the last minute waits (a day that keeps changing, such as
/// yesterday while late data arrives, is rebuilt at most once a minute), and after each
/// rebuild the loop rests nine times as long as it took, so rebuilding holds the one writer
/// at most a tenth of the time however much changes.
async fn refresh_groups(store: Store) {
    use std::time::{Duration, Instant};
    let mut rebuilt: std::collections::HashMap<i64, Instant> = Default::default();
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        rebuilt.retain(|_, at| at.elapsed() < Duration::from_secs(60));
        let started = Instant::now();
        match store
            .refresh_group_hours(chrono::Utc::now().timestamp())
            .await
        {
            Ok(0) => {}
            Ok(hours) => {
                tracing::debug!(
                    hours,
                    took_ms = started.elapsed().as_millis() as u64,
                    "built the group rollups of today's finished hours"
                );
                tokio::time::sleep(started.elapsed() * 9).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "building the group rollups of today's hours failed; will retry");
            }
        }
        let days = match store
            .dirty_group_days_before(chrono::Utc::now().timestamp())
            .await
        {
            Ok(days) => days,
            Err(e) => {
                tracing::warn!(error = %e, "listing changed days failed; will retry");
                continue;
            }
        };
        for day in days {
            if rebuilt.contains_key(&day) {
                continue;
            }
            let started = Instant::now();
            match store.refresh_group_day(day).await {
                Ok(_) => {
                    rebuilt.insert(day, Instant::now());
                    tracing::debug!(
                        day,
                        took_ms = started.elapsed().as_millis() as u64,
                        "rebuilt a day's group rollups"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, day, "rebuilding a day's group rollups failed; will retry");
                    break;
                }
            }
            tokio::time::sleep(started.elapsed() * 9).await;
        }
    }
}

/// Notification rounds every `every_secs`, in the one replica that holds the lease (so a
/// message goes out once, whatever the number of replicas).
fn spawn_notifier(n: gpuledger_web::notify::Notifier) {
    tokio::spawn(async move {
        let lease = pull::lease(&n.state.store);
        let mut tick =
            tokio::time::interval(std::time::Duration::from_secs(n.config.every_secs.max(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !lease.is_held() {
                continue;
            }
            match n.round(n.state.now(), false).await {
                Ok(r) => {
                    for (event, to, subject, _, outcome) in &r.messages {
                        tracing::info!(%event, %to, %subject, %outcome, "notification");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "notification round failed; will retry"),
            }
        }
    });
}

/// `gpuledger notify [--dry-run]`.
async fn notify(
    dry_run: bool,
    at: Option<chrono::DateTime<chrono::Utc>>,
    db: DbArgs,
) -> anyhow::Result<()> {
    let cfg = load_config(db.config.as_ref())?;
    let Some(n) = cfg.notifications.clone() else {
        anyhow::bail!(
            "the config has no [notifications] section (see docs/notifications.md); pass it with \
             --config"
        );
    };
    let url = database_url(db.database_url, &cfg);
    let store = Store::open_for_tool(&url, cfg.settings.clone())
        .await
        .with_context(|| format!("opening database {}", redacted(&url)))?;
    let mut state = AppState::new(store, cfg.web);
    if let Some(at) = at {
        state.clock = std::sync::Arc::new(move || at);
    }
    let notifier = gpuledger_web::notify::Notifier::new(state.clone(), n);
    let report = notifier.round(state.now(), dry_run).await?;
    if report.messages.is_empty() {
        println!("nothing to send: every finding was already told, and no digest is due");
    }
    for (event, to, subject, link, outcome) in &report.messages {
        println!("{outcome:<12} {event:<8} {to}: {subject}\n             {link}");
    }
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let (cfg, text) = match &args.db.config {
        Some(path) => config::load_text(path)?,
        None => Default::default(),
    };
    let url = database_url(args.db.database_url, &cfg);
    let listen = args
        .listen
        .or(cfg.listen.clone())
        .unwrap_or_else(|| "127.0.0.1:8080".into());
    let plan = pull::plan(&cfg.collectors, &cfg.collector_hosts)?;
    let store = Store::open(&url, cfg.settings.clone())
        .await
        .with_context(|| format!("opening database {}", redacted(&url)))?;
    spawn_maintenance(store.clone());
    log_skipped(&plan.skipped);
    let state = AppState::new(store.clone(), cfg.web);
    if let Some(n) = cfg.notifications {
        spawn_notifier(gpuledger_web::notify::Notifier::new(state.clone(), n));
    }
    pull::count_runs_on(state.metrics.clone());
    let mut pulls = pull::Pulls::new(store.clone());
    pulls.apply(plan).await;
    // Before the address is printed: from then on a SIGHUP reloads instead of ending the process.
    spawn_reloads(args.db.config.clone(), text, pulls)?;
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    tracing::info!(listen = %listen, database = %redacted(&url), "gpuledger serving");
    let scheme = if state.config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    println!("gpuledger serving on {scheme}://{}", listener.local_addr()?);
    gpuledger_web::serve(listener, state, shutdown_signal()).await?;
    Ok(())
}

async fn backup(file: PathBuf, db: DbArgs) -> anyhow::Result<()> {
    let cfg = load_config(db.config.as_ref())?;
    let url = database_url(db.database_url, &cfg);
    let store = Store::open_for_tool(&url, cfg.settings)
        .await
        .with_context(|| format!("opening database {}", redacted(&url)))?;
    let started = std::time::Instant::now();
    let bytes = store.backup_to(&file).await?;
    println!(
        "backup written to {} ({:.1} MiB in {:.1} s) and checked; restore by stopping the \
         server and putting it in place of the database file",
        file.display(),
        bytes as f64 / 1_048_576.0,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn run_demo(args: DemoArgs) -> anyhow::Result<()> {
    let (store, mut state, _) = demo::open(args.database_url.clone(), args.days, "demo").await?;
    if let Some(until) = args.until {
        state.clock = std::sync::Arc::new(move || until);
    }
    let started = std::time::Instant::now();
    let demo = demo::load(&state, args.seed, args.days).await?;
    let gpus: u32 = demo.hosts.iter().map(|h| h.gpus).sum();
    tracing::info!(
        gpus,
        hosts = demo.hosts.len(),
        secs = started.elapsed().as_secs_f64(),
        "demo history loaded"
    );
    if args.load_only {
        let now = state.now();
        let window = gpuledger_store::Window {
            from: (now - chrono::Duration::days(30)).timestamp(),
            to: now.timestamp(),
        };
        let mut times = Vec::new();
        let mut summary = None;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            summary = Some(
                store
                    .summary(
                        window,
                        &Default::default(),
                        gpuledger_ledger::GroupBy::Team,
                        now,
                    )
                    .await?,
            );
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        println!("{}", serde_json::to_string_pretty(&summary)?);
        let first = times[0];
        times.sort_by(f64::total_cmp);
        eprintln!(
            "summary of 30 days over {gpus} GPUs: first {first:.1} ms, median of 5 {:.1} ms",
            times[2]
        );
        return Ok(());
    }
    if args.bench_pages {
        return bench::time_pages(state, &demo, 10).await;
    }
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    println!(
        "gpuledger demo: {gpus} simulated GPUs, {} days of history (demo data)",
        args.days
    );
    println!("dashboard:    http://{addr}/");
    println!("api:          http://{addr}/api/v1/summary");
    println!("push with:    curl -H 'Authorization: Bearer {}' -H 'Content-Type: application/json' -d @body.json http://{addr}/api/v1/ingest", demo.push_token);
    println!("ingest token: {}", demo.push_token);
    let live_state = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Err(e) = demo::live_round(&live_state, &demo, live_state.now()).await {
                tracing::warn!(error = %e, "demo live round failed");
            }
        }
    });
    spawn_maintenance(store);
    gpuledger_web::serve(listener, state, shutdown_signal()).await?;
    Ok(())
}

async fn collect(args: CollectArgs) -> anyhow::Result<()> {
    let cfg = config::load(&args.config)?;
    if !args.once || !args.dry_run {
        anyhow::bail!(
            "only `collect --once --dry-run` runs standalone; `gpuledger serve --config FILE` runs collectors continuously"
        );
    }
    if cfg.collectors.is_empty() {
        eprintln!(
            "no collectors configured in {}: nothing to collect",
            args.config.display()
        );
        return Ok(());
    }
    let mut failed = 0;
    let mut entries = Vec::new();
    for entry in &cfg.collectors {
        match entry.expand() {
            Ok(x) => {
                for s in &x.skipped {
                    failed += 1;
                    eprintln!("collector `{}` ({}): {s}", entry.name, entry.kind());
                }
                entries.extend(x.entries);
            }
            Err(e) => {
                failed += 1;
                eprintln!("collector `{}` ({}): {e}", entry.name, entry.kind());
            }
        }
    }
    for entry in &entries {
        eprintln!("collecting: {}", entry.describe());
        let result = match cfg
            .collector_hosts
            .check(entry)
            .and_then(|()| entry.build())
        {
            Ok(c) => c.collect_report().await,
            Err(e) => Err(e),
        };
        match result {
            Ok(report) => {
                for o in report.observations {
                    println!("{}", serde_json::to_string(&o)?);
                }
                for p in report.problems {
                    eprintln!(
                        "collector `{}` ({}): part failed: {p}",
                        entry.name,
                        entry.kind()
                    );
                }
            }
            Err(e) => {
                failed += 1;
                eprintln!("collector `{}` ({}): {e}", entry.name, entry.kind());
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} collector(s) failed");
    }
    Ok(())
}

/// `--from`: `YYYY-MM-DD` (midnight UTC) or RFC 3339.
fn parse_from(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc());
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.to_utc())
        .map_err(|e| format!("`{s}` is neither a date (2026-11-01) nor an RFC 3339 time: {e}"))
}

async fn reattribute(from: chrono::DateTime<chrono::Utc>, db: DbArgs) -> anyhow::Result<()> {
    if db.config.is_none() {
        anyhow::bail!(
            "reattribute applies the rules of a config file: give the server's with --config \
             FILE (or GPULEDGER_CONFIG)"
        );
    }
    let cfg = load_config(db.config.as_ref())?;
    let url = database_url(db.database_url, &cfg);
    let store = Store::open(&url, cfg.settings)
        .await
        .with_context(|| format!("opening database {}", redacted(&url)))?;
    let changed = store.reattribute(from).await?;
    store.close().await;
    println!(
        "re-attributed {changed} GPU(s) from {} with the current rules",
        from.format("%Y-%m-%d %H:00 UTC")
    );
    Ok(())
}

async fn import_billing(file: PathBuf, force: bool, db: DbArgs) -> anyhow::Result<()> {
    let cfg = load_config(db.config.as_ref())?;
    let url = database_url(db.database_url, &cfg);
    let store = Store::open_for_tool(&url, cfg.settings)
        .await
        .with_context(|| format!("opening database {}", redacted(&url)))?;
    let name = file.display().to_string();
    let done = pull::import_export(&store, &name, chrono::Utc::now(), force)
        .await
        .with_context(|| format!("importing {name}"));
    store.close().await;
    let done = done?;
    let report = &done.report;
    eprintln!(
        "{}: {} line(s), {} GPU-looking, {} matched to known hosts, {} unmatched, {} problem(s); {}",
        file.display(),
        report.lines,
        report.gpu_lines,
        report.matched_lines,
        report.unmatched.len(),
        report.problems.len(),
        if done.unchanged {
            "imported before with the same content: nothing changed (--force reconciles again)"
        } else if report.matched_lines == 0 {
            "stored; it bills no GPU gpuledger knows"
        } else {
            "stored: what it billed now shows beside the estimates"
        }
    );
    println!("{}", serde_json::to_string_pretty(report)?);
    Ok(())
}

/// Check a config file as `serve` reads it, collectors built as `serve` builds them, and print
/// every problem.
fn check_config(file: PathBuf) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let mut cfg = match config::parse(&text) {
        Ok(cfg) => cfg,
        Err(problems) => {
            for p in &problems {
                println!("{}:{p}", file.display());
            }
            anyhow::bail!("{} problem(s) in {}", problems.len(), file.display())
        }
    };
    let mut problems = config::read_assignments(&mut cfg, &file);
    let mut collectors = Vec::new();
    match pull::plan(&cfg.collectors, &cfg.collector_hosts) {
        Ok(plan) => {
            problems.extend(plan.skipped.iter().cloned());
            collectors.extend(plan.entries().map(|e| e.describe()));
        }
        Err(e) => problems.push(e.to_string()),
    }
    if !problems.is_empty() {
        for p in &problems {
            println!("{p}");
        }
        anyhow::bail!("{} problem(s) with {}", problems.len(), file.display());
    }
    let r = &cfg.settings.rates;
    let o = &cfg.settings.ownership;
    println!(
        "{}: ok ({} collector(s), {} rate override(s), {} instance price(s), {} on-prem \
         rate(s), {} ownership rule(s), {} assignment(s), {} team(s))",
        file.display(),
        collectors.len(),
        r.overrides.len(),
        r.instance_overrides.len(),
        r.onprem.len(),
        o.rules.len(),
        o.assignments.len(),
        cfg.web.teams.len()
    );
    for c in &collectors {
        println!("  collector {c}");
    }
    if let Some(n) = &cfg.notifications {
        println!(
            "  notifications: {} rule(s), {}, {} team(s) with contacts, e-mail {}",
            n.rules.len(),
            if n.digest.is_some() {
                "weekly digest"
            } else {
                "no digest"
            },
            n.teams.len(),
            n.smtp
                .as_ref()
                .map(|s| format!("via {}:{}", s.host, s.port))
                .unwrap_or_else(|| "not configured".into())
        );
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_tracing();
    // The agent is synchronous and small: it runs without the server's async runtime.
    let cli = match cli.command {
        Command::Agent(args) => {
            return match gpuledger_agent::run(args) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
        command => Cli { command },
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(a) => serve(a).await,
            Command::Token { command } => tokens::run(command).await,
            Command::Demo(a) => run_demo(a).await,
            Command::Bench(a) => bench::run(a).await,
            Command::Collect(a) => collect(a).await,
            Command::Agent(_) => unreachable!("handled before the runtime starts"),
            Command::CheckConfig { file } => check_config(file),
            Command::Forecast { command } => forecast::run(command).await,
            Command::Notify { dry_run, at, db } => notify(dry_run, at, db).await,
            Command::Backup { file, db } => backup(file, db).await,
            Command::Reattribute { from, db } => reattribute(from, db).await,
            Command::Import {
                command: ImportCommand::Billing { file, force, db },
            } => import_billing(file, force, db).await,
            Command::Import {
                command: ImportCommand::Inventory { args, db },
            } => inventory::run(args, db).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_database_password_never_reaches_the_logs() {
        assert_eq!(
            super::redacted("postgres://gl:s3cret@db.internal:5432/gpuledger?sslmode=require"),
            "postgres://gl:***@db.internal:5432/gpuledger?sslmode=require"
        );
        assert_eq!(
            super::redacted("postgres://gl@db:5432/gpuledger"),
            "postgres://gl@db:5432/gpuledger"
        );
        assert_eq!(
            super::redacted("/var/lib/gpuledger/gpuledger.db"),
            "/var/lib/gpuledger/gpuledger.db"
        );
        assert_eq!(
            super::redacted("sqlite://gpuledger.db"),
            "sqlite://gpuledger.db"
        );
    }
}
