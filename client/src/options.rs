//! The client's settings: shared by the client (acquiring) and the group
//! of nodes (timeouts, retries), so neither imports the other for them.

use std::time::Duration;

/// Tuning. The defaults suit TTLs from about a second to minutes. Built
/// from the defaults with one method per setting, so settings added later
/// do not break callers:
/// `Options::default().auto_renew(true).node_timeout(Duration::from_millis(50))`.
///
/// ```
/// # use std::time::Duration;
/// use redis_lock_client::Options;
/// let options = Options::default().auto_renew(true).queue(false);
/// assert!(options.auto_renew && !options.queue);
/// ```
///
/// A struct literal does not compile (settings may be added):
///
/// ```compile_fail
/// let options = redis_lock_client::Options { auto_renew: true, ..Default::default() };
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// How long to wait for one node's answer. Default: a tenth of the TTL,
    /// between 5 ms and 500 ms, far below the TTL as Redlock requires.
    pub node_timeout: Option<Duration>,
    /// Redlock: the longest random pause between two attempts (default 200 ms).
    pub retry_delay: Duration,
    /// Renew held locks in the background at about a third of the TTL.
    pub auto_renew: bool,
    /// Redlock: wait for a held lock in the FIFO line (`BLOCK`) of one node
    /// per key, the ordering node, then take the others; waiters take turns
    /// in arrival order. Falls back to random-pause retries while that node
    /// does not answer. Default true; false: random-pause retries only.
    pub queue: bool,
    /// Redlock: quorum fencing (default true): the token handed out is
    /// confirmed on a majority, so a later grant on any majority gets a
    /// larger one. False: the largest token of the granting nodes, not
    /// confirmed, which a later grant on another majority may not exceed
    /// (see the crate docs). Costs no extra round trip while the nodes'
    /// clocks agree with each other (the first phase asks for a token
    /// just above their median clock; see the crate docs).
    pub quorum_fencing: bool,
    /// Replica acknowledgement (default none): after each grant, `WAIT` for
    /// this many of the node's replicas to have it, within this long; a
    /// grant fewer acknowledged is released and counts as not granted
    /// ([`Error::NotReplicated`](crate::Error::NotReplicated) when no
    /// majority is left). So a failover to a replica cannot lose a grant
    /// the client was told of. The wait adds to the time the grant takes,
    /// and shortens its validity by as much.
    pub wait_replicas: Option<(u32, Duration)>,
    /// Redlock: the nodes are distinct servers, as the caller knows
    /// (default false). The client checks it itself by each node's `run_id`
    /// (INFO), and refuses a group in which one server appears twice; a
    /// node whose user may not run INFO cannot be checked, so the group is
    /// refused unless this is set.
    pub distinct_nodes: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            node_timeout: None,
            retry_delay: Duration::from_millis(200),
            auto_renew: false,
            queue: true,
            quorum_fencing: true,
            wait_replicas: None,
            distinct_nodes: false,
        }
    }
}

impl Options {
    /// See [`Options::node_timeout`](#structfield.node_timeout).
    pub fn node_timeout(mut self, limit: Duration) -> Self {
        self.node_timeout = Some(limit);
        self
    }

    /// See [`Options::retry_delay`](#structfield.retry_delay).
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// See [`Options::auto_renew`](#structfield.auto_renew).
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// See [`Options::queue`](#structfield.queue).
    pub fn queue(mut self, on: bool) -> Self {
        self.queue = on;
        self
    }

    /// See [`Options::wait_replicas`](#structfield.wait_replicas): `count`
    /// replicas within `timeout` (0 replicas: off).
    pub fn wait_replicas(mut self, count: u32, timeout: Duration) -> Self {
        self.wait_replicas = (count > 0).then_some((count, timeout));
        self
    }

    /// See [`Options::distinct_nodes`](#structfield.distinct_nodes).
    pub fn distinct_nodes(mut self, known: bool) -> Self {
        self.distinct_nodes = known;
        self
    }

    /// See [`Options::quorum_fencing`](#structfield.quorum_fencing).
    pub fn quorum_fencing(mut self, on: bool) -> Self {
        self.quorum_fencing = on;
        self
    }
}
