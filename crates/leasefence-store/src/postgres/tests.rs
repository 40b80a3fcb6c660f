//! A leader paused in the middle of a batch, between its epoch check and its
//! commit, against the real PostgreSQL of `LEASEFENCE_TEST_POSTGRES_URL`
//! (skipped when unset, failing under `CI=true`). Here, not in `tests/`,
//! because only the crate can pause a writer there. And a commit whose
//! answer is lost, which the store must report as of unknown outcome.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::conn::BATCH_IDLE_MAX;
use super::{PostgresConfig, PostgresShared, PostgresWriter};
use crate::conformance::grant;
use crate::shared::{Epoch, SharedStore};
use crate::{LeaseStore, StoreError};

const POSTGRES_URL: &str = "LEASEFENCE_TEST_POSTGRES_URL";
const TTL: Duration = Duration::from_millis(300);

fn url() -> Option<String> {
    match std::env::var(POSTGRES_URL) {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{POSTGRES_URL} is not set but CI=true: this test needs the real PostgreSQL");
            }
            eprintln!("skipped: {POSTGRES_URL} not set");
            None
        }
    }
}

/// A schema of this test's own, dropped with its tables at the end.
struct TestSchema {
    url: String,
    name: String,
}

impl TestSchema {
    fn new(url: &str, test: &str) -> TestSchema {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("lf_store_test_{}_{nanos}_{test}", std::process::id());
        TestSchema {
            url: url.to_string(),
            name,
        }
    }

    fn open(&self, call_timeout: Duration) -> PostgresShared {
        self.open_at(&self.url, call_timeout)
    }

    fn open_at(&self, url: &str, call_timeout: Duration) -> PostgresShared {
        let config = PostgresConfig::new(url)
            .and_then(|c| c.with_schema(&self.name))
            .and_then(|c| c.with_call_timeout(call_timeout))
            .expect("valid config");
        PostgresShared::open(config).expect("open")
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let Ok(rt) = rt else { return };
        rt.block_on(async {
            if let Ok((client, connection)) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls).await {
                tokio::spawn(connection);
                let drop = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name);
                let _ = client.batch_execute(&drop).await;
            }
        });
    }
}

fn held(w: &mut PostgresWriter, r: &str) -> Option<u64> {
    let all = w.load().expect("load");
    all.into_iter()
        .find(|x| x.resource.as_str() == r)
        .map(|x| x.last_token.get())
}

/// Campaigns until it wins; the epoch and when.
fn take_over(b: &PostgresShared) -> (Epoch, Instant) {
    let start = Instant::now();
    loop {
        if let Some(e) = b
            .campaign("http://b.example:7070", Duration::from_secs(60))
            .expect("campaign")
        {
            return (e, Instant::now());
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no takeover within 20s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The old leader holds the shard row's lock from its epoch check to its
/// commit, so a campaign waits for the batch, and the new leader's load has it.
#[test]
fn a_campaign_waits_for_a_batch_in_flight_and_its_load_sees_it() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url, "inflight");
    let (a, b) = (schema.open(Duration::from_secs(5)), schema.open(Duration::from_secs(5)));
    let old = a
        .campaign("http://a.example:7070", TTL)
        .expect("campaign")
        .expect("wins");
    let mut w = a.writer(old).expect("writer");
    let (locked_tx, locked) = mpsc::channel();
    let released = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&released);
    // Paused past the leadership's lapse, but inside the server's idle bound.
    let hold = TTL * 2;
    assert!(hold + Duration::from_millis(300) < BATCH_IDLE_MAX);
    w.pause = Some(Arc::new(move || {
        let _ = locked_tx.send(());
        std::thread::sleep(hold);
        flag.store(true, Ordering::SeqCst);
    }));
    std::thread::scope(|scope| {
        let writing = scope.spawn(|| w.apply(&[grant("p/inflight", 1, 1)]));
        locked.recv().expect("the batch reached its pause");
        let (new, _) = take_over(&b);
        assert!(
            released.load(Ordering::SeqCst),
            "the campaign won while a batch of the old epoch was between its check and its commit"
        );
        assert_eq!(
            writing.join().expect("writer"),
            Ok(()),
            "the batch committed before the takeover"
        );
        let mut nw = b.writer(new).expect("writer");
        assert_eq!(held(&mut nw, "p/inflight"), Some(1), "the new leader's load has it");
    });
}

