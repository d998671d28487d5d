//! Leaks: the module must give back everything it takes, whatever way a lock
//! or a waiter ends.
//!
//! * `churn_returns_used_memory_to_its_level_after_warm_up`: SOAK_CYCLES
//!   (default 20,000; `make stress` runs 1,000,000) lock lifecycles of five
//!   kinds, in turn: acquire/release, a lease left to expire, a BLOCK
//!   hand-off (on release or at the lease's end), a waiter that times out or
//!   is hit by CLIENT UNBLOCK, and a waiter whose connection closes. Every
//!   cycle uses a new key name. After a warm-up round and after the whole
//!   soak, with every connection of the workload closed and the keys
//!   flushed, `used_memory` must be the same within a small bound.
//! * `valgrind_finds_no_leak_or_invalid_access_in_the_module` (ignored: `make
//!   stress` runs it): the same churn and the other ways a lock or waiter
//!   ends (DEL, FLUSHDB, overwrite by another type, SWAPDB, DEBUG RELOAD,
//!   RESTORE, damaged payloads) on a server under valgrind memcheck; its log
//!   must show no invalid read, write or free anywhere, and no definitely or
//!   indirectly lost block, and no use of uninitialised memory, with a frame
//!   in the module.

use redis_lock_testkit as common;

use std::time::{Duration, Instant};

use common::*;

/// Cycles per batch: each batch runs every kind and waits for its end.
const BATCH: u64 = 500;

/// One batch's worth of lock lifecycles, driven over pipelined connections.
struct Churn<'a> {
    server: &'a Server,
    /// The holder of every lock, pipelined.
    holder: RawConn,
    /// Waiters for hand-offs and timeouts, one command in flight each.
    pool: Vec<RawConn>,
    pool_ids: Vec<String>,
    admin: Connection,
    /// The next cycle number (key names are `churn:<cycle>`).
    next: u64,
    /// How many cycles ended each way.
    handoffs: u64,
    timeouts: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// ACQUIRE, RELEASE.
    Release,
    /// ACQUIRE with a lease of 1-3 ms, left to expire.
    Expire,
    /// A waiter is handed the lock: on RELEASE (even cycles) or when the
    /// holder shortens its lease to 1 ms (odd); it then releases or lets it
    /// expire.
    HandOff,
    /// A waiter times out (even) or is unblocked by CLIENT UNBLOCK (odd).
    Timeout,
    /// A waiter's connection closes while it waits.
    Disconnect,
}

fn kind(cycle: u64) -> Kind {
    match cycle % 5 {
        0 => Kind::Release,
        1 => Kind::Expire,
        2 => Kind::HandOff,
        3 => Kind::Timeout,
        _ => Kind::Disconnect,
    }
}

fn key(cycle: u64) -> String {
    format!("churn:{cycle}")
}

fn expect_int(reply: Resp, what: &str) -> i64 {
    match reply {
        Resp::Int(n) => n,
        other => panic!("{what}: {other:?}"),
    }
}

