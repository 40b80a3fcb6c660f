//! The leader's epoch-fenced writer in etcd.
//!
//! A batch is one write transaction that puts the new records only if the
//! epoch key still holds this writer's epoch, the leader key is still bound
//! to its lease, and every record of the batch still has the mod revision the
//! new record was computed from (by the rule every backend shares,
//! [`crate::next_record`]). What it computes from comes from a read
//! transaction (the epoch key, the leader key and the batch's records, at one
//! revision) unless this writer already knows every record of the batch: each
//! record it read or wrote is kept with its mod revision ([`crate::known`]), so a
//! batch on records it last touched itself (a release after its grant, the
//! next grant of a resource) takes one round trip instead of two. The
//! compares make the knowledge safe to use: a record someone else changed
//! has another revision, the write is refused whole, and the batch is read
//! again and recomputed; a writer whose term ended is refused by the fence,
//! whatever it knew. After a call to etcd went unanswered, batches are read
//! first again until one is answered: a batch that meets an etcd known to be
//! unreachable then fails as unavailable (nothing sent), as it did before
//! the writer kept anything, and not as a write of unknown outcome.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use leasefence_core::{Mutation, ResourceId, StoredResource};

use super::{Inner, gets, keys, term_from};
use crate::shared::Epoch;
use crate::{LeaseStore, StoreError, known, next_record};

/// Keys per page when `load` reads the records.
const LOAD_PAGE: i64 = 500;

/// How often a batch is recomputed when its records changed between its read
/// and its write (only another writer of the same epoch can do that).
const ATTEMPTS: usize = 3;

/// The epoch-fenced [`LeaseStore`] of an [`super::EtcdShared`]'s leader.
pub struct EtcdWriter {
    inner: Arc<Inner>,
    epoch: Epoch,
    known: Known,
}

impl std::fmt::Debug for EtcdWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdWriter").field("epoch", &self.epoch).finish()
    }
}

/// A record as read for a batch: its value and its mod revision (0: absent).
#[derive(Clone)]
struct Read {
    record: Option<StoredResource>,
    rev: i64,
}

/// What this writer last read or wrote: the lease of its term as the leader
/// key held it, and records by resource with their mod revisions. Emptied
/// whenever a write is refused or its outcome is not known.
#[derive(Default)]
struct Known {
    lease: Option<i64>,
    records: known::Known<Read>,
}

impl Known {
    fn forget(&mut self) {
        self.lease = None;
        self.records.forget();
    }

    /// The lease and every record of `resources`, if all are known.
    fn all<'a>(&self, resources: &[&'a ResourceId]) -> Option<(i64, HashMap<&'a str, Read>)> {
        let lease = self.lease?;
        Some((lease, self.records.all(resources.iter().map(|r| r.as_str()))?))
    }

    fn learn(&mut self, lease: i64, records: impl IntoIterator<Item = (String, Read)>) {
        self.lease = Some(lease);
        self.records.learn(records);
    }
}

impl EtcdWriter {
    pub(super) fn new(inner: Arc<Inner>, epoch: Epoch) -> EtcdWriter {
        EtcdWriter {
            inner,
            epoch,
            known: Known::default(),
        }
    }

    /// One compute-write round, from what this writer knows when it knows
    /// every record of the batch, else from a read. `Ok(false)`: the records
    /// changed under us (what was known is forgotten).
    fn try_apply(&mut self, batch: &[Mutation], resources: &[&ResourceId]) -> Result<bool, StoreError> {
        // Knowledge spares the read only while etcd answers: after a call
        // that went unanswered the batch is read first, so that an etcd
        // still unreachable refuses it as unavailable before anything is
        // sent, rather than leaving a write of unknown outcome.
        let known = if self.inner.conn.answered() {
            self.known.all(resources)
        } else {
            None
        };
        // A refusal computed from what was known (a token regression, say) is
        // checked against a read before it is believed. A batch with a record
        // not known is read whole; what is known stays.
        let plan = match known.map(|(lease, read)| self.compute(batch, resources, lease, read)) {
            Some(Ok(plan)) => plan,
            Some(Err(_)) => {
                self.known.forget();
                self.plan(batch, resources)?
            }
            None => self.plan(batch, resources)?,
        };
        let written = self.commit(&plan);
        match written {
            Ok(Some(rev)) => {
                let learned = plan.records.into_iter().map(|(r, was, now)| match now {
                    Some(now) => (r, Read { record: Some(now), rev }),
                    None => (r, was),
                });
                self.known.learn(plan.lease, learned);
                Ok(true)
            }
            Ok(None) => {
                self.known.forget();
                Ok(false)
            }
            Err(e) => {
                self.known.forget();
                Err(e)
            }
        }
    }

