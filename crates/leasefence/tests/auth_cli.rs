//! Access control through the real binary: `auth hash-token`, `serve --auth
//! FILE`, the client commands with `LEASEFENCE_AUTH_TOKEN`, `force-release`
//! and its audit line in the serve log, the refusal counters on `/metrics`,
//! and protected mode letting a non-loopback listen through with auth.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::BIN;
use common::scratch::Scratch;
use sha2::Digest;

fn hash(token: &str) -> String {
    let out = sha2::Sha256::digest(token.as_bytes());
    out.iter().map(|b| format!("{b:02x}")).collect()
}

/// `leasefence auth hash-token` with `input` on stdin: (exit code, stdout).
fn hash_token(input: &str) -> (i32, String) {
    let mut child = Command::new(BIN)
        .args(["auth", "hash-token"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

#[test]
fn hash_token_prints_the_sha256_a_policy_file_keeps() {
    for token in ["tok-alice", "x", "Zm9vYmFy-0123456789"] {
        assert_eq!(hash_token(&format!("{token}\n")), (0, hash(token)), "{token}");
        assert_eq!(hash_token(token), (0, hash(token)), "{token} without a newline");
    }
    assert_eq!(hash_token("").0, 2, "an empty token is refused");
    assert_eq!(hash_token("two words\n").0, 2, "a space is refused");
}

/// A running `serve --auth`, its stderr collected.
struct Served {
    child: Child,
    url: String,
    log: Arc<Mutex<String>>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const POLICY: &str = r#"
[[principal]]
name = "alice"
token-sha256 = "ALICE"
rules = [{ prefix = "jobs/", verbs = ["acquire", "read"] }]

[[principal]]
name = "bob"
token-sha256 = "BOB"
rules = [{ prefix = "jobs/", verbs = ["acquire"] }]

[[principal]]
name = "ops"
token-sha256 = "OPS"
rules = [{ prefix = "", verbs = ["read", "admin"] }]
"#;

fn serve(listen: &str) -> Served {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = serve_in(dir.path(), listen, &[]);
    s._dir = Some(dir);
    s
}

/// `serve --auth` with its policy and data under `dir`, and `extra` flags.
fn serve_in(dir: &std::path::Path, listen: &str, extra: &[&str]) -> Served {
    let policy = dir.join("auth.toml");
    let text = POLICY
        .replace("ALICE", &hash("tok-alice"))
        .replace("OPS", &hash("tok-ops"))
        .replace("BOB", &hash("tok-bob"));
    std::fs::write(&policy, text).expect("write policy");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", listen, "--data-dir"])
        .arg(dir.join("data"))
        .arg("--auth")
        .arg(&policy)
        .args(extra)
        .env("LEASEFENCE_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let log = Arc::new(Mutex::new(String::new()));
    let sink = log.clone();
    let stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut l = sink.lock().unwrap_or_else(|e| e.into_inner());
            l.push_str(&line);
            l.push('\n');
        }
    });
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the listening line");
    let addr = line
        .strip_prefix("leasefence listening on ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| {
            panic!(
                "serve did not start: {line:?}; log: {}",
                log.lock().map(|l| l.clone()).unwrap_or_default()
            )
        })
        .to_string();
    let port = addr.rsplit(':').next().expect("port");
    Served {
        child,
        url: format!("http://127.0.0.1:{port}"),
        log,
        _dir: None,
    }
}

/// Runs a client command against `s` with `token` (if any) in the environment.
fn cli(s: &Served, token: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut c = Command::new(BIN);
    c.args(args)
        .args(["--server", &s.url])
        .env_remove("LEASEFENCE_AUTH_TOKEN");
    if let Some(t) = token {
        c.env("LEASEFENCE_AUTH_TOKEN", t);
    }
    let out = c.output().expect("run leasefence");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_through_the_cli_raises_the_token_and_is_audited() {
    let s = serve("127.0.0.1:0");
    let mut last = 0;
    let mut lease_ids = vec![];
    for round in 0..5 {
        let (code, out, err) = cli(&s, Some("tok-alice"), &["acquire", "jobs/x", "--ttl", "60s", "--json"]);
        assert_eq!(code, 0, "{err}");
        let lease = json(&out);
        let token = lease["token"].as_u64().expect("token");
        assert!(token > last, "round {round}: {token} > {last}");
        assert!(
            lease["holder"].as_str().is_some_and(|h| h.starts_with("alice/")),
            "{lease}"
        );
        lease_ids.push(lease["lease_id"].as_str().expect("id").to_string());
        // Alice is no admin.
        let (code, _, err) = cli(&s, Some("tok-alice"), &["force-release", "jobs/x"]);
        assert_eq!(code, 7, "refused: {err}");
        assert!(err.contains("`admin`") && err.contains("\"jobs/x\""), "{err}");
        let (code, out, err) = cli(&s, Some("tok-ops"), &["force-release", "jobs/x", "--json"]);
        assert_eq!(code, 0, "{err}");
        let ended = json(&out);
        assert_eq!(
            (ended["token"].as_u64(), ended["released"].as_bool()),
            (Some(token), Some(true)),
            "{ended}"
        );
        last = token;
    }
    // Each force-release left an audit line naming principal, resource and token.
    let deadline = Instant::now() + Duration::from_secs(5);
    let log = loop {
        let log = s.log.lock().map(|l| l.clone()).unwrap_or_default();
        if log.matches("force-release ended a lease").count() >= 5 || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let audit: Vec<&str> = log.lines().filter(|l| l.contains("leasefence::audit")).collect();
    assert_eq!(audit.len(), 5, "{log}");
    for (i, line) in audit.iter().enumerate() {
        assert!(
            line.contains("principal=\"ops\"") || line.contains("principal=ops"),
            "{line}"
        );
        assert!(
            line.contains("jobs/x") && line.contains(&format!("token={}", i + 1)),
            "{line}"
        );
    }
    for id in &lease_ids {
        assert!(!log.contains(id.as_str()), "no lease id in the log");
    }
    assert!(
        !log.contains("tok-alice") && !log.contains("tok-ops"),
        "no token in the log"
    );
    eprintln!("audit line: {}", audit[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_counted_by_reason_on_metrics() {
    let s = serve("127.0.0.1:0");
    let http = reqwest::Client::new();
    let (mut unauthenticated, mut denied) = (0.0, 0.0);
    for i in 0..120 {
        let (auth, resource) = match i % 3 {
            0 => (None, format!("jobs/{i}")),
            1 => (Some(format!("Bearer nope-{i}")), format!("jobs/{i}")),
            _ => (Some("Bearer tok-alice".to_string()), format!("db/{i}")),
        };
        let mut r = http
            .post(format!("{}/v1/acquire", s.url))
            .json(&serde_json::json!({ "resource": resource, "ttl_ms": 1000 }));
        if let Some(a) = &auth {
            r = r.header("authorization", a);
        }
        let code = r.send().await.expect("send").status().as_u16();
        match i % 3 {
            2 => {
                assert_eq!(code, 403, "{auth:?} {resource}");
                denied += 1.0;
            }
            _ => {
                assert_eq!(code, 401, "{auth:?} {resource}");
                unauthenticated += 1.0;
            }
        }
    }
    // Ops may read alice's lease but not release it: it lacks `acquire`.
    let (code, out, _) = cli(&s, Some("tok-alice"), &["acquire", "jobs/m", "--ttl", "60s", "--json"]);
    assert_eq!(code, 0);
    let id = json(&out)["lease_id"].as_str().expect("id").to_string();
    let (code, _, err) = cli(&s, Some("tok-ops"), &["release", "jobs/m", "--lease-id", &id]);
    assert_eq!(code, 7, "{err}");
    assert!(err.contains("`acquire`"), "{err}");
    denied += 1.0;
    // Bob may acquire under jobs/, but alice's lease is not his.
    for verb in ["renew", "release"] {
        let (code, _, err) = cli(&s, Some("tok-bob"), &[verb, "jobs/m", "--lease-id", &id]);
        assert_eq!(code, 7, "{err}");
        assert!(err.contains("only its owner"), "{err}");
    }
    let text = http
        .get(format!("{}/metrics", s.url))
        .header("authorization", "Bearer tok-ops")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let series = |reason: &str| metric(&text, &format!("leasefence_auth_refusals_total{{reason=\"{reason}\"}}"));
    assert_eq!(series("unauthenticated"), unauthenticated, "{text}");
    assert_eq!(series("permission_denied"), denied, "{text}");
    assert_eq!(series("not_owner"), 2.0, "{text}");
    // /metrics itself needs a principal.
    let code = http
        .get(format!("{}/metrics", s.url))
        .send()
        .await
        .expect("get")
        .status()
        .as_u16();
    assert_eq!(code, 401);
}

#[test]
fn with_auth_a_non_loopback_listen_needs_no_insecure() {
    let s = serve("0.0.0.0:0");
    let (code, out, err) = cli(&s, Some("tok-ops"), &["status", "jobs/a", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["last_token"], serde_json::Value::Null);
    let (code, _, err) = cli(&s, None, &["status", "jobs/a"]);
    assert_eq!(code, 7, "no token: refused: {err}");
    assert!(err.contains("no credential"), "{err}");
    let log = s.log.lock().map(|l| l.clone()).unwrap_or_default();
    assert!(!log.contains("--insecure"), "no insecure warning: {log}");
}

/// The stores to restart on: embedded always, PostgreSQL and etcd when their
/// test services are configured (required under CI), each with a place of
/// this test's own in it.
fn stores() -> Vec<(&'static str, Option<Scratch>)> {
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let mut out = vec![("embedded", None)];
    match std::env::var("LEASEFENCE_TEST_POSTGRES_URL") {
        Ok(url) => out.push(("postgres", Some(Scratch::new(&url, "auth")))),
        Err(_) if ci => panic!("LEASEFENCE_TEST_POSTGRES_URL is required under CI"),
        Err(_) => eprintln!("skipped PostgreSQL: LEASEFENCE_TEST_POSTGRES_URL is not set"),
    }
    if cfg!(feature = "etcd") {
        match std::env::var("LEASEFENCE_TEST_ETCD_URL") {
            Ok(url) => out.push(("etcd", Some(Scratch::new(&url, "auth")))),
            Err(_) if ci => panic!("LEASEFENCE_TEST_ETCD_URL is required under CI"),
            Err(_) => eprintln!("skipped etcd: LEASEFENCE_TEST_ETCD_URL is not set"),
        }
    }
    out
}

/// Waits until `s` answers (a coordinator on a shared store first wins its leadership).
fn until_serving(s: &Served) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, _, err) = cli(s, Some("tok-ops"), &["status", "jobs/ready"]);
        if code == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "not serving: {err}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn ownership_survives_a_restart_on_every_store() {
    for (backend, store) in stores() {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let listen = format!("127.0.0.1:{port}");
        let advertise = format!("http://{listen}");
        let mut extra: Vec<&str> = vec![];
        if let Some(scratch) = &store {
            extra = vec![
                "--store",
                scratch.store(),
                "--store-prefix",
                scratch.prefix(),
                "--leader-ttl",
                "1s",
                "--advertise",
                &advertise,
            ];
        }
        let s = serve_in(dir.path(), &listen, &extra);
        until_serving(&s);
        let (code, out, err) = cli(
            &s,
            Some("tok-alice"),
            &["acquire", "jobs/kept", "--ttl", "60s", "--json"],
        );
        assert_eq!(code, 0, "{backend}: {err}");
        let lease = json(&out);
        let id = lease["lease_id"].as_str().expect("id").to_string();
        drop(s); // SIGKILL
        let s = serve_in(dir.path(), &listen, &extra);
        until_serving(&s);
        let (code, _, err) = cli(&s, Some("tok-bob"), &["release", "jobs/kept", "--lease-id", &id]);
        assert_eq!(code, 7, "{backend}: bob may not release alice's lease: {err}");
        assert!(err.contains("only its owner"), "{backend}: {err}");
        let (code, out, err) = cli(
            &s,
            Some("tok-alice"),
            &["release", "jobs/kept", "--lease-id", &id, "--json"],
        );
        assert_eq!(code, 0, "{backend}: {err}");
        assert_eq!(json(&out)["token"], lease["token"], "{backend}");
    }
}

#[test]
fn a_bad_policy_file_stops_serve_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("auth.toml");
    std::fs::write(
        &policy,
        "[[principal]]\nname = \"w\"\ntoken-sha256 = \"abc\"\nrules = [{ prefix = \"\", verbs = [\"read\"] }]\n",
    )
    .expect("write");
    let out = Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--auth")
        .arg(&policy)
        .output()
        .expect("run serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("principal[0] (\"w\").token-sha256") && err.contains("64 hex digits"),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).is_empty(), "it did not start");
}
