//! LOCK.ACQUIRE ... BLOCK: FIFO waiting, hand-off on release, expiry, DEL,
//! FLUSHALL and overwrite, timeouts, disconnects, CLIENT UNBLOCK, no
//! barging, MULTI/Lua, replicas, and thousands of waiters.

use redis_lock_testkit as common;

use common::*;
use std::thread::sleep;
use std::time::{Duration, Instant};

const SHORT: Duration = Duration::from_millis(150);

/// Sends a BLOCK acquire on a new connection and waits until the server has
/// queued it (so queue order is the order of calls).
fn wait_for_lock(s: &Server, key: &str, token: &str, ttl: i64, timeout: i64) -> RawConn {
    let before = s.info_field("waiters");
    let w = RawConn::block_acquire(s, key, token, ttl, timeout);
    wait_until(Duration::from_secs(10), || s.info_field("waiters") > before);
    w
}

fn granted(reply: Resp) -> i64 {
    match reply {
        Resp::Int(f) => f,
        other => panic!("expected a fencing token, got {other:?}"),
    }
}

#[test]
fn free_lock_is_granted_at_once_and_the_holders_token_answers_at_once() {
    let s = Server::start();
    let mut c = s.conn();
    let f: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg("a")
        .arg(10_000)
        .arg("BLOCK")
        .arg(0)
        .query(&mut c)
        .unwrap();
    let again: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg("a")
        .arg(10_000)
        .arg("BLOCK")
        .arg(0)
        .query(&mut c)
        .unwrap();
    assert_eq!(again, f);
    assert_eq!(s.info_field("waiters"), 0);
}

#[test]
fn waiters_are_served_in_fifo_order_with_increasing_fences() {
    if common::skip_unless(common::Needs::OwnServer, "counts INFO lock from zero") {
        return;
    }
    let s = Server::start();
    let mut c = s.conn();
    let mut last = acquire(&mut c, "k", "holder", 60_000).unwrap();
    let mut waiters: Vec<RawConn> = (0..5)
        .map(|i| wait_for_lock(&s, "k", &format!("w{i}"), 60_000, 0))
        .collect();
    assert_eq!(lock_info(&mut c, "k").unwrap().waiters, 5);
    assert_eq!(release(&mut c, "k", "holder"), 1);
    for i in 0..5 {
        let f = granted(waiters[i].read());
        assert!(f > last, "fence {f} after {last}");
        last = f;
        assert_eq!(holder(&mut c, "k"), Some(format!("w{i}")));
        for later in waiters.iter_mut().skip(i + 1) {
            assert_eq!(
                later.read_within(Duration::from_millis(20)),
                None,
                "served out of turn"
            );
        }
        assert_eq!(
            waiters[i].call(&["LOCK.RELEASE", "k", &format!("w{i}")]),
            Resp::Int(1)
        );
    }
    assert_eq!(holder(&mut c, "k"), None);
    assert_eq!(s.info_field("handoffs"), 5);
    assert_eq!(s.info_field("waiters"), 0);
}

#[test]
fn hand_off_when_the_lease_expires() {
    let s = Server::start();
    let mut c = s.conn();
    active_expire(&mut c, false);
    let start = Instant::now();
    let f0 = acquire(&mut c, "k", "crashed", 300).unwrap();
    let mut w = wait_for_lock(&s, "k", "next", 60_000, 0);
    let f = granted(w.read());
    let waited = start.elapsed();
    assert!(f > f0);
    assert!(
        waited >= Duration::from_millis(290),
        "handed over before the deadline: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(3),
        "hand-off came late: {waited:?}"
    );
    assert_eq!(holder(&mut c, "k").as_deref(), Some("next"));
}

#[test]
fn extending_the_lease_postpones_the_hand_off() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 300).unwrap();
    let mut w = wait_for_lock(&s, "k", "b", 60_000, 0);
    assert_eq!(extend(&mut c, "k", "a", 1_000), 1);
    assert_eq!(
        w.read_within(Duration::from_millis(500)),
        None,
        "the holder extended"
    );
    granted(w.read());
}

