//! The one conformance suite every [`SharedStore`] backend must pass.
//!
//! `open(shard)` must return a new handle — as another coordinator would open
//! it — on shard `shard` of one engine: the same shard means the same state
//! (leadership, epoch, records) across calls; different shards are
//! independent. Each scenario uses shards of its own ([`SHARDS`]), so one
//! engine serves the whole suite, but every run needs a fresh engine (a new
//! PostgreSQL schema, a new etcd prefix): the scenarios expect their shards to
//! start with no leader and no records.
//!
//! Leadership expiry is real time judged by the engine, so the scenarios use
//! short TTLs ([`TTL_SHORT`]) and wait generously ([`WAIT_MAX`]); every bound
//! they assert is one the engine must keep however slow the machine is (a
//! campaign may not win before the TTL has passed since the leader's campaign
//! began), never one that a slow machine could break.

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::grant;
use crate::shared::{Epoch, LeaderInfo, SharedStore};
use crate::{LeaseStore, StoreError};

/// The shards the suite uses, one range per scenario: `SHARDS.start` and up.
pub const SHARDS: std::ops::Range<u32> = 1..20;

/// A leadership meant to lapse during a scenario.
pub const TTL_SHORT: Duration = Duration::from_millis(300);
/// A leadership meant to stay live for the whole scenario.
pub const TTL_LONG: Duration = Duration::from_secs(60);
/// How long a scenario waits for something the engine must do eventually.
pub const WAIT_MAX: Duration = Duration::from_secs(15);
/// Between two attempts while waiting.
const POLL: Duration = Duration::from_millis(10);

const A: &str = "http://a.example:7070";
const B: &str = "http://b.example:7070";

/// Runs every scenario.
pub fn run_all<S: SharedStore>(mut open: impl FnMut(u32) -> S) {
    one_of_concurrent_campaigners_wins(&mut open);
    epochs_strictly_increase_across_terms(&mut open);
    live_leadership_blocks_campaigns_until_it_lapses(&mut open);
    renew_extends_the_leadership(&mut open);
    resign_lets_the_next_campaign_win_at_once(&mut open);
    leader_reports_the_advertise_url_and_epoch(&mut open);
    old_epoch_is_deposed_and_writes_nothing(&mut open);
    takeover_load_sees_every_batch_the_old_epoch_committed(&mut open);
    shards_are_independent(&mut open);
    writer_of_the_current_epoch_passes_the_lease_store_suite(&mut open);
}

fn campaign<S: SharedStore>(s: &S, advertise: &str, ttl: Duration) -> Option<Epoch> {
    s.campaign(advertise, ttl).expect("campaign")
}

/// Campaigns until it wins; panics after [`WAIT_MAX`].
fn win<S: SharedStore>(s: &S, advertise: &str, ttl: Duration) -> Epoch {
    let start = Instant::now();
    loop {
        if let Some(e) = campaign(s, advertise, ttl) {
            return e;
        }
        assert!(
            start.elapsed() < WAIT_MAX,
            "no campaign won within {WAIT_MAX:?}: a lapsed leadership must let the next campaign win"
        );
        std::thread::sleep(POLL);
    }
}

fn deposed(epoch: Epoch, current: Epoch) -> Result<(), StoreError> {
    Err(StoreError::Deposed { epoch, current })
}

pub fn one_of_concurrent_campaigners_wins<S: SharedStore>(open: &mut impl FnMut(u32) -> S) {
    let shard = SHARDS.start;
    let stores: Vec<S> = (0..4).map(|_| open(shard)).collect();
    let mut last = 0;
    for round in 0..5 {
        let barrier = Barrier::new(stores.len());
        let won: Vec<Option<Epoch>> = std::thread::scope(|scope| {
            let runs: Vec<_> = stores
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        barrier.wait();
                        campaign(s, &format!("http://c{i}.example:7070"), TTL_LONG)
                    })
                })
                .collect();
            runs.into_iter().map(|r| r.join().expect("campaigner")).collect()
        });
        let winners: Vec<(usize, Epoch)> = won.iter().enumerate().filter_map(|(i, e)| e.map(|e| (i, e))).collect();
        assert_eq!(winners.len(), 1, "round {round}: exactly one campaigner wins: {won:?}");
        let (i, epoch) = winners[0];
        assert!(epoch > last, "round {round}: epoch {epoch} after {last}");
        last = epoch;
        stores[i].resign(epoch).expect("resign");
    }
}

