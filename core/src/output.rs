//! What the node decided that the glue must carry out, as data: one
//! [`Output`] queue per node, drained by the glue after each call
//! (`Node::poll_output`), in the spirit of str0m's and quinn-proto's
//! `poll_*`. The glue answers waiters, replicates changed keys, emits
//! keyspace events and counts, and decides none of it.
//!
//! The state machine (`lock`, `waiters`) writes through a `Ledger`, which
//! says *why* a lock changes; `Recorder` turns each change into a write of
//! the plain store the glue provides (`lock::LockStore`) and the outputs it
//! implies, and hands out lease ids.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::hash::Hash;

use crate::error::LockError;
use crate::grant_tally::GrantTally;
use crate::lease_ends::LeaseEnds;
use crate::lock::{holders, Ledger, Lock, LockRead, LockStore, Mode, NewHolder, Removal};
use crate::waiters::{Outcome, Wake};

/// One thing to carry out, in the order the node queued them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output<K, C> {
    /// Answer this waiter (each exactly once). Boxed: every other output
    /// is small, and a command's come by the handful.
    Wake(Box<Wake<K, C>>),
    /// `key`'s lock was written or deleted by a decision here: replicate
    /// what the key holds now (`LOCK._SET` for a lock, `LOCK._SHARED` for
    /// a shared key, `DEL` for none). Never for a lock applied from
    /// outside (the master, the AOF).
    Changed(K),
    /// One holder of `key`, a shared key, was added or renewed by a
    /// decision here, with lease id `lease`: replicate that holder alone
    /// (`LOCK._HOLD`), so a change costs what it changes, not the key's
    /// thousands of holders. None has that lease any more when a later
    /// change of the same decision replaced or removed it: nothing to do.
    Holder(K, u64),
    /// The holder of `token` left `key`, a shared key that keeps others:
    /// replicate its removal alone (`LOCK._DROP`).
    HolderLeft(K, Box<[u8]>),
    /// The gate at `key` was raised to this mark by a decision here (a
    /// fence that passed, an evicted gate put back): replicate it
    /// (`LOCK._GATE`) and signal the key modified. Never for a mark
    /// applied from outside.
    GateRaised(K, i64),
    /// A keyspace event (`notify-keyspace-events` with `d`) on `key`.
    Event(K, Event),
    /// A statistic of `INFO lock`.
    Count(Stat),
}

/// The keyspace events a lock emits, in the module class (`d` in
/// `notify-keyspace-events`): `PSUBSCRIBE __keyspace@0__:orders:*` shows a
/// lock's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// LOCK.ACQUIRE granted a free lock.
    Acquire,
    /// The holder released it, or an undelivered grant was taken back.
    Release,
    /// The holder renewed it (EXTEND, or ACQUIRE with its own token).
    Extend,
    /// A waiter was handed the lock.
    Handoff,
    /// A lease ran out (its lock reclaimed, or replaced by a grant).
    Expire,
}

impl Event {
    /// The event's name, as subscribers see it.
    pub fn name(self) -> &'static CStr {
        match self {
            Event::Acquire => c"lock.acquire",
            Event::Release => c"lock.release",
            Event::Extend => c"lock.extend",
            Event::Handoff => c"lock.handoff",
            Event::Expire => c"lock.expire",
        }
    }
}

/// A statistic to count (`INFO lock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stat {
    /// A new holder: by ACQUIRE or by hand-off.
    Grant,
    /// An ACQUIRE answered nil.
    Contended,
    /// A holder released its lock.
    Release,
    /// A renewal: EXTEND, or ACQUIRE (or a hand-off) of the holder's token.
    Extend,
    /// A lease ran out; held `held_ms` (None: grant time unknown).
    Expiration { held_ms: Option<i64> },
    /// A holder let go after `held_ms` (released, or taken back).
    LetGo { held_ms: Option<i64> },
    /// A waiter was handed the lock after waiting `waited_us`.
    Handoff { waited_us: i64 },
    /// A waiter's BLOCK timeout passed.
    BlockTimeout,
    /// An undelivered grant was taken back.
    TakeBack,
    /// A grant refused because locks can be evicted.
    RefusedEvictable,
    /// A waiter sent where its key went (ASK/MOVED).
    Redirect,
    /// A fence passed its gate (`LOCK.FENCED`, its command run).
    FencedRan,
    /// A fence was refused by its gate as stale.
    FencedStale,
    /// An evicted gate was put back with its kept mark.
    GatePutBack,
}

