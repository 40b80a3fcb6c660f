//! The self-fencing arithmetic: until when a lease is provably held, and how
//! often to renew it. Pure functions of given clock readings ([`Stamp`]s of
//! the client's [`crate::Clock`], `CLOCK_BOOTTIME` on Linux), so they are
//! tested without a server or a clock.
//!
//! The coordinator extends a lease by its TTL from the moment it *receives* a
//! renewal, which is after the client *sent* it. So `sent + ttl` is a moment at
//! which, by the coordinator's clock, the lease has not yet expired — provided
//! both monotonic clocks advance at the same rate. The safety margin absorbs
//! what that proviso and the holder's own reaction leave out:
//!
//! - clock rate differences between client and coordinator (ppm, but TTLs can
//!   be an hour long: ttl/10 scales with the TTL);
//! - the time between the deadline and the moment the holder has actually
//!   stopped: timer granularity, scheduling delay, signalling a child process
//!   and letting it die (50 ms is a floor for that, however short the TTL).
//!
//! Hence the default margin `max(ttl/10, 50 ms)`, capped at half the TTL so
//! that a short lease still leaves time to work. A configured margin may be
//! smaller, but never below [`MARGIN_MIN`] (1 ms): the coordinator counts in
//! whole milliseconds, truncating the moment it received the renewal, so by
//! the client's clock its expiry can come up to a millisecond before
//! `sent + ttl`; a zero margin would put the deadline after it. The margin
//! only decides when the holder *stops*; safety still rests on the arbiters
//! checking tokens.

use std::time::Duration;

use leasefence_core::Invalid;

use crate::clock::Stamp;

/// The smallest safety margin accepted: it covers the coordinator's
/// rounding to whole milliseconds (see the module doc).
pub const MARGIN_MIN: Duration = Duration::from_millis(1);

/// The smallest *default* safety margin: the holder's reaction time.
pub const DEFAULT_MARGIN_FLOOR: Duration = Duration::from_millis(50);

/// Renewals sent per usable lease window (`ttl - margin`): three chances to
/// get one through before the deadline.
const RENEWALS_PER_WINDOW: u32 = 3;

/// The default safety margin for `ttl`: `max(ttl/10, 50 ms)`, at most `ttl/2`.
///
/// The deadline is `send time of the last successful renewal + ttl − margin`.
/// `ttl/10` covers clock-rate differences between client and coordinator,
/// which grow with the TTL; the 50 ms floor covers the holder's reaction time
/// (timers, scheduling, signalling a child) however short the TTL; the cap
/// keeps half of a short lease usable.
pub fn default_margin(ttl: Duration) -> Duration {
    (ttl / 10).max(DEFAULT_MARGIN_FLOOR).min(ttl / 2)
}

/// Checks a configured margin: at least [`MARGIN_MIN`], and it must leave
/// part of the TTL usable.
pub fn check_margin(ttl: Duration, margin: Duration) -> Result<Duration, Invalid> {
    if margin < MARGIN_MIN {
        return Err(Invalid::new(
            "margin",
            format!(
                "must be at least {} ms (the coordinator rounds to whole milliseconds), got {:?}",
                MARGIN_MIN.as_millis(),
                margin
            ),
        ));
    }
    if margin >= ttl {
        return Err(Invalid::new(
            "margin",
            format!(
                "must be shorter than the TTL ({} ms), got {} ms",
                ttl.as_millis(),
                margin.as_millis()
            ),
        ));
    }
    Ok(margin)
}

/// The last moment the lease is provably held, given that a renewal (or the
/// acquire) *sent* at `sent` succeeded and the coordinator then reported
/// `valid_for` (its TTL, or the time left if shorter).
pub fn deadline(sent: Stamp, valid_for: Duration, margin: Duration) -> Stamp {
    sent.saturating_add(valid_for.saturating_sub(margin))
}

/// How often to renew: about a third of the usable window, never zero.
pub fn renew_interval(ttl: Duration, margin: Duration) -> Duration {
    (ttl.saturating_sub(margin) / RENEWALS_PER_WINDOW).max(Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn default_margin_is_a_tenth_with_a_floor_and_a_cap() {
        assert_eq!(default_margin(ms(10_000)), ms(1_000));
        assert_eq!(default_margin(ms(300)), ms(50), "floor");
        assert_eq!(default_margin(ms(100)), ms(50), "half of 100 ms is the floor too");
        assert_eq!(default_margin(ms(60)), ms(30), "cap: half the ttl");
        assert_eq!(default_margin(Duration::from_secs(3_600)), Duration::from_secs(360));
    }

    #[test]
    fn margin_must_leave_time() {
        assert_eq!(check_margin(ms(300), ms(299)), Ok(ms(299)));
        assert_eq!(check_margin(ms(300), ms(1)), Ok(ms(1)));
        assert_eq!(check_margin(ms(300), ms(300)).unwrap_err().field(), "margin");
        assert!(check_margin(ms(300), ms(301)).is_err());
    }

    #[test]
    fn a_zero_margin_is_refused() {
        let e = check_margin(ms(300), Duration::ZERO).unwrap_err();
        assert_eq!(e.field(), "margin");
        assert!(e.message().contains("at least 1 ms"), "{e}");
        assert!(check_margin(ms(300), Duration::from_micros(999)).is_err());
    }

    #[test]
    fn deadline_counts_from_the_send_time_minus_the_margin() {
        let sent = Stamp::from_origin(Duration::from_secs(7));
        assert_eq!(deadline(sent, ms(1_000), ms(100)), sent.saturating_add(ms(900)));
        // A reply that took 400 ms to arrive does not move the deadline.
        let arrived = sent.saturating_add(ms(400));
        assert_eq!(deadline(sent, ms(1_000), ms(100)).saturating_since(arrived), ms(500));
        assert_eq!(deadline(sent, ms(50), ms(100)), sent, "never before the send time");
    }

    #[test]
    fn three_renewals_fit_in_the_usable_window() {
        assert_eq!(renew_interval(ms(10_000), ms(1_000)), ms(3_000));
        assert_eq!(renew_interval(ms(300), ms(50)), Duration::from_nanos(83_333_333));
        assert_eq!(renew_interval(ms(2), ms(2)), ms(1), "never zero");
        for ttl in [100, 300, 1_000, 60_000] {
            let margin = default_margin(ms(ttl));
            assert!(renew_interval(ms(ttl), margin) * RENEWALS_PER_WINDOW <= ms(ttl) - margin);
        }
    }
}
