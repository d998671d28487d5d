//! `LOCK.ACQUIRE key token ttl-ms MINFENCE n`: the token granted, or held
//! by the same token, is raised to at least n, and so is the node's mark.
//! Redlock's quorum fencing rests on it.

use redis_lock_testkit as common;

use std::time::Duration;

use common::*;

fn acquire_min(c: &mut Connection, key: &str, token: &str, ttl: i64, n: i64) -> Option<i64> {
    redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg(token)
        .arg(ttl)
        .arg("MINFENCE")
        .arg(n)
        .query(c)
        .unwrap()
}

fn hwm(s: &Server) -> i64 {
    s.info_field("fence_hwm")
}

#[test]
fn a_grant_with_minfence_is_at_least_n_and_later_grants_exceed_it() {
    let s = Server::start();
    let mut c = s.conn();
    let now = acquire(&mut c, "warmup", "w", 1000).unwrap();
    let n = now + 10_000_000_000; // ~3 hours of µs ahead of the clock
    assert_eq!(acquire_min(&mut c, "k", "a", 60_000, n), Some(n));
    assert_eq!(fence(&mut c, "k"), Some(n));
    assert!(hwm(&s) >= n);
    // Every later grant on this node, on any key, is above n.
    let other = acquire(&mut c, "other", "b", 1000).unwrap();
    assert!(other > n, "{other} > {n}");
    assert_eq!(release(&mut c, "k", "a"), 1);
    let again = acquire(&mut c, "k", "c", 1000).unwrap();
    assert!(again > other);
}

#[test]
fn minfence_raises_the_holders_token_and_renews_its_lease() {
    if common::skip_unless(common::Needs::OwnServer, "counts INFO lock from zero") {
        return;
    }
    let s = Server::start();
    let mut c = s.conn();
    let first = acquire(&mut c, "k", "a", 1000).unwrap();
    let t = first + 5_000_000;
    assert_eq!(acquire_min(&mut c, "k", "a", 60_000, t), Some(t));
    assert_eq!(fence(&mut c, "k"), Some(t));
    let pttl: i64 = lease_ms(&mut c, "k");
    assert!(pttl > 1000, "lease renewed to 60 s: {pttl}");
    // Not above the current token: the same token, lease renewed.
    assert_eq!(acquire_min(&mut c, "k", "a", 60_000, first), Some(t));
    assert_eq!(s.info_field("grants"), 1);
}

#[test]
fn a_contended_minfence_changes_nothing_not_even_the_mark() {
    let s = Server::start();
    let mut c = s.conn();
    let f = acquire(&mut c, "k", "a", 60_000).unwrap();
    let mark = hwm(&s);
    assert_eq!(
        acquire_min(&mut c, "k", "b", 60_000, f + 1_000_000_000),
        None
    );
    assert_eq!(hwm(&s), mark);
    assert_eq!(fence(&mut c, "k"), Some(f));
}

#[test]
fn bad_minfence_values_are_refused_and_change_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let f = acquire(&mut c, "k", "a", 60_000).unwrap();
    let mark = hwm(&s);
    for (n, expected) in [
        ("0", "ERR invalid MINFENCE '0'"),
        ("-5", "ERR invalid MINFENCE '-5'"),
        ("abc", "ERR invalid MINFENCE 'abc'"),
        ("1e9", "ERR invalid MINFENCE '1e9'"),
        (
            "9223372036854775807",
            "ERR invalid MINFENCE '9223372036854775807': more than 2^50",
        ),
    ] {
        let err = run_err(&mut c, &["LOCK.ACQUIRE", "k", "a", "1000", "MINFENCE", n]);
        assert!(err.starts_with(expected), "{n}: {err}");
        let err = run_err(
            &mut c,
            &["LOCK.ACQUIRE", "free", "a", "1000", "MINFENCE", n],
        );
        assert!(err.starts_with(expected), "{n}: {err}");
    }
    let err = run_err(&mut c, &["LOCK.ACQUIRE", "k", "a", "1000", "MINFENCE"]);
    assert_eq!(err, "ERR MINFENCE needs a fencing token n");
    assert_eq!(hwm(&s), mark);
    assert_eq!(fence(&mut c, "k"), Some(f));
    assert_eq!(fence(&mut c, "free"), None);
}

