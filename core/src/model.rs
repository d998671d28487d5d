//! Model check of the production [`Node`]: random histories over three keys
//! drive the same `Node` the Redis glue drives (the harness plays the glue:
//! it opens a key as a [`MemStore`], passes the server's conditions in and
//! runs the timer only when the node asks), and a deliberately simple
//! reference model side by side, which settles every key on every tick.
//! After every step both must agree on every reply, every wake, every
//! holder and mode of every key, and the fence mark; and whole-history
//! properties must hold: no more holders than the key's mode allows (one
//! when exclusive), fences strictly increasing and never shared by two
//! holders, a
//! waiter answered exactly once and granted only its own key, in FIFO order,
//! never at or after its timeout, and no waiter left in line while its lock
//! is free and grants are allowed.
//!
//! The history covers shared holders (`SHARED`, with and without `LIMIT`:
//! readers together, a writer alone, one FIFO line for both, downgrades,
//! refused upgrades and limits, a lower `lock.max-holders-per-key`),
//! LOCK.ACQUIREALL (all keys or none, and with BLOCK a
//! waiter standing in several lines at once, granted every key with one
//! fence), MINFENCE, restart-delay and its runtime changes, a
//! lower max-ttl-ms, max-token-len or max-waiters-per-key while clients
//! wait, memory above
//! maxmemory and an evicting policy (new holders refused, hand-offs
//! included, renewals not), take-back of an undelivered grant,
//! ACL denial at hand-off, WRONGTYPE, SWAPDB, replica demotion and
//! promotion, CLIENT PAUSE WRITE (timeouts answered, nothing handed on or
//! taken back until the node's first timer run after it, within
//! `RETRY_MS`), and a key that leaves the node (cluster redirect). The
//! harness runs the production timer sequence (`Node::run_timer`) and the
//! keys it took back are checked against the reference's.
//!
//! Client handles come from a small pool and are reused as soon as their
//! waiter is answered or leaves: the node must not depend on the glue's
//! never reusing one (the glue's ids are never reused; Redis's handle
//! addresses, which it once used, are).
//! 20,000 cases by default (seconds in release, as `make test` runs it);
//! `PROPTEST_CASES` sets another count (`make stress` runs 300,000).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;

use super::error::{LockError, NotHeld};
use super::limits::CLOCK_FENCES_FROM;
use super::lock::tests::{MemStore, Stored};
use super::lock::{self, Mode};
use super::node::gate::tests::MemGate;
use super::node::{
    Acquire, AcquireRequest, Admission, Conditions, Keyspace, Limits, Node, Served, RETRY_MS,
};
use super::output::{Event, Output, Stat};
use super::time::Now;
use super::waiters::{Outcome, Wake};

const KEYS: u8 = 3;
const CLIENTS: u8 = 6;
/// Fence gates, the node's keys from `GATE0` on (apart from the locks').
const GATES: u8 = 2;
const GATE0: u8 = 100;
const T0_MS: i64 = 1_700_000_000_000;
/// The two values `lock.max-ttl-ms` takes in a history.
const MAX_TTL: [i64; 2] = [1000, 15];
/// The two values `lock.restart-delay-ms` takes.
const DELAY: [i64; 2] = [0, 30];
/// The two values `lock.max-token-len` takes (tokens are 1 or 2 bytes).
const MAX_TOKEN: [usize; 2] = [512, 1];
/// The two values `lock.lock-delay-ms` takes.
const LOCK_DELAY: [i64; 2] = [0, 40];
/// The two values `lock.max-waiters-per-key` takes (six clients: the
/// default never fills a line, 2 often does).
const MAX_LINE: [usize; 2] = [10_000, 2];
/// The two values `lock.max-holders-per-key` takes (four tokens: the
/// default never fills a shared key, 2 often does).
const MAX_HOLDERS: [usize; 2] = [10_000, 2];
/// The modes an ACQUIRE asks for: exclusive half the time, else SHARED
/// without LIMIT, LIMIT 1 or LIMIT 2.
const MODES: [Mode; 6] = [
    Mode::Exclusive,
    Mode::Exclusive,
    Mode::Exclusive,
    Mode::Shared { limit: None },
    Mode::Shared { limit: Some(1) },
    Mode::Shared { limit: Some(2) },
];

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        client: u8,
        key: u8,
        token: u8,
        /// An index of MODES: exclusive, or SHARED with or without LIMIT.
        mode: usize,
        ttl: i64,
        block: Option<i64>,
        /// MINFENCE as an offset from the node's mark (None: no MINFENCE).
        min_fence: Option<i8>,
    },
    Release {
        client: u8,
        key: u8,
        token: u8,
    },
    Extend {
        client: u8,
        key: u8,
        token: u8,
        ttl: i64,
    },
    /// DEL / UNLINK / FLUSHALL of one key: the lock is gone, waiters stay.
    Delete {
        key: u8,
    },
    /// SET key value: the key now holds another type.
    WrongType {
        key: u8,
    },
    /// SWAPDB: keys 0 and 1 trade places, with their lines.
    Swap,
    /// The key's store moved to another node (MIGRATE during resharding).
    Migrate {
        key: u8,
    },
    /// The client disconnects (or CLIENT UNBLOCK): it leaves its line.
    Disconnect {
        client: u8,
    },
    /// The client went away right after a hand-off granted it, before the
    /// reply was written: the grant is undelivered.
    Vanish {
        client: u8,
    },
    /// ACL SETUSER: the client's user loses `lock.acquire` (or the key).
    Deny {
        client: u8,
    },
    /// CONFIG SET lock.max-ttl-ms / lock.restart-delay-ms /
    /// lock.max-token-len / lock.max-waiters-per-key.
    Config {
        max_ttl: usize,
        delay: usize,
        max_token: usize,
        max_line: usize,
        /// `lock.lock-delay-ms`, as an index of LOCK_DELAY.
        lock_delay: usize,
        /// `lock.max-holders-per-key`, as an index of MAX_HOLDERS.
        max_holders: usize,
    },
    /// Used memory crosses maxmemory (OOM), or an `allkeys-*` policy is
    /// set or cleared (locks evictable), for every call from now on.
    Memory {
        oom: bool,
        evictable: bool,
    },
    /// REPLICAOF host port: waiters are disconnected, writes refused.
    Demote,
    /// REPLICAOF NO ONE (or a restart with its data): the node serves.
    Promote,
    /// CLIENT PAUSE WRITE (or a FAILOVER) begins or ends: clients' writes
    /// wait in Redis, and the node changes no lock on its own.
    PauseWrites {
        on: bool,
    },
    /// The background sweep visits a key: an ended lock is reclaimed.
    Sweep {
        key: u8,
    },
    /// The wall clock steps (NTP, `date -s`); the monotonic one does not.
    ClockStep {
        ms: i64,
    },
    Advance {
        ms: i64,
    },
    /// `LOCK.ACQUIREALL` of the keys in `keys` (a bit set, two keys or
    /// more), in ascending order or reversed.
    AcquireAll {
        client: u8,
        keys: u8,
        reversed: bool,
        token: u8,
        /// An index of MODES.
        mode: usize,
        ttl: i64,
        /// BLOCK timeout-ms (None: no BLOCK).
        block: Option<i64>,
        /// MINFENCE as an offset from the node's mark (None: no MINFENCE).
        min_fence: Option<i8>,
    },
    /// `LOCK.RELEASEALL` of the keys in `keys`.
    ReleaseAll {
        client: u8,
        keys: u8,
        token: u8,
    },
    /// `LOCK.EXEC key token [FENCE fence] ...`: the holder check alone (the
    /// inner command is the server's). `fence`: None without FENCE; the
    /// token's own fence (`true`) or one below it (`false`).
    Exec {
        key: u8,
        token: u8,
        fence: Option<bool>,
    },
    /// `LOCK.FENCED gate fence` (its command the server's): a fence chosen
    /// by `pick` among small ones, the mark and around it, and one issued
    /// before the node last started serving.
    Fenced {
        gate: u8,
        pick: u8,
    },
    /// DEL of a gate: its mark is gone (the floor still holds old fences
    /// back only from before the node last started serving).
    DeleteGate {
        gate: u8,
    },
}

