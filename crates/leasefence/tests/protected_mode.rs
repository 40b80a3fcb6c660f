//! Protected mode: without access control, `serve` binds loopback only. A
//! non-loopback `--listen` is refused at start, naming the fix, unless
//! `--insecure` is given — then it starts and warns.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::BIN;

/// Runs `serve` with `args`, which must exit by itself: (exit code, stdout,
/// stderr). A serve that keeps running is killed and fails the test.
fn serve_exits(args: &[&str]) -> (i32, String, String) {
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve {args:?} kept running instead of refusing to start");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (String::new(), String::new());
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("read");
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read");
    (status.code().unwrap_or(-1), out, err)
}

#[test]
fn a_non_loopback_listen_without_access_control_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf-8 path");
    for listen in ["0.0.0.0:0", "[::]:0", "10.1.2.3:7740"] {
        let (code, out, err) = serve_exits(&["--listen", listen, "--data-dir", data]);
        assert_eq!(code, 2, "{listen}: refused as invalid input; stderr: {err}");
        assert!(!out.contains("listening"), "{listen}: it did not start: {out}");
        assert!(
            err.contains(listen) && err.contains("loopback") && err.contains("--insecure"),
            "{listen}: the message names the address, the rule and the way out: {err}"
        );
    }
}

/// Starts `serve ARGS --data-dir DATA`, reads its first stdout line, kills
/// it: (that line, everything it wrote on stderr).
fn serve_started(args: &[&str], data: &std::path::Path) -> (String, String) {
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .env("LEASEFENCE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the listening line");
    let _ = child.kill();
    let out = child.wait_with_output().expect("wait");
    (line, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn insecure_serves_a_non_loopback_address_and_warns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (line, err) = serve_started(&["--listen", "0.0.0.0:0", "--insecure"], dir.path());
    assert!(
        line.starts_with("leasefence listening on 0.0.0.0:"),
        "it started: {line:?}"
    );
    assert!(
        err.contains("WARN") && err.contains("--insecure") && err.contains("without access control"),
        "a warning at start: {err}"
    );
}

#[test]
fn loopback_needs_no_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    for listen in ["127.0.0.1:0", "[::1]:0"] {
        let data = dir.path().join(listen.replace([':', '[', ']'], "_"));
        let (line, err) = serve_started(&["--listen", listen], &data);
        assert!(
            line.starts_with("leasefence listening on "),
            "{listen}: it started: {line:?} {err}"
        );
        assert!(!err.contains("--insecure"), "{listen}: no warning: {err}");
    }
}

#[test]
fn a_non_loopback_frame_port_without_access_control_is_refused_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf-8 path");
    let (code, out, err) = serve_exits(&["--frames-listen", "0.0.0.0:0", "--data-dir", data]);
    assert_eq!(code, 2, "refused as invalid input; stderr: {err}");
    assert!(!out.contains("listening"), "it did not start: {out}");
    assert!(
        err.contains("--frames-listen 0.0.0.0:0") && err.contains("loopback") && err.contains("--insecure"),
        "the message names the flag, the address, the rule and the way out: {err}"
    );
}

#[test]
fn serve_announces_its_frame_port_and_answers_on_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--frames-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.path())
        .env("LEASEFENCE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn serve");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("read");
    let second = lines.next().expect("a second line").expect("read");
    assert!(first.starts_with("leasefence listening on 127.0.0.1:"), "{first}");
    let url = second
        .strip_prefix("leasefence frames on ")
        .unwrap_or_else(|| panic!("the frame port's line: {second:?}"))
        .to_string();
    assert!(url.starts_with("leasefence://127.0.0.1:"), "{url}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let token = runtime.block_on(async {
        let client = leasefence_client::FrameClient::connect(&url, leasefence_client::ClientOptions::default())
            .await
            .expect("connect to the announced frame port");
        let r = leasefence_core::ResourceId::new("cli/frames").expect("resource");
        let lease = client
            .acquire(&r, Duration::from_secs(5), None, Duration::ZERO)
            .await
            .expect("granted");
        client.release(&r, &lease.lease_id).await.expect("released")
    });
    assert_eq!(token.get(), 1);
    let _ = child.kill();
    let _ = child.wait();
}
