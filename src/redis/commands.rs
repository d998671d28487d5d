//! The command table and one handler per command. Handlers parse with the
//! core parsers, open the key, run the core state machine, count, and return
//! a [`Reply`]; `ffi::run_command` sends it (or the error) and keeps panics
//! out of Redis.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

use super::blocked;
use super::datatype;
use super::engine;
use super::executor::{self, Decided, Site, WaiterAcl};
use super::ffi::{
    self, command_callback, context_flags, log_warning, may_write_key, ArgDoc, Argv, CommandFn,
    Ctx, KeyPlace, OpenKey, Read, Reply, Value,
};
use super::guarded;
use super::keyspace::{LockKey, ReadKey};
use super::server;
use crate::core::args;
use crate::core::error::LockError;
use crate::core::node::{Acquire, AcquireRequest};
use crate::core::protocol::{self, info_field};
use crate::core::time::Now;
use crate::core::{Lock, Mode};

/// One row of the command table.
pub struct Command {
    pub name: &'static CStr,
    callback: CommandFn,
    /// Redis command flags (`write`, `readonly`, `fast`, `deny-oom`, ...).
    pub flags: &'static CStr,
    /// Redis arity: N exactly, or -N for at least N (the name counts).
    pub arity: c_int,
    /// Key-spec flags for its keys (ACL key permissions).
    key_flags: u64,
    /// Where its keys are: argv[1], or `numkeys key [key ...]`.
    keys: KeyPlace,
    /// ACL categories, where the server lets modules set them (7.2+,
    /// Valkey 8); the user-facing commands are also in `@lock` where
    /// modules may add categories (7.4+).
    acl_categories: &'static CStr,
    summary: &'static CStr,
    /// The arguments after the name, for COMMAND DOCS (redis-cli's hints).
    args: &'static [ArgDoc],
}

const KEY: raw::RedisModuleCommandArgType = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY;
const STRING: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING;
const INTEGER: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER;
const PURE_TOKEN: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN;

const fn arg(
    name: &'static CStr,
    kind: raw::RedisModuleCommandArgType,
    summary: &'static CStr,
) -> ArgDoc {
    ArgDoc {
        name,
        kind,
        token: None,
        optional: false,
        multiple: false,
        summary,
    }
}

const fn option(token: &'static CStr, name: &'static CStr, summary: &'static CStr) -> ArgDoc {
    ArgDoc {
        name,
        kind: INTEGER,
        token: Some(token),
        optional: true,
        multiple: false,
        summary,
    }
}

const LOCK_KEY: ArgDoc = arg(c"key", KEY, c"The lock's key.");
const TOKEN: ArgDoc = arg(
    c"token",
    STRING,
    c"The holder's secret: unguessable, at most lock.max-token-len bytes.",
);
const TTL: ArgDoc = arg(
    c"ttl-ms",
    INTEGER,
    c"The lease, in milliseconds (at most lock.max-ttl-ms).",
);

const RW: u64 = raw::REDISMODULE_CMD_KEY_RW as u64;
const RO: u64 = raw::REDISMODULE_CMD_KEY_RO as u64;
const OW: u64 = raw::REDISMODULE_CMD_KEY_OW as u64;
const ACCESS: u64 = raw::REDISMODULE_CMD_KEY_ACCESS as u64;
const UPDATE: u64 = raw::REDISMODULE_CMD_KEY_UPDATE as u64;
const DELETE: u64 = raw::REDISMODULE_CMD_KEY_DELETE as u64;
/// The key list depends on the arguments: the server asks the command
/// (`getkeys-api`) instead of reading the key spec alone.
const VARIABLE_FLAGS: u64 = raw::REDISMODULE_CMD_KEY_VARIABLE_FLAGS as u64;
const ACQUIRE_ALL_KEY_FLAGS: u64 = RW | ACCESS | UPDATE;
const RELEASE_ALL_KEY_FLAGS: u64 = RW | DELETE;

