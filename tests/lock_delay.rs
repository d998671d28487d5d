//! `lock.lock-delay-ms`: after a lease ends without a release (its holder
//! died or stalled), the key grants nothing for that long, so writes the
//! stalled holder had in flight drain before the next holder starts.
//! On a shared key the ended holder keeps its place for the delay: what is
//! compatible with it is granted, a writer and an over-limit holder wait.
//! Waiters keep their place and are served after it; a release, a delete
//! or FLUSHALL does not start it; the option changes apply to keys already
//! held back. Off (0) by default.

use redis_lock_testkit as common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

fn config_set(c: &mut Connection, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.lock-delay-ms")
        .arg(value)
        .query(c)
        .unwrap();
}

fn waiters(s: &Server) -> i64 {
    s.info_field("waiters")
}

#[test]
fn a_lease_that_ends_unreleased_holds_the_key_back_for_the_delay() {
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, "600");
    // The server's deadline is at least `ended` (the request left after
    // `sent`), so before `ended` + 500 ms the delay is surely running.
    let sent = Instant::now();
    let first = acquire(&mut c, "job", "a", 100).unwrap();
    let ended = sent + Duration::from_millis(100);
    // Ended (as the server sees it): nobody holds it, nobody is granted it.
    wait_until(Duration::from_secs(5), || fence(&mut c, "job").is_none());
    assert_eq!(extend(&mut c, "job", "a", 1000), 0, "never revived");
    if Instant::now() < ended + Duration::from_millis(500) {
        assert_eq!(acquire(&mut c, "job", "b", 1000), None, "held back");
        assert_eq!(acquire(&mut c, "job", "a", 1000), None, "its own token too");
    }
    // After the delay it is granted, above every earlier fence.
    wait_until(Duration::from_secs(10), || {
        acquire(&mut c, "job", "b", 1000).is_some()
    });
    // (Less the one ms the server's whole-ms clock may start the lease
    // before `ended`.)
    assert!(Instant::now() + Duration::from_millis(1) >= ended + Duration::from_millis(600));
    assert!(fence(&mut c, "job").unwrap() > first);
}

#[test]
fn a_waiter_keeps_its_place_and_is_served_after_the_delay() {
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, "700");
    // Measured from before the request: the server's lease starts after.
    let sent = Instant::now();
    acquire(&mut c, "job", "a", 100).unwrap();
    let ended = sent + Duration::from_millis(100);
    let mut waiter = RawConn::block_acquire(&s, "job", "w", 10_000, 20_000);
    wait_until(Duration::from_secs(5), || waiters(&s) == 1);
    // Still waiting once the lease has ended, within the delay.
    wait_until(Duration::from_secs(5), || {
        Instant::now() > ended + Duration::from_millis(50)
    });
    if Instant::now() < ended + Duration::from_millis(600) {
        assert_eq!(waiters(&s), 1, "not granted during the delay");
        assert_eq!(fence(&mut c, "job"), None);
    }
    let reply = waiter.read_within(Duration::from_secs(10));
    assert!(matches!(reply, Some(Resp::Int(_))), "{reply:?}");
    assert!(Instant::now() + Duration::from_millis(1) >= ended + Duration::from_millis(700));
    assert_eq!(
        holder_and_fence(&mut c, "job").map(|(t, _)| t),
        Some("w".into())
    );
}

#[test]
fn a_release_a_delete_or_flushall_starts_no_delay() {
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, "3600000");
    acquire(&mut c, "r", "a", 60_000).unwrap();
    assert_eq!(release(&mut c, "r", "a"), 1);
    assert!(acquire(&mut c, "r", "b", 1000).is_some(), "after a release");
    acquire(&mut c, "d", "a", 60_000).unwrap();
    let _: i64 = redis::cmd("DEL").arg("d").query(&mut c).unwrap();
    assert!(acquire(&mut c, "d", "b", 1000).is_some(), "after DEL");
    acquire(&mut c, "f", "a", 60_000).unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    assert!(acquire(&mut c, "f", "b", 1000).is_some(), "after FLUSHALL");
}

