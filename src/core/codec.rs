//! The persisted form of a lock value, decoded and validated without Redis.
//!
//! A value is the token (`RM_SaveStringBuffer`), the fence and the deadline
//! (`RM_SaveSigned`), and from encoding version 2 the grant time
//! (`RM_SaveSigned`); the format table is in `redis::datatype`. [`decode_value`] reads them through a [`ValueReader`]
//! and checks them; it is the only decoder: the module's `rdb_load` runs it
//! over the `RedisModuleIO` Redis hands it, and the fuzzer (`fuzz/`) and the
//! unit tests run it over [`RdbBytes`], which reads the very bytes Redis
//! writes for a module value: module opcodes, RDB length encodings, and
//! strings stored plain, as integers or LZF-compressed. So a damaged RDB,
//! AOF preamble or `RESTORE` payload reaches the same checks under the
//! fuzzer as in the server.

use std::fmt;

use super::args::parse_i64;
use super::error::LockError;
use super::limits::{MAX_DEADLINE_MS, MAX_TOKEN_LEN};

/// The newest value encoding this build reads and the one it writes.
pub const ENCODING_VERSION: i32 = 2;

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

/// A decoded value that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLock<B> {
    pub token: B,
    pub fence: i64,
    pub deadline_ms: i64,
    /// 0 when unknown (encoding version 1).
    pub granted_ms: i64,
}

/// Why a value is refused. Displayed in the server log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Saved by a newer build (or garbage where the version is).
    Version(i32),
    /// A short read, or bytes that are not the field Redis expects there.
    Truncated,
    TokenLength(usize),
    Deadline(i64),
    /// A grant time after the deadline, or out of range.
    Granted(i64),
    Fence(i64, LockError),
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
            DecodeError::Deadline(d) => write!(f, "deadline {d} is out of range"),
            DecodeError::Granted(g) => {
                write!(f, "grant time {g} is out of range or after the deadline")
            }
            DecodeError::Fence(fence, why) => write!(f, "fence {fence}: {why}"),
        }
    }
}

impl From<Truncated> for DecodeError {
    fn from(_: Truncated) -> Self {
        DecodeError::Truncated
    }
}

/// Reads and checks one value of encoding version `encver`. `check_fence`
/// says whether the node accepts the fence (its bound depends on the node's
/// mark and clock). Every field is read before anything is checked, as the
/// format has no way to skip a field.
pub fn decode_value<R: ValueReader>(
    encver: i32,
    reader: &mut R,
    check_fence: impl FnOnce(i64) -> Result<(), LockError>,
) -> Result<StoredLock<R::Bytes>, DecodeError> {
    if !(1..=ENCODING_VERSION).contains(&encver) {
        return Err(DecodeError::Version(encver));
    }
    let token = reader.string_buffer()?;
    let fence = reader.signed()?;
    let deadline_ms = reader.signed()?;
    let granted_ms = if encver >= 2 { reader.signed()? } else { 0 };
    let len = token.as_ref().len();
    if len == 0 || len > MAX_TOKEN_LEN {
        return Err(DecodeError::TokenLength(len));
    }
    if !(0..=MAX_DEADLINE_MS).contains(&deadline_ms) {
        return Err(DecodeError::Deadline(deadline_ms));
    }
    if !(0..=deadline_ms).contains(&granted_ms) {
        return Err(DecodeError::Granted(granted_ms));
    }
    check_fence(fence).map_err(|e| DecodeError::Fence(fence, e))?;
    Ok(StoredLock {
        token,
        fence,
        deadline_ms,
        granted_ms,
    })
}

/// The extra bound on a value that arrives by `RESTORE` (not by loading an
/// RDB, an AOF preamble or a full sync): its fence may lie at most
/// `MAX_FENCE_LEAD` above the clock, not above the node's mark. Restored
/// fences raise the mark, so a bound that moved with the mark would let
/// repeated `RESTORE`s ratchet it to `i64::MAX` in about 8,200 steps.
pub fn check_restored_fence(fence: i64, now_us: i64) -> Result<(), LockError> {
    if !crate::core::fence::within_clock_lead(fence, now_us) {
        return Err(LockError::BadFence(
            "a RESTOREd token more than 2^50 above the clock",
        ));
    }
    Ok(())
}

// Redis's RDB encoding of a module value (rdb.h, module.c).
const OPCODE_UINT: u64 = 2;
const OPCODE_STRING: u64 = 5;
const ENC_INT8: u64 = 0;
const ENC_INT16: u64 = 1;
const ENC_INT32: u64 = 2;
const ENC_LZF: u64 = 3;
/// `rdbLoadLen`'s error value: a length of all ones is refused.
const LEN_ERR: u64 = u64::MAX;

