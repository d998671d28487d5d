//! A pipelining connection with binary arguments (many argvs in one
//! write, replies read as they come), reply helpers, and what every error
//! reply must look like.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use redis_lock_testkit::Resp;

pub struct Wire {
    reader: BufReader<TcpStream>,
}

impl Wire {
    pub fn connect(port: u16) -> Wire {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_nodelay(true).unwrap();
        Wire {
            reader: BufReader::with_capacity(1 << 16, stream),
        }
    }

    /// Sends every command in one write.
    pub fn send(&mut self, commands: &[Vec<Vec<u8>>]) {
        let mut out = Vec::new();
        for argv in commands {
            out.extend_from_slice(format!("*{}\r\n", argv.len()).as_bytes());
            for arg in argv {
                out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
                out.extend_from_slice(arg);
                out.extend_from_slice(b"\r\n");
            }
        }
        self.reader.get_mut().write_all(&out).expect("send");
    }

    /// The next reply, or None if none starts within `limit`.
    pub fn read_within(&mut self, limit: Duration) -> Option<Resp> {
        if self.reader.buffer().is_empty() {
            self.reader.get_ref().set_read_timeout(Some(limit)).unwrap();
            match self.reader.fill_buf() {
                Ok([]) => panic!("the server closed the connection"),
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return None
                }
                Err(e) => panic!("read: {e}"),
            }
            self.reader
                .get_ref()
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
        }
        Some(self.parse())
    }

    pub fn read(&mut self) -> Resp {
        self.read_within(Duration::from_secs(20))
            .expect("a reply within 20 s")
    }

    pub fn call(&mut self, argv: &[&[u8]]) -> Resp {
        self.send(&[argv.iter().map(|a| a.to_vec()).collect()]);
        self.read()
    }

    fn parse(&mut self) -> Resp {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line).expect("read");
        assert!(line.ends_with(b"\r\n"), "a bad reply line {line:?}");
        let text = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        let number = || text.parse::<i64>().expect("a number");
        match line[0] {
            b':' => Resp::Int(number()),
            b'+' => Resp::Simple(text),
            b'-' => Resp::Error(text),
            b'$' | b'*' if number() < 0 => Resp::Nil,
            b'$' => {
                let mut buf = vec![0; number() as usize + 2];
                self.reader.read_exact(&mut buf).expect("read");
                buf.truncate(buf.len() - 2);
                Resp::Bulk(buf)
            }
            b'*' => Resp::Array((0..number()).map(|_| self.parse()).collect()),
            _ => panic!("an unexpected reply line {line:?}"),
        }
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
