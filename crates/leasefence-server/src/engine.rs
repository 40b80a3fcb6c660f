//! The coordinator's engine: the lease machine, the clock, the store writer and
//! the waiters, behind one lock.
//!
//! Every call takes the lock, reads the clock, runs the pure machine, submits
//! the resulting mutations to the group-commit writer *in order, under the
//! lock*, and releases the lock; only then does it wait for durability and
//! answer. Since the writer applies mutations in submission order, waiting for
//! the last mutation a call submitted means everything before it is durable
//! too: an answered grant is always on disk.
//!
//! Expiries are driven by a reaper task that sleeps until the machine's next
//! deadline (a heap in the core, not a scan of all resources).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use leasefence_core::{
    AcquireOutcome, AcquireRequest, BusyReason, Config, Coordinator, Effect, Grant, Holder, LeaseError, LeaseId,
    MonoTime, Mutation, ReleaseCause, ResourceId, ResourceStatus, StoredResource, Token, WaiterId,
};
use leasefence_store::{Committer, StoreError};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::watch::{Event, EventKind, Filter, Hub, WatchError};
use crate::{ApiError, metrics};

type Receipt = oneshot::Receiver<Result<(), StoreError>>;
type WaiterReply = oneshot::Sender<Result<Grant, ApiError>>;

struct Inner {
    machine: Coordinator,
    waiters: HashMap<WaiterId, WaiterReply>,
    hub: Hub,
    stopped: bool,
}

/// The shared state of a running coordinator.
pub struct Engine {
    inner: Mutex<Inner>,
    committer: Committer,
    origin: Instant,
    wait_max: Duration,
    reaper: Notify,
    stopping: tokio::sync::watch::Sender<bool>,
}

/// A validated acquire, as the edges hand it in.
pub struct Acquire {
    pub resource: ResourceId,
    pub holder: Holder,
    pub ttl: Duration,
    pub wait: Duration,
    /// Zero: none (bounded by the machine's config).
    pub lock_delay: Duration,
}

impl Engine {
    /// Recovers the machine from `records` (leases held before a restart count
    /// as held for a full TTL from now) and starts the reaper.
    pub fn start(
        config: Config,
        wait_max: Duration,
        committer: Committer,
        records: Vec<StoredResource>,
    ) -> Arc<Engine> {
        let machine = Coordinator::recover(config, MonoTime::ZERO, records);
        let hub = Hub::new(coordinator_id());
        let engine = Arc::new(Engine {
            inner: Mutex::new(Inner {
                machine,
                waiters: HashMap::new(),
                hub,
                stopped: false,
            }),
            committer,
            origin: Instant::now(),
            wait_max,
            reaper: Notify::new(),
            stopping: tokio::sync::watch::channel(false).0,
        });
        tokio::spawn(reap(Arc::downgrade(&engine)));
        engine
    }

