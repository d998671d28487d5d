//! `LockClient`: one node (waiting in the server with BLOCK) or Redlock
//! over N nodes (a majority, with quorum fencing).

use std::collections::HashMap;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use rand::Rng;
use tokio::time::Instant;

use crate::clock::{later_by, Sent};
use crate::error::{Error, Result};
use crate::group::Group;
use crate::guard::{Lease, LockGuard};
use crate::keys::Keys;
use crate::node::{LockInfo, Node};
use crate::node_settings::NodeSettings;
pub use crate::options::Options;
use crate::settle::{Settle, SETTLE};
use redis_lock_core::Mode;

/// A handle on one lock node or a Redlock group; cheap to clone.
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// The nodes, shared with every guard of this client.
    pub(crate) group: Arc<Group>,
    /// Redlock: keys whose ordering node recently refused this client, and when.
    pub(crate) contended: std::sync::Mutex<HashMap<Keys, Instant>>,
    /// Redlock: the largest token this client asked for in a first phase
    /// or was granted.
    pub(crate) highest_fence: AtomicI64,
    /// Redlock: the nodes' clock (the median of their `TIME`) as last
    /// sampled, and when, on this client's monotonic clock. The first-phase
    /// token is extrapolated from it, never from this client's wall clock.
    pub(crate) node_clock: std::sync::Mutex<Option<ClockSample>>,
    /// Redlock: whether the nodes were found to be distinct servers.
    pub(crate) nodes_checked: std::sync::atomic::AtomicBool,
    /// The nodes' deployment as read once after the first grant.
    pub(crate) deployment: std::sync::Mutex<Deployment>,
    /// The commands a node's ACL refused, each warned about once.
    pub(crate) refused: std::sync::Mutex<Vec<&'static str>>,
    /// Every node's ACL refused TIME: it is not asked again (each acquire
    /// would pay a round trip for the refusal).
    pub(crate) time_refused: std::sync::atomic::AtomicBool,
}

impl Inner {
    /// Warns once per command that a node's ACL refuses it, and what the
    /// client does without it (docs/operations.md, Security).
    pub(crate) fn refused(&self, node: &str, command: &'static str, lost: &str) {
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused.contains(&command) {
            return;
        }
        refused.push(command);
        tracing::warn!(
            node,
            command,
            "a lock node's ACL refuses {command} to this user: {lost} (grant +{} to this user, see the ACL recipe in docs/operations.md, Security)",
            command.to_lowercase().replace(' ', "|")
        );
    }
}

/// The deployment check: each node's settings, read once in the background
/// after this client's first grant, and the nodes already warned about.
#[derive(Default)]
pub(crate) struct Deployment {
    pub(crate) started: bool,
    /// Per node: its settings (None: it did not answer, or refused INFO).
    pub(crate) settings: Option<Vec<Option<NodeSettings>>>,
    pub(crate) warned: Vec<bool>,
}

/// The nodes' wall clock in µs, read at `at` (this client's monotonic clock).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClockSample {
    pub(crate) node_us: i64,
    pub(crate) at: Instant,
}

