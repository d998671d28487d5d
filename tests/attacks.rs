//! Regression tests for the defects found by attacking the module (issue 8):
//! each one reproduces an attack or an unlucky schedule that broke mutual
//! exclusion or crashed the server before its fix.

use redis_lock_testkit as common;

use std::thread::sleep;
use std::time::Duration;

use common::*;

fn alive(s: &Server) {
    let pong: String = redis::cmd("PING").query(&mut s.conn()).unwrap();
    assert_eq!(pong, "PONG", "the server is up; log:\n{}", s.log());
}

fn block_on(s: &Server, key: &str, token: &str, ttl: i64, timeout: i64) -> RawConn {
    RawConn::block_acquire(s, key, token, ttl, timeout)
}

/// The id of the oldest client blocked in LOCK.ACQUIRE.
fn first_blocked_client(c: &mut Connection) -> String {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(c).unwrap();
    list.lines()
        .find(|l| l.contains("cmd=lock.acquire") && l.contains("flags=b"))
        .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")))
        .unwrap()
        .to_string()
}

/// Waits until `n` clients are blocked on the server.
fn wait_blocked(s: &Server, n: i64) {
    let mut c = s.conn();
    wait_until(Duration::from_secs(10), || {
        let info: String = redis::cmd("INFO").arg("clients").query(&mut c).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("blocked_clients:"))
            .map(|v| v.trim().parse::<i64>().unwrap())
            == Some(n)
    });
}

/// Defect 1: a waiter that timed out on K1 left its (reused) handle address
/// in K1's line; D, waiting on K2, was then granted K1.
#[test]
fn a_hand_off_never_grants_one_keys_lock_to_a_waiter_on_another_key() {
    let s = Server::start();
    let mut c = s.conn();
    assert!(acquire(&mut c, "K1", "A", 60_000).is_some());
    assert!(acquire(&mut c, "K2", "E", 60_000).is_some());
    let mut b = block_on(&s, "K1", "B", 60_000, 50);
    let mut cw = block_on(&s, "K1", "C", 60_000, 3000);
    assert_eq!(b.read(), Resp::Nil, "B times out");
    let mut d = block_on(&s, "K2", "D", 60_000, 3000);
    wait_blocked(&s, 2);
    assert_eq!(release(&mut c, "K1", "A"), 1);
    assert!(
        matches!(cw.read(), Resp::Int(_)),
        "C, first in line, gets K1"
    );
    assert_eq!(holder(&mut c, "K1").as_deref(), Some("C"));
    assert_eq!(holder(&mut c, "K2").as_deref(), Some("E"));
    assert_eq!(
        d.read_within(Duration::from_millis(300)),
        None,
        "D waits on"
    );
    assert_eq!(lock_info(&mut c, "K2").unwrap().waiters, 1);
}

/// A DUMP payload of a lock, and where its fence's 8 big-endian bytes are.
fn dump_with_fence(c: &mut Connection, key: &str) -> (Vec<u8>, usize) {
    let fence = fence(c, key).unwrap();
    let payload: Vec<u8> = redis::cmd("DUMP").arg(key).query(c).unwrap();
    let needle = fence.to_be_bytes();
    let at = payload
        .windows(8)
        .position(|w| w == needle)
        .expect("the fence is saved as a 64-bit length");
    (payload, at)
}

fn restore(c: &mut Connection, key: &str, payload: &[u8]) -> redis::RedisResult<Value> {
    redis::cmd("RESTORE")
        .arg(key)
        .arg(0)
        .arg(payload)
        .arg("REPLACE")
        .query(c)
}

