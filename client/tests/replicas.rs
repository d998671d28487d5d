//! Issue 23, item 4: replica acknowledgement. With
//! `Options::wait_replicas(n, t)` a grant counts only once `n` replicas
//! have it (`WAIT` in the same round trip, also after a BLOCK hand-off);
//! one too few acknowledged is released and refused. With the replica
//! link cut (a proxy that lets no byte through) and a failover to that
//! replica, the option leaves no second holder; without it there is one.

use redis_lock_testkit as common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{wait_until, Server};
use redis_lock_client::{Error, LockClient, Options};

/// `replica` follows `master` through `proxy` (so the link can be cut),
/// and acknowledges what it has (the master counts it for WAIT).
fn replicate_through(master: &Server, replica: &Server, proxy: &Proxy) {
    replica.replicate_from_port(proxy.port);
    master.wait_acknowledged(1, "test:acked");
}

/// The replica becomes a master, as a failover makes it.
fn promote(replica: &Server) {
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica.conn())
        .unwrap();
}

/// What `locks` gets for `key` after waiting in `master`'s line while
/// another client held it, once that one releases (a hand-off by BLOCK).
async fn handed_over(
    locks: &LockClient,
    master: &Server,
    key: &str,
    ttl: Duration,
) -> redis_lock_client::Result<Option<redis_lock_client::LockGuard>> {
    let holder = LockClient::new(&[master.url()]).unwrap();
    let held = holder.try_acquire(key, ttl).await.unwrap().unwrap();
    let waiting = {
        let (locks, key) = (locks.clone(), key.to_string());
        tokio::spawn(async move { locks.acquire(&key, ttl).wait(Duration::from_secs(10)).await })
    };
    wait_until(Duration::from_secs(10), || {
        master.info_field("waiters") == 1
    });
    assert!(held.release().await.unwrap());
    waiting.await.unwrap()
}

fn acknowledged(s: &Server) -> LockClient {
    let options = Options::default().wait_replicas(1, Duration::from_millis(300));
    LockClient::with_options(&[s.url()], options).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_counts_once_the_replica_has_it_and_survives_a_failover() {
    if common::skip_unless(common::Needs::OwnServer, "a master and its replica") {
        return;
    }
    let mut master = Server::start();
    let replica = Server::start();
    let proxy = Proxy::start(master.port);
    replicate_through(&master, &replica, &proxy);
    let locks = acknowledged(&master);
    let ttl = Duration::from_secs(30);

    // The command too.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redis-lock"))
        .args([
            "acquire",
            "--url",
            &master.url(),
            "--key",
            "r:cli",
            "--ttl",
            "30s",
        ])
        .args(["--wait-replicas", "1", "--json"])
        .env_remove("REDIS_LOCK_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let fence = common::fence(&mut replica.conn(), "r:cli").expect("on the replica");
    assert!(printed.contains(&format!("\"fence\":{fence}")), "{printed}");

    // A plain grant: the replica has it when the guard is returned (no
    // WAIT of the test's own before looking).
    let guard = locks.try_acquire("r:a", ttl).await.unwrap().expect("free");
    assert_eq!(
        common::fence(&mut replica.conn(), "r:a"),
        Some(guard.fence())
    );
    assert!(guard.release().await.unwrap());

    // A grant handed over from the server's line (BLOCK), likewise.
    let handed = handed_over(&locks, &master, "r:b", ttl)
        .await
        .unwrap()
        .expect("handed over");
    assert_eq!(
        common::fence(&mut replica.conn(), "r:b"),
        Some(handed.fence())
    );

    // The master dies and the replica takes over: the guard's lock is
    // there, so nobody else is granted it.
    master.kill9();
    promote(&replica);
    let other = LockClient::new(&[replica.url()]).unwrap();
    assert!(
        other.try_acquire("r:b", ttl).await.unwrap().is_none(),
        "a second holder after the failover"
    );
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_replica_link_cut_a_grant_is_refused_and_released() {
    if common::skip_unless(common::Needs::OwnServer, "a master and its replica") {
        return;
    }
    let mut master = Server::start();
    let replica = Server::start();
    let proxy = Proxy::start(master.port);
    replicate_through(&master, &replica, &proxy);
    let locks = acknowledged(&master);
    let ttl = Duration::from_secs(30);
    proxy.blackhole();

    // Refused and released, whether granted at once or after a wait in line.
    let refused = locks.try_acquire("r:c", ttl).await;
    assert!(
        matches!(
            refused,
            Err(Error::NotReplicated {
                acknowledged: 0,
                wanted: 1
            })
        ),
        "{refused:?}"
    );
    assert_eq!(common::fence(&mut master.conn(), "r:c"), None, "released");
    let refused = handed_over(&locks, &master, "r:c", ttl).await;
    assert!(
        matches!(refused, Err(Error::NotReplicated { .. })),
        "a hand-off the replica never saw was kept: {refused:?}"
    );
    assert_eq!(common::fence(&mut master.conn(), "r:c"), None, "released");

    // The command: not acquired (75, or the conflict code), nothing run.
    let dir = common::ScratchDir::new("replicas");
    let marker = dir.join("ran");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redis-lock"))
        .args(["run", "--url", &master.url(), "--key", "r:c"])
        .args(["--wait-replicas", "1:200ms", "--conflict-exit-code", "3"])
        .args(["--", "touch"])
        .arg(&marker)
        .env_remove("REDIS_LOCK_URL")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(said.contains("replicas"), "{said}");
    assert!(
        !marker.exists(),
        "the command ran without an acknowledged grant"
    );
    assert_eq!(common::fence(&mut master.conn(), "r:c"), None, "released");

    // Without the option the grant stands on the master alone...
    let plain = LockClient::new(&[master.url()]).unwrap();
    let unacknowledged = plain.try_acquire("r:c", ttl).await.unwrap().expect("free");
    // ...and a failover to the replica loses it: a second holder.
    master.kill9();
    promote(&replica);
    let other = LockClient::new(&[replica.url()]).unwrap();
    let second = other.try_acquire("r:c", ttl).await.unwrap();
    assert!(
        second.is_some() && unacknowledged.is_valid(),
        "the cut link should have kept the grant from the replica"
    );
    std::mem::forget(unacknowledged);
    drop(proxy);
}
