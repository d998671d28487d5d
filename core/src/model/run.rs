//! One history, step by step: each operation applied to the reference and
//! to the node, then the checks after it.

use std::collections::{BTreeSet, HashMap};

use super::harness::*;
use super::ops::*;
use super::reference::*;
use crate::lease_ends::SLOT_MS;
use crate::lock;
use crate::node::{Node, RETRY_MS};
use crate::waiters::{Outcome, Wake};

/// The waits the history has open: client -> (keys, token, timeout_at).
pub(super) type Asked = HashMap<u8, (Vec<u8>, Vec<u8>, Option<i64>)>;

/// The grants by hand-off that may still vanish: client -> (key, fence,
/// lease) of every key it was granted.
pub(super) type Granted = HashMap<u8, Vec<(u8, i64, u64)>>;

/// Each wake answers a client that was waiting, once, on the key it asked
/// for; a grant is of a live lock it now holds, before its timeout, unless
/// the step was a RELEASE of that key with that same token (`released`),
/// which may hand the key on (a hand-off a write pause held back) and then
/// release what it handed on. Grants are remembered for `Vanish`.
pub(super) fn check_wakes(
    h: &Harness,
    asked: &mut Asked,
    granted: &mut Granted,
    wakes: &[Wake<u8, u8>],
    now: i64,
    released: &[(u8, Vec<u8>)],
) {
    for wake in wakes {
        let (keys, token, timeout_at) = asked
            .remove(&wake.client)
            .expect("woken once, while waiting");
        assert_eq!(wake.key, keys[0], "granted only its own key");
        if let Outcome::Granted { fence, lease, .. } = wake.outcome {
            assert!(
                timeout_at.is_none_or(|t| now < t),
                "granted after its timeout"
            );
            let also: Vec<u8> = wake.also.iter().map(|(k, _)| *k).collect();
            assert_eq!(also, keys[1..], "granted every key it asked for");
            let leases = std::iter::once(lease).chain(wake.also.iter().map(|(_, l)| *l));
            let mut grants = Vec::new();
            for (&key, lease) in keys.iter().zip(leases) {
                grants.push((key, fence, lease));
                let held = h
                    .stores
                    .get(&key)
                    .and_then(|s| lock::holder_of(s, &token, now));
                if released.iter().any(|(k, t)| *k == key && t == &token) {
                    continue;
                }
                let held = held.expect("the granted lock is live when granted");
                // (A later waiter with the same token may have renewed it
                // since, with MINFENCE: a fresh, larger fence.)
                assert_eq!(held.token, &token[..]);
                assert!(held.fence >= fence);
            }
            granted.insert(wake.client, grants);
        }
    }
}

/// What lives across a history's steps.
pub(super) struct Run {
    pub(super) now: i64,
    pub(super) model: Reference,
    pub(super) h: Harness,
    pub(super) asked: Asked,
    /// client -> its last grant by hand-off, while it may still vanish.
    pub(super) granted: Granted,
    /// Every fence a lock has held, to check that none is ever reused.
    pub(super) fences_seen: BTreeSet<i64>,
    /// When the last pause of writes ended.
    pub(super) resumed_at: i64,
    /// How many held each key after the last step.
    pub(super) holder_counts: [usize; KEYS as usize],
    /// The fence of each ACQUIREALL grant, and its keys.
    pub(super) multi_grants: HashMap<i64, Vec<u8>>,
}

/// What one step collects for the checks after it.
pub(super) struct Step {
    pub(super) hwm_before: i64,
    /// Wakes of the timer runs inside an Advance.
    pub(super) tick_wakes: Vec<Wake<u8, u8>>,
    pub(super) model_told: Vec<(u8, Told)>,
    pub(super) replies: (Option<Told>, Option<Told>),
    pub(super) expected_expiry: Option<u8>,
}

/// One history: each operation applied to the reference and, through the
/// harness, to the node; then everything both must agree on.
pub(super) fn run(ops: &[Op]) {
    let mut r = Run::new();
    for (step, op) in ops.iter().enumerate() {
        r.step(step, op);
    }
}

