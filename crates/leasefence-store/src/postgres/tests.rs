//! A leader paused in the middle of a batch, between its epoch check and its
//! commit, or before a batch it computed from what it knew, against the real
//! PostgreSQL of `LEASEFENCE_TEST_POSTGRES_URL` (skipped when unset, failing
//! under `CI=true`). Here, not in `tests/`, because only the crate can pause
//! a writer there and count how its batches were sent. And a commit whose
//! answer is lost, which the store must report as of unknown outcome, and
//! the batches written from what the writer knows.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::conn::BATCH_IDLE_MAX;
use super::{PostgresConfig, PostgresShared, PostgresWriter};
use crate::conformance::{grant, released as release};
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

/// The first byte of the lease id holding `r` (the suite's `grant` repeats it).
fn holder(w: &mut PostgresWriter, r: &str) -> Option<u8> {
    let all = w.load().expect("load");
    let lease = all.into_iter().find(|x| x.resource.as_str() == r)?.lease?;
    lease.lease_id.as_bytes().first().copied()
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

/// Two coordinators of one schema; the first leads (with a short TTL, so
/// that the second can take over) and has a writer.
fn leader_and_standby(
    schema: &TestSchema,
    call_timeout: Duration,
) -> (PostgresShared, PostgresShared, Epoch, PostgresWriter) {
    let (a, b) = (schema.open(call_timeout), schema.open(call_timeout));
    let old = a
        .campaign("http://a.example:7070", TTL)
        .expect("campaign")
        .expect("wins");
    let w = a.writer(old).expect("writer");
    (a, b, old, w)
}

/// Pauses `w`'s next batch until woken (at most 12 s): when it paused, and
/// the waker.
fn pause_until_woken(w: &mut PostgresWriter) -> (mpsc::Receiver<Instant>, mpsc::Sender<()>) {
    let (paused_tx, paused) = mpsc::channel();
    let (wake_tx, wake) = mpsc::channel::<()>();
    let wake = std::sync::Mutex::new(wake);
    w.pause = Some(Arc::new(move || {
        let _ = paused_tx.send(Instant::now());
        let _ = wake.lock().map(|w| w.recv_timeout(Duration::from_secs(12)));
    }));
    (paused, wake_tx)
}

/// The old leader holds the shard row's lock from its epoch check to its
/// commit, so a campaign waits for the batch, and the new leader's load has it.
#[test]
fn a_campaign_waits_for_a_batch_in_flight_and_its_load_sees_it() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url, "inflight");
    let (_a, b, _, mut w) = leader_and_standby(&schema, Duration::from_secs(5));
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
    let (_a, b, old, mut w) = leader_and_standby(&schema, call_timeout);
    // Another resource: the paused batch's record is not known, so the batch
    // reads it first and holds the lock over the pause.
    w.apply(&[grant("p/before", 1, 1)]).expect("the leader writes");
    let (locked, wake_tx) = pause_until_woken(&mut w);
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
    assert_eq!(w.sent, (2, 0), "both batches read first");
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
/// the store reports its outcome as unknown, whether the batch read its
/// record first or was written from what the writer knew.
#[test]
fn a_commit_whose_answer_is_lost_is_of_unknown_outcome() {
    let Some(url) = url() else { return };
    for known in [false, true] {
        let proxy = Arc::new(crate::test_proxy::Proxy::start(crate::test_pg_route::upstream(&url)));
        let through = crate::test_pg_route::through(&url, proxy.addr());
        let schema = TestSchema::new(&url, "lost");
        let a = schema.open_at(&through, Duration::from_millis(800));
        let epoch = a
            .campaign("http://a.example:7070", Duration::from_secs(60))
            .expect("campaign")
            .expect("wins");
        let mut w = a.writer(epoch).expect("writer");
        let first = if known { "p/lost" } else { "p/other" };
        w.apply(&[grant(first, 1, 1)]).expect("writes through the proxy");
        let held_back = Arc::clone(&proxy);
        // Read first: past the epoch check, so the upsert and the COMMIT still
        // reach the server. From what is known: before the batch is sent.
        w.pause = Some(Arc::new(move || held_back.hold_replies()));
        let lost = w.apply(&[grant("p/lost", 2, 1)]);
        assert!(
            matches!(lost, Err(StoreError::Indeterminate(_))),
            "a commit whose answer was lost (known: {known}): {lost:?}"
        );
        assert_eq!(w.sent, if known { (1, 1) } else { (2, 0) }, "known: {known}");
        proxy.restore();
        let mut direct = schema.open(Duration::from_secs(5)).writer(epoch).expect("writer");
        assert_eq!(
            held(&mut direct, "p/lost"),
            Some(2),
            "the batch committed although its answer was lost (known: {known})"
        );
    }
}

