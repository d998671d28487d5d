//! The hand-off timer (the sweep has its own): one module timer, armed for
//! the node's next wake-up and kept on time across wall-clock steps, and
//! the inbox of inputs from callbacks that cannot enter the engine or write
//! (unlink2, undelivered grants). What a run does is `timer_run::run`, given
//! at load ([`init`]); this module knows nothing of the node, so the engine
//! and every caller above it can arm it.

use std::os::raw::c_void;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::ffi::{self, guard, Ctx, DetachedSlot};
use super::server::{self, Client, Key};
use crate::core::output::Output;

/// Inputs for the next timer run.
#[derive(Default)]
pub struct Inbox {
    /// Keys whose lock may have changed (DEL, UNLINK, overwrite, flush, ...).
    pub changed: Vec<Key>,
    /// Grants whose reply never reached their client: (key, fence, lease).
    pub undelivered: Vec<(Key, i64, u64)>,
    /// What a decision cut short by a panic had queued (see
    /// `engine::with_engine`): carried out first.
    pub outputs: Vec<Output<Key, Client>>,
}

static INBOX: Mutex<Inbox> = Mutex::new(Inbox {
    changed: Vec::new(),
    undelivered: Vec::new(),
    outputs: Vec::new(),
});

/// The one armed timer: (when, id).
static TIMER: Mutex<Option<(i64, u64)>> = Mutex::new(None);

/// A context for creating timers from callbacks that have none (unlink2).
static TIMER_CTX: DetachedSlot = DetachedSlot::new();

fn locked<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What a timer run does (`timer_run::run`), set once at load.
static RUN: OnceLock<fn(Ctx, Inbox)> = OnceLock::new();

/// Called once at load: a detached context to create timers with, and
/// what a run does.
pub fn init(ctx: Ctx, run: fn(Ctx, Inbox)) -> Result<(), &'static str> {
    let detached = ffi::detached_context(ctx)
        .ok_or("RedisModule_GetDetachedThreadSafeContext is not available")?;
    TIMER_CTX.set(detached);
    let _ = RUN.set(run);
    Ok(())
}

/// Puts an input in the inbox and has the timer run at once.
pub fn queue(f: impl FnOnce(&mut Inbox)) {
    f(&mut locked(&INBOX));
    arm_at(server::mono_ms());
}

/// How late (monotonic ms) the timer may be before `heal` re-arms it: the
/// armed time is rounded to the ms, and Redis's own time event may run a
/// little after it.
const LATE_MS: i64 = 1;

/// When the armed timer is due (monotonic ms; i64::MAX: none armed), for
/// the check before every sleep of the event loop, which must not take a
/// lock: [`TIMER`] is its owner, and this is written only with it held.
static DUE_MS: AtomicI64 = AtomicI64::new(i64::MAX);

/// The wall clock minus the monotonic one (ms) when the timer was armed:
/// Redis keeps the timer at a wall-clock instant, so a step since makes it
/// fire that much early or late.
static ARMED_OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// How far the clocks may move apart (slewing, rounding) before the armed
/// timer is taken to be in another frame.
const STEP_MS: i64 = 2;

/// Before the event loop sleeps (every iteration) and at every server
/// cron: module timers fire by the server's *wall* clock (RM_CreateTimer
/// adds its period to it), while Redis's time event that runs them is on
/// the monotonic clock. After the wall clock stepped back, that event runs
/// on time but finds our timer not yet due, and sleeps again for the length
/// of the step: BLOCK timeouts and hand-offs would be that late (issue 22:
/// 50 to 156 ms with the re-arm in cron only). The loop's next
/// before-sleep sees the timer overdue on the monotonic clock and replaces
/// it with one that fires now.
///
/// That event may not come in time, though: Redis schedules it for the
/// earliest of the module timers (the sweep's among them) as the wall clock
/// read when it was last scheduled. So the armed timer is also re-armed, at
/// the same monotonic instant, as soon as the wall clock is seen to have
/// stepped since it was armed: the new one is then the earliest in the new
/// frame, and Redis's event is scheduled for it. Seen at the first
/// iteration of the event loop after the step (a command, a reply, the
/// cron), not when the step happens.
pub fn heal() {
    let due = DUE_MS.load(Relaxed);
    if due == i64::MAX {
        return;
    }
    let now = server::now();
    let (mono_ms, offset_ms) = (now.mono_ms(), now.wall_ms() - now.mono_ms());
    let overdue = due.saturating_add(LATE_MS) < mono_ms;
    let stepped = (offset_ms - ARMED_OFFSET_MS.load(Relaxed)).abs() > STEP_MS;
    if !overdue && !stepped {
        return;
    }
    let Some((at, id)) = disarm(&mut locked(&TIMER)) else {
        return;
    };
    if let Some(ctx) = TIMER_CTX.get() {
        ffi::stop_timer(ctx, id);
    }
    arm_at(at);
}

/// Arms the timer for `next_wakeup` (the node's, just read), if any.
#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub fn arm_for(next_wakeup: Option<i64>) {
    if let Some(at) = next_wakeup {
        arm_at(at);
    }
}

/// Makes sure the timer runs at `at_ms` (monotonic) or earlier.
#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub fn arm_at(at_ms: i64) {
    // Armed for then or earlier already (the common case: every command
    // asks, and the node's leases are filed by their end): no lock taken.
    if DUE_MS.load(Relaxed) <= at_ms {
        return;
    }
    let Some(ctx) = TIMER_CTX.get() else {
        return;
    };
    let mut timer = locked(&TIMER);
    if let Some((armed_at, id)) = *timer {
        if armed_at <= at_ms {
            return;
        }
        ffi::stop_timer(ctx, id);
    }
    // Round up so the timer never runs before `at_ms` has passed. at_ms is
    // bounded (limits::MAX_DEADLINE_MS), so this cannot overflow.
    let now = server::now();
    let period_ms = ((at_ms.saturating_mul(1000) - now.mono_us).max(0) + 999) / 1000;
    let id = ffi::create_timer(ctx, period_ms, on_timer);
    *timer = Some((at_ms, id));
    DUE_MS.store(at_ms, Relaxed);
    ARMED_OFFSET_MS.store(now.wall_ms() - now.mono_ms(), Relaxed);
}

/// Forgets the armed timer (it fired, or is being replaced).
fn disarm(timer: &mut Option<(i64, u64)>) -> Option<(i64, u64)> {
    DUE_MS.store(i64::MAX, Relaxed);
    timer.take()
}

extern "C" fn on_timer(ctx: Ctx, _data: *mut c_void) {
    guard("the hand-off timer", (), || {
        disarm(&mut locked(&TIMER));
        let inbox = std::mem::take(&mut *locked(&INBOX));
        if let Some(run) = RUN.get() {
            run(ctx, inbox);
        }
    })
}
