//! `LockClient::acquire_all`: one lock over several keys with one fence,
//! against real servers (one node, and a Redlock group).

use redis_lock_testkit as common;

use std::time::Duration;

use common::Server;
use redis_lock_client::{Error, LockClient, Options};

fn fence(s: &Server, key: &str) -> Option<i64> {
    common::fence(&mut s.conn(), key)
}

/// Every key with one fence; a second caller naming them in the other
/// order waits in the server and gets them all when they are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_with_one_fence_and_waiters_take_turns() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let ttl = Duration::from_secs(10);
    let guard = locks
        .acquire_all(&["a", "b", "c"], ttl)
        .await
        .unwrap()
        .expect("free");
    for k in ["a", "b", "c"] {
        assert_eq!(fence(&s, k), Some(guard.fence()), "{k}");
    }
    assert_eq!(guard.key(), "a");
    assert_eq!(guard.keys().as_slice(), ["a", "b", "c"]);
    // Not all free: nothing taken.
    assert!(locks.acquire_all(&["z", "c"], ttl).await.unwrap().is_none());
    assert_eq!(fence(&s, "z"), None);
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .acquire_all(&["c", "b", "a"], ttl)
                .wait(Duration::from_secs(20))
                .await
        })
    };
    common::wait_until(Duration::from_secs(5), || s.info_field("waiters") == 1);
    let first = guard.fence();
    assert!(guard.release().await.unwrap());
    let next = waiter.await.unwrap().unwrap().expect("granted on release");
    assert!(next.fence() > first);
    for k in ["a", "b", "c"] {
        assert_eq!(fence(&s, k), Some(next.fence()), "{k}");
    }
    assert!(next.release().await.unwrap());
    for k in ["a", "b", "c"] {
        assert_eq!(fence(&s, k), None, "{k} released");
    }
    // No key, or one named twice: refused before anything is sent.
    let none: [&str; 0] = [];
    assert!(matches!(
        locks.acquire_all(&none, ttl).await,
        Err(Error::Config(_))
    ));
    assert!(matches!(
        locks.acquire_all(&["a", "a"], ttl).await,
        Err(Error::Config(_))
    ));
}

/// Renewal extends every key; losing one key (deleted under the holder)
/// loses the lock, and the keys it still had are given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_every_key_and_losing_one_loses_the_lock() {
    let s = Server::start();
    let options = Options::default().auto_renew(true);
    let locks = LockClient::with_options(&[s.url()], options).unwrap();
    let ttl = Duration::from_millis(600);
    let guard = locks
        .acquire_all(&["r1", "r2"], ttl)
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(guard.is_valid(), "renewed past its TTL");
    assert_eq!(fence(&s, "r1"), Some(guard.fence()));
    assert_eq!(fence(&s, "r2"), Some(guard.fence()));
    let _: () = redis::cmd("DEL").arg("r2").query(&mut s.conn()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), guard.lost().cancelled())
        .await
        .expect("lost once a key is gone");
    common::wait_until(Duration::from_secs(5), || fence(&s, "r1").is_none());
}

/// A wait dropped (a timeout around it) leaves no key held, whether or not
/// the server had granted it by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_leaves_no_key_held() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let ttl = Duration::from_secs(30);
    let holder = locks.try_acquire("d2", ttl).await.unwrap().unwrap();
    let wait = locks
        .acquire_all(&["d1", "d2"], ttl)
        .wait(Duration::from_secs(20));
    assert!(tokio::time::timeout(
        Duration::from_millis(200),
        std::future::IntoFuture::into_future(wait)
    )
    .await
    .is_err());
    assert_eq!(fence(&s, "d1"), None, "held nothing while waiting");
    assert!(holder.release().await.unwrap());
    // The line it left is gone, or its late grant is released.
    common::wait_until(Duration::from_secs(5), || {
        fence(&s, "d1").is_none() && fence(&s, "d2").is_none() && s.info_field("waiters") == 0
    });
    assert!(locks.try_acquire("d1", ttl).await.unwrap().is_some());
}

/// Redlock over three nodes: every key on a majority with one fence, and
/// released everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_group_takes_every_key_on_a_majority() {
    if common::skip_unless(common::Needs::OwnServer, "needs three servers") {
        return;
    }
    let nodes: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let urls: Vec<String> = nodes.iter().map(Server::url).collect();
    let options = Options::default().distinct_nodes(true);
    let locks = LockClient::with_options(&urls, options).unwrap();
    let ttl = Duration::from_secs(10);
    let guard = locks
        .acquire_all(&["g1", "g2"], ttl)
        .await
        .unwrap()
        .unwrap();
    let holding = nodes
        .iter()
        .filter(|n| fence(n, "g1") == Some(guard.fence()) && fence(n, "g2") == Some(guard.fence()))
        .count();
    assert!(holding >= 2, "on a majority: {holding}");
    assert!(locks
        .acquire_all(&["g2", "g1"], ttl)
        .await
        .unwrap()
        .is_none());
    assert!(guard.release().await.unwrap());
    for n in &nodes {
        assert_eq!(fence(n, "g1"), None);
        assert_eq!(fence(n, "g2"), None);
    }
}
