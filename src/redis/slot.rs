//! A key of the keyspace, seen by the engine as a `LockSlot`.
//!
//! Every change is written with the key's Redis expiry set to the lease's
//! deadline (so Redis reclaims ended locks like any expired key) and is
//! replicated as an absolute effect, never as the relative command:
//! * a grant or renewal as `LOCK._SET key token fence deadline-ms`
//! * a release as `DEL key`

use std::ptr::{self, NonNull};

use redis_module::raw;

use super::datatype::{self, LOCK_TYPE};
use super::ffi::{api, Ctx, RString};
use crate::core::error::LockError;
use crate::core::lock::{Lock, LockSlot};

pub struct RedisSlot {
    ctx: Ctx,
    name: RString,
    key: NonNull<raw::RedisModuleKey>,
    value: *mut Lock,
}

impl RedisSlot {
    /// Opens `name` for writing, or for reading only. A key of another type
    /// is a WRONGTYPE error and is left untouched.
    pub fn open(ctx: Ctx, name: RString, write: bool) -> Result<Self, LockError> {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        let key = unsafe { api!(RedisModule_OpenKey)(ctx, name, mode as i32) };
        // A read-only open of a missing key returns NULL.
        let Some(key) = NonNull::new(key.cast::<raw::RedisModuleKey>()) else {
            return Ok(RedisSlot::absent(ctx, name));
        };
        let mut slot = RedisSlot {
            ctx,
            name,
            key,
            value: ptr::null_mut(),
        };
        slot.value = datatype::value_of(key.as_ptr())?;
        Ok(slot)
    }

    fn absent(ctx: Ctx, name: RString) -> Self {
        RedisSlot {
            ctx,
            name,
            key: NonNull::dangling(),
            value: ptr::null_mut(),
        }
    }

    fn is_open(&self) -> bool {
        self.key != NonNull::dangling()
    }

    /// Stores `lock` under the key with its expiry, without replicating:
    /// used directly when applying a replicated or AOF effect.
    pub fn write(&mut self, lock: Lock) {
        let deadline_ms = lock.deadline_ms;
        if let Some(current) = unsafe { self.value.as_mut() } {
            if current.token == lock.token {
                // Same token: update in place, no allocation. (A different
                // value would be freed, and counted there if it had expired.)
                if !current.is_live(super::node::now_ms()) {
                    super::node::count(&super::node::STATS.expirations);
                }
                current.fence = lock.fence;
                current.deadline_ms = deadline_ms;
                self.set_expiry(deadline_ms);
                return;
            }
        }
        let value = datatype::new_value(lock);
        unsafe {
            api!(RedisModule_ModuleTypeSetValue)(self.key.as_ptr(), LOCK_TYPE.get(), value.cast())
        };
        self.value = value;
        self.set_expiry(deadline_ms);
    }

    fn set_expiry(&self, deadline_ms: i64) {
        unsafe { api!(RedisModule_SetAbsExpire)(self.key.as_ptr(), deadline_ms) };
    }

    fn replicate_set(&self) {
        let Some(lock) = (unsafe { self.value.as_ref() }) else {
            return;
        };
        unsafe {
            api!(RedisModule_Replicate)(
                self.ctx,
                c"LOCK._SET".as_ptr(),
                c"sbll".as_ptr(),
                self.name,
                lock.token.as_ptr(),
                lock.token.len(),
                lock.fence,
                lock.deadline_ms,
            )
        };
    }
}

impl LockSlot for RedisSlot {
    fn stored(&self) -> Option<&Lock> {
        unsafe { self.value.as_ref() }
    }

    fn put(&mut self, lock: Lock) {
        self.write(lock);
        self.replicate_set();
    }

    fn renew(&mut self, deadline_ms: i64) {
        if let Some(lock) = unsafe { self.value.as_mut() } {
            lock.deadline_ms = deadline_ms;
            self.set_expiry(deadline_ms);
            self.replicate_set();
        }
    }

    fn remove(&mut self) {
        if self.value.is_null() {
            return;
        }
        unsafe {
            api!(RedisModule_DeleteKey)(self.key.as_ptr());
            api!(RedisModule_Replicate)(self.ctx, c"DEL".as_ptr(), c"s".as_ptr(), self.name);
        }
        self.value = ptr::null_mut();
    }
}

impl Drop for RedisSlot {
    fn drop(&mut self) {
        if self.is_open() {
            unsafe { api!(RedisModule_CloseKey)(self.key.as_ptr()) };
        }
    }
}