pub fn epochs_strictly_increase_across_terms<S: SharedStore>(open: &mut impl FnMut(u32) -> S) {
    let shard = SHARDS.start + 1;
    let (a, b) = (open(shard), open(shard));
    let mut last = 0;
    for term in 0..6 {
        let s = if term % 2 == 0 { &a } else { &b };
        // Alternate clean hand-overs (resign) with lapses (no renewal).
        let ttl = if term % 3 == 2 { TTL_SHORT } else { TTL_LONG };
        let epoch = win(s, A, ttl);
        assert!(epoch > last && epoch >= 1, "term {term}: epoch {epoch} after {last}");
        last = epoch;
        if ttl == TTL_LONG {
            s.resign(epoch).expect("resign");
        }
    }
    // A store opened later continues above every epoch before.
    let c = open(shard);
    let epoch = win(&c, A, TTL_LONG);
    assert!(epoch > last, "a new handle's epoch {epoch} after {last}");
    c.resign(epoch).expect("resign");
}

pub fn live_leadership_blocks_campaigns_until_it_lapses<S: SharedStore>(open: &mut impl FnMut(u32) -> S) {
    let shard = SHARDS.start + 2;
    let (a, b) = (open(shard), open(shard));
    // Long enough that the immediate second campaign surely falls inside it.
    let ttl = Duration::from_secs(1);
    let began = Instant::now();
    let epoch = campaign(&a, A, ttl).expect("the first campaign of a fresh shard wins");
    assert_eq!(campaign(&b, B, ttl), None, "a live leadership blocks another campaign");
    assert_eq!(campaign(&a, A, ttl), None, "and the leader's own second campaign");
    let next = win(&b, B, TTL_LONG);
    let waited = began.elapsed();
    assert!(
        waited >= ttl,
        "the campaign won {waited:?} after the leader's began, before its TTL of {ttl:?} lapsed"
    );
    assert!(next > epoch);
    b.resign(next).expect("resign");
}

pub fn renew_extends_the_leadership<S: SharedStore>(open: &mut impl FnMut(u32) -> S) {
    let shard = SHARDS.start + 3;
    let (a, b) = (open(shard), open(shard));
    let began = Instant::now();
    let epoch = campaign(&a, A, TTL_SHORT).expect("a fresh shard's first campaign wins");
    // Renewed every third of its TTL (with the campaign's TTL, as a leader
    // does), it stays live well past the first TTL: only the renewals keep it.
    while began.elapsed() < TTL_SHORT * 3 {
        std::thread::sleep(TTL_SHORT / 3);
        a.renew(epoch, TTL_SHORT).expect("renew");
    }
    assert_eq!(campaign(&b, B, TTL_LONG), None, "a renewed leadership is still live");
    let expected = LeaderInfo {
        epoch,
        advertise: A.to_string(),
    };
    assert_eq!(b.leader().expect("leader"), Some(expected));
    // Without renewals it lapses.
    let next = win(&b, B, TTL_LONG);
    assert!(next > epoch);
    b.resign(next).expect("resign");
}

pub fn resign_lets_the_next_campaign_win_at_once<S: SharedStore>(open: &mut impl FnMut(u32) -> S) {
    let shard = SHARDS.start + 4;
    let (a, b) = (open(shard), open(shard));
    let epoch = campaign(&a, A, TTL_LONG).expect("a fresh shard's first campaign wins");
    assert_eq!(campaign(&b, B, TTL_LONG), None);
    a.resign(epoch + 1)
        .expect("resigning an epoch that is not current is no error");
    assert_eq!(campaign(&b, B, TTL_LONG), None, "and ends nothing");
    a.resign(epoch).expect("resign");
    assert_eq!(a.leader().expect("leader"), None, "no leader after a resignation");
    assert_eq!(
        a.renew(epoch, TTL_LONG),
        deposed(epoch, epoch),
        "a resigned leadership cannot be renewed"
    );
    let next = campaign(&b, B, TTL_LONG).expect("the next campaign wins at once, within the old TTL");
    assert!(next > epoch);
    a.resign(epoch).expect("a late resignation of the old epoch");
    let leader = a.leader().expect("leader").map(|l| l.epoch);
    assert_eq!(
        leader,
        Some(next),
        "an old epoch's resignation leaves the new leader alone"
    );
    b.resign(next).expect("resign");
}

