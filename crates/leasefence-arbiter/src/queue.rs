//! Fenced queue consumers, the part no broker knows about: what a consumer
//! does with a message once its handler has run, shared by [`crate::nats`]
//! (JetStream) and [`crate::amqp`] (RabbitMQ).
//!
//! A producer publishes with its fence in the message headers (the
//! `leasefence-resource` / `leasefence-token` pair of [`crate::propagate`]).
//! The consumer reads the fence back and hands `(Fence, Message)` to a handler
//! that applies the effect **through an arbiter**; the handler's result
//! becomes a [`Verdict`], and the verdict decides how the message is settled
//! ([`Verdict::settle`]) and what is counted ([`Verdict::metric`]):
//!
//! | verdict | settle | JetStream | RabbitMQ | counter (`queue` label) |
//! |---|---|---|---|---|
//! | [`Applied`](Verdict::Applied) | ack | `+ACK` | `basic.ack` | [`APPLIED_METRIC`] |
//! | [`Duplicate`](Verdict::Duplicate) (already applied) | ack | `+ACK` | `basic.ack` | [`DUPLICATE_METRIC`] |
//! | [`Stale`](Verdict::Stale) | ack | `+ACK` | `basic.ack` | [`STALE_METRIC`] |
//! | [`Unfenced`](Verdict::Unfenced) (no or malformed fence) | drop | `+TERM` | `basic.reject`, no requeue | [`UNFENCED_METRIC`] |
//! | [`Poison`](Verdict::Poison) (can never apply; a fence whose signature is missing, malformed or does not match) | drop | `+TERM` | `basic.reject`, no requeue | [`POISON_METRIC`] |
//! | [`Retry`](Verdict::Retry) (transient conflict) | retry after [`Settings::retry_delay`] | `-NAK` with delay | wait, then `basic.nack` with requeue | [`RETRIED_METRIC`] |
//! | [`Failed`](Verdict::Failed) (backend down, not installed, a fence signed under a key the arbiter does not hold yet, …) | retry after [`Settings::failure_delay`] | `-NAK` with delay | wait, then `basic.nack` with requeue | [`FAILED_METRIC`] |
//!
//! A stale message is acknowledged once and never redelivered: the rejection
//! is the normal outcome of a holder that lost its lease, not an error to
//! retry. It is logged at `warn` with resource, presented and current (never
//! a lease id) and handed to the [`Settings::on_stale`] callback, so the
//! worker can re-read state. A message without a fence, or with a malformed
//! one, is never handed to the handler: it is dropped, which JetStream reports
//! as a `MSG_TERMINATED` advisory and RabbitMQ routes to the queue's
//! dead-letter exchange when it has one. A failure of the backend itself is
//! retried without bound by the consumer; bound it on the broker (JetStream's
//! `max_deliver`, a quorum queue's `x-delivery-limit`), which then
//! dead-letters or drops the message.
//!
//! **Signed fences.** An arbiter that holds fence keys refuses a fence
//! without a valid signature ([`ArbiterError::BadSignature`]) atomically
//! with the effect: nothing is applied. The consumer drops such a message as
//! poison when the refusal is the same on every delivery (`missing`,
//! `malformed`, `mismatch`: stripped, altered, or signed for another
//! resource or token), so a forged message is refused once and goes to the
//! dead-letter exchange, not round the queue. A fence signed under a key the
//! arbiter does not hold (`unknown_key`) is a failure, retried after
//! [`Settings::failure_delay`]: installing the key (the first step of a
//! rotation) lets it apply. The arbiter counts every refusal by reason in
//! `leasefence_arbiter_signature_refusals_total`.
//!
//! # Semantics
//!
//! **Several messages under one grant.** A holder may publish any number of
//! messages with the one token of its grant, so consumers fence with
//! [`FenceMode::Monotonic`] ([`MODE`]): every message of the current grant
//! applies, a lower token is still refused.
//!
//! **Redelivery.** Brokers deliver at least once: a message whose effect
//! committed may come again when its ack was lost. Monotonic admits the same
//! token twice, so the fence alone does not stop a second application. Where
//! the effect is transactional, commit the message id in the same transaction
//! as the effect and the fence: `postgres::with_fence_once` (or
//! `postgres::claim_message` inside your own transaction) does, and answers
//! `Once::Duplicate` for a message it has seen, which the handler returns as
//! [`Handled::Duplicate`]: acked, not applied. The id is [`Message::id`]:
//! JetStream's `Nats-Msg-Id` header when the publisher set one, else the
//! stream and its sequence; AMQP's `message_id` property, which the publisher
//! must set uniquely ([`crate::amqp::publish`] requires one).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use leasefence_core::signing::SignatureError;
use leasefence_core::{Fence, FenceMode, Invalid, Stale};

use crate::ArbiterError;

mod run;

#[cfg(any(feature = "nats", feature = "amqp"))]
pub(crate) use run::consume_loop;
pub use run::{RECEIVE_ERRORS_MAX, observe, run_handler};

