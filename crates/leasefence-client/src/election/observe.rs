//! Observing an election: who leads, as a stream of [`LeaderChange`]s built
//! on the `Watch` RPC for the election's name.
//!
//! The observer subscribes first and reads the state (`Get`) second, so no
//! change falls between the two; changes already contained in that state are
//! dropped by their position (term, then grant before end). After a dropped
//! connection it resumes from the last revision it saw, so nothing is missed.
//! If the coordinator no longer has that history (it restarted, or compacted
//! it, or another coordinator took over), the observer reads the state
//! again, yields it again, and continues from now: changes in between are
//! summarised by that state.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use leasefence_core::{Holder, ResourceId, Token};
use leasefence_proto::v1::{self as pb, watch_event::Kind};
use tokio::sync::mpsc;
use tokio::time::sleep;
use tokio_stream::Stream;

use crate::calls::status_error;
use crate::{Client, ClientError, StatusInfo};

/// Changes buffered for a slow consumer before the observer waits for it.
const BUFFER_LEN_MAX: usize = 64;
/// Retry bounds after a broken watch.
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// A change of an election's leadership, as an observer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaderChange {
    /// `holder` leads with `term` (the lease's fencing token).
    Leader { term: Token, holder: Holder },
    /// Nobody leads; `last_term` ended (released or expired), or `None` if
    /// nobody ever led.
    Vacant { last_term: Option<Token> },
}

impl LeaderChange {
    /// The leader's term, if somebody leads.
    pub fn term(&self) -> Option<Token> {
        match self {
            LeaderChange::Leader { term, .. } => Some(*term),
            LeaderChange::Vacant { .. } => None,
        }
    }

    /// Where this state sits in the election's history: term t begins at
    /// `(t, 0)` and ends at `(t, 1)`, so positions only grow.
    fn position(&self) -> (u64, u8) {
        match self {
            LeaderChange::Leader { term, .. } => (term.get(), 0),
            LeaderChange::Vacant { last_term } => (last_term.map_or(0, Token::get), 1),
        }
    }

    fn from_status(s: &StatusInfo) -> LeaderChange {
        match &s.held {
            Some((holder, term, _)) => LeaderChange::Leader {
                term: *term,
                holder: holder.clone(),
            },
            None => LeaderChange::Vacant {
                last_term: s.last_token,
            },
        }
    }

    /// `Ok(None)` for an event of a kind this client does not know.
    fn from_event(e: &pb::WatchEvent) -> Result<Option<LeaderChange>, ClientError> {
        let bad = |what: &str| ClientError::Server(format!("coordinator sent a malformed watch event: {what}"));
        let token = Token::new(e.token).ok_or_else(|| bad("token 0"))?;
        Ok(match Kind::try_from(e.kind) {
            Ok(Kind::Granted) => Some(LeaderChange::Leader {
                term: token,
                holder: Holder::new(&e.holder).map_err(|_| bad("holder"))?,
            }),
            Ok(Kind::Released | Kind::Expired) => Some(LeaderChange::Vacant { last_term: Some(token) }),
            _ => None,
        })
    }
}

impl Client {
    /// Streams the leadership of `name`: first the current state, then one
    /// [`LeaderChange`] per grant, release or expiry, in order (see the
    /// module doc of [`crate::election`] for what an observer may conclude).
    /// Transient failures are yielded as `Err` items while the observer
    /// reconnects with backoff; an invalid name or a malformed answer is
    /// yielded and ends the stream. Dropping the stream stops observing.
    /// Must be called within a Tokio runtime.
    pub fn observe(&self, name: &ResourceId) -> LeaderChanges {
        let (tx, rx) = mpsc::channel(BUFFER_LEN_MAX);
        let observer = Observer {
            client: self.clone(),
            name: name.clone(),
            tx,
            resume: None,
            seen: Seen::default(),
        };
        tokio::spawn(observer.run());
        LeaderChanges { rx }
    }
}

