//! The checker: a pure function of a [`History`] that looks for
//! violations (two holders at once, fences that do not rise, stale writes
//! the resource accepted, barging, stranded waiters, ...) and excuses only
//! those a fault documented as unsafe in the README can cause; then its
//! own tests, on hand-made histories it must catch.

use std::collections::{BTreeMap, HashMap};

use crate::model::FaultClass::{self, *};
use crate::model::{Fault, History, Kind, Mode, Op, Outcome, Us, Write};

/// How much any time bound is widened before it counts as a violation.
pub const MARGIN: Us = 50_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Check {
    Exclusion,
    FenceAfterGrant,
    LostEarly,
    FenceMismatch,
    WrongKey,
    FenceOrder,
    FenceReused,
    StaleWrite,
    StoreOrder,
    Barging,
    Stranded,
    NoReply,
}

impl Check {
    pub const ALL: [Check; 12] = [
        Check::Exclusion,
        Check::FenceAfterGrant,
        Check::LostEarly,
        Check::FenceMismatch,
        Check::WrongKey,
        Check::FenceOrder,
        Check::FenceReused,
        Check::StaleWrite,
        Check::StoreOrder,
        Check::Barging,
        Check::Stranded,
        Check::NoReply,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Check::Exclusion => "mutual exclusion",
            Check::FenceAfterGrant => "fence right after a grant",
            Check::LostEarly => "lock kept for its lease",
            Check::FenceMismatch => "holder's fence unchanged",
            Check::WrongKey => "grant is of the key asked",
            Check::FenceOrder => "fences strictly increase",
            Check::FenceReused => "no fence issued twice",
            Check::StaleWrite => "no stale write accepted",
            Check::StoreOrder => "resource's fences never go back",
            Check::Barging => "no barging past a waiter",
            Check::Stranded => "no waiter stranded",
            Check::NoReply => "every command answered",
        }
    }

    pub fn what(self) -> &'static str {
        match self {
            Check::Exclusion => "never more holders of a key at once than their modes allow (an exclusive holder alone, shared holders any number, `SHARED LIMIT n` holders at most n): a holder's windows run from the reply to each successful ACQUIRE or EXTEND to the earliest that lease can end (its send time + ttl; earlier if an ACQUIRE/EXTEND of unknown outcome may have shortened it) or to the holder's RELEASE; at no instant may more windows be open than the smallest capacity among them",
            Check::FenceAfterGrant => "`LOCK.FENCE key token` right after a grant returns that grant's fence (nil only once the lease can have ended)",
            Check::LostEarly => "EXTEND, RELEASE, renewal or FENCE by the holder never finds the lock gone before its lease can have ended",
            Check::FenceMismatch => "`LOCK.FENCE key token` by the holder never returns another fence",
            Check::WrongKey => "`LOCK.FENCE other-key token` after a grant is nil: the grant was not of another key",
            Check::FenceOrder => "a grant's fence exceeds every fence granted (on any key, on any node of the lineage, across restarts and failovers) before it was asked for",
            Check::FenceReused => "no two tokens were granted the same fence",
            Check::StaleWrite => "the fenced resource (keeps the highest fence per key, rejects lower ones) accepted no write by a holder after a write by a holder granted later",
            Check::StoreOrder => "the resource's accepted fences per key never decrease (a check of the harness itself)",
            Check::Barging => "no ACQUIRE without BLOCK was granted while a waiter was certainly in line for the key",
            Check::Stranded => "a one-key waiter certainly first in line when its key was released got the lock (a multi-key waiter may wait for another of its keys; on a key asked for in more than one mode, a read/write lock, one reader's release may leave others holding it, so only keys whose every ACQUIRE asked the same exclusive or limited mode are checked); every BLOCK was answered",
            Check::NoReply => "every command got a reply or a closed connection within 10 s (beyond its BLOCK timeout)",
        }
    }

    /// The fault classes that excuse a violation of this check: only those
    /// the README documents as able to cause it.
    fn excused_by(self) -> &'static [FaultClass] {
        match self {
            // Administrative releases (DEL/UNLINK, FLUSHALL), SWAPDB (the
            // key names another lock), and a failover that lost the old
            // master's last writes with no restart delay.
            Check::Exclusion => &[FailoverLossy, Flushall, Swapdb, Del, Pexpire],
            // The same, and any loss of data: a promoted replica that
            // missed writes, a restart without the data. (The restart delay
            // keeps them exclusive, not the holder's lock.)
            Check::FenceAfterGrant | Check::LostEarly => &[
                FailoverLossy,
                FailoverLossyDelayed,
                RestartWiped,
                Flushall,
                Swapdb,
                Del,
                Pexpire,
            ],
            // SWAPDB moves the waiters to the other database.
            // SWAPDB, or a failover to a replica that missed a renewal
            // which was a new grant, can bring back an older grant of the
            // same token.
            Check::FenceMismatch => &[FailoverLossy, FailoverLossyDelayed, Swapdb],
            Check::Barging | Check::Stranded => &[Swapdb],
            _ => &[],
        }
    }
}

#[derive(Clone, Debug)]
pub struct Violation {
    pub check: Check,
    pub excused_by: Option<FaultClass>,
    pub detail: String,
    /// The tokens involved.
    pub about: Vec<String>,
}

/// What [`check`] found, and how often each check applied (a check that
/// found nothing is told from one that had nothing to look at).
#[derive(Debug, Default)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    pub checked: BTreeMap<Check, usize>,
}

impl Verdict {
    fn checked(&mut self, check: Check) {
        *self.checked.entry(check).or_default() += 1;
    }
}

/// A holder's tenure: one (token, fence) from the reply that first showed
/// it until the holder let go or learnt it lost the lock.
#[derive(Clone, Debug)]
pub struct Grant {
    token: String,
    key: String,
    fence: i64,
    /// The epoch that served the op that first showed the grant.
    epoch: u32,
    /// A time before the fence was issued.
    issued_after: Us,
    /// The reply that first showed the grant to its holder.
    start: Us,
    /// The earliest the lease can end, from the holder's latest successful
    /// ACQUIRE or EXTEND.
    lease_end: Us,
    /// When the holder may act as the holder: from the reply of each
    /// successful ACQUIRE or EXTEND to the earliest its lease can end (or
    /// the holder lets go). Windows merge when they touch; a gap stays a
    /// gap even if a later EXTEND succeeds, because the lock may have
    /// lapsed in between and come back (a failover to a replica that has
    /// an older, longer lease).
    windows: Vec<(Us, Us)>,
    /// [send, reply] of each op that wrote this lease (the grant and every
    /// renewal): when the node converted it to the wall clock.
    writes: Vec<(Us, Us)>,
    pub via_block: bool,
    /// How it holds the key.
    mode: Mode,
}

