//! A real full disk: `leasefence gateway` with its data directory on a tiny
//! tmpfs. A PUT that does not fit is a 507 that leaves no temp file and no
//! fence, the objects already stored are still served, and once a DELETE
//! frees space the same token writes. Needs root to mount (see `common::tmpfs`).

mod common;

use common::gateway::GatewayProc;
use common::tmpfs::Tmpfs;
use reqwest::StatusCode;
use serde_json::Value;

const MIB: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_that_does_not_fit_is_507_and_leaves_nothing() {
    let mount = tempfile::tempdir().expect("tempdir");
    let Some(_fs) = Tmpfs::mount_or_skip(mount.path(), "4m") else {
        return;
    };
    let data = mount.path().join("data");
    let g = GatewayProc::start(&data, &[]);
    let c = reqwest::Client::new();
    let put = |key: &str, token: u64, byte: u8| {
        c.put(format!("{}/objects/{key}", g.url))
            .header("leasefence-resource", key)
            .header("leasefence-token", token)
            .body(vec![byte; MIB])
            .send()
    };
    let (mut stored, mut refused) = (Vec::new(), None);
    for i in 0..8u8 {
        let key = format!("fill/{i}");
        let resp = put(&key, 1, i).await.expect("the gateway answers");
        match resp.status() {
            StatusCode::CREATED => stored.push(key),
            StatusCode::INSUFFICIENT_STORAGE => {
                refused = Some((key, resp.json::<Value>().await.expect("json")));
                break;
            }
            other => panic!("{key}: unexpected {other}: {}", resp.text().await.unwrap_or_default()),
        }
    }
    let (key, body) = refused.expect("4 MiB cannot hold 8 objects of 1 MiB");
    assert!(!stored.is_empty(), "some objects fit before the disk filled");
    assert_eq!(body["error"], "insufficient_storage", "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains("disk is full")),
        "{body}"
    );
    assert_eq!(
        std::fs::read_dir(data.join("tmp")).expect("tmp").count(),
        0,
        "the refused body's temp file is gone"
    );
    let fence = c.get(format!("{}/fences/{key}", g.url)).send().await.expect("fence");
    assert_eq!(
        fence.status(),
        StatusCode::NOT_FOUND,
        "the refused write recorded no token"
    );
    let first = c
        .get(format!("{}/objects/{}", g.url, stored[0]))
        .send()
        .await
        .expect("get");
    assert_eq!(first.bytes().await.expect("body").as_ref(), vec![0u8; MIB].as_slice());

    let freed = c
        .delete(format!("{}/objects/{}", g.url, stored[0]))
        .header("leasefence-resource", stored[0].as_str())
        .header("leasefence-token", 2)
        .send()
        .await
        .expect("delete");
    assert_eq!(freed.status(), StatusCode::OK);
    let retry = put(&key, 1, 9).await.expect("the gateway answers");
    assert_eq!(
        retry.status(),
        StatusCode::CREATED,
        "space freed: the same token writes"
    );
}
