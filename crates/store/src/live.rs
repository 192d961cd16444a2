//! Answers kept in memory between requests on PostgreSQL: today's per-GPU rows, the GPU
//! lists, today's activity evidence, the used-by and allocated-idle shares of the hours
//! ahead of the clock and today's used-by and allocated-idle day rows.
//!
//! Every fleet-wide page reads today's counts of every GPU (`Store::gpu_windows`), the list of
//! every GPU (`Store::list_gpus`) and, for the findings, each GPU's last busy and last measured
//! day of today (`Store::activity_evidence`): at 100,000 GPUs each is a row per GPU built and
//! sent at each request, half a second to two seconds. Between two requests only the GPUs
//! that pushed change, so a kept answer is brought up to date by reading again those GPUs
//! alone.
//!
//! Which GPUs changed is read from the rows themselves. On PostgreSQL each row version carries
//! the transaction that wrote it (`xmin`). A read remembers the oldest transaction still
//! running when it began (its snapshot's `xmin`, the watermark): every row version it did not
//! see was written by that transaction or a later one. The next request lists the GPUs whose
//! rows were written at or after the watermark (for today's counts, the day row of today and
//! the hours ahead of the clock, which today's counts subtract; for the lists, the GPU's own
//! row, which every push writes; for the evidence, the day rows from today on; for the shares
//! ahead of the clock, which used-by and the allocated-idle workloads subtract from today's day
//! rows, the GPU's hours there, its day rows from that day on and every allocation on it or its
//! MIG instances), reads those GPUs again and puts them in place of their kept rows. A transaction ID is compared with the
//! watermark modulo 2^32, as PostgreSQL compares them itself: a live row is never older than
//! two billion transactions. A writing transaction that runs long holds the watermark back:
//! until it ends, each request reads again every GPU written since it began (read whole once
//! they are more than a quarter of the fleet). Where no transaction has ended since the kept
//! answer's snapshot (the current snapshot is the same, as text), nothing can have changed and
//! the list is not read: the several reads of a page, and the pages opened between two pushes,
//! scan once.
//!
//! What a row's writer cannot show, the database marks in `meta.live_gen` (migrations 22 and
//! 23): a removed day, hour, GPU, owner period or allocation, a new GPU or owner period, a
//! change of the GPU attributes today's counts read. A different generation reads the whole answer again, as
//! does a change to most GPUs at once. The GPUs whose counts today depend on more than their
//! day row and their hours ahead of the clock (a change of owner within today, a peak memory
//! in the hours ahead) are read again at every request. A kept list's GPUs are told present or
//! missing again at each request, by the time of that request.
//!
//! Only the whole fleet's answers are kept. A filtered page takes its rows from them,
//! filtered in memory by the values its filters' SQL compares (`Filters::admits`: an owner
//! period's team and environment for today's counts, the `gpus` row's own columns for the
//! lists and, through the kept list, for the evidence): at 100,000 GPUs a team's page no
//! longer reads its rows from the database at each request. Like `settled`, the answers are
//! kept per process: several servers over one database each keep their own and each asks the
//! database what changed, never its own writes. SQLite reads them
//! at each request (a local file, fast enough at the sizes it serves).

use std::cmp::Ordering;
use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering as Atomic};
use std::sync::{Arc, Mutex};

use crate::{Backend, Result, Store};

/// How many answers of today's rows are kept (the one least recently used goes first): a
/// reader's answer is one per clock hour, so this hour's and a few more.
const KEPT_TODAY: usize = 4;

/// How many GPU lists are kept: one per kind of list (with MIG instances or without, with
/// labels or without).
const KEPT_LISTS: usize = 3;

/// How many answers of today's activity evidence are kept: today's, and yesterday's while a
/// request of the day before is still served.
const KEPT_EVIDENCE: usize = 2;

/// How many answers of the used-by shares of the hours ahead of the clock are kept: this
/// hour's, and the last hour's while a request of it is still served.
const KEPT_AHEAD: usize = 2;

/// Above this share of the kept rows' GPUs changed (and more than [`REREAD_FEW`]), the whole
/// answer is read again: one read of all is cheaper than a list of most.
const REREAD_SHARE: usize = 4;

/// Up to this many changed GPUs are always read again by their list.
const REREAD_FEW: usize = 256;

/// The `meta` key of the generation the triggers of migration 22 bump.
const GENERATION: &str = "live_gen";

/// A kept row: the GPU it belongs to.
pub(crate) trait LiveRow: Send + Sync + 'static {
    fn gpu_id(&self) -> i64;
}

/// The answers kept, the most recently used last; each behind its own lock, so a request
/// brings an answer up to date while others wait for it, not read it again each.
pub(crate) struct Live {
    /// How many answers are kept.
    size: usize,
    kept: Mutex<VecDeque<(String, Slot)>>,
    /// Answers read whole, brought up to date by reading some GPUs again, served as kept;
    /// and of those served as kept, those served without a scan for what changed.
    reads: [AtomicU64; 4],
}

