//! The hand-off timer (the sweep has its own), armed for the node's next
//! wake-up, and the inbox of inputs from callbacks that cannot enter the
//! engine or write (unlink2, undelivered grants); flush and SWAPDB reach
//! the node directly ([`flushed`], [`swapped`]). A timer run feeds
//! the inbox to the node, asks it what is due ([`Node::timer`]) and
//! executes that: take-backs, then hand-offs key by key, each with the
//! server's conditions and whether the key is still served here.
//!
//! [`Node::timer`]: crate::core::node::Node::timer

use std::collections::HashSet;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicI64, AtomicPtr, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use redis_module::raw;

use super::engine::{self, Key, WaiterAcl};
use super::ffi::{
    self, cluster_nodes, guard, in_cluster, key_exists, lock_events, notify_lock_event, Ctx,
    RString,
};
use super::keyspace::LockKey;
use super::node::{self, count, STATS};
use crate::core::cluster;
use crate::core::node::Served;

/// Inputs for the next timer run.
#[derive(Default)]
pub struct Inbox {
    /// Keys whose lock may have changed (DEL, UNLINK, overwrite, flush, ...).
    pub changed: Vec<Key>,
    /// Grants whose reply never reached their client: (key, fence, lease).
    pub undelivered: Vec<(Key, i64, u64)>,
}

static INBOX: Mutex<Inbox> = Mutex::new(Inbox {
    changed: Vec::new(),
    undelivered: Vec::new(),
});

/// The one armed timer: (when, id).
static TIMER: Mutex<Option<(i64, u64)>> = Mutex::new(None);

/// A context for creating timers from callbacks that have none (unlink2).
static TIMER_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

fn locked<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Called once at load: a detached context to create timers with.
pub fn init(ctx: Ctx) -> Result<(), &'static str> {
    let detached = ffi::detached_context(ctx)
        .ok_or("RedisModule_GetDetachedThreadSafeContext is not available")?;
    TIMER_CTX.store(detached, Relaxed);
    Ok(())
}

/// Puts an input in the inbox and has the timer run at once.
pub fn queue(f: impl FnOnce(&mut Inbox)) {
    f(&mut locked(&INBOX));
    arm_at(node::mono_ms());
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
    let now = node::now();
    let (mono_ms, offset_ms) = (now.mono_ms(), now.wall_ms() - now.mono_ms());
    let overdue = due.saturating_add(LATE_MS) < mono_ms;
    let stepped = (offset_ms - ARMED_OFFSET_MS.load(Relaxed)).abs() > STEP_MS;
    if !overdue && !stepped {
        return;
    }
    let Some((at, id)) = disarm(&mut locked(&TIMER)) else {
        return;
    };
    ffi::stop_timer(TIMER_CTX.load(Relaxed), id);
    arm_at(at);
}

/// Arms the timer for the node's next wake-up.
pub fn rearm() {
    arm_for(engine::with_engine(|n| n.next_wakeup()));
}

/// Arms the timer for `next_wakeup` (the node's, just read), if any.
pub fn arm_for(next_wakeup: Option<i64>) {
    if let Some(at) = next_wakeup {
        arm_at(at);
    }
}

/// Has the timer run at once (after a decision was cut short).
pub fn arm_soon() {
    arm_at(node::mono_ms());
}