/// Defects 2 and 3: damaged RESTORE payloads are refused with an error, the
/// server stays up, and a refused payload leaves the fence mark alone.
#[test]
fn damaged_restore_payloads_are_refused_and_change_nothing() {
    if common::skip_unless(common::Needs::OwnServer, "reads the server's log") {
        return;
    }
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "holder-token", 60_000).unwrap();
    let (payload, fence_at) = dump_with_fence(&mut c, "k");
    let _: () = redis::cmd("DEBUG")
        .arg("SET-SKIP-CHECKSUM-VALIDATION")
        .arg(1)
        .query(&mut c)
        .unwrap();
    let hwm = s.info_field("fence_hwm");
    // Every truncation (the RDB version and checksum trail the value).
    for len in 1..payload.len() - 10 {
        assert!(
            restore(&mut c, "t", &payload[..len]).is_err(),
            "a payload cut at {len} bytes is refused"
        );
    }
    // A token length far beyond the payload.
    let token_len_at = payload
        .windows(12)
        .position(|w| w == b"holder-token")
        .unwrap()
        - 1;
    let mut long = payload.clone();
    long[token_len_at] = 0x80; // a 32-bit length follows
    long.splice(token_len_at + 1..token_len_at + 1, [0x7f, 0xff, 0xff, 0xff]);
    assert!(restore(&mut c, "t", &long).is_err());
    // A fence of i64::MAX, and of 0.
    for bad in [i64::MAX, 0] {
        let mut p = payload.clone();
        p[fence_at..fence_at + 8].copy_from_slice(&bad.to_be_bytes());
        let err = restore(&mut c, "t", &p).unwrap_err();
        assert!(error_text(&err).contains("Bad data format"), "{err}");
    }
    alive(&s);
    assert_eq!(s.info_field("fence_hwm"), hwm, "the mark is unchanged");
    let exists: i64 = redis::cmd("EXISTS").arg("t").query(&mut c).unwrap();
    assert_eq!(exists, 0);
    assert!(s.log().contains("refusing to load a lock value"));
    // Grants go on.
    let next = acquire(&mut c, "n", "x", 1000).unwrap();
    assert!(next > hwm && next < 1 << 62);
    // The valid payload restores, with its fence.
    restore(&mut c, "r", &payload).unwrap();
    assert_eq!(holder(&mut c, "r").as_deref(), Some("holder-token"));
}

/// Defect 4: a huge BLOCK timeout left a phantom waiter (Valkey), and a huge
/// lease overflowed the timer arithmetic.
#[test]
fn huge_leases_and_timeouts_are_refused_without_leaving_a_waiter() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "H", 1000).unwrap();
    let err = run_err(
        &mut c,
        &[
            "LOCK.ACQUIRE",
            "k",
            "W",
            "5000",
            "BLOCK",
            "9223372036854775807",
        ],
    );
    assert!(err.contains("timeout-ms"), "{err}");
    assert_eq!(s.info_field("waiters"), 0);
    let err = run_err(&mut c, &["LOCK.ACQUIRE", "j", "a", "9300000000000000"]);
    assert!(err.contains("max-ttl-ms"), "{err}");
    assert_eq!(fence(&mut c, "j"), None);
    // The lock frees with nobody waiting: no crash.
    sleep(Duration::from_millis(1100));
    assert!(acquire(&mut c, "k", "other", 1000).is_some());
    // max-ttl-ms is an option.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-ttl-ms")
        .arg(500)
        .query(&mut c)
        .unwrap();
    let err = run_err(&mut c, &["LOCK.ACQUIRE", "m", "a", "501"]);
    assert!(err.contains("500"), "{err}");
    assert!(acquire(&mut c, "m", "a", 500).is_some());
    alive(&s);
}

/// Defect 5: a lease that ended during CLIENT PAUSE WRITE with a waiter
/// queued crashed Redis 7.0 (or lost the grant on Valkey). The hand-off
/// now waits for the pause to end.
#[test]
fn a_lease_ending_during_client_pause_is_handed_off_after_the_pause() {
    if common::skip_unless(common::Needs::OwnServer, "starts a replica beside it") {
        return;
    }
    for with_replica in [false, true] {
        let s = Server::start();
        let replica = with_replica.then(|| {
            let r = Server::start();
            r.replicate_from(&s);
            r
        });
        for round in 0..3 {
            let key = format!("k{round}");
            let mut c = s.conn();
            acquire(&mut c, &key, "H", 300).unwrap();
            let mut w = block_on(&s, &key, "W", 5000, 5000);
            wait_blocked(&s, 1);
            let _: () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(1000)
                .arg("WRITE")
                .query(&mut c)
                .unwrap();
            let fence = match w.read() {
                Resp::Int(f) => f,
                other => panic!("W gets the lock after the pause, not {other:?}"),
            };
            alive(&s);
            assert_eq!(holder(&mut c, &key).as_deref(), Some("W"));
            assert_eq!(acquire(&mut c, &key, "X", 5000), None, "no second holder");
            assert_eq!(
                redis::cmd("LOCK.FENCE")
                    .arg(&key)
                    .query::<i64>(&mut c)
                    .unwrap(),
                fence
            );
        }
        if let Some(r) = replica {
            alive(&r);
            let mut m = s.conn();
            let _: () = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
            assert_eq!(digest(&mut m), digest(&mut r.conn()));
        }
    }
}

