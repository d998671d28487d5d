//! The FFI facade: every call into the raw module API (`raw::RedisModule_*`)
//! and libc made outside the data type (`datatype`, which owns the value's
//! memory layout and the type callbacks) goes through a small function here.
//! Also: reading argv as bytes without allocating, sending replies, and the
//! guard that keeps panics out of Redis.
//!
//! ## Safety
//! * The API table: Redis fills every `raw::RedisModule_*` entry in
//!   `RedisModule_Init`, before any module code runs, and never writes it
//!   again, so reading an entry is a read of an initialized static. Entries
//!   a server may lack (NULL, here `None`) are checked; [`api!`] is only for
//!   those every supported server (7.0+, checked at load) has.
//! * Handles: the safe functions below take no raw pointer. A context is a
//!   [`Ctx`], a string an [`RString`], an event's data an [`EventData`], an
//!   unlink's option context a [`KeyOpt`]: `repr(transparent)` wrappers that
//!   only Redis makes (as a callback's parameter: the callbacks are declared
//!   over them, and [`raw_callback!`] gives Redis their raw type, the same
//!   ABI) or this file (from what Redis returned). An open key is an
//!   [`OpenKey`] or a [`KeyRef`], a blocked client a [`BlockedClient`], an
//!   owned string an [`OwnedString`]. The module never keeps a callback's
//!   handle past its callback; only a [`Detached`] context (and the sweep's
//!   scan cursor) may be kept, in a [`DetachedSlot`]. So each handle is
//!   valid for the call; that is what each `// SAFETY:` comment below
//!   relies on when it says "a handle Redis gave the caller". (A `Ctx` or
//!   `RString` is `Copy` and has no lifetime: that they are not kept past
//!   their callback is the glue's discipline, which `tests/layering.rs`
//!   does not check.)
//! * Functions whose soundness depends on more than that (a lifetime, the
//!   type behind a `void *`) are `unsafe fn` with a `# Safety` section, or
//!   take typed data ([`Blocking`]) so that the type cannot be mistaken.
//! * Everything runs on Redis's main thread, except the data type's `free`
//!   (lazy-free threads), which touches no handle.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use redis_module::raw;

use crate::core::error::LockError;
use crate::core::protocol::command;

/// A context Redis gave the module: the one a callback was called with
/// (valid during that callback, and never kept past it), or a detached one
/// (valid for the process). Safe code cannot make one from an arbitrary
/// pointer: only Redis, through a callback's parameter (the type is
/// `repr(transparent)` over the pointer), or [`Ctx::from_raw`] (unsafe).
/// So the functions here that take a `Ctx` need no `unsafe` at the call.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ctx(*mut raw::RedisModuleCtx);

impl Ctx {
    /// # Safety
    /// `ptr` is a context Redis gave the module, valid for as long as the
    /// result is used (see the type).
    pub unsafe fn from_raw(ptr: *mut raw::RedisModuleCtx) -> Ctx {
        Ctx(ptr)
    }

    pub fn as_ptr(self) -> *mut raw::RedisModuleCtx {
        self.0
    }

    /// The load context redismodule-rs hands the module's init, valid
    /// while `context` is.
    pub fn of(context: &redis_module::Context) -> Ctx {
        Ctx(context.ctx)
    }
}

/// A Redis string the module was given or made: a command's argument
/// (valid during the command), one of a scan callback (during the
/// callback), an [`OwnedString`]'s (while it lives). Made only here (or by
/// Redis, through a callback's parameter), so the functions that take one
/// need no `unsafe` at the call; used only within those lifetimes.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RString(*mut raw::RedisModuleString);

impl RString {
    pub fn as_ptr(self) -> *mut raw::RedisModuleString {
        self.0
    }
}

pub type KeyPtr = *mut raw::RedisModuleKey;

/// A command's callback, as RM_CreateCommand takes it.
pub type CommandFn = unsafe extern "C" fn(Ctx, *mut RString, c_int) -> c_int;

/// A blocked client's reply or timeout callback.
type BlockedFn = unsafe extern "C" fn(Ctx, *mut RString, c_int) -> c_int;

/// A module timer's callback.
pub type TimerFn = extern "C" fn(Ctx, *mut c_void);

/// A server event's callback.
pub type EventFn = extern "C" fn(Ctx, raw::RedisModuleEvent, u64, EventData);

/// The data Redis passes a server event's callback (what it points at
/// depends on the event: see [`flush_event_db`], [`swapdb_event_dbs`]).
/// Made only by Redis, through the callback's parameter.
#[repr(transparent)]
pub struct EventData(*mut c_void);

/// The option context Redis passes a type's unlink2 callback, valid
/// during the callback. Made only by Redis, through its parameter.
#[repr(transparent)]
pub struct KeyOpt(*mut raw::RedisModuleKeyOptCtx);

/// A type's unlink2 callback (a key of the type left the keyspace).
pub type UnlinkFn = extern "C" fn(KeyOpt, *const c_void);

/// Calls a module API function pointer. All the functions used through this
/// exist on Redis 7.0 and later; if one is somehow missing, this panics, and
/// the panic is turned into an error reply by [`run_command`] (or logged by
/// [`guard`]). Reading the entry needs an `unsafe` block around the use
/// (see the file doc: a read of an initialized static).
macro_rules! api {
    ($name:ident) => {
        redis_module::raw::$name.expect(concat!(stringify!($name), " is not available"))
    };
}
pub(crate) use api;

