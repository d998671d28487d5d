//! The persisted form of a lock value, decoded and validated without Redis.
//!
//! A value is the token (`RM_SaveStringBuffer`), the fence and the deadline
//! (`RM_SaveSigned`), and from encoding version 2 the grant time
//! (`RM_SaveSigned`); from version 3 those four fields are one holder's,
//! after the key's mode and holder count (`RM_SaveSigned` each); from
//! version 4 each holder ends with its public value (`RM_SaveStringBuffer`,
//! empty for none); the format table is in `redis::datatype`. [`decode_value`] reads them through a [`ValueReader`]
//! and checks them; it is the only decoder: the module's `rdb_load` runs it
//! over the `RedisModuleIO` Redis hands it, and the fuzzer (`fuzz/`) and the
//! unit tests run it over `rdb_bytes::RdbBytes`, which reads the very bytes Redis
//! writes for a module value: module opcodes, RDB length encodings, and
//! strings stored plain, as integers or LZF-compressed. So a damaged RDB,
//! AOF preamble or `RESTORE` payload reaches the same checks under the
//! fuzzer as in the server.

use std::fmt;

use super::error::LockError;
use super::limits::{MAX_DEADLINE_MS, MAX_TOKEN_LEN, MAX_VALUE_LEN};
use super::lock::Mode;
use super::time::known_grant;

/// The newest value encoding this build reads and the one it writes.
pub const ENCODING_VERSION: i32 = 4;

pub use crate::limits::MAX_STORED_HOLDERS;

/// A key's mode as version 3 writes it: 0 exclusive, -1 shared without a
/// limit, n ≥ 1 shared with limit n.
pub fn mode_word(mode: Mode) -> i64 {
    match mode {
        Mode::Exclusive => 0,
        Mode::Shared { limit: None } => -1,
        Mode::Shared { limit: Some(n) } => i64::from(n),
    }
}

/// The mode a version-3 mode word stands for.
pub fn mode_of_word(word: i64) -> Option<Mode> {
    match word {
        0 => Some(Mode::Exclusive),
        -1 => Some(Mode::Shared { limit: None }),
        n => u32::try_from(n)
            .ok()
            .filter(|&n| n >= 1)
            .map(|n| Mode::Shared { limit: Some(n) }),
    }
}

/// A read ran past the data, or the data there is not what the field needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated;

/// Where [`decode_value`] reads the fields from.
pub trait ValueReader {
    type Bytes: AsRef<[u8]>;
    /// A string saved with `RM_SaveStringBuffer`.
    fn string_buffer(&mut self) -> Result<Self::Bytes, Truncated>;
    /// A number saved with `RM_SaveSigned`.
    fn signed(&mut self) -> Result<i64, Truncated>;
}

/// A decoded value that passed every check: its mode and its holders
/// (exactly one when exclusive; distinct tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredValue<B> {
    pub mode: Mode,
    pub holders: Vec<StoredLock<B>>,
}

/// One holder of a decoded value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLock<B> {
    pub token: B,
    pub fence: i64,
    pub deadline_ms: i64,
    /// 0 when unknown (encoding version 1).
    pub granted_ms: i64,
    /// The public value (None before encoding version 4; may be empty).
    pub value: Option<B>,
}