/// The keys of a bit set, ascending (or reversed).
fn keys_of(set: u8, reversed: bool) -> Vec<u8> {
    let mut keys: Vec<u8> = (0..KEYS).filter(|k| set & (1 << k) != 0).collect();
    if reversed {
        keys.reverse();
    }
    keys
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..CLIENTS, 0..KEYS, 0..4u8, 0..MODES.len(), 1..40i64,
              prop::option::weighted(0.7, 0..30i64), prop::option::weighted(0.15, -3..4i8))
            .prop_map(|(client, key, token, mode, ttl, block, min_fence)|
                Op::Acquire { client, key, token, mode, ttl, block, min_fence }),
        4 => (0..CLIENTS, 0..KEYS, 0..4u8).prop_map(|(client, key, token)| Op::Release { client, key, token }),
        2 => (0..CLIENTS, 0..KEYS, 0..4u8, 1..40i64)
            .prop_map(|(client, key, token, ttl)| Op::Extend { client, key, token, ttl }),
        1 => (0..KEYS).prop_map(|key| Op::Delete { key }),
        1 => (0..KEYS).prop_map(|key| Op::WrongType { key }),
        1 => Just(Op::Swap),
        1 => (0..KEYS).prop_map(|key| Op::Migrate { key }),
        2 => (0..CLIENTS).prop_map(|client| Op::Disconnect { client }),
        2 => (0..CLIENTS).prop_map(|client| Op::Vanish { client }),
        1 => (0..CLIENTS).prop_map(|client| Op::Deny { client }),
        1 => (0..2usize, 0..2usize, 0..2usize)
            .prop_flat_map(|(max_ttl, delay, max_token)| (0..2usize, 0..2usize, 0..2usize).prop_map(
                move |(max_line, lock_delay, max_holders)|
                    Op::Config { max_ttl, delay, max_token, max_line, lock_delay, max_holders })),
        1 => prop_oneof![3 => Just((false, false)), 1 => Just((true, false)), 1 => Just((false, true))]
            .prop_map(|(oom, evictable)| Op::Memory { oom, evictable }),
        1 => Just(Op::Demote),
        1 => Just(Op::Promote),
        1 => any::<bool>().prop_map(|on| Op::PauseWrites { on }),
        2 => (0..KEYS).prop_map(|key| Op::Sweep { key }),
        1 => prop_oneof![Just(-3_600_000i64), Just(3_600_000i64), -50..50i64]
            .prop_map(|ms| Op::ClockStep { ms }),
        6 => (0..25i64).prop_map(|ms| Op::Advance { ms }),
        4 => (0..CLIENTS, prop_oneof![Just(3u8), Just(5u8), Just(6u8), Just(7u8)], any::<bool>(), 0..4u8,
              0..MODES.len(), 1..40i64, prop::option::weighted(0.6, 0..30i64), prop::option::weighted(0.2, -3..4i8))
            .prop_map(|(client, keys, reversed, token, mode, ttl, block, min_fence)|
                Op::AcquireAll { client, keys, reversed, token, mode, ttl, block, min_fence }),
        1 => (0..CLIENTS, prop_oneof![Just(3u8), Just(5u8), Just(6u8), Just(7u8)], 0..4u8)
            .prop_map(|(client, keys, token)| Op::ReleaseAll { client, keys, token }),
        2 => (0..KEYS, 0..4u8, prop::option::of(any::<bool>()))
            .prop_map(|(key, token, fence)| Op::Exec { key, token, fence }),
        3 => (0..GATES, 0..6u8).prop_map(|(gate, pick)| Op::Fenced { gate, pick }),
        1 => (0..GATES).prop_map(|gate| Op::DeleteGate { gate }),
    ]
}

/// Tokens 0 and 1 are one byte, 2 and 3 two (for `lock.max-token-len`).
fn token(t: u8) -> Vec<u8> {
    vec![b'a' + t; 1 + usize::from(t >= 2)]
}

/// What a command or a wake-up told a client, comparable across both sides.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Told {
    Fence(i64),
    /// `LOCK.FENCED` let its command run.
    Passed,
    /// `LOCK.EXEC` refused: the lock is free, or the token's lease ended
    /// (which of the two depends on whether the ended lease is still
    /// stored, the sweep's timing: not compared).
    FreeOrEnded,
    Nil,
    Blocked,
    Released(bool),
    Extended(bool),
    /// `LOCK.RELEASEALL`: how many keys it released.
    ReleasedAll(i64),
    Error(String),
}

fn error(e: LockError) -> Told {
    Told::Error(e.to_string())
}

// ---- the reference model: plain vectors, rules written out longhand ----

#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    token: Vec<u8>,
    fence: i64,
    deadline_ms: i64,
    lease: u64,
}

/// A key's lock: its mode and its holders (live or ended), in grant order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RefLock {
    mode: Mode,
    holders: Vec<Held>,
}

/// Whether a request fits a key now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefFit {
    Renews,
    Fits,
    Busy,
}

/// Whether a request fits every one of its keys now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AllFit {
    /// The token holds every key by one grant: its fence.
    Renews(i64),
    Fits,
    Busy,
}

#[derive(Debug, Clone)]
struct RefWaiter {
    /// Arrival order (a multi-key waiter stands in several lines).
    id: u64,
    /// Every key it waits for, in the order named (one for LOCK.ACQUIRE).
    keys: Vec<u8>,
    client: u8,
    token: Vec<u8>,
    mode: Mode,
    ttl: i64,
    min_fence: i64,
    timeout_at: Option<i64>,
}

#[derive(Default)]
struct Reference {
    hwm: i64,
    /// Each gate's mark (by gate number).
    gates: BTreeMap<u8, i64>,
    /// The node's first fence since it last started serving: clock fences
    /// below it pass no gate.
    gate_floor: i64,
    leases: u64,
    locks: BTreeMap<u8, RefLock>,
    lines: BTreeMap<u8, Vec<RefWaiter>>,
    max_ttl: i64,
    delay: i64,
    /// `lock.lock-delay-ms`.
    lock_delay: i64,
    serving_since: i64,
    replica: bool,
    wrongtype: BTreeSet<u8>,
    gone: BTreeSet<u8>,
    denied: BTreeSet<u8>,
    take_backs: Vec<(u8, i64, u64)>,
    /// The wall clock minus the monotonic one (ms): clock steps move it.
    wall_offset: i64,
    max_token_len: usize,
    /// `lock.max-waiters-per-key`.
    max_line: usize,
    /// `lock.max-holders-per-key`.
    max_holders: usize,
    oom: bool,
    evictable: bool,
    /// CLIENT PAUSE WRITE is in force.
    writes_paused: bool,
    /// New holders so far (grants and hand-offs, not renewals).
    grants: u64,
    /// A pause ended, and the node has not run its timer since: what it
    /// held back waits for that run (within `RETRY_MS`).
    resume_pending: bool,
    /// Waiters so far (their ids).
    arrivals: u64,
    /// Multi-key waiters a settle found first in a line, to look at.
    marked: BTreeSet<u64>,
}

impl Reference {
    /// Why a new holder (a grant or a place in line, not a renewal) is
    /// refused now, if it is.
    fn refuse_new_holder(&self, token: &[u8]) -> Option<LockError> {
        if token.len() > self.max_token_len {
            return Some(LockError::TokenOverLimit(token.len(), self.max_token_len));
        }
        if self.evictable {
            return Some(LockError::EvictionUnsafe);
        }
        self.oom.then_some(LockError::OutOfMemory)
    }

    fn holders(&self, key: u8) -> &[Held] {
        self.locks.get(&key).map_or(&[], |l| &l.holders[..])
    }

    /// `token`'s holder of `key`, while its lease runs.
    fn holder(&self, key: u8, token: &[u8], now: i64) -> Option<&Held> {
        self.holders(key)
            .iter()
            .find(|h| h.token == token && now < h.deadline_ms)
    }

    /// Someone holds `key` now.
    fn held(&self, key: u8, now: i64) -> bool {
        self.holders(key).iter().any(|h| now < h.deadline_ms)
    }

    /// `LOCK.EXEC key token [FENCE fence]`'s check: the token's live
    /// holder, with exactly that fence when given.
    fn exec(&self, key: u8, token: &[u8], fence: Option<i64>, now: i64) -> Told {
        if self.wrongtype.contains(&key) {
            return error(LockError::WrongType);
        }
        if self.replica {
            return error(LockError::ReadOnlyReplica);
        }
        match self.holder(key, token, now) {
            Some(h) => match fence {
                Some(given) if given != h.fence => error(LockError::NotHeld(NotHeld::OtherGrant {
                    held: h.fence,
                    given,
                })),
                _ => Told::Fence(h.fence),
            },
            None if self.held(key, now) => error(LockError::NotHeld(NotHeld::OtherToken)),
            None => Told::FreeOrEnded,
        }
    }

