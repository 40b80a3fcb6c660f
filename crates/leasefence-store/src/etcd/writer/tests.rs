//! The write transaction's own fence, against a real etcd member
//! (`LEASEFENCE_TEST_ETCD_URL`): a batch read while leading and written after
//! a takeover, or after its records changed, writes nothing. (The read alone
//! would let such a batch through; only the transaction's compares stop it.)

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasefence_core::{Holder, LeaseId, Mutation, ResourceId, Token};

use crate::etcd::{EtcdConfig, EtcdShared};
use crate::{LeaseStore, SharedStore, StoreError};

const TTL: Duration = Duration::from_secs(60);

/// A store under a fresh prefix, or `None` (skipped) without etcd; under
/// `CI=true` a missing etcd fails.
fn stores(test: &str) -> Option<(EtcdShared, EtcdShared)> {
    let Ok(url) = std::env::var("LEASEFENCE_TEST_ETCD_URL") else {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI=true needs LEASEFENCE_TEST_ETCD_URL"
        );
        eprintln!("skipped: LEASEFENCE_TEST_ETCD_URL not set");
        return None;
    };
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let prefix = format!("/leasefence-test/{test}-{}-{nanos}/", std::process::id());
    let open = || {
        let config = EtcdConfig::from_url(&url)
            .and_then(|c| c.with_prefix(&prefix))
            .expect("valid config");
        EtcdShared::connect(config).expect("connect")
    };
    Some((open(), open()))
}

fn grant(resource: &str, token: u64) -> Mutation {
    Mutation::Grant {
        resource: ResourceId::new(resource).expect("valid"),
        token: Token::new(token).expect("non-zero"),
        lease_id: LeaseId::from_bytes([1; 16]),
        holder: Holder::new("fence").expect("valid"),
        ttl: Duration::from_secs(5),
        lock_delay: Duration::ZERO,
    }
}

#[test]
fn a_batch_read_before_a_takeover_is_refused_by_the_transaction() {
    let Some((old, new)) = stores("fence-takeover") else {
        return;
    };
    let epoch = old.campaign("http://old", TTL).expect("campaign").expect("leads");
    let w = old.writer(epoch).expect("writer");
    let batch = [grant("fence/a", 1)];
    let r = ResourceId::new("fence/a").expect("valid");
    let plan = w.plan(&batch, &[&r]).expect("read while leading");

    old.resign(epoch).expect("resign");
    let taken = new.campaign("http://new", TTL).expect("campaign").expect("takes over");
    assert_eq!(
        w.commit(plan).err(),
        Some(StoreError::Deposed { epoch, current: taken }),
        "the write transaction itself checks the epoch"
    );
    let mut nw = new.writer(taken).expect("writer");
    assert!(nw.load().expect("load").is_empty(), "nothing was written");
    new.resign(taken).expect("resign");
}

#[test]
fn a_batch_whose_records_changed_since_its_read_writes_nothing() {
    let Some((s, _)) = stores("fence-race") else { return };
    let epoch = s.campaign("http://s", TTL).expect("campaign").expect("leads");
    let (w, mut other) = (s.writer(epoch).expect("writer"), s.writer(epoch).expect("writer"));
    let r = ResourceId::new("race/a").expect("valid");
    let plan = w.plan(&[grant("race/a", 1)], &[&r]).expect("read");
    other.apply(&[grant("race/a", 7)]).expect("a write in between");
    assert_eq!(w.commit(plan), Ok(false), "the record's revision changed: not written");
    let got = other.load().expect("load");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].last_token.get(), 7, "the write in between stands");
    s.resign(epoch).expect("resign");
}

#[test]
fn every_record_carries_the_epoch_of_the_leader_that_wrote_it() {
    let Some((first, second)) = stores("record-epoch") else {
        return;
    };
    let one = first.campaign("http://first", TTL).expect("campaign").expect("leads");
    first
        .writer(one)
        .expect("writer")
        .apply(&[grant("epoch/a", 1), grant("epoch/b", 1)])
        .expect("write");
    first.resign(one).expect("resign");
    let two = second
        .campaign("http://second", TTL)
        .expect("campaign")
        .expect("takes over");
    second
        .writer(two)
        .expect("writer")
        .apply(&[grant("epoch/b", 2)])
        .expect("write");

    let keys = &second.inner.keys;
    let epoch_of = |resource: &str| {
        let got = second
            .inner
            .conn
            .idempotent("read a record", |mut c| {
                let key = keys.record(resource);
                async move { c.get(key, None).await }
            })
            .expect("get");
        let kv = got.kvs().first().expect("the record exists");
        crate::etcd::keys::decode_record(resource, kv.value())
            .expect("decodes")
            .0
    };
    assert_eq!(epoch_of("epoch/a"), Some(one), "untouched since the first term");
    assert_eq!(epoch_of("epoch/b"), Some(two), "rewritten by the second term");
    second.resign(two).expect("resign");
}
