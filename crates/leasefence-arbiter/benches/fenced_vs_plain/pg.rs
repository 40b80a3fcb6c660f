//! PostgreSQL: a transaction that upserts one business row, with and without
//! `leasefence_admit` (through `postgres::PreparedAdmit::admit_pipelined`, the
//! prepared admit sent together with the upsert).

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
        if fenced {
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

async fn workers(url: &str, table: &str, prefix: &str, n: usize) -> Vec<PgWorker> {
    let mut out = Vec::with_capacity(n);
    for i in 0..out.capacity() {
        let client = postgres::connect(url).await.expect("connect");
        let sql = format!(
            "INSERT INTO {table} (key, val) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET val = excluded.val"
        );
        let upsert = client.prepare(&sql).await.expect("prepare");
        let admit = PreparedAdmit::prepare(&client).await.expect("prepare admit");
        out.push(PgWorker {
            client,
            upsert,
            admit,
            key: format!("{prefix}{n}/{i}"),
            resource: ResourceId::new(&format!("{prefix}{n}/{i}")).expect("valid resource"),
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
        let ddl = format!("CREATE TABLE {table} (key text PRIMARY KEY, val bigint NOT NULL)");
        admin.batch_execute(&ddl).await.expect("create table");
        admin
    });
    for clients in [1, 8] {
        let mut w = rt.block_on(workers(url, &table, &prefix, clients));
        compare(c, rt, "postgres", "tx", &mut w, summary);
    }
    rt.block_on(async {
        admin.batch_execute(&format!("DROP TABLE {table}")).await.expect("drop");
        admin
            .execute(
                "DELETE FROM leasefence_fences WHERE starts_with(resource, $1)",
                &[&prefix],
            )
            .await
            .expect("forget fences");
    });
}
