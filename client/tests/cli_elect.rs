//! `redis-lock elect` and `redis-lock observe` against a real server: a
//! command run while leading, handed over when it ends, followers told of
//! each change; a leader stopped (SIGSTOP) past its lease is deposed and
//! its fenced writes are refused.

use redis_lock_testkit as common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::Server;

const BIN: &str = env!("CARGO_BIN_EXE_redis-lock");

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid, which it has not reaped.
    assert_eq!(unsafe { kill(child.id() as i32, sig) }, 0);
}

fn spawn(args: &[&str]) -> Child {
    Command::new(BIN)
        .args(args)
        .env_remove("REDIS_LOCK_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run redis-lock")
}

/// Each line the child prints, as it prints it.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    rx
}

fn next_line(rx: &mpsc::Receiver<String>) -> String {
    rx.recv_timeout(Duration::from_secs(20))
        .expect("a line within 20 s")
}

/// `(leader?, fence, value)` of an `observe --json` line.
fn change(line: &str) -> (bool, i64, Option<String>) {
    let leader = line.contains("\"leader\":true");
    let fence = line
        .split("\"fence\":")
        .nth(1)
        .and_then(|r| r.split([',', '}']).next())
        .map_or(0, |f| f.parse().unwrap());
    let value = line
        .split("\"value\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .map(String::from);
    (leader, fence, value)
}

#[test]
fn elect_runs_the_command_while_leading_and_the_next_candidate_follows() {
    let s = Server::start();
    let u = s.url();
    let mut observer = spawn(&["observe", "--url", &u, "--key", "svc", "--json"]);
    let changes = lines(&mut observer);
    assert_eq!(change(&next_line(&changes)), (false, 0, None));
    let elect = |value: &str| {
        spawn(&[
            "elect",
            "--url",
            &u,
            "--key",
            "svc",
            "--value",
            value,
            "--ttl",
            "5s",
            "--",
            "sh",
            "-c",
            "echo \"$REDIS_LOCK_VALUE $REDIS_LOCK_FENCE\"; sleep 1",
        ])
    };
    let mut a = elect("node-a");
    let a_said = lines(&mut a);
    let (leader, fence_a, value) = change(&next_line(&changes));
    assert!(leader);
    assert_eq!(value.as_deref(), Some("node-a"));
    assert_eq!(next_line(&a_said), format!("node-a {fence_a}"));
    let mut b = elect("node-b");
    let b_said = lines(&mut b);
    // A's command ends: it resigns, and B (waiting in line) leads at once.
    assert!(a.wait().unwrap().success());
    let (leader, fence_b, value) = change(&next_line(&changes));
    assert!(leader && fence_b > fence_a);
    assert_eq!(value.as_deref(), Some("node-b"));
    assert_eq!(next_line(&b_said), format!("node-b {fence_b}"));
    assert!(b.wait().unwrap().success());
    assert_eq!(change(&next_line(&changes)), (false, 0, None));
    let _ = observer.kill();
    let _ = observer.wait();
}

/// The peers' failure (a stopped process still believing it leads): the
/// leader is stopped past its lease; the next candidate leads; the old
/// leader's command, still running, writes through the gate with its
/// fence and is refused from the new leader's first write on; the old
/// leader, continued, exits 76 (lost).
#[test]
fn a_leader_stopped_past_its_lease_is_deposed_and_its_fenced_writes_refused() {
    let s = Server::start();
    let u = s.url();
    // Each leader's command appends "<value> <fence>" to a list through
    // the gate, every 50 ms, for as long as it runs.
    let writer = format!(
        "while :; do redis-cli -u {u} LOCK.FENCED gate \"$REDIS_LOCK_FENCE\" RPUSH log \"$REDIS_LOCK_VALUE $REDIS_LOCK_FENCE\" >/dev/null 2>&1; sleep 0.05; done"
    );
    let elect = |value: &str, script: &str| {
        spawn(&[
            "elect", "--url", &u, "--key", "svc", "--value", value, "--ttl", "1s", "--", "sh",
            "-c", script,
        ])
    };
    let log = || -> Vec<String> {
        redis::cmd("LRANGE")
            .arg("log")
            .arg(0)
            .arg(-1)
            .query(&mut s.conn())
            .unwrap()
    };
    let a = elect("a", &writer);
    common::wait_until(Duration::from_secs(20), || !log().is_empty());
    let b_script = format!(
        "for i in $(seq 20); do {}; done",
        writer.replace("while :; do ", "").replace("; done", "")
    );
    let b = elect("b", &b_script);
    signal(&a, 19); // SIGSTOP: its renewals stop, its command does not
    common::wait_until(Duration::from_secs(20), || {
        log().iter().any(|l| l.starts_with("b "))
    });
    std::thread::sleep(Duration::from_millis(500));
    signal(&a, 18); // SIGCONT
    let a_out = a.wait_with_output().unwrap();
    assert_eq!(
        a_out.status.code(),
        Some(76),
        "{}",
        String::from_utf8_lossy(&a_out.stderr)
    );
    assert!(b.wait_with_output().unwrap().status.success());
    let written = log();
    let first_b = written.iter().position(|l| l.starts_with("b ")).unwrap();
    assert!(
        written[first_b..].iter().all(|l| l.starts_with("b ")),
        "a write of the deposed leader was accepted after the new one's: {written:?}"
    );
    let fence = |l: &String| l.split(' ').nth(1).unwrap().parse::<i64>().unwrap();
    assert!(fence(&written[first_b]) > fence(&written[0]));
}