/// Every command the module adds. The key is always argv[1].
pub static COMMANDS: [Command; 14] = [
    Command {
        name: c"lock.acquire",
        callback: command_callback!(acquire),
        // Not deny-oom: a holder's renewal must work above maxmemory; new
        // grants check for OOM themselves. Not fast: it can block.
        flags: c"write blocking",
        arity: -4,
        key_flags: RW | ACCESS | UPDATE,
        keys: KeyPlace::First,
        acl_categories: c"write blocking",
        summary: c"Takes a lock for token with a lease of ttl-ms, exclusive or SHARED (with LIMIT: a semaphore); replies with its fencing token, or nil when it does not fit now. With BLOCK, waits in FIFO order up to timeout-ms (0: forever).",
        args: &[
            LOCK_KEY,
            TOKEN,
            TTL,
            ArgDoc {
                kind: PURE_TOKEN,
                ..option(c"SHARED", c"shared", c"A shared holder: many at once, none exclusive (readers of a read/write lock).")
            },
            option(c"LIMIT", c"limit", c"With SHARED: at most limit holders at once (a counting semaphore); the key keeps one limit until its last holder goes."),
            option(c"BLOCK", c"timeout-ms", c"Wait in line up to timeout-ms (0: no timeout) instead of answering nil."),
            option(c"MINFENCE", c"min-fence", c"Redlock quorum fencing: the fencing token is at least min-fence."),
        ],
    },
    Command {
        name: c"lock.release",
        callback: command_callback!(release),
        flags: c"write fast",
        arity: 3,
        key_flags: RW | DELETE,
        keys: KeyPlace::First,
        acl_categories: c"write fast",
        summary: c"Frees the lock if token holds it; replies 1 if it did, 0 otherwise.",
        args: &[LOCK_KEY, TOKEN],
    },
    Command {
        name: c"lock.extend",
        callback: command_callback!(extend),
        flags: c"write fast",
        arity: 4,
        key_flags: RW | UPDATE,
        keys: KeyPlace::First,
        acl_categories: c"write fast",
        summary: c"Resets the lease of the lock to ttl-ms from now if token holds it; replies 1 if it did, 0 otherwise.",
        args: &[LOCK_KEY, TOKEN, TTL],
    },
    Command {
        name: c"lock.fence",
        callback: command_callback!(fence),
        flags: c"readonly fast",
        arity: -2,
        key_flags: RO | ACCESS,
        keys: KeyPlace::First,
        acl_categories: c"read fast",
        summary: c"Replies with the holder's fencing token (only if it is token, when given), or nil; on a fence gate (LOCK.FENCED), its mark.",
        args: &[
            LOCK_KEY,
            ArgDoc {
                optional: true,
                ..TOKEN
            },
        ],
    },
    Command {
        name: c"lock.info",
        callback: command_callback!(info),
        flags: c"readonly fast",
        arity: 2,
        key_flags: RO | ACCESS,
        keys: KeyPlace::First,
        acl_categories: c"read fast",
        summary: c"Replies with token, fence, ttl, waiters and granted (Unix ms) of a held lock (its newest holder), its mode, limit and every holder, or nil.",
        args: &[LOCK_KEY],
    },
    Command {
        name: c"lock._set",
        callback: command_callback!(set),
        flags: c"write",
        arity: -5,
        key_flags: OW | UPDATE,
        keys: KeyPlace::First,
        acl_categories: c"write",
        summary: c"Internal: the replicated and AOF form of a grant or renewal. Refused from ordinary clients.",
        args: &[
            LOCK_KEY,
            TOKEN,
            arg(c"fence", INTEGER, c"The fencing token."),
            arg(c"deadline-ms", INTEGER, c"The lease's end, in Unix milliseconds."),
            ArgDoc {
                optional: true,
                ..arg(c"granted-ms", INTEGER, c"When the holder was granted, in Unix milliseconds.")
            },
        ],
    },
    Command {
        name: c"lock.exec",
        callback: command_callback!(guarded::exec),
        // Not deny-oom: the inner command meets maxmemory as itself (a GET
        // runs above it). getkeys-api: its keys are the inner command's too.
        flags: c"write getkeys-api",
        arity: -4,
        key_flags: guarded::EXEC_KEY_FLAGS | VARIABLE_FLAGS,
        keys: KeyPlace::First,
        acl_categories: c"write",
        summary: c"Runs command only while token holds the lock (with that fence, when given), in one step; replies with the command's reply, or a NOTHELD error and runs nothing.",
        args: &[
            LOCK_KEY,
            TOKEN,
            option(c"FENCE", c"fence", c"The holder's grant must have exactly this fencing token."),
            arg(c"command", STRING, c"The command to run, then its arguments."),
        ],
    },
    Command {
        name: c"lock.fenced",
        callback: command_callback!(guarded::fenced),
        flags: c"write getkeys-api",
        arity: -3,
        key_flags: guarded::GATE_KEY_FLAGS | VARIABLE_FLAGS,
        keys: KeyPlace::First,
        acl_categories: c"write",
        summary: c"Runs command only if fence is at least the gate's mark, and records fence as the mark, in one step; a lower fence gets a STALEFENCE error and runs nothing. Without a command it only checks and records.",
        args: &[
            arg(c"gate", KEY, c"The fence gate: the highest fence accepted."),
            arg(c"fence", INTEGER, c"The writer's fencing token."),
            ArgDoc {
                optional: true,
                ..arg(c"command", STRING, c"The command to run, then its arguments.")
            },
        ],
    },
    Command {
        name: c"lock._gate",
        callback: command_callback!(guarded::apply_gate),
        flags: c"write",
        arity: 3,
        key_flags: RW | UPDATE,
        keys: KeyPlace::First,
        acl_categories: c"write",
        summary: c"Internal: the replicated and AOF form of a fence gate's mark. Refused from ordinary clients.",
        args: &[
            arg(c"gate", KEY, c"The fence gate."),
            arg(c"mark", INTEGER, c"The highest fence accepted."),
        ],
    },
    Command {
        name: c"lock.acquireall",
        callback: command_callback!(acquire_all),
        // getkeys-api: Redis 7.0 routes a cluster command by its legacy
        // key range, which a numkeys spec has none of (no MOVED, no
        // CROSSSLOT); the key callback serves every server alike.
        flags: c"write blocking getkeys-api",
        arity: -5,
        key_flags: ACQUIRE_ALL_KEY_FLAGS | VARIABLE_FLAGS,
        keys: KeyPlace::NumKeys,
        acl_categories: c"write blocking",
        summary: c"Takes every key for token with one fencing token, exclusive or SHARED, or none: replies with the fencing token, or nil (nothing changed) when any key does not fit now or has waiters. With BLOCK, waits in every key's line, holding none, up to timeout-ms (0: forever).",
        args: &[
            arg(c"numkeys", INTEGER, c"How many keys follow."),
            ArgDoc {
                multiple: true,
                ..LOCK_KEY
            },
            TOKEN,
            TTL,
            ArgDoc {
                kind: PURE_TOKEN,
                ..option(c"SHARED", c"shared", c"A shared holder of every key (readers of several read/write locks).")
            },
            option(c"LIMIT", c"limit", c"With SHARED: every key is a semaphore of limit holders."),
            option(c"BLOCK", c"timeout-ms", c"Wait in every key's line up to timeout-ms (0: no timeout) instead of answering nil."),
            option(c"MINFENCE", c"min-fence", c"Redlock quorum fencing: the fencing token is at least min-fence."),
        ],
    },
    Command {
        name: c"lock.releaseall",
        callback: command_callback!(release_all),
        // Not fast: it takes any number of keys.
        flags: c"write getkeys-api",
        arity: -4,
        key_flags: RELEASE_ALL_KEY_FLAGS | VARIABLE_FLAGS,
        keys: KeyPlace::NumKeys,
        acl_categories: c"write",
        summary: c"Frees each key token holds; replies with how many it freed.",
        args: &[
            arg(c"numkeys", INTEGER, c"How many keys follow."),
            ArgDoc {
                multiple: true,
                ..LOCK_KEY
            },
            TOKEN,
        ],
    },
    Command {
        name: c"lock._shared",
        callback: command_callback!(set_shared),
        flags: c"write",
        arity: -7,
        key_flags: OW | UPDATE,
        keys: KeyPlace::First,
        acl_categories: c"write",
        summary: c"Internal: the replicated and AOF form of a shared lock, whole. Refused from ordinary clients.",
        args: &[
            LOCK_KEY,
            arg(c"limit", INTEGER, c"The key's LIMIT, or -1 for none."),
            ArgDoc {
                multiple: true,
                ..arg(c"holder", STRING, c"Each holder: token, fence, deadline-ms and granted-ms (Unix ms).")
            },
        ],
    },
    Command {
        name: c"lock._hold",
        callback: command_callback!(hold),
        flags: c"write",
        arity: 7,
        key_flags: RW | UPDATE,
        keys: KeyPlace::First,
        acl_categories: c"write",
        summary: c"Internal: the replicated and AOF form of one holder of a shared lock, added or renewed. Refused from ordinary clients.",
        args: &[
            LOCK_KEY,
            arg(c"limit", INTEGER, c"The key's LIMIT, or -1 for none."),
            TOKEN,
            arg(c"fence", INTEGER, c"The holder's fencing token."),
            arg(c"deadline-ms", INTEGER, c"When its lease ends (Unix ms)."),
            arg(c"granted-ms", INTEGER, c"When it was granted (Unix ms)."),
        ],
    },
    Command {
        name: c"lock._drop",
        callback: command_callback!(drop_holder),
        flags: c"write",
        arity: 3,
        key_flags: RW | DELETE,
        keys: KeyPlace::First,
        acl_categories: c"write",
        summary: c"Internal: the replicated and AOF form of one holder leaving a shared lock. Refused from ordinary clients.",
        args: &[LOCK_KEY, TOKEN],
    },
];

