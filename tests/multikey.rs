//! `LOCK.ACQUIREALL numkeys key ... token ttl-ms [MINFENCE n]`: every key
//! with one fence, or none (nothing changed); `LOCK.RELEASEALL numkeys key
//! ... token`: how many it released. Each key is then an ordinary lock.
//! With BLOCK the caller waits in every key's line, holding none of them.
//! (`SHARED` over several keys: `tests/shared.rs`.)

use redis_lock_testkit as common;

use common::*;

fn acquire_all(c: &mut Connection, keys: &[&str], token: &str, ttl: i64) -> Option<i64> {
    redis::cmd("LOCK.ACQUIREALL")
        .arg(keys.len())
        .arg(keys)
        .arg(token)
        .arg(ttl)
        .query(c)
        .unwrap()
}

fn release_all(c: &mut Connection, keys: &[&str], token: &str) -> i64 {
    redis::cmd("LOCK.RELEASEALL")
        .arg(keys.len())
        .arg(keys)
        .arg(token)
        .query(c)
        .unwrap()
}

#[test]
fn every_key_with_one_fence_or_none() {
    let s = Server::start();
    let mut c = s.conn();
    let f = acquire_all(&mut c, &["a", "b", "c"], "t", 60_000).unwrap();
    for k in ["a", "b", "c"] {
        assert_eq!(holder_and_fence(&mut c, k), Some(("t".into(), f)), "{k}");
    }
    // One key held elsewhere: nil, and the free ones are not taken.
    let e = acquire_all(&mut c, &["c", "d", "e"], "u", 60_000);
    assert_eq!(e, None);
    assert_eq!(fence(&mut c, "d"), None);
    assert_eq!(fence(&mut c, "e"), None);
    // The same token again (a retry after a lost reply): the same fence.
    assert_eq!(acquire_all(&mut c, &["c", "b", "a"], "t", 60_000), Some(f));
    // Holding only some of them is no retry.
    assert_eq!(acquire_all(&mut c, &["a", "z"], "t", 60_000), None);
    assert_eq!(fence(&mut c, "z"), None);
    // Each key is an ordinary lock.
    assert_eq!(release(&mut c, "b", "t"), 1);
    assert_eq!(release_all(&mut c, &["a", "b", "c"], "t"), 2);
    assert_eq!(release_all(&mut c, &["a", "b", "c"], "t"), 0);
    let next = acquire_all(&mut c, &["a", "b"], "u", 1000).unwrap();
    assert!(next > f);
}

