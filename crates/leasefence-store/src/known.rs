//! What a shared store's writer knows of the records it last read or wrote,
//! so that a batch on them can be computed and written without reading them
//! first. It only ever saves a read: every write made from it compares each
//! record with what was known, in the engine and in the write's own
//! transaction, and a record someone else changed is read again.

use std::collections::HashMap;

/// Most records a writer keeps. Past it the knowledge is dropped whole and
/// rebuilt by the batches that follow: forgetting costs a read, never a
/// wrong write. A few hundred bytes each.
pub(crate) const KNOWN_MAX: usize = 65_536;

/// Records by resource, each as the writer last read or wrote it (`V`: the
/// record and what the engine compares it by: a revision, its bytes).
pub(crate) struct Known<V> {
    records: HashMap<String, V>,
}

impl<V> Default for Known<V> {
    fn default() -> Known<V> {
        Known {
            records: HashMap::new(),
        }
    }
}

impl<V: Clone> Known<V> {
    pub(crate) fn forget(&mut self) {
        self.records.clear();
    }

    /// Every record of `resources`, if all are known.
    pub(crate) fn all<'a>(&self, resources: impl IntoIterator<Item = &'a str>) -> Option<HashMap<&'a str, V>> {
        let resources = resources.into_iter();
        let mut out = HashMap::with_capacity(resources.size_hint().0);
        for r in resources {
            out.insert(r, self.records.get(r)?.clone());
        }
        Some(out)
    }

    pub(crate) fn learn(&mut self, records: impl IntoIterator<Item = (String, V)>) {
        for (r, v) in records {
            if self.records.len() >= KNOWN_MAX && !self.records.contains_key(&r) {
                self.records.clear();
            }
            self.records.insert(r, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_some_only_when_every_record_is_known() {
        let mut k = Known::default();
        k.learn([("a".to_string(), 1), ("b".to_string(), 2)]);
        let both = k.all(["a", "b"]).expect("both known");
        assert_eq!((both["a"], both["b"]), (1, 2));
        assert!(k.all(["a", "c"]).is_none(), "c was never learned");
        k.learn([("a".to_string(), 3)]);
        assert_eq!(k.all(["a"]).map(|m| m["a"]), Some(3), "the latest learned wins");
        k.forget();
        assert!(k.all(["a"]).is_none());
    }

    #[test]
    fn past_the_bound_knowledge_starts_over() {
        let mut k = Known::default();
        k.learn((0..KNOWN_MAX).map(|i| (i.to_string(), i)));
        k.learn([("0".to_string(), 7)]);
        assert_eq!(
            k.all(["0", "1"]).map(|m| (m["0"], m["1"])),
            Some((7, 1)),
            "a known record is replaced in place"
        );
        k.learn([("new".to_string(), 0)]);
        assert!(k.all(["1"]).is_none(), "full: the old records were dropped");
        assert!(k.all(["new"]).is_some());
    }
}
