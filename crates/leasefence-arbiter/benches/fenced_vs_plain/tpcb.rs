//! PostgreSQL with a realistic transaction: pgbench's TPC-B-like script
//! (three UPDATEs, a SELECT and an INSERT), scale 8 (8 branches, 80 tellers,
//! 800,000 accounts), each client on its own branch as pgbench recommends for
//! 8 clients. Fenced adds the fence of `branch/N` to the first UPDATE, folded
//! into it (`postgres::FencedStatement`) or as `postgres::PreparedAdmit`
//! pipelined with it. Tables get a random suffix and are dropped after.

use criterion::Criterion;
use leasefence_arbiter::postgres::{self, FencedStatement, PreparedAdmit};
use leasefence_arbiter::{Fence, FenceMode, ResourceId, Token};
use tokio::runtime::Runtime;
use tokio_postgres::{Client, Statement};

use crate::driver::{Summary, Worker, compare};

const BRANCHES: i32 = 8;
const TELLERS_PER_BRANCH: i32 = 10;
const ACCOUNTS_PER_BRANCH: i32 = 100_000;

/// The fenced side's first UPDATE.
enum Fenced {
    Folded(FencedStatement),
    Pipelined(PreparedAdmit),
}

pub struct TpcbWorker {
    client: Client,
    statements: [Statement; 5],
    fenced: Fenced,
    branch: i32,
    resource: ResourceId,
    token: u64,
    rng: u64,
}

impl TpcbWorker {
    /// xorshift64: the draws only need to spread rows, not to be good random.
    fn draw(&mut self, below: i32) -> i32 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % below as u64) as i32
    }
}

impl Worker for TpcbWorker {
    async fn op(&mut self, fenced: bool) {
        self.token += 1;
        let aid = 1 + self.draw(BRANCHES * ACCOUNTS_PER_BRANCH);
        let tid = (self.branch - 1) * TELLERS_PER_BRANCH + 1 + self.draw(TELLERS_PER_BRANCH);
        let delta = self.draw(10_001) - 5_000;
        let bid = self.branch;
        let [
            update_account,
            select_account,
            update_teller,
            update_branch,
            insert_history,
        ] = &self.statements;
        let tx = self.client.transaction().await.expect("BEGIN");
        let first = || async {
            tx.execute(update_account, &[&delta, &aid])
                .await
                .map_err(leasefence_arbiter::ArbiterError::from)
        };
        let token = Token::new(self.token).expect("tokens start at 1");
        let fence = Fence::new(self.resource.clone(), token);
        match (fenced, &self.fenced) {
            (false, _) => {
                first().await.expect("update account");
            }
            (true, Fenced::Folded(update)) => {
                update
                    .execute(&tx, &fence, FenceMode::Strict, &[&delta, &aid])
                    .await
                    .expect("fenced update account");
            }
            (true, Fenced::Pipelined(admit)) => {
                admit
                    .admit_pipelined(&tx, &fence, FenceMode::Strict, first())
                    .await
                    .expect("admit + update account");
            }
        }
        let _: i32 = tx.query_one(select_account, &[&aid]).await.expect("select").get(0);
        tx.execute(update_teller, &[&delta, &tid]).await.expect("update teller");
        tx.execute(update_branch, &[&delta, &bid]).await.expect("update branch");
        tx.execute(insert_history, &[&tid, &bid, &aid, &delta])
            .await
            .expect("insert history");
        tx.commit().await.expect("COMMIT");
    }
}

