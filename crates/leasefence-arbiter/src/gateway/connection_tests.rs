//! The gateway's connections: one that sends no request head, or only part
//! of one, or keeps a keep-alive connection idle, is closed after the header
//! timeout instead of holding its socket (and at shutdown the gateway
//! itself) for as long as the client keeps it open; beyond
//! `connections_max`, a new connection is told so and closed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use super::{Gateway, GatewayConfig, HEADER_READ_TIMEOUT};

/// A running gateway: its address, its stop (sent or dropped), and its
/// `run`, which ends once it has stopped.
type Running = (
    SocketAddr,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
);

async fn gateway(dir: &std::path::Path) -> Running {
    gateway_with(GatewayConfig::new("127.0.0.1:0".parse().expect("addr"), dir)).await
}

async fn gateway_with(config: GatewayConfig) -> Running {
    let gateway = Gateway::bind(config).await.expect("bind");
    let addr = gateway.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(gateway.run(async move {
        let _ = stopped.await;
    }));
    (addr, stop, run)
}

/// Reads until the gateway closes the connection; what it sent, and when.
async fn read_to_close(conn: &mut TcpStream, bound: Duration) -> (String, Duration) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(bound.saturating_sub(started.elapsed()), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), started.elapsed()),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "still open after {bound:?}; read so far: {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
}

fn bound() -> Duration {
    HEADER_READ_TIMEOUT + Duration::from_secs(3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, _stop, _run) = gateway(dir.path()).await;
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    let (_, after) = read_to_close(&mut conn, bound()).await;
    assert!(
        after >= HEADER_READ_TIMEOUT - Duration::from_millis(100),
        "closed too early: {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_sent_in_part_is_closed_after_the_header_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, _stop, _run) = gateway(dir.path()).await;
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(b"PUT /objects/slow HTTP/1.1\r\nhost: x\r\n")
        .await
        .expect("write");
    read_to_close(&mut conn, bound()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_its_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, _stop, _run) = gateway(dir.path()).await;
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let (got, after) = read_to_close(&mut conn, bound()).await;
    assert!(got.starts_with("HTTP/1.1 200"), "answered first: {got:?}");
    assert!(got.contains("leasefence-gateway"), "{got:?}");
    assert!(
        after >= HEADER_READ_TIMEOUT - Duration::from_millis(100),
        "kept alive for a while: {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_gateway_is_not_held_open_by_a_half_sent_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, stop, run) = gateway(dir.path()).await;
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(b"GET / HTTP/1.1\r\nhost:").await.expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = stop.send(());
    let ended = tokio::time::timeout(bound(), run).await;
    let served = ended.unwrap_or_else(|_| panic!("the gateway still runs {:?} after it was stopped", bound()));
    served.expect("run task").expect("run");
}

/// `GET /` on a new connection, read until the gateway closes it.
async fn get_root(addr: SocketAddr) -> (TcpStream, String) {
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(bound(), conn.read(&mut buf))
        .await
        .expect("an answer in time")
        .expect("read");
    (conn, String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_beyond_connections_max_is_refused_with_429_and_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = GatewayConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path())
        .with_connections_max(1)
        .expect("1 is allowed");
    let (addr, _stop, _run) = gateway_with(config).await;
    let (held, first) = get_root(addr).await;
    assert!(
        first.starts_with("HTTP/1.1 200"),
        "the first connection is served: {first:?}"
    );

    let (mut refused, answer) = get_root(addr).await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer:?}");
    assert!(answer.contains("connection: close"), "{answer:?}");
    assert!(
        answer.contains("\"limit_exceeded\"") && answer.contains("connections-max"),
        "says which limit: {answer:?}"
    );
    read_to_close(&mut refused, bound()).await;

    // The slot comes back when the held connection closes.
    drop(held);
    let started = Instant::now();
    loop {
        let (_conn, answer) = get_root(addr).await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            started.elapsed() < bound(),
            "still refused after the first connection closed: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
