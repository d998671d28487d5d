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

/// used_memory once it stops falling: Redis frees the temporary clients of
/// finished blocked clients gradually (modulesCron).
fn settled_memory(c: &mut Connection) -> i64 {
    let mut last = used_memory(c);
    loop {
        sleep(Duration::from_millis(300));
        let now = used_memory(c);
        if now >= last {
            return now;
        }
        last = now;
    }
}

fn wait_all_disconnected(c: &mut Connection) {
    wait_until(Duration::from_secs(20), || {
        let info: String = redis::cmd("INFO").arg("clients").query(c).unwrap();
        info.contains("connected_clients:1\r")
    });
}

/// Runs `round` twice on one server: memory after the second round must not
/// exceed memory after the first, so nothing is left behind per waiter.
fn assert_no_memory_left_per_round(s: &Server, mut round: impl FnMut(&Server, &mut Connection)) {
    let mut c = s.conn();
    let mut after = vec![];
    for _ in 0..2 {
        round(s, &mut c);
        wait_all_disconnected(&mut c);
        assert_eq!(s.info_field("waiters"), 0);
        after.push(settled_memory(&mut c));
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
