//! Shared holders: `LOCK.ACQUIRE key token ttl-ms SHARED [LIMIT n]`. Many
//! readers hold a key at once, each with a fence of its own; a writer (no
//! SHARED) holds it alone; with LIMIT the key is a counting semaphore. One
//! FIFO line serves both. RELEASE, EXTEND, FENCE and EXEC work per holder.

use std::time::Duration;

use redis_lock_testkit as common;

use common::*;

/// `LOCK.ACQUIRE key token ttl SHARED [LIMIT n]`: the fence, nil, or the
/// error's text.
fn shared(
    c: &mut Connection,
    key: &str,
    token: &str,
    ttl: i64,
    limit: Option<u32>,
) -> Result<Option<i64>, String> {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(token).arg(ttl).arg("SHARED");
    if let Some(n) = limit {
        cmd.arg("LIMIT").arg(n);
    }
    cmd.query(c).map_err(|e| error_text(&e))
}

fn fence_of(c: &mut Connection, key: &str, token: &str) -> Option<i64> {
    redis::cmd("LOCK.FENCE")
        .arg(key)
        .arg(token)
        .query(c)
        .unwrap()
}

/// A map of `LOCK.INFO`'s reply (RESP2 flat array or RESP3 map) by name.
fn fields(v: &Value) -> Vec<(String, Value)> {
    let pairs: Vec<(Value, Value)> = match v {
        Value::Array(items) => items
            .chunks(2)
            .map(|p| (p[0].clone(), p[1].clone()))
            .collect(),
        Value::Map(pairs) => pairs.clone(),
        other => panic!("not a map: {other:?}"),
    };
    pairs
        .into_iter()
        .map(|(k, v)| (redis::from_redis_value::<String>(&k).unwrap(), v))
        .collect()
}

fn field(fields: &[(String, Value)], name: &str) -> Value {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name} in {fields:?}"))
        .1
        .clone()
}

/// `LOCK.INFO`'s mode, limit and holders (token, fence), in grant order.
fn info_holders(c: &mut Connection, key: &str) -> (String, Option<i64>, Vec<(String, i64)>) {
    let reply = lock_info_reply(c, key);
    let f = fields(&reply);
    let mode: String = redis::from_redis_value(&field(&f, "mode")).unwrap();
    let limit: Option<i64> = redis::from_redis_value(&field(&f, "limit")).unwrap();
    let Value::Array(holders) = field(&f, "holders") else {
        panic!("holders is not an array: {f:?}");
    };
    let holders = holders
        .iter()
        .map(|h| {
            let h = fields(h);
            let token: String = redis::from_redis_value(&field(&h, "token")).unwrap();
            let fence: i64 = redis::from_redis_value(&field(&h, "fence")).unwrap();
            (token, fence)
        })
        .collect();
    (mode, limit, holders)
}

#[test]
fn readers_share_a_key_each_with_its_own_fence_and_keep_a_writer_out() {
    let s = Server::start();
    let mut c = s.conn();
    let r1 = shared(&mut c, "k", "r1", 60_000, None).unwrap().unwrap();
    let r2 = shared(&mut c, "k", "r2", 60_000, None).unwrap().unwrap();
    assert!(r2 > r1, "every grant a fence above every earlier one");
    assert_eq!(acquire(&mut c, "k", "w", 60_000), None, "the writer waits");
    assert_eq!(fence_of(&mut c, "k", "r1"), Some(r1));
    assert_eq!(fence_of(&mut c, "k", "r2"), Some(r2));
    assert_eq!(fence(&mut c, "k"), Some(r2), "without a token: the newest");
    // The same reader again renews and keeps its fence.
    assert_eq!(shared(&mut c, "k", "r1", 60_000, None), Ok(Some(r1)));
    assert_eq!(extend(&mut c, "k", "r1", 90_000), 1);
    assert_eq!(extend(&mut c, "k", "w", 90_000), 0);
    assert_eq!(release(&mut c, "k", "w"), 0);
    assert_eq!(release(&mut c, "k", "r2"), 1);
    assert_eq!(fence_of(&mut c, "k", "r2"), None);
    assert_eq!(
        info_holders(&mut c, "k"),
        ("shared".into(), None, vec![("r1".into(), r1)])
    );
    assert_eq!(acquire(&mut c, "k", "w", 60_000), None);
    assert_eq!(release(&mut c, "k", "r1"), 1);
    let w = acquire(&mut c, "k", "w", 60_000).unwrap();
    assert!(w > r2);
    assert_eq!(
        info_holders(&mut c, "k"),
        ("exclusive".into(), None, vec![("w".into(), w)])
    );
    // A writer holds it: no reader.
    assert_eq!(shared(&mut c, "k", "r3", 60_000, None), Ok(None));
}

