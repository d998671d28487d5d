//! The client against one real redis-server with the module.

use redis_lock_testkit as common;

use std::time::Duration;

use common::Server;
use redis_lock_client::{LockClient, Options};
use tokio::time::{sleep, Instant};

fn renewing(s: &Server) -> LockClient {
    let options = Options::default().auto_renew(true);
    LockClient::with_options(&[s.url()], options).unwrap()
}

fn server_fence(s: &Server, key: &str) -> Option<i64> {
    common::fence(&mut s.conn(), key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_grants_once_and_release_frees() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let ttl = Duration::from_secs(10);
    let guard = locks
        .try_acquire("order:1", ttl)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(server_fence(&s, "order:1"), Some(guard.fence()));
    assert!(locks.try_acquire("order:1", ttl).await.unwrap().is_none());
    let left = guard.valid_until() - Instant::now();
    assert!(left > Duration::from_secs(9) && left <= ttl, "{left:?}");
    let first = guard.fence();
    assert!(guard.release().await.unwrap());
    assert_eq!(server_fence(&s, "order:1"), None);
    let next = locks.try_acquire("order:1", ttl).await.unwrap().unwrap();
    assert!(next.fence() > first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_waits_in_the_server_not_by_polling() {
    if common::skip_unless(common::Needs::OwnServer, "counts INFO lock from zero") {
        return;
    }
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let holder = locks
        .try_acquire("job", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .acquire("job", Duration::from_secs(30))
                .wait(Duration::from_secs(20))
                .await
        })
    };
    common::wait_until(Duration::from_secs(10), || s.info_field("waiters") == 1);
    let first = holder.fence();
    assert!(holder.release().await.unwrap());
    let got = waiter.await.unwrap().unwrap().expect("handed the lock");
    assert!(got.fence() > first);
    assert_eq!(server_fence(&s, "job"), Some(got.fence()));
    assert_eq!(s.info_field("contended"), 0, "no polling");
    assert_eq!(s.info_field("handoffs"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_gives_up_after_the_wait() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let _holder = locks
        .try_acquire("k", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let start = Instant::now();
    let got = locks
        .acquire("k", Duration::from_secs(5))
        .wait(Duration::from_millis(300))
        .await
        .unwrap();
    assert!(got.is_none());
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(s.info_field("waiters"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_runs_under_the_lock_and_releases() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let mut c = s.conn();
    let (fence, seen) = locks
        .acquire("stock:7", Duration::from_secs(5))
        .wait(Duration::from_secs(1))
        .with_lock(move |lease| async move { (lease.fence(), common::fence(&mut c, "stock:7")) })
        .await
        .unwrap()
        .expect("acquired");
    assert_eq!(seen, Some(fence));
    assert_eq!(server_fence(&s, "stock:7"), None, "released after");
    // Held by someone else: Ok(None) after the wait, as from acquire.
    let _other = locks
        .try_acquire("stock:7", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let not = locks
        .acquire("stock:7", Duration::from_secs(5))
        .wait(Duration::from_millis(100))
        .with_lock(|_| async {})
        .await
        .unwrap();
    assert!(not.is_none());
}

/// Issue 23, item 7: a TTL the drift allowance (1% + 2 ms) eats whole is
/// refused before any node is asked, as the command refuses a TTL of 0:
/// before, `acquire(k, 1 ms)` returned a guard that was already invalid
/// (and left the key held for its lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_within_the_drift_allowance_is_refused() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    for ms in [0, 1, 2] {
        let refused = locks
            .try_acquire("tiny", Duration::from_millis(ms))
            .await
            .map(|g| g.map(|g| g.is_valid()));
        match refused {
            Err(redis_lock_client::Error::Config(why)) => {
                assert!(why.contains("drift"), "{why}")
            }
            other => panic!("a {ms} ms TTL was not refused: {other:?}"),
        }
        assert_eq!(
            server_fence(&s, "tiny"),
            None,
            "{ms} ms: the node was asked"
        );
    }
    let guard = locks
        .try_acquire("tiny", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        guard.extend(Duration::from_millis(2)).await,
        Err(redis_lock_client::Error::Config(_))
    ));
    assert!(guard.is_valid(), "a refused extend is not a loss");
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_renewal_keeps_a_short_lock_and_stops_at_release() {
    let s = Server::start();
    let locks = renewing(&s);
    let guard = locks
        .try_acquire("renewed", Duration::from_millis(600))
        .await
        .unwrap()
        .unwrap();
    sleep(Duration::from_millis(2000)).await;
    assert!(guard.is_valid(), "renewed past its TTL");
    assert!(!guard.lost().is_cancelled());
    assert_eq!(server_fence(&s, "renewed"), Some(guard.fence()));
    assert!(s.info_field("extends") >= 3);
    assert!(guard.release().await.unwrap());
    let extends = s.info_field("extends");
    sleep(Duration::from_millis(800)).await;
    assert_eq!(s.info_field("extends"), extends, "no renewal after release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_lock_fires_the_signal_and_stops_renewing() {
    let s = Server::start();
    let locks = renewing(&s);
    let guard = locks
        .try_acquire("lost", Duration::from_millis(600))
        .await
        .unwrap()
        .unwrap();
    // An administrator deletes the lock: the next renewal is answered 0.
    let _: i64 = redis::cmd("DEL").arg("lost").query(&mut s.conn()).unwrap();
    let lost = guard.lost();
    tokio::time::timeout(Duration::from_secs(5), lost.cancelled())
        .await
        .expect("lost fires");
    assert!(!guard.is_valid());
    let extends = s.info_field("extends");
    sleep(Duration::from_millis(800)).await;
    assert_eq!(s.info_field("extends"), extends);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_renewal_the_signal_fires_at_the_validity_deadline() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let guard = locks
        .try_acquire("short", Duration::from_millis(300))
        .await
        .unwrap()
        .unwrap();
    let deadline = guard.valid_until();
    tokio::time::timeout(Duration::from_secs(5), guard.lost().cancelled())
        .await
        .expect("lost fires");
    assert!(Instant::now() >= deadline);
    // Extending by hand before the deadline keeps it valid.
    let guard = locks
        .try_acquire("short2", Duration::from_millis(300))
        .await
        .unwrap()
        .unwrap();
    assert!(guard.extend(Duration::from_secs(10)).await.unwrap());
    sleep(Duration::from_millis(500)).await;
    assert!(guard.is_valid());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_is_released_in_the_background() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    {
        let _guard = locks
            .try_acquire("dropped", Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap();
    }
    let s2 = &s;
    common::wait_until(Duration::from_secs(5), || {
        server_fence(s2, "dropped").is_none()
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_is_reached_again() {
    if common::skip_unless(common::Needs::OwnServer, "restarts the server") {
        return;
    }
    let mut s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let g = locks
        .try_acquire("a", Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    drop(g);
    s.kill9();
    assert!(locks
        .try_acquire("b", Duration::from_secs(1))
        .await
        .is_err());
    s.restart();
    let g = locks
        .try_acquire("b", Duration::from_secs(1))
        .await
        .unwrap();
    assert!(g.is_some());
}

/// A waiting acquire keeps its connection for the next wait; after the
/// server restarted, that connection is closed and the next wait goes on
/// over a fresh one instead of failing once with "broken pipe".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_after_a_restart_reconnects() {
    if common::skip_unless(common::Needs::OwnServer, "restarts the server") {
        return;
    }
    let mut s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let wait = Duration::from_secs(2);
    let g = locks.acquire("a", Duration::from_secs(5)).wait(wait).await;
    assert!(g.unwrap().expect("free").release().await.unwrap());
    // Two waits at once: two connections kept, both stale after the restart.
    let held = locks
        .try_acquire("b", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let g = locks.acquire("b", Duration::from_secs(5)).wait(wait).await;
            g.unwrap().expect("handed over").release().await.unwrap()
        })
    };
    let g = locks.acquire("c", Duration::from_secs(5)).wait(wait).await;
    assert!(g.unwrap().expect("free").release().await.unwrap());
    common::wait_until(Duration::from_secs(10), || s.info_field("waiters") == 1);
    assert!(held.release().await.unwrap());
    assert!(waiter.await.unwrap());
    s.kill9();
    s.restart();
    let g = locks.acquire("a", Duration::from_secs(5)).wait(wait).await;
    assert!(g.expect("reconnected").is_some());
}

/// Issue 23, item 5: a wait on one node rides through the node's crash
/// and restart (before, the first connection error ended it: exit 69 at
/// 2.1 s of a 30 s wait), reconnecting until its deadline, as a Redlock
/// group's wait does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_rides_through_a_restart_of_its_node() {
    if common::skip_unless(common::Needs::OwnServer, "restarts the server") {
        return;
    }
    let mut s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    assert!(common::acquire(&mut s.conn(), "w", "other", 60_000).is_some());
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .acquire("w", Duration::from_secs(10))
                .wait(Duration::from_secs(30))
                .await
        })
    };
    common::wait_until(Duration::from_secs(10), || s.info_field("waiters") == 1);
    s.kill9();
    sleep(Duration::from_secs(1)).await;
    assert!(!waiter.is_finished(), "the wait ended with the node");
    s.restart();
    // Whatever the restart kept of the holder's lock, it lets go now.
    common::release(&mut s.conn(), "w", "other");
    let guard = tokio::time::timeout(Duration::from_secs(25), waiter)
        .await
        .expect("within the wait")
        .unwrap()
        .expect("the wait went on after the restart")
        .expect("granted");
    assert_eq!(server_fence(&s, "w"), Some(guard.fence()));
    assert!(guard.release().await.unwrap());
}

#[test]
fn the_blocking_facade_acquires_extends_and_releases() {
    let s = Server::start();
    let locks = redis_lock_client::blocking::LockClient::new(&[s.url()]).unwrap();
    let guard = locks
        .try_acquire("b", Duration::from_secs(5))
        .unwrap()
        .expect("free");
    assert_eq!(server_fence(&s, "b"), Some(guard.fence()));
    assert!(locks
        .try_acquire("b", Duration::from_secs(5))
        .unwrap()
        .is_none());
    assert!(guard.extend(Duration::from_secs(30)).unwrap());
    assert!(guard.is_valid() && !guard.is_lost());
    assert!(guard.release().unwrap());
    assert_eq!(server_fence(&s, "b"), None);
    {
        let _dropped = locks
            .try_acquire("b", Duration::from_secs(5))
            .unwrap()
            .unwrap();
    }
    assert_eq!(server_fence(&s, "b"), None, "released on drop");
}

/// A manual extend with a shorter TTL under auto-renewal: the renewals
/// follow it (the lease's TTL has one owner), so the lock is kept; before,
/// the keeper went on with the grant's schedule, missed the shorter
/// deadline and called the lock lost. A longer one is kept by renewals too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_follow_the_ttl_of_a_manual_extend() {
    let s = Server::start();
    let guard = renewing(&s)
        .try_acquire("k", Duration::from_secs(3))
        .await
        .unwrap()
        .expect("free");
    assert!(guard.extend(Duration::from_millis(600)).await.unwrap());
    assert_eq!(guard.ttl(), Duration::from_millis(600));
    sleep(Duration::from_secs(2)).await;
    assert!(guard.is_valid(), "lost after a shorter manual extend");
    assert_eq!(server_fence(&s, "k"), Some(guard.fence()));
    let left = common::lease_ms(&mut s.conn(), "k");
    assert!(left <= 600, "renewed with the grant's TTL: {left} ms left");
    assert!(guard.extend(Duration::from_secs(20)).await.unwrap());
    sleep(Duration::from_secs(1)).await;
    assert!(guard.is_valid());
    let left = common::lease_ms(&mut s.conn(), "k");
    assert!(left > 10_000, "cut back to a shorter TTL: {left} ms left");
    assert!(guard.release().await.unwrap());
}

/// Safety under auto-renewal and manual extends racing each other: at
/// every moment the guard's validity ends no later than the lease the node
/// actually holds (the node's remaining lease, read just after, plus the
/// time between the two reads). Random TTLs and pauses; the renewals run
/// every third of the current TTL meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guards_validity_never_outlasts_the_nodes_lease() {
    use rand::Rng;
    let s = Server::start();
    let mut c = s.conn();
    let guard = renewing(&s)
        .try_acquire("k", Duration::from_millis(300))
        .await
        .unwrap()
        .expect("free");
    let mut rng = rand::thread_rng();
    for round in 0..300 {
        if rng.gen_bool(0.5) {
            // From 200 ms: a shorter TTL's node timeout (a tenth) is within
            // the stalls of a loaded test machine, and the guard is then
            // rightly lost; what is checked here is safety, not liveness.
            let ttl = Duration::from_millis(rng.gen_range(200..1000));
            assert!(guard.extend(ttl).await.unwrap(), "round {round}");
        }
        sleep(Duration::from_millis(rng.gen_range(0..40))).await;
        let read_at = Instant::now();
        let local_left = guard.valid_until().saturating_duration_since(read_at);
        let node_left = common::lease_ms(&mut c, "k");
        let between = read_at.elapsed();
        assert!(node_left > 0, "round {round}: the node's lease ended");
        assert!(
            local_left <= Duration::from_millis(node_left as u64 + 1) + between,
            "round {round}: the guard counts on {local_left:?}, the node holds {node_left} ms"
        );
        assert!(guard.is_valid(), "round {round}");
    }
    assert!(guard.release().await.unwrap());
}

/// Once `lost` has fired the guard stays lost: an extend asks no node and
/// answers false, even while a node still has the lease (a renewal timed
/// out on a paused node); before, it answered true and moved the deadline
/// while `lost` stayed fired and nothing renewed the lock any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_after_the_loss_signal_answers_false() {
    let s = Server::start();
    let guard = renewing(&s)
        .try_acquire("k", Duration::from_secs(3))
        .await
        .unwrap()
        .expect("free");
    s.signal("STOP");
    tokio::time::timeout(Duration::from_secs(10), guard.lost().cancelled())
        .await
        .expect("lost fires while renewals time out");
    s.signal("CONT");
    assert_eq!(
        server_fence(&s, "k"),
        Some(guard.fence()),
        "still on the node"
    );
    assert!(!guard.extend(Duration::from_secs(3)).await.unwrap());
    assert!(!guard.is_valid());
}

/// Issue 23, item 7: the blocking facade speaks `std::time::Instant`, runs
/// a closure under a renewed lock (`with_lock`, reporting a loss as the
/// async one does) and can wait for a loss.
#[test]
fn the_blocking_facade_has_std_instants_with_lock_and_a_wait_for_loss() {
    let s = Server::start();
    let locks = redis_lock_client::blocking::LockClient::new(&[s.url()]).unwrap();
    let ttl = Duration::from_secs(10);
    let guard = locks.try_acquire("b:std", ttl).unwrap().expect("free");
    let left: Duration = guard.valid_until() - std::time::Instant::now();
    assert!(left > Duration::from_secs(9) && left <= ttl, "{left:?}");
    assert!(!guard.wait_for_loss(Duration::from_millis(50)), "not lost");
    // Lost without renewal: an administrative DEL, then a refused extend.
    let _: () = redis::cmd("DEL").arg("b:std").query(&mut s.conn()).unwrap();
    assert!(!guard.extend(ttl).unwrap());
    assert!(guard.wait_for_loss(Duration::from_secs(1)));
    drop(guard);

    let fence = locks
        .acquire("b:with", ttl)
        .with_lock(|guard| {
            assert_eq!(server_fence(&s, "b:with"), Some(guard.fence()));
            guard.fence()
        })
        .unwrap()
        .expect("free");
    assert!(fence > 0);
    assert_eq!(
        server_fence(&s, "b:with"),
        None,
        "released after the closure"
    );
    let lost = locks.acquire("b:with", ttl).with_lock(|guard| {
        let _: () = redis::cmd("DEL")
            .arg("b:with")
            .query(&mut s.conn())
            .unwrap();
        let _ = guard.extend(ttl);
    });
    assert!(
        matches!(lost, Err(redis_lock_client::Error::Lost)),
        "{lost:?}"
    );
    let holder = locks.try_acquire("b:with", ttl).unwrap().expect("free");
    assert_eq!(
        locks.acquire("b:with", ttl).with_lock(|_| ()).unwrap(),
        None,
        "held by another: not acquired"
    );
    assert!(holder.release().unwrap());
}

/// Issue 17 (the crate's shape): the blocking facade names the wait and
/// the token as the async client does; without a wait it makes one attempt.
#[test]
fn the_blocking_facade_waits_and_takes_a_named_token() {
    let s = Server::start();
    let holder = redis_lock_client::blocking::LockClient::new(&[s.url()]).unwrap();
    let waiter = redis_lock_client::blocking::LockClient::new(&[s.url()]).unwrap();
    let ttl = Duration::from_secs(30);
    let held = holder
        .acquire("b", ttl)
        .token("first")
        .call()
        .unwrap()
        .expect("free");
    assert_eq!(held.token(), "first");
    let info = common::lock_info(&mut s.conn(), "b").expect("held");
    assert_eq!(info.token.as_deref(), Some(&b"first"[..]));
    assert!(
        waiter.acquire("b", ttl).call().unwrap().is_none(),
        "no wait: one attempt"
    );
    let first = held.fence();
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            waiter
                .acquire("b", ttl)
                .token("second")
                .wait(Duration::from_secs(20))
                .call()
        });
        common::wait_until(Duration::from_secs(10), || {
            common::lock_info(&mut s.conn(), "b").is_some_and(|i| i.waiters == 1)
        });
        assert!(held.release().unwrap());
        let got = waiting.join().unwrap().unwrap().expect("handed the lock");
        assert_eq!(got.token(), "second");
        assert!(got.fence() > first);
        assert_eq!(server_fence(&s, "b"), Some(got.fence()));
    });
}

