//! The reference model: plain vectors, every rule written out longhand.

use std::collections::{BTreeMap, BTreeSet};

use super::ops::*;
use crate::error::{LockError, NotHeld};
use crate::limits::CLOCK_FENCES_FROM;
use crate::lock::Mode;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) token: Vec<u8>,
    /// The public value (empty: none); only a proclaim sets one.
    pub(super) value: Vec<u8>,
    pub(super) fence: i64,
    pub(super) deadline_ms: i64,
    pub(super) lease: u64,
}

/// A key's lock: its mode and its holders (live or ended), in grant order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RefLock {
    pub(super) mode: Mode,
    pub(super) holders: Vec<Held>,
}

/// Whether a request fits a key now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RefFit {
    Renews,
    Fits,
    Busy,
}

/// Whether a request fits every one of its keys now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AllFit {
    /// The token holds every key by one grant: its fence.
    Renews(i64),
    Fits,
    Busy,
}

#[derive(Debug, Clone)]
pub(super) struct RefWaiter {
    /// Arrival order (a multi-key waiter stands in several lines).
    pub(super) id: u64,
    /// Every key it waits for, in the order named (one for LOCK.ACQUIRE).
    pub(super) keys: Vec<u8>,
    pub(super) client: u8,
    pub(super) token: Vec<u8>,
    pub(super) mode: Mode,
    pub(super) ttl: i64,
    pub(super) min_fence: i64,
    pub(super) timeout_at: Option<i64>,
}

#[derive(Default)]
pub(super) struct Reference {
    pub(super) hwm: i64,
    /// Each gate's mark (by gate number).
    pub(super) gates: BTreeMap<u8, i64>,
    /// The node's first fence since it last started serving: clock fences
    /// below it pass no gate.
    pub(super) gate_floor: i64,
    pub(super) leases: u64,
    pub(super) locks: BTreeMap<u8, RefLock>,
    pub(super) lines: BTreeMap<u8, Vec<RefWaiter>>,
    pub(super) max_ttl: i64,
    pub(super) delay: i64,
    /// `lock.lock-delay-ms`.
    pub(super) lock_delay: i64,
    /// The longest `lock.lock-delay-ms` of the run (a lease filed under
    /// it may be looked at that late).
    pub(super) lock_delay_max: i64,
    pub(super) serving_since: i64,
    pub(super) replica: bool,
    pub(super) wrongtype: BTreeSet<u8>,
    pub(super) gone: BTreeSet<u8>,
    pub(super) denied: BTreeSet<u8>,
    pub(super) take_backs: Vec<(u8, i64, u64)>,
    /// The wall clock minus the monotonic one (ms): clock steps move it.
    pub(super) wall_offset: i64,
    pub(super) max_token_len: usize,
    /// `lock.max-waiters-per-key`.
    pub(super) max_line: usize,
    /// `lock.max-holders-per-key`.
    pub(super) max_holders: usize,
    pub(super) oom: bool,
    pub(super) evictable: bool,
    /// CLIENT PAUSE WRITE is in force.
    pub(super) writes_paused: bool,
    /// New holders so far (grants and hand-offs, not renewals).
    pub(super) grants: u64,
    /// The same by key (`LOCK.INFO`'s `grants`).
    pub(super) grants_by_key: BTreeMap<u8, u64>,
    /// A pause ended, and the node has not run its timer since: what it
    /// held back waits for that run (within `RETRY_MS`).
    pub(super) resume_pending: bool,
    /// Waiters so far (their ids).
    pub(super) arrivals: u64,
    /// Multi-key waiters a settle found first in a line, to look at.
    pub(super) marked: BTreeSet<u64>,
    /// Clients waiting to be told of a key's next leader (`LOCK.OBSERVE`).
    pub(super) observers: Vec<RefObserver>,
}

