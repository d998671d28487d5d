//! A change to a shared key replicates what it changed (issue 31, item 8).
//! Every change used to write the whole key to replicas and the AOF
//! (`LOCK._SHARED` with every holder): 3,000 holders of one key made 374 MB
//! of replication traffic, and a replica was cut off at its output-buffer
//! limit. Now one holder added or renewed is `LOCK._HOLD`, one leaving is
//! `LOCK._DROP`: the bytes per change do not grow with the holders, and the
//! replica and a replay of the AOF still end with the master's state after
//! a random history of grants, renewals, releases and ended leases.

use redis_lock_testkit as common;

use std::time::Duration;

use common::*;

fn shared(c: &mut Connection, key: &str, token: &str, ttl: i64) -> Option<i64> {
    redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg(token)
        .arg(ttl)
        .arg("SHARED")
        .query(c)
        .unwrap()
}

fn repl_offset(c: &mut Connection) -> i64 {
    info_number(c, "replication", "master_repl_offset")
}

/// The key's live holders as (token, fence), sorted, from `LOCK.INFO`'s
/// `holders` field (a flat array of name and value per holder on RESP2).
fn holders(c: &mut Connection, key: &str) -> Vec<(Vec<u8>, i64)> {
    let redis::Value::Array(fields) = lock_info_reply(c, key) else {
        return Vec::new();
    };
    let Some(redis::Value::Array(list)) = fields
        .chunks(2)
        .find(|p| p[0] == redis::Value::BulkString(b"holders".to_vec()))
        .map(|p| p[1].clone())
    else {
        panic!("no holders field: {fields:?}")
    };
    let mut all: Vec<(Vec<u8>, i64)> = list
        .iter()
        .map(|h| {
            let redis::Value::Array(h) = h else {
                panic!("{h:?}")
            };
            let (mut token, mut fence) = (Vec::new(), 0);
            for p in h.chunks(2) {
                match (&p[0], &p[1]) {
                    (redis::Value::BulkString(n), redis::Value::BulkString(t)) if n == b"token" => {
                        token = t.clone()
                    }
                    (redis::Value::BulkString(n), redis::Value::Int(f)) if n == b"fence" => {
                        fence = *f
                    }
                    _ => {}
                }
            }
            (token, fence)
        })
        .collect();
    all.sort();
    all
}

/// Bytes the master sends its replicas for each kind of change, with
/// `n` holders on the key.
fn bytes_per_change(master: &Server, n: usize) -> [i64; 4] {
    let mut c = master.conn();
    let key = format!("sem{n}");
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.cmd("LOCK.ACQUIRE")
            .arg(&key)
            .arg(format!("holder-{i:06}"))
            .arg(600_000)
            .arg("SHARED")
            .ignore();
    }
    pipe.query::<()>(&mut c).unwrap();
    let mut measure = |f: &mut dyn FnMut(&mut Connection)| {
        let before = repl_offset(&mut c);
        f(&mut c);
        repl_offset(&mut c) - before
    };
    let grant = measure(&mut |c| {
        shared(c, &key, "newcomer", 600_000).unwrap();
    });
    let renew = measure(&mut |c| {
        shared(c, &key, "holder-000001", 600_000).unwrap();
    });
    let extend_one = measure(&mut |c| {
        assert_eq!(extend(c, &key, "holder-000002", 600_000), 1);
    });
    let leave = measure(&mut |c| {
        assert_eq!(release(c, &key, "holder-000003"), 1);
    });
    [grant, renew, extend_one, leave]
}

