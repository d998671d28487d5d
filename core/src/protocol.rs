//! What the module and its clients share on the wire, written down once:
//! the command names, `LOCK.INFO`'s field names, the error codes a client
//! must tell apart, and every option with its bounds and default. The
//! module (`src/`), the client crate and the test kit all read them from
//! here; nothing here depends on anything.

use crate::limits::{
    DEFAULT_MAX_TTL_MS, DEFAULT_MAX_WAITERS_PER_KEY, MAX_DURATION_MS, MAX_TOKEN_LEN, MAX_VALUE_LEN,
};

/// The commands, as clients send them.
pub mod command {
    use std::ffi::CStr;

    pub const ACQUIRE: &str = "LOCK.ACQUIRE";
    pub const RELEASE: &str = "LOCK.RELEASE";
    pub const EXTEND: &str = "LOCK.EXTEND";
    pub const FENCE: &str = "LOCK.FENCE";
    pub const INFO: &str = "LOCK.INFO";
    /// `LOCK.OBSERVE key [AFTER fence] [BLOCK timeout-ms]`: the key's
    /// leader, at once or when it is no longer the one seen.
    pub const OBSERVE: &str = "LOCK.OBSERVE";
    /// `LOCK.SCAN cursor [MATCH pattern] [COUNT n] [WAITING]`: the node's
    /// locks, a page at a time, each as `LOCK.INFO` shows it with its key.
    pub const SCAN: &str = "LOCK.SCAN";
    /// `LOCK.ACQUIREALL numkeys key ... token ttl-ms [SHARED] [LIMIT n]
    /// [BLOCK timeout-ms] [MINFENCE n]`: every key with one fence, or none.
    pub const ACQUIRE_ALL: &str = "LOCK.ACQUIREALL";
    /// `LOCK.RELEASEALL numkeys key ... token`: how many it released.
    pub const RELEASE_ALL: &str = "LOCK.RELEASEALL";
    /// `LOCK.EXEC key token [FENCE fence] command [arg ...]`: runs the
    /// command only while token holds key (with that grant's fence).
    pub const EXEC: &str = "LOCK.EXEC";
    /// `LOCK.FENCED gate fence [command [arg ...]]`: runs the command only
    /// if fence is at least the gate's mark, and records it as the mark.
    pub const FENCED: &str = "LOCK.FENCED";
    /// Internal: the replicated and AOF form of a gate's mark.
    pub const GATE: &str = text_of(GATE_C);
    /// Internal: the replicated and AOF form of a grant or renewal.
    pub const SET: &str = text_of(SET_C);
    /// Internal: the replicated and AOF form of a shared key, whole.
    pub const SET_SHARED: &str = text_of(SET_SHARED_C);
    /// Internal: one holder of a shared key, added or renewed.
    pub const HOLD: &str = text_of(HOLD_C);
    /// Internal: one holder of a shared key, gone.
    pub const DROP: &str = text_of(DROP_C);
    /// The internal commands' names as the module writes them into the
    /// replication stream and the AOF (C strings).
    pub const GATE_C: &CStr = c"LOCK._GATE";
    pub const SET_C: &CStr = c"LOCK._SET";
    pub const SET_SHARED_C: &CStr = c"LOCK._SHARED";
    pub const HOLD_C: &CStr = c"LOCK._HOLD";
    pub const DROP_C: &CStr = c"LOCK._DROP";

