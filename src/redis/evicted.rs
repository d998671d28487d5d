//! Gates that maxmemory evicted, put back with their marks. A gate is kept
//! like a lock (no Redis expiry, `LOCK.FENCED` refused under an evicting
//! policy unless `lock.allow-eviction` is yes), but an operator can switch
//! the policy at runtime, and a gate given an `EXPIRE` is evicted under
//! `volatile-*` too. A gate that left the keyspace that way would accept
//! any fence, a stale holder's included. So its mark is kept when the
//! server evicts it, and the timer puts the gate back at once (written and
//! replicated as `LOCK._GATE`); until then `LOCK.FENCED` reads the kept
//! mark. Only eviction: `DEL`, `UNLINK`, `FLUSHALL` and a user's expiry
//! coming due remove a gate as the user asked.
//!
//! The gate's value is gone by the time the server announces the eviction
//! (7.0 announces after deleting), so the gate type's unlink2 callback
//! keeps the last gate unlinked, and the eviction event takes that mark;
//! a server that announces first leaves the gate in place to be read.

use std::collections::HashMap;
use std::os::raw::{c_char, c_int};
use std::sync::Mutex;

use redis_module::raw;

use super::ffi::{self, guard, Ctx, OpenKey, RString, Read, Write};
use super::gate;
use super::node::{self, count, Key, STATS};
use super::timer;

/// The last gate unlinked (DEL, eviction, ...): its key and mark.
static LAST_UNLINKED: Mutex<Option<(Key, i64)>> = Mutex::new(None);

/// Evicted gates not yet put back: key -> mark.
static PENDING: Mutex<Option<HashMap<Key, i64>>> = Mutex::new(None);

fn locked<T>(m: &'static Mutex<T>) -> std::sync::MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A gate left the keyspace (given to `gate::register`): remembered, in
/// case the server is evicting it.
pub fn on_gate_unlinked(key: Key, mark: i64) {
    *locked(&LAST_UNLINKED) = Some((key, mark));
}

/// The keyspace callback for evictions: an evicted gate's mark is kept and
/// the timer puts it back.
pub extern "C" fn on_evicted(
    ctx: Ctx,
    _type: c_int,
    _event: *const c_char,
    name: RString,
) -> c_int {
    guard("the eviction event", 0, || {
        let key: Key = (ffi::selected_db(ctx), ffi::string_copy(name)[..].into());
        let unlinked = locked(&LAST_UNLINKED)
            .take()
            .filter(|(k, _)| *k == key)
            .map(|(_, mark)| mark);
        let mark = unlinked.or_else(|| {
            let open = OpenKey::<Read>::open(ctx, name)?;
            gate::mark_of(open.key()).ok().flatten()
        });
        if let Some(mark) = mark {
            let mut pending = locked(&PENDING);
            let marks = pending.get_or_insert_with(HashMap::new);
            let kept = marks.entry(key).or_insert(mark);
            *kept = (*kept).max(mark);
            drop(pending);
            timer::queue(|_| {});
        }
        0
    })
}

/// The mark kept for the evicted gate at `key`, if it is waiting to be put
/// back.
pub fn pending_mark(key: &Key) -> Option<i64> {
    locked(&PENDING).as_ref()?.get(key).copied()
}

/// The gate at `key` was written with a mark at least the kept one: there
/// is nothing left to put back.
pub fn settled(key: &Key) {
    if let Some(marks) = locked(&PENDING).as_mut() {
        marks.remove(key);
    }
}

/// From the timer: puts every evicted gate back with its mark (raised if
/// it came back lower; left alone if the key now holds something else),
/// replicated as `LOCK._GATE`. On a replica (its master's data wins) the
/// kept marks are dropped; while writes are paused they wait.
pub fn put_back(ctx: Ctx, replica: bool, writes_paused: bool) {
    let marks = {
        let mut pending = locked(&PENDING);
        match pending.as_mut() {
            Some(marks) if !marks.is_empty() => {
                if replica {
                    marks.clear();
                    return;
                }
                if writes_paused {
                    drop(pending);
                    timer::arm_at(node::mono_ms() + RETRY_MS);
                    return;
                }
                std::mem::take(marks)
            }
            _ => return,
        }
    };
    for (key, mark) in marks {
        node::in_db(ctx, &key, |name| put_back_one(ctx, name, mark));
    }
}

/// How long gates wait to be put back while writes are paused.
const RETRY_MS: i64 = 10;

fn put_back_one(ctx: Ctx, name: RString, mark: i64) {
    let Some(key) = OpenKey::<Write>::open(ctx, name) else {
        return;
    };
    match gate::mark_of(key.key()) {
        Ok(Some(m)) if m >= mark => return,
        Ok(_) => gate::set_mark(&key, mark),
        // Something else took the name: left as it is.
        Err(_) => return,
    }
    drop(key);
    ffi::signal_modified_key(ctx, name);
    ffi::replicate_gate(ctx, name, mark);
    count(&STATS.gates_put_back);
}

/// Subscribes the eviction callback (called once from `module::start`).
pub fn subscribe(ctx: Ctx) -> Result<(), &'static str> {
    let types = raw::REDISMODULE_NOTIFY_EVICTED as c_int;
    if !ffi::subscribe_to_keyspace_events(ctx, types, on_evicted) {
        return Err("failed to subscribe to eviction events");
    }
    Ok(())
}
