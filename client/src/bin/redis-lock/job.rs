//! The command run under the lock, as a job that never runs without it.
//!
//! - It dies with `redis-lock`, whatever ends it (SIGKILL, the OOM killer,
//!   a crash): the command through `PR_SET_PDEATHSIG` with SIGKILL, set
//!   before it execs; the rest of its group through a [`Sentry`], a forked
//!   process that SIGKILLs the group when `redis-lock` ends without
//!   standing it down (PDEATHSIG is not inherited by the command's
//!   children). The sentry also kills the group when the lock's validity
//!   passes without `redis-lock` having moved it (a SIGSTOP to
//!   `redis-lock` alone, a hang, a suspend).
//! - It runs in a process group of its own, which is given the terminal
//!   when `redis-lock` has it: it reads the terminal and gets Ctrl-C, Ctrl-Z
//!   and Ctrl-\ like any foreground job (as under flock(1)).
//! - The job is that whole group, not only the command: it ends with the
//!   command (what is left gets SIGTERM, then SIGKILL), the lock is held
//!   until no process of it is left, and a lost lock signals all of them.
//!   `redis-lock` is a child subreaper, so members orphaned by the
//!   command's exit are reaped here (and their stops seen) and the group's
//!   end can be told. A process that leaves the group (setsid, a daemon, a
//!   shell's job) stays in the job: [`Members`] finds them among
//!   `redis-lock`'s descendants, and they are signalled and waited for
//!   with the group (and killed by the sentry, through pidfds).
//! - A job-control stop of the job (Ctrl-Z, SIGTTIN, SIGTTOU) stops
//!   `redis-lock`'s own process group too (SIGTSTP, as Ctrl-Z: the script,
//!   `make` or outer `redis-lock` that runs it stops with it), so the shell
//!   sees its job stopped; when the shell continues it, `redis-lock` first
//!   renews the lock and continues the child only if it still holds it,
//!   else kills the stopped child.
//! - Stops and exits are read with `waitpid(WUNTRACED)` on a thread of its
//!   own.
//!
//! Every system call goes through `sys`, which holds the binary's only
//! `unsafe` code; here are the two calls whose soundness depends on what
//! follows them (the sentry's fork, the command's pre-exec), each saying
//! why it holds.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::sys::{self, Forked};

/// The processes of the job outside the command's process group: every
/// descendant of `redis-lock` (it is their subreaper, so one orphaned on
/// the way, a `setsid -f` daemon, comes back to it) other than the sentry
/// and the group itself, as found by scanning `/proc`, each known by its
/// pid and start time (a pid reused by another process is not it). Once
/// seen, a process stays a member until it exits, wherever it is
/// reparented. Shared by the main loop (which signals them and tells the
/// sentry) and the watcher (which waits for them to be gone).
#[derive(Debug, Default)]
pub struct Members {
    group: libc::pid_t,
    sentry: libc::pid_t,
    known: std::collections::HashMap<libc::pid_t, u64>,
    /// Members that may not be signalled (another user's), said once.
    told_unreachable: bool,
}

/// One `/proc/<pid>/stat`: parent, process group, start time, state.
struct ProcStat {
    ppid: libc::pid_t,
    pgrp: libc::pid_t,
    start: u64,
    zombie: bool,
}

