//! Memory per lock, throughput and memory as live locks grow, mass expiry,
//! and hand-off cost as waiters grow.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::{used_memory, wait_until, RawConn, Resp, Server};
use crate::cost::TOKEN;
use crate::load::{self, encode};
use crate::stats::{median, Summary};

const TTL: &[u8] = b"600000";
const ACQUIRE_FENCE_LUA: &str = "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('incr', KEYS[2]) else return false end";

#[derive(Clone, Copy)]
pub enum Shape {
    Lock,
    StringKey,
    StringAndFence,
}

impl Shape {
    pub fn label(self) -> &'static str {
        match self {
            Shape::Lock => "lock (LOCK.ACQUIRE)",
            Shape::StringKey => "string key (SET NX PX)",
            Shape::StringAndFence => "string key + fence counter key (Lua SET NX PX + INCR)",
        }
    }
}

fn flush(server: &Server) {
    let _: () = redis::cmd("FLUSHALL").query(&mut server.conn()).unwrap();
}

/// Creates `n` held locks `l:0 .. l:n-1` (or strings), pipelined.
fn populate(server: &Server, shape: Shape, n: usize, ttl: &[u8]) {
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(ACQUIRE_FENCE_LUA)
        .query(&mut server.conn())
        .unwrap();
    let make = |i: usize, buf: &mut Vec<u8>| {
        let k = format!("l:{i}").into_bytes();
        match shape {
            Shape::Lock => encode(buf, &[b"LOCK.ACQUIRE", &k, TOKEN, ttl]),
            Shape::StringKey => encode(buf, &[b"SET", &k, TOKEN, b"NX", b"PX", ttl]),
            Shape::StringAndFence => {
                let f = format!("f:{i}").into_bytes();
                encode(buf, &[b"EVALSHA", sha.as_bytes(), b"2", &k, &f, TOKEN, ttl])
            }
        }
    };
    let r = load::run(server.port, 4, 512, n, &make);
    assert_eq!(r.errors, 0);
}

/// used_memory per key after creating `n` of `shape` in an empty server.
pub fn bytes_per_lock(server: &Server, shape: Shape, n: usize) -> f64 {
    flush(server);
    let before = used_memory(&mut server.conn());
    populate(server, shape, n, TTL);
    let after = used_memory(&mut server.conn());
    (after - before) as f64 / n as f64
}

/// MEMORY USAGE of one key of `shape`.
pub fn memory_usage(server: &Server, shape: Shape) -> i64 {
    flush(server);
    populate(server, shape, 1, TTL);
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("l:0")
        .query(&mut server.conn())
        .unwrap()
}

pub struct ScalePoint {
    pub live: usize,
    pub acquire_contended: f64,
    pub fence: f64,
    /// GET on as many plain string keys, for comparison: what the keyspace
    /// itself costs at this size.
    pub get: f64,
    pub bytes_per_lock: f64,
}

/// Throughput of contended LOCK.ACQUIRE and of LOCK.FENCE over `live` held
/// locks (median of `repeats`, interleaved), pipeline 16, 50 connections.
pub fn at_scale(server: &Server, live: usize, n: usize, repeats: usize) -> ScalePoint {
    let bytes_per_lock = bytes_per_lock(server, Shape::Lock, live);
    let contended = |i: usize, buf: &mut Vec<u8>| {
        encode(
            buf,
            &[
                b"LOCK.ACQUIRE",
                format!("l:{}", (i * 7919) % live).as_bytes(),
                b"someone-else",
                TTL,
            ],
        )
    };
    let fence = |i: usize, buf: &mut Vec<u8>| {
        encode(
            buf,
            &[b"LOCK.FENCE", format!("l:{}", (i * 7919) % live).as_bytes()],
        )
    };
    let strings =
        |i: usize, buf: &mut Vec<u8>| encode(buf, &[b"SET", format!("s:{i}").as_bytes(), TOKEN]);
    assert_eq!(load::run(server.port, 4, 512, live, &strings).errors, 0);
    let get = |i: usize, buf: &mut Vec<u8>| {
        encode(
            buf,
            &[b"GET", format!("s:{}", (i * 7919) % live).as_bytes()],
        )
    };
    let (mut a, mut f, mut g) = (vec![], vec![], vec![]);
    for _ in 0..repeats {
        a.push(load::run(server.port, 50, 16, n, &contended).rate(n));
        f.push(load::run(server.port, 50, 16, n, &fence).rate(n));
        g.push(load::run(server.port, 50, 16, n, &get).rate(n));
    }
    ScalePoint {
        live,
        acquire_contended: median(&a),
        fence: median(&f),
        get: median(&g),
        bytes_per_lock,
    }
}