/// The key a command names, opened for writing, as the node takes it.
fn open_for_write(ctx: Ctx, argv: &Argv) -> Result<LockKey, LockError> {
    LockKey::open(ctx, argv.key())
}

/// Carries out what a command on `argv`'s key decided, with the key still
/// open as `store` (a key of another type: nothing to replicate).
fn carry_out(
    ctx: Ctx,
    argv: &Argv,
    store: &Result<LockKey, LockError>,
    decided: Decided,
    now: Now,
) {
    let name = argv.key();
    match store {
        Ok(store) => executor::carry_out(ctx, decided, Site::Command { name, store, now }),
        Err(_) => executor::carry_out(ctx, decided, Site::Background),
    }
}

fn acquire(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let now = server::now();
    let key = engine::key_of(ctx, argv.key_bytes());
    let mut store = open_for_write(ctx, argv);
    let (decided, out) = executor::decide(|n| {
        let a = args::parse_acquire(argv.bytes())?;
        let cond = engine::conditions(ctx, a.block_ms.is_some() && may_block(ctx));
        let request = AcquireRequest {
            token: a.token,
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
            return blocked::block(ctx, ticket);
        }
    })
}

/// Answers a key-position request of a `numkeys key [key ...]` command:
/// the keys numkeys names (as far as argv goes; the command itself refuses
/// a bad count).
fn report_numkeys(ctx: Ctx, argv: &Argv, flags: u64) -> Reply {
    let argc = argv.all().len();
    let n = argv
        .bytes()
        .get(1)
        .and_then(|b| args::parse_i64(b).ok())
        .filter(|&n| n > 0)
        .map_or(0, |n| {
            (n as u64).min(argc.saturating_sub(2) as u64) as usize
        });
    for pos in 2..2 + n {
        ffi::report_key(ctx, pos, flags);
    }
    Reply::KeysReported
}

