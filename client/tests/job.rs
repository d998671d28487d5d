//! `redis-lock run` owns its child (issue 17): the child never runs without
//! the lock. It reads the terminal and stops and continues with
//! `redis-lock` like any foreground job (driven here through a real
//! interactive bash on a pseudo-terminal), dies with it whatever signal ends
//! it, and hears of a lost lock while the lease is still valid.

use redis_lock_testkit as common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::Server;

const BIN: &str = env!("CARGO_BIN_EXE_redis-lock");

/// An interactive bash on a pseudo-terminal of its own (its controlling
/// terminal, so it runs jobs with job control as for a user).
struct Pty {
    master: std::fs::File,
    shell: Child,
    seen: String,
}

impl Pty {
    fn bash() -> Pty {
        let (mut master, mut slave) = (0, 0);
        // SAFETY: two valid out-pointers; null name, termios and size.
        let r = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "openpty");
        // SAFETY: fresh fds that nothing else owns.
        let (master, slave) =
            unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        let stdio = |fd: &OwnedFd| Stdio::from(fd.try_clone().unwrap());
        let mut command = Command::new("bash");
        command
            .args(["--norc", "--noprofile", "-i"])
            .env("PS1", "$ ")
            .env("TERM", "dumb")
            .env_remove("REDIS_LOCK_URL")
            .stdin(stdio(&slave))
            .stdout(stdio(&slave))
            .stderr(stdio(&slave));
        // SAFETY: setsid and ioctl are async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                libc::setsid();
                if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let shell = command.spawn().expect("bash");
        drop(slave);
        // SAFETY: a valid fd; non-blocking reads, polled below.
        unsafe {
            let flags = libc::fcntl(master.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(master.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        let mut pty = Pty {
            master: std::fs::File::from(master),
            shell,
            seen: String::new(),
        };
        pty.expect("$ ", Duration::from_secs(30));
        pty
    }

    fn send(&mut self, text: &str) {
        self.master.write_all(text.as_bytes()).unwrap();
    }

    /// Waits for `pattern` in the output since the last match; the output
    /// up to and including it.
    fn expect(&mut self, pattern: &str, limit: Duration) -> String {
        let start = Instant::now();
        loop {
            if let Some(at) = self.seen.find(pattern) {
                let upto: String = self.seen.drain(..at + pattern.len()).collect();
                return upto;
            }
            let mut buf = [0u8; 4096];
            match self.master.read(&mut buf) {
                Ok(0) => {}
                Ok(n) => self.seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    sleep(Duration::from_millis(10))
                }
                // EIO: the shell is gone.
                Err(e) => panic!("reading the terminal: {e}; saw {:?}", self.seen),
            }
            assert!(
                start.elapsed() < limit,
                "no {pattern:?} on the terminal within {limit:?}; saw {:?}",
                self.seen
            );
        }
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.shell.kill();
        let _ = self.shell.wait();
    }
}

/// The state letter of a process in /proc (R, S, T, Z...), None if gone.
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.trim_start().chars().next()
}

fn alive(pid: i32) -> bool {
    !matches!(state(pid), None | Some('Z') | Some('X'))
}

fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        sleep(Duration::from_millis(20));
    }
}

fn read_pid(file: &Path, limit: Duration) -> i32 {
    let mut pid = 0;
    wait_for(limit, "the child wrote its pid", || {
        pid = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        pid > 0
    });
    pid
}

/// This test's own empty directory (pid files, markers), removed on drop.
fn scratch() -> common::ScratchDir {
    common::ScratchDir::new("job")
}

