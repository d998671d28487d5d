//! A node's settings as its user may read them (INFO, CONFIG GET): its
//! identity, persistence and fence mark, and whether a crash could make it
//! grant a lock that is still held.

use redis_lock_core::protocol;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::node::{within, Conn, Node};

/// How one node is set up, as far as its user may read it (`CONFIG GET`
/// may be refused by ACL: those fields are then None).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeSettings {
    /// The node as `redis[s]://host:port/db`, without credentials.
    pub url: String,
    /// The server's `run_id` (INFO server): one server under two names has one.
    pub run_id: String,
    /// The server's `redis_version` (INFO server).
    pub version: String,
    /// Whether the redis-lock module answers (INFO lock has its fields).
    pub module_loaded: bool,
    /// The node's fencing high-water mark (`lock_fence_hwm`).
    pub fence_hwm: Option<i64>,
    /// `lock.restart-delay-ms`: how long the node grants nothing after it starts.
    pub restart_delay_ms: Option<i64>,
    /// `appendonly`.
    pub appendonly: Option<bool>,
    /// `appendfsync` (`always`, `everysec` or `no`).
    pub appendfsync: Option<String>,
}

impl NodeSettings {
    /// Whether a crash and restart of this node could let it grant a lock
    /// that is still held: it does not fsync every write (`appendonly yes`
    /// with `appendfsync always`) and its `lock.restart-delay-ms` is below
    /// `ttl`. None when that cannot be told (CONFIG GET refused).
    pub fn unsafe_after_crash(&self, ttl: Duration) -> Option<bool> {
        let fsyncs_every_write =
            self.appendonly == Some(true) && self.appendfsync.as_deref() == Some("always");
        if fsyncs_every_write {
            return Some(false);
        }
        self.restart_delay_ms
            .map(|delay| (delay as u128) < ttl.as_millis())
    }

    /// What to say when [`unsafe_after_crash`](Self::unsafe_after_crash)
    /// holds for `ttl` (None otherwise): one text for the library's warning,
    /// `redis-lock run`'s and `redis-lock doctor`'s.
    pub fn crash_warning(&self, ttl: Duration) -> Option<String> {
        (self.unsafe_after_crash(ttl) == Some(true)).then(|| {
            format!(
                "{}: lock.restart-delay-ms {} is below the TTL ({} ms) without appendfsync always: after a crash it may grant a lock that is still held (set lock.restart-delay-ms >= {} or appendonly yes + appendfsync always)",
                self.url,
                self.restart_delay_ms.unwrap_or(0),
                ttl.as_millis(),
                ttl.as_millis()
            )
        })
    }
}

impl NodeSettings {
    /// One server's settings from its `INFO server lock` text and CONFIG
    /// values.
    fn read(
        url: String,
        info: &str,
        restart_delay_ms: Option<String>,
        appendonly: Option<String>,
        appendfsync: Option<String>,
    ) -> NodeSettings {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
        };
        NodeSettings {
            url,
            run_id: field("run_id").unwrap_or_default(),
            version: field("redis_version").unwrap_or_default(),
            module_loaded: field("lock_fence_hwm").is_some(),
            fence_hwm: field("lock_fence_hwm").and_then(|v| v.parse().ok()),
            restart_delay_ms: restart_delay_ms.and_then(|v| v.parse().ok()),
            appendonly: appendonly.map(|v| v == "yes"),
            appendfsync,
        }
    }

    /// A cluster as one node: its masters' settings combined so that the
    /// weakest stands. The persistence fields come as a unit from the master
    /// a crash would hurt most: of those that do not fsync every write, the
    /// one with the lowest (or an unreadable) restart delay; the module
    /// counts as loaded only if every master has it, the fence mark is the
    /// lowest, and `run_id` lists every master's.
    fn combine(url: String, mut masters: Vec<NodeSettings>) -> NodeSettings {
        masters.sort_by(|a, b| a.url.cmp(&b.url));
        let fsyncs = |m: &NodeSettings| {
            m.appendonly == Some(true) && m.appendfsync.as_deref() == Some("always")
        };
        let weakest = masters
            .iter()
            .filter(|m| !fsyncs(m))
            .min_by_key(|m| m.restart_delay_ms.unwrap_or(i64::MIN))
            .or(masters.first());
        let mut ids: Vec<&str> = masters.iter().map(|m| m.run_id.as_str()).collect();
        ids.sort_unstable();
        let fence_marks: Option<Vec<i64>> = masters.iter().map(|m| m.fence_hwm).collect();
        NodeSettings {
            url,
            run_id: ids.join(","),
            version: masters
                .first()
                .map(|m| m.version.clone())
                .unwrap_or_default(),
            module_loaded: !masters.is_empty() && masters.iter().all(|m| m.module_loaded),
            fence_hwm: fence_marks.and_then(|v| v.into_iter().min()),
            restart_delay_ms: weakest.and_then(|m| m.restart_delay_ms),
            appendonly: weakest.and_then(|m| m.appendonly),
            appendfsync: weakest.and_then(|m| m.appendfsync.clone()),
        }
    }
}

