//! LOCK.OBSERVE: a key's leader at once, and observers told when it is no
//! longer the one they saw (a release, a new holder, a hand-off, a lease
//! that ended with no command touching the key), on a real server.

use redis_lock_testkit as common;

use common::*;
use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

/// `(fence, ttl)` of a LOCK.OBSERVE reply; None for nil.
type Seen = Option<(i64, i64)>;

fn observe(c: &mut Connection, key: &str, args: &[&str]) -> redis::RedisResult<Seen> {
    let reply: Option<HashMap<String, redis::Value>> =
        redis::cmd("LOCK.OBSERVE").arg(key).arg(args).query(c)?;
    let int = |v: &redis::Value| redis::from_redis_value::<i64>(v).unwrap();
    Ok(reply.map(|m| (int(&m["fence"]), int(&m["ttl"]))))
}

/// Observes `key` having seen `after`, on a connection of its own: the
/// thread answers what it was told and how long that took.
fn observer(
    s: &Server,
    key: &str,
    after: i64,
    block_ms: i64,
) -> thread::JoinHandle<(Seen, Duration)> {
    let mut c = s.conn();
    let key = key.to_string();
    thread::spawn(move || {
        let start = Instant::now();
        let seen = observe(
            &mut c,
            &key,
            &["AFTER", &after.to_string(), "BLOCK", &block_ms.to_string()],
        )
        .unwrap();
        (seen, start.elapsed())
    })
}

#[test]
fn the_leader_is_answered_at_once_or_nil_when_it_is_the_one_seen() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(observe(&mut c, "k", &[]).unwrap(), Some((0, -2)));
    assert_eq!(observe(&mut c, "k", &["AFTER", "0"]).unwrap(), None);
    let f = acquire(&mut c, "k", "a", 30_000).unwrap();
    let (fence, ttl) = observe(&mut c, "k", &[]).unwrap().unwrap();
    assert_eq!(fence, f);
    assert!(ttl > 29_000 && ttl <= 30_000, "{ttl}");
    // Seen free, or another holder: answered at once, with or without BLOCK.
    assert_eq!(
        observe(&mut c, "k", &["AFTER", "0", "BLOCK", "0"])
            .unwrap()
            .unwrap()
            .0,
        f
    );
    assert_eq!(observe(&mut c, "k", &["AFTER", "7"]).unwrap().unwrap().0, f);
    assert_eq!(
        observe(&mut c, "k", &["AFTER", &f.to_string()]).unwrap(),
        None
    );
    // Inside MULTI, BLOCK answers at once, as BLPOP does there.
    let (seen,): (Option<HashMap<String, i64>>,) = redis::pipe()
        .atomic()
        .cmd("LOCK.OBSERVE")
        .arg("k")
        .arg("AFTER")
        .arg(f)
        .arg("BLOCK")
        .arg(0)
        .query(&mut c)
        .unwrap();
    assert_eq!(seen, None);
}

#[test]
fn bad_arguments_and_other_types_are_refused() {
    let s = Server::start();
    let mut c = s.conn();
    for (args, wanted) in [
        (&["AFTER"][..], "AFTER needs"),
        (&["AFTER", "-1"][..], "invalid AFTER '-1'"),
        (&["AFTER", "x"][..], "invalid AFTER 'x'"),
        (&["BLOCK", "-3"][..], "timeout"),
        (&["AFTER", "1", "AFTER", "2"][..], "'AFTER'"),
        (&["NOW"][..], "'NOW'"),
        (&["AFTER", "7", "VALUE"][..], "VALUE needs a value"),
        (&["VALUE", "v"][..], "VALUE is the value seen"),
        (&["AFTER", "0", "VALUE", "v"][..], "VALUE is the value seen"),
        (&["AFTER", "7", "VALUE", "a", "VALUE", "b"][..], "'VALUE'"),
        (&["BLOCK", "0"][..], "BLOCK waits for a change"),
    ] {
        let err = observe(&mut c, "k", args).unwrap_err();
        assert!(error_text(&err).contains(wanted), "{args:?}: {err}");
    }
    let _: () = redis::cmd("SET").arg("s").arg("v").query(&mut c).unwrap();
    let err = observe(&mut c, "s", &[]).unwrap_err();
    assert!(error_text(&err).starts_with("WRONGTYPE"), "{err}");
}

