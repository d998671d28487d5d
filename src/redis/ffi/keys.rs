//! Opening, reading and writing keys.

use super::*;

/// How a key is open: [`Read`] or [`Write`].
pub trait Mode {
    /// RM_OpenKey's mode.
    const FLAGS: c_int;
}

/// Opened for reading only.
pub struct Read;
/// Opened for reading and writing.
pub struct Write;

impl Mode for Read {
    const FLAGS: c_int = raw::REDISMODULE_READ as c_int;
}

impl Mode for Write {
    const FLAGS: c_int = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
}

/// A key opened with RM_OpenKey in the selected db, closed on drop. Only
/// one opened for [`Write`] can be changed: the type says which, so no
/// safe code can hand Redis a key it may not write, or one that is closed.
pub struct OpenKey<M: Mode> {
    ptr: NonNull<raw::RedisModuleKey>,
    mode: PhantomData<M>,
}

impl<M: Mode> OpenKey<M> {
    /// Opens `name`. None when Redis gives no handle: for [`Read`], a key
    /// that does not exist (a [`Write`] open of a missing key gets one).
    pub fn open(ctx: Ctx, name: RString) -> Option<Self> {
        // SAFETY: ctx and name are handles Redis gave the caller.
        let ptr = unsafe { api!(RedisModule_OpenKey)(ctx.0, name.0, M::FLAGS) };
        Some(OpenKey {
            ptr: NonNull::new(ptr)?,
            mode: PhantomData,
        })
    }

    /// The open key, to read.
    pub fn key(&self) -> KeyRef<'_> {
        KeyRef {
            ptr: self.ptr,
            open: PhantomData,
        }
    }
}

impl<M: Mode> Drop for OpenKey<M> {
    fn drop(&mut self) {
        // SAFETY: opened by `open` and closed only here, once.
        unsafe { api!(RedisModule_CloseKey)(self.ptr.as_ptr()) };
    }
}

impl OpenKey<Write> {
    /// The raw handle of a key open for writing, for the data type's
    /// RM_ModuleTypeSetValue (`datatype::store`).
    pub fn writable_ptr(&self) -> KeyPtr {
        self.ptr.as_ptr()
    }

    /// Deletes the key's value.
    pub fn delete(&self) {
        // SAFETY: a key open for writing (the type), alive (self).
        unsafe { api!(RedisModule_DeleteKey)(self.ptr.as_ptr()) };
    }

    /// Sets (or with REDISMODULE_NO_EXPIRE, drops) the key's Redis expiry,
    /// `ms` from now.
    pub fn set_expire(&self, ms: i64) {
        // SAFETY: a key open for writing (the type), alive (self).
        unsafe { api!(RedisModule_SetExpire)(self.ptr.as_ptr(), ms) };
    }
}

/// A key open for as long as `'a`: borrowed from an [`OpenKey`], or lent to
/// a scan callback by Redis. Made only here, so it always is open.
#[derive(Clone, Copy)]
pub struct KeyRef<'a> {
    pub(super) ptr: NonNull<raw::RedisModuleKey>,
    pub(super) open: PhantomData<&'a ()>,
}

impl KeyRef<'_> {
    /// The key's type (REDISMODULE_KEYTYPE_*).
    pub fn key_type(self) -> c_int {
        // SAFETY: an open key (the type's guarantee).
        unsafe { api!(RedisModule_KeyType)(self.ptr.as_ptr()) }
    }

    /// The module type of a key holding a module value.
    pub fn module_type(self) -> *mut raw::RedisModuleType {
        // SAFETY: an open key (the type's guarantee).
        unsafe { api!(RedisModule_ModuleTypeGetType)(self.ptr.as_ptr()) }
    }

    /// The value of a key holding a module value (only a pointer: what it
    /// points at is the data type's business).
    pub fn module_value(self) -> *mut c_void {
        // SAFETY: an open key (the type's guarantee).
        unsafe { api!(RedisModule_ModuleTypeGetValue)(self.ptr.as_ptr()) }
    }

    /// The key's Redis expiry (Unix ms), negative when it has none.
    pub fn abs_expire(self) -> i64 {
        // SAFETY: an open key (the type's guarantee).
        unsafe { api!(RedisModule_GetAbsExpire)(self.ptr.as_ptr()) }
    }
}

/// Whether `name` exists in the selected db.
pub fn key_exists(ctx: Ctx, name: RString) -> bool {
    OpenKey::<Read>::open(ctx, name)
        .is_some_and(|k| k.key().key_type() != raw::REDISMODULE_KEYTYPE_EMPTY as c_int)
}

/// Signals `name` as modified (WATCH, client-side caching).
pub fn signal_modified_key(ctx: Ctx, name: RString) {
    // SAFETY: ctx and name are handles Redis gave the caller.
    unsafe { api!(RedisModule_SignalModifiedKey)(ctx.0, name.0) };
}

/// The key an unlink2 callback is about: (db, name).
pub fn unlinked_key(opt: KeyOpt) -> (i32, Box<[u8]>) {
    let opt = opt.0;
    // SAFETY: `opt` is the option context Redis gave the callback.
    let name = unsafe { api!(RedisModule_GetKeyNameFromOptCtx)(opt) };
    // SAFETY: as above.
    let db = unsafe { api!(RedisModule_GetDbIdFromOptCtx)(opt) };
    (db, string_copy(RString(name.cast_mut())))
}