/// Makes sure the timer runs at `at_ms` (monotonic) or earlier.
fn arm_at(at_ms: i64) {
    let ctx = TIMER_CTX.load(Relaxed);
    if ctx.is_null() {
        return;
    }
    let mut timer = locked(&TIMER);
    if let Some((armed_at, id)) = *timer {
        if armed_at <= at_ms {
            return;
        }
        ffi::stop_timer(ctx, id);
    }
    // Round up so the timer never runs before `at_ms` has passed. at_ms is
    // bounded (limits::MAX_DEADLINE_MS), so this cannot overflow.
    let now = node::now();
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

extern "C" fn on_timer(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("the hand-off timer", (), || {
        disarm(&mut locked(&TIMER));
        let now = node::now();
        let now_ms = now.mono_ms();
        let inbox = std::mem::take(&mut *locked(&INBOX));
        let cond = engine::background_conditions(ctx);
        let changed: HashSet<&Key> = inbox.changed.iter().collect();
        let (work, acts_alone) = engine::with_engine(|n| {
            if !changed.is_empty() {
                n.keys_changed(|k| changed.contains(k), now_ms);
            }
            for (key, fence, lease) in inbox.undelivered {
                n.undelivered(key, fence, lease, now_ms);
            }
            (n.timer(cond, now), n.acts_alone(cond))
        });
        // Timeouts write nothing: they go out even while writes must wait.
        engine::deliver_wakes(ctx, None);
        if !acts_alone {
            return rearm();
        }
        for (key, fence, lease) in &work.take_backs {
            run_in_db(ctx, key, |name| {
                let Ok(mut store) = LockKey::open(ctx, name, true) else {
                    return;
                };
                if engine::with_engine(|n| n.take_back(&mut store, *fence, *lease, now_ms)) {
                    count(&STATS.take_backs);
                    drop(store);
                    notify_lock_event(ctx, lock_events::RELEASE, name);
                }
            });
        }
        let mut cluster = ClusterView::new(ctx);
        for key in &work.settle {
            run_in_db(ctx, key, |name| {
                let served = cluster.served(ctx, name, key);
                let mut store = LockKey::open(ctx, name, true);
                let store = store.as_mut().map_err(|e| e.clone());
                let mut acl = WaiterAcl { ctx, name };
                engine::with_engine(|n| n.settle(key, store, served, cond, &mut acl, now));
                engine::deliver_wakes(ctx, Some(name));
            });
        }
        rearm();
    })
}

/// This node's view of the cluster, read at most once per timer run and
/// only when a waited-on key is missing (in cluster mode).
struct ClusterView {
    enabled: bool,
    nodes: Option<Option<String>>,
}

impl ClusterView {
    fn new(ctx: Ctx) -> Self {
        ClusterView {
            enabled: in_cluster(ctx),
            nodes: None,
        }
    }

    /// Whether `name` is still served here. A missing key whose slot is
    /// migrating away or served elsewhere (resharding's MIGRATE deleted it)
    /// left this node; a missing key in a slot served here is a free lock.
    fn served(&mut self, ctx: Ctx, name: RString, key: &Key) -> Served {
        if !self.enabled || key_exists(ctx, name) {
            return Served::Here;
        }
        let Some(nodes) = self
            .nodes
            .get_or_insert_with(|| cluster_nodes(ctx))
            .as_deref()
        else {
            return Served::Here;
        };
        match cluster::route(nodes, cluster::key_slot(&key.1)).redirect() {
            Some(redirect) => Served::Elsewhere(redirect),
            None => Served::Here,
        }
    }
}

/// Runs `f` with `key`'s name as a Redis string, in `key`'s db.
fn run_in_db(ctx: Ctx, key: &Key, f: impl FnOnce(RString)) {
    if !ffi::select_db(ctx, key.0) {
        return; // the db no longer exists (CONFIG SET databases)
    }
    let name = ffi::create_string(ctx, &key.1);
    f(name);
    ffi::free_string(ctx, name);
}

/// Every waited-on key of db `db` (-1: all) may have changed (FLUSHDB,
/// FLUSHALL).
pub fn flushed(db: i32) {
    if engine::waiters_total() == 0 {
        return;
    }
    let now_ms = node::mono_ms();
    engine::with_engine(|n| n.keys_changed(|k| db < 0 || k.0 == db, now_ms));
    rearm();
}

/// SWAPDB a b: lines move with their databases, and every key in both is
/// looked at again (its lock may differ now).
pub fn swapped(a: i32, b: i32) {
    if engine::waiters_total() == 0 {
        return;
    }
    let now_ms = node::mono_ms();
    let swap = |(db, name): &Key| {
        let db = match *db {
            d if d == a => b,
            d if d == b => a,
            d => d,
        };
        (db, name.clone())
    };
    engine::with_engine(|n| n.rename_keys(swap, |k| k.0 == a || k.0 == b, now_ms));
    rearm();
}
