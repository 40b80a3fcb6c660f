//! Signed fences through a broker, written once against [`Broker`]: the
//! consumer applies through a PostgreSQL arbiter that holds the fence key
//! (a schema of its own, so the key binds no other test), and only a fence
//! the key signed, with the signature carried in the message headers,
//! applies.
//!
//! A fence whose signature is missing or does not match is poison to the
//! consumer: refused once and dropped. One signed under a key the arbiter
//! does not hold yet is a failure, requeued after the failure delay, and
//! applies once the key is installed. The brokers of these tests bound
//! deliveries at [`DELIVERIES_MAX`], so a message the consumer wrongly
//! requeued would come back, and be counted, that often.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leasefence_arbiter::postgres::{self, Schema};
use leasefence_arbiter::queue::{
    APPLIED_METRIC, DUPLICATE_METRIC, FAILED_METRIC, POISON_METRIC, STALE_METRIC, Settings, Tally, UNFENCED_METRIC,
};
use leasefence_arbiter::{Fence, FenceKey, Token};

use super::scenarios::Broker;
use super::{Effect, Effects, counter, hex, snapshotter};
use crate::common::{self, POSTGRES_URL};

/// Deliveries the broker makes of one message before it gives up on it
/// (JetStream's `max_deliver`, a quorum queue's `x-delivery-limit` plus one).
pub const DELIVERIES_MAX: u64 = 2;

/// The failure delay of the consumers here: a refused message comes back
/// after it.
const FAILURE_DELAY: Duration = Duration::from_millis(20);

/// A fresh key: the one the coordinator signs with and the arbiter holds.
pub fn key() -> FenceKey {
    FenceKey::new("queue-k1", key_bytes()).expect("valid key")
}

fn key_bytes() -> [u8; 32] {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).expect("os randomness");
    secret
}

fn token(t: u64) -> Token {
    Token::new(t).expect("non-zero")
}

impl Effects {
    /// The effects table of a test called `name`, applied through an
    /// arbiter in a fresh schema that holds `key`: from the start it refuses
    /// every fence `key` did not sign. `None`: no PostgreSQL configured.
    pub async fn keyed(name: &str, key: &FenceKey) -> Option<Arc<Effects>> {
        let url = common::service_url(POSTGRES_URL)?;
        snapshotter(); // before anything counts
        let mut client = postgres::connect(&url).await.expect("connect");
        common::pgcrypto_in_public(&mut client).await;
        let schema = format!("lf_queue_keyed_{}", hex());
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .expect("create schema");
        let schema = Schema::new(&schema).expect("valid name");
        schema.install(&mut client).await.expect("install");
        schema.add_fence_key(&client, key).await.expect("add key");
        Some(Arc::new(Effects::on(client, schema, name).await))
    }
}

fn settings(name: &str) -> (Settings, String) {
    let label = format!("{name}-{}", hex());
    let settings = Settings::new(&label).with_failure_delay(FAILURE_DELAY);
    (settings, label)
}

/// The counters of `label`: (applied, duplicate, stale, unfenced, poison,
/// failed).
fn counters(label: &str) -> [u64; 6] {
    [
        APPLIED_METRIC,
        DUPLICATE_METRIC,
        STALE_METRIC,
        UNFENCED_METRIC,
        POISON_METRIC,
        FAILED_METRIC,
    ]
    .map(|metric| counter(metric, label))
}

/// A fence signed with `key` (the arbiter's) travels in the message headers
/// and is applied once: one effect, its token recorded, nothing refused,
/// and the message is never delivered again.
pub async fn signed_applied_once(fx: &Arc<Effects>, broker: &impl Broker, key: &FenceKey, name: &str) {
    let r = fx.resource(0);
    let unsigned = Fence::new(r.clone(), token(5));
    let signed = unsigned.clone().with_signature(key.sign(&unsigned));
    broker.publish(&signed, "m").await;

    let (settings, label) = settings(name);
    let tally = broker.run(fx, &settings, true, 1).await;
    assert_eq!(*fx.refused.lock().expect("lock"), [], "the arbiter refused nothing");
    let expected = Tally {
        applied: 1,
        ..Tally::default()
    };
    assert_eq!(tally, expected);
    assert_eq!(counters(&label), [1, 0, 0, 0, 0, 0]);
    let applied = Effect {
        resource: r.as_str().to_owned(),
        token: 5,
        message_id: "m".into(),
    };
    assert_eq!(fx.effects().await, [applied]);
    assert_eq!(fx.last_token(&r).await, Some(token(5)));
    broker.assert_drained(fx, &settings).await;
}

