//! The `INFO lock` section.

use std::sync::atomic::Ordering::Relaxed;

use redis_module::raw;

use super::blocking;
use super::ffi::guard;
use super::node::{self, STATS};

pub extern "C" fn info_section(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: i32) {
    guard("INFO", (), || {
        // A NULL section name is the module's own name: `INFO lock`. Field
        // names get the module prefix: `lock_grants`, ...
        raw::add_info_section(ctx, None);
        let counters = [
            ("grants", &STATS.grants),
            ("contended", &STATS.contended),
            ("releases", &STATS.releases),
            ("extends", &STATS.extends),
            ("expirations", &STATS.expirations),
        ];
        for (name, counter) in counters {
            raw::add_info_field_unsigned_long_long(ctx, name, counter.load(Relaxed));
        }
        raw::add_info_field_long_long(ctx, "locks", STATS.locks.load(Relaxed));
        raw::add_info_field_unsigned_long_long(ctx, "waiters", blocking::waiters_total() as u64);
        raw::add_info_field_unsigned_long_long(ctx, "handoffs", blocking::HANDOFFS.load(Relaxed));
        raw::add_info_field_unsigned_long_long(
            ctx,
            "block_timeouts",
            blocking::BLOCK_TIMEOUTS.load(Relaxed),
        );
        raw::add_info_field_unsigned_long_long(
            ctx,
            "wait_time_total_ms",
            blocking::WAIT_TOTAL_US.load(Relaxed) / 1000,
        );
        raw::add_info_field_unsigned_long_long(
            ctx,
            "wait_time_max_ms",
            blocking::WAIT_MAX_US.load(Relaxed) / 1000,
        );
        raw::add_info_field_long_long(ctx, "fence_hwm", node::fence_hwm());
        raw::add_info_field_long_long(
            ctx,
            "grants_paused_ms",
            node::grants_paused_ms(node::now_ms()),
        );
    })
}
