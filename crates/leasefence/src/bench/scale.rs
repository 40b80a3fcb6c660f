//! `leasefence bench --idle 1000,1000000`: what idle resources cost. For each
//! count N it fills a fresh embedded store with N resources that were granted
//! and released once (written through the store, as N grants and releases
//! would leave it), then starts `leasefence serve` on it as a child process
//! and reports:
//!
//! - **restart**: from spawning the process to its "listening" line, which
//!   it prints once the store is loaded and the machine recovered;
//! - **RSS per idle resource**: (RSS with N − RSS of the same server on an
//!   empty store) / N, read from `/proc/PID/status` after some traffic;
//! - **p50** (and p99) of one client's acquire+release on a hot resource of
//!   its own, in rounds interleaved across the servers, as medians.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use leasefence_core::{Holder, LeaseId, Mutation, ReleaseCause, ResourceId, Token};
use leasefence_store::{EmbeddedStore, LeaseStore};
use serde::Serialize;

use super::workers::Worker;
use super::{Endpoints, Target};

/// The most idle resources one run may create.
pub const IDLE_MAX: u64 = 10_000_000;
/// Mutations per store transaction while filling.
const FILL_BATCH: usize = 20_000;

/// One server of the run, over its own store.
struct Served {
    idle: u64,
    child: Child,
    url: String,
    restart: Duration,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Serialize)]
pub struct ScaleRow {
    pub idle_resources: u64,
    pub restart_ms: f64,
    pub rss_bytes: u64,
    pub rss_per_idle_resource: Option<f64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Fills `dir` with `n` released resources named `idle/0`, `idle/1`, ….
fn fill(dir: &Path, n: u64) -> anyhow::Result<()> {
    let mut store = EmbeddedStore::open_dir(dir)?;
    let holder = Holder::new("bench-idle")?;
    let token = Token::new(1).context("token 1")?;
    let mut batch = Vec::with_capacity(FILL_BATCH);
    for i in 0..n {
        let resource = ResourceId::new(&format!("idle/{i}"))?;
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&i.to_le_bytes());
        batch.push(Mutation::Grant {
            resource: resource.clone(),
            token,
            lease_id: LeaseId::from_bytes(id),
            holder: holder.clone(),
            ttl: Duration::from_secs(10),
            lock_delay: Duration::ZERO,
        });
        batch.push(Mutation::Release {
            resource,
            token,
            cause: ReleaseCause::Released,
            lock_delay: Duration::ZERO,
        });
        if batch.len() >= FILL_BATCH {
            store.apply(&batch)?;
            batch.clear();
        }
    }
    if !batch.is_empty() {
        store.apply(&batch)?;
    }
    Ok(())
}

/// Starts `leasefence serve` over a store of `idle` resources.
fn serve(idle: u64) -> anyhow::Result<Served> {
    let dir = tempfile::tempdir()?;
    fill(dir.path(), idle).with_context(|| format!("filling a store with {idle} resources"))?;
    let exe = std::env::current_exe().context("the leasefence binary")?;
    let started = Instant::now();
    let mut child = Command::new(exe)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("LEASEFENCE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting leasefence serve")?;
    let mut line = String::new();
    let stdout = child.stdout.take().context("the child's stdout")?;
    BufReader::new(stdout).read_line(&mut line)?;
    let restart = started.elapsed();
    let Some(addr) = line
        .strip_prefix("leasefence listening on ")
        .and_then(|r| r.split_whitespace().next())
    else {
        let _ = child.kill();
        bail!("leasefence serve did not start: {line:?}");
    };
    Ok(Served {
        idle,
        url: format!("http://{addr}"),
        child,
        restart,
        _dir: dir,
    })
}

/// Resident set size of `pid`, in bytes.
fn rss(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading /proc: Linux only")?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .context("no VmRSS in /proc/PID/status")?;
    Ok(kb * 1024)
}

/// One client's cycles on its own resource for `duration`.
async fn round(url: &str, duration: Duration) -> anyhow::Result<Histogram<u64>> {
    let ep = Endpoints {
        server: vec![url.to_string()],
        redis: String::new(),
        etcd: String::new(),
        token: None,
        tls: None,
        frames: false,
    };
    let mut w = Worker::connect(Target::Leasefence, &ep, 0, false, duration).await?;
    let key = format!("hot/{}", std::process::id());
    let mut hist = Histogram::<u64>::new(3)?;
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        let t0 = Instant::now();
        w.cycle(&key).await?;
        hist.record(u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX))?;
    }
    w.close().await;
    Ok(hist)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the whole measurement; `say` reports progress.
pub async fn run(idle: &[u64], duration: Duration, rounds: u32, say: impl Fn(&str)) -> anyhow::Result<Vec<ScaleRow>> {
    let empty = serve(0)?;
    let mut servers = Vec::new();
    for &n in idle {
        say(&format!(
            "filling a store with {n} idle resources and starting a server on it"
        ));
        servers.push(serve(n)?);
    }
    let mut p50s = vec![Vec::new(); servers.len()];
    let mut p99s = vec![Vec::new(); servers.len()];
    // Warm every server (and the empty one, for its RSS baseline) alike.
    round(&empty.url, duration).await?;
    for r in 1..=rounds {
        for (i, s) in servers.iter().enumerate() {
            say(&format!("round {r}/{rounds}: {} idle resources", s.idle));
            let h = round(&s.url, duration).await?;
            p50s[i].push(h.value_at_quantile(0.5) as f64 / 1000.0);
            p99s[i].push(h.value_at_quantile(0.99) as f64 / 1000.0);
        }
    }
    let base = rss(empty.child.id())?;
    let mut rows = Vec::new();
    for (i, s) in servers.iter().enumerate() {
        let bytes = rss(s.child.id())?;
        rows.push(ScaleRow {
            idle_resources: s.idle,
            restart_ms: s.restart.as_secs_f64() * 1000.0,
            rss_bytes: bytes,
            rss_per_idle_resource: (s.idle > 0).then(|| bytes.saturating_sub(base) as f64 / s.idle as f64),
            p50_ms: median(p50s[i].clone()),
            p99_ms: median(p99s[i].clone()),
        });
    }
    Ok(rows)
}

/// The rows as a table, with the p50 of each count relative to the first.
pub fn table(rows: &[ScaleRow], rounds: u32) -> String {
    let mut out = format!(
        "idle resources | restart | RSS | RSS per idle resource | p50 | p99 | p50 / p50 at {} (medians of {rounds} rounds)\n",
        rows.first().map_or(0, |r| r.idle_resources)
    );
    let first = rows.first().map_or(1.0, |r| r.p50_ms);
    for r in rows {
        out.push_str(&format!(
            "{} | {:.0} ms | {:.1} MiB | {} | {:.3} ms | {:.3} ms | {:.2}\n",
            r.idle_resources,
            r.restart_ms,
            r.rss_bytes as f64 / (1024.0 * 1024.0),
            r.rss_per_idle_resource.map_or("-".to_string(), |b| format!("{b:.0} B")),
            r.p50_ms,
            r.p99_ms,
            r.p50_ms / first
        ));
    }
    out
}