    /// `LOCK.FENCED gate fence`: the gate's rule, longhand.
    fn fenced(&mut self, gate: u8, fence: i64) -> Told {
        if self.replica {
            return error(LockError::ReadOnlyReplica);
        }
        let mark = self.gates.get(&gate).copied();
        if self.evictable {
            return error(LockError::EvictionUnsafe);
        }
        if mark.is_none() && self.oom {
            return error(LockError::OutOfMemory);
        }
        if fence >= CLOCK_FENCES_FROM && fence < self.gate_floor {
            let mark = mark.unwrap_or(0).max(self.gate_floor);
            return error(LockError::StaleFence { fence, mark });
        }
        if let Some(mark) = mark.filter(|&m| fence < m) {
            return error(LockError::StaleFence { fence, mark });
        }
        self.gates
            .insert(gate, mark.map_or(fence, |m| m.max(fence)));
        Told::Passed
    }

    /// Holders that keep `key`: live, or ended unreleased within the
    /// lock-delay.
    fn occupants(&self, key: u8, now: i64) -> usize {
        self.holders(key)
            .iter()
            .filter(|h| now < h.deadline_ms + self.lock_delay)
            .count()
    }

    /// Nobody holds `key`, but a lease that ended unreleased still holds
    /// it back (lock-delay).
    fn delayed(&self, key: u8, now: i64) -> bool {
        !self.held(key, now) && self.occupants(key, now) > 0
    }

    /// How many may hold a key in `mode` at once.
    fn capacity(&self, mode: Mode) -> usize {
        match mode {
            Mode::Exclusive => 1,
            Mode::Shared { limit: None } => self.max_holders,
            Mode::Shared { limit: Some(n) } => (n as usize).min(self.max_holders),
        }
    }

    /// Whether `token` asking for `key` in `mode` fits it now: its own
    /// holding renews (an exclusive holder asking SHARED downgrades); a
    /// shared holder asking exclusive, or another limit than the key's, is
    /// an error; readers share a key up to its capacity; anything else
    /// waits for the key to empty.
    fn fit(&self, key: u8, token: &[u8], mode: Mode, now: i64) -> Result<RefFit, LockError> {
        let occupants = self.occupants(key, now);
        let Some(lock) = self.locks.get(&key).filter(|_| occupants > 0) else {
            return Ok(RefFit::Fits);
        };
        let own = self.holder(key, token, now).is_some();
        match (lock.mode, mode) {
            (Mode::Exclusive, _) if own => Ok(RefFit::Renews),
            (Mode::Exclusive, _) => Ok(RefFit::Busy),
            (Mode::Shared { .. }, Mode::Exclusive) if own => Err(LockError::NoUpgrade),
            (Mode::Shared { .. }, Mode::Exclusive) => Ok(RefFit::Busy),
            (Mode::Shared { limit: held }, Mode::Shared { limit: asked }) if held != asked => {
                Err(LockError::LimitMismatch { held, asked })
            }
            _ if own => Ok(RefFit::Renews),
            _ if occupants < self.capacity(mode) => Ok(RefFit::Fits),
            _ => Ok(RefFit::Busy),
        }
    }

    /// Removes `token`'s holder of `key`; the key goes with its last.
    fn remove_holder(&mut self, key: u8, token: &[u8]) {
        if let Some(lock) = self.locks.get_mut(&key) {
            lock.holders.retain(|h| h.token != token);
            if lock.holders.is_empty() {
                self.locks.remove(&key);
            }
        }
    }

    /// A command that touches a key reclaims its holders whose lease and
    /// lock-delay have both passed (the node's release and extend do).
    fn reclaim_touched(&mut self, key: u8, now: i64) {
        let delay = self.lock_delay;
        if let Some(lock) = self.locks.get_mut(&key) {
            lock.holders.retain(|h| now < h.deadline_ms + delay);
            if lock.holders.is_empty() {
                self.locks.remove(&key);
            }
        }
    }

    fn paused(&self, now: i64) -> i64 {
        if self.delay == 0 {
            return 0;
        }
        (self.serving_since + self.delay - now).max(0)
    }

    fn fresh_fence(&mut self, min_fence: i64, now: i64) -> i64 {
        self.hwm = (self.hwm + 1)
            .max(min_fence)
            .max((now + self.wall_offset) * 1000);
        self.hwm
    }

    /// A holder's fence after a renewal asking MINFENCE `min_fence`: a
    /// raised holder gets one above the mark and MINFENCE, not moved to
    /// the clock; otherwise it keeps `held`.
    fn raised_fence(&mut self, min_fence: i64, held: i64) -> i64 {
        if min_fence <= held {
            return held;
        }
        self.hwm = (self.hwm + 1).max(min_fence);
        self.hwm
    }

    /// Why a waiter whose turn has come may not take its lock(s), if it
    /// may not: the limits now (unless it renews) and its ACL.
    fn refuse_turn(&self, w: &RefWaiter, renews: bool) -> Option<LockError> {
        if w.ttl > self.max_ttl {
            return Some(LockError::TtlTooLarge(format!("'{}'", w.ttl), self.max_ttl));
        }
        if let Some(err) = (!renews)
            .then(|| self.refuse_new_holder(&w.token))
            .flatten()
        {
            return Some(err);
        }
        self.denied
            .contains(&w.client)
            .then_some(LockError::NoPermission)
    }

    /// Grants or renews: the request fits the key (checked by the caller).
    fn grant(
        &mut self,
        key: u8,
        token: &[u8],
        mode: Mode,
        ttl: i64,
        min_fence: i64,
        now: i64,
    ) -> i64 {
        match self.holder(key, token, now).map(|h| h.fence) {
            Some(held) => {
                let fence = self.raised_fence(min_fence, held);
                self.renew_holder(key, token, mode, fence, ttl, now);
                fence
            }
            None => self.grant_all(&[key], token, mode, ttl, min_fence, now),
        }
    }

    /// `token`'s live holder of `key` gets a new lease and `fence`; asking
    /// SHARED of a key it holds exclusively downgrades it.
    fn renew_holder(&mut self, key: u8, token: &[u8], mode: Mode, fence: i64, ttl: i64, now: i64) {
        self.leases += 1;
        let lease = self.leases;
        let lock = self.locks.get_mut(&key).unwrap();
        if lock.mode == Mode::Exclusive && mode != Mode::Exclusive {
            lock.mode = mode; // a downgrade
        }
        let h = lock.holders.iter_mut().find(|h| h.token == token).unwrap();
        assert!(now < h.deadline_ms, "renewing an ended holder");
        h.fence = fence;
        h.deadline_ms = now + ttl;
        h.lease = lease;
    }

    /// A new holder of `key` (it fits): the only one, or one more reader,
    /// for whom holders past their lock-delay go first; the same token
    /// ended unreleased is granted again in its place.
    fn add_holder(&mut self, key: u8, token: &[u8], mode: Mode, fence: i64, ttl: i64, now: i64) {
        self.leases += 1;
        self.grants += 1;
        let h = Held {
            token: token.to_vec(),
            fence,
            deadline_ms: now + ttl,
            lease: self.leases,
        };
        if mode == Mode::Exclusive || self.occupants(key, now) == 0 {
            let holders = vec![h];
            self.locks.insert(key, RefLock { mode, holders });
            return;
        }
        self.reclaim_touched(key, now);
        let lock = self.locks.get_mut(&key).unwrap();
        match lock.holders.iter_mut().find(|x| x.token == token) {
            Some(x) => *x = h,
            None => lock.holders.push(h),
        }
    }

    /// Hands `key` on as far as it goes now.
    fn settle(&mut self, key: u8, now: i64, told: &mut Vec<(u8, Told)>) {
        if self.replica {
            return;
        }
        let fail_all = if self.gone.contains(&key) {
            Some(LockError::Redirect(redirect_of(key)))
        } else if self.wrongtype.contains(&key) {
            Some(LockError::WrongType)
        } else {
            None
        };
        loop {
            let Some(front) = self.lines.get(&key).and_then(|l| l.first()).cloned() else {
                return;
            };
            let answer = |this: &mut Self, told: &mut Vec<(u8, Told)>, t: Told| {
                this.remove_waiter(front.id);
                told.push((front.client, t));
            };
            if let Some(err) = &fail_all {
                answer(self, told, error(err.clone()));
                continue;
            }
            if front.timeout_at.is_some_and(|t| t <= now) {
                answer(self, told, Told::Nil);
                continue;
            }
            if front.keys.len() > 1 {
                self.marked.insert(front.id); // see settle_groups
                return;
            }
            let renews = match self.fit(key, &front.token, front.mode, now) {
                Err(err) => {
                    answer(self, told, error(err));
                    continue;
                }
                Ok(RefFit::Busy) => return,
                Ok(RefFit::Fits) if self.paused(now) > 0 => return,
                Ok(RefFit::Fits) => false,
                Ok(RefFit::Renews) => true,
            };
            if let Some(err) = self.refuse_turn(&front, renews) {
                answer(self, told, error(err));
                continue;
            }
            self.lines.get_mut(&key).unwrap().remove(0);
            let (token, mode) = (&front.token, front.mode);
            let fence = self.grant(key, token, mode, front.ttl, front.min_fence, now);
            told.push((front.client, Told::Fence(fence)));
        }
    }

