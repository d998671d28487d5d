//! `LOCK.ACQUIRE` and `LOCK.ACQUIREALL`: one decision for one key or
//! several, and a place in line for a client that must wait.

use std::hash::Hash;

use super::{Admission, Conditions, Node};
use crate::error::LockError;
use crate::fence::{self};
use crate::lock::{self, Fit, LockRead, LockStore, Mode};
use crate::output::{Event, Output, Stat};
use crate::time::Now;
use crate::waiters::Request;

/// `LOCK.ACQUIRE key token ttl-ms [BLOCK timeout-ms] [MINFENCE n] [VALUE
/// v]`, parsed.
#[derive(Debug, Clone, Copy)]
pub struct AcquireRequest<'a> {
    pub token: &'a [u8],
    /// VALUE v (None: not given; a renewal then keeps the holder's).
    pub value: Option<&'a [u8]>,
    /// Exclusive, or `SHARED [LIMIT n]`.
    pub mode: Mode,
    pub ttl_ms: i64,
    /// BLOCK timeout-ms (0: no timeout); None without BLOCK.
    pub block_ms: Option<i64>,
    /// MINFENCE n (0: none).
    pub min_fence: i64,
}

/// What an ACQUIRE comes to.
#[derive(Debug, PartialEq, Eq)]
pub enum Acquire<K> {
    /// A new grant with a new fencing token.
    Granted(i64),
    /// The token already held the lock: lease reset (and a fresh token if
    /// MINFENCE asked for more than it had).
    Renewed(i64),
    /// Another token holds the lock (nil).
    Contended,
    /// The client must wait in line: block it, then [`Node::enqueue`] it.
    /// Boxed: the ticket is large, and the common answers (a fence, nil)
    /// are moved through every caller.
    Wait(Box<WaitTicket<K>>),
}

/// A decision to queue a client, to be carried out once the glue has blocked
/// it ([`Node::enqueue`]). The line was checked for room when it was made.
#[derive(Debug, PartialEq, Eq)]
pub struct WaitTicket<K> {
    key: K,
    /// A multi-key waiter's other keys.
    also: Box<[K]>,
    token: Box<[u8]>,
    value: Option<Box<[u8]>>,
    mode: Mode,
    ttl_ms: i64,
    timeout_ms: i64,
    min_fence: i64,
    since_us: i64,
    /// When the key must be looked at again: the holder's lease end, or the
    /// end of the restart delay.
    check_at_ms: i64,
}

impl<K: Hash + Ord + Clone, C: Hash + Eq + Ord + Copy> Node<K, C> {
    // ---- commands ----

    /// `LOCK.ACQUIRE`: the one-key case of [`acquire_all`](Self::acquire_all)
    /// (one decision for both). Any hand-off due on the key runs first, so
    /// nobody barges in ahead of the line.
    pub fn acquire<S: LockStore, A: Admission<C>>(
        &mut self,
        key: &K,
        store: Result<&mut S, LockError>,
        req: AcquireRequest<'_>,
        cond: Conditions,
        admission: &mut A,
        now: Now,
    ) -> Result<Acquire<K>, LockError> {
        let keys = std::slice::from_ref(key);
        let stores = store.map(std::slice::from_mut);
        self.acquire_all(
            keys,
            stores,
            req,
            cond,
            std::slice::from_mut(admission),
            now,
        )
    }

