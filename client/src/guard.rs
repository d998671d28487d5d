//! A held lock: its fencing token and validity, renewal, and release.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use redis_lock_core::protocol::command;

use crate::clock::boot_now;
use crate::error::Result;
use crate::group::Group;
use crate::keys::Keys;

/// What the holder needs while it works: cheap to clone and to pass to
/// other tasks.
#[derive(Clone)]
pub struct Lease {
    shared: Arc<Shared>,
    /// The nodes that granted it (set by its guard): where
    /// [`exec`](Lease::exec) runs.
    group: Option<Arc<Group>>,
}

/// Without the token: it is the holder's credential, not for logs.
impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("keys", &self.keys())
            .field("fence", &self.fence())
            .field("ttl", &self.ttl())
            .field("valid", &self.is_valid())
            .field("lost", &self.lost().is_cancelled())
            .finish_non_exhaustive()
    }
}

struct Shared {
    keys: Keys,
    token: String,
    fence: i64,
    /// The TTL of the last grant or extend and the validity it gave: set
    /// together, so the renewals follow a manual extend's TTL. Kept here
    /// alone; the keeper and any [`ValidityWatch`] hear of each change
    /// from it (no copy is kept in step by polling).
    term: watch::Sender<Term>,
    /// Held from sending an EXTEND until its term is set, by a renewal or
    /// a manual extend: the last one sent is the one the nodes keep, and
    /// so the one whose term stands here.
    extending: tokio::sync::Mutex<()>,
    lost: LostSignal,
}

/// Fires once when a lock is lost ([`Lease::lost`]). Its holders can await
/// it and read it, not fire it: the guard alone decides that the lock is
/// lost (a reader that could fire it would make the guard say "lost"
/// while its keeper renewed on).
///
/// ```compile_fail
/// # fn demo(lease: redis_lock_client::Lease) {
/// lease.lost().cancel(); // no such method: only the guard fires it
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct LostSignal(CancellationToken);

impl LostSignal {
    /// Completes when the lock is lost (at once if it already is).
    pub fn cancelled(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.0.cancelled()
    }

    /// [`cancelled`](Self::cancelled) that owns a clone of the signal, for
    /// a task or a struct that keeps it.
    pub fn cancelled_owned(self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.0.cancelled_owned()
    }

    /// Whether the lock is known lost.
    pub fn is_cancelled(&self) -> bool {
        self.0.is_cancelled()
    }

    /// A token cancelled when the lock is lost, for code that takes a
    /// `CancellationToken`; cancelling it does not fire this signal.
    pub fn child_token(&self) -> CancellationToken {
        self.0.child_token()
    }

    fn fire(&self) {
        self.0.cancel();
    }
}

#[derive(Debug, Clone, Copy)]
struct Term {
    ttl: Duration,
    valid_until: Deadline,
    /// When the grant or extend was answered.
    since: Instant,
}

/// The validity deadline on two clocks: tokio's (CLOCK_MONOTONIC, for
/// timers) and CLOCK_BOOTTIME, which also counts the time the machine was
/// suspended (a laptop lid, a paused VM): CLOCK_MONOTONIC stops then, so
/// after a resume it alone would call a lease valid that ended long ago.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    monotonic: Instant,
    boot: Duration,
}

impl Deadline {
    fn new(at: Instant) -> Deadline {
        Deadline {
            monotonic: at,
            boot: boot_now() + at.saturating_duration_since(Instant::now()),
        }
    }

    /// Whether either clock has reached its deadline.
    fn passed(&self) -> bool {
        Instant::now() >= self.monotonic || boot_now() >= self.boot
    }

    /// The earlier of the two, as a tokio instant.
    fn effective(&self) -> Instant {
        let now = Instant::now();
        let boot_left = self.boot.saturating_sub(boot_now());
        self.monotonic.min(now + boot_left)
    }
}

impl Lease {
    pub(crate) fn new(
        keys: &Keys,
        token: &str,
        fence: i64,
        ttl: Duration,
        valid_until: Instant,
    ) -> Lease {
        Lease {
            shared: Arc::new(Shared {
                keys: keys.clone(),
                token: token.into(),
                fence,
                term: watch::Sender::new(Term {
                    ttl,
                    valid_until: Deadline::new(valid_until),
                    since: Instant::now(),
                }),
                extending: tokio::sync::Mutex::new(()),
                lost: LostSignal::default(),
            }),
            group: None,
        }
    }

    /// The locked key (the first one named, for a lock of several keys:
    /// each has the same holder and fence).
    pub fn key(&self) -> &str {
        self.shared.keys.first()
    }

