//! Limits of the lease machine, checked where requests enter it.

use std::time::Duration;

use crate::{Invalid, StoredResource};

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

/// What a store holds that this configuration's bounds would refuse today: terms
/// granted before `ttl_min`, `ttl_max` or `lock_delay_max` were changed. Such
/// leases and delays are recovered as they were granted, never cut short (a
/// holder paces its renewals by the TTL it was given), so an operator who
/// tightened the bounds is told how many there are and how long they may last.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutsideBounds {
    /// Held leases whose TTL is outside `ttl_min..=ttl_max`.
    pub ttls: usize,
    /// The longest TTL among them.
    pub ttl_longest: Duration,
    /// Held leases whose lock-delay (started if they expire) is over the maximum.
    pub lease_lock_delays: usize,
    /// Unheld resources closed by a recorded lock-delay over the maximum.
    pub closed: usize,
    /// The longest lock-delay over the maximum, held or running.
    pub lock_delay_longest: Duration,
}

impl OutsideBounds {
    /// Counts the terms in `records` that `config` would refuse.
    pub fn of<'a>(config: &Config, records: impl IntoIterator<Item = &'a StoredResource>) -> OutsideBounds {
        let mut out = OutsideBounds::default();
        let delay_over = |out: &mut OutsideBounds, delay: Duration| {
            let over = delay > config.lock_delay_max;
            if over {
                out.lock_delay_longest = out.lock_delay_longest.max(delay);
            }
            over
        };
        for r in records {
            match &r.lease {
                Some(l) => {
                    if config.check_ttl(l.ttl).is_err() {
                        out.ttls += 1;
                        out.ttl_longest = out.ttl_longest.max(l.ttl);
                    }
                    if delay_over(&mut out, l.lock_delay) {
                        out.lease_lock_delays += 1;
                    }
                }
                None => {
                    if let Some(d) = &r.lock_delay
                        && delay_over(&mut out, d.delay)
                    {
                        out.closed += 1;
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Holder, LeaseId, ResourceId, StoredLease, StoredLockDelay, Token};

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn held(name: &str, ttl: Duration, lock_delay: Duration) -> StoredResource {
        StoredResource {
            resource: ResourceId::new(name).expect("name"),
            last_token: Token::FIRST,
            lease: Some(StoredLease {
                lease_id: LeaseId::from_bytes([7; 16]),
                holder: Holder::new("w").expect("holder"),
                ttl,
                lock_delay,
            }),
            lock_delay: None,
        }
    }

    fn closed(name: &str, delay: Duration) -> StoredResource {
        StoredResource {
            resource: ResourceId::new(name).expect("name"),
            last_token: Token::FIRST,
            lease: None,
            lock_delay: Some(StoredLockDelay {
                holder: Holder::new("w").expect("holder"),
                delay,
            }),
        }
    }

    #[test]
    fn terms_granted_under_wider_bounds_are_counted_with_the_longest() {
        let config = Config::new(secs(1), secs(10), 8)
            .expect("valid")
            .with_lock_delay_max(secs(5));
        let records = [
            held("within", secs(10), secs(5)),
            held("long", secs(60), Duration::ZERO),
            held("longer", secs(3600), secs(30)),
            held("short", Duration::from_millis(100), Duration::ZERO),
            closed("closed-within", secs(5)),
            closed("closed-long", secs(120)),
        ];
        let out = OutsideBounds::of(&config, &records);
        assert_eq!(
            out,
            OutsideBounds {
                ttls: 3,
                ttl_longest: secs(3600),
                lease_lock_delays: 1,
                closed: 1,
                lock_delay_longest: secs(120),
            }
        );
    }

    #[test]
    fn terms_within_the_bounds_are_not_reported() {
        let config = Config::default();
        let records = [held("a", secs(30), secs(60)), closed("b", secs(60))];
        let out = OutsideBounds::of(&config, &records);
        assert_eq!(out, OutsideBounds::default());
    }
}
