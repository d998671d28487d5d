//! The pure lock engine. Nothing here knows about Redis or reads a clock:
//! time comes in as a parameter (Unix µs or ms), storage through the
//! [`lock::LockSlot`] trait, fencing tokens from a [`fence::FenceSource`],
//! and blocked clients are opaque handles. Functions return what happened
//! (replies, [`waiters::Wake`]s, when to call again); the Redis glue in
//! `crate::redis` executes that. The unit tests here and the model test in
//! `core::model` (a test module) drive it with a hand-driven clock.
//!
//! * `lock`    — the lock state machine (acquire, release, extend, take-back)
//! * `waiters` — FIFO waiter lines, BLOCK timeouts, every hand-off decision
//! * `fence`   — the fencing high-water mark
//! * `histogram` — power-of-two buckets of wait and hold times
//! * `cluster` — hash slots, and where a key that left this node went
//! * `args`    — argument parsing and validation
//! * `codec`   — the persisted form of a lock value, decoded and checked
//! * `fuzz`    — entry points of the fuzz targets in `fuzz/`
//! * `limits`  — every bound on input
//! * `error`   — every error reply

pub mod args;
pub mod cluster;
pub mod codec;
pub mod error;
pub mod fence;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz;
pub mod histogram;
pub mod limits;
pub mod lock;
#[cfg(test)]
mod model;
pub mod node;
#[cfg(any(test, feature = "fuzzing"))]
pub mod rdb_bytes;
pub mod waiters;
