//! How long one batch commit of the PostgreSQL store takes: acquire and
//! release batches of 1, 16 and 64 mutations, each one `apply` (one engine
//! transaction), as the committer would hand them over.
//!
//! `cargo run --release -p leasefence-store --features postgres --example postgres_commit_latency -- postgres://postgres@127.0.0.1:5432/test`
//!
//! Works in a schema of its own and drops it at the end.

use std::time::{Duration, Instant};

use leasefence_core::{Holder, LeaseId, Mutation, ReleaseCause, ResourceId, Token};
use leasefence_store::{LeaseStore, PostgresConfig, PostgresShared, SharedStore};

const ROUNDS: usize = 500;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("LEASEFENCE_TEST_POSTGRES_URL").ok())
        .ok_or("usage: postgres_commit_latency POSTGRES_URL")?;
    let schema = format!("lf_store_latency_{}", std::process::id());
    let result = measure(&url, &schema);
    drop_schema(&url, &schema)?;
    result
}

fn measure(url: &str, schema: &str) -> Result<(), Box<dyn std::error::Error>> {
    let store = PostgresShared::open(PostgresConfig::new(url)?.with_schema(schema)?)?;
    let epoch = store
        .campaign("http://bench.example:7070", Duration::from_secs(600))?
        .ok_or("another leader holds the shard")?;
    let mut w = store.writer(epoch)?;
    let holder = Holder::new("bench")?;
    for size in [1usize, 16, 64] {
        // Half grants, half releases of the resources granted before (a
        // batch of 1 alternates a grant and a release).
        let per_batch = size.div_ceil(2).max(1);
        let mut token = 0u64;
        let mut samples = Vec::with_capacity(ROUNDS * 2);
        for round in 0..ROUNDS {
            token += 1;
            let t = Token::new(token).ok_or("token 0")?;
            let names: Vec<ResourceId> = (0..per_batch)
                .map(|i| ResourceId::new(&format!("bench/{size}/{i}")))
                .collect::<Result<_, _>>()?;
            let grants: Vec<Mutation> = names
                .iter()
                .map(|r| Mutation::Grant {
                    resource: r.clone(),
                    token: t,
                    lease_id: LeaseId::from_bytes([round as u8; 16]),
                    holder: holder.clone(),
                    ttl: Duration::from_secs(10),
                    lock_delay: Duration::ZERO,
                })
                .collect();
            let releases: Vec<Mutation> = names
                .iter()
                .map(|r| Mutation::Release {
                    resource: r.clone(),
                    token: t,
                    cause: ReleaseCause::Released,
                    lock_delay: Duration::ZERO,
                })
                .collect();
            let batches: Vec<Vec<Mutation>> = if size == 1 {
                vec![grants, releases]
            } else {
                vec![grants.into_iter().chain(releases).take(size).collect()]
            };
            for b in batches {
                let start = Instant::now();
                w.apply(&b)?;
                samples.push(start.elapsed());
            }
        }
        samples.sort();
        let pct = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
        let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
        println!(
            "batch of {size:>2}: {} commits, mean {mean:?}, p50 {:?}, p99 {:?}, max {:?}",
            samples.len(),
            pct(0.50),
            pct(0.99),
            pct(1.0)
        );
    }
    store.resign(epoch)?;
    Ok(())
}

fn drop_schema(url: &str, schema: &str) -> Result<(), Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .await?;
        Ok(())
    })
}
