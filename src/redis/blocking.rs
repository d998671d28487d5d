//! Waiting in the server: `LOCK.ACQUIRE key token ttl-ms BLOCK timeout-ms`.
//!
//! Waiters are Redis blocked clients, queued FIFO per (db, key) in a
//! module-wide `WaitQueues` (not in the lock value, so a queue outlives DEL,
//! FLUSHALL and overwrites of its key). The lock is handed to the first live
//! waiter, and the grant replicated like any other, whenever it frees:
//! * RELEASE: in the same command, right after the lock is removed;
//! * lease expiry: a module timer set for the deadline of a lock with waiters;
//! * DEL / UNLINK / overwrite / Redis expiry: the type's unlink2 callback,
//!   which cannot write to the keyspace, schedules an immediate check;
//! * FLUSHDB / FLUSHALL: the flush server event does the same.
//!
//! Commands that could take the lock (ACQUIRE, EXTEND, RELEASE) first run
//! any hand-off that is due on their key, so nobody barges in between a lock
//! freeing and its hand-off.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{LazyLock, Mutex};

use redis_module::raw;

use super::ffi::{api, guard, string_bytes, Ctx, RString};
use super::node::{self, count, NodeFences, STATS};
use super::slot::RedisSlot;
use crate::core::error::LockError;
use crate::core::lock::{self, Acquired, HandOff, LockSlot};
use crate::core::queue::{Schedule, WaitQueues, WaiterId};

/// A lock's identity across commands: (db, key name).
pub type Key = (i32, Box<[u8]>);

struct Waiter {
    client: *mut raw::RedisModuleBlockedClient,
    token: Box<[u8]>,
    ttl_ms: i64,
    since_us: i64,
}

// Blocked-client handles are used on the main thread only.
unsafe impl Send for Waiter {}

static QUEUES: LazyLock<Mutex<WaitQueues<Key, Waiter>>> = LazyLock::new(Default::default);

/// The number of waiters, readable without the lock: the fast path of every
/// command is "nobody waits anywhere".
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// A context for creating timers from callbacks that have none (unlink2).
static TIMER_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

pub static HANDOFFS: AtomicU64 = AtomicU64::new(0);
pub static BLOCK_TIMEOUTS: AtomicU64 = AtomicU64::new(0);
pub static WAIT_TOTAL_US: AtomicU64 = AtomicU64::new(0);
pub static WAIT_MAX_US: AtomicU64 = AtomicU64::new(0);

/// Runs `f` on the queues. Never call Redis inside `f`: a Redis call can
/// call back into this module.
fn with_queues<R>(f: impl FnOnce(&mut WaitQueues<Key, Waiter>) -> R) -> R {
    let (result, orphaned) = {
        let mut queues = QUEUES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let result = f(&mut queues);
        WAITING.store(queues.total(), Relaxed);
        (result, queues.take_orphaned_timers())
    };
    for timer in orphaned {
        stop_timer(timer);
    }
    result
}

/// Stops a pending check timer and frees its data.
fn stop_timer(timer: u64) {
    let ctx = TIMER_CTX.load(Relaxed);
    let mut data: *mut c_void = std::ptr::null_mut();
    let stopped = unsafe { api!(RedisModule_StopTimer)(ctx, timer, &mut data) };
    if stopped == raw::REDISMODULE_OK as c_int && !data.is_null() {
        drop(unsafe { Box::from_raw(data.cast::<(Key, i64)>()) });
    }
}

pub fn waiters_total() -> usize {
    WAITING.load(Relaxed)
}

pub fn key_of(ctx: Ctx, name: &[u8]) -> Key {
    (unsafe { api!(RedisModule_GetSelectedDb)(ctx) }, name.into())
}

pub fn waiting_on(ctx: Ctx, name: &[u8]) -> usize {
    if waiters_total() == 0 {
        return 0;
    }
    let key = key_of(ctx, name);
    with_queues(|q| q.waiting_on(&key))
}

