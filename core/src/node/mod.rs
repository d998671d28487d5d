//! The node: every lock decision of one server, in one place.
//!
//! A [`Node`] owns the fencing counter, the waiter lines, the restart-delay
//! clock, the limits (the `lock.*` options) and the grants whose reply was
//! lost. The Redis glue and the model test drive the very same `Node`:
//!
//! * inputs are `handle_*`-style calls: [`acquire`](Node::acquire),
//!   [`release`](Node::release), [`extend`](Node::extend),
//!   [`enqueue`](Node::enqueue), [`leave`](Node::leave),
//!   [`undelivered`](Node::undelivered), [`run_timer`](Node::run_timer)
//!   (which opens keys through a [`TimerKeys`]), [`set_limits`](Node::set_limits), [`start_serving`](Node::start_serving),
//!   [`keys_changed`](Node::keys_changed), [`rename_keys`](Node::rename_keys);
//!   each carries the time, and what only the server knows
//!   ([`Conditions`], whether a waiter may still run the command on the key
//!   ([`Admission`]), whether the key is still served here ([`Served`]));
//! * outputs are the call's reply, the waiters to answer
//!   ([`poll_output`](Node::poll_output): each waiter exactly once) and when to call
//!   [`run_timer`](Node::run_timer) next ([`next_wakeup`](Node::next_wakeup)).
//!
//! Nothing here reads a clock, opens a key or talks to a client: keys come
//! in as a [`LockStore`], time as a [`Now`] (leases on the monotonic clock,
//! fences on the wall clock), and the glue executes what comes out.

mod acquire;
pub(crate) mod gate;
mod handoff;
mod holder;
mod observe;
mod options;
mod outside;
mod reads;
#[cfg(test)]
mod tests;
mod timer;

pub use acquire::{Acquire, AcquireRequest, WaitTicket};
pub use gate::{GateRead, GateStore};
pub use observe::{Observation, ObserveTicket};
pub use options::{Conditions, Limits};
pub use outside::Loaded;
pub use reads::Held;
pub use timer::TimerKeys;

use std::collections::{BTreeMap, VecDeque};
use std::hash::Hash;

use crate::error::LockError;
use crate::fence::FenceCounter;
use crate::grant_tally::GrantTally;
use crate::lease_ends::LeaseEnds;
use crate::lock::LockStore;
use crate::observers::Observers;
use crate::output::{Output, Outputs, Recorder};
use crate::time::{self, Now};
use crate::waiters::{Outcome, Waiters, Wake};

/// While writes must wait (replica, CLIENT PAUSE WRITE, FAILOVER), look
/// again this soon.
pub const RETRY_MS: i64 = 10;

/// Whether the key a waiter waits on is still served by this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    Here,
    /// Its store moved (cluster resharding or failover): the waiters are
    /// answered with this redirect (`ASK ...`, `MOVED ...`, `CLUSTERDOWN ...`).
    Elsewhere(String),
}

/// Whether a waiter may still take the lock, or an observer still read
/// it, when its turn comes: its user may have lost the command or the key
/// (ACL SETUSER) while it waited.
pub trait Admission<C> {
    /// A waiter's turn: may it take the lock.
    fn may_take(&mut self, client: C) -> bool;
    /// An observer's change: may it be told (read the key).
    fn may_observe(&mut self, client: C) -> bool;
}

/// Every waiter is still admitted (no ACL to ask).
pub struct AdmitAll;

impl<C> Admission<C> for AdmitAll {
    fn may_take(&mut self, _client: C) -> bool {
        true
    }

    fn may_observe(&mut self, _client: C) -> bool {
        true
    }
}

/// A test's rule, the same for waiters and observers.
impl<C, F: FnMut(C) -> bool> Admission<C> for F {
    fn may_take(&mut self, client: C) -> bool {
        self(client)
    }

    fn may_observe(&mut self, client: C) -> bool {
        self(client)
    }
}

pub struct Node<K, C> {
    fences: FenceCounter,
    waiters: Waiters<K, C>,
    /// Clients told of a key's next change of leader (`LOCK.OBSERVE`).
    observers: Observers<K, C>,
    limits: Limits,
    /// When the node last started serving as master (loaded its data or
    /// was promoted), monotonic ms: the restart delay runs from here.
    serving_since_ms: i64,
    /// The node's first fence since it last started serving: gates refuse
    /// clock fences below it (see `guarded::pass`).
    gate_floor: i64,
    /// Gates maxmemory evicted, with the marks kept for them until they
    /// are put back ([`Node::gate_evicted`]), and when that is due.
    evicted_gates: BTreeMap<K, i64>,
    gates_due_at_ms: Option<i64>,
    /// Grants whose reply never reached their client: (key, fence, lease),
    /// and when the timer must take them back.
    undelivered: Vec<(K, i64, u64)>,
    undelivered_at_ms: Option<i64>,
    /// While the node does not act alone: when everything held back is
    /// looked at again ([`Node::retry_at`]).
    retry_at_ms: Option<i64>,
    /// What the glue must carry out, in order ([`Node::poll_output`]).
    outputs: Outputs<K, C>,
    /// The last lease id handed out: one per grant and renewal, for the
    /// life of the process (see `Lock::lease`).
    leases: u64,
    /// The keys of the locks here by when their lease ends: the timer
    /// reclaims ended ones ([`Node::run_timer`]).
    lease_ends: LeaseEnds<K>,
    /// Grants by key, kept past the key's life ([`Held::grants`]).
    grant_tally: GrantTally,
}

