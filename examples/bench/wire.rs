//! One thread waiting on many connections at once: `poll(2)` over their
//! sockets, each answer timed as it is read. A benchmark that waits on
//! several answers with a thread each measures, past the first, how soon
//! the machine schedules those threads (on 2 cores after an idle pause,
//! milliseconds); one thread reading every socket measures when each
//! answer reached it. Both sides of a comparison use it alike.

use std::os::fd::RawFd;
use std::time::Instant;

use crate::common::{RawConn, Resp};

/// A connection awaited in [`until_each`].
pub trait Awaited {
    fn fd(&self) -> RawFd;
    /// Bytes already read off the socket that may hold the answer.
    fn buffered(&self) -> bool;
    /// Reads what arrived (called when the socket is readable or
    /// [`buffered`](Self::buffered)); true once the awaited answer is in.
    fn advance(&mut self) -> Result<bool, String>;
}

/// Waits until every one of `items` has its answer, or `deadline` passes;
/// the instant each answer was read (None: not by the deadline).
pub fn until_each(
    items: &mut [&mut dyn Awaited],
    deadline: Option<Instant>,
) -> Result<Vec<Option<Instant>>, String> {
    let mut at: Vec<Option<Instant>> = vec![None; items.len()];
    loop {
        for (i, item) in items.iter_mut().enumerate() {
            while at[i].is_none() && item.buffered() {
                if item.advance()? {
                    at[i] = Some(Instant::now());
                }
            }
        }
        let open: Vec<usize> = (0..items.len()).filter(|&i| at[i].is_none()).collect();
        if open.is_empty() {
            return Ok(at);
        }
        let timeout_ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(at);
                }
                left.as_millis().max(1) as i32
            }
        };
        let mut fds: Vec<libc::pollfd> = open
            .iter()
            .map(|&i| libc::pollfd {
                fd: items[i].fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("poll: {e}"));
        }
        for (p, &i) in fds.iter().zip(&open) {
            if p.revents != 0 && items[i].advance()? {
                at[i] = Some(Instant::now());
            }
        }
    }
}

/// One reply awaited on a raw connection (sent before): `got` once read.
pub struct Answer<'a> {
    pub conn: &'a mut RawConn,
    pub got: Option<Resp>,
}

impl<'a> Answer<'a> {
    pub fn on(conn: &'a mut RawConn) -> Answer<'a> {
        Answer { conn, got: None }
    }
}

impl Awaited for Answer<'_> {
    fn fd(&self) -> RawFd {
        self.conn.as_raw_fd()
    }
    fn buffered(&self) -> bool {
        self.got.is_none() && self.conn.has_buffered()
    }
    /// The socket is readable: the reply (one small RESP value, sent in
    /// one write) is read whole.
    fn advance(&mut self) -> Result<bool, String> {
        if self.got.is_none() {
            self.got = Some(self.conn.read());
        }
        Ok(true)
    }
}

/// Each awaited answer's time after `t0`, microseconds (None: it did not
/// come in time).
pub fn since(t0: Instant, at: &[Option<Instant>]) -> Vec<Option<u64>> {
    at.iter()
        .map(|a| a.map(|a| (a - t0).as_micros() as u64))
        .collect()
}
