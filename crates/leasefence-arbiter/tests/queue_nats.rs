//! Fenced consumers on the real NATS JetStream of `LEASEFENCE_TEST_NATS_URL`,
//! applying effects to the real PostgreSQL of `LEASEFENCE_TEST_POSTGRES_URL`
//! through its arbiter (or a keyed one in a schema of its own, for signed
//! fences). Each test has its own stream, consumer, effects table and
//! resources, and removes them.

mod common;
mod queue_common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, AckPolicy, PullConsumer};
use async_nats::jetstream::context::{CreateStreamError, CreateStreamErrorKind};
use async_nats::jetstream::{self, Context, ErrorCode, stream};
use futures_util::StreamExt;
use leasefence_arbiter::queue::{DUPLICATE_METRIC, Settings, Tally, UNFENCED_METRIC};
use leasefence_arbiter::{Fence, FenceKey, Token, nats};
use queue_common::scenarios::{self, Broker, RUN_MAX};
use queue_common::signed::{self, DELIVERIES_MAX};
use queue_common::{Effects, NATS_URL, check, cleaned, counter, hex};
use tokio::task::JoinHandle;

/// How long the consumer waits for an ack before it redelivers: a message
/// left unacked comes back within it.
const ACK_WAIT: Duration = Duration::from_secs(2);

struct Stream {
    js: Context,
    name: String,
    subject: String,
    consumer: PullConsumer,
}

impl Stream {
    async fn new(url: &str) -> Stream {
        Stream::open(url, 0).await
    }

    /// A stream whose consumer delivers a message at most
    /// [`DELIVERIES_MAX`] times.
    async fn bounded(url: &str) -> Stream {
        let max_deliver = i64::try_from(DELIVERIES_MAX).expect("small");
        Stream::open(url, max_deliver).await
    }

    /// `max_deliver` 0: the server's default, unbounded.
    async fn open(url: &str, max_deliver: i64) -> Stream {
        let client = async_nats::connect(url).await.expect("connect to NATS");
        let js = jetstream::new(client);
        let id = hex();
        let (name, subject) = (format!("LFQ_{id}"), format!("lfq.{id}.jobs"));
        let config = stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        };
        let stream = create_stream(&js, config).await;
        let consumer = stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some(format!("worker_{id}")),
                ack_policy: AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_deliver,
                ..Default::default()
            })
            .await
            .expect("create consumer");
        Stream {
            js,
            name,
            subject,
            consumer,
        }
    }

    async fn cleanup(&self) {
        self.js.delete_stream(&self.name).await.expect("delete stream");
    }
}

/// Creates a stream, trying again while the server answers
/// [`ErrorCode::STREAM_CREATE`] for a directory it removed under it.
///
/// nats-server (2.9 here) removes an account's `streams` directory, and the
/// account's own, when its last stream is deleted. A stream created at that
/// moment fails to make its directory inside them ("could not create storage
/// directory ... no such file or directory" in the server's log), and the
/// tests here create and delete streams side by side. Any other error, or
/// this one [`CREATE_ATTEMPTS`] times in a row, fails the test.
async fn create_stream(js: &Context, config: stream::Config) -> stream::Stream {
    let mut attempt = 1;
    loop {
        match js.create_stream(config.clone()).await {
            Ok(stream) => return stream,
            Err(e) if attempt < CREATE_ATTEMPTS && is_store_race(&e) => {
                tokio::time::sleep(Duration::from_millis(10 * u64::from(attempt))).await;
                attempt += 1;
            }
            Err(e) => panic!("create stream {} (attempt {attempt}): {e:?}", config.name),
        }
    }
}

/// How many times [`create_stream`] tries before it fails the test.
const CREATE_ATTEMPTS: u32 = 10;

fn is_store_race(e: &CreateStreamError) -> bool {
    matches!(e.kind(), CreateStreamErrorKind::JetStream(e) if e.error_code() == ErrorCode::STREAM_CREATE)
}

impl Broker for Stream {
    async fn publish(&self, fence: &Fence, id: &str) {
        let ack = nats::publish(&self.js, &self.subject, fence, Some(id), id.as_bytes().to_vec())
            .await
            .expect("publish");
        assert!(!ack.duplicate, "{id} published twice");
    }

    async fn run(&self, fx: &Arc<Effects>, settings: &Settings, fenced: bool, calls: u64) -> Tally {
        let consume = nats::consume(&self.consumer, settings, fx.handler(fenced), fx.after_calls(calls));
        tokio::time::timeout(RUN_MAX, consume)
            .await
            .expect("consumer finished in time")
            .expect("consumer ran")
    }

    async fn start(&self, fx: &Arc<Effects>, settings: &Settings, calls: u64) -> JoinHandle<Tally> {
        let (consumer, settings, fx) = (self.consumer.clone(), settings.clone(), fx.clone());
        tokio::spawn(async move {
            let consume = nats::consume(&consumer, &settings, fx.handler(true), fx.after_calls(calls));
            consume.await.expect("consumer ran")
        })
    }

