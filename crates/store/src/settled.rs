//! Reads of settled days, kept in memory between requests.
//!
//! A page's window is mostly whole days before today, and what those days hold changes
//! rarely: late data, a change of owner, rate or attributes, pruning. The group rollups
//! already track every such change (`crate::groups`): a re-roll of day rows, and the database
//! triggers on GPUs, owner periods and removed day rows, list the day in `group_dirty` in the
//! same transaction as the change, and only the refresher takes a day off that list, after
//! rebuilding it, bumping the generation `meta.settled_gen` in the same transaction (pruning
//! bumps it too, since it drops listed days with their rows).
//!
//! So a read over days `[lo, hi)` none of which is listed gives the same answer as an earlier
//! read of the same question made when none was listed either, as long as the generation is
//! the same: any change since would have listed a day (and it is still listed, or the
//! refresher bumped the generation when it took it off). [`Store::settled`] keeps such answers
//! by question, checks the list and the generation with one indexed read per request, and
//! reads again when either says something changed. Today is never settled: it is always
//! listed while samples arrive, and callers read it apart.
//!
//! The answers are kept per process, so several servers over one PostgreSQL database each keep
//! their own and each checks the database, never its own writes.

use std::any::Any;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use gpuledger_model::{day_floor, DAY_SECS};

use crate::{Result, Store, Window};

/// How many answers are kept (the one least recently used goes first): a few ranges and
/// filters per page.
const KEPT: usize = 24;

/// The `meta` key of the generation the refresher and pruning bump.
pub(crate) const GENERATION: &str = "settled_gen";

/// Bump [`GENERATION`] (inside the transaction that takes days off `group_dirty`).
pub(crate) const BUMP: &str = "INSERT INTO meta (key, value) VALUES ('settled_gen', '1') \
     ON CONFLICT (key) DO UPDATE SET value = CAST(CAST(meta.value AS BIGINT) + 1 AS TEXT)";

/// The answers kept, the most recently used last.
#[derive(Default)]
pub(crate) struct Settled {
    kept: Mutex<VecDeque<Kept>>,
}

struct Kept {
    question: String,
    generation: i64,
    answer: Arc<dyn Any + Send + Sync>,
}

impl Settled {
    /// The answer kept for `question` at `generation`, which becomes the newest kept.
    fn get<T: Send + Sync + 'static>(&self, question: &str, generation: i64) -> Option<Arc<T>> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let at = kept
            .iter()
            .position(|k| k.question == question && k.generation == generation)?;
        let k = kept.remove(at)?;
        let answer = Arc::clone(&k.answer).downcast::<T>().ok();
        kept.push_back(k);
        answer
    }

    fn put<T: Send + Sync + 'static>(&self, question: String, generation: i64, answer: Arc<T>) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|k| k.question != question);
        if kept.len() >= KEPT {
            kept.pop_front();
        }
        kept.push_back(Kept {
            question,
            generation,
            answer,
        });
    }

    /// How many answers are kept (for tests).
    fn len(&self) -> usize {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Store {
    /// The answer of `read` over the days `[lo, hi)` (UTC midnights, all before today's), the
    /// one kept for `question` when none of those days changed since it was read (see the
    /// module). `question` must name everything else the answer depends on: what is read, the
    /// filters, settings such as the idle threshold.
    pub(crate) async fn settled<T, F, Fut>(
        &self,
        question: String,
        (lo, hi): (i64, i64),
        read: F,
    ) -> Result<Arc<T>>
    where
        T: Send + Sync + 'static,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        if lo >= hi {
            return Ok(Arc::new(read().await?));
        }
        let (generation, listed): (i64, i64) = sqlx::query_as(&self.sql(
            "SELECT COALESCE((SELECT CAST(value AS BIGINT) FROM meta WHERE key = $1), 0), \
             (SELECT COUNT(*) FROM group_dirty WHERE day >= $2 AND day < $3)",
        ))
        .bind(GENERATION)
        .bind(lo)
        .bind(hi)
        .fetch_one(self.pool())
        .await?;
        let question = format!("{question} days {lo}..{hi}");
        if listed == 0 {
            if let Some(answer) = self.settled.get::<T>(&question, generation) {
                return Ok(answer);
            }
        }
        let answer = Arc::new(read().await?);
        if listed == 0 {
            self.settled.put(question, generation, Arc::clone(&answer));
        }
        Ok(answer)
    }

    /// How many settled answers this store keeps now.
    #[doc(hidden)]
    pub fn settled_answers(&self) -> usize {
        self.settled.len()
    }
}

