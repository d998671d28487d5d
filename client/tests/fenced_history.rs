//! A randomized history of fenced writes under faults, judged whole.
//!
//! Workers take locks on shared resources and write under them, each write
//! carrying its grant's fence, two ways: `LOCK.FENCED` on a data node with
//! the lock on a Redlock group of three nodes, and `LOCK.EXEC` with the
//! lock and its data on one node. Between the grant and the write a worker
//! may pause past its lease (as a GC pause or a stopped process would), and
//! meanwhile lock and data nodes are killed (-9) and restarted (AOF with
//! fsync always). Every attempt is logged with its outcome. The checker
//! then reads the data (one list per resource, each accepted write appends
//! its fence) and fails on:
//! * an accepted write whose fence is below one accepted before it for the
//!   same resource (a stale holder got through);
//! * a write in the data that its worker was told was refused (STALEFENCE
//!   or NOTHELD: nothing may have run);
//! * an acknowledged write missing from the data (the AOF lost it);
//! * a write accepted although it was sent after the server acknowledged a
//!   higher fence's write for the same resource (judged from the log, so
//!   it holds also where the data lost writes).
//!
//! A second run keeps the data node on RDB alone, saved now and then and
//! restarted from the last save (issue 31): the newest marks and the
//! writes they let through are lost with it, and no fence issued before
//! the restart may pass after it.
//!
//! `FENCED_HISTORY_SECONDS` sets the length (default 8 s in `make test`;
//! `make stress` runs minutes), `FENCED_HISTORY_SEED` the random choices;
//! `FENCED_HISTORY_REPORT=path` (relative to the workspace) writes the
//! counts and the verdict as markdown (`make stress`: docs/fenced-history.md).

use redis_lock_testkit as common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Server;
use rand::{Rng, SeedableRng};
use redis_lock_client::{Error, LockClient, Options};

