//! The lease is the module's alone (issue 16): a lock key carries no Redis
//! expiry; the lease runs on the node's monotonic clock; the module
//! reclaims ended locks itself, wherever they went; what a user does to
//! the key with Redis's own commands is an administrative act, never a
//! second holder; `volatile-*` eviction never picks a lock.

use redis_lock_testkit as common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

fn exists(c: &mut Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(c).unwrap() == 1
}

/// Waits until the background sweep has reclaimed every ended lock.
fn wait_reclaimed(s: &Server, limit: Duration) {
    let start = Instant::now();
    while s.info_field("locks") > 0 {
        assert!(
            start.elapsed() < limit,
            "{} ended locks still in the keyspace after {limit:?}",
            s.info_field("locks")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_lock_key_has_no_redis_expiry() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "t", 60_000).unwrap();
    assert_eq!(
        pttl(&mut c, "k"),
        -1,
        "TTL shows no expiry: the lease is the module's"
    );
    assert_eq!(extend(&mut c, "k", "t", 90_000), 1);
    assert_eq!(pttl(&mut c, "k"), -1);
    let expires: String = redis::cmd("INFO").arg("keyspace").query(&mut c).unwrap();
    assert!(expires.contains("expires=0"), "{expires}");
}

/// Before: the module undid a user's PEXPIRE from its timer (and a slow
/// command in the same pipeline let Redis delete the key first). Now a
/// PEXPIRE on a lock key is an administrative delete at that time, like a
/// DEL then, and the module leaves it alone.
#[test]
fn pexpire_on_a_lock_is_an_administrative_delete_at_that_time() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "holder", 60_000).unwrap();
    let _: i64 = redis::cmd("PEXPIRE")
        .arg("k")
        .arg(400)
        .query(&mut c)
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(exists(&mut c, "k"), "held until the administrative delete");
    assert_eq!(acquire(&mut c, "k", "other", 1000), None);
    wait_until(Duration::from_secs(5), || !exists(&mut c, "k"));
    assert!(acquire(&mut c, "k", "other", 1000).is_some());
}

/// PERSIST on a lock key changes nothing: the lease still ends on time and
/// the module reclaims the key.
#[test]
fn persist_changes_nothing_and_the_ended_lock_is_reclaimed() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "t", 300).unwrap();
    let persisted: i64 = redis::cmd("PERSIST").arg("k").query(&mut c).unwrap();
    assert_eq!(persisted, 0, "there is no Redis expiry to remove");
    wait_reclaimed(&s, Duration::from_secs(5));
    assert!(!exists(&mut c, "k"));
}

/// Before: after PERSIST, a lock RENAMEd, MOVEd or SWAPDB'd away was never
/// reclaimed (PTTL -1, counted in lock_locks for ever).
#[test]
fn ended_locks_are_reclaimed_wherever_they_went() {
    let s = Server::start();
    let mut c = s.conn();
    for key in ["r", "m", "w"] {
        acquire(&mut c, key, "t", 400).unwrap();
    }
    let _: () = redis::pipe()
        .cmd("PERSIST")
        .arg("r")
        .ignore()
        .cmd("RENAME")
        .arg("r")
        .arg("renamed")
        .ignore()
        .cmd("MULTI")
        .ignore()
        .cmd("PERSIST")
        .arg("m")
        .ignore()
        .cmd("MOVE")
        .arg("m")
        .arg(1)
        .ignore()
        .cmd("EXEC")
        .ignore()
        .cmd("PERSIST")
        .arg("w")
        .ignore()
        .cmd("SWAPDB")
        .arg(0)
        .arg(2)
        .ignore()
        .query(&mut c)
        .unwrap();
    assert_eq!(s.info_field("locks"), 3);
    wait_reclaimed(&s, Duration::from_secs(5));
    for db in [0, 1, 2] {
        let _: () = redis::cmd("SELECT").arg(db).query(&mut c).unwrap();
        let n: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
        assert_eq!(n, 0, "db {db} still holds an ended lock");
    }
    assert!(s.info_field("expirations") >= 3);
}

/// Before: a lock SAVEd without its Redis expiry (PERSIST then SAVE in one
/// pipeline, before the module's timer could restore the expiry) came back
/// after a restart and was never reclaimed.
#[test]
fn an_ended_lock_saved_and_restarted_is_reclaimed() {
    if common::skip_unless(common::Needs::OwnServer, "restarts its server") {
        return;
    }
    let mut s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "t", 500).unwrap();
    // One pipeline: the server runs both in one event-loop iteration.
    let _: () = redis::pipe()
        .cmd("PERSIST")
        .arg("k")
        .ignore()
        .cmd("SAVE")
        .ignore()
        .query(&mut c)
        .unwrap();
    s.restart();
    let mut c = s.conn();
    wait_reclaimed(&s, Duration::from_secs(5));
    assert!(!exists(&mut c, "k"));
}

