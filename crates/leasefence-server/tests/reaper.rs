//! The reaper never oversleeps: any call that moves the machine's next
//! deadline earlier re-arms it.

mod common;

use std::time::{Duration, Instant};

use common::{GatedStore, acquire, engine, rid};

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_grants_a_short_lease_rearms_the_reaper() {
    let engine = engine(GatedStore::new());
    let r = engine
        .acquire(acquire("r", "a", HOUR, Duration::ZERO))
        .await
        .expect("r");
    engine
        .acquire(acquire("other", "a", HOUR, Duration::ZERO))
        .await
        .expect("other");
    let short = Duration::from_millis(200);
    let e = engine.clone();
    let w1 = tokio::spawn(async move { e.acquire(acquire("r", "w1", short, Duration::from_secs(300))).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let e = engine.clone();
    let w2 = tokio::spawn(async move { e.acquire(acquire("r", "w2", short, Duration::from_secs(60))).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    engine.release(&rid("r"), &r.lease_id).await.expect("release");
    let g1 = w1.await.expect("task").expect("w1 granted");
    // w1's 200 ms lease expires unrenewed; w2 must follow about then, not at its 60 s timeout.
    let g2 = tokio::time::timeout(Duration::from_secs(10), w2)
        .await
        .expect("w2 is granted when w1's lease expires, not when its own wait ends")
        .expect("task")
        .expect("w2 granted");
    assert_eq!((g1.token.get(), g2.token.get()), (2, 3));
    assert!(released.elapsed() >= short, "w1's lease ran its course first");
}