/// A callback declared over [`Ctx`] and [`RString`] (`repr(transparent)`
/// over the raw pointers), as the raw API's function type. `$f` must be a
/// function *pointer* of the declared signature (a cast, so a function item,
/// zero-sized, cannot slip through: transmute checks the sizes).
macro_rules! raw_callback {
    ($f:expr) => {{
        #[allow(clippy::missing_transmute_annotations)] // the API's type, inferred
        // SAFETY: the callback's parameters differ from the API's only by
        // `repr(transparent)` wrappers of the same pointers: one ABI.
        let f = unsafe { std::mem::transmute::<_, _>($f) };
        Some(f)
    }};
}
pub(crate) use raw_callback;

/// An entry of the API table that a server may lack: `None` there.
macro_rules! optional_api {
    ($name:ident) => {{
        // SAFETY: the API table is filled in before any module code runs and
        // never written again (see the file doc).
        unsafe { redis_module::raw::$name }
    }};
}

/// The `extern "C"` callback of a command whose handler is `$handler`
/// (`fn(Ctx, &Argv) -> Result<Reply, LockError>`): it runs the handler
/// through [`run_command`].
macro_rules! command_callback {
    ($handler:path) => {{
        unsafe extern "C" fn callback(
            ctx: $crate::redis::ffi::Ctx,
            argv: *mut $crate::redis::ffi::RString,
            argc: ::std::os::raw::c_int,
        ) -> ::std::os::raw::c_int {
            // SAFETY: Redis calls a command's callback with the command's own
            // context and its `argc` arguments, valid during the call.
            unsafe { $crate::redis::ffi::run_command(ctx, argv, argc, $handler) }
        }
        callback as $crate::redis::ffi::CommandFn
    }};
}
pub(crate) use command_callback;

/// One more than the longest valid argv of a command read through
/// [`Argv::bytes`] (`LOCK.ACQUIRE key token ttl SHARED LIMIT n BLOCK t
/// MINFENCE n`, 11): longer argvs are cut here, and the cut argv is still
/// refused by the parsers (wrong arity, or an option word named twice or
/// unknown), so no argument is ever silently dropped. Raise it with any
/// new option. (Commands with any number of arguments read them all.)
pub const MAX_ARGS: usize = 12;

/// The command's arguments as byte slices borrowed from Redis's strings.
pub struct Argv<'a> {
    raw: &'a [RString],
    bytes: [&'a [u8]; MAX_ARGS],
    len: usize,
}

impl<'a> Argv<'a> {
    /// # Safety
    /// `argv` must point at `argc` valid strings that outlive `'a`.
    #[inline(always)] // built in the caller's frame: its array is not copied
    unsafe fn new(argv: *mut RString, argc: c_int) -> Self {
        let raw: &[RString] = if argv.is_null() || argc <= 0 {
            &[]
        } else {
            // SAFETY: the caller's contract: `argc` strings at `argv`, alive
            // for `'a`.
            unsafe { std::slice::from_raw_parts(argv, argc as usize) }
        };
        let mut bytes: [&[u8]; MAX_ARGS] = [&[]; MAX_ARGS];
        let len = raw.len().min(MAX_ARGS);
        for (slot, s) in bytes.iter_mut().zip(raw) {
            // SAFETY: each string is valid for `'a` (the caller's contract).
            *slot = unsafe { string_bytes(*s) };
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

    /// Every argument, also those past [`MAX_ARGS`] (a guarded command's).
    pub fn all(&self) -> &'a [RString] {
        self.raw
    }
}

/// The bytes of a Redis string, borrowed.
///
/// # Safety
/// `s` must be a valid RedisModuleString that outlives `'a` (and is not
/// changed meanwhile).
unsafe fn string_bytes<'a>(s: RString) -> &'a [u8] {
    let mut len = 0usize;
    // SAFETY: `s` is a valid string (the caller's contract).
    let ptr = unsafe { api!(RedisModule_StringPtrLen)(s.0, &mut len) };
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: Redis returns the string's `len` bytes, which live as long as
    // the string does (the caller's contract).
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
}

/// A copy of the bytes of a Redis string the caller was given.
pub fn string_copy(s: RString) -> Box<[u8]> {
    // SAFETY: a string Redis gave the caller, valid during this call; the
    // bytes are copied before it returns.
    unsafe { string_bytes(s) }.into()
}

/// A Redis string the module owns, freed on drop.
pub struct OwnedString {
    ctx: Ctx,
    ptr: NonNull<raw::RedisModuleString>,
}

impl OwnedString {
    /// A new Redis string holding `bytes`.
    pub fn new(ctx: Ctx, bytes: &[u8]) -> Self {
        // SAFETY: ctx is a handle Redis gave the caller; Redis copies the
        // bytes and always returns a string.
        let ptr =
            unsafe { api!(RedisModule_CreateString)(ctx.0, bytes.as_ptr().cast(), bytes.len()) };
        OwnedString {
            ctx,
            ptr: NonNull::new(ptr).expect("RM_CreateString returns a string"),
        }
    }

    /// Takes a string Redis handed the module to free (a user name), if any.
    fn take(ctx: Ctx, ptr: RString) -> Option<Self> {
        Some(OwnedString {
            ctx,
            ptr: NonNull::new(ptr.0)?,
        })
    }