/// Every argument's bytes (a multi-key command's argv is not cut at
/// `ffi::MAX_ARGS`).
fn all_bytes<'a>(argv: &Argv<'a>) -> Vec<&'a [u8]> {
    argv.all().iter().map(ffi::string_bytes_of).collect()
}

/// `LOCK.ACQUIREALL numkeys key [key ...] token ttl-ms [SHARED] [LIMIT n]
/// [BLOCK timeout-ms] [MINFENCE n]`: the keys are opened together (a key of another type
/// refuses the command before anything changes) and decided in one entry
/// of the node; a client that must wait is blocked in every key's line.
fn acquire_all(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
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
            return blocked::block(ctx, ticket);
        }
    })
}

/// `LOCK.RELEASEALL numkeys key [key ...] token`: each key released as by
/// `LOCK.RELEASE` (its next waiter handed it at once); every key is opened
/// first, so a key of another type refuses the command before anything
/// changes. How many it released.
fn release_all(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
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

/// Inside MULTI/EXEC and Lua, BLOCK answers at once, as BLPOP does there.
fn may_block(ctx: Ctx) -> bool {
    let no_blocking = raw::REDISMODULE_CTX_FLAGS_MULTI
        | raw::REDISMODULE_CTX_FLAGS_LUA
        | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
    context_flags(ctx) & no_blocking == 0
}

fn release(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
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

fn extend(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
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
        n.extend(&key, store, a.token, a.ttl_ms, cond, &mut acl, now)
    });
    carry_out(ctx, argv, &store, out, now);
    Ok(Reply::Integer(extended?.into()))
}

