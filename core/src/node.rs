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
//!   (which opens keys through a [`Keyspace`]), [`set_limits`](Node::set_limits), [`start_serving`](Node::start_serving),
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

use std::collections::{BTreeSet, VecDeque};
use std::hash::Hash;

use bitflags::bitflags;

use crate::args;
use crate::codec;
use crate::error::{LockError, NotHeld};
use crate::fence::{self, FenceCounter};
use crate::guarded;
use crate::lock::{self, Fit, Lock, LockRead, LockStore, Mode, Rules};
use crate::output::{push_wake, Event, Output, Recorder, Stat};
use crate::time::{self, Now};
use crate::waiters::{Asked, Group, Head, Outcome, Request, WaiterId, Waiters, Wake};

/// While writes must wait (replica, CLIENT PAUSE WRITE, FAILOVER), look
/// again this soon.
pub const RETRY_MS: i64 = 10;

/// The `lock.*` options, as the node applies them: to new commands, and to
/// every hand-off from the moment they change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `lock.max-ttl-ms`: the longest lease a grant may carry.
    pub max_ttl_ms: i64,
    /// `lock.max-token-len`: the longest token a new grant may use.
    pub max_token_len: usize,
    /// `lock.max-waiters-per-key`: the longest BLOCK line on one key.
    pub max_waiters_per_key: usize,
    /// `lock.restart-delay-ms`: no new grants this long after the node
    /// loaded its data or was promoted.
    pub restart_delay_ms: i64,
    /// `lock.allow-eviction`: grant while maxmemory-policy can evict locks.
    pub allow_eviction: bool,
    /// `lock.lock-delay-ms`: after a lease ends without a release, no grant
    /// of its key for this long.
    pub lock_delay_ms: i64,
    /// `lock.max-holders-per-key`: the most holders one shared key has at
    /// once (a `LIMIT` above it is capped to it).
    pub max_holders_per_key: usize,
}

impl Default for Limits {
    /// Every option at its default (`protocol::OPTIONS`).
    fn default() -> Self {
        use crate::protocol::{
            ALLOW_EVICTION, LOCK_DELAY_MS, MAX_HOLDERS_PER_KEY, MAX_TOKEN_LEN_OPTION, MAX_TTL_MS,
            MAX_WAITERS_PER_KEY, RESTART_DELAY_MS,
        };
        Limits {
            max_ttl_ms: MAX_TTL_MS.default_value(),
            max_token_len: MAX_TOKEN_LEN_OPTION.default_value() as usize,
            max_waiters_per_key: MAX_WAITERS_PER_KEY.default_value() as usize,
            restart_delay_ms: RESTART_DELAY_MS.default_value(),
            allow_eviction: ALLOW_EVICTION.default_value() != 0,
            lock_delay_ms: LOCK_DELAY_MS.default_value(),
            max_holders_per_key: MAX_HOLDERS_PER_KEY.default_value() as usize,
        }
    }
}

impl Limits {
    /// What the state machine applies to a grant.
    #[inline]
    pub fn rules(&self) -> Rules {
        Rules {
            lock_delay_ms: self.lock_delay_ms,
            max_holders: self.max_holders_per_key,
        }
    }

    /// The longest lease a grant, renewal or extension may carry now: one
    /// rule for ACQUIRE, EXTEND and every hand-off.
    #[inline]
    pub fn check_ttl(&self, ttl_ms: i64) -> Result<(), LockError> {
        if ttl_ms > self.max_ttl_ms {
            return Err(LockError::TtlTooLarge(
                format!("'{ttl_ms}'"),
                self.max_ttl_ms,
            ));
        }
        Ok(())
    }

    /// Whether a *new* holder (a grant, or a place in line) may be taken
    /// on: its token within `lock.max-token-len`, and a server that can keep
    /// the lock (no eviction of locks, memory below maxmemory). A holder
    /// renewing its own lock is never refused for these: its same-token
    /// ACQUIRE is the safe retry after a lost reply, whatever the options
    /// became since it was granted. One rule for ACQUIRE and every hand-off.
    #[inline]
    pub fn check_new_holder(&self, token: &[u8], cond: Conditions) -> Result<(), LockError> {
        args::check_token_limit(token, self.max_token_len)?;
        self.check_can_keep_new(cond)
    }

    /// Whether the server can keep a value it is asked to take on now (a
    /// new holder, a new gate): not evictable, and below maxmemory.
    #[inline]
    pub fn check_can_keep_new(&self, cond: Conditions) -> Result<(), LockError> {
        self.check_not_evictable(cond)?;
        if cond.contains(Conditions::OOM) {
            return Err(LockError::OutOfMemory);
        }
        Ok(())
    }

    /// Whether values the server keeps could be evicted (an `allkeys-*`
    /// policy) without `lock.allow-eviction`.
    #[inline]
    pub fn check_not_evictable(&self, cond: Conditions) -> Result<(), LockError> {
        if cond.contains(Conditions::EVICTABLE) && !self.allow_eviction {
            return Err(LockError::EvictionUnsafe);
        }
        Ok(())
    }

    /// Whether a waiter whose turn has come may take its lock(s) now: the
    /// limits in force at the hand-off (as a new ACQUIRE's), unless it
    /// renews its own lock, and its ACL as it is now (`may_take`, on every
    /// key it waits for). One rule for one-key and multi-key waiters.
    pub fn check_turn(
        &self,
        ttl_ms: i64,
        token: &[u8],
        renews: bool,
        cond: Conditions,
        may_take: impl FnOnce() -> bool,
    ) -> Result<(), LockError> {
        self.check_ttl(ttl_ms)?;
        if !renews {
            self.check_new_holder(token, cond)?;
        }
        match may_take() {
            true => Ok(()),
            false => Err(LockError::NoPermission),
        }
    }
}

bitflags! {
    /// What only the server knows at the moment of a call.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Conditions: u8 {
        /// This node is a replica: its master's effects are its only writes.
        const REPLICA = 1 << 0;
        /// The calling client may block (not in MULTI, Lua or a
        /// no-blocking context): BLOCK waits instead of answering at once.
        const MAY_BLOCK = 1 << 1;
        /// maxmemory-policy can evict keys, and so held locks.
        const EVICTABLE = 1 << 2;
        /// Used memory is above maxmemory.
        const OOM = 1 << 3;
        /// Writes are held back (CLIENT PAUSE WRITE, FAILOVER): a hand-off
        /// or take-back must wait.
        const WRITES_PAUSED = 1 << 4;
    }
}

/// Whether the key a waiter waits on is still served by this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    Here,
    /// Its store moved (cluster resharding or failover): the waiters are
    /// answered with this redirect (`ASK ...`, `MOVED ...`, `CLUSTERDOWN ...`).
    Elsewhere(String),
}

/// Whether a waiter may still take the lock when its turn comes: its user
/// may have lost the command or the key (ACL SETUSER) while it waited.
pub trait Admission<C> {
    fn may_take(&mut self, client: C) -> bool;
}

/// Every waiter is still admitted (no ACL to ask).
pub struct AdmitAll;

impl<C> Admission<C> for AdmitAll {
    fn may_take(&mut self, _client: C) -> bool {
        true
    }
}

impl<C, F: FnMut(C) -> bool> Admission<C> for F {
    fn may_take(&mut self, client: C) -> bool {
        self(client)
    }
}

/// The server's keys as a timer run opens them, one at a time: in Redis,
/// the key's db selected, the key opened for writing, the cluster asked
/// whether it is still served here, and ACL asked for each waiter; in the
/// model and the tests, maps in memory. [`Node::run_timer`] is the one
/// sequence of a timer run, whoever provides the keys.
pub trait Keyspace<K, C> {
    type Store: LockStore;
    type Admit: Admission<C>;
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
}

/// A key's lock as `LOCK.INFO` shows it ([`Node::info`]).
#[derive(Debug)]
pub struct Held<'s> {
    /// Exclusive, or shared (with its limit).
    pub mode: Mode,
    /// Its holders whose lease has not ended, in the order the key keeps.
    pub live: Vec<Lock<'s>>,
    /// Which of `live` was granted last (the highest fence).
    pub newest: usize,
    /// How many wait in its line.
    pub waiters: usize,
}

/// `LOCK.ACQUIRE key token ttl-ms [BLOCK timeout-ms] [MINFENCE n]`, parsed.
#[derive(Debug, Clone, Copy)]
pub struct AcquireRequest<'a> {
    pub token: &'a [u8],
    /// Exclusive, or `SHARED [LIMIT n]`.
    pub mode: Mode,
    pub ttl_ms: i64,
    /// BLOCK timeout-ms (0: no timeout); None without BLOCK.
    pub block_ms: Option<i64>,
    /// MINFENCE n (0: none).
    pub min_fence: i64,
}

/// What an ACQUIRE comes to.
#[derive(Debug, PartialEq, Eq)]
pub enum Acquire<K> {
    /// A new grant with a new fencing token.
    Granted(i64),
    /// The token already held the lock: lease reset (and a fresh token if
    /// MINFENCE asked for more than it had).
    Renewed(i64),
    /// Another token holds the lock (nil).
    Contended,
    /// The client must wait in line: block it, then [`Node::enqueue`] it.
    Wait(WaitTicket<K>),
}

/// A decision to queue a client, to be carried out once the glue has blocked
/// it ([`Node::enqueue`]). The line was checked for room when it was made.
#[derive(Debug, PartialEq, Eq)]
pub struct WaitTicket<K> {
    key: K,
    /// A multi-key waiter's other keys.
    also: Box<[K]>,
    token: Box<[u8]>,
    mode: Mode,
    ttl_ms: i64,
    timeout_ms: i64,
    min_fence: i64,
    since_us: i64,
    /// When the key must be looked at again: the holder's lease end, or the
    /// end of the restart delay.
    check_at_ms: i64,
}

/// What a timer run must do, in this order: take these grants back, then
/// settle these keys. Waiters that timed out are already in the wake queue.
#[derive(Debug, PartialEq, Eq)]
struct TimerWork<K> {
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

/// How many times one timer run goes round (settling the keys, then the
/// multi-key waiters) while answering a waiter made more due at once.
const MAX_TIMER_ROUNDS: usize = 64;

/// A loaded or restored lock as the node takes it: its times on this
/// node's monotonic clock, capped as every lease entering the node is, and
/// its lease id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    pub deadline_ms: i64,
    pub granted_ms: Option<i64>,
    pub lease: u64,
}