    fn has_line(&self, key: u8) -> bool {
        self.lines.get(&key).is_some_and(|l| !l.is_empty())
    }

    fn remove_waiter(&mut self, id: u64) {
        self.marked.remove(&id);
        for line in self.lines.values_mut() {
            line.retain(|w| w.id != id);
        }
        self.lines.retain(|_, l| !l.is_empty());
    }

    fn first_everywhere(&self, w: &RefWaiter) -> bool {
        w.keys.iter().all(|k| {
            self.lines
                .get(k)
                .and_then(|l| l.first())
                .is_some_and(|f| f.id == w.id)
        })
    }

    /// `token` asking for every key of `keys` in `mode`: the first error in
    /// the order named; a renewal when it holds them all by one grant; a
    /// new holder when every key fits one; else busy (a key it holds apart
    /// from the others included).
    fn fit_all(
        &self,
        keys: &[u8],
        token: &[u8],
        mode: Mode,
        now: i64,
    ) -> Result<AllFit, LockError> {
        let fits = keys
            .iter()
            .map(|&k| self.fit(k, token, mode, now))
            .collect::<Result<Vec<_>, _>>()?;
        let fences: BTreeSet<Option<i64>> = keys
            .iter()
            .map(|&k| self.holder(k, token, now).map(|h| h.fence))
            .collect();
        if fits.iter().all(|f| *f == RefFit::Renews) && fences.len() == 1 {
            return Ok(AllFit::Renews(fences.into_iter().flatten().next().unwrap()));
        }
        Ok(match fits.iter().all(|f| *f == RefFit::Fits) {
            true => AllFit::Fits,
            false => AllFit::Busy,
        })
    }

    /// Every key of `keys` to `token` in `mode` with one fence (each fits).
    fn grant_all(
        &mut self,
        keys: &[u8],
        token: &[u8],
        mode: Mode,
        ttl: i64,
        min_fence: i64,
        now: i64,
    ) -> i64 {
        let fence = self.fresh_fence(min_fence, now);
        for &key in keys {
            self.add_holder(key, token, mode, fence, ttl, now);
        }
        fence
    }

    /// Renews every key `token` holds by the grant `fence` (raised above
    /// MINFENCE if asked; downgraded when it asks SHARED).
    #[allow(clippy::too_many_arguments)]
    fn renew_all(
        &mut self,
        keys: &[u8],
        token: &[u8],
        mode: Mode,
        fence: i64,
        ttl: i64,
        min_fence: i64,
        now: i64,
    ) -> i64 {
        let fence = self.raised_fence(min_fence, fence);
        for &key in keys {
            self.renew_holder(key, token, mode, fence, ttl, now);
        }
        fence
    }

    /// The marked multi-key waiters, in arrival order: one first in every
    /// line whose keys are all free for it (held by nobody else, not held
    /// back) is granted them all. Answering one marks the multi-key
    /// waiters that arrived after it and are now first where it was.
    fn settle_groups(&mut self, now: i64, told: &mut Vec<(u8, Told)>) {
        let mut work = std::mem::take(&mut self.marked);
        while let Some(id) = work.pop_first() {
            let Some(g) = self.lines.values().flatten().find(|w| w.id == id).cloned() else {
                continue;
            };
            if self.settle_group(&g, now, told) {
                for k in &g.keys {
                    let front = self.lines.get(k).and_then(|l| l.first());
                    if let Some(f) = front.filter(|f| f.keys.len() > 1 && f.id > id) {
                        work.insert(f.id);
                    }
                }
            }
        }
    }

    /// One multi-key waiter looked at; true if it was answered.
    fn settle_group(&mut self, g: &RefWaiter, now: i64, told: &mut Vec<(u8, Told)>) -> bool {
        let mut answer = |this: &mut Self, t: Told| {
            this.remove_waiter(g.id);
            told.push((g.client, t));
            true
        };
        if let Some(&k) = g.keys.iter().find(|k| self.gone.contains(k)) {
            return answer(self, error(LockError::Redirect(redirect_of(k))));
        }
        if g.keys.iter().any(|k| self.wrongtype.contains(k)) {
            return answer(self, error(LockError::WrongType));
        }
        if g.timeout_at.is_some_and(|t| t <= now) {
            return answer(self, Told::Nil);
        }
        if !self.first_everywhere(g) {
            return false;
        }
        let renews = match self.fit_all(&g.keys, &g.token, g.mode, now) {
            Err(err) => return answer(self, error(err)),
            Ok(AllFit::Busy) => return false,
            Ok(AllFit::Fits) if self.paused(now) > 0 => return false,
            Ok(AllFit::Fits) => None,
            Ok(AllFit::Renews(fence)) => Some(fence),
        };
        let refused = self.refuse_turn(g, renews.is_some());
        let (keys, token, mode) = (&g.keys, &g.token, g.mode);
        let t = match (refused, renews) {
            (Some(err), _) => error(err),
            (None, Some(fence)) => {
                Told::Fence(self.renew_all(keys, token, mode, fence, g.ttl, g.min_fence, now))
            }
            (None, None) => Told::Fence(self.grant_all(keys, token, mode, g.ttl, g.min_fence, now)),
        };
        answer(self, t)
    }

    /// The key's line has a multi-key waiter first that cannot be granted
    /// now (another of its keys is held, held back, or has others first).
    fn group_waits(&self, key: u8, now: i64) -> bool {
        let Some(g) = self.lines.get(&key).and_then(|l| l.first()) else {
            return false;
        };
        g.keys.len() > 1
            && (!self.first_everywhere(g)
                || !matches!(
                    self.fit_all(&g.keys, &g.token, g.mode, now),
                    Ok(AllFit::Fits | AllFit::Renews(_))
                ))
    }

    /// The timer at `now`: take-backs, timeouts, then every key; the keys
    /// taken back. `node_ran`: the node's timer ran now (after a pause,
    /// what it held back goes at that run).
    fn tick(&mut self, now: i64, node_ran: bool, told: &mut Vec<(u8, Told)>) -> Vec<u8> {
        if self.replica {
            self.take_backs.clear();
        }
        if node_ran {
            self.resume_pending = false;
        }
        let held_back = self.writes_paused || self.resume_pending;
        let mut taken_back = Vec::new();
        if !held_back {
            for (key, fence, lease) in std::mem::take(&mut self.take_backs) {
                let same = self
                    .holders(key)
                    .iter()
                    .find(|h| now < h.deadline_ms && h.fence == fence && h.lease == lease)
                    .map(|h| h.token.clone());
                if let Some(token) = same {
                    self.remove_holder(key, &token);
                    taken_back.push(key);
                }
            }
        }
        let mut timed_out: Vec<(u64, u8)> = self
            .lines
            .values()
            .flatten()
            .filter(|w| w.timeout_at.is_some_and(|t| t <= now))
            .map(|w| (w.id, w.client))
            .collect();
        timed_out.sort();
        timed_out.dedup();
        for (id, client) in timed_out {
            self.remove_waiter(id);
            told.push((client, Told::Nil));
        }
        if !held_back {
            // Until nothing more is answered (an answered multi-key waiter
            // lets the lines behind it move).
            loop {
                let before = told.len();
                for key in 0..KEYS {
                    self.settle(key, now, told);
                }
                self.settle_groups(now, told);
                if told.len() == before {
                    break;
                }
            }
        }
        taken_back
    }

    fn waiting(&self, client: u8) -> bool {
        self.lines.values().flatten().any(|w| w.client == client)
    }

    /// `told`: the waiters this command's key hands on to first. Usually
    /// none (the timer settled the key already), but a hand-off a write
    /// pause held back goes at the first command on its key after the
    /// pause, if that comes before the node's timer runs.
    fn acquire(
        &mut self,
        client: u8,
        key: u8,
        r: &Request,
        now: i64,
        told: &mut Vec<(u8, Told)>,
    ) -> Told {
        if self.replica {
            return error(LockError::ReadOnlyReplica);
        }
        let mut settled = Vec::new();
        self.settle(key, now, &mut settled);
        assert!(
            settled.is_empty() || self.resume_pending,
            "the timer settled this key already"
        );
        told.extend(settled);
        if self.wrongtype.contains(&key) {
            return error(LockError::WrongType);
        }
        // One key is the one-key case of ACQUIREALL, as in the node.
        self.acquire_all(client, &[key], r, now, told)
    }