    const fn text_of(name: &'static CStr) -> &'static str {
        match name.to_str() {
            Ok(text) => text,
            Err(_) => panic!("command names are ASCII"),
        }
    }
    /// `ACQUIRE`'s option words.
    pub const BLOCK: &str = "BLOCK";
    pub const MINFENCE: &str = "MINFENCE";
    /// `OBSERVE`'s word for the fence last seen.
    pub const AFTER: &str = "AFTER";
    /// `ACQUIRE`'s word for the holder's public value.
    pub const VALUE: &str = "VALUE";
    /// `ACQUIRE`'s word for a shared holder, and its limit's.
    pub const SHARED: &str = "SHARED";
    pub const LIMIT: &str = "LIMIT";
    /// `SCAN`'s option words: a glob on the key, the page's size, only
    /// locks with waiters.
    pub const MATCH: &str = "MATCH";
    pub const COUNT: &str = "COUNT";
    pub const WAITING: &str = "WAITING";
    /// `EXEC`'s option word: the holder's grant must have this fence.
    pub const FENCE_WORD: &str = "FENCE";
}

/// `LOCK.INFO`'s fields, in the order of its reply (a map on RESP3, a flat
/// array of name and value on RESP2).
pub mod info_field {
    /// The holder's token (nil for a user who may not write the key).
    pub const TOKEN: &str = "token";
    /// The holder's fencing token.
    pub const FENCE: &str = "fence";
    /// What is left of the lease, ms.
    pub const TTL: &str = "ttl";
    /// Clients queued with BLOCK.
    pub const WAITERS: &str = "waiters";
    /// When the holder was granted, Unix ms (nil when unknown).
    pub const GRANTED: &str = "granted";
    /// `exclusive` or `shared`.
    pub const MODE: &str = "mode";
    /// A shared key's LIMIT (nil: none, or exclusive).
    pub const LIMIT: &str = "limit";
    /// Every live holder, in grant order: an array of maps of TOKEN, FENCE,
    /// TTL, GRANTED and VALUE (one when exclusive). The fields above are
    /// the newest holder's.
    pub const HOLDERS: &str = "holders";
    /// The holder's public value (`ACQUIRE ... VALUE v`; nil when it has
    /// none): shown to every reader, unlike the token. Last, so replies
    /// read by position before it existed still read.
    pub const VALUE: &str = "value";
    /// How long the first in line has waited, ms (nil: nobody waits).
    pub const LONGEST_WAIT: &str = "longest_wait";
    /// The grants the key has had on this node since it started, whether
    /// its lock was freed between them or not (never fewer; more only
    /// when other keys share its counters): a rate is two readings apart.
    pub const GRANTS: &str = "grants";
    /// `LOCK.SCAN`'s entries only, first: the lock's key.
    pub const KEY: &str = "key";
    /// Every field, in reply order.
    pub const ALL: [&str; 11] = [
        TOKEN,
        FENCE,
        TTL,
        WAITERS,
        GRANTED,
        MODE,
        LIMIT,
        HOLDERS,
        VALUE,
        LONGEST_WAIT,
        GRANTS,
    ];
    /// The fields of each map of HOLDERS, in reply order.
    pub const HOLDER: [&str; 5] = [TOKEN, FENCE, TTL, GRANTED, VALUE];
}

/// Error codes (the first word of an error reply) a client acts on.
pub mod code {
    /// The key's line of BLOCK waiters is full (`lock.max-waiters-per-key`):
    /// try again later.
    pub const LINE_FULL: &str = "LINEFULL";
    /// New grants are paused (`lock.restart-delay-ms`): try again later.
    pub const TRY_AGAIN: &str = "TRYAGAIN";
    /// A write on a replica.
    pub const READ_ONLY: &str = "READONLY";
    /// Redis's own: a blocked client (a waiter, an observer) let go
    /// because the node changed role (demoted to a replica) or by `CLIENT
    /// UNBLOCK ... ERROR`: try again, where the line or the leader now is.
    pub const UNBLOCKED: &str = "UNBLOCKED";
    /// Memory above `maxmemory`: no new grant or place in line.
    pub const OUT_OF_MEMORY: &str = "OOM";
    /// The key holds another type.
    pub const WRONG_TYPE: &str = "WRONGTYPE";
    /// The waiter's user lost the command or the key while it waited.
    pub const NO_PERMISSION: &str = "NOPERM";
    /// `LOCK.EXEC`: the token does not hold the lock now (free, lease
    /// ended, another token, or another grant): nothing ran.
    pub const NOT_HELD: &str = "NOTHELD";
    /// `LOCK.FENCED`: the fence is below the gate's mark: nothing ran.
    pub const STALE_FENCE: &str = "STALEFENCE";
    /// `LOCK.EXEC`/`LOCK.FENCED`: the inner command may not be guarded
    /// (blocking, MULTI, pub/sub, admin, no-script, `LOCK.*`, or in a
    /// cluster too long for its keys to be checked).
    pub const NOT_GUARDABLE: &str = "NOTGUARDABLE";
}

/// The module's name (`MODULE LIST`), and the prefix of its options:
/// `CONFIG GET lock.*`, a `lock.<name>` line in redis.conf.
pub const MODULE_NAME: &str = "lock";

/// The longest BLOCK timeout (and lease) the module accepts at all.
pub const MAX_BLOCK_MS: i64 = MAX_DURATION_MS;

/// How long an observer's wait (`LOCK.OBSERVE ... BLOCK`) lasts in the
/// server, by default, before it answers nil and the client sends it again:
/// with [`OBSERVE_GRACE_MS`], the longest a follower stays on a connection
/// that went quiet without closing (a host gone, a NAT that forgot the
/// flow) before it is replaced. Every client's default.
pub const OBSERVE_WAIT_MS: i64 = 30_000;

/// How long past its wait (or, for a read of the state now, at all) an
/// observer waits for the server's answer before its connection counts
/// as gone: closed, opened again, and the stream resumed.
pub const OBSERVE_GRACE_MS: i64 = 5_000;

/// One option, as it may follow the module path or be set at runtime
/// (`CONFIG SET lock.<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionSpec {
    Numeric {
        name: &'static str,
        default: i64,
        min: i64,
        max: i64,
    },
    Bool {
        name: &'static str,
        default: bool,
    },
}

