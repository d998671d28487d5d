//! A key of the keyspace, seen by the engine as a `LockStore`.
//!
//! A lock key carries no Redis expiry: the lease is the module's (on the
//! monotonic clock; see `core::time`), and the module reclaims ended locks
//! itself (`core::node::Node::reclaim`, the `sweep`). The store is plain:
//! every write signals the key as modified (WATCH, client-side caching:
//! only real changes do, as the module sets NO_IMPLICIT_SIGNAL_MODIFIED);
//! what a write means is the node's to say (`core::output`). A key the node
//! reports changed is replicated ([`replicate`], by `outputs`) as an
//! absolute effect, never as the relative command:
//! * a grant or renewal as `LOCK._SET key token fence deadline-ms granted-ms`,
//!   the deadline on the wall clock
//! * a release, take-back or reclamation as `DEL key`
//! * one holder of a shared key added or renewed as `LOCK._HOLD key limit
//!   token fence deadline-ms granted-ms`, one leaving (the key keeping
//!   others) as `LOCK._DROP key token`; a shared key made, or its mode
//!   changed, whole as `LOCK._SHARED`
//!
//! Unless nothing can receive effects: see `propagation`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use redis_module::raw;

use super::datatype::{self, LockValue};
use super::ffi::{self, Ctx, OpenKey, RString, Read, Write};
use super::propagation;
use super::server;
use crate::core::args;
use crate::core::error::LockError;
use crate::core::protocol::command;
use crate::core::time::{self, Now};
use crate::core::{holders, Lock, LockRead, LockStore, Mode};

/// Set while this node replaces or deletes a lock through a [`LockKey`]:
/// Redis calls the type's unlink callback inside that write, and the node
/// looks at the key's waiters itself after every write it decides (the
/// model test runs the node with no unlink callback at all), so the
/// callback has nothing to queue. Redis's main thread only.
static NODE_WRITING: AtomicBool = AtomicBool::new(false);

/// Whether the lock being unlinked is one this node is replacing or
/// deleting now (see [`NODE_WRITING`]), not one a user's command removed.
pub fn node_is_writing() -> bool {
    NODE_WRITING.load(Relaxed)
}

/// Runs `write` (a replace or delete the node decided) flagged as such;
/// the flag drops with it, a panic included.
fn as_node_write<R>(write: impl FnOnce() -> R) -> R {
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            NODE_WRITING.store(false, Relaxed);
        }
    }
    NODE_WRITING.store(true, Relaxed);
    let _done = Done;
    write()
}

/// Fault injection, for tests only: with `REDIS_LOCK_PANIC_ON_WRITE=n:key`
/// in the server's environment, the `n`-th write (put, renew or delete) of
/// the lock at `key` panics, once: a decision cut short in a running
/// server. With `REDIS_LOCK_PANIC_ON_REPLICATE=n:key`, the `n`-th
/// replication of that key panics, once: what was decided cut short while
/// it is carried out (`tests/blocking.rs`). Read at the first write or
/// replication; nothing is compared unless it is set.
struct InjectedPanic {
    left: AtomicU64,
    key: Box<[u8]>,
}

static PANIC_ON_WRITE: OnceLock<Option<InjectedPanic>> = OnceLock::new();
static PANIC_ON_REPLICATE: OnceLock<Option<InjectedPanic>> = OnceLock::new();

#[inline] // on every write: one load when no fault is set
fn fault_point(name: RString) {
    hit_if_set(&PANIC_ON_WRITE, "REDIS_LOCK_PANIC_ON_WRITE", name);
}

#[inline]
fn hit_if_set(slot: &'static OnceLock<Option<InjectedPanic>>, var: &'static str, name: RString) {
    let fault = match slot.get() {
        Some(fault) => fault,
        None => read_fault(slot, var),
    };
    if let Some(fault) = fault {
        fault.hit(name, var);
    }
}

#[cold]
fn read_fault(
    slot: &'static OnceLock<Option<InjectedPanic>>,
    var: &'static str,
) -> &'static Option<InjectedPanic> {
    slot.get_or_init(|| {
        let spec = std::env::var(var).ok()?;
        let (n, key) = spec.split_once(':')?;
        Some(InjectedPanic {
            left: AtomicU64::new(n.parse().ok()?),
            key: key.as_bytes().into(),
        })
    })
}

