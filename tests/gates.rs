//! A gate keeps its mark (issue 31, items 3 to 5): through eviction under
//! any policy set at runtime, through a restart from an RDB older than the
//! last mark, and through a failover; and a replica runs no guarded
//! command against its copy of a lease. Every fence here is a real one,
//! from `LOCK.ACQUIRE`: the floor a restart puts under every gate applies
//! to fences issued by a clock.

use redis_lock_testkit as common;

use std::time::Duration;

use common::*;

fn config_set(c: &mut Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(c)
        .unwrap();
}

/// `LOCK.FENCED gate fence` (check and record): Ok, or the error's text.
fn fenced(c: &mut Connection, gate: &str, fence: i64) -> Result<(), String> {
    redis::cmd("LOCK.FENCED")
        .arg(gate)
        .arg(fence)
        .query::<()>(c)
        .map_err(|e| error_text(&e))
}

fn stale(c: &mut Connection, gate: &str, fence: i64) -> bool {
    match fenced(c, gate, fence) {
        Err(e) if e.starts_with("STALEFENCE") => true,
        Err(e) => panic!("{gate} {fence}: {e}"),
        Ok(()) => false,
    }
}

/// A fence issued now by the server (a throwaway lock).
fn issue_fence(c: &mut Connection) -> i64 {
    let token = format!("t{}", now_ms());
    let f = acquire(c, "fence-source", &token, 60_000).expect("a grant");
    release(c, "fence-source", &token);
    f
}

/// Fills the server past `maxmemory` until it has evicted at least `n`
/// keys (a value per SET, so every write evicts).
fn evict_at_least(c: &mut Connection, n: i64) {
    let start = info_number(c, "stats", "evicted_keys");
    let blob = "x".repeat(4096);
    let mut i = 0;
    while info_number(c, "stats", "evicted_keys") < start + n {
        for _ in 0..50 {
            let _: redis::RedisResult<()> = redis::cmd("SET")
                .arg(format!("filler:{i}"))
                .arg(&blob)
                .query(c);
            i += 1;
        }
        assert!(i < 1_000_000, "nothing evicted");
    }
}

/// Raises `n` gates to `fence`; returns their names.
fn raise_gates(c: &mut Connection, n: usize, fence: i64) -> Vec<String> {
    (0..n)
        .map(|i| {
            let g = format!("gate:{i}");
            fenced(c, &g, fence).unwrap();
            g
        })
        .collect()
}

/// Under a policy that evicts any key, set at runtime with
/// `lock.allow-eviction no`, gates were evicted (200 of 200) and then
/// accepted a stale fence. Now an evicted gate's mark is kept and the
/// gate put back: every gate refuses a fence below its mark, and is in
/// the keyspace again with it.
#[test]
fn gates_evicted_by_a_policy_set_at_runtime_come_back_with_their_marks() {
    for policy in ["allkeys-random", "allkeys-lru", "allkeys-lfu"] {
        let s = Server::start();
        let v = s.version();
        let mut c = s.conn();
        let f = issue_fence(&mut c);
        let gates = raise_gates(&mut c, 200, f);
        config_set(&mut c, "maxmemory-policy", policy);
        let used = used_memory(&mut c);
        config_set(&mut c, "maxmemory", &(used + 200_000).to_string());
        evict_at_least(&mut c, 2_000);
        // Evicting: gates are refused meanwhile, as before.
        for g in ["new-gate", &gates[0]] {
            let e = fenced(&mut c, g, f).unwrap_err();
            assert!(e.contains("maxmemory-policy"), "{v}: {e}");
        }
        // Back under noeviction: every gate, evicted or not, refuses the
        // stale fence at once (whether or not the timer put it back yet).
        let mut raw = RawConn::connect(&s);
        let f1 = (f - 1).to_string();
        let mut batch: Vec<Vec<&str>> = vec![
            vec!["CONFIG", "SET", "maxmemory", "0"],
            vec!["CONFIG", "SET", "maxmemory-policy", "noeviction"],
        ];
        batch.extend(gates.iter().map(|g| vec!["LOCK.FENCED", g.as_str(), &f1]));
        let batch: Vec<&[&str]> = batch.iter().map(|a| &a[..]).collect();
        raw.pipeline(&batch);
        for (i, _) in batch.iter().enumerate() {
            let reply = raw.read();
            if i >= 2 {
                assert!(
                    matches!(&reply, Resp::Error(e) if e.starts_with("STALEFENCE")),
                    "{v} {policy}: {} took a stale fence: {reply:?}",
                    gates[i - 2]
                );
            }
        }
        let put_back = s.info_field("gates_put_back");
        assert!(put_back > 0, "{v} {policy}: no gate was evicted");
        wait_until(Duration::from_secs(10), || {
            gates.iter().all(|g| fence(&mut c, g) == Some(f))
        });
        for g in &gates {
            assert!(stale(&mut c, g, f - 1), "{v} {policy}: {g}");
            assert_eq!(fenced(&mut c, g, f), Ok(()), "{v}: the holder writes on");
        }
        alive(&s);
    }
}

