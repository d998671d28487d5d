//! Guarded commands: `LOCK.EXEC` (run a command while a token holds a lock)
//! and `LOCK.FENCED` (run a command if a fence is at least a gate's mark).
//! Their arguments, which inner commands may run guarded, and the gate's
//! rule live here; the holder check is the node's
//! ([`Node::check_holder`](crate::node::Node::check_holder)), the gate's
//! decision too ([`Node::pass_gate`](crate::node::Node::pass_gate)).

use bitflags::bitflags;

use super::args::{parse_i64, parse_token};
use super::error::{show_arg, LockError};
use super::fence::within_clock_lead;
use super::limits::CLOCK_FENCES_FROM;
use super::protocol::command;

/// `LOCK.EXEC key token [FENCE fence] command [arg ...]`
#[derive(Debug, PartialEq, Eq)]
pub struct ExecArgs<'a> {
    pub token: &'a [u8],
    /// `FENCE fence`: the holder's grant must have exactly this fence.
    pub fence: Option<i64>,
    /// Where the inner command's name is in argv.
    pub command_at: usize,
}

/// `LOCK.FENCED gate fence [command [arg ...]]`
#[derive(Debug, PartialEq, Eq)]
pub struct FencedArgs {
    pub fence: i64,
    /// Where the inner command's name is in argv; None: only check and
    /// record the fence.
    pub command_at: Option<usize>,
}

/// Whether `name` (any case) runs a script or function.
pub fn is_script_command(name: &[u8]) -> bool {
    SCRIPT_COMMANDS.iter().any(|s| s.eq_ignore_ascii_case(name))
}

/// Whether `name` is one of this module's commands (any case): a guarded
/// command never runs one, and its key callback does not descend into one
/// (a chain of nested guards would recurse once per three arguments).
pub fn is_lock_command(name: &[u8]) -> bool {
    name.len() >= 5 && name[..5].eq_ignore_ascii_case(b"lock.")
}

/// Where `LOCK.EXEC`'s inner command starts, from its first five arguments
/// (`head`) alone: the `FENCE` word is the only option, and no Redis command
/// is called FENCE.
pub fn exec_command_at(head: &[&[u8]]) -> usize {
    match head.get(3) {
        Some(word) if word.eq_ignore_ascii_case(command::FENCE_WORD.as_bytes()) => 5,
        _ => 3,
    }
}

/// `LOCK.EXEC`'s arguments: `head` is argv's start (at least its first five
/// arguments when there are that many), `argc` the whole count.
pub fn parse_exec<'a>(head: &[&'a [u8]], argc: usize) -> Result<ExecArgs<'a>, LockError> {
    if argc < 3 {
        return Err(LockError::WrongArity("lock.exec"));
    }
    let token = parse_token(head[2])?;
    let command_at = exec_command_at(head);
    let fence = match command_at {
        5 => Some(parse_fence(
            head.get(4)
                .copied()
                .ok_or(LockError::MissingCommand(command::EXEC))?,
        )?),
        _ => None,
    };
    if argc <= command_at {
        return Err(LockError::MissingCommand(command::EXEC));
    }
    Ok(ExecArgs {
        token,
        fence,
        command_at,
    })
}

/// `LOCK.FENCED`'s arguments (`head` as for [`parse_exec`]).
pub fn parse_fenced(head: &[&[u8]], argc: usize) -> Result<FencedArgs, LockError> {
    if argc < 3 {
        return Err(LockError::WrongArity("lock.fenced"));
    }
    Ok(FencedArgs {
        fence: parse_fence(head[2])?,
        command_at: (argc > 3).then_some(3),
    })
}

/// `LOCK._GATE gate mark` (internal): the mark, positive.
pub fn parse_gate(argv: &[&[u8]]) -> Result<i64, LockError> {
    if argv.len() != 3 {
        return Err(LockError::WrongArity("lock._gate"));
    }
    match parse_i64(argv[2]) {
        Ok(mark) if mark > 0 => Ok(mark),
        _ => Err(LockError::BadInternalArgument("mark")),
    }
}

