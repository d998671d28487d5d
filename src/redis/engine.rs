//! The server's one [`Node`] (`core::node`), which makes every lock
//! decision, and what the glue hands it and does with its answers:
//! * access ([`with_engine`]), with a lock-free count of waiters for the
//!   callbacks that must not take the engine (unlink2 can run inside it);
//! * the `lock.*` options, whose values live in the node's [`Limits`];
//! * the server's [`Conditions`] at the moment of a call;
//! * [`deliver_wakes`]: the waiters the node answered, counted, announced
//!   (keyspace events) and handed to `blocked` for their one reply.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{LazyLock, Mutex, TryLockError};

use redis_module::configuration::{ConfigurationContext, ConfigurationValue};
use redis_module::{raw, RedisError};

use super::blocked;
use super::ffi::{
    context_flags, is_replica, lock_events, notify_lock_event, selected_db, Ctx, RString,
};
use super::node::{self, count, SERVER, STATS};
use super::timer;
use crate::core::error::LockError;
use crate::core::node::{Admission, Conditions, Limits, Node};
use crate::core::waiters::Outcome;

/// A lock's identity across commands: (db, key name).
pub type Key = (i32, Box<[u8]>);

/// A blocked-client handle's address: only a lookup key (`blocked` owns
/// the handle); Redis reuses addresses, the node never takes it for a
/// waiter's identity.
pub type Client = usize;

static ENGINE: LazyLock<Mutex<Node<Key, Client>>> = LazyLock::new(Default::default);

/// The number of waiters, readable without the engine: the fast path of
/// every command is "nobody waits anywhere".
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// Whether the node has waiters to answer: most commands have none, and
/// skip delivering.
static HAS_WAKES: AtomicBool = AtomicBool::new(false);

/// Runs `f` on the node. Everything runs on Redis's main thread, so the
/// lock is never contended; a re-entrant call (a Redis callback reaching
/// the engine while it is in use) is a bug, and panics (caught at the entry
/// point) instead of deadlocking the server.
pub fn with_engine<R>(f: impl FnOnce(&mut Node<Key, Client>) -> R) -> R {
    let mut node = match ENGINE.try_lock() {
        Ok(node) => node,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => panic!("the lock engine was entered twice"),
    };
    let result = f(&mut node);
    WAITING.store(node.total_waiters(), Relaxed);
    HAS_WAKES.store(node.has_wakes(), Relaxed);
    result
}

pub fn waiters_total() -> usize {
    WAITING.load(Relaxed)
}

pub fn key_of(ctx: Ctx, name: &[u8]) -> Key {
    (selected_db(ctx), name.into())
}

/// `key_of` for a command, without allocating while nobody waits anywhere
/// and the command cannot start a wait (no option words): the node then
/// only ever looks the key up in empty lines.
pub fn command_key(ctx: Ctx, name: &[u8], has_options: bool) -> Key {
    if waiters_total() > 0 || has_options {
        key_of(ctx, name)
    } else {
        (0, Box::default())
    }
}

pub fn limits() -> Limits {
    with_engine(|n| n.limits())
}

/// The server's state as the node needs it. `may_block`: the command asked
/// to BLOCK, and the calling client may block here.
pub fn conditions(ctx: Ctx, may_block: bool) -> Conditions {
    let mut cond = Conditions::empty();
    cond.set(
        Conditions::REPLICA,
        SERVER.replica.load(Relaxed) && is_replica(ctx),
    );
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

/// Whether a waiter's user may still run LOCK.ACQUIRE on the key `name`
/// (asked of ACL when its turn comes).
pub struct WaiterAcl {
    pub ctx: Ctx,
    pub name: RString,
}

impl Admission<Client> for WaiterAcl {
    fn may_take(&mut self, client: Client) -> bool {
        blocked::may_take(self.ctx, client, self.name)
    }
}

/// Carries out what the node decided for waiters: each gets its one reply
/// (through `blocked`), with its counters and, for grants, the keyspace
/// event on `name` (the key the node just settled).
pub fn deliver_wakes(ctx: Ctx, name: Option<RString>) {
    if !HAS_WAKES.load(Relaxed) {
        // Nothing decided for a waiter; with none waiting, nothing to arm
        // either (a renewal's earlier check only matters to waiters).
        if waiters_total() > 0 {
            timer::rearm();
        }
        return;
    }
    let wakes: Vec<_> = with_engine(|n| std::iter::from_fn(|| n.poll_wake()).collect());
    for wake in wakes {
        let grant = match wake.outcome {
            Outcome::Granted { renewed, .. } => {
                if renewed {
                    count(&STATS.extends);
                } else {
                    count(&STATS.grants);
                    count(&STATS.handoffs);
                    node::record_wait(wake.waited_us);
                }
                if let Some(name) = name {
                    let event = match renewed {
                        true => lock_events::EXTEND,
                        false => lock_events::HANDOFF,
                    };
                    notify_lock_event(ctx, event, name);
                }
                true
            }
            Outcome::TimedOut => {
                count(&STATS.block_timeouts);
                false
            }
            Outcome::Failed(LockError::Redirect(_)) => {
                count(&STATS.redirects);
                false
            }
            Outcome::Failed(_) => false,
        };
        let key = grant.then_some(wake.key);
        blocked::answer(wake.client, wake.outcome, key);
    }
    timer::rearm();
}

/// The node (re)started with its data loaded, or was promoted: the fence
/// mark rises to the clock and the restart delay starts.
pub fn start_serving() {
    let now = node::now();
    with_engine(|n| n.start_serving(now));
}

pub fn fence_hwm() -> i64 {
    with_engine(|n| n.fence_hwm())
}

/// A token issued elsewhere (master, AOF, RDB, RESTORE) was applied here.
pub fn observe_fence(fence: i64) -> Result<(), LockError> {
    let wall_us = node::wall_us();
    with_engine(|n| n.observe_fence(fence, wall_us))
}

pub fn check_fence(fence: i64) -> Result<(), LockError> {
    let wall_us = node::wall_us();
    with_engine(|n| n.check_fence(fence, wall_us))
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
    let now_ms = node::mono_ms();
    with_engine(|n| {
        let mut limits = n.limits();
        change(&mut limits);
        n.set_limits(limits, now_ms);
    });
    // Every line is looked at again under the new limits.
    timer::rearm();
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
pub static MAX_TTL_MS: NumericOption = NumericOption {
    get: |l| l.max_ttl_ms,
    set: |l, v| l.max_ttl_ms = v,
};
pub static MAX_WAITERS_PER_KEY: NumericOption = NumericOption {
    get: |l| l.max_waiters_per_key as i64,
    set: |l, v| l.max_waiters_per_key = v.max(1) as usize,
};
pub static MAX_TOKEN_LEN: NumericOption = NumericOption {
    get: |l| l.max_token_len as i64,
    set: |l, v| l.max_token_len = v.clamp(1, crate::core::limits::MAX_TOKEN_LEN as i64) as usize,
};
pub static ALLOW_EVICTION: BoolOption = BoolOption {
    get: |l| l.allow_eviction,
    set: |l, v| l.allow_eviction = v,
};
