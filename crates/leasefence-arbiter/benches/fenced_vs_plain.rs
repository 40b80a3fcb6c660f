//! Fenced vs plain throughput: PostgreSQL transactions at 1 and 8 clients
//! (a one-row upsert, the worst case for the fence's relative cost, and
//! pgbench's TPC-B-like transaction), Redis `SET` at 1 and 50 clients
//! through the Functions library and through the native module.
//!
//! Plain is the business write alone; fenced is the same write plus the
//! arbiter (PostgreSQL: the fence folded into the write's statement, or
//! admitted by a second, pipelined one, in the same transaction; Redis:
//! `FCALL leasefence_set` or `LEASEFENCE.SET` instead of `SET`). Each client has its own connection, its own fence key and
//! row, and one operation in flight; `iter_custom` splits N operations across
//! the clients on a multi-thread runtime and reports wall time. At the end a
//! side-by-side summary prints ops/s and the ratio fenced/plain, measured in
//! alternating plain/fenced rounds after each group (fair under drifting
//! load). A backend whose URL variable (`LEASEFENCE_TEST_POSTGRES_URL`,
//! `LEASEFENCE_TEST_REDIS_URL`, `LEASEFENCE_TEST_REDIS_MODULE_URL`) is unset
//! is skipped with a message.

#[path = "fenced_vs_plain/driver.rs"]
mod driver;
#[path = "fenced_vs_plain/pg.rs"]
mod pg;
#[path = "fenced_vs_plain/rd.rs"]
mod rd;
#[path = "fenced_vs_plain/tpcb.rs"]
mod tpcb;

use std::time::Duration;

use criterion::Criterion;
use driver::Summary;

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut summary = Summary::default();
    match std::env::var("LEASEFENCE_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => {
            pg::bench(&mut c, &rt, &url, &mut summary);
            tpcb::bench(&mut c, &rt, &url, &mut summary);
        }
        _ => println!("skipped postgres: LEASEFENCE_TEST_POSTGRES_URL not set"),
    }
    match std::env::var("LEASEFENCE_TEST_REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => rd::bench(&mut c, &rt, &url, &mut summary),
        _ => println!("skipped redis: LEASEFENCE_TEST_REDIS_URL not set"),
    }
    match std::env::var("LEASEFENCE_TEST_REDIS_MODULE_URL") {
        Ok(url) if !url.trim().is_empty() => rd::bench_module(&mut c, &rt, &url, &mut summary),
        _ => println!("skipped the redis module: LEASEFENCE_TEST_REDIS_MODULE_URL not set"),
    }
    c.final_summary();
    summary.print();
}