    /// The string, for a call (valid while this lives).
    pub fn get(&self) -> RString {
        RString(self.ptr.as_ptr())
    }
}

impl Drop for OwnedString {
    fn drop(&mut self) {
        // SAFETY: a string this owns (created or handed over to be freed),
        // freed here once, with the context it was made with.
        unsafe { api!(RedisModule_FreeString)(self.ctx.0, self.ptr.as_ptr()) };
    }
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
    /// A guarded command's reply, sent verbatim.
    Call(CallReply),
    /// A key-position request was answered (`KeyAtPos`): no reply.
    KeysReported,
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

fn reply_simple_string(ctx: Ctx, s: &CStr) {
    // SAFETY: ctx is a handle Redis gave the caller; Redis copies `s`.
    unsafe { api!(RedisModule_ReplyWithSimpleString)(ctx.0, s.as_ptr()) };
}

fn reply_bytes(ctx: Ctx, bytes: &[u8]) {
    // SAFETY: ctx is a handle Redis gave the caller; Redis copies the bytes.
    unsafe { api!(RedisModule_ReplyWithStringBuffer)(ctx.0, bytes.as_ptr().cast(), bytes.len()) };
}

/// The header of a map of `len` pairs: a map where the server has
/// RM_ReplyWithMap (7.0+; Redis itself flattens it for RESP2 clients), a
/// flat array of `2 * len` otherwise.
fn reply_map_header(ctx: Ctx, len: usize) {
    match optional_api!(RedisModule_ReplyWithMap) {
        // SAFETY: ctx is a handle Redis gave the caller.
        Some(with_map) => unsafe { with_map(ctx.0, len as _) },
        // SAFETY: as above.
        None => unsafe { api!(RedisModule_ReplyWithArray)(ctx.0, (len * 2) as _) },
    };
}

#[cold]
#[inline(never)]
fn reply_lock_error(ctx: Ctx, err: LockError) {
    // Messages never contain user bytes unquoted (see show_arg) and so never
    // contain a NUL or a newline.
    let msg = std::ffi::CString::new(err.to_string())
        .unwrap_or_else(|_| c"ERR internal error".to_owned());
    reply_error(ctx, &msg);
}

fn send(ctx: Ctx, reply: Reply) {
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
    }
}

fn send_map(ctx: Ctx, fields: Vec<(&'static str, Value)>) {
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

// ---- ACL ----

/// Whether the user running this command may write `key` (ACL key
/// patterns). Without a user (timers, the AOF) or without the ACL API, yes.
pub fn may_write_key(ctx: Ctx, key: RString) -> bool {
    let Some(user_name) = optional_api!(RedisModule_GetCurrentUserName) else {
        return true;
    };
    // SAFETY: ctx is a handle Redis gave the caller.
    let Some(name) = OwnedString::take(ctx, RString(unsafe { user_name(ctx.0) })) else {
        return true;
    };
    user_may_write_key(name.get(), key)
}

/// A user looked up by name for an ACL check, freed on drop.
struct ModuleUser {
    ptr: NonNull<raw::RedisModuleUser>,
    free: unsafe extern "C" fn(*mut raw::RedisModuleUser),
}

impl ModuleUser {
    /// The user named `name` (None: no such user now, or no ACL API).
    fn named(name: RString) -> Option<ModuleUser> {
        let (get, free) = (
            optional_api!(RedisModule_GetModuleUserFromUserName)?,
            optional_api!(RedisModule_FreeModuleUser)?,
        );
        // SAFETY: `name` is a string Redis gave the caller.
        let ptr = NonNull::new(unsafe { get(name.0) })?;
        Some(ModuleUser { ptr, free })
    }
}

impl Drop for ModuleUser {
    fn drop(&mut self) {
        // SAFETY: came from RM_GetModuleUserFromUserName, freed once.
        unsafe { (self.free)(self.ptr.as_ptr()) };
    }
}

/// Whether the ACL API this module asks is there (Redis 7.0 and later).
fn acl_api_present() -> bool {
    optional_api!(RedisModule_GetModuleUserFromUserName).is_some()
        && optional_api!(RedisModule_FreeModuleUser).is_some()
}

/// Whether the user named `user_name` may write `key`. No when that user
/// no longer exists; yes without the ACL API.
pub fn user_may_write_key(user_name: RString, key: RString) -> bool {
    let Some(check) = optional_api!(RedisModule_ACLCheckKeyPermissions) else {
        return true;
    };
    if !acl_api_present() {
        return true;
    }
    let Some(user) = ModuleUser::named(user_name) else {
        return false; // the user was deleted meanwhile
    };
    // SAFETY: `user` is live until dropped below; `key` is a handle Redis
    // gave the caller.
    let answer = unsafe {
        check(
            user.ptr.as_ptr(),
            key.0,
            raw::REDISMODULE_CMD_KEY_UPDATE as c_int,
        )
    };
    answer == raw::REDISMODULE_OK as c_int
}

/// Whether the user named `user_name` may still run `LOCK.ACQUIRE` on
/// `key`: the command itself (`ACL SETUSER u -lock.acquire`, where the
/// server can check it, as Valkey and Redis 8 do for a BLPOP waiter) and
/// write access to the key.
pub fn user_may_acquire(ctx: Ctx, user_name: RString, key: RString) -> bool {
    if !user_may_write_key(user_name, key) {
        return false;
    }
    let Some(check) = optional_api!(RedisModule_ACLCheckCommandPermissions) else {
        return true;
    };
    if !acl_api_present() {
        return true;
    }
    let Some(user) = ModuleUser::named(user_name) else {
        return false;
    };
    let name = crate::core::protocol::command::ACQUIRE.as_bytes();
    let words = [name, b"t", b"1"].map(|w| OwnedString::new(ctx, w));
    let mut argv = [words[0].get(), key, words[1].get(), words[2].get()].map(RString::as_ptr);
    // SAFETY: `user` is live until dropped below; argv holds four valid
    // strings, alive for the call (`words` and `key`).
    let answer = unsafe { check(user.ptr.as_ptr(), argv.as_mut_ptr(), argv.len() as c_int) };
    answer == raw::REDISMODULE_OK as c_int
}

// ---- the server and the context ----

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
fn call_reply_text(reply: *mut raw::RedisModuleCallReply) -> Option<String> {
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

// ---- keys ----

/// How a key is open: [`Read`] or [`Write`].
pub trait Mode {
    /// RM_OpenKey's mode.
    const FLAGS: c_int;
}

/// Opened for reading only.
pub struct Read;
/// Opened for reading and writing.
pub struct Write;

impl Mode for Read {
    const FLAGS: c_int = raw::REDISMODULE_READ as c_int;
}

impl Mode for Write {
    const FLAGS: c_int = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
}

/// A key opened with RM_OpenKey in the selected db, closed on drop. Only
/// one opened for [`Write`] can be changed: the type says which, so no
/// safe code can hand Redis a key it may not write, or one that is closed.
pub struct OpenKey<M: Mode> {
    ptr: NonNull<raw::RedisModuleKey>,
    mode: PhantomData<M>,
}

impl<M: Mode> OpenKey<M> {
    /// Opens `name`. None when Redis gives no handle: for [`Read`], a key
    /// that does not exist (a [`Write`] open of a missing key gets one).
    pub fn open(ctx: Ctx, name: RString) -> Option<Self> {
        // SAFETY: ctx and name are handles Redis gave the caller.
        let ptr = unsafe { api!(RedisModule_OpenKey)(ctx.0, name.0, M::FLAGS) };
        Some(OpenKey {
            ptr: NonNull::new(ptr)?,
            mode: PhantomData,
        })
    }

    /// The open key, to read.
    pub fn key(&self) -> KeyRef<'_> {
        KeyRef {
            ptr: self.ptr,
            open: PhantomData,
        }
    }
}

impl<M: Mode> Drop for OpenKey<M> {
    fn drop(&mut self) {
        // SAFETY: opened by `open` and closed only here, once.
        unsafe { api!(RedisModule_CloseKey)(self.ptr.as_ptr()) };
    }
}

impl OpenKey<Write> {
    /// The raw handle of a key open for writing, for the data type's
    /// RM_ModuleTypeSetValue (`datatype::store`).
    pub fn writable_ptr(&self) -> KeyPtr {
        self.ptr.as_ptr()
    }

    /// Deletes the key's value.
    pub fn delete(&self) {
        // SAFETY: a key open for writing (the type), alive (self).
        unsafe { api!(RedisModule_DeleteKey)(self.ptr.as_ptr()) };
    }

    /// Sets (or with REDISMODULE_NO_EXPIRE, drops) the key's Redis expiry,
    /// `ms` from now.
    pub fn set_expire(&self, ms: i64) {
        // SAFETY: a key open for writing (the type), alive (self).
        unsafe { api!(RedisModule_SetExpire)(self.ptr.as_ptr(), ms) };
    }
}

/// A key open for as long as `'a`: borrowed from an [`OpenKey`], or lent to
/// a scan callback by Redis. Made only here, so it always is open.
#[derive(Clone, Copy)]
pub struct KeyRef<'a> {
    ptr: NonNull<raw::RedisModuleKey>,
    open: PhantomData<&'a ()>,
}

impl KeyRef<'_> {
    /// The key's type (REDISMODULE_KEYTYPE_*).
    pub fn key_type(self) -> c_int {
        // SAFETY: an open key (the type's guarantee).
        unsafe { api!(RedisModule_KeyType)(self.ptr.as_ptr()) }
    }

    /// The module type of a key holding a module value.
    pub fn module_type(self) -> *mut raw::RedisModuleType {
        // SAFETY: an open key (the type's guarantee).
        unsafe { api!(RedisModule_ModuleTypeGetType)(self.ptr.as_ptr()) }
    }

    /// The value of a key holding a module value (only a pointer: what it
    /// points at is the data type's business).
    pub fn module_value(self) -> *mut c_void {
        // SAFETY: an open key (the type's guarantee).
        unsafe { api!(RedisModule_ModuleTypeGetValue)(self.ptr.as_ptr()) }
    }

    /// The key's Redis expiry (Unix ms), negative when it has none.
    pub fn abs_expire(self) -> i64 {
        // SAFETY: an open key (the type's guarantee).
        unsafe { api!(RedisModule_GetAbsExpire)(self.ptr.as_ptr()) }
    }
}

/// Whether `name` exists in the selected db.
pub fn key_exists(ctx: Ctx, name: RString) -> bool {
    OpenKey::<Read>::open(ctx, name)
        .is_some_and(|k| k.key().key_type() != raw::REDISMODULE_KEYTYPE_EMPTY as c_int)
}

/// Signals `name` as modified (WATCH, client-side caching).
pub fn signal_modified_key(ctx: Ctx, name: RString) {
    // SAFETY: ctx and name are handles Redis gave the caller.
    unsafe { api!(RedisModule_SignalModifiedKey)(ctx.0, name.0) };
}

/// The key an unlink2 callback is about: (db, name).
pub fn unlinked_key(opt: KeyOpt) -> (i32, Box<[u8]>) {
    let opt = opt.0;
    // SAFETY: `opt` is the option context Redis gave the callback.
    let name = unsafe { api!(RedisModule_GetKeyNameFromOptCtx)(opt) };
    // SAFETY: as above.
    let db = unsafe { api!(RedisModule_GetDbIdFromOptCtx)(opt) };
    (db, string_copy(RString(name.cast_mut())))
}

// ---- replication ----

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

/// Replicates `LOCK._SET name token fence deadline-ms granted-ms`.
pub fn replicate_lock_set(
    ctx: Ctx,
    name: RString,
    token: &[u8],
    fence: i64,
    deadline_ms: i64,
    granted_ms: i64,
) {
    // SAFETY: ctx and name are handles Redis gave the caller; the format
    // "sblll" names what follows: a RedisModuleString, a buffer and its
    // length (copied by Redis), and three long longs.
    unsafe {
        api!(RedisModule_Replicate)(
            ctx.0,
            command::SET_C.as_ptr(),
            c"sblll".as_ptr(),
            name,
            token.as_ptr(),
            token.len(),
            fence,
            deadline_ms,
            granted_ms,
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

// ---- keyspace events ----

/// Whether module-class keyspace events are on (`notify-keyspace-events`
/// with `d`, or `A`): the cheap check before any notification work.
pub fn lock_events_on() -> bool {
    match optional_api!(RedisModule_GetNotifyKeyspaceEvents) {
        // SAFETY: takes no argument.
        Some(get) => (unsafe { get() } & raw::REDISMODULE_NOTIFY_MODULE as c_int) != 0,
        None => false,
    }
}

/// Emits `event` for `key` (in the context's selected db), if enabled.
pub fn notify_lock_event(ctx: Ctx, event: &CStr, key: RString) {
    if !lock_events_on() {
        return;
    }
    if let Some(notify) = optional_api!(RedisModule_NotifyKeyspaceEvent) {
        // SAFETY: ctx and key are handles Redis gave the caller; Redis
        // copies the event name.
        unsafe {
            notify(
                ctx.0,
                raw::REDISMODULE_NOTIFY_MODULE as c_int,
                event.as_ptr(),
                key.0,
            )
        };
    }
}

// ---- server events ----

/// Subscribes `callback` to the server event `id`: whether the server
/// accepted; None where it lacks the API.
pub fn subscribe_to_server_event(ctx: Ctx, id: u64, callback: EventFn) -> Option<bool> {
    let subscribe = optional_api!(RedisModule_SubscribeToServerEvent)?;
    let event = raw::RedisModuleEvent { id, dataver: 1 };
    let callback = raw_callback!(callback as EventFn);
    // SAFETY: ctx is the load context Redis gave the caller; the callback
    // is a plain function.
    Some(unsafe { subscribe(ctx.0, event, callback) } == raw::REDISMODULE_OK as c_int)
}

/// A keyspace-notification callback: (context in the key's db, the event
/// type, its name, the key).
pub type KeyspaceFn = extern "C" fn(Ctx, c_int, *const c_char, RString) -> c_int;

/// Subscribes `callback` to the keyspace events of `types`
/// (`REDISMODULE_NOTIFY_*`). The server calls it for those events only.
pub fn subscribe_to_keyspace_events(ctx: Ctx, types: c_int, callback: KeyspaceFn) -> bool {
    let callback = raw_callback!(callback as KeyspaceFn);
    // SAFETY: ctx is the load context Redis gave the caller; the callback
    // is a plain function.
    let status = unsafe { api!(RedisModule_SubscribeToKeyspaceEvents)(ctx.0, types, callback) };
    status == raw::REDISMODULE_OK as c_int
}

/// The db a FLUSHDB event is about (-1: all), from the `event` and `data`
/// Redis passed an event callback; None for another event or no data.
pub fn flush_event_db(event: raw::RedisModuleEvent, data: EventData) -> Option<i32> {
    let data = data.0;
    if event.id != raw::REDISMODULE_EVENT_FLUSHDB || data.is_null() {
        return None;
    }
    // SAFETY: with a FLUSHDB event, Redis passes a RedisModuleFlushInfo,
    // alive during the callback.
    Some(unsafe { &*data.cast::<raw::RedisModuleFlushInfo>() }.dbnum)
}

/// The two dbs a SWAPDB event swapped, from the `event` and `data` Redis
/// passed an event callback; None for another event or no data.
pub fn swapdb_event_dbs(event: raw::RedisModuleEvent, data: EventData) -> Option<(i32, i32)> {
    let data = data.0;
    if event.id != raw::REDISMODULE_EVENT_SWAPDB || data.is_null() {
        return None;
    }
    // SAFETY: with a SWAPDB event, Redis passes a RedisModuleSwapDbInfo,
    // alive during the callback.
    let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
    Some((info.dbnum_first, info.dbnum_second))
}

// ---- timers ----

/// Creates a timer calling `callback` (with no data) after `period_ms`.
pub fn create_timer(ctx: Ctx, period_ms: i64, callback: TimerFn) -> u64 {
    let callback = raw_callback!(callback as TimerFn);
    // SAFETY: ctx is a handle Redis gave the caller (or the detached
    // context, alive for the process); the callback is a plain function and
    // its data is NULL.
    unsafe { api!(RedisModule_CreateTimer)(ctx.0, period_ms, callback, std::ptr::null_mut()) }
}

/// Stops the timer `id` (a stale id is refused by Redis, changing nothing).
pub fn stop_timer(ctx: Ctx, id: u64) {
    let mut data: *mut c_void = std::ptr::null_mut();
    // SAFETY: ctx as in `create_timer`; `data` is a valid out-pointer (the
    // module's timers carry no data to free).
    unsafe { api!(RedisModule_StopTimer)(ctx.0, id, &mut data) };
}

// ---- the keyspace scan ----

/// An RM_Scan cursor: created once and never destroyed (one per process).
pub struct ScanCursor(*mut raw::RedisModuleScanCursor);

// SAFETY: the cursor is a plain allocation of Redis's; it is created, used
// and restarted on Redis's main thread only (timer callbacks). Send is for
// keeping it in a Rust static behind a Mutex.
unsafe impl Send for ScanCursor {}

impl ScanCursor {
    pub fn create() -> Self {
        // SAFETY: takes no argument; returns a new cursor.
        ScanCursor(unsafe { api!(RedisModule_ScanCursorCreate)() })
    }

    /// Back to the start of a db.
    pub fn restart(&self) {
        // SAFETY: the cursor is ours, never destroyed.
        unsafe { api!(RedisModule_ScanCursorRestart)(self.0) };
    }

    /// One RM_Scan step in the selected db of `ctx`: `f` sees each key's
    /// name and its open key (None if it cannot be opened), both valid only
    /// during that call. True when there is more to scan.
    pub fn scan<F: FnMut(RString, Option<KeyRef<'_>>)>(&self, ctx: Ctx, mut f: F) -> bool {
        unsafe extern "C" fn each<F: FnMut(RString, Option<KeyRef<'_>>)>(
            _ctx: Ctx,
            name: RString,
            key: KeyPtr,
            data: *mut c_void,
        ) {
            // SAFETY: `data` is the `&mut F` that `scan` passed RM_Scan,
            // alive and not otherwise used while RM_Scan runs.
            let f = unsafe { &mut *data.cast::<F>() };
            // Open for this call (RM_Scan opened it and closes it after).
            let key = NonNull::new(key).map(|ptr| KeyRef {
                ptr,
                open: PhantomData,
            });
            f(name, key);
        }
        let each =
            raw_callback!(each::<F> as unsafe extern "C" fn(Ctx, RString, KeyPtr, *mut c_void));
        // SAFETY: ctx is a handle Redis gave the caller, the cursor is ours,
        // and `f` outlives the call (RM_Scan calls back only during it).
        let more =
            unsafe { api!(RedisModule_Scan)(ctx.0, self.0, each, (&mut f as *mut F).cast()) };
        more != 0
    }
}

// ---- blocked clients ----

/// The callbacks of clients blocked with [`block_client`], and the data
/// they are unblocked with. Each callback runs in [`guard`].
pub trait Blocking {
    /// What a client is unblocked with ([`BlockedClient::unblock`]).
    type Data;
    /// The reply callback, after the client was unblocked: its data, if it
    /// was unblocked with some.
    fn on_reply(ctx: Ctx, data: Option<&mut Self::Data>);
    /// The timeout callback (also CLIENT UNBLOCK): `addr` is the address
    /// of its handle ([`BlockedClient::addr`]).
    fn on_timeout(ctx: Ctx, addr: usize);
    /// The client went away (or CLIENT UNBLOCK ... ERROR), while blocked.
    fn on_disconnect(addr: usize);
    /// The last word on an unblocked client's data.
    fn on_free(data: Box<Self::Data>);
}

/// A blocked client's handle, owned until it is unblocked: consumed by
/// [`BlockedClient::unblock`], so never unblocked twice.
pub struct BlockedClient<B: Blocking> {
    ptr: NonNull<raw::RedisModuleBlockedClient>,
    blocking: PhantomData<fn() -> B>,
}

// SAFETY: a handle is only passed back to Redis, on Redis's main thread
// (handles are created, kept and unblocked there); Send is for keeping it
// in a Rust static behind a Mutex.
unsafe impl<B: Blocking> Send for BlockedClient<B> {}

/// Blocks the calling client, with `B`'s callbacks and Redis's own timeout
/// `timeout_ms` (0: none). None if Redis gave no handle.
pub fn block_client<B: Blocking>(ctx: Ctx, timeout_ms: i64) -> Option<BlockedClient<B>> {
    let on_reply = raw_callback!(blocked_on_reply::<B> as BlockedFn);
    let on_timeout = raw_callback!(blocked_on_timeout::<B> as BlockedFn);
    let on_free = raw_callback!(blocked_free::<B> as unsafe extern "C" fn(Ctx, *mut c_void));
    // SAFETY: ctx is the running command's context; the callbacks expect
    // the data type `B::Data`, the only one `BlockedClient<B>::unblock`
    // hands Redis.
    let ptr =
        unsafe { api!(RedisModule_BlockClient)(ctx.0, on_reply, on_timeout, on_free, timeout_ms) };
    Some(BlockedClient {
        ptr: NonNull::new(ptr)?,
        blocking: PhantomData,
    })
}

impl<B: Blocking> BlockedClient<B> {
    /// The handle's address: how `B`'s callbacks name the handle (Redis
    /// reuses it once the handle is freed).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Has `B::on_disconnect` called if the client goes away while blocked
    /// (where the server has RM_SetDisconnectCallback).
    pub fn set_disconnect_callback(&self) {
        if let Some(set_disconnect) = optional_api!(RedisModule_SetDisconnectCallback) {
            let callback = raw_callback!(
                blocked_on_disconnect::<B>
                    as unsafe extern "C" fn(Ctx, *mut raw::RedisModuleBlockedClient)
            );
            // SAFETY: a handle not yet unblocked (this owns it).
            unsafe { set_disconnect(self.ptr.as_ptr(), callback) };
        }
    }

    /// The one RM_UnblockClient of this handle: Redis frees the handle (and
    /// the two temporary clients it holds) only then, also after a
    /// disconnect. `data` goes to `B::on_reply`, then `B::on_free`.
    pub fn unblock(self, data: Option<Box<B::Data>>) {
        let data = data.map_or(std::ptr::null_mut(), Box::into_raw);
        // SAFETY: the handle came from RM_BlockClient and, being consumed
        // here (not dropped: see below), is unblocked exactly once; `data`
        // is NULL or a Box<B::Data> that Redis hands back to
        // `blocked_free::<B>`.
        unsafe { api!(RedisModule_UnblockClient)(self.ptr.as_ptr(), data.cast()) };
        std::mem::forget(self);
    }
}

/// A handle dropped without [`unblock`](BlockedClient::unblock) (a panic
/// on the way, a map cleared) is unblocked with no data, as Redis requires
/// of every blocked client: the client is answered by its reply callback
/// with nothing to deliver, and the handle is not leaked.
impl<B: Blocking> Drop for BlockedClient<B> {
    fn drop(&mut self) {
        // SAFETY: the handle came from RM_BlockClient and was not unblocked
        // (`unblock` forgets it), so this is its one RM_UnblockClient.
        unsafe { api!(RedisModule_UnblockClient)(self.ptr.as_ptr(), std::ptr::null_mut()) };
    }
}

unsafe extern "C" fn blocked_on_reply<B: Blocking>(
    ctx: Ctx,
    _argv: *mut RString,
    _argc: c_int,
) -> c_int {
    guard("the blocked-client reply", (), || {
        // SAFETY: ctx is the reply callback's context; its private data is
        // NULL or the Box<B::Data> it was unblocked with (`unblock`), owned
        // by Redis until `blocked_free`, and not otherwise used meanwhile.
        let data = unsafe {
            api!(RedisModule_GetBlockedClientPrivateData)(ctx.0)
                .cast::<B::Data>()
                .as_mut()
        };
        B::on_reply(ctx, data);
    });
    raw::REDISMODULE_OK as c_int
}

unsafe extern "C" fn blocked_on_timeout<B: Blocking>(
    ctx: Ctx,
    _argv: *mut RString,
    _argc: c_int,
) -> c_int {
    guard("the blocked-client timeout", (), || {
        // SAFETY: ctx is the timeout callback's context.
        let client = unsafe { api!(RedisModule_GetBlockedClientHandle)(ctx.0) } as usize;
        B::on_timeout(ctx, client);
    });
    raw::REDISMODULE_OK as c_int
}

unsafe extern "C" fn blocked_on_disconnect<B: Blocking>(
    _ctx: Ctx,
    client: *mut raw::RedisModuleBlockedClient,
) {
    guard("the blocked-client disconnect", (), || {
        B::on_disconnect(client as usize)
    })
}

unsafe extern "C" fn blocked_free<B: Blocking>(_ctx: Ctx, data: *mut c_void) {
    guard("the blocked-client cleanup", (), || {
        if data.is_null() {
            return;
        }
        // SAFETY: `data` is the Box<B::Data> handed to RM_UnblockClient
        // (`unblock`), and Redis calls this once for it.
        B::on_free(unsafe { Box::from_raw(data.cast::<B::Data>()) });
    })
}

// ---- clients ----

/// The calling client's id, where the server can tell.
pub fn client_id(ctx: Ctx) -> Option<u64> {
    // SAFETY: ctx is a handle Redis gave the caller.
    optional_api!(RedisModule_GetClientId).map(|get| unsafe { get(ctx.0) })
}

/// Whether the calling client is blocked now (RM_BlockClient can refuse, for
/// example on Valkey for a timeout it finds out of range, or in contexts
/// that cannot block). Yes when it cannot be told.
pub fn client_is_blocked(ctx: Ctx) -> bool {
    let (Some(get_id), Some(get_info)) = (
        optional_api!(RedisModule_GetClientId),
        optional_api!(RedisModule_GetClientInfoById),
    ) else {
        return true;
    };
    let mut info = raw::RedisModuleClientInfo {
        version: 1,
        flags: 0,
        id: 0,
        addr: [0; 46],
        port: 0,
        db: 0,
    };
    // SAFETY: ctx is a handle Redis gave the caller.
    let id = unsafe { get_id(ctx.0) };
    // SAFETY: `info` is a version-1 RedisModuleClientInfo that Redis fills.
    let found = unsafe { get_info((&mut info as *mut raw::RedisModuleClientInfo).cast(), id) };
    found != raw::REDISMODULE_OK as c_int
        || info.flags & raw::REDISMODULE_CLIENTINFO_FLAG_BLOCKED as u64 != 0
}

/// The name of the user of client `id`; None where the server cannot tell
/// or the client is gone.
pub fn client_user_name(ctx: Ctx, id: u64) -> Option<OwnedString> {
    let user_name = optional_api!(RedisModule_GetClientUserNameById)?;
    // SAFETY: ctx is a handle Redis gave the caller.
    OwnedString::take(ctx, RString(unsafe { user_name(ctx.0, id) }))
}

// ---- commands ----

/// Whether the server has RM_CreateCommand.
pub fn can_create_commands() -> bool {
    optional_api!(RedisModule_CreateCommand).is_some()
}

/// RM_CreateCommand (first key, last key, step: 1, 1, 1): whether Redis
/// accepted; None where it lacks the API.
pub fn create_command(ctx: Ctx, name: &CStr, callback: CommandFn, flags: &CStr) -> Option<bool> {
    let create = optional_api!(RedisModule_CreateCommand)?;
    let callback = raw_callback!(callback);
    // SAFETY: ctx is the load context Redis gave the caller; Redis copies
    // the strings; the callback is a plain function.
    let ok = unsafe { create(ctx.0, name.as_ptr(), callback, flags.as_ptr(), 1, 1, 1) };
    Some(ok == raw::REDISMODULE_OK as c_int)
}

/// Adds an ACL category, where the server allows it (7.4+).
pub fn add_acl_category(ctx: Ctx, name: &CStr) -> bool {
    match optional_api!(RedisModule_AddACLCategory) {
        // SAFETY: ctx is the load context Redis gave the caller.
        Some(add) => unsafe { add(ctx.0, name.as_ptr()) == raw::REDISMODULE_OK as c_int },
        None => false,
    }
}

/// The command `name` of this module; None where the server has no
/// RM_GetCommand, or no such command.
fn command_of(ctx: Ctx, name: &CStr) -> Option<*mut raw::RedisModuleCommand> {
    let get_command = optional_api!(RedisModule_GetCommand)?;
    // SAFETY: ctx is the load context Redis gave the caller.
    let command = unsafe { get_command(ctx.0, name.as_ptr()) };
    (!command.is_null()).then_some(command)
}

/// Puts the command `name` in the ACL categories `categories` (7.2+,
/// Valkey 8): None where the server cannot, or has no such command;
/// otherwise whether it accepted them.
pub fn set_command_acl_categories(ctx: Ctx, name: &CStr, categories: &CStr) -> Option<bool> {
    let set_categories = optional_api!(RedisModule_SetCommandACLCategories)?;
    let command = command_of(ctx, name)?;
    // SAFETY: `command` was just looked up (not NULL); Redis copies the
    // string.
    Some(unsafe { set_categories(command, categories.as_ptr()) } == raw::REDISMODULE_OK as c_int)
}

/// One argument as COMMAND DOCS describes it.
pub struct ArgDoc {
    pub name: &'static CStr,
    pub kind: raw::RedisModuleCommandArgType,
    /// The word that introduces it (`BLOCK`), if any.
    pub token: Option<&'static CStr>,
    pub optional: bool,
    /// Given one or more times (`key [key ...]`).
    pub multiple: bool,
    pub summary: &'static CStr,
}

/// Where a command's keys are.
#[derive(Clone, Copy)]
pub enum KeyPlace {
    /// One key, at argv[1].
    First,
    /// `numkeys key [key ...]`: the count at argv[1], the keys after it.
    NumKeys,
}

/// Declares the command `name`'s arity, its keys (with `key_flags`),
/// summary and arguments (COMMAND INFO, COMMAND DOCS).
#[allow(clippy::too_many_arguments)] // one input per part of the info
pub fn set_command_info(
    ctx: Ctx,
    name: &CStr,
    summary: &CStr,
    arity: c_int,
    key_flags: u64,
    keys: KeyPlace,
    args: &[ArgDoc],
) -> Result<(), &'static str> {
    let (Some(_), Some(set_info)) = (
        optional_api!(RedisModule_GetCommand),
        optional_api!(RedisModule_SetCommandInfo),
    ) else {
        return Err("this server has no RedisModule_SetCommandInfo");
    };
    let Some(command) = command_of(ctx, name) else {
        return Err("RedisModule_GetCommand found no such command");
    };
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    // One key at argv[1]; the array ends with an all-zero spec.
    // SAFETY: a plain C struct of integers, raw pointers and unions of
    // those: all zeros is a valid value (C's `{0}`).
    let mut key_specs: [raw::RedisModuleCommandKeySpec; 2] = unsafe { std::mem::zeroed() };
    key_specs[0].flags = key_flags;
    key_specs[0].begin_search_type =
        raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    key_specs[0].bs.index.pos = 1;
    match keys {
        KeyPlace::First => {
            key_specs[0].find_keys_type =
                raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
            key_specs[0].fk.range.lastkey = 0;
            key_specs[0].fk.range.keystep = 1;
            key_specs[0].fk.range.limit = 0;
        }
        KeyPlace::NumKeys => {
            key_specs[0].find_keys_type =
                raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
            key_specs[0].fk.keynum.keynumidx = 0;
            key_specs[0].fk.keynum.firstkey = 1;
            key_specs[0].fk.keynum.keystep = 1;
        }
    }
    // The array ends with an all-zero entry; Redis copies it.
    let mut raw_args: Vec<raw::RedisModuleCommandArg> = args
        .iter()
        .map(|a| {
            let mut raw_arg = zeroed_arg();
            raw_arg.name = a.name.as_ptr();
            raw_arg.type_ = a.kind;
            raw_arg.key_spec_index =
                if a.kind == raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY {
                    0
                } else {
                    -1
                };
            raw_arg.token = a.token.map_or(std::ptr::null(), CStr::as_ptr);
            raw_arg.summary = a.summary.as_ptr();
            if a.optional {
                raw_arg.flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int;
            }
            if a.multiple {
                raw_arg.flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE as c_int;
            }
            raw_arg
        })
        .collect();
    raw_args.push(zeroed_arg());
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: summary.as_ptr(),
        complexity: c"O(1)".as_ptr(),
        since: c"0.1.0".as_ptr(),
        history: std::ptr::null_mut(),
        tips: std::ptr::null(),
        arity,
        key_specs: key_specs.as_mut_ptr(),
        args: raw_args.as_mut_ptr(),
    };
    // SAFETY: `command` was just looked up (not NULL); `info` and everything
    // it points at (static strings, the local arrays, each ending with an
    // all-zero entry) are alive for the call, and Redis copies them.
    if unsafe { set_info(command, &info) } != raw::REDISMODULE_OK as c_int {
        return Err("RedisModule_SetCommandInfo refused the command info");
    }
    Ok(())
}

fn zeroed_arg() -> raw::RedisModuleCommandArg {
    // SAFETY: a plain C struct of integers and raw pointers: all zeros is a
    // valid value (C's `{0}`).
    unsafe { std::mem::zeroed() }
}

// ---- libc ----

/// A clock read straight from clock_gettime (a vDSO call), in µs:
/// SystemTime's checked conversions cost a grant more than the clock itself.
pub fn clock_us(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid pointer: it cannot fail.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000 + ts.tv_nsec / 1_000
}

// ---- guarded commands (LOCK.EXEC, LOCK.FENCED) ----

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
pub struct CallReply(NonNull<raw::RedisModuleCallReply>);

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
fn call_reply_bytes(reply: *mut raw::RedisModuleCallReply) -> Option<Vec<u8>> {
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
