//! `LOCK.ACQUIREALL numkeys key ... token ttl-ms [MINFENCE n]`: every key
//! with one fence, or none (nothing changed); `LOCK.RELEASEALL numkeys key
//! ... token`: how many it released. Each key is then an ordinary lock.
//! (BLOCK and SHARED are refused in this build.)

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
            vec!["LOCK.ACQUIREALL", "1", "a", "t", "100", "BLOCK", "5"],
            "BLOCK",
        ),
        (
            vec!["LOCK.ACQUIREALL", "1", "a", "t", "100", "SHARED"],
            "SHARED",
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