/// `volatile-*` evicts only keys with an expiry: a gate a user gave one is
/// evicted too, and comes back (without the expiry) with its mark. A
/// gate's own expiry coming due removes it, as the user asked.
#[test]
fn a_gate_with_an_expiry_evicted_under_volatile_comes_back() {
    let s = Server::start();
    let v = s.version();
    let mut c = s.conn();
    let f = issue_fence(&mut c);
    let gates = raise_gates(&mut c, 50, f);
    for g in &gates {
        let _: i64 = redis::cmd("EXPIRE").arg(g).arg(3600).query(&mut c).unwrap();
    }
    config_set(&mut c, "maxmemory-policy", "volatile-random");
    // Fill first with keys of no expiry, then squeeze: only the gates can go.
    let blob = "x".repeat(4096);
    for i in 0..100 {
        let _: () = redis::cmd("SET")
            .arg(format!("data:{i}"))
            .arg(&blob)
            .query(&mut c)
            .unwrap();
    }
    let used = used_memory(&mut c);
    config_set(&mut c, "maxmemory", &(used - 2_000).to_string());
    // Any write command makes the server evict first.
    for _ in 0..20 {
        let _: redis::RedisResult<()> = redis::cmd("SET").arg("probe").arg(1).query(&mut c);
    }
    assert!(
        info_number(&mut c, "stats", "evicted_keys") > 0,
        "{v}: nothing was evicted"
    );
    for g in &gates {
        assert!(stale(&mut c, g, f - 1), "{v}: {g} took a stale fence");
    }
    config_set(&mut c, "maxmemory", "0");
    assert!(s.info_field("gates_put_back") > 0, "{v}");
    wait_until(Duration::from_secs(10), || {
        gates.iter().all(|g| fence(&mut c, g) == Some(f))
    });
    // A user's expiry coming due removes the gate: DEL's rule.
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(&gates[0])
        .arg(1)
        .query(&mut c)
        .unwrap();
    wait_until(Duration::from_secs(10), || {
        !redis::cmd("EXISTS")
            .arg(&gates[0])
            .query::<bool>(&mut c)
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(50));
    let exists: bool = redis::cmd("EXISTS").arg(&gates[0]).query(&mut c).unwrap();
    assert!(!exists, "{v}: an expired gate stays removed");
}

/// A restart from an RDB older than the last mark: the gate came back
/// with its saved mark, below the one it had accepted, and a holder whose
/// fence lay between the two wrote again; a gate made since the save was
/// gone and took any fence. After a load every gate refuses a clock fence
/// issued before it, and takes those issued after.
#[test]
fn after_a_restart_from_an_older_rdb_no_fence_from_before_it_passes() {
    let mut s = Server::builder()
        .config("save", "")
        .config("appendonly", "no")
        .start();
    let v = s.version();
    let mut c = s.conn();
    let a = acquire(&mut c, "job", "a", 60_000).unwrap();
    fenced(&mut c, "gate", a).unwrap();
    // A counter of the user's own, not a clock's.
    fenced(&mut c, "counted", 5000).unwrap();
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    // a pauses; its lease ends; b is granted and writes. Not saved.
    release(&mut c, "job", "a");
    let b = acquire(&mut c, "job", "b", 60_000).unwrap();
    assert!(b > a);
    fenced(&mut c, "gate", b).unwrap();
    fenced(&mut c, "made-since", b).unwrap();
    fenced(&mut c, "counted", 5010).unwrap();
    s.kill9();
    s.restart();
    let mut c = s.conn();
    assert_eq!(fence(&mut c, "gate"), Some(a), "{v}: the RDB's mark");
    // a wakes up: refused everywhere.
    assert!(stale(&mut c, "gate", a), "{v}: the stale holder wrote");
    assert!(stale(&mut c, "made-since", a), "{v}");
    // b's fence, issued before the restart, is refused too: b takes a
    // lock again (its grant was lost with the data; the RDB's is a's).
    assert!(stale(&mut c, "gate", b), "{v}");
    let c2 = issue_fence(&mut c);
    assert!(c2 > b);
    assert_eq!(fenced(&mut c, "gate", c2), Ok(()), "{v}");
    assert_eq!(fenced(&mut c, "made-since", c2), Ok(()), "{v}");
    assert!(stale(&mut c, "gate", b), "{v}");
    // Counters are the user's to keep: the saved mark rules them.
    assert_eq!(fenced(&mut c, "counted", 5005), Ok(()), "{v}");
    let e = fenced(&mut c, "counted", 4999).unwrap_err();
    assert!(e.starts_with("STALEFENCE"), "{v}: {e}");
}

/// A failover before the last `LOCK.FENCED` reached the replica: the
/// promoted node refuses every clock fence issued before its promotion.
/// (Before, a holder whose fence lay between the lost mark and the one it
/// kept could write until some newer holder did.)
#[test]
fn a_promoted_replica_refuses_fences_issued_before_its_promotion() {
    let master = Server::start();
    let replica = Server::start();
    let v = master.version();
    replica.replicate_from(&master);
    let mut m = master.conn();
    let a = acquire(&mut m, "job", "a", 60_000).unwrap();
    fenced(&mut m, "gate", a).unwrap();
    master.wait_acknowledged(1, "scratch");
    let mut r = replica.conn();
    assert_eq!(fence(&mut r, "gate"), Some(a), "{v}");
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut r)
        .unwrap();
    assert!(stale(&mut r, "gate", a), "{v}: a pre-failover fence passed");
    assert!(stale(&mut r, "other-gate", a), "{v}");
    release(&mut r, "job", "a");
    let b = acquire(&mut r, "job", "b", 60_000).unwrap();
    assert_eq!(fenced(&mut r, "gate", b), Ok(()), "{v}");
}

