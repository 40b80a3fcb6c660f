//! Nothing the coordinator reports runs ahead of the disk: a watch event, a
//! status, a busy answer and a release answer all wait until what they show
//! is durable. The store's commits are held back by a gate to look at the
//! window between "submitted" and "durable".

mod common;

use std::time::Duration;

use common::{GatedStore, acquire, engine, rid};
use leasefence_core::LeaseError;
use leasefence_server::ApiError;
use leasefence_server::watch::{EventKind, Filter};

const HOUR: Duration = Duration::from_secs(3600);
/// Long enough for an answer that is not held back to arrive on a busy machine.
const SETTLE: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_sees_a_grant_only_once_it_is_durable() {
    let store = GatedStore::new();
    let gate = store.gate.clone();
    let engine = engine(store);
    let filter = Filter {
        resource: "w/1".into(),
        prefix: false,
    };
    let mut sub = engine.watch(&filter, None, "").expect("subscribe");
    gate.shut();
    let e = engine.clone();
    let granting = tokio::spawn(async move { e.acquire(acquire("w/1", "a", HOUR, Duration::ZERO)).await });
    tokio::time::sleep(SETTLE).await;
    assert!(
        sub.live.try_recv().is_err(),
        "a watcher was told of a grant that is not durable yet"
    );
    gate.open();
    let grant = granting.await.expect("task").expect("granted");
    let event = tokio::time::timeout(Duration::from_secs(5), sub.live.recv())
        .await
        .expect("the durable grant reaches the watcher")
        .expect("event");
    assert_eq!((event.kind, event.token), (EventKind::Granted, grant.token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_answer_waits_until_the_holder_it_names_is_durable() {
    let store = GatedStore::new();
    let gate = store.gate.clone();
    let engine = engine(store);
    gate.shut();
    let e = engine.clone();
    let first = tokio::spawn(async move { e.acquire(acquire("b/1", "a", HOUR, Duration::ZERO)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let e = engine.clone();
    let mut second = tokio::spawn(async move { e.acquire(acquire("b/1", "b", HOUR, Duration::ZERO)).await });
    let early = tokio::time::timeout(SETTLE, &mut second).await;
    assert!(
        early.is_err(),
        "busy was answered, naming a holder whose grant is not durable: {early:?}"
    );
    gate.open();
    first.await.expect("task").expect("granted");
    let busy = second.await.expect("task");
    assert!(
        matches!(busy, Err(ApiError::Lease(LeaseError::Busy { .. }))),
        "{busy:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_wakes_a_waiter_is_answered_only_once_durable() {
    let store = GatedStore::new();
    let gate = store.gate.clone();
    let engine = engine(store);
    let held = engine
        .acquire(acquire("q/1", "a", HOUR, Duration::ZERO))
        .await
        .expect("granted");
    let e = engine.clone();
    let waiter = tokio::spawn(async move { e.acquire(acquire("q/1", "b", HOUR, Duration::from_secs(60))).await });
    // Queueing takes no I/O: it is done long before this.
    tokio::time::sleep(Duration::from_millis(100)).await;
    gate.shut();
    let e = engine.clone();
    let mut release = tokio::spawn(async move { e.release(&rid("q/1"), &held.lease_id).await });
    let early = tokio::time::timeout(SETTLE, &mut release).await;
    assert!(
        early.is_err(),
        "a release was answered before it was durable: {early:?}"
    );
    gate.open();
    release.await.expect("task").expect("released");
    let granted = waiter.await.expect("task").expect("the waiter gets the lease");
    assert_eq!(granted.token.get(), 2);
}