#[test]
fn no_barging_past_a_line_and_no_grant_during_lock_delay() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "q", "holder", 60_000).unwrap();
    let mut waiter = RawConn::block_acquire(&s, "q", "w", 10_000, 30_000);
    wait_until(std::time::Duration::from_secs(5), || {
        s.info_field("waiters") == 1
    });
    assert_eq!(release(&mut c, "q", "holder"), 1);
    assert!(matches!(
        waiter.read_within(std::time::Duration::from_secs(5)),
        Some(Resp::Int(_))
    ));
    // The waiter holds q now: nil.
    assert_eq!(acquire_all(&mut c, &["p", "q"], "x", 1000), None);
    assert_eq!(fence(&mut c, "p"), None);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.lock-delay-ms")
        .arg(3_600_000)
        .query(&mut c)
        .unwrap();
    acquire(&mut c, "ended", "gone", 20).unwrap();
    wait_until(std::time::Duration::from_secs(5), || {
        fence(&mut c, "ended").is_none()
    });
    assert_eq!(acquire_all(&mut c, &["ended", "other"], "x", 1000), None);
    assert_eq!(fence(&mut c, "other"), None);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let _: () = redis::cmd("SET").arg("str").arg("v").query(&mut c).unwrap();
    for (args, want) in [
        (
            vec!["LOCK.ACQUIREALL", "2", "a", "a", "t", "100"],
            "named twice",
        ),
        (vec!["LOCK.ACQUIREALL", "0", "a", "t", "100"], "numkeys"),
        (vec!["LOCK.ACQUIREALL", "x", "a", "t", "100"], "numkeys"),
        (vec!["LOCK.ACQUIREALL", "3", "a", "t", "100"], "numkeys"),
        (vec!["LOCK.ACQUIREALL", "1", "a", "t", "0"], "ttl-ms"),
        (vec!["LOCK.ACQUIREALL", "1", "a", "", "100"], "token"),
        (
            vec!["LOCK.ACQUIREALL", "1", "a", "t", "100", "BLOCK", "-1"],
            "invalid timeout-ms",
        ),
        (
            vec!["LOCK.ACQUIREALL", "1", "a", "t", "100", "BLOCK"],
            "BLOCK",
        ),
        (
            vec!["LOCK.ACQUIREALL", "1", "a", "t", "100", "LIMIT", "2"],
            "LIMIT needs SHARED",
        ),
        (
            vec!["LOCK.ACQUIREALL", "1", "a", "t", "100", "NX"],
            "unknown option",
        ),
        (
            vec!["LOCK.ACQUIREALL", "2", "a", "str", "t", "100"],
            "WRONGTYPE",
        ),
        (vec!["LOCK.RELEASEALL", "2", "a", "t"], "numkeys"),
        (
            vec!["LOCK.RELEASEALL", "1", "a", "t", "extra"],
            "wrong number",
        ),
        (vec!["LOCK.RELEASEALL", "2", "a", "str", "t"], "WRONGTYPE"),
    ] {
        let e = run_err(&mut c, &args);
        assert!(e.contains(want), "{args:?}: {e}");
    }
    assert_eq!(fence(&mut c, "a"), None, "nothing was granted");
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("LOCK.ACQUIREALL")
        .arg(2)
        .arg("x")
        .arg("y")
        .arg("t")
        .arg(100)
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["x", "y"]);
}

/// VALUE gives every key's holder the public value; a renewal changes it
/// on each; SHARED with VALUE is refused and changes nothing.
#[test]
fn a_value_is_every_keys_holders() {
    let s = Server::start();
    let mut c = s.conn();
    let value_of = |c: &mut Connection, key: &str| -> Option<String> {
        let v: redis::Value = redis::cmd("LOCK.OBSERVE").arg(key).query(c).unwrap();
        let redis::Value::Array(items) = v else {
            panic!("{v:?}")
        };
        let at = items
            .iter()
            .position(|i| *i == redis::Value::BulkString(b"value".to_vec()));
        redis::from_redis_value(&items[at.unwrap() + 1]).unwrap()
    };
    let all = |c: &mut Connection, extra: &[&str]| -> redis::RedisResult<Option<i64>> {
        redis::cmd("LOCK.ACQUIREALL")
            .arg(2)
            .arg("a")
            .arg("b")
            .arg("t")
            .arg(60_000)
            .arg(extra)
            .query(c)
    };
    let f = all(&mut c, &["VALUE", "10.0.0.7"]).unwrap().unwrap();
    assert_eq!(value_of(&mut c, "a").as_deref(), Some("10.0.0.7"));
    assert_eq!(value_of(&mut c, "b").as_deref(), Some("10.0.0.7"));
    assert_eq!(all(&mut c, &["VALUE", "10.0.0.8"]).unwrap(), Some(f));
    assert_eq!(value_of(&mut c, "a").as_deref(), Some("10.0.0.8"));
    assert_eq!(value_of(&mut c, "b").as_deref(), Some("10.0.0.8"));
    let before = digest(&mut c);
    let err = all(&mut c, &["SHARED", "VALUE", "v"]).unwrap_err();
    assert!(
        error_text(&err).contains("VALUE is for an exclusive"),
        "{err}"
    );
    assert_eq!(digest(&mut c), before);
}

#[test]
fn a_replica_gets_every_key() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.conn();
    let f = acquire_all(&mut m, &["a", "b", "c"], "t", 60_000).unwrap();
    assert_eq!(release_all(&mut m, &["b"], "t"), 1);
    let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(n, 1);
    let mut r = replica.conn();
    assert_eq!(fence(&mut r, "a"), Some(f));
    assert_eq!(fence(&mut r, "b"), None);
    assert_eq!(fence(&mut r, "c"), Some(f));
    assert_eq!(digest(&mut m), digest(&mut r));
    let e = run_err(&mut r, &["LOCK.ACQUIREALL", "1", "x", "t", "100"]);
    assert!(e.starts_with("READONLY"), "{e}");
}