fn fence(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let token = args::parse_fence(argv.bytes())?;
    // One open: a gate answers its mark, a lock its holder's fence.
    let key = OpenKey::<Read>::open(ctx, argv.key());
    if let Some(mark) = key.as_ref().and_then(|k| guarded::gate_fence(k, token)) {
        return mark;
    }
    let store = ReadKey::of(key)?;
    let now_ms = server::mono_ms();
    Ok(
        match engine::with_engine(|n| n.fence_of(&store, token, now_ms)) {
            Some(fence) => Reply::Integer(fence),
            None => Reply::Null,
        },
    )
}

/// The holder's token is a credential (it can release and extend the lock):
/// it is shown only to users who may write the key. Others see nil.
fn info(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    args::parse_info(argv.bytes())?;
    let store = ReadKey::open(ctx, argv.key())?;
    let now = server::mono_ms();
    let key = engine::key_of(ctx, argv.key_bytes());
    let Some(held) = engine::with_engine(|n| n.info(&key, &store, now)) else {
        return Ok(Reply::Null);
    };
    let show_tokens = may_write_key(ctx, argv.key());
    let holder_fields = |held: &Lock<'_>| {
        let token = match show_tokens {
            true => Value::Bytes(held.token.to_vec()),
            false => Value::Null,
        };
        let granted = match datatype::wall_times(held) {
            (_, 0) => Value::Null,
            (_, at) => Value::Integer(at),
        };
        [
            (info_field::TOKEN, token),
            (info_field::FENCE, Value::Integer(held.fence)),
            (info_field::TTL, Value::Integer(held.remaining_ms(now))),
            (info_field::GRANTED, granted),
        ]
    };
    // The newest holder's fields first (the only holder's when exclusive):
    // replies read by name or by position stay as they were.
    let [token, fence, ttl, granted] = holder_fields(&held.live[held.newest]);
    let (mode, limit) = match held.mode {
        Mode::Shared { limit } => ("shared", limit.map(i64::from)),
        Mode::Exclusive => ("exclusive", None),
    };
    let waiters = held.waiters;
    let live = held.live;
    Ok(Reply::Map(vec![
        token,
        fence,
        ttl,
        (info_field::WAITERS, Value::Integer(waiters as i64)),
        granted,
        (info_field::MODE, Value::Bytes(mode.into())),
        (info_field::LIMIT, limit.map_or(Value::Null, Value::Integer)),
        (
            info_field::HOLDERS,
            Value::Maps(live.iter().map(|l| holder_fields(l).into()).collect()),
        ),
    ]))
}

/// `LOCK._SET key token fence deadline-ms [granted-ms]`: applies a grant or renewal made
/// by the master (replication stream) or logged earlier (AOF). A fence
/// beyond the bound is refused (and logged), changing nothing.
fn set(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let a = trusted(ctx, protocol::command::SET, || {
        args::parse_set(argv.bytes())
    })?;
    apply_from_outside(
        ctx,
        argv,
        &format!("LOCK._SET with fence {}", a.fence),
        |n, store, now| n.apply_set(store, a.token, a.fence, a.deadline_ms, a.granted_ms, now),
    )
}

/// `LOCK._SHARED key limit token fence deadline-ms granted-ms ...`: applies
/// a shared key, whole, as the master (replication stream) or an earlier
/// run (AOF) wrote it. A fence beyond the bound is refused (and logged),
/// changing nothing.
fn set_shared(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let all = all_bytes(argv);
    let a = trusted(ctx, protocol::command::SET_SHARED, || {
        args::parse_shared_set(&all)
    })?;
    apply_from_outside(ctx, argv, "LOCK._SHARED", |n, store, now| {
        n.apply_shared(store, a.mode, &a.holders, now)
    })
}

/// `LOCK._HOLD key limit token fence deadline-ms granted-ms`: one holder of
/// a shared key, added or renewed, as the master or an earlier run wrote
/// it (a change replicates what it changed, not the key's every holder).
fn hold(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let (mode, holder) = trusted(ctx, protocol::command::HOLD, || {
        args::parse_hold(argv.bytes())
    })?;
    apply_from_outside(
        ctx,
        argv,
        &format!("LOCK._HOLD with fence {}", holder.fence),
        |n, store, now| n.apply_hold(store, mode, &holder, now),
    )
}

