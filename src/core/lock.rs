//! The lock state machine. A lock is `key -> holder token + fencing token +
//! absolute deadline`. It is free when the key holds no lock or when its
//! deadline has passed: expiry is decided here, by the deadline, at the
//! instant it passes, never by when Redis gets round to deleting the key.
//!
//! | command | free (or expired)        | held by `token`           | held by another |
//! |---------|--------------------------|---------------------------|-----------------|
//! | acquire | grant: new fence, lease  | same fence, lease reset   | contended (nil) |
//! | release | 0                        | 1, lock removed           | 0               |
//! | extend  | 0 (never revives)        | 1, lease = now + ttl      | 0               |
//! | fence   | nil                      | fence                     | fence, or nil when a token is given |

use super::error::LockError;
use super::fence::FenceSource;

/// Tokens are binary-safe, 1 to 512 bytes.
pub const MAX_TOKEN_LEN: usize = 512;

/// A lock's state, borrowed from wherever it is stored (the keyspace keeps
/// it in one allocation with the token inline; see `redis::datatype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lock<'a> {
    pub fence: i64,
    /// Absolute, in Unix milliseconds: time a server is down counts against
    /// the lease, and replicas and the AOF see the same deadline as the master.
    pub deadline_ms: i64,
    pub token: &'a [u8],
}

impl Lock<'_> {
    pub fn is_live(&self, now_ms: i64) -> bool {
        now_ms < self.deadline_ms
    }

    pub fn remaining_ms(&self, now_ms: i64) -> i64 {
        (self.deadline_ms - now_ms).max(0)
    }
}

/// One key as the engine sees it. The Redis glue implements it over an open
/// key (and replicates every change); tests implement it over an `Option`.
pub trait LockSlot {
    /// The lock stored under the key, live or expired.
    fn stored(&self) -> Option<Lock<'_>>;
    /// Installs a new holder, replacing whatever was stored.
    fn put(&mut self, lock: Lock<'_>);
    /// Same holder, new deadline.
    fn renew(&mut self, deadline_ms: i64);
    /// Frees the lock.
    fn remove(&mut self);

    /// The lock if it is held right now.
    fn live(&self, now_ms: i64) -> Option<Lock<'_>> {
        self.stored().filter(|l| l.is_live(now_ms))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// A new grant with a new fencing token.
    Granted(i64),
    /// `token` already held the lock: same fencing token, lease reset.
    Renewed(i64),
    /// Another token holds the lock.
    Contended,
}

/// What a lock that has waiters needs next (see `hand_off_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOff {
    /// Held until this deadline (Unix ms): check again then.
    HeldUntil(i64),
    /// Free, but restart-delay-ms forbids grants for this many more ms.
    PausedFor(i64),
    /// Free: grant it to the first waiter now, in this same step.
    GrantNow,
}

/// The hand-off rule. A lock with waiters is never left free: as soon as it
/// is free (released, expired, deleted, flushed) the first waiter gets it.
/// While grants are paused after a restart, waiters keep waiting: a grant
/// lost in the crash may still be believed in by its holder.
pub fn hand_off_state(slot: &impl LockSlot, now_ms: i64, grants_paused_ms: i64) -> HandOff {
    match slot.live(now_ms) {
        Some(held) => HandOff::HeldUntil(held.deadline_ms),
        None if grants_paused_ms > 0 => HandOff::PausedFor(grants_paused_ms),
        None => HandOff::GrantNow,
    }
}

/// The absolute deadline of a lease of `ttl_ms` starting now.
pub fn deadline(now_ms: i64, ttl_ms: i64) -> Result<i64, LockError> {
    now_ms
        .checked_add(ttl_ms)
        .ok_or(LockError::TtlOverflowsClock)
}

/// `grants_paused_ms` > 0 means restart-delay-ms is in force: a free lock is
/// not granted (TRYAGAIN), but a holder may still renew.
pub fn acquire(
    slot: &mut impl LockSlot,
    fences: &mut impl FenceSource,
    token: &[u8],
    ttl_ms: i64,
    now_ms: i64,
    grants_paused_ms: i64,
) -> Result<Acquired, LockError> {
    let deadline_ms = deadline(now_ms, ttl_ms)?;
    match slot.live(now_ms) {
        Some(held) if held.token == token => {
            let fence = held.fence;
            slot.renew(deadline_ms);
            Ok(Acquired::Renewed(fence))
        }
        Some(_) => Ok(Acquired::Contended),
        None if grants_paused_ms > 0 => Err(LockError::GrantsPaused(grants_paused_ms)),
        None => {
            let fence = fences.next_fence()?;
            slot.put(Lock {
                fence,
                deadline_ms,
                token,
            });
            Ok(Acquired::Granted(fence))
        }
    }
}