fn proc_stat(pid: libc::pid_t) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After "pid (comm)": state ppid pgrp session ... starttime (field 22).
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(ProcStat {
        zombie: matches!(fields.first(), Some(&"Z") | Some(&"X")),
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

impl Members {
    /// Members of the job whose group `group` leads, `sentry` aside.
    pub fn new(group: libc::pid_t, sentry: libc::pid_t) -> Members {
        Members {
            group,
            sentry,
            ..Members::default()
        }
    }

    /// Scans for descendants of `redis-lock` and forgets members that have
    /// exited; returns the new ones (for the sentry).
    pub fn refresh(&mut self) -> Vec<libc::pid_t> {
        let mut children: std::collections::HashMap<libc::pid_t, Vec<(libc::pid_t, ProcStat)>> =
            std::collections::HashMap::new();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if let Some(stat) = proc_stat(pid) {
                children.entry(stat.ppid).or_default().push((pid, stat));
            }
        }
        let mut new = Vec::new();
        let mut stack = vec![sys::own_pid()];
        while let Some(parent) = stack.pop() {
            for (pid, stat) in children.remove(&parent).unwrap_or_default() {
                if pid == self.sentry {
                    continue;
                }
                stack.push(pid);
                let outside = stat.pgrp != self.group;
                if outside && !stat.zombie && self.known.insert(pid, stat.start).is_none() {
                    new.push(pid);
                }
            }
        }
        self.known.retain(|&pid, &mut start| {
            proc_stat(pid).is_some_and(|s| s.start == start && !s.zombie)
        });
        new
    }

    /// Whether any member is left (after a refresh).
    pub fn any(&mut self) -> bool {
        self.refresh();
        !self.known.is_empty()
    }

    /// Sends `sig` to every member (after a refresh, so one started a
    /// moment ago is included); says once if some may not be signalled.
    pub fn signal(&mut self, sig: libc::c_int) {
        self.refresh();
        let mut unreachable = Vec::new();
        for (&pid, &start) in &self.known {
            let same = proc_stat(pid).is_some_and(|s| s.start == start);
            if same && !sys::signal_pid(pid, sig) {
                unreachable.push(pid);
            }
        }
        if !unreachable.is_empty() && !self.told_unreachable {
            self.told_unreachable = true;
            say(format_args!(
                "redis-lock: processes of the job {unreachable:?} belong to another user and cannot be signalled; the lock is held until they exit"
            ));
        }
    }
}

/// What `waitpid` reported about the child.
#[derive(Debug, Clone, Copy)]
pub enum ChildEvent {
    /// A process of the job (the command, or one it left that came to
    /// `redis-lock` as its subreaper) was stopped by this signal.
    Stopped {
        pid: libc::pid_t,
        signal: libc::c_int,
    },
    Continued,
    /// The command exited: the raw wait status (None if the kernel reaped
    /// it and no status is known). Other members of its group may still run.
    Exited(Option<libc::c_int>),
    /// The command has exited and no process of the job is left: none in
    /// its group, no other member ([`Members`]).
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

/// Also forwarded when they can be caught here (a signal the runtime cannot
/// take is left to end `redis-lock`, and the sentry the job): the
/// real-time signals and SIGSTKFLT. Not forwarded: the signals that report
/// a fault of `redis-lock` itself (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP,
/// SIGSYS: a handler would let the faulting thread go on); they end it, the
/// sentry kills the job, the lease runs out.
pub fn also_forwarded() -> Vec<libc::c_int> {
    let mut signals = vec![libc::SIGSTKFLT];
    signals.extend(libc::SIGRTMIN()..=libc::SIGRTMAX());
    signals
}

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
        sys::open_tty().map(|fd| Terminal { fd })
    }

    fn foreground(&self) -> libc::pid_t {
        sys::foreground_group(self.fd.as_fd())
    }

    /// Whether `redis-lock`'s group has the terminal.
    pub fn ours(&self) -> bool {
        self.foreground() == sys::own_group()
    }

    /// Gives the terminal to `group` (SIGTTOU blocked meanwhile, as a shell
    /// does, since the caller may be in the background).
    pub fn give_to(&self, group: libc::pid_t) {
        sys::give_terminal(self.fd.as_raw_fd(), group);
    }

    /// Gives the terminal back to `redis-lock`'s group if `group` has it
    /// (the child exited; the shell takes it from there).
    pub fn take_back_from(&self, group: libc::pid_t) {
        if self.foreground() == group {
            self.give_to(sys::own_group());
        }
    }

    pub fn raw(&self) -> libc::c_int {
        self.fd.as_raw_fd()
    }
}

