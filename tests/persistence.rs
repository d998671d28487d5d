//! Locks and fencing tokens across RDB, AOF, DEBUG RELOAD, FLUSHALL and
//! restarts with no persistence; and the restart delay.

use redis_lock_testkit as common;

use common::*;
use std::io::Write;
use std::thread::sleep;
use std::time::Duration;

#[test]
fn held_lock_survives_rdb_save_and_restart_with_its_token_and_fence() {
    let mut s = Server::start();
    let mut c = s.conn();
    let f = acquire(&mut c, "k", "holder", 60_000).unwrap();
    let d = digest(&mut c);
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    s.kill9();
    s.restart();
    let mut c = s.conn();
    assert_eq!(holder_and_fence(&mut c, "k"), Some(("holder".into(), f)));
    assert_eq!(digest(&mut c), d);
    assert_eq!(acquire(&mut c, "k", "other", 1000), None);
    assert!(acquire(&mut c, "k2", "t", 1000).unwrap() > f);
    assert_eq!(release(&mut c, "k", "holder"), 1);
}

#[test]
fn time_the_server_was_down_counts_against_the_lease() {
    let mut s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "short", "t", 1_000).unwrap();
    acquire(&mut c, "long", "t", 60_000).unwrap();
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    s.kill9();
    sleep(Duration::from_millis(1_500));
    s.restart();
    let mut c = s.conn();
    assert_eq!(fence(&mut c, "short"), None);
    assert!(fence(&mut c, "long").is_some());
}

fn aof_server(fsync: &str, preamble: &str) -> Server {
    Server::builder()
        .config("appendonly", "yes")
        .config("appendfsync", fsync)
        .config("aof-use-rdb-preamble", preamble)
        .start()
}

#[test]
fn aof_always_restores_grants_extensions_and_releases() {
    let mut s = aof_server("always", "yes");
    let mut c = s.conn();
    let f = acquire(&mut c, "kept", "a", 60_000).unwrap();
    assert_eq!(extend(&mut c, "kept", "a", 120_000), 1);
    acquire(&mut c, "gone", "b", 60_000).unwrap();
    assert_eq!(release(&mut c, "gone", "b"), 1);
    let d = digest(&mut c);
    s.kill9();
    s.restart();
    let mut c = s.conn();
    assert_eq!(holder_and_fence(&mut c, "kept"), Some(("a".into(), f)));
    let pttl: i64 = lease_ms(&mut c, "kept");
    assert!(pttl > 60_000, "the extension was replayed: {pttl}");
    assert_eq!(fence(&mut c, "gone"), None);
    assert_eq!(digest(&mut c), d);
    assert!(acquire(&mut c, "gone", "c", 1000).unwrap() > f);
}

#[test]
fn aof_everysec_restores_a_held_lock_after_kill_9() {
    let mut s = aof_server("everysec", "yes");
    let mut c = s.conn();
    let f = acquire(&mut c, "k", "a", 60_000).unwrap();
    sleep(Duration::from_millis(2_500)); // past the once-a-second fsync
    s.kill9();
    s.restart();
    let mut c = s.conn();
    assert_eq!(holder_and_fence(&mut c, "k"), Some(("a".into(), f)));
}

fn aof_rewrite_round_trip(preamble: &str) {
    let mut s = aof_server("always", preamble);
    let mut c = s.conn();
    let f = acquire(&mut c, "held", "a", 60_000).unwrap();
    acquire(&mut c, "released", "b", 60_000).unwrap();
    release(&mut c, "released", "b");
    let _: () = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
    sleep(Duration::from_millis(100));
    s.wait_persistence_idle();
    let d = digest(&mut c);
    s.kill9();
    s.restart();
    let mut c = s.conn();
    assert_eq!(
        holder_and_fence(&mut c, "held"),
        Some(("a".into(), f)),
        "preamble {preamble}"
    );
    assert_eq!(fence(&mut c, "released"), None);
    assert_eq!(digest(&mut c), d);
    assert!(acquire(&mut c, "released", "c", 1000).unwrap() > f);
}

#[test]
fn aof_rewrite_with_rdb_preamble_keeps_locks() {
    aof_rewrite_round_trip("yes");
}

#[test]
fn aof_rewrite_without_rdb_preamble_keeps_locks() {
    aof_rewrite_round_trip("no");
}