#[test]
fn observers_are_told_of_a_release_a_new_holder_and_a_hand_off() {
    let s = Server::start();
    let mut c = s.conn();
    let f1 = acquire(&mut c, "k", "a", 60_000).unwrap();
    // Sixteen observers of one change: each is told once.
    let many: Vec<_> = (0..16).map(|_| observer(&s, "k", f1, 10_000)).collect();
    wait_blocked(&s, 16);
    assert_eq!(release(&mut c, "k", "a"), 1);
    for o in many {
        assert_eq!(o.join().unwrap().0, Some((0, -2)));
    }
    // Seen free: told of the next holder.
    let free = observer(&s, "k", 0, 10_000);
    wait_blocked(&s, 1);
    let f2 = acquire(&mut c, "k", "b", 60_000).unwrap();
    let (seen, _) = free.join().unwrap();
    assert_eq!(seen.unwrap().0, f2);
    assert!(f2 > f1);
    // A release that hands the lock to a waiter: told of the new holder,
    // never of the instant between.
    let waiter = RawConn::block_acquire(&s, "k", "c", 60_000, 0);
    wait_blocked(&s, 1);
    let watch = observer(&s, "k", f2, 10_000);
    wait_blocked(&s, 2);
    assert_eq!(release(&mut c, "k", "b"), 1);
    let (seen, _) = watch.join().unwrap();
    let f3 = fence(&mut c, "k").unwrap();
    assert!(f3 > f2);
    assert_eq!(seen.unwrap().0, f3);
    drop(waiter);
}

#[test]
fn a_lease_that_ends_is_told_at_its_end_with_no_command() {
    let s = Server::start();
    let mut c = s.conn();
    let f = acquire(&mut c, "k", "a", 400).unwrap();
    let o = observer(&s, "k", f, 10_000);
    let (seen, took) = o.join().unwrap();
    assert_eq!(seen, Some((0, -2)));
    // At the lease's end, not before; within the timer's precision after
    // it (a loaded machine: generous).
    assert!(took >= Duration::from_millis(250), "{took:?}");
    assert!(took < Duration::from_millis(3_000), "{took:?}");
    // A renewal keeps the leader: nobody is told.
    let f = acquire(&mut c, "k", "a", 300).unwrap();
    let o = observer(&s, "k", f, 1_000);
    wait_blocked(&s, 1);
    assert_eq!(extend(&mut c, "k", "a", 5_000), 1);
    let (seen, took) = o.join().unwrap();
    assert_eq!(seen, None, "timed out: the leader did not change");
    assert!(took >= Duration::from_millis(900), "{took:?}");
}

#[test]
fn an_observer_that_disconnects_or_times_out_leaves_nothing_behind() {
    let s = Server::start();
    let mut c = s.conn();
    let f = acquire(&mut c, "k", "a", 60_000).unwrap();
    let mut gone = RawConn::connect(&s);
    gone.send(&["LOCK.OBSERVE", "k", "AFTER", &f.to_string(), "BLOCK", "0"]);
    wait_blocked(&s, 1);
    assert_eq!(s.info_field("observers"), 1, "INFO lock counts it");
    assert_eq!(s.info_field("waiters"), 0, "an observer is no waiter");
    drop(gone);
    wait_blocked(&s, 0);
    let timed = observer(&s, "k", f, 100);
    assert_eq!(timed.join().unwrap().0, None);
    assert_eq!(blocked_clients(&s), 0);
    assert_eq!(s.info_field("observers"), 0);
    // The key's next change reaches nobody that left, and the server is
    // whole.
    assert_eq!(release(&mut c, "k", "a"), 1);
    assert_eq!(observe(&mut c, "k", &[]).unwrap(), Some((0, -2)));
}

#[test]
fn an_observer_on_a_replica_is_told_of_the_masters_changes() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.conn();
    let f = acquire(&mut m, "k", "a", 60_000).unwrap();
    master.wait_acknowledged(1, "scratch");
    let mut r = replica.conn();
    assert_eq!(observe(&mut r, "k", &[]).unwrap().unwrap().0, f);
    let o = observer(&replica, "k", f, 10_000);
    wait_blocked(&replica, 1);
    assert_eq!(release(&mut m, "k", "a"), 1);
    assert_eq!(o.join().unwrap().0, Some((0, -2)));
}

#[test]
fn a_del_or_flushall_tells_the_observers() {
    let s = Server::start();
    let mut c = s.conn();
    for wipe in ["DEL", "FLUSHALL"] {
        let f = acquire(&mut c, "k", "a", 60_000).unwrap();
        let o = observer(&s, "k", f, 10_000);
        wait_blocked(&s, 1);
        let mut cmd = redis::cmd(wipe);
        if wipe == "DEL" {
            cmd.arg("k");
        }
        let _: redis::Value = cmd.query(&mut c).unwrap();
        assert_eq!(o.join().unwrap().0, Some((0, -2)), "{wipe}");
    }
}

