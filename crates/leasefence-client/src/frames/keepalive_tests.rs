//! A pooled frame connection whose coordinator vanished without closing it
//! (its host powered off, the network cut) is found dead by TCP keepalive
//! while it idles, and dropped from the pool: the next acquire goes on a new
//! connection instead of into the void, where it could only end as outcome
//! unknown.

use std::net::SocketAddr;
use std::time::Duration;

use leasefence_core::{LeaseId, ResourceId};
use leasefence_proto::frame::{self, Request, Response};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::conn::{KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES};
use crate::{ClientOptions, FrameClient};

#[path = "../../../leasefence-server/tests/support/vanish.rs"]
mod vanish;

/// Answers a connection's hello, statuses and acquires. With `vanish`, it
/// vanishes after its first answer past the hello, and says whether it could.
async fn answer(mut s: TcpStream, mut vanish: Option<oneshot::Sender<bool>>) {
    let (mut buf, mut out) = (Vec::new(), Vec::new());
    while let Ok(true) = frame::read_frame(&mut s, &mut buf).await {
        let answer = match frame::decode_request(&buf) {
            Ok(Request::Hello { .. }) => Response::Welcome {
                version: frame::VERSION,
            },
            Ok(Request::Status { .. }) => Response::Status {
                last_token: 3,
                held: None,
                waiters: 0,
            },
            Ok(Request::Acquire { ttl_ms, .. }) => Response::Lease {
                token: 4,
                lease_id: LeaseId::from_bytes([4; 16]),
                holder: "w1".into(),
                ttl_ms,
                expires_in_ms: ttl_ms,
                signature: String::new(),
            },
            _ => return,
        };
        let hello = matches!(answer, Response::Welcome { .. });
        out.clear();
        frame::encode_response(&answer, &mut out);
        if s.write_all(&out).await.is_err() {
            return;
        }
        if !hello && let Some(tx) = vanish.take() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = tx.send(vanish::vanish(s));
            return;
        }
    }
}

/// A frame port whose first connection vanishes after its first answer.
async fn coordinator() -> (SocketAddr, oneshot::Receiver<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut first = Some(tx);
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(answer(s, first.take()));
        }
    });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_whose_coordinator_vanished_is_not_used() {
    let (addr, vanished) = coordinator().await;
    let client = FrameClient::connect(&format!("leasefence://{addr}"), ClientOptions::default())
        .await
        .expect("client");
    let r = ResourceId::new("jobs").expect("resource");
    let status = client.status(&r).await.expect("answered");
    assert_eq!(status.last_token.map(|t| t.get()), Some(3));
    if !vanished.await.expect("the coordinator says") {
        return;
    }
    // Idle in the pool long enough for keepalive to find the peer gone.
    tokio::time::sleep(KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * (KEEPALIVE_PROBES + 1)).await;
    let lease = client
        .acquire(&r, Duration::from_secs(10), None, Duration::ZERO)
        .await
        .expect("granted on a new connection, not left in doubt");
    assert_eq!(lease.token.get(), 4);
}
