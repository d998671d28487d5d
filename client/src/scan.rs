//! Listing the locks: `LOCK.SCAN` paged to its end on every server (each
//! master of a cluster), for `redis-lock exporter` and `redis-lock top`.

use std::time::Duration;

use futures_util::future::join_all;
use redis_lock_core::protocol::{command, info_field};

use crate::node::{within, Node};
use crate::{Error, LockClient, Result};

/// A held lock as `LOCK.SCAN` lists it (its `LOCK.INFO` fields with its key).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListedLock {
    /// The lock's key.
    pub key: Vec<u8>,
    /// `exclusive` or `shared`.
    pub mode: String,
    /// A shared key's LIMIT.
    pub limit: Option<i64>,
    /// The newest holder's fencing token.
    pub fence: i64,
    /// Milliseconds left of the newest holder's lease.
    pub ttl_ms: i64,
    /// How many clients wait in the key's line.
    pub waiters: i64,
    /// How long the first in line has waited, ms (None: nobody waits).
    pub longest_wait_ms: Option<i64>,
    /// The grants the key has had on its server since that started, freed
    /// between them or not (never fewer; more only where the server's
    /// fixed-size tally gives other keys the same counters). None from a
    /// module that does not count them. Two listings apart give a rate.
    pub grants: Option<u64>,
    /// Every live holder, in grant order.
    pub holders: Vec<ListedHolder>,
    /// The newest holder's public value.
    pub value: Option<Vec<u8>>,
}

/// One holder of a [`ListedLock`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListedHolder {
    /// Its token; None where the user may not write the key.
    pub token: Option<Vec<u8>>,
    /// Its fencing token.
    pub fence: i64,
    /// Milliseconds left of its lease.
    pub ttl_ms: i64,
    /// When it was granted (Unix ms), when the server knows.
    pub granted_ms: Option<i64>,
    /// Its public value.
    pub value: Option<Vec<u8>>,
}

/// The most pages one server's listing reads (of [`PAGE`] entries each):
/// a bound on a listing that a server keeps refilling.
const MAX_PAGES: usize = 10_000;
/// The `COUNT` of each page.
const PAGE: usize = 1_000;

impl LockClient {
    /// Every held lock of every server (each master of a cluster, the node
    /// itself otherwise), from `LOCK.SCAN` paged to its end, as
    /// (`host:port`, locks) in the order the URLs were given; only keys
    /// matching `pattern` (a glob) when given, only locks with waiters when
    /// `waiting`. Each server is read within `limit`. A server that does not
    /// answer, or refuses (NOPERM, no module), gives its error.
    #[doc(hidden)] // for the redis-lock command's exporter and top
    pub async fn list_locks(
        &self,
        pattern: Option<&str>,
        waiting: bool,
        limit: Duration,
    ) -> Vec<(String, Result<Vec<ListedLock>>)> {
        let lists = self
            .inner
            .group
            .nodes
            .iter()
            .map(|n| n.list_locks(pattern, waiting, limit));
        join_all(lists).await.into_iter().flatten().collect()
    }
}

