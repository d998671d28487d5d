//! The `redislock` data type and its persistence format.
//!
//! ## RDB value, encoding version 3
//! | field       | RDB call            | meaning                              |
//! |-------------|---------------------|--------------------------------------|
//! | mode        | SaveSigned          | 0 exclusive, -1 shared, n ≥ 1 shared with LIMIT n |
//! | count       | SaveSigned          | holders that follow: 1 when exclusive, 1 to 2^20 when shared |
//!
//! then, for each holder (distinct tokens):
//!
//! | field       | RDB call            | meaning                              |
//! |-------------|---------------------|--------------------------------------|
//! | token       | SaveStringBuffer    | holder token, 1–512 bytes            |
//! | fence       | SaveSigned          | fencing token of this grant, > 0     |
//! | deadline_ms | SaveSigned          | absolute end of the lease, Unix ms (wall clock) |
//! | granted_ms  | SaveSigned          | when this holder was granted, Unix ms (0 ≤ it ≤ deadline_ms; 0: unknown) |
//!
//! Both times are converted from the monotonic clock at one instant when
//! written (`core::time::wall_times`). A grant time after the deadline (an
//! earlier build could write one after a wall-clock step) loads as unknown.
//!
//! Version 2 (earlier builds) is one holder's four fields alone, version 1
//! the same without `granted_ms`; both still load (exclusive, the grant
//! time of version 1 unknown). An RDB written by this build does not load
//! into an earlier one (Redis refuses the newer encoding version).
//!
//! ## RDB aux field (before the keyspace), encoding version 3 (as 1 and 2)
//! | fence_hwm   | SaveSigned          | the node's fence high-water mark     |
//!
//! Loading (`core::codec::decode_value`, the same decoder the fuzzer runs)
//! refuses encoding versions newer than this build knows, short reads (the
//! module declares HANDLE_IO_ERRORS, so a damaged RDB, AOF preamble,
//! diskless sync or `RESTORE` payload is refused, not a crash), and values
//! that break the invariants above or carry a fence beyond
//! `core::limits::MAX_FENCE_LEAD` above the node's mark and clock (for a
//! `RESTORE`, above the clock alone), rather than guessing. A loaded RDB's
//! mark comes from its aux field; a `RESTORE`d value raises the mark with
//! its own fence once decoded whole.
//!
//! ## In memory
//! An exclusive lock is one allocation, the token inline (see [`LockBlock`]), its
//! deadline and grant time on the node's monotonic clock (converted from
//! and to the wall clock, both at one instant, when loaded and saved: see
//! `core::time`), plus a lease id that is not persisted (see
//! `core::lock::Lock::lease`). A shared lock is a [`SharedBlock`]: its
//! mode and a vector of holders; the first word tells the two apart. The
//! key has no Redis expiry.
//!
//! ## AOF rewrite
//! An exclusive lock is written as `LOCK._SET key token fence deadline-ms
//! granted-ms`, a shared one as `LOCK._SHARED key limit token fence
//! deadline-ms granted-ms ...` (every holder), the same effects the master
//! replicates, so an AOF without an RDB preamble restores both the locks
//! and (through their fences) the high-water mark.

use std::alloc::{handle_alloc_error, Layout};
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};

use redis_module::raw;

use super::engine;
use super::ffi::{
    self, api, context_flags, guard, log_warning, raw_callback, Ctx, KeyRef, OpenKey, Write,
};
use super::server::{self, STATS};
use crate::core::args;
use crate::core::codec::{self, Truncated, ValueReader};
use crate::core::error::LockError;
use crate::core::protocol::command;
use crate::core::time;
use crate::core::{Lock, LockRead, Mode};

/// The type's unlink2 callback: a lock key left the keyspace.
pub use super::ffi::UnlinkFn;

/// Native type names are exactly 9 characters.
pub const TYPE_NAME: &std::ffi::CStr = c"redislock";
pub const ENCODING_VERSION: i32 = codec::ENCODING_VERSION;

pub struct LockType(AtomicPtr<raw::RedisModuleType>);

impl LockType {
    pub fn get(&self) -> *mut raw::RedisModuleType {
        self.0.load(Relaxed)
    }
}

