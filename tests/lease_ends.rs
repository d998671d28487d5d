//! Ended locks nobody touches leave the keyspace on time, whatever else it
//! holds (issue 35): the node files every lease by its end and its timer
//! reclaims the lock when that comes, where before only the sweep (a walk
//! of the whole keyspace at about a thousand keys a second) found it. Each
//! test puts 200,000 other keys beside its locks, so the sweep alone would
//! take minutes, and allows a lock two seconds past its lease's end (the
//! node's slot is 64 ms; the rest is for a loaded machine).

use redis_lock_testkit as common;

use std::time::{Duration, Instant};

use common::*;

const OTHER_KEYS: u64 = 200_000;
/// How long past its lease's end a lock may still be there.
const LATE: Duration = Duration::from_secs(2);

fn populated(s: &Server) {
    populate(&mut s.conn(), OTHER_KEYS);
}

/// A server among [`OTHER_KEYS`] other keys whose `k` is held for `ttl_ms`:
/// the server, a connection, and when the lease ends.
fn held_among_others(ttl_ms: i64) -> (Server, Connection, Instant) {
    let s = Server::start();
    populated(&s);
    let mut c = s.conn();
    acquire(&mut c, "k", "t", ttl_ms).unwrap();
    let ends = Instant::now() + Duration::from_millis(ttl_ms as u64);
    (s, c, ends)
}

fn exists(c: &mut Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(c).unwrap() == 1
}

/// Waits for `key` to leave (on `c`'s db), at most [`LATE`] past `ends`:
/// how long past it that was.
fn gone_after(c: &mut Connection, key: &str, ends: Instant) -> Duration {
    loop {
        if !exists(c, key) {
            return Instant::now().saturating_duration_since(ends);
        }
        let late = Instant::now().saturating_duration_since(ends);
        assert!(
            late < LATE,
            "{key} still there {late:?} after its lease ended"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_ended_lock_nobody_touches_leaves_on_time_among_many_keys() {
    let s = Server::start();
    populated(&s);
    let mut c = s.conn();
    let started = Instant::now();
    for i in 0..200 {
        acquire(&mut c, &format!("lock:{i}"), "t", 300 + i).unwrap();
    }
    let ends = started + Duration::from_millis(300 + 199);
    wait_until(Duration::from_secs(10), || {
        s.info_field("locks") == 0 || Instant::now() > ends + LATE
    });
    assert_eq!(
        s.info_field("locks"),
        0,
        "locks left {:?} after the last lease",
        LATE
    );
    assert_eq!(s.info_field("expirations"), 200);
    let n: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n as u64, OTHER_KEYS, "only the locks left");
}

#[test]
fn a_renewed_lock_stays_until_its_new_end_and_a_shortened_one_leaves_at_its_new_end() {
    let s = Server::start();
    populated(&s);
    let mut c = s.conn();
    let t0 = Instant::now();
    acquire(&mut c, "longer", "t", 300).unwrap();
    acquire(&mut c, "shorter", "t", 60_000).unwrap();
    assert_eq!(extend(&mut c, "longer", "t", 1_500), 1);
    assert_eq!(extend(&mut c, "shorter", "t", 300), 1);
    let shorter_ends = t0 + Duration::from_millis(300);
    gone_after(&mut c, "shorter", shorter_ends);
    // Filed where its first lease ended, found renewed there, filed again.
    std::thread::sleep(Duration::from_millis(900).saturating_sub(t0.elapsed()));
    assert!(
        exists(&mut c, "longer"),
        "taken before its renewed lease ended"
    );
    assert_eq!(acquire(&mut c, "longer", "other", 1000), None);
    gone_after(&mut c, "longer", t0 + Duration::from_millis(1_500));
}

#[test]
fn a_lock_saved_and_loaded_again_leaves_on_time() {
    if common::skip_unless(common::Needs::OwnServer, "restarts its server") {
        return;
    }
    let (mut s, mut c, ends) = held_among_others(2_500);
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    s.restart();
    let mut c = s.conn();
    assert!(exists(&mut c, "k"), "its lease had not ended");
    gone_after(&mut c, "k", ends);
}

#[test]
fn a_restored_lock_leaves_on_time() {
    let (_s, mut c, ends) = held_among_others(1_000);
    let dump: Vec<u8> = redis::cmd("DUMP").arg("k").query(&mut c).unwrap();
    let _: () = redis::cmd("DEL").arg("k").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("copy")
        .arg(0)
        .arg(dump)
        .query(&mut c)
        .unwrap();
    gone_after(&mut c, "copy", ends);
}

#[test]
fn a_lock_in_a_swapped_db_leaves_on_time() {
    let (_s, mut c, ends) = held_among_others(500);
    let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut c).unwrap();
    let _: () = redis::cmd("SELECT").arg(1).query(&mut c).unwrap();
    assert!(exists(&mut c, "k"));
    gone_after(&mut c, "k", ends);
}

/// A replica files the locks its master sends it and prunes them; once
/// promoted, it reclaims them on time itself (its master is gone).
#[test]
fn a_promoted_replica_reclaims_its_masters_locks_on_time() {
    if common::skip_unless(common::Needs::OwnServer, "kills its master") {
        return;
    }
    let mut master = Server::start();
    populated(&master);
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut c = master.conn();
    acquire(&mut c, "k", "t", 2_000).unwrap();
    let ends = Instant::now() + Duration::from_millis(2_000);
    let _: i64 = redis::cmd("WAIT").arg(1).arg(2_000).query(&mut c).unwrap();
    master.kill9();
    let mut r = replica.conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut r)
        .unwrap();
    assert!(exists(&mut r, "k"), "the grant reached the replica");
    gone_after(&mut r, "k", ends);
}