/// A fresh random token: 128 bits, as hex.
pub fn random_token() -> String {
    format!("{:032x}", rand::thread_rng().gen::<u128>())
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<&str> = self.inner.group.nodes.iter().map(|n| n.url()).collect();
        f.debug_struct("LockClient")
            .field("nodes", &nodes)
            .field("quorum", &self.quorum())
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// One URL: a single lock node. Several: a Redlock group of independent
    /// masters (use an odd number, usually 5). Connects lazily.
    pub fn new<S: AsRef<str>>(urls: &[S]) -> Result<LockClient> {
        Self::with_options(urls, Options::default())
    }

    /// [`new`](Self::new) with [`Options`] (auto-renewal, timeouts, the
    /// server-side line, quorum fencing).
    pub fn with_options<S: AsRef<str>>(urls: &[S], options: Options) -> Result<LockClient> {
        if urls.is_empty() {
            return Err(Error::Config("give at least one redis:// URL".into()));
        }
        let nodes = urls
            .iter()
            .map(|u| Node::new(u.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::from_nodes(nodes, options))
    }

    /// Lock nodes reached through the application's own `redis::Client`s
    /// (one: a single node; several: a Redlock group), so their TLS,
    /// credentials, database and protocol carry over. `rediss://` URLs work
    /// with [`new`](Self::new) too (TLS through the system's OpenSSL and
    /// trust store; `SSL_CERT_FILE` names another CA file).
    pub fn from_clients(clients: Vec<redis::Client>, options: Options) -> Result<LockClient> {
        if clients.is_empty() {
            return Err(Error::Config("give at least one client".into()));
        }
        let nodes = clients.into_iter().map(Node::from_client).collect();
        Ok(Self::from_nodes(nodes, options))
    }

    fn from_nodes(mut nodes: Vec<Node>, options: Options) -> LockClient {
        for node in &mut nodes {
            node.wait_replicas = options.wait_replicas;
        }
        let n = nodes.len();
        if n > 1 && n % 2 == 0 {
            tracing::warn!(
                nodes = n,
                "an even count of lock nodes tolerates no more failures than {} (a majority of {n} is {}): use an odd number",
                n - 1,
                n / 2 + 1
            );
        }
        LockClient {
            inner: Arc::new(Inner {
                group: Arc::new(Group { nodes, options }),
                contended: std::sync::Mutex::new(HashMap::new()),
                highest_fence: AtomicI64::new(0),
                node_clock: std::sync::Mutex::new(None),
                nodes_checked: std::sync::atomic::AtomicBool::new(false),
                deployment: std::sync::Mutex::new(Deployment::default()),
                refused: std::sync::Mutex::new(Vec::new()),
                time_refused: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// How many nodes were given.
    pub fn nodes(&self) -> usize {
        self.inner.group.nodes.len()
    }

    /// How many nodes must agree: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.inner.group.quorum()
    }

    pub(crate) fn node_timeout(&self, ttl: Duration) -> Duration {
        self.inner.group.node_timeout(ttl)
    }

    /// One attempt: the lock, or None if another holder has it. The same
    /// as `acquire(key, ttl).await`.
    pub async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Option<LockGuard>> {
        self.acquire(key, ttl).await
    }

    /// The lock on `key` for `ttl`: await it for a [`LockGuard`] (`None`
    /// if another holder has it). What the call may do is named, not
    /// positional: [`wait`](Acquire::wait) for a held lock,
    /// a [`token`](Acquire::token) of the caller's choosing,
    /// [`auto_renew`](Acquire::auto_renew), or run a closure under the lock
    /// with [`with_lock`](Acquire::with_lock).
    ///
    /// On one node the client waits in the server's FIFO line (BLOCK),
    /// without polling. With Redlock it waits in the FIFO line of the key's
    /// [ordering node](Self::ordering_node), then takes the other nodes, so
    /// waiters take turns in arrival order; while that node does not answer
    /// (or with [`Options::queue`] off) it retries after random pauses until
    /// the wait has passed.
    pub fn acquire<'a>(&'a self, key: &str, ttl: Duration) -> Acquire<'a> {
        self.acquire_keys(Keys::from(key), ttl)
    }

    /// All of `keys` for `ttl`, or none: one lock over several keys with
    /// one fencing token (`LOCK.ACQUIREALL`), as [`acquire`](Self::acquire)
    /// takes one. A wait stands in every key's line at once in the server,
    /// holding none of them until it gets them all, so callers that name
    /// the same keys in different orders never deadlock. Renewal extends
    /// every key, and the lock is lost when any key is. Refused at once
    /// (an error) for no key or a key named twice. On Redis Cluster the
    /// keys must share a slot (one hash tag); a Redlock group's waits are
    /// ordered by the smallest key's ordering node.
    pub fn acquire_all<'a, S: AsRef<str>>(&'a self, keys: &[S], ttl: Duration) -> Acquire<'a> {
        self.acquire_keys(Keys::from(keys), ttl)
    }

    fn acquire_keys(&self, keys: Keys, ttl: Duration) -> Acquire<'_> {
        Acquire {
            client: self,
            keys,
            ttl,
            wait: Duration::ZERO,
            token: None,
            fresh_token: false,
            auto_renew: self.inner.group.options.auto_renew,
        }
    }

    /// The one acquisition path: one node or Redlock, then the guard.
    async fn grant(
        &self,
        keys: &Keys,
        token: &str,
        ttl: Duration,
        wait: Duration,
        renew: bool,
        // A token this client made up for this call (so it holds nothing yet).
        floor: bool,
    ) -> Result<Option<LockGuard>> {
        crate::clock::check_ttl(ttl)?;
        keys.check()?;
        let start = Instant::now();
        let nodes = self.inner.group.nodes.len();
        if nodes > 1 && matches!(keys.mode(), Mode::Shared { limit: Some(n) } if n > 1) {
            return Err(Error::Config(
                "a counting semaphore (limit above 1) cannot be kept by a Redlock group: each node counts only the holders it granted, so holders granted by different majorities could exceed the limit together; use one node (with replicas)".into(),
            ));
        }
        let granted = if nodes == 1 {
            self.acquire_single(keys, token, ttl, wait).await
        } else {
            match self.check_distinct_nodes(self.node_timeout(ttl)).await {
                Ok(_) => self.acquire_redlock(keys, token, ttl, floor, wait).await,
                Err(e) => Err(e),
            }
        };
        let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
        let granted = match granted {
            Ok(Some((fence, valid_until))) => {
                let validity_ms = valid_until
                    .saturating_duration_since(Instant::now())
                    .as_millis() as u64;
                tracing::debug!(
                    key = &*keys.name(),
                    fence,
                    nodes,
                    elapsed_ms,
                    validity_ms,
                    "lock acquired"
                );
                self.check_deployment(ttl);
                Some((fence, valid_until))
            }
            Ok(None) => {
                tracing::debug!(
                    key = &*keys.name(),
                    nodes,
                    elapsed_ms,
                    "lock not acquired: held by another"
                );
                None
            }
            Err(e) => {
                tracing::warn!(key = &*keys.name(), nodes, elapsed_ms, error = %e, "lock acquire failed");
                return Err(e);
            }
        };
        Ok(granted.map(|(fence, valid_until)| {
            LockGuard::new(
                self.inner.group.clone(),
                Lease::new(keys, token, fence, ttl, valid_until),
                renew,
            )
        }))
    }

    async fn acquire_single(
        &self,
        keys: &Keys,
        token: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<(i64, Instant)>> {
        let node = &self.inner.group.nodes[0];
        let limit = self.node_timeout(ttl);
        // One ACQUIRE; the validity is measured from just before it.
        let acquire_now = || async {
            let start = Sent::now();
            let fence = node.acquire(keys, token, ttl, None, limit).await?;
            Ok(fence.map(|f| (f, start.valid_until(ttl))))
        };
        if wait.is_zero() {
            return acquire_now().await;
        }
        let start = Sent::now();
        let deadline = later_by(Instant::now(), wait);
        // A wait rides through a restart or a failover (as a Redlock
        // group's does): it goes on, reconnecting after growing pauses,
        // until its deadline; only then is the last error the answer.
        let mut pause = Duration::from_millis(50);
        let fence = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match node.acquire_waiting(keys, token, ttl, left, limit).await {
                Ok(Some(fence)) => break fence,
                Ok(None) => return Ok(None),
                Err(e) if e.is_transient() && Instant::now() + pause < deadline => {
                    tracing::debug!(key = &*keys.name(), error = %e, "the wait goes on after a node error");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
        };
        // The grant happened at some moment after `start`, so its lease ends
        // after start + ttl: a validity measured from `start` is safe. When
        // the wait used up half the TTL or more, renew at once (same token)
        // for a validity measured from now; a lock granted without waiting
        // costs one round trip, not two.
        if start.elapsed() < ttl / 2 {
            return Ok(Some((fence, start.valid_until(ttl))));
        }
        acquire_now().await
    }

    #[doc(hidden)] // for the redis-lock command
    /// Releases `key` held by `token` (for scripts that kept the token):
    /// true if a majority of nodes (the node) released it.
    pub async fn release_token(&self, keys: impl Into<Keys>, token: &str) -> Result<bool> {
        Ok(self.release_token_count(keys, token).await? >= self.quorum())
    }

    #[doc(hidden)] // for the redis-lock command
    /// Releases `key` held by `token` on every node: on how many it was
    /// held. Fewer than a majority but more than none: the lock was no
    /// longer held (lost, or a failed extend left its lease on a minority),
    /// and those nodes are free now.
    /// Err when fewer than a majority answered (whether it was held is
    /// not known).
    pub async fn release_token_count(&self, keys: impl Into<Keys>, token: &str) -> Result<usize> {
        let ttl = Duration::from_secs(5);
        let keys = keys.into();
        keys.check()?;
        let outcome = self.inner.group.release_counted(&keys, token, ttl).await;
        let released = outcome.released;
        outcome.held(self.quorum()).map(|_| released)
    }

    #[doc(hidden)] // for the redis-lock command
    /// Extends `key` held by `token` to `ttl` from now: true if a majority
    /// of nodes (the node) extended it.
    pub async fn extend_token(
        &self,
        keys: impl Into<Keys>,
        token: &str,
        ttl: Duration,
    ) -> Result<bool> {
        Ok(self.extend_token_until(keys, token, ttl).await?.is_some())
    }

    #[doc(hidden)] // for the redis-lock command
    /// [`extend_token`](Self::extend_token), with the new validity
    /// deadline when extended. When a majority answered but did not all
    /// extend, the lock is lost and is released where it was extended.
    pub async fn extend_token_until(
        &self,
        keys: impl Into<Keys>,
        token: &str,
        ttl: Duration,
    ) -> Result<Option<Instant>> {
        let keys = keys.into();
        keys.check()?;
        // Past any validity (a TTL too long for an instant is the nodes' to
        // refuse, not a panic here).
        let far = later_by(Instant::now(), ttl);
        self.inner
            .group
            .extend_everywhere(&keys, (token, None), ttl, far)
            .await
    }

    /// LOCK.INFO from every node, in the order the URLs were given.
    pub async fn info(&self, key: &str) -> Vec<Result<Option<LockInfo>>> {
        let limit = self.node_timeout(Duration::from_secs(5));
        join_all(self.inner.group.nodes.iter().map(|n| n.info(key, limit))).await
    }
}

/// One acquisition, made by [`LockClient::acquire`]; nothing happens until
/// it is awaited (or [`with_lock`](Acquire::with_lock) runs).
#[must_use = "an acquisition does nothing until it is awaited"]
pub struct Acquire<'a> {
    client: &'a LockClient,
    keys: Keys,
    ttl: Duration,
    wait: Duration,
    token: Option<String>,
    /// The token was made for this call (see `fresh_token`).
    fresh_token: bool,
    auto_renew: bool,
}

