//! `LOCK.EXEC` and `LOCK.FENCED`: a command run in the same step as the
//! check that lets it run. The node decides (`Node::check_holder`,
//! `Node::pass_gate`), the core says which commands may run guarded
//! (`core::guarded`); here they are carried out: the inner command runs
//! through RM_Call as the calling user (`C`: its ACL rules, commands and
//! keys), under the rules a script's command meets (`S`: a read-only
//! replica, min-replicas-to-write, a failed save) and maxmemory (`M`), its
//! effect replicated and written to the AOF as itself (`!`: never this
//! command, so a replica never re-checks against its own clock), its reply
//! in the caller's protocol (`0`) and sent verbatim.
//!
//! Both commands declare `getkeys-api`: for ACL key patterns, cluster
//! routing (all keys in one slot: `CROSSSLOT` otherwise, from Redis) and
//! `COMMAND GETKEYS`, their keys are the lock's (or gate's) and the inner
//! command's, as the server finds them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CStr;
use std::hash::{BuildHasherDefault, Hasher};
use std::os::raw::c_int;
use std::sync::atomic::Ordering::Relaxed;

use redis_module::raw;

use super::engine;
use super::executor::{self, Site};
use super::ffi::{self, Argv, CallReply, Ctx, OpenKey, RString, Read, Reply, Write};
use super::gate::{self, GateKey};
use super::keyspace::ReadKey;
use super::server::{self, STATS};
use crate::core::error::LockError;
use crate::core::guarded::{self, CommandFlags};
use crate::core::protocol::command;

/// The lock key's key-spec flags in `LOCK.EXEC`: read only.
pub const EXEC_KEY_FLAGS: u64 =
    (raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS) as u64;
/// The gate's key-spec flags in `LOCK.FENCED`: its mark is read and
/// written (created on first use), as `SET`'s key is. UPDATE and INSERT
/// exclude each other: the server refuses a key spec with both.
pub const GATE_KEY_FLAGS: u64 = (raw::REDISMODULE_CMD_KEY_RW
    | raw::REDISMODULE_CMD_KEY_ACCESS
    | raw::REDISMODULE_CMD_KEY_UPDATE) as u64;

thread_local! {
    /// The server's flags of each command seen (`COMMAND INFO`, by lower
    /// case name or `container|sub`). Only commands the server knows are
    /// kept, so the map is bounded by the command table.
    static FLAGS: RefCell<HashMap<Box<[u8]>, CommandFlags, BuildHasherDefault<Fnv>>> =
        RefCell::new(HashMap::default());
}

/// FNV-1a: command names are short and not chosen to collide (an unknown
/// name is never stored), so a cheap hash beats SipHash on every call.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// The flags of the command `name` (lower case): None when the server does
/// not know it.
fn flags_of(ctx: Ctx, name: &[u8]) -> Option<CommandFlags> {
    if let Some(flags) = FLAGS.with(|f| f.borrow().get(name).copied()) {
        return Some(flags);
    }
    let (names, container) = ffi::command_info(ctx, name)?;
    let mut flags = names
        .iter()
        .fold(CommandFlags::empty(), |f, n| f | CommandFlags::named(n));
    flags.set(CommandFlags::CONTAINER, container);
    FLAGS.with(|f| f.borrow_mut().insert(name.into(), flags));
    Some(flags)
}

/// A command name in lower case, on the stack (names and `container|sub`
/// pairs are short; a longer one is no command the server knows).
struct LowerName {
    buf: [u8; 64],
    len: usize,
}

impl LowerName {
    fn new(parts: &[&[u8]]) -> Option<LowerName> {
        let mut name = LowerName {
            buf: [0; 64],
            len: 0,
        };
        for (i, part) in parts.iter().enumerate() {
            let sep = usize::from(i > 0);
            let end = name.len + sep + part.len();
            if end > name.buf.len() {
                return None;
            }
            if sep == 1 {
                name.buf[name.len] = b'|';
            }
            for (to, from) in name.buf[name.len + sep..end].iter_mut().zip(*part) {
                *to = from.to_ascii_lowercase();
            }
            name.len = end;
        }
        Some(name)
    }

