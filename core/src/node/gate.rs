//! Fence gates (`LOCK.FENCED`): a key that keeps the highest fence it
//! accepted (its mark) for the data it guards. Every change of a mark is
//! decided here, raised and never lowered ([`raise`], its one owner): by a
//! fence that passed, by the master or the AOF (`LOCK._GATE`), and by the
//! put-back of a gate maxmemory evicted. A gate's marks are not the
//! node's: they come from whatever issued the fence (a Redlock group,
//! another node), so they do not raise the node's mark.

use std::hash::Hash;

use super::{acts_alone, refuse_on_replica, Conditions, Node, TimerKeys};
use crate::error::LockError;
use crate::guarded;
use crate::output::{Output, Stat};

/// A gate's key as the node reads it: in Redis the `lock_gate` key, in the
/// model a map.
pub trait GateRead {
    /// The mark: None for an empty key; WRONGTYPE for a key that holds
    /// something else (a lock too).
    fn mark(&self) -> Result<Option<i64>, LockError>;
}

/// A gate's key as the node writes it.
pub trait GateStore: GateRead {
    /// Sets the mark, making the gate when the key is empty (the node
    /// checked it is empty or a gate).
    fn set_mark(&mut self, mark: i64);
}

/// Raises the gate to `mark`, if that raises it: the one place a mark
/// changes. True if it did; WRONGTYPE (nothing changed) for another type.
fn raise(gate: &mut impl GateStore, mark: i64) -> Result<bool, LockError> {
    match gate.mark()? {
        Some(held) if held >= mark => Ok(false),
        _ => {
            gate.set_mark(mark);
            Ok(true)
        }
    }
}

impl<K: Hash + Ord + Clone, C: Hash + Eq + Ord + Copy> Node<K, C> {
    /// `LOCK.FENCED gate fence`, before its command runs: whether `fence`
    /// passes the gate at `key` (its mark, or the mark kept for it while
    /// maxmemory's eviction of it is put back), or why not (a stale fence
    /// is counted). Gates are kept like locks: not on a replica, not where
    /// maxmemory-policy may evict them, and no new one above maxmemory. A
    /// clock fence issued before the node last loaded its data or was
    /// promoted is refused by every gate ([`guarded::pass`]).
    pub fn pass_gate(
        &mut self,
        key: &K,
        gate: &impl GateRead,
        fence: i64,
        cond: Conditions,
        now_us: i64,
    ) -> Result<(), LockError> {
        let decided = self.decide_gate(key, gate, fence, cond, now_us);
        if let Err(LockError::StaleFence { .. }) = decided {
            self.outputs.push_back(Output::Count(Stat::FencedStale));
        }
        decided
    }

    fn decide_gate(
        &self,
        key: &K,
        gate: &impl GateRead,
        fence: i64,
        cond: Conditions,
        now_us: i64,
    ) -> Result<(), LockError> {
        guarded::check_gate_fence(fence, now_us)?;
        refuse_on_replica(cond)?;
        let mark = gate.mark()?.max(self.evicted_gates.get(key).copied());
        // Raising a gate's mark takes no memory; a new gate does.
        match mark {
            None => self.limits.check_can_keep_new(cond)?,
            Some(_) => self.limits.check_not_evictable(cond)?,
        }
        guarded::pass(mark, fence, self.gate_floor).map(|_| ())
    }

    /// `LOCK.FENCED`, once its command ran (or at once, without one): the
    /// gate at `key` is raised to `fence`, which passed it. A gate the
    /// command deleted comes back with the mark; a key it turned into
    /// another type is left as it made it. A mark kept for an evicted gate
    /// is settled (the fence passed it).
    pub fn record_fence(&mut self, key: &K, gate: &mut impl GateStore, fence: i64) {
        self.evicted_gates.remove(key);
        self.raise_gate(key, gate, fence);
        self.outputs.push_back(Output::Count(Stat::FencedRan));
    }

