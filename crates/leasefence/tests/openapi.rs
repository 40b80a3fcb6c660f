//! `docs/openapi.json` matches the real `leasefence serve`: every documented
//! operation is sent (valid and invalid requests, a generated set), each
//! answer's status is one the document lists for that operation, and its body
//! validates against the documented schema (a small hand-written checker,
//! `common/schema.rs`). And every route the router serves is documented.

mod common;

#[path = "openapi/exchange.rs"]
mod exchange;

use std::collections::BTreeSet;
use std::time::Duration;

use common::Coordinator;
use common::schema;
use exchange::{Case, case, conforms, operations, raw, send, watch_case};
use serde_json::{Value, json};

const DOC: &str = include_str!("../../../docs/openapi.json");

/// Acquire bodies over combinations of valid and invalid fields: 200 only
/// when every field is valid, else 400 naming the field.
fn acquire_cases() -> Vec<Case> {
    let long_resource = "r".repeat(513);
    let long_holder = "h".repeat(257);
    let mut cases = Vec::new();
    let mut n = 0;
    for resource in ["ok", "", long_resource.as_str(), "bad\u{1}name"] {
        for ttl in [0u64, 50, 10_000, 7_200_000] {
            for holder in [None, Some("worker"), Some(long_holder.as_str())] {
                for extra in [false, true] {
                    n += 1;
                    let name = if resource == "ok" {
                        format!("oa/gen/{n}")
                    } else {
                        resource.to_string()
                    };
                    let mut body = json!({ "resource": name, "ttl_ms": ttl });
                    if let Some(h) = holder {
                        body["holder"] = json!(h);
                    }
                    if extra {
                        body["bogus"] = json!(1);
                    }
                    let valid = resource == "ok" && ttl == 10_000 && holder != Some(&long_holder) && !extra;
                    cases.push(case("POST", "/v1/acquire", Some(body), if valid { 200 } else { 400 }));
                }
            }
        }
    }
    cases
}