/// Reads a module value from the bytes Redis stores for it (an RDB file, an
/// AOF preamble, or a `DUMP` payload between its 10-byte header and the
/// EOF opcode), exactly as Redis's loaders accept them.
#[derive(Debug, Clone)]
pub struct RdbBytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> RdbBytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        RdbBytes { data, pos: 0 }
    }

    /// What has not been read yet.
    pub fn rest(&self) -> &'a [u8] {
        &self.data[self.pos..]
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], Truncated> {
        let rest = self.rest();
        if n > rest.len() as u64 {
            return Err(Truncated);
        }
        let n = n as usize;
        self.pos += n;
        Ok(&rest[..n])
    }

    fn byte(&mut self) -> Result<u8, Truncated> {
        Ok(self.take(1)?[0])
    }

    /// `rdbLoadLenByRef`: a length, or (second field true) the number of a
    /// special string encoding.
    fn length(&mut self) -> Result<(u64, bool), Truncated> {
        let first = self.byte()?;
        Ok(match first >> 6 {
            0 => (u64::from(first & 0x3f), false),
            1 => {
                let second = self.byte()?;
                (u64::from(first & 0x3f) << 8 | u64::from(second), false)
            }
            3 => (u64::from(first & 0x3f), true),
            _ if first == 0x80 => {
                let b = self.take(4)?;
                (
                    u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
                    false,
                )
            }
            _ if first == 0x81 => {
                let mut b = [0; 8];
                b.copy_from_slice(self.take(8)?);
                (u64::from_be_bytes(b), false)
            }
            _ => return Err(Truncated),
        })
    }

    /// `rdbLoadLen(rdb, NULL)`: a special encoding reads as its number.
    fn plain_length(&mut self) -> Result<u64, Truncated> {
        match self.length()?.0 {
            LEN_ERR => Err(Truncated),
            n => Ok(n),
        }
    }

    fn opcode(&mut self, expected: u64) -> Result<(), Truncated> {
        if self.plain_length()? != expected {
            return Err(Truncated);
        }
        Ok(())
    }

    /// `rdbLoadIntegerObject`: little-endian, sign-extended, as decimal text.
    fn integer(&mut self, width: u64) -> Result<Vec<u8>, Truncated> {
        let b = self.take(width)?;
        let value = match b.len() {
            1 => i64::from(b[0] as i8),
            2 => i64::from(i16::from_le_bytes([b[0], b[1]])),
            _ => i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        };
        Ok(value.to_string().into_bytes())
    }

    /// `rdbLoadLzfStringObject`.
    fn lzf(&mut self) -> Result<Vec<u8>, Truncated> {
        let compressed_len = self.plain_length()?;
        let len = self.plain_length()?;
        let compressed = self.take(compressed_len)?;
        lzf_decompress(compressed, len).ok_or(Truncated)
    }
}

impl ValueReader for RdbBytes<'_> {
    type Bytes = Vec<u8>;

    /// `moduleLoadString` with `RDB_LOAD_PLAIN`.
    fn string_buffer(&mut self) -> Result<Vec<u8>, Truncated> {
        self.opcode(OPCODE_STRING)?;
        match self.length()? {
            (LEN_ERR, false) => Err(Truncated),
            (len, false) => Ok(self.take(len)?.to_vec()),
            (ENC_INT8, true) => self.integer(1),
            (ENC_INT16, true) => self.integer(2),
            (ENC_INT32, true) => self.integer(4),
            (ENC_LZF, true) => self.lzf(),
            (_, true) => Err(Truncated),
        }
    }

    /// `RM_LoadUnsigned`, reinterpreted as signed like `RM_LoadSigned`.
    fn signed(&mut self) -> Result<i64, Truncated> {
        self.opcode(OPCODE_UINT)?;
        Ok(self.length()?.0 as i64)
    }
}