/// Without the token (a caller's token is its credential).
impl std::fmt::Debug for Acquire<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquire")
            .field("keys", &self.keys)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("own_token", &self.token.is_some())
            .field("auto_renew", &self.auto_renew)
            .finish_non_exhaustive()
    }
}

impl<'a> Acquire<'a> {
    /// Waits up to `wait` while another holder has the lock (default: no
    /// wait, one attempt).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Acquires with this token rather than a fresh random one. A token
    /// already holding the lock renews it and keeps its fencing token while
    /// a majority of the nodes still holds it. (With Redlock, a node that
    /// had lost it grants a new, larger token; when that leaves no majority
    /// on one token, the second phase raises the others to the largest: the
    /// group's token then changes, upwards, as for any new grant.) With Redlock the first phase then asks for no token
    /// floor, so a grant may take the second phase.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self.fresh_token = false;
        self
    }

    /// [`token`](Self::token) for a token the caller has just made with
    /// [`random_token`] (so it holds nothing yet and the first phase may
    /// ask for a floor, one round trip): for the `redis-lock` command,
    /// which must know its token before the grant to release it on a signal.
    #[doc(hidden)]
    pub fn fresh_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self.fresh_token = true;
        self
    }

    /// The holder's public value (`VALUE v`): a leader's address or id,
    /// shown to every reader of the lock (`LOCK.INFO`, `LOCK.OBSERVE`,
    /// [`Election::leader`](crate::Election::leader)), unlike its token.
    /// Exclusive locks only: with [`shared`](Self::shared) or
    /// [`limit`](Self::limit) the acquisition is refused
    /// ([`Error::Config`]).
    pub fn value(mut self, value: impl Into<String>) -> Self {
        self.keys = self.keys.with_value(Some(value.into()));
        self
    }

    /// Renews this lock in the background (default: [`Options::auto_renew`]).
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// Takes the lock shared (`SHARED`): the reader's side of a read/write
    /// lock. Many shared holders hold a key at once, each with a fencing
    /// token of its own; an exclusive holder (a plain acquisition, the
    /// writer) holds it alone. Waiting readers and writers take turns in one
    /// FIFO line. With [`LockClient::acquire_all`] every key is taken shared,
    /// with one fence for all of them. On a Redlock group a reader and a
    /// writer still never hold a key together (their majorities share a
    /// node).
    pub fn shared(mut self) -> Self {
        if !self.keys.mode().is_shared() {
            self.keys = self.keys.in_mode(Mode::Shared { limit: None });
        }
        self
    }

    /// A counting semaphore: shared, at most `n` holders at once
    /// (`SHARED LIMIT n`), one leased permit per holder. The limit belongs
    /// to the key: every holder must name the same. One node only (with
    /// replicas): a Redlock group is refused, since each node counts only
    /// the holders it granted, and holders granted by different majorities
    /// could exceed `n` together.
    pub fn limit(mut self, n: u32) -> Self {
        self.keys = self.keys.in_mode(Mode::Shared { limit: Some(n) });
        self
    }

    /// Runs `f` while holding the lock, renewing it in the background, then
    /// releases it. `f` gets the [`Lease`]: its fencing token for the
    /// resource, [`Lease::lost`] to stop work if the lock is lost, and the
    /// guarded writes ([`Lease::exec`] on the lock's node, [`Lease::fenced`]
    /// behind a gate), as the guard has them.
    /// Not acquired within the wait: `Ok(None)`, as from awaiting the
    /// acquisition (one convention for "not acquired"). Lost before `f`
    /// finished (a renewal refused, or none within the validity):
    /// [`Error::Lost`], so "done under the lock" and "lost it halfway" never
    /// look alike.
    pub async fn with_lock<T, F, Fut>(self, f: F) -> Result<Option<T>>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let Some(guard) = self.auto_renew(true).await? else {
            return Ok(None);
        };
        let lease = guard.lease();
        let out = f(lease.clone()).await;
        // Judged before the release: was the lock held all along?
        let kept = lease.is_valid();
        // The work is done: a failed release only means the lease ends by itself.
        let _ = guard.release().await;
        if kept {
            Ok(Some(out))
        } else {
            Err(Error::Lost)
        }
    }
}

