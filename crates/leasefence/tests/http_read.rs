//! The read-only HTTP views on the real `leasefence serve`: the listing pages
//! through every resource in name order, and the NDJSON watch delivers
//! transitions in order, resumes from a revision, filters one resource, never
//! carries a lease id, and ends with a `shutting_down` line on SIGTERM; every
//! line is a `WatchLine` as `docs/openapi.json` documents it.

mod common;

use std::time::Duration;

use common::Coordinator;
use serde_json::{Value, json};

async fn acquire(url: &str, resource: &str, ttl_ms: u64) -> Value {
    let body = json!({ "resource": resource, "ttl_ms": ttl_ms, "holder": "reader" });
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/acquire"))
        .body(body.to_string())
        .send()
        .await
        .expect("acquire");
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("lease")
}

async fn release(url: &str, lease: &Value) {
    let body = json!({ "resource": lease["resource"], "lease_id": lease["lease_id"] });
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/release"))
        .body(body.to_string())
        .send()
        .await
        .expect("release");
    assert_eq!(resp.status(), 200);
}

/// An open NDJSON stream, read a line at a time.
struct Lines {
    resp: reqwest::Response,
    buffered: String,
}

impl Lines {
    async fn open(url: &str, query: &str) -> Lines {
        let resp = reqwest::get(format!("{url}/v1/watch?{query}")).await.expect("watch");
        assert_eq!(resp.status(), 200, "watch?{query}");
        let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok());
        assert_eq!(ct, Some("application/x-ndjson"));
        Lines {
            resp,
            buffered: String::new(),
        }
    }

    /// The next line as JSON (checked against the documented `WatchLine`),
    /// or `None` once the stream ended.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(nl) = self.buffered.find('\n') {
                let line: String = self.buffered.drain(..=nl).collect();
                let v: Value = serde_json::from_str(line.trim()).expect("a JSON line");
                let doc: Value = serde_json::from_str(include_str!("../../../docs/openapi.json")).expect("doc");
                let schema = json!({ "$ref": "#/components/schemas/WatchLine" });
                common::schema::check(&doc, &schema, &v).unwrap_or_else(|e| panic!("{e}"));
                return Some(v);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(5), self.resp.chunk())
                .await
                .expect("a line in time")
                .expect("stream");
            self.buffered.push_str(&String::from_utf8_lossy(&chunk?));
        }
    }

    async fn take(&mut self, n: usize) -> Vec<Value> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.next().await.expect("an event"));
        }
        out
    }
}

