//! Blocked clients: `LOCK.ACQUIRE ... BLOCK timeout-ms` waiting in line.
//!
//! The node decides who waits, who is granted and who times out; this file
//! only keeps the Redis side of each waiter and gives it its one reply:
//! * a waiter is a Redis blocked client, blocked *without* a Redis timeout
//!   (the node times waiters out), so each gets exactly one outcome;
//! * its handle is a [`Handle`], owned here from the moment it is blocked
//!   until it is unblocked, and consumed by [`Handle::unblock`]: a handle
//!   cannot be unblocked twice, and one that leaves the map is unblocked;
//! * a grant whose reply never reached its client is reported to the node
//!   (through the timer's inbox), which takes it back.
//!
//! Redis 7.0 only: a blocked client that the module has unblocked but whose
//! reply is not sent yet (that happens in `beforeSleep`) gets no reply at
//! all if `CLIENT UNBLOCK` reaches it in between (7.0 skips the timeout
//! callback for it, then unblocks it anyway). So on 7.0 outcomes are kept
//! here and handed to Redis from the before-sleep event, which 7.0 fires
//! right before it sends module replies: no command can come in between.
//! A `CLIENT UNBLOCK` before that reaches a waiter Redis still thinks is
//! blocked, and `on_timeout` answers with the outcome already decided.
//! Redis 7.2+ and Valkey leave such a client alone, so there the handle is
//! unblocked at once.

use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{LazyLock, Mutex, MutexGuard};

use redis_module::raw;

use super::engine::{self, Client, Key};
use super::ffi::{api, guard, log_warning, Ctx, RString, Reply};
use super::node::{self, count, STATS};
use super::timer;
use crate::core::error::LockError;
use crate::core::node::WaitTicket;
use crate::core::waiters::Outcome;

/// A blocked client's handle, owned until it is unblocked.
struct Handle {
    ptr: NonNull<raw::RedisModuleBlockedClient>,
    /// The client's id, to look its user up when its turn comes.
    client_id: Option<u64>,
}

// SAFETY: handles are created, kept and unblocked on Redis's main thread
// only; the Mutex around the maps is for Rust's statics, not for threads.
unsafe impl Send for Handle {}

impl Handle {
    /// The one RM_UnblockClient of this handle: Redis frees the handle (and
    /// the two temporary clients it holds) only then, also after a
    /// disconnect.
    fn unblock(self, delivery: Option<Box<Delivery>>) {
        let data = delivery.map_or(std::ptr::null_mut(), Box::into_raw);
        // SAFETY: `ptr` came from RM_BlockClient and, the handle being
        // consumed here, is unblocked exactly once.
        unsafe { api!(RedisModule_UnblockClient)(self.ptr.as_ptr(), data.cast()) };
    }
}

/// Every blocked handle not yet unblocked, by address.
static HANDLES: LazyLock<Mutex<HashMap<Client, Handle>>> = LazyLock::new(Default::default);

/// Redis 7.0: outcomes decided but not yet handed to Redis (see the file
/// doc), and whether to keep them back at all.
static DECIDED: Mutex<Vec<(Client, Handle, Box<Delivery>)>> = Mutex::new(Vec::new());
static DECIDED_COUNT: AtomicUsize = AtomicUsize::new(0);
static DEFER_UNBLOCKS: AtomicBool = AtomicBool::new(false);

/// The first server version that leaves an unblocked module client alone on
/// CLIENT UNBLOCK (0x00MMmmpp).
const UNBLOCK_SAFE_VERSION: c_int = 0x00_07_02_00;

fn locked<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn take_handle(client: Client) -> Option<Handle> {
    locked(&HANDLES).remove(&client)
}

/// Called once at load.
pub fn init() {
    let version = unsafe { raw::RedisModule_GetServerVersion }.map_or(0, |f| unsafe { f() });
    DEFER_UNBLOCKS.store(version < UNBLOCK_SAFE_VERSION, Relaxed);
}

/// Whether outcomes wait for the before-sleep event (Redis 7.0). The event
/// subscription (`events::subscribe`) must be in place when this is true.
pub fn defers_unblocks() -> bool {
    DEFER_UNBLOCKS.load(Relaxed)
}

/// What a blocked client is unblocked with.
struct Delivery {
    outcome: Outcome,
    /// For a grant: the key, so an undelivered grant can be taken back.
    key: Option<Key>,
    delivered: bool,
}

