//! gpuledger's store: one interface over SQLite (the embedded default) and PostgreSQL.
//!
//! Both backends run the same SQL, written with `$N` placeholders and rewritten to `?N` for
//! SQLite; schemas live in `migrations/{sqlite,postgres}` with identical names and are applied
//! in order at open. Times are unix seconds. Raw samples roll up per GPU per clock hour as they
//! arrive (a late sample re-rolls its hour), hours roll up per UTC day, and queries read the
//! rollups, never the raw samples.

mod audit;
mod backup;
mod billing;
mod dash;
mod float;
mod forecast;
mod groups;
mod identity;
mod ingest;
mod lease;
mod live;
mod notify;
mod owners;
mod partitions;
mod query;
mod rollup;
mod rows;
mod settled;
mod tokens;
mod wide;

use std::borrow::Cow;
use std::str::FromStr;

use gpuledger_ledger::Settings;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AnyPool, Executor};

pub use audit::{AuditCounts, AuditKey, AuditRow};
pub use billing::{BillingFile, BillingImport, UnseenSpend};
pub use dash::{Heatmap, SeriesPoint};
pub use ingest::{IngestOutcome, Principal};
pub use lease::Lease;
pub use live::KeptKind;
pub use notify::{Delivery, NotifyState};
pub use query::{CloudAccount, Filters, Window};
pub use tokens::{Role, TokenInfo, TokenRow};

