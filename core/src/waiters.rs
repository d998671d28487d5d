//! Waiting in line for a lock, and every hand-off decision.
//!
//! `Waiters` owns the FIFO queue of each key, the BLOCK timeouts and the
//! times at which each key must be looked at again. It never blocks, replies
//! or starts a timer itself: the glue feeds it events (`enqueue`, `leave`,
//! `settle` when a lock may have freed, `poll_timeouts` when time passed) and
//! executes the [`Wake`]s it returns, each of which unblocks one client with
//! exactly one outcome. `next_wakeup` says when the glue must call again.
//!
//! Invariants (checked by the model test in `core::model`):
//! * a waiter id is never reused, so a waiter that left cannot be confused
//!   with a later one, whatever client handle it had;
//! * a client handle is queued at most once at a time;
//! * a waiter is woken exactly once: granted, timed out, failed, or it left;
//! * a waiter is granted only the key it asked for, only while that lock is
//!   free (or held by its own token), in FIFO order, and never at or after
//!   its timeout;
//! * a multi-key waiter (`LOCK.ACQUIREALL ... BLOCK`) stands in the line of
//!   each of its keys and holds none of them while it waits. A settle that
//!   finds it first in a line stops there and marks it due ([`Waiters::groups_due`]):
//!   the node, which can open every one of its keys, grants them all at once
//!   when it is first in every line and every key is free for it. Lines
//!   are joined in one step, so every line orders any two waiters alike:
//!   the earliest waiter is first in all of its lines, and nobody waits on
//!   a cycle;
//! * a key with waiters always has a pending check no later than the moment
//!   its lock can next be handed on.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::Hash;

use super::error::LockError;
use super::fence::FenceSource;
use super::lock::{self, Acquired, Fit, Ledger, Mode, Rules};
use super::time::Now;

pub type WaiterId = u64;

/// What a woken waiter is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It holds the lock now. `renewed`: it already held it with this token
    /// (another connection of the same holder), so no new fence was issued.
    Granted {
        fence: i64,
        lease: u64,
        renewed: bool,
    },
    /// Its BLOCK timeout passed first.
    TimedOut,
    /// It cannot get the lock (the key now holds another type, tokens are
    /// exhausted...).
    Failed(LockError),
}

/// Unblock `client` (waiting on `key`) with `outcome`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wake<K, C> {
    pub client: C,
    pub key: K,
    pub outcome: Outcome,
    pub waited_us: i64,
    /// A multi-key waiter's grant: its other keys, each with its lease id
    /// (the outcome's lease is `key`'s). Empty otherwise.
    pub also: Vec<(K, u64)>,
}

/// What holds new grants back while a key is otherwise free.
#[derive(Debug, Clone, Copy, Default)]
pub struct HeldBack {
    /// `lock.restart-delay-ms` still running: no new grants for this long.
    pub grants_paused_ms: i64,
    /// The node's rules for a grant (`lock.lock-delay-ms`,
    /// `lock.max-holders-per-key`).
    pub rules: Rules,
}

/// The waiter whose turn it is, as `settle_checked`'s `admit` sees it.
#[derive(Debug, Clone, Copy)]
pub struct Turn<'a, C> {
    pub client: C,
    pub token: &'a [u8],
    pub ttl_ms: i64,
    /// The waiter's token holds the lock already: this turn renews it.
    pub renews: bool,
}

/// A client asking to wait.
pub struct Request<'a> {
    pub token: &'a [u8],
    /// Exclusive, or shared (with the key's limit).
    pub mode: Mode,
    pub ttl_ms: i64,
    /// 0: no timeout.
    pub timeout_ms: i64,
    /// MINFENCE (0: none): the grant's token is at least this.
    pub min_fence: i64,
}

struct Waiter<K, C> {
    key: K,
    /// A multi-key waiter's other keys: it is in their lines too.
    also: Box<[K]>,
    client: C,
    token: Box<[u8]>,
    mode: Mode,
    ttl_ms: i64,
    min_fence: i64,
    timeout_at_ms: Option<i64>,
    since_us: i64,
}

struct KeyQueue {
    /// Waiter ids in arrival order; ids of waiters that left stay until
    /// skipped or compacted away (ids are never reused, so that is safe).
    order: VecDeque<WaiterId>,
    live: usize,
    /// The pending check of this key, if any (also in `Waiters::checks`).
    check_at_ms: Option<i64>,
}

