//! The background sweep, the backstop: finds locks whose lease ended and
//! has the node reclaim them (a replicated DEL, a `lock.expire` event,
//! counted), so no ended lock stays in the keyspace, wherever it went.
//!
//! The node files every lease by its end and its timer reclaims ended
//! locks on time (`core::lease_ends`); what that index does not follow is
//! a lock key renamed or moved (RENAME, MOVE; COPY of one is refused), and
//! that is what the sweep is for: it reclaims the ended locks it passes and
//! files the held ones (so `LOCK.SCAN` lists a renamed lock from then on).
//! It walks the keyspace with RM_Scan, a slice of at most
//! [`SLICE_US`] at a time, only while the node holds locks. A slice that
//! reclaimed something comes back after [`BUSY_GAP_MS`]; otherwise the
//! next slice is [`IDLE_GAP_MS`] away, so a server whose locks are all live
//! pays about 0.1% of a core for the sweep, whatever the size of its
//! keyspace (`make bench`, section 5, measures what other commands pay). A
//! lock the index missed is reclaimed within one pass over the keyspace
//! (docs/benchmarks.md, section 6, gives the sweep's rate and pass).

use std::os::raw::c_void;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

use super::datatype;
use super::engine::{self, Key};
use super::executor::{self, Site, WaiterAcl};
use super::ffi::{self, guard, Ctx, KeyRef, RString, ScanCursor};
use super::keyspace::{LockKey, ReadKey};
use super::server::{self, STATS};
use crate::core::time::{self, Now};

/// The longest slice of sweeping, µs: a command waits at most this long.
pub const SLICE_US: i64 = 1_000;
/// Between slices while there is more to reclaim.
pub const BUSY_GAP_MS: i64 = 1;
/// Between slices otherwise.
pub const IDLE_GAP_MS: i64 = 1_000;

/// Where the sweep is: the db and its scan cursor.
struct Position {
    db: i32,
    cursor: ScanCursor,
}

static POSITION: Mutex<Option<Position>> = Mutex::new(None);

/// Starts the sweep's timer (once, at load).
pub fn start(ctx: Ctx) {
    arm(ctx, IDLE_GAP_MS);
}

/// The sweep's armed timer: (when it is due, monotonic ms; its id).
static ARMED: Mutex<Option<(i64, u64)>> = Mutex::new(None);

fn arm(ctx: Ctx, after_ms: i64) {
    // ctx: the context Redis gave this module (load, timer or cron).
    let id = ffi::create_timer(ctx, after_ms, on_tick);
    *ARMED.lock().unwrap_or_else(|p| p.into_inner()) = Some((server::mono_ms() + after_ms, id));
}

/// Server cron: module timers fire by the server's wall clock, so after it
/// stepped back the sweep's timer could be an hour late. If it is overdue
/// on the monotonic clock by more than a second, start it again.
pub fn heal(ctx: Ctx) {
    let mut armed = ARMED.lock().unwrap_or_else(|p| p.into_inner());
    let Some((due, id)) = *armed else {
        return;
    };
    if due + 1_000 >= server::mono_ms() {
        return;
    }
    *armed = None;
    drop(armed);
    // ctx: the cron event's context; the id is ours (a stale id is refused
    // by Redis, changing nothing).
    ffi::stop_timer(ctx, id);
    arm(ctx, 0);
}

/// Keys whose lock ended, found by one RM_Scan step, and those held.
struct Found {
    now: Now,
    ended: Vec<Box<[u8]>>,
    /// Held locks, filed in the lease index again: one renamed or moved
    /// here is not there under this name (`Node::found_held`).
    held: Vec<Box<[u8]>>,
    /// Live locks with a Redis expiry at their lease's end (written by an
    /// earlier build): the expiry is dropped.
    legacy: Vec<Box<[u8]>>,
}

extern "C" fn on_tick(ctx: Ctx, _data: *mut c_void) {
    *ARMED.lock().unwrap_or_else(|p| p.into_inner()) = None;
    let busy = guard("the lock sweep", false, || sweep(ctx));
    arm(ctx, if busy { BUSY_GAP_MS } else { IDLE_GAP_MS });
}