/// Issue 17 (the crate's shape): `auto_renew` named on one acquisition
/// overrides the client's option, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_renew_named_on_one_acquisition_overrides_the_option() {
    let s = Server::start();
    let ttl = Duration::from_millis(400);
    let plain = LockClient::new(&[s.url()]).unwrap();
    let kept = plain
        .acquire("kept", ttl)
        .auto_renew(true)
        .await
        .unwrap()
        .expect("free");
    let left = renewing(&s)
        .acquire("left", ttl)
        .auto_renew(false)
        .await
        .unwrap()
        .expect("free");
    sleep(ttl * 4).await;
    assert_eq!(server_fence(&s, "kept"), Some(kept.fence()), "renewed");
    assert!(!kept.lost().is_cancelled());
    assert_eq!(server_fence(&s, "left"), None, "not renewed: expired");
    assert!(!left.is_valid());
    assert!(kept.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_reports_the_holder_and_when_it_was_granted() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let before = now_ms();
    let guard = locks
        .try_acquire("order:9", Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free");
    let after = now_ms();
    let info = locks
        .info("order:9")
        .await
        .remove(0)
        .unwrap()
        .expect("held");
    assert_eq!(info.fence, guard.fence());
    assert_eq!(info.waiters, 0);
    assert!(info.ttl_ms > 0 && info.ttl_ms <= 10_000);
    let granted = info.granted_ms.expect("known");
    // The server converts its monotonic time to Unix ms with an offset it
    // keeps while the clocks stay within 5 ms of it (so a lease is written
    // out with the same deadline every time), and each clock is read in
    // whole ms: the grant time may sit up to 6 ms outside our readings.
    let slack = 6;
    assert!(
        (before - slack..=after + slack).contains(&granted),
        "{before} {granted} {after}"
    );
    guard.release().await.unwrap();
    assert_eq!(locks.info("order:9").await.remove(0).unwrap(), None);
}

/// Issue 17, defect 4: `with_lock` says when the lock was lost while the
/// closure ran (an administrative DEL here; the next renewal is refused):
/// before, it returned Ok as if the work had been done under the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_reports_a_lock_lost_during_the_work() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let mut c = s.conn();
    let result = locks
        .acquire("job", Duration::from_millis(600))
        .with_lock(move |lease| async move {
            let _: i64 = redis::cmd("DEL").arg("job").query(&mut c).unwrap();
            // Work on past the next renewal (a third of the TTL).
            tokio::select! {
                _ = lease.lost().cancelled() => {}
                _ = sleep(Duration::from_secs(3)) => {}
            }
            "done"
        })
        .await;
    assert!(
        matches!(result, Err(redis_lock_client::Error::Lost)),
        "{result:?}"
    );
    // Done in time: Ok.
    let ok = locks
        .acquire("job", Duration::from_secs(5))
        .with_lock(|_| async { 7 })
        .await
        .unwrap();
    assert_eq!(ok, Some(7));
}