pub struct Waiters<K, C> {
    next_id: WaiterId,
    waiters: HashMap<WaiterId, Waiter<K, C>>,
    by_client: HashMap<C, WaiterId>,
    queues: HashMap<K, KeyQueue>,
    /// (timeout, waiter) for every waiter with a timeout.
    timeouts: BTreeSet<(i64, WaiterId)>,
    /// (when, key): keys to settle at that time.
    checks: BTreeSet<(i64, K)>,
    /// Multi-key waiters a settle found first in a line, for the node to
    /// look at (in arrival order) once it is `groups_at_ms`.
    groups: BTreeSet<WaiterId>,
    groups_at_ms: Option<i64>,
}

/// A multi-key waiter, as the node looks at it.
#[derive(Debug, Clone)]
pub struct Group<K, C> {
    /// Every key it waits for, in the order it named them.
    pub keys: Vec<K>,
    pub client: C,
    pub token: Box<[u8]>,
    pub mode: Mode,
    pub ttl_ms: i64,
    pub min_fence: i64,
    pub timeout_at_ms: Option<i64>,
    /// It is first in the line of every one of its keys.
    pub first_everywhere: bool,
}

impl<K: Hash + Ord + Clone, C: Hash + Eq + Copy> Default for Waiters<K, C> {
    fn default() -> Self {
        Waiters {
            next_id: 1,
            waiters: HashMap::new(),
            by_client: HashMap::new(),
            queues: HashMap::new(),
            timeouts: BTreeSet::new(),
            checks: BTreeSet::new(),
            groups: BTreeSet::new(),
            groups_at_ms: None,
        }
    }
}

impl<K: Hash + Ord + Clone, C: Hash + Eq + Copy> Waiters<K, C> {
    /// Queues `client` at the back of `key`'s line (`now_us`, like every
    /// time here but the `Now` of a settle, is on the monotonic clock). The lock is held (by
    /// someone else) until `held_until_ms`, or free but not grantable: the
    /// key is checked again then. Refused, changing nothing, when the line
    /// is full or the client is already queued.
    #[cfg(test)]
    pub fn enqueue(
        &mut self,
        key: K,
        client: C,
        request: Request<'_>,
        now_us: i64,
        held_until_ms: i64,
        max_per_key: usize,
    ) -> Result<WaiterId, LockError> {
        let also = Box::default();
        self.enqueue_all(
            key,
            also,
            client,
            request,
            now_us,
            held_until_ms,
            max_per_key,
        )
    }

    /// [`enqueue`](Self::enqueue) in the lines of `key` and of every key of
    /// `also` at once (a multi-key waiter; distinct keys), each checked
    /// again at `check_at_ms`.
    #[allow(clippy::too_many_arguments)] // enqueue's, and the other keys
    pub fn enqueue_all(
        &mut self,
        key: K,
        also: Box<[K]>,
        client: C,
        request: Request<'_>,
        now_us: i64,
        check_at_ms: i64,
        max_per_key: usize,
    ) -> Result<WaiterId, LockError> {
        if self.by_client.contains_key(&client) {
            return Err(LockError::Internal);
        }
        if std::iter::once(&key)
            .chain(also.iter())
            .any(|k| self.waiting_on(k) >= max_per_key)
        {
            return Err(LockError::TooManyWaiters(max_per_key as i64));
        }
        let id = self.next_id;
        self.next_id += 1;
        // From the next whole ms: a waiter is never answered before its
        // timeout-ms has fully passed (the floor could be up to 1 ms early).
        let arrived_ms = now_us.saturating_add(999).div_euclid(1000);
        let timeout_at_ms =
            (request.timeout_ms > 0).then(|| arrived_ms.saturating_add(request.timeout_ms));
        for k in std::iter::once(&key).chain(also.iter()) {
            let queue = self.queues.entry(k.clone()).or_insert_with(|| KeyQueue {
                order: VecDeque::new(),
                live: 0,
                check_at_ms: None,
            });
            queue.order.push_back(id);
            queue.live += 1;
        }
        if let Some(at) = timeout_at_ms {
            self.timeouts.insert((at, id));
        }
        self.by_client.insert(client, id);
        let keys: Vec<K> = std::iter::once(key.clone())
            .chain(also.iter().cloned())
            .collect();
        self.waiters.insert(
            id,
            Waiter {
                key,
                also,
                client,
                token: request.token.into(),
                mode: request.mode,
                ttl_ms: request.ttl_ms,
                min_fence: request.min_fence,
                timeout_at_ms,
                since_us: now_us,
            },
        );
        for k in &keys {
            self.schedule(k, check_at_ms);
        }
        Ok(id)
    }

