//! Argument parsing for every command. Input is the raw argv as byte slices
//! (`argv[0]` is the command name, `argv[1]` the key); output is typed values or
//! a [`LockError`] that names the problem. Nothing is allocated on success.

use super::error::{show_arg, LockError};
use super::limits::MAX_STORED_HOLDERS;
use super::limits::{MAX_DEADLINE_MS, MAX_DURATION_MS, MAX_TOKEN_LEN, MAX_VALUE_LEN};
use super::lock::Mode;
use super::time::known_grant;

mod scan;
pub use scan::{parse_scan, ScanArgs, MAX_PATTERN_LEN, SCAN_COUNT};

/// `LOCK.ACQUIRE key token ttl-ms [SHARED] [LIMIT n] [BLOCK timeout-ms]
/// [MINFENCE n]`
#[derive(Debug, PartialEq, Eq)]
pub struct AcquireArgs<'a> {
    pub token: &'a [u8],
    pub ttl_ms: i64,
    /// Exclusive, or `SHARED` (with `LIMIT n`, a counting semaphore).
    pub mode: Mode,
    /// `BLOCK timeout-ms`: wait up to this long (0 = no limit) when held.
    pub block_ms: Option<i64>,
    /// `MINFENCE n`: the fencing token is at least n (0: not given). Its
    /// upper bound depends on the node's mark and is checked by the caller.
    pub min_fence: i64,
    /// `VALUE v`: the holder's public value (at most `MAX_VALUE_LEN`
    /// bytes; the node checks `lock.max-value-len`). Exclusive only.
    pub value: Option<&'a [u8]>,
}

/// `LOCK.EXTEND key token ttl-ms [VALUE v]`
#[derive(Debug, PartialEq, Eq)]
pub struct ExtendArgs<'a> {
    pub token: &'a [u8],
    pub ttl_ms: i64,
    /// `VALUE v`: the holder's new public value (a proclaim).
    pub value: Option<&'a [u8]>,
}

/// `LOCK._SET key token fence deadline-ms [granted-ms [value]]`: the
/// replicated effect of a grant or renewal, with an absolute deadline and
/// grant time (Unix ms), and the holder's public value. Without granted-ms
/// (AOFs of earlier builds) it is 0: unknown; without a value, none.
#[derive(Debug, PartialEq, Eq)]
pub struct SetArgs<'a> {
    pub token: &'a [u8],
    /// The holder's public value (empty: none; always for a shared key).
    pub value: &'a [u8],
    pub fence: i64,
    pub deadline_ms: i64,
    pub granted_ms: i64,
}

/// Why a string is not an i64, so errors can tell "abc" from "9e99".
#[derive(Debug, PartialEq, Eq)]
pub enum IntError {
    NotInteger,
    OutOfRange,
}

/// Parses a decimal i64 exactly as Redis's `string2ll` does: optional '-',
/// digits, no leading zeros, no spaces, no '+'.
#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub fn parse_i64(s: &[u8]) -> Result<i64, IntError> {
    let (negative, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() {
        return Err(IntError::NotInteger);
    }
    if digits.len() > 1 && digits[0] == b'0' || negative && digits == b"0" {
        return Err(IntError::NotInteger);
    }
    // Up to 18 digits cannot overflow an i64: one plain pass that checks and
    // accumulates (this runs on every LOCK.ACQUIRE and LOCK.EXTEND). Longer
    // input takes the checked path.
    if digits.len() <= 18 {
        let mut magnitude = 0i64;
        for &d in digits {
            let d = d.wrapping_sub(b'0');
            if d > 9 {
                return Err(IntError::NotInteger);
            }
            magnitude = magnitude * 10 + i64::from(d);
        }
        return Ok(if negative { -magnitude } else { magnitude });
    }
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(IntError::NotInteger);
    }
    let mut value: i64 = 0;
    for d in digits {
        let d = i64::from(d - b'0');
        value = value
            .checked_mul(10)
            .and_then(|v| {
                if negative {
                    v.checked_sub(d)
                } else {
                    v.checked_add(d)
                }
            })
            .ok_or(IntError::OutOfRange)?;
    }
    Ok(value)
}

/// A lease: a positive number of milliseconds. How long a lease may be
/// (`lock.max-ttl-ms`) is the node's rule (`Limits::check_ttl`), applied to
/// every way a lease is asked for; a number too large for 64 bits is read
/// as the longest there is, which that rule refuses.
#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub fn parse_ttl(arg: &[u8]) -> Result<i64, LockError> {
    match parse_i64(arg) {
        Ok(ttl) if ttl > 0 => Ok(ttl),
        Ok(_) => Err(LockError::TtlNotPositive(show_arg(arg))),
        // "-99999999999999999999" is out of range but it is also negative:
        // say the more useful thing.
        Err(IntError::OutOfRange) if arg.first() == Some(&b'-') => {
            Err(LockError::TtlNotPositive(show_arg(arg)))
        }
        Err(IntError::OutOfRange) => Ok(i64::MAX),
        Err(IntError::NotInteger) => Err(LockError::TtlNotInteger(show_arg(arg))),
    }
}

pub fn parse_token(arg: &[u8]) -> Result<&[u8], LockError> {
    match arg.len() {
        0 => Err(LockError::TokenEmpty),
        n if n > MAX_TOKEN_LEN => Err(LockError::TokenTooLong(n)),
        _ => Ok(arg),
    }
}

/// `lock.max-token-len` (1 to MAX_TOKEN_LEN) bounds the tokens of new
/// ACQUIREs only: a holder whose token was accepted before the option was
/// lowered can still RELEASE and EXTEND.
pub fn check_token_limit(token: &[u8], max_token_len: usize) -> Result<(), LockError> {
    match token.len() {
        n if n > max_token_len => Err(LockError::TokenOverLimit(n, max_token_len)),
        _ => Ok(()),
    }
}

pub use crate::protocol::OptionSpec;