pub static LOCK_TYPE: LockType = LockType(AtomicPtr::new(std::ptr::null_mut()));

pub fn register(ctx: Ctx, on_unlink: UnlinkFn) -> Result<(), &'static str> {
    let mut methods = raw::RedisModuleTypeMethods {
        // Version 4 (Redis 7.0) has aux fields and unlink2.
        version: 4,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as c_int,
        free_effort: None,
        unlink: None,
        copy: None,
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: raw_callback!(on_unlink),
        copy2: None,
        aux_save2: None,
    };
    // SAFETY: the API table is filled in before any module code runs and
    // never written again (see `ffi`).
    let create = unsafe { raw::RedisModule_CreateDataType }
        .ok_or("RedisModule_CreateDataType is not available")?;
    // SAFETY: ctx is the load context Redis gave `module::start`; the name
    // is 9 characters, NUL-terminated; Redis copies the methods, whose
    // callbacks are the functions of this file.
    let t = unsafe {
        create(
            ctx.as_ptr(),
            TYPE_NAME.as_ptr(),
            ENCODING_VERSION,
            &mut methods,
        )
    };
    if t.is_null() {
        return Err("could not create the redislock data type");
    }
    LOCK_TYPE.0.store(t, Relaxed);
    Ok(())
}

/// A lock as the keyspace stores it: one allocation holding
/// `fence | deadline_ms + lease | granted_ms | token length | token bytes`,
/// so a grant costs one allocation (a 36-byte token: a 64-byte block, the
/// allocator's 64-byte class: smaller, with no Redis expiry entry, than a
/// `SET NX PX` key of the same token). Always handled through raw pointers:
/// the token lies past the struct. Outside this file a block is seen only
/// through a [`LockValue`].
#[repr(C)]
pub struct LockBlock {
    fence: i64,
    /// The deadline (monotonic ms, 40 bits: 34 years of uptime) and the
    /// low 24 bits of the lease id (see [`pack`]).
    deadline_and_lease: u64,
    /// Monotonic ms, or [`GRANT_UNKNOWN`].
    granted_ms: i64,
    /// The token's length, and [`FROM_OUTSIDE`].
    len: u32,
    token: [u8; 0],
}

/// A `len` bit: the value came from outside (an RDB, a `RESTORE`, the
/// master's or the AOF's `LOCK._SET`) and this build has not yet looked at
/// its key's Redis expiry. Only such a value can carry an earlier build's
/// expiry (one equal to its lease's end, dropped when this build first
/// renews or sweeps it): an expiry on a lock this node granted is always a
/// user's administrative delete. Not persisted.
const FROM_OUTSIDE: u32 = 1 << 31;

const TOKEN_OFFSET: usize = std::mem::offset_of!(LockBlock, token);

/// A block's grant time when it is unknown (`Lock::granted_ms` is None).
const GRANT_UNKNOWN: i64 = i64::MIN;

/// How many low bits of a lease id a block keeps. A take-back (the one use
/// of lease ids) matches the fence too and runs at the next timer tick
/// after its grant: confusing a renewal with the grant would take 16
/// million grants and renewals node-wide in between.
const LEASE_BITS: u32 = 24;
const LEASE_MASK: u64 = (1 << LEASE_BITS) - 1;
const DEADLINE_MAX: i64 = (1 << (64 - LEASE_BITS)) - 1;

/// A deadline on the monotonic clock (an ended one may be negative: kept
/// as 0, still ended) and a lease id, in one word.
fn pack(deadline_ms: i64, lease: u64) -> u64 {
    ((deadline_ms.clamp(0, DEADLINE_MAX) as u64) << LEASE_BITS) | (lease & LEASE_MASK)
}

fn unpack(word: u64) -> (i64, u64) {
    ((word >> LEASE_BITS) as i64, word & LEASE_MASK)
}

