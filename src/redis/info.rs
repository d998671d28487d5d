//! The `INFO lock` section.

use std::sync::atomic::Ordering::Relaxed;

use redis_module::raw;

use super::engine;
use super::ffi::guard;
use super::server::{self, SERVER, STATS};
use crate::core::histogram;

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
            ("handoffs", &STATS.handoffs),
            ("block_timeouts", &STATS.block_timeouts),
            ("take_backs", &STATS.take_backs),
            ("refused_evictable", &STATS.refused_evictable),
            ("redirects", &STATS.redirects),
            ("sweep_keys", &STATS.sweep_keys),
            ("sweep_passes", &STATS.sweep_passes),
            ("exec_ran", &STATS.exec_ran),
            ("exec_notheld", &STATS.exec_notheld),
            ("fenced_ran", &STATS.fenced_ran),
            ("fenced_stale", &STATS.fenced_stale),
            ("gates_put_back", &STATS.gates_put_back),
        ];
        for (name, counter) in counters {
            raw::add_info_field_unsigned_long_long(ctx, name, counter.load(Relaxed));
        }
        raw::add_info_field_long_long(ctx, "locks", STATS.locks.load(Relaxed));
        raw::add_info_field_unsigned_long_long(ctx, "waiters", engine::waiters_total() as u64);
        raw::add_info_field_unsigned_long_long(ctx, "observers", engine::observers_total() as u64);
        let filed = engine::with_engine(|n| n.lease_ends_filed());
        raw::add_info_field_unsigned_long_long(ctx, "lease_ends", filed as u64);
        raw::add_info_field_unsigned_long_long(
            ctx,
            "wait_time_total_ms",
            STATS.wait_total_us.load(Relaxed) / 1000,
        );
        raw::add_info_field_unsigned_long_long(
            ctx,
            "wait_time_max_ms",
            STATS.wait_max_us.load(Relaxed) / 1000,
        );
        for (name, histogram) in [
            ("wait_ms", &server::WAIT_TIMES),
            ("hold_ms", &server::HOLD_TIMES),
        ] {
            let cumulative = histogram::cumulative(&histogram.counts());
            for (i, n) in cumulative.iter().enumerate() {
                let field = format!("{name}_{}", histogram::bucket_name(i));
                raw::add_info_field_unsigned_long_long(ctx, &field, *n);
            }
            let count = histogram.count.load(Relaxed);
            raw::add_info_field_unsigned_long_long(ctx, &format!("{name}_count"), count);
            let sum = histogram.sum_ms.load(Relaxed);
            raw::add_info_field_unsigned_long_long(ctx, &format!("{name}_sum"), sum);
        }
        raw::add_info_field_long_long(ctx, "fence_hwm", engine::fence_hwm());
        raw::add_info_field_long_long(
            ctx,
            "grants_paused_ms",
            engine::with_engine(|n| n.grants_paused_ms(server::mono_ms())),
        );
        raw::add_info_field_long_long(
            ctx,
            "eviction_unsafe",
            i64::from(SERVER.evictable.load(Relaxed)),
        );
    })
}
