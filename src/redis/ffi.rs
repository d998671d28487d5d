//! Small helpers over the raw module API: reading argv as bytes without
//! allocating, sending replies, and the guard that keeps panics out of Redis.

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;

use crate::core::error::LockError;

pub type Ctx = *mut raw::RedisModuleCtx;
pub type RString = *mut raw::RedisModuleString;

/// Calls a module API function pointer. All the functions used through this
/// exist on Redis 7.0 and later; if one is somehow missing, this panics, and
/// the panic is turned into an error reply by [`run_command`].
macro_rules! api {
    ($name:ident) => {
        redis_module::raw::$name.expect(concat!(stringify!($name), " is not available"))
    };
}
pub(crate) use api;

/// One more than the longest valid argv (`LOCK.ACQUIRE key token ttl BLOCK
/// t MINFENCE n`, 8): longer argvs are cut here, and the cut argv is still
/// refused by the parsers (wrong arity, or an odd option word left over),
/// so no argument is ever silently dropped. Raise it with any new option.
pub const MAX_ARGS: usize = 9;

/// The command's arguments as byte slices borrowed from Redis's strings.
pub struct Argv<'a> {
    raw: &'a [RString],
    bytes: [&'a [u8]; MAX_ARGS],
    len: usize,
}

impl<'a> Argv<'a> {
    /// # Safety
    /// `argv` must point at `argc` valid strings that outlive `'a`.
    unsafe fn new(argv: *mut RString, argc: c_int) -> Self {
        let raw: &[RString] = if argv.is_null() || argc <= 0 {
            &[]
        } else {
            std::slice::from_raw_parts(argv, argc as usize)
        };
        let mut bytes: [&[u8]; MAX_ARGS] = [&[]; MAX_ARGS];
        let len = raw.len().min(MAX_ARGS);
        for (slot, s) in bytes.iter_mut().zip(raw) {
            *slot = string_bytes(*s);
        }
        Argv { raw, bytes, len }
    }

    pub fn bytes(&self) -> &[&'a [u8]] {
        &self.bytes[..self.len]
    }

    /// The key name (argv[1]); the parsers have checked arity before this
    /// is used.
    pub fn key(&self) -> RString {
        self.raw[1]
    }

    pub fn key_bytes(&self) -> &'a [u8] {
        self.bytes[1]
    }
}

/// # Safety
/// `s` must be a valid RedisModuleString that outlives `'a`.
pub unsafe fn string_bytes<'a>(s: RString) -> &'a [u8] {
    let mut len = 0usize;
    let ptr = api!(RedisModule_StringPtrLen)(s, &mut len);
    if ptr.is_null() || len == 0 {
        return &[];
    }
    std::slice::from_raw_parts(ptr.cast::<u8>(), len)
}

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
}

pub enum Value {
    Integer(i64),
    Bytes(Vec<u8>),
    Null,
}