/// Called once at load: a detached context to create timers with.
pub fn init(ctx: Ctx) -> Result<(), &'static str> {
    let detached = unsafe { raw::RedisModule_GetDetachedThreadSafeContext }
        .ok_or("RedisModule_GetDetachedThreadSafeContext is not available")?;
    TIMER_CTX.store(unsafe { detached(ctx) }, Relaxed);
    Ok(())
}

/// Runs a hand-off on `name` if one is due, before a command touches it.
pub fn hand_off_if_waiting(ctx: Ctx, name: RString, name_bytes: &[u8]) {
    if waiters_total() > 0 {
        let key = key_of(ctx, name_bytes);
        if with_queues(|q| q.waiting_on(&key)) > 0 {
            hand_off(ctx, name, &key);
        }
    }
}

/// Blocks the calling client until the lock is handed to it or `timeout_ms`
/// passes (0: no limit). The lock is held until `held_until_ms`.
pub fn block(
    ctx: Ctx,
    key: Key,
    token: &[u8],
    ttl_ms: i64,
    timeout_ms: i64,
    held_until_ms: i64,
) -> Result<(), LockError> {
    let client = unsafe {
        api!(RedisModule_BlockClient)(
            ctx,
            Some(on_reply),
            Some(on_timeout),
            Some(free_outcome),
            timeout_ms,
        )
    };
    if client.is_null() {
        return Err(LockError::Internal);
    }
    if let Some(set_disconnect) = unsafe { raw::RedisModule_SetDisconnectCallback } {
        unsafe { set_disconnect(client, Some(on_disconnect)) };
    }
    let waiter = Waiter {
        client,
        token: token.into(),
        ttl_ms,
        since_us: node::now_us(),
    };
    with_queues(|q| q.push(key.clone(), client as WaiterId, waiter));
    schedule_check(&key, held_until_ms);
    Ok(())
}

/// What a blocked client is unblocked with.
enum Outcome {
    Granted {
        fence: i64,
        key: Key,
        token: Box<[u8]>,
        delivered: bool,
    },
    Failed(LockError),
}

/// Hands the lock at `key` to its first live waiter if it is free; keeps a
/// check scheduled while it is held. `name` is the key name as a Redis string
/// in `ctx`, whose selected db must be `key.0`.
fn hand_off(ctx: Ctx, name: RString, key: &Key) {
    loop {
        let now = node::now_ms();
        let mut slot = match RedisSlot::open(ctx, name, true) {
            Ok(slot) => slot,
            Err(err) => {
                // The key now holds another type: its waiters cannot get a lock.
                while let Some((_, w)) = with_queues(|q| q.pop_front(key)) {
                    unblock(w.client, Outcome::Failed(err.clone()));
                }
                return;
            }
        };
        match lock::hand_off_state(&slot, now, node::grants_paused_ms(now)) {
            HandOff::HeldUntil(deadline) => return schedule_check(key, deadline),
            HandOff::PausedFor(ms) => return schedule_check(key, now + ms),
            HandOff::GrantNow => {}
        }
        let Some((_, w)) = with_queues(|q| q.pop_front(key)) else {
            return;
        };
        match lock::acquire(&mut slot, &mut NodeFences, &w.token, w.ttl_ms, now, 0) {
            Ok(Acquired::Granted(fence)) | Ok(Acquired::Renewed(fence)) => {
                count(&STATS.grants);
                count(&HANDOFFS);
                record_wait(w.since_us);
                let deadline = slot.stored().map_or(now, |l| l.deadline_ms);
                unblock(
                    w.client,
                    Outcome::Granted {
                        fence,
                        key: key.clone(),
                        token: w.token,
                        delivered: false,
                    },
                );
                return schedule_check(key, deadline);
            }
            // Free by the check above; kept for completeness.
            Ok(Acquired::Contended) => unblock(w.client, Outcome::Failed(LockError::Internal)),
            Err(err) => unblock(w.client, Outcome::Failed(err)),
        }
    }
}

