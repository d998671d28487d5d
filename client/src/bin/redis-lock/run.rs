//! `redis-lock run`: the command run under the lock, its signals, stops
//! and the sentry, until it ends or the lock is lost.

use std::process::ExitCode;
use std::time::Duration;

use redis_lock_client::{later_by, random_token, Keys, LockClient};
use tokio::sync::mpsc;

use crate::{exit, fail, failed_call, job, keys_env, not_acquired, show, Codes, Nodes};

/// How often the job's processes outside its group are looked for.
const MEMBER_SCAN: Duration = Duration::from_millis(200);

/// How long what the command left running gets between SIGTERM and
/// SIGKILL by default (the lock is still held then).
const LEFTOVER_GRACE: Duration = Duration::from_secs(10);

/// Every handled signal, merged into one channel (registered before the
/// lock is asked for, so none can end redis-lock with a grant in flight).
fn handle_signals(kinds: &[libc::c_int]) -> Option<mpsc::UnboundedReceiver<libc::c_int>> {
    handle_signals_and(kinds, &[])
}

/// [`handle_signals`], plus `optional` ones where they can be caught.
fn handle_signals_and(
    kinds: &[libc::c_int],
    optional: &[libc::c_int],
) -> Option<mpsc::UnboundedReceiver<libc::c_int>> {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, rx) = mpsc::unbounded_channel();
    let required = kinds.iter().map(|&sig| (sig, true));
    for (sig, needed) in required.chain(optional.iter().map(|&sig| (sig, false))) {
        let mut stream = match signal(SignalKind::from_raw(sig)) {
            Ok(stream) => stream,
            Err(_) if !needed => continue,
            Err(_) => return None,
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(sig).is_err() {
                    return;
                }
            }
        });
    }
    Some(rx)
}

