//! Node-wide state: the fencing high-water mark, the restart delay, and the
//! counters shown by `INFO lock`. Commands run on Redis's main thread; the
//! values are atomics because a forked RDB child and lazy-free threads read
//! them too.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use redis_module::raw;

use crate::core::error::LockError;
use crate::core::fence::{next_after, FenceSource};

/// The largest fencing token this node has issued or applied.
static FENCE_HWM: AtomicI64 = AtomicI64::new(0);

/// `lock.restart-delay-ms`: how long after loading data or promotion the node
/// refuses new grants.
pub static RESTART_DELAY_MS: AtomicI64 = AtomicI64::new(0);

/// When the node last loaded its data or became master (Unix ms).
static GRANTS_PAUSED_SINCE_MS: AtomicI64 = AtomicI64::new(0);

pub fn now_ms() -> i64 {
    now_us() / 1000
}

/// Wall-clock Unix time in microseconds. Read straight from clock_gettime
/// (a vDSO call): SystemTime's checked conversions cost a grant more than
/// the clock itself.
pub fn now_us() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // CLOCK_REALTIME with a valid pointer cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000 + ts.tv_nsec / 1_000
}

pub fn fence_hwm() -> i64 {
    FENCE_HWM.load(Relaxed)
}

/// A token issued elsewhere (master, AOF, RDB) was applied on this node.
pub fn observe_fence(fence: i64) {
    FENCE_HWM.fetch_max(fence, Relaxed);
}

/// Issues fencing tokens from the node-wide high-water mark.
pub struct NodeFences;

impl FenceSource for NodeFences {
    fn next_fence(&mut self) -> Result<i64, LockError> {
        // Grants happen only on the main thread, so load + store cannot race
        // with another grant; fetch_max keeps concurrent observers safe.
        let next = next_after(FENCE_HWM.load(Relaxed))?;
        FENCE_HWM.fetch_max(next, Relaxed);
        Ok(next)
    }
}

/// The node (re)started with its data loaded, or was promoted: raise the
/// fence mark to the clock and start the restart delay.
pub fn start_serving_as_master() {
    let now = now_us();
    observe_fence(now);
    GRANTS_PAUSED_SINCE_MS.store(now / 1000, Relaxed);
}

/// How many more ms new grants are refused (0 when grants are allowed).
pub fn grants_paused_ms(now_ms: i64) -> i64 {
    let delay = RESTART_DELAY_MS.load(Relaxed);
    if delay <= 0 {
        return 0;
    }
    let until = GRANTS_PAUSED_SINCE_MS.load(Relaxed).saturating_add(delay);
    (until - now_ms).max(0)
}

/// The counters of `INFO lock`.
pub struct Stats {
    pub grants: AtomicU64,
    pub contended: AtomicU64,
    pub releases: AtomicU64,
    pub extends: AtomicU64,
    pub expirations: AtomicU64,
    /// Lock values in the keyspace; a lease that ended still counts until
    /// its key is reclaimed.
    pub locks: AtomicI64,
}

pub static STATS: Stats = Stats {
    grants: AtomicU64::new(0),
    contended: AtomicU64::new(0),
    releases: AtomicU64::new(0),
    extends: AtomicU64::new(0),
    expirations: AtomicU64::new(0),
    locks: AtomicI64::new(0),
};

pub fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

/// Server events: loading finished (start-up, DEBUG RELOAD, full sync),
/// replication role changes, flushes (which hand locks to waiters) and
/// config changes (the AOF can be turned on at runtime).
pub fn subscribe_to_server_events(ctx: *mut raw::RedisModuleCtx) -> Result<(), &'static str> {
    let subscribe = unsafe { raw::RedisModule_SubscribeToServerEvent }
        .ok_or("RedisModule_SubscribeToServerEvent is not available")?;
    let events = [
        (raw::REDISMODULE_EVENT_LOADING, on_loading as EventFn),
        (
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            on_role_changed,
        ),
        (raw::REDISMODULE_EVENT_FLUSHDB, super::blocking::on_flush),
        (
            raw::REDISMODULE_EVENT_CONFIG,
            super::propagation::on_config_change,
        ),
    ];
    for (id, callback) in events {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        if unsafe { subscribe(ctx, event, Some(callback)) } != raw::REDISMODULE_OK as i32 {
            return Err("failed to subscribe to a server event");
        }
    }
    Ok(())
}

type EventFn =
    extern "C" fn(*mut raw::RedisModuleCtx, raw::RedisModuleEvent, u64, *mut std::os::raw::c_void);

extern "C" fn on_loading(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut std::os::raw::c_void,
) {
    super::ffi::guard("the loading event", (), || {
        let is_master = super::ffi::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_MASTER != 0;
        if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED {
            super::propagation::check_replication_state(ctx);
            if is_master {
                start_serving_as_master();
            }
        }
    })
}

extern "C" fn on_role_changed(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut std::os::raw::c_void,
) {
    super::ffi::guard("the role-changed event", (), || {
        super::propagation::replicas_possible();
        super::propagation::refresh_aof_state(ctx);
        if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER {
            start_serving_as_master();
        }
    })
}
