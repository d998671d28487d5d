//! The FFI facade: every call into the raw module API (`raw::RedisModule_*`)
//! and libc made outside the data type (`datatype`, which owns the value's
//! memory layout and the type callbacks) goes through a small function in
//! this folder, one file per part of the API, all re-exported here as
//! `ffi::...`. Also: reading argv as bytes without allocating, sending
//! replies, and the guard that keeps panics out of Redis. The handles and
//! the macros every part uses are in this file.
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

mod acl;
mod argv;
mod blocked;
mod clients;
mod clock;
mod commands;
mod context;
mod events;
mod guarded;
mod keys;
mod replication;
mod reply;
mod scan;
mod timers;

pub use acl::*;
pub use argv::*;
pub use blocked::*;
pub use clients::*;
pub use clock::*;
pub use commands::*;
pub use context::*;
pub use events::*;
pub use guarded::*;
pub use keys::*;
pub use replication::*;
pub use reply::*;
pub use scan::*;
pub use timers::*;
