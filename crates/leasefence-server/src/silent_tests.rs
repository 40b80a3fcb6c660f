//! A live client that connects to the main port and sends nothing, only
//! part of a request head, or only part of a request body, gives its place
//! under `--connections-max` back after the serve loop's deadlines (see
//! `edge::serve`); so does a connection with nothing in progress for the
//! idle timeout, while one with a stream open keeps its place, and a stream
//! that crossed the idle GOAWAY is served to its end.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::auth::Limits;
use crate::edge::activity::BODY_TIMEOUT;
use crate::edge::serve::{FIRST_BYTES_TIMEOUT, HEADER_READ_TIMEOUT, IDLE_CLOSE_GRACE};
use crate::tcp_tests::healthz;
use crate::{Server, ServerConfig};

/// The HTTP/2 connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// The idle timeout of these tests' coordinators: longer than the other
/// deadlines, so that a silence that outlasts them can be told from it.
const IDLE: Duration = Duration::from_secs(3);

/// A coordinator that serves one connection at a time on its main port.
async fn serve_one_connection() -> (SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path().to_path_buf());
    config.limits = Limits {
        connections_max: 1,
        ..Limits::default()
    };
    config.connection_idle = IDLE;
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

/// Waits (up to `bound`) for the slot that `held` took to be free again,
/// then checks that `held` itself was closed.
async fn gives_its_slot_back(main: SocketAddr, held: &mut TcpStream, bound: Duration, what: &str) {
    wait_for_slot(main, bound, what).await;
    assert!(
        closed_within(held, Duration::from_secs(1)).await,
        "{what}: the slot is free, but its connection is still open"
    );
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

/// A new connection to `main` that has sent `bytes` and holds the only slot.
async fn holding_the_slot(main: SocketAddr, bytes: &[u8], what: &str) -> TcpStream {
    let mut s = TcpStream::connect(main).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let (status, _refused) = healthz(main).await;
    assert!(status.starts_with("HTTP/1.1 429"), "{what} holds the slot: {status}");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_nothing_gives_its_connection_back() {
    let (main, _dir) = serve_one_connection().await;
    let mut silent = holding_the_slot(main, b"", "the silent client").await;
    let bound = FIRST_BYTES_TIMEOUT + Duration::from_secs(3);
    gives_its_slot_back(main, &mut silent, bound, "a client that sent nothing").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_inside_a_request_head_gives_its_connection_back() {
    let (main, _dir) = serve_one_connection().await;
    let head = b"GET /healthz HTTP/1.1\r\nhost: x\r\n";
    let mut slow = holding_the_slot(main, head, "the slow client").await;
    let bound = HEADER_READ_TIMEOUT + Duration::from_secs(3);
    gives_its_slot_back(main, &mut slow, bound, "a client that stopped inside its request head").await;
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
async fn a_client_that_stops_inside_a_request_body_is_answered_and_gives_its_connection_back() {
    let (main, _dir) = serve_one_connection().await;
    let head = "POST /v1/acquire HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 64";
    let partial = format!("{head}\r\n\r\n{{\"resource\":");
    let mut slow = holding_the_slot(main, partial.as_bytes(), "the slow client").await;
    let started = Instant::now();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(BODY_TIMEOUT + Duration::from_secs(3), slow.read(&mut buf))
        .await
        .expect("answered within the body timeout")
        .expect("read");
    let answer = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""error":"request_timeout""#), "{answer}");
    assert!(
        answer.contains("request body did not arrive whole"),
        "says what was late: {answer}"
    );
    assert!(
        started.elapsed() >= BODY_TIMEOUT - Duration::from_millis(200),
        "{answer}"
    );
    let bound = Duration::from_secs(3);
    gives_its_slot_back(main, &mut slow, bound, "a client that stopped inside its request body").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_with_nothing_in_progress_is_closed_after_the_idle_timeout() {
    let (main, _dir) = serve_one_connection().await;
    let mut h2 = h2_open(main).await;
    assert!(h2_ping(&mut h2).await, "served at first");
    tokio::time::sleep(FIRST_BYTES_TIMEOUT + HEADER_READ_TIMEOUT + Duration::from_millis(200)).await;
    assert!(
        h2_ping(&mut h2).await,
        "still served after a silence longer than the first-bytes and header deadlines"
    );
    let (status, _refused) = healthz(main).await;
    assert!(
        status.starts_with("HTTP/1.1 429"),
        "the idle client holds the slot: {status}"
    );
    // The GOAWAY's PING goes unanswered here: the connection is dropped
    // after the grace.
    wait_for_slot(main, IDLE + Duration::from_secs(3), "an idle HTTP/2 connection").await;
    assert!(!h2_ping(&mut h2).await, "its connection was told to go away");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_with_a_stream_open_outlives_the_idle_timeout() {
    let (main, _dir) = serve_one_connection().await;
    let mut h2 = h2_open(main).await;
    // A keep-alive stream: its request goes on for as long as its client
    // renews, so it has no body deadline.
    h2_start_request(&mut h2, 1, KEEP_ALIVE, false).await;
    assert!(h2_ping(&mut h2).await, "served at first");
    tokio::time::sleep(IDLE + Duration::from_secs(1)).await;
    assert!(h2_ping(&mut h2).await, "kept while its stream is open");
    // The client ends the stream: from then on nothing is in progress.
    write_frame_on(&mut h2, DATA, END_STREAM, 1, &[]).await;
    let ended = Instant::now();
    assert!(
        closed_within(&mut h2, IDLE + Duration::from_secs(3)).await,
        "still open {:?} after its last stream ended",
        ended.elapsed()
    );
    assert!(
        ended.elapsed() >= IDLE - Duration::from_millis(200),
        "closed too soon: {:?}",
        ended.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_opened_across_the_idle_goaway_is_not_cut_off() {
    let (main, _dir) = serve_one_connection().await;
    let mut h2 = h2_open(main).await;
    assert!(
        h2_wait_for(&mut h2, GOAWAY, IDLE + Duration::from_secs(2)).await,
        "no GOAWAY after the idle timeout"
    );
    // A client that had not yet read the GOAWAY opens a stream, which the
    // GOAWAY still admits (its last stream id is the highest there is), and
    // keeps it open past the grace an idle connection has to close.
    h2_start_request(&mut h2, 1, KEEP_ALIVE, false).await;
    assert!(
        !closed_within(&mut h2, IDLE_CLOSE_GRACE * 2).await,
        "the connection was dropped with a stream open"
    );
    write_frame_on(&mut h2, DATA, END_STREAM, 1, &[]).await;
    assert!(
        closed_within(&mut h2, IDLE_CLOSE_GRACE * 2 + Duration::from_secs(1)).await,
        "still open after its stream ended"
    );
}

/// Reads frames from `s` until one of `kind` arrives (true), or the
/// connection ends or `bound` passes (false).
async fn h2_wait_for(s: &mut TcpStream, kind: u8, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    while let Some((k, _, _)) = h2_read_frame(s, deadline).await {
        if k == kind {
            return true;
        }
    }
    false
}

/// The next frame on `s`: its type, flags and payload; `None` when the
/// connection ended or `deadline` passed first.
async fn h2_read_frame(s: &mut TcpStream, deadline: Instant) -> Option<(u8, u8, Vec<u8>)> {
    let mut head = [0u8; 9];
    let read = tokio::time::timeout_at(deadline.into(), s.read_exact(&mut head)).await;
    let Ok(Ok(_)) = read else { return None };
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await.ok()?;
    Some((head[3], head[4], payload))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_whose_body_never_comes_does_not_keep_its_connection() {
    let (main, _dir) = serve_one_connection().await;
    let mut h2 = h2_open(main).await;
    // A unary call that sends its headers and never its message.
    h2_start_request(&mut h2, 1, ACQUIRE, false).await;
    assert!(h2_ping(&mut h2).await, "served at first");
    let (status, _refused) = healthz(main).await;
    assert!(
        status.starts_with("HTTP/1.1 429"),
        "the stalled call holds the slot: {status}"
    );
    let bound = BODY_TIMEOUT + IDLE + Duration::from_secs(3);
    wait_for_slot(main, bound, "a gRPC call whose message never came").await;
}

/// The gRPC methods these tests call, by path.
const KEEP_ALIVE: &str = "/leasefence.v1.Leases/KeepAlive";
const ACQUIRE: &str = "/leasefence.v1.Leases/Acquire";

/// Opens stream `id` on `s` with a gRPC request's headers for `path`, and
/// no body yet (ended at once when `end`).
async fn h2_start_request(s: &mut TcpStream, id: u32, path: &str, end: bool) {
    // HPACK, by hand: `:method: POST` (static entry 3) and `:scheme: http`
    // (6), then literals without indexing of the static names `:path` (4),
    // `:authority` (1) and `content-type` (31).
    let mut block = vec![0x83, 0x86];
    for (name, value) in [(&[0x04][..], path), (&[0x01], "x"), (&[0x0f, 0x10], "application/grpc")] {
        block.extend_from_slice(name);
        block.push(u8::try_from(value.len()).expect("a short value"));
        block.extend_from_slice(value.as_bytes());
    }
    let flags = END_HEADERS | if end { END_STREAM } else { 0 };
    write_frame_on(s, HEADERS, flags, id, &block).await;
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
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Some((kind, flags, payload)) = h2_read_frame(s, deadline).await {
        match kind {
            PING if flags & ACK != 0 && payload == OPAQUE => return true,
            SETTINGS if flags & ACK == 0 => write_frame(s, SETTINGS, ACK, &[]).await,
            GOAWAY => return false,
            _ => {}
        }
    }
    false
}

/// An HTTP/2 frame on stream 0.
fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    frame_on(kind, flags, 0, payload)
}

/// An HTTP/2 frame on stream `id`.
fn frame_on(kind: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

async fn write_frame(s: &mut TcpStream, kind: u8, flags: u8, payload: &[u8]) {
    write_frame_on(s, kind, flags, 0, payload).await;
}

async fn write_frame_on(s: &mut TcpStream, kind: u8, flags: u8, id: u32, payload: &[u8]) {
    s.write_all(&frame_on(kind, flags, id, payload)).await.expect("write");
}