impl Store {
    /// `read` over `window` for reads whose rows each belong to one UTC day or hour (starting at `at`): the
    /// part before today read through [`Store::settled`] as `question`, today's part read each
    /// time, the rows of both in day order. Today's part is read over a window that starts a
    /// day earlier, keeping only today's rows: so today is read as in the whole window, as its
    /// day row less the hours ahead of the clock, not hour by hour.
    pub(crate) async fn split_at_today<T, F, Fut>(
        &self,
        question: String,
        window: Window,
        now: DateTime<Utc>,
        at: fn(&T) -> i64,
        read: F,
    ) -> Result<Vec<T>>
    where
        T: Clone + Send + Sync + 'static,
        F: Fn(Window) -> Fut,
        Fut: Future<Output = Result<Vec<T>>>,
    {
        self.split_at_today_with(question, window, now, at, read, false)
            .await
    }

    /// [`Store::split_at_today`], without today's part where `today_apart`: the rows of the
    /// days before today alone, for a caller that has today's from another read (see
    /// [`Store::shares_today`]).
    pub(crate) async fn split_at_today_with<T, F, Fut>(
        &self,
        question: String,
        window: Window,
        now: DateTime<Utc>,
        at: fn(&T) -> i64,
        read: F,
        today_apart: bool,
    ) -> Result<Vec<T>>
    where
        T: Clone + Send + Sync + 'static,
        F: Fn(Window) -> Fut,
        Fut: Future<Output = Result<Vec<T>>>,
    {
        let today = day_floor(now.timestamp());
        let (lo, hi) = window.hours(now.timestamp());
        if today_apart && lo >= today {
            return Ok(Vec::new());
        }
        if lo >= today || hi <= lo {
            return read(window).await;
        }
        let before = Window {
            from: window.from,
            to: window.to.min(today),
        };
        let (_, settled_hi) = before.hours(now.timestamp());
        let days = (
            day_floor(lo),
            today.min(day_floor(settled_hi - 1) + DAY_SECS),
        );
        let kept = self
            .settled(format!("{question} hours {lo}..{settled_hi}"), days, || {
                read(before)
            })
            .await?;
        let mut rows = kept.as_ref().clone();
        if hi > today && !today_apart {
            let live = read(Window {
                from: today - DAY_SECS,
                to: window.to,
            })
            .await?;
            rows.extend(live.into_iter().filter(|r| at(r) >= today));
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_answer_goes_first() {
        let s = Settled::default();
        for i in 0..KEPT {
            s.put(format!("q{i}"), 1, Arc::new(i));
        }
        // q0 is used again, so q1 is the least recently used when one more comes.
        assert_eq!(s.get::<usize>("q0", 1).as_deref(), Some(&0));
        s.put("new".into(), 1, Arc::new(99usize));
        assert_eq!(s.len(), KEPT);
        assert_eq!(s.get::<usize>("q0", 1).as_deref(), Some(&0));
        assert!(s.get::<usize>("q1", 1).is_none());
        // Another generation, or another type, is not the answer kept.
        assert!(s.get::<usize>("q2", 2).is_none());
        assert!(s.get::<String>("q2", 1).is_none());
        assert_eq!(s.get::<usize>("q2", 1).as_deref(), Some(&2));
        // Keeping a question again replaces its answer.
        s.put("q2".into(), 3, Arc::new(7usize));
        assert_eq!(s.len(), KEPT);
        assert!(s.get::<usize>("q2", 1).is_none());
        assert_eq!(s.get::<usize>("q2", 3).as_deref(), Some(&7));
    }
}
