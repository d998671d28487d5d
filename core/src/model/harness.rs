//! The harness: the glue's part, over in-memory keys, driving the
//! production `Node`.

use std::collections::{BTreeSet, HashMap};

use super::ops::*;
use super::reference::*;
use crate::error::LockError;
use crate::lock::tests::{MemStore, Stored};
use crate::lock::{self, Mode};
use crate::node::gate::tests::MemGate;
use crate::node::{
    Acquire, AcquireRequest, Admission, Conditions, Node, Observation, Served, TimerKeys,
};
use crate::output::{Event, Output, Stat};
use crate::time::Now;
use crate::waiters::{Outcome, Wake};

pub(super) struct Harness {
    pub(super) node: Node<u8, u8>,
    pub(super) stores: HashMap<u8, MemStore>,
    /// The gates, by the node's key (`GATE0 + gate`).
    pub(super) gates: HashMap<u8, MemGate>,
    /// Each gate's mark as a replica has it (`Output::GateRaised`, or the
    /// DEL Redis replicates).
    pub(super) replicated_gates: HashMap<u8, i64>,
    /// Each key as a replica has it: the lock the key held when the node
    /// last reported it changed (`Output::Changed`), or as Redis itself
    /// replicated a client's write (DEL, SET, SWAPDB, MIGRATE).
    pub(super) replicated: HashMap<u8, Replicated>,
    /// `Stat::Grant`s counted so far.
    pub(super) grants: u64,
    pub(super) wrongtype: BTreeSet<u8>,
    pub(super) gone: BTreeSet<u8>,
    pub(super) denied: BTreeSet<u8>,
    pub(super) replica: bool,
    /// The wall clock minus the monotonic one (ms): clock steps move it.
    pub(super) wall_offset: i64,
    pub(super) oom: bool,
    pub(super) evictable: bool,
    pub(super) writes_paused: bool,
}

impl Harness {
    /// Both clocks at monotonic ms `now`.
    pub(super) fn at(&self, now: i64) -> Now {
        Now {
            mono_us: now * 1000,
            wall_us: (now + self.wall_offset) * 1000,
        }
    }

    pub(super) fn cond(&self, may_block: bool) -> Conditions {
        let mut cond = Conditions::empty();
        cond.set(Conditions::REPLICA, self.replica);
        cond.set(Conditions::MAY_BLOCK, may_block);
        cond.set(Conditions::OOM, self.oom);
        cond.set(Conditions::EVICTABLE, self.evictable);
        cond
    }

    /// Opens `key` as the glue does: a shared lease counter, as the
    /// glue's is process-wide.
    pub(super) fn with_store<R>(
        &mut self,
        key: u8,
        f: impl FnOnce(&mut Node<u8, u8>, Result<&mut MemStore, LockError>, &BTreeSet<u8>) -> R,
    ) -> R {
        let node = &mut self.node;
        let denied = &self.denied;
        let mut keys = ModelKeys {
            stores: &mut self.stores,
            gates: &mut self.gates,
            wrongtype: &self.wrongtype,
            gone: &self.gone,
            denied,
        };
        keys.with_key(&key, |store, _, _| f(node, store, denied))
    }

    /// Opens several keys at once (a multi-key command), then puts them
    /// back.
    pub(super) fn with_stores<R>(
        &mut self,
        keys: &[u8],
        f: impl FnOnce(&mut Node<u8, u8>, &mut [MemStore], &BTreeSet<u8>) -> R,
    ) -> R {
        let mut stores: Vec<MemStore> = keys
            .iter()
            .map(|k| self.stores.remove(k).unwrap_or_default())
            .collect();
        let r = f(&mut self.node, &mut stores, &self.denied);
        for (k, s) in keys.iter().zip(stores) {
            self.stores.insert(*k, s);
        }
        r
    }

