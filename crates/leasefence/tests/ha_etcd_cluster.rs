//! Coordinators on a real 3-member etcd cluster (laid out by `.ci/etcd.sh`):
//! with one member SIGKILLed, service goes on; with two, every coordinator
//! answers unavailable (never a grant from memory); with both back, service
//! resumes by itself. The clients' history is checked as in `ha_failover`.

mod common;
#[path = "../../leasefence-store/tests/etcd_common/mod.rs"]
mod etcd_common;

use std::time::{Duration, Instant};

use common::ha::{Cluster, Load, acquire, check};
use etcd_common::{ETCD_CLUSTER_DIR, ETCD_CLUSTER_URLS, Restore, service_env, unique_prefix};

const LEADER_TTL: Duration = Duration::from_secs(2);

/// Polls until every coordinator answers an acquire of a fresh resource with `code`.
async fn all_answer(cluster: &Cluster, code: u16, within: Duration, what: &str) {
    let start = Instant::now();
    let mut n = 0;
    loop {
        n += 1;
        let mut codes = Vec::new();
        for url in cluster.urls() {
            codes.push(acquire(&url, &format!("probe/{what}/{n}")).await.0);
        }
        let ok = match code {
            200 => codes.contains(&200),
            _ => codes.iter().all(|c| *c == code),
        };
        if ok {
            eprintln!("{what}: {codes:?} after {:?}", start.elapsed());
            return;
        }
        assert!(start.elapsed() < within, "{what}: still {codes:?} after {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_member_lost_is_survived_two_are_unavailable_and_service_resumes() {
    let (Some(urls), Some(dir)) = (service_env(ETCD_CLUSTER_URLS), service_env(ETCD_CLUSTER_DIR)) else {
        return;
    };
    let members = etcd_common::Cluster::open(&dir);
    assert_eq!(members.names.len(), 3, "a 3-member cluster");
    let _restore = Restore(&members);
    let cluster = Cluster::start(&urls, &unique_prefix("ha-cluster"), 2, LEADER_TTL);
    cluster.await_active(None, Duration::from_secs(20)).await;
    let load = Load::start(cluster.urls(), 4, 32);
    tokio::time::sleep(Duration::from_millis(500)).await;

    members.kill(&members.names[0]);
    // etcd may elect a new leader of its own; then grants go on.
    let before = load.granted();
    let start = Instant::now();
    while load.granted() < before + 20 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no service with one member down"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    members.kill(&members.names[1]);
    all_answer(&cluster, 503, Duration::from_secs(20), "two members down").await;

    members.start(&members.names[0]);
    members.start(&members.names[1]);
    all_answer(&cluster, 200, Duration::from_secs(40), "both members back").await;
    let history = load.finish().await;
    eprintln!("{} grants answered", history.len());
    check(&history);
}