impl Node {
    /// Reads the node's identity, persistence settings and fence mark (a
    /// cluster's: every master's, combined).
    pub async fn settings(&self, limit: Duration) -> Result<NodeSettings> {
        if self.cluster.is_some() {
            return self.cluster_settings(limit).await;
        }
        let mut info = redis::cmd("INFO");
        info.arg("server").arg("lock");
        let info = async move {
            let text: String = self.run(info, limit).await?;
            Ok::<_, Error>(text)
        };
        let config = |name: &'static str| async move {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("GET").arg(name);
            // A name, value pair on RESP2; a map on RESP3.
            let mut pair: std::collections::HashMap<String, String> =
                self.run(cmd, limit).await.ok()?;
            pair.remove(name)
        };
        // Asked together: one round trip on the shared connection.
        let (text, restart_delay_ms, appendonly, appendfsync) = tokio::join!(
            info,
            config(RESTART_DELAY_OPTION.as_str()),
            config("appendonly"),
            config("appendfsync")
        );
        Ok(NodeSettings::read(
            self.shown.clone(),
            &text?,
            restart_delay_ms,
            appendonly,
            appendfsync,
        ))
    }

    /// [`settings`](Self::settings) of a cluster: INFO and each CONFIG GET
    /// sent to every master (the cluster client would send CONFIG GET to
    /// one node at random), answered as a map from each master's address.
    async fn cluster_settings(&self, limit: Duration) -> Result<NodeSettings> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
        use std::collections::HashMap;
        let Conn::Cluster(conn) = self.connection(limit).await? else {
            return Err(Error::Config("not a cluster connection".into()));
        };
        let on_masters = |cmd: redis::Cmd| {
            let mut conn = conn.clone();
            async move {
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let reply = within(limit, async { Ok(conn.route_command(&cmd, all).await?) });
                let per_master: HashMap<String, redis::Value> =
                    redis::from_redis_value(&reply.await?)?;
                Ok::<_, Error>(per_master)
            }
        };
        let config = |name: &'static str| {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("GET").arg(name);
            let reply = on_masters(cmd);
            async move {
                let per_master = reply.await.unwrap_or_default();
                per_master
                    .into_iter()
                    .filter_map(|(addr, v)| {
                        let mut pair: HashMap<String, String> = redis::from_redis_value(&v).ok()?;
                        Some((addr, pair.remove(name)?))
                    })
                    .collect::<HashMap<String, String>>()
            }
        };
        let mut info = redis::cmd("INFO");
        info.arg("server").arg("lock");
        let (texts, mut delays, mut appendonly, mut appendfsync) = tokio::join!(
            on_masters(info),
            config(RESTART_DELAY_OPTION.as_str()),
            config("appendonly"),
            config("appendfsync")
        );
        let mut masters = Vec::new();
        for (addr, text) in texts? {
            let text: String = redis::from_redis_value(&text)?;
            masters.push(NodeSettings::read(
                format!("redis://{addr}/"),
                &text,
                delays.remove(&addr),
                appendonly.remove(&addr),
                appendfsync.remove(&addr),
            ));
        }
        Ok(NodeSettings::combine(self.shown.clone(), masters))
    }
}

impl Node {
    /// One `INFO` section's text from each server behind this node, as
    /// (`host:port`, text): the node itself, or each master of a cluster
    /// (sorted by address). One entry with the node's address and the
    /// error when it did not answer within `limit`.
    pub(crate) async fn info_texts(
        &self,
        section: &str,
        limit: Duration,
    ) -> Vec<(String, Result<String>)> {
        let mut info = redis::cmd("INFO");
        info.arg(section);
        if self.cluster.is_none() {
            // The connection's own set-up waits too: bounded as a whole.
            let text = within(limit, self.run(info, limit)).await;
            return vec![(self.addr().to_string(), text)];
        }
        // Every step by one deadline: each master's read ends by it on its
        // own, so one master that does not answer (down, as in a failover)
        // is its own error, not every master's.
        let deadline = tokio::time::Instant::now() + limit;
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let found = tokio::time::timeout_at(deadline, self.cluster_masters(limit))
            .await
            .unwrap_or(Err(Error::Timeout));
        let (conn, masters) = match found {
            Ok(found) => found,
            Err(e) => return vec![(self.addr().to_string(), Err(e))],
        };
        let reads = masters.into_iter().map(|(host, port)| {
            let (info, mut conn) = (info.clone(), conn.clone());
            async move {
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port,
                });
                let text = tokio::time::timeout_at(deadline, async {
                    let v = conn.route_command(&info, route).await?;
                    Ok(redis::from_redis_value::<String>(&v)?)
                })
                .await
                .unwrap_or(Err(Error::Timeout));
                (format!("{host}:{port}"), text)
            }
        });
        futures_util::future::join_all(reads).await
    }
}

