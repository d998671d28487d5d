//! The classic lock experiment: N clients compete for one key, each looping
//! acquire -> hold -> release, with four ways of waiting:
//! 1. SET NX PX, retried at once (spinning);
//! 2. SET NX PX, retried after a 10 ms sleep;
//! 3. the BLPOP signal list: SET NX PX, and on failure BLPOP a signal list
//!    that release pushes to (100 ms BLPOP timeout, so an expired holder is
//!    noticed);
//! 4. LOCK.ACQUIRE ... BLOCK, released with LOCK.RELEASE.
//!
//! Releases for 1-3 use the usual compare-and-delete script (EVALSHA).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{Connection, Server};
use crate::stats::Summary;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Spin,
    Sleep10,
    Blpop,
    LockBlock,
}

impl Strategy {
    pub const ALL: [Strategy; 4] = [
        Strategy::Spin,
        Strategy::Sleep10,
        Strategy::Blpop,
        Strategy::LockBlock,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Strategy::Spin => "1. SET NX PX, spin",
            Strategy::Sleep10 => "2. SET NX PX, 10 ms sleep",
            Strategy::Blpop => "3. SET NX PX + BLPOP signal",
            Strategy::LockBlock => "4. LOCK.ACQUIRE BLOCK",
        }
    }
}

const RELEASE_LUA: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
const RELEASE_SIGNAL_LUA: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
     redis.call('del', KEYS[1]); redis.call('rpush', KEYS[2], 1); redis.call('ltrim', KEYS[2], 0, 0); \
     return 1 else return 0 end";

/// One client's view of a strategy: acquire (counting commands sent) and release.
struct Client {
    conn: Connection,
    strategy: Strategy,
    token: String,
    release_sha: String,
    signal_sha: String,
    commands: u64,
}

impl Client {
    fn new(server: &Server, strategy: Strategy, token: String) -> Client {
        let mut conn = server.conn();
        let release_sha = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(RELEASE_LUA)
            .query(&mut conn)
            .unwrap();
        let signal_sha = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(RELEASE_SIGNAL_LUA)
            .query(&mut conn)
            .unwrap();
        Client {
            conn,
            strategy,
            token,
            release_sha,
            signal_sha,
            commands: 0,
        }
    }

    fn set_nx(&mut self, key: &str, ttl_ms: u64) -> bool {
        self.commands += 1;
        let r: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&self.token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query(&mut self.conn)
            .unwrap();
        r.is_some()
    }

    /// Tries until granted or `stop` is set; returns whether it was granted.
    fn acquire(&mut self, key: &str, ttl_ms: u64, stop: &AtomicBool) -> bool {
        loop {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            match self.strategy {
                Strategy::Spin => {
                    if self.set_nx(key, ttl_ms) {
                        return true;
                    }
                }
                Strategy::Sleep10 => {
                    if self.set_nx(key, ttl_ms) {
                        return true;
                    }
                    thread::sleep(Duration::from_millis(10));
                }
                Strategy::Blpop => {
                    if self.set_nx(key, ttl_ms) {
                        return true;
                    }
                    self.commands += 1;
                    let _: Option<(String, String)> = redis::cmd("BLPOP")
                        .arg(format!("{key}:signal"))
                        .arg(0.1)
                        .query(&mut self.conn)
                        .unwrap();
                }
                Strategy::LockBlock => {
                    self.commands += 1;
                    let r: Option<i64> = redis::cmd("LOCK.ACQUIRE")
                        .arg(key)
                        .arg(&self.token)
                        .arg(ttl_ms)
                        .arg("BLOCK")
                        .arg(200)
                        .query(&mut self.conn)
                        .unwrap();
                    if r.is_some() {
                        return true;
                    }
                }
            }
        }
    }

    fn release(&mut self, key: &str) {
        self.commands += 1;
        let _: i64 = match self.strategy {
            Strategy::Spin | Strategy::Sleep10 => redis::cmd("EVALSHA")
                .arg(&self.release_sha)
                .arg(1)
                .arg(key)
                .arg(&self.token)
                .query(&mut self.conn)
                .unwrap(),
            Strategy::Blpop => redis::cmd("EVALSHA")
                .arg(&self.signal_sha)
                .arg(2)
                .arg(key)
                .arg(format!("{key}:signal"))
                .arg(&self.token)
                .query(&mut self.conn)
                .unwrap(),
            Strategy::LockBlock => redis::cmd("LOCK.RELEASE")
                .arg(key)
                .arg(&self.token)
                .query(&mut self.conn)
                .unwrap(),
        };
    }
}

