//! The node's locks by when their lease ends, so an ended lock nobody
//! touches is reclaimed on time whatever else the keyspace holds (the
//! sweep, a walk of the whole keyspace, stays as the backstop).
//!
//! A key is filed when a lease starts on it (a grant, a holder added, a
//! renewal that shortens, a lock from outside), in the slot of
//! [`SLOT_MS`] its lease's end falls in, or [`LOOK_AHEAD_MS`] on if that
//! is sooner ([`look_at`]); a renewal that lengthens files nothing. Entries are hints, checked on use: when a slot comes due its
//! keys are looked at, an ended lock reclaimed, and a key whose lock ends
//! later (renewed, released and taken again) filed again where it now
//! ends; a key with no lock (released, deleted, renamed away) leaves. One
//! entry per held key, then, plus one per grant released before its
//! lease's end, kept until that end or for [`LOOK_AHEAD_MS`]: no removal
//! on release, which would cost a search (a flush drops its keys' entries
//! at once).
//!
//! Grants come in runs with one TTL, so most land in the slot the last one
//! went to: that slot is kept out of the map (`hot`) and filing into it is
//! a push (none when the key is the one filed last: a line handed on, one
//! holder's retries).

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

/// The width of a slot, ms: a lease's end is acted on at most this late
/// (plus the timer's own lateness).
pub const SLOT_MS: i64 = 64;
const _: () = assert!(SLOT_MS.count_ones() == 1, "a power of two");

/// The furthest ahead a key is filed: a lease that ends later is looked
/// at this soon (found held, and filed again as far), so the entry a
/// release leaves (entries are not removed then) lives at most this long,
/// whatever the lease asked (up to `lock.max-ttl-ms`, a week by default).
/// A lock held for an hour is looked at about twice a minute.
pub const LOOK_AHEAD_MS: i64 = 30_000;

/// The most keys a new hot slot is sized for ahead (a slot grows past it
/// as a `Vec` does): what the busiest node files in 64 ms, so a quiet
/// node's slots stay small.
const MAX_PRESIZE: usize = 1 << 16;

/// The bits of a `LOCK.SCAN` cursor that hold the position in its slot
/// (the rest is the slot): 16 million entries, and slots of 64 ms for a
/// thousand years of a monotonic clock.
pub const OFFSET_BITS: u32 = 24;
const OFFSET_MASK: i64 = (1 << OFFSET_BITS) - 1;

/// Whether a cursor can name `slot` (above 0: 0 is the start).
fn nameable(slot: i64) -> bool {
    slot > 0 && slot < i64::MAX >> OFFSET_BITS
}

/// When a key whose lease ends at `end_ms` is looked at, filed at `now_ms`.
#[inline(always)] // on every grant: part of one inlined path (callgrind)
pub fn look_at(end_ms: i64, now_ms: i64) -> i64 {
    end_ms.min(now_ms.saturating_add(LOOK_AHEAD_MS))
}

/// Keys by the slot their lease ends in: slot `s` holds ends in
/// `((s - 1) * SLOT_MS, s * SLOT_MS]`, due at `s * SLOT_MS`.
#[derive(Debug)]
pub struct LeaseEnds<K> {
    slots: BTreeMap<i64, Vec<K>>,
    /// The slot filed into last, with its keys: not in `slots`.
    hot: Option<(i64, Vec<K>)>,
    len: usize,
}

impl<K> Default for LeaseEnds<K> {
    fn default() -> Self {
        LeaseEnds {
            slots: BTreeMap::new(),
            hot: None,
            len: 0,
        }
    }
}

/// The slot `end_ms` falls in: its end rounded up to a multiple of
/// [`SLOT_MS`] (a power of two: a shift, floor division for negatives too).
fn slot_of(end_ms: i64) -> i64 {
    match end_ms.checked_add(SLOT_MS - 1) {
        Some(end) => end >> SLOT_MS.trailing_zeros(),
        // The last slot (its due saturates at i64::MAX).
        None => (i64::MAX >> SLOT_MS.trailing_zeros()) + 1,
    }
}

