//! What the node decided, carried out. One entry into the engine makes a
//! decision and takes everything it queued ([`decide`]); then, outside the
//! engine, [`carry_out`] executes it in order: each waiter gets its one
//! reply (through `blocked`), each changed key is replicated as it is now
//! (one holder of a shared key alone, when only that holder changed),
//! each keyspace event is emitted and each statistic counted. Nothing here
//! decides what happens: that is `core::node`'s, as `core::output` data.
//! Also whether a waiter's user may still take the lock when its turn
//! comes (asked of ACL).

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::{Mutex, TryLockError};

mod route;
#[cfg(test)]
mod tests;

use super::blocked;
use super::engine::{self, Client, Key};
use super::ffi::{self, notify_lock_event, Ctx, RString};
use super::keyspace::{self, LockKey, ReadKey};
use super::server::{self, count, STATS};
use super::timer;
use crate::core::node::{Admission, Node};
use crate::core::output::{Event, Output, Stat};
use crate::core::time::Now;
use crate::core::Outcome;
use crate::core::Wake;
use route::{At, Effects, Shape};

/// Whether a waiter's user may still run LOCK.ACQUIRE on the key `name`,
/// or an observer's LOCK.OBSERVE (asked of ACL when its turn comes).
pub struct WaiterAcl {
    pub ctx: Ctx,
    pub name: RString,
}

impl Admission<Client> for WaiterAcl {
    fn may_take(&mut self, client: Client) -> bool {
        blocked::may_take(self.ctx, client, self.name)
    }

    fn may_observe(&mut self, client: Client) -> bool {
        blocked::may_observe(self.ctx, client, self.name)
    }
}

/// Everything one entry into the node queued, and when its timer must run
/// next: taken in the same entry as the decision.
pub struct Decided {
    outputs: VecDeque<Output<Key, Client>>,
    next_wakeup: Option<i64>,
}

/// The buffer outputs are swapped into, kept between entries so a command
/// allocates none.
static SPARE: Mutex<VecDeque<Output<Key, Client>>> = Mutex::new(VecDeque::new());

/// The largest buffer kept as [`SPARE`] (outputs): a command's few fit.
const SPARE_MAX: usize = 256;

impl Drop for Decided {
    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Carrying out was cut short (a panic in a reply, a
            // replication or an event, caught at the entry point): what
            // is left (a waiter already out of its line and handed the
            // lock, among others) is carried out by the timer, at once,
            // rather than dropped. The output that panicked is not
            // retried, so a fault that always panics cannot loop.
            // (The timer's run arms it again for the node's next wake-up.)
            let left: Vec<_> = self.outputs.drain(..).collect();
            timer::queue(|inbox| inbox.outputs.extend(left));
            return;
        }
        self.outputs.clear();
        // A burst (a thousand timeouts in one timer run) leaves a large
        // buffer: not kept, so what the module holds between bursts does
        // not depend on how late a run came.
        if self.outputs.capacity() > SPARE_MAX {
            return;
        }
        if let Ok(mut spare) = SPARE.try_lock() {
            if spare.capacity() < self.outputs.capacity() {
                std::mem::swap(&mut *spare, &mut self.outputs);
            }
        }
    }
}

/// Runs `f` on the node and takes what it queued: the one entry into the
/// engine of a command, a timer run or a sweep step.
#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub fn decide<R>(f: impl FnOnce(&mut Node<Key, Client>) -> R) -> (R, Decided) {
    let mut outputs = match SPARE.try_lock() {
        Ok(mut spare) => std::mem::take(&mut *spare),
        Err(TryLockError::Poisoned(p)) => std::mem::take(&mut *p.into_inner()),
        Err(TryLockError::WouldBlock) => VecDeque::new(),
    };
    // Read at each entry: `notify-keyspace-events` can change at any time.
    let events = ffi::lock_events_on();
    let (result, next_wakeup) = engine::with_engine(|n| {
        n.set_events(events);
        let result = f(n);
        n.swap_outputs(&mut outputs);
        (result, n.next_wakeup())
    });
    (
        result,
        Decided {
            outputs,
            next_wakeup,
        },
    )
}

/// Outputs handed over without a decision (left by one cut short: see
/// `engine::with_engine`), to carry out from the timer.
pub fn leftover(outputs: Vec<Output<Key, Client>>) -> Decided {
    Decided {
        outputs: outputs.into(),
        next_wakeup: None,
    }
}

/// Where outputs are carried out.
pub enum Site<'a> {
    /// A command on its key `name` (in its client's db), open as `store`,
    /// deciding at `now` (read with `server::now`): every output of a
    /// command is about that key.
    Command {
        name: RString,
        store: &'a LockKey,
        now: Now,
    },
    /// A command on several keys (each in its client's db), `names[i]`
    /// open as `stores[i]`, deciding at `now`: every output is about one
    /// of them.
    Keys {
        keys: &'a [Key],
        names: &'a [RString],
        stores: &'a [LockKey],
        now: Now,
    },
    /// A command on a gate `name` (in its client's db): `LOCK.FENCED`.
    Gate { name: RString },
    /// The timer or the sweep, on its own context: each output's key is
    /// opened in its db, selected on that context.
    Background,
}

/// Carries out `decided`, in order, at `site` ([`route::execute`] routes
/// each output; [`Redis`] does it); then arms the timer for the node's
/// next wake-up.
#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub fn carry_out(ctx: Ctx, mut decided: Decided, site: Site<'_>) {
    let shape = match &site {
        Site::Command { .. } => Shape::Command,
        Site::Keys { keys, .. } => Shape::Keys(keys),
        Site::Gate { .. } => Shape::Gate,
        Site::Background => Shape::Background,
    };
    let mut redis = Redis {
        ctx,
        site: &site,
        now: Cell::new(None),
    };
    route::execute(&mut decided.outputs, shape, &mut redis);
    timer::arm_for(decided.next_wakeup);
}

