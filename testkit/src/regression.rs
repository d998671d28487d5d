//! What the regression tests share: a check that the server lives,
//! blocked clients, `RESTORE`, and the fence a `redis-lock run` job gets.

use std::time::Duration;

use redis::{Connection, Value};

use crate::raw_conn::RawConn;
use crate::server::Server;
use crate::wait::wait_until;

// Helpers the regression tests share.

/// Asserts the server still answers (a crash shows its log).
pub fn alive(s: &Server) {
    let pong: String = redis::cmd("PING").query(&mut s.conn()).unwrap();
    assert_eq!(pong, "PONG", "the server is up; log:\n{}", s.log());
}

/// Sends a BLOCK acquire on a new connection (without waiting for the queue).
pub fn block_on(s: &Server, key: &str, token: &str, ttl: i64, timeout: i64) -> RawConn {
    RawConn::block_acquire(s, key, token, ttl, timeout)
}

/// The id of the oldest client blocked in LOCK.ACQUIRE.
pub fn first_blocked_client(c: &mut Connection) -> String {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(c).unwrap();
    list.lines()
        .find(|l| l.contains("cmd=lock.acquire") && l.contains("flags=b"))
        .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")))
        .unwrap()
        .to_string()
}

/// How many clients are blocked on the server now (`blocked_clients` of
/// INFO clients: waiters in a line and observers alike).
pub fn blocked_clients(s: &Server) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query(&mut s.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .map(|v| v.trim().parse::<i64>().unwrap())
        .expect("INFO clients has blocked_clients")
}

/// Waits until `n` clients are blocked on the server.
pub fn wait_blocked(s: &Server, n: i64) {
    wait_until(Duration::from_secs(10), || blocked_clients(s) == n);
}

/// `RESTORE key 0 payload REPLACE`.
pub fn restore(c: &mut Connection, key: &str, payload: &[u8]) -> redis::RedisResult<Value> {
    redis::cmd("RESTORE")
        .arg(key)
        .arg(0)
        .arg(payload)
        .arg("REPLACE")
        .query(c)
}

/// The ids of the clients blocked in LOCK.ACQUIRE, oldest first.
pub fn blocked_ids(c: &mut Connection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(c).unwrap();
    list.lines()
        .filter(|l| l.contains("cmd=lock.acquire") && l.contains("flags=b"))
        .filter_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect()
}

/// Runs `redis-lock run --url URL --key KEY --ttl 5s -- sh -c 'echo
/// $REDIS_LOCK_FENCE'` (the command built at `bin`, with `env` added),
/// asserts it exited 0, and returns the fence the job was given.
pub fn fence_of_a_run(bin: &str, url: &str, key: &str, env: &[(&str, &str)]) -> i64 {
    let out = std::process::Command::new(bin)
        .args(["run", "--url", url, "--key", key, "--ttl", "5s", "--"])
        .args(["sh", "-c", "echo fence=$REDIS_LOCK_FENCE"])
        .envs(env.iter().copied())
        .env_remove("REDIS_LOCK_URL")
        .output()
        .expect("run redis-lock");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .trim()
        .strip_prefix("fence=")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("the job printed {stdout:?}"))
}
