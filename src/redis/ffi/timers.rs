//! Module timers.

use super::*;

/// Creates a timer calling `callback` (with no data) after `period_ms`.
pub fn create_timer(ctx: Ctx, period_ms: i64, callback: TimerFn) -> u64 {
    let callback = raw_callback!(callback as TimerFn);
    // SAFETY: ctx is a handle Redis gave the caller (or the detached
    // context, alive for the process); the callback is a plain function and
    // its data is NULL.
    unsafe { api!(RedisModule_CreateTimer)(ctx.0, period_ms, callback, std::ptr::null_mut()) }
}

/// Stops the timer `id` (a stale id is refused by Redis, changing nothing).
pub fn stop_timer(ctx: Ctx, id: u64) {
    let mut data: *mut c_void = std::ptr::null_mut();
    // SAFETY: ctx as in `create_timer`; `data` is a valid out-pointer (the
    // module's timers carry no data to free).
    unsafe { api!(RedisModule_StopTimer)(ctx.0, id, &mut data) };
}