/// `LOCK.EXEC` on a replica with `replica-read-only no` checked the
/// replica's copy of the lease and wrote locally; `LOCK.FENCED` was
/// refused there. Both are refused now, nothing written.
#[test]
fn a_writable_replica_runs_no_guarded_command() {
    let master = Server::start();
    let replica = Server::builder().config("replica-read-only", "no").start();
    let v = master.version();
    replica.replicate_from(&master);
    let mut m = master.conn();
    let f = acquire(&mut m, "k", "t", 60_000).unwrap();
    master.wait_acknowledged(1, "scratch");
    let mut r = replica.conn();
    assert_eq!(fence(&mut r, "k"), Some(f), "{v}");
    let e = run_err(&mut r, &["LOCK.EXEC", "k", "t", "SET", "d", "x"]);
    assert!(e.starts_with("READONLY"), "{v}: {e}");
    let e = run_err(&mut r, &["LOCK.EXEC", "k", "t", "GET", "d"]);
    assert!(e.starts_with("READONLY"), "{v}: {e}");
    let e = run_err(
        &mut r,
        &["LOCK.FENCED", "g", &f.to_string(), "SET", "d", "x"],
    );
    assert!(e.starts_with("READONLY"), "{v}: {e}");
    let d: Option<String> = redis::cmd("GET").arg("d").query(&mut r).unwrap();
    assert_eq!(d, None, "{v}: nothing written on the replica");
}
