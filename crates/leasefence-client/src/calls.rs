//! The one-call methods of [`Client`] (`acquire`, `renew`, `release`,
//! `status`): each one unary call, retried across coordinators as the
//! retry policy of the crate docs allows, and the mapping of how it failed to a
//! [`ClientError`].

use std::future::Future;
use std::time::Duration;

use leasefence_core::{Holder, LeaseId, ResourceId, Token};
use leasefence_proto::status_to_error;
use leasefence_proto::v1::{self as pb};

use crate::coordinators::{Failure, classify};
use crate::retry::{Failed, Safety};
use crate::{Client, ClientError, LeaseConfig, LeaseInfo, StatusInfo};

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Client {
    /// Runs one unary call with the retries `safety` allows, all within
    /// `limit`; an answer that does not come in time is a transport error
    /// (the call is cancelled).
    async fn call<T, F, Fut>(
        &self,
        resource: &ResourceId,
        limit: Duration,
        safety: Safety,
        attempt: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(crate::GrpcClient) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.attempts(limit, safety, attempt)
            .await
            .map_err(|f| failed_error(resource, f, safety))
    }

    fn lease_info(&self, resource: &ResourceId, l: pb::Lease) -> Result<LeaseInfo, ClientError> {
        let bad = |what: &str| ClientError::Server(format!("coordinator sent a malformed lease: {what}"));
        Ok(LeaseInfo {
            resource: resource.clone(),
            token: Token::new(l.token).ok_or_else(|| bad("token 0"))?,
            lease_id: LeaseId::parse_hex(&l.lease_id).map_err(|_| bad("lease_id"))?,
            holder: Holder::new(&l.holder).map_err(|_| bad("holder"))?,
            ttl: Duration::from_millis(l.ttl_ms),
            expires_in: Duration::from_millis(l.expires_in_ms),
            signature: lease_signature(l.signature)?,
        })
    }

    /// Acquires `resource` for `ttl`, waiting up to `wait` (zero: fail at once if busy).
    pub async fn acquire(
        &self,
        resource: &ResourceId,
        ttl: Duration,
        holder: Option<&Holder>,
        wait: Duration,
    ) -> Result<LeaseInfo, ClientError> {
        let config = LeaseConfig::new(ttl).with_wait(wait);
        let config = match holder {
            Some(h) => config.with_holder(h.clone()),
            None => config,
        };
        self.acquire_with(resource, &config).await
    }

    /// Acquires `resource` once as `config` says (TTL, wait, holder,
    /// lock-delay), without a keep-alive: see [`Client::lease`] for that.
    pub async fn acquire_with(&self, resource: &ResourceId, config: &LeaseConfig) -> Result<LeaseInfo, ClientError> {
        let req = pb::AcquireRequest {
            resource: resource.to_string(),
            ttl_ms: duration_ms(config.ttl()),
            holder: config.holder().map(|h| h.to_string()).unwrap_or_default(),
            wait_ms: duration_ms(config.wait()),
            lock_delay_ms: duration_ms(config.lock_delay()),
        };
        // The coordinator may hold the call for `wait` before it answers.
        let limit = config.wait().saturating_add(self.options.call_timeout());
        let reply = self
            .call(resource, limit, Safety::Once, |mut grpc| {
                let req = req.clone();
                async move { grpc.acquire(req).await }
            })
            .await?;
        self.lease_info(resource, reply)
    }

    pub async fn renew(&self, resource: &ResourceId, lease_id: &LeaseId) -> Result<LeaseInfo, ClientError> {
        let req = pb::RenewRequest {
            resource: resource.to_string(),
            lease_id: lease_id.to_hex(),
        };
        let reply = self
            .call(resource, self.options.call_timeout(), Safety::Idempotent, |mut grpc| {
                let req = req.clone();
                async move { grpc.renew(req).await }
            })
            .await?;
        self.lease_info(resource, reply)
    }

    /// Releases the lease; returns its token.
    pub async fn release(&self, resource: &ResourceId, lease_id: &LeaseId) -> Result<Token, ClientError> {
        let req = pb::ReleaseRequest {
            resource: resource.to_string(),
            lease_id: lease_id.to_hex(),
        };
        let reply = self
            .call(resource, self.options.call_timeout(), Safety::Idempotent, |mut grpc| {
                let req = req.clone();
                async move { grpc.release(req).await }
            })
            .await?;
        Token::new(reply.token).ok_or_else(|| ClientError::Server("released token 0".into()))
    }

    /// Ends `resource`'s lease whoever holds it (needs `admin` where access
    /// control is on): the token of the lease that ended, `None` if none
    /// was held. Not retried after an ambiguous failure: a second try
    /// could end the next holder's lease.
    pub async fn force_release(&self, resource: &ResourceId) -> Result<Option<Token>, ClientError> {
        let req = pb::ForceReleaseRequest {
            resource: resource.to_string(),
        };
        let reply = self
            .call(resource, self.options.call_timeout(), Safety::Once, |mut grpc| {
                let req = req.clone();
                async move { grpc.force_release(req).await }
            })
            .await?;
        Ok(Token::new(reply.token).filter(|_| reply.released))
    }

    pub async fn status(&self, resource: &ResourceId) -> Result<StatusInfo, ClientError> {
        let req = pb::GetRequest {
            resource: resource.to_string(),
        };
        let s = self
            .call(resource, self.options.call_timeout(), Safety::Idempotent, |mut grpc| {
                let req = req.clone();
                async move { grpc.get(req).await }
            })
            .await?;
        let held = match s.held {
            None => None,
            Some(h) => Some((
                Holder::new(&h.holder).map_err(|_| ClientError::Server("malformed holder".into()))?,
                Token::new(h.token).ok_or_else(|| ClientError::Server("held token 0".into()))?,
                Duration::from_millis(h.expires_in_ms),
            )),
        };
        Ok(StatusInfo {
            resource: resource.clone(),
            last_token: Token::new(s.last_token),
            held,
            waiters: s.waiters,
        })
    }
}