/// Every key is declared (key specs): ACL key patterns apply to each.
#[test]
fn acl_key_patterns_apply_to_every_key() {
    let s = Server::start();
    let mut admin = s.conn();
    set_user(
        &mut admin,
        "app",
        &["~app:*", "+lock.acquireall", "+lock.releaseall"],
    );
    let mut c = login(&s, "app");
    assert!(acquire_all(&mut c, &["app:a", "app:b"], "t", 60_000).is_some());
    let e = run_err(
        &mut c,
        &["LOCK.ACQUIREALL", "2", "app:c", "other", "t", "100"],
    );
    assert!(e.starts_with("NOPERM"), "{e}");
    assert_eq!(fence(&mut admin, "app:c"), None);
    assert_eq!(release_all(&mut c, &["app:a", "app:b"], "t"), 2);
}

/// Redlock's second phase over several keys: a holder of every key asking
/// MINFENCE above its fence gets one fresh fence on every key, and the
/// node's next grant is above it.
#[test]
fn minfence_raises_a_holders_fence_on_every_key() {
    let s = Server::start();
    let mut c = s.conn();
    let f = acquire_all(&mut c, &["a", "b"], "t", 60_000).unwrap();
    let want = f + 1_000_000;
    let raised: i64 = redis::cmd("LOCK.ACQUIREALL")
        .arg(2)
        .arg("a")
        .arg("b")
        .arg("t")
        .arg(60_000)
        .arg("MINFENCE")
        .arg(want)
        .query(&mut c)
        .unwrap();
    assert!(raised >= want, "{raised} >= {want}");
    assert_eq!(fence(&mut c, "a"), Some(raised));
    assert_eq!(fence(&mut c, "b"), Some(raised));
    assert!(acquire(&mut c, "other", "u", 1000).unwrap() > raised);
}

/// Thousands of keys in one command: granted and released whole, in time
/// linear in the keys (a scan per output made it quadratic).
#[test]
fn many_keys_in_one_command() {
    let s = Server::start();
    let mut c = s.conn();
    let keys: Vec<String> = (0..20_000).map(|i| format!("{{many}}k{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let f = acquire_all(&mut c, &refs, "t", 60_000).unwrap();
    assert_eq!(fence(&mut c, "{many}k19999"), Some(f));
    assert_eq!(release_all(&mut c, &refs, "t"), 20_000);
    assert_eq!(s.info_field("locks"), 0);
}

/// A blocked multi-key waiter holds nothing while it waits, nobody passes
/// it on a key it waits for, and it is granted every key with one fence the
/// moment the last one frees.
#[test]
fn a_blocked_acquireall_holds_nothing_then_gets_every_key() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "b", "holder", 60_000).unwrap();
    let mut waiter = RawConn::connect(&s);
    waiter.send(&[
        "LOCK.ACQUIREALL",
        "2",
        "a",
        "b",
        "w",
        "60000",
        "BLOCK",
        "10000",
    ]);
    wait_until(std::time::Duration::from_secs(5), || {
        s.info_field("waiters") >= 1
    });
    assert_eq!(fence(&mut c, "a"), None, "holds nothing while it waits");
    // No barging past it on the free key, BLOCK or not.
    assert_eq!(acquire(&mut c, "a", "x", 1000), None);
    assert_eq!(acquire_all(&mut c, &["a", "z"], "x", 1000), None);
    let mut behind = RawConn::block_acquire(&s, "a", "y", 60_000, 10_000);
    assert_eq!(release(&mut c, "b", "holder"), 1);
    let Some(Resp::Int(f)) = waiter.read_within(std::time::Duration::from_secs(5)) else {
        panic!("the waiter was not granted");
    };
    assert_eq!(holder_and_fence(&mut c, "a"), Some(("w".into(), f)));
    assert_eq!(holder_and_fence(&mut c, "b"), Some(("w".into(), f)));
    // The single waiter behind it on a is next.
    assert_eq!(release_all(&mut c, &["a", "b"], "w"), 2);
    let Some(Resp::Int(g)) = behind.read_within(std::time::Duration::from_secs(5)) else {
        panic!("the next in line was not granted");
    };
    assert!(g > f);
}

