//! Scripts and guarded commands (issue 31, items 1 and 2). A script run
//! through `LOCK.EXEC` or `LOCK.FENCED` runs inside the module's command,
//! through the server's call of it on the module's own client. When such a
//! script runs past `busy-reply-threshold`, the server serves events and
//! protects only the script's caller, the module's client: the client whose
//! guarded command is on the stack may disconnect (Redis 7.0 and Valkey 8.1
//! segfaulted, Redis 8.2 asserted) or pipeline its next command (an
//! assertion), and in a cluster the script's undeclared keys were filed
//! under the lock's slot. So scripts and functions are refused inside a
//! guarded command, and the way to guard several writes as one is the other
//! way round: the user's own script checks the lock (`LOCK.FENCE key
//! token`, or `LOCK.FENCED gate fence`) and then writes, which the server
//! runs as any script (its caller protected while it is busy).

use redis_lock_testkit as common;

use std::time::Duration;

use common::*;

/// A Lua body that spins for `ms` milliseconds of the server's clock.
fn spin(ms: u64) -> String {
    format!(
        "local s = redis.call('TIME') \
         repeat local n = redis.call('TIME') \
         until (n[1] - s[1]) * 1000000 + (n[2] - s[2]) > {}",
        ms * 1000
    )
}

fn load_spin_function(c: &mut Connection, ms: u64) {
    let lib = format!(
        "#!lua name=spinlib\n\
         redis.register_function('spin', function(keys, args)\n\
           {}\n\
           return redis.call('INCR', keys[1])\n\
         end)",
        spin(ms)
    );
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(lib)
        .query(c)
        .unwrap();
}

/// Every command that runs a script or function, as the inner command of
/// a guard (its arguments after the guard's own).
fn script_commands(spin_ms: u64, sha: &str) -> Vec<Vec<String>> {
    let body = format!("{} return redis.call('INCR', KEYS[1])", spin(spin_ms));
    let ro_body = format!("{} return redis.call('GET', KEYS[1])", spin(spin_ms));
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    vec![
        s(&["EVAL", &body, "1", "n"]),
        s(&["EVAL_RO", &ro_body, "1", "n"]),
        s(&["EVALSHA", sha, "1", "n"]),
        s(&["EVALSHA_RO", sha, "1", "n"]),
        s(&["FCALL", "spin", "1", "n"]),
        s(&["FCALL_RO", "spin", "1", "n"]),
        s(&["eVaL", &body, "1", "n"]),
    ]
}

#[test]
fn scripts_and_functions_are_refused_inside_a_guard_and_nothing_runs() {
    let s = Server::start();
    let mut c = s.conn();
    load_spin_function(&mut c, 0);
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return redis.call('INCR', KEYS[1])")
        .query(&mut c)
        .unwrap();
    let fence = acquire(&mut c, "k", "t", 60_000).unwrap();
    for inner in script_commands(0, &sha) {
        let mut exec = vec!["LOCK.EXEC", "k", "t"];
        exec.extend(inner.iter().map(String::as_str));
        let e = run_err(&mut c, &exec);
        assert!(e.starts_with("NOTGUARDABLE"), "{inner:?}: {e}");
        assert!(e.contains("LOCK.FENCE"), "the error names the way: {e}");
        let f = (fence + 1).to_string();
        let mut fenced = vec!["LOCK.FENCED", "g", &f];
        fenced.extend(inner.iter().map(String::as_str));
        let e = run_err(&mut c, &fenced);
        assert!(e.starts_with("NOTGUARDABLE"), "{inner:?}: {e}");
    }
    let n: Option<i64> = redis::cmd("GET").arg("n").query(&mut c).unwrap();
    assert_eq!(n, None, "no script ran");
    let g: bool = redis::cmd("EXISTS").arg("g").query(&mut c).unwrap();
    assert!(!g, "a refused LOCK.FENCED records no mark");
}

/// The attack that crashed every server: a slow guarded script whose
/// caller gives up (disconnects) or pipelines its next command while the
/// script is busy. Now refused before it runs; the server stays up and
/// answers the pipelined command in order.
#[test]
fn a_slow_guarded_script_whose_caller_leaves_or_pipelines_cannot_crash_the_server() {
    let s = Server::builder()
        .config("busy-reply-threshold", "50")
        .start();
    let v = s.version();
    let mut c = s.conn();
    load_spin_function(&mut c, 400);
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(format!("{} return 1", spin(400)))
        .query(&mut c)
        .unwrap();
    acquire(&mut c, "k", "t", 600_000).unwrap();
    let fence = c_fence(&mut c);
    for inner in script_commands(400, &sha) {
        for guard in ["exec", "fenced"] {
            let f = fence.to_string();
            let mut argv: Vec<&str> = match guard {
                "exec" => vec!["LOCK.EXEC", "k", "t"],
                _ => vec!["LOCK.FENCED", "g", &f],
            };
            argv.extend(inner.iter().map(String::as_str));
            // The caller leaves while the script would be busy.
            let mut leaver = RawConn::connect(&s);
            leaver.send(&argv);
            std::thread::sleep(Duration::from_millis(150));
            drop(leaver);
            wait_not_busy(&s);
            // The caller pipelines its next command.
            let mut piper = RawConn::connect(&s);
            piper.pipeline(&[&argv, &["PING"]]);
            match piper.read() {
                Resp::Error(e) => assert!(e.starts_with("NOTGUARDABLE"), "{v} {inner:?}: {e}"),
                other => panic!("{v} {guard} {inner:?}: {other:?}"),
            }
            assert_eq!(piper.read(), Resp::Simple("PONG".into()), "{v}");
            alive(&s);
        }
    }
    let n: Option<i64> = redis::cmd("GET").arg("n").query(&mut c).unwrap();
    assert_eq!(n, None, "{v}: no guarded script ran");
}