impl Run {
    fn new() -> Run {
        let now = T0_MS;
        let model = Reference {
            max_ttl: MAX_TTL[0],
            max_token_len: MAX_TOKEN[0],
            max_line: MAX_LINE[0],
            max_holders: MAX_HOLDERS[0],
            ..Reference::default()
        };
        let h = Harness {
            node: Node::default(),
            stores: HashMap::new(),
            gates: HashMap::new(),
            replicated_gates: HashMap::new(),
            replicated: HashMap::new(),
            grants: 0,
            wrongtype: BTreeSet::new(),
            gone: BTreeSet::new(),
            denied: BTreeSet::new(),
            replica: false,
            wall_offset: 0,
            oom: false,
            evictable: false,
            writes_paused: false,
        };
        let asked: Asked = HashMap::new();
        // client -> its last grant by hand-off, while it may still vanish.
        let granted: Granted = HashMap::new();
        // Every fence a lock has held, to check that none is ever reused.
        let fences_seen: BTreeSet<i64> = BTreeSet::new();
        // When the last pause of writes ended.
        let resumed_at = i64::MIN;
        // How many held each key after the last step.
        let holder_counts = [0usize; KEYS as usize];
        // The fence of each ACQUIREALL grant, and its keys.
        let multi_grants: HashMap<i64, Vec<u8>> = HashMap::new();

        Run {
            now,
            model,
            h,
            asked,
            granted,
            fences_seen,
            resumed_at,
            holder_counts,
            multi_grants,
        }
    }

    /// One operation and the checks after it (none when it is skipped: a
    /// blocked client sends nothing, a write waits out a pause, ...).
    fn step(&mut self, step: usize, op: &Op) {
        let mut st = Step {
            hwm_before: self.h.node.fence_hwm(),
            tick_wakes: Vec::new(),
            model_told: Vec::new(),
            replies: (None, None),
            expected_expiry: None,
        };
        let model = &self.model;
        // Clients' writes wait in Redis while writes are paused.
        let client_write = matches!(
            op,
            Op::Acquire { .. }
                | Op::AcquireAll { .. }
                | Op::ReleaseAll { .. }
                | Op::Release { .. }
                | Op::Extend { .. }
                | Op::Delete { .. }
                | Op::WrongType { .. }
                | Op::Swap
                | Op::Migrate { .. }
                | Op::Exec { .. }
                | Op::Fenced { .. }
                | Op::DeleteGate { .. }
        );
        if client_write && model.writes_paused {
            return;
        }
        // A client that sends a command has its reply: it can no longer
        // vanish with an undelivered grant.
        if let Op::Acquire { client, .. }
        | Op::Release { client, .. }
        | Op::Extend { client, .. }
        | Op::AcquireAll { client, .. }
        | Op::ReleaseAll { client, .. }
        | Op::Observe { client, .. } = *op
        {
            if model.waiting(client) || model.denied.contains(&client) {
                return; // a blocked client sends nothing; Redis refuses a denied one
            }
            self.granted.remove(&client);
        }
        let applied = match *op {
            Op::Acquire { .. } => self.acquire(&mut st, step, op),
            Op::AcquireAll { .. } => self.acquire_all(&mut st, step, op),
            Op::ReleaseAll { .. } => self.release_all(&mut st, step, op),
            Op::Exec { .. } => self.exec(&mut st, step, op),
            Op::Fenced { .. } => self.fenced(&mut st, step, op),
            Op::DeleteGate { .. } => self.delete_gate(&mut st, step, op),
            Op::Release { .. } => self.release(&mut st, step, op),
            Op::Extend { .. } => self.extend(&mut st, step, op),
            Op::Delete { .. } => self.delete(&mut st, step, op),
            Op::WrongType { .. } => self.wrong_type(&mut st, step, op),
            Op::Swap => self.swap(&mut st, step, op),
            Op::Migrate { .. } => self.migrate(&mut st, step, op),
            Op::Disconnect { .. } => self.disconnect(&mut st, step, op),
            Op::Observe { .. } => self.observe(&mut st, step, op),
            Op::Vanish { .. } => self.vanish(&mut st, step, op),
            Op::Deny { .. } => self.deny(&mut st, step, op),
            Op::Config { .. } => self.config(&mut st, step, op),
            Op::Memory { .. } => self.memory(&mut st, step, op),
            Op::Demote => self.demote(&mut st, step, op),
            Op::Promote => self.promote(&mut st, step, op),
            Op::PauseWrites { .. } => self.pause_writes(&mut st, step, op),
            Op::Sweep { .. } => self.sweep(&mut st, step, op),
            Op::ClockStep { .. } => self.clock_step(&mut st, step, op),
            Op::Advance { .. } => self.advance(&mut st, step, op),
        };
        if applied {
            self.check(step, op, st);
        }
    }

