//! The lock state machine. A lock is `key -> holders`, each `token + fencing
//! token + deadline`: one holder when exclusive (a plain `LOCK.ACQUIRE`),
//! any number at once when shared (`SHARED`), at most the key's limit when
//! it has one (`SHARED LIMIT n`, a counting semaphore with one leased
//! permit per holder). A holder holds the key until its deadline passes:
//! expiry is decided here, by the deadline on the node's monotonic clock
//! (see `time`), at the instant it passes; an ended holder still in the
//! keyspace is reclaimed ([`reclaim`]) when a command touches the key or
//! the background sweep finds it.
//!
//! | command | free (or expired)        | held by `token`           | held by another |
//! |---------|--------------------------|---------------------------|-----------------|
//! | acquire | grant: new fence, lease  | same fence, lease reset   | contended (nil), or a new shared holder while it fits |
//! | release | 0                        | 1, that holder removed    | 0               |
//! | extend  | 0 (never revives)        | 1, lease = now + ttl      | 0               |
//! | fence   | nil                      | fence                     | fence (the newest holder's when shared), or nil when a token is given |
//!
//! Modes: the limit belongs to the key (a request naming another is
//! refused, [`LockError::LimitMismatch`]) until its last holder goes. An
//! exclusive holder asking `SHARED` downgrades in place, keeping its fence;
//! a shared holder asking for the key exclusively is refused
//! ([`LockError::NoUpgrade`]): two readers upgrading would wait for each
//! other for ever.
//!
//! Time comes in as monotonic ms (`now_ms`), and wall-clock µs where a
//! fence is drawn; fencing tokens from a [`FenceSource`]. Nothing here
//! reads a clock or knows about Redis.

use super::error::LockError;
use super::fence::FenceSource;
#[cfg(test)]
use super::time::Now;

/// One holder of a key, borrowed from wherever it is stored (the keyspace
/// keeps an exclusive lock in one allocation with the token inline; see
/// `redis::datatype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lock<'a> {
    pub fence: i64,
    /// When the lease ends, on the node's monotonic clock (ms). Persisted
    /// and replicated as a wall-clock deadline (`time::wall_deadline`).
    pub deadline_ms: i64,
    pub token: &'a [u8],
    /// The holder's public value (`VALUE v`; empty: none): a leader's
    /// address or id, shown to every reader, unlike the token.
    pub value: &'a [u8],
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

    /// Until when it holds its key: the end of the lease and, since a
    /// holder still stored after its lease is one nobody released,
    /// `lock_delay_ms` more (lock-delay).
    pub fn grants_held_until(&self, lock_delay_ms: i64) -> i64 {
        self.deadline_ms.saturating_add(lock_delay_ms)
    }

    /// When what it holds next changes at `now_ms`: the end of a live
    /// lease, else the end of its lock-delay.
    fn next_change(&self, lock_delay_ms: i64, now_ms: i64) -> i64 {
        match self.is_live(now_ms) {
            true => self.deadline_ms,
            false => self.grants_held_until(lock_delay_ms),
        }
    }
}

/// How a key's holders hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One holder at a time (`LOCK.ACQUIRE` without `SHARED`).
    Exclusive,
    /// Any number of holders at once (`SHARED`), at most `limit` when
    /// given (`LIMIT n`).
    Shared { limit: Option<u32> },
}

impl Mode {
    pub fn is_shared(self) -> bool {
        matches!(self, Mode::Shared { .. })
    }

    /// How many holders a key in this mode may have at once, with
    /// `max_holders` the node's bound (`lock.max-holders-per-key`).
    pub fn capacity(self, max_holders: usize) -> usize {
        match self {
            Mode::Exclusive => 1,
            Mode::Shared { limit: None } => max_holders,
            Mode::Shared { limit: Some(n) } => (n as usize).min(max_holders),
        }
    }
}

/// Why a holder leaves its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// It released it.
    Released,
    /// Its lease had ended: reclaimed (an expiration).
    Ended,
    /// A grant whose reply never reached its client, taken back.
    TakenBack,
}

/// A key's lock, read: a key opened for reading only implements this
/// alone, so nothing can be written through it.
pub trait LockRead {
    /// The key's mode, when it stores a lock (live or ended holders).
    fn mode(&self) -> Option<Mode>;

    /// The key's `i`-th holder as stored (live or ended), in the order they
    /// were granted: exactly one when exclusive.
    fn holder_at(&self, i: usize) -> Option<Lock<'_>>;
}

/// Every holder stored under a key, live or ended, in grant order.
pub fn holders<S: LockRead + ?Sized>(store: &S) -> impl Iterator<Item = Lock<'_>> {
    (0..).map_while(move |i| store.holder_at(i))
}

/// `token`'s holder when its lease has not ended.
#[inline]
pub fn holder_of<'s, S: LockRead + ?Sized>(
    store: &'s S,
    token: &[u8],
    now_ms: i64,
) -> Option<Lock<'s>> {
    if store.mode() == Some(Mode::Exclusive) {
        // The common case, without the walk.
        return store
            .holder_at(0)
            .filter(|l| l.token == token && l.is_live(now_ms));
    }
    holders(store).find(|l| l.token == token && l.is_live(now_ms))
}

/// Whether anyone holds the key now.
pub fn is_held<S: LockRead + ?Sized>(store: &S, now_ms: i64) -> bool {
    holders(store).any(|l| l.is_live(now_ms))
}

