//! The deployment checks: a Redlock group's nodes told apart as distinct
//! servers, and each node's crash safety judged once after the first grant.

use std::sync::atomic::Ordering as AtomicOrdering;
use std::time::Duration;

use futures_util::future::join_all;

use crate::client::{Deployment, LockClient};
use crate::error::{Error, Result};
use crate::node_settings::NodeSettings;

/// What is lost without a node's settings.
const CRASH_CHECK_SKIPPED: &str = "the check whether a crash could make the node grant a lock that is still held (lock.restart-delay-ms, appendfsync) is skipped";

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

impl LockClient {
    /// At the first grant, reads every node's restart delay and
    /// persistence in the background (no caller waits for it; a Redlock
    /// group's were read with the distinct-server check) and warns,
    /// as a `tracing` warning once per node, about a node that after a crash
    /// could grant a lock still held: `lock.restart-delay-ms` below the
    /// TTL without `appendfsync always` (the rule `redis-lock doctor` and
    /// `redis-lock run` apply). Later grants with a longer TTL are judged
    /// against the settings read then. A node whose settings cannot be read
    /// (down, or an ACL user without CONFIG) is not judged.
    pub(crate) fn check_deployment(&self, ttl: Duration) {
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
    pub(crate) async fn check_distinct_nodes(
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

    /// One `INFO` section (`"lock"`) of every server, as (`host:port`,
    /// text), in the order the URLs were given (a cluster's masters each
    /// in turn), each read within `limit` on the node's shared
    /// connection: what `redis-lock exporter` serves.
    #[doc(hidden)] // for the redis-lock command's exporter
    pub async fn info_sections(
        &self,
        section: &str,
        limit: Duration,
    ) -> Vec<(String, Result<String>)> {
        let reads = self
            .inner
            .group
            .nodes
            .iter()
            .map(|n| n.info_texts(section, limit));
        join_all(reads).await.into_iter().flatten().collect()
    }
}
