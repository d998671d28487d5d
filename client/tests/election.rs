//! Leader election with the client (`LockClient::election`) against real
//! servers: campaign in the line, proclaim, resign, observe (every change,
//! a vacancy included, resumed across lost connections), on one node and
//! a Redlock group.

use redis_lock_testkit as common;

use std::time::Duration;

use common::Server;
use futures_util::StreamExt;
use redis_lock_client::{Leader, LockClient, Observed, Observer};
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(30);

fn leader(fence: i64, value: &str) -> Observed {
    Observed::Leader(Leader {
        fence,
        value: Some(value.into()),
    })
}

/// The observer's next item, within 10 s (a loaded machine).
async fn next(o: &mut Observer) -> Observed {
    timeout(Duration::from_secs(10), o.next())
        .await
        .expect("told within 10 s")
        .expect("the stream goes on")
        .expect("no error")
}

/// Nothing more is told within `ms`.
async fn quiet(o: &mut Observer, ms: u64) {
    let more = timeout(Duration::from_millis(ms), o.next()).await;
    assert!(more.is_err(), "told again: {more:?}");
}

async fn wait_blocked(s: &Server, n: i64) {
    let start = std::time::Instant::now();
    while common::blocked_clients(s) != n {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} blocked",
            common::blocked_clients(s)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resign_hands_leadership_to_the_next_candidate_and_observers_see_it() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let election = locks.election("service:leader");
    let mut o = election.observe();
    assert_eq!(next(&mut o).await, Observed::Vacant, "the state now first");
    let a = election.campaign("10.0.0.1:7000", TTL).await.unwrap();
    assert_eq!(a.value(), "10.0.0.1:7000");
    assert_eq!(next(&mut o).await, leader(a.fence(), "10.0.0.1:7000"));
    assert_eq!(
        election.leader().await.unwrap(),
        Some(Leader {
            fence: a.fence(),
            value: Some("10.0.0.1:7000".into())
        })
    );
    let b = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .election("service:leader")
                .campaign("10.0.0.2:7000", TTL)
                .await
        })
    };
    // The observer and the candidate both wait in the server.
    wait_blocked(&s, 2).await;
    let first = a.fence();
    assert!(a.resign().await.unwrap());
    let b = b.await.unwrap().unwrap();
    assert!(b.fence() > first);
    // Handed over at once: the observer hears of the next leader, never
    // of a vacancy in between.
    assert_eq!(next(&mut o).await, leader(b.fence(), "10.0.0.2:7000"));
    // A proclaim: the same fence, the new value.
    assert!(b.proclaim("10.0.0.2:7001").await.unwrap());
    assert_eq!(b.value(), "10.0.0.2:7001");
    assert_eq!(next(&mut o).await, leader(b.fence(), "10.0.0.2:7001"));
    assert!(b.resign().await.unwrap());
    assert_eq!(next(&mut o).await, Observed::Vacant);
    assert_eq!(election.leader().await.unwrap(), None);
    // Dropping the stream closes its connection: nothing stays blocked.
    drop(o);
    wait_blocked(&s, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ends_is_a_vacancy_and_a_dropped_campaign_leaves_the_line() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let election = locks.election("k");
    // A leader that stops renewing (its process died): a plain grant.
    let f = common::acquire(&mut s.conn(), "k", "gone", 300).unwrap();
    let mut o = election.observe();
    assert_eq!(
        next(&mut o).await,
        Observed::Leader(Leader {
            fence: f,
            value: None
        })
    );
    assert_eq!(
        next(&mut o).await,
        Observed::Vacant,
        "told at the lease's end"
    );
    // A campaign given up while it waits leaves the line at once.
    let _holder = common::acquire(&mut s.conn(), "k", "h", 60_000).unwrap();
    let waiting = timeout(Duration::from_millis(300), election.campaign("c", TTL)).await;
    assert!(waiting.is_err(), "still waiting when dropped");
    let waiters = locks.info("k").await.remove(0).unwrap().unwrap().waiters;
    assert_eq!(waiters, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_resumes_after_its_connection_dies_without_repeating_or_missing() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let election = locks.election("k");
    let a = election.campaign("a", TTL).await.unwrap();
    let mut o = election.observe();
    assert_eq!(next(&mut o).await, leader(a.fence(), "a"));
    wait_blocked(&s, 1).await;
    // Kill the observer's connection and change the leader in one MULTI:
    // the change happens while it is away.
    let id: i64 = {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut s.conn())
            .unwrap();
        list.lines()
            .find(|l| l.contains("cmd=lock.observe"))
            .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
            .unwrap()
            .parse()
            .unwrap()
    };
    let token = a.lease().token().to_string();
    std::mem::forget(a); // its renewal would race the takeover below
    let mut c = s.conn();
    let (_, _, b): (i64, i64, i64) = redis::pipe()
        .atomic()
        .cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .cmd("LOCK.RELEASE")
        .arg("k")
        .arg(&token)
        .cmd("LOCK.ACQUIRE")
        .arg(&["k", "b", "60000", "VALUE", "b"])
        .query(&mut c)
        .unwrap();
    // The newest state, once; the vacancy in between is not invented.
    assert_eq!(next(&mut o).await, leader(b, "b"));
    quiet(&mut o, 500).await;
    wait_blocked(&s, 1).await;
    // And it goes on being told.
    common::release(&mut c, "k", "b");
    assert_eq!(next(&mut o).await, Observed::Vacant);
}