/// Issue 17, defect 4: a guard dropped as the runtime's main future returns
/// (the `?` in a `#[tokio::main]`) is released, on either runtime flavor:
/// before, the drop spawned a task the shutting-down runtime never ran and
/// the lock stayed for its TTL.
#[test]
fn a_guard_dropped_as_the_runtime_ends_is_released() {
    let s = Server::start();
    for (round, multi) in [(0, false), (1, true)] {
        let key = format!("main:{round}");
        let runtime = if multi {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        .unwrap();
        let url = s.url();
        let k = key.clone();
        let outcome: Result<(), String> = runtime.block_on(async move {
            let locks =
                LockClient::with_options(&[url], Options::default().auto_renew(true)).unwrap();
            let _guard = locks
                .try_acquire(&k, Duration::from_secs(60))
                .await
                .unwrap()
                .expect("free");
            Err("the work failed".to_string())?;
            Ok(())
        });
        assert!(outcome.is_err());
        drop(runtime);
        assert_eq!(
            server_fence(&s, &key),
            None,
            "multi_thread={multi}: released"
        );
    }
}

/// Issue 17, defect 4: the blocking facade works when called from async
/// code (it blocks that thread): before, it panicked ("Cannot start a
/// runtime from within a runtime").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blocking_facade_works_inside_a_runtime() {
    let s = Server::start();
    let locks = redis_lock_client::blocking::LockClient::new(&[s.url()]).unwrap();
    let guard = locks
        .try_acquire("b", Duration::from_secs(5))
        .unwrap()
        .expect("free");
    assert_eq!(server_fence(&s, "b"), Some(guard.fence()));
    assert!(guard.extend(Duration::from_secs(30)).unwrap());
    assert!(guard.release().unwrap());
    {
        let _dropped = locks
            .try_acquire("b", Duration::from_secs(5))
            .unwrap()
            .unwrap();
    }
    assert_eq!(server_fence(&s, "b"), None, "released on drop");
    drop(locks);
}