/// A batch on records this writer read or wrote last is computed from what
/// it knows and sent in one round trip, without reading them first.
#[test]
fn a_batch_on_records_the_writer_wrote_last_is_not_read_first() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url, "known");
    let a = schema.open(Duration::from_secs(5));
    let epoch = a
        .campaign("http://a.example:7070", TTL * 100)
        .expect("campaign")
        .expect("wins");
    let mut w = a.writer(epoch).expect("writer");
    w.apply(&[grant("k/1", 1, 1), grant("k/2", 1, 2)])
        .expect("first grants");
    assert_eq!(w.sent, (1, 0), "records not known yet are read first");
    w.apply(&[release("k/1", 1), release("k/2", 1)]).expect("releases");
    w.apply(&[grant("k/1", 2, 3)]).expect("the next grant");
    // A stale release changes nothing, but is checked all the same.
    w.apply(&[release("k/2", 1)]).expect("a stale release");
    assert_eq!(
        w.sent,
        (1, 3),
        "the batches after the first were written from what was known"
    );
    let mut fresh = a.writer(epoch).expect("writer");
    assert_eq!(held(&mut fresh, "k/1"), Some(2));
    assert_eq!(holder(&mut fresh, "k/1"), Some(3), "k/1 is held by its second grant");
    assert_eq!(holder(&mut fresh, "k/2"), None, "k/2 was released");
}

/// Another writer of the same epoch changed a record this writer knows: the
/// write from what it knew is refused whole, and the batch is read again and
/// recomputed, here into the token regression it really is.
#[test]
fn a_record_changed_by_another_writer_is_read_again_before_it_is_written() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url, "changed");
    let a = schema.open(Duration::from_secs(5));
    let epoch = a
        .campaign("http://a.example:7070", TTL * 100)
        .expect("campaign")
        .expect("wins");
    let (mut w, mut other) = (a.writer(epoch).expect("writer"), a.writer(epoch).expect("writer"));
    w.apply(&[grant("c/1", 1, 1), grant("c/2", 1, 1)]).expect("w grants");
    other
        .apply(&[grant("c/1", 5, 2)])
        .expect("the other writer grants c/1 later");
    // From what w knows (token 1), token 3 would be next; c/1 is at 5.
    let stale = w.apply(&[grant("c/1", 3, 3), grant("c/2", 2, 3)]);
    assert_eq!(
        stale,
        Err(StoreError::TokenRegression {
            resource: "c/1".into(),
            stored: 5,
            attempted: 3
        })
    );
    assert_eq!(w.sent, (2, 1), "sent from what was known, refused, then read");
    let mut fresh = a.writer(epoch).expect("writer");
    assert_eq!(held(&mut fresh, "c/1"), Some(5), "the stale grant did not land");
    assert_eq!(held(&mut fresh, "c/2"), Some(1), "nor any record of its batch");
    // What w read replaced what it knew: its next batch is right.
    w.apply(&[grant("c/1", 6, 4)]).expect("a grant above the stored token");
    assert_eq!(held(&mut fresh, "c/1"), Some(6));
}

/// A leader paused with a batch computed from what it knows, deposed while
/// it sleeps: when it wakes and sends the batch, the fence refuses it and
/// nothing of it lands. Nor did the pause hold up the takeover: nothing is
/// locked before the batch is sent.
#[test]
fn a_leader_paused_before_a_batch_it_knows_is_refused_and_writes_nothing() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url, "knownpause");
    let (_a, b, old, mut w) = leader_and_standby(&schema, Duration::from_secs(5));
    w.apply(&[grant("p/known", 1, 1)]).expect("the leader writes");
    let (paused, wake_tx) = pause_until_woken(&mut w);
    std::thread::scope(|scope| {
        let writing = scope.spawn(|| w.apply(&[grant("p/known", 2, 1)]));
        paused.recv().expect("the batch reached its pause");
        let (new, _) = take_over(&b);
        let mut nw = b.writer(new).expect("writer");
        // Not p/known: its record stays as the old leader knows it, so only
        // the epoch can refuse the batch.
        nw.apply(&[grant("p/other", 1, 2)]).expect("the new leader writes");
        let _ = wake_tx.send(());
        let woke = writing.join().expect("writer");
        assert_eq!(
            woke,
            Err(StoreError::Deposed {
                epoch: old,
                current: new
            })
        );
        assert_eq!(held(&mut nw, "p/known"), Some(1), "nothing of the paused batch landed");
    });
    assert_eq!(w.sent, (1, 1), "the paused batch was sent from what was known");
}

