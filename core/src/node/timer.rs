//! The timer's run ([`Node::run_timer`]): timeouts, take-backs of
//! undelivered grants, and every due line handed on, in rounds.

use std::collections::BTreeSet;
use std::hash::Hash;

use super::{acts_alone, Admission, Conditions, GateStore, Node, Served, RETRY_MS};
use crate::error::LockError;
use crate::lease_ends::look_at;
use crate::lock::{self, LockStore};
use crate::output::{push_wake, Event, Output, Stat};
use crate::time::Now;
use crate::waiters::WaiterId;

/// The server's keys as a timer run opens them, one at a time: in Redis,
/// the key's db selected, the key opened for writing, the cluster asked
/// whether it is still served here, and ACL asked for each waiter; in the
/// model and the tests, maps in memory. [`Node::run_timer`] is the one
/// sequence of a timer run, whoever provides the keys.
pub trait TimerKeys<K, C> {
    type Store: LockStore;
    type Admit: Admission<C>;
    type Gate: GateStore;
    /// Runs `f` with `key` opened for writing (Err: WRONGTYPE, or the key
    /// cannot be opened), whether the key is still served here, and who of
    /// its waiters may take it.
    fn with_key<R>(
        &mut self,
        key: &K,
        f: impl FnOnce(Result<&mut Self::Store, LockError>, Served, &mut Self::Admit) -> R,
    ) -> R;

    /// Runs `f` with every key of `keys` (distinct, one multi-key waiter's,
    /// so in one db and one slot) opened for writing, the `i`th store and
    /// admission being `keys[i]`'s: Err when any key cannot be opened,
    /// `Elsewhere` when any key left this node.
    fn with_keys<R>(
        &mut self,
        keys: &[K],
        f: impl FnOnce(Result<&mut [Self::Store], LockError>, Served, &mut [Self::Admit]) -> R,
    ) -> R;

    /// Runs `f` with the gate at `key` opened for writing (Err: the key
    /// cannot be opened).
    fn with_gate<R>(
        &mut self,
        key: &K,
        f: impl FnOnce(Result<&mut Self::Gate, LockError>) -> R,
    ) -> R;
}

/// What a timer run must do, in this order: take these grants back, then
/// settle these keys. Waiters that timed out are already in the wake queue.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct TimerWork<K> {
    take_backs: Vec<(K, i64, u64)>,
    settle: Vec<K>,
    /// What is due by this instant is handed on (now, or the end of a
    /// hold); None: nothing is (the node does not act alone).
    due_by: Option<i64>,
}

impl<K> Default for TimerWork<K> {
    fn default() -> Self {
        TimerWork {
            take_backs: Vec::new(),
            settle: Vec::new(),
            due_by: None,
        }
    }
}

/// The most leases a timer run looks at (about 1 ms of work): more due at
/// once (a burst of grants with one TTL) are left due, for the next run,
/// at once, so clients are served between.
pub(super) const MAX_RECLAIMS_PER_RUN: usize = 1_000;

/// How many times one timer run goes round (settling the keys, then the
/// multi-key waiters) while answering a waiter made more due at once.
pub(super) const MAX_TIMER_ROUNDS: usize = 64;

impl<K: Hash + Ord + Clone, C: Hash + Eq + Ord + Copy> Node<K, C> {
    // ---- waiters and the timer ----

    /// The client left on its own (disconnected, CLIENT UNBLOCK, the node
    /// became a replica): it gets no outcome. True if it was waiting.
    pub fn leave(&mut self, client: C, now_ms: i64) -> bool {
        self.observers.leave(client) || self.waiters.leave(client, now_ms).is_some()
    }

    /// A grant's reply never reached its client (it went away between the
    /// hand-off and the reply): take the grant back at the next timer run,
    /// if the lease is still exactly that one, so the lock is never left
    /// with a client that does not know it holds it.
    pub fn undelivered(&mut self, key: K, fence: i64, lease: u64, now_ms: i64) {
        self.undelivered.push((key, fence, lease));
        let at = self.undelivered_at_ms.map_or(now_ms, |at| at.min(now_ms));
        self.undelivered_at_ms = Some(at);
    }

    /// A run of the timer, whole: gates maxmemory evicted are put back
    /// ([`Node::gate_evicted`]); waiters whose timeout came are answered
    /// (that writes nothing, so it also runs while writes must wait); then,
    /// when the node [acts alone](Self::acts_alone), undelivered grants are
    /// taken back and every due key is handed on (opened through `keys`),
    /// a key taken back among them. On a replica, or while writes are held
    /// back, nothing is handed on: due keys are looked at again in
    /// [`RETRY_MS`]; take-backs wait too, except on a replica, where they
    /// are the master's to make and are dropped.
    ///
    /// A grant taken back is reported as a release. Last, observers are
    /// told of what the run left (they only read: on a replica too, and
    /// while writes wait). The glue, the model and the tests all run this
    /// one sequence.
    pub fn run_timer<S: TimerKeys<K, C>>(&mut self, keys: &mut S, cond: Conditions, now: Now) {
        self.hand_on_due(keys, cond, now);
        self.reclaim_ended(keys, cond, now);
        self.tell_observers(keys, now);
    }

