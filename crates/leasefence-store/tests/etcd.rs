//! The etcd store against a real etcd member (`LEASEFENCE_TEST_ETCD_URL`): the
//! store conformance suite through a leader's writer, and leadership — one
//! leader at a time, epochs that only grow, takeover once etcd lets the lease
//! lapse, a deposed writer that writes nothing, resign, the transaction limit.

mod etcd_common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use etcd_common::{ETCD_URL, grant, service_env, store, unique_prefix};
use leasefence_core::StoredResource;
use leasefence_store::{
    Committer, EtcdConfig, EtcdShared, LeaderInfo, LeaseStore, SharedStore, StoreError, conformance,
};

const LONG: Duration = Duration::from_secs(60);

fn find(w: &mut impl LeaseStore, resource: &str) -> Option<StoredResource> {
    w.load()
        .expect("load")
        .into_iter()
        .find(|r| r.resource.as_str() == resource)
}

/// Campaigns until `s` leads (etcd lapses a lease a little after its TTL).
fn campaign_until_leader(s: &EtcdShared, advertise: &str, ttl: Duration, within: Duration) -> u64 {
    let start = Instant::now();
    loop {
        if let Some(epoch) = s.campaign(advertise, ttl).expect("campaign") {
            return epoch;
        }
        assert!(
            start.elapsed() < within,
            "{advertise} did not get the leadership within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn etcd_writer_passes_the_store_suite() {
    let Some(url) = service_env(ETCD_URL) else { return };
    let s = store(&url, &unique_prefix("suite"));
    let epoch = s.campaign("http://suite", LONG).expect("campaign").expect("leads");
    conformance::run_all(|| s.writer(epoch).expect("writer"));
    s.resign(epoch).expect("resign");
}

#[test]
fn campaign_is_exclusive_and_epochs_increase() {
    let Some(url) = service_env(ETCD_URL) else { return };
    let prefix = unique_prefix("exclusive");
    let stores: Vec<EtcdShared> = (0..4).map(|_| store(&url, &prefix)).collect();
    let barrier = Arc::new(Barrier::new(stores.len()));
    let won: Vec<Option<u64>> = std::thread::scope(|scope| {
        let runs: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let barrier = barrier.clone();
                scope.spawn(move || {
                    barrier.wait();
                    s.campaign(&format!("http://c{i}"), LONG).expect("campaign")
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().expect("thread")).collect()
    });
    let winners: Vec<usize> = (0..won.len()).filter(|i| won[*i].is_some()).collect();
    assert_eq!(winners.len(), 1, "exactly one of concurrent campaigns wins: {won:?}");
    let first = winners[0];
    assert_eq!(won[first], Some(1), "the first term is epoch 1");
    let other = (first + 1) % stores.len();
    assert_eq!(
        stores[other].leader().expect("leader"),
        Some(LeaderInfo {
            epoch: 1,
            advertise: format!("http://c{first}")
        }),
        "every coordinator sees the leader and its URL"
    );
    assert_eq!(stores[other].campaign("http://late", LONG).expect("campaign"), None);

    stores[first].resign(1).expect("resign");
    assert_eq!(stores[other].campaign("http://next", LONG).expect("campaign"), Some(2));
    stores[other].resign(2).expect("resign");
    assert_eq!(
        stores[first].campaign("http://again", LONG).expect("campaign"),
        Some(3),
        "epochs keep increasing across leaders, never reused"
    );
    stores[first].resign(3).expect("resign");
}

#[test]
fn a_lapsed_lease_lets_a_standby_take_over_and_the_deposed_writer_writes_nothing() {
    let Some(url) = service_env(ETCD_URL) else { return };
    let prefix = unique_prefix("lapse");
    let (old, new) = (store(&url, &prefix), store(&url, &prefix));
    let ttl = Duration::from_secs(1);
    let epoch = old.campaign("http://old", ttl).expect("campaign").expect("leads");
    let mut old_writer = old.writer(epoch).expect("writer");
    old_writer.apply(&[grant("lapse/a", 1)]).expect("the leader writes");
    assert_eq!(
        new.campaign("http://new", ttl).expect("campaign"),
        None,
        "the lease is live"
    );

    // Nobody renews: etcd alone decides when the lease is over.
    let started = Instant::now();
    let taken = campaign_until_leader(&new, "http://new", LONG, Duration::from_secs(20));
    assert_eq!(taken, epoch + 1);
    eprintln!("takeover {:?} after the old leader's last renewal", started.elapsed());

    let err = old_writer.apply(&[grant("lapse/a", 2), grant("lapse/b", 1)]);
    assert_eq!(
        err,
        Err(StoreError::Deposed { epoch, current: taken }),
        "a write under the old epoch is refused"
    );
    assert_eq!(
        old.renew(epoch, ttl),
        Err(StoreError::Deposed { epoch, current: taken }),
        "the old leader learns it was deposed when it renews"
    );
    let mut new_writer = new.writer(taken).expect("writer");
    let a = find(&mut new_writer, "lapse/a").expect("the old leader's write survives");
    assert_eq!(a.last_token.get(), 1, "the deposed batch wrote nothing");
    assert_eq!(
        find(&mut new_writer, "lapse/b"),
        None,
        "the deposed batch wrote nothing"
    );
    new_writer.apply(&[grant("lapse/a", 2)]).expect("the new leader writes");
    new.resign(taken).expect("resign");
}

#[test]
fn renew_keeps_the_leadership_past_its_ttl() {
    let Some(url) = service_env(ETCD_URL) else { return };
    let prefix = unique_prefix("renew");
    let (leader, standby) = (store(&url, &prefix), store(&url, &prefix));
    let ttl = Duration::from_secs(3);
    let epoch = leader.campaign("http://l", ttl).expect("campaign").expect("leads");
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        leader.renew(epoch, ttl).expect("renew");
        assert_eq!(standby.campaign("http://s", ttl).expect("campaign"), None);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(standby.leader().expect("leader").map(|l| l.epoch), Some(epoch));
    leader.resign(epoch).expect("resign");
}

#[test]
fn resign_ends_the_term_at_once_and_only_its_own() {
    let Some(url) = service_env(ETCD_URL) else { return };
    let prefix = unique_prefix("resign");
    let (a, b) = (store(&url, &prefix), store(&url, &prefix));
    let first = a.campaign("http://a", LONG).expect("campaign").expect("leads");
    a.resign(first).expect("resign");
    assert_eq!(b.leader().expect("leader"), None, "no leader right after a resign");
    let second = b
        .campaign("http://b", LONG)
        .expect("campaign")
        .expect("no TTL to wait out");
    a.resign(first).expect("resigning an old term is not an error");
    assert_eq!(
        b.leader().expect("leader").map(|l| l.epoch),
        Some(second),
        "resigning an old term leaves the current one alone"
    );
    b.renew(second, LONG).expect("the current leader still renews");
    assert!(matches!(
        a.writer(first).expect("writer").apply(&[grant("resign/x", 1)]),
        Err(StoreError::Deposed { .. })
    ));
    b.resign(second).expect("resign");
}

#[test]
fn batches_respect_etcds_transaction_limit() {
    let Some(url) = service_env(ETCD_URL) else { return };
    let s = store(&url, &unique_prefix("txn-limit"));
    let epoch = s.campaign("http://t", LONG).expect("campaign").expect("leads");
    let mut w = s.writer(epoch).expect("writer");
    let max = w.batch_max();
    assert_eq!(max, EtcdConfig::TXN_OPS_MAX_DEFAULT - 2);
    let full: Vec<_> = (0..max).map(|i| grant(&format!("full/{i}"), 1)).collect();
    w.apply(&full)
        .expect("a batch of batch_max resources is one transaction");
    let over: Vec<_> = (0..=max).map(|i| grant(&format!("over/{i}"), 1)).collect();
    let err = w.apply(&over).expect_err("one resource too many");
    assert!(err.to_string().contains("batch_max"), "{err}");
    assert!(
        w.load()
            .expect("load")
            .iter()
            .all(|r| !r.resource.as_str().starts_with("over/"))
    );

    // The committer never hands the writer more than it takes.
    let committer = Committer::start(s.writer(epoch).expect("writer"), 1024);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let seqs: Vec<_> = (1..=400u64)
        .map(|i| committer.submit(grant(&format!("committed/{i}"), i)))
        .collect();
    rt.block_on(async {
        for seq in seqs {
            committer.durable(seq).await.expect("durable");
        }
    });
    let committed = w.load().expect("load");
    assert_eq!(
        committed
            .iter()
            .filter(|r| r.resource.as_str().starts_with("committed/"))
            .count(),
        400
    );
    s.resign(epoch).expect("resign");
}

#[test]
fn blocking_calls_work_from_spawn_blocking_and_the_store_drops_inside_a_task() {
    let Some(url) = service_env(ETCD_URL) else { return };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let s = store(&url, &unique_prefix("blocking"));
        let c = s.clone();
        let epoch = tokio::task::spawn_blocking(move || c.campaign("http://b", LONG))
            .await
            .expect("join")
            .expect("campaign")
            .expect("leads");
        let c = s.clone();
        let leader = tokio::task::spawn_blocking(move || c.leader()).await.expect("join");
        assert_eq!(leader.expect("leader").map(|l| l.epoch), Some(epoch));
        let c = s.clone();
        tokio::task::spawn_blocking(move || c.resign(epoch))
            .await
            .expect("join")
            .expect("resign");
        // The last handle dropped on a runtime thread must not panic.
        drop(s);
    });
}

#[test]
fn an_unreachable_etcd_is_unavailable_within_the_timeout() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let config = EtcdConfig::from_url(&format!("etcd://127.0.0.1:{port}"))
        .expect("valid")
        .with_timeouts(Duration::from_millis(500), Duration::from_millis(200))
        .expect("valid");
    let s = EtcdShared::connect(config).expect("connects lazily");
    let started = Instant::now();
    for _ in 0..2 {
        let err = s.campaign("http://x", LONG);
        assert!(matches!(err, Err(StoreError::Unavailable(_))), "{err:?}");
        let err = s.writer(1).expect("writer").apply(&[grant("x", 1)]);
        assert!(matches!(err, Err(StoreError::Unavailable(_))), "{err:?}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "four calls took {:?}",
        started.elapsed()
    );
}

#[test]
fn etcd_passes_the_shared_store_suite() {
    let Some(url) = service_env(ETCD_URL) else { return };
    let prefix = unique_prefix("shared");
    conformance::shared::run_all(|shard| {
        let config = EtcdConfig::from_url(&url)
            .expect("url")
            .with_prefix(&prefix)
            .expect("prefix")
            .with_shard(shard);
        EtcdShared::connect(config).expect("connect")
    });
}
