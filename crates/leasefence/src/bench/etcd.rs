//! The etcd lock `leasefence bench --compare etcd` measures (feature `etcd`):
//! one session lease per client, granted at connect and reused, and a cycle
//! of a put-if-absent transaction (`create_revision == 0` → put with the
//! lease) and a delete. A busy key is tried again every [`POLL`].

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::workers::{POLL, WAIT};

pub struct EtcdWorker {
    client: Client,
    lease: i64,
}

impl EtcdWorker {
    /// Connects to `endpoint` (host:port) and grants the session lease, long
    /// enough to outlive a segment of `segment` without keep-alives.
    pub async fn connect(endpoint: &str, segment: Duration) -> anyhow::Result<EtcdWorker> {
        let mut client = Client::connect([format!("http://{endpoint}")], None)
            .await
            .with_context(|| format!("cannot reach etcd at {endpoint}"))?;
        let ttl = i64::try_from(segment.as_secs()).unwrap_or(i64::MAX).saturating_add(60);
        let lease = client
            .lease_grant(ttl, None)
            .await
            .with_context(|| format!("etcd at {endpoint}: cannot grant a session lease"))?
            .id();
        Ok(EtcdWorker { client, lease })
    }

    pub async fn cycle(&mut self, key: &str) -> anyhow::Result<()> {
        let give_up = Instant::now() + WAIT;
        loop {
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key, "held", Some(PutOptions::new().with_lease(self.lease)))]);
            if self.client.txn(txn).await?.succeeded() {
                break;
            }
            if Instant::now() >= give_up {
                bail!("busy for longer than {WAIT:?}");
            }
            tokio::time::sleep(POLL).await;
        }
        self.client.delete(key, None).await?;
        Ok(())
    }

    /// Revokes the session lease (and so any key still under it).
    pub async fn close(mut self) {
        let _ = self.client.lease_revoke(self.lease).await;
    }
}
