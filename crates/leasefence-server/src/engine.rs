//! The coordinator's engine: the lease machine, the clock, the store writer and
//! the waiters, behind one lock.
//!
//! Every call takes the lock, reads the clock, runs the pure machine, submits
//! the resulting mutations to the group-commit writer *in order, under the
//! lock*, notes the writer's last sequence number (the call's *barrier*), and
//! releases the lock; only then does it wait for the barrier to be durable and
//! answer. Since the writer applies mutations in sequence order, everything
//! the call saw is on disk by the time it answers — whatever it answers: a
//! grant, a release, a busy refusal naming a holder, a status. Watch events
//! are staged with their sequence number and published by the hub only once
//! the writer's watermark passes it.
//!
//! Expiries are driven by a reaper task that sleeps until the machine's next
//! deadline (a heap in the core, not a scan of all resources). Every call that
//! moves that deadline earlier than the one the reaper sleeps for wakes it.
//!
//! A failed commit is fatal: from then on every call answers a storage error,
//! and [`Engine::store_failed`] resolves so that the server can stop (and its
//! supervisor restart it from what is on disk).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use leasefence_core::{
    AcquireOutcome, AcquireRequest, BusyReason, Config, Coordinator, Effect, Grant, Holder, LeaseError, LeaseId,
    MonoTime, OutsideBounds, ResourceId, ResourceStatus, StoredResource, Token, WaiterId,
};
use leasefence_store::{Committer, Seq, StoreError};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::ApiError;
use crate::leadership::LeaderGate;
use crate::metrics::{self, Op};
use crate::quota::{self, PrincipalLimit, Quota};
use crate::watch::{Filter, Hub, Subscription, WatchError, event_of, publish_durable};

type WaiterReply = oneshot::Sender<Result<Grant, ApiError>>;

struct Inner {
    machine: Coordinator,
    waiters: HashMap<WaiterId, WaiterReply>,
    stopped: bool,
    /// What each principal holds and has waiting, for the limits.
    quota: Quota,
    /// The deadline the reaper sleeps until (`None`: it sleeps without one).
    reaper_at: Option<MonoTime>,
}

/// The shared state of a running coordinator.
pub struct Engine {
    inner: Mutex<Inner>,
    /// Locked after `inner` when both are held, never before.
    hub: Arc<Mutex<Hub>>,
    hub_id: String,
    committer: Committer,
    origin: Instant,
    wait_max: Duration,
    reaper: Notify,
    stopping: tokio::sync::watch::Sender<bool>,
    /// On a shared store: how long this coordinator may still act as leader.
    gate: Option<Arc<LeaderGate>>,
    metrics: metrics::Handles,
}

/// How long a read of `/metrics` waits for the state its size gauges show
/// to be durable (one commit, normally well under a millisecond).
const SIZES_WAIT: Duration = Duration::from_millis(250);

/// A validated acquire, as the edges hand it in.
pub struct Acquire {
    pub resource: ResourceId,
    pub holder: Holder,
    pub ttl: Duration,
    pub wait: Duration,
    /// Zero: none (bounded by the machine's config).
    pub lock_delay: Duration,
}

/// Tells the operator about recovered terms that today's bounds would refuse:
/// they are kept as granted (see [`OutsideBounds`]), so a resource may stay
/// held or closed for longer than the configuration suggests. Counts and
/// lengths only: no names or lease ids.
fn warn_outside_bounds(config: &Config, records: &[StoredResource]) {
    let out = OutsideBounds::of(config, records);
    if out.ttls > 0 {
        tracing::warn!(
            leases = out.ttls,
            longest_ttl_ms = u64::try_from(out.ttl_longest.as_millis()).unwrap_or(u64::MAX),
            "recovered leases whose TTL is outside this coordinator's bounds ({}..={} ms): each keeps \
             the TTL it was granted, on renewals too, until it is released or expires",
            config.ttl_min().as_millis(),
            config.ttl_max().as_millis(),
        );
    }
    if out.lease_lock_delays + out.closed > 0 {
        tracing::warn!(
            held = out.lease_lock_delays,
            closed = out.closed,
            longest_lock_delay_ms = u64::try_from(out.lock_delay_longest.as_millis()).unwrap_or(u64::MAX),
            "recovered lock-delays over this coordinator's maximum ({} ms): held leases keep theirs for \
             when they expire, and closed resources stay closed for the whole delay",
            config.lock_delay_max().as_millis(),
        );
    }
}

