//! What a holder asks of its locks: `LOCK.RELEASE`, `LOCK.RELEASEALL`,
//! `LOCK.EXTEND`; and ended leases reclaimed when a key is touched.

use std::hash::Hash;

use super::{acts_alone, Admission, Conditions, Node};
use crate::error::LockError;
use crate::lock::{self, LockRead, LockStore, Mode};
use crate::output::{Event, Output, Stat};
use crate::time::Now;

impl<K: Hash + Ord + Clone, C: Hash + Eq + Ord + Copy> Node<K, C> {
    /// `LOCK.RELEASE`: true when `token` held the lock; the next waiter is
    /// then handed it in this same call.
    pub fn release<S: LockStore>(
        &mut self,
        key: &K,
        store: Result<&mut S, LockError>,
        token: &[u8],
        cond: Conditions,
        admission: &mut impl Admission<C>,
        now: Now,
    ) -> Result<bool, LockError> {
        let store = store.map(std::slice::from_mut);
        let [store] = self.open_in_command(std::slice::from_ref(key), store, cond, now)? else {
            unreachable!("one key, one store")
        };
        self.hand_on_in_command(key, store, cond, admission, now);
        let now_ms = now.mono_ms();
        let mut ledger = self.ledger(key, store, now_ms);
        let released = lock::release(&mut ledger, token, now_ms);
        if released {
            self.outputs.push_back(Output::Count(Stat::Release));
            self.outputs.event(key, Event::Release);
        }
        // Ended leases still stored (another holder's, on a shared key)
        // are reclaimed when touched.
        let delay = self.limits.lock_delay_ms;
        let reclaimed = lock::reclaim(&mut self.ledger(key, store, now_ms), delay, now_ms);
        if released || reclaimed {
            self.hand_on_in_command(key, store, cond, admission, now);
        }
        Ok(released)
    }

    /// `LOCK.RELEASEALL`: each key of `keys` released as by
    /// [`release`](Self::release) (`stores[i]` and `admissions[i]` are
    /// `keys[i]`'s, all opened before anything changes); how many it
    /// released.
    pub fn release_all<S: LockStore, A: Admission<C>>(
        &mut self,
        keys: &[K],
        stores: &mut [S],
        token: &[u8],
        cond: Conditions,
        admissions: &mut [A],
        now: Now,
    ) -> Result<i64, LockError> {
        let mut released = 0;
        for ((key, store), admission) in keys.iter().zip(stores).zip(admissions) {
            released += i64::from(self.release(key, Ok(store), token, cond, admission, now)?);
        }
        Ok(released)
    }

    /// `LOCK.EXTEND key token ttl-ms [VALUE v]`: true when `token` holds the
    /// lock; its lease then ends `ttl_ms` from now, and with `value` (an
    /// exclusive holder's) that is its public value from now on (a
    /// proclaim: the key's observers are told). An ended lease is never
    /// revived.
    #[allow(clippy::too_many_arguments)] // one input per thing the call depends on
    pub fn extend<S: LockStore>(
        &mut self,
        key: &K,
        store: Result<&mut S, LockError>,
        (token, value): (&[u8], Option<&[u8]>),
        ttl_ms: i64,
        cond: Conditions,
        admission: &mut impl Admission<C>,
        now: Now,
    ) -> Result<bool, LockError> {
        self.limits.check_ttl(ttl_ms)?;
        self.limits.check_value(value)?;
        let store = store.map(std::slice::from_mut);
        let [store] = self.open_in_command(std::slice::from_ref(key), store, cond, now)? else {
            unreachable!("one key, one store")
        };
        self.hand_on_in_command(key, store, cond, admission, now);
        let now_ms = now.mono_ms();
        let held = lock::holder_of(&*store, token, now_ms);
        let proclaims = match (value, held) {
            (Some(_), Some(_)) if store.mode() != Some(Mode::Exclusive) => {
                return Err(LockError::ValueShared)
            }
            (Some(v), Some(h)) => h.value != v,
            _ => false,
        };
        let extended = match proclaims {
            true => {
                let deadline_ms = lock::deadline(now_ms, ttl_ms)?;
                let mut ledger = self.ledger(key, store, now_ms);
                let mode = Mode::Exclusive;
                lock::renew_holder(&mut ledger, token, mode, None, value, deadline_ms, now_ms)?;
                true
            }
            false => lock::extend(&mut self.ledger(key, store, now_ms), token, ttl_ms, now_ms)?,
        };
        let delay = self.limits.lock_delay_ms;
        if extended {
            self.outputs.push_back(Output::Count(Stat::Extend));
            self.outputs.event(key, Event::Extend);
            self.waiters.schedule(key, now_ms.saturating_add(ttl_ms));
            // An exclusive key just extended has no ended lease to reclaim.
            if store.mode() == Some(Mode::Exclusive) {
                return Ok(true);
            }
        }
        // Ended leases still stored (another holder's, on a shared key)
        // are reclaimed when touched.
        if lock::reclaim(&mut self.ledger(key, store, now_ms), delay, now_ms) {
            self.hand_on_in_command(key, store, cond, admission, now);
        }
        Ok(extended)
    }

    /// Whether the key has a holder whose lease ended: the sweep opens it
    /// for [`Node::reclaim`] then (a read, from its scan, where nothing may
    /// be written).
    pub fn needs_reclaim(&self, store: &impl LockRead, now_ms: i64) -> bool {
        lock::holders(store).any(|l| !l.is_live(now_ms))
    }

    /// The sweep found `key` held: filed by its earliest live lease's end,
    /// so a lock the index does not know (renamed, moved or copied to this
    /// name) is listed by `LOCK.SCAN` and reclaimed on time from then on.
    /// A key filed already gets a second entry, which leaves when it comes
    /// due (at most the look-ahead later).
    pub fn found_held(&mut self, key: &K, store: &impl LockRead, now_ms: i64) {
        let live = lock::holders(store).filter(|l| l.is_live(now_ms));
        if let Some(end) = live.map(|l| l.deadline_ms).min() {
            self.lease_ends.file_lease(key, end, now_ms);
        }
    }

    /// The background sweep (or any caller) found `key`'s lock: reclaim it
    /// if its lease has ended, and hand the key on if anyone waits. True if
    /// it was reclaimed.
    pub fn reclaim<S: LockStore>(
        &mut self,
        key: &K,
        store: &mut S,
        cond: Conditions,
        admission: &mut impl Admission<C>,
        now: Now,
    ) -> bool {
        if !acts_alone(cond) {
            return false; // the master reclaims; or later
        }
        let now_ms = now.mono_ms();
        let delay = self.limits.lock_delay_ms;
        let reclaimed = lock::reclaim(&mut self.ledger(key, store, now_ms), delay, now_ms);
        if reclaimed {
            self.hand_on_in_command(key, store, cond, admission, now);
        }
        reclaimed
    }
}
