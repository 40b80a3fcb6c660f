//! High availability with real processes: three `serve` on one shared store
//! (PostgreSQL; etcd with the `etcd` feature), clients spread over all of
//! them, the active one SIGKILLed — or SIGSTOPped past its leader TTL and
//! resumed with grants in flight — again and again. From the recorded
//! history of what clients were answered: per resource, tokens are unique and
//! follow real time, no two answered leases overlap, and a standby takes over
//! within leader-ttl + 2 s. A stopped leader that wakes up answers errors.

mod common;

use std::time::Duration;

use common::ha::{Cluster, Load, check};
use common::scratch::Scratch;

const LEADER_TTL: Duration = Duration::from_millis(1000);
const CYCLES: usize = 20;

/// The shared stores to test on: (name, `--store` URL).
fn stores() -> Vec<(&'static str, String)> {
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let mut out = Vec::new();
    match std::env::var("LEASEFENCE_TEST_POSTGRES_URL") {
        Ok(url) => out.push(("postgres", url)),
        Err(_) if ci => panic!("LEASEFENCE_TEST_POSTGRES_URL is required under CI"),
        Err(_) => eprintln!("skipped PostgreSQL: LEASEFENCE_TEST_POSTGRES_URL is not set"),
    }
    if cfg!(feature = "etcd") {
        match std::env::var("LEASEFENCE_TEST_ETCD_URL") {
            Ok(url) => out.push(("etcd", url)),
            Err(_) if ci => panic!("LEASEFENCE_TEST_ETCD_URL is required under CI"),
            Err(_) => eprintln!("skipped etcd: LEASEFENCE_TEST_ETCD_URL is not set"),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_active_coordinator_loses_no_grant_and_reuses_no_token() {
    for (backend, url) in stores() {
        let scratch = Scratch::new(&url, "kill");
        let mut cluster = Cluster::start(scratch.store(), scratch.prefix(), 3, LEADER_TTL);
        let (mut active, _) = cluster.await_active(None, Duration::from_secs(10)).await;
        let load = Load::start(cluster.urls(), 6, 32);
        let mut slowest = Duration::ZERO;
        for _ in 0..CYCLES {
            tokio::time::sleep(Duration::from_millis(300)).await;
            cluster.kill(active);
            let (next, took) = cluster
                .await_active(Some(active), LEADER_TTL + Duration::from_secs(5))
                .await;
            assert!(
                took <= LEADER_TTL + Duration::from_secs(2),
                "{backend}: the takeover took {took:?}"
            );
            slowest = slowest.max(took);
            cluster.spawn(active);
            active = next;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let history = load.finish().await;
        eprintln!(
            "{backend}: {CYCLES} kills, {} grants answered, slowest takeover {slowest:?}",
            history.len()
        );
        assert!(
            history.len() > CYCLES * 5,
            "{backend}: too little load to judge: {}",
            history.len()
        );
        check(&history);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_leader_cannot_grant_after_a_takeover() {
    for (backend, url) in stores() {
        let scratch = Scratch::new(&url, "pause");
        let cluster = Cluster::start(scratch.store(), scratch.prefix(), 2, LEADER_TTL);
        let (mut active, _) = cluster.await_active(None, Duration::from_secs(10)).await;
        let load = Load::start(cluster.urls(), 6, 32);
        for cycle in 0..CYCLES {
            tokio::time::sleep(Duration::from_millis(200)).await;
            cluster.signal(active, libc::SIGSTOP);
            let (next, took) = cluster
                .await_active(Some(active), LEADER_TTL + Duration::from_secs(5))
                .await;
            assert!(
                took <= LEADER_TTL + Duration::from_secs(2),
                "{backend}: the takeover took {took:?}"
            );
            // The new leader grants. On a loaded machine its first renewal
            // may miss the confirmation deadline: then it rightly answers
            // `unavailable` until the engine confirms it again.
            let fresh = format!("fresh/{cycle}");
            let asked = std::time::Instant::now();
            let (code, body) = loop {
                let (code, body) = common::ha::acquire(&cluster.url(next), &fresh).await;
                if code != 503 || body["error"] != "unavailable" || asked.elapsed() > LEADER_TTL * 3 {
                    break (code, body);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            assert_eq!(code, 200, "{backend}: the new leader grants: {body}");
            // Wake the old leader with its in-flight requests; it must step down.
            cluster.signal(active, libc::SIGCONT);
            let start = std::time::Instant::now();
            while cluster.is_active(active).await {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "{backend}: the woken leader did not step down"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            active = next;
        }
        let history = load.finish().await;
        eprintln!("{backend}: {CYCLES} pauses, {} grants answered", history.len());
        check(&history);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_keeps_its_child_across_a_takeover_inside_its_deadline() {
    for (backend, url) in stores() {
        let scratch = Scratch::new(&url, "run");
        let mut cluster = Cluster::start(scratch.store(), scratch.prefix(), 2, LEADER_TTL);
        let (active, _) = cluster.await_active(None, Duration::from_secs(10)).await;
        let servers = cluster.urls().join(",");
        let run = std::process::Command::new(common::BIN)
            .args(["run", "ha/run", "--ttl", "10s", "--server", &servers, "--"])
            .args(["sh", "-c", "sleep 6; echo \"done $LEASEFENCE_TOKEN\""])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn run");
        tokio::time::sleep(Duration::from_secs(1)).await;
        cluster.kill(active);
        cluster
            .await_active(Some(active), LEADER_TTL + Duration::from_secs(5))
            .await;
        let out = tokio::task::spawn_blocking(move || run.wait_with_output())
            .await
            .expect("join")
            .expect("run");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{backend}: run lost its lease across the takeover: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout.trim(),
            "done 1",
            "{backend}: the child ran to its end under token 1"
        );
    }
}

/// What a test wrote to a shared store goes with the test: its schema (or key
/// prefix) is removed when its scratch is dropped, after its coordinators.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tests_place_in_the_store_is_removed_when_the_test_ends() {
    for (backend, url) in stores() {
        let scratch = Scratch::new(&url, "scratch");
        let place = scratch.place();
        let cluster = Cluster::start(scratch.store(), scratch.prefix(), 1, LEADER_TTL);
        let (active, _) = cluster.await_active(None, Duration::from_secs(10)).await;
        let (code, body) = common::ha::acquire(&cluster.url(active), "scratch/a").await;
        assert_eq!(code, 200, "{backend}: {body}");
        assert_eq!(
            place.exists(),
            Ok(true),
            "{backend}: the coordinator wrote under its prefix"
        );
        drop(cluster);
        drop(scratch);
        assert_eq!(place.exists(), Ok(false), "{backend}: the test's place is gone");
    }
}