/// Issue 17: acquiring a free lock with a wait costs one command, as
/// without one. Before, the BLOCK grant was followed by a same-token
/// renewal just to measure the validity (two round trips).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_lock_with_a_wait_costs_one_command() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let calls = || s.command_calls("lock.acquire");
    let before = calls();
    let ttl = Duration::from_secs(10);
    let guard = locks
        .acquire("free", ttl)
        .wait(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free");
    assert_eq!(calls() - before, 1, "one LOCK.ACQUIRE");
    let left = guard.valid_until() - Instant::now();
    assert!(left > ttl / 2 && left < ttl, "{left:?}");
    guard.release().await.unwrap();
}

/// A release no majority answered is an error (whether the lock was held
/// is not known), not `Ok(false)`, which says "it was not held".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_nobody_answered_is_an_error() {
    if common::skip_unless(common::Needs::OwnServer, "kills the server") {
        return;
    }
    let mut s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let guard = locks
        .try_acquire("k", Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free");
    s.kill9();
    assert!(guard.release().await.is_err());
}

/// Over RESP3 (`?protocol=resp3`, or an application's own RESP3 client)
/// LOCK.INFO and CONFIG GET answer maps, not arrays. Before, `info` failed
/// with a type error and the settings read found no restart delay or
/// fsync policy (so the deployment warnings were silently skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_works_over_resp3() {
    let s = Server::builder()
        .module_arg("restart-delay-ms", "0")
        .start();
    let url = format!("redis://127.0.0.1:{}/?protocol=resp3", s.port);
    let locks = LockClient::new(&[url.as_str()]).unwrap();
    let ttl = Duration::from_secs(10);
    let guard = locks.try_acquire("r3", ttl).await.unwrap().expect("free");
    let info = locks.info("r3").await.remove(0).unwrap().expect("held");
    assert_eq!(info.token.as_deref(), Some(guard.token().as_bytes()));
    assert_eq!(info.fence, guard.fence());
    assert!(info.ttl_ms > 9000 && info.ttl_ms <= 10_000, "{info:?}");
    let settings = locks.settings().await.remove(0).unwrap();
    assert!(settings.module_loaded);
    assert_eq!(settings.restart_delay_ms, Some(0));
    assert!(settings.appendonly.is_some() && settings.appendfsync.is_some());
    assert!(guard.extend(ttl).await.unwrap());
    assert!(guard.release().await.unwrap());
    assert!(locks.info("r3").await.remove(0).unwrap().is_none());
}

