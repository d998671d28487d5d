//! `LOCK.SCAN cursor [MATCH pattern] [COUNT n] [WAITING]` (issue 35): the
//! node's held locks a page at a time, from its index of leases, not a walk
//! of the keyspace; complete under concurrent change as `SCAN` is (a lock
//! held from the first page to the last is listed); each entry as
//! `LOCK.INFO` shows it with its key; only keys the user may read, tokens
//! only where it may write.

use redis_lock_testkit as common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use redis::Value;

/// One entry of a page: its fields by name.
type Entry = BTreeMap<String, Value>;

fn entry_of(v: &Value) -> Entry {
    let Value::Array(items) = v else {
        panic!("an entry is a flat map on RESP2: {v:?}")
    };
    items
        .chunks_exact(2)
        .map(|p| {
            (
                redis::from_redis_value::<String>(&p[0]).unwrap(),
                p[1].clone(),
            )
        })
        .collect()
}

/// One page: the next cursor and the entries.
fn page(
    c: &mut Connection,
    cursor: &str,
    options: &[&str],
) -> redis::RedisResult<(String, Vec<Entry>)> {
    let v: Value = redis::cmd("LOCK.SCAN").arg(cursor).arg(options).query(c)?;
    let Value::Array(parts) = v else {
        panic!("{v:?}")
    };
    let cursor: String = redis::from_redis_value(&parts[0]).unwrap();
    let Value::Array(entries) = &parts[1] else {
        panic!("{parts:?}")
    };
    Ok((cursor, entries.iter().map(entry_of).collect()))
}

/// Every page from cursor 0; the entries and how many pages it took.
fn scan_all(c: &mut Connection, options: &[&str]) -> (Vec<Entry>, usize) {
    let (mut cursor, mut all, mut pages) = ("0".to_string(), Vec::new(), 0);
    loop {
        let (next, entries) = page(c, &cursor, options).unwrap();
        all.extend(entries);
        pages += 1;
        if next == "0" {
            return (all, pages);
        }
        cursor = next;
    }
}

fn key_of(e: &Entry) -> String {
    redis::from_redis_value(&e["key"]).unwrap()
}

fn keys(entries: &[Entry]) -> BTreeSet<String> {
    entries.iter().map(key_of).collect()
}

fn int(e: &Entry, field: &str) -> Option<i64> {
    redis::from_redis_value(&e[field]).unwrap()
}

#[test]
fn every_held_lock_is_listed_from_the_index_not_the_keyspace() {
    let s = Server::start();
    let mut c = s.conn();
    // 100,000 other keys: a walk of the keyspace would need thousands of
    // pages of 100 to find five locks; the index has them in one.
    populate(&mut c, 100_000);
    let mut fences = BTreeMap::new();
    for (key, ttl) in [("a", 60_000), ("b", 5_000), ("c", 3_600_000), ("d", 100)] {
        fences.insert(key.to_string(), acquire(&mut c, key, "t", ttl).unwrap());
    }
    acquire(&mut c, "gone", "t", 60_000).unwrap();
    assert_eq!(release(&mut c, "gone", "t"), 1);
    acquire(&mut c, "retyped", "t", 60_000).unwrap();
    let _: () = redis::cmd("SET")
        .arg("retyped")
        .arg("v")
        .query(&mut c)
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200)); // d's lease ends
    let (first, entries) = page(&mut c, "0", &["COUNT", "100"]).unwrap();
    assert_eq!(first, "0", "one page holds the index's few entries");
    assert_eq!(keys(&entries), ["a", "b", "c"].map(String::from).into());
    for e in &entries {
        let key = key_of(e);
        assert_eq!(int(e, "fence"), Some(fences[&key]), "{key}");
        let token: Option<String> = redis::from_redis_value(&e["token"]).unwrap();
        assert_eq!(token.as_deref(), Some("t"));
        assert!(int(e, "ttl").unwrap() > 0);
        assert_eq!(int(e, "waiters"), Some(0));
        assert_eq!(e["longest_wait"], Value::Nil);
        let mode: String = redis::from_redis_value(&e["mode"]).unwrap();
        assert_eq!(mode, "exclusive");
    }
    // An entry's fields are LOCK.INFO's, with the key first.
    let info = lock_info_reply(&mut c, "a");
    let Value::Array(info) = info else { panic!() };
    let a = entries.iter().find(|e| key_of(e) == "a").unwrap();
    assert_eq!(a.len(), info.len() / 2 + 1);
}