/// A leader paused mid-batch, past the server's idle bound: the server ends
/// its session, a standby takes over without waiting for it to wake, and when
/// it does its commit fails and nothing of it lands.
#[test]
fn a_leader_paused_mid_batch_writes_nothing_and_does_not_hold_up_the_takeover() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url, "paused");
    // A call timeout far above the idle bound: the takeover must not wait for it.
    let call_timeout = Duration::from_secs(15);
    let (a, b) = (schema.open(call_timeout), schema.open(call_timeout));
    let old = a
        .campaign("http://a.example:7070", TTL)
        .expect("campaign")
        .expect("wins");
    let mut w = a.writer(old).expect("writer");
    w.apply(&[grant("p/paused", 1, 1)]).expect("the leader writes");
    let (locked_tx, locked) = mpsc::channel();
    let (wake_tx, wake) = mpsc::channel::<()>();
    let wake = std::sync::Mutex::new(wake);
    w.pause = Some(Arc::new(move || {
        let _ = locked_tx.send(Instant::now());
        let _ = wake.lock().map(|w| w.recv_timeout(Duration::from_secs(12)));
    }));
    std::thread::scope(|scope| {
        let writing = scope.spawn(|| w.apply(&[grant("p/paused", 2, 1)]));
        let paused_at = locked.recv().expect("the batch reached its pause");
        let (new, won_at) = take_over(&b);
        let waited = won_at - paused_at;
        assert!(
            waited < Duration::from_secs(6),
            "the takeover waited {waited:?} for a paused leader (idle bound {BATCH_IDLE_MAX:?})"
        );
        let mut nw = b.writer(new).expect("writer");
        nw.apply(&[grant("p/paused", 5, 1)]).expect("the new leader writes");
        let _ = wake_tx.send(());
        let woke = writing.join().expect("writer");
        // The session ended under it, so from where it stands its COMMIT
        // may or may not have landed; the new leader's load says it did not.
        assert!(
            matches!(woke, Err(StoreError::Indeterminate(_))),
            "the paused batch fails: {woke:?}"
        );
        assert_eq!(held(&mut nw, "p/paused"), Some(5), "nothing of the paused batch landed");
    });
    let next = w.apply(&[grant("p/paused", 6, 1)]);
    assert_eq!(
        next,
        Err(StoreError::Deposed {
            epoch: old,
            current: old + 1
        })
    );
}

/// A batch whose COMMIT reached PostgreSQL and took effect, but whose answer
/// never came back, is not "unavailable" (which says nothing was written):
/// the store reports its outcome as unknown.
#[test]
fn a_commit_whose_answer_is_lost_is_of_unknown_outcome() {
    let Some(url) = url() else { return };
    let proxy = Arc::new(crate::test_proxy::Proxy::start(crate::test_pg_route::upstream(&url)));
    let through = crate::test_pg_route::through(&url, proxy.addr());
    let schema = TestSchema::new(&url, "lost");
    let a = schema.open_at(&through, Duration::from_millis(800));
    let epoch = a
        .campaign("http://a.example:7070", Duration::from_secs(60))
        .expect("campaign")
        .expect("wins");
    let mut w = a.writer(epoch).expect("writer");
    w.apply(&[grant("p/lost", 1, 1)]).expect("writes through the proxy");
    let held_back = Arc::clone(&proxy);
    // Past the epoch check: the upsert and the COMMIT still reach the server.
    w.pause = Some(Arc::new(move || held_back.hold_replies()));
    let lost = w.apply(&[grant("p/lost", 2, 1)]);
    assert!(
        matches!(lost, Err(StoreError::Indeterminate(_))),
        "a commit whose answer was lost: {lost:?}"
    );
    proxy.restore();
    let mut direct = schema.open(Duration::from_secs(5)).writer(epoch).expect("writer");
    assert_eq!(
        held(&mut direct, "p/lost"),
        Some(2),
        "the batch committed although its answer was lost"
    );
}