/// Waits until the server answers PING (not BUSY): a script that ran past
/// `busy-reply-threshold` has ended. Panics if the server went away.
fn wait_not_busy(s: &Server) {
    let mut probe = RawConn::connect(s);
    wait_until(Duration::from_secs(20), || {
        probe.call(&["PING"]) == Resp::Simple("PONG".into())
    });
}

fn c_fence(c: &mut Connection) -> i64 {
    fence(c, "k").unwrap()
}

/// Several writes guarded as one, the way the README shows: the user's own
/// script checks the holder with `LOCK.FENCE key token` (nil when the token
/// does not hold it live) and writes only then; the server runs it as any
/// script. A slow one whose caller disconnects or pipelines meanwhile
/// leaves the server up, and its writes happen together or not at all.
#[test]
fn a_script_that_checks_the_lock_itself_guards_several_writes_as_one() {
    let s = Server::builder()
        .config("busy-reply-threshold", "50")
        .start();
    let v = s.version();
    let mut c = s.conn();
    let _: () = redis::cmd("MSET")
        .arg("{o}a")
        .arg(10)
        .arg("{o}b")
        .arg(0)
        .query(&mut c)
        .unwrap();
    let transfer = format!(
        "local f = redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) \
         if not f then return redis.error_reply('NOTHELD not held by this token') end \
         {} \
         redis.call('DECRBY', KEYS[2], ARGV[2]) \
         return redis.call('INCRBY', KEYS[3], ARGV[2])",
        spin(300)
    );
    let call = |token: &str| -> Vec<String> {
        [
            "EVAL", &transfer, "3", "{o}lock", "{o}a", "{o}b", token, "3",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    acquire(&mut c, "{o}lock", "t", 600_000).unwrap();
    // Not the holder: nothing written.
    let wrong = call("other");
    let argv: Vec<&str> = wrong.iter().map(String::as_str).collect();
    let e = run_err(&mut c, &argv);
    assert!(e.contains("NOTHELD"), "{v}: {e}");
    // The holder, whose caller leaves while the script is busy.
    let right = call("t");
    let argv: Vec<&str> = right.iter().map(String::as_str).collect();
    let mut leaver = RawConn::connect(&s);
    leaver.send(&argv);
    std::thread::sleep(Duration::from_millis(100));
    drop(leaver);
    wait_not_busy(&s);
    // And one that pipelines its next command.
    let mut piper = RawConn::connect(&s);
    piper.pipeline(&[&argv, &["PING"]]);
    assert_eq!(piper.read(), Resp::Int(6), "{v}");
    assert_eq!(piper.read(), Resp::Simple("PONG".into()), "{v}");
    alive(&s);
    let got: (i64, i64) = redis::cmd("MGET")
        .arg("{o}a")
        .arg("{o}b")
        .query(&mut c)
        .unwrap();
    assert_eq!(got, (4, 6), "{v}: both transfers ran whole");
    // A gate in a script: LOCK.FENCED without a command raises the mark or
    // stops the script before its writes.
    let gated = "redis.call('LOCK.FENCED', KEYS[1], ARGV[1]) \
                 return redis.call('INCR', KEYS[2])";
    let f = fence(&mut c, "{o}lock").unwrap();
    let run_gated = |c: &mut Connection, fence: i64| {
        redis::cmd("EVAL")
            .arg(gated)
            .arg(2)
            .arg("{o}gate")
            .arg("{o}n")
            .arg(fence)
            .query::<i64>(c)
    };
    assert_eq!(run_gated(&mut c, f).unwrap(), 1);
    let e = run_gated(&mut c, f - 1).unwrap_err();
    assert!(error_text(&e).contains("STALEFENCE"), "{v}: {e}");
    let n: i64 = redis::cmd("GET").arg("{o}n").query(&mut c).unwrap();
    assert_eq!(n, 1, "{v}: the stale script wrote nothing");
}

/// The same with a function: it checks the lock, then writes; a caller
/// that does not hold it writes nothing.
#[test]
fn a_function_that_checks_the_lock_itself_runs_its_writes_together() {
    let s = Server::start();
    let v = s.version();
    let mut c = s.conn();
    let lib = "#!lua name=guardlib\n\
        redis.register_function('transfer', function(keys, args)\n\
          if not redis.call('LOCK.FENCE', keys[1], args[1]) then\n\
            return redis.error_reply('NOTHELD not held by this token')\n\
          end\n\
          redis.call('DECRBY', keys[2], args[2])\n\
          return redis.call('INCRBY', keys[3], args[2])\n\
        end)";
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(lib)
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("MSET")
        .arg("{o}a")
        .arg(10)
        .arg("{o}b")
        .arg(0)
        .query(&mut c)
        .unwrap();
    acquire(&mut c, "{o}lock", "t", 60_000).unwrap();
    let transfer = |c: &mut Connection, token: &str| {
        redis::cmd("FCALL")
            .arg("transfer")
            .arg(3)
            .arg("{o}lock")
            .arg("{o}a")
            .arg("{o}b")
            .arg(token)
            .arg(3)
            .query::<i64>(c)
    };
    assert_eq!(transfer(&mut c, "t").unwrap(), 3, "{v}");
    let e = transfer(&mut c, "other").unwrap_err();
    assert!(error_text(&e).contains("NOTHELD"), "{v}: {e}");
    release(&mut c, "{o}lock", "t");
    let e = transfer(&mut c, "t").unwrap_err();
    assert!(error_text(&e).contains("NOTHELD"), "{v}: {e}");
    let got: (i64, i64) = redis::cmd("MGET")
        .arg("{o}a")
        .arg("{o}b")
        .query(&mut c)
        .unwrap();
    assert_eq!(got, (7, 3), "{v}: only the holder's transfer ran");
}

/// A small xorshift, seeded from the clock (the seed is printed on
/// failure).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Random guarded commands from clients that wait for the reply, leave at
/// once, or pipeline their next command, with every kind of inner command
/// the attack tried (slow scripts and functions, blocking, pub/sub,
/// transactions, lock commands, plain writes, junk), on a server whose
/// busy-reply-threshold is low. The server answers throughout, no script
/// ever runs guarded, and a pipelined PING is always answered after its
/// guarded command.
#[test]
fn random_guarded_commands_from_clients_that_leave_or_pipeline_keep_the_server_up() {
    let s = Server::builder()
        .config("busy-reply-threshold", "20")
        .start();
    let v = s.version();
    let mut c = s.conn();
    load_spin_function(&mut c, 50);
    let fence = acquire(&mut c, "k", "t", 600_000).unwrap();
    let seed = now_ms() as u64 | 1;
    let mut rng = Rng(seed);
    let spin_eval = format!("{} return redis.call('INCR', 'n')", spin(50));
    let inners: Vec<Vec<String>> = [
        vec!["EVAL", &spin_eval, "0"],
        vec!["EVAL_RO", "return 1", "0"],
        vec!["FCALL", "spin", "1", "n"],
        vec!["FCALL_RO", "spin", "1", "n"],
        vec!["EVALSHA", "0000000000000000000000000000000000000000", "0"],
        vec!["SET", "d", "v"],
        vec!["INCR", "d2"],
        vec!["MSET", "a", "1", "b", "2"],
        vec!["GET", "d"],
        vec!["BLPOP", "list", "1"],
        vec!["SUBSCRIBE", "ch"],
        vec!["MULTI"],
        vec!["WAIT", "1", "100"],
        vec!["LOCK.ACQUIRE", "k2", "x", "1000"],
        vec!["SWAPDB", "0", "1"],
        vec!["no-such-command", "x"],
        vec!["SET"],
    ]
    .iter()
    .map(|v| v.iter().map(|a| a.to_string()).collect())
    .collect();
    let f = fence.to_string();
    for step in 0..300 {
        let inner = &inners[rng.below(inners.len() as u64) as usize];
        let mut argv: Vec<&str> = match rng.below(2) {
            0 => vec!["LOCK.EXEC", "k", "t"],
            _ => vec!["LOCK.FENCED", "g", &f],
        };
        argv.extend(inner.iter().map(String::as_str));
        let mut conn = RawConn::connect(&s);
        match rng.below(3) {
            0 => {
                conn.send(&argv);
                let _ = conn.read();
            }
            1 => {
                conn.send(&argv);
                drop(conn);
            }
            _ => {
                conn.pipeline(&[&argv, &["PING"]]);
                let first = conn.read();
                assert_ne!(
                    first,
                    Resp::Simple("PONG".into()),
                    "{v} seed {seed} step {step}"
                );
                assert_eq!(
                    conn.read(),
                    Resp::Simple("PONG".into()),
                    "{v} seed {seed} step {step}: {argv:?} then PING"
                );
            }
        }
        if step % 50 == 0 {
            alive(&s);
        }
    }
    alive(&s);
    assert_eq!(
        holder(&mut c, "k").as_deref(),
        Some("t"),
        "{v}: the lock kept"
    );
    let n: Option<i64> = redis::cmd("GET").arg("n").query(&mut c).unwrap();
    assert_eq!(n, None, "{v} seed {seed}: a guarded script ran");
}
