//! The two clocks a decision is made at.
//!
//! * Leases, BLOCK timeouts, the restart delay and every check the node
//!   schedules run on the node's **monotonic** clock (`mono`): no step of
//!   the wall clock, forwards or back (NTP, `date -s`), ends or extends any
//!   of them.
//! * Fencing tokens follow the **wall** clock in µs (`wall`), the one clock
//!   different nodes share (`fence`), and grant times are shown as Unix ms.
//! * What is persisted and replicated is a wall-clock deadline, so time a
//!   server was down counts against a lease and replicas agree: it is
//!   converted to the monotonic clock once, when a value is loaded, applied
//!   or promoted ([`local_deadline`]), and back when it is written out
//!   ([`wall_deadline`]).

/// The instant of a call, on both clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// The node's monotonic clock, µs (any origin).
    pub mono_us: i64,
    /// Unix time, µs.
    pub wall_us: i64,
}

impl Now {
    /// Both clocks reading the same (tests; a node whose clock never stepped).
    pub const fn same(us: i64) -> Now {
        Now {
            mono_us: us,
            wall_us: us,
        }
    }

    pub fn mono_ms(self) -> i64 {
        self.mono_us.div_euclid(1000)
    }

    pub fn wall_ms(self) -> i64 {
        self.wall_us.div_euclid(1000)
    }
}

/// The wall-clock deadline (Unix ms) a lease ending at `deadline_ms` on the
/// monotonic clock is persisted and replicated as.
pub fn wall_deadline(deadline_ms: i64, now: Now) -> i64 {
    now.wall_ms()
        .saturating_add(deadline_ms.saturating_sub(now.mono_ms()))
}

/// A persisted or replicated wall-clock deadline on this node's monotonic
/// clock. Time since it was written counts (a lease that ended while the
/// server was down is over); a deadline further ahead than `longest_ms`
/// (the longest the lease can be: the wall clock was stepped back since it
/// was written) is capped to it.
pub fn local_deadline(wall_deadline_ms: i64, longest_ms: i64, now: Now) -> i64 {
    let remaining = wall_deadline_ms.saturating_sub(now.wall_ms());
    now.mono_ms()
        .saturating_add(remaining.min(longest_ms.max(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WALL: i64 = 1_700_000_000_000_000;

    #[test]
    fn deadlines_convert_both_ways_whatever_the_clocks_origin() {
        let now = Now {
            mono_us: 5_000_000,
            wall_us: WALL,
        };
        let wall = wall_deadline(5_000 + 1_500, now);
        assert_eq!(wall, WALL / 1000 + 1_500);
        assert_eq!(local_deadline(wall, 60_000, now), 6_500);
    }

    #[test]
    fn a_clock_stepped_back_across_a_restart_cannot_stretch_a_lease() {
        // Written with 1.5 s left; the wall clock is now an hour behind.
        let now = Now {
            mono_us: 0,
            wall_us: WALL - 3_600_000_000,
        };
        let written = WALL / 1000 + 1_500;
        assert_eq!(local_deadline(written, 1_500, now), 1_500, "capped");
        // Stepped forward: the lease is over.
        let later = Now {
            mono_us: 0,
            wall_us: WALL + 3_600_000_000,
        };
        assert!(local_deadline(written, 1_500, later) < 0);
    }
}