fn record_wait(since_us: i64) {
    let waited = (node::now_us() - since_us).max(0) as u64;
    WAIT_TOTAL_US.fetch_add(waited, Relaxed);
    WAIT_MAX_US.fetch_max(waited, Relaxed);
}

fn unblock(client: *mut raw::RedisModuleBlockedClient, outcome: Outcome) {
    let data = Box::into_raw(Box::new(outcome));
    unsafe { api!(RedisModule_UnblockClient)(client, data.cast()) };
}

/// Makes sure a hand-off check for `key` runs at `at_ms` (or earlier).
fn schedule_check(key: &Key, at_ms: i64) {
    let ctx = TIMER_CTX.load(Relaxed);
    if ctx.is_null() {
        return;
    }
    match with_queues(|q| q.plan_check(key, at_ms)) {
        Schedule::NotNeeded => return,
        Schedule::New => {}
        Schedule::Replace(later) => stop_timer(later),
    }
    // Round up so the check never runs before the deadline has passed.
    let period_ms = ((at_ms * 1000 - node::now_us()).max(0) + 999) / 1000;
    let data = Box::into_raw(Box::new((key.clone(), at_ms)));
    let timer =
        unsafe { api!(RedisModule_CreateTimer)(ctx, period_ms, Some(on_timer), data.cast()) };
    with_queues(|q| q.check_scheduled(key, at_ms, timer));
}

/// Schedules an immediate check for every waited-on key in `db` (-1: all).
fn check_db_soon(db: i32) {
    if waiters_total() == 0 {
        return;
    }
    let keys: Vec<Key> =
        with_queues(|q| q.keys().filter(|k| db < 0 || k.0 == db).cloned().collect());
    let now = node::now_ms();
    for key in keys {
        schedule_check(&key, now);
    }
}

extern "C" fn on_timer(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard("the hand-off timer", (), || {
        let (key, at_ms) = *unsafe { Box::from_raw(data.cast::<(Key, i64)>()) };
        with_queues(|q| q.check_started(&key, at_ms));
        run_in_db(ctx, &key, |name| hand_off(ctx, name, &key));
    })
}

/// Runs `f` with `key`'s name as a Redis string, in `key`'s db.
fn run_in_db(ctx: Ctx, key: &Key, f: impl FnOnce(RString)) {
    unsafe {
        if api!(RedisModule_SelectDb)(ctx, key.0) != raw::REDISMODULE_OK as c_int {
            return; // the db no longer exists (CONFIG SET databases)
        }
        let name = api!(RedisModule_CreateString)(ctx, key.1.as_ptr().cast(), key.1.len());
        f(name);
        api!(RedisModule_FreeString)(ctx, name);
    }
}

unsafe extern "C" fn on_reply(ctx: Ctx, _argv: *mut RString, _argc: c_int) -> c_int {
    guard("the blocked-client reply", (), || unsafe {
        let outcome = api!(RedisModule_GetBlockedClientPrivateData)(ctx).cast::<Outcome>();
        match outcome.as_mut() {
            Some(Outcome::Granted {
                fence, delivered, ..
            }) => {
                *delivered = true;
                api!(RedisModule_ReplyWithLongLong)(ctx, *fence);
            }
            Some(Outcome::Failed(err)) => {
                let msg = std::ffi::CString::new(err.to_string()).unwrap_or_default();
                api!(RedisModule_ReplyWithError)(ctx, msg.as_ptr());
            }
            None => {
                api!(RedisModule_ReplyWithNull)(ctx);
            }
        }
    });
    raw::REDISMODULE_OK as c_int
}

/// BLOCK timed out, or CLIENT UNBLOCK: leave the queue, reply nil.
unsafe extern "C" fn on_timeout(ctx: Ctx, _argv: *mut RString, _argc: c_int) -> c_int {
    guard("the blocked-client timeout", (), || unsafe {
        let client = api!(RedisModule_GetBlockedClientHandle)(ctx);
        if leave_queue(client) {
            count(&BLOCK_TIMEOUTS);
        }
        api!(RedisModule_ReplyWithNull)(ctx);
    });
    raw::REDISMODULE_OK as c_int
}