/// A multi-key waiter whose timeout passes gets nil and leaves every line;
/// one that disconnects leaves them too: the keys it waited for are free
/// for the next caller at once.
#[test]
fn a_multi_key_waiter_that_times_out_or_goes_leaves_every_line() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "b", "holder", 60_000).unwrap();
    let mut waiter = RawConn::connect(&s);
    waiter.send(&[
        "LOCK.ACQUIREALL",
        "2",
        "a",
        "b",
        "w",
        "60000",
        "BLOCK",
        "100",
    ]);
    assert!(matches!(
        waiter.read_within(std::time::Duration::from_secs(5)),
        Some(Resp::Nil)
    ));
    assert_eq!(s.info_field("waiters"), 0);
    assert!(acquire(&mut c, "a", "x", 60_000).is_some(), "a is free");
    let gone = RawConn::connect(&s);
    let mut gone = gone;
    gone.send(&["LOCK.ACQUIREALL", "2", "c", "b", "w", "60000", "BLOCK", "0"]);
    wait_until(std::time::Duration::from_secs(5), || {
        s.info_field("waiters") == 1
    });
    drop(gone);
    wait_until(std::time::Duration::from_secs(5), || {
        s.info_field("waiters") == 0
    });
    assert!(acquire(&mut c, "c", "x", 60_000).is_some(), "c is free");
}

/// Two groups of clients take the same three keys in opposite orders,
/// each grant held for a moment: nobody waits out its BLOCK timeout (no
/// deadlock), no two clients ever hold a key at once, every client is
/// served, and the keys of one grant share its fence.
#[test]
fn opposite_orders_never_deadlock_or_overlap() {
    let s = Server::start();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let mut c = s.conn();
            std::thread::spawn(move || {
                let keys: Vec<&str> = match i % 2 {
                    0 => vec!["k1", "k2", "k3"],
                    _ => vec!["k3", "k2", "k1"],
                };
                let token = format!("t{i}");
                let mut grants = 0;
                while std::time::Instant::now() < deadline {
                    let f: Option<i64> = redis::cmd("LOCK.ACQUIREALL")
                        .arg(3)
                        .arg(&keys)
                        .arg(&token)
                        .arg(60_000)
                        .arg("BLOCK")
                        .arg(10_000)
                        .query(&mut c)
                        .unwrap();
                    let f = f.expect("granted before its BLOCK timeout");
                    for k in &keys {
                        assert_eq!(
                            holder_and_fence(&mut c, k),
                            Some((token.clone(), f)),
                            "{k} is all mine"
                        );
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    assert_eq!(release_all(&mut c, &keys, &token), 3);
                    grants += 1;
                }
                grants
            })
        })
        .collect();
    for t in threads {
        let grants = t.join().unwrap();
        assert!(grants > 0, "every client is served");
    }
}

/// A multi-key waiter whose user loses one of its keys (ACL SETUSER) while
/// it waits is refused (NOPERM) when its turn comes, and takes nothing.
#[test]
fn a_waiter_that_loses_one_key_to_acl_is_refused_at_its_turn() {
    let s = Server::start();
    let mut admin = s.conn();
    set_user(
        &mut admin,
        "app",
        &["~app:*", "+lock.acquireall", "+lock.releaseall"],
    );
    acquire(&mut admin, "app:b", "holder", 60_000).unwrap();
    let mut waiter = RawConn::connect(&s);
    waiter.send(&["AUTH", "app", "pw"]);
    assert!(matches!(
        waiter.read_within(std::time::Duration::from_secs(5)),
        Some(Resp::Simple(_))
    ));
    waiter.send(&[
        "LOCK.ACQUIREALL",
        "2",
        "app:a",
        "app:b",
        "w",
        "60000",
        "BLOCK",
        "10000",
    ]);
    wait_until(std::time::Duration::from_secs(5), || {
        s.info_field("waiters") == 1
    });
    set_user(
        &mut admin,
        "app",
        &["~app:a", "+lock.acquireall", "+lock.releaseall"],
    );
    assert_eq!(release(&mut admin, "app:b", "holder"), 1);
    let reply = waiter.read_within(std::time::Duration::from_secs(5));
    assert!(
        matches!(&reply, Some(Resp::Error(e)) if e.starts_with("NOPERM")),
        "{reply:?}"
    );
    assert_eq!(fence(&mut admin, "app:a"), None);
    assert_eq!(fence(&mut admin, "app:b"), None);
}