const RESOURCES: usize = 3;
const WORKERS: usize = 6;
const TTL: Duration = Duration::from_millis(200);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Outcome {
    Accepted,
    /// STALEFENCE or NOTHELD: the server said nothing ran.
    Refused,
    /// No answer (a node restarting): it may or may not have run.
    Unknown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Path {
    Fenced,
    Exec,
}

#[derive(Debug)]
struct Attempt {
    path: Path,
    resource: usize,
    fence: i64,
    outcome: Outcome,
    /// The holder paused longer than its lease before writing.
    paused_past_lease: bool,
    /// When the write was sent and when its answer came.
    sent: std::time::Instant,
    done: std::time::Instant,
}

fn aof_server() -> Server {
    Server::builder()
        .config("appendonly", "yes")
        .config("appendfsync", "always")
        .start()
}

fn list_of(path: Path, r: usize) -> String {
    match path {
        Path::Fenced => format!("{{r{r}}}fenced-log"),
        Path::Exec => format!("{{r{r}}}exec-log"),
    }
}

/// A connection to `url`, made again after a failure.
struct Conn {
    client: redis::Client,
    conn: Option<redis::aio::MultiplexedConnection>,
}

impl Conn {
    fn new(url: &str) -> Conn {
        Conn {
            client: redis::Client::open(url).unwrap(),
            conn: None,
        }
    }

    async fn get(&mut self) -> Option<&mut redis::aio::MultiplexedConnection> {
        if self.conn.is_none() {
            let made = tokio::time::timeout(
                Duration::from_secs(1),
                self.client.get_multiplexed_async_connection(),
            )
            .await;
            self.conn = made.ok().and_then(Result::ok);
        }
        self.conn.as_mut()
    }
}

fn judge(result: Result<(), Error>) -> Outcome {
    match result {
        Ok(()) => Outcome::Accepted,
        Err(Error::StaleFence { .. } | Error::NotHeld(_)) => Outcome::Refused,
        Err(_) => Outcome::Unknown,
    }
}

async fn worker(
    seed: u64,
    group: LockClient,
    single: LockClient,
    data_url: String,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Attempt>>>,
    long_pause: std::ops::Range<u64>,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut data = Conn::new(&data_url);
    while !stop.load(Ordering::Relaxed) {
        let resource = rng.gen_range(0..RESOURCES);
        let path = if rng.gen_bool(0.5) {
            Path::Fenced
        } else {
            Path::Exec
        };
        let locks = match path {
            Path::Fenced => &group,
            Path::Exec => &single,
        };
        let key = format!("{{r{resource}}}lock");
        let guard = match locks
            .acquire(&key, TTL)
            .wait(Duration::from_millis(500))
            .await
        {
            Ok(Some(guard)) => guard,
            _ => continue,
        };
        // A pause: mostly short, sometimes past the lease.
        let pause = if rng.gen_bool(0.3) {
            rng.gen_range(long_pause.clone())
        } else {
            rng.gen_range(0..40)
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let fence = guard.fence();
        let sent = std::time::Instant::now();
        let mut push = redis::cmd("RPUSH");
        push.arg(list_of(path, resource)).arg(fence);
        let result = match path {
            Path::Fenced => match data.get().await {
                Some(conn) => {
                    let gate = format!("{{r{resource}}}gate");
                    let sent = tokio::time::timeout(
                        Duration::from_secs(2),
                        guard.fenced::<i64, _>(conn, &gate, &push),
                    )
                    .await;
                    match sent {
                        Ok(r) => r.map(|_| ()),
                        Err(_) => Err(Error::Timeout),
                    }
                }
                None => Err(Error::Timeout),
            },
            Path::Exec => guard.exec::<i64>(&push).await.map(|_| ()),
        };
        let outcome = judge(result);
        if outcome == Outcome::Unknown {
            data.conn = None;
        }
        log.lock().unwrap().push(Attempt {
            path,
            resource,
            fence,
            outcome,
            paused_past_lease: u128::from(pause) > TTL.as_millis(),
            sent,
            done: std::time::Instant::now(),
        });
        // The lock is let go without a release half the time: its lease ends.
        if rng.gen_bool(0.5) {
            let _ = guard.release().await;
        } else {
            std::mem::forget(guard);
        }
    }
}

/// How the data node behind the gate keeps its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DataNode {
    /// `appendfsync always`: nothing acknowledged is lost.
    Aof,
    /// RDB alone, saved now and then: a restart loads an older state,
    /// the gates' newest marks and the writes they let through lost with
    /// it (issue 31). The node then refuses every fence issued before it
    /// restarted; the checker judges the writes in the order they were
    /// acknowledged, as the data no longer shows the lost ones.
    RdbAlone,
}

#[test]
fn fenced_writes_under_pauses_lease_losses_and_restarts_never_go_backwards() {
    history(DataNode::Aof);
}

/// The same with the data node restarted from an older RDB each time.
#[test]
fn fenced_writes_never_go_backwards_when_the_data_node_loses_its_newest_marks() {
    history(DataNode::RdbAlone);
}

fn history(kind: DataNode) {
    if common::skip_unless(common::Needs::OwnServer, "kills and restarts its servers") {
        return;
    }
    let seconds: u64 = std::env::var("FENCED_HISTORY_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let seed: u64 = std::env::var("FENCED_HISTORY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    println!("seed {seed} (FENCED_HISTORY_SEED to replay the choices), {seconds} s");
    let mut group_nodes: Vec<Server> = (0..3).map(|_| aof_server()).collect();
    let mut single = aof_server();
    let mut data = match kind {
        DataNode::Aof => aof_server(),
        DataNode::RdbAlone => Server::builder()
            .config("appendonly", "no")
            .config("save", "")
            .start(),
    };
    let urls = common::urls(&group_nodes);
    let options = Options::default().auto_renew(false);
    let group = LockClient::with_options(&urls, options.clone()).unwrap();
    let single_locks = LockClient::with_options(&[single.url()], options).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::new()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..WORKERS)
        .map(|i| {
            runtime.spawn(worker(
                seed.wrapping_add(i as u64),
                group.clone(),
                single_locks.clone(),
                data.url(),
                stop.clone(),
                log.clone(),
                match kind {
                    DataNode::Aof => 150..400,
                    // Long enough to straddle a restart of the data node.
                    DataNode::RdbAlone => 150..1000,
                },
            ))
        })
        .collect();
    // Faults: kill -9 and restart a lock node of the group, the single
    // node or the data node, one at a time.
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
    let started = std::time::Instant::now();
    let mut restarts = 0;
    // Restarts of a Redlock group node, the single lock node, the data node.
    let mut restarted = [0usize; 3];
    while started.elapsed() < Duration::from_secs(seconds) {
        let period = match kind {
            DataNode::Aof => 500..1500,
            DataNode::RdbAlone => 200..600,
        };
        std::thread::sleep(Duration::from_millis(rng.gen_range(period)));
        if kind == DataNode::RdbAlone {
            // A save point: what a later restart of the data node goes
            // back to (everything after it is lost then).
            if let Ok(mut c) = data.try_conn() {
                let _: redis::RedisResult<()> = redis::cmd("SAVE").query(&mut c);
            }
            std::thread::sleep(Duration::from_millis(rng.gen_range(50..300)));
        }
        let victim = match kind {
            // The data node's losses are what this run is about.
            DataNode::RdbAlone if rng.gen_bool(0.6) => 4,
            _ => rng.gen_range(0..5),
        };
        let server = match victim {
            0..=2 => &mut group_nodes[victim],
            3 => &mut single,
            _ => &mut data,
        };
        server.kill9();
        let down = match kind {
            DataNode::Aof => 0..300,
            // Back soon: a holder paused across the restart writes to it.
            DataNode::RdbAlone => 0..30,
        };
        std::thread::sleep(Duration::from_millis(rng.gen_range(down)));
        server.restart();
        restarts += 1;
        restarted[match victim {
            0..=2 => 0,
            3 => 1,
            _ => 2,
        }] += 1;
    }
    let elapsed = started.elapsed().as_secs();
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(async {
        for t in tasks {
            t.await.unwrap();
        }
    });
    drop(runtime);

    // ---- the checker ----
    let attempts = std::mem::take(&mut *log.lock().unwrap());
    let mut counts: HashMap<(Path, Outcome), usize> = HashMap::new();
    for a in &attempts {
        *counts.entry((a.path, a.outcome)).or_default() += 1;
    }
    let mut failures = Vec::new();
    for path in [Path::Fenced, Path::Exec] {
        let node = match path {
            Path::Fenced => &data,
            Path::Exec => &single,
        };
        let mut c = node.conn();
        for r in 0..RESOURCES {
            let written: Vec<i64> = redis::cmd("LRANGE")
                .arg(list_of(path, r))
                .arg(0)
                .arg(-1)
                .query(&mut c)
                .unwrap();
            let mut highest = 0;
            for &f in &written {
                if f < highest {
                    failures.push(format!(
                        "{path:?} resource {r}: fence {f} accepted after {highest}"
                    ));
                }
                highest = highest.max(f);
            }
            let of = |o: Outcome| {
                attempts
                    .iter()
                    .filter(move |a| a.path == path && a.resource == r && a.outcome == o)
            };
            for a in of(Outcome::Refused) {
                if written.contains(&a.fence) {
                    failures.push(format!(
                        "{path:?} resource {r}: refused fence {} ran",
                        a.fence
                    ));
                }
            }
            // Lost with an older RDB: only the AOF keeps every write.
            let lossless = path == Path::Exec || kind == DataNode::Aof;
            for a in of(Outcome::Accepted).filter(|_| lossless) {
                if !written.contains(&a.fence) {
                    failures.push(format!(
                        "{path:?} resource {r}: acknowledged fence {} is not in the data",
                        a.fence
                    ));
                }
            }
            // In the order the server acknowledged them, whatever the data
            // kept: a write sent after a higher fence's was acknowledged
            // must not be accepted.
            let accepted: Vec<&Attempt> = of(Outcome::Accepted).collect();
            for later in &accepted {
                if let Some(earlier) = accepted
                    .iter()
                    .find(|e| e.done < later.sent && e.fence > later.fence)
                {
                    failures.push(format!(
                        "{path:?} resource {r}: fence {} accepted after fence {} was acknowledged",
                        later.fence, earlier.fence
                    ));
                }
            }
        }
    }
    let count = |p, o| counts.get(&(p, o)).copied().unwrap_or(0);
    println!(
        "{kind:?}: {} attempts, {restarts} restarts; LOCK.FENCED: {} accepted, {} stale, {} unknown; \
         LOCK.EXEC: {} accepted, {} not held, {} unknown",
        attempts.len(),
        count(Path::Fenced, Outcome::Accepted),
        count(Path::Fenced, Outcome::Refused),
        count(Path::Fenced, Outcome::Unknown),
        count(Path::Exec, Outcome::Accepted),
        count(Path::Exec, Outcome::Refused),
        count(Path::Exec, Outcome::Unknown),
    );
    let report = std::env::var("FENCED_HISTORY_REPORT").ok();
    if let Some(path) = report.filter(|_| kind == DataNode::Aof) {
        let path = common::workspace_root().join(path);
        let run = Run {
            version: data.version(),
            seconds: elapsed,
            seed,
            restarted,
            attempts: &attempts,
            failures: &failures,
        };
        std::fs::write(&path, run.markdown()).unwrap();
        println!("fenced history: report written to {}", path.display());
    }
    assert!(failures.is_empty(), "seed {seed}: {failures:#?}");
    // The history exercised what it is about: writes that got through, and
    // stale holders stopped on both paths.
    assert!(count(Path::Fenced, Outcome::Accepted) > 0 && count(Path::Exec, Outcome::Accepted) > 0);
    assert!(
        count(Path::Fenced, Outcome::Refused) > 0 && count(Path::Exec, Outcome::Refused) > 0,
        "no stale holder was refused: {counts:?}"
    );
}

/// What `FENCED_HISTORY_REPORT` writes.
struct Run<'a> {
    version: String,
    seconds: u64,
    seed: u64,
    /// Restarts of a group node, the single lock node, the data node.
    restarted: [usize; 3],
    attempts: &'a [Attempt],
    failures: &'a [String],
}

