//! The paused worker, with real processes: `leasefence run` holds a resource
//! while its child writes through the SQLite arbiter; both process groups
//! (`run`'s and the child's) are SIGSTOPped past the TTL; a second `run`
//! acquires and writes; then the first is SIGCONTed. Its child must be gone
//! within 1 s of resuming, and the write it attempts on resuming (if it gets
//! that far) must be rejected as stale. Judged by the arbiter's history table.
//! In every other trial the child is resumed first and its write awaited
//! before `run` resumes, so the arbiter's rejection is exercised too.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, Coordinator, cli};

const TRIALS: u32 = 20;
const TTL: &str = "400ms";
/// The child: write once, publish its pid, wait for the go file (created
/// while it is stopped), write again with the same — by then stale — token,
/// then keep running: only `run` stopping its group ends it in time.
const CHILD: &str = r#"
"$LF" arbiter put "$DB" "$KEY" before --mode monotonic > "$OUT.before" 2>&1 || exit 9
echo $$ > "$PIDFILE.tmp" && mv "$PIDFILE.tmp" "$PIDFILE"
while [ ! -e "$GO" ]; do sleep 0.005; done
"$LF" arbiter put "$DB" "$KEY" after --mode monotonic > "$OUT.after" 2>&1
sleep 30
"#;

/// What became of the paused child's write on resuming.
#[derive(Debug, PartialEq, Eq)]
enum Resumed {
    KilledBeforeWriting,
    Rejected,
    Accepted,
}

fn signal_group(pgid: i32, sig: libc::c_int) {
    // SAFETY: signals a process group this test started (pgid > 1).
    assert!(
        pgid > 1 && unsafe { libc::killpg(pgid, sig) } == 0,
        "killpg({pgid}, {sig})"
    );
}

