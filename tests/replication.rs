//! A replica's lock state equals its master's; replicas refuse writes and
//! never expire or grant on their own; a promoted replica never reissues a
//! fencing token the old master gave out.

use redis_lock_testkit as common;

use common::*;
use std::thread::sleep;
use std::time::Duration;

fn wait_replicated(master: &mut Connection) {
    let n: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(master).unwrap();
    assert_eq!(n, 1, "the replica acknowledged");
}

fn pair() -> (Server, Server) {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    (master, replica)
}

#[test]
fn replica_follows_every_change_with_the_same_state() {
    let (master, replica) = pair();
    let mut m = master.conn();
    let mut r = replica.conn();
    let same = |m: &mut Connection, r: &mut Connection| {
        wait_replicated(m);
        assert_eq!(digest(m), digest(r));
        for key in ["a", "b", "c"] {
            assert_eq!(fence(m, key), fence(r, key), "{key}");
        }
    };
    let fa = acquire(&mut m, "a", "t1", 60_000).unwrap();
    acquire(&mut m, "b", "t2", 60_000).unwrap();
    let binary = [0u8, 0xff, b'\r', b'\n', b' '];
    let fbin: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg("bin")
        .arg(&binary[..])
        .arg(60_000)
        .query(&mut m)
        .unwrap();
    same(&mut m, &mut r);
    let on_replica: Option<i64> = redis::cmd("LOCK.FENCE")
        .arg("bin")
        .arg(&binary[..])
        .query(&mut r)
        .unwrap();
    assert_eq!(
        on_replica,
        Some(fbin),
        "binary token replicated byte for byte"
    );
    let info = lock_info(&mut r, "a").unwrap();
    assert_eq!(info.token.as_deref(), Some(&b"t1"[..]));
    assert_eq!(info.fence, fa);

    assert_eq!(acquire(&mut m, "a", "t1", 90_000), Some(fa)); // lease reset
    assert_eq!(extend(&mut m, "b", "t2", 120_000), 1);
    same(&mut m, &mut r);
    let pttl: i64 = lease_ms(&mut r, "b");
    assert!(pttl > 90_000, "absolute deadline replicated: {pttl}");

    release(&mut m, "a", "t1");
    let _: () = redis::cmd("DEL").arg("b").query(&mut m).unwrap();
    acquire(&mut m, "c", "t3", 100).unwrap();
    same(&mut m, &mut r);
    sleep(Duration::from_millis(200));
    assert!(
        acquire(&mut m, "c", "t4", 60_000).is_some(),
        "re-granted after expiry"
    );
    same(&mut m, &mut r);
    let _: () = redis::cmd("FLUSHALL").query(&mut m).unwrap();
    same(&mut m, &mut r);
    let n: i64 = redis::cmd("DBSIZE").query(&mut r).unwrap();
    assert_eq!(n, 0);
}

#[test]
fn replica_fence_mark_follows_the_masters_grants() {
    let (master, replica) = pair();
    let mut m = master.conn();
    let mut last = 0;
    for i in 0..20 {
        last = acquire(&mut m, &format!("k{i}"), "t", 60_000).unwrap();
    }
    wait_replicated(&mut m);
    assert!(replica.info_field("fence_hwm") >= last);
}

#[test]
fn replica_refuses_writes_but_answers_fence_and_info() {
    let (master, replica) = pair();
    let mut m = master.conn();
    let f = acquire(&mut m, "k", "t", 60_000).unwrap();
    wait_replicated(&mut m);
    let mut r = replica.conn();
    for cmd in [
        vec!["LOCK.ACQUIRE", "k", "t", "1000"],
        vec!["LOCK.ACQUIRE", "free", "t", "1000"],
        vec!["LOCK.RELEASE", "k", "t"],
        vec!["LOCK.EXTEND", "k", "t", "1000"],
    ] {
        let err = run_err(&mut r, &cmd);
        assert!(err.starts_with("READONLY"), "{cmd:?}: {err}");
    }
    let err = run_err(&mut r, &["LOCK._SET", "k", "evil", "1", "99999999999999"]);
    assert!(
        err.starts_with("READONLY") || err.contains("internal"),
        "{err}"
    );
    assert_eq!(fence(&mut r, "k"), Some(f));
    assert!(lock_info(&mut r, "k").is_some());
    assert_eq!(digest(&mut m), digest(&mut r));
}

#[test]
fn replica_never_expires_a_lock_on_its_own() {
    let (master, replica) = pair();
    let mut m = master.conn();
    acquire(&mut m, "k", "t", 1500).unwrap();
    // Writes paused on the master (as in a failover): its sweep waits, so
    // nothing sends the replica a DEL until the pause ends.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(10_000)
        .arg("WRITE")
        .query(&mut m)
        .unwrap();
    let mut r = replica.conn();
    wait_until(Duration::from_secs(5), || fence(&mut r, "k").is_some());
    sleep(Duration::from_millis(1800));
    assert_eq!(fence(&mut r, "k"), None, "reads see the lease has ended");
    assert_eq!(lock_info(&mut r, "k"), None);
    let n: i64 = redis::cmd("DBSIZE").query(&mut r).unwrap();
    assert_eq!(
        n, 1,
        "but the replica keeps the key until its master deletes it"
    );
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut m).unwrap();
    wait_until(Duration::from_secs(20), || {
        let n: i64 = redis::cmd("DBSIZE").query(&mut r).unwrap();
        n == 0
    });
}

