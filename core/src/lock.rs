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
//!
//! Time comes in as Unix µs (`now_us`) or ms (`now_ms`); fencing tokens from a
//! [`FenceSource`]. Nothing here reads a clock or knows about Redis.

use super::error::LockError;
use super::fence::FenceSource;

/// A lock's state, borrowed from wherever it is stored (the keyspace keeps
/// it in one allocation with the token inline; see `redis::datatype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lock<'a> {
    pub fence: i64,
    /// Absolute, in Unix milliseconds: time a server is down counts against
    /// the lease, and replicas and the AOF see the same deadline as the master.
    pub deadline_ms: i64,
    pub token: &'a [u8],
    /// When this holder was granted the lock (Unix ms; kept by renewals).
    /// 0 when unknown: a lock loaded from encoding version 1 or from an old
    /// AOF's `LOCK._SET` without it.
    pub granted_ms: i64,
    /// Changes with every grant and renewal, and is never reused while the
    /// process lives (the store assigns it; it is not persisted). A take-back
    /// of an undelivered grant matches on it, so it never removes a lease
    /// that someone renewed since.
    pub lease: u64,
}

impl Lock<'_> {
    pub fn is_live(&self, now_ms: i64) -> bool {
        now_ms < self.deadline_ms
    }

    pub fn remaining_ms(&self, now_ms: i64) -> i64 {
        self.deadline_ms.saturating_sub(now_ms).max(0)
    }
}

/// One key as the engine sees it. The Redis glue implements it over an open
/// key (and replicates every change); tests implement it over an `Option`.
pub trait LockSlot {
    /// The lock stored under the key, live or expired.
    fn stored(&self) -> Option<Lock<'_>>;
    /// Installs a new holder, replacing whatever was stored, with a new lease id.
    fn put(&mut self, token: &[u8], fence: i64, deadline_ms: i64, granted_ms: i64);
    /// Same holder, new deadline and new lease id.
    fn renew(&mut self, deadline_ms: i64);
    /// Frees the lock.
    fn remove(&mut self);

    /// The lock if it is held right now.
    fn live(&self, now_ms: i64) -> Option<Lock<'_>> {
        self.stored().filter(|l| l.is_live(now_ms))
    }
}

