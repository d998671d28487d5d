//! Waiting rules: one FIFO queue of waiters per lock, plus a registry so a
//! waiter that leaves (timeout, disconnect, CLIENT UNBLOCK) is removed in
//! O(1). Removed waiters stay in their queue as stale ids that `pop_front`
//! skips; a queue is compacted when stale ids outnumber live ones, and
//! dropped when its last waiter leaves, so memory returns to its baseline
//! once waiters drain.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

pub type WaiterId = u64;

/// A scheduled hand-off check: when it runs, and the timer that runs it.
pub type TimerId = u64;

struct KeyQueue {
    order: VecDeque<WaiterId>,
    live: usize,
    /// The one hand-off check pending for this key, if any.
    check: Option<(i64, TimerId)>,
}

/// What to do to have a hand-off check run at a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Nobody waits, or a check no later than that is already pending.
    NotNeeded,
    /// Start a timer.
    New,
    /// Stop this (later) timer and start one for the earlier time.
    Replace(TimerId),
}

pub struct WaitQueues<K, W> {
    queues: HashMap<K, KeyQueue>,
    waiters: HashMap<WaiterId, (K, W)>,
    /// Timers of queues that emptied: the caller stops them.
    orphaned_timers: Vec<TimerId>,
}

impl<K: Hash + Eq + Clone, W> Default for WaitQueues<K, W> {
    fn default() -> Self {
        WaitQueues {
            queues: HashMap::new(),
            waiters: HashMap::new(),
            orphaned_timers: Vec::new(),
        }
    }
}

impl<K: Hash + Eq + Clone, W> WaitQueues<K, W> {
    /// Appends a waiter to the back of `key`'s queue. Ids are unique; a
    /// duplicate is refused (returns false) and changes nothing.
    pub fn push(&mut self, key: K, id: WaiterId, waiter: W) -> bool {
        if self.waiters.contains_key(&id) {
            return false;
        }
        let queue = self.queues.entry(key.clone()).or_insert_with(|| KeyQueue {
            order: VecDeque::new(),
            live: 0,
            check: None,
        });
        queue.order.push_back(id);
        queue.live += 1;
        self.waiters.insert(id, (key, waiter));
        true
    }

    /// Removes a waiter wherever it is in its queue.
    pub fn remove(&mut self, id: WaiterId) -> Option<(K, W)> {
        let (key, waiter) = self.waiters.remove(&id)?;
        if let Some(queue) = self.queues.get_mut(&key) {
            queue.live -= 1;
            if queue.live == 0 {
                self.drop_queue(&key);
            } else if queue.order.len() > 2 * queue.live + 16 {
                let waiters = &self.waiters;
                queue.order.retain(|id| waiters.contains_key(id));
            }
        }
        self.release_memory();
        Some((key, waiter))
    }

    /// Takes the first waiter still in `key`'s queue.
    pub fn pop_front(&mut self, key: &K) -> Option<(WaiterId, W)> {
        let queue = self.queues.get_mut(key)?;
        let mut found = None;
        while let Some(id) = queue.order.pop_front() {
            if let Some((_, waiter)) = self.waiters.remove(&id) {
                queue.live -= 1;
                found = Some((id, waiter));
                break;
            }
        }
        if queue.live == 0 {
            self.drop_queue(key);
        }
        self.release_memory();
        found
    }

    pub fn waiting_on(&self, key: &K) -> usize {
        self.queues.get(key).map_or(0, |q| q.live)
    }

    pub fn total(&self) -> usize {
        self.waiters.len()
    }

