//! ACLs: what a user confined by key patterns and command rules can do with
//! the lock commands. The setups are the ones README's Security section
//! recommends (`app`: read-write on `app:*`, the five lock commands;
//! `monitor`: read-only on `app:*`), plus the ones an operator might try
//! instead (`+@all`, category rules, DUMP).

use redis_lock_testkit as common;

use std::time::Duration;

use common::*;

/// The five public commands, as README's Security section grants them.
const LOCK_COMMANDS: [&str; 5] = [
    "+lock.acquire",
    "+lock.release",
    "+lock.extend",
    "+lock.fence",
    "+lock.info",
];

/// The application user README recommends.
fn set_app_user(admin: &mut Connection, name: &str) {
    let mut rules = vec!["~app:*"];
    rules.extend(LOCK_COMMANDS);
    set_user(admin, name, &rules);
}

/// A RESP3 connection logged in as `user`.
fn login3(s: &Server, user: &str) -> Connection {
    redis::Client::open(format!(
        "redis://{user}:pw@127.0.0.1:{}/?protocol=resp3",
        s.port
    ))
    .unwrap()
    .get_connection()
    .expect("connect resp3")
}

/// A raw connection logged in as `user` (for BLOCK, answered later).
fn raw_login(s: &Server, user: &str) -> RawConn {
    let mut w = RawConn::connect(s);
    assert_eq!(w.call(&["AUTH", user, "pw"]), Resp::Simple("OK".into()));
    w
}

fn assert_noperm(c: &mut Connection, args: &[&str]) {
    let err = run_err(c, args);
    assert!(err.starts_with("NOPERM"), "{args:?} -> {err}");
}

fn wait_waiters(s: &Server, n: i64) {
    wait_until(Duration::from_secs(10), || s.info_field("waiters") == n);
}

/// `ACL DRYRUN user command args...`: true if the user may run it.
fn may_run(admin: &mut Connection, user: &str, args: &[&str]) -> bool {
    let reply: String = redis::cmd("ACL")
        .arg("DRYRUN")
        .arg(user)
        .arg(args)
        .query(admin)
        .unwrap();
    reply == "OK"
}

