//! The thin layer that binds the pure engine in `crate::core` to Redis.
//! Dependencies run one way, top to bottom; `crate::module` wires them.
//!
//! * `commands`  — the command table and one handler per command
//! * `events`    — server events and keyspace notifications
//! * `handoff`   — BLOCK: blocked clients and the timer that executes the
//!   decisions of `core::waiters`
//! * `keyspace`  — a key of the keyspace seen as a `core::lock::LockSlot`;
//!   every change it makes is replicated as an absolute effect
//! * `datatype`  — the `redislock` data type: RDB/AOF persistence, digest,
//!   memory usage (the persistence format is documented there)
//! * `info`      — the `INFO lock` section
//! * `propagation` — whether a write's effect can reach the AOF or a replica
//! * `node`      — node-wide state: fence mark, options, restart delay,
//!   counters, the clock
//! * `ffi`       — the few unsafe helpers everything above shares

pub mod commands;
pub mod datatype;
pub mod events;
pub mod ffi;
pub mod handoff;
pub mod info;
pub mod keyspace;
pub mod node;
pub mod propagation;
