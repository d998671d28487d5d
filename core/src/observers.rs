//! Observers of keys (`LOCK.OBSERVE key AFTER fence BLOCK ms`): clients
//! waiting to be told that a key's leader is no longer the one they saw.
//!
//! `Observers` keeps who observes which key, what each saw, their
//! timeouts, and when each observed key must be looked at again: at once
//! after anything wrote to it, and when its holder's lease ends (so a
//! vacancy is told even when no command touches the key). It decides
//! nothing about locks: the node reads a key's [`Leader`] and asks
//! [`Observers::tell`] who differs from it.
//!
//! Invariants (the node's tests and the model check them):
//! * an observer is told at most once, and only of a leader that differs
//!   from what it saw (`after`: a fence, or 0 for nobody; with a fence,
//!   the value that holder had when the observer came, so a proclaim is a
//!   change whichever way it arrives: a command here, the master, the AOF);
//! * a client observes at most one key at a time, and leaves nothing
//!   behind when it goes (`leave`);
//! * an observed key always has a check pending no later than its
//!   holder's lease end.

use crate::checks::Checks;
use crate::time;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;

/// A key's leader as an observer is told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leader {
    /// Nobody holds the key (free, or its lease ended).
    Vacant,
    /// Held by the holder with this fence, for `ttl_ms` more, with its
    /// public value (empty: none).
    Held {
        fence: i64,
        ttl_ms: i64,
        value: Box<[u8]>,
    },
}

impl Leader {
    /// The fence an observer passes as `AFTER` once it saw this (0: none).
    pub fn fence(&self) -> i64 {
        match self {
            Leader::Vacant => 0,
            Leader::Held { fence, .. } => *fence,
        }
    }
}

/// What an observer saw: a leader's fence (0: the key free) and, held,
/// that leader's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The fence (0: vacant).
    pub after: i64,
    /// The holder's public value then (empty: none, or vacant).
    pub value: Box<[u8]>,
}