#[test]
fn hand_off_on_del_unlink_flushdb_and_flushall() {
    let s = Server::start();
    let mut c = s.conn();
    for (i, admin) in [
        vec!["DEL", "k"],
        vec!["UNLINK", "k"],
        vec!["FLUSHDB"],
        vec!["FLUSHALL"],
        vec!["FLUSHALL", "ASYNC"],
    ]
    .into_iter()
    .enumerate()
    {
        let f0 = acquire(&mut c, "k", "old", 60_000).unwrap();
        let token = format!("next{i}");
        let mut w = wait_for_lock(&s, "k", &token, 60_000, 0);
        let args: Vec<&[u8]> = admin.iter().map(|a| a.as_bytes()).collect();
        run(&mut c, &args).unwrap();
        let f = granted(w.read());
        assert!(f > f0, "{admin:?}");
        assert_eq!(holder(&mut c, "k"), Some(token), "{admin:?}");
        release(&mut c, "k", &format!("next{i}"));
    }
}

/// A user's expiry on a lock key is an administrative delete when it comes
/// due: the first waiter is handed the lock then, whether Redis's expire
/// cycle deletes the key or a command that opens it does (the unlink the
/// module reacts to, as against the deletes the node makes itself).
#[test]
fn hand_off_when_a_users_expiry_on_the_key_comes_due() {
    let s = Server::start();
    let mut c = s.conn();
    for active in [true, false] {
        active_expire(&mut c, active);
        let f0 = acquire(&mut c, "k", "old", 60_000).unwrap();
        let token = format!("next-{active}");
        let mut w = wait_for_lock(&s, "k", &token, 60_000, 0);
        let _: i64 = redis::cmd("PEXPIRE")
            .arg("k")
            .arg(200)
            .query(&mut c)
            .unwrap();
        if !active {
            sleep(Duration::from_millis(400));
            // Opening the key deletes it; the waiter is first all the same.
            assert_eq!(acquire(&mut c, "k", "third", 1000), None);
        }
        let f = granted(w.read());
        assert!(f > f0, "active expiry {active}");
        assert_eq!(holder(&mut c, "k"), Some(token.clone()));
        release(&mut c, "k", &token);
    }
}

#[test]
fn a_waiter_learns_when_its_lock_key_is_overwritten_by_another_type() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "old", 60_000).unwrap();
    let mut w = wait_for_lock(&s, "k", "next", 60_000, 0);
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("now a string")
        .query(&mut c)
        .unwrap();
    match w.read() {
        Resp::Error(e) => assert!(e.starts_with("WRONGTYPE"), "{e}"),
        other => panic!("expected WRONGTYPE, got {other:?}"),
    }
    assert_eq!(s.info_field("waiters"), 0);
    let v: String = redis::cmd("GET").arg("k").query(&mut c).unwrap();
    assert_eq!(v, "now a string", "the overwrite stands");
}

#[test]
fn block_times_out_with_nil_and_leaves_the_queue() {
    if common::skip_unless(common::Needs::OwnServer, "counts INFO lock from zero") {
        return;
    }
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let start = Instant::now();
    let mut w = wait_for_lock(&s, "k", "b", 60_000, 300);
    assert_eq!(w.read(), Resp::Nil);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(s.info_field("waiters"), 0);
    assert_eq!(s.info_field("block_timeouts"), 1);
    release(&mut c, "k", "a");
    assert_eq!(holder(&mut c, "k"), None, "nobody left to hand it to");
}

#[test]
fn block_0_waits_without_limit() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let mut w = wait_for_lock(&s, "k", "b", 60_000, 0);
    assert_eq!(w.read_within(Duration::from_millis(700)), None);
    release(&mut c, "k", "a");
    granted(w.read());
}

#[test]
fn a_disconnected_waiter_is_skipped() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let gone = wait_for_lock(&s, "k", "gone", 60_000, 0);
    let mut w = wait_for_lock(&s, "k", "alive", 60_000, 0);
    drop(gone);
    wait_until(Duration::from_secs(10), || s.info_field("waiters") == 1);
    release(&mut c, "k", "a");
    granted(w.read());
    assert_eq!(holder(&mut c, "k").as_deref(), Some("alive"));
}

