//! Every command's replies, every bad-input case, key types, command
//! metadata, RESP2/RESP3, MULTI/EXEC and Lua, on a real server.

use redis_lock_testkit as common;

use common::*;
use std::thread::sleep;
use std::time::Duration;

#[test]
fn acquire_grants_then_returns_same_fence_to_holder_and_nil_to_others() {
    let s = Server::start();
    let mut c = s.conn();
    let f = acquire(&mut c, "order:1", "a", 10_000).expect("granted");
    assert!(f > 0);
    assert_eq!(acquire(&mut c, "order:1", "b", 10_000), None);
    assert_eq!(acquire(&mut c, "order:1", "a", 10_000), Some(f));
}

#[test]
fn reacquire_by_the_holder_resets_the_lease() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 1_000).unwrap();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let pttl: i64 = lease_ms(&mut c, "k");
    assert!(pttl > 50_000, "lease reset to 60 s, pttl {pttl}");
}

#[test]
fn release_only_by_the_holder() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(release(&mut c, "k", "a"), 0, "free lock");
    acquire(&mut c, "k", "a", 10_000).unwrap();
    assert_eq!(release(&mut c, "k", "b"), 0, "other holder");
    assert!(fence(&mut c, "k").is_some());
    assert_eq!(release(&mut c, "k", "a"), 1);
    assert_eq!(fence(&mut c, "k"), None);
    let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut c).unwrap();
    assert_eq!(exists, 0, "a released lock keeps no memory");
}

#[test]
fn extend_renews_only_the_live_holder_and_never_revives() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(extend(&mut c, "k", "a", 10_000), 0, "free lock");
    acquire(&mut c, "k", "a", 200).unwrap();
    assert_eq!(extend(&mut c, "k", "b", 10_000), 0, "other holder");
    assert_eq!(extend(&mut c, "k", "a", 60_000), 1);
    let pttl: i64 = lease_ms(&mut c, "k");
    assert!(pttl > 50_000);

    acquire(&mut c, "short", "a", 50).unwrap();
    sleep(Duration::from_millis(150));
    assert_eq!(
        extend(&mut c, "short", "a", 10_000),
        0,
        "expired: no revival"
    );
    assert_eq!(fence(&mut c, "short"), None);
}

#[test]
fn fence_reads_the_holder_and_checks_a_token_when_given() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(fence(&mut c, "k"), None);
    let f = acquire(&mut c, "k", "a", 10_000).unwrap();
    assert_eq!(fence(&mut c, "k"), Some(f));
    let mine: Option<i64> = redis::cmd("LOCK.FENCE")
        .arg("k")
        .arg("a")
        .query(&mut c)
        .unwrap();
    let theirs: Option<i64> = redis::cmd("LOCK.FENCE")
        .arg("k")
        .arg("b")
        .query(&mut c)
        .unwrap();
    assert_eq!((mine, theirs), (Some(f), None));
}

#[test]
fn info_is_a_flat_array_in_resp2_and_a_map_in_resp3() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(lock_info_reply(&mut c, "k"), Value::Nil);
    let before = now_ms();
    let f = acquire(&mut c, "k", "tok", 10_000).unwrap();
    let after = now_ms();

    let Value::Array(items) = lock_info_reply(&mut c, "k") else {
        panic!("RESP2 LOCK.INFO must be an array");
    };
    assert_eq!(items.len(), 22);
    let fields: Vec<(String, Value)> = items
        .chunks(2)
        .map(|p| {
            (
                redis::from_redis_value::<String>(&p[0]).unwrap(),
                p[1].clone(),
            )
        })
        .collect();
    assert_eq!(
        fields[0],
        ("token".into(), Value::BulkString(b"tok".to_vec()))
    );
    assert_eq!(fields[1], ("fence".into(), Value::Int(f)));
    assert_eq!(fields[2].0, "ttl");
    let Value::Int(ttl) = fields[2].1 else {
        panic!()
    };
    assert!(ttl > 0 && ttl <= 10_000);
    assert_eq!(fields[3], ("waiters".into(), Value::Int(0)));
    // When this holder was granted (Unix ms), kept by its renewals.
    assert_eq!(fields[4].0, "granted");
    let Value::Int(granted) = fields[4].1 else {
        panic!("{:?}", fields[4])
    };
    // Written out through the module's wall-clock conversion, which follows
    // the clocks' offset only once it moved by more than 5 ms (so a lease is
    // always written with the same deadline): within that of the wall clock.
    assert!(
        (before - 6..=after + 6).contains(&granted),
        "{before} {granted} {after}"
    );
    // Then the mode, the limit, and every holder (here the only one).
    assert_eq!(
        fields[5],
        ("mode".into(), Value::BulkString(b"exclusive".to_vec()))
    );
    assert_eq!(fields[6], ("limit".into(), Value::Nil));
    assert_eq!(fields[7].0, "holders");
    let Value::Array(holders) = &fields[7].1 else {
        panic!("{:?}", fields[7])
    };
    assert_eq!(holders.len(), 1);
    let Value::Array(holder) = &holders[0] else {
        panic!("{holders:?}")
    };
    assert_eq!(holder[..4], items[..4], "its token and fence");
    // Then the public value: none was given; last, how long the first in
    // line has waited: nobody waits.
    assert_eq!(fields[8], ("value".into(), Value::Nil));
    assert_eq!(fields[9], ("longest_wait".into(), Value::Nil));
    assert_eq!(
        fields[10],
        ("grants".into(), Value::Int(1)),
        "its one grant"
    );
    assert_eq!(
        holder[8..],
        [Value::BulkString(b"value".to_vec()), Value::Nil]
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(extend(&mut c, "k", "tok", 10_000), 1);
    assert_eq!(acquire(&mut c, "k", "tok", 10_000), Some(f));
    let Value::Array(items) = lock_info_reply(&mut c, "k") else {
        panic!()
    };
    assert_eq!(items[9], Value::Int(granted));

    let mut c3 = s.conn3();
    let Value::Map(map) = lock_info_reply(&mut c3, "k") else {
        panic!("RESP3 LOCK.INFO must be a map");
    };
    assert_eq!(map.len(), 11);
    assert_eq!(
        map[1],
        (Value::BulkString(b"fence".to_vec()), Value::Int(f))
    );
    let Value::Array(holders) = &map[7].1 else {
        panic!("{:?}", map[7])
    };
    assert!(
        matches!(&holders[..], [Value::Map(h)] if h[1] == map[1]),
        "each holder a map in RESP3: {holders:?}"
    );
    // The other commands answer the same in RESP3.
    assert_eq!(acquire(&mut c3, "k", "tok", 10_000), Some(f));
    assert_eq!(acquire(&mut c3, "k", "other", 10_000), None);
    assert_eq!(release(&mut c3, "k", "tok"), 1);
    assert_eq!(lock_info_reply(&mut c3, "k"), Value::Nil);
}