    /// Also waits out the ack wait twice over: an unacked message would
    /// come back within it.
    async fn assert_drained(&self, fx: &Arc<Effects>, settings: &Settings) {
        let calls = fx.calls.load(Ordering::SeqCst);
        let quiet = nats::consume(
            &self.consumer,
            settings,
            fx.handler(true),
            tokio::time::sleep(ACK_WAIT * 2),
        );
        assert_eq!(
            quiet.await.expect("consumer ran"),
            Tally::default(),
            "no message was delivered again"
        );
        assert_eq!(fx.calls.load(Ordering::SeqCst), calls);
        let info = self.consumer.get_info().await.expect("consumer info");
        assert_eq!((info.num_pending, info.num_ack_pending), (0, 0), "{info:?}");
    }
}

async fn setup(name: &str) -> Option<(Arc<Effects>, Stream)> {
    let url = common::service_url(NATS_URL)?;
    let fx = Effects::new(name).await?;
    let stream = Stream::new(&url).await;
    Some((fx, stream))
}

/// A keyed arbiter holding `key` and a stream that bounds redeliveries.
async fn setup_keyed(name: &str, key: &FenceKey) -> Option<(Arc<Effects>, Stream)> {
    let url = common::service_url(NATS_URL)?;
    let fx = Effects::keyed(name, key).await?;
    let stream = Stream::bounded(&url).await;
    Some((fx, stream))
}

async fn cleanup(fx: &Effects, stream: &Stream) {
    fx.cleanup().await;
    stream.cleanup().await;
}

fn fence(fx: &Effects, token: u64) -> Fence {
    Fence::new(fx.resource(0), Token::new(token).expect("non-zero"))
}

/// The tests here run side by side, each creating its stream and deleting
/// it when done; setting one up must not fail because another test has
/// just deleted the last stream of the server. Two tasks churning 300
/// streams each meet that moment a few times a run; without
/// [`create_stream`]'s retry, two runs in three failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_set_up_while_other_tests_delete_theirs() {
    let Some(url) = common::service_url(NATS_URL) else {
        return;
    };
    let churn = (0..2).map(|_| {
        let url = url.clone();
        tokio::spawn(async move {
            for _ in 0..300 {
                Stream::new(&url).await.cleanup().await;
            }
        })
    });
    for task in churn.collect::<Vec<_>>() {
        task.await.expect("every stream was set up and deleted");
    }
}

#[tokio::test]
async fn a_stale_message_published_last_is_rejected_acked_once_counted_and_handed_over() {
    let Some((fx, stream)) = setup("nats-stale-last").await else {
        return;
    };
    let body = async {
        scenarios::stale_published_last(&fx, &stream, "nats-stale-last").await;
    };
    cleaned(body, cleanup(&fx, &stream)).await;
}

#[tokio::test]
async fn a_stale_message_published_first_but_delivered_after_newer_ones_is_rejected() {
    let Some((fx, stream)) = setup("nats-stale-first").await else {
        return;
    };
    let body = async {
        scenarios::stale_published_first(&fx, &stream, "nats-stale-first").await;
    };
    cleaned(body, cleanup(&fx, &stream)).await;
}

/// The first delivery applies and commits, then its ack is lost (the
/// handler naks it); the redelivery finds the message id committed with the
/// effect and is acked without applying again. (A second publish with the
/// same `Nats-Msg-Id` never reaches a consumer: JetStream drops it.)
#[tokio::test]
async fn a_redelivered_message_is_applied_once() {
    let Some((fx, stream)) = setup("nats-redelivery").await else {
        return;
    };
    let body = async {
        fx.lose_first_ack.lock().expect("lock").push("m".into());
        stream.publish(&fence(&fx, 1), "m").await;
        let queue = format!("nats-redelivery-{}", hex());
        let settings = Settings::new(&queue).with_retry_delay(Duration::from_millis(20));
        let tally = stream.run(&fx, &settings, true, 2).await;
        let expected = Tally {
            retried: 1,
            duplicate: 1,
            ..Tally::default()
        };
        assert_eq!(tally, expected);
        assert_eq!(counter(DUPLICATE_METRIC, &queue), 1);
        assert_eq!(check(&fx.effects().await).effects, 1);
        let again = nats::publish(&stream.js, &stream.subject, &fence(&fx, 1), Some("m"), "m".as_bytes())
            .await
            .expect("publish");
        assert!(again.duplicate, "JetStream drops a republish with the same id");
        stream.assert_drained(&fx, &settings).await;
    };
    cleaned(body, cleanup(&fx, &stream)).await;
}

