//! Cost per command: throughput at pipeline 1 and 16 from 50 connections,
//! and server instructions per command counted by callgrind, for the lock
//! commands and what people run today.

use std::process::Command;
use std::time::Duration;

use crate::common::{Connection, Server};
use crate::load::{self, encode};

/// A token the size of a UUID, as lock libraries use.
pub const TOKEN: &[u8] = TOKEN_STR.as_bytes();
const TOKEN_STR: &str = "6f1c2a9e-3b7d-4e58-9c0a-d2f4b6e8a1c3";
const TTL: &[u8] = b"600000";
/// Keys reused by rows that need an existing lock or string.
const HOT_KEYS: usize = 100_000;

const CAD_LUA: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
const CAE_LUA: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
const ACQUIRE_FENCE_LUA: &str = "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('incr', KEYS[2]) else return false end";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Row {
    Ping,
    Get,
    SetNxPx,
    Acquire,
    AcquireContended,
    Release,
    LuaRelease,
    Extend,
    LuaExtend,
    Fence,
    LuaAcquireFence,
    SetIfeq,
}

impl Row {
    pub const ALL: [Row; 12] = [
        Row::Ping,
        Row::Get,
        Row::SetNxPx,
        Row::Acquire,
        Row::AcquireContended,
        Row::Release,
        Row::LuaRelease,
        Row::Extend,
        Row::LuaExtend,
        Row::Fence,
        Row::LuaAcquireFence,
        Row::SetIfeq,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Row::Ping => "PING",
            Row::Get => "GET",
            Row::SetNxPx => "SET NX PX (granted)",
            Row::Acquire => "LOCK.ACQUIRE (granted)",
            Row::AcquireContended => "LOCK.ACQUIRE (contended, nil)",
            Row::Release => "LOCK.RELEASE",
            Row::LuaRelease => "EVALSHA compare-and-delete",
            Row::Extend => "LOCK.EXTEND",
            Row::LuaExtend => "EVALSHA compare-and-extend",
            Row::Fence => "LOCK.FENCE",
            Row::LuaAcquireFence => "EVALSHA SET NX PX + INCR fence",
            Row::SetIfeq => "SET IFEQ (Valkey 8.1)",
        }
    }

    /// Rows of the module's commands; the others are what a user would
    /// pick instead, measured on a server without the module (what they
    /// would run on).
    pub fn needs_module(self) -> bool {
        matches!(
            self,
            Row::Acquire | Row::AcquireContended | Row::Release | Row::Extend | Row::Fence
        )
    }

    /// Rows that need the server to have a feature.
    pub fn supported(self, valkey: bool) -> bool {
        self != Row::SetIfeq || valkey
    }
}

pub struct Shas {
    cad: String,
    cae: String,
    acquire_fence: String,
}

pub fn load_scripts(c: &mut Connection) -> Shas {
    let load = |c: &mut Connection, s: &str| -> String {
        redis::cmd("SCRIPT").arg("LOAD").arg(s).query(c).unwrap()
    };
    Shas {
        cad: load(c, CAD_LUA),
        cae: load(c, CAE_LUA),
        acquire_fence: load(c, ACQUIRE_FENCE_LUA),
    }
}

fn key(prefix: &str, i: usize) -> Vec<u8> {
    format!("{prefix}:{i}").into_bytes()
}

/// Command `i` of `row`.
fn command(row: Row, shas: &Shas, i: usize, buf: &mut Vec<u8>) {
    let hot = i % HOT_KEYS;
    match row {
        Row::Ping => encode(buf, &[b"PING"]),
        Row::Get => encode(buf, &[b"GET", &key("s", hot)]),
        Row::SetNxPx => encode(buf, &[b"SET", &key("s", i), TOKEN, b"NX", b"PX", TTL]),
        Row::Acquire => encode(buf, &[b"LOCK.ACQUIRE", &key("l", i), TOKEN, TTL]),
        Row::AcquireContended => encode(
            buf,
            &[b"LOCK.ACQUIRE", &key("l", hot), b"someone-else", TTL],
        ),
        Row::Release => encode(buf, &[b"LOCK.RELEASE", &key("l", i), TOKEN]),
        Row::LuaRelease => encode(
            buf,
            &[b"EVALSHA", shas.cad.as_bytes(), b"1", &key("s", i), TOKEN],
        ),
        Row::Extend => encode(buf, &[b"LOCK.EXTEND", &key("l", hot), TOKEN, TTL]),
        Row::LuaExtend => encode(
            buf,
            &[
                b"EVALSHA",
                shas.cae.as_bytes(),
                b"1",
                &key("s", hot),
                TOKEN,
                TTL,
            ],
        ),
        Row::Fence => encode(buf, &[b"LOCK.FENCE", &key("l", hot)]),
        Row::LuaAcquireFence => encode(
            buf,
            &[
                b"EVALSHA",
                shas.acquire_fence.as_bytes(),
                b"2",
                &key("s", i),
                &key("f", i),
                TOKEN,
                TTL,
            ],
        ),
        Row::SetIfeq => encode(buf, &[b"SET", &key("s", hot), TOKEN, b"IFEQ", TOKEN]),
    }
}