/// Blocks the calling client and queues it on the node's ticket.
pub fn block(ctx: Ctx, ticket: WaitTicket<Key>) -> Result<Reply, LockError> {
    // No Redis timeout: the node times waiters out (see the file doc).
    let ptr = unsafe {
        api!(RedisModule_BlockClient)(
            ctx,
            Some(on_reply),
            Some(on_timeout),
            Some(free_delivery),
            0,
        )
    };
    let Some(ptr) = NonNull::new(ptr) else {
        return Err(LockError::Internal);
    };
    let client_id = unsafe { raw::RedisModule_GetClientId }.map(|get| unsafe { get(ctx) });
    let handle = Handle { ptr, client_id };
    if !is_blocked(ctx) {
        // Redis refused to block this client and replied itself. The handle
        // must still be released, and nothing may be queued for it.
        handle.unblock(None);
        return Ok(Reply::Blocked);
    }
    if let Some(set_disconnect) = unsafe { raw::RedisModule_SetDisconnectCallback } {
        unsafe { set_disconnect(ptr.as_ptr(), Some(on_disconnect)) };
    }
    let client = ptr.as_ptr() as Client;
    locked(&HANDLES).insert(client, handle);
    if let Err(err) = engine::with_engine(|n| n.enqueue(ticket, client)) {
        answer(client, Outcome::Failed(err), None);
    }
    timer::rearm();
    Ok(Reply::Blocked)
}

/// Whether the calling client is blocked now (RM_BlockClient can refuse, for
/// example on Valkey for a timeout it finds out of range, or in contexts
/// that cannot block).
fn is_blocked(ctx: Ctx) -> bool {
    let (Some(get_id), Some(get_info)) = (unsafe { raw::RedisModule_GetClientId }, unsafe {
        raw::RedisModule_GetClientInfoById
    }) else {
        return true;
    };
    let mut info: raw::RedisModuleClientInfo = unsafe { std::mem::zeroed() };
    info.version = 1;
    let id = unsafe { get_id(ctx) };
    let found = unsafe { get_info((&mut info as *mut raw::RedisModuleClientInfo).cast(), id) };
    found != raw::REDISMODULE_OK as c_int
        || info.flags & raw::REDISMODULE_CLIENTINFO_FLAG_BLOCKED as u64 != 0
}

/// Gives the waiter `client` its one outcome (on Redis 7.0, from the
/// before-sleep event: see the file doc). `key`: for a grant.
pub fn answer(client: Client, outcome: Outcome, key: Option<Key>) {
    let Some(handle) = take_handle(client) else {
        log_warning("lock: an outcome for a waiter that has no handle (ignored)");
        return;
    };
    let delivery = Box::new(Delivery {
        outcome,
        key,
        delivered: false,
    });
    if defers_unblocks() {
        let mut decided = locked(&DECIDED);
        decided.push((client, handle, delivery));
        DECIDED_COUNT.store(decided.len(), Relaxed);
    } else {
        handle.unblock(Some(delivery));
    }
}

/// The before-sleep event: hand the outcomes decided in this event-loop
/// iteration to Redis, which sends them right after (Redis 7.0).
pub fn before_sleep() {
    if DECIDED_COUNT.load(Relaxed) == 0 {
        return;
    }
    let decided = std::mem::take(&mut *locked(&DECIDED));
    DECIDED_COUNT.store(0, Relaxed);
    for (_, handle, delivery) in decided {
        handle.unblock(Some(delivery));
    }
}

/// Takes back the outcome kept for `client`, if any (Redis 7.0).
fn take_decided(client: Client) -> Option<(Handle, Box<Delivery>)> {
    if DECIDED_COUNT.load(Relaxed) == 0 {
        return None;
    }
    let mut decided = locked(&DECIDED);
    let at = decided.iter().position(|(c, _, _)| *c == client)?;
    let (_, handle, delivery) = decided.swap_remove(at);
    DECIDED_COUNT.store(decided.len(), Relaxed);
    Some((handle, delivery))
}

/// Whether the user of the waiter `client` may still run LOCK.ACQUIRE on
/// `name`. Yes when it cannot be told (no ACL API, client unknown); no when
/// its user was deleted.
pub fn may_take(ctx: Ctx, client: Client, name: RString) -> bool {
    let Some(id) = locked(&HANDLES).get(&client).and_then(|h| h.client_id) else {
        return true;
    };
    let Some(user_name) = (unsafe { raw::RedisModule_GetClientUserNameById }) else {
        return true;
    };
    let user = unsafe { user_name(ctx, id) };
    if user.is_null() {
        return true; // the client is gone: its disconnect takes it out of line
    }
    let allowed = super::ffi::user_may_acquire(ctx, user, name);
    unsafe { api!(RedisModule_FreeString)(ctx, user) };
    allowed
}