/// The changes of an election's leadership, from [`Client::observe`]: a
/// [`Stream`], or call [`LeaderChanges::next`]. Dropping it stops observing.
#[derive(Debug)]
pub struct LeaderChanges {
    rx: mpsc::Receiver<Result<LeaderChange, ClientError>>,
}

impl LeaderChanges {
    /// The next change; `None` once observing ended after a fatal error.
    pub async fn next(&mut self) -> Option<Result<LeaderChange, ClientError>> {
        self.rx.recv().await
    }
}

impl Stream for LeaderChanges {
    type Item = Result<LeaderChange, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// How one watch stream ended.
enum End {
    /// The consumer is gone.
    Closed,
    /// Yield the error, then stop.
    Fatal(ClientError),
    /// Yield the error, back off, reconnect.
    Broken(ClientError),
    /// The history to resume from is gone: re-read the state at once.
    Resync,
}

struct Observer {
    client: Client,
    name: ResourceId,
    tx: mpsc::Sender<Result<LeaderChange, ClientError>>,
    /// The last event seen: `(revision, coordinator_id)`.
    resume: Option<(u64, String)>,
    seen: Seen,
}

/// Which changes are news: those past the position of the last one yielded.
/// After a resync the state read is the truth, whatever was yielded before,
/// so it is yielded and becomes the position to compare with.
#[derive(Debug, Default)]
struct Seen {
    /// The position of the last change yielded.
    at: Option<(u64, u8)>,
    /// Yield the next state read even if it is not newer, and restart from it.
    resync: bool,
}

impl Seen {
    /// Whether to yield `change`; if so, it is the new position.
    fn admit(&mut self, change: &LeaderChange) -> bool {
        let pos = change.position();
        if self.resync {
            self.resync = false;
            self.at = Some(pos);
            return true;
        }
        if self.at.is_some_and(|at| pos <= at) {
            return false;
        }
        self.at = Some(pos);
        true
    }
}

impl Observer {
    async fn run(mut self) {
        let tx = self.tx.clone();
        tokio::select! {
            () = tx.closed() => {}
            () = self.observe() => {}
        }
    }

