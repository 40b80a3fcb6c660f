//! The CLI against the real binary: JSON output, exit codes (0 ok, 1
//! unreachable, 2 invalid, 3 busy, 4 lease lost), and the demo's story.

mod common;

use std::time::Duration;

use common::{Coordinator, cli, ms};
use serde_json::Value;

#[test]
fn acquire_status_renew_release_and_exit_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let s = c.url.as_str();

    let (code, out, err) = cli(&[
        "acquire", "jobs/7", "--ttl", "10s", "--holder", "me", "--json", "--server", s,
    ]);
    assert_eq!(code, 0, "{err}");
    let lease: Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(
        (
            lease["resource"].as_str(),
            lease["token"].as_u64(),
            lease["ttl_ms"].as_u64()
        ),
        (Some("jobs/7"), Some(1), Some(10_000))
    );
    let id = lease["lease_id"].as_str().expect("lease id").to_string();

    let (code, _, err) = cli(&["acquire", "jobs/7", "--ttl", "10s", "--server", s]);
    assert_eq!(code, 3, "busy: {err}");
    assert!(err.contains("held by me"), "{err}");

    let (code, out, _) = cli(&["status", "jobs/7", "--json", "--server", s]);
    assert_eq!(code, 0);
    let st: Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(
        (st["last_token"].as_u64(), st["holder"].as_str()),
        (Some(1), Some("me"))
    );

    let (code, out, _) = cli(&["renew", "jobs/7", "--lease-id", &id, "--json", "--server", s]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<Value>(out.trim()).expect("json")["token"], 1);

    let other = "0".repeat(32);
    let (code, _, _) = cli(&["renew", "jobs/7", "--lease-id", &other, "--server", s]);
    assert_eq!(code, 4, "unknown lease id");

    let (code, _, _) = cli(&["release", "jobs/7", "--lease-id", &id, "--server", s]);
    assert_eq!(code, 0);
    let (code, out, _) = cli(&["status", "jobs/7", "--json", "--server", s]);
    assert_eq!(code, 0);
    let st: Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(
        (st["last_token"].as_u64(), st["holder"].clone()),
        (Some(1), Value::Null),
        "unheld: holder null"
    );

    let (code, _, _) = cli(&["release", "jobs/7", "--lease-id", &id, "--server", s]);
    assert_eq!(code, 4, "second release: lease lost");

    for bad in [
        vec!["acquire", "jobs/7", "--ttl", "1ms", "--server", s],
        vec!["acquire", "", "--ttl", "1s", "--server", s],
        vec!["acquire", "jobs/7", "--ttl", "soon", "--server", s],
        vec!["renew", "jobs/7", "--lease-id", "xyz", "--server", s],
        vec!["status", "jobs/7", "--timeout", "0s", "--server", s],
    ] {
        let (code, _, err) = cli(&bad);
        assert_eq!(code, 2, "{bad:?}: {err}");
        assert!(!err.is_empty(), "{bad:?} must say what was wrong");
    }

    let (code, _, err) = cli(&["status", "jobs/7", "--server", "http://127.0.0.1:1"]);
    assert_eq!(code, 1, "unreachable: {err}");
    assert!(err.contains("cannot reach"), "{err}");
}

/// A name may hold characters that show as nothing or turn the text after
/// them around (here a right-to-left override: "fdp.exe" reads "exe.pdf").
/// Text output writes them out, so a name cannot pose as another or reorder
/// the rest of its line; JSON output and the lease itself keep the name as it is.
#[test]
fn text_output_writes_out_characters_that_hide_or_reorder_a_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let s = c.url.as_str();
    let (resource, holder) = ("jobs/x\u{202E}fdp.exe", "w\u{200B}orker");
    let (shown_resource, shown_holder) = ("jobs/x\\u{202e}fdp.exe", "w\\u{200b}orker");

    let (code, out, err) = cli(&["acquire", resource, "--ttl", "10s", "--holder", holder, "--server", s]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("acquired {shown_resource} token=1 "))
            && out.contains(&format!("holder={shown_holder}")),
        "{out}"
    );
    assert!(!out.contains('\u{202E}') && !out.contains('\u{200B}'), "{out:?}");

    let (code, out, _) = cli(&["status", resource, "--server", s]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with(&format!("{shown_resource}: held by {shown_holder} token=1 ")),
        "{out}"
    );

    let (code, _, err) = cli(&["acquire", resource, "--ttl", "10s", "--server", s]);
    assert_eq!(code, 3, "busy: {err}");
    assert!(
        err.contains(&format!(
            "resource {shown_resource} is held by {shown_holder} (token 1)"
        )),
        "{err}"
    );

    let (code, out, _) = cli(&["status", resource, "--json", "--server", s]);
    assert_eq!(code, 0);
    let st: Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(
        (st["resource"].as_str(), st["holder"].as_str()),
        (Some(resource), Some(holder))
    );
}

