//! The lock state machine. A lock is `key -> holder token + fencing token +
//! deadline`. It is free when the key holds no lock or when its deadline has
//! passed: expiry is decided here, by the deadline on the node's monotonic
//! clock (see `time`), at the instant it passes; an ended lock still in the
//! keyspace is reclaimed ([`reclaim`]) when a command touches it or the
//! background sweep finds it.
//!
//! | command | free (or expired)        | held by `token`           | held by another |
//! |---------|--------------------------|---------------------------|-----------------|
//! | acquire | grant: new fence, lease  | same fence, lease reset   | contended (nil) |
//! | release | 0                        | 1, lock removed           | 0               |
//! | extend  | 0 (never revives)        | 1, lease = now + ttl      | 0               |
//! | fence   | nil                      | fence                     | fence, or nil when a token is given |
//!
//! Time comes in as a [`Now`] (both clocks) or as monotonic ms (`now_ms`);
//! fencing tokens from a [`FenceSource`]. Nothing here reads a clock or
//! knows about Redis.

use super::error::LockError;
use super::fence::FenceSource;
use super::time::Now;

/// A lock's state, borrowed from wherever it is stored (the keyspace keeps
/// it in one allocation with the token inline; see `redis::datatype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lock<'a> {
    pub fence: i64,
    /// When the lease ends, on the node's monotonic clock (ms). Persisted
    /// and replicated as a wall-clock deadline (`time::wall_deadline`).
    pub deadline_ms: i64,
    pub token: &'a [u8],
    /// When this holder was granted the lock, on the node's monotonic clock
    /// like the deadline (ms; kept by renewals). Both are written out in
    /// Unix ms converted at one instant (`time::wall_times`), so a step of
    /// the wall clock between the grant and the write cannot put the grant
    /// after the deadline. None when unknown: a lock loaded from encoding
    /// version 1 or from an old AOF's `LOCK._SET` without it.
    pub granted_ms: Option<i64>,
    /// Changes with every grant and renewal (the store assigns it; it is not
    /// persisted; the keyspace keeps its low 24 bits, so an id comes back
    /// after 2^24 grants and renewals on the node). A take-back of an
    /// undelivered grant matches on it and on the fence, at the next timer
    /// run, so it never removes a lease that someone renewed since.
    pub lease: u64,
}

impl Lock<'_> {
    pub fn is_live(&self, now_ms: i64) -> bool {
        now_ms < self.deadline_ms
    }

    pub fn remaining_ms(&self, now_ms: i64) -> i64 {
        self.deadline_ms.saturating_sub(now_ms).max(0)
    }

    /// Until when its key grants nothing: the end of the lease and, since
    /// a lock still stored after its lease is one nobody released,
    /// `lock_delay_ms` more (lock-delay).
    pub fn grants_held_until(&self, lock_delay_ms: i64) -> i64 {
        self.deadline_ms.saturating_add(lock_delay_ms)
    }
}

/// When a lease that ended unreleased stops holding its key back
/// (lock-delay), if it still does at `now_ms`. A released or deleted lock
/// leaves no value behind, so it holds nothing back.
pub fn delayed_until(store: &impl LockRead, lock_delay_ms: i64, now_ms: i64) -> Option<i64> {
    store
        .stored()
        .filter(|l| !l.is_live(now_ms))
        .map(|l| l.grants_held_until(lock_delay_ms))
        .filter(|&until| until > now_ms)
}

/// Why a lock leaves its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Its holder released it.
    Released,
    /// Its lease had ended: reclaimed (an expiration).
    Ended,
    /// A grant whose reply never reached its client, taken back.
    TakenBack,
}

/// A key's lock, read: a key opened for reading only implements this
/// alone, so nothing can be written through it.
pub trait LockRead {
    /// The lock stored under the key, live or ended.
    fn stored(&self) -> Option<Lock<'_>>;

    /// The lock if it is held right now.
    fn live(&self, now_ms: i64) -> Option<Lock<'_>> {
        self.stored().filter(|l| l.is_live(now_ms))
    }
}