/// Defect 6: a waiter whose BLOCK timeout and hand-off fall in the same
/// event-loop iteration gets exactly one reply, and it is the truth: a
/// fence only if it holds the lock, nil only if it does not.
#[test]
fn grant_and_timeout_in_the_same_iteration_give_exactly_one_true_reply() {
    let s = Server::start();
    let mut c = s.conn();
    let mut sleeper = s.conn();
    for round in 0..8 {
        let key = format!("k{round}");
        acquire(&mut c, &key, "H", 200).unwrap();
        let mut w = block_on(&s, &key, "W", 60_000, 200 + (round % 3) - 1);
        wait_blocked(&s, 1);
        // The server sleeps across both deadlines: both fall due together.
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(0.4)
            .query(&mut sleeper)
            .unwrap();
        let reply = w.read();
        assert_eq!(
            w.call(&["PING"]),
            Resp::Simple("PONG".into()),
            "one reply only"
        );
        match reply {
            Resp::Int(f) => {
                assert_eq!(holder(&mut c, &key).as_deref(), Some("W"));
                assert_eq!(fence(&mut c, &key), Some(f));
            }
            Resp::Nil => assert_ne!(holder(&mut c, &key).as_deref(), Some("W")),
            other => panic!("{other:?}"),
        }
    }
}

/// Defect 7 (and the take-back itself): a grant whose client vanished before
/// its reply is taken back and handed on, but not after the same token
/// renewed it on another connection.
#[test]
fn an_undelivered_grant_is_taken_back_unless_renewed_since() {
    let s = Server::start();
    let mut c = s.conn();
    // Taken back and handed to the next in line.
    acquire(&mut c, "k", "H", 60_000).unwrap();
    let w = block_on(&s, "k", "W", 60_000, 0);
    wait_blocked(&s, 1);
    let mut v = block_on(&s, "k", "V", 60_000, 0);
    wait_blocked(&s, 2);
    let mut z = RawConn::connect(&s);
    let wid = first_blocked_client(&mut c);
    // One pipeline, one event-loop iteration: W is granted, then killed
    // before its reply is written.
    z.pipeline(&[&["LOCK.RELEASE", "k", "H"], &["CLIENT", "KILL", "ID", &wid]]);
    assert_eq!(z.read(), Resp::Int(1));
    assert_eq!(z.read(), Resp::Int(1));
    drop(w);
    assert!(
        matches!(v.read(), Resp::Int(_)),
        "V gets the lock W never saw"
    );
    assert_eq!(holder(&mut c, "k").as_deref(), Some("V"));
    assert_eq!(s.info_field("take_backs"), 1);

    // Renewed by the same token before the take-back: kept.
    acquire(&mut c, "j", "H", 60_000).unwrap();
    let _x = block_on(&s, "j", "X", 60_000, 0);
    wait_blocked(&s, 1);
    let xid = first_blocked_client(&mut c);
    z.pipeline(&[
        &["LOCK.RELEASE", "j", "H"],
        &["CLIENT", "KILL", "ID", &xid],
        &["LOCK.ACQUIRE", "j", "X", "60000"],
    ]);
    assert_eq!(z.read(), Resp::Int(1));
    assert_eq!(z.read(), Resp::Int(1));
    assert!(
        matches!(z.read(), Resp::Int(_)),
        "X renews on another connection"
    );
    sleep(Duration::from_millis(200));
    assert_eq!(holder(&mut c, "j").as_deref(), Some("X"), "not taken back");
}

/// Defect 8: a replica never grants, releases or extends on its own, even
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

/// Defect 9: an eviction policy can evict held locks: new grants are
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

/// Defect 11, as issue 16 settled it: the lease is the module's, and a
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

/// Defect 13: the smaller ones.
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

