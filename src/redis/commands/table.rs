//! The command table: every command's name, flags, arity, ACL categories,
//! key spec and `COMMAND DOCS` arguments, and its handler; registered
//! from it.

use super::*;

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

pub(super) const KEY: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY;
pub(super) const STRING: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING;
pub(super) const INTEGER: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER;
pub(super) const PURE_TOKEN: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN;

pub(super) const fn arg(
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

pub(super) const fn option(
    token: &'static CStr,
    name: &'static CStr,
    summary: &'static CStr,
) -> ArgDoc {
    ArgDoc {
        name,
        kind: INTEGER,
        token: Some(token),
        optional: true,
        multiple: false,
        summary,
    }
}

pub(super) const LOCK_KEY: ArgDoc = arg(c"key", KEY, c"The lock's key.");
pub(super) const TOKEN: ArgDoc = arg(
    c"token",
    STRING,
    c"The holder's secret: unguessable, at most lock.max-token-len bytes.",
);
pub(super) const TTL: ArgDoc = arg(
    c"ttl-ms",
    INTEGER,
    c"The lease, in milliseconds (at most lock.max-ttl-ms).",
);

pub(super) const RW: u64 = raw::REDISMODULE_CMD_KEY_RW as u64;
pub(super) const RO: u64 = raw::REDISMODULE_CMD_KEY_RO as u64;
pub(super) const OW: u64 = raw::REDISMODULE_CMD_KEY_OW as u64;
pub(super) const ACCESS: u64 = raw::REDISMODULE_CMD_KEY_ACCESS as u64;
pub(super) const UPDATE: u64 = raw::REDISMODULE_CMD_KEY_UPDATE as u64;
pub(super) const DELETE: u64 = raw::REDISMODULE_CMD_KEY_DELETE as u64;
/// The key list depends on the arguments: the server asks the command
/// (`getkeys-api`) instead of reading the key spec alone.
pub(super) const VARIABLE_FLAGS: u64 = raw::REDISMODULE_CMD_KEY_VARIABLE_FLAGS as u64;
pub(super) const ACQUIRE_ALL_KEY_FLAGS: u64 = RW | ACCESS | UPDATE;
pub(super) const RELEASE_ALL_KEY_FLAGS: u64 = RW | DELETE;

/// Every command the module adds. The key is always argv[1].
pub static COMMANDS: [Command; 16] = [
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
            ArgDoc {
                kind: STRING,
                ..option(c"VALUE", c"value", c"Exclusive only: the holder's public value (a leader's address or id), shown to every reader; the token's renewal with another value changes it.")
            },
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
        arity: -4,
        key_flags: RW | UPDATE,
        keys: KeyPlace::First,
        acl_categories: c"write fast",
        summary: c"Resets the lease of the lock to ttl-ms from now if token holds it (and with VALUE, sets its public value); replies 1 if it did, 0 otherwise.",
        args: &[
            LOCK_KEY,
            TOKEN,
            TTL,
            ArgDoc {
                kind: STRING,
                ..option(c"VALUE", c"value", c"An exclusive holder's new public value (a proclaim: observers are told).")
            },
        ],
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
            ArgDoc {
                optional: true,
                ..arg(c"value", STRING, c"The holder's public value (written only when it has one; after granted-ms).")
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
            ArgDoc {
                kind: STRING,
                ..option(c"VALUE", c"value", c"Exclusive only: every key's holder gets this public value.")
            },
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
    Command {
        name: c"lock.observe",
        callback: command_callback!(observe),
        // Reads only (a replica serves it); not fast: it can block.
        flags: c"readonly blocking",
        arity: -2,
        key_flags: RO | ACCESS,
        keys: KeyPlace::First,
        acl_categories: c"read blocking",
        summary: c"Replies with the key's leader (fence, ttl and value; fence 0, ttl -2 and value nil when nobody holds it). With AFTER, only when it is no longer the one with that fence (0: the key was free) and, with VALUE, that value: else nil, or with BLOCK the client waits until it changes, up to timeout-ms (0: forever).",
        args: &[
            LOCK_KEY,
            option(c"AFTER", c"fence", c"The fence of the leader last seen (0: the key was free): answer only once the leader differs."),
            ArgDoc {
                kind: STRING,
                ..option(c"VALUE", c"value", c"With AFTER and a fence above 0: the value seen with that leader (empty: none); a new value it proclaimed since is answered at once. Without it, the holder's value now.")
            },
            option(c"BLOCK", c"timeout-ms", c"With AFTER: wait up to timeout-ms (0: no timeout) for the next leader instead of answering nil."),
        ],
    },
    Command {
        name: c"lock.scan",
        callback: command_callback!(scan),
        // Reads only; keyless, as SCAN: each node lists its own locks.
        flags: c"readonly",
        arity: -2,
        key_flags: 0,
        keys: KeyPlace::None,
        acl_categories: c"read keyspace",
        summary: c"Replies with the next cursor (0: done) and a page of the node's held locks in the current db, from its index of leases (not a walk of the keyspace): each as LOCK.INFO shows it, with its key first. Only keys the user may read; tokens only where it may write.",
        args: &[
            arg(c"cursor", INTEGER, c"0 to start, then the cursor the last page answered."),
            ArgDoc {
                kind: STRING,
                ..option(c"MATCH", c"pattern", c"Only keys matching this glob, as SCAN's MATCH.")
            },
            option(c"COUNT", c"count", c"About how many index entries one page looks at (default 10)."),
            ArgDoc {
                kind: PURE_TOKEN,
                ..option(c"WAITING", c"waiting", c"Only locks with clients waiting in their line.")
            },
        ],
    },
];

/// The table's names are the protocol's (`core::protocol::command`), which
/// the client and the test kit send: checked at registration, so a rename
/// on one side fails the module's load in every test instead of drifting.
pub(super) fn check_names() -> Result<(), String> {
    use protocol::command::{
        ACQUIRE, ACQUIRE_ALL, DROP, EXEC, EXTEND, FENCE, FENCED, GATE, HOLD, INFO, OBSERVE,
        RELEASE, RELEASE_ALL, SCAN, SET, SET_SHARED,
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
        OBSERVE,
        SCAN,
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
        let ok = ffi::create_command(ctx, c.name, c.callback, c.flags, c.keys);
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
pub(super) fn set_acl_categories(ctx: Ctx, c: &Command, lock_category: bool) {
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

pub(super) fn set_command_info(ctx: Ctx, c: &Command) -> Result<(), &'static str> {
    ffi::set_command_info(ctx, c.name, c.summary, c.arity, c.key_flags, c.keys, c.args)
}
