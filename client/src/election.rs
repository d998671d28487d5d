//! Leader election over a lock: candidates wait in the server's FIFO line
//! (`LOCK.ACQUIRE ... BLOCK ... VALUE v`), the leader is the holder, its
//! public value (an address, an id) is what followers read, and followers
//! are told of every change by the server (`LOCK.OBSERVE key AFTER fence
//! VALUE v BLOCK 0`: the fence and the value last seen), a vacancy
//! included, with no polling.
//!
//! A leader is a [`LockGuard`] with a value: its fence goes with every
//! write it makes (`LOCK.EXEC`, `LOCK.FENCED` or the resource's own check),
//! so a leader that paused past its lease cannot write once another was
//! elected; its [`lost`](Leadership::lost) signal fires when a renewal is
//! refused or its validity runs out.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use redis_lock_core::protocol::{command, info_field, OBSERVE_GRACE_MS, OBSERVE_WAIT_MS};
use tokio::sync::mpsc;

use crate::client::LockClient;
use crate::error::{Error, Result};
use crate::group::Group;
use crate::guard::{Lease, LockGuard, LostSignal};
use crate::node::{within, Conn, Node};

/// How long one campaign round waits in the line before it queues again
/// (a campaign waits until it wins or is dropped).
const CAMPAIGN_ROUND: Duration = Duration::from_secs(24 * 3600);

/// A key's leader: its fencing token and public value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's fencing token (the group's, on a Redlock group).
    pub fence: i64,
    /// What it proclaimed (`VALUE`), if anything. Values are bytes on the
    /// server; bytes that are not UTF-8 are read with U+FFFD in their place
    /// (a writer's binary value never ends a follower's stream).
    pub value: Option<String>,
}

/// What an observer is told: a leader, or that there is none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// This leader holds the key (a new one, or the same with a new value).
    Leader(Leader),
    /// Nobody leads: released, deleted, or its lease ended.
    Vacant,
}

impl Observed {
    /// The fence an observer passes as `AFTER` once it saw this (0: none).
    fn fence(&self) -> i64 {
        match self {
            Observed::Leader(l) => l.fence,
            Observed::Vacant => 0,
        }
    }
}

/// The election of one key, made by [`LockClient::election`].
#[derive(Clone, Debug)]
pub struct Election<'a> {
    client: &'a LockClient,
    key: String,
    renew: bool,
}

impl LockClient {
    /// The election of `key`: [`campaign`](Election::campaign) to lead it,
    /// [`leader`](Election::leader) and [`observe`](Election::observe) to
    /// follow it.
    pub fn election(&self, key: impl Into<String>) -> Election<'_> {
        Election {
            client: self,
            key: key.into(),
            renew: true,
        }
    }
}

