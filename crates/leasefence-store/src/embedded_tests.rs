//! The embedded store's own cases: old files, the log across crashes, checkpoints.

use std::time::Duration;

use leasefence_core::{Holder, LeaseId, ReleaseCause, ResourceId, StoredLease, Token};

use crate::conformance::grant;

use std::fs::OpenOptions;

use super::*;

/// A store file as the build before lock-delays wrote it (record version 1).
fn write_version_1(path: &Path) {
    let db = Database::create(path).expect("create");
    let tx = db.begin_write().expect("begin");
    {
        let mut meta = tx.open_table(META).expect("meta");
        meta.insert("schema_version", 1).expect("insert");
        let mut table = tx.open_table(RESOURCES).expect("resources");
        let held: &[u8] = &[
            1, 0, 0, 0, 0, 0, 0, 0, 5, 1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0, 0, 0, 0, 0, 3, 232, 0,
            3, 111, 108, 100,
        ];
        table.insert("old/held", held).expect("insert");
        table
            .insert("old/free", &[1u8, 0, 0, 0, 0, 0, 0, 0, 9, 0][..])
            .expect("insert");
    }
    tx.commit().expect("commit");
}

#[test]
fn a_data_dir_from_before_lock_delays_opens_and_keeps_its_meaning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(EmbeddedStore::FILE_NAME);
    write_version_1(&path);
    let mut store = EmbeddedStore::open(&path).expect("opens");
    let mut all = store.load().expect("load");
    all.sort_by(|a, b| a.resource.cmp(&b.resource));
    assert_eq!(all.len(), 2);
    assert_eq!(
        (all[0].last_token, &all[0].lease, &all[0].lock_delay),
        (Token::new(9).expect("non-zero"), &None, &None)
    );
    assert_eq!(
        all[1].lease,
        Some(StoredLease {
            lease_id: LeaseId::from_bytes([3; 16]),
            holder: Holder::new("old").expect("valid"),
            ttl: Duration::from_millis(1000),
            lock_delay: Duration::ZERO,
        })
    );
    // Old records change like new ones.
    let resource = ResourceId::new("old/held").expect("valid");
    let expiry = Mutation::Release {
        resource,
        token: Token::new(5).expect("non-zero"),
        cause: ReleaseCause::Expired,
        lock_delay: Duration::ZERO,
    };
    store.apply(&[expiry]).expect("apply");
    let all = store.load().expect("load");
    assert!(all.iter().all(|r| r.lease.is_none()));
}

fn token_of(store: &mut EmbeddedStore, r: &str) -> Option<u64> {
    let all = store.load().expect("load");
    all.into_iter()
        .find(|x| x.resource.as_str() == r)
        .map(|x| x.last_token.get())
}

fn open_in(dir: &Path) -> EmbeddedStore {
    EmbeddedStore::open_dir(dir).expect("open")
}

fn log_file(dir: &Path) -> PathBuf {
    EmbeddedStore::log_path(&dir.join(EmbeddedStore::FILE_NAME))
}

#[test]
fn a_synced_batch_is_in_the_log_not_the_tree_until_a_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open_in(dir.path());
    store.apply(&[grant("a", 1, 1)]).expect("apply");
    // The tree alone does not have it: only the log does.
    let tx = store.db.begin_read().expect("read");
    let table = tx.open_table(RESOURCES).expect("table");
    assert!(table.get("a").expect("get").is_none());
    drop((table, tx));
    assert!(store.log.used() > 0);
    // Dropped without a checkpoint, as a crash leaves it: the next open replays.
    drop(store);
    let mut store = open_in(dir.path());
    assert_eq!(token_of(&mut store, "a"), Some(1));
    assert_eq!(store.log.used(), 0, "opening checkpoints what it replayed");
    let tx = store.db.begin_read().expect("read");
    assert!(
        tx.open_table(RESOURCES)
            .expect("table")
            .get("a")
            .expect("get")
            .is_some()
    );
}

