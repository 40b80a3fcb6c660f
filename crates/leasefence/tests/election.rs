//! Leader election against the real coordinator: one leader among
//! campaigners, succession with a higher term on resign and on a killed
//! leader's expiry, an observer's ordered view (and its resync after a
//! coordinator restart), and `leasefence elect` with two processes.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{BIN, Coordinator, ms};
use leasefence_client::{Client, ClientError, LeaderChange, LeaderChanges, LeaseConfig};
use leasefence_core::{Holder, ResourceId, Token};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

fn res(name: &str) -> ResourceId {
    ResourceId::new(name).expect("valid name")
}

fn holder(name: &str) -> Holder {
    Holder::new(name).expect("valid holder")
}

fn term(n: u64) -> Token {
    Token::new(n).expect("non-zero")
}

fn config(name: &str) -> LeaseConfig {
    LeaseConfig::new(Duration::from_secs(2)).with_holder(holder(name))
}

fn leader(n: u64, name: &str) -> LeaderChange {
    LeaderChange::Leader {
        term: term(n),
        holder: holder(name),
    }
}

/// The next change, skipping transient errors (the observer reconnects).
async fn next_change(changes: &mut LeaderChanges) -> LeaderChange {
    loop {
        match timeout(Duration::from_secs(5), changes.next()).await {
            Ok(Some(Ok(change))) => return change,
            Ok(Some(Err(ClientError::Transport { .. } | ClientError::Server(_)))) => {}
            other => panic!("expected a leader change, got {other:?}"),
        }
    }
}