/// A line on stderr while the job may have the terminal (redis-lock is then
/// in the background): see [`sys::with_sigttou_blocked`].
pub fn say(line: std::fmt::Arguments) {
    sys::with_sigttou_blocked(|| {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{line}");
    });
}

/// Restores SIGCHLD's default disposition: one inherited as ignored (a
/// parent may exec redis-lock so) makes the kernel reap the children
/// itself, and the command's exit would never be seen.
pub fn default_sigchld() {
    sys::set_disposition(libc::SIGCHLD, false);
}

/// Prepares `command` to run as the lock's job: its own process group,
/// killed when `redis-lock` dies, and given the terminal if `terminal` is
/// the one `redis-lock` has in the foreground.
pub fn prepare(command: &mut std::process::Command, terminal: Option<&Terminal>) {
    use std::os::unix::process::CommandExt;
    let parent = sys::own_pid();
    let tty = terminal.filter(|t| t.ours()).map(Terminal::raw);
    command.process_group(0);
    let in_child = move || {
        sys::die_with_parent()?;
        // redis-lock died before the line above: nobody holds the lock.
        // (ESRCH, "no such process": an errno, so nothing is allocated.)
        if sys::parent_pid() != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        sys::lead_own_group();
        if let Some(fd) = tty {
            sys::give_terminal(fd, sys::own_pid());
        }
        Ok(())
    };
    // SAFETY: `in_child` makes only `sys` calls (async-signal-safe, no
    // allocation) on integers it captured, and its errors are errnos
    // (`io::Error` of an OS error allocates nothing).
    unsafe { sys::pre_exec(command, in_child) };
}

/// Makes `redis-lock` the reaper of its orphaned descendants, so the
/// members of the job's group that outlive the command become its children
/// (reaped by [`watch`]) rather than init's.
pub fn become_subreaper() {
    sys::become_subreaper();
}

/// Whether any process of the job is left: in `group` (one that cannot be
/// signalled for want of permission still counts), or a member outside it.
pub fn job_alive(group: libc::pid_t, members: &std::sync::Mutex<Members>) -> bool {
    sys::group_alive(group) || members.lock().unwrap_or_else(|p| p.into_inner()).any()
}

/// Reports the job's stops and continues, the command's exit, then the
/// end of its group, from a thread that reaps every child of `redis-lock`
/// (`waitpid(-1)`, WUNTRACED | WCONTINUED; the orphans of the group come
/// here as its subreaper, so their stops are seen too once the command has
/// exited). Nothing else may reap.
pub fn watch(
    leader: libc::pid_t,
    members: std::sync::Arc<std::sync::Mutex<Members>>,
) -> mpsc::UnboundedReceiver<ChildEvent> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let mut leader_done = false;
        loop {
            // While the command runs, wait for it; after, poll the group.
            let flags =
                libc::WUNTRACED | libc::WCONTINUED | if leader_done { libc::WNOHANG } else { 0 };
            let waited = sys::wait_any(flags);
            if waited == Err(libc::EINTR) {
                continue;
            }
            if let Ok(Some((r, status))) = waited {
                let in_job = r == leader || sys::group_of(r) == leader;
                let event = if !in_job {
                    None // the sentry, or a process that left the job
                } else if libc::WIFSTOPPED(status) {
                    Some(ChildEvent::Stopped {
                        pid: r,
                        signal: libc::WSTOPSIG(status),
                    })
                } else if libc::WIFCONTINUED(status) {
                    Some(ChildEvent::Continued)
                } else if r == leader {
                    leader_done = true;
                    Some(ChildEvent::Exited(Some(status)))
                } else {
                    None // a member left behind, now reaped
                };
                if let Some(event) = event {
                    if tx.send(event).is_err() {
                        return;
                    }
                }
                continue;
            }
            if waited.is_err() && !leader_done {
                // ECHILD: the command is gone without a status for us
                // (not a success: its status is unknown).
                leader_done = true;
                if tx.send(ChildEvent::Exited(None)).is_err() {
                    return;
                }
            }
            if leader_done {
                if !job_alive(leader, &members) {
                    let _ = tx.send(ChildEvent::GroupEmpty);
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    });
    rx
}

