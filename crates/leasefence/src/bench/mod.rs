//! `leasefence bench`: acquire+release cycles through a coordinator at
//! several client counts, side by side with the locks users would pick
//! instead (`--compare etcd,redis,noop`), reporting cycles/s and latency
//! percentiles, medians over interleaved rounds, and leasefence's ratios.
//!
//! Every target runs with the same client counts and the same per-client
//! shape: each client its own connection, one cycle after another. Rounds
//! interleave the targets (leasefence, peer, leasefence, peer, …) so that a
//! noisy neighbour on a shared machine hits them all alike. With
//! `--resources 0` each client cycles on its own resource: that measures the
//! grant path, not contention; with K > 0 clients pick among K resources at
//! random and wait for a busy one. Without `--server` a coordinator starts
//! in-process on a temporary embedded store.
//!
//! - [`workers`]: what one client does per target; [`etcd`] the etcd lock.
//! - [`plan`]: the flags, checked.
//! - [`stats`]: medians, ratios, the table and the JSON.
//! - [`progress`]: the bar on a terminal, plain lines elsewhere.
//! - [`scale`]: `--idle`, what idle resources cost (restart, memory, latency).

#[cfg(feature = "etcd")]
mod etcd;
mod plan;
mod progress;
mod scale;
mod stats;
mod workers;

use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use leasefence_server::{Server, ServerConfig};

use crate::cli::parse_duration;
use crate::out::outln;
use crate::{CmdResult, Failure};
use plan::Plan;
use progress::Progress;
use stats::{Sample, Samples};
use workers::{Endpoints, POLL, Worker};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Coordinators to measure, comma-separated as for the other commands
    /// (default: start one in-process on a temporary store).
    /// A frame port's `leasefence(s)://` URL measures over the frame protocol.
    #[arg(long, value_delimiter = ',', value_parser = parse_bench_server, value_name = "URL,...")]
    pub server: Option<Vec<String>>,
    /// The wire leasefence and noop are measured over: gRPC, or the frame
    /// protocol (`leasefence://`, see docs/frames.md). Default: the
    /// `--server` URL's, else gRPC.
    #[arg(long, value_enum)]
    pub transport: Option<Transport>,
    /// Bearer token for a `--server` with access control (as for the other commands).
    #[arg(long, env = "LEASEFENCE_AUTH_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub token: Option<String>,
    #[command(flatten)]
    pub tls: crate::cli::TlsArgs,
    /// Peers to measure beside leasefence, comma-separated: etcd (needs the
    /// `etcd` feature), redis, noop (two of our cheapest calls per cycle).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "PEER,...")]
    pub compare: Vec<Target>,
    /// Comma-separated client counts, each 1..=1024.
    #[arg(long, default_value = "1,16,64", value_delimiter = ',', value_name = "N,...")]
    pub clients: Vec<usize>,
    /// 0: each client its own resource. K > 0: clients pick among K shared
    /// resources (at most 1000000) and wait for a busy one.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=RESOURCES_MAX))]
    pub resources: u64,
    /// How long each target runs at each client count in each round (100ms..=10m).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Interleaved rounds; the figures are their medians (errors their sum).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// The etcd of `--compare etcd`: etcd://HOST:PORT or http://HOST:PORT
    /// (default http://127.0.0.1:2379).
    #[arg(long, value_name = "URL")]
    pub etcd: Option<String>,
    /// The Redis of `--compare redis`: redis://HOST:PORT[/DB] (default redis://127.0.0.1:6379).
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,
    /// Print one JSON object (progress goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Instead of the comparison: for each count, a server over a store of
    /// that many idle resources; reports restart time, RSS per idle resource
    /// and one client's p50 (interleaved rounds). E.g. `--idle 1000,1000000`.
    #[arg(long, value_delimiter = ',', value_name = "N,...", conflicts_with_all = ["server", "compare", "clients", "resources", "ca", "cert"])]
    pub idle: Vec<u64>,
}

