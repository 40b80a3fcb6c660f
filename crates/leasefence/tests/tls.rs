//! `serve --tls-cert/--tls-key [--tls-client-ca]` and the client flags
//! `--ca`, `--cert`, `--key`, end to end through the binary: TLS works, a
//! plaintext client is told to use https://, and bad files stop `serve` at
//! start with a message naming the flag and the file.

mod common;

#[path = "../../leasefence-server/tests/support/certs.rs"]
mod certs;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use certs::{Ca, Files};
use common::{BIN, cli, spawn_listening};

/// A TLS coordinator child (killed on drop) and its address.
struct Served {
    child: std::process::Child,
    addr: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(data: &Path, args: &[&str]) -> Served {
    let (child, addr, line) = spawn_listening("serve", data, args, "leasefence listening on ");
    assert!(line.contains(&addr) && line.contains("TLS)"), "{line}");
    Served { child, addr }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn status_over_tls_works_and_a_plaintext_client_is_told_to_use_https() {
    let (ca, files) = (Ca::new("test CA"), Files::new());
    let leaf = ca.server();
    let (cert, key, ca_file) = (
        files.write("server.pem", &leaf.cert),
        files.write("server.key", &leaf.key),
        files.write("ca.pem", &ca.pem),
    );
    let data = files.path().join("data");
    let served = serve(&data, &["--tls-cert", s(&cert), "--tls-key", s(&key)]);
    let https = format!("https://{}", served.addr);

    let (code, out, err) = cli(&[
        "acquire",
        "jobs/a",
        "--ttl",
        "10s",
        "--ca",
        s(&ca_file),
        "--server",
        &https,
    ]);
    assert_eq!(code, 0, "acquire over TLS: {out}{err}");
    let (code, out, err) = cli(&["status", "jobs/a", "--ca", s(&ca_file), "--server", &https]);
    assert_eq!(code, 0, "status over TLS: {err}");
    assert!(
        out.contains("held by") && out.contains("token=1"),
        "the lease acquired over TLS: {out}"
    );

    // The same through the environment variables.
    let out = Command::new(BIN)
        .args(["status", "jobs/a"])
        .env("LEASEFENCE_SERVER", &https)
        .env("LEASEFENCE_CA", &ca_file)
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let started = Instant::now();
    let (code, _, err) = cli(&["status", "jobs/a", "--server", &format!("http://{}", served.addr)]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("speaks TLS") && err.contains(&https),
        "says so, naming the https:// URL: {err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "at once: {:?}",
        started.elapsed()
    );

    // `run` hands its child the coordinators and the CA: the child's own
    // calls reach the TLS port too.
    let script = format!("{BIN} status jobs/b");
    let (code, out, err) = cli(&[
        "run",
        "jobs/b",
        "--ttl",
        "10s",
        "--ca",
        s(&ca_file),
        "--server",
        &https,
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("jobs/b: held by") && out.contains("token=1"), "{out}");

    // Without --ca the system's roots do not know the test CA.
    let (code, _, err) = cli(&["status", "jobs/a", "--server", &https]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("certificate was not accepted") && err.contains("--ca"),
        "{err}"
    );
}

#[test]
fn mutual_tls_takes_the_client_certificate_from_cert_and_key() {
    let (ca, client_ca, files) = (Ca::new("server CA"), Ca::new("client CA"), Files::new());
    let (leaf, member) = (ca.server(), client_ca.client());
    let args = [
        files.write("server.pem", &leaf.cert),
        files.write("server.key", &leaf.key),
        files.write("client-ca.pem", &client_ca.pem),
    ];
    let served = serve(
        &files.path().join("data"),
        &[
            "--tls-cert",
            s(&args[0]),
            "--tls-key",
            s(&args[1]),
            "--tls-client-ca",
            s(&args[2]),
        ],
    );
    let https = format!("https://{}", served.addr);
    let ca_file = files.write("ca.pem", &ca.pem);
    let (cert, key) = (files.write("me.pem", &member.cert), files.write("me.key", &member.key));
    let (code, _, err) = cli(&["status", "r", "--ca", s(&ca_file), "--server", &https]);
    assert_eq!(code, 1, "no client certificate: refused: {err}");
    assert!(err.contains("requires a client certificate"), "says so: {err}");
    let (code, out, err) = cli(&[
        "status",
        "r",
        "--ca",
        s(&ca_file),
        "--cert",
        s(&cert),
        "--key",
        s(&key),
        "--server",
        &https,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let server_key = s(&args[1]);
    let mismatched = [
        "status",
        "r",
        "--cert",
        s(&cert),
        "--key",
        server_key,
        "--server",
        &https,
    ];
    let (code, _, err) = cli(&mismatched);
    assert_eq!(code, 2, "a key of another certificate: {err}");
    assert!(
        err.contains("--key") && err.contains(server_key) && err.contains("does not belong"),
        "{err}"
    );
}

/// Runs `serve ARGS`, which must refuse to start: (exit code, stderr).
fn serve_refuses(args: &[&str]) -> (i32, String) {
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("serve {args:?} started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_tls_files_stop_serve_at_start_naming_the_flag_and_the_file() {
    let (ca, files) = (Ca::new("test CA"), Files::new());
    let (leaf, other) = (ca.server(), ca.server());
    let cert = files.write("server.pem", &leaf.cert);
    let key = files.write("server.key", &leaf.key);
    let other_key = files.write("other.key", &other.key);
    let missing = files.path().join("missing.pem");
    let data = files.path().join("data");
    let cases: [(Vec<&str>, &str, &str); 5] = [
        (
            vec!["--tls-cert", s(&missing), "--tls-key", s(&key)],
            "--tls-cert",
            s(&missing),
        ),
        (
            vec!["--tls-cert", s(&cert), "--tls-key", s(&other_key)],
            "--tls-key",
            s(&other_key),
        ),
        (vec!["--tls-cert", s(&key), "--tls-key", s(&key)], "--tls-cert", s(&key)),
        (vec!["--tls-cert", s(&cert)], "--tls-key", ""),
        (
            vec![
                "--tls-cert",
                s(&cert),
                "--tls-key",
                s(&key),
                "--tls-client-ca",
                s(&missing),
            ],
            "--tls-client-ca",
            s(&missing),
        ),
    ];
    for (args, flag, file) in cases {
        let mut all = args.clone();
        all.extend(["--listen", "127.0.0.1:0", "--data-dir", s(&data)]);
        let (code, err) = serve_refuses(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains(flag) && err.contains(file),
            "{args:?}: names {flag} {file}: {err}"
        );
    }
}

#[test]
fn the_config_file_takes_the_tls_keys() {
    let (ca, files) = (Ca::new("test CA"), Files::new());
    let leaf = ca.server();
    let cert = files.write("server.pem", &leaf.cert);
    let key = files.write("server.key", &leaf.key);
    let config = files.write(
        "leasefence.toml",
        &format!("tls-cert = {:?}\ntls-key = {:?}\n", s(&cert), s(&key)),
    );
    let served = serve(&files.path().join("data"), &["--config", s(&config)]);
    let ca_file = files.write("ca.pem", &ca.pem);
    let (code, _, err) = cli(&[
        "status",
        "r",
        "--ca",
        s(&ca_file),
        "--server",
        &format!("https://{}", served.addr),
    ]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn sigterm_stops_a_tls_coordinator_with_connections_open() {
    let (ca, files) = (Ca::new("test CA"), Files::new());
    let leaf = ca.server();
    let (cert, key) = (
        files.write("server.pem", &leaf.cert),
        files.write("server.key", &leaf.key),
    );
    let mut served = serve(
        &files.path().join("data"),
        &["--tls-cert", s(&cert), "--tls-key", s(&key)],
    );
    let ca_file = files.write("ca.pem", &ca.pem);
    let (code, _, err) = cli(&[
        "status",
        "r",
        "--ca",
        s(&ca_file),
        "--server",
        &format!("https://{}", served.addr),
    ]);
    assert_eq!(code, 0, "{err}");
    // One connection that never starts its handshake, one plaintext one.
    let _silent = std::net::TcpStream::connect(&served.addr).expect("connect");
    let mut plain = std::net::TcpStream::connect(&served.addr).expect("connect");
    std::io::Write::write_all(&mut plain, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").expect("write");
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    common::sigterm(&served.child);
    let status = loop {
        if let Some(status) = served.child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still running 5 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exits 0: {status:?}");
}

#[test]
fn bench_measures_a_tls_coordinator_with_ca_cert_and_key() {
    let (ca, client_ca, files) = (Ca::new("server CA"), Ca::new("client CA"), Files::new());
    let (leaf, client) = (ca.server(), client_ca.client());
    let paths = [
        files.write("server.pem", &leaf.cert),
        files.write("server.key", &leaf.key),
        files.write("client-ca.pem", &client_ca.pem),
        files.write("ca.pem", &ca.pem),
        files.write("client.pem", &client.cert),
        files.write("client.key", &client.key),
    ];
    let [cert, key, client_ca_file, ca_file, client_cert, client_key] = paths.each_ref().map(|p| s(p));
    let data = files.path().join("data");
    let served = serve(
        &data,
        &["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", client_ca_file],
    );
    let https = format!("https://{}", served.addr);
    let bench = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--server",
            &https,
            "--clients",
            "2",
            "--duration",
            "300ms",
            "--rounds",
            "1",
            "--json",
        ];
        args.extend_from_slice(extra);
        cli(&args)
    };

    let (code, out, err) = bench(&["--ca", ca_file, "--cert", client_cert, "--key", client_key]);
    assert_eq!(code, 0, "bench over mutual TLS: {out}{err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    let run = &report["runs"][0];
    assert_eq!(run["target"], "leasefence", "{report}");
    assert_eq!(run["errors"], 0, "{report}");
    assert!(run["ops_per_s"].as_f64().is_some_and(|n| n > 0.0), "{report}");

    // Without the client certificate the coordinator refuses every call, and
    // bench says so before it measures anything.
    let (code, _, err) = bench(&["--ca", ca_file]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("client certificate"), "{err}");
    // A --cert without --key is refused by the flags.
    let (code, _, err) = bench(&["--ca", ca_file, "--cert", client_cert]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--key"), "{err}");
}