#[test]
fn no_persistence_restart_never_reissues_a_fence() {
    let mut s = Server::start();
    let mut c = s.conn();
    let mut last = 0;
    for i in 0..100 {
        last = acquire(&mut c, &format!("k{i}"), "t", 60_000).unwrap();
    }
    s.kill9();
    s.wipe_data();
    s.restart();
    let mut c = s.conn();
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(dbsize, 0, "all data was lost");
    assert!(acquire(&mut c, "k0", "t", 1000).unwrap() > last);
}

#[test]
fn debug_reload_keeps_locks_and_fences() {
    let s = Server::start();
    let mut c = s.conn();
    let f = acquire(&mut c, "k", "a", 60_000).unwrap();
    let d = digest(&mut c);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(holder_and_fence(&mut c, "k"), Some(("a".into(), f)));
    assert_eq!(digest(&mut c), d);
    assert!(acquire(&mut c, "k2", "b", 1000).unwrap() > f);
}

#[test]
fn flushall_then_restart_keeps_fences_increasing() {
    let mut s = Server::start();
    let mut c = s.conn();
    let f = acquire(&mut c, "k", "a", 60_000).unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    s.kill9();
    s.restart();
    let mut c = s.conn();
    assert!(acquire(&mut c, "k", "a", 1000).unwrap() > f);
}

/// RESP encoding of one command, as the AOF stores it.
fn resp(args: &[&str]) -> String {
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out += &format!("${}\r\n{a}\r\n", a.len());
    }
    out
}

/// The fence mark is saved with the data, not derived from keys or the
/// clock: a token far above the clock, applied from the AOF, keeps every
/// later grant above it after its key is gone, through an AOF rewrite (RDB
/// preamble) and an RDB restart.
#[test]
fn fence_mark_far_above_the_clock_survives_aof_and_rdb_restarts() {
    // 2^49 µs (about 17 years) ahead of the clock: within the bound a loaded
    // token may lie above the mark and clock (2^50).
    let big: i64 = now_ms() * 1000 + (1 << 49);
    let big_s = big.to_string();
    // Each load with the mark above the clock starts the gap above it
    // (grants an AOF tail lost were one above the mark each).
    let gap = redis_lock_core::limits::SERVING_FENCE_GAP;
    let too_big = (now_ms() * 1000 + (1 << 51)).to_string();
    let mut s = aof_server("always", "yes");
    let mut c = s.conn();
    acquire(&mut c, "seed", "t", 60_000).unwrap();
    s.shutdown();
    let deadline = (now_ms() + 600_000).to_string();
    let mut aof = std::fs::OpenOptions::new()
        .append(true)
        .open(s.incr_aof())
        .unwrap();
    aof.write_all(resp(&["LOCK._SET", "huge", "old", &too_big, &deadline]).as_bytes())
        .unwrap();
    aof.write_all(resp(&["LOCK._SET", "big", "old", &big_s, &deadline]).as_bytes())
        .unwrap();
    drop(aof);

    s.restart();
    let mut c = s.conn();
    assert_eq!(
        holder_and_fence(&mut c, "big"),
        Some(("old".into(), big)),
        "replayed from the AOF"
    );
    assert_eq!(
        holder_and_fence(&mut c, "huge"),
        None,
        "beyond the bound: refused"
    );
    assert!(s.log().contains("refusing LOCK._SET"), "and logged");
    assert_eq!(acquire(&mut c, "a", "t", 60_000), Some(big + gap + 1));
    let _: () = redis::cmd("DEL").arg("big").arg("a").query(&mut c).unwrap();
    let _: () = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
    sleep(Duration::from_millis(100));
    s.wait_persistence_idle();
    s.kill9();

    s.restart();
    let mut c = s.conn();
    assert_eq!(
        acquire(&mut c, "b", "t", 60_000),
        Some(big + 2 * gap + 2),
        "aux field in the preamble"
    );
    let _: () = redis::cmd("DEL").arg("b").query(&mut c).unwrap();
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    s.kill9();

    s.set_config("appendonly", "no");
    std::fs::remove_dir_all(s.dir.join("appendonlydir")).unwrap();
    s.restart();
    let mut c = s.conn();
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(dbsize, 1, "only the seed lock, from dump.rdb");
    assert_eq!(
        acquire(&mut c, "c", "t", 60_000),
        Some(big + 3 * gap + 3),
        "aux field in dump.rdb"
    );
}