impl Grant {
    fn new(op: &Op, fence: i64, ttl_us: Us, issued_after: Us, via_block: bool) -> Grant {
        let mode = match op.kind {
            Kind::Acquire { mode, .. } => mode,
            _ => Mode::Exclusive,
        };
        Grant {
            mode,
            token: op.token.clone(),
            key: op.key.clone(),
            fence,
            epoch: op.epoch,
            issued_after,
            start: op.reply,
            lease_end: op.send + ttl_us,
            windows: vec![(op.reply, op.send + ttl_us)],
            writes: vec![(op.send, op.reply)],
            via_block,
        }
    }

    /// A successful ACQUIRE or EXTEND at `op`: the lease now ends no
    /// earlier than its send time plus `ttl_us` (and until it ran, no
    /// earlier than that or the previous end, whichever came first).
    fn renewed(&mut self, op: &Op, ttl_us: Us, unknown_end: Us) {
        let end = op.send + ttl_us;
        self.writes.push((op.send, op.reply));
        let last = self.windows.last_mut().unwrap();
        last.1 = last.1.min(unknown_end).min(end);
        if op.reply <= last.1 {
            last.1 = end;
        } else {
            self.windows.push((op.reply, end));
        }
        self.lease_end = end;
    }

    /// The holder stops acting as the holder at `at` (it released, or
    /// learnt it lost the lock, or the history ends).
    fn close(&mut self, at: Us, unknown_end: Us) {
        let last = self.windows.last_mut().unwrap();
        last.1 = last.1.min(unknown_end).min(at);
    }
}

/// Checks a history; returns every violation found, excused or not.
pub fn check(h: &History) -> Verdict {
    let mut v = Verdict::default();
    let grants = grants(h, &mut v);
    check_exclusion(h, &grants, &mut v);
    check_fences(h, &grants, &mut v);
    check_writes(h, &grants, &mut v);
    check_waiters(h, &mut v);
    for op in &h.ops {
        v.checked(Check::NoReply);
        if op.outcome == Outcome::NoReply {
            // A waiter never answered is stranded.
            let check = match op.kind {
                Kind::Acquire { block: Some(_), .. } => Check::Stranded,
                _ => Check::NoReply,
            };
            v.violations.push(Violation {
                about: vec![op.token.clone()],
                check,
                excused_by: None,
                detail: format!("no reply: {op:?}"),
            });
        }
    }
    v
}

/// Follows each token through its ops (one client's, in order) and cuts
/// them into grants; reports what the holder saw go wrong on the way.
pub fn grants(h: &History, v: &mut Verdict) -> Vec<Grant> {
    let mut by_token: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in &h.ops {
        by_token.entry(&op.token).or_default().push(op);
    }
    let mut out: Vec<Grant> = Vec::new();
    for ops in by_token.values_mut() {
        ops.sort_by_key(|op| op.send);
        // The keys its first command asked for (several for ACQUIREALL):
        // each is followed on its own, as a grant of that key.
        let homes: Vec<String> = ops
            .iter()
            .take_while(|op| op.send == ops[0].send)
            .map(|op| op.key.clone())
            .collect();
        for op in ops.iter().filter(|op| !homes.contains(&op.key)) {
            v.checked(Check::WrongKey);
            if let Outcome::Int(f) = op.outcome {
                v.violations.push(Violation {
                    about: vec![op.token.clone()],
                    check: Check::WrongKey,
                    excused_by: None,
                    detail: format!(
                        "{} asked for {homes:?}, holds {} with fence {f}",
                        op.token, op.key
                    ),
                });
            }
        }
        for home in &homes {
            // A time before any fence this token is granted next was issued.
            let mut floor = ops[0].send;
            let mut cur: Option<usize> = None;
            // The earliest a lease op of unknown outcome can have ended the lease.
            let mut unknown_end = Us::MAX;
            let mut after_grant = false;
            for op in ops.iter().filter(|op| op.key == *home) {
                let just_granted = std::mem::take(&mut after_grant);
                if cur.is_some() && !matches!(op.outcome, Outcome::Err(_)) {
                    v.checked(match op.kind {
                        Kind::Fence if just_granted => Check::FenceAfterGrant,
                        _ => Check::LostEarly,
                    });
                    if op.kind == Kind::Fence && !just_granted {
                        v.checked(Check::FenceMismatch);
                    }
                }
                match (op.kind, &op.outcome) {
                    (Kind::Acquire { ttl, block, .. }, Outcome::Int(f)) => match cur {
                        Some(c) if out[c].fence == *f => {
                            out[c].renewed(op, ttl * 1000, unknown_end);
                            unknown_end = Us::MAX;
                            floor = op.reply;
                        }
                        _ => {
                            if let Some(c) = cur {
                                // A renewal found the lease over and got a new grant.
                                lost(h, v, &mut out[c], op, unknown_end, just_granted);
                            }
                            out.push(Grant::new(op, *f, ttl * 1000, floor, block.is_some()));
                            cur = Some(out.len() - 1);
                            unknown_end = Us::MAX;
                            floor = op.reply;
                            after_grant = true;
                        }
                    },
                    (Kind::Acquire { .. }, Outcome::Nil)
                    | (Kind::Extend { .. }, Outcome::Int(0)) => {
                        if let Some(c) = cur.take() {
                            lost(h, v, &mut out[c], op, unknown_end, just_granted);
                        }
                    }
                    (Kind::Release, Outcome::Int(0)) | (Kind::Fence, Outcome::Nil) => {
                        if let Some(c) = cur.take() {
                            lost(h, v, &mut out[c], op, unknown_end, just_granted);
                        }
                    }
                    (
                        Kind::Acquire { ttl, .. } | Kind::Extend { ttl },
                        Outcome::Lost | Outcome::NoReply,
                    ) => {
                        unknown_end = unknown_end.min(op.send + ttl * 1000);
                    }
                    (Kind::Extend { ttl }, Outcome::Int(_)) => {
                        if let Some(c) = cur {
                            out[c].renewed(op, ttl * 1000, unknown_end);
                            unknown_end = Us::MAX;
                            floor = op.reply;
                        }
                    }
                    (Kind::Release, Outcome::Int(_) | Outcome::Lost | Outcome::NoReply) => {
                        if let Some(c) = cur.take() {
                            out[c].close(op.send, unknown_end);
                        }
                    }
                    (Kind::Fence, Outcome::Int(f)) => {
                        if let Some(c) = cur {
                            if out[c].fence == *f {
                                floor = op.reply;
                            } else {
                                let check = if just_granted {
                                    Check::FenceAfterGrant
                                } else {
                                    Check::FenceMismatch
                                };
                                let g = &out[c];
                                v.violations.push(Violation {
                                    about: vec![op.token.clone()],
                                    check,
                                    excused_by: h.excuse(
                                        check.excused_by(),
                                        &g.key,
                                        g.issued_after,
                                        op.reply,
                                    ),
                                    detail: format!(
                                    "{} was granted fence {} but LOCK.FENCE said {f} at [{}, {}]",
                                    op.token, out[c].fence, op.send, op.reply
                                ),
                                });
                            }
                        }
                    }
                    _ => {}
                }
            }
            if let Some(c) = cur {
                out[c].close(Us::MAX, unknown_end);
            }
        }
    }
    out
}

