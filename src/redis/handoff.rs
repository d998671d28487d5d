//! Waiting in the server: `LOCK.ACQUIRE key token ttl-ms BLOCK timeout-ms`.
//!
//! `core::waiters` makes every decision (who waits, who is granted, who times
//! out, when to look again); this file executes them against Redis:
//! * a waiter is a Redis blocked client, blocked *without* a Redis timeout:
//!   BLOCK timeouts run on the module's own timer, so "granted" and "timed
//!   out" are decided in one place and each waiter gets exactly one reply;
//! * one module timer, armed for the engine's `next_wakeup`, runs timeouts,
//!   lease-end hand-offs, and the work queued by callbacks that cannot write
//!   (unlink2, flush, SWAPDB, keyspace events, take-backs);
//! * RELEASE hands the lock on inside the same command; ACQUIRE, EXTEND and
//!   RELEASE first run any hand-off due on their key, so nobody barges in.
//!
//! Nothing here writes while the node is a replica or writes are paused
//! (CLIENT PAUSE, FAILOVER): hand-offs then wait and are retried shortly.
//!
//! A waiter is granted only while its user may still write the key (an ACL
//! change while it waited fails it with NOPERM when its turn comes).
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

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::Relaxed};
use std::sync::{LazyLock, Mutex, MutexGuard};

use redis_module::raw;

use super::datatype::LockBlock;
use super::ffi::{
    api, cluster_nodes, guard, in_cluster, is_replica, key_exists, lock_events, lock_events_on,
    notify_lock_event, string_bytes, writes_paused, Ctx, RString, Reply,
};
use super::keyspace::LockKey;
use super::node::{self, count, NodeFences, STATS};
use crate::core::cluster;
use crate::core::error::LockError;
use crate::core::lock;
use crate::core::waiters::{Outcome, Request, Waiters, Wake};

/// A lock's identity across commands: (db, key name).
pub type Key = (i32, Box<[u8]>);

/// A blocked-client handle, as an address. Only a lookup key: the engine
/// never takes it for a waiter's identity (Redis reuses addresses).
type Client = usize;

static WAITERS: LazyLock<Mutex<Waiters<Key, Client>>> = LazyLock::new(Default::default);

/// The number of waiters, readable without the lock: the fast path of every
/// command is "nobody waits anywhere".
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// Work from callbacks that cannot write, for the next timer run. Apart
/// from WAITERS because unlink2 can run while WAITERS is locked (a grant
/// that replaces an ended lock frees the old value).
#[derive(Default)]
struct Pending {
    /// Keys whose lock may have freed (DEL, UNLINK, overwrite, flush, ...).
    freed: Vec<Key>,
    /// Keys whose Redis expiry may no longer match the lease.
    expiry: Vec<Key>,
    /// Grants whose reply never reached their client: (key, fence, lease).
    take_backs: Vec<(Key, i64, u64)>,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending {
    freed: Vec::new(),
    expiry: Vec::new(),
    take_backs: Vec::new(),
});

/// The one armed timer: (when, id).
static TIMER: Mutex<Option<(i64, u64)>> = Mutex::new(None);

/// A context for creating timers from callbacks that have none (unlink2).
static TIMER_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

/// The client id of every queued waiter's handle, to look its user up when
/// its turn comes (ACL changes while it waits).
static CLIENT_IDS: LazyLock<Mutex<std::collections::HashMap<Client, u64>>> =
    LazyLock::new(Default::default);

/// Redis 7.0: outcomes decided but not yet handed to Redis (see the file
/// doc), and whether to keep them back at all.
static DECIDED: Mutex<Vec<(Client, Box<Delivery>)>> = Mutex::new(Vec::new());
static DECIDED_COUNT: AtomicUsize = AtomicUsize::new(0);
static DEFER_UNBLOCKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The first server version that leaves an unblocked module client alone on
/// CLIENT UNBLOCK (0x00MMmmpp).
const UNBLOCK_SAFE_VERSION: c_int = 0x00_07_02_00;

