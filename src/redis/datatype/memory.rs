//! A lock in memory: an exclusive lock's one block (the token inline), a
//! shared lock's holders, and the value that is either.

use super::*;

/// A lock as the keyspace stores it: one allocation holding
/// `fence | deadline_ms + lease | granted_ms | lengths | token | value`,
/// so a grant costs one allocation (a 36-byte token: a 64-byte block, the
/// allocator's 64-byte class: smaller, with no Redis expiry entry, than a
/// `SET NX PX` key of the same token). Always handled through raw pointers:
/// the token lies past the struct. Outside `datatype` a block is seen only
/// through a [`LockValue`].
#[repr(C)]
pub struct LockBlock {
    fence: i64,
    /// The deadline (monotonic ms, 40 bits: 34 years of uptime) and the
    /// low 24 bits of the lease id (see [`pack`]).
    deadline_and_lease: u64,
    /// Monotonic ms, or [`GRANT_UNKNOWN`].
    granted_ms: i64,
    /// The token's length (low 16 bits), the value's (the next 15, see
    /// [`VALUE_SHIFT`]), and [`FROM_OUTSIDE`].
    len: u32,
    token: [u8; 0],
}

/// Where a block's `len` keeps the value's length (a token is at most
/// 512 bytes, a value at most `MAX_VALUE_LEN`, 16 KiB: both fit).
pub(super) const VALUE_SHIFT: u32 = 16;
const TOKEN_LEN_MASK: u32 = (1 << VALUE_SHIFT) - 1;
const VALUE_LEN_MASK: u32 = (1 << 15) - 1;
const _: () = assert!(crate::core::limits::MAX_VALUE_LEN <= VALUE_LEN_MASK as usize);
const _: () = assert!(crate::core::limits::MAX_TOKEN_LEN <= TOKEN_LEN_MASK as usize);

/// The token's and the value's lengths a block's `len` word keeps.
fn lengths(len: u32) -> (usize, usize) {
    (
        (len & TOKEN_LEN_MASK) as usize,
        ((len >> VALUE_SHIFT) & VALUE_LEN_MASK) as usize,
    )
}

/// A `len` bit: the value came from outside (an RDB, a `RESTORE`, the
/// master's or the AOF's `LOCK._SET`) and this build has not yet looked at
/// its key's Redis expiry. Only such a value can carry an earlier build's
/// expiry (one equal to its lease's end, dropped when this build first
/// renews or sweeps it): an expiry on a lock this node granted is always a
/// user's administrative delete. Not persisted.
pub(super) const FROM_OUTSIDE: u32 = 1 << 31;

pub(super) const TOKEN_OFFSET: usize = std::mem::offset_of!(LockBlock, token);

/// A block's grant time when it is unknown (`Lock::granted_ms` is None).
pub(super) const GRANT_UNKNOWN: i64 = i64::MIN;

/// How many low bits of a lease id a block keeps. A take-back (the one use
/// of lease ids) matches the fence too and runs at the next timer tick
/// after its grant: confusing a renewal with the grant would take 16
/// million grants and renewals node-wide in between.
pub(super) const LEASE_BITS: u32 = 24;
pub(super) const LEASE_MASK: u64 = (1 << LEASE_BITS) - 1;
pub(super) const DEADLINE_MAX: i64 = (1 << (64 - LEASE_BITS)) - 1;

/// A deadline on the monotonic clock (an ended one may be negative: kept
/// as 0, still ended) and a lease id, in one word.
pub(super) fn pack(deadline_ms: i64, lease: u64) -> u64 {
    ((deadline_ms.clamp(0, DEADLINE_MAX) as u64) << LEASE_BITS) | (lease & LEASE_MASK)
}

pub(super) fn unpack(word: u64) -> (i64, u64) {
    ((word >> LEASE_BITS) as i64, word & LEASE_MASK)
}