    /// `LOCK.ACQUIREALL`: every key or none; with BLOCK, a place in every
    /// key's line.
    fn acquire_all(
        &mut self,
        client: u8,
        keys: &[u8],
        r: &Request,
        now: i64,
        told: &mut Vec<(u8, Told)>,
    ) -> Told {
        if self.replica {
            return error(LockError::ReadOnlyReplica);
        }
        for &key in keys {
            let mut settled = Vec::new();
            self.settle(key, now, &mut settled);
            assert!(
                settled.is_empty() || self.resume_pending,
                "the timer settled this key already"
            );
            told.extend(settled);
        }
        let fits = match self.fit_all(keys, &r.token, r.mode, now) {
            Err(err) => return error(err),
            Ok(AllFit::Renews(fence)) => {
                let (token, mode) = (&r.token, r.mode);
                return Told::Fence(self.renew_all(
                    keys,
                    token,
                    mode,
                    fence,
                    r.ttl,
                    r.min_fence,
                    now,
                ));
            }
            Ok(fits) => fits,
        };
        let busy = fits == AllFit::Busy || keys.iter().any(|&k| self.has_line(k));
        if busy && r.block.is_none() {
            return Told::Nil;
        }
        if let Some(err) = self.refuse_new_holder(&r.token) {
            return error(err);
        }
        if busy || self.paused(now) > 0 {
            return match r.block {
                Some(timeout) => self.enqueue(client, keys, r, timeout, now),
                None => error(LockError::GrantsPaused(self.paused(now))),
            };
        }
        Told::Fence(self.grant_all(keys, &r.token, r.mode, r.ttl, r.min_fence, now))
    }

    fn enqueue(&mut self, client: u8, keys: &[u8], r: &Request, timeout: i64, now: i64) -> Told {
        // A full line refuses; a lower limit leaves those already in line.
        if keys
            .iter()
            .any(|k| self.lines.get(k).map_or(0, Vec::len) >= self.max_line)
        {
            return error(LockError::TooManyWaiters(self.max_line as i64));
        }
        self.arrivals += 1;
        let w = RefWaiter {
            id: self.arrivals,
            keys: keys.to_vec(),
            client,
            token: r.token.clone(),
            mode: r.mode,
            ttl: r.ttl,
            min_fence: r.min_fence,
            timeout_at: (timeout > 0).then_some(now + timeout),
        };
        for &key in keys {
            self.lines.entry(key).or_default().push(w.clone());
        }
        Told::Blocked
    }
}

fn redirect_of(key: u8) -> String {
    format!("MOVED {key} 127.0.0.1:7001")
}

struct Request {
    token: Vec<u8>,
    mode: Mode,
    ttl: i64,
    block: Option<i64>,
    min_fence: i64,
}

// ---- the harness: the glue's part, over in-memory keys ----

struct Harness {
    node: Node<u8, u8>,
    stores: HashMap<u8, MemStore>,
    /// The gates, by the node's key (`GATE0 + gate`).
    gates: HashMap<u8, MemGate>,
    /// Each gate's mark as a replica has it (`Output::GateRaised`, or the
    /// DEL Redis replicates).
    replicated_gates: HashMap<u8, i64>,
    /// Each key as a replica has it: the lock the key held when the node
    /// last reported it changed (`Output::Changed`), or as Redis itself
    /// replicated a client's write (DEL, SET, SWAPDB, MIGRATE).
    replicated: HashMap<u8, Replicated>,
    /// `Stat::Grant`s counted so far.
    grants: u64,
    wrongtype: BTreeSet<u8>,
    gone: BTreeSet<u8>,
    denied: BTreeSet<u8>,
    replica: bool,
    /// The wall clock minus the monotonic one (ms): clock steps move it.
    wall_offset: i64,
    oom: bool,
    evictable: bool,
    writes_paused: bool,
}

impl Harness {
    /// Both clocks at monotonic ms `now`.
    fn at(&self, now: i64) -> Now {
        Now {
            mono_us: now * 1000,
            wall_us: (now + self.wall_offset) * 1000,
        }
    }

    fn cond(&self, may_block: bool) -> Conditions {
        let mut cond = Conditions::empty();
        cond.set(Conditions::REPLICA, self.replica);
        cond.set(Conditions::MAY_BLOCK, may_block);
        cond.set(Conditions::OOM, self.oom);
        cond.set(Conditions::EVICTABLE, self.evictable);
        cond
    }