#[test]
fn an_app_user_locks_only_keys_of_its_pattern() {
    let s = Server::start();
    let mut admin = s.conn();
    set_app_user(&mut admin, "app");
    let mut app = login(&s, "app");

    // Everything works on app:*, including seeing its own token.
    let f = acquire(&mut app, "app:1", "t1", 60_000).unwrap();
    assert_eq!(extend(&mut app, "app:1", "t1", 60_000), 1);
    assert_eq!(fence(&mut app, "app:1"), Some(f));
    let info = lock_info(&mut app, "app:1").unwrap();
    assert_eq!(info.token.as_deref(), Some(&b"t1"[..]));
    // BLOCK and its hand-off work for the confined user.
    let mut w = raw_login(&s, "app");
    w.send(&["LOCK.ACQUIRE", "app:1", "t2", "60000", "BLOCK", "5000"]);
    wait_waiters(&s, 1);
    assert_eq!(release(&mut app, "app:1", "t1"), 1);
    let Resp::Int(f2) = w.read() else {
        panic!("the waiter is granted")
    };
    assert!(f2 > f);
    assert_eq!(release(&mut app, "app:1", "t2"), 1);

    // Nothing works on other keys, and nothing there changes.
    let other = acquire(&mut admin, "other:1", "admins", 60_000).unwrap();
    let before = digest(&mut admin);
    for key in ["other:1", "app", "App:1", "xapp:1"] {
        for args in [
            vec!["LOCK.ACQUIRE", key, "t", "1000"],
            vec!["LOCK.ACQUIRE", key, "t", "1000", "BLOCK", "100"],
            vec!["LOCK.RELEASE", key, "admins"],
            vec!["LOCK.EXTEND", key, "admins", "1000"],
            vec!["LOCK.FENCE", key],
            vec!["LOCK.FENCE", key, "admins"],
            vec!["LOCK.INFO", key],
        ] {
            assert_noperm(&mut app, &args);
        }
    }
    assert_eq!(digest(&mut admin), before);
    assert_eq!(fence(&mut admin, "other:1"), Some(other));
    assert_eq!(holder(&mut admin, "other:1").as_deref(), Some("admins"));
    assert_eq!(s.info_field("waiters"), 0, "a refused BLOCK queues nothing");

    // It was granted nothing else: no way around the lock commands.
    acquire(&mut app, "app:1", "t1", 60_000).unwrap();
    for args in [
        vec!["GET", "app:1"],
        vec!["DEL", "app:1"],
        vec!["PEXPIRE", "app:1", "1"],
        vec!["DUMP", "app:1"],
        vec!["COPY", "app:1", "app:2"],
        vec!["LOCK._SET", "app:1", "evil", "1", "99999999999999"],
        vec!["EVAL", "return 1", "1", "app:1"],
    ] {
        assert_noperm(&mut app, &args);
    }
    assert_eq!(holder(&mut admin, "app:1").as_deref(), Some("t1"));

    // The refusals are in the ACL log, naming the key.
    let log: Value = redis::cmd("ACL")
        .arg("LOG")
        .arg("100")
        .query(&mut admin)
        .unwrap();
    let log = format!("{log:?}");
    assert!(log.contains(r#""other:1""#), "{log}");
}

#[test]
fn the_internal_command_is_refused_from_every_client() {
    if common::skip_unless(common::Needs::OwnServer, "starts a replica beside it") {
        return;
    }
    let master = Server::start();
    let replica = Server::builder().config("replica-read-only", "no").start();
    replica.replicate_from(&master);
    let mut admin = master.conn();
    let f = acquire(&mut admin, "app:1", "holder", 60_000).unwrap();
    let hwm = master.info_field("fence_hwm");
    let forged = (hwm + 1_000).to_string();
    let set = |key: &'static str| -> Vec<String> {
        ["LOCK._SET", key, "evil", &forged, "99999999999999"]
            .map(String::from)
            .to_vec()
    };
    let _: () = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(
            "#!lua name=forge\n\
             redis.register_function('forge', function(keys, args) \
             return redis.call('LOCK._SET', keys[1], 'evil', args[1], 99999999999999) end)",
        )
        .query(&mut admin)
        .unwrap();
    set_user(&mut admin, "root", &["~*", "&*", "+@all"]);
    set_user(
        &mut admin,
        "named",
        &["~*", "+lock._set", "+multi", "+exec"],
    );

    let internal = |reply: redis::RedisResult<Value>, what: &str| match reply {
        Err(e) => {
            let e = error_text(&e);
            assert!(e.contains("internal"), "{what}: {e}");
        }
        Ok(v) => panic!("{what}: LOCK._SET was accepted: {v:?}"),
    };
    for user in ["default", "root", "named"] {
        let mut c = if user == "default" {
            master.conn()
        } else {
            login(&master, user)
        };
        for key in ["app:1", "new:1"] {
            let args = set(key);
            internal(redis::cmd(&args[0]).arg(&args[1..]).query(&mut c), user);
            // In a transaction the command itself is refused, not EXEC.
            let r: redis::RedisResult<Vec<Value>> = redis::pipe()
                .atomic()
                .cmd(&args[0])
                .arg(&args[1..])
                .query(&mut c);
            match r {
                Err(e) => assert!(error_text(&e).contains("internal"), "{user} MULTI: {e}"),
                Ok(v) => assert!(format!("{v:?}").contains("internal"), "{user} MULTI: {v:?}"),
            }
            if user != "named" {
                let script = format!(
                    "return redis.call('LOCK._SET', KEYS[1], 'evil', {forged}, 99999999999999)"
                );
                internal(
                    redis::cmd("EVAL")
                        .arg(&script)
                        .arg(1)
                        .arg(key)
                        .query(&mut c),
                    &format!("{user} EVAL"),
                );
                internal(
                    redis::cmd("FCALL")
                        .arg("forge")
                        .arg(1)
                        .arg(key)
                        .arg(&forged)
                        .query(&mut c),
                    &format!("{user} FCALL"),
                );
            }
        }
    }
    // A client of a writable replica is no master link either.
    let mut r = replica.conn();
    let args = set("app:1");
    internal(
        redis::cmd(&args[0]).arg(&args[1..]).query(&mut r),
        "replica",
    );

    assert_eq!(holder(&mut admin, "app:1").as_deref(), Some("holder"));
    assert_eq!(fence(&mut admin, "app:1"), Some(f));
    let n: i64 = redis::cmd("EXISTS").arg("new:1").query(&mut admin).unwrap();
    assert_eq!(n, 0);
    assert_eq!(master.info_field("fence_hwm"), hwm, "no forged fence");
    wait_until(Duration::from_secs(10), || {
        digest(&mut admin) == digest(&mut replica.conn())
    });
    assert_eq!(holder(&mut r, "app:1").as_deref(), Some("holder"));
    assert!(replica.info_field("fence_hwm") <= hwm);
}

#[test]
fn a_read_only_user_sees_no_token_and_cannot_take_release_or_extend() {
    let s = Server::start();
    let mut admin = s.conn();
    let f = acquire(&mut admin, "app:1", "secret-token", 60_000).unwrap();
    let mut waiter = RawConn::block_acquire(&s, "app:1", "queued", 60_000, 0);
    wait_waiters(&s, 1);
    // README's monitoring user, and the widest user that is read-only on the key.
    set_user(
        &mut admin,
        "monitor",
        &["%R~app:*", "+lock.info", "+lock.fence"],
    );
    set_user(&mut admin, "reader", &["%R~app:*", "+@all"]);
    let before = digest(&mut admin);
    for user in ["monitor", "reader"] {
        for mut c in [login(&s, user), login3(&s, user)] {
            let reply = lock_info_reply(&mut c, "app:1");
            let info = LockInfo::from_reply(&reply).unwrap();
            assert_eq!(info.token, None, "{user}: {reply:?}");
            assert_eq!(info.fence, f);
            assert_eq!(info.waiters, 1);
            assert!(!format!("{reply:?}").contains("secret"));
            assert_eq!(fence(&mut c, "app:1"), Some(f));
            let wrong: Option<i64> = redis::cmd("LOCK.FENCE")
                .arg("app:1")
                .arg("guess")
                .query(&mut c)
                .unwrap();
            assert_eq!(wrong, None);
            for args in [
                vec!["LOCK.ACQUIRE", "app:1", "mine", "1000"],
                vec!["LOCK.ACQUIRE", "app:1", "mine", "1000", "BLOCK", "0"],
                vec!["LOCK.ACQUIRE", "app:2", "mine", "1000"],
                // Not even with the right token: the key is read-only to them.
                vec!["LOCK.ACQUIRE", "app:1", "secret-token", "1000"],
                vec!["LOCK.RELEASE", "app:1", "secret-token"],
                vec!["LOCK.EXTEND", "app:1", "secret-token", "1000"],
            ] {
                assert_noperm(&mut c, &args);
            }
        }
    }
    // Through a transaction and a read-only script the token stays hidden.
    let mut c = login(&s, "reader");
    let (info,): (Value,) = redis::pipe()
        .atomic()
        .cmd("LOCK.INFO")
        .arg("app:1")
        .query(&mut c)
        .unwrap();
    assert!(!format!("{info:?}").contains("secret"), "MULTI: {info:?}");
    let info: Value = redis::cmd("EVAL_RO")
        .arg("return redis.call('LOCK.INFO', KEYS[1])")
        .arg(1)
        .arg("app:1")
        .query(&mut c)
        .unwrap();
    assert!(!format!("{info:?}").contains("secret"), "EVAL_RO: {info:?}");
    let err = error_text(
        &redis::cmd("EVAL_RO")
            .arg("return redis.call('LOCK.RELEASE', KEYS[1], 'secret-token')")
            .arg(1)
            .arg("app:1")
            .query::<Value>(&mut c)
            .unwrap_err(),
    );
    assert!(err.contains("ERR") || err.contains("NOPERM"), "{err}");

    assert_eq!(digest(&mut admin), before, "the readers changed nothing");
    assert_eq!(holder(&mut admin, "app:1").as_deref(), Some("secret-token"));
    assert_eq!(s.info_field("waiters"), 1, "and queued nothing");
    assert_eq!(release(&mut admin, "app:1", "secret-token"), 1);
    assert!(matches!(waiter.read(), Resp::Int(_)));
}

/// MINFENCE is an option of LOCK.ACQUIRE, which ACLs cannot take away on its
/// own: a user confined to `app:*` raises the node-wide mark, so every later
/// token on the node, on any key, is above what it asked for (within the
/// bound of 2^50 µs above the clock).
#[test]
fn an_app_users_minfence_raises_the_mark_for_every_key() {
    let s = Server::start();
    let mut admin = s.conn();
    set_app_user(&mut admin, "app");
    let mut app = login(&s, "app");
    let asked = s.info_field("fence_hwm") + 1_000_000_000_000; // 11.6 days of µs
    let f: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg("app:1")
        .arg("t")
        .arg(1000)
        .arg("MINFENCE")
        .arg(asked)
        .query(&mut app)
        .unwrap();
    assert!(f >= asked);
    let other = acquire(&mut admin, "other:1", "admins", 1000).unwrap();
    assert!(other > f, "another key's token follows the raised mark");
    let err = run_err(
        &mut app,
        &[
            "LOCK.ACQUIRE",
            "app:2",
            "t",
            "1000",
            "MINFENCE",
            "9000000000000000000",
        ],
    );
    assert!(err.starts_with("ERR"), "{err}");
}

/// What each key permission allows, per the key specs: reading the fence
/// (FENCE, INFO) needs read access; RELEASE and EXTEND need write access
/// (and the token); ACQUIRE needs both, since it returns a fence.
#[test]
fn key_permissions_follow_the_key_specs() {
    let s = Server::start();
    let mut admin = s.conn();
    let mut rules = vec!["%R~r:*", "%W~w:*", "~rw:*"];
    rules.extend(LOCK_COMMANDS);
    set_user(&mut admin, "u", &rules);
    let commands: [&[&str]; 5] = [
        &["LOCK.ACQUIRE", "K", "t", "1000", "BLOCK", "10"],
        &["LOCK.RELEASE", "K", "t"],
        &["LOCK.EXTEND", "K", "t", "1000"],
        &["LOCK.FENCE", "K", "t"],
        &["LOCK.INFO", "K"],
    ];
    // Per command: allowed on r:, w:, rw:?
    let expected = [
        [false, false, true],
        [false, true, true],
        [false, true, true],
        [true, false, true],
        [true, false, true],
    ];
    for (args, allowed) in commands.iter().zip(expected) {
        for (prefix, want) in ["r:1", "w:1", "rw:1"].iter().zip(allowed) {
            let args: Vec<&str> = args
                .iter()
                .map(|&a| if a == "K" { *prefix } else { a })
                .collect();
            assert_eq!(may_run(&mut admin, "u", &args), want, "{args:?}");
        }
    }
}

/// Whether the server lets modules set ACL categories (Redis 7.2+; Valkey
/// 8 reports 7.2.4).
fn server_sets_module_categories(admin: &mut Connection) -> bool {
    let info: String = redis::cmd("INFO").arg("server").query(admin).unwrap();
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap()
        .trim()
        .to_string();
    let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
    (parts[0], parts[1]) >= (7, 2)
}

fn categories_of(admin: &mut Connection, name: &str) -> Vec<String> {
    let info: Vec<Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(name)
        .query(admin)
        .unwrap();
    let Value::Array(fields) = &info[0] else {
        panic!("{name}: no COMMAND INFO entry: {info:?}")
    };
    // name, arity, flags, first, last, step, ACL categories, ...
    redis::from_redis_value(&fields[6]).unwrap()
}

/// Where the server allows it (7.2+, Valkey 8), the lock commands are in
/// @write/@read, @fast/@blocking, and (7.4+, Valkey 8) @lock: category rules
/// then grant and deny them like any command. On Redis 7.0 module commands
/// are in no category, so category rules neither grant nor remove them:
/// grant and deny lock commands by name there (README, Security).
#[test]
fn lock_commands_are_in_acl_categories_where_the_server_allows() {
    let s = Server::start();
    let mut admin = s.conn();
    let expected = [
        ("lock.acquire", &["write", "blocking"][..]),
        ("lock.release", &["write", "fast"]),
        ("lock.extend", &["write", "fast"]),
        ("lock.fence", &["read", "fast"]),
        ("lock.info", &["read", "fast"]),
        ("lock._set", &["write"]),
    ];
    let categories = server_sets_module_categories(&mut admin);
    let lock_category: Option<Vec<String>> = redis::cmd("ACL")
        .arg("CAT")
        .arg("lock")
        .query(&mut admin)
        .ok();
    for (name, cats) in expected {
        let got = categories_of(&mut admin, name);
        if !categories {
            assert!(got.is_empty(), "{name}: {got:?}");
            continue;
        }
        for cat in cats {
            assert!(got.contains(&format!("@{cat}")), "{name}: {got:?}");
        }
        if let Some(listed) = &lock_category {
            assert_eq!(
                listed.iter().any(|c| c == name),
                name != "lock._set",
                "{listed:?}"
            );
        }
    }

    let block = ["LOCK.ACQUIRE", "app:1", "t", "1000", "BLOCK", "100"];
    let release = ["LOCK.RELEASE", "app:1", "t"];
    let info = ["LOCK.INFO", "app:1"];
    set_user(
        &mut admin,
        "cats",
        &["~app:*", "+@read", "+@write", "+@blocking", "+@fast"],
    );
    for args in [&block[..], &release, &info] {
        assert_eq!(may_run(&mut admin, "cats", args), categories, "{args:?}");
    }
    set_user(
        &mut admin,
        "deny",
        &["~app:*", "+@all", "-@blocking", "-@write"],
    );
    assert_eq!(may_run(&mut admin, "deny", &block), !categories);
    assert_eq!(may_run(&mut admin, "deny", &release), !categories);
    assert!(may_run(&mut admin, "deny", &info));
    assert!(!may_run(&mut admin, "deny", &["BLPOP", "app:l", "1"]));
    if lock_category.is_some() {
        set_user(&mut admin, "locker", &["~app:*", "+@lock"]);
        for args in [&block[..], &release, &info] {
            assert!(may_run(&mut admin, "locker", args), "{args:?}");
        }
        assert!(!may_run(
            &mut admin,
            "locker",
            &["LOCK._SET", "app:1", "t", "1", "1"]
        ));
        assert!(!may_run(&mut admin, "locker", &["SET", "app:1", "v"]));
    }
    // By name it works everywhere.
    set_user(&mut admin, "named", &["~app:*", "+@all", "-lock.acquire"]);
    assert!(!may_run(&mut admin, "named", &block));
    assert!(may_run(&mut admin, "named", &release));
    // +@all (allcommands) includes them, and the internal command, which the
    // module then refuses itself (see the_internal_command_is_refused_...).
    set_user(&mut admin, "all", &["~*", "+@all"]);
    assert!(may_run(&mut admin, "all", &block));
    assert!(may_run(
        &mut admin,
        "all",
        &["LOCK._SET", "k", "t", "1", "1"]
    ));
}

/// A user deleted (ACL DELUSER) or whose clients are killed (CLIENT KILL
/// USER) while it waits leaves the line: the lock goes to the next waiter,
/// never to the gone client.
#[test]
fn waiters_of_a_deleted_or_killed_user_leave_the_line() {
    let s = Server::start();
    let mut admin = s.conn();
    set_app_user(&mut admin, "gone");
    set_app_user(&mut admin, "killed");
    acquire(&mut admin, "app:1", "holder", 60_000).unwrap();
    let mut w1 = raw_login(&s, "gone");
    w1.send(&["LOCK.ACQUIRE", "app:1", "w1", "60000", "BLOCK", "0"]);
    let mut w2 = raw_login(&s, "killed");
    w2.send(&["LOCK.ACQUIRE", "app:1", "w2", "60000", "BLOCK", "0"]);
    let mut w3 = RawConn::block_acquire(&s, "app:1", "w3", 60_000, 0);
    wait_waiters(&s, 3);

    let n: i64 = redis::cmd("ACL")
        .arg("DELUSER")
        .arg("gone")
        .query(&mut admin)
        .unwrap();
    assert_eq!(n, 1);
    let n: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("USER")
        .arg("killed")
        .query(&mut admin)
        .unwrap();
    assert_eq!(n, 1);
    wait_waiters(&s, 1);
    assert_eq!(release(&mut admin, "app:1", "holder"), 1);
    assert!(matches!(w3.read(), Resp::Int(_)), "w3 is next");
    assert_eq!(holder(&mut admin, "app:1").as_deref(), Some("w3"));
    for (w, name) in [(&mut w1, "gone"), (&mut w2, "killed")] {
        let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            w.read_within(Duration::from_millis(200))
        }));
        assert!(
            matches!(closed, Err(_) | Ok(None)),
            "{name}'s waiter got a reply: {closed:?}"
        );
    }
}