/// True when no process of the group is left running. Exited orphans
/// (zombies waiting for init to reap them) do not count.
fn group_gone(pgid: i32) -> bool {
    let entries = std::fs::read_dir("/proc").expect("/proc");
    !entries.flatten().any(|e| {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(") ")
            .map_or(vec![], |(_, r)| r.split_whitespace().collect());
        fields.len() > 2 && fields[0] != "Z" && fields[2] == pgid.to_string()
    })
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

fn wait_for(path: &Path, limit: Duration) -> String {
    let start = Instant::now();
    while start.elapsed() < limit {
        match std::fs::read_to_string(path) {
            Ok(s) if !s.is_empty() => return s,
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("{} did not appear within {limit:?}", path.display());
}

struct Trial {
    dir: PathBuf,
    db: String,
    url: String,
    resource: String,
    key: String,
}

impl Trial {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}-{}", self.key))
    }

    /// Where the child's second (stale) write reports: `$OUT.after`.
    fn out_after(&self) -> PathBuf {
        self.dir.join(format!("out-{}.after", self.key))
    }

    fn start_first(&self) -> Child {
        Command::new(BIN)
            .args([
                "run",
                &self.resource,
                "--ttl",
                TTL,
                // Must fit in ttl − margin (350 ms); SIGTERM ends this child.
                "--grace",
                "100ms",
                "--server",
                &self.url,
            ])
            .args(["--", "sh", "-c", CHILD])
            .env("LF", BIN)
            .env("DB", &self.db)
            .env("KEY", &self.key)
            .env("OUT", self.path("out"))
            .env("PIDFILE", self.path("pid"))
            .env("GO", self.path("go"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn the first run")
    }

    /// One pause trial; returns what happened to the resumed child's write
    /// and how long after SIGCONT of `run` its child's group was gone.
    /// With `head_start`, the child is resumed first and its stale write is
    /// awaited before `run` is resumed: the arbiter alone must stop it.
    fn run(&self, head_start: bool) -> (Resumed, Duration) {
        let mut first = self.start_first();
        let run_pgid = i32::try_from(first.id()).expect("pid");
        let pidfile = wait_for(&self.path("pid"), Duration::from_secs(10));
        let child_pgid: i32 = pidfile.trim().parse().expect("child pid");
        signal_group(run_pgid, libc::SIGSTOP);
        signal_group(child_pgid, libc::SIGSTOP);
        let stopped_at = Instant::now();
        std::fs::write(self.path("go"), b"").expect("go file");
        let (code, out, err) = cli(&[
            "run",
            &self.resource,
            "--ttl",
            TTL,
            "--wait",
            "10s",
            "--server",
            &self.url,
            "--",
            BIN,
            "arbiter",
            "put",
            &self.db,
            &self.key,
            "second",
            "--mode",
            "monotonic",
        ]);
        assert_eq!(code, 0, "second run: {out} {err}");
        assert!(out.starts_with("accepted"), "{out}");
        // The coordinator let the second run in once the first lease expired,
        // up to a renewal interval before stopped_at + TTL; keep the pause
        // past the full TTL anyway.
        let pause = Duration::from_millis(400 + 100);
        std::thread::sleep(pause.saturating_sub(stopped_at.elapsed()));
        // The child first, to give its stale write a head start on `run`.
        signal_group(child_pgid, libc::SIGCONT);
        if head_start {
            wait_for(&self.out_after(), Duration::from_secs(10));
        }
        signal_group(run_pgid, libc::SIGCONT);
        let resumed_at = Instant::now();
        while !group_gone(child_pgid) && resumed_at.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(2));
        }
        let took = resumed_at.elapsed();
        let status = wait_exit(&mut first, Duration::from_secs(5)).expect("the first run exits");
        assert_eq!(status.code(), Some(4), "the first run reports the loss");
        assert!(group_gone(child_pgid), "the child's group is gone when run exits");
        let after = std::fs::read_to_string(self.out_after()).unwrap_or_default();
        let resumed = if after.starts_with("accepted") {
            Resumed::Accepted
        } else if after.starts_with("rejected: stale fencing token") {
            Resumed::Rejected
        } else {
            Resumed::KilledBeforeWriting
        };
        (resumed, took)
    }

    /// The arbiter's record of accepted writes to this key: (value, token).
    fn history(&self, conn: &rusqlite::Connection) -> Vec<(String, i64)> {
        let mut stmt = conn
            .prepare("SELECT value, token FROM leasefence_kv_history WHERE key = ?1 ORDER BY seq")
            .expect("prepare");
        stmt.query_map([&self.key], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    }
}

#[test]
fn a_paused_run_is_stopped_on_resume_and_its_stale_write_never_lands() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(&dir.path().join("coord"), &[]);
    let db_path = dir.path().join("arbiter.db");
    let db = format!("sqlite://{}", db_path.display());
    let (code, _, err) = cli(&["arbiter", "install", &db]);
    assert_eq!(code, 0, "{err}");
    let (mut killed, mut rejected, mut accepted, mut slowest) = (0, 0, 0, Duration::ZERO);
    for i in 0..TRIALS {
        let trial = Trial {
            dir: dir.path().to_path_buf(),
            db: db.clone(),
            url: c.url.clone(),
            resource: format!("pause/{i}"),
            key: format!("k{i}"),
        };
        let head_start = i % 2 == 1;
        let (resumed, took) = trial.run(head_start);
        if head_start {
            assert_eq!(resumed, Resumed::Rejected, "trial {i}: the write was attempted");
        }
        assert!(
            took < Duration::from_secs(1),
            "trial {i}: child stopped {took:?} after resuming"
        );
        slowest = slowest.max(took);
        let conn = rusqlite::Connection::open(&db_path).expect("open the arbiter db");
        let history = trial.history(&conn);
        let expected = vec![("before".to_string(), 1), ("second".to_string(), 2)];
        match resumed {
            Resumed::Accepted => accepted += 1,
            Resumed::Rejected => rejected += 1,
            Resumed::KilledBeforeWriting => killed += 1,
        }
        assert_eq!(
            history, expected,
            "trial {i} ({resumed:?}): only token 1 then token 2 landed"
        );
        let resource = leasefence_core::ResourceId::new(&trial.resource).expect("valid resource");
        let fence = leasefence_arbiter::sqlite::last_token(&conn, &resource)
            .expect("last token")
            .map(|t| t.get());
        assert_eq!(fence, Some(2), "trial {i}: the fence records the newer token");
    }
    eprintln!(
        "{TRIALS} pause trials: {accepted} stale writes accepted, {rejected} rejected, {killed} killed before writing; slowest stop {} ms after SIGCONT",
        slowest.as_millis()
    );
    assert_eq!(accepted, 0);
}
