//! redis-lock: native `LOCK.*` commands for Redis with fencing tokens.
//!
//! Where things are:
//! * the command table ............ `redis::commands::COMMANDS`
//! * the lock state machine ....... `core::lock`
//! * fencing rules ................ `core::fence`
//! * argument parsing ............. `core::args`
//! * the persistence format ....... `redis::datatype`
//! * module options, start-up ..... this file
//!
//! `unsafe` code lives in `redis::ffi` (the FFI facade) and
//! `redis::datatype` (the value's memory layout and the type callbacks)
//! only; every block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

/// The pure engine, its own crate (`core/`): `cargo test -p redis-lock-core`
/// runs without Redis or clang.
pub use redis_lock_core as core;
#[cfg(not(test))]
mod module;
#[cfg_attr(test, allow(dead_code))]
mod redis;