/// While hand-offs must wait (replica, paused writes), look again this soon.
const RETRY_MS: i64 = 10;

fn locked<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `f` on the engine. `f` may call Redis only through a `LockKey`
/// (whose callbacks touch PENDING, never WAITERS).
fn with_waiters<R>(f: impl FnOnce(&mut Waiters<Key, Client>) -> R) -> R {
    let mut waiters = WAITERS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let result = f(&mut waiters);
    WAITING.store(waiters.total(), Relaxed);
    result
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
    with_waiters(|w| w.waiting_on(&key))
}

/// Called once at load: a detached context to create timers with.
pub fn init(ctx: Ctx) -> Result<(), &'static str> {
    let detached = unsafe { raw::RedisModule_GetDetachedThreadSafeContext }
        .ok_or("RedisModule_GetDetachedThreadSafeContext is not available")?;
    TIMER_CTX.store(unsafe { detached(ctx) }, Relaxed);
    let version = unsafe { raw::RedisModule_GetServerVersion }.map_or(0, |f| unsafe { f() });
    DEFER_UNBLOCKS.store(version < UNBLOCK_SAFE_VERSION, Relaxed);
    Ok(())
}

/// Whether outcomes wait for the before-sleep event (Redis 7.0). The event
/// subscription (`events::subscribe`) must be in place when this is true.
pub fn defers_unblocks() -> bool {
    DEFER_UNBLOCKS.load(Relaxed)
}

/// The before-sleep event: hand the outcomes decided in this event-loop
/// iteration to Redis, which sends them right after (Redis 7.0).
pub fn before_sleep() {
    if DECIDED_COUNT.load(Relaxed) == 0 {
        return;
    }
    let decided = std::mem::take(&mut *locked(&DECIDED));
    DECIDED_COUNT.store(0, Relaxed);
    for (client, delivery) in decided {
        unblock_now(client, delivery);
    }
}

/// Takes back the outcome kept for `client`, if any (Redis 7.0).
fn take_decided(client: Client) -> Option<Box<Delivery>> {
    if DECIDED_COUNT.load(Relaxed) == 0 {
        return None;
    }
    let mut decided = locked(&DECIDED);
    let at = decided.iter().position(|(c, _)| *c == client)?;
    let (_, delivery) = decided.swap_remove(at);
    DECIDED_COUNT.store(decided.len(), Relaxed);
    Some(delivery)
}

/// Runs any hand-off due on `name` before a command touches it.
pub fn settle_if_waiting(ctx: Ctx, name: RString, name_bytes: &[u8]) {
    if waiters_total() > 0 {
        let key = key_of(ctx, name_bytes);
        if with_waiters(|w| w.waiting_on(&key)) > 0 {
            settle_key(ctx, name, &key);
        }
    }
}

/// The holder renewed its lease (EXTEND, or ACQUIRE with its own token):
/// the lease may end sooner than the check planned for `key`.
pub fn lease_changed(ctx: Ctx, name_bytes: &[u8], deadline_ms: i64) {
    if waiters_total() > 0 {
        let key = key_of(ctx, name_bytes);
        with_waiters(|w| w.schedule(&key, deadline_ms));
        rearm();
    }
}

