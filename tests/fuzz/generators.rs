//! The shared generators: the limits the README gives, what the fuzzer
//! aims at (held locks with waiters, keys of other types, free keys), and
//! random arguments (numbers, tokens, keys, option words, junk) and argvs
//! for every command; with the plain reading of a number and a token.

use redis_lock_testkit::RawConn;

use crate::rng::Rng;

pub const MAX_TTL: i64 = 604_800_000;
pub const MAX_DURATION: i64 = 10 * 366 * 86_400_000;
pub const MAX_DEADLINE: i64 = 253_402_300_800_000;
pub const MAX_FENCE_LEAD: i64 = 1 << 50;

/// A lock held (with a known token and fence) through the whole fuzz run.
pub struct Held {
    pub key: Vec<u8>,
    pub token: Vec<u8>,
    pub fence: i64,
    pub waiters: Vec<(Vec<u8>, RawConn)>,
}

/// What the fuzzer aims its argvs at.
pub struct Target {
    pub held: Vec<Held>,
    /// Keys of other types, and their values.
    pub strings: Vec<(Vec<u8>, Vec<u8>)>,
    /// MINFENCE at or below this is certainly within the node's bound.
    pub clock_us: i64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum KeyKind {
    Held(usize),
    OtherType,
    Free,
}

impl Target {
    pub fn kind(&self, key: &[u8]) -> KeyKind {
        if let Some(i) = self.held.iter().position(|h| h.key == key) {
            KeyKind::Held(i)
        } else if self.strings.iter().any(|(k, _)| k == key) {
            KeyKind::OtherType
        } else {
            KeyKind::Free
        }
    }
}

const FUZZ_KEYS: [&str; 6] = ["fz:0", "fz:1", "fz:2", "fz:3", "fz:{4}", "fz:5"];
const TOKENS: [&[u8]; 7] = [b"t1", b"t2", b"t3", b"12345", b"-7", b"\0\xff", b"a b"];
const WORDS: [&str; 14] = [
    "BLOCK", "MINFENCE", "NX", "XX", "PX", "EX", "GET", "KEEPTTL", "BLOCKING", "BLOC", "MIN",
    "FENCE", "TIMEOUT", "WITHTTL",
];
const BOUNDARY: [&str; 24] = [
    "0",
    "-0",
    "1",
    "-1",
    "00",
    "01",
    "604800000",
    "604800001",
    "316224000000",
    "316224000001",
    "253402300800000",
    "253402300800001",
    "999999999999999999",
    "1000000000000000000",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "99999999999999999999",
    "18446744073709551615",
    "18446744073709551616",
    "4611686018427387904",
    "1125899906842624",
    "2147483648",
];

/// Random case: "BLOCK", "block", "bLoCk".
fn random_case(rng: &mut Rng, word: &str) -> Vec<u8> {
    match rng.below(4) {
        0 => word.to_ascii_lowercase().into_bytes(),
        1 => word
            .bytes()
            .map(|b| {
                if rng.chance(50) {
                    b.to_ascii_lowercase()
                } else {
                    b
                }
            })
            .collect(),
        _ => word.as_bytes().to_vec(),
    }
}

fn option_word(rng: &mut Rng) -> Vec<u8> {
    let word = *rng.pick(&["BLOCK", "MINFENCE", "SHARED", "LIMIT"]);
    random_case(rng, word)
}

/// A public value (`VALUE v`): empty, short, around lock.max-value-len's
/// default (1024) and the parser's bound (16 KiB), or junk.
pub fn value(rng: &mut Rng) -> Vec<u8> {
    match rng.below(6) {
        0 => Vec::new(),
        1 => b"10.0.0.7:6379".to_vec(),
        2 => vec![b'v'; rng.range(1020, 1030) as usize],
        3 => vec![b'v'; rng.range(16_380, 16_390) as usize],
        _ => junk(rng),
    }
}

pub fn junk(rng: &mut Rng) -> Vec<u8> {
    match rng.below(6) {
        0 => rng.bytes(8),
        1 => rng.bytes(64),
        2 => b" \t\r\n\0"[..rng.below(6)].to_vec(),
        3 => vec![rng.next() as u8; rng.range(500, 700) as usize],
        4 => "１２３ ١٢٣ ∞ é".as_bytes().to_vec(),
        _ => Vec::new(),
    }
}

/// Anything a client might send where a number belongs.
pub fn number(rng: &mut Rng, clock_us: i64) -> Vec<u8> {
    let s = match rng.below(12) {
        0 => rng.range(1, 100_000).to_string(),
        1 => rng.range(-100_000, 0).to_string(),
        2 => rng.pick(&BOUNDARY).to_string(),
        3 => (rng.next() as i64).to_string(),
        4 => (0..rng.range(1, 26))
            .map(|_| char::from(b'0' + rng.below(10) as u8))
            .collect(),
        5 => {
            let n = rng.range(0, 100_000).to_string();
            let around = [
                "+", " ", "\t", "-", "--", "0", "\0", "\r\n", "_", ".", ".0", "e3",
            ];
            let a = rng.pick(&around);
            if rng.chance(50) {
                format!("{a}{n}")
            } else {
                format!("{n}{a}")
            }
        }
        6 => rng
            .pick(&[
                "1.5", "1e3", "0x10", "1_000", "inf", "-inf", "nan", "0b1", "1,000",
            ])
            .to_string(),
        7 => (clock_us / 1000 + rng.range(-100_000, 100_000)).to_string(),
        8 => (clock_us + rng.range(-1_000_000_000, 0)).to_string(),
        9 => (clock_us + MAX_FENCE_LEAD + rng.range(-1000, 1000)).to_string(),
        _ => return junk(rng),
    };
    s.into_bytes()
}

fn token(rng: &mut Rng) -> Vec<u8> {
    match rng.below(20) {
        0 => Vec::new(),
        1 => vec![b'x'; 512],
        2 => vec![b'y'; 513],
        3 => junk(rng),
        4 => rng.bytes(20),
        _ => rng.pick(&TOKENS).to_vec(),
    }
}

fn key(rng: &mut Rng, target: &Target) -> Vec<u8> {
    match rng.below(20) {
        0..=1 => rng.pick(&target.held).key.clone(),
        2 => rng.pick(&target.strings).0.clone(),
        3 => junk(rng),
        _ => rng.pick(&FUZZ_KEYS).as_bytes().to_vec(),
    }
}

fn ttl(rng: &mut Rng, clock_us: i64) -> Vec<u8> {
    match rng.below(10) {
        0..=3 => rng.range(1, 300).to_string().into_bytes(),
        4..=5 => rng.range(1, MAX_TTL).to_string().into_bytes(),
        _ => number(rng, clock_us),
    }
}

/// Valid timeouts are short, so a contended BLOCK holds the pipeline up
/// for a few ms; 0 (forever) and long ones are rare and get unblocked.
fn timeout(rng: &mut Rng, clock_us: i64) -> Vec<u8> {
    match rng.below(100) {
        0 => b"0".to_vec(),
        1 => rng.range(1000, MAX_DURATION).to_string().into_bytes(),
        2..=40 => rng.range(1, 4).to_string().into_bytes(),
        _ => match number(rng, clock_us) {
            n if canonical(&n).is_some_and(|t| (5..=MAX_DURATION).contains(&t)) => {
                rng.range(1, 4).to_string().into_bytes()
            }
            n => n,
        },
    }
}

fn min_fence(rng: &mut Rng, clock_us: i64) -> Vec<u8> {
    match rng.below(4) {
        0 => rng.range(1, 1_000_000).to_string().into_bytes(),
        1 => (clock_us - rng.range(0, 1_000_000_000))
            .to_string()
            .into_bytes(),
        _ => number(rng, clock_us),
    }
}

fn any_arg(rng: &mut Rng, target: &Target) -> Vec<u8> {
    match rng.below(6) {
        0 => {
            let word = *rng.pick(&WORDS);
            random_case(rng, word)
        }
        1 => number(rng, target.clock_us),
        2 => token(rng),
        3 => key(rng, target),
        _ => junk(rng),
    }
}

pub const COMMANDS: [&str; 8] = [
    "LOCK.ACQUIRE",
    "LOCK.RELEASE",
    "LOCK.EXTEND",
    "LOCK.FENCE",
    "LOCK.INFO",
    "LOCK._SET",
    "LOCK._HOLD",
    "LOCK._DROP",
];

/// One argv: mostly the command's own shape with a few mutations, some
/// entirely random, some a run of options.
pub fn argv(rng: &mut Rng, target: &Target) -> Vec<Vec<u8>> {
    let clock = target.clock_us;
    let name = *rng.pick(&COMMANDS);
    let mut argv = vec![random_case(rng, name), key(rng, target)];
    match rng.below(10) {
        0..=1 => {
            // Random arity, random arguments.
            argv.truncate(rng.range(1, 2) as usize);
            for _ in 0..rng.below(10) {
                argv.push(any_arg(rng, target));
            }
            return argv;
        }
        2 if name == "LOCK.ACQUIRE" => {
            // A run of option words and values in any order.
            argv.extend([token(rng), ttl(rng, clock)]);
            for _ in 0..rng.below(7) {
                argv.push(if rng.chance(60) {
                    option_word(rng)
                } else if rng.chance(50) {
                    timeout(rng, clock)
                } else {
                    any_arg(rng, target)
                });
            }
            return argv;
        }
        _ => {}
    }
    match name {
        "LOCK.ACQUIRE" => {
            argv.extend([token(rng), ttl(rng, clock)]);
            let mut options = vec![];
            if rng.chance(25) {
                options.push(vec![random_case(rng, "BLOCK"), timeout(rng, clock)]);
            }
            if rng.chance(25) {
                options.push(vec![random_case(rng, "MINFENCE"), min_fence(rng, clock)]);
            }
            if rng.chance(25) {
                options.push(vec![random_case(rng, "SHARED")]);
                if rng.chance(50) {
                    let limit = rng.range(0, 4).to_string().into_bytes();
                    options.push(vec![random_case(rng, "LIMIT"), limit]);
                }
            }
            if rng.chance(15) {
                options.push(vec![random_case(rng, "VALUE"), value(rng)]);
            }
            if rng.chance(50) {
                options.reverse();
            }
            argv.extend(options.into_iter().flatten());
        }
        "LOCK.RELEASE" => argv.push(token(rng)),
        "LOCK.EXTEND" => {
            argv.extend([token(rng), ttl(rng, clock)]);
            if rng.chance(20) {
                argv.extend([random_case(rng, "VALUE"), value(rng)]);
            }
        }
        "LOCK.FENCE" if rng.chance(50) => argv.push(token(rng)),
        "LOCK._SET" => argv.extend([
            token(rng),
            number(rng, clock),
            (clock / 1000 + rng.range(-1000, 600_000))
                .to_string()
                .into_bytes(),
        ]),
        "LOCK._HOLD" => argv.extend([
            rng.range(-1, 4).to_string().into_bytes(),
            token(rng),
            number(rng, clock),
            (clock / 1000 + rng.range(-1000, 600_000))
                .to_string()
                .into_bytes(),
            (clock / 1000).to_string().into_bytes(),
        ]),
        "LOCK._DROP" => argv.push(token(rng)),
        _ => {}
    }
    // Mutations: replace, insert, delete, duplicate.
    if rng.chance(50) {
        for _ in 0..rng.range(1, 3) {
            let at = rng.range(1, argv.len() as i64) as usize;
            match rng.below(4) {
                0 if at < argv.len() => argv[at] = any_arg(rng, target),
                1 => {
                    let word = if rng.chance(40) {
                        option_word(rng)
                    } else {
                        any_arg(rng, target)
                    };
                    argv.insert(at, word);
                }
                2 if at < argv.len() => {
                    argv.remove(at);
                }
                _ if at < argv.len() => {
                    let copy = argv[at].clone();
                    argv.insert(at, copy);
                }
                _ => argv.push(any_arg(rng, target)),
            }
        }
    }
    argv
}

/// The plain reading of a decimal integer: what `i64` parses and prints back
/// identically (no '+', spaces, leading zeros or "-0").
pub fn canonical(s: &[u8]) -> Option<i64> {
    let v: i64 = std::str::from_utf8(s).ok()?.parse().ok()?;
    (v.to_string().as_bytes() == s).then_some(v)
}

pub fn token_ok(t: &[u8]) -> bool {
    (1..=512).contains(&t.len())
}
