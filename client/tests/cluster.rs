//! Redis Cluster from the client (issue 17): one lock node given as
//! `redis-cluster://`, every key's commands on its master (the module
//! routes by key; the redis crate follows MOVED and ASK), waiting in the
//! key's master's line.

use redis_lock_testkit as common;

use std::time::Duration;

use common::cluster::{Cluster, MASTER_RANGES};
use redis_lock_client::LockClient;

const BIN: &str = env!("CARGO_BIN_EXE_redis-lock");

/// A key whose slot is served by master `i`.
fn key_on(cluster: &Cluster, i: usize) -> String {
    let (lo, hi) = MASTER_RANGES[i];
    (0..)
        .map(|n| format!("order:{n}"))
        .find(|k| {
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(k)
                .query(&mut cluster.nodes[0].conn())
                .unwrap();
            (lo..=hi).contains(&slot)
        })
        .unwrap()
}

#[test]
fn a_cluster_url_locks_each_key_on_its_master_and_waits_in_its_line() {
    if common::skip_unless(common::Needs::OwnServer, "starts a cluster") {
        return;
    }
    let cluster = Cluster::start(false);
    let url = format!("redis-cluster://127.0.0.1:{}/", cluster.nodes[0].port);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let locks = LockClient::new(&[url.as_str()]).unwrap();
    runtime.block_on(async {
        for i in 0..3 {
            let key = key_on(&cluster, i);
            let guard = locks
                .try_acquire(&key, Duration::from_secs(10))
                .await
                .unwrap()
                .expect("free");
            assert_eq!(
                common::fence(&mut cluster.nodes[i].conn(), &key),
                Some(guard.fence()),
                "{key} is held on master {i}"
            );
            // Another holder waits in that master's line and is handed it.
            let other = locks.clone();
            let k = key.clone();
            let waiter = tokio::spawn(async move {
                other
                    .acquire(&k, Duration::from_secs(10))
                    .wait(Duration::from_secs(10))
                    .await
            });
            tokio::time::sleep(Duration::from_millis(200)).await;
            let fence = guard.fence();
            assert!(guard.release().await.unwrap());
            let next = waiter.await.unwrap().unwrap().expect("handed the lock");
            assert!(next.fence() > fence);
            assert!(next.release().await.unwrap());
        }
    });
    // The deployment read covers every master (before, INFO came back as
    // a map per master and the read failed; doctor called the cluster
    // unreachable, exit 69, and the library's warning never ran).
    let settings = runtime.block_on(locks.settings()).remove(0).unwrap();
    assert!(settings.module_loaded, "{settings:?}");
    assert_eq!(settings.run_id.split(',').count(), 3, "{settings:?}");
    assert!(settings.restart_delay_ms.is_some(), "{settings:?}");
    assert!(settings.appendfsync.is_some(), "{settings:?}");
    let doctor = std::process::Command::new(BIN)
        .args(["doctor", "--url", &url, "--ttl", "5s"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        matches!(doctor.status.code(), Some(0 | 78)),
        "{said}{}",
        String::from_utf8_lossy(&doctor.stderr)
    );
    assert!(said.contains("module loaded"), "{said}");
    // The command too.
    let key = key_on(&cluster, 2);
    let fence = common::fence_of_a_run(BIN, &url, &key, &[]);
    assert!(fence > 0);
    assert_eq!(
        common::fence(&mut cluster.nodes[2].conn(), &key),
        None,
        "released"
    );
}

/// Issue 23, item 4: replica acknowledgement on a cluster: the ACQUIRE and
/// its WAIT go to the key's master together, so each grant is on that
/// master's replica when the guard comes back; with the replica stopped,
/// the grant is refused and released.
#[test]
fn replica_acknowledgement_works_on_each_master_of_a_cluster() {
    if common::skip_unless(common::Needs::OwnServer, "starts a cluster") {
        return;
    }
    let cluster = Cluster::start(true);
    let url = format!("redis-cluster://127.0.0.1:{}/", cluster.nodes[0].port);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let options =
        redis_lock_client::Options::default().wait_replicas(1, Duration::from_millis(500));
    let locks = LockClient::with_options(&[url.as_str()], options).unwrap();
    // Each replica acknowledges what it has before the test starts.
    for i in 0..3 {
        let key = key_on(&cluster, i);
        cluster.nodes[i].wait_acknowledged(1, &format!("{{{key}}}:acked"));
    }
    runtime.block_on(async {
        for i in 0..3 {
            let key = key_on(&cluster, i);
            let guard = locks
                .try_acquire(&key, Duration::from_secs(10))
                .await
                .unwrap()
                .expect("free");
            // A replica serves reads of its master's slots after READONLY.
            let mut replica = cluster.nodes[i + 3].conn();
            let _: () = redis::cmd("READONLY").query(&mut replica).unwrap();
            assert_eq!(
                common::fence(&mut replica, &key),
                Some(guard.fence()),
                "{key}: on master {i}'s replica when the guard is returned"
            );
            assert!(guard.release().await.unwrap());
        }
        let key = key_on(&cluster, 0);
        cluster.nodes[3].signal("STOP");
        let refused = locks.try_acquire(&key, Duration::from_secs(10)).await;
        cluster.nodes[3].signal("CONT");
        assert!(
            matches!(refused, Err(redis_lock_client::Error::NotReplicated { .. })),
            "{refused:?}"
        );
        assert_eq!(common::fence(&mut cluster.nodes[0].conn(), &key), None);
    });
}

/// A lock over several keys of one slot (one hash tag) on every master of
/// a cluster: granted with one fence on that slot's master, a second
/// caller naming them in the other order waits there and is handed them.
#[test]
fn several_keys_of_one_slot_lock_on_its_master() {
    if common::skip_unless(common::Needs::OwnServer, "starts a cluster") {
        return;
    }
    let cluster = Cluster::start(false);
    let url = format!("redis-cluster://127.0.0.1:{}/", cluster.nodes[0].port);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let locks = LockClient::new(&[url.as_str()]).unwrap();
    runtime.block_on(async {
        for i in 0..3 {
            let tag = key_on(&cluster, i);
            let keys = [format!("{{{tag}}}:a"), format!("{{{tag}}}:b")];
            let guard = locks
                .acquire_all(&keys, Duration::from_secs(10))
                .await
                .unwrap()
                .expect("free");
            for k in &keys {
                assert_eq!(
                    common::fence(&mut cluster.nodes[i].conn(), k),
                    Some(guard.fence()),
                    "{k} is held on master {i}"
                );
            }
            let other = locks.clone();
            let reversed = [keys[1].clone(), keys[0].clone()];
            let waiter = tokio::spawn(async move {
                other
                    .acquire_all(&reversed, Duration::from_secs(10))
                    .wait(Duration::from_secs(10))
                    .await
            });
            common::wait_until(Duration::from_secs(5), || {
                cluster.nodes[i].info_field("waiters") == 1
            });
            let first = guard.fence();
            assert!(guard.release().await.unwrap());
            let next = waiter.await.unwrap().unwrap().expect("handed on");
            assert!(next.fence() > first);
            assert!(next.release().await.unwrap());
        }
    });
}
