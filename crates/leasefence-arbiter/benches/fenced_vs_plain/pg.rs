//! PostgreSQL: a transaction that upserts one business row, with and without
//! the fence, two ways: `postgres::FencedStatement` (the fence folded into the
//! upsert: one statement) and `postgres::PreparedAdmit::admit_pipelined` (the
//! prepared admit sent together with the upsert: two statements). At 8
//! clients also, as a reference, the cheapest hand-written second statement:
//! a prepared `UPDATE fence SET last = $2 WHERE key = $1 AND last < $2`,
//! pipelined the same way, on a table of the bench's own (no first-admit
//! insert, no typed rejection). It shows what a second statement costs in the
//! same run.

use criterion::Criterion;
use leasefence_arbiter::postgres::{self, FencedStatement, PreparedAdmit};
use leasefence_arbiter::{Fence, FenceMode, ResourceId, Token};
use tokio::runtime::Runtime;
use tokio_postgres::{Client, Statement};

use crate::driver::{Summary, Worker, compare};

/// What the fenced side of a worker runs.
enum Fenced {
    Folded(FencedStatement),
    Pipelined(PreparedAdmit),
    /// The reference: a hand-written fence `UPDATE`, pipelined.
    BareUpdate(Statement),
}

#[derive(Clone, Copy)]
enum Variant {
    Folded,
    Pipelined,
    BareUpdate,
}

pub struct PgWorker {
    client: Client,
    upsert: Statement,
    fenced: Fenced,
    key: String,
    resource: ResourceId,
    token: u64,
}

impl Worker for PgWorker {
    async fn op(&mut self, fenced: bool) {
        self.token += 1;
        let value = self.token as i64;
        let tx = self.client.transaction().await.expect("BEGIN");
        let upsert = || async { tx.execute(&self.upsert, &[&self.key, &value]).await };
        let token = Token::new(self.token).expect("tokens start at 1");
        let fence = Fence::new(self.resource.clone(), token);
        match (fenced, &self.fenced) {
            (false, _) => {
                upsert().await.expect("upsert");
            }
            (true, Fenced::Folded(statement)) => {
                let n = statement
                    .execute(&tx, &fence, FenceMode::Strict, &[&self.key, &value])
                    .await
                    .expect("fenced upsert");
                assert_eq!(n, 1, "the upsert writes its row");
            }
            (true, Fenced::Pipelined(admit)) => {
                // The admit pipelined with the effect's statement, so a fenced
                // transaction costs no extra round trip.
                let upsert = async { upsert().await.map_err(leasefence_arbiter::ArbiterError::from) };
                admit
                    .admit_pipelined(&tx, &fence, FenceMode::Strict, upsert)
                    .await
                    .expect("admit + upsert");
            }
            (true, Fenced::BareUpdate(bare)) => {
                let fence = async { tx.execute(bare, &[&self.key, &value]).await };
                let (f, u) = tokio::join!(biased; fence, upsert());
                assert_eq!(f.expect("bare fence update"), 1, "the bare fence admits every token");
                u.expect("upsert");
            }
        }
        tx.commit().await.expect("COMMIT");
    }
}

async fn workers(url: &str, table: &str, prefix: &str, n: usize, variant: Variant) -> Vec<PgWorker> {
    let mut out = Vec::with_capacity(n);
    for i in 0..out.capacity() {
        let client = postgres::connect(url).await.expect("connect");
        let sql = format!(
            "INSERT INTO {table} (key, val) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET val = excluded.val"
        );
        let upsert = client.prepare(&sql).await.expect("prepare");
        let (name, fenced) = match variant {
            Variant::Folded => {
                let statement = FencedStatement::prepare(&client, &sql).await.expect("prepare fenced");
                ("folded", Fenced::Folded(statement))
            }
            Variant::Pipelined => {
                let admit = PreparedAdmit::prepare(&client).await.expect("prepare admit");
                ("pipelined", Fenced::Pipelined(admit))
            }
            Variant::BareUpdate => {
                let update = format!("UPDATE {table}_fence SET last = $2 WHERE key = $1 AND last < $2");
                (
                    "bare",
                    Fenced::BareUpdate(client.prepare(&update).await.expect("prepare")),
                )
            }
        };
        let key = format!("{prefix}{name}/{n}/{i}");
        if let Variant::BareUpdate = variant {
            let insert = format!("INSERT INTO {table}_fence (key, last) VALUES ($1, 0)");
            client.execute(&insert, &[&key]).await.expect("reference fence row");
        }
        out.push(PgWorker {
            client,
            upsert,
            fenced,
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
    for (clients, variant, name) in [
        (1, Variant::Folded, "postgres"),
        (8, Variant::Folded, "postgres"),
        (1, Variant::Pipelined, "postgres-pipelined-admit"),
        (8, Variant::Pipelined, "postgres-pipelined-admit"),
        (8, Variant::BareUpdate, "postgres-bare-update"),
    ] {
        let mut w = rt.block_on(workers(url, &table, &prefix, clients, variant));
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