    /// Every key of the lock (one, or several taken all or nothing).
    pub fn keys(&self) -> &Keys {
        &self.shared.keys
    }

    /// The token identifying this holder (the credential for release and extend).
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The fencing token: send it with every write to the protected
    /// resource, which must reject a token lower than one it has seen.
    pub fn fence(&self) -> i64 {
        self.shared.fence
    }

    /// The TTL of the grant or of the last extend (renewals use it).
    pub fn ttl(&self) -> Duration {
        self.term().ttl
    }

    /// Until when the lock is surely held (the TTL less the time the
    /// acquisition or last renewal took and the allowed clock drift),
    /// counting time the machine was suspended.
    pub fn valid_until(&self) -> Instant {
        self.term().valid_until.effective()
    }

    /// The same deadline on CLOCK_BOOTTIME ([`boot_clock`](crate::boot_clock)),
    /// which counts system suspend: it moves only when the lock is renewed
    /// or extended. For a watchdog in another process (`redis-lock run`'s
    /// sentry) that must act on the lease's end even if this one stops.
    pub fn valid_until_boot(&self) -> Duration {
        self.term().valid_until.boot
    }

    /// Hears of every renewal and extend of this lease as it is made (the
    /// validity moved), for a holder that forwards the deadline elsewhere.
    pub fn validity_watch(&self) -> ValidityWatch {
        let mut changes = self.shared.term.subscribe();
        changes.mark_unchanged();
        ValidityWatch { changes }
    }

    /// A grant or extend for `ttl` made the lock valid until `at`.
    pub(crate) fn set_term(&self, ttl: Duration, at: Instant) {
        self.shared.term.send_replace(Term {
            ttl,
            valid_until: Deadline::new(at),
            since: Instant::now(),
        });
    }

    fn term(&self) -> Term {
        *self.shared.term.borrow()
    }

    /// Fires when the lock is lost: a renewal was refused, or one failed
    /// with too little validity left for another attempt (retry pause plus
    /// twice the node timeout), or the validity deadline passed without a renewal. Await
    /// `lost().cancelled()` or poll `lost().is_cancelled()`.
    pub fn lost(&self) -> &LostSignal {
        &self.shared.lost
    }

    /// Held and within its validity.
    pub fn is_valid(&self) -> bool {
        !self.shared.lost.is_cancelled() && !self.deadline().passed()
    }

    fn deadline(&self) -> Deadline {
        self.term().valid_until
    }

    /// `cmd` guarded by this grant on the lock's own node: `LOCK.EXEC key
    /// token FENCE fence cmd...`, which runs `cmd` only while this grant
    /// holds the lock there. [`LockGuard::exec`] sends it; build it here
    /// to send it yourself (in a pipeline, say). A lock of several keys is
    /// checked on its first key (every key has the same holder and fence).
    pub fn exec_cmd(&self, cmd: &redis::Cmd) -> redis::Cmd {
        let mut guarded = redis::cmd(command::EXEC);
        guarded
            .arg(self.key())
            .arg(self.token())
            .arg(command::FENCE_WORD)
            .arg(self.fence());
        append_args(&mut guarded, cmd);
        guarded
    }

