//! The pull collectors' leader lease: with several `serve` replicas on one PostgreSQL database,
//! exactly one of them runs the pull collectors at a time.
//!
//! The leader holds a session-level advisory lock on a connection of its own, taken out of the
//! pool. The lock lives exactly as long as that connection: a leader that is killed, crashes or
//! is cut off loses it with its connection, and a follower takes it on its next try. The leader
//! checks its connection on the same interval and gives the lease up when the check fails, so it
//! stops collecting when its lock may be gone. On SQLite the lease is always held: one server
//! per database file is the only supported SQLite setup.

use std::sync::Arc;
use std::time::Duration;

use sqlx::AnyConnection;
use sqlx::Connection;
use tokio::sync::watch;

use crate::{Backend, Store};

/// Take the lock without waiting. Its first key names gpuledger's pull collectors among other
/// advisory locks of the database; the second is the schema's, so installations in different
/// schemas of one database (and tests, each in its own schema) each have a leader. Advisory
/// locks are per database already.
const TRY_LOCK: &str = "SELECT pg_try_advisory_lock(hashtext('gpuledger pull collectors'), \
                        hashtext(COALESCE(current_schema(), '')))";

/// The longest a try or a check of the lock's connection may take: a leader whose connection
/// does not answer in this time gives the lease up rather than collect without knowing it holds
/// the lock.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether this process holds the pull collectors' lease, kept up to date by a background task
/// while any clone of it lives (see [`Store::lease`]). Dropping the last clone gives the lease up.
#[derive(Clone)]
pub struct Lease {
    held: watch::Receiver<bool>,
    _task: Option<Arc<AbortOnDrop>>,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        // The task's lock connection drops with it: the server ends the session and frees the
        // lock.
        self.0.abort();
    }
}

impl Lease {
    /// Whether this process holds the lease now.
    pub fn is_held(&self) -> bool {
        *self.held.borrow()
    }

    /// Wait until the lease is held (`true`) or not (`false`); at once when it already is.
    /// Waits forever for a state that can no longer come (the store was closed, or a SQLite
    /// lease asked to be lost).
    pub async fn wait_for(&mut self, held: bool) {
        if self.held.wait_for(|h| *h == held).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Store {
    /// Start keeping the pull collectors' lease: on PostgreSQL, try the lock every `retry` until
    /// it is taken, then check its connection every `retry` while it is held; on SQLite, held
    /// from the start. The lease is given up when the store is closed or the last clone of the
    /// returned [`Lease`] is dropped. Needs a Tokio runtime.
    pub fn lease(&self, retry: Duration) -> Lease {
        if self.backend == Backend::Sqlite {
            let (_, held) = watch::channel(true);
            return Lease { held, _task: None };
        }
        let (tx, held) = watch::channel(false);
        let task = tokio::spawn(keep(self.clone(), retry, tx));
        Lease {
            held,
            _task: Some(Arc::new(AbortOnDrop(task))),
        }
    }
}

/// The lease's loop (PostgreSQL): try, hold while the connection answers, and try again after
/// losing it, until the store is closed.
async fn keep(store: Store, retry: Duration, held: watch::Sender<bool>) {
    let mut conn: Option<AnyConnection> = None;
    while !store.pool.is_closed() {
        match try_lock(&store, &mut conn).await {
            Ok(false) => {}
            Ok(true) => {
                held.send_replace(true);
                let lost = match conn.as_mut() {
                    Some(c) => hold(&store, c, retry).await,
                    None => Some("no connection".into()),
                };
                held.send_replace(false);
                match lost {
                    // A failed check may have left the session open on the server (the lock
                    // with it): drop the connection and take a fresh one to try again.
                    Some(error) => {
                        tracing::warn!(error = %error, "the pull collectors' lease was lost: its connection failed");
                        conn = None;
                    }
                    None => break,
                }
            }
            Err(error) => {
                tracing::warn!(error = %error, "could not try the pull collectors' lease; will retry");
                conn = None;
            }
        }
        tokio::time::sleep(retry).await;
    }
    held.send_replace(false);
    // Ending the session frees the lock at once for the next leader.
    if let Some(c) = conn {
        let _ = c.close().await;
    }
}

/// Try the lock once on the lease's own connection (taken out of the pool when there is none,
/// with the pool's per-connection setup, e.g. the schema).
async fn try_lock(store: &Store, conn: &mut Option<AnyConnection>) -> Result<bool, String> {
    let attempt = async {
        let c = match conn {
            Some(c) => c,
            None => conn.insert(store.pool.acquire().await?.detach()),
        };
        sqlx::query_scalar::<_, bool>(TRY_LOCK).fetch_one(c).await
    };
    match tokio::time::timeout(ANSWER_TIMEOUT, attempt).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer in {} s", ANSWER_TIMEOUT.as_secs())),
    }
}

/// Hold the lock: check its connection every `retry`. Returns why it was lost, or `None` when
/// the store was closed.
async fn hold(store: &Store, conn: &mut AnyConnection, retry: Duration) -> Option<String> {
    loop {
        tokio::time::sleep(retry).await;
        if store.pool.is_closed() {
            return None;
        }
        match tokio::time::timeout(ANSWER_TIMEOUT, sqlx::query("SELECT 1").execute(&mut *conn))
            .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Some(e.to_string()),
            Err(_) => return Some(format!("no answer in {} s", ANSWER_TIMEOUT.as_secs())),
        }
    }
}