    pub(super) fn acquire(&mut self, client: u8, key: u8, r: &Request, now: i64) -> Told {
        let cond = self.cond(true);
        let at = self.at(now);
        let decided = self.with_store(key, |node, store, denied| {
            let req = AcquireRequest {
                token: &r.token,
                value: None,
                mode: r.mode,
                ttl_ms: r.ttl,
                block_ms: r.block,
                min_fence: r.min_fence,
            };
            node.acquire(
                &key,
                store,
                req,
                cond,
                &mut |c: u8| !denied.contains(&c),
                at,
            )
        });
        match decided {
            Ok(Acquire::Granted(f) | Acquire::Renewed(f)) => Told::Fence(f),
            Ok(Acquire::Contended) => Told::Nil,
            Ok(Acquire::Wait(ticket)) => {
                self.node.enqueue(*ticket, client).unwrap();
                Told::Blocked
            }
            Err(e) => error(e),
        }
    }

    /// `LOCK.OBSERVE`: the node's answer; a client that waits observes.
    pub(super) fn observe(
        &mut self,
        client: u8,
        key: u8,
        after: Option<i64>,
        value: Option<&[u8]>,
        block: Option<i64>,
        now: i64,
    ) -> Told {
        let at = self.at(now);
        let cond = self.cond(true);
        let observed = self.with_store(key, |node, store, _| {
            node.observe(&key, store.map(|s| &*s), after, value, block, cond, at)
        });
        match observed {
            Ok(Observation::Now(leader)) => told_leader(&leader),
            Ok(Observation::Nil) => Told::Nil,
            Ok(Observation::Wait(ticket)) => {
                self.node.start_observing(ticket, client).unwrap();
                Told::Blocked
            }
            Err(e) => error(e),
        }
    }

    /// The module timer: runs only when the node asked for `now` or before,
    /// the production sequence ([`Node::run_timer`]) over the harness's
    /// keys. Whether it ran.
    pub(super) fn timer(&mut self, now: i64) -> bool {
        if self.node.next_wakeup().is_none_or(|at| at > now) {
            return false;
        }
        let mut cond = self.cond(false);
        cond.set(Conditions::WRITES_PAUSED, self.writes_paused);
        let at = self.at(now);
        let mut keys = ModelKeys {
            stores: &mut self.stores,
            gates: &mut self.gates,
            wrongtype: &self.wrongtype,
            gone: &self.gone,
            denied: &self.denied,
        };
        self.node.run_timer(&mut keys, cond, at);
        true
    }

    /// Carries out the node's outputs as the glue does: the waiters to
    /// answer; every changed key copied to the replica as it is now (the
    /// node's effects must keep the replica equal to this node); events
    /// and counters tallied. The keys reported released.
    pub(super) fn drain(&mut self) -> Drained {
        let mut d = Drained::default();
        let mut t = Tally::default();
        while let Some(output) = self.node.poll_output() {
            match output {
                Output::Wake(wake) => d.wakes.push(*wake),
                Output::Changed(key) => {
                    let now = self.stores.get(&key).map(copy_of);
                    self.replicated.insert(key, now.unwrap_or_default());
                }
                // As a replica applies `LOCK._HOLD`: the one holder upserted
                // (the key made anew when absent or in another mode).
                Output::Holder(key, lease) => {
                    let Some(store) = self.stores.get(&key) else {
                        continue;
                    };
                    let Some(h) = store.holders.iter().find(|h| h.lease == lease) else {
                        continue;
                    };
                    let mode = lock::LockRead::mode(store);
                    let there = self.replicated.entry(key).or_default();
                    if there.0 != mode {
                        *there = (mode, Vec::new());
                    }
                    match there.1.iter_mut().find(|o| o.token == h.token) {
                        Some(o) => *o = h.clone(),
                        None => there.1.push(h.clone()),
                    }
                }
                // As a replica applies `LOCK._DROP`: the key goes with its
                // last holder.
                Output::HolderLeft(key, token) => {
                    if let Some(there) = self.replicated.get_mut(&key) {
                        there.1.retain(|o| o.token[..] != token[..]);
                        if there.1.is_empty() {
                            self.replicated.remove(&key);
                        }
                    }
                }
                Output::GateRaised(key, mark) => {
                    self.replicated_gates.insert(key, mark);
                }
                Output::Event(key, event) => match event {
                    Event::Release => d.released.push(key),
                    Event::Expire => d.expired.push(key),
                    Event::Acquire => t.acquire_events += 1,
                    Event::Extend => t.extend_events += 1,
                    Event::Handoff => t.handoff_events.push(key),
                },
                Output::Count(stat) => match stat {
                    Stat::Grant => {
                        self.grants += 1;
                        t.grants += 1;
                    }
                    Stat::TakeBack => d.take_backs += 1,
                    Stat::Contended => d.contended += 1,
                    Stat::Release => t.releases += 1,
                    Stat::Extend => t.extends += 1,
                    Stat::Expiration { .. } => t.expirations += 1,
                    Stat::Handoff { .. } => t.handoffs += 1,
                    Stat::BlockTimeout => t.block_timeouts += 1,
                    Stat::LetGo { .. } | Stat::RefusedEvictable | Stat::Redirect => {}
                    Stat::FencedRan | Stat::FencedStale | Stat::GatePutBack => {}
                },
            }
        }
        t.check(&d);
        d
    }
}