/// The pid of the redis-lock process whose child is `child`.
fn parent_of(child: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap();
    let after = stat.rsplit_once(')').unwrap().1;
    after.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn holder(s: &Server, key: &str) -> Option<String> {
    common::holder(&mut s.conn(), key)
}

/// A child that reads the terminal gets what is typed (it is the
/// foreground job): before, it was stopped by SIGTTIN and redis-lock
/// renewed the lock for ever.
#[test]
fn a_child_reads_the_terminal() {
    let s = Server::start();
    let mut pty = Pty::bash();
    pty.send(&format!(
        "{BIN} run --url {} --key k --ttl 5s -- sh -c 'read line; echo \"got:$line\"'; echo \"rc=$?\"\n",
        s.url()
    ));
    wait_for(Duration::from_secs(10), "the lock is taken", || {
        holder(&s, "k").is_some()
    });
    pty.send("hello\n");
    pty.expect("got:hello", Duration::from_secs(30));
    pty.expect("rc=0", Duration::from_secs(30));
    assert_eq!(holder(&s, "k"), None, "released");
}

/// Ctrl-Z stops the child with redis-lock (the shell sees the job stopped);
/// `fg` continues it while the lock is still held. After a stop longer than
/// the lease, another holder took the lock: `fg` then kills the stopped
/// child without letting it run, and redis-lock exits 76.
#[test]
fn ctrl_z_stops_the_child_with_redis_lock_and_fg_checks_the_lock() {
    let s = Server::start();
    let dir = scratch();
    for (round, stop_for) in [(0, Duration::ZERO), (1, Duration::from_millis(2500))] {
        let pid_file = dir.join(format!("pid{round}"));
        let ticks = dir.join(format!("ticks{round}"));
        let key = format!("k{round}");
        let mut pty = Pty::bash();
        pty.send(&format!(
            // No `; echo $?` after it: bash runs the rest of a list when
            // its job stops. The status is asked for after `fg` instead.
            "{BIN} run --url {} --key {key} --ttl 1s -- sh -c 'echo $$ > {}; while :; do echo x >> {}; sleep 0.05; done'\n",
            s.url(),
            pid_file.display(),
            ticks.display(),
        ));
        let child = read_pid(&pid_file, Duration::from_secs(10));
        let redis_lock = parent_of(child);
        // Its loop has begun (the pid is written first: on a loaded
        // machine a stop could come before the first tick, and the tick
        // count below would have no file to read).
        wait_for(Duration::from_secs(10), "the child's first tick", || {
            ticks.exists()
        });
        pty.send("\x1a");
        pty.expect("Stopped", Duration::from_secs(30));
        assert_eq!(state(child), Some('T'), "the child is stopped");
        assert_eq!(state(redis_lock), Some('T'), "redis-lock is stopped");
        sleep(stop_for);
        let other = stop_for > Duration::from_secs(1);
        if other {
            // The lease ran out while stopped: someone else holds it now.
            let f = common::acquire(&mut s.conn(), &key, "other", 60_000);
            assert!(f.is_some(), "the lapsed lock is granted to another");
            let before = std::fs::read_to_string(&ticks).unwrap().len();
            pty.send("fg\n");
            wait_for(Duration::from_secs(10), "redis-lock exits", || {
                !alive(redis_lock)
            });
            pty.send("echo \"rc=$?\"\n");
            pty.expect("rc=76", Duration::from_secs(30));
            assert!(!alive(child), "the stopped child was killed");
            assert_eq!(
                std::fs::read_to_string(&ticks).unwrap().len(),
                before,
                "the child never ran again without the lock"
            );
            assert_eq!(holder(&s, &key).as_deref(), Some("other"));
        } else {
            pty.send("fg\n");
            wait_for(Duration::from_secs(5), "the child runs again", || {
                state(child) != Some('T')
            });
            sleep(Duration::from_millis(1500));
            assert!(alive(child));
            assert!(holder(&s, &key).is_some(), "renewed after fg");
            pty.send("\x03");
            wait_for(Duration::from_secs(10), "redis-lock exits", || {
                !alive(redis_lock)
            });
            pty.send("echo \"rc=$?\"\n");
            pty.expect("rc=130", Duration::from_secs(30));
            assert!(!alive(child));
            assert_eq!(holder(&s, &key), None, "released after Ctrl-C");
        }
    }
}

/// Starts `redis-lock run` (no terminal) on a child that writes its pid and
/// sleeps; returns redis-lock and the child's pid.
fn run_sleeper(s: &Server, key: &str, dir: &Path, extra: &str) -> (Child, i32) {
    let pid_file = dir.join(format!("{key}.pid"));
    let script = format!("echo $$ > {}; {extra} sleep 30", pid_file.display());
    let redis_lock = Command::new(BIN)
        .args(["run", "--url", &s.url(), "--key", key, "--ttl", "2s", "--"])
        .args(["sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let child = read_pid(&pid_file, Duration::from_secs(10));
    (redis_lock, child)
}

fn kill(pid: i32, sig: i32) {
    // SAFETY: a plain syscall.
    unsafe { libc::kill(pid, sig) };
}

/// SIGKILL to redis-lock (the OOM killer, a supervisor) takes the child
/// with it: before, the child went on running while the lease lapsed and a
/// second holder was granted.
#[test]
fn sigkill_to_redis_lock_kills_the_child() {
    let s = Server::start();
    let dir = scratch();
    let (mut redis_lock, child) = run_sleeper(&s, "k", &dir, "");
    kill(redis_lock.id() as i32, libc::SIGKILL);
    let _ = redis_lock.wait();
    wait_for(
        Duration::from_secs(5),
        "the child dies with redis-lock",
        || !alive(child),
    );
}

/// Every signal whose default would end redis-lock: afterwards the child
/// is gone and the lock is free, or both are still there (SIGPIPE, which
/// redis-lock ignores); never a child running without the lock.
#[test]
fn signals_to_redis_lock_never_leave_the_child_without_the_lock() {
    let s = Server::start();
    let dir = scratch();
    for sig in [
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGPIPE,
        libc::SIGHUP,
        libc::SIGXCPU,
        libc::SIGRTMIN() + 3,
    ] {
        let key = format!("k{sig}");
        let (mut redis_lock, child) = run_sleeper(&s, &key, &dir, "");
        kill(redis_lock.id() as i32, sig);
        sleep(Duration::from_millis(500));
        if alive(child) {
            assert!(
                redis_lock.try_wait().unwrap().is_none(),
                "signal {sig}: redis-lock exited, its child runs on"
            );
            sleep(Duration::from_millis(2500));
            assert!(
                holder(&s, &key).is_some(),
                "signal {sig}: the child runs without the lock"
            );
            kill(child, libc::SIGTERM);
        }
        let status = redis_lock.wait().unwrap();
        wait_for(Duration::from_secs(5), "the child is gone", || {
            !alive(child)
        });
        assert_eq!(
            holder(&s, &key),
            None,
            "signal {sig}: released ({status:?})"
        );
    }
}

/// When renewals fail (3 of 5 nodes stopped half a second into a 3 s lease)
/// the child hears it while the lease is still valid, and one that ignores
/// SIGTERM is killed before the lease ends on the nodes: before, SIGTERM
/// came at 3.2 s and SIGKILL 10 s later.
#[test]
fn a_lock_that_cannot_be_kept_is_signalled_within_its_validity() {
    if common::skip_unless(common::Needs::OwnServer, "stops three of five servers") {
        return;
    }
    let nodes: Vec<Server> = (0..5).map(|_| Server::start()).collect();
    let dir = scratch();
    for ignore_term in [false, true] {
        let key = format!("k{ignore_term}");
        let term_file = dir.join(format!("term-{ignore_term}"));
        let pid_file = dir.join(format!("pid-{ignore_term}"));
        let trap = if ignore_term {
            format!("trap 'date +%s%N > {}' TERM", term_file.display())
        } else {
            format!("trap 'date +%s%N > {}; exit 0' TERM", term_file.display())
        };
        let script = format!(
            "{trap}; echo $$ > {}; while :; do sleep 0.05; done",
            pid_file.display()
        );
        let mut args = vec!["run".to_string()];
        for n in &nodes {
            args.extend(["--url".into(), n.url()]);
        }
        args.extend(["--key", &key, "--ttl", "3s", "--", "sh", "-c", &script].map(String::from));
        let before = Instant::now();
        let wall_before = common::now_ms();
        let mut redis_lock = Command::new(BIN)
            .args(&args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let child = read_pid(&pid_file, Duration::from_secs(10));
        // Granted at or after `before`: its lease ends at or after before + 3 s.
        sleep(Duration::from_millis(500).saturating_sub(before.elapsed()));
        for n in &nodes[..3] {
            n.signal("STOP");
        }
        // When the child died (polled: redis-lock itself exits later, after
        // its release waited out the stopped nodes).
        let mut died = None;
        let status = loop {
            if died.is_none() && !alive(child) {
                died = Some(before.elapsed());
            }
            if let Some(status) = redis_lock.try_wait().unwrap() {
                break status;
            }
            assert!(
                before.elapsed() < Duration::from_secs(30),
                "redis-lock exits"
            );
            sleep(Duration::from_millis(5));
        };
        let died = died.unwrap_or_else(|| before.elapsed());
        for n in &nodes[..3] {
            n.signal("CONT");
        }
        assert_eq!(status.code(), Some(76));
        let term_ms: i64 = std::fs::read_to_string(&term_file)
            .expect("the child got SIGTERM")
            .trim()
            .parse::<i64>()
            .unwrap()
            / 1_000_000;
        assert!(
            term_ms - wall_before < 3000,
            "SIGTERM {} ms after the start, after the lease could have ended",
            term_ms - wall_before
        );
        assert!(!alive(child));
        if ignore_term {
            assert!(
                died < Duration::from_millis(3000),
                "a child ignoring SIGTERM was killed {died:?} after the start, past the lease"
            );
        }
    }
}

/// After the command exited, what it left running (here ignoring SIGTERM
/// and SIGINT, as a `&` job of a script does SIGINT) is still the job until
/// its grace ends: Ctrl-Z stops it with redis-lock (the shell gets the
/// terminal back), `fg` renews the lock and continues it, and the lock is
/// released once it was killed. Before, redis-lock went on renewing while
/// it sat stopped, and the shell never got the terminal back.
#[test]
fn ctrl_z_after_the_command_exited_stops_what_it_left_with_redis_lock() {
    let s = Server::start();
    let dir = scratch();
    let pid_file = dir.join("left");
    let mut pty = Pty::bash();
    pty.send(&format!(
        // The command exits once the leftover has set its traps (it writes
        // its pid after them): exiting first raced them with the SIGTERM.
        "{BIN} run --url {} --key kz --ttl 1s --grace 5s -- sh -c '(trap \"\" TERM INT; sh -c \"echo \\$PPID\" > {p}.tmp && mv {p}.tmp {p}; exec sleep 300) & while [ ! -s {p} ]; do sleep 0.01; done; exit 0'\n",
        s.url(),
        p = pid_file.display(),
    ));
    let left = read_pid(&pid_file, Duration::from_secs(10));
    pty.expect("stopping what it left running", Duration::from_secs(30));
    let redis_lock = parent_of(left);
    pty.send("\x1a");
    pty.expect("Stopped", Duration::from_secs(30));
    assert_eq!(state(left), Some('T'), "what the command left is stopped");
    assert_eq!(state(redis_lock), Some('T'), "redis-lock is stopped");
    pty.send("fg\n");
    wait_for(Duration::from_secs(10), "it runs again", || {
        state(left) != Some('T')
    });
    assert!(holder(&s, "kz").is_some(), "renewed after fg");
    wait_for(
        Duration::from_secs(20),
        "redis-lock exits after the grace",
        || !alive(redis_lock),
    );
    pty.send("echo \"rc=$?\"\n");
    pty.expect("rc=0", Duration::from_secs(30));
    assert!(!alive(left), "killed at the end of the grace");
    assert_eq!(holder(&s, "kz"), None, "released at the end");
}

/// With `stty tostop`, a process outside the terminal's foreground group
/// that writes to it gets SIGTTOU. redis-lock is in that position while
/// the job has the terminal; its messages (a lost lock, leftovers) must
/// neither hang it nor come before the job is signalled. Before, the
/// write was restarted after each SIGTTOU for ever: the lost lock's child
/// ran on, without the lock, and redis-lock never exited.
#[test]
fn messages_from_the_background_do_not_hang_redis_lock_under_tostop() {
    let s = Server::start();
    let dir = scratch();
    let pid_file = dir.join("tostop");
    let mut pty = Pty::bash();
    pty.send("stty tostop\n");
    pty.send(&format!(
        "{BIN} run --url {} --key kt --ttl 1s -- sh -c 'echo $$ > {}; while :; do sleep 0.05; done'\n",
        s.url(),
        pid_file.display(),
    ));
    let child = read_pid(&pid_file, Duration::from_secs(10));
    let redis_lock = parent_of(child);
    // The lock is taken from under it: the next renewal is refused.
    let _: i64 = redis::cmd("DEL").arg("kt").query(&mut s.conn()).unwrap();
    wait_for(Duration::from_secs(10), "the child is stopped", || {
        !alive(child)
    });
    wait_for(Duration::from_secs(10), "redis-lock exits", || {
        !alive(redis_lock)
    });
    pty.send("echo \"rc=$?\"\n");
    pty.expect("lost the lock on kt", Duration::from_secs(30));
    pty.expect("rc=76", Duration::from_secs(30));
}

/// A parent that ignores SIGCHLD (some wrappers and supervisors do) passes
/// that on through exec; the kernel then reaps the children itself. Before,
/// redis-lock never saw its command exit and renewed the lock for ever.
#[test]
fn an_inherited_ignored_sigchld_does_not_hide_the_commands_exit() {
    let s = Server::start();
    let mut command = Command::new(BIN);
    command
        .args(["run", "--url", &s.url(), "--key", "kc", "--ttl", "2s", "--"])
        .args(["sh", "-c", "sleep 0.2; exit 3"])
        .stderr(Stdio::piped());
    // SAFETY: signal is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGCHLD, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut redis_lock = command.spawn().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = redis_lock.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = redis_lock.kill();
            panic!("redis-lock did not exit after its command did");
        }
        sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(3), "the command's own exit code");
    assert_eq!(holder(&s, "kc"), None, "released");
}

/// A `--grace` too long for a clock (10^15 hours) means "never", not a
/// panic: the command leaves a process that ends on SIGTERM, and
/// redis-lock reports the command's code. Before, it panicked (exit 101)
/// while computing the SIGKILL time.
#[test]
fn a_grace_beyond_any_clock_is_not_a_crash() {
    let s = Server::start();
    let out = Command::new(BIN)
        .args(["run", "--url", &s.url(), "--key", "kg", "--ttl", "2s"])
        .args(["--grace", "3000000000000000h", "--"])
        .args(["sh", "-c", "sleep 30 & exit 3"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(holder(&s, "kg"), None, "released");
}

/// SIGSTOP to redis-lock alone (a debugger, `kill -STOP`, a hung
/// redis-lock): renewals stop, but the job must not outlive the lock's
/// validity. The sentry kills it when the validity passes (on the boot
/// clock) without redis-lock having moved it; continued, redis-lock
/// reports the lost lock. Before, the job ran on without the lock for as
/// long as redis-lock stayed stopped.
#[test]
fn a_stopped_redis_lock_does_not_leave_its_job_running_past_the_validity() {
    let s = Server::start();
    let dir = scratch();
    let (mut redis_lock, child) = run_sleeper(&s, "ks", &dir, "");
    let stopped_at = Instant::now();
    kill(redis_lock.id() as i32, libc::SIGSTOP);
    // The TTL is 2 s: the validity ends within 2 s of the stop (generous
    // margins for a loaded machine).
    wait_for(
        Duration::from_secs(8),
        "the job is killed while redis-lock is stopped",
        || !alive(child),
    );
    assert!(
        stopped_at.elapsed() >= Duration::from_millis(1000),
        "killed before its validity could have ended ({:?})",
        stopped_at.elapsed()
    );
    assert!(
        redis_lock.try_wait().unwrap().is_none(),
        "redis-lock is still there (stopped)"
    );
    kill(redis_lock.id() as i32, libc::SIGCONT);
    let status = redis_lock.wait().unwrap();
    assert_eq!(status.code(), Some(76), "the lock was lost");
}

/// Issue 23, item 2: Ctrl-Z stops the whole job the shell sees, wherever
/// `redis-lock run` sits in it: inside a shell script, under `make`, and
/// nested (`redis-lock run -- redis-lock run -- cmd`). The shell gets its
/// prompt ("Stopped"), every process of the job is stopped, and `fg`
/// renews the lock and lets the command run again. Before, only
/// redis-lock stopped itself: the script's group ran on, the shell never
/// saw the job stop, and nested, the outer one renewed for ever.
#[test]
fn ctrl_z_stops_the_whole_job_from_a_script_make_or_nested() {
    let s = Server::start();
    let dir = scratch();
    for (round, how) in ["script", "make", "nested"].into_iter().enumerate() {
        // The command is one process (`exec sleep`): a shell loop that
        // forks (dash uses vfork) can be caught by Ctrl-Z between vfork and
        // exec, and then the shell waits uninterruptibly for a stopped
        // child and never stops itself, under any job control.
        let pid_file = dir.join(format!("pid{round}"));
        let key = format!("z{round}");
        let inner = format!(
            "{BIN} run --url {} --key {key} --ttl 3s -- sh -c 'echo $$ > {}; exec sleep 60'",
            s.url(),
            pid_file.display(),
        );
        let line = match how {
            "script" => {
                let script = dir.join("job.sh");
                std::fs::write(&script, format!("{inner}\necho script-after\n")).unwrap();
                format!("bash {}\n", script.display())
            }
            "make" => {
                let makefile = dir.join("Makefile");
                // `$$` is make's escape for `$`.
                let recipe = inner.replace('$', "$$");
                std::fs::write(&makefile, format!("all:\n\t{recipe}\n\t@echo make-after\n"))
                    .unwrap();
                format!("make -s -f {}\n", makefile.display())
            }
            _ => format!(
                "{BIN} run --url {} --key outer{round} --ttl 3s -- {inner}\n",
                s.url()
            ),
        };
        let mut pty = Pty::bash();
        pty.send(&line);
        let child = read_pid(&pid_file, Duration::from_secs(10));
        let redis_lock = parent_of(child);
        let above = parent_of(redis_lock); // the script's bash, make's sh, the outer redis-lock
        pty.send("\x1a");
        pty.expect("Stopped", Duration::from_secs(30));
        for (pid, what) in [
            (child, "the child"),
            (redis_lock, "redis-lock"),
            (above, "its parent"),
        ] {
            wait_for(
                Duration::from_secs(5),
                &format!("{how}: {what} is stopped"),
                || state(pid) == Some('T'),
            );
        }
        // Stopped for a while (within the lease's validity; a longer stop
        // ends the job, as ctrl_z_stops_the_child_with_redis_lock_and_fg_checks_the_lock
        // shows): fg renews the lock before the child runs again.
        sleep(Duration::from_millis(1000));
        pty.send("fg\n");
        wait_for(
            Duration::from_secs(10),
            &format!("{how}: the child runs again"),
            || state(child).is_some_and(|c| c != 'T'),
        );
        sleep(Duration::from_millis(1500));
        assert!(alive(child), "{how}");
        assert!(holder(&s, &key).is_some(), "{how}: renewed after fg");
        pty.send("\x03");
        wait_for(
            Duration::from_secs(10),
            &format!("{how}: redis-lock exits"),
            || !alive(redis_lock),
        );
        pty.send("echo \"done=$?\"\n");
        pty.expect("done=", Duration::from_secs(30));
        assert_eq!(holder(&s, &key), None, "{how}: released after Ctrl-C");
    }
}

/// Issue 23, item 3: a process that leaves the command's process group,
/// even its session (`setsid -f`, a daemon, reparented to redis-lock as
/// its subreaper), is still part of the job: when the command exits it
/// gets SIGTERM like what the command left in its group, and the lock is
/// held until it is gone; if redis-lock is SIGKILLed, the sentry kills it
/// too. Before, it ran on after the release, while a second holder could
/// be granted.
#[test]
fn a_daemon_the_command_started_is_part_of_the_job() {
    let s = Server::start();
    let dir = scratch();
    for killed in [false, true] {
        let key = format!("d{killed}");
        let daemon_pid = dir.join(format!("daemon-{killed}"));
        let script = format!(
            // The command exits only once the daemon has written its pid
            // (on a loaded machine `setsid -f` may start it late, and
            // redis-lock stops what is left when the command exits).
            "setsid -f sh -c 'echo $$ > {0}.tmp; mv {0}.tmp {0}; exec sleep 60'; \
             while [ ! -s {0} ]; do sleep 0.05; done; sleep {1}",
            daemon_pid.display(),
            if killed { 30 } else { 0 }
        );
        let mut redis_lock = Command::new(BIN)
            .args(["run", "--url", &s.url(), "--key", &key, "--ttl", "2s"])
            .args(["--grace", "300ms", "--", "sh", "-c", &script])
            .env_remove("REDIS_LOCK_URL")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let daemon = read_pid(&daemon_pid, Duration::from_secs(10));
        if killed {
            sleep(Duration::from_millis(500)); // seen by redis-lock's scan
            kill(redis_lock.id() as i32, libc::SIGKILL);
        }
        let status = redis_lock.wait().unwrap();
        if !killed {
            assert_eq!(status.code(), Some(0));
            // Released only once the daemon was gone.
            assert!(
                !alive(daemon),
                "the lock was released with the daemon running"
            );
            assert_eq!(holder(&s, &key), None);
        } else {
            wait_for(
                Duration::from_secs(5),
                "the sentry kills the daemon",
                || !alive(daemon),
            );
        }
    }
}

/// Issue 23, item 3: with an interactive shell as the command, the jobs
/// started at its prompt (each in a process group of its own) are part of
/// the job: a lost lock signals them too.
#[test]
fn a_lost_lock_stops_the_jobs_of_an_interactive_shell_too() {
    let s = Server::start();
    let dir = scratch();
    let bg_pid = dir.join("bg");
    let mut pty = Pty::bash();
    pty.send(&format!(
        "{BIN} run --url {} --key shell --ttl 900ms --grace 300ms -- bash --norc --noprofile -i\n",
        s.url()
    ));
    wait_for(Duration::from_secs(10), "the lock is taken", || {
        holder(&s, "shell").is_some()
    });
    sleep(Duration::from_millis(300));
    pty.send(&format!("sleep 60 & echo $! > {}\n", bg_pid.display()));
    let bg = read_pid(&bg_pid, Duration::from_secs(10));
    let redis_lock = parent_of(parent_of(bg));
    sleep(Duration::from_millis(500)); // seen by redis-lock's scan
    let _: i64 = redis::cmd("DEL").arg("shell").query(&mut s.conn()).unwrap();
    wait_for(
        Duration::from_secs(10),
        "the shell's job is stopped",
        || !alive(bg),
    );
    // The interactive shell ignores SIGTERM: SIGKILL after the grace.
    wait_for(Duration::from_secs(10), "redis-lock exits", || {
        !alive(redis_lock)
    });
    pty.send("echo \"rc=$?\"\n");
    pty.expect("rc=76", Duration::from_secs(30));
}