async fn acquire(http: &reqwest::Client, url: &str, resource: &str) -> Value {
    let resp = http
        .post(format!("{url}/v1/acquire"))
        .body(json!({ "resource": resource, "ttl_ms": 60_000 }).to_string())
        .send()
        .await
        .expect("acquire");
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("lease")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_answers_as_documented() {
    let doc: Value = serde_json::from_str(DOC).expect("docs/openapi.json is JSON");
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Coordinator::start(dir.path(), &["--waiters-max", "1"]);
    let url = server.url.clone();
    let http = reqwest::Client::new();

    let mut cases = acquire_cases();
    // Busy, then a full waiter queue (one waiter allowed, queued in the background).
    let held = acquire(&http, &url, "oa/busy").await;
    cases.push(case(
        "POST",
        "/v1/acquire",
        Some(json!({"resource": "oa/busy", "ttl_ms": 5000})),
        409,
    ));
    let queued = {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move {
            let body = json!({"resource": "oa/busy", "ttl_ms": 5000, "wait_ms": 30_000}).to_string();
            http.post(format!("{url}/v1/acquire")).body(body).send().await
        })
    };
    for _ in 0..100 {
        let s: Value = http
            .get(format!("{url}/v1/status?resource=oa/busy"))
            .send()
            .await
            .expect("status")
            .json()
            .await
            .expect("json");
        if s["waiters"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let full = json!({"resource": "oa/busy", "ttl_ms": 5000, "wait_ms": 1000});
    cases.push(case("POST", "/v1/acquire", Some(full), 429));
    for bad in [&b"{"[..], b"[]", b"", b"{\"resource\": 5, \"ttl_ms\": 1000}"] {
        cases.push(raw("POST", "/v1/acquire", bad, 400));
    }
    let huge = vec![b' '; 70 * 1024];
    cases.push(raw("POST", "/v1/acquire", &huge, 413));

    // Renew and release: a live lease, a wrong id, a malformed id, an ended lease.
    let lease = acquire(&http, &url, "oa/renew").await;
    let id = lease["lease_id"].as_str().expect("id").to_string();
    let zeros = "0".repeat(32);
    for op in ["renew", "release"] {
        let path = format!("/v1/{op}");
        cases.push(case(
            "POST",
            &path,
            Some(json!({"resource": "oa/busy", "lease_id": zeros})),
            410,
        ));
        cases.push(case(
            "POST",
            &path,
            Some(json!({"resource": "oa/renew", "lease_id": "xyz"})),
            400,
        ));
        cases.push(case("POST", &path, Some(json!({"resource": "", "lease_id": id})), 400));
        cases.push(case("POST", &path, Some(json!({"resource": "oa/renew"})), 400));
        cases.push(case(
            "POST",
            &path,
            Some(json!({"resource": "oa/renew", "lease_id": id, "x": 1})),
            400,
        ));
        cases.push(raw("POST", &path, &huge, 413));
    }
    cases.push(case(
        "POST",
        "/v1/renew",
        Some(json!({"resource": "oa/renew", "lease_id": id})),
        200,
    ));
    cases.push(case(
        "POST",
        "/v1/release",
        Some(json!({"resource": "oa/renew", "lease_id": id})),
        200,
    ));
    cases.push(case(
        "POST",
        "/v1/release",
        Some(json!({"resource": "oa/renew", "lease_id": id})),
        410,
    ));
    cases.push(case(
        "POST",
        "/v1/renew",
        Some(json!({"resource": "oa/renew", "lease_id": id})),
        410,
    ));

    // Force-release: a held lease ends (its waiter, if any, would be woken),
    // an unheld resource answers `released: false`, bad bodies get 400.
    acquire(&http, &url, "oa/force").await;
    for (body, code) in [
        (json!({"resource": "oa/force"}), 200),
        (json!({"resource": "oa/force"}), 200),
        (json!({"resource": ""}), 400),
        (json!({"resource": "oa/force", "x": 1}), 400),
        (json!({}), 400),
    ] {
        cases.push(case("POST", "/v1/force-release", Some(body), code));
    }
    cases.push(raw("POST", "/v1/force-release", &huge, 413));

    let long = "r".repeat(513);
    for (q, code) in [
        ("resource=oa/busy", 200),
        ("resource=oa/renew", 200),
        ("resource=oa/never", 200),
        ("", 400),
        ("resource=", 400),
        (&*format!("resource={long}"), 400),
    ] {
        cases.push(case("GET", format!("/v1/status?{q}"), None, code));
    }
    for (q, code) in [
        ("", 200),
        ("prefix=oa/", 200),
        ("prefix=oa/gen/&limit=1", 200),
        ("prefix=oa/&after=oa/gen/1&limit=5", 200),
        ("prefix=nothing/", 200),
        ("limit=1000", 200),
        ("limit=0", 400),
        ("limit=1001", 400),
        ("limit=abc", 400),
        ("limit=-1", 400),
        ("limit=1&limit=2", 400),
        ("bogus=1", 400),
        ("after=", 400),
        ("prefix=%01", 400),
        ("prefix=oa%FF", 400),
        (&*format!("prefix={long}"), 400),
    ] {
        cases.push(case("GET", format!("/v1/resources?{q}"), None, code));
    }
    cases.push(watch_case("prefix=oa/w/", "oa/w/1"));
    cases.push(watch_case("resource=oa/w/2", "oa/w/2"));
    cases.push(watch_case("", "oa/w/3"));
    for (q, code) in [
        ("prefix=a&resource=b", 400),
        ("after_revision=999999", 400),
        ("after_revision=1", 400),
        ("after_revision=x", 400),
        ("after_revision=0&coordinator_id=another", 410),
        ("bogus=1", 400),
        ("resource=", 400),
    ] {
        cases.push(case("GET", format!("/v1/watch?{q}"), None, code));
    }
    for path in [
        "/healthz",
        "/metrics",
        "/openapi.json",
        "/",
        "/ui",
        "/ui/app.js",
        "/ui/style.css",
    ] {
        cases.push(case("GET", path, None, 200));
    }

    let mut failures = Vec::new();
    let mut sent = BTreeSet::new();
    for c in &cases {
        let (status, content_type, body) = send(&http, &url, c).await;
        sent.insert((
            c.method.to_string(),
            c.target.split('?').next().unwrap_or_default().to_string(),
        ));
        if status != c.expect {
            failures.push(format!(
                "{} {}: status {status}, expected {}: {body}",
                c.method, c.target, c.expect
            ));
        }
        if let Err(e) = conforms(&doc, c, status, &content_type, &body) {
            failures.push(format!("{} {}: {e}", c.method, c.target));
        }
        // Whatever the server accepts, the documented request schema allows too.
        let path = c.target.split('?').next().unwrap_or_default();
        let request_schema =
            &doc["paths"][path][c.method.to_lowercase()]["requestBody"]["content"]["application/json"]["schema"];
        if let (200, false, Some(b)) = (status, request_schema.is_null(), &c.body) {
            let v: Value = serde_json::from_slice(b).expect("an accepted body is JSON");
            if let Err(e) = schema::check(&doc, request_schema, &v) {
                failures.push(format!(
                    "{} {}: accepted, but the documented request schema refuses it: {e}",
                    c.method, c.target
                ));
            }
        }
    }
    println!("{} requests sent, {} failures", cases.len(), failures.len());
    assert!(cases.len() >= 100, "{} cases", cases.len());
    assert!(
        failures.is_empty(),
        "{} of {} requests:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert_eq!(
        sent,
        operations(&doc),
        "every documented operation is sent, and only those"
    );
    assert_eq!(held["token"], 1);
    queued.abort();
}

/// The router's routes, from the server's sources: `.route("/path", get(…))`.
fn served_routes() -> BTreeSet<(String, String)> {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../leasefence-server/src");
    let mut routes = BTreeSet::new();
    for entry in std::fs::read_dir(src).expect("server sources") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read source");
        for piece in text.split(".route(\"").skip(1) {
            let (route, rest) = piece.split_once('"').expect("a quoted path");
            let rest = rest.trim_start_matches([',', ' ', '\n']);
            let mut method = rest.split(['(', ')']).next().unwrap_or_default().trim().to_string();
            // A handler bound to a name first: `let name = get(…)`.
            if let Some(bound) = text.split(&format!("let {method} = ")).nth(1) {
                method = bound.split('(').next().unwrap_or_default().trim().to_string();
            }
            assert!(
                ["get", "post"].contains(&method.as_str()),
                "{}: route {route} uses {method:?}; teach this test its method",
                path.display()
            );
            routes.insert((method.to_uppercase(), route.to_string()));
        }
    }
    routes
}

#[tokio::test]
async fn every_served_route_is_documented_and_the_document_is_served() {
    let doc: Value = serde_json::from_str(DOC).expect("docs/openapi.json is JSON");
    let routes = served_routes();
    assert!(routes.len() >= 12, "found the router's routes: {routes:?}");
    assert_eq!(
        routes,
        operations(&doc),
        "the router's routes and docs/openapi.json's operations"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let server = Coordinator::start(dir.path(), &[]);
    let resp = reqwest::get(format!("{}/openapi.json", server.url)).await.expect("get");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.text().await.expect("text"),
        DOC,
        "the served document is the one in docs/"
    );
}
