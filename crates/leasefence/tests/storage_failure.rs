//! A real disk failure: `serve` on a tiny tmpfs fills it up. The commit log
//! is zero-filled when created (4 MiB), so what runs out of space is the
//! tree, at the first checkpoint, once about 2 MiB of grants are in the log.
//! The request that finds the store failed is answered with a storage error, `/healthz` turns 503, and `serve`
//! exits with code 6 and a one-line reason (crash-only: its supervisor
//! restarts it from what is on disk). Mounting needs root; without it the
//! test says it skipped, and under `CI=true` it fails instead.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::BIN;
use common::tmpfs::Tmpfs;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_serve_with_exit_code_6() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(_fs) = Tmpfs::mount_or_skip(dir.path(), "6m") else {
        return;
    };
    let mut serve = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("LEASEFENCE_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let mut first = [0u8; 256];
    let n = serve.stdout.as_mut().expect("stdout").read(&mut first).expect("read");
    let line = String::from_utf8_lossy(&first[..n]).to_string();
    let addr = line
        .strip_prefix("leasefence listening on ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_string();
    let http = reqwest::Client::new();
    let long = "x".repeat(480);
    let mut failed = None;
    for i in 0..20_000 {
        let body = json!({ "resource": format!("fill/{i}/{long}"), "ttl_ms": 3_600_000 });
        let r = http.post(format!("http://{addr}/v1/acquire")).json(&body).send().await;
        let Ok(r) = r else { break };
        if r.status() != 200 {
            failed = Some((r.status().as_u16(), r.text().await.unwrap_or_default()));
            break;
        }
    }
    let (code, body) = failed.expect("the disk filled up and a grant failed");
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("\"storage\""), "{body}");
    let health = http
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status().as_u16(), 503);
    let started = Instant::now();
    let status = loop {
        if let Some(s) = serve.try_wait().expect("try_wait") {
            break s;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "serve did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut stderr = String::new();
    serve
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    assert_eq!(status.code(), Some(6), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: fatal storage failure") && last.contains("No space left on device"),
        "the last line says why: {stderr}"
    );
}