impl<K: Ord + Clone> LeaseEnds<K> {
    /// Files `key`, whose lease (started or seen at `now_ms`) ends at
    /// `end_ms`: in its end's slot, or [`LOOK_AHEAD_MS`] on if sooner.
    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    pub fn file_lease(&mut self, key: &K, end_ms: i64, now_ms: i64) {
        self.file(key, look_at(end_ms, now_ms));
    }

    /// Files `key` to be looked at at `at_ms`.
    #[inline(always)] // on every grant: part of one inlined path (callgrind)
    pub fn file(&mut self, key: &K, at_ms: i64) {
        let slot = slot_of(at_ms);
        match &mut self.hot {
            // A hot key granted over and over (a line handed on, a
            // holder's retries) is filed once per slot.
            Some((at, keys)) if *at == slot => {
                if keys.last() != Some(key) {
                    keys.push(key.clone());
                    self.len += 1;
                }
            }
            _ => self.file_in_new_slot(key, slot),
        }
    }

    /// [`file`](Self::file) past the hot slot: the slot filed into before
    /// goes cold, and `slot` is the hot one.
    #[cold]
    #[inline(never)]
    fn file_in_new_slot(&mut self, key: &K, slot: i64) {
        let hot = &mut self.hot;
        // The next slot is sized for as many keys as this one took
        // (grants come at about the same rate from one 64 ms to
        // the next), so filing a burst does not regrow and copy
        // its slot a dozen times.
        let mut next = Vec::with_capacity(
            hot.as_ref()
                .map_or(1, |(_, k)| k.len())
                .clamp(1, MAX_PRESIZE),
        );
        if let Some((at, mut keys)) = hot.take() {
            // It is cold now: its spare room is given back unless
            // small (a quarter), which costs a copy to give.
            if keys.capacity() - keys.len() > keys.len() / 4 {
                keys.shrink_to_fit();
            }
            match self.slots.entry(at) {
                Entry::Vacant(e) => {
                    e.insert(keys);
                }
                Entry::Occupied(mut e) => e.get_mut().append(&mut keys),
            }
        }
        next.push(key.clone());
        *hot = Some((slot, next));
        self.len += 1;
    }

    /// When the first slot comes due (monotonic ms); None when empty.
    pub fn next_due(&self) -> Option<i64> {
        let cold = self.slots.keys().next().copied();
        let hot = self.hot.as_ref().map(|(at, _)| *at);
        let slot = match (cold, hot) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        Some(slot.saturating_mul(SLOT_MS))
    }

    /// The keys of the slots due by `now_ms`, taken out, in key order,
    /// each once: at most about `max` entries (the earliest slots first; a
    /// slot larger than what is left is split), so one run's work is
    /// bounded and the rest stays due for the next.
    pub fn take_due(&mut self, now_ms: i64, max: usize) -> Vec<K> {
        let mut due = Vec::new();
        while due.len() < max {
            let cold = self.slots.first_key_value().map(|(at, _)| *at);
            let hot = self.hot.as_ref().map(|(at, _)| *at);
            let (at, from_hot) = match (cold, hot) {
                // One slot in both (the map's entries first, then the
                // hot one's, as a scan reads them): the hot part goes
                // first, so a slot split by `max` loses entries from its
                // end and a scan's position in it holds.
                (Some(c), Some(h)) if h <= c => (h, true),
                (Some(c), _) => (c, false),
                (None, Some(h)) => (h, true),
                (None, None) => break,
            };
            if at.saturating_mul(SLOT_MS) > now_ms {
                break;
            }
            let keys = match from_hot {
                true => &mut self.hot.as_mut().expect("the hot slot").1,
                false => self.slots.get_mut(&at).expect("the first slot"),
            };
            let room = max - due.len();
            let mut taken = match keys.len() > room {
                true => keys.split_off(keys.len() - room),
                false => std::mem::take(keys),
            };
            let emptied = keys.is_empty();
            due.append(&mut taken);
            if emptied {
                match from_hot {
                    true => self.hot = None,
                    false => {
                        self.slots.remove(&at);
                    }
                }
            }
        }
        self.len -= due.len();
        due.sort();
        due.dedup();
        due
    }

