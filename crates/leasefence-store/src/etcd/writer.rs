//! The leader's epoch-fenced writer in etcd.
//!
//! One batch is two round trips: a read transaction (the epoch key, the
//! leader key and the batch's records, at one revision), then one write
//! transaction that puts the new records only if the epoch key still holds
//! this writer's epoch, the leader key is still bound to its lease, and no
//! record changed since the read. The records are computed from what was read
//! by the rule every backend shares ([`crate::next_record`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use leasefence_core::{Mutation, ResourceId, StoredResource};

use super::{Inner, gets, keys, term_from};
use crate::shared::Epoch;
use crate::{LeaseStore, StoreError, next_record};

/// Keys per page when `load` reads the records.
const LOAD_PAGE: i64 = 500;

/// How often a batch is recomputed when its records changed between its read
/// and its write (only another writer of the same epoch can do that).
const ATTEMPTS: usize = 3;

/// The epoch-fenced [`LeaseStore`] of an [`super::EtcdShared`]'s leader.
pub struct EtcdWriter {
    inner: Arc<Inner>,
    epoch: Epoch,
}

impl std::fmt::Debug for EtcdWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdWriter").field("epoch", &self.epoch).finish()
    }
}

/// A record as read for a batch: its value and its mod revision (0: absent).
struct Read {
    record: Option<StoredResource>,
    rev: i64,
}

impl EtcdWriter {
    pub(super) fn new(inner: Arc<Inner>, epoch: Epoch) -> EtcdWriter {
        EtcdWriter { inner, epoch }
    }

    /// One read-compute-write round. `Ok(false)`: the records changed under us.
    fn try_apply(&self, batch: &[Mutation], resources: &[&ResourceId]) -> Result<bool, StoreError> {
        let plan = self.plan(batch, resources)?;
        self.commit(plan)
    }

    /// Reads the fence and the batch's records at one revision and computes
    /// the write: [`StoreError::Deposed`] if the epoch no longer leads.
    fn plan(&self, batch: &[Mutation], resources: &[&ResourceId]) -> Result<Plan, StoreError> {
        let keys = &self.inner.keys;
        let (ek, lk) = (keys.epoch(), keys.leader());
        let record_keys: Vec<String> = resources.iter().map(|r| keys.record(r.as_str())).collect();
        let mut reads = vec![TxnOp::get(ek.clone(), None), TxnOp::get(lk.clone(), None)];
        reads.extend(record_keys.iter().map(|k| TxnOp::get(k.clone(), None)));
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

        let mut next: HashMap<&str, Option<StoredResource>> =
            read.iter().map(|(r, x)| (*r, x.record.clone())).collect();
        for m in batch {
            let slot = next.entry(m.resource().as_str()).or_default();
            *slot = next_record(slot.take(), m)?;
        }

        // The fence: the epoch is still ours and the leader key still bound to
        // our lease. Then: no record changed since it was read.
        let mut compares = vec![
            Compare::value(ek, CompareOp::Equal, self.epoch.to_string()),
            Compare::lease(lk, CompareOp::Equal, lease),
        ];
        let mut puts = Vec::new();
        for (r, key) in resources.iter().zip(record_keys) {
            let (was, now) = (&read[r.as_str()], &next[r.as_str()]);
            compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, was.rev));
            if let Some(now) = now.as_ref().filter(|n| was.record.as_ref() != Some(n)) {
                puts.push(TxnOp::put(key, keys::encode_record(self.epoch, now), None));
            }
        }
        Ok(Plan { lease, compares, puts })
    }

    /// Writes a plan in one transaction. `Ok(false)`: a record changed since
    /// the plan read it (nothing written); [`StoreError::Deposed`]: the fence
    /// failed (nothing written).
    fn commit(&self, plan: Plan) -> Result<bool, StoreError> {
        if plan.puts.is_empty() {
            return Ok(true);
        }
        let (ek, lk) = (self.inner.keys.epoch(), self.inner.keys.leader());
        let txn = Txn::new()
            .when(plan.compares)
            .and_then(plan.puts)
            .or_else(vec![TxnOp::get(ek.clone(), None), TxnOp::get(lk.clone(), None)]);
        let resp = self.inner.conn.write("write the batch", |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })?;
        if resp.succeeded() {
            return Ok(true);
        }
        let now = term_from(&resp, &ek, &lk, 0)?;
        if now.lease_of(self.epoch) != Some(plan.lease) {
            return Err(now.deposed(self.epoch));
        }
        Ok(false)
    }
}

/// A batch's write, as computed from one read.
struct Plan {
    lease: i64,
    compares: Vec<Compare>,
    puts: Vec<TxnOp>,
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
