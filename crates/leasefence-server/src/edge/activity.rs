//! What a main-port connection has in progress, for two of the serve loop's
//! deadlines (see `serve`):
//!
//! - [`Activity`] counts the requests a connection is serving, each from
//!   its call until its answer's body has been sent or dropped (for a
//!   keep-alive or watch stream: until the stream ends), and notes when the
//!   last one ended, so that a connection with nothing in progress for the
//!   idle timeout can be told to close.
//! - [`Deadline`] fails a request body that has not arrived whole within
//!   [`BODY_TIMEOUT`]. Without it, an HTTP/2 client could keep a connection
//!   busy, and so never idle, with a request whose body never comes.
//!
//! Written here rather than taken from tower-http: its body timeout counts
//! between frames (a body sent a byte at a time never times out) and it has
//! nothing that tracks a connection's open streams.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// Longest a request body may take to arrive whole, counted from when the
/// service first waits for it. Bodies of the API are a few hundred bytes.
#[cfg(not(test))]
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Shorter under test, so that a stalled body is seen within seconds.
#[cfg(test)]
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(1);

/// The requests one connection has in progress.
pub(crate) struct Activity {
    open: AtomicUsize,
    /// When the connection was opened; `last` counts from it.
    opened: Instant,
    /// Microseconds from `opened` to when the last request ended.
    last: AtomicU64,
}

impl Activity {
    pub(crate) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            open: AtomicUsize::new(0),
            opened: Instant::now(),
            last: AtomicU64::new(0),
        })
    }

    /// A request begins; it is in progress until the guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> Busy {
        self.open.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// When the connection will have had nothing in progress for `idle`,
    /// unless a request begins first; `None` while one is in progress.
    pub(crate) fn idle_at(&self, idle: Duration) -> Option<Instant> {
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last = Duration::from_micros(self.last.load(Ordering::Acquire));
        Some(self.opened + last + idle)
    }
}

/// A request in progress on its connection (see [`Activity::begin`]).
pub(crate) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let since = self.0.opened.elapsed().as_micros();
        self.0
            .last
            .store(u64::try_from(since).unwrap_or(u64::MAX), Ordering::Release);
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body that keeps its request in progress until it has been
/// sent whole or dropped.
pub(crate) struct Tracked<B> {
    body: B,
    _busy: Busy,
}

impl<B> Tracked<B> {
    pub(crate) fn new(body: B, busy: Busy) -> Tracked<B> {
        Tracked { body, _busy: busy }
    }
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that fails once it has not arrived whole within
/// [`BODY_TIMEOUT`] of the first time it had to be waited for. A body that
/// is there when it is read (most are) starts no timer.
pub(crate) struct Deadline<B> {
    body: B,
    timer: Timer,
}

enum Timer {
    NotStarted,
    Running(Pin<Box<Sleep>>),
    /// The body ended, or its deadline already failed it.
    Done,
}

impl<B> Deadline<B> {
    pub(crate) fn new(body: B) -> Deadline<B> {
        Deadline {
            body,
            timer: Timer::NotStarted,
        }
    }
}

/// What a handler sees when a body is late; its message reaches the client
/// in the refusal.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive whole within {} s", BODY_TIMEOUT.as_secs_f64())]
pub(crate) struct BodyTimedOut;

impl<B> Body for Deadline<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => {
                if frame.is_none() || this.body.is_end_stream() {
                    this.timer = Timer::Done;
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                if let Timer::NotStarted = this.timer {
                    this.timer = Timer::Running(Box::pin(tokio::time::sleep(BODY_TIMEOUT)));
                }
                let Timer::Running(sleep) = &mut this.timer else {
                    return Poll::Pending;
                };
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.timer = Timer::Done;
                Poll::Ready(Some(Err(BodyTimedOut.into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_with_nothing_in_progress() {
        let idle = Duration::from_secs(10);
        let a = Activity::new();
        let opened = Instant::now();
        assert_eq!(a.idle_at(idle), Some(opened + idle), "idle from its opening");
        let first = a.begin();
        let second = a.begin();
        tokio::time::advance(Duration::from_secs(3)).await;
        drop(first);
        assert_eq!(a.idle_at(idle), None, "one request still in progress");
        tokio::time::advance(Duration::from_secs(4)).await;
        drop(second);
        let ended = Instant::now();
        assert_eq!(a.idle_at(idle), Some(ended + idle), "idle from when the last one ended");
    }
}
