//! `--server URL1,URL2,…` and `$LEASEFENCE_SERVER` with several
//! coordinators: invalid entries refused (exit 2), a dead coordinator
//! skipped and a standby's hint followed, and `run` keeping its child while
//! its keep-alive moves to the coordinator a hint names. A real coordinator
//! in this process beside the client tests' standby stub and proxy.

mod common;
#[path = "../../leasefence-client/tests/support/mod.rs"]
mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{BIN, cli};
use leasefence_client::Client;
use leasefence_core::ResourceId;
use support::{Role, coordinator, dead_url, proxy, stub};
use tokio::time::{Instant, sleep};

#[test]
fn an_invalid_server_entry_is_refused_with_exit_2() {
    for list in [
        "http://127.0.0.1:7740,,http://127.0.0.1:7741",
        "http://127.0.0.1:7740,",
        "ftp://127.0.0.1:7740",
        "127.0.0.1:7740",
    ] {
        let (code, _, err) = cli(&["status", "jobs/1", "--server", list]);
        assert_eq!(code, 2, "--server {list:?}: {err}");
        assert!(err.contains("--server"), "names the flag: {err}");
        assert!(err.contains("http://"), "says what is allowed: {err}");
    }
    let out = Command::new(BIN)
        .args(["status", "jobs/1"])
        .env("LEASEFENCE_SERVER", "http://127.0.0.1:7740,tcp://127.0.0.1:7741")
        .output()
        .expect("run leasefence");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("tcp"), "names the bad entry: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_coordinator_that_is_down_is_skipped_and_a_standby_followed() {
    let leader = coordinator().await;
    let standby = stub(Role::Standby {
        leader: Some(leader.url.clone()),
    })
    .await;
    let list = format!("{},{}", dead_url().await, standby.url);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args(["acquire", "jobs/list", "--ttl", "10s"])
            .env("LEASEFENCE_SERVER", list)
            .output()
            .expect("run leasefence")
    })
    .await
    .expect("joined");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("acquired jobs/list token=1 "), "{stdout}");
    assert_eq!(standby.calls(), 1, "asked the standby once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_keeps_its_child_while_the_keep_alive_moves_to_the_coordinator_a_hint_names() {
    let leader = coordinator().await;
    let cut = proxy(leader.addr).await;
    let standby = stub(Role::Standby {
        leader: Some(leader.url.clone()),
    })
    .await;
    let list = format!("{},{}", cut.url, standby.url);
    let dir = tempfile::tempdir().expect("tempdir");
    let started = dir.path().join("started");
    let child = tokio::process::Command::new(BIN)
        .args(["run", "jobs/move", "--ttl", "2s", "--server", &list, "--"])
        .args([
            "sh",
            "-c",
            r#"touch "$STARTED"; sleep 5; echo "done $LEASEFENCE_TOKEN $LEASEFENCE_SERVER""#,
        ])
        .env("STARTED", &started)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn leasefence run");
    let r = ResourceId::new("jobs/move").expect("valid");
    let direct = Client::connect(&leader.url).await.expect("connect");
    // Cut only once run has its grant: the child starts after the answer
    // arrived (a grant seen in status may still be on its way back to run).
    let start = Instant::now();
    while !started.exists() {
        assert!(start.elapsed() < Duration::from_secs(10), "run never started its child");
        sleep(Duration::from_millis(20)).await;
    }
    cut.cut();
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("run ended")
        .expect("waited");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.trim(), format!("done 1 {list}"), "the child ran to its end");
    assert!(standby.calls() >= 1, "the keep-alive asked the standby");
    let after = direct.status(&r).await.expect("status");
    assert_eq!(after.held, None, "released at the end");
}