impl<K: Hash + Ord + Clone, C: Hash + Eq + Ord + Copy> Default for Node<K, C> {
    fn default() -> Self {
        Node {
            fences: FenceCounter::default(),
            waiters: Waiters::default(),
            observers: Observers::default(),
            limits: Limits::default(),
            serving_since_ms: 0,
            gate_floor: 0,
            evicted_gates: BTreeMap::new(),
            gates_due_at_ms: None,
            undelivered: Vec::new(),
            undelivered_at_ms: None,
            retry_at_ms: None,
            outputs: Outputs::default(),
            leases: 0,
            lease_ends: LeaseEnds::default(),
            grant_tally: GrantTally::default(),
        }
    }
}

impl<K: Hash + Ord + Clone, C: Hash + Eq + Ord + Copy> Node<K, C> {
    // ---- getters ----

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn fence_hwm(&self) -> i64 {
        self.fences.hwm()
    }

    pub fn waiting_on(&self, key: &K) -> usize {
        self.waiters.waiting_on(key)
    }

    pub fn total_waiters(&self) -> usize {
        self.waiters.total()
    }

    /// How many clients observe a key (`LOCK.OBSERVE ... BLOCK`) now.
    pub fn total_observers(&self) -> usize {
        self.observers.total()
    }

    /// Whether any client waits in a line or observes a key: a key that
    /// leaves the keyspace must then be looked at.
    pub fn has_blocked_clients(&self) -> bool {
        self.waiters.total() > 0 || !self.observers.is_empty()
    }

    /// How many more ms new grants are refused (0: grants are allowed).
    pub fn grants_paused_ms(&self, now_ms: i64) -> i64 {
        let delay = self.limits.restart_delay_ms;
        if delay <= 0 {
            return 0;
        }
        let until = self.serving_since_ms.saturating_add(delay);
        until.saturating_sub(now_ms).max(0)
    }

    // ---- outputs ----

    /// The next thing to carry out (a waiter to answer, a changed key to
    /// replicate, an event, a count), in the order decided. Drain it after
    /// every call.
    pub fn poll_output(&mut self) -> Option<Output<K, C>> {
        self.outputs.pop_front()
    }

    /// Everything queued, at once: swapped with `buffer` (empty), so both
    /// allocations are kept and nothing is moved.
    pub fn swap_outputs(&mut self, buffer: &mut VecDeque<Output<K, C>>) {
        self.outputs.swap(buffer);
    }

    /// Whether the server emits keyspace events of the module class now:
    /// said at the start of an entry, for that entry (events are queued
    /// again from [`swap_outputs`](Self::swap_outputs) on). Off, no
    /// [`Output::Event`] is queued.
    pub fn set_events(&mut self, on: bool) {
        self.outputs.set_events(on);
    }

    /// When [`run_timer`](Self::run_timer) must run next (monotonic ms, as every
    /// time the node schedules).
    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    pub fn next_wakeup(&self) -> Option<i64> {
        time::earliest(
            self.next_wakeup_but_lease_ends(),
            self.lease_ends.next_due(),
        )
    }

    /// [`next_wakeup`](Self::next_wakeup) but the lease ends filed: what
    /// the lines, take-backs, gates and observers ask for.
    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    pub(crate) fn next_wakeup_but_lease_ends(&self) -> Option<i64> {
        let at = time::earliest(self.waiters.next_wakeup(), self.undelivered_at_ms);
        let at = time::earliest(at, self.gates_due_at_ms);
        if self.observers.is_empty() {
            return at;
        }
        time::earliest(at, self.observers.next_wakeup())
    }

    // ---- node-wide events ----

    /// The options changed (CONFIG SET): every line is looked at again now,
    /// under the new limits (a shorter restart delay may have ended; a
    /// lower max-ttl-ms applies to the next hand-off).
    pub fn set_limits(&mut self, limits: Limits, now_ms: i64) {
        if limits == self.limits {
            return;
        }
        self.limits = limits;
        self.keys_changed(|_| true, now_ms);
    }

