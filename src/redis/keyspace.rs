//! A key of the keyspace, seen by the engine as a `LockStore`.
//!
//! A lock key carries no Redis expiry: the lease is the module's (on the
//! monotonic clock; see `core::time`), and the module reclaims ended locks
//! itself (`core::node::Node::reclaim`, the `sweep`). Every change signals
//! the key as modified (WATCH, client-side caching: only real changes do, as
//! the module sets NO_IMPLICIT_SIGNAL_MODIFIED), and is replicated as an
//! absolute effect, never as the relative command:
//! * a grant or renewal as `LOCK._SET key token fence deadline-ms granted-ms`,
//!   the deadline on the wall clock
//! * a release, take-back or reclamation as `DEL key`
//!
//! Unless nothing can receive effects: see `propagation`.

use redis_module::raw;

use super::datatype::{self, LockValue};
use super::ffi::{self, lock_events, notify_lock_event, Ctx, OpenKey, RString, Read, Write};
use super::node::{self, new_lease};
use super::propagation;
use crate::core::error::LockError;
use crate::core::time::{self, Now};
use crate::core::{Lock, LockRead, LockStore, Removal};

/// How close a Redis expiry must be to the lease's end to be an earlier
/// build's (see `drop_legacy_expiry`).
pub const LEGACY_SLACK_MS: i64 = 10;

/// Whether a key's Redis expiry (Unix ms; negative: none) is an earlier
/// build's: equal to the lease's end, within [`LEGACY_SLACK_MS`]. One rule
/// for a renewal and the sweep.
pub fn is_legacy_expiry(expiry_ms: i64, lock: &Lock<'_>, now: Now) -> bool {
    expiry_ms >= 0
        && (expiry_ms - time::wall_deadline(lock.deadline_ms, now)).abs() <= LEGACY_SLACK_MS
}

/// A key open for writing, seen as a [`LockStore`].
pub struct LockKey {
    ctx: Ctx,
    name: RString,
    key: OpenKey<Write>,
    /// The key's lock, while the key is open and holds it.
    value: Option<LockValue>,
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
        let key = OpenKey::<Read>::open(ctx, name);
        let value = match &key {
            Some(k) => datatype::value_of(k.key())?,
            None => None,
        };
        Ok(ReadKey { key, value })
    }
}

impl LockRead for ReadKey {
    fn stored(&self) -> Option<Lock<'_>> {
        // The block lives while the key is open (`key`) and unchanged: no
        // write can happen through a read-only open.
        debug_assert!(self.value.is_none() || self.key.is_some());
        self.value.as_ref().map(LockValue::view)
    }
}

impl LockKey {
    /// Opens `name` for writing. A key of another type is a WRONGTYPE error
    /// and is left untouched.
    pub fn open(ctx: Ctx, name: RString) -> Result<Self, LockError> {
        // A write open gets a handle for a missing key too.
        let key = OpenKey::<Write>::open(ctx, name).ok_or(LockError::Internal)?;
        let value = datatype::value_of(key.key())?;
        Ok(LockKey {
            ctx,
            name,
            key,
            value,
        })
    }

    /// Stores a lock under the key, without replicating or reporting (a
    /// replicated or AOF effect, through `LockStore::apply`, and every
    /// write of `put`). `deadline_ms` is on this node's monotonic clock.
    /// `from_outside`: the lock came from the master or the AOF (it may
    /// carry an earlier build's expiry: see `datatype::FROM_OUTSIDE`).
    fn store_value(
        &mut self,
        token: &[u8],
        fence: i64,
        deadline_ms: i64,
        granted_ms: Option<i64>,
        from_outside: bool,
    ) {
        let lease = new_lease();
        match &mut self.value {
            // Same token: update in place, no allocation.
            Some(current) if current.view().token == token => {
                current.set(fence, deadline_ms, granted_ms, lease);
                if from_outside {
                    current.set_from_outside(true);
                }
            }
            _ => {
                let lock = Lock {
                    fence,
                    deadline_ms,
                    token,
                    granted_ms,
                    lease,
                };
                // Redis frees the block this replaces (if any): its handle
                // goes with it.
                self.value = Some(datatype::store(&self.key, lock, from_outside));
            }
        }
        self.signal_modified();
    }