    /// The client left on its own (disconnected, CLIENT UNBLOCK, the node
    /// became a replica): it gets no outcome from here. Returns the key it
    /// waited on, or None if it was not waiting.
    pub fn leave(&mut self, client: C, now_ms: i64) -> Option<K> {
        let id = *self.by_client.get(&client)?;
        self.remove_and_recheck(id, now_ms).map(|w| w.key)
    }

    /// Removes a waiter; in each line it was first in, the next one may be
    /// served now (it may hold the lock's token already): check that key.
    fn remove_and_recheck(&mut self, id: WaiterId, now_ms: i64) -> Option<Waiter<K, C>> {
        let keys = self.keys_of(id)?;
        let first_in: Vec<K> = keys
            .into_iter()
            .filter(|k| self.front(k) == Some(id))
            .collect();
        let w = self.remove(id);
        for key in &first_in {
            self.schedule(key, now_ms);
        }
        w
    }

    /// Every key a waiter waits for, its first key first.
    fn keys_of(&self, id: WaiterId) -> Option<Vec<K>> {
        let w = self.waiters.get(&id)?;
        Some(
            std::iter::once(&w.key)
                .chain(w.also.iter())
                .cloned()
                .collect(),
        )
    }

    /// Marks a multi-key waiter for the node to look at by `at_ms`.
    fn mark_group(&mut self, id: WaiterId, at_ms: i64) {
        self.groups.insert(id);
        self.groups_at_ms = Some(self.groups_at_ms.map_or(at_ms, |t| t.min(at_ms)));
    }

    /// The multi-key waiters marked for a look by `now_ms`, in arrival
    /// order (taken: a look that finds one still waiting has its keys
    /// checked again when that can change).
    pub fn groups_due(&mut self, now_ms: i64) -> Vec<WaiterId> {
        match self.groups_at_ms {
            Some(at) if at <= now_ms => {
                self.groups_at_ms = None;
                std::mem::take(&mut self.groups).into_iter().collect()
            }
            _ => Vec::new(),
        }
    }

    /// Holds the marked multi-key waiters back until `at_ms` (the node does
    /// not act alone now).
    pub fn defer_groups(&mut self, at_ms: i64) {
        if !self.groups.is_empty() {
            self.groups_at_ms = Some(at_ms);
        }
    }

    /// The multi-key waiters first in the line of any of `keys`.
    pub fn groups_first_in(&mut self, keys: &[K]) -> Vec<WaiterId> {
        let fronts: Vec<WaiterId> = keys.iter().filter_map(|k| self.front(k)).collect();
        fronts
            .into_iter()
            .filter(|id| self.waiters.get(id).is_some_and(|w| !w.also.is_empty()))
            .collect()
    }

    /// A multi-key waiter still waiting, as the node looks at it.
    pub fn group(&mut self, id: WaiterId) -> Option<Group<K, C>> {
        let keys = self.keys_of(id)?;
        let first_everywhere = keys.iter().all(|k| self.front(k) == Some(id));
        let w = &self.waiters[&id];
        Some(Group {
            keys,
            client: w.client,
            token: w.token.clone(),
            mode: w.mode,
            ttl_ms: w.ttl_ms,
            min_fence: w.min_fence,
            timeout_at_ms: w.timeout_at_ms,
            first_everywhere,
        })
    }