impl Engine {
    /// Recovers the machine from `records` (leases held before a restart count
    /// as held for a full TTL from now) and starts the reaper and the task
    /// that publishes watch events as they become durable.
    pub fn start(
        config: Config,
        wait_max: Duration,
        committer: Committer,
        records: Vec<StoredResource>,
    ) -> Arc<Engine> {
        Engine::start_gated(config, wait_max, committer, records, None)
    }

    /// Like [`Engine::start`], for the leader of a shared store: every call is
    /// refused once `gate` says the leadership is no longer confirmed.
    pub fn start_gated(
        config: Config,
        wait_max: Duration,
        committer: Committer,
        records: Vec<StoredResource>,
        gate: Option<Arc<LeaderGate>>,
    ) -> Arc<Engine> {
        warn_outside_bounds(&config, &records);
        let quota = Quota::recover(&records);
        let machine = Coordinator::recover(config, MonoTime::ZERO, records);
        let hub_id = coordinator_id();
        let hub = Arc::new(Mutex::new(Hub::new(hub_id.clone())));
        tokio::spawn(publish_durable(hub.clone(), committer.watermark()));
        let engine = Arc::new(Engine {
            inner: Mutex::new(Inner {
                machine,
                waiters: HashMap::new(),
                stopped: false,
                quota,
                reaper_at: None,
            }),
            hub,
            hub_id,
            committer,
            origin: Instant::now(),
            wait_max,
            reaper: Notify::new(),
            stopping: tokio::sync::watch::channel(false).0,
            gate,
            metrics: metrics::Handles::new(),
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

    /// `Ok` while the engine answers calls; the storage error once a commit failed.
    pub fn health(&self) -> Result<(), ApiError> {
        if let Some(e) = self.committer.failure() {
            return Err(ApiError::from_store(e));
        }
        match &self.gate {
            Some(gate) => gate.check(),
            None => Ok(()),
        }
    }

    /// Resolves with the error once a commit has failed (never, otherwise).
    pub fn store_failed(&self) -> impl std::future::Future<Output = StoreError> + Send + 'static {
        let failed = self.committer.failed();
        async move {
            match failed.await {
                Some(e) => e,
                // The writer is gone without failing: the engine was dropped.
                None => std::future::pending().await,
            }
        }
    }

    /// Stops accepting calls, answers queued acquires with "shutting down",
    /// ends watch and keep-alive streams, and wakes the reaper so it exits.
    pub fn stop(&self) {
        self.stop_with(&ApiError::ShuttingDown);
    }

    /// Like [`Engine::stop`], answering queued acquires with `why` (a deposed
    /// leader tells them it is no longer the leader).
    pub fn stop_with(&self, why: &ApiError) {
        let waiters: Vec<WaiterReply> = {
            let mut inner = self.lock();
            inner.stopped = true;
            inner.quota.clear_waiting();
            inner.waiters.drain().map(|(_, reply)| reply).collect()
        };
        for reply in waiters {
            let _ = reply.send(Err(why.clone()));
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

    /// Subscribes to durable transitions: the backlog after `after`, then live
    /// events. Takes only the hub's lock, never the engine's.
    pub fn watch(&self, filter: &Filter, after: Option<u64>, coordinator_id: &str) -> Result<Subscription, WatchError> {
        if let Err(e) = self.health() {
            return Err(WatchError::Unavailable(e.to_string()));
        }
        let (backlog, live) = lock(&self.hub).subscribe(filter, after, coordinator_id)?;
        Ok(Subscription {
            coordinator_id: self.hub_id.clone(),
            backlog,
            live,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Refuses calls once stopping or after a failed commit.
    fn live(&self, inner: &Inner) -> Result<(), ApiError> {
        if inner.stopped {
            return Err(ApiError::ShuttingDown);
        }
        self.health()
    }

    pub async fn acquire(self: &Arc<Self>, req: Acquire) -> Result<Grant, ApiError> {
        self.acquire_limited(req, None).await
    }

    /// Like [`Engine::acquire`], refused when the principal of `limit`
    /// already holds its most leases, or would wait while it has its most
    /// acquires waiting.
    pub async fn acquire_limited(
        self: &Arc<Self>,
        req: Acquire,
        limit: Option<PrincipalLimit>,
    ) -> Result<Grant, ApiError> {
        let started = std::time::Instant::now();
        let answer = self.acquire_timed(req, limit).await;
        self.metrics.latency(Op::Acquire, answer.is_ok(), started.elapsed());
        answer
    }

    async fn acquire_timed(self: &Arc<Self>, req: Acquire, limit: Option<PrincipalLimit>) -> Result<Grant, ApiError> {
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
        let (outcome, barrier, waiter_rx) = {
            let mut inner = self.lock();
            self.live(&inner)?;
            // A request wrong in itself is refused as such before any limit:
            // waiting under the limit would not make it right.
            let config = inner.machine.config();
            config.check_ttl(req.ttl).map_err(LeaseError::Invalid)?;
            config.check_lock_delay(req.lock_delay).map_err(LeaseError::Invalid)?;
            // Expiries due are settled first, so that the counts are current.
            let refused = limit.as_ref().and_then(|l| {
                let now = self.now();
                inner.machine.advance(now);
                self.dispatch(&mut inner);
                quota::over_limit(&inner.quota, &inner.machine, now, &req.resource, !req.wait.is_zero(), l)
            });
            let mut waiter_rx = None;
            let outcome = match refused {
                Some(e) => Err(e),
                None => {
                    let machine_req = AcquireRequest {
                        resource: req.resource,
                        holder: req.holder,
                        ttl: req.ttl,
                        lease_id,
                        wait: !req.wait.is_zero(),
                        lock_delay: req.lock_delay,
                    };
                    inner.machine.acquire(self.now(), machine_req).map_err(ApiError::from)
                }
            };
            if let Ok(AcquireOutcome::Queued(id)) = &outcome {
                let (tx, rx) = oneshot::channel();
                inner.waiters.insert(*id, tx);
                if let Some(l) = &limit {
                    inner.quota.queued(*id, l.principal.clone());
                }
                waiter_rx = Some(rx);
            }
            (outcome, self.settle(&mut inner), waiter_rx)
        };
        // A grant, and equally a busy answer naming a holder, waits for the disk.
        self.durable(barrier).await?;
        match (outcome?, waiter_rx) {
            (AcquireOutcome::Granted(grant), _) => Ok(grant),
            (AcquireOutcome::Queued(id), Some(rx)) => self.wait_for_grant(resource, id, req.wait, rx).await,
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
                    let now = self.now();
                    inner.machine.advance(now);
                    let busy = inner.machine.cancel_waiter(&resource, id).then(|| {
                        inner.waiters.remove(&id);
                        inner.quota.unqueued(id);
                        busy_error(&inner.machine, now, &resource)
                    });
                    busy.map(|busy| (busy, self.settle(&mut inner)))
                };
                if let Some((busy, barrier)) = busy {
                    guard.armed = false;
                    self.durable(barrier).await?;
                    return Err(busy);
                }
                // Granted at the last moment: its answer is on its way.
                rx.await
            }
        };
        guard.armed = false;
        answer.unwrap_or(Err(ApiError::ShuttingDown))
    }

    /// Extends a lease. Renewals are not persisted; a refusal (the lease was
    /// lost) waits for what the call persisted, such as that lease's expiry.
    pub async fn renew(self: &Arc<Self>, resource: &ResourceId, lease_id: &LeaseId) -> Result<Grant, ApiError> {
        self.renew_as(resource, lease_id, None).await
    }

    /// Like [`Engine::renew`]; with `owner`, the lease of `lease_id` must be
    /// that principal's (else [`AuthError::NotOwner`]).
    pub async fn renew_as(
        self: &Arc<Self>,
        resource: &ResourceId,
        lease_id: &LeaseId,
        owner: Option<&str>,
    ) -> Result<Grant, ApiError> {
        let started = std::time::Instant::now();
        let answer = self.renew_timed(resource, lease_id, owner).await;
        self.metrics.latency(Op::Renew, answer.is_ok(), started.elapsed());
        answer
    }

    async fn renew_timed(
        self: &Arc<Self>,
        resource: &ResourceId,
        lease_id: &LeaseId,
        owner: Option<&str>,
    ) -> Result<Grant, ApiError> {
        let (result, barrier) = {
            let mut inner = self.lock();
            self.live(&inner)?;
            let now = self.now();
            let result = match quota::not_owner(&mut inner.machine, now, resource, lease_id, owner) {
                Some(e) => Err(e),
                None => inner.machine.renew(now, resource, lease_id).map_err(ApiError::from),
            };
            (result, self.settle(&mut inner))
        };
        match result {
            Ok(grant) => {
                self.metrics.renewal();
                Ok(grant)
            }
            Err(e) => {
                self.durable(barrier).await?;
                Err(e)
            }
        }
    }

    pub async fn release(self: &Arc<Self>, resource: &ResourceId, lease_id: &LeaseId) -> Result<Token, ApiError> {
        self.release_as(resource, lease_id, None).await
    }

    /// Like [`Engine::release`]; with `owner`, as [`Engine::renew_as`].
    pub async fn release_as(
        self: &Arc<Self>,
        resource: &ResourceId,
        lease_id: &LeaseId,
        owner: Option<&str>,
    ) -> Result<Token, ApiError> {
        let started = std::time::Instant::now();
        let answer = self.release_timed(resource, lease_id, owner).await;
        self.metrics.latency(Op::Release, answer.is_ok(), started.elapsed());
        answer
    }

    async fn release_timed(
        self: &Arc<Self>,
        resource: &ResourceId,
        lease_id: &LeaseId,
        owner: Option<&str>,
    ) -> Result<Token, ApiError> {
        let (result, barrier) = {
            let mut inner = self.lock();
            self.live(&inner)?;
            let now = self.now();
            let result = match quota::not_owner(&mut inner.machine, now, resource, lease_id, owner) {
                Some(e) => Err(e),
                None => inner.machine.release(now, resource, lease_id).map_err(ApiError::from),
            };
            (result, self.settle(&mut inner))
        };
        // Also when the release handed the resource to a waiter at once.
        self.durable(barrier).await?;
        result
    }

    /// Ends whatever lease `resource` has, durably, as its holder's release
    /// would (waiters are woken; the next grant's token is higher). The
    /// ended token, or `None` if nothing was held.
    pub async fn force_release(self: &Arc<Self>, resource: &ResourceId) -> Result<Option<Token>, ApiError> {
        let (token, barrier) = {
            let mut inner = self.lock();
            self.live(&inner)?;
            let token = inner.machine.force_release(self.now(), resource);
            (token, self.settle(&mut inner))
        };
        self.durable(barrier).await?;
        Ok(token)
    }

    /// The resource as it is on disk now: expiries due are persisted first,
    /// and the answer waits until everything it reflects is durable.
    pub async fn status(self: &Arc<Self>, resource: &ResourceId) -> Result<ResourceStatus, ApiError> {
        let (status, barrier) = {
            let mut inner = self.lock();
            self.live(&inner)?;
            let now = self.now();
            inner.machine.advance(now);
            let status = inner.machine.status(now, resource);
            (status, self.settle(&mut inner))
        };
        self.durable(barrier).await?;
        Ok(status)
    }

    /// Expires what is due now and arms the reaper for the next deadline.
    fn reap_due(self: &Arc<Self>) -> Option<MonoTime> {
        let mut inner = self.lock();
        inner.machine.advance(self.now());
        self.dispatch(&mut inner);
        let next = inner.machine.next_deadline();
        inner.reaper_at = next;
        next
    }

    /// Ends a call under the lock: executes its effects, wakes the reaper if
    /// the next deadline moved earlier than the one it sleeps for, and returns
    /// the barrier the call must see durable before it answers.
    fn settle(self: &Arc<Self>, inner: &mut Inner) -> Seq {
        self.dispatch(inner);
        let next = inner.machine.next_deadline();
        let earlier = match (next, inner.reaper_at) {
            (Some(next), Some(armed)) => next < armed,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if earlier {
            inner.reaper_at = next;
            self.reaper.notify_one();
        }
        self.committer.last_submitted()
    }

    /// Executes the machine's effects in order, under the lock.
    fn dispatch(self: &Arc<Self>, inner: &mut Inner) {
        for effect in inner.machine.take_effects() {
            match effect {
                Effect::Persist(m) => {
                    inner.quota.mutation(&m);
                    let (resource, kind, token, holder) = event_of(&m);
                    let seq = self.committer.submit(m);
                    lock(&self.hub).stage(seq, resource, kind, token, holder);
                }
                Effect::WakeWaiter { waiter, grant } => {
                    inner.quota.unqueued(waiter);
                    let reply = inner.waiters.remove(&waiter);
                    self.wake(reply, grant, self.committer.last_submitted());
                }
                Effect::RejectWaiter { waiter, error } => {
                    inner.quota.unqueued(waiter);
                    if let Some(reply) = inner.waiters.remove(&waiter) {
                        let _ = reply.send(Err(error.into()));
                    }
                }
            }
        }
    }

    /// Sets the size gauges to the machine's state as of now, once every
    /// mutation behind that state is durable; if that takes longer than
    /// [`SIZES_WAIT`] (a stuck disk) or fails, they keep their last values,
    /// which were durable. Called when `/metrics` is read, so that no call
    /// pays for gauges nobody reads.
    pub(crate) async fn record_sizes(&self) {
        let (sizes, barrier) = {
            let inner = self.lock();
            let sizes = metrics::Sizes {
                held: inner.machine.held_count(),
                resources: inner.machine.resource_count(),
                waiters: inner.waiters.len(),
                expiry_queue: inner.machine.deadline_count(),
            };
            (sizes, self.committer.last_submitted())
        };
        if let Ok(Ok(())) = tokio::time::timeout(SIZES_WAIT, self.committer.durable(barrier)).await {
            metrics::sizes(&sizes);
        }
    }

    /// Answers a waiter once its grant (sequence number `seq`) is durable. If
    /// the waiter is gone, the lease is released at once rather than left to expire.
    fn wake(self: &Arc<Self>, reply: Option<WaiterReply>, grant: Grant, seq: Seq) {
        let engine = self.clone();
        tokio::spawn(async move {
            let result = engine.durable(seq).await.map(|()| grant.clone());
            let delivered = match reply {
                Some(reply) => reply.send(result).is_ok(),
                None => false,
            };
            if !delivered {
                let _ = engine.release(&grant.resource, &grant.lease_id).await;
            }
        });
    }

    /// Waits until everything up to `seq` is durable.
    async fn durable(&self, seq: Seq) -> Result<(), ApiError> {
        self.committer.durable(seq).await.map_err(|e| {
            metrics::store_failure();
            ApiError::from_store(e)
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a lock would be a bug in the core's assertions;
    // the state it guards is still the last consistent one.
    m.lock().unwrap_or_else(|e| e.into_inner())
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
            inner.quota.unqueued(self.id);
        }
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

#[path = "engine_listing.rs"]
mod listing;

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
