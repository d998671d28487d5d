//! The Redlock section of `make bench`: this client against node-redlock
//! (npm `redlock` 4.x over `ioredis`) and pottery's Redlock (PyPI
//! `pottery`), on the same five local redis-server processes with the
//! module, in the same run. Rewrites the part of docs/redlock.md between
//! `<!-- redlock-bench -->` and `<!-- /redlock-bench -->`.
//!
//!     cargo run --release -p redis-lock-client --example redlock_bench -- [--smoke] [--seconds S] [--out PATH]
//!
//! The peers run as subprocesses (`bench/peers/redlock.js`,
//! `bench/peers/pottery_bench.py`) printing JSON; they are installed into
//! target/bench-peers/ on first use (`npm install --prefix`, `pip install
//! --target`). `--smoke` (run by `make test`, in a debug build) measures only
//! this client, a few operations of each kind, and never touches npm or pip.

use redis_lock_testkit as common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{urls, workspace_root, Server};
use redis_lock_client::{LockClient, Options};
use tokio::time::Instant;

const NODE_PEERS: &[&str] = &["redlock@4.2.0", "ioredis@5.11.1"];
/// node-redlock's 5.0 beta (npm's `beta` tag): `using()` with automatic
/// extension and an AbortSignal, the peer feature closest to this client's.
const NODE_PEERS_5: &[&str] = &["redlock@5.0.0-beta.2", "ioredis@5.11.1"];
const PYTHON_PEERS: &[&str] = &["pottery==3.0.1"];
const BEGIN: &str = "<!-- redlock-bench -->";
const END: &str = "<!-- /redlock-bench -->";

/// Contention: clients, hold, TTL, and the random retry pause every
/// retrying client uses (uniform in 0..RETRY_MS).
const CLIENTS: usize = 16;
const HOLD_MS: u64 = 2;
const CONTENDED_TTL_MS: u64 = 2000;
const RETRY_MS: u64 = 20;
/// Uncontended latency: measured in this many turns of every client.
const LATENCY_TURNS: usize = 4;
/// Uncontended latency and the clock jump: a TTL far above either.
const TTL_MS: u64 = 10_000;

struct Args {
    smoke: bool,
    seconds: f64,
    iterations: usize,
    out: String,
}

fn args() -> Args {
    let mut a = Args {
        smoke: false,
        seconds: 5.0,
        iterations: 2000,
        out: "docs/redlock.md".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--smoke" => a.smoke = true,
            "--seconds" => a.seconds = it.next().and_then(|v| v.parse().ok()).expect("--seconds S"),
            "--out" => a.out = it.next().expect("--out PATH"),
            other => panic!("unknown argument {other}"),
        }
    }
    if a.smoke {
        a.seconds = 0.3;
        a.iterations = 50;
    }
    a
}