    /// The monotonic clock, in milliseconds since this engine started.
    pub fn now(&self) -> MonoTime {
        MonoTime::from_millis(u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    pub fn wait_max(&self) -> Duration {
        self.wait_max
    }

    pub fn config(&self) -> Config {
        self.lock().machine.config().clone()
    }

    /// Stops accepting calls, answers queued acquires with "shutting down",
    /// ends watch and keep-alive streams, and wakes the reaper so it exits.
    pub fn stop(&self) {
        let waiters: Vec<WaiterReply> = {
            let mut inner = self.lock();
            inner.stopped = true;
            inner.waiters.drain().map(|(_, reply)| reply).collect()
        };
        for reply in waiters {
            let _ = reply.send(Err(ApiError::ShuttingDown));
        }
        self.stopping.send_replace(true);
        self.reaper.notify_one();
    }

    /// Resolves once [`Engine::stop`] has been called; for long-lived streams.
    pub fn stopping(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.stopping.subscribe();
        async move {
            let _ = rx.wait_for(|stopped| *stopped).await;
        }
    }

    /// Subscribes to transitions: the backlog after `after`, then live events.
    pub fn watch(&self, filter: &Filter, after: Option<u64>, coordinator_id: &str) -> Result<Subscription, WatchError> {
        let inner = self.lock();
        let (backlog, live) = inner.hub.subscribe(filter, after, coordinator_id)?;
        Ok(Subscription {
            coordinator_id: inner.hub.id().to_string(),
            backlog,
            live,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock would be a bug in the core's
        // assertions; the state it guards is still the last consistent one.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub async fn acquire(self: &Arc<Self>, req: Acquire) -> Result<Grant, ApiError> {
        if req.wait > self.wait_max {
            let msg = format!(
                "must be at most {} ms, got {} ms",
                self.wait_max.as_millis(),
                req.wait.as_millis()
            );
            return Err(LeaseError::Invalid(leasefence_core::Invalid::new("wait_ms", msg)).into());
        }
        let lease_id = fresh_lease_id()?;
        let resource = req.resource.clone();
        let (outcome, receipt, waiter_rx) = {
            let mut inner = self.lock();
            if inner.stopped {
                return Err(ApiError::ShuttingDown);
            }
            let now = self.now();
            let before = inner.machine.next_deadline();
            let machine_req = AcquireRequest {
                resource: req.resource,
                holder: req.holder,
                ttl: req.ttl,
                lease_id,
                wait: !req.wait.is_zero(),
                lock_delay: req.lock_delay,
            };
            let outcome = inner.machine.acquire(now, machine_req);
            let receipt = self.dispatch(&mut inner);
            let mut waiter_rx = None;
            if let Ok(AcquireOutcome::Queued(id)) = &outcome {
                let (tx, rx) = oneshot::channel();
                inner.waiters.insert(*id, tx);
                waiter_rx = Some(rx);
            }
            if inner.machine.next_deadline() != before {
                self.reaper.notify_one();
            }
            (outcome, receipt, waiter_rx)
        };
        match (outcome?, waiter_rx) {
            (AcquireOutcome::Granted(grant), _) => {
                durable(receipt).await?;
                Ok(grant)
            }
            (AcquireOutcome::Queued(id), Some(rx)) => {
                durable(receipt).await?;
                self.wait_for_grant(resource, id, req.wait, rx).await
            }
            (AcquireOutcome::Queued(_), None) => Err(ApiError::ShuttingDown),
        }
    }

    async fn wait_for_grant(
        self: &Arc<Self>,
        resource: ResourceId,
        id: WaiterId,
        wait: Duration,
        mut rx: oneshot::Receiver<Result<Grant, ApiError>>,
    ) -> Result<Grant, ApiError> {
        // If the caller goes away while queued, the guard takes it out of the queue.
        let mut guard = WaitGuard {
            engine: self.clone(),
            resource: resource.clone(),
            id,
            armed: true,
        };
        let answer = match tokio::time::timeout(wait, &mut rx).await {
            Ok(answer) => answer,
            Err(_elapsed) => {
                let busy = {
                    let mut inner = self.lock();
                    // Settle expiries first: a lease that ended just now goes to its waiter.
                    inner.machine.advance(self.now());
                    drop(self.dispatch(&mut inner));
                    if inner.machine.cancel_waiter(&resource, id) {
                        inner.waiters.remove(&id);
                        Some(busy_error(&inner.machine, self.now(), &resource))
                    } else {
                        None
                    }
                };
                if let Some(busy) = busy {
                    guard.armed = false;
                    return Err(busy);
                }
                // Granted at the last moment: its answer is on its way.
                rx.await
            }
        };
        guard.armed = false;
        answer.unwrap_or(Err(ApiError::ShuttingDown))
    }

    pub fn renew(self: &Arc<Self>, resource: &ResourceId, lease_id: &LeaseId) -> Result<Grant, ApiError> {
        let mut inner = self.lock();
        if inner.stopped {
            return Err(ApiError::ShuttingDown);
        }
        let now = self.now();
        let result = inner.machine.renew(now, resource, lease_id);
        // Renewals are not persisted, but advancing time may have expired others.
        drop(self.dispatch(&mut inner));
        if result.is_ok() {
            metrics::renewal();
        }
        Ok(result?)
    }

    pub async fn release(self: &Arc<Self>, resource: &ResourceId, lease_id: &LeaseId) -> Result<Token, ApiError> {
        let (result, receipt) = {
            let mut inner = self.lock();
            if inner.stopped {
                return Err(ApiError::ShuttingDown);
            }
            let now = self.now();
            let result = inner.machine.release(now, resource, lease_id);
            (result, self.dispatch(&mut inner))
        };
        let token = result?;
        durable(receipt).await?;
        Ok(token)
    }

    pub fn status(&self, resource: &ResourceId) -> ResourceStatus {
        self.lock().machine.status(self.now(), resource)
    }

    /// Expires what is due now. Returns the next deadline.
    fn reap_due(self: &Arc<Self>) -> Option<MonoTime> {
        let mut inner = self.lock();
        let now = self.now();
        inner.machine.advance(now);
        drop(self.dispatch(&mut inner));
        inner.machine.next_deadline()
    }

    /// Executes the machine's effects in order, under the lock. Returns the
    /// receipt of the last mutation not handed to a woken waiter: the caller's
    /// own mutation or a later one.
    fn dispatch(self: &Arc<Self>, inner: &mut Inner) -> Option<Receipt> {
        let mut last: Option<Receipt> = None;
        for effect in inner.machine.take_effects() {
            match effect {
                Effect::Persist(m) => {
                    publish(&mut inner.hub, &m);
                    metrics::mutation(&m);
                    last = Some(self.committer.submit(m));
                }
                Effect::WakeWaiter { waiter, grant } => {
                    let reply = inner.waiters.remove(&waiter);
                    self.wake(reply, grant, last.take());
                }
                Effect::RejectWaiter { waiter, error } => {
                    if let Some(reply) = inner.waiters.remove(&waiter) {
                        let _ = reply.send(Err(error.into()));
                    }
                }
            }
        }
        let held = inner.machine.held_count();
        let queue = inner.machine.deadline_count();
        metrics::sizes(held, inner.machine.resource_count(), inner.waiters.len(), queue);
        last
    }

    /// Answers a waiter once its grant is durable. If the waiter is gone, the
    /// lease is released at once rather than left to expire.
    fn wake(self: &Arc<Self>, reply: Option<WaiterReply>, grant: Grant, receipt: Option<Receipt>) {
        let engine = self.clone();
        tokio::spawn(async move {
            let result = durable(receipt).await.map(|()| grant.clone());
            let delivered = match reply {
                Some(reply) => reply.send(result).is_ok(),
                None => false,
            };
            if !delivered {
                let _ = engine.release(&grant.resource, &grant.lease_id).await;
            }
        });
    }
}

/// A watcher's start: what it missed, then the live feed.
pub struct Subscription {
    pub coordinator_id: String,
    pub backlog: Vec<Arc<Event>>,
    pub live: tokio::sync::broadcast::Receiver<Arc<Event>>,
}

fn publish(hub: &mut Hub, m: &Mutation) {
    match m {
        Mutation::Grant {
            resource,
            token,
            holder,
            ..
        } => {
            hub.publish(resource.clone(), EventKind::Granted, *token, Some(holder.clone()));
        }
        Mutation::Release {
            resource, token, cause, ..
        } => {
            let kind = match cause {
                ReleaseCause::Released => EventKind::Released,
                ReleaseCause::Expired => EventKind::Expired,
            };
            hub.publish(resource.clone(), kind, *token, None);
        }
    }
}

/// A random id for this process's watch history.
fn coordinator_id() -> String {
    let mut bytes = [0u8; 8];
    // Without randomness, fall back to the process id: ids only need to differ across restarts.
    if getrandom::fill(&mut bytes).is_err() {
        bytes = u64::from(std::process::id()).to_be_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Takes a queued acquire out of the queue if its caller goes away.
struct WaitGuard {
    engine: Arc<Engine>,
    resource: ResourceId,
    id: WaiterId,
    armed: bool,
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if self.armed {
            let mut inner = self.engine.lock();
            inner.machine.cancel_waiter(&self.resource, self.id);
            inner.waiters.remove(&self.id);
        }
    }
}

async fn durable(receipt: Option<Receipt>) -> Result<(), ApiError> {
    match receipt {
        None => Ok(()),
        Some(rx) => match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                metrics::store_failure();
                Err(e.into())
            }
            Err(_) => {
                metrics::store_failure();
                Err(StoreError::Closed.into())
            }
        },
    }
}

/// The busy answer for a waiter whose wait ran out: held, or in a lock-delay.
fn busy_error(machine: &Coordinator, now: MonoTime, resource: &ResourceId) -> ApiError {
    match machine.busy(now, resource) {
        Some(busy) => busy.into(),
        // Unreachable while the core keeps "queued implies held or in a
        // lock-delay"; answer busy with what is known rather than panic.
        None => LeaseError::Busy {
            resource: resource.clone(),
            holder: Holder::new("unknown").unwrap_or_else(|_| unreachable!("valid literal")),
            token: machine.status(now, resource).last_token.unwrap_or(Token::FIRST),
            expires_in: Duration::ZERO,
            reason: BusyReason::Held,
        }
        .into(),
    }
}

/// A fresh 128-bit lease id from the operating system's CSPRNG.
fn fresh_lease_id() -> Result<LeaseId, ApiError> {
    let mut bytes = [0u8; LeaseId::LEN];
    getrandom::fill(&mut bytes).map_err(|e| StoreError::Io(format!("no randomness for a lease id: {e}")))?;
    Ok(LeaseId::from_bytes(bytes))
}

/// Sleeps until the next deadline (or until woken by an earlier one), then expires what is due.
async fn reap(engine: std::sync::Weak<Engine>) {
    loop {
        let Some(e) = engine.upgrade() else { return };
        if e.lock().stopped {
            return;
        }
        let next = e.reap_due();
        let sleep = match next {
            Some(t) => tokio::time::sleep_until(e.origin + Duration::from_millis(t.as_millis())),
            None => tokio::time::sleep(Duration::from_secs(3600)),
        };
        tokio::select! {
            () = sleep => {}
            () = e.reaper.notified() => {}
        }
    }
}
