//! Argument parsing (`src/core/args.rs`): one argv per input, arguments
//! separated by '\n'. See `core::fuzz::parse_args` for the properties.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| redis_lock_fuzz::core::fuzz::parse_args(data));
