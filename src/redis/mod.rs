//! The thin layer that binds the pure engine in `crate::core` to Redis.
//!
//! * `commands` — the command table and one handler per command
//! * `blocking` — BLOCK: FIFO waiters per lock and the hand-off to them
//! * `slot`     — a key of the keyspace seen as a `core::lock::LockSlot`;
//!   every change it makes is replicated as an absolute effect
//! * `datatype` — the `redislock` data type: RDB/AOF persistence, digest,
//!   memory usage (the persistence format is documented there)
//! * `node`     — node-wide state: fence high-water mark, restart delay,
//!   counters, server events (loading, promotion)
//! * `info`     — the `INFO lock` section
//! * `propagation` — whether a write's effect can reach the AOF or a replica
//! * `ffi`      — the few unsafe helpers everything above shares

pub mod blocking;
pub mod commands;
pub mod datatype;
pub mod ffi;
pub mod info;
pub mod node;
pub mod propagation;
pub mod slot;