    /// Whether no lease is filed by its end (the glue arms the timer for
    /// the first lock from outside).
    pub fn lease_ends_empty(&self) -> bool {
        self.lease_ends.is_empty()
    }

    /// Keys flushed (FLUSHDB, FLUSHALL): their leases leave the index.
    pub fn lease_ends_flushed(&mut self, gone: impl Fn(&K) -> bool) {
        self.lease_ends.drop_keys(gone);
    }

    /// How many leases are filed by their end (`INFO lock`).
    pub fn lease_ends_filed(&self) -> usize {
        self.lease_ends.len()
    }

    /// The timer's part for locks nobody touches: every key filed in a slot
    /// now due ([`LeaseEnds`](crate::lease_ends::LeaseEnds)) is looked at;
    /// an ended lock is reclaimed as the sweep's are ([`Node::reclaim`]:
    /// deleted, or its ended holders dropped, and the key handed on), and
    /// a key still held is filed again where its next holder's time ends
    /// (or [`LOOK_AHEAD_MS`](crate::lease_ends::LOOK_AHEAD_MS) on).
    /// A key with no lock, of another type, or gone from this node leaves.
    /// While writes wait, the due keys are filed again for the retry; on a
    /// replica, the master reclaims, so the keys are only pruned (a lock
    /// still there is looked at again a second later, kept for a
    /// promotion). At most [`MAX_RECLAIMS_PER_RUN`] keys a run.
    fn reclaim_ended<S: TimerKeys<K, C>>(&mut self, keys: &mut S, cond: Conditions, now: Now) {
        let now_ms = now.mono_ms();
        let due = self.lease_ends.take_due(now_ms, MAX_RECLAIMS_PER_RUN);
        if due.is_empty() {
            return;
        }
        let replica = cond.contains(Conditions::REPLICA);
        if !replica && !acts_alone(cond) {
            let retry_at = self.retry_at(now_ms);
            for key in &due {
                self.lease_ends.file(key, retry_at);
            }
            return;
        }
        let delay = self.limits.lock_delay_ms;
        for key in due {
            keys.with_key(&key, |store, served, admit| {
                let (Ok(store), Served::Here) = (store, served) else {
                    return;
                };
                if !replica {
                    self.reclaim(&key, store, cond, admit, now);
                }
                let next = lock::holders(&*store)
                    .map(|l| l.grants_held_until(delay))
                    .min();
                if let Some(end) = next {
                    // Never due again in this run; on a replica, not for
                    // a second (the master's DEL is on its way).
                    let soonest_ms = if replica { 1_000 } else { 1 };
                    let at = look_at(end, now_ms).max(now_ms.saturating_add(soonest_ms));
                    self.lease_ends.file(&key, at);
                }
            });
        }
    }

    /// [`run_timer`](Self::run_timer) but the observers.
    fn hand_on_due<S: TimerKeys<K, C>>(&mut self, keys: &mut S, cond: Conditions, now: Now) {
        let now_ms = now.mono_ms();
        self.put_back_gates(keys, cond, now_ms);
        let work = self.timer(cond, now);
        for (key, fence, lease) in work.take_backs {
            let took = keys.with_key(&key, |store, _, _| {
                store.is_ok_and(|s| {
                    lock::take_back(&mut self.ledger(&key, s, now_ms), fence, lease, now_ms)
                })
            });
            if took {
                self.outputs.push_back(Output::Count(Stat::TakeBack));
                self.outputs.event(&key, Event::Release);
            }
        }
        let Some(due_by) = work.due_by else {
            return;
        };
        // Rounds, each the due keys in key order, then the multi-key
        // waiters marked in arrival order. Answering a waiter has the
        // lines it stood first in looked at again: in this round if they
        // come later in its order, else in the next; until nothing more is
        // due. (So the order in which one run draws fences is fixed by the
        // keys and the lines, whatever made each key due.)
        // (What came due by `due_by` goes in the first round; a key held
        // now is looked at again when its lease ends, not in this run.)
        let mut this_round: BTreeSet<K> = work.settle.into_iter().collect();
        let mut next_round: BTreeSet<K> = BTreeSet::new();
        let mut groups_by = due_by;
        for _ in 0..MAX_TIMER_ROUNDS {
            while let Some(key) = this_round.pop_first() {
                keys.with_key(&key, |store, served, admit| {
                    self.hand_on_from_timer(&key, store, served, cond, admit, now)
                });
                for due in self.waiters.due_keys(now_ms) {
                    match due > key {
                        true => this_round.insert(due),
                        false => next_round.insert(due),
                    };
                }
            }
            let mut groups: BTreeSet<WaiterId> =
                self.waiters.groups_due(groups_by).into_iter().collect();
            groups_by = now_ms;
            while let Some(id) = groups.pop_first() {
                let Some(group) = self.waiters.group(id) else {
                    continue;
                };
                let group_keys = group.keys.clone();
                let answered = keys.with_keys(&group_keys, |stores, served, admits| {
                    self.settle_group(id, group, stores, served, cond, admits, now)
                });
                if answered {
                    let behind = self.waiters.groups_first_in(&group_keys);
                    groups.extend(behind.into_iter().filter(|&next| next > id));
                }
            }
            next_round.extend(self.waiters.due_keys(now_ms));
            let groups_due = self.waiters.next_wakeup().is_some_and(|at| at <= now_ms);
            if next_round.is_empty() && !groups_due {
                return;
            }
            this_round = std::mem::take(&mut next_round);
        }
        // Rounds enough for any line but a pathological one: what is left
        // goes to the next run.
        for key in &this_round {
            self.waiters.schedule(key, now_ms);
        }
    }

