//! Self-fencing lease sessions: [`Client::lease`] acquires a lease and keeps it
//! alive in the background; [`Lease::lost`] fires when it can no longer be
//! proven held; [`Client::with_lease`] runs work and cancels it on loss.

use std::future::Future;
use std::time::Duration;

use leasefence_core::{Fence, Holder, Invalid, LeaseId, ResourceId, Token};
use tokio::task::JoinHandle;

use crate::clock::Stamp;
use crate::deadline::{check_margin, deadline, default_margin, renew_interval};
use crate::keepalive::KeepAlive;
use crate::watch::{LeaseWatch, Loss, Shared, State, StateTx, set_lost};
use crate::{Client, ClientError, LeaseInfo};

/// How to acquire and keep a lease. `From<Duration>` gives the defaults for a TTL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    ttl: Duration,
    wait: Duration,
    holder: Option<Holder>,
    margin: Option<Duration>,
    lock_delay: Duration,
}

impl LeaseConfig {
    /// A lease of `ttl`, failing at once if busy, anonymous, default margin.
    pub fn new(ttl: Duration) -> LeaseConfig {
        LeaseConfig {
            ttl,
            wait: Duration::ZERO,
            holder: None,
            margin: None,
            lock_delay: Duration::ZERO,
        }
    }

    /// Wait up to `wait` (FIFO) for a busy resource.
    pub fn with_wait(mut self, wait: Duration) -> LeaseConfig {
        self.wait = wait;
        self
    }

    /// The holder name others see.
    pub fn with_holder(mut self, holder: Holder) -> LeaseConfig {
        self.holder = Some(holder);
        self
    }

    /// The safety margin taken off each deadline (default
    /// [`crate::default_margin`]: `max(ttl/10, 50 ms)`, at most `ttl/2`).
    /// At least [`crate::MARGIN_MIN`] (1 ms) and less than the TTL, else
    /// [`LeaseConfig::margin`] and [`Client::lease`] refuse it
    /// ([`ClientError::Invalid`], field `margin`).
    pub fn with_margin(mut self, margin: Duration) -> LeaseConfig {
        self.margin = Some(margin);
        self
    }

    /// If the lease expires (is not released: this process died, hung or
    /// lost the coordinator), the coordinator grants the resource to nobody for
    /// `delay` afterwards: for resources that cannot check fencing tokens. At
    /// most the coordinator's `--lock-delay-max` (default 60 s).
    pub fn with_lock_delay(mut self, delay: Duration) -> LeaseConfig {
        self.lock_delay = delay;
        self
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn holder(&self) -> Option<&Holder> {
        self.holder.as_ref()
    }

    /// The lock-delay asked for (zero: none).
    pub fn lock_delay(&self) -> Duration {
        self.lock_delay
    }

    /// How long one acquire waits for a busy resource (zero: not at all).
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// The margin in effect; refused if below [`crate::MARGIN_MIN`] or if it
    /// leaves no part of the TTL usable.
    pub fn margin(&self) -> Result<Duration, Invalid> {
        check_margin(self.ttl, self.margin.unwrap_or_else(|| default_margin(self.ttl)))
    }
}

impl From<Duration> for LeaseConfig {
    fn from(ttl: Duration) -> LeaseConfig {
        LeaseConfig::new(ttl)
    }
}

/// A held lease with a background keep-alive. Dropping it stops the
/// keep-alive (the coordinator then expires the lease after its TTL);
/// [`Lease::release`] ends it at once.
#[derive(Debug)]
pub struct Lease {
    client: Client,
    info: LeaseInfo,
    margin: Duration,
    state: StateTx,
    task: JoinHandle<()>,
}

impl Lease {
    pub fn resource(&self) -> &ResourceId {
        &self.info.resource
    }

    pub fn token(&self) -> Token {
        self.info.token
    }

    /// The fence to propagate with every effect made under this lease.
    pub fn fence(&self) -> Fence {
        self.info.fence()
    }

    pub fn holder(&self) -> &Holder {
        &self.info.holder
    }

    /// The TTL the coordinator granted.
    pub fn ttl(&self) -> Duration {
        self.info.ttl
    }

    pub fn margin(&self) -> Duration {
        self.margin
    }

    /// The secret that renews or releases the lease. Never log it.
    pub fn lease_id(&self) -> &LeaseId {
        &self.info.lease_id
    }

    /// A cloneable, `'static` view of the lease's liveness.
    pub fn watch(&self) -> LeaseWatch {
        self.state.watch()
    }

