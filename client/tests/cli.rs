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

/// `redis-lock SUB --url U1 --url U2 ... REST...`, run to its end.
fn redis_lock_on(sub: &str, urls: &[String], rest: &[&str]) -> Output {
    let mut args = vec![sub.to_string()];
    for u in urls {
        args.extend(["--url".into(), u.clone()]);
    }
    args.extend(rest.iter().map(|a| a.to_string()));
    Command::new(BIN)
        .args(&args)
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

/// Issue 23, item 7: the command gets this lock's validity, never a
/// stale `REDIS_LOCK_VALIDITY_MS` from the caller's environment (a script
/// that ran `eval "$(redis-lock acquire ...)"` for another lock before).
#[test]
fn run_gives_the_command_its_own_validity_not_the_callers() {
    let s = Server::start();
    let out = Command::new(BIN)
        .args([
            "run",
            "--url",
            &s.url(),
            "--key",
            "own-validity",
            "--ttl",
            "30s",
        ])
        .args(["--", "sh", "-c", "echo validity=$REDIS_LOCK_VALIDITY_MS"])
        .env_remove("REDIS_LOCK_URL")
        .env("REDIS_LOCK_VALIDITY_MS", "1")
        .output()
        .expect("run redis-lock");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let validity: u64 = stdout
        .trim()
        .strip_prefix("validity=")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{stdout:?}"));
    assert!(
        validity > 1_000 && validity <= 30_000,
        "the lock's own validity, not the caller's 1: {validity}"
    );
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
        let value = vars
            .lines()
            .find_map(|l| l.strip_prefix(&format!("export {name}=")))
            .unwrap();
        value.trim_matches('\'').to_string()
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
    assert!(text(&out.stderr).contains("server is up"));
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

/// `eval "$(redis-lock acquire ...)"` exports the variables (a program the
/// script runs sees them, as under `run`) and quotes the token: a token
/// with shell syntax is data, never code. The validity is printed too.
#[test]
fn acquire_output_is_exported_and_quoted_for_eval() {
    let s = Server::start();
    let dir = common::ScratchDir::new("eval");
    let pwned = dir.join("pwned");
    let token = format!(
        "x'; touch {}; echo '$(touch {})",
        pwned.display(),
        pwned.display()
    );
    let script = format!(
        "eval \"$({BIN} acquire --url {} --key k --ttl 5s --token \"$TOKEN\")\" || exit 9; \
         sh -c 'echo fence=$REDIS_LOCK_FENCE; echo validity=$REDIS_LOCK_VALIDITY_MS; printf %s \"$REDIS_LOCK_TOKEN\" > {}'",
        s.url(),
        dir.join("token").display()
    );
    let out = Command::new("sh")
        .args(["-c", &script])
        .env("TOKEN", &token)
        .env_remove("REDIS_LOCK_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!pwned.exists(), "the token ran as shell code");
    let stdout = text(&out.stdout);
    let fence: i64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("fence="))
        .expect("the child sees REDIS_LOCK_FENCE")
        .parse()
        .unwrap();
    assert_eq!(common::fence(&mut s.conn(), "k"), Some(fence));
    let validity: i64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("validity="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(validity > 0 && validity <= 5000, "{validity}");
    assert_eq!(std::fs::read_to_string(dir.join("token")).unwrap(), token);
    assert_eq!(
        common::holder(&mut s.conn(), "k").as_deref(),
        Some(token.as_str())
    );
}

/// Arguments a node refuses are usage errors (64), a node in its restart
/// delay says try again (75), and a TTL too short to leave any validity is
/// refused before anything runs: before, all of them were 69 "lock nodes
/// unavailable ... check --url", and `--ttl 1ms` ran the command and exited 76.
#[test]
fn refusals_get_the_exit_code_of_what_went_wrong() {
    if common::skip_unless(common::Needs::OwnServer, "starts with restart-delay-ms") {
        return;
    }
    let s = Server::builder().module_arg("max-ttl-ms", "60000").start();
    let u = s.url();
    let dir = common::ScratchDir::new("ran");
    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());
    for (ttl, code, says) in [
        ("0", 64, "--ttl"),
        ("1ms", 64, "--ttl"),
        ("2m", 64, "max-ttl-ms"),
    ] {
        let out = redis_lock(&[
            "run", "--url", &u, "--key", "k", "--ttl", ttl, "--", "sh", "-c", &touch,
        ]);
        assert_eq!(
            out.status.code(),
            Some(code),
            "--ttl {ttl}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(says),
            "--ttl {ttl}: {}",
            text(&out.stderr)
        );
        assert!(!marker.exists(), "--ttl {ttl}: the command ran");
        let out = redis_lock(&["acquire", "--url", &u, "--key", "k", "--ttl", ttl]);
        assert_eq!(out.status.code(), Some(code), "acquire --ttl {ttl}");
    }
    assert_eq!(common::fence(&mut s.conn(), "k"), None);
    let delayed = Server::builder()
        .module_arg("restart-delay-ms", "60000")
        .start();
    let out = redis_lock(&[
        "run",
        "--url",
        &delayed.url(),
        "--key",
        "k",
        "--ttl",
        "5s",
        "--",
        "sh",
        "-c",
        &touch,
    ]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("try again"),
        "{}",
        text(&out.stderr)
    );
    assert!(!marker.exists());
}

/// One server given twice (the same URL, an alias, another database) would
/// count as several Redlock votes: refused as a usage error naming both.
/// An even count is accepted with a warning. Before, all were accepted
/// without a word.
#[test]
fn the_same_server_twice_is_refused_and_an_even_count_warned() {
    if common::skip_unless(common::Needs::OwnServer, "needs three servers") {
        return;
    }
    let nodes: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let (a, b) = (nodes[0].port, nodes[1].port);
    for urls in [
        vec![
            format!("redis://127.0.0.1:{a}/"),
            format!("redis://127.0.0.1:{a}/"),
            format!("redis://127.0.0.1:{b}/"),
        ],
        vec![
            format!("redis://127.0.0.1:{a}/"),
            format!("redis://localhost:{a}/"),
            format!("redis://127.0.0.1:{b}/"),
        ],
        vec![
            format!("redis://127.0.0.1:{a}/0"),
            format!("redis://127.0.0.1:{a}/1"),
            format!("redis://127.0.0.1:{b}/"),
        ],
    ] {
        let out = redis_lock_on("run", &urls, &["--key", "k", "--ttl", "5s", "--", "true"]);
        assert_eq!(
            out.status.code(),
            Some(64),
            "{urls:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains("same server"),
            "{}",
            text(&out.stderr)
        );
        for n in &nodes {
            assert_eq!(
                common::fence(&mut n.conn(), "k"),
                None,
                "{urls:?}: nothing granted"
            );
        }
    }
    let two = common::urls(&nodes[..2]);
    let out = redis_lock_on("run", &two, &["--key", "k", "--ttl", "5s", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("odd number"),
        "{}",
        text(&out.stderr)
    );
}

/// `redis-lock doctor` reports each node and what to fix: a restart delay
/// below the TTL without `appendfsync always`, the same server twice, an
/// even count; a safe group passes. `--json` is machine-readable, as are
/// `acquire --json`, `extend --json` and `info --json`.
#[test]
fn doctor_finds_unsafe_settings_and_json_output_is_parseable() {
    if common::skip_unless(
        common::Needs::OwnServer,
        "needs three servers with their own settings",
    ) {
        return;
    }
    let nodes: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let doctor = |urls: &[String], extra: &[&str]| redis_lock_on("doctor", urls, extra);
    let urls: Vec<String> = nodes.iter().map(Server::url).collect();
    // Machine-readable acquire and info (before the restart delay below
    // pauses new grants on these freshly started nodes).
    let out = redis_lock(&[
        "acquire", "--url", &urls[0], "--key", "j\"son", "--ttl", "5s", "--token", "a\"b\\c",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    assert!(
        line.starts_with("{\"key\":\"j\\\"son\",\"token\":\"a\\\"b\\\\c\",\"fence\":"),
        "{line}"
    );
    assert!(line.contains("\"validity_ms\":"), "{line}");
    let out = redis_lock(&[
        "extend", "--url", &urls[0], "--key", "j\"son", "--ttl", "8s", "--token", "a\"b\\c",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    let validity_ms: u64 = line
        .strip_prefix("{\"key\":\"j\\\"son\",\"token\":\"a\\\"b\\\\c\",\"validity_ms\":")
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("extend --json printed {line}"))
        .parse()
        .unwrap();
    assert!(
        line.trim_end().ends_with(",\"keys\":[\"j\\\"son\"]}"),
        "{line}"
    );
    assert!((5_000..8_000).contains(&validity_ms), "{line}");
    let out = redis_lock(&[
        "extend", "--url", &urls[0], "--key", "j\"son", "--ttl", "0", "--token", "a\"b\\c",
    ]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    let out = redis_lock(&["info", "--url", &urls[0], "--key", "j\"son", "--json"]);
    assert!(
        text(&out.stdout).starts_with("{\"node\":0,\"held\":true,\"token\":\"a\\\"b\\\\c\""),
        "{}",
        text(&out.stdout)
    );
    // Defaults: no restart delay, no AOF: unsafe for any TTL.
    let out = doctor(&urls, &["--ttl", "10s"]);
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("restart-delay-ms 0 is below the TTL"),
        "{}",
        text(&out.stdout)
    );
    for n in &nodes {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("lock.restart-delay-ms")
            .arg(10_000)
            .query(&mut n.conn())
            .unwrap();
    }
    let out = doctor(&urls, &["--ttl", "10s"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("ok: nothing to fix"));
    let twice = vec![urls[0].clone(), urls[0].clone(), urls[1].clone()];
    let out = doctor(&twice, &["--ttl", "10s", "--json"]);
    assert_eq!(out.status.code(), Some(78));
    let last = text(&out.stdout).lines().last().unwrap().to_string();
    assert!(
        last.starts_with("{\"findings\":[") && last.contains("same server"),
        "{last}"
    );
    let out = doctor(&urls[..2], &["--ttl", "10s"]);
    assert!(
        text(&out.stdout).contains("even count"),
        "{}",
        text(&out.stdout)
    );
}

/// A release that finds the token on a minority of the nodes (a failed
/// extend left its lease there) says so and that it released them, instead
/// of "was not held".
#[test]
fn a_release_found_on_a_minority_says_what_it_did() {
    if common::skip_unless(common::Needs::OwnServer, "needs three servers") {
        return;
    }
    let nodes: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    common::acquire(&mut nodes[0].conn(), "k", "tok", 60_000).unwrap();
    let out = redis_lock_on(
        "release",
        &common::urls(&nodes),
        &["--key", "k", "--token", "tok"],
    );
    assert_eq!(out.status.code(), Some(75));
    let err = text(&out.stderr);
    assert!(
        err.contains("on 1 of 3 nodes only") && err.contains("released on those 1"),
        "{err}"
    );
    assert_eq!(common::fence(&mut nodes[0].conn(), "k"), None);
}

/// `run` on a Redlock group warns (and still runs) when a node's restart
/// delay is below the TTL without `appendfsync always`.
#[test]
fn run_warns_about_a_group_that_is_unsafe_after_a_crash() {
    if common::skip_unless(common::Needs::OwnServer, "needs three servers") {
        return;
    }
    let nodes: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let out = redis_lock_on(
        "run",
        &common::urls(&nodes),
        &["--key", "k", "--ttl", "10s", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("restart-delay-ms 0 is below the TTL (10000 ms)"),
        "{}",
        text(&out.stderr)
    );
}

/// An extend that reaches a majority but extends only a minority (the lock
/// was lost) gives those nodes back, instead of leaving a fresh lease for
/// nobody there; a successful extend prints the validity.
#[test]
fn a_failed_minority_extend_releases_what_it_extended() {
    if common::skip_unless(common::Needs::OwnServer, "needs three servers") {
        return;
    }
    let nodes: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    common::acquire(&mut nodes[0].conn(), "k", "tok", 2_000).unwrap();
    let urls = common::urls(&nodes);
    let extend = |ttl: &str| {
        redis_lock_on(
            "extend",
            &urls,
            &["--key", "k", "--token", "tok", "--ttl", ttl],
        )
    };
    let out = extend("60s");
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert_eq!(common::fence(&mut nodes[0].conn(), "k"), None, "given back");
    for n in &nodes {
        common::acquire(&mut n.conn(), "k", "tok", 5_000).unwrap();
    }
    let out = extend("30s");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let validity: u64 = text(&out.stdout)
        .trim()
        .strip_prefix("export REDIS_LOCK_VALIDITY_MS=")
        .unwrap()
        .parse()
        .unwrap();
    assert!(validity > 25_000 && validity <= 30_000, "{validity}");
}

/// Whether process `pid` is still running (a zombie, exited but not yet
/// reaped, counts as ended).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z')
        })
        .unwrap_or(false)
}

/// The pid a job wrote to `file`, once it has.
fn pid_in(file: &std::path::Path) -> i32 {
    let mut pid = None;
    common::wait_until(Duration::from_secs(10), || {
        pid = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse().ok());
        pid.is_some()
    });
    pid.unwrap()
}

/// An empty directory of this test's own for its child's pid file
/// (`pid` inside it), removed on drop.
fn scratch(name: &str) -> common::ScratchDir {
    common::ScratchDir::new(&format!("cli-{name}"))
}

/// A lost lock stops the whole job, not only the command: a process the
/// command started that ignores SIGTERM is killed before `redis-lock`
/// exits (before, the command's exit ended the job and the process ran on
/// without the lock while another holder was granted).
#[test]
fn a_lost_lock_kills_what_the_command_started_before_exiting() {
    let s = Server::start();
    let dir = scratch("lost");
    let pid_file = dir.join("pid");
    let script = format!(
        "(trap '' TERM; exec sleep 60) >/dev/null 2>&1 & echo $! > {}; wait",
        pid_file.display()
    );
    let mut child = Command::new(BIN)
        .args(["run", "--url", &s.url(), "--key", "k", "--ttl", "3s", "--"])
        .args(["sh", "-c", &script])
        .env_remove("REDIS_LOCK_URL")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let straggler = pid_in(&pid_file);
    assert!(running(straggler));
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut s.conn()).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(76));
    assert!(
        !running(straggler),
        "a process of the job outlived redis-lock after the lock was lost"
    );
}

/// The job ends with the command, and the lock with the whole job: what
/// the command left running in its process group gets SIGTERM at once, and
/// one that ignores it SIGKILL after --grace, while the lock is still held
/// (renewed); it is released only once none is left. Before, it was
/// released as the command exited, under the processes still running.
#[test]
fn what_the_command_left_running_is_stopped_before_the_lock_is_released() {
    let s = Server::start();
    // One that ends on SIGTERM: the job ends at once.
    let dir = scratch("term");
    let pid_file = dir.join("pid");
    let script = format!(
        "sleep 60 >/dev/null 2>&1 & echo $! > {}",
        pid_file.display()
    );
    let start = Instant::now();
    let out = Command::new(BIN)
        .args([
            "run",
            "--url",
            &s.url(),
            "--key",
            "k",
            "--ttl",
            "900ms",
            "--",
        ])
        .args(["sh", "-c", &script])
        .env_remove("REDIS_LOCK_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "not held for the sleep"
    );
    assert!(!running(pid_in(&pid_file)));
    assert!(
        text(&out.stderr).contains("stopping what it left running"),
        "{}",
        text(&out.stderr)
    );
    // One that ignores SIGTERM: SIGKILL after the grace, the lock held
    // until then.
    let dir = scratch("ignores");
    let pid_file = dir.join("pid");
    // The command exits only once the leftover has set its trap (it writes
    // its pid after): exiting first raced the trap with the SIGTERM.
    let script = format!(
        "(trap '' TERM; sh -c 'echo $PPID' > {p}.tmp && mv {p}.tmp {p}; exec sleep 60) >/dev/null 2>&1 & while [ ! -s {p} ]; do sleep 0.01; done",
        p = pid_file.display()
    );
    let start = Instant::now();
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
            "2s",
            "--",
        ])
        .args(["sh", "-c", &script])
        .env_remove("REDIS_LOCK_URL")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let left = pid_in(&pid_file);
    std::thread::sleep(Duration::from_millis(1200));
    if start.elapsed() < Duration::from_millis(1900) {
        assert!(running(left));
        assert!(
            common::fence(&mut s.conn(), "k").is_some(),
            "released while a process of the job still ran"
        );
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(start.elapsed() >= Duration::from_millis(1900));
    assert!(!running(left), "killed before redis-lock exited");
    assert_eq!(
        common::fence(&mut s.conn(), "k"),
        None,
        "released at the end"
    );
}

/// A lease whose validity ran out while `redis-lock` was stopped (SIGSTOP,
/// which it cannot see) and the command went on is reported as lost (76)
/// when the command's exit and the lapse are seen together; before, which
/// came first was a coin toss and the command's 0 often won.
#[test]
fn a_validity_run_out_while_redis_lock_was_stopped_exits_76() {
    let s = Server::start();
    for round in 0..3 {
        let dir = scratch(&format!("stopped-{round}"));
        let pid_file = dir.join("pid");
        // The command says it started: a stop that came after the grant
        // but before redis-lock read its answer would time the acquire
        // out (69, the command never run), which is not this test's case.
        let script = format!(
            "echo $$ > {p}.tmp && mv {p}.tmp {p}; exec sleep 1",
            p = pid_file.display()
        );
        let child = Command::new(BIN)
            .args([
                "run",
                "--url",
                &s.url(),
                "--key",
                "k",
                "--ttl",
                "500ms",
                "--",
            ])
            .args(["sh", "-c", &script])
            .env_remove("REDIS_LOCK_URL")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        pid_in(&pid_file);
        // SIGSTOP. The lease lapses and another holder takes the lock; the
        // command ends meanwhile.
        unsafe { libc_kill(child.id() as i32, 19) };
        common::wait_until(Duration::from_secs(10), || {
            common::acquire(&mut s.conn(), "k", "other", 60_000).is_some()
        });
        std::thread::sleep(Duration::from_millis(1500));
        unsafe { libc_kill(child.id() as i32, 18) }; // SIGCONT
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(76),
            "round {round}: {}",
            text(&out.stderr)
        );
        // Issue 23, item 7: no --grace was given, so none is talked of.
        assert!(
            !text(&out.stderr).contains("--grace"),
            "round {round}: {}",
            text(&out.stderr)
        );
        let _: i64 = redis::cmd("DEL").arg("k").query(&mut s.conn()).unwrap();
    }
}

