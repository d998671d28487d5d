//! The report: a summary on stdout after every run and, with
//! `HISTORY_REPORT`, the markdown of `docs/reliability.md`.

use std::collections::BTreeMap;
use std::thread;

use crate::checker::{grants, Check, Verdict, MARGIN};
use crate::model::{FaultClass, History, Kind, Mode, Op, Outcome};
use crate::workload::{CLIENTS, KEYS, RW_KEYS, SEMAPHORE, SEMAPHORE_LIMIT, TIMEOUTS, TTLS};

pub struct Report<'a> {
    pub history: &'a History,
    pub verdict: &'a Verdict,
    pub skipped: &'a BTreeMap<FaultClass, usize>,
    pub version: String,
    pub seed: u64,
    pub seconds: u64,
    pub rounds: usize,
}

impl Report<'_> {
    pub fn count(&self, f: impl Fn(&Op) -> bool) -> usize {
        self.history.ops.iter().filter(|op| f(op)).count()
    }

    /// Rows of (operation, [integer, nil or 0, error, lost, no reply, total]).
    fn op_rows(&self) -> Vec<(&'static str, [usize; 6])> {
        let names = [
            "LOCK.ACQUIRE",
            "LOCK.ACQUIRE ... BLOCK",
            "LOCK.ACQUIRE ... SHARED [BLOCK]",
            "LOCK.ACQUIRE ... SHARED LIMIT n [BLOCK]",
            "LOCK.EXTEND",
            "LOCK.RELEASE",
            "LOCK.FENCE key token",
            "LOCK.ACQUIREALL (2 or 3 keys)",
            "LOCK.ACQUIREALL ... BLOCK",
            "LOCK.ACQUIREALL ... SHARED [BLOCK]",
        ];
        let mut rows = [[0; 6]; 10];
        // A multi-key command is recorded once per key: counted once.
        let mut seen_all = std::collections::HashSet::new();
        for op in &self.history.ops {
            let row = match op.kind {
                Kind::Acquire { block, mode, .. } if op.also > 0 => {
                    if !seen_all.insert((op.token.as_str(), op.send)) {
                        continue;
                    }
                    match mode {
                        Mode::Exclusive => 7 + usize::from(block.is_some()),
                        _ => 9,
                    }
                }
                Kind::Acquire {
                    mode: Mode::Shared, ..
                } => 2,
                Kind::Acquire {
                    mode: Mode::Limit(_),
                    ..
                } => 3,
                Kind::Acquire { block: None, .. } => 0,
                Kind::Acquire { block: Some(_), .. } => 1,
                Kind::Extend { .. } => 4,
                Kind::Release => 5,
                Kind::Fence => 6,
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

    pub fn summary(&self) -> String {
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
                "  {name:<40} {:>6} int {:>6} nil/0 {:>5} err {:>5} lost {:>3} no-reply\n",
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

    pub fn markdown(&self) -> String {
        let command = format!(
            "REDIS_SERVER={} HISTORY_SECONDS={} HISTORY_REPORT={} cargo test --release --test history -- --nocapture",
            redis_lock_testkit::shown_path(&std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())),
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
             `make test` runs the same test (`tests/history/`) for about ten seconds against \
             Redis 7.0, Valkey 8 and Redis 8.2 (clock steps only on the last two).\n\n",
            self.version, self.seed, self.seed
        );
        s += &format!(
            "{CLIENTS} clients (threads) ran for {} s on exclusive locks {}, read/write locks {} \
             (readers `SHARED` 70% of the time, writers plain) and a semaphore {} (every holder \
             `SHARED LIMIT {}`), with leases of {} ms: \
             `LOCK.ACQUIRE` with and without `BLOCK` (timeouts {} ms), a fifth of the \
             time `LOCK.ACQUIREALL` of two or three of the exclusive keys and a tenth of the time \
             of both read/write keys (as readers or a writer), in a random order (held, \
             extended and released key by key), `LOCK.EXTEND` and \
             same-token `LOCK.ACQUIRE` renewals (which may shorten the lease), `LOCK.RELEASE` \
             (or letting the lease run out), and after every grant `LOCK.FENCE key token`, \
             `LOCK.FENCE other-key token` and, by exclusive holders, writes to a fenced resource, \
             some after a pause longer than the lease (shared holders pause the same way). A client whose connection died retries its ACQUIRE once \
             with the same token, and follows the master through restarts and failovers. \
             Both nodes run with `appendonly yes`, `appendfsync always`. The nemesis injected \
             {} whole rounds of every fault class below, each in random order, 0.1–0.4 s apart \
             (a restart or failover first waits for any restart delay in force to end). \
             Every time bound the checker uses is widened by {} ms.\n\n",
            self.seconds,
            KEYS.join(", "),
            RW_KEYS.join(", "),
            SEMAPHORE,
            SEMAPHORE_LIMIT,
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
              A violation is excused only by a fault the documentation (docs/guarantees.md) gives as unsafe for that \
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
              writes excuse no second holder, with one documented exception: a lease written \
              while the master's wall clock was stepped, then read after a restart or by the \
              promoted replica (whose clock was not stepped), may be short by the step, since \
              what is persisted and replicated is a wall-clock deadline ([Leases and \
              clocks](guarantees.md#leases-and-clocks); excused as clock-step). A clock step before a grant and data lost before \
              a later one is the one documented way fences go back (and a stale holder's write \
              with them). Excused violations are expected: they show the \
              faults did break what the documentation says they can break, while the fenced resource \
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
