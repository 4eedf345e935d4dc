//! Concurrency limits per source and per (source, kind), within one worker.
//! Each limit caps how many events of that source or kind this worker runs
//! at once; the claim skips saturated ones.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use tickmark_driver::store::KIND_SEPARATOR;

/// The limits of one worker, and what it runs now.
#[derive(Debug, Default)]
pub struct Limits {
    sources: BTreeMap<String, usize>,
    kinds: BTreeMap<String, usize>,
    running: Mutex<HashMap<String, usize>>,
}

/// A running event's place under its limits; dropping it frees the place.
#[derive(Debug)]
pub struct LimitSlot {
    limits: Arc<Limits>,
    keys: Vec<String>,
}

impl Drop for LimitSlot {
    fn drop(&mut self) {
        let mut running = self
            .limits
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for key in &self.keys {
            if let Some(count) = running.get_mut(key) {
                *count = count.saturating_sub(1);
            }
        }
    }
}

fn kind_key(source: &str, kind: &str) -> String {
    format!("{source}{KIND_SEPARATOR}{kind}")
}

impl Limits {
    pub fn new(sources: BTreeMap<String, usize>, kinds: BTreeMap<(String, String), usize>) -> Self {
        Self {
            sources,
            kinds: kinds
                .into_iter()
                .map(|((source, kind), limit)| (kind_key(&source, &kind), limit))
                .collect(),
            running: Mutex::default(),
        }
    }

    fn is_empty(&self) -> bool {
        self.sources.is_empty() && self.kinds.is_empty()
    }

    /// The sources and kinds at their limits, for the claim to skip.
    pub fn saturated(&self) -> (Vec<String>, Vec<String>) {
        if self.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let full = |limits: &BTreeMap<String, usize>| {
            limits
                .iter()
                .filter(|(key, limit)| running.get(*key).copied().unwrap_or(0) >= **limit)
                .map(|(key, _)| key.clone())
                .collect()
        };
        (full(&self.sources), full(&self.kinds))
    }

    /// Take a place for an event of (`source`, `kind`), or `None` when either
    /// limit is reached (the event must be given back).
    pub fn try_take(self: &Arc<Self>, source: &str, kind: &str) -> Option<LimitSlot> {
        if self.is_empty() {
            return Some(LimitSlot {
                limits: Arc::clone(self),
                keys: Vec::new(),
            });
        }
        let kind_key = kind_key(source, kind);
        let mut keys = Vec::new();
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, limit) in [
            (source.to_owned(), self.sources.get(source)),
            (kind_key.clone(), self.kinds.get(&kind_key)),
        ] {
            if let Some(limit) = limit {
                if running.get(&key).copied().unwrap_or(0) >= *limit {
                    return None;
                }
                keys.push(key);
            }
        }
        for key in &keys {
            *running.entry(key.clone()).or_default() += 1;
        }
        Some(LimitSlot {
            limits: Arc::clone(self),
            keys,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_limit_saturates_and_frees() {
        let limits = Arc::new(Limits::new(
            BTreeMap::from([("stripe".to_owned(), 2)]),
            BTreeMap::from([(("github".to_owned(), "push".to_owned()), 1)]),
        ));
        let a = limits.try_take("stripe", "x").unwrap();
        let _b = limits.try_take("stripe", "y").unwrap();
        assert!(limits.try_take("stripe", "z").is_none());
        assert_eq!(limits.saturated().0, vec!["stripe".to_owned()]);
        drop(a);
        assert!(limits.saturated().0.is_empty());
        let _push = limits.try_take("github", "push").unwrap();
        assert!(limits.try_take("github", "push").is_none());
        assert!(limits.try_take("github", "issues").is_some());
        assert_eq!(limits.saturated().1, vec![kind_key("github", "push")]);
    }
}
