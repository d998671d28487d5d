//! Clients: their ids, their state, their users.

use super::*;

/// The calling client's id, where the server can tell.
pub fn client_id(ctx: Ctx) -> Option<u64> {
    // SAFETY: ctx is a handle Redis gave the caller.
    optional_api!(RedisModule_GetClientId).map(|get| unsafe { get(ctx.0) })
}

/// Whether the calling client is blocked now (RM_BlockClient can refuse, for
/// example on Valkey for a timeout it finds out of range, or in contexts
/// that cannot block). Yes when it cannot be told.
pub fn client_is_blocked(ctx: Ctx) -> bool {
    let (Some(get_id), Some(get_info)) = (
        optional_api!(RedisModule_GetClientId),
        optional_api!(RedisModule_GetClientInfoById),
    ) else {
        return true;
    };
    let mut info = raw::RedisModuleClientInfo {
        version: 1,
        flags: 0,
        id: 0,
        addr: [0; 46],
        port: 0,
        db: 0,
    };
    // SAFETY: ctx is a handle Redis gave the caller.
    let id = unsafe { get_id(ctx.0) };
    // SAFETY: `info` is a version-1 RedisModuleClientInfo that Redis fills.
    let found = unsafe { get_info((&mut info as *mut raw::RedisModuleClientInfo).cast(), id) };
    found != raw::REDISMODULE_OK as c_int
        || info.flags & raw::REDISMODULE_CLIENTINFO_FLAG_BLOCKED as u64 != 0
}

/// The name of the user of client `id`; None where the server cannot tell
/// or the client is gone.
pub fn client_user_name(ctx: Ctx, id: u64) -> Option<OwnedString> {
    let user_name = optional_api!(RedisModule_GetClientUserNameById)?;
    // SAFETY: ctx is a handle Redis gave the caller.
    OwnedString::take(ctx, RString(unsafe { user_name(ctx.0, id) }))
}