impl Election<'_> {
    /// Whether a leader's lease is renewed in the background (default:
    /// yes, whatever [`Options::auto_renew`](crate::Options::auto_renew)
    /// says). Off, leadership ends with its first lease unless the leader
    /// renews it ([`Leadership::proclaim`] does).
    pub fn renew(mut self, on: bool) -> Self {
        self.renew = on;
        self
    }

    /// Waits in the server's line (for ever: drop the future to stop, which
    /// leaves the line at once) until this candidate leads with `value`,
    /// renewed in the background with leases of `ttl`. On a Redlock group
    /// the line is the ordering node's and the leader holds a majority.
    pub async fn campaign(&self, value: impl Into<String>, ttl: Duration) -> Result<Leadership> {
        let value = value.into();
        loop {
            if let Some(won) = self
                .try_campaign(value.clone(), ttl, CAMPAIGN_ROUND)
                .await?
            {
                return Ok(won);
            }
        }
    }

    /// [`campaign`](Self::campaign) for at most `wait` in the line
    /// (`Duration::ZERO`: one attempt): None if another leads by then.
    pub async fn try_campaign(
        &self,
        value: impl Into<String>,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Leadership>> {
        let value = value.into();
        let won = self
            .client
            .acquire(&self.key, ttl)
            .value(value.clone())
            .auto_renew(self.renew)
            .wait(wait)
            .await?;
        Ok(won.map(|guard| Leadership {
            guard,
            value: std::sync::Mutex::new(value),
        }))
    }

    /// The leader now: the one a majority of nodes agree on (the one node's
    /// when there is one), or None when there is none (or no majority
    /// agrees, as while a change is under way).
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let group = &self.client.inner.group;
        let limit = group.options.node_timeout.unwrap_or(Duration::from_secs(5));
        let reads = group.nodes.iter().map(|n| async move {
            let read = within(limit, async {
                let mut conn = n.open(limit).await?;
                observe_once(&mut conn, &self.key, None).await
            })
            .await;
            if matches!(&read, Err(e) if e.is_transient()) {
                n.ask_sentinels_again();
            }
            read
        });
        let seen: Vec<Observed> = futures_util::future::join_all(reads)
            .await
            .into_iter()
            .filter_map(|r| r.ok().flatten())
            .map(|(observed, _)| observed)
            .collect();
        let answered = seen.len();
        if answered < group.quorum() {
            return Err(Error::Timeout);
        }
        Ok(match majority(&seen, group.quorum()) {
            Some(Observed::Leader(l)) => Some(l),
            _ => None,
        })
    }

    /// Every change of the key's leader, as it happens: first the state
    /// now, then each new leader, each new value a leader proclaims, and
    /// each vacancy (a release, or a lease that ended with no command). One
    /// connection per node, blocked in the server (`LOCK.OBSERVE ... AFTER
    /// fence VALUE v BLOCK 30000`, sent again after each nil, so a
    /// connection that went quiet without closing is found and replaced
    /// within about 35 s); after a reconnect the stream reads the state again
    /// and goes on from what it last told, so no change is repeated and the
    /// newest is never missed (changes in between are seen as the newest).
    /// On a Redlock group a state is told once a majority agree on it (a
    /// node that is reconnecting counts for nothing meanwhile). An error a
    /// node gives (NOPERM, WRONGTYPE) ends the stream with it, on a group
    /// once the nodes left are no longer a majority; lost connections are
    /// retried (for Sentinel, through the sentinels: the master they name
    /// now). Dropping the stream closes its
    /// connections.
    pub fn observe(&self) -> Observer {
        let group = Arc::clone(&self.client.inner.group);
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(follow(group, self.key.clone(), tx));
        Observer { rx }
    }
}

/// The stream [`Election::observe`] returns.
#[derive(Debug)]
pub struct Observer {
    rx: mpsc::Receiver<Result<Observed>>,
}

impl Stream for Observer {
    type Item = Result<Observed>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// A won campaign: the lock with the leader's value, renewed in the
/// background until [`resign`](Self::resign) or the drop (which releases
/// it, as a guard's drop does).
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    value: std::sync::Mutex<String>,
}

impl Leadership {
    /// The leader's fencing token: send it with every write.
    pub fn fence(&self) -> i64 {
        self.guard.lease().fence()
    }

