//! 401 for an unknown or missing credential and 403 for a verb missing on a
//! prefix, on every operation of both edges, over generated requests.

use leasefence_server::auth::Limits;
use serde_json::json;
use tonic::Code;

use crate::support::{ALICE, BOB, OPS, allowed, fake_lease_id, start};

/// Credentials that name no principal, as sent in `authorization`.
fn unknown(i: u64) -> Option<String> {
    match i % 8 {
        0 => None,
        1 => Some(format!("Bearer wrong-{i}")),
        2 => Some("Basic dG9rLWFsaWNlOg==".into()),
        3 => Some("Bearer tok-alicex".into()),
        4 => Some("tok-alice".into()),
        5 => Some(format!("Bearer {}", leasefence_core::access::hash_token("tok-alice"))),
        6 => Some("Bearer  ".into()),
        _ => Some(format!("Token tok-bob-{i}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_principals_get_401_on_every_operation_of_both_edges() {
    let s = start(Limits::default()).await;
    let mut checked = 0;
    for i in 0..16u64 {
        let auth = unknown(i);
        let auth = auth.as_deref();
        let resource = format!("jobs/{i}");
        let id = fake_lease_id(i);
        let lease = json!({ "resource": resource, "lease_id": id });
        let http = [
            (
                "acquire",
                s.post(auth, "/v1/acquire", json!({ "resource": resource, "ttl_ms": 1000 }))
                    .await,
            ),
            ("renew", s.post(auth, "/v1/renew", lease.clone()).await),
            ("release", s.post(auth, "/v1/release", lease.clone()).await),
            (
                "force-release",
                s.post(auth, "/v1/force-release", json!({ "resource": resource })).await,
            ),
            ("status", s.get(auth, &format!("/v1/status?resource={resource}")).await),
            ("metrics", s.get(auth, "/metrics").await),
        ];
        for (op, (code, body)) in http {
            assert_eq!(code, 401, "HTTP {op} with {auth:?}: {body}");
            assert_eq!(body["error"], "unauthenticated", "HTTP {op}: {body}");
            let message = body["message"].as_str().unwrap_or_default();
            assert!(!message.contains("tok-"), "the message echoes no credential: {message}");
            checked += 1;
        }
        for (op, status) in s.grpc_all(auth, &resource, &id).await {
            assert_eq!(
                status.code(),
                Code::Unauthenticated,
                "gRPC {op} with {auth:?}: {status:?}"
            );
            assert_eq!(
                status.metadata().get("leasefence-error").and_then(|v| v.to_str().ok()),
                Some("unauthenticated"),
                "gRPC {op}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 200, "{checked} requests");
    eprintln!("401: {checked} requests, all refused");
    // Nothing was granted to anyone.
    for i in 0..16 {
        let (code, v) = s.get(Some(OPS), &format!("/v1/status?resource=jobs/{i}")).await;
        assert_eq!(
            (code, v["last_token"].clone()),
            (200, serde_json::Value::Null),
            "jobs/{i}"
        );
    }
    // healthz stays open.
    assert_eq!(s.get(None, "/healthz").await.0, 200);
}

/// The HTTP operation of each verb, and what it needs.
const OPS_BY_VERB: [(&str, &str); 4] = [
    ("acquire", "acquire"),
    ("status", "read"),
    ("force-release", "admin"),
    ("release", "acquire"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verb_missing_on_the_prefix_gets_403_naming_verb_and_resource() {
    let s = start(Limits::default()).await;
    let resources = [
        "jobs/a",
        "shared/b",
        "db/c",
        "jobsx",
        "ops/d",
        "shared",
        "secret/jobs/e",
    ];
    let principals = [("alice", ALICE), ("bob", BOB), ("ops", OPS)];
    let (mut denied, mut allowed_n) = (0, 0);
    for round in 0..2 {
        for (name, auth) in principals {
            for resource in resources {
                for (op, verb) in OPS_BY_VERB {
                    let r = format!("{resource}{round}");
                    let (code, body) = match op {
                        "acquire" => {
                            s.post(Some(auth), "/v1/acquire", json!({ "resource": r, "ttl_ms": 1000 }))
                                .await
                        }
                        "status" => s.get(Some(auth), &format!("/v1/status?resource={r}")).await,
                        "force-release" => s.post(Some(auth), "/v1/force-release", json!({ "resource": r })).await,
                        _ => {
                            let body = json!({ "resource": r, "lease_id": fake_lease_id(7) });
                            s.post(Some(auth), "/v1/release", body).await
                        }
                    };
                    if allowed(name, verb, &r) {
                        assert!(code != 401 && code != 403, "{name} {op} {r}: {code} {body}");
                        allowed_n += 1;
                    } else {
                        assert_eq!(code, 403, "{name} {op} {r}: {body}");
                        assert_eq!(body["error"], "permission_denied");
                        let m = body["message"].as_str().unwrap_or_default();
                        assert!(m.contains(&format!("`{verb}`")) && m.contains(&format!("{r:?}")), "{m}");
                        denied += 1;
                    }
                }
            }
        }
    }
    assert!(denied >= 100, "{denied} refusals");
    assert!(allowed_n >= 20, "{allowed_n} allowed");
    eprintln!("HTTP 403: {denied} refused, {allowed_n} allowed, all as the rules say");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_refuses_a_missing_verb_with_permission_denied_naming_it() {
    let s = start(Limits::default()).await;
    let verb_of = |op: &str| match op {
        "acquire" | "renew" | "release" | "keep_alive" => "acquire",
        "get" | "watch" => "read",
        _ => "admin",
    };
    let mut denied = 0;
    for i in 0..8 {
        for (name, auth) in [("alice", ALICE), ("bob", BOB), ("ops", OPS)] {
            let resource = ["db/", "shared/", "jobs/", "x"][i % 4].to_string() + &i.to_string();
            for (op, status) in s.grpc_all(Some(auth), &resource, &fake_lease_id(i as u64)).await {
                let verb = verb_of(op);
                if allowed(name, verb, &resource) {
                    assert!(
                        !matches!(status.code(), Code::PermissionDenied | Code::Unauthenticated),
                        "{name} {op} {resource}: {status:?}"
                    );
                } else {
                    assert_eq!(
                        status.code(),
                        Code::PermissionDenied,
                        "{name} {op} {resource}: {status:?}"
                    );
                    let m = status.message();
                    assert!(
                        m.contains(&format!("`{verb}`")) && m.contains(&format!("{resource:?}")),
                        "{m}"
                    );
                    denied += 1;
                }
            }
        }
    }
    assert!(denied >= 100, "{denied} refusals");
    eprintln!("gRPC 403: {denied} refused as the rules say");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_watch_needs_read_on_all_of_the_prefix() {
    let s = start(Limits::default()).await;
    let mut c = s.grpc.clone();
    for (auth, prefix, ok) in [
        (ALICE, "jobs/", true),
        (ALICE, "jobs/x", true),
        (ALICE, "jobs", false),
        (ALICE, "", false),
        (OPS, "", true),
        (BOB, "shared/", false),
    ] {
        let w = leasefence_proto::v1::WatchRequest {
            resource: prefix.into(),
            prefix: true,
            ..Default::default()
        };
        let got = c.watch(crate::support::req(w, Some(auth))).await;
        match (ok, got) {
            (true, Ok(_)) => {}
            (false, Err(e)) => {
                assert_eq!(e.code(), Code::PermissionDenied, "{auth} {prefix:?}");
                assert!(e.message().contains(&format!("prefix {prefix:?}")), "{}", e.message());
            }
            (ok, got) => panic!("{auth} watching {prefix:?}: expected ok={ok}, got {:?}", got.err()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_refuses_a_message_over_the_http_body_limit_too() {
    let s = start(Limits::default()).await;
    let mut c = s.grpc.clone();
    let big = leasefence_proto::v1::AcquireRequest {
        resource: "jobs/big".into(),
        ttl_ms: 1000,
        holder: "h".repeat(80 * 1024),
        ..Default::default()
    };
    let e = c
        .acquire(crate::support::req(big, Some(ALICE)))
        .await
        .expect_err("too big");
    assert!(e.message().contains("too large"), "{e:?}");
    let (code, v) = s.get(Some(OPS), "/v1/status?resource=jobs/big").await;
    assert_eq!(
        (code, v["last_token"].clone()),
        (200, serde_json::Value::Null),
        "nothing granted"
    );
}