    /// Completes when the lease can no longer be proven held: at the
    /// self-fencing deadline (the send time of the last successful renewal +
    /// TTL − margin) even if the coordinator is unreachable, or at once when
    /// the coordinator refuses a renewal. `'static`: it may be spawned.
    pub fn lost(&self) -> impl Future<Output = Loss> + Send + 'static {
        self.watch().lost()
    }

    pub fn is_lost(&self) -> bool {
        self.watch().is_lost()
    }

    /// The current self-fencing deadline, a reading of the client's clock
    /// ([`Client::clock`]; [`LeaseWatch::time_left`] gives what is left).
    pub fn deadline(&self) -> Stamp {
        self.state.borrow().deadline
    }

    /// The send time of the acquire or renewal that last succeeded, a
    /// reading of the client's clock.
    pub fn renewed_at(&self) -> Stamp {
        self.state.borrow().renewed_at
    }

    /// Stops the keep-alive and releases the lease; returns its token. The
    /// lease counts as lost from the start of the call.
    pub async fn release(self) -> Result<Token, ClientError> {
        set_lost(&self.state, Loss::Released);
        self.task.abort();
        self.client.release(&self.info.resource, &self.info.lease_id).await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        set_lost(&self.state, Loss::Dropped);
        self.task.abort();
    }
}

/// Why [`Client::with_lease`] did not return the work's output.
#[derive(Debug, thiserror::Error)]
pub enum WithLeaseError {
    /// The lease could not be acquired (busy, unreachable, invalid, ...).
    #[error(transparent)]
    Acquire(#[from] ClientError),
    /// The lease was lost while the work ran; the work was cancelled (dropped).
    #[error("lease on {} lost while the work ran ({loss}); the work was cancelled", resource.shown())]
    Lost { resource: ResourceId, loss: Loss },
}

impl Client {
    /// Acquires `resource` and keeps the lease alive in the background (see
    /// [`Lease`]). If the acquire waited in the queue for more than a renewal
    /// interval, the grant time is unknown, so the lease is renewed once at
    /// once to anchor its deadline on a known send time.
    pub async fn lease(&self, resource: &ResourceId, config: impl Into<LeaseConfig>) -> Result<Lease, ClientError> {
        let config = config.into();
        let margin = config.margin()?;
        let clock = self.clock().clone();
        let sent = clock.now();
        let mut info = self.acquire_with(resource, &config).await?;
        let mut anchor = sent;
        if clock.now().saturating_since(sent) > renew_interval(info.ttl, margin) {
            anchor = clock.now();
            info.expires_in = self.renew(resource, &info.lease_id).await?.expires_in;
        }
        let valid_for = info.ttl.min(info.expires_in);
        let state = Shared::new(
            State {
                renewed_at: anchor,
                deadline: deadline(anchor, valid_for, margin),
                loss: None,
            },
            clock,
        );
        let keep_alive = KeepAlive {
            client: self.clone(),
            resource: resource.clone(),
            lease_id: info.lease_id,
            token: info.token,
            ttl: info.ttl,
            margin,
            state: state.clone(),
        };
        let task = tokio::spawn(keep_alive.run());
        Ok(Lease {
            client: self.clone(),
            info,
            margin,
            state,
            task,
        })
    }

    /// Acquires `resource`, runs `work` with the fence, and releases the lease
    /// when the work is done. If the lease is lost first, the work is
    /// cancelled (its future dropped at its next await point) and
    /// [`WithLeaseError::Lost`] is returned. A failed release after the work
    /// completed is not an error: the lease then expires after its TTL.
    pub async fn with_lease<T, F, Fut>(
        &self,
        resource: &ResourceId,
        config: impl Into<LeaseConfig>,
        work: F,
    ) -> Result<T, WithLeaseError>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = self.lease(resource, config).await?;
        let lost = lease.lost();
        let out = tokio::select! {
            biased;
            loss = lost => {
                return Err(WithLeaseError::Lost { resource: resource.clone(), loss });
            }
            out = work(lease.fence()) => out,
        };
        if let Err(e) = lease.release().await {
            tracing::warn!(resource = %resource.shown(), error = %e, "release after the work failed; the lease will expire");
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_margin_is_a_typed_refusal() {
        let config = LeaseConfig::new(Duration::from_secs(1)).with_margin(Duration::ZERO);
        let e = config.margin().unwrap_err();
        assert_eq!(e.field(), "margin");
        let config = LeaseConfig::new(Duration::from_secs(1)).with_margin(crate::MARGIN_MIN);
        assert_eq!(config.margin(), Ok(crate::MARGIN_MIN));
    }
}
