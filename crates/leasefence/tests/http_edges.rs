//! The edges of the real `leasefence serve`: unknown paths, wrong methods and
//! oversize bodies get JSON refusals while gRPC keeps answering on the same
//! port, and its logs are plain text without colour codes (or JSON lines with
//! `--log-format json`) when stderr is not a terminal.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};

use common::{BIN, Coordinator};
use leasefence_proto::v1::{self as pb, leases_client::LeasesClient};
use serde_json::{Value, json};

/// The request body limit `serve` documents.
const BODY_BYTES_MAX: usize = 64 * 1024;

async fn send(req: reqwest::RequestBuilder) -> (u16, reqwest::header::HeaderMap, Value) {
    let resp = req.send().await.expect("http");
    let (code, headers) = (resp.status().as_u16(), resp.headers().clone());
    let text = resp.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or_else(|_| json!({ "not_json": text }));
    (code, headers, body)
}

#[tokio::test]
async fn unknown_paths_get_a_json_404_and_grpc_still_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Coordinator::start(dir.path(), &[]);
    let http = reqwest::Client::new();
    for (method, path) in [("GET", "/nope"), ("POST", "/v1/nope"), ("GET", "/ui/nope")] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let (code, _, body) = send(http.request(method.clone(), format!("{}{path}", server.url))).await;
        assert_eq!(code, 404, "{method} {path}: {body}");
        assert_eq!(body["error"], "not_found", "{method} {path}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains(path), "{method} {path}: {body}");
    }

    // A gRPC call to a service this server does not have is still answered in
    // gRPC's terms (UNIMPLEMENTED), not with the JSON 404.
    let req = http
        .post(format!("{}/other.v1.Service/Method", server.url))
        .header("content-type", "application/grpc");
    let (code, headers, _) = send(req).await;
    assert_eq!(code, 200);
    assert_eq!(headers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"12"[..]));
    // So is a method our service does not have (the edge hands every path
    // of the service to it), here over HTTP/1.1.
    let req = http
        .post(format!("{}/leasefence.v1.Leases/NoSuchMethod", server.url))
        .header("content-type", "application/grpc");
    let (code, headers, _) = send(req).await;
    assert_eq!(code, 200);
    assert_eq!(headers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"12"[..]));

    // And the real gRPC service answers on the same port.
    let mut grpc = LeasesClient::connect(server.url.clone()).await.expect("grpc connect");
    let req = pb::AcquireRequest {
        resource: "edges/grpc".into(),
        ttl_ms: 10_000,
        holder: "edges".into(),
        ..Default::default()
    };
    let lease = grpc.acquire(req).await.expect("grpc acquire").into_inner();
    assert_eq!(lease.token, 1);
    let (code, _, _) = send(http.get(format!("{}/healthz", server.url))).await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn a_wrong_method_on_a_known_path_gets_a_json_405() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Coordinator::start(dir.path(), &[]);
    let http = reqwest::Client::new();
    let (code, headers, body) = send(http.get(format!("{}/v1/acquire", server.url))).await;
    assert_eq!(code, 405, "{body}");
    assert_eq!(body["error"], "method_not_allowed", "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("GET"), "{body}");
    assert_eq!(headers.get("allow").map(|v| v.as_bytes()), Some(&b"POST"[..]));
}

#[tokio::test]
async fn an_oversize_body_gets_a_json_413_naming_the_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Coordinator::start(dir.path(), &[]);
    let http = reqwest::Client::new();
    let url = format!("{}/v1/acquire", server.url);
    // A valid acquire padded with spaces to exactly the limit is served.
    let acquire = json!({"resource": "edges/body", "ttl_ms": 10_000}).to_string();
    let padded = |size: usize| format!("{acquire}{}", " ".repeat(size - acquire.len()));
    let (code, _, body) = send(http.post(&url).body(padded(BODY_BYTES_MAX))).await;
    assert_eq!(code, 200, "{body}");

    for size in [BODY_BYTES_MAX + 1, 3 << 20] {
        let (code, _, body) = send(http.post(&url).body(padded(size))).await;
        assert_eq!(code, 413, "{size} bytes: {body}");
        assert_eq!(body["error"], "payload_too_large", "{size} bytes: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains(&format!("limit {BODY_BYTES_MAX} bytes")), "{body}");
    }
}

