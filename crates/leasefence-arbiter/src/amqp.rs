//! Fenced messages over RabbitMQ / AMQP 0-9-1 (lapin; feature `amqp`).
//!
//! [`publish`] puts the fence in the message headers (long strings), sets a
//! `message_id` (required: it is what consumers deduplicate by) and
//! persistent delivery, publishes `mandatory` on a channel in confirm mode
//! ([`confirm_channel`]) and waits for the broker's confirm: a nack or an
//! unroutable return is [`QueueError::NotConfirmed`]. [`consume`] reads a
//! `lapin::Consumer` one delivery at a time (use manual acks, the default of
//! `basic_consume`) and settles each as [`crate::queue`] decides:
//! `basic.ack` for applied, duplicate and **stale** (acked once, never
//! requeued), `basic.reject` without requeue for unfenced and poison
//! messages (dead-lettered when the queue has a dead-letter exchange), and
//! for a retry `basic.nack` with requeue **after** the delay: RabbitMQ has
//! no delayed requeue, so the consumer holds the message (and waits) for the
//! delay first.
//!
//! [`Message::deliveries`] comes from a quorum queue's `x-delivery-count`;
//! classic queues only say [`Message::redelivered`]. Bound redeliveries with
//! a quorum queue's `x-delivery-limit`.

use std::future::Future;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicNackOptions, BasicPublishOptions, BasicRejectOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use leasefence_core::{Fence, HEADER_RESOURCE, HEADER_SIGNATURE, HEADER_TOKEN, Invalid};

use crate::propagate::{fence_from_pairs, fence_to_pairs};
use crate::queue::{self, HandleError, Handled, Message, QueueError, Settings, Settle, Tally, Verdict};

/// The header a quorum queue counts earlier deliveries in.
pub const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// AMQP delivery mode 2: the broker writes the message to disk.
const PERSISTENT: u8 = 2;

impl QueueError {
    fn amqp(during: &'static str) -> impl FnOnce(lapin::Error) -> QueueError {
        move |source| QueueError::Amqp { during, source }
    }
}

/// A new channel on `connection` in publisher-confirm mode, for [`publish`].
pub async fn confirm_channel(connection: &Connection) -> Result<Channel, QueueError> {
    let channel = connection
        .create_channel()
        .await
        .map_err(QueueError::amqp("opening a channel"))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(QueueError::amqp("enabling publisher confirms"))?;
    Ok(channel)
}

/// An AMQP short string (exchange, routing key, message id): at most 255 bytes.
fn short(field: &'static str, value: &str) -> Result<ShortString, Invalid> {
    ShortString::try_new(value).map_err(|_| {
        Invalid::new(
            field,
            format!("an AMQP short string is at most 255 bytes, got {}", value.len()),
        )
    })
}

/// The fence as AMQP message headers (long strings).
pub fn fence_headers(fence: &Fence) -> FieldTable {
    let mut headers = FieldTable::default();
    for (name, value) in fence_to_pairs(fence) {
        headers.insert(ShortString::from(name), AMQPValue::LongString(LongString::from(value)));
    }
    headers
}

/// Publishes `payload` with `fence` and `message_id` (unique per message,
/// 1..=255 bytes) to `exchange` with `routing_key` (`""` and the queue name
/// for the default exchange), persistent and mandatory, and waits for the
/// broker's confirm. `channel` must be in confirm mode ([`confirm_channel`]).
pub async fn publish(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    fence: &Fence,
    message_id: &str,
    payload: &[u8],
) -> Result<(), QueueError> {
    if message_id.is_empty() {
        return Err(Invalid::new("message_id", "must not be empty: consumers deduplicate by it").into());
    }
    let properties = BasicProperties::default()
        .with_headers(fence_headers(fence))
        .with_message_id(short("message_id", message_id)?)
        .with_delivery_mode(PERSISTENT);
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let exchange = short("exchange", exchange)?;
    let routing_key = short("routing_key", routing_key)?;
    let confirm = channel
        .basic_publish(exchange, routing_key, options, payload, properties)
        .await
        .map_err(QueueError::amqp("publishing"))?
        .await
        .map_err(QueueError::amqp("waiting for the publisher confirm"))?;
    let reason = match confirm {
        Confirmation::Ack(None) => return Ok(()),
        Confirmation::Ack(Some(_)) => "unroutable: no queue is bound for its routing key",
        Confirmation::Nack(_) => "the broker nacked it",
        Confirmation::NotRequested => "the channel is not in confirm mode (use amqp::confirm_channel)",
    };
    Err(QueueError::NotConfirmed {
        message_id: message_id.to_owned(),
        reason: reason.to_owned(),
    })
}

