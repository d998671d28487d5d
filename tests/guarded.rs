//! Guarded commands: `LOCK.EXEC key token [FENCE f] command ...` runs the
//! command only while token holds the lock, `LOCK.FENCED gate fence
//! [command ...]` only if fence reaches the gate's mark. Each is checked
//! the way it can fail: nothing runs when refused (the data is read back),
//! the inner command meets its own ACL, maxmemory and replica rules, the
//! reply is the command's own (errors and RESP3 included), replicas and the
//! AOF see the inner command only, keys are declared (COMMAND GETKEYS), and
//! the gate's mark persists, replicates and refuses damaged values.

use redis_lock_testkit as common;

use std::time::Duration;

use common::*;

fn exec(c: &mut Connection, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut all = vec!["LOCK.EXEC"];
    all.extend(args);
    let all: Vec<&[u8]> = all.iter().map(|a| a.as_bytes()).collect();
    run(c, &all)
}

fn exec_err(c: &mut Connection, args: &[&str]) -> String {
    let mut all = vec!["LOCK.EXEC"];
    all.extend(args);
    run_err(c, &all)
}

fn get(c: &mut Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(c).unwrap()
}

fn info_count(s: &Server, name: &str) -> i64 {
    s.info_field(name)
}

/// `LOCK.FENCED gate fence` without a command: checks and records the mark.
fn raise_gate(c: &mut Connection, gate: &str, fence: i64) {
    let _: () = redis::cmd("LOCK.FENCED")
        .arg(gate)
        .arg(fence)
        .query(c)
        .unwrap();
}

fn config_set(c: &mut Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(c)
        .unwrap();
}