fn campaign(url: &str, name: &str, who: &str) -> JoinHandle<leasefence_client::Leader> {
    let (url, name, config) = (url.to_string(), res(name), config(who));
    tokio::spawn(async move {
        let client = Client::connect(&url).await.expect("connect");
        client.campaign(&name, config).await.expect("campaign")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_two_campaigners_leads_and_the_other_follows_with_a_higher_term_on_resign() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let mut a = campaign(&c.url, "elect/resign", "a");
    let mut b = campaign(&c.url, "elect/resign", "b");
    let (first, other) = tokio::select! {
        r = &mut a => (r, b),
        r = &mut b => (r, a),
    };
    let first = first.expect("joined");
    assert_eq!(first.term(), term(1));
    sleep(ms(500)).await;
    assert!(!other.is_finished(), "a second leader while the first still leads");
    let status = Client::connect(&c.url).await.expect("connect");
    let held = status.status(&res("elect/resign")).await.expect("status").held;
    assert_eq!(held.map(|(h, t, _)| (h, t)), Some((first.holder().clone(), term(1))));

    let first_holder = first.holder().clone();
    assert_eq!(first.resign().await.expect("resign"), term(1));
    let second = timeout(Duration::from_secs(5), other)
        .await
        .expect("the follower leads soon after the resignation")
        .expect("joined");
    assert_eq!(second.term(), term(2), "a higher term");
    assert_ne!(second.holder(), &first_holder);
    assert!(!second.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_term_1_holder_a_then_vacant_then_term_2_holder_b() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&c.url).await.expect("connect");
    let name = res("elect/observed");
    let mut changes = client.observe(&name);
    assert_eq!(
        next_change(&mut changes).await,
        LeaderChange::Vacant { last_term: None }
    );

    let a = client.campaign(&name, config("a")).await.expect("a leads");
    let b = campaign(&c.url, "elect/observed", "b");
    assert_eq!(next_change(&mut changes).await, leader(1, "a"));
    sleep(ms(200)).await; // b is queued behind a
    a.resign().await.expect("resign");
    let b = timeout(Duration::from_secs(5), b)
        .await
        .expect("b leads")
        .expect("joined");
    assert_eq!(b.term(), term(2));
    assert_eq!(
        next_change(&mut changes).await,
        LeaderChange::Vacant {
            last_term: Some(term(1))
        }
    );
    assert_eq!(next_change(&mut changes).await, leader(2, "b"));
    b.resign().await.expect("resign");
    assert_eq!(
        next_change(&mut changes).await,
        LeaderChange::Vacant {
            last_term: Some(term(2))
        }
    );
}

fn wait_for_line(path: &Path, limit: Duration) -> String {
    let start = std::time::Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s;
        }
        assert!(start.elapsed() < limit, "{} did not appear", path.display());
        std::thread::sleep(ms(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_leaders_process_is_killed_the_other_leads_once_the_lease_expires() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let pid_file = dir.path().join("pid");
    let script = format!(
        "echo $$ > {p}.tmp; mv {p}.tmp {p}; exec sleep 30",
        p = pid_file.display()
    );
    let mut elect = Command::new(BIN)
        .args([
            "elect",
            "elect/killed",
            "--ttl",
            "1s",
            "--holder",
            "a",
            "--server",
            &c.url,
        ])
        .args(["--", "sh", "-c", &script])
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn elect");
    let child_pid: i32 = wait_for_line(&pid_file, Duration::from_secs(10))
        .trim()
        .parse()
        .expect("pid");
    let follower = campaign(&c.url, "elect/killed", "b");
    sleep(ms(300)).await;
    assert!(!follower.is_finished(), "b must not lead while a renews");

    elect.kill().expect("SIGKILL elect");
    elect.wait().expect("reaped");
    // SAFETY: kill only sends a signal, to the child this test started.
    unsafe { libc::kill(child_pid, libc::SIGKILL) };
    let killed_at = Instant::now();
    let status = Client::connect(&c.url).await.expect("connect");
    let held = status.status(&res("elect/killed")).await.expect("status").held;
    assert_eq!(
        held.map(|(_, t, _)| t),
        Some(term(1)),
        "the dead leader's lease outlives it until expiry"
    );

    let b = timeout(Duration::from_secs(5), follower)
        .await
        .expect("b leads after the expiry")
        .expect("joined");
    assert_eq!(b.term(), term(2));
    assert_eq!(b.holder(), &holder("b"));
    assert!(killed_at.elapsed() < Duration::from_secs(2), "within about one TTL");
}

/// `leasefence serve` on a fixed address (so a restart keeps the URL).
fn serve_on(addr: &str, data_dir: &Path) -> Coordinator {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", addr, "--data-dir"])
        .arg(data_dir)
        .env("LEASEFENCE_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("listening line");
    assert!(line.starts_with("leasefence listening on "), "{line:?}");
    Coordinator {
        child,
        url: format!("http://{addr}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_yields_the_state_again_after_a_coordinator_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .to_string();
    let c = serve_on(&addr, dir.path());
    let client = Client::connect(&c.url).await.expect("connect");
    let name = res("elect/restart");
    let mut changes = client.observe(&name);
    assert_eq!(
        next_change(&mut changes).await,
        LeaderChange::Vacant { last_term: None }
    );
    let lease = client
        .acquire(&name, Duration::from_secs(30), Some(&holder("a")), Duration::ZERO)
        .await
        .expect("acquire");
    assert_eq!(next_change(&mut changes).await, leader(1, "a"));

    c.kill();
    let _c = serve_on(&addr, dir.path());
    // The restarted coordinator has no history to resume from: the observer
    // re-reads the state (the lease is honoured across the restart) and yields it again.
    assert_eq!(next_change(&mut changes).await, leader(1, "a"));
    client.release(&name, &lease.lease_id).await.expect("release");
    assert_eq!(
        next_change(&mut changes).await,
        LeaderChange::Vacant {
            last_term: Some(term(1))
        }
    );
}

#[test]
fn elect_runs_the_second_command_only_after_the_first_exits_with_a_higher_term() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let first_file = dir.path().join("first");
    let seen_file = dir.path().join("seen");
    let elect = |who: &str, script: &str| {
        Command::new(BIN)
            .args(["elect", "elect/cli", "--ttl", "2s", "--holder", who, "--server", &c.url])
            .args(["--", "sh", "-c", script])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn elect")
    };
    let f = first_file.display();
    let first = elect(
        "a",
        &format!("echo $LEASEFENCE_TOKEN > {f}.tmp; mv {f}.tmp {f}; sleep 1; echo done >> {f}"),
    );
    assert_eq!(wait_for_line(&first_file, Duration::from_secs(10)), "1\n");
    let mut second = elect(
        "b",
        &format!(
            "cat {f} > {s}.tmp; echo $LEASEFENCE_TOKEN >> {s}.tmp; mv {s}.tmp {s}",
            s = seen_file.display()
        ),
    );
    std::thread::sleep(ms(300));
    assert!(second.try_wait().expect("poll").is_none(), "b campaigns while a leads");
    assert!(!seen_file.exists(), "b's command must not start while a leads");

    let out = first.wait_with_output().expect("a exits");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let out = second.wait_with_output().expect("b exits");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let seen = std::fs::read_to_string(&seen_file).expect("b's command ran");
    assert_eq!(seen, "1\ndone\n2\n", "b started after a's command ended, with term 2");
}

#[test]
fn observe_prints_one_line_per_change_and_stops_after_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let mut observe = Command::new(BIN)
        .args(["observe", "elect/printed", "--count", "3", "--server", &c.url])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn observe");
    let mut lines = BufReader::new(observe.stdout.take().expect("piped")).lines();
    let mut next = || lines.next().expect("a line").expect("utf-8");
    assert_eq!(next(), "vacant elect/printed", "the current state first");
    let (code, _, err) = common::cli(&[
        "acquire",
        "elect/printed",
        "--ttl",
        "200ms",
        "--holder",
        "x",
        "--server",
        &c.url,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(next(), "leader elect/printed term=1 holder=x");
    assert_eq!(next(), "vacant elect/printed last_term=1", "the lease expired");
    let status = observe.wait().expect("observe exits after --count");
    assert_eq!(status.code(), Some(0));
}