pub struct Node<K, C> {
    fences: FenceCounter,
    waiters: Waiters<K, C>,
    limits: Limits,
    /// When the node last started serving as master (loaded its data or
    /// was promoted), monotonic ms: the restart delay runs from here.
    serving_since_ms: i64,
    /// The node's first fence since it last started serving: gates refuse
    /// clock fences below it (see `guarded::pass`).
    gate_floor: i64,
    /// Grants whose reply never reached their client: (key, fence, lease),
    /// and when the timer must take them back.
    undelivered: Vec<(K, i64, u64)>,
    undelivered_at_ms: Option<i64>,
    /// While the node does not act alone: when everything held back is
    /// looked at again ([`Node::retry_at`]).
    retry_at_ms: Option<i64>,
    /// What the glue must carry out, in order ([`Node::poll_output`]).
    outputs: VecDeque<Output<K, C>>,
    /// The last lease id handed out: one per grant and renewal, for the
    /// life of the process (see `Lock::lease`).
    leases: u64,
}

impl<K: Hash + Ord + Clone, C: Hash + Eq + Copy> Default for Node<K, C> {
    fn default() -> Self {
        Node {
            fences: FenceCounter::default(),
            waiters: Waiters::default(),
            limits: Limits::default(),
            serving_since_ms: 0,
            gate_floor: 0,
            undelivered: Vec::new(),
            undelivered_at_ms: None,
            retry_at_ms: None,
            outputs: VecDeque::new(),
            leases: 0,
        }
    }
}

