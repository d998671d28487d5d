//! `redis-lock top` (issue 35): one frame without a terminal, against one
//! node, a Redlock group's three and a cluster, with what it says when it
//! may not list; and live in a real terminal (tmux): keys sent, the pane
//! read back, the terminal as it was after `q`.

use redis_lock_testkit as common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{RawConn, Server, Skip, Tmux};

const BIN: &str = env!("CARGO_BIN_EXE_redis-lock");

/// `redis-lock top --once` over `urls` (no terminal): its output and exit code.
fn once(urls: &[String], extra: &[&str]) -> (String, Option<i32>) {
    let mut cmd = Command::new(BIN);
    cmd.arg("top").arg("--once");
    for u in urls {
        cmd.args(["--url", u]);
    }
    let out = cmd
        .args(extra)
        .env_remove("REDIS_LOCK_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run redis-lock top");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code(),
    )
}

/// Whether tmux is here; if not, the test is counted as skipped.
fn tmux_or_skip() -> bool {
    if Tmux::available() {
        return true;
    }
    common::skip(
        Skip::Missing,
        "tmux is not installed (apt-get install -y tmux)",
    );
    false
}

/// `redis-lock top` on `s` in a tmux pane 160 wide and `height` high; after
/// it the shell prints `stty -a` and `top-exited-<its exit code>`.
fn live_top(s: &Server, height: u16) -> Tmux {
    let shell = format!(
        "{BIN} top --url {} --interval 300ms; rc=$?; stty -a; echo top-exited-$rc",
        s.url()
    );
    Tmux::start(&shell, 160, height)
}

/// The rows of a frame that name `key`.
fn rows_of<'a>(frame: &'a str, key: &str) -> Vec<&'a str> {
    frame
        .lines()
        .filter(|l| {
            l.get(2..)
                .is_some_and(|r| r.starts_with(&format!("{key} ")))
        })
        .collect()
}

/// `orders:1` held with two waiters, `orders:2` with one, `jobs:7` with
/// none: the waiters' connections, kept for as long as they must wait.
fn busy(s: &Server) -> Vec<RawConn> {
    let mut c = s.conn();
    let mut waiting = Vec::new();
    for (key, n) in [("orders:1", 2), ("orders:2", 1), ("jobs:7", 0)] {
        common::acquire(&mut c, key, "holder", 60_000).expect("granted");
        for i in 0..n {
            waiting.push(RawConn::block_acquire(s, key, &format!("w{i}"), 60_000, 0));
        }
    }
    common::wait_until(Duration::from_secs(10), || s.info_field("waiters") == 3);
    waiting
}

#[test]
fn one_frame_lists_the_locks_the_most_waited_for_first() {
    let s = Server::start();
    let _waiting = busy(&s);
    let (frame, code) = once(&[s.url()], &[]);
    assert_eq!(code, Some(0), "{frame}");
    assert!(frame.contains("locks 3  waiters 3"), "{frame}");
    let order: Vec<&str> = frame
        .lines()
        .filter(|l| l.contains("exclusive"))
        .filter_map(|l| l.get(2..)?.split_whitespace().next())
        .collect();
    assert_eq!(order, ["orders:1", "orders:2", "jobs:7"], "{frame}");
    let row = rows_of(&frame, "orders:1")[0];
    let fence = common::fence(&mut s.conn(), "orders:1").unwrap();
    assert!(row.contains(&fence.to_string()), "{row}");
    assert!(row.contains("exclusive"), "{row}");
    // By key, and filtered.
    let (by_key, _) = once(&[s.url()], &["--sort", "key", "--match", "orders:*"]);
    assert!(rows_of(&by_key, "jobs:7").is_empty(), "{by_key}");
    let first = by_key.find("orders:1").unwrap();
    assert!(first < by_key.find("orders:2").unwrap(), "{by_key}");
}