#[test]
fn swapdb_moves_waiters_with_their_lock() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "H", 60_000).unwrap();
    let mut w = block_on(&s, "k", "W", 60_000, 5000);
    wait_blocked(&s, 1);
    let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut c).unwrap();
    let _: () = redis::cmd("SELECT").arg(1).query(&mut c).unwrap();
    assert_eq!(release(&mut c, "k", "H"), 1);
    assert!(matches!(w.read(), Resp::Int(_)));
    assert_eq!(holder(&mut c, "k").as_deref(), Some("W"));
}

#[test]
fn commands_that_change_nothing_do_not_abort_watch() {
    let s = Server::start();
    let mut c = s.conn();
    let mut other = s.conn();
    acquire(&mut other, "k", "holder", 60_000).unwrap();
    for attempt in [
        vec!["LOCK.ACQUIRE", "k", "x", "1000"],
        vec!["LOCK.RELEASE", "k", "x"],
        vec!["LOCK.EXTEND", "k", "x", "1000"],
    ] {
        let _: () = redis::cmd("WATCH").arg("k").query(&mut c).unwrap();
        let args: Vec<&[u8]> = attempt.iter().map(|a| a.as_bytes()).collect();
        run(&mut other, &args).unwrap();
        let _: () = redis::cmd("MULTI").query(&mut c).unwrap();
        let _: () = redis::cmd("PING").query(&mut c).unwrap();
        let exec: Value = redis::cmd("EXEC").query(&mut c).unwrap();
        assert_ne!(exec, Value::Nil, "{attempt:?} aborted WATCH");
    }
    // A real change does.
    let _: () = redis::cmd("WATCH").arg("k").query(&mut c).unwrap();
    extend(&mut other, "k", "holder", 1000);
    let _: () = redis::cmd("MULTI").query(&mut c).unwrap();
    let _: () = redis::cmd("PING").query(&mut c).unwrap();
    let exec: Value = redis::cmd("EXEC").query(&mut c).unwrap();
    assert_eq!(exec, Value::Nil);
}

#[test]
fn block_during_the_restart_delay_waits_instead_of_failing() {
    if common::skip_unless(common::Needs::OwnServer, "starts with restart-delay-ms") {
        return;
    }
    let s = Server::builder()
        .module_arg("restart-delay-ms", "800")
        .start();
    let mut w = block_on(&s, "k", "W", 60_000, 10_000);
    assert!(
        matches!(w.read(), Resp::Int(_)),
        "granted when the delay ends"
    );
    assert_eq!(holder(&mut s.conn(), "k").as_deref(), Some("W"));
}

#[test]
fn a_same_token_waiter_is_answered_with_a_renewal_not_a_grant() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "H", 60_000).unwrap();
    let mut w1 = block_on(&s, "k", "X", 60_000, 5000);
    let mut w2 = block_on(&s, "k", "X", 60_000, 5000);
    wait_blocked(&s, 2);
    let grants = s.info_field("grants");
    assert_eq!(release(&mut c, "k", "H"), 1);
    let (Resp::Int(f1), Resp::Int(f2)) = (w1.read(), w2.read()) else {
        panic!("both answered");
    };
    assert_eq!(f1, f2, "the same lock");
    assert_eq!(s.info_field("grants"), grants + 1);
}

#[test]
fn a_read_only_user_never_sees_a_usable_token() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "app:1", "secret-token", 60_000).unwrap();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("reader")
        .arg("on")
        .arg(">pw")
        .arg("%R~app:*")
        .arg("+lock.info")
        .arg("+lock.fence")
        .query(&mut c)
        .unwrap();
    let mut r = s.conn();
    let _: () = redis::cmd("AUTH")
        .arg("reader")
        .arg("pw")
        .query(&mut r)
        .unwrap();
    let reply = lock_info_reply(&mut r, "app:1");
    assert_eq!(LockInfo::from_reply(&reply).unwrap().token, None);
    assert!(!format!("{reply:?}").contains("secret"));
    assert_eq!(holder(&mut c, "app:1").as_deref(), Some("secret-token"));
}

