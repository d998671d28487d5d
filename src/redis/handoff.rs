//! What a run of the hand-off timer does ([`run`]), and the node-wide
//! changes that have every waited-on key looked at again (FLUSHDB,
//! SWAPDB).

use std::collections::HashSet;

use super::engine;
use super::ffi::{
    self, cluster_nodes, in_cluster, key_exists, lock_events, notify_lock_event, Ctx, RString,
};
use super::keyspace::LockKey;
use super::node::{self, count, Key, STATS};
use super::outcomes::{self, WaiterAcl};
use super::timer::Inbox;
use crate::core::cluster;
use crate::core::node::Served;

/// A run of the hand-off timer (`timer`, which calls it): feeds the inbox
/// to the node, asks it what is due ([`Node::timer`]) and executes that:
/// take-backs, then hand-offs key by key, each with the server's conditions
/// and whether the key is still served here.
///
/// [`Node::timer`]: crate::core::node::Node::timer
pub fn run(ctx: Ctx, inbox: Inbox) {
    let now = node::now();
    let now_ms = now.mono_ms();
    let cond = engine::background_conditions(ctx);
    let changed: HashSet<&Key> = inbox.changed.iter().collect();
    let (work, acts_alone) = engine::with_engine(|n| {
        if !changed.is_empty() {
            n.keys_changed(|k| changed.contains(k), now_ms);
        }
        for (key, fence, lease) in inbox.undelivered {
            n.undelivered(key, fence, lease, now_ms);
        }
        (n.timer(cond, now), n.acts_alone(cond))
    });
    // Timeouts write nothing: they go out even while writes must wait.
    outcomes::deliver_wakes(ctx, None);
    if !acts_alone {
        return engine::rearm_timer();
    }
    for (key, fence, lease) in &work.take_backs {
        run_in_db(ctx, key, |name| {
            let Ok(mut store) = LockKey::open(ctx, name) else {
                return;
            };
            if engine::with_engine(|n| n.take_back(&mut store, *fence, *lease, now_ms)) {
                count(&STATS.take_backs);
                drop(store);
                notify_lock_event(ctx, lock_events::RELEASE, name);
            }
        });
    }
    let mut cluster = ClusterView::new(ctx);
    for key in &work.settle {
        run_in_db(ctx, key, |name| {
            let served = cluster.served(ctx, name, key);
            let mut store = LockKey::open(ctx, name);
            let store = store.as_mut().map_err(|e| e.clone());
            let mut acl = WaiterAcl { ctx, name };
            engine::with_engine(|n| n.settle(key, store, served, cond, &mut acl, now));
            outcomes::deliver_wakes(ctx, Some(name));
        });
    }
    engine::rearm_timer();
}

/// This node's view of the cluster, read at most once per timer run and
/// only when a waited-on key is missing (in cluster mode).
struct ClusterView {
    enabled: bool,
    nodes: Option<Option<String>>,
}

impl ClusterView {
    fn new(ctx: Ctx) -> Self {
        ClusterView {
            enabled: in_cluster(ctx),
            nodes: None,
        }
    }

    /// Whether `name` is still served here. A missing key whose slot is
    /// migrating away or served elsewhere (resharding's MIGRATE deleted it)
    /// left this node; a missing key in a slot served here is a free lock.
    fn served(&mut self, ctx: Ctx, name: RString, key: &Key) -> Served {
        if !self.enabled || key_exists(ctx, name) {
            return Served::Here;
        }
        let Some(nodes) = self
            .nodes
            .get_or_insert_with(|| cluster_nodes(ctx))
            .as_deref()
        else {
            return Served::Here;
        };
        match cluster::route(nodes, cluster::key_slot(&key.1)).redirect() {
            Some(redirect) => Served::Elsewhere(redirect),
            None => Served::Here,
        }
    }
}

/// Runs `f` with `key`'s name as a Redis string, in `key`'s db.
fn run_in_db(ctx: Ctx, key: &Key, f: impl FnOnce(RString)) {
    if !ffi::select_db(ctx, key.0) {
        return; // the db no longer exists (CONFIG SET databases)
    }
    let name = ffi::OwnedString::new(ctx, &key.1);
    f(name.get());
}

/// Every waited-on key of db `db` (-1: all) may have changed (FLUSHDB,
/// FLUSHALL).
pub fn flushed(db: i32) {
    if engine::waiters_total() == 0 {
        return;
    }
    let now_ms = node::mono_ms();
    engine::with_engine(|n| n.keys_changed(|k| db < 0 || k.0 == db, now_ms));
    engine::rearm_timer();
}

/// SWAPDB a b: lines move with their databases, and every key in both is
/// looked at again (its lock may differ now).
pub fn swapped(a: i32, b: i32) {
    if engine::waiters_total() == 0 {
        return;
    }
    let now_ms = node::mono_ms();
    let swap = |(db, name): &Key| {
        let db = match *db {
            d if d == a => b,
            d if d == b => a,
            d => d,
        };
        (db, name.clone())
    };
    engine::with_engine(|n| n.rename_keys(swap, |k| k.0 == a || k.0 == b, now_ms));
    engine::rearm_timer();
}
