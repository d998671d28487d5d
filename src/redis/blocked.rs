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
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{LazyLock, Mutex, MutexGuard};

use super::engine::{self, Client, Key, ModuleNode};
use super::ffi::{self, log_warning, BlockedClient, Blocking, Ctx, RString, Reply, Value};
use super::server::{self, count, STATS};
use super::timer;
use crate::core::error::LockError;
use crate::core::protocol::info_field;
use crate::core::{Leader, Outcome};

/// A blocked client's handle, owned until it is unblocked. Handles are
/// created, kept and unblocked on Redis's main thread only; the Mutex
/// around the maps is for Rust's statics, not for threads.
struct Handle {
    ptr: BlockedClient<WaiterCallbacks>,
    /// The client's id, to look its user up when its turn comes.
    client_id: Option<u64>,
}

impl Handle {
    /// The one RM_UnblockClient of this handle: Redis frees the handle (and
    /// the two temporary clients it holds) only then, also after a
    /// disconnect.
    fn unblock(self, delivery: Option<Box<Delivery>>) {
        self.ptr.unblock(delivery);
    }
}

/// Every blocked handle not yet unblocked, by the waiter id this module
/// gave it (the node's name for the waiter: never reused, unlike a
/// handle's address), with the index Redis's callbacks need (they name a
/// handle by its address). One map, one owner; both kept in one step.
#[derive(Default)]
struct Waiting {
    handles: HashMap<Client, Handle>,
    by_addr: HashMap<usize, Client>,
}

impl Waiting {
    fn insert(&mut self, client: Client, handle: Handle) {
        self.by_addr.insert(handle.ptr.addr(), client);
        self.handles.insert(client, handle);
    }

    fn remove(&mut self, client: Client) -> Option<Handle> {
        let handle = self.handles.remove(&client)?;
        self.by_addr.remove(&handle.ptr.addr());
        Some(handle)
    }
}

static WAITING: LazyLock<Mutex<Waiting>> = LazyLock::new(Default::default);

/// The next waiter id.
static NEXT_CLIENT: AtomicU64 = AtomicU64::new(1);

/// The waiter id of the handle at `addr` (a callback's), if it waits.
fn client_at(addr: usize) -> Option<Client> {
    locked(&WAITING).by_addr.get(&addr).copied()
}

/// Redis 7.0: outcomes decided but not yet handed to Redis (see the file
/// doc), by handle address (the callbacks' name for them), and whether to
/// keep them back at all.
static DECIDED: Mutex<Vec<(usize, Handle, Box<Delivery>)>> = Mutex::new(Vec::new());
static DECIDED_COUNT: AtomicUsize = AtomicUsize::new(0);
static DEFER_UNBLOCKS: AtomicBool = AtomicBool::new(false);

/// The first server version that leaves an unblocked module client alone on
/// CLIENT UNBLOCK (0x00MMmmpp).
const UNBLOCK_SAFE_VERSION: c_int = 0x00_07_02_00;

fn locked<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn take_handle(client: Client) -> Option<Handle> {
    locked(&WAITING).remove(client)
}

/// Called once at load.
pub fn init() {
    let version = ffi::server_version().unwrap_or(0);
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
    /// For a grant: its keys (one, or a multi-key waiter's) with their
    /// lease ids, so an undelivered grant can be taken back.
    granted: Vec<(Key, u64)>,
    delivered: bool,
}

/// Blocks the calling client and hands it to the node, `start` carrying
/// out the node's ticket with its id (a place in line: `Node::enqueue`; an
/// observer: `Node::start_observing`).
pub fn block(
    ctx: Ctx,
    start: impl FnOnce(&mut ModuleNode, Client) -> Result<(), LockError>,
) -> Result<Reply, LockError> {
    // No Redis timeout: the node times waiters out (see the file doc).
    let Some(ptr) = ffi::block_client::<WaiterCallbacks>(ctx, 0) else {
        return Err(LockError::Internal);
    };
    let client_id = ffi::client_id(ctx);
    let handle = Handle { ptr, client_id };
    if !ffi::client_is_blocked(ctx) {
        // Redis refused to block this client and replied itself. The handle
        // must still be released, and nothing may be queued for it.
        handle.unblock(None);
        return Ok(Reply::Blocked);
    }
    handle.ptr.set_disconnect_callback();
    let client = NEXT_CLIENT.fetch_add(1, Relaxed);
    locked(&WAITING).insert(client, handle);
    // One entry: the place in line and when the node must look next.
    let (queued, next_wakeup) = engine::with_engine(|n| (start(n, client), n.next_wakeup()));
    if let Err(err) = queued {
        answer(client, Outcome::Failed(err), Vec::new());
    }
    timer::arm_for(next_wakeup);
    Ok(Reply::Blocked)
}

