//! Applying a queue message at most once where its effect is a PostgreSQL
//! transaction: the message id is committed in the table
//! `leasefence_consumed` in the same transaction as the effect and the
//! fence, so a redelivery of an applied message (its ack was lost, the
//! consumer crashed before acking) finds the row and applies nothing.
//!
//! The insert takes the row's key lock, so two deliveries of one message in
//! flight at once (a redelivery after the ack wait while the first is still
//! working) cannot both apply: the second waits for the first to commit and
//! then sees a duplicate, or inserts if the first rolled back.

use std::time::Duration;

use leasefence_core::{Fence, FenceMode, Invalid};
use tokio_postgres::{Client, GenericClient, Transaction};

use super::{EffectFuture, Schema};
use crate::ArbiterError;
use crate::queue::Handled;

/// Longest consumer name and message id stored, in bytes.
pub const CONSUMED_KEY_LEN_MAX: usize = 512;

/// Whether [`with_fence_once`] ran the effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Once<T> {
    /// First time: the effect ran and committed with the fence and the id.
    Applied(T),
    /// The message had been applied before: nothing ran, nothing committed.
    Duplicate,
}

impl<T> From<Once<T>> for Handled {
    fn from(once: Once<T>) -> Handled {
        match once {
            Once::Applied(_) => Handled::Applied,
            Once::Duplicate => Handled::Duplicate,
        }
    }
}

/// Records `message_id` as consumed by `consumer` inside `tx`: `true` the
/// first time, `false` when the row exists (committed by an earlier
/// delivery). The row commits or rolls back with `tx`, so call it in the
/// transaction of the message's effect; on `false`, roll back and apply
/// nothing.
pub async fn claim_message(tx: &Transaction<'_>, consumer: &str, message_id: &str) -> Result<bool, ArbiterError> {
    Schema::PUBLIC.claim_message(tx, consumer, message_id).await
}

/// Begins a transaction, claims `message_id` for `consumer`
/// ([`claim_message`]), admits `fence` and runs `effect`, then commits all
/// three; a message claimed before is [`Once::Duplicate`] and nothing runs.
/// A stale fence is [`ArbiterError::Stale`], and then neither the effect
/// nor the claim commits.
pub async fn with_fence_once<T, E, F>(
    client: &mut Client,
    consumer: &str,
    message_id: &str,
    fence: &Fence,
    mode: FenceMode,
    effect: F,
) -> Result<Once<T>, E>
where
    E: From<ArbiterError>,
    F: for<'t> FnOnce(&'t Transaction<'t>) -> EffectFuture<'t, T, E>,
{
    Schema::PUBLIC
        .with_fence_once(client, consumer, message_id, fence, mode, effect)
        .await
}

/// Deletes the claims of `consumer` older than `age`, and says how many.
/// Only safe past the broker's redelivery horizon: a message still queued
/// or unacked somewhere must keep its row.
pub async fn prune_consumed(client: &impl GenericClient, consumer: &str, age: Duration) -> Result<u64, ArbiterError> {
    Schema::PUBLIC.prune_consumed(client, consumer, age).await
}

fn check_key(field: &'static str, value: &str) -> Result<(), ArbiterError> {
    if value.is_empty() || value.len() > CONSUMED_KEY_LEN_MAX {
        let message = format!("must be 1..={CONSUMED_KEY_LEN_MAX} bytes, got {}", value.len());
        return Err(Invalid::new(field, message).into());
    }
    Ok(())
}

impl Schema {
    /// [`claim_message`] in this schema.
    pub async fn claim_message(
        &self,
        tx: &Transaction<'_>,
        consumer: &str,
        message_id: &str,
    ) -> Result<bool, ArbiterError> {
        check_key("consumer", consumer)?;
        check_key("message_id", message_id)?;
        let sql = format!(
            "INSERT INTO {} (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            self.qualify("leasefence_consumed")
        );
        let inserted = tx
            .execute(&sql, &[&consumer, &message_id])
            .await
            .map_err(|e| self.classify(e))?;
        Ok(inserted == 1)
    }

    /// [`with_fence_once`] in this schema.
    pub async fn with_fence_once<T, E, F>(
        &self,
        client: &mut Client,
        consumer: &str,
        message_id: &str,
        fence: &Fence,
        mode: FenceMode,
        effect: F,
    ) -> Result<Once<T>, E>
    where
        E: From<ArbiterError>,
        F: for<'t> FnOnce(&'t Transaction<'t>) -> EffectFuture<'t, T, E>,
    {
        let tx = client.transaction().await.map_err(ArbiterError::from)?;
        if !self.claim_message(&tx, consumer, message_id).await? {
            return Ok(Once::Duplicate);
        }
        self.admit(&tx, fence, mode).await?;
        let out = effect(&tx).await?;
        tx.commit().await.map_err(ArbiterError::from)?;
        Ok(Once::Applied(out))
    }

    /// [`prune_consumed`] in this schema.
    pub async fn prune_consumed(
        &self,
        client: &impl GenericClient,
        consumer: &str,
        age: Duration,
    ) -> Result<u64, ArbiterError> {
        check_key("consumer", consumer)?;
        let sql = format!(
            "DELETE FROM {} WHERE consumer = $1 AND consumed_at < now() - make_interval(secs => $2)",
            self.qualify("leasefence_consumed")
        );
        let secs = age.as_secs_f64();
        client
            .execute(&sql, &[&consumer, &secs])
            .await
            .map_err(|e| self.classify(e))
    }
}