/// A lock written by a build that still gave lock keys a Redis expiry (an
/// RDB made by the previous build: `legacy:lock`, held by `legacy-holder`
/// until 2031, PTTL = its lease) loads, keeps its lease and holder, and
/// loses the Redis expiry: a renewal is never cut short by it.
#[test]
fn a_lock_with_a_legacy_redis_expiry_is_converted() {
    if common::skip_unless(common::Needs::OwnServer, "starts from an RDB file") {
        return;
    }
    // The node that wrote it allowed a lease until 2031; a node loading it
    // with the default lock.max-ttl-ms (a week) caps what is left at that.
    let mut s = Server::builder()
        .module_arg(
            "max-ttl-ms",
            &redis_lock_core::limits::MAX_DURATION_MS.to_string(),
        )
        .start();
    s.shutdown();
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/legacy-expiry.rdb");
    std::fs::copy(fixture, s.dir.join("dump.rdb")).unwrap();
    s.restart();
    let mut c = s.conn();
    assert_eq!(acquire(&mut c, "legacy:lock", "intruder", 1000), None);
    assert_eq!(extend(&mut c, "legacy:lock", "legacy-holder", 60_000), 1);
    assert_eq!(pttl(&mut c, "legacy:lock"), -1, "the legacy expiry is gone");
    assert_eq!(fence(&mut c, "legacy:lock"), Some(1_795_553_187_322_549));
    let plain: String = redis::cmd("GET").arg("plain:key").query(&mut c).unwrap();
    assert_eq!(plain, "v");
}

/// Before: under a volatile-* policy every grant was refused (every lock
/// had a TTL, so could be evicted). Now no lock has one: grant.
#[test]
fn volatile_policies_never_pick_a_lock_so_grants_go_on() {
    let s = Server::start();
    let mut c = s.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1gb")
        .query(&mut c)
        .unwrap();
    for policy in [
        "volatile-lru",
        "volatile-lfu",
        "volatile-ttl",
        "volatile-random",
    ] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(policy)
            .query(&mut c)
            .unwrap();
        assert!(acquire(&mut c, policy, "t", 60_000).is_some(), "{policy}");
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query(&mut c)
        .unwrap();
    let err = run_err(&mut c, &["LOCK.ACQUIRE", "x", "t", "1000"]);
    assert!(err.contains("maxmemory-policy can evict"), "{err}");
}

/// Before: a waiter queued before the policy became evicting was still
/// handed the lock. Now it is answered with the same error as a new grant.
#[test]
fn a_waiter_is_not_handed_a_lock_that_could_be_evicted() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "H", 60_000).unwrap();
    let mut w = RawConn::connect(&s);
    w.send(&["LOCK.ACQUIRE", "k", "W", "60000", "BLOCK", "5000"]);
    wait_until(Duration::from_secs(5), || s.info_field("waiters") == 1);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1gb")
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query(&mut c)
        .unwrap();
    assert_eq!(release(&mut c, "k", "H"), 1);
    let reply = w.read_within(Duration::from_secs(3));
    assert!(
        matches!(&reply, Some(Resp::Error(e)) if e.contains("maxmemory-policy can evict")),
        "{reply:?}"
    );
    assert!(!exists(&mut c, "k"));
}

/// Above maxmemory a queued waiter is answered OOM at its turn, as a new
/// ACQUIRE is (issue 22: it was handed the lock), while a waiter whose own
/// token holds the lock is renewed, as a holder's ACQUIRE is.
#[test]
fn above_maxmemory_a_waiter_gets_oom_like_a_new_acquire() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "H", 60_000).unwrap();
    let mut w = RawConn::connect(&s);
    w.send(&["LOCK.ACQUIRE", "k", "W", "60000", "BLOCK", "5000"]);
    wait_until(Duration::from_secs(5), || s.info_field("waiters") == 1);
    let mut own = RawConn::connect(&s);
    let set_maxmemory = |c: &mut Connection, v: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(v)
            .query(c)
            .unwrap();
    };
    set_maxmemory(&mut c, "1");
    let err = run_err(&mut c, &["LOCK.ACQUIRE", "j", "new", "1000"]);
    assert!(err.starts_with("OOM"), "{err}");
    // A hand-off and a direct grant are refused alike.
    assert_eq!(release(&mut c, "k", "H"), 1);
    let reply = w.read_within(Duration::from_secs(3));
    assert!(
        matches!(&reply, Some(Resp::Error(e)) if e.starts_with("OOM")),
        "{reply:?}"
    );
    assert!(!exists(&mut c, "k"));
    // A holder's own ACQUIRE, BLOCK or not, renews above maxmemory.
    set_maxmemory(&mut c, "0");
    let f = acquire(&mut c, "r", "R", 300).unwrap();
    set_maxmemory(&mut c, "1");
    own.send(&["LOCK.ACQUIRE", "r", "R", "60000", "BLOCK", "5000"]);
    assert_eq!(own.read_within(Duration::from_secs(3)), Some(Resp::Int(f)));
    assert_eq!(extend(&mut c, "r", "R", 60_000), 1);
    set_maxmemory(&mut c, "0");
}