impl LockBlock {
    /// Allocates a block for the keyspace (freed by the type's `free`).
    /// Straight from RM_Alloc (Redis's allocator, 16-byte aligned, counted
    /// in used_memory): Rust's global allocator would reach the same place
    /// through two more calls on every grant.
    fn new(lock: Lock<'_>, from_outside: bool) -> NonNull<LockBlock> {
        let size = TOKEN_OFFSET + lock.token.len();
        // SAFETY: a plain allocation of `size` bytes.
        let block = unsafe { api!(RedisModule_Alloc)(size) }.cast::<LockBlock>();
        let Some(block) = NonNull::new(block) else {
            // SAFETY: 8 is a power of two, and `size` (at most a few hundred
            // bytes: the token is bounded) does not overflow when rounded up.
            handle_alloc_error(unsafe { Layout::from_size_align_unchecked(size, 8) });
        };
        let ptr = block.as_ptr();
        // SAFETY: `ptr` is a fresh allocation of TOKEN_OFFSET + token length
        // bytes, aligned for LockBlock (RM_Alloc aligns to 16): the header
        // fields and the token bytes right past them are in bounds, and
        // nothing else sees the block yet.
        unsafe {
            (*ptr).fence = lock.fence;
            (*ptr).deadline_and_lease = pack(lock.deadline_ms, lock.lease);
            (*ptr).granted_ms = lock.granted_ms.unwrap_or(GRANT_UNKNOWN);
            (*ptr).len = lock.token.len() as u32 | if from_outside { FROM_OUTSIDE } else { 0 };
            let token = ptr.cast::<u8>().add(TOKEN_OFFSET);
            std::ptr::copy_nonoverlapping(lock.token.as_ptr(), token, lock.token.len());
        }
        STATS.locks.fetch_add(1, Relaxed);
        block
    }

    /// # Safety
    /// `block` comes from [`LockBlock::new`] and is neither freed nor
    /// written during `'a`.
    unsafe fn view<'a>(block: *const LockBlock) -> Lock<'a> {
        // SAFETY: a live block (the caller's contract), whose `len` token
        // bytes lie right past the header, unchanged during `'a`.
        unsafe {
            let token = block.cast::<u8>().add(TOKEN_OFFSET);
            let (deadline_ms, lease) = unpack((*block).deadline_and_lease);
            Lock {
                fence: (*block).fence,
                deadline_ms,
                token: std::slice::from_raw_parts(token, ((*block).len & !FROM_OUTSIDE) as usize),
                granted_ms: Some((*block).granted_ms).filter(|&g| g != GRANT_UNKNOWN),
                lease,
            }
        }
    }

    /// # Safety
    /// `block` comes from [`LockBlock::new`], is not freed, and no view of
    /// it is in use.
    unsafe fn set(
        block: *mut LockBlock,
        fence: i64,
        deadline_ms: i64,
        granted_ms: Option<i64>,
        lease: u64,
    ) {
        // SAFETY: a live block, not borrowed (the caller's contract); the
        // token is left as it is.
        unsafe {
            (*block).fence = fence;
            (*block).deadline_and_lease = pack(deadline_ms, lease);
            (*block).granted_ms = granted_ms.unwrap_or(GRANT_UNKNOWN);
        }
    }

    /// The holder's token alone (an EXTEND compares only that).
    ///
    /// # Safety
    /// As [`LockBlock::view`].
    unsafe fn token<'a>(block: *const LockBlock) -> &'a [u8] {
        // SAFETY: as `view` (the caller's contract).
        unsafe {
            let token = block.cast::<u8>().add(TOKEN_OFFSET);
            std::slice::from_raw_parts(token, ((*block).len & !FROM_OUTSIDE) as usize)
        }
    }

    /// A new deadline and lease id; the fence and grant time stay.
    ///
    /// # Safety
    /// As [`LockBlock::set`].
    unsafe fn renew(block: *mut LockBlock, deadline_ms: i64, lease: u64) {
        // SAFETY: a live block, not borrowed (the caller's contract).
        unsafe { (*block).deadline_and_lease = pack(deadline_ms, lease) }
    }

    /// # Safety
    /// `block` comes from [`LockBlock::new`] and is not freed.
    unsafe fn is_from_outside(block: *const LockBlock) -> bool {
        // SAFETY: a live block (the caller's contract).
        unsafe { (*block).len & FROM_OUTSIDE != 0 }
    }

    /// # Safety
    /// `block` comes from [`LockBlock::new`], is not freed, and no view of
    /// it is in use.
    unsafe fn set_from_outside(block: *mut LockBlock, on: bool) {
        // SAFETY: a live block, not borrowed (the caller's contract).
        unsafe {
            match on {
                true => (*block).len |= FROM_OUTSIDE,
                false => (*block).len &= !FROM_OUTSIDE,
            }
        }
    }