/// With `value`, the lock is a leadership (`redis-lock elect`): taken with
/// that public value, which the command gets as `REDIS_LOCK_VALUE`.
#[allow(clippy::too_many_arguments)] // one input per flag of `run` and `elect`
pub(crate) async fn run_under_lock(
    locks: &LockClient,
    nodes: &Nodes,
    ttl: Duration,
    wait: Duration,
    grace: Option<Duration>,
    codes: Codes,
    cmd: &[String],
    value: Option<&str>,
) -> ExitCode {
    let Some(mut signals) = handle_signals_and(job::FORWARDED, &job::also_forwarded()) else {
        return fail(exit::CANNOT_RUN, "cannot install signal handlers");
    };
    let key = &nodes.lock_keys();
    let token = random_token();
    let acquisition = nodes.mode(locks.acquire_all(key.as_slice(), ttl));
    let acquisition = match value {
        Some(value) => acquisition.value(value),
        None => acquisition,
    };
    let acquired = tokio::select! {
        result = acquisition.fresh_token(token.as_str()).wait(wait) => Ok(result),
        Some(sig) = signals.recv() => Err(sig),
    };
    let guard = match acquired {
        Ok(Ok(Some(guard))) => guard,
        Ok(Ok(None)) => return not_acquired(key, wait, codes.conflict_exit_code),
        Ok(Err(e @ redis_lock_client::Error::NotReplicated { .. })) => {
            return fail(codes.conflict_exit_code, &format!("not acquired: {e}"))
        }
        Ok(Err(e)) => return failed_call(e),
        Err(sig) => {
            // Interrupted: give back whatever was granted meanwhile.
            let _ = locks.release_token(key.clone(), &token).await;
            return ExitCode::from(128 + sig as u8);
        }
    };
    let terminal = job::Terminal::open();
    let mut command = std::process::Command::new(&cmd[0]);
    command
        .args(&cmd[1..])
        .env("REDIS_LOCK_FENCE", guard.fence().to_string())
        .env("REDIS_LOCK_TOKEN", guard.token())
        .env("REDIS_LOCK_KEY", key.first())
        .env("REDIS_LOCK_KEYS", keys_env(key))
        // This lock's, as `acquire` exports it: never one the caller's
        // environment carried in from another lock.
        .env(
            "REDIS_LOCK_VALIDITY_MS",
            guard
                .valid_until()
                .saturating_duration_since(tokio::time::Instant::now())
                .as_millis()
                .to_string(),
        );
    if let Some(value) = value {
        command.env("REDIS_LOCK_VALUE", value);
    }
    job::prepare(&mut command, terminal.as_ref());
    job::default_sigchld();
    job::become_subreaper();
    // Kills the job's group if redis-lock dies before the job has ended.
    let sentry = job::Sentry::post();
    // Spawned from this thread, the main one, which lives as long as the
    // process: PDEATHSIG follows the thread that forked.
    let group = match command.spawn() {
        Ok(child) => child.id() as libc::pid_t,
        Err(e) => {
            let _ = guard.release().await;
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_RUN
            };
            return fail(code, &format!("cannot run {}: {e}", cmd[0]));
        }
    };
    let mut told_sentry = sentry_deadline(&guard, grace);
    if let Some(sentry) = &sentry {
        sentry.arm(group, told_sentry);
    }
    // Every renewal or extend reaches the sentry as it is made: the guard
    // owns the deadline, the sentry is told each change (no polled copy).
    let mut validity = guard.validity_watch();
    // The job's processes outside its group (daemons, a shell's jobs).
    let members = std::sync::Arc::new(std::sync::Mutex::new(job::Members::new(
        group,
        sentry.as_ref().map_or(0, |s| s.pid),
    )));
    let mut scan = tokio::time::interval(MEMBER_SCAN);
    let mut events = job::watch(group, members.clone());
    let Some(mut stops) = handle_signals(job::STOPS) else {
        job::signal_job(group, &members, libc::SIGKILL);
        let _ = guard.release().await;
        return fail(exit::CANNOT_RUN, "cannot install signal handlers");
    };
    let lost = guard.lost().clone();
    // Set once the lock is lost: the child got SIGTERM (SIGKILL at
    // `kill_at`) or, stopped, SIGKILL at once.
    let mut lock_lost = false;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let mut stopped = false;
    // The command's wait status, once it exited (the job ends when its
    // whole group has).
    let mut status = None;
    // Whether the group was seen empty.
    let mut ended = false;
    loop {
        let kill_timer = async {
            match kill_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            event = events.recv() => match event {
                None => break,
                Some(job::ChildEvent::GroupEmpty) => {
                    ended = true;
                    break;
                }
                Some(job::ChildEvent::Exited(code)) => {
                    status = Some(code);
                    stopped = false;
                    // The job ends with the command: what it left in its
                    // group is stopped as a lost lock stops the job, but
                    // with the lock still held (renewed) until it is gone.
                    if !lock_lost && job::job_alive(group, &members) {
                        let after = grace.unwrap_or(LEFTOVER_GRACE);
                        job::signal_job(group, &members, libc::SIGTERM);
                        job::signal_job(group, &members, libc::SIGCONT);
                        kill_at = Some(later_by(tokio::time::Instant::now(), after));
                        job::say(format_args!(
                            "redis-lock: the command exited; stopping what it left running in its process group (SIGTERM now, SIGKILL in {}); the lock on {key} is held until they have exited",
                            show(after)
                        ));
                    }
                }
                Some(job::ChildEvent::Continued) => stopped = false,
                // A stop already undone (the job was continued since) is
                // not acted on.
                Some(job::ChildEvent::Stopped { pid, signal: sig }) if job::is_stopped(pid) => {
                    stopped = true;
                    // A job-control stop (Ctrl-Z, a read or write of the
                    // terminal from the background) stops the whole job:
                    // redis-lock too, so the shell sees it. A plain SIGSTOP
                    // sent to the child alone does not: whoever sent it
                    // continues the child, and the lock must be renewed
                    // meanwhile.
                    // Only with a terminal: without one, no shell waits
                    // for the job to stop.
                    if !lock_lost
                        && terminal.is_some()
                        && job::STOPS.contains(&sig)
                        && !resume_after_stop(&guard, ttl, grace, group, &members, terminal.as_ref(), sentry.as_ref()).await
                    {
                        return lost_while_stopped(key, guard, group, &members, &mut events, sentry, codes).await;
                    }
                }
                Some(job::ChildEvent::Stopped { .. }) => {}
            },
            Some(sig) = signals.recv() => job::signal_job(group, &members, sig),
            _ = scan.tick() => {
                // New members are told to the sentry, which kills them with
                // the group if redis-lock dies.
                let new = members.lock().unwrap_or_else(|p| p.into_inner()).refresh();
                if let Some(sentry) = &sentry {
                    for pid in new {
                        sentry.member(pid);
                    }
                }
            }
            Some(_) = stops.recv() => {
                // Sent to redis-lock itself: stop the child first, then
                // the job as above.
                job::signal_job(group, &members, libc::SIGSTOP);
                if !lock_lost
                    && !resume_after_stop(&guard, ttl, grace, group, &members, terminal.as_ref(), sentry.as_ref()).await
                {
                    return lost_while_stopped(key, guard, group, &members, &mut events, sentry, codes).await;
                }
            }
            _ = lost.cancelled(), if !lock_lost => {
                lock_lost = true;
                let validity = guard.valid_until();
                // Signalled before anything is printed: a message must
                // never stand between a lost lock and the job hearing it.
                if stopped {
                    // It must not run again without the lock.
                    job::signal_job(group, &members, libc::SIGKILL);
                    kill_at = Some(tokio::time::Instant::now());
                } else {
                    job::signal_job(group, &members, libc::SIGTERM);
                    // By default the grace ends halfway to the end of the
                    // lease's validity (after which another holder may be
                    // granted), leaving room for the kill itself.
                    let now = tokio::time::Instant::now();
                    let at = match grace {
                        Some(g) => later_by(now, g),
                        None => now + validity.saturating_duration_since(now) / 2,
                    };
                    kill_at = Some(kill_at.map_or(at, |earlier| earlier.min(at)));
                    job::say(format_args!(
                        "redis-lock: lost the lock on {key} (a renewal was refused or cannot finish within its validity); stopping the command"
                    ));
                    // Only a grace the user gave can outlast the validity
                    // (by default `at` is `now` once the validity has passed).
                    if grace.is_some() && at > validity {
                        job::say(format_args!(
                            "redis-lock: --grace ends {} ms after the lease's validity: the command may run without the lock until then",
                            (at - validity.max(now)).as_millis()
                        ));
                    }
                }
                if stopped {
                    job::say(format_args!(
                        "redis-lock: lost the lock on {key} while the command was stopped; killing it"
                    ));
                }
            }
            _ = kill_timer => {
                job::signal_job(group, &members, libc::SIGKILL);
                kill_at = None;
            }
            _ = validity.changed(), if sentry.is_some() => {
                let deadline = sentry_deadline(&guard, grace);
                if deadline != told_sentry {
                    if let Some(sentry) = &sentry {
                        sentry.hold_until(deadline);
                    }
                    told_sentry = deadline;
                }
            }
        }
    }
    if let Some(t) = &terminal {
        t.take_back_from(group);
    }
    let sentry_armed = sentry.is_some();
    if ended {
        if let Some(sentry) = sentry {
            sentry.stand_down();
        }
    }
    // Judged when the job has ended, not only by the loss signal: a lease
    // whose validity ran out before (redis-lock stopped or suspended while
    // the job went on) may have been granted to another holder meanwhile;
    // and a command SIGKILLed once the sentry's deadline had passed was
    // killed by it.
    let killed_by_sentry = sentry_armed
        && job::boot_ns() >= told_sentry
        && status
            .flatten()
            .is_some_and(|s| libc::WIFSIGNALED(s) && libc::WTERMSIG(s) == libc::SIGKILL);
    if lock_lost || !guard.is_valid() || killed_by_sentry {
        if !lock_lost {
            job::say(format_args!(
                "redis-lock: the lock on {key} ran out before the command ended (redis-lock was stopped or suspended?): it may have run without the lock"
            ));
        }
        let _ = guard.release().await;
        return ExitCode::from(codes.lost_exit_code);
    }
    let _ = guard.release().await;
    match status {
        Some(Some(status)) => ExitCode::from(job::exit_code(status)),
        _ => fail(exit::CANNOT_RUN, "lost track of the command"),
    }
}

