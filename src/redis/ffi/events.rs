//! Keyspace notifications sent and subscribed to, and server events.

use super::*;

/// Whether module-class keyspace events are on (`notify-keyspace-events`
/// with `d`, or `A`): the cheap check before any notification work.
#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub fn lock_events_on() -> bool {
    match optional_api!(RedisModule_GetNotifyKeyspaceEvents) {
        // SAFETY: takes no argument.
        Some(get) => (unsafe { get() } & raw::REDISMODULE_NOTIFY_MODULE as c_int) != 0,
        None => false,
    }
}

/// Emits `event` for `key` (in the context's selected db), if enabled.
#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub fn notify_lock_event(ctx: Ctx, event: &CStr, key: RString) {
    if !lock_events_on() {
        return;
    }
    if let Some(notify) = optional_api!(RedisModule_NotifyKeyspaceEvent) {
        // SAFETY: ctx and key are handles Redis gave the caller; Redis
        // copies the event name.
        unsafe {
            notify(
                ctx.0,
                raw::REDISMODULE_NOTIFY_MODULE as c_int,
                event.as_ptr(),
                key.0,
            )
        };
    }
}

// ---- server events ----

/// Subscribes `callback` to the server event `id`: whether the server
/// accepted; None where it lacks the API.
pub fn subscribe_to_server_event(ctx: Ctx, id: u64, callback: EventFn) -> Option<bool> {
    let subscribe = optional_api!(RedisModule_SubscribeToServerEvent)?;
    let event = raw::RedisModuleEvent { id, dataver: 1 };
    let callback = raw_callback!(callback as EventFn);
    // SAFETY: ctx is the load context Redis gave the caller; the callback
    // is a plain function.
    Some(unsafe { subscribe(ctx.0, event, callback) } == raw::REDISMODULE_OK as c_int)
}

/// A keyspace-notification callback: (context in the key's db, the event
/// type, its name, the key).
pub type KeyspaceFn = extern "C" fn(Ctx, c_int, *const c_char, RString) -> c_int;

/// Subscribes `callback` to the keyspace events of `types`
/// (`REDISMODULE_NOTIFY_*`). The server calls it for those events only.
pub fn subscribe_to_keyspace_events(ctx: Ctx, types: c_int, callback: KeyspaceFn) -> bool {
    let callback = raw_callback!(callback as KeyspaceFn);
    // SAFETY: ctx is the load context Redis gave the caller; the callback
    // is a plain function.
    let status = unsafe { api!(RedisModule_SubscribeToKeyspaceEvents)(ctx.0, types, callback) };
    status == raw::REDISMODULE_OK as c_int
}

/// The db a FLUSHDB event is about (-1: all), from the `event` and `data`
/// Redis passed an event callback; None for another event or no data.
pub fn flush_event_db(event: raw::RedisModuleEvent, data: EventData) -> Option<i32> {
    let data = data.0;
    if event.id != raw::REDISMODULE_EVENT_FLUSHDB || data.is_null() {
        return None;
    }
    // SAFETY: with a FLUSHDB event, Redis passes a RedisModuleFlushInfo,
    // alive during the callback.
    Some(unsafe { &*data.cast::<raw::RedisModuleFlushInfo>() }.dbnum)
}

/// The two dbs a SWAPDB event swapped, from the `event` and `data` Redis
/// passed an event callback; None for another event or no data.
pub fn swapdb_event_dbs(event: raw::RedisModuleEvent, data: EventData) -> Option<(i32, i32)> {
    let data = data.0;
    if event.id != raw::REDISMODULE_EVENT_SWAPDB || data.is_null() {
        return None;
    }
    // SAFETY: with a SWAPDB event, Redis passes a RedisModuleSwapDbInfo,
    // alive during the callback.
    let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
    Some((info.dbnum_first, info.dbnum_second))
}
