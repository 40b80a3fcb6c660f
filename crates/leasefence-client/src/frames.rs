//! [`FrameClient`]: the one-call methods over the frame protocol
//! (`leasefence://HOST:PORT`, or `leasefences://` over TLS), for callers that
//! make many short cycles and want the least transport cost per call. The
//! coordinator serves it with `serve --frames-listen`.
//!
//! Answers and refusals are the same values as [`crate::Client`]'s. What it
//! does not do (use [`crate::Client`] for these): keep-alive sessions,
//! watches, elections and force-release.
//!
//! Several coordinators ([`FrameClient::connect_any`], their frame ports):
//! calls go to the one believed active; a standby's `not_leader` refusal or
//! a failed connect (nothing was done) moves the client on to the next, at
//! once and then after a short backoff, at most two attempts per
//! coordinator (at least three), all within the call's deadline. A
//! standby's hint names the active coordinator's main-port URL, not its
//! frame port, so the client tries its list in turn instead.
//!
//! Connections: one call in flight on each; a call takes an idle connection
//! or opens one, and gives it back after a whole answer, so concurrent
//! callers on one client (it is cheap to clone) each get their own. An idle
//! connection the coordinator closed meanwhile (after a restart, say), or
//! that TCP keepalive found dead (its host gone without a word), is dropped
//! when a call looks for one, before anything is sent on it; so is one the
//! coordinator said it is closing for being idle (version 2 of the
//! protocol; a request that crossed that notice is still answered). Every
//! call has the deadline of [`ClientOptions::call_timeout`] (plus the wait
//! of an acquire); a connection whose call failed or timed out is dropped.
//!
//! Retries follow the rules of the gRPC client: what proves nothing was
//! done (above) is retried for every call. After anything else that may
//! hide a call carried out — a connection that broke after the request
//! left (a close that came too late to be seen before sending is one), no
//! answer in time, `unavailable`, `outcome_unknown` — `renew`, `release`
//! and `status` are tried again, and `acquire` is not, since the grant may
//! have happened: its error says the outcome is unknown.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasefence_core::{Holder, Invalid, LeaseId, ResourceId, Token};
use leasefence_proto::frame::{Refusal, Request, Response, STRING_MAX};
use tokio::time::Instant;

use crate::retry::{Safety, attempts_max};
use crate::{COORDINATORS_MAX, ClientError, ClientOptions, LeaseInfo, StatusInfo};

mod conn;

use conn::{Endpoint, Exchange, exchange};

/// First wait before going round the coordinators again.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// Longest wait between two rounds.
const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// A client of one or several coordinators' frame ports; cheap to clone
/// (clones share the connections and the belief of which is active).
#[derive(Clone)]
pub struct FrameClient {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<Endpoint>,
    /// The index of the coordinator believed active.
    active: AtomicUsize,
    options: ClientOptions,
}

impl std::fmt::Debug for FrameClient {
    // Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameClient")
            .field("coordinators", &self.coordinators())
            .finish()
    }
}

/// How one attempt ended, when it did not answer.
enum Attempt {
    /// Nothing was done: another coordinator may be tried for any call.
    Unsent(ClientError),
    /// It may have been carried out.
    Ambiguous(ClientError),
    /// An answer that stands.
    Final(ClientError),
}

impl FrameClient {
    /// Connects to `url` (`leasefence://HOST:PORT` or `leasefences://HOST:PORT`)
    /// with `options` (its token, TLS settings and timeouts), and fails if
    /// the coordinator cannot be reached or refuses the connection.
    pub async fn connect(url: &str, options: ClientOptions) -> Result<FrameClient, ClientError> {
        let client = FrameClient::connect_any(&[url], options)?;
        let endpoint = &client.inner.endpoints[0];
        let conn = endpoint.open(&client.inner.options).await?;
        endpoint.put_back(conn);
        Ok(client)
    }

