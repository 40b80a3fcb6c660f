//! The fenced object-store gateway over real sockets: the conformance suite
//! and the pause kit through its HTTP target, concurrent fenced PUTs,
//! readers during replacement, and the start-up sweep of what an
//! interrupted write leaves behind.

#[path = "gateway_common/mod.rs"]
mod gateway_common;

use std::collections::BTreeSet;
use std::sync::Arc;

use gateway_common::{Go, Running, content, files_in, hex_sha256, put, start, start_in, start_signed};
use leasefence_arbiter::conformance;
use leasefence_arbiter::pause_check;
use leasefence_arbiter::targets::GatewayTarget;
use reqwest::StatusCode;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateway_passes_the_conformance_suite() {
    let g = start(1 << 20).await;
    let target = GatewayTarget::connect(&g.url).await.expect("connect");
    conformance::run_all(Arc::new(target)).await;
    assert_eq!(
        files_in(&g.dir.path().join("tmp")),
        0,
        "aborted bodies leave no temp file"
    );
}

/// With `--fence-key`, the signed-fence scenario; a refusal is a 403 whose
/// body names the reason, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateway_with_fence_keys_refuses_unsigned_and_forged_fences() {
    use leasefence_arbiter::ConformanceTarget;
    let keys = conformance::SuiteKeys::generate();
    let g = start_signed(keys.verifier()).await;
    let target = GatewayTarget::connect(&g.url)
        .await
        .expect("connect")
        .with_signer(keys.current.clone());
    conformance::signed_fences(&target, &keys).await;
    target.cleanup().await.expect("cleanup");

    let c = reqwest::Client::new();
    let resp = put(&c, &g, "signed/raw", "signed/raw", 1).body("x").go().await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(
        (&body["error"], &body["reason"], &body["resource"]),
        (
            &Value::from("bad_signature"),
            &Value::from("missing"),
            &Value::from("signed/raw")
        )
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("leasefence-signature"),
        "{body}"
    );
    let resp = c
        .get(format!("{}/objects/signed%2Fraw", g.url))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND, "a refused PUT writes nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_kit_finds_no_stale_effect() {
    let g = start(1 << 20).await;
    let target = Arc::new(GatewayTarget::connect(&g.url).await.expect("connect"));
    let report = pause_check(&target, 200).await.expect("check");
    assert_eq!(
        (report.trials, report.stale_accepted, report.stale_rejected),
        (200, 0, 200)
    );
    assert!(report.passed(), "{report:?}");
    let listing: Value = reqwest::get(format!("{}/objects?prefix=leasefence-check/", g.url))
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert_eq!(
        listing["objects"],
        Value::Array(vec![]),
        "cleanup removes the check's objects"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_puts_end_with_the_highest_admitted_token() {
    const WRITERS: u64 = 64;
    let g = start(1 << 20).await;
    let c = reqwest::Client::new();
    let mut order: Vec<u64> = (1..=WRITERS).collect();
    let seed = std::process::id() as u64 ^ 0x5eed;
    // Fisher-Yates with a seeded xorshift: writers start in a random order.
    let mut x = seed | 1;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let tasks: Vec<_> = order
        .iter()
        .map(|&t| {
            let req = put(&c, &g, "race/obj", "race/obj", t).body(content(t, 4096 + t as usize));
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_micros((t * 7919) % 3000)).await;
                let resp = req.go().await;
                (t, resp.status(), resp.json::<Value>().await.expect("json"))
            })
        })
        .collect();
    let (mut admitted, mut rejected) = (BTreeSet::new(), Vec::new());
    for task in tasks {
        let (t, status, body) = task.await.expect("task");
        match status {
            StatusCode::OK | StatusCode::CREATED => assert!(admitted.insert(t)),
            StatusCode::CONFLICT => rejected.push((t, body)),
            other => panic!("seed {seed}: token {t}: unexpected {other}: {body}"),
        }
    }
    assert_eq!(admitted.len() + rejected.len(), WRITERS as usize);
    assert!(
        admitted.contains(&WRITERS),
        "seed {seed}: the highest token is always admitted"
    );
    for (t, body) in &rejected {
        assert_eq!(body["error"], "stale", "{body}");
        assert_eq!(body["resource"], "race/obj");
        assert_eq!(body["presented"], *t);
        let current = body["current"].as_u64().expect("current");
        assert!(
            current >= *t && admitted.contains(&current),
            "seed {seed}: {t} rejected by {current}: {body}"
        );
    }
    let resp = c.get(format!("{}/objects/race/obj", g.url)).go().await;
    assert_eq!(resp.headers()["leasefence-token"], WRITERS.to_string().as_str());
    let etag = resp.headers()["etag"].to_str().expect("etag").to_string();
    let body = resp.bytes().await.expect("body");
    assert_eq!(body.as_ref(), content(WRITERS, 4096 + WRITERS as usize).as_slice());
    assert_eq!(etag, format!("\"{}\"", hex_sha256(&body)));
    let fence: Value = c
        .get(format!("{}/fences/race/obj", g.url))
        .go()
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(fence["token"], WRITERS);
    assert_eq!(files_in(&g.dir.path().join("blobs")), 1, "replaced blobs are removed");
    assert_eq!(files_in(&g.dir.path().join("tmp")), 0);
}

