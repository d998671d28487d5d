//! A holder's public value (`LOCK.ACQUIRE ... VALUE v`): stored with the
//! grant, shown to every reader (the token only to writers), changed by a
//! same-token renewal (a proclaim, which observers are told of), carried by
//! a hand-off, and kept by persistence, the AOF, DUMP/RESTORE and
//! replication, on a real server.

use redis_lock_testkit as common;

use common::*;
use std::collections::HashMap;
use std::thread;
use std::time::Duration;

/// `(fence, value)` of a LOCK.OBSERVE reply; None for nil.
type Seen = Option<(i64, Option<String>)>;

fn observe(c: &mut Connection, key: &str, args: &[&str]) -> redis::RedisResult<Seen> {
    let reply: Option<HashMap<String, redis::Value>> =
        redis::cmd("LOCK.OBSERVE").arg(key).arg(args).query(c)?;
    Ok(reply.map(|m| {
        let fence = redis::from_redis_value(&m["fence"]).unwrap();
        (fence, redis::from_redis_value(&m["value"]).unwrap())
    }))
}

fn campaign(c: &mut Connection, key: &str, token: &str, value: &str) -> Option<i64> {
    redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg(token)
        .arg(60_000)
        .arg("VALUE")
        .arg(value)
        .query(c)
        .unwrap()
}

/// LOCK.INFO as a map of its top-level fields.
fn info(c: &mut Connection, key: &str) -> HashMap<String, redis::Value> {
    redis::cmd("LOCK.INFO").arg(key).query(c).unwrap()
}

fn text(v: &redis::Value) -> Option<String> {
    redis::from_redis_value(v).unwrap()
}

fn leader(s: &Server, key: &str) -> Seen {
    observe(&mut s.conn(), key, &[]).unwrap()
}

#[test]
fn the_value_is_shown_to_readers_and_the_token_only_to_writers() {
    let s = Server::start();
    let mut admin = s.conn();
    let f = campaign(&mut admin, "app:k", "secret", "10.0.0.7:6379").unwrap();
    assert_eq!(leader(&s, "app:k"), Some((f, Some("10.0.0.7:6379".into()))));
    let all = info(&mut admin, "app:k");
    assert_eq!(text(&all["token"]).as_deref(), Some("secret"));
    assert_eq!(text(&all["value"]).as_deref(), Some("10.0.0.7:6379"));
    set_user(
        &mut admin,
        "monitor",
        &["%R~app:*", "+lock.info", "+lock.observe"],
    );
    let mut m = login(&s, "monitor");
    let seen = info(&mut m, "app:k");
    assert_eq!(text(&seen["token"]), None, "the token is a credential");
    assert_eq!(text(&seen["value"]).as_deref(), Some("10.0.0.7:6379"));
    assert_eq!(
        observe(&mut m, "app:k", &[]).unwrap(),
        Some((f, Some("10.0.0.7:6379".into())))
    );
    // Without a value: nil, in LOCK.INFO and LOCK.OBSERVE alike.
    acquire(&mut admin, "app:plain", "t", 60_000).unwrap();
    assert_eq!(text(&info(&mut admin, "app:plain")["value"]), None);
    assert_eq!(leader(&s, "app:plain").unwrap().1, None);
}

#[test]
fn a_renewal_with_a_value_proclaims_it_and_observers_are_told() {
    let s = Server::start();
    let mut c = s.conn();
    let f = campaign(&mut c, "k", "a", "v1").unwrap();
    let mut o = s.conn();
    let waiting = thread::spawn(move || {
        observe(&mut o, "k", &["AFTER", &f.to_string(), "BLOCK", "10000"]).unwrap()
    });
    wait_blocked(&s, 1);
    // The same token: the same fence, a new value; the observer hears it.
    assert_eq!(campaign(&mut c, "k", "a", "v1b"), Some(f));
    assert_eq!(waiting.join().unwrap(), Some((f, Some("v1b".into()))));
    // LOCK.EXTEND ... VALUE proclaims too (it never grants: a holder that
    // lost the lock cannot take it back by proclaiming).
    let mut o = s.conn();
    let waiting = thread::spawn(move || {
        observe(&mut o, "k", &["AFTER", &f.to_string(), "BLOCK", "10000"]).unwrap()
    });
    wait_blocked(&s, 1);
    let extended: i64 = redis::cmd("LOCK.EXTEND")
        .arg(&["k", "a", "60000", "VALUE", "v2"])
        .query(&mut c)
        .unwrap();
    assert_eq!(extended, 1);
    assert_eq!(waiting.join().unwrap(), Some((f, Some("v2".into()))));
    let not_held: i64 = redis::cmd("LOCK.EXTEND")
        .arg(&["k", "b", "60000", "VALUE", "v9"])
        .query(&mut c)
        .unwrap();
    assert_eq!(not_held, 0);
    // A renewal without VALUE, and LOCK.EXTEND, keep it.
    assert_eq!(acquire(&mut c, "k", "a", 60_000), Some(f));
    assert_eq!(extend(&mut c, "k", "a", 60_000), 1);
    assert_eq!(leader(&s, "k"), Some((f, Some("v2".into()))));
    // The same value again tells nobody: an observer waits on.
    let mut o = s.conn();
    let waiting = thread::spawn(move || {
        observe(&mut o, "k", &["AFTER", &f.to_string(), "BLOCK", "300"]).unwrap()
    });
    wait_blocked(&s, 1);
    assert_eq!(campaign(&mut c, "k", "a", "v2"), Some(f));
    assert_eq!(waiting.join().unwrap(), None, "timed out: nothing changed");
    // Another token cannot change it.
    assert_eq!(campaign(&mut c, "k", "b", "v3"), None);
    assert_eq!(leader(&s, "k"), Some((f, Some("v2".into()))));
}