#[test]
fn demo_tells_the_paused_worker_story_and_rejects_the_stale_write() {
    let (code, out, err) = cli(&["demo"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("worker-a acquires reports/daily: token 1"), "{out}");
    assert!(out.contains("worker-b acquires reports/daily: token 2"), "{out}");
    assert!(
        out.contains("rejected: stale fencing token for reports/daily: presented 1, current 2"),
        "{out}"
    );
    assert!(out.contains("the report says: \"written by worker-b\""), "{out}");
}

#[test]
fn completions_are_printed_for_bash_zsh_and_fish() {
    for (shell, marker) in [
        ("bash", "_leasefence()"),
        ("zsh", "#compdef leasefence"),
        ("fish", "complete -c leasefence"),
    ] {
        let (code, out, err) = cli(&["completions", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        assert!(out.contains(marker), "{shell}: the script starts as the shell expects");
        for sub in ["serve", "acquire", "gateway", "arbiter"] {
            assert!(out.contains(sub), "{shell}: completes the subcommand {sub}");
        }
    }
    let (code, _, err) = cli(&["completions", "tcsh"]);
    assert_eq!(code, 2, "an unknown shell is a usage error");
    assert!(
        err.contains("bash") && err.contains("fish"),
        "names the shells allowed: {err}"
    );
}

/// `serve --config`: the file's `ttl-max` is what the coordinator enforces,
/// and a flag overrides it.
#[test]
fn serve_takes_its_settings_from_a_config_file_and_flags_override_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("leasefence.toml");
    std::fs::write(&config, "ttl-max = \"2s\"\nlog-format = \"json\"\n").expect("write");
    let config = config.to_str().expect("utf-8");

    let from_file = Coordinator::start(&dir.path().join("a"), &["--config", config]);
    let (code, _, err) = cli(&["acquire", "cfg/1", "--ttl", "5s", "--server", &from_file.url]);
    assert_eq!(code, 2, "ttl-max 2s from the file refuses a 5 s TTL: {err}");
    let (code, _, err) = cli(&["acquire", "cfg/1", "--ttl", "1s", "--server", &from_file.url]);
    assert_eq!(code, 0, "{err}");

    let overridden = Coordinator::start(&dir.path().join("b"), &["--config", config, "--ttl-max", "10s"]);
    let (code, _, err) = cli(&["acquire", "cfg/1", "--ttl", "5s", "--server", &overridden.url]);
    assert_eq!(code, 0, "--ttl-max 10s overrides the file: {err}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "ttl-max = \"2s\"\nwaiters = 5\n").expect("write");
    let (code, out, err) = cli(&["serve", "--config", bad.to_str().expect("utf-8")]);
    assert_eq!(code, 2, "an unknown key is refused at start: {out} {err}");
    assert!(
        err.contains("waiters") && err.contains("waiters-max"),
        "names the key and the allowed ones: {err}"
    );
}

#[test]
fn serve_refuses_an_advertised_url_clients_could_not_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8 path");
    let long = format!("http://h:1/{}", "x".repeat(3000));
    for (bad, says) in [
        ("http://", "not a URL"),
        ("http://:1", "no host"),
        ("ftp://h:1", "scheme"),
        ("h:1", "scheme"),
        ("http://h:1/a b", "not a URL"),
        (long.as_str(), "at most 2048"),
    ] {
        // Checked before the store is opened: nothing listens on port 1.
        let (code, out, err) = cli(&[
            "serve",
            "--data-dir",
            d,
            "--store",
            "etcd://127.0.0.1:1",
            "--advertise",
            bad,
        ]);
        assert_eq!(code, 2, "{bad:.40}: {out}{err}");
        assert!(err.contains("--advertise: ") && err.contains(says), "{bad:.40}: {err}");
        assert!(err.contains("allowed: a URL like http://"), "{bad:.40}: {err}");
    }
    let (code, out, err) = cli(&["serve", "--data-dir", d, "--advertise", "http://h:1"]);
    assert_eq!(code, 2, "without a shared store: {out}{err}");
    assert!(err.contains("--advertise") && err.contains("--store"), "{err}");
}

#[test]
fn serve_on_a_port_in_use_says_which_and_why_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8 path");
    for flag in ["--listen", "--frames-listen"] {
        let mut args = vec!["serve", "--data-dir", d, flag, &addr];
        if flag == "--frames-listen" {
            args.extend(["--listen", "127.0.0.1:0"]);
        }
        let (code, out, err) = cli(&args);
        assert_eq!(code, 1, "{flag}: {out}{err}");
        assert!(err.contains(&format!("cannot listen on {addr}: ")), "{flag}: {err}");
        assert_eq!(err.matches("in use").count(), 1, "{flag}: the cause once: {err}");
    }
}