#[test]
fn a_limit_caps_the_holders_and_is_the_keys_until_its_last_holder_goes() {
    let s = Server::start();
    let mut c = s.conn();
    let a = shared(&mut c, "sem", "a", 60_000, Some(2))
        .unwrap()
        .unwrap();
    shared(&mut c, "sem", "b", 60_000, Some(2))
        .unwrap()
        .unwrap();
    assert_eq!(shared(&mut c, "sem", "c", 60_000, Some(2)), Ok(None));
    let before = digest(&mut c);
    for (limit, named) in [(Some(3), "LIMIT 3"), (None, "no LIMIT")] {
        let err = shared(&mut c, "sem", "c", 60_000, limit).unwrap_err();
        assert!(
            err.starts_with("ERR ") && err.contains("LIMIT 2") && err.contains(named),
            "{err}"
        );
    }
    assert_eq!(digest(&mut c), before, "a refused request changes nothing");
    assert_eq!(release(&mut c, "sem", "b"), 1);
    let c3 = shared(&mut c, "sem", "c", 60_000, Some(2))
        .unwrap()
        .unwrap();
    assert!(c3 > a);
    assert_eq!(
        info_holders(&mut c, "sem"),
        (
            "shared".into(),
            Some(2),
            vec![("a".into(), a), ("c".into(), c3)]
        )
    );
    release(&mut c, "sem", "a");
    release(&mut c, "sem", "c");
    assert_eq!(fence(&mut c, "sem"), None);
    // The key went with its last holder: the next grant sets the limit.
    shared(&mut c, "sem", "d", 60_000, Some(5))
        .unwrap()
        .unwrap();
    assert_eq!(info_holders(&mut c, "sem").1, Some(5));
}