#[test]
fn a_waiter_with_minfence_is_granted_at_least_n() {
    let s = Server::start();
    let mut c = s.conn();
    let f = acquire(&mut c, "k", "a", 60_000).unwrap();
    let n = f + 7_000_000_000;
    let mut w = RawConn::connect(&s);
    w.send(&[
        "LOCK.ACQUIRE",
        "k",
        "w",
        "60000",
        "BLOCK",
        "20000",
        "MINFENCE",
        &n.to_string(),
    ]);
    wait_until(Duration::from_secs(10), || s.info_field("waiters") == 1);
    assert_eq!(release(&mut c, "k", "a"), 1);
    assert_eq!(w.read(), Resp::Int(n));
    assert_eq!(fence(&mut c, "k"), Some(n));
}

#[test]
fn minfence_is_replicated_and_persisted() {
    if common::skip_unless(common::Needs::OwnServer, "starts a replica beside it") {
        return;
    }
    let master = Server::builder()
        .config("appendonly", "yes")
        .config("appendfsync", "always")
        .start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut c = master.conn();
    let f = acquire(&mut c, "k", "a", 60_000).unwrap();
    let t = f + 3_000_000_000;
    assert_eq!(acquire_min(&mut c, "k", "a", 60_000, t), Some(t));
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut c).unwrap();
    assert_eq!(acked, 1);
    assert_eq!(fence(&mut replica.conn(), "k"), Some(t));
    assert!(hwm(&replica) >= t);
    let mut master = master;
    master.wait_persistence_idle();
    master.kill9();
    master.restart();
    let mut c = master.conn();
    assert_eq!(fence(&mut c, "k"), Some(t));
    let next = acquire(&mut c, "other", "b", 1000).unwrap();
    assert!(next > t, "{next} > {t} after restart");
}

/// Found by the argv fuzzer: when MINFENCE was bounded by the mark, each
/// call could raise the mark by 2^50, and about 8,200 calls used up every
/// fencing token of the node for good. It is bounded by the clock now.
#[test]
fn repeated_minfence_cannot_ratchet_the_mark_to_exhaustion() {
    let s = Server::start();
    let mut c = s.conn();
    let mut accepted = 0;
    for i in 0..200 {
        let n = hwm(&s).saturating_add(1 << 50).to_string();
        let reply: redis::RedisResult<Option<i64>> = redis::cmd("LOCK.ACQUIRE")
            .arg(format!("k{i}"))
            .arg("t")
            .arg(1000)
            .arg("MINFENCE")
            .arg(&n)
            .query(&mut c);
        match reply {
            Ok(_) => accepted += 1,
            Err(e) => assert!(error_text(&e).contains("above the clock"), "{e}"),
        }
    }
    assert!(accepted <= 1, "{accepted} raises of 2^50 accepted");
    assert!(acquire(&mut c, "after", "t", 1000).is_some(), "tokens left");
}

/// Found by the argv fuzzer: an argv longer than the longest valid one had
/// its tail cut and silently ignored.
#[test]
fn arguments_after_minfence_and_block_are_not_ignored() {
    let s = Server::start();
    let mut c = s.conn();
    for extra in 1..4 {
        let mut args = vec![
            "LOCK.ACQUIRE",
            "k",
            "t",
            "100",
            "BLOCK",
            "5",
            "MINFENCE",
            "7",
        ];
        args.extend(std::iter::repeat_n("junk", extra));
        let err = run_err(&mut c, &args);
        assert!(err.starts_with("ERR "), "{err}");
    }
    assert_eq!(fence(&mut c, "k"), None);
}

/// Issue 15, defect 4: a renewal with MINFENCE equal to another lock's token
/// must not give the holder that very token: two locks never share one.
#[test]
fn a_renewal_raised_by_minfence_never_duplicates_a_token() {
    let s = Server::start();
    let mut c = s.conn();
    let fa = acquire(&mut c, "a", "TA", 60_000).unwrap();
    let fb = acquire(&mut c, "b", "TB", 60_000).unwrap();
    assert!(fb > fa);
    let raised = acquire_min(&mut c, "a", "TA", 60_000, fb).unwrap();
    assert!(raised >= fb, "at least MINFENCE");
    assert_ne!(raised, fb, "not the token lock b holds");
    assert_eq!(fence(&mut c, "a"), Some(raised));
    assert_eq!(fence(&mut c, "b"), Some(fb));
    assert!(hwm(&s) >= raised);
    let next = acquire(&mut c, "c", "TC", 1000).unwrap();
    assert!(next > raised);
}
