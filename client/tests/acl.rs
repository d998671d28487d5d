//! Issue 23, item 6: restricted users. A Redlock group whose user has the
//! README's ACL recipe works in full (one round trip per node for a free
//! lock, one server under two names refused); with the lock commands
//! alone, a group whose nodes cannot be told apart is refused unless the
//! caller says they are distinct, TIME is asked once, not per acquire, and
//! a waiter keeps its place in the ordering node's line (PING refused is
//! still an answer).

use redis_lock_testkit as common;

use std::time::Duration;

use common::{wait_until, Server};
use redis_lock_client::{Error, LockClient, Options};

const LOCK_COMMANDS: &[&str] = &[
    "+lock.acquire",
    "+lock.release",
    "+lock.extend",
    "+lock.fence",
    "+lock.info",
];

/// The whole ACL recipe for the client and the command (docs/operations.md,
/// Security), read from that page: its rules after the key pattern.
fn recipe() -> Vec<String> {
    let readme =
        std::fs::read_to_string(common::workspace_root().join("docs/operations.md")).unwrap();
    let at = readme
        .find("The whole recipe for the client and the command")
        .expect("docs/operations.md's whole recipe");
    let line = readme[at..]
        .lines()
        .find(|l| l.starts_with("ACL SETUSER app"))
        .expect("its ACL SETUSER line");
    line.split_whitespace()
        .filter(|w| w.starts_with('+'))
        .map(str::to_string)
        .collect()
}

/// A user `name` with `rules` on `s`; its URL (`host` names the server).
fn user(s: &Server, host: &str, name: &str, rules: &[&str]) -> String {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(name).arg("on").arg(">pw").arg("~*");
    for r in rules {
        cmd.arg(*r);
    }
    let _: () = cmd.query(&mut s.conn()).unwrap();
    format!("redis://{name}:pw@{host}:{}/", s.port)
}

/// `calls` and `rejected_calls` of `command` in INFO commandstats.
fn calls(s: &Server, command: &str) -> (i64, i64) {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut s.conn())
        .unwrap();
    let Some(line) = text
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
    else {
        return (0, 0);
    };
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .map_or(0, |v| v.parse().unwrap())
    };
    (field("calls"), field("rejected_calls"))
}

