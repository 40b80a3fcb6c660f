//! The failover trials' clients: tasks that acquire and release over the
//! coordinators' HTTP edge, each starting at a different coordinator and
//! following the not-leader hints (or moving on to the next coordinator when
//! one does not answer), recording every grant they are answered. Also the
//! requests sent on purpose to a stopped leader, to be in flight when it
//! wakes up.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::failover_check::Grant;
use crate::failover_http::{Answer, Http};

/// What the clients ask for.
#[derive(Clone)]
pub struct LoadSpec {
    pub urls: Vec<String>,
    pub clients: usize,
    pub resources: Vec<String>,
    /// The leases' TTL: short, since leases held at a fault are honoured for
    /// a full TTL after the takeover.
    pub lease_ttl: Duration,
    /// How long an acquire may queue on a busy resource.
    pub wait: Duration,
    /// Per request; a stopped coordinator holds a request this long.
    pub request_limit: Duration,
}

#[derive(Default)]
struct Shared {
    history: Mutex<Vec<Grant>>,
    hints: AtomicU64,
}

impl Shared {
    fn push(&self, g: Grant) {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).push(g);
    }

    fn history(&self) -> Vec<Grant> {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The answers a stopped leader gave the requests in flight when it woke.
#[derive(Clone, Debug, Default)]
pub struct InFlight {
    pub granted: u64,
    pub not_leader: u64,
    pub unavailable: u64,
    /// Other refusals, by HTTP status.
    pub other: std::collections::BTreeMap<u16, u64>,
    pub unanswered: u64,
}

impl InFlight {
    pub fn add(&mut self, o: InFlight) {
        self.granted += o.granted;
        self.not_leader += o.not_leader;
        self.unavailable += o.unavailable;
        for (code, n) in o.other {
            *self.other.entry(code).or_default() += n;
        }
        self.unanswered += o.unanswered;
    }
}

pub struct Load {
    spec: LoadSpec,
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
    tasks: tokio::task::JoinSet<()>,
}

impl Load {
    pub fn start(spec: LoadSpec) -> anyhow::Result<Load> {
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared::default());
        let http = Http::new(spec.request_limit)?;
        let mut tasks = tokio::task::JoinSet::new();
        for k in 0..spec.clients {
            let (spec, stop, shared, http) = (spec.clone(), stop.clone(), shared.clone(), http.clone());
            tasks.spawn(async move { client(k, spec, stop, shared, http).await });
        }
        Ok(Load {
            spec,
            stop,
            shared,
            tasks,
        })
    }

    /// Every grant answered so far.
    pub fn history(&self) -> Vec<Grant> {
        self.shared.history()
    }

    /// Waits until coordinator `by` has answered a grant sent after `since`.
    pub async fn await_grant(&self, by: usize, since: Instant, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            if self.answered_by(by, since) > 0 {
                return Ok(());
            }
            if start.elapsed() > limit {
                bail!("coordinator {by} answered no grant within {limit:?} of taking over");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Grants coordinator `by` answered to acquires sent after `since`.
    pub fn answered_by(&self, by: usize, since: Instant) -> u64 {
        let h = self.shared.history.lock().unwrap_or_else(|p| p.into_inner());
        h.iter().filter(|g| g.by == by && g.sent >= since).count() as u64
    }

    /// Sends `n` acquires to coordinator `by` (stopped: they wait in its
    /// socket queue), each allowed `limit`; grants among the answers go into
    /// the history like any other.
    pub fn in_flight(&self, by: usize, n: usize, limit: Duration) -> anyhow::Result<tokio::task::JoinHandle<InFlight>> {
        let http = Http::new(limit)?;
        let (spec, shared) = (self.spec.clone(), self.shared.clone());
        Ok(tokio::spawn(async move {
            let mut set = tokio::task::JoinSet::new();
            for j in 0..n {
                let (spec, shared, http) = (spec.clone(), shared.clone(), http.clone());
                set.spawn(async move {
                    let resource = &spec.resources[j % spec.resources.len()];
                    let url = &spec.urls[by];
                    let sent = Instant::now();
                    let answer = http.acquire(url, resource, spec.lease_ttl, spec.wait).await;
                    let mut o = InFlight::default();
                    match answer {
                        Answer::Granted { token, lease_id } => {
                            o.granted = 1;
                            shared.push(Grant {
                                resource: resource.clone(),
                                token,
                                sent,
                                answered: Instant::now(),
                                by,
                            });
                            http.release(url, resource, &lease_id).await;
                        }
                        Answer::NotLeader { .. } => o.not_leader = 1,
                        Answer::Unavailable => o.unavailable = 1,
                        Answer::Refused(code) => {
                            o.other.insert(code, 1);
                        }
                        Answer::Unanswered => o.unanswered = 1,
                    }
                    o
                });
            }
            let mut total = InFlight::default();
            while let Some(done) = set.join_next().await {
                total.add(done.unwrap_or_default());
            }
            total
        }))
    }

    /// Stops the clients (each finishes its request, bounded by the request
    /// limit); returns the history and how many not-leader hints they followed.
    pub async fn finish(&mut self) -> (Vec<Grant>, u64) {
        self.stop.store(true, Ordering::SeqCst);
        let limit = self.spec.request_limit * 2 + Duration::from_secs(1);
        let joined = tokio::time::timeout(limit, async { while self.tasks.join_next().await.is_some() {} }).await;
        if joined.is_err() {
            self.tasks.abort_all();
        }
        (self.shared.history(), self.shared.hints.load(Ordering::SeqCst))
    }
}

/// One client: acquire → release, round the resources, until stopped.
async fn client(k: usize, spec: LoadSpec, stop: Arc<AtomicBool>, shared: Arc<Shared>, http: Http) {
    let n = spec.urls.len();
    let mut at = k % n;
    let mut i = k;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let resource = &spec.resources[i % spec.resources.len()];
        let sent = Instant::now();
        match http.acquire(&spec.urls[at], resource, spec.lease_ttl, spec.wait).await {
            Answer::Granted { token, lease_id } => {
                shared.push(Grant {
                    resource: resource.clone(),
                    token,
                    sent,
                    answered: Instant::now(),
                    by: at,
                });
                http.release(&spec.urls[at], resource, &lease_id).await;
            }
            Answer::NotLeader { leader } => {
                shared.hints.fetch_add(1, Ordering::Relaxed);
                at = leader
                    .and_then(|l| spec.urls.iter().position(|u| *u == l))
                    .unwrap_or((at + 1) % n);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Answer::Unavailable | Answer::Unanswered => {
                at = (at + 1) % n;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Answer::Refused(_) => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
}