/// `lock.max-holders-per-key` caps every shared key, LIMIT or not; a
/// lower value leaves the holders a key has, and lets none join.
#[test]
fn the_node_bound_caps_every_shared_key_and_a_lower_one_takes_nobody_away() {
    let s = Server::start();
    let mut c = s.conn();
    for t in ["a", "b", "c"] {
        shared(&mut c, "k", t, 60_000, None).unwrap().unwrap();
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-holders-per-key")
        .arg(2)
        .query(&mut c)
        .unwrap();
    assert_eq!(info_holders(&mut c, "k").2.len(), 3, "nobody is taken away");
    assert_eq!(shared(&mut c, "k", "d", 60_000, None), Ok(None));
    release(&mut c, "k", "a");
    assert_eq!(shared(&mut c, "k", "d", 60_000, None), Ok(None), "still 2");
    release(&mut c, "k", "b");
    assert!(shared(&mut c, "k", "d", 60_000, None).unwrap().is_some());
    // LIMIT 5 on a node bound of 2: two at once.
    shared(&mut c, "sem", "x", 60_000, Some(5))
        .unwrap()
        .unwrap();
    shared(&mut c, "sem", "y", 60_000, Some(5))
        .unwrap()
        .unwrap();
    assert_eq!(shared(&mut c, "sem", "z", 60_000, Some(5)), Ok(None));
}

#[test]
fn a_writer_downgrades_keeping_its_fence_and_nobody_upgrades() {
    let s = Server::start();
    let mut c = s.conn();
    let w = acquire(&mut c, "k", "w", 60_000).unwrap();
    assert_eq!(shared(&mut c, "k", "w", 60_000, None), Ok(Some(w)));
    let r = shared(&mut c, "k", "r", 60_000, None).unwrap().unwrap();
    assert!(r > w);
    let before = digest(&mut c);
    let up = run_err(&mut c, &["LOCK.ACQUIRE", "k", "w", "60000"]);
    assert!(up.contains("no upgrade"), "{up}");
    assert_eq!(digest(&mut c), before);
    assert_eq!(info_holders(&mut c, "k").0, "shared");
}

/// The longest ACQUIRE: every option applies, none is dropped; one word
/// more is refused.
#[test]
fn every_option_of_the_longest_acquire_applies() {
    let s = Server::start();
    let mut c = s.conn();
    let floor = acquire(&mut c, "other", "t", 1000).unwrap() + 1_000_000;
    let floor = floor.to_string();
    let args = [
        "LOCK.ACQUIRE",
        "k",
        "r",
        "60000",
        "SHARED",
        "LIMIT",
        "2",
        "BLOCK",
        "0",
        "MINFENCE",
        &floor,
    ];
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let got = run(&mut c, &args).unwrap();
    assert_eq!(got, Value::Int(floor.parse().unwrap()));
    assert_eq!(info_holders(&mut c, "k").1, Some(2));
    let mut longer = args.clone();
    longer.push(b"SHARED");
    let err = run(&mut c, &longer).unwrap_err();
    assert!(error_text(&err).contains("unknown option"), "{err}");
}

#[test]
fn bad_input_is_refused_naming_the_problem_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    shared(&mut c, "k", "r", 60_000, Some(2)).unwrap();
    let before = digest(&mut c);
    for (args, says) in [
        (
            &["LOCK.ACQUIRE", "k", "x", "100", "LIMIT", "2"][..],
            "LIMIT needs SHARED",
        ),
        (
            &["LOCK.ACQUIRE", "k", "x", "100", "SHARED", "LIMIT", "0"],
            "invalid LIMIT '0'",
        ),
        (
            &["LOCK.ACQUIRE", "k", "x", "100", "SHARED", "LIMIT", "-3"],
            "invalid LIMIT",
        ),
        (
            &["LOCK.ACQUIRE", "k", "x", "100", "SHARED", "LIMIT"],
            "LIMIT needs a number",
        ),
        (
            &["LOCK.ACQUIRE", "k", "x", "100", "SHARED", "SHARED"],
            "unknown option",
        ),
        (
            &["LOCK._SHARED", "k", "-1", "x", "5", "99999999999", "0"],
            "internal",
        ),
    ] {
        let err = run_err(&mut c, args);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(digest(&mut c), before);
}

#[test]
fn one_fifo_line_serves_readers_together_and_a_writer_alone() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "first", 60_000).unwrap();
    let send = |token: &str, mode: &[&str]| {
        let mut w = RawConn::connect(&s);
        let mut args = vec!["LOCK.ACQUIRE", "k", token, "60000"];
        args.extend_from_slice(mode);
        args.extend_from_slice(&["BLOCK", "30000"]);
        w.send(&args);
        w
    };
    let mut r1 = send("r1", &["SHARED", "LIMIT", "2"]);
    let mut r2 = send("r2", &["SHARED", "LIMIT", "2"]);
    let mut r3 = send("r3", &["SHARED", "LIMIT", "2"]);
    let mut w = send("w", &[]);
    let mut r5 = send("r5", &["SHARED", "LIMIT", "2"]);
    wait_until(Duration::from_secs(5), || s.info_field("waiters") == 5);
    // A request without BLOCK does not pass the line.
    assert_eq!(shared(&mut c, "k", "x", 1000, Some(2)), Ok(None));
    let granted =
        |conn: &mut RawConn| matches!(conn.read_within(Duration::from_secs(5)), Some(Resp::Int(_)));
    let still = |conn: &mut RawConn| conn.read_within(Duration::from_millis(200)).is_none();
    assert_eq!(release(&mut c, "k", "first"), 1);
    assert!(granted(&mut r1) && granted(&mut r2), "two readers at once");
    assert!(still(&mut r3), "the limit");
    assert_eq!(release(&mut c, "k", "r1"), 1);
    assert!(granted(&mut r3));
    assert_eq!(release(&mut c, "k", "r2"), 1);
    assert!(still(&mut w), "r3 still reads");
    assert!(still(&mut r5), "a reader behind the writer waits behind it");
    assert_eq!(release(&mut c, "k", "r3"), 1);
    assert!(granted(&mut w));
    assert!(still(&mut r5));
    assert_eq!(release(&mut c, "k", "w"), 1);
    assert!(granted(&mut r5));
}

/// The key's mode, limit and holders, as a replica or a restart sees them.
fn state(c: &mut Connection, key: &str) -> (String, Option<i64>, Vec<(String, i64)>) {
    info_holders(c, key)
}

