//! The clock the self-fencing deadline is kept on.
//!
//! A lease's deadline must count every moment the coordinator counts,
//! including those the holder's machine spent suspended: the coordinator
//! keeps running and expires the lease meanwhile. `std::time::Instant` and
//! tokio's timers use `CLOCK_MONOTONIC`, which stops during a suspend, so a
//! holder resuming from one would think its lease had time left. On Linux
//! the deadline is therefore kept on `CLOCK_BOOTTIME` ([`SystemClock`]),
//! which counts the suspend; elsewhere it falls back to the monotonic clock.
//!
//! Timers still run on tokio's monotonic clock, so a wait for a deadline
//! ([`sleep_until`]) sleeps in slices of at most [`RECHECK`] and reads the
//! clock again after each: after a resume it notices a passed deadline
//! within one slice. Tests inject [`TokioClock`] (tokio's clock, which
//! paused test time drives) or a clock of their own.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Longest a deadline wait sleeps before reading the clock again: how late
/// a deadline that a suspend carried past can be noticed after the resume.
pub const RECHECK: Duration = Duration::from_millis(100);

/// A reading of a [`Clock`]: the time since the clock's own origin. Only
/// readings of one clock compare meaningfully.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp(Duration);

impl Stamp {
    /// The reading `since` after the clock's origin.
    pub const fn from_origin(since: Duration) -> Stamp {
        Stamp(since)
    }

    /// How long after the clock's origin this reading is.
    pub const fn since_origin(self) -> Duration {
        self.0
    }

    /// `self + d`, saturating.
    pub fn saturating_add(self, d: Duration) -> Stamp {
        Stamp(self.0.saturating_add(d))
    }

    /// `self − d`, at the origin at the earliest.
    pub fn saturating_sub(self, d: Duration) -> Stamp {
        Stamp(self.0.saturating_sub(d))
    }

    /// How long from `earlier` to `self`; zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Stamp) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

/// Which clock a [`Clock`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClockSource {
    /// Linux `CLOCK_BOOTTIME`: monotonic, and counts time spent suspended.
    BootTime,
    /// The platform's monotonic clock (`std::time::Instant`): stops during
    /// a suspend on some platforms.
    Monotonic,
    /// tokio's clock (`tokio::time::Instant`), which paused test time drives.
    Tokio,
    /// Any other clock (a test's own).
    Other,
}

/// A monotonic clock for self-fencing deadlines. Must never go backwards.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    fn now(&self) -> Stamp;
    fn source(&self) -> ClockSource;
}

/// The default clock: `CLOCK_BOOTTIME` on Linux, the monotonic clock elsewhere.
#[derive(Debug)]
pub struct SystemClock {
    #[cfg(not(target_os = "linux"))]
    origin: std::time::Instant,
}

impl SystemClock {
    pub fn new() -> SystemClock {
        SystemClock {
            #[cfg(not(target_os = "linux"))]
            origin: std::time::Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> SystemClock {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    #[cfg(target_os = "linux")]
    fn now(&self) -> Stamp {
        // CLOCK_BOOTTIME exists since Linux 2.6.39, older than any kernel
        // Rust supports; rustix reads it through the vDSO.
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        // The kernel never reports a negative boot time; clamp rather than trust.
        let secs = u64::try_from(t.tv_sec).unwrap_or(0);
        let nanos = u32::try_from(t.tv_nsec).unwrap_or(0).min(999_999_999);
        Stamp(Duration::new(secs, nanos))
    }

    #[cfg(not(target_os = "linux"))]
    fn now(&self) -> Stamp {
        Stamp(self.origin.elapsed())
    }

    fn source(&self) -> ClockSource {
        if cfg!(target_os = "linux") {
            ClockSource::BootTime
        } else {
            ClockSource::Monotonic
        }
    }
}

/// tokio's clock: deterministic under paused test time, but it stops while
/// the machine is suspended. For tests.
#[derive(Debug)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    pub fn new() -> TokioClock {
        TokioClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> TokioClock {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Stamp {
        Stamp(self.origin.elapsed())
    }

    fn source(&self) -> ClockSource {
        ClockSource::Tokio
    }
}

/// The clock a [`crate::ClientOptions`] starts with.
pub(crate) fn default_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

/// Completes once `clock` reads `at` or later (see the module doc).
pub(crate) async fn sleep_until(clock: &dyn Clock, at: Stamp) {
    loop {
        let left = at.saturating_since(clock.now());
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(RECHECK)).await;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A clock the test moves by hand, as a suspend would: tokio's clock
    /// does not move with it.
    #[derive(Debug, Default)]
    pub(crate) struct ManualClock(Mutex<Duration>);

    impl ManualClock {
        pub(crate) fn advance(&self, d: Duration) {
            let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
            *t += d;
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> Stamp {
            Stamp(*self.0.lock().unwrap_or_else(|e| e.into_inner()))
        }

        fn source(&self) -> ClockSource {
            ClockSource::Other
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn on_linux_the_default_clock_is_boot_time() {
        let clock = default_clock();
        assert_eq!(clock.source(), ClockSource::BootTime);
        let before = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        let read = clock.now().since_origin();
        let after = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        let secs = |t: rustix::time::Timespec| u64::try_from(t.tv_sec).expect("boot time");
        assert!(secs(before) <= read.as_secs() && read.as_secs() <= secs(after));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_wait_notices_a_jump_of_the_clock_within_one_recheck() {
        let clock = Arc::new(ManualClock::default());
        let at = Stamp(Duration::from_secs(60));
        let waiter = {
            let clock = clock.clone();
            tokio::spawn(async move { sleep_until(clock.as_ref(), at).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished());
        let jumped_at = tokio::time::Instant::now();
        clock.advance(Duration::from_secs(61)); // a suspend: tokio's clock stood still
        waiter.await.expect("joined");
        assert!(jumped_at.elapsed() <= RECHECK);
    }
}
