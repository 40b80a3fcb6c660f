//! A client that knows several coordinators: it follows a standby's leader
//! hint, skips coordinators that are down, retries only what is safe to
//! retry, and keeps a lease's keep-alive and an observer going on the
//! coordinator a hint names. Real coordinators (in this process, embedded
//! store) beside stubs that play the standby role; see `support`.

mod support;

use std::time::Duration;

use leasefence_client::{Client, ClientError, ClientOptions, LeaderChange, LeaderChanges, LeaseConfig};
use leasefence_core::{Holder, ResourceId};
use support::{Role, coordinator, dead_url, ms, proxy, stub};
use tokio::time::{sleep, timeout};

fn res(name: &str) -> ResourceId {
    ResourceId::new(name).expect("valid resource")
}

#[tokio::test]
async fn a_standby_first_in_the_list_is_followed_to_the_leader_it_names() {
    let leader = coordinator().await;
    let standby = stub(Role::Standby {
        leader: Some(leader.url.clone()),
    })
    .await;
    let client = Client::connect_any(&[&standby.url, &leader.url]).await.expect("client");
    let lease = client
        .acquire(&res("hints/follow"), Duration::from_secs(10), None, Duration::ZERO)
        .await
        .expect("acquired through the hint");
    assert_eq!(lease.token.get(), 1);
    assert_eq!(standby.calls(), 1, "the standby was asked first, and once");
    assert_eq!(client.active(), leader.url, "the leader is now believed active");
    client.status(&lease.resource).await.expect("status");
    assert_eq!(standby.calls(), 1, "later calls go straight to the leader");
}

#[tokio::test]
async fn a_hint_naming_an_unknown_coordinator_adds_it_and_a_bad_hint_is_ignored() {
    let leader = coordinator().await;
    let standby = stub(Role::Standby {
        leader: Some(leader.url.clone()),
    })
    .await;
    let client = Client::connect_any(&[&standby.url]).await.expect("client");
    client
        .status(&res("hints/learn"))
        .await
        .expect("status through the hint");
    assert_eq!(client.coordinators(), vec![standby.url.clone(), leader.url.clone()]);

    let liar = stub(Role::Standby {
        leader: Some("ftp://elsewhere:21".into()),
    })
    .await;
    let client = Client::connect_any(&[&liar.url, &leader.url]).await.expect("client");
    client
        .status(&res("hints/learn"))
        .await
        .expect("status on the next coordinator");
    assert_eq!(
        client.coordinators(),
        vec![liar.url.clone(), leader.url.clone()],
        "not added"
    );
}

#[tokio::test]
async fn a_coordinator_that_is_down_is_skipped() {
    let leader = coordinator().await;
    let dead = dead_url().await;
    let client = Client::connect_any(&[&dead, &leader.url])
        .await
        .expect("a dead coordinator does not stop it");
    let lease = client
        .acquire(&res("hints/dead"), Duration::from_secs(10), None, Duration::ZERO)
        .await
        .expect("acquired on the live coordinator");
    assert_eq!(lease.token.get(), 1);
    assert_eq!(client.active(), leader.url);
}

#[tokio::test]
async fn a_list_with_an_invalid_entry_is_refused_by_name() {
    let empty: [&str; 0] = [];
    for urls in [&empty[..], &["http://127.0.0.1:7740", "127.0.0.1:7741"], &["ftp://x"]] {
        match Client::connect_any(urls).await {
            Err(ClientError::Invalid(e)) => {
                assert_eq!(e.field(), "server");
                assert!(
                    e.message().contains("http://127.0.0.1:7740"),
                    "says what is allowed: {e}"
                );
            }
            other => panic!("{urls:?} must be refused: {other:?}"),
        }
    }
}

