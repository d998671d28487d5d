//! The server's one [`Node`] (`core::node`), which makes every lock
//! decision, and what the glue hands it and does with its answers:
//! * access ([`with_engine`]); the node is the one record of who waits and
//!   what is to be answered: nothing here keeps a copy of either;
//! * the `lock.*` options, whose values live in the node's [`Limits`];
//! * the server's [`Conditions`] at the moment of a call;
//! * arming the hand-off timer for the node's next wake-up ([`rearm_timer`]).
//!
//! Carrying out what the node decided is `outputs`'.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{LazyLock, Mutex, TryLockError};

use redis_module::configuration::{ConfigurationContext, ConfigurationValue};
use redis_module::{raw, RedisError};

use super::ffi::{self, context_flags, selected_db, Ctx};
use super::server::{self, SERVER};
use super::timer;
use crate::core::error::LockError;
use crate::core::node::{Conditions, Limits, Node};

pub use super::server::{Client, Key};

/// The node as the module runs it: keys by database and name, clients by
/// id.
pub type ModuleNode = Node<Key, Client>;

static ENGINE: LazyLock<Mutex<Node<Key, Client>>> = LazyLock::new(Default::default);

/// Runs `f` on the node. Everything runs on Redis's main thread, so the
/// lock is never contended; a re-entrant call (a Redis callback reaching
/// the engine while it is in use) is a bug, and panics (caught at the entry
/// point) instead of deadlocking the server. A panic inside `f` (caught at
/// the command's or callback's boundary, so the server lives on) may cut a
/// decision short: the node then looks at every line again at once
/// (`Node::recover_from_panic`), so no waiter is left on a lock that came
/// free.
pub fn with_engine<R>(f: impl FnOnce(&mut Node<Key, Client>) -> R) -> R {
    let mut node = match ENGINE.try_lock() {
        Ok(node) => node,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => panic!("the lock engine was entered twice"),
    };
    let recovery = Recovery(&mut node);
    let result = f(&mut *recovery.0);
    std::mem::forget(recovery);
    result
}

/// Runs the node's recovery if a decision unwinds.
struct Recovery<'a>(&'a mut Node<Key, Client>);

impl Drop for Recovery<'_> {
    fn drop(&mut self) {
        // Only reached while unwinding (forgotten otherwise). What the
        // decision queued before it was cut short (a waiter already handed
        // the lock, a key already changed) is carried out by the timer,
        // which runs at once: nothing the node did goes unreported.
        let node = &mut *self.0;
        node.recover_from_panic(server::mono_ms());
        let left: Vec<_> = std::iter::from_fn(|| node.poll_output()).collect();
        timer::queue(|inbox| inbox.outputs.extend(left));
    }
}

/// Arms the hand-off timer for the node's next wake-up (not from inside
/// the node).
pub fn rearm_timer() {
    timer::arm_for(with_engine(|n| n.next_wakeup()));
}

/// The number of waiters on the node (not from inside it).
pub fn waiters_total() -> usize {
    with_engine(|n| n.total_waiters())
}

/// How many clients observe a key now (INFO lock).
pub fn observers_total() -> usize {
    with_engine(|n| n.total_observers())
}

/// Whether any client waits in a line or observes a key (not from inside
/// the node): a change under many keys at once must then be looked at.
pub fn has_blocked_clients() -> bool {
    with_engine(|n| n.has_blocked_clients())
}

/// Whether anyone may be waiting or observing, from a callback that can
/// run inside the engine (unlink2 runs when a grant replaces a value): the
/// node's count when it is free, and "maybe" while it is busy.
pub fn may_have_waiters() -> bool {
    match ENGINE.try_lock() {
        Ok(node) => node.has_blocked_clients(),
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner().has_blocked_clients(),
        Err(TryLockError::WouldBlock) => true,
    }
}

pub fn key_of(ctx: Ctx, name: &[u8]) -> Key {
    (selected_db(ctx), name.into())
}

pub fn limits() -> Limits {
    with_engine(|n| n.limits())
}

/// The server's state as the node needs it, for every decision (commands,
/// the timer, the sweep), composed here only: the role as the server last
/// announced it (`server::SERVER`, its one record), and the memory flags.
/// `may_block`: the command asked to BLOCK, and the calling client may
/// block here.
pub fn conditions(ctx: Ctx, may_block: bool) -> Conditions {
    let mut cond = Conditions::empty();
    cond.set(Conditions::REPLICA, SERVER.replica.load(Relaxed));
    cond.set(Conditions::MAY_BLOCK, may_block);
    cond.set(Conditions::EVICTABLE, SERVER.evictable.load(Relaxed));
    if SERVER.maxmemory.load(Relaxed) {
        cond.set(
            Conditions::OOM,
            context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_OOM != 0,
        );
    }
    cond
}