/// A URL naming database 3: the lock, a wait (on a connection of its own)
/// and the hand-off are db 3's; db 0 is never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_with_a_database_waits_in_that_databases_line() {
    let s = Server::start();
    let url = format!("{}3", s.url());
    let locks = LockClient::new(&[url]).unwrap();
    let ttl = Duration::from_secs(30);
    let first = locks.try_acquire("k", ttl).await.unwrap().unwrap();
    let refused = locks
        .acquire("k", ttl)
        .wait(Duration::from_millis(300))
        .await
        .unwrap();
    assert!(refused.is_none(), "waited in db 3's line");
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.acquire("k", ttl).wait(Duration::from_secs(10)).await })
    };
    let mut c = s.conn();
    let deadline = Instant::now() + Duration::from_secs(10);
    while common::info_number(&mut c, "lock", "lock_waiters") != 1 {
        assert!(Instant::now() < deadline, "the waiter never queued");
        sleep(Duration::from_millis(10)).await;
    }
    let first_fence = first.fence();
    assert!(first.release().await.unwrap());
    let second = waiter.await.unwrap().unwrap().unwrap();
    assert!(second.fence() > first_fence);
    let in_db0: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert!(in_db0.is_empty(), "{in_db0:?}");
    let _: () = redis::cmd("SELECT").arg(3).query(&mut c).unwrap();
    assert_eq!(common::fence(&mut c, "k"), Some(second.fence()));
    assert!(second.release().await.unwrap());
}
