//! The module's pure core (`src/core`), compiled in without Redis. The fuzz
//! targets call its entry points in `core::fuzz`, the same functions the
//! unit test `core::fuzz::tests` runs over `corpus/`.
#![allow(dead_code)]

#[path = "../../src/core/mod.rs"]
pub mod core;