/// The holder learnt at `op` that its grant `g` is gone: the grant ends
/// there, and it is a violation if the lease cannot have ended yet.
fn lost(h: &History, v: &mut Verdict, g: &mut Grant, op: &Op, unknown_end: Us, just_granted: bool) {
    let end = g.lease_end.min(unknown_end);
    g.close(op.send, unknown_end);
    // A read served by a node no longer master says nothing.
    if op.reply + MARGIN < end && op.reply <= h.epoch_end(op.epoch) {
        let check = if just_granted && op.kind == Kind::Fence {
            Check::FenceAfterGrant
        } else {
            Check::LostEarly
        };
        v.violations.push(Violation {
            about: vec![g.token.clone()],
            check,
            excused_by: h
                .excuse(check.excused_by(), &g.key, g.issued_after, op.reply)
                .or(stepped_write_then_handover(h, g, op.reply)),
            detail: format!(
                "{} (fence {}, lease until at least {} µs) found it gone at {:?} [{}, {}]: {:?}",
                g.token, g.fence, end, op.kind, op.send, op.reply, op.outcome
            ),
        });
    }
}

/// Never more holders of a key at once, while none of their leases can
/// have ended, than the smallest capacity of their modes: one for an
/// exclusive holder, n for `SHARED LIMIT n`, any number of plain shared
/// holders. A sweep over the windows, each cut short by [`MARGIN`] (two
/// windows meet when they overlap by more than that); the most open at
/// once is reached where one opens, so each opening is checked.
fn check_exclusion(h: &History, grants: &[Grant], v: &mut Verdict) {
    let mut by_key: BTreeMap<&str, Vec<(Us, Us, &Grant)>> = BTreeMap::new();
    for g in grants {
        let windows: Vec<(Us, Us)> = g
            .windows
            .iter()
            .copied()
            .filter(|(from, to)| to - from > MARGIN)
            .collect();
        if !windows.is_empty() {
            v.checked(Check::Exclusion);
        }
        for (from, to) in windows {
            by_key
                .entry(&g.key)
                .or_default()
                .push((from, to - MARGIN, g));
        }
    }
    for (key, mut list) in by_key {
        list.sort_by_key(|w| w.0);
        let mut open: Vec<(Us, Us, &Grant)> = Vec::new();
        let mut reported: Vec<Vec<&str>> = Vec::new();
        for &(b_from, b_to, b) in &list {
            open.retain(|&(_, a_to, _)| a_to > b_from);
            // The other holders at b's opening, one window per token.
            let mut others: Vec<(Us, Us, &Grant)> = Vec::new();
            for &w in &open {
                if w.2.token != b.token && others.iter().all(|o| o.2.token != w.2.token) {
                    others.push(w);
                }
            }
            open.push((b_from, b_to, b));
            let capacity = others
                .iter()
                .map(|o| o.2.mode.capacity())
                .fold(b.mode.capacity(), usize::min);
            if others.len() < capacity {
                continue;
            }
            let mut tokens: Vec<&str> = others.iter().map(|o| o.2.token.as_str()).collect();
            tokens.push(&b.token);
            tokens.sort_unstable();
            if reported.contains(&tokens) {
                continue;
            }
            reported.push(tokens);
            let issued_after = others
                .iter()
                .map(|o| o.2.issued_after)
                .min()
                .unwrap_or(b_from);
            let (from, to) = (issued_after.min(b.issued_after), b_from);
            // The restart delay stops new grants on the promoted node;
            // it does not stop a holder whose longer lease the replica
            // kept (its shortening renewal was lost) from carrying on
            // while the old master's later grant to another was lost.
            let carried_on = h.faults.iter().any(|f| {
                f.class == FailoverLossyDelayed
                    && f.start <= to
                    && f.end >= from
                    && f.promoted
                        .is_some_and(|p| b.epoch < p && others.iter().all(|o| o.2.epoch < p))
            });
            let stepped = others
                .iter()
                .find_map(|o| stepped_write_then_handover(h, o.2, b_from));
            let held: Vec<String> = others
                .iter()
                .map(|&(from, to, a)| {
                    format!(
                        "{} ({:?}, fence {}) held [{from}, {}]",
                        a.token,
                        a.mode,
                        a.fence,
                        to + MARGIN
                    )
                })
                .collect();
            v.violations.push(Violation {
                about: others
                    .iter()
                    .map(|o| o.2.token.clone())
                    .chain([b.token.clone()])
                    .collect(),
                check: Check::Exclusion,
                excused_by: h
                    .excuse(Check::Exclusion.excused_by(), key, from, to)
                    .or(carried_on.then_some(FailoverLossyDelayed))
                    .or(stepped),
                detail: format!(
                    "{key}: {} and {} ({:?}, fence {}) held [{b_from}, {}]",
                    held.join(", "),
                    b.token,
                    b.mode,
                    b.fence,
                    b_to + MARGIN
                ),
            });
        }
    }
}

/// The documented way a wall-clock step shortens a lease (README, Leases
/// and clocks): what is persisted and replicated is a wall-clock deadline,
/// so a lease written while the node's clock was stepped (back), read after
/// it was set right, by the node restarted (a restart "counts the time it
/// was down") or by its replica, whose clock was not stepped, is shorter by
/// the step. Excused when one of `g`'s writes ran during a clock step and a
/// restart or failover after it came before `until`.
fn stepped_write_then_handover(h: &History, g: &Grant, until: Us) -> Option<FaultClass> {
    let step_during_write = |&(send, reply): &(Us, Us)| {
        h.faults
            .iter()
            .filter(|f| f.class == ClockStep && f.start <= reply && f.end >= send)
            .map(|f| f.start)
            .min()
    };
    let stepped_from = g.writes.iter().filter_map(step_during_write).min()?;
    let handover = h.faults.iter().any(|f| {
        matches!(
            f.class,
            Restart | FailoverGraceful | FailoverLossy | FailoverLossyDelayed
        ) && f.start >= stepped_from
            && f.start <= until
    });
    handover.then_some(ClockStep)
}

/// The one documented way fences go back (README, Guarantees): a node's
/// wall clock was ahead when `earlier` was granted (a clock step raised the
/// mark), and data was lost before `later` was asked for (a restart without
/// the data, or a failover to a replica that missed writes), so the node
/// that granted `later` issued by its clock, behind `earlier`'s token.
fn clock_step_then_data_loss(h: &History, earlier: &Grant, later: &Grant) -> Option<FaultClass> {
    let stepped = h
        .faults
        .iter()
        .any(|f| f.class == ClockStep && f.start <= earlier.start);
    // Lost before `later` was issued, that is before its reply: a renewal
    // by the same token that found its lease gone is asked long after the
    // token's last op (its `issued_after`).
    let lost = h.excuse(
        &[RestartWiped, FailoverLossy, FailoverLossyDelayed],
        &later.key,
        earlier.start,
        later.start.max(earlier.start),
    );
    (stepped && lost.is_some()).then_some(ClockStep)
}

