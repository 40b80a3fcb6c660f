//! One call, retried across the coordinators a client knows as far as that is
//! safe, inside the call's deadline.
//!
//! The policy (also in the crate docs):
//! - An answer that proves nothing was done — a standby's not-leader
//!   refusal, or a failure to connect before the request left — is retried
//!   for every call: after a hint at once on the coordinator it names, else
//!   on the next coordinator after a short backoff.
//! - Any other transport failure (the connection broke after the request was
//!   sent, no answer in time, a coordinator that cannot reach its engine) may
//!   hide a call that was carried out. Only [`Safety::Idempotent`] calls
//!   (`renew`, `release`, `status`, opening a stream) are retried after it;
//!   an `acquire` is not: its grant may have happened, under a lease id the
//!   caller would never learn.
//! - At most [`attempts_max`] attempts, all within the call's deadline.

use std::future::Future;
use std::time::Duration;

use tokio::time::{sleep, timeout};

use crate::Client;
use crate::coordinators::{COORDINATORS_MAX, Failure, classify};

/// First wait before retrying on another coordinator.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// Longest wait between two attempts.
const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// Which failures a call may be retried after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Safety {
    /// Retried only after an answer proving it was not carried out.
    Once,
    /// Carrying it out twice does no harm: retried after any transport failure.
    Idempotent,
}

/// How many attempts a call makes when `known` coordinators are known: two
/// per coordinator (a takeover may need a second look), at least three.
pub(crate) fn attempts_max(known: usize) -> u32 {
    let n = u32::try_from(known.min(COORDINATORS_MAX)).unwrap_or(u32::MAX);
    (2 * n).max(3)
}

/// Why a call failed in the end.
#[derive(Debug)]
pub(crate) enum Failed {
    /// Its last attempt, on `url`, failed with `status`; `attempts` were made.
    Status {
        url: String,
        status: tonic::Status,
        failure: Failure,
        attempts: u32,
    },
    /// No answer within the call's deadline `limit`; `last` is the failure
    /// of the attempt before, if there was one.
    NoAnswer {
        url: String,
        limit: Duration,
        last: Option<String>,
    },
}

/// What the attempts so far have seen, kept outside the deadline's future.
struct Trace {
    url: String,
    last: Option<String>,
}

impl Client {
    /// Runs `attempt` on the coordinator believed active until it succeeds,
    /// fails in a way `safety` does not allow to retry, runs out of
    /// attempts, or `limit` passes. With several coordinators known, an
    /// idempotent call gives each attempt at most half of `limit`, so a
    /// coordinator that stopped answering does not use it all.
    pub(crate) async fn attempts<T, F, Fut>(&self, limit: Duration, safety: Safety, mut attempt: F) -> Result<T, Failed>
    where
        F: FnMut(crate::GrpcClient) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut trace = Trace {
            url: self.coordinators.pick().url,
            last: None,
        };
        let each = (safety == Safety::Idempotent && self.coordinators.len() > 1).then_some(limit / 2);
        let run = async {
            let mut backoff = BACKOFF_MIN;
            let mut made = 0u32;
            loop {
                let pick = self.coordinators.pick();
                trace.url.clone_from(&pick.url);
                made += 1;
                let answer = match each {
                    None => attempt(pick.grpc).await,
                    Some(d) => timeout(d, attempt(pick.grpc)).await.unwrap_or_else(|_| {
                        Err(tonic::Status::unavailable(format!(
                            "no answer within {} ms",
                            d.as_millis()
                        )))
                    }),
                };
                let status = match answer {
                    Ok(reply) => return Ok(reply.into_inner()),
                    Err(status) => status,
                };
                let failure = classify(&status);
                let retry =
                    failure.proves_nothing_done() || (failure == Failure::Ambiguous && safety == Safety::Idempotent);
                if !retry || made >= attempts_max(self.coordinators.len()) {
                    return Err(Failed::Status {
                        url: pick.url,
                        status,
                        failure,
                        attempts: made,
                    });
                }
                tracing::debug!(url = %pick.url, code = ?status.code(), "trying another coordinator");
                trace.last = Some(format!("{}: {}", pick.url, status.message()));
                if !self.coordinators.failed(pick.index, &failure) {
                    sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        };
        let outcome = timeout(limit, run).await;
        match outcome {
            Ok(done) => done,
            Err(_) => Err(Failed::NoAnswer {
                url: trace.url,
                limit,
                last: trace.last,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_are_bounded_by_the_coordinators_known() {
        assert_eq!(attempts_max(1), 3);
        assert_eq!(attempts_max(2), 4);
        assert_eq!(attempts_max(3), 6);
        assert_eq!(attempts_max(1_000), 2 * 16);
    }
}