impl LockBlock {
    /// Allocates a block for the keyspace (freed by the type's `free`).
    /// Straight from RM_Alloc (Redis's allocator, 16-byte aligned, counted
    /// in used_memory): Rust's global allocator would reach the same place
    /// through two more calls on every grant.
    pub(super) fn new(lock: Lock<'_>, from_outside: bool) -> NonNull<LockBlock> {
        let size = Self::size(lock);
        // SAFETY: a plain allocation of `size` bytes.
        let block = unsafe { api!(RedisModule_Alloc)(size) }.cast::<LockBlock>();
        let Some(block) = NonNull::new(block) else {
            // SAFETY: 8 is a power of two, and `size` (at most a few hundred
            // bytes: the token is bounded) does not overflow when rounded up.
            handle_alloc_error(unsafe { Layout::from_size_align_unchecked(size, 8) });
        };
        let ptr = block.as_ptr();
        let (token_len, value_len) = (lock.token.len(), lock.value.len());
        // SAFETY: `ptr` is a fresh allocation of TOKEN_OFFSET + token and
        // value lengths bytes, aligned for LockBlock (RM_Alloc aligns to
        // 16): the header fields and the bytes right past them are in
        // bounds, and nothing else sees the block yet. Both lengths are
        // within their masks (the node's bounds, asserted above).
        unsafe {
            (*ptr).fence = lock.fence;
            (*ptr).deadline_and_lease = pack(lock.deadline_ms, lock.lease);
            (*ptr).granted_ms = lock.granted_ms.unwrap_or(GRANT_UNKNOWN);
            (*ptr).len = token_len as u32
                | (value_len as u32) << VALUE_SHIFT
                | if from_outside { FROM_OUTSIDE } else { 0 };
            let token = ptr.cast::<u8>().add(TOKEN_OFFSET);
            std::ptr::copy_nonoverlapping(lock.token.as_ptr(), token, token_len);
            if value_len > 0 {
                let value = token.add(token_len);
                std::ptr::copy_nonoverlapping(lock.value.as_ptr(), value, value_len);
            }
        }
        STATS.locks.fetch_add(1, Relaxed);
        block
    }

    /// # Safety
    /// `block` comes from [`LockBlock::new`] and is neither freed nor
    /// written during `'a`.
    pub(super) unsafe fn view<'a>(block: *const LockBlock) -> Lock<'a> {
        // SAFETY: a live block (the caller's contract), whose token and
        // value bytes lie right past the header, unchanged during `'a`.
        unsafe {
            let token = block.cast::<u8>().add(TOKEN_OFFSET);
            let (token_len, value_len) = lengths((*block).len);
            let (deadline_ms, lease) = unpack((*block).deadline_and_lease);
            Lock {
                fence: (*block).fence,
                deadline_ms,
                token: std::slice::from_raw_parts(token, token_len),
                value: std::slice::from_raw_parts(token.add(token_len), value_len),
                granted_ms: Some((*block).granted_ms).filter(|&g| g != GRANT_UNKNOWN),
                lease,
            }
        }
    }