/// Why a value is refused. Displayed in the server log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Saved by a newer build (or garbage where the version is).
    Version(i32),
    /// A short read, or bytes that are not the field Redis expects there.
    Truncated,
    TokenLength(usize),
    /// A public value longer than `MAX_VALUE_LEN` (version 4).
    ValueLength(usize),
    Deadline(i64),
    /// A negative grant time.
    Granted(i64),
    Fence(i64, LockError),
    /// A mode word that is none (version 3).
    Mode(i64),
    /// A holder count out of range for the mode (version 3).
    Holders(i64),
    /// Two holders with one token (version 3).
    DuplicateToken,
    /// A holder of a shared key with a public value (version 4): a value
    /// names a leader, an exclusive holder; no command of this module
    /// writes one, and an AOF rewrite (`LOCK._SHARED`) would drop it.
    SharedValue,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Version(v) => write!(
                f,
                "it was saved with encoding version {v}; this build reads 1 to {ENCODING_VERSION}"
            ),
            DecodeError::Truncated => write!(f, "the payload is truncated or damaged"),
            DecodeError::TokenLength(n) => {
                write!(f, "a token of {n} bytes (1 to {MAX_TOKEN_LEN} allowed)")
            }
            DecodeError::ValueLength(n) => {
                write!(f, "a value of {n} bytes (at most {MAX_VALUE_LEN} allowed)")
            }
            DecodeError::Deadline(d) => write!(f, "deadline {d} is out of range"),
            DecodeError::Granted(g) => {
                write!(f, "grant time {g} is out of range")
            }
            DecodeError::Fence(fence, why) => write!(f, "fence {fence}: {why}"),
            DecodeError::Mode(word) => write!(f, "mode {word} is none this build knows"),
            DecodeError::Holders(n) => write!(
                f,
                "{n} holders (1 when exclusive, 1 to {MAX_STORED_HOLDERS} when shared)"
            ),
            DecodeError::DuplicateToken => write!(f, "two holders have one token"),
            DecodeError::SharedValue => {
                write!(
                    f,
                    "a holder of a shared key has a value (only a leader has one)"
                )
            }
        }
    }
}

impl From<Truncated> for DecodeError {
    fn from(_: Truncated) -> Self {
        DecodeError::Truncated
    }
}

/// Reads and checks one value of encoding version `encver`. `check_fence`
/// says whether the node accepts a fence (its bound depends on the node's
/// mark and clock). Every field is read before anything is checked, as the
/// format has no way to skip a field (only a version-3 count is checked
/// before its holders are read, so a damaged one allocates nothing).
pub fn decode_value<R: ValueReader>(
    encver: i32,
    reader: &mut R,
    mut check_fence: impl FnMut(i64) -> Result<(), LockError>,
) -> Result<StoredValue<R::Bytes>, DecodeError> {
    if !(1..=ENCODING_VERSION).contains(&encver) {
        return Err(DecodeError::Version(encver));
    }
    if encver < 3 {
        let holder = decode_holder(encver, reader, &mut check_fence)?;
        return Ok(StoredValue {
            mode: Mode::Exclusive,
            holders: vec![holder],
        });
    }
    let word = reader.signed()?;
    let count = reader.signed()?;
    let mode = mode_of_word(word).ok_or(DecodeError::Mode(word))?;
    let most = match mode {
        Mode::Exclusive => 1,
        Mode::Shared { .. } => MAX_STORED_HOLDERS,
    };
    if !(1..=most).contains(&count) {
        return Err(DecodeError::Holders(count));
    }
    let mut holders: Vec<StoredLock<R::Bytes>> = Vec::new();
    for _ in 0..count {
        holders.push(decode_holder(encver, reader, &mut check_fence)?);
    }
    let mut tokens: Vec<&[u8]> = holders.iter().map(|h| h.token.as_ref()).collect();
    tokens.sort_unstable();
    if tokens.windows(2).any(|w| w[0] == w[1]) {
        return Err(DecodeError::DuplicateToken);
    }
    let has_value =
        |h: &StoredLock<R::Bytes>| h.value.as_ref().is_some_and(|v| !v.as_ref().is_empty());
    if mode.is_shared() && holders.iter().any(has_value) {
        return Err(DecodeError::SharedValue);
    }
    Ok(StoredValue { mode, holders })
}

/// One holder's five fields (four before version 4, three before version
/// 2), checked.
fn decode_holder<R: ValueReader>(
    encver: i32,
    reader: &mut R,
    check_fence: &mut impl FnMut(i64) -> Result<(), LockError>,
) -> Result<StoredLock<R::Bytes>, DecodeError> {
    let token = reader.string_buffer()?;
    let fence = reader.signed()?;
    let deadline_ms = reader.signed()?;
    let granted_ms = if encver >= 2 { reader.signed()? } else { 0 };
    let value = match encver >= 4 {
        true => Some(reader.string_buffer()?),
        false => None,
    };
    if let Some(n) = value.as_ref().map(|v| v.as_ref().len()) {
        if n > MAX_VALUE_LEN {
            return Err(DecodeError::ValueLength(n));
        }
    }
    let len = token.as_ref().len();
    if len == 0 || len > MAX_TOKEN_LEN {
        return Err(DecodeError::TokenLength(len));
    }
    if !(0..=MAX_DEADLINE_MS).contains(&deadline_ms) {
        return Err(DecodeError::Deadline(deadline_ms));
    }
    if granted_ms < 0 {
        return Err(DecodeError::Granted(granted_ms));
    }
    // One after the deadline is taken as unknown (see time::known_grant).
    let granted_ms = known_grant(granted_ms, deadline_ms).unwrap_or(0);
    check_fence(fence).map_err(|e| DecodeError::Fence(fence, e))?;
    Ok(StoredLock {
        token,
        fence,
        deadline_ms,
        granted_ms,
        value,
    })
}