impl Seen {
    /// Whether `leader` is no longer what was seen: another fence, or the
    /// same holder with another value (a proclaim).
    pub fn differs(&self, leader: &Leader) -> bool {
        match leader {
            Leader::Vacant => self.after != 0,
            Leader::Held { fence, value, .. } => *fence != self.after || *value != self.value,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Observer<C> {
    client: C,
    seen: Seen,
    timeout_at_ms: Option<i64>,
}

/// Who observes which key (see the module doc).
#[derive(Debug)]
pub struct Observers<K, C> {
    by_key: BTreeMap<K, Vec<Observer<C>>>,
    by_client: HashMap<C, K>,
    /// When each observed key is looked at next.
    checks: Checks<K>,
    timeouts: BTreeSet<(i64, C)>,
}

impl<K, C> Default for Observers<K, C> {
    fn default() -> Self {
        Observers {
            by_key: BTreeMap::new(),
            by_client: HashMap::new(),
            checks: Checks::default(),
            timeouts: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Clone, C: Hash + Eq + Ord + Copy> Observers<K, C> {
    /// How many clients observe a key now.
    pub fn total(&self) -> usize {
        self.by_client.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_client.is_empty()
    }

    /// How many clients observe `key`.
    pub fn observing(&self, key: &K) -> usize {
        self.by_key.get(key).map_or(0, Vec::len)
    }

    /// The observed keys.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.by_key.keys()
    }

    /// `client` observes `key`, having seen `seen`, until `timeout_at_ms`;
    /// the key is looked at again by `check_at_ms` (its holder's lease
    /// end; None: only when something writes to it). False (nothing
    /// changes) when the client observes already.
    pub fn add(
        &mut self,
        key: &K,
        client: C,
        seen: Seen,
        timeout_at_ms: Option<i64>,
        check_at_ms: Option<i64>,
    ) -> bool {
        if self.by_client.contains_key(&client) {
            return false;
        }
        self.by_client.insert(client, key.clone());
        self.by_key.entry(key.clone()).or_default().push(Observer {
            client,
            seen,
            timeout_at_ms,
        });
        if let Some(at) = timeout_at_ms {
            self.timeouts.insert((at, client));
        }
        if let Some(at) = check_at_ms {
            self.schedule(key, at);
        }
        true
    }

    /// The client went away (disconnected, unblocked): nothing of it is
    /// kept. True if it was observing.
    pub fn leave(&mut self, client: C) -> bool {
        let Some(key) = self.by_client.remove(&client) else {
            return false;
        };
        if let Some(list) = self.by_key.get_mut(&key) {
            if let Some(i) = list.iter().position(|o| o.client == client) {
                let gone = list.remove(i);
                if let Some(at) = gone.timeout_at_ms {
                    self.timeouts.remove(&(at, client));
                }
            }
            if list.is_empty() {
                self.forget_key(&key);
            }
        }
        true
    }

    /// Something wrote to `key` (or may have): look at it by `at_ms`.
    /// Whether anyone observes it.
    pub fn touch(&mut self, key: &K, at_ms: i64) -> bool {
        let observed = self.by_key.contains_key(key);
        if observed {
            self.schedule(key, at_ms);
        }
        observed
    }

    /// Looks at `key` by `at_ms` (an earlier check stays).
    fn schedule(&mut self, key: &K, at_ms: i64) {
        self.checks.schedule(key, at_ms);
    }

    fn forget_key(&mut self, key: &K) {
        self.by_key.remove(key);
        self.checks.cancel(key);
    }

    /// When a check or a timeout is next due.
    pub fn next_wakeup(&self) -> Option<i64> {
        let check = self.checks.next();
        let timeout = self.timeouts.first().map(|(at, _)| *at);
        time::earliest(check, timeout)
    }

    /// The keys due to be looked at by `now_ms`, in key order; their checks
    /// are taken (a key still observed after [`tell`](Self::tell) gets its
    /// next one there).
    pub fn due_keys(&mut self, now_ms: i64) -> Vec<K> {
        let mut due = self.checks.take_due(now_ms);
        due.sort();
        due
    }

    /// Every observer of `key` whose [`Seen`] differs from `leader`, in
    /// arrival order, taken out; the others keep observing, and the key is
    /// looked at again when the leader's lease ends (`now_ms` + its ttl).
    pub fn tell(&mut self, key: &K, leader: &Leader, now_ms: i64) -> Vec<C> {
        let Some(list) = self.by_key.get_mut(key) else {
            return Vec::new();
        };
        let (told, kept): (Vec<_>, Vec<_>) = std::mem::take(list)
            .into_iter()
            .partition(|o| o.seen.differs(leader));
        *list = kept;
        for o in &told {
            self.by_client.remove(&o.client);
            if let Some(at) = o.timeout_at_ms {
                self.timeouts.remove(&(at, o.client));
            }
        }
        if list.is_empty() {
            self.forget_key(key);
        } else if let Leader::Held { ttl_ms, .. } = leader {
            self.schedule(key, now_ms.saturating_add(*ttl_ms));
        }
        told.into_iter().map(|o| o.client).collect()
    }

    /// Every observer of `key`, taken out (the key left this node).
    pub fn take_all(&mut self, key: &K) -> Vec<C> {
        let clients: Vec<C> = self
            .by_key
            .get(key)
            .map(|list| list.iter().map(|o| o.client).collect())
            .unwrap_or_default();
        for &client in &clients {
            self.leave(client);
        }
        clients
    }

    /// Every observer whose timeout came by `now_ms`, taken out, with its
    /// key, in timeout order.
    pub fn poll_timeouts(&mut self, now_ms: i64) -> Vec<(C, K)> {
        let mut out = Vec::new();
        while let Some(&(at, client)) = self.timeouts.first() {
            if at > now_ms {
                break;
            }
            self.timeouts.pop_first();
            let key = self.by_client.get(&client).cloned().expect("observing");
            // (Its timeout entry is gone already: leave() finds none.)
            self.leave(client);
            out.push((client, key));
        }
        out
    }

    /// SWAPDB: observers move with their keys (`f` a bijection).
    pub fn rename_keys(&mut self, f: impl Fn(&K) -> K) {
        self.by_key = std::mem::take(&mut self.by_key)
            .into_iter()
            .map(|(k, v)| (f(&k), v))
            .collect();
        for key in self.by_client.values_mut() {
            *key = f(key);
        }
        self.checks.rename_keys(&f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type O = Observers<&'static str, u32>;

    fn saw(after: i64) -> Seen {
        Seen {
            after,
            value: Box::default(),
        }
    }

    fn held(fence: i64, ttl_ms: i64) -> Leader {
        Leader::Held {
            fence,
            ttl_ms,
            value: Box::default(),
        }
    }

    #[test]
    fn only_observers_that_saw_something_else_are_told() {
        let mut o = O::default();
        assert!(o.add(&"k", 1, saw(7), None, Some(100)));
        assert!(o.add(&"k", 2, saw(0), None, Some(100)));
        assert!(!o.add(&"j", 1, saw(0), None, None), "one key at a time");
        // Still held by 7: only the one that saw it free is told.
        assert_eq!(o.tell(&"k", &held(7, 50), 10), vec![2]);
        assert_eq!(o.observing(&"k"), 1);
        // ... and the key is looked at again when that lease ends.
        assert_eq!(o.next_wakeup(), Some(60));
        assert_eq!(o.tell(&"k", &Leader::Vacant, 60), vec![1]);
        assert!(o.is_empty());
        assert_eq!(o.next_wakeup(), None);
    }

    /// The same holder with another value is a change (a proclaim, made
    /// here or arriving from the master); the same value is not.
    #[test]
    fn a_new_value_under_the_same_fence_is_told() {
        let mut o = O::default();
        let v1 = Seen {
            after: 7,
            value: b"v1".as_slice().into(),
        };
        o.add(&"k", 1, v1, None, Some(100));
        let with = |value: &[u8]| Leader::Held {
            fence: 7,
            ttl_ms: 50,
            value: value.into(),
        };
        assert_eq!(o.tell(&"k", &with(b"v1"), 10), Vec::<u32>::new());
        assert_eq!(o.tell(&"k", &with(b"v2"), 11), vec![1]);
        // A vacancy differs from any holder; a key seen free is not told
        // of being free.
        o.add(&"k", 2, saw(0), None, None);
        o.add(&"k", 3, saw(7), None, None);
        assert_eq!(o.tell(&"k", &Leader::Vacant, 12), vec![3]);
    }

    #[test]
    fn a_write_brings_the_check_forward_and_due_keys_take_it() {
        let mut o = O::default();
        o.add(&"b", 1, saw(3), None, Some(500));
        o.add(&"a", 2, saw(0), None, None);
        assert_eq!(o.next_wakeup(), Some(500));
        o.touch(&"a", 20);
        o.touch(&"b", 20);
        o.touch(&"unobserved", 5);
        assert_eq!(o.next_wakeup(), Some(20));
        assert_eq!(o.due_keys(19), Vec::<&str>::new());
        assert_eq!(o.due_keys(20), vec!["a", "b"]);
        assert_eq!(o.next_wakeup(), None);
    }

    #[test]
    fn leaving_or_timing_out_leaves_nothing_behind() {
        let mut o = O::default();
        o.add(&"k", 1, saw(0), Some(30), Some(100));
        o.add(&"k", 2, saw(0), Some(40), None);
        assert!(o.leave(2));
        assert!(!o.leave(2));
        assert_eq!(o.next_wakeup(), Some(30));
        assert_eq!(o.poll_timeouts(29), vec![]);
        assert_eq!(o.poll_timeouts(30), vec![(1, "k")]);
        assert!(o.is_empty());
        assert_eq!(o.next_wakeup(), None);
        assert_eq!(o.by_key.len() + o.timeouts.len(), 0);
        assert_eq!(o.checks.next(), None);
    }

    #[test]
    fn swapdb_moves_observers_with_their_keys() {
        let mut o = O::default();
        o.add(&"a", 1, saw(4), None, Some(10));
        o.rename_keys(|k| if *k == "a" { "b" } else { "a" });
        assert_eq!(o.observing(&"b"), 1);
        assert_eq!(o.due_keys(10), vec!["b"]);
        assert_eq!(o.tell(&"b", &Leader::Vacant, 10), vec![1]);
    }
}
