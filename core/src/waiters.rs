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

use crate::checks::Checks;
use crate::time;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::Hash;

use super::error::LockError;
use super::lock::{self, Mode};

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
    /// An observer (`LOCK.OBSERVE ... BLOCK`): the key's leader now, which
    /// differs from the one it saw.
    Observed(crate::observers::Leader),
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

/// What a waiter asked for, as its turn is decided (`Node`'s hand-off).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked<C> {
    pub client: C,
    pub token: Box<[u8]>,
    /// VALUE (None: not given).
    pub value: Option<Box<[u8]>>,
    /// Exclusive, or shared (with the key's limit).
    pub mode: Mode,
    pub ttl_ms: i64,
    /// MINFENCE (0: none).
    pub min_fence: i64,
}

/// Who stands first in a line ([`Waiters::head`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Head<K, C> {
    /// Nobody waits.
    Empty,
    /// A waiter whose timeout came: answered (this wake) and off the line.
    TimedOut(Wake<K, C>),
    /// A one-key waiter, with what it asked: the node decides its turn and
    /// [`answer`](Waiters::answer)s it, or leaves it first in line.
    One(WaiterId, Asked<C>),
    /// A multi-key waiter, marked for the node ([`Waiters::groups_due`]).
    Group,
}

/// A client asking to wait.
pub struct Request<'a> {
    pub token: &'a [u8],
    /// VALUE (None: not given).
    pub value: Option<&'a [u8]>,
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
    value: Option<Box<[u8]>>,
    mode: Mode,
    ttl_ms: i64,
    min_fence: i64,
    timeout_at_ms: Option<i64>,
    since_us: i64,
}

impl<K, C: Copy> Waiter<K, C> {
    fn asked(&self) -> Asked<C> {
        Asked {
            client: self.client,
            token: self.token.clone(),
            value: self.value.clone(),
            mode: self.mode,
            ttl_ms: self.ttl_ms,
            min_fence: self.min_fence,
        }
    }
}

struct KeyQueue {
    /// Waiter ids in arrival order; ids of waiters that left stay until
    /// skipped or compacted away (ids are never reused, so that is safe).
    order: VecDeque<WaiterId>,
    live: usize,
}

pub struct Waiters<K, C> {
    next_id: WaiterId,
    waiters: HashMap<WaiterId, Waiter<K, C>>,
    by_client: HashMap<C, WaiterId>,
    queues: HashMap<K, KeyQueue>,
    /// (timeout, waiter) for every waiter with a timeout.
    timeouts: BTreeSet<(i64, WaiterId)>,
    /// When each key with waiters is settled next.
    checks: Checks<K>,
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
    /// What it asked for.
    pub asked: Asked<C>,
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
            checks: Checks::default(),
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
                value: request.value.map(Into::into),
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
            asked: w.asked(),
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

    #[inline]
    /// Whether `client` waits in a line now.
    pub fn contains(&self, client: C) -> bool {
        self.by_client.contains_key(&client)
    }

    pub fn waiting_on(&self, key: &K) -> usize {
        self.queues.get(key).map_or(0, |q| q.live)
    }

    /// When the first in `key`'s line began to wait (monotonic µs); None
    /// with nobody in line.
    pub fn first_since_us(&self, key: &K) -> Option<i64> {
        let queue = self.queues.get(key)?;
        // Ids of waiters that left stay in the order until skipped.
        queue
            .order
            .iter()
            .find_map(|id| self.waiters.get(id).map(|w| w.since_us))
    }

    pub fn total(&self) -> usize {
        self.waiters.len()
    }