    /// A client of several coordinators' frame ports (the active one and its
    /// standbys on one shared store). Nothing is connected yet, so
    /// coordinators that are down do not stop it; an empty or too long list
    /// (more than [`COORDINATORS_MAX`]) or a URL that is not `leasefence(s)://`
    /// is refused (field `server`). Duplicates count once.
    pub fn connect_any<S: AsRef<str>>(urls: &[S], options: ClientOptions) -> Result<FrameClient, ClientError> {
        options.check()?;
        // A frame carries strings of at most STRING_MAX bytes; a longer token
        // would reach the coordinator cut short and name nobody.
        if options.credentials().token().is_some_and(|t| t.len() > STRING_MAX) {
            let allowed = format!("longer than the frame protocol carries; allowed: at most {STRING_MAX} bytes");
            return Err(Invalid::new("token", allowed).into());
        }
        if urls.is_empty() {
            let allowed = "no coordinator given; allowed: one or more URLs like leasefence://127.0.0.1:7742";
            return Err(Invalid::new("server", allowed).into());
        }
        let mut endpoints: Vec<Endpoint> = Vec::new();
        for url in urls {
            let url = url.as_ref();
            if endpoints.iter().any(|e| e.url == url) {
                continue;
            }
            if endpoints.len() == COORDINATORS_MAX {
                let many = format!("more than {COORDINATORS_MAX} coordinators given");
                return Err(Invalid::new("server", many).into());
            }
            endpoints.push(Endpoint::new(url, &options)?);
        }
        Ok(FrameClient {
            inner: Arc::new(Inner {
                endpoints,
                active: AtomicUsize::new(0),
                options,
            }),
        })
    }

    /// The frame URLs this client knows, in the order given.
    pub fn coordinators(&self) -> Vec<String> {
        self.inner.endpoints.iter().map(|e| e.url.clone()).collect()
    }

    /// The coordinator the next call goes to first.
    pub fn active(&self) -> String {
        self.endpoint(self.inner.active.load(Ordering::Relaxed)).url.clone()
    }

    /// Acquires `resource` for `ttl`, waiting up to `wait` (zero: fail at
    /// once if busy), as [`crate::Client::acquire`].
    pub async fn acquire(
        &self,
        resource: &ResourceId,
        ttl: Duration,
        holder: Option<&Holder>,
        wait: Duration,
    ) -> Result<LeaseInfo, ClientError> {
        let req = Request::Acquire {
            resource: resource.to_string(),
            holder: holder.map(|h| h.to_string()).unwrap_or_default(),
            ttl_ms: millis(ttl),
            wait_ms: millis(wait),
            lock_delay_ms: 0,
        };
        let limit = wait.saturating_add(self.inner.options.call_timeout());
        let answer = self.call(resource, &req, limit, Safety::Once).await?;
        lease_info(resource, answer)
    }

    pub async fn renew(&self, resource: &ResourceId, lease_id: &LeaseId) -> Result<LeaseInfo, ClientError> {
        let req = Request::Renew {
            resource: resource.to_string(),
            lease_id: *lease_id,
        };
        let answer = self.call(resource, &req, self.timeout(), Safety::Idempotent).await?;
        lease_info(resource, answer)
    }