/// Beside a signed message, three that are not signed for what they carry:
/// `raised` (its token raised from 5 to 6 after signing), `altered` (the
/// MAC's last digit changed) and `stripped` (no signature header). The
/// arbiter refuses each, `mismatch`, `mismatch` and `missing`; none leaves
/// an effect or a token. The consumer drops each as poison on its first
/// delivery, and none comes back; the signed message is applied once, in
/// the same run.
pub async fn tampered_refused(fx: &Arc<Effects>, broker: &impl Broker, key: &FenceKey, name: &str) {
    let fence = |i: usize, t: u64| Fence::new(fx.resource(i), token(t));
    let signed = fence(0, 5).with_signature(key.sign(&fence(0, 5)));
    let raised = fence(1, 6).with_signature(key.sign(&fence(1, 5)));
    let mut mac = key.sign(&fence(2, 5));
    let last = if mac.ends_with('0') { "1" } else { "0" };
    mac.replace_range(mac.len() - 1.., last);
    let altered = fence(2, 5).with_signature(mac);
    let stripped = fence(3, 5);
    for (f, id) in [
        (&raised, "raised"),
        (&signed, "signed"),
        (&altered, "altered"),
        (&stripped, "stripped"),
    ] {
        broker.publish(f, id).await;
    }

    let (settings, label) = settings(name);
    let tally = broker.run(fx, &settings, true, 4).await;
    let mut refused: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (id, reason) in fx.refused.lock().expect("lock").iter() {
        refused.entry(id.clone()).or_default().push(reason.reason());
    }
    let expected = BTreeMap::from([
        ("altered".to_owned(), vec!["mismatch"]),
        ("raised".to_owned(), vec!["mismatch"]),
        ("stripped".to_owned(), vec!["missing"]),
    ]);
    assert_eq!(refused, expected, "each refused once, for its reason");
    let expected = Tally {
        applied: 1,
        poison: 3,
        ..Tally::default()
    };
    assert_eq!(tally, expected);
    assert_eq!(counters(&label), [1, 0, 0, 0, 3, 0]);
    let ids: Vec<_> = fx
        .effects()
        .await
        .into_iter()
        .map(|e| (e.message_id, e.token))
        .collect();
    assert_eq!(ids, [("signed".to_owned(), 5)]);
    assert_eq!(fx.last_token(&fx.resource(0)).await, Some(token(5)));
    for i in 1..=3 {
        assert_eq!(fx.last_token(&fx.resource(i)).await, None, "no token recorded for {i}");
    }
    broker.assert_drained(fx, &settings).await;
    assert_eq!(counters(&label), [1, 0, 0, 0, 3, 0], "none came back");
    assert_eq!(fx.refused.lock().expect("lock").len(), 3, "none was handled again");
}

/// A message signed under a key the arbiter does not hold yet (`k2`, as
/// while a rotation is under way): its first delivery is refused
/// `unknown_key`, counted as failed and requeued; the key is installed
/// (the handler does it after that refusal, as the operator would), and
/// the redelivery applies it, once.
pub async fn unknown_key_applies_once_installed(fx: &Arc<Effects>, broker: &impl Broker, name: &str) {
    let next = FenceKey::new("queue-k2", key_bytes()).expect("valid key");
    *fx.install_after_unknown_key.lock().expect("lock") = Some(next.clone());
    let unsigned = Fence::new(fx.resource(0), token(5));
    broker
        .publish(&unsigned.clone().with_signature(next.sign(&unsigned)), "m")
        .await;

    let (settings, label) = settings(name);
    let tally = broker.run(fx, &settings, true, 2).await;
    let refused: Vec<_> = fx
        .refused
        .lock()
        .expect("lock")
        .iter()
        .map(|(id, reason)| (id.clone(), reason.reason()))
        .collect();
    assert_eq!(
        refused,
        [("m".to_owned(), "unknown_key")],
        "refused once, before the key"
    );
    let expected = Tally {
        applied: 1,
        failed: 1,
        ..Tally::default()
    };
    assert_eq!(tally, expected);
    let ids: Vec<_> = fx.effects().await.into_iter().map(|e| e.message_id).collect();
    assert_eq!(ids, ["m"]);
    assert_eq!(fx.last_token(&fx.resource(0)).await, Some(token(5)));
    broker.assert_drained(fx, &settings).await;
    assert_eq!(counters(&label), [1, 0, 0, 0, 0, 1], "none came back");
}
