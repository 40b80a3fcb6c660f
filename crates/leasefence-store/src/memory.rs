//! A store that keeps everything in memory: not durable, for tests and
//! simulation, and the reference the conformance suite compares against.
//! Clones share the same contents, so "reopening" a clone sees what was written.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use leasefence_core::{Mutation, ResourceId, StoredResource};

use crate::{LeaseStore, StoreError, next_record};

#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    records: Arc<Mutex<BTreeMap<ResourceId, StoredResource>>>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }
}

impl LeaseStore for MemoryStore {
    fn load(&mut self) -> Result<Vec<StoredResource>, StoreError> {
        let records = self.records.lock().map_err(|_| StoreError::Poisoned)?;
        Ok(records.values().cloned().collect())
    }

    fn apply(&mut self, batch: &[Mutation]) -> Result<(), StoreError> {
        let mut records = self.records.lock().map_err(|_| StoreError::Poisoned)?;
        // Stage on a copy so a failing batch changes nothing (atomicity).
        let mut staged = records.clone();
        for m in batch {
            let current = staged.get(m.resource()).cloned();
            if let Some(next) = next_record(current, m)? {
                staged.insert(m.resource().clone(), next);
            }
        }
        *records = staged;
        Ok(())
    }
}