/// A header value as text, when it is one.
fn text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok(),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// The fence in AMQP headers: both fence headers must be UTF-8 strings.
fn fence_of(headers: Option<&FieldTable>) -> Result<Option<Fence>, Invalid> {
    let Some(headers) = headers else { return Ok(None) };
    let mut pairs = Vec::new();
    for (name, value) in headers.inner() {
        let name = name.as_str();
        if ![HEADER_RESOURCE, HEADER_TOKEN, HEADER_SIGNATURE]
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        // The value is named by its type, not shown: it may be as large as
        // the message's headers.
        let value = text(value).ok_or_else(|| {
            let got = match value {
                AMQPValue::LongString(s) => format!("{} bytes that are not UTF-8", s.as_bytes().len()),
                other => format!("a value of type {}", other.get_type()),
            };
            Invalid::new("header", format!("{name} must be a UTF-8 string, got {got}"))
        })?;
        pairs.push((name.to_owned(), value));
    }
    fence_from_pairs(pairs)
}

/// A count header as a number, when it is one.
fn count(value: &AMQPValue) -> Option<u64> {
    match *value {
        AMQPValue::LongLongInt(n) => u64::try_from(n).ok(),
        AMQPValue::LongInt(n) => u64::try_from(n).ok(),
        AMQPValue::LongUInt(n) => Some(u64::from(n)),
        AMQPValue::ShortInt(n) => u64::try_from(n).ok(),
        AMQPValue::ShortUInt(n) => Some(u64::from(n)),
        _ => None,
    }
}

/// The fence a delivery carries and the message as a handler sees it.
pub fn read(delivery: &Delivery) -> (Result<Option<Fence>, Invalid>, Message) {
    let headers = delivery.properties.headers().as_ref();
    let earlier = headers
        .and_then(|h| h.inner().get(DELIVERY_COUNT_HEADER))
        .and_then(count);
    let message = Message {
        id: delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_owned()),
        payload: delivery.data.clone(),
        deliveries: earlier.map(|n| n.saturating_add(1)),
        redelivered: delivery.redelivered || earlier.is_some_and(|n| n > 0),
    };
    (fence_of(headers), message)
}

/// Handles one delivery: reads its fence, runs `handler` if it has one,
/// settles it and then counts, logs and (when stale) calls back. An error
/// means the settle failed: nothing was counted, and the broker requeues
/// the message when the channel closes.
pub async fn handle<H, Fut>(delivery: &Delivery, settings: &Settings, handler: &H) -> Result<Verdict, QueueError>
where
    H: Fn(Fence, Message) -> Fut,
    Fut: Future<Output = Result<Handled, HandleError>>,
{
    let (fence, message) = read(delivery);
    let id = message.id.clone();
    let verdict = queue::run_handler(fence, message, handler).await;
    let acker = &delivery.acker;
    let settled = match verdict.settle(settings) {
        Settle::Ack => acker.ack(BasicAckOptions::default()).await,
        Settle::Drop => acker.reject(BasicRejectOptions { requeue: false }).await,
        Settle::Retry(delay) => {
            tokio::time::sleep(delay).await;
            let options = BasicNackOptions {
                multiple: false,
                requeue: true,
            };
            acker.nack(options).await
        }
    };
    match settled.map_err(QueueError::amqp("settling a delivery"))? {
        true => {
            queue::observe(settings, id.as_deref(), &verdict);
            Ok(verdict)
        }
        false => Err(QueueError::NotSettled {
            message_id: id.unwrap_or_else(|| "-".into()),
            reason: "its delivery was already settled or its channel failed".into(),
        }),
    }
}

