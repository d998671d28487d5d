//! `LOCK.OBSERVE key [AFTER fence [VALUE v]] [BLOCK ms]`: a key's leader, and
//! observers told when it is no longer the one they saw: a new holder, a
//! release, a lease that ended (told at its end, whether or not a command
//! touches the key). Observers only read, so they are served on a replica
//! and while writes wait too.

use std::hash::Hash;

use super::{Admission, Conditions, Node, Served, TimerKeys};
use crate::error::LockError;
use crate::lock::{self, LockRead};
use crate::observers::{Leader, Seen};
use crate::output::push_wake;
use crate::time::Now;
use crate::waiters::{Outcome, Wake};

/// What `LOCK.OBSERVE` answers now.
#[derive(Debug, PartialEq, Eq)]
pub enum Observation<K> {
    /// The key's leader (it differs from `AFTER`, or none was given).
    Now(Leader),
    /// It is still what the client saw, and the client does not wait.
    Nil,
    /// The client is to wait: once the glue has blocked it,
    /// [`Node::start_observing`] makes it an observer, told of the next
    /// change (or nil at its timeout) by a timer run.
    Wait(ObserveTicket<K>),
}

/// A decision that a client observes a key, carried out once the glue has
/// blocked it ([`Node::start_observing`]).
#[derive(Debug, PartialEq, Eq)]
pub struct ObserveTicket<K> {
    key: K,
    /// What the client saw: `AFTER`'s fence and the value with it.
    seen: Seen,
    timeout_at_ms: Option<i64>,
    /// The holder's lease end (None: the key is free).
    check_at_ms: Option<i64>,
}

/// The leader of a key's store at `now_ms`: its newest live holder.
pub(crate) fn leader_of(store: &impl LockRead, now_ms: i64) -> Leader {
    match lock::newest_live(store, now_ms) {
        Some(l) => Leader::Held {
            fence: l.fence,
            ttl_ms: l.remaining_ms(now_ms),
            value: l.value.into(),
        },
        None => Leader::Vacant,
    }
}

impl<K: Hash + Ord + Clone, C: Hash + Eq + Ord + Copy> Node<K, C> {
    /// `LOCK.OBSERVE key [AFTER after [VALUE value]] [BLOCK block_ms]`:
    /// the leader of `key` (its `store`, Err for a key of another type), at
    /// once when there is no `after` or the leader differs from what the
    /// client saw (`after` 0: the key free; else that fence, with `value`,
    /// or without it the holder's value now); else, with `block_ms` (0: no
    /// timeout) and when the client may block, a ticket to observe the key
    /// until it changes; else nil. Reads only.
    #[allow(clippy::too_many_arguments)] // one input per thing the call depends on
    pub fn observe(
        &self,
        key: &K,
        store: Result<&impl LockRead, LockError>,
        after: Option<i64>,
        value: Option<&[u8]>,
        block_ms: Option<i64>,
        cond: Conditions,
        now: Now,
    ) -> Result<Observation<K>, LockError> {
        let now_ms = now.mono_ms();
        let leader = leader_of(store?, now_ms);
        let Some(after) = after else {
            return Ok(Observation::Now(leader));
        };
        let seen = Seen {
            after,
            value: match (value, &leader) {
                (Some(v), _) => v.into(),
                (None, Leader::Held { value, .. }) => value.clone(),
                (None, Leader::Vacant) => Box::default(),
            },
        };
        if seen.differs(&leader) {
            return Ok(Observation::Now(leader));
        }
        let Some(block_ms) = block_ms.filter(|_| cond.contains(Conditions::MAY_BLOCK)) else {
            return Ok(Observation::Nil);
        };
        // A held key is looked at again when its lease ends; a free one
        // when something writes to it.
        let check_at_ms = match leader {
            Leader::Held { ttl_ms, .. } => Some(now_ms.saturating_add(ttl_ms)),
            Leader::Vacant => None,
        };
        Ok(Observation::Wait(ObserveTicket {
            key: key.clone(),
            seen,
            timeout_at_ms: (block_ms > 0).then(|| now_ms.saturating_add(block_ms)),
            check_at_ms,
        }))
    }

    /// `client`, blocked by the glue, observes as `ticket` says. Refused
    /// (changing nothing) when the client waits or observes already.
    pub fn start_observing(
        &mut self,
        ticket: ObserveTicket<K>,
        client: C,
    ) -> Result<(), LockError> {
        let t = ticket;
        if self.waiters.contains(client)
            || !self
                .observers
                .add(&t.key, client, t.seen, t.timeout_at_ms, t.check_at_ms)
        {
            return Err(LockError::Internal);
        }
        Ok(())
    }

    /// How many clients observe `key`.
    pub fn observing(&self, key: &K) -> usize {
        self.observers.observing(key)
    }

    /// `key` changed from outside (the master, the AOF): its observers
    /// look again at the next timer run. Whether anyone observes it (the
    /// timer then needs arming).
    pub fn applied(&mut self, key: &K, now_ms: i64) -> bool {
        self.observers.touch(key, now_ms)
    }

    /// The observers' part of a timer run: those whose timeout came are
    /// answered nil (timed out); every key due (written to, or its lease
    /// ended) is read, and its observers that saw another leader are told
    /// this one. A key that left this node sends its observers where it
    /// went.
    pub(super) fn tell_observers<S: TimerKeys<K, C>>(&mut self, keys: &mut S, now: Now) {
        if self.observers.is_empty() {
            return;
        }
        let now_ms = now.mono_ms();
        for (client, key) in self.observers.poll_timeouts(now_ms) {
            self.answer_observer(client, key, Outcome::TimedOut);
        }
        for key in self.observers.due_keys(now_ms) {
            // Each observer told is asked of ACL as it is told: its user
            // may have lost read access while it observed.
            let observers = &mut self.observers;
            let seen = keys.with_key(&key, |store, served, admit| match served {
                Served::Elsewhere(redirect) => Err(redirect),
                Served::Here => {
                    let leader = match store {
                        Ok(store) => leader_of(&*store, now_ms),
                        // Another type: no lock holds the key.
                        Err(_) => Leader::Vacant,
                    };
                    let told: Vec<(C, bool)> = observers
                        .tell(&key, &leader, now_ms)
                        .into_iter()
                        .map(|client| (client, admit.may_observe(client)))
                        .collect();
                    Ok((leader, told))
                }
            });
            match seen {
                Ok((leader, told)) => {
                    for (client, admitted) in told {
                        let outcome = match admitted {
                            true => Outcome::Observed(leader.clone()),
                            false => Outcome::Failed(LockError::NoReadPermission),
                        };
                        self.answer_observer(client, key.clone(), outcome);
                    }
                }
                Err(redirect) => {
                    for client in self.observers.take_all(&key) {
                        let err = LockError::Redirect(redirect.clone());
                        self.answer_observer(client, key.clone(), Outcome::Failed(err));
                    }
                }
            }
        }
    }

    fn answer_observer(&mut self, client: C, key: K, outcome: Outcome) {
        let wake = Wake {
            client,
            key,
            outcome,
            waited_us: 0,
            also: Vec::new(),
        };
        push_wake(&mut self.outputs, &mut self.grant_tally, wake);
    }
}