/// The effects of outputs, on Redis, at a site.
struct Redis<'s, 'a> {
    ctx: Ctx,
    site: &'s Site<'a>,
    /// The conversion instant, read once, for the first key replicated (a
    /// command that only answers nil, or a server with no replica and no
    /// AOF, converts nothing).
    now: Cell<Option<Now>>,
}

impl Redis<'_, '_> {
    /// The instant a command decided at (the timer and the sweep read the
    /// clocks now), converted once.
    fn now(&self) -> Now {
        let decided_at = match self.site {
            Site::Command { now, .. } | Site::Keys { now, .. } => Some(*now),
            Site::Gate { .. } | Site::Background => None,
        };
        if let Some(now) = self.now.get() {
            return now;
        }
        let now = decided_at.map_or_else(server::conversion_now, server::conversion_at);
        self.now.set(Some(now));
        now
    }

    /// The key's name at `at`, for a call.
    fn with_name(&self, at: At<'_, Key>, f: impl FnOnce(RString)) {
        match (at, self.site) {
            (At::Command, Site::Command { name, .. }) | (At::Gate, Site::Gate { name }) => f(*name),
            (At::Nth(i), Site::Keys { names, .. }) => f(names[i]),
            (At::Found(key), _) => {
                server::in_db(self.ctx, key, f);
            }
            _ => {}
        }
    }

    /// The key's open store at `at`, when the command has it open.
    fn store(&self, at: At<'_, Key>) -> Option<&LockKey> {
        match (at, self.site) {
            (At::Command, Site::Command { store, .. }) => Some(store),
            (At::Nth(i), Site::Keys { stores, .. }) => Some(&stores[i]),
            _ => None,
        }
    }
}

impl Effects<Key, Client> for Redis<'_, '_> {
    fn answer(&mut self, wake: Wake<Key, Client>) {
        // A grant's keys and leases, so an undelivered one can be taken
        // back.
        let granted = match wake.outcome {
            Outcome::Granted { lease, .. } => std::iter::once((wake.key, lease))
                .chain(wake.also)
                .collect(),
            _ => Vec::new(),
        };
        blocked::answer(wake.client, wake.outcome, granted);
    }

    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    fn replicate(&mut self, at: At<'_, Key>) {
        let now = || self.now();
        match self.store(at) {
            Some(store) => store.replicate(now),
            None => {
                let ctx = self.ctx;
                self.with_name(at, |name| {
                    if let Ok(read) = ReadKey::open(ctx, name) {
                        keyspace::replicate(ctx, name, &read, now);
                    }
                });
            }
        }
    }

    fn replicate_holder(&mut self, at: At<'_, Key>, lease: u64) {
        let now = || self.now();
        match self.store(at) {
            Some(store) => store.replicate_holder(lease, now),
            None => {
                let ctx = self.ctx;
                self.with_name(at, |name| {
                    if let Ok(read) = ReadKey::open(ctx, name) {
                        keyspace::replicate_holder(ctx, name, &read, lease, now);
                    }
                });
            }
        }
    }

    fn replicate_drop(&mut self, at: At<'_, Key>, token: &[u8]) {
        match self.store(at) {
            Some(store) => store.replicate_drop(token),
            None => {
                let ctx = self.ctx;
                self.with_name(at, |name| keyspace::replicate_drop(ctx, name, token));
            }
        }
    }

    #[inline]
    fn notify(&mut self, at: At<'_, Key>, event: Event) {
        let ctx = self.ctx;
        self.with_name(at, |name| notify_lock_event(ctx, event.name(), name));
    }

    fn gate_raised(&mut self, at: At<'_, Key>, mark: i64) {
        // As any write of a key: WATCH and client-side caching see it;
        // then `LOCK._GATE`, after the command's own effect.
        let ctx = self.ctx;
        self.with_name(at, |name| {
            ffi::signal_modified_key(ctx, name);
            ffi::replicate_gate(ctx, name, mark);
        });
    }

    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    fn count(&mut self, stat: Stat) {
        count_stat(stat);
    }
}

#[inline(always)] // on every grant: part of one inlined path (callgrind)
fn count_stat(stat: Stat) {
    match stat {
        Stat::Grant => count(&STATS.grants),
        Stat::Contended => count(&STATS.contended),
        Stat::Release => count(&STATS.releases),
        Stat::Extend => count(&STATS.extends),
        Stat::Expiration { held_ms } => {
            count(&STATS.expirations);
            if let Some(held_ms) = held_ms {
                server::record_hold(held_ms);
            }
        }
        Stat::LetGo { held_ms } => {
            if let Some(held_ms) = held_ms {
                server::record_hold(held_ms);
            }
        }
        Stat::Handoff { waited_us } => {
            count(&STATS.handoffs);
            server::record_wait(waited_us);
        }
        Stat::BlockTimeout => count(&STATS.block_timeouts),
        Stat::TakeBack => count(&STATS.take_backs),
        Stat::RefusedEvictable => count(&STATS.refused_evictable),
        Stat::Redirect => count(&STATS.redirects),
        Stat::FencedRan => count(&STATS.fenced_ran),
        Stat::FencedStale => count(&STATS.fenced_stale),
        Stat::GatePutBack => count(&STATS.gates_put_back),
    }
}
