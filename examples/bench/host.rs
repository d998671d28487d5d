//! What the module costs commands that touch no lock: the same commands on
//! two servers of the same binary, one without the module, each holding the
//! same number of other keys (held locks on the module's server, plain
//! strings on the other). Instructions per command from callgrind, and
//! throughput in paired rounds.

use crate::common::Server;
use crate::cost::{self, TOKEN};
use crate::load::{self, encode};

/// Keys the reading rows use, created before they run.
const HOT: usize = 20_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Row {
    Get,
    Set,
    SetEx,
    Incr,
    Del,
    Expire,
}

impl Row {
    pub const ALL: [Row; 6] = [
        Row::Get,
        Row::Set,
        Row::SetEx,
        Row::Incr,
        Row::Del,
        Row::Expire,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Row::Get => "GET",
            Row::Set => "SET",
            Row::SetEx => "SET ... EX 600",
            Row::Incr => "INCR",
            Row::Del => "DEL",
            Row::Expire => "EXPIRE ... 600",
        }
    }
}

fn key(prefix: &str, i: usize) -> Vec<u8> {
    format!("{prefix}:{i}").into_bytes()
}

fn command(row: Row, i: usize, buf: &mut Vec<u8>) {
    let hot = key("h", i % HOT);
    match row {
        Row::Get => encode(buf, &[b"GET", &hot]),
        Row::Set => encode(buf, &[b"SET", &key("s", i), TOKEN]),
        Row::SetEx => encode(buf, &[b"SET", &key("s", i), TOKEN, b"EX", b"600"]),
        Row::Incr => encode(buf, &[b"INCR", &key("n", i % HOT)]),
        Row::Del => encode(buf, &[b"DEL", &key("d", i)]),
        Row::Expire => encode(buf, &[b"EXPIRE", &hot, b"600"]),
    }
}

/// Fills a server with `held` keys that stay for the whole section: held
/// locks with the module, plain strings without.
pub fn hold(server: &Server, held: usize, locks: bool) {
    let make = move |i: usize, buf: &mut Vec<u8>| {
        if locks {
            encode(buf, &[b"LOCK.ACQUIRE", &key("lock", i), TOKEN, b"3600000"]);
        } else {
            encode(buf, &[b"SET", &key("lock", i), TOKEN]);
        }
    };
    if held > 0 {
        let r = load::run(server.port, 4, 512, held, &make);
        assert_eq!(r.errors, 0, "holding {held} keys failed");
    }
}

/// Creates what `row`'s `n` commands act on.
fn setup(server: &Server, row: Row, n: usize) {
    let (count, prefix) = match row {
        Row::Get | Row::Expire => (HOT, "h"),
        Row::Incr => (HOT, "n"),
        Row::Del => (n, "d"),
        Row::Set | Row::SetEx => return,
    };
    let make = move |i: usize, buf: &mut Vec<u8>| encode(buf, &[b"SET", &key(prefix, i), b"1"]);
    let r = load::run(server.port, 4, 256, count, &make);
    assert_eq!(r.errors, 0, "setup of {row:?} failed");
}

/// Removes what `row` left (the held keys stay), so every row meets the
/// same keyspace.
fn clean(server: &Server, row: Row, n: usize) {
    let (count, prefix) = match row {
        Row::Get | Row::Expire => (HOT, "h"),
        Row::Incr => (HOT, "n"),
        Row::Set | Row::SetEx => (n, "s"),
        Row::Del => return,
    };
    let make = move |i: usize, buf: &mut Vec<u8>| encode(buf, &[b"DEL", &key(prefix, i)]);
    let r = load::run(server.port, 4, 256, count, &make);
    assert_eq!(r.errors, 0, "cleaning after {row:?} failed");
}

/// Commands per second of `row` at pipeline 16 from 50 connections.
pub fn throughput(server: &Server, row: Row, n: usize) -> f64 {
    setup(server, row, n);
    let make = |i: usize, buf: &mut Vec<u8>| command(row, i, buf);
    let r = load::run(server.port, 50, 16, n, &make);
    assert_eq!(r.errors, 0, "{row:?} replied with errors");
    clean(server, row, n);
    r.rate(n)
}

/// Server instructions per command of `row`, on a server under callgrind.
pub fn instructions(server: &Server, row: Row, n: usize) -> f64 {
    setup(server, row, n);
    let counts = cost::instructions_of(server, n, &|i: usize, buf: &mut Vec<u8>| {
        command(row, i, buf)
    });
    clean(server, row, n);
    counts.instructions
}
