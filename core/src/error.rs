//! Every error the module can reply with. The first word of each message is
//! its error code, as Redis clients expect (`ERR`, `WRONGTYPE`, `TRYAGAIN`);
//! the codes a client acts on are named in `protocol::code`.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockError {
    /// Wrong number of arguments for the named command (lower case, as Redis
    /// itself prints it).
    WrongArity(&'static str),
    /// ttl-ms is not a plain decimal integer (letters, a fraction, spaces...).
    TtlNotInteger(String),
    /// ttl-ms is zero or negative.
    TtlNotPositive(String),
    /// ttl-ms is above `lock.max-ttl-ms` (the bound is given).
    TtlTooLarge(String, i64),
    /// now + ttl-ms does not fit in the clock.
    TtlOverflowsClock,
    TokenEmpty,
    TokenTooLong(usize),
    /// A new ACQUIRE's token is longer than `lock.max-token-len` (given).
    TokenOverLimit(usize, usize),
    UnknownOption(String),
    /// BLOCK without its timeout.
    MissingTimeout,
    /// BLOCK's timeout is not a non-negative integer.
    BadTimeout(String),
    /// BLOCK's timeout is above the module's bound.
    TimeoutTooLarge(String),
    /// MINFENCE without its n.
    MissingMinFence,
    /// VALUE without its value.
    MissingValue,
    /// VALUE longer than `lock.max-value-len` (length, bound).
    ValueTooLong(usize, usize),
    /// VALUE with SHARED: a value names one holder (a leader).
    ValueShared,
    /// AFTER without its fence.
    MissingAfter,
    /// AFTER's fence is not an integer from 0 up.
    BadAfter(String),
    /// OBSERVE's VALUE (the value seen with AFTER's fence) without AFTER
    /// or with AFTER 0 (a free key has no value).
    ValueWithoutLeader,
    /// OBSERVE's BLOCK without AFTER: a wait needs the state it waits to
    /// change from (it would otherwise answer at once).
    BlockWithoutAfter,
    /// SCAN's cursor is not an integer from 0 up.
    BadCursor(String),
    /// SCAN's COUNT is not an integer from 1 up.
    BadCount(String),
    /// SCAN's MATCH or COUNT without its argument.
    MissingScanArgument(&'static str),
    /// SCAN's MATCH pattern is longer than its bound.
    PatternTooLong(usize, usize),
    /// MINFENCE's n is not an integer from 1 up.
    BadMinFence(String),
    /// MINFENCE's n is more than 2^50 above the node's mark and clock.
    MinFenceTooLarge(String),
    /// A fencing token from outside (RDB, AOF, master) breaks the rules.
    BadFence(&'static str),
    /// `lock.max-waiters-per-key` waiters are queued already.
    TooManyWaiters(i64),
    /// A lock write on a replica (also with `replica-read-only no`).
    ReadOnlyReplica,
    /// maxmemory-policy can evict held locks and `lock.allow-eviction` is no.
    EvictionUnsafe,
    /// used memory is above maxmemory: no new grants or waiters.
    OutOfMemory,
    /// An internal-command argument that is not what the module writes.
    BadInternalArgument(&'static str),
    /// Internal commands are only accepted from the master link or the AOF.
    InternalCommand(&'static str),
    WrongType,
    /// restart-delay-ms is in force: no new grants for this many more ms.
    GrantsPaused(i64),
    /// The node-wide fencing counter reached i64::MAX.
    FencesExhausted,
    /// In cluster mode: the key is no longer served here (`ASK`/`MOVED`
    /// redirect, or `CLUSTERDOWN`), as built by `core::cluster::Route`.
    Redirect(String),
    /// A waiter's user lost the right to write the key while it waited
    /// (ACL SETUSER): it is not granted the lock.
    NoPermission,
    /// An observer's user may no longer read the key (ACL changed while it
    /// observed): told this instead of the change.
    NoReadPermission,
    /// `LOCK.EXEC`: the token does not hold the lock now; nothing ran.
    NotHeld(NotHeld),
    /// `LOCK.FENCED`: `fence` is below the gate's `mark`; nothing ran.
    StaleFence {
        fence: i64,
        mark: i64,
    },
    /// `LOCK.EXEC`/`LOCK.FENCED` was given no command to run where one is
    /// needed (the guarding command's name).
    MissingCommand(&'static str),
    /// The inner command (lower case) may not run guarded, and why.
    NotGuardable(String, &'static str),
    /// In a cluster, an inner command of this many arguments (its name
    /// included): more than `limits::MAX_INNER_ARGS_FOR_KEYS`, so its keys
    /// would not be checked against the guarding key's slot.
    TooLongForCluster(usize),
    /// A fence argument (`FENCE`, `LOCK.FENCED`'s) that is not a positive
    /// integer within the clock bound.
    BadFenceArg(String),
    /// The server refused to run a guarded command (its ACL, maxmemory, a
    /// read-only replica...): its error reply, code first.
    InnerRefused(String),
    /// numkeys is not a positive integer.
    BadNumKeys(String),
    /// numkeys is more than the keys given.
    NumKeysTooLarge(String),
    /// A multi-key command named a key twice.
    DuplicateKey(String),
    /// LIMIT without its n.
    MissingLimit,
    /// LIMIT's n is not an integer from 1 up to the bound.
    BadLimit(String),
    /// LIMIT without SHARED.
    LimitWithoutShared,
    /// A shared request names another limit than the key's holders were
    /// granted with (None: no LIMIT).
    LimitMismatch {
        held: Option<u32>,
        asked: Option<u32>,
    },
    /// A shared holder asked for its key exclusively.
    NoUpgrade,
    /// The key is a fence gate, which has no holder (`LOCK.FENCE gate
    /// token`, `LOCK.EXEC gate ...`).
    GateHasNoHolder,
    /// A bug was caught at the module boundary instead of crashing Redis.
    Internal,
}

/// Why `LOCK.EXEC` found the token not holding the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotHeld {
    /// Nobody holds it.
    Free,
    /// This token held it, and its lease has ended.
    Ended,
    /// Another token holds it.
    OtherToken,
    /// This token holds it under another grant: fence `held`, not `given`.
    OtherGrant { held: i64, given: i64 },
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use LockError::*;
        match self {
            WrongArity(cmd) => write!(f, "ERR wrong number of arguments for '{cmd}' command"),
            TtlNotInteger(v) => write!(
                f,
                "ERR invalid ttl-ms {v}: must be a positive integer of milliseconds"
            ),
            TtlNotPositive(v) => write!(f, "ERR invalid ttl-ms {v}: must be greater than 0"),
            TtlTooLarge(v, max) => write!(
                f,
                "ERR invalid ttl-ms {v}: above the limit of {max} ms (lock.max-ttl-ms)"
            ),
            TtlOverflowsClock => write!(f, "ERR invalid ttl-ms: now + ttl-ms overflows the clock"),
            TokenEmpty => write!(f, "ERR invalid token: must not be empty"),
            TokenTooLong(n) => write!(
                f,
                "ERR invalid token: {n} bytes, the limit is {} bytes",
                crate::limits::MAX_TOKEN_LEN
            ),
            TokenOverLimit(n, max) => write!(
                f,
                "ERR invalid token: {n} bytes, above the limit of {max} bytes (lock.max-token-len)"
            ),
            UnknownOption(o) => write!(f, "ERR unknown option {o}"),
            MissingTimeout => write!(f, "ERR BLOCK needs a timeout-ms (0 waits forever)"),
            BadTimeout(v) => write!(
                f,
                "ERR invalid timeout-ms {v}: must be 0 (no timeout) or a positive integer of milliseconds"
            ),
            TimeoutTooLarge(v) => write!(
                f,
                "ERR invalid timeout-ms {v}: above the limit of {} ms",
                crate::limits::MAX_DURATION_MS
            ),
            MissingMinFence => write!(f, "ERR MINFENCE needs a fencing token n"),
            MissingValue => write!(f, "ERR VALUE needs a value"),
            ValueTooLong(n, max) => write!(
                f,
                "ERR invalid VALUE: {n} bytes, above the limit of {max} bytes (lock.max-value-len)"
            ),
            ValueShared => write!(
                f,
                "ERR VALUE is for an exclusive holder (a leader): not with SHARED"
            ),
            MissingAfter => write!(f, "ERR AFTER needs the fence last seen (0: the key was free)"),
            BadAfter(v) => write!(
                f,
                "ERR invalid AFTER {v}: must be a fencing token, or 0 for a free key"
            ),
            ValueWithoutLeader => write!(
                f,
                "ERR VALUE is the value seen with AFTER's fence: it needs AFTER and a fence above 0"
            ),
            BadCursor(v) => write!(f, "ERR invalid cursor {v}: must be 0 or a cursor LOCK.SCAN answered"),
            BadCount(v) => write!(f, "ERR invalid COUNT {v}: must be a positive integer"),
            MissingScanArgument(what) => write!(f, "ERR {what} needs its argument"),
            PatternTooLong(n, max) => write!(
                f,
                "ERR invalid MATCH: {n} bytes, above the limit of {max}"
            ),
            BlockWithoutAfter => write!(
                f,
                "ERR BLOCK waits for a change from the state seen: it needs AFTER (AFTER 0: the key was free)"
            ),
            BadMinFence(v) => write!(
                f,
                "ERR invalid MINFENCE {v}: must be a positive integer fencing token"
            ),
            MinFenceTooLarge(v) => write!(
                f,
                "ERR invalid MINFENCE {v}: more than 2^50 (about 35 years of µs) above the clock"
            ),
            BadFence(why) => write!(f, "ERR invalid fencing token: {why}"),
            TooManyWaiters(max) => write!(
                f,
                "LINEFULL too many waiters: {max} clients already wait for this lock (lock.max-waiters-per-key)"
            ),
            ReadOnlyReplica => write!(f, "READONLY You can't write against a read only replica."),
            EvictionUnsafe => write!(
                f,
                "ERR maxmemory-policy can evict held locks: set maxmemory-policy noeviction, or CONFIG SET lock.allow-eviction yes to accept that"
            ),
            OutOfMemory => write!(
                f,
                "OOM command not allowed when used memory > 'maxmemory'."
            ),
            NoPermission => write!(
                f,
                "NOPERM this user may no longer write the lock's key (its ACL changed while it waited)"
            ),
            NoReadPermission => write!(
                f,
                "NOPERM this user may no longer read the lock's key (its ACL changed while it observed)"
            ),
            BadInternalArgument(what) => write!(f, "ERR invalid {what}"),
            InternalCommand(cmd) => write!(
                f,
                "ERR {cmd} is internal: only the master link and AOF loading may send it"
            ),
            WrongType => write!(
                f,
                "WRONGTYPE Operation against a key holding the wrong kind of value"
            ),
            GrantsPaused(ms) => write!(
                f,
                "TRYAGAIN new locks are paused for {ms} more ms after restart or promotion (lock.restart-delay-ms)"
            ),
            FencesExhausted => write!(f, "ERR fencing tokens exhausted on this node"),
            Redirect(to) => write!(f, "{to}"),
            NotHeld(why) => match why {
                self::NotHeld::Free => write!(f, "NOTHELD the lock is free: nothing ran"),
                self::NotHeld::Ended => {
                    write!(f, "NOTHELD the lease of this token has ended: nothing ran")
                }
                self::NotHeld::OtherToken => {
                    write!(f, "NOTHELD another token holds the lock: nothing ran")
                }
                self::NotHeld::OtherGrant { held, given } => write!(
                    f,
                    "NOTHELD this token holds the lock under another grant (fence {held}, not {given}): nothing ran"
                ),
            },
            StaleFence { fence, mark } => write!(
                f,
                "STALEFENCE fence {fence} is below the gate's mark {mark}: nothing ran"
            ),
            MissingCommand(cmd) => write!(f, "ERR {cmd} needs a command to run after its arguments"),
            NotGuardable(name, why) => write!(f, "NOTGUARDABLE {name} cannot run guarded: {why}"),
            TooLongForCluster(n) => write!(
                f,
                "NOTGUARDABLE a command of {n} arguments cannot run guarded in a cluster: above {} its keys are not checked against the guarding key's slot",
                crate::limits::MAX_INNER_ARGS_FOR_KEYS
            ),
            BadFenceArg(v) => write!(
                f,
                "ERR invalid fence {v}: must be a positive integer at most 2^50 above the clock in µs"
            ),
            InnerRefused(text) => write!(f, "{text}"),
            BadNumKeys(v) => write!(f, "ERR invalid numkeys {v}: must be a positive integer"),
            NumKeysTooLarge(v) => write!(
                f,
                "ERR invalid numkeys {v}: more than the keys given (the token, and for ACQUIREALL the ttl-ms, follow them)"
            ),
            DuplicateKey(k) => write!(f, "ERR key {k} is named twice"),
            MissingLimit => write!(f, "ERR LIMIT needs a number of holders n"),
            BadLimit(v) => write!(
                f,
                "ERR invalid LIMIT {v}: must be an integer from 1 to {}",
                crate::limits::MAX_STORED_HOLDERS
            ),
            LimitWithoutShared => write!(
                f,
                "ERR LIMIT needs SHARED: a limit caps shared holders (an exclusive lock has one)"
            ),
            LimitMismatch { held, asked } => {
                let show = |l: &Option<u32>| match l {
                    Some(n) => format!("LIMIT {n}"),
                    None => "no LIMIT".to_string(),
                };
                write!(
                    f,
                    "ERR the key's holders were granted with {}, this request has {}: a key keeps one limit until its last holder goes",
                    show(held),
                    show(asked)
                )
            }
            NoUpgrade => write!(
                f,
                "ERR this token holds the key shared: there is no upgrade to exclusive (two holders upgrading would wait for each other for ever); release it and acquire again"
            ),
            GateHasNoHolder => write!(
                f,
                "ERR the key is a fence gate: it has a mark, not a holder (LOCK.FENCE gate answers the mark)"
            ),
            Internal => write!(f, "ERR internal error in the lock module (see the server log)"),
        }
    }
}

impl std::error::Error for LockError {}

/// The fence and the mark of a `STALEFENCE` error's detail (the message
/// after its code), as [`LockError::StaleFence`] writes it: a client reads
/// the numbers back from here, not from a copy of the wording.
pub fn parse_stale_fence(detail: &str) -> Option<(i64, i64)> {
    let rest = detail.trim_start().strip_prefix("fence ")?;
    let (fence, rest) = rest.split_once(' ')?;
    let rest = rest.strip_prefix("is below the gate's mark ")?;
    let mark = rest.split(':').next()?;
    Some((fence.parse().ok()?, mark.trim().parse().ok()?))
}

/// How a user-supplied argument is shown inside an error: quoted when it is
/// short printable ASCII, otherwise only its length, so that binary or huge
/// input never ends up in an error line.
pub fn show_arg(arg: &[u8]) -> String {
    if arg.len() <= 40 && arg.iter().all(|b| (0x20..0x7f).contains(b) && *b != b'\'') {
        format!("'{}'", String::from_utf8_lossy(arg))
    } else {
        format!("({} bytes)", arg.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_fence_reads_back_from_its_message() {
        let text = LockError::StaleFence { fence: 7, mark: 12 }.to_string();
        let detail = text.split_once(' ').unwrap().1;
        assert_eq!(parse_stale_fence(detail), Some((7, 12)));
        assert_eq!(parse_stale_fence("something else"), None);
    }

    #[test]
    fn every_error_starts_with_its_code() {
        let all = [
            LockError::WrongArity("lock.acquire"),
            LockError::TtlNotInteger("'x'".into()),
            LockError::TtlNotPositive("'0'".into()),
            LockError::TtlTooLarge("'9'".into(), 5),
            LockError::TimeoutTooLarge("'9'".into()),
            LockError::MissingMinFence,
            LockError::BadMinFence("'x'".into()),
            LockError::MissingAfter,
            LockError::MissingValue,
            LockError::ValueTooLong(2000, 1024),
            LockError::ValueShared,
            LockError::BadAfter("'x'".into()),
            LockError::ValueWithoutLeader,
            LockError::BlockWithoutAfter,
            LockError::BadCursor("'x'".into()),
            LockError::BadCount("'0'".into()),
            LockError::MissingScanArgument("MATCH"),
            LockError::PatternTooLong(2000, 1024),
            LockError::MinFenceTooLarge("'9'".into()),
            LockError::BadFence("x"),
            LockError::EvictionUnsafe,
            LockError::TtlOverflowsClock,
            LockError::TokenEmpty,
            LockError::TokenTooLong(513),
            LockError::UnknownOption("'X'".into()),
            LockError::MissingTimeout,
            LockError::BadTimeout("'x'".into()),
            LockError::BadInternalArgument("fence"),
            LockError::InternalCommand("LOCK._SET"),
            LockError::FencesExhausted,
            LockError::LimitMismatch {
                held: Some(3),
                asked: None,
            },
            LockError::NoUpgrade,
            LockError::MissingLimit,
            LockError::BadLimit("'0'".into()),
            LockError::LimitWithoutShared,
            LockError::Internal,
        ];
        for e in all {
            assert!(e.to_string().starts_with("ERR "), "{e}");
        }
        assert!(LockError::WrongType.to_string().starts_with("WRONGTYPE "));
        assert!(LockError::ReadOnlyReplica
            .to_string()
            .starts_with("READONLY "));
        assert!(LockError::OutOfMemory.to_string().starts_with("OOM "));
        for e in [LockError::NoPermission, LockError::NoReadPermission] {
            assert!(e.to_string().starts_with("NOPERM "), "{e}");
        }
        let moved = LockError::Redirect("MOVED 3 127.0.0.1:7000".into());
        assert_eq!(moved.to_string(), "MOVED 3 127.0.0.1:7000");
        assert!(LockError::GrantsPaused(5)
            .to_string()
            .starts_with("TRYAGAIN "));
    }

    #[test]
    fn show_arg_quotes_only_short_printable_input() {
        assert_eq!(show_arg(b"abc"), "'abc'");
        assert_eq!(show_arg(b"a\r\nb"), "(4 bytes)");
        assert_eq!(show_arg(&[b'x'; 41]), "(41 bytes)");
        assert_eq!(show_arg(b"it's"), "(4 bytes)");
    }
}
