//! Server-wide state the glue keeps beside the node (`engine`): the clock,
//! key and waiter identities, the server state cached from events, and the counters and
//! histograms shown by `INFO lock`. Counters are atomics because lazy-free
//! threads run the type's `free`.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};

use super::ffi::{self, clock_us, Ctx, RString};
use crate::core::histogram;
use crate::core::time::Now;

/// Both clocks (see `core::time`): the monotonic one for leases, BLOCK
/// timeouts, the restart delay and timers; the wall clock for fencing
/// tokens and grant times.
pub fn now() -> Now {
    Now {
        mono_us: clock_us(libc::CLOCK_MONOTONIC),
        wall_us: clock_us(libc::CLOCK_REALTIME),
    }
}

/// The wall clock minus the monotonic one (ms), as deadlines are converted
/// with (`conversion_now`); i64::MIN before the first read.
static WALL_OFFSET_MS: AtomicI64 = AtomicI64::new(i64::MIN);

/// How far the clocks may drift apart before conversions follow them.
const OFFSET_DRIFT_MS: i64 = 5;

/// [`now`] as deadlines are converted between the clocks (persisted,
/// replicated and loaded): the wall clock read as the monotonic clock plus
/// an offset that changes only when the clocks move apart by more than a
/// few ms (a step, or slewing adding up). So the same lease is written out
/// with the same wall-clock deadline every time (RDB, DUMP, AOF, the
/// replication stream), to within that much of the true wall clock.
pub fn conversion_now() -> Now {
    conversion_at(now())
}

/// [`conversion_now`] at an instant read already with [`now`] (a command
/// converts at the instant it decided at, without reading both clocks
/// again).
pub fn conversion_at(now: Now) -> Now {
    let offset = now.wall_ms() - now.mono_ms();
    let cached = WALL_OFFSET_MS.load(Relaxed);
    let offset = if cached != i64::MIN && (offset - cached).abs() <= OFFSET_DRIFT_MS {
        cached
    } else {
        WALL_OFFSET_MS.store(offset, Relaxed);
        offset
    };
    Now {
        mono_us: now.mono_us,
        wall_us: now.mono_us + offset * 1000,
    }
}

/// The monotonic clock in ms (leases, timeouts, timers).
pub fn mono_ms() -> i64 {
    clock_us(libc::CLOCK_MONOTONIC) / 1000
}

/// Unix time in µs (fencing tokens).
pub fn wall_us() -> i64 {
    clock_us(libc::CLOCK_REALTIME)
}

/// A lock's identity across commands: (db, key name).
pub type Key = (i32, KeyName);

/// A key's name, kept inline up to [`INLINE`] bytes: a command makes its
/// key's identity on every call, and the node's outputs copy it, so a copy
/// is a few register moves (no call, no allocation). Compared, ordered and
/// hashed as its bytes. A name of at most [`INLINE`] bytes is always
/// inline, with the rest of its array zero, so two inline names are equal
/// exactly when their lengths and arrays are: compared without a call.
pub struct KeyName(Repr);

/// The longest name kept inline (the whole is 32 bytes).
pub const INLINE: usize = 30;

enum Repr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl Default for KeyName {
    fn default() -> Self {
        KeyName::from(&[][..])
    }
}

impl From<&[u8]> for KeyName {
    #[inline]
    fn from(name: &[u8]) -> Self {
        if name.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..name.len()].copy_from_slice(name);
            return KeyName(Repr::Inline {
                len: name.len() as u8,
                bytes,
            });
        }
        KeyName(Repr::Heap(name.into()))
    }
}

impl std::ops::Deref for KeyName {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..*len as usize],
            Repr::Heap(bytes) => bytes,
        }
    }
}

impl Clone for KeyName {
    #[inline(always)] // every output and lease index entry copies one
    fn clone(&self) -> Self {
        KeyName(match &self.0 {
            Repr::Inline { len, bytes } => Repr::Inline {
                len: *len,
                bytes: *bytes,
            },
            Repr::Heap(bytes) => Repr::Heap(bytes.clone()),
        })
    }
}

