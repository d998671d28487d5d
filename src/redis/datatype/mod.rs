//! The `redislock` data type and its persistence format.
//!
//! ## RDB value, encoding version 4
//! | field       | RDB call            | meaning                              |
//! |-------------|---------------------|--------------------------------------|
//! | mode        | SaveSigned          | 0 exclusive, -1 shared, n ≥ 1 shared with LIMIT n |
//! | count       | SaveSigned          | holders that follow: 1 when exclusive, 1 to 2^20 when shared |
//!
//! then, for each holder (distinct tokens):
//!
//! | field       | RDB call            | meaning                              |
//! |-------------|---------------------|--------------------------------------|
//! | token       | SaveStringBuffer    | holder token, 1–512 bytes            |
//! | fence       | SaveSigned          | fencing token of this grant, > 0     |
//! | deadline_ms | SaveSigned          | absolute end of the lease, Unix ms (wall clock) |
//! | granted_ms  | SaveSigned          | when this holder was granted, Unix ms (0 ≤ it ≤ deadline_ms; 0: unknown) |
//! | value       | SaveStringBuffer    | the holder's public value, 0–16384 bytes (empty: none; always none for a shared key's holders) |
//!
//! Both times are converted from the monotonic clock at one instant when
//! written (`core::time::wall_times`). A grant time after the deadline (an
//! earlier build could write one after a wall-clock step) loads as unknown.
//!
//! Version 3 (earlier builds) is the same without `value`; version 2 is
//! one holder's first four fields alone, version 1 the same without
//! `granted_ms`; all still load (without a value; 1 and 2 exclusive, the
//! grant time of version 1 unknown). An RDB written by this build does not load
//! into an earlier one (Redis refuses the newer encoding version).
//!
//! ## RDB aux field (before the keyspace), encoding version 4 (as 1 to 3)
//! | fence_hwm   | SaveSigned          | the node's fence high-water mark     |
//!
//! Loading (`core::codec::decode_value`, the same decoder the fuzzer runs)
//! refuses encoding versions newer than this build knows, short reads (the
//! module declares HANDLE_IO_ERRORS, so a damaged RDB, AOF preamble,
//! diskless sync or `RESTORE` payload is refused, not a crash), and values
//! that break the invariants above or carry a fence beyond
//! `core::limits::MAX_FENCE_LEAD` above the node's mark and clock (for a
//! `RESTORE`, above the clock alone), rather than guessing. A loaded RDB's
//! mark comes from its aux field; a `RESTORE`d value raises the mark with
//! its own fence once decoded whole. A value longer than
//! `lock.max-value-len` (but within 16384 bytes) loads: that option bounds
//! the values of new grants and proclaims, and a server may have had a
//! higher one when it wrote the data.
//!
//! ## In memory
//! An exclusive lock is one allocation, the token inline (see [`LockBlock`]), its
//! deadline and grant time on the node's monotonic clock (converted from
//! and to the wall clock, both at one instant, when loaded and saved: see
//! `core::time`), plus a lease id that is not persisted (see
//! `core::lock::Lock::lease`). A shared lock is a [`SharedBlock`]: its
//! mode and a vector of holders; the first word tells the two apart. The
//! key has no Redis expiry.
//!
//! ## AOF rewrite
//! An exclusive lock is written as `LOCK._SET key token fence deadline-ms
//! granted-ms [value]` (the value only when it has one), a shared one as `LOCK._SHARED key limit token fence
//! deadline-ms granted-ms ...` (every holder), the same effects the master
//! replicates, so an AOF without an RDB preamble restores both the locks
//! and (through their fences) the high-water mark.

use std::alloc::{handle_alloc_error, Layout};
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};

use redis_module::raw;

use super::engine;
use super::ffi::{
    self, api, context_flags, guard, log_warning, raw_callback, Ctx, KeyRef, OpenKey, Write,
};
use super::server::{self, STATS};
use crate::core::args;
use crate::core::codec::{self, Truncated, ValueReader};
use crate::core::error::LockError;
use crate::core::protocol::command;
use crate::core::time;
use crate::core::{Lock, LockRead, Mode};