#[test]
fn client_unblock_gives_nil_and_with_error_gives_an_error() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    for (mode, expect_error) in [
        (None, false),
        (Some("ERROR"), true),
        (Some("TIMEOUT"), false),
    ] {
        let mut w = RawConn::connect(&s);
        let Resp::Int(id) = w.call(&["CLIENT", "ID"]) else {
            panic!()
        };
        w.send(&["LOCK.ACQUIRE", "k", "b", "60000", "BLOCK", "0"]);
        wait_until(Duration::from_secs(10), || s.info_field("waiters") == 1);
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("UNBLOCK").arg(id);
        if let Some(m) = mode {
            cmd.arg(m);
        }
        let n: i64 = cmd.query(&mut c).unwrap();
        assert_eq!(n, 1, "{mode:?}");
        match (w.read(), expect_error) {
            (Resp::Nil, false) => {}
            (Resp::Error(e), true) => assert!(e.starts_with("UNBLOCKED"), "{e}"),
            (other, _) => panic!("{mode:?}: {other:?}"),
        }
        assert_eq!(s.info_field("waiters"), 0, "{mode:?}");
    }
    release(&mut c, "k", "a");
    assert_eq!(holder(&mut c, "k"), None);
}

#[test]
fn nobody_barges_in_while_waiters_are_queued() {
    let s = Server::start();
    let mut c = s.conn();
    active_expire(&mut c, false);
    acquire(&mut c, "k", "a", 300).unwrap();
    let mut w = wait_for_lock(&s, "k", "waiter", 60_000, 0);
    // A spinning client around the deadline never gets the lock.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(700) {
        assert_eq!(acquire(&mut c, "k", "barger", 60_000), None);
    }
    granted(w.read());

    // DEL and ACQUIRE in one transaction: the waiter still comes first.
    let mut w2 = wait_for_lock(&s, "k", "second", 60_000, 0);
    let (_, barged): (i64, Option<i64>) = redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg("k")
        .cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg("barger")
        .arg(60_000)
        .query(&mut c)
        .unwrap();
    assert_eq!(barged, None);
    granted(w2.read());
    assert_eq!(holder(&mut c, "k").as_deref(), Some("second"));
}

#[test]
fn block_does_not_block_inside_multi_or_lua() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let start = Instant::now();
    let (nil, free): (Option<i64>, Option<i64>) = redis::pipe()
        .atomic()
        .cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg("b")
        .arg(1000)
        .arg("BLOCK")
        .arg(0)
        .cmd("LOCK.ACQUIRE")
        .arg("free")
        .arg("b")
        .arg(1000)
        .arg("BLOCK")
        .arg(0)
        .query(&mut c)
        .unwrap();
    assert_eq!(nil, None);
    assert!(free.is_some());
    let lua: Option<i64> = redis::cmd("EVAL")
        .arg("return redis.call('LOCK.ACQUIRE', KEYS[1], 'b', 1000, 'BLOCK', 0)")
        .arg(1)
        .arg("k")
        .query(&mut c)
        .unwrap();
    assert_eq!(lua, None);
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(s.info_field("waiters"), 0);
}

#[test]
fn bad_block_arguments_are_errors() {
    let s = Server::start();
    let mut c = s.conn();
    for (cmd, needle) in [
        (vec!["LOCK.ACQUIRE", "k", "t", "100", "BLOCK"], "timeout-ms"),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "100", "BLOCK", "-1"],
            "timeout-ms",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "100", "BLOCK", "1.5"],
            "timeout-ms",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "100", "BLOCK", "x"],
            "timeout-ms",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "100", "BLOCK", "1", "BLOCK", "1"],
            "unknown option",
        ),
    ] {
        let err = run_err(&mut c, &cmd);
        assert!(
            err.starts_with("ERR") && err.contains(needle),
            "{cmd:?}: {err}"
        );
    }
    let n: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n, 0);
}

#[test]
fn info_reports_waiting() {
    if common::skip_unless(common::Needs::OwnServer, "counts INFO lock from zero") {
        return;
    }
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let mut w1 = wait_for_lock(&s, "k", "b", 60_000, 0);
    let _w2 = wait_for_lock(&s, "k", "c", 60_000, 100_000);
    assert_eq!(s.info_field("waiters"), 2);
    sleep(SHORT);
    release(&mut c, "k", "a");
    granted(w1.read());
    assert_eq!(s.info_field("waiters"), 1);
    assert_eq!(s.info_field("handoffs"), 1);
    assert!(s.info_field("wait_time_total_ms") >= 100);
    assert!(s.info_field("wait_time_max_ms") >= 100);
    assert_eq!(s.info_field("block_timeouts"), 0);
}

