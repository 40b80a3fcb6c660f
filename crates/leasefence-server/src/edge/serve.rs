//! The main port's serve loop: accept, serve each connection with HTTP/1 or
//! HTTP/2, and on shutdown stop accepting and let open connections finish.
//!
//! It is `axum::serve`'s loop with two deadlines that `axum::serve` cannot
//! set (it gives hyper no timer, so hyper's own header timeout never runs):
//!
//! - **The first bytes.** A client must send, within [`FIRST_BYTES_TIMEOUT`]
//!   of its connection being handed over (after the TLS handshake, on a TLS
//!   port), enough to tell HTTP/1 from HTTP/2: the first byte of an HTTP/1
//!   request, or the whole 24-byte HTTP/2 preface. Otherwise the connection
//!   is closed.
//! - **Each HTTP/1 request head**, within [`HEADER_READ_TIMEOUT`]: hyper's
//!   header timeout, which also runs while an HTTP/1 connection waits idle
//!   for its next request. An idle HTTP/1 keep-alive connection is closed
//!   after that long, as most HTTP servers do; its client opens a new one.
//!
//! Without them a client that connects and sends nothing, or a few bytes of
//! a request, held its place under `--connections-max` for as long as it
//! kept the connection open: enough of them and every other client was
//! refused for the limit. TCP keepalive (see `tcp`) only ends connections
//! whose client is gone, not those of a live client that stays silent.
//!
//! And one more for any connection: **nothing in progress** for the
//! service's idle timeout (`ServerConfig::connection_idle`, five minutes by
//! default), counted by the connection's `Activity`. Such a connection is
//! told to close as at shutdown: an HTTP/2 client gets a GOAWAY and opens a
//! new connection for its next call (gRPC servers do the same with
//! `MaxConnectionIdle`). An open keep-alive or watch stream is in progress
//! for as long as it lasts, and a request body that never comes cannot keep
//! a connection busy: it fails at its own deadline (`activity`). Pings do
//! not count: they keep a connection alive, not busy. A connection that has
//! not closed [`IDLE_CLOSE_GRACE`] after being told to is dropped, once
//! nothing is in progress on it.

use std::io;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

use super::{EdgeListener, EdgeService};
use axum::serve::Listener;