/// An option's value at start: the one given after the module path, or its
/// default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionValue {
    Numeric(i64),
    Bool(bool),
}

/// The arguments after the module path: `name value` pairs, each name one
/// of `specs` (as written, lower case), each value valid for it (an integer
/// in range; yes or no). Returns every option's start value, in `specs`'
/// order. Redis checks values only on CONFIG SET and config-file lines, and
/// a misspelt name would otherwise be ignored, leaving an option (say
/// restart-delay-ms on a Redlock node) silently unset.
pub fn module_option_values(
    args: &[&[u8]],
    specs: &[OptionSpec],
) -> Result<Vec<OptionValue>, String> {
    let mut values: Vec<OptionValue> = specs
        .iter()
        .map(|spec| match *spec {
            OptionSpec::Numeric { default, .. } => OptionValue::Numeric(default),
            OptionSpec::Bool { default, .. } => OptionValue::Bool(default),
        })
        .collect();
    let mut given = vec![false; specs.len()];
    for pair in args.chunks(2) {
        let name = String::from_utf8_lossy(pair[0]);
        let Some(at) = specs.iter().position(|s| s.name().as_bytes() == pair[0]) else {
            let known: Vec<&str> = specs.iter().map(OptionSpec::name).collect();
            return Err(format!(
                "unknown option '{name}' after the module path (options: {})",
                known.join(", ")
            ));
        };
        // Which one was meant is anybody's guess (a config line and a
        // command line merged by hand): refuse rather than pick one.
        if std::mem::replace(&mut given[at], true) {
            return Err(format!(
                "option '{name}' is given more than once after the module path"
            ));
        }
        let Some(value) = pair.get(1) else {
            return Err(format!("option '{name}' has no value"));
        };
        let shown = String::from_utf8_lossy(value);
        values[at] = match specs[at] {
            OptionSpec::Numeric { min, max, .. } => match parse_i64(value) {
                Ok(v) if (min..=max).contains(&v) => OptionValue::Numeric(v),
                _ => {
                    return Err(format!(
                    "invalid {name} {shown}: must be an integer between {min} and {max} inclusive"
                ))
                }
            },
            OptionSpec::Bool { .. } => match value.to_ascii_lowercase().as_slice() {
                b"yes" => OptionValue::Bool(true),
                b"no" => OptionValue::Bool(false),
                _ => return Err(format!("invalid {name} {shown}: must be yes or no")),
            },
        };
    }
    Ok(values)
}

fn arity(argv: &[&[u8]], min: usize, max: usize, name: &'static str) -> Result<(), LockError> {
    if argv.len() < min || argv.len() > max {
        return Err(LockError::WrongArity(name));
    }
    Ok(())
}

#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub fn parse_acquire<'a>(argv: &[&'a [u8]]) -> Result<AcquireArgs<'a>, LockError> {
    if argv.len() < 4 {
        return Err(LockError::WrongArity("lock.acquire"));
    }
    let token = parse_token(argv[2])?;
    let ttl_ms = parse_ttl(argv[3])?;
    let options = parse_acquire_options(&argv[4..])?;
    Ok(AcquireArgs {
        token,
        ttl_ms,
        mode: options.mode,
        block_ms: options.block_ms,
        min_fence: options.min_fence,
        value: options.value,
    })
}

/// The options after `ttl-ms`, the same for `LOCK.ACQUIRE` and
/// `LOCK.ACQUIREALL`.
struct AcquireOptions<'a> {
    mode: Mode,
    block_ms: Option<i64>,
    min_fence: i64,
    value: Option<&'a [u8]>,
}

/// `[SHARED] [LIMIT n] [BLOCK timeout-ms] [MINFENCE n] [VALUE v]`, in any
/// order, each at most once.
#[inline(always)] // on every ACQUIRE: as cheap as when it was written inline
fn parse_acquire_options<'a>(argv: &[&'a [u8]]) -> Result<AcquireOptions<'a>, LockError> {
    let mut block_ms = None;
    let mut min_fence = 0;
    let mut value = None;
    let (mut shared, mut limit) = (false, None);
    let mut options = argv.iter();
    while let Some(option) = options.next() {
        if option.eq_ignore_ascii_case(b"SHARED") && !shared {
            shared = true;
        } else if option.eq_ignore_ascii_case(b"LIMIT") && limit.is_none() {
            let n = options.next().ok_or(LockError::MissingLimit)?;
            limit = Some(parse_limit(n)?);
        } else if option.eq_ignore_ascii_case(b"BLOCK") && block_ms.is_none() {
            let timeout = options.next().ok_or(LockError::MissingTimeout)?;
            block_ms = Some(parse_timeout(timeout)?);
        } else if option.eq_ignore_ascii_case(b"MINFENCE") && min_fence == 0 {
            let n = options.next().ok_or(LockError::MissingMinFence)?;
            min_fence = parse_min_fence(n)?;
        } else if option.eq_ignore_ascii_case(b"VALUE") && value.is_none() {
            let v: &'a [u8] = options.next().ok_or(LockError::MissingValue)?;
            if v.len() > MAX_VALUE_LEN {
                return Err(LockError::ValueTooLong(v.len(), MAX_VALUE_LEN));
            }
            value = Some(v);
        } else {
            return Err(LockError::UnknownOption(show_arg(option)));
        }
    }
    let mode = match (shared, limit) {
        (false, None) => Mode::Exclusive,
        (false, Some(_)) => return Err(LockError::LimitWithoutShared),
        (true, _) if value.is_some() => return Err(LockError::ValueShared),
        (true, limit) => Mode::Shared { limit },
    };
    Ok(AcquireOptions {
        mode,
        block_ms,
        min_fence,
        value,
    })
}

