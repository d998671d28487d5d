//! A pipelining connection with binary arguments (many argvs in one
//! write, replies read as they come), reply helpers, and what every error
//! reply must look like.

use std::time::Duration;

use redis_lock_testkit::{RawConn, Resp};

/// The kit's connection, with the fuzzers' argument types and a longer
/// patience (a fuzz batch can keep the server busy).
pub struct Wire {
    conn: RawConn,
}

impl Wire {
    pub fn connect(port: u16) -> Wire {
        Wire {
            conn: RawConn::connect_port(port),
        }
    }

    /// Sends every command in one write.
    pub fn send(&mut self, commands: &[Vec<Vec<u8>>]) {
        self.conn.send_binary(commands);
    }

    /// The next reply, or None if none starts within `limit`.
    pub fn read_within(&mut self, limit: Duration) -> Option<Resp> {
        self.conn.read_within(limit)
    }

    pub fn read(&mut self) -> Resp {
        self.read_within(Duration::from_secs(20))
            .expect("a reply within 20 s")
    }

    pub fn call(&mut self, argv: &[&[u8]]) -> Resp {
        self.conn.call_binary(argv)
    }
}

pub fn int(r: &Resp) -> i64 {
    match r {
        Resp::Int(n) => *n,
        other => panic!("expected an integer, got {other:?}"),
    }
}

pub fn info_text(w: &mut Wire, section: &str) -> String {
    match w.call(&[b"INFO", section.as_bytes()]) {
        Resp::Bulk(b) => String::from_utf8(b).unwrap(),
        other => panic!("{other:?}"),
    }
}

pub fn info_number(w: &mut Wire, section: &str, field: &str) -> i64 {
    info_text(w, section)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field}"))
        .trim()
        .parse()
        .unwrap()
}

/// A well-formed error: a code word in capitals, then what is wrong, on one
/// short line, and no caught panic behind it.
pub fn check_error_names_a_problem(argv: &[Vec<u8>], msg: &str) {
    let show = || show_argv(argv);
    let (code, detail) = msg.split_once(' ').unwrap_or((msg, ""));
    assert!(
        !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase()),
        "an error without a code: {msg:?} for {}",
        show()
    );
    assert!(
        detail.split_whitespace().count() >= 2,
        "an error that names nothing: {msg:?} for {}",
        show()
    );
    assert!(
        msg.len() < 400,
        "an error of {} bytes for {}",
        msg.len(),
        show()
    );
    assert!(
        !msg.contains("internal error"),
        "a caught panic: {msg:?} for {}",
        show()
    );
}

pub fn show_argv(argv: &[Vec<u8>]) -> String {
    let args: Vec<String> = argv
        .iter()
        .map(|a| {
            if a.len() > 40 {
                format!("<{} bytes>", a.len())
            } else {
                format!("{:?}", String::from_utf8_lossy(a))
            }
        })
        .collect();
    format!("[{}]", args.join(" "))
}
