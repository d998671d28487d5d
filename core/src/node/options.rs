//! The `lock.*` options as the node applies them ([`Limits`]), and what
//! only the server knows at the moment of a call ([`Conditions`]).

use std::hash::Hash;

use bitflags::bitflags;

use crate::args;
use crate::error::LockError;
use crate::lock::Rules;

/// The `lock.*` options, as the node applies them: to new commands, and to
/// every hand-off from the moment they change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `lock.max-ttl-ms`: the longest lease a grant may carry.
    pub max_ttl_ms: i64,
    /// `lock.max-token-len`: the longest token a new grant may use.
    pub max_token_len: usize,
    /// `lock.max-waiters-per-key`: the longest BLOCK line on one key.
    pub max_waiters_per_key: usize,
    /// `lock.restart-delay-ms`: no new grants this long after the node
    /// loaded its data or was promoted.
    pub restart_delay_ms: i64,
    /// `lock.allow-eviction`: grant while maxmemory-policy can evict locks.
    pub allow_eviction: bool,
    /// `lock.lock-delay-ms`: after a lease ends without a release, no grant
    /// of its key for this long.
    pub lock_delay_ms: i64,
    /// `lock.max-holders-per-key`: the most holders one shared key has at
    /// once (a `LIMIT` above it is capped to it).
    pub max_holders_per_key: usize,
    /// `lock.max-value-len`: the longest public value a request may store.
    pub max_value_len: usize,
}

impl Default for Limits {
    /// Every option at its default (`protocol::OPTIONS`).
    fn default() -> Self {
        use crate::protocol::{
            ALLOW_EVICTION, LOCK_DELAY_MS, MAX_HOLDERS_PER_KEY, MAX_TOKEN_LEN_OPTION, MAX_TTL_MS,
            MAX_VALUE_LEN_OPTION, MAX_WAITERS_PER_KEY, RESTART_DELAY_MS,
        };
        Limits {
            max_ttl_ms: MAX_TTL_MS.default_value(),
            max_token_len: MAX_TOKEN_LEN_OPTION.default_value() as usize,
            max_waiters_per_key: MAX_WAITERS_PER_KEY.default_value() as usize,
            restart_delay_ms: RESTART_DELAY_MS.default_value(),
            allow_eviction: ALLOW_EVICTION.default_value() != 0,
            lock_delay_ms: LOCK_DELAY_MS.default_value(),
            max_holders_per_key: MAX_HOLDERS_PER_KEY.default_value() as usize,
            max_value_len: MAX_VALUE_LEN_OPTION.default_value() as usize,
        }
    }
}

impl Limits {
    /// What the state machine applies to a grant.
    #[inline]
    pub fn rules(&self) -> Rules {
        Rules {
            lock_delay_ms: self.lock_delay_ms,
            max_holders: self.max_holders_per_key,
        }
    }

    /// The longest lease a grant, renewal or extension may carry now: one
    /// rule for ACQUIRE, EXTEND and every hand-off.
    #[inline]
    pub fn check_ttl(&self, ttl_ms: i64) -> Result<(), LockError> {
        if ttl_ms > self.max_ttl_ms {
            return Err(LockError::TtlTooLarge(
                format!("'{ttl_ms}'"),
                self.max_ttl_ms,
            ));
        }
        Ok(())
    }

    /// A request's public value within `lock.max-value-len` (checked when
    /// the request arrives, for a grant, a renewal or a place in line).
    #[inline]
    pub fn check_value(&self, value: Option<&[u8]>) -> Result<(), LockError> {
        match value {
            Some(v) if v.len() > self.max_value_len => {
                Err(LockError::ValueTooLong(v.len(), self.max_value_len))
            }
            _ => Ok(()),
        }
    }

    /// Whether a *new* holder (a grant, or a place in line) may be taken
    /// on: its token within `lock.max-token-len`, and a server that can keep
    /// the lock (no eviction of locks, memory below maxmemory). A holder
    /// renewing its own lock is never refused for these: its same-token
    /// ACQUIRE is the safe retry after a lost reply, whatever the options
    /// became since it was granted. One rule for ACQUIRE and every hand-off.
    #[inline]
    pub fn check_new_holder(&self, token: &[u8], cond: Conditions) -> Result<(), LockError> {
        args::check_token_limit(token, self.max_token_len)?;
        self.check_can_keep_new(cond)
    }

    /// Whether the server can keep a value it is asked to take on now (a
    /// new holder, a new gate): not evictable, and below maxmemory.
    #[inline]
    pub fn check_can_keep_new(&self, cond: Conditions) -> Result<(), LockError> {
        self.check_not_evictable(cond)?;
        if cond.contains(Conditions::OOM) {
            return Err(LockError::OutOfMemory);
        }
        Ok(())
    }

    /// Whether values the server keeps could be evicted (an `allkeys-*`
    /// policy) without `lock.allow-eviction`.
    #[inline]
    pub fn check_not_evictable(&self, cond: Conditions) -> Result<(), LockError> {
        if cond.contains(Conditions::EVICTABLE) && !self.allow_eviction {
            return Err(LockError::EvictionUnsafe);
        }
        Ok(())
    }

    /// Whether a waiter whose turn has come may take its lock(s) now: the
    /// limits in force at the hand-off (as a new ACQUIRE's), unless it
    /// renews its own lock, and its ACL as it is now (`may_take`, on every
    /// key it waits for). One rule for one-key and multi-key waiters.
    pub fn check_turn(
        &self,
        ttl_ms: i64,
        token: &[u8],
        renews: bool,
        cond: Conditions,
        may_take: impl FnOnce() -> bool,
    ) -> Result<(), LockError> {
        self.check_ttl(ttl_ms)?;
        if !renews {
            self.check_new_holder(token, cond)?;
        }
        match may_take() {
            true => Ok(()),
            false => Err(LockError::NoPermission),
        }
    }
}

bitflags! {
    /// What only the server knows at the moment of a call.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Conditions: u8 {
        /// This node is a replica: its master's effects are its only writes.
        const REPLICA = 1 << 0;
        /// The calling client may block (not in MULTI, Lua or a
        /// no-blocking context): BLOCK waits instead of answering at once.
        const MAY_BLOCK = 1 << 1;
        /// maxmemory-policy can evict keys, and so held locks.
        const EVICTABLE = 1 << 2;
        /// Used memory is above maxmemory.
        const OOM = 1 << 3;
        /// Writes are held back (CLIENT PAUSE WRITE, FAILOVER): a hand-off
        /// or take-back must wait.
        const WRITES_PAUSED = 1 << 4;
    }
}
