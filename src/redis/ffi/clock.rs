//! The clocks, read through libc.

/// A clock read straight from clock_gettime (a vDSO call), in µs:
/// SystemTime's checked conversions cost a grant more than the clock itself.
pub fn clock_us(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid pointer: it cannot fail.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000 + ts.tv_nsec / 1_000
}