/// Errors from the store; each says what to check.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database URL `{0}`: use sqlite://PATH (or a plain file path) or postgres://...")]
    BadUrl(String),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Bytes on disk, tables with their indexes (see [`Store::storage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Storage {
    /// Hour rollups (`gpu_hours`).
    pub hours: i64,
    /// Day rollups (`gpu_days`).
    pub days: i64,
    /// Raw samples.
    pub samples: i64,
    /// The per-day used-by rollup (`gpu_day_use`).
    pub day_use: i64,
    /// Every table.
    pub total: i64,
}

/// Which database a store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The store. Cheap to clone (a pool handle and settings).
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    settings: std::sync::Arc<Settings>,
    /// One writer at a time: ingest reads then writes, which SQLite cannot upgrade safely
    /// under concurrent writers, and the merge of a GPU's attributes is read-modify-write.
    write_lock: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// Answers over settled days kept between requests (`settled`).
    settled: std::sync::Arc<settled::Settled>,
    /// Answers kept between requests, brought up to date at each (`live`).
    live: std::sync::Arc<live::Lives>,
    /// GPU rows pushes rewrote since `gpus` was last vacuumed (PostgreSQL; `ingest.rs`).
    gpu_rewrites: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// How many rewrites of GPU rows call for vacuuming `gpus` ([`ingest::VACUUM_GPUS_AFTER`]).
    vacuum_gpus_after: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// When pushes vacuum and analyze the tables they grow (PostgreSQL; `ingest.rs`).
    upkeep: std::sync::Arc<Upkeep>,
}

/// The counts behind vacuuming and analyzing the tables pushes grow
/// (`Store::note_new_samples`).
#[derive(Debug)]
struct Upkeep {
    /// Samples stored since the last analysis was started.
    new_samples: std::sync::atomic::AtomicU64,
    /// Samples stored before it, since the server started.
    analyzed_samples: std::sync::atomic::AtomicU64,
    /// The least number of new samples that calls for one ([`ingest::ANALYZE_AFTER_SAMPLES`]).
    analyze_after: std::sync::atomic::AtomicU64,
    /// One is running.
    analyzing: std::sync::atomic::AtomicBool,
}

impl Default for Upkeep {
    fn default() -> Self {
        Upkeep {
            new_samples: Default::default(),
            analyzed_samples: Default::default(),
            analyze_after: ingest::ANALYZE_AFTER_SAMPLES.into(),
            analyzing: Default::default(),
        }
    }
}

/// The end of an open owner period (year 10000), so periods join on a plain range.
pub(crate) const OPEN_END: i64 = 253_402_300_800;

const SQLITE_MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "init",
        include_str!("../migrations/sqlite/0001_init.sql"),
    ),
    (
        2,
        "kubernetes",
        include_str!("../migrations/sqlite/0002_kubernetes.sql"),
    ),
    (
        3,
        "owner_history",
        include_str!("../migrations/sqlite/0003_owner_history.sql"),
    ),
    (
        4,
        "workload_ownership",
        include_str!("../migrations/sqlite/0004_workload_ownership.sql"),
    ),
    (
        5,
        "billing",
        include_str!("../migrations/sqlite/0005_billing.sql"),
    ),
    (
        6,
        "day_use",
        include_str!("../migrations/sqlite/0006_day_use.sql"),
    ),
    (
        7,
        "hour_layout",
        include_str!("../migrations/sqlite/0007_hour_layout.sql"),
    ),
    (
        8,
        "token_lifecycle",
        include_str!("../migrations/sqlite/0008_token_lifecycle.sql"),
    ),
    (
        9,
        "audit",
        include_str!("../migrations/sqlite/0009_audit.sql"),
    ),
    (
        10,
        "host_instances",
        include_str!("../migrations/sqlite/0010_host_instances.sql"),
    ),
    (
        11,
        "vendor",
        include_str!("../migrations/sqlite/0011_vendor.sql"),
    ),
    (
        12,
        "day_by_gpu",
        include_str!("../migrations/sqlite/0012_day_by_gpu.sql"),
    ),
    (
        13,
        "allocation_average",
        include_str!("../migrations/sqlite/0013_allocation_average.sql"),
    ),
    (
        14,
        "notifications",
        include_str!("../migrations/sqlite/0014_notifications.sql"),
    ),
    (
        15,
        "day_running_totals",
        include_str!("../migrations/sqlite/0015_day_running_totals.sql"),
    ),
    (
        16,
        "group_rollups",
        include_str!("../migrations/sqlite/0016_group_rollups.sql"),
    ),
    (
        17,
        "day_evidence_index",
        include_str!("../migrations/sqlite/0017_day_evidence_index.sql"),
    ),
    (
        18,
        "allocations_end_index",
        include_str!("../migrations/sqlite/0018_allocations_end_index.sql"),
    ),
    (
        19,
        "gpus_source",
        include_str!("../migrations/sqlite/0019_gpus_source.sql"),
    ),
    (
        20,
        "gpus_filter_values",
        include_str!("../migrations/sqlite/0020_gpus_filter_values.sql"),
    ),
    (
        21,
        "host_instances_backfill",
        include_str!("../migrations/sqlite/0021_host_instances_backfill.sql"),
    ),
    (
        22,
        "live_today",
        include_str!("../migrations/sqlite/0022_live_today.sql"),
    ),
    (
        23,
        "live_allocations_gone",
        include_str!("../migrations/sqlite/0023_live_allocations_gone.sql"),
    ),
    (
        24,
        "group_clean_hours",
        include_str!("../migrations/sqlite/0024_group_clean_hours.sql"),
    ),
    (
        25,
        "time_statistics",
        include_str!("../migrations/sqlite/0025_time_statistics.sql"),
    ),
];
const POSTGRES_MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "init",
        include_str!("../migrations/postgres/0001_init.sql"),
    ),
    (
        2,
        "kubernetes",
        include_str!("../migrations/postgres/0002_kubernetes.sql"),
    ),
    (
        3,
        "owner_history",
        include_str!("../migrations/postgres/0003_owner_history.sql"),
    ),
    (
        4,
        "workload_ownership",
        include_str!("../migrations/postgres/0004_workload_ownership.sql"),
    ),
    (
        5,
        "billing",
        include_str!("../migrations/postgres/0005_billing.sql"),
    ),
    (
        6,
        "day_use",
        include_str!("../migrations/postgres/0006_day_use.sql"),
    ),
    (
        7,
        "hour_layout",
        include_str!("../migrations/postgres/0007_hour_layout.sql"),
    ),
    (
        8,
        "token_lifecycle",
        include_str!("../migrations/postgres/0008_token_lifecycle.sql"),
    ),
    (
        9,
        "audit",
        include_str!("../migrations/postgres/0009_audit.sql"),
    ),
    (
        10,
        "host_instances",
        include_str!("../migrations/postgres/0010_host_instances.sql"),
    ),
    (
        11,
        "vendor",
        include_str!("../migrations/postgres/0011_vendor.sql"),
    ),
    (
        12,
        "day_by_gpu",
        include_str!("../migrations/postgres/0012_day_by_gpu.sql"),
    ),
    (
        13,
        "allocation_average",
        include_str!("../migrations/postgres/0013_allocation_average.sql"),
    ),
    (
        14,
        "notifications",
        include_str!("../migrations/postgres/0014_notifications.sql"),
    ),
    (
        15,
        "day_running_totals",
        include_str!("../migrations/postgres/0015_day_running_totals.sql"),
    ),
    (
        16,
        "group_rollups",
        include_str!("../migrations/postgres/0016_group_rollups.sql"),
    ),
    (
        17,
        "day_evidence_index",
        include_str!("../migrations/postgres/0017_day_evidence_index.sql"),
    ),
    (
        18,
        "allocations_end_index",
        include_str!("../migrations/postgres/0018_allocations_end_index.sql"),
    ),
    (
        19,
        "gpus_source",
        include_str!("../migrations/postgres/0019_gpus_source.sql"),
    ),
    (
        20,
        "gpus_filter_values",
        include_str!("../migrations/postgres/0020_gpus_filter_values.sql"),
    ),
    (
        21,
        "host_instances_backfill",
        include_str!("../migrations/postgres/0021_host_instances_backfill.sql"),
    ),
    (
        22,
        "live_today",
        include_str!("../migrations/postgres/0022_live_today.sql"),
    ),
    (
        23,
        "live_allocations_gone",
        include_str!("../migrations/postgres/0023_live_allocations_gone.sql"),
    ),
    (
        24,
        "group_clean_hours",
        include_str!("../migrations/postgres/0024_group_clean_hours.sql"),
    ),
    (
        25,
        "time_statistics",
        include_str!("../migrations/postgres/0025_time_statistics.sql"),
    ),
];

/// Whether the `$N` parameters of `sql` are `$1, $2, …, $n` in order, each once.
fn params_in_order(sql: &str) -> bool {
    let mut want = 1u64;
    let bytes = sql.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' {
            let start = i + 1;
            let mut end = start;
            while end < bytes.len() && bytes[end].is_ascii_digit() {
                end += 1;
            }
            match sql[start..end].parse::<u64>() {
                Ok(n) if n == want => want += 1,
                _ => return false,
            }
            i = end;
        } else {
            i += 1;
        }
    }
    true
}

/// `$N` → `?`.
fn strip_param_numbers(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut digits = false;
    for c in sql.chars() {
        if c == '$' {
            out.push('?');
            digits = true;
        } else if digits && c.is_ascii_digit() {
        } else {
            digits = false;
            out.push(c);
        }
    }
    out
}

/// Turn a user's database setting into a URL sqlx understands: a plain path or `sqlite://PATH`
/// becomes a SQLite file created when missing.
pub fn normalize_url(url: &str) -> Result<(Backend, String)> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok((Backend::Postgres, url.to_string()));
    }
    let path = if let Some(rest) = url.strip_prefix("sqlite://") {
        rest
    } else if let Some(rest) = url.strip_prefix("sqlite:") {
        rest
    } else if url.contains("://") || url.is_empty() {
        return Err(StoreError::BadUrl(url.to_string()));
    } else {
        url
    };
    if path.contains('?') {
        return Ok((Backend::Sqlite, format!("sqlite://{path}")));
    }
    Ok((Backend::Sqlite, format!("sqlite://{path}?mode=rwc")))
}

/// Refuse a damaged SQLite file (a truncated copy, a disk that lost pages) before serving from
/// it: `PRAGMA quick_check` on one connection reads every page once, so a large file takes
/// longer to start. A torn write-ahead log is not damage: SQLite drops the frames of the commit
/// it was writing, and the database is as of the commit before. Errors that are not about the
/// file's contents (a folder that is missing, no permission) pass through as they are.
async fn check_sqlite_file(opts: &AnyConnectOptions) -> Result<()> {
    use sqlx::{ConnectOptions, Connection};
    let damaged = |first: String, count: usize| {
        StoreError::Invalid(format!(
            "the database file is damaged ({count} problem(s); first: {first}); nothing was \
             served from it: restore the last backup (`gpuledger backup` makes them) or move \
             the file away to start afresh"
        ))
    };
    let is_damage = |e: &sqlx::Error| {
        let t = e.to_string();
        t.contains("malformed") || t.contains("not a database") || t.contains("corrupt")
    };
    let started = std::time::Instant::now();
    let mut conn = match opts.connect().await {
        Ok(c) => c,
        Err(e) if is_damage(&e) => return Err(damaged(e.to_string(), 1)),
        Err(e) => return Err(e.into()),
    };
    let found: std::result::Result<Vec<String>, sqlx::Error> =
        sqlx::query_scalar("PRAGMA quick_check")
            .fetch_all(&mut conn)
            .await;
    let _ = conn.close().await;
    match found {
        Ok(rows) if rows.len() == 1 && rows[0] == "ok" => {}
        Ok(rows) => return Err(damaged(rows[0].clone(), rows.len())),
        Err(e) if is_damage(&e) => return Err(damaged(e.to_string(), 1)),
        Err(e) => return Err(e.into()),
    }
    tracing::debug!(
        ms = started.elapsed().as_millis() as u64,
        "database file checked"
    );
    Ok(())
}