/// `AFTER fence VALUE v` names what the follower saw: a proclaim made
/// between one answer and its next call is answered at once (before, that
/// call named the same fence and waited on); the value it names as the
/// holder's now waits, and is told of the next proclaim.
#[test]
fn after_with_the_value_seen_is_answered_a_proclaim_made_meanwhile() {
    let s = Server::start();
    let mut c = s.conn();
    let f = campaign(&mut c, "k", "a", "v1").unwrap();
    assert_eq!(leader(&s, "k"), Some((f, Some("v1".into()))));
    // The proclaim the follower has not seen yet.
    assert_eq!(campaign(&mut c, "k", "a", "v2"), Some(f));
    let fence = f.to_string();
    let at_once = observe(&mut c, "k", &["AFTER", &fence, "VALUE", "v1", "BLOCK", "0"]);
    assert_eq!(at_once.unwrap(), Some((f, Some("v2".into()))));
    // Seen with no value (an empty VALUE): v2 differs from that too.
    let seen = observe(&mut c, "k", &["AFTER", &fence, "VALUE", "", "BLOCK", "0"]);
    assert_eq!(
        seen.unwrap(),
        Some((f, Some("v2".into()))),
        "seen with none"
    );
    let still = observe(&mut c, "k", &["AFTER", &fence, "VALUE", "v2"]);
    assert_eq!(still.unwrap(), None, "what it saw is the state now: nil");
    let mut o = s.conn();
    let waiting = thread::spawn(move || {
        observe(
            &mut o,
            "k",
            &["AFTER", &f.to_string(), "VALUE", "v2", "BLOCK", "10000"],
        )
        .unwrap()
    });
    wait_blocked(&s, 1);
    assert_eq!(campaign(&mut c, "k", "a", "v3"), Some(f));
    assert_eq!(waiting.join().unwrap(), Some((f, Some("v3".into()))));
}

/// A proclaim made on the master reaches an observer blocked on its
/// replica (the replica applies the master's LOCK._SET: the same fence, a
/// new value). Before, only a proclaim made by a command on the observed
/// node itself was told; the replica's observer timed out.
#[test]
fn an_observer_on_a_replica_is_told_of_the_masters_proclaim() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.conn();
    let f = campaign(&mut m, "k", "a", "v1").unwrap();
    master.wait_acknowledged(1, "scratch");
    assert_eq!(leader(&replica, "k"), Some((f, Some("v1".into()))));
    let mut o = replica.conn();
    let waiting = thread::spawn(move || {
        observe(&mut o, "k", &["AFTER", &f.to_string(), "BLOCK", "10000"]).unwrap()
    });
    wait_blocked(&replica, 1);
    let extended: i64 = redis::cmd("LOCK.EXTEND")
        .arg(&["k", "a", "60000", "VALUE", "v2"])
        .query(&mut m)
        .unwrap();
    assert_eq!(extended, 1);
    assert_eq!(waiting.join().unwrap(), Some((f, Some("v2".into()))));
    // A renewal without a new value tells the replica's observers nothing.
    let mut o = replica.conn();
    let waiting = thread::spawn(move || {
        observe(&mut o, "k", &["AFTER", &f.to_string(), "BLOCK", "500"]).unwrap()
    });
    wait_blocked(&replica, 1);
    assert_eq!(extend(&mut m, "k", "a", 60_000), 1);
    assert_eq!(waiting.join().unwrap(), None, "timed out: nothing changed");
}

