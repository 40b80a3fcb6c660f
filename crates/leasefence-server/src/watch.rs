//! Watch: an ordered, resumable stream of lease transitions.
//!
//! The engine publishes an event for every grant, release and expiry, under
//! its lock and in the machine's order, into a bounded in-memory history and a
//! broadcast channel. A watcher subscribes under the same lock, so the history
//! it replays and the live events it then receives join without a gap or a
//! duplicate. History lives only as long as the process: a resume across a
//! restart is refused (the coordinator id changes) instead of silently
//! skipping what happened in between.

use std::collections::VecDeque;
use std::sync::Arc;

use leasefence_core::{Holder, ResourceId, Token};
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
}

pub struct Hub {
    id: String,
    history: VecDeque<Arc<Event>>,
    next_revision: u64,
    live: broadcast::Sender<Arc<Event>>,
}

impl Hub {
    pub fn new(id: String) -> Hub {
        Hub {
            id,
            history: VecDeque::new(),
            next_revision: 1,
            live: broadcast::channel(LAG_MAX).0,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn publish(&mut self, resource: ResourceId, kind: EventKind, token: Token, holder: Option<Holder>) {
        let event = Arc::new(Event {
            revision: self.next_revision,
            resource,
            kind,
            token,
            holder,
        });
        self.next_revision += 1;
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
                let latest = self.next_revision - 1;
                if after > latest {
                    return Err(WatchError::Future { after, latest });
                }
                let oldest = self.history.front().map_or(self.next_revision, |e| e.revision);
                if after + 1 < oldest {
                    return Err(WatchError::Compacted { after, oldest });
                }
                self.history
                    .iter()
                    .filter(|e| e.revision > after && filter.matches(&e.resource))
                    .cloned()
                    .collect()
            }
        };
        Ok((backlog, self.live.subscribe()))
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
        hub.publish(r("a/1"), EventKind::Granted, t, None);
        hub.publish(r("b/1"), EventKind::Granted, t, None);
        hub.publish(r("a/1"), EventKind::Released, t, None);
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
            hub.publish(r("x"), EventKind::Granted, Token::FIRST, None);
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
}