impl Node {
    async fn list_locks(
        &self,
        pattern: Option<&str>,
        waiting: bool,
        limit: Duration,
    ) -> Vec<(String, Result<Vec<ListedLock>>)> {
        let page = |cursor: &str| {
            let mut cmd = redis::cmd(command::SCAN);
            cmd.arg(cursor).arg(command::COUNT).arg(PAGE);
            if let Some(p) = pattern {
                cmd.arg(command::MATCH).arg(p);
            }
            if waiting {
                cmd.arg(command::WAITING);
            }
            cmd
        };
        if self.cluster.is_none() {
            let listed = within(limit, async {
                // (Multiplexed: a clone per page shares the connection.)
                let conn = self.connection(limit).await?;
                pages(|cursor| {
                    let cmd = page(cursor);
                    let mut conn = conn.clone();
                    async move { Ok(cmd.query_async::<redis::Value>(&mut conn).await?) }
                })
                .await
            })
            .await
            .map_err(|e| self.named(e));
            return vec![(self.addr().to_string(), listed)];
        }
        // A cluster: each master (from the slot map), all at once, so the
        // listing takes the slowest master's time, not the sum of theirs.
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let (conn, masters) = match within(limit, self.cluster_masters(limit)).await {
            Ok(found) => found,
            Err(e) => return vec![(self.addr().to_string(), Err(self.named(e)))],
        };
        let reads = masters.into_iter().map(|(host, port)| {
            let conn = conn.clone();
            async move {
                let listed = within(
                    limit,
                    pages(|cursor| {
                        let cmd = page(cursor);
                        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port,
                        });
                        let mut conn = conn.clone();
                        async move { Ok(conn.route_command(&cmd, route).await?) }
                    }),
                )
                .await
                .map_err(|e| self.named(e));
                (format!("{host}:{port}"), listed)
            }
        });
        futures_util::future::join_all(reads).await
    }
}

/// Reads pages from cursor 0 until the server answers cursor 0 (at most
/// [`MAX_PAGES`]), each key once (a lock renewed into a slot the scan had
/// not reached comes twice).
async fn pages<F, Fut>(mut read: F) -> Result<Vec<ListedLock>>
where
    F: FnMut(&str) -> Fut,
    Fut: std::future::Future<Output = Result<redis::Value>>,
{
    let (mut cursor, mut all) = ("0".to_string(), Vec::<ListedLock>::new());
    // Where each key is in `all` (a linear search would make a listing of
    // 100,000 locks take billions of comparisons).
    let mut at: std::collections::HashMap<Vec<u8>, usize> = std::collections::HashMap::new();
    for _ in 0..MAX_PAGES {
        let (next, listed) = parse_page(read(&cursor).await?)?;
        for l in listed {
            match at.get(&l.key) {
                Some(&i) => all[i] = l, // the later reading
                None => {
                    at.insert(l.key.clone(), all.len());
                    all.push(l);
                }
            }
        }
        if next == "0" {
            break;
        }
        cursor = next;
    }
    Ok(all)
}

fn unexpected(what: &str, v: &redis::Value) -> Error {
    Error::Redis(redis::RedisError::from((
        redis::ErrorKind::TypeError,
        "LOCK.SCAN did not answer a page",
        format!("{what}: {v:?}"),
    )))
}

/// A map (RESP3) or flat array (RESP2) as its pairs.
fn pairs(v: &redis::Value) -> Option<Vec<(String, redis::Value)>> {
    let pairs: Vec<(redis::Value, redis::Value)> = match v {
        redis::Value::Map(p) => p.clone(),
        redis::Value::Array(items) => items
            .chunks_exact(2)
            .map(|p| (p[0].clone(), p[1].clone()))
            .collect(),
        _ => return None,
    };
    pairs
        .into_iter()
        .map(|(k, v)| Some((redis::from_redis_value(&k).ok()?, v)))
        .collect()
}

/// One `LOCK.SCAN` reply: the next cursor and its locks.
fn parse_page(reply: redis::Value) -> Result<(String, Vec<ListedLock>)> {
    let redis::Value::Array(parts) = &reply else {
        return Err(unexpected("not an array", &reply));
    };
    let [cursor, entries] = &parts[..] else {
        return Err(unexpected("not two parts", &reply));
    };
    let cursor: String = redis::from_redis_value(cursor)?;
    let redis::Value::Array(entries) = entries else {
        return Err(unexpected("no entries", entries));
    };
    let locks = entries.iter().map(parse_entry).collect::<Result<_>>()?;
    Ok((cursor, locks))
}

