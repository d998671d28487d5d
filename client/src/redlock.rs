//! Redlock's rounds: a majority of the nodes within the validity, quorum
//! fencing's two phases, the ordering node's line and the retries.

use std::sync::atomic::Ordering as AtomicOrdering;
use std::time::Duration;

use futures_util::future::join_all;
use rand::Rng;
use tokio::time::Instant;

use crate::client::{ClockSample, LockClient};
use crate::clock::{later_by, Sent};
use crate::error::{Error, Result};
use crate::keys::Keys;

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
/// The group's token for a first phase's grants (node index, token): the
/// smallest a majority can hold, the `quorum`-th smallest granted (the
/// second phase raises the nodes below it). When a majority granted one
/// token (usually every node granted the floor), that is it, and there is
/// no second phase. Not simply the largest: a node ahead of the others
/// (its clock, a mark raised by `MINFENCE`) would drag every node to its
/// tokens and cost a second round trip, and between the two phases an
/// observer would see a majority agree on a leader's fence that is not the
/// one it leads with. A majority holds the token either way, which is all
/// the order argument needs: any later majority shares a node with it,
/// whose next token is larger. `granted` holds at least `quorum` grants.
fn group_fence(granted: &[(usize, i64)], quorum: usize) -> i64 {
    let mut tokens: Vec<i64> = granted.iter().map(|(_, f)| *f).collect();
    tokens.sort_unstable();
    tokens
        .get(quorum.saturating_sub(1))
        .or(tokens.last())
        .copied()
        .unwrap_or(0)
}

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

impl LockClient {
    /// Redlock with a wait. With [`Options::queue`] (the default) the
    /// waiting happens in the server: while another client holds the lock,
    /// this one waits in the FIFO line (`BLOCK`) of the key's ordering node,
    /// and once that node grants it, takes the others. Clients that wait
    /// this way take turns in arrival order. When the ordering node does not
    /// answer, and with `queue: false`, attempts are retried after random
    /// pauses instead.
    pub(crate) async fn acquire_redlock(
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
    /// above the nodes' clock and above every group token this client was
    /// granted (not a minority node's run ahead, which it keeps). A
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
    ///    T = the token a majority granted, if one did (usually all granted
    ///    g), else the largest token granted ([`group_fence`]).
    /// 2. Only when no majority granted T: ACQUIRE again with `MINFENCE T`
    ///    on the granting nodes below it, so their token for this lock, and
    ///    their high-water mark, become at least T. Held only if a majority
    ///    has T (from phase 1 or 2), still within the validity.
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
            // Without quorum fencing the largest, unconfirmed.
            let largest = granted.iter().map(|(_, f)| *f).max().unwrap_or(0);
            let t = match fencing {
                true => group_fence(&granted, quorum),
                false => largest,
            };
            // The next floor goes above the group's token, not above a
            // minority node's run ahead (its clock, a MINFENCE): that would
            // drag every node's tokens to it.
            self.saw_fence(t);
            let mut confirmed = granted.len();
            if fencing {
                // Usually every node granted g, and a majority at t is all
                // the confirmation there is to have.
                confirmed = granted.iter().filter(|(_, f)| *f == t).count();
                if confirmed < quorum {
                    // No majority agreed: raise those below t to it.
                    let behind = granted.iter().filter(|(_, f)| *f < t);
                    confirmed += join_all(
                        behind.map(|&(i, _)| nodes[i].acquire(keys, token, ttl, Some(t), limit)),
                    )
                    .await
                    .into_iter()
                    .filter(|r| confirms(r, t))
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
}

/// Whether a node raised in phase 2 now holds the group's token `t`: it
/// granted exactly `t`. A node that issued `t` or more to another holder
/// between the phases grants above it (MINFENCE draws past its mark) and
/// holds a token the leader does not lead with: counted, it could make a
/// majority that holds no `t`, and observers would name a fence the leader
/// never had.
fn confirms(reply: &Result<Option<i64>>, t: i64) -> bool {
    matches!(reply, Ok(Some(f)) if *f == t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_two_confirms_only_the_groups_token() {
        assert!(confirms(&Ok(Some(5)), 5));
        assert!(
            !confirms(&Ok(Some(6)), 5),
            "raised past t: holds another token"
        );
        assert!(!confirms(&Ok(None), 5));
        assert!(!confirms(&Err(Error::Timeout), 5));
    }

    #[test]
    fn the_groups_fence_is_the_smallest_a_majority_can_hold() {
        // One node ahead: the two that granted g are the majority.
        assert_eq!(group_fence(&[(0, 7), (1, 7), (2, 9)], 2), 7);
        assert_eq!(group_fence(&[(0, 9), (1, 7), (2, 7)], 2), 7);
        // No two agree: the middle one, which the one below is raised to;
        // the one above keeps its own.
        assert_eq!(group_fence(&[(0, 7), (1, 8), (2, 9)], 2), 8);
        // Two of three granted: both must hold it.
        assert_eq!(group_fence(&[(0, 9), (2, 7)], 2), 9);
        assert_eq!(group_fence(&[(0, 5), (1, 5), (2, 5), (3, 6), (4, 7)], 3), 5);
        assert_eq!(group_fence(&[(0, 5), (1, 5), (3, 6), (4, 7)], 3), 6);
        // An hour ahead on one node, the others' clocks apart: not dragged.
        let hour = 3_600_000_000;
        assert_eq!(
            group_fence(&[(0, 10), (1, 12), (2, 11), (3, 13), (4, hour)], 3),
            12
        );
    }

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
