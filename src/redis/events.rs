//! Server events and keyspace notifications the module reacts to. Each
//! callback only reads state or queues work for the hand-off timer: none of
//! them writes to the keyspace (Redis 7.0 does not allow it there).

use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::Ordering::Relaxed;

use redis_module::raw;

use super::ffi::{
    api, context_flags, guard, lock_events, log_warning, notify_lock_event, string_bytes, Ctx,
    RString,
};
use super::keyspace::LockKey;
use super::node::{SERVER, STATS};
use super::{blocked, engine, keyspace_events, propagation, timer};
use crate::core::lock::LockSlot;

pub type EventFn = extern "C" fn(Ctx, raw::RedisModuleEvent, u64, *mut c_void);

/// Reads the replication role and the memory policy into `node::SERVER`,
/// warning when the policy starts to allow evicting locks.
pub fn read_server_state(ctx: Ctx) {
    let flags = context_flags(ctx);
    SERVER
        .replica
        .store(flags & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0, Relaxed);
    SERVER
        .maxmemory
        .store(flags & raw::REDISMODULE_CTX_FLAGS_MAXMEMORY != 0, Relaxed);
    let evictable = flags & raw::REDISMODULE_CTX_FLAGS_EVICT != 0;
    let was = SERVER.evictable.swap(evictable, Relaxed);
    if evictable && !was {
        log_warning(
            "lock: maxmemory is set with a maxmemory-policy that can evict keys: held locks \
             could be evicted and granted again. New grants are refused unless \
             lock.allow-eviction is yes; set maxmemory-policy noeviction to keep locks safe.",
        );
    }
}

pub extern "C" fn on_loading(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard("the loading event", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED {
            propagation::check_replication_state(ctx);
            read_server_state(ctx);
            if !SERVER.replica.load(Relaxed) {
                engine::start_serving();
            }
        }
    })
}

pub extern "C" fn on_role_changed(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard("the role-changed event", (), || {
        propagation::replicas_possible();
        propagation::refresh_aof_state(ctx);
        read_server_state(ctx);
        if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER {
            SERVER.replica.store(false, Relaxed);
            engine::start_serving();
        } else {
            SERVER.replica.store(true, Relaxed);
        }
    })
}

pub extern "C" fn on_flush(
    _ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard("the flush event", (), || {
        if subevent != raw::REDISMODULE_SUBEVENT_FLUSHDB_END || data.is_null() {
            return;
        }
        let info = unsafe { &*data.cast::<raw::RedisModuleFlushInfo>() };
        timer::flushed(info.dbnum);
    })
}

pub extern "C" fn on_swapdb(
    _ctx: Ctx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    guard("the swapdb event", (), || {
        if data.is_null() {
            return;
        }
        let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
        timer::swapped(info.dbnum_first, info.dbnum_second);
    })
}

/// CONFIG SET (the AOF can be turned on, maxmemory and its policy changed).
pub extern "C" fn on_config_change(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    guard("the config event", (), || {
        propagation::refresh_aof_state(ctx);
        read_server_state(ctx);
    })
}

/// Generic keyspace events on any key. For a lock key:
/// * `restore`: the payload was accepted whole; its fence raises the mark;
/// * `restore`, `expire`, `persist`: the key's Redis expiry may no longer be
///   the lease's deadline; the timer puts it back (or removes an ended lock).
pub extern "C" fn on_keyspace_event(
    ctx: Ctx,
    _type: c_int,
    event: *const c_char,
    key: RString,
) -> c_int {
    guard("the keyspace event", (), || {
        if event.is_null() || key.is_null() {
            return;
        }
        let event = unsafe { std::ffi::CStr::from_ptr(event) }.to_bytes();
        if event == b"expired" {
            if keyspace_events::was_lock(ctx, unsafe { string_bytes(key) }) {
                notify_lock_event(ctx, lock_events::EXPIRE, key);
            }
            return;
        }
        keyspace_events::forget_unlinked();
        if !matches!(event, b"restore" | b"expire" | b"persist") {
            return;
        }
        // No lock on the node (a RESTOREd one is counted before its event):
        // a TTL change cannot be a lock's, and other writes with a TTL skip
        // opening the key.
        if STATS.locks.load(Relaxed) <= 0 {
            return;
        }
        let Ok(slot) = LockKey::peek(ctx, key) else {
            return;
        };
        let Some(lock) = slot.stored() else {
            return;
        };
        if event == b"restore" {
            if let Err(err) = engine::observe_fence(lock.fence) {
                log_warning(&format!("lock: a RESTOREd lock's fence is refused: {err}"));
            }
        }
        drop(slot);
        if !SERVER.replica.load(Relaxed) {
            let name = unsafe { string_bytes(key) };
            keyspace_events::expiry_changed(engine::key_of(ctx, name));
        }
    });
    0
}

/// Redis 7.0 only (see `blocked`): right before 7.0 sends module replies.
pub extern "C" fn on_event_loop(
    _ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard("the before-sleep event", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_EVENTLOOP_BEFORE_SLEEP {
            blocked::before_sleep();
        }
    })
}

/// Subscribes every event above (called once from `module::start`).
pub fn subscribe(ctx: Ctx) -> Result<(), &'static str> {
    let subscribe = unsafe { raw::RedisModule_SubscribeToServerEvent }
        .ok_or("RedisModule_SubscribeToServerEvent is not available")?;
    let events = [
        (raw::REDISMODULE_EVENT_LOADING, on_loading as EventFn),
        (
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            on_role_changed,
        ),
        (raw::REDISMODULE_EVENT_FLUSHDB, on_flush),
        (raw::REDISMODULE_EVENT_SWAPDB, on_swapdb),
        (raw::REDISMODULE_EVENT_CONFIG, on_config_change),
    ];
    let before_sleep = blocked::defers_unblocks()
        .then_some((raw::REDISMODULE_EVENT_EVENTLOOP, on_event_loop as EventFn));
    for (id, callback) in events.into_iter().chain(before_sleep) {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        if unsafe { subscribe(ctx, event, Some(callback)) } != raw::REDISMODULE_OK as c_int {
            return Err("failed to subscribe to a server event");
        }
    }
    let keyspace = unsafe {
        api!(RedisModule_SubscribeToKeyspaceEvents)(
            ctx,
            (raw::REDISMODULE_NOTIFY_GENERIC | raw::REDISMODULE_NOTIFY_EXPIRED) as c_int,
            Some(on_keyspace_event),
        )
    };
    if keyspace != raw::REDISMODULE_OK as c_int {
        return Err("failed to subscribe to keyspace events");
    }
    Ok(())
}
