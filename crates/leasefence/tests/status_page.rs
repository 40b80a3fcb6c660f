//! The status page in headless Chromium (Debian's `chromium` and
//! `chromium-driver`), driven over the W3C WebDriver protocol with a few
//! plain HTTP calls: the page loads from a real `leasefence serve`, a lease the
//! test grants through the API appears with its token (and no lease id), its
//! release shows, and a name with characters that hide or reorder text is
//! shown written out. A screenshot is saved to `$LEASEFENCE_ARTIFACTS_DIR`
//! (default `target/artifacts/`). Without chromedriver the test skips, or
//! fails under `CI=true`.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::Coordinator;
use common::ha::free_port;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HEADLESS: [&str; 5] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--window-size=1280,800",
];

/// `chromedriver` and `chromium`, from `$PATH` (Debian's names).
fn browser() -> Option<(PathBuf, PathBuf)> {
    let find = |name: &str| {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    };
    Some((find("chromedriver")?, find("chromium")?))
}

/// A chromedriver child; killed on drop.
struct Driver {
    child: Child,
    url: String,
    http: reqwest::Client,
    session: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    async fn start(chromedriver: &PathBuf, chromium: &PathBuf) -> Driver {
        let port = free_port();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .build()
            .expect("client");
        let mut driver = Driver {
            child,
            url,
            http,
            session: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while driver.http.get(format!("{}/status", driver.url)).send().await.is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": chromium, "args": HEADLESS },
        }}});
        let created = driver.call("POST", "/session", caps).await;
        driver.session = created["sessionId"].as_str().expect("a session id").to_string();
        driver
    }

    /// One WebDriver command; returns its `value`.
    async fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = if self.session.is_empty() {
            format!("{}{path}", self.url)
        } else {
            format!("{}/session/{}{path}", self.url, self.session)
        };
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = self.http.request(method, url);
        // GET and DELETE carry no body; chromedriver refuses a `null` one.
        if !body.is_null() {
            req = req.json(&body);
        }
        let resp = req.send().await.expect("webdriver");
        let status = resp.status();
        let v: Value = resp.json().await.expect("webdriver JSON");
        assert!(status.is_success(), "webdriver {path}: {status} {v}");
        v["value"].clone()
    }

    async fn script(&self, js: &str) -> Value {
        self.call("POST", "/execute/sync", json!({ "script": js, "args": [] }))
            .await
    }

    /// Polls `js` until `done` accepts what it returns; the last value.
    async fn until(&self, js: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let v = self.script(js).await;
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "the page never showed {what}; last: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The token the test types into the page.
const BEARER: &str = "lf-test-token-7f3a";

/// What the relay saw: each request line, and whether it carried the bearer token.
type Seen = Arc<Mutex<Vec<(String, bool)>>>;

/// A TCP relay in front of the coordinator that notes every HTTP request head
/// the browser sends through it (request line, `Authorization: Bearer BEARER`
/// or not), so the test can see what the page sends. The page sends no bodies.
async fn relay(target: String) -> (String, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let seen: Seen = Arc::default();
    let noted = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let (target, noted) = (target.clone(), noted.clone());
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(&target).await else {
                    return;
                };
                let (mut from_client, mut to_client) = client.split();
                let (mut from_server, mut to_server) = server.split();
                let upstream = async {
                    let mut heads = String::new();
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = match from_client.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        heads.push_str(&String::from_utf8_lossy(&buf[..n]));
                        while let Some(end) = heads.find("\r\n\r\n") {
                            let head: String = heads.drain(..end + 4).collect();
                            let line = head.lines().next().unwrap_or_default().to_string();
                            let bearer = format!("authorization: bearer {}", BEARER.to_lowercase());
                            let authorized = head.to_lowercase().lines().any(|l| l.trim() == bearer);
                            noted.lock().expect("lock").push((line, authorized));
                        }
                        if to_server.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = to_server.shutdown().await;
                };
                let downstream = tokio::io::copy(&mut from_server, &mut to_client);
                let _ = tokio::join!(upstream, downstream);
            });
        }
    });
    (url, seen)
}

fn artifacts_dir() -> PathBuf {
    std::env::var_os("LEASEFENCE_ARTIFACTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/artifacts")))
}

/// The row of `ui/orders`: [state, holder, token, expires, page contains the lease id].
const ROW: &str = r#"
    const tr = document.querySelector('#resources tr[data-resource="ui/orders"]');
    if (!tr) return null;
    const text = (c) => tr.querySelector('.' + c).textContent;
    return [tr.dataset.state, text('holder'), text('token'), text('expires'),
            document.documentElement.outerHTML.includes(window.leaseIdProbe || '\u0000')];
"#;

