//! The internal commands (`LOCK._SET`, `LOCK._SHARED`, `LOCK._HOLD`,
//! `LOCK._DROP`): a key as the master or the AOF wrote it.

use super::*;

/// `LOCK._SET key token fence deadline-ms [granted-ms [value]]`: applies a grant or renewal made
/// by the master (replication stream) or logged earlier (AOF). A fence
/// beyond the bound is refused (and logged), changing nothing.
pub(super) fn set(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let a = trusted(ctx, protocol::command::SET, || {
        args::parse_set(argv.bytes())
    })?;
    apply_from_outside(
        ctx,
        argv,
        &format!("LOCK._SET with fence {}", a.fence),
        |n, key, store, now| n.apply_set(key, store, &a, now),
    )
}

/// `LOCK._SHARED key limit token fence deadline-ms granted-ms ...`: applies
/// a shared key, whole, as the master (replication stream) or an earlier
/// run (AOF) wrote it. A fence beyond the bound is refused (and logged),
/// changing nothing.
pub(super) fn set_shared(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let all = all_bytes(argv);
    let a = trusted(ctx, protocol::command::SET_SHARED, || {
        args::parse_shared_set(&all)
    })?;
    apply_from_outside(ctx, argv, "LOCK._SHARED", |n, key, store, now| {
        n.apply_shared(key, store, a.mode, &a.holders, now)
    })
}

/// `LOCK._HOLD key limit token fence deadline-ms granted-ms`: one holder of
/// a shared key, added or renewed, as the master or an earlier run wrote
/// it (a change replicates what it changed, not the key's every holder).
pub(super) fn hold(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let (mode, holder) = trusted(ctx, protocol::command::HOLD, || {
        args::parse_hold(argv.bytes())
    })?;
    apply_from_outside(
        ctx,
        argv,
        &format!("LOCK._HOLD with fence {}", holder.fence),
        |n, key, store, now| n.apply_hold(key, store, mode, &holder, now),
    )
}

/// `LOCK._DROP key token`: one holder of a shared key gone, as the master
/// or an earlier run wrote it.
pub(super) fn drop_holder(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let token = trusted(ctx, protocol::command::DROP, || {
        args::parse_drop(argv.bytes())
    })?;
    apply_from_outside(ctx, argv, "LOCK._DROP", |n, _, store, _| {
        n.apply_drop(store, token);
        Ok(())
    })
}

/// An internal command's arguments, parsed only when it comes from the
/// master or the AOF (an ordinary client is refused, naming `command`).
pub(super) fn trusted<T>(
    ctx: Ctx,
    command: &'static str,
    parse: impl FnOnce() -> Result<T, LockError>,
) -> Result<T, LockError> {
    let trusted = raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if context_flags(ctx) & trusted == 0 {
        return Err(LockError::InternalCommand(command));
    }
    parse()
}

/// Writes a key as the master or an earlier run wrote it, through the
/// node (`apply`), and passes the command on verbatim; one the node refuses
/// (`what`) is logged and changes nothing. The master's deadlines and grant
/// times are on the wall clock: this node keeps them on its monotonic clock
/// from now on.
pub(super) fn apply_from_outside(
    ctx: Ctx,
    argv: &Argv,
    what: &str,
    apply: impl FnOnce(
        &mut engine::ModuleNode,
        &engine::Key,
        &mut LockKey,
        Now,
    ) -> Result<(), LockError>,
) -> Result<Reply, LockError> {
    let mut store = LockKey::open_from_outside(ctx, argv.key())?;
    let now = server::conversion_now();
    let key = engine::key_of(ctx, argv.key_bytes());
    let (applied, next_wakeup) = engine::with_engine(|n| {
        let first_filed = n.lease_ends_empty();
        let applied = apply(n, &key, &mut store, now);
        // Its observers (on a replica) look again; the timer is armed only
        // then, or for the first lease filed (an AOF load applies millions
        // of these; a timer run arms the next one).
        let observed = n.applied(&key, now.mono_ms());
        let arm = observed || first_filed;
        (applied, arm.then(|| n.next_wakeup()).flatten())
    });
    timer::arm_for(next_wakeup);
    if let Err(err) = applied {
        log_warning(&format!("lock: refusing {what}: {err}"));
        return Err(err);
    }
    ffi::replicate_verbatim(ctx);
    Ok(Reply::Ok)
}