    /// The value it leads with (the last one proclaimed).
    pub fn value(&self) -> String {
        self.value.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The lease, for guarded writes ([`Lease::exec`], [`Lease::fenced`])
    /// and its validity.
    pub fn lease(&self) -> Lease {
        self.guard.lease()
    }

    /// Fires when leadership is lost (a renewal refused, or the validity
    /// ran out without one): stop acting as the leader.
    pub fn lost(&self) -> LostSignal {
        self.guard.lease().lost().clone()
    }

    /// Changes the leader's public value (`LOCK.EXTEND ... VALUE`, which
    /// also renews the lease): observers are told. Ok(false): leadership
    /// was lost (nothing is granted anew).
    pub async fn proclaim(&self, value: impl Into<String>) -> Result<bool> {
        let value = value.into();
        let ttl = self.guard.lease().ttl();
        let done = self.guard.proclaim(&value, ttl).await?;
        if done {
            *self.value.lock().unwrap_or_else(|p| p.into_inner()) = value;
        }
        Ok(done)
    }

    /// Steps down: releases the lock, and the server hands it to the next
    /// candidate in line at once. True if it was still the leader.
    pub async fn resign(self) -> Result<bool> {
        self.guard.release().await
    }
}

/// The state a majority of `seen` agree on (by fence and value).
fn majority(seen: &[Observed], quorum: usize) -> Option<Observed> {
    seen.iter()
        .find(|s| seen.iter().filter(|o| o == s).count() >= quorum)
        .cloned()
}

/// Runs one observer per node and tells `tx` each state a majority of
/// them agree on, when it differs from the last one told. A node that is
/// reconnecting counts for nothing until it reads the state again; one
/// that refuses (NOPERM, WRONGTYPE) is left out, and the stream ends with
/// its error only when the nodes left are no longer a majority.
async fn follow(group: Arc<Group>, key: String, tx: mpsc::Sender<Result<Observed>>) {
    let (seen_tx, mut seen_rx) = mpsc::channel::<(usize, Result<Option<Observed>>)>(64);
    for i in 0..group.nodes.len() {
        let (group, key, seen_tx) = (Arc::clone(&group), key.clone(), seen_tx.clone());
        tokio::spawn(async move { follow_node(&group.nodes[i], &key, i, seen_tx).await });
    }
    drop(seen_tx);
    let mut states: Vec<Option<Observed>> = vec![None; group.nodes.len()];
    let mut refused = 0;
    let mut told: Option<Observed> = None;
    loop {
        let next = tokio::select! {
            next = seen_rx.recv() => next,
            _ = tx.closed() => return,
        };
        let Some((i, seen)) = next else {
            return;
        };
        states[i] = match seen {
            Ok(seen) => seen,
            Err(e) => {
                refused += 1;
                if group.nodes.len() - refused < group.quorum() {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                tracing::warn!(key, error = %e, "a node refuses to be observed: left out");
                None
            }
        };
        let known: Vec<Observed> = states.iter().flatten().cloned().collect();
        if let Some(now) = majority(&known, group.quorum()) {
            if told.as_ref() != Some(&now) {
                told = Some(now.clone());
                if tx.send(Ok(now)).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// One node's observer: reads the state, then waits for each change on a
/// connection of its own; after a lost connection, reads again and goes on
/// from what it last saw. Sends each state that differs from the last one
/// sent; ends when nobody listens or the node refuses (an error sent).
async fn follow_node(
    node: &Node,
    key: &str,
    index: usize,
    seen_tx: mpsc::Sender<(usize, Result<Option<Observed>>)>,
) {
    let limit = Duration::from_secs(5);
    let mut last: Option<Observed> = None;
    let mut pause = Duration::from_millis(50);
    loop {
        let watched = async {
            let mut conn = node.open(limit).await?;
            // The state now (a resync after a reconnect), then each change:
            // each wait names the fence and the value's bytes last seen.
            let mut after: Option<(i64, Vec<u8>)> = None;
            loop {
                // Bounded on this side too: a connection that went quiet
                // without closing (the host gone, a NAT that forgot the
                // flow) answers nothing, and is replaced.
                let seen = within(
                    OBSERVE_BLOCK + OBSERVE_GRACE,
                    observe_once(&mut conn, key, after.as_ref()),
                )
                .await?;
                let Some((seen, raw_value)) = seen else {
                    // Nil: nothing changed within OBSERVE_BLOCK (or the
                    // wait was let go, CLIENT UNBLOCK ... TIMEOUT): wait
                    // again from what was seen.
                    continue;
                };
                if last.as_ref() != Some(&seen) {
                    last = Some(seen.clone());
                    if seen_tx.send((index, Ok(Some(seen.clone())))).await.is_err() {
                        return Ok(());
                    }
                }
                after = Some((seen.fence(), raw_value));
            }
        };
        let ended: Result<()> = tokio::select! {
            ended = watched => ended,
            _ = seen_tx.closed() => return,
        };
        match ended {
            Ok(()) => return,
            Err(e) if !e.is_transient() => {
                let _ = seen_tx.send((index, Err(e))).await;
                return;
            }
            Err(e) => {
                tracing::debug!(key, error = %e, "an observer reconnects");
                // Unknown until read again (then told again, so the group
                // counts it), and for Sentinel from the master it names now.
                node.ask_sentinels_again();
                if last.take().is_some() && seen_tx.send((index, Ok(None))).await.is_err() {
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = seen_tx.closed() => return,
                }
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// How long one wait for a change lasts in the server before it answers
/// nil and is sent again: with [`OBSERVE_GRACE`], what a connection that
/// went quiet costs at most (the clients' shared defaults).
const OBSERVE_BLOCK: Duration = Duration::from_millis(OBSERVE_WAIT_MS as u64);

/// How long past its wait an answer may take before the connection counts
/// as gone.
const OBSERVE_GRACE: Duration = Duration::from_millis(OBSERVE_GRACE_MS as u64);

/// `LOCK.OBSERVE key` (None: the state now) or `LOCK.OBSERVE key AFTER f
/// VALUE v BLOCK 30000` (the next state that differs from "led by fence f
/// with value v", or from a vacancy for f 0); None for nil.
async fn observe_once(
    conn: &mut Conn,
    key: &str,
    after: Option<&(i64, Vec<u8>)>,
) -> Result<Option<(Observed, Vec<u8>)>> {
    let mut cmd = redis::cmd(command::OBSERVE);
    cmd.arg(key);
    if let Some((fence, value)) = after {
        cmd.arg(command::AFTER).arg(*fence);
        if *fence > 0 {
            cmd.arg(command::VALUE).arg(value.as_slice());
        }
        cmd.arg(command::BLOCK)
            .arg(OBSERVE_BLOCK.as_millis() as u64);
    }
    let reply: redis::Value = cmd.query_async(conn).await?;
    parse_observed(reply)
}

/// A `LOCK.OBSERVE` reply: a map (RESP3) or flat array (RESP2) of fence,
/// ttl and value, with the value's bytes as the server has them (empty:
/// none), which the next wait names; nil.
fn parse_observed(reply: redis::Value) -> Result<Option<(Observed, Vec<u8>)>> {
    let pairs: Vec<(redis::Value, redis::Value)> = match reply {
        redis::Value::Nil => return Ok(None),
        redis::Value::Map(pairs) => pairs,
        redis::Value::Array(items) => items
            .chunks_exact(2)
            .map(|p| (p[0].clone(), p[1].clone()))
            .collect(),
        other => return Err(unexpected(format!("{other:?}"))),
    };
    let (mut fence, mut raw) = (None, None);
    for (name, v) in pairs {
        let name: String = redis::from_redis_value(&name)?;
        match name.as_str() {
            info_field::FENCE => fence = Some(redis::from_redis_value::<i64>(&v)?),
            info_field::VALUE => raw = redis::from_redis_value::<Option<Vec<u8>>>(&v)?,
            _ => {}
        }
    }
    let value = raw
        .as_ref()
        .map(|bytes| String::from_utf8_lossy(bytes).into_owned());
    Ok(Some(match fence {
        Some(0) => (Observed::Vacant, Vec::new()),
        Some(fence) => (
            Observed::Leader(Leader { fence, value }),
            raw.unwrap_or_default(),
        ),
        None => return Err(unexpected("no fence".into())),
    }))
}

fn unexpected(detail: String) -> Error {
    Error::Redis(redis::RedisError::from((
        redis::ErrorKind::TypeError,
        "LOCK.OBSERVE did not answer a leader",
        detail,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(fence: i64, value: &str) -> Observed {
        Observed::Leader(Leader {
            fence,
            value: Some(value.into()),
        })
    }

    #[test]
    fn a_majority_must_agree_on_fence_and_value() {
        let seen = [leader(5, "a"), leader(5, "a"), leader(5, "b")];
        assert_eq!(majority(&seen, 2), Some(leader(5, "a")));
        assert_eq!(majority(&seen[1..], 2), None);
        assert_eq!(majority(&[Observed::Vacant], 1), Some(Observed::Vacant));
    }

    #[test]
    fn replies_read_in_both_protocols() {
        use redis::Value::{Array, BulkString, Int, Map, Nil};
        let word = |w: &str| BulkString(w.as_bytes().to_vec());
        let told = |v| parse_observed(v).unwrap().map(|(o, _)| o);
        let resp2 = Array(vec![
            word("fence"),
            Int(7),
            word("ttl"),
            Int(99),
            word("value"),
            word("10.0.0.7"),
        ]);
        assert_eq!(told(resp2), Some(leader(7, "10.0.0.7")));
        let vacant = Map(vec![
            (word("fence"), Int(0)),
            (word("ttl"), Int(-2)),
            (word("value"), Nil),
        ]);
        assert_eq!(told(vacant), Some(Observed::Vacant));
        assert_eq!(parse_observed(Nil).unwrap(), None);
        assert!(parse_observed(Int(3)).is_err());
        // A value that is not UTF-8 (any writer may set one) is read, not
        // an error that would end the stream.
        let binary = Array(vec![
            word("fence"),
            Int(8),
            word("value"),
            BulkString(vec![0xff, b'a', 0xfe]),
        ]);
        let (observed, raw) = parse_observed(binary).unwrap().unwrap();
        assert_eq!(observed, leader(8, "\u{fffd}a\u{fffd}"));
        assert_eq!(raw, vec![0xff, b'a', 0xfe], "the bytes the next wait names");
    }
}