    async fn observe(&mut self) {
        let mut retry = RETRY_MIN;
        loop {
            let (end, opened) = self.one_stream().await;
            if opened {
                retry = RETRY_MIN;
            }
            match end {
                End::Closed => return,
                End::Resync => {
                    self.resume = None;
                    self.seen.resync = true;
                }
                End::Fatal(e) => {
                    let _ = self.tx.send(Err(e)).await;
                    return;
                }
                End::Broken(e) => {
                    tracing::debug!(name = %self.name.shown(), error = %e, "observer reconnecting");
                    if self.tx.send(Err(e)).await.is_err() {
                        return;
                    }
                    sleep(retry).await;
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
    }

    fn classify(&self, status: tonic::Status) -> End {
        match status_error(&self.name, &status) {
            Some(e @ (ClientError::Invalid(_) | ClientError::Lease(_))) => End::Fatal(e),
            Some(e) => End::Broken(e),
            None => End::Broken(ClientError::Transport {
                url: self.client.active(),
                message: status.message().to_string(),
            }),
        }
    }

    /// Yields `change` if it is newer than the last one yielded (or a resync
    /// asks for it); `false` once the consumer is gone.
    async fn offer(&mut self, change: LeaderChange) -> bool {
        if !self.seen.admit(&change) {
            return true;
        }
        self.tx.send(Ok(change)).await.is_ok()
    }

    /// Opens one watch (resuming if it can), yields what it shows until it
    /// ends. The flag says whether the stream opened.
    async fn one_stream(&mut self) -> (End, bool) {
        let req = pb::WatchRequest {
            resource: self.name.to_string(),
            prefix: false,
            after_revision: self.resume.as_ref().map(|r| r.0),
            coordinator_id: self.resume.as_ref().map(|r| r.1.clone()).unwrap_or_default(),
        };
        // Opening follows leader hints and skips unreachable coordinators;
        // a coordinator that took over has a new coordinator id, so resuming
        // there fails as after a restart, and the observer resyncs.
        let mut stream = match self.client.open_watch(req).await {
            Ok(s) => s,
            Err(s) if self.resume.is_some() && s.code() == tonic::Code::FailedPrecondition => {
                tracing::debug!(name = %self.name.shown(), reason = %s.message(), "observer resyncing");
                return (End::Resync, false);
            }
            Err(s) => return (self.classify(s), false),
        };
        if self.resume.is_none() {
            // Subscribed from now: the state read next already reflects
            // anything the stream delivers before it, so `offer` drops those.
            let state = match self.client.status(&self.name).await {
                Ok(s) => s,
                Err(e @ (ClientError::Invalid(_) | ClientError::Lease(_))) => return (End::Fatal(e), true),
                Err(e) => return (End::Broken(e), true),
            };
            if !self.offer(LeaderChange::from_status(&state)).await {
                return (End::Closed, true);
            }
        }
        loop {
            let event = match stream.message().await {
                Ok(Some(e)) => e,
                Ok(None) => return (End::Broken(ClientError::Server("the watch stream ended".into())), true),
                Err(s) => return (self.classify(s), true),
            };
            self.resume = Some((event.revision, event.coordinator_id.clone()));
            if event.resource != self.name.as_str() {
                continue;
            }
            match LeaderChange::from_event(&event) {
                Err(e) => return (End::Fatal(e), true),
                Ok(None) => {}
                Ok(Some(change)) => {
                    if !self.offer(change).await {
                        return (End::Closed, true);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> Token {
        Token::new(n).expect("non-zero")
    }

    fn event(kind: Kind, token: u64, holder: &str) -> pb::WatchEvent {
        pb::WatchEvent {
            revision: 1,
            coordinator_id: "c".into(),
            resource: "e".into(),
            kind: kind as i32,
            token,
            holder: holder.into(),
        }
    }

    #[test]
    fn positions_order_the_history_of_terms() {
        let a = Holder::new("a").expect("valid");
        let history = [
            LeaderChange::Vacant { last_term: None },
            LeaderChange::Leader {
                term: t(1),
                holder: a.clone(),
            },
            LeaderChange::Vacant { last_term: Some(t(1)) },
            LeaderChange::Leader { term: t(2), holder: a },
            LeaderChange::Vacant { last_term: Some(t(2)) },
        ];
        assert!(history.windows(2).all(|w| w[0].position() < w[1].position()));
    }

    #[test]
    fn events_map_to_changes_and_malformed_ones_are_errors() {
        let granted = LeaderChange::from_event(&event(Kind::Granted, 3, "b")).expect("ok");
        let b = Holder::new("b").expect("valid");
        assert_eq!(granted, Some(LeaderChange::Leader { term: t(3), holder: b }));
        for kind in [Kind::Released, Kind::Expired] {
            let vacant = LeaderChange::from_event(&event(kind, 3, "")).expect("ok");
            assert_eq!(vacant, Some(LeaderChange::Vacant { last_term: Some(t(3)) }));
        }
        assert_eq!(
            LeaderChange::from_event(&event(Kind::Unspecified, 3, "")).expect("ok"),
            None
        );
        assert!(LeaderChange::from_event(&event(Kind::Granted, 0, "b")).is_err());
        assert!(LeaderChange::from_event(&event(Kind::Granted, 3, "")).is_err());
    }

    #[test]
    fn after_a_resync_the_real_leader_of_a_term_is_reported() {
        let a = Holder::new("a").expect("valid");
        let b = Holder::new("b").expect("valid");
        let mut seen = Seen::default();
        assert!(seen.admit(&LeaderChange::Leader { term: t(3), holder: a }));
        // The history is gone; the state read again says term 3 never stuck.
        seen.resync = true;
        assert!(seen.admit(&LeaderChange::Vacant { last_term: Some(t(2)) }));
        assert!(
            seen.admit(&LeaderChange::Leader { term: t(3), holder: b }),
            "the grant of term 3 that followed the resync was dropped"
        );
        assert!(!seen.admit(&LeaderChange::Vacant { last_term: Some(t(2)) }), "old news");
    }
}