#[test]
fn restart_delay_refuses_new_grants_but_lets_restored_holders_continue() {
    let mut s = Server::builder()
        .module_arg("restart-delay-ms", "1500")
        .start();
    let mut c = s.conn();
    let err = run_err(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    assert!(err.starts_with("TRYAGAIN"), "{err}");
    assert!(s.info_field("fence_hwm") > 0);

    // Grants resume when the delay is over (or is set to 0 at runtime).
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.restart-delay-ms")
        .arg(0)
        .query(&mut c)
        .unwrap();
    let f = acquire(&mut c, "k", "a", 60_000).unwrap();
    acquire(&mut c, "k2", "b", 60_000).unwrap();
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    s.kill9();

    s.restart(); // the module argument sets the delay to 1500 ms again
    let mut c = s.conn();
    let delay: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("lock.restart-delay-ms")
        .query(&mut c)
        .unwrap();
    assert_eq!(delay[1], "1500");
    let err = run_err(&mut c, &["LOCK.ACQUIRE", "free", "x", "60000"]);
    assert!(err.starts_with("TRYAGAIN"), "{err}");
    assert_eq!(
        acquire(&mut c, "k", "other", 60_000),
        None,
        "held: contended, not TRYAGAIN"
    );
    assert_eq!(
        acquire(&mut c, "k", "a", 60_000),
        Some(f),
        "the holder may re-acquire"
    );
    assert_eq!(extend(&mut c, "k", "a", 60_000), 1);
    assert_eq!(release(&mut c, "k", "a"), 1);
    assert_eq!(release(&mut c, "k2", "b"), 1);
    let err = run_err(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    assert!(
        err.starts_with("TRYAGAIN"),
        "released, so a new grant: {err}"
    );

    wait_until(Duration::from_secs(20), || {
        let r: redis::RedisResult<Option<i64>> = redis::cmd("LOCK.ACQUIRE")
            .arg("k")
            .arg("a")
            .arg(60_000)
            .query(&mut c);
        matches!(r, Ok(Some(_)))
    });
    assert!(fence(&mut c, "k").unwrap() > f);
}

/// AOF switched on at runtime: locks granted before and after are restored.
#[test]
fn aof_enabled_at_runtime_keeps_later_grants() {
    let mut s = Server::start();
    let mut c = s.conn();
    let before = acquire(&mut c, "before", "t", 60_000).unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg("yes")
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendfsync")
        .arg("always")
        .query(&mut c)
        .unwrap();
    sleep(Duration::from_millis(100));
    s.wait_persistence_idle();
    let after = acquire(&mut c, "after", "t", 60_000).unwrap();
    assert_eq!(extend(&mut c, "before", "t", 120_000), 1);
    s.kill9();
    s.set_config("appendonly", "yes");
    s.restart();
    let mut c = s.conn();
    assert_eq!(
        holder_and_fence(&mut c, "before"),
        Some(("t".into(), before))
    );
    assert_eq!(holder_and_fence(&mut c, "after"), Some(("t".into(), after)));
    let pttl: i64 = lease_ms(&mut c, "before");
    assert!(pttl > 60_000, "the extension was logged: {pttl}");
}

/// When the holder was granted survives an RDB restart, an AOF rewrite
/// without RDB preamble (LOCK._SET carries it) and replication; a lock from
/// an AOF written by an earlier build (LOCK._SET without it) loads with the
/// grant time unknown (nil).
#[test]
fn the_grant_time_survives_restarts_rewrites_and_replication() {
    let mut s = aof_server("always", "no");
    let mut c = s.conn();
    let before = now_ms();
    acquire(&mut c, "k", "a", 600_000).unwrap();
    let granted = lock_info(&mut c, "k").unwrap().granted.expect("known");
    // Shown converted with the node's cached clock offset, within a few ms
    // of the wall clock (as tests/commands.rs allows).
    let after = now_ms();
    assert!(
        (before - 6..=after + 6).contains(&granted),
        "{granted} not within [{before}, {after}]"
    );
    sleep(Duration::from_millis(20));
    assert_eq!(extend(&mut c, "k", "a", 600_000), 1);
    assert_eq!(
        lock_info(&mut c, "k").unwrap().granted,
        Some(granted),
        "kept by renewals"
    );

    let replica = Server::start();
    replica.replicate_from(&s);
    let mut r = replica.conn();
    wait_until(Duration::from_secs(10), || lock_info(&mut r, "k").is_some());
    assert_eq!(
        lock_info(&mut r, "k").unwrap().granted,
        Some(granted),
        "replicated"
    );
    drop(replica);

    let _: () = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
    sleep(Duration::from_millis(100));
    s.wait_persistence_idle();
    s.shutdown();
    // An earlier build's AOF line: no granted-ms.
    let deadline = (now_ms() + 600_000).to_string();
    let mut aof = std::fs::OpenOptions::new()
        .append(true)
        .open(s.incr_aof())
        .unwrap();
    aof.write_all(resp(&["LOCK._SET", "old", "b", "5", &deadline]).as_bytes())
        .unwrap();
    drop(aof);
    s.restart();
    let mut c = s.conn();
    assert_eq!(
        lock_info(&mut c, "k").unwrap().granted,
        Some(granted),
        "AOF rewrite"
    );
    assert_eq!(
        lock_info(&mut c, "old").unwrap().granted,
        None,
        "unknown for an old line"
    );
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg("no")
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(
        lock_info(&mut c, "k").unwrap().granted,
        Some(granted),
        "RDB"
    );
    assert_eq!(lock_info(&mut c, "old").unwrap().granted, None, "RDB");
}

// Regression tests of defects found by attacking the module (issue 8 and
// later): each reproduces an attack or an unlucky schedule that broke
// mutual exclusion or crashed the server before its fix.

/// A DUMP payload of a lock, and where its fence's 8 big-endian bytes are.
fn dump_with_fence(c: &mut Connection, key: &str) -> (Vec<u8>, usize) {
    let fence = fence(c, key).unwrap();
    let payload: Vec<u8> = redis::cmd("DUMP").arg(key).query(c).unwrap();
    let needle = fence.to_be_bytes();
    let at = payload
        .windows(8)
        .position(|w| w == needle)
        .expect("the fence is saved as a 64-bit length");
    (payload, at)
}

/// Issue 8, defects 2 and 3: damaged RESTORE payloads are refused with an error, the
/// server stays up, and a refused payload leaves the fence mark alone.
#[test]
fn damaged_restore_payloads_are_refused_and_change_nothing() {
    if common::skip_unless(common::Needs::OwnServer, "reads the server's log") {
        return;
    }
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k", "holder-token", 60_000).unwrap();
    let (payload, fence_at) = dump_with_fence(&mut c, "k");
    let _: () = redis::cmd("DEBUG")
        .arg("SET-SKIP-CHECKSUM-VALIDATION")
        .arg(1)
        .query(&mut c)
        .unwrap();
    let hwm = s.info_field("fence_hwm");
    // Every truncation (the RDB version and checksum trail the value).
    for len in 1..payload.len() - 10 {
        assert!(
            restore(&mut c, "t", &payload[..len]).is_err(),
            "a payload cut at {len} bytes is refused"
        );
    }
    // A token length far beyond the payload.
    let token_len_at = payload
        .windows(12)
        .position(|w| w == b"holder-token")
        .unwrap()
        - 1;
    let mut long = payload.clone();
    long[token_len_at] = 0x80; // a 32-bit length follows
    long.splice(token_len_at + 1..token_len_at + 1, [0x7f, 0xff, 0xff, 0xff]);
    assert!(restore(&mut c, "t", &long).is_err());
    // A fence of i64::MAX, and of 0.
    for bad in [i64::MAX, 0] {
        let mut p = payload.clone();
        p[fence_at..fence_at + 8].copy_from_slice(&bad.to_be_bytes());
        let err = restore(&mut c, "t", &p).unwrap_err();
        assert!(error_text(&err).contains("Bad data format"), "{err}");
    }
    alive(&s);
    assert_eq!(s.info_field("fence_hwm"), hwm, "the mark is unchanged");
    let exists: i64 = redis::cmd("EXISTS").arg("t").query(&mut c).unwrap();
    assert_eq!(exists, 0);
    assert!(s.log().contains("refusing to load a lock value"));
    // Grants go on.
    let next = acquire(&mut c, "n", "x", 1000).unwrap();
    assert!(next > hwm && next < 1 << 62);
    // The valid payload restores, with its fence.
    restore(&mut c, "r", &payload).unwrap();
    assert_eq!(holder(&mut c, "r").as_deref(), Some("holder-token"));
}
