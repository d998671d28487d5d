//! The entry points of the coverage-guided fuzz targets in `fuzz/`
//! (`cargo +nightly fuzz run parse_args`, `... decode_value`; see `make
//! fuzz`). Each takes the fuzzer's bytes, runs the real code on them and
//! panics when a property fails; an error reply or a refused value is a
//! pass. The unit test below runs both over the seed corpus checked in
//! under `fuzz/corpus/`, so `make test` keeps the targets and the corpus
//! from rotting.

use super::args::{self, parse_i64, AcquireArgs, ExtendArgs, IntError, SetArgs};
use super::codec::{self, StoredLock};
use super::error::LockError;
use super::fence::FenceCounter;
use super::limits::{MAX_DEADLINE_MS, MAX_DURATION_MS, MAX_TOKEN_LEN};
use super::lock::Mode;
use super::rdb_bytes::{self, RdbBytes};

/// `parse_args`: the input is one argv, its arguments separated by '\n'
/// (argv[0] is the command name, argv[1] the key). A known command name
/// runs its parser; any other name runs every parser. Each parser must
/// agree with the plain reading of the README below, and every error must
/// be a short printable `ERR ...` line.
pub fn parse_args(data: &[u8]) {
    let argv: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    for arg in &argv {
        check_parse_i64(arg);
    }
    let is = |name: &str| argv[0].eq_ignore_ascii_case(name.as_bytes());
    let known = [
        "LOCK.ACQUIRE",
        "LOCK.RELEASE",
        "LOCK.EXTEND",
        "LOCK.FENCE",
        "LOCK.INFO",
        "LOCK._SET",
    ];
    let all = !known.iter().any(|name| is(name));
    if all || is("LOCK.ACQUIRE") {
        same(args::parse_acquire(&argv), spec_acquire(&argv));
    }
    if all || is("LOCK.RELEASE") {
        let spec = (argv.len() == 3).then(|| spec_token(argv[2])).flatten();
        same(args::parse_release(&argv), spec);
    }
    if all || is("LOCK.EXTEND") {
        same(args::parse_extend(&argv), spec_extend(&argv));
    }
    if all || is("LOCK.FENCE") {
        let spec = match argv.len() {
            2 => Some(None),
            3 => spec_token(argv[2]).map(Some),
            _ => None,
        };
        same(args::parse_fence(&argv), spec);
    }
    if all || is("LOCK.INFO") {
        same(args::parse_info(&argv), (argv.len() == 2).then_some(()));
    }
    if all || is("LOCK._SET") {
        same(args::parse_set(&argv), spec_set(&argv));
    }
}

/// The node the decoded values are checked against.
const NOW_US: i64 = 1_700_000_000_000_000;
const HWM: i64 = NOW_US + 1_000_000;

/// `decode_value`: the input is an encoding version (first byte) and the
/// bytes Redis stores for a module value. A value that decodes must keep
/// every invariant and survive re-encoding; a refusal must say why.
pub fn decode_value(data: &[u8]) {
    let Some((&encver, body)) = data.split_first() else {
        return;
    };
    let fences = FenceCounter::new(HWM);
    let check = |fence| fences.check(fence, NOW_US);
    let mut reader = RdbBytes::new(body);
    match codec::decode_value(i32::from(encver), &mut reader, check) {
        Ok(value) => {
            assert!((1..=3).contains(&encver));
            assert!(encver == 3 || value.mode == Mode::Exclusive);
            let count = value.holders.len();
            match value.mode {
                Mode::Exclusive => assert_eq!(count, 1),
                Mode::Shared { .. } => {
                    assert!((1..=codec::MAX_STORED_HOLDERS as usize).contains(&count))
                }
            }
            for holder in &value.holders {
                check_stored(holder, fences.max_acceptable(NOW_US));
            }
            let h = &value.holders[0];
            let again = match encver {
                1 => rdb_bytes::encode_value(&h.token, h.fence, h.deadline_ms),
                2 => rdb_bytes::encode_value_v2(&h.token, h.fence, h.deadline_ms, h.granted_ms),
                _ => {
                    let holders: Vec<(&[u8], i64, i64, i64)> = value
                        .holders
                        .iter()
                        .map(|h| (&h.token[..], h.fence, h.deadline_ms, h.granted_ms))
                        .collect();
                    rdb_bytes::encode_value_v3(value.mode, &holders)
                }
            };
            let mut reader = RdbBytes::new(&again);
            let decoded = codec::decode_value(i32::from(encver), &mut reader, check)
                .expect("re-encoded value");
            assert_eq!(decoded, value);
            assert!(reader.rest().is_empty());
        }
        Err(why) => {
            let msg = why.to_string();
            assert!(!msg.is_empty() && msg.len() < 200, "{msg:?}");
        }
    }
}

