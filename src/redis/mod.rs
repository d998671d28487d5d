//! The thin layer that binds the pure engine in `crate::core` to Redis;
//! `crate::module` wires it. Its modules import only downwards (see
//! ARCHITECTURE.md, Dependencies; `tests/layering.rs` checks it):
//!
//! * `commands`  — the command table and one handler per command
//! * `guarded`   — `LOCK.EXEC` and `LOCK.FENCED`: the inner command run
//!   through RM_Call once the node allowed it
//! * `gate`      — the `lock_gate` data type (a fence gate's mark)
//! * `evicted`   — gates maxmemory evicted, their marks kept and put back
//! * `events`    — server events and the type's unlink callback
//! * `timer_run` — what a run of the hand-off timer does; flush, SWAPDB
//! * `sweep`     — the background reclamation of ended locks
//! * `executor`  — carrying out what the node decided (`core::output`):
//!   replies to waiters, replication, keyspace events, statistics
//! * `blocked`   — BLOCK waiters as Redis blocked clients, one reply each
//! * `keyspace`  — a key of the keyspace seen as a plain `core::LockStore`,
//!   and how a changed key is replicated (as an absolute effect)
//! * `datatype`  — the `redislock` data type: RDB/AOF persistence, digest,
//!   memory usage (the persistence format is documented there)
//! * `engine`    — the server's one `core::node::Node` (every lock
//!   decision), its options, the server's conditions
//! * `timer`     — the hand-off timer itself (the sweep has its own) and
//!   its inbox of inputs from callbacks that cannot enter the node
//! * `info`      — the `INFO lock` section
//! * `propagation` — whether a write's effect can reach the AOF or a replica
//! * `server`    — the clock, key and waiter identities, cached server
//!   configuration, counters (lease ids are the core node's)
//! * `ffi`       — the FFI facade: every raw module API (and libc) call
//!   outside `datatype` and `gate`, behind small safe functions; with
//!   those two (their values' memory layout, the type callbacks) the only
//!   `unsafe` code

pub mod blocked;
pub mod commands;
pub mod datatype;
pub mod engine;
pub mod events;
pub mod evicted;
pub mod executor;
pub mod ffi;
pub mod gate;
pub mod guarded;
pub mod info;
pub mod keyspace;
pub mod propagation;
pub mod server;
pub mod sweep;
pub mod timer;
pub mod timer_run;