    /// Reads the fence and the batch's records at one revision and computes
    /// the write: [`StoreError::Deposed`] if the epoch no longer leads.
    fn plan(&self, batch: &[Mutation], resources: &[&ResourceId]) -> Result<Plan, StoreError> {
        let keys = &self.inner.keys;
        let (ek, lk) = (keys.epoch(), keys.leader());
        let mut reads = vec![TxnOp::get(ek.clone(), None), TxnOp::get(lk.clone(), None)];
        reads.extend(resources.iter().map(|r| TxnOp::get(keys.record(r.as_str()), None)));
        let txn = Txn::new().and_then(reads);
        let resp = self.inner.conn.idempotent("read the batch's records", |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })?;
        let term = term_from(&resp, &ek, &lk, 0)?;
        let lease = term.lease_of(self.epoch).ok_or_else(|| term.deposed(self.epoch))?;

        let got = gets(&resp);
        let mut read = HashMap::with_capacity(resources.len());
        for (i, r) in resources.iter().enumerate() {
            let kv = got
                .get(2 + i)
                .ok_or_else(|| StoreError::Io("etcd's answer lacks records of the batch".into()))?;
            let entry = match kv {
                Some(kv) => Read {
                    record: Some(keys::decode_record(r.as_str(), kv.value())?.1),
                    rev: kv.mod_revision(),
                },
                None => Read { record: None, rev: 0 },
            };
            read.insert(r.as_str(), entry);
        }
        self.compute(batch, resources, lease, read)
    }

    /// The write of `batch` computed from `read`, fenced by `lease` and by
    /// each record's revision in `read`.
    fn compute(
        &self,
        batch: &[Mutation],
        resources: &[&ResourceId],
        lease: i64,
        read: HashMap<&str, Read>,
    ) -> Result<Plan, StoreError> {
        let keys = &self.inner.keys;
        let mut next: HashMap<&str, Option<StoredResource>> =
            read.iter().map(|(r, x)| (*r, x.record.clone())).collect();
        for m in batch {
            let slot = next.entry(m.resource().as_str()).or_default();
            *slot = next_record(slot.take(), m)?;
        }

        // The fence: the epoch is still ours and the leader key still bound to
        // our lease. Then: no record changed since it was read.
        let mut compares = vec![
            Compare::value(keys.epoch(), CompareOp::Equal, self.epoch.to_string()),
            Compare::lease(keys.leader(), CompareOp::Equal, lease),
        ];
        let mut puts = Vec::new();
        let mut records = Vec::with_capacity(resources.len());
        for r in resources {
            let key = keys.record(r.as_str());
            let was = read
                .get(r.as_str())
                .cloned()
                .ok_or_else(|| StoreError::Io(format!("the batch's record of {r} was not read")))?;
            compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, was.rev));
            let now = next
                .remove(r.as_str())
                .flatten()
                .filter(|n| was.record.as_ref() != Some(n));
            if let Some(now) = &now {
                puts.push(TxnOp::put(key, keys::encode_record(self.epoch, now), None));
            }
            records.push((r.as_str().to_string(), was, now));
        }
        Ok(Plan {
            lease,
            compares,
            puts,
            records,
        })
    }

    /// Writes a plan in one transaction: `Ok(Some(revision))`, the revision
    /// it was written at (0 when there was nothing to write); `Ok(None)`, a
    /// record changed since the plan read it (nothing written);
    /// [`StoreError::Deposed`]: the fence failed (nothing written).
    fn commit(&self, plan: &Plan) -> Result<Option<i64>, StoreError> {
        if plan.puts.is_empty() {
            return Ok(Some(0));
        }
        let (ek, lk) = (self.inner.keys.epoch(), self.inner.keys.leader());
        let txn = Txn::new()
            .when(plan.compares.clone())
            .and_then(plan.puts.clone())
            .or_else(vec![TxnOp::get(ek.clone(), None), TxnOp::get(lk.clone(), None)]);
        let resp = self.inner.conn.write("write the batch", |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })?;
        if resp.succeeded() {
            // Every put of one transaction has the transaction's revision.
            let rev = resp
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| StoreError::Io("etcd's answer to a write lacks its revision".into()))?;
            return Ok(Some(rev));
        }
        let now = term_from(&resp, &ek, &lk, 0)?;
        if now.lease_of(self.epoch) != Some(plan.lease) {
            return Err(now.deposed(self.epoch));
        }
        Ok(None)
    }
}