/// Rows and index entries of the records table that PostgreSQL read or
/// fetched so far in the client's current transaction.
async fn rows_touched(c: &tokio_postgres::Client, records: &str) -> i64 {
    let sql = format!(
        "SELECT pg_stat_get_xact_tuples_returned(t) + pg_stat_get_xact_tuples_fetched(t) \
           + (SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(indexrelid) \
                                + pg_stat_get_xact_tuples_fetched(indexrelid)), 0)::bigint \
              FROM pg_index WHERE indrelid = t) \
         FROM (SELECT '{records}'::regclass::oid AS t) AS x"
    );
    c.query_one(&sql, &[]).await.expect("stats").get(0)
}

/// A batch's statements look up its own records by the primary key, whatever
/// plan PostgreSQL cached for them: here the generic plans it makes while the
/// table holds a few records, as on a coordinator's connection to a fresh schema until
/// the table is analyzed. Such a plan of a lookup by `= ANY($2)` or by a join
/// read every record of the shard, so each batch cost as much as the table.
#[test]
fn a_batch_reads_only_its_records_whatever_plan_is_cached() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url, "plans");
    let a = schema.open(Duration::from_secs(5));
    let epoch = a
        .campaign("http://a.example:7070", Duration::from_secs(60))
        .expect("campaign")
        .expect("wins");
    let epoch = i64::try_from(epoch).expect("epoch fits");
    let s = super::schema::Schema::new(&schema.name).expect("schema name");
    let sql = s.statements();
    let records = s.qualify("leasefence_records");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (c, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        c.batch_execute("SET plan_cache_mode = force_generic_plan")
            .await
            .expect("set");
        let read = c.prepare(&sql.read).await.expect("prepare read");
        let known = c.prepare(&sql.write_known).await.expect("prepare write_known");
        let shard: i64 = 0;
        let none: Vec<String> = Vec::new();
        let no_bytes: Vec<Vec<u8>> = Vec::new();
        let names = vec!["r/1".to_string(), "r/2".to_string(), "r/absent".to_string()];
        // The two records as they are, and one that is absent expected to be
        // there: the write's check looks at every record, and refuses.
        let stale: Vec<Option<Vec<u8>>> = vec![Some(vec![0]), Some(vec![0]), Some(vec![9])];
        // While the table holds a first few records: the plans PostgreSQL keeps.
        let first = format!(
            "INSERT INTO {records} (shard, resource, epoch, record) \
             SELECT 0, 'first/' || g, $1, '\\x00' FROM generate_series(1, 20) g"
        );
        c.execute(&first, &[&epoch]).await.expect("first records");
        c.query(&read, &[&shard, &names]).await.expect("read");
        c.query(&known, &[&shard, &epoch, &none, &no_bytes, &names, &stale])
            .await
            .expect("write_known");
        let fill = format!(
            "INSERT INTO {records} (shard, resource, epoch, record) \
             SELECT 0, 'r/' || g, $1, '\\x00' FROM generate_series(1, 2000) g"
        );
        c.execute(&fill, &[&epoch]).await.expect("fill");

        c.batch_execute("BEGIN").await.expect("begin");
        let rows = c.query(&read, &[&shard, &names]).await.expect("read");
        let found = rows.iter().filter(|r| r.get::<_, Option<Vec<u8>>>(1).is_some()).count();
        assert_eq!(found, 2, "the read finds the batch's two records");
        let by_read = rows_touched(&c, &records).await;
        let ok: bool = c
            .query_one(&known, &[&shard, &epoch, &none, &no_bytes, &names, &stale])
            .await
            .expect("write_known")
            .get(0);
        assert!(!ok, "the stale batch is refused");
        let by_write = rows_touched(&c, &records).await - by_read;
        c.batch_execute("COMMIT").await.expect("commit");
        eprintln!("rows touched: {by_read} by the read, {by_write} by the write's check");
        assert!(
            by_read <= 6,
            "the read touched {by_read} rows of 2,000 for a batch of three"
        );
        assert!(
            by_write <= 6,
            "the write's check touched {by_write} rows of 2,000 for a batch of three"
        );
    });
}