/// The client error for a call that failed as `f`.
fn failed_error(resource: &ResourceId, f: Failed, safety: Safety) -> ClientError {
    let (url, status, failure, attempts) = match f {
        Failed::NoAnswer { url, limit, last } => {
            let before = last.map(|l| format!("; before that {l}")).unwrap_or_default();
            return ClientError::Transport {
                url,
                message: format!("no answer within {} ms (the call timeout){before}", limit.as_millis()),
            };
        }
        Failed::Status {
            url,
            status,
            failure,
            attempts,
        } => (url, status, failure, attempts),
    };
    if let Some(message) = crate::tls::mismatch(&url, &status) {
        return ClientError::Transport { url, message };
    }
    status_error(resource, &status).unwrap_or_else(|| {
        let detail = status_chain(&status);
        let message = match failure {
            Failure::NotLeader { .. } => format!("{detail} (no active coordinator found in {attempts} attempts)"),
            Failure::Ambiguous if safety == Safety::Once => format!(
                "{detail}; not retried: the request may have been carried out (an acquire may have \
                 been granted under a lease id never received: it expires after its TTL)"
            ),
            _ if attempts > 1 => format!("{detail} (the last of {attempts} attempts)"),
            _ => detail,
        };
        ClientError::Transport { url, message }
    })
}

/// A status's message and the causes tonic kept ("connection refused"
/// hides in a source), each once.
fn status_chain(s: &tonic::Status) -> String {
    let mut out = s.message().to_string();
    let mut cur = std::error::Error::source(s);
    while let Some(e) = cur {
        let cause = e.to_string();
        if !out.contains(&cause) {
            out.push_str(": ");
            out.push_str(&cause);
        }
        cur = e.source();
    }
    out
}

/// A status as a lease refusal or a coordinator error; `None` for a
/// transport failure (unreachable, no answer, not the leader).
pub(crate) fn status_error(resource: &ResourceId, s: &tonic::Status) -> Option<ClientError> {
    if let Some(e) = status_to_error(resource, s) {
        return Some(ClientError::Lease(e));
    }
    let kind = s
        .metadata()
        .get(leasefence_proto::META_ERROR)
        .and_then(|v| v.to_str().ok());
    if let Some(kind @ ("unauthenticated" | "permission_denied" | "limit_exceeded")) = kind {
        return Some(ClientError::Refused {
            kind: kind.to_string(),
            message: s.message().to_string(),
        });
    }
    (classify(s) == Failure::Final).then(|| ClientError::Server(s.to_string()))
}

/// A lease's signature as a coordinator sent it, over either transport: none
/// when empty, else it must have the shape of one (`v1.<key id>.<64 hex
/// digits>`) before a worker carries it to an arbiter.
pub(crate) fn lease_signature(signature: String) -> Result<Option<String>, ClientError> {
    if signature.is_empty() {
        return Ok(None);
    }
    leasefence_core::signing::split_signature(&signature)
        .map_err(|_| ClientError::Server("coordinator sent a malformed lease: signature".into()))?;
    Ok(Some(signature))
}