    /// # Safety
    /// `block` comes from [`LockBlock::new`] and is not used afterwards.
    unsafe fn free(block: *mut LockBlock) {
        // SAFETY: an RM_Alloc allocation (the caller's contract), freed once.
        unsafe { api!(RedisModule_Free)(block.cast()) };
        STATS.locks.fetch_sub(1, Relaxed);
    }

    fn size(lock: Lock<'_>) -> usize {
        TOKEN_OFFSET + lock.token.len()
    }
}

/// What a shared block has where an exclusive one has its fence (which
/// is always ≥ 1): the first word of a value says which it is.
const SHARED_TAG: i64 = i64::MIN;

/// A shared lock as the keyspace stores it: its mode and its holders, in
/// grant order, each with its own token. Allocated by Rust's allocator
/// (the module's is Redis's, so it counts in used_memory); freed by the
/// type's `free`.
#[repr(C)]
pub struct SharedBlock {
    /// Always [`SHARED_TAG`]; first, as an exclusive block's fence is.
    tag: i64,
    mode: Mode,
    holders: Vec<Holder>,
}

/// One holder of a shared lock.
struct Holder {
    token: Box<[u8]>,
    fence: i64,
    deadline_ms: i64,
    granted_ms: Option<i64>,
    lease: u64,
}

impl Holder {
    fn of(lock: Lock<'_>) -> Holder {
        Holder {
            token: lock.token.into(),
            fence: lock.fence,
            deadline_ms: lock.deadline_ms,
            granted_ms: lock.granted_ms,
            lease: lock.lease,
        }
    }

    fn view(&self) -> Lock<'_> {
        Lock {
            fence: self.fence,
            deadline_ms: self.deadline_ms,
            token: &self.token,
            granted_ms: self.granted_ms,
            lease: self.lease,
        }
    }
}

impl SharedBlock {
    fn new(mode: Mode, holders: Vec<Holder>) -> NonNull<SharedBlock> {
        STATS.locks.fetch_add(holders.len() as i64, Relaxed);
        let block = Box::new(SharedBlock {
            tag: SHARED_TAG,
            mode,
            holders,
        });
        NonNull::from(Box::leak(block))
    }

    fn size(&self) -> usize {
        std::mem::size_of::<SharedBlock>()
            + self.holders.capacity() * std::mem::size_of::<Holder>()
            + self.holders.iter().map(|h| h.token.len()).sum::<usize>()
    }
}

/// Whether a value of this type is a [`SharedBlock`].
///
/// # Safety
/// `value` is a live value of this type (a block of this file).
unsafe fn is_shared(value: *const c_void) -> bool {
    // SAFETY: both kinds of block start with an i64 (the caller's
    // contract that it is one of them).
    unsafe { *value.cast::<i64>() == SHARED_TAG }
}

/// A lock in the keyspace: the value an open key holds, found by
/// [`value_of`] or put there by [`store`] or [`store_shared`] (nothing
/// else makes one).
///
/// Valid while that key stays open and keeps this value: the holder drops
/// it before the key is closed, and when the key's value is deleted or
/// replaced (`keyspace::LockKey` does; the sweep uses one only inside the
/// scan callback that found it). Everything runs on Redis's main thread,
/// except `free` (lazy-free threads), which only sees values that left the
/// keyspace.
pub enum LockValue {
    Exclusive(NonNull<LockBlock>),
    Shared(NonNull<SharedBlock>),
}

// A value seen where it lies (the sweep's scan): read as a store.
impl LockRead for LockValue {
    fn mode(&self) -> Option<Mode> {
        Some(LockValue::mode(self))
    }
    fn holder_at(&self, i: usize) -> Option<Lock<'_>> {
        LockValue::holder_at(self, i)
    }
}

impl LockValue {
    /// # Safety
    /// `value` is a live value of this type.
    unsafe fn of(value: NonNull<c_void>) -> LockValue {
        // SAFETY: the caller's contract.
        match unsafe { is_shared(value.as_ptr()) } {
            true => LockValue::Shared(value.cast()),
            false => LockValue::Exclusive(value.cast()),
        }
    }

