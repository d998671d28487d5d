//! The history: what the clients did (operations with the times they were
//! sent and answered, and their replies), what the fenced resource saw,
//! which faults the nemesis injected and when, and the master's epochs.
//! Plain data: [`crate::checker`] reads it, [`crate::report`] counts it.

use crate::checker::Violation;

/// Microseconds since the start of the run (the test's monotonic clock).
pub type Us = i64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
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

/// How an ACQUIRE asks for its key(s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// A plain ACQUIRE: one holder at a time.
    Exclusive,
    /// `SHARED`: any number of shared holders, no exclusive one.
    Shared,
    /// `SHARED LIMIT n`: at most n holders (a semaphore).
    Limit(u32),
}

impl Mode {
    /// How many holders a key may have at once while this one holds it.
    pub fn capacity(self) -> usize {
        match self {
            Mode::Exclusive => 1,
            Mode::Shared => usize::MAX,
            Mode::Limit(n) => n as usize,
        }
    }

    /// The ACQUIRE's arguments that ask for it.
    pub fn args(self) -> Vec<String> {
        match self {
            Mode::Exclusive => vec![],
            Mode::Shared => vec!["SHARED".into()],
            Mode::Limit(n) => vec!["SHARED".into(), "LIMIT".into(), n.to_string()],
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Acquire {
        ttl: i64,
        block: Option<i64>,
        mode: Mode,
    },
    Extend {
        ttl: i64,
    },
    Release,
    /// `LOCK.FENCE key token`.
    Fence,
}

#[derive(Clone, Debug)]
pub struct Op {
    pub client: usize,
    /// Which incarnation of which node served it (see [`Epoch`]).
    pub epoch: u32,
    pub key: String,
    pub token: String,
    pub kind: Kind,
    pub send: Us,
    pub reply: Us,
    pub outcome: Outcome,
    /// How many other keys the same command named: a `LOCK.ACQUIREALL` of
    /// n keys is recorded as n ops, one per key, with the same times and
    /// reply, each with `also` = n - 1. 0 for a one-key command.
    pub also: usize,
}

/// A write to the fenced resource, in the order the resource saw them.
#[derive(Clone, Debug)]
pub struct Write {
    pub key: String,
    pub token: String,
    pub fence: i64,
    pub accepted: bool,
    pub at: Us,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultClass {
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
    pub const ALL: [FaultClass; 17] = [
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

    pub fn name(self) -> &'static str {
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

    pub fn what(self) -> &'static str {
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
pub struct Fault {
    pub class: FaultClass,
    pub start: Us,
    /// For faults that pause grants, the end of the pause.
    pub end: Us,
    pub key: Option<String>,
    pub client: Option<usize>,
    /// For a failover, the epoch of the node it promoted.
    pub promoted: Option<u32>,
}

/// One incarnation of the master: a restart or a failover starts a new one.
/// Ops after `end` on an epoch were served by a node no longer master.
#[derive(Clone, Copy, Debug)]
pub struct Epoch {
    pub id: u32,
    pub end: Us,
}

#[derive(Clone, Debug, Default)]
pub struct History {
    pub ops: Vec<Op>,
    pub writes: Vec<Write>,
    pub faults: Vec<Fault>,
    pub epochs: Vec<Epoch>,
}

impl History {
    pub fn epoch_end(&self, id: u32) -> Us {
        self.epochs
            .iter()
            .find(|e| e.id == id)
            .map_or(Us::MAX, |e| e.end)
    }

    /// The first fault (in the order of `classes`) of one of `classes` on
    /// `key` (or on every key) whose window meets `[from, to]`.
    pub fn excuse(
        &self,
        classes: &[FaultClass],
        key: &str,
        from: Us,
        to: Us,
    ) -> Option<FaultClass> {
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
    pub fn context(&self, v: &Violation) -> String {
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
