//! `leasefence demo`: the paused-worker story in one command, on a real
//! coordinator (embedded store, loopback port) and a real fenced resource
//! (the embedded arbiter), both in a temporary directory.

use std::time::Duration;

use leasefence_arbiter::embedded::EmbeddedArbiter;
use leasefence_client::Client;
use leasefence_core::{FenceMode, Holder, ResourceId};
use leasefence_server::{Server, ServerConfig};

use crate::client_cmds::failure;
use crate::out::outln;
use crate::{CmdResult, Failure};

const TTL: Duration = Duration::from_millis(500);
const PAUSE: Duration = Duration::from_millis(1200);

pub async fn run() -> CmdResult {
    let dir = tempfile::tempdir()?;
    let config = ServerConfig::new("127.0.0.1:0".parse()?, dir.path().join("coordinator"));
    let server = Server::bind(config).await?;
    let url = format!("http://{}", server.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let report = ResourceId::new("reports/daily").map_err(Failure::invalid)?;
    let store = EmbeddedArbiter::open(&dir.path().join("resource.redb"))?;
    let client = Client::connect(&url).await.map_err(failure)?;
    let (a, b) = (
        Holder::new("worker-a").map_err(Failure::invalid)?,
        Holder::new("worker-b").map_err(Failure::invalid)?,
    );

    outln!("coordinator on {url}; the fenced resource is a key-value store that checks tokens.\n")?;
    let lease_a = client
        .acquire(&report, TTL, Some(&a), Duration::ZERO)
        .await
        .map_err(failure)?;
    outln!(
        "1. worker-a acquires {report}: token {} (ttl {} ms)",
        lease_a.token,
        TTL.as_millis()
    )?;
    outln!(
        "2. worker-a pauses for {} ms (a long GC, a stopped VM) — its lease expires meanwhile",
        PAUSE.as_millis()
    )?;
    tokio::time::sleep(PAUSE).await;

    let lease_b = client
        .acquire(&report, TTL, Some(&b), Duration::ZERO)
        .await
        .map_err(failure)?;
    outln!("3. worker-b acquires {report}: token {}", lease_b.token)?;
    store.put(&lease_b.fence(), FenceMode::Strict, "report", b"written by worker-b")?;
    outln!("4. worker-b writes the report with token {}: accepted", lease_b.token)?;

    outln!(
        "5. worker-a wakes up, still believing it holds the lease, and writes with token {}",
        lease_a.token
    )?;
    match store.put(&lease_a.fence(), FenceMode::Strict, "report", b"written by worker-a") {
        Err(e) if e.as_stale().is_some() => outln!("   -> rejected: {e}")?,
        Err(e) => return Err(e.into()),
        Ok(()) => return Err(anyhow::anyhow!("the stale write was accepted: the fence failed").into()),
    }
    let value = store.get("report")?.unwrap_or_default();
    outln!("6. the report says: {:?}", String::from_utf8_lossy(&value))?;
    outln!("\nThe lock service alone could not stop worker-a; the fence at the resource did.")?;

    client.release(&report, &lease_b.lease_id).await.map_err(failure)?;
    let _ = stop.send(());
    serving.await??;
    Ok(())
}
