//! The background keep-alive of a [`crate::Lease`]: renewals over the
//! `KeepAlive` stream every third of the usable window, and the bookkeeping
//! that turns each success into a new self-fencing deadline.
//!
//! The stream answers renewals one for one, in order, so the reply at the
//! front pairs with the oldest send time in flight. A broken or stalled
//! stream is reopened (with backoff) until the deadline; a refusal ends the
//! lease at once.
//!
//! With several coordinators, a stream that breaks, stalls or is refused
//! with a standby's not-leader answer is reopened on the coordinator the
//! hint names, or else on the next one: after a takeover the new active
//! coordinator honours the lease (it loads the records and gives every held
//! lease a full TTL), so renewals go on there as long as the self-fencing
//! deadline has not passed. A renewal refused as lease-lost still loses the
//! lease at once, wherever it was refused.

use std::collections::VecDeque;
use std::time::Duration;

use leasefence_core::{LeaseId, ResourceId, Token};
use leasefence_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_stream::wrappers::ReceiverStream;

use crate::Client;
use crate::clock::{self, Stamp};
use crate::coordinators::{Failure, Pick, classify};
use crate::deadline::{deadline, renew_interval};
use crate::watch::{Loss, StateTx, set_lost};

/// Renewals sent but not yet answered, at most; more means the stream stalls.
const IN_FLIGHT_MAX: usize = 3;
/// Shortest wait for a stream to open before another coordinator is tried.
const OPEN_STALL_MIN: Duration = Duration::from_millis(500);
/// First wait before reopening a broken stream.
const BACKOFF_MIN: Duration = Duration::from_millis(10);

/// Why one stream ended.
enum StreamEnd {
    Lost(Loss),
    /// Transport failure, stall or not-leader answer: reopen, at once if a
    /// leader hint named where.
    Broken {
        hinted: bool,
    },
}

pub(crate) struct KeepAlive {
    pub client: Client,
    pub resource: ResourceId,
    pub lease_id: LeaseId,
    pub token: Token,
    pub ttl: Duration,
    pub margin: Duration,
    pub state: StateTx,
}

impl KeepAlive {
    /// Renews until the lease is lost, then publishes the loss.
    pub(crate) async fn run(self) {
        let loss = self.renew_until_lost().await;
        set_lost(&self.state, loss);
    }

    fn deadline(&self) -> Stamp {
        self.state.borrow().deadline
    }

    /// Completes at the current deadline (on the lease's clock).
    async fn until_deadline(&self) {
        clock::sleep_until(self.state.clock(), self.deadline()).await;
    }

    fn interval(&self) -> Duration {
        renew_interval(self.ttl, self.margin)
    }

    /// Completes when a stream that is still opening counts as stalled (its
    /// coordinator paused or cut off) and another coordinator should be
    /// tried: after a renewal interval, at least [`OPEN_STALL_MIN`] so that
    /// a busy machine is not mistaken for a stalled coordinator. Never with
    /// a single coordinator: there is nowhere else to go.
    async fn open_stalled(&self) {
        if self.client.coordinators.len() > 1 {
            sleep(self.interval().max(OPEN_STALL_MIN)).await;
        } else {
            std::future::pending::<()>().await;
        }
    }

    async fn renew_until_lost(&self) -> Loss {
        let mut backoff = BACKOFF_MIN;
        loop {
            match self.one_stream().await {
                StreamEnd::Lost(loss) => return loss,
                StreamEnd::Broken { hinted } => {
                    if hinted {
                        backoff = BACKOFF_MIN;
                    }
                    tokio::select! {
                        () = sleep(backoff) => {}
                        () = self.until_deadline() => {}
                    }
                    if self.state.now() >= self.deadline() {
                        return Loss::Expired;
                    }
                    backoff = (backoff * 2).min(self.interval());
                }
            }
        }
    }