/// Blocks the calling client in `key`'s line. The lock is held by another
/// token (or cannot be granted yet) until `held_until_ms`.
pub fn block(
    ctx: Ctx,
    key: Key,
    request: Request<'_>,
    held_until_ms: i64,
) -> Result<Reply, LockError> {
    let max = node::max_waiters_per_key();
    if with_waiters(|w| w.waiting_on(&key)) >= max {
        return Err(LockError::TooManyWaiters(max as i64));
    }
    // No Redis timeout: the engine times waiters out (see the file doc).
    let client = unsafe {
        api!(RedisModule_BlockClient)(
            ctx,
            Some(on_reply),
            Some(on_timeout),
            Some(free_delivery),
            0,
        )
    };
    if client.is_null() {
        return Err(LockError::Internal);
    }
    if !is_blocked(ctx) {
        // Redis refused to block this client and replied itself. The handle
        // must still be released, and nothing may be queued for it.
        unsafe { api!(RedisModule_UnblockClient)(client, std::ptr::null_mut()) };
        return Ok(Reply::Blocked);
    }
    if let Some(set_disconnect) = unsafe { raw::RedisModule_SetDisconnectCallback } {
        unsafe { set_disconnect(client, Some(on_disconnect)) };
    }
    if let Some(get_id) = unsafe { raw::RedisModule_GetClientId } {
        locked(&CLIENT_IDS).insert(client as Client, unsafe { get_id(ctx) });
    }
    let queued = with_waiters(|w| {
        w.enqueue(
            key,
            client as Client,
            request,
            node::now_us(),
            held_until_ms,
            max,
        )
    });
    if let Err(err) = queued {
        unblock(client as Client, Delivery::new(Outcome::Failed(err), None));
    }
    rearm();
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

/// What a blocked client is unblocked with.
struct Delivery {
    outcome: Outcome,
    /// For a grant: the key, so an undelivered grant can be taken back.
    key: Option<Key>,
    delivered: bool,
}

impl Delivery {
    fn new(outcome: Outcome, key: Option<Key>) -> Self {
        Delivery {
            outcome,
            key,
            delivered: false,
        }
    }
}

/// Opens `key` (named `name` in the selected db) and lets the engine hand it
/// on; executes what it decided.
fn settle_key(ctx: Ctx, name: RString, key: &Key) {
    let now_us = node::now_us();
    let wakes = match LockKey::open(ctx, name, true) {
        Ok(mut slot) => with_waiters(|w| {
            let paused = node::grants_paused_ms(lock::ms(now_us));
            let may_take = |client| waiter_may_write(ctx, client, name);
            w.settle_permitted(key, &mut slot, &mut NodeFences, now_us, paused, may_take)
        }),
        // The key now holds another type: its waiters cannot get a lock.
        Err(err) => with_waiters(|w| w.fail_all(key, &err, now_us)),
    };
    for wake in &wakes {
        match wake.outcome {
            Outcome::Granted { renewed: false, .. } => {
                notify_lock_event(ctx, lock_events::HANDOFF, name)
            }
            Outcome::Granted { renewed: true, .. } => {
                notify_lock_event(ctx, lock_events::EXTEND, name)
            }
            _ => {}
        }
    }
    execute(wakes);
    rearm();
}

fn execute(wakes: Vec<Wake<Key, Client>>) {
    for wake in wakes {
        let key = match wake.outcome {
            Outcome::Granted { renewed: false, .. } => {
                count(&STATS.grants);
                count(&STATS.handoffs);
                node::record_wait(wake.waited_us);
                Some(wake.key)
            }
            Outcome::Granted { renewed: true, .. } => {
                count(&STATS.extends);
                Some(wake.key)
            }
            Outcome::TimedOut => {
                count(&STATS.block_timeouts);
                None
            }
            Outcome::Failed(_) => None,
        };
        unblock(wake.client, Delivery::new(wake.outcome, key));
    }
}

/// Whether the user of the waiter `client` may still write `name` (ACL
/// key patterns). Yes when it cannot be told (no ACL API, client unknown);
/// no when its user was deleted.
fn waiter_may_write(ctx: Ctx, client: Client, name: RString) -> bool {
    let Some(id) = locked(&CLIENT_IDS).get(&client).copied() else {
        return true;
    };
    let Some(user_name) = (unsafe { raw::RedisModule_GetClientUserNameById }) else {
        return true;
    };
    let user = unsafe { user_name(ctx, id) };
    if user.is_null() {
        return true; // the client is gone: its disconnect takes it out of line
    }
    let allowed = super::ffi::user_may_write_key(user, name);
    unsafe { api!(RedisModule_FreeString)(ctx, user) };
    allowed
}

/// Gives `client` its one outcome (on Redis 7.0, from the before-sleep
/// event: see the file doc).
fn unblock(client: Client, delivery: Delivery) {
    locked(&CLIENT_IDS).remove(&client);
    let delivery = Box::new(delivery);
    if defers_unblocks() {
        let mut decided = locked(&DECIDED);
        decided.push((client, delivery));
        DECIDED_COUNT.store(decided.len(), Relaxed);
    } else {
        unblock_now(client, delivery);
    }
}

fn unblock_now(client: Client, delivery: Box<Delivery>) {
    let data = Box::into_raw(delivery);
    unsafe {
        api!(RedisModule_UnblockClient)(client as *mut raw::RedisModuleBlockedClient, data.cast())
    };
}

/// Makes sure the timer runs at `at_ms` or earlier.
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
        let mut data: *mut c_void = std::ptr::null_mut();
        unsafe { api!(RedisModule_StopTimer)(ctx, id, &mut data) };
    }
    // Round up so the timer never runs before `at_ms` has passed. at_ms is
    // bounded (limits::MAX_DEADLINE_MS), so this cannot overflow.
    let period_ms = ((at_ms.saturating_mul(1000) - node::now_us()).max(0) + 999) / 1000;
    let id = unsafe {
        api!(RedisModule_CreateTimer)(ctx, period_ms, Some(on_timer), std::ptr::null_mut())
    };
    *timer = Some((at_ms, id));
}