#[tokio::test]
async fn a_restart_sweeps_temp_files_and_unreferenced_blobs() {
    let g = start(1 << 20).await;
    let c = reqwest::Client::new();
    let resp = put(&c, &g, "kept", "kept", 9).body("kept bytes").go().await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let Running { dir, stop, .. } = g;
    drop(stop);
    drop(c);
    std::fs::write(dir.path().join("tmp").join("0123456789abcdef0123456789abcdef"), b"half").expect("tmp");
    std::fs::write(
        dir.path().join("blobs").join("00000000000000000000000000000001"),
        b"orphan",
    )
    .expect("blob");
    let (g, swept) = start_in(dir, 1 << 20).await;
    assert_eq!(swept, (1, 1));
    assert_eq!(files_in(&g.dir.path().join("tmp")), 0);
    assert_eq!(files_in(&g.dir.path().join("blobs")), 1);
    let resp = reqwest::get(format!("{}/objects/kept", g.url)).await.expect("get");
    assert_eq!(resp.headers()["leasefence-token"], "9");
    assert_eq!(resp.bytes().await.expect("body").as_ref(), b"kept bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_never_see_a_torn_object_while_it_is_replaced() {
    const VERSIONS: u64 = 40;
    const READERS: usize = 4;
    let g = Arc::new(start(16 << 20).await);
    let c = reqwest::Client::new();
    let size = |t: u64| 256 * 1024 + (t as usize % 5) * 100_000;
    let first = put(&c, &g, "live", "live", 1).body(content(1, size(1))).go().await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let writer = {
        let (c, g) = (c.clone(), Arc::clone(&g));
        tokio::spawn(async move {
            for t in 2..=VERSIONS {
                let resp = put(&c, &g, "live", "live", t).body(content(t, size(t))).go().await;
                assert_eq!(resp.status(), StatusCode::OK, "version {t}");
            }
        })
    };
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (c, g) = (c.clone(), Arc::clone(&g));
            tokio::spawn(async move {
                let mut seen = BTreeSet::new();
                while seen.last() != Some(&VERSIONS) {
                    let resp = c.get(format!("{}/objects/live", g.url)).go().await;
                    let token: u64 = resp.headers()["leasefence-token"]
                        .to_str()
                        .expect("ascii")
                        .parse()
                        .expect("token");
                    let body = resp.bytes().await.expect("body");
                    assert!(
                        body.as_ref() == content(token, size(token)).as_slice(),
                        "torn read of version {token}"
                    );
                    seen.insert(token);
                }
                seen.len()
            })
        })
        .collect();
    writer.await.expect("writer");
    for r in readers {
        assert!(r.await.expect("reader") >= 1);
    }
    assert_eq!(files_in(&g.dir.path().join("blobs")), 1);
}
