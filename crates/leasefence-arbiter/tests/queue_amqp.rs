//! Fenced consumers on the real RabbitMQ of `LEASEFENCE_TEST_AMQP_URL`,
//! applying effects to the real PostgreSQL of `LEASEFENCE_TEST_POSTGRES_URL`
//! through its arbiter (or a keyed one in a schema of its own, for signed
//! fences). Each test has its own queue, effects table and resources, and
//! removes them.

mod common;
mod queue_common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use leasefence_arbiter::queue::{DUPLICATE_METRIC, QueueError, Settings, Tally, UNFENCED_METRIC};
use leasefence_arbiter::{Fence, FenceKey, Token, amqp};
use queue_common::scenarios::{self, Broker, RUN_MAX};
use queue_common::signed::{self, DELIVERIES_MAX};
use queue_common::{AMQP_URL, Effects, cleaned, counter, hex};
use tokio::task::JoinHandle;

/// Deliveries the broker sends ahead of the one being handled.
const PREFETCH: u16 = 16;

struct Queue {
    connection: Connection,
    publisher: Channel,
    name: String,
}

impl Queue {
    async fn new(url: &str) -> Queue {
        Queue::open(url, FieldTable::default()).await
    }

    /// A quorum queue that delivers a message at most [`DELIVERIES_MAX`]
    /// times (its delivery limit counts the returns after the first), then
    /// drops it.
    async fn bounded(url: &str) -> Queue {
        let mut arguments = FieldTable::default();
        arguments.insert("x-queue-type".into(), AMQPValue::LongString(LongString::from("quorum")));
        let limit = i64::try_from(DELIVERIES_MAX - 1).expect("small");
        arguments.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(limit));
        Queue::open(url, arguments).await
    }

    async fn open(url: &str, arguments: FieldTable) -> Queue {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .expect("connect to RabbitMQ");
        let publisher = amqp::confirm_channel(&connection).await.expect("confirm channel");
        let name = format!("lfq.{}", hex());
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        publisher
            .queue_declare(name.as_str().into(), options, arguments)
            .await
            .expect("declare queue");
        Queue {
            connection,
            publisher,
            name,
        }
    }

    /// A publish outside the helper (no fence, or a broken one).
    async fn publish_raw(&self, headers: FieldTable, id: &str) {
        let properties = BasicProperties::default()
            .with_headers(headers)
            .with_message_id(id.into());
        let confirm = self
            .publisher
            .basic_publish(
                "".into(),
                self.name.as_str().into(),
                BasicPublishOptions::default(),
                id.as_bytes(),
                properties,
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
        assert!(confirm.is_ack());
    }

    /// A consumer on a channel of its own (closed after its run, so the
    /// broker requeues whatever it left unacked).
    async fn consumer(&self) -> (Channel, lapin::Consumer) {
        let channel = self.connection.create_channel().await.expect("channel");
        channel
            .basic_qos(PREFETCH, BasicQosOptions::default())
            .await
            .expect("qos");
        let consumer = channel
            .basic_consume(
                self.name.as_str().into(),
                format!("worker-{}", hex()).into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        (channel, consumer)
    }

    async fn close(channel: Channel) {
        channel.close(200, "done".into()).await.expect("close channel");
    }

    async fn cleanup(&self) {
        self.publisher
            .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
            .await
            .expect("delete queue");
        self.connection.close(200, "done".into()).await.expect("close");
    }
}

impl Broker for Queue {
    async fn publish(&self, fence: &Fence, id: &str) {
        amqp::publish(&self.publisher, "", &self.name, fence, id, id.as_bytes())
            .await
            .expect("publish");
    }

    async fn run(&self, fx: &Arc<Effects>, settings: &Settings, fenced: bool, calls: u64) -> Tally {
        let (channel, consumer) = self.consumer().await;
        let consume = amqp::consume(&channel, consumer, settings, fx.handler(fenced), fx.after_calls(calls));
        let tally = tokio::time::timeout(RUN_MAX, consume)
            .await
            .expect("consumer finished in time")
            .expect("consumer ran");
        Queue::close(channel).await;
        tally
    }

    /// With every consumer's channel closed (unacked deliveries requeued),
    /// the queue is empty and a new consumer gets nothing.
    async fn start(&self, fx: &Arc<Effects>, settings: &Settings, calls: u64) -> JoinHandle<Tally> {
        let (channel, consumer) = self.consumer().await;
        let (settings, fx) = (settings.clone(), fx.clone());
        tokio::spawn(async move {
            let consume = amqp::consume(&channel, consumer, &settings, fx.handler(true), fx.after_calls(calls));
            let tally = consume.await.expect("consumer ran");
            Queue::close(channel).await;
            tally
        })
    }

    async fn assert_drained(&self, fx: &Arc<Effects>, settings: &Settings) {
        let calls = fx.calls.load(Ordering::SeqCst);
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let queue = self
            .publisher
            .queue_declare(self.name.as_str().into(), passive, FieldTable::default())
            .await
            .expect("queue state");
        assert_eq!(queue.message_count(), 0, "nothing left in the queue");
        let (channel, consumer) = self.consumer().await;
        let quiet = amqp::consume(
            &channel,
            consumer,
            settings,
            fx.handler(true),
            tokio::time::sleep(Duration::from_secs(1)),
        );
        assert_eq!(
            quiet.await.expect("consumer ran"),
            Tally::default(),
            "no message was delivered again"
        );
        Queue::close(channel).await;
        assert_eq!(fx.calls.load(Ordering::SeqCst), calls);
    }
}

async fn setup(name: &str) -> Option<(Arc<Effects>, Queue)> {
    let url = common::service_url(AMQP_URL)?;
    let fx = Effects::new(name).await?;
    let queue = Queue::new(&url).await;
    Some((fx, queue))
}

/// A keyed arbiter holding `key` and a queue that bounds redeliveries.
async fn setup_keyed(name: &str, key: &FenceKey) -> Option<(Arc<Effects>, Queue)> {
    let url = common::service_url(AMQP_URL)?;
    let fx = Effects::keyed(name, key).await?;
    let queue = Queue::bounded(&url).await;
    Some((fx, queue))
}

async fn cleanup(fx: &Effects, queue: &Queue) {
    fx.cleanup().await;
    queue.cleanup().await;
}

fn token(t: u64) -> Token {
    Token::new(t).expect("non-zero")
}

#[tokio::test]
async fn a_stale_message_published_last_is_rejected_acked_once_counted_and_handed_over() {
    let Some((fx, queue)) = setup("amqp-stale-last").await else {
        return;
    };
    let body = async {
        scenarios::stale_published_last(&fx, &queue, "amqp-stale-last").await;
    };
    cleaned(body, cleanup(&fx, &queue)).await;
}

#[tokio::test]
async fn a_stale_message_published_first_but_delivered_after_newer_ones_is_rejected() {
    let Some((fx, queue)) = setup("amqp-stale-first").await else {
        return;
    };
    let body = async {
        scenarios::stale_published_first(&fx, &queue, "amqp-stale-first").await;
    };
    cleaned(body, cleanup(&fx, &queue)).await;
}

/// `m` is published twice with one message id; `n` is applied and then its
/// ack is lost, so the broker delivers it again. Each is applied once.
#[tokio::test]
async fn a_duplicate_or_redelivered_message_is_applied_once() {
    let Some((fx, queue)) = setup("amqp-redelivery").await else {
        return;
    };
    let body = async {
        let fence = Fence::new(fx.resource(0), token(1));
        queue.publish(&fence, "m").await;
        queue.publish(&fence, "m").await;
        fx.lose_first_ack.lock().expect("lock").push("n".into());
        queue.publish(&fence, "n").await;
        let label = format!("amqp-redelivery-{}", hex());
        let settings = Settings::new(&label).with_retry_delay(Duration::from_millis(20));
        let tally = queue.run(&fx, &settings, true, 4).await;
        assert_eq!(
            tally,
            Tally {
                applied: 1,
                retried: 1,
                duplicate: 2,
                ..Tally::default()
            }
        );
        assert_eq!(counter(DUPLICATE_METRIC, &label), 2);
        let ids: Vec<_> = fx.effects().await.into_iter().map(|e| e.message_id).collect();
        assert_eq!(ids, vec!["m", "n"]);
        queue.assert_drained(&fx, &settings).await;
    };
    cleaned(body, cleanup(&fx, &queue)).await;
}

#[tokio::test]
async fn unfenced_and_malformed_messages_are_dropped_once_and_counted() {
    let Some((fx, queue)) = setup("amqp-unfenced").await else {
        return;
    };
    let body = async {
        queue.publish_raw(FieldTable::default(), "plain").await;
        let mut numeric = amqp::fence_headers(&Fence::new(fx.resource(0), token(1)));
        numeric.insert("leasefence-token".into(), AMQPValue::LongLongInt(1));
        queue.publish_raw(numeric, "numeric").await;
        queue.publish(&Fence::new(fx.resource(0), token(1)), "fenced").await;

        let label = format!("amqp-unfenced-{}", hex());
        let settings = Settings::new(&label);
        let tally = queue.run(&fx, &settings, true, 1).await;
        assert_eq!(
            tally,
            Tally {
                applied: 1,
                unfenced: 2,
                ..Tally::default()
            }
        );
        assert_eq!(counter(UNFENCED_METRIC, &label), 2);
        assert_eq!(
            fx.calls.load(Ordering::SeqCst),
            1,
            "only the fenced message reached the handler"
        );
        queue.assert_drained(&fx, &settings).await;
    };
    cleaned(body, cleanup(&fx, &queue)).await;
}

#[tokio::test]
async fn publish_refuses_an_unroutable_message_and_an_empty_id() {
    let Some((fx, queue)) = setup("amqp-publish").await else {
        return;
    };
    let body = async {
        let fence = Fence::new(fx.resource(0), token(1));
        let unroutable = amqp::publish(&queue.publisher, "", "lfq.nobody-listens", &fence, "x", b"x").await;
        assert!(
            matches!(&unroutable, Err(QueueError::NotConfirmed { .. })),
            "{unroutable:?}"
        );
        let no_id = amqp::publish(&queue.publisher, "", &queue.name, &fence, "", b"x").await;
        assert!(matches!(&no_id, Err(QueueError::Invalid(_))), "{no_id:?}");
        let plain = queue.connection.create_channel().await.expect("channel");
        let unconfirmed = amqp::publish(&plain, "", &queue.name, &fence, "y", b"y").await;
        assert!(
            matches!(&unconfirmed, Err(QueueError::NotConfirmed { .. })),
            "{unconfirmed:?}"
        );
        Queue::close(plain).await;
    };
    cleaned(body, cleanup(&fx, &queue)).await;
}

/// The broker delivers the `leasefence-signature` header as published, and
/// `amqp::read` hands the fence back with its signature.
#[tokio::test]
async fn a_signed_fence_is_read_back_with_its_signature() {
    let Some(url) = common::service_url(AMQP_URL) else {
        return;
    };
    let queue = Queue::new(&url).await;
    let body = async {
        let unsigned = Fence::new(common::unique_resource("amqp-read-signed"), token(5));
        let signed = unsigned.clone().with_signature(signed::key().sign(&unsigned));
        queue.publish(&signed, "m").await;
        let got = queue
            .publisher
            .basic_get(queue.name.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("get")
            .expect("the message is in the queue");
        let headers = got.delivery.properties.headers().as_ref().expect("headers");
        let signature = signed.signature.clone().expect("signed");
        assert_eq!(
            headers.inner().get(leasefence_core::HEADER_SIGNATURE),
            Some(&AMQPValue::LongString(LongString::from(signature))),
            "the broker delivers the signature header"
        );
        let (fence, _) = amqp::read(&got.delivery);
        assert_eq!(fence, Ok(Some(signed)), "read keeps the signature");
    };
    cleaned(body, queue.cleanup()).await;
}

#[tokio::test]
async fn a_signed_message_is_applied_once_by_a_consumer_whose_arbiter_holds_the_key() {
    let key = signed::key();
    let Some((fx, queue)) = setup_keyed("amqp-signed", &key).await else {
        return;
    };
    let body = async {
        signed::signed_applied_once(&fx, &queue, &key, "amqp-signed").await;
    };
    cleaned(body, cleanup(&fx, &queue)).await;
}

#[tokio::test]
async fn tampered_and_unsigned_messages_are_dropped_as_poison_on_first_delivery_and_never_applied() {
    let key = signed::key();
    let Some((fx, queue)) = setup_keyed("amqp-tampered", &key).await else {
        return;
    };
    let body = async {
        signed::tampered_refused(&fx, &queue, &key, "amqp-tampered").await;
    };
    cleaned(body, cleanup(&fx, &queue)).await;
}

#[tokio::test]
async fn a_message_under_a_key_not_yet_installed_is_retried_and_applies_once_the_key_is() {
    let Some((fx, queue)) = setup_keyed("amqp-unknown-key", &signed::key()).await else {
        return;
    };
    let body = async {
        signed::unknown_key_applies_once_installed(&fx, &queue, "amqp-unknown-key").await;
    };
    cleaned(body, cleanup(&fx, &queue)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_trials_through_the_arbiter_apply_no_stale_effect() {
    let Some((fx, queue)) = setup("amqp-trials").await else {
        return;
    };
    let body = async {
        scenarios::trials_fenced(&fx, &queue, "amqp-trials").await;
    };
    cleaned(body, cleanup(&fx, &queue)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_trials_without_the_arbiter_apply_stale_effects() {
    let Some((fx, queue)) = setup("amqp-control").await else {
        return;
    };
    let body = async {
        scenarios::trials_control(&fx, &queue, "amqp-control").await;
    };
    cleaned(body, cleanup(&fx, &queue)).await;
}

/// A consumer that has stopped leaves its channel ready to close: `consume`
/// cancels it before returning, so no cancel of lapin's is still on its way
/// when the channel closes (that race failed the close, and the connection
/// with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_closes_cleanly_right_after_its_consumer_stops() {
    let Some((fx, queue)) = setup("amqp-close").await else {
        return;
    };
    let body = async {
        let settings = Settings::new(format!("amqp-close-{}", hex()));
        let fence = Fence::new(fx.resource(0), token(1));
        // Each run stops after a message or a few, with more delivered unacked.
        for round in 0..150u64 {
            for id in 0..4 {
                queue.publish(&fence, &format!("m{round}.{id}")).await;
            }
            let (channel, consumer) = queue.consumer().await;
            let stop = fx.after_calls(fx.calls.load(Ordering::SeqCst) + 1);
            let tally = amqp::consume(&channel, consumer, &settings, fx.handler(true), stop)
                .await
                .expect("consumer ran");
            assert!(tally.applied >= 1, "round {round}: {tally:?}");
            if let Err(e) = channel.close(200, "done".into()).await {
                panic!("round {round}: closing the channel after its consumer stopped: {e}");
            }
        }
        queue.publish(&fence, "after").await;
    };
    cleaned(body, cleanup(&fx, &queue)).await;
}