/// The server's state for what the node does on its own (the timer, the
/// sweep): [`conditions`], and whether writes are held back (CLIENT PAUSE
/// WRITE, FAILOVER).
pub fn background_conditions(ctx: Ctx) -> Conditions {
    let mut cond = conditions(ctx, false);
    cond.set(Conditions::WRITES_PAUSED, ffi::writes_paused(ctx));
    cond
}

/// The node (re)started with its data loaded, or was promoted: the fence
/// mark rises to the clock and past what a predecessor may have granted
/// unseen, and the restart delay starts.
pub fn start_serving() {
    let now = server::now();
    let next_wakeup = with_engine(|n| {
        n.start_serving(now);
        n.next_wakeup()
    });
    // What it loaded or was sent as a replica is filed by its lease's end:
    // the timer reclaims it from now.
    timer::arm_for(next_wakeup);
}

/// Arms the timer for what the node asks next (after locks entered it
/// without a decision: an RDB, a `RESTORE`).
pub fn arm_timer() {
    timer::arm_for(with_engine(|n| n.next_wakeup()));
}

pub fn fence_hwm() -> i64 {
    with_engine(|n| n.fence_hwm())
}

/// A token issued elsewhere (master, AOF, RDB, RESTORE) was applied here.
pub fn observe_fence(fence: i64) -> Result<(), LockError> {
    let wall_us = server::wall_us();
    with_engine(|n| n.observe_fence(fence, wall_us))
}

// ---- the options: stored in the node's limits, nowhere else ----

/// A numeric `lock.*` option: one field of the node's [`Limits`].
pub struct NumericOption {
    get: fn(&Limits) -> i64,
    set: fn(&mut Limits, i64),
}

/// A boolean `lock.*` option.
pub struct BoolOption {
    get: fn(&Limits) -> bool,
    set: fn(&mut Limits, bool),
}

fn update_limits(change: impl FnOnce(&mut Limits)) {
    let now_ms = server::mono_ms();
    with_engine(|n| {
        let mut limits = n.limits();
        change(&mut limits);
        n.set_limits(limits, now_ms);
    });
    // Every line is looked at again under the new limits.
    rearm_timer();
}

impl ConfigurationValue<i64> for NumericOption {
    fn get(&self, _: &ConfigurationContext) -> i64 {
        (self.get)(&limits())
    }

    fn set(&self, _: &ConfigurationContext, value: i64) -> Result<(), RedisError> {
        update_limits(|l| (self.set)(l, value));
        Ok(())
    }
}

impl ConfigurationValue<bool> for BoolOption {
    fn get(&self, _: &ConfigurationContext) -> bool {
        (self.get)(&limits())
    }

    fn set(&self, _: &ConfigurationContext, value: bool) -> Result<(), RedisError> {
        update_limits(|l| (self.set)(l, value));
        Ok(())
    }
}

pub static RESTART_DELAY_MS: NumericOption = NumericOption {
    get: |l| l.restart_delay_ms,
    set: |l, v| l.restart_delay_ms = v,
};
pub static LOCK_DELAY_MS: NumericOption = NumericOption {
    get: |l| l.lock_delay_ms,
    set: |l, v| l.lock_delay_ms = v,
};
pub static MAX_TTL_MS: NumericOption = NumericOption {
    get: |l| l.max_ttl_ms,
    set: |l, v| l.max_ttl_ms = v,
};
// Redis holds every value within the bounds registered from
// `protocol::OPTIONS` (at start and on CONFIG SET): no second copy of them
// here.
pub static MAX_WAITERS_PER_KEY: NumericOption = NumericOption {
    get: |l| l.max_waiters_per_key as i64,
    set: |l, v| l.max_waiters_per_key = v as usize,
};
pub static MAX_TOKEN_LEN: NumericOption = NumericOption {
    get: |l| l.max_token_len as i64,
    set: |l, v| l.max_token_len = v as usize,
};
pub static MAX_HOLDERS_PER_KEY: NumericOption = NumericOption {
    get: |l| l.max_holders_per_key as i64,
    set: |l, v| l.max_holders_per_key = v as usize,
};
pub static MAX_VALUE_LEN: NumericOption = NumericOption {
    get: |l| l.max_value_len as i64,
    set: |l, v| l.max_value_len = v as usize,
};
pub static ALLOW_EVICTION: BoolOption = BoolOption {
    get: |l| l.allow_eviction,
    set: |l, v| l.allow_eviction = v,
};
