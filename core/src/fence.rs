//! Fencing tokens: one node-wide high-water mark (HWM), the largest token the
//! node has issued or seen. This is the only implementation of its rules;
//! the Redis glue keeps one `FenceCounter` for the node.
//!
//! * A grant takes `max(HWM + 1, now in µs)`. Tokens strictly increase on a
//!   node whatever happens to the keys (release, DEL, FLUSHALL), and tokens
//!   of *different* nodes for the same key also increase over time, as long
//!   as their clocks differ by less than the time between the two grants:
//!   that is what keeps a key's tokens rising after a cluster slot moves to
//!   another node, or a replica that missed writes is promoted.
//! * Tokens applied from elsewhere (RDB, AOF, the master, MINFENCE) raise
//!   the HWM ([`FenceCounter::observe`]), but only within
//!   [`MAX_FENCE_LEAD`] of `max(HWM, now)`: one damaged or hostile value
//!   cannot use up the token space.
//! * At load and promotion the HWM is raised to the clock, or, when the
//!   clock is behind the HWM, [`SERVING_FENCE_GAP`] (10 s of µs) above it
//!   ([`FenceCounter::start_serving`]), so a node that lost its tail (grants
//!   a failover or a crash lost) starts above every token its predecessor
//!   could have issued: by the clock, when clocks agree and fewer than a
//!   million grants a second went out on average; by the gap, when this
//!   node's clock is behind (a step back), for up to 10 s or 10 million
//!   grants of lag.

use super::error::LockError;
use super::limits::{MAX_FENCE_LEAD, SERVING_FENCE_GAP};

/// The clock bound shared by every token that raises the mark on request
/// (MINFENCE, RESTORE): at most `MAX_FENCE_LEAD` above the clock.
pub fn within_clock_lead(fence: i64, now_us: i64) -> bool {
    fence <= now_us.saturating_add(MAX_FENCE_LEAD)
}

/// MINFENCE's bound: at most `MAX_FENCE_LEAD` (2^50 µs, ~35 years) above
/// the clock. Each MINFENCE raises the mark, so it must not be bounded by
/// the mark (8,000 calls would then use up the token space).
pub fn check_min_fence(fence: i64, now_us: i64) -> Result<(), LockError> {
    if !within_clock_lead(fence, now_us) {
        return Err(LockError::BadFence("more than 2^50 above the clock"));
    }
    Ok(())
}

/// The mark a node starts serving with, from the mark `hwm` it had and its
/// clock (see [`FenceCounter::start_serving`]).
pub fn serving_mark(hwm: i64, now_us: i64) -> i64 {
    match now_us > hwm {
        true => now_us,
        false => hwm.checked_add(SERVING_FENCE_GAP).unwrap_or(hwm),
    }
}

/// Where the engine takes a new fencing token from.
pub trait FenceSource {
    fn next_fence(&mut self, now_us: i64) -> Result<i64, LockError>;
    /// MINFENCE: every later token must exceed `fence` (checked like any
    /// token from outside; refused, changing nothing, when out of bounds).
    fn raise(&mut self, fence: i64, now_us: i64) -> Result<(), LockError>;
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FenceCounter {
    hwm: i64,
}

impl FenceCounter {
    #[cfg(any(test, feature = "fuzzing"))]
    pub const fn new(hwm: i64) -> Self {
        FenceCounter { hwm }
    }

    pub fn hwm(&self) -> i64 {
        self.hwm
    }

    /// The largest token from outside that [`observe`](Self::observe) accepts now.
    pub fn max_acceptable(&self, now_us: i64) -> i64 {
        self.hwm.max(now_us).saturating_add(MAX_FENCE_LEAD)
    }

    /// Checks a token from outside without applying it.
    pub fn check(&self, fence: i64, now_us: i64) -> Result<(), LockError> {
        if fence <= 0 {
            return Err(LockError::BadFence("must be a positive integer"));
        }
        if fence > self.max_acceptable(now_us) {
            return Err(LockError::BadFence(
                "more than 2^50 above the node's high-water mark and clock",
            ));
        }
        Ok(())
    }

    /// A token issued elsewhere (master, AOF, RDB, MINFENCE) was applied
    /// here. Refused, changing nothing, when [`check`](Self::check) fails.
    pub fn observe(&mut self, fence: i64, now_us: i64) -> Result<(), LockError> {
        self.check(fence, now_us)?;
        self.hwm = self.hwm.max(fence);
        Ok(())
    }

