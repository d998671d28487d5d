//! Every system call of `redis-lock run` (and the terminal mode and size of
//! `redis-lock top`, at the end), each a thin wrapper: plain
//! integers, or pointers to the caller's locals, in and out. None
//! allocates, takes a lock or touches stdio, so each is async-signal-safe
//! (POSIX.1-2017 2.4.3, or a Linux syscall with no user-space state) and may
//! run where only such calls may: in the command's process between fork and
//! exec ([`pre_exec`]) and in the forked sentry ([`fork`]). The only
//! `unsafe` code of the binary, with the two calls whose safety depends on
//! what the caller does next ([`fork`], [`pre_exec`]) left `unsafe fn`.
//!
//! File descriptors are `OwnedFd`/`BorrowedFd` where the caller holds
//! them, and a raw `RawFd` only where the call runs in a child that
//! inherited it (a wrong raw fd is an `EBADF`, never memory unsafety).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

pub use libc::{c_int, pid_t};

/// The last error of a call on this thread.
fn errno() -> Option<c_int> {
    io::Error::last_os_error().raw_os_error()
}

/// The controlling terminal (`/dev/tty`), if there is one.
pub fn open_tty() -> Option<OwnedFd> {
    // SAFETY: a NUL-terminated path; the returned fd is owned below.
    let fd = unsafe {
        libc::open(
            c"/dev/tty".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    // SAFETY: a fresh fd nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The terminal's foreground process group.
pub fn foreground_group(tty: BorrowedFd<'_>) -> pid_t {
    // SAFETY: an integer fd the caller holds open.
    unsafe { libc::tcgetpgrp(tty.as_raw_fd()) }
}

/// Gives the terminal `tty` to `group` (tcsetpgrp), with SIGTTOU blocked
/// meanwhile, as a shell does: the caller may be in the background.
pub fn give_terminal(tty: RawFd, group: pid_t) {
    with_sigttou_blocked(|| {
        // SAFETY: integers; a bad fd or group is an error return.
        unsafe { libc::tcsetpgrp(tty, group) };
    });
}

/// Runs `f` with SIGTTOU blocked on this thread: a process outside the
/// terminal's foreground group may then change or write to it (with `stty
/// tostop` a write from the background otherwise raises SIGTTOU, and with
/// redis-lock's handler installed the write is restarted, raising it again,
/// for ever). Async-signal-safe if `f` is.
pub fn with_sigttou_blocked(f: impl FnOnce()) {
    // SAFETY: sigsets on the stack, initialized by sigemptyset before use;
    // the old mask is put back as it was.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

/// This process's group.
pub fn own_group() -> pid_t {
    // SAFETY: no arguments.
    unsafe { libc::getpgrp() }
}

pub fn own_pid() -> pid_t {
    // SAFETY: no arguments.
    unsafe { libc::getpid() }
}

pub fn parent_pid() -> pid_t {
    // SAFETY: no arguments.
    unsafe { libc::getppid() }
}

/// `pid`'s process group (-1 if it is gone).
pub fn group_of(pid: pid_t) -> pid_t {
    // SAFETY: an integer; a reaped pid is an error return.
    unsafe { libc::getpgid(pid) }
}

/// Puts this process in a group of its own.
pub fn lead_own_group() {
    // SAFETY: integers.
    unsafe { libc::setpgid(0, 0) };
}

/// Sets `sig`'s disposition to its default (`SIG_DFL`) or to ignored.
pub fn set_disposition(sig: c_int, ignore: bool) {
    let how = if ignore { libc::SIG_IGN } else { libc::SIG_DFL };
    // SAFETY: a valid disposition constant, no handler function.
    unsafe { libc::signal(sig, how) };
}

/// This process is sent SIGKILL when its parent ends (`PR_SET_PDEATHSIG`).
pub fn die_with_parent() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    match unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Makes this process the reaper of its orphaned descendants.
pub fn become_subreaper() {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) };
}

/// Whether any process is left in `group` (one that cannot be signalled
/// for want of permission still counts).
pub fn group_alive(group: pid_t) -> bool {
    // SAFETY: integers; signal 0 only checks.
    let r = unsafe { libc::kill(-group, 0) };
    r == 0 || errno() == Some(libc::EPERM)
}

/// Sends `sig` to process `pid`: false if it may not be signalled (EPERM:
/// another user's); a gone process (ESRCH) counts as signalled.
pub fn signal_pid(pid: pid_t, sig: c_int) -> bool {
    // SAFETY: integers.
    let r = unsafe { libc::kill(pid, sig) };
    r == 0 || errno() != Some(libc::EPERM)
}

/// A pidfd for `pid` (Linux 5.3+): a handle that keeps naming that process
/// even after its pid is reused; -1 if it cannot be had (async-signal-safe).
pub fn pidfd_open(pid: pid_t) -> c_int {
    // SAFETY: integers; a bad pid is an error return.
    unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) as c_int }
}