fn parse_entry(v: &redis::Value) -> Result<ListedLock> {
    let fields = pairs(v).ok_or_else(|| unexpected("an entry", v))?;
    let mut l = ListedLock {
        key: Vec::new(),
        mode: String::new(),
        limit: None,
        fence: 0,
        ttl_ms: 0,
        waiters: 0,
        longest_wait_ms: None,
        grants: None,
        holders: Vec::new(),
        value: None,
    };
    for (name, v) in &fields {
        match name.as_str() {
            info_field::KEY => l.key = redis::from_redis_value(v)?,
            info_field::MODE => l.mode = redis::from_redis_value(v)?,
            info_field::LIMIT => l.limit = redis::from_redis_value(v)?,
            info_field::FENCE => l.fence = redis::from_redis_value(v)?,
            info_field::TTL => l.ttl_ms = redis::from_redis_value(v)?,
            info_field::WAITERS => l.waiters = redis::from_redis_value(v)?,
            info_field::LONGEST_WAIT => l.longest_wait_ms = redis::from_redis_value(v)?,
            info_field::GRANTS => l.grants = redis::from_redis_value(v)?,
            info_field::VALUE => l.value = redis::from_redis_value(v)?,
            info_field::HOLDERS => {
                let redis::Value::Array(holders) = v else {
                    return Err(unexpected("holders", v));
                };
                l.holders = holders.iter().map(parse_holder).collect::<Result<_>>()?;
            }
            _ => {}
        }
    }
    Ok(l)
}

fn parse_holder(v: &redis::Value) -> Result<ListedHolder> {
    let fields = pairs(v).ok_or_else(|| unexpected("a holder", v))?;
    let mut h = ListedHolder {
        token: None,
        fence: 0,
        ttl_ms: 0,
        granted_ms: None,
        value: None,
    };
    for (name, v) in &fields {
        match name.as_str() {
            info_field::TOKEN => h.token = redis::from_redis_value(v)?,
            info_field::FENCE => h.fence = redis::from_redis_value(v)?,
            info_field::TTL => h.ttl_ms = redis::from_redis_value(v)?,
            info_field::GRANTED => h.granted_ms = redis::from_redis_value(v)?,
            info_field::VALUE => h.value = redis::from_redis_value(v)?,
            _ => {}
        }
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value::{Array, BulkString, Int, Map, Nil};

    fn word(w: &str) -> redis::Value {
        BulkString(w.as_bytes().to_vec())
    }

    #[test]
    fn a_page_reads_in_both_protocols() {
        let holder = Array(vec![
            word("token"),
            word("t"),
            word("fence"),
            Int(7),
            word("ttl"),
            Int(900),
            word("granted"),
            Nil,
            word("value"),
            Nil,
        ]);
        let entry = Array(vec![
            word("key"),
            word("orders:1"),
            word("fence"),
            Int(7),
            word("waiters"),
            Int(2),
            word("mode"),
            word("exclusive"),
            word("holders"),
            Array(vec![holder]),
            word("longest_wait"),
            Int(40),
            word("grants"),
            Int(12),
        ]);
        let (cursor, locks) = parse_page(Array(vec![word("123"), Array(vec![entry])])).unwrap();
        assert_eq!(cursor, "123");
        assert_eq!(locks[0].key, b"orders:1");
        assert_eq!(locks[0].waiters, 2);
        assert_eq!(locks[0].longest_wait_ms, Some(40));
        assert_eq!(locks[0].grants, Some(12));
        assert_eq!(locks[0].holders[0].token.as_deref(), Some(&b"t"[..]));
        let resp3 = Map(vec![(word("key"), word("k")), (word("longest_wait"), Nil)]);
        let (_, locks) = parse_page(Array(vec![word("0"), Array(vec![resp3])])).unwrap();
        assert_eq!(locks[0].key, b"k");
        assert_eq!(locks[0].longest_wait_ms, None);
        assert_eq!(locks[0].grants, None, "a module that does not count them");
        assert!(parse_page(Int(3)).is_err());
        assert!(parse_page(Array(vec![word("0")])).is_err());
    }
}