    fn shared(&self) -> Option<&SharedBlock> {
        match self {
            // SAFETY: the block is live while this value is (see the
            // type's doc), and written only through `&mut self`.
            LockValue::Shared(block) => Some(unsafe { block.as_ref() }),
            LockValue::Exclusive(_) => None,
        }
    }

    fn shared_mut(&mut self) -> Option<&mut SharedBlock> {
        match self {
            // SAFETY: as `shared`, and `&mut self` means no other view.
            LockValue::Shared(block) => Some(unsafe { block.as_mut() }),
            LockValue::Exclusive(_) => None,
        }
    }

    /// The key's mode.
    pub fn mode(&self) -> Mode {
        self.shared().map_or(Mode::Exclusive, |b| b.mode)
    }

    /// The `i`-th holder (in grant order).
    pub fn holder_at(&self, i: usize) -> Option<Lock<'_>> {
        match (self.shared(), i) {
            (Some(block), _) => block.holders.get(i).map(Holder::view),
            (None, 0) => self.exclusive(),
            (None, _) => None,
        }
    }

    /// The lock, borrowed from the block, when it is exclusive.
    pub fn exclusive(&self) -> Option<Lock<'_>> {
        match self {
            // SAFETY: the block is live while this value is (see the
            // type's doc), and `set` needs `&mut self`, so it is not
            // written meanwhile.
            LockValue::Exclusive(block) => Some(unsafe { LockBlock::view(block.as_ptr()) }),
            LockValue::Shared(_) => None,
        }
    }

    /// Updates an exclusive lock in place (same token, no allocation).
    pub fn set(&mut self, fence: i64, deadline_ms: i64, granted_ms: Option<i64>, lease: u64) {
        if let LockValue::Exclusive(block) = self {
            // SAFETY: the block is live (see the type's doc), and `&mut
            // self` means no view of it is in use.
            unsafe { LockBlock::set(block.as_ptr(), fence, deadline_ms, granted_ms, lease) }
        }
    }

    /// A shared lock gets `lock` as one more holder, or as the new state
    /// of the holder with its token.
    pub fn add(&mut self, lock: Lock<'_>) {
        let Some(block) = self.shared_mut() else {
            return;
        };
        match block.holders.iter_mut().find(|h| *h.token == *lock.token) {
            Some(h) => *h = Holder::of(lock),
            None => {
                block.holders.push(Holder::of(lock));
                STATS.locks.fetch_add(1, Relaxed);
            }
        }
    }

    /// Whether `token` is a holder of this lock (its one holder, when
    /// exclusive), whatever its lease.
    pub fn has_holder(&self, token: &[u8]) -> bool {
        match self {
            // SAFETY: the block is live while this value is (see the
            // type's doc), and not written meanwhile (`&self`).
            LockValue::Exclusive(block) => unsafe { LockBlock::token(block.as_ptr()) == token },
            LockValue::Shared(_) => self
                .shared()
                .is_some_and(|b| b.holders.iter().any(|h| *h.token == *token)),
        }
    }

    /// The holder of `token` gets a new deadline and lease id; its fence
    /// and grant time stay. An exclusive lock's one holder is renewed
    /// without another look at its token: the caller found it holding.
    pub fn renew(&mut self, token: &[u8], deadline_ms: i64, lease: u64) {
        match self {
            // SAFETY: the block is live (see the type's doc), and `&mut
            // self` means no view of it is in use.
            LockValue::Exclusive(block) => unsafe {
                LockBlock::renew(block.as_ptr(), deadline_ms, lease)
            },
            LockValue::Shared(_) => {
                let holder = self
                    .shared_mut()
                    .and_then(|b| b.holders.iter_mut().find(|h| *h.token == *token));
                if let Some(h) = holder {
                    h.deadline_ms = deadline_ms;
                    h.lease = lease;
                }
            }
        }
    }

    /// Removes the holder of `token` from a shared lock; how many are left.
    pub fn remove_shared(&mut self, token: &[u8]) -> usize {
        let Some(block) = self.shared_mut() else {
            return 0;
        };
        let before = block.holders.len();
        block.holders.retain(|h| *h.token != *token);
        STATS
            .locks
            .fetch_sub((before - block.holders.len()) as i64, Relaxed);
        block.holders.len()
    }

    /// A shared lock's limit changes (none does but by the next grant of
    /// an empty key; kept whole).
    pub fn set_shared_mode(&mut self, mode: Mode) {
        if let Some(block) = self.shared_mut() {
            block.mode = mode;
        }
    }

    /// Whether the value came from outside and its key's expiry was not
    /// yet looked at (see [`FROM_OUTSIDE`]; never a shared lock: no
    /// earlier build wrote one).
    pub fn is_from_outside(&self) -> bool {
        match self {
            // SAFETY: the block is live (see the type's doc).
            LockValue::Exclusive(block) => unsafe { LockBlock::is_from_outside(block.as_ptr()) },
            LockValue::Shared(_) => false,
        }
    }

    /// Marks the value as from outside (true) or its expiry as looked at.
    pub fn set_from_outside(&mut self, on: bool) {
        if let LockValue::Exclusive(block) = self {
            // SAFETY: the block is live (see the type's doc), and `&mut
            // self` means no view of it is in use.
            unsafe { LockBlock::set_from_outside(block.as_ptr(), on) }
        }
    }
}