/// The replica is paused while the master grants; the master dies; the
/// replica is promoted. It must not hand out any token the master issued.
#[test]
fn promoted_replica_never_reissues_a_fence_it_missed() {
    let (mut master, replica) = pair();
    let mut m = master.conn();
    let kept = acquire(&mut m, "kept", "holder", 60_000).unwrap();
    wait_replicated(&mut m);

    let mut r = replica.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.restart-delay-ms")
        .arg(1_000)
        .query(&mut r)
        .unwrap();
    replica.signal("STOP");
    // Drop the link too, or the grants below would still reach the paused
    // replica through its socket buffer.
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut m)
        .unwrap();
    let mut missed = 0;
    for i in 0..50 {
        missed = acquire(&mut m, &format!("lost{i}"), "t", 60_000).unwrap();
    }
    master.kill9();
    replica.signal("CONT");

    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut r)
        .unwrap();
    assert_eq!(
        fence(&mut r, "lost0"),
        None,
        "the replica never saw these grants"
    );
    assert!(replica.info_field("fence_hwm") > missed);

    // The restart delay also starts at promotion.
    let err = run_err(&mut r, &["LOCK.ACQUIRE", "lost0", "t", "1000"]);
    assert!(err.starts_with("TRYAGAIN"), "{err}");
    assert_eq!(
        extend(&mut r, "kept", "holder", 60_000),
        1,
        "a replicated holder continues"
    );

    wait_until(Duration::from_secs(20), || {
        let got: redis::RedisResult<Option<i64>> = redis::cmd("LOCK.ACQUIRE")
            .arg("lost0")
            .arg("new")
            .arg(60_000)
            .query(&mut r);
        matches!(got, Ok(Some(_)))
    });
    let f = fence(&mut r, "lost0").unwrap();
    assert!(
        f > missed && f > kept,
        "{f} must exceed every token the old master issued ({missed})"
    );
}

/// Grants made while no replica or AOF could receive effects, then a
/// replica attaches (full sync), then more grants, renewals and releases:
/// the replica must end up equal.
#[test]
fn a_replica_attaching_later_gets_the_same_state() {
    let master = Server::start();
    let mut m = master.conn();
    let early = acquire(&mut m, "early", "t", 60_000).unwrap();
    acquire(&mut m, "renewed", "t", 60_000).unwrap();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut r = replica.conn();
    assert_eq!(
        fence(&mut r, "early"),
        Some(early),
        "carried by the full sync"
    );
    assert!(acquire(&mut m, "renewed", "t", 90_000).is_some());
    let late = acquire(&mut m, "late", "t", 60_000).unwrap();
    release(&mut m, "early", "t");
    wait_replicated(&mut m);
    assert_eq!(digest(&mut m), digest(&mut r));
    assert_eq!(fence(&mut r, "late"), Some(late));
    assert_eq!(fence(&mut r, "early"), None);
    let pttl: i64 = lease_ms(&mut r, "renewed");
    assert!(
        pttl > 60_000,
        "the renewal reached the replica as an absolute deadline"
    );
}

/// A master restarts from its RDB and its replica resyncs: grants after the
/// restart reach the replica as effects.
#[test]
fn grants_after_a_master_restart_reach_its_replica() {
    let mut master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.conn();
    acquire(&mut m, "before", "t", 60_000).unwrap();
    wait_replicated(&mut m);
    // The replica's sync may still have its fork: SAVE refuses to run then
    // (Redis 8.2 was seen to).
    master.wait_persistence_idle();
    let _: () = redis::cmd("SAVE").query(&mut m).unwrap();
    master.kill9();
    master.restart();
    let mut m = master.conn();
    wait_until(Duration::from_secs(20), || {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut m).unwrap();
        info.contains("connected_slaves:1")
    });
    let f = acquire(&mut m, "after", "t", 60_000).unwrap();
    wait_replicated(&mut m);
    let mut r = replica.conn();
    assert_eq!(fence(&mut r, "after"), Some(f));
    assert_eq!(digest(&mut m), digest(&mut r));
}

// Regression tests of defects found by attacking the module (issue 8 and
// later): each reproduces an attack or an unlucky schedule that broke
// mutual exclusion or crashed the server before its fix.

/// Issue 8, defect 8: a replica never grants, releases or extends on its own, even
/// with replica-read-only no.
#[test]
fn a_writable_replica_refuses_lock_writes() {
    if common::skip_unless(common::Needs::OwnServer, "starts a replica beside it") {
        return;
    }
    let master = Server::start();
    let replica = Server::builder().config("replica-read-only", "no").start();
    replica.replicate_from(&master);
    let mut m = master.conn();
    acquire(&mut m, "k", "a", 60_000).unwrap();
    let _: () = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    let mut r = replica.conn();
    for cmd in [
        vec!["LOCK.ACQUIRE", "n", "b", "60000"],
        vec!["LOCK.ACQUIRE", "n", "b", "60000", "BLOCK", "10"],
        vec!["LOCK.RELEASE", "k", "a"],
        vec!["LOCK.EXTEND", "k", "a", "60000"],
    ] {
        let err = run_err(&mut r, &cmd);
        assert!(err.starts_with("READONLY"), "{cmd:?} -> {err}");
    }
    assert_eq!(holder(&mut r, "k").as_deref(), Some("a"));
    assert_eq!(fence(&mut r, "n"), None);
    assert_eq!(digest(&mut m), digest(&mut r));
}