#[test]
fn shared_locks_survive_restarts_rewrites_and_reach_replicas() {
    let mut s = Server::builder()
        .config("appendonly", "yes")
        .config("appendfsync", "always")
        .start();
    let replica = Server::start();
    replica.replicate_from(&s);
    let mut c = s.conn();
    let a = shared(&mut c, "k", "a", 120_000, Some(3)).unwrap().unwrap();
    let b = shared(&mut c, "k", "b", 120_000, Some(3)).unwrap().unwrap();
    shared(&mut c, "k", "gone", 120_000, Some(3))
        .unwrap()
        .unwrap();
    assert_eq!(release(&mut c, "k", "gone"), 1);
    let want = (
        "shared".to_string(),
        Some(3),
        vec![("a".to_string(), a), ("b".to_string(), b)],
    );
    assert_eq!(state(&mut c, "k"), want);
    s.wait_acknowledged(1, "sync");
    let mut rc = replica.conn();
    assert_eq!(state(&mut rc, "k"), want, "the replica");
    let d = digest(&mut c);
    assert_eq!(digest(&mut rc), d);
    // The AOF (every write), then an RDB, then a rewrite without preamble.
    s.kill9();
    s.restart();
    let mut c = s.conn();
    assert_eq!(state(&mut c, "k"), want, "replayed from the AOF");
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(state(&mut c, "k"), want, "through an RDB");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("aof-use-rdb-preamble")
        .arg("no")
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    s.wait_persistence_idle();
    s.kill9();
    s.restart();
    let mut c = s.conn();
    assert_eq!(state(&mut c, "k"), want, "from a rewritten AOF");
    assert_eq!(digest(&mut c), d);
    // Fences go on rising above every holder's.
    let next = shared(&mut c, "k", "c", 1000, Some(3)).unwrap().unwrap();
    assert!(next > b);
}

#[test]
fn a_dumped_shared_key_restores_whole_and_raises_the_mark() {
    let s = Server::start();
    let mut c = s.conn();
    let a = shared(&mut c, "k", "a", 60_000, None).unwrap().unwrap();
    let b = shared(&mut c, "k", "b", 60_000, None).unwrap().unwrap();
    let dump: Vec<u8> = redis::cmd("DUMP").arg("k").query(&mut c).unwrap();
    let other = Server::start();
    let mut o = other.conn();
    let _: () = redis::cmd("RESTORE")
        .arg("k")
        .arg(0)
        .arg(dump)
        .query(&mut o)
        .unwrap();
    assert_eq!(
        state(&mut o, "k"),
        (
            "shared".into(),
            None,
            vec![("a".into(), a), ("b".into(), b)]
        )
    );
    let next = acquire(&mut o, "fresh", "t", 1000).unwrap();
    assert!(next > b, "the mark is above every restored fence");
}

#[test]
fn a_shared_holder_runs_guarded_commands_and_others_do_not() {
    let s = Server::start();
    let mut c = s.conn();
    let r = shared(&mut c, "k", "r", 60_000, None).unwrap().unwrap();
    shared(&mut c, "k", "q", 60_000, None).unwrap().unwrap();
    let ok: String = redis::cmd("LOCK.EXEC")
        .arg("k")
        .arg("r")
        .arg("FENCE")
        .arg(r)
        .arg("SET")
        .arg("data")
        .arg("v")
        .query(&mut c)
        .unwrap();
    assert_eq!(ok, "OK");
    let err = run_err(&mut c, &["LOCK.EXEC", "k", "x", "SET", "data", "w"]);
    assert!(err.starts_with("NOTHELD another token"), "{err}");
    let got: String = redis::cmd("GET").arg("data").query(&mut c).unwrap();
    assert_eq!(got, "v");
}

/// A user with only the lock commands and `%R~` on the key reads the mode,
/// the limit and every holder's fence, and no holder's token (a token can
/// release and extend); a user who may write the key sees them all.
#[test]
fn a_reader_of_the_key_sees_every_holder_but_no_token() {
    if common::skip_unless(common::Needs::OwnServer, "sets ACL users") {
        return;
    }
    let s = Server::start();
    let mut admin = s.conn();
    let a = shared(&mut admin, "app:k", "secret-a", 60_000, Some(3))
        .unwrap()
        .unwrap();
    let b = shared(&mut admin, "app:k", "secret-b", 60_000, Some(3))
        .unwrap()
        .unwrap();
    set_user(
        &mut admin,
        "viewer",
        &["%R~app:*", "+lock.info", "+lock.fence", "+lock.acquire"],
    );
    let mut viewer = login(&s, "viewer");
    let reply = lock_info_reply(&mut viewer, "app:k");
    let text = format!("{reply:?}");
    assert!(!text.contains("secret"), "a token shown: {text}");
    let f = fields(&reply);
    assert_eq!(field(&f, "limit"), Value::Int(3));
    let Value::Array(holders) = field(&f, "holders") else {
        panic!("{f:?}")
    };
    let seen: Vec<(Value, Value)> = holders
        .iter()
        .map(|h| {
            let h = fields(h);
            (field(&h, "token"), field(&h, "fence"))
        })
        .collect();
    assert_eq!(
        seen,
        [(Value::Nil, Value::Int(a)), (Value::Nil, Value::Int(b))]
    );
    // Reading is not taking: the viewer cannot join the semaphore.
    let err = run_err(
        &mut viewer,
        &["LOCK.ACQUIRE", "app:k", "v", "1000", "SHARED", "LIMIT", "3"],
    );
    assert!(err.starts_with("NOPERM"), "{err}");
    assert_eq!(info_holders(&mut admin, "app:k").2.len(), 2);
}

