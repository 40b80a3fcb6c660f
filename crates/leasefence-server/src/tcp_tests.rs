//! A client that vanishes without closing its connection (no FIN, no RST, as
//! when its host is powered off or its VM stopped) gives its place under
//! `--connections-max` back, on the main port and on the frame port.
//!
//! The client is made to vanish with `TCP_REPAIR` (see `vanish`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leasefence_proto::frame::{self, Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::auth::Limits;
use crate::silent_tests::{h2_open, h2_ping};
use crate::tcp::{KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES};
use crate::{Server, ServerConfig};

#[path = "../tests/support/vanish.rs"]
mod vanish;
use vanish::vanish;

/// A coordinator that serves one connection at a time on each port.
async fn serve_one_connection() -> (SocketAddr, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path().to_path_buf());
    config.frames_listen = Some("127.0.0.1:0".parse().expect("addr"));
    config.limits = Limits {
        connections_max: 1,
        ..Limits::default()
    };
    let server = Server::bind(config).await.expect("bind");
    let main = server.local_addr().expect("bound");
    let frames = server.frames_addr().expect("frames configured").expect("bound");
    tokio::spawn(server.run(std::future::pending()));
    (main, frames, dir)
}

/// `GET /healthz` on `s`, kept open: the answer's status line.
async fn healthz_on(s: &mut TcpStream) -> String {
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("an answer in time")
        .expect("read");
    let text = String::from_utf8_lossy(&buf[..n]);
    text.lines().next().unwrap_or_default().to_string()
}

/// `GET /healthz` on a new connection: the status line, and the connection.
pub(crate) async fn healthz(addr: SocketAddr) -> (String, TcpStream) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    (healthz_on(&mut s).await, s)
}

/// A hello on a new frame connection: whether it was welcomed (or refused
/// for the limit), and the connection.
async fn hello(addr: SocketAddr) -> (bool, TcpStream) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut buf = Vec::new();
    // Over the limit the refusal comes at once, unasked, and the port
    // closes: read it before writing into a closed connection.
    let unasked = tokio::time::timeout(Duration::from_millis(300), frame::read_frame(&mut s, &mut buf)).await;
    match unasked {
        Ok(read) => assert!(read.expect("readable"), "closed without a word"),
        Err(_) => {
            let mut out = Vec::new();
            let hello = Request::Hello {
                version: frame::VERSION,
                token: None,
            };
            frame::encode_request(&hello, &mut out);
            s.write_all(&out).await.expect("write");
            let read = tokio::time::timeout(Duration::from_secs(5), frame::read_frame(&mut s, &mut buf));
            assert!(read.await.expect("answered in time").expect("readable"), "closed");
        }
    }
    let answer = frame::decode_response(&buf).expect("a valid answer");
    match &answer {
        Response::Welcome { .. } => (true, s),
        Response::Refused(r) if r.kind == "limit_exceeded" => (false, s),
        other => panic!("expected a welcome or the connection limit, got {other:?}"),
    }
}

/// Longer than keepalive takes to end a vanished client's connection.
fn keepalive_bound() -> Duration {
    KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * (KEEPALIVE_PROBES + 1) + Duration::from_secs(3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_vanishes_without_closing_gives_its_connection_back() {
    let (main, frames, _dir) = serve_one_connection().await;

    // The main port: the one slot is taken, the next connection is refused.
    // The slot is held over HTTP/2, which may stay idle: an idle HTTP/1
    // connection would be closed by the header timeout, vanished or not.
    let mut held = h2_open(main).await;
    assert!(h2_ping(&mut held).await);
    let (status, _refused) = healthz(main).await;
    assert!(status.starts_with("HTTP/1.1 429"), "{status}");
    // Until every segment has been acknowledged both ways (delayed ACKs):
    // an ACK that reached the vanished socket's port would draw a reset.
    tokio::time::sleep(Duration::from_millis(500)).await;
    if !vanish(held) {
        return;
    }
    let started = Instant::now();
    loop {
        let (status, _conn) = healthz(main).await;
        if status == "HTTP/1.1 200 OK" {
            break;
        }
        assert!(status.starts_with("HTTP/1.1 429"), "{status}");
        assert!(
            started.elapsed() < keepalive_bound(),
            "the main port still counts a vanished client after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The frame port, the same way.
    let (welcomed, held) = hello(frames).await;
    assert!(welcomed, "the first frame connection is served");
    let (welcomed, _refused) = hello(frames).await;
    assert!(!welcomed, "a second frame connection is over the limit");
    assert!(vanish(held));
    let started = Instant::now();
    loop {
        let (welcomed, _conn) = hello(frames).await;
        if welcomed {
            break;
        }
        assert!(
            started.elapsed() < keepalive_bound(),
            "the frame port still counts a vanished client after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_client_that_stays_silent_keeps_its_connection() {
    let (main, frames, _dir) = serve_one_connection().await;
    // HTTP/2, as gRPC clients keep theirs: an idle HTTP/1 connection is
    // closed after the header timeout (see `silent_tests`).
    let mut held = h2_open(main).await;
    assert!(h2_ping(&mut held).await);
    let (welcomed, mut held_frames) = hello(frames).await;
    assert!(welcomed);
    // Silent for longer than a vanished client would last: its kernel
    // answers the probes, so both connections stay.
    tokio::time::sleep(keepalive_bound()).await;
    assert!(
        h2_ping(&mut held).await,
        "the main port closed a live client's connection"
    );
    let mut out = Vec::new();
    frame::encode_request(&Request::Status { resource: "r".into() }, &mut out);
    held_frames.write_all(&out).await.expect("write");
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), frame::read_frame(&mut held_frames, &mut buf));
    assert!(read.await.expect("answered in time").expect("readable"), "closed");
    let answer = frame::decode_response(&buf).expect("a valid answer");
    assert!(!matches!(answer, Response::Refused(_)), "{answer:?}");
}