#[test]
fn a_torn_last_record_loses_only_its_own_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open_in(dir.path());
    store.apply(&[grant("a", 1, 1)]).expect("apply");
    let before = store.log.used();
    store.apply(&[grant("b", 1, 1), grant("a", 2, 1)]).expect("apply");
    let after = store.log.used();
    drop(store);
    // The last record's final byte did not reach the disk as written.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(log_file(dir.path()))
        .expect("log");
    let mut last = [0u8];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut last, after - 1).expect("read");
    std::os::unix::fs::FileExt::write_all_at(&f, &[!last[0]], after - 1).expect("tear");
    drop(f);
    assert!(after > before + 1);
    let mut store = open_in(dir.path());
    assert_eq!((token_of(&mut store, "a"), token_of(&mut store, "b")), (Some(1), None));
    // And the store goes on from there.
    store.apply(&[grant("a", 2, 1)]).expect("apply");
    drop(store);
    assert_eq!(token_of(&mut open_in(dir.path()), "a"), Some(2));
}

#[test]
fn a_full_log_checkpoints_and_every_batch_survives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open_in(dir.path());
    let long = "r/".repeat(200);
    let mut checkpoints = 0;
    let mut t = 0;
    // Each batch is 64 resources of ~400-byte names: about 40 KiB a record.
    while checkpoints < 3 {
        t += 1;
        let batch: Vec<Mutation> = (0..64).map(|i| grant(&format!("{long}{i}"), t, 1)).collect();
        let generation = store.generation;
        store.apply(&batch).expect("apply");
        if store.generation > generation {
            checkpoints += 1;
        }
        assert!(
            store.log.used() <= LOG_BYTES,
            "a record that fits is never written past the end"
        );
    }
    drop(store);
    let mut store = open_in(dir.path());
    let all = store.load().expect("load");
    assert_eq!(all.len(), 64);
    assert!(
        all.iter().all(|r| r.last_token.get() == t),
        "the last of {t} batches wins"
    );
}

#[test]
fn upkeep_checkpoints_once_many_resources_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open_in(dir.path());
    let batch: Vec<Mutation> = (0..PENDING_CHECKPOINT - 1)
        .map(|i| grant(&format!("p/{i}"), 1, 1))
        .collect();
    store.apply(&batch).expect("apply");
    store.maintain().expect("upkeep");
    assert_eq!(store.pending.len(), PENDING_CHECKPOINT - 1, "below the mark it waits");
    store.apply(&[grant("p/last", 1, 1)]).expect("apply");
    store.maintain().expect("upkeep");
    assert!(store.pending.is_empty());
    assert_eq!(store.log.used(), 0);
    assert_eq!(store.load().expect("load").len(), PENDING_CHECKPOINT);
}

#[test]
fn a_refused_batch_writes_nothing_to_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open_in(dir.path());
    store.apply(&[grant("a", 5, 1)]).expect("apply");
    let used = store.log.used();
    let err = store
        .apply(&[grant("b", 1, 1), grant("a", 5, 2)])
        .expect_err("regression");
    assert!(matches!(err, StoreError::TokenRegression { .. }), "{err}");
    assert_eq!(store.log.used(), used);
    drop(store);
    let mut store = open_in(dir.path());
    assert_eq!((token_of(&mut store, "a"), token_of(&mut store, "b")), (Some(5), None));
}

#[test]
fn a_file_of_a_later_schema_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(EmbeddedStore::FILE_NAME);
    {
        let db = Database::create(&path).expect("create");
        let tx = db.begin_write().expect("begin");
        tx.open_table(META)
            .expect("meta")
            .insert("schema_version", 3)
            .expect("insert");
        tx.commit().expect("commit");
    }
    let err = EmbeddedStore::open(&path).err().expect("refused").to_string();
    assert!(err.contains("schema version 3") && err.contains("[1, 2]"), "{err}");
}

#[test]
fn after_a_checkpoint_the_older_generation_left_in_the_log_is_never_replayed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open_in(dir.path());
    // Records 0 and 1 of this generation: `a` at tokens 1 and 2.
    store.apply(&[grant("a", 1, 1)]).expect("apply");
    store.apply(&[grant("a", 2, 1)]).expect("apply");
    store.checkpoint().expect("checkpoint");
    // Record 0 of the next generation is exactly as long as the old record 0,
    // so the old record 1 (token 2, index 1) sits right where record 1 of
    // this generation would start.
    store.apply(&[grant("a", 3, 1)]).expect("apply");
    assert_eq!(
        store.log.used(),
        Log::record_len(&[("a".into(), encode(&store.pending["a"]))])
    );
    drop(store);
    let mut store = open_in(dir.path());
    assert_eq!(
        token_of(&mut store, "a"),
        Some(3),
        "token 2 of the older generation came back"
    );
}