#[test]
fn a_lock_is_free_the_instant_its_lease_ends() {
    let s = Server::start();
    let mut c = s.conn();
    // Keep Redis from deleting the key itself: only the deadline decides.
    active_expire(&mut c, false);
    let f1 = acquire(&mut c, "k", "a", 100).unwrap();
    sleep(Duration::from_millis(150));
    assert_eq!(fence(&mut c, "k"), None);
    let f2 = acquire(&mut c, "k", "b", 10_000).expect("granted right after expiry");
    assert!(f2 > f1);
}

#[test]
fn expired_locks_are_reclaimed_like_expired_keys() {
    let s = Server::start();
    let mut c = s.conn();
    let mut pipe = redis::pipe();
    for i in 0..50_000 {
        pipe.cmd("LOCK.ACQUIRE")
            .arg(format!("job:{i}"))
            .arg("t")
            .arg(20)
            .ignore();
    }
    let _: () = pipe.query(&mut c).unwrap();
    wait_until(Duration::from_secs(30), || {
        let n: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
        n == 0
    });
    assert_eq!(s.info_field("locks"), 0);
    assert!(s.info_field("expirations") > 0);
}

#[test]
fn tokens_are_binary_safe_up_to_512_bytes() {
    let s = Server::start();
    let mut c = s.conn();
    let token = [0u8, 0xff, b'\r', b'\n', 7];
    let f: Option<i64> = redis::cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg(&token[..])
        .arg(10_000)
        .query(&mut c)
        .unwrap();
    assert!(f.is_some());
    let near: Option<i64> = redis::cmd("LOCK.FENCE")
        .arg("k")
        .arg(&token[..4])
        .query(&mut c)
        .unwrap();
    assert_eq!(near, None, "a prefix of the token is another token");
    let big = vec![b'x'; 512];
    let f: Option<i64> = redis::cmd("LOCK.ACQUIRE")
        .arg("k2")
        .arg(&big)
        .arg(10_000)
        .query(&mut c)
        .unwrap();
    assert!(f.is_some());
    let released: i64 = redis::cmd("LOCK.RELEASE")
        .arg("k")
        .arg(&token[..])
        .query(&mut c)
        .unwrap();
    assert_eq!(released, 1);
}

#[test]
fn fences_strictly_increase_across_release_expiry_del_and_flush() {
    let s = Server::start();
    let mut c = s.conn();
    let mut last = 0;
    let mut check = |f: i64| {
        assert!(f > last, "{f} after {last}");
        last = f;
    };
    check(acquire(&mut c, "a", "t", 10_000).unwrap());
    check(acquire(&mut c, "b", "t", 10_000).unwrap()); // node-wide, not per key
    release(&mut c, "a", "t");
    check(acquire(&mut c, "a", "t", 50).unwrap());
    sleep(Duration::from_millis(100));
    check(acquire(&mut c, "a", "u", 10_000).unwrap());
    let _: () = redis::cmd("DEL").arg("a").query(&mut c).unwrap();
    check(acquire(&mut c, "a", "v", 10_000).unwrap());
    let _: () = redis::cmd("UNLINK").arg("a").query(&mut c).unwrap();
    check(acquire(&mut c, "a", "w", 10_000).unwrap());
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    check(acquire(&mut c, "a", "x", 10_000).unwrap());
    let _: () = redis::cmd("FLUSHDB").arg("ASYNC").query(&mut c).unwrap();
    check(acquire(&mut c, "a", "y", 10_000).unwrap());
    assert_eq!(s.info_field("fence_hwm"), last);
}

