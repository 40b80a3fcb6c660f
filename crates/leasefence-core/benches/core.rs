//! Micro-benchmarks of the pure logic: the lease machine's acquire+release
//! cycle on a machine holding 1,000 and 1,000,000 other resources (the cost
//! per call should not grow with the map), a grant and its expiry through the
//! deadline queue, the arbiter rule, and signing and verifying a fence.
//!
//! `cargo bench -p leasefence-core` (criterion; `-- --quick` for a short run).
//! These time the machine alone, without I/O: BENCHMARKS.md puts them beside
//! the end-to-end figures.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use leasefence_core::signing::{FenceKey, Verifier};
use leasefence_core::{
    AcquireOutcome, AcquireRequest, Config, Coordinator, Fence, FenceMode, Holder, LeaseId, MonoTime, ResourceId,
    Token, admit,
};

fn request(resource: &ResourceId, n: u64, ttl: Duration) -> AcquireRequest {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&n.to_le_bytes());
    AcquireRequest {
        resource: resource.clone(),
        holder: Holder::new("bench").expect("holder"),
        ttl,
        lease_id: LeaseId::from_bytes(id),
        wait: false,
        lock_delay: Duration::ZERO,
    }
}

/// A machine that has granted and released `n` resources once each.
fn machine_with(n: usize) -> Coordinator {
    let mut m = Coordinator::new(Config::default());
    for i in 0..n {
        let r = ResourceId::new(&format!("idle/{i}")).expect("name");
        let req = request(&r, i as u64, Duration::from_secs(10));
        let id = req.lease_id;
        if let Ok(AcquireOutcome::Granted(_)) = m.acquire(MonoTime::ZERO, req) {
            let _ = m.release(MonoTime::ZERO, &r, &id);
        }
    }
    m
}

fn cycle(c: &mut Criterion) {
    for n in [1_000, 1_000_000] {
        let mut m = machine_with(n);
        let r = ResourceId::new("hot").expect("name");
        let mut i = 0u64;
        c.bench_function(&format!("machine: acquire+release among {n} resources"), |b| {
            b.iter(|| {
                i += 1;
                let req = request(&r, i, Duration::from_secs(10));
                let id = req.lease_id;
                let granted = m.acquire(MonoTime::from_millis(i), req);
                black_box(&granted);
                black_box(m.release(MonoTime::from_millis(i), &r, &id)).ok();
            })
        });
    }
}

fn expiry(c: &mut Criterion) {
    c.bench_function("machine: grant, then expire through the deadline queue", |b| {
        b.iter_batched(
            || (Coordinator::new(Config::default()), ResourceId::new("e").expect("name")),
            |(mut m, r)| {
                let _ = m.acquire(MonoTime::ZERO, request(&r, 1, Duration::from_millis(100)));
                m.advance(MonoTime::from_millis(101));
                black_box(m.resource_count())
            },
            BatchSize::SmallInput,
        )
    });
}

fn rule(c: &mut Criterion) {
    let r = ResourceId::new("orders").expect("name");
    let (current, presented) = (Token::new(41).expect("token"), Token::new(42).expect("token"));
    c.bench_function("arbiter rule: admit", |b| {
        b.iter(|| {
            admit(
                FenceMode::Strict,
                black_box(&r),
                Some(black_box(current)),
                black_box(presented),
            )
        })
    });
    let key = FenceKey::new("k1", [7; 32]).expect("key");
    let verifier = Verifier::new(vec![key.clone()]).expect("verifier");
    let fence = Fence::new(r.clone(), presented);
    c.bench_function("signed fences: sign", |b| b.iter(|| key.sign(black_box(&fence))));
    let signature = key.sign(&fence);
    c.bench_function("signed fences: verify", |b| {
        b.iter(|| verifier.verify(black_box(&fence), Some(black_box(&signature))))
    });
}

criterion_group!(benches, cycle, expiry, rule);
criterion_main!(benches);