fn check_stored(value: &StoredLock<Vec<u8>>, max_fence: i64) {
    assert!((1..=MAX_TOKEN_LEN).contains(&value.token.len()));
    assert!((1..=max_fence).contains(&value.fence));
    assert!((0..=MAX_DEADLINE_MS).contains(&value.deadline_ms));
    assert!((0..=value.deadline_ms).contains(&value.granted_ms));
}

/// A parser's result against the reference reading: both accept with the
/// same values, or both refuse (with any well-formed error).
fn same<T: PartialEq + std::fmt::Debug>(parsed: Result<T, LockError>, spec: Option<T>) {
    match (parsed, spec) {
        (Ok(got), Some(want)) => assert_eq!(got, want),
        (Err(e), None) => check_error(&e),
        (got, want) => panic!("parser: {got:?}, reference: {want:?}"),
    }
}

/// Names the problem, in one short printable line, never echoing junk.
fn check_error(e: &LockError) {
    let msg = e.to_string();
    assert!(msg.starts_with("ERR ") && msg.len() > 12, "{msg:?}");
    assert!(msg.len() < 200, "{msg:?}");
    assert!(msg.bytes().all(|b| (0x20..0x7f).contains(&b)), "{msg:?}");
}

/// The reference for integers: what `i64`'s own parser accepts, written
/// back identically (so no '+', no leading zeros, no "-0").
fn canonical(s: &[u8]) -> Option<i64> {
    let v: i64 = std::str::from_utf8(s).ok()?.parse().ok()?;
    (v.to_string().as_bytes() == s).then_some(v)
}

fn check_parse_i64(s: &[u8]) {
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    let looks_integer = !digits.is_empty()
        && digits.iter().all(u8::is_ascii_digit)
        && (digits == b"0" || digits[0] != b'0')
        && s != b"-0";
    match (parse_i64(s), canonical(s)) {
        (Ok(got), Some(want)) => assert_eq!(got, want),
        (Err(IntError::OutOfRange), None) => assert!(looks_integer, "{s:?}"),
        (Err(IntError::NotInteger), None) => assert!(!looks_integer, "{s:?}"),
        (got, want) => panic!("{s:?}: parse_i64 {got:?}, reference {want:?}"),
    }
}

fn spec_token(t: &[u8]) -> Option<&[u8]> {
    (1..=MAX_TOKEN_LEN).contains(&t.len()).then_some(t)
}

fn in_range(arg: &[u8], range: std::ops::RangeInclusive<i64>) -> Option<i64> {
    canonical(arg).filter(|v| range.contains(v))
}

/// A lease as the parser reads it: a positive integer, one too large for
/// 64 bits read as the longest (the node's max-ttl rule refuses both).
fn spec_ttl(arg: &[u8]) -> Option<i64> {
    let positive_digits = !arg.is_empty() && arg.iter().all(u8::is_ascii_digit) && arg[0] != b'0';
    match canonical(arg) {
        Some(v) => (v > 0).then_some(v),
        None => positive_digits.then_some(i64::MAX),
    }
}

