//! The module's pure core (`core/`, the `redis-lock-core` crate). The fuzz
//! targets call its entry points in `core::fuzz`, the same functions the
//! unit test `fuzz::tests` of that crate runs over `corpus/`.

pub use redis_lock_core as core;