/// Each kind of answer kept, apart, so that one kind never pushes another's out.
pub(crate) struct Lives {
    /// Today's per-GPU window rows (`Store::gpu_windows`).
    pub(crate) today: Live,
    /// The GPU lists (`Store::list_gpus`).
    pub(crate) lists: Live,
    /// Today's activity evidence (`Store::activity_evidence`).
    pub(crate) evidence: Live,
    /// The used-by shares of the hours ahead of the clock (`Store::held_shares_kept`).
    pub(crate) ahead: Live,
    /// The allocated-idle shares of the hours ahead of the clock (`Store::idle_shares_kept`).
    pub(crate) idle_ahead: Live,
    /// Today's allocated-idle day rows (`Store::idle_day_shares_kept`).
    pub(crate) idle_today: Live,
    /// Today's used-by day rows (`Store::held_day_shares_kept`).
    pub(crate) held_today: Live,
    /// Nothing kept: every answer read from the database, filters and all (for tests).
    off: bool,
}

impl Default for Lives {
    fn default() -> Self {
        let live = |size| Live {
            size,
            kept: Mutex::default(),
            reads: Default::default(),
        };
        Lives {
            today: live(KEPT_TODAY),
            lists: live(KEPT_LISTS),
            evidence: live(KEPT_EVIDENCE),
            ahead: live(KEPT_AHEAD),
            idle_ahead: live(KEPT_AHEAD),
            idle_today: live(KEPT_EVIDENCE),
            held_today: live(KEPT_EVIDENCE),
            off: false,
        }
    }
}

/// Which kind of kept answer [`Store::kept_reads`] counts.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptKind {
    Today,
    Lists,
    Evidence,
    Ahead,
    IdleAhead,
    IdleToday,
    HeldToday,
}

/// One question's answer, behind the lock a request holds while it brings it up to date.
type Slot = Arc<tokio::sync::Mutex<Option<Kept>>>;

struct Kept {
    watermark: i64,
    generation: i64,
    /// The snapshot the watermark was taken from, as text: while the database's current one
    /// is the same, no transaction has ended since, so nothing can have changed.
    snapshot: String,
    rows: Arc<dyn std::any::Any + Send + Sync>,
}

impl Live {
    /// The slot of `question`, made if new, which becomes the newest kept.
    fn slot(&self, question: &str) -> Slot {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = kept.iter().position(|(q, _)| q == question) {
            let k = kept.remove(at).expect("position is in range");
            let slot = Arc::clone(&k.1);
            kept.push_back(k);
            return slot;
        }
        if kept.len() >= self.size {
            kept.pop_front();
        }
        let slot = Arc::new(tokio::sync::Mutex::new(None));
        kept.push_back((question.to_string(), Arc::clone(&slot)));
        slot
    }
}

/// Whether the row version of `table`'s `xmin` was written at or after the watermark `$1`
/// (taken modulo 2^32, as the caller binds it).
pub(crate) fn written_since(table: &str) -> String {
    format!(
        "(CAST(CAST({table}.xmin AS TEXT) AS BIGINT) - $1 + 4294967296) % 4294967296 \
         < 2147483648"
    )
}

/// `ids` as an SQL array of PostgreSQL (integers, so written in place).
pub(crate) fn id_array(ids: &[i64]) -> String {
    let list: Vec<String> = ids.iter().map(i64::to_string).collect();
    format!("CAST('{{{}}}' AS BIGINT[])", list.join(","))
}

/// The watermark, generation and snapshot, read after `changed`'s list (the same
/// statement's snapshot).
const MARK: &str = "CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS TEXT) AS BIGINT), \
     COALESCE((SELECT CAST(value AS BIGINT) FROM meta WHERE key = 'live_gen'), 0), \
     CAST(pg_current_snapshot() AS TEXT)";

impl Store {
    /// Whether answers of today are kept on this backend.
    pub(crate) fn keeps_live(&self) -> bool {
        self.backend() == Backend::Postgres && !self.live.off
    }

