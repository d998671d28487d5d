//! Redis's own RDB encoding of a module value, read and written without
//! Redis: the fuzzer and the tests feed [`decode_value`](crate::codec::decode_value)
//! the very bytes Redis stores. Not part of the module (tests and fuzzing only).

use crate::args::parse_i64;
use crate::codec::{Truncated, ValueReader};
use crate::lock::Mode;

// Redis's RDB encoding of a module value (rdb.h, module.c).
pub(crate) const OPCODE_UINT: u64 = 2;
pub(crate) const OPCODE_STRING: u64 = 5;
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

/// The bytes Redis stores for `RM_SaveSigned(n)`: the number as an
/// unsigned 64-bit integer (two's complement).
pub fn encode_signed(n: i64) -> Vec<u8> {
    let mut out = Vec::new();
    push_length(&mut out, OPCODE_UINT);
    push_length(&mut out, n as u64);
    out
}

/// The bytes Redis stores for a value of encoding version 3: the mode
/// word and the holder count, then each holder (token, fence, deadline,
/// grant time) as version 2 writes one.
pub fn encode_value_v3(mode: Mode, holders: &[(&[u8], i64, i64, i64)]) -> Vec<u8> {
    let mut out = encode_signed(crate::codec::mode_word(mode));
    out.extend(encode_signed(holders.len() as i64));
    for &(token, fence, deadline_ms, granted_ms) in holders {
        out.extend(encode_value_v2(token, fence, deadline_ms, granted_ms));
    }
    out
}

/// One holder as [`encode_value_v4`] writes it: token, fence, deadline,
/// grant time, value.
pub type HolderV4<'a> = (&'a [u8], i64, i64, i64, &'a [u8]);

/// The bytes Redis stores for a value of encoding version 4: version 3's,
/// each holder followed by its public value (a string buffer).
pub fn encode_value_v4(mode: Mode, holders: &[HolderV4<'_>]) -> Vec<u8> {
    let mut out = encode_signed(crate::codec::mode_word(mode));
    out.extend(encode_signed(holders.len() as i64));
    for &(token, fence, deadline_ms, granted_ms, value) in holders {
        out.extend(encode_value_v2(token, fence, deadline_ms, granted_ms));
        push_length(&mut out, OPCODE_STRING);
        push_length(&mut out, value.len() as u64);
        out.extend_from_slice(value);
    }
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
