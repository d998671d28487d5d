//! Redis Cluster: three masters on loopback (with replicas where failover
//! is tested), the module on every node.
//!
//! * routing: a cluster-aware client reaches every key's node, others MOVE it;
//! * resharding a slot that holds a lock (by hand, and with
//!   `redis-cli --cluster reshard`): one holder, lease and fence kept, no
//!   second lock left on the source, waiters told where the key went (`ASK`)
//!   and granted there, fences for the key keep rising on the target;
//! * `CLUSTER FAILOVER`: the lock survives, fences stay above every earlier one.

use redis_lock_testkit as common;

use std::process::Command;
use std::time::Duration;

use common::cluster::{Cluster, MASTER_RANGES};
use common::*;

/// `CLUSTER FAILOVER` on `replica` until it is master. A manual failover
/// is aborted (and must be asked again) when the master does not pause its
/// clients within Redis's 5 s limit, which happens on a loaded machine.
fn promote(replica: &Server) {
    let is_master = || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut replica.conn())
            .unwrap();
        info.contains("role:master")
    };
    for _ in 0..5 {
        let _: () = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query(&mut replica.conn())
            .unwrap();
        let asked = std::time::Instant::now();
        while asked.elapsed() < Duration::from_secs(12) {
            if is_master() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("the replica was not promoted after 5 CLUSTER FAILOVERs");
}

fn key_slot(node: &Server, key: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut node.conn())
        .unwrap()
}

/// A key named `<prefix><n>` whose slot master `master` serves, or (with
/// `slot`) that is exactly in that slot.
fn key_on(node: &Server, prefix: &str, master: usize, slot: Option<u16>) -> (String, u16) {
    let mut c = node.conn();
    let (lo, hi) = MASTER_RANGES[master];
    for chunk in 0..100 {
        let names: Vec<String> = (chunk * 10_000..(chunk + 1) * 10_000)
            .map(|i| format!("{prefix}{i}"))
            .collect();
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.cmd("CLUSTER").arg("KEYSLOT").arg(name);
        }
        let slots: Vec<u16> = pipe.query(&mut c).unwrap();
        for (name, s) in names.into_iter().zip(slots) {
            let wanted = match slot {
                Some(want) => s == want,
                None => (lo..=hi).contains(&s),
            };
            if wanted {
                return (name, s);
            }
        }
    }
    panic!("no key found for master {master} slot {slot:?}");
}

fn cluster_acquire(
    c: &mut redis::cluster::ClusterConnection,
    key: &str,
    token: &str,
    ttl: i64,
) -> Option<i64> {
    redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg(token)
        .arg(ttl)
        .query(c)
        .unwrap()
}

fn cluster_release(c: &mut redis::cluster::ClusterConnection, key: &str, token: &str) -> i64 {
    redis::cmd("LOCK.RELEASE")
        .arg(key)
        .arg(token)
        .query(c)
        .unwrap()
}

/// (token, fence) of the lock at `key` on `node`, None if free.
fn holder_on(node: &Server, key: &str) -> Option<(String, i64)> {
    holder_and_fence(&mut node.conn(), key)
}

fn waiters_on(node: &Server) -> i64 {
    node.info_field("waiters")
}

/// A cluster bus port taken between choosing and binding (by another test's
/// server: CI failed on this) does not fail the test: the server is started
/// again with both ports chosen anew.
#[test]
fn a_node_whose_bus_port_is_taken_starts_on_another() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().port();
    let node = Server::builder()
        .config("cluster-enabled", "yes")
        .config("cluster-port", &busy.to_string())
        .config("cluster-config-file", "nodes.conf")
        .start();
    let bus: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("cluster-port")
        .query(&mut node.conn())
        .unwrap();
    assert_ne!(bus[1], busy.to_string(), "the bus port in use was kept");
    let reply: String = redis::cmd("CLUSTER")
        .arg("MYID")
        .query(&mut node.conn())
        .unwrap();
    assert_eq!(reply.len(), 40);
}