    /// Runs `cmd` on the lock's node only while this grant holds the lock
    /// there, checked and run in one step by the server (`LOCK.EXEC ...
    /// FENCE fence`): `cmd`'s reply, or [`Error::NotHeld`](crate::Error::NotHeld)
    /// when the lease has ended or another holder has the lock (nothing
    /// ran). For locks on one node (a Sentinel or cluster URL counts as
    /// one); a Redlock group's lock guards its data with a fence gate
    /// instead ([`Lease::fenced`]). Sent once, never retried: the reply of
    /// a write that timed out is unknown (`Error::Timeout`); the wait for
    /// it lasts the lease's validity, and at least the node timeout. The
    /// same as [`LockGuard::exec`]: a lease handed to a task (or to
    /// `with_lock`'s closure) writes as its guard does.
    pub async fn exec<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        let Some(group) = &self.group else {
            return Err(crate::Error::Config(
                "this lease has no guard: exec runs through the lock's client".into(),
            ));
        };
        let [node] = group.nodes.as_slice() else {
            return Err(crate::Error::Config(format!(
                "exec runs on the lock's node: this lock is held on a group of {} nodes; use a fence gate (Lease::fenced) for their data",
                group.nodes.len()
            )));
        };
        let limit = self
            .valid_until()
            .saturating_duration_since(Instant::now())
            .max(group.node_timeout(self.ttl()));
        node.send_once(self.exec_cmd(cmd), limit).await
    }

    /// `cmd` behind the fence gate `gate`: `LOCK.FENCED gate fence cmd...`,
    /// which runs `cmd` only if this grant's fence is at least the highest
    /// the gate has accepted, and records it. For data on any Redis node
    /// with the module (not necessarily the lock's: a Redlock group's lock
    /// guards data elsewhere this way). Keep `gate` in the same cluster
    /// slot as `cmd`'s keys (a hash tag).
    pub fn fenced_cmd(&self, gate: &str, cmd: &redis::Cmd) -> redis::Cmd {
        let mut guarded = redis::cmd(command::FENCED);
        guarded.arg(gate).arg(self.fence());
        append_args(&mut guarded, cmd);
        guarded
    }

    /// Sends [`fenced_cmd`](Self::fenced_cmd) on `conn`: `cmd`'s reply, or
    /// [`Error::StaleFence`](crate::Error::StaleFence) when a later holder
    /// has written (nothing ran). Sent once: a write is never repeated.
    pub async fn fenced<T, C>(&self, conn: &mut C, gate: &str, cmd: &redis::Cmd) -> Result<T>
    where
        T: redis::FromRedisValue,
        C: redis::aio::ConnectionLike + Send,
    {
        Ok(self.fenced_cmd(gate, cmd).query_async(conn).await?)
    }
}

/// Appends every argument of `cmd` (its name first) to `to`.
fn append_args(to: &mut redis::Cmd, cmd: &redis::Cmd) {
    for arg in cmd.args_iter() {
        if let redis::Arg::Simple(bytes) = arg {
            to.arg(bytes);
        }
    }
}

/// Hears of each change of a lease's validity: [`Lease::validity_watch`].
#[derive(Debug)]
pub struct ValidityWatch {
    changes: watch::Receiver<Term>,
}

impl ValidityWatch {
    /// Resolves once the lease was renewed or extended since the watch was
    /// made or this last resolved; never, once the lease is gone.
    /// Cancel-safe (a `select!` branch loses no change).
    pub async fn changed(&mut self) {
        if self.changes.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// A held lock. Release it with [`release`](LockGuard::release). Dropping
/// it releases it too, before `drop` returns, over fresh connections (the
/// thread blocks for a round trip or two: connecting, then the command,
/// at most twice the node timeout): so a guard dropped as `#[tokio::main]`
/// returns (the `?` in `main`) is released, not left for its TTL. (A
/// Sentinel node whose master is being asked for again at that moment is
/// skipped: its lease ends by itself.) In async code prefer `release().await`,
/// which does not block the thread.
pub struct LockGuard {
    group: Arc<Group>,
    lease: Lease,
    keeper: Option<Keeper>,
}

/// The background task that renews the lock (or, without renewal, only
/// watches its validity deadline) and fires `lost`.
struct Keeper {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("lease", &self.lease)
            .field("renewing", &self.keeper.is_some())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    pub(crate) fn new(group: Arc<Group>, mut lease: Lease, renew: bool) -> LockGuard {
        lease.group = Some(group.clone());
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep(group.clone(), lease.clone(), stop.clone(), renew));
        LockGuard {
            group,
            lease,
            keeper: Some(Keeper { stop, task }),
        }
    }

    /// A cloneable view for other tasks. (The guard also reads as its
    /// [`Lease`]: `guard.fence()`, `guard.lost()`, ... are the lease's.)
    pub fn lease(&self) -> Lease {
        self.lease.clone()
    }

    /// Sets the lease to `ttl` from now (on a majority, within validity);
    /// later renewals use this TTL. Ok(false): the lock was lost, and
    /// `lost` fires. Once `lost` has fired the guard stays lost: an extend
    /// then asks no node and answers Ok(false) (acquire again instead).
    pub async fn extend(&self, ttl: Duration) -> Result<bool> {
        self.extend_with(ttl, None).await
    }

    /// [`extend`](Self::extend), and the holder's public value is `value`
    /// from now on on every node that extends (`LOCK.EXTEND ... VALUE`, a
    /// proclaim: observers are told). Ok(false): the lock was lost, as for
    /// `extend`; nothing is granted anew.
    pub async fn proclaim(&self, value: &str, ttl: Duration) -> Result<bool> {
        self.extend_with(ttl, Some(value)).await
    }

    async fn extend_with(&self, ttl: Duration, value: Option<&str>) -> Result<bool> {
        let lease = &self.lease;
        let _turn = lease.shared.extending.lock().await;
        if lease.lost().is_cancelled() {
            return Ok(false);
        }
        let until = lease.valid_until();
        match self
            .group
            .extend_everywhere(lease.keys(), (lease.token(), value), ttl, until)
            .await?
        {
            // Lost meanwhile (the keeper gave up during this round trip):
            // the guard stays lost.
            Some(_) if lease.lost().is_cancelled() => Ok(false),
            Some(until) => {
                lease.set_term(ttl, until);
                Ok(true)
            }
            None => {
                lost(lease, "an extend was refused");
                Ok(false)
            }
        }
    }

    /// Runs `cmd` on the lock's node only while this grant holds the lock
    /// there: [`Lease::exec`].
    pub async fn exec<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        self.lease.exec(cmd).await
    }