impl<'a> std::future::IntoFuture for Acquire<'a> {
    type Output = Result<Option<LockGuard>>;
    type IntoFuture =
        std::pin::Pin<Box<dyn std::future::Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            // A token this client makes up holds nothing yet, so the first
            // phase may ask for a floor; a caller's token may hold the lock.
            let (token, floor) = match self.token {
                Some(token) => (token, self.fresh_token),
                None => (random_token(), true),
            };
            // Only a token made for this call is released if the call ends
            // without a guard: a caller's own token may hold the lock already.
            let settle = Arc::new(Settle::default());
            let unclaimed = floor.then(|| Unclaimed {
                group: self.client.inner.group.clone(),
                keys: self.keys.clone(),
                token: token.clone(),
                ttl: self.ttl,
                settle: settle.clone(),
                armed: true,
            });
            let granted = SETTLE
                .scope(
                    settle,
                    self.client.grant(
                        &self.keys,
                        &token,
                        self.ttl,
                        self.wait,
                        self.auto_renew,
                        floor,
                    ),
                )
                .await;
            if let Some(u) = unclaimed {
                u.finish(&granted);
            }
            granted
        })
    }
}

/// A token made for one acquisition that has not reached a [`LockGuard`]
/// yet. Dropped armed (the acquisition's future was dropped at an await,
/// or it failed, or it ended "not granted" after a late grant was left),
/// it releases the token on every node: at once, on the dropping thread
/// over fresh connections (a program that returns from `main` right after
/// a `select!` cut its acquisition stops its runtime before any task it
/// spawned runs: the lock stayed for its TTL), and once more a little
/// later in the background, over the connections the acquisition used (so
/// it arrives after any ACQUIRE still queued on them, and after a request
/// stuck on a connection given up on, or a grant handed to a wait whose
/// connection was closing). A BLOCK wait in flight leaves the server's
/// line: its task closes its connection (see `Node::acquire_waiting`), as
/// a runtime that ends does.
struct Unclaimed {
    group: Arc<Group>,
    keys: Keys,
    token: String,
    ttl: Duration,
    settle: Arc<Settle>,
    armed: bool,
}