/// The newest live holder (the only one when exclusive).
pub fn newest_live<S: LockRead + ?Sized>(store: &S, now_ms: i64) -> Option<Lock<'_>> {
    if store.mode() == Some(Mode::Exclusive) {
        return store.holder_at(0).filter(|l| l.is_live(now_ms));
    }
    holders(store)
        .filter(|l| l.is_live(now_ms))
        .max_by_key(|l| l.fence)
}

/// The store of one key's holders, plain: read, write, delete. The Redis
/// glue implements it over a key open for writing; the tests over a
/// `Vec`. What a change means (an event, a statistic, a replicated
/// effect) is the node's to say (`output`), not the store's.
pub trait LockStore: LockRead {
    /// Stores `lock` as the key's only holder, in `mode`, replacing
    /// whatever was there.
    fn put(&mut self, mode: Mode, lock: Lock<'_>);
    /// A shared key (which stores holders already) gets `lock` as one more
    /// holder, or as the new state of the holder with its token.
    fn add(&mut self, lock: Lock<'_>);
    /// The holder of `token` gets a new deadline and lease id.
    fn renew(&mut self, token: &[u8], deadline_ms: i64, lease: u64);
    /// The key's holders stay, in another mode (an exclusive holder
    /// downgrading to shared).
    fn set_mode(&mut self, mode: Mode);
    /// Removes the holder of `token`; the key goes with its last holder.
    fn remove(&mut self, token: &[u8]);
}

/// A holder as the state machine writes it (the lease id is the ledger's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NewHolder<'a> {
    pub token: &'a [u8],
    pub value: &'a [u8],
    pub fence: i64,
    pub deadline_ms: i64,
    pub granted_ms: Option<i64>,
}

/// A key's lock as the state machine changes it: each change says what it
/// is, so the node can report it (`output::Recorder` implements this over
/// a [`LockStore`], with the node's outputs and lease ids).
pub(crate) trait Ledger: LockRead {
    /// `holder` becomes the key's only holder, in `mode`, with a new lease
    /// id. Holders stored before it whose lease had ended are this grant's
    /// to report as expirations.
    fn put(&mut self, mode: Mode, holder: NewHolder<'_>);
    /// One more holder of the shared key, or `holder.token`'s holder
    /// replaced (a raised fence), with a new lease id.
    fn add(&mut self, holder: NewHolder<'_>);
    /// `token`'s holder: new deadline and new lease id.
    fn renew(&mut self, token: &[u8], deadline_ms: i64);
    /// An exclusive holder downgrades: the key is shared from now on.
    fn set_mode(&mut self, mode: Mode);
    /// `token`'s holder leaves, for the reason given.
    fn remove(&mut self, token: &[u8], why: Removal);
}

/// Milliseconds from µs (on the same clock).
pub fn ms(us: i64) -> i64 {
    us.div_euclid(1000)
}

/// What the state machine's tests' [`acquire`] comes to (the node
/// decides a real request: `node::Node::acquire_all`).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// A new grant with a new fencing token.
    Granted(i64),
    /// `token` already held the lock: same fencing token, lease reset.
    Renewed(i64),
    /// It does not fit now: another token holds the key, or lock-delay
    /// holds it back, or a shared key is full.
    Contended,
}

/// The error of a holder the caller checked and the store does not have
/// (a function, so the hot path does not build it).
fn internal() -> LockError {
    LockError::Internal
}

/// The absolute deadline of a lease of `ttl_ms` starting now.
pub fn deadline(now_ms: i64, ttl_ms: i64) -> Result<i64, LockError> {
    // A match, not `ok_or`: that builds (and drops) the error on every
    // call, and this runs on every ACQUIRE and EXTEND.
    match now_ms.checked_add(ttl_ms) {
        Some(deadline_ms) => Ok(deadline_ms),
        None => Err(LockError::TtlOverflowsClock),
    }
}

/// The node's rules for a grant that the state machine applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rules {
    /// `lock.lock-delay-ms`: a lease that ended unreleased holds its key
    /// back this long after its end.
    pub lock_delay_ms: i64,
    /// `lock.max-holders-per-key`: no key has more holders at once.
    pub max_holders: usize,
}

/// Whether a request fits the key now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// Its token holds the key already (in its mode, or exclusively when it
    /// asks `SHARED`: a downgrade): a renewal.
    Renews,
    /// A new holder fits now.
    Fits,
    /// Not now; look again at this time (ms) at the latest: a lease or a
    /// lock-delay that holds it back ends then.
    Busy(i64),
}

/// Whether `token` asking for the key in `mode` fits it at `now_ms`, or
/// why not: a limit other than the key's, or an upgrade, is an error.
#[inline(always)] // on every ACQUIRE: the exclusive case is a few compares
pub fn fit(
    store: &impl LockRead,
    token: &[u8],
    mode: Mode,
    rules: Rules,
    now_ms: i64,
) -> Result<Fit, LockError> {
    let delay = rules.lock_delay_ms;
    match store.mode() {
        // The common cases, in a look or two: no lock, or the one holder
        // of an exclusive key.
        None => Ok(Fit::Fits),
        Some(Mode::Exclusive) => {
            let Some(held) = store
                .holder_at(0)
                .filter(|l| now_ms < l.grants_held_until(delay))
            else {
                return Ok(Fit::Fits);
            };
            if held.token == token && held.is_live(now_ms) {
                return Ok(Fit::Renews);
            }
            Ok(Fit::Busy(held.next_change(delay, now_ms)))
        }
        Some(Mode::Shared { .. }) => fit_holders(store, token, mode, rules, now_ms),
    }
}