async fn post(url: &str, path: &str, body: Value) -> Value {
    let resp = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .body(body.to_string())
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 200, "{path}");
    resp.json().await.expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_a_granted_lease_and_its_release() {
    let Some((chromedriver, chromium)) = browser() else {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI=true needs chromium and chromedriver (apt-get install chromium chromium-driver)"
        );
        eprintln!("skipped: chromedriver or chromium not on PATH");
        return;
    };
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Coordinator::start(dir.path(), &[]);
    // An earlier lease, so that the one the page shows has token 2, not a default 1.
    let first = post(
        &server.url,
        "/v1/acquire",
        json!({"resource": "ui/orders", "ttl_ms": 60_000}),
    )
    .await;
    post(
        &server.url,
        "/v1/release",
        json!({"resource": "ui/orders", "lease_id": first["lease_id"]}),
    )
    .await;

    let (page_url, seen) = relay(server.url.trim_start_matches("http://").to_string()).await;
    let driver = Driver::start(&chromedriver, &chromium).await;
    driver
        .call("POST", "/url", json!({ "url": format!("{page_url}/?prefix=ui/") }))
        .await;
    let live = "return document.getElementById('connection').dataset.state;";
    driver.until(live, "a live watch", |v| v == "live").await;

    // A token typed in goes into sessionStorage, out of the field, and onto
    // every API request from then on (fetch, not EventSource, so it can).
    let typed = format!(
        "document.getElementById('token').value = {}; document.getElementById('auth').requestSubmit();
         return [sessionStorage.getItem('leasefence.token'), document.getElementById('token').value];",
        json!(BEARER)
    );
    let stored = driver.script(&typed).await;
    assert_eq!(
        stored,
        json!([BEARER, ""]),
        "kept in sessionStorage, not left in the field"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = seen.lock().expect("lock").clone();
        let sent = |path: &str| {
            seen.iter()
                .any(|(l, auth)| *auth && l.starts_with(&format!("GET {path}?")))
        };
        if sent("/v1/watch") && sent("/v1/resources") {
            let before: Vec<_> = seen.iter().take_while(|(_, auth)| !auth).collect();
            assert!(before.iter().any(|(l, _)| l.starts_with("GET /v1/watch?")), "{seen:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the page never sent the bearer token: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    driver.until(live, "a live watch with the token", |v| v == "live").await;
    driver
        .until(ROW, "ui/orders as free", |v| v[0] == "free" && v[2] == "—")
        .await;

    let lease = post(
        &server.url,
        "/v1/acquire",
        json!({"resource": "ui/orders", "ttl_ms": 60_000, "holder": "browser-test"}),
    )
    .await;
    assert_eq!(lease["token"], 2);
    let lease_id = lease["lease_id"].as_str().expect("lease id");
    driver
        .script(&format!("window.leaseIdProbe = {}; return null;", json!(lease_id)))
        .await;
    let row = driver
        .until(ROW, "the grant with token 2", |v| v[0] == "held" && v[2] == "2")
        .await;
    assert_eq!(row[1], "browser-test", "{row}");
    assert!(row[3].as_str().is_some_and(|s| s.ends_with(" s")), "a countdown: {row}");
    let events =
        "return [...document.querySelectorAll('#events li')].map(li => li.dataset.kind + ' ' + li.textContent);";
    driver
        .until(events, "the grant event", |v| {
            v.as_array().is_some_and(|es| {
                es.iter().any(|e| {
                    e.as_str()
                        .is_some_and(|s| s.starts_with("granted") && s.contains("ui/orders token 2"))
                })
            })
        })
        .await;
    // The probe itself lives in a script variable, not in the document.
    assert_eq!(row[4], false, "the page never shows a lease id: {row}");

    let png = driver.call("GET", "/screenshot", Value::Null).await;
    let png = base64::engine::general_purpose::STANDARD
        .decode(png.as_str().expect("base64 screenshot"))
        .expect("decode screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let out = artifacts_dir();
    std::fs::create_dir_all(&out).expect("artifacts dir");
    let shot = out.canonicalize().unwrap_or(out).join("status-page.png");
    std::fs::write(&shot, &png).expect("write screenshot");
    println!("screenshot: {}", shot.display());

    post(
        &server.url,
        "/v1/release",
        json!({"resource": "ui/orders", "lease_id": lease_id}),
    )
    .await;
    let row = driver
        .until(ROW, "the release", |v| v[0] == "free" && v[2] == "—")
        .await;
    assert_eq!(row[1], "—", "{row}");
    driver
        .until(events, "the release event", |v| {
            v.as_array().is_some_and(|es| {
                es.iter().any(|e| {
                    e.as_str()
                        .is_some_and(|s| s.starts_with("released") && s.contains("ui/orders token 2"))
                })
            })
        })
        .await;

    // A name with a right-to-left override (after it, "fdp.exe" reads
    // "exe.pdf") and a holder with a zero-width space: both are written out,
    // and in the event line each name is isolated from the text around it.
    let (tricky, holder) = ("ui/x\u{202E}fdp.exe", "h\u{200B}olly");
    post(
        &server.url,
        "/v1/acquire",
        json!({"resource": tricky, "ttl_ms": 60_000, "holder": holder}),
    )
    .await;
    let tricky_row = format!(
        "const tr = [...document.querySelectorAll('#resources tr')].find(t => t.dataset.resource === {});
         return tr ? [tr.querySelector('.resource').textContent, tr.querySelector('.holder').textContent] : null;",
        json!(tricky)
    );
    let row = driver.until(&tricky_row, "the tricky name", |v| !v.is_null()).await;
    assert_eq!(row, json!(["ui/x\\u{202e}fdp.exe", "h\\u{200b}olly"]));
    let tricky_event = "const li = [...document.querySelectorAll('#events li')].find(li => li.dataset.kind === 'granted' && li.textContent.includes('fdp.exe'));
         return li ? [li.textContent, [...li.querySelectorAll('bdi')].map(b => b.textContent)] : null;";
    let event = driver.until(tricky_event, "the tricky grant", |v| !v.is_null()).await;
    assert!(
        event[0]
            .as_str()
            .is_some_and(|s| s.ends_with("granted ui/x\\u{202e}fdp.exe token 1 by h\\u{200b}olly")),
        "{event}"
    );
    assert_eq!(event[1], json!(["ui/x\\u{202e}fdp.exe", "h\\u{200b}olly"]), "{event}");
    driver.call("DELETE", "", Value::Null).await;
    println!("browser test took {:?}", started.elapsed());
}
