//! The lock nodes (one node, or a Redlock group) and what both a client
//! and a held lock do on all of them: count a majority, release, extend.
//! Shared by `client.rs` (acquiring) and `guard.rs` (renewing, releasing),
//! so neither depends on the other for it.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::clock::Sent;
use crate::error::{Error, Result};
use crate::keys::Keys;
use crate::node::Node;
use crate::options::Options;

pub(crate) struct Group {
    pub(crate) nodes: Vec<Node>,
    pub(crate) options: Options,
}

impl Group {
    /// How many nodes must agree: N/2 + 1.
    pub(crate) fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    pub(crate) fn node_timeout(&self, ttl: Duration) -> Duration {
        self.options.node_timeout.unwrap_or_else(|| {
            (ttl / 10).clamp(Duration::from_millis(5), Duration::from_millis(500))
        })
    }

    /// LOCK.RELEASE (RELEASEALL) on every node but `keep`.
    pub(crate) async fn release_except(
        &self,
        keys: &Keys,
        token: &str,
        ttl: Duration,
        keep: Option<usize>,
    ) {
        let limit = self.node_timeout(ttl);
        join_all(
            self.nodes
                .iter()
                .enumerate()
                .filter(|(i, _)| Some(*i) != keep)
                .map(|(_, n)| n.release(keys, token, limit)),
        )
        .await;
    }

    /// LOCK.RELEASE on every node; how many released.
    pub(crate) async fn release_everywhere(
        &self,
        keys: &Keys,
        token: &str,
        ttl: Duration,
    ) -> usize {
        self.release_counted(keys, token, ttl).await.released
    }

    /// LOCK.RELEASE on every node: how many released, and how many
    /// answered at all (released or not held), with the first error.
    pub(crate) async fn release_counted(
        &self,
        keys: &Keys,
        token: &str,
        ttl: Duration,
    ) -> Released {
        let limit = self.node_timeout(ttl);
        let replies = join_all(self.nodes.iter().map(|n| n.release(keys, token, limit))).await;
        Released {
            released: replies.iter().filter(|r| matches!(r, Ok(true))).count(),
            answered: replies.iter().filter(|r| r.is_ok()).count(),
            first_error: replies.into_iter().find_map(|r| r.err()),
        }
    }

    /// LOCK.RELEASE on every node without the async runtime (a thread per
    /// node, fresh connections); how many released within twice the node
    /// timeout (connecting, then the command). A thread stuck on a node that
    /// does not answer is left behind rather than waited for: the redis
    /// crate's connection setup has no read timeout.
    pub(crate) fn release_everywhere_blocking(
        self: &Arc<Self>,
        keys: &Keys,
        token: &str,
        ttl: Duration,
    ) -> usize {
        let limit = self.node_timeout(ttl);
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..self.nodes.len() {
            let (group, tx) = (Arc::clone(self), tx.clone());
            let (keys, token) = (keys.clone(), token.to_string());
            std::thread::spawn(move || {
                let _ = tx.send(group.nodes[i].release_blocking(&keys, &token, limit));
            });
        }
        drop(tx);
        let deadline = std::time::Instant::now() + 2 * limit;
        let mut released = 0;
        for _ in 0..self.nodes.len() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(Ok(true)) => released += 1,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        released
    }

    /// LOCK.EXTEND on every node (with `value`, a proclaim: `VALUE v`): the
    /// new validity deadline if a majority extended before both the TTL
    /// (less drift) and `valid_until` ran out.
    pub(crate) async fn extend_everywhere(
        &self,
        keys: &Keys,
        (token, value): (&str, Option<&str>),
        ttl: Duration,
        valid_until: Instant,
    ) -> Result<Option<Instant>> {
        crate::clock::check_ttl(ttl)?;
        let limit = self.node_timeout(ttl);
        let start = Sent::now();
        let extends = self
            .nodes
            .iter()
            .map(|n| n.extend(keys, (token, value), ttl, limit));
        let replies = join_all(extends).await;
        let extended = replies.iter().filter(|r| matches!(r, Ok(true))).count();
        let now = Instant::now();
        if extended >= self.quorum() && now < valid_until && start.in_time(ttl) {
            return Ok(Some(start.valid_until(ttl)));
        }
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        if answered < self.quorum() {
            let first = replies.into_iter().find_map(|r| r.err());
            return Err(first.unwrap_or(Error::Timeout));
        }
        // The lock is lost. Nodes that did extend would keep a new lease
        // for nobody, shutting out the next holder there for a whole TTL:
        // give it back.
        // A node that extended only some keys of a multi-key lock counts
        // as not extended: give those back too.
        if extended > 0 || keys.is_several() {
            self.release_everywhere(keys, token, ttl).await;
        }
        Ok(None)
    }
}

/// What a release on every node found.
pub(crate) struct Released {
    pub released: usize,
    pub answered: usize,
    pub first_error: Option<Error>,
}

impl Released {
    /// Released on a majority: true; a majority answered without that:
    /// false (it was not held); fewer answered: the outcome is unknown, an
    /// error (the nodes' own, or a timeout).
    pub fn held(self, quorum: usize) -> Result<bool> {
        if self.released >= quorum {
            Ok(true)
        } else if self.answered >= quorum {
            Ok(false)
        } else {
            Err(self.first_error.unwrap_or(Error::Timeout))
        }
    }
}