/// A "grant" that is the same token's earlier grant of the key seen again
/// (same fence): not a fence issued twice but an older lock brought back,
/// as SWAPDB (swapping the databases back) or a failover to a replica that
/// missed a newer grant can (the faults that excuse a holder's fence
/// changing, `Check::FenceMismatch`), between the two.
fn brought_back(h: &History, grants: &[Grant], g: &Grant) -> Option<FaultClass> {
    let earlier = grants
        .iter()
        .filter(|e| e.token == g.token && e.key == g.key && e.fence == g.fence)
        .find(|e| e.start < g.start)?;
    h.excuse(
        Check::FenceMismatch.excused_by(),
        &g.key,
        earlier.start,
        g.start,
    )
}

/// Every grant's fence exceeds every fence granted before it was asked for,
/// on every key and node; no fence is issued twice.
fn check_fences(hist: &History, grants: &[Grant], v: &mut Verdict) {
    let mut sorted: Vec<&Grant> = grants.iter().collect();
    sorted.sort_by_key(|g| g.start);
    let mut highest: Vec<&Grant> = Vec::with_capacity(sorted.len());
    for g in &sorted {
        let best = match highest.last() {
            Some(h) if h.fence >= g.fence => h,
            _ => g,
        };
        highest.push(best);
    }
    for g in grants {
        v.checked(Check::FenceOrder);
        v.checked(Check::FenceReused);
        let before = sorted.partition_point(|s| s.start < g.issued_after);
        if let Some(h) = before.checked_sub(1).map(|i| highest[i]) {
            if h.fence >= g.fence {
                v.violations.push(Violation {
                    about: vec![g.token.clone(), h.token.clone()],
                    check: Check::FenceOrder,
                    excused_by: clock_step_then_data_loss(hist, h, g)
                        .or_else(|| brought_back(hist, grants, g)),
                    detail: format!(
                        "{} asked after {} and was granted {} on {}, not above {} granted to {} on {} at {}",
                        g.token, g.issued_after, g.fence, g.key, h.fence, h.token, h.key, h.start
                    ),
                });
            }
        }
    }
    let mut seen: HashMap<i64, &Grant> = HashMap::new();
    for g in grants {
        if let Some(other) = seen.insert(g.fence, g) {
            if other.token != g.token {
                let (earlier, later) = if other.start <= g.start {
                    (other, g)
                } else {
                    (g, other)
                };
                v.violations.push(Violation {
                    about: vec![g.token.clone(), other.token.clone()],
                    check: Check::FenceReused,
                    excused_by: clock_step_then_data_loss(hist, earlier, later),
                    detail: format!(
                        "fence {} granted to {} and {}",
                        g.fence, other.token, g.token
                    ),
                });
            }
        }
    }
}

/// Kleppmann's check at the resource: once a holder granted later has
/// written, no earlier holder's write may be accepted.
fn check_writes(h: &History, grants: &[Grant], v: &mut Verdict) {
    let by_grant: HashMap<(&str, i64), &Grant> = grants
        .iter()
        .map(|g| ((g.token.as_str(), g.fence), g))
        .collect();
    // Per key: the highest accepted fence, and the latest grant that wrote.
    let mut state: HashMap<&str, (i64, Option<&Grant>)> = HashMap::new();
    for w in h.writes.iter().filter(|w| w.accepted) {
        v.checked(Check::StoreOrder);
        v.checked(Check::StaleWrite);
        let (highest, latest) = state.entry(&w.key).or_insert((i64::MIN, None));
        if w.fence < *highest {
            v.violations.push(Violation {
                about: vec![w.token.clone()],
                check: Check::StoreOrder,
                excused_by: None,
                detail: format!("{w:?} accepted after fence {highest}"),
            });
        }
        *highest = (*highest).max(w.fence);
        let Some(&g) = by_grant.get(&(w.token.as_str(), w.fence)) else {
            continue;
        };
        if let Some(later) = latest.filter(|l| l.issued_after > g.start) {
            v.violations.push(Violation {
                about: vec![g.token.clone(), later.token.clone()],
                check: Check::StaleWrite,
                // The later grant's fence went back below this one's.
                excused_by: clock_step_then_data_loss(h, g, later),
                detail: format!(
                    "{}: {} (fence {}, granted at {}) wrote at {} after {} (fence {}, asked at {})",
                    w.key,
                    g.token,
                    g.fence,
                    g.start,
                    w.at,
                    later.token,
                    later.fence,
                    later.issued_after
                ),
            });
        }
        if latest.is_none_or(|l| g.issued_after > l.issued_after) {
            *latest = Some(g);
        }
    }
}

