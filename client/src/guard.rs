//! A held lock: its fencing token and validity, renewal, and release.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::LockClient;
use crate::error::Result;

/// What the holder needs while it works: cheap to clone and to pass to
/// other tasks.
#[derive(Clone, Debug)]
pub struct Lease {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    key: String,
    token: String,
    fence: i64,
    ttl: Duration,
    valid_until: Mutex<Instant>,
    lost: CancellationToken,
}

impl Lease {
    pub(crate) fn new(
        key: &str,
        token: &str,
        fence: i64,
        ttl: Duration,
        valid_until: Instant,
    ) -> Lease {
        Lease {
            shared: Arc::new(Shared {
                key: key.into(),
                token: token.into(),
                fence,
                ttl,
                valid_until: Mutex::new(valid_until),
                lost: CancellationToken::new(),
            }),
        }
    }

    pub fn key(&self) -> &str {
        &self.shared.key
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

    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// Until when the lock is surely held (the TTL less the time the
    /// acquisition or last renewal took and the allowed clock drift).
    pub fn valid_until(&self) -> Instant {
        *self
            .shared
            .valid_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_valid_until(&self, at: Instant) {
        *self
            .shared
            .valid_until
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = at;
    }

    /// Fires when the lock is lost: a renewal was refused, or one failed
    /// with too little validity left for another attempt (retry pause plus
    /// node timeout), or the validity deadline passed without a renewal. Await
    /// `lost().cancelled()` or poll `lost().is_cancelled()`.
    pub fn lost(&self) -> &CancellationToken {
        &self.shared.lost
    }

    /// Held and within its validity.
    pub fn is_valid(&self) -> bool {
        !self.shared.lost.is_cancelled() && Instant::now() < self.valid_until()
    }
}

/// A held lock. Release it with [`release`](LockGuard::release). Dropping
/// it releases it too, before `drop` returns, over fresh connections (the
/// thread blocks for a round trip or two, at most the node timeout): so a
/// guard dropped as `#[tokio::main]` returns (the `?` in `main`) is
/// released, not left for its TTL. In async code prefer `release().await`,
/// which does not block the thread.
pub struct LockGuard {
    client: LockClient,
    lease: Lease,
    keeper: Option<Keeper>,
}

/// The background task that renews the lock (or, without renewal, only
/// watches its validity deadline) and fires `lost`.
struct Keeper {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl LockGuard {
    pub(crate) fn new(client: LockClient, lease: Lease, renew: bool) -> LockGuard {
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep(client.clone(), lease.clone(), stop.clone(), renew));
        LockGuard {
            client,
            lease,
            keeper: Some(Keeper { stop, task }),
        }
    }

    pub fn key(&self) -> &str {
        self.lease.key()
    }

    pub fn token(&self) -> &str {
        self.lease.token()
    }

    pub fn fence(&self) -> i64 {
        self.lease.fence()
    }

    pub fn valid_until(&self) -> Instant {
        self.lease.valid_until()
    }

    /// See [`Lease::lost`]; clone it to hand it to another task.
    pub fn lost(&self) -> &CancellationToken {
        self.lease.lost()
    }

    pub fn is_valid(&self) -> bool {
        self.lease.is_valid()
    }

    /// A cloneable view for other tasks.
    pub fn lease(&self) -> Lease {
        self.lease.clone()
    }

    /// Sets the lease to `ttl` from now (on a majority, within validity).
    /// Ok(false): the lock was lost, and `lost` fires.
    pub async fn extend(&self, ttl: Duration) -> Result<bool> {
        let lease = &self.lease;
        match self
            .client
            .extend_everywhere(lease.key(), lease.token(), ttl, lease.valid_until())
            .await?
        {
            Some(until) => {
                lease.set_valid_until(until);
                Ok(true)
            }
            None => {
                lease.shared.lost.cancel();
                Ok(false)
            }
        }
    }

    /// Stops renewing, then releases on every node. True if the lock was
    /// still held (on a majority) and is now released.
    pub async fn release(mut self) -> Result<bool> {
        // Wait for a renewal in flight to finish first, so that no renewal
        // can reach a node after the release (and resurrect the lease).
        if let Some(keeper) = self.keeper.take() {
            keeper.stop.cancel();
            let _ = keeper.task.await;
        }
        let lease = &self.lease;
        let released = self
            .client
            .release_everywhere(lease.key(), lease.token(), lease.ttl())
            .await;
        Ok(released >= self.client.quorum())
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
        self.client
            .release_everywhere_blocking(lease.key(), lease.token(), lease.ttl());
    }
}

/// Renews at about a third of the TTL (if `renew`), and fires `lost` when a
/// renewal is refused or the validity deadline passes without one.
async fn keep(client: LockClient, lease: Lease, stop: CancellationToken, renew: bool) {
    let ttl = lease.ttl();
    loop {
        let valid_until = lease.valid_until();
        let wake = if renew {
            (Instant::now() + ttl / 3).min(valid_until)
        } else {
            valid_until
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(wake) => {}
        }
        if Instant::now() >= lease.valid_until() {
            lease.shared.lost.cancel();
            return;
        }
        if !renew {
            continue; // extended meanwhile by hand
        }
        let renewal = client.extend_everywhere(lease.key(), lease.token(), ttl, valid_until);
        tokio::select! {
            result = renewal => match result {
                Ok(Some(until)) => lease.set_valid_until(until),
                Ok(None) => {
                    lease.shared.lost.cancel();
                    return;
                }
                // Nodes unreachable: try again soon, if another attempt
                // can still finish within the validity; otherwise the lock
                // cannot be kept, and the holder hears it now rather than
                // when the validity runs out.
                Err(_) => {
                    let retry = (ttl / 10).max(Duration::from_millis(5));
                    let attempt = retry + client.node_timeout(ttl);
                    if Instant::now() + attempt >= lease.valid_until() {
                        lease.shared.lost.cancel();
                        return;
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(retry) => {}
                    }
                }
            },
            _ = tokio::time::sleep_until(valid_until) => {
                lease.shared.lost.cancel();
                return;
            }
        }
    }
}