    /// When to look again at what is held back while the node does not
    /// act alone: one instant for everything, [`RETRY_MS`] after the first
    /// run that held something back, so the run after a pause ends hands
    /// on every key it held (not one key per retry phase).
    pub(super) fn retry_at(&mut self, now_ms: i64) -> i64 {
        let at = match self.retry_at_ms {
            Some(at) if at > now_ms => at,
            _ => now_ms.saturating_add(RETRY_MS),
        };
        self.retry_at_ms = Some(at);
        at
    }

    /// What a timer run must do (see [`run_timer`](Self::run_timer)).
    pub(super) fn timer(&mut self, cond: Conditions, now: Now) -> TimerWork<K> {
        let now_ms = now.mono_ms();
        for wake in self.waiters.poll_timeouts(now_ms, now.mono_us) {
            push_wake(&mut self.outputs, &mut self.grant_tally, wake);
        }
        let acting = acts_alone(cond);
        // The first run that acts alone after a hold (a pause, a replica's
        // time) hands on everything held, whatever woke it (a timeout, a
        // lease's end): held keys wait for the retry instant only while the
        // hold lasts.
        let held_until = if acting {
            self.retry_at_ms.take()
        } else {
            None
        };
        let due_by = held_until.map_or(now_ms, |at| at.max(now_ms));
        // In key order: a run after a hold finds keys due at different
        // times, and the order fences are drawn in across keys is then the
        // same as any other run's.
        let mut due = self.waiters.due_keys(due_by);
        due.sort();
        let take_backs_due = self.undelivered_at_ms.is_some_and(|at| at <= due_by);
        if !acting {
            let retry_at = self.retry_at(now_ms);
            for key in &due {
                self.waiters.schedule(key, retry_at);
            }
            self.waiters.defer_groups(retry_at);
            if cond.contains(Conditions::REPLICA) {
                self.undelivered.clear();
                self.undelivered_at_ms = None;
            } else if take_backs_due {
                self.undelivered_at_ms = Some(retry_at);
            }
            return TimerWork::default();
        }
        let mut work = TimerWork {
            take_backs: Vec::new(),
            settle: due,
            due_by: Some(due_by),
        };
        if take_backs_due {
            work.take_backs = std::mem::take(&mut self.undelivered);
            self.undelivered_at_ms = None;
            // A lock taken back goes on to the next in line.
            let keys = work.take_backs.iter().map(|(key, _, _)| key.clone());
            work.settle.extend(keys.collect::<Vec<_>>());
        }
        work
    }

    /// Hands `key` on from the timer, as far as it goes now: to the first
    /// in line that may take it, or, when the key left this node, sends its
    /// line where it went (never a second lock for a key given away). A key
    /// that now holds another type fails its whole line with `store`'s error.
    pub(super) fn hand_on_from_timer<S: LockStore>(
        &mut self,
        key: &K,
        store: Result<&mut S, LockError>,
        served: Served,
        cond: Conditions,
        admission: &mut impl Admission<C>,
        now: Now,
    ) {
        if self.waiters.waiting_on(key) == 0 {
            return;
        }
        if !acts_alone(cond) {
            let retry_at = self.retry_at(now.mono_ms());
            self.waiters.schedule(key, retry_at);
            return;
        }
        if let Served::Elsewhere(redirect) = served {
            return self.fail_line(key, &LockError::Redirect(redirect), now);
        }
        match store {
            Ok(store) => self.hand_on_in_command(key, store, cond, admission, now),
            Err(err) => self.fail_line(key, &err, now),
        }
    }
}