/// Native blocking commands re-check ACLs when they wake on Valkey 8 (and
/// Redis 7.2+): a BLPOP whose user lost the key meanwhile gets NOPERM. So
/// does a lock waiter whose user lost the key while it waited: the lock goes
/// to nobody (or the next in line) instead.
#[test]
fn a_waiter_whose_access_is_revoked_is_not_granted() {
    let s = Server::start();
    let mut admin = s.conn();
    set_app_user(&mut admin, "app");
    acquire(&mut admin, "app:1", "holder", 60_000).unwrap();
    let mut w = raw_login(&s, "app");
    w.send(&["LOCK.ACQUIRE", "app:1", "w", "60000", "BLOCK", "0"]);
    wait_waiters(&s, 1);
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("app")
        .arg("resetkeys")
        .arg("~other:*")
        .query(&mut admin)
        .unwrap();
    assert_eq!(release(&mut admin, "app:1", "holder"), 1);
    let reply = w.read();
    assert!(
        matches!(&reply, Resp::Error(e) if e.starts_with("NOPERM")),
        "the revoked waiter got {reply:?}"
    );
    assert_eq!(holder(&mut admin, "app:1"), None);
}

/// DUMP is a read command: a user who may read the key gets the serialized
/// lock, token included, whatever LOCK.INFO hides. README's Security section
/// says not to grant DUMP (or `+@read`, which includes it) to readers of
/// lock keys. COPY, which would let a reader make a lock it may write, is
/// refused by the type.
#[test]
fn dump_shows_the_token_to_readers_and_copy_is_refused() {
    let s = Server::start();
    let mut admin = s.conn();
    acquire(&mut admin, "app:1", "secret-token", 60_000).unwrap();
    set_user(
        &mut admin,
        "reader",
        &["%R~app:*", "~mine:*", "+@read", "+copy"],
    );
    let mut c = login(&s, "reader");
    let payload: Vec<u8> = redis::cmd("DUMP").arg("app:1").query(&mut c).unwrap();
    assert!(
        payload.windows(12).any(|w| w == b"secret-token"),
        "DUMP carries the token"
    );
    let err = run_err(&mut c, &["COPY", "app:1", "mine:1"]);
    assert!(err.contains("not supported"), "{err}");
    let n: i64 = redis::cmd("EXISTS")
        .arg("mine:1")
        .query(&mut admin)
        .unwrap();
    assert_eq!(n, 0);
}