/// `LOCK.ACQUIRE key token ttl-ms [BLOCK timeout-ms] [MINFENCE n]`: each
/// option at most once, in any order and case.
fn spec_acquire<'a>(argv: &[&'a [u8]]) -> Option<AcquireArgs<'a>> {
    let [_, _, token, ttl, options @ ..] = argv else {
        return None;
    };
    let mut parsed = AcquireArgs {
        token: spec_token(token)?,
        ttl_ms: spec_ttl(ttl)?,
        mode: Mode::Exclusive,
        block_ms: None,
        min_fence: 0,
        value: None,
    };
    let (mut shared, mut limit) = (false, None);
    let mut rest = options;
    while let [word, after @ ..] = rest {
        if word.eq_ignore_ascii_case(b"shared") && !shared {
            shared = true;
            rest = after;
            continue;
        }
        let [value, after @ ..] = after else {
            return None;
        };
        if word.eq_ignore_ascii_case(b"block") && parsed.block_ms.is_none() {
            parsed.block_ms = Some(in_range(value, 0..=MAX_DURATION_MS)?);
        } else if word.eq_ignore_ascii_case(b"minfence") && parsed.min_fence == 0 {
            parsed.min_fence = in_range(value, 1..=i64::MAX)?;
        } else if word.eq_ignore_ascii_case(b"limit") && limit.is_none() {
            limit = Some(in_range(value, 1..=codec::MAX_STORED_HOLDERS)? as u32);
        } else if word.eq_ignore_ascii_case(b"value") && parsed.value.is_none() {
            parsed.value = Some(*value).filter(|v| v.len() <= crate::limits::MAX_VALUE_LEN);
            parsed.value?;
        } else {
            return None;
        }
        rest = after;
    }
    parsed.mode = match (shared, limit) {
        (false, Some(_)) => return None,
        (true, _) if parsed.value.is_some() => return None,
        (false, None) => Mode::Exclusive,
        (true, limit) => Mode::Shared { limit },
    };
    Some(parsed)
}

fn spec_extend<'a>(argv: &[&'a [u8]]) -> Option<ExtendArgs<'a>> {
    let (token, ttl, value) = match argv {
        [_, _, token, ttl] => (token, ttl, None),
        [_, _, token, ttl, word, value] if word.eq_ignore_ascii_case(b"value") => {
            (token, ttl, Some(*value))
        }
        _ => return None,
    };
    if value.is_some_and(|v| v.len() > crate::limits::MAX_VALUE_LEN) {
        return None;
    }
    Some(ExtendArgs {
        token: spec_token(token)?,
        ttl_ms: spec_ttl(ttl)?,
        value,
    })
}

fn spec_set<'a>(argv: &[&'a [u8]]) -> Option<SetArgs<'a>> {
    let (token, fence, deadline, granted, value) = match argv {
        [_, _, token, fence, deadline] => (token, fence, deadline, None, None),
        [_, _, token, fence, deadline, granted] => (token, fence, deadline, Some(granted), None),
        [_, _, token, fence, deadline, granted, value] => {
            (token, fence, deadline, Some(granted), Some(value))
        }
        _ => return None,
    };
    let deadline_ms = in_range(deadline, 0..=MAX_DEADLINE_MS)?;
    let value: &[u8] = value.map_or(&[][..], |v| &v[..]);
    if value.len() > crate::limits::MAX_VALUE_LEN {
        return None;
    }
    Some(SetArgs {
        token: spec_token(token)?,
        value,
        fence: in_range(fence, 1..=i64::MAX)?,
        deadline_ms,
        granted_ms: match granted {
            None => 0,
            // After the deadline: unknown (an earlier build's write).
            Some(g) => in_range(g, 0..=i64::MAX).map(|g| if g > deadline_ms { 0 } else { g })?,
        },
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every seed of both targets passes, and there are enough of them.
    #[test]
    fn the_fuzz_targets_pass_on_their_seed_corpus() {
        let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
        type Target = fn(&[u8]);
        let targets: [(&str, Target); 2] = [
            ("parse_args", super::parse_args),
            ("decode_value", super::decode_value),
        ];
        for (target, run) in targets {
            let dir = corpus.join(target);
            let mut seeds = 0;
            for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
                let path = entry.unwrap().path();
                let data = std::fs::read(&path).unwrap();
                let outcome = std::panic::catch_unwind(|| run(&data));
                assert!(outcome.is_ok(), "{target} fails on the seed {path:?}");
                seeds += 1;
            }
            assert!(seeds >= 20, "{target}: only {seeds} seeds in {dir:?}");
        }
    }
}
