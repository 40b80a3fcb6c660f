//! Fenced messages over NATS JetStream (async-nats; feature `nats`).
//!
//! [`publish`] puts the fence in the message headers and waits for the
//! stream's publish ack. [`consume`] reads a pull consumer one message at a
//! time, hands `(Fence, Message)` to the handler and settles each message as
//! [`crate::queue`] decides: `+ACK` for applied, duplicate and **stale**
//! (acked once, never redelivered), `+TERM` for an unfenced or poison
//! message, `-NAK` with a delay for a retry. Acks and terms are sent as
//! double acks (the server confirms them), so a verdict is counted only once
//! the server has it; a settle that fails is logged and the message comes
//! back after the consumer's `ack_wait`, where deduplication
//! ([`crate::postgres::with_fence_once`]) keeps it from applying twice.
//!
//! [`Message::id`] is the `Nats-Msg-Id` header when the publisher set one
//! (JetStream also drops a republish with the same id inside the stream's
//! duplicate window), else `STREAM/SEQUENCE`. Use an explicit-ack consumer
//! (the default of `pull::Config`); bound redeliveries with its `max_deliver`.
//!
//! ```no_run
//! # async fn demo(
//! #     pull_consumer: async_nats::jetstream::consumer::PullConsumer,
//! #     pg: std::sync::Arc<tokio::sync::Mutex<tokio_postgres::Client>>,
//! # ) -> Result<(), leasefence_arbiter::queue::QueueError> {
//! use leasefence_arbiter::queue::{self, HandleError};
//! use leasefence_arbiter::{ArbiterError, nats, postgres};
//!
//! let settings = queue::Settings::new("jobs").on_stale(|stale| eprintln!("re-read {}", stale.resource));
//! let handler = |fence, msg: queue::Message| {
//!     let pg = pg.clone();
//!     async move {
//!         let id = msg.id.ok_or_else(|| HandleError::Poison("no message id".into()))?;
//!         let payload = msg.payload;
//!         let mut client = pg.lock().await;
//!         let once = postgres::with_fence_once(&mut client, "jobs-worker", &id, &fence, queue::MODE, |tx| {
//!             Box::pin(async move {
//!                 tx.execute("INSERT INTO jobs_done (payload) VALUES ($1)", &[&payload]).await?;
//!                 Ok::<_, ArbiterError>(())
//!             })
//!         })
//!         .await?;
//!         Ok(once.into())
//!     }
//! };
//! let tally = nats::consume(&pull_consumer, &settings, handler, std::future::pending()).await?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::context::Context;
use async_nats::jetstream::message::{AckKind, Message as JsMessage};
use async_nats::jetstream::publish::PublishAck;
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use futures_util::StreamExt;
use leasefence_core::{Fence, Invalid};

use crate::propagate::{fence_from_pairs, fence_to_pairs};
use crate::queue::{self, HandleError, Handled, Message, QueueError, Settings, Settle, Tally, Verdict};

/// The JetStream header that names a message for deduplication.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// Messages [`consume`] pulls at a time. The consumer's `ack_wait` runs from
/// delivery, buffered or not, so a large batch handled one by one would
/// outlive it and be delivered twice.
pub const PULL_BATCH: usize = 16;

fn header_value(field: &'static str, value: &str) -> Result<HeaderValue, Invalid> {
    value
        .parse()
        .map_err(|_| Invalid::new(field, "a NATS header value cannot contain CR or LF"))
}

/// The fence headers (and `Nats-Msg-Id` when `message_id` is given), to add
/// your own to before [`publish_with_headers`].
pub fn fence_headers(fence: &Fence, message_id: Option<&str>) -> Result<HeaderMap, Invalid> {
    let mut headers = HeaderMap::new();
    for (name, value) in fence_to_pairs(fence) {
        headers.insert(HeaderName::from_static(name), header_value(name, &value)?);
    }
    if let Some(id) = message_id {
        if id.is_empty() {
            return Err(Invalid::new("message_id", "must not be empty"));
        }
        headers.insert(HeaderName::from_static(MSG_ID_HEADER), header_value("message_id", id)?);
    }
    Ok(headers)
}