    /// # Safety
    /// `block` comes from [`LockBlock::new`], is not freed, and no view of
    /// it is in use.
    pub(super) unsafe fn set(
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
    pub(super) unsafe fn token<'a>(block: *const LockBlock) -> &'a [u8] {
        // SAFETY: as `view` (the caller's contract).
        unsafe {
            let token = block.cast::<u8>().add(TOKEN_OFFSET);
            std::slice::from_raw_parts(token, lengths((*block).len).0)
        }
    }

    /// A new deadline and lease id; the fence and grant time stay.
    ///
    /// # Safety
    /// As [`LockBlock::set`].
    pub(super) unsafe fn renew(block: *mut LockBlock, deadline_ms: i64, lease: u64) {
        // SAFETY: a live block, not borrowed (the caller's contract).
        unsafe { (*block).deadline_and_lease = pack(deadline_ms, lease) }
    }

    /// # Safety
    /// `block` comes from [`LockBlock::new`] and is not freed.
    pub(super) unsafe fn is_from_outside(block: *const LockBlock) -> bool {
        // SAFETY: a live block (the caller's contract).
        unsafe { (*block).len & FROM_OUTSIDE != 0 }
    }

    /// # Safety
    /// `block` comes from [`LockBlock::new`], is not freed, and no view of
    /// it is in use.
    pub(super) unsafe fn set_from_outside(block: *mut LockBlock, on: bool) {
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
    pub(super) unsafe fn free(block: *mut LockBlock) {
        // SAFETY: an RM_Alloc allocation (the caller's contract), freed once.
        unsafe { api!(RedisModule_Free)(block.cast()) };
        STATS.locks.fetch_sub(1, Relaxed);
    }

    pub(super) fn size(lock: Lock<'_>) -> usize {
        TOKEN_OFFSET + lock.token.len() + lock.value.len()
    }
}

/// What a shared block has where an exclusive one has its fence (which
/// is always ≥ 1): the first word of a value says which it is.
pub(super) const SHARED_TAG: i64 = i64::MIN;

/// A shared lock as the keyspace stores it: its mode and its holders, in
/// grant order, each with its own token. Allocated by Rust's allocator
/// (the module's is Redis's, so it counts in used_memory); freed by the
/// type's `free`.
#[repr(C)]
pub struct SharedBlock {
    /// Always [`SHARED_TAG`]; first, as an exclusive block's fence is.
    pub(super) tag: i64,
    pub(super) mode: Mode,
    pub(super) holders: Vec<Holder>,
}

/// One holder of a shared lock.
pub(super) struct Holder {
    token: Box<[u8]>,
    value: Box<[u8]>,
    fence: i64,
    deadline_ms: i64,
    granted_ms: Option<i64>,
    lease: u64,
}

impl Holder {
    pub(super) fn of(lock: Lock<'_>) -> Holder {
        Holder {
            token: lock.token.into(),
            value: lock.value.into(),
            fence: lock.fence,
            deadline_ms: lock.deadline_ms,
            granted_ms: lock.granted_ms,
            lease: lock.lease,
        }
    }

    pub(super) fn view(&self) -> Lock<'_> {
        Lock {
            fence: self.fence,
            deadline_ms: self.deadline_ms,
            token: &self.token,
            value: &self.value,
            granted_ms: self.granted_ms,
            lease: self.lease,
        }
    }
}

impl SharedBlock {
    pub(super) fn new(mode: Mode, holders: Vec<Holder>) -> NonNull<SharedBlock> {
        STATS.locks.fetch_add(holders.len() as i64, Relaxed);
        let block = Box::new(SharedBlock {
            tag: SHARED_TAG,
            mode,
            holders,
        });
        NonNull::from(Box::leak(block))
    }

    pub(super) fn size(&self) -> usize {
        std::mem::size_of::<SharedBlock>()
            + self.holders.capacity() * std::mem::size_of::<Holder>()
            + self
                .holders
                .iter()
                .map(|h| h.token.len() + h.value.len())
                .sum::<usize>()
    }
}

/// Whether a value of this type is a [`SharedBlock`].
///
/// # Safety
/// `value` is a live value of this type (a block of this folder).
pub(super) unsafe fn is_shared(value: *const c_void) -> bool {
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
    pub(super) unsafe fn of(value: NonNull<c_void>) -> LockValue {
        // SAFETY: the caller's contract.
        match unsafe { is_shared(value.as_ptr()) } {
            true => LockValue::Shared(value.cast()),
            false => LockValue::Exclusive(value.cast()),
        }
    }

    pub(super) fn shared(&self) -> Option<&SharedBlock> {
        match self {
            // SAFETY: the block is live while this value is (see the
            // type's doc), and written only through `&mut self`.
            LockValue::Shared(block) => Some(unsafe { block.as_ref() }),
            LockValue::Exclusive(_) => None,
        }
    }

    pub(super) fn shared_mut(&mut self) -> Option<&mut SharedBlock> {
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
