//! What the node decided for waiters, carried out: each gets its one reply
//! (through `blocked`), with its counters and, for grants, the keyspace
//! event; and whether a waiter's user may still take the lock when its turn
//! comes (asked of ACL).

use super::blocked;
use super::engine::with_engine;
use super::ffi::{lock_events, notify_lock_event, Ctx, RString};
use super::node::{self, count, Client, STATS};
use super::timer;
use crate::core::error::LockError;
use crate::core::node::Admission;
use crate::core::Outcome;

/// Whether a waiter's user may still run LOCK.ACQUIRE on the key `name`
/// (asked of ACL when its turn comes).
pub struct WaiterAcl {
    pub ctx: Ctx,
    pub name: RString,
}

impl Admission<Client> for WaiterAcl {
    fn may_take(&mut self, client: Client) -> bool {
        blocked::may_take(self.ctx, client, self.name)
    }
}

/// Carries out what the node decided for waiters: each gets its one reply
/// (through `blocked`), with its counters and, for grants, the keyspace
/// event on the granted key: `command_key`, the key of the command that
/// settled it (in its client's db), or, from the timer (None), each wake's
/// own key in its db, selected on the timer's context.
pub fn deliver_wakes(ctx: Ctx, command_key: Option<RString>) {
    let (wakes, next_wakeup) = with_engine(|n| {
        let wakes: Vec<_> = std::iter::from_fn(|| n.poll_wake()).collect();
        (wakes, n.next_wakeup())
    });
    for wake in wakes {
        let grant = match wake.outcome {
            Outcome::Granted { renewed, .. } => {
                if renewed {
                    count(&STATS.extends);
                } else {
                    count(&STATS.grants);
                    count(&STATS.handoffs);
                    node::record_wait(wake.waited_us);
                }
                let event = match renewed {
                    true => lock_events::EXTEND,
                    false => lock_events::HANDOFF,
                };
                match command_key {
                    Some(name) => notify_lock_event(ctx, event, name),
                    None => {
                        node::in_db(ctx, &wake.key, |name| notify_lock_event(ctx, event, name));
                    }
                }
                true
            }
            Outcome::TimedOut => {
                count(&STATS.block_timeouts);
                false
            }
            Outcome::Failed(LockError::Redirect(_)) => {
                count(&STATS.redirects);
                false
            }
            Outcome::Failed(_) => false,
        };
        let key = grant.then_some(wake.key);
        blocked::answer(wake.client, wake.outcome, key);
    }
    // Answering queues nothing for the node (an undelivered grant goes
    // through the timer's inbox, which arms the timer itself).
    timer::arm_for(next_wakeup);
}
