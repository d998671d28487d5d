//! The clocks the client measures leases on, and the rules written on
//! them: when a request was sent ([`Sent`], counting system suspend),
//! Redlock's validity (TTL less [`drift`] from the send), the boot clock,
//! and an instant some way off that cannot overflow ([`later_by`]). Shared
//! by the client, the group of nodes, the guard and the `redis-lock`
//! command, so none of them writes one down again.

use std::time::Duration;

use tokio::time::Instant;

/// The clock drift Redlock allows for: 1% of the TTL plus 2 ms.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// A TTL a lease can be valid for at all: longer than its [`drift`]
/// allowance (a lease of 2 ms or less would be granted already invalid).
pub(crate) fn check_ttl(ttl: Duration) -> crate::error::Result<()> {
    if ttl > drift(ttl) {
        return Ok(());
    }
    Err(crate::error::Error::Config(format!(
        "the TTL ({} ms) must be longer than the clock-drift allowance \
         ({} ms: 1% of the TTL plus 2 ms), or the lock would be granted \
         already expired",
        ttl.as_secs_f64() * 1e3,
        drift(ttl).as_secs_f64() * 1e3,
    )))
}

/// `at + by`, or about 30 years later if that is past what an instant can
/// hold (a wait, TTL or grace of 10^15 hours is "never", not a panic).
pub fn later_by(at: Instant, by: Duration) -> Instant {
    at.checked_add(by)
        .unwrap_or_else(|| at + Duration::from_secs(30 * 365 * 86_400))
}

/// When a request was sent, on both clocks. A validity measured from it
/// must also lose the time the machine was suspended while the request was
/// in flight: tokio's clock (CLOCK_MONOTONIC) stops then, the nodes' do not.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sent {
    at: Instant,
    suspended: Duration,
}

impl Sent {
    pub(crate) fn now() -> Sent {
        Sent {
            at: Instant::now(),
            suspended: suspended_total(),
        }
    }

    /// The time since it was sent, suspended time included.
    pub(crate) fn elapsed(&self) -> Duration {
        self.at.elapsed() + self.slept()
    }

    /// `validity` after it was sent, as a tokio instant: earlier by any
    /// suspend since (at the latest when it was sent, if that is more).
    pub(crate) fn plus(&self, validity: Duration) -> Instant {
        (self.at + validity)
            .checked_sub(self.slept())
            .map_or(self.at, |at| at.max(self.at))
    }

    fn slept(&self) -> Duration {
        suspended_total().saturating_sub(self.suspended)
    }

    /// Redlock's validity of a grant or extend for `ttl` sent now: the TTL
    /// less the drift allowance, from when it was sent ([`plus`](Self::plus)).
    /// The one place the rule is written.
    pub(crate) fn valid_until(&self, ttl: Duration) -> Instant {
        self.plus(ttl.saturating_sub(drift(ttl)))
    }

    /// Whether answers to a request for `ttl` sent now still leave a
    /// validity: less than the TTL less the drift allowance has passed.
    pub(crate) fn in_time(&self, ttl: Duration) -> bool {
        self.elapsed() + drift(ttl) < ttl
    }
}

/// How long the machine has been suspended since boot: CLOCK_BOOTTIME less
/// CLOCK_MONOTONIC (both start at boot; only the first counts suspend).
fn suspended_total() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    boot_now().saturating_sub(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// CLOCK_BOOTTIME: monotonic, and counts system suspend (plus a suspend
/// the unit tests pretend happened).
pub(crate) fn boot_now() -> Duration {
    boot_clock() + suspended_for_tests()
}

/// CLOCK_BOOTTIME now: monotonic, and it counts the time the machine was
/// suspended (CLOCK_MONOTONIC, tokio's clock, stops then). A lock's
/// validity on it is [`Lease::valid_until_boot`](crate::Lease::valid_until_boot).
/// Async-signal-safe (one `clock_gettime`), so a forked child may call it.
pub fn boot_clock() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
pub(crate) static SUSPENDED_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A suspend the unit tests pretend happened (zero outside them).
fn suspended_for_tests() -> Duration {
    #[cfg(test)]
    {
        Duration::from_millis(SUSPENDED_MS.load(std::sync::atomic::Ordering::Relaxed))
    }
    #[cfg(not(test))]
    {
        Duration::ZERO
    }
}

/// Whole milliseconds, at least 1 (the module refuses a TTL of 0).
pub(crate) fn millis(d: Duration) -> u64 {
    (d.as_millis().min(u64::MAX as u128) as u64).max(1)
}