/// One slice. True when it reclaimed something (more may be ending).
fn sweep(ctx: Ctx) -> bool {
    if STATS.locks.load(Relaxed) <= 0 {
        return false;
    }
    let cond = engine::background_conditions(ctx);
    if !engine::with_engine(|n| n.acts_alone(cond)) {
        return false; // the master reclaims; or later
    }
    let started = server::conversion_now();
    let mut guard_pos = POSITION.lock().unwrap_or_else(|p| p.into_inner());
    let pos = guard_pos.get_or_insert_with(|| Position {
        db: 0,
        // Destroyed never (one per process).
        cursor: ScanCursor::create(),
    });
    let mut dbs_passed = 0;
    let mut reclaimed = false;
    loop {
        if !ffi::select_db(ctx, pos.db) {
            // Past the last db: a whole pass is done; start over at 0.
            pos.db = 0;
            pos.cursor.restart();
            dbs_passed += 1;
            STATS.sweep_passes.fetch_add(1, Relaxed);
            if dbs_passed > 1 {
                return reclaimed; // every db scanned within this slice
            }
            continue;
        }
        let mut found = Found {
            now: server::conversion_now(),
            ended: Vec::new(),
            held: Vec::new(),
            legacy: Vec::new(),
        };
        let more = pos
            .cursor
            .scan(ctx, |name, key| on_key(&mut found, name, key));
        for name in &found.ended {
            reclaim(ctx, pos.db, name);
        }
        for name in &found.held {
            file_held(ctx, pos.db, name);
        }
        reclaimed |= !found.ended.is_empty();
        for name in &found.legacy {
            drop_legacy_expiry(ctx, name, found.now);
        }
        if !more {
            pos.db += 1;
            pos.cursor.restart();
        }
        if server::conversion_now().mono_us - started.mono_us >= SLICE_US {
            return reclaimed;
        }
    }
}

/// RM_Scan's callback: notes a lock whose lease has ended. `name` and `key`
/// are valid during the call only.
fn on_key(found: &mut Found, name: RString, key: Option<KeyRef<'_>>) {
    STATS.sweep_keys.fetch_add(1, Relaxed);
    let Some(key) = key else {
        return;
    };
    // Only a lock key of ours (an empty key or another type is skipped).
    let Ok(Some(mut value)) = datatype::value_of(key) else {
        return;
    };
    // Copied out: `name` is valid during the callback only.
    let name = || ffi::string_copy(name);
    let now_ms = found.now.mono_ms();
    if engine::with_engine(|n| n.needs_reclaim(&value, now_ms)) {
        found.ended.push(name());
        return;
    }
    found.held.push(name());
    let Some(lock) = value.exclusive() else {
        return;
    };
    // Only a value from outside can carry an earlier build's expiry: looked
    // at once, here or at its first renewal (see `datatype::FROM_OUTSIDE`).
    if value.is_from_outside() {
        let expiry_ms = key.abs_expire();
        if time::is_earlier_builds_expiry(expiry_ms, lock.deadline_ms, found.now) {
            found.legacy.push(name());
        } else {
            value.set_from_outside(false);
        }
    }
}

/// Opens `name` (in the selected db) for writing and drops a legacy expiry.
fn drop_legacy_expiry(ctx: Ctx, name: &[u8], now: Now) {
    // ctx: the timer's context; the string is freed below.
    let owned = ffi::OwnedString::new(ctx, name);
    let rname = owned.get();
    if let Ok(mut store) = LockKey::open(ctx, rname) {
        store.drop_legacy_expiry(|| now);
    }
}

/// Opens `name` in `db` for reading and files it in the lease index (the
/// timer armed for it, as every decision's next wake-up is).
fn file_held(ctx: Ctx, db: i32, name: &[u8]) {
    let key: Key = (db, name.into());
    // ctx: the timer's context; the string is freed below.
    let owned = ffi::OwnedString::new(ctx, name);
    if let Ok(store) = ReadKey::open(ctx, owned.get()) {
        let now_ms = server::mono_ms();
        let ((), decided) = executor::decide(|n| n.found_held(&key, &store, now_ms));
        drop(store);
        executor::carry_out(ctx, decided, Site::Background);
    }
}

/// Opens `name` in `db` for writing and lets the node reclaim it.
fn reclaim(ctx: Ctx, db: i32, name: &[u8]) {
    let key: Key = (db, name.into());
    // ctx: the timer's context; the string is freed below.
    let owned = ffi::OwnedString::new(ctx, name);
    let rname = owned.get();
    if let Ok(mut store) = LockKey::open(ctx, rname) {
        let now = server::conversion_now();
        let cond = engine::background_conditions(ctx);
        let mut acl = WaiterAcl { ctx, name: rname };
        let (_, decided) = executor::decide(|n| n.reclaim(&key, &mut store, cond, &mut acl, now));
        let site = Site::Command {
            name: rname,
            store: &store,
            now,
        };
        executor::carry_out(ctx, decided, site);
    }
}
