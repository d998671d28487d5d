//! The server and the context: flags, version, options, configs, databases, INFO, CONFIG and CLUSTER reads.

use super::*;

/// True while CLIENT PAUSE WRITE/ALL or a FAILOVER holds writes back: the
/// module must not write to the keyspace then (Redis asserts, or loses the
/// write, if a timer does).
///
/// Redis 7.0 ends a timed CLIENT PAUSE when it compares the pause's end
/// with its *cached* clock, which an idle server refreshes only at its cron
/// (every 100 ms at hz 10): asked from a timer, it kept saying "paused" up
/// to 60 ms after the pause ended (hand-offs that late; Valkey: within
/// 11 ms). A command refreshes that clock, so when the answer is "paused" a
/// PING is run through RM_Call and the question asked again.
pub fn writes_paused(ctx: Ctx) -> bool {
    let Some(paused) = optional_api!(RedisModule_AvoidReplicaTraffic) else {
        return false;
    };
    // SAFETY: takes no argument; called on the main thread.
    if unsafe { paused() } == 0 {
        return false;
    }
    if let Some(call) = optional_api!(RedisModule_Call) {
        // SAFETY: ctx is a handle Redis gave the caller; the empty format
        // takes no argument; the reply is freed once, below.
        let reply = unsafe { call(ctx.0, c"PING".as_ptr(), c"".as_ptr()) };
        if !reply.is_null() {
            // SAFETY: `reply` came from RM_Call and is freed once.
            unsafe { api!(RedisModule_FreeCallReply)(reply) };
        }
    }
    // SAFETY: as above.
    unsafe { paused() != 0 }
}

/// The context flags of the running command (MULTI, Lua, replicated, ...).
pub fn context_flags(ctx: Ctx) -> u32 {
    match optional_api!(RedisModule_GetContextFlags) {
        // SAFETY: ctx is a handle Redis gave the caller.
        Some(f) => unsafe { f(ctx.0) as u32 },
        None => 0,
    }
}

/// True when the server runs in cluster mode.
pub fn in_cluster(ctx: Ctx) -> bool {
    context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0
}

/// The server's version (0x00MMmmpp), if it can tell.
pub fn server_version() -> Option<c_int> {
    // SAFETY: takes no argument.
    optional_api!(RedisModule_GetServerVersion).map(|get| unsafe { get() })
}

/// The server's version as Valkey numbers itself (0x00MMmmpp), asked of
/// `ValkeyModule_GetServerVersion` (Valkey 8.0 and later; its
/// `RedisModule_GetServerVersion` says 7.2.4); None on Redis.
pub fn valkey_version() -> Option<c_int> {
    let get_api = optional_api!(RedisModule_GetApi)?;
    let mut function: *mut c_void = std::ptr::null_mut();
    // SAFETY: a NUL-terminated name and where to write the function's
    // address; the server writes it only when it has the function.
    let found = unsafe {
        get_api(
            c"ValkeyModule_GetServerVersion".as_ptr(),
            (&mut function as *mut *mut c_void).cast(),
        )
    };
    if found != raw::REDISMODULE_OK as c_int || function.is_null() {
        return None;
    }
    // SAFETY: the server's own function of that name: `int (*)(void)`.
    let get: extern "C" fn() -> c_int = unsafe { std::mem::transmute(function) };
    Some(get())
}

/// RM_SetModuleOptions; None where the server lacks it.
pub fn set_module_options(ctx: Ctx, options: c_int) -> Option<()> {
    let set_options = optional_api!(RedisModule_SetModuleOptions)?;
    // SAFETY: ctx is the load context Redis gave the caller.
    unsafe { set_options(ctx.0, options) };
    Some(())
}

/// RM_LoadConfigs: whether the `lock.*` lines of the config file were
/// accepted; None where the server lacks it.
pub fn load_configs(ctx: Ctx) -> Option<bool> {
    let load = optional_api!(RedisModule_LoadConfigs)?;
    // SAFETY: ctx is the load context Redis gave the caller.
    Some(unsafe { load(ctx.0) } == raw::REDISMODULE_OK as c_int)
}

/// A detached thread-safe context (for the process's life), or None where
/// the server lacks it.
pub fn detached_context(ctx: Ctx) -> Option<Detached> {
    let detached = optional_api!(RedisModule_GetDetachedThreadSafeContext)?;
    // SAFETY: ctx is the load context Redis gave the caller.
    Some(Detached(Ctx(unsafe { detached(ctx.0) })))
}

/// A detached context: valid for the process, so it may be kept.
#[derive(Clone, Copy)]
pub struct Detached(Ctx);

/// A place for a [`Detached`] context, in a static (a callback's context
/// cannot be put there: it would outlive its callback).
pub struct DetachedSlot(std::sync::atomic::AtomicPtr<raw::RedisModuleCtx>);