    /// Keys that have waiters.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.queues.keys()
    }

    fn drop_queue(&mut self, key: &K) {
        if let Some(KeyQueue {
            check: Some((_, timer)),
            ..
        }) = self.queues.remove(key)
        {
            self.orphaned_timers.push(timer);
        }
    }

    /// How to have a hand-off check for `key` run at `at_ms`. Each key has
    /// at most one pending check, the earliest needed: when it runs it
    /// schedules the next one itself.
    pub fn plan_check(&self, key: &K, at_ms: i64) -> Schedule {
        match self.queues.get(key).map(|q| q.check) {
            None => Schedule::NotNeeded,
            Some(None) => Schedule::New,
            Some(Some((pending_at, _))) if pending_at <= at_ms => Schedule::NotNeeded,
            Some(Some((_, timer))) => Schedule::Replace(timer),
        }
    }

    /// A timer was started for the check planned at `at_ms`.
    pub fn check_scheduled(&mut self, key: &K, at_ms: i64, timer: TimerId) {
        if let Some(q) = self.queues.get_mut(key) {
            q.check = Some((at_ms, timer));
        }
    }

    /// The check planned for `at_ms` is running now.
    pub fn check_started(&mut self, key: &K, at_ms: i64) {
        if let Some(q) = self.queues.get_mut(key) {
            if q.check.is_some_and(|(at, _)| at == at_ms) {
                q.check = None;
            }
        }
    }

    /// Timers of checks nobody needs any more (their queue emptied).
    pub fn take_orphaned_timers(&mut self) -> Vec<TimerId> {
        std::mem::take(&mut self.orphaned_timers)
    }

    /// Hash maps keep their capacity: give it back once they are mostly empty.
    fn release_memory(&mut self) {
        if self.waiters.is_empty() {
            self.waiters = HashMap::new();
            self.queues = HashMap::new();
        } else if self.waiters.capacity() > 4 * self.waiters.len() + 64 {
            self.waiters.shrink_to_fit();
            self.queues.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Q = WaitQueues<&'static str, &'static str>;

    #[test]
    fn waiters_are_served_first_in_first_out_per_key() {
        let mut q = Q::default();
        q.push("k", 1, "a");
        q.push("other", 2, "x");
        q.push("k", 3, "b");
        assert_eq!(q.waiting_on(&"k"), 2);
        assert_eq!(q.pop_front(&"k"), Some((1, "a")));
        assert_eq!(q.pop_front(&"k"), Some((3, "b")));
        assert_eq!(q.pop_front(&"k"), None);
        assert_eq!(q.total(), 1);
    }

    #[test]
    fn a_waiter_that_left_is_skipped() {
        let mut q = Q::default();
        q.push("k", 1, "a");
        q.push("k", 2, "b");
        q.push("k", 3, "c");
        assert_eq!(q.remove(2), Some(("k", "b")));
        assert_eq!(q.remove(2), None, "already gone");
        assert_eq!(q.waiting_on(&"k"), 2);
        assert_eq!(q.pop_front(&"k"), Some((1, "a")));
        assert_eq!(q.pop_front(&"k"), Some((3, "c")));
    }

    #[test]
    fn duplicate_ids_are_refused() {
        let mut q = Q::default();
        assert!(q.push("k", 1, "a"));
        assert!(!q.push("j", 1, "b"));
        assert_eq!(q.total(), 1);
        assert_eq!(q.waiting_on(&"j"), 0);
    }

    #[test]
    fn queues_disappear_when_their_last_waiter_leaves() {
        let mut q = Q::default();
        for id in 0..1000 {
            q.push("k", id, "w");
        }
        for id in 0..999 {
            q.remove(id);
        }
        assert!(q.queues[&"k"].order.len() < 100, "compacted");
        q.remove(999);
        assert_eq!(q.keys().count(), 0);
        assert_eq!(q.waiters.capacity(), 0, "memory given back");
    }

    #[test]
    fn one_check_per_key_the_earliest_needed() {
        let mut q = Q::default();
        assert_eq!(q.plan_check(&"k", 100), Schedule::NotNeeded, "nobody waits");
        q.push("k", 1, "a");
        assert_eq!(q.plan_check(&"k", 100), Schedule::New);
        q.check_scheduled(&"k", 100, 7);
        assert_eq!(
            q.plan_check(&"k", 150),
            Schedule::NotNeeded,
            "the check at 100 reschedules"
        );
        assert_eq!(q.plan_check(&"k", 100), Schedule::NotNeeded);
        assert_eq!(q.plan_check(&"k", 50), Schedule::Replace(7));
        q.check_scheduled(&"k", 50, 8);
        q.check_started(&"k", 100);
        assert_eq!(
            q.plan_check(&"k", 60),
            Schedule::NotNeeded,
            "50 is still pending"
        );
        q.check_started(&"k", 50);
        assert_eq!(q.plan_check(&"k", 60), Schedule::New);
    }

    #[test]
    fn an_emptied_queue_hands_back_its_pending_timer() {
        let mut q = Q::default();
        q.push("k", 1, "a");
        q.push("j", 2, "b");
        q.check_scheduled(&"k", 100, 7);
        q.check_scheduled(&"j", 100, 8);
        q.pop_front(&"k");
        q.remove(2);
        let mut timers = q.take_orphaned_timers();
        timers.sort();
        assert_eq!(timers, vec![7, 8]);
        assert!(q.take_orphaned_timers().is_empty());
    }
}
