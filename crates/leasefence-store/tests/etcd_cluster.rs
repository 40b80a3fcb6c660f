//! The etcd store on a real 3-member cluster (`LEASEFENCE_TEST_ETCD_CLUSTER_URLS`,
//! laid out by `.ci/etcd.sh`): SIGKILL one member and the leader goes on
//! renewing and writing, and campaigns go on answering; SIGKILL a second and
//! every call fails as unavailable within a bound (never hangs, never grants
//! from memory); start both again and the same handles work again by themselves.

mod etcd_common;

use std::time::{Duration, Instant};

use etcd_common::{Cluster, ETCD_CLUSTER_DIR, ETCD_CLUSTER_URLS, Restore, config, grant, service_env, unique_prefix};
use leasefence_store::{EtcdShared, LeaseStore, SharedStore, StoreError};

const LEADER_TTL: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one failing call may take: a few round trips, each bounded by
/// the request timeout, with room for a loaded machine.
const UNAVAILABLE_WITHIN: Duration = Duration::from_secs(6);

fn is_unavailable<T: std::fmt::Debug>(what: &str, call: impl FnOnce() -> Result<T, StoreError>) {
    let started = Instant::now();
    let got = call();
    let took = started.elapsed();
    assert!(
        matches!(got, Err(StoreError::Unavailable(_))),
        "{what} without quorum: {got:?}"
    );
    eprintln!("{what} without quorum: unavailable after {took:?}");
    assert!(took < UNAVAILABLE_WITHIN, "{what} took {took:?} to fail");
}

/// Retries `call` until it succeeds, for at most `within`.
fn eventually<T>(what: &str, within: Duration, mut call: impl FnMut() -> Result<T, StoreError>) -> T {
    let started = Instant::now();
    loop {
        match call() {
            Ok(v) => {
                eprintln!("{what}: after {:?}", started.elapsed());
                return v;
            }
            Err(e) => {
                eprintln!("{what}: {e}");
                assert!(started.elapsed() < within, "{what} still fails after {within:?}: {e}");
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn one_member_lost_is_survived_two_are_unavailable_and_service_resumes_by_itself() {
    let (Some(urls), Some(dir)) = (service_env(ETCD_CLUSTER_URLS), service_env(ETCD_CLUSTER_DIR)) else {
        return;
    };
    let cluster = Cluster::open(&dir);
    assert_eq!(cluster.names.len(), 3, "a 3-member cluster");
    let _restore = Restore(&cluster);
    let cfg = config(&urls, &unique_prefix("cluster"))
        .with_timeouts(REQUEST_TIMEOUT, Duration::from_millis(500))
        .expect("valid");
    let leader = EtcdShared::connect(cfg.clone()).expect("connect");
    let standby = EtcdShared::connect(cfg).expect("connect");

    let epoch = leader
        .campaign("http://leader", LEADER_TTL)
        .expect("campaign")
        .expect("leads");
    let mut w = leader.writer(epoch).expect("writer");
    let mut token = 1;
    w.apply(&[grant("cluster/a", token)])
        .expect("write with every member up");

    // One member down: after etcd settles (it may elect a new leader), every
    // call goes on working.
    cluster.kill(&cluster.names[0]);
    eventually("renew and write with one member down", Duration::from_secs(20), || {
        leader.renew(epoch, LEADER_TTL)?;
        w.apply(&[grant("cluster/a", token + 1)])
    });
    token += 1;
    for _ in 0..10 {
        leader.renew(epoch, LEADER_TTL).expect("renew with one member down");
        token += 1;
        w.apply(&[grant("cluster/a", token)])
            .expect("write with one member down");
        assert_eq!(
            standby
                .campaign("http://standby", LEADER_TTL)
                .expect("campaign with one member down"),
            None,
            "the leader keeps its term"
        );
    }

    // Two members down: no quorum. Every call fails as unavailable, quickly.
    cluster.kill(&cluster.names[1]);
    for _ in 0..2 {
        is_unavailable("renew", || leader.renew(epoch, LEADER_TTL));
        is_unavailable("write", || w.apply(&[grant("cluster/a", token + 1)]));
        is_unavailable("campaign", || standby.campaign("http://standby", LEADER_TTL));
        is_unavailable("leader", || standby.leader());
        is_unavailable("load", || w.load());
    }

    // Both back: the same handles recover by themselves. The lease may have
    // lapsed meanwhile (then the leader campaigns again, as a coordinator does).
    cluster.start(&cluster.names[0]);
    cluster.start(&cluster.names[1]);
    let (epoch, mut w) = eventually(
        "renew or campaign after the members are back",
        Duration::from_secs(30),
        || match leader.renew(epoch, LEADER_TTL) {
            Ok(()) => Ok((epoch, w_for(&leader, epoch))),
            Err(StoreError::Deposed { .. }) => match leader.campaign("http://leader", LEADER_TTL)? {
                Some(e) => Ok((e, w_for(&leader, e))),
                None => Err(StoreError::Unavailable("another coordinator leads".into())),
            },
            Err(e) => Err(e),
        },
    );
    token += 1;
    w.apply(&[grant("cluster/a", token)]).expect("write after recovery");
    let a = w
        .load()
        .expect("load after recovery")
        .into_iter()
        .find(|r| r.resource.as_str() == "cluster/a")
        .expect("record");
    assert_eq!(a.last_token.get(), token, "every acknowledged write is there");
    leader.resign(epoch).expect("resign");
}

fn w_for(s: &EtcdShared, epoch: u64) -> leasefence_store::EtcdWriter {
    s.writer(epoch).expect("writer")
}