    /// `LOCK.ACQUIREALL numkeys key ... token ttl-ms [BLOCK timeout-ms]
    /// [MINFENCE n]`: every key of `keys` (distinct; `stores[i]` and
    /// `admissions[i]` are `keys[i]`'s) to the request's token with one
    /// fence, or none. Contended (nil) and nothing changed when any key is
    /// held by another token, is held back by lock-delay, or has waiters
    /// (no barging past a line); with BLOCK the client waits in every
    /// key's line instead, holding none of them
    /// (the `waiters` module says how it is served). The
    /// same token holding every key under one fence (a retry after a lost
    /// reply) renews them all and gets that fence again; holding only some
    /// of them is not that. Hand-offs due on the keys run first, as for
    /// every command.
    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    pub fn acquire_all<S: LockStore, A: Admission<C>>(
        &mut self,
        keys: &[K],
        stores: Result<&mut [S], LockError>,
        req: AcquireRequest<'_>,
        cond: Conditions,
        admissions: &mut [A],
        now: Now,
    ) -> Result<Acquire<K>, LockError> {
        let decided = self.decide_acquire_all(keys, stores, req, cond, admissions, now);
        let (stat, event) = match &decided {
            Ok(Acquire::Granted(_)) => (Stat::Grant, Some(Event::Acquire)),
            Ok(Acquire::Renewed(_)) => (Stat::Extend, Some(Event::Extend)),
            Ok(Acquire::Contended) => (Stat::Contended, None),
            Err(LockError::EvictionUnsafe) => (Stat::RefusedEvictable, None),
            Ok(Acquire::Wait(_)) | Err(_) => return decided,
        };
        match event {
            Some(event) => {
                for key in keys {
                    if event == Event::Acquire {
                        self.grant_tally.record(key);
                    }
                    self.outputs.push_back(Output::Count(stat));
                    self.outputs.event(key, event);
                }
            }
            None => self.outputs.push_back(Output::Count(stat)),
        }
        decided
    }

    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    pub(super) fn decide_acquire_all<S: LockStore, A: Admission<C>>(
        &mut self,
        keys: &[K],
        stores: Result<&mut [S], LockError>,
        req: AcquireRequest<'_>,
        cond: Conditions,
        admissions: &mut [A],
        now: Now,
    ) -> Result<Acquire<K>, LockError> {
        self.limits.check_ttl(req.ttl_ms)?;
        self.limits.check_value(req.value)?;
        check_requested_min_fence(req.min_fence, now)?;
        let stores = self.open_in_command(keys, stores, cond, now)?;
        debug_assert_eq!(keys.len(), stores.len());
        debug_assert_eq!(keys.len(), admissions.len());
        // Each key's line is served with its own key's admission (a
        // waiter's ACL is about the key it waits on).
        for ((key, store), admission) in keys.iter().zip(stores.iter_mut()).zip(admissions) {
            self.hand_on_in_command(key, store, cond, admission, now);
        }
        let now_ms = now.mono_ms();
        let rules = self.limits.rules();
        // Decide before writing: a contended ACQUIRE changes nothing (it
        // would abort other clients' WATCH).
        // When the first key that holds the request back frees (None:
        // none does).
        let mut held_until: Option<i64> = None;
        let fits = fit_all(stores, req.token, req.mode, rules, now_ms, |_, until| {
            held_until = Some(held_until.map_or(until, |at| at.min(until)));
        })?;
        if let AllFit::Renews(fence) = fits {
            let (token, mode, ttl_ms) = (req.token, req.mode, req.ttl_ms);
            let held = (fence, req.value);
            let fence =
                self.renew_all(keys, stores, token, mode, held, ttl_ms, req.min_fence, now)?;
            return Ok(Acquire::Renewed(fence));
        }
        // Anyone in line (a multi-key waiter waiting for its other keys, a
        // writer that shared holders keep out): nobody passes them.
        let in_line = keys.iter().any(|key| self.waiters.waiting_on(key) > 0);
        let busy = fits == AllFit::Busy || in_line;
        let block = req
            .block_ms
            .filter(|_| cond.contains(Conditions::MAY_BLOCK));
        if busy && block.is_none() {
            return Ok(Acquire::Contended);
        }
        self.limits.check_new_holder(req.token, cond)?;
        let paused = self.grants_paused_ms(now_ms);
        if busy || paused > 0 {
            let Some(timeout_ms) = block else {
                return Err(LockError::GrantsPaused(paused));
            };
            let max = self.limits.max_waiters_per_key;
            if keys.iter().any(|k| self.waiters.waiting_on(k) >= max) {
                return Err(LockError::TooManyWaiters(max as i64));
            }
            // The lines are looked at again when the first lease (or
            // lock-delay) that holds the request back ends; behind others,
            // now (their line says when next); else when the restart delay
            // ends.
            let check_at_ms = match (held_until, in_line) {
                (Some(until), _) => until,
                (None, true) => now_ms,
                (None, false) => now_ms.saturating_add(paused),
            };
            return Ok(Acquire::Wait(Box::new(WaitTicket {
                key: keys[0].clone(),
                also: keys[1..].into(),
                token: req.token.into(),
                value: req.value.map(Into::into),
                mode: req.mode,
                ttl_ms: req.ttl_ms,
                timeout_ms,
                min_fence: req.min_fence,
                since_us: now.mono_us,
                check_at_ms,
            })));
        }
        let (token, mode) = ((req.token, req.value), req.mode);
        let fence = self.grant_all(keys, stores, token, mode, req.ttl_ms, req.min_fence, now)?;
        Ok(Acquire::Granted(fence))
    }

    /// New holders of every key (each fits `mode`, the grant allowed): one
    /// fence, drawn once and checked (and the deadline too) before any key
    /// changes.
    #[allow(clippy::too_many_arguments)] // one input per thing the call depends on
    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    pub(super) fn grant_all<S: LockStore>(
        &mut self,
        keys: &[K],
        stores: &mut [S],
        (token, value): (&[u8], Option<&[u8]>),
        mode: Mode,
        ttl_ms: i64,
        min_fence: i64,
        now: Now,
    ) -> Result<i64, LockError> {
        let now_ms = now.mono_ms();
        let deadline_ms = lock::deadline(now_ms, ttl_ms)?;
        let fence = lock::fresh_fence(&mut self.fences, min_fence, now.wall_us)?;
        let rules = self.limits.rules();
        let value = value.unwrap_or_default();
        for (key, store) in keys.iter().zip(stores.iter_mut()) {
            let mut ledger = self.ledger(key, store, now_ms);
            lock::grant(
                &mut ledger,
                mode,
                token,
                value,
                fence,
                deadline_ms,
                rules,
                now_ms,
            );
        }
        Ok(fence)
    }