/// Issue 15, defect 3: the re-check at hand-off covers the command too. A
/// waiter whose user lost `lock.acquire` while it waited is answered NOPERM
/// (as Valkey 8 and Redis 8 answer a BLPOP waiter), and the lock goes to
/// the next in line.
#[test]
fn a_waiter_whose_user_lost_the_command_is_not_granted() {
    let s = Server::start();
    let mut admin = s.conn();
    set_app_user(&mut admin, "app");
    set_app_user(&mut admin, "other");
    acquire(&mut admin, "app:1", "holder", 60_000).unwrap();
    let mut w = raw_login(&s, "app");
    w.send(&["LOCK.ACQUIRE", "app:1", "w", "60000", "BLOCK", "0"]);
    wait_waiters(&s, 1);
    let mut next = raw_login(&s, "other");
    next.send(&["LOCK.ACQUIRE", "app:1", "n", "60000", "BLOCK", "0"]);
    wait_waiters(&s, 2);
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("app")
        .arg("-lock.acquire")
        .query(&mut admin)
        .unwrap();
    assert_eq!(release(&mut admin, "app:1", "holder"), 1);
    let reply = w.read();
    assert!(
        matches!(&reply, Resp::Error(e) if e.starts_with("NOPERM")),
        "the revoked waiter got {reply:?}"
    );
    assert!(matches!(next.read(), Resp::Int(_)));
    assert_eq!(holder(&mut admin, "app:1").as_deref(), Some("n"));
}

// Regression tests of defects found by attacking the module (issue 8 and
// later): each reproduces an attack or an unlucky schedule that broke
// mutual exclusion or crashed the server before its fix.

#[test]
fn a_read_only_user_never_sees_a_usable_token() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "app:1", "secret-token", 60_000).unwrap();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("reader")
        .arg("on")
        .arg(">pw")
        .arg("%R~app:*")
        .arg("+lock.info")
        .arg("+lock.fence")
        .query(&mut c)
        .unwrap();
    let mut r = s.conn();
    let _: () = redis::cmd("AUTH")
        .arg("reader")
        .arg("pw")
        .query(&mut r)
        .unwrap();
    let reply = lock_info_reply(&mut r, "app:1");
    assert_eq!(LockInfo::from_reply(&reply).unwrap().token, None);
    assert!(!format!("{reply:?}").contains("secret"));
    assert_eq!(holder(&mut c, "app:1").as_deref(), Some("secret-token"));
}