    /// A page of `LOCK.SCAN`: about `count` entries from the cursor `from`
    /// on (0: the start), each key once; and the cursor to go on from, 0
    /// when none is left. A cursor is a slot and a position in it
    /// ([`OFFSET_BITS`] bits), so a slot of a burst of grants (a hundred
    /// thousand with one TTL within 64 ms) is paged too.
    ///
    /// Complete like `SCAN`: a key filed from the first page to the last
    /// is in some page. Entries never move to an earlier slot: a renewal
    /// that shortens a lease adds an entry and leaves the later one, and a
    /// slot that comes due is refiled from now on, past any slot a page
    /// has reached (pages go forward from slots that were in the future).
    /// Within a slot, entries only ever join at the end (the hot slot's
    /// keys go after the map's when it cools) and leave from the end (a
    /// bounded timer run takes a slot's last ones), so a position holds.
    /// Only a flush, which drops some entries of a slot, can move the
    /// others back past a cursor. A key may come in more than one page.
    pub fn scan(&self, from: i64, count: usize) -> (Vec<K>, i64) {
        let (from_slot, mut skip) = match from {
            ..=0 => (i64::MIN + 1, 0),
            c => (c >> OFFSET_BITS, (c & OFFSET_MASK) as usize),
        };
        let mut cold = self.slots.range(from_slot..).peekable();
        let mut hot = self.hot.as_ref().filter(|(at, _)| *at >= from_slot);
        let mut page: Vec<K> = Vec::new();
        loop {
            // The next slot in order, from the map or the hot one.
            // (The hot slot may also be in the map: filed into, cooled,
            // then filed into again. Then both are one slot, the map's
            // entries first.)
            let at = match (cold.peek().map(|(at, _)| **at), hot.map(|(at, _)| *at)) {
                (Some(c), Some(h)) => c.min(h),
                (c, h) => match c.or(h) {
                    Some(at) => at,
                    None => break (dedup(page), 0),
                },
            };
            let mut entries: Vec<&K> = Vec::new();
            if let Some((_, keys)) = cold.next_if(|(c, _)| **c == at) {
                entries.extend(keys.iter());
            }
            if let Some((_, keys)) = hot.take_if(|(h, _)| *h == at) {
                entries.extend(keys.iter());
            }
            let first = if at == from_slot {
                std::mem::take(&mut skip)
            } else {
                0
            };
            let room = count.saturating_sub(page.len());
            let rest = entries.get(first..).unwrap_or(&[]);
            // Stop inside the slot where the position fits a cursor.
            let stop = first + room;
            if rest.len() > room && stop <= OFFSET_MASK as usize && nameable(at) {
                page.extend(rest[..room].iter().map(|k| (*k).clone()));
                break (dedup(page), (at << OFFSET_BITS) | stop as i64);
            }
            page.extend(rest.iter().map(|k| (*k).clone()));
            if page.len() >= count {
                let next = cold.peek().map(|(at, _)| **at);
                match next.into_iter().chain(hot.map(|(at, _)| *at)).min() {
                    None => break (dedup(page), 0),
                    Some(n) if nameable(n) => break (dedup(page), n << OFFSET_BITS),
                    // A slot no cursor names (not on a real clock): on
                    // into it in this page.
                    Some(_) => {}
                }
            }
        }
    }

    /// Every entry renamed (SWAPDB moved whole databases; `rename` is a
    /// bijection): a walk of every entry.
    pub fn rename_keys(&mut self, rename: impl Fn(&K) -> K) {
        let hot = self.hot.iter_mut().map(|(_, keys)| keys);
        for keys in self.slots.values_mut().chain(hot) {
            for key in keys.iter_mut() {
                *key = rename(key);
            }
        }
    }

    /// Every entry of a key `gone` says is gone (FLUSHDB, FLUSHALL),
    /// dropped: a walk of every entry.
    pub fn drop_keys(&mut self, gone: impl Fn(&K) -> bool) {
        let hot = self.hot.iter_mut().map(|(_, keys)| keys);
        for keys in self.slots.values_mut().chain(hot) {
            keys.retain(|k| !gone(k));
        }
        self.slots.retain(|_, keys| !keys.is_empty());
        if self.hot.as_ref().is_some_and(|(_, keys)| keys.is_empty()) {
            self.hot = None;
        }
        let hot = self.hot.iter().map(|(_, keys)| keys.len());
        self.len = self.slots.values().map(Vec::len).chain(hot).sum();
    }

