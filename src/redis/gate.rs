//! The fence gate type (`lock_gate`): a key that holds the highest fence
//! `LOCK.FENCED` accepted for the data it guards (its mark).
//!
//! ## RDB value, encoding version 1
//! | field | RDB call   | meaning                                        |
//! |-------|------------|------------------------------------------------|
//! | mark  | SaveSigned | the highest fence accepted, > 0                |
//!
//! A mark that is not positive is refused on load; a `RESTORE`d one also
//! when it is more than `core::limits::MAX_FENCE_LEAD` above the clock, as
//! `LOCK.FENCED` refuses such a fence (one hostile value would otherwise
//! close the gate for good). This node's own data and its master's (an
//! RDB or AOF loading, a full sync, `LOCK._GATE` from the link) carry
//! marks accepted under that bound where they were recorded, and are not
//! judged again by this clock. The AOF rewrite writes each gate as
//! `LOCK._GATE key mark`, the form the master replicates. A gate has no
//! Redis expiry of its own and is never evicted while the module refuses
//! evicting policies (`lock.allow-eviction`).

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};
use std::sync::OnceLock;

use redis_module::raw;

use super::engine;
use super::ffi::{
    self, api, context_flags, guard, log_warning, raw_callback, Ctx, KeyOpt, KeyRef, OpenKey,
    RString, Read, UnlinkFn, Write,
};
use super::server::{self, Key};
use crate::core::error::LockError;
use crate::core::node::{GateRead, GateStore};
use crate::core::protocol::command;

/// Native type names are exactly 9 characters.
pub const TYPE_NAME: &std::ffi::CStr = c"lock_gate";
const ENCODING_VERSION: c_int = 1;

static GATE_TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(std::ptr::null_mut());

/// Told of every gate that leaves the keyspace: its key and mark.
pub type UnlinkedFn = fn(Key, i64);

static ON_UNLINKED: OnceLock<UnlinkedFn> = OnceLock::new();

/// Registers the type; `on_unlinked` hears of every gate leaving the
/// keyspace (DEL, overwrite, eviction, expiry, ...), with its mark.
pub fn register(ctx: Ctx, on_unlinked: UnlinkedFn) -> Result<(), &'static str> {
    let _ = ON_UNLINKED.set(on_unlinked);
    let mut methods = raw::RedisModuleTypeMethods {
        version: 4,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: None,
        aux_save: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: None,
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: raw_callback!(unlink as UnlinkFn),
        copy2: None,
        aux_save2: None,
    };
    // SAFETY: the API table is filled in before any module code runs and
    // never written again (see `ffi`).
    let create = unsafe { raw::RedisModule_CreateDataType }
        .ok_or("RedisModule_CreateDataType is not available")?;
    // SAFETY: ctx is the load context Redis gave `module::start`; the name
    // is 9 characters, NUL-terminated; Redis copies the methods, whose
    // callbacks are the functions of this file.
    let t = unsafe {
        create(
            ctx.as_ptr(),
            TYPE_NAME.as_ptr(),
            ENCODING_VERSION,
            &mut methods,
        )
    };
    if t.is_null() {
        return Err("could not create the lock_gate data type");
    }
    GATE_TYPE.store(t, Relaxed);
    Ok(())
}

/// Whether the open key holds a gate.
pub fn is_gate(key: KeyRef<'_>) -> bool {
    key.key_type() as isize == raw::REDISMODULE_KEYTYPE_MODULE
        && key.module_type() == GATE_TYPE.load(Relaxed)
}

/// The gate's mark: None for an empty key, WRONGTYPE for a key that holds
/// something else (a lock too).
pub fn mark_of(key: KeyRef<'_>) -> Result<Option<i64>, LockError> {
    if key.key_type() as isize == raw::REDISMODULE_KEYTYPE_EMPTY {
        return Ok(None);
    }
    if !is_gate(key) {
        return Err(LockError::WrongType);
    }
    let value = key.module_value().cast::<i64>();
    // SAFETY: a value of this type is a boxed i64 (`set_mark`, `rdb_load`),
    // alive while its key is open and unchanged.
    Ok((!value.is_null()).then(|| unsafe { *value }))
}

/// A gate's key as the node reads and writes it (`core::node::GateStore`):
/// open for reading (`Read`, None when the key does not exist) or for
/// writing (`Write`, None when it cannot be opened).
pub struct GateKey<M: ffi::Mode>(Option<OpenKey<M>>);

impl GateKey<Read> {
    pub fn open(ctx: Ctx, name: RString) -> Self {
        GateKey(OpenKey::open(ctx, name))
    }
}

impl GateKey<Write> {
    pub fn open(ctx: Ctx, name: RString) -> Self {
        GateKey(OpenKey::open(ctx, name))
    }
}

impl GateRead for GateKey<Read> {
    fn mark(&self) -> Result<Option<i64>, LockError> {
        self.0.as_ref().map_or(Ok(None), |k| mark_of(k.key()))
    }
}