/// Waiters that timed out (nil): while one was certainly in line, nobody
/// else may be granted the key without BLOCK, and a release of the key may
/// not skip it when nobody else could have been ahead of it.
fn check_waiters(h: &History, v: &mut Verdict) {
    type Line<'a> = HashMap<(&'a str, u32), Vec<&'a Op>>;
    let mut fresh: Line = HashMap::new();
    let mut releases: Line = HashMap::new();
    let mut blocks: Line = HashMap::new();
    let mut first_of_token: HashMap<&str, Us> = HashMap::new();
    // Each key's one mode when every ACQUIRE of it asked the same (None:
    // several, a read/write lock).
    let mut modes: HashMap<&str, Option<Mode>> = HashMap::new();
    for op in &h.ops {
        let t = first_of_token.entry(&op.token).or_insert(op.send);
        *t = (*t).min(op.send);
        if let Kind::Acquire { mode, .. } = op.kind {
            let m = modes.entry(&op.key).or_insert(Some(mode));
            if *m != Some(mode) {
                *m = None;
            }
        }
    }
    for op in &h.ops {
        let slot = (op.key.as_str(), op.epoch);
        match (op.kind, &op.outcome) {
            (Kind::Acquire { block: None, .. }, Outcome::Int(_) | Outcome::Nil)
                if first_of_token[op.token.as_str()] == op.send =>
            {
                fresh.entry(slot).or_default().push(op)
            }
            (Kind::Acquire { block: Some(_), .. }, _) => blocks.entry(slot).or_default().push(op),
            (Kind::Release, Outcome::Int(1)) => releases.entry(slot).or_default().push(op),
            _ => {}
        }
    }
    let unblocked = |w: &Op| {
        h.faults.iter().any(|f| {
            matches!(f.class, ClientUnblock | ClientUnblockError)
                && f.client == Some(w.client)
                && f.start <= w.reply
                && f.end >= w.send
        })
    };
    // While grants are paused (restart delay), a freed lock waits.
    let paused = |w: &Op| {
        h.faults.iter().any(|f| {
            matches!(f.class, RestartWiped | FailoverLossyDelayed)
                && f.start <= w.reply
                && f.end >= w.send
        })
    };
    for ws in blocks.values() {
        for w in ws {
            let (Kind::Acquire { block: Some(t), .. }, Outcome::Nil) = (w.kind, &w.outcome) else {
                continue;
            };
            // A waiter for several keys may wait on a free key for another
            // one, and a writer for the last of several readers: only
            // barging past them is checked.
            let several = w.also > 0
                || !matches!(
                    modes.get(w.key.as_str()),
                    Some(Some(Mode::Exclusive | Mode::Limit(_)))
                );
            if unblocked(w) || paused(w) {
                continue;
            }
            // W entered the line after its send and before reply - timeout,
            // and left at its timeout: it was in line throughout [a, b].
            let a = w.reply - t * 1000 + MARGIN;
            let b = w.send + t * 1000 - MARGIN;
            if a >= b {
                continue;
            }
            let slot = (w.key.as_str(), w.epoch);
            let inside = |op: &&&Op| op.send >= a && op.reply <= b && op.token != w.token;
            let excused = || h.excuse(Check::Barging.excused_by(), &w.key, w.send, w.reply);
            // Every other token's first ACQUIRE without BLOCK meanwhile
            // must have got nil.
            for x in fresh.get(&slot).into_iter().flatten().filter(inside) {
                v.checked(Check::Barging);
                if let Outcome::Int(_) = x.outcome {
                    v.violations.push(Violation {
                        about: vec![x.token.clone(), w.token.clone()],
                        check: Check::Barging,
                        excused_by: excused(),
                        detail: format!(
                            "{} granted {:?} at [{}, {}] while {} waited in line [{a}, {b}]",
                            x.token, x.outcome, x.send, x.reply, w.token
                        ),
                    });
                }
            }
            // A release while W was in line hands the lock to the first
            // waiter. W was first unless another waiter may have entered the
            // line before W (sent before W certainly had) and may still have
            // been in it (not yet answered when the release was sent).
            for r in releases
                .get(&slot)
                .into_iter()
                .flatten()
                .filter(inside)
                .filter(|_| !several)
            {
                v.checked(Check::Stranded);
                let ahead = ws
                    .iter()
                    .any(|o| o.token != w.token && o.send < a && o.reply > r.send);
                if !ahead {
                    v.violations.push(Violation {
                        about: vec![r.token.clone(), w.token.clone()],
                        check: Check::Stranded,
                        excused_by: excused(),
                        detail: format!(
                            "{} released at [{}, {}] while {} was first in line [{a}, {b}]; it timed out",
                            r.token, r.send, r.reply, w.token
                        ),
                    });
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The checker's own tests: hand-made histories it must catch
// ---------------------------------------------------------------------------

fn op(
    client: usize,
    token: &str,
    key: &str,
    kind: Kind,
    at_ms: (i64, i64),
    outcome: Outcome,
) -> Op {
    Op {
        client,
        epoch: 0,
        key: key.into(),
        token: token.into(),
        kind,
        send: at_ms.0 * 1000,
        reply: at_ms.1 * 1000,
        outcome,
        also: 0,
    }
}

fn acq(ttl: i64) -> Kind {
    Kind::Acquire {
        ttl,
        block: None,
        mode: Mode::Exclusive,
    }
}

fn fault(class: FaultClass, at_ms: (i64, i64)) -> Fault {
    Fault {
        class,
        start: at_ms.0 * 1000,
        end: at_ms.1 * 1000,
        key: None,
        client: None,
        promoted: None,
    }
}

fn unexcused(v: &Verdict) -> Vec<Check> {
    v.violations
        .iter()
        .filter(|v| v.excused_by.is_none())
        .map(|v| v.check)
        .collect()
}

#[test]
fn checker_accepts_a_correct_history() {
    let h = History {
        ops: vec![
            op(0, "a", "k", acq(1000), (0, 1), Outcome::Int(10)),
            op(0, "a", "k", Kind::Fence, (2, 3), Outcome::Int(10)),
            op(0, "a", "j", Kind::Fence, (3, 4), Outcome::Nil),
            op(0, "a", "k", Kind::Release, (100, 101), Outcome::Int(1)),
            // Waited, handed the lock by that release.
            op(
                1,
                "w",
                "k",
                Kind::Acquire {
                    ttl: 1000,
                    block: Some(500),
                    mode: Mode::Exclusive,
                },
                (50, 101),
                Outcome::Int(15),
            ),
            op(
                1,
                "w",
                "k",
                Kind::Extend { ttl: 1000 },
                (102, 103),
                Outcome::Int(1),
            ),
            op(1, "w", "k", Kind::Release, (200, 201), Outcome::Int(1)),
            op(2, "b", "k", acq(1000), (300, 301), Outcome::Int(20)),
            // A lease that ran out is no violation.
            op(
                2,
                "b",
                "k",
                Kind::Extend { ttl: 100 },
                (1400, 1401),
                Outcome::Int(0),
            ),
            // A waiter that timed out while the key was held.
            op(
                3,
                "x",
                "k",
                Kind::Acquire {
                    ttl: 10,
                    block: Some(200),
                    mode: Mode::Exclusive,
                },
                (310, 511),
                Outcome::Nil,
            ),
        ],
        writes: vec![
            Write {
                key: "k".into(),
                token: "a".into(),
                fence: 10,
                accepted: true,
                at: 5_000,
            },
            Write {
                key: "k".into(),
                token: "b".into(),
                fence: 20,
                accepted: true,
                at: 305_000,
            },
            // The stale holder is turned away.
            Write {
                key: "k".into(),
                token: "a".into(),
                fence: 10,
                accepted: false,
                at: 306_000,
            },
        ],
        ..Default::default()
    };
    let v = check(&h);
    assert!(v.violations.is_empty(), "{v:#?}");
}

#[test]
fn checker_reports_two_holders_unless_a_documented_fault_came_between() {
    let mut h = History {
        ops: vec![
            op(0, "a", "k", acq(1000), (0, 1), Outcome::Int(10)),
            op(1, "b", "k", acq(1000), (200, 201), Outcome::Int(20)),
        ],
        ..Default::default()
    };
    assert_eq!(unexcused(&check(&h)), [Check::Exclusion]);
    // A restart with `appendfsync always` loses nothing: no excuse.
    h.faults.push(fault(Restart, (100, 150)));
    assert_eq!(unexcused(&check(&h)), [Check::Exclusion]);
    // DEL of another key: no excuse; of this key: excused.
    h.faults.push(Fault {
        key: Some("j".into()),
        ..fault(Del, (100, 110))
    });
    assert_eq!(unexcused(&check(&h)), [Check::Exclusion]);
    h.faults.push(fault(Flushall, (100, 110)));
    let v = check(&h);
    assert!(unexcused(&v).is_empty());
    assert_eq!(v.violations[0].excused_by, Some(Flushall));
    // A holder that released before the other was granted: fine.
    h.ops
        .push(op(0, "a", "k", Kind::Release, (150, 151), Outcome::Int(1)));
    h.faults.clear();
    assert!(check(&h).violations.is_empty());
}

#[test]
fn checker_reports_a_fence_that_does_not_rise() {
    let h = History {
        ops: vec![
            op(0, "a", "k1", acq(100), (0, 1), Outcome::Int(500)),
            op(1, "b", "k2", acq(100), (20, 21), Outcome::Int(400)),
            op(2, "c", "k3", acq(100), (30, 31), Outcome::Int(500)),
        ],
        ..Default::default()
    };
    let v = unexcused(&check(&h));
    assert!(v.contains(&Check::FenceOrder), "{v:?}");
    assert!(v.contains(&Check::FenceReused), "{v:?}");
}

/// SWAPDB away and back while a token holds a key: its ACQUIRE in between
/// is a new grant (of the other database's key), the one after finds its
/// earlier grant again, with the earlier fence. Excused by the swap, and
/// only by a fault that can bring a lock back.
#[test]
fn checker_excuses_an_earlier_grant_brought_back_by_swapdb() {
    let mut h = History {
        ops: vec![
            op(0, "a", "k", acq(1000), (0, 1), Outcome::Int(10)),
            op(1, "b", "j", acq(1000), (20, 21), Outcome::Int(20)),
            op(0, "a", "k", acq(1000), (100, 101), Outcome::Int(30)),
            op(0, "a", "k", acq(1000), (200, 201), Outcome::Int(10)),
        ],
        ..Default::default()
    };
    assert!(unexcused(&check(&h)).contains(&Check::FenceOrder));
    h.faults.push(fault(Restart, (50, 160)));
    assert!(
        unexcused(&check(&h)).contains(&Check::FenceOrder),
        "no loss"
    );
    h.faults.push(fault(Swapdb, (50, 160)));
    let v = check(&h);
    assert!(unexcused(&v).is_empty(), "{v:#?}");
    let order = v.violations.iter().find(|x| x.check == Check::FenceOrder);
    assert_eq!(order.map(|x| x.excused_by), Some(Some(Swapdb)));
}

/// Fences that go back are excused only by the documented case: a clock
/// step ahead before the earlier grant, then data loss before the later.
/// Neither alone excuses it, and a clock step never excuses two holders.
#[test]
fn checker_excuses_fences_going_back_only_after_a_clock_step_and_data_loss() {
    let mut h = History {
        ops: vec![
            op(0, "a", "k1", acq(100), (0, 1), Outcome::Int(500)),
            op(1, "b", "k2", acq(100), (300, 301), Outcome::Int(400)),
        ],
        ..Default::default()
    };
    assert_eq!(unexcused(&check(&h)), [Check::FenceOrder]);
    h.faults.push(fault(ClockStep, (0, 0)));
    assert_eq!(unexcused(&check(&h)), [Check::FenceOrder], "a step alone");
    h.faults.push(fault(Restart, (100, 200)));
    assert_eq!(unexcused(&check(&h)), [Check::FenceOrder], "no data lost");
    h.faults.push(fault(RestartWiped, (100, 200)));
    let v = check(&h);
    assert!(unexcused(&v).is_empty(), "{v:#?}");
    assert_eq!(v.violations[0].excused_by, Some(ClockStep));
    // The step must come before the earlier grant.
    h.faults.retain(|f| f.class != ClockStep);
    h.faults.push(fault(ClockStep, (250, 260)));
    assert_eq!(unexcused(&check(&h)), [Check::FenceOrder]);
    // The same token's renewal that finds its lease gone after the data
    // was lost gets a new, lower fence: the loss came after the token's
    // last op but before that renewal was answered.
    let mut again = History {
        ops: vec![
            op(0, "a", "k", acq(100), (0, 1), Outcome::Int(500)),
            op(0, "a", "k", Kind::Fence, (2, 3), Outcome::Int(500)),
            op(0, "a", "k", acq(100), (300, 301), Outcome::Int(400)),
        ],
        faults: vec![fault(ClockStep, (0, 0))],
        ..Default::default()
    };
    assert_eq!(unexcused(&check(&again)), [Check::FenceOrder]);
    again.faults.push(fault(RestartWiped, (100, 200)));
    assert!(unexcused(&check(&again)).is_empty());
    // Two holders at once are never a clock step's doing.
    let two = History {
        ops: vec![
            op(0, "a", "k", acq(1000), (0, 1), Outcome::Int(10)),
            op(1, "b", "k", acq(1000), (200, 201), Outcome::Int(20)),
        ],
        faults: vec![fault(ClockStep, (0, 300))],
        ..Default::default()
    };
    assert_eq!(unexcused(&check(&two)), [Check::Exclusion]);
}

/// A lease written during a clock step and then read after a restart or by
/// a promoted replica may be short by the step (README, Leases and
/// clocks): excused only with both, the write inside the step.
#[test]
fn checker_excuses_two_holders_only_after_a_stepped_write_and_a_handover() {
    let mut h = History {
        ops: vec![
            op(0, "a", "k", acq(1000), (100, 101), Outcome::Int(10)),
            op(1, "b", "k", acq(1000), (500, 501), Outcome::Int(20)),
        ],
        ..Default::default()
    };
    assert_eq!(unexcused(&check(&h)), [Check::Exclusion]);
    h.faults.push(fault(Restart, (300, 310)));
    assert_eq!(unexcused(&check(&h)), [Check::Exclusion], "a restart alone");
    h.faults.push(fault(ClockStep, (150, 250)));
    assert_eq!(
        unexcused(&check(&h)),
        [Check::Exclusion],
        "a step after the write"
    );
    h.faults.push(fault(ClockStep, (50, 250)));
    let v = check(&h);
    assert!(unexcused(&v).is_empty(), "{v:#?}");
    assert_eq!(v.violations[0].excused_by, Some(ClockStep));
    // The handover must come after the step, before the second grant.
    h.faults.retain(|f| f.class != Restart);
    h.faults.push(fault(FailoverGraceful, (600, 610)));
    assert_eq!(
        unexcused(&check(&h)),
        [Check::Exclusion],
        "handover too late"
    );
}

#[test]
fn checker_reports_a_wrong_fence_or_key_right_after_a_grant() {
    for (fence_reply, other_key_reply) in [
        (Outcome::Nil, Outcome::Nil),
        (Outcome::Int(11), Outcome::Nil),
        (Outcome::Int(10), Outcome::Int(10)),
    ] {
        let h = History {
            ops: vec![
                op(0, "a", "k", acq(1000), (0, 1), Outcome::Int(10)),
                op(0, "a", "k", Kind::Fence, (2, 3), fence_reply.clone()),
                op(0, "a", "j", Kind::Fence, (3, 4), other_key_reply.clone()),
            ],
            ..Default::default()
        };
        let expected = if other_key_reply == Outcome::Nil {
            Check::FenceAfterGrant
        } else {
            Check::WrongKey
        };
        assert_eq!(unexcused(&check(&h)), [expected]);
    }
    // Nil once the lease can have ended is fine.
    let h = History {
        ops: vec![
            op(0, "a", "k", acq(100), (0, 1), Outcome::Int(10)),
            op(0, "a", "k", Kind::Fence, (120, 121), Outcome::Nil),
        ],
        ..Default::default()
    };
    assert!(check(&h).violations.is_empty());
}

#[test]
fn checker_reports_a_stale_write_the_resource_accepted() {
    // b was granted after a's lease, with a lower fence; the resource then
    // takes a's late write over b's.
    let mut h = History {
        ops: vec![
            op(0, "a", "k", acq(100), (0, 1), Outcome::Int(30)),
            op(1, "b", "k", acq(100), (300, 301), Outcome::Int(20)),
        ],
        writes: vec![
            Write {
                key: "k".into(),
                token: "b".into(),
                fence: 20,
                accepted: true,
                at: 310_000,
            },
            Write {
                key: "k".into(),
                token: "a".into(),
                fence: 30,
                accepted: true,
                at: 320_000,
            },
        ],
        ..Default::default()
    };
    let v = unexcused(&check(&h));
    assert!(v.contains(&Check::StaleWrite), "{v:?}");
    // Unless fences went back the documented way (a clock step ahead
    // before a's grant, data lost before b's), as the fence check excuses.
    h.faults.push(fault(ClockStep, (0, 0)));
    h.faults.push(fault(RestartWiped, (100, 200)));
    let v = check(&h);
    assert!(unexcused(&v).is_empty(), "{v:#?}");
    assert!(v.violations.iter().any(|x| x.check == Check::StaleWrite));
}

#[test]
fn checker_reports_barging_and_a_stranded_waiter() {
    let wait = Kind::Acquire {
        ttl: 1000,
        block: Some(1000),
        mode: Mode::Exclusive,
    };
    // X takes the key without BLOCK while W waits in line.
    let mut h = History {
        ops: vec![
            op(0, "w", "k", wait, (0, 1000), Outcome::Nil),
            op(1, "x", "k", acq(100), (400, 401), Outcome::Int(7)),
        ],
        ..Default::default()
    };
    assert_eq!(unexcused(&check(&h)), [Check::Barging]);
    h.faults.push(fault(Swapdb, (100, 200)));
    assert!(unexcused(&check(&h)).is_empty(), "SWAPDB moves the line");
    // H releases while W alone waits; W times out all the same.
    let h = History {
        ops: vec![
            op(0, "h", "k", acq(5000), (0, 1), Outcome::Int(1)),
            op(1, "w", "k", wait, (10, 1010), Outcome::Nil),
            op(0, "h", "k", Kind::Release, (400, 401), Outcome::Int(1)),
        ],
        ..Default::default()
    };
    assert_eq!(unexcused(&check(&h)), [Check::Stranded]);
    // Unless another waiter may have been ahead of W and still in line...
    let mut ahead = h.clone();
    ahead
        .ops
        .push(op(2, "v", "k", wait, (5, 402), Outcome::Int(2)));
    assert!(check(&ahead).violations.is_empty());
    // ...which one sent after W was certainly in line, or one that had
    // left, was not.
    let short = Kind::Acquire {
        ttl: 1000,
        block: Some(200),
        mode: Mode::Exclusive,
    };
    for (kind, at, outcome) in [
        (wait, (100, 402), Outcome::Int(2)),
        (short, (5, 300), Outcome::Nil),
    ] {
        let mut other = h.clone();
        other.ops.push(op(2, "v", "k", kind, at, outcome));
        assert_eq!(unexcused(&check(&other)), [Check::Stranded]);
    }
    // A waiter never answered.
    let h = History {
        ops: vec![op(0, "w", "k", wait, (0, 12000), Outcome::NoReply)],
        ..Default::default()
    };
    assert_eq!(unexcused(&check(&h)), [Check::Stranded]);
}

/// As seen in a long run: a's lease lapsed on the old master (epoch 0),
/// which handed the key to b; that grant was lost in a failover to a
/// replica (epoch 1) that still had a's older, longer lease, so a's next
/// EXTEND succeeded there. a never acted as holder while b did: a gap in
/// a's windows is not bridged.
#[test]
fn checker_does_not_bridge_a_gap_in_a_holders_lease() {
    let on = |epoch, op: Op| Op { epoch, ..op };
    let failover = Fault {
        promoted: Some(1),
        ..fault(FailoverLossyDelayed, (350, 1600))
    };
    let mut h = History {
        ops: vec![
            op(0, "a", "k", acq(1000), (0, 1), Outcome::Int(10)),
            op(
                0,
                "a",
                "k",
                Kind::Extend { ttl: 100 },
                (300, 301),
                Outcome::Int(1),
            ),
            op(
                1,
                "b",
                "k",
                Kind::Acquire {
                    ttl: 500,
                    block: Some(1000),
                    mode: Mode::Exclusive,
                },
                (50, 420),
                Outcome::Int(20),
            ),
            on(
                1,
                op(
                    0,
                    "a",
                    "k",
                    Kind::Extend { ttl: 500 },
                    (600, 601),
                    Outcome::Int(1),
                ),
            ),
            on(
                1,
                op(
                    1,
                    "b",
                    "k",
                    Kind::Extend { ttl: 500 },
                    (580, 581),
                    Outcome::Int(0),
                ),
            ),
        ],
        faults: vec![failover.clone()],
        ..Default::default()
    };
    let v = check(&h);
    assert!(unexcused(&v).is_empty(), "{v:#?}");
    // Had b not learnt it lost the lock, the two would have held it at
    // once: without the failover, a violation...
    h.ops[4] = on(
        1,
        op(
            1,
            "b",
            "k",
            Kind::Extend { ttl: 500 },
            (680, 681),
            Outcome::Int(1),
        ),
    );
    h.faults.clear();
    assert_eq!(unexcused(&check(&h)), [Check::Exclusion]);
    // ...with it, what a lossy failover does even with the restart delay:
    // a carried on with the lease the replica kept.
    h.faults.push(failover.clone());
    assert!(unexcused(&check(&h)).is_empty());
    // But a new grant by the promoted node while b's lost grant may still
    // run is what the restart delay must prevent.
    h.ops = vec![
        op(1, "b", "k", acq(1000), (0, 1), Outcome::Int(20)),
        on(1, op(2, "c", "k", acq(1000), (400, 401), Outcome::Int(30))),
    ];
    assert_eq!(unexcused(&check(&h)), [Check::Exclusion]);
}

#[test]
fn checker_reports_a_holder_losing_its_lock_early() {
    let mut h = History {
        ops: vec![
            op(0, "a", "k", acq(1000), (0, 1), Outcome::Int(10)),
            op(0, "a", "k", Kind::Fence, (2, 3), Outcome::Int(10)),
            op(
                0,
                "a",
                "k",
                Kind::Extend { ttl: 1000 },
                (500, 501),
                Outcome::Int(0),
            ),
        ],
        ..Default::default()
    };
    assert_eq!(unexcused(&check(&h)), [Check::LostEarly]);
    // A failover that lost writes excuses it, even with the restart delay.
    h.faults.push(fault(FailoverLossyDelayed, (100, 1200)));
    assert!(unexcused(&check(&h)).is_empty());
    // An EXTEND of unknown outcome may have shortened the lease.
    let h = History {
        ops: vec![
            op(0, "a", "k", acq(1000), (0, 1), Outcome::Int(10)),
            op(
                0,
                "a",
                "k",
                Kind::Extend { ttl: 30 },
                (100, 101),
                Outcome::Lost,
            ),
            op(0, "a", "k", Kind::Fence, (500, 501), Outcome::Nil),
        ],
        ..Default::default()
    };
    assert!(check(&h).violations.is_empty());
}

/// A `LOCK.ACQUIREALL` is one op per key with one fence: its keys are
/// followed as grants of one token (the shared fence is no reuse), a
/// multi-key waiter may wait on a free key for another one (not stranded),
/// but barging past it is still caught, and two holders of one of its
/// keys still are.
#[test]
fn checker_follows_multi_key_grants_and_waiters() {
    let all = |client, token: &str, key: &str, kind, at, outcome| Op {
        also: 1,
        ..op(client, token, key, kind, at, outcome)
    };
    let h = History {
        ops: vec![
            all(0, "a", "k", acq(1000), (0, 1), Outcome::Int(10)),
            all(0, "a", "j", acq(1000), (0, 1), Outcome::Int(10)),
            op(0, "a", "k", Kind::Fence, (2, 3), Outcome::Int(10)),
            op(0, "a", "j", Kind::Fence, (3, 4), Outcome::Int(10)),
            op(0, "a", "k", Kind::Release, (100, 101), Outcome::Int(1)),
            op(0, "a", "j", Kind::Release, (101, 102), Outcome::Int(1)),
            op(1, "b", "k", acq(1000), (200, 201), Outcome::Int(11)),
        ],
        ..Default::default()
    };
    let v = check(&h);
    assert!(v.violations.is_empty(), "{:?}", v.violations);
    // A waiter for k and j times out while k alone was released: fine.
    let wait = Kind::Acquire {
        ttl: 1000,
        block: Some(1000),
        mode: Mode::Exclusive,
    };
    let mut h = History {
        ops: vec![
            op(0, "h", "k", acq(5000), (0, 1), Outcome::Int(1)),
            op(2, "g", "j", acq(5000), (0, 1), Outcome::Int(2)),
            all(1, "w", "k", wait, (10, 1010), Outcome::Nil),
            all(1, "w", "j", wait, (10, 1010), Outcome::Nil),
            op(0, "h", "k", Kind::Release, (400, 401), Outcome::Int(1)),
        ],
        ..Default::default()
    };
    assert!(unexcused(&check(&h)).is_empty());
    // Taking k without BLOCK past it is barging.
    h.ops
        .push(op(3, "x", "k", acq(100), (500, 501), Outcome::Int(7)));
    assert_eq!(unexcused(&check(&h)), [Check::Barging]);
    // One of its keys granted while another token holds it: two holders.
    let h = History {
        ops: vec![
            op(0, "h", "k", acq(5000), (0, 1), Outcome::Int(1)),
            all(1, "w", "k", acq(1000), (10, 11), Outcome::Int(2)),
            all(1, "w", "j", acq(1000), (10, 11), Outcome::Int(2)),
        ],
        ..Default::default()
    };
    assert!(unexcused(&check(&h)).contains(&Check::Exclusion));
}

fn acq_in(ttl: i64, mode: Mode) -> Kind {
    Kind::Acquire {
        ttl,
        block: None,
        mode,
    }
}

#[test]
fn checker_counts_holders_against_the_smallest_capacity_of_their_modes() {
    let at = |token: &str, mode: Mode, ms: i64, fence: i64| {
        op(
            0,
            token,
            "k",
            acq_in(1000, mode),
            (ms, ms + 1),
            Outcome::Int(fence),
        )
    };
    // Readers together: fine. A writer among them: one violation naming
    // every holder at that moment.
    let mut h = History {
        ops: vec![
            at("r1", Mode::Shared, 0, 10),
            at("r2", Mode::Shared, 100, 11),
            at("r3", Mode::Shared, 200, 12),
        ],
        ..Default::default()
    };
    assert!(check(&h).violations.is_empty());
    h.ops.push(at("w", Mode::Exclusive, 300, 13));
    let v = check(&h);
    assert_eq!(unexcused(&v), [Check::Exclusion]);
    assert_eq!(v.violations[0].about.len(), 4, "{:?}", v.violations);
    // Two permits of LIMIT 2 together: fine; a third: a violation,
    // unless one of the others had let go first.
    let mut h = History {
        ops: vec![
            at("p1", Mode::Limit(2), 0, 10),
            at("p2", Mode::Limit(2), 100, 11),
        ],
        ..Default::default()
    };
    assert!(check(&h).violations.is_empty());
    h.ops.push(at("p3", Mode::Limit(2), 200, 12));
    assert_eq!(unexcused(&check(&h)), [Check::Exclusion]);
    h.ops
        .push(op(0, "p1", "k", Kind::Release, (150, 151), Outcome::Int(1)));
    h.ops.sort_by_key(|o| o.send);
    assert!(check(&h).violations.is_empty());
    // A writer's window that ended before the readers came: fine.
    let h = History {
        ops: vec![
            at("w", Mode::Exclusive, 0, 10),
            op(0, "w", "k", Kind::Release, (50, 51), Outcome::Int(1)),
            at("r1", Mode::Shared, 100, 11),
            at("r2", Mode::Shared, 120, 12),
        ],
        ..Default::default()
    };
    assert!(check(&h).violations.is_empty());
}

#[test]
fn checker_does_not_call_a_writer_stranded_behind_other_readers() {
    let wait = |mode| Kind::Acquire {
        ttl: 1000,
        block: Some(300),
        mode,
    };
    // r1 and r2 read k; w waits; r1 releases (r2 still reads); w times
    // out. On a read/write key that is no stranding.
    let ops = |mode_of_w: Mode, mode_of_r: Mode| {
        vec![
            op(
                0,
                "r1",
                "k",
                acq_in(1000, mode_of_r),
                (0, 1),
                Outcome::Int(10),
            ),
            op(
                1,
                "r2",
                "k",
                acq_in(1000, mode_of_r),
                (2, 3),
                Outcome::Int(11),
            ),
            op(2, "w", "k", wait(mode_of_w), (10, 311), Outcome::Nil),
            op(0, "r1", "k", Kind::Release, (100, 101), Outcome::Int(1)),
        ]
    };
    let rw = History {
        ops: ops(Mode::Exclusive, Mode::Shared),
        ..Default::default()
    };
    assert!(unexcused(&check(&rw)).is_empty());
    // On a semaphore of two, the release freed a permit for w: stranded.
    let sem = History {
        ops: ops(Mode::Limit(2), Mode::Limit(2)),
        ..Default::default()
    };
    assert_eq!(unexcused(&check(&sem)), [Check::Stranded]);
}
