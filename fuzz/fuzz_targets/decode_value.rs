//! The value decoder (`src/core/codec.rs`): an encoding version byte, then
//! the bytes Redis stores for a lock value. See `core::fuzz::decode_value`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| redis_lock_fuzz::core::fuzz::decode_value(data));
