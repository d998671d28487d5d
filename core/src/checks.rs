//! When each key must be looked at next: the schedule the waiters' lines
//! and the observers share (a key's lease ends, something wrote to it).
//! One pending check per key, found by key and by time.

use std::collections::{BTreeMap, BTreeSet};

/// Keys to look at, each at one time.
#[derive(Debug)]
pub struct Checks<K> {
    by_key: BTreeMap<K, i64>,
    by_time: BTreeSet<(i64, K)>,
}

impl<K> Default for Checks<K> {
    fn default() -> Self {
        Checks {
            by_key: BTreeMap::new(),
            by_time: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Clone> Checks<K> {
    /// Looks at `key` by `at_ms`: an earlier pending check stays.
    pub fn schedule(&mut self, key: &K, at_ms: i64) {
        match self.by_key.get(key) {
            Some(&pending) if pending <= at_ms => {}
            _ => self.set(key, at_ms),
        }
    }

    /// Looks at `key` at exactly `at_ms`, in place of a pending check.
    pub fn set(&mut self, key: &K, at_ms: i64) {
        if let Some(pending) = self.by_key.insert(key.clone(), at_ms) {
            self.by_time.remove(&(pending, key.clone()));
        }
        self.by_time.insert((at_ms, key.clone()));
    }

    /// `key` needs no look any more.
    pub fn cancel(&mut self, key: &K) {
        if let Some(pending) = self.by_key.remove(key) {
            self.by_time.remove(&(pending, key.clone()));
        }
    }

    /// When the next check is due.
    pub fn next(&self) -> Option<i64> {
        self.by_time.first().map(|(at, _)| *at)
    }

    /// The keys due by `now_ms`, in time order, their checks taken.
    pub fn take_due(&mut self, now_ms: i64) -> Vec<K> {
        let mut due = Vec::new();
        while let Some((at, _)) = self.by_time.first() {
            if *at > now_ms {
                break;
            }
            let (_, key) = self.by_time.pop_first().expect("seen above");
            self.by_key.remove(&key);
            due.push(key);
        }
        due
    }

    /// Renames every key (SWAPDB moves whole databases); `f` must be a
    /// bijection on the keys present.
    pub fn rename_keys(&mut self, f: impl Fn(&K) -> K) {
        self.by_key = std::mem::take(&mut self.by_key)
            .into_iter()
            .map(|(k, at)| (f(&k), at))
            .collect();
        self.by_time = std::mem::take(&mut self.by_time)
            .into_iter()
            .map(|(at, k)| (at, f(&k)))
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_check_per_key_the_earliest_unless_set() {
        let mut c = Checks::default();
        c.schedule(&"a", 50);
        c.schedule(&"a", 80);
        c.schedule(&"b", 60);
        assert_eq!(c.next(), Some(50));
        c.set(&"a", 90);
        assert_eq!(c.next(), Some(60));
        assert_eq!(c.take_due(70), vec!["b"]);
        assert_eq!(c.take_due(100), vec!["a"]);
        assert_eq!(c.next(), None);
        c.schedule(&"a", 10);
        c.cancel(&"a");
        assert_eq!((c.next(), c.take_due(i64::MAX)), (None, vec![]));
    }

    #[test]
    fn renames_move_the_checks() {
        let mut c = Checks::default();
        c.schedule(&(0, "k"), 5);
        c.schedule(&(1, "k"), 7);
        c.rename_keys(|&(db, k)| (1 - db, k));
        assert_eq!(c.take_due(10), vec![(1, "k"), (0, "k")]);
    }
}