impl InjectedPanic {
    #[cold]
    fn hit(&self, name: RString, var: &str) {
        if ffi::string_copy(name) == self.key && self.left.fetch_sub(1, Relaxed) == 1 {
            panic!("{var}: injected");
        }
    }
}

/// A key open for writing, seen as a [`LockStore`].
pub struct LockKey {
    ctx: Ctx,
    name: RString,
    key: OpenKey<Write>,
    /// The key's lock, while the key is open and holds it.
    value: Option<LockValue>,
    /// Stores locks from outside (see [`LockKey::open_from_outside`]).
    from_outside: bool,
}

/// A key open for reading only (`LOCK.FENCE`, `LOCK.INFO`), seen as a
/// [`LockRead`]: it cannot be written through.
pub struct ReadKey {
    /// None: the key does not exist.
    key: Option<OpenKey<Read>>,
    value: Option<LockValue>,
}

impl ReadKey {
    /// Opens `name` for reading. A key of another type is a WRONGTYPE error.
    pub fn open(ctx: Ctx, name: RString) -> Result<Self, LockError> {
        Self::of(OpenKey::<Read>::open(ctx, name))
    }

    /// A key opened for reading already (None: it does not exist), read as
    /// a lock: one open for a command that first looks at what the key is.
    pub fn of(key: Option<OpenKey<Read>>) -> Result<Self, LockError> {
        let value = match &key {
            Some(k) => datatype::value_of(k.key())?,
            None => None,
        };
        Ok(ReadKey { key, value })
    }
}

// The value lives while the key is open (`key`) and unchanged: no write
// can happen through a read-only open.
impl LockRead for ReadKey {
    fn mode(&self) -> Option<Mode> {
        debug_assert!(self.value.is_none() || self.key.is_some());
        self.value.as_ref().map(LockValue::mode)
    }
    fn holder_at(&self, i: usize) -> Option<Lock<'_>> {
        self.value.as_ref()?.holder_at(i)
    }
}

impl LockKey {
    /// Opens `name` for writing. A key of another type is a WRONGTYPE error
    /// and is left untouched.
    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    pub fn open(ctx: Ctx, name: RString) -> Result<Self, LockError> {
        // A write open gets a handle for a missing key too.
        // (Not `ok_or`, which builds and drops the error on every open.)
        let Some(key) = OpenKey::<Write>::open(ctx, name) else {
            return Err(LockError::Internal);
        };
        let value = datatype::value_of(key.key())?;
        Ok(LockKey {
            ctx,
            name,
            key,
            value,
            from_outside: false,
        })
    }

    /// Opens `name` to store a lock from outside (`LOCK._SET` from the
    /// master or the AOF): what is stored is marked so (it may carry an
    /// earlier build's expiry: see `datatype::FROM_OUTSIDE`), and nothing
    /// of this node's is dropped or replicated on the way.
    pub fn open_from_outside(ctx: Ctx, name: RString) -> Result<Self, LockError> {
        Ok(LockKey {
            from_outside: true,
            ..Self::open(ctx, name)?
        })
    }

    /// A key written by a build that gave lock keys a Redis expiry equal to
    /// the lease's deadline keeps it until it is renewed or swept: drop it
    /// then (replicated as PERSIST), so Redis never cuts a renewed lease
    /// short. An expiry at another time is a user's administrative delete
    /// and stays.
    /// Only a value that came from outside can carry one; this build looks
    /// once (an expiry set later, on a lock renewed here, is a user's).
    pub fn drop_legacy_expiry(&mut self, now: impl FnOnce() -> Now) {
        let Some(value) = self.value.as_mut().filter(|v| v.is_from_outside()) else {
            return;
        };
        let now = now();
        value.set_from_outside(false);
        let Some(lock) = self.value.as_ref().and_then(LockValue::exclusive) else {
            return;
        };
        let expiry_ms = self.key.key().abs_expire();
        if !time::is_earlier_builds_expiry(expiry_ms, lock.deadline_ms, now) {
            return;
        }
        self.key.set_expire(raw::REDISMODULE_NO_EXPIRE as i64);
        if propagation::effects_needed() {
            ffi::replicate_key_command(self.ctx, c"PERSIST", self.name);
        } else {
            count_write(self.ctx);
        }
    }

    /// A write by this node: an earlier build's expiry goes first.
    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    fn before_write(&mut self) {
        // Only a value from outside can carry one: a look, then the call.
        if !self.from_outside && self.value.as_ref().is_some_and(|v| v.is_from_outside()) {
            self.drop_legacy_expiry(server::conversion_now);
        }
    }