#[test]
fn match_waiting_and_dbs_choose_what_is_listed() {
    let s = Server::start();
    let mut c = s.conn();
    for key in ["orders:1", "orders:2", "jobs:1"] {
        acquire(&mut c, key, "holder", 60_000).unwrap();
    }
    let mut waiter = RawConn::connect(&s);
    waiter.send(&["LOCK.ACQUIRE", "orders:2", "w", "1000", "BLOCK", "0"]);
    wait_until(std::time::Duration::from_secs(5), || {
        s.info_field("waiters") == 1
    });
    std::thread::sleep(std::time::Duration::from_millis(30));
    let (orders, _) = scan_all(&mut c, &["MATCH", "orders:*"]);
    assert_eq!(
        keys(&orders),
        ["orders:1", "orders:2"].map(String::from).into()
    );
    let (waiting, _) = scan_all(&mut c, &["WAITING"]);
    assert_eq!(keys(&waiting), ["orders:2".to_string()].into());
    assert_eq!(int(&waiting[0], "waiters"), Some(1));
    // (Whole ms: the wait is read a fraction of one short.)
    let waited = int(&waiting[0], "longest_wait").unwrap();
    assert!(waited >= 25, "{:?}", waiting[0]);
    let (none, _) = scan_all(&mut c, &["WAITING", "MATCH", "jobs:*"]);
    assert!(none.is_empty());
    // Another db's locks are its own; SWAPDB takes them along.
    let mut other = s.conn();
    let _: () = redis::cmd("SELECT").arg(1).query(&mut other).unwrap();
    acquire(&mut other, "db1:lock", "t", 60_000).unwrap();
    assert_eq!(
        keys(&scan_all(&mut other, &[]).0),
        ["db1:lock".to_string()].into()
    );
    assert_eq!(scan_all(&mut c, &[]).0.len(), 3);
    let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut c).unwrap();
    assert_eq!(
        keys(&scan_all(&mut c, &[]).0),
        ["db1:lock".to_string()].into()
    );
    assert_eq!(scan_all(&mut other, &[]).0.len(), 3);
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    assert!(scan_all(&mut c, &[]).0.is_empty());
    // The waiter, first in a line whose lock the flush freed, holds it.
    let (left, _) = scan_all(&mut other, &[]);
    assert_eq!(keys(&left), ["orders:2".to_string()].into());
    let token: Option<String> = redis::from_redis_value(&left[0]["token"]).unwrap();
    assert_eq!(token.as_deref(), Some("w"));
}

#[test]
fn a_shared_lock_lists_every_holder() {
    let s = Server::start();
    let mut c = s.conn();
    for token in ["r1", "r2"] {
        let f: Option<i64> = redis::cmd("LOCK.ACQUIRE")
            .arg("sem")
            .arg(token)
            .arg(60_000)
            .arg("SHARED")
            .arg("LIMIT")
            .arg(3)
            .query(&mut c)
            .unwrap();
        assert!(f.is_some());
    }
    let (entries, _) = scan_all(&mut c, &[]);
    assert_eq!(entries.len(), 1);
    let mode: String = redis::from_redis_value(&entries[0]["mode"]).unwrap();
    assert_eq!(mode, "shared");
    assert_eq!(int(&entries[0], "limit"), Some(3));
    let Value::Array(holders) = &entries[0]["holders"] else {
        panic!()
    };
    assert_eq!(holders.len(), 2);
}

/// A user sees only the keys it may read, and tokens only where it may
/// write.
#[test]
fn acl_limits_what_a_user_sees() {
    let s = Server::start();
    let mut admin = s.conn();
    for key in ["app:1", "app:2", "secret:1"] {
        acquire(&mut admin, key, "t", 60_000).unwrap();
    }
    set_user(&mut admin, "reader", &["%R~app:*", "+lock.scan"]);
    set_user(&mut admin, "writer", &["~app:*", "+lock.scan"]);
    let (seen, _) = scan_all(&mut login(&s, "reader"), &[]);
    assert_eq!(keys(&seen), ["app:1", "app:2"].map(String::from).into());
    for e in &seen {
        assert_eq!(e["token"], Value::Nil, "a reader sees no token");
        assert!(int(e, "fence").unwrap() > 0, "but the fence");
    }
    let (written, _) = scan_all(&mut login(&s, "writer"), &[]);
    assert_eq!(keys(&written), ["app:1", "app:2"].map(String::from).into());
    for e in &written {
        let token: Option<String> = redis::from_redis_value(&e["token"]).unwrap();
        assert_eq!(token.as_deref(), Some("t"));
    }
    set_user(&mut admin, "nobody", &["~app:*", "+lock.info"]);
    let err = page(&mut login(&s, "nobody"), "0", &[]).unwrap_err();
    assert!(error_text(&err).starts_with("NOPERM"), "{err}");
}