#[test]
fn del_of_a_lock_key_is_an_administrative_release() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 10_000).unwrap();
    let n: i64 = redis::cmd("DEL").arg("k").query(&mut c).unwrap();
    assert_eq!(n, 1);
    assert!(acquire(&mut c, "k", "b", 10_000).is_some());
    assert_eq!(release(&mut c, "k", "a"), 0);
}

#[test]
fn a_lock_is_its_own_type_and_other_types_are_left_untouched() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "lk", "a", 10_000).unwrap();
    let t: String = redis::cmd("TYPE").arg("lk").query(&mut c).unwrap();
    assert_eq!(t, "redislock");
    assert!(run_err(&mut c, &["GET", "lk"]).starts_with("WRONGTYPE"));
    assert!(run_err(&mut c, &["INCR", "lk"]).starts_with("WRONGTYPE"));

    let _: () = redis::cmd("SET").arg("str").arg("v").query(&mut c).unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg("list")
        .arg("v")
        .query(&mut c)
        .unwrap();
    for key in ["str", "list"] {
        for cmd in [
            vec!["LOCK.ACQUIRE", key, "t", "1000"],
            vec!["LOCK.RELEASE", key, "t"],
            vec!["LOCK.EXTEND", key, "t", "1000"],
            vec!["LOCK.FENCE", key],
            vec!["LOCK.INFO", key],
        ] {
            assert!(run_err(&mut c, &cmd).starts_with("WRONGTYPE"), "{cmd:?}");
        }
    }
    let v: String = redis::cmd("GET").arg("str").query(&mut c).unwrap();
    assert_eq!(v, "v");
    let ttl: i64 = redis::cmd("PTTL").arg("str").query(&mut c).unwrap();
    assert_eq!(ttl, -1, "no expiry was set on the string");
}

/// Each bad input gets an error naming the problem and changes nothing.
#[test]
fn bad_input_is_rejected_with_a_named_error_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let f = acquire(&mut c, "k", "holder", 60_000).unwrap();
    let before = digest(&mut c);
    let big_token = "x".repeat(513);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["LOCK.ACQUIRE", "k", "t"], "wrong number of arguments"),
        (vec!["LOCK.ACQUIRE", "k"], "wrong number of arguments"),
        (vec!["LOCK.RELEASE", "k"], "wrong number of arguments"),
        (
            vec!["LOCK.RELEASE", "k", "t", "x"],
            "wrong number of arguments",
        ),
        (vec!["LOCK.EXTEND", "k", "t"], "wrong number of arguments"),
        (
            vec!["LOCK.EXTEND", "k", "t", "1", "2"],
            "unknown option '2'",
        ),
        (
            vec!["LOCK.EXTEND", "k", "t", "1", "VALUE", "v", "x"],
            "wrong number of arguments",
        ),
        (
            vec!["LOCK.EXTEND", "k", "t", "1", "VALUE"],
            "VALUE needs a value",
        ),
        (vec!["LOCK.FENCE"], "wrong number of arguments"),
        (
            vec!["LOCK.FENCE", "k", "t", "u"],
            "wrong number of arguments",
        ),
        (vec!["LOCK.INFO"], "wrong number of arguments"),
        (vec!["LOCK.INFO", "k", "x"], "wrong number of arguments"),
        (vec!["LOCK.ACQUIRE", "k", "t", "abc"], "ttl-ms"),
        (vec!["LOCK.ACQUIRE", "k", "t", "0"], "ttl-ms"),
        (vec!["LOCK.ACQUIRE", "k", "t", "-5"], "ttl-ms"),
        (vec!["LOCK.ACQUIRE", "k", "t", "1.5"], "ttl-ms"),
        (vec!["LOCK.ACQUIRE", "k", "t", " 100"], "ttl-ms"),
        (vec!["LOCK.ACQUIRE", "k", "t", "100 "], "ttl-ms"),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "99999999999999999999"],
            "ttl-ms",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "9223372036854775807"],
            "lock.max-ttl-ms",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "9300000000000000"],
            "lock.max-ttl-ms",
        ),
        (vec!["LOCK.EXTEND", "k", "holder", "0"], "ttl-ms"),
        (vec!["LOCK.EXTEND", "k", "holder", "x"], "ttl-ms"),
        (
            vec!["LOCK.EXTEND", "k", "holder", "9223372036854775807"],
            "lock.max-ttl-ms",
        ),
        (vec!["LOCK.ACQUIRE", "k", "", "100"], "token"),
        (vec!["LOCK.ACQUIRE", "k", &big_token, "100"], "token"),
        (vec!["LOCK.RELEASE", "k", ""], "token"),
        (vec!["LOCK.RELEASE", "k", &big_token], "token"),
        (vec!["LOCK.EXTEND", "k", "", "100"], "token"),
        (vec!["LOCK.FENCE", "k", ""], "token"),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "100", "NX"],
            "unknown option 'NX'",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "100", "FOO", "1"],
            "unknown option 'FOO'",
        ),
    ];
    for (cmd, needle) in cases {
        let err = run_err(&mut c, &cmd);
        assert!(err.starts_with("ERR "), "{cmd:?} -> {err}");
        assert!(
            err.contains(needle),
            "{cmd:?} -> {err} (expected {needle:?})"
        );
    }
    assert_eq!(digest(&mut c), before, "bad input changed the data");
    assert_eq!(fence(&mut c, "k"), Some(f));
    assert_eq!(s.info_field("fence_hwm"), f, "bad input issued a fence");
}