/// The node's queue of outputs, in the order decided. A keyspace event is
/// queued only while the server emits them (the glue says so at each entry
/// into the node, [`Node::set_events`](crate::node::Node::set_events)): on
/// a server without them, a grant queues no event to drop later.
#[derive(Debug)]
pub(crate) struct Outputs<K, C> {
    queue: VecDeque<Output<K, C>>,
    events: bool,
}

impl<K, C> Default for Outputs<K, C> {
    fn default() -> Self {
        Outputs {
            queue: VecDeque::new(),
            events: true,
        }
    }
}

impl<K, C> Outputs<K, C> {
    #[inline]
    pub fn push_back(&mut self, output: Output<K, C>) {
        self.queue.push_back(output);
    }

    /// Queues `event` on `key`, if events are wanted.
    #[inline]
    pub fn event(&mut self, key: &K, event: Event)
    where
        K: Clone,
    {
        if self.events {
            self.queue.push_back(Output::Event(key.clone(), event));
        }
    }

    pub fn pop_front(&mut self) -> Option<Output<K, C>> {
        self.queue.pop_front()
    }

    /// Whether keyspace events are queued (until the end of the entry).
    pub fn set_events(&mut self, on: bool) {
        self.events = on;
    }

    /// Everything queued, swapped with `buffer` (empty); events are
    /// queued again from here on, until the next entry says otherwise.
    pub fn swap(&mut self, buffer: &mut VecDeque<Output<K, C>>) {
        debug_assert!(buffer.is_empty());
        std::mem::swap(&mut self.queue, buffer);
        self.events = true;
    }
}

/// The counters and event of one waiter's outcome, then the wake itself.
pub(crate) fn push_wake<K: Clone + Hash, C>(
    out: &mut Outputs<K, C>,
    tally: &mut GrantTally,
    wake: Wake<K, C>,
) {
    // A multi-key waiter's grant counts on every key, and is handed off
    // once.
    let keys = || std::iter::once(&wake.key).chain(wake.also.iter().map(|(k, _)| k));
    match &wake.outcome {
        Outcome::Granted { renewed: true, .. } => {
            for key in keys() {
                out.push_back(Output::Count(Stat::Extend));
                out.event(key, Event::Extend);
            }
        }
        Outcome::Granted { renewed: false, .. } => {
            out.push_back(Output::Count(Stat::Handoff {
                waited_us: wake.waited_us,
            }));
            for key in keys() {
                tally.record(key);
                out.push_back(Output::Count(Stat::Grant));
                out.event(key, Event::Handoff);
            }
        }
        Outcome::TimedOut => out.push_back(Output::Count(Stat::BlockTimeout)),
        Outcome::Observed(_) => {}
        Outcome::Failed(LockError::Redirect(_)) => out.push_back(Output::Count(Stat::Redirect)),
        Outcome::Failed(_) => {}
    }
    out.push_back(Output::Wake(Box::new(wake)));
}

/// A key's plain store, seen by the state machine as a [`Ledger`]: every
/// change becomes a write or delete of the store, the outputs it implies
/// (a changed key to replicate, an expiration's event and counters, a
/// holder's time), and a fresh lease id for every grant and renewal.
pub(crate) struct Recorder<'a, S, K, C> {
    pub store: &'a mut S,
    pub key: &'a K,
    pub out: &'a mut Outputs<K, C>,
    /// The node's lease counter.
    pub leases: &'a mut u64,
    /// The node's locks by lease end: every lease started here is filed.
    pub ends: &'a mut LeaseEnds<K>,
    pub now_ms: i64,
}

impl<S: LockStore, K: Ord + Clone, C> Recorder<'_, S, K, C> {
    fn next_lease(&mut self) -> u64 {
        *self.leases += 1;
        *self.leases
    }

    /// A lease that ran out: counted with its holder's time, and reported.
    fn expired(&mut self, deadline_ms: i64, granted_ms: Option<i64>) {
        expired(self.out, self.key, deadline_ms, granted_ms);
    }
}

