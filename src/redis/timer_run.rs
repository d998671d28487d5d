//! What a run of the hand-off timer does ([`run`]), and the node-wide
//! changes that have every waited-on key looked at again (FLUSHDB,
//! SWAPDB).

use std::collections::HashSet;

use super::engine;
use super::executor::{self, Site, WaiterAcl};
use super::ffi::{self, cluster_nodes, in_cluster, key_exists, Ctx, RString, Write};
use super::gate::GateKey;
use super::keyspace::LockKey;
use super::server::{self, Client, Key};
use super::timer::Inbox;
use crate::core::cluster;
use crate::core::error::LockError;
use crate::core::node::{Served, TimerKeys};

/// A run of the hand-off timer (`timer`, which calls it): feeds the inbox
/// to the node and has it run its timer ([`Node::run_timer`]) over the
/// keyspace, entering the engine once; then carries out what it decided
/// (first what a decision cut short by a panic had left).
///
/// [`Node::run_timer`]: crate::core::node::Node::run_timer
pub fn run(ctx: Ctx, inbox: Inbox) {
    if !inbox.outputs.is_empty() {
        executor::carry_out(ctx, executor::leftover(inbox.outputs), Site::Background);
    }
    let now = server::now();
    let now_ms = now.mono_ms();
    let cond = engine::background_conditions(ctx);
    let changed: HashSet<&Key> = inbox.changed.iter().collect();
    let mut keys = Keys {
        ctx,
        cluster: ClusterView::new(ctx),
    };
    let ((), decided) = executor::decide(|n| {
        if !changed.is_empty() {
            n.keys_changed(|k| changed.contains(k), now_ms);
        }
        for (key, fence, lease) in inbox.undelivered {
            n.undelivered(key, fence, lease, now_ms);
        }
        n.run_timer(&mut keys, cond, now)
    });
    executor::carry_out(ctx, decided, Site::Background);
}

/// The keyspace as a timer run opens it: the key's db selected, the key
/// opened for writing, the cluster asked whether it is still served here,
/// ACL asked for each waiter.
struct Keys {
    ctx: Ctx,
    cluster: ClusterView,
}

impl TimerKeys<Key, Client> for Keys {
    type Store = LockKey;
    type Admit = WaiterAcl;
    type Gate = GateKey<Write>;

    fn with_gate<R>(
        &mut self,
        key: &Key,
        f: impl FnOnce(Result<&mut GateKey<Write>, LockError>) -> R,
    ) -> R {
        let ctx = self.ctx;
        if !ffi::select_db(ctx, key.0) {
            return f(Err(LockError::Internal));
        }
        let name = ffi::OwnedString::new(ctx, &key.1);
        let mut gate = GateKey::<Write>::open(ctx, name.get());
        f(Ok(&mut gate))
    }

    fn with_key<R>(
        &mut self,
        key: &Key,
        f: impl FnOnce(Result<&mut LockKey, LockError>, Served, &mut WaiterAcl) -> R,
    ) -> R {
        let ctx = self.ctx;
        let name = ffi::OwnedString::new(ctx, &key.1);
        let name = name.get();
        if !ffi::select_db(ctx, key.0) {
            // The db is gone (it cannot be: `databases` is fixed at start):
            // its line fails rather than waits on a key nobody can open.
            return f(
                Err(LockError::Internal),
                Served::Here,
                &mut WaiterAcl { ctx, name },
            );
        }
        let served = self.cluster.served(ctx, name, key);
        let mut store = LockKey::open(ctx, name);
        let store = store.as_mut().map_err(|e| e.clone());
        f(store, served, &mut WaiterAcl { ctx, name })
    }

    fn with_keys<R>(
        &mut self,
        keys: &[Key],
        f: impl FnOnce(Result<&mut [LockKey], LockError>, Served, &mut [WaiterAcl]) -> R,
    ) -> R {
        let ctx = self.ctx;
        let owned: Vec<ffi::OwnedString> = keys
            .iter()
            .map(|k| ffi::OwnedString::new(ctx, &k.1))
            .collect();
        let names: Vec<RString> = owned.iter().map(|n| n.get()).collect();
        let mut acls: Vec<WaiterAcl> = names.iter().map(|&name| WaiterAcl { ctx, name }).collect();
        // One waiter's keys share a db (and a slot).
        if keys.first().is_none_or(|k| !ffi::select_db(ctx, k.0)) {
            return f(Err(LockError::Internal), Served::Here, &mut acls);
        }
        let served = keys
            .iter()
            .zip(&names)
            .map(|(key, &name)| self.cluster.served(ctx, name, key))
            .find(|s| *s != Served::Here)
            .unwrap_or(Served::Here);
        let mut stores: Result<Vec<LockKey>, LockError> =
            names.iter().map(|&name| LockKey::open(ctx, name)).collect();
        let stores = stores
            .as_mut()
            .map(|s| s.as_mut_slice())
            .map_err(|e| e.clone());
        f(stores, served, &mut acls)
    }
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

/// Every key of db `db` (-1: all) is gone (FLUSHDB, FLUSHALL): waited-on
/// and observed ones may have changed.
pub fn flushed(db: i32) {
    // Their leases leave the index with them (else each would be looked
    // at once more, finding nothing).
    engine::with_engine(|n| n.lease_ends_flushed(|k| db < 0 || k.0 == db));
    if !engine::has_blocked_clients() {
        return;
    }
    let now_ms = server::mono_ms();
    engine::with_engine(|n| n.keys_changed(|k| db < 0 || k.0 == db, now_ms));
    engine::rearm_timer();
}

/// SWAPDB a b: lines and leases filed by their end move with their
/// databases, and every key in both is looked at again (its lock may
/// differ now).
pub fn swapped(a: i32, b: i32) {
    if !engine::has_blocked_clients() && engine::with_engine(|n| n.lease_ends_empty()) {
        return;
    }
    let now_ms = server::mono_ms();
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