/// An observer: its key, the fence it saw (0: free) and that holder's
/// value when it came, its timeout.
#[derive(Debug, Clone)]
pub(super) struct RefObserver {
    pub(super) client: u8,
    pub(super) key: u8,
    pub(super) seen: (i64, Vec<u8>),
    pub(super) timeout_at: Option<i64>,
}

impl Reference {
    /// Why a new holder (a grant or a place in line, not a renewal) is
    /// refused now, if it is.
    pub(super) fn refuse_new_holder(&self, token: &[u8]) -> Option<LockError> {
        if token.len() > self.max_token_len {
            return Some(LockError::TokenOverLimit(token.len(), self.max_token_len));
        }
        if self.evictable {
            return Some(LockError::EvictionUnsafe);
        }
        self.oom.then_some(LockError::OutOfMemory)
    }

    pub(super) fn holders(&self, key: u8) -> &[Held] {
        self.locks.get(&key).map_or(&[], |l| &l.holders[..])
    }

    /// `token`'s holder of `key`, while its lease runs.
    pub(super) fn holder(&self, key: u8, token: &[u8], now: i64) -> Option<&Held> {
        self.holders(key)
            .iter()
            .find(|h| h.token == token && now < h.deadline_ms)
    }

    /// Someone holds `key` now.
    pub(super) fn held(&self, key: u8, now: i64) -> bool {
        self.holders(key).iter().any(|h| now < h.deadline_ms)
    }

    /// `LOCK.EXEC key token [FENCE fence]`'s check: the token's live
    /// holder, with exactly that fence when given.
    pub(super) fn exec(&self, key: u8, token: &[u8], fence: Option<i64>, now: i64) -> Told {
        if self.wrongtype.contains(&key) {
            return error(LockError::WrongType);
        }
        if self.replica {
            return error(LockError::ReadOnlyReplica);
        }
        match self.holder(key, token, now) {
            Some(h) => match fence {
                Some(given) if given != h.fence => error(LockError::NotHeld(NotHeld::OtherGrant {
                    held: h.fence,
                    given,
                })),
                _ => Told::Fence(h.fence),
            },
            None if self.held(key, now) => error(LockError::NotHeld(NotHeld::OtherToken)),
            None => Told::FreeOrEnded,
        }
    }

    /// `LOCK.FENCED gate fence`: the gate's rule, longhand.
    pub(super) fn fenced(&mut self, gate: u8, fence: i64) -> Told {
        if self.replica {
            return error(LockError::ReadOnlyReplica);
        }
        let mark = self.gates.get(&gate).copied();
        if self.evictable {
            return error(LockError::EvictionUnsafe);
        }
        if mark.is_none() && self.oom {
            return error(LockError::OutOfMemory);
        }
        if fence >= CLOCK_FENCES_FROM && fence < self.gate_floor {
            let mark = mark.unwrap_or(0).max(self.gate_floor);
            return error(LockError::StaleFence { fence, mark });
        }
        if let Some(mark) = mark.filter(|&m| fence < m) {
            return error(LockError::StaleFence { fence, mark });
        }
        self.gates
            .insert(gate, mark.map_or(fence, |m| m.max(fence)));
        Told::Passed
    }

    /// Holders that keep `key`: live, or ended unreleased within the
    /// lock-delay.
    pub(super) fn occupants(&self, key: u8, now: i64) -> usize {
        self.holders(key)
            .iter()
            .filter(|h| now < h.deadline_ms + self.lock_delay)
            .count()
    }

    /// Nobody holds `key`, but a lease that ended unreleased still holds
    /// it back (lock-delay).
    pub(super) fn delayed(&self, key: u8, now: i64) -> bool {
        !self.held(key, now) && self.occupants(key, now) > 0
    }

    /// How many may hold a key in `mode` at once.
    pub(super) fn capacity(&self, mode: Mode) -> usize {
        match mode {
            Mode::Exclusive => 1,
            Mode::Shared { limit: None } => self.max_holders,
            Mode::Shared { limit: Some(n) } => (n as usize).min(self.max_holders),
        }
    }

