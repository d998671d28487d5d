//! A key of the keyspace, seen by the engine as a `LockSlot`.
//!
//! Every change is written with the key's Redis expiry set to the lease's
//! deadline (so Redis reclaims ended locks like any expired key), signals
//! the key as modified (WATCH, client-side caching: only real changes do, as
//! the module sets NO_IMPLICIT_SIGNAL_MODIFIED), and is replicated as an
//! absolute effect, never as the relative command:
//! * a grant or renewal as `LOCK._SET key token fence deadline-ms granted-ms`
//! * a release as `DEL key`
//!
//! Unless nothing can receive effects: see `propagation`.

use std::ptr::{self, NonNull};

use redis_module::raw;

use super::datatype::{self, LockBlock, LOCK_TYPE};
use super::ffi::{api, Ctx, RString};
use super::node::new_lease;
use super::propagation;
use crate::core::error::LockError;
use crate::core::lock::{Lock, LockSlot};

pub struct LockKey {
    ctx: Ctx,
    name: RString,
    key: NonNull<raw::RedisModuleKey>,
    value: *mut LockBlock,
}

impl LockKey {
    /// Opens `name` for writing, or for reading only. A key of another type
    /// is a WRONGTYPE error and is left untouched.
    pub fn open(ctx: Ctx, name: RString, write: bool) -> Result<Self, LockError> {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        Self::open_mode(ctx, name, mode)
    }

    /// Reads a key the user touched, for the module's own bookkeeping
    /// (keyspace events): without counting as an access, so RESTORE's
    /// IDLETIME/FREQ and the key's LRU/LFU stay as the user left them.
    pub fn peek(ctx: Ctx, name: RString) -> Result<Self, LockError> {
        Self::open_mode(
            ctx,
            name,
            raw::REDISMODULE_READ | raw::REDISMODULE_OPEN_KEY_NOTOUCH,
        )
    }

    fn open_mode(ctx: Ctx, name: RString, mode: u32) -> Result<Self, LockError> {
        let key = unsafe { api!(RedisModule_OpenKey)(ctx, name, mode as i32) };
        // A read-only open of a missing key returns NULL.
        let Some(key) = NonNull::new(key.cast::<raw::RedisModuleKey>()) else {
            return Ok(LockKey {
                ctx,
                name,
                key: NonNull::dangling(),
                value: ptr::null_mut(),
            });
        };
        let mut slot = LockKey {
            ctx,
            name,
            key,
            value: ptr::null_mut(),
        };
        slot.value = datatype::value_of(key.as_ptr())?;
        Ok(slot)
    }

    fn is_open(&self) -> bool {
        self.key != NonNull::dangling()
    }

    /// Stores `lock` under the key with its expiry, without replicating:
    /// used directly when applying a replicated or AOF effect.
    pub fn write(&mut self, token: &[u8], fence: i64, deadline_ms: i64, granted_ms: i64) {
        let lease = new_lease();
        match self.stored() {
            // Same token: update in place, no allocation. (A different value
            // is freed, and counted there if it had expired.)
            Some(current) if current.token == token => {
                if !current.is_live(super::node::now_ms()) {
                    super::node::lease_ended(&current);
                }
                unsafe { LockBlock::set(self.value, fence, deadline_ms, granted_ms, lease) };
            }
            _ => {
                let value = LockBlock::new(Lock {
                    fence,
                    deadline_ms,
                    token,
                    granted_ms,
                    lease,
                });
                unsafe {
                    api!(RedisModule_ModuleTypeSetValue)(
                        self.key.as_ptr(),
                        LOCK_TYPE.get(),
                        value.cast(),
                    )
                };
                self.value = value;
            }
        }
        self.set_expiry(deadline_ms);
        self.signal_modified();
    }

