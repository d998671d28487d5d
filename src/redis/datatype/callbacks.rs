//! The type's callbacks: free, RDB save and load, the aux field (the
//! fence mark), AOF rewrite, memory usage, digest.

use super::*;

/// A holder as written out: token, fence, deadline, grant time, value.
pub(super) type Written<'a> = (&'a [u8], i64, i64, i64, &'a [u8]);

/// Every holder of a value of this type, as written out: (token, fence,
/// deadline, grant time, value), both times Unix ms converted at one
/// instant.
///
/// # Safety
/// `value` is a live value of this type, unchanged during `'a`.
pub(super) unsafe fn written_holders<'a>(value: *const c_void) -> (Mode, Vec<Written<'a>>) {
    let now = server::conversion_now();
    let out = |l: Lock<'a>| {
        let (deadline_ms, granted_ms) = time::wall_times(l.deadline_ms, l.granted_ms, now);
        (l.token, l.fence, deadline_ms, granted_ms, l.value)
    };
    // SAFETY: the caller's contract.
    unsafe {
        match is_shared(value) {
            true => {
                let block = &*value.cast::<SharedBlock>();
                (
                    block.mode,
                    block.holders.iter().map(|h| out(h.view())).collect(),
                )
            }
            false => (Mode::Exclusive, vec![out(LockBlock::view(value.cast()))]),
        }
    }
}

/// Frees a value Redis is done with. Only frees: it may run on a lazy-free
/// thread, long after the lock left the keyspace (what the lock's end
/// means was reported where it ended: `keyspace`).
pub(super) extern "C" fn free(value: *mut c_void) {
    guard("free", (), || {
        if value.is_null() {
            return;
        }
        // SAFETY: Redis hands back a value of this type (a block of this
        // file) once, when it is done with it.
        unsafe {
            if is_shared(value) {
                let block = Box::from_raw(value.cast::<SharedBlock>());
                STATS.locks.fetch_sub(block.holders.len() as i64, Relaxed);
            } else {
                LockBlock::free(value.cast());
            }
        }
    })
}

pub(super) extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard("rdb_save", (), || {
        // SAFETY: Redis passes a value of this type, alive and unchanged
        // during the callback.
        let (mode, holders) = unsafe { written_holders(value) };
        // SAFETY: `rdb` is the IO context Redis gave this callback; Redis
        // copies the token bytes.
        unsafe {
            api!(RedisModule_SaveSigned)(rdb, codec::mode_word(mode));
            api!(RedisModule_SaveSigned)(rdb, holders.len() as i64);
            for (token, fence, deadline_ms, granted_ms, value) in holders {
                api!(RedisModule_SaveStringBuffer)(rdb, token.as_ptr().cast(), token.len());
                api!(RedisModule_SaveSigned)(rdb, fence);
                api!(RedisModule_SaveSigned)(rdb, deadline_ms);
                api!(RedisModule_SaveSigned)(rdb, granted_ms);
                api!(RedisModule_SaveStringBuffer)(rdb, value.as_ptr().cast(), value.len());
            }
        }
    })
}