    /// Answers a waiter (the node's decision for a multi-key waiter); a
    /// grant's `also`: its other keys' lease ids.
    pub fn answer(
        &mut self,
        id: WaiterId,
        outcome: Outcome,
        also: Vec<(K, u64)>,
        now_us: i64,
    ) -> Option<Wake<K, C>> {
        let mut wake = self.finish(id, outcome, now_us)?;
        wake.also = also;
        Some(wake)
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

    /// When the glue must next call `poll_timeouts` / `due_keys`.
    pub fn next_wakeup(&self) -> Option<i64> {
        let timeout = self.timeouts.first().map(|(at, _)| *at);
        let check = self.checks.first().map(|(at, _)| *at);
        [timeout, check, self.groups_at_ms]
            .into_iter()
            .flatten()
            .min()
    }

    /// Have `key` settled at `at_ms` at the latest (no-op without waiters).
    pub fn schedule(&mut self, key: &K, at_ms: i64) {
        let Some(queue) = self.queues.get_mut(key) else {
            return;
        };
        match queue.check_at_ms {
            Some(pending) if pending <= at_ms => {}
            pending => {
                if let Some(pending) = pending {
                    self.checks.remove(&(pending, key.clone()));
                }
                queue.check_at_ms = Some(at_ms);
                self.checks.insert((at_ms, key.clone()));
            }
        }
    }

    /// Sets `key`'s next check to exactly `at_ms`, dropping a pending one:
    /// a settle knows the whole state of the key.
    fn reschedule(&mut self, key: &K, at_ms: i64) {
        if let Some(queue) = self.queues.get_mut(key) {
            if let Some(pending) = queue.check_at_ms.take() {
                self.checks.remove(&(pending, key.clone()));
            }
        }
        self.schedule(key, at_ms);
    }

    /// Every waiter whose timeout has come leaves the line, timed out.
    pub fn poll_timeouts(&mut self, now_ms: i64, now_us: i64) -> Vec<Wake<K, C>> {
        let mut wakes = Vec::new();
        while let Some(&(at, id)) = self.timeouts.first() {
            if at > now_ms {
                break;
            }
            wakes.extend(self.finish(id, Outcome::TimedOut, now_us));
        }
        wakes
    }

    /// Keys whose check is due; the caller settles each one (or defers it).
    pub fn due_keys(&mut self, now_ms: i64) -> Vec<K> {
        let mut keys = Vec::new();
        while let Some((at, _)) = self.checks.first() {
            if *at > now_ms {
                break;
            }
            let (_, key) = self.checks.pop_first().expect("checked above");
            if let Some(queue) = self.queues.get_mut(&key) {
                queue.check_at_ms = None;
            }
            keys.push(key);
        }
        keys
    }

    /// The lock at `key` may be free: hand it on, first in line first,
    /// skipping (and timing out) waiters whose timeout has passed, as far as
    /// it goes now, and schedule the next check. `grants_paused_ms` > 0 is
    /// restart-delay-ms: no new grants (renewals of the holder still go).
    /// (The node always hands on through [`settle_checked`](Self::settle_checked).)
    #[cfg(test)]
    pub fn settle(
        &mut self,
        key: &K,
        store: &mut impl Ledger,
        fences: &mut impl FenceSource,
        now: Now,
        grants_paused_ms: i64,
    ) -> Vec<Wake<K, C>> {
        let held_back = HeldBack {
            grants_paused_ms,
            rules: Rules {
                lock_delay_ms: 0,
                max_holders: usize::MAX,
            },
        };
        self.settle_checked(key, store, fences, now, held_back, |_| Ok(()))
    }

    /// [`settle`](Self::settle), where `admit` says whether the waiter whose
    /// turn it is may still take the lock now: its user's ACL, or the
    /// node's limits, may have changed while it waited. One that may not is
    /// answered with `admit`'s error when its turn comes, and the lock goes
    /// on to the next in line.
    pub fn settle_checked<L: Ledger>(
        &mut self,
        key: &K,
        store: &mut L,
        fences: &mut impl FenceSource,
        now: Now,
        held_back: HeldBack,
        mut admit: impl FnMut(Turn<'_, C>) -> Result<(), LockError>,
    ) -> Vec<Wake<K, C>> {
        let (now_ms, now_us) = (now.mono_ms(), now.mono_us);
        let mut wakes = Vec::new();
        while let Some(id) = self.front(key) {
            let w = &self.waiters[&id];
            if w.timeout_at_ms.is_some_and(|at| at <= now_ms) {
                wakes.extend(self.finish(id, Outcome::TimedOut, now_us));
                continue;
            }
            if !w.also.is_empty() {
                // A multi-key waiter: the node decides it over all its
                // keys; the line waits behind it.
                self.mark_group(id, now_ms);
                break;
            }
            // The head of the line is served when its mode fits the key:
            // consecutive shared waiters go together while the key has
            // room, an exclusive one waits for every holder to go, and
            // whoever stands behind a waiter that does not fit waits too.
            let fits = match lock::fit(store, &w.token, w.mode, held_back.rules, now_ms) {
                Ok(fits) => fits,
                // Another limit than the key's, or an upgrade: this waiter
                // can never be served as it asked.
                Err(err) => {
                    wakes.extend(self.finish(id, Outcome::Failed(err), now_us));
                    continue;
                }
            };
            let renews = match fits {
                Fit::Renews => true,
                Fit::Busy(until) => {
                    self.reschedule(key, until);
                    break;
                }
                Fit::Fits if held_back.grants_paused_ms > 0 => {
                    let until = now_ms.saturating_add(held_back.grants_paused_ms);
                    self.reschedule(key, until);
                    break;
                }
                Fit::Fits => false,
            };
            let turn = Turn {
                client: w.client,
                token: &w.token,
                ttl_ms: w.ttl_ms,
                renews,
            };
            if let Err(err) = admit(turn) {
                wakes.extend(self.finish(id, Outcome::Failed(err), now_us));
                continue;
            }
            let w = &self.waiters[&id];
            let acquired = lock::acquire_fitted(
                store,
                fences,
                fits,
                &w.token,
                w.mode,
                w.ttl_ms,
                w.min_fence,
                held_back.rules,
                now,
            );
            let lease =
                |store: &mut L| lock::holder_of(store, &w.token, now_ms).map_or(0, |l| l.lease);
            let outcome = match acquired {
                Ok(Acquired::Granted(fence)) => Outcome::Granted {
                    fence,
                    lease: lease(store),
                    renewed: false,
                },
                Ok(Acquired::Renewed(fence)) => Outcome::Granted {
                    fence,
                    lease: lease(store),
                    renewed: true,
                },
                // It fits, checked above.
                Ok(Acquired::Contended) => Outcome::Failed(LockError::Internal),
                Err(err) => Outcome::Failed(err),
            };
            wakes.extend(self.finish(id, outcome, now_us));
        }
        wakes
    }

    /// Every waiter on `key` fails with `err` (the key now holds another type).
    pub fn fail_all(&mut self, key: &K, err: &LockError, now_us: i64) -> Vec<Wake<K, C>> {
        let mut wakes = Vec::new();
        while let Some(id) = self.front(key) {
            wakes.extend(self.finish(id, Outcome::Failed(err.clone()), now_us));
        }
        wakes
    }

    /// Renames keys (SWAPDB moves whole databases). `f` must be a bijection
    /// on the keys present.
    pub fn rename_keys(&mut self, f: impl Fn(&K) -> K) {
        self.queues = std::mem::take(&mut self.queues)
            .into_iter()
            .map(|(k, q)| (f(&k), q))
            .collect();
        self.checks = std::mem::take(&mut self.checks)
            .into_iter()
            .map(|(at, k)| (at, f(&k)))
            .collect();
        for w in self.waiters.values_mut() {
            w.key = f(&w.key);
            for k in w.also.iter_mut() {
                *k = f(k);
            }
        }
    }

    /// The first waiter still in `key`'s line (dropping ids that left).
    fn front(&mut self, key: &K) -> Option<WaiterId> {
        let queue = self.queues.get_mut(key)?;
        while let Some(&id) = queue.order.front() {
            if self.waiters.contains_key(&id) {
                return Some(id);
            }
            queue.order.pop_front();
        }
        None
    }

    /// Takes a waiter out of its line with its outcome. (Within `settle`
    /// and `fail_all` the check this may schedule is replaced or dropped
    /// before they return.)
    fn finish(&mut self, id: WaiterId, outcome: Outcome, now_us: i64) -> Option<Wake<K, C>> {
        let w = self.remove_and_recheck(id, lock::ms(now_us))?;
        Some(Wake {
            client: w.client,
            key: w.key,
            outcome,
            waited_us: now_us.saturating_sub(w.since_us).max(0),
            also: Vec::new(),
        })
    }

    fn remove(&mut self, id: WaiterId) -> Option<Waiter<K, C>> {
        let w = self.waiters.remove(&id)?;
        self.by_client.remove(&w.client);
        self.groups.remove(&id);
        if let Some(at) = w.timeout_at_ms {
            self.timeouts.remove(&(at, id));
        }
        for key in std::iter::once(&w.key).chain(w.also.iter()) {
            let Some(queue) = self.queues.get_mut(key) else {
                continue;
            };
            queue.live -= 1;
            if queue.live == 0 {
                if let Some(at) = queue.check_at_ms {
                    self.checks.remove(&(at, key.clone()));
                }
                self.queues.remove(key);
            } else if queue.order.len() > 2 * queue.live + 16 {
                let waiters = &self.waiters;
                queue.order.retain(|id| waiters.contains_key(id));
            }
        }
        if self.groups.is_empty() {
            self.groups_at_ms = None;
        }
        self.release_memory();
        Some(w)
    }

    /// Hash maps keep their capacity: give it back once they are mostly empty.
    fn release_memory(&mut self) {
        if self.waiters.is_empty() {
            self.waiters = HashMap::new();
            self.by_client = HashMap::new();
            self.queues = HashMap::new();
        } else if self.waiters.capacity() > 4 * self.waiters.len() + 64 {
            self.waiters.shrink_to_fit();
            self.by_client.shrink_to_fit();
            self.queues.shrink_to_fit();
        }
    }

    #[cfg(test)]
    fn queue_len(&self, key: &K) -> usize {
        self.queues.get(key).map_or(0, |q| q.order.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::FenceCounter;
    use crate::lock::tests::MemStore;

    type W = Waiters<&'static str, u32>;
    const T0: i64 = 1_700_000_000_000;

    fn us(ms: i64) -> i64 {
        ms * 1000
    }

    fn req(token: &[u8], timeout_ms: i64) -> Request<'_> {
        Request {
            token,
            mode: Mode::Exclusive,
            ttl_ms: 1000,
            timeout_ms,
            min_fence: 0,
        }
    }

    fn held_by(store: &mut MemStore, fences: &mut FenceCounter, token: &[u8], until_ms: i64) {
        let (mode, rules) = (Mode::Exclusive, Rules::default());
        let ttl_ms = until_ms - T0;
        lock::acquire(
            store,
            fences,
            token,
            mode,
            ttl_ms,
            0,
            rules,
            Now::same(us(T0)),
        )
        .unwrap();
    }

    fn outcomes(wakes: &[Wake<&'static str, u32>]) -> Vec<(u32, &'static str, bool)> {
        wakes
            .iter()
            .map(|w| {
                (
                    w.client,
                    w.key,
                    matches!(w.outcome, Outcome::Granted { .. }),
                )
            })
            .collect()
    }

    #[test]
    fn the_lock_goes_to_the_first_in_line_when_it_frees() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        held_by(&mut store, &mut fences, b"h", T0 + 100);
        let mut w = W::default();
        w.enqueue("k", 1, req(b"a", 0), us(T0), T0 + 100, 10)
            .unwrap();
        w.enqueue("k", 2, req(b"b", 0), us(T0), T0 + 100, 10)
            .unwrap();
        assert_eq!(w.next_wakeup(), Some(T0 + 100));
        assert!(w
            .settle(&"k", &mut store, &mut fences, Now::same(us(T0 + 99)), 0)
            .is_empty());
        let wakes = w.settle(&"k", &mut store, &mut fences, Now::same(us(T0 + 100)), 0);
        assert_eq!(outcomes(&wakes), vec![(1, "k", true)]);
        assert_eq!(store.lock().unwrap().token, b"a");
        assert_eq!(w.next_wakeup(), Some(T0 + 1100), "a's lease end");
    }

    /// Defect 1 of issue 8: a waiter that timed out on K1 left an id in
    /// K1's line; a new waiter on K2 with a reused client handle must not
    /// be handed K1.
    #[test]
    fn a_reused_client_handle_is_never_granted_another_keys_lock() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        held_by(&mut store, &mut fences, b"A", T0 + 60_000);
        let mut w = W::default();
        w.enqueue("K1", 7, req(b"B", 50), us(T0), T0 + 60_000, 10)
            .unwrap();
        w.enqueue("K1", 8, req(b"C", 3000), us(T0), T0 + 60_000, 10)
            .unwrap();
        let timed_out = w.poll_timeouts(T0 + 50, us(T0 + 50));
        assert_eq!(timed_out.len(), 1);
        assert_eq!(timed_out[0].outcome, Outcome::TimedOut);
        // The handle 7 is reused for D, waiting on K2.
        w.enqueue("K2", 7, req(b"D", 3000), us(T0 + 60), T0 + 60_000, 10)
            .unwrap();
        lock::release(&mut store, b"A", T0 + 70);
        let wakes = w.settle(&"K1", &mut store, &mut fences, Now::same(us(T0 + 70)), 0);
        assert_eq!(outcomes(&wakes), vec![(8, "K1", true)]);
        assert_eq!(store.lock().unwrap().token, b"C");
        assert_eq!(w.waiting_on(&"K2"), 1);
    }

    #[test]
    fn a_waiter_is_never_granted_at_or_after_its_timeout() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        held_by(&mut store, &mut fences, b"h", T0 + 100);
        let mut w = W::default();
        w.enqueue("k", 1, req(b"a", 100), us(T0), T0 + 100, 10)
            .unwrap();
        w.enqueue("k", 2, req(b"b", 0), us(T0), T0 + 100, 10)
            .unwrap();
        // Lease end and timeout in the same millisecond: timed out, and the
        // next in line gets the lock.
        let wakes = w.settle(&"k", &mut store, &mut fences, Now::same(us(T0 + 100)), 0);
        assert_eq!(wakes[0].outcome, Outcome::TimedOut);
        assert_eq!(outcomes(&wakes)[1], (2, "k", true));
        assert!(w.poll_timeouts(T0 + 200, us(T0 + 200)).is_empty(), "once");
    }

    #[test]
    fn a_waiter_with_the_holders_token_is_answered_with_a_renewal() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        held_by(&mut store, &mut fences, b"h", T0 + 100);
        let fence = store.lock().unwrap().fence;
        let mut w = W::default();
        w.enqueue("k", 1, req(b"h", 0), us(T0), T0 + 100, 10)
            .unwrap();
        let wakes = w.settle(&"k", &mut store, &mut fences, Now::same(us(T0 + 1)), 0);
        assert!(matches!(
            wakes[0].outcome,
            Outcome::Granted { fence: f, renewed: true, .. } if f == fence
        ));
    }