/// Runs one command: turns argv into bytes, calls `handler`, and turns an
/// error or a panic into an error reply. Every command goes through here.
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
        let argv = Argv::new(argv, argc);
        handler(ctx, &argv)
    }))
    .unwrap_or(Err(LockError::Internal));
    match result {
        // By value: the integer and nil replies leave nothing to drop.
        Ok(reply) => send(ctx, reply),
        Err(err) => reply_error(ctx, err),
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
        if let Some(log) = unsafe { raw::RedisModule_Log } {
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

#[cold]
#[inline(never)]
unsafe fn reply_error(ctx: Ctx, err: LockError) {
    // Messages never contain user bytes unquoted (see show_arg) and so never
    // contain a NUL or a newline.
    let msg = std::ffi::CString::new(err.to_string())
        .unwrap_or_else(|_| c"ERR internal error".to_owned());
    api!(RedisModule_ReplyWithError)(ctx, msg.as_ptr());
}

unsafe fn send(ctx: Ctx, reply: Reply) {
    match reply {
        Reply::Integer(n) => {
            api!(RedisModule_ReplyWithLongLong)(ctx, n);
        }
        Reply::Null => {
            api!(RedisModule_ReplyWithNull)(ctx);
        }
        Reply::Ok => {
            api!(RedisModule_ReplyWithSimpleString)(ctx, c"OK".as_ptr());
        }
        Reply::Blocked => {}
        Reply::Map(fields) => {
            // ReplyWithMap is 7.0+; Redis itself flattens it for RESP2 clients.
            match raw::RedisModule_ReplyWithMap {
                Some(with_map) => with_map(ctx, fields.len() as _),
                None => api!(RedisModule_ReplyWithArray)(ctx, (fields.len() * 2) as _),
            };
            for (name, value) in fields {
                api!(RedisModule_ReplyWithStringBuffer)(ctx, name.as_ptr().cast(), name.len());
                match value {
                    Value::Integer(n) => api!(RedisModule_ReplyWithLongLong)(ctx, n),
                    Value::Bytes(b) => {
                        api!(RedisModule_ReplyWithStringBuffer)(ctx, b.as_ptr().cast(), b.len())
                    }
                    Value::Null => api!(RedisModule_ReplyWithNull)(ctx),
                };
            }
        }
    }
}

/// Whether the user running this command may write `key` (ACL key
/// patterns). Without a user (timers, the AOF) or without the ACL API, yes.
pub fn may_write_key(ctx: Ctx, key: RString) -> bool {
    let Some(user_name) = (unsafe { raw::RedisModule_GetCurrentUserName }) else {
        return true;
    };
    unsafe {
        let name = user_name(ctx);
        if name.is_null() {
            return true;
        }
        let allowed = user_may_write_key(name, key);
        api!(RedisModule_FreeString)(ctx, name);
        allowed
    }
}

/// Whether the user named `user_name` may write `key`. No when that user
/// no longer exists; yes without the ACL API.
pub fn user_may_write_key(user_name: RString, key: RString) -> bool {
    let api = unsafe {
        (
            raw::RedisModule_GetModuleUserFromUserName,
            raw::RedisModule_ACLCheckKeyPermissions,
            raw::RedisModule_FreeModuleUser,
        )
    };
    let (Some(get_user), Some(check), Some(free_user)) = api else {
        return true;
    };
    unsafe {
        let user = get_user(user_name);
        if user.is_null() {
            return false; // the user was deleted meanwhile
        }
        let allowed = check(user, key, raw::REDISMODULE_CMD_KEY_UPDATE as c_int)
            == raw::REDISMODULE_OK as c_int;
        free_user(user);
        allowed
    }
}

/// Whether the user named `user_name` may still run `LOCK.ACQUIRE` on
/// `key`: the command itself (`ACL SETUSER u -lock.acquire`, where the
/// server can check it, as Valkey and Redis 8 do for a BLPOP waiter) and
/// write access to the key.
pub fn user_may_acquire(ctx: Ctx, user_name: RString, key: RString) -> bool {
    if !user_may_write_key(user_name, key) {
        return false;
    }
    let api = unsafe {
        (
            raw::RedisModule_GetModuleUserFromUserName,
            raw::RedisModule_ACLCheckCommandPermissions,
            raw::RedisModule_FreeModuleUser,
        )
    };
    let (Some(get_user), Some(check), Some(free_user)) = api else {
        return true;
    };
    unsafe {
        let user = get_user(user_name);
        if user.is_null() {
            return false;
        }
        let create = |w: &[u8]| api!(RedisModule_CreateString)(ctx, w.as_ptr().cast(), w.len());
        let mut argv = [create(b"LOCK.ACQUIRE"), key, create(b"t"), create(b"1")];
        let allowed =
            check(user, argv.as_mut_ptr(), argv.len() as c_int) == raw::REDISMODULE_OK as c_int;
        for (i, s) in argv.into_iter().enumerate() {
            if i != 1 {
                api!(RedisModule_FreeString)(ctx, s);
            }
        }
        free_user(user);
        allowed
    }
}

/// True on a replica (also one with `replica-read-only no`).
pub fn is_replica(ctx: Ctx) -> bool {
    context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0
}

/// True while CLIENT PAUSE WRITE/ALL or a FAILOVER holds writes back: the
/// module must not write to the keyspace then (Redis asserts, or loses the
/// write, if a timer does).
pub fn writes_paused() -> bool {
    match unsafe { raw::RedisModule_AvoidReplicaTraffic } {
        Some(f) => unsafe { f() != 0 },
        None => false,
    }
}

/// The context flags of the running command (MULTI, Lua, replicated, ...).
pub fn context_flags(ctx: Ctx) -> u32 {
    match unsafe { raw::RedisModule_GetContextFlags } {
        Some(f) => unsafe { f(ctx) as u32 },
        None => 0,
    }
}

/// True when the server runs in cluster mode.
pub fn in_cluster(ctx: Ctx) -> bool {
    context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0
}

/// The text of `CLUSTER NODES`, or None if it cannot be read.
/// `CONFIG GET name`'s value, through RM_Call.
pub fn config_get(ctx: Ctx, name: &std::ffi::CStr) -> Option<String> {
    unsafe {
        let reply = raw::RedisModule_Call?(
            ctx,
            c"CONFIG".as_ptr(),
            c"cc".as_ptr(),
            c"GET".as_ptr(),
            name.as_ptr(),
        );
        if reply.is_null() {
            return None;
        }
        // [name, value] (RESP2) or a map: the value is the second element.
        let value = api!(RedisModule_CallReplyArrayElement)(reply, 1);
        let text = (!value.is_null()).then(|| {
            let mut len = 0usize;
            let ptr = api!(RedisModule_CallReplyStringPtr)(value, &mut len);
            (!ptr.is_null()).then(|| {
                String::from_utf8_lossy(std::slice::from_raw_parts(ptr.cast::<u8>(), len))
                    .into_owned()
            })
        });
        api!(RedisModule_FreeCallReply)(reply);
        text.flatten()
    }
}

pub fn cluster_nodes(ctx: Ctx) -> Option<String> {
    unsafe {
        let reply =
            raw::RedisModule_Call?(ctx, c"CLUSTER".as_ptr(), c"c".as_ptr(), c"NODES".as_ptr());
        if reply.is_null() {
            return None;
        }
        let mut len = 0usize;
        let ptr = api!(RedisModule_CallReplyStringPtr)(reply, &mut len);
        let text = (!ptr.is_null()).then(|| {
            String::from_utf8_lossy(std::slice::from_raw_parts(ptr.cast::<u8>(), len)).into_owned()
        });
        api!(RedisModule_FreeCallReply)(reply);
        text
    }
}

/// Whether `name` exists in the selected db.
pub fn key_exists(ctx: Ctx, name: RString) -> bool {
    unsafe {
        let key = api!(RedisModule_OpenKey)(ctx, name, raw::REDISMODULE_READ as c_int);
        if key.is_null() {
            return false;
        }
        let exists =
            api!(RedisModule_KeyType)(key.cast()) != raw::REDISMODULE_KEYTYPE_EMPTY as c_int;
        api!(RedisModule_CloseKey)(key.cast());
        exists
    }
}

/// The keyspace events a lock emits, in the module class (`d` in
/// `notify-keyspace-events`): `PSUBSCRIBE __keyspace@0__:orders:*` shows a
/// lock's life.
pub mod lock_events {
    use std::ffi::CStr;
    pub const ACQUIRE: &CStr = c"lock.acquire";
    pub const RELEASE: &CStr = c"lock.release";
    pub const EXTEND: &CStr = c"lock.extend";
    pub const EXPIRE: &CStr = c"lock.expire";
    pub const HANDOFF: &CStr = c"lock.handoff";
}

/// Whether module-class keyspace events are on (`notify-keyspace-events`
/// with `d`, or `A`): the cheap check before any notification work.
pub fn lock_events_on() -> bool {
    match unsafe { raw::RedisModule_GetNotifyKeyspaceEvents } {
        Some(get) => (unsafe { get() } & raw::REDISMODULE_NOTIFY_MODULE as c_int) != 0,
        None => false,
    }
}

/// Emits `event` for `key` (in the context's selected db), if enabled.
pub fn notify_lock_event(ctx: Ctx, event: &std::ffi::CStr, key: RString) {
    if !lock_events_on() {
        return;
    }
    if let Some(notify) = unsafe { raw::RedisModule_NotifyKeyspaceEvent } {
        unsafe {
            notify(
                ctx,
                raw::REDISMODULE_NOTIFY_MODULE as c_int,
                event.as_ptr(),
                key,
            )
        };
    }
}