/// The moment (CLOCK_BOOTTIME ns) after which the sentry kills the job if
/// redis-lock has not moved it: the end of the lease's validity, or, with
/// an explicit `--grace`, that much (and a second) later: the user's choice
/// to let the job run past it, whoever kills it.
fn sentry_deadline(guard: &redis_lock_client::LockGuard, grace: Option<Duration>) -> u64 {
    let mut until = guard.valid_until_boot();
    if let Some(g) = grace {
        until = until.saturating_add(g.saturating_add(Duration::from_secs(1)));
    }
    job::nanos(until)
}

/// The job was stopped: stop redis-lock too (the shell sees the job
/// stopped), and once continued, renew the lock before the child may run
/// again. True if the lock is still held and the child was continued (and
/// given the terminal if redis-lock has it now). The sentry is told the
/// current deadline before the stop and after the renewal: the main
/// loop, which forwards every renewal, does not run while redis-lock is
/// stopped or waits here, and a stopped job past a stale deadline would be
/// killed while the lock is still held.
async fn resume_after_stop(
    guard: &redis_lock_client::LockGuard,
    ttl: Duration,
    grace: Option<Duration>,
    group: libc::pid_t,
    members: &std::sync::Mutex<job::Members>,
    terminal: Option<&job::Terminal>,
    sentry: Option<&job::Sentry>,
) -> bool {
    let deadline = sentry_deadline(guard, grace);
    if let Some(sentry) = sentry {
        sentry.hold_until(deadline);
    }
    job::stop_self(terminal);
    // Continued (fg or bg). The lease may have run out meanwhile; past the
    // sentry's deadline the job is killed (or being killed) by it.
    let killed_by_sentry = sentry.is_some() && job::boot_ns() >= deadline;
    let held = !killed_by_sentry
        && !guard.lost().is_cancelled()
        && matches!(guard.extend(ttl).await, Ok(true));
    if !held {
        return false;
    }
    if let Some(sentry) = sentry {
        sentry.hold_until(sentry_deadline(guard, grace));
    }
    if let Some(t) = terminal.filter(|t| t.ours()) {
        t.give_to(group);
    }
    job::signal_job(group, members, libc::SIGCONT);
    true
}

/// The lock was lost while the job was stopped: the child is killed without
/// running again.
async fn lost_while_stopped(
    key: &Keys,
    guard: redis_lock_client::LockGuard,
    group: libc::pid_t,
    members: &std::sync::Mutex<job::Members>,
    events: &mut mpsc::UnboundedReceiver<job::ChildEvent>,
    sentry: Option<job::Sentry>,
    codes: Codes,
) -> ExitCode {
    job::signal_job(group, members, libc::SIGKILL);
    job::say(format_args!(
        "redis-lock: the lock on {key} was lost while the command was stopped; killing it"
    ));
    while let Some(event) = events.recv().await {
        if matches!(event, job::ChildEvent::GroupEmpty) {
            if let Some(sentry) = sentry {
                sentry.stand_down();
            }
            break;
        }
    }
    let _ = guard.release().await;
    ExitCode::from(codes.lost_exit_code)
}
