//! The leasefence coordinator: the lease machine of `leasefence-core` driven by
//! a real clock, backed by a durable store, served over gRPC and HTTP/JSON on
//! one port.
//!
//! - [`engine`]: the shared state, the one place that reads the clock, executes
//!   the core's effects (persist, then answer), queues waiters and reaps expiries.
//! - [`grpc`] and [`http`]: thin edges that validate wire input into core types;
//!   [`frames`], the lean binary protocol for a cycle's calls, on a port of its own;
//!   [`browse`] (listing, NDJSON watch) and [`ui`] (the status page, the OpenAPI
//!   document) are the read-only HTTP views.
//! - [`auth`] and [`quota`]: access control (who may do what) and limits.
//! - [`node`] and [`leadership`]: on a store several coordinators share, who
//!   is active; the election, epoch-fenced leadership and stepping down.
//! - [`tls`]: the port's optional TLS (and mTLS) configuration; the edge
//!   listener refuses plaintext clients on a TLS port with a clear answer
//!   and hands each request the verified client certificate ([`peer`]);
//!   every accepted connection, on either port, gets TCP keepalive, so a
//!   client that vanished gives its connection back (`tcp`).
//! - [`Server`]: binds the port, recovers the store (or joins the election),
//!   serves until shutdown.

pub mod auth;
mod browse;
pub mod config;
mod edge;
pub mod engine;
mod error;
pub mod frames;
mod grpc;
mod http;
pub mod leadership;
pub mod metrics;
pub mod node;
pub mod peer;
pub mod quota;
#[cfg(test)]
mod silent_tests;
mod tcp;
#[cfg(test)]
mod tcp_tests;
pub mod tls;
#[cfg(test)]
mod tls_tests;
mod ui;
pub mod watch;
pub mod wire;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

pub use config::ServerConfig;
pub use engine::Engine;
pub use error::ApiError;
pub use leadership::HaConfig;
use leasefence_store::{Committer, EmbeddedStore, LeaseStore, SharedStore, StoreError};
pub use node::{Node, Role};
use tokio::net::TcpListener;

use crate::edge::{EdgeListener, EdgeService};

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("server failed: {0}")]
    Serve(std::io::Error),
    /// A commit failed: the coordinator stopped so that it restarts from disk.
    #[error("fatal storage failure ({0}); stopped so that a restart recovers from what is on disk")]
    Fatal(StoreError),
}

/// After a fatal storage failure, how long the server goes on answering (with
/// errors only, and 503 on `/healthz`) before it stops, and then how long open
/// connections get to take their answers.
const FATAL_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// A bound coordinator, ready to serve.
pub struct Server {
    listener: TcpListener,
    /// The frame protocol's port, when it is served.
    frames: Option<TcpListener>,
    node: Arc<Node>,
    mode: Mode,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    access: Arc<auth::Access>,
    tls: Option<tls::Tls>,
    connection_idle: std::time::Duration,
}

enum Mode {
    /// One coordinator on its own store: active for its whole life.
    Single(Arc<Engine>),
    /// One of several on a shared store: the election runs beside the edges
    /// until `stop` turns true.
    Shared {
        election: leadership::Election,
        stop: tokio::sync::watch::Sender<bool>,
    },
}

impl Server {
    /// Opens the embedded store under `config.data_dir`, recovers it and binds.
    pub async fn bind(config: ServerConfig) -> Result<Server, ServerError> {
        let store = EmbeddedStore::open_dir(&config.data_dir)?;
        Server::bind_with_store(config, store).await
    }

    /// Like [`Server::bind`] with any store backend of its own.
    pub async fn bind_with_store<S: LeaseStore>(config: ServerConfig, mut store: S) -> Result<Server, ServerError> {
        let records = store.load()?;
        let recovered = records.len();
        let committer = Committer::start_with(store, config.batch_max, config.commit_spin);
        let engine = Engine::start(config.lease.clone(), config.wait_max, committer, records);
        let listener = listen(&config).await?;
        let frames = listen_frames(&config).await?;
        tracing::info!(resources = recovered, "store recovered");
        let node = Node::new(Role::Active {
            engine: engine.clone(),
            epoch: None,
        });
        if let Some(key) = config.fence_key {
            node.sign_fences_with(key);
        }
        Ok(Server {
            listener,
            frames,
            node,
            mode: Mode::Single(engine),
            access: Arc::new(auth::Access::new(config.policy, config.limits)),
            metrics: config.metrics,
            tls: config.tls,
            connection_idle: config.connection_idle,
        })
    }

