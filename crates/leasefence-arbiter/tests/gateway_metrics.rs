//! A gateway write whose fence goes stale while its body is still streaming
//! passed the early check, so the commit must refuse it; every refusal of the
//! gateway is counted under `backend="gateway"`. (Its own test binary: the
//! metrics recorder is process-wide.)

mod common;

use std::time::Duration;

use bytes::Bytes;
use leasefence_arbiter::gateway::{Gateway, GatewayConfig};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use reqwest::StatusCode;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_that_goes_stale_while_the_body_streams_is_refused_at_commit_and_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("the only recorder of this binary");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = GatewayConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path());
    let gateway = Gateway::bind(config).await.expect("bind");
    let url = format!("http://{}", gateway.local_addr().expect("addr"));
    tokio::spawn(gateway.run(std::future::pending()));
    let c = reqwest::Client::new();
    let put = |token: u64| {
        c.put(format!("{url}/objects/slow"))
            .header("leasefence-resource", "slow")
            .header("leasefence-token", token)
    };

    // Writer 6 starts first and passes the early check; its body is held back.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    let body = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let slow = tokio::spawn(put(6).body(reqwest::Body::wrap_stream(body)).send());
    tx.send(Ok(Bytes::from_static(b"by 6, first half ")))
        .await
        .expect("send");
    // Its temp file appears once the gateway admitted it early and started receiving.
    let tmp = dir.path().join("tmp");
    while std::fs::read_dir(&tmp).expect("tmp").count() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Writer 7 commits meanwhile.
    let seven = put(7).body("by 7").send().await.expect("put 7");
    assert_eq!(seven.status(), StatusCode::CREATED);
    tx.send(Ok(Bytes::from_static(b"second half"))).await.expect("send");
    drop(tx);
    let late = slow.await.expect("task").expect("put 6");
    assert_eq!(late.status(), StatusCode::CONFLICT, "the commit checks the fence again");
    let body: Value = late.json().await.expect("json");
    assert_eq!(
        (body["presented"].clone(), body["current"].clone()),
        (6.into(), 7.into())
    );
    let now = c.get(format!("{url}/objects/slow")).send().await.expect("get");
    assert_eq!(now.text().await.expect("body"), "by 7");
    assert_eq!(std::fs::read_dir(&tmp).expect("tmp").count(), 0);

    // And one refused before its body: the early check.
    let early = put(5).body("by 5").send().await.expect("put 5");
    assert_eq!(early.status(), StatusCode::CONFLICT);
    let labels = vec![("backend".to_string(), "gateway".to_string())];
    assert_eq!(
        common::rejection_counters(&snapshotter),
        vec![(labels, DebugValue::Counter(2))]
    );
}