/// No lease enters a node longer than its lock.max-ttl-ms (issue 22: a
/// RESTOREd lock kept its 1-hour lease on a node whose max-ttl was 1 s),
/// whether it comes from a RESTORE or from a restart that loads it.
#[test]
fn a_restored_or_loaded_lease_is_capped_at_max_ttl() {
    if common::skip_unless(common::Needs::OwnServer, "starts two servers") {
        return;
    }
    let source = Server::start();
    let mut src = source.conn();
    acquire(&mut src, "k", "t", 3_600_000).unwrap();
    let payload: Vec<u8> = redis::cmd("DUMP").arg("k").query(&mut src).unwrap();
    let mut target = Server::builder().module_arg("max-ttl-ms", "1000").start();
    let mut c = target.conn();
    restore(&mut c, "k", &payload).unwrap();
    let ttl = lock_info(&mut c, "k").expect("restored").ttl;
    assert!((1..=1000).contains(&ttl), "restored with {ttl} ms left");
    // A restart that loads a longer lease than the node now allows.
    restore(&mut c, "k2", &payload).unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-ttl-ms")
        .arg("604800000")
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("LOCK.EXTEND")
        .arg("k2")
        .arg("t")
        .arg(3_600_000)
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    target.set_module_arg("max-ttl-ms", "2000");
    target.restart();
    let ttl = lock_info(&mut target.conn(), "k2").expect("loaded").ttl;
    assert!((1..=2000).contains(&ttl), "loaded with {ttl} ms left");
}

/// An administrator's `PEXPIRE` equal to what is left of a lease is a
/// delete at that time, not an earlier build's expiry (issue 22: the
/// holder's next renewal took it for one and dropped it, replicated as
/// PERSIST, so the key was never deleted). Only a value loaded or
/// replicated in can carry an earlier build's expiry.
#[test]
fn an_administrators_expiry_at_the_lease_end_survives_a_renewal() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "t", 60_000).unwrap();
    let left = lock_info(&mut c, "k").unwrap().ttl;
    let _: i64 = redis::cmd("PEXPIRE")
        .arg("k")
        .arg(left)
        .query(&mut c)
        .unwrap();
    assert_eq!(extend(&mut c, "k", "t", 60_000), 1);
    assert!(
        acquire(&mut c, "k", "t", 60_000).is_some(),
        "a same-token renewal"
    );
    let pttl = pttl(&mut c, "k");
    assert!(pttl > 0, "the administrator's expiry was dropped: {pttl}");
}

/// A restart of a running server stops it first (issue 22: the old one
/// stayed up, with no parent, after the suite).
#[test]
fn restarting_a_running_server_leaves_no_second_one() {
    if common::skip_unless(common::Needs::LocalProcess, "reads the server's process") {
        return;
    }
    let mut s = Server::start();
    let (port, old) = (s.port, s.pid());
    s.restart();
    assert_eq!(s.port, port, "the same port: the old server let it go");
    assert_ne!(s.pid(), old);
    let state = std::fs::read_to_string(format!("/proc/{old}/stat")).unwrap_or_default();
    assert!(
        state.is_empty() || state.split_whitespace().nth(2) == Some("Z"),
        "the first server still runs: {state}"
    );
    assert!(s.is_running());
}

/// A restart whose port another server took while this one was down (tests
/// run in parallel and each picks a free port) moves to a new port: it
/// never talks to the stranger as if it were itself (CI on docker lost a
/// held lock that way: every query went to another test's empty server).
#[test]
fn a_restart_never_mistakes_another_server_on_its_port_for_itself() {
    if common::skip_unless(common::Needs::OwnServer, "restarts its server") {
        return;
    }
    let mut s = Server::builder().config("appendonly", "yes").start();
    let mut c = s.conn();
    let f = acquire(&mut c, "k", "a", 60_000).unwrap();
    let port = s.port;
    s.kill9();
    let stranger = Server::builder().port(port).start();
    assert_eq!(stranger.port, port);
    s.restart();
    assert_ne!(s.port, port, "the restart took the stranger for itself");
    let mut c = s.conn();
    assert_eq!(holder_and_fence(&mut c, "k"), Some(("a".into(), f)));
    assert_eq!(fence(&mut stranger.conn(), "k"), None);
}

