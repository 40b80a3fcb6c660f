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
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s;
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

#[test]
fn a_grace_or_margin_that_does_not_fit_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let marker = dir.path().join("started");
    let script = format!("touch {}", marker.display());
    // ttl 1s, default margin 100ms: the child must be dead 900ms after the
    // last renewal, so a grace of 900ms or more cannot fit.
    let (code, _, err) = run(&c.url, "jobs/fit", &["--grace", "900ms"], &script);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--grace 900ms") && err.contains("900ms") && err.contains("--ttl 1s"),
        "names the values and the limit: {err}"
    );
    let (code, _, err) = run(&c.url, "jobs/fit", &["--margin", "0s"], &script);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--margin 0s") && err.contains("at least 1 ms"),
        "says what is allowed: {err}"
    );
    assert!(!marker.exists(), "nothing was started");
    let (code, out, _) = cli(&["status", "jobs/fit", "--server", &c.url]);
    assert_eq!(code, 0);
    assert!(out.contains("last_token=none"), "nothing was acquired: {out}");
    let (code, _, err) = run(&c.url, "jobs/fit", &["--grace", "800ms", "--margin", "1ms"], &script);
    assert_eq!(code, 0, "what fits is accepted: {err}");
}

#[test]
fn the_child_is_dead_by_the_self_fencing_deadline_not_a_grace_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let (pids, termed) = (dir.path().join("pids"), dir.path().join("termed"));
    // The child survives SIGTERM (it only notes it): SIGKILL must end it.
    let script = format!(
        "trap 'echo > {t}' TERM; echo $$ > {p}.tmp; mv {p}.tmp {p}; while :; do sleep 0.05; done",
        p = pids.display(),
        t = termed.display()
    );
    // ttl 4s, default margin 400ms: the deadline is at most 3.6s after the
    // last renewal, which was sent before the coordinator was killed. With
    // SIGTERM only at the deadline, SIGKILL would come 3s after it.
    let run = Command::new(BIN)
        .args([
            "run",
            "jobs/deadline",
            "--ttl",
            "4s",
            "--grace",
            "3s",
            "--server",
            &c.url,
        ])
        .args(["--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn run");
    let pid: i32 = wait_for_file(&pids, Duration::from_secs(10))
        .trim()
        .parse()
        .expect("pid");
    std::thread::sleep(Duration::from_millis(500));
    let killed_at = Instant::now();
    c.kill();
    while alive(pid) && killed_at.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let dead_after = killed_at.elapsed();
    let out = run.wait_with_output().expect("run exits");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(termed.exists(), "SIGTERM came first");
    eprintln!(
        "the child died {} ms after the coordinator was killed",
        dead_after.as_millis()
    );
    assert!(
        dead_after < Duration::from_millis(3_600 + 900),
        "the child died {dead_after:?} after the last possible renewal; its deadline was at most 3.6s"
    );
}

#[test]
fn a_sigkilled_run_takes_its_child_along() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let pids = dir.path().join("pids");
    let script = format!("echo $$ > {p}.tmp; mv {p}.tmp {p}; exec sleep 60", p = pids.display());
    let mut run = Command::new(BIN)
        .args(["run", "jobs/orphan", "--ttl", "30s", "--server", &c.url])
        .args(["--", "sh", "-c", &script])
        .spawn()
        .expect("spawn run");
    let pid: i32 = wait_for_file(&pids, Duration::from_secs(10))
        .trim()
        .parse()
        .expect("pid");
    std::thread::sleep(Duration::from_millis(100));
    assert!(alive(pid));
    run.kill().expect("SIGKILL run");
    run.wait().expect("reap run");
    let start = Instant::now();
    while alive(pid) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let survived = alive(pid);
    if survived {
        // SAFETY: kill only sends a signal, to the orphan this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert!(!survived, "the child outlived its SIGKILLed run");
}