/// Nearest-rank percentile in µs (sorts).
fn percentile(v: &mut [u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let rank = ((q / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

#[derive(Default)]
struct Latency {
    acquire: Vec<u64>,
    release: Vec<u64>,
}

impl Latency {
    fn add(&mut self, more: Latency) {
        self.acquire.extend(more.acquire);
        self.release.extend(more.release);
    }

    fn row(&mut self, who: &str) -> String {
        let mut total: Vec<u64> = self
            .acquire
            .iter()
            .zip(&self.release)
            .map(|(a, r)| a + r)
            .collect();
        format!(
            "| {who} | {} | {} | {} | {} | {} | {} |",
            ms(percentile(&mut self.acquire, 50.0)),
            ms(percentile(&mut self.acquire, 99.0)),
            ms(percentile(&mut self.release, 50.0)),
            ms(percentile(&mut self.release, 99.0)),
            ms(percentile(&mut total, 50.0)),
            ms(percentile(&mut total, 99.0)),
        )
    }
    fn p50(&mut self) -> u64 {
        percentile(&mut self.acquire, 50.0)
    }
}

struct Contention {
    grants: Vec<u64>,
    /// The mean time a holder actually held (the hold asked for, plus the
    /// runtime's timer slack).
    hold_ms: f64,
    /// Rounds on all five nodes, granted or not (peers only).
    attempts: Option<u64>,
    elapsed: f64,
    overlaps: u64,
    errors: u64,
}

impl Contention {
    fn total(&self) -> u64 {
        self.grants.iter().sum()
    }
    fn per_sec(&self) -> f64 {
        self.total() as f64 / self.elapsed.max(1e-9)
    }
    fn fairness(&self) -> f64 {
        let max = self.grants.iter().copied().max().unwrap_or(0) as f64;
        let min = self.grants.iter().copied().min().unwrap_or(0) as f64;
        if min == 0.0 {
            f64::INFINITY
        } else {
            max / min
        }
    }
    fn row(&self, who: &str) -> String {
        let fairness = self.fairness();
        format!(
            "| {who} | {:.0} | {:.2} | {}/{} | {} | {} | {} |",
            self.per_sec(),
            self.hold_ms,
            self.grants.iter().min().unwrap_or(&0),
            self.grants.iter().max().unwrap_or(&0),
            if fairness.is_finite() {
                format!("{fairness:.2}")
            } else {
                "∞ (a client starved)".into()
            },
            self.overlaps,
            self.errors,
        )
    }
}

struct ClockJump {
    client1_nodes: String,
    client2_granted: bool,
    overlap: bool,
    /// None: no token, the store cannot tell.
    stale_rejected: Option<bool>,
}

impl ClockJump {
    fn row(&self, who: &str) -> String {
        format!(
            "| {who} | {} | {} | {} | {} |",
            self.client1_nodes,
            yes(self.client2_granted),
            yes(self.overlap),
            match self.stale_rejected {
                Some(true) => "**yes**".to_string(),
                Some(false) => "no: **accepted**".to_string(),
                None => "cannot tell (no token)".to_string(),
            }
        )
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn options(fencing: bool, queue: bool) -> Options {
    Options::default()
        .retry_delay(Duration::from_millis(RETRY_MS))
        .quorum_fencing(fencing)
        .queue(queue)
}

async fn our_latency(nodes: &[Server], fencing: bool, iterations: usize) -> Latency {
    let locks = LockClient::with_options(&urls(nodes), options(fencing, true)).unwrap();
    let ttl = Duration::from_millis(TTL_MS);
    let key = format!("lat-{fencing}");
    let warmup = iterations / 10;
    let mut out = Latency {
        acquire: Vec::with_capacity(iterations),
        release: Vec::with_capacity(iterations),
    };
    for i in 0..warmup + iterations {
        let t0 = Instant::now();
        let guard = locks
            .acquire(&key, ttl)
            .wait(Duration::from_secs(1))
            .await
            .unwrap()
            .expect("uncontended acquire");
        let t1 = Instant::now();
        assert!(guard.release().await.unwrap());
        let t2 = Instant::now();
        if i >= warmup {
            out.acquire.push((t1 - t0).as_micros() as u64);
            out.release.push((t2 - t1).as_micros() as u64);
        }
    }
    out
}

/// The hold: a thread sleep, which keeps to the 2 ms (tokio's timer
/// rounds up to its next millisecond tick, about 3.1 ms measured here for a
/// 2 ms sleep, which would make the hold, not the lock, this client's
/// figure). Every driver reports the hold it actually got.
async fn hold() {
    tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(HOLD_MS)))
        .await
        .unwrap();
}

async fn our_contention(nodes: &[Server], queue: bool, a: &Args) -> Contention {
    let clients = if a.smoke { 4 } else { CLIENTS };
    let key = format!("hot-{queue}");
    let holding = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let held_us = Arc::new(AtomicUsize::new(0));
    let run_for = Duration::from_secs_f64(a.seconds);
    // Each contender is its own client, with its own connections.
    let contenders: Vec<LockClient> = (0..clients)
        .map(|_| LockClient::with_options(&urls(nodes), options(true, queue)).unwrap())
        .collect();
    let start = Instant::now();
    let tasks: Vec<_> = contenders
        .into_iter()
        .map(|locks| {
            let (key, holding, overlaps, errors, held_us) = (
                key.clone(),
                holding.clone(),
                overlaps.clone(),
                errors.clone(),
                held_us.clone(),
            );
            tokio::spawn(async move {
                let mut mine = 0u64;
                while start.elapsed() < run_for {
                    let got = locks
                        .acquire(&key, Duration::from_millis(CONTENDED_TTL_MS))
                        .wait(Duration::from_secs(2))
                        .await;
                    let guard = match got {
                        Ok(Some(g)) => g,
                        Ok(None) => continue,
                        Err(_) => {
                            errors.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                    };
                    if holding.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let held = Instant::now();
                    hold().await;
                    held_us.fetch_add(held.elapsed().as_micros() as usize, Ordering::SeqCst);
                    holding.store(false, Ordering::SeqCst);
                    mine += 1;
                    if guard.release().await.is_err() {
                        errors.fetch_add(1, Ordering::SeqCst);
                    }
                }
                mine
            })
        })
        .collect();
    let mut grants = Vec::new();
    for t in tasks {
        grants.push(t.await.unwrap());
    }
    let total: u64 = grants.iter().sum();
    Contention {
        attempts: None,
        hold_ms: held_us.load(Ordering::SeqCst) as f64 / 1000.0 / total.max(1) as f64,
        grants,
        elapsed: start.elapsed().as_secs_f64(),
        overlaps: overlaps.load(Ordering::SeqCst) as u64,
        errors: errors.load(Ordering::SeqCst) as u64,
    }
}

fn lock_cmd(s: &Server, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut s.conn()).unwrap()
}

/// Kleppmann's clock jump, simplest faithful form: D and E refuse client 1
/// (a placeholder holds them, standing for nodes client 1 cannot reach), so
/// client 1 holds A, B, C; the placeholder goes, and the key is deleted on C
/// as if C's clock had jumped past the lease; client 2 then takes C, D, E
/// while client 1 still believes it holds the lock. Then client 2 writes to
/// a fenced store, and client 1 (late) writes too.
///
/// `ahead`: before all this, A's tokens are raised an hour ahead (as if A's
/// clock had jumped forward earlier), so the token client 1 gets comes from
/// a node outside client 2's majority.
async fn our_clock_jump(nodes: &[Server], fencing: bool, ahead: bool, key: &str) -> ClockJump {
    let ttl = Duration::from_millis(TTL_MS);
    for n in nodes {
        lock_cmd(n, &["DEL", key]);
    }
    if ahead {
        let now: redis::Value = lock_cmd(&nodes[0], &["TIME"]);
        let secs: i64 = match now {
            redis::Value::Array(v) => redis::from_redis_value(&v[0]).unwrap(),
            other => panic!("TIME: {other:?}"),
        };
        let hour_ahead = ((secs + 3600) * 1_000_000).to_string();
        lock_cmd(
            &nodes[0],
            &[
                "LOCK.ACQUIRE",
                "clock-ahead",
                "t",
                "1000",
                "MINFENCE",
                &hour_ahead,
            ],
        );
    }
    for n in &nodes[3..] {
        lock_cmd(
            n,
            &["LOCK.ACQUIRE", key, "placeholder", &TTL_MS.to_string()],
        );
    }
    let client1 = LockClient::with_options(&urls(nodes), options(fencing, true)).unwrap();
    let client2 = LockClient::with_options(&urls(nodes), options(fencing, true)).unwrap();
    let first = client1
        .try_acquire(key, ttl)
        .await
        .unwrap()
        .expect("client 1 holds A, B, C");
    let on: Vec<bool> = nodes
        .iter()
        .map(|n| {
            let fence: Option<i64> = redis::cmd("LOCK.FENCE")
                .arg(key)
                .arg(first.token())
                .query(&mut n.conn())
                .unwrap();
            fence.is_some()
        })
        .collect();
    for n in &nodes[3..] {
        lock_cmd(n, &["LOCK.RELEASE", key, "placeholder"]);
    }
    lock_cmd(&nodes[2], &["DEL", key]); // C's clock jumps
    let second = client2.try_acquire(key, ttl).await.unwrap();
    let overlap = second.is_some() && first.is_valid();
    // The fenced store (Kleppmann's check): client 2 writes, then client 1's
    // late write arrives.
    let stale_rejected = second.as_ref().map(|s| first.fence() < s.fence());
    if let Some(s) = second {
        s.release().await.unwrap();
    }
    let _ = first.release().await;
    ClockJump {
        client1_nodes: names(&on),
        client2_granted: stale_rejected.is_some(),
        overlap,
        stale_rejected,
    }
}

fn names(on: &[bool]) -> String {
    let s: Vec<String> = on
        .iter()
        .enumerate()
        .filter(|(_, &b)| b)
        .map(|(i, _)| ((b'A' + i as u8) as char).to_string())
        .collect();
    s.join(",")
}

// ---------------------------------------------------------------- peers

enum Peer {
    NodeRedlock,
    NodeRedlock5,
    Pottery,
}

impl Peer {
    fn label(&self) -> &'static str {
        match self {
            Peer::NodeRedlock => "node-redlock 4.2.0 (ioredis 5)",
            Peer::NodeRedlock5 => "node-redlock 5.0.0-beta.2, using() (ioredis 5)",
            Peer::Pottery => "pottery 3.0.1 Redlock (redis-py)",
        }
    }

    fn dir(&self) -> PathBuf {
        workspace_root().join(match self {
            Peer::NodeRedlock => "target/bench-peers/node",
            Peer::NodeRedlock5 => "target/bench-peers/node5",
            Peer::Pottery => "target/bench-peers/python",
        })
    }

    /// Installs the peer into target/bench-peers/ on first use.
    fn install(&self) -> Result<(), String> {
        let dir = self.dir();
        let (marker, mut cmd) = match self {
            Peer::NodeRedlock | Peer::NodeRedlock5 => {
                let mut c = Command::new("npm");
                c.args(["install", "--no-audit", "--no-fund", "--prefix"])
                    .arg(&dir)
                    .args(match self {
                        Peer::NodeRedlock5 => NODE_PEERS_5,
                        _ => NODE_PEERS,
                    });
                (dir.join("node_modules/redlock/package.json"), c)
            }
            Peer::Pottery => {
                let mut c = Command::new("python3");
                c.args(["-m", "pip", "install", "--quiet", "--target"])
                    .arg(&dir)
                    .args(PYTHON_PEERS);
                (dir.join("pottery/redlock.py"), c)
            }
        };
        if marker.exists() {
            return Ok(());
        }
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        eprintln!(
            "redlock_bench: installing {} into {}",
            self.label(),
            dir.display()
        );
        let out = cmd.output().map_err(|e| e.to_string())?;
        if !out.status.success() || !marker.exists() {
            return Err(format!(
                "install failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }

    fn run(&self, request: serde_like::Obj) -> Result<String, String> {
        let json = request.to_string();
        let mut cmd = match self {
            Peer::NodeRedlock | Peer::NodeRedlock5 => {
                let mut c = Command::new("node");
                c.arg(workspace_root().join("bench/peers/redlock.js"))
                    .env("NODE_PATH", self.dir().join("node_modules"));
                c
            }
            Peer::Pottery => {
                let mut c = Command::new("python3");
                c.arg(workspace_root().join("bench/peers/pottery_bench.py"))
                    .env("PYTHONPATH", self.dir());
                c
            }
        };
        let out = cmd.arg(&json).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "{} {json}: {}",
                self.label(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// Just enough JSON for the peers' requests and replies (no serde in the
/// workspace): flat objects out, number arrays and scalars back.
mod serde_like {
    pub struct Obj(Vec<(String, String)>);

    impl Obj {
        pub fn new() -> Obj {
            Obj(Vec::new())
        }
        pub fn num(mut self, k: &str, v: impl std::fmt::Display) -> Obj {
            self.0.push((k.into(), v.to_string()));
            self
        }
        pub fn str(mut self, k: &str, v: &str) -> Obj {
            self.0.push((k.into(), format!("\"{v}\"")));
            self
        }
        pub fn nums(mut self, k: &str, v: &[u16]) -> Obj {
            let items: Vec<String> = v.iter().map(|p| p.to_string()).collect();
            self.0.push((k.into(), format!("[{}]", items.join(","))));
            self
        }
    }

    impl std::fmt::Display for Obj {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let items: Vec<String> = self.0.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            write!(f, "{{{}}}", items.join(","))
        }
    }

    /// The raw text of field `k` in a flat JSON object.
    pub fn field<'a>(json: &'a str, k: &str) -> &'a str {
        let pat = format!("\"{k}\":");
        let at = json
            .find(&pat)
            .unwrap_or_else(|| panic!("no {k} in {json}"))
            + pat.len();
        let rest = json[at..].trim_start();
        let end = if rest.starts_with('[') {
            rest.find(']').unwrap() + 1
        } else {
            rest.find([',', '}']).unwrap_or(rest.len())
        };
        rest[..end].trim()
    }

    pub fn numbers(json: &str, k: &str) -> Vec<f64> {
        field(json, k)
            .trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().parse().unwrap())
            .collect()
    }

    pub fn bools(json: &str, k: &str) -> Vec<bool> {
        field(json, k)
            .trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .map(|s| s.trim() == "true")
            .collect()
    }
}

use serde_like::Obj;

fn base(ports: &[u16], mode: &str, key: &str) -> Obj {
    Obj::new()
        .str("mode", mode)
        .nums("ports", ports)
        .str("key", key)
        .num("retry_ms", RETRY_MS)
}

fn peer_latency(p: &Peer, ports: &[u16], iterations: usize) -> Result<Latency, String> {
    let out = p.run(
        base(ports, "latency", "peer-lat")
            .num("ttl_ms", TTL_MS)
            .num("warmup", iterations / 10)
            .num("iterations", iterations),
    )?;
    let us = |k| {
        serde_like::numbers(&out, k)
            .into_iter()
            .map(|v| v as u64)
            .collect()
    };
    Ok(Latency {
        acquire: us("acquire_us"),
        release: us("release_us"),
    })
}

fn peer_contention(p: &Peer, ports: &[u16], a: &Args) -> Result<Contention, String> {
    let out = p.run(
        base(ports, "contention", "peer-hot")
            .num("ttl_ms", CONTENDED_TTL_MS)
            .num("clients", CLIENTS)
            .num("hold_ms", HOLD_MS)
            .num("seconds", a.seconds),
    )?;
    let n = |k| serde_like::field(&out, k).parse::<f64>().unwrap();
    Ok(Contention {
        grants: serde_like::numbers(&out, "grants")
            .into_iter()
            .map(|v| v as u64)
            .collect(),
        elapsed: n("elapsed_s"),
        hold_ms: n("hold_ms"),
        attempts: Some(n("attempts") as u64),
        overlaps: n("overlaps") as u64,
        errors: n("errors") as u64,
    })
}

fn peer_clock_jump(p: &Peer, ports: &[u16]) -> Result<ClockJump, String> {
    let out = p.run(base(ports, "clockjump", "peer-jump").num("ttl_ms", TTL_MS))?;
    let flag = |k| serde_like::field(&out, k) == "true";
    Ok(ClockJump {
        client1_nodes: names(&serde_like::bools(&out, "client1_nodes")),
        client2_granted: flag("client2_granted"),
        overlap: flag("overlap"),
        stale_rejected: None,
    })
}

// ---------------------------------------------------------------- report

fn target(what: &str, got: String, met: bool) -> String {
    format!(
        "- {what}: **{got}**, {}",
        if met { "met" } else { "missed" }
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let nodes: Vec<Server> = (0..5).map(|_| Server::start()).collect();
    let ports: Vec<u16> = nodes.iter().map(|s| s.port).collect();
    let peers: Vec<Peer> = if a.smoke {
        vec![]
    } else {
        [Peer::NodeRedlock, Peer::NodeRedlock5, Peer::Pottery]
            .into_iter()
            .filter(|p| match p.install() {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("redlock_bench: {} left out: {e}", p.label());
                    false
                }
            })
            .collect()
    };
    let ours_fenced = "this client, quorum fencing (default)";
    let ours_plain = "this client, no quorum fencing";

    // 1. Uncontended latency.
    // In turns, so that background load (2 cores) falls on every client alike.
    let turns = if a.smoke { 1 } else { LATENCY_TURNS };
    let each = a.iterations / turns;
    let mut lat_fenced = Latency::default();
    let mut lat_plain = Latency::default();
    let mut peer_lat: Vec<(&Peer, Latency)> =
        peers.iter().map(|p| (p, Latency::default())).collect();
    for _ in 0..turns {
        lat_fenced.add(our_latency(&nodes, true, each).await);
        lat_plain.add(our_latency(&nodes, false, each).await);
        for (p, l) in &mut peer_lat {
            match peer_latency(p, &ports, each) {
                Ok(got) => l.add(got),
                Err(e) => eprintln!("redlock_bench: {e}"),
            }
        }
    }
    peer_lat.retain(|(_, l)| !l.acquire.is_empty());

    // 2. Contention.
    let cont_queue = our_contention(&nodes, true, &a).await;
    let cont_random = our_contention(&nodes, false, &a).await;
    let mut peer_cont = Vec::new();
    for p in &peers {
        match peer_contention(p, &ports, &a) {
            Ok(c) => peer_cont.push((p, c)),
            Err(e) => eprintln!("redlock_bench: {e}"),
        }
    }

    // 3. Clock jump.
    let mut jumps = vec![
        (
            ours_fenced.to_string(),
            our_clock_jump(&nodes, true, false, "jump-1").await,
        ),
        (
            ours_plain.to_string(),
            our_clock_jump(&nodes, false, false, "jump-2").await,
        ),
    ];
    // Fresh nodes for each: a grant with quorum fencing carries the
    // hour-ahead token to the other nodes' marks, which would hide the
    // difference in the next run.
    let mut jumps_ahead = Vec::new();
    for (who, fencing) in [(ours_fenced, true), (ours_plain, false)] {
        let fresh: Vec<Server> = (0..5).map(|_| Server::start()).collect();
        jumps_ahead.push((
            who.to_string(),
            our_clock_jump(&fresh, fencing, true, "jump-ahead").await,
        ));
    }
    for p in &peers {
        match peer_clock_jump(p, &ports) {
            Ok(j) => jumps.push((p.label().to_string(), j)),
            Err(e) => eprintln!("redlock_bench: {e}"),
        }
    }
    let version = redis_version(&ports);
    drop(nodes);

    // The report.
    let mut s = String::new();
    // The smoke run is a debug build (make test compiles the client so for
    // its tests anyway): its figures say only that every path runs.
    let command = format!(
        "cargo run {}-p redis-lock-client --example redlock_bench -- {}--out {}",
        if a.smoke { "" } else { "--release " },
        if a.smoke { "--smoke " } else { "" },
        a.out
    );
    let by = if a.smoke {
        format!("`{command}` (the smoke run of `make test`: this client only, a few operations)")
    } else {
        format!("`make bench`, as `{command}`")
    };
    writeln!(
        s,
        "Written by {by}. Five local redis-server {} processes with the module on \
         127.0.0.1, the same five for every client, in one run; each client talks to all five \
         (node-redlock and pottery with their own `SET NX PX` keys and Lua scripts, this \
         client with the module's commands). {} build of this client; node-redlock's \
         clients share one Node.js process (its event loop), pottery's are one Python process \
         each (threads would share the GIL). 2 cores shared by the servers and the clients: \
         compare within the tables, not with other machines.\n",
        version,
        if cfg!(debug_assertions) {
            "Debug"
        } else {
            "Release"
        },
    )
    .unwrap();
    writeln!(
        s,
        "### Uncontended acquire and release ({} each, in {turns} turns of every client, each \
         after {} warm-up)\n",
        each * turns,
        each / 10
    )
    .unwrap();
    writeln!(
        s,
        "One client, one key, lock free: acquire (TTL {TTL_MS} ms), then release, in a loop \
         (this client: `acquire` with a 1 s wait; node-redlock: `lock` with `retryCount` 0; \
         pottery: `acquire(blocking=False)`). Milliseconds.\n"
    )
    .unwrap();
    writeln!(
        s,
        "| client | acquire p50 | acquire p99 | release p50 | release p99 | both p50 | both p99 |"
    )
    .unwrap();
    writeln!(s, "|---|---|---|---|---|---|---|").unwrap();
    writeln!(s, "{}", lat_fenced.row(ours_fenced)).unwrap();
    writeln!(s, "{}", lat_plain.row(ours_plain)).unwrap();
    for (p, l) in &mut peer_lat {
        writeln!(s, "{}", l.row(p.label())).unwrap();
    }
    writeln!(
        s,
        "\n### Contention: {} clients, one key, {HOLD_MS} ms hold\n",
        if a.smoke { 4 } else { CLIENTS }
    )
    .unwrap();
    writeln!(
        s,
        "Each client (its own connections to all five nodes) loops acquire (TTL \
         {CONTENDED_TTL_MS} ms, waiting up to 2 s) → hold {HOLD_MS} ms → release for {:.1} s. \
         Every retrying client pauses uniformly 0–{RETRY_MS} ms between attempts \
         (node-redlock `retryDelay` {} ± `retryJitter` {}, pottery `_RETRY_DELAY` {}, this \
         client `retry_delay` {RETRY_MS} ms). *Fairness* is the most grants of any client \
         divided by the fewest. *Overlaps* counts grants made while another client of the run \
         believed it held the lock. *Hold* is the hold each driver measured: each sleeps 2 ms \
         its own way (this client in a blocking thread, since tokio's timer rounds a 2 ms sleep \
         up to about 3.1 ms here, which would make the timer, not the lock, the figure).\n",
        a.seconds,
        RETRY_MS / 2,
        RETRY_MS / 2,
        RETRY_MS as f64 / 1000.0
    )
    .unwrap();
    writeln!(
        s,
        "| client | grants/s | hold ms (measured mean) | grants min/max per client | fairness | overlaps | errors |"
    )
    .unwrap();
    writeln!(s, "|---|---|---|---|---|---|---|").unwrap();
    writeln!(
        s,
        "{}",
        cont_queue.row("this client, waiting in the ordering node's line (default)")
    )
    .unwrap();
    writeln!(
        s,
        "{}",
        cont_random.row("this client, random retries only (`queue: false`)")
    )
    .unwrap();
    for (p, c) in &peer_cont {
        writeln!(s, "{}", c.row(p.label())).unwrap();
    }
    let per_grant: Vec<String> = peer_cont
        .iter()
        .filter_map(|(p, c)| {
            c.attempts
                .map(|n| format!("{} {:.1}", p.label(), n as f64 / c.total().max(1) as f64))
        })
        .collect();
    if !per_grant.is_empty() {
        writeln!(
            s,
            "\nAttempts (rounds on all five nodes) per grant: {}. A round that no client wins \
             (the nodes split their votes) is released and retried after the random pause.",
            per_grant.join(", ")
        )
        .unwrap();
    }
    writeln!(s, "\n### Clock jump\n").unwrap();
    writeln!(
        s,
        "Kleppmann's scenario in its simplest faithful form, TTL {TTL_MS} ms: D and E refuse \
         client 1 (a placeholder holds the key there, standing for nodes client 1 cannot \
         reach), so client 1 holds A, B, C; the placeholder goes, and the key is **deleted on \
         C, standing for C's clock jumping** past the lease (the real libfaketime jump is \
         `client/tests/clock.rs`, not here); client 2 then tries C, D, E. *Overlap*: client 2 was \
         granted while client 1's validity had not run out. Then client 2 writes to a fenced \
         store (it remembers the highest token and rejects lower ones) and client 1's late \
         write arrives: is it rejected?\n"
    )
    .unwrap();
    writeln!(
        s,
        "| client | client 1 held | client 2 granted | overlap | client 1's stale write rejected |"
    )
    .unwrap();
    writeln!(s, "|---|---|---|---|---|").unwrap();
    for (who, j) in &jumps {
        writeln!(s, "{}", j.row(who)).unwrap();
    }
    writeln!(
        s,
        "\nEvery client overlaps: that is Redlock's, not a client's, weakness. Without quorum \
         fencing this client's store still rejects client 1 here only because the module's \
         tokens follow the nodes' clocks, which agree on one machine, so client 2's later \
         tokens are larger anyway."
    )
    .unwrap();
    writeln!(
        s,
        "\nThe same with A's tokens an hour ahead beforehand (as if A's clock had jumped \
         forward earlier), so client 1's token comes from a node outside client 2's majority:\n"
    )
    .unwrap();
    writeln!(
        s,
        "| client | client 1 held | client 2 granted | overlap | client 1's stale write rejected |"
    )
    .unwrap();
    writeln!(s, "|---|---|---|---|---|").unwrap();
    for (who, j) in &jumps_ahead {
        writeln!(s, "{}", j.row(who)).unwrap();
    }
    writeln!(
        s,
        "\nWith quorum fencing client 1's hour-ahead token was confirmed on B and C, so C's \
         mark is above it and client 2's token on C, D, E is larger. Without it client 1's \
         token stays above client 2's: the store takes client 1's stale write (and would \
         refuse client 2's next ones). The peers have no token to send at all."
    )
    .unwrap();

    // Targets (issue 9), against the peers measured in this run.
    if !peers.is_empty() {
        writeln!(
            s,
            "\n### Targets (issue 9), against the peers measured in this run\n"
        )
        .unwrap();
        let ours = lat_fenced.p50();
        for (p, l) in &mut peer_lat {
            let theirs = l.p50();
            writeln!(
                s,
                "{}",
                target(
                    &format!(
                        "uncontended acquire p50 with quorum fencing below {}'s (without fencing)",
                        p.label()
                    ),
                    format!("{} ms vs {} ms", ms(ours), ms(theirs)),
                    ours < theirs,
                )
            )
            .unwrap();
        }
        if let Some((_, nr)) = peer_cont
            .iter()
            .find(|(p, _)| matches!(p, Peer::NodeRedlock))
        {
            writeln!(
                s,
                "{}",
                target(
                    "contended grants/s at least node-redlock's",
                    format!("{:.0} vs {:.0}", cont_queue.per_sec(), nr.per_sec()),
                    cont_queue.per_sec() >= nr.per_sec(),
                )
            )
            .unwrap();
        }
        writeln!(
            s,
            "{}",
            target(
                "fairness (max/min grants per client) 1.2 or better",
                format!("{:.2}", cont_queue.fairness()),
                cont_queue.fairness() <= 1.2,
            )
        )
        .unwrap();
    }

    assert_eq!(cont_queue.overlaps, 0, "two holders at once");
    assert_eq!(cont_random.overlaps, 0, "two holders at once");
    assert!(cont_queue.total() > 0 && cont_random.total() > 0);

    write_section(&a.out, &s);
    println!("{s}");
    println!("redlock_bench: wrote {}", a.out);
}

fn redis_version(ports: &[u16]) -> String {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{}/", ports[0]))
        .unwrap()
        .get_connection()
        .unwrap();
    let info: String = redis::cmd("INFO").arg("server").query(&mut c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_string()
}

/// Replaces the marked section of `path` (appends it, markers included, if
/// the markers are missing; creates the file if it does not exist).
fn write_section(path: &str, section: &str) {
    let block = format!("{BEGIN}\n{section}\n{END}");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let new = match (text.find(BEGIN), text.find(END)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{block}{}", &text[..b], &text[e + END.len()..])
        }
        _ if text.is_empty() => format!("{block}\n"),
        _ => format!("{}\n{block}\n", text.trim_end()),
    };
    if let Some(dir) = Path::new(path).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(path, new).expect("write the report");
}