/// The client went away, CLIENT UNBLOCK ... ERROR, or the node became a
/// replica: leave the queue.
unsafe extern "C" fn on_disconnect(_ctx: Ctx, client: *mut raw::RedisModuleBlockedClient) {
    guard("the blocked-client disconnect", (), || {
        leave_queue(client);
    })
}

/// Takes a waiter out of its queue and, if it was there, releases its
/// blocked-client handle. Redis frees a handle (and the two temporary
/// clients it holds) only when the module calls RM_UnblockClient, also
/// after a timeout or a disconnect; a handle already handed the lock was
/// unblocked then, and must not be unblocked twice.
fn leave_queue(client: *mut raw::RedisModuleBlockedClient) -> bool {
    let was_waiting = with_queues(|q| q.remove(client as WaiterId)).is_some();
    if was_waiting {
        unsafe { api!(RedisModule_UnblockClient)(client, std::ptr::null_mut()) };
    }
    was_waiting
}

/// The last word on an unblocked client. A grant its client never received
/// (it disconnected in between) is taken back and handed on, so the lock is
/// never left with a client that is gone.
unsafe extern "C" fn free_outcome(_ctx: Ctx, data: *mut c_void) {
    guard("the blocked-client cleanup", (), || {
        if data.is_null() {
            return;
        }
        let outcome = unsafe { Box::from_raw(data.cast::<Outcome>()) };
        if let Outcome::Granted {
            fence,
            key,
            token,
            delivered: false,
        } = *outcome
        {
            take_back_soon(key, token, fence);
        }
    })
}

/// Releases an undelivered grant from a timer (a context that may write).
fn take_back_soon(key: Key, token: Box<[u8]>, fence: i64) {
    let ctx = TIMER_CTX.load(Relaxed);
    if ctx.is_null() {
        return;
    }
    let data = Box::into_raw(Box::new((key, token, fence)));
    unsafe { api!(RedisModule_CreateTimer)(ctx, 0, Some(on_take_back), data.cast()) };
}

extern "C" fn on_take_back(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard("taking back an undelivered grant", (), || {
        let (key, token, fence) = *unsafe { Box::from_raw(data.cast::<(Key, Box<[u8]>, i64)>()) };
        run_in_db(ctx, &key, |name| {
            if let Ok(mut slot) = RedisSlot::open(ctx, name, true) {
                let ours = slot
                    .live(node::now_ms())
                    .is_some_and(|l| l.fence == fence && l.token == &*token);
                if ours {
                    slot.remove();
                }
            }
            hand_off(ctx, name, &key);
        });
    })
}

/// Type callback: a lock key left the keyspace (DEL, UNLINK, overwrite,
/// expiry). It cannot write, so it schedules the hand-off check.
pub extern "C" fn on_unlink(opt: *mut raw::RedisModuleKeyOptCtx, _value: *const c_void) {
    guard("unlink", (), || {
        if waiters_total() == 0 {
            return;
        }
        let key: Key = unsafe {
            let name = api!(RedisModule_GetKeyNameFromOptCtx)(opt);
            let db = api!(RedisModule_GetDbIdFromOptCtx)(opt);
            (db, string_bytes(name.cast_mut()).into())
        };
        schedule_check(&key, node::now_ms());
    })
}

/// Server event: FLUSHDB / FLUSHALL finished.
pub extern "C" fn on_flush(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard("the flush event", (), || {
        if subevent != raw::REDISMODULE_SUBEVENT_FLUSHDB_END || data.is_null() {
            return;
        }
        let info = unsafe { &*data.cast::<raw::RedisModuleFlushInfo>() };
        check_db_soon(info.dbnum);
    })
}
