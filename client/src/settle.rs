//! Whether an acquisition is over, shared between the acquisition
//! (`client.rs`) and the tasks that run its ACQUIREs on connections of
//! their own (`node.rs`), so neither imports the other for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

tokio::task_local! {
    /// The acquisition being run (see [`Settle`]), for the tasks that run
    /// its ACQUIREs on connections of their own (`Node::acquire_waiting`).
    pub(crate) static SETTLE: Arc<Settle>;
}

/// Whether an acquisition is over, shared with the tasks that run its BLOCK
/// waits. A grant that reaches such a task when its own caller is gone (a
/// wait given up on while the acquisition goes on, or one that outlived its
/// patience) is released only once the acquisition is over: while it goes
/// on, a later ACQUIRE of it with the same token may count that very grant,
/// and releasing it would take a vote from under it. A grant left so is
/// noted, and released with the token if the acquisition ends without a
/// guard.
#[derive(Debug, Default)]
pub(crate) struct Settle {
    /// The acquisition ended (with any result) or was dropped.
    over: AtomicBool,
    /// A task left a late grant in place while the acquisition went on.
    left_a_grant: AtomicBool,
}

impl Settle {
    /// A late grant reached a task: whether to release it now (the
    /// acquisition is over) or leave it (noted) to the acquisition.
    pub(crate) fn release_late_grant(&self) -> bool {
        if self.over.load(Ordering::SeqCst) {
            return true;
        }
        self.left_a_grant.store(true, Ordering::SeqCst);
        // Ended meanwhile: it may not have seen the note.
        self.over.load(Ordering::SeqCst)
    }

    /// The acquisition ended (or was dropped): whether a late grant was
    /// left in place meanwhile (then it still holds the token somewhere).
    pub(crate) fn end(&self) -> bool {
        self.over.store(true, Ordering::SeqCst);
        self.left_a_grant.load(Ordering::SeqCst)
    }
}
