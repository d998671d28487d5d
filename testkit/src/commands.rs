//! Plain Redis commands: any command with its raw reply or its error text,
//! ACL users, active expiry, `DEBUG DIGEST`, `DEBUG POPULATE`.

use redis::{Connection, Value};

use crate::server::Server;

/// Turns Redis's background expiry cycle off or on. Off, a lock's key stays
/// until something looks it up, so only the module's own deadline (and its
/// timers) can end a lease.
pub fn active_expire(c: &mut Connection, on: bool) {
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(i32::from(on))
        .query(c)
        .unwrap();
}

/// Fills the keyspace with `n` string keys named `other:N` (`DEBUG
/// POPULATE`): what a server holds beside its locks.
pub fn populate(c: &mut Connection, n: u64) {
    let _: () = redis::cmd("DEBUG")
        .arg("POPULATE")
        .arg(n)
        .arg("other")
        .query(c)
        .expect("DEBUG POPULATE");
}

/// Runs a command and returns the raw reply (errors as `Err`).
pub fn run(c: &mut Connection, args: &[&[u8]]) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c)
}

/// Creates (or resets) the ACL user `name` with password `pw` and `rules`.
pub fn set_user(admin: &mut Connection, name: &str, rules: &[&str]) {
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(name)
        .arg("reset")
        .arg("on")
        .arg(">pw")
        .arg(rules)
        .query(admin)
        .unwrap();
}

/// A RESP2 connection to `s` logged in as `user` (password `pw`).
pub fn login(s: &Server, user: &str) -> Connection {
    let mut c = s.conn();
    let _: () = redis::cmd("AUTH")
        .arg(user)
        .arg("pw")
        .query(&mut c)
        .unwrap();
    c
}

/// Runs a command that must fail; returns the error text (code first).
pub fn run_err(c: &mut Connection, args: &[&str]) -> String {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    match run(c, &args) {
        Ok(v) => panic!("expected an error from {args:?}, got {v:?}"),
        Err(e) => error_text(&e),
    }
}

/// "CODE detail", the way redis-cli shows an error.
pub fn error_text(e: &redis::RedisError) -> String {
    match e.code() {
        Some(code) => format!("{code} {}", e.detail().unwrap_or("")),
        None => e.to_string(),
    }
}

pub fn digest(c: &mut Connection) -> String {
    redis::cmd("DEBUG").arg("DIGEST").query(c).unwrap()
}
