//! redis-lock: native `LOCK.*` commands for Redis with fencing tokens.
//!
//! Where things are:
//! * the command table ............ `redis::commands::COMMANDS`
//! * the lock state machine ....... behind `core::node::Node`
//!   (`core/src/node/`), which makes every lock decision; the state
//!   machine itself (`core/src/lock.rs`) is private to the core crate
//! * fencing rules ................ `core::node::Node` too (the mark, in the
//!   private `core/src/fence.rs`); the gate's rule in `core::guarded`
//! * argument parsing ............. `core::args`
//! * the persistence format ....... `redis::datatype`
//! * module options, start-up ..... `module` (`src/module.rs`)
//!
//! `unsafe` code lives in `redis::ffi` (the FFI facade), `redis::datatype`
//! (the lock value's memory layout and the type callbacks) and
//! `redis::gate` (the fence gate type's value and callbacks) only; every
//! block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

/// The pure engine, its own crate (`core/`): `cargo test -p redis-lock-core`
/// runs without Redis or clang.
pub use redis_lock_core as core;
#[cfg(not(test))]
mod module;
#[cfg_attr(test, allow(dead_code))]
mod redis;