    /// Records that a renewal sent at `sent` succeeded with `valid_for` left.
    /// A success that arrives after the deadline cannot revive the lease:
    /// anyone may have been told it is lost already.
    fn proven(&self, sent: Stamp, valid_for: Duration) -> Option<Loss> {
        let mut lost = None;
        let now = self.state.now();
        self.state.send_if_modified(|s| {
            if s.loss.is_some() {
                return false;
            }
            if now >= s.deadline {
                s.loss = Some(Loss::Expired);
                lost = s.loss;
                return true;
            }
            let d = deadline(sent, valid_for, self.margin);
            if d <= s.deadline {
                return false;
            }
            s.deadline = d;
            s.renewed_at = sent;
            true
        });
        lost
    }

    fn request(&self) -> pb::RenewRequest {
        pb::RenewRequest {
            resource: self.resource.to_string(),
            lease_id: self.lease_id.to_hex(),
        }
    }

    fn classify(&self, on: &Pick, status: &tonic::Status) -> StreamEnd {
        if leasefence_proto::status_to_error(&self.resource, status).is_some() {
            // Lease lost, or any other refusal of a renewal of a lease we
            // were granted: the coordinator no longer vouches for it.
            return StreamEnd::Lost(Loss::Revoked);
        }
        self.broken(on, &classify(status))
    }

    /// The stream on `on` broke as `failure`: the next one goes where a
    /// hint says, or to the next coordinator (renewing twice is harmless).
    fn broken(&self, on: &Pick, failure: &Failure) -> StreamEnd {
        tracing::debug!(url = %on.url, resource = %self.resource.shown(), ?failure, "keep-alive stream broken");
        let hinted = self.client.coordinators.failed(on.index, failure);
        StreamEnd::Broken { hinted }
    }

    fn answered(&self, on: &Pick, in_flight: &mut VecDeque<Stamp>, lease: &pb::Lease) -> Option<StreamEnd> {
        let Some(sent) = in_flight.pop_front() else {
            return Some(self.broken(on, &Failure::Ambiguous));
        };
        if lease.token != self.token.get() {
            return Some(StreamEnd::Lost(Loss::TokenChanged));
        }
        let valid_for = Duration::from_millis(lease.ttl_ms.min(lease.expires_in_ms));
        self.proven(sent, valid_for).map(StreamEnd::Lost)
    }

    /// Opens one `KeepAlive` stream and renews over it until it breaks or the
    /// lease is lost.
    async fn one_stream(&self) -> StreamEnd {
        let (tx, rx) = mpsc::channel(IN_FLIGHT_MAX);
        let mut in_flight = VecDeque::with_capacity(IN_FLIGHT_MAX);
        // Renewals are timed on tokio's clock, from the lease clock's reading.
        let due = self.state.borrow().renewed_at.saturating_add(self.interval());
        let mut next_at = Instant::now() + due.saturating_since(self.state.now());
        let on = self.client.coordinators.pick();
        let mut grpc = on.grpc.clone();
        let opened = tokio::select! {
            biased;
            () = self.until_deadline() => return StreamEnd::Lost(Loss::Expired),
            r = grpc.keep_alive(ReceiverStream::new(rx)) => r,
            () = self.open_stalled() => return self.broken(&on, &Failure::Ambiguous),
        };
        let mut inbound = match opened {
            Ok(r) => r.into_inner(),
            Err(status) => return self.classify(&on, &status),
        };
        loop {
            tokio::select! {
                biased;
                () = self.until_deadline() => return StreamEnd::Lost(Loss::Expired),
                msg = inbound.message() => match msg {
                    Ok(Some(lease)) => {
                        if let Some(end) = self.answered(&on, &mut in_flight, &lease) {
                            return end;
                        }
                    }
                    Ok(None) => return self.broken(&on, &Failure::Ambiguous),
                    Err(status) => return self.classify(&on, &status),
                },
                () = sleep_until(next_at) => {
                    let now = self.state.now();
                    let stalled = in_flight.front().is_some_and(|t| now.saturating_since(*t) > self.interval());
                    if stalled || in_flight.len() >= IN_FLIGHT_MAX {
                        return self.broken(&on, &Failure::Ambiguous);
                    }
                    // The send time is taken before the message is handed
                    // over: it can only be earlier than the real send.
                    in_flight.push_back(now);
                    if tx.try_send(self.request()).is_err() {
                        return self.broken(&on, &Failure::Ambiguous);
                    }
                    next_at = Instant::now() + self.interval();
                }
            }
        }
    }
}
