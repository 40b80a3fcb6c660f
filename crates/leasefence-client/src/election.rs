//! Leader election on top of leases: [`Client::campaign`] blocks until this
//! client holds the lease on an election name and returns a [`Leader`];
//! [`Client::observe`] streams who leads ([`LeaderChange`]).
//!
//! An election is one resource: the leader is whoever holds its lease, and the
//! lease's fencing token is the leader's **term** — strictly increasing, never
//! reused, across coordinator restarts too.
//!
//! Semantics worth knowing:
//! - **Leadership is a lease, not a fact.** A leader that pauses past its TTL
//!   is replaced while it still believes it leads. [`Leader::lost`] fires at
//!   the self-fencing deadline, but only the term stops a stale leader's
//!   effects: carry [`Leader::fence`] with every effect and have an arbiter
//!   check it, exactly as for any other lease.
//! - **Campaigning is queueing.** Each round is one FIFO acquire that waits up
//!   to the config's wait (zero: [`CAMPAIGN_WAIT_DEFAULT`], the server's
//!   default maximum); when the round runs out the campaigner queues again at
//!   the back. Dropping the `campaign` future withdraws from the queue; a grant
//!   that races the drop is held by nobody until its TTL runs out.
//! - **An observer's view lags.** [`Client::observe`] reports changes after
//!   they happened; a holder it reports may already be gone. It is for
//!   display and routing, never for deciding that it is safe to act.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use leasefence_client::{Client, LeaseConfig};
//! use leasefence_core::{Holder, ResourceId};
//!
//! let client = Client::connect("http://127.0.0.1:7740").await?;
//! let name = ResourceId::new("scheduler")?;
//! let config = LeaseConfig::new(Duration::from_secs(10)).with_holder(Holder::new("node-1")?);
//! let leader = client.campaign(&name, config).await?; // waits until this client leads
//! let fence = leader.fence(); // carry it with every effect: the token is the term
//! tokio::select! {
//!     loss = leader.lost() => eprintln!("leadership of term {} lost: {loss}", fence.token),
//!     () = async { /* lead, fencing every effect with `fence` */ } => {
//!         leader.resign().await?;
//!     }
//! }
//! # Ok(())
//! # }
//! ```

mod observe;

use std::future::Future;
use std::time::Duration;

use leasefence_core::{Fence, Holder, Invalid, LeaseError, ResourceId, Token};
use tokio::time::sleep;

use crate::{Client, ClientError, Lease, LeaseConfig, LeaseWatch, Loss};

pub use observe::{LeaderChange, LeaderChanges};

/// The wait of one campaign round when the config asks for none: the
/// coordinator's default `--wait-max`.
pub const CAMPAIGN_WAIT_DEFAULT: Duration = Duration::from_secs(300);
/// Shortest round wait a campaign falls back to when the server's maximum is
/// lower than asked.
const ROUND_WAIT_MIN: Duration = Duration::from_millis(100);
/// Backoff bounds while the coordinator's queue for the name is full.
const FULL_BACKOFF_MIN: Duration = Duration::from_millis(50);
const FULL_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Leadership of an election: a [`Lease`] whose token is the term. Dropping
/// it stops the keep-alive (the coordinator then expires it after its TTL);
/// [`Leader::resign`] hands leadership on at once.
#[derive(Debug)]
pub struct Leader {
    lease: Lease,
}

impl Leader {
    /// The election's name (the resource whose lease is leadership).
    pub fn name(&self) -> &ResourceId {
        self.lease.resource()
    }

    /// This leader's term: the lease's fencing token.
    pub fn term(&self) -> Token {
        self.lease.token()
    }

    /// The fence to carry with every effect this leader makes.
    pub fn fence(&self) -> Fence {
        self.lease.fence()
    }

    pub fn holder(&self) -> &Holder {
        self.lease.holder()
    }

    /// Completes when leadership can no longer be proven (see [`Lease::lost`]).
    pub fn lost(&self) -> impl Future<Output = Loss> + Send + 'static {
        self.lease.lost()
    }

    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// A cloneable, `'static` view of leadership's liveness.
    pub fn watch(&self) -> LeaseWatch {
        self.lease.watch()
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    pub fn into_lease(self) -> Lease {
        self.lease
    }

    /// Releases leadership; the next campaigner in line becomes leader with a
    /// higher term. Returns this leader's term.
    pub async fn resign(self) -> Result<Token, ClientError> {
        self.lease.release().await
    }
}

impl Client {
    /// Campaigns for leadership of `name` and completes once this client
    /// leads. Each round waits in the coordinator's FIFO queue for the
    /// config's wait (zero: [`CAMPAIGN_WAIT_DEFAULT`], lowered to the
    /// server's `--wait-max` if that is smaller) and then queues again, so
    /// this waits as long as it takes. A full queue is retried with backoff.
    /// Other failures (unreachable, invalid) are returned. Cancel by dropping
    /// the future.
    pub async fn campaign(&self, name: &ResourceId, config: impl Into<LeaseConfig>) -> Result<Leader, ClientError> {
        let config = config.into();
        let mut wait = if config.wait().is_zero() {
            CAMPAIGN_WAIT_DEFAULT
        } else {
            config.wait()
        };
        let mut backoff = FULL_BACKOFF_MIN;
        loop {
            match self.lease(name, config.clone().with_wait(wait)).await {
                Ok(lease) => return Ok(Leader { lease }),
                // The round's wait ran out, or the grant expired before it
                // could be anchored (a TTL shorter than the queue): again.
                Err(ClientError::Lease(LeaseError::Busy { .. } | LeaseError::LeaseLost { .. })) => {
                    backoff = FULL_BACKOFF_MIN;
                }
                Err(ClientError::Lease(LeaseError::TooManyWaiters { .. })) => {
                    sleep(backoff).await;
                    backoff = (backoff * 2).min(FULL_BACKOFF_MAX);
                }
                Err(ClientError::Lease(LeaseError::Invalid(e))) if e.field() == "wait_ms" && wait > ROUND_WAIT_MIN => {
                    wait = lower_wait(wait, &e);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The next round wait after the server refused `wait` as too long: the
/// maximum it named ("must be at most N ms, …"), else half.
fn lower_wait(wait: Duration, refusal: &Invalid) -> Duration {
    let named = refusal
        .message()
        .split_once("at most ")
        .and_then(|(_, rest)| rest.split_once(" ms"))
        .and_then(|(n, _)| n.parse::<u64>().ok())
        .map(Duration::from_millis)
        .filter(|max| *max < wait);
    named.unwrap_or(wait / 2).max(ROUND_WAIT_MIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_too_long_round_wait_falls_to_the_servers_maximum_or_half() {
        let long = Duration::from_secs(300);
        let named = Invalid::new("wait_ms", "must be at most 10000 ms, got 300000 ms");
        assert_eq!(lower_wait(long, &named), Duration::from_secs(10));
        let vague = Invalid::new("wait_ms", "too long");
        assert_eq!(lower_wait(long, &vague), Duration::from_secs(150));
        assert_eq!(lower_wait(Duration::from_millis(150), &vague), ROUND_WAIT_MIN);
        let bogus = Invalid::new("wait_ms", "must be at most 900000 ms, got 300000 ms");
        assert_eq!(lower_wait(long, &bogus), Duration::from_secs(150), "never raised");
    }
}
