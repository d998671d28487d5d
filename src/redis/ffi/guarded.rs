//! What the guarded commands (LOCK.EXEC, LOCK.FENCED) call: key positions, RM_Call and its replies.

use super::*;

/// Whether this call of a `getkeys-api` command only asks for its keys.
pub fn is_keys_position_request(ctx: Ctx) -> bool {
    match optional_api!(RedisModule_IsKeysPositionRequest) {
        // SAFETY: ctx is a handle Redis gave the caller.
        Some(is_request) => unsafe { is_request(ctx.0) != 0 },
        None => false,
    }
}

/// Reports the key at argv position `pos`, with key-spec `flags`
/// (REDISMODULE_CMD_KEY_*), to a key-position request.
pub fn report_key(ctx: Ctx, pos: usize, flags: u64) {
    if let Some(key_at) = optional_api!(RedisModule_KeyAtPosWithFlags) {
        // SAFETY: ctx is a handle Redis gave the caller (a key-position
        // request; Redis ignores the call otherwise).
        unsafe { key_at(ctx.0, pos as c_int, flags as c_int) };
    }
}

/// The keys of the command `argv` (its name first), as the server finds
/// them (its key specs or key callback): each key's position in `argv` and
/// key-spec flags. Empty for an unknown command or a wrong argument count.
pub fn command_keys(ctx: Ctx, argv: &[RString]) -> Vec<(usize, u64)> {
    let Some(get_keys) = optional_api!(RedisModule_GetCommandKeysWithFlags) else {
        return Vec::new();
    };
    let mut count: c_int = 0;
    let mut flags: *mut c_int = std::ptr::null_mut();
    // SAFETY: ctx is a handle Redis gave the caller; `argv` holds
    // `argv.len()` strings Redis gave the caller (RString is the raw
    // pointer), which it only reads; it returns arrays of `count` ints,
    // allocated with its allocator, or NULL.
    let positions = unsafe {
        get_keys(
            ctx.0,
            argv.as_ptr() as *mut *mut raw::RedisModuleString,
            argv.len() as c_int,
            &mut count,
            &mut flags,
        )
    };
    if positions.is_null() {
        return Vec::new();
    }
    let n = count.max(0) as usize;
    // SAFETY: two arrays of `count` ints (flags may be NULL), freed below.
    let keys = unsafe {
        let pos = std::slice::from_raw_parts(positions, n);
        pos.iter()
            .enumerate()
            .map(|(i, &p)| {
                let f = if flags.is_null() { 0 } else { *flags.add(i) };
                (p.max(0) as usize, f as u32 as u64)
            })
            .collect()
    };
    // SAFETY: allocated by Redis for the caller, freed once.
    unsafe {
        api!(RedisModule_Free)(positions.cast());
        if !flags.is_null() {
            api!(RedisModule_Free)(flags.cast());
        }
    }
    keys
}

/// A reply of RM_Call, freed on drop.
pub struct CallReply(pub(super) NonNull<raw::RedisModuleCallReply>);

impl Drop for CallReply {
    fn drop(&mut self) {
        // SAFETY: a reply RM_Call returned to this module, freed once.
        unsafe { api!(RedisModule_FreeCallReply)(self.0.as_ptr()) };
    }
}

/// The text of a string or error call reply (an error without its `-`).
pub fn call_reply_string(reply: &CallReply) -> Option<String> {
    call_reply_bytes(reply.0.as_ptr()).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// A call reply's string bytes, copied (None if it has none).
pub(super) fn call_reply_bytes(reply: *mut raw::RedisModuleCallReply) -> Option<Vec<u8>> {
    let mut len = 0usize;
    // SAFETY: `reply` is a live, non-NULL reply of the caller's RM_Call.
    let ptr = unsafe { api!(RedisModule_CallReplyStringPtr)(reply, &mut len) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: Redis returned the reply's `len` bytes, alive with the reply.
    Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }.to_vec())
}

/// The bytes of a string Redis gave the caller, valid during its callback.
pub fn string_bytes_of(s: &RString) -> &[u8] {
    // SAFETY: a string Redis gave the caller, alive for its callback (the
    // module never keeps one past it, see the file doc); the bytes are
    // borrowed no longer than the handle they were read through.
    unsafe { string_bytes(*s) }
}