/// Consumes `consumer` (started on `channel`) until `shutdown` completes (or
/// the consumer ends), handling one delivery at a time, and returns what it
/// saw. A failed settle is logged and the loop goes on;
/// [`queue::RECEIVE_ERRORS_MAX`] consumer errors in a row (its channel
/// closed) end it.
///
/// Before it returns it cancels the consumer (`basic.cancel`) and waits for
/// the broker's answer, so the channel can be closed at once: a
/// `lapin::Consumer` dropped while still active sends its cancel in the
/// background, and a close racing with that cancel fails, and with it the
/// connection. Deliveries it holds unacked stay so until the channel
/// closes, when the broker requeues them.
pub async fn consume<H, Fut>(
    channel: &Channel,
    consumer: lapin::Consumer,
    settings: &Settings,
    handler: H,
    shutdown: impl Future<Output = ()>,
) -> Result<Tally, QueueError>
where
    H: Fn(Fence, Message) -> Fut,
    Fut: Future<Output = Result<Handled, HandleError>>,
{
    let tag = consumer.tag();
    // Kept until the cancel below has been answered: dropped earlier, the
    // consumer would send a cancel of its own.
    let mut deliveries = consumer.map(|d| d.map_err(QueueError::amqp("receiving a delivery")));
    let handler = &handler;
    let tally = queue::consume_loop(&mut deliveries, settings, shutdown, |delivery| async move {
        handle(&delivery, settings, handler).await
    })
    .await;
    // A channel that failed or closed has no consumer left to cancel.
    if channel.status().connected() {
        let cancelled = channel.basic_cancel(tag, BasicCancelOptions::default()).await;
        if tally.is_ok() {
            cancelled.map_err(QueueError::amqp("cancelling the consumer"))?;
        }
    }
    drop(deliveries);
    tally
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_headers_read_back_and_non_strings_are_malformed() {
        let fence = Fence::from_parts("orders/42", "17").expect("valid");
        assert_eq!(fence_of(Some(&fence_headers(&fence))), Ok(Some(fence.clone())));
        assert_eq!(fence_of(None), Ok(None));
        assert_eq!(fence_of(Some(&FieldTable::default())), Ok(None));
        let mut numeric = fence_headers(&fence);
        numeric.insert(HEADER_TOKEN.into(), AMQPValue::LongLongInt(17));
        let e = fence_of(Some(&numeric)).expect_err("a numeric token header");
        assert!(e.to_string().contains(HEADER_TOKEN), "{e}");
        let mut binary = fence_headers(&fence);
        binary.insert(HEADER_RESOURCE.into(), AMQPValue::LongString(vec![0xff, 0xfe].into()));
        assert!(fence_of(Some(&binary)).is_err());
        // Named by its type or size, never echoed: it may be large.
        assert!(e.to_string().ends_with("got a value of type LongLongInt"), "{e}");
        let mut large = fence_headers(&fence);
        large.insert(HEADER_TOKEN.into(), AMQPValue::ByteArray(vec![7u8; 10_000].into()));
        let e = fence_of(Some(&large)).expect_err("a byte array");
        assert!(e.to_string().len() < 200, "{e}");
        large.insert(HEADER_TOKEN.into(), AMQPValue::LongString(vec![0xff; 10_000].into()));
        let e = fence_of(Some(&large)).expect_err("not UTF-8");
        assert!(e.to_string().ends_with("got 10000 bytes that are not UTF-8"), "{e}");
    }

    #[test]
    fn over_long_short_strings_are_refused_not_panicked_on() {
        let e = short("message_id", &"x".repeat(256)).expect_err("256 bytes");
        assert_eq!(e.field(), "message_id");
        assert!(short("message_id", &"x".repeat(255)).is_ok());
    }
}