/// A chunked body (no `Content-Length`) over the limit gets the same 413,
/// and the client, still sending, receives it and gets its whole body taken
/// (a server that stops reading resets the connection, and the answer with it).
#[test]
fn an_oversize_chunked_body_gets_a_json_413_too() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Coordinator::start(dir.path(), &[]);
    let addr = server.url.trim_start_matches("http://").to_string();
    for size in [BODY_BYTES_MAX + 1, 3 << 20] {
        let mut conn = std::net::TcpStream::connect(&addr).expect("connect");
        conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .expect("timeout");
        let mut writer = conn.try_clone().expect("clone");
        // A server that stops reading stalls the sender: an error, not a hang.
        writer
            .set_write_timeout(Some(std::time::Duration::from_secs(10)))
            .expect("timeout");
        let sending = std::thread::spawn(move || -> std::io::Result<()> {
            writer.write_all(b"POST /v1/acquire HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")?;
            let chunk = vec![b' '; 16 << 10];
            let mut sent = 0;
            while sent < size {
                let n = chunk.len().min(size - sent);
                writer.write_all(format!("{n:x}\r\n").as_bytes())?;
                writer.write_all(&chunk[..n])?;
                writer.write_all(b"\r\n")?;
                sent += n;
            }
            writer.write_all(b"0\r\n\r\n")
        });
        let answer = read_response(&mut conn);
        let sent = sending.join().expect("sender");
        assert!(
            answer.starts_with("HTTP/1.1 413"),
            "{size} bytes, chunked (sending: {sent:?}): {answer:?}"
        );
        assert!(answer.contains("\"payload_too_large\""), "{size} bytes: {answer}");
        assert!(sent.is_ok(), "{size} bytes: the whole body was taken: {sent:?}");
    }
}

/// One HTTP/1.1 response (head and a `Content-Length` body) read from `conn`.
fn read_response(conn: &mut std::net::TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok());
            if length.is_some_and(|n| got.len() >= end + 4 + n) {
                return text;
            }
        }
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return text,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// `serve` with its stderr piped (not a terminal) and `extra` arguments; the
/// logs it wrote until it stopped on SIGTERM, once it had answered a request.
async fn serve_logs(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .args(extra)
        .env("LEASEFENCE_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn leasefence serve");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped stdout");
    BufReader::new(stdout).read_line(&mut line).expect("read");
    let Some(addr) = line
        .strip_prefix("leasefence listening on ")
        .and_then(|l| l.split_whitespace().next())
    else {
        panic!("{line:?}: {}", stderr_of(&mut child));
    };
    // Serving, so it has logged its start (its SIGTERM handler is in place
    // from the listening line on).
    let health = reqwest::get(format!("http://{addr}/healthz")).await.expect("healthz");
    assert_eq!(health.status().as_u16(), 200);
    stop(&mut child);
    stderr_of(&mut child)
}

fn stop(child: &mut Child) {
    common::sigterm(child);
    child.wait().expect("wait");
}

fn stderr_of(child: &mut Child) -> String {
    let _ = child.kill();
    let _ = child.wait();
    let mut out = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut out).expect("read stderr");
    }
    out
}

#[tokio::test]
async fn logs_to_a_pipe_carry_no_colour_codes() {
    let logs = serve_logs(&[]).await;
    assert!(
        logs.contains("serving gRPC and HTTP") && logs.contains("stopped"),
        "{logs}"
    );
    assert!(!logs.contains("\x1b["), "ANSI escapes in piped logs: {logs:?}");
}

#[tokio::test]
async fn log_format_json_writes_one_json_object_per_line() {
    let logs = serve_logs(&["--log-format", "json"]).await;
    let lines: Vec<&str> = logs.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 2, "{logs}");
    for line in &lines {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        assert!(v["level"].is_string() && v["fields"]["message"].is_string(), "{line}");
    }
    assert!(logs.contains("serving gRPC and HTTP"), "{logs}");
}

#[test]
fn an_unknown_log_format_is_refused_with_the_allowed_ones() {
    let (code, _, stderr) = common::cli(&["serve", "--log-format", "yaml"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("yaml") && stderr.contains("text") && stderr.contains("json"),
        "{stderr}"
    );
}