// Regression tests of defects found by attacking the module (issue 8 and
// later): each reproduces an attack or an unlucky schedule that broke
// mutual exclusion or crashed the server before its fix.

/// Issue 8, defect 9: an eviction policy can evict held locks: new grants are
/// refused, with a warning and an INFO field, unless allowed.
#[test]
fn grants_are_refused_while_the_policy_can_evict_locks() {
    if common::skip_unless(common::Needs::OwnServer, "reads the server's log") {
        return;
    }
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "held", "a", 60_000).unwrap();
    assert_eq!(s.info_field("eviction_unsafe"), 0);
    for (name, value) in [("maxmemory", "100mb"), ("maxmemory-policy", "allkeys-lru")] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut c)
            .unwrap();
    }
    assert_eq!(s.info_field("eviction_unsafe"), 1);
    assert!(s.log().contains("allkeys-* maxmemory-policy"));
    let err = run_err(&mut c, &["LOCK.ACQUIRE", "new", "a", "1000"]);
    assert!(err.contains("maxmemory-policy"), "{err}");
    assert_eq!(fence(&mut c, "new"), None);
    assert!(
        acquire(&mut c, "held", "a", 60_000).is_some(),
        "renewal goes"
    );
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.allow-eviction")
        .arg("yes")
        .query(&mut c)
        .unwrap();
    assert!(acquire(&mut c, "new", "a", 1000).is_some());
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query(&mut c)
        .unwrap();
    assert_eq!(s.info_field("eviction_unsafe"), 0);
}

/// Issue 8, defect 11, as issue 16 settled it: the lease is the module's, and a
/// user's TTL on a lock key is an administrative delete, not the lease.
/// EXPIRE far ahead does not keep an ended lock; PERSIST changes nothing; a
/// RESTOREd lock keeps its lease and no TTL, or gets the TTL RESTORE gave
/// it as an administrative delete; one whose lease ended is reclaimed.
#[test]
fn expire_persist_and_restore_cannot_detach_the_key_from_its_lease() {
    let s = Server::start();
    let mut c = s.conn();
    let exists =
        |c: &mut Connection, key: &str| redis::cmd("EXISTS").arg(key).query::<i64>(c).unwrap() == 1;
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let persisted: i64 = redis::cmd("PERSIST").arg("k").query(&mut c).unwrap();
    assert_eq!(persisted, 0);
    assert_eq!(pttl(&mut c, "k"), -1);
    acquire(&mut c, "short", "a", 400).unwrap();
    let _: i64 = redis::cmd("EXPIRE")
        .arg("short")
        .arg(999_999)
        .query(&mut c)
        .unwrap();
    wait_until(Duration::from_secs(5), || !exists(&mut c, "short"));
    assert_eq!(holder(&mut c, "k").as_deref(), Some("a"));

    let payload: Vec<u8> = redis::cmd("DUMP").arg("k").query(&mut c).unwrap();
    restore(&mut c, "copy", &payload).unwrap();
    assert_eq!(pttl(&mut c, "copy"), -1);
    assert_eq!(holder(&mut c, "copy").as_deref(), Some("a"));
    let _: () = redis::cmd("RESTORE")
        .arg("timed")
        .arg(300)
        .arg(&payload)
        .query(&mut c)
        .unwrap();
    wait_until(Duration::from_secs(5), || !exists(&mut c, "timed"));
    // A lock whose lease ended by the time it is restored is reclaimed.
    acquire(&mut c, "brief", "a", 100).unwrap();
    let payload: Vec<u8> = redis::cmd("DUMP").arg("brief").query(&mut c).unwrap();
    sleep(Duration::from_millis(150));
    restore(&mut c, "ended", &payload).unwrap();
    wait_until(Duration::from_secs(5), || !exists(&mut c, "ended"));
}

/// Issue 8, defect 13 (one of the smaller ones).
#[test]
fn a_holders_renewal_works_above_maxmemory_but_new_grants_do_not() {
    let s = Server::start();
    let mut c = s.conn();
    let f = acquire(&mut c, "k", "a", 60_000).unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query(&mut c)
        .unwrap();
    assert_eq!(acquire(&mut c, "k", "a", 60_000), Some(f));
    assert_eq!(extend(&mut c, "k", "a", 60_000), 1);
    let err = run_err(&mut c, &["LOCK.ACQUIRE", "j", "b", "1000"]);
    assert!(err.starts_with("OOM"), "{err}");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query(&mut c)
        .unwrap();
}