/// `LIMIT`'s n: how many may hold a shared key at once, 1 up to
/// `MAX_STORED_HOLDERS` (a key holds at most `lock.max-holders-per-key`
/// whatever its limit).
pub fn parse_limit(arg: &[u8]) -> Result<u32, LockError> {
    match parse_i64(arg) {
        Ok(n) if (1..=MAX_STORED_HOLDERS).contains(&n) => Ok(n as u32),
        _ => Err(LockError::BadLimit(show_arg(arg))),
    }
}

/// `LOCK.ACQUIREALL numkeys key [key ...] token ttl-ms [SHARED] [LIMIT n]
/// [BLOCK timeout-ms] [MINFENCE n]`
#[derive(Debug, PartialEq, Eq)]
pub struct AcquireAllArgs<'a> {
    /// The keys, distinct, in argv from index 2.
    pub keys: std::ops::Range<usize>,
    pub token: &'a [u8],
    pub ttl_ms: i64,
    /// Every key in this mode (`SHARED`, `LIMIT n`: each key's).
    pub mode: Mode,
    /// `BLOCK timeout-ms` (0: no limit): wait in every key's line.
    pub block_ms: Option<i64>,
    pub min_fence: i64,
    /// `VALUE v`: every key's holder gets it (see [`AcquireArgs::value`]).
    pub value: Option<&'a [u8]>,
}

/// numkeys: from 1 up to what argv holds.
fn parse_numkeys(arg: &[u8], room: usize) -> Result<usize, LockError> {
    match parse_i64(arg) {
        Ok(n) if n >= 1 && (n as u64) <= room as u64 => Ok(n as usize),
        Ok(n) if n >= 1 => Err(LockError::NumKeysTooLarge(show_arg(arg))),
        _ => Err(LockError::BadNumKeys(show_arg(arg))),
    }
}

/// No key named twice (each would be opened and granted twice).
fn check_distinct(keys: &[&[u8]]) -> Result<(), LockError> {
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    for key in keys {
        if !seen.insert(*key) {
            return Err(LockError::DuplicateKey(show_arg(key)));
        }
    }
    Ok(())
}

/// `argv` is the whole argument vector (not cut at `MAX_ARGS`).
pub fn parse_acquire_all<'a>(argv: &[&'a [u8]]) -> Result<AcquireAllArgs<'a>, LockError> {
    if argv.len() < 5 {
        return Err(LockError::WrongArity("lock.acquireall"));
    }
    let n = parse_numkeys(argv[1], argv.len() - 4)?;
    let keys = 2..2 + n;
    check_distinct(&argv[keys.clone()])?;
    let token = parse_token(argv[keys.end])?;
    let ttl_ms = parse_ttl(argv[keys.end + 1])?;
    let options = parse_acquire_options(&argv[keys.end + 2..])?;
    Ok(AcquireAllArgs {
        keys,
        token,
        ttl_ms,
        mode: options.mode,
        block_ms: options.block_ms,
        min_fence: options.min_fence,
        value: options.value,
    })
}

/// `LOCK.RELEASEALL numkeys key [key ...] token`: the keys' range and the
/// token.
pub fn parse_release_all<'a>(
    argv: &[&'a [u8]],
) -> Result<(std::ops::Range<usize>, &'a [u8]), LockError> {
    if argv.len() < 4 {
        return Err(LockError::WrongArity("lock.releaseall"));
    }
    let n = parse_numkeys(argv[1], argv.len() - 3)?;
    if argv.len() != n + 3 {
        return Err(LockError::WrongArity("lock.releaseall"));
    }
    let keys = 2..2 + n;
    check_distinct(&argv[keys.clone()])?;
    Ok((keys.clone(), parse_token(argv[keys.end])?))
}

/// MINFENCE's n: a positive integer (the node checks its upper bound).
pub fn parse_min_fence(arg: &[u8]) -> Result<i64, LockError> {
    match parse_i64(arg) {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(LockError::BadMinFence(show_arg(arg))),
    }
}

/// BLOCK's timeout-ms: 0 (wait forever) or a positive integer up to
/// `MAX_DURATION_MS`.
pub fn parse_timeout(arg: &[u8]) -> Result<i64, LockError> {
    match parse_i64(arg) {
        Ok(ms) if ms > MAX_DURATION_MS => Err(LockError::TimeoutTooLarge(show_arg(arg))),
        Ok(ms) if ms >= 0 => Ok(ms),
        Err(IntError::OutOfRange) if arg.first() != Some(&b'-') => {
            Err(LockError::TimeoutTooLarge(show_arg(arg)))
        }
        _ => Err(LockError::BadTimeout(show_arg(arg))),
    }
}

pub fn parse_release<'a>(argv: &[&'a [u8]]) -> Result<&'a [u8], LockError> {
    arity(argv, 3, 3, "lock.release")?;
    parse_token(argv[2])
}

pub fn parse_extend<'a>(argv: &[&'a [u8]]) -> Result<ExtendArgs<'a>, LockError> {
    arity(argv, 4, 6, "lock.extend")?;
    let token = parse_token(argv[2])?;
    let ttl_ms = parse_ttl(argv[3])?;
    let value = match &argv[4..] {
        [] => None,
        [word, rest @ ..] if word.eq_ignore_ascii_case(b"VALUE") => match rest {
            [] => return Err(LockError::MissingValue),
            [v] if v.len() > MAX_VALUE_LEN => {
                return Err(LockError::ValueTooLong(v.len(), MAX_VALUE_LEN))
            }
            [v] => Some(*v),
            _ => return Err(LockError::WrongArity("lock.extend")),
        },
        [word, ..] => return Err(LockError::UnknownOption(show_arg(word))),
    };
    Ok(ExtendArgs {
        token,
        ttl_ms,
        value,
    })
}

/// `LOCK.FENCE key [token]`
pub fn parse_fence<'a>(argv: &[&'a [u8]]) -> Result<Option<&'a [u8]>, LockError> {
    arity(argv, 2, 3, "lock.fence")?;
    argv.get(2).map(|t| parse_token(t)).transpose()
}

