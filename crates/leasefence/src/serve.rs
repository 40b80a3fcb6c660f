//! `leasefence serve`: the coordinator on its embedded store.

use leasefence_server::{Server, ServerConfig, ServerError};

use crate::cli::ServeArgs;
use crate::{CmdResult, Failure};

pub async fn run(a: ServeArgs) -> CmdResult {
    let lease = leasefence_core::Config::new(a.ttl_min, a.ttl_max, a.waiters_max)
        .map_err(Failure::invalid)?
        .with_lock_delay_max(a.lock_delay_max);
    let mut config = ServerConfig::new(a.listen, a.data_dir);
    config.lease = lease;
    config.wait_max = a.wait_max;
    config.metrics = leasefence_server::metrics::install_prometheus();
    let data_dir = config.data_dir.clone();
    let server = Server::bind(config).await?;
    // One line on stdout, so scripts (and tests) learn the bound port when --listen used port 0.
    println!(
        "leasefence listening on {} (data dir {})",
        server.local_addr()?,
        data_dir.display()
    );
    match server.run(shutdown_signal()).await {
        Ok(()) => {
            tracing::info!("stopped");
            Ok(())
        }
        Err(e @ ServerError::Fatal(_)) => Err(Failure::new(Failure::FATAL, e)),
        Err(e) => Err(e.into()),
    }
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