impl GateRead for GateKey<Write> {
    fn mark(&self) -> Result<Option<i64>, LockError> {
        let key = self.0.as_ref().ok_or(LockError::Internal)?;
        mark_of(key.key())
    }
}

impl GateStore for GateKey<Write> {
    fn set_mark(&mut self, mark: i64) {
        if let Some(key) = &self.0 {
            set_mark(key, mark);
        }
    }
}

/// Sets the gate's mark at an open key: in place when it holds a gate,
/// as a new gate otherwise (the node checked the key is empty or a gate).
fn set_mark(key: &OpenKey<Write>, mark: i64) {
    if is_gate(key.key()) {
        let value = key.key().module_value().cast::<i64>();
        if !value.is_null() {
            // SAFETY: a value of this type is a boxed i64 owned by the
            // keyspace, which the open key lets this command change.
            unsafe { *value = mark };
            return;
        }
    }
    let value = Box::into_raw(Box::new(mark));
    // SAFETY: `key` is open for writing (its type) while borrowed here; the
    // box goes to the keyspace, which frees it through this type's `free`.
    unsafe {
        api!(RedisModule_ModuleTypeSetValue)(
            key.writable_ptr(),
            GATE_TYPE.load(Relaxed),
            value.cast(),
        )
    };
}

extern "C" fn unlink(opt: KeyOpt, value: *const c_void) {
    guard("gate unlink", (), || {
        if value.is_null() {
            return;
        }
        // SAFETY: Redis passes a value of this type, alive during the call.
        let m = unsafe { mark(value) };
        if let Some(hear) = ON_UNLINKED.get() {
            let (db, name) = ffi::unlinked_key(opt);
            hear((db, name[..].into()), m);
        }
    })
}

extern "C" fn free(value: *mut c_void) {
    guard("free", (), || {
        if !value.is_null() {
            // SAFETY: Redis hands back a value of this type (a boxed i64)
            // once, when it is done with it.
            drop(unsafe { Box::from_raw(value.cast::<i64>()) });
        }
    })
}

/// # Safety
/// `value` is a value of this type Redis passed to a callback.
unsafe fn mark(value: *const c_void) -> i64 {
    // SAFETY: the caller's contract: a boxed i64.
    unsafe { *value.cast::<i64>() }
}

extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard("rdb_save", (), || {
        // SAFETY: Redis passes a value of this type and this callback's IO.
        unsafe { api!(RedisModule_SaveSigned)(rdb, mark(value)) };
    })
}

extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard("rdb_load", std::ptr::null_mut(), || {
        if encver != ENCODING_VERSION {
            log_warning(&format!(
                "lock: refusing a gate of encoding version {encver} (this build knows {ENCODING_VERSION})"
            ));
            return std::ptr::null_mut();
        }
        // RESTORE runs outside loading: only a user's value meets the clock
        // bound (see `check_loaded_mark`).
        let loading = raw::REDISMODULE_CTX_FLAGS_LOADING | raw::REDISMODULE_CTX_FLAGS_ASYNC_LOADING;
        // SAFETY: `rdb` is the IO context Redis gave this callback.
        let io_ctx = unsafe { Ctx::from_raw(api!(RedisModule_GetContextFromIO)(rdb)) };
        let trusted = context_flags(io_ctx) & loading != 0;
        let loaded = raw::load_signed(rdb)
            .map_err(|_| "the data is truncated or damaged".to_string())
            .and_then(|mark| {
                let now_us = server::conversion_now().wall_us;
                engine::with_engine(|n| n.check_loaded_gate(mark, trusted, now_us))
                    .map(|()| mark)
                    .map_err(|e| format!("mark {mark}: {e}"))
            });
        match loaded {
            Ok(mark) => Box::into_raw(Box::new(mark)).cast(),
            Err(why) => {
                log_warning(&format!("lock: refusing to load a gate: {why}"));
                std::ptr::null_mut()
            }
        }
    })
}

extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard("aof_rewrite", (), || {
        // SAFETY: `aof` and `key` are what Redis gave this callback, `value`
        // a value of this type; the format "sl" names a RedisModuleString
        // and a long long.
        unsafe {
            api!(RedisModule_EmitAOF)(
                aof,
                command::GATE_C.as_ptr(),
                c"sl".as_ptr(),
                key,
                mark(value),
            )
        };
    })
}

extern "C" fn mem_usage(_value: *const c_void) -> usize {
    std::mem::size_of::<i64>()
}

extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard("digest", (), || {
        // SAFETY: `md` is the digest Redis gave this callback, `value` a
        // value of this type.
        unsafe {
            api!(RedisModule_DigestAddLongLong)(md, mark(value));
            api!(RedisModule_DigestEndSequence)(md);
        }
    })
}