impl<'a> Churn<'a> {
    fn new(server: &'a Server, start: u64) -> Churn<'a> {
        let mut pool: Vec<RawConn> = (0..BATCH * 2 / 5 + 2)
            .map(|_| RawConn::connect(server))
            .collect();
        let pool_ids = pool
            .iter_mut()
            .map(|w| expect_int(w.call(&["CLIENT", "ID"]), "CLIENT ID").to_string())
            .collect();
        Churn {
            server,
            holder: RawConn::connect(server),
            pool,
            pool_ids,
            admin: server.conn(),
            next: start,
            handoffs: 0,
            timeouts: 0,
        }
    }

    fn waiters(&self) -> i64 {
        self.server.info_field("waiters")
    }

    fn wait_waiters(&self, n: i64) {
        let start = Instant::now();
        while self.waiters() != n {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "expected {n} waiters, {} are queued",
                self.waiters()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Runs `n` more cycles, in batches.
    fn run(&mut self, n: u64) {
        let end = self.next + n;
        while self.next < end {
            let size = BATCH.min(end - self.next);
            self.batch(self.next..self.next + size);
            self.next += size;
        }
    }

    fn batch(&mut self, cycles: std::ops::Range<u64>) {
        // 1. The holder takes every lock (and releases the Release ones).
        let mut cmds: Vec<Vec<String>> = vec![];
        for c in cycles.clone() {
            let k = key(c);
            let args: &[&[&str]] = match kind(c) {
                Kind::Release => &[
                    &["LOCK.ACQUIRE", &k, "h", "10000"],
                    &["LOCK.RELEASE", &k, "h"],
                ],
                Kind::Expire => &[&["LOCK.ACQUIRE", &k, "h", ["1", "2", "3"][c as usize % 3]]],
                _ => &[&["LOCK.ACQUIRE", &k, "h", "60000"]],
            };
            cmds.extend(
                args.iter()
                    .map(|a| a.iter().map(|s| s.to_string()).collect()),
            );
        }
        self.pipeline_holder(&cmds, |i, reply| {
            let n = expect_int(reply, &format!("holder command {i}"));
            assert!(n >= 1, "holder command {i} replied {n}");
        });

        // 2. Waiters queue behind the holder.
        let mut slot = 0;
        let mut handoff = vec![]; // (cycle, pool slot)
        let mut timed = vec![];
        let mut unblocked = vec![];
        let mut closing = vec![];
        for c in cycles.clone() {
            let k = key(c);
            match kind(c) {
                Kind::HandOff => {
                    self.pool[slot].send(&["LOCK.ACQUIRE", &k, "w", "60000", "BLOCK", "60000"]);
                    handoff.push((c, slot));
                    slot += 1;
                }
                Kind::Timeout if (c / 5) % 2 == 0 => {
                    let timeout = (1 + c % 4).to_string();
                    self.pool[slot].send(&["LOCK.ACQUIRE", &k, "w", "60000", "BLOCK", &timeout]);
                    timed.push(slot);
                    slot += 1;
                }
                Kind::Timeout => {
                    self.pool[slot].send(&["LOCK.ACQUIRE", &k, "w", "60000", "BLOCK", "0"]);
                    unblocked.push(slot);
                    slot += 1;
                }
                Kind::Disconnect => {
                    closing.push(RawConn::block_acquire(self.server, &k, "w", 60_000, 0));
                }
                Kind::Release | Kind::Expire => {}
            }
        }
        for &w in &timed {
            let reply = self.pool[w].read();
            assert_eq!(reply, Resp::Nil, "a timed-out waiter");
        }
        let queued = handoff.len() + unblocked.len() + closing.len();
        self.wait_waiters(queued as i64);
        let mut pipe = redis::pipe();
        for &w in &unblocked {
            pipe.cmd("CLIENT").arg("UNBLOCK").arg(&self.pool_ids[w]);
        }
        let done: Vec<i64> = pipe.query(&mut self.admin).unwrap();
        assert!(done.iter().all(|&n| n == 1), "CLIENT UNBLOCK: {done:?}");
        for &w in &unblocked {
            assert_eq!(self.pool[w].read(), Resp::Nil, "an unblocked waiter");
        }
        self.timeouts += (timed.len() + unblocked.len()) as u64;
        drop(closing);
        self.wait_waiters(handoff.len() as i64);

        // 3. The holder lets go: hand-offs, and the locks nobody waits for.
        let mut cmds: Vec<Vec<String>> = vec![];
        for c in cycles.clone() {
            let k = key(c);
            match kind(c) {
                Kind::HandOff if (c / 5) % 2 == 1 => {
                    cmds.push(["LOCK.EXTEND", &k, "h", "1"].map(String::from).to_vec())
                }
                Kind::HandOff | Kind::Timeout | Kind::Disconnect => {
                    cmds.push(["LOCK.RELEASE", &k, "h"].map(String::from).to_vec())
                }
                Kind::Release | Kind::Expire => {}
            }
        }
        self.pipeline_holder(&cmds, |i, reply| {
            assert_eq!(reply, Resp::Int(1), "holder's release {i}");
        });

        // 4. Each waiter got its lock; half release it, half let it expire.
        for &(c, w) in &handoff {
            expect_int(self.pool[w].read(), &format!("hand-off of {}", key(c)));
            let k = key(c);
            if (c / 5) % 2 == 0 {
                self.pool[w].send(&["LOCK.RELEASE", &k, "w"]);
            } else {
                self.pool[w].send(&["LOCK.EXTEND", &k, "w", "1"]);
            }
        }
        for &(_, w) in &handoff {
            assert_eq!(self.pool[w].read(), Resp::Int(1), "the waiter lets go");
        }
        self.handoffs += handoff.len() as u64;
    }

    fn pipeline_holder(&mut self, cmds: &[Vec<String>], mut check: impl FnMut(usize, Resp)) {
        for chunk in cmds.chunks(200) {
            let args: Vec<Vec<&str>> = chunk
                .iter()
                .map(|c| c.iter().map(String::as_str).collect())
                .collect();
            let slices: Vec<&[&str]> = args.iter().map(Vec::as_slice).collect();
            self.holder.pipeline(&slices);
            for i in 0..chunk.len() {
                check(i, self.holder.read());
            }
        }
    }
}

fn soak_cycles() -> u64 {
    std::env::var("SOAK_CYCLES")
        .ok()
        .map(|v| v.parse().expect("SOAK_CYCLES: a number of cycles"))
        .unwrap_or(20_000)
}

#[test]
fn churn_returns_used_memory_to_its_level_after_warm_up() {
    let cycles = soak_cycles();
    let s = Server::builder()
        .config("slowlog-log-slower-than", "-1")
        .start();
    let mut c = s.conn();
    let fresh = settled_memory(&s, &mut c);

    // Warm-up: every structure reaches the size a batch needs.
    let warm_cycles = 2 * BATCH;
    let mut churn = Churn::new(&s, 0);
    churn.run(warm_cycles);
    drop(churn);
    let warm = settled_memory(&s, &mut c);

    let started = Instant::now();
    let mut churn = Churn::new(&s, warm_cycles);
    churn.run(cycles);
    let (handoffs, timeouts) = (churn.handoffs, churn.timeouts);
    drop(churn);
    let elapsed = started.elapsed();
    let after = settled_memory(&s, &mut c);

    let grants = s.info_field("grants");
    println!(
        "soak: {cycles} cycles in {:.1} s on {}: {handoffs} hand-offs, {timeouts} timeouts or \
         unblocks, {} expirations, {grants} grants in all; used_memory fresh {fresh}, after \
         warm-up {warm}, after the soak {after} ({:+} bytes, {:+.3} bytes/cycle)",
        elapsed.as_secs_f64(),
        server_binary(),
        s.info_field("expirations"),
        after - warm,
        (after - warm) as f64 / cycles as f64,
    );
    assert!(handoffs >= cycles / 5 - 1 && timeouts >= cycles / 5 - 1);
    assert!(s.info_field("handoffs") >= handoffs as i64);
    assert!(s.info_field("block_timeouts") >= timeouts as i64);
    // A settled server measured 0 and -16 KiB (one temporary client more or
    // less in the server's pool) at 20,000 and at 1,000,000 cycles. A leak
    // per waiter (a waiter, a key name, a timer: 50 bytes or more, for 3 in
    // 5 cycles) passes 64 KiB within the default 20,000 cycles; any lost
    // allocation in a fifth of the cycles does at a million.
    let bound = 64 * 1024;
    assert!(
        after - warm <= bound,
        "used_memory grew by {} bytes over {cycles} cycles (bound {bound})",
        after - warm
    );
}

/// One valgrind report: its first line and its stack.
struct Record {
    head: String,
    lines: Vec<String>,
}

impl Record {
    fn in_module(&self) -> bool {
        self.lines
            .iter()
            .any(|l| l.contains("libredis_lock") || l.contains("redis_lock::"))
    }
}

/// Splits a valgrind log into its records (blank-line separated).
fn records(log: &str) -> Vec<Record> {
    let mut out = vec![];
    let mut lines: Vec<String> = vec![];
    for line in log.lines() {
        // "==PID== text"
        let text = match line.split_once("== ") {
            Some((pid, text)) if pid.starts_with("==") => text.trim(),
            _ => line.trim(),
        };
        if text.is_empty() || text.chars().all(|c| c == '=' || c.is_ascii_digit()) {
            if !lines.is_empty() {
                out.push(Record {
                    head: lines[0].clone(),
                    lines: std::mem::take(&mut lines),
                });
            }
        } else {
            lines.push(text.to_string());
        }
    }
    if !lines.is_empty() {
        out.push(Record {
            head: lines[0].clone(),
            lines,
        });
    }
    out
}

/// The records that fail the check: invalid accesses anywhere, and lost
/// blocks and uses of uninitialised memory with a frame in the module.
type Findings<'a> = (Vec<&'a Record>, Vec<&'a Record>, Vec<&'a Record>);

fn findings(all: &[Record]) -> Findings<'_> {
    let invalid = [
        "Invalid read",
        "Invalid write",
        "Invalid free",
        "Mismatched free",
    ];
    (
        all.iter()
            .filter(|r| invalid.iter().any(|p| r.head.starts_with(p)))
            .collect(),
        all.iter()
            .filter(|r| {
                (r.head.contains("definitely lost") || r.head.contains("indirectly lost"))
                    && r.in_module()
            })
            .collect(),
        all.iter()
            .filter(|r| r.head.contains("uninitialised") && r.in_module())
            .collect(),
    )
}

fn check_module(s: &Server, c: &mut Connection) {
    let pong: String = redis::cmd("PING").query(c).unwrap();
    assert_eq!(pong, "PONG", "server died; log:\n{}", s.log());
}

/// The ways a lock or a waiter ends that the churn does not cover.
fn other_endings(s: &Server, c: &mut Connection) {
    // Waiters on keys that are deleted, flushed, overwritten, swapped.
    for end in ["DEL", "UNLINK", "FLUSHDB", "SET", "SWAPDB"] {
        acquire(c, "end:1", "h", 60_000).unwrap();
        let mut ws = RawConn::queue_waiters(s, "end:1", 3);
        wait_until(Duration::from_secs(60), || s.info_field("waiters") == 3);
        let _: Value = match end {
            "SET" => redis::cmd("SET").arg("end:1").arg("x").query(c).unwrap(),
            "FLUSHDB" => redis::cmd("FLUSHDB").query(c).unwrap(),
            "SWAPDB" => redis::cmd("SWAPDB").arg(0).arg(1).query(c).unwrap(),
            cmd => redis::cmd(cmd).arg("end:1").query(c).unwrap(),
        };
        if end == "SWAPDB" {
            let _: () = redis::cmd("SELECT").arg(1).query(c).unwrap();
            let _: i64 = redis::cmd("DEL").arg("end:1").query(c).unwrap();
            let _: () = redis::cmd("SELECT").arg(0).query(c).unwrap();
        }
        let first = ws[0].read();
        match end {
            "SET" => assert!(matches!(first, Resp::Error(_)), "{end}: {first:?}"),
            _ => assert!(matches!(first, Resp::Int(_)), "{end}: {first:?}"),
        }
        drop(ws);
        let _: Value = redis::cmd("FLUSHALL").query(c).unwrap();
    }
    // Persistence: save and load of held locks with waiters, DUMP/RESTORE,
    // and damaged payloads.
    for i in 0..50 {
        acquire(c, &format!("held:{i}"), &format!("token-{i}"), 600_000).unwrap();
    }
    let _ws = RawConn::queue_waiters(s, "held:0", 5);
    wait_until(Duration::from_secs(60), || s.info_field("waiters") == 5);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(c).unwrap();
    let payload: Vec<u8> = redis::cmd("DUMP").arg("held:1").query(c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("restored")
        .arg(0)
        .arg(&payload)
        .query(c)
        .unwrap();
    let _: () = redis::cmd("DEBUG")
        .arg("SET-SKIP-CHECKSUM-VALIDATION")
        .arg(1)
        .query(c)
        .unwrap();
    let body = payload.len() - 10; // the RDB version and checksum trail it
    let token_len_at = payload.windows(7).position(|w| w == b"token-1").unwrap() - 1;
    let mut long = payload.clone();
    long[token_len_at] = 0x80; // a 32-bit length follows
    long.splice(token_len_at + 1..token_len_at + 1, [0x7f, 0xff, 0xff, 0xff]);
    let mut damaged_payloads = vec![long];
    for cut in 1..body {
        let mut damaged = payload[..cut].to_vec();
        damaged.extend_from_slice(&payload[body..]);
        damaged_payloads.push(damaged);
    }
    for damaged in damaged_payloads {
        // With the checksum unchecked, a cut payload can read the RDB
        // version as data and happen to be valid: only the code paths
        // matter here (persistence.rs checks the refusals).
        let _: redis::RedisResult<Value> = redis::cmd("RESTORE")
            .arg("damaged")
            .arg(0)
            .arg(&damaged)
            .arg("REPLACE")
            .query(c);
    }
    // Replies, errors, introspection.
    let _: Value = redis::cmd("LOCK.INFO").arg("held:1").query(c).unwrap();
    let _: Value = redis::cmd("LOCK.INFO")
        .arg("held:1")
        .query(&mut s.conn3())
        .unwrap();
    let _: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("held:1")
        .query(c)
        .unwrap();
    let _ = digest(c);
    for bad in [
        vec!["LOCK.ACQUIRE", "k", "", "100"],
        vec!["LOCK.ACQUIRE", "k", "t", "abc"],
        vec!["LOCK.ACQUIRE", "k", "t", "100", "NX"],
        vec!["LOCK.ACQUIRE", "k", "t", "100", "BLOCK", "-1"],
        vec!["LOCK.RELEASE", "k"],
        vec!["LOCK._SET", "k", "t", "1", "1"],
        vec!["LOCK.FENCE", "plain"],
    ] {
        if bad[1] == "plain" {
            let _: () = redis::cmd("SET").arg("plain").arg("v").query(c).unwrap();
        }
        run_err(c, &bad);
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-waiters-per-key")
        .arg("2")
        .query(c)
        .unwrap();
    let before = s.info_field("waiters");
    let two = RawConn::queue_waiters(s, "held:2", 2);
    wait_until(Duration::from_secs(60), || {
        s.info_field("waiters") == before + 2
    });
    let mut third = RawConn::block_acquire(s, "held:2", "third", 1000, 0);
    let refused = third.read();
    assert!(matches!(refused, Resp::Error(_)), "{refused:?}");
    drop(two);
    check_module(s, c);
}

#[test]
#[ignore = "slow: runs the server under valgrind (make stress)"]
fn valgrind_finds_no_leak_or_invalid_access_in_the_module() {
    if common::skip_unless(
        common::Needs::LocalProcess,
        "runs the server under valgrind",
    ) {
        return;
    }
    let cycles: u64 = std::env::var("VALGRIND_CYCLES")
        .ok()
        .map(|v| v.parse().expect("VALGRIND_CYCLES: a number"))
        .unwrap_or(20_000);
    let mut s = Server::builder()
        .wrapped_in(&[
            "valgrind",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            // Debian's redis-server takes malloc from a shared libjemalloc.
            "--soname-synonyms=somalloc=*jemalloc*",
            "--num-callers=50",
            "--error-exitcode=99",
            "--log-file=valgrind.log",
        ])
        .start();
    let mut c = s.conn();
    let started = Instant::now();
    let mut churn = Churn::new(&s, 0);
    churn.run(cycles);
    drop(churn);
    other_endings(&s, &mut c);
    let _ = settled_memory(&s, &mut c);
    let ran = started.elapsed();
    drop(c);

    let log_path = s.dir.join("valgrind.log");
    let mut admin = s.conn();
    let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").arg("NOSAVE").query(&mut admin);
    wait_until(Duration::from_secs(600), || {
        std::fs::read_to_string(&log_path)
            .map(|l| l.contains("ERROR SUMMARY"))
            .unwrap_or(false)
    });
    let log = std::fs::read_to_string(&log_path).unwrap();
    s.kill9(); // reaps it (it has exited)
               // Kept for reading after the test.
    let kept = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/leaks-valgrind.log");
    let _ = std::fs::write(&kept, &log);

    let all = records(&log);
    let heap = all
        .iter()
        .flat_map(|r| &r.lines)
        .find(|l| l.contains("total heap usage"))
        .cloned()
        .unwrap_or_default();
    let allocs: u64 = heap
        .split_whitespace()
        .nth(3)
        .map(|n| n.replace(',', "").parse().unwrap_or(0))
        .unwrap_or(0);
    assert!(
        allocs > 100_000,
        "valgrind did not see the server's allocator ({heap:?}); log:\n{log}"
    );
    let (invalid, lost_in_module, uninit_in_module) = findings(&all);
    let summary: Vec<&String> = all
        .iter()
        .flat_map(|r| &r.lines)
        .filter(|l| {
            [
                "definitely lost:",
                "indirectly lost:",
                "possibly lost:",
                "ERROR SUMMARY",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        .collect();
    println!(
        "valgrind: {cycles} churn cycles and the other endings in {:.0} s on {}; {heap}; {summary:?}; \
         module records: {} invalid, {} lost, {} uninitialised",
        ran.as_secs_f64(),
        server_binary(),
        invalid.len(),
        lost_in_module.len(),
        uninit_in_module.len(),
    );
    let show = |rs: &[&Record]| {
        rs.iter()
            .map(|r| r.lines.join("\n"))
            .collect::<Vec<_>>()
            .join("\n\n")
    };
    assert!(invalid.is_empty(), "invalid accesses:\n{}", show(&invalid));
    assert!(
        lost_in_module.is_empty(),
        "lost blocks allocated by the module:\n{}",
        show(&lost_in_module)
    );
    assert!(
        uninit_in_module.is_empty(),
        "uninitialised values in the module:\n{}",
        show(&uninit_in_module)
    );
}

/// The log check itself: it must catch what it is meant to catch.
#[test]
fn the_valgrind_log_check_finds_module_frames() {
    let log = "==7== Memcheck, a memory error detector\n\
        ==7== \n\
        ==7== Invalid read of size 8\n\
        ==7==    at 0x1: dictFind (in /usr/bin/redis-server)\n\
        ==7== \n\
        ==7== 48 bytes in 1 blocks are definitely lost in loss record 3 of 9\n\
        ==7==    at 0x2: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)\n\
        ==7==    by 0x3: zmalloc (in /usr/bin/redis-server)\n\
        ==7==    by 0x4: redis_lock::redis::handoff::block (in /x/libredis_lock.so)\n\
        ==7== \n\
        ==7== 16 bytes in 1 blocks are definitely lost in loss record 2 of 9\n\
        ==7==    at 0x2: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)\n\
        ==7==    by 0x5: createClient (in /usr/bin/redis-server)\n\
        ==7== \n\
        ==7== LEAK SUMMARY:\n\
        ==7==    definitely lost: 64 bytes in 2 blocks\n";
    let rs = records(log);
    assert_eq!(
        rs.len(),
        5,
        "{:?}",
        rs.iter().map(|r| &r.head).collect::<Vec<_>>()
    );
    assert!(rs[1].head.starts_with("Invalid read") && !rs[1].in_module());
    assert!(rs[2].head.contains("definitely lost") && rs[2].in_module());
    assert!(rs[3].head.contains("definitely lost") && !rs[3].in_module());
    assert!(rs[4]
        .lines
        .iter()
        .any(|l| l.starts_with("definitely lost:")));
}