/// Found by the model test: a holder that shortens its lease (EXTEND, or
/// ACQUIRE with its own token and a smaller ttl) must not strand the line
/// until the old deadline.
#[test]
fn shortening_the_lease_brings_the_hand_off_forward() {
    let s = Server::start();
    let mut c = s.conn();
    // Only the module's own deadline may end the lease here.
    active_expire(&mut c, false);
    for (key, shorten) in [
        ("e", vec!["LOCK.EXTEND", "e", "H", "200"]),
        ("a", vec!["LOCK.ACQUIRE", "a", "H", "200"]),
    ] {
        acquire(&mut c, key, "H", 60_000).unwrap();
        let mut w = block_on(&s, key, "W", 60_000, 5_000);
        wait_blocked(&s, 1);
        let args: Vec<&[u8]> = shorten.iter().map(|a| a.as_bytes()).collect();
        run(&mut c, &args).unwrap();
        assert!(
            matches!(w.read_within(Duration::from_secs(3)), Some(Resp::Int(_))),
            "{shorten:?}: W is granted when the shortened lease ends"
        );
        assert_eq!(holder(&mut c, key).as_deref(), Some("W"));
    }
}

/// The ids of the clients blocked in LOCK.ACQUIRE, oldest first.
fn blocked_ids(c: &mut Connection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(c).unwrap();
    list.lines()
        .filter(|l| l.contains("cmd=lock.acquire") && l.contains("flags=b"))
        .filter_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect()
}

/// Redis 7.0 answered nothing at all to a waiter that CLIENT UNBLOCK reached
/// after its grant was decided but before its reply went out (the same
/// event-loop iteration; MULTI forces it): the grant was taken back and the
/// client's next command got the wrong reply. Each waiter must get exactly
/// one reply, and a reply with a fence means it holds the lock.
#[test]
fn client_unblock_right_after_a_grant_still_gives_exactly_one_reply() {
    let s = Server::start();
    let mut c = s.conn();
    let mut admin = RawConn::connect(&s);
    for (round, mode) in ["TIMEOUT", "ERROR"].into_iter().enumerate() {
        let key = format!("u{round}");
        acquire(&mut c, &key, "A", 60_000).unwrap();
        let mut w = block_on(&s, &key, "W", 60_000, 5_000);
        let mut next = block_on(&s, &key, "N", 60_000, 5_000);
        wait_blocked(&s, 2);
        let id = first_blocked_client(&mut c);
        admin.pipeline(&[
            &["MULTI"],
            &["LOCK.RELEASE", &key, "A"],
            &["CLIENT", "UNBLOCK", &id, mode],
            &["EXEC"],
        ]);
        for _ in 0..4 {
            admin.read();
        }
        let reply = w
            .read_within(Duration::from_secs(3))
            .unwrap_or_else(|| panic!("{mode}: W got no reply"));
        assert_eq!(w.call(&["PING"]), Resp::Simple("PONG".into()), "{mode}");
        match (mode, reply) {
            // Redis 7.0 and 7.2+ both let the decided grant through.
            ("TIMEOUT", Resp::Int(f)) => {
                assert_eq!(fence(&mut c, &key), Some(f));
                assert_eq!(holder(&mut c, &key).as_deref(), Some("W"));
                assert_eq!(release(&mut c, &key, "W"), 1);
            }
            // The error reached W instead of the grant: the grant is taken
            // back and goes to the next in line.
            ("ERROR", Resp::Error(e)) if e.starts_with("UNBLOCKED") => {}
            (mode, other) => panic!("{mode}: W got {other:?}"),
        }
        let n = next.read_within(Duration::from_secs(5));
        assert!(matches!(n, Some(Resp::Int(_))), "{mode}: N got {n:?}");
        assert_eq!(holder(&mut c, &key).as_deref(), Some("N"));
        assert_eq!(next.call(&["PING"]), Resp::Simple("PONG".into()));
    }
    alive(&s);
}

