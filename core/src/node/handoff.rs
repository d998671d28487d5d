//! Hand-offs: a waiter's turn ([`Node::take_turn`], the one decision for
//! one-key and multi-key waiters), and the lines served before a command
//! touches their key.

use std::hash::Hash;

use crate::error::LockError;
use crate::lock::{self, LockStore};
use crate::output::push_wake;
use crate::time::Now;
use crate::waiters::{Asked, Group, Head, Outcome, WaiterId};

use super::acquire::{fit_all, AllFit};
use super::{refuse_on_replica, Admission, Conditions, Node, Served};

impl<K: Hash + Ord + Clone, C: Hash + Eq + Ord + Copy> Node<K, C> {
    /// Looks at a multi-key waiter (`group`, waiter `id`) with all its keys
    /// open: granted every key with one fence when it is first in every
    /// line and every key is free for it (or renewed when it holds them
    /// all under one grant already); otherwise each key that holds it back
    /// is looked at again when that ends, and a key where it is not first
    /// yet brings it back when its turn comes there. Failed when a key
    /// left this node or holds another type, or when it may not take them
    /// now (the limits, its ACL on every key). True if it was answered.
    #[allow(clippy::too_many_arguments)] // one input per thing the call depends on
    pub(super) fn settle_group<S: LockStore, A: Admission<C>>(
        &mut self,
        id: WaiterId,
        group: Group<K, C>,
        stores: Result<&mut [S], LockError>,
        served: Served,
        cond: Conditions,
        admissions: &mut [A],
        now: Now,
    ) -> bool {
        let now_ms = now.mono_ms();
        let stores = match (served, stores) {
            (Served::Elsewhere(redirect), _) => {
                return self.answer(id, Outcome::Failed(LockError::Redirect(redirect)), now);
            }
            (Served::Here, Err(err)) => return self.answer(id, Outcome::Failed(err), now),
            (Served::Here, Ok(stores)) => stores,
        };
        if group.timeout_at_ms.is_some_and(|at| at <= now_ms) {
            return self.answer(id, Outcome::TimedOut, now);
        }
        if !group.first_everywhere {
            return false;
        }
        self.take_turn(id, &group.keys, stores, &group.asked, cond, admissions, now)
    }

    /// The turn of waiter `id`, first in the line of every key of `keys`
    /// (its one key, or a multi-key waiter's), each open: the one hand-off
    /// decision. Granted every key with one fence when each is free for it
    /// (or renewed when it holds them all under one grant already), the
    /// grants allowed now (the restart delay) and it may take them (the
    /// limits in force now, its ACL on every key): answered, true.
    /// Failed (answered, true) when it can never be served as it asked or
    /// may not take them now. Otherwise it stays first in line, and each key
    /// that holds it back is looked at again when that ends: false.
    #[allow(clippy::too_many_arguments)] // one input per thing the call depends on
    pub(super) fn take_turn<S: LockStore, A: Admission<C>>(
        &mut self,
        id: WaiterId,
        keys: &[K],
        stores: &mut [S],
        asked: &Asked<C>,
        cond: Conditions,
        admissions: &mut [A],
        now: Now,
    ) -> bool {
        let now_ms = now.mono_ms();
        let token = &*asked.token;
        let rules = self.limits.rules();
        let waiters = &mut self.waiters;
        let fits = fit_all(stores, token, asked.mode, rules, now_ms, |i, until| {
            waiters.reschedule(&keys[i], until);
        });
        let renews = match fits {
            Err(err) => return self.answer(id, Outcome::Failed(err), now),
            Ok(AllFit::Renews(fence)) => Some(fence),
            Ok(AllFit::Busy) => return false,
            Ok(AllFit::Fits) => {
                let paused = self.grants_paused_ms(now_ms);
                if paused > 0 {
                    self.waiters
                        .reschedule(&keys[0], now_ms.saturating_add(paused));
                    return false;
                }
                None
            }
        };
        let admitted = self
            .limits
            .check_turn(asked.ttl_ms, token, renews.is_some(), cond, || {
                admissions.iter_mut().all(|a| a.may_take(asked.client))
            });
        let (mode, ttl_ms, min_fence) = (asked.mode, asked.ttl_ms, asked.min_fence);
        let value = asked.value.as_deref();
        let taken = admitted.and_then(|()| match renews {
            Some(fence) => {
                let held = (fence, value);
                self.renew_all(keys, stores, token, mode, held, ttl_ms, min_fence, now)
            }
            None => self.grant_all(keys, stores, (token, value), mode, ttl_ms, min_fence, now),
        });
        let fence = match taken {
            Ok(fence) => fence,
            Err(err) => return self.answer(id, Outcome::Failed(err), now),
        };
        let mut leases = stores
            .iter()
            .map(|s| lock::holder_of(s, token, now_ms).map_or(0, |l| l.lease));
        let lease = leases.next().unwrap_or(0);
        let also = keys[1..].iter().cloned().zip(leases).collect();
        let outcome = Outcome::Granted {
            fence,
            lease,
            renewed: renews.is_some(),
        };
        if let Some(wake) = self.waiters.answer(id, outcome, also, now.mono_us) {
            push_wake(&mut self.outputs, &mut self.grant_tally, wake);
        }
        true
    }