/// `lock.max-waiters-per-key` bounds each key's line for a multi-key
/// waiter too (LINEFULL, nothing queued); CLIENT UNBLOCK answers one nil
/// and it leaves every line.
#[test]
fn full_lines_refuse_and_client_unblock_leaves_every_line() {
    let s = Server::start();
    let mut c = s.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-waiters-per-key")
        .arg(1)
        .query(&mut c)
        .unwrap();
    acquire(&mut c, "b", "holder", 60_000).unwrap();
    let _first = RawConn::block_acquire(&s, "b", "w1", 60_000, 10_000);
    wait_until(std::time::Duration::from_secs(5), || {
        s.info_field("waiters") == 1
    });
    let e = run_err(
        &mut c,
        &[
            "LOCK.ACQUIREALL",
            "2",
            "a",
            "b",
            "w2",
            "60000",
            "BLOCK",
            "1000",
        ],
    );
    assert!(e.starts_with("LINEFULL"), "{e}");
    assert_eq!(s.info_field("waiters"), 1);
    let mut waiter = RawConn::connect(&s);
    waiter.send(&["CLIENT", "ID"]);
    let Some(Resp::Int(id)) = waiter.read_within(std::time::Duration::from_secs(5)) else {
        panic!("no client id");
    };
    acquire(&mut c, "c", "holder", 60_000).unwrap();
    waiter.send(&[
        "LOCK.ACQUIREALL",
        "2",
        "a",
        "c",
        "w3",
        "60000",
        "BLOCK",
        "0",
    ]);
    wait_until(std::time::Duration::from_secs(5), || {
        s.info_field("waiters") == 2
    });
    let unblocked: i64 = redis::cmd("CLIENT")
        .arg("UNBLOCK")
        .arg(id)
        .query(&mut c)
        .unwrap();
    assert_eq!(unblocked, 1);
    assert!(matches!(
        waiter.read_within(std::time::Duration::from_secs(5)),
        Some(Resp::Nil)
    ));
    assert_eq!(s.info_field("waiters"), 1);
    assert!(
        acquire(&mut c, "a", "x", 1000).is_some(),
        "a's line is empty"
    );
}

/// A hand-off to a multi-key waiter reaches the replica as every key with
/// the one fence.
#[test]
fn a_multi_key_hand_off_reaches_the_replica_whole() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.conn();
    acquire(&mut m, "b", "holder", 60_000).unwrap();
    let mut waiter = RawConn::connect(&master);
    waiter.send(&[
        "LOCK.ACQUIREALL",
        "2",
        "a",
        "b",
        "w",
        "60000",
        "BLOCK",
        "10000",
    ]);
    wait_until(std::time::Duration::from_secs(5), || {
        master.info_field("waiters") == 1
    });
    assert_eq!(release(&mut m, "b", "holder"), 1);
    let Some(Resp::Int(f)) = waiter.read_within(std::time::Duration::from_secs(5)) else {
        panic!("not granted");
    };
    let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(n, 1);
    let mut r = replica.conn();
    assert_eq!(holder_and_fence(&mut r, "a"), Some(("w".into(), f)));
    assert_eq!(holder_and_fence(&mut r, "b"), Some(("w".into(), f)));
    assert_eq!(digest(&mut m), digest(&mut r));
}
