//! `LockClient`: one node (waiting in the server with BLOCK) or Redlock
//! over N nodes (a majority, with quorum fencing).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use rand::Rng;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::guard::{Lease, LockGuard};
use crate::node::{LockInfo, Node};

/// Tuning. The defaults suit TTLs from about a second to minutes.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long to wait for one node's answer. Default: a tenth of the TTL,
    /// between 5 ms and 500 ms, far below the TTL as Redlock requires.
    pub node_timeout: Option<Duration>,
    /// Redlock: the longest random pause between two attempts (default 200 ms).
    pub retry_delay: Duration,
    /// Renew held locks in the background at about a third of the TTL.
    pub auto_renew: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            node_timeout: None,
            retry_delay: Duration::from_millis(200),
            auto_renew: false,
        }
    }
}

/// A handle on one lock node or a Redlock group; cheap to clone.
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) nodes: Vec<Node>,
    pub(crate) options: Options,
}

/// The clock drift Redlock allows for: 1% of the TTL plus 2 ms.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// A fresh random token: 128 bits, as hex.
pub fn random_token() -> String {
    format!("{:032x}", rand::thread_rng().gen::<u128>())
}

impl LockClient {
    /// One URL: a single lock node. Several: a Redlock group of independent
    /// masters (use an odd number, usually 5). Connects lazily.
    pub fn new<S: AsRef<str>>(urls: &[S]) -> Result<LockClient> {
        Self::with_options(urls, Options::default())
    }

    pub fn with_options<S: AsRef<str>>(urls: &[S], options: Options) -> Result<LockClient> {
        if urls.is_empty() {
            return Err(Error::Config("give at least one redis:// URL".into()));
        }
        let nodes = urls
            .iter()
            .map(|u| Node::new(u.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Ok(LockClient {
            inner: Arc::new(Inner { nodes, options }),
        })
    }

    /// How many nodes must agree: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.inner.nodes.len() / 2 + 1
    }

    pub(crate) fn node_timeout(&self, ttl: Duration) -> Duration {
        self.inner.options.node_timeout.unwrap_or_else(|| {
            (ttl / 10).clamp(Duration::from_millis(5), Duration::from_millis(500))
        })
    }

    /// One attempt: the lock, or None if another holder has it.
    pub async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Option<LockGuard>> {
        let token = random_token();
        self.acquire_as(key, &token, ttl, Duration::ZERO).await
    }

    /// Waits up to `wait` for the lock. On one node the client waits in the
    /// server's FIFO line (BLOCK), without polling; with Redlock it retries
    /// after random pauses until `wait` has passed.
    pub async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<LockGuard>> {
        let token = random_token();
        self.acquire_as(key, &token, ttl, wait).await
    }

    /// [`acquire`](Self::acquire) with a token of the caller's choosing (a
    /// token already holding the lock renews it).
    pub async fn acquire_as(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<LockGuard>> {
        self.grant(key, token, ttl, wait, self.inner.options.auto_renew)
            .await
    }

    /// The one acquisition path: one node or Redlock, then the guard.
    async fn grant(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        wait: Duration,
        renew: bool,
    ) -> Result<Option<LockGuard>> {
        if ttl.is_zero() {
            return Err(Error::Config("the TTL must be positive".into()));
        }
        let granted = if self.inner.nodes.len() == 1 {
            self.acquire_single(key, token, ttl, wait).await?
        } else {
            self.acquire_redlock(key, token, ttl, wait).await?
        };
        Ok(granted.map(|(fence, valid_until)| {
            LockGuard::new(
                self.clone(),
                Lease::new(key, token, fence, ttl, valid_until),
                renew,
            )
        }))
    }

    /// Runs `f` while holding the lock, renewing it in the background, then
    /// releases it. `f` gets the [`Lease`]: its fencing token for the
    /// resource, and [`Lease::lost`] to stop work if the lock is lost.
    /// Not acquired within `wait`: [`Error::NotAcquired`].
    pub async fn with_lock<T, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        f: F,
    ) -> Result<T>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let token = random_token();
        let guard = self
            .grant(key, &token, ttl, wait, true)
            .await?
            .ok_or(Error::NotAcquired)?;
        let out = f(guard.lease()).await;
        // The work is done: a failed release only means the lease ends by itself.
        let _ = guard.release().await;
        Ok(out)
    }

