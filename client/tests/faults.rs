//! Redlock under real faults: five local redis-server processes with the
//! module, nodes killed (-9, data lost) and restarted with
//! `restart-delay-ms` ≥ the TTL, nodes paused (SIGSTOP/SIGCONT: unreachable
//! for a while), and holders that pause past their validity (a GC pause).
//!
//! The harness records every grant (fence, when it was granted and until
//! when it was valid, by the client's monotonic clock, one process) and
//! every write each holder makes to a fenced resource (Kleppmann's storage
//! check: it remembers the highest fence and rejects lower ones). Checked
//! over the whole history afterwards:
//! * no two validity windows overlap (mutual exclusion);
//! * fences strictly increase in grant order, across crashes and restarts;
//! * every write made within validity is accepted; only paused holders'
//!   writes may be rejected, and the store never goes backwards.

use redis_lock_testkit as common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Server;
use rand::Rng;
use redis_lock_client::{LockClient, Options};
use tokio::time::Instant;

const TTL: Duration = Duration::from_millis(1500);

#[derive(Debug, Clone)]
struct Grant {
    fence: i64,
    granted: Instant,
    /// The end of the holder's right to act: its validity deadline, or its
    /// release if earlier.
    until: Instant,
    /// The holder paused past its validity before writing.
    paused: bool,
    write_accepted: bool,
}

/// Remembers the highest fence it accepted; rejects lower ones.
#[derive(Default)]
struct FencedStore {
    highest: i64,
    accepted: Vec<i64>,
}

impl FencedStore {
    fn write(&mut self, fence: i64) -> bool {
        if fence < self.highest {
            return false;
        }
        self.highest = fence;
        self.accepted.push(fence);
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_holds_under_crashes_and_pauses() {
    let seconds: u64 = std::env::var("FAULT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let nodes = Server::redlock_nodes(5, TTL.as_millis());
    let urls: Vec<String> = nodes.iter().map(Server::url).collect();
    let options = Options::default()
        .retry_delay(Duration::from_millis(30))
        .node_timeout(Duration::from_millis(50));
    let locks = LockClient::with_options(&urls, options).unwrap();
    let nodes = Arc::new(Mutex::new(nodes));
    let history = Arc::new(Mutex::new(Vec::<Grant>::new()));
    let store = Arc::new(Mutex::new(FencedStore::default()));
    let run_for = Duration::from_secs(seconds);
    let start = Instant::now();

    let workers: Vec<_> = (0..6)
        .map(|_| {
            let (locks, history, store) = (locks.clone(), history.clone(), store.clone());
            tokio::spawn(async move {
                while start.elapsed() < run_for {
                    let Ok(Some(guard)) =
                        locks.acquire("res", TTL).wait(Duration::from_secs(1)).await
                    else {
                        continue;
                    };
                    let granted = Instant::now();
                    let paused = rand::thread_rng().gen_bool(0.1);
                    let work = if paused {
                        TTL + Duration::from_millis(300) // a GC pause
                    } else {
                        Duration::from_millis(rand::thread_rng().gen_range(1..20))
                    };
                    tokio::time::sleep(work).await;
                    let write_accepted = store.lock().unwrap().write(guard.fence());
                    let until = guard.valid_until().min(Instant::now());
                    history.lock().unwrap().push(Grant {
                        fence: guard.fence(),
                        granted,
                        until,
                        paused,
                        write_accepted,
                    });
                    let _ = guard.release().await;
                }
            })
        })
        .collect();

    let faults = {
        let nodes = nodes.clone();
        tokio::task::spawn_blocking(move || {
            let mut rng = rand::thread_rng();
            let mut counts = [0usize; 2];
            while start.elapsed() < run_for {
                std::thread::sleep(Duration::from_millis(rng.gen_range(200..600)));
                let i = rng.gen_range(0..5);
                if rng.gen_bool(0.5) {
                    // Crash with data loss; it comes back refusing new grants
                    // for longer than any lease it may have lost.
                    let mut nodes = nodes.lock().unwrap();
                    nodes[i].kill9();
                    nodes[i].wipe_data();
                    nodes[i].restart();
                    counts[0] += 1;
                } else {
                    let pid = nodes.lock().unwrap()[i].pid();
                    signal(pid, "STOP");
                    std::thread::sleep(Duration::from_millis(rng.gen_range(100..1500)));
                    signal(pid, "CONT");
                    counts[1] += 1;
                }
            }
            counts
        })
    };

    for w in workers {
        w.await.unwrap();
    }
    let [crashes, pauses] = faults.await.unwrap();
    let mut grants = history.lock().unwrap().clone();
    grants.sort_by_key(|g| g.granted);
    let paused_holders = grants.iter().filter(|g| g.paused).count();
    eprintln!(
        "redlock faults: {} grants, {crashes} node crashes (data lost), {pauses} node pauses, {paused_holders} paused holders",
        grants.len()
    );
    assert!(!grants.is_empty(), "no grant at all");
    for pair in grants.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(b.fence > a.fence, "fences went backwards: {a:?} then {b:?}");
        // Validity ends before the next grant (paused holders kept acting
        // after theirs ended: that is what the fence is for).
        assert!(a.until <= b.granted, "two holders at once: {a:?} and {b:?}");
    }
    for g in &grants {
        if !g.paused {
            assert!(
                g.write_accepted,
                "a valid holder's write was rejected: {g:?}"
            );
        }
    }
    let store = store.lock().unwrap();
    assert!(store.accepted.windows(2).all(|w| w[0] <= w[1]));
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}
