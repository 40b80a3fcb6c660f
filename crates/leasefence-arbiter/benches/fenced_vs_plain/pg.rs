//! PostgreSQL: a transaction that upserts one business row, with and without
//! `leasefence_admit` (through `postgres::PreparedAdmit::admit_pipelined`, the
//! prepared admit sent together with the upsert). At 8 clients also, as a
//! reference, the cheapest hand-written SQL fence: a prepared
//! `UPDATE fence SET last = $2 WHERE key = $1 AND last < $2`, pipelined the
//! same way, on a table of the bench's own (no first-admit insert, no typed
//! rejection). It shows what any fence row costs in the same run.

use criterion::Criterion;
use leasefence_arbiter::postgres::{self, PreparedAdmit};
use leasefence_arbiter::{Fence, FenceMode, ResourceId, Token};
use tokio::runtime::Runtime;
use tokio_postgres::{Client, Statement};

use crate::driver::{Summary, Worker, compare};

pub struct PgWorker {
    client: Client,
    upsert: Statement,
    admit: PreparedAdmit,
    /// Set for the reference workers: their fenced side runs this instead.
    bare_update: Option<Statement>,
    key: String,
    resource: ResourceId,
    token: u64,
}

impl Worker for PgWorker {
    async fn op(&mut self, fenced: bool) {
        self.token += 1;
        let value = self.token as i64;
        let tx = self.client.transaction().await.expect("BEGIN");
        let upsert = async { tx.execute(&self.upsert, &[&self.key, &value]).await };
        if let (true, Some(bare)) = (fenced, &self.bare_update) {
            let fence = async { tx.execute(bare, &[&self.key, &value]).await };
            let (f, u) = tokio::join!(biased; fence, upsert);
            assert_eq!(f.expect("bare fence update"), 1, "the bare fence admits every token");
            u.expect("upsert");
        } else if fenced {
            // The recommended fast path: the admit pipelined with the effect's
            // statement, so a fenced transaction costs no extra round trip.
            let token = Token::new(self.token).expect("tokens start at 1");
            let fence = Fence::new(self.resource.clone(), token);
            let upsert = async { upsert.await.map_err(leasefence_arbiter::ArbiterError::from) };
            self.admit
                .admit_pipelined(&tx, &fence, FenceMode::Strict, upsert)
                .await
                .expect("admit + upsert");
        } else {
            upsert.await.expect("upsert");
        }
        tx.commit().await.expect("COMMIT");
    }
}

async fn workers(url: &str, table: &str, prefix: &str, n: usize, bare: bool) -> Vec<PgWorker> {
    let mut out = Vec::with_capacity(n);
    for i in 0..out.capacity() {
        let client = postgres::connect(url).await.expect("connect");
        let sql = format!(
            "INSERT INTO {table} (key, val) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET val = excluded.val"
        );
        let upsert = client.prepare(&sql).await.expect("prepare");
        let admit = PreparedAdmit::prepare(&client).await.expect("prepare admit");
        let name = if bare { "bare" } else { "lib" };
        let key = format!("{prefix}{name}/{n}/{i}");
        let bare_update = match bare {
            true => {
                let insert = format!("INSERT INTO {table}_fence (key, last) VALUES ($1, 0)");
                client.execute(&insert, &[&key]).await.expect("reference fence row");
                let update = format!("UPDATE {table}_fence SET last = $2 WHERE key = $1 AND last < $2");
                Some(client.prepare(&update).await.expect("prepare"))
            }
            false => None,
        };
        out.push(PgWorker {
            client,
            upsert,
            admit,
            bare_update,
            resource: ResourceId::new(&key).expect("valid resource"),
            key,
            token: 0,
        });
    }
    out
}

pub fn bench(c: &mut Criterion, rt: &Runtime, url: &str, summary: &mut Summary) {
    let suffix = format!("{:016x}", getrandom::u64().expect("os randomness"));
    let table = format!("leasefence_bench_{suffix}");
    let prefix = format!("leasefence-bench/{suffix}/");
    let admin = rt.block_on(async {
        let mut admin = postgres::connect(url).await.expect("connect");
        postgres::install(&mut admin).await.expect("install");
        let ddl = format!(
            "CREATE TABLE {table} (key text PRIMARY KEY, val bigint NOT NULL);
             CREATE TABLE {table}_fence (key text PRIMARY KEY, last bigint NOT NULL)"
        );
        admin.batch_execute(&ddl).await.expect("create table");
        admin
    });
    for (clients, bare, name) in [
        (1, false, "postgres"),
        (8, false, "postgres"),
        (8, true, "postgres-bare-update"),
    ] {
        let mut w = rt.block_on(workers(url, &table, &prefix, clients, bare));
        compare(c, rt, name, "tx", &mut w, summary);
    }
    rt.block_on(async {
        admin
            .batch_execute(&format!("DROP TABLE {table}, {table}_fence"))
            .await
            .expect("drop");
        admin
            .execute(
                "DELETE FROM leasefence_fences WHERE starts_with(resource, $1)",
                &[&prefix],
            )
            .await
            .expect("forget fences");
    });
}
