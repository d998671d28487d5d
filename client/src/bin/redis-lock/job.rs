//! The command run under the lock, as a job that never runs without it.
//!
//! - It dies with `redis-lock`, whatever ends it (SIGKILL, the OOM killer,
//!   a crash): the command through `PR_SET_PDEATHSIG` with SIGKILL, set
//!   before it execs; the rest of its group through a [`Sentry`], a forked
//!   process that SIGKILLs the group when `redis-lock` ends without
//!   standing it down (PDEATHSIG is not inherited by the command's
//!   children).
//! - It runs in a process group of its own, which is given the terminal
//!   when `redis-lock` has it: it reads the terminal and gets Ctrl-C, Ctrl-Z
//!   and Ctrl-\ like any foreground job (as under flock(1)).
//! - The job is that whole group, not only the command: the lock is held
//!   until every process in it has exited (as flock(1)'s lock is held by
//!   every process that inherited it), and a lost lock signals all of them.
//!   `redis-lock` is a child subreaper, so members orphaned by the
//!   command's exit are reaped here and the group's end can be told. A
//!   process that leaves the group (setsid, a daemon) leaves the job.
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
    /// The command exited: the raw wait status. Other members of its
    /// group may still run.
    Exited(libc::c_int),
    /// The command has exited and no process is left in its group.
    GroupEmpty,
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

/// Makes `redis-lock` the reaper of its orphaned descendants, so the
/// members of the job's group that outlive the command become its children
/// (reaped by [`watch`]) rather than init's.
pub fn become_subreaper() {
    // SAFETY: a plain prctl with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong);
    }
}

/// Whether any process is left in `group` (one that cannot be signalled
/// for want of permission still counts).
pub fn group_alive(group: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks.
    let r = unsafe { libc::kill(-group, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Reports the command's stops, continues and exit, then the end of its
/// group, from a thread that reaps every child of `redis-lock`
/// (`waitpid(-1)`, WUNTRACED | WCONTINUED; the orphans of the group come
/// here as its subreaper). Nothing else may reap.
pub fn watch(leader: libc::pid_t) -> mpsc::UnboundedReceiver<ChildEvent> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        loop {
            let mut status: libc::c_int = 0;
            // SAFETY: a valid pointer to a local.
            let r = unsafe { libc::waitpid(-1, &mut status, libc::WUNTRACED | libc::WCONTINUED) };
            if r < 0 {
                if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                // ECHILD: the command is gone without a status for us.
                if tx.send(ChildEvent::Exited(0)).is_err() {
                    return;
                }
                break;
            }
            if r != leader {
                // An orphan of the job, reaped (or stopped: not the
                // command's stop, which is what job control follows).
                continue;
            }
            let event = if libc::WIFSTOPPED(status) {
                ChildEvent::Stopped(libc::WSTOPSIG(status))
            } else if libc::WIFCONTINUED(status) {
                ChildEvent::Continued
            } else {
                ChildEvent::Exited(status)
            };
            let done = matches!(event, ChildEvent::Exited(_));
            if tx.send(event).is_err() {
                return;
            }
            if done {
                break;
            }
        }
        // The rest of the group: reap whatever exits (orphans come to this
        // process) until none is left.
        while group_alive(leader) {
            let mut status: libc::c_int = 0;
            // SAFETY: a valid pointer to a local.
            while unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } > 0 {}
            if !group_alive(leader) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = tx.send(ChildEvent::GroupEmpty);
    });
    rx
}

/// A forked process that kills the job's group with SIGKILL when
/// `redis-lock` dies without standing it down: it waits on a pipe whose
/// only write end `redis-lock` holds, so the kernel closes it however
/// `redis-lock` ends. The job cannot hold the write end (close-on-exec,
/// made after the command was spawned).
pub struct Sentry {
    write: OwnedFd,
    group: libc::pid_t,
}

impl Sentry {
    /// Forks the sentry for `group`; None if it cannot (then the command
    /// alone dies with `redis-lock`, through PDEATHSIG).
    pub fn post(group: libc::pid_t) -> Option<Sentry> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: a valid array of two fds.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return None;
        }
        // SAFETY: both fds are fresh and owned here.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: the child makes only async-signal-safe calls (setpgid,
        // signal, close, read, killpg, _exit): this process has threads.
        match unsafe { libc::fork() } {
            -1 => None,
            0 => unsafe {
                let keep = read.as_raw_fd();
                // Out of the terminal's reach (Ctrl-C goes to a foreground
                // group) and of the job's signals.
                libc::setpgid(0, 0);
                for sig in [
                    libc::SIGINT,
                    libc::SIGQUIT,
                    libc::SIGHUP,
                    libc::SIGTERM,
                    libc::SIGTSTP,
                    libc::SIGTTIN,
                    libc::SIGTTOU,
                    libc::SIGPIPE,
                ] {
                    libc::signal(sig, libc::SIG_IGN);
                }
                // Hold nothing of redis-lock's (its output pipes, sockets,
                // the write end).
                for fd in 0..1024 {
                    if fd != keep {
                        libc::close(fd);
                    }
                }
                let mut byte = 0u8;
                loop {
                    let n = libc::read(keep, (&mut byte as *mut u8).cast(), 1);
                    if n == 1 {
                        libc::_exit(0); // stood down: the job has ended
                    }
                    if n == 0 || *libc::__errno_location() != libc::EINTR {
                        libc::killpg(group, libc::SIGKILL);
                        libc::_exit(0);
                    }
                }
            },
            _ => {
                drop(read);
                Some(Sentry { write, group })
            }
        }
    }
}

/// Dropped (redis-lock is about to exit): the sentry leaves without
/// killing anything if the job has ended, and kills what is left of it
/// otherwise (the write end closes, as when redis-lock dies).
impl Drop for Sentry {
    fn drop(&mut self) {
        if !group_alive(self.group) {
            // SAFETY: one byte from a local to an owned fd.
            unsafe {
                libc::write(self.write.as_raw_fd(), [1u8].as_ptr().cast(), 1);
            }
        }
    }
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