    /// Everything the node and the reference must agree on after a step.
    fn check(&mut self, step: usize, op: &Op, st: Step) {
        let Run {
            now,
            model,
            h,
            asked,
            granted,
            fences_seen,
            resumed_at,
            holder_counts,
            multi_grants,
        } = self;
        let now = *now;
        let Step {
            hwm_before,
            tick_wakes,
            mut model_told,
            replies,
            expected_expiry,
        } = st;
        // The timer also runs at the end of the event-loop iteration.
        let ran = h.timer(now);
        let taken = model.tick(now, ran, &mut model_told);
        let d = h.drain();
        follow_timer_reclaims(model, h, now);
        lease_ends_kept(step, model, h, now, *resumed_at);
        scan_lists_every_held_lock(step, model, h, now);
        assert_eq!(d.take_backs, taken.len(), "step {step}: take-backs counted");
        if let Some(key) = expected_expiry {
            assert!(
                d.expired.contains(&key),
                "step {step}: the sweep's expiration"
            );
        }
        let wakes = d.wakes;
        for wake in wakes.iter().chain(&tick_wakes) {
            if let (Outcome::Granted { fence, .. }, false) = (&wake.outcome, wake.also.is_empty()) {
                let keys = std::iter::once(wake.key).chain(wake.also.iter().map(|(k, _)| *k));
                multi_grants.entry(*fence).or_default().extend(keys);
            }
        }

        assert_eq!(replies.0, replies.1, "step {step} {op:?}: reply");
        // The step's drain also covers the timer run after it, which
        // answers nobody nil.
        let answered_nil = matches!(op, Op::Acquire { .. } | Op::AcquireAll { .. })
            && replies.1 == Some(Told::Nil);
        assert_eq!(
            d.contended,
            usize::from(answered_nil),
            "step {step} {op:?}: contended counted"
        );
        compare(step, op, model_told, &wakes);
        let released: Vec<(u8, Vec<u8>)> = match *op {
            Op::Release { key, token: t, .. } => vec![(key, token(t))],
            Op::ReleaseAll { keys, token: t, .. } => keys_of(keys, false)
                .into_iter()
                .map(|k| (k, token(t)))
                .collect(),
            _ => Vec::new(),
        };
        check_wakes(h, asked, granted, &wakes, now, &released);

        let mut live_fences = BTreeSet::new();
        for key in 0..KEYS {
            let mut engine_holders: Vec<(Vec<u8>, i64, i64)> = h
                .stores
                .get(&key)
                .map(|s| {
                    lock::holders(s)
                        .filter(|l| l.is_live(now))
                        .map(|l| (l.token.to_vec(), l.fence, l.deadline_ms))
                        .collect()
                })
                .unwrap_or_default();
            let mut model_holders: Vec<(Vec<u8>, i64, i64)> = model
                .holders(key)
                .iter()
                .filter(|h| now < h.deadline_ms)
                .map(|h| (h.token.clone(), h.fence, h.deadline_ms))
                .collect();
            engine_holders.sort();
            model_holders.sort();
            assert_eq!(
                engine_holders, model_holders,
                "step {step} {op:?}: holders of {key}"
            );
            let engine_mode = h.stores.get(&key).and_then(|s| s.mode);
            let model_mode = model.locks.get(&key).map(|l| l.mode);
            if !engine_holders.is_empty() {
                assert_eq!(engine_mode, model_mode, "step {step} {op:?}: mode of {key}");
            }
            // Never more holders than the key's capacity, unless it had
            // them before a lower lock.max-holders-per-key (those stay, as
            // waiters stay in a line made shorter).
            let capacity = engine_mode.map_or(1, |m| model.capacity(m));
            let count = engine_holders.len();
            assert!(
                count <= capacity || count <= holder_counts[usize::from(key)],
                "step {step}: {count} holders of {key} in {engine_mode:?}"
            );
            holder_counts[usize::from(key)] = count;
            for (_, fence, _) in &engine_holders {
                let fence = *fence;
                // One fence per grant; the keys of one ACQUIREALL share it.
                let together = multi_grants.get(&fence).is_some_and(|ks| ks.contains(&key));
                assert!(
                    live_fences.insert(fence) || together,
                    "step {step}: two locks hold fence {fence}"
                );
                // A fence not held before this step was drawn in it: above
                // every token the node had issued when the step began.
                if !fences_seen.contains(&fence) {
                    assert!(
                        fence > hwm_before,
                        "step {step}: a new fence {fence} at or below the mark {hwm_before}"
                    );
                    fences_seen.insert(fence);
                }
            }
            // After a pause the node looks again within RETRY_MS.
            let resumed = !model.resume_pending || now > *resumed_at + RETRY_MS;
            let grantable = !h.replica
                && !h.writes_paused
                && resumed
                && h.node.grants_paused_ms(now) == 0
                && !model.delayed(key, now);
            if h.node.waiting_on(&key) > 0 && grantable && !model.group_waits(key, now) {
                assert!(
                    !engine_holders.is_empty(),
                    "step {step} {op:?}: a waiter is stranded on a free lock {key}"
                );
            }
        }
        assert_eq!(h.node.fence_hwm(), model.hwm, "step {step}: fence mark");
        // Every gate as the reference has it, and as the replica does.
        for gate in 0..GATES {
            let key = GATE0 + gate;
            let here = h.gates.get(&key).and_then(|g| g.mark);
            assert_eq!(
                here,
                model.gates.get(&gate).copied(),
                "step {step} {op:?}: gate {gate}"
            );
            let there = h.replicated_gates.get(&key).copied();
            assert_eq!(here, there, "step {step} {op:?}: replica of gate {gate}");
        }
        assert_eq!(h.grants, model.grants, "step {step}: grants counted");
        // Every change the node made reached the replica: its keys are
        // this node's, ended locks included.
        for key in 0..KEYS {
            let here = h.stores.get(&key).map(copy_of).unwrap_or_default();
            let there = h.replicated.get(&key).cloned().unwrap_or_default();
            assert_eq!(here, there, "step {step} {op:?}: replica of key {key}");
        }
    }
}

