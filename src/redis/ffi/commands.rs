//! Creating commands, their ACL categories and their COMMAND INFO.

use super::*;

/// Whether the server has RM_CreateCommand.
pub fn can_create_commands() -> bool {
    optional_api!(RedisModule_CreateCommand).is_some()
}

/// RM_CreateCommand (first key, last key, step: 1, 1, 1; a keyless
/// command 0, 0, 0): whether Redis accepted; None where it lacks the API.
pub fn create_command(
    ctx: Ctx,
    name: &CStr,
    callback: CommandFn,
    flags: &CStr,
    keys: KeyPlace,
) -> Option<bool> {
    let create = optional_api!(RedisModule_CreateCommand)?;
    let callback = raw_callback!(callback);
    let first = match keys {
        KeyPlace::None => 0,
        KeyPlace::First | KeyPlace::NumKeys => 1,
    };
    // SAFETY: ctx is the load context Redis gave the caller; Redis copies
    // the strings; the callback is a plain function.
    let ok = unsafe {
        create(
            ctx.0,
            name.as_ptr(),
            callback,
            flags.as_ptr(),
            first,
            first,
            first,
        )
    };
    Some(ok == raw::REDISMODULE_OK as c_int)
}

/// Adds an ACL category, where the server allows it (7.4+).
pub fn add_acl_category(ctx: Ctx, name: &CStr) -> bool {
    match optional_api!(RedisModule_AddACLCategory) {
        // SAFETY: ctx is the load context Redis gave the caller.
        Some(add) => unsafe { add(ctx.0, name.as_ptr()) == raw::REDISMODULE_OK as c_int },
        None => false,
    }
}

/// The command `name` of this module; None where the server has no
/// RM_GetCommand, or no such command.
pub(super) fn command_of(ctx: Ctx, name: &CStr) -> Option<*mut raw::RedisModuleCommand> {
    let get_command = optional_api!(RedisModule_GetCommand)?;
    // SAFETY: ctx is the load context Redis gave the caller.
    let command = unsafe { get_command(ctx.0, name.as_ptr()) };
    (!command.is_null()).then_some(command)
}

/// Puts the command `name` in the ACL categories `categories` (7.2+,
/// Valkey 8): None where the server cannot, or has no such command;
/// otherwise whether it accepted them.
pub fn set_command_acl_categories(ctx: Ctx, name: &CStr, categories: &CStr) -> Option<bool> {
    let set_categories = optional_api!(RedisModule_SetCommandACLCategories)?;
    let command = command_of(ctx, name)?;
    // SAFETY: `command` was just looked up (not NULL); Redis copies the
    // string.
    Some(unsafe { set_categories(command, categories.as_ptr()) } == raw::REDISMODULE_OK as c_int)
}

/// One argument as COMMAND DOCS describes it.
pub struct ArgDoc {
    pub name: &'static CStr,
    pub kind: raw::RedisModuleCommandArgType,
    /// The word that introduces it (`BLOCK`), if any.
    pub token: Option<&'static CStr>,
    pub optional: bool,
    /// Given one or more times (`key [key ...]`).
    pub multiple: bool,
    pub summary: &'static CStr,
}

/// Where a command's keys are.
#[derive(Clone, Copy)]
pub enum KeyPlace {
    /// One key, at argv[1].
    First,
    /// `numkeys key [key ...]`: the count at argv[1], the keys after it.
    NumKeys,
    /// No key (the node's, as `SCAN`): served by the node it is sent to.
    None,
}

/// Declares the command `name`'s arity, its keys (with `key_flags`),
/// summary and arguments (COMMAND INFO, COMMAND DOCS).
#[allow(clippy::too_many_arguments)] // one input per part of the info
pub fn set_command_info(
    ctx: Ctx,
    name: &CStr,
    summary: &CStr,
    arity: c_int,
    key_flags: u64,
    keys: KeyPlace,
    args: &[ArgDoc],
) -> Result<(), &'static str> {
    let (Some(_), Some(set_info)) = (
        optional_api!(RedisModule_GetCommand),
        optional_api!(RedisModule_SetCommandInfo),
    ) else {
        return Err("this server has no RedisModule_SetCommandInfo");
    };
    let Some(command) = command_of(ctx, name) else {
        return Err("RedisModule_GetCommand found no such command");
    };
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    // One key at argv[1]; the array ends with an all-zero spec.
    // SAFETY: a plain C struct of integers, raw pointers and unions of
    // those: all zeros is a valid value (C's `{0}`).
    let mut key_specs: [raw::RedisModuleCommandKeySpec; 2] = unsafe { std::mem::zeroed() };
    // A keyless command declares none: the all-zero spec ends the array.
    let keyless = matches!(keys, KeyPlace::None);
    key_specs[0].flags = key_flags;
    key_specs[0].begin_search_type =
        raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    key_specs[0].bs.index.pos = 1;
    match keys {
        KeyPlace::First => {
            key_specs[0].find_keys_type =
                raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
            key_specs[0].fk.range.lastkey = 0;
            key_specs[0].fk.range.keystep = 1;
            key_specs[0].fk.range.limit = 0;
        }
        KeyPlace::NumKeys => {
            key_specs[0].find_keys_type =
                raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
            key_specs[0].fk.keynum.keynumidx = 0;
            key_specs[0].fk.keynum.firstkey = 1;
            key_specs[0].fk.keynum.keystep = 1;
        }
        KeyPlace::None => {}
    }
    if keyless {
        // SAFETY: as above: all zeros is a valid spec.
        key_specs[0] = unsafe { std::mem::zeroed() };
    }
    // The array ends with an all-zero entry; Redis copies it.
    let mut raw_args: Vec<raw::RedisModuleCommandArg> = args
        .iter()
        .map(|a| {
            let mut raw_arg = zeroed_arg();
            raw_arg.name = a.name.as_ptr();
            raw_arg.type_ = a.kind;
            raw_arg.key_spec_index =
                if a.kind == raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY {
                    0
                } else {
                    -1
                };
            raw_arg.token = a.token.map_or(std::ptr::null(), CStr::as_ptr);
            raw_arg.summary = a.summary.as_ptr();
            if a.optional {
                raw_arg.flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int;
            }
            if a.multiple {
                raw_arg.flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE as c_int;
            }
            raw_arg
        })
        .collect();
    raw_args.push(zeroed_arg());
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: summary.as_ptr(),
        complexity: c"O(1)".as_ptr(),
        since: c"0.1.0".as_ptr(),
        history: std::ptr::null_mut(),
        tips: std::ptr::null(),
        arity,
        key_specs: key_specs.as_mut_ptr(),
        args: raw_args.as_mut_ptr(),
    };
    // SAFETY: `command` was just looked up (not NULL); `info` and everything
    // it points at (static strings, the local arrays, each ending with an
    // all-zero entry) are alive for the call, and Redis copies them.
    if unsafe { set_info(command, &info) } != raw::REDISMODULE_OK as c_int {
        return Err("RedisModule_SetCommandInfo refused the command info");
    }
    Ok(())
}

pub(super) fn zeroed_arg() -> raw::RedisModuleCommandArg {
    // SAFETY: a plain C struct of integers and raw pointers: all zeros is a
    // valid value (C's `{0}`).
    unsafe { std::mem::zeroed() }
}