fn nodes_up() -> Option<Vec<Server>> {
    if common::skip_unless(common::Needs::OwnServer, "ACL users and command counts") {
        return None;
    }
    Some((0..3).map(|_| Server::start()).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recipe_gives_every_feature() {
    let Some(nodes) = nodes_up() else { return };
    let recipe = recipe();
    let rules: Vec<&str> = recipe.iter().map(String::as_str).collect();
    for c in LOCK_COMMANDS {
        assert!(rules.contains(c), "the recipe lacks {c}");
    }
    let urls: Vec<String> = nodes
        .iter()
        .map(|s| user(s, "127.0.0.1", "app", &rules))
        .collect();
    // One server under two names is refused (INFO tells them apart).
    let alias = format!("redis://app:pw@localhost:{}/", nodes[0].port);
    let twice = LockClient::new(&[urls[0].clone(), alias, urls[1].clone()]).unwrap();
    let refused = twice.try_acquire("acl:k", Duration::from_secs(5)).await;
    assert!(
        matches!(&refused, Err(Error::Config(why)) if why.contains("same server")),
        "{refused:?}"
    );
    // A free lock: one ACQUIRE per node (the nodes' clock read with TIME,
    // so the first phase asks for a floor every node grants). A run
    // delayed past the floor's 2 ms lead rightly takes a second phase: CI's
    // loaded machine delayed three in a row, then ten, then (Redis 8.2,
    // the whole suite beside it) 200 tries made within a second of load.
    // So the tries are spread over up to 20 s, one of which must ask each
    // node once: a burst of load passes, a floor never agreed on does not.
    let locks = LockClient::new(&urls).unwrap();
    let mut once = false;
    for round in 0..400 {
        if round > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let before: Vec<i64> = nodes.iter().map(|s| calls(s, "lock.acquire").0).collect();
        let key = format!("acl:free:{round}");
        let guard = locks
            .try_acquire(&key, Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free");
        let after: Vec<i64> = nodes.iter().map(|s| calls(s, "lock.acquire").0).collect();
        assert!(guard.release().await.unwrap());
        if before.iter().zip(&after).all(|(b, a)| a - b == 1) {
            once = true;
            break;
        }
    }
    assert!(once, "never one ACQUIRE per node");
    for s in &nodes {
        assert_eq!(calls(s, "time").1, 0, "TIME was refused");
        assert_eq!(calls(s, "info").1, 0, "INFO was refused");
    }
    // The command over two keys, with a guarded write under the lock (the
    // user may also run the inner command): exit 77 before the recipe
    // named LOCK.ACQUIREALL, LOCK.RELEASEALL and LOCK.EXEC.
    let node = &nodes[0];
    let mut with_set = rules.clone();
    with_set.push("+set");
    let url = user(node, "127.0.0.1", "app2", &with_set);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redis-lock"))
        .args([
            "run", "--url", &url, "--key", "{acl}a", "--key", "{acl}b", "--",
        ])
        .args([
            "sh",
            "-c",
            &format!(
                "redis-cli -e -p {} --user app2 --pass pw --no-auth-warning \
                 LOCK.EXEC \"$REDIS_LOCK_KEY\" \"$REDIS_LOCK_TOKEN\" SET {{acl}}done yes",
                node.port
            ),
        ])
        .env_remove("REDIS_LOCK_URL")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let done: Option<String> = redis::cmd("GET")
        .arg("{acl}done")
        .query(&mut node.conn())
        .unwrap();
    assert_eq!(done.as_deref(), Some("yes"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_lock_commands_alone_an_unverifiable_group_is_refused() {
    let Some(nodes) = nodes_up() else { return };
    let urls: Vec<String> = nodes
        .iter()
        .map(|s| user(s, "127.0.0.1", "bare", LOCK_COMMANDS))
        .collect();
    // Before: accepted without a word, even one server under two names.
    let locks = LockClient::new(&urls).unwrap();
    let refused = locks.try_acquire("acl:k", Duration::from_secs(5)).await;
    assert!(
        matches!(&refused, Err(Error::Config(why)) if why.contains("INFO") && why.contains("distinct")),
        "{refused:?}"
    );
    for s in &nodes {
        assert_eq!(
            common::fence(&mut s.conn(), "acl:k"),
            None,
            "nothing granted"
        );
    }
    // Told they are distinct: it locks; TIME is refused once per node,
    // not asked again before every acquire.
    let options = Options::default().distinct_nodes(true);
    let locks = LockClient::with_options(&urls, options.clone()).unwrap();
    for round in 0..3 {
        let guard = locks
            .try_acquire(&format!("acl:told:{round}"), Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free");
        // A majority holds the group's token. Without TIME there is no
        // MINFENCE, so each node grants from its own clock: the second phase
        // raises those below the middle token to it. When two granted the
        // same µs they are the majority already and the one below keeps its
        // own token (CI saw [..486, ..579, ..579]); it is still a grant.
        let fences: Vec<i64> = nodes
            .iter()
            .map(|s| common::fence(&mut s.conn(), guard.key()).unwrap())
            .collect();
        let holding = fences.iter().filter(|f| **f == guard.fence()).count();
        assert!(holding * 2 > nodes.len(), "{fences:?} {}", guard.fence());
        let mut sorted = fences.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted[nodes.len() / 2],
            guard.fence(),
            "the group's token is the middle one: {fences:?}"
        );
        assert!(guard.release().await.unwrap());
    }
    for s in &nodes {
        assert!(
            calls(s, "time").1 <= 1,
            "TIME asked again: {:?}",
            calls(s, "time")
        );
    }
    // A waiter keeps its place in the ordering node's line (before, the
    // refused PING made it leave the line and retry after random pauses).
    let holder = locks
        .try_acquire("acl:line", Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free");
    let o = locks.ordering_node("acl:line");
    let waiting = LockClient::with_options(&urls, options).unwrap();
    let waiter = tokio::spawn(async move {
        waiting
            .acquire("acl:line", Duration::from_secs(10))
            .wait(Duration::from_secs(20))
            .await
    });
    wait_until(Duration::from_secs(10), || {
        nodes[o].info_field("waiters") == 1
    });
    let blocked_before = calls(&nodes[o], "lock.acquire").0;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(nodes[o].info_field("waiters"), 1, "left the line");
    assert_eq!(
        calls(&nodes[o], "lock.acquire").0,
        blocked_before,
        "the waiter asked again instead of waiting in line"
    );
    assert!(holder.release().await.unwrap());
    let guard = waiter.await.unwrap().unwrap().expect("handed over");
    assert!(guard.release().await.unwrap());
}

/// `redis-lock doctor` as a user without INFO says so (before: "did not
/// answer", exit 69 as if the node were down); `--distinct-nodes` lets the
/// command use such a group.
#[test]
fn the_command_names_what_a_restricted_user_may_not_do() {
    let Some(nodes) = nodes_up() else { return };
    let urls: Vec<String> = nodes
        .iter()
        .map(|s| user(s, "127.0.0.1", "bare", LOCK_COMMANDS))
        .collect();
    let with_urls = |args: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_redis-lock"));
        cmd.arg(args[0]);
        for u in &urls {
            cmd.args(["--url", u]);
        }
        cmd.args(&args[1..]).env_remove("REDIS_LOCK_URL");
        cmd.output().unwrap()
    };
    let out = with_urls(&["doctor"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(78), "{said}");
    assert!(said.contains("may not run INFO"), "{said}");
    let out = with_urls(&["run", "--key", "acl:cli", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("--distinct-nodes"));
    let out = with_urls(&["run", "--key", "acl:cli", "--distinct-nodes", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