#[test]
fn a_waiter_takes_the_lock_with_its_value() {
    let s = Server::start();
    let mut c = s.conn();
    let f = campaign(&mut c, "k", "a", "first").unwrap();
    let mut w = s.conn();
    let next = thread::spawn(move || {
        redis::cmd("LOCK.ACQUIRE")
            .arg("k")
            .arg("b")
            .arg(60_000)
            .arg("BLOCK")
            .arg(0)
            .arg("VALUE")
            .arg("second")
            .query::<Option<i64>>(&mut w)
            .unwrap()
    });
    wait_blocked(&s, 1);
    assert_eq!(release(&mut c, "k", "a"), 1);
    let g = next.join().unwrap().unwrap();
    assert!(g > f);
    assert_eq!(leader(&s, "k"), Some((g, Some("second".into()))));
}

#[test]
fn bad_values_are_refused_and_change_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let run = |c: &mut Connection, args: &[&str]| -> Result<Option<i64>, String> {
        redis::cmd("LOCK.ACQUIRE")
            .arg(args)
            .query(c)
            .map_err(|e| error_text(&e))
    };
    let err = run(&mut c, &["k", "a", "1000", "VALUE"]).unwrap_err();
    assert!(err.contains("VALUE needs a value"), "{err}");
    let err = run(&mut c, &["k", "a", "1000", "SHARED", "VALUE", "v"]).unwrap_err();
    assert!(err.contains("not with SHARED"), "{err}");
    let long = "x".repeat(1025);
    let err = run(&mut c, &["k", "a", "1000", "VALUE", &long]).unwrap_err();
    assert!(err.contains("lock.max-value-len"), "{err}");
    let huge = "x".repeat(16 * 1024 + 1);
    assert!(run(&mut c, &["k", "a", "1000", "VALUE", &huge]).is_err());
    assert_eq!(leader(&s, "k"), Some((0, None)), "nothing was granted");
    // The option bounds renewals too: a holder's proclaim over it is
    // refused and its value stays.
    let f = campaign(&mut c, "k", "a", "short").unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-value-len")
        .arg(4)
        .query(&mut c)
        .unwrap();
    let err = run(&mut c, &["k", "a", "60000", "VALUE", "longer"]).unwrap_err();
    assert!(err.contains("6 bytes, above the limit of 4"), "{err}");
    assert_eq!(leader(&s, "k"), Some((f, Some("short".into()))));
}

#[test]
fn the_value_survives_restarts_rewrites_dump_and_replication() {
    let mut s = Server::builder().config("appendonly", "yes").start();
    let replica = Server::start();
    replica.replicate_from(&s);
    let mut c = s.conn();
    let f = campaign(&mut c, "k", "a", "node-1").unwrap();
    let g = acquire(&mut c, "plain", "t", 60_000).unwrap();
    s.wait_acknowledged(1, "scratch");
    assert_eq!(leader(&replica, "k"), Some((f, Some("node-1".into()))));
    assert_eq!(leader(&replica, "plain"), Some((g, None)));
    // A proclaim replicates too.
    assert_eq!(campaign(&mut c, "k", "a", "node-1b"), Some(f));
    s.wait_acknowledged(1, "scratch");
    assert_eq!(leader(&replica, "k"), Some((f, Some("node-1b".into()))));
    // DUMP/RESTORE under another name.
    let dump: Vec<u8> = redis::cmd("DUMP").arg("k").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("k2")
        .arg(0)
        .arg(dump)
        .query(&mut c)
        .unwrap();
    assert_eq!(leader(&s, "k2"), Some((f, Some("node-1b".into()))));
    // The AOF as written (LOCK._SET with the value), then rewritten.
    drop(c);
    s.restart();
    assert_eq!(leader(&s, "k"), Some((f, Some("node-1b".into()))));
    let mut c = s.conn();
    let _: String = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
    wait_until(Duration::from_secs(20), || {
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query(&mut s.conn())
            .unwrap();
        info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0")
    });
    drop(c);
    s.restart();
    assert_eq!(leader(&s, "k"), Some((f, Some("node-1b".into()))));
    assert_eq!(leader(&s, "plain"), Some((g, None)));
    // An RDB alone.
    s.set_config("appendonly", "no");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg("no")
        .query(&mut s.conn())
        .unwrap();
    let _: () = redis::cmd("SAVE").query(&mut s.conn()).unwrap();
    s.restart();
    assert_eq!(leader(&s, "k"), Some((f, Some("node-1b".into()))));
    assert_eq!(leader(&s, "k2"), Some((f, Some("node-1b".into()))));
}