/// The lock stored at an open key: None for an empty key, WRONGTYPE for a
/// key of another type.
pub fn value_of(key: KeyRef<'_>) -> Result<Option<LockValue>, LockError> {
    let key_type = key.key_type() as isize;
    if key_type == raw::REDISMODULE_KEYTYPE_EMPTY {
        return Ok(None);
    }
    let ours = key_type == raw::REDISMODULE_KEYTYPE_MODULE && key.module_type() == LOCK_TYPE.get();
    if !ours {
        return Err(LockError::WrongType);
    }
    // Our type: the value is a block of this file (`store`, `store_shared`,
    // `rdb_load`).
    // SAFETY: a live value of this type, as just checked.
    Ok(NonNull::new(key.module_value()).map(|v| unsafe { LockValue::of(v) }))
}

/// Stores `lock` as the value of `key`, in a new block; the value it
/// replaces, if any, is freed by Redis (through `free`).
pub fn store(key: &OpenKey<Write>, lock: Lock<'_>, from_outside: bool) -> LockValue {
    let block = LockBlock::new(lock, from_outside);
    set_value(key, block.as_ptr().cast());
    LockValue::Exclusive(block)
}

/// Stores a shared lock with `holders` as the value of `key` (as
/// [`store`]).
pub fn store_shared<'a>(
    key: &OpenKey<Write>,
    mode: Mode,
    holders: impl Iterator<Item = Lock<'a>>,
) -> LockValue {
    let block = SharedBlock::new(mode, holders.map(Holder::of).collect());
    set_value(key, block.as_ptr().cast());
    LockValue::Shared(block)
}

fn set_value(key: &OpenKey<Write>, value: *mut c_void) {
    // SAFETY: `key` is open for writing (its type) while borrowed here; the
    // new block goes to the keyspace, which frees it through this type's
    // `free`.
    unsafe { api!(RedisModule_ModuleTypeSetValue)(key.writable_ptr(), LOCK_TYPE.get(), value) };
}

/// A holder as written out: token, fence, deadline, grant time.
type Written<'a> = (&'a [u8], i64, i64, i64);

/// Every holder of a value of this type, as written out: (token, fence,
/// deadline, grant time), both times Unix ms converted at one instant.
///
/// # Safety
/// `value` is a live value of this type, unchanged during `'a`.
unsafe fn written_holders<'a>(value: *const c_void) -> (Mode, Vec<Written<'a>>) {
    let now = server::conversion_now();
    let out = |l: Lock<'a>| {
        let (deadline_ms, granted_ms) = time::wall_times(l.deadline_ms, l.granted_ms, now);
        (l.token, l.fence, deadline_ms, granted_ms)
    };
    // SAFETY: the caller's contract.
    unsafe {
        match is_shared(value) {
            true => {
                let block = &*value.cast::<SharedBlock>();
                (
                    block.mode,
                    block.holders.iter().map(|h| out(h.view())).collect(),
                )
            }
            false => (Mode::Exclusive, vec![out(LockBlock::view(value.cast()))]),
        }
    }
}