    /// Binds a coordinator that shares `store` with others: it stands by until
    /// it wins the shard's leadership, then serves (see [`leadership`]).
    pub async fn bind_shared<S: SharedStore>(
        config: ServerConfig,
        store: S,
        ha: HaConfig,
    ) -> Result<Server, ServerError> {
        let listener = listen(&config).await?;
        let frames = listen_frames(&config).await?;
        let node = Node::new(Role::Standby { leader: None });
        if let Some(key) = config.fence_key.clone() {
            node.sign_fences_with(key);
        }
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let setup = leadership::EngineSetup {
            lease: config.lease.clone(),
            wait_max: config.wait_max,
            batch_max: config.batch_max,
            commit_spin: config.commit_spin,
        };
        let election = Box::pin(leadership::run(node.clone(), Arc::new(store), setup, ha, stopped));
        Ok(Server {
            listener,
            frames,
            node,
            mode: Mode::Shared { election, stop },
            access: Arc::new(auth::Access::new(config.policy, config.limits)),
            metrics: config.metrics,
            tls: config.tls,
            connection_idle: config.connection_idle,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Where the frame protocol is served, when it is.
    pub fn frames_addr(&self) -> Option<std::io::Result<SocketAddr>> {
        self.frames.as_ref().map(TcpListener::local_addr)
    }

    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Serves gRPC and HTTP/JSON on the bound port (and the frame protocol on
    /// its own, when configured) until `shutdown` completes.
    /// On its own store, a failed commit stops it with [`ServerError::Fatal`]
    /// (crash-only, as after a failed fsync: nothing is guessed, the restart
    /// reloads what is on disk); on a shared store the coordinator steps down
    /// instead and campaigns again, which reloads from the engine.
    /// `shutdown` is first polled only once serving has begun: a signal
    /// handler in it must be installed before it is passed in.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServerError> {
        // The edge calls the gRPC service for its own paths; the HTTP
        // router answers every other path (unknown ones in JSON or gRPC).
        let grpc = grpc::service(self.node.clone(), self.access.clone());
        let connections_max = self.access.limits().connections_max;
        let app = EdgeService::new(
            http::router(self.node.clone(), self.metrics, self.access.clone()),
            connections_max,
            self.connection_idle,
        )
        .with_grpc(grpc);
        if let Ok(addr) = self.listener.local_addr() {
            match &self.tls {
                None => tracing::info!(%addr, "serving gRPC and HTTP"),
                Some(t) => {
                    tracing::info!(%addr, client_certificates = t.client_auth(), "serving gRPC and HTTP over TLS")
                }
            }
        }
        // The frame port stops accepting, and its idle connections close,
        // once the main port has stopped (after the engine, when it stops).
        let (frames_stop, frames_stopped) = tokio::sync::watch::channel(false);
        if let Some(frames) = self.frames {
            if let Ok(addr) = frames.local_addr() {
                tracing::info!(%addr, tls = self.tls.is_some(), "serving the frame protocol");
            }
            let serving = frames::serve(
                frames,
                self.node.clone(),
                self.access.clone(),
                self.tls.clone(),
                self.connection_idle,
                frames_stopped,
            );
            tokio::spawn(serving);
        }
        let listener = EdgeListener::new(self.listener, self.tls).map_err(ServerError::Serve)?;
        let result = self.mode.serve(listener, app, shutdown).await;
        frames_stop.send_replace(true);
        result
    }
}

impl Mode {
    async fn serve(
        self,
        listener: EdgeListener,
        app: EdgeService,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        match self {
            Mode::Single(engine) => run_single(listener, app, engine, shutdown).await,
            Mode::Shared { election, stop } => {
                let election = tokio::spawn(election);
                let stop_on = stop.clone();
                let shutdown = async move {
                    shutdown.await;
                    stop_on.send_replace(true);
                };
                edge::serve(listener, app, shutdown).await;
                stop.send_replace(true);
                // The election steps down and resigns, so a standby need not wait out the TTL.
                let _ = tokio::time::timeout(FATAL_DRAIN * 5, election).await;
                Ok(())
            }
        }
    }
}

async fn listen_frames(config: &ServerConfig) -> Result<Option<TcpListener>, ServerError> {
    let Some(addr) = config.frames_listen else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    Ok(Some(listener))
}

async fn listen(config: &ServerConfig) -> Result<TcpListener, ServerError> {
    TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })
}

/// Serves one coordinator on its own store; a failed commit is fatal.
async fn run_single(
    listener: EdgeListener,
    app: EdgeService,
    engine: Arc<Engine>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    // Stop the engine first: queued acquires and open streams end, so the
    // graceful shutdown does not wait on them.
    let stopping = engine.clone();
    let (fatal_tx, mut fatal_rx) = tokio::sync::watch::channel(None);
    let failed = engine.store_failed();
    let shutdown = async move {
        tokio::select! {
            () = shutdown => {}
            e = failed => {
                tracing::error!(error = %e, "fatal storage failure: stopping");
                fatal_tx.send_replace(Some(e));
                tokio::time::sleep(FATAL_DRAIN).await;
            }
        }
        stopping.stop();
    };
    let serving = edge::serve(listener, app, shutdown);
    // After a fatal failure the stop does not wait long for slow connections.
    let drained = async {
        let _ = fatal_rx.wait_for(Option::is_some).await;
        tokio::time::sleep(2 * FATAL_DRAIN).await;
    };
    tokio::select! {
        () = serving => {}
        () = drained => {}
    }
    engine.stop();
    match fatal_rx.borrow().clone() {
        Some(e) => Err(ServerError::Fatal(e)),
        None => Ok(()),
    }
}
