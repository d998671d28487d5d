//! Bounds on everything a client or a loaded file can hand the module. Each
//! keeps arithmetic on time and tokens far from overflow.

/// Tokens are binary-safe, 1 to 512 bytes; `lock.max-token-len` can lower
/// the bound for new ACQUIREs, never raise it.
pub const MAX_TOKEN_LEN: usize = 512;

/// A holder's public value (`VALUE v`: a leader's address or id) is 0 to
/// 16 KiB; `lock.max-value-len` can lower the bound for new ACQUIREs,
/// never raise it. The keyspace keeps its length in 15 bits.
pub const MAX_VALUE_LEN: usize = 16 * 1024;

/// The longest lease or BLOCK timeout the module accepts at all: about ten
/// years. `lock.max-ttl-ms` can lower the lease bound, never raise it past
/// this. With it, `now + duration` (in ms or µs) cannot overflow an i64.
pub const MAX_DURATION_MS: i64 = 10 * 366 * 86_400_000;

/// The default `lock.max-ttl-ms`: a week. A lock held longer than that
/// without renewal is almost always a holder that is gone.
pub const DEFAULT_MAX_TTL_MS: i64 = 7 * 86_400_000;

/// How far above `max(HWM, now in µs)` a fencing token from outside (a
/// loaded value, a replicated grant, MINFENCE) may lie: 2^50 µs, about 35
/// years. Whatever is loaded, at least 2^62 tokens stay available.
pub const MAX_FENCE_LEAD: i64 = 1 << 50;

/// How far above its mark a node's fences start when it loaded its data or
/// was promoted with its clock behind that mark (10 s in µs): above every
/// token a predecessor could have issued after the last one this node saw
/// (a step back, a promoted replica whose clock lags), provided fewer than
/// 10 million grants or 10 s of its clock went by meanwhile (see `fence`).
pub const SERVING_FENCE_GAP: i64 = 10_000_000;

/// Fences at or above this are a clock's µs (2^50 µs is September 2005):
/// every fence this module issues is, and so is a Redlock group's. A
/// fence below it is a counter of the user's own, which no clock orders.
/// After a node loaded its data or was promoted, its gates refuse a clock
/// fence issued before then (see `Node::pass_gate`).
pub const CLOCK_FENCES_FROM: i64 = 1 << 50;

/// The most holders a stored value may have (a bound on what a damaged
/// count can make the loader allocate; far above `lock.max-holders-per-key`'s
/// default).
pub const MAX_STORED_HOLDERS: i64 = 1 << 20;

/// Above this many arguments (its name included) an inner command's keys
/// are not reported to a key-position request: Redis 7.0's
/// `RM_GetCommandKeysWithFlags` leaks its key buffer beyond that.
pub const MAX_INNER_ARGS_FOR_KEYS: usize = 256;

/// The default limit of BLOCK waiters queued on one key.
pub const DEFAULT_MAX_WAITERS_PER_KEY: i64 = 100_000;

/// The latest lease deadline a stored or replicated lock may carry: the
/// year 10000, in Unix ms. Far from overflow when turned into µs.
pub const MAX_DEADLINE_MS: i64 = 253_402_300_800_000;

/// The oldest server the module runs on (0x00MMmmpp, as
/// RedisModule_GetServerVersion gives it): 7.0 has every API the module
/// relies on (module configs, command info and key specs, the event-loop
/// event). Valkey reports 7.2.4.
pub const MIN_SERVER_VERSION: i32 = 0x00_07_00_00;

/// A clear refusal at load on an older server (0: the server is too old to
/// say its version), instead of a crash later.
pub fn check_server_version(version: i32) -> Result<(), String> {
    if version >= MIN_SERVER_VERSION {
        return Ok(());
    }
    let shown = match version {
        0 => "older than 6.0.9".to_string(),
        v => version_text(v),
    };
    Err(format!(
        "this module needs Redis 7.0 or later (or Valkey 7.2 or later); this server is {shown}"
    ))
}

/// The first Valkey that moves slots atomically (`CLUSTER MIGRATESLOTS`,
/// 9.0) and refuses to while a loaded module has not declared that it
/// handles it (an option bit Valkey 8 and Redis do not know).
pub const VALKEY_ATOMIC_SLOT_MIGRATION: i32 = 0x00_09_00_00;

/// Whether to declare that the module handles Valkey's atomic slot
/// migration: only on a Valkey (`valkey_version`, as Valkey numbers itself)
/// that knows the option. What a move does to locks, waiters, timers and
/// gates: docs/operations.md, Redis Cluster.
pub fn declares_atomic_slot_migration(valkey_version: Option<i32>) -> bool {
    valkey_version.is_some_and(|v| v >= VALKEY_ATOMIC_SLOT_MIGRATION)
}

/// A server version as people write it: `8.1.4`.
pub fn version_text(version: i32) -> String {
    format!(
        "{}.{}.{}",
        version >> 16,
        (version >> 8) & 0xff,
        version & 0xff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_valkey_9_is_told_of_atomic_slot_migration() {
        assert!(!declares_atomic_slot_migration(None)); // Redis, any version
        assert!(!declares_atomic_slot_migration(Some(0x00_08_01_04)));
        assert!(declares_atomic_slot_migration(Some(0x00_09_00_00)));
        assert!(declares_atomic_slot_migration(Some(0x00_0a_00_00)));
        assert_eq!(version_text(0x00_08_01_04), "8.1.4");
    }

    #[test]
    fn servers_before_7_0_are_refused_with_their_version() {
        assert_eq!(check_server_version(0x00_07_00_0f), Ok(()));
        assert_eq!(check_server_version(0x00_08_02_03), Ok(()));
        let err = check_server_version(0x00_06_02_0e).unwrap_err();
        assert!(
            err.contains("needs Redis 7.0") && err.ends_with("6.2.14"),
            "{err}"
        );
        assert!(check_server_version(0)
            .unwrap_err()
            .contains("older than 6.0.9"));
    }
}