/// Longest a connection may take to send the bytes that tell its protocol.
#[cfg(not(test))]
pub(crate) const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);
/// Shorter under test, so that a silent client is seen within seconds.
#[cfg(test)]
pub(crate) const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest an HTTP/1 connection may take to send a request head, counted
/// from when it is waited for (at once, or after the previous answer).
#[cfg(not(test))]
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
#[cfg(test)]
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a connection told to close for being idle has to do so before it
/// is dropped, unless a request that crossed the GOAWAY is still in
/// progress then (it is served to its end, and the grace starts again).
/// HTTP/2 closes only after the client has answered a PING that follows the
/// GOAWAY (so that no request in flight is lost), and a client that never
/// answers must not keep its connection that way.
#[cfg(not(test))]
pub(crate) const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(10);
#[cfg(test)]
pub(crate) const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The HTTP/2 connection preface, which a client sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Serves `listener`'s connections with `service` until `signal` completes,
/// then stops accepting and returns once every open connection has ended
/// (each is told to finish: HTTP/2 sends GOAWAY, HTTP/1 closes after the
/// answer in progress).
pub(crate) async fn serve(
    mut listener: EdgeListener,
    service: EdgeService,
    signal: impl Future<Output = ()> + Send + 'static,
) {
    // Dropping `stop_rx` tells every connection; `open_tx` is closed once
    // each connection has dropped its `open_rx`.
    let (stop_tx, stop_rx) = watch::channel(());
    tokio::spawn(async move {
        signal.await;
        drop(stop_rx);
    });
    let (open_tx, open_rx) = watch::channel(());
    loop {
        let (io, _peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop_tx.closed() => break,
        };
        let connection = service.connection(&io);
        let (activity, idle) = (connection.activity(), service.idle);
        let service = TowerToHyperService::new(connection);
        let (stop_tx, open_rx) = (stop_tx.clone(), open_rx.clone());
        tokio::spawn(async move {
            let mut builder = Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let io = TokioIo::new(FirstBytes::new(io, FIRST_BYTES_TIMEOUT));
            let mut conn = pin!(builder.serve_connection(io, service));
            let mut stop = pin!(stop_tx.closed());
            let mut idle_check = pin!(tokio::time::sleep(idle));
            let mut stopping = false;
            // Set once the connection was told to close for being idle.
            let mut idle_closing = false;
            loop {
                tokio::select! {
                    served = conn.as_mut() => {
                        if let Err(e) = served {
                            // A client's own doing (a timeout, a reset, a bad
                            // request): nothing for the operator.
                            tracing::debug!(error = %e, "connection ended");
                        }
                        break;
                    }
                    () = &mut stop, if !stopping => {
                        stopping = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    () = idle_check.as_mut(), if !stopping || idle_closing => {
                        let now = Instant::now();
                        if idle_closing {
                            // A request that crossed the GOAWAY is served to its end.
                            if activity.idle_at(idle).is_none() {
                                idle_check.as_mut().reset(now + IDLE_CLOSE_GRACE);
                                continue;
                            }
                            tracing::debug!("an idle connection did not close in time: dropped");
                            break;
                        }
                        match activity.idle_at(idle) {
                            Some(at) if at <= now => {
                                tracing::debug!("closing a connection idle for {idle:?}");
                                (stopping, idle_closing) = (true, true);
                                conn.as_mut().graceful_shutdown();
                                idle_check.as_mut().reset(now + IDLE_CLOSE_GRACE);
                            }
                            Some(at) => idle_check.as_mut().reset(at),
                            // Busy: a request ending from now on sets the next time to look.
                            None => idle_check.as_mut().reset(now + idle),
                        }
                    }
                }
            }
            drop(open_rx);
        });
    }
    drop(open_rx);
    drop(listener);
    open_tx.closed().await;
}

/// A connection whose reads fail with `TimedOut` once its deadline passes
/// before it has sent enough to tell HTTP/1 from HTTP/2 (the test of
/// hyper-util's protocol detection, which has no deadline of its own); after
/// that, or at its end, reads and writes pass straight through.
struct FirstBytes<T> {
    io: T,
    /// Until the protocol is known: the deadline, and how many bytes of the
    /// HTTP/2 preface have been matched so far.
    pending: Option<(Pin<Box<Sleep>>, usize)>,
}

impl<T> FirstBytes<T> {
    fn new(io: T, timeout: Duration) -> FirstBytes<T> {
        FirstBytes {
            io,
            pending: Some((Box::pin(tokio::time::sleep(timeout)), 0)),
        }
    }
}

/// Whether `read`, following `matched` bytes of the HTTP/2 preface, decides
/// the protocol; otherwise how many bytes of the preface now match.
fn detect(matched: usize, read: &[u8]) -> Result<(), usize> {
    let want = &H2_PREFACE[matched..];
    let n = read.len().min(want.len());
    if read[..n] != want[..n] || matched + n == H2_PREFACE.len() {
        return Ok(());
    }
    Err(matched + n)
}

impl<T: AsyncRead + Unpin> AsyncRead for FirstBytes<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some((deadline, matched)) = &mut this.pending else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                match detect(*matched, read) {
                    Err(now) if !read.is_empty() => *matched = now,
                    // Decided, or the end of the stream: no deadline any more.
                    _ => this.pending = None,
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no request within the first-bytes timeout",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FirstBytes<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_ends_at_the_first_byte_of_http1_or_the_whole_preface() {
        assert_eq!(detect(0, b"GET / HTTP/1.1\r\n"), Ok(()));
        assert_eq!(detect(0, b"P"), Err(1));
        assert_eq!(detect(1, b"RI * HTTP/2.0"), Err(14));
        assert_eq!(detect(14, b"\r\n\r\nSM\r\n\r\n"), Ok(()));
        // A request that starts like the preface and then leaves it.
        assert_eq!(detect(0, b"PRI * HTTP/1.1\r\n"), Ok(()));
        assert_eq!(detect(3, b"X"), Ok(()));
        // More than the preface in one read: decided too.
        assert_eq!(detect(0, &[H2_PREFACE, b"\0\0\0\x04"].concat()), Ok(()));
    }
}