    /// `token` holds every key under one grant (`fence`): each lease
    /// renewed (and downgraded when it asks `SHARED` of keys it holds
    /// exclusively); with MINFENCE above the held fence (Redlock's second
    /// phase over several keys), one fresh fence for every key, above the
    /// mark and `min_fence`, as a single key's holder gets. A `value` that
    /// differs from a key's is stored (a proclaim), and the key's observers
    /// are told, as of a new leader.
    #[allow(clippy::too_many_arguments)] // one input per thing the call depends on
    pub(super) fn renew_all<S: LockStore>(
        &mut self,
        keys: &[K],
        stores: &mut [S],
        token: &[u8],
        mode: Mode,
        (fence, value): (i64, Option<&[u8]>),
        ttl_ms: i64,
        min_fence: i64,
        now: Now,
    ) -> Result<i64, LockError> {
        let now_ms = now.mono_ms();
        let deadline_ms = lock::deadline(now_ms, ttl_ms)?;
        let raised = match min_fence > fence {
            true => Some(lock::raised_fence(
                &mut self.fences,
                min_fence,
                now.wall_us,
            )?),
            false => None,
        };
        for (key, store) in keys.iter().zip(stores.iter_mut()) {
            let mut ledger = self.ledger(key, store, now_ms);
            lock::renew_holder(&mut ledger, token, mode, raised, value, deadline_ms, now_ms)?;
            // A downgrade lets the readers in line in now.
            let check_at_ms = match mode.is_shared() {
                true => now_ms,
                false => deadline_ms,
            };
            self.waiters.schedule(key, check_at_ms);
        }
        Ok(raised.unwrap_or(fence))
    }

    /// Queues a client the glue blocked on a [`WaitTicket`].
    pub fn enqueue(&mut self, ticket: WaitTicket<K>, client: C) -> Result<(), LockError> {
        let request = Request {
            token: &ticket.token,
            value: ticket.value.as_deref(),
            mode: ticket.mode,
            ttl_ms: ticket.ttl_ms,
            timeout_ms: ticket.timeout_ms,
            min_fence: ticket.min_fence,
        };
        self.waiters
            .enqueue_all(
                ticket.key,
                ticket.also,
                client,
                request,
                ticket.since_us,
                ticket.check_at_ms,
                usize::MAX,
            )
            .map(|_| ())
    }
}

/// An ACQUIRE's (or ACQUIREALL's) MINFENCE n (0: none) within its bound.
#[inline]
pub(super) fn check_requested_min_fence(min_fence: i64, now: Now) -> Result<(), LockError> {
    if min_fence > 0 && fence::check_min_fence(min_fence, now.wall_us).is_err() {
        return Err(LockError::MinFenceTooLarge(format!("'{min_fence}'")));
    }
    Ok(())
}

/// Whether a request fits every one of its keys (see [`fit_all`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AllFit {
    /// The token holds every key under one grant: this fence.
    Renews(i64),
    /// A new holder fits every key.
    Fits,
    /// Not now.
    Busy,
}

/// `token` asking for every key of `stores` in `mode` (`LOCK.ACQUIREALL`):
/// each key as [`lock::fit`] decides it, the first error (in the order the
/// keys were named) refusing the whole. A key the token holds apart from
/// the others (another grant's fence, or only some of the keys) is busy
/// for it until that lease ends. `busy(i, until)` hears of each key `i`
/// that does not fit and when to look at it again.
#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub(super) fn fit_all<S: LockRead>(
    stores: &[S],
    token: &[u8],
    mode: Mode,
    rules: lock::Rules,
    now_ms: i64,
    mut busy: impl FnMut(usize, i64),
) -> Result<AllFit, LockError> {
    // One key (every ACQUIRE and one-key waiter): its fit is the answer,
    // with nothing to collect.
    if let [store] = stores {
        return Ok(match lock::fit(store, token, mode, rules, now_ms)? {
            Fit::Fits => AllFit::Fits,
            Fit::Busy(until) => {
                busy(0, until);
                AllFit::Busy
            }
            Fit::Renews => match lock::holder_of(store, token, now_ms) {
                Some(own) => AllFit::Renews(own.fence),
                None => return Err(LockError::Internal),
            },
        });
    }
    let mut fits = Vec::with_capacity(stores.len());
    for store in stores {
        fits.push(lock::fit(store, token, mode, rules, now_ms)?);
    }
    let own = |s: &S| lock::holder_of(s, token, now_ms).map(|l| (l.fence, l.deadline_ms));
    if let Some((fence, _)) = stores.first().and_then(own) {
        let one_grant = stores
            .iter()
            .zip(&fits)
            .all(|(s, fit)| *fit == Fit::Renews && own(s).is_some_and(|(f, _)| f == fence));
        if one_grant {
            return Ok(AllFit::Renews(fence));
        }
    }
    let mut all_fit = true;
    for (i, (store, fit)) in stores.iter().zip(&fits).enumerate() {
        let until = match fit {
            Fit::Fits => continue,
            Fit::Busy(until) => *until,
            Fit::Renews => own(store).map_or(now_ms, |(_, deadline_ms)| deadline_ms),
        };
        all_fit = false;
        busy(i, until);
    }
    Ok(match all_fit {
        true => AllFit::Fits,
        false => AllFit::Busy,
    })
}