/// `serve --connection-idle`: an idle frame connection is told it is
/// closing after that long; a value out of bounds is refused at start.
#[test]
fn serve_closes_connections_idle_for_connection_idle() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let frames = free.local_addr().expect("addr").to_string();
    drop(free);
    let _c = Coordinator::start(dir.path(), &["--frames-listen", &frames, "--connection-idle", "1s"]);
    let mut s = std::net::TcpStream::connect(&frames).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    // Hello, version 2, no token; then Welcome, version 2.
    s.write_all(&[0, 0, 0, 4, 0x01, 2, 0, 0]).expect("hello");
    let mut welcome = [0u8; 6];
    s.read_exact(&mut welcome).expect("welcome");
    assert_eq!(welcome, [0, 0, 0, 2, 0x81, 2]);
    let started = std::time::Instant::now();
    let mut closing = [0u8; 5];
    s.read_exact(&mut closing).expect("told it is closing within 5 s");
    assert_eq!(closing, [0, 0, 0, 1, 0x85], "a Closing frame");
    let after = started.elapsed();
    assert!(after >= ms(950) && after < Duration::from_secs(3), "after {after:?}");

    let (code, _, err) = cli(&["serve", "--data-dir", "x", "--connection-idle", "2d"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--connection-idle") && err.contains("from 1s to 24h"),
        "{err}"
    );
}

/// A free loopback address (the port was just free).
fn free_addr() -> String {
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    free.local_addr().expect("addr").to_string()
}

/// `serve` and `gateway` announce their ports on stdout; a reader that has
/// gone (a closed pipe, a log shipper that died) must not stop them.
#[test]
fn serve_and_gateway_keep_running_when_their_stdout_is_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    for command in ["serve", "gateway"] {
        let listen = free_addr();
        let mut args = vec![command, "--listen", &listen, "--data-dir", command];
        let frames = free_addr();
        if command == "serve" {
            args.extend(["--frames-listen", &frames]);
        }
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let mut child = std::process::Command::new(common::BIN)
            .current_dir(dir.path())
            .args(&args)
            .env("LEASEFENCE_LOG", "error")
            .stdout(writer)
            .spawn()
            .expect("spawn");
        let started = std::time::Instant::now();
        let served = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break Err(format!("exited with {status}"));
            }
            if std::net::TcpStream::connect(&listen).is_ok() {
                break Ok(());
            }
            if started.elapsed() > Duration::from_secs(10) {
                break Err("not listening after 10 s".to_string());
            }
            std::thread::sleep(ms(50));
        };
        std::thread::sleep(ms(300));
        let running = child.try_wait().expect("wait").is_none();
        let _ = child.kill();
        let _ = child.wait();
        served.unwrap_or_else(|e| panic!("{command}: {e}"));
        assert!(running, "{command} stopped after its stdout closed");
    }
}

/// `watch … | head -1`: once the reader has gone, the next line cannot be
/// written. The stream is over for whoever read it, so the command ends as
/// after `--count`, quietly and with 0, rather than panicking.
#[test]
fn watch_and_observe_end_quietly_when_their_reader_has_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let url = c.url.as_str();
    for args in [
        ["watch", "gone/", "--prefix", "--server", url],
        ["observe", "gone/elected", "--server", url, "--json"],
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let mut child = std::process::Command::new(common::BIN)
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        // `observe` prints the current state at once; `watch` prints a
        // transition, made here until one reaches it.
        let started = std::time::Instant::now();
        let mut n = 0;
        while child.try_wait().expect("wait").is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{}: still running after 10 s",
                args[0]
            );
            if args[0] == "watch" {
                n += 1;
                let res = format!("gone/{n}");
                let (code, _, err) = cli(&["acquire", &res, "--ttl", "10s", "--server", url]);
                assert_eq!(code, 0, "{err}");
            }
            std::thread::sleep(ms(100));
        }
        let out = child.wait_with_output().expect("output");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{}: {}; stderr: {err}", args[0], out.status);
        assert!(err.is_empty(), "{}: nothing on stderr, got: {err}", args[0]);
    }
}

/// An `acquire` whose stdout is closed cannot hand anyone the lease id: it
/// says so, gives the lease back, and leaves the resource free.
#[test]
fn acquire_with_a_closed_stdout_fails_and_gives_the_lease_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let url = c.url.as_str();
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = std::process::Command::new(common::BIN)
        .args(["acquire", "unread/1", "--ttl", "1h", "--server", url])
        .stdout(writer)
        .output()
        .expect("run acquire");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}; stderr: {err}", out.status);
    assert!(
        err.contains("cannot write to stdout") && err.contains("the lease was released"),
        "{err}"
    );
    let (code, status, err) = cli(&["status", "unread/1", "--json", "--server", url]);
    assert_eq!(code, 0, "{err}");
    let status: Value = serde_json::from_str(status.trim()).expect("one JSON object");
    assert_eq!(
        (status["holder"].as_str(), status["last_token"].as_u64()),
        (None, Some(1)),
        "granted once, then given back: {status}"
    );
}