/// A key as a replica has it: its mode and holders (none: no key).
pub(super) type Replicated = (Option<Mode>, Vec<Stored>);

pub(super) fn copy_of(store: &MemStore) -> Replicated {
    (lock::LockRead::mode(store), store.holders.clone())
}

/// The counters and events of one drain, beside the waiters answered:
/// the glue counts and emits each, so each must say the same as the
/// others and as the outcomes.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) grants: usize,
    pub(super) releases: usize,
    pub(super) extends: usize,
    pub(super) expirations: usize,
    pub(super) handoffs: usize,
    pub(super) block_timeouts: usize,
    pub(super) acquire_events: usize,
    pub(super) extend_events: usize,
    pub(super) handoff_events: Vec<u8>,
}

impl Tally {
    pub(super) fn check(&self, d: &Drained) {
        let handed_to: Vec<&Wake<u8, u8>> = d
            .wakes
            .iter()
            .filter(|w| matches!(w.outcome, Outcome::Granted { renewed: false, .. }))
            .collect();
        let handed: Vec<u8> = handed_to
            .iter()
            .flat_map(|w| std::iter::once(w.key).chain(w.also.iter().map(|(k, _)| *k)))
            .collect();
        let handed_waiters = handed_to.len();
        let timed_out = d
            .wakes
            .iter()
            .filter(|w| matches!(w.outcome, Outcome::TimedOut))
            .count();
        assert_eq!(
            self.grants,
            self.acquire_events + self.handoff_events.len(),
            "every grant counted is an acquire or hand-off event"
        );
        assert_eq!(
            self.extends, self.extend_events,
            "renewals: counted = events"
        );
        assert_eq!(
            self.releases + d.take_backs,
            d.released.len(),
            "releases and take-backs: counted = release events"
        );
        assert_eq!(
            self.expirations,
            d.expired.len(),
            "expirations: counted = events"
        );
        assert_eq!(
            self.handoffs, handed_waiters,
            "a hand-off counted per waiter handed the lock"
        );
        assert_eq!(
            self.handoff_events, handed,
            "a hand-off event per key handed on"
        );
        assert_eq!(
            self.block_timeouts, timed_out,
            "a timeout counted per waiter timed out"
        );
    }
}

/// What one drain of the node's outputs carried out.
#[derive(Default)]
pub(super) struct Drained {
    /// ACQUIREs answered nil.
    pub(super) contended: usize,
    pub(super) wakes: Vec<Wake<u8, u8>>,
    /// Keys reported released (LOCK.RELEASE, or a take-back).
    pub(super) released: Vec<u8>,
    pub(super) take_backs: usize,
    /// Keys reported expired (a lease reclaimed, or replaced by a grant).
    pub(super) expired: Vec<u8>,
}