/// Empties the server and creates what `row`'s `n` commands act on.
pub fn setup(server: &Server, row: Row, n: usize) {
    let mut c = server.conn();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    if matches!(row, Row::SetNxPx | Row::Acquire | Row::LuaAcquireFence) {
        // Rows that create keys would otherwise run faster or slower with how
        // much freed memory the previous row left the allocator (new pages
        // cost page faults): give each the same, room for 2n keys.
        let warm = |i: usize, buf: &mut Vec<u8>| encode(buf, &[b"SET", &key("w", i), TOKEN]);
        assert_eq!(load::run(server.port, 4, 512, 2 * n, &warm).errors, 0);
        let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    }
    let (count, is_lock) = match row {
        Row::Get | Row::LuaExtend | Row::SetIfeq => (HOT_KEYS, false),
        Row::LuaRelease => (n, false),
        Row::AcquireContended | Row::Extend | Row::Fence => (HOT_KEYS, true),
        Row::Release => (n, true),
        _ => return,
    };
    let make = move |i: usize, buf: &mut Vec<u8>| {
        if is_lock {
            encode(buf, &[b"LOCK.ACQUIRE", &key("l", i), TOKEN, TTL]);
        } else {
            encode(buf, &[b"SET", &key("s", i), TOKEN, b"PX", TTL]);
        }
    };
    let r = load::run(server.port, 4, 256, count, &make);
    assert_eq!(r.errors, 0, "setup of {row:?} failed");
}

/// One timed run of a row.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    /// Commands per second seen by the clients.
    pub rate: f64,
    /// Time the server's main thread spent on a CPU per command, in
    /// microseconds (user and kernel, from the scheduler's own accounting).
    /// Unlike the rate it does not count time the server sat idle waiting
    /// for the load generator, which shares the machine.
    pub cpu_us: f64,
}

/// Runs `n` commands of `row` from 50 connections.
pub fn throughput(server: &Server, shas: &Shas, row: Row, pipeline: usize, n: usize) -> Run {
    setup(server, row, n);
    let make = |i: usize, buf: &mut Vec<u8>| command(row, shas, i, buf);
    let cpu_before = server_cpu_ns(server);
    let r = load::run(server.port, 50, pipeline, n, &make);
    let cpu_ns = server_cpu_ns(server) - cpu_before;
    assert_eq!(r.errors, 0, "{row:?} replied with errors");
    Run {
        rate: r.rate(n),
        cpu_us: cpu_ns as f64 / 1000.0 / n as f64,
    }
}

/// Nanoseconds the server's main thread has run on a CPU: the first field of
/// /proc/PID/schedstat, exact to the nanosecond where tick-sampled user and
/// system times (INFO cpu, getrusage) are not.
pub fn server_cpu_ns(server: &Server) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{}/schedstat", server.pid()))
        .expect("/proc/PID/schedstat (Linux with schedstats)");
    stat.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a run time in /proc/PID/schedstat")
}

/// What callgrind counted per command: instructions, and the misses of its
/// simulated caches (first-level instruction cache, and last-level cache
/// for instructions and data together).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    pub instructions: f64,
    pub i1_misses: f64,
    pub ll_misses: f64,
}

