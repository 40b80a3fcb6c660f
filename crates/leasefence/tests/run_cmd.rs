//! `leasefence run` with real processes: the fence in the child's environment,
//! exit codes passed through (128+N for signals), busy → 3 without starting
//! the command, and loss (coordinator killed) → the child's group stopped, 4.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, Coordinator, cli};

fn run(url: &str, resource: &str, extra: &[&str], script: &str) -> (i32, String, String) {
    let mut args = vec!["run", resource, "--ttl", "1s", "--server", url];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    cli(&args)
}

/// True if `pid` exists and has not exited (a zombie has exited: only its
/// reaping by init is left).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')),
    }
}

fn wait_for_file(path: &Path, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s;
            }
        }
        assert!(start.elapsed() < limit, "{} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_child_sees_the_fence_and_its_exit_code_is_passed_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let script = r#"echo "$LEASEFENCE_RESOURCE $LEASEFENCE_TOKEN $LEASEFENCE_SERVER"; exit 7"#;
    let (code, out, err) = run(&c.url, "jobs/env", &[], script);
    assert_eq!(code, 7, "{err}");
    assert_eq!(out.trim(), format!("jobs/env 1 {}", c.url));
    let (code, out, _) = run(&c.url, "jobs/env", &[], r#"echo "$LEASEFENCE_TOKEN""#);
    assert_eq!((code, out.trim()), (0, "2"), "released after the first run: next token");
    let (code, _, _) = run(&c.url, "jobs/env", &[], "kill -9 $$");
    assert_eq!(code, 128 + 9, "killed by SIGKILL");
    let (code, out, _) = cli(&["status", "jobs/env", "--server", &c.url]);
    assert_eq!(code, 0);
    assert!(out.contains("not held last_token=3"), "released every time: {out}");
    let (code, _, err) = cli(&[
        "run",
        "jobs/env",
        "--ttl",
        "1s",
        "--server",
        &c.url,
        "--",
        "/nonexistent/cmd",
    ]);
    assert_eq!(code, 127, "{err}");
}

#[test]
fn busy_after_wait_exits_3_without_starting_the_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let (code, _, err) = cli(&["acquire", "jobs/busy", "--ttl", "30s", "--server", &c.url]);
    assert_eq!(code, 0, "{err}");
    let marker = dir.path().join("started");
    let script = format!("touch {}", marker.display());
    let (code, _, err) = run(&c.url, "jobs/busy", &["--wait", "200ms"], &script);
    assert_eq!(code, 3, "{err}");
    assert!(!marker.exists(), "the command must not start without the lease");
}

#[test]
fn on_loss_the_childs_group_is_stopped_and_run_exits_4() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let pids = dir.path().join("pids");
    // The child ignores SIGTERM and has a grandchild in its group: only
    // SIGKILL to the whole group after the grace period ends both.
    let script = format!(
        "trap '' TERM; sleep 60 & echo \"$$ $!\" > {p}.tmp; mv {p}.tmp {p}; while :; do sleep 0.05; done",
        p = pids.display()
    );
    let run = Command::new(BIN)
        .args([
            "run",
            "jobs/lost",
            "--ttl",
            "400ms",
            "--grace",
            "300ms",
            "--server",
            &c.url,
        ])
        .args(["--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn run");
    let line = wait_for_file(&pids, Duration::from_secs(10));
    let ids: Vec<i32> = line.split_whitespace().map(|s| s.parse().expect("pid")).collect();
    let killed_at = Instant::now();
    c.kill();
    let out = run.wait_with_output().expect("run exits");
    let took = killed_at.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("lost"), "{err}");
    assert!(
        took < Duration::from_millis(400 + 300 + 500),
        "ttl + grace + slack, took {took:?}"
    );
    for pid in ids {
        assert!(!alive(pid), "process {pid} of the child's group survived");
    }
}
