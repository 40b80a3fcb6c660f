//! The gateway's HTTP edges over real sockets: every refusal (428, 400,
//! 409, 412, 413, 404) with its message, one fence key guarding many
//! objects, ETags, HEAD, DELETE and listings.

#[path = "gateway_common/mod.rs"]
mod gateway_common;

use gateway_common::{Go, Running, files_in, hex_sha256, put, raw, start};
use reqwest::StatusCode;
use serde_json::Value;

#[tokio::test]
async fn one_fence_key_guards_many_objects() {
    let g = start(1 << 20).await;
    let c = reqwest::Client::new();
    let mono = |r: reqwest::RequestBuilder| r.header("leasefence-mode", "monotonic");
    for key in ["tenant7/a", "tenant7/b"] {
        let resp = mono(put(&c, &g, key, "tenant/7", 5)).body(key).go().await;
        assert_eq!(resp.status(), StatusCode::CREATED);
    }
    let resp = put(&c, &g, "tenant7/b", "tenant/7", 5).body("again").go().await;
    assert_eq!(
        resp.status(),
        StatusCode::CONFLICT,
        "strict: the same token twice is stale"
    );
    let resp = mono(put(&c, &g, "tenant7/c", "tenant/7", 4)).body("late").go().await;
    assert_eq!(
        resp.status(),
        StatusCode::CONFLICT,
        "a never-written object is still fenced by its key"
    );
    let body: Value = resp.json().await.expect("json");
    assert_eq!(
        (
            body["resource"].clone(),
            body["presented"].clone(),
            body["current"].clone()
        ),
        ("tenant/7".into(), 4.into(), 5.into())
    );
    let resp = c.get(format!("{}/objects/tenant7/c", g.url)).go().await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let resp = c.get(format!("{}/objects/tenant7/a", g.url)).go().await;
    assert_eq!(resp.headers()["leasefence-resource"], "tenant/7");
}

/// Sends a PUT with `headers`, returns the status and the JSON body.
async fn put_with(g: &Running, headers: &[(&str, &str)]) -> (StatusCode, Value) {
    let mut req = reqwest::Client::new().put(format!("{}/objects/hdr", g.url)).body("x");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.go().await;
    (resp.status(), resp.json().await.expect("json"))
}

#[tokio::test]
async fn bad_fence_headers_are_refused_with_a_message() {
    let g = start(1 << 20).await;
    let (status, body) = put_with(&g, &[]).await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{body}");
    let msg = body["message"].as_str().expect("message");
    assert!(
        msg.contains("leasefence-resource") && msg.contains("leasefence-token"),
        "{msg}"
    );
    let r = "leasefence-resource";
    let t = "leasefence-token";
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[(r, "hdr")], t),
        (&[(t, "3")], r),
        (&[(r, "hdr"), (t, "three")], "decimal integer"),
        (&[(r, "hdr"), (t, "0")], "1..=18446744073709551615"),
        (&[(r, "hdr"), (t, "-1")], "decimal integer"),
        (&[(r, "hdr"), (t, "18446744073709551616")], "1..=18446744073709551615"),
        (
            &[(r, "hdr"), (t, "1"), (t, "2")],
            "leasefence-token appears more than once",
        ),
        (
            &[(r, "hdr"), (r, "other"), (t, "1")],
            "leasefence-resource appears more than once",
        ),
        (&[(r, ""), (t, "1")], "resource"),
        (
            &[(r, "hdr"), (t, "1"), ("leasefence-mode", "sloppy")],
            "\"strict\" or \"monotonic\"",
        ),
        (
            &[
                (r, "hdr"),
                (t, "1"),
                ("leasefence-mode", "strict"),
                ("leasefence-mode", "monotonic"),
            ],
            "leasefence-mode appears more than once",
        ),
        (&[(r, "hdr"), (t, "1"), ("if-match", "no-quotes")], "if-match"),
    ];
    for (headers, says) in cases {
        let (status, body) = put_with(&g, headers).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{headers:?}: {body}");
        let msg = body["message"].as_str().expect("message");
        assert!(msg.contains(says), "{headers:?}: message {msg:?} must mention {says:?}");
    }
    let resp = reqwest::get(format!("{}/objects/hdr", g.url)).await.expect("get");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND, "no refused write left an object");
    let resp = reqwest::get(format!("{}/fences/hdr", g.url)).await.expect("fence");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND, "no refused write left a fence");
    let del = reqwest::Client::new()
        .delete(format!("{}/objects/hdr", g.url))
        .go()
        .await;
    assert_eq!(del.status(), StatusCode::PRECONDITION_REQUIRED);
}