/// A fence given to a guarded command: a positive integer. (The gate's
/// clock bound is the node's, see [`check_gate_fence`].)
fn parse_fence(arg: &[u8]) -> Result<i64, LockError> {
    match parse_i64(arg) {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(LockError::BadFenceArg(show_arg(arg))),
    }
}

/// A fence that would become a gate's mark must be within
/// [`MAX_FENCE_LEAD`](crate::limits::MAX_FENCE_LEAD) of the clock, as
/// MINFENCE's: one huge fence would otherwise close the gate for good.
/// Every fence this module issues is the clock in µs or just above it.
pub fn check_gate_fence(fence: i64, now_us: i64) -> Result<(), LockError> {
    if !within_clock_lead(fence, now_us) {
        return Err(LockError::BadFenceArg(format!("'{fence}'")));
    }
    Ok(())
}

/// A gate's mark from outside: positive always; from a user (`RESTORE`,
/// `trusted` false) also within the clock bound `LOCK.FENCED` applies. From
/// this node's own data or its master (an RDB or AOF being loaded, a full
/// sync, `LOCK._GATE` from the link) it was accepted under that bound on
/// the node that recorded it, against that node's clock: refusing it here
/// for this clock (a replica behind, a clock stepped back before a
/// restart) would drop the gate, or stop the load.
pub fn check_loaded_mark(mark: i64, trusted: bool, now_us: i64) -> Result<(), LockError> {
    if mark <= 0 {
        return Err(LockError::BadFence("must be a positive integer"));
    }
    if !trusted && !within_clock_lead(mark, now_us) {
        return Err(LockError::BadFence("more than 2^50 above the clock"));
    }
    Ok(())
}

bitflags! {
    /// The command flags the server reports for a command (`COMMAND INFO`)
    /// that decide whether it may run guarded.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct CommandFlags: u8 {
        const WRITE = 1 << 0;
        const BLOCKING = 1 << 1;
        const NOSCRIPT = 1 << 2;
        const ADMIN = 1 << 3;
        const PUBSUB = 1 << 4;
        /// A container of subcommands (`CONFIG`, `CLIENT`): the flags that
        /// count are its subcommand's.
        const CONTAINER = 1 << 5;
        /// A command of a module.
        const MODULE = 1 << 6;
    }
}

impl CommandFlags {
    /// The flag named as `COMMAND INFO` names it (others are ignored).
    pub fn named(name: &[u8]) -> CommandFlags {
        match name {
            b"write" => CommandFlags::WRITE,
            b"blocking" => CommandFlags::BLOCKING,
            b"noscript" => CommandFlags::NOSCRIPT,
            b"admin" => CommandFlags::ADMIN,
            b"pubsub" => CommandFlags::PUBSUB,
            b"module" => CommandFlags::MODULE,
            _ => CommandFlags::empty(),
        }
    }
}

/// The commands that run a script or function. None runs guarded: a
/// guarded command runs its inner command inside its own call, through the
/// server's call of it on the module's client, and a script that runs past
/// `busy-reply-threshold` makes the server serve events while it is busy,
/// protecting only that client. The client whose guarded command is on the
/// stack may then disconnect or pipeline its next command, which crashed
/// Redis 7.0, 8.2 and Valkey 8.1; and in a cluster the script's undeclared
/// keys were filed under the lock's slot. Several writes are guarded as one
/// the other way round: the user's script checks the lock (`LOCK.FENCE key
/// token`, `LOCK.FENCED gate fence`) and then writes, run by the server as
/// any script.
const SCRIPT_COMMANDS: [&[u8]; 6] = [
    b"eval",
    b"evalsha",
    b"eval_ro",
    b"evalsha_ro",
    b"fcall",
    b"fcall_ro",
];

/// Commands that move whole databases: `SWAPDB` would put another
/// database's key where a gate was, under the gate's own check.
const WHOLE_DATABASE_COMMANDS: [&[u8]; 1] = [b"swapdb"];