#[test]
fn a_change_replicates_the_same_few_bytes_whatever_the_holders() {
    let master = Server::start();
    let replica = Server::start();
    let v = master.version();
    replica.replicate_from(&master);
    let few = bytes_per_change(&master, 10);
    let many = bytes_per_change(&master, 3_000);
    for (kind, (a, b)) in ["grant", "renew", "extend", "release"]
        .iter()
        .zip(few.iter().zip(many.iter()))
    {
        // The same change, in bytes: the key's name and the holder's
        // fields, not its neighbours'.
        assert!(*b < 400, "{v}: a {kind} with 3,000 holders sent {b} bytes");
        assert!(
            (b - a).abs() < 16,
            "{v}: a {kind} sent {a} bytes with 10 holders, {b} with 3,000"
        );
    }
    master.wait_acknowledged(1, "scratch");
    let (mut m, mut r) = (master.conn(), replica.conn());
    assert_eq!(holders(&mut m, "sem3000"), holders(&mut r, "sem3000"));
    assert_eq!(holders(&mut r, "sem3000").len(), 3_000);
    assert_eq!(digest(&mut m), digest(&mut r), "{v}");
}

/// A random history of one shared key and a semaphore, against a replica
/// and an AOF (no RDB preamble: the stream itself is replayed): grants of
/// new holders, renewals by ACQUIRE and EXTEND, releases, leases that end
/// and are reclaimed by a later grant. The replica, a replica that
/// attaches afterwards, and the master restarted from its AOF all hold
/// the master's holders.
#[test]
fn a_random_history_of_holders_reaches_replicas_and_the_aof_whole() {
    let mut master = Server::builder()
        .config("appendonly", "yes")
        .config("appendfsync", "always")
        .config("aof-use-rdb-preamble", "no")
        .start();
    let replica = Server::start();
    let v = master.version();
    replica.replicate_from(&master);
    let mut c = master.conn();
    let seed = now_ms() as u64;
    let mut rng = seed;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for step in 0..1_500 {
        let key = if next(4) == 0 { "sem" } else { "readers" };
        let token = format!("t{}", next(60));
        let result: redis::RedisResult<redis::Value> = match next(5) {
            0 | 1 => {
                // Short leases now and then: they end, and a later grant
                // reclaims them.
                let ttl = if next(4) == 0 { 5 } else { 600_000 };
                let mut cmd = redis::cmd("LOCK.ACQUIRE");
                cmd.arg(key).arg(&token).arg(ttl).arg("SHARED");
                if key == "sem" {
                    cmd.arg("LIMIT").arg(20);
                }
                cmd.query(&mut c)
            }
            2 => redis::cmd("LOCK.EXTEND")
                .arg(key)
                .arg(&token)
                .arg(600_000)
                .query(&mut c),
            3 => redis::cmd("LOCK.RELEASE")
                .arg(key)
                .arg(&token)
                .query(&mut c),
            _ => {
                std::thread::sleep(Duration::from_millis(1));
                Ok(redis::Value::Nil)
            }
        };
        if let Err(e) = result {
            panic!("{v} seed {seed} step {step}: {e}");
        }
    }
    // Every 5 ms lease has ended before the state is read.
    std::thread::sleep(Duration::from_millis(20));
    master.wait_acknowledged(1, "scratch");
    let want: Vec<_> = ["readers", "sem"]
        .iter()
        .map(|k| holders(&mut c, k))
        .collect();
    assert!(
        want.iter().any(|h| h.len() > 5),
        "{v}: a history with holders"
    );
    let mut r = replica.conn();
    for (k, w) in ["readers", "sem"].iter().zip(&want) {
        assert_eq!(&holders(&mut r, k), w, "{v} seed {seed}: replica of {k}");
    }
    let late = Server::start();
    late.replicate_from(&master);
    master.wait_acknowledged(2, "scratch");
    let mut l = late.conn();
    for (k, w) in ["readers", "sem"].iter().zip(&want) {
        assert_eq!(
            &holders(&mut l, k),
            w,
            "{v} seed {seed}: late replica of {k}"
        );
    }
    master.kill9();
    master.restart();
    let mut c = master.conn();
    for (k, w) in ["readers", "sem"].iter().zip(&want) {
        assert_eq!(&holders(&mut c, k), w, "{v} seed {seed}: AOF replay of {k}");
    }
}