/// Server cost per command for `row`, from a server running under callgrind
/// (with `--cache-sim=yes`) with instrumentation on only while the row's
/// commands run.
pub fn instructions(server: &Server, shas: &Shas, row: Row, n: usize) -> Counts {
    setup(server, row, n);
    instructions_of(server, n, &|i: usize, buf: &mut Vec<u8>| {
        command(row, shas, i, buf)
    })
}

/// What callgrind counts per command while `n` commands made by `make` run
/// at pipeline 16 from 50 connections, instrumentation on only meanwhile.
pub fn instructions_of(
    server: &Server,
    n: usize,
    make: &(dyn Fn(usize, &mut Vec<u8>) + Sync),
) -> Counts {
    let pid = server.pid().to_string();
    // Connect first: accepting connections is not the command's cost.
    let conns = load::connect(server.port, 50);
    callgrind_control(&["--zero", &pid]);
    callgrind_control(&["--instr=on", &pid]);
    let r = load::run_on(conns, 16, n, make);
    assert_eq!(r.errors, 0, "the commands replied with errors");
    callgrind_control(&["--instr=off", &pid]);
    let before = dumps(server);
    callgrind_control(&["--dump", &pid]);
    let totals = totals(&wait_new_dump(server, &before));
    let per_command = |events: &[&str]| {
        events
            .iter()
            .map(|e| totals.get(*e).copied().unwrap_or(0))
            .sum::<u64>() as f64
            / n as f64
    };
    Counts {
        instructions: per_command(&["Ir"]),
        i1_misses: per_command(&["I1mr"]),
        ll_misses: per_command(&["ILmr", "DLmr", "DLmw"]),
    }
}

fn callgrind_control(args: &[&str]) {
    let out = Command::new("callgrind_control")
        .args(args)
        .output()
        .expect("callgrind_control");
    assert!(
        out.status.success(),
        "callgrind_control {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn dumps(server: &Server) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(&server.dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("callgrind.out")
        })
        .collect();
    v.sort();
    v
}

fn wait_new_dump(server: &Server, before: &[std::path::PathBuf]) -> std::path::PathBuf {
    for _ in 0..200 {
        if let Some(p) = dumps(server).into_iter().find(|p| !before.contains(p)) {
            // The dump is written completely before callgrind_control returns.
            return p;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("callgrind wrote no dump");
}

/// The `totals:` line of a callgrind dump by event name (`Ir`, `I1mr`, ...);
/// an event missing from the map was not counted.
fn totals(file: &std::path::Path) -> std::collections::HashMap<String, u64> {
    let text = std::fs::read_to_string(file).unwrap();
    let line = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line in the callgrind dump"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    let (events, totals) = (line("events:"), line("totals:"));
    events
        .iter()
        .zip(totals)
        .map(|(e, v)| (e.to_string(), v.parse().expect("a count")))
        .collect()
}

/// The grant rows again, driven by `redis-benchmark` (one C process with an
/// event loop) instead of this crate's generator: commands per second for
/// `row`, `n` commands on random keys from 50 connections at pipeline 16.
/// None when redis-benchmark is not installed.
pub fn redis_benchmark(server: &Server, row: Row, n: usize) -> Option<f64> {
    let args: &[&str] = match row {
        Row::SetNxPx => &["SET", "s:__rand_int__", TOKEN_STR, "NX", "PX", "600000"],
        Row::Acquire => &["LOCK.ACQUIRE", "l:__rand_int__", TOKEN_STR, "600000"],
        _ => panic!("redis-benchmark rows are the two grants"),
    };
    setup(server, row, n);
    let port = server.port.to_string();
    let count = n.to_string();
    let out = Command::new("redis-benchmark")
        .args(["-p", &port, "-c", "50", "-P", "16", "-n", &count])
        // Random keys over a space so large that almost every one is new.
        .args(["-r", "1000000000", "-q"])
        .args(args)
        .output()
        .ok()?;
    assert!(out.status.success(), "redis-benchmark failed");
    // "-q" prints progress lines separated by '\r', then
    // "<command>: 380228.14 requests per second, p50=...".
    let text = String::from_utf8_lossy(&out.stdout);
    let rate = text
        .rsplit(" requests per second")
        .nth(1)
        .and_then(|before| before.rsplit(' ').next())
        .and_then(|v| v.parse().ok());
    Some(rate.unwrap_or_else(|| panic!("no rate in redis-benchmark's output: {text}")))
}
