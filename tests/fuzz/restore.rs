//! Damaged RESTORE payloads: DUMPs of locks split into body, RDB version
//! and CRC64; mutations of lock values (flips, cuts, inserts, over-long
//! lengths, other fences and deadlines) shared with the RDB files; and the
//! RESTORE tests, with a valid CRC64 so the module's decoder has to refuse.

use std::time::Instant;

use redis_lock_testkit::{Resp, Server};

use crate::argv::check_log_clean;
use crate::generators::{token_ok, MAX_DEADLINE, MAX_FENCE_LEAD};
use crate::rng::{env_number, now_us, Rng};
use crate::wire::{check_error_names_a_problem, info_number, int, Wire};

/// Redis's CRC64 (Jones polynomial, reflected), as DUMP and RDB use it.
pub fn crc64(data: &[u8]) -> u64 {
    let mut crc = 0u64;
    for &b in data {
        crc ^= u64::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x95ac_9329_ac4b_c9b5
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// A DUMP payload split into its body (type byte, module id, value, EOF
/// opcode) and the RDB version that precedes the CRC64.
pub struct Dump {
    pub body: Vec<u8>,
    version: [u8; 2],
}

impl Dump {
    pub fn of(w: &mut Wire, key: &[u8]) -> Dump {
        let Resp::Bulk(payload) = w.call(&[b"DUMP", key]) else {
            panic!("no DUMP of {key:?}")
        };
        let n = payload.len();
        let crc = u64::from_le_bytes(payload[n - 8..].try_into().unwrap());
        assert_eq!(crc64(&payload[..n - 8]), crc, "our CRC64 is Redis's");
        Dump {
            body: payload[..n - 10].to_vec(),
            version: [payload[n - 10], payload[n - 9]],
        }
    }

    /// The payload with a CRC64 that matches, whatever the body holds.
    fn payload(&self, body: &[u8]) -> Vec<u8> {
        let mut p = [body, &self.version[..]].concat();
        p.extend_from_slice(&crc64(&p).to_le_bytes());
        p
    }
}

/// Fences and deadlines a damaged value might carry.
fn odd_i64(rng: &mut Rng) -> i64 {
    let now = now_us();
    let random = rng.next() as i64;
    *rng.pick(&[
        0,
        -1,
        i64::MIN,
        i64::MAX,
        1,
        now,
        now + MAX_FENCE_LEAD,
        now + MAX_FENCE_LEAD + 1,
        now / 1000,
        now / 1000 - 600_000,
        MAX_DEADLINE,
        MAX_DEADLINE + 1,
        1 << 62,
        random,
    ])
}

/// An RDB length encoding that claims far more than is there, or a
/// reserved one.
fn odd_length(rng: &mut Rng) -> Vec<u8> {
    match rng.below(5) {
        0 => [&[0x80u8][..], &(rng.next() as u32).to_be_bytes()].concat(),
        1 => [&[0x81u8][..], &rng.next().to_be_bytes()].concat(),
        2 => vec![0x40 | rng.below(64) as u8, rng.next() as u8],
        3 => vec![0xc0 | rng.below(64) as u8],
        _ => vec![0x82 + rng.below(0x3e) as u8],
    }
}

/// Damages `bytes` in `range` (positions of a module value): flips, cuts,
/// inserts, over-long lengths, other fences and deadlines. `numbers` are
/// the offsets of 8-byte big-endian fields (fence, deadline) in `bytes`.
pub fn damage(
    rng: &mut Rng,
    bytes: &mut Vec<u8>,
    range: std::ops::Range<usize>,
    numbers: &[usize],
) {
    let at = rng.range(range.start as i64, range.end as i64 - 1) as usize;
    match rng.below(8) {
        0 => bytes[at] ^= 1 << rng.below(8),
        1 => bytes[at] = rng.next() as u8,
        2 => {
            let extra = rng.bytes(4);
            bytes.splice(at..at, extra);
        }
        3 => {
            let end = (at + rng.range(1, 8) as usize).min(range.end);
            bytes.drain(at..end);
        }
        4 => {
            let len = odd_length(rng);
            bytes.splice(at..at + 1, len);
        }
        5 if !numbers.is_empty() => {
            let field = *rng.pick(numbers);
            let value = odd_i64(rng);
            bytes[field..field + 8].copy_from_slice(&value.to_be_bytes());
        }
        _ => bytes[at] = *rng.pick(&[0x00, 0x02, 0x05, 0x81, 0xc3, 0xff]),
    }
}

/// Where the fence, the deadline and the grant time of a value are (all
/// 64-bit lengths near its end, encoding version 4: before the holder's
/// empty value, a string opcode and a zero length), given the position of
/// the EOF opcode that follows it.
pub fn number_fields(bytes: &[u8], eof: usize) -> Vec<usize> {
    assert_eq!(bytes[eof - 2..eof], [0x05, 0x00], "an empty value last");
    let fence = eof - 30;
    let deadline = eof - 20;
    let granted = eof - 10;
    assert_eq!(
        (bytes[fence - 1], bytes[deadline - 1], bytes[granted - 1]),
        (0x81, 0x81, 0x81)
    );
    vec![fence, deadline, granted]
}

/// A restored or loaded lock must be whole: a token of 1 to 512 bytes, a
/// positive fence no more than 2^50 µs above `bound_us`, a lease.
pub fn check_lock_valid(w: &mut Wire, key: &[u8], bound_us: i64) {
    match w.call(&[b"LOCK.INFO", key]) {
        Resp::Nil => {}
        Resp::Array(f) => {
            let Resp::Bulk(token) = &f[1] else {
                panic!("{f:?}")
            };
            assert!(token_ok(token), "{f:?}");
            let fence = int(&f[3]);
            assert!(fence >= 1 && fence <= bound_us + MAX_FENCE_LEAD, "{f:?}");
            assert!(int(&f[5]) >= 0);
        }
        other => panic!("LOCK.INFO {key:?}: {other:?}"),
    }
}

/// Four locks whose tokens Redis stores in each of its string encodings:
/// plain, integer, LZF, and 512 binary bytes.
pub fn lock_tokens() -> Vec<Vec<u8>> {
    vec![
        b"holder-token".to_vec(),
        b"12345".to_vec(),
        vec![b'a'; 40],
        (0..512u32).map(|i| (i * 7 + 3) as u8).collect(),
    ]
}

#[test]
fn mutated_restore_payloads_are_refused_or_restore_a_whole_lock() {
    let started = Instant::now();
    let mut rng = Rng::for_test("RESTORE fuzz", 2);
    let cases = (env_number("FUZZ_ITERATIONS", 200_000) / 4).max(1000) as usize;
    let server = Server::start();
    let mut w = Wire::connect(server.port);
    let mut dumps = vec![];
    for (i, token) in lock_tokens().iter().enumerate() {
        let key = format!("src:{i}").into_bytes();
        int(&w.call(&[b"LOCK.ACQUIRE", &key, token, b"600000"]));
        dumps.push(Dump::of(&mut w, &key));
    }
    let held: Vec<Resp> = (0..4)
        .map(|i| w.call(&[b"LOCK.INFO", format!("src:{i}").as_bytes()]))
        .collect();
    let (mut restored, mut refused) = (0, 0);
    let mut done = 0;
    while done < cases {
        let mut batch = vec![];
        for i in 0..(cases - done).min(100) {
            let dump = rng.pick(&dumps);
            let mut body = dump.body.clone();
            let end = body.len();
            let numbers = number_fields(&body, end - 1);
            // Mostly the value (after the type byte and module id).
            let from = if rng.chance(5) { 1 } else { 10 };
            for _ in 0..rng.range(1, 3) {
                let len = body.len();
                let numbers: Vec<usize> =
                    numbers.iter().copied().filter(|&n| n + 8 <= len).collect();
                if rng.chance(10) {
                    body.truncate(rng.range(from as i64, len as i64 - 1) as usize);
                } else {
                    damage(&mut rng, &mut body, from..len, &numbers);
                }
                if body.len() <= from {
                    break;
                }
            }
            let key = format!("rs:{}", (done + i) % 64).into_bytes();
            batch.push(vec![
                b"RESTORE".to_vec(),
                key.clone(),
                b"0".to_vec(),
                dump.payload(&body),
                b"REPLACE".to_vec(),
            ]);
            batch.push(vec![b"LOCK.INFO".to_vec(), key]);
        }
        w.send(&batch);
        for pair in batch.chunks(2) {
            let key = &pair[1][1];
            match w.read() {
                Resp::Simple(ok) if ok == "OK" => restored += 1,
                Resp::Error(msg) => {
                    check_error_names_a_problem(&pair[0], &msg);
                    refused += 1;
                }
                other => panic!("RESTORE replied {other:?}"),
            }
            match w.read() {
                Resp::Nil => {}
                Resp::Array(f) => {
                    let Resp::Bulk(token) = &f[1] else {
                        panic!("{f:?}")
                    };
                    assert!(token_ok(token), "{f:?}");
                    let fence = int(&f[3]);
                    assert!(fence >= 1 && fence <= now_us() + MAX_FENCE_LEAD, "{f:?}");
                }
                Resp::Error(msg) => assert!(msg.starts_with("WRONGTYPE"), "{key:?}: {msg}"),
                other => panic!("LOCK.INFO {key:?}: {other:?}"),
            }
        }
        done += batch.len() / 2;
    }
    eprintln!(
        "RESTORE fuzz: {cases} payloads, {restored} restored, {refused} refused, {:?}",
        started.elapsed()
    );
    assert_eq!(w.call(&[b"PING"]), Resp::Simple("PONG".into()));
    // RESTOREd fences cannot push the mark beyond the clock's bound.
    let hwm = info_number(&mut w, "lock", "lock_fence_hwm");
    assert!(hwm <= now_us() + MAX_FENCE_LEAD, "the mark is {hwm}");
    for (i, before) in held.iter().enumerate() {
        let (Resp::Array(now), Resp::Array(before)) = (
            w.call(&[b"LOCK.INFO", format!("src:{i}").as_bytes()]),
            before,
        ) else {
            panic!("src:{i} is gone")
        };
        assert_eq!((&now[1], &now[3]), (&before[1], &before[3]));
    }
    check_log_clean(&server);
}

/// Before the fix, each RESTORE could carry a fence 2^50 above the node's
/// mark and raise the mark by as much: about 8,200 of them used up the
/// token space for every lock on the node.
#[test]
fn repeated_restores_cannot_ratchet_the_fence_mark() {
    let server = Server::start();
    let mut w = Wire::connect(server.port);
    int(&w.call(&[b"LOCK.ACQUIRE", b"k", b"t", b"600000"]));
    let dump = Dump::of(&mut w, b"k");
    let end = dump.body.len() - 1;
    let fence_at = number_fields(&dump.body, end)[0];
    for _ in 0..20 {
        let hwm = info_number(&mut w, "lock", "lock_fence_hwm");
        let mut body = dump.body.clone();
        body[fence_at..fence_at + 8].copy_from_slice(&(hwm + MAX_FENCE_LEAD).to_be_bytes());
        w.call(&[b"RESTORE", b"r", b"0", &dump.payload(&body), b"REPLACE"]);
    }
    let hwm = info_number(&mut w, "lock", "lock_fence_hwm");
    assert!(
        hwm <= now_us() + MAX_FENCE_LEAD,
        "the mark ratcheted to {hwm}"
    );
    assert!(matches!(w.call(&[b"LOCK.ACQUIRE", b"n", b"t", b"1000"]), Resp::Int(f) if f > hwm));
    assert!(server
        .log()
        .contains("RESTOREd token more than 2^50 above the clock"));
}