/// The fence mode a queue consumer admits with (see the module doc).
pub const MODE: FenceMode = FenceMode::Monotonic;

/// Messages whose effect was applied.
pub const APPLIED_METRIC: &str = "leasefence_applied_messages_total";
/// Redeliveries of an already applied message, acked without applying.
pub const DUPLICATE_METRIC: &str = "leasefence_duplicate_messages_total";
/// Messages rejected by the arbiter for a stale token (acked once).
pub const STALE_METRIC: &str = "leasefence_stale_messages_total";
/// Messages without a fence or with a malformed one (dropped).
pub const UNFENCED_METRIC: &str = "leasefence_unfenced_messages_total";
/// Messages the handler can never apply (dropped).
pub const POISON_METRIC: &str = "leasefence_poison_messages_total";
/// Deliveries requeued after a transient conflict.
pub const RETRIED_METRIC: &str = "leasefence_retried_messages_total";
/// Deliveries requeued after a backend failure.
pub const FAILED_METRIC: &str = "leasefence_failed_messages_total";

/// A received message as the handler sees it, whatever the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The id to deduplicate redeliveries by (see the module doc); `None`
    /// only for an AMQP message published without `message_id`.
    pub id: Option<String>,
    pub payload: Vec<u8>,
    /// How many times the broker has delivered it, this delivery included,
    /// when the broker says (JetStream always, RabbitMQ for quorum queues).
    pub deliveries: Option<u64>,
    /// Whether the broker says it delivered this message before.
    pub redelivered: bool,
}

/// What the handler did with a message it could handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handled {
    /// The effect was applied (and the fence admitted it).
    Applied,
    /// The message had already been applied; nothing was done now.
    Duplicate,
}

/// Why the handler did not apply a message. `?` on an [`ArbiterError`]
/// (a stale token, a backend failure) gives [`HandleError::Arbiter`].
#[derive(Debug, thiserror::Error)]
pub enum HandleError {
    #[error(transparent)]
    Arbiter(#[from] ArbiterError),
    /// The message can never be applied (its payload does not parse, it
    /// names nothing that exists): drop it.
    #[error("poison message: {0}")]
    Poison(String),
    /// Not now, maybe later (a lock held elsewhere): requeue it.
    #[error("retry later: {0}")]
    Retry(String),
}

/// What happened to one delivery: the handler's result (or the missing
/// fence) in the terms the consumer acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Applied,
    Duplicate,
    Stale(Stale),
    /// No fence in the headers, or a malformed one; the reason says which.
    Unfenced(String),
    Poison(String),
    Retry(String),
    Failed(String),
}

/// How a delivery is settled with the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Done with: never delivered again.
    Ack,
    /// Never delivered again, and not processed: JetStream `+TERM`,
    /// RabbitMQ reject without requeue (dead-lettered if the queue says so).
    Drop,
    /// Delivered again after the delay.
    Retry(Duration),
}

/// The fence of a delivery whose fence headers read as `fence`
/// (`Ok(None)`: none at all), or the [`Verdict::Unfenced`] it gets without
/// running the handler.
pub fn require_fence(fence: Result<Option<Fence>, Invalid>) -> Result<Fence, Verdict> {
    match fence {
        Ok(Some(fence)) => Ok(fence),
        Ok(None) => Err(Verdict::Unfenced("the message carries no fence headers".into())),
        Err(e) => Err(Verdict::Unfenced(format!("malformed fence: {e}"))),
    }
}

impl Verdict {
    /// The verdict for a handler's result.
    pub fn of_result(result: &Result<Handled, HandleError>) -> Verdict {
        match result {
            Ok(Handled::Applied) => Verdict::Applied,
            Ok(Handled::Duplicate) => Verdict::Duplicate,
            Err(HandleError::Arbiter(ArbiterError::Stale(s))) => Verdict::Stale(s.clone()),
            Err(HandleError::Arbiter(e)) if e.is_retryable() => Verdict::Retry(e.to_string()),
            // Invalid input to the arbiter (a token above what it stores, a
            // resource too long) fails the same way on every delivery.
            Err(HandleError::Arbiter(e @ ArbiterError::Invalid(_))) => Verdict::Poison(e.to_string()),
            // A fence whose signature is missing, malformed or does not
            // match (forged, altered, or signed for another token) is refused
            // on every delivery. One under a key the arbiter does not hold
            // yet heals once the key is installed, so it stays a failure of
            // the arbiter's set-up (below) and is retried.
            Err(HandleError::Arbiter(e @ ArbiterError::BadSignature { reason, .. }))
                if !matches!(reason, SignatureError::UnknownKey(_)) =>
            {
                Verdict::Poison(e.to_string())
            }
            Err(HandleError::Arbiter(e)) => Verdict::Failed(e.to_string()),
            Err(HandleError::Poison(why)) => Verdict::Poison(why.clone()),
            Err(HandleError::Retry(why)) => Verdict::Retry(why.clone()),
        }
    }