/// The reference follows the ended locks the node's timer reclaimed.
pub(super) fn follow_timer_reclaims(model: &mut Reference, h: &Harness, now: i64) {
    model.follow_timer_reclaims(now, |key, token| {
        h.stores
            .get(&key)
            .is_some_and(|s| s.holders.iter().any(|l| l.token == token))
    });
}

/// After a timer run, while the node acts alone, no lease ended longer
/// ago than a slot (and the longest lock-delay of the run) is still stored:
/// every lock is filed by its end, and reclaimed when its slot comes due.
/// (Not for a second after a promotion, when a replica's filed locks are
/// looked at again, nor for a retry after a pause; keys moved away or of
/// another type are not the node's.)
pub(super) fn lease_ends_kept(
    step: usize,
    model: &Reference,
    h: &Harness,
    now: i64,
    resumed_at: i64,
) {
    let settling = now < model.serving_since + 1_000 + 2 * SLOT_MS
        || now < resumed_at.saturating_add(RETRY_MS + 2 * SLOT_MS);
    if h.replica || h.writes_paused || model.resume_pending || settling {
        return;
    }
    for (key, store) in &h.stores {
        if h.gone.contains(key) || h.wrongtype.contains(key) {
            continue;
        }
        for l in &store.holders {
            assert!(
                now < l.deadline_ms + model.lock_delay_max + SLOT_MS,
                "step {step}: key {key}'s lease ended at {} and is still stored at {now}",
                l.deadline_ms
            );
        }
    }
}

/// `LOCK.SCAN` after every step: a full scan of the lease index (pages of
/// a size that varies with the step), each key read as the glue reads it
/// (`Node::info`), lists exactly the keys the reference model holds now,
/// whatever happened to them (grants, renewals longer and shorter,
/// hand-offs, loads, SWAPDB, a promotion): no held lock missing, none
/// listed after it is gone.
pub(super) fn scan_lists_every_held_lock(step: usize, model: &Reference, h: &Harness, now: i64) {
    let count = 1 + step % 4;
    let (mut from, mut scanned) = (0, BTreeSet::new());
    loop {
        let (page, next) = h.node.scan_locks(from, count);
        assert!(page.len() <= count, "step {step}: a page of {}", page.len());
        scanned.extend(page);
        if next == 0 {
            break;
        }
        assert!(next > from, "step {step}: the scan goes forward");
        from = next;
    }
    let served = |key: &u8| !h.gone.contains(key) && !h.wrongtype.contains(key);
    let listed: BTreeSet<u8> = scanned
        .into_iter()
        .filter(served)
        .filter(|key| {
            let Some(held) = h.stores.get(key).and_then(|s| h.node.info(key, s, now)) else {
                return false;
            };
            // Its grants, freed between them or not (the keys here are
            // few: the sketch counts them exactly).
            let granted = model.grants_by_key.get(key).copied().unwrap_or(0);
            assert_eq!(held.grants, granted, "step {step}: key {key}'s grants");
            true
        })
        .collect();
    let held: BTreeSet<u8> = (0..=u8::MAX)
        .filter(served)
        .filter(|key| model.leader(*key, now) > 0)
        .collect();
    assert_eq!(
        listed, held,
        "step {step}: LOCK.SCAN's locks against the model's"
    );
}

/// The waiters both sides answered in a step, and how.
pub(super) fn compare(
    step: usize,
    op: &Op,
    mut model_told: Vec<(u8, Told)>,
    wakes: &[Wake<u8, u8>],
) {
    let mut engine_told: Vec<(u8, Told)> = wakes.iter().map(|w| (w.client, told_of(w))).collect();
    model_told.sort();
    engine_told.sort();
    assert_eq!(model_told, engine_told, "step {step} {op:?}: wakes");
}