/// Whether `pid` is stopped now (a stop event may be stale by the time it
/// is read: the job continued since).
pub fn is_stopped(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
    })
}

/// A forked process that kills the job's group with SIGKILL when
/// `redis-lock` can no longer stand for the lock: when it dies before the
/// job has ended (it waits on a pipe whose only write end `redis-lock`
/// holds, so the kernel closes it however `redis-lock` ends), and when the
/// lock's validity passes on CLOCK_BOOTTIME without `redis-lock` having
/// moved it ([`hold_until`](Sentry::hold_until)): `redis-lock` stopped
/// alone (SIGSTOP), hung, or the machine suspended. Forked before the
/// command is spawned (so no moment passes with the job unguarded), it
/// learns the group from the pipe ([`arm`](Sentry::arm)) and leaves on
/// [`stand_down`](Sentry::stand_down), sent only once the group was seen
/// empty: it never signals a group id that may have been reused.
pub struct Sentry {
    write: OwnedFd,
    /// The sentry's pid (not a member of the job).
    pub pid: libc::pid_t,
}

/// The sentry's messages: a kind byte and 8 bytes of payload (one pipe
/// write each, so each arrives whole).
const ARM: u8 = b'G';
const MEMBER: u8 = b'M';
const HOLD_UNTIL: u8 = b'D';
const STAND_DOWN: u8 = b'S';

/// CLOCK_BOOTTIME in nanoseconds: it counts system suspend (async-signal-safe).
pub fn boot_ns() -> u64 {
    nanos(redis_lock_client::boot_clock())
}

/// A duration in nanoseconds, saturating.
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Sentry {
    /// Forks the sentry; None if it cannot (then the command alone dies
    /// with `redis-lock`, through PDEATHSIG).
    pub fn post() -> Option<Sentry> {
        let (read, write) = sys::pipe()?;
        // SAFETY: the child branch makes only `sys` calls (async-signal-
        // safe, no allocation, no stdio, no tokio) and ends in
        // `sys::exit_now`: it never returns into code that could take a
        // lock another thread held at the fork. Its calls: setpgid,
        // signal, close, poll, read, clock_gettime, killpg, _exit.
        match unsafe { sys::fork() }? {
            Forked::Child => {
                let keep = read.as_raw_fd();
                // Out of the terminal's reach (Ctrl-C goes to a foreground
                // group) and of the job's signals.
                sys::lead_own_group();
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
                    sys::set_disposition(sig, true);
                }
                // Hold nothing of redis-lock's (its output pipes, sockets,
                // the write end).
                sys::close_all_but(keep);
                watch_over(keep);
                sys::exit_now(0)
            }
            Forked::Parent(pid) => {
                drop(read);
                Some(Sentry { write, pid })
            }
        }
    }

    /// The job's group, once spawned, and how long the lock is held: from
    /// now on the sentry kills the group if `redis-lock` dies, or if
    /// `deadline` (CLOCK_BOOTTIME ns) passes before it is moved.
    pub fn arm(&self, group: libc::pid_t, deadline: u64) {
        self.send(ARM, group as u64);
        self.hold_until(deadline);
    }

    /// The lock is held until `deadline` (CLOCK_BOOTTIME ns), or the job
    /// may run until then (an explicit `--grace`).
    pub fn hold_until(&self, deadline: u64) {
        self.send(HOLD_UNTIL, deadline);
    }

    /// A process of the job outside its group ([`Members`]): the sentry
    /// takes a pidfd for it at once and kills it with the group.
    pub fn member(&self, pid: libc::pid_t) {
        self.send(MEMBER, pid as u64);
    }

    /// The job's group was seen empty: the sentry leaves without killing.
    pub fn stand_down(self) {
        self.send(STAND_DOWN, 0);
    }

    fn send(&self, kind: u8, payload: u64) {
        let mut message = [kind; 9];
        message[1..].copy_from_slice(&payload.to_ne_bytes());
        // One write: a pipe write this small arrives whole.
        sys::write(self.write.as_fd(), &message);
    }
}