#[test]
fn a_group_and_a_cluster_are_read_node_by_node() {
    if common::skip_unless(common::Needs::OwnServer, "starts a cluster") {
        return;
    }
    let group: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let urls: Vec<String> = group.iter().map(Server::url).collect();
    for s in &group {
        common::acquire(&mut s.conn(), "res", "t", 60_000).unwrap();
    }
    let (frame, code) = once(&urls, &[]);
    assert_eq!(code, Some(0), "{frame}");
    let rows = rows_of(&frame, "res");
    assert_eq!(rows.len(), 3, "one row per node: {frame}");
    for s in &group {
        let node = format!("127.0.0.1:{}", s.port);
        assert!(rows.iter().any(|r| r.contains(&node)), "{node}: {frame}");
    }
    let cluster = common::cluster::Cluster::start(false);
    let owner = cluster.acquire_on_owner("hot", "t", 60_000);
    let url = format!("redis-cluster://127.0.0.1:{}/", cluster.nodes[0].port);
    let (frame, code) = once(&[url], &[]);
    assert_eq!(code, Some(0), "{frame}");
    assert!(frame.contains("3 node(s)"), "every master: {frame}");
    let rows = rows_of(&frame, "hot");
    assert_eq!(rows.len(), 1, "{frame}");
    assert!(
        rows[0].contains(&format!("127.0.0.1:{}", owner.port)),
        "{frame}"
    );
}

/// Without LOCK.SCAN in its ACL a user sees the counters and is told why
/// no lock is listed; a node without the module, or down, is named; with
/// no node answering, the exit is 69.
#[test]
fn what_it_cannot_read_it_says() {
    let s = Server::start();
    let _waiting = busy(&s);
    common::set_user(&mut s.conn(), "ops", &["+info", "~*"]);
    let url = format!("redis://ops:pw@127.0.0.1:{}/", s.port);
    let (frame, code) = once(&[url], &[]);
    assert_eq!(code, Some(0), "{frame}");
    assert!(frame.contains("may not run LOCK.SCAN"), "{frame}");
    assert!(frame.contains("locks 3"), "the counters still: {frame}");
    let plain = Server::builder().without_module().start();
    let (frame, _) = once(&[plain.url()], &[]);
    assert!(frame.contains("no redis-lock module"), "{frame}");
    let down = format!("redis://127.0.0.1:{}/", common::free_port());
    let (frame, code) = once(&[down], &["--interval", "500ms"]);
    assert_eq!(code, Some(69), "{frame}");
    assert!(frame.contains("counters not read"), "{frame}");
}

/// Live, in a real terminal: it draws, sorts, filters, shows one lock's
/// holders, goes back, quits on `q`, and leaves the terminal as it was
/// (canonical mode and echo back on).
#[test]
fn live_in_a_terminal_it_sorts_filters_and_shows_a_lock() {
    if !tmux_or_skip() {
        return;
    }
    let s = Server::start();
    let _waiting = busy(&s);
    // Seven rows: the frame fills the screen, whose header must stay.
    let t = live_top(&s, 7);
    let limit = Duration::from_secs(20);
    let first = t.wait_for(limit, "the locks", |p| {
        p.contains("orders:2") && p.contains("jobs:7")
    });
    assert!(first.starts_with("redis-lock top:"), "{first}");
    assert!(first.contains("sort: waiters"), "{first}");
    let selected = first.lines().find(|l| l.starts_with('>')).unwrap_or("");
    assert!(
        selected.contains("orders:1"),
        "the top row is chosen: {first}"
    );
    t.keys(&["s"]);
    t.wait_for(limit, "the next sort", |p| p.contains("sort: wait "));
    t.keys(&["/"]);
    t.wait_for(limit, "the filter prompt", |p| p.contains("filter (glob"));
    t.type_text("jobs:*");
    t.keys(&["Enter"]);
    let filtered = t.wait_for(limit, "only jobs:7", |p| {
        p.contains("filter: jobs:*") && p.contains("jobs:7") && !p.contains("orders:1")
    });
    assert!(
        filtered.contains("locks 3"),
        "the counters are the node's: {filtered}"
    );
    t.keys(&["/"]);
    t.keys(&["Enter"]);
    t.wait_for(limit, "every lock again", |p| {
        p.contains("orders:1") && p.contains("filter: * ")
    });
    t.keys(&["Enter"]);
    let detail = t.wait_for(limit, "orders:1's holders", |p| p.contains("TOKEN"));
    assert!(detail.contains("holder"), "its token: {detail}");
    assert!(detail.contains("2 waiting"), "{detail}");
    t.keys(&["Escape"]);
    t.wait_for(limit, "the list again", |p| p.contains("WAITERS"));
    t.keys(&["q"]);
    let after = t.wait_for(limit, "the shell after top", |p| p.contains("top-exited-"));
    assert!(after.contains("top-exited-0"), "{after}");
    let modes: Vec<&str> = after.split_whitespace().collect();
    assert!(
        modes.contains(&"icanon") && modes.contains(&"echo"),
        "the terminal restored: {after}"
    );
}

