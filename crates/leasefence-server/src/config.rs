//! Server configuration: one struct, validated where it is built.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Everything the coordinator needs to start.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// TTL bounds and the waiter limit.
    pub lease: leasefence_core::Config,
    /// The longest an acquire may wait for a busy resource.
    pub wait_max: Duration,
    /// The most mutations in one store transaction.
    pub batch_max: usize,
    /// How long the store's writer looks for more work after a commit before
    /// it sleeps, and a call waiting alone for its commit looks for it (see
    /// `leasefence_store::Committer::start_with`).
    pub commit_spin: Duration,
    /// Renders `GET /metrics`; `None` serves 404 there.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Signs every grant's fence (see `leasefence_core::signing`); `None`: unsigned.
    pub fence_key: Option<leasefence_core::signing::FenceKey>,
    /// Access control; `None`: anyone who reaches the port may do anything.
    pub policy: Option<leasefence_core::access::Policy>,
    /// Per-principal and total limits (see [`crate::auth::Limits`]).
    pub limits: crate::auth::Limits,
    /// TLS on the port (and client certificates, with a client CA);
    /// `None` serves plaintext.
    pub tls: Option<crate::tls::Tls>,
    /// Where the frame protocol (`leasefence://`, see [`crate::frames`]) is
    /// served, with the same TLS and access control; `None`: not served.
    pub frames_listen: Option<SocketAddr>,
    /// How long a main-port connection may have nothing in progress (no
    /// request being served, no stream open) before it is told to close:
    /// HTTP/2 gets a GOAWAY, after which its client opens a new connection
    /// for its next call. Open keep-alive and watch streams count as in
    /// progress. An idle HTTP/1 connection closes sooner, at the header
    /// timeout (see `edge::serve`).
    pub connection_idle: Duration,
}

impl ServerConfig {
    pub const DEFAULT_LISTEN: &'static str = "127.0.0.1:7740";
    pub const DEFAULT_DATA_DIR: &'static str = "leasefence-data";
    pub const DEFAULT_WAIT_MAX: Duration = Duration::from_secs(300);
    pub const DEFAULT_BATCH_MAX: usize = 4096;
    pub const DEFAULT_CONNECTION_IDLE: Duration = Duration::from_secs(300);

    pub fn new(listen: SocketAddr, data_dir: PathBuf) -> ServerConfig {
        ServerConfig {
            listen,
            data_dir,
            lease: leasefence_core::Config::default(),
            wait_max: Self::DEFAULT_WAIT_MAX,
            batch_max: Self::DEFAULT_BATCH_MAX,
            commit_spin: leasefence_store::IDLE_SPIN,
            metrics: None,
            fence_key: None,
            policy: None,
            limits: crate::auth::Limits::default(),
            tls: None,
            frames_listen: None,
            connection_idle: Self::DEFAULT_CONNECTION_IDLE,
        }
    }
}
