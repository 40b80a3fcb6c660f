//! Helpers of the gateway tests: a gateway served from the test process on
//! a free loopback port, fenced requests, raw HTTP/1.1, versioned contents.

#![allow(dead_code)]

use std::path::Path;

use leasefence_arbiter::gateway::{Gateway, GatewayConfig};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A gateway served from this process on a free loopback port; stops on drop.
pub struct Running {
    pub url: String,
    pub addr: std::net::SocketAddr,
    pub dir: tempfile::TempDir,
    pub stop: tokio::sync::oneshot::Sender<()>,
}

pub async fn start_in(dir: tempfile::TempDir, object_size_max: u64) -> (Running, (u64, u64)) {
    let config = GatewayConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path())
        .with_object_size_max(object_size_max)
        .expect("size");
    start_config(dir, config).await
}

/// A gateway that requires fences signed with `keys`.
pub async fn start_signed(keys: leasefence_arbiter::Verifier) -> Running {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = GatewayConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path()).with_fence_keys(keys);
    start_config(dir, config).await.0
}

async fn start_config(dir: tempfile::TempDir, config: GatewayConfig) -> (Running, (u64, u64)) {
    // After a stop the previous gateway's store closes once its last request is done.
    let mut attempts = 0;
    let gateway = loop {
        match Gateway::bind(config.clone()).await {
            Ok(g) => break g,
            Err(e) if attempts < 50 => {
                attempts += 1;
                eprintln!("gateway not yet free to open: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => panic!("bind: {e}"),
        }
    };
    let addr = gateway.local_addr().expect("addr");
    let swept = gateway.swept();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(gateway.run(async {
        let _ = rx.await;
    }));
    let running = Running {
        url: format!("http://{addr}"),
        addr,
        dir,
        stop: tx,
    };
    (running, swept)
}

pub async fn start(object_size_max: u64) -> Running {
    start_in(tempfile::tempdir().expect("tempdir"), object_size_max).await.0
}

pub fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

pub fn put(c: &reqwest::Client, g: &Running, key: &str, resource: &str, token: u64) -> reqwest::RequestBuilder {
    c.put(format!("{}/objects/{key}", g.url))
        .header("leasefence-resource", resource)
        .header("leasefence-token", token)
}

/// Sends a request that must reach the gateway.
pub trait Go {
    async fn go(self) -> reqwest::Response;
}

impl Go for reqwest::RequestBuilder {
    async fn go(self) -> reqwest::Response {
        self.send().await.expect("the gateway answers")
    }
}

pub fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).expect("read dir").count()
}

pub fn content(token: u64, len: usize) -> Vec<u8> {
    let mut x = token.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub async fn raw(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(body).await.expect("body");
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
        let n = s.read(&mut buf).await.expect("read");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}
