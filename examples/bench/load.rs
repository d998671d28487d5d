//! A small pipelined load generator: `conns` connections (one thread each)
//! send `total` commands, `pipeline` at a time; command `i` is written by
//! `make(i, buf)`. Replies are counted, not kept.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Appends one RESP command.
pub fn encode(buf: &mut Vec<u8>, args: &[&[u8]]) {
    buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        buf.extend_from_slice(a);
        buf.extend_from_slice(b"\r\n");
    }
}

/// Reads one reply; returns true if it was an error.
fn skip_reply(r: &mut BufReader<TcpStream>, line: &mut Vec<u8>) -> bool {
    line.clear();
    r.read_until(b'\n', line).expect("read reply");
    let n = || {
        std::str::from_utf8(&line[1..line.len() - 2])
            .unwrap()
            .parse::<i64>()
            .unwrap()
    };
    match line.first() {
        Some(b'-') => true,
        Some(b'$') if n() >= 0 => {
            let mut skip = vec![0; n() as usize + 2];
            r.read_exact(&mut skip).unwrap();
            false
        }
        Some(b'*') => {
            let count = n();
            (0..count.max(0)).fold(false, |err, _| skip_reply(r, line) | err)
        }
        _ => false,
    }
}

pub struct LoadResult {
    pub seconds: f64,
    pub errors: usize,
}

impl LoadResult {
    pub fn rate(&self, total: usize) -> f64 {
        total as f64 / self.seconds
    }
}

pub fn run(
    port: u16,
    conns: usize,
    pipeline: usize,
    total: usize,
    make: &(dyn Fn(usize, &mut Vec<u8>) + Sync),
) -> LoadResult {
    run_on(connect(port, conns), pipeline, total, make)
}

pub fn connect(port: u16, conns: usize) -> Vec<TcpStream> {
    (0..conns)
        .map(|_| {
            let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            s.set_nodelay(true).unwrap();
            s
        })
        .collect()
}

pub fn run_on(
    streams: Vec<TcpStream>,
    pipeline: usize,
    total: usize,
    make: &(dyn Fn(usize, &mut Vec<u8>) + Sync),
) -> LoadResult {
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let errors: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = streams
            .into_iter()
            .map(|stream| {
                let next = &next;
                scope.spawn(move || {
                    let mut writer = stream.try_clone().unwrap();
                    let mut reader = BufReader::with_capacity(64 * 1024, stream);
                    let (mut buf, mut line, mut errors) = (Vec::new(), Vec::new(), 0);
                    loop {
                        let first = next.fetch_add(pipeline, Ordering::Relaxed);
                        if first >= total {
                            return errors;
                        }
                        let last = (first + pipeline).min(total);
                        buf.clear();
                        for i in first..last {
                            make(i, &mut buf);
                        }
                        writer.write_all(&buf).unwrap();
                        for _ in first..last {
                            errors += usize::from(skip_reply(&mut reader, &mut line));
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    LoadResult {
        seconds: start.elapsed().as_secs_f64(),
        errors,
    }
}