fn summary(events: &[Value]) -> Vec<(String, String, u64)> {
    events
        .iter()
        .map(|e| {
            let r = e["resource"].as_str().unwrap_or_default().to_string();
            let k = e["kind"].as_str().unwrap_or_default().to_string();
            (r, k, e["token"].as_u64().unwrap_or(0))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ndjson_watch_delivers_resumes_filters_and_ends_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Coordinator::start(dir.path(), &["--ttl-min", "10ms"]);
    let mut all = Lines::open(&c.url, "prefix=hw/").await;
    let a = acquire(&c.url, "hw/a", 60_000).await;
    acquire(&c.url, "other/x", 60_000).await;
    acquire(&c.url, "hw/b", 150).await;
    release(&c.url, &a).await;
    let events = all.take(4).await;
    let s = |r: &str, k: &str, t: u64| (r.to_string(), k.to_string(), t);
    assert_eq!(
        summary(&events),
        vec![
            s("hw/a", "granted", 1),
            s("hw/b", "granted", 1),
            s("hw/a", "released", 1),
            s("hw/b", "expired", 1)
        ]
    );
    let revisions: Vec<u64> = events.iter().filter_map(|e| e["revision"].as_u64()).collect();
    assert!(revisions.windows(2).all(|w| w[0] < w[1]), "{revisions:?}");
    assert_eq!(events[0]["holder"], "reader");
    assert_eq!(events[2]["holder"], Value::Null);
    let text = serde_json::to_string(&events).expect("json");
    assert!(!text.contains("lease_id") && !text.contains(a["lease_id"].as_str().expect("id")));

    // Resume after the first event on the same coordinator: exactly the rest.
    let id = events[0]["coordinator_id"]
        .as_str()
        .expect("coordinator id")
        .to_string();
    let mut resumed = Lines::open(
        &c.url,
        &format!("prefix=hw/&after_revision={}&coordinator_id={id}", revisions[0]),
    )
    .await;
    assert_eq!(resumed.take(3).await, events[1..].to_vec());
    // One resource, from the start.
    let mut one = Lines::open(&c.url, &format!("resource=hw/a&after_revision=0&coordinator_id={id}")).await;
    assert_eq!(
        summary(&one.take(2).await),
        vec![s("hw/a", "granted", 1), s("hw/a", "released", 1)]
    );

    // SIGTERM: the stream's last line says why it ends, then it ends.
    common::sigterm(&c.child);
    let last = all.next().await.expect("a last line");
    assert_eq!(last["error"], "shutting_down", "{last}");
    assert_eq!(all.next().await, None, "the stream ends");
    let status = tokio::task::spawn_blocking(move || c.child.wait().map(|s| (s, c)))
        .await
        .expect("join")
        .expect("wait");
    assert!(status.0.success(), "{:?}", status.0);
}

#[tokio::test]
async fn the_listing_pages_through_every_resource_in_name_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let mut names = Vec::new();
    for i in 0..25 {
        let name = format!("list/{}", (i * 7) % 25);
        let lease = acquire(&c.url, &name, 60_000).await;
        if i % 3 == 0 {
            release(&c.url, &lease).await;
        }
        names.push(name);
    }
    acquire(&c.url, "other/1", 60_000).await;
    names.sort();

    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut url = format!("{}/v1/resources?prefix=list/&limit=4", c.url);
        if let Some(a) = &after {
            url.push_str(&format!("&after={a}"));
        }
        let page: Value = reqwest::get(url).await.expect("list").json().await.expect("json");
        pages += 1;
        for r in page["resources"].as_array().expect("resources") {
            let held = r["holder"] != Value::Null;
            assert_eq!(held, r["token"] != Value::Null, "{r}");
            assert_eq!(r["last_token"], 1, "{r}");
            assert!(r.get("lease_id").is_none(), "no lease ids: {r}");
            seen.push(r["resource"].as_str().expect("name").to_string());
        }
        match page["next_after"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, names, "every resource under the prefix, once, in order");
    assert_eq!(pages, 7, "25 resources, 4 a page");
}

#[tokio::test]
async fn a_status_query_says_what_is_wrong_with_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    acquire(&c.url, "q/1", 60_000).await;
    let ok = reqwest::get(format!("{}/v1/status?resource=q/1", c.url))
        .await
        .expect("status");
    assert_eq!(ok.status(), 200);
    // Each refused as the listing and the watch refuse the same mistakes,
    // saying which parameter and why; none answered for a resource the
    // caller did not name.
    for (query, field, says) in [
        ("resource=q/1&bogus=1", "query", "unknown parameter \"bogus\""),
        ("resourse=q/1", "query", "unknown parameter \"resourse\""),
        ("resource=q/1&resource=q/2", "resource", "given more than once"),
        ("", "resource", "missing: give ?resource=NAME"),
        ("resource=", "resource", "got an empty string"),
        // Not a name with U+FFFD in it: no name at all.
        ("resource=q%FF", "query", "not UTF-8"),
    ] {
        let resp = reqwest::get(format!("{}/v1/status?{query}", c.url))
            .await
            .expect("status");
        let code = resp.status().as_u16();
        let body: Value = resp.json().await.expect("json");
        assert_eq!(
            (code, body["error"].as_str()),
            (400, Some("invalid")),
            "?{query}: {body}"
        );
        let message = body["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!("invalid {field}: ")),
            "?{query}: {message}"
        );
        assert!(message.contains(says), "?{query}: {message}");
    }
}