    /// Whether `token` asking for `key` in `mode` fits it now: its own
    /// holding renews (an exclusive holder asking SHARED downgrades); a
    /// shared holder asking exclusive, or another limit than the key's, is
    /// an error; readers share a key up to its capacity; anything else
    /// waits for the key to empty.
    pub(super) fn fit(
        &self,
        key: u8,
        token: &[u8],
        mode: Mode,
        now: i64,
    ) -> Result<RefFit, LockError> {
        let occupants = self.occupants(key, now);
        let Some(lock) = self.locks.get(&key).filter(|_| occupants > 0) else {
            return Ok(RefFit::Fits);
        };
        let own = self.holder(key, token, now).is_some();
        match (lock.mode, mode) {
            (Mode::Exclusive, _) if own => Ok(RefFit::Renews),
            (Mode::Exclusive, _) => Ok(RefFit::Busy),
            (Mode::Shared { .. }, Mode::Exclusive) if own => Err(LockError::NoUpgrade),
            (Mode::Shared { .. }, Mode::Exclusive) => Ok(RefFit::Busy),
            (Mode::Shared { limit: held }, Mode::Shared { limit: asked }) if held != asked => {
                Err(LockError::LimitMismatch { held, asked })
            }
            _ if own => Ok(RefFit::Renews),
            _ if occupants < self.capacity(mode) => Ok(RefFit::Fits),
            _ => Ok(RefFit::Busy),
        }
    }

    /// Removes `token`'s holder of `key`; the key goes with its last.
    pub(super) fn remove_holder(&mut self, key: u8, token: &[u8]) {
        if let Some(lock) = self.locks.get_mut(&key) {
            lock.holders.retain(|h| h.token != token);
            if lock.holders.is_empty() {
                self.locks.remove(&key);
            }
        }
    }

    /// A command that touches a key reclaims its holders whose lease and
    /// lock-delay have both passed (the node's release and extend do).
    pub(super) fn reclaim_touched(&mut self, key: u8, now: i64) {
        let delay = self.lock_delay;
        if let Some(lock) = self.locks.get_mut(&key) {
            lock.holders.retain(|h| now < h.deadline_ms + delay);
            if lock.holders.is_empty() {
                self.locks.remove(&key);
            }
        }
    }

    /// The timer reclaimed ended locks nobody touched (the node files
    /// every lease by its end): each holder here whose lease and lock-delay
    /// have passed and that the node no longer has (`node_has(key, token)`)
    /// is gone here too. Which run within a lease's slot reclaims it is the
    /// node's; that one does is checked by the run (`lease_ends_kept`).
    pub(super) fn follow_timer_reclaims(&mut self, now: i64, node_has: impl Fn(u8, &[u8]) -> bool) {
        let delay = self.lock_delay;
        for (key, lock) in self.locks.iter_mut() {
            lock.holders
                .retain(|h| now < h.deadline_ms + delay || node_has(*key, &h.token));
        }
        self.locks.retain(|_, lock| !lock.holders.is_empty());
    }

    pub(super) fn paused(&self, now: i64) -> i64 {
        if self.delay == 0 {
            return 0;
        }
        (self.serving_since + self.delay - now).max(0)
    }

    pub(super) fn fresh_fence(&mut self, min_fence: i64, now: i64) -> i64 {
        self.hwm = (self.hwm + 1)
            .max(min_fence)
            .max((now + self.wall_offset) * 1000);
        self.hwm
    }

    /// A holder's fence after a renewal asking MINFENCE `min_fence`: a
    /// raised holder gets one above the mark and MINFENCE, not moved to
    /// the clock; otherwise it keeps `held`.
    pub(super) fn raised_fence(&mut self, min_fence: i64, held: i64) -> i64 {
        if min_fence <= held {
            return held;
        }
        self.hwm = (self.hwm + 1).max(min_fence);
        self.hwm
    }