impl Node {
    /// This cluster node's connection and its masters as (host, port),
    /// from the slot map any node gives: a random node each time (one that
    /// is down fails, the next try is likely another), until one answers.
    /// The caller bounds it.
    pub(crate) async fn cluster_masters(
        &self,
        limit: Duration,
    ) -> Result<(redis::cluster_async::ClusterConnection, Vec<(String, u16)>)> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let Conn::Cluster(conn) = self.connection(limit).await? else {
            return Err(Error::Config("not a cluster connection".into()));
        };
        let slots = redis::cmd("CLUSTER").arg("SLOTS").clone();
        loop {
            let any = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
            let asked = within(limit / 4, async {
                Ok(conn.clone().route_command(&slots, any).await?)
            });
            if let Ok(map) = asked.await {
                return Ok((conn, masters_in(&map)?));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The masters a `CLUSTER SLOTS` reply names, as (host, port), each once
/// and sorted: each slot range's first node is its master.
fn masters_in(reply: &redis::Value) -> Result<Vec<(String, u16)>> {
    let unexpected = || Error::Config(format!("CLUSTER SLOTS answered {reply:?}"));
    let redis::Value::Array(ranges) = reply else {
        return Err(unexpected());
    };
    let mut masters = std::collections::BTreeSet::new();
    for range in ranges {
        let redis::Value::Array(parts) = range else {
            return Err(unexpected());
        };
        let Some(redis::Value::Array(master)) = parts.get(2) else {
            return Err(unexpected());
        };
        let host: String = master
            .first()
            .and_then(|h| redis::from_redis_value(h).ok())
            .ok_or_else(unexpected)?;
        let port: u16 = master
            .get(1)
            .and_then(|p| redis::from_redis_value(p).ok())
            .ok_or_else(unexpected)?;
        masters.insert((host, port));
    }
    Ok(masters.into_iter().collect())
}

/// `lock.restart-delay-ms`, as CONFIG GET names it.
static RESTART_DELAY_OPTION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{}.{}",
        protocol::MODULE_NAME,
        protocol::RESTART_DELAY_MS.name()
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    fn master(url: &str, fsync: &str, delay: Option<i64>) -> NodeSettings {
        NodeSettings {
            url: url.into(),
            run_id: format!("id-{url}"),
            version: "7.0.15".into(),
            module_loaded: true,
            fence_hwm: Some(1),
            restart_delay_ms: delay,
            appendonly: Some(true),
            appendfsync: Some(fsync.into()),
        }
    }

    /// A cluster is as safe as its weakest master, judged master by master:
    /// one that fsyncs every write (delay 0) beside one with a delay above
    /// the TTL is safe; a master with a short delay and no fsync makes the
    /// cluster unsafe, whatever the order; an unreadable delay is unknown.
    #[test]
    fn a_cluster_is_judged_by_its_weakest_master() {
        let ttl = Duration::from_secs(30);
        let judge = |masters: Vec<NodeSettings>| {
            NodeSettings::combine("c".into(), masters).unsafe_after_crash(ttl)
        };
        let safe = vec![
            master("a", "always", Some(0)),
            master("b", "everysec", Some(60_000)),
        ];
        assert_eq!(judge(safe.clone()), Some(false));
        let mut weak = safe.clone();
        weak.push(master("c", "everysec", Some(1000)));
        assert_eq!(judge(weak.clone()), Some(true));
        weak.reverse();
        assert_eq!(judge(weak), Some(true));
        let mut unknown = safe;
        unknown.push(master("d", "everysec", None));
        assert_eq!(judge(unknown), None);
        let c = NodeSettings::combine(
            "c".into(),
            vec![
                master("b", "always", Some(0)),
                master("a", "always", Some(5)),
            ],
        );
        assert_eq!(c.run_id, "id-a,id-b");
        assert_eq!(c.unsafe_after_crash(ttl), Some(false));
    }
}
