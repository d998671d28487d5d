//! The `redis-lock` command against real servers.

use redis_lock_testkit as common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{lease_ms, Server};

const BIN: &str = env!("CARGO_BIN_EXE_redis-lock");

fn redis_lock(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("REDIS_LOCK_URL")
        .output()
        .expect("run redis-lock")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn run_passes_the_fence_and_token_and_exits_with_the_commands_status() {
    if common::skip_unless(common::Needs::OwnServer, "counts INFO lock from zero") {
        return;
    }
    let s = Server::start();
    let u = s.url();
    let out = redis_lock(&[
        "run",
        "--url",
        &u,
        "--key",
        "job",
        "--ttl",
        "30s",
        "--",
        "sh",
        "-c",
        "echo fence=$REDIS_LOCK_FENCE token=$REDIS_LOCK_TOKEN; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let fence: i64 = stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix("fence="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(fence > 0);
    assert!(stdout.contains("token=") && !stdout.contains("token= "));
    assert_eq!(common::fence(&mut s.conn(), "job"), None, "released after");
    assert_eq!(s.info_field("releases"), 1);
}

#[test]
fn run_waits_then_gives_up_with_a_distinct_code() {
    let s = Server::start();
    common::acquire(&mut s.conn(), "busy", "someone", 60_000).unwrap();
    let start = Instant::now();
    let out = redis_lock(&[
        "run",
        "--url",
        &s.url(),
        "--key",
        "busy",
        "--ttl",
        "5s",
        "--wait",
        "300ms",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(75));
    assert!(start.elapsed() >= Duration::from_millis(300));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("busy") && err.contains("--wait"), "{err}");
}

#[test]
fn run_waits_in_line_and_runs_when_the_lock_frees() {
    if common::skip_unless(common::Needs::OwnServer, "counts INFO lock from zero") {
        return;
    }
    let s = Server::start();
    common::acquire(&mut s.conn(), "k", "someone", 60_000).unwrap();
    let child = Command::new(BIN)
        .args([
            "run",
            "--url",
            &s.url(),
            "--key",
            "k",
            "--ttl",
            "5s",
            "--wait",
            "20s",
            "--",
            "true",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_until(Duration::from_secs(10), || s.info_field("waiters") == 1);
    assert_eq!(common::release(&mut s.conn(), "k", "someone"), 1);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(s.info_field("handoffs"), 1);
}

#[test]
fn a_lost_lock_stops_the_command_and_exits_76() {
    let s = Server::start();
    let child = Command::new(BIN)
        .args([
            "run",
            "--url",
            &s.url(),
            "--key",
            "k",
            "--ttl",
            "900ms",
            "--",
            "sleep",
            "30",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_until(Duration::from_secs(10), || {
        common::fence(&mut s.conn(), "k").is_some()
    });
    let start = Instant::now();
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut s.conn()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(76), "{}", text(&out.stderr));
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "the child was stopped"
    );
    assert!(text(&out.stderr).contains("lost the lock"));
}

#[test]
fn a_command_ignoring_sigterm_is_killed_after_the_grace_period() {
    let s = Server::start();
    let child = Command::new(BIN)
        .args([
            "run",
            "--url",
            &s.url(),
            "--key",
            "k",
            "--ttl",
            "900ms",
            "--grace",
            "300ms",
            "--",
        ])
        .args(["sh", "-c", "trap '' TERM; sleep 30 & wait; sleep 30"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_until(Duration::from_secs(10), || {
        common::fence(&mut s.conn(), "k").is_some()
    });
    let start = Instant::now();
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut s.conn()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(76));
    assert!(start.elapsed() < Duration::from_secs(20));
}

#[test]
fn sigterm_to_redis_lock_reaches_the_command_and_the_lock_is_released() {
    let s = Server::start();
    let child = Command::new(BIN)
        .args([
            "run",
            "--url",
            &s.url(),
            "--key",
            "k",
            "--ttl",
            "30s",
            "--",
            "sleep",
            "30",
        ])
        .spawn()
        .unwrap();
    common::wait_until(Duration::from_secs(10), || {
        common::fence(&mut s.conn(), "k").is_some()
    });
    unsafe { libc_kill(child.id() as i32, 15) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + 15));
    assert_eq!(common::fence(&mut s.conn(), "k"), None);
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

#[test]
fn acquire_extend_release_and_info_for_scripts() {
    let s = Server::start();
    let u = s.url();
    let out = redis_lock(&["acquire", "--url", &u, "--key", "orders:42", "--ttl", "2s"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let vars = text(&out.stdout);
    let get = |name: &str| {
        vars.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap()
            .to_string()
    };
    let (token, fence) = (get("REDIS_LOCK_TOKEN"), get("REDIS_LOCK_FENCE"));
    assert_eq!(
        common::fence(&mut s.conn(), "orders:42"),
        Some(fence.parse().unwrap())
    );
    let out = redis_lock(&["info", "--url", &u, "--key", "orders:42"]);
    assert!(text(&out.stdout).contains(&format!("fence={fence}")));
    let out = redis_lock(&[
        "extend",
        "--url",
        &u,
        "--key",
        "orders:42",
        "--token",
        &token,
        "--ttl",
        "1m",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let pttl: i64 = lease_ms(&mut s.conn(), "orders:42");
    assert!(pttl > 50_000, "{pttl}");
    let out = redis_lock(&[
        "release",
        "--url",
        &u,
        "--key",
        "orders:42",
        "--token",
        "wrong",
    ]);
    assert_eq!(out.status.code(), Some(75));
    let out = redis_lock(&[
        "release",
        "--url",
        &u,
        "--key",
        "orders:42",
        "--token",
        &token,
    ]);
    assert_eq!(out.status.code(), Some(0));
    let out = redis_lock(&["info", "--url", &u, "--key", "orders:42"]);
    assert!(text(&out.stdout).contains("free"));
}

#[test]
fn redlock_over_three_nodes() {
    if common::skip_unless(common::Needs::OwnServer, "needs three servers") {
        return;
    }
    let nodes: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let mut args = vec!["run".to_string()];
    for n in &nodes {
        args.extend(["--url".into(), n.url()]);
    }
    args.extend(
        [
            "--key",
            "k",
            "--ttl",
            "10s",
            "--",
            "sh",
            "-c",
            "echo $REDIS_LOCK_FENCE",
        ]
        .map(String::from),
    );
    let out = Command::new(BIN).args(&args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let fence: i64 = text(&out.stdout).trim().parse().unwrap();
    for n in &nodes {
        assert!(n.info_field("fence_hwm") >= fence);
        assert_eq!(common::fence(&mut n.conn(), "k"), None);
    }
}

#[test]
fn usage_errors_say_what_to_do() {
    let out = redis_lock(&["run", "--key", "k", "--ttl", "ten", "--", "true"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out.stderr).contains("use e.g."),
        "{}",
        text(&out.stderr)
    );
    let out = redis_lock(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("Examples:"));
    let out = redis_lock(&[
        "run",
        "--url",
        "redis://127.0.0.1:1/",
        "--key",
        "k",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(69));
    assert!(text(&out.stderr).contains("module is loaded"));
}

#[test]
fn a_missing_command_is_127_and_releases() {
    let s = Server::start();
    let out = redis_lock(&[
        "run",
        "--url",
        &s.url(),
        "--key",
        "k",
        "--",
        "/nonexistent/program",
    ]);
    assert_eq!(out.status.code(), Some(127));
    assert_eq!(common::fence(&mut s.conn(), "k"), None);
}

#[test]
fn losing_a_majority_mid_run_stops_the_command_with_the_lost_lock_code() {
    if common::skip_unless(common::Needs::OwnServer, "needs five servers") {
        return;
    }
    let mut nodes: Vec<Server> = (0..5).map(|_| Server::start()).collect();
    let mut args = vec!["run".to_string()];
    for n in &nodes {
        args.extend(["--url".into(), n.url()]);
    }
    args.extend(["--key", "k", "--ttl", "1s", "--", "sleep", "30"].map(String::from));
    let child = Command::new(BIN)
        .args(&args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_until(Duration::from_secs(10), || {
        common::fence(&mut nodes[4].conn(), "k").is_some()
    });
    let start = Instant::now();
    for n in &mut nodes[..3] {
        n.kill9();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(76), "{}", text(&out.stderr));
    assert!(start.elapsed() < Duration::from_secs(20));
}