    /// Why a waiter whose turn has come may not take its lock(s), if it
    /// may not: the limits now (unless it renews) and its ACL.
    pub(super) fn refuse_turn(&self, w: &RefWaiter, renews: bool) -> Option<LockError> {
        if w.ttl > self.max_ttl {
            return Some(LockError::TtlTooLarge(format!("'{}'", w.ttl), self.max_ttl));
        }
        if let Some(err) = (!renews)
            .then(|| self.refuse_new_holder(&w.token))
            .flatten()
        {
            return Some(err);
        }
        self.denied
            .contains(&w.client)
            .then_some(LockError::NoPermission)
    }

    /// Grants or renews: the request fits the key (checked by the caller).
    pub(super) fn grant(
        &mut self,
        key: u8,
        token: &[u8],
        mode: Mode,
        ttl: i64,
        min_fence: i64,
        now: i64,
    ) -> i64 {
        match self.holder(key, token, now).map(|h| h.fence) {
            Some(held) => {
                let fence = self.raised_fence(min_fence, held);
                self.renew_holder(key, token, mode, fence, ttl, now);
                fence
            }
            None => self.grant_all(&[key], token, mode, ttl, min_fence, now),
        }
    }

    /// `token`'s live holder of `key` gets a new lease and `fence`; asking
    /// SHARED of a key it holds exclusively downgrades it.
    pub(super) fn renew_holder(
        &mut self,
        key: u8,
        token: &[u8],
        mode: Mode,
        fence: i64,
        ttl: i64,
        now: i64,
    ) {
        self.leases += 1;
        let lease = self.leases;
        let lock = self.locks.get_mut(&key).unwrap();
        if lock.mode == Mode::Exclusive && mode != Mode::Exclusive {
            lock.mode = mode; // a downgrade
        }
        let h = lock.holders.iter_mut().find(|h| h.token == token).unwrap();
        assert!(now < h.deadline_ms, "renewing an ended holder");
        h.fence = fence;
        h.deadline_ms = now + ttl;
        h.lease = lease;
    }

    /// A new holder of `key` (it fits): the only one, or one more reader,
    /// for whom holders past their lock-delay go first; the same token
    /// ended unreleased is granted again in its place.
    pub(super) fn add_holder(
        &mut self,
        key: u8,
        token: &[u8],
        mode: Mode,
        fence: i64,
        ttl: i64,
        now: i64,
    ) {
        self.leases += 1;
        self.grants += 1;
        *self.grants_by_key.entry(key).or_default() += 1;
        let h = Held {
            token: token.to_vec(),
            value: Vec::new(),
            fence,
            deadline_ms: now + ttl,
            lease: self.leases,
        };
        if mode == Mode::Exclusive || self.occupants(key, now) == 0 {
            let holders = vec![h];
            self.locks.insert(key, RefLock { mode, holders });
            return;
        }
        self.reclaim_touched(key, now);
        let lock = self.locks.get_mut(&key).unwrap();
        match lock.holders.iter_mut().find(|x| x.token == token) {
            Some(x) => *x = h,
            None => lock.holders.push(h),
        }
    }

    /// Hands `key` on as far as it goes now.
    pub(super) fn settle(&mut self, key: u8, now: i64, told: &mut Vec<(u8, Told)>) {
        if self.replica {
            return;
        }
        let fail_all = if self.gone.contains(&key) {
            Some(LockError::Redirect(redirect_of(key)))
        } else if self.wrongtype.contains(&key) {
            Some(LockError::WrongType)
        } else {
            None
        };
        loop {
            let Some(front) = self.lines.get(&key).and_then(|l| l.first()).cloned() else {
                return;
            };
            let answer = |this: &mut Self, told: &mut Vec<(u8, Told)>, t: Told| {
                this.remove_waiter(front.id);
                told.push((front.client, t));
            };
            if let Some(err) = &fail_all {
                answer(self, told, error(err.clone()));
                continue;
            }
            if front.timeout_at.is_some_and(|t| t <= now) {
                answer(self, told, Told::Nil);
                continue;
            }
            if front.keys.len() > 1 {
                self.marked.insert(front.id); // see settle_groups
                return;
            }
            let renews = match self.fit(key, &front.token, front.mode, now) {
                Err(err) => {
                    answer(self, told, error(err));
                    continue;
                }
                Ok(RefFit::Busy) => return,
                Ok(RefFit::Fits) if self.paused(now) > 0 => return,
                Ok(RefFit::Fits) => false,
                Ok(RefFit::Renews) => true,
            };
            if let Some(err) = self.refuse_turn(&front, renews) {
                answer(self, told, error(err));
                continue;
            }
            self.lines.get_mut(&key).unwrap().remove(0);
            let (token, mode) = (&front.token, front.mode);
            let fence = self.grant(key, token, mode, front.ttl, front.min_fence, now);
            told.push((front.client, Told::Fence(fence)));
        }
    }

