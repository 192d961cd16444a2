//! Serving connections: the accept loop with its connection limit, HTTP/1 with a header
//! timeout (which is also the keep-alive idle timeout), and graceful shutdown. The body
//! timeout and the early 413/401 of a push are the ingest handler's (`ingest.rs`), the one
//! route that reads a body.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{watch, Notify, Semaphore};

use crate::tls::{Stream, Tls};
use crate::ServerLimits;

/// Serve `router` on `listener` until `shutdown` resolves, then let every open connection
/// finish its request (idle ones close at once) and return.
///
/// A client must send each request's head within `limits.header_timeout`, counted from when
/// the server starts waiting for it (on a new connection and between requests on a kept-alive
/// one), or the connection is closed. At most `limits.max_connections` connections are open
/// at once, so the process never runs out of file descriptors: at the limit, a new connection
/// closes the oldest one that is not inside a request (idle, or still sending its head); when
/// every connection is inside a request, the new one waits until one ends.
///
/// With `tls`, each connection starts with a TLS handshake (within the header timeout) using
/// the certificate in use at that moment.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ServerLimits,
    tls: Option<Arc<Tls>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let max = limits
        .max_connections
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    let permits = Arc::new(Semaphore::new(max));
    let open = Arc::new(Open::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let mut next_id = 0u64;
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // A connection reset before it was accepted, or out of file descriptors:
                    // neither ends serving.
                    tracing::warn!(error = %e, "could not accept a connection; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let permit = loop {
            if let Ok(p) = permits.clone().try_acquire_owned() {
                break Some(p);
            }
            open.evict_oldest_idle();
            tokio::select! {
                p = permits.clone().acquire_owned() => break p.ok(),
                // Every connection was inside a request: look again shortly.
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
                () = &mut shutdown => break None,
            }
        };
        let Some(permit) = permit else { break };
        let _ = stream.set_nodelay(true);
        next_id += 1;
        let conn_state = open.add(next_id);
        let inner = TowerToHyperService::new(router.clone());
        let counted = conn_state.clone();
        let service = hyper::service::service_fn(move |req| {
            let busy = Busy::enter(&counted);
            let answer = hyper::service::Service::call(&inner, req);
            async move {
                let answer = answer.await;
                drop(busy);
                answer
            }
        });
        let mut stop = stop_rx.clone();
        let open = open.clone();
        let id = next_id;
        let http = http.clone();
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        let handshake = limits.header_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let io = match acceptor {
                None => Stream::Plain(stream),
                Some(a) => match tokio::time::timeout(handshake, a.accept(stream)).await {
                    Ok(Ok(s)) => Stream::Tls(Box::new(s)),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        open.remove(id);
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake timed out");
                        open.remove(id);
                        return;
                    }
                },
            };
            let conn = http.serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            let stopped = async { drop(stop.wait_for(|stop| *stop).await) };
            tokio::pin!(stopped);
            let result = loop {
                tokio::select! {
                    r = conn.as_mut() => break r,
                    () = &mut stopped => {
                        conn.as_mut().graceful_shutdown();
                        break conn.await;
                    }
                    // Dropping the connection closes it.
                    () = conn_state.evict.notified() => {
                        if conn_state.busy.load(Ordering::SeqCst) == 0 {
                            break Ok(());
                        }
                    }
                }
            };
            open.remove(id);
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection closed with an error");
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a permit until it ends.
    let _ = permits.acquire_many(max as u32).await;
    Ok(())
}

/// One open connection: how many of its requests are inside a handler, and the signal that
/// closes it to make room.
#[derive(Default)]
struct Conn {
    busy: AtomicUsize,
    evict: Notify,
}

/// Marks a connection busy while a handler runs.
struct Busy(Arc<Conn>);

impl Busy {
    fn enter(conn: &Arc<Conn>) -> Busy {
        conn.busy.fetch_add(1, Ordering::SeqCst);
        Busy(conn.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The open connections, oldest first.
#[derive(Default)]
struct Open(Mutex<BTreeMap<u64, Arc<Conn>>>);

impl Open {
    fn add(&self, id: u64) -> Arc<Conn> {
        let conn = Arc::new(Conn::default());
        self.lock().insert(id, conn.clone());
        conn
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Ask the oldest connection that is not inside a request to close.
    fn evict_oldest_idle(&self) {
        let open = self.lock();
        if let Some(conn) = open.values().find(|c| c.busy.load(Ordering::SeqCst) == 0) {
            conn.evict.notify_one();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
