//! The failover trials' direct look at the etcd store (cargo feature `etcd`):
//! the shard's epoch and leader keys and every record of one epoch, read in
//! one transaction (one revision), and deleting a run's prefix.
//!
//! Keys (the store's own layout, `etcd/keys.rs` of the store crate), under
//! `{prefix}shard/0/`: `epoch` (decimal), `leader` (`{epoch}\n{url}`) and
//! `r/{resource}`, whose value is the byte `E`, the epoch of the leader that
//! wrote it (8 bytes, big-endian), then the record. Read here on purpose
//! without the store's code: the trials judge the store from outside.

use anyhow::{Context, bail};
use etcd_client::{Client, DeleteOptions, GetOptions, Txn, TxnOp, TxnOpResponse};

use crate::failover_db::EpochRows;

/// The first byte of a record value that carries its writer's epoch.
const RECORD_WITH_EPOCH: u8 = b'E';

/// A run's etcd store: a client and the run's key prefix.
pub struct EtcdStore {
    client: Client,
    prefix: String,
}

impl EtcdStore {
    /// Connects to `etcd://host:port[,host:port…]`; `prefix` is the run's
    /// `--store-prefix`.
    pub async fn connect(url: &str, prefix: &str) -> anyhow::Result<EtcdStore> {
        let hosts = url.strip_prefix("etcd://").context("--store must start with etcd://")?;
        let endpoints: Vec<&str> = hosts.split(',').filter(|h| !h.is_empty()).collect();
        if endpoints.is_empty() {
            bail!("--store {url:?} names no etcd member: expected etcd://HOST:PORT[,HOST:PORT…]");
        }
        let client = Client::connect(&endpoints, None)
            .await
            .with_context(|| format!("cannot connect to etcd at {hosts}"))?;
        Ok(EtcdStore {
            client,
            prefix: prefix.to_string(),
        })
    }

    fn shard(&self) -> String {
        format!("{}shard/0/", self.prefix)
    }

    /// The epoch and leader keys, and the records whose last writer was `epoch`.
    pub async fn epoch_rows(&self, epoch: u64) -> anyhow::Result<EpochRows> {
        let shard = self.shard();
        let records = format!("{shard}r/");
        let txn = Txn::new().and_then(vec![
            TxnOp::get(format!("{shard}epoch"), None),
            TxnOp::get(format!("{shard}leader"), None),
            TxnOp::get(records.clone(), Some(GetOptions::new().with_prefix())),
        ]);
        let resp = self
            .client
            .clone()
            .txn(txn)
            .await
            .context("cannot read the etcd store")?;
        let gets: Vec<_> = resp
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            })
            .collect();
        let [epoch_get, leader_get, records_get] = gets.as_slice() else {
            bail!("etcd answered the read with {} gets, not 3", gets.len());
        };
        let current = match epoch_get.kvs().first() {
            Some(kv) => std::str::from_utf8(kv.value())
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .context("the epoch key is not a decimal number")?,
            None => bail!("the prefix {} has no epoch key: no coordinator ever led", self.prefix),
        };
        let leader = match leader_get.kvs().first() {
            Some(kv) => {
                let text = std::str::from_utf8(kv.value()).context("the leader key is not UTF-8")?;
                let (_, url) = text.split_once('\n').context("the leader key has no epoch line")?;
                Some(url.to_string())
            }
            None => None,
        };
        let mut out = EpochRows {
            epoch: current,
            leader,
            rows: Default::default(),
        };
        for kv in records_get.kvs() {
            let key = String::from_utf8_lossy(kv.key());
            let resource = key.strip_prefix(&records).unwrap_or(&key).to_string();
            if record_epoch(kv.value()) == Some(epoch) {
                out.rows.insert((resource, kv.value().to_vec()));
            }
        }
        Ok(out)
    }

    /// Deletes every key of the run's prefix (only ever a run's own).
    pub async fn delete_prefix(&self) -> anyhow::Result<()> {
        self.client
            .clone()
            .delete(self.prefix.clone(), Some(DeleteOptions::new().with_prefix()))
            .await
            .with_context(|| format!("cannot delete the etcd prefix {}", self.prefix))?;
        Ok(())
    }
}

/// The epoch a record value says wrote it; `None` for a value without one.
fn record_epoch(value: &[u8]) -> Option<u64> {
    match value.split_first() {
        Some((&RECORD_WITH_EPOCH, rest)) => rest.first_chunk::<8>().map(|e| u64::from_be_bytes(*e)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_epoch_is_read_from_a_record_value() {
        let mut v = vec![b'E'];
        v.extend_from_slice(&7u64.to_be_bytes());
        v.extend_from_slice(&[2, 0, 0]);
        assert_eq!(record_epoch(&v), Some(7));
        assert_eq!(record_epoch(&v[..5]), None, "cut inside the epoch");
        assert_eq!(record_epoch(&[2, 0, 0, 0]), None, "a bare record has no epoch");
        assert_eq!(record_epoch(&[]), None);
    }
}
