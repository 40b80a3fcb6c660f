//! A coordinator that stops answering without closing the connection (a
//! black hole: a partition, a dead host behind a stateful firewall) must not
//! hang the client. Through a TCP proxy that can be told to drop every byte
//! while keeping its sockets open: a `Client` call becomes a transport error
//! within about its call timeout, and `leasefence run` exits 4 within its
//! TTL, grace and call timeout.

mod common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{BIN, Coordinator, cli, ms};
use leasefence_client::{Client, ClientError, ClientOptions};
use leasefence_core::{LeaseError, ResourceId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, timeout};

/// Forwards loopback TCP connections to `upstream` until told to black-hole.
struct Proxy {
    url: String,
    black_holed: Arc<AtomicBool>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let url = format!("http://{}", listener.local_addr().expect("proxy addr"));
        let black_holed = Arc::new(AtomicBool::new(false));
        let flag = black_holed.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (client_rx, client_tx) = client.into_split();
                let (server_rx, server_tx) = server.into_split();
                tokio::spawn(pump(client_rx, server_tx, flag.clone()));
                tokio::spawn(pump(server_rx, client_tx, flag.clone()));
            }
        });
        Proxy { url, black_holed }
    }

    /// From now on, every byte either way is read and dropped; no socket closes.
    fn black_hole(&self) {
        self.black_holed.store(true, Ordering::SeqCst);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    black_holed: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if black_holed.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // Keep the other direction's socket open even after this one ends.
    if !black_holed.load(Ordering::SeqCst) {
        let _ = to.shutdown().await;
    }
    std::future::pending::<()>().await;
}

fn addr(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().expect("coordinator address")
}

fn res(name: &str) -> ResourceId {
    ResourceId::new(name).expect("valid resource")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_call_is_a_transport_error_within_the_call_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let proxy = Proxy::start(addr(&c.url)).await;
    let call_timeout = ms(500);
    let options = ClientOptions::default().with_call_timeout(call_timeout);
    let client = Client::connect_with(&proxy.url, options).await.expect("connect");
    let r = res("blackhole/call");
    client.status(&r).await.expect("answered while forwarding");

    // An acquire that waits is given its wait on top of the call timeout.
    let held = client.acquire(&r, ms(5_000), None, ms(0)).await.expect("acquire");
    let start = Instant::now();
    match client.acquire(&r, ms(1_000), None, ms(1_000)).await {
        Err(ClientError::Lease(LeaseError::Busy { .. })) => {}
        other => panic!("waited its full second and was told busy, not cut off: {other:?}"),
    }
    // The coordinator times the wait from receipt, in whole milliseconds.
    assert!(start.elapsed() >= ms(900), "waited {:?}", start.elapsed());

    proxy.black_hole();
    let bound = call_timeout * 3;
    for call in ["status", "renew", "release"] {
        let start = Instant::now();
        let out = timeout(bound, async {
            match call {
                "status" => client.status(&r).await.map(drop),
                "renew" => client.renew(&r, &held.lease_id).await.map(drop),
                _ => client.release(&r, &held.lease_id).await.map(drop),
            }
        })
        .await;
        let took = start.elapsed();
        match out {
            Ok(Err(ClientError::Transport { message, .. })) => {
                assert!(
                    took >= call_timeout,
                    "{call}: failed after {took:?}, before its timeout"
                );
                eprintln!("{call}: transport error after {} ms: {message}", took.as_millis());
            }
            Ok(other) => panic!("{call}: expected a transport error, got {other:?}"),
            Err(_) => panic!("{call}: still hanging after {bound:?} (call timeout {call_timeout:?})"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exits_4_in_bounded_time_when_the_coordinator_is_black_holed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let proxy = Proxy::start(addr(&c.url)).await;
    let (ttl, grace, call_timeout) = (ms(2_000), ms(500), ms(1_000));
    let mut run = tokio::process::Command::new(BIN)
        .args([
            "run",
            "blackhole/run",
            "--ttl",
            "2s",
            "--grace",
            "500ms",
            "--timeout",
            "1s",
        ])
        .args(["--server", &proxy.url, "--", "sleep", "60"])
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn run");
    let start = Instant::now();
    loop {
        let url = c.url.clone();
        let (_, out, _) = tokio::task::spawn_blocking(move || cli(&["status", "blackhole/run", "--server", &url]))
            .await
            .expect("status");
        if out.contains("held by") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "run never acquired: {out}");
        tokio::time::sleep(ms(20)).await;
    }
    // Let a renewal or two go through the proxy first.
    tokio::time::sleep(ms(700)).await;
    proxy.black_hole();
    let black_holed_at = Instant::now();
    let bound = ttl + grace + call_timeout + Duration::from_secs(2);
    let status = match timeout(bound, run.wait()).await {
        Ok(status) => status.expect("wait for run"),
        Err(_) => panic!("run still running {bound:?} after the coordinator was black-holed"),
    };
    let took = black_holed_at.elapsed();
    let mut err = String::new();
    if let Some(mut stderr) = run.stderr.take() {
        let _ = stderr.read_to_string(&mut err).await;
    }
    assert_eq!(status.code(), Some(4), "{err}");
    eprintln!("run exited 4 {} ms after the black hole opened", took.as_millis());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_stream_ends_once_keep_alive_pings_go_unanswered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let proxy = Proxy::start(addr(&c.url)).await;
    let (interval, ping_timeout) = (ms(200), ms(300));
    let options = ClientOptions::default().with_keep_alive(interval, ping_timeout);
    let client = Client::connect_with(&proxy.url, options).await.expect("connect");
    let req = leasefence_proto::v1::WatchRequest {
        resource: "blackhole/watch".into(),
        prefix: false,
        after_revision: None,
        coordinator_id: String::new(),
    };
    let mut stream = client.grpc().watch(req).await.expect("watch opened").into_inner();
    proxy.black_hole();
    let start = Instant::now();
    // Streams have no whole-call deadline: only the pings can end this one.
    let bound = (interval + ping_timeout) * 4;
    match timeout(bound, stream.message()).await {
        Ok(Err(status)) => eprintln!("watch ended after {} ms: {status}", start.elapsed().as_millis()),
        Ok(Ok(event)) => panic!("nothing can arrive through the black hole: {event:?}"),
        Err(_) => panic!("the stream still hangs {bound:?} after the black hole opened"),
    }
}
