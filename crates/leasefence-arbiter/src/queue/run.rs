//! Running a handler on one delivery and reporting its verdict, and the
//! consume loop of the brokers: the I/O side of [`crate::queue`].

use leasefence_core::{Fence, Invalid};

use super::{HandleError, Handled, Message, Settings, Verdict, require_fence};
#[cfg(any(feature = "nats", feature = "amqp"))]
use super::{QueueError, Tally};

/// Runs the handler on a delivery whose fence headers read as `fence`, or
/// answers [`Verdict::Unfenced`] without it. With [`observe`] after the
/// settle, the whole of a consumer for a broker of your own.
pub async fn run_handler<H, Fut>(fence: Result<Option<Fence>, Invalid>, message: Message, handler: &H) -> Verdict
where
    H: Fn(Fence, Message) -> Fut,
    Fut: Future<Output = Result<Handled, HandleError>>,
{
    match require_fence(fence) {
        Ok(fence) => Verdict::of_result(&handler(fence, message).await),
        Err(verdict) => verdict,
    }
}

/// Counts and logs a settled delivery; hands a stale one to the callback.
/// `id` is the message id for the log (not a secret: chosen by publishers).
pub fn observe(settings: &Settings, id: Option<&str>, verdict: &Verdict) {
    let queue = settings.queue.as_str();
    metrics::counter!(verdict.metric(), "queue" => queue.to_owned()).increment(1);
    let id = id.unwrap_or("-");
    match verdict {
        Verdict::Applied | Verdict::Duplicate => {
            tracing::debug!(queue, message_id = id, ?verdict, "fenced message settled")
        }
        Verdict::Stale(s) => {
            tracing::warn!(
                queue,
                message_id = id,
                resource = %s.resource.shown(),
                presented = s.presented.get(),
                current = s.current.get(),
                "stale message rejected and acknowledged: a newer holder has acted on the resource"
            );
            if let Some(f) = &settings.on_stale {
                f(s);
            }
        }
        Verdict::Unfenced(why) => tracing::warn!(queue, message_id = id, reason = %why, "unfenced message dropped"),
        Verdict::Poison(why) => tracing::warn!(queue, message_id = id, reason = %why, "poison message dropped"),
        Verdict::Retry(why) => tracing::info!(queue, message_id = id, reason = %why, "message requeued to retry"),
        Verdict::Failed(why) => {
            tracing::error!(queue, message_id = id, reason = %why, "message requeued after a failure")
        }
    }
}

/// Consecutive receive errors after which a consumer gives up.
pub const RECEIVE_ERRORS_MAX: u32 = 5;

/// The loop of `nats::consume` and `amqp::consume`: one item at a time
/// until `shutdown` completes or `items` ends. A receive error is logged,
/// and [`RECEIVE_ERRORS_MAX`] in a row end the loop with the last one; a
/// failed settle is logged and the loop goes on (the broker redelivers).
#[cfg(any(feature = "nats", feature = "amqp"))]
pub(crate) async fn consume_loop<T, F, Fut>(
    mut items: impl futures_util::Stream<Item = Result<T, QueueError>> + Unpin,
    settings: &Settings,
    shutdown: impl Future<Output = ()>,
    mut handle: F,
) -> Result<Tally, QueueError>
where
    F: FnMut(T) -> Fut,
    Fut: Future<Output = Result<Verdict, QueueError>>,
{
    use futures_util::StreamExt;

    let mut tally = Tally::default();
    let mut errors = 0;
    tokio::pin!(shutdown);
    loop {
        let next = tokio::select! {
            biased;
            () = &mut shutdown => break,
            next = items.next() => next,
        };
        let item = match next {
            None => break,
            Some(Ok(item)) => item,
            Some(Err(e)) => {
                errors += 1;
                tracing::warn!(queue = settings.queue(), error = %e, "receiving from the broker failed");
                if errors >= RECEIVE_ERRORS_MAX {
                    return Err(e);
                }
                continue;
            }
        };
        errors = 0;
        match handle(item).await {
            Ok(verdict) => tally.add(&verdict),
            Err(e) => {
                tracing::error!(queue = settings.queue(), error = %e, "message not settled; it will be redelivered")
            }
        }
    }
    Ok(tally)
}