    /// Keys that have waiters.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.queues.keys()
    }

    /// When the glue must next call `poll_timeouts` / `due_keys`.
    #[inline]
    pub fn next_wakeup(&self) -> Option<i64> {
        let timeout = self.timeouts.first().map(|(at, _)| *at);
        let check = self.checks.next();
        time::earliest(time::earliest(timeout, check), self.groups_at_ms)
    }

    /// Have `key` settled at `at_ms` at the latest (no-op without waiters).
    pub fn schedule(&mut self, key: &K, at_ms: i64) {
        if self.queues.contains_key(key) {
            self.checks.schedule(key, at_ms);
        }
    }

    /// Sets `key`'s next check to exactly `at_ms`, dropping a pending one:
    /// a hand-off that found its first waiter held back knows the whole
    /// state of the key (nobody behind passes the first).
    pub fn reschedule(&mut self, key: &K, at_ms: i64) {
        if self.queues.contains_key(key) {
            self.checks.set(key, at_ms);
        }
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
        self.checks.take_due(now_ms)
    }

    /// Who stands first in `key`'s line now, as a hand-off looks at it: a
    /// waiter whose timeout has come is answered and taken off the line
    /// (one at a time: the caller queues each wake, then asks again); a
    /// multi-key waiter is marked for the node to look at over all its
    /// keys, and the line waits behind it.
    pub fn head(&mut self, key: &K, now_ms: i64, now_us: i64) -> Head<K, C> {
        while let Some(id) = self.front(key) {
            let w = &self.waiters[&id];
            if w.timeout_at_ms.is_some_and(|at| at <= now_ms) {
                match self.finish(id, Outcome::TimedOut, now_us) {
                    Some(wake) => return Head::TimedOut(wake),
                    None => continue,
                }
            }
            if !w.also.is_empty() {
                self.mark_group(id, now_ms);
                return Head::Group;
            }
            return Head::One(id, w.asked());
        }
        Head::Empty
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
        self.checks.rename_keys(&f);
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
                self.checks.cancel(key);
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
    //! The lines themselves; who takes the lock at a turn is the node's
    //! decision, tested there (`node`'s tests and the model).
    use super::*;

    type W = Waiters<&'static str, u32>;
    const T0: i64 = 1_700_000_000_000;

    fn us(ms: i64) -> i64 {
        ms * 1000
    }

    fn req(token: &[u8], timeout_ms: i64) -> Request<'_> {
        Request {
            token,
            value: None,
            mode: Mode::Exclusive,
            ttl_ms: 1000,
            timeout_ms,
            min_fence: 0,
        }
    }

    /// The client first in `key`'s line, or None.
    fn first(w: &mut W, key: &'static str, now_ms: i64) -> Option<u32> {
        match w.head(&key, now_ms, us(now_ms)) {
            Head::One(_, asked) => Some(asked.client),
            _ => None,
        }
    }

    #[test]
    fn the_head_is_the_first_to_arrive_and_stays_until_answered() {
        let mut w = W::default();
        w.enqueue("k", 1, req(b"a", 0), us(T0), T0 + 100, 10)
            .unwrap();
        w.enqueue("k", 2, req(b"b", 0), us(T0), T0 + 100, 10)
            .unwrap();
        assert_eq!(w.next_wakeup(), Some(T0 + 100));
        let Head::One(id, asked) = w.head(&"k", T0 + 100, us(T0 + 100)) else {
            panic!("a one-key waiter first");
        };
        assert_eq!((asked.client, &*asked.token), (1, &b"a"[..]));
        assert_eq!(
            first(&mut w, "k", T0 + 100),
            Some(1),
            "looking takes nobody off"
        );
        let granted = Outcome::Granted {
            fence: 7,
            lease: 1,
            renewed: false,
        };
        let wake = w.answer(id, granted, Vec::new(), us(T0 + 100)).unwrap();
        assert_eq!((wake.client, wake.key), (1, "k"));
        assert!(
            w.answer(id, Outcome::TimedOut, Vec::new(), us(T0 + 101))
                .is_none(),
            "once"
        );
        assert_eq!(first(&mut w, "k", T0 + 100), Some(2));
    }

    /// Defect 1 of issue 8: a waiter that timed out on K1 left an id in
    /// K1's line; a new waiter on K2 with a reused client handle must not
    /// be found first in K1's line.
    #[test]
    fn a_reused_client_handle_is_never_first_in_another_keys_line() {
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
        assert_eq!(first(&mut w, "K1", T0 + 70), Some(8));
        assert_eq!(first(&mut w, "K2", T0 + 70), Some(7));
        assert_eq!(w.waiting_on(&"K1"), 1);
    }

    /// A head whose timeout has come is answered (timed out) and taken off
    /// before anyone behind it is looked at: never granted at or after it.
    #[test]
    fn a_head_at_its_timeout_is_answered_timed_out_and_the_next_comes_up() {
        let mut w = W::default();
        w.enqueue("k", 1, req(b"a", 100), us(T0), T0 + 100, 10)
            .unwrap();
        w.enqueue("k", 2, req(b"b", 0), us(T0), T0 + 100, 10)
            .unwrap();
        assert_eq!(first(&mut w, "k", T0 + 99), Some(1));
        let Head::TimedOut(wake) = w.head(&"k", T0 + 100, us(T0 + 100)) else {
            panic!("timed out first");
        };
        assert_eq!((wake.client, wake.outcome), (1, Outcome::TimedOut));
        assert_eq!(first(&mut w, "k", T0 + 100), Some(2));
        assert!(w.poll_timeouts(T0 + 200, us(T0 + 200)).is_empty(), "once");
    }

    /// A multi-key waiter first in a line is marked for the node, and the
    /// line waits behind it.
    #[test]
    fn a_multi_key_head_is_marked_for_the_node() {
        let mut w = W::default();
        let also: Box<[&str]> = Box::new(["j"]);
        let id = w
            .enqueue_all("k", also, 1, req(b"a", 0), us(T0), T0 + 100, usize::MAX)
            .unwrap();
        w.enqueue("k", 2, req(b"b", 0), us(T0), T0 + 100, 10)
            .unwrap();
        assert_eq!(w.head(&"k", T0 + 5, us(T0 + 5)), Head::Group);
        assert!(
            w.groups_due(T0 + 4).is_empty(),
            "marked for now, not before"
        );
        assert_eq!(w.groups_due(T0 + 5), vec![id]);
        let group = w.group(id).unwrap();
        assert_eq!(group.keys, vec!["k", "j"]);
        assert!(group.first_everywhere);
        assert_eq!(group.asked.client, 1);
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
        w.reschedule(&"k", T0 + 70);
        assert_eq!(
            w.next_wakeup(),
            Some(T0 + 70),
            "exactly, the earlier one dropped"
        );
        assert_eq!(w.due_keys(T0 + 70), vec!["k"]);
        assert_eq!(w.next_wakeup(), None, "the hand-off schedules the next");
    }

    #[test]
    fn swapdb_moves_lines_with_their_keys() {
        let mut w: Waiters<(i32, &str), u32> = Waiters::default();
        w.enqueue((0, "k"), 1, req(b"a", 0), us(T0), T0 + 9, 10)
            .unwrap();
        w.enqueue((1, "k"), 2, req(b"b", 0), us(T0), T0 + 9, 10)
            .unwrap();
        w.rename_keys(|(db, k)| (1 - db, k));
        let client = |w: &mut Waiters<(i32, &str), u32>, key| match w.head(&key, T0, us(T0)) {
            Head::One(_, asked) => asked.client,
            _ => panic!("a waiter first"),
        };
        assert_eq!(client(&mut w, (1, "k")), 1);
        assert_eq!(client(&mut w, (0, "k")), 2);
        let mut due = w.due_keys(T0 + 9);
        due.sort();
        assert_eq!(due, vec![(0, "k"), (1, "k")], "checks moved too");
    }
}