/// Sends `sig` to the process `pidfd` names, if it still runs
/// (async-signal-safe).
pub fn pidfd_signal(pidfd: c_int, sig: c_int) {
    // SAFETY: integers and a null siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd,
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
}

/// Sends `sig` to process group `group` (a gone group is ESRCH, ignored).
pub fn signal_group(group: pid_t, sig: c_int) {
    // SAFETY: integers.
    unsafe { libc::killpg(group, sig) };
}

/// Stops `group` (this process's own) as Ctrl-Z does: SIGTSTP to the
/// whole group, with its default action (stop) in force here meanwhile, so
/// this process stops with the others and whoever waits for it (a shell,
/// an outer redis-lock) sees a job-control stop (WSTOPSIG is SIGTSTP, not
/// SIGSTOP). Returns once continued, with the handler in force before put
/// back. Called on the main thread, the one the kernel hands a
/// process-directed signal it does not block, so the stop takes effect
/// before `killpg` returns. In an orphaned group the kernel discards the
/// signal (no shell could continue the job) and this returns at once.
pub fn stop_group_as_ctrl_z(group: pid_t) {
    // SAFETY: sigaction structs on the stack, zeroed then filled in; the
    // old action is put back as it was.
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut default.sa_mask);
        let mut before: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGTSTP, &default, &mut before) != 0 {
            libc::raise(libc::SIGSTOP);
            return;
        }
        libc::killpg(group, libc::SIGTSTP);
        libc::sigaction(libc::SIGTSTP, &before, std::ptr::null_mut());
    }
}

/// Stops this process until SIGCONT.
pub fn stop_self() {
    // SAFETY: an integer signal.
    unsafe { libc::raise(libc::SIGSTOP) };
}

/// What `waitpid` said: a pid and its wait status, or nothing (`Err` with
/// the errno: EINTR, ECHILD).
pub fn wait_any(flags: c_int) -> Result<Option<(pid_t, c_int)>, c_int> {
    let mut status: c_int = 0;
    // SAFETY: a pointer to a local.
    match unsafe { libc::waitpid(-1, &mut status, flags) } {
        0 => Ok(None),
        r if r > 0 => Ok(Some((r, status))),
        _ => Err(errno().unwrap_or(0)),
    }
}

/// A pipe, both ends close-on-exec: (read, write).
pub fn pipe() -> Option<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: a valid array of two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: both fds are fresh and owned from here.
    Some(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Which side of a [`fork`] this is.
pub enum Forked {
    /// The parent, with the child's pid.
    Parent(pid_t),
    Child,
}

/// fork(2).
///
/// # Safety
/// `redis-lock` has threads (tokio's): after a fork only the calling
/// thread exists in the child, and any lock another thread held (the
/// allocator's, stdio's, tokio's) stays held for ever. So on
/// [`Forked::Child`] the caller must make only async-signal-safe calls
/// (this module's, which allocate nothing) and end with [`exit_now`],
/// never returning into code that may allocate or lock. POSIX makes the
/// same demand of a multithreaded process's child before exec.
pub unsafe fn fork() -> Option<Forked> {
    // SAFETY: the caller keeps the contract above.
    match unsafe { libc::fork() } {
        -1 => None,
        0 => Some(Forked::Child),
        pid => Some(Forked::Parent(pid)),
    }
}

/// Has `f` run in the command's process between fork and exec.
///
/// # Safety
/// As [`fork`]: `f` may make only async-signal-safe calls (this module's)
/// and must not allocate; std runs it in the child of its own fork.
pub unsafe fn pre_exec(
    command: &mut std::process::Command,
    f: impl FnMut() -> io::Result<()> + Send + Sync + 'static,
) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the caller keeps the contract above.
    unsafe { command.pre_exec(f) };
}