    /// At load and at promotion: the wall clock in µs when it is past the
    /// mark (as every grant takes it: two nodes that start from one mark
    /// still part by their clocks); else, the clock being behind,
    /// [`SERVING_FENCE_GAP`] above the mark (unless that would pass
    /// `i64::MAX`: a mark that high keeps what is left).
    pub fn start_serving(&mut self, now_us: i64) {
        self.hwm = serving_mark(self.hwm, now_us);
    }
}

impl FenceSource for FenceCounter {
    /// Bounded by the clock, not the mark: a bound that moved with the
    /// mark would let repeated MINFENCEs ratchet it to i64::MAX.
    fn raise(&mut self, fence: i64, now_us: i64) -> Result<(), LockError> {
        check_min_fence(fence, now_us)?;
        self.observe(fence, now_us)
    }

    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    fn next_fence(&mut self, now_us: i64) -> Result<i64, LockError> {
        // (Not `ok_or`, which builds and drops the error on every grant.)
        let Some(after) = self.hwm.max(0).checked_add(1) else {
            return Err(LockError::FencesExhausted);
        };
        let next = after.max(now_us);
        self.hwm = next;
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000_000;

    #[test]
    fn tokens_strictly_increase_and_follow_the_clock() {
        let mut c = FenceCounter::default();
        assert_eq!(c.next_fence(0), Ok(1));
        assert_eq!(c.next_fence(0), Ok(2));
        assert_eq!(c.next_fence(NOW), Ok(NOW), "jumps to the clock");
        assert_eq!(c.next_fence(NOW), Ok(NOW + 1), "same µs: still +1");
        assert_eq!(c.next_fence(NOW - 5), Ok(NOW + 2), "clock behind: +1");
    }

    #[test]
    fn observing_an_older_token_never_lowers_the_mark() {
        let mut c = FenceCounter::new(100);
        c.observe(5, 0).unwrap();
        assert_eq!(c.hwm(), 100);
        c.observe(500, 0).unwrap();
        assert_eq!(c.next_fence(0), Ok(501));
    }

    #[test]
    fn a_token_far_above_the_mark_and_clock_is_refused_and_changes_nothing() {
        let mut c = FenceCounter::new(10);
        assert!(c.observe(i64::MAX, NOW).is_err());
        assert!(c.observe(NOW + MAX_FENCE_LEAD + 1, NOW).is_err());
        assert!(c.observe(0, NOW).is_err());
        assert!(c.observe(-3, NOW).is_err());
        assert_eq!(c.hwm(), 10);
        c.observe(NOW + MAX_FENCE_LEAD, NOW).unwrap();
        assert_eq!(c.hwm(), NOW + MAX_FENCE_LEAD);
    }

    #[test]
    fn restart_raises_to_the_clock_but_not_below_what_was_saved() {
        let mut lost_tail = FenceCounter::new(10);
        lost_tail.start_serving(NOW);
        assert_eq!(lost_tail.next_fence(NOW - 1), Ok(NOW + 1));

        let mut ahead = FenceCounter::new(i64::MAX - 5);
        ahead.start_serving(NOW);
        assert_eq!(ahead.hwm(), i64::MAX - 5);
        // Two nodes that start from one mark with their clocks past it
        // part by their clocks, as before: no run of equal tokens.
        assert_eq!(serving_mark(NOW - 5_000, NOW), NOW);
        assert_eq!(serving_mark(NOW - 5_000, NOW + 7), NOW + 7);
    }

    /// A promoted replica whose clock is behind (stepped back an hour) saw
    /// fence F last; its master may have granted F + 1, F + 2, ... before
    /// it died (its own clock behind too: one above the mark each). The
    /// replica's first grant is above them all. Before, it was F + 1 again.
    #[test]
    fn a_node_whose_clock_is_behind_starts_past_what_it_may_have_lost() {
        let seen = NOW;
        let mut promoted = FenceCounter::new(seen);
        promoted.start_serving(NOW - 3_600_000_000);
        let first = promoted.next_fence(NOW - 3_600_000_000).unwrap();
        assert!(
            first > seen + 1_000_000,
            "{first} is past a million lost grants"
        );
        assert_eq!(first, seen + SERVING_FENCE_GAP + 1);
    }

    #[test]
    fn exhaustion_is_an_error_not_a_wrap() {
        let mut c = FenceCounter::new(i64::MAX - 1);
        assert_eq!(c.next_fence(NOW), Ok(i64::MAX));
        assert_eq!(c.next_fence(NOW), Err(LockError::FencesExhausted));
        assert_eq!(c.hwm(), i64::MAX);
    }

    #[test]
    fn min_fence_is_bounded_by_the_clock_not_the_mark() {
        let mut c = FenceCounter::new(NOW);
        let lead = MAX_FENCE_LEAD;
        assert!(c.raise(NOW + lead, NOW).is_ok());
        // The mark is now NOW + 2^50; another 2^50 on top is refused.
        assert!(c.raise(NOW + 2 * lead, NOW).is_err());
        assert_eq!(c.hwm(), NOW + lead);
    }
}
