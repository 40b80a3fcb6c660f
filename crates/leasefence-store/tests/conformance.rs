//! Every store backend passes the same suite; the committer batches and preserves order.

use std::time::Duration;

use leasefence_store::conformance::grant;
use leasefence_store::{Committer, EmbeddedStore, LeaseStore, MemoryShared, MemoryStore, StoreError, conformance};

#[test]
fn memory_store_passes_the_suite() {
    let store = MemoryStore::new();
    conformance::run_all(|| store.clone());
}

#[test]
fn embedded_store_passes_the_suite() {
    let dir = tempfile::tempdir().expect("tempdir");
    conformance::run_all(|| EmbeddedStore::open_dir(dir.path()).expect("open"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committer_group_commits_concurrent_grants_and_all_are_durable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let committer = Committer::start(EmbeddedStore::open_dir(dir.path()).expect("open"), 1024);
    let mut waits = Vec::new();
    for i in 1..=2000u64 {
        waits.push(committer.submit(grant(&format!("g/{}", i % 50), i, 1)));
    }
    for w in waits {
        committer.durable(w).await.expect("durable");
    }
    let stats = committer.stats();
    assert_eq!(stats.mutations, 2000);
    assert!(
        stats.batches < 2000,
        "concurrent grants must share transactions: {stats:?}"
    );
    drop(committer);
    // The writer releases the file once its last handle is gone; retry briefly.
    let mut store = loop {
        match EmbeddedStore::open_dir(dir.path()) {
            Ok(s) => break s,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let all = store.load().expect("load");
    assert_eq!(all.len(), 50);
    for r in all {
        let k: u64 = r.resource.as_str()[2..].parse().expect("name");
        let expected = (1..=2000u64).filter(|i| i % 50 == k).max().expect("some");
        assert_eq!(
            r.last_token.get(),
            expected,
            "the last grant of each resource wins, in order"
        );
    }
}

#[tokio::test]
async fn committer_poisons_after_a_failed_commit() {
    let committer = Committer::start(MemoryStore::new(), 16);
    let first = committer.submit(grant("p", 5, 1));
    committer.durable(first).await.expect("ok");
    let regress = committer.submit(grant("p", 5, 1));
    let err = committer.durable(regress).await;
    assert!(matches!(err, Err(StoreError::TokenRegression { .. })), "{err:?}");
    assert_eq!(committer.failure(), err.err());
    let after = committer.submit(grant("q", 1, 1));
    assert_eq!(committer.durable(after).await, Err(StoreError::Poisoned));
    // What was durable before the failure stays so.
    assert_eq!(committer.durable(first).await, Ok(()));
}

#[test]
fn memory_shared_passes_the_shared_suite() {
    // One engine per shard: MemoryShared has no shards of its own.
    let mut shards: std::collections::HashMap<u32, MemoryShared> = Default::default();
    conformance::shared::run_all(|shard| shards.entry(shard).or_default().clone());
}