/// Wall-clock Unix time in ms, from µs (the engine's unit of time).
pub fn ms(now_us: i64) -> i64 {
    now_us.div_euclid(1000)
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

/// The absolute deadline of a lease of `ttl_ms` starting now.
pub fn deadline(now_ms: i64, ttl_ms: i64) -> Result<i64, LockError> {
    now_ms
        .checked_add(ttl_ms)
        .ok_or(LockError::TtlOverflowsClock)
}

/// Takes the lock for `token` if it is free or already `token`'s, with
/// `MINFENCE min_fence` (0: none): Redlock's quorum fencing, where the
/// granted token is at least `min_fence` and so is the node's mark, so
/// every later grant exceeds it. Whether a free lock may be granted now
/// (restart delay, eviction, memory) is the node's decision
/// (`node::Node::acquire`), made before this is called.
///
/// A holder that asks for a `min_fence` above its own token gets a *fresh*
/// token, `max(mark + 1, min_fence, now)`: never a token another lock
/// already holds (the mark may be above `min_fence` already). A contended
/// or refused ACQUIRE changes nothing, the mark included.
pub fn acquire(
    slot: &mut impl LockSlot,
    fences: &mut impl FenceSource,
    token: &[u8],
    ttl_ms: i64,
    min_fence: i64,
    now_us: i64,
) -> Result<Acquired, LockError> {
    let now_ms = ms(now_us);
    let deadline_ms = deadline(now_ms, ttl_ms)?;
    match slot.live(now_ms) {
        Some(held) if held.token == token => {
            if min_fence > held.fence {
                let granted_ms = held.granted_ms;
                let fence = fresh_fence(fences, min_fence, now_us)?;
                slot.put(token, fence, deadline_ms, granted_ms);
                return Ok(Acquired::Renewed(fence));
            }
            let fence = held.fence;
            slot.renew(deadline_ms);
            Ok(Acquired::Renewed(fence))
        }
        Some(_) => Ok(Acquired::Contended),
        None => {
            let fence = fresh_fence(fences, min_fence, now_us)?;
            slot.put(token, fence, deadline_ms, now_ms);
            Ok(Acquired::Granted(fence))
        }
    }
}

/// A token never issued before, at least `min_fence` (0: no floor).
fn fresh_fence(
    fences: &mut impl FenceSource,
    min_fence: i64,
    now_us: i64,
) -> Result<i64, LockError> {
    if min_fence > 1 {
        fences.raise(min_fence - 1, now_us)?;
    }
    fences.next_fence(now_us)
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

/// Takes back a grant whose reply never reached its client (it went away
/// between the hand-off and the reply): frees the lock only if it is still
/// exactly that lease, not renewed or re-granted since. True if it did.
pub fn take_back(slot: &mut impl LockSlot, fence: i64, lease: u64, now_ms: i64) -> bool {
    let same = slot
        .live(now_ms)
        .is_some_and(|l| l.fence == fence && l.lease == lease);
    if same {
        slot.remove();
    }
    same
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::fence::FenceCounter;

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Stored {
        pub fence: i64,
        pub deadline_ms: i64,
        pub token: Vec<u8>,
        pub lease: u64,
        pub granted_ms: i64,
    }

    /// The engine's view of a key, over a plain Option; lease ids from a
    /// counter shared by the test (as the glue's is process-wide).
    #[derive(Default)]
    pub struct MemSlot {
        pub lock: Option<Stored>,
        pub next_lease: u64,
    }

    impl LockSlot for MemSlot {
        fn stored(&self) -> Option<Lock<'_>> {
            self.lock.as_ref().map(|s| Lock {
                fence: s.fence,
                deadline_ms: s.deadline_ms,
                token: &s.token,
                granted_ms: s.granted_ms,
                lease: s.lease,
            })
        }
        fn put(&mut self, token: &[u8], fence: i64, deadline_ms: i64, granted_ms: i64) {
            self.next_lease += 1;
            self.lock = Some(Stored {
                fence,
                deadline_ms,
                token: token.to_vec(),
                lease: self.next_lease,
                granted_ms,
            });
        }
        fn renew(&mut self, deadline_ms: i64) {
            self.next_lease += 1;
            let lock = self.lock.as_mut().expect("renew of a stored lock");
            lock.deadline_ms = deadline_ms;
            lock.lease = self.next_lease;
        }
        fn remove(&mut self) {
            self.lock = None;
        }
    }

    const T0: i64 = 1_700_000_000_000;

    /// `now_ms` as the µs the engine takes.
    fn us(now_ms: i64) -> i64 {
        now_ms * 1000
    }

    fn fixture() -> (MemSlot, FenceCounter) {
        (MemSlot::default(), FenceCounter::default())
    }

    fn deadline_of(slot: &MemSlot) -> i64 {
        slot.lock.as_ref().unwrap().deadline_ms
    }

    #[test]
    fn first_acquire_grants_with_a_clock_fence_and_absolute_deadline() {
        let (mut slot, mut fences) = fixture();
        let got = acquire(&mut slot, &mut fences, b"a", 100, 0, us(T0));
        assert_eq!(got, Ok(Acquired::Granted(us(T0))));
        assert_eq!(deadline_of(&slot), T0 + 100);
    }

    #[test]
    fn the_grant_time_is_set_by_a_grant_and_kept_by_renewals() {
        let (mut slot, mut fences) = fixture();
        acquire(&mut slot, &mut fences, b"a", 100, 0, us(T0)).unwrap();
        assert_eq!(slot.lock.as_ref().unwrap().granted_ms, T0);
        acquire(&mut slot, &mut fences, b"a", 100, 0, us(T0 + 50)).unwrap();
        extend(&mut slot, b"a", 100, T0 + 60).unwrap();
        let raised = acquire(&mut slot, &mut fences, b"a", 100, us(T0) + 9, us(T0 + 70));
        assert_eq!(raised, Ok(Acquired::Renewed(us(T0 + 70))), "a fresh token");
        assert_eq!(
            slot.lock.as_ref().unwrap().granted_ms,
            T0,
            "renewals keep it"
        );
        assert!(release(&mut slot, b"a", T0 + 80));
        acquire(&mut slot, &mut fences, b"b", 100, 0, us(T0 + 90)).unwrap();
        assert_eq!(slot.lock.as_ref().unwrap().granted_ms, T0 + 90);
    }

    #[test]
    fn same_token_gets_same_fence_and_a_fresh_lease() {
        let (mut slot, mut fences) = fixture();
        acquire(&mut slot, &mut fences, b"a", 100, 0, us(T0)).unwrap();
        let lease = slot.lock.as_ref().unwrap().lease;
        let again = acquire(&mut slot, &mut fences, b"a", 500, 0, us(T0 + 50));
        assert_eq!(again, Ok(Acquired::Renewed(us(T0))));
        assert_eq!(deadline_of(&slot), T0 + 550);
        assert_eq!(fences.hwm(), us(T0), "a renewal issues no token");
        assert_ne!(slot.lock.as_ref().unwrap().lease, lease, "new lease id");
    }

    #[test]
    fn other_token_is_contended_until_the_instant_the_lease_ends() {
        let (mut slot, mut fences) = fixture();
        acquire(&mut slot, &mut fences, b"a", 100, 0, us(T0)).unwrap();
        let busy = acquire(&mut slot, &mut fences, b"b", 100, 0, us(T0 + 99));
        assert_eq!(busy, Ok(Acquired::Contended));
        let free = acquire(&mut slot, &mut fences, b"b", 100, 0, us(T0 + 100));
        assert_eq!(free, Ok(Acquired::Granted(us(T0 + 100))));
    }

    #[test]
    fn release_only_by_the_live_holder() {
        let (mut slot, mut fences) = fixture();
        acquire(&mut slot, &mut fences, b"a", 100, 0, us(T0)).unwrap();
        assert!(!release(&mut slot, b"b", T0 + 1));
        assert!(slot.lock.is_some());
        assert!(release(&mut slot, b"a", T0 + 1));
        assert!(slot.lock.is_none());
        assert!(!release(&mut slot, b"a", T0 + 2), "already free");
    }

    #[test]
    fn release_after_expiry_is_zero() {
        let (mut slot, mut fences) = fixture();
        acquire(&mut slot, &mut fences, b"a", 100, 0, us(T0)).unwrap();
        assert!(!release(&mut slot, b"a", T0 + 100));
    }

    #[test]
    fn extend_renews_the_holder_and_never_revives() {
        let (mut slot, mut fences) = fixture();
        acquire(&mut slot, &mut fences, b"a", 100, 0, us(T0)).unwrap();
        assert_eq!(extend(&mut slot, b"b", 1000, T0 + 10), Ok(false));
        assert_eq!(extend(&mut slot, b"a", 1000, T0 + 10), Ok(true));
        assert_eq!(deadline_of(&slot), T0 + 1010);
        assert_eq!(extend(&mut slot, b"a", 1000, T0 + 1010), Ok(false));
        assert_eq!(deadline_of(&slot), T0 + 1010);
    }

    #[test]
    fn fence_reads_the_live_holder_only() {
        let (mut slot, mut fences) = fixture();
        assert_eq!(fence(&slot, None, T0), None);
        acquire(&mut slot, &mut fences, b"a", 100, 0, us(T0)).unwrap();
        assert_eq!(fence(&slot, None, T0), Some(us(T0)));
        assert_eq!(fence(&slot, Some(b"a"), T0), Some(us(T0)));
        assert_eq!(fence(&slot, Some(b"b"), T0), None);
        assert_eq!(fence(&slot, None, T0 + 100), None);
    }

    #[test]
    fn fences_increase_across_release_and_expiry_even_in_the_same_microsecond() {
        let (mut slot, mut fences) = fixture();
        let mut last = 0;
        for i in 0..10 {
            let now = T0 + (i / 3) * 1000;
            let Ok(Acquired::Granted(f)) = acquire(&mut slot, &mut fences, b"x", 10, 0, us(now))
            else {
                panic!("expected a grant");
            };
            assert!(f > last);
            last = f;
            assert!(release(&mut slot, b"x", now));
        }
    }

    #[test]
    fn overflowing_deadline_is_an_error_and_changes_nothing() {
        let (mut slot, mut fences) = fixture();
        let got = acquire(&mut slot, &mut fences, b"a", i64::MAX, 0, us(T0));
        assert_eq!(got, Err(LockError::TtlOverflowsClock));
        assert!(slot.lock.is_none());
        assert_eq!(fences.hwm(), 0);
    }

    #[test]
    fn take_back_removes_only_the_very_lease_it_granted() {
        let (mut slot, mut fences) = fixture();
        acquire(&mut slot, &mut fences, b"a", 100, 0, us(T0)).unwrap();
        let granted = slot.lock.clone().unwrap();
        // The same token renews on another connection before the take-back.
        acquire(&mut slot, &mut fences, b"a", 100, 0, us(T0 + 1)).unwrap();
        assert!(!take_back(&mut slot, granted.fence, granted.lease, T0 + 2));
        assert!(slot.lock.is_some(), "the renewed lease stays");
        let renewed = slot.lock.clone().unwrap();
        assert!(take_back(&mut slot, renewed.fence, renewed.lease, T0 + 2));
        assert!(slot.lock.is_none());
    }

    #[test]
    fn min_fence_raises_a_grant_and_every_later_one() {
        let (mut slot, mut fences) = (MemSlot::default(), FenceCounter::default());
        let n = us(T0) + 5_000_000;
        let got = acquire(&mut slot, &mut fences, b"a", 100, n, us(T0));
        assert_eq!(got, Ok(Acquired::Granted(n)));
        assert!(fences.hwm() >= n);
        release(&mut slot, b"a", T0);
        let next = acquire(&mut slot, &mut fences, b"b", 100, 0, us(T0));
        assert_eq!(next, Ok(Acquired::Granted(n + 1)));
    }

    #[test]
    fn min_fence_below_the_next_token_changes_nothing_about_it() {
        let (mut slot, mut fences) = (MemSlot::default(), FenceCounter::default());
        let got = acquire(&mut slot, &mut fences, b"a", 100, 3, us(T0));
        assert_eq!(got, Ok(Acquired::Granted(us(T0))));
    }

    #[test]
    fn min_fence_raises_the_holders_own_token_and_renews() {
        let (mut slot, mut fences) = (MemSlot::default(), FenceCounter::default());
        let Ok(Acquired::Granted(first)) = acquire(&mut slot, &mut fences, b"a", 100, 0, us(T0))
        else {
            panic!()
        };
        let t = first + 1_000_000;
        let got = acquire(&mut slot, &mut fences, b"a", 500, t, us(T0 + 50));
        assert_eq!(got, Ok(Acquired::Renewed(t)));
        assert_eq!(
            fence(&slot, Some(b"a"), T0 + 500),
            Some(t),
            "lease renewed too"
        );
        assert_eq!(fences.hwm(), t);
        // Lower or equal: the holder keeps its token, the lease is renewed.
        let again = acquire(&mut slot, &mut fences, b"a", 100, t - 7, us(T0 + 60));
        assert_eq!(again, Ok(Acquired::Renewed(t)));
    }

    #[test]
    fn a_contended_or_refused_min_fence_changes_nothing() {
        let (mut slot, mut fences) = (MemSlot::default(), FenceCounter::default());
        acquire(&mut slot, &mut fences, b"a", 100, 0, us(T0)).unwrap();
        let (before_slot, before_hwm) = (slot.lock.clone(), fences.hwm());
        let busy = acquire(&mut slot, &mut fences, b"b", 100, i64::MAX / 2, us(T0));
        assert_eq!(busy, Ok(Acquired::Contended));
        let huge = acquire(&mut slot, &mut fences, b"a", 100, i64::MAX, us(T0));
        assert!(matches!(huge, Err(LockError::BadFence(_))));
        assert_eq!((slot.lock.clone(), fences.hwm()), (before_slot, before_hwm));
    }

    /// Defect 4 of issue 15: a holder raised to another lock's token by
    /// MINFENCE must not end up with that very token.
    #[test]
    fn min_fence_never_hands_out_a_token_another_lock_holds() {
        let mut fences = FenceCounter::default();
        let (mut a, mut b) = (MemSlot::default(), MemSlot::default());
        let Ok(Acquired::Granted(fa)) = acquire(&mut a, &mut fences, b"A", 60_000, 0, us(T0))
        else {
            panic!()
        };
        let Ok(Acquired::Granted(fb)) = acquire(&mut b, &mut fences, b"B", 60_000, 0, us(T0))
        else {
            panic!()
        };
        assert!(fb > fa);
        let Ok(Acquired::Renewed(raised)) = acquire(&mut a, &mut fences, b"A", 60_000, fb, us(T0))
        else {
            panic!()
        };
        assert!(raised > fb, "fresh and at least MINFENCE: {raised} vs {fb}");
        assert_eq!(fence(&a, None, T0), Some(raised));
        assert_eq!(fences.hwm(), raised);
    }
}
