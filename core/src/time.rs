//! The two clocks a decision is made at.
//!
//! * Leases, BLOCK timeouts, the restart delay and every check the node
//!   schedules run on the node's **monotonic** clock (`mono`): no step of
//!   the wall clock, forwards or back (NTP, `date -s`), ends or extends any
//!   of them.
//! * Fencing tokens follow the **wall** clock in µs (`wall`), the one clock
//!   different nodes share (`fence`).
//! * What is persisted and replicated is a wall-clock deadline and grant
//!   time, so time a server was down counts against a lease and replicas
//!   agree: they are converted to the monotonic clock once, when a value is
//!   loaded or applied ([`local_times`]), and back, both at one instant,
//!   when it is written out or shown ([`wall_times`]). A grant time read
//!   off the wall clock at the grant would be in another frame than a
//!   deadline converted later, after a step: the write could then say
//!   "granted after its deadline" (a replica's full sync refused that and
//!   the replica exited).

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

    #[inline]
    pub fn mono_ms(self) -> i64 {
        self.mono_us.div_euclid(1000)
    }

    #[inline]
    pub fn wall_ms(self) -> i64 {
        self.wall_us.div_euclid(1000)
    }
}

/// The earlier of two optional instants (None: not scheduled).
#[inline(always)] // the node's next wake-up is taken after every decision
pub fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The wall-clock deadline (Unix ms) a lease ending at `deadline_ms` on the
/// monotonic clock is persisted and replicated as.
pub fn wall_deadline(deadline_ms: i64, now: Now) -> i64 {
    now.wall_ms()
        .saturating_add(deadline_ms.saturating_sub(now.mono_ms()))
}

/// A lease's deadline and grant time (monotonic ms; None: unknown) as
/// written out and shown: Unix ms, both converted at `now`, so the time
/// between them is exactly what the monotonic clock measured whatever the
/// wall clock did since the grant. A grant time of 0 means unknown.
pub fn wall_times(deadline_ms: i64, granted_ms: Option<i64>, now: Now) -> (i64, i64) {
    let deadline = wall_deadline(deadline_ms, now);
    let granted = granted_ms.map_or(0, |g| wall_deadline(g.min(deadline_ms), now).max(0));
    (deadline, granted)
}

/// A written-out grant time (Unix ms) if it is known: 0 is unknown, and so
/// is one after the deadline (an earlier build kept the grant's wall-clock
/// reading and converted the deadline at the write, so a step in between
/// could do this; refusing it would refuse the whole RDB, and a replica's
/// full sync with it).
pub fn known_grant(wall_granted_ms: i64, wall_deadline_ms: i64) -> Option<i64> {
    Some(wall_granted_ms).filter(|g| (1..=wall_deadline_ms).contains(g))
}

