//! The scenarios both brokers run, written once against [`Broker`]: the
//! issue's stale message (published last, the pause story; and published
//! first but delivered after the newer holder's), and the trials with
//! their control.

use std::sync::Arc;
use std::time::Duration;

use leasefence_arbiter::queue::{APPLIED_METRIC, STALE_METRIC, Settings, Tally};
use leasefence_arbiter::{Fence, Stale, Token};
use tokio::task::JoinHandle;

use super::{Check, Effects, Plan, check, counter, hex, plan, stale_sink};

/// The longest a consumer run may take.
pub const RUN_MAX: Duration = Duration::from_secs(60);
pub const TRIALS: usize = 200;

/// One queue (stream or RabbitMQ queue) with a fenced consumer on it.
#[allow(async_fn_in_trait)]
pub trait Broker {
    /// Publishes with the library's publisher and waits for the broker.
    async fn publish(&self, fence: &Fence, id: &str);
    /// Consumes until the handler was called `calls` times.
    async fn run(&self, fx: &Arc<Effects>, settings: &Settings, fenced: bool, calls: u64) -> Tally;
    /// The same (fenced) on a task of its own.
    async fn start(&self, fx: &Arc<Effects>, settings: &Settings, calls: u64) -> JoinHandle<Tally>;
    /// Nothing is left to deliver or unacked, and nothing comes back:
    /// every message was settled for good.
    async fn assert_drained(&self, fx: &Arc<Effects>, settings: &Settings);
}

fn token(t: u64) -> Token {
    Token::new(t).expect("non-zero")
}

/// What A (token 5) and B (token 6) leave when A's one message comes last.
async fn assert_only_b_applied(fx: &Effects, seen: &[Stale], fence_of_a: &Fence) {
    let expected = Stale {
        resource: fence_of_a.resource.clone(),
        presented: token(5),
        current: token(6),
    };
    assert_eq!(seen, [expected], "on_stale was handed the rejection once");
    let ids: Vec<_> = fx
        .effects()
        .await
        .into_iter()
        .map(|e| (e.message_id, e.token))
        .collect();
    assert_eq!(ids, vec![("b0".into(), 6), ("b1".into(), 6), ("b2".into(), 6)]);
}

/// The scenario, the pause story: A (token 5) was granted, paused,
/// and publishes only after B (token 6) published three messages.
pub async fn stale_published_last(fx: &Arc<Effects>, broker: &impl Broker, name: &str) {
    let r = fx.resource(0);
    for j in 0..3 {
        broker.publish(&Fence::new(r.clone(), token(6)), &format!("b{j}")).await;
    }
    let a = Fence::new(r.clone(), token(5));
    broker.publish(&a, "a").await;

    let (seen, sink) = stale_sink();
    let label = format!("{name}-{}", hex());
    let settings = Settings::new(&label).on_stale(sink);
    let tally = broker.run(fx, &settings, true, 4).await;
    let expected = Tally {
        applied: 3,
        stale: 1,
        ..Tally::default()
    };
    assert_eq!(tally, expected);
    assert_eq!(counter(STALE_METRIC, &label), 1);
    assert_eq!(counter(APPLIED_METRIC, &label), 3);
    let seen = seen.lock().expect("lock").clone();
    assert_only_b_applied(fx, &seen, &a).await;
    broker.assert_drained(fx, &settings).await;
    assert_eq!(counter(STALE_METRIC, &label), 1, "the stale message was seen once");
}

/// A publishes first, but its first delivery fails (the consumer cannot
/// reach its database) and comes back after the retry delay; B's messages,
/// published meanwhile, are applied before it, and then it is stale.
pub async fn stale_published_first(fx: &Arc<Effects>, broker: &impl Broker, name: &str) {
    let r = fx.resource(0);
    fx.fail_first.lock().expect("lock").push("a".into());
    let a = Fence::new(r.clone(), token(5));
    broker.publish(&a, "a").await;

    let (seen, sink) = stale_sink();
    let label = format!("{name}-{}", hex());
    let settings = Settings::new(&label)
        .on_stale(sink)
        .with_retry_delay(Duration::from_secs(1));
    let run = broker.start(fx, &settings, 5).await;
    fx.after_calls(1).await;
    for j in 0..3 {
        broker.publish(&Fence::new(r.clone(), token(6)), &format!("b{j}")).await;
    }
    let tally = tokio::time::timeout(RUN_MAX, run)
        .await
        .expect("in time")
        .expect("joined");
    let expected = Tally {
        applied: 3,
        stale: 1,
        retried: 1,
        ..Tally::default()
    };
    assert_eq!(tally, expected);
    assert_eq!(counter(STALE_METRIC, &label), 1);
    let seen = seen.lock().expect("lock").clone();
    assert_only_b_applied(fx, &seen, &a).await;
    broker.assert_drained(fx, &settings).await;
}

/// [`TRIALS`] trials of [`plan`], consumed fenced (through the arbiter) or
/// not (the control).
pub async fn trials(fx: &Arc<Effects>, broker: &impl Broker, name: &str, fenced: bool) -> (Plan, Tally, Check, String) {
    let seed = getrandom::u64().expect("os randomness");
    eprintln!("{name}: seed {seed:#x}");
    let plan = plan(fx, TRIALS, seed);
    fx.lose_first_ack
        .lock()
        .expect("lock")
        .extend(plan.lost.iter().cloned());
    for m in &plan.messages {
        broker.publish(&m.fence, &m.id).await;
    }
    let label = format!("{name}-{}", hex());
    let settings = Settings::new(&label).with_retry_delay(Duration::from_millis(20));
    let tally = broker.run(fx, &settings, fenced, plan.calls).await;
    let found = check(&fx.effects().await);
    eprintln!(
        "{name}: {TRIALS} trials, {} messages, {tally:?}, {found:?}",
        plan.messages.len()
    );
    broker.assert_drained(fx, &settings).await;
    (plan, tally, found, label)
}

/// Through the arbiter: every stale message rejected, none applied, every
/// redelivery acked without applying.
pub async fn trials_fenced(fx: &Arc<Effects>, broker: &impl Broker, name: &str) {
    let (plan, tally, found, label) = trials(fx, broker, name, true).await;
    assert!(plan.stale > 0, "the plan has stale messages");
    assert_eq!(found.stale, 0, "{found:?}");
    assert_eq!(found.repeated, 0, "{found:?}");
    assert_eq!(found.effects as u64, plan.messages.len() as u64 - plan.stale);
    assert_eq!(tally.stale, plan.stale, "{tally:?}");
    assert_eq!(tally.duplicate, plan.lost.len() as u64, "{tally:?}");
    assert_eq!(counter(STALE_METRIC, &label), plan.stale);
}

/// Without it, the same trials apply every late message and every
/// redelivery.
pub async fn trials_control(fx: &Arc<Effects>, broker: &impl Broker, name: &str) {
    let (plan, tally, found, _) = trials(fx, broker, name, false).await;
    assert!(found.stale > 0, "{found:?}");
    assert_eq!(
        found.stale as u64, plan.stale,
        "every late message of an old holder landed"
    );
    assert_eq!(found.repeated, plan.lost.len(), "every lost ack applied twice");
    assert_eq!(tally.stale, 0);
}