    fn signal_modified(&self) {
        ffi::signal_modified_key(self.ctx, self.name);
    }

    /// A write that replaces or deletes the key's value: the node's own
    /// (see [`NODE_WRITING`]), unless it stores a lock from outside, which
    /// no decision of this node's follows.
    /// (A function of the fields, so a view of the old value may be read
    /// by `write` before the value goes.)
    fn replace_value<R>(
        key: &OpenKey<Write>,
        from_outside: bool,
        write: impl FnOnce(&OpenKey<Write>) -> R,
    ) -> R {
        match from_outside {
            true => write(key),
            false => as_node_write(|| write(key)),
        }
    }

    /// Replicates the key as it is now (`Output::Changed`).
    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    pub fn replicate(&self, now: impl FnOnce() -> Now) {
        replicate(self.ctx, self.name, self, now);
    }

    /// Replicates its holder with lease id `lease` (`Output::Holder`).
    pub fn replicate_holder(&self, lease: u64, now: impl FnOnce() -> Now) {
        replicate_holder(self.ctx, self.name, self, lease, now);
    }

    /// Replicates that `token` left it (`Output::HolderLeft`).
    pub fn replicate_drop(&self, token: &[u8]) {
        replicate_drop(self.ctx, self.name, token);
    }
}

/// Replicates key `name` (in the context's selected db) as an absolute
/// effect: `LOCK._SET key token fence deadline-ms granted-ms` for an
/// exclusive lock, `LOCK._SHARED key limit token fence deadline-ms
/// granted-ms ...` for a shared one (every holder), all times on the wall
/// clock converted at `now` (asked only then); `DEL key` for none. When
/// nothing can receive effects (see `propagation`) the write is only
/// counted, for RDB save points.
#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub fn replicate(ctx: Ctx, name: RString, key: &impl LockRead, now: impl FnOnce() -> Now) {
    hit_if_set(&PANIC_ON_REPLICATE, "REDIS_LOCK_PANIC_ON_REPLICATE", name);
    if !propagation::effects_needed() {
        return count_write(ctx);
    }
    let now = now();
    let wall = |l: &Lock<'_>| time::wall_times(l.deadline_ms, l.granted_ms, now);
    match key.mode() {
        None => ffi::replicate_key_command(ctx, c"DEL", name),
        Some(Mode::Exclusive) => {
            let Some(lock) = key.holder_at(0) else {
                return ffi::replicate_key_command(ctx, c"DEL", name);
            };
            let times = wall(&lock);
            ffi::replicate_lock_set(ctx, name, lock.token, lock.fence, times, lock.value);
        }
        Some(mode) => {
            let holders: Vec<(&[u8], i64, i64, i64)> = holders(key)
                .map(|l| {
                    let (deadline_ms, granted_ms) = wall(&l);
                    (l.token, l.fence, deadline_ms, granted_ms)
                })
                .collect();
            let words = args::shared_set_args(mode, &holders);
            ffi::replicate_words(ctx, command::SET_SHARED_C, name, &words);
        }
    }
}

/// Replicates one holder of key `name`, a shared key: the one with lease
/// id `lease`, as `LOCK._HOLD key limit token fence deadline-ms
/// granted-ms` (none: a later change of the decision replaced or removed
/// it, and replicates itself). A key no longer shared goes whole.
pub fn replicate_holder(
    ctx: Ctx,
    name: RString,
    key: &impl LockRead,
    lease: u64,
    now: impl FnOnce() -> Now,
) {
    hit_if_set(&PANIC_ON_REPLICATE, "REDIS_LOCK_PANIC_ON_REPLICATE", name);
    if !propagation::effects_needed() {
        return count_write(ctx);
    }
    let now = now();
    let Some(mode @ Mode::Shared { .. }) = key.mode() else {
        return replicate(ctx, name, key, || now);
    };
    let Some(lock) = holders(key).find(|l| l.lease == lease) else {
        return;
    };
    let (deadline_ms, granted_ms) = time::wall_times(lock.deadline_ms, lock.granted_ms, now);
    let words = args::shared_set_args(mode, &[(lock.token, lock.fence, deadline_ms, granted_ms)]);
    ffi::replicate_words(ctx, command::HOLD_C, name, &words);
}