/// Frees a value Redis is done with. Only frees: it may run on a lazy-free
/// thread, long after the lock left the keyspace (what the lock's end
/// means was reported where it ended: `keyspace`).
extern "C" fn free(value: *mut c_void) {
    guard("free", (), || {
        if value.is_null() {
            return;
        }
        // SAFETY: Redis hands back a value of this type (a block of this
        // file) once, when it is done with it.
        unsafe {
            if is_shared(value) {
                let block = Box::from_raw(value.cast::<SharedBlock>());
                STATS.locks.fetch_sub(block.holders.len() as i64, Relaxed);
            } else {
                LockBlock::free(value.cast());
            }
        }
    })
}

extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard("rdb_save", (), || {
        // SAFETY: Redis passes a value of this type, alive and unchanged
        // during the callback.
        let (mode, holders) = unsafe { written_holders(value) };
        // SAFETY: `rdb` is the IO context Redis gave this callback; Redis
        // copies the token bytes.
        unsafe {
            api!(RedisModule_SaveSigned)(rdb, codec::mode_word(mode));
            api!(RedisModule_SaveSigned)(rdb, holders.len() as i64);
            for (token, fence, deadline_ms, granted_ms) in holders {
                api!(RedisModule_SaveStringBuffer)(rdb, token.as_ptr().cast(), token.len());
                api!(RedisModule_SaveSigned)(rdb, fence);
                api!(RedisModule_SaveSigned)(rdb, deadline_ms);
                api!(RedisModule_SaveSigned)(rdb, granted_ms);
            }
        }
    })
}

extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard("rdb_load", std::ptr::null_mut(), || {
        // RESTORE (and MIGRATE's RESTORE-ASKING) runs outside loading: its
        // fence is also bounded by the clock (see codec::check_restored_fence).
        let loading = raw::REDISMODULE_CTX_FLAGS_LOADING | raw::REDISMODULE_CTX_FLAGS_ASYNC_LOADING;
        // SAFETY: `rdb` is the IO context Redis gave this callback.
        let io_ctx = unsafe { Ctx::from_raw(api!(RedisModule_GetContextFromIO)(rdb)) };
        let restoring = context_flags(io_ctx) & loading == 0;
        let now = server::conversion_now();
        let decoded = codec::decode_value(encver, &mut Io(rdb), |fence| {
            engine::with_engine(|n| n.check_loaded_fence(fence, restoring, now.wall_us))
        });
        // Taken by the node (a RESTOREd value raises the mark now, once
        // decoded whole; a loaded RDB's mark comes in its aux field), its
        // times on this node's clock. Nothing is allocated for the keyspace
        // until the value is valid and taken.
        let accepted = decoded.and_then(|value| {
            let times: Vec<(i64, i64, i64)> = value
                .holders
                .iter()
                .map(|h| (h.fence, h.deadline_ms, h.granted_ms))
                .collect();
            let loaded = engine::with_engine(|n| n.accept_value(&times, restoring, now))
                .map_err(|(fence, e)| codec::DecodeError::Fence(fence, e))?;
            Ok((
                value.mode,
                value.holders.into_iter().zip(loaded).collect::<Vec<_>>(),
            ))
        });
        let (mode, holders) = match accepted {
            Ok(taken) => taken,
            Err(why) => {
                log_warning(&format!("lock: refusing to load a lock value: {why}"));
                return std::ptr::null_mut();
            }
        };
        let locks = holders.iter().map(|(h, loaded)| Lock {
            fence: h.fence,
            deadline_ms: loaded.deadline_ms,
            token: h.token.as_ref(),
            granted_ms: loaded.granted_ms,
            lease: loaded.lease,
        });
        match mode {
            Mode::Exclusive => match locks.into_iter().next() {
                Some(lock) => LockBlock::new(lock, true).as_ptr().cast(),
                None => std::ptr::null_mut(),
            },
            Mode::Shared { .. } => {
                let holders = locks.map(Holder::of).collect();
                SharedBlock::new(mode, holders).as_ptr().cast()
            }
        }
    })
}

/// A lock's deadline and grant time as written out (Unix ms, converted at
/// one instant; a grant time of 0: unknown).
pub fn wall_times(lock: &Lock<'_>) -> (i64, i64) {
    time::wall_times(lock.deadline_ms, lock.granted_ms, server::conversion_now())
}