/// `run` over a Redlock group asks each node once when the lock is free:
/// its own fresh token gets the first phase's floor, as the library's
/// random tokens do (before, it took the second phase on most nodes, every
/// time). The floor is 2 ms above the nodes' clock: a run delayed more than
/// that between reading the clock and its ACQUIREs arriving (a loaded
/// machine, a container) rightly takes the second phase, so up to three
/// runs are made and one must ask each node once.
#[test]
fn run_on_a_free_redlock_group_asks_each_node_once() {
    if common::skip_unless(common::Needs::OwnServer, "counts commands from zero") {
        return;
    }
    let nodes: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let mut acquires_per_run = Vec::new();
    for attempt in 0..3 {
        let infos_before: Vec<i64> = nodes.iter().map(|n| n.command_calls("info")).collect();
        let acquires_before: i64 = nodes.iter().map(|n| n.command_calls("lock.acquire")).sum();
        let out = redis_lock_on(
            "run",
            &common::urls(&nodes),
            &[
                "--key",
                &format!("k{attempt}"),
                "--ttl",
                "10s",
                "--",
                "true",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        // The settings are read once (the unsafe-group warning and the
        // distinct-server check share the read); the two INFOs that read
        // the counts before are counted too.
        for (n, before) in nodes.iter().zip(infos_before) {
            assert_eq!(n.command_calls("info") - before - 2, 1, "one INFO per node");
        }
        let acquires: i64 = nodes.iter().map(|n| n.command_calls("lock.acquire")).sum();
        acquires_per_run.push(acquires - acquires_before);
        if acquires_per_run.last() == Some(&3) {
            return;
        }
    }
    panic!("no run asked each node once: LOCK.ACQUIREs per run {acquires_per_run:?}");
}

/// SIGKILL to `redis-lock` (the OOM killer, a supervisor) ends the whole
/// job, not only the command (PDEATHSIG reaches the command alone; its
/// children ran on without the lock before).
#[test]
fn sigkill_to_redis_lock_ends_every_process_of_the_job() {
    let s = Server::start();
    let dir = scratch("sigkill");
    let pid_file = dir.join("pid");
    let script = format!(
        "sleep 60 >/dev/null 2>&1 & echo $! > {}; wait",
        pid_file.display()
    );
    let mut child = Command::new(BIN)
        .args(["run", "--url", &s.url(), "--key", "k", "--ttl", "30s", "--"])
        .args(["sh", "-c", &script])
        .env_remove("REDIS_LOCK_URL")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let straggler = pid_in(&pid_file);
    assert!(running(straggler));
    child.kill().unwrap();
    child.wait().unwrap();
    common::wait_until(Duration::from_secs(10), || !running(straggler));
}

/// A Redlock wait that ends because the nodes cannot be reached, or that
/// the nodes refuse (a TTL above their limit), exits with that reason (69,
/// 64), not "held by another holder" (75) after the whole wait; a release
/// that no majority answered is 69 too, not "was not held".
#[test]
fn redlock_failures_during_a_wait_say_what_went_wrong() {
    if common::skip_unless(common::Needs::OwnServer, "starts servers with max-ttl-ms") {
        return;
    }
    let nodes: Vec<Server> = (0..3)
        .map(|_| Server::builder().module_arg("max-ttl-ms", "60000").start())
        .collect();
    let urls = common::urls(&nodes);
    let start = Instant::now();
    let out = redis_lock_on(
        "acquire",
        &urls,
        &["--key", "k", "--ttl", "2m", "--wait", "5s"],
    );
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("max-ttl-ms"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "refused at once, not retried"
    );
    let closed: Vec<String> = (0..3)
        .map(|_| format!("redis://127.0.0.1:{}/", common::free_port()))
        .collect();
    let out = redis_lock_on(
        "acquire",
        &closed,
        &["--key", "k", "--ttl", "5s", "--wait", "1s"],
    );
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    let out = redis_lock_on("release", &closed, &["--key", "k", "--token", "t"]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    // Reachable and not held: 75, as before.
    let out = redis_lock_on("release", &urls, &["--key", "k", "--token", "t"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
}

/// The warning about a node unsafe after a crash is printed for the nodes
/// that answered even when fewer than a majority did.
#[test]
fn run_warns_about_the_nodes_that_answered() {
    let node = Server::start();
    let urls = vec![
        node.url(),
        format!("redis://127.0.0.1:{}/", common::free_port()),
        format!("redis://127.0.0.1:{}/", common::free_port()),
    ];
    let out = redis_lock_on("run", &urls, &["--key", "k", "--ttl", "5s", "--", "true"]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("restart-delay-ms 0 is below the TTL"),
        "{}",
        text(&out.stderr)
    );
}

/// A `--wait` too long for a clock (10^15 hours) is a wait for ever, not a
/// panic, on one node and on a Redlock group: a free lock is granted at
/// once. Before, the Redlock path panicked computing its deadline.
#[test]
fn a_wait_beyond_any_clock_is_not_a_crash() {
    let nodes: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let all: Vec<String> = nodes.iter().map(Server::url).collect();
    for urls in [&all[..1], &all[..]] {
        let out = redis_lock_on(
            "acquire",
            urls,
            &["--key", "kw", "--ttl", "5s", "--wait", "3000000000000000h"],
        );
        let stderr = text(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(out.status.code(), Some(0), "{} nodes: {stderr}", urls.len());
        assert!(text(&out.stdout).contains("REDIS_LOCK_FENCE="));
        for n in &nodes {
            let _: i64 = redis::cmd("DEL").arg("kw").query(&mut n.conn()).unwrap();
        }
    }
}

/// A node without the module is unavailable (69, naming the module), not
/// a usage error (64, before).
#[test]
fn a_node_without_the_module_is_unavailable() {
    let plain = Server::builder().without_module().start();
    let out = redis_lock_on("acquire", &[plain.url()], &["--key", "k", "--ttl", "5s"]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("module"),
        "{}",
        text(&out.stderr)
    );
}

/// Each other node-side refusal gets the exit code of what went wrong: a
/// key that holds another type is a usage error (64), a full line of
/// waiters is "try again" (75). Before: 69 and 64.
#[test]
fn node_errors_get_the_exit_code_of_what_went_wrong() {
    let s = Server::builder()
        .module_arg("max-waiters-per-key", "1")
        .start();
    let _: () = redis::cmd("SET")
        .arg("str")
        .arg("v")
        .query(&mut s.conn())
        .unwrap();
    let out = redis_lock_on("acquire", &[s.url()], &["--key", "str", "--ttl", "5s"]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not a lock"),
        "{}",
        text(&out.stderr)
    );

    // The lock held, one waiter queued: the line is full.
    assert!(common::acquire(&mut s.conn(), "full", "holder", 60_000).is_some());
    let mut waiter = s.conn();
    std::thread::spawn(move || {
        let _: redis::RedisResult<redis::Value> = redis::cmd("LOCK.ACQUIRE")
            .arg("full")
            .arg("waiter")
            .arg(60_000)
            .arg("BLOCK")
            .arg(20_000)
            .query(&mut waiter);
    });
    common::wait_until(Duration::from_secs(10), || {
        common::lock_info(&mut s.conn(), "full").is_some_and(|i| i.waiters == 1)
    });
    let out = redis_lock_on(
        "acquire",
        &[s.url()],
        &["--key", "full", "--ttl", "5s", "--wait", "5s"],
    );
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("try again"),
        "{}",
        text(&out.stderr)
    );
}

/// Issue 23, item 7: the statuses for "not acquired" and "lost" can be
/// chosen, so a command's own 75 or 76 cannot be mistaken for them (like
/// `flock -E`); the defaults stay 75 and 76.
#[test]
fn the_conflict_and_lost_exit_codes_can_be_chosen() {
    let s = Server::start();
    let u = s.url();
    let codes = ["--conflict-exit-code", "3", "--lost-exit-code", "4"];
    // The command's own 75 and 76 come through as they are.
    for own in ["75", "76"] {
        let mut args = vec!["run", "--url", &u, "--key", "k"];
        args.extend(codes);
        args.extend(["--", "sh", "-c"]);
        let script = format!("exit {own}");
        args.push(&script);
        let out = redis_lock(&args);
        assert_eq!(out.status.code(), Some(own.parse().unwrap()));
    }
    // Not acquired: the chosen code, for run and acquire.
    assert!(common::acquire(&mut s.conn(), "k", "other", 60_000).is_some());
    let mut args = vec!["run", "--url", &u, "--key", "k"];
    args.extend(codes);
    args.extend(["--", "true"]);
    let out = redis_lock(&args);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let out = redis_lock(&[
        "acquire",
        "--url",
        &u,
        "--key",
        "k",
        "--ttl",
        "5s",
        "--conflict-exit-code",
        "9",
    ]);
    assert_eq!(out.status.code(), Some(9), "{}", text(&out.stderr));
    assert_eq!(common::release(&mut s.conn(), "k", "other"), 1);
    // Lost: the chosen code.
    let mut args = vec!["run", "--url", &u, "--key", "k", "--ttl", "900ms"];
    args.extend(codes);
    args.extend(["--", "sleep", "30"]);
    let child = Command::new(BIN)
        .args(&args)
        .env_remove("REDIS_LOCK_URL")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_until(Duration::from_secs(10), || {
        common::fence(&mut s.conn(), "k").is_some()
    });
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut s.conn()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    let out = redis_lock(&[
        "run",
        "--conflict-exit-code",
        "256",
        "--key",
        "k",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(64), "an exit code is 0 to 255");
}

/// Issue 23, item 7: refused credentials exit 77 and say so (before: 69,
/// "check that the redis-lock module is loaded").
#[test]
fn refused_credentials_exit_77_and_say_so() {
    if common::skip_unless(common::Needs::OwnServer, "sets a password on the server") {
        return;
    }
    let s = Server::start();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "alice", "on", ">right", "~*", "+@all"][..])
        .query(&mut s.conn())
        .unwrap();
    let port = s
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    let wrong = format!("redis://alice:wrong@127.0.0.1:{port}/");
    let out = redis_lock(&["acquire", "--url", &wrong, "--key", "k", "--ttl", "5s"]);
    assert_eq!(out.status.code(), Some(77), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("authentication failed"),
        "{}",
        text(&out.stderr)
    );
    let right = format!("redis://alice:right@127.0.0.1:{port}/");
    let out = redis_lock(&["acquire", "--url", &right, "--key", "k", "--ttl", "5s"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // No password where one is required: NOAUTH.
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "sekret"][..])
        .query(&mut s.conn())
        .unwrap();
    let out = redis_lock(&["run", "--url", &s.url(), "--key", "k2", "--", "true"]);
    assert_eq!(out.status.code(), Some(77), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("authentication failed"),
        "{}",
        text(&out.stderr)
    );
}

/// Several `--key`s: one lock over all of them, with one fence; the
/// command sees every key; a second run naming them in the other order
/// waits its turn (no deadlock) and gets a larger fence.
#[test]
fn run_with_several_keys_holds_them_all_with_one_fence() {
    let s = Server::start();
    let url = s.url();
    let out = redis_lock(&[
        "run",
        "--url",
        &url,
        "--key",
        "{a}x",
        "--key",
        "{a}y",
        "--ttl",
        "10s",
        "--",
        "sh",
        "-c",
        "printf '%s|%s|%s' \"$REDIS_LOCK_KEY\" \"$REDIS_LOCK_KEYS\" \"$REDIS_LOCK_FENCE\"",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    let parts: Vec<&str> = printed.split('|').collect();
    assert_eq!(parts[0], "{a}x");
    assert_eq!(parts[1], "{a}x\n{a}y");
    let first: i64 = parts[2].parse().unwrap();
    assert_eq!(common::fence(&mut s.conn(), "{a}x"), None, "released after");
    // Held by one run (sleeping) while another, naming the keys in the
    // other order, waits in both lines.
    let holder = std::process::Command::new(BIN)
        .args([
            "run", "--url", &url, "--key", "{a}x", "--key", "{a}y", "--ttl", "10s", "--", "sleep",
            "1",
        ])
        .spawn()
        .unwrap();
    let mut c = s.conn();
    common::wait_until(Duration::from_secs(10), || {
        common::fence(&mut c, "{a}y").is_some()
    });
    let held = common::fence(&mut c, "{a}x").unwrap();
    assert_eq!(common::fence(&mut c, "{a}y"), Some(held), "one fence");
    assert!(held > first);
    let out = redis_lock(&[
        "run",
        "--url",
        &url,
        "--key",
        "{a}y",
        "--key",
        "{a}x",
        "--ttl",
        "10s",
        "--wait",
        "20s",
        "--",
        "sh",
        "-c",
        "printf %s \"$REDIS_LOCK_FENCE\"",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let after: i64 = text(&out.stdout).parse().unwrap();
    assert!(after > held);
    let mut holder = holder;
    assert!(holder.wait().unwrap().success());
    // A key named twice is a usage error.
    let out = redis_lock(&[
        "run", "--url", &url, "--key", "k", "--key", "k", "--ttl", "10s", "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
}

/// Issue 31: `--limit N` alone is a semaphore, as the library's `.limit(n)`
/// is (it demanded `--shared`); a limit of 0, an exit status of 0 for "not
/// acquired" or "lost" (a refused lock reported as success), and an empty
/// key are usage errors (64) naming the problem, and take no lock.
#[test]
fn limit_alone_is_a_semaphore_and_meaningless_values_are_refused() {
    let s = Server::start();
    let u = s.url();
    let hold = |token: &str| {
        redis_lock(&[
            "acquire", "--url", &u, "--key", "sem", "--ttl", "30s", "--limit", "2", "--token",
            token,
        ])
    };
    assert_eq!(
        hold("a").status.code(),
        Some(0),
        "{}",
        text(&hold("a").stderr)
    );
    assert_eq!(hold("b").status.code(), Some(0));
    assert_eq!(
        hold("c").status.code(),
        Some(75),
        "the third permit is refused"
    );
    let info = common::lock_info_reply(&mut s.conn(), "sem");
    assert!(format!("{info:?}").contains("shared"), "{info:?}");
    let out = redis_lock(&[
        "run", "--url", &u, "--key", "sem", "--limit", "2", "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    for (args, word) in [
        (vec!["--conflict-exit-code", "0"], "0 means success"),
        (vec!["--lost-exit-code", "0"], "0 means success"),
        (vec!["--conflict-exit-code", "256"], "1 to 255"),
        (vec!["--limit", "0"], "limit"),
    ] {
        let mut all = vec!["run", "--url", &u, "--key", "free"];
        all.extend(args.iter().copied());
        all.extend(["--", "true"]);
        let out = redis_lock(&all);
        assert_eq!(
            out.status.code(),
            Some(64),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(word),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let out = redis_lock(&[
        "acquire",
        "--url",
        &u,
        "--key",
        "",
        "--ttl",
        "1s",
        "--conflict-exit-code",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    let out = redis_lock(&["run", "--url", &u, "--key", "", "--", "true"]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--key"), "{}", text(&out.stderr));
    let n: i64 = redis::cmd("DBSIZE").query(&mut s.conn()).unwrap();
    assert_eq!(n, 1, "only the semaphore was taken");
}

/// The shell lines for guarded writes in client/README.md, taken from that
/// page itself: with the grant they write and exit 0; with a stale fence or a
/// token that does not hold the lock, the write is refused and the line
/// exits non-zero, so the script and `redis-lock run` fail. Without `-e`
/// (issue 31) redis-cli exited 0 on `NOTHELD` and `STALEFENCE`.
#[test]
fn the_readmes_shell_lines_fail_when_the_guarded_write_is_refused() {
    let readme =
        std::fs::read_to_string(common::workspace_root().join("client/README.md")).unwrap();
    let line = |needle: &str| -> String {
        let l = readme
            .lines()
            .find(|l| l.trim_start().starts_with('\'') && l.contains(needle))
            .unwrap_or_else(|| panic!("no client/README.md line with {needle}"));
        l.trim().trim_matches('\'').to_string()
    };
    let exec = line("LOCK.EXEC");
    let fenced = line("LOCK.FENCED");
    let s = Server::start();
    let port = s.port.to_string();
    // The lines name no port (and the gate's node as `-h data`): point
    // them at the test's server.
    let local = |l: &str| {
        l.replace("redis-cli -e -h data", &format!("redis-cli -e -p {port}"))
            .replace("redis-cli -e LOCK", &format!("redis-cli -e -p {port} LOCK"))
    };
    let sh = |l: &str, env: &[(&str, String)]| {
        let mut c = Command::new("sh");
        c.arg("-c").arg(local(l));
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let mut conn = s.conn();
    let held = common::acquire(&mut conn, "order:{17}:lock", "tok", 60_000).unwrap();
    let grant = |token: &str, fence: i64| {
        vec![
            ("REDIS_LOCK_KEY", "order:{17}:lock".to_string()),
            ("REDIS_LOCK_TOKEN", token.to_string()),
            ("REDIS_LOCK_FENCE", fence.to_string()),
        ]
    };
    let out = sh(&exec, &grant("tok", held));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = sh(&exec, &grant("stale", held));
    assert!(
        !out.status.success(),
        "NOTHELD must fail the line: {}",
        text(&out.stdout)
    );
    let out = sh(&fenced, &grant("tok", held));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = sh(&fenced, &grant("tok", held - 1));
    assert!(
        !out.status.success(),
        "STALEFENCE must fail the line: {}",
        text(&out.stdout)
    );
}