/// Whether the command `name` (any case; `container|sub` for a
/// subcommand), with the server's `flags` for it, may run guarded.
/// Refused: `LOCK.*` (a guard inside a guard, or a lock changed under its
/// own check), scripts and functions (see `SCRIPT_COMMANDS`), commands
/// that block, change the connection's state or transaction (`MULTI`,
/// `WATCH`, `SUBSCRIBE`: pub/sub and no-script), admin commands, commands
/// of other modules, and `SWAPDB`.
pub fn check_inner(name: &[u8], flags: CommandFlags) -> Result<(), LockError> {
    let refuse = |why| {
        Err(LockError::NotGuardable(
            show_arg(&name.to_ascii_lowercase()),
            why,
        ))
    };
    if is_lock_command(name) {
        return refuse("lock commands are not run guarded");
    }
    if is_script_command(name) {
        return refuse(
            "scripts and functions are not run guarded; check the lock inside the script instead \
             (LOCK.FENCE key token, or LOCK.FENCED gate fence, then the writes)",
        );
    }
    if WHOLE_DATABASE_COMMANDS
        .iter()
        .any(|c| c.eq_ignore_ascii_case(name))
    {
        return refuse("it moves whole databases");
    }
    if flags.contains(CommandFlags::BLOCKING) {
        return refuse("it may block");
    }
    if flags.contains(CommandFlags::PUBSUB) {
        return refuse("pub/sub commands are not run guarded");
    }
    if flags.contains(CommandFlags::ADMIN) {
        return refuse("admin commands are not run guarded");
    }
    if flags.contains(CommandFlags::NOSCRIPT) {
        return refuse("it cannot run in a script or transaction (MULTI, WATCH, ...)");
    }
    // A module command may block its caller without declaring it, which
    // makes the server abort when it runs inside another command.
    if flags.contains(CommandFlags::MODULE) {
        return refuse("commands of other modules are not run guarded");
    }
    Ok(())
}

/// `LOCK.FENCED`'s inner command may not name its own gate (any argument
/// equal to the gate's key, a key or not): a command that overwrote the
/// gate (`SET gate x`, `RENAME other gate`) would take the mark with it,
/// and the gate would accept any fence once that key was deleted. A
/// command that deletes keys without naming them (`FLUSHDB`) is repaired:
/// the mark is recorded after the command ran.
/// `name` is the inner command's name, `args` its arguments after it.
pub fn check_gate_not_named<'a>(
    gate: &[u8],
    name: &[u8],
    mut args: impl Iterator<Item = &'a [u8]>,
) -> Result<(), LockError> {
    if args.any(|arg| arg == gate) {
        return Err(LockError::NotGuardable(
            show_arg(&name.to_ascii_lowercase()),
            "it names the gate's own key, which would lose its mark",
        ));
    }
    Ok(())
}

pub use super::limits::MAX_INNER_ARGS_FOR_KEYS;

/// Whether an inner command of `args` arguments (its name included) may
/// run guarded. In a cluster (`cluster`) Redis checks that every key of a
/// guarded command hashes to the guarding key's slot only among the keys
/// reported, and the inner command's are not reported above
/// [`MAX_INNER_ARGS_FOR_KEYS`]: RM_Call would still check that they share
/// a slot of this node, but not the lock's, so such a command is refused.
/// Outside a cluster there is no slot to keep, and any length runs.
pub fn check_inner_length(args: usize, cluster: bool) -> Result<(), LockError> {
    if cluster && args > MAX_INNER_ARGS_FOR_KEYS {
        return Err(LockError::TooLongForCluster(args));
    }
    Ok(())
}