    /// A multi-key waiter's answer, when it is not a grant.
    pub(super) fn answer(&mut self, id: WaiterId, outcome: Outcome, now: Now) -> bool {
        if let Some(wake) = self.waiters.answer(id, outcome, Vec::new(), now.mono_us) {
            push_wake(&mut self.outputs, &mut self.grant_tally, wake);
        }
        true
    }

    /// The keys a write command touches: refused on a replica first; a key
    /// of another type (WRONGTYPE) fails the command, and its whole line
    /// when the command named that key alone (a multi-key command's error
    /// names no key).
    pub(super) fn open_in_command<'s, S: LockStore>(
        &mut self,
        keys: &[K],
        stores: Result<&'s mut [S], LockError>,
        cond: Conditions,
        now: Now,
    ) -> Result<&'s mut [S], LockError> {
        refuse_on_replica(cond)?;
        stores.inspect_err(|err| {
            if let [key] = keys {
                self.fail_line(key, err, now);
            }
        })
    }

    /// Every waiter on `key` fails with `err`.
    pub(super) fn fail_line(&mut self, key: &K, err: &LockError, now: Now) {
        for wake in self.waiters.fail_all(key, err, now.mono_us) {
            push_wake(&mut self.outputs, &mut self.grant_tally, wake);
        }
    }

    /// Hands `key` on, as far as it goes now: the first in line takes it
    /// when its turn decides so ([`take_turn`](Self::take_turn)), then the
    /// next (readers go together while the key has room), until one is
    /// held back or the line is empty; a multi-key waiter first in line is
    /// marked for the timer, and the line waits behind it. Run before any
    /// command touches a key with waiters (the command's own key is served
    /// here, or Redis would have redirected it), and by the timer.
    #[inline] // nobody waiting: the common case, a look
    pub(super) fn hand_on_in_command<S: LockStore, A: Admission<C>>(
        &mut self,
        key: &K,
        store: &mut S,
        cond: Conditions,
        admission: &mut A,
        now: Now,
    ) {
        if self.waiters.waiting_on(key) > 0 {
            self.hand_on_line(key, store, cond, admission, now);
        }
    }

    /// [`hand_on_in_command`](Self::hand_on_in_command) of a key with a line.
    #[inline(never)]
    pub(super) fn hand_on_line<S: LockStore, A: Admission<C>>(
        &mut self,
        key: &K,
        store: &mut S,
        cond: Conditions,
        admission: &mut A,
        now: Now,
    ) {
        let (now_ms, now_us) = (now.mono_ms(), now.mono_us);
        loop {
            match self.waiters.head(key, now_ms, now_us) {
                Head::Empty | Head::Group => return,
                Head::TimedOut(wake) => push_wake(&mut self.outputs, &mut self.grant_tally, wake),
                Head::One(id, asked) => {
                    let keys = std::slice::from_ref(key);
                    let stores = std::slice::from_mut(store);
                    let admissions = std::slice::from_mut(admission);
                    if !self.take_turn(id, keys, stores, &asked, cond, admissions, now) {
                        return;
                    }
                }
            }
        }
    }
}