    pub(super) fn has_line(&self, key: u8) -> bool {
        self.lines.get(&key).is_some_and(|l| !l.is_empty())
    }

    pub(super) fn remove_waiter(&mut self, id: u64) {
        self.marked.remove(&id);
        for line in self.lines.values_mut() {
            line.retain(|w| w.id != id);
        }
        self.lines.retain(|_, l| !l.is_empty());
    }

    pub(super) fn first_everywhere(&self, w: &RefWaiter) -> bool {
        w.keys.iter().all(|k| {
            self.lines
                .get(k)
                .and_then(|l| l.first())
                .is_some_and(|f| f.id == w.id)
        })
    }

    /// `token` asking for every key of `keys` in `mode`: the first error in
    /// the order named; a renewal when it holds them all by one grant; a
    /// new holder when every key fits one; else busy (a key it holds apart
    /// from the others included).
    pub(super) fn fit_all(
        &self,
        keys: &[u8],
        token: &[u8],
        mode: Mode,
        now: i64,
    ) -> Result<AllFit, LockError> {
        let fits = keys
            .iter()
            .map(|&k| self.fit(k, token, mode, now))
            .collect::<Result<Vec<_>, _>>()?;
        let fences: BTreeSet<Option<i64>> = keys
            .iter()
            .map(|&k| self.holder(k, token, now).map(|h| h.fence))
            .collect();
        if fits.iter().all(|f| *f == RefFit::Renews) && fences.len() == 1 {
            return Ok(AllFit::Renews(fences.into_iter().flatten().next().unwrap()));
        }
        Ok(match fits.iter().all(|f| *f == RefFit::Fits) {
            true => AllFit::Fits,
            false => AllFit::Busy,
        })
    }

    /// Every key of `keys` to `token` in `mode` with one fence (each fits).
    pub(super) fn grant_all(
        &mut self,
        keys: &[u8],
        token: &[u8],
        mode: Mode,
        ttl: i64,
        min_fence: i64,
        now: i64,
    ) -> i64 {
        let fence = self.fresh_fence(min_fence, now);
        for &key in keys {
            self.add_holder(key, token, mode, fence, ttl, now);
        }
        fence
    }

