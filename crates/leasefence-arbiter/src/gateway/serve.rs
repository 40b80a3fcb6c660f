//! The gateway's serve loop: HTTP/1.1, with a deadline on every request head.
//!
//! `axum::serve` gives hyper no timer, so hyper's header timeout never ran:
//! a client that connected and sent nothing, or part of a request head, or
//! left a keep-alive connection idle, held its socket for as long as it kept
//! the connection open, and at shutdown kept the gateway from stopping. TCP
//! keepalive ends connections whose client is gone, not those of a live
//! client that stays silent.
//!
//! Here each request head must arrive within [`HEADER_READ_TIMEOUT`], counted
//! from when it is waited for: at once on a new connection, and after each
//! answer on a keep-alive one, which is therefore closed after that long
//! idle, as most HTTP servers do; its client opens a new one. A request body
//! has no such deadline: a slow or paused uploader keeps its upload (one
//! whose host is gone is ended by TCP keepalive).
//!
//! HTTP/1.1 only: telling HTTP/1 from HTTP/2 without TLS means reading the
//! first bytes with no deadline of hyper's, and an object store's clients
//! speak HTTP/1.1.
//!
//! Beyond `connections_max` open connections a new one is still accepted,
//! and its request answered 429 (`limit_exceeded`) before it is closed, so
//! that its client learns why instead of waiting on a full accept queue.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::serve::{Listener, ListenerExt};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{Semaphore, watch};

use super::reply::Refusal;

/// Longest a connection may take to send a request head, counted from when
/// it is waited for (at once, or after the previous answer).
#[cfg(not(test))]
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Shorter under test, so that a silent client is seen within seconds.
#[cfg(test)]
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// Serves `listener`'s connections with `app`, at most `connections_max` at
/// once, until `signal` completes, then stops accepting and returns once
/// every open connection has ended: each is told to close after the answer
/// in progress, and one waiting for a request head closes at once or at that
/// head's deadline.
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    connections_max: usize,
    signal: impl Future<Output = ()> + Send + 'static,
) {
    let max = connections_max.min(Semaphore::MAX_PERMITS);
    let connections = Arc::new(Semaphore::new(max));
    let busy = Router::new().fallback(move || async move { Refusal::TooManyConnections { max } });
    // Set while connections are being refused, so the operator is told once
    // each time the limit is reached, not once per refused connection.
    let mut full = false;
    // Dropping `stop_rx` tells every connection; `open_tx` is closed once
    // each connection has dropped its `open_rx`.
    let (stop_tx, stop_rx) = watch::channel(());
    tokio::spawn(async move {
        signal.await;
        drop(stop_rx);
    });
    let (open_tx, open_rx) = watch::channel(());
    // axum's `Listener` for a TCP listener logs and backs off on accept
    // errors (too many open files) rather than failing the loop.
    let mut listener = listener.tap_io(super::accepted);
    loop {
        let (io, _peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop_tx.closed() => break,
        };
        // Held until the connection ends.
        let permit = connections.clone().try_acquire_owned().ok();
        let service = match &permit {
            Some(_) => {
                full = false;
                TowerToHyperService::new(app.clone())
            }
            None => {
                if !std::mem::replace(&mut full, true) {
                    tracing::warn!(
                        connections_max = max,
                        "connections-max reached: new connections are refused (429) until one closes"
                    );
                }
                TowerToHyperService::new(busy.clone())
            }
        };
        let (stop_tx, open_rx) = (stop_tx.clone(), open_rx.clone());
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                // A refused connection is closed after its answer.
                .keep_alive(permit.is_some());
            let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
            let mut stop = pin!(stop_tx.closed());
            let mut stopping = false;
            loop {
                tokio::select! {
                    served = conn.as_mut() => {
                        if let Err(e) = served {
                            // A client's own doing (a timeout, a reset, a bad
                            // request): nothing for the operator.
                            tracing::debug!(error = %e, "gateway connection ended");
                        }
                        break;
                    }
                    () = &mut stop, if !stopping => {
                        stopping = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop((open_rx, permit));
        });
    }
    drop(open_rx);
    drop(listener);
    open_tx.closed().await;
}
