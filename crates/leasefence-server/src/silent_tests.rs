//! A live client that connects to the main port and sends nothing, or only
//! part of a request head, gives its place under `--connections-max` back
//! after the serve loop's deadlines (see `edge::serve`); an HTTP/2 client
//! that stays silent after its preface keeps its connection.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::auth::Limits;
use crate::edge::serve::{FIRST_BYTES_TIMEOUT, HEADER_READ_TIMEOUT};
use crate::tcp_tests::healthz;
use crate::{Server, ServerConfig};

/// The HTTP/2 connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;

/// A coordinator that serves one connection at a time on its main port.
async fn serve_one_connection() -> (SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path().to_path_buf());
    config.limits = Limits {
        connections_max: 1,
        ..Limits::default()
    };
    let server = Server::bind(config).await.expect("bind");
    let main = server.local_addr().expect("bound");
    tokio::spawn(server.run(std::future::pending()));
    (main, dir)
}

/// Polls `GET /healthz` until it is served, failing after `bound`: how long
/// the slot stayed taken.
async fn wait_for_slot(addr: SocketAddr, bound: Duration, what: &str) -> Duration {
    let started = Instant::now();
    loop {
        let (status, _conn) = healthz(addr).await;
        if status == "HTTP/1.1 200 OK" {
            return started.elapsed();
        }
        assert!(status.starts_with("HTTP/1.1 429"), "{status}");
        assert!(
            started.elapsed() < bound,
            "{what} still holds the only connection slot after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether `s` was closed by the server (end of stream or reset) within `bound`.
async fn closed_within(s: &mut TcpStream, bound: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + bound;
    loop {
        match tokio::time::timeout_at(deadline.into(), s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_nothing_gives_its_connection_back() {
    let (main, _dir) = serve_one_connection().await;
    let mut silent = TcpStream::connect(main).await.expect("connect");
    let (status, _refused) = healthz(main).await;
    assert!(
        status.starts_with("HTTP/1.1 429"),
        "the silent client holds the slot: {status}"
    );
    let bound = FIRST_BYTES_TIMEOUT + Duration::from_secs(3);
    wait_for_slot(main, bound, "a client that sent nothing").await;
    assert!(
        closed_within(&mut silent, Duration::from_secs(1)).await,
        "and its connection was closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_inside_a_request_head_gives_its_connection_back() {
    let (main, _dir) = serve_one_connection().await;
    let mut slow = TcpStream::connect(main).await.expect("connect");
    slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        .await
        .expect("write");
    let (status, _refused) = healthz(main).await;
    assert!(
        status.starts_with("HTTP/1.1 429"),
        "the slow client holds the slot: {status}"
    );
    let bound = HEADER_READ_TIMEOUT + Duration::from_secs(3);
    wait_for_slot(main, bound, "a client that stopped inside its request head").await;
    assert!(
        closed_within(&mut slow, Duration::from_secs(1)).await,
        "and its connection was closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_connection_idle_between_requests_is_closed_after_the_header_timeout() {
    let (main, _dir) = serve_one_connection().await;
    let (status, mut idle) = healthz(main).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let bound = HEADER_READ_TIMEOUT + Duration::from_secs(3);
    assert!(closed_within(&mut idle, bound).await, "still open after {bound:?}");
    let (status, _conn) = healthz(main).await;
    assert_eq!(status, "HTTP/1.1 200 OK", "its slot is free again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_that_stays_silent_keeps_its_connection() {
    let (main, _dir) = serve_one_connection().await;
    let mut h2 = h2_open(main).await;
    assert!(h2_ping(&mut h2).await, "served at first");
    tokio::time::sleep(FIRST_BYTES_TIMEOUT + HEADER_READ_TIMEOUT + Duration::from_secs(1)).await;
    assert!(
        h2_ping(&mut h2).await,
        "still served after a silence longer than both deadlines"
    );
}

/// A new HTTP/2 connection (prior knowledge): the preface and empty settings.
pub(crate) async fn h2_open(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(PREFACE).await.expect("write");
    write_frame(&mut s, SETTINGS, 0, &[]).await;
    s
}

/// Sends a PING on `s` and reads until its ACK: whether the connection is
/// served (false when it was closed, reset or sent GOAWAY). The server's
/// SETTINGS are acknowledged on the way.
pub(crate) async fn h2_ping(s: &mut TcpStream) -> bool {
    const OPAQUE: &[u8; 8] = b"fencing!";
    if s.write_all(&frame(PING, 0, OPAQUE)).await.is_err() {
        return false;
    }
    loop {
        let mut head = [0u8; 9];
        let read = tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut head)).await;
        let Ok(Ok(_)) = read else { return false };
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let mut payload = vec![0u8; len];
        if s.read_exact(&mut payload).await.is_err() {
            return false;
        }
        match kind {
            PING if flags & ACK != 0 && payload == OPAQUE => return true,
            SETTINGS if flags & ACK == 0 => write_frame(s, SETTINGS, ACK, &[]).await,
            GOAWAY => return false,
            _ => {}
        }
    }
}

/// An HTTP/2 frame on stream 0.
fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 0];
    out.extend_from_slice(payload);
    out
}

async fn write_frame(s: &mut TcpStream, kind: u8, flags: u8, payload: &[u8]) {
    s.write_all(&frame(kind, flags, payload)).await.expect("write");
}
