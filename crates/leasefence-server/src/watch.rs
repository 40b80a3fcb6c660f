//! Watch: an ordered, resumable stream of lease transitions.
//!
//! The engine stages an event for every grant, release and expiry, under its
//! lock and in the machine's order, tagged with the store sequence number that
//! makes it durable. Only once the store's watermark passes that number does
//! the hub publish it — into a bounded in-memory history and a broadcast
//! channel — so no watcher ever hears of a change the disk does not hold.
//! The hub has its own lock: a watcher subscribes under it, so the history it
//! replays and the live events it then receives join without a gap or a
//! duplicate, and subscribing never waits for (or stalls) the engine.
//! History lives only as long as the process: a resume across a restart is
//! refused (the coordinator id changes) instead of silently skipping what
//! happened in between.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use leasefence_core::{Holder, Mutation, ReleaseCause, ResourceId, Token};
use leasefence_store::{Durable, Seq};
use tokio::sync::broadcast;

/// Events kept for resuming watchers.
pub const HISTORY_MAX: usize = 65_536;
/// Live events buffered per watcher before it is cut off as too slow.
const LAG_MAX: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Granted,
    Released,
    Expired,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub revision: u64,
    pub resource: ResourceId,
    pub kind: EventKind,
    pub token: Token,
    pub holder: Option<Holder>,
}

/// Which resources a watcher wants.
#[derive(Clone, Debug)]
pub struct Filter {
    pub resource: String,
    pub prefix: bool,
}