    /// Stops renewing, then releases on every node. True if the lock was
    /// still held (on a majority) and is now released; false if a majority
    /// answered that it was not held; an error if fewer than a majority
    /// answered (the nodes that did are released either way).
    pub async fn release(mut self) -> Result<bool> {
        // Wait for a renewal in flight to finish first, so that no renewal
        // can reach a node after the release (and resurrect the lease).
        if let Some(keeper) = self.keeper.take() {
            keeper.stop.cancel();
            let _ = keeper.task.await;
        }
        let lease = &self.lease;
        let outcome = self
            .group
            .release_counted(lease.keys(), lease.token(), lease.ttl())
            .await;
        tracing::debug!(
            key = &*lease.keys().name(),
            fence = lease.fence(),
            released = outcome.released,
            answered = outcome.answered,
            "lock released"
        );
        outcome.held(self.group.quorum())
    }
}

/// One set of getters: a guard reads as its lease.
impl std::ops::Deref for LockGuard {
    type Target = Lease;
    fn deref(&self) -> &Lease {
        &self.lease
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(keeper) = self.keeper.take() else {
            return; // released
        };
        keeper.stop.cancel();
        // A renewal in flight is LOCK.EXTEND, which never revives a
        // released lock, so the release need not wait for it. Not spawned
        // on the runtime: one that is shutting down would never run it.
        keeper.task.abort();
        let lease = &self.lease;
        let released =
            self.group
                .release_everywhere_blocking(lease.keys(), lease.token(), lease.ttl());
        tracing::debug!(
            key = &*lease.keys().name(),
            fence = lease.fence(),
            released,
            "lock released on drop"
        );
    }
}

/// Fires `lost` and says why.
fn lost(lease: &Lease, why: &str) {
    tracing::warn!(
        key = &*lease.keys().name(),
        fence = lease.fence(),
        why,
        "lock lost"
    );
    lease.shared.lost.fire();
}