mod callbacks;
mod memory;

pub use callbacks::wall_times;
use callbacks::*;
pub use memory::*;

/// The type's unlink2 callback: a lock key left the keyspace.
pub use super::ffi::UnlinkFn;

/// Native type names are exactly 9 characters.
pub const TYPE_NAME: &std::ffi::CStr = c"redislock";
pub const ENCODING_VERSION: i32 = codec::ENCODING_VERSION;

pub struct LockType(AtomicPtr<raw::RedisModuleType>);

impl LockType {
    pub fn get(&self) -> *mut raw::RedisModuleType {
        self.0.load(Relaxed)
    }
}

pub static LOCK_TYPE: LockType = LockType(AtomicPtr::new(std::ptr::null_mut()));

pub fn register(ctx: Ctx, on_unlink: UnlinkFn) -> Result<(), &'static str> {
    let mut methods = raw::RedisModuleTypeMethods {
        // Version 4 (Redis 7.0) has aux fields and unlink2.
        version: 4,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as c_int,
        free_effort: None,
        unlink: None,
        copy: None,
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: raw_callback!(on_unlink),
        copy2: None,
        aux_save2: None,
    };
    // SAFETY: the API table is filled in before any module code runs and
    // never written again (see `ffi`).
    let create = unsafe { raw::RedisModule_CreateDataType }
        .ok_or("RedisModule_CreateDataType is not available")?;
    // SAFETY: ctx is the load context Redis gave `module::start`; the name
    // is 9 characters, NUL-terminated; Redis copies the methods, whose
    // callbacks are the functions of callbacks.rs.
    let t = unsafe {
        create(
            ctx.as_ptr(),
            TYPE_NAME.as_ptr(),
            ENCODING_VERSION,
            &mut methods,
        )
    };
    if t.is_null() {
        return Err("could not create the redislock data type");
    }
    LOCK_TYPE.0.store(t, Relaxed);
    Ok(())
}

/// The lock stored at an open key: None for an empty key, WRONGTYPE for a
/// key of another type.
pub fn value_of(key: KeyRef<'_>) -> Result<Option<LockValue>, LockError> {
    let key_type = key.key_type() as isize;
    if key_type == raw::REDISMODULE_KEYTYPE_EMPTY {
        return Ok(None);
    }
    let ours = key_type == raw::REDISMODULE_KEYTYPE_MODULE && key.module_type() == LOCK_TYPE.get();
    if !ours {
        return Err(LockError::WrongType);
    }
    // Our type: the value is a block of memory.rs (`store`, `store_shared`,
    // `rdb_load`).
    // SAFETY: a live value of this type, as just checked.
    Ok(NonNull::new(key.module_value()).map(|v| unsafe { LockValue::of(v) }))
}

/// Stores `lock` as the value of `key`, in a new block; the value it
/// replaces, if any, is freed by Redis (through `free`).
pub fn store(key: &OpenKey<Write>, lock: Lock<'_>, from_outside: bool) -> LockValue {
    let block = LockBlock::new(lock, from_outside);
    set_value(key, block.as_ptr().cast());
    LockValue::Exclusive(block)
}

/// Stores a shared lock with `holders` as the value of `key` (as
/// [`store`]).
pub fn store_shared<'a>(
    key: &OpenKey<Write>,
    mode: Mode,
    holders: impl Iterator<Item = Lock<'a>>,
) -> LockValue {
    let block = SharedBlock::new(mode, holders.map(Holder::of).collect());
    set_value(key, block.as_ptr().cast());
    LockValue::Shared(block)
}

fn set_value(key: &OpenKey<Write>, value: *mut c_void) {
    // SAFETY: `key` is open for writing (its type) while borrowed here; the
    // new block goes to the keyspace, which frees it through this type's
    // `free`.
    unsafe { api!(RedisModule_ModuleTypeSetValue)(key.writable_ptr(), LOCK_TYPE.get(), value) };
}
