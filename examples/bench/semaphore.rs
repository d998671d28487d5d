//! A counting semaphore of four permits, sixteen clients: `LOCK.ACQUIRE
//! ... SHARED LIMIT 4 BLOCK` against the sorted-set script a user (or npm's
//! redis-semaphore, whose algorithm it is) runs today: drop expired
//! entries, add one if fewer than the limit remain, retried after a pause;
//! on a server without the module. The clients count the holders at every
//! grant to catch more than four at once.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::Server;
use crate::stats::{ms, Summary};
use crate::{paired_server, target, Options};

const KEY: &str = "sem";
const LIMIT: usize = 4;
const CLIENTS: usize = 16;
const HOLD: Duration = Duration::from_millis(2);
const TTL_MS: i64 = 10_000;
/// BLOCK timeout: a wait this long is a stranded waiter, counted.
const BLOCK_MS: i64 = 10_000;

/// redis-semaphore's acquire: expired permits go, then one is added if
/// fewer than the limit are held (KEYS[1]; ARGV: limit, token, ttl-ms, now-ms).
const ACQUIRE_LUA: &str = "redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[4] - ARGV[3]) \
    if redis.call('zcard', KEYS[1]) < tonumber(ARGV[1]) then \
    redis.call('zadd', KEYS[1], ARGV[4], ARGV[2]) redis.call('pexpire', KEYS[1], ARGV[3]) \
    return 1 end return 0";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Row {
    Shared,
    Lua,
}

impl Row {
    fn label(self) -> &'static str {
        match self {
            Row::Shared => "LOCK.ACQUIRE ... SHARED LIMIT 4 BLOCK, LOCK.RELEASE",
            Row::Lua => {
                "EVALSHA sorted-set semaphore (redis-semaphore's), retried after 1–10 ms; ZREM"
            }
        }
    }
}

