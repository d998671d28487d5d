//! Gates that maxmemory evicted, put back with their marks. A gate is kept
//! like a lock (no Redis expiry, `LOCK.FENCED` refused under an evicting
//! policy unless `lock.allow-eviction` is yes), but an operator can switch
//! the policy at runtime, and a gate given an `EXPIRE` is evicted under
//! `volatile-*` too. A gate that left the keyspace that way would accept
//! any fence, a stale holder's included. So its mark is kept when the
//! server evicts it, and the timer puts the gate back at once (written and
//! replicated as `LOCK._GATE`); until then `LOCK.FENCED` reads the kept
//! mark. Only eviction: `DEL`, `UNLINK`, `FLUSHALL` and a user's expiry
//! coming due remove a gate as the user asked. The node keeps the marks
//! and puts the gates back (`Node::gate_evicted`); here the eviction is
//! recognised and its mark found.
//!
//! The gate's value is gone by the time the server announces the eviction
//! (7.0 announces after deleting), so the gate type's unlink2 callback
//! keeps the last gate unlinked, and the eviction event takes that mark;
//! a server that announces first leaves the gate in place to be read.

use std::os::raw::{c_char, c_int};
use std::sync::Mutex;

use redis_module::raw;

use super::executor::{self, Site};
use super::ffi::{self, guard, Ctx, OpenKey, RString, Read};
use super::gate;
use super::server::{self, Key};

/// The last gate unlinked (DEL, eviction, ...): its key and mark.
static LAST_UNLINKED: Mutex<Option<(Key, i64)>> = Mutex::new(None);

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
            let now_ms = server::mono_ms();
            let ((), decided) = executor::decide(|n| n.gate_evicted(key, mark, now_ms));
            // Arms the timer, which puts the gate back.
            executor::carry_out(ctx, decided, Site::Background);
        }
        0
    })
}

/// Subscribes the eviction callback (called once from `module::start`).
pub fn subscribe(ctx: Ctx) -> Result<(), &'static str> {
    let types = raw::REDISMODULE_NOTIFY_EVICTED as c_int;
    if !ffi::subscribe_to_keyspace_events(ctx, types, on_evicted) {
        return Err("failed to subscribe to eviction events");
    }
    Ok(())
}