/// The monitoring user of docs/operations.md (read access to the keys,
/// `+lock.observe`) observes and waits; without read access to the key it
/// gets NOPERM and observes nothing.
#[test]
fn a_read_only_user_observes_and_one_without_the_key_is_refused() {
    let s = Server::start();
    let mut admin = s.conn();
    set_user(
        &mut admin,
        "monitor",
        &["%R~app:*", "+lock.observe", "+lock.info"],
    );
    let f = acquire(&mut admin, "app:k", "a", 60_000).unwrap();
    let mut m = login(&s, "monitor");
    assert_eq!(observe(&mut m, "app:k", &[]).unwrap().unwrap().0, f);
    let err = observe(&mut m, "other:k", &[]).unwrap_err();
    assert!(error_text(&err).starts_with("NOPERM"), "{err}");
    let waiting = thread::spawn(move || {
        observe(
            &mut m,
            "app:k",
            &["AFTER", &f.to_string(), "BLOCK", "10000"],
        )
        .unwrap()
    });
    wait_blocked(&s, 1);
    assert_eq!(release(&mut admin, "app:k", "a"), 1);
    assert_eq!(waiting.join().unwrap(), Some((0, -2)));
}

/// After a restart an observer resumes with AFTER the fence it saw: a
/// leader that changed while it was away is answered at once, one that
/// did not is waited for.
#[test]
fn an_observer_resumes_with_after_across_a_restart() {
    if common::skip_unless(common::Needs::OwnServer, "restarts its server") {
        return;
    }
    let mut s = Server::builder()
        .config("appendonly", "yes")
        .config("appendfsync", "always")
        .start();
    let f = acquire(&mut s.conn(), "k", "a", 60_000).unwrap();
    assert_eq!(observe(&mut s.conn(), "k", &[]).unwrap().unwrap().0, f);
    s.restart();
    // Unchanged: the observer waits again, and is told of the next leader.
    let o = observer(&s, "k", f, 10_000);
    wait_blocked(&s, 1);
    let mut c = s.conn();
    assert_eq!(release(&mut c, "k", "a"), 1);
    assert_eq!(o.join().unwrap().0, Some((0, -2)));
    let g = acquire(&mut c, "k", "b", 60_000).unwrap();
    assert!(g > f);
    s.restart();
    // Changed while it was away: answered at once.
    let mut c = s.conn();
    assert_eq!(
        observe(&mut c, "k", &["AFTER", &f.to_string(), "BLOCK", "0"])
            .unwrap()
            .unwrap()
            .0,
        g
    );
}

/// An observer blocked on a replica stays through its promotion (the
/// master died): it is told when the new master's state changes.
#[test]
fn an_observer_on_a_replica_is_told_after_the_replica_is_promoted() {
    let mut master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let f = acquire(&mut master.conn(), "k", "a", 60_000).unwrap();
    master.wait_acknowledged(1, "scratch");
    let o = observer(&replica, "k", f, 20_000);
    wait_blocked(&replica, 1);
    master.kill9();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica.conn())
        .unwrap();
    // The holder resigns on the new master: the observer hears of it.
    assert_eq!(release(&mut replica.conn(), "k", "a"), 1);
    assert_eq!(o.join().unwrap().0, Some((0, -2)));
}

/// An observer whose user loses read access to the key, or the command,
/// while it observes (ACL SETUSER) is told NOPERM at the next change, not
/// the change; an observer whose user keeps both is told the change.
#[test]
fn an_observer_that_loses_the_key_to_acl_is_refused_not_told() {
    let s = Server::start();
    let mut admin = s.conn();
    let rules = ["%R~app:*", "+lock.observe"];
    for user in ["keeps", "loses_key", "loses_command"] {
        set_user(&mut admin, user, &rules);
    }
    let f = acquire(&mut admin, "app:k", "holder", 60_000).unwrap();
    let watch = |user: &str| {
        let mut c = RawConn::connect(&s);
        c.send(&["AUTH", user, "pw"]);
        assert!(matches!(
            c.read_within(Duration::from_secs(5)),
            Some(Resp::Simple(_))
        ));
        c.send(&[
            "LOCK.OBSERVE",
            "app:k",
            "AFTER",
            &f.to_string(),
            "BLOCK",
            "0",
        ]);
        c
    };
    let mut observers: Vec<RawConn> = ["keeps", "loses_key", "loses_command"].map(watch).into();
    wait_blocked(&s, 3);
    set_user(&mut admin, "loses_key", &["%R~other:*", "+lock.observe"]);
    set_user(
        &mut admin,
        "loses_command",
        &["%R~app:*", "+@read", "-lock.observe"],
    );
    assert_eq!(release(&mut admin, "app:k", "holder"), 1);
    let told: Vec<Option<Resp>> = observers
        .iter_mut()
        .map(|c| c.read_within(Duration::from_secs(5)))
        .collect();
    assert!(matches!(&told[0], Some(Resp::Array(_))), "{told:?}");
    for refused in &told[1..] {
        assert!(
            matches!(refused, Some(Resp::Error(e)) if e.starts_with("NOPERM")),
            "{told:?}"
        );
    }
    assert_eq!(blocked_clients(&s), 0);
    assert_eq!(s.info_field("observers"), 0);
}
