//! Reading a command's arguments as bytes, and the strings the module owns.

use std::mem::MaybeUninit;

use super::*;

/// One more than the longest argv of a command read through
/// [`Argv::bytes`] that names each of its options once (`LOCK.ACQUIRE key
/// token ttl SHARED LIMIT n BLOCK t MINFENCE n VALUE v`, 13, refused only
/// for VALUE with SHARED): longer argvs are cut here, and the cut argv is
/// still refused by the parsers (wrong arity, or an option word named
/// twice or unknown, within what is read), so no argument is ever silently
/// dropped and the error names a real problem. Raise it with any new
/// option. (Commands with any number of arguments read them all.)
pub const MAX_ARGS: usize = 14;

/// The command's arguments as byte slices borrowed from Redis's strings.
pub struct Argv<'a> {
    raw: &'a [RString],
    /// The first `len` are set; the rest never are (filling all of them
    /// cost every command as much as reading its arguments).
    bytes: [MaybeUninit<&'a [u8]>; MAX_ARGS],
    len: usize,
}

impl<'a> Argv<'a> {
    /// # Safety
    /// `argv` must point at `argc` valid strings that outlive `'a`.
    #[inline(always)] // built in the caller's frame: its array is not copied
    pub(super) unsafe fn new(argv: *mut RString, argc: c_int) -> Self {
        let raw: &[RString] = if argv.is_null() || argc <= 0 {
            &[]
        } else {
            // SAFETY: the caller's contract: `argc` strings at `argv`, alive
            // for `'a`.
            unsafe { std::slice::from_raw_parts(argv, argc as usize) }
        };
        let mut bytes = [MaybeUninit::uninit(); MAX_ARGS];
        let len = raw.len().min(MAX_ARGS);
        for (slot, s) in bytes.iter_mut().zip(raw) {
            // SAFETY: each string is valid for `'a` (the caller's contract).
            slot.write(unsafe { string_bytes(*s) });
        }
        Argv { raw, bytes, len }
    }

    pub fn bytes(&self) -> &[&'a [u8]] {
        // SAFETY: the first `len` slots were written in `new` (`len` is at
        // most both the argument count and the array's length), and
        // MaybeUninit<T> has T's layout.
        unsafe { std::slice::from_raw_parts(self.bytes.as_ptr().cast::<&'a [u8]>(), self.len) }
    }

    /// The key name (argv[1]); the parsers have checked arity before this
    /// is used.
    pub fn key(&self) -> RString {
        self.raw[1]
    }

    pub fn key_bytes(&self) -> &'a [u8] {
        self.bytes().get(1).copied().unwrap_or_default()
    }

    /// Every argument, also those past [`MAX_ARGS`] (a guarded command's).
    pub fn all(&self) -> &'a [RString] {
        self.raw
    }
}

/// The bytes of a Redis string, borrowed.
///
/// # Safety
/// `s` must be a valid RedisModuleString that outlives `'a` (and is not
/// changed meanwhile).
pub(super) unsafe fn string_bytes<'a>(s: RString) -> &'a [u8] {
    let mut len = 0usize;
    // SAFETY: `s` is a valid string (the caller's contract).
    let ptr = unsafe { api!(RedisModule_StringPtrLen)(s.0, &mut len) };
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: Redis returns the string's `len` bytes, which live as long as
    // the string does (the caller's contract).
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
}

/// A copy of the bytes of a Redis string the caller was given.
pub fn string_copy(s: RString) -> Box<[u8]> {
    // SAFETY: a string Redis gave the caller, valid during this call; the
    // bytes are copied before it returns.
    unsafe { string_bytes(s) }.into()
}

/// A Redis string the module owns, freed on drop.
pub struct OwnedString {
    ctx: Ctx,
    ptr: NonNull<raw::RedisModuleString>,
}

impl OwnedString {
    /// A new Redis string holding `bytes`.
    pub fn new(ctx: Ctx, bytes: &[u8]) -> Self {
        // SAFETY: ctx is a handle Redis gave the caller; Redis copies the
        // bytes and always returns a string.
        let ptr =
            unsafe { api!(RedisModule_CreateString)(ctx.0, bytes.as_ptr().cast(), bytes.len()) };
        OwnedString {
            ctx,
            ptr: NonNull::new(ptr).expect("RM_CreateString returns a string"),
        }
    }

    /// Takes a string Redis handed the module to free (a user name), if any.
    pub(super) fn take(ctx: Ctx, ptr: RString) -> Option<Self> {
        Some(OwnedString {
            ctx,
            ptr: NonNull::new(ptr.0)?,
        })
    }

    /// The string, for a call (valid while this lives).
    pub fn get(&self) -> RString {
        RString(self.ptr.as_ptr())
    }
}

impl Drop for OwnedString {
    fn drop(&mut self) {
        // SAFETY: a string this owns (created or handed over to be freed),
        // freed here once, with the context it was made with.
        unsafe { api!(RedisModule_FreeString)(self.ctx.0, self.ptr.as_ptr()) };
    }
}
