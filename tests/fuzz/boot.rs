//! A server started by hand on a data directory the test prepared: up once
//! it answers PING, or exited (or hung in Redis's own redis-check-rdb)
//! after refusing a file; how a refusal must look, and what a started
//! server may hold.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis_lock_testkit::{free_port, module_path, server_binary, Resp};

use crate::restore::check_lock_valid;
use crate::rng::now_us;
use crate::wire::{info_number, Wire};

/// A server started on a data directory prepared by the test.
pub struct Boot {
    child: Child,
    pub port: u16,
}

pub enum Booted {
    Up(Boot),
    Exited(ExitStatus, String),
    /// Refused the file, then hung in Redis's own redis-check-rdb (see
    /// `boot`); killed.
    CheckerHung(String),
}

impl Drop for Boot {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A log as text, whatever bytes a damaged file put in it.
pub fn read_lossy(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// A fresh directory, its name unique in this run (tests run in parallel).
pub fn scratch_dir(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("redis-lock-fuzz-{}-{n}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Starts the server on `dir`; Up once it answers PING, Exited (with its
/// log) if it stops first.
/// `hang_after`: how long a server that has logged an RDB refusal may take
/// to exit before it counts as hung (see below). Short only where a hang is
/// expected (a cut file); a refused file otherwise gets ample time, as the
/// server's checker can be slow on a loaded machine.
pub fn boot(dir: &Path, config: &[&str], hang_after: Duration) -> Booted {
    for _ in 0..3 {
        let port = free_port();
        let log = dir.join("server.log");
        let _ = std::fs::remove_file(&log);
        let child = Command::new(server_binary())
            .current_dir(dir)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--daemonize",
                "no",
                "--save",
                "",
                "--enable-debug-command",
                "yes",
            ])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log)
            .args(config)
            .arg("--loadmodule")
            .arg(module_path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.txt")).unwrap())
            .spawn()
            .expect("start the server");
        let mut boot = Boot { child, port };
        let start = Instant::now();
        let mut refused_at = None;
        loop {
            if let Some(status) = boot.child.try_wait().unwrap() {
                let text = read_lossy(&log) + &read_lossy(&dir.join("stderr.txt"));
                if text.contains("Address already in use") {
                    break;
                }
                return Booted::Exited(status, text);
            }
            // After refusing an RDB file the server runs redis-check-rdb in
            // its own process, which on Redis 7.0 loops forever when the
            // file ends inside a module value (rdbLoadCheckModuleValue
            // never sees the EOF opcode). The refusal is made; stop it.
            let text = read_lossy(&log);
            if text.contains("Internal error in RDB reading") {
                let at = *refused_at.get_or_insert_with(Instant::now);
                if at.elapsed() > hang_after {
                    return Booted::CheckerHung(text);
                }
            }
            if refused_at.is_none() && answers_ping(port) {
                return Booted::Up(boot);
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the server on {dir:?} neither started nor stopped; log:\n{text}"
            );
            sleep(Duration::from_millis(10));
        }
    }
    panic!("no free port");
}

/// PONG (not LOADING, not a reset by a server that gives up loading).
fn answers_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

/// A refusal is an orderly exit with a log line that says why; never a
/// crash by a signal. (Redis 7.0 exits with 0 when its in-process
/// redis-check-rdb, which cannot judge module values, finds the file
/// well-formed after the module refused a value; otherwise with 1.)
pub fn check_refusal(status: ExitStatus, log: &str, what: &str) {
    // A damage that shifted the stream can make the loader read a later
    // value's bytes as a key name, and two such names can be the same:
    // Redis then stops with a panic of its own (a plain string value
    // damaged the same way does it too), with its reason in the log and no
    // module code on the stack. Its refusal, not the module's crash.
    let stack = log.split("STACK TRACE").nth(1).unwrap_or("");
    if log.contains("Duplicated key found in RDB file") && !stack.contains("libredis_lock") {
        return;
    }
    assert!(
        status.signal().is_none() && matches!(status.code(), Some(0 | 1)),
        "{what}: the server ended with {status:?}; log:\n{log}"
    );
    for bad in ["crashed by signal", "BUG REPORT", "panicked", "ASSERTION"] {
        assert!(!log.contains(bad), "{what}: {bad:?} in the log:\n{log}");
    }
    let reasons = [
        "lock: refusing",
        "Internal error in RDB",
        "Short read",
        "Bad file format",
        "Unexpected end of file",
        "Unrecoverable error",
        "Unknown command",
        "Wrong RDB checksum",
        "Fatal error",
        "Error reading the append only file",
    ];
    assert!(
        reasons.iter().any(|r| log.contains(r)),
        "{what}: the log does not say why the server stopped ({status:?}):\n{log}"
    );
}

/// The last warning the server logged (the reason it gives for stopping).
pub fn last_warning(log: &str) -> String {
    log.lines()
        .rev()
        .find(|l| l.contains(" # "))
        .map(|l| {
            l.split(" # ")
                .nth(1)
                .unwrap_or(l)
                .chars()
                .take(120)
                .collect()
        })
        .unwrap_or_default()
}

/// Every key the started server holds is of its type and, if a lock,
/// whole; the server answers.
pub fn check_loaded(boot: &Boot) -> usize {
    let mut w = Wire::connect(boot.port);
    let mut locks = 0;
    let Resp::Array(keys) = w.call(&[b"KEYS", b"*"]) else {
        panic!()
    };
    for k in keys {
        let Resp::Bulk(k) = k else { panic!() };
        if w.call(&[b"TYPE", &k]) == Resp::Simple("redislock".into()) {
            let bound = now_us().max(info_number(&mut w, "lock", "lock_fence_hwm"));
            check_lock_valid(&mut w, &k, bound);
            locks += 1;
        }
    }
    assert_eq!(w.call(&[b"PING"]), Resp::Simple("PONG".into()));
    locks
}