/// Lock-delay on a shared key: a reader that ended unreleased keeps its
/// permit for the delay (a waiting reader is served when it ends); one
/// that released frees it at once.
#[test]
fn a_reader_that_ended_unreleased_keeps_its_permit_for_the_lock_delay() {
    let s = Server::builder()
        .module_arg("lock-delay-ms", "2000")
        .start();
    let mut c = s.conn();
    let before_grant = std::time::Instant::now();
    shared(&mut c, "k", "gone", 100, Some(1)).unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(fence(&mut c, "k"), None, "its lease ended");
    assert_eq!(shared(&mut c, "k", "next", 10_000, Some(1)), Ok(None));
    let mut w = RawConn::connect(&s);
    w.send(&[
        "LOCK.ACQUIRE",
        "k",
        "w",
        "10000",
        "SHARED",
        "LIMIT",
        "1",
        "BLOCK",
        "20000",
    ]);
    let granted = w.read_within(Duration::from_secs(10));
    assert!(matches!(granted, Some(Resp::Int(_))), "{granted:?}");
    // Not before the lease (100 ms) and the delay (2 s) ended (the node
    // counts whole milliseconds: a few ms of slack).
    let waited = before_grant.elapsed();
    assert!(waited >= Duration::from_millis(2090), "{waited:?}");
    // Released, not ended: no delay.
    assert_eq!(release(&mut c, "k", "w"), 1);
    assert!(shared(&mut c, "k", "next", 10_000, Some(1))
        .unwrap()
        .is_some());
}

/// `LOCK.ACQUIREALL numkeys key ... token ttl SHARED [LIMIT n] [BLOCK t]`
/// sent as is: the fence, nil, or the error's text.
fn shared_all(
    c: &mut Connection,
    keys: &[&str],
    token: &str,
    extra: &[&str],
) -> Result<Option<i64>, String> {
    redis::cmd("LOCK.ACQUIREALL")
        .arg(keys.len())
        .arg(keys)
        .arg(token)
        .arg(60_000)
        .arg(extra)
        .query(c)
        .map_err(|e| error_text(&e))
}

