//! Server events the module reacts to, and the type's unlink callback.
//! Each only reads state or queues work for the timer: none of them writes
//! to the keyspace (Redis 7.0 does not allow it there). The module has no
//! command filter and no keyspace-event subscription: commands that touch
//! no lock run no module code.

use std::os::raw::c_void;
use std::sync::atomic::Ordering::Relaxed;

use redis_module::raw;

use super::engine::Key;
use super::ffi::{
    self, config_get, context_flags, guard, log_warning, Ctx, EventData, EventFn, KeyOpt,
};
use super::server::SERVER;
use super::{blocked, engine, keyspace, propagation, sweep, timer, timer_run};

/// Reads the role and the memory policy into `server::SERVER`,
/// warning when the policy starts to allow evicting locks.
pub fn read_server_state(ctx: Ctx) {
    let flags = context_flags(ctx);
    SERVER
        .replica
        .store(flags & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0, Relaxed);
    SERVER
        .maxmemory
        .store(flags & raw::REDISMODULE_CTX_FLAGS_MAXMEMORY != 0, Relaxed);
    // Lock keys carry no Redis expiry: only an allkeys-* policy can pick
    // one (volatile-* evicts keys with an expiry only).
    let evictable = flags & raw::REDISMODULE_CTX_FLAGS_EVICT != 0
        && config_get(ctx, c"maxmemory-policy").is_none_or(|p| p.starts_with("allkeys"));
    let was = SERVER.evictable.swap(evictable, Relaxed);
    if evictable && !was {
        log_warning(
            "lock: maxmemory is set with an allkeys-* maxmemory-policy: held locks could be \
             evicted and granted again. New grants and hand-offs are refused unless \
             lock.allow-eviction is yes; use noeviction or a volatile-* policy (which never \
             evicts a lock) to keep locks safe.",
        );
    }
}

pub extern "C" fn on_loading(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: EventData,
) {
    guard("the loading event", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED {
            propagation::check_replication_state(ctx);
            read_server_state(ctx);
            if !SERVER.replica.load(Relaxed) {
                engine::start_serving();
            } else {
                // A replica prunes the leases it loaded (see `Node::run_timer`).
                engine::arm_timer();
            }
        }
    })
}

pub extern "C" fn on_role_changed(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: EventData,
) {
    guard("the role-changed event", (), || {
        propagation::replicas_possible();
        propagation::refresh_aof_state(ctx);
        read_server_state(ctx);
        // The event says which role this is (the flags read above say the
        // same: Redis changes the role before it fires the event).
        let now_master = subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER;
        SERVER.replica.store(!now_master, Relaxed);
        if now_master {
            engine::start_serving();
        }
    })
}

pub extern "C" fn on_flush(
    _ctx: Ctx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    data: EventData,
) {
    guard("the flush event", (), || {
        if subevent != raw::REDISMODULE_SUBEVENT_FLUSHDB_END {
            return;
        }
        if let Some(db) = ffi::flush_event_db(event, data) {
            timer_run::flushed(db);
        }
    })
}

pub extern "C" fn on_swapdb(
    _ctx: Ctx,
    event: raw::RedisModuleEvent,
    _subevent: u64,
    data: EventData,
) {
    guard("the swapdb event", (), || {
        if let Some((a, b)) = ffi::swapdb_event_dbs(event, data) {
            timer_run::swapped(a, b);
        }
    })
}

/// CONFIG SET (the AOF can be turned on, maxmemory and its policy changed).
pub extern "C" fn on_config_change(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: EventData,
) {
    guard("the config event", (), || {
        propagation::refresh_aof_state(ctx);
        read_server_state(ctx);
    })
}

/// A fork was born (BGSAVE, AOF rewrite, or a full sync to a replica):
/// before a replica can receive anything, its sync forks, so this is where
/// the replication shortcut is re-checked (see `propagation`) without
/// looking at every command.
pub extern "C" fn on_fork(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: EventData,
) {
    guard("the fork event", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN {
            propagation::check_replication_state(ctx);
        }
    })
}

/// Server cron (1/hz s, on the monotonic event loop): the module's timers
/// fire by the wall clock; re-arm any that a clock step left far behind.
pub extern "C" fn on_cron(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: EventData,
) {
    guard("the cron event", (), || {
        timer::heal();
        sweep::heal(ctx);
    })
}

/// A replica came online or went away.
pub extern "C" fn on_replica_change(
    _ctx: Ctx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: EventData,
) {
    guard("the replica event", (), propagation::replicas_possible)
}

/// Type callback: a lock key left the keyspace (DEL, UNLINK, overwrite,
/// a user's EXPIRE coming due, eviction, MOVE, RENAME). Its waiters are
/// looked at again from the timer; it may run inside the engine (a key
/// opened there whose EXPIRE came due), so it only queues. A value the node
/// itself replaces or deletes needs nothing: the node looks at the key's
/// line after its own writes.
pub extern "C" fn on_unlink(opt: KeyOpt, _value: *const c_void) {
    guard("unlink", (), || {
        if keyspace::node_is_writing() || !engine::may_have_waiters() {
            return;
        }
        let (db, name) = ffi::unlinked_key(opt);
        let key: Key = (db, name[..].into());
        timer::queue(|inbox| inbox.changed.push(key));
    })
}

/// Before the event loop sleeps: the hand-off timer is re-armed at once if
/// a wall-clock step left it overdue (`timer::heal`); on Redis 7.0 (see
/// `blocked`), right before 7.0 sends module replies.
pub extern "C" fn on_event_loop(
    _ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: EventData,
) {
    guard("the before-sleep event", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_EVENTLOOP_BEFORE_SLEEP {
            timer::heal();
            if blocked::defers_unblocks() {
                blocked::before_sleep();
            }
        }
    })
}

/// Subscribes every event above (called once from `module::start`).
pub fn subscribe(ctx: Ctx) -> Result<(), &'static str> {
    let events = [
        (raw::REDISMODULE_EVENT_LOADING, on_loading as EventFn),
        (
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            on_role_changed,
        ),
        (raw::REDISMODULE_EVENT_FLUSHDB, on_flush),
        (raw::REDISMODULE_EVENT_SWAPDB, on_swapdb),
        (raw::REDISMODULE_EVENT_CONFIG, on_config_change),
        (raw::REDISMODULE_EVENT_FORK_CHILD, on_fork),
        (raw::REDISMODULE_EVENT_REPLICA_CHANGE, on_replica_change),
        (raw::REDISMODULE_EVENT_CRON_LOOP, on_cron),
        (raw::REDISMODULE_EVENT_EVENTLOOP, on_event_loop),
    ];
    for (id, callback) in events {
        match ffi::subscribe_to_server_event(ctx, id, callback) {
            Some(true) => {}
            None => return Err("RedisModule_SubscribeToServerEvent is not available"),
            Some(false) => return Err("failed to subscribe to a server event"),
        }
    }
    Ok(())
}