pub(super) extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard("rdb_load", std::ptr::null_mut(), || {
        // RESTORE (and MIGRATE's RESTORE-ASKING) runs outside loading: its
        // fence is also bounded by the clock (see codec::check_restored_fence).
        let loading = raw::REDISMODULE_CTX_FLAGS_LOADING | raw::REDISMODULE_CTX_FLAGS_ASYNC_LOADING;
        // SAFETY: `rdb` is the IO context Redis gave this callback.
        let io_ctx = unsafe { Ctx::from_raw(api!(RedisModule_GetContextFromIO)(rdb)) };
        let restoring = context_flags(io_ctx) & loading == 0;
        let now = server::conversion_now();
        let decoded = codec::decode_value(encver, &mut Io(rdb), |fence| {
            engine::with_engine(|n| n.check_loaded_fence(fence, restoring, now.wall_us))
        });
        // Taken by the node (a RESTOREd value raises the mark now, once
        // decoded whole; a loaded RDB's mark comes in its aux field), its
        // times on this node's clock. Nothing is allocated for the keyspace
        // until the value is valid and taken.
        let accepted = decoded.and_then(|value| {
            let times: Vec<(i64, i64, i64)> = value
                .holders
                .iter()
                .map(|h| (h.fence, h.deadline_ms, h.granted_ms))
                .collect();
            let key = key_of_io(rdb);
            let loaded =
                engine::with_engine(|n| n.accept_value(key.as_ref(), &times, restoring, now))
                    .map_err(|(fence, e)| codec::DecodeError::Fence(fence, e))?;
            if restoring {
                // A RESTORE is no decision: nothing else arms the timer
                // for its lease's end (loading arms it when it ends).
                engine::arm_timer();
            }
            Ok((
                value.mode,
                value.holders.into_iter().zip(loaded).collect::<Vec<_>>(),
            ))
        });
        let (mode, holders) = match accepted {
            Ok(taken) => taken,
            Err(why) => {
                log_warning(&format!("lock: refusing to load a lock value: {why}"));
                return std::ptr::null_mut();
            }
        };
        let locks = holders.iter().map(|(h, loaded)| Lock {
            fence: h.fence,
            deadline_ms: loaded.deadline_ms,
            token: h.token.as_ref(),
            value: h.value.as_ref().map_or(&[][..], |v| v.as_ref()),
            granted_ms: loaded.granted_ms,
            lease: loaded.lease,
        });
        match mode {
            Mode::Exclusive => match locks.into_iter().next() {
                Some(lock) => LockBlock::new(lock, true).as_ptr().cast(),
                None => std::ptr::null_mut(),
            },
            Mode::Shared { .. } => {
                let holders = locks.map(Holder::of).collect();
                SharedBlock::new(mode, holders).as_ptr().cast()
            }
        }
    })
}

/// The key an RDB load or a `RESTORE` is reading (its db and name, copied),
/// when Redis names it.
fn key_of_io(rdb: *mut raw::RedisModuleIO) -> Option<engine::Key> {
    // SAFETY: `rdb` is the IO context Redis gave this callback; the name
    // is Redis's, valid during it, and copied here.
    unsafe {
        let name = raw::RedisModule_GetKeyNameFromIO?(rdb);
        if name.is_null() {
            return None;
        }
        let db = raw::RedisModule_GetDbIdFromIO?(rdb);
        let mut len = 0;
        let ptr = api!(RedisModule_StringPtrLen)(name, &mut len);
        let bytes = std::slice::from_raw_parts(ptr.cast::<u8>(), len);
        Some((db, bytes.into()))
    }
}

/// A lock's deadline and grant time as written out (Unix ms, converted at
/// one instant; a grant time of 0: unknown).
pub fn wall_times(lock: &Lock<'_>) -> (i64, i64) {
    time::wall_times(lock.deadline_ms, lock.granted_ms, server::conversion_now())
}

/// The loader's reads, each checked for a short read (the raw loaders do).
pub(super) struct Io(*mut raw::RedisModuleIO);

impl ValueReader for Io {
    type Bytes = redis_module::RedisBuffer;

    fn string_buffer(&mut self) -> Result<Self::Bytes, Truncated> {
        raw::load_string_buffer(self.0).map_err(|_| Truncated)
    }

    fn signed(&mut self) -> Result<i64, Truncated> {
        raw::load_signed(self.0).map_err(|_| Truncated)
    }
}

pub(super) extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    guard("aux_save", (), || {
        if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            // SAFETY: `rdb` is the IO context Redis gave this callback.
            unsafe { api!(RedisModule_SaveSigned)(rdb, engine::fence_hwm()) };
        }
    })
}

