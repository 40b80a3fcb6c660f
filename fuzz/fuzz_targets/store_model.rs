//! The embedded store against the in-memory reference: the same batches, with
//! reopens in between, give the same answers and the same records.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use leasefence_core::{Holder, LeaseId, Mutation, ReleaseCause, ResourceId, StoredResource, Token};
use leasefence_store::{EmbeddedStore, LeaseStore, MemoryStore};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Grant {
        resource: u8,
        token: u64,
        id: u8,
        ttl_ms: u32,
        lock_delay_ms: u16,
    },
    Release {
        resource: u8,
        token: u64,
        expired: bool,
        lock_delay_ms: u16,
    },
}

#[derive(Arbitrary, Debug)]
struct Step {
    batch: Vec<Op>,
    reopen: bool,
}

fn mutation(op: &Op) -> Option<Mutation> {
    let name = |r: &u8| ResourceId::new(&format!("r{}", r % 4)).ok();
    Some(match op {
        Op::Grant {
            resource,
            token,
            id,
            ttl_ms,
            lock_delay_ms,
        } => Mutation::Grant {
            resource: name(resource)?,
            token: Token::new(*token)?,
            lease_id: LeaseId::from_bytes([*id; 16]),
            holder: Holder::new("fuzz").ok()?,
            ttl: Duration::from_millis(u64::from(*ttl_ms)),
            lock_delay: Duration::from_millis(u64::from(*lock_delay_ms)),
        },
        Op::Release {
            resource,
            token,
            expired,
            lock_delay_ms,
        } => Mutation::Release {
            resource: name(resource)?,
            token: Token::new(*token)?,
            cause: if *expired {
                ReleaseCause::Expired
            } else {
                ReleaseCause::Released
            },
            lock_delay: Duration::from_millis(u64::from(*lock_delay_ms)),
        },
    })
}

fn sorted(mut v: Vec<StoredResource>) -> Vec<StoredResource> {
    v.sort_by(|a, b| a.resource.cmp(&b.resource));
    v
}

fuzz_target!(|steps: Vec<Step>| {
    let Ok(dir) = tempfile::tempdir() else { return };
    let open = || EmbeddedStore::open_dir(dir.path()).expect("open store");
    let mut real = open();
    let mut reference = MemoryStore::new();
    for step in steps.iter().take(16) {
        let batch: Vec<Mutation> = step.batch.iter().take(32).filter_map(mutation).collect();
        let want = reference.apply(&batch);
        let got = real.apply(&batch);
        assert_eq!(got, want, "same answer for {batch:?}");
        if step.reopen {
            drop(real);
            real = open();
        }
        assert_eq!(
            sorted(real.load().expect("load")),
            sorted(reference.load().expect("load"))
        );
    }
});
