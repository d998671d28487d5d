//! `LockClient`: one node (waiting in the server with BLOCK) or Redlock
//! over N nodes (a majority, with quorum fencing).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering as AtomicOrdering};
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
    contended: std::sync::Mutex<HashMap<Keys, Instant>>,
    /// Redlock: the largest token this client asked for in a first phase
    /// or was granted.
    highest_fence: AtomicI64,
    /// Redlock: the nodes' clock (the median of their `TIME`) as last
    /// sampled, and when, on this client's monotonic clock. The first-phase
    /// token is extrapolated from it, never from this client's wall clock.
    node_clock: std::sync::Mutex<Option<ClockSample>>,
    /// Redlock: whether the nodes were found to be distinct servers.
    nodes_checked: std::sync::atomic::AtomicBool,
    /// The nodes' deployment as read once after the first grant.
    deployment: std::sync::Mutex<Deployment>,
    /// The commands a node's ACL refused, each warned about once.
    refused: std::sync::Mutex<Vec<&'static str>>,
    /// Every node's ACL refused TIME: it is not asked again (each acquire
    /// would pay a round trip for the refusal).
    time_refused: std::sync::atomic::AtomicBool,
}

impl Inner {
    /// Warns once per command that a node's ACL refuses it, and what the
    /// client does without it (docs/operations.md, Security).
    fn refused(&self, node: &str, command: &'static str, lost: &str) {
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

/// What is lost without a node's settings.
const CRASH_CHECK_SKIPPED: &str = "the check whether a crash could make the node grant a lock that is still held (lock.restart-delay-ms, appendfsync) is skipped";

/// The deployment check: each node's settings, read once in the background
/// after this client's first grant, and the nodes already warned about.
#[derive(Default)]
struct Deployment {
    started: bool,
    /// Per node: its settings (None: it did not answer, or refused INFO).
    settings: Option<Vec<Option<NodeSettings>>>,
    warned: Vec<bool>,
}

impl Deployment {
    fn record(&mut self, settings: Vec<Option<NodeSettings>>) {
        self.warned = vec![false; settings.len()];
        self.settings = Some(settings);
        tracing::debug!("lock nodes' deployment checked");
    }

    /// Warns (a `tracing` warning, once per node) about each node a crash
    /// would make unsafe for leases of `ttl`.
    fn warn_unsafe(&mut self, ttl: Duration) {
        let Some(settings) = &self.settings else {
            return;
        };
        for (i, s) in settings.iter().enumerate() {
            let Some(s) = s else { continue };
            if self.warned[i] {
                continue;
            }
            if let Some(warning) = s.crash_warning(ttl) {
                self.warned[i] = true;
                tracing::warn!(node = %s.url, ttl_ms = ttl.as_millis() as u64, "lock node unsafe after a crash: {warning}");
            }
        }
    }
}

/// How long the background deployment check waits for a node.
const DEPLOYMENT_READ_LIMIT: Duration = Duration::from_secs(2);

/// The nodes' wall clock in µs, read at `at` (this client's monotonic clock).
#[derive(Clone, Copy, Debug)]
struct ClockSample {
    node_us: i64,
    at: Instant,
}

/// What one node answered to an ACQUIRE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    Granted(i64),
    Refused,
    Failed,
}

/// One Redlock attempt: the grant (token, validity deadline), if any, and
/// what the ordering node answered.
struct Round {
    granted: Option<(i64, Instant)>,
    order: Reply,
}

/// How waiting in the ordering node's line ended.
enum Line {
    Granted((i64, Instant)),
    /// The wait is over without the lock (None), or with every node failing.
    Over(Option<Error>),
    /// The ordering node stopped answering, or the grant there was lost;
    /// with the error if a round failed for want of a majority.
    Gone(Option<Error>),
}

/// How long a key counts as contended after its ordering node refused.
const CONTENDED_MEMORY: Duration = Duration::from_secs(1);

/// How far ahead of the nodes' clock the first-phase token is asked for
/// (µs): enough for the request to reach a node whose clock agrees.
const FENCE_LEAD_US: i64 = 2_000;

/// How long a sample of the nodes' clock is extrapolated on this client's
/// monotonic clock before it is read again (bounds what the two clocks'
/// rates can drift apart: 30 s at 500 ppm is 15 ms).
const NODE_CLOCK_MAX_AGE: Duration = Duration::from_secs(30);

/// Whether a node refused the request itself rather than failing to
/// answer or asking to try again later ([`Error::is_busy`]): a TTL above
/// `lock.max-ttl-ms`, a token too long, an ACL refusal, no module.
fn refuses_the_request(e: &Error) -> bool {
    match e {
        Error::ModuleMissing { .. } => true,
        Error::Redis(r) => {
            !e.is_busy()
                && (r.kind() == redis::ErrorKind::ResponseError
                    || r.code() == Some(redis_lock_core::protocol::code::NO_PERMISSION))
        }
        _ => false,
    }
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

    /// At the first grant, reads every node's restart delay and
    /// persistence in the background (no caller waits for it; a Redlock
    /// group's were read with the distinct-server check) and warns,
    /// as a `tracing` warning once per node, about a node that after a crash
    /// could grant a lock still held: `lock.restart-delay-ms` below the
    /// TTL without `appendfsync always` (the rule `redis-lock doctor` and
    /// `redis-lock run` apply). Later grants with a longer TTL are judged
    /// against the settings read then. A node whose settings cannot be read
    /// (down, or an ACL user without CONFIG) is not judged.
    fn check_deployment(&self, ttl: Duration) {
        let mut deployment = self
            .inner
            .deployment
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if deployment.started {
            deployment.warn_unsafe(ttl);
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        deployment.started = true;
        let inner = self.inner.clone();
        runtime.spawn(async move {
            let read = join_all(
                inner
                    .group
                    .nodes
                    .iter()
                    .map(|n| n.settings(DEPLOYMENT_READ_LIMIT)),
            )
            .await;
            let settings: Vec<Option<NodeSettings>> = read
                .into_iter()
                .zip(&inner.group.nodes)
                .map(|(r, node)| {
                    r.map_err(|e| {
                        if e.is_acl_refusal() {
                            inner.refused(node.url(), "INFO", CRASH_CHECK_SKIPPED);
                        }
                        tracing::debug!(node = %node.url(), error = %e, "lock node settings not readable")
                    })
                    .ok()
                })
                .collect();
            for (s, node) in settings.iter().zip(&inner.group.nodes) {
                if s.as_ref().is_some_and(|s| s.restart_delay_ms.is_none()) {
                    inner.refused(node.url(), "CONFIG GET", CRASH_CHECK_SKIPPED);
                }
            }
            let mut deployment = inner.deployment.lock().unwrap_or_else(|e| e.into_inner());
            deployment.record(settings);
            deployment.warn_unsafe(ttl);
        });
    }

    /// Redlock: refuses a group in which one server appears twice (the
    /// same URL twice, an alias such as `localhost` and `127.0.0.1`, or two
    /// databases `/0` and `/1` of one server): it would count as several
    /// votes. Servers are told apart by their `run_id` (INFO server), read
    /// once, when a majority first answers; a node that does not answer
    /// then is not checked.
    /// Returns the settings read, if it read them now.
    async fn check_distinct_nodes(
        &self,
        limit: Duration,
    ) -> Result<Option<Vec<Option<NodeSettings>>>> {
        if self.inner.nodes_checked.load(AtomicOrdering::Acquire) {
            return Ok(None);
        }
        // One read per node serves this check and the deployment check.
        let read = join_all(self.inner.group.nodes.iter().map(|n| n.settings(limit))).await;
        let answered: Vec<(usize, &String)> = read
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().ok().map(|s| (i, &s.run_id)))
            .filter(|(_, id)| !id.is_empty())
            .collect();
        for (k, (i, id)) in answered.iter().enumerate() {
            if let Some((j, _)) = answered[..k].iter().find(|(_, other)| other == id) {
                return Err(Error::Config(format!(
                    "{} and {} are the same server (run_id {id}): a Redlock group needs independent nodes",
                    self.inner.group.nodes[*j].url(),
                    self.inner.group.nodes[*i].url(),
                )));
            }
        }
        // A node that refused INFO (an ACL user without it) cannot be told
        // apart from the others, now or later: the group is refused unless
        // the caller says its nodes are distinct (then it counts as
        // answered, so the question is not asked again before every acquire).
        let refused: Vec<usize> = read
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Err(Error::Redis(e)) if e.kind() == redis::ErrorKind::ResponseError || e.code() == Some(redis_lock_core::protocol::code::NO_PERMISSION)))
            .map(|(i, _)| i)
            .collect();
        if let Some(&i) = refused.first() {
            let url = self.inner.group.nodes[i].url();
            if !self.inner.group.options.distinct_nodes {
                return Err(Error::Config(format!(
                    "cannot tell whether {url} is a server distinct from the other nodes: its user may not run INFO (ACL), and one server under two names would count as two votes; grant +info to the user, or say the nodes are distinct (Options::distinct_nodes, redis-lock --distinct-nodes)"
                )));
            }
            self.inner.refused(url, "INFO", "the nodes are taken to be distinct servers as told (Options::distinct_nodes), and the crash-safety check is skipped");
        }
        let refused = refused.len();
        let majority_checked = answered.len() + refused >= self.quorum();
        let read: Vec<Option<NodeSettings>> = read.into_iter().map(Result::ok).collect();
        if majority_checked {
            self.inner
                .nodes_checked
                .store(true, AtomicOrdering::Release);
            let mut deployment = self
                .inner
                .deployment
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if !deployment.started {
                deployment.started = true;
                deployment.record(read.clone());
            }
        }
        Ok(Some(read))
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