impl Filter {
    pub fn matches(&self, r: &ResourceId) -> bool {
        if self.prefix {
            r.as_str().starts_with(&self.resource)
        } else {
            r.as_str() == self.resource
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WatchError {
    #[error("compacted: revision {after} is older than the oldest kept ({oldest}); re-read state and watch from now")]
    Compacted { after: u64, oldest: u64 },
    #[error("restarted: the coordinator that produced those revisions is gone; re-read state and watch from now")]
    Restarted,
    #[error("revision {after} is in the future (the latest is {latest})")]
    Future { after: u64, latest: u64 },
    #[error("coordinator unavailable: {0}")]
    Unavailable(String),
}

pub struct Hub {
    id: String,
    history: VecDeque<Arc<Event>>,
    /// Staged events waiting for the store, in sequence order.
    pending: VecDeque<(Seq, Arc<Event>)>,
    /// The store's watermark as last told: everything up to it is durable.
    durable_through: Seq,
    /// The revision the next staged event gets.
    next_revision: u64,
    /// The last revision published (0 before any).
    published: u64,
    live: broadcast::Sender<Arc<Event>>,
}

impl Hub {
    pub fn new(id: String) -> Hub {
        Hub {
            id,
            history: VecDeque::new(),
            pending: VecDeque::new(),
            durable_through: 0,
            next_revision: 1,
            published: 0,
            live: broadcast::channel(LAG_MAX).0,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Stages an event that becomes durable with store sequence number `seq`;
    /// it is published once [`Hub::durable_through`] reaches `seq` (at once if
    /// it already has). Calls come in sequence order.
    pub fn stage(&mut self, seq: Seq, resource: ResourceId, kind: EventKind, token: Token, holder: Option<Holder>) {
        let event = Arc::new(Event {
            revision: self.next_revision,
            resource,
            kind,
            token,
            holder,
        });
        self.next_revision += 1;
        if seq <= self.durable_through {
            self.publish(event);
        } else {
            self.pending.push_back((seq, event));
        }
    }

    /// The store is durable through `seq`: publishes every event staged up to it.
    pub fn durable_through(&mut self, seq: Seq) {
        self.durable_through = self.durable_through.max(seq);
        while self.pending.front().is_some_and(|(s, _)| *s <= self.durable_through) {
            if let Some((_, event)) = self.pending.pop_front() {
                self.publish(event);
            }
        }
    }

    /// The store failed: what is staged will never be durable, so never published.
    pub fn discard_pending(&mut self) {
        self.pending.clear();
    }

    fn publish(&mut self, event: Arc<Event>) {
        self.published = event.revision;
        if self.history.len() == HISTORY_MAX {
            self.history.pop_front();
        }
        self.history.push_back(event.clone());
        // No receivers is fine: nobody is watching.
        let _ = self.live.send(event);
    }

    /// The backlog after `after` (none when `None`) and a live receiver that
    /// continues exactly where the backlog ends.
    #[allow(clippy::type_complexity)]
    pub fn subscribe(
        &self,
        filter: &Filter,
        after: Option<u64>,
        coordinator_id: &str,
    ) -> Result<(Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>), WatchError> {
        let backlog = match after {
            None => Vec::new(),
            Some(after) => {
                if !coordinator_id.is_empty() && coordinator_id != self.id {
                    return Err(WatchError::Restarted);
                }
                let latest = self.published;
                if after > latest {
                    return Err(WatchError::Future { after, latest });
                }
                let oldest = self.history.front().map_or(latest + 1, |e| e.revision);
                if after + 1 < oldest {
                    return Err(WatchError::Compacted { after, oldest });
                }
                // Revisions are contiguous: start right after `after`, not at the front.
                let start = self.history.partition_point(|e| e.revision <= after);
                self.history
                    .range(start..)
                    .filter(|e| filter.matches(&e.resource))
                    .cloned()
                    .collect()
            }
        };
        Ok((backlog, self.live.subscribe()))
    }
}

/// A watcher's start: what it missed, then the live feed.
pub struct Subscription {
    pub coordinator_id: String,
    pub backlog: Vec<Arc<Event>>,
    pub live: broadcast::Receiver<Arc<Event>>,
}

/// What a watcher is told of a mutation.
pub(crate) fn event_of(m: &Mutation) -> (ResourceId, EventKind, Token, Option<Holder>) {
    match m {
        Mutation::Grant {
            resource,
            token,
            holder,
            ..
        } => (resource.clone(), EventKind::Granted, *token, Some(holder.clone())),
        Mutation::Release {
            resource, token, cause, ..
        } => {
            let kind = match cause {
                ReleaseCause::Released => EventKind::Released,
                ReleaseCause::Expired => EventKind::Expired,
            };
            (resource.clone(), kind, *token, None)
        }
    }
}

/// Publishes staged watch events as the store's watermark passes them; after
/// a failed commit drops what will never be durable.
pub(crate) async fn publish_durable(hub: Arc<Mutex<Hub>>, mut mark: tokio::sync::watch::Receiver<Durable>) {
    loop {
        let durable = mark.borrow_and_update().clone();
        {
            let mut hub = hub.lock().unwrap_or_else(|e| e.into_inner());
            hub.durable_through(durable.through);
            if durable.failed.is_some() {
                hub.discard_pending();
                return;
            }
        }
        if mark.changed().await.is_err() {
            return;
        }
    }
}

/// Why a watch stream ended early, for the edge to tell its client.
pub(crate) enum Ended {
    /// The coordinator is stopping.
    ShuttingDown,
    /// The watcher fell too far behind; it may resume after this revision.
    Lagged { after_revision: u64 },
}

/// Replays `sub`'s backlog into `tx`, then forwards the live events `filter`
/// matches, until the watcher leaves, falls behind or the coordinator stops
/// (then `ended` makes the last item). Both edges' watch streams run this;
/// `item` encodes an event for the edge, and `hold` (the watcher's slot)
/// lives as long as the stream.
pub(crate) async fn forward<T: Send, H: Send>(
    sub: Subscription,
    filter: Filter,
    stopping: impl std::future::Future<Output = ()> + Send,
    tx: tokio::sync::mpsc::Sender<T>,
    item: impl Fn(&str, &Event) -> T + Send,
    ended: impl FnOnce(Ended) -> T + Send,
    hold: H,
) {
    use tokio::sync::broadcast::error::RecvError;
    let _watching = crate::metrics::Watching::new();
    let _hold = hold;
    let Subscription {
        coordinator_id: id,
        backlog,
        mut live,
    } = sub;
    let mut last = 0;
    for e in backlog {
        last = e.revision;
        if tx.send(item(&id, &e)).await.is_err() {
            return;
        }
    }
    tokio::pin!(stopping);
    loop {
        let next = tokio::select! {
            n = live.recv() => n,
            // The watcher left: end now, not at the next event.
            () = tx.closed() => return,
            () = &mut stopping => {
                let _ = tx.send(ended(Ended::ShuttingDown)).await;
                return;
            }
        };
        match next {
            Ok(e) if e.revision <= last || !filter.matches(&e.resource) => {}
            Ok(e) => {
                last = e.revision;
                if tx.send(item(&id, &e)).await.is_err() {
                    return;
                }
            }
            Err(RecvError::Lagged(_)) => {
                let _ = tx.send(ended(Ended::Lagged { after_revision: last })).await;
                return;
            }
            Err(RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> ResourceId {
        ResourceId::new(s).expect("valid")
    }

    #[test]
    fn resume_replays_exactly_what_followed() {
        let mut hub = Hub::new("c1".into());
        let t = Token::FIRST;
        hub.stage(0, r("a/1"), EventKind::Granted, t, None);
        hub.stage(0, r("b/1"), EventKind::Granted, t, None);
        hub.stage(0, r("a/1"), EventKind::Released, t, None);
        let f = Filter {
            resource: "a/".into(),
            prefix: true,
        };
        let (backlog, _) = hub.subscribe(&f, Some(1), "c1").expect("resume");
        assert_eq!(backlog.iter().map(|e| e.revision).collect::<Vec<_>>(), vec![3]);
        assert_eq!(hub.subscribe(&f, Some(1), "c0").unwrap_err(), WatchError::Restarted);
        assert_eq!(
            hub.subscribe(&f, Some(9), "").unwrap_err(),
            WatchError::Future { after: 9, latest: 3 }
        );
    }

    #[test]
    fn old_positions_are_compacted_not_skipped() {
        let mut hub = Hub::new("c".into());
        for _ in 0..HISTORY_MAX + 10 {
            hub.stage(0, r("x"), EventKind::Granted, Token::FIRST, None);
        }
        let f = Filter {
            resource: "x".into(),
            prefix: false,
        };
        assert!(matches!(
            hub.subscribe(&f, Some(5), "c"),
            Err(WatchError::Compacted { oldest: 11, .. })
        ));
        assert_eq!(
            hub.subscribe(&f, Some(10), "c").expect("just kept").0.len(),
            HISTORY_MAX
        );
    }

    #[test]
    fn staged_events_wait_for_the_store_in_order() {
        let mut hub = Hub::new("c".into());
        let f = Filter {
            resource: String::new(),
            prefix: true,
        };
        let (_, mut live) = hub.subscribe(&f, None, "c").expect("subscribe");
        hub.stage(1, r("a"), EventKind::Granted, Token::FIRST, None);
        hub.stage(2, r("b"), EventKind::Granted, Token::FIRST, None);
        assert!(live.try_recv().is_err(), "nothing is durable yet");
        assert!(matches!(
            hub.subscribe(&f, Some(1), "c"),
            Err(WatchError::Future { latest: 0, .. })
        ));
        hub.durable_through(1);
        assert_eq!(live.try_recv().expect("durable").resource, r("a"));
        assert!(live.try_recv().is_err(), "b is not durable yet");
        // A later stage of an already durable sequence number goes out at once, after b.
        hub.durable_through(3);
        hub.stage(3, r("c"), EventKind::Released, Token::FIRST, None);
        let rest: Vec<_> = std::iter::from_fn(|| live.try_recv().ok())
            .map(|e| e.revision)
            .collect();
        assert_eq!(rest, vec![2, 3]);
        hub.stage(4, r("d"), EventKind::Granted, Token::FIRST, None);
        hub.discard_pending();
        hub.durable_through(4);
        assert!(live.try_recv().is_err(), "a discarded event is never published");
    }
}
