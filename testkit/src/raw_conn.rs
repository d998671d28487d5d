//! Raw RESP2 connections ([`RawConn`]): send a command now, read its reply
//! ([`Resp`]) later.

use std::time::Duration;

use redis_lock_core::protocol::command;

use crate::server::Server;

/// A reply as read off the wire by [`RawConn`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    Int(i64),
    Nil,
    Bulk(Vec<u8>),
    Simple(String),
    Error(String),
    Array(Vec<Resp>),
}

/// A bare RESP2 connection: send a command now, read its reply later. Many
/// of these can wait in the server at once without a thread each.
pub struct RawConn {
    /// One socket (one fd): read through the buffer, written directly.
    reader: std::io::BufReader<std::net::TcpStream>,
}

impl RawConn {
    pub fn connect(server: &Server) -> RawConn {
        RawConn::connect_port(server.port)
    }

    /// Connects to 127.0.0.1:`port` (a server the test started by hand).
    pub fn connect_port(port: u16) -> RawConn {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_nodelay(true).unwrap();
        RawConn {
            reader: std::io::BufReader::with_capacity(1 << 16, stream),
        }
    }

    /// Sends commands with binary arguments, all in one write.
    pub fn send_binary(&mut self, commands: &[Vec<Vec<u8>>]) {
        use std::io::Write;
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

    /// One command with binary arguments, and its reply.
    pub fn call_binary(&mut self, argv: &[&[u8]]) -> Resp {
        self.send_binary(&[argv.iter().map(|a| a.to_vec()).collect()]);
        self.read()
    }

    /// `n` new connections on `key`, waiter `i` queued (not yet answered)
    /// with `LOCK.ACQUIRE key w<i> 600000 BLOCK 0`.
    pub fn queue_waiters(server: &Server, key: &str, n: usize) -> Vec<RawConn> {
        (0..n)
            .map(|i| {
                let mut w = RawConn::connect(server);
                w.send(&[
                    command::ACQUIRE,
                    key,
                    &format!("w{i}"),
                    "600000",
                    command::BLOCK,
                    "0",
                ]);
                w
            })
            .collect()
    }

    /// A new connection that has sent `LOCK.ACQUIRE key token ttl BLOCK
    /// timeout` (not yet answered).
    pub fn block_acquire(
        server: &Server,
        key: &str,
        token: &str,
        ttl: i64,
        timeout: i64,
    ) -> RawConn {
        let mut w = RawConn::connect(server);
        w.send(&[
            command::ACQUIRE,
            key,
            token,
            &ttl.to_string(),
            "BLOCK",
            &timeout.to_string(),
        ]);
        w
    }

    /// The socket, for a caller that waits on many connections at once
    /// with `poll(2)`.
    pub fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.reader.get_ref().as_raw_fd()
    }

    /// Whether reply bytes were read off the socket but not yet parsed (a
    /// poll of the socket does not see them).
    pub fn has_buffered(&self) -> bool {
        !self.reader.buffer().is_empty()
    }

    pub fn send(&mut self, args: &[&str]) {
        self.pipeline(&[args]);
    }

    /// Sends several commands in one write, so the server reads them in one
    /// go and runs them in the same event-loop iteration.
    pub fn pipeline(&mut self, commands: &[&[&str]]) {
        use std::io::Write;
        self.reader
            .get_mut()
            .write_all(encode(commands).as_bytes())
            .expect("send");
    }

