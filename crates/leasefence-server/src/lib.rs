//! The leasefence coordinator: the lease machine of `leasefence-core` driven by
//! a real clock, backed by a durable store, served over gRPC and HTTP/JSON on
//! one port.
//!
//! - [`engine`]: the shared state, the one place that reads the clock, executes
//!   the core's effects (persist, then answer), queues waiters and reaps expiries.
//! - [`grpc`] and [`http`]: thin edges that validate wire input into core types.
//! - [`Server`]: binds the port, recovers the store, serves until shutdown.

pub mod config;
pub mod engine;
mod error;
mod grpc;
mod http;
pub mod metrics;
pub mod watch;
pub mod wire;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

pub use config::ServerConfig;
pub use engine::Engine;
pub use error::ApiError;
use leasefence_store::{Committer, EmbeddedStore, LeaseStore, StoreError};
use tokio::net::TcpListener;

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

/// A bound, recovered coordinator, ready to serve.
pub struct Server {
    listener: TcpListener,
    engine: Arc<Engine>,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

impl Server {
    /// Opens the embedded store under `config.data_dir`, recovers it and binds.
    pub async fn bind(config: ServerConfig) -> Result<Server, ServerError> {
        let store = EmbeddedStore::open_dir(&config.data_dir)?;
        Server::bind_with_store(config, store).await
    }

    /// Like [`Server::bind`] with any store backend.
    pub async fn bind_with_store<S: LeaseStore>(config: ServerConfig, mut store: S) -> Result<Server, ServerError> {
        let records = store.load()?;
        let recovered = records.len();
        let committer = Committer::start(store, config.batch_max);
        let engine = Engine::start(config.lease.clone(), config.wait_max, committer, records);
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| ServerError::Bind {
                addr: config.listen,
                source,
            })?;
        tracing::info!(resources = recovered, "store recovered");
        Ok(Server {
            listener,
            engine,
            metrics: config.metrics,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Serves gRPC and HTTP/JSON on the bound port until `shutdown` completes,
    /// or until a commit fails: then it stops with [`ServerError::Fatal`]
    /// (crash-only, as after a failed fsync: nothing is guessed, the restart
    /// reloads what is on disk).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServerError> {
        // Without tonic's fallback (a gRPC UNIMPLEMENTED for any path), so
        // that the HTTP router's fallback answers unknown paths, in JSON or gRPC.
        let grpc = tonic::service::Routes::new(grpc::service(self.engine.clone()))
            .prepare()
            .into_axum_router()
            .reset_fallback();
        let app = http::router(self.engine.clone(), self.metrics).merge(grpc);
        if let Ok(addr) = self.listener.local_addr() {
            tracing::info!(%addr, "serving gRPC and HTTP");
        }
        // Stop the engine first: queued acquires and open streams end, so the
        // graceful shutdown does not wait on them.
        let engine = self.engine.clone();
        let (fatal_tx, mut fatal_rx) = tokio::sync::watch::channel(None);
        let failed = self.engine.store_failed();
        let shutdown = async move {
            tokio::select! {
                () = shutdown => {}
                e = failed => {
                    tracing::error!(error = %e, "fatal storage failure: stopping");
                    fatal_tx.send_replace(Some(e));
                    tokio::time::sleep(FATAL_DRAIN).await;
                }
            }
            engine.stop();
        };
        let serving = axum::serve(self.listener, app).with_graceful_shutdown(shutdown);
        // After a fatal failure the stop does not wait long for slow connections.
        let drained = async {
            let _ = fatal_rx.wait_for(Option::is_some).await;
            tokio::time::sleep(2 * FATAL_DRAIN).await;
        };
        let result = tokio::select! {
            r = serving => r.map_err(ServerError::Serve),
            () = drained => Ok(()),
        };
        self.engine.stop();
        match fatal_rx.borrow().clone() {
            Some(e) => Err(ServerError::Fatal(e)),
            None => result,
        }
    }
}