#[test]
fn the_internal_command_is_refused_from_clients_multi_and_lua() {
    let s = Server::start();
    let mut c = s.conn();
    let err = run_err(&mut c, &["LOCK._SET", "k", "t", "5", "99999999999999"]);
    assert!(err.contains("internal"), "{err}");
    let err = run_err(
        &mut c,
        &[
            "EVAL",
            "return redis.call('LOCK._SET', KEYS[1], 't', 5, 1)",
            "1",
            "k",
        ],
    );
    assert!(err.contains("internal"), "{err}");
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("LOCK._SET")
        .arg("k")
        .arg("t")
        .arg(5)
        .arg(1);
    let r: redis::RedisResult<Value> = pipe.query(&mut c);
    assert!(r.is_err() || format!("{r:?}").contains("internal"), "{r:?}");
    let n: i64 = redis::cmd("EXISTS").arg("k").query(&mut c).unwrap();
    assert_eq!(n, 0);
}

#[test]
fn commands_work_inside_multi_exec() {
    let s = Server::start();
    let mut c = s.conn();
    let (f1, nil, f2, released): (i64, Option<i64>, i64, i64) = redis::pipe()
        .atomic()
        .cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg("a")
        .arg(10_000)
        .cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg("b")
        .arg(10_000)
        .cmd("LOCK.FENCE")
        .arg("k")
        .cmd("LOCK.RELEASE")
        .arg("k")
        .arg("a")
        .query(&mut c)
        .unwrap();
    assert!(f1 > 0);
    assert_eq!(nil, None);
    assert_eq!(f2, f1);
    assert_eq!(released, 1);
}

#[test]
fn commands_work_from_lua() {
    let s = Server::start();
    let mut c = s.conn();
    let script = r"
        local f = redis.call('LOCK.ACQUIRE', KEYS[1], ARGV[1], 10000)
        local again = redis.call('LOCK.ACQUIRE', KEYS[1], 'other', 10000)
        local ext = redis.call('LOCK.EXTEND', KEYS[1], ARGV[1], 20000)
        local fence = redis.call('LOCK.FENCE', KEYS[1])
        return {f, tostring(again), ext, fence}
    ";
    let (f, again, ext, fence_now): (i64, String, i64, i64) = redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg("k")
        .arg("me")
        .query(&mut c)
        .unwrap();
    assert!(f > 0);
    assert_eq!(again, "false", "nil becomes false in Lua");
    assert_eq!(ext, 1);
    assert_eq!(fence_now, f);
    let err = run_err(
        &mut c,
        &[
            "EVAL",
            "return redis.call('LOCK.ACQUIRE', KEYS[1], 't', 0)",
            "1",
            "k2",
        ],
    );
    assert!(err.contains("ttl-ms"), "{err}");
}

/// Every internal command (what the module replicates and rewrites into
/// the AOF) names its key to the server, so a stream filtered by slot (a
/// replica's, Valkey 9's atomic slot migration, which drops a command whose
/// slot it cannot find) carries it with its key.
#[test]
fn every_internal_command_names_its_key() {
    use redis_lock_core::protocol::command;
    let s = Server::start();
    let mut c = s.conn();
    for (name, args) in [
        (
            command::SET,
            &["{m}lock", "tok", "5", "99999999999999", "0"][..],
        ),
        (
            command::SET_SHARED,
            &["{m}lock", "0", "tok", "5", "99999999999999", "0"][..],
        ),
        (
            command::HOLD,
            &["{m}lock", "0", "tok", "5", "99999999999999", "0"][..],
        ),
        (command::DROP, &["{m}lock", "tok"][..]),
        (command::GATE, &["{m}lock", "5"][..]),
    ] {
        let keys: Vec<String> = redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(name)
            .arg(args)
            .query(&mut c)
            .unwrap_or_else(|e| panic!("COMMAND GETKEYS {name}: {e}"));
        assert_eq!(keys, vec!["{m}lock"], "{name}");
    }
}