/// The wire of the leasefence and noop targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    Grpc,
    Frames,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::Frames => "frames",
        }
    }
}

/// A `--server` entry: a coordinator URL, or one frame port's `leasefence(s)://` URL.
fn parse_bench_server(s: &str) -> Result<String, String> {
    if s.trim().starts_with("leasefence") {
        return Ok(s.trim().to_string());
    }
    crate::cli::parse_server(s)
}

/// What a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Target {
    #[value(skip)]
    Leasefence,
    Etcd,
    Redis,
    Noop,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Leasefence => "leasefence",
            Target::Etcd => "etcd",
            Target::Redis => "redis",
            Target::Noop => "noop",
        }
    }
}

const RESOURCES_MAX: u64 = 1_000_000;

pub async fn run(a: BenchArgs) -> CmdResult {
    let plan = Plan::new(&a).map_err(Failure::invalid)?;
    if !plan.idle.is_empty() {
        return run_scale(&a, &plan).await;
    }
    let dir = tempfile::tempdir()?;
    let (server, stop) = match &a.server {
        Some(urls) => (urls.clone(), None),
        None => {
            let mut config = ServerConfig::new("127.0.0.1:0".parse()?, dir.path().to_path_buf());
            if plan.transport == Transport::Frames {
                config.frames_listen = Some("127.0.0.1:0".parse()?);
            }
            let server = Server::bind(config).await?;
            let url = match server.frames_addr() {
                Some(frames) => format!("leasefence://{}", frames?),
                None => format!("http://{}", server.local_addr()?),
            };
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(server.run(async {
                let _ = rx.await;
            }));
            (vec![url], Some(tx))
        }
    };
    let ep = Endpoints {
        server,
        token: a.token.clone(),
        tls: a.tls.read()?,
        redis: plan.redis.clone(),
        etcd: plan.etcd.clone(),
        frames: plan.transport == Transport::Frames,
    };
    let segments = u64::from(plan.rounds) * (plan.clients.len() * plan.targets.len()) as u64;
    let progress = Progress::new(segments, a.json);
    progress.line(&format!(
        "acquire+release cycles: {} at {} clients, {} each, {} interleaved round(s), {}, leasefence over {}",
        plan.targets.iter().map(|t| t.name()).collect::<Vec<_>>().join(" / "),
        plan.clients
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        humantime::format_duration(plan.duration),
        plan.rounds,
        match plan.resources {
            0 => "each client its own resource".to_string(),
            k => format!("clients sharing {k} resources"),
        },
        plan.transport.name()
    ));
    // Every target answers one cycle before any is measured: a peer that is
    // down fails in a second, not after minutes of the others' rounds.
    for &target in &plan.targets {
        preflight(&plan, &ep, target).await.map_err(|e| failed(target, e))?;
    }
    let mut samples = Samples::default();
    for round in 1..=plan.rounds {
        for &clients in &plan.clients {
            for &target in &plan.targets {
                progress.start(round, plan.rounds, target, clients);
                let s = segment(&plan, &ep, target, clients)
                    .await
                    .map_err(|e| failed(target, e))?;
                progress.done(round, plan.rounds, target, clients, &s);
                samples.add(clients, target, s);
            }
        }
    }
    progress.finish();
    let report = samples.report();
    if a.json {
        // The wire leasefence and noop were measured over, beside the figures.
        let mut json = serde_json::to_value(&report)?;
        json["transport"] = serde_json::Value::from(plan.transport.name());
        outln!("{json}")?;
    } else {
        outln!("\n{}", report.table(plan.rounds).trim_end())?;
    }
    if let Some(stop) = stop {
        let _ = stop.send(());
    }
    Ok(())
}