/// The migrations of `backend` up to `version`, as one migrator.
///
/// Rolling upgrades: a replica of the previous release must keep starting and serving on a
/// database that a newer replica has migrated, so the migrator ignores applied migrations it
/// does not know (`ignore_missing`) instead of refusing to start, and every migration keeps what
/// the previous release reads and writes (tables and columns stay; a column it adds to an
/// existing table is nullable or has a default). `migrations_keep_what_the_previous_release_uses`
/// checks the second half on both backends. Two replicas starting at once take turns: the
/// migrator holds the database's migration lock.
fn migrator(backend: Backend, version: i64) -> Migrator {
    let list = match backend {
        Backend::Sqlite => SQLITE_MIGRATIONS,
        Backend::Postgres => POSTGRES_MIGRATIONS,
    };
    let migrations: Vec<Migration> = list
        .iter()
        .filter(|(v, _, _)| *v <= version)
        .map(|(v, d, sql)| {
            Migration::new(
                *v,
                Cow::Borrowed(*d),
                MigrationType::Simple,
                Cow::Borrowed(*sql),
                false,
            )
        })
        .collect();
    Migrator {
        migrations: Cow::Owned(migrations),
        ignore_missing: true,
        ..Migrator::DEFAULT
    }
}

impl Store {
    /// Open (creating when missing) and migrate the database at `url`.
    pub async fn open(url: &str, settings: Settings) -> Result<Store> {
        Store::open_in_schema(url, None, settings).await
    }

    /// Open for a one-off command (`token create`, `import billing`): migrate, but leave
    /// owners, environments and rates as the server derived them. A command run without the
    /// server's config must not re-decide owners with empty rules and so write owner history.
    pub async fn open_for_tool(url: &str, settings: Settings) -> Result<Store> {
        Store::open_with(url, None, settings, false).await
    }

    /// Like [`Store::open`], with every PostgreSQL connection working in `schema` (created when
    /// missing). Tests use it to give each test its own schema.
    pub async fn open_in_schema(
        url: &str,
        schema: Option<&str>,
        settings: Settings,
    ) -> Result<Store> {
        Store::open_with(url, schema, settings, true).await
    }