/// `LOCK.INFO key`
pub fn parse_info(argv: &[&[u8]]) -> Result<(), LockError> {
    arity(argv, 2, 2, "lock.info")
}

/// `LOCK.OBSERVE key [AFTER fence [VALUE v]] [BLOCK timeout-ms]`, the
/// options in any order, each at most once.
#[derive(Debug, PartialEq, Eq)]
pub struct ObserveArgs<'a> {
    /// The fence the client saw (0: the key free); None: answer at once.
    pub after: Option<i64>,
    /// The value it saw with that fence (empty: none); None: not given
    /// (taken as the holder's value now).
    pub value: Option<&'a [u8]>,
    pub block_ms: Option<i64>,
}

pub fn parse_observe<'a>(argv: &[&'a [u8]]) -> Result<ObserveArgs<'a>, LockError> {
    arity(argv, 2, 8, "lock.observe")?;
    let (mut after, mut value, mut block_ms) = (None, None, None);
    let mut options = argv[2..].iter();
    while let Some(option) = options.next() {
        if option.eq_ignore_ascii_case(b"AFTER") && after.is_none() {
            let n = options.next().ok_or(LockError::MissingAfter)?;
            after = Some(match parse_i64(n) {
                Ok(n) if n >= 0 => n,
                _ => return Err(LockError::BadAfter(show_arg(n))),
            });
        } else if option.eq_ignore_ascii_case(b"VALUE") && value.is_none() {
            let v = options.next().ok_or(LockError::MissingValue)?;
            if v.len() > MAX_VALUE_LEN {
                return Err(LockError::ValueTooLong(v.len(), MAX_VALUE_LEN));
            }
            value = Some(*v);
        } else if option.eq_ignore_ascii_case(b"BLOCK") && block_ms.is_none() {
            let timeout = options.next().ok_or(LockError::MissingTimeout)?;
            block_ms = Some(parse_timeout(timeout)?);
        } else {
            return Err(LockError::UnknownOption(show_arg(option)));
        }
    }
    if value.is_some() && after.is_none_or(|a| a <= 0) {
        return Err(LockError::ValueWithoutLeader);
    }
    if block_ms.is_some() && after.is_none() {
        return Err(LockError::BlockWithoutAfter);
    }
    Ok(ObserveArgs {
        after,
        value,
        block_ms,
    })
}

pub fn parse_set<'a>(argv: &[&'a [u8]]) -> Result<SetArgs<'a>, LockError> {
    arity(argv, 5, 7, "lock._set")?;
    let token = parse_token(argv[2])?;
    let fence = match parse_i64(argv[3]) {
        Ok(f) if f > 0 => f,
        _ => return Err(LockError::BadInternalArgument("fence")),
    };
    let deadline_ms = match parse_i64(argv[4]) {
        Ok(d) if (0..=MAX_DEADLINE_MS).contains(&d) => d,
        _ => return Err(LockError::BadInternalArgument("deadline-ms")),
    };
    // One after the deadline is taken as unknown (0), as when loading a
    // value (see `time::known_grant`).
    let granted_ms = match argv.get(5).map(|g| parse_i64(g)) {
        None => 0,
        Some(Ok(g)) if g >= 0 => known_grant(g, deadline_ms).unwrap_or(0),
        Some(_) => return Err(LockError::BadInternalArgument("granted-ms")),
    };
    let value = match argv.get(6) {
        None => &[][..],
        Some(v) if v.len() <= MAX_VALUE_LEN => v,
        Some(_) => return Err(LockError::BadInternalArgument("value")),
    };
    Ok(SetArgs {
        token,
        value,
        fence,
        deadline_ms,
        granted_ms,
    })
}

/// `LOCK._SHARED key limit token fence deadline-ms granted-ms [token fence
/// deadline-ms granted-ms ...]`: the replicated (and AOF) form of a shared
/// key, whole: its limit (`codec::mode_word`: -1 none, n ≥ 1) and every
/// holder, times in Unix ms.
#[derive(Debug, PartialEq, Eq)]
pub struct SharedSetArgs<'a> {
    pub mode: Mode,
    pub holders: Vec<SetArgs<'a>>,
}

/// The arguments of `LOCK._SHARED` after its key, as the module writes
/// them: the mode word, then each holder's token, fence, deadline and
/// grant time (both Unix ms).
pub fn shared_set_args(mode: Mode, holders: &[(&[u8], i64, i64, i64)]) -> Vec<Vec<u8>> {
    let mut out = vec![crate::codec::mode_word(mode).to_string().into_bytes()];
    for &(token, fence, deadline_ms, granted_ms) in holders {
        out.push(token.to_vec());
        for n in [fence, deadline_ms, granted_ms] {
            out.push(n.to_string().into_bytes());
        }
    }
    out
}

pub fn parse_shared_set<'a>(argv: &[&'a [u8]]) -> Result<SharedSetArgs<'a>, LockError> {
    if argv.len() < 7 || (argv.len() - 3) % 4 != 0 {
        return Err(LockError::WrongArity("lock._shared"));
    }
    let mode = parse_i64(argv[2])
        .ok()
        .and_then(crate::codec::mode_of_word)
        .filter(|m| m.is_shared())
        .ok_or(LockError::BadInternalArgument("limit"))?;
    let mut holders: Vec<SetArgs<'a>> = Vec::with_capacity((argv.len() - 3) / 4);
    for h in argv[3..].chunks(4) {
        let mut one: Vec<&'a [u8]> = vec![argv[0], argv[1]];
        one.extend_from_slice(h);
        let holder = parse_set(&one)?;
        if holders.iter().any(|o| o.token == holder.token) {
            return Err(LockError::BadInternalArgument(
                "holder: a token named twice",
            ));
        }
        holders.push(holder);
    }
    Ok(SharedSetArgs { mode, holders })
}

