//! Redis: `SET key value` vs `FCALL leasefence_set` (through `redis::set`),
//! one connection per client.

use criterion::Criterion;
use leasefence_arbiter::{Fence, FenceMode, ResourceId, Token, redis as arbiter};
use redis::aio::MultiplexedConnection;
use tokio::runtime::Runtime;

use crate::driver::{Summary, Worker, compare};

const VALUE: &str = "a-small-business-value";

pub struct RedisWorker {
    conn: MultiplexedConnection,
    key: String,
    resource: ResourceId,
    token: u64,
}

impl Worker for RedisWorker {
    async fn op(&mut self, fenced: bool) {
        if fenced {
            self.token += 1;
            let token = Token::new(self.token).expect("tokens start at 1");
            let fence = Fence::new(self.resource.clone(), token);
            arbiter::set(&mut self.conn, &fence, FenceMode::Strict, &self.key, VALUE)
                .await
                .expect("fenced SET");
        } else {
            let () = redis::cmd("SET")
                .arg(&self.key)
                .arg(VALUE)
                .query_async(&mut self.conn)
                .await
                .expect("SET");
        }
    }
}

pub fn bench(c: &mut Criterion, rt: &Runtime, url: &str, summary: &mut Summary) {
    let suffix = format!("{:016x}", getrandom::u64().expect("os randomness"));
    let mut keys = Vec::new();
    rt.block_on(arbiter::install_url(url)).expect("install");
    for clients in [1usize, 50] {
        let mut w = Vec::with_capacity(clients);
        for i in 0..clients {
            let resource = ResourceId::new(&format!("leasefence-bench/{suffix}/{clients}/{i}")).expect("valid");
            let key = format!("leasefence:bench:{{{resource}}}");
            keys.push(key.clone());
            keys.push(arbiter::fence_key(&resource));
            let conn = rt.block_on(arbiter::connect(url)).expect("connect");
            w.push(RedisWorker {
                conn,
                key,
                resource,
                token: 0,
            });
        }
        compare(c, rt, "redis", "SET", &mut w, summary);
    }
    let mut conn = rt.block_on(arbiter::connect(url)).expect("connect");
    let removed: u64 = rt
        .block_on(redis::cmd("DEL").arg(&keys).query_async(&mut conn))
        .expect("cleanup");
    assert!(removed as usize <= keys.len());
}