/// [`fit`] for a shared key.
#[inline(never)] // kept out of the exclusive path that inlines `fit`
fn fit_holders(
    store: &impl LockRead,
    token: &[u8],
    mode: Mode,
    rules: Rules,
    now_ms: i64,
) -> Result<Fit, LockError> {
    let delay = rules.lock_delay_ms;
    // Holders that keep the key: live, or ended unreleased within their
    // lock-delay.
    let occupying = || holders(store).filter(move |l| now_ms < l.grants_held_until(delay));
    let Some(held_mode) = store.mode().filter(|_| occupying().next().is_some()) else {
        return Ok(Fit::Fits);
    };
    let own = holder_of(store, token, now_ms);
    match (held_mode, mode) {
        (Mode::Exclusive, _) if own.is_some() => return Ok(Fit::Renews),
        (Mode::Shared { .. }, Mode::Exclusive) if own.is_some() => {
            return Err(LockError::NoUpgrade)
        }
        (Mode::Shared { limit: held }, Mode::Shared { limit: asked }) if held != asked => {
            return Err(LockError::LimitMismatch { held, asked })
        }
        (Mode::Shared { .. }, Mode::Shared { .. }) if own.is_some() => return Ok(Fit::Renews),
        _ => {}
    }
    let ends = occupying().map(|l| l.next_change(delay, now_ms));
    Ok(match (held_mode, mode) {
        (Mode::Shared { .. }, Mode::Shared { .. })
            if occupying().count() < mode.capacity(rules.max_holders) =>
        {
            Fit::Fits
        }
        // A shared key is full: one holder going frees a place.
        (Mode::Shared { .. }, Mode::Shared { .. }) => Fit::Busy(ends.min().unwrap_or(now_ms)),
        // Exclusive on either side: every holder must go.
        _ => Fit::Busy(ends.max().unwrap_or(now_ms)),
    })
}

/// Takes the key for `token` in `mode` if that fits (see [`fit`]), with
/// `MINFENCE min_fence` (0: none): the state machine's own steps, as the
/// node composes them for a request (`node::Node::acquire_all`, which also
/// decides whether a new holder may be granted now: restart delay,
/// eviction, memory, waiters in line). For the state machine's tests.
///
/// A holder that asks for a `min_fence` above its own token gets a *fresh*
/// token, `max(mark + 1, min_fence)`: never a token another lock already
/// holds (the mark may be above `min_fence` already), and exactly
/// `min_fence` when nothing above it was issued here, so Redlock's second
/// phase gives the granting nodes one token. A contended or refused ACQUIRE
/// changes nothing, the mark included; every check and every fence is
/// done before the first write.
#[cfg(test)]
#[allow(clippy::too_many_arguments)] // one input per thing the grant depends on
pub fn acquire(
    store: &mut impl Ledger,
    fences: &mut impl FenceSource,
    token: &[u8],
    mode: Mode,
    ttl_ms: i64,
    min_fence: i64,
    rules: Rules,
    now: Now,
) -> Result<Acquired, LockError> {
    let now_ms = now.mono_ms();
    let fits = fit(store, token, mode, rules, now_ms)?;
    let deadline_ms = deadline(now_ms, ttl_ms)?;
    match fits {
        Fit::Busy(_) => Ok(Acquired::Contended),
        Fit::Renews => {
            let held = holder_of(store, token, now_ms).ok_or_else(internal)?;
            let raised = match min_fence > held.fence {
                true => Some(raised_fence(fences, min_fence, now.wall_us)?),
                false => None,
            };
            let fence = renew_holder(store, token, mode, raised, None, deadline_ms, now_ms)?;
            Ok(Acquired::Renewed(fence))
        }
        Fit::Fits => {
            let fence = fresh_fence(fences, min_fence, now.wall_us)?;
            grant(store, mode, token, b"", fence, deadline_ms, rules, now_ms);
            Ok(Acquired::Granted(fence))
        }
    }
}

/// `token`'s live holder (a renewal, checked by the caller with [`fit`])
/// gets a lease to `deadline_ms` and, when `raised`, that fence (MINFENCE
/// above its own), and when `value` is given, that public value (what etcd
/// calls a proclaim); asking `SHARED` while holding the key exclusively
/// downgrades it. The holder's fence now.
pub(crate) fn renew_holder(
    store: &mut impl Ledger,
    token: &[u8],
    mode: Mode,
    raised: Option<i64>,
    value: Option<&[u8]>,
    deadline_ms: i64,
    now_ms: i64,
) -> Result<i64, LockError> {
    let held = holder_of(store, token, now_ms).ok_or_else(internal)?;
    let (fence, granted_ms) = (held.fence, held.granted_ms);
    // A new value is a new holder record (the keyspace keeps the value
    // inline), with the same fence unless raised. The held value is copied
    // (out of the store about to be written) only when a raised fence
    // rewrites the record with it; a plain renewal copies nothing.
    let new_value = value.filter(|&v| v != held.value);
    let kept_value = match (raised, new_value) {
        (Some(_), None) => held.value.to_vec(),
        _ => Vec::new(),
    };
    if store.mode() == Some(Mode::Exclusive) && mode.is_shared() {
        store.set_mode(mode);
    }
    let holder = |fence| NewHolder {
        token,
        value: new_value.unwrap_or(&kept_value),
        fence,
        deadline_ms,
        granted_ms,
    };
    match (raised.or(new_value.map(|_| fence)), store.mode()) {
        (Some(fence), Some(Mode::Exclusive)) => store.put(Mode::Exclusive, holder(fence)),
        (Some(fence), _) => store.add(holder(fence)),
        (None, _) => store.renew(token, deadline_ms),
    }
    Ok(raised.unwrap_or(fence))
}

