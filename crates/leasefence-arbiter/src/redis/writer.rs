//! [`Writer`]: the fenced commands of one [`Via`], optionally followed by a
//! [`WaitFor`] after every admitted write. [`Via`]'s own methods are a
//! `Writer` that does not wait.

use leasefence_core::{Fence, FenceMode};
use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, ToRedisArgs};

use super::{Op, Via, WaitFor, call};
use crate::ArbiterError;

/// Fenced writes through [`Via`], each followed by the wait (if any) before
/// it is answered. A write that the wait does not see acknowledged comes
/// back as [`ArbiterError::NotAcknowledged`] (or
/// [`ArbiterError::WaitFailed`]): the primary applied it all the same. A
/// stale or refused call writes nothing and does not wait.
///
/// ```no_run
/// # async fn demo(conn: &mut redis::aio::MultiplexedConnection, fence: &leasefence_arbiter::Fence)
/// # -> Result<(), leasefence_arbiter::ArbiterError> {
/// use std::time::Duration;
/// use leasefence_arbiter::FenceMode;
/// use leasefence_arbiter::redis::{Via, WaitFor};
///
/// let writer = Via::Functions.wait_for(WaitFor::replicas(1, Duration::from_millis(200))?);
/// writer.set(conn, fence, FenceMode::Strict, "orders:{orders/42}:status", "shipped").await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Writer {
    via: Via,
    wait: Option<WaitFor>,
}

impl Writer {
    pub fn new(via: Via, wait: Option<WaitFor>) -> Writer {
        Writer { via, wait }
    }

    pub fn via(&self) -> Via {
        self.via
    }

    pub fn wait(&self) -> Option<WaitFor> {
        self.wait
    }

    /// Sends a fenced command and, once the primary applied it, waits.
    async fn run<C: ConnectionLike + Send, T: FromRedisValue>(
        &self,
        conn: &mut C,
        cmd: &Cmd,
        fence: &Fence,
    ) -> Result<T, ArbiterError> {
        let reply = call(conn, cmd, fence).await?;
        if let Some(wait) = &self.wait {
            // On the same connection: WAIT counts the replicas that have
            // every write this connection made, ours included.
            wait.after_write(conn, &fence.resource).await?;
        }
        Ok(reply)
    }

    /// Fenced `SET key value`.
    pub async fn set<C, V>(
        &self,
        conn: &mut C,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        value: V,
    ) -> Result<(), ArbiterError>
    where
        C: ConnectionLike + Send,
        V: ToRedisArgs,
    {
        let mut cmd = self.via.command(Op::Set, fence, mode, &[key]);
        cmd.arg(value);
        let _: redis::Value = self.run(conn, &cmd, fence).await?;
        Ok(())
    }

    /// Fenced `SET key value PX ttl`: the value expires after `ttl` (at least
    /// 1 ms, whole milliseconds); the fence itself never expires.
    pub async fn set_with_ttl<C, V>(
        &self,
        conn: &mut C,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        value: V,
        ttl: std::time::Duration,
    ) -> Result<(), ArbiterError>
    where
        C: ConnectionLike + Send,
        V: ToRedisArgs,
    {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 || ms > i64::MAX as u64 {
            return Err(
                leasefence_core::Invalid::new("ttl", format!("must be 1 ms..={} ms, got {ttl:?}", i64::MAX)).into(),
            );
        }
        let mut cmd = self.via.command(Op::Set, fence, mode, &[key]);
        cmd.arg(value).arg("PX").arg(ms);
        let _: redis::Value = self.run(conn, &cmd, fence).await?;
        Ok(())
    }

    /// Fenced `DEL keys...`; returns how many keys were removed. The token is
    /// recorded even if none existed.
    pub async fn del<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        fence: &Fence,
        mode: FenceMode,
        keys: &[&str],
    ) -> Result<u64, ArbiterError> {
        self.run(conn, &self.via.command(Op::Del, fence, mode, keys), fence)
            .await
    }

    /// Fenced `HSET key field value [field value ...]`; returns how many fields were added.
    pub async fn hset<C, F, V>(
        &self,
        conn: &mut C,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        fields: &[(F, V)],
    ) -> Result<u64, ArbiterError>
    where
        C: ConnectionLike + Send,
        F: ToRedisArgs,
        V: ToRedisArgs,
    {
        let mut cmd = self.via.command(Op::HSet, fence, mode, &[key]);
        for (f, v) in fields {
            cmd.arg(f).arg(v);
        }
        self.run(conn, &cmd, fence).await
    }

    /// Fenced `XADD stream id field value [field value ...]` (`id` is usually
    /// `*`); returns the entry id. (Raw callers may put XADD's options before
    /// the ID; `NOMKSTREAM` on a missing stream then replies nil and records
    /// no token.)
    pub async fn xadd<C, F, V>(
        &self,
        conn: &mut C,
        fence: &Fence,
        mode: FenceMode,
        stream: &str,
        id: &str,
        fields: &[(F, V)],
    ) -> Result<String, ArbiterError>
    where
        C: ConnectionLike + Send,
        F: ToRedisArgs,
        V: ToRedisArgs,
    {
        let mut cmd = self.via.command(Op::XAdd, fence, mode, &[stream]);
        cmd.arg(id);
        for (f, v) in fields {
            cmd.arg(f).arg(v);
        }
        self.run(conn, &cmd, fence).await
    }
}
