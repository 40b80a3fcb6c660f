//! Several real `leasefence serve` processes on one shared store, clients
//! spread over all of them, and a history of what the clients were answered,
//! checked for the invariant: per resource, answered tokens are unique and
//! follow real time, and no two answered leases overlap.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::BIN;

/// A loopback port free right now, for a child to bind (and a coordinator
/// to keep across restarts). Picked below the kernel's ephemeral range,
/// where `bind(0)` and every outgoing connection on the machine take their
/// ports: one of those could take it before the child binds it.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let low = ephemeral.split_whitespace().next().and_then(|w| w.parse::<u16>().ok());
    let (lo, hi) = match low {
        Some(low) if low >= 4096 => (low / 2, low - 1),
        _ => (10_000, 19_999),
    };
    let random = RandomState::new();
    for attempt in 0..100u32 {
        let port = lo + u16::try_from(random.hash_one(attempt) % u64::from(hi - lo + 1)).expect("in range");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {lo}..={hi} after 100 tries");
}

pub struct Cluster {
    store: String,
    prefix: String,
    pub leader_ttl: Duration,
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
}

impl Cluster {
    /// Starts `n` coordinators on `store` under `prefix`.
    pub fn start(store: &str, prefix: &str, n: usize, leader_ttl: Duration) -> Cluster {
        let mut c = Cluster {
            store: store.to_string(),
            prefix: prefix.to_string(),
            leader_ttl,
            ports: (0..n).map(|_| free_port()).collect(),
            children: (0..n).map(|_| None).collect(),
        };
        for i in 0..n {
            c.spawn(i);
        }
        c
    }

    pub fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i])
    }

    pub fn urls(&self) -> Vec<String> {
        (0..self.ports.len()).map(|i| self.url(i)).collect()
    }

    /// (Re)starts coordinator `i` on its port.
    pub fn spawn(&mut self, i: usize) {
        let ttl = format!("{}ms", self.leader_ttl.as_millis());
        let child = Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{}", self.ports[i])])
            .args(["--store", &self.store, "--store-prefix", &self.prefix])
            .args(["--leader-ttl", &ttl, "--advertise", &self.url(i)])
            .env("LEASEFENCE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn serve");
        self.children[i] = Some(child);
    }

    pub fn pid(&self, i: usize) -> i32 {
        let child = self.children[i].as_ref().expect("running");
        i32::try_from(child.id()).expect("pid")
    }

    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn signal(&self, i: usize, sig: libc::c_int) {
        // SAFETY: signals a child this cluster started.
        assert_eq!(unsafe { libc::kill(self.pid(i), sig) }, 0, "kill({sig})");
    }

    /// Whether coordinator `i` says it is active (asked over `/healthz`).
    pub async fn is_active(&self, i: usize) -> bool {
        if self.children[i].is_none() {
            return false;
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(300))
            .build()
            .expect("client");
        match http.get(format!("{}/healthz", self.url(i))).send().await {
            Ok(r) => r.text().await.unwrap_or_default().starts_with("ok: active"),
            Err(_) => false,
        }
    }

    /// The first coordinator that says it is active.
    pub async fn active(&self) -> Option<usize> {
        for i in 0..self.ports.len() {
            if self.is_active(i).await {
                return Some(i);
            }
        }
        None
    }

    /// Waits until a coordinator other than `not` is active; returns it and how long that took.
    pub async fn await_active(&self, not: Option<usize>, limit: Duration) -> (usize, Duration) {
        let start = Instant::now();
        loop {
            for i in (0..self.ports.len()).filter(|i| Some(*i) != not) {
                if self.is_active(i).await {
                    return (i, start.elapsed());
                }
            }
            assert!(start.elapsed() < limit, "no coordinator became active within {limit:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            if self.children[i].is_some() {
                let _ = unsafe { libc::kill(self.pid(i), libc::SIGCONT) };
            }
            self.kill(i);
        }
    }
}

/// One grant as a client saw it.
#[derive(Clone, Debug)]
pub struct Granted {
    pub resource: String,
    pub token: u64,
    pub ttl: Duration,
    pub sent: Instant,
    pub answered: Instant,
    /// When a release that may have happened was sent (`None`: it surely did not).
    pub release_sent: Option<Instant>,
    pub by: usize,
}