/// Writes a raw HTTP/1.1 request and returns the status line and the rest.
#[tokio::test]
async fn objects_above_the_limit_are_refused_up_front_and_while_streaming() {
    let g = start(1024).await;
    let fence = "leasefence-resource: big\r\nleasefence-token: 1\r\n";
    // Content-Length says too much: answered before any byte of the body is sent.
    let head = format!("PUT /objects/big HTTP/1.1\r\nhost: x\r\n{fence}content-length: 1025\r\n\r\n");
    let answer = raw(g.addr, &head, b"").await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // A chunked body crosses the limit: refused, and its temp file is gone.
    let head = format!("PUT /objects/big HTTP/1.1\r\nhost: x\r\n{fence}transfer-encoding: chunked\r\n\r\n");
    let mut chunk = format!("{:x}\r\n", 1025).into_bytes();
    chunk.extend_from_slice(&[7u8; 1025]);
    chunk.extend_from_slice(b"\r\n");
    let answer = raw(g.addr, &head, &chunk).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(
        files_in(&g.dir.path().join("tmp")),
        0,
        "the refused body's temp file is removed"
    );
    assert_eq!(files_in(&g.dir.path().join("blobs")), 0);
    let c = reqwest::Client::new();
    assert_eq!(
        reqwest::get(format!("{}/fences/big", g.url)).await.expect("f").status(),
        StatusCode::NOT_FOUND
    );
    let at_limit = put(&c, &g, "big", "big", 1).body(vec![1u8; 1024]).go().await;
    assert_eq!(at_limit.status(), StatusCode::CREATED, "exactly the limit is allowed");
}

#[tokio::test]
async fn etags_if_match_head_delete_and_listing() {
    let g = start(1 << 20).await;
    let c = reqwest::Client::new();
    let created = put(&c, &g, "docs/a", "docs/a", 1).body("first").go().await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let etag1 = created.headers()["etag"].to_str().expect("etag").to_string();
    assert_eq!(etag1, format!("\"{}\"", hex_sha256(b"first")));
    let created: Value = created.json().await.expect("json");
    assert_eq!(
        (created["size"].clone(), created["token"].clone()),
        (5.into(), 1.into())
    );

    let wrong = put(&c, &g, "docs/a", "docs/a", 2)
        .header("if-match", "\"0000\"")
        .body("x")
        .go()
        .await;
    assert_eq!(wrong.status(), StatusCode::PRECONDITION_FAILED);
    let body: Value = wrong.json().await.expect("json");
    assert_eq!(body["current_etag"], etag1.as_str());
    let create_only = put(&c, &g, "docs/a", "docs/a", 2)
        .header("if-none-match", "*")
        .body("x")
        .go()
        .await;
    assert_eq!(create_only.status(), StatusCode::PRECONDITION_FAILED);
    let must_exist = put(&c, &g, "docs/none", "docs/none", 1)
        .header("if-match", "*")
        .body("x")
        .go()
        .await;
    assert_eq!(must_exist.status(), StatusCode::PRECONDITION_FAILED);
    // A failed precondition records no token: 2 is still admissible.
    let replaced = put(&c, &g, "docs/a", "docs/a", 2)
        .header("if-match", etag1.as_str())
        .body("second")
        .go()
        .await;
    assert_eq!(replaced.status(), StatusCode::OK);
    let etag2 = replaced.headers()["etag"].to_str().expect("etag").to_string();

    let head = c.head(format!("{}/objects/docs/a", g.url)).go().await;
    assert_eq!(head.status(), StatusCode::OK);
    assert_eq!(head.headers()["etag"], etag2.as_str());
    assert_eq!(head.headers()["content-length"], "6");
    assert_eq!(head.headers()["leasefence-token"], "2");
    assert!(head.bytes().await.expect("body").is_empty());
    let missing = c.head(format!("{}/objects/docs/none", g.url)).go().await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);

    for (i, key) in ["docs/b", "docs/c", "other/d"].iter().enumerate() {
        let resp = put(&c, &g, key, key, 1).body(vec![b'x'; i + 1]).go().await;
        assert_eq!(resp.status(), StatusCode::CREATED);
    }
    let page: Value = c
        .get(format!("{}/objects?prefix=docs/&limit=2", g.url))
        .go()
        .await
        .json()
        .await
        .expect("json");
    let keys: Vec<_> = page["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .map(|o| o["key"].clone())
        .collect();
    assert_eq!(keys, ["docs/a", "docs/b"]);
    assert_eq!(
        (page["truncated"].clone(), page["next"].clone()),
        (true.into(), "docs/b".into())
    );
    assert_eq!(page["objects"][0]["etag"], etag2.as_str());
    assert_eq!(page["objects"][0]["token"], 2);
    let rest: Value = c
        .get(format!("{}/objects?prefix=docs/&after=docs/b", g.url))
        .go()
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(rest["objects"][0]["key"], "docs/c");
    assert_eq!(
        (rest["objects"].as_array().map(Vec::len), rest["truncated"].clone()),
        (Some(1), false.into())
    );
    let nowhere = c.get(format!("{}/object/docs/a", g.url)).go().await;
    assert_eq!(nowhere.status(), StatusCode::NOT_FOUND);
    let body: Value = nowhere.json().await.expect("json");
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains("/objects/{key}")),
        "{body}"
    );
    let bad = c.get(format!("{}/objects?prefx=docs/", g.url)).go().await;
    assert_eq!(
        bad.status(),
        StatusCode::BAD_REQUEST,
        "unknown query parameters are refused"
    );

    let del = |token: u64| {
        c.delete(format!("{}/objects/docs/a", g.url))
            .header("leasefence-resource", "docs/a")
            .header("leasefence-token", token)
    };
    assert_eq!(del(2).go().await.status(), StatusCode::CONFLICT, "strict: 2 was used");
    assert_eq!(
        del(3).header("if-match", etag1.as_str()).go().await.status(),
        StatusCode::PRECONDITION_FAILED
    );
    assert_eq!(
        del(3).header("if-match", etag2.as_str()).go().await.status(),
        StatusCode::OK
    );
    assert_eq!(
        c.get(format!("{}/objects/docs/a", g.url)).go().await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(del(4).go().await.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        files_in(&g.dir.path().join("blobs")),
        3,
        "the deleted and replaced blobs are gone"
    );
}