    /// Opens `key` as the glue does: a shared lease counter, as the
    /// glue's is process-wide.
    fn with_store<R>(
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
    fn with_stores<R>(
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

    fn acquire(&mut self, client: u8, key: u8, r: &Request, now: i64) -> Told {
        let cond = self.cond(true);
        let at = self.at(now);
        let decided = self.with_store(key, |node, store, denied| {
            let req = AcquireRequest {
                token: &r.token,
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
                self.node.enqueue(ticket, client).unwrap();
                Told::Blocked
            }
            Err(e) => error(e),
        }
    }

    /// The module timer: runs only when the node asked for `now` or before,
    /// the production sequence ([`Node::run_timer`]) over the harness's
    /// keys. Whether it ran.
    fn timer(&mut self, now: i64) -> bool {
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
    fn drain(&mut self) -> Drained {
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
type Replicated = (Option<Mode>, Vec<Stored>);

fn copy_of(store: &MemStore) -> Replicated {
    (lock::LockRead::mode(store), store.holders.clone())
}

/// The counters and events of one drain, beside the waiters answered:
/// the glue counts and emits each, so each must say the same as the
/// others and as the outcomes.
#[derive(Default)]
struct Tally {
    grants: usize,
    releases: usize,
    extends: usize,
    expirations: usize,
    handoffs: usize,
    block_timeouts: usize,
    acquire_events: usize,
    extend_events: usize,
    handoff_events: Vec<u8>,
}

impl Tally {
    fn check(&self, d: &Drained) {
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
struct Drained {
    /// ACQUIREs answered nil.
    contended: usize,
    wakes: Vec<Wake<u8, u8>>,
    /// Keys reported released (LOCK.RELEASE, or a take-back).
    released: Vec<u8>,
    take_backs: usize,
    /// Keys reported expired (a lease reclaimed, or replaced by a grant).
    expired: Vec<u8>,
}

/// The harness's keys as a timer run opens them (as `Harness::with_store`).
struct ModelKeys<'a> {
    stores: &'a mut HashMap<u8, MemStore>,
    gates: &'a mut HashMap<u8, MemGate>,
    wrongtype: &'a BTreeSet<u8>,
    gone: &'a BTreeSet<u8>,
    denied: &'a BTreeSet<u8>,
}

/// A waiter may take its lock unless ACL SETUSER took it away.
struct NotDenied<'a>(&'a BTreeSet<u8>);

impl Admission<u8> for NotDenied<'_> {
    fn may_take(&mut self, client: u8) -> bool {
        !self.0.contains(&client)
    }
}

impl<'a> Keyspace<u8, u8> for ModelKeys<'a> {
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

fn told_of(wake: &Wake<u8, u8>) -> Told {
    match &wake.outcome {
        Outcome::Granted { fence, .. } => Told::Fence(*fence),
        Outcome::TimedOut => Told::Nil,
        Outcome::Failed(e) => error(e.clone()),
    }
}

/// The waits the history has open: client -> (keys, token, timeout_at).
type Asked = HashMap<u8, (Vec<u8>, Vec<u8>, Option<i64>)>;

/// The grants by hand-off that may still vanish: client -> (key, fence,
/// lease) of every key it was granted.
type Granted = HashMap<u8, Vec<(u8, i64, u64)>>;

/// Each wake answers a client that was waiting, once, on the key it asked
/// for; a grant is of a live lock it now holds, before its timeout, unless
/// the step was a RELEASE of that key with that same token (`released`),
/// which may hand the key on (a hand-off a write pause held back) and then
/// release what it handed on. Grants are remembered for `Vanish`.
fn check_wakes(
    h: &Harness,
    asked: &mut Asked,
    granted: &mut Granted,
    wakes: &[Wake<u8, u8>],
    now: i64,
    released: &[(u8, Vec<u8>)],
) {
    for wake in wakes {
        let (keys, token, timeout_at) = asked
            .remove(&wake.client)
            .expect("woken once, while waiting");
        assert_eq!(wake.key, keys[0], "granted only its own key");
        if let Outcome::Granted { fence, lease, .. } = wake.outcome {
            assert!(
                timeout_at.is_none_or(|t| now < t),
                "granted after its timeout"
            );
            let also: Vec<u8> = wake.also.iter().map(|(k, _)| *k).collect();
            assert_eq!(also, keys[1..], "granted every key it asked for");
            let leases = std::iter::once(lease).chain(wake.also.iter().map(|(_, l)| *l));
            let mut grants = Vec::new();
            for (&key, lease) in keys.iter().zip(leases) {
                grants.push((key, fence, lease));
                let held = h
                    .stores
                    .get(&key)
                    .and_then(|s| lock::holder_of(s, &token, now));
                if released.iter().any(|(k, t)| *k == key && t == &token) {
                    continue;
                }
                let held = held.expect("the granted lock is live when granted");
                // (A later waiter with the same token may have renewed it
                // since, with MINFENCE: a fresh, larger fence.)
                assert_eq!(held.token, &token[..]);
                assert!(held.fence >= fence);
            }
            granted.insert(wake.client, grants);
        }
    }
}

fn run(ops: &[Op]) {
    let mut now = T0_MS;
    let mut model = Reference {
        max_ttl: MAX_TTL[0],
        max_token_len: MAX_TOKEN[0],
        max_line: MAX_LINE[0],
        max_holders: MAX_HOLDERS[0],
        ..Reference::default()
    };
    let mut h = Harness {
        node: Node::default(),
        stores: HashMap::new(),
        gates: HashMap::new(),
        replicated_gates: HashMap::new(),
        replicated: HashMap::new(),
        grants: 0,
        wrongtype: BTreeSet::new(),
        gone: BTreeSet::new(),
        denied: BTreeSet::new(),
        replica: false,
        wall_offset: 0,
        oom: false,
        evictable: false,
        writes_paused: false,
    };
    let mut asked: Asked = HashMap::new();
    // client -> its last grant by hand-off, while it may still vanish.
    let mut granted: Granted = HashMap::new();
    // Every fence a lock has held, to check that none is ever reused.
    let mut fences_seen: BTreeSet<i64> = BTreeSet::new();
    // When the last pause of writes ended.
    let mut resumed_at = i64::MIN;
    // How many held each key after the last step.
    let mut holder_counts = [0usize; KEYS as usize];
    // The fence of each ACQUIREALL grant, and its keys.
    let mut multi_grants: HashMap<i64, Vec<u8>> = HashMap::new();

    for (step, op) in ops.iter().enumerate() {
        let hwm_before = h.node.fence_hwm();
        // Wakes of the timer runs inside an Advance.
        let mut tick_wakes: Vec<Wake<u8, u8>> = Vec::new();
        let mut model_told: Vec<(u8, Told)> = Vec::new();
        let mut replies: (Option<Told>, Option<Told>) = (None, None);
        let mut expected_expiry: Option<u8> = None;
        // A client that sends a command has its reply: it can no longer
        // vanish with an undelivered grant.
        // Clients' writes wait in Redis while writes are paused.
        let client_write = matches!(
            op,
            Op::Acquire { .. }
                | Op::AcquireAll { .. }
                | Op::ReleaseAll { .. }
                | Op::Release { .. }
                | Op::Extend { .. }
                | Op::Delete { .. }
                | Op::WrongType { .. }
                | Op::Swap
                | Op::Migrate { .. }
                | Op::Exec { .. }
                | Op::Fenced { .. }
                | Op::DeleteGate { .. }
        );
        if client_write && model.writes_paused {
            continue;
        }
        if let Op::Acquire { client, .. }
        | Op::Release { client, .. }
        | Op::Extend { client, .. }
        | Op::AcquireAll { client, .. }
        | Op::ReleaseAll { client, .. } = *op
        {
            if model.waiting(client) || model.denied.contains(&client) {
                continue; // a blocked client sends nothing; Redis refuses a denied one
            }
            granted.remove(&client);
        }
        match *op {
            Op::Acquire {
                client,
                key,
                token: t,
                mode,
                ttl,
                block,
                min_fence,
            } => {
                if model.gone.contains(&key) {
                    continue; // Redis redirects the command itself
                }
                let r = Request {
                    token: token(t),
                    mode: MODES[mode],
                    ttl,
                    block,
                    min_fence: min_fence.map_or(0, |d| (model.hwm + d as i64).max(1)),
                };
                if ttl > model.max_ttl {
                    // Refused by the parser, before the node is asked.
                    continue;
                }
                replies.0 = Some(model.acquire(client, key, &r, now, &mut model_told));
                let reply = h.acquire(client, key, &r, now);
                if reply == Told::Blocked {
                    asked.insert(
                        client,
                        (
                            vec![key],
                            r.token.clone(),
                            block.filter(|t| *t > 0).map(|t| now + t),
                        ),
                    );
                }
                replies.1 = Some(reply);
            }
            Op::AcquireAll {
                client,
                keys: set,
                reversed,
                token: t,
                mode,
                ttl,
                block,
                min_fence,
            } => {
                let mode = MODES[mode];
                let min_fence = min_fence.map_or(0, |d| (model.hwm + d as i64).max(1));
                let keys = keys_of(set, reversed);
                let unusable = keys
                    .iter()
                    .any(|k| model.gone.contains(k) || model.wrongtype.contains(k));
                if unusable || ttl > model.max_ttl {
                    continue;
                }
                let r = Request {
                    token: token(t),
                    mode,
                    ttl,
                    block,
                    min_fence,
                };
                replies.0 = Some(model.acquire_all(client, &keys, &r, now, &mut model_told));
                let cond = h.cond(block.is_some());
                let at = h.at(now);
                let out = h.with_stores(&keys, |node, stores, denied| {
                    let mut admits: Vec<_> =
                        keys.iter().map(|_| |c: u8| !denied.contains(&c)).collect();
                    let req = AcquireRequest {
                        token: &r.token,
                        mode,
                        ttl_ms: ttl,
                        block_ms: block,
                        min_fence,
                    };
                    node.acquire_all(&keys, Ok(stores), req, cond, &mut admits, at)
                });
                replies.1 = Some(match out {
                    Ok(Acquire::Granted(f) | Acquire::Renewed(f)) => {
                        multi_grants.entry(f).or_default().extend(&keys);
                        Told::Fence(f)
                    }
                    Ok(Acquire::Contended) => Told::Nil,
                    Ok(Acquire::Wait(ticket)) => {
                        h.node.enqueue(ticket, client).unwrap();
                        let timeout_at = block.filter(|t| *t > 0).map(|t| now + t);
                        asked.insert(client, (keys.clone(), r.token.clone(), timeout_at));
                        Told::Blocked
                    }
                    Err(e) => error(e),
                });
            }
            Op::ReleaseAll {
                keys: set,
                token: t,
                ..
            } => {
                let keys = keys_of(set, false);
                let unusable = keys
                    .iter()
                    .any(|k| model.gone.contains(k) || model.wrongtype.contains(k));
                if unusable {
                    continue;
                }
                let token = token(t);
                replies.0 = Some(if model.replica {
                    error(LockError::ReadOnlyReplica)
                } else {
                    let mut n = 0;
                    for &key in &keys {
                        model.settle(key, now, &mut model_told);
                        let released = model.holder(key, &token, now).is_some();
                        if released {
                            model.remove_holder(key, &token);
                            n += 1;
                        }
                        model.reclaim_touched(key, now);
                        model.settle(key, now, &mut model_told);
                    }
                    Told::ReleasedAll(n)
                });
                let cond = h.cond(false);
                let at = h.at(now);
                let out = h.with_stores(&keys, |node, stores, denied| {
                    let mut admits: Vec<_> =
                        keys.iter().map(|_| |c: u8| !denied.contains(&c)).collect();
                    node.release_all(&keys, stores, &token, cond, &mut admits, at)
                });
                replies.1 = Some(out.map_or_else(error, Told::ReleasedAll));
            }
            Op::Exec {
                key,
                token: t,
                fence,
            } => {
                if model.gone.contains(&key) {
                    continue; // Redis redirects the command itself
                }
                let token = token(t);
                let own = model
                    .holder(key, &token, now)
                    .map_or(model.hwm, |h| h.fence);
                let fence = fence.map(|right| if right { own } else { own - 1 });
                replies.0 = Some(model.exec(key, &token, fence, now));
                let cond = h.cond(false);
                let out = h.with_store(key, |node, store, _| {
                    store.and_then(|s| node.check_holder(&*s, &token, fence, cond, now))
                });
                // Free or ended: which of the two depends on whether the
                // ended lease is still stored (the sweep's timing); each
                // must agree with who holds the key now.
                let held = model.held(key, now);
                replies.1 = Some(match out {
                    Ok(f) => Told::Fence(f),
                    Err(LockError::NotHeld(NotHeld::Free)) => {
                        assert!(!held, "step {step}: EXEC says free, the key is held");
                        Told::FreeOrEnded
                    }
                    Err(LockError::NotHeld(NotHeld::Ended)) => match held {
                        true => error(LockError::NotHeld(NotHeld::OtherToken)),
                        false => Told::FreeOrEnded,
                    },
                    Err(e) => error(e),
                });
            }
            Op::Fenced { gate, pick } => {
                let fence = match pick {
                    0 => 1,
                    1 => 2,
                    2 => model.hwm,
                    3 => model.hwm - 1,
                    4 => model.hwm + 1,
                    _ => model.gate_floor - 1,
                }
                .max(1);
                replies.0 = Some(model.fenced(gate, fence));
                let key = GATE0 + gate;
                let cond = h.cond(false);
                let at = h.at(now);
                let store = h.gates.entry(key).or_default();
                let passed = h.node.pass_gate(&key, &*store, fence, cond, at.wall_us);
                replies.1 = Some(match passed {
                    Ok(()) => {
                        h.node.record_fence(&key, store, fence);
                        Told::Passed
                    }
                    Err(e) => error(e),
                });
            }
            Op::DeleteGate { gate } => {
                model.gates.remove(&gate);
                h.gates.remove(&(GATE0 + gate));
                h.replicated_gates.remove(&(GATE0 + gate));
            }
            Op::Release { key, token: t, .. } => {
                if model.gone.contains(&key) {
                    continue;
                }
                let token = token(t);
                replies.0 = Some(if model.replica {
                    error(LockError::ReadOnlyReplica)
                } else {
                    model.settle(key, now, &mut model_told);
                    if model.wrongtype.contains(&key) {
                        error(LockError::WrongType)
                    } else {
                        let released = model.holder(key, &token, now).is_some();
                        if released {
                            model.remove_holder(key, &token);
                        }
                        model.reclaim_touched(key, now);
                        model.settle(key, now, &mut model_told);
                        Told::Released(released)
                    }
                });
                let cond = h.cond(false);
                let at = h.at(now);
                let out = h.with_store(key, |node, store, denied| {
                    node.release(
                        &key,
                        store,
                        &token,
                        cond,
                        &mut |c: u8| !denied.contains(&c),
                        at,
                    )
                });
                replies.1 = Some(out.map_or_else(error, Told::Released));
            }
            Op::Extend {
                key, token: t, ttl, ..
            } => {
                if model.gone.contains(&key) || ttl > model.max_ttl {
                    continue;
                }
                let token = token(t);
                replies.0 = Some(if model.replica {
                    error(LockError::ReadOnlyReplica)
                } else {
                    model.settle(key, now, &mut model_told);
                    if model.wrongtype.contains(&key) {
                        error(LockError::WrongType)
                    } else {
                        let held = model.holder(key, &token, now).is_some();
                        if held {
                            model.leases += 1;
                            let lease = model.leases;
                            let lock = model.locks.get_mut(&key).unwrap();
                            let l = lock.holders.iter_mut().find(|h| h.token == token).unwrap();
                            l.deadline_ms = now + ttl;
                            l.lease = lease;
                        }
                        model.reclaim_touched(key, now);
                        model.settle(key, now, &mut model_told);
                        Told::Extended(held)
                    }
                });
                let cond = h.cond(false);
                let at = h.at(now);
                let out = h.with_store(key, |node, store, denied| {
                    node.extend(
                        &key,
                        store,
                        &token,
                        ttl,
                        cond,
                        &mut |c: u8| !denied.contains(&c),
                        at,
                    )
                });
                replies.1 = Some(out.map_or_else(error, Told::Extended));
            }
            Op::Delete { key } => {
                if model.gone.contains(&key) || model.replica {
                    continue;
                }
                model.locks.remove(&key);
                model.wrongtype.remove(&key);
                h.wrongtype.remove(&key);
                h.stores.remove(&key);
                h.replicated.remove(&key);
                // unlink2 queues a check for the next timer run.
                h.node.keys_changed(|k| *k == key, now);
            }
            Op::WrongType { key } => {
                if model.gone.contains(&key) || model.replica {
                    continue;
                }
                model.locks.remove(&key);
                model.wrongtype.insert(key);
                h.wrongtype.insert(key);
                h.stores.remove(&key);
                h.replicated.remove(&key);
                h.node.keys_changed(|k| *k == key, now);
            }
            Op::Swap => {
                if !model.gone.is_empty() || model.replica {
                    continue; // no SWAPDB in a cluster; a replica's master swaps
                }
                let swap = |k: &u8| match *k {
                    0 => 1,
                    1 => 0,
                    k => k,
                };
                let (l0, l1) = (model.locks.remove(&0), model.locks.remove(&1));
                l1.map(|l| model.locks.insert(0, l));
                l0.map(|l| model.locks.insert(1, l));
                let (w0, w1) = (model.lines.remove(&0), model.lines.remove(&1));
                w1.map(|l| model.lines.insert(0, l));
                w0.map(|l| model.lines.insert(1, l));
                for w in model.lines.values_mut().flatten() {
                    w.keys = w.keys.iter().map(swap).collect();
                }
                for set in [&mut model.wrongtype, &mut h.wrongtype] {
                    *set = set.iter().map(swap).collect();
                }
                let (s0, s1) = (h.stores.remove(&0), h.stores.remove(&1));
                s1.map(|s| h.stores.insert(0, s));
                s0.map(|s| h.stores.insert(1, s));
                let (r0, r1) = (h.replicated.remove(&0), h.replicated.remove(&1));
                r1.map(|r| h.replicated.insert(0, r));
                r0.map(|r| h.replicated.insert(1, r));
                for (keys, _, _) in asked.values_mut() {
                    *keys = keys.iter().map(swap).collect();
                }
                for (key, _, _) in granted.values_mut().flatten() {
                    *key = swap(key);
                }
                for (key, _, _) in &mut model.take_backs {
                    *key = swap(key);
                }
                h.node.rename_keys(swap, |k| *k < 2, now);
                holder_counts.swap(0, 1);
            }
            Op::Migrate { key } => {
                if model.replica {
                    continue;
                }
                model.locks.remove(&key);
                model.wrongtype.remove(&key);
                model.gone.insert(key);
                h.wrongtype.remove(&key);
                h.gone.insert(key);
                h.stores.remove(&key);
                h.replicated.remove(&key);
                h.node.keys_changed(|k| *k == key, now);
            }
            Op::Disconnect { client } => {
                for line in model.lines.values_mut() {
                    line.retain(|w| w.client != client);
                }
                let left = h.node.leave(client, now);
                assert_eq!(left, asked.remove(&client).is_some());
                granted.remove(&client);
            }
            Op::Vanish { client } => {
                let Some(grants) = granted.remove(&client) else {
                    continue;
                };
                for (key, fence, lease) in grants {
                    model.take_backs.push((key, fence, lease));
                    h.node.undelivered(key, fence, lease, now);
                }
            }
            Op::Deny { client } => {
                model.denied.insert(client);
                h.denied.insert(client);
            }
            Op::Config {
                max_ttl,
                delay,
                max_token,
                max_line,
                lock_delay,
                max_holders,
            } => {
                model.lock_delay = LOCK_DELAY[lock_delay];
                model.max_ttl = MAX_TTL[max_ttl];
                model.delay = DELAY[delay];
                model.max_token_len = MAX_TOKEN[max_token];
                model.max_line = MAX_LINE[max_line];
                model.max_holders = MAX_HOLDERS[max_holders];
                let limits = Limits {
                    max_ttl_ms: MAX_TTL[max_ttl],
                    restart_delay_ms: DELAY[delay],
                    max_token_len: MAX_TOKEN[max_token],
                    max_waiters_per_key: MAX_LINE[max_line],
                    lock_delay_ms: LOCK_DELAY[lock_delay],
                    max_holders_per_key: MAX_HOLDERS[max_holders],
                    ..Limits::default()
                };
                h.node.set_limits(limits, now);
            }
            Op::Memory { oom, evictable } => {
                (model.oom, model.evictable) = (oom, evictable);
                (h.oom, h.evictable) = (oom, evictable);
            }
            Op::Demote => {
                if model.replica {
                    continue;
                }
                model.replica = true;
                h.replica = true;
                // Redis answers every waiter itself (-UNBLOCKED); the
                // module only learns that each one left.
                let mut model_left: Vec<u8> = std::mem::take(&mut model.lines)
                    .into_values()
                    .flatten()
                    .map(|w| w.client)
                    .collect();
                let mut engine_left: Vec<u8> = asked.drain().map(|(client, _)| client).collect();
                for client in &engine_left {
                    assert!(
                        h.node.leave(*client, now),
                        "step {step}: a waiter leaves on demotion"
                    );
                }
                model_left.sort();
                model_left.dedup(); // a multi-key waiter is in several lines
                engine_left.sort();
                assert_eq!(
                    model_left, engine_left,
                    "step {step}: the lines on demotion"
                );
            }
            Op::Promote => {
                if !model.replica {
                    continue;
                }
                model.replica = false;
                model.serving_since = now;
                model.hwm = model.hwm.max((now + model.wall_offset) * 1000);
                model.gate_floor = model.hwm + 1;
                h.replica = false;
                let at = h.at(now);
                h.node.start_serving(at);
            }
            Op::PauseWrites { on } => {
                if on == model.writes_paused {
                    continue;
                }
                model.writes_paused = on;
                h.writes_paused = on;
                if !on {
                    model.resume_pending = true;
                    resumed_at = now;
                }
            }
            Op::Sweep { key } => {
                let acts_alone = !model.replica && !model.writes_paused;
                let delay = model.lock_delay;
                let ended = model
                    .holders(key)
                    .iter()
                    .any(|h| now >= h.deadline_ms + delay);
                if ended && acts_alone {
                    model.reclaim_touched(key, now);
                    // A lock it reclaims, it hands on: usually the timer
                    // did already, but not a hand-off a write pause held
                    // back, before the node's first run after it.
                    model.settle(key, now, &mut model_told);
                }
                // The sweep runs with the timer's conditions.
                let mut cond = h.cond(false);
                cond.set(Conditions::WRITES_PAUSED, h.writes_paused);
                let at = h.at(now);
                let reclaimed = h.with_store(key, |node, store, denied| {
                    let admit = &mut |c: u8| !denied.contains(&c);
                    store.is_ok_and(|s| {
                        let delay = node.limits().lock_delay_ms;
                        let ended = lock::holders(s).any(|l| now >= l.grants_held_until(delay));
                        let reclaimed = node.reclaim(&key, s, cond, admit, at);
                        assert_eq!(reclaimed, ended && acts_alone);
                        reclaimed
                    })
                });
                // Reported as an expiration when the outputs are drained.
                expected_expiry = reclaimed.then_some(key);
            }
            Op::ClockStep { ms } => {
                // Leases, timeouts and the restart delay do not move;
                // fences still rise (max(mark + 1, wall clock)).
                model.wall_offset += ms;
                h.wall_offset += ms;
            }
            Op::Advance { ms } => {
                for _ in 0..ms {
                    now += 1;
                    let mut model_tick = Vec::new();
                    let ran = h.timer(now);
                    let taken = model.tick(now, ran, &mut model_tick);
                    let d = h.drain();
                    assert_eq!(d.released, taken, "step {step}: taken back");
                    assert_eq!(d.take_backs, taken.len(), "step {step}: take-backs counted");
                    let wakes = d.wakes;
                    compare(step, op, model_tick, &wakes);
                    check_wakes(&h, &mut asked, &mut granted, &wakes, now, &[]);
                    tick_wakes.extend(wakes);
                }
            }
        }
        // The timer also runs at the end of the event-loop iteration.
        let ran = h.timer(now);
        let taken = model.tick(now, ran, &mut model_told);
        let d = h.drain();
        assert_eq!(d.take_backs, taken.len(), "step {step}: take-backs counted");
        if let Some(key) = expected_expiry {
            assert!(
                d.expired.contains(&key),
                "step {step}: the sweep's expiration"
            );
        }
        let wakes = d.wakes;
        for wake in wakes.iter().chain(&tick_wakes) {
            if let (Outcome::Granted { fence, .. }, false) = (&wake.outcome, wake.also.is_empty()) {
                let keys = std::iter::once(wake.key).chain(wake.also.iter().map(|(k, _)| *k));
                multi_grants.entry(*fence).or_default().extend(keys);
            }
        }

        assert_eq!(replies.0, replies.1, "step {step} {op:?}: reply");
        // The step's drain also covers the timer run after it, which
        // answers nobody nil.
        let answered_nil = matches!(op, Op::Acquire { .. } | Op::AcquireAll { .. })
            && replies.1 == Some(Told::Nil);
        assert_eq!(
            d.contended,
            usize::from(answered_nil),
            "step {step} {op:?}: contended counted"
        );
        compare(step, op, model_told, &wakes);
        let released: Vec<(u8, Vec<u8>)> = match *op {
            Op::Release { key, token: t, .. } => vec![(key, token(t))],
            Op::ReleaseAll { keys, token: t, .. } => keys_of(keys, false)
                .into_iter()
                .map(|k| (k, token(t)))
                .collect(),
            _ => Vec::new(),
        };
        check_wakes(&h, &mut asked, &mut granted, &wakes, now, &released);

        let mut live_fences = BTreeSet::new();
        for key in 0..KEYS {
            let mut engine_holders: Vec<(Vec<u8>, i64, i64)> = h
                .stores
                .get(&key)
                .map(|s| {
                    lock::holders(s)
                        .filter(|l| l.is_live(now))
                        .map(|l| (l.token.to_vec(), l.fence, l.deadline_ms))
                        .collect()
                })
                .unwrap_or_default();
            let mut model_holders: Vec<(Vec<u8>, i64, i64)> = model
                .holders(key)
                .iter()
                .filter(|h| now < h.deadline_ms)
                .map(|h| (h.token.clone(), h.fence, h.deadline_ms))
                .collect();
            engine_holders.sort();
            model_holders.sort();
            assert_eq!(
                engine_holders, model_holders,
                "step {step} {op:?}: holders of {key}"
            );
            let engine_mode = h.stores.get(&key).and_then(|s| s.mode);
            let model_mode = model.locks.get(&key).map(|l| l.mode);
            if !engine_holders.is_empty() {
                assert_eq!(engine_mode, model_mode, "step {step} {op:?}: mode of {key}");
            }
            // Never more holders than the key's capacity, unless it had
            // them before a lower lock.max-holders-per-key (those stay, as
            // waiters stay in a line made shorter).
            let capacity = engine_mode.map_or(1, |m| model.capacity(m));
            let count = engine_holders.len();
            assert!(
                count <= capacity || count <= holder_counts[usize::from(key)],
                "step {step}: {count} holders of {key} in {engine_mode:?}"
            );
            holder_counts[usize::from(key)] = count;
            for (_, fence, _) in &engine_holders {
                let fence = *fence;
                // One fence per grant; the keys of one ACQUIREALL share it.
                let together = multi_grants.get(&fence).is_some_and(|ks| ks.contains(&key));
                assert!(
                    live_fences.insert(fence) || together,
                    "step {step}: two locks hold fence {fence}"
                );
                // A fence not held before this step was drawn in it: above
                // every token the node had issued when the step began.
                if !fences_seen.contains(&fence) {
                    assert!(
                        fence > hwm_before,
                        "step {step}: a new fence {fence} at or below the mark {hwm_before}"
                    );
                    fences_seen.insert(fence);
                }
            }
            // After a pause the node looks again within RETRY_MS.
            let resumed = !model.resume_pending || now > resumed_at + RETRY_MS;
            let grantable = !h.replica
                && !h.writes_paused
                && resumed
                && h.node.grants_paused_ms(now) == 0
                && !model.delayed(key, now);
            if h.node.waiting_on(&key) > 0 && grantable && !model.group_waits(key, now) {
                assert!(
                    !engine_holders.is_empty(),
                    "step {step} {op:?}: a waiter is stranded on a free lock {key}"
                );
            }
        }
        assert_eq!(h.node.fence_hwm(), model.hwm, "step {step}: fence mark");
        // Every gate as the reference has it, and as the replica does.
        for gate in 0..GATES {
            let key = GATE0 + gate;
            let here = h.gates.get(&key).and_then(|g| g.mark);
            assert_eq!(
                here,
                model.gates.get(&gate).copied(),
                "step {step} {op:?}: gate {gate}"
            );
            let there = h.replicated_gates.get(&key).copied();
            assert_eq!(here, there, "step {step} {op:?}: replica of gate {gate}");
        }
        assert_eq!(h.grants, model.grants, "step {step}: grants counted");
        // Every change the node made reached the replica: its keys are
        // this node's, ended locks included.
        for key in 0..KEYS {
            let here = h.stores.get(&key).map(copy_of).unwrap_or_default();
            let there = h.replicated.get(&key).cloned().unwrap_or_default();
            assert_eq!(here, there, "step {step} {op:?}: replica of key {key}");
        }
    }
}

fn compare(step: usize, op: &Op, mut model_told: Vec<(u8, Told)>, wakes: &[Wake<u8, u8>]) {
    let mut engine_told: Vec<(u8, Told)> = wakes.iter().map(|w| (w.client, told_of(w))).collect();
    model_told.sort();
    engine_told.sort();
    assert_eq!(model_told, engine_told, "step {step} {op:?}: wakes");
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(20_000),
        .. ProptestConfig::default()
    })]

    #[test]
    fn the_node_agrees_with_the_reference_model(ops in prop::collection::vec(op(), 1..80)) {
        run(&ops);
    }
}