#[tokio::test]
async fn unfenced_and_malformed_messages_are_dropped_once_and_counted() {
    let Some((fx, stream)) = setup("nats-unfenced").await else {
        return;
    };
    let body = async {
        let plain = stream
            .js
            .publish(stream.subject.clone(), "no fence".into())
            .await
            .expect("publish");
        plain.await.expect("ack");
        let mut half = async_nats::HeaderMap::new();
        half.insert("leasefence-token", "7");
        let malformed = stream
            .js
            .publish_with_headers(stream.subject.clone(), half, "half a fence".into())
            .await
            .expect("publish");
        malformed.await.expect("ack");
        stream.publish(&fence(&fx, 1), "fenced").await;

        let queue = format!("nats-unfenced-{}", hex());
        let settings = Settings::new(&queue);
        let tally = stream.run(&fx, &settings, true, 1).await;
        let expected = Tally {
            applied: 1,
            unfenced: 2,
            ..Tally::default()
        };
        assert_eq!(tally, expected);
        assert_eq!(counter(UNFENCED_METRIC, &queue), 2);
        assert_eq!(
            fx.calls.load(Ordering::SeqCst),
            1,
            "only the fenced message reached the handler"
        );
        stream.assert_drained(&fx, &settings).await;
    };
    cleaned(body, cleanup(&fx, &stream)).await;
}

#[test]
fn a_message_id_or_resource_a_header_cannot_hold_is_refused() {
    let f = Fence::new(
        leasefence_arbiter::ResourceId::new("r").expect("valid"),
        Token::new(1).expect("non-zero"),
    );
    let e = nats::fence_headers(&f, Some("a\r\nb")).expect_err("CR LF");
    assert_eq!(e.field(), "message_id");
    assert!(nats::fence_headers(&f, Some("")).is_err());
    let headers = nats::fence_headers(&f, Some("id-1")).expect("headers");
    assert_eq!(headers.get(nats::MSG_ID_HEADER).map(|v| v.as_str()), Some("id-1"));
}

/// The stream delivers the `leasefence-signature` header as published, and
/// `nats::read` hands the fence back with its signature.
#[tokio::test]
async fn a_signed_fence_is_read_back_with_its_signature() {
    let Some(url) = common::service_url(NATS_URL) else {
        return;
    };
    let stream = Stream::new(&url).await;
    let body = async {
        let unsigned = Fence::new(
            common::unique_resource("nats-read-signed"),
            Token::new(5).expect("non-zero"),
        );
        let signed = unsigned.clone().with_signature(signed::key().sign(&unsigned));
        stream.publish(&signed, "m").await;
        let mut batch = stream
            .consumer
            .fetch()
            .max_messages(1)
            .expires(RUN_MAX)
            .messages()
            .await
            .expect("fetch");
        let msg = batch
            .next()
            .await
            .expect("the message is in the stream")
            .expect("received");
        let signature = signed.signature.clone().expect("signed");
        let header = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(leasefence_core::HEADER_SIGNATURE));
        assert_eq!(
            header.map(|v| v.as_str()),
            Some(signature.as_str()),
            "the stream delivers the signature header"
        );
        let (fence, _) = nats::read(&msg);
        assert_eq!(fence, Ok(Some(signed)), "read keeps the signature");
        msg.ack().await.expect("ack");
    };
    cleaned(body, stream.cleanup()).await;
}

#[tokio::test]
async fn a_signed_message_is_applied_once_by_a_consumer_whose_arbiter_holds_the_key() {
    let key = signed::key();
    let Some((fx, stream)) = setup_keyed("nats-signed", &key).await else {
        return;
    };
    let body = async {
        signed::signed_applied_once(&fx, &stream, &key, "nats-signed").await;
    };
    cleaned(body, cleanup(&fx, &stream)).await;
}

#[tokio::test]
async fn tampered_and_unsigned_messages_are_dropped_as_poison_on_first_delivery_and_never_applied() {
    let key = signed::key();
    let Some((fx, stream)) = setup_keyed("nats-tampered", &key).await else {
        return;
    };
    let body = async {
        signed::tampered_refused(&fx, &stream, &key, "nats-tampered").await;
    };
    cleaned(body, cleanup(&fx, &stream)).await;
}

#[tokio::test]
async fn a_message_under_a_key_not_yet_installed_is_retried_and_applies_once_the_key_is() {
    let Some((fx, stream)) = setup_keyed("nats-unknown-key", &signed::key()).await else {
        return;
    };
    let body = async {
        signed::unknown_key_applies_once_installed(&fx, &stream, "nats-unknown-key").await;
    };
    cleaned(body, cleanup(&fx, &stream)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_trials_through_the_arbiter_apply_no_stale_effect() {
    let Some((fx, stream)) = setup("nats-trials").await else {
        return;
    };
    let body = async {
        scenarios::trials_fenced(&fx, &stream, "nats-trials").await;
    };
    cleaned(body, cleanup(&fx, &stream)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_trials_without_the_arbiter_apply_stale_effects() {
    let Some((fx, stream)) = setup("nats-control").await else {
        return;
    };
    let body = async {
        scenarios::trials_control(&fx, &stream, "nats-control").await;
    };
    cleaned(body, cleanup(&fx, &stream)).await;
}