/// A config change while a key is held back and a client waits: lowering
/// the delay to 0 hands the key on at once.
#[test]
fn lowering_the_delay_hands_a_held_back_key_on() {
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, "3600000");
    acquire(&mut c, "job", "a", 50).unwrap();
    sleep(Duration::from_millis(100));
    let mut waiter = RawConn::block_acquire(&s, "job", "w", 10_000, 30_000);
    wait_until(Duration::from_secs(5), || waiters(&s) == 1);
    assert_eq!(waiter.read_within(Duration::from_millis(300)), None);
    config_set(&mut c, "0");
    let reply = waiter.read_within(Duration::from_secs(10));
    assert!(matches!(reply, Some(Resp::Int(_))), "{reply:?}");
    // The held-back value was reclaimed by the hand-off: one lock, the
    // waiter's.
    assert_eq!(
        holder_and_fence(&mut c, "job").map(|(t, _)| t),
        Some("w".into())
    );
}

/// Off by default: a lease that ended is granted again at once.
#[test]
fn without_the_option_an_ended_lease_is_granted_at_once() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "job", "a", 30).unwrap();
    sleep(Duration::from_millis(60));
    assert!(acquire(&mut c, "job", "b", 1000).is_some());
}

fn acquire_shared(
    c: &mut Connection,
    key: &str,
    token: &str,
    ttl: i64,
    limit: Option<i64>,
) -> Option<i64> {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(token).arg(ttl).arg("SHARED");
    if let Some(n) = limit {
        cmd.arg("LIMIT").arg(n);
    }
    cmd.query(c).unwrap()
}

/// On a shared key the ended holder keeps its place for the delay, as if
/// it still held: what is compatible with it is granted (another reader
/// beside an ended reader), what is not waits (a writer), and a
/// semaphore's permit stays taken (a LIMIT 1 key grants no second
/// holder). Readers do not conflict with a stalled reader's writes in
/// flight; a writer and an over-limit holder would.
#[test]
fn a_shared_holder_that_ends_unreleased_keeps_its_place_for_the_delay() {
    let s = Server::start();
    let v = s.version();
    let mut c = s.conn();
    config_set(&mut c, "2000");
    // A reader and a permit end unreleased.
    let sent = Instant::now();
    acquire_shared(&mut c, "report", "r1", 100, None).unwrap();
    acquire_shared(&mut c, "sem", "p1", 100, Some(1)).unwrap();
    wait_until(Duration::from_secs(5), || fence(&mut c, "report").is_none());
    // (A few commands take far less than the delay, even on a loaded
    // machine: the checks below all fall inside it.)
    let delay_runs = || sent.elapsed() < Duration::from_millis(100 + 1900);
    // A writer: held back by the ended reader alone.
    assert_eq!(acquire(&mut c, "report", "w", 60_000), None, "{v}");
    // The permit stays taken.
    let p2 = acquire_shared(&mut c, "sem", "p2", 60_000, Some(1));
    assert_eq!(p2, None, "{v}");
    // Another reader: granted at once, beside the ended one.
    let r2 = acquire_shared(&mut c, "report", "r2", 60_000, None);
    assert!(r2.is_some(), "{v}");
    release(&mut c, "report", "r2");
    // The writer still waits for the ended reader's place.
    assert_eq!(acquire(&mut c, "report", "w", 60_000), None, "{v}");
    assert!(delay_runs(), "{v}: too slow to judge");
    // The ended reader's own token is a new reader like any other.
    let again = acquire_shared(&mut c, "report", "r1", 60_000, None);
    assert!(again.is_some(), "{v}");
    release(&mut c, "report", "r1");
    // After the delay: the second permit is granted, and the writer.
    sleep(Duration::from_millis(2200).saturating_sub(sent.elapsed()));
    let p2 = acquire_shared(&mut c, "sem", "p2", 60_000, Some(1));
    assert!(p2.is_some(), "{v}");
    assert!(acquire(&mut c, "report", "w", 60_000).is_some(), "{v}");
}