/// A new holder of a key it fits (checked by the caller with [`fit`]),
/// with a `fence` drawn already (one fence for several keys:
/// `LOCK.ACQUIREALL`): the key's only one, or one more of a shared key,
/// whose holders that ended past their lock-delay leave first
/// (expirations).
#[allow(clippy::too_many_arguments)] // one input per thing the grant depends on
#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub(crate) fn grant(
    store: &mut impl Ledger,
    mode: Mode,
    token: &[u8],
    value: &[u8],
    fence: i64,
    deadline_ms: i64,
    rules: Rules,
    now_ms: i64,
) {
    let holder = NewHolder {
        token,
        value,
        fence,
        deadline_ms,
        granted_ms: Some(now_ms),
    };
    let occupied = || holders(store).any(|l| now_ms < l.grants_held_until(rules.lock_delay_ms));
    if mode.is_shared() && store.mode().is_some() && occupied() {
        reclaim(store, rules.lock_delay_ms, now_ms);
        store.add(holder);
    } else {
        store.put(mode, holder);
    }
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
#[inline(always)] // on every grant: part of one inlined path (callgrind)
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

/// True when `token` held the key and has let go of it.
pub fn release(store: &mut impl Ledger, token: &[u8], now_ms: i64) -> bool {
    let held = holder_of(store, token, now_ms).is_some();
    if held {
        store.remove(token, Removal::Released);
    }
    held
}

/// Removes every holder whose lease has ended and whose lock-delay passed
/// (expirations): kept until then, it holds the key back across restarts
/// too. True if it removed any.
pub fn reclaim(store: &mut impl Ledger, lock_delay_ms: i64, now_ms: i64) -> bool {
    let Some(mode) = store.mode() else {
        return false; // no lock (one just released, say)
    };
    if mode == Mode::Exclusive {
        // The common case in one look at the one holder.
        let ended = store
            .holder_at(0)
            .filter(|l| now_ms >= l.grants_held_until(lock_delay_ms))
            .map(|l| l.token.to_vec());
        if let Some(token) = &ended {
            store.remove(token, Removal::Ended);
        }
        return ended.is_some();
    }
    let mut any = false;
    loop {
        let ended = holders(store)
            .find(|l| now_ms >= l.grants_held_until(lock_delay_ms))
            .map(|l| l.token.to_vec());
        let Some(token) = ended else {
            return any;
        };
        store.remove(&token, Removal::Ended);
        any = true;
    }
}

/// True when `token` holds the key; its lease then ends `ttl_ms` from now.
/// An ended lease is never revived.
pub fn extend(
    store: &mut impl Ledger,
    token: &[u8],
    ttl_ms: i64,
    now_ms: i64,
) -> Result<bool, LockError> {
    let deadline_ms = deadline(now_ms, ttl_ms)?;
    let held = holder_of(store, token, now_ms).is_some();
    if held {
        store.renew(token, deadline_ms);
    }
    Ok(held)
}

/// With `token`, its fencing token while it holds the key; without, the
/// holder's (the newest holder's when the key is shared).
pub fn fence(store: &impl LockRead, token: Option<&[u8]>, now_ms: i64) -> Option<i64> {
    match token {
        Some(token) => holder_of(store, token, now_ms).map(|l| l.fence),
        None => newest_live(store, now_ms).map(|l| l.fence),
    }
}

/// Takes back a grant whose reply never reached its client (it went away
/// between the hand-off and the reply): removes that holder only if it is
/// still exactly that lease, not renewed or re-granted since. True if it
/// did.
pub fn take_back(store: &mut impl Ledger, fence: i64, lease: u64, now_ms: i64) -> bool {
    let same = holders(store)
        .find(|l| l.is_live(now_ms) && l.fence == fence && l.lease == lease)
        .map(|l| l.token.to_vec());
    match same {
        Some(token) => {
            store.remove(&token, Removal::TakenBack);
            true
        }
        None => false,
    }
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
        pub value: Vec<u8>,
        pub lease: u64,
        pub granted_ms: Option<i64>,
    }

    /// A key's store over a plain `Vec` of holders; as a [`Ledger`] (the
    /// state machine's tests), lease ids from its own counter.
    #[derive(Default)]
    pub struct MemStore {
        pub mode: Option<Mode>,
        pub holders: Vec<Stored>,
        pub next_lease: u64,
        /// Why holders left, in order (the reasons the store was told).
        pub removed: Vec<Removal>,
    }

    impl MemStore {
        /// The first holder stored (the only one when exclusive).
        pub fn lock(&self) -> Option<&Stored> {
            self.holders.first()
        }

        /// Empties the key (as a DEL does).
        pub fn clear(&mut self) {
            self.mode = None;
            self.holders.clear();
        }

        fn stored(s: &Stored) -> Lock<'_> {
            Lock {
                fence: s.fence,
                deadline_ms: s.deadline_ms,
                token: &s.token,
                value: &s.value,
                granted_ms: s.granted_ms,
                lease: s.lease,
            }
        }

        fn owned(lock: Lock<'_>) -> Stored {
            Stored {
                fence: lock.fence,
                deadline_ms: lock.deadline_ms,
                token: lock.token.to_vec(),
                value: lock.value.to_vec(),
                lease: lock.lease,
                granted_ms: lock.granted_ms,
            }
        }

        fn lease(&mut self) -> u64 {
            self.next_lease += 1;
            self.next_lease
        }
    }

    impl LockRead for MemStore {
        fn mode(&self) -> Option<Mode> {
            self.mode.filter(|_| !self.holders.is_empty())
        }
        fn holder_at(&self, i: usize) -> Option<Lock<'_>> {
            self.holders.get(i).map(MemStore::stored)
        }
    }

    impl LockStore for MemStore {
        fn put(&mut self, mode: Mode, lock: Lock<'_>) {
            self.mode = Some(mode);
            self.holders = vec![MemStore::owned(lock)];
        }
        fn add(&mut self, lock: Lock<'_>) {
            assert!(
                matches!(self.mode, Some(Mode::Shared { .. })),
                "add to a shared key"
            );
            match self.holders.iter_mut().find(|h| h.token == lock.token) {
                Some(h) => *h = MemStore::owned(lock),
                None => self.holders.push(MemStore::owned(lock)),
            }
        }
        fn renew(&mut self, token: &[u8], deadline_ms: i64, lease: u64) {
            let h = self
                .holders
                .iter_mut()
                .find(|h| h.token == token)
                .expect("renew of a stored holder");
            h.deadline_ms = deadline_ms;
            h.lease = lease;
        }
        fn set_mode(&mut self, mode: Mode) {
            assert!(!self.holders.is_empty(), "a mode for a stored key");
            self.mode = Some(mode);
        }
        fn remove(&mut self, token: &[u8]) {
            self.holders.retain(|h| h.token != token);
            if self.holders.is_empty() {
                self.mode = None;
            }
        }
    }

    /// The state machine's tests write through the store directly, with
    /// lease ids from `next_lease`, remembering why holders left.
    impl Ledger for MemStore {
        fn put(&mut self, mode: Mode, h: NewHolder<'_>) {
            let lease = self.lease();
            let lock = Lock {
                fence: h.fence,
                deadline_ms: h.deadline_ms,
                token: h.token,
                value: h.value,
                granted_ms: h.granted_ms,
                lease,
            };
            LockStore::put(self, mode, lock);
        }
        fn add(&mut self, h: NewHolder<'_>) {
            let lease = self.lease();
            let lock = Lock {
                fence: h.fence,
                deadline_ms: h.deadline_ms,
                token: h.token,
                value: h.value,
                granted_ms: h.granted_ms,
                lease,
            };
            LockStore::add(self, lock);
        }
        fn renew(&mut self, token: &[u8], deadline_ms: i64) {
            let lease = self.lease();
            LockStore::renew(self, token, deadline_ms, lease);
        }
        fn set_mode(&mut self, mode: Mode) {
            LockStore::set_mode(self, mode);
        }
        fn remove(&mut self, token: &[u8], why: Removal) {
            LockStore::remove(self, token);
            self.removed.push(why);
        }
    }

    const T0: i64 = 1_700_000_000_000;
    const EX: Mode = Mode::Exclusive;

    /// [`super::acquire`] with lock-delay `delay_ms` and a bound of 100
    /// holders per key.
    #[allow(clippy::too_many_arguments)]
    fn acquire(
        store: &mut MemStore,
        fences: &mut FenceCounter,
        token: &[u8],
        mode: Mode,
        ttl_ms: i64,
        min_fence: i64,
        delay_ms: i64,
        now: Now,
    ) -> Result<Acquired, LockError> {
        let rules = Rules {
            lock_delay_ms: delay_ms,
            max_holders: 100,
        };
        super::acquire(store, fences, token, mode, ttl_ms, min_fence, rules, now)
    }

    /// `now_ms` as the µs the engine takes.
    fn us(now_ms: i64) -> i64 {
        now_ms * 1000
    }

    fn fixture() -> (MemStore, FenceCounter) {
        (MemStore::default(), FenceCounter::default())
    }

    fn deadline_of(store: &MemStore) -> i64 {
        store.lock().unwrap().deadline_ms
    }

    #[test]
    fn first_acquire_grants_with_a_clock_fence_and_absolute_deadline() {
        let (mut store, mut fences) = fixture();
        let got = acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        );
        assert_eq!(got, Ok(Acquired::Granted(us(T0))));
        assert_eq!(deadline_of(&store), T0 + 100);
    }

    #[test]
    fn the_grant_time_is_set_by_a_grant_and_kept_by_renewals() {
        let (mut store, mut fences) = fixture();
        acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        )
        .unwrap();
        assert_eq!(store.lock().unwrap().granted_ms, Some(T0));
        acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
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
            EX,
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
            store.lock().unwrap().granted_ms,
            Some(T0),
            "renewals keep it"
        );
        assert!(release(&mut store, b"a", T0 + 80));
        acquire(
            &mut store,
            &mut fences,
            b"b",
            EX,
            100,
            0,
            0,
            Now::same(us(T0 + 90)),
        )
        .unwrap();
        assert_eq!(store.lock().unwrap().granted_ms, Some(T0 + 90));
    }

    #[test]
    fn same_token_gets_same_fence_and_a_fresh_lease() {
        let (mut store, mut fences) = fixture();
        acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        )
        .unwrap();
        let lease = store.lock().unwrap().lease;
        let again = acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            500,
            0,
            0,
            Now::same(us(T0 + 50)),
        );
        assert_eq!(again, Ok(Acquired::Renewed(us(T0))));
        assert_eq!(deadline_of(&store), T0 + 550);
        assert_eq!(fences.hwm(), us(T0), "a renewal issues no token");
        assert_ne!(store.lock().unwrap().lease, lease, "new lease id");
    }

    #[test]
    fn other_token_is_contended_until_the_instant_the_lease_ends() {
        let (mut store, mut fences) = fixture();
        acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        )
        .unwrap();
        let busy = acquire(
            &mut store,
            &mut fences,
            b"b",
            EX,
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
            EX,
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
        acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        )
        .unwrap();
        assert!(!release(&mut store, b"b", T0 + 1));
        assert!(store.lock().is_some());
        assert!(release(&mut store, b"a", T0 + 1));
        assert!(store.lock().is_none());
        assert!(!release(&mut store, b"a", T0 + 2), "already free");
    }

    #[test]
    fn release_after_expiry_is_zero() {
        let (mut store, mut fences) = fixture();
        acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        )
        .unwrap();
        assert!(!release(&mut store, b"a", T0 + 100));
    }

    #[test]
    fn extend_renews_the_holder_and_never_revives() {
        let (mut store, mut fences) = fixture();
        acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        )
        .unwrap();
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
        acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        )
        .unwrap();
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
            let Ok(Acquired::Granted(f)) = acquire(
                &mut store,
                &mut fences,
                b"x",
                EX,
                10,
                0,
                0,
                Now::same(us(now)),
            ) else {
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
            EX,
            i64::MAX,
            0,
            0,
            Now::same(us(T0)),
        );
        assert_eq!(got, Err(LockError::TtlOverflowsClock));
        assert!(store.lock().is_none());
        assert_eq!(fences.hwm(), 0);
    }

    #[test]
    fn take_back_removes_only_the_very_lease_it_granted() {
        let (mut store, mut fences) = fixture();
        acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        )
        .unwrap();
        let granted = store.lock().cloned().unwrap();
        // The same token renews on another connection before the take-back.
        acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0 + 1)),
        )
        .unwrap();
        assert!(!take_back(&mut store, granted.fence, granted.lease, T0 + 2));
        assert!(store.lock().is_some(), "the renewed lease stays");
        let renewed = store.lock().cloned().unwrap();
        assert!(take_back(&mut store, renewed.fence, renewed.lease, T0 + 2));
        assert!(store.lock().is_none());
    }

    #[test]
    fn min_fence_raises_a_grant_and_every_later_one() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        let n = us(T0) + 5_000_000;
        let got = acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            n,
            0,
            Now::same(us(T0)),
        );
        assert_eq!(got, Ok(Acquired::Granted(n)));
        assert!(fences.hwm() >= n);
        release(&mut store, b"a", T0);
        let next = acquire(
            &mut store,
            &mut fences,
            b"b",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        );
        assert_eq!(next, Ok(Acquired::Granted(n + 1)));
    }

    #[test]
    fn min_fence_below_the_next_token_changes_nothing_about_it() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        let got = acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            3,
            0,
            Now::same(us(T0)),
        );
        assert_eq!(got, Ok(Acquired::Granted(us(T0))));
    }

    #[test]
    fn min_fence_raises_the_holders_own_token_and_renews() {
        let (mut store, mut fences) = (MemStore::default(), FenceCounter::default());
        let Ok(Acquired::Granted(first)) = acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        ) else {
            panic!()
        };
        let t = first + 1_000_000;
        let got = acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
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
            EX,
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
        acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        )
        .unwrap();
        let (before_slot, before_hwm) = (store.lock().cloned(), fences.hwm());
        let busy = acquire(
            &mut store,
            &mut fences,
            b"b",
            EX,
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
            EX,
            100,
            i64::MAX,
            0,
            Now::same(us(T0)),
        );
        assert!(matches!(huge, Err(LockError::BadFence(_))));
        assert_eq!(
            (store.lock().cloned(), fences.hwm()),
            (before_slot, before_hwm)
        );
    }

    /// Defect 4 of issue 15: a holder raised to another lock's token by
    /// MINFENCE must not end up with that very token.
    #[test]
    fn min_fence_never_hands_out_a_token_another_lock_holds() {
        let mut fences = FenceCounter::default();
        let (mut a, mut b) = (MemStore::default(), MemStore::default());
        let Ok(Acquired::Granted(fa)) = acquire(
            &mut a,
            &mut fences,
            b"A",
            EX,
            60_000,
            0,
            0,
            Now::same(us(T0)),
        ) else {
            panic!()
        };
        let Ok(Acquired::Granted(fb)) = acquire(
            &mut b,
            &mut fences,
            b"B",
            EX,
            60_000,
            0,
            0,
            Now::same(us(T0)),
        ) else {
            panic!()
        };
        assert!(fb > fa);
        let Ok(Acquired::Renewed(raised)) = acquire(
            &mut a,
            &mut fences,
            b"A",
            EX,
            60_000,
            fb,
            0,
            Now::same(us(T0)),
        ) else {
            panic!()
        };
        assert!(raised > fb, "fresh and at least MINFENCE: {raised} vs {fb}");
        assert_eq!(fence(&a, None, T0), Some(raised));
        assert_eq!(fences.hwm(), raised);
    }

    #[test]
    fn an_ended_lock_is_reclaimed_once_and_a_live_one_never() {
        let (mut store, mut fences) = fixture();
        acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        )
        .unwrap();
        assert!(!reclaim(&mut store, 0, T0 + 99));
        assert!(store.lock().is_some());
        assert!(reclaim(&mut store, 0, T0 + 100));
        assert!(!reclaim(&mut store, 0, T0 + 100));
        assert_eq!(store.removed, vec![Removal::Ended]);
    }

    #[test]
    fn the_store_is_told_why_a_lock_leaves() {
        let (mut store, mut fences) = fixture();
        acquire(
            &mut store,
            &mut fences,
            b"a",
            EX,
            100,
            0,
            0,
            Now::same(us(T0)),
        )
        .unwrap();
        assert!(release(&mut store, b"a", T0 + 1));
        acquire(
            &mut store,
            &mut fences,
            b"b",
            EX,
            100,
            0,
            0,
            Now::same(us(T0 + 2)),
        )
        .unwrap();
        let held = store.lock().cloned().unwrap();
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
            acquire(&mut store, &mut fences, b"a", EX, 20_000, 0, 0, at(T0, 0))
        else {
            panic!()
        };
        // +1 h: the lease is still held; another token is contended.
        let busy = acquire(
            &mut store,
            &mut fences,
            b"b",
            EX,
            20_000,
            0,
            0,
            at(T0 + 1, 3_600_000),
        );
        assert_eq!(busy, Ok(Acquired::Contended));
        // -1 h: the lease still ends on time, and the next token is larger.
        assert!(is_held(&store, T0 + 19_999));
        assert!(!is_held(&store, T0 + 20_000));
        let Ok(Acquired::Granted(f2)) = acquire(
            &mut store,
            &mut fences,
            b"b",
            EX,
            100,
            0,
            0,
            at(T0 + 20_000, -3_600_000),
        ) else {
            panic!()
        };
        assert!(f2 > f1);
    }

    const SH: Mode = Mode::Shared { limit: None };

    fn limit(n: u32) -> Mode {
        Mode::Shared { limit: Some(n) }
    }

    fn granted(got: Result<Acquired, LockError>) -> i64 {
        match got {
            Ok(Acquired::Granted(f)) => f,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    fn tokens(store: &MemStore) -> Vec<Vec<u8>> {
        store.holders.iter().map(|h| h.token.clone()).collect()
    }

    #[test]
    fn shared_holders_coexist_with_fences_of_their_own_and_keep_a_writer_out() {
        let (mut store, mut fences) = fixture();
        let at = Now::same(us(T0));
        let a = granted(acquire(&mut store, &mut fences, b"a", SH, 100, 0, 0, at));
        let b = granted(acquire(&mut store, &mut fences, b"b", SH, 50, 0, 0, at));
        assert!(b > a, "every grant gets a fence above every earlier one");
        assert_eq!(store.mode(), Some(SH));
        let w = acquire(&mut store, &mut fences, b"w", EX, 100, 0, 0, at);
        assert_eq!(w, Ok(Acquired::Contended));
        assert_eq!(
            fit(&store, b"w", EX, Rules::default(), T0),
            Ok(Fit::Busy(T0 + 100)),
            "a writer waits for the last reader"
        );
        assert!(release(&mut store, b"a", T0 + 1));
        assert_eq!(tokens(&store), vec![b"b".to_vec()]);
        assert_eq!(fence(&store, None, T0 + 1), Some(b));
        let later = Now::same(us(T0 + 50));
        let w = granted(acquire(&mut store, &mut fences, b"w", EX, 100, 0, 0, later));
        assert!(w > b);
        assert_eq!(store.mode(), Some(EX));
        // (b's ended lease was replaced by w's grant: the node's ledger
        // reports that expiration; this store only counts removals.)
        assert_eq!(store.removed, vec![Removal::Released]);
    }

    #[test]
    fn a_limit_caps_the_holders_and_a_release_frees_a_place() {
        let (mut store, mut fences) = fixture();
        let at = Now::same(us(T0));
        granted(acquire(
            &mut store,
            &mut fences,
            b"a",
            limit(2),
            100,
            0,
            0,
            at,
        ));
        granted(acquire(
            &mut store,
            &mut fences,
            b"b",
            limit(2),
            30,
            0,
            0,
            at,
        ));
        let full = acquire(&mut store, &mut fences, b"c", limit(2), 100, 0, 0, at);
        assert_eq!(full, Ok(Acquired::Contended));
        assert_eq!(
            fit(&store, b"c", limit(2), Rules::default(), T0),
            Ok(Fit::Busy(T0 + 30)),
            "the first lease to end frees a place"
        );
        assert!(release(&mut store, b"a", T0 + 1));
        granted(acquire(
            &mut store,
            &mut fences,
            b"c",
            limit(2),
            100,
            0,
            0,
            at,
        ));
        assert_eq!(tokens(&store), vec![b"b".to_vec(), b"c".to_vec()]);
    }

    #[test]
    fn the_node_bound_caps_a_key_without_limit() {
        let (mut store, mut fences) = fixture();
        let rules = Rules {
            lock_delay_ms: 0,
            max_holders: 2,
        };
        let at = Now::same(us(T0));
        for t in [b"a", b"b"] {
            super::acquire(&mut store, &mut fences, t, SH, 100, 0, rules, at).unwrap();
        }
        let third = super::acquire(&mut store, &mut fences, b"c", SH, 100, 0, rules, at);
        assert_eq!(third, Ok(Acquired::Contended));
        let big = super::acquire(&mut store, &mut fences, b"c", limit(5), 100, 0, rules, at);
        assert_eq!(
            big,
            Err(LockError::LimitMismatch {
                held: None,
                asked: Some(5)
            })
        );
    }

    #[test]
    fn another_limit_is_refused_until_the_last_holder_goes_and_changes_nothing() {
        let (mut store, mut fences) = fixture();
        let at = Now::same(us(T0));
        granted(acquire(
            &mut store,
            &mut fences,
            b"a",
            limit(3),
            100,
            0,
            0,
            at,
        ));
        let hwm = fences.hwm();
        for (asked, mode) in [(Some(2), limit(2)), (None, SH)] {
            let got = acquire(&mut store, &mut fences, b"b", mode, 100, 0, 0, at);
            let want = LockError::LimitMismatch {
                held: Some(3),
                asked,
            };
            assert_eq!(got, Err(want.clone()));
            let text = want.to_string();
            assert!(text.contains("LIMIT 3"), "{text}");
        }
        // The holder itself asking another limit: refused too.
        let own = acquire(&mut store, &mut fences, b"a", limit(4), 100, 0, 0, at);
        assert!(matches!(own, Err(LockError::LimitMismatch { .. })));
        assert_eq!((tokens(&store), fences.hwm()), (vec![b"a".to_vec()], hwm));
        assert!(release(&mut store, b"a", T0 + 1));
        granted(acquire(
            &mut store,
            &mut fences,
            b"b",
            limit(2),
            100,
            0,
            0,
            at,
        ));
        assert_eq!(
            store.mode(),
            Some(limit(2)),
            "the next grant sets the limit"
        );
    }

    #[test]
    fn an_exclusive_holder_downgrades_in_place_and_there_is_no_upgrade() {
        let (mut store, mut fences) = fixture();
        let at = Now::same(us(T0));
        let f = granted(acquire(&mut store, &mut fences, b"a", EX, 100, 0, 0, at));
        let later = Now::same(us(T0 + 10));
        let down = acquire(&mut store, &mut fences, b"a", limit(2), 500, 0, 0, later);
        assert_eq!(down, Ok(Acquired::Renewed(f)), "it keeps its fence");
        assert_eq!(store.mode(), Some(limit(2)));
        assert_eq!(store.lock().unwrap().deadline_ms, T0 + 510);
        granted(acquire(
            &mut store,
            &mut fences,
            b"b",
            limit(2),
            100,
            0,
            0,
            later,
        ));
        let up = acquire(&mut store, &mut fences, b"a", EX, 100, 0, 0, later);
        assert_eq!(up, Err(LockError::NoUpgrade));
        assert!(up.unwrap_err().to_string().contains("no upgrade"));
        assert_eq!(store.mode(), Some(limit(2)), "refused, nothing changed");
        // A shared holder renews in its mode, keeping its fence.
        let again = acquire(&mut store, &mut fences, b"a", limit(2), 100, 0, 0, later);
        assert_eq!(again, Ok(Acquired::Renewed(f)));
    }

    #[test]
    fn each_holder_releases_extends_and_reads_its_own_fence() {
        let (mut store, mut fences) = fixture();
        let at = Now::same(us(T0));
        let a = granted(acquire(&mut store, &mut fences, b"a", SH, 100, 0, 0, at));
        let b = granted(acquire(&mut store, &mut fences, b"b", SH, 100, 0, 0, at));
        assert_eq!(fence(&store, Some(b"a"), T0), Some(a));
        assert_eq!(fence(&store, Some(b"b"), T0), Some(b));
        assert_eq!(fence(&store, Some(b"c"), T0), None);
        assert_eq!(fence(&store, None, T0), Some(b), "the newest holder's");
        assert_eq!(extend(&mut store, b"a", 1000, T0 + 50), Ok(true));
        assert_eq!(extend(&mut store, b"c", 1000, T0 + 50), Ok(false));
        assert!(!release(&mut store, b"c", T0 + 60));
        // b's lease ends at T0 + 100; a's, extended, at T0 + 1050.
        assert_eq!(fence(&store, None, T0 + 100), Some(a));
        assert!(!release(&mut store, b"b", T0 + 100), "b's lease ended");
        assert!(reclaim(&mut store, 0, T0 + 100));
        assert_eq!(tokens(&store), vec![b"a".to_vec()], "only the ended one");
        let held = store.lock().cloned().unwrap();
        assert!(!take_back(&mut store, held.fence, held.lease + 1, T0 + 200));
        assert!(take_back(&mut store, held.fence, held.lease, T0 + 200));
        assert_eq!(store.mode(), None, "the key goes with its last holder");
    }

    #[test]
    fn a_reader_that_ended_unreleased_holds_its_place_for_the_lock_delay() {
        let (mut store, mut fences) = fixture();
        let at = Now::same(us(T0));
        granted(acquire(
            &mut store,
            &mut fences,
            b"a",
            limit(1),
            10,
            0,
            40,
            at,
        ));
        // Ended at T0 + 10, held back until T0 + 50.
        let soon = Now::same(us(T0 + 20));
        let held = acquire(&mut store, &mut fences, b"b", limit(1), 10, 0, 40, soon);
        assert_eq!(held, Ok(Acquired::Contended));
        let w = acquire(&mut store, &mut fences, b"w", EX, 10, 0, 40, soon);
        assert_eq!(w, Ok(Acquired::Contended));
        let rules = Rules {
            lock_delay_ms: 40,
            max_holders: 100,
        };
        assert_eq!(
            fit(&store, b"b", limit(1), rules, T0 + 20),
            Ok(Fit::Busy(T0 + 50))
        );
        let after = Now::same(us(T0 + 50));
        granted(acquire(
            &mut store,
            &mut fences,
            b"b",
            limit(1),
            10,
            0,
            40,
            after,
        ));
        assert_eq!(tokens(&store), vec![b"b".to_vec()], "a's place is b's now");
    }
}
