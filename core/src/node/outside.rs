//! Locks that come from outside: the master's and the AOF's `LOCK._SET`,
//! `LOCK._SHARED`, `LOCK._HOLD`, `LOCK._DROP`; an RDB's or a `RESTORE`'s
//! values.

use std::hash::Hash;

use super::Node;
use crate::args;
use crate::codec;
use crate::error::LockError;
use crate::lock::{Lock, LockStore, Mode};
use crate::time::Now;

/// A loaded or restored lock as the node takes it: its times on this
/// node's monotonic clock, capped as every lease entering the node is, and
/// its lease id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    pub deadline_ms: i64,
    pub granted_ms: Option<i64>,
    pub lease: u64,
}

impl<K: Hash + Ord + Clone, C: Hash + Eq + Ord + Copy> Node<K, C> {
    // ---- locks from outside: the master, the AOF, an RDB, RESTORE ----

    /// `LOCK._SET key token fence deadline-ms granted-ms` from the master or
    /// the AOF (every lock from outside is filed by its lease's end, as the
    /// node's own are: a replica prunes them, and reclaims them once
    /// promoted): the fence is checked and raises the mark in one step (a
    /// refused one changes nothing), then the lock is stored as given, its
    /// wall-clock times on this node's monotonic clock, the lease capped as
    /// every lease entering the node is ([`crate::time::local_times`]).
    pub fn apply_set(
        &mut self,
        key: &K,
        store: &mut impl LockStore,
        holder: &args::SetArgs<'_>,
        now: Now,
    ) -> Result<(), LockError> {
        let fence = holder.fence;
        self.fences.observe(fence, now.wall_us)?;
        let (deadline_ms, granted_ms) =
            self.local_times(holder.deadline_ms, holder.granted_ms, now);
        let lease = self.next_lease();
        let lock = Lock {
            fence,
            deadline_ms,
            token: holder.token,
            value: holder.value,
            granted_ms,
            lease,
        };
        self.lease_ends.file_lease(key, deadline_ms, now.mono_ms());
        store.put(Mode::Exclusive, lock);
        Ok(())
    }

    /// `LOCK._SHARED key limit token fence deadline-ms granted-ms ...` from
    /// the master or the AOF: a shared key, whole. Every fence is checked
    /// first and the mark raised to the highest (a refused one changes
    /// nothing), then the key is stored as given, each holder's times on
    /// this node's monotonic clock.
    pub fn apply_shared(
        &mut self,
        key: &K,
        store: &mut impl LockStore,
        mode: Mode,
        holders: &[args::SetArgs<'_>],
        now: Now,
    ) -> Result<(), LockError> {
        for h in holders {
            self.fences.check(h.fence, now.wall_us)?;
        }
        let highest = holders
            .iter()
            .map(|h| h.fence)
            .max()
            .ok_or(LockError::Internal)?;
        self.fences.observe(highest, now.wall_us)?;
        for (i, h) in holders.iter().enumerate() {
            let (deadline_ms, granted_ms) = self.local_times(h.deadline_ms, h.granted_ms, now);
            let lock = Lock {
                fence: h.fence,
                deadline_ms,
                token: h.token,
                value: h.value,
                granted_ms,
                lease: self.next_lease(),
            };
            self.lease_ends.file_lease(key, deadline_ms, now.mono_ms());
            match i {
                0 => store.put(mode, lock),
                _ => store.add(lock),
            }
        }
        Ok(())
    }

    /// `LOCK._HOLD key limit token fence deadline-ms granted-ms` from the
    /// master or the AOF: one holder of a shared key, added or renewed (a
    /// key absent here, or in another mode, is made anew with it). The
    /// fence is checked and raises the mark first (a refused one changes
    /// nothing); times as for [`apply_set`](Self::apply_set).
    pub fn apply_hold(
        &mut self,
        key: &K,
        store: &mut impl LockStore,
        mode: Mode,
        holder: &args::SetArgs<'_>,
        now: Now,
    ) -> Result<(), LockError> {
        if !mode.is_shared() {
            return Err(LockError::BadInternalArgument("limit"));
        }
        self.fences.observe(holder.fence, now.wall_us)?;
        let (deadline_ms, granted_ms) =
            self.local_times(holder.deadline_ms, holder.granted_ms, now);
        let lock = Lock {
            fence: holder.fence,
            deadline_ms,
            token: holder.token,
            value: holder.value,
            granted_ms,
            lease: self.next_lease(),
        };
        self.lease_ends.file_lease(key, deadline_ms, now.mono_ms());
        match store.mode() {
            Some(held) if held == mode => store.add(lock),
            _ => store.put(mode, lock),
        }
        Ok(())
    }

    /// `LOCK._DROP key token` from the master or the AOF: that holder of a
    /// shared key is gone (the key with its last holder).
    pub fn apply_drop(&mut self, store: &mut impl LockStore, token: &[u8]) {
        store.remove(token);
    }

    /// Whether a decoded value's fence may be loaded now: within the bounds
    /// of the mark and the clock, and for a `RESTORE` (`restoring`), of the
    /// clock alone too (nothing changes).
    pub fn check_loaded_fence(
        &self,
        fence: i64,
        restoring: bool,
        wall_us: i64,
    ) -> Result<(), LockError> {
        self.fences.check(fence, wall_us)?;
        if restoring {
            codec::check_restored_fence(fence, wall_us)?;
        }
        Ok(())
    }

    /// A value decoded whole from an RDB or a `RESTORE` payload is taken,
    /// all its holders (`fence`, wall-clock deadline, wall-clock grant
    /// time) in one step: every fence is checked first, then a RESTOREd
    /// value raises the mark with its highest (an RDB's mark comes in its
    /// aux field), and each holder's times come back on this node's
    /// monotonic clock, capped as every lease entering the node is, with a
    /// lease id, and filed by its end under `key` (when Redis names the key
    /// being loaded). An Err (the fence refused, and why) changes nothing:
    /// refuse the value.
    pub fn accept_value(
        &mut self,
        key: Option<&K>,
        holders: &[(i64, i64, i64)],
        restoring: bool,
        now: Now,
    ) -> Result<Vec<Loaded>, (i64, LockError)> {
        for &(fence, _, _) in holders {
            self.check_loaded_fence(fence, restoring, now.wall_us)
                .map_err(|e| (fence, e))?;
        }
        if restoring {
            if let Some(highest) = holders.iter().map(|h| h.0).max() {
                self.fences
                    .observe(highest, now.wall_us)
                    .map_err(|e| (highest, e))?;
            }
        }
        Ok(holders
            .iter()
            .map(|&(_, wall_deadline_ms, wall_granted_ms)| {
                let (deadline_ms, granted_ms) =
                    self.local_times(wall_deadline_ms, wall_granted_ms, now);
                if let Some(key) = key {
                    self.lease_ends.file_lease(key, deadline_ms, now.mono_ms());
                }
                Loaded {
                    deadline_ms,
                    granted_ms,
                    lease: self.next_lease(),
                }
            })
            .collect())
    }
}
