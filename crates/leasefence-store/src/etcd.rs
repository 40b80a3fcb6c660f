//! The etcd backend of [`SharedStore`] (cargo feature `etcd`):
//! `serve --store etcd://host:port[,host:port…]`.
//!
//! Leadership is an etcd lease. A campaign is one transaction: if the shard's
//! leader key does not exist and the epoch key is as read, it writes the epoch
//! plus one and the leader key, bound to a fresh lease. etcd deletes the
//! leader key when the lease lapses, so etcd alone judges when a leader's term
//! is over, never the coordinators' clocks. etcd leases have whole seconds: the
//! leader TTL is rounded up (and etcd may raise it to its minimum, about 2 s
//! with its default election timeout); a longer lease only makes a standby
//! wait longer, never lets two lead.
//!
//! Every batch of the leader's writer is one transaction that compares the
//! epoch key (still the writer's epoch) and the leader key (still bound to the
//! writer's lease), and each record's revision (as read for the batch, or as
//! the writer itself last wrote or read it, which spares the read), before
//! it puts the records: a deposed leader writes nothing. A batch takes at most
//! etcd's operations per transaction less two (126 by default), which
//! [`crate::LeaseStore::batch_max`] tells the committer.
//!
//! Keys, under `{prefix}shard/{shard}/`: `epoch` (the last epoch, decimal),
//! `leader` (`{epoch}\n{advertised URL}`, bound to the leader's lease) and
//! `r/{resource}` (the epoch that wrote the record, then the record in the
//! store's record codec: see `keys`).
//!
//! Calls go to one member until it fails as unavailable, then to the next;
//! each is bounded by [`EtcdConfig::request_timeout`], so a cluster without
//! quorum makes calls fail with [`StoreError::Unavailable`] rather than hang.

mod config;
mod conn;
mod keys;
mod writer;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

pub use config::{EtcdConfig, EtcdConfigError};
pub use writer::EtcdWriter;

use crate::StoreError;
use crate::shared::{Epoch, LeaderInfo, SharedStore};
use conn::Conn;
use keys::Keys;

/// etcd's longest lease (`MaxLeaseTTL`), in seconds.
const LEASE_SECS_MAX: u64 = 9_000_000_000;

/// A [`SharedStore`] in etcd. Clones share one client and one runtime.
#[derive(Clone)]
pub struct EtcdShared {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    keys: Keys,
    /// The term this handle won, and its lease: what `renew` keeps alive.
    term: Mutex<Option<(Epoch, i64)>>,
}

impl std::fmt::Debug for EtcdShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdShared")
            .field("endpoints", &self.inner.conn.config().endpoints())
            .field("prefix", &self.inner.conn.config().prefix())
            .field("shard", &self.inner.conn.config().shard())
            .finish()
    }
}

/// What a read of the shard's leadership found.
struct Term {
    epoch: Epoch,
    /// The epoch key's mod revision (0 while it does not exist).
    epoch_rev: i64,
    /// The live leader, with its lease.
    leader: Option<(LeaderInfo, i64)>,
}

impl Term {
    /// The lease of `epoch`'s leader, if `epoch` still leads.
    fn lease_of(&self, epoch: Epoch) -> Option<i64> {
        match &self.leader {
            Some((info, lease)) if info.epoch == epoch && self.epoch == epoch => Some(*lease),
            _ => None,
        }
    }

    fn deposed(&self, epoch: Epoch) -> StoreError {
        StoreError::Deposed {
            epoch,
            current: self.epoch,
        }
    }
}

impl EtcdShared {
    /// A store on the members `config` names. Connects lazily: an etcd that is
    /// down now makes the calls fail with [`StoreError::Unavailable`] until it
    /// is up, not this.
    pub fn connect(config: EtcdConfig) -> Result<EtcdShared, StoreError> {
        let keys = Keys::new(config.prefix(), config.shard());
        Ok(EtcdShared {
            inner: Arc::new(Inner {
                conn: Conn::new(config)?,
                keys,
                term: Mutex::new(None),
            }),
        })
    }

    /// The configuration this store was built with.
    pub fn config(&self) -> &EtcdConfig {
        self.inner.conn.config()
    }

    fn term(&self) -> MutexGuard<'_, Option<(Epoch, i64)>> {
        self.inner.term.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read_term(&self) -> Result<Term, StoreError> {
        let (ek, lk) = (self.inner.keys.epoch(), self.inner.keys.leader());
        let txn = Txn::new().and_then(vec![TxnOp::get(ek.clone(), None), TxnOp::get(lk.clone(), None)]);
        let resp = self.inner.conn.idempotent("read the leadership", |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })?;
        term_from(&resp, &ek, &lk, 0)
    }

    /// Ends `lease` (and so the leader key bound to it). A lease etcd no longer
    /// knows is already over.
    fn revoke(&self, lease: i64) -> Result<(), StoreError> {
        self.inner
            .conn
            .idempotent("revoke the leader's lease", |mut c| async move {
                match c.lease_revoke(lease).await {
                    Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound => Ok(()),
                    other => other.map(|_| ()),
                }
            })
    }
}

