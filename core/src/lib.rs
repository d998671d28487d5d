//! The pure lock engine of the redis-lock module. Nothing here knows about
//! Redis or reads a clock: time comes in as a parameter (a [`time::Now`]:
//! the monotonic clock for leases and timeouts, the wall clock for fences),
//! keys through the [`lock::LockStore`] trait, and blocked clients are
//! opaque handles. [`node::Node`] makes every lock decision of a server
//! and returns what to do (replies, waiters to answer, when to call again);
//! the Redis glue (`src/redis/` of the module) executes that, and so does
//! the model test (`model`), with a hand-driven clock.
//!
//! * `node`    — the node: every lock decision, inputs in, actions out
//! * `output`  — what the node decided, as data the glue carries out
//! * `lock`    — the per-key lock state machine (acquire, release, extend, take-back)
//! * `waiters` — FIFO waiter lines, BLOCK timeouts, the order of hand-offs
//! * `fence`   — the fencing high-water mark
//! * `grant_tally` — grants by key (a fixed-size sketch), for `LOCK.INFO`
//! * `time`    — the two clocks (monotonic for leases, wall for fences)
//! * `histogram` — power-of-two buckets of wait and hold times
//! * `cluster` — hash slots, and where a key that left this node went
//! * `args`    — argument parsing and validation
//! * `glob`    — `MATCH` patterns, matched as Redis matches them
//! * `guarded` — `LOCK.EXEC` and `LOCK.FENCED`: their arguments, which
//!   commands may run guarded, the gate's rule
//! * `codec`   — the persisted form of a lock value, decoded and checked
//! * `limits`  — every bound on input
//! * `error`   — every error reply
//! * `protocol` — what the module and its clients share: command names,
//!   `LOCK.INFO` fields, error codes, options with their bounds and defaults
//! * `fuzz`, `rdb_bytes` — the fuzz targets' entry points and Redis's RDB
//!   encoding of a value (tests and the `fuzzing` feature only)
#![forbid(unsafe_code)]

pub mod args;
mod checks;
pub mod cluster;
pub mod codec;
pub mod error;
mod fence;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz;
pub mod glob;
mod grant_tally;
pub mod guarded;
pub mod histogram;
mod lease_ends;
pub mod limits;
mod lock;
#[cfg(test)]
mod model;
pub mod node;
mod observers;
pub mod output;
pub mod protocol;
#[cfg(any(test, feature = "fuzzing"))]
pub mod rdb_bytes;
pub mod time;
mod waiters;

// Lock state is read and changed only through `node::Node`: the state
// machine, the lines and the fence mark are private; these are the types
// a caller passes in (a store) or gets back (a lock's view, a waiter's
// outcome), and how to walk a key's holders.
pub use lock::{holders, Lock, LockRead, LockStore, Mode, Removal};
pub use observers::Leader;
pub use waiters::{Outcome, Wake};
