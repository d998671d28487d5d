//! All-or-nothing locks over three keys, taken by two groups of clients in
//! opposite orders: `LOCK.ACQUIREALL ... BLOCK` against the all-or-nothing
//! Lua script a user writes today (SET NX PX every key or none, retried
//! after a pause; node-redlock's multi-resource lock is this script), on a
//! server without the module. An observer takes atomic snapshots of the
//! three keys (MULTI) to catch a partial hold; the clients keep an
//! ownership table to catch two holders at once.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;

use crate::common::Server;
use crate::stats::{fairness, Summary};
use crate::{paired_server, target, Options};

const KEYS: [&str; 3] = ["{mk}1", "{mk}2", "{mk}3"];
const CLIENTS: usize = 16;
const HOLD: Duration = Duration::from_millis(1);
const TTL_MS: i64 = 10_000;
/// BLOCK timeout: a wait this long is a deadlock, counted.
const BLOCK_MS: i64 = 10_000;

/// SET NX PX on every key, or on none: the script a user writes.
const ALL_LUA: &str =
    "for i = 1, #KEYS do if redis.call('exists', KEYS[i]) == 1 then return 0 end end \
    for i = 1, #KEYS do redis.call('set', KEYS[i], ARGV[1], 'px', ARGV[2]) end return 1";
/// Deletes every key still holding the token.
const RELEASE_LUA: &str = "local n = 0 for i = 1, #KEYS do \
    if redis.call('get', KEYS[i]) == ARGV[1] then redis.call('del', KEYS[i]) n = n + 1 end end return n";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Row {
    AcquireAll,
    Lua,
}

impl Row {
    fn label(self) -> &'static str {
        match self {
            Row::AcquireAll => "LOCK.ACQUIREALL 3 ... BLOCK, LOCK.RELEASEALL",
            Row::Lua => "EVALSHA all-or-nothing SET NX PX, retried after 1–10 ms; EVALSHA release",
        }
    }
}

struct Outcome {
    grants: u64,
    commands: u64,
    seconds: f64,
    waits: Vec<u64>,
    per_client: Vec<u64>,
    /// Waits that ran out (BLOCK timeouts): a deadlock would show here.
    timeouts: u64,
    /// Two clients holding a key at once (from the clients' table).
    overlaps: u64,
    /// Snapshots of the three keys, and those that found some held and
    /// some not, or held by different grants.
    snapshots: u64,
    partial: u64,
}

fn run(server: &Server, row: Row, seconds: f64) -> Outcome {
    let mut setup = server.conn();
    let _: () = redis::cmd("FLUSHALL").query(&mut setup).unwrap();
    let (all_sha, release_sha): (String, String) = match row {
        Row::Lua => (
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(ALL_LUA)
                .query(&mut setup)
                .unwrap(),
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(RELEASE_LUA)
                .query(&mut setup)
                .unwrap(),
        ),
        Row::AcquireAll => (String::new(), String::new()),
    };
    let owners: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());
    let overlaps = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(CLIENTS + 2));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let mut c = server.conn();
            let (owners, overlaps, stop, start) = (
                owners.clone(),
                overlaps.clone(),
                stop.clone(),
                start.clone(),
            );
            let (all_sha, release_sha) = (all_sha.clone(), release_sha.clone());
            thread::spawn(move || {
                let mut keys = KEYS.to_vec();
                if i % 2 == 1 {
                    keys.reverse();
                }
                let token = format!("c{i}");
                let (mut grants, mut commands, mut timeouts) = (0u64, 0u64, 0u64);
                let mut waits = Vec::new();
                let mut pause: u64 = 1;
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    let granted = loop {
                        commands += 1;
                        match row {
                            Row::AcquireAll => {
                                let f: Option<i64> = redis::cmd("LOCK.ACQUIREALL")
                                    .arg(3)
                                    .arg(&keys)
                                    .arg(&token)
                                    .arg(TTL_MS)
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
                                    .arg(&all_sha)
                                    .arg(3)
                                    .arg(&keys)
                                    .arg(&token)
                                    .arg(TTL_MS)
                                    .query(&mut c)
                                    .unwrap();
                                if ok == 1 {
                                    pause = 1;
                                    break true;
                                }
                                if stop.load(Ordering::Relaxed) {
                                    break false;
                                }
                                // Jittered, growing to 10 ms (node-redlock's
                                // retry jitter, scaled to the 1 ms hold).
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
                    for o in owners.iter() {
                        if o.swap(i + 1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    thread::sleep(HOLD);
                    for o in owners.iter() {
                        o.store(0, Ordering::SeqCst);
                    }
                    commands += 1;
                    let released: i64 = match row {
                        Row::AcquireAll => redis::cmd("LOCK.RELEASEALL")
                            .arg(3)
                            .arg(&keys)
                            .arg(&token)
                            .query(&mut c)
                            .unwrap(),
                        Row::Lua => redis::cmd("EVALSHA")
                            .arg(&release_sha)
                            .arg(3)
                            .arg(&keys)
                            .arg(&token)
                            .query(&mut c)
                            .unwrap(),
                    };
                    assert_eq!(released, 3, "held every key until released");
                    grants += 1;
                }
                (grants, commands, timeouts, waits)
            })
        })
        .collect();
    // The observer: atomic snapshots of the three keys.
    let observer = {
        let mut c = server.conn();
        let (stop, start) = (stop.clone(), start.clone());
        thread::spawn(move || {
            let (mut snapshots, mut partial) = (0u64, 0u64);
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let mut pipe = redis::pipe();
                pipe.atomic();
                for k in KEYS {
                    match row {
                        Row::AcquireAll => pipe.cmd("LOCK.FENCE").arg(k),
                        Row::Lua => pipe.cmd("GET").arg(k),
                    };
                }
                let seen: Vec<Value> = pipe.query(&mut c).unwrap();
                snapshots += 1;
                if seen.iter().any(|v| *v != seen[0]) {
                    partial += 1;
                }
                thread::sleep(Duration::from_micros(200));
            }
            (snapshots, partial)
        })
    };
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
        overlaps: 0,
        snapshots: 0,
        partial: 0,
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
    (out.snapshots, out.partial) = observer.join().unwrap();
    out.overlaps = overlaps.load(Ordering::Relaxed);
    out
}

