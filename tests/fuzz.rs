//! Fuzzing against a live server, and damaged persistence files.
//!
//! * **Argument vectors.** Random argvs for every command (random arity and
//!   case, binary junk, huge, negative, signed and spaced numbers, option
//!   words anywhere), pipelined, also against held locks with wrong tokens.
//!   Every reply must be what a plain reading of the README allows, every
//!   error must name its problem, the held locks and their waiters must be
//!   untouched, the server up, and memory flat once the fuzz keys are gone.
//! * **RESTORE payloads.** DUMPs of locks, mutated (bytes flipped, cut,
//!   inserted, over-long lengths, other fences and deadlines) with a valid
//!   CRC64, so the module's decoder (not the checksum) has to refuse them.
//! * **RDB and AOF files.** Files holding locks, damaged in the lock values
//!   (RDB) or in the `LOCK._SET` commands (AOF), then loaded at start-up: the
//!   server refuses with a log line and exit code 1, or starts with only
//!   valid locks; it never dies by a signal.
//!
//! `FUZZ_SEED` replays a run (each test prints its seed); `FUZZ_ITERATIONS`
//! sets the number of argvs (default 200,000, about 33,000 per command, and
//! a quarter as many RESTORE payloads; `make stress` runs far more); `FUZZ_FILE_CASES` the number of damaged files of
//! each kind (default 40).

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

// ---------------------------------------------------------------------------
// Randomness and settings

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A seeded SplitMix64: the same seed gives the same run.
struct Rng(u64);

impl Rng {
    /// Seeded from FUZZ_SEED or the clock; the seed is printed so a failure
    /// can be replayed. `salt` keeps the tests' streams apart.
    fn for_test(name: &str, salt: u64) -> Rng {
        let seed = env_number(
            "FUZZ_SEED",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64,
        );
        eprintln!("{name}: FUZZ_SEED={seed} on {}", server_binary());
        Rng(seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn bytes(&mut self, max_len: usize) -> Vec<u8> {
        let len = self.below(max_len + 1);
        (0..len).map(|_| self.next() as u8).collect()
    }
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

// ---------------------------------------------------------------------------
// A pipelining connection with binary arguments

struct Wire {
    reader: BufReader<TcpStream>,
}

impl Wire {
    fn connect(port: u16) -> Wire {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_nodelay(true).unwrap();
        Wire {
            reader: BufReader::with_capacity(1 << 16, stream),
        }
    }

    /// Sends every command in one write.
    fn send(&mut self, commands: &[Vec<Vec<u8>>]) {
        let mut out = Vec::new();
        for argv in commands {
            out.extend_from_slice(format!("*{}\r\n", argv.len()).as_bytes());
            for arg in argv {
                out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
                out.extend_from_slice(arg);
                out.extend_from_slice(b"\r\n");
            }
        }
        self.reader.get_mut().write_all(&out).expect("send");
    }

    /// The next reply, or None if none starts within `limit`.
    fn read_within(&mut self, limit: Duration) -> Option<Resp> {
        if self.reader.buffer().is_empty() {
            self.reader.get_ref().set_read_timeout(Some(limit)).unwrap();
            match self.reader.fill_buf() {
                Ok([]) => panic!("the server closed the connection"),
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return None
                }
                Err(e) => panic!("read: {e}"),
            }
            self.reader
                .get_ref()
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
        }
        Some(self.parse())
    }

    fn read(&mut self) -> Resp {
        self.read_within(Duration::from_secs(20))
            .expect("a reply within 20 s")
    }

    fn call(&mut self, argv: &[&[u8]]) -> Resp {
        self.send(&[argv.iter().map(|a| a.to_vec()).collect()]);
        self.read()
    }

    fn parse(&mut self) -> Resp {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line).expect("read");
        assert!(line.ends_with(b"\r\n"), "a bad reply line {line:?}");
        let text = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        let number = || text.parse::<i64>().expect("a number");
        match line[0] {
            b':' => Resp::Int(number()),
            b'+' => Resp::Simple(text),
            b'-' => Resp::Error(text),
            b'$' | b'*' if number() < 0 => Resp::Nil,
            b'$' => {
                let mut buf = vec![0; number() as usize + 2];
                self.reader.read_exact(&mut buf).expect("read");
                buf.truncate(buf.len() - 2);
                Resp::Bulk(buf)
            }
            b'*' => Resp::Array((0..number()).map(|_| self.parse()).collect()),
            _ => panic!("an unexpected reply line {line:?}"),
        }
    }
}

fn int(r: &Resp) -> i64 {
    match r {
        Resp::Int(n) => *n,
        other => panic!("expected an integer, got {other:?}"),
    }
}

fn info_text(w: &mut Wire, section: &str) -> String {
    match w.call(&[b"INFO", section.as_bytes()]) {
        Resp::Bulk(b) => String::from_utf8(b).unwrap(),
        other => panic!("{other:?}"),
    }
}

fn info_number(w: &mut Wire, section: &str, field: &str) -> i64 {
    info_text(w, section)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field}"))
        .trim()
        .parse()
        .unwrap()
}

/// A well-formed error: a code word in capitals, then what is wrong, on one
/// short line, and no caught panic behind it.
fn check_error_names_a_problem(argv: &[Vec<u8>], msg: &str) {
    let show = || show_argv(argv);
    let (code, detail) = msg.split_once(' ').unwrap_or((msg, ""));
    assert!(
        !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase()),
        "an error without a code: {msg:?} for {}",
        show()
    );
    assert!(
        detail.split_whitespace().count() >= 2,
        "an error that names nothing: {msg:?} for {}",
        show()
    );
    assert!(
        msg.len() < 400,
        "an error of {} bytes for {}",
        msg.len(),
        show()
    );
    assert!(
        !msg.contains("internal error"),
        "a caught panic: {msg:?} for {}",
        show()
    );
}

fn show_argv(argv: &[Vec<u8>]) -> String {
    let args: Vec<String> = argv
        .iter()
        .map(|a| {
            if a.len() > 40 {
                format!("<{} bytes>", a.len())
            } else {
                format!("{:?}", String::from_utf8_lossy(a))
            }
        })
        .collect();
    format!("[{}]", args.join(" "))
}

// ---------------------------------------------------------------------------
// Live argv fuzzing

