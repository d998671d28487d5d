//! The operations a history is made of, the values they range over, and
//! what a client is told.

use proptest::prelude::*;

use crate::error::LockError;
use crate::lock::Mode;

pub(super) const KEYS: u8 = 3;
pub(super) const CLIENTS: u8 = 6;
/// Fence gates, the node's keys from `GATE0` on (apart from the locks').
pub(super) const GATES: u8 = 2;
pub(super) const GATE0: u8 = 100;
pub(super) const T0_MS: i64 = 1_700_000_000_000;
/// The two values `lock.max-ttl-ms` takes in a history.
pub(super) const MAX_TTL: [i64; 2] = [1000, 15];
/// The two values `lock.restart-delay-ms` takes.
pub(super) const DELAY: [i64; 2] = [0, 30];
/// The two values `lock.max-token-len` takes (tokens are 1 or 2 bytes).
pub(super) const MAX_TOKEN: [usize; 2] = [512, 1];
/// The two values `lock.lock-delay-ms` takes.
pub(super) const LOCK_DELAY: [i64; 2] = [0, 40];
/// The two values `lock.max-waiters-per-key` takes (six clients: the
/// default never fills a line, 2 often does).
pub(super) const MAX_LINE: [usize; 2] = [10_000, 2];
/// The two values `lock.max-holders-per-key` takes (four tokens: the
/// default never fills a shared key, 2 often does).
pub(super) const MAX_HOLDERS: [usize; 2] = [10_000, 2];
/// The modes an ACQUIRE asks for: exclusive half the time, else SHARED
/// without LIMIT, LIMIT 1 or LIMIT 2.
pub(super) const MODES: [Mode; 6] = [
    Mode::Exclusive,
    Mode::Exclusive,
    Mode::Exclusive,
    Mode::Shared { limit: None },
    Mode::Shared { limit: Some(1) },
    Mode::Shared { limit: Some(2) },
];

#[derive(Debug, Clone)]
pub(super) enum Op {
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
        /// `VALUE v`: a proclaim of one of two values (None: a plain
        /// renewal).
        value: Option<u8>,
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
    /// `LOCK.OBSERVE key [AFTER fence [VALUE v]] [BLOCK ms]`: `after`
    /// picks what the client saw (see [`AFTERS`]); `value` the value it
    /// names with a leader's fence (see [`seen_value`]; None: not given).
    Observe {
        client: u8,
        key: u8,
        after: usize,
        value: Option<u8>,
        block: Option<i64>,
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
pub(super) fn keys_of(set: u8, reversed: bool) -> Vec<u8> {
    let mut keys: Vec<u8> = (0..KEYS).filter(|k| set & (1 << k) != 0).collect();
    if reversed {
        keys.reverse();
    }
    keys
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..CLIENTS, 0..KEYS, 0..4u8, 0..MODES.len(), 1..40i64,
              prop::option::weighted(0.7, 0..30i64), prop::option::weighted(0.15, -3..4i8))
            .prop_map(|(client, key, token, mode, ttl, block, min_fence)|
                Op::Acquire { client, key, token, mode, ttl, block, min_fence }),
        4 => (0..CLIENTS, 0..KEYS, 0..4u8).prop_map(|(client, key, token)| Op::Release { client, key, token }),
        2 => (0..CLIENTS, 0..KEYS, 0..4u8, 1..40i64, prop::option::weighted(0.4, 0..2u8))
            .prop_map(|(client, key, token, ttl, value)| Op::Extend { client, key, token, ttl, value }),
        1 => (0..KEYS).prop_map(|key| Op::Delete { key }),
        1 => (0..KEYS).prop_map(|key| Op::WrongType { key }),
        1 => Just(Op::Swap),
        1 => (0..KEYS).prop_map(|key| Op::Migrate { key }),
        2 => (0..CLIENTS).prop_map(|client| Op::Disconnect { client }),
        3 => (0..CLIENTS, 0..KEYS, 0..AFTERS.len(), prop::option::weighted(0.4, 0..3u8),
              prop::option::weighted(0.8, 0..30i64))
            .prop_map(|(client, key, after, value, block)| Op::Observe { client, key, after, value, block }),
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
pub(super) fn token(t: u8) -> Vec<u8> {
    vec![b'a' + t; 1 + usize::from(t >= 2)]
}

/// What an observer says it saw: nothing (no AFTER), the key free
/// (`AFTER 0`), the leader as it is now, or a fence that never led.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum After {
    None,
    Vacant,
    Current,
    Stale,
}

/// (Mostly what it is now: those are the observers that wait.)
pub(super) const AFTERS: [After; 5] = [
    After::None,
    After::Vacant,
    After::Current,
    After::Current,
    After::Stale,
];

/// What a command or a wake-up told a client, comparable across both sides.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Told {
    Fence(i64),
    /// `LOCK.OBSERVE`: the key's leader's fence (0: vacant) and public
    /// value (empty: none).
    Leader(i64, Vec<u8>),
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

/// The bytes of a proclaimed value (`Op::Extend`'s `value`).
pub(super) fn value_bytes(v: u8) -> Vec<u8> {
    vec![b'v', b'0' + v]
}

/// The value an observer names as seen (`Op::Observe`'s `value`): one of
/// the two proclaimed (0, 1), or none (2: a leader that proclaimed
/// nothing, the empty value).
pub(super) fn seen_value(v: u8) -> Vec<u8> {
    match v {
        0 | 1 => value_bytes(v),
        _ => Vec::new(),
    }
}

pub(super) fn error(e: LockError) -> Told {
    Told::Error(e.to_string())
}