/// `LOCK._HOLD key limit token fence deadline-ms granted-ms`: one holder of
/// a shared key, added or renewed (the form of [`shared_set_args`] with
/// one holder).
pub fn parse_hold<'a>(argv: &[&'a [u8]]) -> Result<(Mode, SetArgs<'a>), LockError> {
    if argv.len() != 7 {
        return Err(LockError::WrongArity("lock._hold"));
    }
    let mut a = parse_shared_set(argv)?;
    let holder = a.holders.pop().ok_or(LockError::Internal)?;
    Ok((a.mode, holder))
}

/// `LOCK._DROP key token`: one holder of a shared key, gone.
pub fn parse_drop<'a>(argv: &[&'a [u8]]) -> Result<&'a [u8], LockError> {
    if argv.len() != 3 {
        return Err(LockError::WrongArity("lock._drop"));
    }
    parse_token(argv[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observe_takes_after_and_block_once_each_in_any_order() {
        let parse = |args: &[&'static str]| -> Result<ObserveArgs<'static>, LockError> {
            let mut argv: Vec<&'static [u8]> = vec![b"lock.observe", b"k"];
            argv.extend(args.iter().map(|a| a.as_bytes()));
            parse_observe(&argv)
        };
        let none = ObserveArgs {
            after: None,
            value: None,
            block_ms: None,
        };
        assert_eq!(parse(&[]), Ok(none));
        let both = ObserveArgs {
            after: Some(0),
            value: None,
            block_ms: Some(250),
        };
        assert_eq!(parse(&["block", "250", "AFTER", "0"]), Ok(both));
        let all = ObserveArgs {
            after: Some(7),
            value: Some(&b"10.0.0.1"[..]),
            block_ms: Some(0),
        };
        assert_eq!(
            parse(&["VALUE", "10.0.0.1", "BLOCK", "0", "after", "7"]),
            Ok(all)
        );
        let empty = parse(&["AFTER", "7", "VALUE", ""]).unwrap();
        assert_eq!(empty.value, Some(&b""[..]), "an empty value: none seen");
        assert_eq!(
            parse(&["AFTER", "7", "VALUE"]),
            Err(LockError::MissingValue)
        );
        for no_leader in [&["VALUE", "v"][..], &["AFTER", "0", "VALUE", "v"]] {
            assert_eq!(parse(no_leader), Err(LockError::ValueWithoutLeader));
        }
        let long: &'static str = "x".repeat(MAX_VALUE_LEN + 1).leak();
        assert_eq!(
            parse(&["AFTER", "7", "VALUE", long]),
            Err(LockError::ValueTooLong(MAX_VALUE_LEN + 1, MAX_VALUE_LEN))
        );
        assert_eq!(parse(&["AFTER"]), Err(LockError::MissingAfter));
        assert_eq!(
            parse(&["AFTER", "-1"]),
            Err(LockError::BadAfter("'-1'".into()))
        );
        assert_eq!(
            parse(&["AFTER", "x"]),
            Err(LockError::BadAfter("'x'".into()))
        );
        assert_eq!(parse(&["BLOCK"]), Err(LockError::MissingTimeout));
        assert_eq!(
            parse(&["BLOCK", "0"]),
            Err(LockError::BlockWithoutAfter),
            "a wait with nothing to wait for: refused, not answered at once"
        );
        assert_eq!(
            parse(&["AFTER", "0", "BLOCK", "-5"]),
            Err(LockError::BadTimeout("'-5'".into()))
        );
        assert_eq!(
            parse(&["AFTER", "1", "AFTER", "2"]),
            Err(LockError::UnknownOption("'AFTER'".into()))
        );
        assert_eq!(
            parse(&["AFTER", "1", "BLOCK", "2", "VALUE", "v", "X"]),
            Err(LockError::WrongArity("lock.observe"))
        );
        assert_eq!(
            parse(&["SHARED"]),
            Err(LockError::UnknownOption("'SHARED'".into()))
        );
    }

    #[test]
    fn one_holder_of_a_shared_key_is_written_and_read_back() {
        let mode = Mode::Shared { limit: Some(3) };
        let words = shared_set_args(mode, &[(&b"r1"[..], 7, 1_000, 900)]);
        let mut argv: Vec<&[u8]> = vec![b"lock._hold", b"k"];
        argv.extend(words.iter().map(|w| &w[..]));
        let (m, h) = parse_hold(&argv).unwrap();
        assert_eq!(m, mode);
        assert_eq!(
            (h.token, h.fence, h.deadline_ms, h.granted_ms),
            (&b"r1"[..], 7, 1_000, 900)
        );
        // Exactly one holder, of a shared mode.
        let two = shared_set_args(mode, &[(&b"a"[..], 1, 9, 0), (&b"b"[..], 2, 9, 0)]);
        let mut argv: Vec<&[u8]> = vec![b"lock._hold", b"k"];
        argv.extend(two.iter().map(|w| &w[..]));
        assert_eq!(parse_hold(&argv), Err(LockError::WrongArity("lock._hold")));
        let ex: Vec<&[u8]> = vec![b"lock._hold", b"k", b"0", b"t", b"1", b"9", b"0"];
        assert_eq!(
            parse_hold(&ex),
            Err(LockError::BadInternalArgument("limit"))
        );
        assert_eq!(parse_drop(&[b"lock._drop", b"k", b"t"]), Ok(&b"t"[..]));
        assert_eq!(
            parse_drop(&[b"lock._drop", b"k"]),
            Err(LockError::WrongArity("lock._drop"))
        );
        assert_eq!(
            parse_drop(&[b"lock._drop", b"k", b""]),
            Err(LockError::TokenEmpty)
        );
    }

    #[test]
    fn a_shared_key_is_written_and_read_back_whole() {
        let mode = Mode::Shared { limit: Some(4) };
        let written = shared_set_args(mode, &[(b"a", 7, 100, 50), (b"b", 9, 200, 0)]);
        let mut argv: Vec<&[u8]> = vec![b"LOCK._SHARED", b"k"];
        argv.extend(written.iter().map(|a| a.as_slice()));
        let parsed = parse_shared_set(&argv).unwrap();
        assert_eq!(parsed.mode, mode);
        let holders: Vec<(&[u8], i64, i64, i64)> = parsed
            .holders
            .iter()
            .map(|h| (h.token, h.fence, h.deadline_ms, h.granted_ms))
            .collect();
        assert_eq!(holders, [(&b"a"[..], 7, 100, 50), (&b"b"[..], 9, 200, 0)]);
        let bad = |argv: &[&[u8]]| parse_shared_set(argv).unwrap_err();
        assert_eq!(
            bad(&argv[..argv.len() - 1]),
            LockError::WrongArity("lock._shared")
        );
        let mut exclusive = argv.clone();
        exclusive[2] = b"0";
        assert_eq!(bad(&exclusive), LockError::BadInternalArgument("limit"));
        let mut twice = argv.clone();
        twice[7] = b"a";
        assert!(matches!(bad(&twice), LockError::BadInternalArgument(_)));
    }

    #[test]
    fn parse_i64_follows_redis_string2ll() {
        assert_eq!(parse_i64(b"0"), Ok(0));
        assert_eq!(parse_i64(b"1500"), Ok(1500));
        assert_eq!(parse_i64(b"-7"), Ok(-7));
        assert_eq!(parse_i64(b"9223372036854775807"), Ok(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Ok(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775808"), Err(IntError::OutOfRange));
        // Both sides of the unchecked fast path's 18-digit limit.
        assert_eq!(
            parse_i64(b"999999999999999999"),
            Ok(999_999_999_999_999_999)
        );
        assert_eq!(
            parse_i64(b"-999999999999999999"),
            Ok(-999_999_999_999_999_999)
        );
        assert_eq!(
            parse_i64(b"1000000000000000000"),
            Ok(1_000_000_000_000_000_000)
        );
        assert_eq!(
            parse_i64(b"99999999999999999999"),
            Err(IntError::OutOfRange)
        );
        for bad in [
            &b""[..],
            b"-",
            b"+5",
            b" 5",
            b"5 ",
            b"1.5",
            b"1e3",
            b"0x10",
            b"007",
            b"-0",
            b"abc",
        ] {
            assert_eq!(parse_i64(bad), Err(IntError::NotInteger), "{bad:?}");
        }
    }

    #[test]
    fn ttl_must_be_a_positive_64_bit_integer() {
        assert_eq!(parse_ttl(b"1"), Ok(1));
        assert!(matches!(parse_ttl(b"0"), Err(LockError::TtlNotPositive(_))));
        assert!(matches!(
            parse_ttl(b"-5"),
            Err(LockError::TtlNotPositive(_))
        ));
        assert!(matches!(
            parse_ttl(b"-99999999999999999999"),
            Err(LockError::TtlNotPositive(_))
        ));
        assert!(matches!(
            parse_ttl(b"1.5"),
            Err(LockError::TtlNotInteger(_))
        ));
        assert!(matches!(
            parse_ttl(b" 100"),
            Err(LockError::TtlNotInteger(_))
        ));
        assert!(matches!(
            parse_ttl(b"abc"),
            Err(LockError::TtlNotInteger(_))
        ));
        // Longer than any lease: the node's max-ttl rule refuses it.
        assert_eq!(parse_ttl(b"99999999999999999999"), Ok(i64::MAX));
        assert_eq!(parse_ttl(b"9300000000000000"), Ok(9_300_000_000_000_000));
        let msg = parse_ttl(b"abc").unwrap_err().to_string();
        assert!(msg.contains("ttl-ms") && msg.contains("'abc'"), "{msg}");
    }

    #[test]
    fn token_is_1_to_512_binary_bytes() {
        assert_eq!(parse_token(b"\0\xff"), Ok(&b"\0\xff"[..]));
        assert_eq!(parse_token(&[7; 512]).map(<[u8]>::len), Ok(512));
        assert_eq!(parse_token(b""), Err(LockError::TokenEmpty));
        assert_eq!(parse_token(&[7; 513]), Err(LockError::TokenTooLong(513)));
        let specs = [
            OptionSpec::Numeric {
                name: "max-ttl-ms",
                default: 7,
                min: 1,
                max: 100,
            },
            OptionSpec::Bool {
                name: "allow-eviction",
                default: false,
            },
        ];
        let values = |args: &[&[u8]]| module_option_values(args, &specs);
        use OptionValue::{Bool, Numeric};
        assert_eq!(values(&[]), Ok(vec![Numeric(7), Bool(false)]));
        assert_eq!(
            values(&[b"max-ttl-ms", b"5", b"allow-eviction", b"YES"]),
            Ok(vec![Numeric(5), Bool(true)])
        );
        for (args, message) in [
            (
                &[&b"max-tll-ms"[..], b"5"][..],
                "unknown option 'max-tll-ms'",
            ),
            (&[b"max-ttl-ms"], "'max-ttl-ms' has no value"),
            (
                &[b"max-ttl-ms", b"0"],
                "invalid max-ttl-ms 0: must be an integer between 1 and 100",
            ),
            (&[b"max-ttl-ms", b"101"], "invalid max-ttl-ms 101"),
            (&[b"max-ttl-ms", b"abc"], "invalid max-ttl-ms abc"),
            (&[b"max-ttl-ms", b" 5"], "invalid max-ttl-ms  5"),
            (
                &[b"allow-eviction", b"maybe"],
                "invalid allow-eviction maybe: must be yes or no",
            ),
            (
                &[b"max-ttl-ms", b"5", b"max-ttl-ms", b"6"],
                "option 'max-ttl-ms' is given more than once",
            ),
            (
                &[
                    b"max-ttl-ms",
                    b"5",
                    b"allow-eviction",
                    b"no",
                    b"max-ttl-ms",
                    b"5",
                ],
                "option 'max-ttl-ms' is given more than once",
            ),
        ] {
            let err = values(args).unwrap_err();
            assert!(err.contains(message), "{args:?}: {err}");
        }
        assert_eq!(check_token_limit(&[7; 64], 64), Ok(()));
        assert_eq!(
            check_token_limit(&[7; 65], 64),
            Err(LockError::TokenOverLimit(65, 64))
        );
    }

    #[test]
    fn acquire_takes_key_token_ttl_and_no_unknown_options() {
        let ok = parse_acquire(&[b"LOCK.ACQUIRE", b"k", b"t", b"100"]).unwrap();
        assert_eq!(
            ok,
            AcquireArgs {
                token: b"t",
                ttl_ms: 100,
                mode: Mode::Exclusive,
                block_ms: None,
                min_fence: 0,
                value: None,
            }
        );
        assert_eq!(
            parse_acquire(&[b"LOCK.ACQUIRE", b"k", b"t"]),
            Err(LockError::WrongArity("lock.acquire"))
        );
        assert_eq!(
            parse_acquire(&[b"LOCK.ACQUIRE", b"k", b"t", b"100", b"NX"]),
            Err(LockError::UnknownOption("'NX'".into()))
        );
    }

    #[test]
    fn acquire_takes_shared_and_a_limit_in_any_order_with_the_other_options() {
        let parse = |extra: &[&[u8]]| {
            let argv: Vec<&[u8]> = [&b"LOCK.ACQUIRE"[..], b"k", b"t", b"100"]
                .into_iter()
                .chain(extra.iter().copied())
                .collect();
            parse_acquire(&argv).map(|a| (a.mode, a.block_ms))
        };
        let shared = |limit| Mode::Shared { limit };
        assert_eq!(parse(&[b"shared"]), Ok((shared(None), None)));
        assert_eq!(
            parse(&[b"LIMIT", b"3", b"BLOCK", b"5", b"SHARED"]),
            Ok((shared(Some(3)), Some(5)))
        );
        assert_eq!(parse(&[b"LIMIT", b"3"]), Err(LockError::LimitWithoutShared));
        assert_eq!(parse(&[b"SHARED", b"LIMIT"]), Err(LockError::MissingLimit));
        for bad in [&b"0"[..], b"-1", b"x", b"1048577"] {
            assert_eq!(
                parse(&[b"SHARED", b"LIMIT", bad]),
                Err(LockError::BadLimit(show_arg(bad)))
            );
        }
        assert_eq!(
            parse(&[b"SHARED", b"SHARED"]),
            Err(LockError::UnknownOption("'SHARED'".into())),
            "named twice"
        );
        let msg = LockError::LimitWithoutShared.to_string();
        assert!(msg.contains("LIMIT needs SHARED"), "{msg}");
    }

    #[test]
    fn acquire_all_takes_the_same_options_as_acquire_after_its_keys() {
        let parse = |extra: &[&[u8]]| {
            let argv: Vec<&[u8]> = [&b"LOCK.ACQUIREALL"[..], b"2", b"a", b"b", b"t", b"100"]
                .into_iter()
                .chain(extra.iter().copied())
                .collect();
            parse_acquire_all(&argv).map(|a| (a.keys, a.mode, a.block_ms, a.min_fence))
        };
        let shared = |limit| Mode::Shared { limit };
        assert_eq!(parse(&[]), Ok((2..4, Mode::Exclusive, None, 0)));
        assert_eq!(
            parse(&[b"block", b"5", b"Shared", b"MINFENCE", b"7"]),
            Ok((2..4, shared(None), Some(5), 7))
        );
        assert_eq!(
            parse(&[b"SHARED", b"LIMIT", b"2"]),
            Ok((2..4, shared(Some(2)), None, 0))
        );
        assert_eq!(parse(&[b"LIMIT", b"2"]), Err(LockError::LimitWithoutShared));
        assert_eq!(
            parse(&[b"SHARED", b"NX"]),
            Err(LockError::UnknownOption("'NX'".into()))
        );
    }

    #[test]
    fn acquire_takes_an_optional_block_timeout() {
        let a = parse_acquire(&[b"LOCK.ACQUIRE", b"k", b"t", b"100", b"block", b"0"]).unwrap();
        assert_eq!(a.block_ms, Some(0));
        let a = parse_acquire(&[b"LOCK.ACQUIRE", b"k", b"t", b"100", b"BLOCK", b"2500"]).unwrap();
        assert_eq!(a.block_ms, Some(2500));
        let bad = |argv: &[&[u8]]| parse_acquire(argv).unwrap_err();
        assert_eq!(
            bad(&[b"A", b"k", b"t", b"100", b"BLOCK"]),
            LockError::MissingTimeout
        );
        for t in [&b"-1"[..], b"1.5", b"x", b""] {
            assert!(matches!(
                bad(&[b"A", b"k", b"t", b"100", b"BLOCK", t]),
                LockError::BadTimeout(_)
            ));
        }
        for t in [
            &b"9223372036854775807"[..],
            b"99999999999999999999",
            b"316224000001",
        ] {
            let err = bad(&[b"A", b"k", b"t", b"100", b"BLOCK", t]);
            assert!(matches!(err, LockError::TimeoutTooLarge(_)), "{err}");
        }
        assert!(matches!(
            bad(&[b"A", b"k", b"t", b"100", b"BLOCK", b"1", b"BLOCK", b"2"]),
            LockError::UnknownOption(_)
        ));
        assert!(matches!(
            bad(&[b"A", b"k", b"t", b"100", b"BLOCK", b"1", b"X"]),
            LockError::UnknownOption(_)
        ));
    }

    #[test]
    fn fixed_arity_commands_reject_missing_and_extra_arguments() {
        assert!(parse_release(&[b"r", b"k"]).is_err());
        assert!(parse_release(&[b"r", b"k", b"t", b"x"]).is_err());
        assert_eq!(parse_release(&[b"r", b"k", b"t"]), Ok(&b"t"[..]));
        assert!(parse_extend(&[b"e", b"k", b"t"]).is_err());
        assert!(parse_extend(&[b"e", b"k", b"t", b"0"]).is_err());
        assert_eq!(parse_fence(&[b"f", b"k"]), Ok(None));
        assert_eq!(parse_fence(&[b"f", b"k", b"t"]), Ok(Some(&b"t"[..])));
        assert!(parse_fence(&[b"f", b"k", b"t", b"u"]).is_err());
        assert!(parse_fence(&[b"f", b"k", b""]).is_err());
        assert!(parse_info(&[b"i", b"k"]).is_ok());
        assert!(parse_info(&[b"i"]).is_err());
    }

    #[test]
    fn internal_set_validates_fence_and_deadline() {
        let ok = parse_set(&[b"s", b"k", b"t", b"42", b"1700000000000"]).unwrap();
        assert_eq!((ok.fence, ok.deadline_ms), (42, 1_700_000_000_000));
        assert!(parse_set(&[b"s", b"k", b"t", b"0", b"1"]).is_err());
        assert!(parse_set(&[b"s", b"k", b"t", b"1", b"-1"]).is_err());
        assert!(parse_set(&[b"s", b"k", b"t", b"1", b"9300000000000000"]).is_err());
        assert!(parse_set(&[b"s", b"k", b"t", b"1"]).is_err());
        assert_eq!(ok.granted_ms, 0);
        let with =
            parse_set(&[b"s", b"k", b"t", b"42", b"1700000000000", b"1699999999000"]).unwrap();
        assert_eq!(with.granted_ms, 1_699_999_999_000);
        // After the deadline (an earlier build's write after a wall-clock
        // step): applied, the grant time unknown.
        let late = parse_set(&[b"s", b"k", b"t", b"42", b"1000", b"1001"]).unwrap();
        assert_eq!((late.deadline_ms, late.granted_ms), (1000, 0));
        assert!(parse_set(&[b"s", b"k", b"t", b"42", b"1000", b"-1"]).is_err());
        // A seventh argument is the holder's value, an eighth is too many.
        let valued = parse_set(&[b"s", b"k", b"t", b"42", b"1000", b"1", b"x"]).unwrap();
        assert_eq!(valued.value, b"x");
        assert!(parse_set(&[b"s", b"k", b"t", b"42", b"1000", b"1", b"x", b"y"]).is_err());
        let long = vec![b'v'; MAX_VALUE_LEN + 1];
        assert!(parse_set(&[b"s", b"k", b"t", b"42", b"1000", b"1", &long]).is_err());
    }

    #[test]
    fn value_is_for_an_exclusive_holder_and_bounded() {
        fn acquire<'a>(extra: &[&'a [u8]]) -> Result<AcquireArgs<'a>, LockError> {
            let mut argv: Vec<&'a [u8]> = vec![b"LOCK.ACQUIRE", b"k", b"t", b"100"];
            argv.extend_from_slice(extra);
            parse_acquire(&argv)
        }
        let a = acquire(&[b"value", b"10.0.0.7:6379", b"BLOCK", b"0"]).unwrap();
        assert_eq!(
            (a.value, a.block_ms),
            (Some(&b"10.0.0.7:6379"[..]), Some(0))
        );
        assert_eq!(acquire(&[b"VALUE", b""]).unwrap().value, Some(&b""[..]));
        assert_eq!(acquire(&[b"VALUE"]), Err(LockError::MissingValue));
        assert_eq!(
            acquire(&[b"SHARED", b"VALUE", b"v"]),
            Err(LockError::ValueShared)
        );
        assert!(matches!(
            acquire(&[b"VALUE", b"a", b"VALUE", b"b"]),
            Err(LockError::UnknownOption(_))
        ));
        let long = vec![b'v'; MAX_VALUE_LEN + 1];
        assert_eq!(
            acquire(&[b"VALUE", &long]),
            Err(LockError::ValueTooLong(MAX_VALUE_LEN + 1, MAX_VALUE_LEN))
        );
    }

    #[test]
    fn minfence_in_any_order_and_case_with_block() {
        let a = parse_acquire(&[b"LOCK.ACQUIRE", b"k", b"t", b"100", b"minfence", b"42"]).unwrap();
        assert_eq!((a.min_fence, a.block_ms), (42, None));
        let argv: [&[u8]; 8] = [
            b"LOCK.ACQUIRE",
            b"k",
            b"t",
            b"100",
            b"MinFence",
            b"7",
            b"BLOCK",
            b"5",
        ];
        let a = parse_acquire(&argv).unwrap();
        assert_eq!((a.min_fence, a.block_ms), (7, Some(5)));
        let argv: [&[u8]; 8] = [
            b"LOCK.ACQUIRE",
            b"k",
            b"t",
            b"100",
            b"BLOCK",
            b"5",
            b"MINFENCE",
            b"7",
        ];
        assert_eq!(parse_acquire(&argv).unwrap().min_fence, 7);
    }

    #[test]
    fn bad_minfence_is_named() {
        let bad = |argv: &[&[u8]]| parse_acquire(argv).unwrap_err().to_string();
        let base: [&[u8]; 4] = [b"LOCK.ACQUIRE", b"k", b"t", b"100"];
        let with = |extra: &[&'static [u8]]| {
            let mut v: Vec<&[u8]> = base.to_vec();
            v.extend_from_slice(extra);
            bad(&v)
        };
        assert_eq!(with(&[b"MINFENCE"]), "ERR MINFENCE needs a fencing token n");
        for n in [
            &b"0"[..],
            b"-1",
            b"x",
            b"1.5",
            b" 1",
            b"+1",
            b"99999999999999999999",
        ] {
            assert!(
                with(&[b"MINFENCE", n]).starts_with("ERR invalid MINFENCE"),
                "{n:?}"
            );
        }
        assert!(with(&[b"MINFENCE", b"1", b"MINFENCE", b"2"])
            .starts_with("ERR unknown option 'MINFENCE'"));
    }
}
