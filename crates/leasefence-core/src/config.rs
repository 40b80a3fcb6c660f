//! Limits of the lease machine, checked where requests enter it.

use std::time::Duration;

use crate::Invalid;

/// Limits of the lease machine. Fields with invariants are private.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    ttl_min: Duration,
    ttl_max: Duration,
    waiters_max: usize,
    lock_delay_max: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            ttl_min: Duration::from_millis(100),
            ttl_max: Duration::from_secs(3600),
            waiters_max: 1024,
            lock_delay_max: Config::DEFAULT_LOCK_DELAY_MAX,
        }
    }
}

impl Config {
    pub const DEFAULT_LOCK_DELAY_MAX: Duration = Duration::from_secs(60);

    /// `ttl_min` must be at least 1 ms and no more than `ttl_max`.
    pub fn new(ttl_min: Duration, ttl_max: Duration, waiters_max: usize) -> Result<Config, Invalid> {
        if ttl_min < Duration::from_millis(1) {
            return Err(Invalid::new("ttl_min", "must be at least 1ms"));
        }
        if ttl_min > ttl_max {
            return Err(Invalid::new(
                "ttl_max",
                format!(
                    "must be at least ttl_min ({} ms), got {} ms",
                    ttl_min.as_millis(),
                    ttl_max.as_millis()
                ),
            ));
        }
        Ok(Config {
            ttl_min,
            ttl_max,
            waiters_max,
            lock_delay_max: Config::DEFAULT_LOCK_DELAY_MAX,
        })
    }

    /// The longest lock-delay an acquire may ask for (default 60 s).
    pub fn with_lock_delay_max(mut self, max: Duration) -> Config {
        self.lock_delay_max = max;
        self
    }

    pub fn ttl_min(&self) -> Duration {
        self.ttl_min
    }

    pub fn ttl_max(&self) -> Duration {
        self.ttl_max
    }

    pub fn waiters_max(&self) -> usize {
        self.waiters_max
    }

    pub fn lock_delay_max(&self) -> Duration {
        self.lock_delay_max
    }

    /// Checks a requested TTL against the bounds.
    pub fn check_ttl(&self, ttl: Duration) -> Result<Duration, Invalid> {
        if ttl < self.ttl_min || ttl > self.ttl_max {
            return Err(Invalid::new(
                "ttl_ms",
                format!(
                    "must be in {}..={} ms, got {} ms",
                    self.ttl_min.as_millis(),
                    self.ttl_max.as_millis(),
                    ttl.as_millis()
                ),
            ));
        }
        Ok(ttl)
    }

    /// Checks a requested lock-delay against the maximum.
    pub fn check_lock_delay(&self, delay: Duration) -> Result<Duration, Invalid> {
        if delay > self.lock_delay_max {
            return Err(Invalid::new(
                "lock_delay_ms",
                format!(
                    "must be at most {} ms (this coordinator's lock-delay maximum), got {} ms",
                    self.lock_delay_max.as_millis(),
                    delay.as_millis()
                ),
            ));
        }
        Ok(delay)
    }
}
