//! Whether the effect of a write can reach anyone: the AOF, a replica, or
//! the replication backlog that replicas resync from.
//!
//! Every grant, renewal and release is replicated as an absolute effect with
//! RM_Replicate. That call is costly on Redis 7.0: it looks the command up
//! by name (splitting it on '|', with allocations) and builds every argument
//! as a new object, about 4,500 instructions, a third of a whole
//! LOCK.ACQUIRE, and it does so even when nothing will receive the effect.
//! When nothing can, this module uses RM_ReplicateVerbatim instead, which
//! propagates nothing then (Redis's own check) but still counts the write
//! for RDB save points.
//!
//! "Nothing can receive it" must never be wrong, or a replica would get the
//! relative command. So it is decided conservatively and only ever turns
//! from false to true until restart:
//! * the AOF is on (read at load, after loading, on role changes and after
//!   every CONFIG change, which is how it is turned on at runtime);
//! * at every fork, INFO replication shows a backlog or a replica: a
//!   replica's full sync forks before it receives anything, and what was
//!   written before its fork reaches it in the snapshot, never as a command
//!   (no command filter: commands that touch no lock run no module code);
//! * the node was ever a replica, or changed replication role;
//! * a replica came online (the replica-change event);
//! * at load, INFO replication shows a backlog or connected replicas.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use redis_module::raw;

use super::ffi::{context_flags, server_info_signed, Ctx};

static MAY_HAVE_REPLICAS: AtomicBool = AtomicBool::new(false);

/// The server's AOF state, cached: reading the context flags at every write
/// costs more than the rest of this check.
static AOF_ON: AtomicBool = AtomicBool::new(true);

/// From now on, every effect is replicated in full.
pub fn replicas_possible() {
    MAY_HAVE_REPLICAS.store(true, Relaxed);
}

/// True when an effect written now could reach the AOF or a replica.
pub fn effects_needed() -> bool {
    MAY_HAVE_REPLICAS.load(Relaxed) || AOF_ON.load(Relaxed)
}

/// Re-reads whether the AOF is on (it starts as "on" until first read).
pub fn refresh_aof_state(ctx: Ctx) {
    AOF_ON.store(
        context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_AOF != 0,
        Relaxed,
    );
}

/// At load: look at the replication state the server already has.
pub fn init(ctx: Ctx) {
    check_replication_state(ctx);
}

/// Reads INFO replication; anything but "a master with no backlog and no
/// replicas" (including any doubt) means effects are needed.
pub fn check_replication_state(ctx: Ctx) {
    refresh_aof_state(ctx);
    if context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0 {
        return replicas_possible();
    }
    // None: no API, or no such section.
    let fields = [c"repl_backlog_active", c"connected_slaves"];
    let Some(values) = server_info_signed(ctx, c"replication", fields) else {
        return replicas_possible();
    };
    let quiet = values.iter().all(|value| *value == Some(0));
    if !quiet {
        replicas_possible();
    }
}