/// The extra bound on a value that arrives by `RESTORE` (not by loading an
/// RDB, an AOF preamble or a full sync): its fence may lie at most
/// `MAX_FENCE_LEAD` above the clock, not above the node's mark. Restored
/// fences raise the mark, so a bound that moved with the mark would let
/// repeated `RESTORE`s ratchet it to `i64::MAX` in about 8,200 steps.
pub fn check_restored_fence(fence: i64, now_us: i64) -> Result<(), LockError> {
    if !crate::fence::within_clock_lead(fence, now_us) {
        return Err(LockError::BadFence(
            "a RESTOREd token more than 2^50 above the clock",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::FenceCounter;
    use crate::limits::MAX_FENCE_LEAD;
    use crate::rdb_bytes::{
        encode_value, encode_value_v2, encode_value_v3, encode_value_v4, lzf_decompress, RdbBytes,
        OPCODE_STRING, OPCODE_UINT,
    };

    const NOW_US: i64 = 1_700_000_000_000_000;

    fn accept(fence: i64) -> Result<(), LockError> {
        FenceCounter::new(0).check(fence, NOW_US)
    }

    fn decode(bytes: &[u8]) -> Result<StoredLock<Vec<u8>>, DecodeError> {
        one(decode_value(1, &mut RdbBytes::new(bytes), accept))
    }

    /// The one holder of an exclusive value.
    fn one<B>(v: Result<StoredValue<B>, DecodeError>) -> Result<StoredLock<B>, DecodeError> {
        v.map(|v| {
            assert_eq!((v.mode, v.holders.len()), (Mode::Exclusive, 1));
            v.holders.into_iter().next().unwrap()
        })
    }

    /// The value part of a DUMP payload: after the type byte and the 9-byte
    /// module id, before the EOF opcode, RDB version and CRC64.
    fn dump_value(payload: &[u8]) -> &[u8] {
        &payload[10..payload.len() - 11]
    }

    /// `DUMP` of `LOCK.ACQUIRE k tok 100000` from Redis 7.0.15.
    const DUMP_PLAIN: &[u8] = b"\x07\x81\xad\xe7b\xb2Z\x1c\x90\x01\x05\x03tok\x02\x81\x00\x06`\xec\x10C\x99\xa1\x02\x81\x00\x00\x01\xa2\x070\xb2\x8d\x00\n\x00\xd7\xb0.\x8b\x13\x82dp";
    /// The token "12345": stored as a 16-bit integer.
    const DUMP_INT: &[u8] = b"\x07\x81\xad\xe7b\xb2Z\x1c\x90\x01\x05\xc190\x02\x81\x00\x06`\xec\x10C\xc0\xce\x02\x81\x00\x00\x01\xa2\x070\xb2\x98\x00\n\x00\xf6\xc3\x89\xf5#.W ";
    /// A token of 38 'a's: stored LZF-compressed.
    const DUMP_LZF: &[u8] = b"\x07\x81\xad\xe7b\xb2Z\x1c\x90\x01\x05\xc3\t&\x01aa\xe0\x19\x00\x01aa\x02\x81\x00\x06`\xec\x10C\xe0\xf6\x02\x81\x00\x00\x01\xa2\x070\xb2\xa0\x00\n\x00!\x1e\xd0\x1d-\xa4S\x95";

    #[test]
    fn decodes_what_redis_wrote() {
        let plain = decode(dump_value(DUMP_PLAIN)).unwrap();
        assert_eq!(plain.token, b"tok");
        assert_eq!(plain.fence, 1_795_416_861_677_985);
        assert_eq!(plain.deadline_ms, 0x0000_01a2_0730_b28d);
        assert_eq!(decode(dump_value(DUMP_INT)).unwrap().token, b"12345");
        assert_eq!(decode(dump_value(DUMP_LZF)).unwrap().token, [b'a'; 38]);
    }

    #[test]
    fn encodes_as_redis_does_and_round_trips() {
        let v = decode(dump_value(DUMP_PLAIN)).unwrap();
        assert_eq!(
            encode_value(&v.token, v.fence, v.deadline_ms),
            dump_value(DUMP_PLAIN)
        );
        let v = decode(dump_value(DUMP_INT)).unwrap();
        assert_eq!(
            encode_value(&v.token, v.fence, v.deadline_ms),
            dump_value(DUMP_INT)
        );
        for token in [
            &b"x"[..],
            b"-1",
            b"127",
            b"128",
            b"-32769",
            b"2147483647",
            b"2147483648",
            b"007",
            b"-0",
            &[0; 64],
            &[0xff; 512],
        ] {
            for (fence, deadline) in [
                (1, 0),
                (63, 64),
                (16_383, 16_384),
                (i64::MAX, MAX_DEADLINE_MS),
            ] {
                let bytes = encode_value(token, fence, deadline);
                let v = one(decode_value(1, &mut RdbBytes::new(&bytes), |_| Ok(()))).unwrap();
                assert_eq!(
                    (&v.token[..], v.fence, v.deadline_ms),
                    (token, fence, deadline)
                );
            }
        }
    }

    /// Version 2 adds the grant time; a version 1 value (an RDB or DUMP
    /// from an earlier build) still loads, with the grant time unknown (0).
    #[test]
    fn version_2_carries_the_grant_time_and_version_1_still_loads() {
        let v1 = decode(dump_value(DUMP_PLAIN)).unwrap();
        assert_eq!(v1.granted_ms, 0);
        let granted = v1.deadline_ms - 100_000;
        let bytes = encode_value_v2(&v1.token, v1.fence, v1.deadline_ms, granted);
        let v2 = one(decode_value(2, &mut RdbBytes::new(&bytes), accept)).unwrap();
        assert_eq!(
            (v2.token, v2.fence, v2.deadline_ms, v2.granted_ms),
            (v1.token.clone(), v1.fence, v1.deadline_ms, granted)
        );
        // Read as version 2, a version 1 value is short by one field.
        assert_eq!(
            one(decode_value(
                2,
                &mut RdbBytes::new(dump_value(DUMP_PLAIN)),
                accept
            )),
            Err(DecodeError::Truncated)
        );
        // A grant time after the deadline (an earlier build's write after a
        // wall-clock step) loads as unknown; a negative one is refused.
        let late = encode_value_v2(&v1.token, v1.fence, 5, 6);
        let loaded = one(decode_value(2, &mut RdbBytes::new(&late), accept)).unwrap();
        assert_eq!((loaded.deadline_ms, loaded.granted_ms), (5, 0));
        let negative = encode_value_v2(&v1.token, v1.fence, 5, -1);
        assert_eq!(
            one(decode_value(2, &mut RdbBytes::new(&negative), accept)),
            Err(DecodeError::Granted(-1))
        );
        assert_eq!(
            decode_value(5, &mut RdbBytes::new(&bytes), accept),
            Err(DecodeError::Version(5))
        );
    }

    /// Version 4 ends each holder with its public value (empty: none);
    /// version 3 values still load, without one.
    #[test]
    fn version_4_carries_each_holders_value() {
        let holders = [(
            &b"tok"[..],
            5,
            1_700_000_000_000,
            1_699_999_990_000,
            &b"10.0.0.7:6379"[..],
        )];
        let bytes = encode_value_v4(Mode::Exclusive, &holders);
        let v = one(decode_value(4, &mut RdbBytes::new(&bytes), accept)).unwrap();
        assert_eq!(v.value.as_deref(), Some(&b"10.0.0.7:6379"[..]));
        let v3 = encode_value_v3(Mode::Exclusive, &[(b"tok", 5, 1_700_000_000_000, 0)]);
        let old = one(decode_value(3, &mut RdbBytes::new(&v3), accept)).unwrap();
        assert_eq!(old.value, None);
        // Read as version 4, a version 3 value is short by one field.
        assert_eq!(
            decode_value(4, &mut RdbBytes::new(&v3), accept),
            Err(DecodeError::Truncated)
        );
        let long = vec![b'v'; MAX_VALUE_LEN + 1];
        let too_long = encode_value_v4(Mode::Exclusive, &[(b"t", 5, 6, 0, &long[..])]);
        assert_eq!(
            decode_value(4, &mut RdbBytes::new(&too_long), accept),
            Err(DecodeError::ValueLength(MAX_VALUE_LEN + 1))
        );
        // A shared key's holders carry none (an empty one is none); a
        // crafted payload with one is refused, not loaded for an AOF
        // rewrite to drop.
        let shared = Mode::Shared { limit: None };
        let none = encode_value_v4(shared, &[(b"r1", 5, 6, 0, &b""[..]), (b"r2", 7, 8, 0, b"")]);
        assert_eq!(
            decode_value(4, &mut RdbBytes::new(&none), accept).map(|v| v.holders.len()),
            Ok(2)
        );
        let valued = encode_value_v4(
            shared,
            &[(b"r1", 5, 6, 0, &b""[..]), (b"r2", 7, 8, 0, b"v")],
        );
        assert_eq!(
            decode_value(4, &mut RdbBytes::new(&valued), accept).map(|v| v.holders.len()),
            Err(DecodeError::SharedValue)
        );
    }

    #[test]
    fn refuses_every_truncation_and_names_the_problem() {
        let value = dump_value(DUMP_PLAIN);
        for len in 0..value.len() {
            assert_eq!(
                decode(&value[..len]).unwrap_err(),
                DecodeError::Truncated,
                "{len}"
            );
        }
        let msg = decode(b"").unwrap_err().to_string();
        assert_eq!(msg, "the payload is truncated or damaged");
    }

    #[test]
    fn refuses_values_that_break_the_invariants() {
        let ok_deadline = 1_700_000_000_000;
        assert_eq!(
            decode(&encode_value(b"", 5, ok_deadline)).unwrap_err(),
            DecodeError::TokenLength(0)
        );
        assert_eq!(
            decode(&encode_value(&[1; 513], 5, ok_deadline)).unwrap_err(),
            DecodeError::TokenLength(513)
        );
        assert_eq!(
            decode(&encode_value(b"t", 5, -1)).unwrap_err(),
            DecodeError::Deadline(-1)
        );
        assert_eq!(
            decode(&encode_value(b"t", 5, MAX_DEADLINE_MS + 1)).unwrap_err(),
            DecodeError::Deadline(MAX_DEADLINE_MS + 1)
        );
        for fence in [0, -1, i64::MIN, NOW_US + MAX_FENCE_LEAD + 1, i64::MAX] {
            let err = decode(&encode_value(b"t", fence, ok_deadline)).unwrap_err();
            assert!(
                matches!(err, DecodeError::Fence(f, _) if f == fence),
                "{err}"
            );
            assert!(err.to_string().starts_with(&format!("fence {fence}: ")));
        }
        decode(&encode_value(b"t", NOW_US + MAX_FENCE_LEAD, ok_deadline)).unwrap();
        let err = decode_value(5, &mut RdbBytes::new(b""), accept).unwrap_err();
        assert_eq!(err, DecodeError::Version(5));
        assert!(err.to_string().contains("encoding version 5"));
    }

    #[test]
    fn refuses_damaged_encodings() {
        let good = encode_value(b"tok", 5, 6);
        // Opcodes: a number where the string is, a string where a number is.
        assert!(decode(&[&[2u8, 5][..], &good[5..]].concat()).is_err());
        let mut swapped = good.clone();
        swapped[5] = OPCODE_STRING as u8;
        assert!(decode(&swapped).is_err());
        // Lengths: reserved encodings, all ones, far beyond the data.
        for bad_len in [
            &[0x82u8][..],
            &[0xbf],
            &[0xc4],
            &[0x81, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ] {
            let bytes = [&[5u8][..], bad_len, b"tok", &good[5..]].concat();
            assert_eq!(decode(&bytes).unwrap_err(), DecodeError::Truncated);
        }
        let huge = [&[5u8, 0x80, 0x7f, 0xff, 0xff, 0xff][..], b"tok", &good[5..]].concat();
        assert_eq!(decode(&huge).unwrap_err(), DecodeError::Truncated);
        // An opcode written as a special encoding reads as its number, as
        // in rdbLoadLen.
        let mut enc_opcode = good.clone();
        enc_opcode[5] = 0xc0 | OPCODE_UINT as u8;
        assert_eq!(decode(&enc_opcode).unwrap().fence, 5);
    }

    #[test]
    fn lzf_follows_liblzf() {
        // The 38 'a's of DUMP_LZF.
        let c = b"\x01aa\xe0\x19\x00\x01aa";
        assert_eq!(lzf_decompress(c, 38).unwrap(), [b'a'; 38]);
        assert_eq!(lzf_decompress(c, 37), None, "more output than claimed");
        assert_eq!(lzf_decompress(c, 39), None, "less output than claimed");
        assert_eq!(lzf_decompress(c, u64::MAX), None);
        assert_eq!(
            lzf_decompress(b"\x20\x00", 2),
            None,
            "reference before the start"
        );
        assert_eq!(lzf_decompress(b"\x05ab", 6), None, "literal past the input");
        assert_eq!(lzf_decompress(b"\x00a\xe0", 10), None, "cut back reference");
        assert_eq!(lzf_decompress(b"", 0), Some(vec![]));
    }

    #[test]
    fn restored_fences_are_bounded_by_the_clock_not_the_mark() {
        check_restored_fence(NOW_US + MAX_FENCE_LEAD, NOW_US).unwrap();
        assert!(check_restored_fence(NOW_US + MAX_FENCE_LEAD + 1, NOW_US).is_err());
        assert!(check_restored_fence(i64::MAX, i64::MAX - 5).is_ok());
    }

    /// Version 3: the mode and the holder count, then each holder as
    /// version 2 writes one; exclusive values have exactly one.
    #[test]
    fn version_3_carries_the_mode_and_every_holder() {
        let now_ms = NOW_US / 1000;
        let h = |t: &'static [u8], f: i64| (t, f, now_ms + 500, now_ms);
        let limit = Mode::Shared { limit: Some(3) };
        let bytes = encode_value_v3(limit, &[h(b"a", 7), h(b"b", 9)]);
        let v = decode_value(3, &mut RdbBytes::new(&bytes), accept).unwrap();
        assert_eq!(v.mode, limit);
        let tokens: Vec<&[u8]> = v.holders.iter().map(|h| &h.token[..]).collect();
        assert_eq!(tokens, [&b"a"[..], b"b"]);
        assert_eq!(v.holders[1].fence, 9);
        for mode in [Mode::Exclusive, Mode::Shared { limit: None }] {
            let bytes = encode_value_v3(mode, &[h(b"a", 7)]);
            let v = decode_value(3, &mut RdbBytes::new(&bytes), accept).unwrap();
            assert_eq!((v.mode, v.holders.len()), (mode, 1));
        }
        let bad = |bytes: Vec<u8>| decode_value(3, &mut RdbBytes::new(&bytes), accept);
        assert_eq!(
            bad(encode_value_v3(Mode::Exclusive, &[h(b"a", 7), h(b"b", 9)])),
            Err(DecodeError::Holders(2)),
            "two holders of an exclusive key"
        );
        assert_eq!(
            bad(encode_value_v3(limit, &[])),
            Err(DecodeError::Holders(0))
        );
        assert_eq!(
            bad(encode_value_v3(limit, &[h(b"a", 7), h(b"a", 9)])),
            Err(DecodeError::DuplicateToken)
        );
        for word in [-2i64, i64::from(u32::MAX) + 1] {
            let mut bytes = Vec::new();
            bytes.extend(crate::rdb_bytes::encode_signed(word));
            bytes.extend(crate::rdb_bytes::encode_signed(1));
            bytes.extend(encode_value_v2(b"a", 7, now_ms + 500, now_ms));
            assert_eq!(bad(bytes), Err(DecodeError::Mode(word)));
        }
        let huge = [
            crate::rdb_bytes::encode_signed(-1),
            crate::rdb_bytes::encode_signed(MAX_STORED_HOLDERS + 1),
        ]
        .concat();
        assert_eq!(bad(huge), Err(DecodeError::Holders(MAX_STORED_HOLDERS + 1)));
        // Every truncation is refused.
        let bytes = encode_value_v3(limit, &[h(b"a", 7), h(b"b", 9)]);
        for len in 0..bytes.len() {
            assert!(bad(bytes[..len].to_vec()).is_err(), "{len}");
        }
    }
}
