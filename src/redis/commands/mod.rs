//! The command table and one handler per command. Handlers parse with the
//! core parsers, open the key, run the core state machine, count, and return
//! a [`Reply`]; `ffi::run_command` sends it (or the error) and keeps panics
//! out of Redis.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

use super::blocked;
use super::datatype;
use super::engine;
use super::executor::{self, Decided, Site, WaiterAcl};
use super::ffi::{
    self, command_callback, context_flags, log_warning, may_write_key, ArgDoc, Argv, CommandFn,
    Ctx, KeyPlace, OpenKey, Read, Reply, Value,
};
use super::guarded;
use super::keyspace::{LockKey, ReadKey};
use super::server;
use super::timer;
use crate::core::args;
use crate::core::error::LockError;
use crate::core::glob;
use crate::core::node::{Acquire, AcquireRequest, Held, Observation};
use crate::core::protocol::{self, info_field};
use crate::core::time::Now;
use crate::core::{Lock, Mode};

mod locks;
mod outside;
mod reads;
mod table;

use locks::*;
use outside::*;
use reads::*;
pub use table::*;

/// The key a command names, opened for writing, as the node takes it.
#[inline(always)] // on every grant: part of one inlined path (callgrind)
fn open_for_write(ctx: Ctx, argv: &Argv) -> Result<LockKey, LockError> {
    LockKey::open(ctx, argv.key())
}

/// Carries out what a command on `argv`'s key decided, with the key still
/// open as `store` (a key of another type: nothing to replicate).
#[inline(always)] // on every grant: part of one inlined path (callgrind)
fn carry_out(
    ctx: Ctx,
    argv: &Argv,
    store: &Result<LockKey, LockError>,
    decided: Decided,
    now: Now,
) {
    let name = argv.key();
    match store {
        Ok(store) => executor::carry_out(ctx, decided, Site::Command { name, store, now }),
        Err(_) => executor::carry_out(ctx, decided, Site::Background),
    }
}

/// Answers a key-position request of a `numkeys key [key ...]` command:
/// the keys numkeys names (as far as argv goes; the command itself refuses
/// a bad count).
fn report_numkeys(ctx: Ctx, argv: &Argv, flags: u64) -> Reply {
    let argc = argv.all().len();
    let n = argv
        .bytes()
        .get(1)
        .and_then(|b| args::parse_i64(b).ok())
        .filter(|&n| n > 0)
        .map_or(0, |n| {
            (n as u64).min(argc.saturating_sub(2) as u64) as usize
        });
    for pos in 2..2 + n {
        ffi::report_key(ctx, pos, flags);
    }
    Reply::KeysReported
}

/// Every argument's bytes (a multi-key command's argv is not cut at
/// `ffi::MAX_ARGS`).
fn all_bytes<'a>(argv: &Argv<'a>) -> Vec<&'a [u8]> {
    argv.all().iter().map(ffi::string_bytes_of).collect()
}

/// Inside MULTI/EXEC and Lua, BLOCK answers at once, as BLPOP does there.
fn may_block(ctx: Ctx) -> bool {
    let no_blocking = raw::REDISMODULE_CTX_FLAGS_MULTI
        | raw::REDISMODULE_CTX_FLAGS_LUA
        | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
    context_flags(ctx) & no_blocking == 0
}
