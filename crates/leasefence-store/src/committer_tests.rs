//! The writer's idle spin: it looks for work for a while after a commit, and
//! then sleeps instead of polling for ever.

use std::time::Duration;

use super::*;
use crate::MemoryStore;
use crate::conformance::grant;

/// User plus system CPU time, in clock ticks, of this process's threads named
/// as the writer (the kernel keeps 15 bytes of a thread's name); there must be
/// one, or the test would measure nothing.
fn writer_cpu_ticks() -> u64 {
    let name = &WRITER_THREAD[..15];
    let mut found = false;
    let mut ticks = 0;
    let tasks = std::fs::read_dir("/proc/self/task").expect("list this process's threads");
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        found = true;
        let stat = std::fs::read_to_string(task.path().join("stat")).expect("read a thread's stat");
        // The fields after the name, which is in parentheses: state is the
        // first, utime the 12th and stime the 13th.
        let after = &stat[stat.rfind(')').expect("stat names the thread") + 2..];
        let fields: Vec<&str> = after.split_whitespace().collect();
        ticks += fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    }
    assert!(found, "no thread named {name:?}: the writer's name changed");
    ticks
}

#[tokio::test]
async fn work_after_the_writer_fell_asleep_is_still_committed() {
    let committer = Committer::start_with(MemoryStore::new(), 16, Duration::from_micros(50));
    let first = committer.submit(grant("sleep/a", 1, 1));
    committer.durable(first).await.expect("committed");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = committer.submit(grant("sleep/b", 1, 2));
    tokio::time::timeout(Duration::from_secs(5), committer.durable(second))
        .await
        .expect("the sleeping writer woke for the new job")
        .expect("committed");
    assert_eq!(
        committer.stats(),
        CommitterStats {
            batches: 2,
            mutations: 2
        }
    );
}

#[tokio::test]
async fn an_idle_writer_sleeps_after_its_spin_even_when_asked_to_spin_for_ever() {
    // An hour's spin is cut to IDLE_SPIN_MAX. (One test, not two: the writers
    // of tests running beside it are counted too, and only this one spins long.)
    let committer = Committer::start_with(MemoryStore::new(), 16, Duration::from_secs(3600));
    let seq = committer.submit(grant("idle/a", 1, 1));
    committer.durable(seq).await.expect("committed");
    tokio::time::sleep(IDLE_SPIN_MAX * 3).await;
    let before = writer_cpu_ticks();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let used = writer_cpu_ticks() - before;
    // A writer polling all along would use about 50 ticks of 10 ms here.
    assert!(used <= 5, "the idle writer used {used} ticks of CPU in 500 ms");
}

/// Commits its first `good` batches, then fails every one after.
struct FailsAfter {
    inner: MemoryStore,
    good: usize,
}

impl LeaseStore for FailsAfter {
    fn load(&mut self) -> Result<Vec<leasefence_core::StoredResource>, StoreError> {
        self.inner.load()
    }

    fn apply(&mut self, batch: &[Mutation]) -> Result<(), StoreError> {
        if self.good == 0 {
            return Err(StoreError::Io("injected write failure".into()));
        }
        self.good -= 1;
        self.inner.apply(batch)
    }
}

#[tokio::test]
async fn failed_resolves_with_the_failure_and_not_with_a_commit() {
    let store = FailsAfter {
        inner: MemoryStore::new(),
        good: 1,
    };
    let committer = Committer::start(store, 16);
    let failed = committer.failed();
    tokio::pin!(failed);
    let first = committer.submit(grant("fail/a", 1, 1));
    committer.durable(first).await.expect("the first commit succeeds");
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut failed)
            .await
            .is_err(),
        "resolved while every commit succeeded"
    );
    let second = committer.submit(grant("fail/b", 1, 2));
    assert!(committer.durable(second).await.is_err(), "the second commit fails");
    let e = tokio::time::timeout(Duration::from_secs(5), failed)
        .await
        .expect("resolves once a commit failed");
    assert_eq!(e, Some(StoreError::Io("injected write failure".into())));
    assert_eq!(committer.failure(), e, "failure() says so by then");
}

/// Takes `delay` over every commit.
struct Slow {
    inner: MemoryStore,
    delay: Duration,
}

impl LeaseStore for Slow {
    fn load(&mut self) -> Result<Vec<leasefence_core::StoredResource>, StoreError> {
        self.inner.load()
    }

    fn apply(&mut self, batch: &[Mutation]) -> Result<(), StoreError> {
        std::thread::sleep(self.delay);
        self.inner.apply(batch)
    }
}

#[test]
fn a_caller_spins_only_alone_and_only_for_commits_quicker_than_the_spin() {
    let spin = IDLE_SPIN;
    let quick = IDLE_SPIN / 2;
    assert!(lone_spin(1, quick, spin), "alone, with quick commits");
    assert!(lone_spin(1, Duration::ZERO, spin), "before the first commit");
    assert!(!lone_spin(2, quick, spin), "another caller waits too");
    assert!(!lone_spin(1, spin * 10, spin), "commits take longer than the spin");
    assert!(!lone_spin(1, quick, Duration::ZERO), "spinning is off");
}

#[test]
fn the_writer_spins_only_after_a_small_commit() {
    assert_eq!(writer_spin(0, IDLE_SPIN), IDLE_SPIN, "before the first commit");
    assert_eq!(writer_spin(1, IDLE_SPIN), IDLE_SPIN, "one caller");
    assert_eq!(writer_spin(SPIN_BATCH_MAX, IDLE_SPIN), IDLE_SPIN);
    assert_eq!(
        writer_spin(SPIN_BATCH_MAX + 1, IDLE_SPIN),
        Duration::ZERO,
        "many callers"
    );
    assert_eq!(writer_spin(1, Duration::ZERO), Duration::ZERO, "spinning is off");
}

#[tokio::test(flavor = "current_thread")]
async fn a_spinning_caller_lets_the_other_tasks_of_its_thread_run() {
    // Spins for the whole 5 ms commit: nothing committed yet, so the last
    // commit was quicker than the spin.
    let store = Slow {
        inner: MemoryStore::new(),
        delay: Duration::from_millis(5),
    };
    let committer = Committer::start_with(store, 16, IDLE_SPIN_MAX);
    let ticks = Arc::new(AtomicU64::new(0));
    let counting = {
        let ticks = ticks.clone();
        tokio::spawn(async move {
            loop {
                ticks.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        })
    };
    let seq = committer.submit(grant("spin/a", 1, 1));
    committer.durable(seq).await.expect("committed");
    counting.abort();
    assert!(
        ticks.load(Ordering::Relaxed) > 0,
        "the other task never ran while the caller waited"
    );
}

#[tokio::test]
async fn a_wait_given_up_is_no_longer_counted_as_waiting() {
    let store = Slow {
        inner: MemoryStore::new(),
        delay: Duration::from_millis(100),
    };
    let committer = Committer::start(store, 16);
    let seq = committer.submit(grant("gone/a", 1, 1));
    assert!(
        tokio::time::timeout(Duration::from_millis(1), committer.durable(seq))
            .await
            .is_err(),
        "a 100 ms commit was durable within 1 ms"
    );
    assert_eq!(committer.waiting(), 0, "the abandoned wait still counts");
    committer.durable(seq).await.expect("committed");
    assert_eq!(committer.waiting(), 0, "a finished wait still counts");
}