/// The loader's reads, each checked for a short read (the raw loaders do).
struct Io(*mut raw::RedisModuleIO);

impl ValueReader for Io {
    type Bytes = redis_module::RedisBuffer;

    fn string_buffer(&mut self) -> Result<Self::Bytes, Truncated> {
        raw::load_string_buffer(self.0).map_err(|_| Truncated)
    }

    fn signed(&mut self) -> Result<i64, Truncated> {
        raw::load_signed(self.0).map_err(|_| Truncated)
    }
}

extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    guard("aux_save", (), || {
        if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            // SAFETY: `rdb` is the IO context Redis gave this callback.
            unsafe { api!(RedisModule_SaveSigned)(rdb, engine::fence_hwm()) };
        }
    })
}

extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
    guard("aux_load", raw::REDISMODULE_ERR as c_int, || {
        if !(1..=ENCODING_VERSION).contains(&encver)
            || when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int
        {
            log_warning(&format!(
                "lock: unknown aux data (encoding version {encver}, when {when})"
            ));
            return raw::REDISMODULE_ERR as c_int;
        }
        let observed = raw::load_signed(rdb)
            .map_err(|_| "the data is truncated or damaged".to_string())
            .and_then(|hwm| engine::observe_fence(hwm).map_err(|e| format!("mark {hwm}: {e}")));
        match observed {
            Ok(()) => raw::REDISMODULE_OK as c_int,
            Err(why) => {
                log_warning(&format!("lock: refusing the saved fence mark: {why}"));
                raw::REDISMODULE_ERR as c_int
            }
        }
    })
}

extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard("aof_rewrite", (), || {
        // SAFETY: Redis passes a value of this type, alive and unchanged
        // during the callback.
        let (mode, holders) = unsafe { written_holders(value) };
        if mode.is_shared() {
            // SAFETY: `aof` is the IO context Redis gave this callback.
            let ctx = unsafe { Ctx::from_raw(api!(RedisModule_GetContextFromIO)(aof)) };
            let words = args::shared_set_args(mode, &holders);
            // SAFETY: `aof` and `key` are what Redis gave this callback,
            // which has not returned.
            unsafe { ffi::emit_aof_words(aof, ctx, command::SET_SHARED_C, key, &words) };
            return;
        }
        let (token, fence, deadline_ms, granted_ms) = holders[0];
        // SAFETY: `aof` and `key` are what Redis gave this callback; the
        // format "sblll" names what follows: a RedisModuleString, a buffer
        // and its length (copied by Redis), and three long longs.
        unsafe {
            api!(RedisModule_EmitAOF)(
                aof,
                command::SET_C.as_ptr(),
                c"sblll".as_ptr(),
                key,
                token.as_ptr(),
                token.len(),
                fence,
                deadline_ms,
                granted_ms,
            )
        };
    })
}

extern "C" fn mem_usage(value: *const c_void) -> usize {
    guard("mem_usage", 0, || {
        // SAFETY: Redis passes a value of this type, alive and unchanged
        // during the callback.
        unsafe {
            match is_shared(value) {
                true => (*value.cast::<SharedBlock>()).size(),
                false => LockBlock::size(LockBlock::view(value.cast())),
            }
        }
    })
}

extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard("digest", (), || {
        // SAFETY: Redis passes a value of this type, alive and unchanged
        // during the callback.
        let (mode, holders) = unsafe { written_holders(value) };
        // SAFETY: `md` is the digest Redis gave this callback; Redis reads
        // the token bytes during the call.
        unsafe {
            if mode.is_shared() {
                api!(RedisModule_DigestAddLongLong)(md, codec::mode_word(mode));
            }
            for (token, fence, _, _) in holders {
                api!(RedisModule_DigestAddStringBuffer)(md, token.as_ptr().cast(), token.len());
                // Not the deadline or the grant time: each node keeps them
                // on its own monotonic clock, so master and replica may
                // differ by a millisecond.
                api!(RedisModule_DigestAddLongLong)(md, fence);
            }
            api!(RedisModule_DigestEndSequence)(md);
        }
    })
}