/// The store of one key's lock, plain: read, write, delete a value. The
/// Redis glue implements it over a key open for writing; the tests over an
/// `Option`. What a change means (an event, a statistic, a replicated
/// effect) is the node's to say (`output`), not the store's.
pub trait LockStore: LockRead {
    /// Stores `lock` as the key's value, replacing whatever was there.
    fn put(&mut self, lock: Lock<'_>);
    /// The stored lock's lease changes: a new deadline and lease id.
    fn renew(&mut self, deadline_ms: i64, lease: u64);
    /// Deletes the key's lock.
    fn delete(&mut self);
}

/// A key's lock as the state machine changes it: each change says what it
/// is, so the node can report it (`output::Recorder` implements this over
/// a [`LockStore`], with the node's outputs and lease ids).
pub(crate) trait Ledger: LockRead {
    /// Installs a new holder, replacing whatever was stored, with a new
    /// lease id. `replaces_ended`: a lock whose lease had ended was there
    /// (its expiration is this grant's to report).
    fn put(
        &mut self,
        token: &[u8],
        fence: i64,
        deadline_ms: i64,
        granted_ms: Option<i64>,
        replaces_ended: bool,
    );
    /// Same holder, new deadline and new lease id.
    fn renew(&mut self, deadline_ms: i64);
    /// Frees the lock, for the reason given.
    fn remove(&mut self, why: Removal);
}

/// Milliseconds from µs (on the same clock).
pub fn ms(us: i64) -> i64 {
    us.div_euclid(1000)
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
/// token, `max(mark + 1, min_fence)`: never a token another lock already
/// holds (the mark may be above `min_fence` already), and exactly
/// `min_fence` when nothing above it was issued here, so Redlock's second
/// phase gives the granting nodes one token. A contended or refused ACQUIRE
/// changes nothing, the mark included.
#[allow(clippy::too_many_arguments)] // one input per thing the grant depends on
pub fn acquire(
    store: &mut impl Ledger,
    fences: &mut impl FenceSource,
    token: &[u8],
    ttl_ms: i64,
    min_fence: i64,
    lock_delay_ms: i64,
    now: Now,
) -> Result<Acquired, LockError> {
    let now_ms = now.mono_ms();
    let deadline_ms = deadline(now_ms, ttl_ms)?;
    match store.live(now_ms) {
        Some(held) if held.token == token => {
            if min_fence > held.fence {
                let granted_ms = held.granted_ms;
                let fence = raised_fence(fences, min_fence, now.wall_us)?;
                store.put(token, fence, deadline_ms, granted_ms, false);
                return Ok(Acquired::Renewed(fence));
            }
            let fence = held.fence;
            store.renew(deadline_ms);
            Ok(Acquired::Renewed(fence))
        }
        Some(_) => Ok(Acquired::Contended),
        None if delayed_until(store, lock_delay_ms, now_ms).is_some() => Ok(Acquired::Contended),
        None => {
            let fence = fresh_fence(fences, min_fence, now.wall_us)?;
            let replaces_ended = store.stored().is_some();
            store.put(token, fence, deadline_ms, Some(now_ms), replaces_ended);
            Ok(Acquired::Granted(fence))
        }
    }
}

/// Grants a free key to `token` with a `fence` drawn already (one fence
/// for several keys: `LOCK.ACQUIREALL`). The caller checked the key free.
pub(crate) fn grant_with_fence(
    store: &mut impl Ledger,
    token: &[u8],
    fence: i64,
    ttl_ms: i64,
    now_ms: i64,
) -> Result<(), LockError> {
    let deadline_ms = deadline(now_ms, ttl_ms)?;
    let replaces_ended = store.stored().is_some();
    store.put(token, fence, deadline_ms, Some(now_ms), replaces_ended);
    Ok(())
}

/// The fresh token of a holder that asked MINFENCE above its own: above
/// the mark and `min_fence`, not moved to the clock (see [`acquire`]).
pub(crate) fn raised_fence(
    fences: &mut impl FenceSource,
    min_fence: i64,
    now_us: i64,
) -> Result<i64, LockError> {
    fences.raise(min_fence - 1, now_us)?;
    fences.next_fence(0)
}

/// A token never issued before, at least `min_fence` (0: no floor).
pub(crate) fn fresh_fence(
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
pub fn release(store: &mut impl Ledger, token: &[u8], now_ms: i64) -> bool {
    let held = store.live(now_ms).is_some_and(|l| l.token == token);
    if held {
        store.remove(Removal::Released);
    }
    held
}

/// Removes the lock if its lease has ended and its lock-delay passed (an
/// expiration): kept until then, it holds the key back across restarts
/// too. True if it did.
pub fn reclaim(store: &mut impl Ledger, lock_delay_ms: i64, now_ms: i64) -> bool {
    let ended = store
        .stored()
        .is_some_and(|l| now_ms >= l.grants_held_until(lock_delay_ms));
    if ended {
        store.remove(Removal::Ended);
    }
    ended
}

/// True when `token` holds the lock; its lease then ends `ttl_ms` from now.
/// An expired lock is never revived.
pub fn extend(
    store: &mut impl Ledger,
    token: &[u8],
    ttl_ms: i64,
    now_ms: i64,
) -> Result<bool, LockError> {
    let deadline_ms = deadline(now_ms, ttl_ms)?;
    let held = store.live(now_ms).is_some_and(|l| l.token == token);
    if held {
        store.renew(deadline_ms);
    }
    Ok(held)
}

/// The holder's fencing token; with `token`, only if `token` is the holder.
pub fn fence(store: &impl LockRead, token: Option<&[u8]>, now_ms: i64) -> Option<i64> {
    store
        .live(now_ms)
        .filter(|l| token.is_none_or(|t| l.token == t))
        .map(|l| l.fence)
}

/// Takes back a grant whose reply never reached its client (it went away
/// between the hand-off and the reply): frees the lock only if it is still
/// exactly that lease, not renewed or re-granted since. True if it did.
pub fn take_back(store: &mut impl Ledger, fence: i64, lease: u64, now_ms: i64) -> bool {
    let same = store
        .live(now_ms)
        .is_some_and(|l| l.fence == fence && l.lease == lease);
    if same {
        store.remove(Removal::TakenBack);
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
        pub granted_ms: Option<i64>,
    }

    /// A key's store over a plain Option; as a [`Ledger`] (the state
    /// machine's tests), lease ids from its own counter.
    #[derive(Default)]
    pub struct MemStore {
        pub lock: Option<Stored>,
        pub next_lease: u64,
        /// Why locks left, in order (the reasons the store was told).
        pub removed: Vec<Removal>,
    }

    impl LockRead for MemStore {
        fn stored(&self) -> Option<Lock<'_>> {
            self.lock.as_ref().map(|s| Lock {
                fence: s.fence,
                deadline_ms: s.deadline_ms,
                token: &s.token,
                granted_ms: s.granted_ms,
                lease: s.lease,
            })
        }
    }

    impl LockStore for MemStore {
        fn put(&mut self, lock: Lock<'_>) {
            self.lock = Some(Stored {
                fence: lock.fence,
                deadline_ms: lock.deadline_ms,
                token: lock.token.to_vec(),
                lease: lock.lease,
                granted_ms: lock.granted_ms,
            });
        }
        fn renew(&mut self, deadline_ms: i64, lease: u64) {
            let lock = self.lock.as_mut().expect("renew of a stored lock");
            lock.deadline_ms = deadline_ms;
            lock.lease = lease;
        }
        fn delete(&mut self) {
            self.lock = None;
        }
    }

    /// The state machine's tests write through the store directly, with
    /// lease ids from `next_lease`, remembering why locks left.
    impl Ledger for MemStore {
        fn put(
            &mut self,
            token: &[u8],
            fence: i64,
            deadline_ms: i64,
            granted_ms: Option<i64>,
            replaces_ended: bool,
        ) {
            assert!(
                !replaces_ended || self.lock.is_some(),
                "told what it replaces"
            );
            self.next_lease += 1;
            let lease = self.next_lease;
            LockStore::put(
                self,
                Lock {
                    fence,
                    deadline_ms,
                    token,
                    granted_ms,
                    lease,
                },
            );
        }
        fn renew(&mut self, deadline_ms: i64) {
            self.next_lease += 1;
            LockStore::renew(self, deadline_ms, self.next_lease);
        }
        fn remove(&mut self, why: Removal) {
            self.lock = None;
            self.removed.push(why);
        }
    }

    const T0: i64 = 1_700_000_000_000;

    /// `now_ms` as the µs the engine takes.
    fn us(now_ms: i64) -> i64 {
        now_ms * 1000
    }

    fn fixture() -> (MemStore, FenceCounter) {
        (MemStore::default(), FenceCounter::default())
    }

    fn deadline_of(store: &MemStore) -> i64 {
        store.lock.as_ref().unwrap().deadline_ms
    }

    #[test]
    fn first_acquire_grants_with_a_clock_fence_and_absolute_deadline() {
        let (mut store, mut fences) = fixture();
        let got = acquire(&mut store, &mut fences, b"a", 100, 0, 0, Now::same(us(T0)));
        assert_eq!(got, Ok(Acquired::Granted(us(T0))));
        assert_eq!(deadline_of(&store), T0 + 100);
    }

    #[test]
    fn the_grant_time_is_set_by_a_grant_and_kept_by_renewals() {
        let (mut store, mut fences) = fixture();
        acquire(&mut store, &mut fences, b"a", 100, 0, 0, Now::same(us(T0))).unwrap();
        assert_eq!(store.lock.as_ref().unwrap().granted_ms, Some(T0));
        acquire(
            &mut store,
            &mut fences,
            b"a",
            100,
            0,
            0,
            Now::same(us(T0 + 50)),
        )
        .unwrap();
        extend(&mut store, b"a", 100, T0 + 60).unwrap();
        let raised = acquire(
            &mut store,
            &mut fences,
            b"a",
            100,
            us(T0) + 9,
            0,
            Now::same(us(T0 + 70)),
        );
        assert_eq!(
            raised,
            Ok(Acquired::Renewed(us(T0) + 9)),
            "a fresh token, exactly MINFENCE"
        );
        assert_eq!(
            store.lock.as_ref().unwrap().granted_ms,
            Some(T0),
            "renewals keep it"
        );
        assert!(release(&mut store, b"a", T0 + 80));
        acquire(
            &mut store,
            &mut fences,
            b"b",
            100,
            0,
            0,
            Now::same(us(T0 + 90)),
        )
        .unwrap();
        assert_eq!(store.lock.as_ref().unwrap().granted_ms, Some(T0 + 90));
    }

    #[test]
    fn same_token_gets_same_fence_and_a_fresh_lease() {
        let (mut store, mut fences) = fixture();
        acquire(&mut store, &mut fences, b"a", 100, 0, 0, Now::same(us(T0))).unwrap();
        let lease = store.lock.as_ref().unwrap().lease;
        let again = acquire(
            &mut store,
            &mut fences,
            b"a",
            500,
            0,
            0,
            Now::same(us(T0 + 50)),
        );
        assert_eq!(again, Ok(Acquired::Renewed(us(T0))));
        assert_eq!(deadline_of(&store), T0 + 550);
        assert_eq!(fences.hwm(), us(T0), "a renewal issues no token");
        assert_ne!(store.lock.as_ref().unwrap().lease, lease, "new lease id");
    }

    #[test]
    fn other_token_is_contended_until_the_instant_the_lease_ends() {
        let (mut store, mut fences) = fixture();
        acquire(&mut store, &mut fences, b"a", 100, 0, 0, Now::same(us(T0))).unwrap();
        let busy = acquire(
            &mut store,
            &mut fences,
            b"b",
            100,
            0,
            0,
            Now::same(us(T0 + 99)),
        );
        assert_eq!(busy, Ok(Acquired::Contended));
        let free = acquire(
            &mut store,
            &mut fences,
            b"b",
            100,
            0,
            0,
            Now::same(us(T0 + 100)),
        );
        assert_eq!(free, Ok(Acquired::Granted(us(T0 + 100))));
    }

    #[test]
    fn release_only_by_the_live_holder() {
        let (mut store, mut fences) = fixture();
        acquire(&mut store, &mut fences, b"a", 100, 0, 0, Now::same(us(T0))).unwrap();
        assert!(!release(&mut store, b"b", T0 + 1));
        assert!(store.lock.is_some());
        assert!(release(&mut store, b"a", T0 + 1));
        assert!(store.lock.is_none());
        assert!(!release(&mut store, b"a", T0 + 2), "already free");
    }

    #[test]
    fn release_after_expiry_is_zero() {
        let (mut store, mut fences) = fixture();
        acquire(&mut store, &mut fences, b"a", 100, 0, 0, Now::same(us(T0))).unwrap();
        assert!(!release(&mut store, b"a", T0 + 100));
    }

    #[test]
    fn extend_renews_the_holder_and_never_revives() {
        let (mut store, mut fences) = fixture();
        acquire(&mut store, &mut fences, b"a", 100, 0, 0, Now::same(us(T0))).unwrap();
        assert_eq!(extend(&mut store, b"b", 1000, T0 + 10), Ok(false));
        assert_eq!(extend(&mut store, b"a", 1000, T0 + 10), Ok(true));
        assert_eq!(deadline_of(&store), T0 + 1010);
        assert_eq!(extend(&mut store, b"a", 1000, T0 + 1010), Ok(false));
        assert_eq!(deadline_of(&store), T0 + 1010);
    }

    #[test]
    fn fence_reads_the_live_holder_only() {
        let (mut store, mut fences) = fixture();
        assert_eq!(fence(&store, None, T0), None);
        acquire(&mut store, &mut fences, b"a", 100, 0, 0, Now::same(us(T0))).unwrap();
        assert_eq!(fence(&store, None, T0), Some(us(T0)));
        assert_eq!(fence(&store, Some(b"a"), T0), Some(us(T0)));
        assert_eq!(fence(&store, Some(b"b"), T0), None);
        assert_eq!(fence(&store, None, T0 + 100), None);
    }

    #[test]
    fn fences_increase_across_release_and_expiry_even_in_the_same_microsecond() {
        let (mut store, mut fences) = fixture();
        let mut last = 0;
        for i in 0..10 {
            let now = T0 + (i / 3) * 1000;
            let Ok(Acquired::Granted(f)) =
                acquire(&mut store, &mut fences, b"x", 10, 0, 0, Now::same(us(now)))
            else {
                panic!("expected a grant");
            };
            assert!(f > last);
            last = f;
            assert!(release(&mut store, b"x", now));
        }
    }

    #[test]
    fn overflowing_deadline_is_an_error_and_changes_nothing() {
        let (mut store, mut fences) = fixture();
        let got = acquire(
            &mut store,
            &mut fences,
            b"a",
            i64::MAX,
            0,
            0,
            Now::same(us(T0)),
        );
        assert_eq!(got, Err(LockError::TtlOverflowsClock));
        assert!(store.lock.is_none());
        assert_eq!(fences.hwm(), 0);
    }

    #[test]
    fn take_back_removes_only_the_very_lease_it_granted() {
        let (mut store, mut fences) = fixture();
        acquire(&mut store, &mut fences, b"a", 100, 0, 0, Now::same(us(T0))).unwrap();
        let granted = store.lock.clone().unwrap();
        // The same token renews on another connection before the take-back.
        acquire(
            &mut store,
            &mut fences,
            b"a",
            100,
            0,
            0,
            Now::same(us(T0 + 1)),
        )
        .unwrap();
        assert!(!take_back(&mut store, granted.fence, granted.lease, T0 + 2));
        assert!(store.lock.is_some(), "the renewed lease stays");
        let renewed = store.lock.clone().unwrap();
        assert!(take_back(&mut store, renewed.fence, renewed.lease, T0 + 2));
        assert!(store.lock.is_none());
    }

    #[test]
    fn min_fence_raises_a_grant_and_every_later_one() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        let n = us(T0) + 5_000_000;
        let got = acquire(&mut store, &mut fences, b"a", 100, n, 0, Now::same(us(T0)));
        assert_eq!(got, Ok(Acquired::Granted(n)));
        assert!(fences.hwm() >= n);
        release(&mut store, b"a", T0);
        let next = acquire(&mut store, &mut fences, b"b", 100, 0, 0, Now::same(us(T0)));
        assert_eq!(next, Ok(Acquired::Granted(n + 1)));
    }

    #[test]
    fn min_fence_below_the_next_token_changes_nothing_about_it() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        let got = acquire(&mut store, &mut fences, b"a", 100, 3, 0, Now::same(us(T0)));
        assert_eq!(got, Ok(Acquired::Granted(us(T0))));
    }