/// `LOCK._DROP key token`: one holder of a shared key gone, as the master
/// or an earlier run wrote it.
fn drop_holder(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let token = trusted(ctx, protocol::command::DROP, || {
        args::parse_drop(argv.bytes())
    })?;
    apply_from_outside(ctx, argv, "LOCK._DROP", |n, store, _| {
        n.apply_drop(store, token);
        Ok(())
    })
}

/// An internal command's arguments, parsed only when it comes from the
/// master or the AOF (an ordinary client is refused, naming `command`).
fn trusted<T>(
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
fn apply_from_outside(
    ctx: Ctx,
    argv: &Argv,
    what: &str,
    apply: impl FnOnce(&mut engine::ModuleNode, &mut LockKey, Now) -> Result<(), LockError>,
) -> Result<Reply, LockError> {
    let mut store = LockKey::open_from_outside(ctx, argv.key())?;
    let now = server::conversion_now();
    if let Err(err) = engine::with_engine(|n| apply(n, &mut store, now)) {
        log_warning(&format!("lock: refusing {what}: {err}"));
        return Err(err);
    }
    ffi::replicate_verbatim(ctx);
    Ok(Reply::Ok)
}

/// The table's names are the protocol's (`core::protocol::command`), which
/// the client and the test kit send: checked at registration, so a rename
/// on one side fails the module's load in every test instead of drifting.
fn check_names() -> Result<(), String> {
    use protocol::command::{
        ACQUIRE, ACQUIRE_ALL, DROP, EXEC, EXTEND, FENCE, FENCED, GATE, HOLD, INFO, RELEASE,
        RELEASE_ALL, SET, SET_SHARED,
    };
    let names = [
        ACQUIRE,
        RELEASE,
        EXTEND,
        FENCE,
        INFO,
        SET,
        EXEC,
        FENCED,
        GATE,
        ACQUIRE_ALL,
        RELEASE_ALL,
        SET_SHARED,
        HOLD,
        DROP,
    ];
    for (c, name) in COMMANDS.iter().zip(names) {
        if !c.name.to_bytes().eq_ignore_ascii_case(name.as_bytes()) {
            return Err(format!("command {:?} is not the protocol's {name}", c.name));
        }
    }
    Ok(())
}

/// Creates every command of the table, with arity, key spec and summary where
/// the server supports command info (7.0+).
pub fn register(ctx: Ctx) -> Result<(), String> {
    if !ffi::can_create_commands() {
        return Err("RedisModule_CreateCommand is not available".into());
    }
    check_names()?;
    // The `@lock` ACL category, where the server allows it (7.4+).
    let lock_category = ffi::add_acl_category(ctx, c"lock");
    for c in &COMMANDS {
        // First key, last key, step: 1, 1, 1.
        let ok = ffi::create_command(ctx, c.name, c.callback, c.flags);
        if ok != Some(true) {
            return Err(format!("could not create command {:?}", c.name));
        }
        set_acl_categories(ctx, c, lock_category);
        if let Err(e) = set_command_info(ctx, c) {
            log_warning(&format!(
                "lock: {:?}: {e}; arity and key flags are not declared",
                c.name
            ));
        }
    }
    Ok(())
}

/// Puts `c` in its ACL categories (7.2+, Valkey 8): then `-@write` or
/// `-@blocking` also stop the lock commands. On 7.0 module commands are in
/// no category: name them in ACL rules (docs/operations.md, Security).
fn set_acl_categories(ctx: Ctx, c: &Command, lock_category: bool) {
    let mut categories = c.acl_categories.to_bytes().to_vec();
    if lock_category && !c.name.to_bytes().starts_with(b"lock._") {
        categories.extend_from_slice(b" lock");
    }
    let categories = std::ffi::CString::new(categories).unwrap_or_default();
    // None: the server cannot (7.0), or has no such command.
    if ffi::set_command_acl_categories(ctx, c.name, &categories) == Some(false) {
        log_warning(&format!(
            "lock: {:?}: the server refused ACL categories {categories:?}",
            c.name
        ));
    }
}

fn set_command_info(ctx: Ctx, c: &Command) -> Result<(), &'static str> {
    ffi::set_command_info(ctx, c.name, c.summary, c.arity, c.key_flags, c.keys, c.args)
}