/// Gives the waiter `client` its one outcome (on Redis 7.0, from the
/// before-sleep event: see the file doc). `granted`: a grant's keys and
/// lease ids.
pub fn answer(client: Client, outcome: Outcome, granted: Vec<(Key, u64)>) {
    let Some(handle) = take_handle(client) else {
        log_warning("lock: an outcome for a waiter that has no handle (ignored)");
        return;
    };
    let delivery = Box::new(Delivery {
        outcome,
        granted,
        delivered: false,
    });
    if defers_unblocks() {
        let mut decided = locked(&DECIDED);
        decided.push((handle.ptr.addr(), handle, delivery));
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

/// Takes back the outcome kept for the handle at `addr`, if any (Redis
/// 7.0).
fn take_decided(addr: usize) -> Option<(Handle, Box<Delivery>)> {
    if DECIDED_COUNT.load(Relaxed) == 0 {
        return None;
    }
    let mut decided = locked(&DECIDED);
    let at = decided.iter().position(|(a, _, _)| *a == addr)?;
    let (_, handle, delivery) = decided.swap_remove(at);
    DECIDED_COUNT.store(decided.len(), Relaxed);
    Some((handle, delivery))
}

/// Whether the user of the waiter `client` may still run LOCK.ACQUIRE on
/// `name`. Yes when it cannot be told (no ACL API, client unknown); no when
/// its user was deleted.
pub fn may_take(ctx: Ctx, client: Client, name: RString) -> bool {
    user_may(ctx, client, |user| ffi::user_may_acquire(ctx, user, name))
}

/// Whether the user of the observer `client` may still run LOCK.OBSERVE
/// on `name` (read it). As [`may_take`] otherwise.
pub fn may_observe(ctx: Ctx, client: Client, name: RString) -> bool {
    user_may(ctx, client, |user| ffi::user_may_observe(ctx, user, name))
}

/// `check` of the blocked `client`'s user, by name; yes when there is no
/// user to ask.
fn user_may(ctx: Ctx, client: Client, check: impl FnOnce(RString) -> bool) -> bool {
    let Some(id) = locked(&WAITING)
        .handles
        .get(&client)
        .and_then(|h| h.client_id)
    else {
        return true;
    };
    // None also when the client is gone: its disconnect takes it out of
    // line.
    let Some(user) = ffi::client_user_name(ctx, id) else {
        return true;
    };
    check(user.get())
}

/// The Redis side of the waiters: the callbacks of their blocked clients
/// (each run in `ffi::guard`), and what they are unblocked with.
struct WaiterCallbacks;

impl Blocking for WaiterCallbacks {
    type Data = Delivery;

    fn on_reply(ctx: Ctx, delivery: Option<&mut Delivery>) {
        match delivery {
            Some(delivery) => reply_outcome(ctx, delivery),
            None => ffi::reply_null(ctx),
        }
    }

    /// CLIENT UNBLOCK (Redis itself never times these clients out): leave
    /// the line, reply nil; or, if its outcome was decided and kept back
    /// (Redis 7.0), reply with that.
    fn on_timeout(ctx: Ctx, addr: usize) {
        if let Some((handle, mut delivery)) = take_decided(addr) {
            reply_outcome(ctx, &mut delivery);
            release_decided(handle, *delivery);
            return;
        }
        if client_at(addr).is_some_and(leave) {
            count(&STATS.block_timeouts);
        }
        ffi::reply_null(ctx);
    }

    /// The client went away, CLIENT UNBLOCK ... ERROR, or the node became a
    /// replica: leave the line.
    fn on_disconnect(addr: usize) {
        match take_decided(addr) {
            Some((handle, delivery)) => release_decided(handle, *delivery),
            None => {
                if let Some(client) = client_at(addr) {
                    leave(client);
                }
            }
        }
    }

    /// The last word on an unblocked client. A grant its client never
    /// received (it went away in between) is reported, so the node takes it
    /// back.
    fn on_free(delivery: Box<Delivery>) {
        report_if_undelivered(*delivery);
    }
}

/// `LOCK.OBSERVE`'s reply: the leader's `fence`, `ttl` (ms left of its
/// lease) and public `value` (nil when it has none), or fence 0, ttl -2
/// (as TTL says of a missing key) and value nil when nobody holds the key.
pub fn leader_reply(leader: &Leader) -> Reply {
    let (fence, ttl, value) = match leader {
        Leader::Held {
            fence,
            ttl_ms,
            value,
        } => (*fence, *ttl_ms, value_of(value)),
        Leader::Vacant => (0, -2, Value::Null),
    };
    Reply::Map(vec![
        (info_field::FENCE, Value::Integer(fence)),
        (info_field::TTL, Value::Integer(ttl)),
        (info_field::VALUE, value),
    ])
}

/// A holder's public value as replied: nil when it has none.
pub fn value_of(value: &[u8]) -> Value {
    match value.is_empty() {
        true => Value::Null,
        false => Value::Bytes(value.to_vec()),
    }
}

/// Sends a waiter its outcome; a grant counts as delivered.
fn reply_outcome(ctx: Ctx, delivery: &mut Delivery) {
    match &delivery.outcome {
        Outcome::Granted { fence, .. } => {
            delivery.delivered = true;
            ffi::reply_integer(ctx, *fence);
        }
        Outcome::TimedOut => ffi::reply_null(ctx),
        Outcome::Observed(leader) => ffi::reply(ctx, leader_reply(leader)),
        Outcome::Failed(err) => {
            let msg = std::ffi::CString::new(err.to_string()).unwrap_or_default();
            ffi::reply_error(ctx, &msg);
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

/// Takes a waiter out of its line and, if it was there, unblocks its
/// handle (with no outcome: Redis answers the client itself).
fn leave(client: Client) -> bool {
    let now_ms = server::mono_ms();
    let (was_waiting, next_wakeup) =
        engine::with_engine(|n| (n.leave(client, now_ms), n.next_wakeup()));
    if was_waiting {
        if let Some(handle) = take_handle(client) {
            handle.unblock(None);
        }
        timer::arm_for(next_wakeup);
    }
    was_waiting
}

/// A grant whose client never received it goes to the node (from the
/// timer: this may run where the engine cannot be entered).
fn report_if_undelivered(delivery: Delivery) {
    if let (Outcome::Granted { fence, .. }, false) = (delivery.outcome, delivery.delivered) {
        timer::queue(|inbox| {
            let grants = delivery.granted.into_iter();
            inbox
                .undelivered
                .extend(grants.map(|(key, lease)| (key, fence, lease)));
        });
    }
}