async fn workers(url: &str, suffix: &str, prefix: &str, n: usize, folded: bool) -> Vec<TpcbWorker> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let client = postgres::connect(url).await.expect("connect");
        let mut statements = Vec::with_capacity(5);
        let sqls = [
            format!("UPDATE tpcb_accounts_{suffix} SET abalance = abalance + $1 WHERE aid = $2"),
            format!("SELECT abalance FROM tpcb_accounts_{suffix} WHERE aid = $1"),
            format!("UPDATE tpcb_tellers_{suffix} SET tbalance = tbalance + $1 WHERE tid = $2"),
            format!("UPDATE tpcb_branches_{suffix} SET bbalance = bbalance + $1 WHERE bid = $2"),
            format!(
                "INSERT INTO tpcb_history_{suffix} (tid, bid, aid, delta, mtime) VALUES ($1, $2, $3, $4, CURRENT_TIMESTAMP)"
            ),
        ];
        for sql in &sqls {
            statements.push(client.prepare(sql).await.expect("prepare"));
        }
        let (variant, fenced) = match folded {
            true => {
                let update = FencedStatement::prepare(&client, &sqls[0])
                    .await
                    .expect("prepare fenced");
                ("folded", Fenced::Folded(update))
            }
            false => {
                let admit = PreparedAdmit::prepare(&client).await.expect("prepare admit");
                ("pipelined", Fenced::Pipelined(admit))
            }
        };
        let branch = (i as i32 % BRANCHES) + 1;
        out.push(TpcbWorker {
            client,
            statements: statements
                .try_into()
                .unwrap_or_else(|_| unreachable!("five statements")),
            fenced,
            branch,
            resource: ResourceId::new(&format!("{prefix}{variant}/{n}/branch/{branch}")).expect("valid resource"),
            token: 0,
            rng: 0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1),
        });
    }
    out
}

pub fn bench(c: &mut Criterion, rt: &Runtime, url: &str, summary: &mut Summary) {
    let suffix = format!("{:016x}", getrandom::u64().expect("os randomness"));
    let prefix = format!("leasefence-bench/{suffix}/");
    let admin = rt.block_on(async {
        let mut admin = postgres::connect(url).await.expect("connect");
        postgres::install(&mut admin).await.expect("install");
        let accounts = BRANCHES * ACCOUNTS_PER_BRANCH;
        let tellers = BRANCHES * TELLERS_PER_BRANCH;
        // The pgbench schema and fill factors, with our suffix.
        admin
            .batch_execute(&format!(
                "CREATE TABLE tpcb_branches_{suffix} (bid int PRIMARY KEY, bbalance int NOT NULL, filler char(88)) WITH (fillfactor = 100);
                 CREATE TABLE tpcb_tellers_{suffix} (tid int PRIMARY KEY, bid int NOT NULL, tbalance int NOT NULL, filler char(84)) WITH (fillfactor = 100);
                 CREATE TABLE tpcb_accounts_{suffix} (aid int NOT NULL, bid int NOT NULL, abalance int NOT NULL, filler char(84)) WITH (fillfactor = 100);
                 CREATE TABLE tpcb_history_{suffix} (tid int, bid int, aid int, delta int, mtime timestamp, filler char(22));
                 INSERT INTO tpcb_branches_{suffix} SELECT g, 0 FROM generate_series(1, {BRANCHES}) g;
                 INSERT INTO tpcb_tellers_{suffix} SELECT g, (g - 1) / {TELLERS_PER_BRANCH} + 1, 0 FROM generate_series(1, {tellers}) g;
                 INSERT INTO tpcb_accounts_{suffix} SELECT g, (g - 1) / {ACCOUNTS_PER_BRANCH} + 1, 0, '' FROM generate_series(1, {accounts}) g;
                 ALTER TABLE tpcb_accounts_{suffix} ADD PRIMARY KEY (aid);"
            ))
            .await
            .expect("create the TPC-B-like tables");
        // VACUUM cannot share the implicit transaction of a multi-statement batch.
        admin
            .batch_execute(&format!(
                "VACUUM ANALYZE tpcb_branches_{suffix}, tpcb_tellers_{suffix}, tpcb_accounts_{suffix}, tpcb_history_{suffix}"
            ))
            .await
            .expect("vacuum");
        admin
    });
    let clients = BRANCHES as usize;
    for (clients, folded, name) in [
        (1, true, "postgres-tpcb"),
        (clients, true, "postgres-tpcb"),
        (clients, false, "postgres-tpcb-pipelined-admit"),
    ] {
        let mut w = rt.block_on(workers(url, &suffix, &prefix, clients, folded));
        compare(c, rt, name, "tx", &mut w, summary);
    }
    rt.block_on(async {
        admin
            .batch_execute(&format!(
                "DROP TABLE tpcb_branches_{suffix}, tpcb_tellers_{suffix}, tpcb_accounts_{suffix}, tpcb_history_{suffix}"
            ))
            .await
            .expect("drop");
        admin
            .execute("DELETE FROM leasefence_fences WHERE starts_with(resource, $1)", &[&prefix])
            .await
            .expect("forget fences");
    });
}