#[test]
fn exec_runs_the_command_only_while_the_token_holds_the_lock() {
    let s = Server::start();
    let mut c = s.conn();
    // Free: nothing runs.
    let e = exec_err(&mut c, &["k", "a", "SET", "d", "1"]);
    assert!(e.starts_with("NOTHELD") && e.contains("free"), "{e}");
    assert_eq!(get(&mut c, "d"), None);
    let f = acquire(&mut c, "k", "a", 60_000).unwrap();
    // Held: the command's reply, verbatim.
    assert_eq!(
        exec(&mut c, &["k", "a", "SET", "d", "1"]).unwrap(),
        redis::Value::Okay
    );
    assert_eq!(get(&mut c, "d").as_deref(), Some("1"));
    let got = exec(&mut c, &["k", "a", "INCRBY", "d", "4"]).unwrap();
    assert_eq!(got, redis::Value::Int(5));
    // Exactly this grant.
    let fs = f.to_string();
    assert_eq!(
        exec(&mut c, &["k", "a", "FENCE", &fs, "INCR", "d"]).unwrap(),
        redis::Value::Int(6)
    );
    let e = exec_err(
        &mut c,
        &["k", "a", "fence", &(f - 1).to_string(), "INCR", "d"],
    );
    assert!(e.starts_with("NOTHELD") && e.contains(&fs), "{e}");
    // Another token.
    let e = exec_err(&mut c, &["k", "b", "INCR", "d"]);
    assert!(
        e.starts_with("NOTHELD") && e.contains("another token"),
        "{e}"
    );
    assert_eq!(get(&mut c, "d").as_deref(), Some("6"));
    // The command's own error is its reply (it ran, and changed nothing).
    let e = exec_err(&mut c, &["k", "a", "LPUSH", "d", "x"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    // A lease that ended on the node's clock: nothing runs.
    acquire(&mut c, "short", "a", 50).unwrap();
    std::thread::sleep(Duration::from_millis(120));
    let e = exec_err(&mut c, &["short", "a", "SET", "d", "late"]);
    assert!(e.starts_with("NOTHELD"), "{e}");
    assert_eq!(get(&mut c, "d").as_deref(), Some("6"));
    assert_eq!(release(&mut c, "k", "a"), 1);
    let e = exec_err(&mut c, &["k", "a", "SET", "d", "late"]);
    assert!(e.starts_with("NOTHELD"), "{e}");
    assert_eq!(get(&mut c, "d").as_deref(), Some("6"));
}

#[test]
fn exec_counts_what_ran_and_what_was_refused() {
    if skip_unless(Needs::OwnServer, "counts INFO lock from zero") {
        return;
    }
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    exec(&mut c, &["k", "a", "SET", "d", "1"]).unwrap();
    exec(&mut c, &["k", "a", "GET", "d"]).unwrap();
    exec_err(&mut c, &["k", "b", "SET", "d", "2"]);
    raise_gate(&mut c, "g", 9);
    run_err(&mut c, &["LOCK.FENCED", "g", "3", "SET", "d", "3"]);
    assert_eq!(info_count(&s, "exec_ran"), 2);
    assert_eq!(info_count(&s, "exec_notheld"), 1);
    assert_eq!(info_count(&s, "fenced_ran"), 1);
    assert_eq!(info_count(&s, "fenced_stale"), 1);
}

#[test]
fn bad_arguments_and_unguardable_commands_are_refused_before_anything_runs() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg("list")
        .arg("x")
        .query(&mut c)
        .unwrap();
    for (args, code) in [
        (vec!["k", "a"], "ERR"),
        (vec!["k", "a", "FENCE", "1"], "ERR"),
        (vec!["k", "a", "FENCE", "x", "GET", "d"], "ERR"),
        (vec!["k", "", "GET", "d"], "ERR"),
        (vec!["k", "a", "NOSUCHCOMMAND", "d"], "ERR"),
        (vec!["k", "a", "GET"], "ERR"),
        (vec!["k", "a", "BLPOP", "list", "0"], "NOTGUARDABLE"),
        (vec!["k", "a", "MULTI"], "NOTGUARDABLE"),
        (vec!["k", "a", "EXEC"], "NOTGUARDABLE"),
        (vec!["k", "a", "DISCARD"], "NOTGUARDABLE 'discard'"),
        // No script may call WAIT (Redis 7.0 flags it no-script, Valkey 8
        // blocking): refused, whichever reason the server's flags give.
        (vec!["k", "a", "WAIT", "0", "0"], "NOTGUARDABLE 'wait'"),
        (vec!["k", "a", "WATCH", "d"], "NOTGUARDABLE"),
        (vec!["k", "a", "SUBSCRIBE", "ch"], "NOTGUARDABLE"),
        (vec!["k", "a", "PUBLISH", "ch", "m"], "NOTGUARDABLE"),
        (
            vec!["k", "a", "CONFIG", "SET", "maxmemory", "1"],
            "NOTGUARDABLE",
        ),
        (vec!["k", "a", "SHUTDOWN"], "NOTGUARDABLE"),
        (vec!["k", "a", "lock.release", "k", "a"], "NOTGUARDABLE"),
        (
            vec!["k", "a", "LOCK.EXEC", "k", "a", "LPOP", "list"],
            "NOTGUARDABLE",
        ),
    ] {
        let e = exec_err(&mut c, &args);
        assert!(e.starts_with(code), "{args:?}: {e}");
    }
    let len: i64 = redis::cmd("LLEN").arg("list").query(&mut c).unwrap();
    assert_eq!(len, 1, "nothing popped");
    let max: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory")
        .query(&mut c)
        .unwrap();
    assert_eq!(max[1], "0");
    assert!(fence(&mut c, "k").is_some(), "the lock is still held");
    // A lock key that is not a lock.
    let e = exec_err(&mut c, &["list", "a", "GET", "d"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
}

/// The refusals of `LOCK.FENCED` are `LOCK.EXEC`'s (one check of the inner
/// command serves both), and a refused command records nothing: with a
/// fence above the gate's mark, a transaction, pub/sub, lock, admin or
/// blocking command leaves the data, the lock it names, the config and
/// the gate's mark as they were.
#[test]
fn lock_fenced_refuses_what_lock_exec_refuses_and_records_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let _: () = redis::cmd("SET").arg("d").arg("v").query(&mut c).unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg("list")
        .arg("x")
        .query(&mut c)
        .unwrap();
    raise_gate(&mut c, "g", 10);
    for inner in [
        vec!["MULTI"],
        vec!["DISCARD"],
        vec!["WATCH", "d"],
        vec!["SUBSCRIBE", "ch"],
        vec!["LOCK.RELEASE", "k", "a"],
        vec!["lock.acquire", "d2", "a", "1000"],
        vec!["CONFIG", "SET", "maxmemory", "1"],
        vec!["SHUTDOWN", "NOSAVE"],
        vec!["BLPOP", "list", "0"],
        vec!["BLMOVE", "list", "d2", "LEFT", "RIGHT", "0"],
        vec!["WAIT", "0", "0"],
    ] {
        let mut args = vec!["LOCK.FENCED", "g", "20"];
        args.extend(&inner);
        let e = run_err(&mut c, &args);
        assert!(e.starts_with("NOTGUARDABLE"), "{inner:?}: {e}");
        assert_eq!(fence(&mut c, "g"), Some(10), "{inner:?}: mark unchanged");
    }
    assert_eq!(get(&mut c, "d").as_deref(), Some("v"));
    let len: i64 = redis::cmd("LLEN").arg("list").query(&mut c).unwrap();
    assert_eq!(len, 1, "nothing popped");
    let exists: i64 = redis::cmd("EXISTS").arg("d2").query(&mut c).unwrap();
    assert_eq!(exists, 0, "nothing moved or acquired");
    assert_eq!(holder(&mut c, "k").as_deref(), Some("a"), "still held");
    let max: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory")
        .query(&mut c)
        .unwrap();
    assert_eq!(max[1], "0");
    // The same fence with a command that may run: it runs, and is the mark.
    let got = run(&mut c, &[b"LOCK.FENCED", b"g", b"20", b"GET", b"d"]).unwrap();
    assert_eq!(got, redis::Value::BulkString(b"v".to_vec()));
    assert_eq!(fence(&mut c, "g"), Some(20));
}

/// An inner command that runs and fails answers its own error on a RESP3
/// connection too, word for word what the command says called directly;
/// it ran, so `LOCK.FENCED` records its fence, and the data is unchanged.
#[test]
fn an_inner_commands_error_comes_back_verbatim_in_resp3() {
    let s = Server::start();
    let mut c = s.conn3();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let _: () = redis::cmd("SET").arg("d").arg("abc").query(&mut c).unwrap();
    let direct = run_err(&mut c, &["INCR", "d"]);
    assert!(
        direct.starts_with("ERR") && direct.contains("integer"),
        "{direct}"
    );
    assert_eq!(exec_err(&mut c, &["k", "a", "INCR", "d"]), direct);
    assert_eq!(
        run_err(&mut c, &["LOCK.FENCED", "g", "5", "INCR", "d"]),
        direct
    );
    assert_eq!(fence(&mut c, "g"), Some(5), "the failed command ran");
    let direct = run_err(&mut c, &["HSET", "d", "f", "v"]);
    assert!(direct.starts_with("WRONGTYPE"), "{direct}");
    assert_eq!(exec_err(&mut c, &["k", "a", "HSET", "d", "f", "v"]), direct);
    assert_eq!(get(&mut c, "d").as_deref(), Some("abc"));
}

/// `min-replicas-to-write 1` with no replica: a guarded write gets
/// `NOREPLICAS`, as the write called directly does, and nothing runs (the
/// data and the gate's mark are read back).
#[test]
fn without_the_replicas_min_replicas_to_write_asks_for_nothing_runs() {
    if skip_unless(Needs::OwnServer, "sets min-replicas-to-write") {
        return;
    }
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let _: () = redis::cmd("SET").arg("d").arg("v").query(&mut c).unwrap();
    raise_gate(&mut c, "g", 10);
    config_set(&mut c, "min-replicas-to-write", "1");
    let direct = run_err(&mut c, &["SET", "d", "direct"]);
    assert!(direct.starts_with("NOREPLICAS"), "{direct}");
    let e = exec_err(&mut c, &["k", "a", "SET", "d", "w"]);
    assert!(e.starts_with("NOREPLICAS"), "{e}");
    let e = run_err(&mut c, &["LOCK.FENCED", "g", "20", "SET", "d", "w"]);
    assert!(e.starts_with("NOREPLICAS"), "{e}");
    let e = run_err(&mut c, &["LOCK.FENCED", "g", "20"]);
    assert!(e.starts_with("NOREPLICAS"), "{e}");
    assert_eq!(get(&mut c, "d").as_deref(), Some("v"));
    assert_eq!(fence(&mut c, "g"), Some(10));
    config_set(&mut c, "min-replicas-to-write", "0");
    assert_eq!(
        exec(&mut c, &["k", "a", "SET", "d", "w"]).unwrap(),
        redis::Value::Okay
    );
}

/// After a failed background save (the RDB file's path is a directory, so
/// the child's rename fails, as root too) with a save point configured,
/// the server refuses writes with `MISCONF`: a guarded write gets it, and
/// nothing runs; once a save succeeds, the write runs.
#[test]
fn after_a_failed_save_a_guarded_write_gets_misconf_and_nothing_runs() {
    if skip_unless(Needs::OwnServer, "makes its own RDB file fail") {
        return;
    }
    let s = Server::builder().config("dbfilename", "fails.rdb").start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let _: () = redis::cmd("SET").arg("d").arg("v").query(&mut c).unwrap();
    raise_gate(&mut c, "g", 10);
    config_set(&mut c, "save", "3600 1");
    config_set(&mut c, "stop-writes-on-bgsave-error", "yes");
    let blocker = s.dir.join("fails.rdb");
    std::fs::create_dir_all(&blocker).unwrap();
    let _: String = redis::cmd("BGSAVE").query(&mut c).unwrap();
    wait_until(Duration::from_secs(20), || {
        let info: String = redis::cmd("INFO").arg("persistence").query(&mut c).unwrap();
        info.contains("rdb_last_bgsave_status:err") && info.contains("rdb_bgsave_in_progress:0")
    });
    let direct = run_err(&mut c, &["SET", "d", "direct"]);
    assert!(direct.starts_with("MISCONF"), "{direct}");
    let e = exec_err(&mut c, &["k", "a", "SET", "d", "w"]);
    assert!(e.starts_with("MISCONF"), "{e}");
    let e = run_err(&mut c, &["LOCK.FENCED", "g", "20", "SET", "d", "w"]);
    assert!(e.starts_with("MISCONF"), "{e}");
    assert_eq!(get(&mut c, "d").as_deref(), Some("v"));
    assert_eq!(fence(&mut c, "g"), Some(10));
    // A save that succeeds lifts the refusal.
    std::fs::remove_dir(&blocker).unwrap();
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    assert_eq!(
        exec(&mut c, &["k", "a", "SET", "d", "w"]).unwrap(),
        redis::Value::Okay
    );
    assert_eq!(get(&mut c, "d").as_deref(), Some("w"));
}

#[test]
fn the_reply_is_the_commands_own_in_resp3_too() {
    let s = Server::start();
    let mut c = s.conn3();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let _: () = redis::cmd("HSET")
        .arg("h")
        .arg("f")
        .arg("v")
        .query(&mut c)
        .unwrap();
    let direct = run(&mut c, &[b"HGETALL", b"h"]).unwrap();
    let guarded = exec(&mut c, &["k", "a", "HGETALL", "h"]).unwrap();
    assert!(matches!(direct, redis::Value::Map(_)), "{direct:?}");
    assert_eq!(guarded, direct);
    let mut c2 = s.conn();
    let guarded2 = exec(&mut c2, &["k", "a", "HGETALL", "h"]).unwrap();
    assert!(matches!(guarded2, redis::Value::Array(_)), "{guarded2:?}");
}

#[test]
fn command_getkeys_sees_the_lock_key_and_the_inner_commands_keys() {
    let s = Server::start();
    let mut c = s.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("LOCK.EXEC")
        .arg("lock")
        .arg("tok")
        .arg("FENCE")
        .arg(5)
        .arg("MSET")
        .arg("a")
        .arg("1")
        .arg("b")
        .arg("2")
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["lock", "a", "b"]);
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("LOCK.FENCED")
        .arg("gate")
        .arg(5)
        .arg("EVAL")
        .arg("return 1")
        .arg(2)
        .arg("x")
        .arg("y")
        .arg("arg")
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["gate", "x", "y"]);
}