pub fn section(doc: &mut String, o: &Options) {
    let seconds = if o.smoke { 0.3 } else { 60.0 };
    writeln!(
        doc,
        "## 7. All or nothing over three keys, opposite orders\n"
    )
    .unwrap();
    writeln!(
        doc,
        "`cargo run --release --example bench -- --only multikey`. {CLIENTS} clients, half \
         naming the keys `{}` in that order and half in the reverse order, each looping \
         take-all → hold {} ms → release-all for {seconds:.0} s per row; the Lua row runs on a \
         server of the same binary without the module. *Commands/grant* are those the clients \
         sent. *Timeouts* are waits that reached the {BLOCK_MS} ms BLOCK timeout (a deadlock \
         would). *Overlaps* are keys found held by another client at a grant (an ownership \
         table in the clients); *partial snapshots* are atomic reads of the three keys \
         (MULTI of `LOCK.FENCE` or `GET`, every 0.2 ms) that found them held by different \
         grants or some held and some not.\n",
        KEYS.join(" "),
        HOLD.as_millis(),
    )
    .unwrap();
    writeln!(doc, "| row | grants/s | commands/grant | wait p50 ms | wait p99 ms | wait max ms | fairness (max/min per client) | timeouts | overlaps | partial snapshots |").unwrap();
    writeln!(doc, "|---|---|---|---|---|---|---|---|---|---|").unwrap();
    let binary = crate::common::server_binary();
    let mut checks = Vec::new();
    let mut rates = Vec::new();
    for row in [Row::AcquireAll, Row::Lua] {
        let server = paired_server(&binary, row == Row::AcquireAll, None);
        let mut r = run(&server, row, seconds);
        let rate = r.grants as f64 / r.seconds;
        rates.push(rate);
        let waits = Summary::of(&mut r.waits);
        let (min, fairness) = fairness(&r.per_client);
        writeln!(
            doc,
            "| {} | {rate:.0} | {:.2} | {} | {fairness} | {} | {} | {} of {} |",
            row.label(),
            r.commands as f64 / r.grants.max(1) as f64,
            waits.cells(),
            r.timeouts,
            r.overlaps,
            r.partial,
            r.snapshots,
        )
        .unwrap();
        if row == Row::AcquireAll {
            checks.push(target(
                "no deadlock, no overlap, no partial hold observed",
                format!(
                    "{} timeouts, {} overlaps, {} partial of {} snapshots",
                    r.timeouts, r.overlaps, r.partial, r.snapshots
                ),
                r.timeouts == 0 && r.overlaps == 0 && r.partial == 0 && min > 0,
            ));
        }
    }
    writeln!(doc).unwrap();
    for c in checks {
        writeln!(doc, "- {c}").unwrap();
    }
    writeln!(
        doc,
        "- grants/s of ACQUIREALL BLOCK vs the Lua script: **{:.2}×**\n",
        rates[0] / rates[1].max(1e-9)
    )
    .unwrap();
}
