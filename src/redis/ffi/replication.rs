//! Replicating and rewriting to the AOF what the module changed.

use super::*;

/// Counts the running command as a write (RDB save points) and propagates
/// it as it came, where anything receives it.
pub fn replicate_verbatim(ctx: Ctx) {
    // SAFETY: ctx is a handle Redis gave the caller.
    unsafe { api!(RedisModule_ReplicateVerbatim)(ctx.0) };
}

/// Replicates `command key` (`DEL`, `PERSIST`).
pub fn replicate_key_command(ctx: Ctx, command: &CStr, name: RString) {
    // SAFETY: ctx and name are handles Redis gave the caller; the format
    // "s" names the one RedisModuleString that follows.
    unsafe { api!(RedisModule_Replicate)(ctx.0, command.as_ptr(), c"s".as_ptr(), name.0) };
}

/// Replicates `LOCK._GATE name mark`.
pub fn replicate_gate(ctx: Ctx, name: RString, mark: i64) {
    // SAFETY: ctx and name are handles Redis gave the caller; the format
    // "sl" names a RedisModuleString and a long long.
    unsafe {
        api!(RedisModule_Replicate)(
            ctx.0,
            command::GATE_C.as_ptr(),
            c"sl".as_ptr(),
            name.0,
            mark,
        )
    };
}

/// Replicates `LOCK._SET name token fence deadline-ms granted-ms
/// [value]`: the value only when there is one, so a replica of an earlier
/// build (which takes five arguments) follows a master that stores none.
pub fn replicate_lock_set(
    ctx: Ctx,
    name: RString,
    token: &[u8],
    fence: i64,
    (deadline_ms, granted_ms): (i64, i64),
    value: &[u8],
) {
    let (format, value_len) = match value.is_empty() {
        true => (c"sblll", 0),
        false => (c"sblllb", value.len()),
    };
    // SAFETY: ctx and name are handles Redis gave the caller; the format
    // names what follows: a RedisModuleString, a buffer and its length
    // (copied by Redis), three long longs, and with "b" the value's buffer
    // and length (arguments past the format are not read).
    unsafe {
        api!(RedisModule_Replicate)(
            ctx.0,
            command::SET_C.as_ptr(),
            format.as_ptr(),
            name,
            token.as_ptr(),
            token.len(),
            fence,
            deadline_ms,
            granted_ms,
            value.as_ptr(),
            value_len,
        )
    };
}

/// Replicates `command name word...` (`LOCK._SHARED`: a shared key whole).
pub fn replicate_words(ctx: Ctx, command: &CStr, name: RString, words: &[Vec<u8>]) {
    let owned: Vec<OwnedString> = words.iter().map(|w| OwnedString::new(ctx, w)).collect();
    let mut argv: Vec<*mut raw::RedisModuleString> = owned.iter().map(|o| o.get().0).collect();
    // SAFETY: ctx and name are handles Redis gave the caller; the format
    // "sv" names a RedisModuleString, then an array of them and its length
    // (Redis takes its own references; `owned` frees ours after the call).
    unsafe {
        api!(RedisModule_Replicate)(
            ctx.0,
            command.as_ptr(),
            c"sv".as_ptr(),
            name.0,
            argv.as_mut_ptr(),
            argv.len(),
        )
    };
}

/// Writes `command key word...` to an AOF being rewritten (`ctx`: the IO's
/// context, for the strings).
///
/// # Safety
/// `aof` and `key` are the IO context and key name Redis gave the calling
/// `aof_rewrite` callback, which has not returned.
pub unsafe fn emit_aof_words(
    aof: *mut raw::RedisModuleIO,
    ctx: Ctx,
    command: &CStr,
    key: *mut raw::RedisModuleString,
    words: &[Vec<u8>],
) {
    let owned: Vec<OwnedString> = words.iter().map(|w| OwnedString::new(ctx, w)).collect();
    let mut argv: Vec<*mut raw::RedisModuleString> = owned.iter().map(|o| o.get().0).collect();
    // SAFETY: `aof` and `key` are what Redis gave the caller's callback
    // (the caller's contract); the format "sv" as in `replicate_words`.
    unsafe {
        api!(RedisModule_EmitAOF)(
            aof,
            command.as_ptr(),
            c"sv".as_ptr(),
            key,
            argv.as_mut_ptr(),
            argv.len(),
        )
    };
}
