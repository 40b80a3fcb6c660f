//! Redis: `SET key value` vs `FCALL leasefence_set` (through `Via::Functions`),
//! one connection per client; `SET` vs the native module's `LEASEFENCE.SET`
//! on a server that loaded it; then, as the reference the goal was set against,
//! `SET` vs a bare Lua check-and-set (no argument checks, `tonumber`
//! comparison, two `SET`s: what a hand-written fence usually looks like, and
//! not exact above 2^53). It exists only here, to show how close the library
//! comes to the cheapest Lua fence in the same run.

use criterion::Criterion;
use leasefence_arbiter::redis::{self as arbiter, Via};
use leasefence_arbiter::{Fence, FenceMode, ResourceId, Token};
use redis::aio::MultiplexedConnection;
use tokio::runtime::Runtime;

use crate::driver::{Summary, Worker, compare};

const VALUE: &str = "a-small-business-value";

const BARE_CAS: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur and tonumber(cur) >= tonumber(ARGV[1]) then
    return redis.error_reply('STALE ' .. ARGV[1] .. ' ' .. cur)
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
return 'OK'
"#;

/// What the fenced side of a worker runs.
#[derive(Clone, Copy)]
enum Fenced {
    Library,
    Module,
    BareCas,
}

pub struct RedisWorker {
    conn: MultiplexedConnection,
    fenced: Fenced,
    bare_cas: redis::Script,
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
            match self.fenced {
                Fenced::Library => Via::Functions
                    .set(&mut self.conn, &fence, FenceMode::Strict, &self.key, VALUE)
                    .await
                    .expect("fenced SET"),
                Fenced::Module => Via::Module
                    .set(&mut self.conn, &fence, FenceMode::Strict, &self.key, VALUE)
                    .await
                    .expect("LEASEFENCE.SET"),
                Fenced::BareCas => {
                    let () = self
                        .bare_cas
                        .key(arbiter::fence_key(&fence.resource))
                        .key(&self.key)
                        .arg(self.token)
                        .arg(VALUE)
                        .invoke_async(&mut self.conn)
                        .await
                        .expect("bare Lua check-and-set");
                }
            }
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

/// The Functions library (and the bare Lua reference) at `url`.
pub fn bench(c: &mut Criterion, rt: &Runtime, url: &str, summary: &mut Summary) {
    rt.block_on(arbiter::install_url(url)).expect("install");
    let cases = [
        (1usize, Fenced::Library, "redis"),
        (50, Fenced::Library, "redis"),
        (50, Fenced::BareCas, "redis-bare-lua-cas"),
    ];
    run_cases(c, rt, url, &cases, summary);
}

/// The native module at `url`, a server started with `--loadmodule`.
pub fn bench_module(c: &mut Criterion, rt: &Runtime, url: &str, summary: &mut Summary) {
    let mut conn = rt.block_on(arbiter::connect(url)).expect("connect");
    rt.block_on(arbiter::module_loaded(&mut conn))
        .expect("the module is loaded");
    let cases = [
        (1usize, Fenced::Module, "redis-module"),
        (50, Fenced::Module, "redis-module"),
    ];
    run_cases(c, rt, url, &cases, summary);
}

fn run_cases(
    c: &mut Criterion,
    rt: &Runtime,
    url: &str,
    cases: &[(usize, Fenced, &'static str)],
    summary: &mut Summary,
) {
    let suffix = format!("{:016x}", getrandom::u64().expect("os randomness"));
    let mut keys = Vec::new();
    for &(clients, fenced, name) in cases {
        let mut w = Vec::with_capacity(clients);
        for i in 0..clients {
            let resource = ResourceId::new(&format!("leasefence-bench/{suffix}/{name}/{clients}/{i}")).expect("valid");
            let key = format!("leasefence:bench:{{{resource}}}");
            keys.push(key.clone());
            keys.push(arbiter::fence_key(&resource));
            let conn = rt.block_on(arbiter::connect(url)).expect("connect");
            w.push(RedisWorker {
                conn,
                fenced,
                bare_cas: redis::Script::new(BARE_CAS),
                key,
                resource,
                token: 0,
            });
        }
        compare(c, rt, name, "SET", &mut w, summary);
    }
    let mut conn = rt.block_on(arbiter::connect(url)).expect("connect");
    let removed: u64 = rt
        .block_on(redis::cmd("DEL").arg(&keys).query_async(&mut conn))
        .expect("cleanup");
    assert!(removed as usize <= keys.len());
}
