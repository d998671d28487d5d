//! Shared locks and counting semaphores from the client: `.shared()` and
//! `.limit(n)` on an acquisition, and `redis-lock --shared [--limit N]`,
//! against real servers.

use redis_lock_testkit as common;

use std::process::Command;
use std::time::Duration;

use common::Server;
use redis_lock_client::{Error, LockClient};

const BIN: &str = env!("CARGO_BIN_EXE_redis-lock");

/// Readers hold the key together, each with its own fence; a writer waits
/// in the server's line and gets it when the last reader lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_a_key_and_a_writer_waits_for_the_last() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let ttl = Duration::from_secs(10);
    let r1 = locks.acquire("k", ttl).shared().await.unwrap().unwrap();
    let r2 = locks.acquire("k", ttl).shared().await.unwrap().unwrap();
    assert!(r2.fence() > r1.fence());
    assert!(
        locks.acquire("k", ttl).await.unwrap().is_none(),
        "no writer"
    );
    let writer = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.acquire("k", ttl).wait(Duration::from_secs(20)).await })
    };
    common::wait_until(Duration::from_secs(5), || s.info_field("waiters") == 1);
    // A reader arriving behind the waiting writer does not pass it.
    assert!(locks.acquire("k", ttl).shared().await.unwrap().is_none());
    assert!(r1.release().await.unwrap());
    assert!(!writer.is_finished());
    let last = r2.fence();
    assert!(r2.release().await.unwrap());
    let w = writer.await.unwrap().unwrap().expect("granted on release");
    assert!(w.fence() > last);
    assert!(w.release().await.unwrap());
}

/// A semaphore of two permits on one node; a Redlock group refuses one
/// (its nodes count holders apart) but keeps readers and a writer apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_on_one_node_and_shared_locks_on_a_redlock_group() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let ttl = Duration::from_secs(10);
    let a = locks.acquire("sem", ttl).limit(2).await.unwrap().unwrap();
    let _b = locks.acquire("sem", ttl).limit(2).await.unwrap().unwrap();
    assert!(locks.acquire("sem", ttl).limit(2).await.unwrap().is_none());
    // Another limit than the key's: the server says so.
    let other = locks.acquire("sem", ttl).limit(3).await;
    assert!(
        matches!(other, Err(ref e) if e.to_string().contains("LIMIT 2")),
        "{other:?}"
    );
    assert!(a.release().await.unwrap());
    assert!(locks.acquire("sem", ttl).limit(2).await.unwrap().is_some());
    // Readers of several keys at once, each with one fence for all of
    // them; a writer of any of them waits for both.
    let xy1 = locks
        .acquire_all(&["x", "y"], ttl)
        .shared()
        .await
        .unwrap()
        .unwrap();
    let xy2 = locks
        .acquire_all(&["y", "x"], ttl)
        .shared()
        .await
        .unwrap()
        .unwrap();
    assert!(xy2.fence() > xy1.fence());
    assert!(
        locks.acquire("y", ttl).await.unwrap().is_none(),
        "no writer"
    );
    assert!(xy1.release().await.unwrap());
    assert!(locks.acquire_all(&["x", "y"], ttl).await.unwrap().is_none());
    assert!(xy2.release().await.unwrap());
    assert!(locks.acquire_all(&["x", "y"], ttl).await.unwrap().is_some());

    // No restart delay: these nodes never restart here.
    let nodes: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let group = LockClient::new(&common::urls(&nodes)).unwrap();
    let refused = group.acquire("sem", ttl).limit(2).await;
    assert!(
        matches!(refused, Err(Error::Config(ref m)) if m.contains("Redlock")),
        "{refused:?}"
    );
    let r1 = group.acquire("rw", ttl).shared().await.unwrap().unwrap();
    let r2 = group.acquire("rw", ttl).shared().await.unwrap().unwrap();
    assert!(
        group.acquire("rw", ttl).await.unwrap().is_none(),
        "no writer"
    );
    assert!(r1.release().await.unwrap() && r2.release().await.unwrap());
    let w = group.acquire("rw", ttl).await.unwrap().unwrap();
    assert!(group.acquire("rw", ttl).shared().await.unwrap().is_none());
    assert!(w.release().await.unwrap());
}

/// `redis-lock acquire --shared --limit 2`: two permits, the third is not
/// acquired (75); `--limit` without `--shared` is refused by the parser.
#[test]
fn the_command_takes_shared_locks_and_permits() {
    let s = Server::start();
    // `redis-lock acquire` of `keys` (each a --key) with `extra`.
    let acquire = |keys: &[&str], extra: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.args(["acquire", "--url", &s.url(), "--ttl", "30s"]);
        for key in keys {
            cmd.args(["--key", key]);
        }
        cmd.args(extra)
            .env_remove("REDIS_LOCK_URL")
            .output()
            .expect("run redis-lock")
    };
    let run = |extra: &[&str]| acquire(&["jobs"], extra);
    for _ in 0..2 {
        let out = run(&["--shared", "--limit", "2"]);
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("REDIS_LOCK_FENCE="));
    }
    let third = run(&["--shared", "--limit", "2"]);
    assert_eq!(third.status.code(), Some(75), "{third:?}");
    // --limit alone is the same semaphore (issue 31: it was a usage error).
    let bare = run(&["--limit", "2"]);
    assert_eq!(bare.status.code(), Some(75), "the key is full: {bare:?}");
    let info = common::lock_info_reply(&mut s.conn(), "jobs");
    assert!(format!("{info:?}").contains("shared"), "{info:?}");
    // Several --key with --shared: one reader's hold of every key.
    let several = |extra: &[&str]| acquire(&["in", "out"], extra);
    for _ in 0..2 {
        let out = several(&["--shared"]);
        assert!(out.status.success(), "{out:?}");
    }
    assert_eq!(several(&[]).status.code(), Some(75), "no writer of both");
    let out_key = common::lock_info_reply(&mut s.conn(), "out");
    assert!(format!("{out_key:?}").contains("shared"), "{out_key:?}");
}
