//! `leasefence bench`: acquire+release round trips through a coordinator at
//! several client counts, reporting grants/s and latency percentiles.
//!
//! Each client owns its own connection and resource, so the figure measures
//! the coordinator's grant path (validation, the lease machine, group-committed
//! fsync, the reply), not contention on one resource. Without `--server` it
//! starts a coordinator in-process on a temporary embedded store.

use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use leasefence_client::Client;
use leasefence_core::ResourceId;
use leasefence_server::{Server, ServerConfig};

use crate::cli::parse_duration;
use crate::client_cmds::failure;
use crate::{CmdResult, Failure};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Coordinators to measure, comma-separated as for the other commands
    /// (default: start one in-process on a temporary store).
    #[arg(long, value_delimiter = ',', value_parser = crate::cli::parse_server, value_name = "URL,...")]
    pub server: Option<Vec<String>>,
    /// Comma-separated client counts.
    #[arg(long, default_value = "1,16,64", value_delimiter = ',')]
    pub clients: Vec<usize>,
    /// How long to run each client count.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
}

const CLIENTS_MAX: usize = 1024;

pub async fn run(a: BenchArgs) -> CmdResult {
    if a.clients.is_empty() || a.clients.iter().any(|&c| c == 0 || c > CLIENTS_MAX) {
        return Err(Failure::invalid(format!(
            "--clients must be numbers in 1..={CLIENTS_MAX}"
        )));
    }
    if a.duration < Duration::from_millis(100) || a.duration > Duration::from_secs(600) {
        return Err(Failure::invalid("--duration must be in 100ms..=10m"));
    }
    let dir = tempfile::tempdir()?;
    let (urls, stop) = match &a.server {
        Some(urls) => (urls.clone(), None),
        None => {
            let config = ServerConfig::new("127.0.0.1:0".parse()?, dir.path().to_path_buf());
            let server = Server::bind(config).await?;
            let url = format!("http://{}", server.local_addr()?);
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(server.run(async {
                let _ = rx.await;
            }));
            (vec![url], Some(tx))
        }
    };
    println!(
        "acquire+release through {}, {} per client count",
        urls.join(","),
        humantime::format_duration(a.duration)
    );
    println!(
        "{:>8} {:>12} {:>10} {:>10} {:>10}",
        "clients", "grants/s", "p50 µs", "p99 µs", "p999 µs"
    );
    let run_id = std::process::id();
    for &clients in &a.clients {
        let (count, hist) = level(&urls, clients, a.duration, run_id).await?;
        let rate = count as f64 / a.duration.as_secs_f64();
        println!(
            "{clients:>8} {rate:>12.0} {:>10} {:>10} {:>10}",
            hist.value_at_quantile(0.5),
            hist.value_at_quantile(0.99),
            hist.value_at_quantile(0.999)
        );
    }
    if let Some(stop) = stop {
        let _ = stop.send(());
    }
    Ok(())
}

async fn level(
    urls: &[String],
    clients: usize,
    duration: Duration,
    run_id: u32,
) -> Result<(u64, Histogram<u64>), Failure> {
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::with_capacity(clients);
    for i in 0..clients {
        let client = Client::connect_any(urls).await.map_err(failure)?;
        let resource = ResourceId::new(&format!("bench/{run_id}/{clients}/{i}")).map_err(Failure::invalid)?;
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new(3)?;
            let mut count = 0u64;
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let lease = client
                    .acquire(&resource, Duration::from_secs(10), None, Duration::ZERO)
                    .await?;
                client.release(&resource, &lease.lease_id).await?;
                hist.record(u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX))?;
                count += 1;
            }
            Ok::<_, anyhow::Error>((count, hist))
        }));
    }
    let mut total = 0;
    let mut all = Histogram::<u64>::new(3)?;
    for t in tasks {
        let (count, hist) = t.await??;
        total += count;
        all.add(hist)?;
    }
    Ok((total, all))
}
