//! Waiting after a fenced write until replicas (and the AOF) have it:
//! [`WaitFor`], used through [`Via::wait_for`](super::Via::wait_for).
//!
//! Redis replicates asynchronously. A fenced write is answered once the
//! primary applied it; if the primary fails before a replica got it, a
//! promoted replica has neither the write nor its token, so the previous
//! holder's stale write would be admitted there. `WAIT n timeout` after the
//! write blocks until `n` replicas acknowledged it (`WAITAOF local n timeout`,
//! Redis 7.2+, until they fsynced it to their AOF). It narrows the window, it
//! does not make replication synchronous: a failover can still promote a
//! replica that did not acknowledge. The write is applied on the primary
//! whatever the wait answers.

use std::fmt;
use std::time::Duration;

use leasefence_core::{Invalid, ResourceId};
use redis::aio::ConnectionLike;

use crate::ArbiterError;

/// Longest wait after a write.
pub const WAIT_TIMEOUT_MAX: Duration = Duration::from_secs(60);
/// Most replicas a wait can ask for.
pub const WAIT_REPLICAS_MAX: u32 = 1_000;

/// What a fenced write waits for before it is answered: `WAIT` or
/// `WAITAOF`, with a timeout (never 0, which would make Redis wait forever).
///
/// The connection's own response timeout must be longer than the wait's
/// (redis-rs: 500 ms by default); otherwise the client gives up first and
/// the write comes back as [`ArbiterError::WaitFailed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WaitFor {
    aof: bool,
    local: bool,
    replicas: u32,
    timeout_ms: u64,
}

impl WaitFor {
    /// `WAIT replicas timeout`: at least `replicas` (1..=1000) replicas have
    /// the write in memory.
    pub fn replicas(replicas: u32, timeout: Duration) -> Result<WaitFor, Invalid> {
        if !(1..=WAIT_REPLICAS_MAX).contains(&replicas) {
            let msg = format!("WAIT needs 1..={WAIT_REPLICAS_MAX} replicas, got {replicas}");
            return Err(Invalid::new("replicas", msg));
        }
        WaitFor::new(false, false, replicas, timeout)
    }

    /// `WAITAOF local replicas timeout` (Redis 7.2 or later): the primary's
    /// AOF (`local`, needs `appendonly yes`) and at least `replicas` replicas'
    /// AOFs have the write fsynced. At least one of the two must be asked for.
    pub fn aof(local: bool, replicas: u32, timeout: Duration) -> Result<WaitFor, Invalid> {
        if replicas > WAIT_REPLICAS_MAX || (!local && replicas == 0) {
            let msg = format!(
                "WAITAOF needs the local AOF or 1..={WAIT_REPLICAS_MAX} replicas, got local {local}, {replicas} replicas"
            );
            return Err(Invalid::new("replicas", msg));
        }
        WaitFor::new(true, local, replicas, timeout)
    }

    fn new(aof: bool, local: bool, replicas: u32, timeout: Duration) -> Result<WaitFor, Invalid> {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        if timeout_ms == 0 || timeout > WAIT_TIMEOUT_MAX {
            let msg = format!("must be 1 ms..={WAIT_TIMEOUT_MAX:?} (0 would wait forever), got {timeout:?}");
            return Err(Invalid::new("wait timeout", msg));
        }
        Ok(WaitFor {
            aof,
            local,
            replicas,
            timeout_ms,
        })
    }

    /// Replicas asked for.
    pub fn replica_count(&self) -> u32 {
        self.replicas
    }