    /// A waiter whose user lost the key (ACL SETUSER while it waited) is
    /// failed with NOPERM when its turn comes; the next in line is granted.
    #[test]
    fn a_waiter_that_may_no_longer_take_the_lock_is_failed_and_skipped() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        held_by(&mut store, &mut fences, b"h", T0 + 100);
        let mut w = W::default();
        w.enqueue("k", 1, req(b"a", 0), us(T0), T0 + 100, 10)
            .unwrap();
        w.enqueue("k", 2, req(b"b", 0), us(T0), T0 + 100, 10)
            .unwrap();
        let wakes = w.settle_checked(
            &"k",
            &mut store,
            &mut fences,
            Now::same(us(T0 + 100)),
            HeldBack::default(),
            |t| {
                if t.client == 1 {
                    Err(LockError::NoPermission)
                } else {
                    Ok(())
                }
            },
        );
        assert_eq!(wakes[0].client, 1);
        assert_eq!(wakes[0].outcome, Outcome::Failed(LockError::NoPermission));
        assert_eq!(outcomes(&wakes)[1], (2, "k", true));
        assert_eq!(store.lock().unwrap().token, b"b");
        assert_eq!(w.total(), 0);
    }

    #[test]
    fn restart_delay_holds_waiters_until_it_ends() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        let mut w = W::default();
        w.enqueue("k", 1, req(b"a", 0), us(T0), T0, 10).unwrap();
        assert!(w
            .settle(&"k", &mut store, &mut fences, Now::same(us(T0)), 500)
            .is_empty());
        assert_eq!(w.next_wakeup(), Some(T0 + 500));
        assert_eq!(w.due_keys(T0 + 499), Vec::<&str>::new());
        assert_eq!(w.due_keys(T0 + 500), vec!["k"]);
        let wakes = w.settle(&"k", &mut store, &mut fences, Now::same(us(T0 + 500)), 0);
        assert_eq!(outcomes(&wakes), vec![(1, "k", true)]);
    }

    #[test]
    fn full_lines_and_double_queueing_are_refused() {
        let mut w = W::default();
        w.enqueue("k", 1, req(b"a", 0), us(T0), T0, 2).unwrap();
        assert_eq!(
            w.enqueue("j", 1, req(b"a", 0), us(T0), T0, 2),
            Err(LockError::Internal)
        );
        w.enqueue("k", 2, req(b"b", 0), us(T0), T0, 2).unwrap();
        assert_eq!(
            w.enqueue("k", 3, req(b"c", 0), us(T0), T0, 2),
            Err(LockError::TooManyWaiters(2))
        );
        assert_eq!(w.total(), 2);
    }

    #[test]
    fn leaving_frees_everything_and_cancels_the_check() {
        let mut w = W::default();
        for c in 0..1000 {
            w.enqueue("k", c, req(b"a", 10), us(T0), T0 + 50, 2000)
                .unwrap();
        }
        for c in 0..999 {
            assert_eq!(w.leave(c, T0), Some("k"));
        }
        assert_eq!(w.leave(3, T0), None, "already gone");
        assert!(w.queue_len(&"k") < 100, "compacted");
        w.leave(999, T0);
        assert_eq!(w.keys().count(), 0);
        assert_eq!(w.next_wakeup(), None);
        assert_eq!(w.waiters.capacity(), 0, "memory given back");
    }

    #[test]
    fn one_check_per_key_the_earliest_needed() {
        let mut w = W::default();
        w.schedule(&"k", 5);
        assert_eq!(w.next_wakeup(), None, "nobody waits");
        w.enqueue("k", 1, req(b"a", 0), us(T0), T0 + 100, 10)
            .unwrap();
        w.schedule(&"k", T0 + 150);
        assert_eq!(w.next_wakeup(), Some(T0 + 100));
        w.schedule(&"k", T0 + 50);
        assert_eq!(w.next_wakeup(), Some(T0 + 50));
        assert_eq!(w.due_keys(T0 + 60), vec!["k"]);
        assert_eq!(w.next_wakeup(), None, "the settle schedules the next");
    }

    #[test]
    fn swapdb_moves_lines_with_their_keys() {
        let mut w: Waiters<(i32, &str), u32> = Waiters::default();
        w.enqueue((0, "k"), 1, req(b"a", 0), us(T0), T0 + 9, 10)
            .unwrap();
        w.enqueue((1, "k"), 2, req(b"b", 0), us(T0), T0 + 9, 10)
            .unwrap();
        w.rename_keys(|(db, k)| (1 - db, k));
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        let wakes = w.settle(&(1, "k"), &mut store, &mut fences, Now::same(us(T0)), 0);
        assert_eq!(wakes[0].client, 1);
        assert_eq!(wakes[0].key, (1, "k"));
        assert_eq!(w.due_keys(T0 + 9), vec![(0, "k")]);
    }

    fn moded(token: &[u8], mode: Mode) -> Request<'_> {
        Request {
            mode,
            ..req(token, 0)
        }
    }

    /// One line for every mode: readers at the head go together up to the
    /// limit; a writer waits for every holder, and readers behind it wait
    /// behind it (writers are not starved, readers are not either).
    #[test]
    fn one_line_serves_readers_together_and_a_writer_alone_in_arrival_order() {
        let shared = Mode::Shared { limit: Some(2) };
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        held_by(&mut store, &mut fences, b"h", T0 + 100);
        let mut w = W::default();
        for (client, token, mode) in [
            (1, &b"r1"[..], shared),
            (2, b"r2", shared),
            (3, b"r3", shared),
            (4, b"w", Mode::Exclusive),
            (5, b"r5", shared),
        ] {
            w.enqueue("k", client, moded(token, mode), us(T0), T0 + 100, 10)
                .unwrap();
        }
        let wakes = w.settle(&"k", &mut store, &mut fences, Now::same(us(T0 + 100)), 0);
        assert_eq!(
            outcomes(&wakes),
            vec![(1, "k", true), (2, "k", true)],
            "two readers at once: the limit"
        );
        assert_eq!(w.next_wakeup(), Some(T0 + 1100), "the first reader's end");
        lock::release(&mut store, b"r1", T0 + 200);
        let wakes = w.settle(&"k", &mut store, &mut fences, Now::same(us(T0 + 200)), 0);
        assert_eq!(outcomes(&wakes), vec![(3, "k", true)]);
        // r2 and r3 hold it; the writer is first, r5 waits behind it.
        lock::release(&mut store, b"r2", T0 + 300);
        let wakes = w.settle(&"k", &mut store, &mut fences, Now::same(us(T0 + 300)), 0);
        assert!(wakes.is_empty(), "r5 does not pass the writer");
        assert_eq!(w.next_wakeup(), Some(T0 + 1200), "r3's end");
        lock::release(&mut store, b"r3", T0 + 400);
        let wakes = w.settle(&"k", &mut store, &mut fences, Now::same(us(T0 + 400)), 0);
        assert_eq!(outcomes(&wakes), vec![(4, "k", true)]);
        assert_eq!(lock::LockRead::mode(&store), Some(Mode::Exclusive));
        lock::release(&mut store, b"w", T0 + 500);
        let wakes = w.settle(&"k", &mut store, &mut fences, Now::same(us(T0 + 500)), 0);
        assert_eq!(outcomes(&wakes), vec![(5, "k", true)]);
        assert_eq!(w.total(), 0);
    }

    /// A waiter that can never be served as it asked (another limit than
    /// the key's, or an upgrade) is answered with why when its turn comes,
    /// and the line goes on.
    #[test]
    fn a_waiter_asking_another_limit_is_refused_at_its_turn_and_the_line_goes_on() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        let three = Mode::Shared { limit: Some(3) };
        let rules = Rules::default();
        let at = Now::same(us(T0));
        lock::acquire(&mut store, &mut fences, b"h", three, 100, 0, rules, at).unwrap();
        let mut w = W::default();
        let two = Mode::Shared { limit: Some(2) };
        w.enqueue("k", 1, moded(b"x", two), us(T0), T0, 10).unwrap();
        w.enqueue("k", 2, moded(b"y", three), us(T0), T0, 10)
            .unwrap();
        let wakes = w.settle(&"k", &mut store, &mut fences, Now::same(us(T0 + 1)), 0);
        assert_eq!(outcomes(&wakes), vec![(1, "k", false), (2, "k", true)]);
        assert_eq!(
            wakes[0].outcome,
            Outcome::Failed(LockError::LimitMismatch {
                held: Some(3),
                asked: Some(2)
            })
        );
    }
}