#[test]
fn bad_arguments_are_refused_by_name() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "t", 60_000).unwrap();
    let before = digest(&mut c);
    for (args, wanted) in [
        (&["x"][..], "invalid cursor 'x'"),
        (&["-1"][..], "invalid cursor '-1'"),
        (&["0", "COUNT", "0"][..], "invalid COUNT '0'"),
        (&["0", "COUNT"][..], "COUNT needs its argument"),
        (&["0", "MATCH"][..], "MATCH needs its argument"),
        (&["0", "TYPE", "string"][..], "unknown option 'TYPE'"),
        (&["0", "WAITING", "WAITING"][..], "unknown option 'WAITING'"),
        (
            &["0", "MATCH", &"*".repeat(1025)][..],
            "invalid MATCH: 1025 bytes",
        ),
    ] {
        let err = page(&mut c, args[0], &args[1..]).unwrap_err();
        assert!(error_text(&err).contains(wanted), "{args:?}: {err}");
    }
    let err = redis::cmd("LOCK.SCAN").query::<Value>(&mut c).unwrap_err();
    assert!(
        error_text(&err).contains("wrong number of arguments"),
        "{err}"
    );
    // A cursor no page answered is no error: it pages from there.
    assert!(page(&mut c, "123456789", &[]).is_ok());
    assert_eq!(digest(&mut c), before);
}

/// Randomized: 50 locks held throughout (renewed longer and shorter as
/// they go) among others granted, released and renewed between pages of
/// a few entries: every one of the 50 is listed, and every entry listed was
/// held when its page was read.
#[test]
fn a_lock_held_throughout_a_scan_is_listed_under_concurrent_change() {
    let s = Server::start();
    let mut c = s.conn();
    let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for round in 0..5 {
        let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
        let kept: Vec<String> = (0..50).map(|i| format!("kept:{i}")).collect();
        for k in &kept {
            acquire(&mut c, k, "t", 1_000 + next(120_000) as i64).unwrap();
        }
        let mut held: BTreeSet<String> = kept.iter().cloned().collect();
        let (mut cursor, mut seen) = ("0".to_string(), BTreeSet::new());
        loop {
            let count = (1 + next(4)).to_string();
            let (next_cursor, entries) = page(&mut c, &cursor, &["COUNT", &count]).unwrap();
            for e in &entries {
                let key = key_of(e);
                assert!(
                    held.contains(&key),
                    "round {round}: {key} listed but not held"
                );
                seen.insert(key);
            }
            for _ in 0..8 {
                let i = next(80);
                match i {
                    // A kept lock renewed, shorter or longer (never ending).
                    0..=49 => {
                        let ttl = 2_000 + next(120_000) as i64;
                        assert!(acquire(&mut c, &kept[i as usize], "t", ttl).is_some());
                    }
                    _ => {
                        let key = format!("other:{i}");
                        if held.remove(&key) {
                            release(&mut c, &key, "t");
                        } else {
                            acquire(&mut c, &key, "t", 1_000 + next(60_000) as i64).unwrap();
                            held.insert(key);
                        }
                    }
                }
            }
            if next_cursor == "0" {
                break;
            }
            cursor = next_cursor;
        }
        for k in &kept {
            assert!(seen.contains(k), "round {round}: {k} missed");
        }
    }
}

#[test]
fn a_replica_lists_its_masters_locks() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.conn();
    acquire(&mut m, "k1", "t", 60_000).unwrap();
    acquire(&mut m, "k2", "t", 60_000).unwrap();
    master.wait_acknowledged(1, "scratch");
    let (entries, _) = scan_all(&mut replica.conn(), &[]);
    assert_eq!(keys(&entries), ["k1", "k2"].map(String::from).into());
}