pub fn leader_reports_the_advertise_url_and_epoch<S: SharedStore>(open: &mut impl FnMut(u32) -> S) {
    let shard = SHARDS.start + 5;
    let (a, b) = (open(shard), open(shard));
    assert_eq!(b.leader().expect("leader"), None, "a fresh shard has no leader");
    let epoch = campaign(&a, A, TTL_LONG).expect("a fresh shard's first campaign wins");
    let info = |epoch, url: &str| {
        Some(LeaderInfo {
            epoch,
            advertise: url.to_string(),
        })
    };
    assert_eq!(b.leader().expect("leader"), info(epoch, A));
    a.resign(epoch).expect("resign");
    let began = Instant::now();
    let next = campaign(&b, B, TTL_SHORT).expect("wins after the resignation");
    assert_eq!(a.leader().expect("leader"), info(next, B));
    // A lapsed leadership is no leader.
    while a.leader().expect("leader").is_some() {
        assert!(began.elapsed() < WAIT_MAX, "a lapsed leadership is still reported");
        std::thread::sleep(POLL);
    }
    assert!(
        began.elapsed() >= TTL_SHORT,
        "the leader was gone before its TTL lapsed"
    );
}

pub fn old_epoch_is_deposed_and_writes_nothing<S: SharedStore>(open: &mut impl FnMut(u32) -> S) {
    let shard = SHARDS.start + 6;
    let (a, b) = (open(shard), open(shard));
    let old = campaign(&a, A, TTL_SHORT).expect("a fresh shard's first campaign wins");
    let mut old_writer = a.writer(old).expect("writer");
    old_writer.apply(&[grant("d/kept", 1, 1)]).expect("the leader writes");
    // Taken over once the old leadership lapses, without a resignation.
    let new = win(&b, B, TTL_LONG);
    assert!(new > old);
    assert_eq!(a.renew(old, TTL_LONG), deposed(old, new), "renew under the old epoch");
    assert_eq!(
        old_writer.apply(&[grant("d/lost", 1, 2)]),
        deposed(old, new),
        "apply under the old epoch"
    );
    assert_eq!(old_writer.apply(&[grant("d/kept", 2, 2)]), deposed(old, new));
    let mut fresh_old = a.writer(old).expect("writer");
    assert_eq!(fresh_old.apply(&[grant("d/lost", 1, 2)]), deposed(old, new));
    let mut future = b.writer(new + 1).expect("writer");
    assert_eq!(
        future.apply(&[grant("d/lost", 1, 2)]),
        deposed(new + 1, new),
        "an epoch above the current one is not current either"
    );
    a.resign(old).expect("resign the old epoch");
    let mut writer = b.writer(new).expect("writer");
    let records = writer.load().expect("load");
    let names: Vec<(&str, u64)> = records
        .iter()
        .map(|r| (r.resource.as_str(), r.last_token.get()))
        .collect();
    assert_eq!(names, vec![("d/kept", 1)], "the deposed writer wrote nothing");
    writer
        .apply(&[grant("d/kept", 2, 3)])
        .expect("the new leader writes, its renewal and the old resignation notwithstanding");
    b.renew(new, TTL_LONG).expect("the new leader renews");
    b.resign(new).expect("resign");
}