    /// Redlock with a wait. With [`Options::queue`] (the default) the
    /// waiting happens in the server: while another client holds the lock,
    /// this one waits in the FIFO line (`BLOCK`) of the key's ordering node,
    /// and once that node grants it, takes the others. Clients that wait
    /// this way take turns in arrival order. When the ordering node does not
    /// answer, and with `queue: false`, attempts are retried after random
    /// pauses instead.
    async fn acquire_redlock(
        &self,
        keys: &Keys,
        token: &str,
        ttl: Duration,
        floor: bool,
        wait: Duration,
    ) -> Result<Option<(i64, Instant)>> {
        // A wait too long for an instant (--wait 10^15h) is for ever.
        let deadline = later_by(Instant::now(), wait);
        let order = (self.inner.group.options.queue && !wait.is_zero())
            .then(|| self.ordering_node(keys.ordering_key()));
        // Why the last round failed, if a majority could not be asked: a
        // wait that ends so is that error, not "held by another".
        let mut last_error: Option<Error> = None;
        loop {
            let line = match order {
                // Recently contended here: ask the ordering node alone first,
                // so as not to take the other nodes from under the client
                // that node has just handed the lock to.
                Some(o) if self.recently_contended(keys) => {
                    let limit = self.node_timeout(ttl);
                    match self.inner.group.nodes[o]
                        .acquire(keys, token, ttl, None, limit)
                        .await
                    {
                        Ok(Some(_)) => {
                            Some(self.take_others(keys, token, ttl, floor, o, deadline).await)
                        }
                        Ok(None) => {
                            self.mark_contended(keys);
                            Some(
                                self.wait_in_line(keys, token, ttl, floor, o, deadline)
                                    .await,
                            )
                        }
                        // Not answering: a round that need not include it.
                        Err(_) => None,
                    }
                }
                _ => None,
            };
            let line = match line {
                Some(line) => line,
                None => match self
                    .redlock_round(keys, token, ttl, floor, order, None)
                    .await
                {
                    Ok(Round {
                        granted: Some(granted),
                        ..
                    }) => return Ok(Some(granted)),
                    Ok(Round {
                        order: Reply::Refused,
                        ..
                    }) => {
                        last_error = None;
                        let o = order.expect("only the ordering node refuses a round");
                        self.mark_contended(keys);
                        self.wait_in_line(keys, token, ttl, floor, o, deadline)
                            .await
                    }
                    Ok(_) => {
                        last_error = None;
                        Line::Gone(None)
                    }
                    // The nodes refuse the request itself (a TTL above
                    // their limit, an ACL): no retry can change that.
                    Err(e) if Instant::now() >= deadline || refuses_the_request(&e) => {
                        return Err(e)
                    }
                    Err(e) => Line::Gone(Some(e)),
                },
            };
            match line {
                Line::Granted(granted) => return Ok(Some(granted)),
                Line::Over(None) => return Ok(None),
                Line::Over(Some(e)) => return Err(e),
                // No grant, and no line to wait in (not queueing, the
                // ordering node not answering, or the grant there lost):
                // retry after a random pause.
                Line::Gone(Some(e)) => last_error = Some(e),
                Line::Gone(None) => {}
            }
            let max_delay = self
                .inner
                .group
                .options
                .retry_delay
                .max(Duration::from_millis(1));
            let pause = rand::thread_rng().gen_range(Duration::ZERO..max_delay);
            if Instant::now() + pause >= deadline {
                return last_error.map_or(Ok(None), Err);
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Redlock: the index (in the URLs given) of the node whose FIFO line
    /// orders the waiters for `key`. Rendezvous hashing of the key with
    /// each node's `host:port`, so every client given the same nodes, in
    /// any order, picks the same one, and different keys spread over the
    /// nodes. 0 for a single node. Give every client the nodes under the
    /// same names (a host name and its address count as different): clients
    /// that pick different ordering nodes stay safe but do not take turns.
    pub fn ordering_node(&self, key: &str) -> usize {
        let score = |addr: &str| {
            // FNV-1a, then a 64-bit finalizer (splitmix64).
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in addr.bytes().chain([0xff]).chain(key.bytes()) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            h ^= h >> 30;
            h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            h ^= h >> 27;
            h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
            h ^ (h >> 31)
        };
        (0..self.inner.group.nodes.len())
            .max_by_key(|&i| score(self.inner.group.nodes[i].addr()))
            .unwrap_or(0)
    }

    /// Whether an attempt on `keys` recently found its ordering node held.
    fn recently_contended(&self, keys: &Keys) -> bool {
        let seen = self
            .inner
            .contended
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        seen.get(keys)
            .is_some_and(|at| at.elapsed() < CONTENDED_MEMORY)
    }

    fn mark_contended(&self, keys: &Keys) {
        let mut seen = self
            .inner
            .contended
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if seen.len() >= 1024 {
            seen.retain(|_, at| at.elapsed() < CONTENDED_MEMORY);
        }
        if seen.len() < 4096 {
            seen.insert(keys.clone(), Instant::now());
        }
    }

    /// Waits in the ordering node's line until it grants, then takes the
    /// other nodes ([`take_others`](Self::take_others)). While waiting it
    /// pings the ordering node over the shared connection and gives up on
    /// the line if the node stops answering.
    async fn wait_in_line(
        &self,
        keys: &Keys,
        token: &str,
        ttl: Duration,
        floor: bool,
        o: usize,
        deadline: Instant,
    ) -> Line {
        let node = &self.inner.group.nodes[o];
        let limit = self.node_timeout(ttl);
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Line::Over(None);
        }
        let watch = async {
            let every = limit.max(Duration::from_millis(50));
            loop {
                tokio::time::sleep(every).await;
                if node.ping(limit).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            reply = node.acquire_waiting(keys, token, ttl, left, limit) => match reply {
                Ok(Some(_)) => {}
                Ok(None) => return Line::Over(None),
                Err(_) => return Line::Gone(None),
            },
            _ = watch => return Line::Gone(None),
        }
        self.take_others(keys, token, ttl, floor, o, deadline).await
    }

    /// Holding the ordering node: rounds on every node (renewing the
    /// ordering node's grant) until one succeeds or `deadline`, keeping the
    /// ordering node meanwhile so the clients behind keep their places.
    async fn take_others(
        &self,
        keys: &Keys,
        token: &str,
        ttl: Duration,
        floor: bool,
        o: usize,
        deadline: Instant,
    ) -> Line {
        let max_pause = self
            .inner
            .group
            .options
            .retry_delay
            .max(Duration::from_millis(1));
        let mut pause = Duration::from_micros(500);
        loop {
            let result = self
                .redlock_round(keys, token, ttl, floor, Some(o), Some(o))
                .await;
            match result {
                Ok(Round {
                    granted: Some(granted),
                    ..
                }) => return Line::Granted(granted),
                Ok(Round {
                    order: Reply::Granted(_),
                    ..
                }) => {}
                // Our grant on the ordering node is gone (it expired, or
                // the node restarted): back to the start.
                Ok(_) | Err(_) => {
                    self.inner.group.release_everywhere(keys, token, ttl).await;
                    return match result {
                        Err(e) if Instant::now() >= deadline => Line::Over(Some(e)),
                        Err(e) => Line::Gone(Some(e)),
                        Ok(_) => Line::Gone(None),
                    };
                }
            }
            let jittered = rand::thread_rng().gen_range(pause / 2..=pause);
            if Instant::now() + jittered >= deadline {
                self.inner.group.release_everywhere(keys, token, ttl).await;
                return Line::Over(None);
            }
            tokio::time::sleep(jittered).await;
            pause = (pause * 2).min(max_pause);
        }
    }

    /// The fencing token to ask for in the first phase (`MINFENCE g`): just
    /// above the nodes' clock and above every token this client has seen. A
    /// node grants exactly `g` when its clock and its high-water mark are
    /// below it, which is the rule on nodes whose clocks agree: then every
    /// node of the majority already has the same token and the second phase
    /// is not needed (one round trip instead of two).
    ///
    /// The nodes' clock is the median of their `TIME` replies, extrapolated
    /// on this client's monotonic clock (read again after
    /// [`NODE_CLOCK_MAX_AGE`]), never this client's wall clock: a client whose
    /// clock is ahead must not drag the group's tokens ahead of the nodes'
    /// clocks, or a node that restarts without its data issues tokens below
    /// them. None (no `MINFENCE`, so always two phases when nodes disagree)
    /// if no node answers `TIME`.
    async fn first_phase_fence(&self, limit: Duration) -> Option<i64> {
        let now_us = self.nodes_now_us(limit).await?;
        Some(self.first_phase_fence_at(now_us))
    }

    fn first_phase_fence_at(&self, nodes_now_us: i64) -> i64 {
        let guess = nodes_now_us.saturating_add(FENCE_LEAD_US);
        let seen = &self.inner.highest_fence;
        let mut prev = seen.load(AtomicOrdering::Relaxed);
        loop {
            let next = guess.max(prev + 1);
            match seen.compare_exchange_weak(
                prev,
                next,
                AtomicOrdering::Relaxed,
                AtomicOrdering::Relaxed,
            ) {
                Ok(_) => return next,
                Err(actual) => prev = actual,
            }
        }
    }

    /// The nodes' clock now (µs), from a recent sample or a fresh one.
    async fn nodes_now_us(&self, limit: Duration) -> Option<i64> {
        let cached = *self
            .inner
            .node_clock
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(sample) = cached.filter(|c| c.at.elapsed() < NODE_CLOCK_MAX_AGE) {
            return Some(sample.node_us + sample.at.elapsed().as_micros() as i64);
        }
        if self.inner.time_refused.load(AtomicOrdering::Relaxed) {
            return None;
        }
        let replies = join_all(self.inner.group.nodes.iter().map(|n| n.time_us(limit))).await;
        if replies
            .iter()
            .all(|r| r.as_ref().is_err_and(Error::is_acl_refusal))
        {
            self.inner.time_refused.store(true, AtomicOrdering::Relaxed);
        }
        for (r, node) in replies.iter().zip(&self.inner.group.nodes) {
            if r.as_ref().is_err_and(Error::is_acl_refusal) {
                self.inner.refused(
                    node.url(),
                    "TIME",
                    "without the nodes' clock the first phase asks for no token floor, so a fenced grant takes a second round trip whenever the nodes' tokens differ",
                );
            }
        }
        // Taken after every reply arrived: each node read its clock before
        // this, so the extrapolation errs behind the nodes, the safe side.
        let at = Instant::now();
        let mut clocks: Vec<i64> = replies.into_iter().filter_map(|r| r.ok()).collect();
        if clocks.is_empty() {
            return None;
        }
        clocks.sort_unstable();
        // The lower median: one node's clock far ahead moves nothing (that
        // node issues its own larger tokens, and phase 2 spreads them).
        let node_us = clocks[(clocks.len() - 1) / 2];
        *self
            .inner
            .node_clock
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(ClockSample { node_us, at });
        Some(node_us)
    }

    fn saw_fence(&self, fence: i64) {
        self.inner
            .highest_fence
            .fetch_max(fence, AtomicOrdering::Relaxed);
    }

    /// One Redlock attempt, with quorum fencing:
    /// 1. ACQUIRE on every node in parallel, asking for token g
    ///    (`MINFENCE g`, see [`first_phase_fence`](Self::first_phase_fence));
    ///    held if a majority granted before the TTL (less drift) ran out.
    ///    T = the largest token granted.
    /// 2. Only on granting nodes whose token is below T: ACQUIRE again with
    ///    `MINFENCE T`, so their token for this lock, and their high-water
    ///    mark, become at least T. Held only if a majority has T (from
    ///    phase 1 or 2), still within the validity. Usually every node
    ///    granted g and there is no phase 2.
    ///
    /// `order`: the ordering node; if it answers and refuses, the attempt
    /// fails even with a majority elsewhere (a waiter in its line goes
    /// first). `keep`: a node whose grant is kept when the attempt fails.
    /// On failure the lock is released on every other node, also those that
    /// seemed to fail (their grant may have been lost on the way back).
    /// Err only when a majority of nodes could not be asked at all.
    async fn redlock_round(
        &self,
        keys: &Keys,
        token: &str,
        ttl: Duration,
        floor: bool,
        order: Option<usize>,
        keep: Option<usize>,
    ) -> Result<Round> {
        let nodes = &self.inner.group.nodes;
        let limit = self.node_timeout(ttl);
        let quorum = self.quorum();
        let fencing = self.inner.group.options.quorum_fencing;
        let in_time = |start: Sent| start.in_time(ttl);
        // A token the caller chose may already hold the lock: a floor would
        // give that holder a new fence on some nodes (MINFENCE above a held
        // lock's fence draws a fresh one), where a renewal keeps it.
        let g = match fencing && floor {
            true => self.first_phase_fence(limit).await,
            false => None,
        };
        let start = Sent::now();
        let replies = join_all(nodes.iter().map(|n| n.acquire(keys, token, ttl, g, limit))).await;
        let granted: Vec<(usize, i64)> = replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Ok(Some(fence)) => Some((i, *fence)),
                _ => None,
            })
            .collect();
        // A node without the module is a group misconfigured, not a node
        // down: the rest would grant and survive no further failure.
        if let Some(at) = replies
            .iter()
            .position(|r| matches!(r, Err(Error::ModuleMissing { .. })))
        {
            self.inner
                .group
                .release_except(keys, token, ttl, None)
                .await;
            let missing = replies.into_iter().nth(at).and_then(|r| r.err());
            return Err(missing.expect("the reply found above"));
        }
        let order_reply = match order.map(|o| &replies[o]) {
            Some(Ok(Some(f))) => Reply::Granted(*f),
            Some(Ok(None)) => Reply::Refused,
            _ => Reply::Failed,
        };
        let allowed = !matches!(order_reply, Reply::Refused) || order.is_none();
        if allowed && granted.len() >= quorum && in_time(start) {
            let t = granted.iter().map(|(_, f)| *f).max().unwrap_or(0);
            self.saw_fence(t);
            let mut confirmed = granted.len();
            if fencing {
                let behind: Vec<usize> = granted
                    .iter()
                    .filter(|(_, f)| *f < t)
                    .map(|(i, _)| *i)
                    .collect();
                // Usually none: every node granted g. Those behind are
                // raised too, so every granting node has the same token.
                confirmed -= behind.len();
                if !behind.is_empty() {
                    confirmed += join_all(
                        behind
                            .iter()
                            .map(|&i| nodes[i].acquire(keys, token, ttl, Some(t), limit)),
                    )
                    .await
                    .into_iter()
                    .filter(|r| matches!(r, Ok(Some(f)) if *f >= t))
                    .count();
                }
            }
            if confirmed >= quorum && in_time(start) {
                return Ok(Round {
                    granted: Some((t, start.valid_until(ttl))),
                    order: order_reply,
                });
            }
        }
        self.inner
            .group
            .release_except(keys, token, ttl, keep)
            .await;
        let failed = replies.iter().filter(|r| r.is_err()).count();
        if failed > nodes.len() - quorum {
            // A refusal of the request (see refuses_the_request) is the
            // round's answer only if the refusing nodes alone leave no
            // majority; otherwise a node that may come back is the reason.
            let refusals = replies
                .iter()
                .filter(|r| matches!(r, Err(e) if refuses_the_request(e)))
                .count();
            let refused = refusals > nodes.len() - quorum;
            let error = replies
                .into_iter()
                .find_map(|r| r.err().filter(|e| refuses_the_request(e) == refused));
            return Err(error.unwrap_or(Error::Timeout));
        }
        Ok(Round {
            granted: None,
            order: order_reply,
        })
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
            .extend_everywhere(&keys, token, ttl, far)
            .await
    }

    /// Each node's identity, persistence settings and fence mark, in the
    /// order the nodes were given (for deployment checks such as
    /// `redis-lock doctor`).
    #[doc(hidden)] // for the redis-lock command's warning before a run
    /// Redlock: the nodes' settings as the distinct-server check of the
    /// first acquire reads them (reading them now if it has not run yet,
    /// so that acquire does not read them again); None per node not read.
    /// Err if the group is refused (one server twice).
    pub async fn group_settings(&self, ttl: Duration) -> Result<Vec<Option<NodeSettings>>> {
        if let Some(read) = self.check_distinct_nodes(self.node_timeout(ttl)).await? {
            return Ok(read);
        }
        let deployment = self
            .inner
            .deployment
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Ok(deployment.settings.clone().unwrap_or_default())
    }

    /// Each node's setup as its user may read it (INFO, CONFIG GET), in
    /// the order the URLs were given: what `redis-lock doctor` reports.
    pub async fn settings(&self) -> Vec<Result<NodeSettings>> {
        let limit = self.node_timeout(Duration::from_secs(5));
        join_all(self.inner.group.nodes.iter().map(|n| n.settings(limit))).await
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
    /// every granting node still holds it. (With Redlock, a node that had
    /// lost it grants a new, larger token, and the second phase raises the
    /// others to it: the group's token then changes, upwards, as for any
    /// new grant.) With Redlock the first phase then asks for no token
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

#[cfg(test)]
mod tests {
    use super::*;

    fn urls() -> Vec<String> {
        (0..5)
            .map(|i| format!("redis://127.0.0.1:{}/", 7000 + i))
            .collect()
    }

    /// Every client given the same nodes, in any order and with or without
    /// the trailing slash, picks the same ordering node for a key; keys
    /// spread over all the nodes.
    #[test]
    fn the_ordering_node_depends_on_the_nodes_not_their_order() {
        let forward = LockClient::new(&urls()).unwrap();
        let mut reversed_urls: Vec<String> = urls()
            .into_iter()
            .map(|u| u.trim_end_matches('/').to_string())
            .collect();
        reversed_urls.reverse();
        let reversed = LockClient::new(&reversed_urls).unwrap();
        let mut per_node = [0usize; 5];
        for k in 0..1000 {
            let key = format!("key:{k}");
            let a = forward.ordering_node(&key);
            let b = reversed.ordering_node(&key);
            assert_eq!(
                forward.inner.group.nodes[a].addr(),
                reversed.inner.group.nodes[b].addr(),
                "{key}"
            );
            per_node[a] += 1;
        }
        assert!(per_node.iter().all(|&n| n > 100), "{per_node:?}");
        assert_eq!(LockClient::new(&urls()[..1]).unwrap().ordering_node("k"), 0);
    }

    /// The first-phase token is above the nodes' clock and above every
    /// token the client has seen, and never repeats.
    #[test]
    fn first_phase_tokens_rise_above_the_nodes_clock_and_what_was_seen() {
        let locks = LockClient::new(&urls()).unwrap();
        let nodes_us = 1_700_000_000_000_000;
        let g1 = locks.first_phase_fence_at(nodes_us);
        assert_eq!(g1, nodes_us + FENCE_LEAD_US);
        let g2 = locks.first_phase_fence_at(nodes_us);
        assert!(g2 > g1);
        locks.saw_fence(nodes_us + 3_600_000_000);
        assert!(locks.first_phase_fence_at(nodes_us) > nodes_us + 3_600_000_000);
    }
}