/// True when `token` held the lock and it is now free.
pub fn release(slot: &mut impl LockSlot, token: &[u8], now_ms: i64) -> bool {
    let held = slot.live(now_ms).is_some_and(|l| l.token == token);
    if held {
        slot.remove();
    }
    held
}

/// True when `token` holds the lock; its lease then ends `ttl_ms` from now.
/// An expired lock is never revived.
pub fn extend(
    slot: &mut impl LockSlot,
    token: &[u8],
    ttl_ms: i64,
    now_ms: i64,
) -> Result<bool, LockError> {
    let deadline_ms = deadline(now_ms, ttl_ms)?;
    let held = slot.live(now_ms).is_some_and(|l| l.token == token);
    if held {
        slot.renew(deadline_ms);
    }
    Ok(held)
}

/// The holder's fencing token; with `token`, only if `token` is the holder.
pub fn fence(slot: &impl LockSlot, token: Option<&[u8]>, now_ms: i64) -> Option<i64> {
    slot.live(now_ms)
        .filter(|l| token.is_none_or(|t| l.token == t))
        .map(|l| l.fence)
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::core::fence::FenceCounter;

    pub struct Stored {
        pub fence: i64,
        pub deadline_ms: i64,
        pub token: Vec<u8>,
    }

    /// The engine's view of a key, over a plain Option.
    #[derive(Default)]
    pub struct MemSlot(pub Option<Stored>);

    impl LockSlot for MemSlot {
        fn stored(&self) -> Option<Lock<'_>> {
            self.0.as_ref().map(|s| Lock {
                fence: s.fence,
                deadline_ms: s.deadline_ms,
                token: &s.token,
            })
        }
        fn put(&mut self, lock: Lock<'_>) {
            self.0 = Some(Stored {
                fence: lock.fence,
                deadline_ms: lock.deadline_ms,
                token: lock.token.to_vec(),
            });
        }
        fn renew(&mut self, deadline_ms: i64) {
            self.0.as_mut().expect("renew of a stored lock").deadline_ms = deadline_ms;
        }
        fn remove(&mut self) {
            self.0 = None;
        }
    }

    const T0: i64 = 1_700_000_000_000;

    fn fixture() -> (MemSlot, FenceCounter) {
        (MemSlot::default(), FenceCounter::default())
    }

    #[test]
    fn first_acquire_grants_with_a_new_fence_and_absolute_deadline() {
        let (mut slot, mut fences) = fixture();
        let got = acquire(&mut slot, &mut fences, b"a", 100, T0, 0);
        assert_eq!(got, Ok(Acquired::Granted(1)));
        assert_eq!(slot.0.as_ref().unwrap().deadline_ms, T0 + 100);
    }

    #[test]
    fn same_token_gets_same_fence_and_a_fresh_lease() {
        let (mut slot, mut fences) = fixture();
        acquire(&mut slot, &mut fences, b"a", 100, T0, 0).unwrap();
        let again = acquire(&mut slot, &mut fences, b"a", 500, T0 + 50, 0);
        assert_eq!(again, Ok(Acquired::Renewed(1)));
        assert_eq!(slot.0.as_ref().unwrap().deadline_ms, T0 + 550);
        assert_eq!(fences.hwm(), 1, "a renewal issues no token");
    }

    #[test]
    fn other_token_is_contended_until_the_instant_the_lease_ends() {
        let (mut slot, mut fences) = fixture();
        acquire(&mut slot, &mut fences, b"a", 100, T0, 0).unwrap();
        let busy = acquire(&mut slot, &mut fences, b"b", 100, T0 + 99, 0);
        assert_eq!(busy, Ok(Acquired::Contended));
        let free = acquire(&mut slot, &mut fences, b"b", 100, T0 + 100, 0);
        assert_eq!(free, Ok(Acquired::Granted(2)));
    }

    #[test]
    fn release_only_by_the_live_holder() {
        let (mut slot, mut fences) = fixture();
        acquire(&mut slot, &mut fences, b"a", 100, T0, 0).unwrap();
        assert!(!release(&mut slot, b"b", T0 + 1));
        assert!(slot.0.is_some());
        assert!(release(&mut slot, b"a", T0 + 1));
        assert!(slot.0.is_none());
        assert!(!release(&mut slot, b"a", T0 + 2), "already free");
    }

    #[test]
    fn release_after_expiry_is_zero() {
        let (mut slot, mut fences) = fixture();
        acquire(&mut slot, &mut fences, b"a", 100, T0, 0).unwrap();
        assert!(!release(&mut slot, b"a", T0 + 100));
    }

    #[test]
    fn extend_renews_the_holder_and_never_revives() {
        let (mut slot, mut fences) = fixture();
        acquire(&mut slot, &mut fences, b"a", 100, T0, 0).unwrap();
        assert_eq!(extend(&mut slot, b"b", 1000, T0 + 10), Ok(false));
        assert_eq!(extend(&mut slot, b"a", 1000, T0 + 10), Ok(true));
        assert_eq!(slot.0.as_ref().unwrap().deadline_ms, T0 + 1010);
        assert_eq!(extend(&mut slot, b"a", 1000, T0 + 1010), Ok(false));
        assert_eq!(slot.0.as_ref().unwrap().deadline_ms, T0 + 1010);
    }

    #[test]
    fn fence_reads_the_live_holder_only() {
        let (mut slot, mut fences) = fixture();
        assert_eq!(fence(&slot, None, T0), None);
        acquire(&mut slot, &mut fences, b"a", 100, T0, 0).unwrap();
        assert_eq!(fence(&slot, None, T0), Some(1));
        assert_eq!(fence(&slot, Some(b"a"), T0), Some(1));
        assert_eq!(fence(&slot, Some(b"b"), T0), None);
        assert_eq!(fence(&slot, None, T0 + 100), None);
    }

    #[test]
    fn fences_increase_across_release_and_expiry() {
        let (mut slot, mut fences) = fixture();
        let mut last = 0;
        for i in 0..10 {
            let now = T0 + i * 1000;
            let Ok(Acquired::Granted(f)) = acquire(&mut slot, &mut fences, b"x", 10, now, 0) else {
                panic!("expected a grant");
            };
            assert!(f > last);
            last = f;
            if i % 2 == 0 {
                assert!(release(&mut slot, b"x", now + 1));
            }
        }
    }

    #[test]
    fn overflowing_deadline_is_an_error_and_changes_nothing() {
        let (mut slot, mut fences) = fixture();
        let got = acquire(&mut slot, &mut fences, b"a", i64::MAX, T0, 0);
        assert_eq!(got, Err(LockError::TtlOverflowsClock));
        assert!(slot.0.is_none());
        assert_eq!(fences.hwm(), 0);
    }

    #[test]
    fn hand_off_waits_for_the_deadline_then_grants() {
        let (mut slot, mut fences) = fixture();
        assert_eq!(hand_off_state(&slot, T0, 0), HandOff::GrantNow);
        acquire(&mut slot, &mut fences, b"a", 100, T0, 0).unwrap();
        assert_eq!(
            hand_off_state(&slot, T0 + 99, 0),
            HandOff::HeldUntil(T0 + 100)
        );
        assert_eq!(hand_off_state(&slot, T0 + 100, 0), HandOff::GrantNow);
        assert_eq!(hand_off_state(&slot, T0 + 100, 7), HandOff::PausedFor(7));
        release(&mut slot, b"a", T0 + 1);
        assert_eq!(hand_off_state(&slot, T0 + 2, 0), HandOff::GrantNow);
    }

    #[test]
    fn paused_node_refuses_new_grants_but_lets_holders_renew() {
        let (mut slot, mut fences) = fixture();
        acquire(&mut slot, &mut fences, b"a", 100, T0, 0).unwrap();
        assert_eq!(
            acquire(&mut slot, &mut fences, b"a", 100, T0 + 1, 500),
            Ok(Acquired::Renewed(1))
        );
        assert_eq!(
            acquire(&mut slot, &mut fences, b"b", 100, T0 + 1, 500),
            Ok(Acquired::Contended)
        );
        assert_eq!(extend(&mut slot, b"a", 100, T0 + 2), Ok(true));
        assert!(release(&mut slot, b"a", T0 + 3));
        assert_eq!(
            acquire(&mut slot, &mut fences, b"b", 100, T0 + 4, 400),
            Err(LockError::GrantsPaused(400))
        );
        assert!(slot.0.is_none());
    }
}