    /// Whether this is `WAITAOF` asking for the primary's own AOF fsync.
    pub fn waits_for_local_aof(&self) -> bool {
        self.aof && self.local
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Checks, without writing, that the server accepts this wait: `WAITAOF`
    /// exists (Redis 7.2+), `appendonly` is on when the local AOF is asked
    /// for, the server is a primary. Run it once at start-up: after a write
    /// the same problem is a [`ArbiterError::WaitFailed`].
    pub async fn probe<C: ConnectionLike + Send>(&self, conn: &mut C) -> Result<(), ArbiterError> {
        let probe = WaitFor {
            replicas: 0,
            timeout_ms: 1,
            ..*self
        };
        match probe.command().query_async::<redis::Value>(conn).await {
            Ok(_) => Ok(()),
            Err(e) if e.code().is_some() => Err(Invalid::new("wait", self.explain(&e)).into()),
            Err(e) => Err(e.into()),
        }
    }

    fn command(&self) -> redis::Cmd {
        let mut cmd = redis::cmd(if self.aof { "WAITAOF" } else { "WAIT" });
        if self.aof {
            cmd.arg(u8::from(self.local));
        }
        cmd.arg(self.replicas).arg(self.timeout_ms);
        cmd
    }

    /// Why the server refused the wait, in words that say what to do.
    fn explain(&self, e: &redis::RedisError) -> String {
        let text = e.to_string();
        if self.aof && text.to_ascii_lowercase().contains("unknown command") {
            format!(
                "this server does not know WAITAOF (it needs Redis 7.2 or later; answered: {text}): wait for replicas with WaitFor::replicas (WAIT) instead"
            )
        } else if e.is_timeout() {
            format!(
                "no reply within the connection's response timeout ({text}): make it longer than the wait's {:?}",
                self.timeout()
            )
        } else {
            format!("the server refused {self}: {text}")
        }
    }

    /// Runs the wait after a write on `resource` that the primary applied.
    pub(super) async fn after_write<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        resource: &ResourceId,
    ) -> Result<(), ArbiterError> {
        let failed = |reason: String| ArbiterError::WaitFailed {
            resource: resource.clone(),
            wait: *self,
            reason,
        };
        let (local_aof, replicas) = if self.aof {
            match self.command().query_async::<(u8, u32)>(conn).await {
                Ok((local, replicas)) => (local >= 1, replicas),
                Err(e) => return Err(failed(self.explain(&e))),
            }
        } else {
            match self.command().query_async::<u32>(conn).await {
                Ok(replicas) => (false, replicas),
                Err(e) => return Err(failed(self.explain(&e))),
            }
        };
        if replicas >= self.replicas && (local_aof || !self.waits_for_local_aof()) {
            return Ok(());
        }
        Err(ArbiterError::NotAcknowledged {
            resource: resource.clone(),
            wait: *self,
            replicas,
            local_aof,
        })
    }
}

impl fmt::Display for WaitFor {
    /// The command as sent, e.g. `WAIT 1 500` or `WAITAOF 1 0 500`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.aof {
            write!(
                f,
                "WAITAOF {} {} {}",
                u8::from(self.local),
                self.replicas,
                self.timeout_ms
            )
        } else {
            write!(f, "WAIT {} {}", self.replicas, self.timeout_ms)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_commands() {
        let ms = Duration::from_millis;
        assert_eq!(WaitFor::replicas(1, ms(500)).expect("ok").to_string(), "WAIT 1 500");
        assert_eq!(WaitFor::aof(true, 0, ms(5)).expect("ok").to_string(), "WAITAOF 1 0 5");
        assert_eq!(WaitFor::aof(false, 2, ms(5)).expect("ok").to_string(), "WAITAOF 0 2 5");
        assert_eq!(WaitFor::replicas(0, ms(5)).expect_err("0").field(), "replicas");
        assert_eq!(WaitFor::replicas(1001, ms(5)).expect_err("many").field(), "replicas");
        assert_eq!(WaitFor::aof(false, 0, ms(5)).expect_err("nothing").field(), "replicas");
        for bad in [Duration::ZERO, Duration::from_micros(999), WAIT_TIMEOUT_MAX + ms(1)] {
            assert_eq!(WaitFor::replicas(1, bad).expect_err("timeout").field(), "wait timeout");
        }
    }
}
