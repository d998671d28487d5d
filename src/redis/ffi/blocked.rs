//! Blocked clients: a waiter's client, answered later.

use super::*;

/// The callbacks of clients blocked with [`block_client`], and the data
/// they are unblocked with. Each callback runs in [`guard`].
pub trait Blocking {
    /// What a client is unblocked with ([`BlockedClient::unblock`]).
    type Data;
    /// The reply callback, after the client was unblocked: its data, if it
    /// was unblocked with some.
    fn on_reply(ctx: Ctx, data: Option<&mut Self::Data>);
    /// The timeout callback (also CLIENT UNBLOCK): `addr` is the address
    /// of its handle ([`BlockedClient::addr`]).
    fn on_timeout(ctx: Ctx, addr: usize);
    /// The client went away (or CLIENT UNBLOCK ... ERROR), while blocked.
    fn on_disconnect(addr: usize);
    /// The last word on an unblocked client's data.
    fn on_free(data: Box<Self::Data>);
}

/// A blocked client's handle, owned until it is unblocked: consumed by
/// [`BlockedClient::unblock`], so never unblocked twice.
pub struct BlockedClient<B: Blocking> {
    ptr: NonNull<raw::RedisModuleBlockedClient>,
    blocking: PhantomData<fn() -> B>,
}

// SAFETY: a handle is only passed back to Redis, on Redis's main thread
// (handles are created, kept and unblocked there); Send is for keeping it
// in a Rust static behind a Mutex.
unsafe impl<B: Blocking> Send for BlockedClient<B> {}

/// Blocks the calling client, with `B`'s callbacks and Redis's own timeout
/// `timeout_ms` (0: none). None if Redis gave no handle.
pub fn block_client<B: Blocking>(ctx: Ctx, timeout_ms: i64) -> Option<BlockedClient<B>> {
    let on_reply = raw_callback!(blocked_on_reply::<B> as BlockedFn);
    let on_timeout = raw_callback!(blocked_on_timeout::<B> as BlockedFn);
    let on_free = raw_callback!(blocked_free::<B> as unsafe extern "C" fn(Ctx, *mut c_void));
    // SAFETY: ctx is the running command's context; the callbacks expect
    // the data type `B::Data`, the only one `BlockedClient<B>::unblock`
    // hands Redis.
    let ptr =
        unsafe { api!(RedisModule_BlockClient)(ctx.0, on_reply, on_timeout, on_free, timeout_ms) };
    Some(BlockedClient {
        ptr: NonNull::new(ptr)?,
        blocking: PhantomData,
    })
}

impl<B: Blocking> BlockedClient<B> {
    /// The handle's address: how `B`'s callbacks name the handle (Redis
    /// reuses it once the handle is freed).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Has `B::on_disconnect` called if the client goes away while blocked
    /// (where the server has RM_SetDisconnectCallback).
    pub fn set_disconnect_callback(&self) {
        if let Some(set_disconnect) = optional_api!(RedisModule_SetDisconnectCallback) {
            let callback = raw_callback!(
                blocked_on_disconnect::<B>
                    as unsafe extern "C" fn(Ctx, *mut raw::RedisModuleBlockedClient)
            );
            // SAFETY: a handle not yet unblocked (this owns it).
            unsafe { set_disconnect(self.ptr.as_ptr(), callback) };
        }
    }

    /// The one RM_UnblockClient of this handle: Redis frees the handle (and
    /// the two temporary clients it holds) only then, also after a
    /// disconnect. `data` goes to `B::on_reply`, then `B::on_free`.
    pub fn unblock(self, data: Option<Box<B::Data>>) {
        let data = data.map_or(std::ptr::null_mut(), Box::into_raw);
        // SAFETY: the handle came from RM_BlockClient and, being consumed
        // here (not dropped: see below), is unblocked exactly once; `data`
        // is NULL or a Box<B::Data> that Redis hands back to
        // `blocked_free::<B>`.
        unsafe { api!(RedisModule_UnblockClient)(self.ptr.as_ptr(), data.cast()) };
        std::mem::forget(self);
    }
}

/// A handle dropped without [`unblock`](BlockedClient::unblock) (a panic
/// on the way, a map cleared) is unblocked with no data, as Redis requires
/// of every blocked client: the client is answered by its reply callback
/// with nothing to deliver, and the handle is not leaked.
impl<B: Blocking> Drop for BlockedClient<B> {
    fn drop(&mut self) {
        // SAFETY: the handle came from RM_BlockClient and was not unblocked
        // (`unblock` forgets it), so this is its one RM_UnblockClient.
        unsafe { api!(RedisModule_UnblockClient)(self.ptr.as_ptr(), std::ptr::null_mut()) };
    }
}

pub(super) unsafe extern "C" fn blocked_on_reply<B: Blocking>(
    ctx: Ctx,
    _argv: *mut RString,
    _argc: c_int,
) -> c_int {
    guard("the blocked-client reply", (), || {
        // SAFETY: ctx is the reply callback's context; its private data is
        // NULL or the Box<B::Data> it was unblocked with (`unblock`), owned
        // by Redis until `blocked_free`, and not otherwise used meanwhile.
        let data = unsafe {
            api!(RedisModule_GetBlockedClientPrivateData)(ctx.0)
                .cast::<B::Data>()
                .as_mut()
        };
        B::on_reply(ctx, data);
    });
    raw::REDISMODULE_OK as c_int
}

pub(super) unsafe extern "C" fn blocked_on_timeout<B: Blocking>(
    ctx: Ctx,
    _argv: *mut RString,
    _argc: c_int,
) -> c_int {
    guard("the blocked-client timeout", (), || {
        // SAFETY: ctx is the timeout callback's context.
        let client = unsafe { api!(RedisModule_GetBlockedClientHandle)(ctx.0) } as usize;
        B::on_timeout(ctx, client);
    });
    raw::REDISMODULE_OK as c_int
}

pub(super) unsafe extern "C" fn blocked_on_disconnect<B: Blocking>(
    _ctx: Ctx,
    client: *mut raw::RedisModuleBlockedClient,
) {
    guard("the blocked-client disconnect", (), || {
        B::on_disconnect(client as usize)
    })
}

pub(super) unsafe extern "C" fn blocked_free<B: Blocking>(_ctx: Ctx, data: *mut c_void) {
    guard("the blocked-client cleanup", (), || {
        if data.is_null() {
            return;
        }
        // SAFETY: `data` is the Box<B::Data> handed to RM_UnblockClient
        // (`unblock`), and Redis calls this once for it.
        B::on_free(unsafe { Box::from_raw(data.cast::<B::Data>()) });
    })
}
