//! The command run under the lock, as a job that never runs without it.
//!
//! - It dies with `redis-lock`, whatever ends it (SIGKILL, the OOM killer,
//!   a crash): `PR_SET_PDEATHSIG` with SIGKILL, set before it execs.
//! - It runs in a process group of its own (so a lost lock stops everything
//!   it started), which is given the terminal when `redis-lock` has it: it
//!   reads the terminal and gets Ctrl-C, Ctrl-Z and Ctrl-\ like any
//!   foreground job (as under flock(1)).
//! - A job-control stop of the child (Ctrl-Z, SIGTTIN, SIGTTOU) stops
//!   `redis-lock` too, so the shell sees the job stopped; when the shell
//!   continues `redis-lock`, it first renews the lock and continues the
//!   child only if it still holds it, else kills the stopped child.
//! - Stops and exits are read with `waitpid(WUNTRACED)` on a thread of its
//!   own; every libc call is here.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;

use tokio::sync::mpsc;

/// What `waitpid` reported about the child.
#[derive(Debug, Clone, Copy)]
pub enum ChildEvent {
    /// Stopped by this signal.
    Stopped(libc::c_int),
    Continued,
    /// Exited: the raw wait status.
    Exited(libc::c_int),
}

/// Signals that end a process by default and can be caught: each is passed
/// on to the child's group, and `redis-lock` releases the lock once the
/// child has exited. (SIGKILL cannot be caught: the child dies with it
/// through PDEATHSIG, and the lease ends by itself. SIGPIPE is ignored, as
/// Rust programs do.)
pub const FORWARDED: &[libc::c_int] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGPWR,
    libc::SIGIO,
];

/// Job-control stops sent to `redis-lock` itself (not through the
/// terminal, which sends them to the child's group).
pub const STOPS: &[libc::c_int] = &[libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];

/// The controlling terminal, if `redis-lock` is in its foreground group
/// now (the job the user is typing to).
pub struct Terminal {
    fd: OwnedFd,
}

impl Terminal {
    /// The controlling terminal (`/dev/tty`), if there is one.
    pub fn open() -> Option<Terminal> {
        // SAFETY: a NUL-terminated path; the returned fd is owned below.
        let fd = unsafe {
            libc::open(
                c"/dev/tty".as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: a fresh fd nothing else owns.
        Some(Terminal {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn foreground(&self) -> libc::pid_t {
        // SAFETY: a valid fd.
        unsafe { libc::tcgetpgrp(self.fd.as_raw_fd()) }
    }

    /// Whether `redis-lock`'s group has the terminal.
    pub fn ours(&self) -> bool {
        // SAFETY: no arguments.
        self.foreground() == unsafe { libc::getpgrp() }
    }

    /// Gives the terminal to `group` (SIGTTOU blocked meanwhile, as a shell
    /// does, since the caller may be in the background).
    pub fn give_to(&self, group: libc::pid_t) {
        give_terminal(self.fd.as_raw_fd(), group);
    }

    /// Gives the terminal back to `redis-lock`'s group if `group` has it
    /// (the child exited; the shell takes it from there).
    pub fn take_back_from(&self, group: libc::pid_t) {
        if self.foreground() == group {
            // SAFETY: no arguments.
            self.give_to(unsafe { libc::getpgrp() });
        }
    }

    pub fn raw(&self) -> libc::c_int {
        self.fd.as_raw_fd()
    }
}

/// tcsetpgrp with SIGTTOU blocked; only async-signal-safe calls (it also
/// runs in the forked child before exec).
fn give_terminal(fd: libc::c_int, group: libc::pid_t) {
    // SAFETY: plain syscalls on a stack sigset.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        libc::tcsetpgrp(fd, group);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

/// Prepares `command` to run as the lock's job: its own process group,
/// killed when `redis-lock` dies, and given the terminal if `terminal` is
/// the one `redis-lock` has in the foreground.
pub fn prepare(command: &mut std::process::Command, terminal: Option<&Terminal>) {
    // SAFETY: no arguments.
    let parent = unsafe { libc::getpid() };
    let tty = terminal.filter(|t| t.ours()).map(Terminal::raw);
    command.process_group(0);
    // SAFETY: the closure runs in the forked child before exec and makes
    // only async-signal-safe calls (prctl, getppid, setpgid, tcsetpgrp,
    // sigprocmask).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // redis-lock died before the line above: nobody holds the lock.
            if libc::getppid() != parent {
                return Err(io::Error::other("redis-lock exited"));
            }
            libc::setpgid(0, 0);
            if let Some(fd) = tty {
                give_terminal(fd, libc::getpid());
            }
            Ok(())
        });
    }
}

/// Reports the child's stops, continues and exit, from a thread that
/// waits for it (`waitpid` with WUNTRACED | WCONTINUED). Nothing else may
/// reap the child.
pub fn watch(pid: libc::pid_t) -> mpsc::UnboundedReceiver<ChildEvent> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || loop {
        let mut status: libc::c_int = 0;
        // SAFETY: a valid pointer to a local.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED | libc::WCONTINUED) };
        if r < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // ECHILD: it is gone (and not ours to reap any more).
            let _ = tx.send(ChildEvent::Exited(0));
            return;
        }
        let event = if libc::WIFSTOPPED(status) {
            ChildEvent::Stopped(libc::WSTOPSIG(status))
        } else if libc::WIFCONTINUED(status) {
            ChildEvent::Continued
        } else {
            ChildEvent::Exited(status)
        };
        let done = matches!(event, ChildEvent::Exited(_));
        if tx.send(event).is_err() || done {
            return;
        }
    });
    rx
}

/// Sends `sig` to the child's process group (the child leads it).
pub fn signal_group(group: libc::pid_t, sig: libc::c_int) {
    // SAFETY: a plain syscall; a gone group only returns ESRCH.
    unsafe {
        libc::killpg(group, sig);
    }
}

/// Stops `redis-lock` itself (the shell sees its job stopped) after giving
/// the terminal back to its own group; returns once continued.
pub fn stop_self(terminal: Option<&Terminal>) {
    if let Some(t) = terminal {
        // SAFETY: no arguments.
        t.give_to(unsafe { libc::getpgrp() });
    }
    // SAFETY: stops this process until SIGCONT.
    unsafe {
        libc::raise(libc::SIGSTOP);
    }
}

/// The exit status `redis-lock` reports for the child's wait status: its
/// code, or 128 + the signal that killed it.
pub fn exit_code(status: libc::c_int) -> u8 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status) as u8
    } else if libc::WIFSIGNALED(status) {
        128u8.wrapping_add(libc::WTERMSIG(status) as u8)
    } else {
        1
    }
}
