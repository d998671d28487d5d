//! Running a command inside the panic guard and sending its reply.

use super::*;

/// What a command answers. Built inside the guard, sent outside it, so that a
/// panic can never leave half a reply on the wire.
pub enum Reply {
    Integer(i64),
    Null,
    /// Sent as a map in RESP3 and a flat field/value array in RESP2.
    Map(Vec<(&'static str, Value)>),
    Ok,
    /// The client is blocked: the reply comes later, from `blocking`.
    Blocked,
    /// A guarded command's reply, sent verbatim.
    Call(CallReply),
    /// A key-position request was answered (`KeyAtPos`): no reply.
    KeysReported,
    /// A page of a scan, as `SCAN` answers: the next cursor (a bulk
    /// string), then an array of maps (each as [`Reply::Map`] sends one).
    Page(Vec<u8>, Vec<Vec<(&'static str, Value)>>),
}

pub enum Value {
    Integer(i64),
    Bytes(Vec<u8>),
    Null,
    /// An array of maps (each as [`Reply::Map`] sends one).
    Maps(Vec<Vec<(&'static str, Value)>>),
}

/// Runs one command: turns argv into bytes, calls `handler`, and turns an
/// error or a panic into an error reply. Every command goes through here
/// (see [`command_callback!`]).
///
/// # Safety
/// Called only from a Redis command callback with its own arguments.
pub unsafe fn run_command(
    ctx: Ctx,
    argv: *mut RString,
    argc: c_int,
    handler: fn(Ctx, &Argv) -> Result<Reply, LockError>,
) -> c_int {
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the command's own argv (the caller's contract), alive for
        // the whole callback.
        let argv = unsafe { Argv::new(argv, argc) };
        handler(ctx, &argv)
    }))
    .unwrap_or_else(|_| {
        log_warning("lock: internal error in a command; the server keeps running");
        Err(LockError::Internal)
    });
    match result {
        // By value: the integer and nil replies leave nothing to drop.
        Ok(reply) => send(ctx, reply),
        Err(err) => reply_lock_error(ctx, err),
    }
    raw::REDISMODULE_OK as c_int
}

/// Runs a callback that is not a command (data type, events, info) and has
/// nowhere to send an error: a panic is logged and `fallback` returned.
pub fn guard<T>(what: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        log_warning(&format!(
            "lock: internal error in {what}; the server keeps running"
        ));
        fallback
    })
}

pub fn log_warning(message: &str) {
    if let Ok(msg) = std::ffi::CString::new(message) {
        if let Some(log) = optional_api!(RedisModule_Log) {
            // SAFETY: a NULL context logs as the module; the format and its
            // one argument are NUL-terminated strings alive for the call.
            unsafe {
                log(
                    std::ptr::null_mut(),
                    c"warning".as_ptr(),
                    c"%s".as_ptr(),
                    msg.as_ptr(),
                )
            };
        }
    }
}

// ---- replies (ctx: the context of the command or reply callback) ----

pub fn reply_integer(ctx: Ctx, n: i64) {
    // SAFETY: ctx is a handle Redis gave the caller.
    unsafe { api!(RedisModule_ReplyWithLongLong)(ctx.0, n) };
}

pub fn reply_null(ctx: Ctx) {
    // SAFETY: ctx is a handle Redis gave the caller.
    unsafe { api!(RedisModule_ReplyWithNull)(ctx.0) };
}

/// An error reply; `msg` starts with its error code (`ERR ...`).
pub fn reply_error(ctx: Ctx, msg: &CStr) {
    // SAFETY: ctx is a handle Redis gave the caller; Redis copies `msg`.
    unsafe { api!(RedisModule_ReplyWithError)(ctx.0, msg.as_ptr()) };
}

pub(super) fn reply_simple_string(ctx: Ctx, s: &CStr) {
    // SAFETY: ctx is a handle Redis gave the caller; Redis copies `s`.
    unsafe { api!(RedisModule_ReplyWithSimpleString)(ctx.0, s.as_ptr()) };
}

pub(super) fn reply_bytes(ctx: Ctx, bytes: &[u8]) {
    // SAFETY: ctx is a handle Redis gave the caller; Redis copies the bytes.
    unsafe { api!(RedisModule_ReplyWithStringBuffer)(ctx.0, bytes.as_ptr().cast(), bytes.len()) };
}

/// The header of a map of `len` pairs: a map where the server has
/// RM_ReplyWithMap (7.0+; Redis itself flattens it for RESP2 clients), a
/// flat array of `2 * len` otherwise.
pub(super) fn reply_map_header(ctx: Ctx, len: usize) {
    match optional_api!(RedisModule_ReplyWithMap) {
        // SAFETY: ctx is a handle Redis gave the caller.
        Some(with_map) => unsafe { with_map(ctx.0, len as _) },
        // SAFETY: as above.
        None => unsafe { api!(RedisModule_ReplyWithArray)(ctx.0, (len * 2) as _) },
    };
}

#[cold]
#[inline(never)]
pub(super) fn reply_lock_error(ctx: Ctx, err: LockError) {
    // Messages never contain user bytes unquoted (see show_arg) and so never
    // contain a NUL or a newline.
    let msg = std::ffi::CString::new(err.to_string())
        .unwrap_or_else(|_| c"ERR internal error".to_owned());
    reply_error(ctx, &msg);
}

/// Sends a whole reply (a blocked client's, from its reply callback).
pub fn reply(ctx: Ctx, reply: Reply) {
    send(ctx, reply);
}

#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub(super) fn send(ctx: Ctx, reply: Reply) {
    match reply {
        Reply::Integer(n) => reply_integer(ctx, n),
        Reply::Null => reply_null(ctx),
        Reply::Ok => reply_simple_string(ctx, c"OK"),
        Reply::Blocked | Reply::KeysReported => {}
        Reply::Call(reply) => {
            // SAFETY: ctx is a handle Redis gave the caller; the reply is
            // alive (owned here) and Redis copies it.
            unsafe { api!(RedisModule_ReplyWithCallReply)(ctx.0, reply.0.as_ptr()) };
        }
        Reply::Map(fields) => send_map(ctx, fields),
        Reply::Page(cursor, entries) => {
            // SAFETY: ctx is a handle Redis gave the caller.
            unsafe { api!(RedisModule_ReplyWithArray)(ctx.0, 2) };
            reply_bytes(ctx, &cursor);
            // SAFETY: as above.
            unsafe { api!(RedisModule_ReplyWithArray)(ctx.0, entries.len() as _) };
            for entry in entries {
                send_map(ctx, entry);
            }
        }
    }
}

pub(super) fn send_map(ctx: Ctx, fields: Vec<(&'static str, Value)>) {
    reply_map_header(ctx, fields.len());
    for (name, value) in fields {
        reply_bytes(ctx, name.as_bytes());
        match value {
            Value::Integer(n) => reply_integer(ctx, n),
            Value::Bytes(b) => reply_bytes(ctx, &b),
            Value::Null => reply_null(ctx),
            Value::Maps(maps) => {
                // SAFETY: ctx is a handle Redis gave the caller.
                unsafe { api!(RedisModule_ReplyWithArray)(ctx.0, maps.len() as _) };
                for map in maps {
                    send_map(ctx, map);
                }
            }
        };
    }
}