struct Outcome {
    grants: u64,
    commands: u64,
    seconds: f64,
    waits: Vec<u64>,
    per_client: Vec<u64>,
    timeouts: u64,
    /// Grants that found the limit's worth of holders already.
    over_limit: u64,
    /// The most holders the clients saw at once.
    most: usize,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn run(server: &Server, row: Row, seconds: f64) -> Outcome {
    let mut setup = server.conn();
    let _: () = redis::cmd("FLUSHALL").query(&mut setup).unwrap();
    let sha: String = match row {
        Row::Lua => redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(ACQUIRE_LUA)
            .query(&mut setup)
            .unwrap(),
        Row::Shared => String::new(),
    };
    let holders = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let over = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(CLIENTS + 1));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let mut c = server.conn();
            let (holders, most, over, stop, start) = (
                holders.clone(),
                most.clone(),
                over.clone(),
                stop.clone(),
                start.clone(),
            );
            let sha = sha.clone();
            thread::spawn(move || {
                let (mut grants, mut commands, mut timeouts) = (0u64, 0u64, 0u64);
                let mut waits = Vec::new();
                let mut pause: u64 = 1;
                let mut n = 0u64;
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let token = format!("c{i}-{n}");
                    let asked = Instant::now();
                    let granted = loop {
                        commands += 1;
                        match row {
                            Row::Shared => {
                                let f: Option<i64> = redis::cmd("LOCK.ACQUIRE")
                                    .arg(KEY)
                                    .arg(&token)
                                    .arg(TTL_MS)
                                    .arg("SHARED")
                                    .arg("LIMIT")
                                    .arg(LIMIT)
                                    .arg("BLOCK")
                                    .arg(BLOCK_MS)
                                    .query(&mut c)
                                    .unwrap();
                                if f.is_none() {
                                    timeouts += 1;
                                }
                                break f.is_some();
                            }
                            Row::Lua => {
                                let ok: i64 = redis::cmd("EVALSHA")
                                    .arg(&sha)
                                    .arg(1)
                                    .arg(KEY)
                                    .arg(LIMIT)
                                    .arg(&token)
                                    .arg(TTL_MS)
                                    .arg(now_ms())
                                    .query(&mut c)
                                    .unwrap();
                                if ok == 1 {
                                    pause = 1;
                                    break true;
                                }
                                if stop.load(Ordering::Relaxed) {
                                    break false;
                                }
                                // redis-semaphore retries every 10 ms by
                                // default; jittered and growing to it here.
                                thread::sleep(Duration::from_micros(
                                    pause * 1000 / 2 + (i as u64 * 131 % 500),
                                ));
                                pause = (pause * 2).min(10);
                            }
                        }
                    };
                    if !granted {
                        continue;
                    }
                    waits.push(asked.elapsed().as_micros() as u64);
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    if now > LIMIT {
                        over.fetch_add(1, Ordering::Relaxed);
                    }
                    thread::sleep(HOLD);
                    holders.fetch_sub(1, Ordering::SeqCst);
                    commands += 1;
                    let released: i64 = match row {
                        Row::Shared => redis::cmd("LOCK.RELEASE")
                            .arg(KEY)
                            .arg(&token)
                            .query(&mut c)
                            .unwrap(),
                        Row::Lua => redis::cmd("ZREM")
                            .arg(KEY)
                            .arg(&token)
                            .query(&mut c)
                            .unwrap(),
                    };
                    assert_eq!(released, 1, "held its permit until released");
                    grants += 1;
                }
                (grants, commands, timeouts, waits)
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut out = Outcome {
        grants: 0,
        commands: 0,
        seconds: 0.0,
        waits: Vec::new(),
        per_client: Vec::new(),
        timeouts: 0,
        over_limit: 0,
        most: 0,
    };
    for c in clients {
        let (grants, commands, timeouts, waits) = c.join().unwrap();
        out.grants += grants;
        out.commands += commands;
        out.timeouts += timeouts;
        out.per_client.push(grants);
        out.waits.extend(waits);
    }
    out.seconds = t0.elapsed().as_secs_f64();
    out.over_limit = over.load(Ordering::Relaxed);
    out.most = most.load(Ordering::Relaxed);
    out
}

/// `MEMORY USAGE` of one key held by `n` permits, per permit, on `server`.
fn memory_per_holder(server: &Server, row: Row, n: usize) -> f64 {
    let mut c = server.conn();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    for i in 0..n {
        // A 36-byte token, as a UUID is.
        let token = format!("{i:036}");
        match row {
            Row::Shared => {
                let _: Option<i64> = redis::cmd("LOCK.ACQUIRE")
                    .arg(KEY)
                    .arg(&token)
                    .arg(60_000)
                    .arg("SHARED")
                    .query(&mut c)
                    .unwrap();
            }
            Row::Lua => {
                let _: i64 = redis::cmd("ZADD")
                    .arg(KEY)
                    .arg(now_ms())
                    .arg(&token)
                    .query(&mut c)
                    .unwrap();
            }
        }
    }
    let bytes: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(KEY)
        .arg("SAMPLES")
        .arg(0)
        .query(&mut c)
        .unwrap();
    bytes as f64 / n as f64
}

pub fn section(doc: &mut String, o: &Options) {
    let seconds = if o.smoke { 0.3 } else { 60.0 };
    writeln!(
        doc,
        "## 8. A counting semaphore: four permits, sixteen clients\n"
    )
    .unwrap();
    writeln!(
        doc,
        "`cargo run --release --example bench -- --only semaphore`. {CLIENTS} clients each \
         looping take a permit of `{KEY}` (limit {LIMIT}) → hold {} ms → give it back for \
         {seconds:.0} s per row, a fresh token per permit; the script row runs on a server \
         of the same binary without the module. *Commands/grant* are those the clients \
         sent. *Timeouts* are waits that reached the {BLOCK_MS} ms BLOCK timeout. *Most \
         holders* is the most the clients counted at once (at most {LIMIT} is right).\n",
        HOLD.as_millis(),
    )
    .unwrap();
    writeln!(doc, "| row | grants/s | commands/grant | wait p50 ms | wait p99 ms | wait max ms | fairness (max/min per client) | timeouts | most holders | bytes per holder (1,000 held) |").unwrap();
    writeln!(doc, "|---|---|---|---|---|---|---|---|---|---|").unwrap();
    let binary = crate::common::server_binary();
    let mut checks = Vec::new();
    let mut rates = Vec::new();
    let mut costs = Vec::new();
    for row in [Row::Shared, Row::Lua] {
        let server = paired_server(&binary, row == Row::Shared, None);
        let mut r = run(&server, row, seconds);
        let per_holder = memory_per_holder(&server, row, if o.smoke { 10 } else { 1000 });
        let rate = r.grants as f64 / r.seconds;
        rates.push(rate);
        let waits = Summary::of(&mut r.waits);
        let min = r.per_client.iter().copied().min().unwrap_or(0);
        let max = r.per_client.iter().copied().max().unwrap_or(0);
        let fairness = match min {
            0 => "∞ (a client starved)".to_string(),
            m => format!("{:.2}", max as f64 / m as f64),
        };
        let per_grant = r.commands as f64 / r.grants.max(1) as f64;
        costs.push(per_grant);
        writeln!(
            doc,
            "| {} | {rate:.0} | {per_grant:.2} | {} | {} | {} | {fairness} | {} | {} | {per_holder:.0} |",
            row.label(),
            ms(waits.p50),
            ms(waits.p99),
            ms(waits.max),
            r.timeouts,
            r.most,
        )
        .unwrap();
        if row == Row::Shared {
            checks.push(target(
                "never more holders than the limit; no stranded waiter; nobody starved",
                format!(
                    "at most {} holders ({} grants over the limit), {} timeouts, min {min} grants per client",
                    r.most, r.over_limit, r.timeouts
                ),
                r.over_limit == 0 && r.timeouts == 0 && min > 0,
            ));
        }
    }
    writeln!(doc).unwrap();
    for c in checks {
        writeln!(doc, "- {c}").unwrap();
    }
    writeln!(
        doc,
        "- grants/s of SHARED LIMIT BLOCK vs the sorted-set script: **{:.2}×**; commands per \
         grant **{:.2}×** fewer\n",
        rates[0] / rates[1].max(1e-9),
        costs[1] / costs[0].max(1e-9),
    )
    .unwrap();
}