#[test]
fn a_cluster_client_reaches_every_keys_node_and_others_redirect() {
    let cluster = Cluster::start(false);
    let mut client = cluster.client();
    for i in 0..30 {
        let key = format!("order:{i}");
        let token = format!("worker-{i}");
        let fence = cluster_acquire(&mut client, &key, &token, 60_000).expect("free lock");
        let slot = key_slot(&cluster.nodes[0], &key);
        let owner = MASTER_RANGES
            .iter()
            .position(|(lo, hi)| (*lo..=*hi).contains(&slot))
            .unwrap();
        assert_eq!(
            holder_on(&cluster.nodes[owner], &key),
            Some((token.clone(), fence)),
            "{key} is held on the node serving slot {slot}"
        );
        let other = &cluster.nodes[(owner + 1) % 3];
        let err = run_err(&mut other.conn(), &["LOCK.ACQUIRE", &key, "x", "1000"]);
        assert!(
            err.starts_with(&format!(
                "MOVED {slot} 127.0.0.1:{}",
                cluster.nodes[owner].port
            )),
            "{err}"
        );
        assert_eq!(cluster_release(&mut client, &key, &token), 1);
    }
}

#[test]
fn resharding_a_held_lock_keeps_it_and_sends_waiters_to_the_new_node() {
    let cluster = Cluster::start(false);
    let (source, target) = (&cluster.nodes[0], &cluster.nodes[1]);
    let (key, slot) = key_on(source, "job:", 0, None);
    let mut client = cluster.client();
    let first = cluster_acquire(&mut client, &key, "holder", 60_000).unwrap();
    let mut waiter = RawConn::block_acquire(source, &key, "waiter", 60_000, 30_000);
    wait_until(Duration::from_secs(10), || waiters_on(source) == 1);
    let grants_before = source.info_field("grants");

    cluster.start_moving(slot, 0, 1);
    let migrated: String = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(target.port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(&key)
        .query(&mut source.conn())
        .unwrap();
    assert_eq!(migrated, "OK");

    // The waiter is told where the key is now, and the source keeps no lock.
    assert_eq!(
        waiter.read(),
        Resp::Error(format!("ASK {slot} 127.0.0.1:{}", target.port))
    );
    let keys_left: i64 = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query(&mut source.conn())
        .unwrap();
    assert_eq!(keys_left, 0, "no second lock on the source");
    assert_eq!(source.info_field("grants"), grants_before);
    assert_eq!(source.info_field("waiters"), 0);
    assert_eq!(source.info_field("redirects"), 1);

    // It follows the ASK and waits on the target.
    let mut follower = RawConn::connect(target);
    follower.pipeline(&[
        &["ASKING"],
        &["LOCK.ACQUIRE", &key, "waiter", "60000", "BLOCK", "30000"],
    ]);
    assert_eq!(follower.read(), Resp::Simple("OK".into()));
    wait_until(Duration::from_secs(10), || waiters_on(target) == 1);

    // The move completes: this fails if a stray key is left on the source.
    cluster.assign(slot, 1);
    assert_eq!(holder_on(target, &key), Some(("holder".to_string(), first)));
    let pttl: i64 = lease_ms(&mut target.conn(), &key);
    assert!(pttl > 0 && pttl <= 60_000, "lease kept: {pttl}");
    let err = run_err(&mut source.conn(), &["LOCK.ACQUIRE", &key, "x", "1000"]);
    assert!(err.starts_with(&format!("MOVED {slot} ")), "{err}");

    // The holder releases through the cluster client (which follows MOVED);
    // the waiter is granted on the target, with a larger fence.
    assert_eq!(cluster_release(&mut client, &key, "holder"), 1);
    let Resp::Int(second) = follower.read() else {
        panic!("the follower was not granted")
    };
    assert!(second > first, "{second} > {first}");
    assert_eq!(
        holder_on(target, &key),
        Some(("waiter".to_string(), second))
    );
}

#[test]
fn redis_cli_reshard_of_a_held_lock_with_a_waiter() {
    let cluster = Cluster::start(false);
    let (source, target) = (&cluster.nodes[0], &cluster.nodes[1]);
    // redis-cli moves the source's lowest slots first: put the lock in slot 0.
    let (key, slot) = key_on(source, "stock:", 0, Some(0));
    let first = acquire(&mut source.conn(), &key, "holder", 60_000).unwrap();
    let mut waiter = RawConn::block_acquire(source, &key, "waiter", 60_000, 30_000);
    wait_until(Duration::from_secs(10), || waiters_on(source) == 1);

    let out = Command::new("redis-cli")
        .args([
            "--cluster",
            "reshard",
            &format!("127.0.0.1:{}", source.port),
        ])
        .args([
            "--cluster-from",
            &cluster.ids[0],
            "--cluster-to",
            &cluster.ids[1],
        ])
        .args(["--cluster-slots", "1", "--cluster-yes"])
        .output()
        .expect("redis-cli");
    assert!(
        out.status.success(),
        "reshard failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let reply = waiter.read();
    let Resp::Error(err) = &reply else {
        panic!("the waiter got {reply:?}, not a redirect")
    };
    assert!(
        err.starts_with(&format!("ASK {slot} 127.0.0.1:{}", target.port))
            || err.starts_with(&format!("MOVED {slot} 127.0.0.1:{}", target.port)),
        "{err}"
    );
    assert_eq!(holder_on(target, &key), Some(("holder".to_string(), first)));
    assert_eq!(acquire(&mut target.conn(), &key, "other", 1000), None);
    assert_eq!(release(&mut target.conn(), &key, "holder"), 1);
    let next = acquire(&mut target.conn(), &key, "other", 1000).unwrap();
    assert!(next > first, "{next} > {first}");
}

#[test]
fn a_free_lock_moved_to_another_node_gets_larger_fences_there() {
    let cluster = Cluster::start(false);
    let (source, target) = (&cluster.nodes[0], &cluster.nodes[1]);
    let (key, slot) = key_on(source, "free:", 0, None);
    let mut fences = vec![];
    for _ in 0..5 {
        fences.push(acquire(&mut source.conn(), &key, "a", 60_000).unwrap());
        assert_eq!(release(&mut source.conn(), &key, "a"), 1);
    }
    // Nothing to migrate: the lock is free, so the fence travels only as
    // time (fences are drawn as max(mark + 1, now in µs) on every node).
    cluster.start_moving(slot, 0, 1);
    cluster.assign(slot, 1);
    let moved = acquire(&mut target.conn(), &key, "b", 60_000).unwrap();
    assert!(
        moved > *fences.iter().max().unwrap(),
        "{moved} after {fences:?}"
    );
}

#[test]
fn cluster_failover_keeps_the_lock_and_fences_rise() {
    let cluster = Cluster::start(true);
    let (master, replica) = (&cluster.nodes[0], &cluster.nodes[3]);
    let (key, _) = key_on(master, "pay:", 0, None);
    let mut c = master.conn();
    let mut earlier = vec![];
    for i in 0..5 {
        let (k, _) = key_on(master, &format!("pay{i}:"), 0, None);
        earlier.push(acquire(&mut c, &k, "t", 60_000).unwrap());
    }
    let held = acquire(&mut c, &key, "holder", 60_000).unwrap();
    earlier.push(held);
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut c).unwrap();
    assert_eq!(acked, 1);
    let mut waiter = RawConn::block_acquire(master, &key, "waiter", 60_000, 30_000);
    wait_until(Duration::from_secs(10), || waiters_on(master) == 1);

    promote(replica);
    // The old master's waiter is answered with an error (Redis unblocks
    // every blocked client when a master turns replica), never a grant.
    match waiter.read_within(Duration::from_secs(20)) {
        Some(Resp::Error(e)) => assert!(e.starts_with("UNBLOCKED "), "{e}"),
        other => panic!("the old master's waiter got {other:?}"),
    }
    assert_eq!(holder_on(replica, &key), Some(("holder".to_string(), held)));
    let mut promoted = replica.conn();
    assert_eq!(acquire(&mut promoted, &key, "thief", 60_000), None);
    let (new_key, _) = key_on(replica, "pay-new:", 0, None);
    let fresh = acquire(&mut promoted, &new_key, "t", 60_000).unwrap();
    let max_earlier = *earlier.iter().max().unwrap();
    assert!(fresh > max_earlier, "{fresh} > {max_earlier}");
    assert_eq!(release(&mut promoted, &key, "holder"), 1);
    let next = acquire(&mut promoted, &key, "next", 60_000).unwrap();
    assert!(next > max_earlier, "{next} > {max_earlier}");
}

/// `LOCK.EXEC` and `LOCK.FENCED` declare their inner command's keys: in a
/// cluster they must all hash to the lock's (or gate's) slot, `CROSSSLOT`
/// otherwise, and nothing runs; a hash tag puts a lock and its data in one
/// slot, and a cluster client routes the guarded command by the lock key.
#[test]
fn guarded_commands_keep_a_lock_and_its_data_in_one_slot() {
    let cluster = Cluster::start(false);
    let mut client = cluster.client();
    let fence = cluster_acquire(&mut client, "{order:7}lock", "w", 60_000).unwrap();
    let ok: String = redis::cmd("LOCK.EXEC")
        .arg("{order:7}lock")
        .arg("w")
        .arg("SET")
        .arg("{order:7}data")
        .arg("paid")
        .query(&mut client)
        .unwrap();
    assert_eq!(ok, "OK");
    let got: Option<String> = redis::cmd("GET")
        .arg("{order:7}data")
        .query(&mut client)
        .unwrap();
    assert_eq!(got.as_deref(), Some("paid"));
    // Keys of two slots, on the lock's own node: CROSSSLOT from Redis.
    let (key, slot) = key_on(&cluster.nodes[0], "plain:", 0, None);
    let lock_node = &cluster.nodes[0];
    acquire(&mut lock_node.conn(), &key, "w", 60_000).unwrap();
    let other = (0..)
        .map(|i| format!("other:{i}"))
        .find(|k| key_slot(lock_node, k) != slot)
        .unwrap();
    let mut c = lock_node.conn();
    let e = run_err(&mut c, &["LOCK.EXEC", &key, "w", "SET", &other, "x"]);
    assert!(e.starts_with("CROSSSLOT"), "{e}");
    let e = run_err(&mut c, &["LOCK.FENCED", &key, "5", "SET", &other, "x"]);
    assert!(e.starts_with("CROSSSLOT"), "{e}");
    let e = run_err(
        &mut c,
        &[
            "LOCK.FENCED",
            "{gate}g",
            &fence.to_string(),
            "SET",
            "{x}d",
            "x",
        ],
    );
    assert!(e.starts_with("CROSSSLOT") || e.starts_with("MOVED"), "{e}");
    let exists: i64 = redis::cmd("EXISTS").arg(&other).query(&mut client).unwrap();
    assert_eq!(exists, 0, "nothing ran");
}

/// `LOCK.ACQUIREALL` and `LOCK.RELEASEALL` declare every key: in a
/// cluster they must share a slot (`CROSSSLOT` from Redis otherwise).
#[test]
fn multi_key_locks_keep_their_keys_in_one_slot() {
    let cluster = Cluster::start(false);
    let mut client = cluster.client();
    let granted: i64 = redis::cmd("LOCK.ACQUIREALL")
        .arg(2)
        .arg("{stock}a")
        .arg("{stock}b")
        .arg("w")
        .arg(60_000)
        .query(&mut client)
        .unwrap();
    assert!(granted > 0);
    let (key, slot) = key_on(&cluster.nodes[0], "plain:", 0, None);
    let node = &cluster.nodes[0];
    let other = (0..)
        .map(|i| format!("other:{i}"))
        .find(|k| key_slot(node, k) != slot)
        .unwrap();
    let e = run_err(
        &mut node.conn(),
        &["LOCK.ACQUIREALL", "2", &key, &other, "w", "100"],
    );
    assert!(e.starts_with("CROSSSLOT"), "{e}");
    assert_eq!(fence(&mut node.conn(), &key), None, "nothing ran");
    // A key served elsewhere: MOVED, as for any command.
    let away = (0..)
        .map(|i| format!("away:{i}"))
        .find(|k| key_slot(node, k) > MASTER_RANGES[0].1)
        .unwrap();
    let e = run_err(
        &mut node.conn(),
        &["LOCK.ACQUIREALL", "1", &away, "w", "100"],
    );
    assert!(e.starts_with("MOVED"), "{e}");
    let released: i64 = redis::cmd("LOCK.RELEASEALL")
        .arg(2)
        .arg("{stock}a")
        .arg("{stock}b")
        .arg("w")
        .query(&mut client)
        .unwrap();
    assert_eq!(released, 2);
}

/// Above `MAX_INNER_ARGS_FOR_KEYS` (256) arguments the guarded commands do
/// not report the inner command's keys (Redis 7.0 leaks its key buffer
/// past that), so Redis cannot check them against the lock's slot: an
/// `MSET` of 129 pairs in another slot of the same node ran under
/// `LOCK.EXEC`. In a cluster such a long inner command is refused before
/// anything runs; at 255 arguments the keys are still checked (CROSSSLOT).
#[test]
fn a_guarded_command_too_long_for_its_keys_to_be_checked_is_refused_in_a_cluster() {
    let cluster = Cluster::start(false);
    let node = &cluster.nodes[0];
    let (lock, slot) = key_on(node, "plain:", 0, None);
    // A hash tag in another slot served by the same node.
    let tag = (0..)
        .map(|i| format!("tag{i}"))
        .find(|t| {
            let s = key_slot(node, t);
            s != slot && s <= MASTER_RANGES[0].1
        })
        .unwrap();
    let mut c = node.conn();
    let f = acquire(&mut c, &lock, "w", 60_000).unwrap().to_string();
    let gate = format!("{{{lock}}}gate");
    let mset = |pairs: usize| -> Vec<String> {
        let mut args = vec!["MSET".to_string()];
        for i in 0..pairs {
            args.push(format!("{{{tag}}}k{i}"));
            args.push("x".to_string());
        }
        args
    };
    for (pairs, code) in [(127, "CROSSSLOT"), (129, "NOTGUARDABLE")] {
        let inner = mset(pairs);
        let inner: Vec<&str> = inner.iter().map(String::as_str).collect();
        let mut exec = vec!["LOCK.EXEC", &lock, "w"];
        exec.extend(&inner);
        let e = run_err(&mut c, &exec);
        assert!(e.starts_with(code), "{pairs} pairs: {e}");
        let mut fenced = vec!["LOCK.FENCED", &gate, &f];
        fenced.extend(&inner);
        let e = run_err(&mut c, &fenced);
        assert!(e.starts_with(code), "{pairs} pairs: {e}");
    }
    // The rule is the length: all keys in the gate's slot are refused too.
    let e = run_err(
        &mut c,
        &[
            &["LOCK.FENCED", &format!("{{{tag}}}gate"), &f][..],
            &mset(129).iter().map(String::as_str).collect::<Vec<_>>(),
        ]
        .concat(),
    );
    assert!(e.starts_with("NOTGUARDABLE") && e.contains("256"), "{e}");
    for key in [format!("{{{tag}}}k0"), format!("{{{tag}}}gate"), gate] {
        let exists: i64 = redis::cmd("EXISTS").arg(&key).query(&mut c).unwrap();
        assert_eq!(exists, 0, "{key}: nothing ran, no gate made");
    }
    assert!(fence(&mut c, &lock).is_some(), "the lock is still held");
}

/// A guarded script in a cluster filed its undeclared keys under the
/// lock's slot (Valkey 8.1, Redis 8.2: `GET` then missed the key, a
/// reshard failed at `MIGRATE`, and a lock taken that way was granted
/// again to another token). Scripts are refused inside a guard, and a
/// plain script (the README's way to guard several writes) touches keys
/// as the server's script rules allow: no key lands outside its slot and
/// no lock is granted twice, with or without `allow-cross-slot-keys`.
#[test]
fn scripts_neither_misfile_keys_nor_grant_a_lock_twice_in_a_cluster() {
    let cluster = Cluster::start(false);
    let node = &cluster.nodes[0];
    let v = node.version();
    let mut c = node.conn();
    let (lock, lock_slot) = key_on(node, "lock:", 0, None);
    let (other, other_slot) = (0..)
        .map(|i| key_on(node, &format!("other{i}:"), 0, None))
        .find(|(_, s)| *s != lock_slot)
        .unwrap();
    let f = acquire(&mut c, &lock, "w", 60_000).unwrap();
    let set_other = format!("return redis.call('SET', '{other}', 'v')");
    let e = run_err(&mut c, &["LOCK.EXEC", &lock, "w", "EVAL", &set_other, "0"]);
    assert!(e.starts_with("NOTGUARDABLE"), "{v}: {e}");
    let e = run_err(
        &mut c,
        &[
            "LOCK.FENCED",
            &lock,
            &f.to_string(),
            "EVAL",
            &set_other,
            "0",
        ],
    );
    assert!(
        e.starts_with("NOTGUARDABLE") || e.starts_with("WRONGTYPE"),
        "{v}: {e}"
    );
    let count = |slot: u16| -> i64 {
        redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(&mut node.conn())
            .unwrap()
    };
    assert_eq!(count(lock_slot), 1, "{v}: only the lock in its slot");
    assert_eq!(count(other_slot), 0, "{v}");
    // The way that works: a script over keys of one slot that checks the
    // lock, then writes.
    let data = format!("{{{lock}}}data");
    let lock_tagged = format!("{{{lock}}}lock");
    acquire(&mut c, &lock_tagged, "w", 60_000).unwrap();
    let ok: String = redis::cmd("EVAL")
        .arg(
            "if not redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) then \
               return redis.error_reply('NOTHELD') end \
             return redis.call('SET', KEYS[2], 'paid')",
        )
        .arg(2)
        .arg(&lock_tagged)
        .arg(&data)
        .arg("w")
        .query(&mut c)
        .unwrap();
    assert_eq!(ok, "OK", "{v}");
    // A plain script that takes a lock on a key it did not declare, in
    // another slot of this node: the server's script rules decide; if the
    // grant happened, the lock is in its own slot and nobody else gets it.
    let other_lock = format!("{{{other}}}lock");
    for script in [
        "return redis.call('LOCK.ACQUIRE', ARGV[1], 'a', 60000)",
        "#!lua flags=allow-cross-slot-keys\nreturn redis.call('LOCK.ACQUIRE', ARGV[1], 'a', 60000)",
    ] {
        for declared in [&[][..], &[lock.as_str()][..]] {
            let mut eval = redis::cmd("EVAL");
            eval.arg(script)
                .arg(declared.len())
                .arg(declared)
                .arg(&other_lock);
            let granted = eval.query::<Option<i64>>(&mut c);
            let second = acquire(&mut c, &other_lock, "b", 60_000);
            match granted {
                Ok(Some(_)) => {
                    assert_eq!(second, None, "{v} {script} {declared:?}: granted twice");
                    assert_eq!(count(other_slot), 1, "{v}: filed in its own slot");
                    assert_eq!(holder(&mut c, &other_lock).as_deref(), Some("a"), "{v}");
                    release(&mut c, &other_lock, "a");
                }
                Ok(None) => panic!("{v}: the key was free"),
                Err(e) => {
                    assert!(second.is_some(), "{v} {script}: {e}");
                    release(&mut c, &other_lock, "b");
                }
            }
            assert_eq!(count(other_slot), 0, "{v}");
        }
    }
}