    async fn acquire_single(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<(i64, Instant)>> {
        let node = &self.inner.nodes[0];
        let limit = self.node_timeout(ttl);
        // One ACQUIRE; the validity is measured from just before it.
        let acquire_now = || async {
            let start = Instant::now();
            let fence = node.acquire(key, token, ttl, None, limit).await?;
            Ok(fence.map(|f| (f, start + ttl.saturating_sub(drift(ttl)))))
        };
        if wait.is_zero() {
            return acquire_now().await;
        }
        if node
            .acquire_waiting(key, token, ttl, wait, limit)
            .await?
            .is_none()
        {
            return Ok(None);
        }
        // The grant happened at some unknown moment while waiting: renew it
        // at once (same token) so the validity is measured from now.
        acquire_now().await
    }

    async fn acquire_redlock(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<(i64, Instant)>> {
        let deadline = Instant::now() + wait;
        loop {
            match self.redlock_round(key, token, ttl).await {
                Ok(Some(granted)) => return Ok(Some(granted)),
                Ok(None) => {}
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => {}
            }
            let max_delay = self.inner.options.retry_delay.max(Duration::from_millis(1));
            let pause = rand::thread_rng().gen_range(Duration::ZERO..max_delay);
            if Instant::now() + pause >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// One Redlock attempt, with quorum fencing:
    /// 1. ACQUIRE on every node in parallel; held if a majority granted
    ///    before the TTL (less drift) ran out. T = the largest fence granted.
    /// 2. ACQUIRE again with `MINFENCE T` on the granting nodes: their fence
    ///    for this lock, and their high-water mark, become at least T.
    ///    Held only if a majority confirmed, still within the validity.
    ///
    /// On failure the lock is released on every node, also those that
    /// seemed to fail (their grant may have been lost on the way back).
    /// Err only when a majority of nodes could not be asked at all.
    async fn redlock_round(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Option<(i64, Instant)>> {
        let nodes = &self.inner.nodes;
        let limit = self.node_timeout(ttl);
        let quorum = self.quorum();
        let in_time = |start: Instant| start.elapsed() + drift(ttl) < ttl;
        let start = Instant::now();
        let replies = join_all(
            nodes
                .iter()
                .map(|n| n.acquire(key, token, ttl, None, limit)),
        )
        .await;
        let granted: Vec<(usize, i64)> = replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Ok(Some(fence)) => Some((i, *fence)),
                _ => None,
            })
            .collect();
        if granted.len() >= quorum && in_time(start) {
            let t = granted.iter().map(|(_, f)| *f).max().unwrap_or(0);
            let confirmed = join_all(
                granted
                    .iter()
                    .map(|(i, _)| nodes[*i].acquire(key, token, ttl, Some(t), limit)),
            )
            .await
            .into_iter()
            .filter(|r| matches!(r, Ok(Some(f)) if *f >= t))
            .count();
            if confirmed >= quorum && in_time(start) {
                return Ok(Some((t, start + ttl - drift(ttl))));
            }
        }
        self.release_everywhere(key, token, ttl).await;
        let failed = replies.iter().filter(|r| r.is_err()).count();
        if failed > nodes.len() - quorum {
            let first = replies.into_iter().find_map(|r| r.err());
            return Err(first.unwrap_or(Error::Timeout));
        }
        Ok(None)
    }

    /// LOCK.RELEASE on every node; how many released.
    pub(crate) async fn release_everywhere(&self, key: &str, token: &str, ttl: Duration) -> usize {
        let limit = self.node_timeout(ttl);
        join_all(
            self.inner
                .nodes
                .iter()
                .map(|n| n.release(key, token, limit)),
        )
        .await
        .into_iter()
        .filter(|r| matches!(r, Ok(true)))
        .count()
    }

    /// LOCK.EXTEND on every node: the new validity deadline if a majority
    /// extended before both the TTL (less drift) and `valid_until` ran out.
    pub(crate) async fn extend_everywhere(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        valid_until: Instant,
    ) -> Result<Option<Instant>> {
        let limit = self.node_timeout(ttl);
        let start = Instant::now();
        let replies = join_all(
            self.inner
                .nodes
                .iter()
                .map(|n| n.extend(key, token, ttl, limit)),
        )
        .await;
        let extended = replies.iter().filter(|r| matches!(r, Ok(true))).count();
        let now = Instant::now();
        if extended >= self.quorum() && now < valid_until && start.elapsed() + drift(ttl) < ttl {
            return Ok(Some(start + ttl - drift(ttl)));
        }
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        if answered < self.quorum() {
            let first = replies.into_iter().find_map(|r| r.err());
            return Err(first.unwrap_or(Error::Timeout));
        }
        Ok(None)
    }

    /// Releases `key` held by `token` (for scripts that kept the token):
    /// true if a majority of nodes (the node) released it.
    pub async fn release_token(&self, key: &str, token: &str) -> Result<bool> {
        let ttl = Duration::from_secs(5);
        Ok(self.release_everywhere(key, token, ttl).await >= self.quorum())
    }

    /// Extends `key` held by `token` to `ttl` from now: true if a majority
    /// of nodes (the node) extended it.
    pub async fn extend_token(&self, key: &str, token: &str, ttl: Duration) -> Result<bool> {
        let far = Instant::now() + ttl;
        Ok(self
            .extend_everywhere(key, token, ttl, far)
            .await?
            .is_some())
    }

    /// LOCK.INFO from every node, in the order the URLs were given.
    pub async fn info(&self, key: &str) -> Vec<Result<Option<LockInfo>>> {
        let limit = self.node_timeout(Duration::from_secs(5));
        join_all(self.inner.nodes.iter().map(|n| n.info(key, limit))).await
    }
}