/// Arms the timer for the engine's next wake-up, and at once for queued work.
fn rearm() {
    if let Some(at) = with_waiters(|w| w.next_wakeup()) {
        arm_at(at);
    }
}

fn queue_work(f: impl FnOnce(&mut Pending)) {
    f(&mut locked(&PENDING));
    arm_at(node::now_ms());
}

extern "C" fn on_timer(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("the hand-off timer", (), || {
        *locked(&TIMER) = None;
        let now_us = node::now_us();
        let now_ms = lock::ms(now_us);
        let pending = std::mem::take(&mut *locked(&PENDING));
        with_waiters(|w| {
            for key in &pending.freed {
                w.schedule(key, now_ms);
            }
        });
        // Timing out writes nothing: it goes on while writes are held back.
        execute(with_waiters(|w| w.poll_timeouts(now_ms, now_us)));
        if is_replica(ctx) || writes_paused() {
            return defer(pending, now_ms, is_replica(ctx));
        }
        for key in &pending.expiry {
            run_in_db(ctx, key, |name| {
                if let Ok(mut slot) = LockKey::open(ctx, name, true) {
                    slot.restore_expiry(now_ms);
                }
            });
        }
        let mut cluster = ClusterView::new(ctx);
        for (key, fence, lease) in &pending.take_backs {
            run_in_db(ctx, key, |name| {
                if let Ok(mut slot) = LockKey::open(ctx, name, true) {
                    if lock::take_back(&mut slot, *fence, *lease, now_ms) {
                        count(&STATS.take_backs);
                        drop(slot);
                        notify_lock_event(ctx, lock_events::RELEASE, name);
                    }
                }
                settle_here_or_redirect(ctx, name, key, &mut cluster);
            });
        }
        for key in with_waiters(|w| w.due_keys(now_ms)) {
            run_in_db(ctx, &key, |name| {
                settle_here_or_redirect(ctx, name, &key, &mut cluster)
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

    /// Where `name`'s waiters must go instead, if its key is gone from this
    /// node because its slot is migrating away or served elsewhere
    /// (resharding's MIGRATE deleted it). A missing key in a slot served
    /// here is an ordinary free lock.
    fn redirect(&mut self, ctx: Ctx, name: RString, key: &Key) -> Option<LockError> {
        if !self.enabled || key_exists(ctx, name) {
            return None;
        }
        let nodes = self
            .nodes
            .get_or_insert_with(|| cluster_nodes(ctx))
            .as_deref()?;
        cluster::route(nodes, cluster::key_slot(&key.1))
            .redirect()
            .map(LockError::Redirect)
    }
}

/// Hands `key` on here, or, if it left this node, sends its waiters where
/// it went (never a second lock for a key in a slot given away).
fn settle_here_or_redirect(ctx: Ctx, name: RString, key: &Key, cluster: &mut ClusterView) {
    match cluster.redirect(ctx, name, key) {
        None => settle_key(ctx, name, key),
        Some(redirect) => {
            let wakes = with_waiters(|w| w.fail_all(key, &redirect, node::now_us()));
            STATS.redirects.fetch_add(wakes.len() as u64, Relaxed);
            execute(wakes);
        }
    }
}

/// Writes must wait: keep the work and look again shortly. On a replica the
/// master decides: expiry fixes and take-backs are its to make.
fn defer(pending: Pending, now_ms: i64, replica: bool) {
    let retry_at = now_ms + RETRY_MS;
    with_waiters(|w| {
        for key in w.due_keys(now_ms) {
            w.schedule(&key, retry_at);
        }
    });
    let has_writes = !pending.expiry.is_empty() || !pending.take_backs.is_empty();
    if has_writes && !replica {
        let mut queued = locked(&PENDING);
        queued.expiry.extend(pending.expiry);
        queued.take_backs.extend(pending.take_backs);
        drop(queued);
        arm_at(retry_at);
    }
    rearm();
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
fn release_decided(client: Client, delivery: Delivery) {
    take_back_if_undelivered(delivery);
    unsafe {
        api!(RedisModule_UnblockClient)(
            client as *mut raw::RedisModuleBlockedClient,
            std::ptr::null_mut(),
        )
    };
}

/// CLIENT UNBLOCK (Redis itself never times these clients out): leave the
/// line, reply nil; or, if its outcome was decided and kept back (Redis
/// 7.0), reply with that.
unsafe extern "C" fn on_timeout(ctx: Ctx, _argv: *mut RString, _argc: c_int) -> c_int {
    guard("the blocked-client timeout", (), || unsafe {
        let client = api!(RedisModule_GetBlockedClientHandle)(ctx);
        if let Some(mut delivery) = take_decided(client as Client) {
            reply_outcome(ctx, &mut delivery);
            release_decided(client as Client, *delivery);
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
            Some(delivery) => release_decided(client as Client, *delivery),
            None => {
                leave(client);
            }
        }
    })
}

/// Takes a waiter out of its line and, if it was there, releases its
/// blocked-client handle. Redis frees a handle (and the two temporary
/// clients it holds) only when the module calls RM_UnblockClient, also
/// after a disconnect; a handle already given an outcome was unblocked then,
/// and must not be unblocked twice.
fn leave(client: *mut raw::RedisModuleBlockedClient) -> bool {
    let was_waiting = with_waiters(|w| w.leave(client as Client, node::now_ms())).is_some();
    if was_waiting {
        locked(&CLIENT_IDS).remove(&(client as Client));
        unsafe { api!(RedisModule_UnblockClient)(client, std::ptr::null_mut()) };
        rearm();
    }
    was_waiting
}

/// The last word on an unblocked client. A grant its client never received
/// (it went away in between) is taken back and handed on, so the lock is
/// never left with a client that is gone.
unsafe extern "C" fn free_delivery(_ctx: Ctx, data: *mut c_void) {
    guard("the blocked-client cleanup", (), || {
        if data.is_null() {
            return;
        }
        let delivery = unsafe { Box::from_raw(data.cast::<Delivery>()) };
        take_back_if_undelivered(*delivery);
    })
}

/// A grant whose client never received it is taken back (from the timer),
/// so the lock is never left with a client that does not know it holds it.
fn take_back_if_undelivered(delivery: Delivery) {
    if let (Outcome::Granted { fence, lease, .. }, Some(key), false) =
        (delivery.outcome, delivery.key, delivery.delivered)
    {
        queue_work(|p| p.take_backs.push((key, fence, lease)));
    }
}

/// Type callback: a lock key left the keyspace (DEL, UNLINK, overwrite,
/// expiry, eviction, MOVE, RENAME). It cannot write: queue a check.
pub extern "C" fn on_unlink(opt: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    guard("unlink", (), || {
        // Only a lock whose lease ended can be leaving by expiry.
        let events = lock_events_on()
            && !super::datatype::MODULE_REMOVING.get()
            && !value.is_null()
            && !unsafe { LockBlock::view(value.cast()) }.is_live(node::now_ms());
        if waiters_total() == 0 && !events {
            return;
        }
        let key: Key = unsafe {
            let name = api!(RedisModule_GetKeyNameFromOptCtx)(opt);
            let db = api!(RedisModule_GetDbIdFromOptCtx)(opt);
            (db, string_bytes(name.cast_mut()).into())
        };
        if events {
            *locked(&LAST_UNLINKED) = Some(key.clone());
        } else if lock_events_on() {
            *locked(&LAST_UNLINKED) = None;
        }
        if waiters_total() > 0 {
            queue_work(|p| p.freed.push(key));
        }
    })
}

/// The last lock key that left the keyspace after its lease ended, while
/// lock events are on: Redis sends `expired` right after it deletes an
/// expired key, when its type can no longer be read. Any other keyspace
/// event clears it (`forget_unlinked`), so a later key of another type
/// with the same name is never taken for a lock.
static LAST_UNLINKED: Mutex<Option<Key>> = Mutex::new(None);

/// Whether the key Redis just expired (`expired` event for `name`) was a
/// lock; it then gets a `lock.expire` event.
pub fn forget_unlinked() {
    if lock_events_on() {
        *locked(&LAST_UNLINKED) = None;
    }
}

pub fn was_lock(ctx: Ctx, name: &[u8]) -> bool {
    // Every expiring key of any type comes here: nothing to look at (and
    // nothing to allocate) unless a lock was just unlinked.
    if !lock_events_on() {
        return false;
    }
    let mut last = locked(&LAST_UNLINKED);
    let Some((db, unlinked)) = last.as_ref() else {
        return false;
    };
    let db_now = unsafe { api!(RedisModule_GetSelectedDb)(ctx) };
    if *db != db_now || **unlinked != *name {
        return false;
    }
    *last = None;
    true
}

/// FLUSHDB / FLUSHALL finished (db -1: all): check every waited-on key there.
pub fn flushed(db: i32) {
    if waiters_total() == 0 {
        return;
    }
    let keys: Vec<Key> =
        with_waiters(|w| w.keys().filter(|k| db < 0 || k.0 == db).cloned().collect());
    queue_work(|p| p.freed.extend(keys));
}

/// SWAPDB a b: lines move with their databases, then every key in both is
/// checked (its lock may differ now).
pub fn swapped(a: i32, b: i32) {
    if waiters_total() == 0 {
        return;
    }
    let keys: Vec<Key> = with_waiters(|w| {
        w.rename_keys(|(db, name)| {
            let db = match *db {
                d if d == a => b,
                d if d == b => a,
                d => d,
            };
            (db, name.clone())
        });
        w.keys().filter(|k| k.0 == a || k.0 == b).cloned().collect()
    });
    queue_work(|p| p.freed.extend(keys));
}

/// A lock key's Redis expiry may have been changed by EXPIRE, PERSIST or
/// RESTORE: make it follow the lease again (from the timer: a keyspace
/// event cannot write on Redis 7.0).
pub fn expiry_changed(key: Key) {
    queue_work(|p| p.expiry.push(key));
}