    /// Connects to 127.0.0.1:`port`; an error (not a panic) if nothing
    /// answers within `limit`.
    pub fn try_connect(port: u16, limit: Duration) -> std::io::Result<RawConn> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let stream = std::net::TcpStream::connect_timeout(&addr, limit)?;
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        Ok(RawConn {
            reader: std::io::BufReader::new(stream),
        })
    }

    /// Sends one command and waits up to `limit` for its reply: `Ok(None)`
    /// if none came in time, `Err` if the connection failed or closed. Never
    /// panics, so a client can survive the server being killed under it.
    pub fn try_call(&mut self, args: &[&str], limit: Duration) -> std::io::Result<Option<Resp>> {
        use std::io::{ErrorKind, Write};
        self.reader
            .get_mut()
            .write_all(encode(&[args]).as_bytes())?;
        if self.reader.buffer().is_empty() {
            let limit = limit.max(Duration::from_millis(1));
            self.reader.get_ref().set_read_timeout(Some(limit))?;
            match fill_buf(&mut self.reader) {
                Ok([]) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            }
        }
        self.reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(10)))?;
        self.try_parse().map(Some)
    }

    /// Waits up to `limit` for a reply; None if none came.
    pub fn read_within(&mut self, limit: Duration) -> Option<Resp> {
        if self.reader.buffer().is_empty() {
            self.reader.get_ref().set_read_timeout(Some(limit)).unwrap();
            match fill_buf(&mut self.reader) {
                Ok([]) => panic!("connection closed"),
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
        }
        self.reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Some(self.parse())
    }

    /// Reads one reply (waits up to 10 s).
    pub fn read(&mut self) -> Resp {
        self.read_within(Duration::from_secs(10))
            .expect("a reply within 10 s")
    }

    pub fn call(&mut self, args: &[&str]) -> Resp {
        self.send(args);
        self.read()
    }

    fn parse(&mut self) -> Resp {
        self.try_parse()
            .unwrap_or_else(|e| panic!("read reply: {e}"))
    }

    /// One reply line without its CRLF; bytes that are not UTF-8 (an error
    /// may quote a binary argument) are shown lossily.
    fn try_line(&mut self) -> std::io::Result<String> {
        use std::io::BufRead;
        let mut line = Vec::new();
        if self.reader.read_until(b'\n', &mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if !line.ends_with(b"\r\n") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a reply line without CRLF: {line:?}"),
            ));
        }
        line.truncate(line.len() - 2);
        Ok(String::from_utf8_lossy(&line).into_owned())
    }

    fn try_parse(&mut self) -> std::io::Result<Resp> {
        use std::io::Read;
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let line = self.try_line()?;
        if line.is_empty() {
            return Err(bad("empty reply line"));
        }
        let (kind, rest) = line.split_at(1);
        let number = |s: &str| {
            s.parse::<i64>()
                .map_err(|_| bad(&format!("bad number in {line:?}")))
        };
        Ok(match kind {
            ":" => Resp::Int(number(rest)?),
            "+" => Resp::Simple(rest.into()),
            "-" => Resp::Error(rest.into()),
            "$" if rest == "-1" => Resp::Nil,
            "*" if rest == "-1" => Resp::Nil,
            "$" => {
                let mut buf = vec![0; number(rest)? as usize + 2];
                self.reader.read_exact(&mut buf)?;
                buf.truncate(buf.len() - 2);
                Resp::Bulk(buf)
            }
            "*" => Resp::Array(
                (0..number(rest)?)
                    .map(|_| self.try_parse())
                    .collect::<std::io::Result<_>>()?,
            ),
            _ => return Err(bad(&format!("unexpected reply line {line:?}"))),
        })
    }
}

/// Commands in RESP2, as one buffer.
fn encode(commands: &[&[&str]]) -> String {
    let mut out = String::new();
    for args in commands {
        out += &format!("*{}\r\n", args.len());
        for a in *args {
            out += &format!("${}\r\n{a}\r\n", a.len());
        }
    }
    out
}

/// `fill_buf`, retried when a signal interrupts the read (EINTR: the test
/// process gets SIGCHLD from the servers and tools it runs), as
/// `read_exact` and `read_line` retry.
fn fill_buf<R: std::io::Read>(reader: &mut std::io::BufReader<R>) -> std::io::Result<&[u8]> {
    use std::io::BufRead;
    loop {
        match reader.fill_buf() {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
            Ok(_) => break,
        }
    }
    // What the read put in the buffer (empty: end of stream).
    Ok(reader.buffer())
}