/// A batch's write, as computed from one read or from what was known.
struct Plan {
    lease: i64,
    compares: Vec<Compare>,
    puts: Vec<TxnOp>,
    /// Per resource of the batch: the record as read, and the new one when it
    /// is written.
    records: Vec<(String, Read, Option<StoredResource>)>,
}

impl LeaseStore for EtcdWriter {
    fn load(&mut self) -> Result<Vec<StoredResource>, StoreError> {
        let prefix = self.inner.keys.records();
        // The end of the prefix's range: its last byte (`/`) plus one.
        let mut end = prefix.clone().into_bytes();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let mut start = prefix.clone().into_bytes();
        let mut revision = 0;
        let mut out = Vec::new();
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(LOAD_PAGE);
            if revision > 0 {
                // Every page at the first page's revision: one consistent view.
                options = options.with_revision(revision);
            }
            let resp = self.inner.conn.idempotent("load the records", |mut c| {
                let (from, options) = (start.clone(), options.clone());
                async move { c.get(from, Some(options)).await }
            })?;
            if revision == 0 {
                revision = resp.header().map_or(0, |h| h.revision());
            }
            for kv in resp.kvs() {
                let key = String::from_utf8_lossy(kv.key());
                let resource = key.strip_prefix(&prefix).unwrap_or(&key);
                out.push(keys::decode_record(resource, kv.value())?.1);
            }
            match resp.kvs().last() {
                Some(kv) if resp.more() => {
                    start = kv.key().to_vec();
                    start.push(0);
                }
                _ => return Ok(out),
            }
        }
    }

    fn apply(&mut self, batch: &[Mutation]) -> Result<(), StoreError> {
        let max = self.batch_max();
        let mut seen = HashSet::new();
        let mut resources: Vec<&ResourceId> = Vec::new();
        for m in batch {
            if seen.insert(m.resource()) {
                resources.push(m.resource());
            }
        }
        if resources.len() > max {
            return Err(StoreError::Io(format!(
                "a batch of {} resources is more than one etcd transaction takes ({max}); \
                 hand it at most batch_max() mutations",
                resources.len()
            )));
        }
        if resources.is_empty() {
            return Ok(());
        }
        for _ in 0..ATTEMPTS {
            if self.try_apply(batch, &resources)? {
                return Ok(());
            }
        }
        Err(StoreError::Io(format!(
            "the batch's records changed under another writer of epoch {} {ATTEMPTS} times",
            self.epoch
        )))
    }

    /// Each resource of a batch takes one compare and one put, and etcd takes
    /// at most `max-txn-ops` of each; two compares fence the batch.
    fn batch_max(&self) -> usize {
        self.inner.conn.config().resources_per_batch_max()
    }
}

#[cfg(test)]
mod tests;