#[test]
fn a_replica_follows_every_hand_off() {
    if common::skip_unless(common::Needs::OwnServer, "starts a replica beside it") {
        return;
    }
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.conn();
    let mut r = replica.conn();
    let sync = |m: &mut Connection, r: &mut Connection| {
        let n: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(m).unwrap();
        assert_eq!(n, 1);
        assert_eq!(digest(m), digest(r));
    };
    acquire(&mut m, "k", "a", 60_000).unwrap();
    let mut w1 = wait_for_lock(&master, "k", "w1", 2_000, 0);
    let mut w2 = wait_for_lock(&master, "k", "w2", 60_000, 0);
    let mut w3 = wait_for_lock(&master, "k", "w3", 60_000, 0);

    release(&mut m, "k", "a");
    let f1 = granted(w1.read());
    sync(&mut m, &mut r);
    assert_eq!(fence(&mut r, "k"), Some(f1), "hand-off on release");

    let f2 = granted(w2.read()); // w1's 2 s lease expires
    sync(&mut m, &mut r);
    assert_eq!(fence(&mut r, "k"), Some(f2), "hand-off on expiry");
    assert_eq!(holder(&mut r, "k").as_deref(), Some("w2"));

    let _: () = redis::cmd("DEL").arg("k").query(&mut m).unwrap();
    let f3 = granted(w3.read());
    sync(&mut m, &mut r);
    assert_eq!(fence(&mut r, "k"), Some(f3), "hand-off on DEL");
    assert!(f1 < f2 && f2 < f3);

    let err = run_err(&mut r, &["LOCK.ACQUIRE", "k", "x", "1000", "BLOCK", "0"]);
    assert!(err.starts_with("READONLY"), "{err}");
}

