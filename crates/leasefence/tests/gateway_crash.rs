//! SIGKILL the real `leasefence gateway` while it receives large PUTs,
//! restart it on the same data directory, and check after every restart
//! that each object is entirely one written version (its bytes are those of
//! the token it is served with, and its ETag is their SHA-256), that the
//! fence recorded for it is that same token, that no acknowledged write was
//! lost, and that no temp file or unreferenced blob is left. 60 kills.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::gateway::GatewayProc;
use reqwest::StatusCode;
use sha2::{Digest, Sha256};

const CYCLES: u64 = 60;
/// Two keys of large objects, and one of small ones that commits often, so
/// that kills also land between a blob's rename, its commit and the removal
/// of the blob it replaced.
const KEYS: [&str; 3] = ["crash/large-1", "crash/large-2", "crash/small"];

/// 8-byte words of the version `token` of key number `k`.
fn words(k: usize, token: u64) -> u64 {
    match k {
        0 | 1 => (1 << 18) + (token % 7) * (1 << 17), // 2 MiB ..= 8 MiB
        _ => (1 << 12) + (token % 5) * (1 << 12),     // 32 KiB ..= 160 KiB
    }
}

/// The bytes written under `token`: every 8-byte word names the token and its
/// own position, so any mix of two versions or any truncation is visible.
fn content(k: usize, token: u64) -> Vec<u8> {
    let words = words(k, token);
    let mut v = Vec::with_capacity(words as usize * 8);
    for i in 0..words {
        v.extend_from_slice(&((token << 32) | i).to_le_bytes());
    }
    v
}

/// Tokens of one key: the last acknowledged, and the last one sent.
#[derive(Default)]
struct Progress {
    acked: AtomicU64,
    sent: AtomicU64,
    /// Acknowledged writes, over all cycles.
    acks: AtomicU64,
}

/// PUTs ever newer versions of `key` until the gateway dies.
async fn write_until_dead(url: String, k: usize, first: u64, p: Arc<Progress>) {
    let key = KEYS[k];
    let client = reqwest::Client::new();
    let mut token = first;
    loop {
        p.sent.store(token, Ordering::SeqCst);
        let sent = client
            .put(format!("{url}/objects/{key}"))
            .header("leasefence-resource", key)
            .header("leasefence-token", token)
            .body(content(k, token))
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {
                p.acked.store(token, Ordering::SeqCst);
                p.acks.fetch_add(1, Ordering::SeqCst);
            }
            Ok(r) => panic!("{key}@{token}: the gateway refused a newer token: {}", r.status()),
            Err(_) => return,
        }
        token += 1;
    }
}

fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// What a restarted gateway serves for `key`: `(token, fence token)`, after
/// checking the bytes are whole.
async fn served(url: &str, k: usize) -> Option<(u64, u64)> {
    let key = KEYS[k];
    let resp = reqwest::get(format!("{url}/objects/{key}")).await.expect("get");
    if resp.status() == StatusCode::NOT_FOUND {
        return None;
    }
    assert_eq!(resp.status(), StatusCode::OK);
    let token: u64 = resp.headers()["leasefence-token"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("token");
    let etag = resp.headers()["etag"].to_str().expect("ascii").to_string();
    let body = resp.bytes().await.expect("body");
    assert!(
        body.as_ref() == content(k, token).as_slice(),
        "{key}: the bytes served with token {token} are not that version's ({} bytes)",
        body.len()
    );
    assert_eq!(etag, format!("\"{}\"", hex_sha256(&body)), "{key}@{token}: ETag");
    let fence: serde_json::Value = reqwest::get(format!("{url}/fences/{key}"))
        .await
        .expect("fence")
        .json()
        .await
        .expect("json");
    Some((token, fence["token"].as_u64().expect("fence token")))
}

/// `(temp files, unreferenced blobs)` the gateway says it swept at start.
fn swept(banner: &str) -> (u64, u64) {
    let n = |after: &str| {
        let rest = banner
            .split(after)
            .nth(1)
            .unwrap_or_else(|| panic!("no {after:?} in {banner:?}"));
        rest.split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .expect("a count")
    };
    (n("swept "), n(" temp files and "))
}

fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).expect("read dir").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_during_large_puts_never_tears_an_object_or_splits_it_from_its_fence() {
    let dir = tempfile::tempdir().expect("tempdir");
    let progress: Vec<Arc<Progress>> = KEYS.iter().map(|_| Arc::default()).collect();
    let (mut swept_temp, mut swept_orphans, mut in_flight_committed) = (0u64, 0u64, 0u64);
    for cycle in 0..=CYCLES {
        let gateway = GatewayProc::start(dir.path(), &["--object-size-max", "16MiB"]);
        let (temp, orphans) = swept(&gateway.banner);
        swept_temp += temp;
        swept_orphans += orphans;
        assert_eq!(
            count(&dir.path().join("tmp")),
            0,
            "cycle {cycle}: temp files were swept"
        );
        let mut present = 0;
        for (k, (key, p)) in KEYS.iter().zip(&progress).enumerate() {
            let (acked, sent) = (p.acked.load(Ordering::SeqCst), p.sent.load(Ordering::SeqCst));
            match served(&gateway.url, k).await {
                None => assert_eq!(acked, 0, "cycle {cycle}: {key}: acknowledged {acked} was lost"),
                Some((token, fence)) => {
                    present += 1;
                    assert_eq!(
                        fence, token,
                        "cycle {cycle}: {key}: the fence and the object are out of step"
                    );
                    assert!(
                        token >= acked && token <= sent,
                        "cycle {cycle}: {key}: served {token}, acked {acked}, sent {sent}"
                    );
                    if token > acked {
                        in_flight_committed += 1;
                        p.acked.store(token, Ordering::SeqCst);
                    }
                }
            }
        }
        assert_eq!(
            count(&dir.path().join("blobs")),
            present,
            "cycle {cycle}: exactly one blob per object"
        );
        if cycle == CYCLES {
            break;
        }
        let writers: Vec<_> = progress
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let first = p.sent.load(Ordering::SeqCst) + 1;
                tokio::spawn(write_until_dead(gateway.url.clone(), k, first, Arc::clone(p)))
            })
            .collect();
        // Kill at a varying moment: while bodies stream, fsync or commit.
        tokio::time::sleep(Duration::from_millis(120 + (cycle * 53) % 400)).await;
        gateway.kill();
        for w in writers {
            w.await.expect("writer");
        }
    }
    let acked_total: u64 = progress.iter().map(|p| p.acks.load(Ordering::SeqCst)).sum();
    eprintln!(
        "{CYCLES} kills; {acked_total} writes acknowledged, {in_flight_committed} unacknowledged writes found \
         committed after a restart; restarts swept {swept_temp} temp files and {swept_orphans} unreferenced blobs"
    );
    assert!(
        swept_temp > 0,
        "some kill must land mid-body and leave a temp file to sweep"
    );
}