#[test]
fn the_inner_command_meets_the_callers_acl_as_if_called_directly() {
    let s = Server::start();
    let mut admin = s.conn();
    set_user(
        &mut admin,
        "app",
        &[
            "~app:*",
            "%R~ro:*",
            "+lock.acquire",
            "+lock.exec",
            "+lock.fenced",
            "+get",
            "+incr",
        ],
    );
    let mut c = login(&s, "app");
    acquire(&mut c, "app:lock", "a", 60_000).unwrap();
    // Allowed command on an allowed key.
    assert_eq!(
        exec(&mut c, &["app:lock", "a", "INCR", "app:n"]).unwrap(),
        redis::Value::Int(1)
    );
    // A command the user may not run.
    let e = exec_err(&mut c, &["app:lock", "a", "SET", "app:n", "9"]);
    assert!(e.starts_with("NOPERM"), "{e}");
    // A key outside its patterns, and a key it may only read.
    let e = exec_err(&mut c, &["app:lock", "a", "INCR", "other"]);
    assert!(e.starts_with("NOPERM"), "{e}");
    let e = exec_err(&mut c, &["app:lock", "a", "INCR", "ro:n"]);
    assert!(e.starts_with("NOPERM"), "{e}");
    assert_eq!(
        exec(&mut c, &["app:lock", "a", "GET", "ro:n"]).unwrap(),
        redis::Value::Nil
    );
    // The same for the gate.
    let e = run_err(&mut c, &["LOCK.FENCED", "app:gate", "5", "INCR", "other"]);
    assert!(e.starts_with("NOPERM"), "{e}");
    let e = run_err(&mut c, &["LOCK.FENCED", "ro:gate", "5"]);
    assert!(e.starts_with("NOPERM"), "{e}");
    assert_eq!(get(&mut admin, "app:n").as_deref(), Some("1"));
    assert_eq!(get(&mut admin, "other"), None);
    assert_eq!(fence(&mut admin, "app:gate"), None, "no gate made");
    // Without the right to LOCK.EXEC itself.
    set_user(&mut admin, "app2", &["~*", "+get", "+incr"]);
    let mut c2 = login(&s, "app2");
    let e = exec_err(&mut c2, &["app:lock", "a", "INCR", "app:n"]);
    assert!(e.starts_with("NOPERM"), "{e}");
}

