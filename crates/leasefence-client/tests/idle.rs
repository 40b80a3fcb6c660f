//! A coordinator closes a connection that has had nothing in progress for
//! its idle timeout (`ServerConfig::connection_idle`). Through the real
//! client and the real coordinator: calls made after such a close succeed
//! on a new connection, and a lease's keep-alive, whose stream stays open,
//! keeps its connection however long it runs.
//!
//! The coordinator serves one connection at a time, so whether the client's
//! connection is still open can be read from outside: a new connection is
//! served only once it has closed.
//!
//! Over frames, the frame client's calls go on after the coordinator said
//! it is closing an idle connection of its pool.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leasefence_client::{Client, ClientOptions, FrameClient, LeaseConfig};
use leasefence_core::ResourceId;
use leasefence_server::auth::Limits;
use support::{Coordinator, coordinator_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The coordinator's idle timeout in these tests.
const IDLE: Duration = Duration::from_millis(800);

/// A coordinator that serves one connection at a time.
async fn coordinator() -> Coordinator {
    coordinator_with(|config| {
        config.limits = Limits {
            connections_max: 1,
            ..Limits::default()
        };
        config.connection_idle = IDLE;
    })
    .await
}

fn res(name: &str) -> ResourceId {
    ResourceId::new(name).expect("valid resource")
}

/// Whether a new connection is served (the one slot is free). It asks to
/// be closed after its answer, and is read to its end, so that it gives
/// the slot back before this returns.
async fn slot_free(addr: SocketAddr) -> bool {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await;
    read.expect("answered and closed in time").expect("read");
    answer.starts_with(b"HTTP/1.1 200")
}

/// Waits until the one slot is free, failing after `bound`.
async fn wait_for_slot(addr: SocketAddr, bound: Duration, what: &str) {
    let started = Instant::now();
    while !slot_free(addr).await {
        assert!(
            started.elapsed() < bound,
            "{what}: still open after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The server counts the probe's connection until its task has ended.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_the_coordinator_closed_an_idle_connection_succeed() {
    let c = coordinator().await;
    let client = Client::connect(&c.url).await.expect("client");
    let r = res("idle/calls");
    for round in 1..=3 {
        let lease = client
            .acquire(&r, Duration::from_secs(10), None, Duration::ZERO)
            .await
            .unwrap_or_else(|e| panic!("round {round}: acquire: {e}"));
        assert_eq!(lease.token.get(), round, "one grant a round");
        assert!(
            !slot_free(c.addr).await,
            "round {round}: the client's connection holds the slot"
        );
        client
            .release(&r, &lease.lease_id)
            .await
            .unwrap_or_else(|e| panic!("round {round}: release: {e}"));
        wait_for_slot(c.addr, IDLE + Duration::from_secs(3), "the client's idle connection").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_kept_alive_keeps_its_connection_past_the_idle_timeout() {
    let c = coordinator().await;
    let client = Client::connect(&c.url).await.expect("client");
    let r = res("idle/kept");
    // Renewals every few seconds: longer apart than the idle timeout, so
    // only the open keep-alive stream keeps the connection.
    let lease = client
        .lease(&r, LeaseConfig::new(Duration::from_secs(10)))
        .await
        .expect("lease");
    tokio::time::sleep(IDLE * 4).await;
    assert!(!lease.is_lost(), "the lease was lost");
    assert!(
        !slot_free(c.addr).await,
        "the keep-alive's connection was closed while its stream was open"
    );
    let token = lease.release().await.expect("release");
    assert_eq!(token.get(), 1);
    wait_for_slot(
        c.addr,
        IDLE + Duration::from_secs(3),
        "the connection after its lease ended",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_calls_after_the_coordinator_said_an_idle_connection_is_closing_succeed() {
    let c = coordinator_with(|config| {
        config.frames_listen = Some("127.0.0.1:0".parse().expect("addr"));
        config.connection_idle = IDLE;
    })
    .await;
    let url = format!("leasefence://{}", c.frames.expect("frame port"));
    let client = FrameClient::connect(&url, ClientOptions::default())
        .await
        .expect("client");
    let r = res("idle/frames");
    for round in 1..=3 {
        let lease = client
            .acquire(&r, Duration::from_secs(10), None, Duration::ZERO)
            .await
            .unwrap_or_else(|e| panic!("round {round}: acquire: {e}"));
        assert_eq!(lease.token.get(), round, "one grant a round");
        client
            .release(&r, &lease.lease_id)
            .await
            .unwrap_or_else(|e| panic!("round {round}: release: {e}"));
        // The pooled connection is told it is closing while it idles.
        tokio::time::sleep(IDLE + Duration::from_millis(400)).await;
    }
}