/// The sentry's loop (in the forked child: async-signal-safe calls only).
/// Kills the group when the pipe closes without a stand-down, or when the
/// deadline passes; every message already sent is read before the deadline
/// is judged (a newer one may be queued), and it wakes at least once a
/// second, since poll's timeout does not count a suspend.
fn watch_over(fd: libc::c_int) {
    let mut group: libc::pid_t = 0;
    let mut deadline = u64::MAX;
    // Pidfds of the members outside the group (a fixed array: no
    // allocation after a fork); one past the last is dropped.
    let mut members = [-1 as libc::c_int; MAX_MEMBERS];
    let mut count = 0;
    let kill_job = |group: libc::pid_t, members: &[libc::c_int]| {
        kill_group(group);
        for &pidfd in members {
            sys::pidfd_signal(pidfd, libc::SIGKILL);
        }
    };
    loop {
        // Drain what is there (poll with no wait), then judge.
        while sys::readable(fd, 0) {
            let Some(message) = read_message(fd) else {
                kill_job(group, &members[..count]); // EOF: redis-lock is gone
                return;
            };
            let mut payload = [0u8; 8];
            payload.copy_from_slice(&message[1..]);
            let payload = u64::from_ne_bytes(payload);
            match message[0] {
                ARM => group = payload as libc::pid_t,
                MEMBER if count < MAX_MEMBERS => {
                    let pidfd = sys::pidfd_open(payload as libc::pid_t);
                    if pidfd >= 0 {
                        members[count] = pidfd;
                        count += 1;
                    }
                }
                HOLD_UNTIL => deadline = payload,
                STAND_DOWN => return,
                _ => {}
            }
        }
        let now = boot_ns();
        if group > 1 && now >= deadline {
            kill_job(group, &members[..count]);
            return;
        }
        let wait_ms = (deadline.saturating_sub(now) / 1_000_000 + 1).min(1000) as libc::c_int;
        // Woken by a message, EOF or the timeout.
        sys::readable(fd, wait_ms);
    }
}

/// How many members outside the group the sentry keeps pidfds for.
const MAX_MEMBERS: usize = 256;

/// One whole message from the sentry's pipe; None at EOF.
fn read_message(fd: libc::c_int) -> Option<[u8; 9]> {
    let mut message = [0u8; 9];
    let mut have = 0;
    while have < message.len() {
        match sys::read(fd, &mut message[have..]) {
            Ok(0) => return None,
            Ok(n) => have += n,
            Err(libc::EINTR) => continue,
            Err(_) => return None,
        }
    }
    Some(message)
}

fn kill_group(group: libc::pid_t) {
    if group > 1 {
        sys::signal_group(group, libc::SIGKILL);
    }
}

/// Sends `sig` to the whole job: the child's process group and every
/// member outside it.
pub fn signal_job(group: libc::pid_t, members: &std::sync::Mutex<Members>, sig: libc::c_int) {
    sys::signal_group(group, sig);
    members
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .signal(sig);
}

/// Stops the job the shell sees, once continued returns. With a terminal:
/// gives it back to `redis-lock`'s own group and stops that whole group as
/// Ctrl-Z would (SIGTSTP): a script, `make` or an outer `redis-lock` that
/// runs this one stops with it, so the shell sees its job stopped and
/// gives its prompt, and an outer `redis-lock` sees a job-control stop of
/// its child and does the same. Without one (no shell waits for the job)
/// only `redis-lock` stops.
pub fn stop_self(terminal: Option<&Terminal>) {
    match terminal {
        Some(t) => {
            t.give_to(sys::own_group());
            sys::stop_group_as_ctrl_z(sys::own_group());
        }
        None => sys::stop_self(),
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