/// A lock key renamed or moved to another db keeps no entry under its new
/// name; the sweep, walking the keyspace, files it, so it is listed (here
/// within a few passes of a small keyspace) and its end is reclaimed on
/// time from then on. (COPY of a lock key is refused: the type has no copy
/// callback, so a copy cannot duplicate a holder's token.)
#[test]
fn a_renamed_or_moved_lock_is_listed_once_the_sweep_finds_it() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "old", "t", 60_000).unwrap();
    acquire(&mut c, "moving", "t", 60_000).unwrap();
    let _: () = redis::cmd("RENAME")
        .arg("old")
        .arg("new")
        .query(&mut c)
        .unwrap();
    let moved: i64 = redis::cmd("MOVE")
        .arg("moving")
        .arg(1)
        .query(&mut c)
        .unwrap();
    assert_eq!(moved, 1);
    let mut db1 = s.conn();
    let _: () = redis::cmd("SELECT").arg(1).query(&mut db1).unwrap();
    wait_until(std::time::Duration::from_secs(15), || {
        keys(&scan_all(&mut c, &[]).0) == ["new".to_string()].into()
            && keys(&scan_all(&mut db1, &[]).0) == ["moving".to_string()].into()
    });
}

/// A burst of grants with one TTL lands in one slot of the index: pages
/// of COUNT 100 still hold at most 100 locks each, and all are listed.
#[test]
fn a_burst_in_one_slot_is_paged_by_count() {
    let s = Server::start();
    let mut c = s.conn();
    let mut pipe = redis::pipe();
    for i in 0..2_000 {
        pipe.cmd("LOCK.ACQUIRE")
            .arg(format!("burst:{i}"))
            .arg("t")
            .arg(60_000);
    }
    let _: Vec<i64> = pipe.query(&mut c).unwrap();
    let (mut cursor, mut seen, mut pages) = ("0".to_string(), BTreeSet::new(), 0);
    loop {
        let (next, entries) = page(&mut c, &cursor, &["COUNT", "100"]).unwrap();
        assert!(entries.len() <= 100, "{} in one page", entries.len());
        seen.extend(keys(&entries));
        pages += 1;
        if next == "0" {
            break;
        }
        cursor = next;
    }
    assert_eq!(seen.len(), 2_000);
    assert!(pages >= 20, "{pages} pages");
}

/// `grants`: every grant of the key on this node, freed between them or
/// not (a released lock's key leaves the keyspace, its count does not), a
/// hand-off included; a renewal is not a grant; another key and another
/// db count apart. `LOCK.INFO` and `LOCK.SCAN` show the same count.
#[test]
fn a_locks_grants_are_counted_across_its_frees() {
    let s = Server::start();
    let mut c = s.conn();
    let info_grants = |c: &mut Connection, key: &str| {
        let Value::Array(items) = lock_info_reply(c, key) else {
            panic!("{key} is held")
        };
        let fields: Entry = entry_of(&Value::Array(items));
        int(&fields, "grants")
    };
    for _ in 0..3 {
        acquire(&mut c, "hot", "t", 60_000).unwrap();
        assert_eq!(release(&mut c, "hot", "t"), 1);
    }
    acquire(&mut c, "hot", "t", 60_000).unwrap();
    assert_eq!(info_grants(&mut c, "hot"), Some(4));
    assert_eq!(extend(&mut c, "hot", "t", 60_000), 1);
    acquire(&mut c, "hot", "t", 60_000).unwrap(); // the holder again: a renewal
    assert_eq!(
        info_grants(&mut c, "hot"),
        Some(4),
        "renewals are not grants"
    );
    // A hand-off is a grant.
    let mut waiter = RawConn::block_acquire(&s, "hot", "w", 60_000, 0);
    wait_until(std::time::Duration::from_secs(10), || {
        s.info_field("waiters") == 1
    });
    assert_eq!(release(&mut c, "hot", "t"), 1);
    assert!(
        matches!(waiter.read(), Resp::Int(_)),
        "the waiter was handed it"
    );
    assert_eq!(info_grants(&mut c, "hot"), Some(5));
    let (_, entries) = page(&mut c, "0", &["MATCH", "hot"]).unwrap();
    assert_eq!(int(&entries[0], "grants"), Some(5), "LOCK.SCAN's the same");
    // Another key, and the same name in another db, count apart.
    acquire(&mut c, "cold", "t", 60_000).unwrap();
    assert_eq!(info_grants(&mut c, "cold"), Some(1));
    let _: () = redis::cmd("SELECT").arg(1).query(&mut c).unwrap();
    acquire(&mut c, "hot", "t", 60_000).unwrap();
    assert_eq!(info_grants(&mut c, "hot"), Some(1));
}
