//! How many grants each key has had (`LOCK.INFO`'s `grants`), so a live
//! view can show a lock's grants per second. A lock's key leaves the
//! keyspace when it is released with nobody in line, so the count cannot
//! live in the lock; it lives here, in a count-min sketch of fixed size
//! (two rows of [`WIDTH`] counters, 64 KiB, whatever the number of keys):
//! a key's count is never below the truth and is exact unless other keys
//! share both of its cells. Counted where the grant is made (a replica
//! counts none), from the node's start (not persisted).

use std::hash::{Hash, Hasher};

/// Counters per row: a power of two.
const WIDTH: usize = 4096;
const ROWS: usize = 2;

/// Grants by key, approximately (see the module's doc).
#[derive(Debug, Default)]
pub struct GrantTally {
    /// `ROWS` rows of `WIDTH` counters; empty until the first grant.
    cells: Vec<u64>,
}

impl GrantTally {
    /// One grant of `key`.
    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    pub fn record<K: Hash>(&mut self, key: &K) {
        if self.cells.is_empty() {
            self.cells = vec![0; ROWS * WIDTH];
        }
        let (a, b) = cells(key);
        self.cells[a] = self.cells[a].wrapping_add(1);
        self.cells[WIDTH + b] = self.cells[WIDTH + b].wrapping_add(1);
    }

    /// The grants `key` has had: at least the true count.
    pub fn grants<K: Hash>(&self, key: &K) -> u64 {
        if self.cells.is_empty() {
            return 0;
        }
        let (a, b) = cells(key);
        self.cells[a].min(self.cells[WIDTH + b])
    }
}

/// The key's cell in each row, from one 64-bit hash (its two halves).
#[inline(always)] // on every grant: part of one inlined path (callgrind)
fn cells<K: Hash>(key: &K) -> (usize, usize) {
    let mut h = FxHasher::default();
    key.hash(&mut h);
    let x = h.finish();
    (x as usize & (WIDTH - 1), (x >> 32) as usize & (WIDTH - 1))
}

/// A fast multiplicative hash (rustc's Fx), finished with MurmurHash3's
/// mixer so both halves of the word are well spread. A grant pays for it,
/// so not SipHash: a key chosen to collide only inflates that key's count.
#[derive(Default)]
struct FxHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    /// Whole words, then the tail read as loads that may overlap (no copy
    /// into a buffer: a grant pays for every instruction here). The
    /// length is hashed before the bytes (`[u8]`'s `Hash`), so tails that
    /// read alike in keys of other lengths do not collide.
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while let Some((word, tail)) = rest.split_first_chunk::<8>() {
            self.add(u64::from_le_bytes(*word));
            rest = tail;
        }
        let n = rest.len();
        let tail = if n >= 4 {
            let lo = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
            let hi = u32::from_le_bytes(rest[n - 4..].try_into().expect("4 bytes"));
            u64::from(lo) | u64::from(hi) << 32
        } else if n > 0 {
            u64::from(rest[0]) | u64::from(rest[n / 2]) << 8 | u64::from(rest[n - 1]) << 16
        } else {
            return;
        };
        self.add(tail);
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    #[inline]
    fn write_i32(&mut self, n: i32) {
        self.add(n as u32 as u64);
    }

    fn finish(&self) -> u64 {
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn an_untouched_tally_counts_nothing() {
        assert_eq!(GrantTally::default().grants(&"k"), 0);
    }

    #[test]
    fn a_key_alone_is_counted_exactly() {
        let mut t = GrantTally::default();
        for _ in 0..7 {
            t.record(&(0, b"orders:1".to_vec()));
        }
        assert_eq!(t.grants(&(0, b"orders:1".to_vec())), 7);
        // The same name in another db is another key.
        assert_eq!(t.grants(&(1, b"orders:1".to_vec())), 0);
    }

    /// Random keys against exact counts: never under, and with a few
    /// hundred keys (a busy node's hot locks) nearly always exact.
    #[test]
    fn counts_are_never_under_and_mostly_exact() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut t = GrantTally::default();
        let mut truth: HashMap<Vec<u8>, u64> = HashMap::new();
        for _ in 0..50_000 {
            // Skewed: a few keys take most grants.
            let r = next();
            let id = if r % 4 == 0 { r % 500 } else { r % 20 };
            let key = format!("lock:{id}").into_bytes();
            t.record(&key);
            *truth.entry(key).or_default() += 1;
        }
        let mut exact = 0;
        for (key, n) in &truth {
            let got = t.grants(key);
            assert!(got >= *n, "{key:?}: {got} < {n}");
            exact += usize::from(got == *n);
        }
        assert!(
            exact * 100 >= truth.len() * 95,
            "{exact} of {}",
            truth.len()
        );
    }
}
