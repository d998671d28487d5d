//! Fencing tokens: one node-wide high-water mark (HWM), the largest token the
//! node has issued or seen. Every grant takes HWM + 1, so tokens strictly
//! increase on a node whatever happens to the keys (release, DEL, FLUSHALL).
//!
//! What keeps them increasing across restarts and failover:
//! * the HWM is saved with the data (RDB aux field) and every replicated or
//!   AOF-logged grant carries its token, which raises the HWM of whoever
//!   applies it ([`FenceCounter::observe`]);
//! * when a node loads its data or is promoted, the HWM is raised to at least
//!   the wall clock in microseconds ([`FenceCounter::raise_to_clock`]). A node
//!   that lost its tail, or all of its data, then starts above every token it
//!   could have issued, provided its clock did not go back across the restart
//!   and it issued fewer than a million grants a second on average.

use super::error::LockError;

/// Where the engine takes a new fencing token from.
pub trait FenceSource {
    fn next_fence(&mut self) -> Result<i64, LockError>;
}

/// The token after `hwm`; tokens are positive and fit in an i64.
pub fn next_after(hwm: i64) -> Result<i64, LockError> {
    match hwm.max(0).checked_add(1) {
        Some(next) => Ok(next),
        None => Err(LockError::FencesExhausted),
    }
}

/// The HWM rules over a plain value. The Redis glue applies the same rules
/// to an atomic; unit tests use this directly.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FenceCounter {
    hwm: i64,
}

impl FenceCounter {
    pub fn new(hwm: i64) -> Self {
        FenceCounter { hwm }
    }

    pub fn hwm(&self) -> i64 {
        self.hwm
    }

    /// A token issued elsewhere (master, AOF, RDB) was applied here.
    pub fn observe(&mut self, fence: i64) {
        self.hwm = self.hwm.max(fence);
    }

    /// At load and at promotion: never below the wall clock in µs.
    pub fn raise_to_clock(&mut self, now_us: i64) {
        self.observe(now_us);
    }
}

impl FenceSource for FenceCounter {
    fn next_fence(&mut self) -> Result<i64, LockError> {
        self.hwm = next_after(self.hwm)?;
        Ok(self.hwm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_strictly_increase() {
        let mut c = FenceCounter::default();
        let a = c.next_fence().unwrap();
        let b = c.next_fence().unwrap();
        assert_eq!((a, b), (1, 2));
    }

    #[test]
    fn observing_an_older_token_never_lowers_the_mark() {
        let mut c = FenceCounter::new(100);
        c.observe(5);
        assert_eq!(c.hwm(), 100);
        c.observe(500);
        assert_eq!(c.next_fence(), Ok(501));
    }

    #[test]
    fn restart_raises_to_the_clock_but_not_below_what_was_saved() {
        let mut lost_tail = FenceCounter::new(10);
        lost_tail.raise_to_clock(1_700_000_000_000_000);
        assert_eq!(lost_tail.next_fence(), Ok(1_700_000_000_000_001));

        let mut ahead = FenceCounter::new(i64::MAX - 5);
        ahead.raise_to_clock(1_700_000_000_000_000);
        assert_eq!(ahead.hwm(), i64::MAX - 5);
    }

    #[test]
    fn exhaustion_is_an_error_not_a_wrap() {
        let mut c = FenceCounter::new(i64::MAX - 1);
        assert_eq!(c.next_fence(), Ok(i64::MAX));
        assert_eq!(c.next_fence(), Err(LockError::FencesExhausted));
        assert_eq!(c.hwm(), i64::MAX);
    }
}