#[test]
fn above_maxmemory_writes_are_refused_and_reads_run() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let _: () = redis::cmd("SET").arg("d").arg("v").query(&mut c).unwrap();
    config_set(&mut c, "maxmemory", "1");
    let e = exec_err(&mut c, &["k", "a", "SET", "d", "w"]);
    assert!(e.starts_with("OOM"), "{e}");
    assert_eq!(
        exec(&mut c, &["k", "a", "GET", "d"]).unwrap(),
        redis::Value::BulkString(b"v".to_vec())
    );
    let e = run_err(&mut c, &["LOCK.FENCED", "newgate", "5"]);
    assert!(e.starts_with("OOM"), "{e}");
    config_set(&mut c, "maxmemory", "0");
    assert_eq!(get(&mut c, "d").as_deref(), Some("v"));
}

/// The commands the replica ran, from INFO commandstats: `name -> calls`.
fn command_calls(c: &mut Connection) -> std::collections::HashMap<String, i64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            Some((name.to_string(), rest.split(',').next()?.parse().ok()?))
        })
        .collect()
}

#[test]
fn replicas_and_the_aof_get_the_inner_commands_effect_only() {
    let master = Server::builder()
        .config("appendonly", "yes")
        .config("appendfsync", "always")
        .start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.conn();
    let mut r = replica.conn();
    acquire(&mut m, "k", "a", 60_000).unwrap();
    exec(&mut m, &["k", "a", "SET", "d", "1"]).unwrap();
    exec(&mut m, &["k", "a", "GET", "d"]).unwrap();
    let _: redis::Value = redis::cmd("LOCK.FENCED")
        .arg("g")
        .arg(42)
        .arg("INCR")
        .arg("n")
        .query(&mut m)
        .unwrap();
    let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(n, 1);
    assert_eq!(get(&mut r, "d").as_deref(), Some("1"));
    assert_eq!(get(&mut r, "n").as_deref(), Some("1"));
    assert_eq!(
        fence(&mut r, "g"),
        Some(42),
        "the replica has the gate's mark"
    );
    let calls = command_calls(&mut r);
    assert!(calls.contains_key("set"), "{calls:?}");
    assert!(!calls.contains_key("lock.exec"), "{calls:?}");
    assert!(!calls.contains_key("lock.fenced"), "{calls:?}");
    // The replica refuses guarded commands as it refuses writes.
    let e = exec_err(&mut r, &["k", "a", "SET", "d", "2"]);
    assert!(e.starts_with("READONLY"), "{e}");
    let aof = std::fs::read(master.incr_aof()).unwrap();
    let aof = String::from_utf8_lossy(&aof);
    assert!(aof.contains("SET") || aof.contains("set"), "{aof}");
    assert!(aof.contains("LOCK._GATE"), "{aof}");
    assert!(!aof.to_ascii_uppercase().contains("LOCK.EXEC"), "{aof}");
    assert!(!aof.to_ascii_uppercase().contains("LOCK.FENCED"), "{aof}");
    assert!(!aof.contains("\r\nGET\r\n"), "{aof}");
}

