//! The write transaction's own fence, against a real etcd member
//! (`LEASEFENCE_TEST_ETCD_URL`): a batch read while leading and written after
//! a takeover, or after its records changed, writes nothing. (The read alone
//! would let such a batch through; only the transaction's compares stop it.)
//! And a write whose answer is lost is reported as of unknown outcome. A
//! writer that knows a batch's records (it wrote them last) writes them in one
//! round trip, and what it knows never gets a write past the fence or over a
//! record someone else changed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasefence_core::{Holder, LeaseId, Mutation, ReleaseCause, ResourceId, Token};

use crate::etcd::{EtcdConfig, EtcdShared};
use crate::{LeaseStore, SharedStore, StoreError};

const TTL: Duration = Duration::from_secs(60);

/// The test member's URL, or `None` (skipped) without etcd; under `CI=true`
/// a missing etcd fails.
fn url() -> Option<String> {
    let Ok(url) = std::env::var("LEASEFENCE_TEST_ETCD_URL") else {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI=true needs LEASEFENCE_TEST_ETCD_URL"
        );
        eprintln!("skipped: LEASEFENCE_TEST_ETCD_URL not set");
        return None;
    };
    Some(url)
}

fn unique_prefix(test: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("/leasefence-test/{test}-{}-{nanos}/", std::process::id())
}

/// A store under a fresh prefix, or `None` (skipped) without etcd.
fn stores(test: &str) -> Option<(EtcdShared, EtcdShared)> {
    let url = url()?;
    let prefix = unique_prefix(test);
    let open = || {
        let config = EtcdConfig::from_url(&url)
            .and_then(|c| c.with_prefix(&prefix))
            .expect("valid config");
        EtcdShared::connect(config).expect("connect")
    };
    Some((open(), open()))
}