/// The old leader writes batches without pause (and without renewing) while
/// its leadership lapses and a standby takes over: the new leader's load must
/// hold exactly the batches the old one was told were committed.
pub fn takeover_load_sees_every_batch_the_old_epoch_committed<S: SharedStore>(open: &mut impl FnMut(u32) -> S) {
    let shard = SHARDS.start + 7;
    let stores = [open(shard), open(shard)];
    for round in 0..3usize {
        let (old, new) = (&stores[round % 2], &stores[(round + 1) % 2]);
        let epoch = win(old, A, TTL_SHORT);
        let mut writer = old.writer(epoch).expect("writer");
        let acked = AtomicU64::new(0);
        let names: Vec<String> = (0..4).map(|k| format!("t/{round}/{k}")).collect();
        let (next, loaded) = std::thread::scope(|scope| {
            let writing = scope.spawn(|| {
                let began = Instant::now();
                for token in 1.. {
                    assert!(
                        began.elapsed() < WAIT_MAX,
                        "round {round}: the old leader was never deposed"
                    );
                    let batch: Vec<_> = names.iter().map(|n| grant(n, token, 1)).collect();
                    match writer.apply(&batch) {
                        Ok(()) => acked.store(token, Ordering::SeqCst),
                        Err(StoreError::Deposed { .. }) => return,
                        Err(e) => panic!("round {round}: apply: {e}"),
                    }
                }
            });
            // Take over only once the old leader has written something.
            let began = Instant::now();
            while acked.load(Ordering::SeqCst) == 0 {
                assert!(began.elapsed() < WAIT_MAX, "the leader's first batch never committed");
                std::thread::sleep(POLL);
            }
            let next = win(new, B, TTL_LONG);
            let loaded = new.writer(next).and_then(|mut w| w.load()).expect("load");
            writing.join().expect("writer thread");
            (next, loaded)
        });
        let last = acked.load(Ordering::SeqCst);
        let mut tokens: Vec<(String, u64)> = loaded
            .iter()
            .filter(|r| r.resource.as_str().starts_with(&format!("t/{round}/")))
            .map(|r| (r.resource.to_string(), r.last_token.get()))
            .collect();
        tokens.sort(); // a load promises no order
        let expected: Vec<(String, u64)> = names.iter().map(|n| (n.clone(), last)).collect();
        assert_eq!(
            tokens, expected,
            "round {round}: the takeover's load holds every batch acknowledged under epoch {epoch} and nothing after"
        );
        new.resign(next).expect("resign");
    }
}

pub fn shards_are_independent<S: SharedStore>(open: &mut impl FnMut(u32) -> S) {
    let (x, y) = (open(SHARDS.start + 8), open(SHARDS.start + 9));
    let ex = campaign(&x, A, TTL_LONG).expect("shard x's first campaign wins");
    let ey = campaign(&y, B, TTL_LONG).expect("a leader of shard x does not block shard y");
    let (mut wx, mut wy) = (x.writer(ex).expect("writer"), y.writer(ey).expect("writer"));
    wx.apply(&[grant("s/same", 1, 1)]).expect("apply");
    assert_eq!(
        wy.load().expect("load"),
        vec![],
        "shard y holds none of shard x's records"
    );
    wy.apply(&[grant("s/same", 7, 2)])
        .expect("the same name in another shard");
    let x_tokens: Vec<u64> = wx.load().expect("load").iter().map(|r| r.last_token.get()).collect();
    assert_eq!(x_tokens, vec![1]);
    // Deposing shard x's leader leaves shard y's alone.
    x.resign(ex).expect("resign");
    let x2 = open(SHARDS.start + 8);
    let next = campaign(&x2, B, TTL_LONG).expect("wins after the resignation");
    assert_eq!(wx.apply(&[grant("s/same", 2, 1)]), deposed(ex, next));
    wy.apply(&[grant("s/same", 8, 2)])
        .expect("shard y's leader still writes");
    assert_eq!(y.leader().expect("leader").map(|l| l.epoch), Some(ey));
    x2.resign(next).expect("resign");
    y.resign(ey).expect("resign");
}

pub fn writer_of_the_current_epoch_passes_the_lease_store_suite<S: SharedStore>(open: &mut impl FnMut(u32) -> S) {
    let s = open(SHARDS.start + 10);
    let epoch = campaign(&s, A, TTL_LONG).expect("a fresh shard's first campaign wins");
    super::run_all(|| s.writer(epoch).expect("writer"));
    s.resign(epoch).expect("resign");
}