#[test]
fn readers_of_several_keys_share_them_with_one_fence_and_a_writer_of_them_all_waits_its_turn() {
    let s = Server::start();
    let mut c = s.conn();
    let r1 = shared_all(&mut c, &["a", "b"], "r1", &["SHARED"])
        .unwrap()
        .unwrap();
    // A reader of one of them joins; so does a reader of both.
    let solo = shared(&mut c, "b", "solo", 60_000, None).unwrap().unwrap();
    let r2 = shared_all(&mut c, &["b", "a"], "r2", &["SHARED"])
        .unwrap()
        .unwrap();
    assert!(r1 < solo && solo < r2);
    assert_eq!(
        info_holders(&mut c, "a"),
        (
            "shared".into(),
            None,
            vec![("r1".into(), r1), ("r2".into(), r2)]
        )
    );
    assert_eq!(info_holders(&mut c, "b").2.len(), 3);
    // An exclusive request for both waits for every reader of both; a
    // reader arriving behind it waits behind it, on either key.
    let mut writer = RawConn::connect(&s);
    writer.send(&[
        "LOCK.ACQUIREALL",
        "2",
        "a",
        "b",
        "w",
        "60000",
        "BLOCK",
        "10000",
    ]);
    wait_until(Duration::from_secs(5), || s.info_field("waiters") >= 1);
    assert_eq!(
        shared_all(&mut c, &["a", "b"], "late", &["SHARED"]),
        Ok(None)
    );
    assert_eq!(shared(&mut c, "a", "late", 60_000, None), Ok(None));
    let mut reader_behind = RawConn::connect(&s);
    reader_behind.send(&[
        "LOCK.ACQUIREALL",
        "2",
        "a",
        "b",
        "late",
        "60000",
        "SHARED",
        "BLOCK",
        "10000",
    ]);
    wait_until(Duration::from_secs(5), || s.info_field("waiters") >= 2);
    // The same token again renews its hold of both, keeping its fence.
    assert_eq!(
        shared_all(&mut c, &["a", "b"], "r1", &["SHARED"]),
        Ok(Some(r1))
    );
    assert_eq!(
        redis::cmd("LOCK.RELEASEALL")
            .arg(2)
            .arg(&["a", "b"])
            .arg("r1")
            .query::<i64>(&mut c)
            .unwrap(),
        2
    );
    assert_eq!(
        redis::cmd("LOCK.RELEASEALL")
            .arg(2)
            .arg(&["a", "b"])
            .arg("r2")
            .query::<i64>(&mut c)
            .unwrap(),
        2
    );
    assert_eq!(
        writer.read_within(Duration::from_millis(300)),
        None,
        "solo still reads b"
    );
    assert_eq!(release(&mut c, "b", "solo"), 1);
    let Some(Resp::Int(w)) = writer.read_within(Duration::from_secs(5)) else {
        panic!("the writer was not granted");
    };
    assert!(w > r2);
    assert_eq!(
        info_holders(&mut c, "a"),
        ("exclusive".into(), None, vec![("w".into(), w)])
    );
    assert_eq!(
        reader_behind.read_within(Duration::from_millis(300)),
        None,
        "a writer holds both"
    );
    // The writer downgrades both keys at once, keeping its fence: the
    // reader behind it comes in.
    assert_eq!(
        shared_all(&mut c, &["a", "b"], "w", &["SHARED"]),
        Ok(Some(w))
    );
    let Some(Resp::Int(late)) = reader_behind.read_within(Duration::from_secs(5)) else {
        panic!("the reader behind the writer was not granted after the downgrade");
    };
    assert!(late > w);
    assert_eq!(
        info_holders(&mut c, "b"),
        (
            "shared".into(),
            None,
            vec![("w".into(), w), ("late".into(), late)]
        )
    );
    // Nobody upgrades, on any key.
    let e = redis::cmd("LOCK.ACQUIREALL")
        .arg(2)
        .arg(&["a", "b"])
        .arg("w")
        .arg(1000)
        .query::<Option<i64>>(&mut c)
        .unwrap_err();
    assert!(error_text(&e).contains("upgrade"), "{e}");
}

#[test]
fn semaphores_of_several_keys_take_a_permit_of_each_or_none() {
    let s = Server::start();
    let mut c = s.conn();
    let limit2 = ["SHARED", "LIMIT", "2"];
    let x = shared_all(&mut c, &["p", "q"], "x", &limit2)
        .unwrap()
        .unwrap();
    let y = shared(&mut c, "p", "y", 60_000, Some(2)).unwrap().unwrap();
    // q has a permit left, p none: nothing is taken.
    assert_eq!(shared_all(&mut c, &["q", "p"], "z", &limit2), Ok(None));
    assert_eq!(
        info_holders(&mut c, "q").2,
        vec![("x".to_string(), x)],
        "q not taken"
    );
    assert_eq!(release(&mut c, "p", "y"), 1);
    let z = shared_all(&mut c, &["q", "p"], "z", &limit2)
        .unwrap()
        .unwrap();
    assert!(z > y);
    assert_eq!(
        info_holders(&mut c, "q"),
        (
            "shared".into(),
            Some(2),
            vec![("x".into(), x), ("z".into(), z)]
        )
    );
    // A limit other than a key's is refused, naming both, before anything.
    let e = shared_all(&mut c, &["s", "p"], "v", &["SHARED", "LIMIT", "3"]).unwrap_err();
    assert!(e.contains("LIMIT 2") && e.contains("LIMIT 3"), "{e}");
    assert_eq!(fence_of(&mut c, "s", "v"), None, "s not taken");
    let e = shared_all(&mut c, &["s"], "v", &["LIMIT", "2"]).unwrap_err();
    assert!(e.contains("LIMIT needs SHARED"), "{e}");
}