#[test]
fn command_metadata_declares_flags_arity_and_the_key() {
    let s = Server::start();
    let mut c = s.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("LOCK.ACQUIRE")
        .arg("order:1")
        .arg("t")
        .arg(100)
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, vec!["order:1"]);
    let info: Vec<Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("LOCK.ACQUIRE")
        .arg("LOCK.FENCE")
        .arg("LOCK.RELEASE")
        .query(&mut c)
        .unwrap();
    let text = format!("{info:?}");
    let flags_of = |v: &Value| -> (i64, Vec<String>) {
        let Value::Array(parts) = v else {
            panic!("{v:?}")
        };
        let arity = redis::from_redis_value(&parts[1]).unwrap();
        let flags = redis::from_redis_value(&parts[2]).unwrap();
        (arity, flags)
    };
    let (arity, flags) = flags_of(&info[0]);
    assert_eq!(arity, -4, "{text}");
    for f in ["write", "blocking"] {
        assert!(
            flags.contains(&f.to_string()),
            "acquire lacks {f}: {flags:?}"
        );
    }
    // It can block (so not fast), and a holder's renewal must work above
    // maxmemory (so not denyoom: new grants check OOM themselves).
    for f in ["fast", "denyoom"] {
        assert!(!flags.contains(&f.to_string()), "acquire is {f}: {flags:?}");
    }
    let (arity, flags) = flags_of(&info[1]);
    assert_eq!(arity, -2);
    assert!(flags.contains(&"readonly".to_string()) && flags.contains(&"fast".to_string()));
    let (arity, flags) = flags_of(&info[2]);
    assert_eq!(arity, 3);
    assert!(flags.contains(&"write".to_string()));
}

#[test]
fn acl_key_patterns_apply_to_lock_commands() {
    let s = Server::start();
    let mut admin = s.conn();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "worker",
            "on",
            "nopass",
            "~lock:*",
            "%R~view:*",
            "+lock.acquire",
            "+lock.fence",
            "+lock.release",
        ])
        .query(&mut admin)
        .unwrap();
    let mut w = s.conn();
    let _: () = redis::cmd("AUTH")
        .arg("worker")
        .arg("x")
        .query(&mut w)
        .unwrap();
    assert!(acquire(&mut w, "lock:1", "t", 10_000).is_some());
    assert!(run_err(&mut w, &["LOCK.ACQUIRE", "other", "t", "1000"]).starts_with("NOPERM"));
    acquire(&mut admin, "view:1", "t", 10_000).unwrap();
    assert!(
        fence(&mut w, "view:1").is_some(),
        "read-only key pattern allows LOCK.FENCE"
    );
    assert!(run_err(&mut w, &["LOCK.ACQUIRE", "view:1", "t", "1000"]).starts_with("NOPERM"));
    assert!(run_err(&mut w, &["LOCK.RELEASE", "view:1", "t"]).starts_with("NOPERM"));
    assert!(run_err(&mut w, &["LOCK.EXTEND", "lock:1", "t", "1000"]).starts_with("NOPERM"));
}

#[test]
fn info_lock_counts_what_happened() {
    if common::skip_unless(common::Needs::OwnServer, "counts INFO lock from zero") {
        return;
    }
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "a", "t", 10_000).unwrap();
    acquire(&mut c, "b", "t", 50).unwrap();
    acquire(&mut c, "a", "u", 10_000);
    acquire(&mut c, "a", "u", 10_000);
    extend(&mut c, "a", "t", 10_000);
    release(&mut c, "a", "t");
    sleep(Duration::from_millis(100));
    acquire(&mut c, "b", "t2", 10_000).unwrap(); // replaces the expired lease
    assert_eq!(s.info_field("grants"), 3);
    assert_eq!(s.info_field("contended"), 2);
    assert_eq!(s.info_field("releases"), 1);
    assert_eq!(s.info_field("extends"), 1);
    assert_eq!(s.info_field("expirations"), 1);
    assert_eq!(s.info_field("locks"), 1);
    assert!(s.info_field("fence_hwm") > 0);
    let text: String = redis::cmd("INFO").arg("lock").query(&mut c).unwrap();
    assert!(text.contains("# lock"), "{text}");
}

#[test]
fn memory_usage_and_digest_work_for_a_lock() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "some-token", 10_000).unwrap();
    let bytes: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("k")
        .query(&mut c)
        .unwrap();
    assert!(bytes > 10, "{bytes}");
    let d1 = digest(&mut c);
    assert_ne!(d1, "0".repeat(40));
    // Not the deadline: each node keeps it on its own monotonic clock, so
    // master and replica may differ by a millisecond.
    extend(&mut c, "k", "some-token", 20_000);
    assert_eq!(digest(&mut c), d1, "the deadline is not part of the digest");
    assert_eq!(release(&mut c, "k", "some-token"), 1);
    acquire(&mut c, "k", "some-token", 10_000).unwrap();
    assert_ne!(digest(&mut c), d1, "the fence is");
}

