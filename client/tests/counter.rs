//! 8 tasks × 200 rounds of a non-atomic increment (read, pause, write) of
//! a counter kept outside Redis, each under the Redlock lock over five
//! nodes, while nodes are killed (-9, data lost) and restarted with
//! `restart-delay-ms` ≥ the TTL (a safe fault). Any overlap of two holders
//! would lose an increment: the counter must end at exactly 1600, and the
//! fencing tokens must rise strictly in grant order.

use redis_lock_testkit as common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Server;
use rand::Rng;
use redis_lock_client::{LockClient, Options};
use tokio::time::Instant;

const TASKS: usize = 8;
const ROUNDS: usize = 200;
const TTL: Duration = Duration::from_millis(1000);

#[derive(Debug, Clone, Copy)]
struct Round {
    fence: i64,
    granted: Instant,
    /// When the increment was written.
    wrote: Instant,
    valid_until: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_tasks_two_hundred_rounds_lose_no_increment_under_crashes() {
    let nodes = Server::redlock_nodes(5, TTL.as_millis());
    let urls: Vec<String> = nodes.iter().map(Server::url).collect();
    let options = Options::default()
        .node_timeout(Duration::from_millis(50))
        .retry_delay(Duration::from_millis(20));
    let locks = LockClient::with_options(&urls, options).unwrap();
    let nodes = Arc::new(Mutex::new(nodes));
    // The shared value, read and written in two separate steps.
    let counter = Arc::new(AtomicU64::new(0));
    let history = Arc::new(Mutex::new(Vec::<Round>::with_capacity(TASKS * ROUNDS)));
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();

    let faults = {
        let (nodes, done) = (nodes.clone(), done.clone());
        tokio::task::spawn_blocking(move || {
            let mut rng = rand::thread_rng();
            let mut crashes = 0usize;
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(rng.gen_range(150..500)));
                if done.load(Ordering::SeqCst) {
                    break;
                }
                let i = rng.gen_range(0..5);
                let mut nodes = nodes.lock().unwrap();
                nodes[i].kill9();
                nodes[i].wipe_data();
                nodes[i].restart();
                crashes += 1;
            }
            crashes
        })
    };

    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (locks, counter, history) = (locks.clone(), counter.clone(), history.clone());
            tokio::spawn(async move {
                let mut attempts = 0usize;
                for _ in 0..ROUNDS {
                    let guard = loop {
                        attempts += 1;
                        if let Ok(Some(g)) = locks
                            .acquire("counter", TTL)
                            .wait(Duration::from_secs(2))
                            .await
                        {
                            break g;
                        }
                    };
                    let granted = Instant::now();
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    history.lock().unwrap().push(Round {
                        fence: guard.fence(),
                        granted,
                        wrote: Instant::now(),
                        valid_until: guard.valid_until(),
                    });
                    let _ = guard.release().await;
                }
                attempts
            })
        })
        .collect();
    let mut attempts = 0;
    for t in tasks {
        attempts += t.await.unwrap();
    }
    let took = start.elapsed();
    done.store(true, Ordering::SeqCst);
    let crashes = faults.await.unwrap();

    let history = history.lock().unwrap().clone();
    eprintln!(
        "counter: {} after {} grants ({attempts} acquire calls) in {took:.1?}, {crashes} node crashes (data lost)",
        counter.load(Ordering::SeqCst),
        history.len(),
    );
    assert!(crashes > 0, "no fault was injected");
    assert_eq!(counter.load(Ordering::SeqCst), (TASKS * ROUNDS) as u64);
    assert_eq!(history.len(), TASKS * ROUNDS);
    // Pushed while holding the lock: the vector is in grant order.
    for pair in history.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(b.fence > a.fence, "tokens went backwards: {a:?} then {b:?}");
        assert!(b.granted >= a.wrote, "two holders at once: {a:?} and {b:?}");
    }
    for r in &history {
        assert!(r.wrote <= r.valid_until, "wrote after its validity: {r:?}");
    }
}