pub struct ContentionResult {
    pub strategy: Strategy,
    pub hold_ms: u64,
    pub grants: u64,
    pub seconds: f64,
    pub client_commands: u64,
    pub server_commands: u64,
    pub wait_us: Summary,
    /// Every wait, sorted, in µs (for the chart).
    pub waits: Vec<u64>,
    /// Grants of each client.
    pub per_client: Vec<u64>,
    pub min_grants: u64,
    pub max_grants: u64,
}

impl ContentionResult {
    pub fn grants_per_sec(&self) -> f64 {
        self.grants as f64 / self.seconds
    }
    pub fn server_commands_per_grant(&self) -> f64 {
        self.server_commands as f64 / self.grants.max(1) as f64
    }
    pub fn client_commands_per_grant(&self) -> f64 {
        self.client_commands as f64 / self.grants.max(1) as f64
    }
    pub fn fairness(&self) -> f64 {
        self.max_grants as f64 / self.min_grants.max(1) as f64
    }
}

/// Sum of `calls` in INFO commandstats, leaving out the harness's own
/// INFO/CONFIG/SCRIPT calls.
pub fn server_commands(c: &mut Connection) -> u64 {
    let text: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    text.lines()
        .filter(|l| l.starts_with("cmdstat_"))
        .filter(|l| {
            !["cmdstat_info:", "cmdstat_config", "cmdstat_script"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next())
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

/// `clients` clients loop acquire -> hold -> release on one key for `seconds`.
pub fn run(
    server: &Server,
    strategy: Strategy,
    clients: usize,
    hold_ms: u64,
    seconds: f64,
) -> ContentionResult {
    let key = format!("contended:{strategy:?}:{hold_ms}");
    let mut admin = server.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut admin)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let start_line = Arc::new(Barrier::new(clients + 1));
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let mut client = Client::new(server, strategy, format!("client-{i}"));
            let (stop, start_line, key) = (stop.clone(), start_line.clone(), key.clone());
            thread::spawn(move || {
                start_line.wait();
                let mut waits = Vec::new();
                let mut grants = 0u64;
                loop {
                    let t0 = Instant::now();
                    if !client.acquire(&key, 10_000, &stop) {
                        break;
                    }
                    waits.push(t0.elapsed().as_micros() as u64);
                    grants += 1;
                    if hold_ms > 0 {
                        thread::sleep(Duration::from_millis(hold_ms));
                    }
                    client.release(&key);
                }
                (grants, waits, client.commands)
            })
        })
        .collect();
    start_line.wait();
    let t0 = Instant::now();
    thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut all_waits = Vec::new();
    let (mut grants, mut client_commands) = (0, 0);
    let (mut min_grants, mut max_grants) = (u64::MAX, 0);
    let mut per_client = Vec::with_capacity(clients);
    for h in handles {
        let (g, w, c) = h.join().unwrap();
        per_client.push(g);
        grants += g;
        client_commands += c;
        min_grants = min_grants.min(g);
        max_grants = max_grants.max(g);
        all_waits.extend(w);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    ContentionResult {
        strategy,
        hold_ms,
        grants,
        seconds: elapsed,
        client_commands,
        server_commands: server_commands(&mut admin),
        wait_us: Summary::of(&mut all_waits),
        waits: all_waits,
        per_client,
        min_grants,
        max_grants,
    }
}

/// The crashed holder's lease.
pub const CRASH_LEASE_MS: u64 = 30;

/// Delay from a crashed holder's lease deadline to the next grant, in µs:
/// a holder takes the lock with a short lease and never releases it, while
/// `waiters` clients wait for it with `strategy`. One delay per trial.
pub fn crash_handoff_delays(
    server: &Server,
    strategy: Strategy,
    waiters: usize,
    trials: usize,
) -> Vec<u64> {
    let mut crasher = Client::new(server, strategy, "crashed-holder".into());
    let mut pool: Vec<Client> = (0..waiters)
        .map(|i| Client::new(server, strategy, format!("waiter-{i}")))
        .collect();
    let never = AtomicBool::new(false);
    let mut delays = Vec::with_capacity(trials);
    for trial in 0..trials {
        let key = format!("crash:{strategy:?}:{trial}");
        let sent = Instant::now();
        assert!(crasher.acquire(&key, CRASH_LEASE_MS, &never));
        let deadline = sent + Duration::from_millis(CRASH_LEASE_MS);
        let first_grant = thread::scope(|s| {
            let handles: Vec<_> = pool
                .iter_mut()
                .map(|w| {
                    let (key, never) = (&key, &never);
                    s.spawn(move || {
                        assert!(w.acquire(key, 10_000, never));
                        let at = Instant::now();
                        w.release(key);
                        at
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .min()
                .unwrap()
        });
        delays.push(first_grant.saturating_duration_since(deadline).as_micros() as u64);
    }
    delays
}
