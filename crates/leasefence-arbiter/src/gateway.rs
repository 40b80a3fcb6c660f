//! The fenced object-store gateway: an HTTP object store (axum) whose writes
//! carry a fence and whose bytes and fence commit together (redb).
//!
//! `PUT/GET/HEAD/DELETE /objects/{key}`, `GET /objects?prefix=P` (a listing)
//! and `GET /fences/{resource}` (a fence key's `last_token`). Writes carry the
//! fence headers of [`crate::propagate`]; the fence key is the resource the
//! fence names, so one lease may guard many objects. The arbiter rule is the
//! one of `leasefence-core`, strict unless `leasefence-mode: monotonic`.
//!
//! A write streams its body into a temp file under the data directory,
//! fsyncs it, moves it among the blobs (fsyncing both directories), and only
//! then, in **one** redb write transaction with `Durability::Immediate`,
//! admits the fence, records its token and points the key at the new blob.
//! Blobs are immutable, so a read never sees a torn object; the old blob is
//! removed after the commit. On start the gateway removes every temp file and
//! every blob no key points at: whatever a crash left behind. The wire
//! format, status codes and JSON shapes are in the crate README, section
//! "Fenced object store".

mod blob;
pub mod client;
mod config;
#[cfg(test)]
#[path = "gateway/connection_tests.rs"]
mod connection_tests;
mod http;
pub mod precondition;
mod reply;
mod serve;
mod store;
#[cfg(test)]
#[path = "gateway/vanish_tests.rs"]
mod vanish_tests;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use leasefence_core::Invalid;

use crate::ArbiterError;

pub use config::{GatewayConfig, parse_size};
pub use precondition::Etag;
pub(crate) use serve::HEADER_READ_TIMEOUT;

/// Header choosing the arbiter rule of one write: `strict` (the default) or `monotonic`.
pub const HEADER_MODE: &str = "leasefence-mode";
/// Longest object key, in bytes of UTF-8.
pub const KEY_LEN_MAX: usize = 1024;
/// Most entries one listing answers (`limit` defaults to it).
pub const LIST_LIMIT_MAX: usize = 1000;
/// What `GET /` answers in `service`, so a client can tell it reached a gateway.
pub const SERVICE: &str = "leasefence-gateway";

/// Why the gateway could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    /// Another process (another gateway) has the data directory's database open.
    #[error("{path} is in use by another gateway (its database is locked); give each gateway its own --data-dir")]
    InUse { path: String },
    #[error(transparent)]
    Store(#[from] ArbiterError),
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

/// A gateway bound to its address, its store opened and swept.
pub struct Gateway {
    listener: tokio::net::TcpListener,
    connections_max: usize,
    store: Arc<store::Store>,
    swept: store::Swept,
}

impl Gateway {
    /// Opens (creating if needed) the store under the data directory, removes
    /// what an earlier crash left behind, and binds the listen address.
    pub async fn bind(config: GatewayConfig) -> Result<Gateway, GatewayError> {
        let opened = {
            let config = config.clone();
            tokio::task::spawn_blocking(move || store::Store::open(&config))
                .await
                .map_err(|e| ArbiterError::Task(format!("gateway store open task failed: {e}")))??
        };
        let (store, swept) = opened;
        let listener = tokio::net::TcpListener::bind(config.listen())
            .await
            .map_err(|source| GatewayError::Io {
                what: "cannot listen on",
                path: config.listen().to_string(),
                source,
            })?;
        Ok(Gateway {
            listener,
            connections_max: config.connections_max(),
            store: Arc::new(store),
            swept,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// What the start-up sweep removed: `(temp files, unreferenced blobs)`.
    pub fn swept(&self) -> (u64, u64) {
        (self.swept.temp_files, self.swept.orphan_blobs)
    }

    /// Serves until `shutdown` completes, then lets requests in flight finish.
    /// `shutdown` is first polled only once serving has begun: a signal
    /// handler in it must be installed before it is passed in. HTTP/1.1,
    /// each request head within 30 s, at most `connections_max` connections
    /// (see `serve`).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
        let app = http::router(self.store);
        serve::serve(self.listener, app, self.connections_max, shutdown).await;
        Ok(())
    }
}

/// How long a connection is silent before the first keepalive probe (as on
/// the coordinator's ports).
#[cfg(not(test))]
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Shorter under test, so that a vanished client is seen within seconds.
#[cfg(test)]
const KEEPALIVE_IDLE: Duration = Duration::from_secs(1);
/// Between probes.
#[cfg(not(test))]
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
#[cfg(test)]
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Unanswered probes before the connection is ended.
const KEEPALIVE_PROBES: u32 = if cfg!(test) { 2 } else { 3 };

/// Sets up a connection just accepted: Nagle's algorithm off (each answer is
/// one small write its client waits for), and TCP keepalive on. A client
/// that vanished mid-upload without closing (a host powered off, a VM
/// stopped, the network cut for good) would otherwise keep its request
/// waiting for the rest of the body, and its temp file on disk, until the
/// gateway restarts; with keepalive the kernel ends the connection after
/// about a minute of unanswered probes, and the request's temp file is
/// removed. A live client that is only slow or paused answers the probes
/// and is not touched. A failure to set either costs speed or that early
/// end, never correctness, so it is only logged.
fn accepted(tcp: &mut tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(e) = socket2::SockRef::from(&*tcp).set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "cannot turn TCP keepalive on");
    }
}