#[test]
fn memory_stays_flat_under_a_flood_of_malformed_commands() {
    let s = Server::start();
    let mut c = s.conn();
    let flood = |c: &mut Connection| {
        for _ in 0..10 {
            let mut pipe = redis::pipe();
            for i in 0..2_000 {
                match i % 4 {
                    0 => pipe.cmd("LOCK.ACQUIRE").arg("k").arg("t").arg("zz"),
                    1 => pipe.cmd("LOCK.ACQUIRE").arg("k").arg("").arg(10),
                    2 => pipe
                        .cmd("LOCK.ACQUIRE")
                        .arg("k")
                        .arg("t")
                        .arg(10)
                        .arg("BAD"),
                    _ => pipe.cmd("LOCK.EXTEND").arg("k").arg("t").arg(-1),
                };
            }
            let r: redis::RedisResult<Value> = pipe.query(c);
            assert!(r.is_err(), "every command in the flood is malformed");
        }
    };
    flood(&mut c); // warm up allocator caches
    let before = used_memory(&mut c);
    flood(&mut c);
    let after = used_memory(&mut c);
    assert!(
        after - before < 256 * 1024,
        "used_memory grew {before} -> {after}"
    );
    let n: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n, 0);
}

/// Found by Redis's own suite ("RESTORE can set LRU"): the module read
/// every RESTOREd key for its keyspace-event bookkeeping, which counted as
/// an access and wiped the IDLETIME the user had just set.
#[test]
fn keyspace_bookkeeping_does_not_touch_other_keys() {
    let s = Server::start();
    let mut c = s.conn();
    let _: () = redis::cmd("SET")
        .arg("plain")
        .arg("v")
        .query(&mut c)
        .unwrap();
    let payload: Vec<u8> = redis::cmd("DUMP").arg("plain").query(&mut c).unwrap();
    let _: () = redis::cmd("DEL").arg("plain").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("plain")
        .arg(0)
        .arg(payload)
        .arg("IDLETIME")
        .arg(1000)
        .query(&mut c)
        .unwrap();
    let idle: i64 = redis::cmd("OBJECT")
        .arg("IDLETIME")
        .arg("plain")
        .query(&mut c)
        .unwrap();
    assert!(idle >= 1000, "IDLETIME kept: {idle}");
}