#[tokio::test]
async fn a_stale_put_is_refused_before_its_body_is_sent() {
    let g = start(64 << 20).await;
    let c = reqwest::Client::new();
    let resp = put(&c, &g, "early", "early", 5).body("v5").go().await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    // Headers only, announcing 32 MiB that never come: the answer cannot wait for them.
    let head = "PUT /objects/early HTTP/1.1\r\nhost: x\r\nleasefence-resource: early\r\nleasefence-token: 4\r\n\
                content-length: 33554432\r\n\r\n";
    let answer = tokio::time::timeout(std::time::Duration::from_secs(10), raw(g.addr, head, b""))
        .await
        .expect("answered before the body");
    assert!(answer.starts_with("HTTP/1.1 409"), "{answer}");
    assert!(
        answer.contains("\"presented\":4") && answer.contains("\"current\":5"),
        "{answer}"
    );
    assert_eq!(files_in(&g.dir.path().join("tmp")), 0);
}

#[tokio::test]
async fn a_body_cut_short_commits_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = start(1 << 20).await;
    let head = "PUT /objects/cut HTTP/1.1\r\nhost: x\r\nleasefence-resource: cut\r\nleasefence-token: 1\r\n\
                content-length: 100\r\n\r\n";
    let mut s = tokio::net::TcpStream::connect(g.addr).await.expect("connect");
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(&[b'x'; 50]).await.expect("half the body");
    s.shutdown().await.expect("the writer goes away");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer).await;
    assert!(
        !answer.starts_with("HTTP/1.1 2"),
        "a torn body must not be accepted: {answer}"
    );
    let c = reqwest::Client::new();
    let resp = c.get(format!("{}/objects/cut", g.url)).go().await;
    assert_eq!(
        resp.status(),
        StatusCode::NOT_FOUND,
        "nothing of the torn body is served"
    );
    let fence = c.get(format!("{}/fences/cut", g.url)).go().await;
    assert_eq!(fence.status(), StatusCode::NOT_FOUND, "and its token is not recorded");
    // The refusal is handled before the answer above, but the file may close just after.
    for _ in 0..100 {
        if files_in(&g.dir.path().join("tmp")) == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(files_in(&g.dir.path().join("tmp")), 0);
    let retry = put(&c, &g, "cut", "cut", 1).body("whole").go().await;
    assert_eq!(
        retry.status(),
        StatusCode::CREATED,
        "the same token may write once a body arrives whole"
    );
}
