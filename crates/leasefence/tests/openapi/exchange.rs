//! One request of the OpenAPI test and its answer: how it is sent, and the
//! check that the answer is one the document lists for the operation.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::schema;

pub struct Case {
    pub method: &'static str,
    /// Path and query.
    pub target: String,
    pub body: Option<Vec<u8>>,
    pub expect: u16,
    /// For a watch stream: a resource to acquire once the stream is open, so
    /// that it carries an event to check.
    pub then_acquire: Option<String>,
}

pub fn case(method: &'static str, target: impl Into<String>, body: Option<Value>, expect: u16) -> Case {
    Case {
        method,
        target: target.into(),
        body: body.map(|b| b.to_string().into_bytes()),
        expect,
        then_acquire: None,
    }
}

pub fn raw(method: &'static str, target: &str, body: &[u8], expect: u16) -> Case {
    Case {
        method,
        target: target.to_string(),
        body: Some(body.to_vec()),
        expect,
        then_acquire: None,
    }
}

pub fn watch_case(query: &str, then_acquire: &str) -> Case {
    Case {
        then_acquire: Some(then_acquire.to_string()),
        ..case("GET", format!("/v1/watch?{query}"), None, 200)
    }
}

/// The documented operations, as (METHOD, path).
pub fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            ops.insert((method.to_uppercase(), path.clone()));
        }
    }
    ops
}

/// Checks an answer against the operation's documented responses.
pub fn conforms(doc: &Value, c: &Case, status: u16, content_type: &str, body: &str) -> Result<(), String> {
    let path = c.target.split('?').next().unwrap_or_default();
    let op = &doc["paths"][path][c.method.to_lowercase()];
    let response = &op["responses"][status.to_string()];
    if response.is_null() {
        return Err(format!("status {status} is not documented for {} {path}", c.method));
    }
    let media = content_type.split(';').next().unwrap_or_default().trim();
    let content = response["content"]
        .as_object()
        .ok_or_else(|| format!("{status} of {} {path} documents no content", c.method))?;
    let Some(entry) = content.get(media) else {
        return Err(format!(
            "content type {media:?} is not documented (documented: {:?})",
            content.keys()
        ));
    };
    let schema = &entry["schema"];
    match media {
        "application/json" => {
            let v: Value = serde_json::from_str(body).map_err(|e| format!("not JSON ({e}): {body}"))?;
            schema::check(doc, schema, &v)
        }
        "application/x-ndjson" => {
            for line in body.lines().filter(|l| !l.is_empty()) {
                let v: Value = serde_json::from_str(line).map_err(|e| format!("line not JSON ({e}): {line}"))?;
                schema::check(doc, schema, &v)?;
            }
            Ok(())
        }
        _ => schema::check(doc, schema, &Value::String(body.to_string())),
    }
}

/// Sends `c`; returns the status, content type and body (for a watch stream:
/// the first line, read after acquiring `then_acquire`).
pub async fn send(http: &reqwest::Client, url: &str, c: &Case) -> (u16, String, String) {
    let method = reqwest::Method::from_bytes(c.method.as_bytes()).expect("method");
    let mut req = http.request(method, format!("{url}{}", c.target));
    if let Some(b) = &c.body {
        req = req.header("content-type", "application/json").body(b.clone());
    }
    let mut resp = req.send().await.expect("send");
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = match (&c.then_acquire, status) {
        (Some(r), 200) => {
            let acquired = http
                .post(format!("{url}/v1/acquire"))
                .body(json!({ "resource": r, "ttl_ms": 10_000 }).to_string())
                .send()
                .await
                .expect("acquire");
            assert_eq!(acquired.status(), 200, "acquire {r} for the watch");
            let mut text = String::new();
            while !text.contains('\n') {
                let chunk = tokio::time::timeout(Duration::from_secs(5), resp.chunk())
                    .await
                    .expect("a watch event in time")
                    .expect("stream");
                let Some(chunk) = chunk else { break };
                text.push_str(&String::from_utf8_lossy(&chunk));
            }
            text
        }
        _ => resp.text().await.expect("body"),
    };
    (status, content_type, body)
}
