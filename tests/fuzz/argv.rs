//! Live argv fuzzing: random argvs for every command, pipelined against a
//! server holding locks with waiters; what a plain reading of the README
//! allows as their replies; and the checks that the held locks, their
//! waiters and the other keys were not touched, memory stayed flat and the
//! log is clean.

use std::thread::sleep;
use std::time::{Duration, Instant};

use redis_lock_testkit::{RawConn, Resp, Server};

use crate::boot::read_lossy;
use crate::generators::{
    argv, canonical, token_ok, Held, KeyKind, Target, COMMANDS, MAX_DURATION, MAX_TTL,
};
use crate::rng::{env_number, now_us, Rng};
use crate::wire::{check_error_names_a_problem, info_number, info_text, int, show_argv, Wire};
use redis_lock_core::protocol::info_field;

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

/// The parser's bound on a public value, and `lock.max-value-len`'s default.
const MAX_VALUE: usize = 16 * 1024;
const DEFAULT_MAX_VALUE: usize = 1024;

fn expect(argv: &[Vec<u8>], target: &Target) -> Expect {
    let name = COMMANDS
        .iter()
        .find(|c| argv[0].eq_ignore_ascii_case(c.as_bytes()))
        .expect("a known command");
    let n = argv.len();
    let arity_ok = match *name {
        "LOCK.ACQUIRE" => n >= 4,
        "LOCK.RELEASE" => n == 3,
        "LOCK.EXTEND" => (4..=6).contains(&n),
        "LOCK.FENCE" => n >= 2,
        "LOCK.INFO" => n == 2,
        "LOCK._HOLD" => n == 7,
        "LOCK._DROP" => n == 3,
        // Arity -5 (granted-ms is optional); the module refuses it from
        // clients before it looks further.
        _ => n >= 5,
    };
    if !arity_ok {
        return Expect::Error(vec!["wrong number of arguments"]);
    }
    if name.starts_with("LOCK._") {
        return Expect::Error(vec!["internal"]);
    }
    let mut problems = vec![];
    let check_token = |t: &[u8], problems: &mut Vec<&'static str>| {
        if !token_ok(t) {
            problems.push("token");
        }
    };
    // A lease is parsed first (a positive integer; one too large for 64
    // bits reads as the longest); its bound, lock.max-ttl-ms, is the
    // node's, checked once the whole command parsed.
    let positive_digits =
        |t: &[u8]| !t.is_empty() && t[0] != b'0' && t.iter().all(u8::is_ascii_digit);
    let ttl_ok = |t: &[u8]| canonical(t).is_some_and(|v| v >= 1) || positive_digits(t);
    let ttl_too_large = |t: &[u8]| ttl_ok(t) && canonical(t).is_none_or(|v| v > MAX_TTL);
    let mut over_max_ttl = false;
    // A value within the parser's 16 KiB but above lock.max-value-len
    // (1024 by default): the node's check, after the lease's.
    let mut over_max_value = false;
    let mut may_refuse_min_fence = false;
    let mut min_fence_too_large = false;
    let mut blocks = false;
    match *name {
        "LOCK.ACQUIRE" => {
            check_token(&argv[2], &mut problems);
            if !ttl_ok(&argv[3]) {
                problems.push("ttl-ms");
            }
            over_max_ttl = ttl_too_large(&argv[3]);
            let (mut block, mut min, mut shared, mut limit) = (false, false, false, false);
            let mut valued = false;
            let mut i = 4;
            while i < n {
                let word = &argv[i];
                if word.eq_ignore_ascii_case(b"SHARED") && !shared {
                    shared = true;
                    i += 1;
                    continue;
                }
                let value = argv.get(i + 1);
                i += 2;
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
                } else if word.eq_ignore_ascii_case(b"VALUE") && !valued {
                    valued = true;
                    match value.map(|v| v.len()) {
                        Some(len) if len <= MAX_VALUE => over_max_value = len > DEFAULT_MAX_VALUE,
                        _ => {
                            problems.push("VALUE");
                            break;
                        }
                    }
                } else if word.eq_ignore_ascii_case(b"LIMIT") && !limit {
                    limit = true;
                    match value.and_then(|v| canonical(v)) {
                        Some(l) if (1..=1 << 20).contains(&l) => {}
                        _ => {
                            problems.push("LIMIT");
                            break;
                        }
                    }
                } else {
                    problems.push("option");
                    break;
                }
            }
            if limit && !shared && problems.is_empty() {
                problems.push("LIMIT");
            }
            if valued && shared && problems.is_empty() {
                problems.push("VALUE");
            }
        }
        "LOCK.RELEASE" => check_token(&argv[2], &mut problems),
        "LOCK.EXTEND" => {
            check_token(&argv[2], &mut problems);
            if !ttl_ok(&argv[3]) {
                problems.push("ttl-ms");
            }
            over_max_ttl = ttl_too_large(&argv[3]);
            // `[VALUE v]`: another word is an unknown option; VALUE alone
            // needs its value; a value over lock.max-value-len is refused.
            let value_word = |w: &[u8]| w.eq_ignore_ascii_case(b"VALUE");
            match &argv[4..] {
                [] => {}
                [w] if value_word(w) => problems.push("VALUE"),
                [w, v] if value_word(w) && v.len() > MAX_VALUE => problems.push("VALUE"),
                [w, v] if value_word(w) => over_max_value = v.len() > DEFAULT_MAX_VALUE,
                _ => problems.push("option"),
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
    if over_max_ttl {
        return Expect::Error(vec!["ttl-ms"]);
    }
    if over_max_value {
        return Expect::Error(vec!["VALUE"]);
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
    // A mode or limit other than the key's holders have (the fuzz keys'
    // modes are not tracked): an error that says so.
    if let ("LOCK.ACQUIRE", Resp::Error(msg)) = (command, got) {
        assert!(
            msg.contains("LIMIT")
                || msg.contains("no upgrade")
                || (may_refuse_min_fence && msg.contains("MINFENCE")),
            "{msg:?} for {}",
            show()
        );
        return;
    }
    // A value from a shared key's holder (the fuzz keys' modes are not
    // tracked): refused, saying so.
    if let ("LOCK.EXTEND", Resp::Error(msg)) = (command, got) {
        assert!(
            msg.contains("VALUE is for an exclusive holder"),
            "{msg:?} for {}",
            show()
        );
        return;
    }
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
            fields.len() == 2 * info_field::ALL.len()
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

pub fn check_log_clean(server: &Server) {
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

/// Found by the argv fuzzer: the module reads at most a few arguments
/// (`redis::ffi::MAX_ARGS`) and took the first eight of a longer argv for the
/// whole command, so `LOCK.ACQUIRE k t 100 BLOCK 5 MINFENCE 7 junk` was
/// granted. No valid argv has more than eleven arguments (`LOCK.ACQUIRE k t
/// 100 SHARED LIMIT 2 BLOCK 5 MINFENCE 7`): longer ones are refused,
/// however long, each for a problem it has.
#[test]
fn an_argv_longer_than_any_valid_one_is_refused() {
    let server = Server::start();
    let mut w = Wire::connect(server.port);
    let valid: [&[u8]; 11] = [
        b"LOCK.ACQUIRE",
        b"k",
        b"t",
        b"100",
        b"SHARED",
        b"LIMIT",
        b"2",
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
    // Every option once, VALUE among them (13 arguments, the longest read
    // whole): refused for what is wrong with it, VALUE with SHARED.
    let mut all: Vec<&[u8]> = valid.to_vec();
    all.extend([&b"VALUE"[..], b"v"]);
    match w.call(&all) {
        Resp::Error(msg) => assert!(msg.contains("VALUE is for an exclusive holder"), "{msg}"),
        other => panic!("{other:?}"),
    }
}