    /// Makes the key's Redis expiry equal the lease's deadline again (after
    /// EXPIRE, PERSIST or RESTORE changed it), or removes a lock whose lease
    /// has ended. Replicated like any change. True if it changed anything.
    pub fn restore_expiry(&mut self, now_ms: i64) -> bool {
        let Some(lock) = self.stored() else {
            return false;
        };
        if !lock.is_live(now_ms) {
            self.remove();
            return true;
        }
        let expiry = unsafe { api!(RedisModule_GetAbsExpire)(self.key.as_ptr()) };
        if expiry == lock.deadline_ms {
            return false;
        }
        self.set_expiry(lock.deadline_ms);
        self.replicate_set();
        true
    }

    /// Nothing can receive an effect now (see `propagation`): only count the
    /// write for RDB save points. RM_ReplicateVerbatim does exactly that
    /// when Redis has nowhere to propagate to.
    fn count_write(&self) {
        unsafe { api!(RedisModule_ReplicateVerbatim)(self.ctx) };
    }

    fn set_expiry(&self, deadline_ms: i64) {
        unsafe { api!(RedisModule_SetAbsExpire)(self.key.as_ptr(), deadline_ms) };
    }

    fn signal_modified(&self) {
        unsafe { api!(RedisModule_SignalModifiedKey)(self.ctx, self.name) };
    }

    fn replicate_set(&self) {
        let Some(lock) = self.stored() else {
            return;
        };
        if !propagation::effects_needed() {
            return self.count_write();
        }
        unsafe {
            api!(RedisModule_Replicate)(
                self.ctx,
                c"LOCK._SET".as_ptr(),
                c"sblll".as_ptr(),
                self.name,
                lock.token.as_ptr(),
                lock.token.len(),
                lock.fence,
                lock.deadline_ms,
                lock.granted_ms,
            )
        };
    }
}

impl LockSlot for LockKey {
    fn stored(&self) -> Option<Lock<'_>> {
        if self.value.is_null() {
            return None;
        }
        // The block lives as long as the key holds it: at least while this
        // slot has the key open and has not replaced or deleted it.
        Some(unsafe { LockBlock::view(self.value) })
    }

    fn put(&mut self, token: &[u8], fence: i64, deadline_ms: i64, granted_ms: i64) {
        // A lease that ended but whose key Redis has not expired yet (its
        // expiry is strict: at the deadline millisecond the key is still
        // there) is replaced here: say so, as Redis's expiry would have.
        if self
            .stored()
            .is_some_and(|held| !held.is_live(super::node::now_ms()))
        {
            super::ffi::notify_lock_event(self.ctx, super::ffi::lock_events::EXPIRE, self.name);
        }
        self.write(token, fence, deadline_ms, granted_ms);
        self.replicate_set();
    }

    fn renew(&mut self, deadline_ms: i64) {
        if let Some(lock) = self.stored() {
            let (fence, granted_ms) = (lock.fence, lock.granted_ms);
            unsafe { LockBlock::set(self.value, fence, deadline_ms, granted_ms, new_lease()) };
            self.set_expiry(deadline_ms);
            self.signal_modified();
            self.replicate_set();
        }
    }

    fn remove(&mut self) {
        if self.value.is_null() {
            return;
        }
        let lock = unsafe { LockBlock::view(self.value) };
        let now_ms = super::node::now_ms();
        let live = lock.is_live(now_ms);
        if live && lock.granted_ms > 0 {
            super::node::record_hold(now_ms - lock.granted_ms);
        }
        // The free callback need not read the clock to decide whether a
        // lease ran out.
        datatype::RELEASING_LIVE_LOCK.set(live);
        datatype::MODULE_REMOVING.set(true);
        unsafe { api!(RedisModule_DeleteKey)(self.key.as_ptr()) };
        datatype::MODULE_REMOVING.set(false);
        datatype::RELEASING_LIVE_LOCK.set(false);
        self.signal_modified();
        if propagation::effects_needed() {
            unsafe {
                api!(RedisModule_Replicate)(self.ctx, c"DEL".as_ptr(), c"s".as_ptr(), self.name)
            };
        } else {
            self.count_write();
        }
        self.value = ptr::null_mut();
    }
}

impl Drop for LockKey {
    fn drop(&mut self) {
        if self.is_open() {
            unsafe { api!(RedisModule_CloseKey)(self.key.as_ptr()) };
        }
    }
}
