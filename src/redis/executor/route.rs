//! Where each output goes: the executor's order and routing, apart from
//! Redis. [`execute`] takes a decision's outputs in order and hands each to
//! an [`Effects`] at the place ([`At`]) its key is at the site: the
//! command's key, one of a multi-key command's, the gate of
//! `LOCK.FENCED`, or a key found by its identity (the timer, the sweep).
//! A key changed again before another key was is replicated once (what is
//! replicated is the key as it stands after the whole decision). The Redis
//! side of each effect is `outputs::Redis`; the tests record them.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use crate::core::output::{Event, Output, Stat};
use crate::core::Wake;

/// Where an output's key is at the site.
#[derive(Debug, PartialEq, Eq)]
pub enum At<'k, K> {
    /// The command's own key.
    Command,
    /// The i-th key of a multi-key command.
    Nth(usize),
    /// The gate `LOCK.FENCED` runs on.
    Gate,
    /// A key found by its identity (opened in its db).
    Found(&'k K),
}

// By hand: a derive would ask K to be Copy, and `Found` holds a borrow.
impl<K> Clone for At<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K> Copy for At<'_, K> {}

/// The keys a site knows by place: the shape outputs are routed by.
pub enum Shape<'a, K> {
    /// A command on one key: every output is about it.
    Command,
    /// A command on these keys: every output is about one of them.
    Keys(&'a [K]),
    /// `LOCK.FENCED` on its gate: a raised mark is the gate's; a lock's
    /// outputs (a lease the guarded command let go) are found by identity.
    Gate,
    /// The timer or the sweep: every key is found by its identity.
    Background,
}

/// What carrying out an output does, at a place.
pub trait Effects<K, C> {
    /// Answers a waiter (its one reply).
    fn answer(&mut self, wake: Wake<K, C>);
    /// Replicates the key as it stands now.
    fn replicate(&mut self, at: At<'_, K>);
    /// Replicates one holder of a shared key (its lease id).
    fn replicate_holder(&mut self, at: At<'_, K>, lease: u64);
    /// Replicates a holder's leaving a shared key.
    fn replicate_drop(&mut self, at: At<'_, K>, token: &[u8]);
    /// Emits a keyspace event.
    fn notify(&mut self, at: At<'_, K>, event: Event);
    /// Signals a gate raised to `mark` and replicates it.
    fn gate_raised(&mut self, at: At<'_, K>, mark: i64);
    /// Counts a statistic.
    fn count(&mut self, stat: Stat);
}

/// Carries out `outputs` in order, each popped before its effect: a panic
/// in one leaves the rest queued (and that one not retried).
#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub fn execute<K, C, E>(outputs: &mut VecDeque<Output<K, C>>, shape: Shape<'_, K>, effects: &mut E)
where
    K: Eq + Hash,
    E: Effects<K, C>,
{
    // A multi-key command's outputs name its keys: found by a map, not a
    // scan per output (thousands of keys would cost their square). Only
    // there: a map's hasher reads a thread-local to make its seed.
    let index: Option<HashMap<&K, usize>> = match &shape {
        Shape::Keys(keys) => Some(keys.iter().enumerate().map(|(i, k)| (k, i)).collect()),
        _ => None,
    };
    // A command's one key needs only a flag; elsewhere the last key
    // changed.
    let mut command_replicated = false;
    let mut last_changed: Option<K> = None;
    // (pop_front, not drain: cheaper for the two or three outputs of a
    // command.)
    while let Some(output) = outputs.pop_front() {
        match output {
            Output::Wake(wake) => effects.answer(*wake),
            Output::Changed(key) => {
                if matches!(shape, Shape::Command) {
                    if !std::mem::replace(&mut command_replicated, true) {
                        effects.replicate(At::Command);
                    }
                } else if last_changed.as_ref() != Some(&key) {
                    if let Some(at) = place(&shape, index.as_ref(), &key) {
                        effects.replicate(at);
                    }
                    last_changed = Some(key);
                }
            }
            Output::Holder(key, lease) => {
                if let Some(at) = place(&shape, index.as_ref(), &key) {
                    effects.replicate_holder(at, lease);
                }
            }
            Output::HolderLeft(key, token) => {
                if let Some(at) = place(&shape, index.as_ref(), &key) {
                    effects.replicate_drop(at, &token);
                }
            }
            Output::Event(key, event) => {
                if let Some(at) = place(&shape, index.as_ref(), &key) {
                    effects.notify(at, event);
                }
            }
            Output::GateRaised(key, mark) => {
                let at = match shape {
                    Shape::Gate => Some(At::Gate),
                    _ => place(&shape, index.as_ref(), &key),
                };
                if let Some(at) = at {
                    effects.gate_raised(at, mark);
                }
            }
            Output::Count(stat) => effects.count(stat),
        }
    }
}

/// The place of `key` at a site of this shape, or None for a key the site
/// does not have (no decision names one: nothing is done rather than the
/// wrong key).
#[inline(always)] // on every grant: part of one inlined path (callgrind)
fn place<'k, K: Eq + Hash>(
    shape: &Shape<'_, K>,
    index: Option<&HashMap<&K, usize>>,
    key: &'k K,
) -> Option<At<'k, K>> {
    match shape {
        Shape::Command => Some(At::Command),
        Shape::Keys(_) => index?.get(key).map(|&i| At::Nth(i)),
        Shape::Gate | Shape::Background => Some(At::Found(key)),
    }
}