unsafe extern "C" fn on_reply(ctx: Ctx, _argv: *mut RString, _argc: c_int) -> c_int {
    guard("the blocked-client reply", (), || unsafe {
        let delivery = api!(RedisModule_GetBlockedClientPrivateData)(ctx).cast::<Delivery>();
        match delivery.as_mut() {
            Some(delivery) => reply_outcome(ctx, delivery),
            None => {
                api!(RedisModule_ReplyWithNull)(ctx);
            }
        }
    });
    raw::REDISMODULE_OK as c_int
}

/// Sends a waiter its outcome; a grant counts as delivered.
fn reply_outcome(ctx: Ctx, delivery: &mut Delivery) {
    unsafe {
        match &delivery.outcome {
            Outcome::Granted { fence, .. } => {
                delivery.delivered = true;
                api!(RedisModule_ReplyWithLongLong)(ctx, *fence);
            }
            Outcome::TimedOut => {
                api!(RedisModule_ReplyWithNull)(ctx);
            }
            Outcome::Failed(err) => {
                let msg = std::ffi::CString::new(err.to_string()).unwrap_or_default();
                api!(RedisModule_ReplyWithError)(ctx, msg.as_ptr());
            }
        }
    }
}

/// Releases a handle whose outcome was kept back (Redis 7.0) and is now
/// settled otherwise: answered by `on_timeout`, or its client went away (a
/// grant it never received is then taken back).
fn release_decided(handle: Handle, delivery: Delivery) {
    report_if_undelivered(delivery);
    handle.unblock(None);
}

/// CLIENT UNBLOCK (Redis itself never times these clients out): leave the
/// line, reply nil; or, if its outcome was decided and kept back (Redis
/// 7.0), reply with that.
unsafe extern "C" fn on_timeout(ctx: Ctx, _argv: *mut RString, _argc: c_int) -> c_int {
    guard("the blocked-client timeout", (), || unsafe {
        let client = api!(RedisModule_GetBlockedClientHandle)(ctx) as Client;
        if let Some((handle, mut delivery)) = take_decided(client) {
            reply_outcome(ctx, &mut delivery);
            release_decided(handle, *delivery);
            return;
        }
        if leave(client) {
            count(&STATS.block_timeouts);
        }
        api!(RedisModule_ReplyWithNull)(ctx);
    });
    raw::REDISMODULE_OK as c_int
}

/// The client went away, CLIENT UNBLOCK ... ERROR, or the node became a
/// replica: leave the line.
unsafe extern "C" fn on_disconnect(_ctx: Ctx, client: *mut raw::RedisModuleBlockedClient) {
    guard("the blocked-client disconnect", (), || {
        match take_decided(client as Client) {
            Some((handle, delivery)) => release_decided(handle, *delivery),
            None => {
                leave(client as Client);
            }
        }
    })
}

/// Takes a waiter out of its line and, if it was there, unblocks its
/// handle (with no outcome: Redis answers the client itself).
fn leave(client: Client) -> bool {
    let now_ms = node::mono_ms();
    let was_waiting = engine::with_engine(|n| n.leave(client, now_ms));
    if was_waiting {
        if let Some(handle) = take_handle(client) {
            handle.unblock(None);
        }
        timer::rearm();
    }
    was_waiting
}

/// The last word on an unblocked client. A grant its client never received
/// (it went away in between) is reported, so the node takes it back.
unsafe extern "C" fn free_delivery(_ctx: Ctx, data: *mut c_void) {
    guard("the blocked-client cleanup", (), || {
        if data.is_null() {
            return;
        }
        // SAFETY: `data` is the Box<Delivery> handed to RM_UnblockClient,
        // and Redis calls this once for it.
        let delivery = unsafe { Box::from_raw(data.cast::<Delivery>()) };
        report_if_undelivered(*delivery);
    })
}

/// A grant whose client never received it goes to the node (from the
/// timer: this may run where the engine cannot be entered).
fn report_if_undelivered(delivery: Delivery) {
    if let (Outcome::Granted { fence, lease, .. }, Some(key), false) =
        (delivery.outcome, delivery.key, delivery.delivered)
    {
        timer::queue(|inbox| inbox.undelivered.push((key, fence, lease)));
    }
}
