//! Crash tests: SIGKILL a child process (`leasefence-arbiter-crashchild`) in the
//! middle of its fenced-transaction loop, many times per durable backend, and
//! check after every kill that the fence and the business row agree (both
//! written or neither) and that no acknowledged commit was lost.
//!
//! Each round starts its child at token `round * ROUND_STRIDE + 1`, so tokens
//! keep rising across rounds even if a killed PostgreSQL session's COMMIT lands
//! after the kill. The seed of the kill delays is printed for reproduction.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{POSTGRES_URL, service_url, splitmix, unique_resource};
use leasefence_arbiter::embedded::{EmbeddedArbiter, FENCES};
use leasefence_arbiter::{ResourceId, postgres, sqlite};
use redb::{ReadableDatabase, TableDefinition};

/// Kills per backend.
const KILLS: u64 = 100;
/// Token distance between the starts of two rounds (far more than a child commits).
const ROUND_STRIDE: u64 = 1_000_000;
/// Upper bound of the random delay between the child's first ack and the kill.
const KILL_DELAY_MAX_US: u64 = 25_000;
/// How long a child may take to acknowledge its first commit.
const FIRST_ACK_TIMEOUT: Duration = Duration::from_secs(30);
const CHILD: &str = env!("CARGO_BIN_EXE_leasefence-arbiter-crashchild");

/// A backend as the parent sees it between kills.
trait Store {
    /// `BACKEND LOCATION RESOURCE TABLE` for the child.
    fn child_args(&self) -> Vec<String>;
    /// `(fence last_token, business row token)` read in one snapshot.
    fn observe(&mut self) -> (Option<u64>, Option<u64>);
}

/// Runs one child until its first ack plus a random delay, SIGKILLs it, and
/// returns every token it acknowledged.
fn run_and_kill(store: &dyn Store, start: u64, delay: Duration) -> Vec<u64> {
    let mut child: Child = Command::new(CHILD)
        .args(store.child_args())
        .arg(start.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn crash child");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = match rx.recv_timeout(FIRST_ACK_TIMEOUT) {
        Ok(line) => line,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            let mut err = String::new();
            if let Some(mut s) = child.stderr.take() {
                let _ = s.read_to_string(&mut err);
            }
            panic!("crash child never acknowledged a commit ({e}); stderr: {err}");
        }
    };
    std::thread::sleep(delay);
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reap the child");
    assert_eq!(
        status.signal(),
        Some(9),
        "the child must die by SIGKILL, not exit on its own: {status}"
    );
    reader.join().expect("reader thread");
    std::iter::once(first)
        .chain(rx.try_iter())
        .map(|l| l.trim().parse::<u64>().expect("child prints decimal tokens"))
        .collect()
}

fn crash_loop(name: &str, store: &mut dyn Store) {
    let seed = getrandom::u64().expect("os randomness");
    eprintln!("crash {name}: seed {seed}, {KILLS} kills");
    let mut rng = seed;
    let (mut prev, mut unacked_commits, mut acks) = (0u64, 0u64, 0usize);
    for round in 0..KILLS {
        let start = round * ROUND_STRIDE + 1;
        let delay = Duration::from_micros(splitmix(&mut rng) % (KILL_DELAY_MAX_US + 1));
        let acked = run_and_kill(store, start, delay);
        acks += acked.len();
        let (fence, row) = store.observe();
        assert_eq!(
            fence, row,
            "{name} round {round} (seed {seed}): fence and business row disagree"
        );
        let fence = fence.expect("at least one commit was acknowledged, so the fence exists");
        let max_acked = acked.iter().copied().max().unwrap_or(0);
        assert!(
            max_acked <= fence,
            "{name} round {round} (seed {seed}): acknowledged token {max_acked} lost, fence at {fence}"
        );
        assert!(
            fence >= prev && fence < start + ROUND_STRIDE,
            "{name} round {round}: fence {fence} outside {prev}..{}",
            start + ROUND_STRIDE
        );
        unacked_commits += u64::from(fence > max_acked);
        prev = fence;
    }
    eprintln!(
        "crash {name}: {KILLS} kills, {acks} acknowledged commits, {unacked_commits} kills landed between a commit and its ack"
    );
}

struct Postgres {
    /// `postgres` or `postgres-folded`: the child's BACKEND.
    backend: &'static str,
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    url: String,
    resource: ResourceId,
    table: String,
}

impl Store for Postgres {
    fn child_args(&self) -> Vec<String> {
        let r = self.resource.to_string();
        vec![self.backend.into(), self.url.clone(), r, self.table.clone()]
    }

