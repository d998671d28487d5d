//! The lock commands: ACQUIRE, ACQUIREALL, RELEASE, RELEASEALL, EXTEND.

use super::*;

pub(super) fn acquire(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let now = server::now();
    let key = engine::key_of(ctx, argv.key_bytes());
    let mut store = open_for_write(ctx, argv);
    let (decided, out) = executor::decide(|n| {
        let a = args::parse_acquire(argv.bytes())?;
        let cond = engine::conditions(ctx, a.block_ms.is_some() && may_block(ctx));
        let request = AcquireRequest {
            token: a.token,
            value: a.value,
            mode: a.mode,
            ttl_ms: a.ttl_ms,
            block_ms: a.block_ms,
            min_fence: a.min_fence,
        };
        let mut acl = WaiterAcl {
            ctx,
            name: argv.key(),
        };
        let store = store.as_mut().map_err(|e| e.clone());
        n.acquire(&key, store, request, cond, &mut acl, now)
    });
    carry_out(ctx, argv, &store, out, now);
    Ok(match decided? {
        Acquire::Granted(fence) | Acquire::Renewed(fence) => Reply::Integer(fence),
        Acquire::Contended => Reply::Null,
        Acquire::Wait(ticket) => {
            drop(store);
            return blocked::block(ctx, |n, client| n.enqueue(*ticket, client));
        }
    })
}

/// `LOCK.ACQUIREALL numkeys key [key ...] token ttl-ms [SHARED] [LIMIT n]
/// [BLOCK timeout-ms] [MINFENCE n]`: the keys are opened together (a key of another type
/// refuses the command before anything changes) and decided in one entry
/// of the node; a client that must wait is blocked in every key's line.
pub(super) fn acquire_all(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    if ffi::is_keys_position_request(ctx) {
        return Ok(report_numkeys(ctx, argv, ACQUIRE_ALL_KEY_FLAGS));
    }
    let bytes = all_bytes(argv);
    let a = args::parse_acquire_all(&bytes)?;
    let names = &argv.all()[a.keys.clone()];
    let keys: Vec<_> = bytes[a.keys.clone()]
        .iter()
        .map(|k| engine::key_of(ctx, k))
        .collect();
    let opened: Result<Vec<LockKey>, LockError> =
        names.iter().map(|n| LockKey::open(ctx, *n)).collect();
    let mut stores = opened;
    let now = server::now();
    let (decided, out) = executor::decide(|n| {
        let cond = engine::conditions(ctx, a.block_ms.is_some() && may_block(ctx));
        let mut acls: Vec<WaiterAcl> = names.iter().map(|&name| WaiterAcl { ctx, name }).collect();
        let stores = stores
            .as_mut()
            .map(|s| s.as_mut_slice())
            .map_err(|e| e.clone());
        let request = AcquireRequest {
            token: a.token,
            value: a.value,
            mode: a.mode,
            ttl_ms: a.ttl_ms,
            block_ms: a.block_ms,
            min_fence: a.min_fence,
        };
        n.acquire_all(&keys, stores, request, cond, &mut acls, now)
    });
    match &stores {
        Ok(stores) => executor::carry_out(
            ctx,
            out,
            Site::Keys {
                keys: &keys,
                names,
                stores,
                now,
            },
        ),
        Err(_) => executor::carry_out(ctx, out, Site::Background),
    }
    Ok(match decided? {
        Acquire::Granted(fence) | Acquire::Renewed(fence) => Reply::Integer(fence),
        Acquire::Contended => Reply::Null,
        Acquire::Wait(ticket) => {
            drop(stores);
            return blocked::block(ctx, |n, client| n.enqueue(*ticket, client));
        }
    })
}

/// `LOCK.RELEASEALL numkeys key [key ...] token`: each key released as by
/// `LOCK.RELEASE` (its next waiter handed it at once); every key is opened
/// first, so a key of another type refuses the command before anything
/// changes. How many it released.
pub(super) fn release_all(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    if ffi::is_keys_position_request(ctx) {
        return Ok(report_numkeys(ctx, argv, RELEASE_ALL_KEY_FLAGS));
    }
    let bytes = all_bytes(argv);
    let (range, token) = args::parse_release_all(&bytes)?;
    let names = &argv.all()[range.clone()];
    let mut stores: Vec<LockKey> = names
        .iter()
        .map(|n| LockKey::open(ctx, *n))
        .collect::<Result<_, _>>()?;
    let keys: Vec<_> = bytes[range]
        .iter()
        .map(|k| engine::key_of(ctx, k))
        .collect();
    let now = server::now();
    let (released, out) = executor::decide(|n| {
        let cond = engine::conditions(ctx, false);
        let mut acls: Vec<WaiterAcl> = names.iter().map(|&name| WaiterAcl { ctx, name }).collect();
        n.release_all(&keys, &mut stores, token, cond, &mut acls, now)
    });
    let site = Site::Keys {
        keys: &keys,
        names,
        stores: &stores,
        now,
    };
    executor::carry_out(ctx, out, site);
    Ok(Reply::Integer(released?))
}

pub(super) fn release(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let token = args::parse_release(argv.bytes())?;
    let now = server::now();
    let key = engine::key_of(ctx, argv.key_bytes());
    let mut store = open_for_write(ctx, argv);
    let (released, out) = executor::decide(|n| {
        let cond = engine::conditions(ctx, false);
        let mut acl = WaiterAcl {
            ctx,
            name: argv.key(),
        };
        let store = store.as_mut().map_err(|e| e.clone());
        n.release(&key, store, token, cond, &mut acl, now)
    });
    // The next waiter got the lock in this same command.
    carry_out(ctx, argv, &store, out, now);
    Ok(Reply::Integer(released?.into()))
}

pub(super) fn extend(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let now = server::now();
    let key = engine::key_of(ctx, argv.key_bytes());
    let mut store = open_for_write(ctx, argv);
    let (extended, out) = executor::decide(|n| {
        let a = args::parse_extend(argv.bytes())?;
        let cond = engine::conditions(ctx, false);
        let mut acl = WaiterAcl {
            ctx,
            name: argv.key(),
        };
        let store = store.as_mut().map_err(|e| e.clone());
        n.extend(
            &key,
            store,
            (a.token, a.value),
            a.ttl_ms,
            cond,
            &mut acl,
            now,
        )
    });
    carry_out(ctx, argv, &store, out, now);
    Ok(Reply::Integer(extended?.into()))
}
