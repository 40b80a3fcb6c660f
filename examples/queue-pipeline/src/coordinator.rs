//! The coordinator, in this process: the real `leasefence_server::Server`
//! on a free loopback port over a temporary data directory, which is
//! removed when the run ends. (The workers, which are separate processes,
//! reach it over gRPC like any client.)

use anyhow::Context;
use leasefence_server::{Server, ServerConfig, ServerError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct Coordinator {
    pub url: String,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), ServerError>>,
    _dir: tempfile::TempDir,
}

impl Coordinator {
    pub async fn start() -> anyhow::Result<Coordinator> {
        let dir = tempfile::tempdir().context("creating the coordinator's temporary data dir")?;
        let listen = "127.0.0.1:0".parse().context("the loopback address")?;
        let config = ServerConfig::new(listen, dir.path().join("coordinator"));
        let server = Server::bind(config).await.context("starting the coordinator")?;
        let url = format!("http://{}", server.local_addr().context("the coordinator's port")?);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Ok(Coordinator {
            url,
            stop,
            task,
            _dir: dir,
        })
    }

    /// Stops serving and waits for the server to finish.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await.context("the coordinator task failed")??;
        Ok(())
    }
}