/// The gate's rule: `fence` passes if it is at least the gate's `mark`
/// (None: a new gate), and is the mark from then on. A clock fence (at
/// least [`CLOCK_FENCES_FROM`]) must also reach `floor`: the node's first
/// fence since it last loaded its data or was promoted, so a mark lost
/// with the data (a restart from an older RDB, a failover before the last
/// `LOCK.FENCED` reached the replica, a gate created since the last save)
/// lets no fence issued before then through.
pub fn pass(mark: Option<i64>, fence: i64, floor: i64) -> Result<i64, LockError> {
    if fence >= CLOCK_FENCES_FROM && fence < floor {
        return Err(LockError::StaleFence {
            fence,
            mark: mark.unwrap_or(0).max(floor),
        });
    }
    match mark {
        Some(mark) if fence < mark => Err(LockError::StaleFence { fence, mark }),
        Some(mark) => Ok(mark.max(fence)),
        None => Ok(fence),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::LockError::*;

    #[test]
    fn exec_arguments() {
        let a = parse_exec(&[b"lock.exec", b"k", b"t", b"SET", b"d"], 5).unwrap();
        assert_eq!((a.token, a.fence, a.command_at), (&b"t"[..], None, 3));
        let a = parse_exec(&[b"lock.exec", b"k", b"t", b"fence", b"7", b"SET"], 9).unwrap();
        assert_eq!((a.fence, a.command_at), (Some(7), 5));
        assert_eq!(
            parse_exec(&[b"lock.exec", b"k", b"t"], 3),
            Err(MissingCommand("LOCK.EXEC"))
        );
        assert_eq!(
            parse_exec(&[b"lock.exec", b"k", b"t", b"FENCE", b"7"], 5),
            Err(MissingCommand("LOCK.EXEC"))
        );
        assert_eq!(
            parse_exec(&[b"lock.exec", b"k", b"t", b"FENCE"], 4),
            Err(MissingCommand("LOCK.EXEC"))
        );
        assert!(matches!(
            parse_exec(&[b"lock.exec", b"k", b"t", b"FENCE", b"0", b"GET"], 6),
            Err(BadFenceArg(_))
        ));
        assert_eq!(
            parse_exec(&[b"lock.exec", b"k", b"", b"GET", b"x"], 5),
            Err(TokenEmpty)
        );
        assert_eq!(
            parse_exec(&[b"lock.exec", b"k"], 2),
            Err(WrongArity("lock.exec"))
        );
    }

    #[test]
    fn fenced_arguments() {
        assert_eq!(
            parse_fenced(&[b"lock.fenced", b"g", b"5"], 3),
            Ok(FencedArgs {
                fence: 5,
                command_at: None
            })
        );
        assert_eq!(
            parse_fenced(&[b"lock.fenced", b"g", b"5", b"SET"], 6).map(|a| a.command_at),
            Ok(Some(3))
        );
        for bad in [&b"-1"[..], b"0", b"x", b"1.5", b""] {
            assert!(matches!(
                parse_fenced(&[b"lock.fenced", b"g", bad], 3),
                Err(BadFenceArg(_))
            ));
        }
        assert!(check_gate_fence(i64::MAX, 1_700_000_000_000_000).is_err());
        assert!(check_gate_fence(1, 1_700_000_000_000_000).is_ok());
    }

    #[test]
    fn which_commands_run_guarded() {
        let none = CommandFlags::empty();
        assert_eq!(check_inner(b"SET", CommandFlags::WRITE), Ok(()));
        assert_eq!(check_inner(b"flushdb", CommandFlags::WRITE), Ok(()));
        for (name, flags) in [
            (&b"EVAL"[..], CommandFlags::NOSCRIPT),
            (b"evalsha", CommandFlags::NOSCRIPT),
            (b"Eval_Ro", CommandFlags::NOSCRIPT),
            (b"evalsha_ro", CommandFlags::NOSCRIPT),
            (b"FCALL", CommandFlags::NOSCRIPT),
            (b"fcall_ro", none),
        ] {
            let refused = check_inner(name, flags).unwrap_err().to_string();
            assert!(
                refused.starts_with("NOTGUARDABLE") && refused.contains("LOCK.FENCE"),
                "{refused}"
            );
        }
        for (name, flags) in [
            (&b"SWAPDB"[..], CommandFlags::WRITE),
            (b"LOCK.RELEASE", none),
            (b"lock.exec", none),
            (b"BLPOP", CommandFlags::BLOCKING | CommandFlags::WRITE),
            (b"multi", CommandFlags::NOSCRIPT),
            (b"subscribe", CommandFlags::PUBSUB | CommandFlags::NOSCRIPT),
            (b"publish", CommandFlags::PUBSUB),
            (b"config|set", CommandFlags::ADMIN | CommandFlags::NOSCRIPT),
            (b"json.set", CommandFlags::MODULE | CommandFlags::WRITE),
        ] {
            let refused = check_inner(name, flags).unwrap_err();
            assert!(refused.to_string().starts_with("NOTGUARDABLE"), "{refused}");
        }
    }

    #[test]
    fn in_a_cluster_an_inner_command_too_long_for_its_keys_to_be_reported_is_refused() {
        let bound = MAX_INNER_ARGS_FOR_KEYS;
        assert_eq!(check_inner_length(bound, true), Ok(()));
        assert_eq!(
            check_inner_length(bound + 1, true),
            Err(TooLongForCluster(bound + 1))
        );
        let text = check_inner_length(bound + 3, true).unwrap_err().to_string();
        assert!(
            text.starts_with("NOTGUARDABLE") && text.contains("259") && text.contains("256"),
            "{text}"
        );
        // No slots outside a cluster: any length runs.
        assert_eq!(check_inner_length(bound + 1, false), Ok(()));
        assert_eq!(check_inner_length(100_000, false), Ok(()));
    }

    #[test]
    fn the_gate_takes_fences_at_or_above_its_mark() {
        assert_eq!(pass(None, 3, 0), Ok(3));
        assert_eq!(pass(Some(3), 3, 0), Ok(3));
        assert_eq!(pass(Some(3), 9, 0), Ok(9));
        assert_eq!(pass(Some(9), 3, 0), Err(StaleFence { fence: 3, mark: 9 }));
    }

    #[test]
    fn after_a_load_or_promotion_clock_fences_from_before_are_refused() {
        let floor = 1_800_000_000_000_000;
        let before = floor - 5;
        // A gate lost with the data, or one whose mark went back.
        assert_eq!(
            pass(None, before, floor),
            Err(StaleFence {
                fence: before,
                mark: floor
            })
        );
        assert_eq!(
            pass(Some(before - 10), before, floor),
            Err(StaleFence {
                fence: before,
                mark: floor
            })
        );
        assert_eq!(pass(None, floor, floor), Ok(floor));
        assert_eq!(pass(Some(before), floor + 7, floor), Ok(floor + 7));
        // A mark above the floor is the gate's own rule.
        assert_eq!(
            pass(Some(floor + 9), floor + 7, floor),
            Err(StaleFence {
                fence: floor + 7,
                mark: floor + 9
            })
        );
        // Counters of the user's own are not a clock's: the mark alone.
        assert_eq!(pass(Some(5000), 5005, floor), Ok(5005));
        assert_eq!(pass(None, 5, floor), Ok(5));
        assert_eq!(
            pass(Some(5010), 5005, floor),
            Err(StaleFence {
                fence: 5005,
                mark: 5010
            })
        );
    }

    #[test]
    fn a_command_may_not_name_its_own_gate() {
        let check =
            |inner: &[&[u8]]| check_gate_not_named(b"g", inner[0], inner[1..].iter().copied());
        assert_eq!(check(&[b"SET", b"d", b"1"]), Ok(()));
        for inner in [
            &[&b"SET"[..], b"g", b"x"][..],
            &[b"rename", b"d", b"g"],
            &[b"COPY", b"d", b"g", b"REPLACE"],
            &[b"SET", b"d", b"g"],
        ] {
            let e = check(inner).unwrap_err().to_string();
            assert!(e.starts_with("NOTGUARDABLE") && e.contains("gate"), "{e}");
        }
        // The command's name is not an argument.
        assert_eq!(
            check_gate_not_named(b"get", b"GET", [&b"d"[..]].into_iter()),
            Ok(())
        );
    }
}
