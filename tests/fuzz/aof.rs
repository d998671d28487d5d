//! Damaged AOF files: bad `LOCK._SET` lines and lock commands of the wrong
//! arity appended to a good AOF, and random damage to the `LOCK._SET`
//! commands of its base and incremental files.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis_lock_testkit as common;

use common::{Resp, Server};

use crate::boot::{
    boot, check_loaded, check_refusal, last_warning, read_lossy, scratch_dir, Booted,
};
use crate::generators::{junk, number, MAX_FENCE_LEAD};
use crate::restore::lock_tokens;
use crate::rng::{env_number, now_us, Rng};
use crate::wire::{int, Wire};

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

/// The delta forms of a shared key, damaged: `LOCK._HOLD` lines with bad
/// limits, fences, deadlines and tokens, and `LOCK._DROP` of nobody or of
/// a bad token, appended to a good AOF, are refused or change nothing, and
/// the locks are as they were.
#[test]
fn damaged_shared_holder_commands_in_the_aof_are_refused() {
    if common::skip_unless(
        common::Needs::LocalProcess,
        "starts the server binary by hand on damaged files",
    ) {
        return;
    }
    let deadline = (now_us() / 1000 + 600_000).to_string();
    let too_far = (now_us() + 2 * MAX_FENCE_LEAD).to_string();
    let big = vec![b'x'; 513];
    let d = deadline.as_bytes();
    let mut bad: Vec<Vec<&[u8]>> = vec![];
    for limit in [&b"0"[..], b"-2", b"x", b"", b"99999999999999999999"] {
        bad.push(vec![b"LOCK._HOLD", b"", limit, b"tok", b"5", d, b"0"]);
    }
    for fence in [&b"0"[..], b"-1", b"abc", b"", too_far.as_bytes()] {
        bad.push(vec![b"LOCK._HOLD", b"", b"-1", b"tok", fence, d, b"0"]);
    }
    for dl in [&b"-1"[..], b"abc", b"253402300800001"] {
        bad.push(vec![b"LOCK._HOLD", b"", b"-1", b"tok", b"5", dl, b"0"]);
    }
    bad.push(vec![b"LOCK._HOLD", b"", b"-1", b"", b"5", d, b"0"]);
    bad.push(vec![b"LOCK._HOLD", b"", b"-1", &big, b"5", d, b"0"]);
    bad.push(vec![b"LOCK._DROP", b"", b""]);
    bad.push(vec![b"LOCK._DROP", b"", &big]);
    bad.push(vec![b"LOCK._DROP", b"", b"nobody"]);
    let (log, started) = load_aof_with(&bad);
    assert!(started, "{log}");
    assert!(log.contains("refusing LOCK._HOLD"), "{log}");
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
        vec![b"LOCK._HOLD", b"", b"-1", b"tok", b"5", deadline.as_bytes()],
        vec![b"LOCK._DROP", b""],
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