    fn observe(&mut self) -> (Option<u64>, Option<u64>) {
        // One statement: one snapshot, even under READ COMMITTED.
        let q = format!(
            "SELECT (SELECT last_token FROM leasefence_fences WHERE resource = $1),
                    (SELECT token FROM {} WHERE key = $1)",
            self.table
        );
        let row = self
            .rt
            .block_on(self.client.query_one(&q, &[&self.resource.as_str()]))
            .expect("observe");
        let (f, b): (Option<i64>, Option<i64>) = (row.get(0), row.get(1));
        (f.map(|v| v as u64), b.map(|v| v as u64))
    }
}

#[test]
fn postgres_fence_and_row_survive_sigkill_together() {
    postgres_crash("postgres");
}

/// The same with the fence folded into the effect's statement
/// (`postgres::FencedStatement`).
#[test]
fn postgres_folded_fence_and_row_survive_sigkill_together() {
    postgres_crash("postgres-folded");
}

fn postgres_crash(backend: &'static str) {
    let Some(url) = service_url(POSTGRES_URL) else { return };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut client = rt.block_on(postgres::connect(&url)).expect("connect");
    rt.block_on(postgres::install(&mut client)).expect("install");
    let table = format!("leasefence_crash_{:016x}", getrandom::u64().expect("os randomness"));
    let ddl = format!("CREATE TABLE {table} (key text PRIMARY KEY, token bigint NOT NULL)");
    rt.block_on(client.batch_execute(&ddl)).expect("business table");
    let resource = unique_resource(&format!("crash-{backend}"));
    let mut store = Postgres {
        backend,
        rt,
        client,
        url,
        resource,
        table,
    };
    crash_loop(backend, &mut store);
    let cleanup = format!("DROP TABLE {}", store.table);
    store.rt.block_on(store.client.batch_execute(&cleanup)).expect("drop");
    store
        .rt
        .block_on(store.client.execute(
            "DELETE FROM leasefence_fences WHERE resource = $1",
            &[&store.resource.as_str()],
        ))
        .expect("forget fence");
}

struct Sqlite {
    path: std::path::PathBuf,
    resource: ResourceId,
}

impl Store for Sqlite {
    fn child_args(&self) -> Vec<String> {
        let p = self.path.display().to_string();
        vec!["sqlite".into(), p, self.resource.to_string(), "business".into()]
    }

    fn observe(&mut self) -> (Option<u64>, Option<u64>) {
        let conn = rusqlite::Connection::open(&self.path).expect("open after kill");
        conn.query_row(
            "SELECT (SELECT last_token FROM leasefence_fences WHERE resource = ?1),
                    (SELECT token FROM business WHERE key = ?1)",
            [self.resource.as_str()],
            |r| Ok((r.get::<_, Option<i64>>(0)?, r.get::<_, Option<i64>>(1)?)),
        )
        .map(|(f, b)| (f.map(|v| v as u64), b.map(|v| v as u64)))
        .expect("observe")
    }
}

#[test]
fn sqlite_fence_and_row_survive_sigkill_together() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("crash.db");
    let mut conn = rusqlite::Connection::open(&path).expect("open");
    sqlite::install(&mut conn).expect("install");
    conn.execute_batch("CREATE TABLE business (key TEXT PRIMARY KEY, token INTEGER NOT NULL) STRICT")
        .expect("business table");
    drop(conn);
    let resource = unique_resource("crash-sqlite");
    crash_loop("sqlite", &mut Sqlite { path, resource });
}

struct Embedded {
    path: std::path::PathBuf,
    resource: ResourceId,
}

const EMBEDDED_BUSINESS: &str = "business";

impl Store for Embedded {
    fn child_args(&self) -> Vec<String> {
        let p = self.path.display().to_string();
        vec![
            "embedded".into(),
            p,
            self.resource.to_string(),
            EMBEDDED_BUSINESS.into(),
        ]
    }

    fn observe(&mut self) -> (Option<u64>, Option<u64>) {
        // Opening after a kill runs redb's recovery; the arbiter is dropped
        // (and its file lock released) before the next child starts.
        let arbiter = EmbeddedArbiter::open(&self.path).expect("open after kill");
        let tx = arbiter.database().begin_read().expect("read tx");
        let r = self.resource.as_str();
        let fences = tx.open_table(FENCES).expect("fences");
        let fence = fences.get(r).expect("get fence").map(|v| v.value());
        let def: TableDefinition<&str, u64> = TableDefinition::new(EMBEDDED_BUSINESS);
        let row = match tx.open_table(def) {
            Ok(t) => t.get(r).expect("get row").map(|v| v.value()),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => panic!("business table: {e}"),
        };
        (fence, row)
    }
}

#[test]
fn embedded_fence_and_row_survive_sigkill_together() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("crash.redb");
    let resource = unique_resource("crash-embedded");
    crash_loop("embedded", &mut Embedded { path, resource });
}