    /// The node loaded its data, or was promoted: the fence mark rises to
    /// the clock and past what a predecessor may have granted unseen
    /// (`fence::FenceCounter::start_serving`), and the restart delay starts.
    pub fn start_serving(&mut self, now: Now) {
        self.fences.start_serving(now.wall_us);
        self.serving_since_ms = now.mono_ms();
        // Every fence issued before now is at most the mark; every later
        // one is above it. A gate's mark may have been lost with the data
        // (see `guarded::pass`).
        self.gate_floor = self.fences.hwm().saturating_add(1);
    }

    /// Locks may have changed under every waited-on key that `affected`
    /// selects (DEL, UNLINK, overwrite, flush, eviction): look at them now.
    pub fn keys_changed(&mut self, affected: impl Fn(&K) -> bool, now_ms: i64) {
        let keys: Vec<K> = self
            .waiters
            .keys()
            .filter(|k| affected(k))
            .cloned()
            .collect();
        for key in keys {
            self.waiters.schedule(&key, now_ms);
        }
        let observed: Vec<K> = self
            .observers
            .keys()
            .filter(|k| affected(k))
            .cloned()
            .collect();
        for key in observed {
            self.observers.touch(&key, now_ms);
        }
    }

    /// A decision was cut short by a panic (caught at the glue's boundary,
    /// so the server lives on): whatever it left half done, every line is
    /// looked at again at the next timer run, so no waiter is stranded on a
    /// lock that came free, and the node's own state (lines, fence mark) is
    /// the only record of who waits: nothing outside it can be left stale.
    /// Call it, then run the timer.
    pub fn recover_from_panic(&mut self, now_ms: i64) {
        self.keys_changed(|_| true, now_ms);
    }

    /// SWAPDB moved whole databases: lines move with their keys (`rename`
    /// must be a bijection), so do leases filed by their end, grants waiting to be taken back (held
    /// back by a write pause: before, they stayed on the old name, took
    /// back nothing, and the undelivered grant was held for its whole
    /// lease), and every moved key is looked at now.
    pub fn rename_keys(
        &mut self,
        rename: impl Fn(&K) -> K,
        moved: impl Fn(&K) -> bool,
        now_ms: i64,
    ) {
        for (key, _, _) in &mut self.undelivered {
            *key = rename(key);
        }
        self.waiters.rename_keys(&rename);
        self.observers.rename_keys(&rename);
        self.lease_ends.rename_keys(&rename);
        self.keys_changed(moved, now_ms);
    }

    /// A lease id for a lock that enters the node.
    pub(super) fn next_lease(&mut self) -> u64 {
        self.leases += 1;
        self.leases
    }

    /// `store` seen by the state machine: its changes become outputs.
    pub(super) fn ledger<'a, S: LockStore>(
        &'a mut self,
        key: &'a K,
        store: &'a mut S,
        now_ms: i64,
    ) -> Recorder<'a, S, K, C> {
        // Whatever it writes, the key's observers look again once the
        // decision is done (the timer run right after it).
        if !self.observers.is_empty() {
            self.observers.touch(key, now_ms);
        }
        Recorder {
            store,
            key,
            out: &mut self.outputs,
            leases: &mut self.leases,
            ends: &mut self.lease_ends,
            now_ms,
        }
    }

    /// Written-out times on this node's clock under its `lock.max-ttl-ms`.
    pub(super) fn local_times(
        &self,
        wall_deadline_ms: i64,
        wall_granted_ms: i64,
        now: Now,
    ) -> (i64, Option<i64>) {
        time::local_times(
            wall_deadline_ms,
            wall_granted_ms,
            self.limits.max_ttl_ms,
            now,
        )
    }

    /// Whether the node changes locks on its own now (hand-offs,
    /// take-backs, reclaiming ended locks): not on a replica (its master
    /// does, and replicates the effect) nor while writes are held back.
    /// The one rule for the timer, the sweep and every hand-off.
    pub fn acts_alone(&self, cond: Conditions) -> bool {
        acts_alone(cond)
    }

    // ---- the fence mark ----

    /// A mark from outside (an RDB's aux field): raise the mark to it (or
    /// refuse it, changing nothing).
    pub fn observe_fence(&mut self, fence: i64, wall_us: i64) -> Result<(), LockError> {
        self.fences.observe(fence, wall_us)
    }
}

pub(super) fn acts_alone(cond: Conditions) -> bool {
    !cond.intersects(Conditions::REPLICA | Conditions::WRITES_PAUSED)
}

/// A replica never changes a lock on its own (also with `replica-read-only
/// no`): its master's effects are its only writes.
pub(super) fn refuse_on_replica(cond: Conditions) -> Result<(), LockError> {
    if cond.contains(Conditions::REPLICA) {
        return Err(LockError::ReadOnlyReplica);
    }
    Ok(())
}

/// Whether a wake is a grant (new, or a renewal of the waiter's own token).
pub fn is_grant<K, C>(wake: &Wake<K, C>) -> bool {
    matches!(wake.outcome, Outcome::Granted { .. })
}