/// Renews at about a third of the TTL (if `renew`), and fires `lost` when a
/// renewal is refused or the validity deadline passes without one.
async fn keep(group: Arc<Group>, lease: Lease, stop: CancellationToken, renew: bool) {
    let mut changes = lease.shared.term.subscribe();
    loop {
        // Read afresh each time: a manual extend may have changed the term.
        let term = *changes.borrow_and_update();
        let ttl = term.ttl;
        let valid_until = lease.valid_until();
        // Due a third of the TTL after the last grant or extend, whoever
        // made it.
        let renew_at = term.since + ttl / 3;
        // At least once a second: tokio's clock stops during a system
        // suspend, so a deadline passed while suspended is noticed here.
        let soon = Instant::now() + Duration::from_secs(1);
        let wake = if renew {
            renew_at.min(valid_until)
        } else {
            valid_until
        }
        .min(soon);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(wake) => {}
            _ = changes.changed() => continue,
        }
        if lease.deadline().passed() {
            lost(&lease, "its validity ran out without a renewal");
            return;
        }
        if !renew || Instant::now() < renew_at {
            continue; // not due
        }
        // A manual extend in flight holds the turn; the deadline is still
        // watched meanwhile (that extend may fail, and the holder must hear
        // of the loss when the validity ends, not when it returns).
        let _turn = tokio::select! {
            turn = lease.shared.extending.lock() => turn,
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(valid_until) => continue,
        };
        if lease.term().since != term.since {
            continue; // extended meanwhile by hand: due later
        }
        let renewal =
            group.extend_everywhere(lease.keys(), (lease.token(), None), ttl, valid_until);
        tokio::select! {
            result = renewal => match result {
                Ok(Some(until)) => {
                    lease.set_term(ttl, until);
                    tracing::trace!(key = &*lease.keys().name(), fence = lease.fence(), "lock renewed");
                }
                Ok(None) => {
                    lost(&lease, "a renewal was refused");
                    return;
                }
                // Nodes unreachable: try again soon, if another attempt
                // can still finish within the validity; otherwise the lock
                // cannot be kept, and the holder hears it now rather than
                // when the validity runs out.
                Err(e) => {
                    let retry = (ttl / 10).max(Duration::from_millis(5));
                    // A node call may take the node timeout twice: to
                    // connect, then to answer.
                    let attempt = retry + 2 * group.node_timeout(ttl);
                    tracing::warn!(key = &*lease.keys().name(), error = %e, "lock renewal failed");
                    if Instant::now() + attempt >= lease.valid_until() {
                        lost(&lease, "renewals failed and no retry can finish within the validity");
                        return;
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(retry) => {}
                    }
                }
            },
            _ = tokio::time::sleep_until(valid_until) => {
                lost(&lease, "a renewal was still in flight when the validity ran out");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Sent, SUSPENDED_MS};

    /// The pretended suspend is one static: its tests take turns.
    static PRETEND_SUSPEND: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A suspend longer than the validity ends it, though tokio's clock
    /// (CLOCK_MONOTONIC) did not move: `is_valid` and `valid_until` count
    /// CLOCK_BOOTTIME too.
    #[test]
    fn a_suspend_longer_than_the_validity_ends_it() {
        let _one_at_a_time = PRETEND_SUSPEND.lock().unwrap_or_else(|p| p.into_inner());
        let lease = Lease::new(
            &Keys::from("k"),
            "t",
            1,
            Duration::from_secs(30),
            Instant::now() + Duration::from_secs(10),
        );
        assert!(lease.is_valid());
        SUSPENDED_MS.store(20_000, std::sync::atomic::Ordering::Relaxed);
        let after = lease.is_valid();
        let until = lease.valid_until();
        SUSPENDED_MS.store(0, std::sync::atomic::Ordering::Relaxed);
        assert!(!after, "valid after a 20 s suspend of a 10 s validity");
        assert!(until <= Instant::now());
        assert!(lease.is_valid(), "without the suspend it is valid again");
    }

    /// A suspend while a request is in flight (granted meanwhile, answered
    /// after the resume) is taken off the validity measured from the
    /// request: before, the grant counted as valid for its whole TTL though
    /// the node's lease had run on through the suspend.
    #[test]
    fn a_suspend_during_a_request_shortens_its_validity() {
        let _one_at_a_time = PRETEND_SUSPEND.lock().unwrap_or_else(|p| p.into_inner());
        let sent = Sent::now();
        SUSPENDED_MS.store(20_000, std::sync::atomic::Ordering::Relaxed);
        let until = sent.plus(Duration::from_secs(10));
        let elapsed = sent.elapsed();
        SUSPENDED_MS.store(0, std::sync::atomic::Ordering::Relaxed);
        assert!(until <= Instant::now(), "valid after a 20 s suspend");
        assert!(elapsed >= Duration::from_secs(20), "{elapsed:?}");
        let lease = Lease::new(&Keys::from("k"), "t", 1, Duration::from_secs(30), until);
        assert!(!lease.is_valid());
        let sent = Sent::now();
        let until = sent.plus(Duration::from_secs(10));
        assert!(until > Instant::now() + Duration::from_secs(9));
    }

    /// Issue 22: the lease publishes each change of its validity (the
    /// `redis-lock run` sentry was sent a copy on a polling tick).
    #[tokio::test]
    async fn every_change_of_the_validity_is_heard_at_once() {
        let lease = Lease::new(
            &Keys::from("k"),
            "t",
            1,
            Duration::from_secs(30),
            Instant::now() + Duration::from_secs(10),
        );
        let mut watch = lease.validity_watch();
        let before = lease.valid_until_boot();
        let not_yet = tokio::time::timeout(Duration::from_millis(20), watch.changed()).await;
        assert!(not_yet.is_err(), "nothing changed yet");
        lease.set_term(
            Duration::from_secs(30),
            Instant::now() + Duration::from_secs(20),
        );
        tokio::time::timeout(Duration::from_secs(5), watch.changed())
            .await
            .expect("the renewal is heard");
        let after = lease.valid_until_boot();
        assert!(
            after >= before + Duration::from_secs(9),
            "{before:?} -> {after:?}"
        );
        assert!(after <= crate::boot_clock() + Duration::from_secs(21));
    }
}
