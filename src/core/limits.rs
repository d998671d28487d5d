//! Bounds on everything a client or a loaded file can hand the module. Each
//! keeps arithmetic on time and tokens far from overflow.

/// Tokens are binary-safe, 1 to 512 bytes; `lock.max-token-len` can lower
/// the bound for new ACQUIREs, never raise it.
pub const MAX_TOKEN_LEN: usize = 512;

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

/// The default limit of BLOCK waiters queued on one key.
pub const DEFAULT_MAX_WAITERS_PER_KEY: i64 = 100_000;

/// The latest lease deadline a stored or replicated lock may carry: the
/// year 10000, in Unix ms. Far from overflow when turned into µs.
pub const MAX_DEADLINE_MS: i64 = 253_402_300_800_000;