/// An observer sends nothing while nothing changes: the state once, then
/// one wait in the server (`AFTER fence VALUE v BLOCK 0`). Before, it
/// re-read the state every second to catch a proclaim made between an
/// answer and its next wait; the wait now names the value seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_observer_sends_nothing_while_nothing_changes() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let election = locks.election("k");
    let a = election.campaign("a", TTL).await.unwrap();
    let mut o = election.observe();
    assert_eq!(next(&mut o).await, leader(a.fence(), "a"));
    wait_blocked(&s, 1).await;
    let calls = || s.command_calls("lock.observe");
    let before = calls();
    quiet(&mut o, 2500).await;
    assert_eq!(calls(), before, "no command while nothing changed");
    assert!(a.proclaim("b").await.unwrap());
    assert_eq!(next(&mut o).await, leader(a.fence(), "b"));
}

/// The observed node is demoted (REPLICAOF a node where nobody leads):
/// Redis lets its blocked observer go with UNBLOCKED. The observer rides
/// that out as it does a lost connection and is told the vacancy the
/// replica now has. Before, the stream ended with the UNBLOCKED error
/// (and `redis-lock observe` exited 69).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_rides_out_its_node_being_demoted() {
    let s = Server::start();
    let other = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let election = locks.election("k");
    let a = election.campaign("a", TTL).await.unwrap();
    let mut o = election.observe();
    assert_eq!(next(&mut o).await, leader(a.fence(), "a"));
    wait_blocked(&s, 1).await;
    std::mem::forget(a); // its renewals would only be refused (READONLY)
    s.replicate_from(&other);
    assert_eq!(next(&mut o).await, Observed::Vacant);
}

/// One node's tokens for "g" run 10 s ahead of the others' (a grant there
/// asked for them), so a campaign's first phase grants two fences: the
/// group's is the majority's, with no second phase, and it is the one the
/// observer tells. (When the group's token was the largest, the observer
/// could see the majority agree on the first phase's fence before the
/// second raised it: a leader told with a fence it never led with.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_observer_tells_the_fence_the_leader_holds_when_a_node_is_ahead() {
    let ttl = Duration::from_secs(2);
    let nodes = Server::redlock_nodes(3, ttl.as_millis());
    let ahead = (common::now_ms() + 10_000) * 1000;
    let mut c = nodes[2].conn();
    let raised: i64 = loop {
        let granted = redis::cmd("LOCK.ACQUIRE")
            .arg("g")
            .arg("elsewhere")
            .arg(1000)
            .arg("MINFENCE")
            .arg(ahead)
            .query(&mut c);
        match granted {
            Ok(fence) => break fence,
            // The restart delay of a node just started.
            Err(e) if e.code() == Some("TRYAGAIN") => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(raised >= ahead);
    assert_eq!(common::release(&mut c, "g", "elsewhere"), 1);
    let locks = LockClient::new(&common::urls(&nodes)).unwrap();
    let election = locks.election("g");
    let mut o = election.observe();
    assert_eq!(next(&mut o).await, Observed::Vacant);
    let a = election.campaign("one", ttl).await.unwrap();
    assert!(a.fence() < raised, "the majority's token");
    let on_node = |n: &Server| common::fence(&mut n.conn(), "g");
    assert_eq!(on_node(&nodes[0]), Some(a.fence()));
    assert_eq!(on_node(&nodes[1]), Some(a.fence()));
    assert!(
        on_node(&nodes[2]).unwrap() > raised,
        "not raised or lowered"
    );
    assert_eq!(next(&mut o).await, leader(a.fence(), "one"));
    quiet(&mut o, 300).await;
    assert_eq!(
        election.leader().await.unwrap().map(|l| l.fence),
        Some(a.fence())
    );
    assert!(a.resign().await.unwrap());
    assert_eq!(next(&mut o).await, Observed::Vacant);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_group_elects_with_the_groups_fence() {
    // The nodes' restart delay is the TTL: a short one.
    let ttl = Duration::from_secs(2);
    let nodes = Server::redlock_nodes(3, ttl.as_millis());
    let urls = common::urls(&nodes);
    let locks = LockClient::new(&urls).unwrap();
    let election = locks.election("g");
    let mut o = election.observe();
    assert_eq!(next(&mut o).await, Observed::Vacant);
    let a = election.campaign("one", ttl).await.unwrap();
    assert_eq!(next(&mut o).await, leader(a.fence(), "one"));
    assert_eq!(
        election.leader().await.unwrap().map(|l| l.fence),
        Some(a.fence())
    );
    let first = a.fence();
    assert!(a.resign().await.unwrap());
    assert_eq!(next(&mut o).await, Observed::Vacant);
    let b = election.campaign("two", ttl).await.unwrap();
    assert!(b.fence() > first);
    assert_eq!(next(&mut o).await, leader(b.fence(), "two"));
    b.resign().await.unwrap();
}

/// One node of three refuses to be observed (its user lost LOCK.OBSERVE):
/// the group's stream goes on with the two that remain a majority, and
/// tells the next leader and the vacancy after it. Before, the one node's
/// NOPERM ended the whole stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_observer_outlives_one_node_that_refuses() {
    let ttl = Duration::from_secs(2);
    let nodes = Server::redlock_nodes(3, ttl.as_millis());
    let locks = LockClient::new(&common::urls(&nodes)).unwrap();
    let election = locks.election("g");
    let mut o = election.observe();
    assert_eq!(next(&mut o).await, Observed::Vacant);
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-lock.observe")
        .query(&mut nodes[2].conn())
        .unwrap();
    let a = election.campaign("one", ttl).await.unwrap();
    assert_eq!(next(&mut o).await, leader(a.fence(), "one"));
    assert!(a.resign().await.unwrap());
    assert_eq!(next(&mut o).await, Observed::Vacant);
}
