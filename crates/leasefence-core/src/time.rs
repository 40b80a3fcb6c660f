//! The coordinator's monotonic clock, as a value passed in by the caller.

use std::time::Duration;

/// A reading of a monotonic clock, in milliseconds since an arbitrary origin
/// (for the server: its start). Never a wall-clock timestamp.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MonoTime(u64);

impl MonoTime {
    pub const ZERO: MonoTime = MonoTime(0);

    pub const fn from_millis(ms: u64) -> MonoTime {
        MonoTime(ms)
    }

    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// `self + d`, saturating at the far future rather than wrapping.
    pub fn saturating_add(self, d: Duration) -> MonoTime {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        MonoTime(self.0.saturating_add(ms))
    }

    /// How long from `earlier` to `self`; zero if `earlier` is later.
    pub fn saturating_since(self, earlier: MonoTime) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_saturates_and_since_never_goes_negative() {
        let t = MonoTime::from_millis(u64::MAX - 1);
        assert_eq!(t.saturating_add(Duration::from_secs(5)).as_millis(), u64::MAX);
        let a = MonoTime::from_millis(10);
        let b = MonoTime::from_millis(25);
        assert_eq!(b.saturating_since(a), Duration::from_millis(15));
        assert_eq!(a.saturating_since(b), Duration::ZERO);
    }
}