/// An interval too short to be a refresh (a tight loop on the nodes) or too
/// long to add to the clock is refused as a usage error, before anything
/// is read.
#[test]
fn an_interval_out_of_bounds_is_refused() {
    let s = Server::start();
    for interval in ["0s", "10ms", "1000000000000s"] {
        let (frame, code) = once(&[s.url()], &["--interval", interval]);
        assert_eq!(code, Some(64), "--interval {interval}: {frame}");
    }
}

/// SIGINT or SIGTERM from another process (a supervisor, `kill`) ends the
/// live view like `q`: the terminal is put back.
#[test]
fn a_signal_from_outside_puts_the_terminal_back() {
    if !tmux_or_skip() {
        return;
    }
    let s = Server::start();
    let _waiting = busy(&s);
    for signal in ["INT", "TERM"] {
        let t = live_top(&s, 20);
        let limit = Duration::from_secs(20);
        t.wait_for(limit, "the locks", |p| p.contains("orders:1"));
        let pid = top_pid(&s.url()).expect("top is running");
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} {pid}");
        let after = t.wait_for(limit, "the shell after top", |p| p.contains("top-exited-"));
        let modes: Vec<&str> = after.split_whitespace().collect();
        assert!(
            modes.contains(&"icanon") && modes.contains(&"echo"),
            "SIG{signal}: the terminal restored: {after}"
        );
        assert!(after.contains("top-exited-0"), "SIG{signal}: {after}");
    }
}

/// The pid of the `redis-lock top` reading `url` (by /proc: the process
/// named redis-lock whose arguments name it; not the shell or tmux, whose
/// command lines hold the same words).
fn top_pid(url: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        let args = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = args.split(|&b| b == 0).collect();
        let named = comm.trim() == "redis-lock"
            && args.get(1) == Some(&&b"top"[..])
            && args.contains(&url.as_bytes());
        named.then_some(pid)
    })
}

/// A lock taken again and again shows its grants a second, though its key
/// leaves the keyspace at every release (the server counts the key's
/// grants, not the lock's); a lock nobody takes again shows 0.0; `s` sorts
/// by it.
#[test]
fn a_lock_taken_again_and_again_shows_its_grants_a_second() {
    if !tmux_or_skip() {
        return;
    }
    let s = Server::start();
    let mut c = s.conn();
    common::acquire(&mut c, "idle", "holder", 60_000).expect("granted");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (stop, mut c) = (stop.clone(), s.conn());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                common::acquire(&mut c, "hot", "churn", 60_000).expect("granted");
                std::thread::sleep(Duration::from_millis(20));
                assert_eq!(common::release(&mut c, "hot", "churn"), 1);
            }
        })
    };
    let t = live_top(&s, 12);
    let limit = Duration::from_secs(30);
    let rate = |pane: &str, key: &str| -> Option<f64> {
        rows_of(pane, key)
            .first()?
            .split_whitespace()
            .last()?
            .parse()
            .ok()
    };
    let pane = t.wait_for(limit, "a rate for both locks", |p| {
        p.contains("GRANTS/S")
            && rate(p, "hot").is_some_and(|r| r > 0.0)
            && rate(p, "idle").is_some()
    });
    assert_eq!(rate(&pane, "idle"), Some(0.0), "{pane}");
    t.keys(&["s", "s"]);
    let sorted = t.wait_for(limit, "sorted by grants", |p| {
        p.contains("sort: grants") && rate(p, "hot").is_some_and(|r| r > 0.0)
    });
    let order: Vec<&str> = sorted
        .lines()
        .filter(|l| l.contains("exclusive"))
        .filter_map(|l| l.get(2..)?.split_whitespace().next())
        .collect();
    assert_eq!(order.first(), Some(&"hot"), "{sorted}");
    t.keys(&["q"]);
    t.wait_for(limit, "the shell after top", |p| p.contains("top-exited-"));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.join().expect("the churn thread");
}