pub struct MassExpiry {
    pub locks: usize,
    pub reclaim_ms: f64,
    pub probe_before: Summary,
    pub probe_during: Summary,
}

/// `locks` locks whose leases all end within a moment; how long Redis takes
/// to reclaim them, and the latency of another client's commands meanwhile.
pub fn mass_expiry(server: &Server, locks: usize) -> MassExpiry {
    flush(server);
    const TTL_MS: u64 = 4_000;
    let populated = Instant::now();
    populate(server, Shape::Lock, locks, TTL_MS.to_string().as_bytes());
    let last_deadline = Instant::now() + Duration::from_millis(TTL_MS);
    assert!(
        populated.elapsed() < Duration::from_millis(TTL_MS),
        "population outlived the lease"
    );
    let stop = AtomicBool::new(false);
    let mut probe = RawConn::connect(server);
    let (before, during, reclaimed_at) = std::thread::scope(|s| {
        let stop = &stop;
        let prober = s.spawn(move || {
            let (mut before, mut during) = (vec![], vec![]);
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                probe.call(&["LOCK.FENCE", "probe"]);
                let us = t.elapsed().as_micros() as u64;
                if Instant::now() + Duration::from_millis(50) < last_deadline {
                    before.push(us);
                } else {
                    during.push(us);
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            (before, during)
        });
        let mut c = server.conn();
        std::thread::sleep(last_deadline.saturating_duration_since(Instant::now()));
        wait_until(Duration::from_secs(120), || {
            let n: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
            n == 0
        });
        let reclaimed_at = Instant::now();
        stop.store(true, Ordering::Relaxed);
        let (before, during) = prober.join().unwrap();
        (before, during, reclaimed_at)
    });
    MassExpiry {
        locks,
        reclaim_ms: reclaimed_at
            .saturating_duration_since(last_deadline)
            .as_secs_f64()
            * 1000.0,
        probe_before: Summary::of(&mut before.clone()),
        probe_during: Summary::of(&mut during.clone()),
    }
}

/// Microseconds per hand-off on one key with `waiters` clients queued: each
/// waiter that gets the lock releases it and queues again, so the queue
/// length stays the same. `handoffs` are timed.
pub fn handoff_cost(server: &Server, waiters: usize, handoffs: usize) -> f64 {
    flush(server);
    let mut admin = server.conn();
    let mut holder = RawConn::connect(server);
    assert!(matches!(
        holder.call(&["LOCK.ACQUIRE", "hot", "w-holder", "600000"]),
        Resp::Int(_)
    ));
    let mut conns = RawConn::queue_waiters(server, "hot", waiters);
    let waiting = |c: &mut crate::common::Connection| -> usize {
        let text: String = redis::cmd("INFO").arg("lock").query(c).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("lock_waiters:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    wait_until(Duration::from_secs(60), || waiting(&mut admin) == waiters);
    assert_eq!(
        holder.call(&["LOCK.RELEASE", "hot", "w-holder"]),
        Resp::Int(1)
    );
    // Each step: find the holder, take its grant, release and queue again.
    // The release hands the lock to the next waiter inside the command.
    let mut asker = RawConn::connect(server);
    let start = Instant::now();
    for _ in 0..handoffs {
        let Resp::Array(info) = asker.call(&["LOCK.INFO", "hot"]) else {
            panic!("the lock must be held");
        };
        let Resp::Bulk(token) = &info[1] else {
            panic!()
        };
        let token = String::from_utf8(token.clone()).unwrap();
        let i: usize = token[1..].parse().unwrap();
        let w = &mut conns[i];
        assert!(
            matches!(w.read(), Resp::Int(_)),
            "{token} expected the lock"
        );
        w.send(&["LOCK.RELEASE", "hot", &token]);
        w.send(&["LOCK.ACQUIRE", "hot", &token, "600000", "BLOCK", "0"]);
        assert_eq!(w.read(), Resp::Int(1));
    }
    start.elapsed().as_secs_f64() * 1e6 / handoffs as f64
}