#[test]
fn waiters_are_released_with_an_error_when_the_master_becomes_a_replica() {
    if common::skip_unless(common::Needs::OwnServer, "makes another server its replica") {
        return;
    }
    let other = Server::start();
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let mut w = wait_for_lock(&s, "k", "b", 60_000, 0);
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(other.port)
        .query(&mut c)
        .unwrap();
    match w.read() {
        Resp::Error(e) => assert!(e.starts_with("UNBLOCKED"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.info_field("waiters"), 0);
}

/// Runs `round` twice on one server: memory after the second round must not
/// exceed memory after the first, so nothing is left behind per waiter.
fn assert_no_memory_left_per_round(s: &Server, mut round: impl FnMut(&Server, &mut Connection)) {
    let mut c = s.conn();
    let mut after = vec![];
    for _ in 0..2 {
        round(s, &mut c);
        assert_eq!(s.info_field("waiters"), 0);
        after.push(settled_memory(s, &mut c));
    }
    assert!(
        after[1] - after[0] < 64 * 1024,
        "used_memory after rounds: {after:?}"
    );
}

fn big_server() -> Server {
    // hz 100: Redis frees finished blocked clients' buffers faster.
    Server::builder()
        .config("maxclients", "10000")
        .config("hz", "100")
        .start()
}

#[test]
fn thousands_of_waiters_on_one_key_drain_in_order_and_free_their_memory() {
    const N: usize = 2000;
    let s = big_server();
    assert_no_memory_left_per_round(&s, |s, c| {
        acquire(c, "hot", "holder", 600_000).unwrap();
        let mut waiters = RawConn::queue_waiters(s, "hot", N);
        wait_until(Duration::from_secs(20), || {
            s.info_field("waiters") == N as i64
        });
        let handoffs_before = s.info_field("handoffs");
        // Sent on distinct sockets, so the server's queue order is whatever
        // order it read them in: follow the holder and check fences rise.
        release(c, "hot", "holder");
        let mut last = 0;
        for _ in 0..N {
            let token = holder(c, "hot").expect("held while waiters remain");
            let i: usize = token[1..].parse().unwrap();
            let f = granted(waiters[i].read());
            assert!(f > last);
            last = f;
            assert_eq!(
                waiters[i].call(&["LOCK.RELEASE", "hot", &format!("w{i}")]),
                Resp::Int(1)
            );
        }
        assert_eq!(s.info_field("handoffs") - handoffs_before, N as i64);
        assert_eq!(holder(c, "hot"), None);
    });
}

#[test]
fn thousands_of_waiters_on_many_keys_time_out_and_free_their_memory() {
    const KEYS: usize = 500;
    const PER_KEY: usize = 4;
    let s = big_server();
    assert_no_memory_left_per_round(&s, |s, c| {
        for k in 0..KEYS {
            acquire(c, &format!("k{k}"), "holder", 600_000).unwrap();
        }
        let mut waiters: Vec<RawConn> = (0..KEYS * PER_KEY).map(|_| RawConn::connect(s)).collect();
        for (i, w) in waiters.iter_mut().enumerate() {
            w.send(&[
                "LOCK.ACQUIRE",
                &format!("k{}", i % KEYS),
                "w",
                "1000",
                "BLOCK",
                "1500",
            ]);
        }
        wait_until(Duration::from_secs(20), || {
            s.info_field("waiters") == (KEYS * PER_KEY) as i64
        });
        // Half the keys are released: their first waiter gets the lock.
        for k in 0..KEYS / 2 {
            release(c, &format!("k{k}"), "holder");
        }
        let (mut got, mut timed_out) = (0, 0);
        for w in waiters.iter_mut() {
            match w.read() {
                Resp::Int(_) => got += 1,
                Resp::Nil => timed_out += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got + timed_out, KEYS * PER_KEY);
        assert!(
            got >= KEYS / 2,
            "every released key went to a waiter: {got}"
        );
        assert!(
            timed_out >= KEYS * PER_KEY / 2,
            "the held keys' waiters timed out"
        );
        let _: () = redis::cmd("FLUSHALL").query(c).unwrap();
    });
}

// Regression tests of defects found by attacking the module (issue 8 and
// later): each reproduces an attack or an unlucky schedule that broke
// mutual exclusion or crashed the server before its fix.

/// Issue 8, defect 1: a waiter that timed out on K1 left its (reused) handle address
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

/// Issue 8, defect 5: a lease that ended during CLIENT PAUSE WRITE with a waiter
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

/// Issue 22: the hand-off held back by a CLIENT PAUSE WRITE goes out within
/// about 10 ms of the pause's end (README, Guarantees). Redis 7.0 ended a
/// timed pause only when its cached clock, refreshed by an idle server at
/// its cron, passed the end: asked from the timer, it said "paused" up to
/// 60 ms after (40 to 60 ms late here; Valkey 0 to 11 ms). Judged on the
/// median of five rounds, so one slow round on a loaded machine does not
/// decide it; the old behaviour's median was over 40 ms.
#[test]
fn a_hand_off_held_by_client_pause_goes_out_soon_after_it_ends() {
    let s = Server::start();
    let mut c = s.conn();
    let mut late_ms: Vec<i64> = Vec::new();
    for round in 0..5 {
        let key = format!("paused{round}");
        acquire(&mut c, &key, "H", 200).unwrap();
        let mut w = block_on(&s, &key, "W", 5000, 5000);
        wait_blocked(&s, 1);
        let pause_ms = 600;
        let paused_at = Instant::now();
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(pause_ms)
            .arg("WRITE")
            .query(&mut c)
            .unwrap();
        let reply = w.read_within(Duration::from_secs(10)).expect("served");
        assert!(matches!(reply, Resp::Int(_)), "{reply:?}");
        let waited = paused_at.elapsed().as_millis() as i64;
        assert!(
            waited >= pause_ms - 5,
            "handed on during the pause: {waited} ms"
        );
        late_ms.push(waited - pause_ms);
    }
    late_ms.sort();
    assert!(late_ms[2] < 30, "ms after the pause's end: {late_ms:?}");
}

/// Issue 8, defect 6: a waiter whose BLOCK timeout and hand-off fall in the same
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

/// Issue 8, defect 7 (and the take-back itself): a grant whose client vanished before
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

/// Issue 22: a panic inside a decision of a running server (injected at
/// the n-th write of the lock: the test-only `REDIS_LOCK_PANIC_ON_WRITE`)
/// is an error reply to that command (or a logged error of the timer) and
/// a line in the log; the server lives on, nobody barges past the line,
/// and no waiter is stranded. The writes of key `k`: 1 the holder's grant,
/// then either 2 its release's delete and 3 the hand-off to the waiter, or,
/// with no release, 2 the timer's hand-off when the lease ends.
/// * Release cut at 2: the lock is still the holder's; the waiter gets it
///   when the lease ends.
/// * Release cut at 3: the lock came free. An intruder's plain ACQUIRE
///   right after gets nil (the line is settled before anything else), and
///   without one the waiter is served at once (not at the 60 s lease's
///   end, when the node had planned to look next).
/// * Timer cut at 2: the key's planned look was used up by the run that
///   failed; the recovery (every line looked at again, the timer at once)
///   serves the waiter, not its BLOCK timeout.
#[test]
fn a_panic_inside_a_decision_strands_no_waiter_and_lets_nobody_barge() {
    if common::skip_unless(common::Needs::LocalProcess, "sets the server's environment") {
        return;
    }
    struct Case {
        cut_at: u32,
        lease_ms: i64,
        release: bool,
        intruder: bool,
    }
    let cases = [
        Case {
            cut_at: 2,
            lease_ms: 1_500,
            release: true,
            intruder: true,
        },
        Case {
            cut_at: 3,
            lease_ms: 60_000,
            release: true,
            intruder: true,
        },
        Case {
            cut_at: 3,
            lease_ms: 60_000,
            release: true,
            intruder: false,
        },
        Case {
            cut_at: 2,
            lease_ms: 1_500,
            release: false,
            intruder: false,
        },
    ];
    for Case {
        cut_at,
        lease_ms,
        release,
        intruder,
    } in cases
    {
        let case = format!("cut at write {cut_at}, release {release}, intruder {intruder}");
        let fault = format!("REDIS_LOCK_PANIC_ON_WRITE={cut_at}:k");
        let s = Server::builder().wrapped_in(&["env", &fault]).start();
        let mut c = s.conn();
        let first = acquire(&mut c, "k", "holder", lease_ms).expect("free");
        let mut waiter = wait_for_lock(&s, "k", "waiter", 60_000, 30_000);
        if release {
            let err = run_err(&mut c, &["LOCK.RELEASE", "k", "holder"]);
            assert!(err.contains("internal error"), "{case}: {err}");
            assert!(s.log().contains("internal error in a command"), "{case}");
        }
        if intruder {
            // The lock is the holder's, or already the waiter's.
            assert_eq!(acquire(&mut c, "k", "intruder", 1_000), None, "{case}");
        }
        // Served within 25 s: before its BLOCK's 30 s, and well before a
        // 60 s lease's end.
        let reply = waiter.read_within(Duration::from_secs(25));
        let fence = granted(reply.unwrap_or_else(|| panic!("{case}: stranded")));
        assert!(fence > first, "{case}: fence {fence} after {first}");
        assert_eq!(holder(&mut c, "k"), Some("waiter".into()), "{case}");
        assert_eq!(s.info_field("waiters"), 0, "{case}");
        if !release {
            assert!(
                s.log().contains("internal error in the hand-off timer"),
                "{case}"
            );
        }
        let pong: String = redis::cmd("PING").query(&mut c).unwrap();
        assert_eq!(pong, "PONG", "{case}");
    }
}

/// Issue 22: a panic while a decision is carried out (injected at the n-th
/// replication of the key: the test-only `REDIS_LOCK_PANIC_ON_REPLICATE`)
/// loses nothing the node decided. A release that hands the lock to a
/// waiter replicates the key, then answers the waiter; cut at the
/// replication, the waiter (already out of its line and holding the lock)
/// is still answered, by the timer at once, not left blocked until its
/// BLOCK timeout with a lock nobody knows it holds.
#[test]
fn a_panic_while_carrying_out_a_decision_still_answers_the_waiter() {
    if common::skip_unless(common::Needs::LocalProcess, "sets the server's environment") {
        return;
    }
    // Replications of k: 1 the holder's grant, 2 the release that hands
    // it on.
    let s = Server::builder()
        .wrapped_in(&["env", "REDIS_LOCK_PANIC_ON_REPLICATE=2:k"])
        .start();
    let mut c = s.conn();
    let first = acquire(&mut c, "k", "holder", 60_000).expect("free");
    let mut waiter = wait_for_lock(&s, "k", "waiter", 60_000, 30_000);
    let err = run_err(&mut c, &["LOCK.RELEASE", "k", "holder"]);
    assert!(err.contains("internal error"), "{err}");
    // Well before the BLOCK's 30 s.
    let reply = waiter.read_within(Duration::from_secs(20));
    let fence = granted(reply.expect("the waiter was stranded"));
    assert!(fence > first, "fence {fence} after {first}");
    assert_eq!(holder(&mut c, "k"), Some("waiter".into()));
    assert_eq!(s.info_field("waiters"), 0);
    // The waiter holds it: it can release it, and the server lives on.
    let released: i64 = redis::cmd("LOCK.RELEASE")
        .arg("k")
        .arg("waiter")
        .query(&mut c)
        .unwrap();
    assert_eq!(released, 1);
    alive(&s);
}
