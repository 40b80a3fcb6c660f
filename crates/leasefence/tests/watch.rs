//! Watch delivers every transition in order to concurrent watchers, including
//! one that disconnects and resumes from its last revision.

mod common;

use std::time::Duration;

use common::ms;
use leasefence_proto::v1::{self as pb, leases_client::LeasesClient, watch_event::Kind};
use tonic::Code;
use tonic::transport::Channel;

fn watch_req(after: Option<u64>, id: &str) -> pb::WatchRequest {
    pb::WatchRequest {
        resource: "w/".into(),
        prefix: true,
        after_revision: after,
        coordinator_id: id.into(),
    }
}

type Seen = Vec<(u64, Kind, String, u64)>;

fn seen(e: &pb::WatchEvent) -> (u64, Kind, String, u64) {
    (
        e.revision,
        Kind::try_from(e.kind).unwrap_or(Kind::Unspecified),
        e.resource.clone(),
        e.token,
    )
}

async fn read_n(stream: &mut tonic::Streaming<pb::WatchEvent>, n: usize, out: &mut Seen) -> String {
    let mut id = String::new();
    for _ in 0..n {
        let e = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("event in time")
            .expect("stream ok")
            .expect("not ended");
        id = e.coordinator_id.clone();
        out.push(seen(&e));
    }
    id
}

async fn transitions(c: &mut LeasesClient<Channel>) {
    let acquire = |r: &str, ttl_ms: u64| pb::AcquireRequest {
        resource: r.into(),
        ttl_ms,
        holder: "t".into(),
        wait_ms: 0,
        lock_delay_ms: 0,
    };
    let a = c.acquire(acquire("w/a", 10_000)).await.expect("a").into_inner();
    c.acquire(acquire("other", 10_000)).await.expect("other, not watched");
    c.acquire(acquire("w/b", 150)).await.expect("b");
    c.release(pb::ReleaseRequest {
        resource: "w/a".into(),
        lease_id: a.lease_id,
    })
    .await
    .expect("release");
    tokio::time::sleep(ms(300)).await; // w/b expires
    c.acquire(acquire("w/b", 10_000)).await.expect("b again");
    c.acquire(acquire("w/a", 10_000)).await.expect("a again");
}

#[tokio::test]
async fn two_watchers_see_every_transition_in_order_across_a_reconnect() {
    let server = common::in_process().await;
    let url = server.url.clone();
    let mut c = LeasesClient::connect(url.clone()).await.expect("connect");
    let mut w1 = c.clone().watch(watch_req(Some(0), "")).await.expect("w1").into_inner();
    let mut w2 = c.clone().watch(watch_req(Some(0), "")).await.expect("w2").into_inner();
    let driver = tokio::spawn(async move { transitions(&mut c).await });

    let mut one = Seen::new();
    let mut two = Seen::new();
    read_n(&mut w1, 6, &mut one).await;
    let id = read_n(&mut w2, 2, &mut two).await;
    drop(w2); // the watcher's connection goes away mid-stream
    let last = two.last().map(|s| s.0);
    let mut w2 = LeasesClient::connect(url)
        .await
        .expect("reconnect")
        .watch(watch_req(last, &id))
        .await
        .expect("resume")
        .into_inner();
    read_n(&mut w2, 4, &mut two).await;
    driver.await.expect("driver");

    let expected = vec![
        (Kind::Granted, "w/a", 1),
        (Kind::Granted, "w/b", 1),
        (Kind::Released, "w/a", 1),
        (Kind::Expired, "w/b", 1),
        (Kind::Granted, "w/b", 2),
        (Kind::Granted, "w/a", 2),
    ];
    for got in [&one, &two] {
        let shape: Vec<_> = got.iter().map(|(_, k, r, t)| (*k, r.as_str(), *t)).collect();
        assert_eq!(shape, expected);
        assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "revisions increase: {got:?}");
    }
    assert_eq!(one, two, "both watchers saw the same revisions");
}

#[tokio::test]
async fn resuming_without_a_coordinator_against_another_or_the_future_is_refused() {
    let server = common::in_process().await;
    let url = server.url.clone();
    let mut c = LeasesClient::connect(url).await.expect("connect");
    let e = c
        .watch(watch_req(Some(0), "not-this-one"))
        .await
        .expect_err("restarted");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("restarted"), "{}", e.message());
    // A resume names the coordinator whose revision it gives: without one,
    // another coordinator's revision 1 would be taken for this one's.
    let e = c.watch(watch_req(Some(1), "")).await.expect_err("whose revision");
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("coordinator_id"), "{}", e.message());
    let mut live = c.clone().watch(watch_req(None, "")).await.expect("watch").into_inner();
    c.acquire(pb::AcquireRequest {
        resource: "w/now".into(),
        ttl_ms: 10_000,
        holder: "t".into(),
        wait_ms: 0,
        lock_delay_ms: 0,
    })
    .await
    .expect("acquire");
    let id = read_n(&mut live, 1, &mut Seen::new()).await;
    let e = c.watch(watch_req(Some(99), &id)).await.expect_err("future");
    assert_eq!(e.code(), Code::FailedPrecondition);
    let bad = pb::WatchRequest {
        resource: String::new(),
        prefix: false,
        after_revision: None,
        coordinator_id: String::new(),
    };
    assert_eq!(
        c.watch(bad).await.expect_err("empty name").code(),
        Code::InvalidArgument
    );
}