impl Run<'_> {
    fn markdown(&self) -> String {
        let env = |name: &str, default: &str| std::env::var(name).unwrap_or(default.into());
        let command = format!(
            "FENCED_HISTORY_SECONDS={} FENCED_HISTORY_REPORT={} REDIS_SERVER={} \
             cargo test -p redis-lock-client --test fenced_history -- --nocapture",
            env("FENCED_HISTORY_SECONDS", "8"),
            env("FENCED_HISTORY_REPORT", ""),
            common::shown_path(&env("REDIS_SERVER", "redis-server")),
        );
        let out = |program: &str, args: &[&str]| {
            std::process::Command::new(program)
                .args(args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default()
        };
        let date = out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
        let root = common::workspace_root();
        let root = root.to_string_lossy();
        let module = match std::env::var("REDIS_LOCK_MODULE") {
            Ok(path) => format!("the module `{path}`"),
            Err(_) => {
                let git = |args: &[&str]| out("git", &[&["-C", &root][..], args].concat());
                let dirty =
                    !git(&["status", "--porcelain", "--", "src", "core", "Cargo.toml"]).is_empty();
                format!(
                    "the module built from commit {}{}",
                    git(&["rev-parse", "--short", "HEAD"]),
                    if dirty {
                        " plus uncommitted changes"
                    } else {
                        ""
                    }
                )
            }
        };
        let mut s = String::from("# Fenced writes: the randomized history\n\n");
        s += &format!(
            "Written by `make stress`, which runs\n\n```sh\n{command}\n```\n\n\
             on {date}, against {} with {module}, for {} s (seed {}: \
             `FENCED_HISTORY_SEED={}` repeats the same random choices, not the same timing). \
             The test is `client/tests/fenced_history.rs`; `make test` runs it for 8 s.\n\n",
            self.version, self.seconds, self.seed, self.seed
        );
        s += &format!(
            "{WORKERS} workers took {} ms leases on {RESOURCES} resources and wrote under them \
             (`RPUSH` of the grant's fence to the resource's list): half through `LOCK.FENCED` \
             on a data node with the lock on a Redlock group of three nodes, half through \
             `LOCK.EXEC` with the lock and the data on one node. Before writing, 30% of the \
             holders paused 150-400 ms (past the lease when above {} ms), the rest 0-40 ms. \
             Every node runs with `appendonly yes`, `appendfsync always`; one at a time was \
             killed (-9) and restarted every 0.5-1.5 s.\n\n",
            TTL.as_millis(),
            TTL.as_millis()
        );
        s += "| path | attempts | accepted | refused (nothing ran) | unknown (no answer) | paused past the lease |\n";
        s += "|---|--:|--:|--:|--:|--:|\n";
        for (path, name, refused) in [
            (
                Path::Fenced,
                "`LOCK.FENCED` (Redlock group + gate)",
                "STALEFENCE",
            ),
            (Path::Exec, "`LOCK.EXEC` (lock's own node)", "NOTHELD"),
        ] {
            let of = |o: Option<Outcome>| {
                self.attempts
                    .iter()
                    .filter(|a| a.path == path && o.is_none_or(|o| a.outcome == o))
                    .count()
            };
            let paused = self
                .attempts
                .iter()
                .filter(|a| a.path == path && a.paused_past_lease)
                .count();
            s += &format!(
                "| {name} | {} | {} | {} ({refused}) | {} | {paused} |\n",
                of(None),
                of(Some(Outcome::Accepted)),
                of(Some(Outcome::Refused)),
                of(Some(Outcome::Unknown)),
            );
        }
        let [group, single, data] = self.restarted;
        s += &format!(
            "\nRestarts (kill -9, then start on the same data): {} in all, {group} of Redlock \
             group nodes, {single} of the single lock node, {data} of the data node.\n\n",
            group + single + data
        );
        if self.failures.is_empty() {
            s += "**Verdict: no violation.** No accepted write's fence was below one accepted \
                  before it for the same resource, no write the server refused is in the data, \
                  and every acknowledged write is.\n";
        } else {
            s += &format!("**Verdict: {} violations:**\n\n", self.failures.len());
            for f in self.failures {
                s += &format!("- {f}\n");
            }
        }
        s
    }
}