    /// A key written by a build that gave lock keys a Redis expiry equal to
    /// the lease's deadline keeps it until it is renewed or swept: drop it
    /// then (replicated as PERSIST), so Redis never cuts a renewed lease
    /// short. An expiry at another time is a user's administrative delete
    /// and stays.
    /// Only a value that came from outside can carry one; this build looks
    /// once (an expiry set later, on a lock renewed here, is a user's).
    pub fn drop_legacy_expiry(&mut self, now: Now) {
        let Some(value) = self.value.as_mut().filter(|v| v.is_from_outside()) else {
            return;
        };
        value.set_from_outside(false);
        let Some(lock) = self.stored() else {
            return;
        };
        if !is_legacy_expiry(self.key.key().abs_expire(), &lock, now) {
            return;
        }
        self.key.set_expire(raw::REDISMODULE_NO_EXPIRE as i64);
        if propagation::effects_needed() {
            ffi::replicate_key_command(self.ctx, c"PERSIST", self.name);
        } else {
            self.count_write();
        }
    }

    /// Nothing can receive an effect now (see `propagation`): only count the
    /// write for RDB save points. RM_ReplicateVerbatim does exactly that
    /// when Redis has nowhere to propagate to.
    fn count_write(&self) {
        ffi::replicate_verbatim(self.ctx);
    }

    fn signal_modified(&self) {
        ffi::signal_modified_key(self.ctx, self.name);
    }

    /// Replicates the lock as `LOCK._SET key token fence deadline-ms
    /// granted-ms`, both on the wall clock, converted at `now`.
    fn replicate_set(&self, now: Now) {
        let Some(lock) = self.stored() else {
            return;
        };
        if !propagation::effects_needed() {
            return self.count_write();
        }
        let (deadline_ms, granted_ms) = time::wall_times(lock.deadline_ms, lock.granted_ms, now);
        ffi::replicate_lock_set(
            self.ctx,
            self.name,
            lock.token,
            lock.fence,
            deadline_ms,
            granted_ms,
        );
    }
}

impl LockRead for LockKey {
    fn stored(&self) -> Option<Lock<'_>> {
        // The block lives as long as the key holds it: at least while this
        // store has the key open and has not replaced or deleted it.
        self.value.as_ref().map(LockValue::view)
    }
}

impl LockStore for LockKey {
    fn put(
        &mut self,
        token: &[u8],
        fence: i64,
        deadline_ms: i64,
        granted_ms: Option<i64>,
        replaces_ended: bool,
    ) {
        let now = node::conversion_now();
        if replaces_ended {
            if let Some(ended) = self.stored() {
                node::lease_ended(&ended);
            }
            notify_lock_event(self.ctx, lock_events::EXPIRE, self.name);
        } else {
            self.drop_legacy_expiry(now);
        }
        self.store_value(token, fence, deadline_ms, granted_ms, false);
        self.replicate_set(now);
    }

    fn apply(&mut self, token: &[u8], fence: i64, deadline_ms: i64, granted_ms: Option<i64>) {
        self.store_value(token, fence, deadline_ms, granted_ms, true);
    }

    fn renew(&mut self, deadline_ms: i64) {
        let now = node::conversion_now();
        self.drop_legacy_expiry(now);
        if let Some(value) = &mut self.value {
            let lock = value.view();
            let (fence, granted_ms) = (lock.fence, lock.granted_ms);
            value.set(fence, deadline_ms, granted_ms, new_lease());
            self.signal_modified();
            self.replicate_set(now);
        }
    }

    fn remove(&mut self, why: Removal) {
        let Some(lock) = self.stored() else {
            return;
        };
        match why {
            Removal::Released | Removal::TakenBack => node::lease_released(&lock, node::mono_ms()),
            Removal::Ended => node::lease_ended(&lock),
        }
        self.key.delete();
        self.value = None;
        self.signal_modified();
        if why == Removal::Ended {
            notify_lock_event(self.ctx, lock_events::EXPIRE, self.name);
        }
        if propagation::effects_needed() {
            ffi::replicate_key_command(self.ctx, c"DEL", self.name);
        } else {
            self.count_write();
        }
    }
}