/// What [`Recorder::expired`] queues (a function of the fields, so the
/// store can be read meanwhile).
fn expired<K: Clone, C>(
    out: &mut Outputs<K, C>,
    key: &K,
    deadline_ms: i64,
    granted_ms: Option<i64>,
) {
    let held_ms = granted_ms.map(|g| deadline_ms - g);
    out.push_back(Output::Count(Stat::Expiration { held_ms }));
    out.event(key, Event::Expire);
}

impl<S: LockStore, K, C> LockRead for Recorder<'_, S, K, C> {
    fn mode(&self) -> Option<Mode> {
        self.store.mode()
    }
    fn holder_at(&self, i: usize) -> Option<Lock<'_>> {
        self.store.holder_at(i)
    }
}

impl<S: LockStore, K: Ord + Clone, C> Ledger for Recorder<'_, S, K, C> {
    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    fn put(&mut self, mode: Mode, h: NewHolder<'_>) {
        let now_ms = self.now_ms;
        for l in holders(&*self.store).filter(|l| !l.is_live(now_ms)) {
            expired(self.out, self.key, l.deadline_ms, l.granted_ms);
        }
        let lease = self.next_lease();
        self.ends.file_lease(self.key, h.deadline_ms, self.now_ms);
        self.store.put(mode, stamped(h, lease));
        self.out.push_back(Output::Changed(self.key.clone()));
    }

    fn add(&mut self, h: NewHolder<'_>) {
        // The same token ended unreleased (held back by lock-delay) and
        // granted again: that lease ran out.
        let replaced = holders(&*self.store)
            .find(|l| l.token == h.token && !l.is_live(self.now_ms))
            .map(|l| (l.deadline_ms, l.granted_ms));
        if let Some((deadline_ms, granted_ms)) = replaced {
            self.expired(deadline_ms, granted_ms);
        }
        let lease = self.next_lease();
        self.ends.file_lease(self.key, h.deadline_ms, self.now_ms);
        self.store.add(stamped(h, lease));
        self.out.push_back(Output::Holder(self.key.clone(), lease));
    }

    fn renew(&mut self, token: &[u8], deadline_ms: i64) {
        // The state machine renews only a holder it found.
        debug_assert!(holders(&*self.store).any(|l| l.token == token));
        // A longer lease is found where the old one ended (and filed
        // again there); a shorter one is filed now.
        if holders(&*self.store).any(|l| l.token == token && deadline_ms < l.deadline_ms) {
            self.ends.file_lease(self.key, deadline_ms, self.now_ms);
        }
        let lease = self.next_lease();
        self.store.renew(token, deadline_ms, lease);
        let out = match self.store.mode() {
            Some(Mode::Shared { .. }) => Output::Holder(self.key.clone(), lease),
            _ => Output::Changed(self.key.clone()),
        };
        self.out.push_back(out);
    }

    fn set_mode(&mut self, mode: Mode) {
        if self.store.mode().is_none_or(|m| m == mode) {
            return;
        }
        self.store.set_mode(mode);
        self.out.push_back(Output::Changed(self.key.clone()));
    }

    fn remove(&mut self, token: &[u8], why: Removal) {
        let Some(lock) = holders(&*self.store).find(|l| l.token == token) else {
            return;
        };
        let (deadline_ms, granted_ms) = (lock.deadline_ms, lock.granted_ms);
        match why {
            Removal::Released | Removal::TakenBack => {
                let held_ms = granted_ms.map(|g| self.now_ms - g);
                self.out.push_back(Output::Count(Stat::LetGo { held_ms }));
            }
            Removal::Ended => self.expired(deadline_ms, granted_ms),
        }
        let shared = matches!(self.store.mode(), Some(Mode::Shared { .. }));
        self.store.remove(token);
        // A shared key that keeps other holders loses this one alone; one
        // that went with it (or an exclusive key) is replicated whole.
        let out = match shared && self.store.mode().is_some() {
            true => Output::HolderLeft(self.key.clone(), token.into()),
            false => Output::Changed(self.key.clone()),
        };
        self.out.push_back(out);
    }
}

/// A new holder with its lease id.
fn stamped(h: NewHolder<'_>, lease: u64) -> Lock<'_> {
    Lock {
        fence: h.fence,
        deadline_ms: h.deadline_ms,
        token: h.token,
        value: h.value,
        granted_ms: h.granted_ms,
        lease,
    }
}