/// liblzf's `lzf_decompress` into exactly `len` bytes (Redis refuses any
/// other result). None for malformed input. Output is built as it is
/// decoded, so a huge claimed `len` allocates nothing up front.
pub fn lzf_decompress(input: &[u8], len: u64) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < input.len() {
        let ctrl = usize::from(input[i]);
        i += 1;
        if ctrl < 32 {
            // A literal run of ctrl + 1 bytes.
            let run = ctrl + 1;
            if (out.len() + run) as u64 > len || i + run > input.len() {
                return None;
            }
            out.extend_from_slice(&input[i..i + run]);
            i += run;
        } else {
            // A back reference: copy len + 2 bytes from `back` bytes ago.
            let mut run = ctrl >> 5;
            let mut back = (ctrl & 0x1f) << 8;
            if i >= input.len() {
                return None;
            }
            if run == 7 {
                run += usize::from(input[i]);
                i += 1;
                if i >= input.len() {
                    return None;
                }
            }
            back += usize::from(input[i]);
            i += 1;
            run += 2;
            if (out.len() + run) as u64 > len || back >= out.len() {
                return None;
            }
            let from = out.len() - back - 1;
            for k in 0..run {
                out.push(out[from + k]);
            }
        }
    }
    (out.len() as u64 == len).then_some(out)
}

/// The bytes Redis writes for a value with `rdbcompression no`: the inverse
/// of [`decode_value`] over [`RdbBytes`], for tests and the fuzzer's
/// round trip. (The module itself saves through `RM_Save*`.)
pub fn encode_value(token: &[u8], fence: i64, deadline_ms: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(token.len() + 24);
    push_length(&mut out, OPCODE_STRING);
    // rdbSaveRawString: a short decimal that fits 32 bits is an integer.
    match parse_i64(token) {
        Ok(v) if token.len() <= 11 && i32::try_from(v).is_ok() => {
            if let Ok(v) = i8::try_from(v) {
                out.push(0xc0 | ENC_INT8 as u8);
                out.extend_from_slice(&v.to_le_bytes());
            } else if let Ok(v) = i16::try_from(v) {
                out.push(0xc0 | ENC_INT16 as u8);
                out.extend_from_slice(&v.to_le_bytes());
            } else {
                out.push(0xc0 | ENC_INT32 as u8);
                out.extend_from_slice(&(v as i32).to_le_bytes());
            }
        }
        _ => {
            push_length(&mut out, token.len() as u64);
            out.extend_from_slice(token);
        }
    }
    for n in [fence, deadline_ms] {
        push_length(&mut out, OPCODE_UINT);
        push_length(&mut out, n as u64);
    }
    out
}

/// The bytes Redis stores for a value of encoding version 2: version 1's,
/// then the grant time.
pub fn encode_value_v2(token: &[u8], fence: i64, deadline_ms: i64, granted_ms: i64) -> Vec<u8> {
    let mut out = encode_value(token, fence, deadline_ms);
    push_length(&mut out, OPCODE_UINT);
    push_length(&mut out, granted_ms as u64);
    out
}

/// `rdbSaveLen`.
fn push_length(out: &mut Vec<u8>, n: u64) {
    if n < 1 << 6 {
        out.push(n as u8);
    } else if n < 1 << 14 {
        out.extend_from_slice(&[0x40 | (n >> 8) as u8, n as u8]);
    } else if n <= u64::from(u32::MAX) {
        out.push(0x80);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fence::FenceCounter;
    use crate::core::limits::MAX_FENCE_LEAD;

    const NOW_US: i64 = 1_700_000_000_000_000;

    fn accept(fence: i64) -> Result<(), LockError> {
        FenceCounter::new(0).check(fence, NOW_US)
    }

    fn decode(bytes: &[u8]) -> Result<StoredLock<Vec<u8>>, DecodeError> {
        decode_value(1, &mut RdbBytes::new(bytes), accept)
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
                let v = decode_value(1, &mut RdbBytes::new(&bytes), |_| Ok(())).unwrap();
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
        let v2 = decode_value(2, &mut RdbBytes::new(&bytes), accept).unwrap();
        assert_eq!(
            (v2.token, v2.fence, v2.deadline_ms, v2.granted_ms),
            (v1.token.clone(), v1.fence, v1.deadline_ms, granted)
        );
        // Read as version 2, a version 1 value is short by one field.
        assert_eq!(
            decode_value(2, &mut RdbBytes::new(dump_value(DUMP_PLAIN)), accept),
            Err(DecodeError::Truncated)
        );
        let late = encode_value_v2(&v1.token, v1.fence, 5, 6);
        assert_eq!(
            decode_value(2, &mut RdbBytes::new(&late), accept),
            Err(DecodeError::Granted(6))
        );
        assert_eq!(
            decode_value(3, &mut RdbBytes::new(&bytes), accept),
            Err(DecodeError::Version(3))
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
        let err = decode_value(3, &mut RdbBytes::new(b""), accept).unwrap_err();
        assert_eq!(err, DecodeError::Version(3));
        assert!(err.to_string().contains("encoding version 3"));
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
}
