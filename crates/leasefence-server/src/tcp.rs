//! How the coordinator sets up every connection it accepts, on the main port
//! and the frame port alike.
//!
//! - Nagle's algorithm off: every answer is one small write that its client
//!   waits for, and holding it back for an ACK only adds latency (gRPC
//!   servers do the same).
//! - TCP keepalive on: a client that vanished without closing its
//!   connection (a host powered off or frozen, a stopped VM, a network cut
//!   for good) would otherwise hold its place under `--connections-max`,
//!   and whatever it had open (a watch stream, a queued acquire), for as
//!   long as the coordinator runs. With keepalive the kernel probes a
//!   connection that has been silent for [`KEEPALIVE_IDLE`] and ends it
//!   when [`KEEPALIVE_PROBES`] probes, [`KEEPALIVE_INTERVAL`] apart, go
//!   unanswered: about a minute in all. A client that is only paused (a
//!   long GC, a stopped process on a live host) is not touched, since its
//!   kernel answers the probes; nor is one that has stopped reading.
//!
//! While the coordinator has data in flight to a vanished client, keepalive
//! waits and the kernel's retransmissions end the connection instead (about
//! 15 minutes at Linux's defaults). `TCP_USER_TIMEOUT` would shorten that,
//! but it also ends the connection of a live client that stops reading for
//! as long (a paused watcher), which is not a client's fault to be cut for.
//!
//! Failing to set an option costs speed or a slot's early return, never
//! correctness, so a failure is only logged.

use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

/// How long a connection is silent before the first probe.
#[cfg(not(test))]
pub(crate) const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Shorter under test, so that a vanished client is seen within seconds.
#[cfg(test)]
pub(crate) const KEEPALIVE_IDLE: Duration = Duration::from_secs(1);
/// Between probes.
#[cfg(not(test))]
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
#[cfg(test)]
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Unanswered probes before the connection is ended.
pub(crate) const KEEPALIVE_PROBES: u32 = if cfg!(test) { 2 } else { 3 };

/// Sets up a connection just accepted.
pub(crate) fn accepted(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
    let keepalive = TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(e) = SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "cannot turn TCP keepalive on");
    }
}