    async fn open_with(
        url: &str,
        schema: Option<&str>,
        settings: Settings,
        apply_settings: bool,
    ) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let (backend, url) = normalize_url(url)?;
        let opts = AnyConnectOptions::from_str(&url)?;
        let schema = schema.map(|s| s.to_string());
        if let (Backend::Postgres, Some(s)) = (backend, &schema) {
            if !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(StoreError::Invalid(format!("bad schema name `{s}`")));
            }
            let pool = AnyPoolOptions::new()
                .max_connections(1)
                .connect_with(opts.clone())
                .await?;
            pool.execute(format!("CREATE SCHEMA IF NOT EXISTS {s}").as_str())
                .await?;
            pool.close().await;
        }
        // The server checks a SQLite file before serving from it; a one-off command (a token,
        // an import) does not read every page of a large file each time.
        if backend == Backend::Sqlite && apply_settings {
            check_sqlite_file(&opts).await?;
        }
        let max = match backend {
            Backend::Sqlite => 4,
            Backend::Postgres => 8,
        };
        // SQLite's durability (see `Settings::sqlite_full_sync`): NORMAL in WAL mode survives a
        // crash of the process, FULL also a crash of the machine.
        let synchronous = if settings.sqlite_full_sync {
            "FULL"
        } else {
            "NORMAL"
        };
        // A size cap in pages of the default 4 KiB; SQLite answers "database or disk is full"
        // beyond it, as on a full disk.
        let max_pages = settings
            .sqlite_max_size_mib
            .map(|mib| {
                format!(
                    " PRAGMA max_page_count = {};",
                    mib.saturating_mul(256).max(1)
                )
            })
            .unwrap_or_default();
        let pool = AnyPoolOptions::new()
            .max_connections(max)
            .after_connect(move |conn, _meta| {
                let schema = schema.clone();
                let max_pages = max_pages.clone();
                Box::pin(async move {
                    match backend {
                        Backend::Sqlite => {
                            conn.execute(
                                format!(
                                    "PRAGMA journal_mode = WAL; PRAGMA synchronous = {synchronous}; \
                                     PRAGMA busy_timeout = 10000; PRAGMA foreign_keys = ON; \
                                     PRAGMA cache_size = -65536; PRAGMA mmap_size = 2147418112;\
                                     {max_pages}"
                                )
                                .as_str(),
                            )
                            .await?;
                        }
                        Backend::Postgres => {
                            // Floats written as text (the wide reads, `wide.rs`) in their
                            // shortest exact form, whatever the server's default.
                            conn.execute("SET extra_float_digits = 3").await?;
                            // No JIT compilation: the statements here are short, and a
                            // re-roll over tables not yet analyzed is costed high enough to
                            // compile, which took two thirds of its 560 ms at 10,000 GPUs.
                            conn.execute("SET jit = off").await?;
                            if let Some(s) = schema {
                                conn.execute(format!("SET search_path TO {s}").as_str())
                                    .await?;
                            }
                        }
                    }
                    Ok(())
                })
            })
            .connect_with(opts)
            .await?;
        let mut store = Store {
            pool,
            backend,
            settings: std::sync::Arc::new(settings),
            write_lock: Default::default(),
            settled: Default::default(),
            live: Default::default(),
            gpu_rewrites: Default::default(),
            vacuum_gpus_after: std::sync::Arc::new(ingest::VACUUM_GPUS_AFTER.into()),
            upkeep: Default::default(),
        };
        store.migrate().await?;
        store
            .ensure_partitions(chrono::Utc::now().timestamp())
            .await?;
        if apply_settings {
            store.apply_settings().await?;
        } else {
            store.use_stored_settings().await?;
        }
        Ok(store)
    }

    /// Drop a PostgreSQL schema and everything in it (test isolation).
    pub async fn drop_schema(url: &str, schema: &str) -> Result<()> {
        sqlx::any::install_default_drivers();
        if !schema
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(StoreError::Invalid(format!("bad schema name `{schema}`")));
        }
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect_with(AnyConnectOptions::from_str(url)?)
            .await?;
        pool.execute(format!("DROP SCHEMA IF EXISTS {schema} CASCADE").as_str())
            .await?;
        pool.close().await;
        Ok(())
    }

    async fn migrate(&self) -> Result<()> {
        migrator(self.backend, i64::MAX).run(&self.pool).await?;
        Ok(())
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The SQL for this backend: `$N` placeholders become `?N` on SQLite.
    /// SQLite binds numbered parameters by looking each name up in a list, so a statement
    /// whose parameters run `$1, $2, …` in order once each gets plain `?` (positional) there.
    pub(crate) fn sql<'a>(&self, sql: &'a str) -> Cow<'a, str> {
        match self.backend {
            Backend::Postgres => Cow::Borrowed(sql),
            Backend::Sqlite if params_in_order(sql) => Cow::Owned(strip_param_numbers(sql)),
            Backend::Sqlite => Cow::Owned(sql.replace('$', "?")),
        }
    }

    /// The database pool's connections: open, and of them idle.
    pub fn pool_stats(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
    }

    /// Begin a writing transaction. The caller holds `write_lock` (one writer in this
    /// process); on PostgreSQL the transaction also takes an advisory lock held until it ends,
    /// so the writers of several replicas on one database take turns as one process's do.
    /// (Two pushes for the same GPU already wait on its row; writes that share no row, such
    /// as re-rolls of different GPUs' days and owner changes, did not.) On SQLite it begins
    /// `IMMEDIATE`, taking the database's write lock at once: a transaction that read first
    /// and wrote later would fail ("database is locked", 517) whenever a write outside
    /// `write_lock` (a token's last use, a lease) committed in between, while one that holds
    /// the lock makes those writes wait (`busy_timeout`).
    pub(crate) async fn writer_tx(&self) -> Result<sqlx::Transaction<'_, sqlx::Any>> {
        let mut tx = match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => self.pool.begin().await?,
        };
        if self.backend == Backend::Postgres {
            sqlx::query(
                "SELECT pg_advisory_xact_lock(hashtext('gpuledger writers ' || current_schema()))",
            )
            .execute(&mut *tx)
            .await?;
        }
        Ok(tx)
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Run a trivial query (`SELECT 1`): whether the database answers now. The server's
    /// readiness probe (`/readyz`) asks it.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Close the pool, finishing in-flight work.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Bring derived data in line with the settings this store was opened with: re-derive owner,
    /// environment and rate of every GPU (the config's rates may have changed), and rebuild the
    /// day rollups when the idle threshold differs from the one they were built with.
    async fn apply_settings(&self) -> Result<()> {
        self.fill_holders_once().await?;
        self.refresh_allocated_once().await?;
        self.fill_day_use_once().await?;
        self.rederive_all_gpus().await?;
        let want = self.settings.idle_threshold_pct.to_string();
        let have: Option<String> = sqlx::query_scalar(
            &self.sql("SELECT value FROM meta WHERE key = 'idle_threshold_pct'"),
        )
        .fetch_optional(&self.pool)
        .await?;
        if have.as_deref() != Some(want.as_str()) {
            if have.is_some() {
                tracing::info!(threshold = %want, "idle threshold changed; rebuilding day rollups");
                self.rebuild_days().await?;
            }
            sqlx::query(&self.sql(
                "INSERT INTO meta (key, value) VALUES ('idle_threshold_pct', $1) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            ))
            .bind(want)
            .execute(&self.pool)
            .await?;
        }
        Ok(())
    }

    /// A one-off command re-rolls with the settings the data was rolled up with, whatever its
    /// own flags or config say: the idle threshold the day rollups bake in is read back from
    /// the store (the server records it at start-up), so `import billing` run without the
    /// server's config never rewrites day rows with the default threshold.
    async fn use_stored_settings(&mut self) -> Result<()> {
        let stored: Option<String> = sqlx::query_scalar(
            &self.sql("SELECT value FROM meta WHERE key = 'idle_threshold_pct'"),
        )
        .fetch_optional(&self.pool)
        .await?;
        let Some(stored) = stored else {
            return Ok(());
        };
        let threshold: f64 = stored.parse().map_err(|_| {
            StoreError::Invalid(format!(
                "the stored idle threshold `{stored}` is not a number; start `gpuledger serve` \
                 with the config once to record it again"
            ))
        })?;
        if threshold != self.settings.idle_threshold_pct {
            tracing::info!(
                stored = threshold,
                given = self.settings.idle_threshold_pct,
                "using the idle threshold the rollups were built with"
            );
            let mut s = (*self.settings).clone();
            s.idle_threshold_pct = threshold;
            self.settings = std::sync::Arc::new(s);
        }
        Ok(())
    }

    /// A database from before holders were kept gets them once from its allocations.
    async fn fill_holders_once(&self) -> Result<()> {
        let done: Option<String> =
            sqlx::query_scalar(&self.sql("SELECT value FROM meta WHERE key = 'holders'"))
                .fetch_optional(&self.pool)
                .await?;
        if done.is_some() {
            return Ok(());
        }
        let _writer = self.write_lock.lock().await;
        let ids: Vec<i64> = sqlx::query_scalar("SELECT DISTINCT gpu_id FROM allocations")
            .fetch_all(&self.pool)
            .await?;
        let mut tx = self.pool.begin().await?;
        let server = crate::Principal {
            source: "gpuledger".into(),
            teams: None,
            kind: "server".into(),
        };
        self.refresh_holders(&mut tx, &server, &ids, chrono::Utc::now().timestamp())
            .await?;
        sqlx::query(&self.sql("INSERT INTO meta (key, value) VALUES ('holders', '1')"))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Bytes on disk of the tables that grow with the fleet and the history, with their
    /// indexes (SQLite: `dbstat`; PostgreSQL: `pg_total_relation_size`), for the benchmark.
    pub async fn storage(&self) -> Result<Storage> {
        let tables = ["gpu_hours", "gpu_days", "samples", "gpu_day_use"];
        let mut sizes = [0i64; 4];
        for (i, t) in tables.iter().enumerate() {
            sizes[i] = match self.backend {
                Backend::Sqlite => sqlx::query_scalar::<_, Option<i64>>(&format!(
                    "SELECT CAST(SUM(pgsize) AS BIGINT) FROM dbstat WHERE name = '{t}' \
                     OR name IN (SELECT name FROM sqlite_master WHERE tbl_name = '{t}')"
                ))
                .fetch_one(&self.pool)
                .await?
                .unwrap_or(0),
                // A partitioned table's size is its partitions'.
                Backend::Postgres => sqlx::query_scalar::<_, Option<i64>>(&format!(
                    "SELECT CAST(SUM(pg_total_relation_size(c)) AS BIGINT) FROM (\
                     SELECT to_regclass('{t}') AS c UNION ALL SELECT inhrelid FROM pg_inherits \
                     WHERE inhparent = to_regclass('{t}')) x"
                ))
                .fetch_one(&self.pool)
                .await?
                .unwrap_or(0),
            };
        }
        let total: Option<i64> =
            match self.backend {
                Backend::Sqlite => {
                    sqlx::query_scalar("SELECT CAST(SUM(pgsize) AS BIGINT) FROM dbstat")
                        .fetch_one(&self.pool)
                        .await?
                }
                Backend::Postgres => sqlx::query_scalar(
                    "SELECT CAST(SUM(pg_total_relation_size(c.oid)) AS BIGINT) FROM pg_class c \
                     JOIN pg_namespace n ON n.oid = c.relnamespace \
                     WHERE c.relkind IN ('r', 'p') AND n.nspname = current_schema()",
                )
                .fetch_one(&self.pool)
                .await?,
            };
        Ok(Storage {
            hours: sizes[0],
            days: sizes[1],
            samples: sizes[2],
            day_use: sizes[3],
            total: total.unwrap_or(0),
        })
    }

    /// Refresh the query planner's statistics of the tables that grow with the fleet, so plans
    /// stay right as they grow: `ANALYZE` on PostgreSQL (what autovacuum does when it is on),
    /// `PRAGMA optimize` on SQLite. The server runs it hourly with pruning. On PostgreSQL it
    /// also vacuums `gpus` and `sources`: every push rewrites rows of theirs (last seen, last
    /// success), so a few thousand live rows pile up dead versions by the hundred thousand
    /// between autovacuum's runs (or for good where it is off), and every page reads them.
    pub async fn analyze(&self) -> Result<()> {
        // It writes statistics: one writer at a time, as for ingest (a SQLite write beside an
        // ingest's transaction would make that one fail busy).
        let _writer = self.write_lock.lock().await;
        let sqls: &[&str] = match self.backend {
            Backend::Postgres => &[
                "VACUUM (ANALYZE) gpus, sources, group_dirty",
                "ANALYZE gpu_hours, gpu_days, gpu_day_use, gpu_day_idle, gpu_owners, \
                 allocations, samples, group_days, group_hours, fleet_groups",
            ],
            Backend::Sqlite => &["PRAGMA optimize"],
        };
        for sql in sqls {
            sqlx::query(sql).execute(&self.pool).await?;
        }
        Ok(())
    }

    /// On PostgreSQL, `VACUUM (ANALYZE)` every table that grows with the fleet: what
    /// autovacuum does after a bulk load, for a benchmark to time the pages as a server with
    /// autovacuum on would serve them. Nothing on SQLite, which keeps no dead row versions.
    pub async fn vacuum(&self) -> Result<()> {
        if self.backend == Backend::Postgres {
            let _writer = self.write_lock.lock().await;
            sqlx::query(
                "VACUUM (ANALYZE) gpus, sources, gpu_hours, gpu_days, gpu_day_use, \
                 gpu_day_idle, gpu_owners, allocations, samples, group_days, group_hours, \
                 fleet_groups, group_dirty",
            )
            .execute(&self.pool)
            .await?;
        }
        Ok(())
    }

    /// Delete raw samples and rollups past their retention. Raw samples go by whole hours so
    /// that an hour is never half pruned.
    pub async fn prune(&self, now_secs: i64) -> Result<(u64, u64)> {
        let _writer = self.write_lock.lock().await;
        let raw_cutoff = self.raw_cutoff(now_secs) - gpuledger_model::HOUR_SECS;
        let rollup_cutoff = gpuledger_model::day_floor(
            now_secs - self.settings.rollup_retention_days * gpuledger_model::DAY_SECS,
        );
        // PostgreSQL: whole partitions past retention are dropped, then the partly expired
        // rest deleted; the next days' partitions are made.
        let mut raw = 0;
        let mut hours = 0;
        if self.backend == Backend::Postgres {
            self.ensure_partitions(now_secs).await?;
            raw += self.drop_partitions_before("samples", raw_cutoff).await?;
            hours += self
                .drop_partitions_before("gpu_hours", rollup_cutoff)
                .await?;
        }
        raw += sqlx::query(&self.sql("DELETE FROM samples WHERE ts < $1"))
            .bind(raw_cutoff)
            .execute(&self.pool)
            .await?
            .rows_affected();
        hours += sqlx::query(&self.sql("DELETE FROM gpu_hours WHERE hour < $1"))
            .bind(rollup_cutoff)
            .execute(&self.pool)
            .await?
            .rows_affected();
        // The hourly group rows go with the hours they sum (`crate::groups`), and so do the
        // hours listed clean.
        for table in ["group_hours", "group_clean_hours"] {
            sqlx::query(&self.sql(&format!("DELETE FROM {table} WHERE hour < $1")))
                .bind(rollup_cutoff)
                .execute(&self.pool)
                .await?;
        }
        let audit_cutoff =
            now_secs - self.settings.audit_retention_days * gpuledger_model::DAY_SECS;
        sqlx::query(&self.sql("DELETE FROM audit_log WHERE minute < $1"))
            .bind(audit_cutoff)
            .execute(&self.pool)
            .await?;
        // The delivery log is an audit record too: kept as long.
        sqlx::query(&self.sql("DELETE FROM notify_log WHERE at < $1"))
            .bind(audit_cutoff)
            .execute(&self.pool)
            .await?;
        // The day group rows and the days listed for their rebuild go with the day rows (after
        // them: removing day rows lists their days).
        for table in [
            "gpu_days",
            "gpu_day_use",
            "gpu_day_idle",
            "group_days",
            "group_dirty",
        ] {
            if table == "group_dirty" {
                // The days go off the list of changed days (where removing their day rows put
                // them): answers kept over them are read again (`crate::settled`).
                sqlx::query(settled::BUMP).execute(&self.pool).await?;
            }
            sqlx::query(&self.sql(&format!("DELETE FROM {table} WHERE day < $1")))
                .bind(rollup_cutoff)
                .execute(&self.pool)
                .await?;
        }
        Ok((raw, hours))
    }

    /// The earliest sample time still accepted: the start of the first hour whose raw samples
    /// are all within retention (so a late sample never re-rolls a half-pruned hour).
    pub(crate) fn raw_cutoff(&self, now_secs: i64) -> i64 {
        gpuledger_model::hour_floor(
            now_secs - self.settings.raw_retention_days * gpuledger_model::DAY_SECS,
        ) + gpuledger_model::HOUR_SECS
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sqlite_gets_positional_parameters_only_when_they_run_in_order() {
        use super::{params_in_order, strip_param_numbers};
        assert!(params_in_order("VALUES ($1,$2),($3,$4)"));
        assert_eq!(
            strip_param_numbers("VALUES ($1,$2),($3,$4)"),
            "VALUES (?,?),(?,?)"
        );
        assert!(!params_in_order("a = $2 AND b = $1"));
        assert!(!params_in_order("a = $1 AND b = $1"));
        assert!(!params_in_order("a = $1 AND b = $3"));
        assert!(params_in_order("no parameters"));
    }

    use super::*;

    #[test]
    fn urls_select_the_backend() {
        assert_eq!(
            normalize_url("gpuledger.db").unwrap(),
            (Backend::Sqlite, "sqlite://gpuledger.db?mode=rwc".into())
        );
        assert_eq!(
            normalize_url("sqlite:///tmp/x.db").unwrap().1,
            "sqlite:///tmp/x.db?mode=rwc"
        );
        assert_eq!(
            normalize_url("postgres://h/db").unwrap().0,
            Backend::Postgres
        );
        assert!(normalize_url("mysql://h/db").is_err());
    }

    /// Columns of every table in the pool's database (schema): notnull, has a default.
    async fn columns(
        pool: &AnyPool,
        backend: Backend,
    ) -> std::collections::BTreeMap<(String, String), (bool, bool)> {
        let sql = match backend {
            Backend::Sqlite => {
                "SELECT m.name, p.name, p.\"notnull\", CASE WHEN p.dflt_value IS NULL \
                 THEN 0 ELSE 1 END FROM sqlite_master m, pragma_table_info(m.name) p \
                 WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' \
                 AND m.name <> '_sqlx_migrations'"
            }
            Backend::Postgres => {
                "SELECT table_name::text, column_name::text, \
                 CASE WHEN is_nullable::text = 'NO' THEN 1 ELSE 0 END, \
                 CASE WHEN column_default IS NULL THEN 0 ELSE 1 END \
                 FROM information_schema.columns WHERE table_schema = current_schema() \
                 AND table_name::text <> '_sqlx_migrations'"
            }
        };
        let rows: Vec<(String, String, i32, i32)> =
            sqlx::query_as(sql).fetch_all(pool).await.unwrap();
        rows.into_iter()
            .map(|(t, c, nn, d)| ((t, c), (nn != 0, d != 0)))
            .collect()
    }

    /// What each migration would break for a replica of the release before it, which keeps
    /// serving during a rolling upgrade: a table or column it used that is gone, or a new
    /// required column its inserts do not name.
    async fn upgrade_breaks(pool: &AnyPool, backend: Backend) -> Vec<String> {
        let list = match backend {
            Backend::Sqlite => SQLITE_MIGRATIONS,
            Backend::Postgres => POSTGRES_MIGRATIONS,
        };
        let mut breaks = Vec::new();
        let mut before = columns(pool, backend).await;
        for (v, name, _) in list {
            migrator(backend, *v).run(pool).await.unwrap();
            let after = columns(pool, backend).await;
            let tables_before: std::collections::BTreeSet<&String> =
                before.keys().map(|(t, _)| t).collect();
            for ((table, column), (notnull, default)) in &after {
                let key = (table.clone(), column.clone());
                match before.get(&key) {
                    None if tables_before.contains(table) && *notnull && !*default => breaks
                        .push(format!(
                            "{v:04}_{name}: new column {table}.{column} is NOT NULL without a default"
                        )),
                    Some((false, _)) if *notnull && !*default => breaks.push(format!(
                        "{v:04}_{name}: column {table}.{column} became NOT NULL without a default"
                    )),
                    _ => {}
                }
            }
            for (table, column) in before.keys() {
                if !after.contains_key(&(table.clone(), column.clone())) {
                    breaks.push(format!("{v:04}_{name}: column {table}.{column} is gone"));
                }
            }
            before = after;
        }
        breaks
    }

    /// Migrations that broke the rule before rolling upgrades were supported; none may join.
    const BEFORE_ROLLING_UPGRADES: &[&str] = &[];

    async fn check_upgrades(pool: AnyPool, backend: Backend) {
        let breaks = upgrade_breaks(&pool, backend).await;
        let new: Vec<&String> = breaks
            .iter()
            .filter(|b| !BEFORE_ROLLING_UPGRADES.iter().any(|old| b.starts_with(old)))
            .collect();
        assert!(
            new.is_empty(),
            "{backend:?}: a replica of the previous release could not keep serving: {new:#?}"
        );
        // A replica of the previous release starts on the migrated database: it knows one
        // migration fewer than the database has applied.
        let last = match backend {
            Backend::Sqlite => SQLITE_MIGRATIONS,
            Backend::Postgres => POSTGRES_MIGRATIONS,
        }
        .last()
        .unwrap()
        .0;
        migrator(backend, last - 1).run(&pool).await.unwrap();
        // Without `ignore_missing` the same start is refused: the test can fail.
        let mut strict = migrator(backend, last - 1);
        strict.ignore_missing = false;
        assert!(strict.run(&pool).await.is_err());
    }

    /// A truncated database file is refused at open, saying so; a torn write-ahead log opens
    /// as of the last whole commit.
    #[tokio::test]
    async fn a_damaged_database_file_is_refused_and_a_torn_wal_is_not_damage() {
        let dir = std::env::temp_dir().join(format!("gpuledger-damage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("d.db");
        let url = format!("sqlite://{}", file.display());
        let store = Store::open(&url, Default::default()).await.unwrap();
        for i in 0..200 {
            store
                .create_token(Role::Ingest, &format!("s{i}"), &[])
                .await
                .unwrap();
        }
        store.pool.close().await;
        // The file as written: it opens.
        let copy = dir.join("c.db");
        std::fs::copy(&file, &copy).unwrap();
        Store::open(&format!("sqlite://{}", copy.display()), Default::default())
            .await
            .unwrap()
            .pool
            .close()
            .await;
        // Cut in the middle, as a copy interrupted or a disk that lost its tail.
        let len = std::fs::metadata(&file).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.set_len(len / 2).unwrap();
        drop(f);
        let err = Store::open(&url, Default::default()).await.err().unwrap();
        assert!(err.to_string().contains("damaged"), "{err}");

        // A write-ahead log cut mid-frame: the last commit is gone, the rest is served.
        let wal_db = dir.join("w.db");
        let wal_url = format!("sqlite://{}", wal_db.display());
        let store = Store::open(&wal_url, Default::default()).await.unwrap();
        sqlx::query("PRAGMA wal_autocheckpoint = 0")
            .execute(&store.pool)
            .await
            .unwrap();
        store.create_token(Role::Ingest, "kept", &[]).await.unwrap();
        let wal = dir.join("w.db-wal");
        let whole = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
        // Copy the files while the server holds them, then tear the copy's log.
        let torn = dir.join("t.db");
        std::fs::copy(&wal_db, &torn).unwrap();
        std::fs::copy(&wal, dir.join("t.db-wal")).unwrap();
        let t = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("t.db-wal"))
            .unwrap();
        t.set_len(whole.saturating_sub(100)).unwrap();
        drop(t);
        let reopened = Store::open(&format!("sqlite://{}", torn.display()), Default::default())
            .await
            .unwrap();
        let tokens = reopened.list_tokens().await.unwrap();
        assert!(tokens.len() <= 1, "{tokens:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A migration that stops half-way (the process killed, the statement failing) leaves
    /// nothing of itself: each runs in one transaction, so the next start applies it whole.
    /// Shown with a migration that fails after its first statement, on both backends.
    async fn check_interrupted_migration(pool: AnyPool, backend: Backend) {
        let last = match backend {
            Backend::Sqlite => SQLITE_MIGRATIONS,
            Backend::Postgres => POSTGRES_MIGRATIONS,
        }
        .last()
        .unwrap()
        .0;
        migrator(backend, last).run(&pool).await.unwrap();
        let mut broken = migrator(backend, last);
        let mut list = broken.migrations.to_vec();
        list.push(Migration::new(
            last + 1,
            Cow::Borrowed("interrupted"),
            MigrationType::Simple,
            Cow::Borrowed(
                "CREATE TABLE half_done (x BIGINT); \
                 INSERT INTO half_done (x) VALUES (1); \
                 INSERT INTO no_such_table (x) VALUES (1);",
            ),
            false,
        ));
        broken.migrations = Cow::Owned(list);
        assert!(broken.run(&pool).await.is_err());
        let left: Option<i64> = sqlx::query_scalar(match backend {
            Backend::Sqlite => "SELECT 1 FROM sqlite_master WHERE name = 'half_done'",
            Backend::Postgres => {
                "SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() \
                 AND table_name = 'half_done'"
            }
        })
        .fetch_optional(&pool)
        .await
        .unwrap();
        assert_eq!(
            left, None,
            "{backend:?}: the half-run migration left a table"
        );
        let recorded: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE version > $1")
                .bind(last)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(recorded, 0, "{backend:?}");
        // The next start goes on as before.
        migrator(backend, last).run(&pool).await.unwrap();
    }

    #[tokio::test]
    async fn an_interrupted_migration_leaves_nothing_and_runs_again() {
        sqlx::any::install_default_drivers();
        let dir = std::env::temp_dir().join(format!("gpuledger-mig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("m.db");
        let _ = std::fs::remove_file(&file);
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect(&format!("sqlite://{}?mode=rwc", file.display()))
            .await
            .unwrap();
        check_interrupted_migration(pool, Backend::Sqlite).await;
        let Some(pool) = pg_pool("mig").await else {
            return;
        };
        check_interrupted_migration(pool, Backend::Postgres).await;
    }

    /// `GPULEDGER_TEST_PG_URL`, or `None` (said) when it is unset; unset with
    /// `GPULEDGER_REQUIRE_POSTGRES`, a failure.
    fn pg_url() -> Option<String> {
        let pg = std::env::var("GPULEDGER_TEST_PG_URL").ok();
        if pg.is_none() && std::env::var_os("GPULEDGER_REQUIRE_POSTGRES").is_some() {
            panic!("GPULEDGER_REQUIRE_POSTGRES is set but GPULEDGER_TEST_PG_URL is not");
        }
        if pg.is_none() {
            eprintln!("skipped: PostgreSQL half (set GPULEDGER_TEST_PG_URL to run it)");
        }
        pg
    }

    /// A pool on a fresh schema of `GPULEDGER_TEST_PG_URL`, or `None` (said) when it is unset;
    /// unset with `GPULEDGER_REQUIRE_POSTGRES`, a failure.
    async fn pg_pool(name: &str) -> Option<AnyPool> {
        let pg = pg_url()?;
        let schema = format!("t_{name}_{}", std::process::id());
        Store::drop_schema(&pg, &schema).await.unwrap();
        let setup = AnyPoolOptions::new()
            .max_connections(1)
            .connect(&pg)
            .await
            .unwrap();
        setup
            .execute(format!("CREATE SCHEMA {schema}").as_str())
            .await
            .unwrap();
        setup.close().await;
        Some(
            AnyPoolOptions::new()
                .max_connections(1)
                .after_connect(move |conn, _| {
                    let schema = schema.clone();
                    Box::pin(async move {
                        conn.execute(format!("SET search_path TO {schema}").as_str())
                            .await?;
                        Ok(())
                    })
                })
                .connect(&pg)
                .await
                .unwrap(),
        )
    }

    /// `sqlite_full_sync` reaches every connection of the pool.
    #[tokio::test]
    async fn sqlite_durability_follows_the_setting() {
        let dir = std::env::temp_dir().join(format!("gpuledger-sync-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (full, want) in [(false, 1i64), (true, 2)] {
            let url = format!("sqlite://{}/s{full}.db", dir.display());
            let store = Store::open(
                &url,
                gpuledger_ledger::Settings {
                    sqlite_full_sync: full,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
            let got: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(store.pool())
                .await
                .unwrap();
            assert_eq!(got, want, "full = {full}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Every PostgreSQL session of the store runs without JIT compilation (the server's
    /// default is on).
    #[tokio::test]
    async fn postgres_sessions_run_without_jit() {
        let Some(pg) = pg_url() else {
            return;
        };
        let schema = format!("t_jit_{}", std::process::id());
        Store::drop_schema(&pg, &schema).await.unwrap();
        let store = Store::open_in_schema(&pg, Some(&schema), Default::default())
            .await
            .unwrap();
        let jit: String = sqlx::query_scalar("SELECT current_setting('jit')")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(jit, "off");
        Store::drop_schema(&pg, &schema).await.unwrap();
    }

    /// Migration 21 gives every instance a stored GPU names its `host_instances` row: the host
    /// of the GPU first seen naming it (the key trimmed, in lower case), so ingest finds it by
    /// key alone. Shown over GPUs stored without their rows, as before migration 10, on both
    /// backends: a cloud collector then counting the instance under its own name lands on the
    /// GPUs' host, and adds no placeholder.
    async fn check_instances_backfilled(store: Store) {
        use chrono::{DateTime, Utc};
        use gpuledger_model::HostGpus;
        let agent = |source: &str| Principal {
            source: source.into(),
            teams: None,
            kind: "agent".into(),
        };
        let push = |who: Principal, at: &'static str, body: String| {
            let store = store.clone();
            async move {
                let at: DateTime<Utc> = at.parse().unwrap();
                let map = gpuledger_ledger::decode_body(body.as_bytes(), None, Default::default())
                    .unwrap();
                let out = store
                    .ingest(&who, gpuledger_ledger::validate_body(map, at, 300), at)
                    .await
                    .unwrap();
                assert!(out.rejected.is_empty(), "{:?}", out.rejected);
            }
        };
        let gpu = |uuid: &str, host: &str, instance: &str, at: &str| {
            format!(
                r#"{{"gpus":[{{"uuid":"{uuid}","model":"NVIDIA H100 80GB HBM3","host":"{host}","labels":{{"instance_id":"{instance}"}},"observed_at":"{at}"}}]}}"#
            )
        };
        let forget = || async {
            sqlx::query("DELETE FROM host_instances")
                .execute(store.pool())
                .await
                .unwrap();
        };
        const A: &str = "GPU-aaaaaaaa-0000-4000-8000-000000000001";
        const B: &str = "GPU-aaaaaaaa-0000-4000-8000-000000000002";
        const C: &str = "GPU-aaaaaaaa-0000-4000-8000-000000000003";
        let t1 = "2026-12-02T08:00:00Z";
        push(agent("agent-1"), t1, gpu(A, "node-1", " I-0Old ", t1)).await;
        push(agent("agent-3"), t1, gpu(C, "node-3", "i-0other", t1)).await;
        forget().await;
        // A second host naming the same instance later (two sources that disagreed before
        // instances were recorded): the first sighting's host keeps it.
        let t2 = "2026-12-02T09:00:00Z";
        push(agent("agent-2"), t2, gpu(B, "node-2", "i-0old", t2)).await;
        forget().await;

        let sql = match store.backend() {
            Backend::Sqlite => {
                include_str!("../migrations/sqlite/0021_host_instances_backfill.sql")
            }
            Backend::Postgres => {
                include_str!("../migrations/postgres/0021_host_instances_backfill.sql")
            }
        };
        store.pool().execute(sql).await.unwrap();
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT instance_id, host FROM host_instances ORDER BY instance_id")
                .fetch_all(store.pool())
                .await
                .unwrap();
        let want = [("i-0old", "node-1"), ("i-0other", "node-3")];
        assert_eq!(
            rows.iter()
                .map(|(i, h)| (i.as_str(), h.as_str()))
                .collect::<Vec<_>>(),
            want,
            "{:?}",
            store.backend()
        );

        let t3: DateTime<Utc> = "2026-12-02T10:00:00Z".parse().unwrap();
        let cloud = Principal {
            source: "aws".into(),
            teams: None,
            kind: "aws".into(),
        };
        let count = HostGpus {
            host: "ip-10-0-0-7.ec2.internal".into(),
            count: 1,
            model: Some("H100".into()),
            labels: [("instance_id".to_string(), "i-0OLD".to_string())].into(),
            ..Default::default()
        };
        store
            .observe_host_gpu_count(&cloud, &count, t3)
            .await
            .unwrap();
        let gpus = store
            .list_gpus(&Filters::default(), false, t3)
            .await
            .unwrap();
        let hosts: Vec<(&str, Option<&str>)> =
            gpus.iter().map(|g| (&*g.uuid, g.host.as_deref())).collect();
        assert_eq!(
            hosts,
            [
                (A, Some("node-1")),
                (B, Some("node-2")),
                (C, Some("node-3"))
            ],
            "{:?}",
            store.backend()
        );
    }

    #[tokio::test]
    async fn migration_21_records_the_instances_stored_before_it() {
        sqlx::any::install_default_drivers();
        let dir = std::env::temp_dir().join(format!("gpuledger-inst-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("i.db");
        let _ = std::fs::remove_file(&file);
        let store = Store::open(&file.display().to_string(), Default::default())
            .await
            .unwrap();
        check_instances_backfilled(store).await;
        let _ = std::fs::remove_dir_all(&dir);
        let Some(pg) = pg_url() else {
            return;
        };
        let schema = format!("t_inst_{}", std::process::id());
        Store::drop_schema(&pg, &schema).await.unwrap();
        let store = Store::open_in_schema(&pg, Some(&schema), Default::default())
            .await
            .unwrap();
        check_instances_backfilled(store.clone()).await;
        store.close().await;
        Store::drop_schema(&pg, &schema).await.unwrap();
    }

    #[tokio::test]
    async fn migrations_keep_what_the_previous_release_uses() {
        sqlx::any::install_default_drivers();
        let dir = std::env::temp_dir().join(format!("gpuledger-upgrade-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("u.db");
        let _ = std::fs::remove_file(&file);
        let url = format!("sqlite://{}?mode=rwc", file.display());
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .unwrap();
        check_upgrades(pool, Backend::Sqlite).await;

        let Some(pool) = pg_pool("upgrade").await else {
            return;
        };
        check_upgrades(pool, Backend::Postgres).await;
    }
}