/// Runs the command `argv` (its name first) through RM_Call with the
/// format `format`: flags (`C`, `S`, `M`, `!`, `0`, `E`), then `v` for the
/// arguments. Err: it did not run (the call returned no reply); the errno
/// RM_Call set says why.
pub fn call(ctx: Ctx, argv: &[RString], format: &CStr) -> Result<CallReply, c_int> {
    let (Some(call), Some((name, args))) = (optional_api!(RedisModule_Call), argv.split_first())
    else {
        return Err(libc::ENOENT);
    };
    debug_assert!(format.to_bytes().ends_with(b"v"));
    // A Redis string is NUL-terminated (an sds): its bytes serve as the
    // C name unless a NUL inside would cut it short, naming another
    // command.
    let bytes = string_bytes_of(name);
    if bytes.is_empty() || bytes.contains(&0) {
        return Err(libc::ENOENT);
    }
    // SAFETY: ctx is a handle Redis gave the caller; the name points at a
    // NUL-terminated string alive for the call (checked free of inner NULs
    // above), the format is NUL-terminated and ends with "v": a vector of
    // RedisModuleString pointers Redis gave the caller (it takes its own
    // references) and its length. A vector of length 0 is fine: Redis adds
    // no argument.
    let reply = unsafe {
        *libc::__errno_location() = 0;
        call(
            ctx.0,
            bytes.as_ptr().cast(),
            format.as_ptr(),
            args.as_ptr(),
            args.len(),
        )
    };
    match NonNull::new(reply) {
        Some(reply) => Ok(CallReply(reply)),
        // SAFETY: reading this thread's errno.
        None => Err(unsafe { *libc::__errno_location() }),
    }
}

/// Whether a call reply is an error reply.
pub fn is_error_reply(reply: &CallReply) -> bool {
    // SAFETY: a live reply (its owner).
    let kind = unsafe { api!(RedisModule_CallReplyType)(reply.0.as_ptr()) };
    kind as isize == raw::REDISMODULE_REPLY_ERROR
}

/// What `COMMAND INFO name` says of a command: its flag names, and whether
/// it has subcommands. None for a command the server does not know.
pub fn command_info(ctx: Ctx, name: &[u8]) -> Option<(Vec<Vec<u8>>, bool)> {
    let call = optional_api!(RedisModule_Call)?;
    // SAFETY: ctx is a handle Redis gave the caller; the format "cb" names
    // a NUL-terminated string, then a buffer and its length (copied).
    let reply = unsafe {
        call(
            ctx.0,
            c"COMMAND".as_ptr(),
            c"cb".as_ptr(),
            c"INFO".as_ptr(),
            name.as_ptr(),
            name.len(),
        )
    };
    let reply = CallReply(NonNull::new(reply)?);
    // [info] or [nil]; info: [name, arity, flags, first, last, step,
    // categories, tips, key specs, subcommands] (7.0+).
    // SAFETY: a live reply; its elements live as long as it.
    unsafe {
        let info = api!(RedisModule_CallReplyArrayElement)(reply.0.as_ptr(), 0);
        if info.is_null()
            || api!(RedisModule_CallReplyType)(info) as isize != raw::REDISMODULE_REPLY_ARRAY
        {
            return None;
        }
        let flags = api!(RedisModule_CallReplyArrayElement)(info, 2);
        let mut names = Vec::new();
        if !flags.is_null() {
            for i in 0..api!(RedisModule_CallReplyLength)(flags) {
                let flag = api!(RedisModule_CallReplyArrayElement)(flags, i);
                if let Some(text) = (!flag.is_null()).then(|| call_reply_bytes(flag)).flatten() {
                    names.push(text);
                }
            }
        }
        let subcommands = api!(RedisModule_CallReplyArrayElement)(info, 9);
        let container =
            !subcommands.is_null() && api!(RedisModule_CallReplyLength)(subcommands) > 0;
        Some((names, container))
    }
}
