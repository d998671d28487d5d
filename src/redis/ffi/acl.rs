//! ACL checks: may a client, or a named user, touch a key or run a command.

use super::*;

/// Whether the user running this command may write `key` (ACL key
/// patterns). Without a user (timers, the AOF) or without the ACL API, yes.
pub fn may_write_key(ctx: Ctx, key: RString) -> bool {
    let Some(user_name) = optional_api!(RedisModule_GetCurrentUserName) else {
        return true;
    };
    // SAFETY: ctx is a handle Redis gave the caller.
    let Some(name) = OwnedString::take(ctx, RString(unsafe { user_name(ctx.0) })) else {
        return true;
    };
    user_may_write_key(name.get(), key)
}

/// Whether the user running this command may read `key` (ACL key
/// patterns, `%R~`). As [`may_write_key`] otherwise.
pub fn may_read_key(ctx: Ctx, key: RString) -> bool {
    let Some(user_name) = optional_api!(RedisModule_GetCurrentUserName) else {
        return true;
    };
    // SAFETY: ctx is a handle Redis gave the caller.
    let Some(name) = OwnedString::take(ctx, RString(unsafe { user_name(ctx.0) })) else {
        return true;
    };
    user_key_permission(name.get(), key, raw::REDISMODULE_CMD_KEY_ACCESS)
}

/// A user looked up by name for an ACL check, freed on drop.
pub(super) struct ModuleUser {
    ptr: NonNull<raw::RedisModuleUser>,
    free: unsafe extern "C" fn(*mut raw::RedisModuleUser),
}

impl ModuleUser {
    /// The user named `name` (None: no such user now, or no ACL API).
    fn named(name: RString) -> Option<ModuleUser> {
        let (get, free) = (
            optional_api!(RedisModule_GetModuleUserFromUserName)?,
            optional_api!(RedisModule_FreeModuleUser)?,
        );
        // SAFETY: `name` is a string Redis gave the caller.
        let ptr = NonNull::new(unsafe { get(name.0) })?;
        Some(ModuleUser { ptr, free })
    }
}

impl Drop for ModuleUser {
    fn drop(&mut self) {
        // SAFETY: came from RM_GetModuleUserFromUserName, freed once.
        unsafe { (self.free)(self.ptr.as_ptr()) };
    }
}

/// Whether the ACL API this module asks is there (Redis 7.0 and later).
pub(super) fn acl_api_present() -> bool {
    optional_api!(RedisModule_GetModuleUserFromUserName).is_some()
        && optional_api!(RedisModule_FreeModuleUser).is_some()
}

/// Whether the user named `user_name` may write `key`. No when that user
/// no longer exists; yes without the ACL API.
pub fn user_may_write_key(user_name: RString, key: RString) -> bool {
    user_key_permission(user_name, key, raw::REDISMODULE_CMD_KEY_UPDATE)
}

/// Whether the user named `user_name` has `flags` (a key-spec access flag)
/// on `key`. No when that user no longer exists; yes without the ACL API.
fn user_key_permission(user_name: RString, key: RString, flags: u32) -> bool {
    let Some(check) = optional_api!(RedisModule_ACLCheckKeyPermissions) else {
        return true;
    };
    if !acl_api_present() {
        return true;
    }
    let Some(user) = ModuleUser::named(user_name) else {
        return false; // the user was deleted meanwhile
    };
    // SAFETY: `user` is live until dropped below; `key` is a handle Redis
    // gave the caller.
    let answer = unsafe { check(user.ptr.as_ptr(), key.0, flags as c_int) };
    answer == raw::REDISMODULE_OK as c_int
}

/// Whether the user named `user_name` may still run `LOCK.ACQUIRE` on
/// `key`: the command itself (`ACL SETUSER u -lock.acquire`, where the
/// server can check it, as Valkey and Redis 8 do for a BLPOP waiter) and
/// write access to the key.
pub fn user_may_acquire(ctx: Ctx, user_name: RString, key: RString) -> bool {
    let acquire = crate::core::protocol::command::ACQUIRE.as_bytes();
    user_may_write_key(user_name, key) && user_may_run(ctx, user_name, acquire, key, &[b"t", b"1"])
}

/// Whether the user named `user_name` may still run `LOCK.OBSERVE` on
/// `key`: the command and read access to the key (an observer told of a
/// change reads the key's leader then).
pub fn user_may_observe(ctx: Ctx, user_name: RString, key: RString) -> bool {
    let observe = crate::core::protocol::command::OBSERVE.as_bytes();
    user_key_permission(user_name, key, raw::REDISMODULE_CMD_KEY_ACCESS)
        && user_may_run(ctx, user_name, observe, key, &[])
}

/// Whether the user named `user_name` may run `command key rest...` (the
/// command's ACL rules; keys are checked apart). Yes where the server
/// cannot check it (no ACL API).
fn user_may_run(
    ctx: Ctx,
    user_name: RString,
    command: &[u8],
    key: RString,
    rest: &[&[u8]],
) -> bool {
    let Some(check) = optional_api!(RedisModule_ACLCheckCommandPermissions) else {
        return true;
    };
    if !acl_api_present() {
        return true;
    }
    let Some(user) = ModuleUser::named(user_name) else {
        return false;
    };
    let name = OwnedString::new(ctx, command);
    let words: Vec<OwnedString> = rest.iter().map(|w| OwnedString::new(ctx, w)).collect();
    let mut argv: Vec<*mut raw::RedisModuleString> = [name.get(), key]
        .into_iter()
        .chain(words.iter().map(OwnedString::get))
        .map(RString::as_ptr)
        .collect();
    // SAFETY: `user` is live until dropped below; argv holds valid
    // strings, alive for the call (`name`, `words` and `key`).
    let answer = unsafe { check(user.ptr.as_ptr(), argv.as_mut_ptr(), argv.len() as c_int) };
    answer == raw::REDISMODULE_OK as c_int
}
