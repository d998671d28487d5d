//! The pure lock engine. Nothing here knows about Redis: time comes in as a
//! parameter (`now_ms`), storage comes in through the [`lock::LockSlot`] trait,
//! and fencing tokens come from a [`fence::FenceSource`]. The Redis glue in
//! `crate::redis` binds these to the keyspace; the unit tests bind them to
//! plain values and a hand-driven clock.

pub mod args;
pub mod error;
pub mod fence;
pub mod lock;
pub mod queue;