impl<K: Hash + Ord + Clone, C: Hash + Eq + Copy> Node<K, C> {
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
        debug_assert!(buffer.is_empty());
        std::mem::swap(&mut self.outputs, buffer);
    }

    /// When [`run_timer`](Self::run_timer) must run next (monotonic ms, as every
    /// time the node schedules).
    #[inline]
    pub fn next_wakeup(&self) -> Option<i64> {
        match (self.waiters.next_wakeup(), self.undelivered_at_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ---- commands ----

    /// `LOCK.ACQUIRE`: the one-key case of [`acquire_all`](Self::acquire_all)
    /// (one decision for both). Any hand-off due on the key runs first, so
    /// nobody barges in ahead of the line.
    pub fn acquire<S: LockStore, A: Admission<C>>(
        &mut self,
        key: &K,
        store: Result<&mut S, LockError>,
        req: AcquireRequest<'_>,
        cond: Conditions,
        admission: &mut A,
        now: Now,
    ) -> Result<Acquire<K>, LockError> {
        let keys = std::slice::from_ref(key);
        let stores = store.map(std::slice::from_mut);
        self.acquire_all(
            keys,
            stores,
            req,
            cond,
            std::slice::from_mut(admission),
            now,
        )
    }

    /// `LOCK.ACQUIREALL numkeys key ... token ttl-ms [BLOCK timeout-ms]
    /// [MINFENCE n]`: every key of `keys` (distinct; `stores[i]` and
    /// `admissions[i]` are `keys[i]`'s) to the request's token with one
    /// fence, or none. Contended (nil) and nothing changed when any key is
    /// held by another token, is held back by lock-delay, or has waiters
    /// (no barging past a line); with BLOCK the client waits in every
    /// key's line instead, holding none of them
    /// (the `waiters` module says how it is served). The
    /// same token holding every key under one fence (a retry after a lost
    /// reply) renews them all and gets that fence again; holding only some
    /// of them is not that. Hand-offs due on the keys run first, as for
    /// every command.
    pub fn acquire_all<S: LockStore, A: Admission<C>>(
        &mut self,
        keys: &[K],
        stores: Result<&mut [S], LockError>,
        req: AcquireRequest<'_>,
        cond: Conditions,
        admissions: &mut [A],
        now: Now,
    ) -> Result<Acquire<K>, LockError> {
        let decided = self.decide_acquire_all(keys, stores, req, cond, admissions, now);
        let (stat, event) = match &decided {
            Ok(Acquire::Granted(_)) => (Stat::Grant, Some(Event::Acquire)),
            Ok(Acquire::Renewed(_)) => (Stat::Extend, Some(Event::Extend)),
            Ok(Acquire::Contended) => (Stat::Contended, None),
            Err(LockError::EvictionUnsafe) => (Stat::RefusedEvictable, None),
            Ok(Acquire::Wait(_)) | Err(_) => return decided,
        };
        match event {
            Some(event) => {
                for key in keys {
                    self.outputs.push_back(Output::Count(stat));
                    self.outputs.push_back(Output::Event(key.clone(), event));
                }
            }
            None => self.outputs.push_back(Output::Count(stat)),
        }
        decided
    }

    fn decide_acquire_all<S: LockStore, A: Admission<C>>(
        &mut self,
        keys: &[K],
        stores: Result<&mut [S], LockError>,
        req: AcquireRequest<'_>,
        cond: Conditions,
        admissions: &mut [A],
        now: Now,
    ) -> Result<Acquire<K>, LockError> {
        self.limits.check_ttl(req.ttl_ms)?;
        check_requested_min_fence(req.min_fence, now)?;
        let stores = self.open_in_command(keys, stores, cond, now)?;
        debug_assert_eq!(keys.len(), stores.len());
        debug_assert_eq!(keys.len(), admissions.len());
        // Each key's line is served with its own key's admission (a
        // waiter's ACL is about the key it waits on).
        for ((key, store), admission) in keys.iter().zip(stores.iter_mut()).zip(admissions) {
            self.hand_on_in_command(key, store, cond, admission, now);
        }
        let now_ms = now.mono_ms();
        let rules = self.limits.rules();
        // Decide before writing: a contended ACQUIRE changes nothing (it
        // would abort other clients' WATCH).
        // When the first key that holds the request back frees (None:
        // none does).
        let mut held_until: Option<i64> = None;
        let fits = fit_all(stores, req.token, req.mode, rules, now_ms, |_, until| {
            held_until = Some(held_until.map_or(until, |at| at.min(until)));
        })?;
        if let AllFit::Renews(fence) = fits {
            let (token, mode, ttl_ms) = (req.token, req.mode, req.ttl_ms);
            let fence =
                self.renew_all(keys, stores, token, mode, fence, ttl_ms, req.min_fence, now)?;
            return Ok(Acquire::Renewed(fence));
        }
        // Anyone in line (a multi-key waiter waiting for its other keys, a
        // writer that shared holders keep out): nobody passes them.
        let in_line = keys.iter().any(|key| self.waiters.waiting_on(key) > 0);
        let busy = fits == AllFit::Busy || in_line;
        let block = req
            .block_ms
            .filter(|_| cond.contains(Conditions::MAY_BLOCK));
        if busy && block.is_none() {
            return Ok(Acquire::Contended);
        }
        self.limits.check_new_holder(req.token, cond)?;
        let paused = self.grants_paused_ms(now_ms);
        if busy || paused > 0 {
            let Some(timeout_ms) = block else {
                return Err(LockError::GrantsPaused(paused));
            };
            let max = self.limits.max_waiters_per_key;
            if keys.iter().any(|k| self.waiters.waiting_on(k) >= max) {
                return Err(LockError::TooManyWaiters(max as i64));
            }
            // The lines are looked at again when the first lease (or
            // lock-delay) that holds the request back ends; behind others,
            // now (their line says when next); else when the restart delay
            // ends.
            let check_at_ms = match (held_until, in_line) {
                (Some(until), _) => until,
                (None, true) => now_ms,
                (None, false) => now_ms.saturating_add(paused),
            };
            return Ok(Acquire::Wait(WaitTicket {
                key: keys[0].clone(),
                also: keys[1..].into(),
                token: req.token.into(),
                mode: req.mode,
                ttl_ms: req.ttl_ms,
                timeout_ms,
                min_fence: req.min_fence,
                since_us: now.mono_us,
                check_at_ms,
            }));
        }
        let (token, mode) = (req.token, req.mode);
        let fence = self.grant_all(keys, stores, token, mode, req.ttl_ms, req.min_fence, now)?;
        Ok(Acquire::Granted(fence))
    }

    /// New holders of every key (each fits `mode`, the grant allowed): one
    /// fence, drawn once and checked (and the deadline too) before any key
    /// changes.
    #[allow(clippy::too_many_arguments)] // one input per thing the call depends on
    fn grant_all<S: LockStore>(
        &mut self,
        keys: &[K],
        stores: &mut [S],
        token: &[u8],
        mode: Mode,
        ttl_ms: i64,
        min_fence: i64,
        now: Now,
    ) -> Result<i64, LockError> {
        let now_ms = now.mono_ms();
        let deadline_ms = lock::deadline(now_ms, ttl_ms)?;
        let fence = lock::fresh_fence(&mut self.fences, min_fence, now.wall_us)?;
        let rules = self.limits.rules();
        for (key, store) in keys.iter().zip(stores.iter_mut()) {
            let mut ledger = self.ledger(key, store, now_ms);
            lock::grant(&mut ledger, mode, token, fence, deadline_ms, rules, now_ms);
        }
        Ok(fence)
    }

    /// `token` holds every key under one grant (`fence`): each lease
    /// renewed (and downgraded when it asks `SHARED` of keys it holds
    /// exclusively); with MINFENCE above the held fence (Redlock's second
    /// phase over several keys), one fresh fence for every key, above the
    /// mark and `min_fence`, as a single key's holder gets.
    #[allow(clippy::too_many_arguments)] // one input per thing the call depends on
    fn renew_all<S: LockStore>(
        &mut self,
        keys: &[K],
        stores: &mut [S],
        token: &[u8],
        mode: Mode,
        fence: i64,
        ttl_ms: i64,
        min_fence: i64,
        now: Now,
    ) -> Result<i64, LockError> {
        let now_ms = now.mono_ms();
        let deadline_ms = lock::deadline(now_ms, ttl_ms)?;
        let raised = match min_fence > fence {
            true => Some(lock::raised_fence(
                &mut self.fences,
                min_fence,
                now.wall_us,
            )?),
            false => None,
        };
        for (key, store) in keys.iter().zip(stores.iter_mut()) {
            let mut ledger = self.ledger(key, store, now_ms);
            lock::renew_holder(&mut ledger, token, mode, raised, deadline_ms, now_ms)?;
            // A downgrade lets the readers in line in now.
            let check_at_ms = match mode.is_shared() {
                true => now_ms,
                false => deadline_ms,
            };
            self.waiters.schedule(key, check_at_ms);
        }
        Ok(raised.unwrap_or(fence))
    }

    /// Queues a client the glue blocked on a [`WaitTicket`].
    pub fn enqueue(&mut self, ticket: WaitTicket<K>, client: C) -> Result<(), LockError> {
        let request = Request {
            token: &ticket.token,
            mode: ticket.mode,
            ttl_ms: ticket.ttl_ms,
            timeout_ms: ticket.timeout_ms,
            min_fence: ticket.min_fence,
        };
        self.waiters
            .enqueue_all(
                ticket.key,
                ticket.also,
                client,
                request,
                ticket.since_us,
                ticket.check_at_ms,
                usize::MAX,
            )
            .map(|_| ())
    }

    /// `LOCK.RELEASE`: true when `token` held the lock; the next waiter is
    /// then handed it in this same call.
    pub fn release<S: LockStore>(
        &mut self,
        key: &K,
        store: Result<&mut S, LockError>,
        token: &[u8],
        cond: Conditions,
        admission: &mut impl Admission<C>,
        now: Now,
    ) -> Result<bool, LockError> {
        let store = store.map(std::slice::from_mut);
        let [store] = self.open_in_command(std::slice::from_ref(key), store, cond, now)? else {
            unreachable!("one key, one store")
        };
        self.hand_on_in_command(key, store, cond, admission, now);
        let now_ms = now.mono_ms();
        let mut ledger = self.ledger(key, store, now_ms);
        let released = lock::release(&mut ledger, token, now_ms);
        if released {
            self.outputs.push_back(Output::Count(Stat::Release));
            self.outputs
                .push_back(Output::Event(key.clone(), Event::Release));
        }
        // Ended leases still stored (another holder's, on a shared key)
        // are reclaimed when touched.
        let delay = self.limits.lock_delay_ms;
        let reclaimed = lock::reclaim(&mut self.ledger(key, store, now_ms), delay, now_ms);
        if released || reclaimed {
            self.hand_on_in_command(key, store, cond, admission, now);
        }
        Ok(released)
    }

    /// `LOCK.RELEASEALL`: each key of `keys` released as by
    /// [`release`](Self::release) (`stores[i]` and `admissions[i]` are
    /// `keys[i]`'s, all opened before anything changes); how many it
    /// released.
    pub fn release_all<S: LockStore, A: Admission<C>>(
        &mut self,
        keys: &[K],
        stores: &mut [S],
        token: &[u8],
        cond: Conditions,
        admissions: &mut [A],
        now: Now,
    ) -> Result<i64, LockError> {
        let mut released = 0;
        for ((key, store), admission) in keys.iter().zip(stores).zip(admissions) {
            released += i64::from(self.release(key, Ok(store), token, cond, admission, now)?);
        }
        Ok(released)
    }

    /// `LOCK.EXTEND`: true when `token` holds the lock; its lease then ends
    /// `ttl_ms` from now. An ended lease is never revived.
    #[allow(clippy::too_many_arguments)] // one input per thing the call depends on
    pub fn extend<S: LockStore>(
        &mut self,
        key: &K,
        store: Result<&mut S, LockError>,
        token: &[u8],
        ttl_ms: i64,
        cond: Conditions,
        admission: &mut impl Admission<C>,
        now: Now,
    ) -> Result<bool, LockError> {
        self.limits.check_ttl(ttl_ms)?;
        let store = store.map(std::slice::from_mut);
        let [store] = self.open_in_command(std::slice::from_ref(key), store, cond, now)? else {
            unreachable!("one key, one store")
        };
        self.hand_on_in_command(key, store, cond, admission, now);
        let now_ms = now.mono_ms();
        let extended = lock::extend(&mut self.ledger(key, store, now_ms), token, ttl_ms, now_ms)?;
        let delay = self.limits.lock_delay_ms;
        if extended {
            self.outputs.push_back(Output::Count(Stat::Extend));
            self.outputs
                .push_back(Output::Event(key.clone(), Event::Extend));
            self.waiters.schedule(key, now_ms.saturating_add(ttl_ms));
            // An exclusive key just extended has no ended lease to reclaim.
            if store.mode() == Some(Mode::Exclusive) {
                return Ok(true);
            }
        }
        // Ended leases still stored (another holder's, on a shared key)
        // are reclaimed when touched.
        if lock::reclaim(&mut self.ledger(key, store, now_ms), delay, now_ms) {
            self.hand_on_in_command(key, store, cond, admission, now);
        }
        Ok(extended)
    }

    // ---- waiters and the timer ----

    /// The client left on its own (disconnected, CLIENT UNBLOCK, the node
    /// became a replica): it gets no outcome. True if it was waiting.
    pub fn leave(&mut self, client: C, now_ms: i64) -> bool {
        self.waiters.leave(client, now_ms).is_some()
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

    /// A run of the timer, whole: waiters whose timeout came are answered
    /// (that writes nothing, so it also runs while writes must wait); then,
    /// when the node [acts alone](Self::acts_alone), undelivered grants are
    /// taken back and every due key is handed on (opened through `keys`),
    /// a key taken back among them. On a replica, or while writes are held
    /// back, nothing is handed on: due keys are looked at again in
    /// [`RETRY_MS`]; take-backs wait too, except on a replica, where they
    /// are the master's to make and are dropped.
    ///
    /// A grant taken back is reported as a release. The glue, the model
    /// and the tests all run this one sequence.
    pub fn run_timer<S: Keyspace<K, C>>(&mut self, keys: &mut S, cond: Conditions, now: Now) {
        let work = self.timer(cond, now);
        let now_ms = now.mono_ms();
        for (key, fence, lease) in work.take_backs {
            let took = keys.with_key(&key, |store, _, _| {
                store.is_ok_and(|s| {
                    lock::take_back(&mut self.ledger(&key, s, now_ms), fence, lease, now_ms)
                })
            });
            if took {
                self.outputs.push_back(Output::Count(Stat::TakeBack));
                self.outputs.push_back(Output::Event(key, Event::Release));
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

    /// Looks at a multi-key waiter (`group`, waiter `id`) with all its keys
    /// open: granted every key with one fence when it is first in every
    /// line and every key is free for it (or renewed when it holds them
    /// all under one grant already); otherwise each key that holds it back
    /// is looked at again when that ends, and a key where it is not first
    /// yet brings it back when its turn comes there. Failed when a key
    /// left this node or holds another type, or when it may not take them
    /// now (the limits, its ACL on every key). True if it was answered.
    #[allow(clippy::too_many_arguments)] // one input per thing the call depends on
    fn settle_group<S: LockStore, A: Admission<C>>(
        &mut self,
        id: WaiterId,
        group: Group<K, C>,
        stores: Result<&mut [S], LockError>,
        served: Served,
        cond: Conditions,
        admissions: &mut [A],
        now: Now,
    ) -> bool {
        let now_ms = now.mono_ms();
        let stores = match (served, stores) {
            (Served::Elsewhere(redirect), _) => {
                return self.answer(id, Outcome::Failed(LockError::Redirect(redirect)), now);
            }
            (Served::Here, Err(err)) => return self.answer(id, Outcome::Failed(err), now),
            (Served::Here, Ok(stores)) => stores,
        };
        if group.timeout_at_ms.is_some_and(|at| at <= now_ms) {
            return self.answer(id, Outcome::TimedOut, now);
        }
        if !group.first_everywhere {
            return false;
        }
        self.take_turn(id, &group.keys, stores, &group.asked, cond, admissions, now)
    }

    /// The turn of waiter `id`, first in the line of every key of `keys`
    /// (its one key, or a multi-key waiter's), each open: the one hand-off
    /// decision. Granted every key with one fence when each is free for it
    /// (or renewed when it holds them all under one grant already), the
    /// grants allowed now (the restart delay) and it may take them (the
    /// limits in force now, its ACL on every key): answered, true.
    /// Failed (answered, true) when it can never be served as it asked or
    /// may not take them now. Otherwise it stays first in line, and each key
    /// that holds it back is looked at again when that ends: false.
    #[allow(clippy::too_many_arguments)] // one input per thing the call depends on
    fn take_turn<S: LockStore, A: Admission<C>>(
        &mut self,
        id: WaiterId,
        keys: &[K],
        stores: &mut [S],
        asked: &Asked<C>,
        cond: Conditions,
        admissions: &mut [A],
        now: Now,
    ) -> bool {
        let now_ms = now.mono_ms();
        let token = &*asked.token;
        let rules = self.limits.rules();
        let waiters = &mut self.waiters;
        let fits = fit_all(stores, token, asked.mode, rules, now_ms, |i, until| {
            waiters.reschedule(&keys[i], until);
        });
        let renews = match fits {
            Err(err) => return self.answer(id, Outcome::Failed(err), now),
            Ok(AllFit::Renews(fence)) => Some(fence),
            Ok(AllFit::Busy) => return false,
            Ok(AllFit::Fits) => {
                let paused = self.grants_paused_ms(now_ms);
                if paused > 0 {
                    self.waiters
                        .reschedule(&keys[0], now_ms.saturating_add(paused));
                    return false;
                }
                None
            }
        };
        let admitted = self
            .limits
            .check_turn(asked.ttl_ms, token, renews.is_some(), cond, || {
                admissions.iter_mut().all(|a| a.may_take(asked.client))
            });
        let (mode, ttl_ms, min_fence) = (asked.mode, asked.ttl_ms, asked.min_fence);
        let taken = admitted.and_then(|()| match renews {
            Some(fence) => self.renew_all(keys, stores, token, mode, fence, ttl_ms, min_fence, now),
            None => self.grant_all(keys, stores, token, mode, ttl_ms, min_fence, now),
        });
        let fence = match taken {
            Ok(fence) => fence,
            Err(err) => return self.answer(id, Outcome::Failed(err), now),
        };
        let mut leases = stores
            .iter()
            .map(|s| lock::holder_of(s, token, now_ms).map_or(0, |l| l.lease));
        let lease = leases.next().unwrap_or(0);
        let also = keys[1..].iter().cloned().zip(leases).collect();
        let outcome = Outcome::Granted {
            fence,
            lease,
            renewed: renews.is_some(),
        };
        if let Some(wake) = self.waiters.answer(id, outcome, also, now.mono_us) {
            push_wake(&mut self.outputs, wake);
        }
        true
    }

    /// A multi-key waiter's answer, when it is not a grant.
    fn answer(&mut self, id: WaiterId, outcome: Outcome, now: Now) -> bool {
        if let Some(wake) = self.waiters.answer(id, outcome, Vec::new(), now.mono_us) {
            push_wake(&mut self.outputs, wake);
        }
        true
    }

    /// When to look again at what is held back while the node does not
    /// act alone: one instant for everything, [`RETRY_MS`] after the first
    /// run that held something back, so the run after a pause ends hands
    /// on every key it held (not one key per retry phase).
    fn retry_at(&mut self, now_ms: i64) -> i64 {
        let at = match self.retry_at_ms {
            Some(at) if at > now_ms => at,
            _ => now_ms.saturating_add(RETRY_MS),
        };
        self.retry_at_ms = Some(at);
        at
    }

    /// What a timer run must do (see [`run_timer`](Self::run_timer)).
    fn timer(&mut self, cond: Conditions, now: Now) -> TimerWork<K> {
        let now_ms = now.mono_ms();
        for wake in self.waiters.poll_timeouts(now_ms, now.mono_us) {
            push_wake(&mut self.outputs, wake);
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
    fn hand_on_from_timer<S: LockStore>(
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

    /// The keys a write command touches: refused on a replica first; a key
    /// of another type (WRONGTYPE) fails the command, and its whole line
    /// when the command named that key alone (a multi-key command's error
    /// names no key).
    fn open_in_command<'s, S: LockStore>(
        &mut self,
        keys: &[K],
        stores: Result<&'s mut [S], LockError>,
        cond: Conditions,
        now: Now,
    ) -> Result<&'s mut [S], LockError> {
        refuse_on_replica(cond)?;
        stores.inspect_err(|err| {
            if let [key] = keys {
                self.fail_line(key, err, now);
            }
        })
    }

    /// Every waiter on `key` fails with `err`.
    fn fail_line(&mut self, key: &K, err: &LockError, now: Now) {
        for wake in self.waiters.fail_all(key, err, now.mono_us) {
            push_wake(&mut self.outputs, wake);
        }
    }

    /// Hands `key` on, as far as it goes now: the first in line takes it
    /// when its turn decides so ([`take_turn`](Self::take_turn)), then the
    /// next (readers go together while the key has room), until one is
    /// held back or the line is empty; a multi-key waiter first in line is
    /// marked for the timer, and the line waits behind it. Run before any
    /// command touches a key with waiters (the command's own key is served
    /// here, or Redis would have redirected it), and by the timer.
    #[inline] // nobody waiting: the common case, a look
    fn hand_on_in_command<S: LockStore, A: Admission<C>>(
        &mut self,
        key: &K,
        store: &mut S,
        cond: Conditions,
        admission: &mut A,
        now: Now,
    ) {
        if self.waiters.waiting_on(key) > 0 {
            self.hand_on_line(key, store, cond, admission, now);
        }
    }

    /// [`hand_on_in_command`](Self::hand_on_in_command) of a key with a line.
    #[inline(never)]
    fn hand_on_line<S: LockStore, A: Admission<C>>(
        &mut self,
        key: &K,
        store: &mut S,
        cond: Conditions,
        admission: &mut A,
        now: Now,
    ) {
        let (now_ms, now_us) = (now.mono_ms(), now.mono_us);
        loop {
            match self.waiters.head(key, now_ms, now_us) {
                Head::Empty | Head::Group => return,
                Head::TimedOut(wake) => push_wake(&mut self.outputs, wake),
                Head::One(id, asked) => {
                    let keys = std::slice::from_ref(key);
                    let stores = std::slice::from_mut(store);
                    let admissions = std::slice::from_mut(admission);
                    if !self.take_turn(id, keys, stores, &asked, cond, admissions, now) {
                        return;
                    }
                }
            }
        }
    }

    /// Whether the key has a holder whose lease ended: the sweep opens it
    /// for [`Node::reclaim`] then (a read, from its scan, where nothing may
    /// be written).
    pub fn needs_reclaim(&self, store: &impl LockRead, now_ms: i64) -> bool {
        lock::holders(store).any(|l| !l.is_live(now_ms))
    }

    /// The background sweep (or any caller) found `key`'s lock: reclaim it
    /// if its lease has ended, and hand the key on if anyone waits. True if
    /// it was reclaimed.
    pub fn reclaim<S: LockStore>(
        &mut self,
        key: &K,
        store: &mut S,
        cond: Conditions,
        admission: &mut impl Admission<C>,
        now: Now,
    ) -> bool {
        if !acts_alone(cond) {
            return false; // the master reclaims; or later
        }
        let now_ms = now.mono_ms();
        let delay = self.limits.lock_delay_ms;
        let reclaimed = lock::reclaim(&mut self.ledger(key, store, now_ms), delay, now_ms);
        if reclaimed {
            self.hand_on_in_command(key, store, cond, admission, now);
        }
        reclaimed
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
    /// the clock, and the restart delay starts.
    pub fn start_serving(&mut self, now: Now) {
        self.fences.raise_to_clock(now.wall_us);
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
    /// must be a bijection), so do grants waiting to be taken back (held
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
        self.keys_changed(moved, now_ms);
    }

    // ---- reads ----

    /// `LOCK.FENCE key [token]`: the holder's fencing token (only if it is
    /// `token`, when given), or None when the lock is free or ended.
    pub fn fence_of(
        &self,
        store: &impl LockRead,
        token: Option<&[u8]>,
        now_ms: i64,
    ) -> Option<i64> {
        lock::fence(store, token, now_ms)
    }

    /// `LOCK.EXEC key token [FENCE fence]`: the grant's fence if `token`
    /// holds the key's lock now (with exactly `fence`, when given), or why
    /// not. Reads only: an ended lease is the sweep's and the timer's to
    /// reclaim, so the guarded command changes nothing but its own effect.
    /// A replica refuses (also with `replica-read-only no`): its copy of
    /// the lease is its master's as last replicated, and a write there
    /// would be the replica's alone.
    pub fn check_holder(
        &self,
        store: &impl LockRead,
        token: &[u8],
        fence: Option<i64>,
        cond: Conditions,
        now_ms: i64,
    ) -> Result<i64, LockError> {
        refuse_on_replica(cond)?;
        let why = match lock::holders(store).find(|l| l.token == token) {
            None if lock::is_held(store, now_ms) => NotHeld::OtherToken,
            None => NotHeld::Free,
            Some(l) if !l.is_live(now_ms) => NotHeld::Ended,
            Some(l) => match fence {
                Some(given) if given != l.fence => NotHeld::OtherGrant {
                    held: l.fence,
                    given,
                },
                _ => return Ok(l.fence),
            },
        };
        Err(LockError::NotHeld(why))
    }

    /// `LOCK.FENCED gate fence`: the gate's new mark if `fence` passes its
    /// current `mark` (None: no gate yet), or why not. A gate's marks are
    /// not the node's: they come from whatever issued the fence (a Redlock
    /// group, another node), so they do not raise the node's mark.
    /// Gates are kept like locks: not on a replica, not where
    /// maxmemory-policy may evict them, and no new one above maxmemory.
    /// A clock fence issued before the node last loaded its data or was
    /// promoted is refused by every gate ([`guarded::pass`]).
    pub fn pass_gate(
        &self,
        mark: Option<i64>,
        fence: i64,
        cond: Conditions,
        now_us: i64,
    ) -> Result<i64, LockError> {
        guarded::check_gate_fence(fence, now_us)?;
        refuse_on_replica(cond)?;
        // Raising a gate's mark takes no memory; a new gate does.
        match mark {
            None => self.limits.check_can_keep_new(cond)?,
            Some(_) => self.limits.check_not_evictable(cond)?,
        }
        guarded::pass(mark, fence, self.gate_floor)
    }

    /// `LOCK.INFO key`: what is held now, or None when nobody holds it.
    pub fn info<'s>(&self, key: &K, store: &'s impl LockRead, now_ms: i64) -> Option<Held<'s>> {
        let live: Vec<Lock<'s>> = lock::holders(store).filter(|l| l.is_live(now_ms)).collect();
        let newest = (0..live.len()).max_by_key(|&i| live[i].fence)?;
        Some(Held {
            mode: store.mode().unwrap_or(Mode::Exclusive),
            live,
            newest,
            waiters: self.waiters.waiting_on(key),
        })
    }

    // ---- locks from outside: the master, the AOF, an RDB, RESTORE ----

    /// `LOCK._SET key token fence deadline-ms granted-ms` from the master or
    /// the AOF: the fence is checked and raises the mark in one step (a
    /// refused one changes nothing), then the lock is stored as given, its
    /// wall-clock times on this node's monotonic clock, the lease capped as
    /// every lease entering the node is ([`time::local_times`]).
    pub fn apply_set(
        &mut self,
        store: &mut impl LockStore,
        token: &[u8],
        fence: i64,
        wall_deadline_ms: i64,
        wall_granted_ms: i64,
        now: Now,
    ) -> Result<(), LockError> {
        self.fences.observe(fence, now.wall_us)?;
        let (deadline_ms, granted_ms) = self.local_times(wall_deadline_ms, wall_granted_ms, now);
        let lease = self.next_lease();
        let lock = Lock {
            fence,
            deadline_ms,
            token,
            granted_ms,
            lease,
        };
        store.put(Mode::Exclusive, lock);
        Ok(())
    }

    /// `LOCK._SHARED key limit token fence deadline-ms granted-ms ...` from
    /// the master or the AOF: a shared key, whole. Every fence is checked
    /// first and the mark raised to the highest (a refused one changes
    /// nothing), then the key is stored as given, each holder's times on
    /// this node's monotonic clock.
    pub fn apply_shared(
        &mut self,
        store: &mut impl LockStore,
        mode: Mode,
        holders: &[args::SetArgs<'_>],
        now: Now,
    ) -> Result<(), LockError> {
        for h in holders {
            self.fences.check(h.fence, now.wall_us)?;
        }
        let highest = holders
            .iter()
            .map(|h| h.fence)
            .max()
            .ok_or(LockError::Internal)?;
        self.fences.observe(highest, now.wall_us)?;
        for (i, h) in holders.iter().enumerate() {
            let (deadline_ms, granted_ms) = self.local_times(h.deadline_ms, h.granted_ms, now);
            let lock = Lock {
                fence: h.fence,
                deadline_ms,
                token: h.token,
                granted_ms,
                lease: self.next_lease(),
            };
            match i {
                0 => store.put(mode, lock),
                _ => store.add(lock),
            }
        }
        Ok(())
    }

    /// `LOCK._HOLD key limit token fence deadline-ms granted-ms` from the
    /// master or the AOF: one holder of a shared key, added or renewed (a
    /// key absent here, or in another mode, is made anew with it). The
    /// fence is checked and raises the mark first (a refused one changes
    /// nothing); times as for [`apply_set`](Self::apply_set).
    pub fn apply_hold(
        &mut self,
        store: &mut impl LockStore,
        mode: Mode,
        holder: &args::SetArgs<'_>,
        now: Now,
    ) -> Result<(), LockError> {
        if !mode.is_shared() {
            return Err(LockError::BadInternalArgument("limit"));
        }
        self.fences.observe(holder.fence, now.wall_us)?;
        let (deadline_ms, granted_ms) =
            self.local_times(holder.deadline_ms, holder.granted_ms, now);
        let lock = Lock {
            fence: holder.fence,
            deadline_ms,
            token: holder.token,
            granted_ms,
            lease: self.next_lease(),
        };
        match store.mode() {
            Some(held) if held == mode => store.add(lock),
            _ => store.put(mode, lock),
        }
        Ok(())
    }

    /// `LOCK._DROP key token` from the master or the AOF: that holder of a
    /// shared key is gone (the key with its last holder).
    pub fn apply_drop(&mut self, store: &mut impl LockStore, token: &[u8]) {
        store.remove(token);
    }

    /// Whether a decoded value's fence may be loaded now: within the bounds
    /// of the mark and the clock, and for a `RESTORE` (`restoring`), of the
    /// clock alone too (nothing changes).
    pub fn check_loaded_fence(
        &self,
        fence: i64,
        restoring: bool,
        wall_us: i64,
    ) -> Result<(), LockError> {
        self.fences.check(fence, wall_us)?;
        if restoring {
            codec::check_restored_fence(fence, wall_us)?;
        }
        Ok(())
    }

    /// A value decoded whole from an RDB or a `RESTORE` payload is taken,
    /// all its holders (`fence`, wall-clock deadline, wall-clock grant
    /// time) in one step: every fence is checked first, then a RESTOREd
    /// value raises the mark with its highest (an RDB's mark comes in its
    /// aux field), and each holder's times come back on this node's
    /// monotonic clock, capped as every lease entering the node is, with a
    /// lease id. An Err (the fence refused, and why) changes nothing:
    /// refuse the value.
    pub fn accept_value(
        &mut self,
        holders: &[(i64, i64, i64)],
        restoring: bool,
        now: Now,
    ) -> Result<Vec<Loaded>, (i64, LockError)> {
        for &(fence, _, _) in holders {
            self.check_loaded_fence(fence, restoring, now.wall_us)
                .map_err(|e| (fence, e))?;
        }
        if restoring {
            if let Some(highest) = holders.iter().map(|h| h.0).max() {
                self.fences
                    .observe(highest, now.wall_us)
                    .map_err(|e| (highest, e))?;
            }
        }
        Ok(holders
            .iter()
            .map(|&(_, wall_deadline_ms, wall_granted_ms)| {
                let (deadline_ms, granted_ms) =
                    self.local_times(wall_deadline_ms, wall_granted_ms, now);
                Loaded {
                    deadline_ms,
                    granted_ms,
                    lease: self.next_lease(),
                }
            })
            .collect())
    }

    /// A lease id for a lock that enters the node.
    fn next_lease(&mut self) -> u64 {
        self.leases += 1;
        self.leases
    }

    /// `store` seen by the state machine: its changes become outputs.
    fn ledger<'a, S: LockStore>(
        &'a mut self,
        key: &'a K,
        store: &'a mut S,
        now_ms: i64,
    ) -> Recorder<'a, S, K, C> {
        Recorder {
            store,
            key,
            out: &mut self.outputs,
            leases: &mut self.leases,
            now_ms,
        }
    }

    /// Written-out times on this node's clock under its `lock.max-ttl-ms`.
    fn local_times(
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

fn acts_alone(cond: Conditions) -> bool {
    !cond.intersects(Conditions::REPLICA | Conditions::WRITES_PAUSED)
}

/// An ACQUIRE's (or ACQUIREALL's) MINFENCE n (0: none) within its bound.
#[inline]
fn check_requested_min_fence(min_fence: i64, now: Now) -> Result<(), LockError> {
    if min_fence > 0 && fence::check_min_fence(min_fence, now.wall_us).is_err() {
        return Err(LockError::MinFenceTooLarge(format!("'{min_fence}'")));
    }
    Ok(())
}

/// Whether a request fits every one of its keys (see [`fit_all`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AllFit {
    /// The token holds every key under one grant: this fence.
    Renews(i64),
    /// A new holder fits every key.
    Fits,
    /// Not now.
    Busy,
}

/// `token` asking for every key of `stores` in `mode` (`LOCK.ACQUIREALL`):
/// each key as [`lock::fit`] decides it, the first error (in the order the
/// keys were named) refusing the whole. A key the token holds apart from
/// the others (another grant's fence, or only some of the keys) is busy
/// for it until that lease ends. `busy(i, until)` hears of each key `i`
/// that does not fit and when to look at it again.
fn fit_all<S: LockRead>(
    stores: &[S],
    token: &[u8],
    mode: Mode,
    rules: lock::Rules,
    now_ms: i64,
    mut busy: impl FnMut(usize, i64),
) -> Result<AllFit, LockError> {
    // One key (every ACQUIRE and one-key waiter): its fit is the answer,
    // with nothing to collect.
    if let [store] = stores {
        return Ok(match lock::fit(store, token, mode, rules, now_ms)? {
            Fit::Fits => AllFit::Fits,
            Fit::Busy(until) => {
                busy(0, until);
                AllFit::Busy
            }
            Fit::Renews => match lock::holder_of(store, token, now_ms) {
                Some(own) => AllFit::Renews(own.fence),
                None => return Err(LockError::Internal),
            },
        });
    }
    let mut fits = Vec::with_capacity(stores.len());
    for store in stores {
        fits.push(lock::fit(store, token, mode, rules, now_ms)?);
    }
    let own = |s: &S| lock::holder_of(s, token, now_ms).map(|l| (l.fence, l.deadline_ms));
    if let Some((fence, _)) = stores.first().and_then(own) {
        let one_grant = stores
            .iter()
            .zip(&fits)
            .all(|(s, fit)| *fit == Fit::Renews && own(s).is_some_and(|(f, _)| f == fence));
        if one_grant {
            return Ok(AllFit::Renews(fence));
        }
    }
    let mut all_fit = true;
    for (i, (store, fit)) in stores.iter().zip(&fits).enumerate() {
        let until = match fit {
            Fit::Fits => continue,
            Fit::Busy(until) => *until,
            Fit::Renews => own(store).map_or(now_ms, |(_, deadline_ms)| deadline_ms),
        };
        all_fit = false;
        busy(i, until);
    }
    Ok(match all_fit {
        true => AllFit::Fits,
        false => AllFit::Busy,
    })
}

/// A replica never changes a lock on its own (also with `replica-read-only
/// no`): its master's effects are its only writes.
fn refuse_on_replica(cond: Conditions) -> Result<(), LockError> {
    if cond.contains(Conditions::REPLICA) {
        return Err(LockError::ReadOnlyReplica);
    }
    Ok(())
}

/// Whether a wake is a grant (new, or a renewal of the waiter's own token).
pub fn is_grant<K, C>(wake: &Wake<K, C>) -> bool {
    matches!(wake.outcome, Outcome::Granted { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::tests::MemStore;

    type N = Node<&'static str, u32>;
    const T0: i64 = 1_700_000_000_000;

    fn now(ms: i64) -> Now {
        Now::same(ms * 1000)
    }

    fn req(token: &[u8], ttl_ms: i64, block_ms: Option<i64>) -> AcquireRequest<'_> {
        AcquireRequest {
            token,
            mode: Mode::Exclusive,
            ttl_ms,
            block_ms,
            min_fence: 0,
        }
    }

    const BLOCKING: Conditions = Conditions::MAY_BLOCK;

    type Out = Output<&'static str, u32>;

    /// Everything the node queued since the last drain.
    fn outputs(node: &mut N) -> Vec<Out> {
        std::iter::from_fn(|| node.poll_output()).collect()
    }

    /// The waiters to answer among `outputs`.
    fn wakes_in(outputs: &[Out]) -> Vec<Wake<&'static str, u32>> {
        outputs
            .iter()
            .filter_map(|o| match o {
                Output::Wake(w) => Some((**w).clone()),
                _ => None,
            })
            .collect()
    }

    /// The waiters to answer, drained with everything else queued.
    fn wakes(node: &mut N) -> Vec<Wake<&'static str, u32>> {
        wakes_in(&outputs(node))
    }

    /// Whether `outputs` report a take-back of `key` (a release by the timer).
    fn took_back(outputs: &[Out], key: &'static str) -> bool {
        outputs.contains(&Output::Count(Stat::TakeBack))
            && outputs.contains(&Output::Event(key, Event::Release))
    }

    fn wait(node: &mut N, store: &mut MemStore, client: u32, r: AcquireRequest<'_>, now_ms: i64) {
        match node.acquire(&"k", Ok(store), r, BLOCKING, &mut AdmitAll, now(now_ms)) {
            Ok(Acquire::Wait(ticket)) => node.enqueue(ticket, client).unwrap(),
            other => panic!("expected to wait, got {other:?}"),
        }
    }

    /// The tests' one key, served here or not.
    struct OneKey<'a> {
        store: &'a mut MemStore,
        served: Served,
    }

    impl Keyspace<&'static str, u32> for OneKey<'_> {
        type Store = MemStore;
        type Admit = AdmitAll;
        fn with_key<R>(
            &mut self,
            _key: &&'static str,
            f: impl FnOnce(Result<&mut MemStore, LockError>, Served, &mut AdmitAll) -> R,
        ) -> R {
            f(Ok(self.store), self.served.clone(), &mut AdmitAll)
        }

        fn with_keys<R>(
            &mut self,
            _keys: &[&'static str],
            _f: impl FnOnce(Result<&mut [MemStore], LockError>, Served, &mut [AdmitAll]) -> R,
        ) -> R {
            unreachable!("one key, no multi-key waiters")
        }
    }

    /// A timer run over the one key, with the server's `cond`.
    fn run_timer(node: &mut N, store: &mut MemStore, cond: Conditions, now_ms: i64) {
        let mut keys = OneKey {
            store,
            served: Served::Here,
        };
        node.run_timer(&mut keys, cond, now(now_ms))
    }

    fn tick(node: &mut N, store: &mut MemStore, now_ms: i64) {
        run_timer(node, store, Conditions::empty(), now_ms);
    }

    /// `(client, granted)` of each waiter answered.
    fn answered(woken: &[Wake<&'static str, u32>]) -> Vec<(u32, bool)> {
        woken.iter().map(|w| (w.client, is_grant(w))).collect()
    }

    fn hold(node: &mut N, store: &mut MemStore, token: &[u8], mode: Mode, ttl_ms: i64, at_ms: i64) {
        let r = AcquireRequest {
            mode,
            ..req(token, ttl_ms, None)
        };
        let got = node.acquire(&"k", Ok(store), r, BLOCKING, &mut AdmitAll, now(at_ms));
        assert!(matches!(got, Ok(Acquire::Granted(_))), "{got:?}");
    }

    fn release(node: &mut N, store: &mut MemStore, token: &[u8], at_ms: i64) {
        let cond = Conditions::empty();
        let got = node.release(&"k", Ok(store), token, cond, &mut AdmitAll, now(at_ms));
        assert_eq!(got, Ok(true));
    }

    #[test]
    fn the_lock_goes_to_the_first_in_line_when_its_lease_ends() {
        let (mut node, mut store) = (N::default(), MemStore::default());
        hold(&mut node, &mut store, b"h", Mode::Exclusive, 100, T0);
        wait(&mut node, &mut store, 1, req(b"a", 1000, Some(0)), T0);
        wait(&mut node, &mut store, 2, req(b"b", 1000, Some(0)), T0);
        assert_eq!(node.next_wakeup(), Some(T0 + 100), "the lease's end");
        tick(&mut node, &mut store, T0 + 99);
        assert!(wakes(&mut node).is_empty());
        tick(&mut node, &mut store, T0 + 100);
        assert_eq!(answered(&wakes(&mut node)), vec![(1, true)]);
        assert_eq!(store.lock().unwrap().token, b"a");
        assert_eq!(node.next_wakeup(), Some(T0 + 1100), "a's lease end");
    }

    /// A waiter whose timeout comes in the millisecond the lock frees is
    /// answered timed out, never granted; the next in line gets the lock.
    #[test]
    fn a_waiter_is_never_granted_at_its_timeout() {
        let (mut node, mut store) = (N::default(), MemStore::default());
        hold(&mut node, &mut store, b"h", Mode::Exclusive, 100, T0);
        wait(&mut node, &mut store, 1, req(b"a", 1000, Some(100)), T0);
        wait(&mut node, &mut store, 2, req(b"b", 1000, Some(0)), T0);
        tick(&mut node, &mut store, T0 + 100);
        let woken = wakes(&mut node);
        assert_eq!(woken[0].outcome, Outcome::TimedOut);
        assert_eq!(answered(&woken), vec![(1, false), (2, true)]);
        tick(&mut node, &mut store, T0 + 200);
        assert!(wakes(&mut node).is_empty(), "answered once");
    }

    /// One line for every mode: readers at the head go together up to the
    /// limit; a writer waits for every holder, and readers behind it wait
    /// behind it (writers are not starved, readers are not either).
    #[test]
    fn one_line_serves_readers_together_and_a_writer_alone_in_arrival_order() {
        let shared = Mode::Shared { limit: Some(2) };
        let (mut node, mut store) = (N::default(), MemStore::default());
        hold(&mut node, &mut store, b"h", Mode::Exclusive, 100, T0);
        for (client, token, mode) in [
            (1, &b"r1"[..], shared),
            (2, b"r2", shared),
            (3, b"r3", shared),
            (4, b"w", Mode::Exclusive),
            (5, b"r5", shared),
        ] {
            let r = AcquireRequest {
                mode,
                ..req(token, 1000, Some(0))
            };
            wait(&mut node, &mut store, client, r, T0);
        }
        tick(&mut node, &mut store, T0 + 100);
        let two = answered(&wakes(&mut node));
        assert_eq!(
            two,
            vec![(1, true), (2, true)],
            "two readers at once: the limit"
        );
        assert_eq!(
            node.next_wakeup(),
            Some(T0 + 1100),
            "the first reader's end"
        );
        release(&mut node, &mut store, b"r1", T0 + 200);
        assert_eq!(answered(&wakes(&mut node)), vec![(3, true)]);
        release(&mut node, &mut store, b"r2", T0 + 300);
        assert!(wakes(&mut node).is_empty(), "r5 does not pass the writer");
        assert_eq!(node.next_wakeup(), Some(T0 + 1200), "r3's end");
        release(&mut node, &mut store, b"r3", T0 + 400);
        assert_eq!(answered(&wakes(&mut node)), vec![(4, true)]);
        assert_eq!(store.mode(), Some(Mode::Exclusive));
        release(&mut node, &mut store, b"w", T0 + 500);
        assert_eq!(answered(&wakes(&mut node)), vec![(5, true)]);
        assert_eq!(node.total_waiters(), 0);
    }

    /// A waiter that can never be served as it asked (another limit than
    /// the key's) is answered with why when its turn comes, and the line
    /// goes on.
    #[test]
    fn a_waiter_asking_another_limit_is_refused_at_its_turn_and_the_line_goes_on() {
        let (two, three) = (
            Mode::Shared { limit: Some(2) },
            Mode::Shared { limit: Some(3) },
        );
        let (mut node, mut store) = (N::default(), MemStore::default());
        hold(&mut node, &mut store, b"h", Mode::Exclusive, 100, T0);
        for (client, token, mode) in [(1, &b"x"[..], two), (2, b"y", three), (3, b"z", two)] {
            let r = AcquireRequest {
                mode,
                ..req(token, 1000, Some(0))
            };
            wait(&mut node, &mut store, client, r, T0);
        }
        release(&mut node, &mut store, b"h", T0 + 1);
        let woken = wakes(&mut node);
        assert_eq!(answered(&woken), vec![(1, true), (2, false), (3, true)]);
        let mismatch = LockError::LimitMismatch {
            held: Some(2),
            asked: Some(3),
        };
        assert_eq!(woken[1].outcome, Outcome::Failed(mismatch));
    }

    /// A waiter whose token came to hold the key while it waited (written
    /// from outside: a master's `LOCK._SET`, a `RESTORE`) is answered with
    /// a renewal: the same fence, no new grant.
    #[test]
    fn a_waiter_whose_token_holds_the_key_at_its_turn_is_renewed() {
        let (mut node, mut store) = (N::default(), MemStore::default());
        hold(&mut node, &mut store, b"h", Mode::Exclusive, 100, T0);
        wait(&mut node, &mut store, 1, req(b"a", 1000, Some(0)), T0);
        // The key now holds "a"'s lock, as a master's LOCK._SET writes it.
        let wall_deadline_ms = T0 + 500;
        node.apply_set(&mut store, b"a", 77, wall_deadline_ms, T0, now(T0 + 1))
            .unwrap();
        node.keys_changed(|_| true, T0 + 1);
        tick(&mut node, &mut store, T0 + 2);
        let woken = wakes(&mut node);
        assert!(
            matches!(
                woken[0].outcome,
                Outcome::Granted {
                    fence: 77,
                    renewed: true,
                    ..
                }
            ),
            "{woken:?}"
        );
    }

    #[test]
    fn a_paused_node_refuses_new_grants_and_lets_holders_renew() {
        let mut node = N::default();
        let mut store = MemStore::default();
        node.set_limits(
            Limits {
                restart_delay_ms: 500,
                ..Limits::default()
            },
            T0,
        );
        let got = node.acquire(
            &"k",
            Ok(&mut store),
            req(b"a", 100, None),
            Conditions::empty(),
            &mut AdmitAll,
            now(T0),
        );
        assert_eq!(
            got,
            Ok(Acquire::Granted(T0 * 1000)),
            "not serving yet: no delay"
        );
        node.start_serving(now(T0));
        let renew = node.acquire(
            &"k",
            Ok(&mut store),
            req(b"a", 100, None),
            Conditions::empty(),
            &mut AdmitAll,
            now(T0 + 1),
        );
        assert_eq!(renew, Ok(Acquire::Renewed(T0 * 1000)));
        assert_eq!(
            node.release(
                &"k",
                Ok(&mut store),
                b"a",
                Conditions::empty(),
                &mut AdmitAll,
                now(T0 + 2)
            ),
            Ok(true)
        );
        let paused = node.acquire(
            &"k",
            Ok(&mut store),
            req(b"b", 100, None),
            Conditions::empty(),
            &mut AdmitAll,
            now(T0 + 100),
        );
        assert_eq!(paused, Err(LockError::GrantsPaused(400)));
        assert!(store.lock().is_none());
    }

    /// Defect 1 of issue 15: lowering lock.restart-delay-ms while a client
    /// waits out the delay must serve it at once.
    #[test]
    fn lowering_the_restart_delay_serves_the_waiters_it_held() {
        let mut node = N::default();
        let mut store = MemStore::default();
        node.set_limits(
            Limits {
                restart_delay_ms: 20_000,
                ..Limits::default()
            },
            T0,
        );
        node.start_serving(now(T0));
        wait(&mut node, &mut store, 1, req(b"w", 5000, Some(5000)), T0);
        assert_eq!(
            node.next_wakeup(),
            Some(T0 + 5000),
            "its timeout comes first"
        );
        node.set_limits(Limits::default(), T0 + 300);
        assert_eq!(node.next_wakeup(), Some(T0 + 300));
        tick(&mut node, &mut store, T0 + 300);
        let woken = wakes(&mut node);
        assert_eq!(woken.len(), 1);
        assert!(is_grant(&woken[0]), "{woken:?}");
        assert_eq!(store.lock().unwrap().token, b"w");
    }

    /// Defect 2 of issue 15: a hand-off applies the max-ttl-ms in force
    /// when it grants; the waiter is told so instead of getting a lease
    /// the node no longer allows.
    #[test]
    fn a_hand_off_applies_the_limits_in_force_then() {
        let mut node = N::default();
        let mut store = MemStore::default();
        node.acquire(
            &"k",
            Ok(&mut store),
            req(b"h", 300, None),
            BLOCKING,
            &mut AdmitAll,
            now(T0),
        )
        .unwrap();
        wait(&mut node, &mut store, 1, req(b"w", 600_000, Some(5000)), T0);
        wait(&mut node, &mut store, 2, req(b"v", 500, Some(5000)), T0);
        node.set_limits(
            Limits {
                max_ttl_ms: 1000,
                ..Limits::default()
            },
            T0 + 10,
        );
        tick(&mut node, &mut store, T0 + 10);
        assert!(wakes(&mut node).is_empty(), "still held");
        tick(&mut node, &mut store, T0 + 300);
        let woken = wakes(&mut node);
        assert_eq!(woken.len(), 2);
        assert_eq!(woken[0].client, 1);
        assert_eq!(
            woken[0].outcome,
            Outcome::Failed(LockError::TtlTooLarge("'600000'".into(), 1000))
        );
        assert!(is_grant(&woken[1]));
        assert_eq!(store.lock().unwrap().deadline_ms, T0 + 800);
    }

    #[test]
    fn a_waiter_whose_user_lost_the_command_is_refused_and_skipped() {
        let mut node = N::default();
        let mut store = MemStore::default();
        node.acquire(
            &"k",
            Ok(&mut store),
            req(b"h", 100, None),
            BLOCKING,
            &mut AdmitAll,
            now(T0),
        )
        .unwrap();
        wait(&mut node, &mut store, 1, req(b"a", 100, Some(0)), T0);
        wait(&mut node, &mut store, 2, req(b"b", 100, Some(0)), T0);
        let released = node.release(
            &"k",
            Ok(&mut store),
            b"h",
            Conditions::empty(),
            &mut |c: u32| c != 1,
            now(T0 + 5),
        );
        assert_eq!(released, Ok(true));
        let woken = wakes(&mut node);
        assert_eq!(woken[0].outcome, Outcome::Failed(LockError::NoPermission));
        assert!(is_grant(&woken[1]));
        assert_eq!(store.lock().unwrap().token, b"b");
    }

    #[test]
    fn an_undelivered_grant_is_taken_back_and_handed_on() {
        let mut node = N::default();
        let mut store = MemStore::default();
        node.acquire(
            &"k",
            Ok(&mut store),
            req(b"h", 100, None),
            BLOCKING,
            &mut AdmitAll,
            now(T0),
        )
        .unwrap();
        wait(&mut node, &mut store, 1, req(b"a", 100, Some(0)), T0);
        wait(&mut node, &mut store, 2, req(b"b", 100, Some(0)), T0);
        node.release(
            &"k",
            Ok(&mut store),
            b"h",
            Conditions::empty(),
            &mut AdmitAll,
            now(T0 + 1),
        )
        .unwrap();
        let Outcome::Granted { fence, lease, .. } = wakes(&mut node)[0].outcome.clone() else {
            panic!()
        };
        node.undelivered("k", fence, lease, T0 + 1);
        // While writes are paused it waits; on the next run it goes.
        run_timer(&mut node, &mut store, Conditions::WRITES_PAUSED, T0 + 1);
        assert_eq!(outputs(&mut node), []);
        assert_eq!(store.lock().unwrap().token, b"a", "still granted");
        assert_eq!(node.next_wakeup(), Some(T0 + 1 + RETRY_MS));
        run_timer(&mut node, &mut store, Conditions::empty(), T0 + 11);
        let out = outputs(&mut node);
        assert!(took_back(&out, "k"), "{out:?}");
        let woken = wakes_in(&out);
        assert_eq!((woken.len(), woken[0].client), (1, 2));
        assert_eq!(store.lock().unwrap().token, b"b");
    }

    /// Keys by name, all served here.
    #[derive(Default)]
    struct Keys(std::collections::HashMap<&'static str, MemStore>);

    impl Keyspace<&'static str, u32> for Keys {
        type Store = MemStore;
        type Admit = AdmitAll;
        fn with_key<R>(
            &mut self,
            key: &&'static str,
            f: impl FnOnce(Result<&mut MemStore, LockError>, Served, &mut AdmitAll) -> R,
        ) -> R {
            f(
                Ok(self.0.entry(*key).or_default()),
                Served::Here,
                &mut AdmitAll,
            )
        }

        fn with_keys<R>(
            &mut self,
            keys: &[&'static str],
            f: impl FnOnce(Result<&mut [MemStore], LockError>, Served, &mut [AdmitAll]) -> R,
        ) -> R {
            let mut stores: Vec<MemStore> = keys
                .iter()
                .map(|k| self.0.remove(k).unwrap_or_default())
                .collect();
            let mut admits: Vec<AdmitAll> = keys.iter().map(|_| AdmitAll).collect();
            let out = f(Ok(&mut stores), Served::Here, &mut admits);
            for (k, s) in keys.iter().zip(stores) {
                self.0.insert(k, s);
            }
            out
        }
    }

    /// Keys that came due at different times during a pause are all handed
    /// on at the first timer run after it: one retry instant, not one per
    /// key (which would hand each on up to RETRY_MS apart after the pause).
    #[test]
    fn what_a_pause_held_back_goes_on_at_one_run() {
        // Two keys whose leases end during a pause, at T0 + 5 and T0 + 8.
        let paused_node = || {
            let mut node = N::default();
            let mut keys = Keys::default();
            for (key, ttl) in [("a", 5), ("b", 8)] {
                let store = keys.0.entry(key).or_default();
                let held = node.acquire(
                    &key,
                    Ok(store),
                    req(b"h", ttl, None),
                    BLOCKING,
                    &mut AdmitAll,
                    now(T0),
                );
                assert!(matches!(held, Ok(Acquire::Granted(_))));
                let wait = node.acquire(
                    &key,
                    Ok(store),
                    req(b"w", 100, Some(0)),
                    BLOCKING,
                    &mut AdmitAll,
                    now(T0),
                );
                let Ok(Acquire::Wait(ticket)) = wait else {
                    panic!("{wait:?}")
                };
                node.enqueue(ticket, if key == "a" { 1 } else { 2 })
                    .unwrap();
            }
            let paused = Conditions::WRITES_PAUSED;
            assert_eq!(node.next_wakeup(), Some(T0 + 5));
            node.run_timer(&mut keys, paused, now(T0 + 5));
            assert_eq!(node.next_wakeup(), Some(T0 + 8));
            node.run_timer(&mut keys, paused, now(T0 + 8));
            assert_eq!(node.next_wakeup(), Some(T0 + 5 + RETRY_MS), "one instant");
            assert!(wakes(&mut node).is_empty());
            (node, keys)
        };
        // The pause ended: the run at the retry instant hands both on, and
        // so does any earlier run that acts alone (woken by something
        // else): the hold is over.
        for resumed_at in [T0 + 5 + RETRY_MS, T0 + 9] {
            let (mut node, mut keys) = paused_node();
            node.run_timer(&mut keys, Conditions::empty(), now(resumed_at));
            let mut woken: Vec<u32> = wakes(&mut node).iter().map(|w| w.client).collect();
            woken.sort();
            assert_eq!(woken, [1, 2], "resumed at T0 + {}", resumed_at - T0);
            assert_eq!(node.next_wakeup(), None);
        }
    }

    #[test]
    fn a_replica_hands_nothing_on_and_drops_take_backs() {
        let mut node = N::default();
        let mut store = MemStore::default();
        node.acquire(
            &"k",
            Ok(&mut store),
            req(b"h", 100, None),
            BLOCKING,
            &mut AdmitAll,
            now(T0),
        )
        .unwrap();
        wait(&mut node, &mut store, 1, req(b"a", 100, Some(50)), T0);
        node.undelivered("k", 1, 1, T0);
        run_timer(&mut node, &mut store, Conditions::REPLICA, T0 + 100);
        assert_eq!(store.lock().unwrap().token, b"h", "nothing handed on");
        let out = outputs(&mut node);
        assert!(!took_back(&out, "k"));
        let woken = wakes_in(&out);
        assert_eq!(woken[0].outcome, Outcome::TimedOut, "timeouts still run");
        assert_eq!(node.next_wakeup(), None, "take-back dropped");
        let refused = node.acquire(
            &"k",
            Ok(&mut store),
            req(b"x", 100, None),
            Conditions::REPLICA,
            &mut AdmitAll,
            now(T0),
        );
        assert_eq!(refused, Err(LockError::ReadOnlyReplica));
    }

    #[test]
    fn a_key_that_left_the_node_redirects_its_line() {
        let mut node = N::default();
        let mut store = MemStore::default();
        node.acquire(
            &"k",
            Ok(&mut store),
            req(b"h", 100, None),
            BLOCKING,
            &mut AdmitAll,
            now(T0),
        )
        .unwrap();
        wait(&mut node, &mut store, 1, req(b"a", 100, Some(0)), T0);
        store.clear();
        node.keys_changed(|_| true, T0 + 1);
        let mut keys = OneKey {
            store: &mut store,
            served: Served::Elsewhere("ASK 1 127.0.0.1:7001".into()),
        };
        node.run_timer(&mut keys, Conditions::empty(), now(T0 + 1));
        let woken = wakes(&mut node);
        assert_eq!(
            woken[0].outcome,
            Outcome::Failed(LockError::Redirect("ASK 1 127.0.0.1:7001".into()))
        );
        assert!(
            store.lock().is_none(),
            "no lock granted for a key given away"
        );
    }

    #[test]
    fn full_lines_refuse_before_anyone_blocks() {
        let mut node = N::default();
        let mut store = MemStore::default();
        node.set_limits(
            Limits {
                max_waiters_per_key: 1,
                ..Limits::default()
            },
            T0,
        );
        node.acquire(
            &"k",
            Ok(&mut store),
            req(b"h", 100, None),
            BLOCKING,
            &mut AdmitAll,
            now(T0),
        )
        .unwrap();
        wait(&mut node, &mut store, 1, req(b"a", 100, Some(0)), T0);
        let full = node.acquire(
            &"k",
            Ok(&mut store),
            req(b"b", 100, Some(0)),
            BLOCKING,
            &mut AdmitAll,
            now(T0),
        );
        assert_eq!(full, Err(LockError::TooManyWaiters(1)));
        let not_blocking = node.acquire(
            &"k",
            Ok(&mut store),
            req(b"b", 100, Some(0)),
            Conditions::empty(),
            &mut AdmitAll,
            now(T0),
        );
        assert_eq!(not_blocking, Ok(Acquire::Contended), "MULTI: nil at once");
    }

    #[test]
    fn eviction_unsafe_servers_refuse_new_locks_and_hand_offs_but_not_renewals() {
        let mut node = N::default();
        let mut store = MemStore::default();
        node.acquire(
            &"k",
            Ok(&mut store),
            req(b"h", 100, None),
            BLOCKING,
            &mut AdmitAll,
            now(T0),
        )
        .unwrap();
        wait(&mut node, &mut store, 1, req(b"a", 100, Some(0)), T0);
        let evictable = Conditions::EVICTABLE | Conditions::MAY_BLOCK;
        let renew = node.acquire(
            &"k",
            Ok(&mut store),
            req(b"h", 100, None),
            evictable,
            &mut AdmitAll,
            now(T0 + 1),
        );
        assert_eq!(renew, Ok(Acquire::Renewed(T0 * 1000)));
        node.release(
            &"k",
            Ok(&mut store),
            b"h",
            evictable,
            &mut AdmitAll,
            now(T0 + 2),
        )
        .unwrap();
        let woken = wakes(&mut node);
        assert_eq!(woken[0].outcome, Outcome::Failed(LockError::EvictionUnsafe));
        assert!(store.lock().is_none());
        let fresh = node.acquire(
            &"k",
            Ok(&mut store),
            req(b"x", 100, None),
            evictable,
            &mut AdmitAll,
            now(T0 + 3),
        );
        assert_eq!(fresh, Err(LockError::EvictionUnsafe));
    }

    /// Issue 22: a holder's same-token ACQUIRE (the safe retry) renews
    /// whatever lock.max-token-len became since its grant; new holders, in
    /// line or not, are held to it.
    #[test]
    fn a_holder_retries_after_the_token_limit_was_lowered() {
        let mut node = N::default();
        let mut store = MemStore::default();
        let long = b"a-rather-long-token";
        let got = node.acquire(
            &"k",
            Ok(&mut store),
            req(long, 100, None),
            BLOCKING,
            &mut AdmitAll,
            now(T0),
        );
        assert_eq!(got, Ok(Acquire::Granted(T0 * 1000)));
        node.set_limits(
            Limits {
                max_token_len: 4,
                ..Limits::default()
            },
            T0,
        );
        let retry = node.acquire(
            &"k",
            Ok(&mut store),
            req(long, 100, None),
            BLOCKING,
            &mut AdmitAll,
            now(T0 + 1),
        );
        assert_eq!(retry, Ok(Acquire::Renewed(T0 * 1000)));
        let line = node.acquire(
            &"k",
            Ok(&mut store),
            req(b"12345", 100, Some(0)),
            BLOCKING,
            &mut AdmitAll,
            now(T0 + 2),
        );
        assert_eq!(line, Err(LockError::TokenOverLimit(5, 4)));
    }

    /// Issue 22: above maxmemory a hand-off is refused as a new grant is.
    #[test]
    fn a_hand_off_above_maxmemory_fails_the_waiter_with_oom() {
        let mut node = N::default();
        let mut store = MemStore::default();
        node.acquire(
            &"k",
            Ok(&mut store),
            req(b"h", 100, None),
            BLOCKING,
            &mut AdmitAll,
            now(T0),
        )
        .unwrap();
        wait(&mut node, &mut store, 1, req(b"a", 100, Some(0)), T0);
        let oom = Conditions::OOM;
        let released = node.release(&"k", Ok(&mut store), b"h", oom, &mut AdmitAll, now(T0 + 1));
        assert_eq!(released, Ok(true));
        let woken = wakes(&mut node);
        assert_eq!(woken[0].outcome, Outcome::Failed(LockError::OutOfMemory));
        assert!(store.lock().is_none());
    }

    /// A store that panics on the n-th write: a decision cut short.
    struct PanickingStore {
        inner: MemStore,
        writes_left: u32,
    }

    impl PanickingStore {
        fn write(&mut self) {
            if self.writes_left == 0 {
                panic!("injected: the store failed mid-decision");
            }
            self.writes_left -= 1;
        }
    }

    impl LockRead for PanickingStore {
        fn mode(&self) -> Option<Mode> {
            self.inner.mode()
        }
        fn holder_at(&self, i: usize) -> Option<Lock<'_>> {
            self.inner.holder_at(i)
        }
    }

    impl LockStore for PanickingStore {
        fn put(&mut self, mode: Mode, lock: Lock<'_>) {
            self.write();
            LockStore::put(&mut self.inner, mode, lock)
        }
        fn add(&mut self, lock: Lock<'_>) {
            self.write();
            LockStore::add(&mut self.inner, lock)
        }
        fn renew(&mut self, token: &[u8], deadline_ms: i64, lease: u64) {
            self.write();
            LockStore::renew(&mut self.inner, token, deadline_ms, lease)
        }
        fn set_mode(&mut self, mode: Mode) {
            self.write();
            LockStore::set_mode(&mut self.inner, mode)
        }
        fn remove(&mut self, token: &[u8]) {
            self.write();
            LockStore::remove(&mut self.inner, token)
        }
    }

    /// Issue 22: a panic inside a decision (here: the hand-off's write,
    /// after the release's) leaves no barging and no stranded waiter once
    /// the glue recovered as it does (`recover_from_panic`, then the timer).
    #[test]
    fn a_panic_inside_a_hand_off_strands_no_waiter_and_lets_nobody_barge() {
        for writes_before_panic in 0..3 {
            let mut node = N::default();
            let mut store = PanickingStore {
                inner: MemStore::default(),
                writes_left: u32::MAX,
            };
            node.acquire(
                &"k",
                Ok(&mut store),
                req(b"h", 100, None),
                BLOCKING,
                &mut AdmitAll,
                now(T0),
            )
            .unwrap();
            match node.acquire(
                &"k",
                Ok(&mut store),
                req(b"w", 100, Some(0)),
                BLOCKING,
                &mut AdmitAll,
                now(T0),
            ) {
                Ok(Acquire::Wait(ticket)) => node.enqueue(ticket, 1).unwrap(),
                other => panic!("expected to wait, got {other:?}"),
            }
            store.writes_left = writes_before_panic;
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                node.release(
                    &"k",
                    Ok(&mut store),
                    b"h",
                    Conditions::empty(),
                    &mut AdmitAll,
                    now(T0 + 1),
                )
            }));
            store.writes_left = u32::MAX;
            let handed = wakes(&mut node);
            if caught.is_ok() {
                // The hand-off went through before the injected failure.
                assert!(
                    handed.iter().any(is_grant),
                    "{writes_before_panic}: {handed:?}"
                );
                continue;
            }
            node.recover_from_panic(T0 + 1);
            // Before the timer runs: a plain ACQUIRE does not barge past
            // the line, whatever the lock's state was left in.
            let barge = node.acquire(
                &"k",
                Ok(&mut store),
                req(b"x", 100, None),
                Conditions::empty(),
                &mut AdmitAll,
                now(T0 + 1),
            );
            assert_eq!(barge, Ok(Acquire::Contended), "{writes_before_panic}");
            // The timer runs when the node asks, and the waiter is served
            // once the lock is free (at once, or at the holder's lease end
            // when the release never happened): never left waiting.
            let mut all = handed;
            all.extend(wakes(&mut node));
            while !all.iter().any(|w| w.client == 1) {
                let due = node
                    .next_wakeup()
                    .expect("the waiter has a timer run coming");
                assert!(
                    due <= T0 + 100,
                    "{writes_before_panic}: stranded until {due}"
                );
                tick(&mut node, &mut store.inner, due);
                all.extend(wakes(&mut node));
            }
            assert!(all.iter().any(|w| w.client == 1 && is_grant(w)), "{all:?}");
            assert_eq!(store.inner.lock().unwrap().token, b"w");
        }
    }

    /// Issue 22: a lock from outside is checked and observed in one step;
    /// a refused one changes nothing (the store and the mark), an accepted
    /// one raises the mark and is capped at this node's max-ttl.
    #[test]
    fn a_lock_from_outside_is_taken_whole_or_not_at_all() {
        let mut node = N::default();
        node.set_limits(
            Limits {
                max_ttl_ms: 1_000,
                ..Limits::default()
            },
            T0,
        );
        let mut store = MemStore::default();
        let at = now(T0);
        let too_far = T0 * 1000 + crate::limits::MAX_FENCE_LEAD + 10;
        let refused = node.apply_set(&mut store, b"t", too_far, T0 + 60_000, T0, at);
        assert!(refused.is_err());
        assert!(store.lock().is_none(), "nothing stored");
        assert_eq!(node.fence_hwm(), 0, "the mark did not move");
        assert!(node
            .accept_value(&[(too_far, T0 + 60_000, T0)], true, at)
            .is_err());
        assert_eq!(node.fence_hwm(), 0);
        // One refused holder refuses the value whole: the mark stays.
        let ok = T0 * 1000 + 1;
        let two = [(ok, T0 + 60_000, T0), (too_far, T0 + 60_000, T0)];
        assert_eq!(node.accept_value(&two, true, at).unwrap_err().0, too_far);
        assert_eq!(node.fence_hwm(), 0);

        let fence = T0 * 1000 + 5;
        node.apply_set(&mut store, b"t", fence, T0 + 60_000, T0, at)
            .unwrap();
        assert_eq!(node.fence_hwm(), fence);
        let held = store.lock().unwrap();
        assert_eq!(held.deadline_ms, T0 + 1_000, "capped at max-ttl");
        assert_eq!(node.fence_of(&store, Some(b"t"), T0 + 1), Some(fence));
        assert_eq!(node.fence_of(&store, Some(b"x"), T0 + 1), None);
        assert_eq!(
            node.info(&"k", &store, T0 + 1).map(|h| (
                h.live[h.newest].fence,
                h.live.len(),
                h.waiters
            )),
            Some((fence, 1, 0))
        );
        // A RESTORE raises the mark; an RDB value leaves it to the aux field.
        let loaded = node
            .accept_value(&[(fence + 10, T0 + 500, 0)], false, at)
            .unwrap()[0];
        assert_eq!((loaded.deadline_ms, node.fence_hwm()), (T0 + 500, fence));
        let restored = node
            .accept_value(
                &[(fence + 10, T0 + 500, 0), (fence + 20, T0 + 500, 0)],
                true,
                at,
            )
            .unwrap();
        assert_eq!(node.fence_hwm(), fence + 20, "raised to the highest");
        assert!(restored[0].lease > loaded.lease, "a new lease id each");
        assert!(restored[1].lease > restored[0].lease);
    }
}