    /// Renews every key `token` holds by the grant `fence` (raised above
    /// MINFENCE if asked; downgraded when it asks SHARED).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn renew_all(
        &mut self,
        keys: &[u8],
        token: &[u8],
        mode: Mode,
        fence: i64,
        ttl: i64,
        min_fence: i64,
        now: i64,
    ) -> i64 {
        let fence = self.raised_fence(min_fence, fence);
        for &key in keys {
            self.renew_holder(key, token, mode, fence, ttl, now);
        }
        fence
    }

    /// The marked multi-key waiters, in arrival order: one first in every
    /// line whose keys are all free for it (held by nobody else, not held
    /// back) is granted them all. Answering one marks the multi-key
    /// waiters that arrived after it and are now first where it was.
    pub(super) fn settle_groups(&mut self, now: i64, told: &mut Vec<(u8, Told)>) {
        let mut work = std::mem::take(&mut self.marked);
        while let Some(id) = work.pop_first() {
            let Some(g) = self.lines.values().flatten().find(|w| w.id == id).cloned() else {
                continue;
            };
            if self.settle_group(&g, now, told) {
                for k in &g.keys {
                    let front = self.lines.get(k).and_then(|l| l.first());
                    if let Some(f) = front.filter(|f| f.keys.len() > 1 && f.id > id) {
                        work.insert(f.id);
                    }
                }
            }
        }
    }

    /// One multi-key waiter looked at; true if it was answered.
    pub(super) fn settle_group(
        &mut self,
        g: &RefWaiter,
        now: i64,
        told: &mut Vec<(u8, Told)>,
    ) -> bool {
        let mut answer = |this: &mut Self, t: Told| {
            this.remove_waiter(g.id);
            told.push((g.client, t));
            true
        };
        if let Some(&k) = g.keys.iter().find(|k| self.gone.contains(k)) {
            return answer(self, error(LockError::Redirect(redirect_of(k))));
        }
        if g.keys.iter().any(|k| self.wrongtype.contains(k)) {
            return answer(self, error(LockError::WrongType));
        }
        if g.timeout_at.is_some_and(|t| t <= now) {
            return answer(self, Told::Nil);
        }
        if !self.first_everywhere(g) {
            return false;
        }
        let renews = match self.fit_all(&g.keys, &g.token, g.mode, now) {
            Err(err) => return answer(self, error(err)),
            Ok(AllFit::Busy) => return false,
            Ok(AllFit::Fits) if self.paused(now) > 0 => return false,
            Ok(AllFit::Fits) => None,
            Ok(AllFit::Renews(fence)) => Some(fence),
        };
        let refused = self.refuse_turn(g, renews.is_some());
        let (keys, token, mode) = (&g.keys, &g.token, g.mode);
        let t = match (refused, renews) {
            (Some(err), _) => error(err),
            (None, Some(fence)) => {
                Told::Fence(self.renew_all(keys, token, mode, fence, g.ttl, g.min_fence, now))
            }
            (None, None) => Told::Fence(self.grant_all(keys, token, mode, g.ttl, g.min_fence, now)),
        };
        answer(self, t)
    }

    /// The key's line has a multi-key waiter first that cannot be granted
    /// now (another of its keys is held, held back, or has others first).
    pub(super) fn group_waits(&self, key: u8, now: i64) -> bool {
        let Some(g) = self.lines.get(&key).and_then(|l| l.first()) else {
            return false;
        };
        g.keys.len() > 1
            && (!self.first_everywhere(g)
                || !matches!(
                    self.fit_all(&g.keys, &g.token, g.mode, now),
                    Ok(AllFit::Fits | AllFit::Renews(_))
                ))
    }

    /// The timer at `now`: take-backs, timeouts, then every key; the keys
    /// taken back. `node_ran`: the node's timer ran now (after a pause,
    /// what it held back goes at that run).
    pub(super) fn tick(&mut self, now: i64, node_ran: bool, told: &mut Vec<(u8, Told)>) -> Vec<u8> {
        if self.replica {
            self.take_backs.clear();
        }
        if node_ran {
            self.resume_pending = false;
        }
        let held_back = self.writes_paused || self.resume_pending;
        let mut taken_back = Vec::new();
        if !held_back {
            for (key, fence, lease) in std::mem::take(&mut self.take_backs) {
                let same = self
                    .holders(key)
                    .iter()
                    .find(|h| now < h.deadline_ms && h.fence == fence && h.lease == lease)
                    .map(|h| h.token.clone());
                if let Some(token) = same {
                    self.remove_holder(key, &token);
                    taken_back.push(key);
                }
            }
        }
        let mut timed_out: Vec<(u64, u8)> = self
            .lines
            .values()
            .flatten()
            .filter(|w| w.timeout_at.is_some_and(|t| t <= now))
            .map(|w| (w.id, w.client))
            .collect();
        timed_out.sort();
        timed_out.dedup();
        for (id, client) in timed_out {
            self.remove_waiter(id);
            told.push((client, Told::Nil));
        }
        if !held_back {
            // Until nothing more is answered (an answered multi-key waiter
            // lets the lines behind it move).
            loop {
                let before = told.len();
                for key in 0..KEYS {
                    self.settle(key, now, told);
                }
                self.settle_groups(now, told);
                if told.len() == before {
                    break;
                }
            }
        }
        self.tell_observers(now, told);
        taken_back
    }

    pub(super) fn waiting(&self, client: u8) -> bool {
        self.lines.values().flatten().any(|w| w.client == client)
            || self.observers.iter().any(|o| o.client == client)
    }

    /// The fence of `key`'s leader now: its newest live holder's (0: none).
    pub(super) fn leader(&self, key: u8, now: i64) -> i64 {
        self.leader_told(key, now).0
    }

    /// `key`'s leader now as an observer is told it: its newest live
    /// holder's fence and value (0 and none: vacant).
    pub(super) fn leader_told(&self, key: u8, now: i64) -> (i64, Vec<u8>) {
        if self.wrongtype.contains(&key) {
            return (0, Vec::new());
        }
        self.holders(key)
            .iter()
            .filter(|h| now < h.deadline_ms)
            .max_by_key(|h| h.fence)
            .map_or((0, Vec::new()), |h| (h.fence, h.value.clone()))
    }

    /// `token`'s live holder of exclusive `key`, just renewed (its new
    /// lease id given), proclaims `value` (its observers see a new value
    /// at the next tick). True if the value changed.
    pub(super) fn proclaim(&mut self, key: u8, token: &[u8], value: &[u8]) -> bool {
        let lock = self.locks.get_mut(&key).unwrap();
        let h = lock.holders.iter_mut().find(|h| h.token == token).unwrap();
        if h.value == value {
            return false;
        }
        h.value = value.to_vec();
        true
    }

    /// `LOCK.OBSERVE key [AFTER after [VALUE value]] [BLOCK block]`.
    pub(super) fn observe(
        &mut self,
        client: u8,
        key: u8,
        after: Option<i64>,
        value: Option<&[u8]>,
        block: Option<i64>,
        now: i64,
    ) -> Told {
        if self.wrongtype.contains(&key) {
            return error(LockError::WrongType);
        }
        let leader = self.leader_told(key, now);
        // What the client saw: AFTER's fence, with the value it names (else
        // the holder's value now; a free key has none).
        let seen = after.map(|a| match (value, a == leader.0) {
            (Some(v), _) => (a, v.to_vec()),
            (None, true) => (a, leader.1.clone()),
            (None, false) => (a, Vec::new()),
        });
        match (seen, block) {
            (Some(seen), Some(b)) if seen == leader => {
                self.observers.push(RefObserver {
                    client,
                    key,
                    seen,
                    timeout_at: (b > 0).then_some(now + b),
                });
                Told::Blocked
            }
            (Some(seen), None) if seen == leader => Told::Nil,
            _ => Told::Leader(leader.0, leader.1),
        }
    }

    /// The observers' part of a timer tick: timeouts, then every observer
    /// whose key's leader is no longer the one it saw (or whose key left).
    pub(super) fn tell_observers(&mut self, now: i64, told: &mut Vec<(u8, Told)>) {
        for o in std::mem::take(&mut self.observers) {
            if o.timeout_at.is_some_and(|t| t <= now) {
                told.push((o.client, Told::Nil));
            } else if self.gone.contains(&o.key) {
                told.push((o.client, error(LockError::Redirect(redirect_of(o.key)))));
            } else if self.leader_told(o.key, now) != o.seen {
                // Its user lost the key (ACL SETUSER) while it observed.
                if self.denied.contains(&o.client) {
                    told.push((o.client, error(LockError::NoReadPermission)));
                } else {
                    let (fence, value) = self.leader_told(o.key, now);
                    told.push((o.client, Told::Leader(fence, value)));
                }
            } else {
                self.observers.push(o);
            }
        }
    }

    /// `told`: the waiters this command's key hands on to first. Usually
    /// none (the timer settled the key already), but a hand-off a write
    /// pause held back goes at the first command on its key after the
    /// pause, if that comes before the node's timer runs.
    pub(super) fn acquire(
        &mut self,
        client: u8,
        key: u8,
        r: &Request,
        now: i64,
        told: &mut Vec<(u8, Told)>,
    ) -> Told {
        if self.replica {
            return error(LockError::ReadOnlyReplica);
        }
        let mut settled = Vec::new();
        self.settle(key, now, &mut settled);
        assert!(
            settled.is_empty() || self.resume_pending,
            "the timer settled this key already"
        );
        told.extend(settled);
        if self.wrongtype.contains(&key) {
            return error(LockError::WrongType);
        }
        // One key is the one-key case of ACQUIREALL, as in the node.
        self.acquire_all(client, &[key], r, now, told)
    }

    /// `LOCK.ACQUIREALL`: every key or none; with BLOCK, a place in every
    /// key's line.
    pub(super) fn acquire_all(
        &mut self,
        client: u8,
        keys: &[u8],
        r: &Request,
        now: i64,
        told: &mut Vec<(u8, Told)>,
    ) -> Told {
        if self.replica {
            return error(LockError::ReadOnlyReplica);
        }
        for &key in keys {
            let mut settled = Vec::new();
            self.settle(key, now, &mut settled);
            assert!(
                settled.is_empty() || self.resume_pending,
                "the timer settled this key already"
            );
            told.extend(settled);
        }
        let fits = match self.fit_all(keys, &r.token, r.mode, now) {
            Err(err) => return error(err),
            Ok(AllFit::Renews(fence)) => {
                let (token, mode) = (&r.token, r.mode);
                return Told::Fence(self.renew_all(
                    keys,
                    token,
                    mode,
                    fence,
                    r.ttl,
                    r.min_fence,
                    now,
                ));
            }
            Ok(fits) => fits,
        };
        let busy = fits == AllFit::Busy || keys.iter().any(|&k| self.has_line(k));
        if busy && r.block.is_none() {
            return Told::Nil;
        }
        if let Some(err) = self.refuse_new_holder(&r.token) {
            return error(err);
        }
        if busy || self.paused(now) > 0 {
            return match r.block {
                Some(timeout) => self.enqueue(client, keys, r, timeout, now),
                None => error(LockError::GrantsPaused(self.paused(now))),
            };
        }
        Told::Fence(self.grant_all(keys, &r.token, r.mode, r.ttl, r.min_fence, now))
    }

    pub(super) fn enqueue(
        &mut self,
        client: u8,
        keys: &[u8],
        r: &Request,
        timeout: i64,
        now: i64,
    ) -> Told {
        // A full line refuses; a lower limit leaves those already in line.
        if keys
            .iter()
            .any(|k| self.lines.get(k).map_or(0, Vec::len) >= self.max_line)
        {
            return error(LockError::TooManyWaiters(self.max_line as i64));
        }
        self.arrivals += 1;
        let w = RefWaiter {
            id: self.arrivals,
            keys: keys.to_vec(),
            client,
            token: r.token.clone(),
            mode: r.mode,
            ttl: r.ttl,
            min_fence: r.min_fence,
            timeout_at: (timeout > 0).then_some(now + timeout),
        };
        for &key in keys {
            self.lines.entry(key).or_default().push(w.clone());
        }
        Told::Blocked
    }
}

pub(super) fn redirect_of(key: u8) -> String {
    format!("MOVED {key} 127.0.0.1:7001")
}

pub(super) struct Request {
    pub(super) token: Vec<u8>,
    pub(super) mode: Mode,
    pub(super) ttl: i64,
    pub(super) block: Option<i64>,
    pub(super) min_fence: i64,
}
