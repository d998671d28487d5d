//! What commands read without changing a lock: `LOCK.FENCE`, `LOCK.EXEC`'s
//! check, `LOCK.INFO`.

use std::hash::Hash;

use super::{refuse_on_replica, Conditions, Node};
use crate::error::{LockError, NotHeld};
use crate::lock::{self, Lock, LockRead, Mode};

/// A key's lock as `LOCK.INFO` shows it ([`Node::info`]).
#[derive(Debug)]
pub struct Held<'s> {
    /// Exclusive, or shared (with its limit).
    pub mode: Mode,
    /// Its holders whose lease has not ended, in the order the key keeps.
    pub live: Vec<Lock<'s>>,
    /// Which of `live` was granted last (the highest fence).
    pub newest: usize,
    /// How many wait in its line.
    pub waiters: usize,
    /// How long the first in line has waited, ms (None: nobody waits).
    pub longest_wait_ms: Option<i64>,
    /// The grants the key has had here since the node started, whether
    /// its lock was freed between them or not: never fewer than the truth,
    /// more only where other keys share its cells (`grant_tally`).
    pub grants: u64,
}

impl<K: Hash + Ord + Clone, C: Hash + Eq + Ord + Copy> Node<K, C> {
    // ---- reads ----

    /// `LOCK.FENCE key [token]`: the holder's fencing token (only if it is
    /// `token`, when given), or None when the lock is free or ended.
    pub fn fence_of(
        &self,
        store: &impl LockRead,
        token: Option<&[u8]>,
        now_ms: i64,
    ) -> Option<i64> {
        lock::fence(store, token, now_ms)
    }

    /// `LOCK.EXEC key token [FENCE fence]`: the grant's fence if `token`
    /// holds the key's lock now (with exactly `fence`, when given), or why
    /// not. Reads only: an ended lease is the sweep's and the timer's to
    /// reclaim, so the guarded command changes nothing but its own effect.
    /// A replica refuses (also with `replica-read-only no`): its copy of
    /// the lease is its master's as last replicated, and a write there
    /// would be the replica's alone.
    pub fn check_holder(
        &self,
        store: &impl LockRead,
        token: &[u8],
        fence: Option<i64>,
        cond: Conditions,
        now_ms: i64,
    ) -> Result<i64, LockError> {
        refuse_on_replica(cond)?;
        let why = match lock::holders(store).find(|l| l.token == token) {
            None if lock::is_held(store, now_ms) => NotHeld::OtherToken,
            None => NotHeld::Free,
            Some(l) if !l.is_live(now_ms) => NotHeld::Ended,
            Some(l) => match fence {
                Some(given) if given != l.fence => NotHeld::OtherGrant {
                    held: l.fence,
                    given,
                },
                _ => return Ok(l.fence),
            },
        };
        Err(LockError::NotHeld(why))
    }

    /// `LOCK.INFO key`: what is held now, or None when nobody holds it.
    pub fn info<'s>(&self, key: &K, store: &'s impl LockRead, now_ms: i64) -> Option<Held<'s>> {
        let live: Vec<Lock<'s>> = lock::holders(store).filter(|l| l.is_live(now_ms)).collect();
        let newest = (0..live.len()).max_by_key(|&i| live[i].fence)?;
        Some(Held {
            mode: store.mode().unwrap_or(Mode::Exclusive),
            live,
            newest,
            waiters: self.waiters.waiting_on(key),
            longest_wait_ms: self
                .waiters
                .first_since_us(key)
                .map(|since_us| (now_ms.saturating_mul(1000) - since_us).max(0) / 1000),
            grants: self.grant_tally.grants(key),
        })
    }

    /// A page of `LOCK.SCAN`: the keys the lease index holds from the
    /// cursor `from` on (0: the start), `count` entries at most,
    /// each key once, with the cursor to go on from (0: done). The keys are
    /// candidates: the caller reads each ([`Node::info`]), for an entry may
    /// be a lock released, ended or gone since it was filed. Every lock
    /// filed from the first page to the last is in some page (see
    /// `LeaseEnds::scan`), so every lock held throughout a scan is listed.
    pub fn scan_locks(&self, from: i64, count: usize) -> (Vec<K>, i64) {
        self.lease_ends.scan(from, count)
    }
}
