//! The keyspace scan the sweep walks with.

use super::*;

/// An RM_Scan cursor: created once and never destroyed (one per process).
pub struct ScanCursor(*mut raw::RedisModuleScanCursor);

// SAFETY: the cursor is a plain allocation of Redis's; it is created, used
// and restarted on Redis's main thread only (timer callbacks). Send is for
// keeping it in a Rust static behind a Mutex.
unsafe impl Send for ScanCursor {}

impl ScanCursor {
    pub fn create() -> Self {
        // SAFETY: takes no argument; returns a new cursor.
        ScanCursor(unsafe { api!(RedisModule_ScanCursorCreate)() })
    }

    /// Back to the start of a db.
    pub fn restart(&self) {
        // SAFETY: the cursor is ours, never destroyed.
        unsafe { api!(RedisModule_ScanCursorRestart)(self.0) };
    }

    /// One RM_Scan step in the selected db of `ctx`: `f` sees each key's
    /// name and its open key (None if it cannot be opened), both valid only
    /// during that call. True when there is more to scan.
    pub fn scan<F: FnMut(RString, Option<KeyRef<'_>>)>(&self, ctx: Ctx, mut f: F) -> bool {
        unsafe extern "C" fn each<F: FnMut(RString, Option<KeyRef<'_>>)>(
            _ctx: Ctx,
            name: RString,
            key: KeyPtr,
            data: *mut c_void,
        ) {
            // SAFETY: `data` is the `&mut F` that `scan` passed RM_Scan,
            // alive and not otherwise used while RM_Scan runs.
            let f = unsafe { &mut *data.cast::<F>() };
            // Open for this call (RM_Scan opened it and closes it after).
            let key = NonNull::new(key).map(|ptr| KeyRef {
                ptr,
                open: PhantomData,
            });
            f(name, key);
        }
        let each =
            raw_callback!(each::<F> as unsafe extern "C" fn(Ctx, RString, KeyPtr, *mut c_void));
        // SAFETY: ctx is a handle Redis gave the caller, the cursor is ours,
        // and `f` outlives the call (RM_Scan calls back only during it).
        let more =
            unsafe { api!(RedisModule_Scan)(ctx.0, self.0, each, (&mut f as *mut F).cast()) };
        more != 0
    }
}