/// A store under `prefix` that reaches the test member through a proxy
/// that can hold etcd's answers, with short timeouts.
fn behind_proxy(url: &str, prefix: &str) -> (crate::test_proxy::Proxy, EtcdShared) {
    let member = url
        .trim_start_matches("etcd://")
        .split(',')
        .next()
        .and_then(|m| std::net::ToSocketAddrs::to_socket_addrs(m).ok())
        .and_then(|mut a| a.next())
        .expect("the test URL names a member");
    let proxy = crate::test_proxy::Proxy::start(member);
    let config = EtcdConfig::from_url(&format!("etcd://{}", proxy.addr()))
        .and_then(|c| c.with_prefix(prefix))
        .and_then(|c| c.with_timeouts(Duration::from_secs(2), Duration::from_millis(800)))
        .expect("valid config");
    let s = EtcdShared::connect(config).expect("connect");
    (proxy, s)
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

fn release(resource: &str, token: u64) -> Mutation {
    Mutation::Release {
        resource: ResourceId::new(resource).expect("valid"),
        token: Token::new(token).expect("non-zero"),
        cause: ReleaseCause::Released,
        lock_delay: Duration::ZERO,
    }
}

/// The records under `s`'s prefix, by resource: (last token, held?).
fn tokens(s: &EtcdShared, epoch: crate::shared::Epoch) -> Vec<(String, u64, bool)> {
    let mut got: Vec<_> = s
        .writer(epoch)
        .expect("writer")
        .load()
        .expect("load")
        .into_iter()
        .map(|r| (r.resource.to_string(), r.last_token.get(), r.lease.is_some()))
        .collect();
    got.sort();
    got
}

#[test]
fn a_batch_on_records_the_writer_wrote_last_is_one_round_trip() {
    let Some((s, _)) = stores("known") else { return };
    let epoch = s.campaign("http://s", TTL).expect("campaign").expect("leads");
    let mut w = s.writer(epoch).expect("writer");
    let sent = || s.inner.conn.sent();

    let before = sent();
    w.apply(&[grant("known/a", 1)]).expect("grant");
    assert_eq!(sent() - before, 2, "a record not known yet is read, then written");
    let before = sent();
    w.apply(&[release("known/a", 1)]).expect("release");
    w.apply(&[grant("known/a", 2), grant("known/b", 1)])
        .expect("a batch with a new record");
    assert_eq!(
        sent() - before,
        1 + 2,
        "the release is one write; a batch with a new record reads it"
    );
    let before = sent();
    w.apply(&[release("known/a", 2), release("known/b", 1)])
        .expect("release both");
    assert_eq!(sent() - before, 1, "both records known: one write");
    let before = sent();
    w.apply(&[grant("known/c", 1)]).expect("a batch of a new record alone");
    w.apply(&[grant("known/a", 3)]).expect("grant a again");
    assert_eq!(sent() - before, 2 + 1, "reading a new record forgets none known");
    assert_eq!(
        tokens(&s, epoch),
        vec![
            ("known/a".into(), 3, true),
            ("known/b".into(), 1, false),
            ("known/c".into(), 1, true)
        ],
        "etcd holds every write"
    );
    s.resign(epoch).expect("resign");
}

#[test]
fn a_record_changed_by_another_writer_is_read_again_before_it_is_written() {
    let Some((s, _)) = stores("known-race") else { return };
    let epoch = s.campaign("http://s", TTL).expect("campaign").expect("leads");
    let (mut w, mut other) = (s.writer(epoch).expect("writer"), s.writer(epoch).expect("writer"));
    w.apply(&[grant("race/k", 1)]).expect("w knows the record at token 1");
    other.apply(&[grant("race/k", 7)]).expect("another writer moves it on");

    let before = s.inner.conn.sent();
    w.apply(&[grant("race/k", 8)])
        .expect("computed again from the record as it is");
    assert_eq!(
        s.inner.conn.sent() - before,
        3,
        "the write from what w knew was refused, then the record read and written"
    );
    assert_eq!(tokens(&s, epoch), vec![("race/k".into(), 8, true)]);

    other.apply(&[grant("race/k", 9)]).expect("moved on again");
    assert_eq!(
        w.apply(&[grant("race/k", 9)]).err(),
        Some(StoreError::TokenRegression {
            resource: "race/k".into(),
            stored: 9,
            attempted: 9
        }),
        "judged against the record as etcd holds it, not as w knew it"
    );
    s.resign(epoch).expect("resign");
}

#[test]
fn a_writer_that_knows_its_records_is_refused_after_a_takeover() {
    let Some((old, new)) = stores("known-takeover") else {
        return;
    };
    let epoch = old.campaign("http://old", TTL).expect("campaign").expect("leads");
    let mut w = old.writer(epoch).expect("writer");
    w.apply(&[grant("deposed/a", 1)]).expect("grant while leading");

    old.resign(epoch).expect("resign");
    let taken = new.campaign("http://new", TTL).expect("campaign").expect("takes over");
    let before = old.inner.conn.sent();
    assert_eq!(
        w.apply(&[release("deposed/a", 1), grant("deposed/a", 2)]).err(),
        Some(StoreError::Deposed { epoch, current: taken }),
        "the fence refuses a writer whose term is over, whatever it knew"
    );
    assert_eq!(old.inner.conn.sent() - before, 1, "refused by the write itself");
    assert_eq!(
        tokens(&new, taken),
        vec![("deposed/a".into(), 1, true)],
        "nothing written"
    );
    new.resign(taken).expect("resign");
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
        w.commit(&plan).err(),
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
    assert_eq!(w.commit(&plan), Ok(None), "the record's revision changed: not written");
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

/// A write that reached etcd and took effect there, but whose answer never
/// came back, is not "unavailable" (which says nothing was written): the
/// store reports its outcome as unknown.
#[test]
fn a_write_whose_answer_is_lost_is_of_unknown_outcome() {
    let Some(url) = url() else { return };
    let prefix = unique_prefix("lost-answer");
    let (proxy, s) = behind_proxy(&url, &prefix);
    let epoch = s.campaign("http://s", TTL).expect("campaign").expect("leads");
    let w = s.writer(epoch).expect("writer");
    let r = ResourceId::new("lost/a").expect("valid");
    let plan = w.plan(&[grant("lost/a", 1)], &[&r]).expect("read");

    proxy.hold_replies();
    let lost = w.commit(&plan);
    assert!(
        matches!(lost, Err(StoreError::Indeterminate(_))),
        "a write whose answer was lost: {lost:?}"
    );
    proxy.restore();
    let direct = EtcdShared::connect(
        EtcdConfig::from_url(&url)
            .and_then(|c| c.with_prefix(&prefix))
            .expect("valid"),
    )
    .expect("connect");
    let got = direct.writer(epoch).expect("writer").load().expect("load");
    assert_eq!(
        got.iter().map(|r| r.last_token.get()).collect::<Vec<_>>(),
        vec![1],
        "the write took effect although its answer was lost"
    );
    direct.resign(epoch).expect("resign");
}

/// Once a call to etcd went unanswered, a batch on records the writer knows
/// is read first: while etcd stays silent it fails as unavailable with
/// nothing sent. While etcd answers, such a batch is sent without a read, so
/// the one that first meets a silent etcd is of unknown outcome.
#[test]
fn after_an_unanswered_call_a_batch_is_read_first_and_fails_as_unavailable() {
    let Some(url) = url() else { return };
    let (proxy, s) = behind_proxy(&url, &unique_prefix("silent"));
    let epoch = s.campaign("http://s", TTL).expect("campaign").expect("leads");
    let mut w = s.writer(epoch).expect("writer");
    w.apply(&[grant("silent/a", 1)]).expect("grant");

    proxy.hold_replies();
    let leader = s.leader();
    assert!(matches!(leader, Err(StoreError::Unavailable(_))), "{leader:?}");
    let before = s.inner.conn.sent();
    let batch = w.apply(&[release("silent/a", 1)]);
    assert!(
        matches!(batch, Err(StoreError::Unavailable(_))),
        "read first, and the read unanswered: {batch:?}"
    );
    assert_eq!(s.inner.conn.sent() - before, 1, "only the read was sent");

    proxy.restore();
    w.apply(&[release("silent/a", 1)]).expect("etcd answers again");
    proxy.hold_replies();
    let blind = w.apply(&[grant("silent/a", 2)]);
    assert!(
        matches!(blind, Err(StoreError::Indeterminate(_))),
        "sent without a read while etcd answered, its answer lost: {blind:?}"
    );
    proxy.restore();
    assert_eq!(
        tokens(&s, epoch),
        vec![("silent/a".into(), 2, true)],
        "the proxy let the write through; only its answer was lost"
    );
    s.resign(epoch).expect("resign");
}