#[test]
fn a_gate_runs_fences_at_or_above_its_mark_and_refuses_lower_ones() {
    let s = Server::start();
    let mut c = s.conn();
    let fenced = |c: &mut Connection, args: &[&str]| -> redis::RedisResult<redis::Value> {
        let mut all: Vec<&[u8]> = vec![b"LOCK.FENCED"];
        all.extend(args.iter().map(|a| a.as_bytes()));
        run(c, &all)
    };
    assert_eq!(fence(&mut c, "g"), None);
    assert_eq!(
        fenced(&mut c, &["g", "10", "SET", "d", "a"]).unwrap(),
        redis::Value::Okay
    );
    assert_eq!(fence(&mut c, "g"), Some(10));
    // The same holder writes again under its grant.
    assert_eq!(
        fenced(&mut c, &["g", "10", "APPEND", "d", "b"]).unwrap(),
        redis::Value::Int(2)
    );
    // A stale holder: nothing runs, both numbers named.
    let e = run_err(&mut c, &["LOCK.FENCED", "g", "9", "SET", "d", "stale"]);
    assert!(
        e.starts_with("STALEFENCE") && e.contains('9') && e.contains("10"),
        "{e}"
    );
    assert_eq!(get(&mut c, "d").as_deref(), Some("ab"));
    // Check and record only.
    assert_eq!(fenced(&mut c, &["g", "20"]).unwrap(), redis::Value::Okay);
    assert_eq!(fence(&mut c, "g"), Some(20));
    let e = run_err(&mut c, &["LOCK.FENCED", "g", "19"]);
    assert!(e.starts_with("STALEFENCE"), "{e}");
    // A command refused before running records nothing.
    let e = run_err(&mut c, &["LOCK.FENCED", "g", "30", "BLPOP", "x", "0"]);
    assert!(e.starts_with("NOTGUARDABLE"), "{e}");
    let e = run_err(&mut c, &["LOCK.FENCED", "g", "30", "GET"]);
    assert!(e.starts_with("ERR"), "{e}");
    assert_eq!(fence(&mut c, "g"), Some(20));
    // A command that names its own gate is refused: it could overwrite
    // the gate and take the mark with it (SET g x, then DEL g).
    for inner in [&["DEL", "g"][..], &["SET", "g", "x"], &["RENAME", "d", "g"]] {
        let mut argv = vec!["LOCK.FENCED", "g", "25"];
        argv.extend(inner);
        let e = run_err(&mut c, &argv);
        assert!(e.starts_with("NOTGUARDABLE") && e.contains("gate"), "{e}");
    }
    assert_eq!(fence(&mut c, "g"), Some(20));
    assert_eq!(get(&mut c, "d").as_deref(), Some("ab"));
    // One that deletes it without naming it does not reset the mark.
    fenced(&mut c, &["g", "25", "FLUSHDB"]).unwrap();
    assert_eq!(fence(&mut c, "g"), Some(25));
    // The gate is not a lock, a lock not a gate; bad fences are refused.
    let e = run_err(&mut c, &["LOCK.ACQUIRE", "g", "t", "1000"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    let e = run_err(&mut c, &["LOCK.FENCE", "g", "t"]);
    assert!(e.starts_with("ERR") && e.contains("gate"), "{e}");
    acquire(&mut c, "lk", "t", 60_000).unwrap();
    let e = run_err(&mut c, &["LOCK.FENCED", "lk", "5"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    for bad in ["0", "-1", "x", "9223372036854775807"] {
        let e = run_err(&mut c, &["LOCK.FENCED", "g", bad]);
        assert!(e.starts_with("ERR invalid fence"), "{bad}: {e}");
    }
    assert_eq!(fence(&mut c, "g"), Some(25));
    let e = run_err(&mut c, &["LOCK._GATE", "g", "99"]);
    assert!(e.contains("internal"), "{e}");
    assert_eq!(fence(&mut c, "g"), Some(25));
    let t: String = redis::cmd("TYPE").arg("g").query(&mut c).unwrap();
    assert_eq!(t, "lock_gate");
}

#[test]
fn a_gates_mark_survives_reload_rewrite_and_restore() {
    let mut s = Server::builder()
        .config("appendonly", "yes")
        .config("aof-use-rdb-preamble", "no")
        .start();
    let mut c = s.conn();
    raise_gate(&mut c, "g", 1234);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(fence(&mut c, "g"), Some(1234));
    let _: () = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    s.wait_persistence_idle();
    s.kill9();
    s.restart();
    let mut c = s.conn();
    assert_eq!(fence(&mut c, "g"), Some(1234));
    // DUMP and RESTORE, and a damaged payload refused.
    let dump: Vec<u8> = redis::cmd("DUMP").arg("g").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("g2")
        .arg(0)
        .arg(&dump)
        .query(&mut c)
        .unwrap();
    assert_eq!(fence(&mut c, "g2"), Some(1234));
    let e = redis::cmd("RESTORE")
        .arg("g3")
        .arg(0)
        .arg(&dump[..dump.len() - 11])
        .query::<()>(&mut c)
        .unwrap_err();
    assert!(error_text(&e).starts_with("ERR"), "{e}");
    let e = run_err(&mut c, &["LOCK.FENCED", "g2", "1233"]);
    assert!(e.starts_with("STALEFENCE"), "{e}");
}

#[test]
fn gates_are_refused_where_eviction_could_drop_them() {
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, "maxmemory", "100mb");
    config_set(&mut c, "maxmemory-policy", "allkeys-lru");
    let e = run_err(&mut c, &["LOCK.FENCED", "g", "5"]);
    assert!(e.contains("maxmemory-policy"), "{e}");
    assert_eq!(fence(&mut c, "g"), None);
    config_set(&mut c, "maxmemory-policy", "noeviction");
    raise_gate(&mut c, "g", 5);
    assert_eq!(fence(&mut c, "g"), Some(5));
}

/// `CLIENT PAUSE WRITE` (as a failover does) holds a guarded write back
/// like any write; the check is made when it runs, so a lease that ended
/// during the pause stops it.
#[test]
fn a_guarded_write_held_back_by_a_pause_is_checked_when_it_runs() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 400).unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1500)
        .arg("WRITE")
        .query(&mut c)
        .unwrap();
    let mut writer = s.conn();
    let sent = std::thread::spawn(move || {
        let r = exec(&mut writer, &["k", "a", "SET", "d", "late"]);
        r.map_err(|e| error_text(&e))
    });
    let got = sent.join().unwrap();
    match got {
        Err(e) => assert!(e.starts_with("NOTHELD"), "{e}"),
        Ok(v) => panic!("a write paused past its lease ran: {v:?}"),
    }
    assert_eq!(get(&mut c, "d"), None);
}