    /// How many entries are filed (a key may be filed more than once).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is filed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `key` is filed in a slot due by `by_ms` (a check for the
    /// tests and the model: a linear search).
    #[cfg(test)]
    pub fn is_filed_by(&self, key: &K, by_ms: i64) -> bool {
        let hot = self.hot.iter().map(|(at, keys)| (at, keys));
        self.slots
            .iter()
            .chain(hot)
            .filter(|(at, _)| **at <= slot_of(by_ms))
            .any(|(_, keys)| keys.contains(key))
    }
}

fn dedup<K: Ord>(mut keys: Vec<K>) -> Vec<K> {
    keys.sort();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every page of a scan from the start.
    fn pages(ends: &LeaseEnds<u32>, count: usize) -> Vec<Vec<u32>> {
        let (mut from, mut out) = (0, Vec::new());
        loop {
            let (page, next) = ends.scan(from, count);
            out.push(page);
            if next == 0 {
                return out;
            }
            assert!(next > from, "pages go forward");
            from = next;
        }
    }

    /// A slot both in the map and hot, split by a bounded `take_due`
    /// between two pages: the entries taken are the slot's last ones, so
    /// the scan's position holds and every key is listed (refiled later,
    /// as the node refiles a held lock it takes).
    #[test]
    fn a_slot_split_between_pages_loses_entries_from_its_end() {
        let mut ends = LeaseEnds::default();
        for key in [1, 2, 3] {
            ends.file(&key, 100);
        }
        ends.file(&9, 5_000); // slot 100's keys cool into the map
        for key in [4, 5, 6] {
            ends.file(&key, 100); // slot 100 hot again
        }
        let (first, cursor) = ends.scan(0, 4);
        assert_eq!(first, vec![1, 2, 3, 4]);
        let taken = ends.take_due(200, 3);
        for key in &taken {
            ends.file(key, 10_000);
        }
        let mut listed = first;
        let mut from = cursor;
        while from != 0 {
            let (page, next) = ends.scan(from, 4);
            listed.extend(page);
            from = next;
        }
        listed.sort();
        listed.dedup();
        assert_eq!(listed, vec![1, 2, 3, 4, 5, 6, 9], "taken {taken:?}");
    }

    #[test]
    fn a_scan_pages_through_every_slot_once_hot_one_included() {
        let mut ends = LeaseEnds::default();
        for (key, at) in [(1, 100), (2, 100), (3, 1_000), (4, 5_000), (5, 100)] {
            ends.file(&key, at);
        }
        assert_eq!(ends.scan(0, 100), (vec![1, 2, 3, 4, 5], 0));
        // `count` entries a page, within a slot too (the map's entries of
        // a slot, then the hot ones).
        assert_eq!(
            pages(&ends, 1),
            vec![vec![1], vec![2], vec![5], vec![3], vec![4]]
        );
        assert_eq!(pages(&ends, 2), vec![vec![1, 2], vec![3, 5], vec![4]]);
        assert_eq!(pages(&ends, 4), vec![vec![1, 2, 3, 5], vec![4]]);
        // A slot that a bounded timer run took the end of: the position
        // holds for what is left.
        let mut burst = LeaseEnds::default();
        for key in 0..10u32 {
            burst.file(&key, 1_000);
        }
        burst.file(&99, 9_000); // cools the burst's slot
        let (first, cursor) = burst.scan(0, 4);
        assert_eq!(first, vec![0, 1, 2, 3]);
        assert_eq!(
            burst.take_due(1_024, 3).len(),
            3,
            "three taken from the end"
        );
        let (second, _) = burst.scan(cursor, 100);
        assert_eq!(second, vec![4, 5, 6, 99]);
        let empty: LeaseEnds<u32> = LeaseEnds::default();
        assert_eq!(empty.scan(0, 10), (vec![], 0));
    }

    /// A randomized history: between pages, keys are filed (grants, renewals
    /// that shorten) and slots come due and are refiled or dropped, as the
    /// timer does; every key filed all along is in some page.
    #[test]
    fn a_key_filed_throughout_a_scan_is_in_some_page() {
        let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for _ in 0..200 {
            let mut ends = LeaseEnds::default();
            let mut now = 1_000;
            // Where each held key's lease ends; absent: not held.
            let mut held: std::collections::BTreeMap<u32, i64> = Default::default();
            for key in 0..40 {
                let end = now + 1 + next(60_000) as i64;
                held.insert(key, end);
                ends.file_lease(&key, end, now);
            }
            let throughout: Vec<u32> = (0..40).filter(|k| k % 3 == 0).collect();
            let (mut from, mut seen) = (0, std::collections::BTreeSet::new());
            loop {
                let (page, next_from) = ends.scan(from, 1 + next(5) as usize);
                seen.extend(page);
                // Some time passes (the keys kept throughout renewed
                // first, so they never end); the timer looks at what came
                // due.
                let passes = next(3_000) as i64;
                for k in &throughout {
                    if held[k] <= now + passes {
                        let end = now + passes + 1 + next(20_000) as i64;
                        held.insert(*k, end);
                        ends.file_lease(k, end, now);
                    }
                }
                now += passes;
                for key in ends.take_due(now, usize::MAX) {
                    match held.get(&key) {
                        Some(&end) if end > now => ends.file(&key, look_at(end, now).max(now + 1)),
                        _ => {
                            held.remove(&key);
                        }
                    }
                }
                // Others are released, taken again, renewed (also shorter).
                for _ in 0..5 {
                    let key = next(40) as u32;
                    let end = now + 1 + next(60_000) as i64;
                    if throughout.contains(&key) || next(2) == 0 {
                        // Renewed or taken again.
                        if held.get(&key).is_some_and(|&e| end >= e) {
                            held.insert(key, end); // lengthened: no filing
                            continue;
                        }
                        held.insert(key, end);
                        ends.file_lease(&key, end, now);
                    } else {
                        held.remove(&key);
                    }
                }
                if next_from == 0 {
                    break;
                }
                from = next_from;
            }
            for k in &throughout {
                assert!(seen.contains(k), "{k} missed");
            }
        }
    }

    #[test]
    fn a_slot_is_due_at_its_end_and_holds_the_ends_up_to_it() {
        assert_eq!(slot_of(0), 0);
        assert_eq!(slot_of(1), 1);
        assert_eq!(slot_of(SLOT_MS), 1);
        assert_eq!(slot_of(SLOT_MS + 1), 2);
        assert_eq!(slot_of(-1), 0);
        let mut ends = LeaseEnds::default();
        ends.file(&"a", 100);
        assert_eq!(ends.next_due(), Some(128));
        assert!(ends.take_due(127, usize::MAX).is_empty());
        assert_eq!(ends.take_due(128, usize::MAX), vec!["a"]);
        assert!(ends.is_empty());
        assert_eq!(ends.next_due(), None);
    }

    #[test]
    fn due_keys_come_out_in_key_order_each_once_and_later_ones_stay() {
        let mut ends = LeaseEnds::default();
        for (key, end) in [("c", 10), ("a", 20), ("c", 30), ("b", 500), ("a", 5)] {
            ends.file(&key, end);
        }
        assert_eq!(ends.len(), 5);
        assert_eq!(ends.next_due(), Some(64));
        assert_eq!(ends.take_due(100, usize::MAX), vec!["a", "c"]);
        assert_eq!(ends.len(), 1);
        assert!(ends.is_filed_by(&"b", 500));
        assert!(!ends.is_filed_by(&"b", 400));
        assert_eq!(ends.next_due(), Some(512));
        assert_eq!(ends.take_due(i64::MAX, usize::MAX), vec!["b"]);
    }

    #[test]
    fn the_hot_slot_and_the_cold_ones_are_one_index() {
        // Slots filed out of order, the hot one moving back and forth.
        let mut ends = LeaseEnds::default();
        let mut all = Vec::new();
        for i in 0..1_000i64 {
            let end = (i * 7_919) % 3_000;
            ends.file(&i, end);
            all.push((end, i));
        }
        let mut seen = Vec::new();
        for now in (0..3_100).step_by(50) {
            let due = ends.take_due(now, usize::MAX);
            for key in &due {
                let end = all[*key as usize].0;
                assert!(slot_of(end) * SLOT_MS <= now, "{key} came out early");
                assert!(slot_of(end) * SLOT_MS > now - 50, "{key} came out late");
            }
            seen.extend(due);
        }
        seen.sort();
        assert_eq!(seen, (0..1_000).collect::<Vec<_>>());
        assert!(ends.is_empty());
    }

    #[test]
    fn a_key_filed_again_right_after_itself_in_one_slot_is_kept_once() {
        let mut ends = LeaseEnds::default();
        for i in 0..1_000 {
            ends.file(&"hot", 1_000 + i % 10);
        }
        assert_eq!(ends.len(), 1, "a line handed on: one entry");
        ends.file(&"other", 1_000);
        ends.file(&"hot", 1_000);
        assert_eq!(ends.len(), 3, "after another key, filed again");
        ends.file(&"later", 5_000);
        assert_eq!(ends.take_due(1_024, usize::MAX), vec!["hot", "other"]);
        assert_eq!(ends.len(), 1);
    }

    #[test]
    fn a_run_takes_a_bounded_share_earliest_first_and_leaves_the_rest_due() {
        let mut ends = LeaseEnds::default();
        for i in 0..250u32 {
            ends.file(&i, 10); // one slot, hot
        }
        for i in 250..300u32 {
            ends.file(&i, 100); // the next, hot; the first goes cold
        }
        let mut seen = Vec::new();
        while !ends.is_empty() {
            let due = ends.take_due(1_000, 64);
            assert!(!due.is_empty() && due.len() <= 64, "{}", due.len());
            seen.extend(due);
        }
        seen.sort();
        assert_eq!(seen, (0..300).collect::<Vec<_>>());
        // The earliest slot first: its keys before the next slot's.
        for i in 0..250u32 {
            ends.file(&i, 10);
        }
        ends.file(&999, 100);
        let first = ends.take_due(1_000, 250);
        assert!(!first.contains(&999));
        assert_eq!(ends.take_due(1_000, 250), vec![999]);
    }

    #[test]
    fn a_long_lease_is_looked_at_within_the_look_ahead() {
        assert_eq!(look_at(500, 0), 500);
        assert_eq!(look_at(7 * 86_400_000, 1_000), 1_000 + LOOK_AHEAD_MS);
        assert_eq!(look_at(i64::MAX, i64::MAX - 5), i64::MAX);
    }

    #[test]
    fn flushed_keys_leave() {
        let mut ends = LeaseEnds::default();
        for i in 0..10 {
            ends.file(&i, i * 100);
        }
        ends.drop_keys(|k| k % 2 == 0);
        assert_eq!(ends.len(), 5);
        assert_eq!(ends.take_due(i64::MAX, usize::MAX), vec![1, 3, 5, 7, 9]);
        ends.file(&1, 10);
        ends.drop_keys(|_| true);
        assert!(ends.is_empty() && ends.next_due().is_none());
    }

    #[test]
    fn renamed_keys_come_due_under_their_new_names() {
        let mut ends = LeaseEnds::default();
        ends.file(&1, 10);
        ends.file(&2, 100);
        ends.file(&3, 200);
        ends.rename_keys(|k| match k {
            1 => 2,
            2 => 1,
            k => *k,
        });
        assert_eq!(ends.take_due(64, usize::MAX), vec![2]);
        assert_eq!(ends.take_due(i64::MAX, usize::MAX), vec![1, 3]);
    }

    #[test]
    fn ends_far_out_or_before_zero_do_not_overflow() {
        let mut ends = LeaseEnds::default();
        ends.file(&1, i64::MAX);
        ends.file(&2, i64::MIN);
        assert_eq!(ends.take_due(0, usize::MAX), vec![2]);
        assert_eq!(ends.next_due(), Some(i64::MAX));
        assert_eq!(ends.take_due(i64::MAX, usize::MAX), vec![1]);
    }
}