impl PartialEq for KeyName {
    #[inline(always)] // the lease index compares each grant's key with the last
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Repr::Inline { len: a, bytes: x }, Repr::Inline { len: b, bytes: y }) => {
                a == b && x == y
            }
            _ => **self == **other,
        }
    }
}

impl Eq for KeyName {}

impl PartialOrd for KeyName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for KeyName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (**self).cmp(&**other)
    }
}

impl std::hash::Hash for KeyName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state)
    }
}

impl std::fmt::Debug for KeyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self))
    }
}

/// Runs `f` with `key`'s name as a Redis string, in `key`'s db, selected
/// on `ctx` (the timer's own context, never a client's). None: the db does
/// not exist.
pub fn in_db<R>(ctx: Ctx, key: &Key, f: impl FnOnce(RString) -> R) -> Option<R> {
    if !ffi::select_db(ctx, key.0) {
        return None;
    }
    let name = ffi::OwnedString::new(ctx, &key.1);
    Some(f(name.get()))
}

/// A waiter's identity: a number `blocked` gives each blocked client when
/// it blocks, never reused (Redis reuses handle addresses: those are only
/// `blocked`'s index for Redis's callbacks).
pub type Client = u64;

/// The counters of `INFO lock`.
pub struct Stats {
    pub grants: AtomicU64,
    pub contended: AtomicU64,
    pub releases: AtomicU64,
    pub extends: AtomicU64,
    pub expirations: AtomicU64,
    pub handoffs: AtomicU64,
    pub block_timeouts: AtomicU64,
    pub take_backs: AtomicU64,
    pub wait_total_us: AtomicU64,
    pub wait_max_us: AtomicU64,
    pub refused_evictable: AtomicU64,
    /// Waiters sent elsewhere (ASK/MOVED) because their key left this node.
    pub redirects: AtomicU64,
    /// Keys the background sweep looked at, and the passes it finished over
    /// the whole keyspace: its rate, and so how long an ended lock nobody
    /// touches can stay (`make bench`, the sweep at scale).
    pub sweep_keys: AtomicU64,
    pub sweep_passes: AtomicU64,
    /// Guarded commands: `LOCK.EXEC` run and refused (token not holding),
    /// `LOCK.FENCED` run (or only recorded) and refused (stale fence).
    pub exec_ran: AtomicU64,
    pub exec_notheld: AtomicU64,
    pub fenced_ran: AtomicU64,
    pub fenced_stale: AtomicU64,
    /// Gates maxmemory evicted and the timer put back (`evicted`).
    pub gates_put_back: AtomicU64,
    /// Lock values in the keyspace; a lease that ended still counts until
    /// its key is reclaimed.
    pub locks: AtomicI64,
}

pub static STATS: Stats = Stats {
    grants: AtomicU64::new(0),
    contended: AtomicU64::new(0),
    releases: AtomicU64::new(0),
    extends: AtomicU64::new(0),
    expirations: AtomicU64::new(0),
    handoffs: AtomicU64::new(0),
    block_timeouts: AtomicU64::new(0),
    take_backs: AtomicU64::new(0),
    wait_total_us: AtomicU64::new(0),
    wait_max_us: AtomicU64::new(0),
    refused_evictable: AtomicU64::new(0),
    sweep_keys: AtomicU64::new(0),
    sweep_passes: AtomicU64::new(0),
    exec_ran: AtomicU64::new(0),
    exec_notheld: AtomicU64::new(0),
    fenced_ran: AtomicU64::new(0),
    fenced_stale: AtomicU64::new(0),
    gates_put_back: AtomicU64::new(0),
    redirects: AtomicU64::new(0),
    locks: AtomicI64::new(0),
};

pub fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

pub fn record_wait(waited_us: i64) {
    let waited = waited_us.max(0) as u64;
    STATS.wait_total_us.fetch_add(waited, Relaxed);
    STATS.wait_max_us.fetch_max(waited, Relaxed);
    WAIT_TIMES.record(waited_us / 1000);
}