    /// How to settle the delivery.
    pub fn settle(&self, settings: &Settings) -> Settle {
        match self {
            Verdict::Applied | Verdict::Duplicate | Verdict::Stale(_) => Settle::Ack,
            Verdict::Unfenced(_) | Verdict::Poison(_) => Settle::Drop,
            Verdict::Retry(_) => Settle::Retry(settings.retry_delay),
            Verdict::Failed(_) => Settle::Retry(settings.failure_delay),
        }
    }

    /// The counter this verdict increments.
    pub fn metric(&self) -> &'static str {
        match self {
            Verdict::Applied => APPLIED_METRIC,
            Verdict::Duplicate => DUPLICATE_METRIC,
            Verdict::Stale(_) => STALE_METRIC,
            Verdict::Unfenced(_) => UNFENCED_METRIC,
            Verdict::Poison(_) => POISON_METRIC,
            Verdict::Retry(_) => RETRIED_METRIC,
            Verdict::Failed(_) => FAILED_METRIC,
        }
    }
}

/// Why a consumer or publisher could not talk to its broker (a stale or
/// unfenced message is a [`Verdict`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Input that cannot be put in a message (a header value with CR/LF, an
    /// over-long AMQP short string).
    #[error(transparent)]
    Invalid(#[from] Invalid),
    #[cfg(feature = "nats")]
    #[error("NATS, {during}: {source}")]
    Nats {
        during: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[cfg(feature = "amqp")]
    #[error("RabbitMQ, {during}: {source}")]
    Amqp { during: &'static str, source: lapin::Error },
    /// The broker did not take responsibility for a published message.
    #[error("the broker did not confirm message {message_id}: {reason}")]
    NotConfirmed { message_id: String, reason: String },
    /// A delivery could not be settled (already settled, or its channel
    /// failed); the broker delivers it again.
    #[error("message {message_id} could not be settled: {reason}")]
    NotSettled { message_id: String, reason: String },
}

impl QueueError {
    #[cfg(feature = "nats")]
    pub(crate) fn nats(during: &'static str, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> QueueError {
        QueueError::Nats {
            during,
            source: e.into(),
        }
    }
}

/// The callback a stale message is handed to.
pub type OnStale = Arc<dyn Fn(&Stale) + Send + Sync>;

/// How a consumer settles and reports: the `queue` label of its counters,
/// the retry delays, the stale callback.
#[derive(Clone)]
pub struct Settings {
    queue: String,
    retry_delay: Duration,
    failure_delay: Duration,
    on_stale: Option<OnStale>,
}

impl Settings {
    /// Defaults: retry a transient conflict after 100 ms, a backend failure
    /// after 2 s; no stale callback. `queue` labels the counters: pick a
    /// name per queue (stream, consumer), never one per message.
    pub fn new(queue: impl Into<String>) -> Settings {
        Settings {
            queue: queue.into(),
            retry_delay: Duration::from_millis(100),
            failure_delay: Duration::from_secs(2),
            on_stale: None,
        }
    }

    /// The delay before a transient conflict is delivered again.
    pub fn with_retry_delay(mut self, delay: Duration) -> Settings {
        self.retry_delay = delay;
        self
    }

    /// The delay before a message whose backend failed is delivered again.
    pub fn with_failure_delay(mut self, delay: Duration) -> Settings {
        self.failure_delay = delay;
        self
    }

    /// Calls `f` with every stale rejection (after it is acked), e.g. to
    /// make the worker re-read state. Keep it quick: the consumer waits.
    pub fn on_stale(mut self, f: impl Fn(&Stale) + Send + Sync + 'static) -> Settings {
        self.on_stale = Some(Arc::new(f));
        self
    }

    pub fn queue(&self) -> &str {
        &self.queue
    }

    pub fn retry_delay(&self) -> Duration {
        self.retry_delay
    }

    pub fn failure_delay(&self) -> Duration {
        self.failure_delay
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("queue", &self.queue)
            .field("retry_delay", &self.retry_delay)
            .field("failure_delay", &self.failure_delay)
            .field("on_stale", &self.on_stale.is_some())
            .finish()
    }
}

/// How many deliveries a consumer saw end in each verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub applied: u64,
    pub duplicate: u64,
    pub stale: u64,
    pub unfenced: u64,
    pub poison: u64,
    pub retried: u64,
    pub failed: u64,
}

impl Tally {
    pub fn add(&mut self, verdict: &Verdict) {
        let slot = match verdict {
            Verdict::Applied => &mut self.applied,
            Verdict::Duplicate => &mut self.duplicate,
            Verdict::Stale(_) => &mut self.stale,
            Verdict::Unfenced(_) => &mut self.unfenced,
            Verdict::Poison(_) => &mut self.poison,
            Verdict::Retry(_) => &mut self.retried,
            Verdict::Failed(_) => &mut self.failed,
        };
        *slot += 1;
    }

    /// Deliveries seen in all.
    pub fn total(&self) -> u64 {
        self.applied + self.duplicate + self.stale + self.unfenced + self.poison + self.retried + self.failed
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