/// Random transactions of releases, re-acquires, CLIENT UNBLOCK (both
/// forms) and CLIENT KILL against a line of waiters, all in one event-loop
/// iteration: every live waiter gets exactly one reply (a fence, nil or an
/// UNBLOCKED error), a fence means that waiter holds the lock, and the lock
/// is never left with a client that did not hear of it.
#[test]
fn random_unblocks_and_kills_around_hand_offs_leave_one_reply_each() {
    use rand::{seq::SliceRandom, Rng, SeedableRng};
    let seed: u64 = std::env::var("ATTACK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let s = Server::start();
    let mut c = s.conn();
    let mut admin = RawConn::connect(&s);
    for round in 0..15 {
        let key = format!("r{round}");
        acquire(&mut c, &key, "A", 60_000).unwrap();
        // Each waiter's own client id, asked before it blocks (CLIENT
        // LIST's order is not a promise).
        let mut ids = Vec::new();
        let mut waiters: Vec<(String, RawConn)> = (0..4)
            .map(|i| {
                let token = format!("w{i}");
                let mut conn = RawConn::connect(&s);
                let Resp::Int(id) = conn.call(&["CLIENT", "ID"]) else {
                    panic!("CLIENT ID")
                };
                ids.push(id.to_string());
                conn.send(&["LOCK.ACQUIRE", &key, &token, "60000", "BLOCK", "1000"]);
                wait_blocked(&s, i as i64 + 1);
                (token, conn)
            })
            .collect();
        assert_eq!(blocked_ids(&mut c).len(), 4, "seed {seed}");
        let mut cmds: Vec<Vec<String>> = vec![vec!["MULTI".into()]];
        let mut killed = [false; 4];
        cmds.push(vec!["LOCK.RELEASE".into(), key.clone(), "A".into()]);
        for _ in 0..rng.gen_range(1..5) {
            let i = rng.gen_range(0..4);
            let cmd = match rng.gen_range(0..4) {
                0 => vec!["CLIENT", "UNBLOCK", &ids[i]],
                1 => vec!["CLIENT", "UNBLOCK", &ids[i], "ERROR"],
                2 => {
                    killed[i] = true;
                    vec!["CLIENT", "KILL", "ID", &ids[i]]
                }
                _ => vec!["LOCK.RELEASE", &key, &waiters[i].0],
            };
            cmds.push(cmd.into_iter().map(String::from).collect());
        }
        cmds[2..].shuffle(&mut rng);
        cmds.push(vec!["EXEC".into()]);
        let refs: Vec<Vec<&str>> = cmds
            .iter()
            .map(|v| v.iter().map(String::as_str).collect())
            .collect();
        let refs: Vec<&[&str]> = refs.iter().map(Vec::as_slice).collect();
        admin.pipeline(&refs);
        for _ in 0..refs.len() {
            admin.read();
        }
        let mut fences = Vec::new();
        for (i, (token, w)) in waiters.iter_mut().enumerate() {
            if killed[i] {
                continue;
            }
            let reply = w
                .read_within(Duration::from_secs(8))
                .unwrap_or_else(|| panic!("seed {seed} round {round}: {token} got no reply"));
            match reply {
                Resp::Int(f) => fences.push((token.clone(), f)),
                Resp::Nil => {}
                Resp::Error(e) if e.starts_with("UNBLOCKED") => {}
                other => panic!("seed {seed} round {round}: {token} got {other:?}"),
            }
            assert_eq!(
                w.call(&["PING"]),
                Resp::Simple("PONG".into()),
                "seed {seed} round {round}: {token} got a second reply"
            );
        }
        // Whoever holds the lock now was told so (the last fence sent), or
        // was killed: before its reply went out (the grant is then taken
        // back by the next timer run) or after (it holds until its lease
        // ends, as any holder that vanished does).
        let killed_tokens: Vec<&str> = (0..4)
            .filter(|i| killed[*i])
            .map(|i| waiters[i].0.as_str())
            .collect();
        if let Some(now) = holder(&mut c, &key) {
            match fences.iter().find(|(t, _)| *t == now) {
                Some((_, f)) => {
                    assert_eq!(fence(&mut c, &key), Some(*f), "seed {seed} round {round}");
                    assert_eq!(
                        fences.iter().map(|(_, f)| *f).max(),
                        Some(*f),
                        "seed {seed} round {round}: {fences:?}"
                    );
                }
                None => assert!(
                    killed_tokens.contains(&now.as_str()),
                    "seed {seed} round {round}: {now} holds {key} but was never told: {cmds:?}"
                ),
            }
        }
        let mut fs: Vec<i64> = fences.iter().map(|(_, f)| *f).collect();
        fs.sort_unstable();
        fs.dedup();
        assert_eq!(fs.len(), fences.len(), "seed {seed}: one fence per grant");
        assert_eq!(s.info_field("waiters"), 0, "seed {seed}");
    }
    alive(&s);
}