/// Replicates `LOCK._DROP key token`: that holder left the shared key.
pub fn replicate_drop(ctx: Ctx, name: RString, token: &[u8]) {
    hit_if_set(&PANIC_ON_REPLICATE, "REDIS_LOCK_PANIC_ON_REPLICATE", name);
    if !propagation::effects_needed() {
        return count_write(ctx);
    }
    ffi::replicate_words(ctx, command::DROP_C, name, &[token.to_vec()]);
}

/// Counts a write for RDB save points without propagating anything:
/// RM_ReplicateVerbatim does exactly that when Redis has nowhere to
/// propagate to.
fn count_write(ctx: Ctx) {
    ffi::replicate_verbatim(ctx);
}

impl LockKey {
    fn delete(&mut self) {
        if self.value.is_none() {
            return;
        }
        fault_point(self.name);
        Self::replace_value(&self.key, self.from_outside, OpenKey::delete);
        self.value = None;
        self.signal_modified();
    }
}

impl LockRead for LockKey {
    fn mode(&self) -> Option<Mode> {
        // The value lives as long as the key holds it: at least while this
        // store has the key open and has not replaced or deleted it.
        self.value.as_ref().map(LockValue::mode)
    }
    fn holder_at(&self, i: usize) -> Option<Lock<'_>> {
        self.value.as_ref()?.holder_at(i)
    }
}

/// A plain store: the node says what each write means (`core::output`).
/// Every write signals the key as modified (WATCH, client-side caching).
impl LockStore for LockKey {
    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    fn put(&mut self, mode: Mode, lock: Lock<'_>) {
        fault_point(self.name);
        self.before_write();
        let from_outside = self.from_outside;
        match &mut self.value {
            // Same token and value, exclusive: update in place, no
            // allocation.
            Some(current)
                if !mode.is_shared()
                    && current
                        .exclusive()
                        .is_some_and(|l| l.token == lock.token && l.value == lock.value) =>
            {
                current.set(lock.fence, lock.deadline_ms, lock.granted_ms, lock.lease);
                if from_outside {
                    current.set_from_outside(true);
                }
            }
            // Redis frees the block this replaces (if any): its handle
            // goes with it.
            _ if mode.is_shared() => {
                let value = Self::replace_value(&self.key, self.from_outside, |key| {
                    datatype::store_shared(key, mode, std::iter::once(lock))
                });
                self.value = Some(value);
            }
            _ => {
                let value = Self::replace_value(&self.key, from_outside, |key| {
                    datatype::store(key, lock, from_outside)
                });
                self.value = Some(value);
            }
        }
        self.signal_modified();
    }

    fn add(&mut self, lock: Lock<'_>) {
        fault_point(self.name);
        if let Some(value) = &mut self.value {
            value.add(lock);
            self.signal_modified();
        }
    }

    #[inline] // on every EXTEND, into the node's ledger
    fn renew(&mut self, token: &[u8], deadline_ms: i64, lease: u64) {
        let Some(value) = &self.value else {
            return;
        };
        // The node renews only a holder it found (`core::output::Recorder`
        // looks first): an exclusive lock's one holder is not compared
        // again (this runs on every EXTEND); a shared one is found by its
        // token.
        debug_assert!(value.has_holder(token));
        fault_point(self.name);
        self.before_write();
        if let Some(value) = &mut self.value {
            value.renew(token, deadline_ms, lease);
        }
        self.signal_modified();
    }

    fn set_mode(&mut self, mode: Mode) {
        fault_point(self.name);
        let Some(value) = &mut self.value else {
            return;
        };
        match value.exclusive() {
            // A downgrade: the holder moves to a shared block.
            Some(lock) if mode.is_shared() => {
                let value = Self::replace_value(&self.key, self.from_outside, |key| {
                    datatype::store_shared(key, mode, std::iter::once(lock))
                });
                self.value = Some(value);
            }
            Some(_) => return,
            None => value.set_shared_mode(mode),
        }
        self.signal_modified();
    }

    fn remove(&mut self, token: &[u8]) {
        let Some(value) = &self.value else {
            return;
        };
        if !value.has_holder(token) {
            return;
        }
        if value.mode() == Mode::Exclusive {
            return self.delete();
        }
        fault_point(self.name);
        let value = self.value.as_mut().expect("checked above");
        match value.remove_shared(token) {
            0 => self.delete(),
            _ => self.signal_modified(),
        }
    }
}