/// The `arguments` of one command's COMMAND DOCS entry, each as its
/// (field, value) map flattened to strings.
fn documented_args(c: &mut Connection, name: &str) -> Vec<Vec<(String, String)>> {
    fn text(v: &Value) -> String {
        match v {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            Value::Int(i) => i.to_string(),
            Value::Array(items) | Value::Set(items) => {
                items.iter().map(text).collect::<Vec<_>>().join(",")
            }
            other => format!("{other:?}"),
        }
    }
    fn pairs(v: &Value) -> Vec<(Value, Value)> {
        match v {
            Value::Array(items) => items
                .chunks(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect(),
            Value::Map(m) => m.clone(),
            other => panic!("{other:?}"),
        }
    }
    let docs = run(c, &[b"COMMAND", b"DOCS", name.as_bytes()]).unwrap();
    let (_, entry) = pairs(&docs).into_iter().next().expect("an entry");
    let (_, args) = pairs(&entry)
        .into_iter()
        .find(|(k, _)| text(k) == "arguments")
        .expect("arguments");
    let Value::Array(args) = args else { panic!() };
    args.iter()
        .map(|a| pairs(a).iter().map(|(k, v)| (text(k), text(v))).collect())
        .collect()
}

/// COMMAND DOCS gives every command its arguments (names, types, the BLOCK
/// and MINFENCE options as optional tokens), which redis-cli shows as hints.
#[test]
fn command_docs_describe_every_argument() {
    let s = Server::start();
    let mut c = s.conn();
    // (name, type, token, optional) per argument.
    type Arg = (&'static str, &'static str, &'static str, bool);
    let expected: [(&str, &[Arg]); 6] = [
        (
            "lock.acquire",
            &[
                ("key", "key", "", false),
                ("token", "string", "", false),
                ("ttl-ms", "integer", "", false),
                ("shared", "pure-token", "SHARED", true),
                ("limit", "integer", "LIMIT", true),
                ("timeout-ms", "integer", "BLOCK", true),
                ("min-fence", "integer", "MINFENCE", true),
                ("value", "string", "VALUE", true),
            ],
        ),
        (
            "lock.release",
            &[("key", "key", "", false), ("token", "string", "", false)],
        ),
        (
            "lock.extend",
            &[
                ("key", "key", "", false),
                ("token", "string", "", false),
                ("ttl-ms", "integer", "", false),
                ("value", "string", "VALUE", true),
            ],
        ),
        (
            "lock.fence",
            &[("key", "key", "", false), ("token", "string", "", true)],
        ),
        ("lock.info", &[("key", "key", "", false)]),
        (
            "lock._set",
            &[
                ("key", "key", "", false),
                ("token", "string", "", false),
                ("fence", "integer", "", false),
                ("deadline-ms", "integer", "", false),
                ("granted-ms", "integer", "", true),
                ("value", "string", "", true),
            ],
        ),
    ];
    for (name, want) in expected {
        let got = documented_args(&mut c, name);
        assert_eq!(got.len(), want.len(), "{name}: {got:?}");
        for (arg, (n, ty, token, optional)) in got.iter().zip(want) {
            let field = |f: &str| {
                arg.iter()
                    .find(|(k, _)| k == f)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            assert_eq!(field("name"), *n, "{name}: {arg:?}");
            assert_eq!(field("type"), *ty, "{name}: {arg:?}");
            assert_eq!(field("token"), *token, "{name}: {arg:?}");
            assert_eq!(
                field("flags").contains("optional"),
                *optional,
                "{name}: {arg:?}"
            );
            assert!(!field("summary").is_empty(), "{name}: {arg:?}");
        }
    }
}

/// What a person sees in redis-cli: typing a lock command shows the
/// remaining arguments as a hint (redis-cli reads them from COMMAND DOCS).
#[test]
fn redis_cli_shows_argument_hints() {
    let have = |cmd: &str, flag: &str| {
        std::process::Command::new(cmd)
            .arg(flag)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have("tmux", "-V") || !have("redis-cli", "--version") {
        panic!("tmux and redis-cli are needed (scripts/prereqs.sh test installs them)");
    }
    let s = Server::start();
    let session = format!("lockhint{}", s.port);
    let tmux = |args: &[&str]| {
        std::process::Command::new("tmux")
            .args(args)
            .output()
            .expect("tmux")
    };
    let port = s.port.to_string();
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "160",
        "-y",
        "5",
        "redis-cli",
        "-p",
        &port,
    ]);
    let capture = || {
        String::from_utf8_lossy(&tmux(&["capture-pane", "-t", &session, "-p"]).stdout).into_owned()
    };
    let prompt = format!("127.0.0.1:{port}>");
    wait_until(Duration::from_secs(10), || capture().contains(&prompt));
    let screen = |typed: &str| {
        tmux(&["send-keys", "-t", &session, "C-u", typed]);
        let mut last = String::new();
        for _ in 0..50 {
            sleep(Duration::from_millis(100));
            last = capture();
            if last.contains(typed) && last.contains('[') {
                break;
            }
        }
        last
    };
    let acquire = screen("LOCK.ACQUIRE orders:1 ");
    let fence = screen("LOCK.FENCE orders:1 ");
    tmux(&["kill-session", "-t", &session]);
    assert!(
        acquire
            .contains("LOCK.ACQUIRE orders:1 token ttl-ms [SHARED] [LIMIT limit] [BLOCK timeout-ms] [MINFENCE min-fence]"),
        "{acquire}"
    );
    assert!(fence.contains("LOCK.FENCE orders:1 [token]"), "{fence}");
}

/// `INFO lock` histograms: cumulative power-of-two buckets (`le_1` ...
/// `le_1048576`, `le_inf`) with `_count` and `_sum` (ms), for the time
/// BLOCK waiters waited (`wait_ms`) and the time holders held (`hold_ms`:
/// to release, or to the lease's end when it ran out).
#[test]
fn info_lock_has_wait_and_hold_histograms() {
    if common::skip_unless(common::Needs::OwnServer, "counts INFO lock from zero") {
        return;
    }
    let s = Server::start();
    let mut c = s.conn();
    let buckets = |name: &str| -> Vec<(i64, i64)> {
        let mut out: Vec<(i64, i64)> = (0..=20)
            .map(|i| (1i64 << i, s.info_field(&format!("{name}_le_{}", 1i64 << i))))
            .collect();
        out.push((i64::MAX, s.info_field(&format!("{name}_le_inf"))));
        out
    };
    for name in ["wait_ms", "hold_ms"] {
        assert!(buckets(name).iter().all(|(_, n)| *n == 0), "{name}");
        assert_eq!(s.info_field(&format!("{name}_count")), 0);
    }
    // Held about 300 ms, then released; the waiter waited about as long.
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let mut w = RawConn::block_acquire(&s, "k", "w", 200, 10_000);
    sleep(Duration::from_millis(300));
    assert_eq!(release(&mut c, "k", "a"), 1);
    assert!(matches!(w.read(), Resp::Int(_)));
    // W's 200 ms lease runs out: held for exactly its lease.
    wait_until(Duration::from_secs(10), || {
        s.info_field("hold_ms_count") == 2
    });
    assert_eq!(s.info_field("wait_ms_count"), 1);
    let wait_sum = s.info_field("wait_ms_sum");
    assert!((250..10_000).contains(&wait_sum), "{wait_sum}");
    let hold_sum = s.info_field("hold_ms_sum");
    assert!((450..10_200).contains(&hold_sum), "{hold_sum}");
    for name in ["wait_ms", "hold_ms"] {
        let b = buckets(name);
        assert!(b.windows(2).all(|p| p[0].1 <= p[1].1), "cumulative: {b:?}");
        assert_eq!(b.last().unwrap().1, s.info_field(&format!("{name}_count")));
        // Nothing took under 128 ms.
        assert_eq!(b[6], (64, 0), "{name}: {b:?}");
    }
    // The expired 200 ms lease is in the le_256 bucket exactly.
    let hold = buckets("hold_ms");
    assert!(hold[8].1 >= 1, "{hold:?}");
}

// Regression tests of defects found by attacking the module (issue 8 and
// later): each reproduces an attack or an unlucky schedule that broke
// mutual exclusion or crashed the server before its fix.

/// Issue 8, defect 4: a huge BLOCK timeout left a phantom waiter (Valkey), and a huge
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

/// Every command's info (arity, key spec, docs) is accepted by the server
/// at load: `LOCK.FENCED`'s was refused at every start (its gate's key
/// spec set both INSERT and UPDATE, which exclude each other), leaving it
/// arity -1, no key spec and no COMMAND DOCS, with only a line in the log.
#[test]
fn the_server_accepts_every_commands_info() {
    let s = Server::start();
    let mut c = s.conn();
    let v = s.version();
    let names: Vec<String> = redis::cmd("COMMAND")
        .arg("LIST")
        .arg("FILTERBY")
        .arg("PATTERN")
        .arg("lock.*")
        .query(&mut c)
        .unwrap();
    assert!(names.len() >= 12, "{v}: {names:?}");
    for name in &names {
        let info: Vec<Value> = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(&mut c)
            .unwrap();
        let Value::Array(parts) = &info[0] else {
            panic!("{v} {name}: {info:?}")
        };
        let arity: i64 = redis::from_redis_value(&parts[1]).unwrap();
        assert_ne!(arity, -1, "{v} {name}: no arity declared");
        // The key specs (the 9th field) name at least the first key; the
        // keyless LOCK.SCAN (each node its own, as SCAN) names none.
        let Value::Array(specs) = &parts[8] else {
            panic!("{v} {name}: {parts:?}")
        };
        let keyless = name == "lock.scan";
        assert_eq!(specs.is_empty(), keyless, "{v} {name}: key specs {specs:?}");
        let docs = run(&mut c, &[b"COMMAND", b"DOCS", name.as_bytes()]).unwrap();
        assert!(
            format!("{docs:?}").contains("summary"),
            "{v} {name}: no COMMAND DOCS: {docs:?}"
        );
    }
    let info: Vec<Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("LOCK.FENCED")
        .query(&mut c)
        .unwrap();
    let text = format!("{info:?}");
    assert!(text.contains("int(-3)"), "{v}: {text}");
    for flag in ["RW", "access", "update"] {
        assert!(
            text.contains(flag),
            "{v}: LOCK.FENCED's gate lacks {flag}: {text}"
        );
    }
    let log = s.log();
    assert!(
        !log.contains("refused the command info") && !log.contains("are not declared"),
        "{v}: {log}"
    );
}

/// Each user-facing command has its page, docs/commands/<name>.md
/// (RedisJSON's naming), whose syntax line names every argument and option
/// word that COMMAND DOCS gives it (issue 33: the pages are kept in step
/// with the command table that feeds COMMAND DOCS); the internal ones are
/// on docs/commands/internal.md, and the index lists them all.
#[test]
fn every_command_has_a_page_in_step_with_its_command_docs() {
    let s = Server::start();
    let mut c = s.conn();
    let root = workspace_root().join("docs/commands");
    let index = std::fs::read_to_string(root.join("README.md")).expect("docs/commands/README.md");
    let internal = std::fs::read_to_string(root.join("internal.md")).expect("internal.md");
    let names: Vec<String> = redis::cmd("COMMAND")
        .arg("LIST")
        .arg("FILTERBY")
        .arg("PATTERN")
        .arg("lock.*")
        .query(&mut c)
        .unwrap();
    let mut pages = 0;
    for name in &names {
        let upper = name.to_uppercase();
        if name.starts_with("lock._") {
            assert!(internal.contains(&upper), "internal.md lacks {upper}");
            continue;
        }
        let page = std::fs::read_to_string(root.join(format!("{name}.md")))
            .unwrap_or_else(|e| panic!("docs/commands/{name}.md: {e}"));
        let syntax = page
            .split("```text\n")
            .nth(1)
            .and_then(|b| b.lines().next())
            .unwrap_or_else(|| panic!("{name}.md has no syntax block"));
        assert!(syntax.starts_with(&upper), "{name}.md: {syntax}");
        for arg in documented_args(&mut c, name) {
            let field = |k: &str| {
                arg.iter()
                    .find(|(f, _)| f == k)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            let word = match field("token") {
                t if !t.is_empty() => t,
                _ => field("name"),
            };
            assert!(
                syntax.to_lowercase().contains(&word.to_lowercase()),
                "{name}.md's syntax `{syntax}` lacks {word} (COMMAND DOCS)"
            );
        }
        assert!(
            index.contains(&format!("{name}.md")),
            "the index lacks {name}"
        );
        pages += 1;
    }
    assert!(pages >= 9, "{pages} pages");
}