const MAX_TTL: i64 = 604_800_000;
const MAX_DURATION: i64 = 10 * 366 * 86_400_000;
const MAX_DEADLINE: i64 = 253_402_300_800_000;
const MAX_FENCE_LEAD: i64 = 1 << 50;

/// A lock held (with a known token and fence) through the whole fuzz run.
struct Held {
    key: Vec<u8>,
    token: Vec<u8>,
    fence: i64,
    waiters: Vec<(Vec<u8>, RawConn)>,
}

/// What the fuzzer aims its argvs at.
struct Target {
    held: Vec<Held>,
    /// Keys of other types, and their values.
    strings: Vec<(Vec<u8>, Vec<u8>)>,
    /// MINFENCE at or below this is certainly within the node's bound.
    clock_us: i64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum KeyKind {
    Held(usize),
    OtherType,
    Free,
}

impl Target {
    fn kind(&self, key: &[u8]) -> KeyKind {
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
    let word = *rng.pick(&["BLOCK", "MINFENCE"]);
    random_case(rng, word)
}

fn junk(rng: &mut Rng) -> Vec<u8> {
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
fn number(rng: &mut Rng, clock_us: i64) -> Vec<u8> {
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

const COMMANDS: [&str; 6] = [
    "LOCK.ACQUIRE",
    "LOCK.RELEASE",
    "LOCK.EXTEND",
    "LOCK.FENCE",
    "LOCK.INFO",
    "LOCK._SET",
];

/// One argv: mostly the command's own shape with a few mutations, some
/// entirely random, some a run of options.
fn argv(rng: &mut Rng, target: &Target) -> Vec<Vec<u8>> {
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
            if rng.chance(50) {
                options.reverse();
            }
            argv.extend(options.into_iter().flatten());
        }
        "LOCK.RELEASE" => argv.push(token(rng)),
        "LOCK.EXTEND" => argv.extend([token(rng), ttl(rng, clock)]),
        "LOCK.FENCE" if rng.chance(50) => argv.push(token(rng)),
        "LOCK._SET" => argv.extend([
            token(rng),
            number(rng, clock),
            (clock / 1000 + rng.range(-1000, 600_000))
                .to_string()
                .into_bytes(),
        ]),
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
fn canonical(s: &[u8]) -> Option<i64> {
    let v: i64 = std::str::from_utf8(s).ok()?.parse().ok()?;
    (v.to_string().as_bytes() == s).then_some(v)
}

fn token_ok(t: &[u8]) -> bool {
    (1..=512).contains(&t.len())
}

/// What a reply may be, from the README alone.
#[derive(Debug)]
enum Expect {
    /// An error naming one of these.
    Error(Vec<&'static str>),
    /// A reply of this command; `may_refuse_min_fence` also allows an
    /// error about MINFENCE (its bound moves with the node's mark).
    Reply {
        command: &'static str,
        may_refuse_min_fence: bool,
        /// With BLOCK on a contended lock: the reply may wait.
        blocks: bool,
    },
}

fn expect(argv: &[Vec<u8>], target: &Target) -> Expect {
    let name = COMMANDS
        .iter()
        .find(|c| argv[0].eq_ignore_ascii_case(c.as_bytes()))
        .expect("a known command");
    let n = argv.len();
    let arity_ok = match *name {
        "LOCK.ACQUIRE" => n >= 4,
        "LOCK.RELEASE" => n == 3,
        "LOCK.EXTEND" => n == 4,
        "LOCK.FENCE" => n >= 2,
        "LOCK.INFO" => n == 2,
        // Arity -5 (granted-ms is optional); the module refuses it from
        // clients before it looks further.
        _ => n >= 5,
    };
    if !arity_ok {
        return Expect::Error(vec!["wrong number of arguments"]);
    }
    if *name == "LOCK._SET" {
        return Expect::Error(vec!["internal"]);
    }
    let mut problems = vec![];
    let check_token = |t: &[u8], problems: &mut Vec<&'static str>| {
        if !token_ok(t) {
            problems.push("token");
        }
    };
    let ttl_ok = |t: &[u8]| canonical(t).is_some_and(|v| (1..=MAX_TTL).contains(&v));
    let mut may_refuse_min_fence = false;
    let mut min_fence_too_large = false;
    let mut blocks = false;
    match *name {
        "LOCK.ACQUIRE" => {
            check_token(&argv[2], &mut problems);
            if !ttl_ok(&argv[3]) {
                problems.push("ttl-ms");
            }
            let (mut block, mut min) = (false, false);
            for pair in argv[4..].chunks(2) {
                let word = &pair[0];
                let value = pair.get(1);
                if word.eq_ignore_ascii_case(b"BLOCK") && !block {
                    block = true;
                    match value.and_then(|v| canonical(v)) {
                        Some(t) if (0..=MAX_DURATION).contains(&t) => blocks = true,
                        _ => {
                            problems.push("timeout-ms");
                            break;
                        }
                    }
                } else if word.eq_ignore_ascii_case(b"MINFENCE") && !min {
                    min = true;
                    // Its upper bound is the node's, checked after parsing.
                    match value.and_then(|v| canonical(v)) {
                        Some(f) if f >= 1 && f <= target.clock_us => {}
                        Some(f) if (1..=1 << 62).contains(&f) => may_refuse_min_fence = true,
                        Some(f) if f >= 1 => min_fence_too_large = true,
                        _ => {
                            problems.push("MINFENCE");
                            break;
                        }
                    }
                } else {
                    problems.push("option");
                    break;
                }
            }
        }
        "LOCK.RELEASE" => check_token(&argv[2], &mut problems),
        "LOCK.EXTEND" => {
            check_token(&argv[2], &mut problems);
            if !ttl_ok(&argv[3]) {
                problems.push("ttl-ms");
            }
        }
        "LOCK.FENCE" => match n {
            2 => {}
            3 => check_token(&argv[2], &mut problems),
            _ => problems.push("wrong number of arguments"),
        },
        _ => {}
    }
    if !problems.is_empty() {
        return Expect::Error(problems);
    }
    if min_fence_too_large {
        return Expect::Error(vec!["MINFENCE"]);
    }
    if target.kind(&argv[1]) == KeyKind::OtherType {
        return Expect::Error(match may_refuse_min_fence {
            true => vec!["WRONGTYPE", "MINFENCE"],
            false => vec!["WRONGTYPE"],
        });
    }
    Expect::Reply {
        command: name,
        may_refuse_min_fence,
        blocks,
    }
}

/// Checks one reply against the expectation, and against the held lock
/// when the argv aims at one.
fn check_reply(argv: &[Vec<u8>], want: &Expect, got: &Resp, target: &Target) {
    let show = || show_argv(argv);
    if let Resp::Error(msg) = got {
        check_error_names_a_problem(argv, msg);
    }
    let (command, may_refuse_min_fence) = match (want, got) {
        (Expect::Error(words), Resp::Error(msg)) => {
            assert!(
                words.iter().any(|w| msg.contains(w)),
                "the error {msg:?} names none of {words:?} for {}",
                show()
            );
            return;
        }
        (Expect::Error(words), other) => {
            panic!(
                "expected an error about {words:?}, got {other:?} for {}",
                show()
            )
        }
        (
            Expect::Reply {
                command,
                may_refuse_min_fence,
                ..
            },
            _,
        ) => (*command, *may_refuse_min_fence),
    };
    if let (true, Resp::Error(msg)) = (may_refuse_min_fence, got) {
        assert!(msg.contains("MINFENCE"), "{msg:?} for {}", show());
        return;
    }
    let held = match target.kind(&argv[1]) {
        KeyKind::Held(i) => Some(&target.held[i]),
        _ => None,
    };
    let ok = match (command, got) {
        ("LOCK.ACQUIRE", Resp::Nil) => true,
        ("LOCK.ACQUIRE", Resp::Int(f)) => held.is_none() && *f > 0,
        ("LOCK.RELEASE" | "LOCK.EXTEND", Resp::Int(0)) => true,
        ("LOCK.RELEASE" | "LOCK.EXTEND", Resp::Int(1)) => held.is_none(),
        ("LOCK.FENCE", Resp::Nil) => held.is_none() || argv.len() == 3,
        ("LOCK.FENCE", Resp::Int(f)) => held.map_or(*f > 0, |h| *f == h.fence && argv.len() == 2),
        ("LOCK.INFO", Resp::Nil) => held.is_none(),
        ("LOCK.INFO", Resp::Array(fields)) => {
            fields.len() == 10
                && held.is_none_or(|h| {
                    fields[1] == Resp::Bulk(h.token.clone()) && fields[3] == Resp::Int(h.fence)
                })
        }
        _ => false,
    };
    assert!(
        ok,
        "{got:?} is not a reply {command} may give for {}",
        show()
    );
}

/// The fuzz keys' names as the server has them (all but the held and
/// other-type keys).
fn fuzz_keys(w: &mut Wire, target: &Target) -> Vec<Vec<u8>> {
    let mut keys = vec![];
    let mut cursor = b"0".to_vec();
    loop {
        let reply = w.call(&[b"SCAN", &cursor, b"COUNT", b"1000"]);
        let Resp::Array(parts) = reply else {
            panic!("{reply:?}")
        };
        let (Resp::Bulk(next), Resp::Array(found)) = (&parts[0], &parts[1]) else {
            panic!("{parts:?}")
        };
        for k in found {
            if let Resp::Bulk(k) = k {
                if target.kind(k) == KeyKind::Free {
                    keys.push(k.clone());
                }
            }
        }
        if next == b"0" {
            return keys;
        }
        cursor = next.clone();
    }
}

/// Deletes the fuzz keys and waits for the server to settle; returns
/// used_memory.
fn clean_and_measure(port: u16, target: &Target) -> i64 {
    let mut w = Wire::connect(port);
    let keys = fuzz_keys(&mut w, target);
    for chunk in keys.chunks(500) {
        let mut del = vec![b"DEL".to_vec()];
        del.extend(chunk.iter().cloned());
        w.send(&[del]);
        w.read();
    }
    let held_waiters: i64 = target.held.iter().map(|h| h.waiters.len() as i64).sum();
    let start = Instant::now();
    while info_number(&mut w, "lock", "lock_waiters") != held_waiters
        || info_number(&mut w, "lock", "lock_locks") != target.held.len() as i64
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{}",
            info_text(&mut w, "lock")
        );
        sleep(Duration::from_millis(10));
    }
    // Let the server cron shrink the emptied tables and free buffers.
    sleep(Duration::from_millis(300));
    info_number(&mut w, "memory", "used_memory")
}

/// Runs `count` argvs through one pipelining connection, counting error
/// replies. A reply that does not come is a BLOCK on a held
/// lock: the client is unblocked (its reply is then nil).
struct Counts {
    errors: usize,
    unblocked: usize,
}

fn fuzz_batch(port: u16, rng: &mut Rng, target: &Target, count: usize, counts: &mut Counts) {
    let Counts { errors, unblocked } = counts;
    let mut w = Wire::connect(port);
    let id = int(&w.call(&[b"CLIENT", b"ID"]));
    let mut control = Wire::connect(port);
    let mut done = 0;
    while done < count {
        let batch: Vec<Vec<Vec<u8>>> = (0..(count - done).min(200))
            .map(|_| argv(rng, target))
            .collect();
        w.send(&batch);
        for argv in &batch {
            let want = expect(argv, target);
            let got = match w.read_within(Duration::from_millis(30)) {
                Some(reply) => reply,
                None => {
                    // Only this command can be waiting: the ones before it
                    // were answered, the ones after it have not started.
                    if matches!(want, Expect::Reply { blocks: true, .. }) {
                        control.call(&[b"CLIENT", b"UNBLOCK", id.to_string().as_bytes()]);
                        *unblocked += 1;
                    }
                    w.read_within(Duration::from_secs(20))
                        .unwrap_or_else(|| panic!("no reply to {} ({want:?})", show_argv(argv)))
                }
            };
            if matches!(got, Resp::Error(_)) {
                *errors += 1;
            }
            check_reply(argv, &want, &got, target);
        }
        done += batch.len();
    }
}

/// Holds four locks, queues waiters on two, and adds keys of other types.
fn set_up(server: &Server, rng: &mut Rng) -> Target {
    let mut w = Wire::connect(server.port);
    let salt = rng.next();
    let mut held = vec![];
    for i in 0..4 {
        let key = format!("held:{i}").into_bytes();
        let token = format!("holder-{salt:x}-{i}").into_bytes();
        let fence = int(&w.call(&[b"LOCK.ACQUIRE", &key, &token, b"600000"]));
        let waiters = (0..[2, 1, 0, 0][i])
            .map(|j| {
                let t = format!("waiter-{salt:x}-{i}-{j}");
                let key = std::str::from_utf8(&key).unwrap();
                (
                    t.clone().into_bytes(),
                    RawConn::block_acquire(server, key, &t, 600_000, 0),
                )
            })
            .collect();
        held.push(Held {
            key,
            token,
            fence,
            waiters,
        });
    }
    w.call(&[b"SET", b"fz:string", b"a string"]);
    w.call(&[b"RPUSH", b"fz:list", b"a", b"b"]);
    let target = Target {
        held,
        strings: vec![
            (b"fz:string".to_vec(), b"a string".to_vec()),
            (b"fz:list".to_vec(), b"a,b".to_vec()),
        ],
        clock_us: now_us(),
    };
    let want: i64 = 3;
    let start = Instant::now();
    while info_number(&mut w, "lock", "lock_waiters") != want {
        assert!(start.elapsed() < Duration::from_secs(10));
        sleep(Duration::from_millis(5));
    }
    target
}

/// The held locks, their waiters and the other keys are as before.
fn check_untouched(server: &Server, target: &mut Target) {
    let mut w = Wire::connect(server.port);
    assert_eq!(w.call(&[b"PING"]), Resp::Simple("PONG".into()));
    for h in &target.held {
        let info = w.call(&[b"LOCK.INFO", &h.key]);
        let Resp::Array(f) = &info else {
            panic!("{info:?}")
        };
        assert_eq!(
            f[1],
            Resp::Bulk(h.token.clone()),
            "the holder of {:?}",
            h.key
        );
        assert_eq!(f[3], Resp::Int(h.fence));
        assert!(int(&f[5]) > 500_000, "the lease was not touched: {f:?}");
        assert_eq!(
            f[7],
            Resp::Int(h.waiters.len() as i64),
            "waiters of {:?}",
            h.key
        );
        assert_eq!(w.call(&[b"LOCK.FENCE", &h.key]), Resp::Int(h.fence));
        assert_eq!(
            w.call(&[b"LOCK.FENCE", &h.key, &h.token]),
            Resp::Int(h.fence)
        );
    }
    assert_eq!(
        w.call(&[b"GET", b"fz:string"]),
        Resp::Bulk(b"a string".to_vec())
    );
    assert_eq!(
        w.call(&[b"LRANGE", b"fz:list", b"0", b"-1"]),
        Resp::Array(vec![Resp::Bulk(b"a".to_vec()), Resp::Bulk(b"b".to_vec())])
    );
    // The waiters still wait, in order: a release hands the lock to the first.
    for h in &mut target.held {
        for (_, conn) in &mut h.waiters {
            assert_eq!(conn.read_within(Duration::from_millis(1)), None);
        }
        if h.waiters.is_empty() {
            continue;
        }
        assert_eq!(w.call(&[b"LOCK.RELEASE", &h.key, &h.token]), Resp::Int(1));
        let (first, conn) = &mut h.waiters[0];
        assert!(matches!(conn.read(), Resp::Int(f) if f > h.fence));
        let info = w.call(&[b"LOCK.INFO", &h.key]);
        let Resp::Array(f) = &info else {
            panic!("{info:?}")
        };
        assert_eq!(f[1], Resp::Bulk(first.clone()));
    }
}

fn check_log_clean(server: &Server) {
    let log = read_lossy(&server.dir.join("server.log"));
    for bad in [
        "panicked",
        "internal error",
        "BUG REPORT",
        "crashed by signal",
        "ASSERTION",
    ] {
        assert!(!log.contains(bad), "{bad:?} in the server log:\n{log}");
    }
}

#[test]
fn random_argvs_get_answers_or_named_errors_and_change_no_held_lock() {
    let started = Instant::now();
    let mut rng = Rng::for_test("argv fuzz", 1);
    let total = env_number("FUZZ_ITERATIONS", 200_000) as usize;
    let server = Server::start();
    let mut target = set_up(&server, &mut rng);
    let port = server.port;
    let mut counts = Counts {
        errors: 0,
        unblocked: 0,
    };
    // A warm-up share first: the memory baseline is taken after it, so
    // tables and buffers that grow once are not counted as a leak.
    let warm_up = total / 5;
    fuzz_batch(port, &mut rng, &target, warm_up, &mut counts);
    let before = clean_and_measure(port, &target);
    fuzz_batch(port, &mut rng, &target, total - warm_up, &mut counts);
    let after = clean_and_measure(port, &target);
    eprintln!(
        "argv fuzz: {total} argvs, {} errors, {} unblocked, used_memory {before} -> {after}, {:?}",
        counts.errors,
        counts.unblocked,
        started.elapsed()
    );
    assert!(
        after - before < 256 * 1024,
        "used_memory grew by {} bytes over {} argvs",
        after - before,
        total - warm_up
    );
    check_untouched(&server, &mut target);
    check_log_clean(&server);
}

/// Found by the argv fuzzer: the module reads at most eight arguments
/// (`redis::ffi::MAX_ARGS`) and took the first eight of a longer argv for the
/// whole command, so `LOCK.ACQUIRE k t 100 BLOCK 5 MINFENCE 7 junk` was
/// granted. No valid argv has more than eight arguments: longer ones are
/// refused, however long.
#[test]
fn an_argv_longer_than_any_valid_one_is_refused() {
    let server = Server::start();
    let mut w = Wire::connect(server.port);
    let valid: [&[u8]; 8] = [
        b"LOCK.ACQUIRE",
        b"k",
        b"t",
        b"100",
        b"BLOCK",
        b"5",
        b"MINFENCE",
        b"7",
    ];
    for extra in 1..4 {
        let mut argv: Vec<&[u8]> = valid.to_vec();
        argv.extend(std::iter::repeat_n(&b"junk"[..], extra));
        match w.call(&argv) {
            Resp::Error(msg) => assert!(msg.contains("junk") || msg.contains("arguments"), "{msg}"),
            other => panic!("{} arguments: {other:?}", argv.len()),
        }
        assert_eq!(w.call(&[b"EXISTS", b"k"]), Resp::Int(0));
    }
    assert!(matches!(w.call(&valid), Resp::Int(_)));
}

// ---------------------------------------------------------------------------
// Damaged RESTORE payloads, RDB files and AOF files

/// Redis's CRC64 (Jones polynomial, reflected), as DUMP and RDB use it.
fn crc64(data: &[u8]) -> u64 {
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
struct Dump {
    body: Vec<u8>,
    version: [u8; 2],
}

impl Dump {
    fn of(w: &mut Wire, key: &[u8]) -> Dump {
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
fn damage(rng: &mut Rng, bytes: &mut Vec<u8>, range: std::ops::Range<usize>, numbers: &[usize]) {
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
/// 64-bit lengths at its end, encoding version 2), given the position of
/// the EOF opcode that follows it.
fn number_fields(bytes: &[u8], eof: usize) -> Vec<usize> {
    let fence = eof - 28;
    let deadline = eof - 18;
    let granted = eof - 8;
    assert_eq!(
        (bytes[fence - 1], bytes[deadline - 1], bytes[granted - 1]),
        (0x81, 0x81, 0x81)
    );
    vec![fence, deadline, granted]
}

/// A restored or loaded lock must be whole: a token of 1 to 512 bytes, a
/// positive fence no more than 2^50 µs above `bound_us`, a lease.
fn check_lock_valid(w: &mut Wire, key: &[u8], bound_us: i64) {
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
fn lock_tokens() -> Vec<Vec<u8>> {
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

/// A server started on a data directory prepared by the test.
struct Boot {
    child: Child,
    port: u16,
}

enum Booted {
    Up(Boot),
    Exited(ExitStatus, String),
    /// Refused the file, then hung in Redis's own redis-check-rdb (see
    /// `boot`); killed.
    CheckerHung(String),
}

impl Drop for Boot {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A log as text, whatever bytes a damaged file put in it.
fn read_lossy(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// A fresh directory, its name unique in this run (tests run in parallel).
fn scratch_dir(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("redis-lock-fuzz-{}-{n}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Starts the server on `dir`; Up once it answers PING, Exited (with its
/// log) if it stops first.
/// `hang_after`: how long a server that has logged an RDB refusal may take
/// to exit before it counts as hung (see below). Short only where a hang is
/// expected (a cut file); a refused file otherwise gets ample time, as the
/// server's checker can be slow on a loaded machine.
fn boot(dir: &Path, config: &[&str], hang_after: Duration) -> Booted {
    for _ in 0..3 {
        let port = free_port();
        let log = dir.join("server.log");
        let _ = std::fs::remove_file(&log);
        let child = Command::new(server_binary())
            .current_dir(dir)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--daemonize",
                "no",
                "--save",
                "",
                "--enable-debug-command",
                "yes",
            ])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log)
            .args(config)
            .arg("--loadmodule")
            .arg(module_path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.txt")).unwrap())
            .spawn()
            .expect("start the server");
        let mut boot = Boot { child, port };
        let start = Instant::now();
        let mut refused_at = None;
        loop {
            if let Some(status) = boot.child.try_wait().unwrap() {
                let text = read_lossy(&log) + &read_lossy(&dir.join("stderr.txt"));
                if text.contains("Address already in use") {
                    break;
                }
                return Booted::Exited(status, text);
            }
            // After refusing an RDB file the server runs redis-check-rdb in
            // its own process, which on Redis 7.0 loops forever when the
            // file ends inside a module value (rdbLoadCheckModuleValue
            // never sees the EOF opcode). The refusal is made; stop it.
            let text = read_lossy(&log);
            if text.contains("Internal error in RDB reading") {
                let at = *refused_at.get_or_insert_with(Instant::now);
                if at.elapsed() > hang_after {
                    return Booted::CheckerHung(text);
                }
            }
            if refused_at.is_none() && answers_ping(port) {
                return Booted::Up(boot);
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the server on {dir:?} neither started nor stopped; log:\n{text}"
            );
            sleep(Duration::from_millis(10));
        }
    }
    panic!("no free port");
}

/// PONG (not LOADING, not a reset by a server that gives up loading).
fn answers_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

/// A refusal is an orderly exit with a log line that says why; never a
/// crash by a signal. (Redis 7.0 exits with 0 when its in-process
/// redis-check-rdb, which cannot judge module values, finds the file
/// well-formed after the module refused a value; otherwise with 1.)
fn check_refusal(status: ExitStatus, log: &str, what: &str) {
    assert!(
        status.signal().is_none() && matches!(status.code(), Some(0 | 1)),
        "{what}: the server ended with {status:?}; log:\n{log}"
    );
    for bad in ["crashed by signal", "BUG REPORT", "panicked", "ASSERTION"] {
        assert!(!log.contains(bad), "{what}: {bad:?} in the log:\n{log}");
    }
    let reasons = [
        "lock: refusing",
        "Internal error in RDB",
        "Short read",
        "Bad file format",
        "Unexpected end of file",
        "Unrecoverable error",
        "Unknown command",
        "Wrong RDB checksum",
        "Fatal error",
        "Error reading the append only file",
    ];
    assert!(
        reasons.iter().any(|r| log.contains(r)),
        "{what}: the log does not say why the server stopped ({status:?}):\n{log}"
    );
}

/// The last warning the server logged (the reason it gives for stopping).
fn last_warning(log: &str) -> String {
    log.lines()
        .rev()
        .find(|l| l.contains(" # "))
        .map(|l| {
            l.split(" # ")
                .nth(1)
                .unwrap_or(l)
                .chars()
                .take(120)
                .collect()
        })
        .unwrap_or_default()
}

/// Every key the started server holds is of its type and, if a lock,
/// whole; the server answers.
fn check_loaded(boot: &Boot) -> usize {
    let mut w = Wire::connect(boot.port);
    let mut locks = 0;
    let Resp::Array(keys) = w.call(&[b"KEYS", b"*"]) else {
        panic!()
    };
    for k in keys {
        let Resp::Bulk(k) = k else { panic!() };
        if w.call(&[b"TYPE", &k]) == Resp::Simple("redislock".into()) {
            let bound = now_us().max(info_number(&mut w, "lock", "lock_fence_hwm"));
            check_lock_valid(&mut w, &k, bound);
            locks += 1;
        }
    }
    assert_eq!(w.call(&[b"PING"]), Resp::Simple("PONG".into()));
    locks
}

#[test]
fn damaged_rdb_files_are_refused_or_load_only_whole_locks() {
    if common::skip_unless(
        common::Needs::LocalProcess,
        "starts the server binary by hand on damaged files",
    ) {
        return;
    }
    let started = Instant::now();
    let mut rng = Rng::for_test("RDB fuzz", 3);
    let cases = env_number("FUZZ_FILE_CASES", 40) as usize;
    let server = Server::start();
    let mut w = Wire::connect(server.port);
    let mut dumps = vec![];
    for (i, token) in lock_tokens().iter().enumerate() {
        let key = format!("lock:{i}").into_bytes();
        int(&w.call(&[b"LOCK.ACQUIRE", &key, token, b"600000"]));
        dumps.push(Dump::of(&mut w, &key));
    }
    w.call(&[b"SET", b"plain", b"value"]);
    assert_eq!(w.call(&[b"SAVE"]), Resp::Simple("OK".into()));
    let rdb = std::fs::read(server.dir.join("dump.rdb")).unwrap();
    drop(server);
    // The lock values (and their EOF opcodes) and the module's aux field.
    let mut regions = vec![];
    let mut numbers = vec![];
    for d in &dumps {
        let needle = &d.body[1..];
        let at = rdb
            .windows(needle.len())
            .position(|x| x == needle)
            .expect("the value in the RDB file");
        regions.push(at + 9..at + needle.len());
        numbers.extend(number_fields(&rdb, at + needle.len() - 1));
    }
    let aux = [&[0xf7u8][..], &dumps[0].body[1..10]].concat();
    let at = rdb
        .windows(10)
        .position(|x| x == aux)
        .expect("the aux field");
    // `when` (a number, with its opcode), the mark as a 64-bit number, and
    // the EOF opcode.
    assert_eq!(
        (rdb[at + 10], rdb[at + 12], rdb[at + 13], rdb[at + 22]),
        (0x02, 0x02, 0x81, 0x00)
    );
    regions.push(at + 10..at + 23);
    numbers.push(at + 14);
    let (mut loaded, mut refused, mut hung) = (0, 0, 0);
    let mut reasons = HashSet::new();
    for case in 0..cases {
        let mut bytes = rdb.clone();
        let region = rng.pick(&regions).clone();
        let truncated = rng.chance(20);
        if truncated {
            bytes.truncate(rng.range(region.start as i64, region.end as i64 - 1) as usize);
        } else {
            let len_before = bytes.len();
            damage(&mut rng, &mut bytes, region, &numbers);
            let n = bytes.len();
            assert!(n + 8 >= len_before);
            let crc = crc64(&bytes[..n - 8]);
            bytes[n - 8..].copy_from_slice(&crc.to_le_bytes());
        }
        let dir = scratch_dir(&format!("rdb-{case}"));
        std::fs::write(dir.join("dump.rdb"), &bytes).unwrap();
        let hang_after = Duration::from_secs(if truncated { 1 } else { 20 });
        match boot(
            &dir,
            &["--dbfilename", "dump.rdb", "--appendonly", "no"],
            hang_after,
        ) {
            Booted::Up(b) => {
                check_loaded(&b);
                loaded += 1;
            }
            Booted::Exited(status, log) => {
                check_refusal(status, &log, &format!("RDB case {case}"));
                reasons.insert(last_warning(&log));
                refused += 1;
            }
            Booted::CheckerHung(log) => {
                assert!(truncated, "only a cut file hangs the checker:\n{log}");
                check_refusal(
                    ExitStatus::from_raw(1 << 8),
                    &log,
                    &format!("RDB case {case}"),
                );
                hung += 1;
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    eprintln!(
        "RDB fuzz: {cases} damaged files, {loaded} loaded, {refused} refused, {hung} refused \
         but then hung in Redis's redis-check-rdb, {:?}; reasons: {reasons:#?}",
        started.elapsed()
    );
}

/// One command in RESP, as the AOF stores it.
fn resp(argv: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", argv.len()).into_bytes();
    for a in argv {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn resp_owned(argv: &[Vec<u8>]) -> Vec<u8> {
    resp(&argv.iter().map(Vec::as_slice).collect::<Vec<_>>())
}

/// The arguments of one well-formed command in RESP.
fn parse_command(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut args = vec![];
    let mut at = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    while at < bytes.len() {
        let eol = at + bytes[at..].iter().position(|&b| b == b'\r').unwrap();
        let len: usize = std::str::from_utf8(&bytes[at + 1..eol])
            .unwrap()
            .parse()
            .unwrap();
        args.push(bytes[eol + 2..eol + 2 + len].to_vec());
        at = eol + 2 + len + 2;
    }
    args
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// The AOF's base file (written by the module's aof_rewrite, as LOCK._SET
/// commands) and newest incremental file (LOCK._SET effects of grants).
fn aof_files(dir: &Path) -> (PathBuf, PathBuf) {
    let mut base = None;
    let mut incr = vec![];
    for entry in std::fs::read_dir(dir.join("appendonlydir")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".base.aof") {
            base = Some(path);
        } else if name.ends_with(".incr.aof") {
            incr.push(path);
        }
    }
    incr.sort();
    (base.expect("a base AOF"), incr.pop().expect("an incr AOF"))
}

/// Byte ranges of the LOCK._SET commands in an AOF file.
fn set_commands(bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
    let starts: Vec<usize> = (0..bytes.len())
        .filter(|&i| bytes[i] == b'*' && (i == 0 || bytes[i - 1] == b'\n'))
        .collect();
    let mut ranges = vec![];
    for (n, &start) in starts.iter().enumerate() {
        let end = starts.get(n + 1).copied().unwrap_or(bytes.len());
        if bytes[start..end].windows(9).any(|w| w == b"LOCK._SET") {
            ranges.push(start..end);
        }
    }
    ranges
}

/// An AOF (without RDB preamble) holding four locks in its base file and
/// two more in its incremental file; the data directory and the locks.
fn aof_with_locks() -> (PathBuf, Vec<(Vec<u8>, Resp)>) {
    let server = Server::builder()
        .config("appendonly", "yes")
        .config("appendfsync", "always")
        .config("aof-use-rdb-preamble", "no")
        .start();
    let mut w = Wire::connect(server.port);
    let mut keys = vec![];
    for (i, token) in lock_tokens().iter().enumerate() {
        let key = format!("lock:{i}").into_bytes();
        int(&w.call(&[b"LOCK.ACQUIRE", &key, token, b"600000"]));
        keys.push(key);
    }
    w.call(&[b"SET", b"plain", b"value"]);
    w.call(&[b"BGREWRITEAOF"]);
    sleep(Duration::from_millis(100));
    server.wait_persistence_idle();
    for i in 4..6 {
        let key = format!("lock:{i}").into_bytes();
        int(&w.call(&[b"LOCK.ACQUIRE", &key, b"later", b"600000"]));
        keys.push(key);
    }
    let locks = keys
        .into_iter()
        .map(|k| {
            let info = w.call(&[b"LOCK.INFO", &k]);
            (k, info)
        })
        .collect();
    let dir = scratch_dir("aof-source");
    copy_dir(
        &server.dir.join("appendonlydir"),
        &dir.join("appendonlydir"),
    );
    drop(server);
    let (base, _) = aof_files(&dir);
    assert_eq!(set_commands(&std::fs::read(base).unwrap()).len(), 4);
    (dir, locks)
}

const AOF_CONFIG: [&str; 4] = ["--appendonly", "yes", "--aof-use-rdb-preamble", "no"];

/// The same token and fence as before the restart.
fn same_holder(w: &mut Wire, key: &[u8], before: &Resp) -> bool {
    match (w.call(&[b"LOCK.INFO", key]), before) {
        (Resp::Array(now), Resp::Array(before)) => (&now[1], &now[3]) == (&before[1], &before[3]),
        _ => false,
    }
}

/// Appends `commands` (their key argument replaced by `bad:<i>`) and
/// commands against a held lock with another token, BLOCK included, to an
/// AOF holding locks, and starts the server on it. Either it starts, with
/// none of the `bad:` keys and the locks as before, or it refuses the file
/// with a log line. Returns the log, and whether the server started.
fn load_aof_with(commands: &[Vec<&[u8]>]) -> (String, bool) {
    let (source, locks) = aof_with_locks();
    let keys: Vec<Vec<u8>> = (0..commands.len())
        .map(|i| format!("bad:{i}").into_bytes())
        .collect();
    let mut aof = vec![];
    for (argv, key) in commands.iter().zip(&keys) {
        let mut argv = argv.clone();
        if argv.len() > 1 {
            argv[1] = key;
        }
        aof.extend(resp(&argv));
    }
    let held = &locks[0].0;
    for argv in [
        vec![
            &b"LOCK.ACQUIRE"[..],
            held,
            b"other",
            b"1000",
            b"BLOCK",
            b"0",
        ],
        vec![b"LOCK.ACQUIRE", held, b"other", b"1000"],
        vec![b"LOCK.RELEASE", held, b"other"],
        vec![b"LOCK.EXTEND", held, b"other", b"5"],
    ] {
        aof.extend(resp(&argv));
    }
    let dir = scratch_dir("aof-bad-commands");
    copy_dir(&source.join("appendonlydir"), &dir.join("appendonlydir"));
    let _ = std::fs::remove_dir_all(&source);
    let (_, incr) = aof_files(&dir);
    std::fs::OpenOptions::new()
        .append(true)
        .open(incr)
        .unwrap()
        .write_all(&aof)
        .unwrap();
    let started = match boot(&dir, &AOF_CONFIG, Duration::from_secs(20)) {
        Booted::Up(b) => {
            let mut w = Wire::connect(b.port);
            for key in &keys {
                assert_eq!(w.call(&[b"EXISTS", key]), Resp::Int(0), "{key:?}");
            }
            for (key, before) in &locks {
                assert!(
                    same_holder(&mut w, key, before),
                    "{key:?}: {before:?} became {:?}",
                    w.call(&[b"LOCK.INFO", key])
                );
            }
            assert_eq!(check_loaded(&b), locks.len());
            true
        }
        Booted::Exited(status, log) => {
            check_refusal(status, &log, "the AOF with damaged commands");
            false
        }
        Booted::CheckerHung(log) => panic!("the server hung:\n{log}"),
    };
    let log = read_lossy(&dir.join("server.log"));
    let _ = std::fs::remove_dir_all(&dir);
    (log, started)
}

/// LOCK._SET lines with bad fences, deadlines and tokens, appended to a
/// good AOF, are refused (their keys are not created) and nothing else
/// changes; so are contended commands, also one that asks to BLOCK while
/// the AOF loads. (Redis 7.0 drops a command's error silently, Valkey logs
/// it; the module logs a fence beyond its bound.)
#[test]
fn damaged_lock_set_commands_in_the_aof_are_refused() {
    if common::skip_unless(
        common::Needs::LocalProcess,
        "starts the server binary by hand on damaged files",
    ) {
        return;
    }
    let deadline = (now_us() / 1000 + 600_000).to_string();
    let too_far = (now_us() + 2 * MAX_FENCE_LEAD).to_string();
    let big = vec![b'x'; 513];
    let mut bad: Vec<Vec<&[u8]>> = vec![];
    for fence in [
        &b"0"[..],
        b"-1",
        b"abc",
        b"",
        b"+5",
        b" 5",
        b"5 ",
        b"1.5",
        b"05",
        b"9223372036854775808",
        b"99999999999999999999",
        b"-9223372036854775808",
        too_far.as_bytes(),
    ] {
        bad.push(vec![b"LOCK._SET", b"", b"tok", fence, deadline.as_bytes()]);
    }
    for d in [
        &b"-1"[..],
        b"abc",
        b"",
        b"253402300800001",
        b"99999999999999999999",
        b"1e3",
    ] {
        bad.push(vec![b"LOCK._SET", b"", b"tok", b"5", d]);
    }
    bad.push(vec![b"LOCK._SET", b"", b"", b"5", deadline.as_bytes()]);
    bad.push(vec![b"LOCK._SET", b"", &big, b"5", deadline.as_bytes()]);
    bad.push(vec![b"LOCK.ACQUIRE", b"", b"tok", b"abc"]);
    bad.push(vec![b"LOCK.ACQUIRE", b"", b"tok", b"100", b"BLOCK"]);
    let (log, started) = load_aof_with(&bad);
    assert!(started, "{log}");
    assert!(log.contains("refusing LOCK._SET"), "{log}");
}

/// Commands of the wrong arity in the AOF: Redis 7.0 hands them to the
/// module, which refuses them; Valkey refuses the whole file.
#[test]
fn lock_commands_of_the_wrong_arity_in_the_aof_are_refused() {
    if common::skip_unless(
        common::Needs::LocalProcess,
        "starts the server binary by hand on damaged files",
    ) {
        return;
    }
    let deadline = (now_us() / 1000 + 600_000).to_string();
    let bad: Vec<Vec<&[u8]>> = vec![
        vec![b"LOCK._SET", b"", b"tok", b"5"],
        vec![b"LOCK._SET", b""],
        vec![b"LOCK._SET"],
        vec![b"LOCK._SET", b"", b"tok", b"5", deadline.as_bytes(), b"x"],
        vec![b"LOCK.ACQUIRE", b""],
        vec![b"LOCK.ACQUIRE"],
        vec![b"LOCK.RELEASE", b"", b"tok", b"x"],
        vec![b"LOCK.FENCE", b"", b"x", b"y"],
        vec![b"LOCK.INFO"],
    ];
    load_aof_with(&bad);
}

/// Random damage to the LOCK._SET commands of the base or incremental AOF
/// file (bytes flipped, cut, inserted, the file truncated): the server
/// refuses to start with a log line, or starts with whole locks only.
#[test]
fn damaged_aof_files_are_refused_or_load_only_whole_locks() {
    if common::skip_unless(
        common::Needs::LocalProcess,
        "starts the server binary by hand on damaged files",
    ) {
        return;
    }
    let started = Instant::now();
    let mut rng = Rng::for_test("AOF fuzz", 4);
    let cases = env_number("FUZZ_FILE_CASES", 40) as usize;
    let (source, locks) = aof_with_locks();
    let (mut loaded, mut refused, mut intact) = (0, 0, 0);
    let mut reasons = HashSet::new();
    for case in 0..cases {
        let dir = scratch_dir(&format!("aof-{case}"));
        copy_dir(&source.join("appendonlydir"), &dir.join("appendonlydir"));
        let (base, incr) = aof_files(&dir);
        let file = if rng.chance(50) { base } else { incr };
        let mut bytes = std::fs::read(&file).unwrap();
        let commands = set_commands(&bytes);
        let command = rng.pick(&commands).clone();
        let mut args = parse_command(&bytes[command.clone()]);
        // The arguments are damaged and the command written back with
        // lengths that match, so the module (not Redis's AOF parser, which
        // trusts a bulk length and aborts on an impossible allocation) has
        // to refuse them. Cuts and small framing errors are kept.
        match rng.below(8) {
            0 => {
                let at = rng.range(command.start as i64, command.end as i64 - 1);
                bytes.truncate(at as usize);
            }
            1 => {
                let i = rng.range(2, args.len() as i64 - 1) as usize;
                args[i] = match rng.below(3) {
                    0 => junk(&mut rng),
                    _ => number(&mut rng, now_us()),
                };
            }
            2 | 3 => {
                let i = rng.range(1, args.len() as i64 - 1) as usize;
                if !args[i].is_empty() {
                    let at = rng.below(args[i].len());
                    match rng.below(3) {
                        0 => args[i][at] ^= 1 << rng.below(8),
                        1 => {
                            args[i].remove(at);
                        }
                        _ => args[i].insert(at, *rng.pick(b"-+ 09x\0\r\n")),
                    }
                }
            }
            4 => {
                let i = rng.range(1, args.len() as i64 - 1) as usize;
                if rng.chance(50) {
                    args.remove(i);
                } else {
                    let copy = args[i].clone();
                    args.insert(i, copy);
                }
            }
            5 => args[0][rng.below(9)] = rng.next() as u8,
            6 => {
                // A small error in the argument count.
                let n = args.len() as i64 + rng.range(-2, 2);
                let mut out = resp_owned(&args);
                let eol = out.iter().position(|&b| b == b'\r').unwrap();
                out.splice(1..eol, n.to_string().into_bytes());
                bytes.splice(command.clone(), out);
                args.clear();
            }
            _ => {
                // A small error in one argument's length.
                let mut out = resp_owned(&args);
                let dollars: Vec<usize> = (0..out.len())
                    .filter(|&i| out[i] == b'$' && out[i - 1] == b'\n')
                    .collect();
                let at = *rng.pick(&dollars);
                let eol = at + out[at..].iter().position(|&b| b == b'\r').unwrap();
                let len: i64 = std::str::from_utf8(&out[at + 1..eol])
                    .unwrap()
                    .parse()
                    .unwrap();
                let len = (len + rng.range(-3, 3)).max(0);
                out.splice(at + 1..eol, len.to_string().into_bytes());
                bytes.splice(command.clone(), out);
                args.clear();
            }
        }
        if !args.is_empty() && bytes.len() >= command.end {
            bytes.splice(command.clone(), resp_owned(&args));
        }
        std::fs::write(&file, &bytes).unwrap();
        match boot(&dir, &AOF_CONFIG, Duration::from_secs(20)) {
            Booted::Up(b) => {
                check_loaded(&b);
                let mut w = Wire::connect(b.port);
                if locks
                    .iter()
                    .all(|(k, before)| same_holder(&mut w, k, before))
                {
                    intact += 1;
                }
                loaded += 1;
            }
            Booted::CheckerHung(log) => panic!("AOF case {case}: hung\n{log}"),
            Booted::Exited(status, log) => {
                check_refusal(status, &log, &format!("AOF case {case}"));
                reasons.insert(last_warning(&log));
                refused += 1;
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&source);
    eprintln!(
        "AOF fuzz: {cases} damaged files, {loaded} loaded ({intact} with every lock as before), {refused} refused, {:?}; reasons: {reasons:#?}",
        started.elapsed()
    );
}
