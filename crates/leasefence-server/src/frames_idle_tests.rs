//! The frame port's idle timeout (`ServerConfig::connection_idle`), spoken
//! to in raw frames: a connection with no request for that long is told it
//! is closing (version 2) and closed after the grace, and gives its slot
//! back; a request that crossed the notice is still answered; requests and
//! a call in progress keep a connection; a version-1 connection is closed
//! without a frame it would not understand. And an idle connection ends
//! when the coordinator stops, whatever its idle timeout.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leasefence_proto::frame::{Request, Response};

use super::tests::{Conn, acquire, serve_with};
use crate::auth::Limits;
use crate::edge::serve::IDLE_CLOSE_GRACE;
use crate::{Server, ServerConfig};

/// The idle timeout in these tests.
const IDLE: Duration = Duration::from_millis(1500);
/// Slack for the scheduler when a timer is checked from outside.
const SLACK: Duration = Duration::from_millis(50);

/// A coordinator with the idle timeout of these tests and room for `connections` connections.
async fn serve(connections: usize) -> (SocketAddr, tempfile::TempDir) {
    serve_with(|config| {
        config.connection_idle = IDLE;
        config.limits = Limits {
            connections_max: connections,
            ..Limits::default()
        };
    })
    .await
}

/// Waits (up to 2 s) for a new connection to be welcomed: the slot of one
/// that just closed is given back as its task ends, a moment after the close.
async fn welcomed_soon(addr: SocketAddr) {
    let started = Instant::now();
    loop {
        let (_c, answer) = Conn::hello(addr, None).await;
        if matches!(answer, Response::Welcome { .. }) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the slot was not given back: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_idle_connection_is_told_it_is_closing_then_closed_and_gives_its_slot_back() {
    let (addr, _dir) = serve(1).await;
    let mut c = Conn::welcomed(addr).await;
    let started = Instant::now();
    assert_eq!(c.answer().await, Response::Closing);
    let told = started.elapsed();
    assert!(
        told + SLACK >= IDLE && told < IDLE + Duration::from_secs(2),
        "told after {told:?}"
    );
    assert!(c.closed().await, "closed after the grace");
    let closed = started.elapsed();
    assert!(
        closed + SLACK >= told + IDLE_CLOSE_GRACE,
        "closed {closed:?}, told {told:?}"
    );
    welcomed_soon(addr).await;
}

#[tokio::test]
async fn a_request_that_crossed_the_closing_notice_is_answered_after_it() {
    let (addr, _dir) = serve(4).await;
    let mut c = Conn::welcomed(addr).await;
    // Sent after the notice left, before it is read: as a client that took
    // the connection from its pool just as the coordinator gave up on it.
    tokio::time::sleep(IDLE + Duration::from_millis(300)).await;
    let crossed = c.call(&acquire("crossed")).await;
    assert_eq!(crossed, Response::Closing);
    let granted = c.answer().await;
    assert!(matches!(granted, Response::Lease { token: 1, .. }), "{granted:?}");
    let answered = Instant::now();
    assert!(c.closed().await);
    assert!(
        answered.elapsed() + SLACK >= IDLE_CLOSE_GRACE,
        "closed {:?} after the answer",
        answered.elapsed()
    );
}

#[tokio::test]
async fn a_connection_that_keeps_calling_is_not_idle() {
    let (addr, _dir) = serve(4).await;
    let mut c = Conn::welcomed(addr).await;
    let started = Instant::now();
    while started.elapsed() < IDLE * 3 {
        tokio::time::sleep(IDLE * 2 / 3).await;
        let status = c
            .call(&Request::Status {
                resource: "busy".into(),
            })
            .await;
        assert!(
            matches!(status, Response::Status { .. }),
            "at {:?}: {status:?}",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn a_call_in_progress_is_not_idle() {
    let (addr, _dir) = serve(4).await;
    let mut holder = Conn::welcomed(addr).await;
    let ttl_ms = u64::try_from((IDLE * 5 / 2).as_millis()).expect("small");
    let held = holder
        .call(&Request::Acquire {
            resource: "held".into(),
            holder: "a".into(),
            ttl_ms,
            wait_ms: 0,
            lock_delay_ms: 0,
        })
        .await;
    assert!(matches!(held, Response::Lease { token: 1, .. }), "{held:?}");
    // Waits for the lease to expire, longer than the idle timeout: the
    // first frame it gets is its grant, not a notice.
    let mut waiter = Conn::welcomed(addr).await;
    let started = Instant::now();
    let granted = waiter
        .call(&Request::Acquire {
            resource: "held".into(),
            holder: "b".into(),
            ttl_ms: 10_000,
            wait_ms: 10_000,
            lock_delay_ms: 0,
        })
        .await;
    assert!(matches!(granted, Response::Lease { token: 2, .. }), "{granted:?}");
    assert!(started.elapsed() > IDLE, "waited {:?}", started.elapsed());
}

#[tokio::test]
async fn a_version_1_connection_is_closed_without_notice() {
    let (addr, _dir) = serve(1).await;
    let mut c = Conn::open(addr).await;
    let hello = Request::Hello {
        version: 1,
        token: None,
    };
    assert_eq!(c.call(&hello).await, Response::Welcome { version: 1 });
    let started = Instant::now();
    // `closed` reads one byte: a frame would be a byte, not the end.
    assert!(c.closed().await, "closed with nothing sent");
    assert!(
        started.elapsed() + SLACK >= IDLE,
        "closed after {:?}",
        started.elapsed()
    );
    welcomed_soon(addr).await;
}

#[tokio::test]
async fn an_idle_timeout_longer_than_the_clock_holds_means_never() {
    let (addr, _dir) = serve_with(|config| config.connection_idle = Duration::MAX).await;
    let mut c = Conn::welcomed(addr).await;
    for _ in 0..2 {
        let status = c.call(&Request::Status { resource: "r".into() }).await;
        assert!(matches!(status, Response::Status { .. }), "{status:?}");
    }
}

#[tokio::test]
async fn an_idle_connection_ends_when_the_coordinator_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path().to_path_buf());
    config.frames_listen = Some("127.0.0.1:0".parse().expect("addr"));
    let server = Server::bind(config).await.expect("bind");
    let addr = server.frames_addr().expect("frames configured").expect("bound");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let mut c = Conn::welcomed(addr).await;
    let status = c.call(&Request::Status { resource: "r".into() }).await;
    assert!(matches!(status, Response::Status { .. }), "{status:?}");
    let _ = stop.send(());
    let started = Instant::now();
    assert!(c.closed().await, "closed once the coordinator stopped");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "closed after {:?}",
        started.elapsed()
    );
    let ran = tokio::time::timeout(Duration::from_secs(5), running).await;
    assert!(ran.expect("stopped in time").expect("no panic").is_ok());
}