/// The harness's keys as a timer run opens them (as `Harness::with_store`).
pub(super) struct ModelKeys<'a> {
    pub(super) stores: &'a mut HashMap<u8, MemStore>,
    pub(super) gates: &'a mut HashMap<u8, MemGate>,
    pub(super) wrongtype: &'a BTreeSet<u8>,
    pub(super) gone: &'a BTreeSet<u8>,
    pub(super) denied: &'a BTreeSet<u8>,
}

/// A waiter may take its lock unless ACL SETUSER took it away.
pub(super) struct NotDenied<'a>(&'a BTreeSet<u8>);

impl Admission<u8> for NotDenied<'_> {
    fn may_take(&mut self, client: u8) -> bool {
        !self.0.contains(&client)
    }

    fn may_observe(&mut self, client: u8) -> bool {
        !self.0.contains(&client)
    }
}

impl<'a> TimerKeys<u8, u8> for ModelKeys<'a> {
    type Store = MemStore;
    type Admit = NotDenied<'a>;
    type Gate = MemGate;

    fn with_gate<R>(
        &mut self,
        key: &u8,
        f: impl FnOnce(Result<&mut MemGate, LockError>) -> R,
    ) -> R {
        f(Ok(self.gates.entry(*key).or_default()))
    }

    fn with_key<R>(
        &mut self,
        key: &u8,
        f: impl FnOnce(Result<&mut MemStore, LockError>, Served, &mut NotDenied<'a>) -> R,
    ) -> R {
        let served = match self.gone.contains(key) {
            true => Served::Elsewhere(redirect_of(*key)),
            false => Served::Here,
        };
        let mut store = self.stores.remove(key).unwrap_or_default();
        let open = match self.wrongtype.contains(key) {
            true => Err(LockError::WrongType),
            false => Ok(&mut store),
        };
        let out = f(open, served, &mut NotDenied(self.denied));
        self.stores.insert(*key, store);
        out
    }

    fn with_keys<R>(
        &mut self,
        keys: &[u8],
        f: impl FnOnce(Result<&mut [MemStore], LockError>, Served, &mut [NotDenied<'a>]) -> R,
    ) -> R {
        let served = match keys.iter().find(|k| self.gone.contains(k)) {
            Some(k) => Served::Elsewhere(redirect_of(*k)),
            None => Served::Here,
        };
        let mut stores: Vec<MemStore> = keys
            .iter()
            .map(|k| self.stores.remove(k).unwrap_or_default())
            .collect();
        let mut admits: Vec<NotDenied<'a>> = keys.iter().map(|_| NotDenied(self.denied)).collect();
        let open = match keys.iter().any(|k| self.wrongtype.contains(k)) {
            true => Err(LockError::WrongType),
            false => Ok(&mut stores[..]),
        };
        let out = f(open, served, &mut admits);
        for (k, s) in keys.iter().zip(stores) {
            self.stores.insert(*k, s);
        }
        out
    }
}

pub(super) fn told_of(wake: &Wake<u8, u8>) -> Told {
    match &wake.outcome {
        Outcome::Granted { fence, .. } => Told::Fence(*fence),
        Outcome::TimedOut => Told::Nil,
        Outcome::Observed(leader) => told_leader(leader),
        Outcome::Failed(e) => error(e.clone()),
    }
}

/// An observer's answer as the model compares it: fence and value.
fn told_leader(leader: &crate::observers::Leader) -> Told {
    match leader {
        crate::observers::Leader::Held { fence, value, .. } => Told::Leader(*fence, value.to_vec()),
        crate::observers::Leader::Vacant => Told::Leader(0, Vec::new()),
    }
}