impl DetachedSlot {
    pub const fn new() -> Self {
        DetachedSlot(std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()))
    }

    pub fn set(&self, ctx: Detached) {
        self.0.store(ctx.0 .0, std::sync::atomic::Ordering::Relaxed);
    }

    /// The context, once set.
    pub fn get(&self) -> Option<Ctx> {
        let ptr = self.0.load(std::sync::atomic::Ordering::Relaxed);
        (!ptr.is_null()).then_some(Ctx(ptr))
    }
}

/// The db selected in `ctx`.
pub fn selected_db(ctx: Ctx) -> i32 {
    // SAFETY: ctx is a handle Redis gave the caller.
    unsafe { api!(RedisModule_GetSelectedDb)(ctx.0) }
}

/// Selects `db` in `ctx`; false when there is no such db.
pub fn select_db(ctx: Ctx, db: i32) -> bool {
    // SAFETY: ctx is a handle Redis gave the caller.
    unsafe { api!(RedisModule_SelectDb)(ctx.0, db) == raw::REDISMODULE_OK as c_int }
}

/// INFO `section`'s signed fields `names`: each one's value, or None where
/// it is missing. None where the server lacks the API or the section.
pub fn server_info_signed<const N: usize>(
    ctx: Ctx,
    section: &CStr,
    names: [&CStr; N],
) -> Option<[Option<i64>; N]> {
    let (Some(get), Some(field), Some(free)) = (
        optional_api!(RedisModule_GetServerInfo),
        optional_api!(RedisModule_ServerInfoGetFieldSigned),
        optional_api!(RedisModule_FreeServerInfo),
    ) else {
        return None;
    };
    // SAFETY: ctx is a handle Redis gave the caller; `section` is a
    // NUL-terminated string alive for the call.
    let info = unsafe { get(ctx.0, section.as_ptr()) };
    if info.is_null() {
        return None;
    }
    let values = names.map(|name| {
        let mut err = 0;
        // SAFETY: `info` was just returned (not NULL) and is freed below.
        let value = unsafe { field(info, name.as_ptr(), &mut err) };
        (err == 0).then_some(value)
    });
    // SAFETY: `info` came from RM_GetServerInfo with this ctx, freed once.
    unsafe { free(ctx.0, info) };
    Some(values)
}

/// `CONFIG GET name`'s value, through RM_Call.
pub fn config_get(ctx: Ctx, name: &CStr) -> Option<String> {
    let call = optional_api!(RedisModule_Call)?;
    // SAFETY: ctx is a handle Redis gave the caller; the format "cc" names
    // the two NUL-terminated strings that follow.
    let reply = unsafe {
        call(
            ctx.0,
            c"CONFIG".as_ptr(),
            c"cc".as_ptr(),
            c"GET".as_ptr(),
            name.as_ptr(),
        )
    };
    if reply.is_null() {
        return None;
    }
    // [name, value] (RESP2) or a map: the value is the second element.
    // SAFETY: `reply` was just returned (not NULL); it is freed below.
    let value = unsafe { api!(RedisModule_CallReplyArrayElement)(reply, 1) };
    let text = (!value.is_null()).then(|| call_reply_text(value));
    // SAFETY: `reply` came from RM_Call and is freed once; `value` (part of
    // it) is not used after.
    unsafe { api!(RedisModule_FreeCallReply)(reply) };
    text.flatten()
}

/// The text of `CLUSTER NODES`, or None if it cannot be read.
pub fn cluster_nodes(ctx: Ctx) -> Option<String> {
    let call = optional_api!(RedisModule_Call)?;
    // SAFETY: ctx is a handle Redis gave the caller; the format "c" names
    // the NUL-terminated string that follows.
    let reply = unsafe { call(ctx.0, c"CLUSTER".as_ptr(), c"c".as_ptr(), c"NODES".as_ptr()) };
    if reply.is_null() {
        return None;
    }
    let text = call_reply_text(reply);
    // SAFETY: `reply` came from RM_Call and is freed once.
    unsafe { api!(RedisModule_FreeCallReply)(reply) };
    text
}

/// A call reply's string, copied (None if it has none).
pub(super) fn call_reply_text(reply: *mut raw::RedisModuleCallReply) -> Option<String> {
    let mut len = 0usize;
    // SAFETY: `reply` is a live, non-NULL reply of the caller's RM_Call.
    let ptr = unsafe { api!(RedisModule_CallReplyStringPtr)(reply, &mut len) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: Redis returned the reply's `len` bytes (not NULL), alive with
    // the reply; they are copied here.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    Some(String::from_utf8_lossy(bytes).into_owned())
}
