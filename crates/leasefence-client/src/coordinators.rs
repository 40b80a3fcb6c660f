//! The coordinators a [`crate::Client`] knows, which one it believes active,
//! and what a failed attempt says about where to go next.
//!
//! With high availability, several coordinators share one store; one is
//! active, the others stand by and answer every call with gRPC `UNAVAILABLE`,
//! a message starting with `not the leader`, and the active one's URL in the
//! `leasefence-leader` metadata ([`META_LEADER`], absent while no leader is
//! known). The list is shared by every clone of a client, so a keep-alive and
//! one-off calls learn from each other's failures. It only grows (hints add
//! URLs, at most [`COORDINATORS_MAX`]); nothing is ever removed.

use std::sync::{Mutex, MutexGuard, PoisonError};

use leasefence_core::Invalid;
use leasefence_proto::v1::leases_client::LeasesClient;
use tonic::transport::Channel;

use crate::ClientOptions;

/// Metadata key of a standby's answer naming the active coordinator.
pub const META_LEADER: &str = "leasefence-leader";
/// How a standby's refusal message starts.
pub const NOT_LEADER_PREFIX: &str = "not the leader";
/// Most coordinators a client knows, given and learned from hints together.
pub const COORDINATORS_MAX: usize = 16;
/// Longest coordinator URL accepted.
pub const URL_LEN_MAX: usize = 2048;

/// Checks that `url` names a coordinator: `http://` or `https://`, a host,
/// optionally a port and a path. Used for the configured list and for the
/// leader hints a coordinator sends.
pub fn check_coordinator_url(url: &str) -> Result<(), Invalid> {
    let wrong = |what: String| {
        Invalid::new(
            "server",
            format!("{what}; allowed: a URL like http://127.0.0.1:7740 (http or https)"),
        )
    };
    if url.len() > URL_LEN_MAX {
        return Err(wrong(format!("is {} bytes long, at most {URL_LEN_MAX}", url.len())));
    }
    let uri: tonic::codegen::http::Uri = url.parse().map_err(|e| wrong(format!("{url:?} is not a URL ({e})")))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => return Err(wrong(format!("{url:?} has scheme {other:?}"))),
        None => return Err(wrong(format!("{url:?} has no scheme"))),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(wrong(format!("{url:?} has no host")));
    }
    Ok(())
}

/// What a failed attempt proves about the call, and where to try next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// A standby refused it: nothing was done. Its hint, if it gave one.
    NotLeader { leader: Option<String> },
    /// Connecting failed: the request never left this process.
    Unsent,
    /// The request may have reached a coordinator and been carried out.
    Ambiguous,
    /// An answer that stands (a refusal of the lease, an invalid request, a
    /// coordinator's internal error): do not retry.
    Final,
}

impl Failure {
    /// Whether the call is known not to have been carried out.
    pub(crate) fn proves_nothing_done(&self) -> bool {
        matches!(self, Failure::NotLeader { .. } | Failure::Unsent)
    }
}

/// Classifies a failed attempt's status.
pub(crate) fn classify(status: &tonic::Status) -> Failure {
    use tonic::Code;
    if status.metadata().contains_key(leasefence_proto::META_ERROR) {
        return Failure::Final;
    }
    let hint = status.metadata().get(META_LEADER);
    if status.code() == Code::Unavailable && (hint.is_some() || status.message().starts_with(NOT_LEADER_PREFIX)) {
        let leader = hint.and_then(|v| v.to_str().ok()).map(str::to_string);
        return Failure::NotLeader { leader };
    }
    if caused_by_connecting(status) {
        return Failure::Unsent;
    }
    match status.code() {
        Code::Unavailable | Code::Unknown | Code::Cancelled => Failure::Ambiguous,
        // tonic reports a reset or closed HTTP/2 connection as INTERNAL.
        Code::Internal if status.message().starts_with("h2 protocol error") => Failure::Ambiguous,
        _ => Failure::Final,
    }
}

/// Whether tonic produced `status` because it could not connect (it keeps
/// the `ConnectError` in the status's source chain).
fn caused_by_connecting(status: &tonic::Status) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = cur {
        if e.downcast_ref::<tonic::ConnectError>().is_some() {
            return true;
        }
        cur = e.source();
    }
    false
}

/// One attempt's target: the coordinator believed active.
#[derive(Clone, Debug)]
pub(crate) struct Pick {
    pub index: usize,
    pub url: String,
    pub grpc: crate::GrpcClient,
}

#[derive(Clone, Debug)]
struct Entry {
    url: String,
    channel: Channel,
}

#[derive(Debug)]
struct Known {
    list: Vec<Entry>,
    active: usize,
}

/// The shared list of coordinators and the one believed active.
#[derive(Debug)]
pub(crate) struct Coordinators {
    options: ClientOptions,
    known: Mutex<Known>,
}