/// Closes every fd below 1024 except `keep` (the forked sentry lets go of
/// everything `redis-lock` had open).
pub fn close_all_but(keep: RawFd) {
    for fd in 0..1024 {
        if fd != keep {
            // SAFETY: integers; closing an unused number is EBADF. The
            // caller is the forked child, where nothing else uses them.
            unsafe { libc::close(fd) };
        }
    }
}

/// Waits up to `timeout_ms` (0: not at all) for `fd` to be readable or
/// closed. True if it is.
pub fn readable(fd: RawFd, timeout_ms: c_int) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack.
    unsafe { libc::poll(&mut pfd, 1, timeout_ms) > 0 }
}

/// read(2) into `buf`: the count read, 0 at EOF, or the errno.
pub fn read(fd: RawFd, buf: &mut [u8]) -> Result<usize, c_int> {
    // SAFETY: writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    usize::try_from(n).map_err(|_| errno().unwrap_or(0))
}

/// write(2) of `buf` to an fd the caller holds (a pipe write of at most
/// PIPE_BUF bytes is atomic).
pub fn write(fd: BorrowedFd<'_>, buf: &[u8]) {
    // SAFETY: reads `buf.len()` bytes of `buf`.
    unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
}

/// Ends this process at once (_exit: no destructors, no stdio flush).
pub fn exit_now(code: c_int) -> ! {
    // SAFETY: an integer; _exit does not return.
    unsafe { libc::_exit(code) }
}

// ---- the terminal, for `redis-lock top` ----

/// A terminal's settings as `tcgetattr` read them, to put back.
pub struct TermMode(libc::termios);

/// Puts the terminal at `fd` in raw input mode (no line editing, no echo,
/// no signals from keys: `top` reads each key, Ctrl-C among them), and
/// gives back its previous settings; None if `fd` is no terminal.
pub fn raw_mode(fd: BorrowedFd<'_>) -> Option<TermMode> {
    // SAFETY: termios is plain integers: all zeros is a valid value, and
    // tcgetattr fills it.
    let mut old: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: an fd the caller holds open and a local to fill.
    if unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut old) } != 0 {
        return None;
    }
    let mut raw = old;
    raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG | libc::IEXTEN);
    raw.c_iflag &= !(libc::IXON | libc::ICRNL);
    raw.c_cc[libc::VMIN] = 1;
    raw.c_cc[libc::VTIME] = 0;
    // SAFETY: as above, with a local it reads.
    if unsafe { libc::tcsetattr(fd.as_raw_fd(), libc::TCSANOW, &raw) } != 0 {
        return None;
    }
    Some(TermMode(old))
}

/// Puts back settings [`raw_mode`] read.
pub fn restore_mode(fd: BorrowedFd<'_>, mode: &TermMode) {
    // SAFETY: an fd the caller holds open and settings it read before.
    unsafe { libc::tcsetattr(fd.as_raw_fd(), libc::TCSANOW, &mode.0) };
}

/// The terminal's size at `fd` as (columns, rows); None if it is none.
pub fn window_size(fd: BorrowedFd<'_>) -> Option<(u16, u16)> {
    // SAFETY: winsize is plain integers: all zeros is a valid value.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills the local winsize.
    let ok = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut size) } == 0;
    (ok && size.ws_col > 0 && size.ws_row > 0).then_some((size.ws_col, size.ws_row))
}
