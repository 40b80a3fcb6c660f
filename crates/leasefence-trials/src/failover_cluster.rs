//! Several real `leasefence serve` on one shared store: each on a loopback
//! port of its own that it keeps across restarts (clients know the URLs, and
//! each coordinator advertises its own), all under one store prefix. Every
//! child is SIGKILLed when the cluster drops.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::failover_http::{Answer, Http, active_epoch};
use crate::procs::{Coordinator, Log, Rng};

/// How long one health probe may take: a stopped coordinator never answers.
const PROBE_LIMIT: Duration = Duration::from_millis(300);
/// Between rounds of probes.
const PROBE_EVERY: Duration = Duration::from_millis(10);

/// What every coordinator of the run is started with.
pub struct ClusterSpec {
    pub bin: PathBuf,
    pub store: String,
    pub prefix: String,
    pub leader_ttl: Duration,
}

pub struct Cluster {
    spec: ClusterSpec,
    ports: Vec<u16>,
    nodes: Vec<Option<Coordinator>>,
    probe: Http,
    /// Every coordinator's error log, in one.
    pub log: Log,
}

/// A loopback port free right now, for a child to bind and keep across its
/// restarts. It is picked below the kernel's ephemeral range: a port from
/// `bind(0)` lies in that range, where the kernel also picks the local port
/// of every outgoing connection on the machine, so one of those could take
/// it before the child binds it, or while a killed child is restarted.
fn free_port(rng: &mut Rng) -> anyhow::Result<u16> {
    let (lo, hi) = fixed_port_range(&std::fs::read_to_string(EPHEMERAL_RANGE).unwrap_or_default());
    for _ in 0..100 {
        let port = u16::try_from(rng.between(lo.into(), hi.into())).context("port range")?;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free loopback port in {lo}..={hi} after 100 tries")
}

/// Where Linux says which ports it hands out on its own.
const EPHEMERAL_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// The ports to pick from, given the ephemeral range as `/proc` shows it
/// (`"32768\t60999"`): the upper half of those below it, or 10000..=19999
/// when the range cannot be read or leaves too little below it.
fn fixed_port_range(ephemeral: &str) -> (u16, u16) {
    let low = ephemeral.split_whitespace().next().and_then(|w| w.parse::<u16>().ok());
    match low {
        Some(low) if low >= 4096 => (low / 2, low - 1),
        _ => (10_000, 19_999),
    }
}

impl Cluster {
    pub async fn start(spec: ClusterSpec, n: usize) -> anyhow::Result<Cluster> {
        let mut rng = Rng::from_os()?;
        let mut c = Cluster {
            spec,
            ports: (0..n).map(|_| free_port(&mut rng)).collect::<anyhow::Result<_>>()?,
            nodes: (0..n).map(|_| None).collect(),
            probe: Http::new(PROBE_LIMIT)?,
            log: Log::default(),
        };
        for i in 0..n {
            c.spawn(i).await?;
        }
        Ok(c)
    }

    pub fn len(&self) -> usize {
        self.ports.len()
    }

    pub fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i])
    }

    pub fn urls(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.url(i)).collect()
    }

    /// (Re)starts coordinator `i` on its port.
    pub async fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let s = &self.spec;
        let args: Vec<OsString> = [
            "--listen".to_string(),
            format!("127.0.0.1:{}", self.ports[i]),
            "--store".into(),
            s.store.clone(),
            "--store-prefix".into(),
            s.prefix.clone(),
            "--leader-ttl".into(),
            format!("{}ms", s.leader_ttl.as_millis()),
            "--advertise".into(),
            self.url(i),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        let c = Coordinator::start_with(&s.bin, &args, Some(self.log.clone()))
            .await
            .with_context(|| format!("cannot start coordinator {i} on port {}", self.ports[i]))?;
        self.nodes[i] = Some(c);
        Ok(())
    }

    pub fn pid(&self, i: usize) -> anyhow::Result<u32> {
        self.nodes[i]
            .as_ref()
            .with_context(|| format!("coordinator {i} is not running"))?
            .pid()
    }

    /// SIGKILL and reap coordinator `i`.
    pub async fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        match self.nodes[i].take() {
            Some(c) => c.kill().await,
            None => Ok(()),
        }
    }

    /// What `/healthz` of `i` says, if it answers 200 in time.
    pub async fn health(&self, i: usize) -> Option<String> {
        self.nodes[i].as_ref()?;
        self.probe.health(&self.url(i)).await
    }

    /// Waits until a coordinator other than `not` says it is active; returns
    /// it, its epoch, and the time since `since`.
    pub async fn await_active(
        &self,
        not: Option<usize>,
        since: Instant,
        limit: Duration,
    ) -> anyhow::Result<(usize, u64, Duration)> {
        loop {
            for i in (0..self.len()).filter(|&i| Some(i) != not) {
                if let Some(epoch) = self.health(i).await.as_deref().and_then(active_epoch) {
                    return Ok((i, epoch, since.elapsed()));
                }
            }
            if since.elapsed() > limit {
                match not {
                    Some(i) => bail!("no coordinator other than {i} became active within {limit:?}"),
                    None => bail!("no coordinator became active within {limit:?}"),
                }
            }
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }

    /// Waits until `i` no longer says it is active and says it stands by.
    pub async fn await_standby(&self, i: usize, limit: Duration) -> anyhow::Result<Duration> {
        let start = Instant::now();
        loop {
            let h = self.health(i).await.unwrap_or_default();
            if h.starts_with("ok: standby") {
                return Ok(start.elapsed());
            }
            if start.elapsed() > limit {
                bail!("coordinator {i} did not step down within {limit:?} (its health: {h:?})");
            }
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }

    /// Every resource's `last_token`, asked of `at` and following its hints.
    pub async fn last_tokens(
        &self,
        at: usize,
        resources: &[String],
        http: &Http,
        limit: Duration,
    ) -> anyhow::Result<HashMap<String, u64>> {
        let urls = self.urls();
        let start = Instant::now();
        let mut out = HashMap::new();
        let mut at = at;
        for r in resources {
            loop {
                let e = match http.last_token(&urls[at], r).await {
                    Ok(t) => {
                        out.insert(r.clone(), t);
                        break;
                    }
                    Err(e) => e,
                };
                if start.elapsed() > limit {
                    bail!("no status of {r} within {limit:?}; the last answer: {e:?}");
                }
                match e {
                    Answer::NotLeader { leader: Some(l) } if urls.contains(&l) => {
                        at = urls.iter().position(|u| *u == l).unwrap_or(at);
                    }
                    _ => {
                        at = (at + 1) % urls.len();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        }
        Ok(out)
    }

    /// SIGKILLs every coordinator still running (a stopped one too).
    pub async fn stop_all(&mut self) -> anyhow::Result<()> {
        for i in 0..self.len() {
            self.kill(i).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_ports_lie_below_the_ephemeral_range() {
        assert_eq!(fixed_port_range("32768\t60999\n"), (16_384, 32_767));
        assert_eq!(fixed_port_range("1024 65535"), (10_000, 19_999));
        assert_eq!(fixed_port_range(""), (10_000, 19_999));
        let mut rng = Rng::from_os().expect("rng");
        let ephemeral = std::fs::read_to_string(EPHEMERAL_RANGE).expect("/proc");
        let (lo, hi) = fixed_port_range(&ephemeral);
        let ephemeral_low: u16 = ephemeral
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .expect("low");
        assert!(hi < ephemeral_low, "{hi} against {ephemeral:?}");
        for _ in 0..5 {
            let port = free_port(&mut rng).expect("a free port");
            assert!((lo..=hi).contains(&port), "{port}");
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("still free");
        }
    }
}