/// A written-out deadline and grant time (Unix ms; a grant time of 0:
/// unknown) on this node's monotonic clock. The lease left is capped at
/// `max_ttl_ms` (`lock.max-ttl-ms` on this node: no lease enters a node
/// longer than a grant there could be, whether it comes from an RDB, an
/// AOF, a RESTORE or the master) and at the time from its grant to its
/// deadline when that is known ([`known_grant`]: the wall clock was stepped
/// back since the write). The grant lies that span before the local
/// deadline.
pub fn local_times(
    wall_deadline_ms: i64,
    wall_granted_ms: i64,
    max_ttl_ms: i64,
    now: Now,
) -> (i64, Option<i64>) {
    let granted = known_grant(wall_granted_ms, wall_deadline_ms);
    let max_ttl_ms = max_ttl_ms.max(0);
    let span = granted.map(|g| wall_deadline_ms - g);
    let longest = span.map_or(max_ttl_ms, |span| span.min(max_ttl_ms));
    let deadline = local_deadline(wall_deadline_ms, longest, now);
    (deadline, span.map(|span| deadline.saturating_sub(span)))
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

/// How close a Redis expiry must be to the lease's end to be an earlier
/// build's ([`is_earlier_builds_expiry`]).
pub const LEGACY_SLACK_MS: i64 = 10;

/// Whether a lock key's Redis expiry (Unix ms; negative: none) was set by
/// an earlier build, which gave lock keys an expiry at the lease's end
/// (`deadline_ms`, monotonic): equal to it within [`LEGACY_SLACK_MS`]. The
/// glue drops such an expiry (the lease is the node's), once, at the
/// value's first renewal or sweep visit; an expiry at another time is a
/// user's administrative delete and stays. Only a value that came from
/// outside (an RDB, RESTORE, the master) is ever asked about. A rule of
/// its own, not a `Node` call: it is asked inside the node's writes.
pub fn is_earlier_builds_expiry(expiry_ms: i64, deadline_ms: i64, now: Now) -> bool {
    expiry_ms >= 0 && (expiry_ms - wall_deadline(deadline_ms, now)).abs() <= LEGACY_SLACK_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    const WALL: i64 = 1_700_000_000_000_000;

    #[test]
    fn only_an_expiry_at_the_leases_end_is_an_earlier_builds() {
        let now = Now {
            mono_us: 5_000_000,
            wall_us: WALL,
        };
        let deadline_ms = 5_000 + 2_000;
        let end = WALL / 1000 + 2_000;
        assert!(is_earlier_builds_expiry(end, deadline_ms, now));
        assert!(is_earlier_builds_expiry(
            end - LEGACY_SLACK_MS,
            deadline_ms,
            now
        ));
        assert!(is_earlier_builds_expiry(
            end + LEGACY_SLACK_MS,
            deadline_ms,
            now
        ));
        // A user's expiry elsewhere, or none.
        assert!(!is_earlier_builds_expiry(
            end + LEGACY_SLACK_MS + 1,
            deadline_ms,
            now
        ));
        assert!(!is_earlier_builds_expiry(end - 500, deadline_ms, now));
        assert!(!is_earlier_builds_expiry(-1, deadline_ms, now));
    }

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

    /// Granted while the wall clock was 90 s ahead, written out after it
    /// was set right: the grant still comes before the deadline, by the
    /// time the monotonic clock measured, and a node loading it keeps the
    /// lease whole.
    #[test]
    fn a_step_between_grant_and_write_keeps_grant_before_deadline() {
        let granted = 5_000;
        let deadline = granted + 60_000;
        let later = Now {
            mono_us: 6_000_000,
            wall_us: WALL,
        };
        let (wall_deadline, wall_granted) = wall_times(deadline, Some(granted), later);
        assert_eq!(wall_deadline - wall_granted, 60_000);
        assert_eq!(wall_granted, WALL / 1000 - 1_000);
        let elsewhere = Now {
            mono_us: 100_000_000,
            wall_us: WALL + 500_000,
        };
        let (local, local_granted) = local_times(wall_deadline, wall_granted, 60_000, elsewhere);
        assert_eq!(local, 100_000 + 60_000 - 1_000 - 500);
        assert_eq!(local_granted, Some(local - 60_000));
        assert_eq!(
            wall_times(local, local_granted, elsewhere),
            (wall_deadline, wall_granted)
        );
        // Unknown, or after the deadline (an earlier build's write): the
        // lease is capped at max-ttl.
        assert_eq!(wall_times(deadline, None, later).1, 0);
        // A lower lock.max-ttl-ms on the loading node caps what is left,
        // and the grant keeps its place before the deadline it had.
        let (capped, granted) = local_times(wall_deadline, wall_granted, 1_000, elsewhere);
        assert_eq!(capped, 100_000 + 1_000);
        assert_eq!(granted, Some(capped - 60_000));
        for odd in [0, wall_deadline + 90_000] {
            let (capped, none) = local_times(wall_deadline, odd, 1_000, elsewhere);
            assert_eq!((capped, none), (100_000 + 1_000, None));
        }
    }

    /// A lease renewed for a long time (grant long ago) and read after the
    /// wall clock stepped back an hour: capped at max-ttl, not at the time
    /// since the grant (issue 22: 21,968 ms kept where the holder had 1,934).
    #[test]
    fn a_long_held_lease_read_after_a_step_back_is_capped_at_max_ttl() {
        let written_at = WALL / 1000;
        let wall_granted = written_at - 20_000;
        let wall_deadline = written_at + 1_934;
        let stepped_back = Now {
            mono_us: 0,
            wall_us: WALL - 3_600_000_000,
        };
        let (deadline, _) = local_times(wall_deadline, wall_granted, 5_000, stepped_back);
        assert_eq!(deadline, 5_000);
        // A RESTOREd lease of an hour (a 1970 grant time) on a node whose
        // max-ttl is a second.
        let now = Now::same(WALL);
        let (deadline, _) = local_times(written_at + 3_600_000, 1, 1_000, now);
        assert_eq!(deadline, written_at + 1_000);
    }
}