    /// Raises the gate at `key` to `mark` by a decision here: replicated
    /// and announced when it rises ([`Output::GateRaised`]). True if it
    /// rose; a key of another type is left alone.
    fn raise_gate(&mut self, key: &K, gate: &mut impl GateStore, mark: i64) -> bool {
        let raised = raise(gate, mark).unwrap_or(false);
        if raised {
            self.outputs
                .push_back(Output::GateRaised(key.clone(), mark));
        }
        raised
    }

    /// `LOCK._GATE gate mark` from the master or the AOF: the gate raised
    /// to `mark` (never lowered). True if it rose; WRONGTYPE for a key of
    /// another type. The glue replicates the command as it came.
    pub fn apply_gate(
        &mut self,
        gate: &mut impl GateStore,
        mark: i64,
        now_us: i64,
    ) -> Result<bool, LockError> {
        guarded::check_loaded_mark(mark, true, now_us)?;
        raise(gate, mark)
    }

    /// Whether a gate's mark read from an RDB (`trusted`: this node's own
    /// data or its master's) or a `RESTORE` payload may be loaded.
    pub fn check_loaded_gate(
        &self,
        mark: i64,
        trusted: bool,
        now_us: i64,
    ) -> Result<(), LockError> {
        guarded::check_loaded_mark(mark, trusted, now_us)
    }

    /// Maxmemory evicted the gate at `key`, whose mark was `mark`: the
    /// mark is kept (`LOCK.FENCED` reads it) and the gate put back at the
    /// timer's next run. A gate that left the keyspace so would otherwise
    /// accept any fence, a stale holder's included.
    pub fn gate_evicted(&mut self, key: K, mark: i64, now_ms: i64) {
        let kept = self.evicted_gates.entry(key).or_insert(mark);
        *kept = (*kept).max(mark);
        self.gates_due_at_ms = Some(self.gates_due_at_ms.map_or(now_ms, |at| at.min(now_ms)));
    }

    /// The marks kept for evicted gates, put back (from the timer's run):
    /// each gate raised to its kept mark, made anew if it is gone, left
    /// alone if its key now holds another type. On a replica the kept
    /// marks are dropped (its master's data wins); while writes are held
    /// back they wait for the retry instant.
    pub(super) fn put_back_gates<S: TimerKeys<K, C>>(
        &mut self,
        keys: &mut S,
        cond: Conditions,
        now_ms: i64,
    ) {
        if self.gates_due_at_ms.is_none_or(|at| at > now_ms) {
            return;
        }
        if cond.contains(Conditions::REPLICA) {
            self.evicted_gates.clear();
            self.gates_due_at_ms = None;
            return;
        }
        if !acts_alone(cond) {
            self.gates_due_at_ms = Some(self.retry_at(now_ms));
            return;
        }
        self.gates_due_at_ms = None;
        for (key, mark) in std::mem::take(&mut self.evicted_gates) {
            let raised = keys.with_gate(&key, |gate| {
                gate.is_ok_and(|gate| self.raise_gate(&key, gate, mark))
            });
            if raised {
                self.outputs.push_back(Output::Count(Stat::GatePutBack));
            }
        }
    }
}

/// A gate in memory, for the node's tests and the model.
#[cfg(test)]
pub(crate) mod tests {
    use super::{GateRead, GateStore};
    use crate::error::LockError;

    #[derive(Debug, Default, Clone, PartialEq, Eq)]
    pub struct MemGate {
        pub mark: Option<i64>,
        /// The key holds another type (WRONGTYPE).
        pub other_type: bool,
    }

    impl GateRead for MemGate {
        fn mark(&self) -> Result<Option<i64>, LockError> {
            match self.other_type {
                true => Err(LockError::WrongType),
                false => Ok(self.mark),
            }
        }
    }

    impl GateStore for MemGate {
        fn set_mark(&mut self, mark: i64) {
            self.mark = Some(mark);
        }
    }
}