#[tokio::test]
async fn after_the_connection_breaks_under_a_sent_request_status_is_retried_but_acquire_is_not() {
    let leader = coordinator().await;
    let r = res("hints/ambiguous");

    // status: idempotent, so it goes on to the leader.
    let sink = stub(Role::Swallow).await;
    let cut = proxy(sink.addr).await;
    let client = Client::connect_any(&[&cut.url, &leader.url]).await.expect("client");
    let call = tokio::spawn({
        let (client, r) = (client.clone(), r.clone());
        async move { client.status(&r).await }
    });
    timeout(Duration::from_secs(10), sink.received.notified())
        .await
        .expect("the stub got the status");
    cut.cut();
    let status = call.await.expect("joined").expect("status retried on the leader");
    assert_eq!(status.last_token, None);

    // acquire: the grant may have happened where the request went, so the
    // error is surfaced and nothing is acquired anywhere else.
    let sink = stub(Role::Swallow).await;
    let cut = proxy(sink.addr).await;
    let client = Client::connect_any(&[&cut.url, &leader.url]).await.expect("client");
    let call = tokio::spawn({
        let (client, r) = (client.clone(), r.clone());
        async move { client.acquire(&r, Duration::from_secs(10), None, Duration::ZERO).await }
    });
    timeout(Duration::from_secs(10), sink.received.notified())
        .await
        .expect("the stub got the acquire");
    cut.cut();
    match call.await.expect("joined") {
        Err(ClientError::Transport { message, .. }) => {
            assert!(message.contains("not retried"), "says why: {message}");
        }
        other => panic!("an acquire whose connection broke after it was sent must fail: {other:?}"),
    }
    let direct = Client::connect(&leader.url).await.expect("connect");
    let after = direct.status(&r).await.expect("status");
    assert_eq!((after.held, after.last_token), (None, None), "no grant on the leader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_whose_stream_is_cut_renews_on_the_coordinator_a_hint_names() {
    let leader = coordinator().await;
    let cut = proxy(leader.addr).await;
    let standby = stub(Role::Standby {
        leader: Some(leader.url.clone()),
    })
    .await;
    let client = Client::connect_any(&[&cut.url, &standby.url]).await.expect("client");
    let (r, ttl) = (res("hints/keepalive"), Duration::from_secs(2));
    let lease = client.lease(&r, ttl).await.expect("acquired through the proxy");
    cut.cut();
    sleep(ttl * 5 / 2).await;
    assert!(!lease.is_lost(), "lost: {:?}", lease.watch().loss());
    assert!(
        standby.calls() >= 1,
        "the keep-alive asked the standby where the leader is"
    );
    assert_eq!(client.active(), leader.url);
    let since = client.clock().now().saturating_since(lease.renewed_at());
    assert!(since < ttl, "renewed {since:?} ago");
    let direct = Client::connect(&leader.url).await.expect("connect");
    let held = direct.status(&r).await.expect("status").held.expect("still held");
    assert_eq!(held.1, lease.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_resyncs_on_the_coordinator_a_hint_names() {
    let (a, b) = (coordinator().await, coordinator().await);
    let name = res("hints/observe");
    let holder = |h: &str| Holder::new(h).expect("valid");
    let on_a = Client::connect(&a.url).await.expect("connect");
    let on_b = Client::connect(&b.url).await.expect("connect");
    let first = on_a
        .lease(&name, LeaseConfig::new(ms(10_000)).with_holder(holder("a")))
        .await
        .expect("a");
    for h in ["b1", "b2"] {
        let l = on_b
            .acquire(&name, ms(10_000), Some(&holder(h)), Duration::ZERO)
            .await
            .expect(h);
        if h == "b1" {
            on_b.release(&name, &l.lease_id).await.expect("release b1");
        }
    }

    let cut = proxy(a.addr).await;
    let standby = stub(Role::Standby {
        leader: Some(b.url.clone()),
    })
    .await;
    let client = Client::connect_any(&[&cut.url, &standby.url]).await.expect("client");
    let mut changes = client.observe(&name);
    let seen = next(&mut changes).await.expect("the state on a");
    assert_eq!(seen.term().map(|t| t.get()), Some(1));
    // An event on a, so that the observer resumes from a's history.
    first.release().await.expect("release a");
    let seen = next(&mut changes).await.expect("the release on a");
    assert_eq!(
        seen,
        LeaderChange::Vacant {
            last_term: Some(first_term())
        }
    );
    cut.cut();
    let resynced = timeout(Duration::from_secs(20), async {
        loop {
            match next(&mut changes).await {
                Err(_) => continue,
                Ok(change) => return change,
            }
        }
    })
    .await
    .expect("the observer found the coordinator the hint names");
    assert_eq!(
        resynced,
        LeaderChange::Leader {
            term: leasefence_core::Token::new(2).expect("non-zero"),
            holder: holder("b2")
        },
        "b's state after the resync"
    );
}

async fn next(changes: &mut LeaderChanges) -> Result<LeaderChange, ClientError> {
    let item = timeout(Duration::from_secs(10), changes.next()).await;
    item.expect("a change in time").expect("still observing")
}

fn first_term() -> leasefence_core::Token {
    leasefence_core::Token::new(1).expect("non-zero")
}

#[tokio::test]
async fn a_status_moves_on_from_a_coordinator_that_never_answers_and_an_acquire_does_not() {
    let leader = coordinator().await;
    let sink = stub(Role::Swallow).await;
    let options = ClientOptions::default().with_call_timeout(Duration::from_secs(2));
    let client = Client::connect_any_with(&[&sink.url, &leader.url], options)
        .await
        .expect("client");
    let r = res("hints/silent");
    let status = client
        .status(&r)
        .await
        .expect("status answered by the leader within the call timeout");
    assert_eq!(status.last_token, None);

    let client = Client::connect_any_with(&[&sink.url, &leader.url], client.options().clone())
        .await
        .expect("client");
    match client.acquire(&r, Duration::from_secs(10), None, Duration::ZERO).await {
        Err(ClientError::Transport { message, .. }) => assert!(message.contains("no answer"), "{message}"),
        other => panic!("an unanswered acquire must not be sent elsewhere: {other:?}"),
    }
    let after = client.status(&r).await.expect("status");
    assert_eq!((after.held, after.last_token), (None, None), "no grant on the leader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_skips_a_coordinator_that_never_opens_its_stream() {
    let leader = coordinator().await;
    let cut = proxy(leader.addr).await;
    let sink = stub(Role::Swallow).await;
    let standby = stub(Role::Standby {
        leader: Some(leader.url.clone()),
    })
    .await;
    let client = Client::connect_any(&[&cut.url, &sink.url, &standby.url])
        .await
        .expect("client");
    let (r, ttl) = (res("hints/stalled"), Duration::from_secs(3));
    let lease = client.lease(&r, ttl).await.expect("acquired through the proxy");
    cut.cut();
    sleep(ttl * 2).await;
    assert!(!lease.is_lost(), "lost: {:?}", lease.watch().loss());
    assert!(sink.calls() >= 1, "the silent coordinator was tried");
    assert_eq!(client.active(), leader.url, "and left for the leader the standby named");
}