impl OptionSpec {
    pub fn name(&self) -> &'static str {
        match self {
            OptionSpec::Numeric { name, .. } | OptionSpec::Bool { name, .. } => name,
        }
    }

    /// The numeric default (0 or 1 for a boolean).
    pub fn default_value(&self) -> i64 {
        match *self {
            OptionSpec::Numeric { default, .. } => default,
            OptionSpec::Bool { default, .. } => default.into(),
        }
    }
}

/// `lock.restart-delay-ms`: no new grants this long after the node loaded
/// its data or was promoted.
pub const RESTART_DELAY_MS: OptionSpec = OptionSpec::Numeric {
    name: "restart-delay-ms",
    default: 0,
    min: 0,
    max: MAX_DURATION_MS,
};

/// `lock.lock-delay-ms`: after a lease ends without a release (its holder
/// died or stalled), the key grants nothing for this long (0: off).
pub const LOCK_DELAY_MS: OptionSpec = OptionSpec::Numeric {
    name: "lock-delay-ms",
    default: 0,
    min: 0,
    max: MAX_DURATION_MS,
};

/// `lock.max-ttl-ms`: the longest lease.
pub const MAX_TTL_MS: OptionSpec = OptionSpec::Numeric {
    name: "max-ttl-ms",
    default: DEFAULT_MAX_TTL_MS,
    min: 1,
    max: MAX_DURATION_MS,
};

/// `lock.max-waiters-per-key`: the longest BLOCK line on one key.
pub const MAX_WAITERS_PER_KEY: OptionSpec = OptionSpec::Numeric {
    name: "max-waiters-per-key",
    default: DEFAULT_MAX_WAITERS_PER_KEY,
    min: 1,
    max: 100_000_000,
};

/// `lock.max-token-len`: the longest token a new grant may use.
pub const MAX_TOKEN_LEN_OPTION: OptionSpec = OptionSpec::Numeric {
    name: "max-token-len",
    default: MAX_TOKEN_LEN as i64,
    min: 1,
    max: MAX_TOKEN_LEN as i64,
};

/// `lock.max-value-len`: the longest public value (`VALUE v`) a grant or
/// renewal may store (0: none may).
pub const MAX_VALUE_LEN_OPTION: OptionSpec = OptionSpec::Numeric {
    name: "max-value-len",
    default: 1024,
    min: 0,
    max: MAX_VALUE_LEN as i64,
};

/// `lock.max-holders-per-key`: the most holders one shared key has at
/// once (a `LIMIT` above it is capped to it; each holder is found by a
/// scan of its key's holders).
pub const MAX_HOLDERS_PER_KEY: OptionSpec = OptionSpec::Numeric {
    name: "max-holders-per-key",
    default: 10_000,
    min: 1,
    max: crate::limits::MAX_STORED_HOLDERS,
};

/// `lock.allow-eviction`: grant while `maxmemory-policy` can evict locks.
pub const ALLOW_EVICTION: OptionSpec = OptionSpec::Bool {
    name: "allow-eviction",
    default: false,
};

/// Every option, in the order `CONFIG GET lock.*` documents them.
pub const OPTIONS: [OptionSpec; 8] = [
    RESTART_DELAY_MS,
    LOCK_DELAY_MS,
    MAX_TTL_MS,
    MAX_WAITERS_PER_KEY,
    MAX_TOKEN_LEN_OPTION,
    ALLOW_EVICTION,
    MAX_HOLDERS_PER_KEY,
    MAX_VALUE_LEN_OPTION,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{LockError, NotHeld};

    #[test]
    fn codes_are_what_the_errors_start_with() {
        let starts = |e: LockError, code: &str| {
            let text = e.to_string();
            assert_eq!(text.split(' ').next(), Some(code), "{text}");
        };
        starts(LockError::TooManyWaiters(3), code::LINE_FULL);
        starts(LockError::GrantsPaused(5), code::TRY_AGAIN);
        starts(LockError::ReadOnlyReplica, code::READ_ONLY);
        starts(LockError::OutOfMemory, code::OUT_OF_MEMORY);
        starts(LockError::WrongType, code::WRONG_TYPE);
        starts(LockError::NoPermission, code::NO_PERMISSION);
        starts(LockError::NotHeld(NotHeld::Free), code::NOT_HELD);
        starts(
            LockError::StaleFence { fence: 1, mark: 2 },
            code::STALE_FENCE,
        );
        starts(
            LockError::NotGuardable("get".into(), "x"),
            code::NOT_GUARDABLE,
        );
        starts(LockError::TooLongForCluster(300), code::NOT_GUARDABLE);
    }

    #[test]
    fn option_names_are_unique_and_defaults_in_bounds() {
        for (i, spec) in OPTIONS.iter().enumerate() {
            assert!(OPTIONS[..i].iter().all(|o| o.name() != spec.name()));
            if let OptionSpec::Numeric {
                default, min, max, ..
            } = *spec
            {
                assert!((min..=max).contains(&default), "{spec:?}");
            }
        }
    }
}