/// Publishes `payload` to `subject` with `fence` (and `message_id` as
/// `Nats-Msg-Id`) and waits for the stream to acknowledge it.
pub async fn publish(
    js: &Context,
    subject: &str,
    fence: &Fence,
    message_id: Option<&str>,
    payload: impl Into<Bytes>,
) -> Result<PublishAck, QueueError> {
    publish_with_headers(js, subject, fence_headers(fence, message_id)?, payload).await
}

/// [`publish`] with headers made by [`fence_headers`] (plus your own).
pub async fn publish_with_headers(
    js: &Context,
    subject: &str,
    headers: HeaderMap,
    payload: impl Into<Bytes>,
) -> Result<PublishAck, QueueError> {
    let ack = js
        .publish_with_headers(subject.to_owned(), headers, payload.into())
        .await
        .map_err(|e| QueueError::nats("publishing", e))?;
    ack.await
        .map_err(|e| QueueError::nats("waiting for the publish ack", e))
}

/// The fence a JetStream message carries and the message as a handler sees it.
pub fn read(msg: &JsMessage) -> (Result<Option<Fence>, Invalid>, Message) {
    let pairs: Vec<(String, String)> = msg
        .headers
        .iter()
        .flat_map(|h| h.iter())
        .flat_map(|(name, values)| values.iter().map(move |v| (name.to_string(), v.as_str().to_owned())))
        .collect();
    let fence = fence_from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let info = msg.info().ok();
    let header_id = pairs
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(MSG_ID_HEADER))
        .map(|(_, v)| v.clone());
    let id = header_id.or_else(|| info.as_ref().map(|i| format!("{}/{}", i.stream, i.stream_sequence)));
    let deliveries = info.as_ref().and_then(|i| u64::try_from(i.delivered).ok());
    let message = Message {
        id,
        payload: msg.payload.to_vec(),
        deliveries,
        redelivered: deliveries.is_some_and(|d| d > 1),
    };
    (fence, message)
}

/// Handles one message: reads its fence, runs `handler` if it has one,
/// settles it with the server and then counts, logs and (when stale) calls
/// back. An error means the settle failed: nothing was counted, and the
/// message will be delivered again.
pub async fn handle<H, Fut>(msg: &JsMessage, settings: &Settings, handler: &H) -> Result<Verdict, QueueError>
where
    H: Fn(Fence, Message) -> Fut,
    Fut: Future<Output = Result<Handled, HandleError>>,
{
    let (fence, message) = read(msg);
    let id = message.id.clone();
    let verdict = queue::run_handler(fence, message, handler).await;
    let settled = match verdict.settle(settings) {
        Settle::Ack => msg.double_ack_with(AckKind::Ack).await,
        Settle::Drop => msg.double_ack_with(AckKind::Term).await,
        Settle::Retry(delay) => msg.ack_with(AckKind::Nak(Some(delay))).await,
    };
    settled.map_err(|e| QueueError::nats("settling a message", e))?;
    queue::observe(settings, id.as_deref(), &verdict);
    Ok(verdict)
}

/// Consumes `consumer` until `shutdown` completes (or the message stream
/// ends), handling one message at a time, and returns what it saw. A
/// failed settle is logged and the loop goes on;
/// [`queue::RECEIVE_ERRORS_MAX`] stream errors in a row end it with the
/// last one.
pub async fn consume<H, Fut>(
    consumer: &PullConsumer,
    settings: &Settings,
    handler: H,
    shutdown: impl Future<Output = ()>,
) -> Result<Tally, QueueError>
where
    H: Fn(Fence, Message) -> Fut,
    Fut: Future<Output = Result<Handled, HandleError>>,
{
    let messages = consumer
        .stream()
        .max_messages_per_batch(PULL_BATCH)
        .messages()
        .await
        .map_err(|e| QueueError::nats("opening the message stream", e))?
        .map(|m| m.map_err(|e| QueueError::nats("reading the message stream", e)));
    let handler = &handler;
    queue::consume_loop(messages, settings, shutdown, |msg| async move {
        handle(&msg, settings, handler).await
    })
    .await
}