    /// The rows `read(None)` gives, kept for `question` and brought up to date at each call:
    /// `changed` is a query (its binds `$1`, the watermark, then `binds`) whose one column
    /// lists, as text separated by commas, the GPUs whose rows may differ from those kept
    /// ([`written_since`] the watermark, or read at every request); those are read again with
    /// `read(Some(ids))`, which must give the rows of exactly those GPUs. Rows are kept in the
    /// order `order`. `question` must name everything else the answer depends on.
    pub(crate) async fn live_rows<T, F, Fut>(
        &self,
        live: &Live,
        question: String,
        changed: &str,
        binds: &[i64],
        order: fn(&T, &T) -> Ordering,
        read: F,
    ) -> Result<Arc<Vec<T>>>
    where
        T: LiveRow + Clone,
        F: Fn(Option<Vec<i64>>) -> Fut,
        Fut: Future<Output = Result<Vec<T>>>,
    {
        let slot = live.slot(&question);
        let mut kept = slot.lock().await;
        // Nothing kept: only the watermark and generation, before the whole answer is read.
        // Kept: the GPUs changed since, unless the snapshot is the kept one (no transaction
        // has ended since it was taken, so none is listed and the scan is skipped: PostgreSQL
        // never runs the subquery of a CASE branch not taken).
        let (ids, mark, generation, snapshot) = match kept.as_ref() {
            None => {
                let sql = format!("SELECT CAST(NULL AS TEXT), {MARK}");
                sqlx::query_as::<_, (Option<String>, i64, i64, String)>(&sql)
                    .fetch_one(self.pool())
                    .await?
            }
            Some(k) => {
                let sql = format!(
                    "SELECT CASE WHEN CAST(pg_current_snapshot() AS TEXT) = ${} THEN NULL \
                     ELSE ({changed}) END, {MARK}",
                    binds.len() + 2
                );
                let mut q = sqlx::query_as::<_, (Option<String>, i64, i64, String)>(&sql)
                    .persistent(false)
                    .bind(k.watermark.rem_euclid(1 << 32));
                for b in binds {
                    q = q.bind(*b);
                }
                q.bind(k.snapshot.clone()).fetch_one(self.pool()).await?
            }
        };
        let unscanned = kept.as_ref().is_some_and(|k| k.snapshot == snapshot);
        let previous = kept
            .take()
            .filter(|k| k.generation == generation)
            .and_then(|k| Arc::downcast::<Vec<T>>(k.rows).ok());
        let ids: Vec<i64> = ids
            .unwrap_or_default()
            .split(',')
            .filter_map(|s| s.parse().ok())
            .collect();
        let how = match &previous {
            Some(_) if ids.is_empty() => 2,
            Some(rows) if ids.len() <= REREAD_FEW || ids.len() * REREAD_SHARE <= rows.len() => 1,
            _ => 0,
        };
        live.reads[how].fetch_add(1, Atomic::Relaxed);
        if how == 2 && unscanned {
            live.reads[3].fetch_add(1, Atomic::Relaxed);
        }
        let rows = match previous {
            Some(rows) if how == 2 => rows,
            Some(rows) if how == 1 => {
                let fresh = read(Some(ids.clone())).await?;
                let ids: HashSet<i64> = ids.into_iter().collect();
                let mut merged: Vec<T> = rows
                    .iter()
                    .filter(|r| !ids.contains(&r.gpu_id()))
                    .cloned()
                    .chain(fresh)
                    .collect();
                // A stable sort finds the kept rows already in order and merges the few new.
                merged.sort_by(order);
                Arc::new(merged)
            }
            _ => {
                let mut rows = read(None).await?;
                rows.sort_by(order);
                Arc::new(rows)
            }
        };
        *kept = Some(Kept {
            watermark: mark,
            generation,
            snapshot,
            rows: Arc::clone(&rows) as Arc<dyn std::any::Any + Send + Sync>,
        });
        Ok(rows)
    }

    /// How many answers of kind `kind` were read whole, brought up to date by reading some
    /// GPUs again, and served as kept since the store was opened; and of those served as
    /// kept, how many without a scan for what changed (for tests).
    #[doc(hidden)]
    pub fn kept_reads(&self, kind: KeptKind) -> [u64; 4] {
        let r = &match kind {
            KeptKind::Today => &self.live.today,
            KeptKind::Lists => &self.live.lists,
            KeptKind::Evidence => &self.live.evidence,
            KeptKind::Ahead => &self.live.ahead,
            KeptKind::IdleAhead => &self.live.idle_ahead,
            KeptKind::IdleToday => &self.live.idle_today,
            KeptKind::HeldToday => &self.live.held_today,
        }
        .reads;
        [0, 1, 2, 3].map(|i| r[i].load(Atomic::Relaxed))
    }

    /// This store with nothing kept between requests (a handle of its own on the same
    /// database), to compare kept answers with answers read whole (for tests).
    #[doc(hidden)]
    pub fn without_kept(&self) -> Store {
        Store {
            live: Default::default(),
            ..self.clone()
        }
    }

    /// This store keeping nothing between requests (a handle of its own on the same
    /// database): every answer read from the database as SQLite reads it, filters applied by
    /// the database, to compare the kept answers and their filtering with (for tests).
    #[doc(hidden)]
    pub fn without_live(&self) -> Store {
        Store {
            live: std::sync::Arc::new(Lives {
                off: true,
                ..Default::default()
            }),
            ..self.clone()
        }
    }

    /// The generation of the kept answers (for tests).
    #[doc(hidden)]
    pub async fn live_generation(&self) -> Result<i64> {
        Ok(sqlx::query_scalar(&self.sql(&format!(
            "SELECT COALESCE((SELECT CAST(value AS BIGINT) FROM meta WHERE key = '{GENERATION}'), \
             0)"
        )))
        .fetch_one(self.pool())
        .await?)
    }
}