pub(super) extern "C" fn aux_load(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
    when: c_int,
) -> c_int {
    guard("aux_load", raw::REDISMODULE_ERR as c_int, || {
        if !(1..=ENCODING_VERSION).contains(&encver)
            || when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int
        {
            log_warning(&format!(
                "lock: unknown aux data (encoding version {encver}, when {when})"
            ));
            return raw::REDISMODULE_ERR as c_int;
        }
        let observed = raw::load_signed(rdb)
            .map_err(|_| "the data is truncated or damaged".to_string())
            .and_then(|hwm| engine::observe_fence(hwm).map_err(|e| format!("mark {hwm}: {e}")));
        match observed {
            Ok(()) => raw::REDISMODULE_OK as c_int,
            Err(why) => {
                log_warning(&format!("lock: refusing the saved fence mark: {why}"));
                raw::REDISMODULE_ERR as c_int
            }
        }
    })
}

pub(super) extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard("aof_rewrite", (), || {
        // SAFETY: Redis passes a value of this type, alive and unchanged
        // during the callback.
        let (mode, holders) = unsafe { written_holders(value) };
        if mode.is_shared() {
            // SAFETY: `aof` is the IO context Redis gave this callback.
            let ctx = unsafe { Ctx::from_raw(api!(RedisModule_GetContextFromIO)(aof)) };
            let holders: Vec<_> = holders.iter().map(|h| (h.0, h.1, h.2, h.3)).collect();
            let words = args::shared_set_args(mode, &holders);
            // SAFETY: `aof` and `key` are what Redis gave this callback,
            // which has not returned.
            unsafe { ffi::emit_aof_words(aof, ctx, command::SET_SHARED_C, key, &words) };
            return;
        }
        let (token, fence, deadline_ms, granted_ms, value) = holders[0];
        // A value only when there is one: an earlier build reading the AOF
        // takes five arguments.
        let (format, value_len) = match value.is_empty() {
            true => (c"sblll", 0),
            false => (c"sblllb", value.len()),
        };
        // SAFETY: `aof` and `key` are what Redis gave this callback; the
        // format names what follows: a RedisModuleString, a buffer and its
        // length (copied by Redis), three long longs, and with "b" the
        // value's buffer and length (extra arguments are not read).
        unsafe {
            api!(RedisModule_EmitAOF)(
                aof,
                command::SET_C.as_ptr(),
                format.as_ptr(),
                key,
                token.as_ptr(),
                token.len(),
                fence,
                deadline_ms,
                granted_ms,
                value.as_ptr(),
                value_len,
            )
        };
    })
}

pub(super) extern "C" fn mem_usage(value: *const c_void) -> usize {
    guard("mem_usage", 0, || {
        // SAFETY: Redis passes a value of this type, alive and unchanged
        // during the callback.
        unsafe {
            match is_shared(value) {
                true => (*value.cast::<SharedBlock>()).size(),
                false => LockBlock::size(LockBlock::view(value.cast())),
            }
        }
    })
}

pub(super) extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard("digest", (), || {
        // SAFETY: Redis passes a value of this type, alive and unchanged
        // during the callback.
        let (mode, holders) = unsafe { written_holders(value) };
        // SAFETY: `md` is the digest Redis gave this callback; Redis reads
        // the token bytes during the call.
        unsafe {
            if mode.is_shared() {
                api!(RedisModule_DigestAddLongLong)(md, codec::mode_word(mode));
            }
            for (token, fence, _, _, value) in holders {
                api!(RedisModule_DigestAddStringBuffer)(md, token.as_ptr().cast(), token.len());
                if !value.is_empty() {
                    api!(RedisModule_DigestAddStringBuffer)(md, value.as_ptr().cast(), value.len());
                }
                // Not the deadline or the grant time: each node keeps them
                // on its own monotonic clock, so master and replica may
                // differ by a millisecond.
                api!(RedisModule_DigestAddLongLong)(md, fence);
            }
            api!(RedisModule_DigestEndSequence)(md);
        }
    })
}