/// A holder's time with the lock ended after `held_ms` (released, or taken
/// back).
pub fn record_hold(held_ms: i64) {
    HOLD_TIMES.record(held_ms);
}

/// Counts per power-of-two bucket (see `core::histogram`), with a total.
pub struct Histogram {
    pub buckets: [AtomicU64; histogram::BUCKETS],
    pub count: AtomicU64,
    pub sum_ms: AtomicU64,
}

impl Histogram {
    const fn new() -> Self {
        Histogram {
            buckets: [const { AtomicU64::new(0) }; histogram::BUCKETS],
            count: AtomicU64::new(0),
            sum_ms: AtomicU64::new(0),
        }
    }

    fn record(&self, ms: i64) {
        self.buckets[histogram::bucket_of(ms)].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum_ms.fetch_add(ms.max(0) as u64, Relaxed);
    }

    /// The buckets' counts now.
    pub fn counts(&self) -> [u64; histogram::BUCKETS] {
        std::array::from_fn(|i| self.buckets[i].load(Relaxed))
    }
}

/// How long BLOCK waiters waited before they were granted.
pub static WAIT_TIMES: Histogram = Histogram::new();
/// How long holders held their lock: until release (or take-back), or
/// until the lease ran out.
pub static HOLD_TIMES: Histogram = Histogram::new();

/// The server's state as it was last announced, for every decision
/// (`engine::conditions`): read at load, at loading's end, at every role
/// change and every CONFIG SET (`events::read_server_state`). Redis fires
/// the role event inside the change itself (REPLICAOF, FAILOVER, a cluster
/// failover, promotion), before any command or timer runs in the new role,
/// so this is the one record of the role: nothing asks the context again
/// (one reading of its flags costs about 140 instructions, a seventh of a
/// grant's own logic).
pub struct ServerState {
    /// This node is a replica: it changes no lock on its own.
    pub replica: AtomicBool,
    /// maxmemory is set with an `allkeys-*` policy, which can evict held
    /// locks (`volatile-*` never picks a key without a Redis expiry).
    pub evictable: AtomicBool,
    /// maxmemory is set: new holders check for OOM.
    pub maxmemory: AtomicBool,
}

pub static SERVER: ServerState = ServerState {
    replica: AtomicBool::new(false),
    evictable: AtomicBool::new(false),
    maxmemory: AtomicBool::new(false),
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;
    use std::hash::{Hash, Hasher};

    fn hash(k: &KeyName) -> u64 {
        let mut h = DefaultHasher::new();
        k.hash(&mut h);
        h.finish()
    }

    /// Inline (up to 30 bytes) and on the heap alike: its bytes, compared,
    /// ordered and hashed as the bytes are.
    #[test]
    fn a_key_name_is_its_bytes_inline_or_not() {
        let long = [b'k'; INLINE + 1];
        for name in [&b""[..], b"a", &long[..INLINE], &long[..]] {
            let k = KeyName::from(name);
            assert_eq!(&*k, name);
            assert_eq!(k.clone(), k);
            assert_eq!(hash(&k.clone()), hash(&k));
        }
        let (a, b) = (KeyName::from(&long[..INLINE]), KeyName::from(&long[..]));
        assert!(a < b && a != b);
        assert!(KeyName::from(&b"ab"[..]) < KeyName::from(&b"b"[..]));
        assert_eq!(KeyName::default(), KeyName::from(&b""[..]));
        // Equal exactly when the bytes are: a trailing zero byte, a prefix,
        // one byte apart, the same bytes made twice.
        let eq = |a: &[u8], b: &[u8]| KeyName::from(a) == KeyName::from(b);
        assert!(!eq(b"a\0", b"a") && !eq(b"ab", b"abc") && !eq(b"jobs:1", b"jobs:2"));
        assert!(eq(b"jobs:1", b"jobs:1") && eq(&long[..INLINE], &long[..INLINE]));
        assert!(eq(&long, &long) && !eq(&long[..INLINE], &long));
    }
}