    /// Releases the lease; returns its token.
    pub async fn release(&self, resource: &ResourceId, lease_id: &LeaseId) -> Result<Token, ClientError> {
        let req = Request::Release {
            resource: resource.to_string(),
            lease_id: *lease_id,
        };
        match self.call(resource, &req, self.timeout(), Safety::Idempotent).await? {
            Response::Released { token } => Token::new(token).ok_or_else(|| server("released token 0")),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn status(&self, resource: &ResourceId) -> Result<StatusInfo, ClientError> {
        let req = Request::Status {
            resource: resource.to_string(),
        };
        let Response::Status {
            last_token,
            held,
            waiters,
        } = self.call(resource, &req, self.timeout(), Safety::Idempotent).await?
        else {
            return Err(server("the answer to a status request was not a status"));
        };
        let held = match held {
            None => None,
            Some(h) => Some((
                Holder::new(&h.holder).map_err(|_| server("malformed holder"))?,
                Token::new(h.token).ok_or_else(|| server("held token 0"))?,
                Duration::from_millis(h.expires_in_ms),
            )),
        };
        Ok(StatusInfo {
            resource: resource.clone(),
            last_token: Token::new(last_token),
            held,
            waiters,
        })
    }

    fn timeout(&self) -> Duration {
        self.inner.options.call_timeout()
    }

    fn endpoint(&self, index: usize) -> &Endpoint {
        &self.inner.endpoints[index % self.inner.endpoints.len()]
    }

    /// Sends `req` to the coordinator believed active and moves on as the
    /// module docs say, until an answer, a failure `safety` does not allow
    /// to retry, the last attempt, or `limit`.
    async fn call(
        &self,
        resource: &ResourceId,
        req: &Request,
        limit: Duration,
        safety: Safety,
    ) -> Result<Response, ClientError> {
        let deadline = deadline_after(limit);
        let known = self.inner.endpoints.len();
        let rounds = u32::try_from(known).unwrap_or(u32::MAX);
        let mut backoff = BACKOFF_MIN;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let index = self.inner.active.load(Ordering::Relaxed);
            let endpoint = self.endpoint(index);
            let mut left = deadline.saturating_duration_since(Instant::now());
            if known > 1 && safety == Safety::Idempotent {
                // A coordinator that stopped answering does not use the whole deadline.
                left = left.min(limit / 2);
            }
            let failed = match self.attempt(endpoint, resource, req, left, safety).await {
                Ok(answer) => return Ok(answer),
                Err(Attempt::Final(e)) => return Err(e),
                Err(Attempt::Ambiguous(e)) if safety == Safety::Once => return Err(e),
                Err(Attempt::Unsent(e) | Attempt::Ambiguous(e)) => e,
            };
            if attempt >= attempts_max(known) || Instant::now() >= deadline {
                return Err(failed);
            }
            // Believe the next one active (unless another caller moved on already).
            let _ =
                self.inner
                    .active
                    .compare_exchange(index, (index + 1) % known, Ordering::Relaxed, Ordering::Relaxed);
            // Once every coordinator had its turn, wait before the next round.
            if attempt % rounds == 0 {
                tokio::time::sleep(backoff.min(deadline.saturating_duration_since(Instant::now()))).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    /// One attempt on `endpoint`, within `limit`: on an idle connection of
    /// its pool, else a new one.
    async fn attempt(
        &self,
        endpoint: &Endpoint,
        resource: &ResourceId,
        req: &Request,
        limit: Duration,
        safety: Safety,
    ) -> Result<Response, Attempt> {
        let options = &self.inner.options;
        let pooled = endpoint.take_idle();
        let reused = pooled.is_some();
        let mut conn = match pooled {
            Some(c) => c,
            None => endpoint.open(options).await.map_err(|e| match e {
                e @ ClientError::Transport { .. } => Attempt::Unsent(e),
                e => Attempt::Final(e),
            })?,
        };
        let mut sent = exchange(&mut conn, req, limit).await;
        // A pooled connection that broke with the request sent (a close seen
        // too late): once more on a new one, for a call safe to repeat.
        if reused && safety == Safety::Idempotent && matches!(sent, Err(Exchange::Io(_) | Exchange::Closed)) {
            conn = endpoint.open(options).await.map_err(Attempt::Unsent)?;
            sent = exchange(&mut conn, req, limit).await;
        }
        match sent {
            Ok(Response::Refused(r)) => {
                endpoint.put_back(conn);
                Err(refusal(endpoint, resource, r))
            }
            Ok(answer) => {
                endpoint.put_back(conn);
                Ok(answer)
            }
            Err(e) => {
                let what = e.describe(limit);
                Err(Attempt::Ambiguous(endpoint.transport(match safety {
                    Safety::Idempotent => what,
                    Safety::Once => format!("{what}; the request may have been carried out (outcome unknown)"),
                })))
            }
        }
    }
}

/// The error a refusal stands for, as the gRPC client reports it, and
/// whether another coordinator may be tried.
fn refusal(endpoint: &Endpoint, resource: &ResourceId, r: Refusal) -> Attempt {
    if let Some(e) = r.to_lease(resource) {
        return Attempt::Final(ClientError::Lease(e));
    }
    match r.kind.as_str() {
        "unauthenticated" | "permission_denied" | "limit_exceeded" => Attempt::Final(ClientError::Refused {
            kind: r.kind,
            message: r.message,
        }),
        "not_leader" => Attempt::Unsent(endpoint.transport(r.message)),
        // As over gRPC: a coordinator stopping or cut off from its store may have begun the call.
        "unavailable" | "outcome_unknown" => Attempt::Ambiguous(endpoint.transport(r.message)),
        _ => Attempt::Final(ClientError::Server(r.message)),
    }
}

fn lease_info(resource: &ResourceId, answer: Response) -> Result<LeaseInfo, ClientError> {
    let (token, lease_id, holder, ttl_ms, expires_in_ms, signature) = match answer {
        Response::Lease {
            token,
            lease_id,
            holder,
            ttl_ms,
            expires_in_ms,
            signature,
        } => (token, lease_id, holder, ttl_ms, expires_in_ms, signature),
        other => return Err(unexpected(&other)),
    };
    Ok(LeaseInfo {
        resource: resource.clone(),
        token: Token::new(token).ok_or_else(|| server("granted token 0"))?,
        lease_id,
        holder: Holder::new(&holder).map_err(|_| server("malformed holder"))?,
        ttl: Duration::from_millis(ttl_ms),
        expires_in: Duration::from_millis(expires_in_ms),
        signature: crate::calls::lease_signature(signature)?,
    })
}

fn unexpected(r: &Response) -> ClientError {
    server(&format!("unexpected answer {r:?}"))
}

fn server(message: &str) -> ClientError {
    ClientError::Server(message.to_string())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The moment `limit` from now. A limit past what the clock can hold (a
/// `Duration::MAX` wait: "forever") is a deadline a century away, not a
/// panic: the coordinator bounds every wait anyway.
fn deadline_after(limit: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    let now = Instant::now();
    now.checked_add(limit).unwrap_or_else(|| now + FAR)
}

#[cfg(test)]
#[path = "frames/keepalive_tests.rs"]
mod keepalive_tests;

#[cfg(test)]
#[path = "frames/closing_tests.rs"]
mod closing_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(signature: &str) -> Response {
        Response::Lease {
            token: 1,
            lease_id: LeaseId::from_bytes([1; 16]),
            holder: "w".into(),
            ttl_ms: 1000,
            expires_in_ms: 900,
            signature: signature.into(),
        }
    }

    #[test]
    fn a_lease_whose_signature_is_malformed_is_refused_as_over_grpc() {
        let r = ResourceId::new("r").expect("resource");
        assert_eq!(lease_info(&r, lease("")).expect("unsigned").signature, None);
        let good = format!("v1.k1.{}", "ab".repeat(32));
        assert_eq!(lease_info(&r, lease(&good)).expect("signed").signature, Some(good));
        for bad in ["garbage", "v2.k1.00", "v1.k1.00", "v1.K!.00"] {
            match lease_info(&r, lease(bad)) {
                Err(ClientError::Server(m)) => assert!(m.contains("malformed lease: signature"), "{bad}: {m}"),
                other => panic!("{bad}: expected a malformed signature, got {other:?}"),
            }
        }
    }
}
