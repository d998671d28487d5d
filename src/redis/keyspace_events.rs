//! Bookkeeping for lock keys that Redis changes behind the module's back:
//! a lock key leaving the keyspace (the type's unlink2 callback), Redis
//! expiring one (its `expired` event, for `lock.expire`), and a user's
//! EXPIRE, PERSIST or RESTORE changing its Redis expiry. Nothing here
//! enters the engine or writes: inputs go to the timer's inbox.

use std::os::raw::c_void;
use std::sync::{Mutex, MutexGuard};

use redis_module::raw;

use super::datatype::{LockBlock, MODULE_REMOVING};
use super::engine::{self, Key};
use super::ffi::{api, guard, lock_events_on, string_bytes, Ctx};
use super::node;
use super::timer;

fn locked<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Type callback: a lock key left the keyspace (DEL, UNLINK, overwrite,
/// expiry, eviction, MOVE, RENAME). It may run inside the engine (a grant
/// that replaces an ended lock frees the old value): it only queues.
pub extern "C" fn on_unlink(opt: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    guard("unlink", (), || {
        // Only a lock whose lease ended can be leaving by expiry.
        let events = lock_events_on()
            && !MODULE_REMOVING.get()
            && !value.is_null()
            && !unsafe { LockBlock::view(value.cast()) }.is_live(node::now_ms());
        if engine::waiters_total() == 0 && !events {
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
        if engine::waiters_total() > 0 {
            timer::queue(|inbox| inbox.changed.push(key));
        }
    })
}

/// The last lock key that left the keyspace after its lease ended, while
/// lock events are on: Redis sends `expired` right after it deletes an
/// expired key, when its type can no longer be read. Any other keyspace
/// event clears it (`forget_unlinked`), so a later key of another type
/// with the same name is never taken for a lock.
static LAST_UNLINKED: Mutex<Option<Key>> = Mutex::new(None);

pub fn forget_unlinked() {
    if lock_events_on() {
        *locked(&LAST_UNLINKED) = None;
    }
}

/// Whether the key Redis just expired (`expired` event for `name`) was a
/// lock; it then gets a `lock.expire` event.
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

/// A lock key's Redis expiry may have been changed by EXPIRE, PERSIST or
/// RESTORE: make it follow the lease again (from the timer: a keyspace
/// event cannot write on Redis 7.0).
pub fn expiry_changed(key: Key) {
    timer::queue(|inbox| inbox.expiry.push(key));
}