/// The term as the two `get`s at `at` and `at + 1` of `resp` read it.
fn term_from(resp: &TxnResponse, ek: &str, lk: &str, at: usize) -> Result<Term, StoreError> {
    let got = gets(resp);
    let missing = || StoreError::Io("etcd's answer lacks the leadership keys".into());
    let epoch_kv = got.get(at).ok_or_else(missing)?;
    let leader_kv = got.get(at + 1).ok_or_else(missing)?;
    let epoch = keys::decode_epoch(ek, epoch_kv.as_ref().map(|kv| kv.value()))?;
    let leader = match leader_kv {
        Some(kv) => Some((keys::decode_leader(lk, kv.value())?, kv.lease())),
        None => None,
    };
    Ok(Term {
        epoch,
        epoch_rev: epoch_kv.as_ref().map_or(0, |kv| kv.mod_revision()),
        leader,
    })
}

/// The first key-value of each `get` in a transaction's answer, in order.
fn gets(resp: &TxnResponse) -> Vec<Option<etcd_client::KeyValue>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g.kvs().first().cloned()),
            _ => None,
        })
        .collect()
}

/// The leader TTL in etcd's whole seconds, rounded up (at least 1).
fn lease_secs(ttl: Duration) -> Result<i64, StoreError> {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    if secs > LEASE_SECS_MAX {
        return Err(StoreError::Io(format!(
            "leader TTL {ttl:?} is longer than etcd's longest lease ({LEASE_SECS_MAX} s)"
        )));
    }
    // At most LEASE_SECS_MAX, so it fits.
    Ok(i64::try_from(secs.max(1)).unwrap_or(i64::MAX))
}

impl SharedStore for EtcdShared {
    type Writer = EtcdWriter;

    fn campaign(&self, advertise: &str, ttl: Duration) -> Result<Option<Epoch>, StoreError> {
        let secs = lease_secs(ttl)?;
        let term = self.read_term()?;
        if term.leader.is_some() {
            return Ok(None);
        }
        let next = term
            .epoch
            .checked_add(1)
            .ok_or_else(|| StoreError::Io("the shard's epoch cannot grow past u64::MAX".into()))?;
        let granted = self
            .inner
            .conn
            .idempotent("grant the leader's lease", |mut c| async move {
                c.lease_grant(secs, None).await
            })?;
        let lease = granted.id();
        if u64::try_from(granted.ttl()).ok().map(Duration::from_secs) != Some(ttl) {
            tracing::info!(
                leader_ttl = ?ttl,
                lease_secs = granted.ttl(),
                "etcd leases have whole seconds and a minimum: the leadership lasts the lease's TTL"
            );
        }
        let (ek, lk) = (self.inner.keys.epoch(), self.inner.keys.leader());
        let txn = Txn::new()
            .when(vec![
                Compare::create_revision(lk.clone(), CompareOp::Equal, 0),
                Compare::mod_revision(ek.clone(), CompareOp::Equal, term.epoch_rev),
            ])
            .and_then(vec![
                TxnOp::put(ek, next.to_string(), None),
                TxnOp::put(
                    lk,
                    keys::encode_leader(next, advertise),
                    Some(PutOptions::new().with_lease(lease)),
                ),
            ]);
        match self.inner.conn.write("campaign", |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        }) {
            Ok(resp) if resp.succeeded() => {
                *self.term() = Some((next, lease));
                Ok(Some(next))
            }
            Ok(_) => {
                // Another coordinator won between the read and the write.
                let _ = self.revoke(lease);
                Ok(None)
            }
            Err(e) => {
                // The campaign may have won without our hearing of it: end the
                // lease, so no term is left that nobody renews.
                let _ = self.revoke(lease);
                Err(e)
            }
        }
    }

    /// Keeps the term's lease alive; etcd restores the TTL the lease was granted
    /// with at the campaign (`ttl` cannot change it).
    fn renew(&self, epoch: Epoch, _ttl: Duration) -> Result<(), StoreError> {
        let known = *self.term();
        let lease = match known {
            Some((e, lease)) if e == epoch => lease,
            _ => {
                let term = self.read_term()?;
                term.lease_of(epoch).ok_or_else(|| term.deposed(epoch))?
            }
        };
        let alive = self
            .inner
            .conn
            .idempotent("renew the leader's lease", |mut c| async move {
                // The client reads etcd's first answer itself, and calls a
                // lease etcd answered with TTL 0 (gone) "lease not found".
                match c.lease_keep_alive(lease).await {
                    Ok(_) => Ok(true),
                    Err(etcd_client::Error::LeaseKeepAliveError(m)) if m == "lease not found" => Ok(false),
                    Err(e) => Err(e),
                }
            })?;
        // The lease is alive; check that it is still the one of our epoch.
        let term = self.read_term()?;
        if !alive || term.lease_of(epoch) != Some(lease) {
            let mut t = self.term();
            if *t == Some((epoch, lease)) {
                *t = None;
            }
            return Err(term.deposed(epoch));
        }
        Ok(())
    }

    fn leader(&self) -> Result<Option<LeaderInfo>, StoreError> {
        Ok(self.read_term()?.leader.map(|(info, _)| info))
    }

    fn resign(&self, epoch: Epoch) -> Result<(), StoreError> {
        let term = self.read_term()?;
        if let Some(lease) = term.lease_of(epoch) {
            self.revoke(lease)?;
        }
        let mut t = self.term();
        if t.is_some_and(|(e, _)| e == epoch) {
            *t = None;
        }
        Ok(())
    }

    fn writer(&self, epoch: Epoch) -> Result<EtcdWriter, StoreError> {
        Ok(EtcdWriter::new(self.inner.clone(), epoch))
    }
}