/// The inner command may touch the lock's own key: the lock is closed
/// before it runs, and a delete frees the lock as any DEL does.
#[test]
fn a_guarded_command_that_deletes_its_own_lock_frees_it() {
    let s = Server::start();
    let mut c = s.conn();
    let f = acquire(&mut c, "k", "a", 60_000).unwrap();
    assert_eq!(
        exec(&mut c, &["k", "a", "DEL", "k"]).unwrap(),
        redis::Value::Int(1)
    );
    assert_eq!(fence(&mut c, "k"), None);
    let next = acquire(&mut c, "k", "b", 60_000).unwrap();
    assert!(next > f);
    let e = exec_err(&mut c, &["k", "a", "SET", "d", "x"]);
    assert!(e.starts_with("NOTHELD"), "{e}");
    // Overwritten by the inner command: the key is no lock any more.
    assert_eq!(
        exec(&mut c, &["k", "b", "SET", "k", "plain"]).unwrap(),
        redis::Value::Okay
    );
    let e = run_err(&mut c, &["LOCK.ACQUIRE", "k", "c", "1000"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
}

/// Found by attacking the commands: a script that runs `LOCK.EXEC` of
/// `EVAL` made the server assert (a script cannot start another), and a
/// chain of nested guards made the key callback recurse once per three
/// arguments (a stack overflow for a long one). Both are refused now, and
/// a guard inside `MULTI` or a script still works.
#[test]
fn guards_inside_scripts_transactions_and_chains_keep_the_server_up() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "t", 60_000).unwrap();
    for inner in ["EVAL", "FCALL"] {
        let e = redis::cmd("EVAL")
            .arg(format!(
                "return redis.call('LOCK.EXEC', KEYS[1], ARGV[1], '{inner}', 'return 1', '0')"
            ))
            .arg(1)
            .arg("k")
            .arg("t")
            .query::<redis::Value>(&mut c)
            .unwrap_err();
        assert!(error_text(&e).contains("NOTGUARDABLE"), "{e}");
    }
    let ok: String = redis::cmd("EVAL")
        .arg("return redis.call('LOCK.EXEC', KEYS[1], ARGV[1], 'SET', 'x', '1')")
        .arg(1)
        .arg("k")
        .arg("t")
        .query(&mut c)
        .unwrap();
    assert_eq!(ok, "OK");
    // In a transaction: a guarded command runs, a guarded script is
    // refused (a busy one would expose the caller of EXEC as it would any
    // guarded command's), and the server lives.
    let mut raw = RawConn::connect(&s);
    raw.pipeline(&[
        &["MULTI"],
        &["LOCK.EXEC", "k", "t", "INCR", "n"],
        &[
            "LOCK.EXEC",
            "k",
            "t",
            "EVAL",
            "return redis.call('INCR', 'n')",
            "0",
        ],
        &["EXEC"],
    ]);
    assert_eq!(raw.read(), Resp::Simple("OK".into()));
    assert_eq!(raw.read(), Resp::Simple("QUEUED".into()));
    assert_eq!(raw.read(), Resp::Simple("QUEUED".into()));
    match raw.read() {
        Resp::Array(replies) => {
            assert_eq!(replies[0], Resp::Int(1));
            assert!(
                matches!(&replies[1], Resp::Error(e) if e.starts_with("NOTGUARDABLE")),
                "{replies:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(get(&mut c, "n").as_deref(), Some("1"));
    // COMMAND GETKEYS of a long chain of nested guards.
    let mut cmd = redis::cmd("COMMAND");
    cmd.arg("GETKEYS");
    for _ in 0..200_000 {
        cmd.arg("LOCK.EXEC").arg("k").arg("t");
    }
    cmd.arg("GET").arg("x");
    let keys: Vec<String> = cmd.query(&mut c).unwrap();
    assert_eq!(keys, ["k"]);
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}

/// The bound on an inner command's length is a cluster's (see
/// tests/cluster.rs: past 256 arguments its keys are not checked against
/// the lock's slot): a single server has no slots, and a 300-pair `MSET`
/// runs guarded under both commands.
#[test]
fn outside_a_cluster_a_long_inner_command_runs_guarded() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "a", 60_000).unwrap();
    let mut args = vec!["k".to_string(), "a".to_string(), "MSET".to_string()];
    for i in 0..300 {
        args.push(format!("d{i}"));
        args.push(i.to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(exec(&mut c, &args).unwrap(), redis::Value::Okay);
    assert_eq!(get(&mut c, "d299").as_deref(), Some("299"));
    let mut fenced: Vec<&[u8]> = vec![b"LOCK.FENCED", b"g", b"7"];
    fenced.extend(args[2..].iter().map(|a| a.as_bytes()));
    assert_eq!(run(&mut c, &fenced).unwrap(), redis::Value::Okay);
    assert_eq!(fence(&mut c, "g"), Some(7));
}

/// A replica attached after a gate exists gets its mark through the full
/// sync (the RDB the master sends), not the replication stream: the
/// replica answers the mark and never ran `LOCK._GATE`; a later
/// `LOCK.FENCED` reaches it through the stream.
#[test]
fn a_replica_attached_after_a_gate_exists_gets_its_mark_by_full_sync() {
    if skip_unless(Needs::OwnServer, "two servers, one a replica") {
        return;
    }
    let master = Server::start();
    let mut m = master.conn();
    raise_gate(&mut m, "g", 5);
    let replica = Server::start();
    let mut r = replica.conn();
    assert_eq!(fence(&mut r, "g"), None);
    replica.replicate_from(&master);
    assert!(
        info_number(&mut m, "stats", "sync_full") >= 1,
        "a full sync"
    );
    assert_eq!(fence(&mut r, "g"), Some(5), "the mark came with the RDB");
    let calls = command_calls(&mut r);
    assert!(!calls.contains_key("lock._gate"), "{calls:?}");
    raise_gate(&mut m, "g", 9);
    let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(n, 1);
    assert_eq!(fence(&mut r, "g"), Some(9));
}

/// A mark far above this node's clock (2^51 µs, beyond the 2^50 bound
/// `LOCK.FENCED` and `RESTORE` apply) in the node's own data, as after the
/// clock was stepped back since it was recorded: no command can write one,
/// so the AOF carries it (`LOCK._GATE key mark`, as the AOF rewrite writes
/// gates). It loads as it is at start, through `DEBUG RELOAD` (the node's
/// RDB) and through a full sync to a replica attached after; the gate
/// still refuses lower fences. The same value by `RESTORE` is refused, so
/// each load above would have dropped it (or stopped the server) had it
/// been judged by the clock.
#[test]
fn a_mark_far_ahead_of_the_clock_in_the_nodes_own_data_loads_as_it_is() {
    if skip_unless(Needs::OwnServer, "writes its server's AOF before it starts") {
        return;
    }
    let mark = now_ms() * 1000 + (1 << 51);
    let mut s = Server::start();
    s.shutdown();
    s.wipe_data();
    let m = mark.to_string();
    let aof = format!(
        "*3\r\n$10\r\nLOCK._GATE\r\n$1\r\nh\r\n${}\r\n{m}\r\n",
        m.len()
    );
    std::fs::write(s.dir.join("appendonly.aof"), aof).unwrap();
    s.set_config("appendonly", "yes");
    s.restart();
    let mut c = s.conn();
    assert_eq!(fence(&mut c, "h"), Some(mark), "loaded from the AOF");
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(fence(&mut c, "h"), Some(mark), "through the node's RDB");
    let e = run_err(
        &mut c,
        &["LOCK.FENCED", "h", &(now_ms() * 1000).to_string()],
    );
    assert!(e.starts_with("STALEFENCE"), "{e}");
    // From a user the same value is beyond the bound.
    let dump: Vec<u8> = redis::cmd("DUMP").arg("h").query(&mut c).unwrap();
    let e = restore(&mut c, "h2", &dump).unwrap_err();
    assert!(error_text(&e).starts_with("ERR"), "{e}");
    assert_eq!(fence(&mut c, "h2"), None);
    let replica = Server::start();
    replica.replicate_from(&s);
    assert_eq!(fence(&mut replica.conn(), "h"), Some(mark), "a full sync");
    // And a restart from the rewritten AOF (its RDB preamble).
    let _: () = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    s.wait_persistence_idle();
    s.kill9();
    s.restart();
    assert_eq!(fence(&mut s.conn(), "h"), Some(mark), "after the rewrite");
}