async fn run_scale(a: &BenchArgs, plan: &Plan) -> CmdResult {
    let say = |s: &str| eprintln!("{s}");
    let rows = scale::run(&plan.idle, plan.duration, plan.rounds, say)
        .await
        .map_err(|e| Failure::new(Failure::INTERNAL, e))?;
    if a.json {
        outln!("{}", serde_json::json!({ "idle": rows }))?;
    } else {
        outln!("\n{}", scale::table(&rows, plan.rounds).trim_end())?;
    }
    Ok(())
}

fn failed(target: Target, e: anyhow::Error) -> Failure {
    Failure::new(Failure::INTERNAL, e.context(target.name()))
}

/// Connects one client to `target` and runs one cycle.
async fn preflight(plan: &Plan, ep: &Endpoints, target: Target) -> anyhow::Result<()> {
    let mut w = Worker::connect(target, ep, 0, plan.resources > 0, plan.duration).await?;
    w.cycle(&Keys::new(0, plan.resources).next())
        .await
        .map_err(|e| e.context("the first cycle failed"))?;
    w.close().await;
    Ok(())
}

/// The key client `i` cycles on next.
struct Keys {
    own: String,
    prefix: String,
    shared: u64,
    rng: u64,
}

impl Keys {
    fn new(i: usize, shared: usize) -> Keys {
        let run = std::process::id();
        Keys {
            own: format!("bench/{run}/{i}"),
            prefix: format!("bench/{run}/shared/"),
            shared: shared as u64,
            // xorshift64 needs a non-zero seed.
            rng: (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        }
    }

    fn next(&mut self) -> String {
        if self.shared == 0 {
            return self.own.clone();
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        format!("{}{}", self.prefix, self.rng % self.shared)
    }
}

/// One target at one client count for `plan.duration`: every client
/// connects and runs one cycle untimed (so that a target that cannot be
/// reached fails here, clearly), then all cycle until the deadline.
async fn segment(plan: &Plan, ep: &Endpoints, target: Target, clients: usize) -> anyhow::Result<Sample> {
    let mut ready = Vec::with_capacity(clients);
    for i in 0..clients {
        let mut w = Worker::connect(target, ep, i, plan.resources > 0, plan.duration).await?;
        let mut keys = Keys::new(i, plan.resources);
        w.cycle(&keys.next())
            .await
            .map_err(|e| e.context("the first cycle failed"))?;
        ready.push((w, keys));
    }
    let start = Instant::now();
    let deadline = start + plan.duration;
    let tasks: Vec<_> = ready
        .into_iter()
        .map(|(mut w, mut keys)| {
            tokio::spawn(async move {
                let mut hist = Histogram::<u64>::new(3)?;
                let (mut cycles, mut errors) = (0u64, 0u64);
                while Instant::now() < deadline {
                    let key = keys.next();
                    let t0 = Instant::now();
                    match w.cycle(&key).await {
                        Ok(()) => {
                            hist.record(u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX))?;
                            cycles += 1;
                        }
                        Err(_) => {
                            errors += 1;
                            tokio::time::sleep(POLL).await;
                        }
                    }
                }
                w.close().await;
                Ok::<_, anyhow::Error>((cycles, errors, hist))
            })
        })
        .collect();
    let mut all = Histogram::<u64>::new(3)?;
    let (mut cycles, mut errors) = (0, 0);
    for t in tasks {
        let (c, e, h) = t.await??;
        cycles += c;
        errors += e;
        all.add(h)?;
    }
    Ok(Sample::new(cycles, start.elapsed().as_secs_f64(), &all, errors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_own_or_drawn_from_the_shared_set() {
        let mut own = Keys::new(3, 0);
        assert_eq!(own.next(), own.next());
        assert!(own.next().ends_with("/3"));
        let mut shared = Keys::new(3, 4);
        let drawn: std::collections::BTreeSet<String> = (0..200).map(|_| shared.next()).collect();
        assert_eq!(drawn.len(), 4, "{drawn:?}");
        assert!(drawn.iter().all(|k| k.contains("/shared/")));
    }
}