    #[test]
    fn min_fence_raises_the_holders_own_token_and_renews() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        let Ok(Acquired::Granted(first)) =
            acquire(&mut store, &mut fences, b"a", 100, 0, 0, Now::same(us(T0)))
        else {
            panic!()
        };
        let t = first + 1_000_000;
        let got = acquire(
            &mut store,
            &mut fences,
            b"a",
            500,
            t,
            0,
            Now::same(us(T0 + 50)),
        );
        assert_eq!(got, Ok(Acquired::Renewed(t)));
        assert_eq!(
            fence(&store, Some(b"a"), T0 + 500),
            Some(t),
            "lease renewed too"
        );
        assert_eq!(fences.hwm(), t);
        // Lower or equal: the holder keeps its token, the lease is renewed.
        let again = acquire(
            &mut store,
            &mut fences,
            b"a",
            100,
            t - 7,
            0,
            Now::same(us(T0 + 60)),
        );
        assert_eq!(again, Ok(Acquired::Renewed(t)));
    }

    #[test]
    fn a_contended_or_refused_min_fence_changes_nothing() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        acquire(&mut store, &mut fences, b"a", 100, 0, 0, Now::same(us(T0))).unwrap();
        let (before_slot, before_hwm) = (store.lock.clone(), fences.hwm());
        let busy = acquire(
            &mut store,
            &mut fences,
            b"b",
            100,
            i64::MAX / 2,
            0,
            Now::same(us(T0)),
        );
        assert_eq!(busy, Ok(Acquired::Contended));
        let huge = acquire(
            &mut store,
            &mut fences,
            b"a",
            100,
            i64::MAX,
            0,
            Now::same(us(T0)),
        );
        assert!(matches!(huge, Err(LockError::BadFence(_))));
        assert_eq!(
            (store.lock.clone(), fences.hwm()),
            (before_slot, before_hwm)
        );
    }

    /// Defect 4 of issue 15: a holder raised to another lock's token by
    /// MINFENCE must not end up with that very token.
    #[test]
    fn min_fence_never_hands_out_a_token_another_lock_holds() {
        let mut fences = FenceCounter::default();
        let (mut a, mut b) = (MemStore::default(), MemStore::default());
        let Ok(Acquired::Granted(fa)) =
            acquire(&mut a, &mut fences, b"A", 60_000, 0, 0, Now::same(us(T0)))
        else {
            panic!()
        };
        let Ok(Acquired::Granted(fb)) =
            acquire(&mut b, &mut fences, b"B", 60_000, 0, 0, Now::same(us(T0)))
        else {
            panic!()
        };
        assert!(fb > fa);
        let Ok(Acquired::Renewed(raised)) =
            acquire(&mut a, &mut fences, b"A", 60_000, fb, 0, Now::same(us(T0)))
        else {
            panic!()
        };
        assert!(raised > fb, "fresh and at least MINFENCE: {raised} vs {fb}");
        assert_eq!(fence(&a, None, T0), Some(raised));
        assert_eq!(fences.hwm(), raised);
    }

    #[test]
    fn an_ended_lock_is_reclaimed_once_and_a_live_one_never() {
        let (mut store, mut fences) = fixture();
        acquire(&mut store, &mut fences, b"a", 100, 0, 0, Now::same(us(T0))).unwrap();
        assert!(!reclaim(&mut store, 0, T0 + 99));
        assert!(store.lock.is_some());
        assert!(reclaim(&mut store, 0, T0 + 100));
        assert!(!reclaim(&mut store, 0, T0 + 100));
        assert_eq!(store.removed, vec![Removal::Ended]);
    }

    #[test]
    fn the_store_is_told_why_a_lock_leaves() {
        let (mut store, mut fences) = fixture();
        acquire(&mut store, &mut fences, b"a", 100, 0, 0, Now::same(us(T0))).unwrap();
        assert!(release(&mut store, b"a", T0 + 1));
        acquire(
            &mut store,
            &mut fences,
            b"b",
            100,
            0,
            0,
            Now::same(us(T0 + 2)),
        )
        .unwrap();
        let held = store.lock.clone().unwrap();
        assert!(take_back(&mut store, held.fence, held.lease, T0 + 3));
        assert_eq!(store.removed, vec![Removal::Released, Removal::TakenBack]);
    }

    /// Leases run on the monotonic clock: a wall-clock step neither ends
    /// nor extends one; fences still rise.
    #[test]
    fn a_wall_clock_step_moves_no_lease_and_no_fence_backwards() {
        let (mut store, mut fences) = fixture();
        let at = |mono_ms: i64, wall_step_ms: i64| Now {
            mono_us: mono_ms * 1000,
            wall_us: (mono_ms + wall_step_ms) * 1000,
        };
        let Ok(Acquired::Granted(f1)) =
            acquire(&mut store, &mut fences, b"a", 20_000, 0, 0, at(T0, 0))
        else {
            panic!()
        };
        // +1 h: the lease is still held; another token is contended.
        let busy = acquire(
            &mut store,
            &mut fences,
            b"b",
            20_000,
            0,
            0,
            at(T0 + 1, 3_600_000),
        );
        assert_eq!(busy, Ok(Acquired::Contended));
        // -1 h: the lease still ends on time, and the next token is larger.
        assert!(store.live(T0 + 19_999).is_some());
        assert!(store.live(T0 + 20_000).is_none());
        let Ok(Acquired::Granted(f2)) = acquire(
            &mut store,
            &mut fences,
            b"b",
            100,
            0,
            0,
            at(T0 + 20_000, -3_600_000),
        ) else {
            panic!()
        };
        assert!(f2 > f1);
    }
}