    fn get(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Whether the inner command `inner` (its name first) may run guarded, or
/// why not.
fn plan(ctx: Ctx, inner: &[RString]) -> Result<(), LockError> {
    // The cluster flag is read only for a long command (it costs a call).
    if inner.len() > guarded::MAX_INNER_ARGS_FOR_KEYS {
        guarded::check_inner_length(inner.len(), ffi::in_cluster(ctx))?;
    }
    let name = ffi::string_bytes_of(&inner[0]);
    let Some(lower) = LowerName::new(&[name]) else {
        // No command has such a name: RM_Call says so.
        return guarded::check_inner(name, CommandFlags::empty());
    };
    let flags = flags_of(ctx, lower.get()).unwrap_or_default();
    if flags.contains(CommandFlags::CONTAINER) && inner.len() > 1 {
        let sub = ffi::string_bytes_of(&inner[1]);
        if let Some(full) = LowerName::new(&[name, sub]) {
            if let Some(sub_flags) = flags_of(ctx, full.get()) {
                return guarded::check_inner(full.get(), sub_flags);
            }
        }
    }
    guarded::check_inner(lower.get(), flags)
}

/// The inner command's RM_Call flags: as the caller's user (`C`), under a
/// script's rules (`S`) and maxmemory (`M`), replicated as itself (`!`),
/// in the caller's protocol (`0`), its strings verbatim (`v`).
const CALL_FLAGS: &CStr = c"CSM!0v";
/// The same, with errors as replies (`E`): why the call was refused.
const CALL_FLAGS_WHY: &CStr = c"CSM!0Ev";

/// Runs the inner command: its reply, or why it did not run.
fn run(ctx: Ctx, inner: &[RString]) -> Result<CallReply, LockError> {
    ffi::call(ctx, inner, CALL_FLAGS).map_err(|errno| refusal(ctx, inner, errno))
}

/// Why RM_Call ran nothing, as the caller would have been told had it
/// called the command directly.
#[cold]
fn refusal(ctx: Ctx, inner: &[RString], errno: c_int) -> LockError {
    let shown = crate::core::error::show_arg(ffi::string_bytes_of(&inner[0]));
    if errno == libc::EACCES {
        return LockError::InnerRefused(format!(
            "NOPERM this user has no permissions to run the {shown} command or to access one of its keys"
        ));
    }
    // The same call again with E (errors as replies) meets the same
    // refusal before running (nothing ran in between) and says why in
    // the server's own words.
    match ffi::call(ctx, inner, CALL_FLAGS_WHY) {
        Ok(reply) if ffi::is_error_reply(&reply) => {
            LockError::InnerRefused(ffi::call_reply_string(&reply).unwrap_or_default())
        }
        _ => LockError::InnerRefused(format!(
            "ERR the server refused to run {shown} (errno {errno})"
        )),
    }
}

/// Answers a key-position request: the guarding key at argv[1], then the
/// inner command's keys (from `command_at`).
fn report_keys(ctx: Ctx, argv: &Argv, command_at: usize, key_flags: u64) {
    let all = argv.all();
    if all.len() > 1 {
        ffi::report_key(ctx, 1, key_flags);
    }
    // Not into a nested guard (refused when run anyway): each level would
    // recurse through the server once more, and a long chain of them
    // would exhaust the stack.
    // Nor past 256 arguments: Redis 7.0's RM_GetCommandKeysWithFlags
    // leaks its key buffer beyond that. RM_Call checks the inner command's
    // ACL itself, and that its keys share a slot of this node, but not
    // that it is the guarding key's: in a cluster such a command is
    // refused before it runs (`plan`, `guarded::check_inner_length`).
    let inner = all.get(command_at..).filter(|i| {
        i.len() <= guarded::MAX_INNER_ARGS_FOR_KEYS
            && i.first()
                .is_some_and(|name| !guarded::is_lock_command(ffi::string_bytes_of(name)))
    });
    if let Some(inner) = inner {
        for (pos, flags) in ffi::command_keys(ctx, inner) {
            ffi::report_key(ctx, command_at + pos, flags);
        }
    }
}

/// `LOCK.EXEC key token [FENCE fence] command [arg ...]`
pub fn exec(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    if ffi::is_keys_position_request(ctx) {
        let at = guarded::exec_command_at(argv.bytes());
        report_keys(ctx, argv, at, EXEC_KEY_FLAGS);
        return Ok(Reply::KeysReported);
    }
    let a = guarded::parse_exec(argv.bytes(), argv.all().len())?;
    let inner = &argv.all()[a.command_at..];
    plan(ctx, inner)?;
    {
        let store = ReadKey::open(ctx, argv.key())?;
        let now_ms = server::mono_ms();
        let cond = engine::conditions(ctx, false);
        if let Err(e) =
            engine::with_engine(|n| n.check_holder(&store, a.token, a.fence, cond, now_ms))
        {
            STATS.exec_notheld.fetch_add(1, Relaxed);
            return Err(e);
        }
        // The lock's key is closed before the command runs: it may be one
        // of the command's keys.
    }
    let reply = run(ctx, inner)?;
    STATS.exec_ran.fetch_add(1, Relaxed);
    Ok(Reply::Call(reply))
}

/// `LOCK.FENCED gate fence [command [arg ...]]`: the node decides whether
/// the fence passes the gate (`Node::pass_gate`), the command runs, then
/// the node records the mark (`Node::record_fence`: it may have written
/// the gate's key; a gate it deleted comes back with the mark, a key it
/// turned into another type is left as it made it); without a command, at
/// once. A command refused before running records nothing.
pub fn fenced(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    if ffi::is_keys_position_request(ctx) {
        report_keys(ctx, argv, 3, GATE_KEY_FLAGS);
        return Ok(Reply::KeysReported);
    }
    let a = guarded::parse_fenced(argv.bytes(), argv.all().len())?;
    let inner = a.command_at.map(|at| &argv.all()[at..]);
    if let Some(inner) = inner {
        plan(ctx, inner)?;
        let args = inner[1..].iter().map(ffi::string_bytes_of);
        guarded::check_gate_not_named(argv.key_bytes(), ffi::string_bytes_of(&inner[0]), args)?;
    }
    let name = argv.key();
    let key = engine::key_of(ctx, argv.key_bytes());
    let now_us = server::conversion_now().wall_us;
    let cond = engine::conditions(ctx, false);
    let (passed, decided) = {
        let gate = GateKey::<Read>::open(ctx, name);
        executor::decide(|n| n.pass_gate(&key, &gate, a.fence, cond, now_us))
    };
    executor::carry_out(ctx, decided, Site::Gate { name });
    passed?;
    let reply = match inner {
        Some(inner) => Some(run(ctx, inner)?),
        None => None,
    };
    // The gate is closed before the outputs are carried out: its mark is
    // replicated after the command's own effect.
    let ((), decided) = {
        let mut gate = GateKey::<Write>::open(ctx, name);
        executor::decide(|n| n.record_fence(&key, &mut gate, a.fence))
    };
    executor::carry_out(ctx, decided, Site::Gate { name });
    Ok(match reply {
        Some(reply) => Reply::Call(reply),
        None => Reply::Ok,
    })
}

/// `LOCK._GATE gate mark`: a gate's mark from the master or the AOF,
/// applied by the node (never lowered; a key of another type refused) and
/// replicated as it came.
pub fn apply_gate(ctx: Ctx, argv: &Argv) -> Result<Reply, LockError> {
    let trusted = raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if ffi::context_flags(ctx) & trusted == 0 {
        return Err(LockError::InternalCommand(command::GATE));
    }
    let mark = guarded::parse_gate(argv.bytes())?;
    let now_us = server::conversion_now().wall_us;
    let raised = {
        let mut gate = GateKey::<Write>::open(ctx, argv.key());
        engine::with_engine(|n| n.apply_gate(&mut gate, mark, now_us))?
    };
    if raised {
        ffi::signal_modified_key(ctx, argv.key());
    }
    ffi::replicate_verbatim(ctx);
    Ok(Reply::Ok)
}

/// `LOCK.FENCE` on a gate: its mark (a token has no meaning there). None
/// when the key is not a gate.
pub fn gate_fence(key: &OpenKey<Read>, token: Option<&[u8]>) -> Option<Result<Reply, LockError>> {
    if !gate::is_gate(key.key()) {
        return None;
    }
    if token.is_some() {
        return Some(Err(LockError::GateHasNoHolder));
    }
    Some(gate::mark_of(key.key()).map(|m| m.map_or(Reply::Null, Reply::Integer)))
}