/// Clients acquiring and releasing over every coordinator until stopped.
pub struct Load {
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<Vec<Granted>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

const TTL_MS: u64 = 1500;

impl Load {
    pub fn start(urls: Vec<String>, clients: usize, resources: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let history = Arc::new(Mutex::new(Vec::new()));
        let hint = Arc::new(AtomicUsize::new(0));
        let tasks = (0..clients)
            .map(|k| {
                let (urls, stop, history, hint) = (urls.clone(), stop.clone(), history.clone(), hint.clone());
                tokio::spawn(async move { client(k, urls, resources, stop, history, hint).await })
            })
            .collect();
        Load { stop, history, tasks }
    }

    /// Grants answered so far.
    pub fn granted(&self) -> usize {
        self.history.lock().expect("history").len()
    }

    pub async fn finish(self) -> Vec<Granted> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            let _ = t.await;
        }
        self.history.lock().expect("history").clone()
    }
}

async fn client(
    k: usize,
    urls: Vec<String>,
    resources: usize,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<Vec<Granted>>>,
    hint: Arc<AtomicUsize>,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .expect("client");
    let mut n = k;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let resource = format!("ha/{}", n % resources);
        let at = hint.load(Ordering::SeqCst) % urls.len();
        let sent = Instant::now();
        let body = json!({ "resource": resource, "ttl_ms": TTL_MS, "holder": format!("c{k}") });
        let r = http.post(format!("{}/v1/acquire", urls[at])).json(&body).send().await;
        let Ok(r) = r else {
            hint.store(at + 1, Ordering::SeqCst);
            continue;
        };
        let code = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        let answered = Instant::now();
        match (code, v["token"].as_u64()) {
            (200, Some(token)) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let release_sent = Instant::now();
                let rel = json!({ "resource": resource, "lease_id": v["lease_id"] });
                let done = http.post(format!("{}/v1/release", urls[at])).json(&rel).send().await;
                // A 503 did nothing, unless it says the outcome is unknown;
                // any other answer, or none, may have released it.
                let did_nothing = match done {
                    Ok(r) if r.status().as_u16() == 503 => {
                        let v: Value = r.json().await.unwrap_or(Value::Null);
                        v["error"] != "outcome_unknown"
                    }
                    _ => false,
                };
                let release_sent = (!did_nothing).then_some(release_sent);
                history.lock().expect("history").push(Granted {
                    resource,
                    token,
                    ttl: Duration::from_millis(TTL_MS),
                    sent,
                    answered,
                    release_sent,
                    by: at,
                });
            }
            (503, _) => {
                let leader = v["leader"].as_str().and_then(|l| urls.iter().position(|u| u == l));
                hint.store(leader.unwrap_or(at + 1), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            _ => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
}

/// One acquire of `resource` (TTL 60 s) at `url`: (status, body).
pub async fn acquire(url: &str, resource: &str) -> (u16, Value) {
    let body = json!({ "resource": resource, "ttl_ms": 60_000 });
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/acquire"))
        .json(&body)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("send");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Checks the invariant over a history; panics with the first violation.
pub fn check(history: &[Granted]) {
    let mut by_resource: HashMap<&str, Vec<&Granted>> = HashMap::new();
    for g in history {
        by_resource.entry(&g.resource).or_default().push(g);
    }
    for (r, mut gs) in by_resource {
        gs.sort_by_key(|g| g.token);
        for w in gs.windows(2) {
            assert!(w[0].token < w[1].token, "{r}: token {} answered twice", w[0].token);
        }
        for a in &gs {
            for b in &gs {
                if a.token >= b.token {
                    continue;
                }
                // Real time: a grant answered before another was asked for has the lower token.
                assert!(
                    b.answered >= a.sent,
                    "{r}: token {} was answered before token {} was asked for",
                    b.token,
                    a.token
                );
                // No overlap: b was surely granted while a was valid and not yet released.
                let a_valid_until = a.sent + a.ttl;
                let released_first = a.release_sent.is_some_and(|s| s <= b.answered);
                let overlap = b.sent > a.answered && b.answered < a_valid_until && !released_first;
                assert!(
                    !overlap,
                    "{r}: token {} (by {}) was granted while token {} (by {}) was held",
                    b.token, b.by, a.token, a.by
                );
            }
        }
    }
}
