//! SIGKILL the real coordinator in the middle of a stream of concurrent
//! grants, restart it on the same data directory, and check that every token
//! answered before the kill is lower than every token answered after it.
//! Repeated 20 times: 0 reuse allowed.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Coordinator, ms};
use leasefence_client::{Client, ClientError};
use leasefence_core::ResourceId;

const CYCLES: usize = 20;
const WORKERS: usize = 8;
const RESOURCES: usize = 4;

type Answered = Arc<Mutex<HashMap<String, Vec<u64>>>>;

/// Grants as fast as possible until the coordinator dies, recording every answered token.
async fn grant_until_dead(url: String, worker: usize, answered: Answered) -> usize {
    let Ok(client) = Client::connect(&url).await else {
        return 0;
    };
    let mut n = 0;
    loop {
        let name = format!("crash/{}", (worker + n) % RESOURCES);
        let resource = ResourceId::new(&name).expect("valid");
        match client.acquire(&resource, ms(100), None, ms(2000)).await {
            Ok(lease) => {
                answered
                    .lock()
                    .expect("lock")
                    .entry(name)
                    .or_default()
                    .push(lease.token.get());
                n += 1;
                if client.release(&resource, &lease.lease_id).await.is_err() {
                    return n;
                }
            }
            Err(ClientError::Lease(_)) => {}
            Err(_) => return n,
        }
    }
}

fn max_tokens(a: &Answered) -> HashMap<String, u64> {
    a.lock()
        .expect("lock")
        .iter()
        .map(|(k, v)| (k.clone(), v.iter().copied().max().unwrap_or(0)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_answered_before_a_sigkill_are_below_every_token_after_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut before_max: HashMap<String, u64> = HashMap::new();
    let mut total_grants = 0usize;
    for cycle in 0..CYCLES {
        let coordinator = Coordinator::start(dir.path(), &[]);
        let answered: Answered = Arc::default();
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| tokio::spawn(grant_until_dead(coordinator.url.clone(), w, answered.clone())))
            .collect();
        // Kill at a varying moment in the stream.
        tokio::time::sleep(ms(150 + (cycle as u64 * 37) % 200)).await;
        coordinator.kill();
        for w in workers {
            total_grants += w.await.expect("worker");
        }
        let got = answered.lock().expect("lock").clone();
        for (resource, tokens) in &got {
            let floor = before_max.get(resource).copied().unwrap_or(0);
            let min = tokens.iter().copied().min().unwrap_or(u64::MAX);
            assert!(
                min > floor,
                "cycle {cycle}: {resource} answered token {min} after a restart, but {floor} was answered before it"
            );
        }
        for (resource, max) in max_tokens(&Arc::new(Mutex::new(got))) {
            before_max.insert(resource, max);
        }
    }
    assert!(
        total_grants > CYCLES * 10,
        "the grant stream was too thin to mean anything: {total_grants}"
    );
    // After the last kill, a fresh start still continues above everything answered.
    let coordinator = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&coordinator.url).await.expect("connect");
    for (resource, max) in before_max {
        let r = ResourceId::new(&resource).expect("valid");
        let lease = client
            .acquire(&r, ms(100), None, Duration::from_secs(2))
            .await
            .expect("acquire after restart");
        assert!(
            lease.token.get() > max,
            "{resource}: {} after restart, {max} before",
            lease.token
        );
    }
}