impl Unclaimed {
    /// The acquisition ended: a guard (which releases on drop) leaves
    /// nothing to undo, nor does "not granted" unless a late grant was left
    /// in place; an error may have come after a grant.
    fn finish(mut self, granted: &Result<Option<LockGuard>>) {
        let left = self.settle.end();
        self.armed = match granted {
            Ok(Some(_)) => false,
            Ok(None) => left,
            Err(_) => true,
        };
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        self.settle.end();
        if !self.armed {
            return;
        }
        let group = self.group.clone();
        let keys = self.keys.clone();
        let token = std::mem::take(&mut self.token);
        let ttl = self.ttl;
        // Now, whatever comes next: the runtime may be about to stop.
        let released = group.release_everywhere_blocking(&keys, &token, ttl);
        tracing::debug!(
            key = &*keys.name(),
            released,
            "released an acquisition that ended without a guard"
        );
        // No runtime (dropped outside one): its connections are gone with
        // it, and nothing queued on them can arrive later.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::time::sleep(2 * group.node_timeout(ttl)).await;
                let later = group.release_everywhere(&keys, &token, ttl).await;
                tracing::debug!(
                    key = &*keys.name(),
                    released = later,
                    "released an acquisition that ended without a guard, again"
                );
            });
        }
    }
}
