//! A lease belongs to the principal that took it: nobody else renews or
//! releases it, even with its lease id, and that survives a restart. An
//! admin's force-release ends it and the next holder's token is higher.
//! Limits refuse with 429 naming the limit.

use std::time::Duration;

use leasefence_proto::v1 as pb;
use leasefence_server::auth::Limits;
use leasefence_server::{Server, ServerConfig};
use serde_json::json;
use tonic::Code;

use crate::support::{ALICE, BOB, OPS, policy, req, serve, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_principals_lease_is_refused_even_with_its_lease_id() {
    let s = start(Limits::default()).await;
    let mut c = s.grpc.clone();
    let mut refused = 0;
    for i in 0..20 {
        let resource = format!("shared/{i}");
        let (token, id, holder) = s.grant(ALICE, &resource, Some(&format!("worker-{i}"))).await;
        assert_eq!(holder, format!("alice/worker-{i}"), "the holder carries the principal");
        let lease = json!({ "resource": resource, "lease_id": id });
        for path in ["/v1/renew", "/v1/release"] {
            let (code, body) = s.post(Some(BOB), path, lease.clone()).await;
            assert_eq!(
                (code, body["reason"].as_str()),
                (403, Some("not_owner")),
                "{path}: {body}"
            );
            assert!(
                body["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(&format!("{resource:?}"))
            );
            refused += 1;
        }
        let renew = pb::RenewRequest {
            resource: resource.clone(),
            lease_id: id.clone(),
        };
        let e = c.renew(req(renew.clone(), Some(BOB))).await.expect_err("bob renews");
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        let release = pb::ReleaseRequest {
            resource: resource.clone(),
            lease_id: id.clone(),
        };
        let e = c
            .release(req(release.clone(), Some(BOB)))
            .await
            .expect_err("bob releases");
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        let stream = tokio_stream::iter(vec![renew.clone()]);
        let mut answers = c.keep_alive(req(stream, Some(BOB))).await.expect("opened").into_inner();
        let e = answers.message().await.expect_err("bob keeps alive");
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        refused += 3;
        // Alice's lease is untouched, and hers to renew and release.
        let (code, v) = s.get(Some(ALICE), &format!("/v1/status?resource={resource}")).await;
        assert_eq!((code, v["token"].as_u64()), (200, Some(token)), "{v}");
        c.renew(req(renew, Some(ALICE))).await.expect("alice renews");
        let released = c.release(req(release, Some(ALICE))).await.expect("alice releases");
        assert_eq!(released.into_inner().token, token);
    }
    assert!(refused >= 100, "{refused}");
    eprintln!("not_owner: {refused} renew/release/keep-alive attempts refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ownership_survives_a_restart_on_the_embedded_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = || {
        let mut c = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path().to_path_buf());
        c.policy = Some(policy());
        c
    };
    let s = serve(Server::bind(config()).await.expect("bind")).await;
    let (token, id, _) = s.grant(ALICE, "shared/kept", None).await;
    s.stop().await;
    // The store's writer lets go of the file once the engine is gone.
    let mut again = Server::bind(config()).await;
    for _ in 0..100 {
        if again.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        again = Server::bind(config()).await;
    }
    let s = serve(again.expect("rebound")).await;
    let lease = json!({ "resource": "shared/kept", "lease_id": id });
    let (code, body) = s.post(Some(BOB), "/v1/release", lease.clone()).await;
    assert_eq!((code, body["reason"].as_str()), (403, Some("not_owner")), "{body}");
    let (code, body) = s.post(Some(ALICE), "/v1/release", lease).await;
    assert_eq!((code, body["token"].as_u64()), (200, Some(token)), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_hands_the_resource_on_with_a_higher_token() {
    let s = start(Limits::default()).await;
    for i in 0..100 {
        let resource = format!("jobs/f{}", i % 10);
        let (token, id, _) = s.grant(ALICE, &resource, None).await;
        // Bob waits for it; the force-release hands it to him.
        let waiting = {
            let http = s.http.clone();
            let url = format!("{}/v1/acquire", s.base);
            let body = json!({ "resource": resource, "ttl_ms": 60_000, "wait_ms": 20_000 });
            tokio::spawn(async move {
                let r = http.post(url).header("authorization", BOB).json(&body).send().await;
                let r = r.expect("send");
                (r.status().as_u16(), r.json::<serde_json::Value>().await.expect("json"))
            })
        };
        // Until bob is queued.
        for _ in 0..200 {
            let (_, v) = s.get(Some(OPS), &format!("/v1/status?resource={resource}")).await;
            if v["waiters"] == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (code, v) = s
            .post(Some(OPS), "/v1/force-release", json!({ "resource": resource }))
            .await;
        assert_eq!(
            (code, v["token"].as_u64(), v["released"].as_bool()),
            (200, Some(token), Some(true)),
            "{v}"
        );
        let (code, bobs) = waiting.await.expect("joined");
        assert_eq!(code, 200, "{bobs}");
        let next = bobs["token"].as_u64().expect("token");
        assert!(next > token, "round {i}: {next} > {token}");
        // Alice's lease is over: her renew is lease lost.
        let (code, v) = s
            .post(
                Some(ALICE),
                "/v1/renew",
                json!({ "resource": resource, "lease_id": id }),
            )
            .await;
        assert_eq!((code, v["error"].as_str()), (410, Some("lease_lost")), "{v}");
        let bob_lease = json!({ "resource": resource, "lease_id": bobs["lease_id"] });
        assert_eq!(s.post(Some(BOB), "/v1/release", bob_lease).await.0, 200);
    }
    // Nothing held: released false, token null.
    let (code, v) = s
        .post(Some(OPS), "/v1/force-release", json!({ "resource": "jobs/none" }))
        .await;
    assert_eq!(
        (code, v["released"].as_bool(), v["token"].is_null()),
        (200, Some(false), true),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_refuse_with_429_naming_the_limit_and_its_value() {
    let limits = Limits {
        leases_per_principal_max: 3,
        waiters_per_principal_max: 1,
        watchers_max: 4,
        watchers_per_principal_max: 2,
        ..Limits::default()
    };
    let s = start(limits).await;
    for i in 0..3 {
        s.grant(ALICE, &format!("jobs/l{i}"), None).await;
    }
    let (code, v) = s
        .post(
            Some(ALICE),
            "/v1/acquire",
            json!({ "resource": "jobs/l9", "ttl_ms": 1000 }),
        )
        .await;
    assert_eq!(
        (code, v["error"].as_str(), v["limit"].as_str(), v["value"].as_u64()),
        (429, Some("limit_exceeded"), Some("leases-per-principal-max"), Some(3)),
        "{v}"
    );
    // A request wrong in itself is refused as wrong, at the limit or not:
    // waiting for a lease of hers to end would not make it right.
    for bad in [
        json!({ "resource": "jobs/l9", "ttl_ms": 0 }),
        json!({ "resource": "jobs/l9", "ttl_ms": 1000, "lock_delay_ms": u64::MAX }),
    ] {
        let (code, v) = s.post(Some(ALICE), "/v1/acquire", bad).await;
        assert_eq!((code, v["error"].as_str()), (400, Some("invalid")), "{v}");
    }
    // Bob is not limited by alice's count; his second waiter is refused.
    let http = s.http.clone();
    let url = format!("{}/v1/acquire", s.base);
    let first = tokio::spawn(async move {
        let body = json!({ "resource": "jobs/l0", "ttl_ms": 1000, "wait_ms": 3000 });
        http.post(url)
            .header("authorization", BOB)
            .json(&body)
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    for _ in 0..200 {
        let (_, v) = s.get(Some(OPS), "/v1/status?resource=jobs/l0").await;
        if v["waiters"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (code, v) = s
        .post(
            Some(BOB),
            "/v1/acquire",
            json!({ "resource": "jobs/l1", "ttl_ms": 1000, "wait_ms": 1000 }),
        )
        .await;
    assert_eq!(
        (code, v["limit"].as_str(), v["value"].as_u64()),
        (429, Some("waiters-per-principal-max"), Some(1)),
        "{v}"
    );
    first.abort();
    // Watchers: two per principal, four in all.
    let mut c = s.grpc.clone();
    let watch = |auth| {
        req(
            pb::WatchRequest {
                resource: "jobs/".into(),
                prefix: true,
                ..Default::default()
            },
            Some(auth),
        )
    };
    let mut open = vec![];
    for _ in 0..2 {
        open.push(c.watch(watch(ALICE)).await.expect("watch"));
    }
    let e = c.watch(watch(ALICE)).await.expect_err("third");
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(
        e.message().contains("watchers-per-principal-max = 2"),
        "{}",
        e.message()
    );
    for _ in 0..2 {
        open.push(c.watch(watch(BOB)).await.expect("watch"));
    }
    let e = c.watch(watch(OPS)).await.expect_err("fifth");
    assert!(e.message().contains("watchers-max = 4"), "{}", e.message());
    // A closed watch frees its slot.
    drop(open.pop());
    let mut freed = false;
    for _ in 0..100 {
        if c.watch(watch(OPS)).await.is_ok() {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "the slot of a closed watch is given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principals_lease_count_goes_down_on_release_and_expiry() {
    let s = start(Limits {
        leases_per_principal_max: 1,
        ..Limits::default()
    })
    .await;
    let acquire = |r: &str, ttl_ms: u64| json!({ "resource": r, "ttl_ms": ttl_ms });
    let (code, v) = s.post(Some(ALICE), "/v1/acquire", acquire("jobs/e0", 60_000)).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(s.post(Some(ALICE), "/v1/acquire", acquire("jobs/e1", 100)).await.0, 429);
    assert_eq!(
        s.post(Some(BOB), "/v1/acquire", acquire("jobs/e1", 100)).await.0,
        200,
        "bob has his own count"
    );
    let lease = json!({ "resource": "jobs/e0", "lease_id": v["lease_id"] });
    assert_eq!(s.post(Some(ALICE), "/v1/release", lease).await.0, 200);
    assert_eq!(
        s.post(Some(ALICE), "/v1/acquire", acquire("jobs/e2", 100)).await.0,
        200,
        "after a release"
    );
    assert_eq!(s.post(Some(ALICE), "/v1/acquire", acquire("jobs/e3", 100)).await.0, 429);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        s.post(Some(ALICE), "/v1/acquire", acquire("jobs/e3", 100)).await.0,
        200,
        "after an expiry"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_access_control_anyone_may_force_release() {
    let config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), std::env::temp_dir());
    let server = Server::bind_with_store(config, leasefence_store::MemoryStore::new());
    let s = serve(server.await.expect("bind")).await;
    let (code, v) = s
        .post(
            None,
            "/v1/acquire",
            json!({ "resource": "x", "ttl_ms": 60_000, "holder": "h" }),
        )
        .await;
    assert_eq!(
        (code, v["holder"].as_str()),
        (200, Some("h")),
        "the holder is kept as given: {v}"
    );
    let (code, v) = s.post(None, "/v1/force-release", json!({ "resource": "x" })).await;
    assert_eq!((code, v["token"].as_u64()), (200, Some(1)), "{v}");
    let (code, v) = s
        .post(None, "/v1/acquire", json!({ "resource": "x", "ttl_ms": 60_000 }))
        .await;
    assert_eq!((code, v["token"].as_u64()), (200, Some(2)), "{v}");
}