impl Coordinators {
    /// `channels` is non-empty and at most [`COORDINATORS_MAX`] long.
    pub(crate) fn new(channels: Vec<(String, Channel)>, options: ClientOptions) -> Coordinators {
        let list = channels
            .into_iter()
            .map(|(url, channel)| Entry { url, channel })
            .collect();
        Coordinators {
            options,
            known: Mutex::new(Known { list, active: 0 }),
        }
    }

    fn known(&self) -> MutexGuard<'_, Known> {
        // The state stays consistent under any panic: every update is one assignment.
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The coordinator believed active.
    pub(crate) fn pick(&self) -> Pick {
        let k = self.known();
        let e = &k.list[k.active];
        Pick {
            index: k.active,
            url: e.url.clone(),
            grpc: LeasesClient::with_interceptor(e.channel.clone(), self.options.credentials().clone()),
        }
    }

    pub(crate) fn urls(&self) -> Vec<String> {
        self.known().list.iter().map(|e| e.url.clone()).collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.known().list.len()
    }

    /// Learns from an attempt on coordinator `index` that failed as
    /// `failure`: follows a usable leader hint, otherwise moves on to the
    /// next coordinator (unless another attempt already moved on). Returns
    /// whether the next attempt goes to a coordinator just named by a hint.
    pub(crate) fn failed(&self, index: usize, failure: &Failure) -> bool {
        let hinted = match failure {
            Failure::Final => return false,
            Failure::NotLeader { leader: Some(url) } => self.index_of(url),
            _ => None,
        };
        let mut k = self.known();
        match hinted {
            Some(i) if i != index => {
                k.active = i;
                true
            }
            _ => {
                if k.active == index {
                    k.active = (index + 1) % k.list.len();
                }
                false
            }
        }
    }

    /// The index of `url`, added if it is a valid coordinator URL not yet
    /// known and the list has room; `None` for a hint not to follow.
    fn index_of(&self, url: &str) -> Option<usize> {
        if let Some(i) = self.known().list.iter().position(|e| e.url == url) {
            return Some(i);
        }
        if let Err(e) = check_coordinator_url(url) {
            tracing::warn!(error = %e, "ignoring a leader hint that is not a coordinator URL");
            return None;
        }
        let channel = self.options.endpoint(url).ok()?.connect_lazy();
        let mut k = self.known();
        // Another attempt may have added it meanwhile.
        if let Some(i) = k.list.iter().position(|e| e.url == url) {
            return Some(i);
        }
        if k.list.len() >= COORDINATORS_MAX {
            tracing::warn!(
                url,
                "ignoring a leader hint: {COORDINATORS_MAX} coordinators known already"
            );
            return None;
        }
        k.list.push(Entry {
            url: url.to_string(),
            channel,
        });
        Some(k.list.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use tonic::{Code, Status};

    use super::*;

    #[test]
    fn coordinator_urls_are_http_or_https_with_a_host() {
        for good in ["http://127.0.0.1:7740", "https://lf.example.org", "http://[::1]:7740/"] {
            assert!(check_coordinator_url(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "127.0.0.1:7740",
            "ftp://host",
            "http://",
            "not a url",
            "unix:/tmp/x",
        ] {
            let e = check_coordinator_url(bad).expect_err(bad);
            assert_eq!(e.field(), "server");
            assert!(e.message().contains("http://127.0.0.1:7740"), "{e}");
        }
        let long = format!("http://h/{}", "a".repeat(URL_LEN_MAX));
        assert!(check_coordinator_url(&long).is_err());
    }

    fn not_leader(hint: Option<&str>) -> Status {
        let mut s = Status::unavailable("not the leader; the active coordinator is elsewhere");
        if let Some(h) = hint {
            s.metadata_mut().insert(META_LEADER, h.parse().expect("ascii"));
        }
        s
    }

    #[test]
    fn a_standby_answer_is_told_apart_from_an_unreachable_engine() {
        assert_eq!(
            classify(&not_leader(Some("http://b:7740"))),
            Failure::NotLeader {
                leader: Some("http://b:7740".into())
            }
        );
        assert_eq!(classify(&not_leader(None)), Failure::NotLeader { leader: None });
        // A coordinator that cannot reach its engine may have written: ambiguous.
        assert_eq!(classify(&Status::unavailable("store unreachable")), Failure::Ambiguous);
        let lost = leasefence_proto::error_to_status(&leasefence_core::LeaseError::LeaseLost {
            resource: leasefence_core::ResourceId::new("r").expect("valid"),
        });
        assert_eq!(classify(&lost), Failure::Final);
        assert_eq!(classify(&Status::new(Code::Internal, "storage failed")), Failure::Final);
        assert!(!Failure::Ambiguous.proves_nothing_done());
        assert!(Failure::Unsent.proves_nothing_done());
    }
}
