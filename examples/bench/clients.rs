//! Section 10: the Python and Node.js packages against what their users
//! pick today, 16 clients contending for one key with a 2 ms hold. Python:
//! this package against redis-py's `Lock`, python-redis-lock and pottery's
//! Redlock (one master); Node.js (ioredis): this package against node-redlock
//! 4.2, @sesamecare-oss/redlock and redis-semaphore's `Mutex`. The peers run
//! on a server without the module, this package on one with it, the same
//! binary, side by side in one run. The drivers are
//! `bench/clients/python_contention.py` and `bench/clients/node_contention.cjs`;
//! the peers are installed under target/bench-peers/ on first use.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use crate::common::{workspace_root, Server};
use crate::semaphore::{json_field, json_numbers, json_str, server_calls};
use crate::stats::{fairness, ms, Summary};
use crate::{target, Options};

const CLIENTS: usize = 16;
const HOLD_MS: u64 = 2;
const PY_PEERS: &[&str] = &["python-redis-lock==4.0.1", "pottery==3.0.1"];
const NODE_PEERS: &[&str] = &[
    "ioredis@5.9.2",
    "redlock@4.2.0",
    "@sesamecare-oss/redlock@1.4.0",
    "redis-semaphore@5.8.0",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lang {
    Python,
    Node,
}

struct Row {
    label: &'static str,
    lib: &'static str,
    ours: bool,
}

const PY_ROWS: [Row; 4] = [
    Row {
        label: "redis_lock_client (this package, waits in the server's line)",
        lib: "this",
        ours: true,
    },
    Row {
        label: "redis-py 8.1 `Lock` (sleeps 0.1 s between tries)",
        lib: "redis-py",
        ours: false,
    },
    Row {
        label: "python-redis-lock 4.0.1 (BLPOP signal)",
        lib: "python-redis-lock",
        ours: false,
    },
    Row {
        label: "pottery 3.0.1 `Redlock`, one master",
        lib: "pottery",
        ours: false,
    },
];

const NODE_ROWS: [Row; 4] = [
    Row {
        label: "redis-lock-client (this package, ioredis)",
        lib: "this",
        ours: true,
    },
    Row {
        label: "redlock 4.2.0 (node-redlock)",
        lib: "redlock",
        ours: false,
    },
    Row {
        label: "@sesamecare-oss/redlock 1.4.0",
        lib: "sesamecare-redlock",
        ours: false,
    },
    Row {
        label: "redis-semaphore 5.8.0 `Mutex`",
        lib: "redis-semaphore",
        ours: false,
    },
];

/// Why the p99 target cannot be met against a fair peer; kept with the
/// generator so it is rewritten with every run.
const CLIENTS_NOTES: &str = "\
**The p99 floor of a fair line.** With 16 clients, one key and a hold of about 2.3 ms (the 2 ms \
sleep and the hand-off), a client in a first-come first-served line waits behind the 15 others: \
about 15 × 2.3 ≈ 35 ms for every grant, at p50 and p99 alike. python-redis-lock's BLPOP signal \
is such a line too (its waiters are woken in order), so its p99 is at that floor, and a third of \
it is below what any fair lock can give here; what this package adds against it is the \
commands (2 per grant against 10) and the fencing token. The peers that poll have a p99 far \
above it because they are unfair: some clients get the lock again and again while others wait \
for seconds.";

struct Outcome {
    grants: u64,
    seconds: f64,
    commands: u64,
    waits: Summary,
    per_client: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
}

impl Outcome {
    fn grants_per_sec(&self) -> f64 {
        self.grants as f64 / self.seconds.max(1e-9)
    }
    fn commands_per_grant(&self) -> f64 {
        self.commands as f64 / (self.grants.max(1)) as f64
    }
    fn fairness(&self) -> f64 {
        let min = self.per_client.iter().copied().min().unwrap_or(0);
        let max = self.per_client.iter().copied().max().unwrap_or(0);
        if min == 0 {
            f64::INFINITY
        } else {
            max as f64 / min as f64
        }
    }
}

fn python_bin() -> PathBuf {
    workspace_root().join("target/clients/python-venv/bin/python")
}

/// What each language needs, installed on first use: None with why not.
fn setup(lang: Lang, with_peers: bool) -> Result<(), String> {
    let root = workspace_root();
    match lang {
        Lang::Python => {
            if !python_bin().exists() {
                return Err(
                    "no target/clients/python-venv (scripts/prereqs.sh test makes it)".into(),
                );
            }
            let run = |args: &[&str]| -> Result<(), String> {
                let out = Command::new(python_bin())
                    .args(args)
                    .current_dir(&root)
                    .output()
                    .map_err(|e| e.to_string())?;
                match out.status.success() {
                    true => Ok(()),
                    false => Err(String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                        .to_string()),
                }
            };
            run(&[
                "-m",
                "pip",
                "install",
                "-q",
                "--force-reinstall",
                "--no-deps",
                "--no-build-isolation",
                "./clients/python",
            ])?;
            if with_peers
                && !root
                    .join("target/bench-peers/python-clients/pottery")
                    .exists()
            {
                let mut args = vec![
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--target",
                    "target/bench-peers/python-clients",
                ];
                args.extend_from_slice(PY_PEERS);
                run(&args)?;
            }
            Ok(())
        }
        Lang::Node => {
            if !root.join("clients/node/node_modules/ioredis").exists() {
                return Err(
                    "clients/node has no node_modules (scripts/prereqs.sh test runs npm ci)".into(),
                );
            }
            if with_peers
                && !root
                    .join("target/bench-peers/node-clients/node_modules/redis-semaphore")
                    .exists()
            {
                let out = Command::new("npm")
                    .args([
                        "install",
                        "--no-audit",
                        "--no-fund",
                        "--prefix",
                        "target/bench-peers/node-clients",
                    ])
                    .args(NODE_PEERS)
                    .current_dir(&root)
                    .output()
                    .map_err(|e| e.to_string())?;
                if !out.status.success() {
                    return Err(format!(
                        "npm install: {}",
                        String::from_utf8_lossy(&out.stderr)
                            .lines()
                            .next()
                            .unwrap_or("")
                    ));
                }
            }
            Ok(())
        }
    }
}

fn run(lang: Lang, row: &Row, server: &Server, seconds: f64) -> Result<Outcome, String> {
    let root = workspace_root();
    let mut c = server.conn();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let request = format!(
        "{{\"port\":{},\"lib\":\"{}\",\"clients\":{CLIENTS},\"hold_ms\":{HOLD_MS},\"seconds\":{seconds},\"package\":\"{}\"}}",
        server.port,
        row.lib,
        root.join("clients/node").display()
    );
    let before = server_calls(&mut c);
    let out = match lang {
        Lang::Python => Command::new(python_bin())
            .arg(root.join("bench/clients/python_contention.py"))
            .arg(&request)
            .env("PYTHONPATH", root.join("target/bench-peers/python-clients"))
            .output(),
        Lang::Node => Command::new("node")
            .arg(root.join("bench/clients/node_contention.cjs"))
            .arg(&request)
            .env(
                "NODE_PATH",
                format!(
                    "{}:{}",
                    root.join("target/bench-peers/node-clients/node_modules")
                        .display(),
                    root.join("clients/node/node_modules").display()
                ),
            )
            .output(),
    }
    .map_err(|e| e.to_string())?;
    let after = server_calls(&mut c);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr)
            .lines()
            .last()
            .unwrap_or("no output")
            .to_string());
    }
    let json = String::from_utf8_lossy(&out.stdout).to_string();
    let num = |k: &str| {
        json_field(&json, k)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or(format!("no {k}"))
    };
    let mut waits = json_numbers(&json, "waits_us").ok_or("no waits")?;
    Ok(Outcome {
        grants: num("grants")? as u64,
        seconds: num("seconds")?,
        commands: after - before,
        waits: Summary::of(&mut waits),
        per_client: json_numbers(&json, "per_client").ok_or("no per_client")?,
        errors: num("errors")? as u64,
        first_error: json_str(&json, "first_error"),
    })
}

pub fn section(doc: &mut String, o: &Options) {
    let seconds = if o.smoke { 1.0 } else { o.seconds };
    writeln!(
        doc,
        "## 10. The Python and Node.js packages against their peers\n"
    )
    .unwrap();
    writeln!(
        doc,
        "{CLIENTS} clients (threads in Python, each with its own redis-py client; one Node.js process, \
         each client its own ioredis connection) loop acquire → hold {HOLD_MS} ms → release on one key \
         for {seconds:.1} s per row. Each library keeps its own way of waiting, with up to 10 s to \
         wait and a 10 s lease. The peers run on a server **without** the module, this package on one \
         with it (the same binary, `{}`). *Server commands* are INFO commandstats calls per grant \
         (every command a script runs counts; connection setup does not). *Wait* is from the call to \
         the grant; *fairness* is the most grants of any client divided by the fewest. Drivers: \
         `bench/clients/python_contention.py`, `bench/clients/node_contention.cjs`.\n",
        crate::common::shown_path(&crate::common::server_binary())
    )
    .unwrap();
    let with = Server::builder().config("maxclients", "10000").start();
    let without = Server::builder()
        .config("maxclients", "10000")
        .without_module()
        .start();
    let mut targets = Vec::new();
    for (lang, name, rows) in [
        (Lang::Python, "Python", &PY_ROWS),
        (Lang::Node, "Node.js", &NODE_ROWS),
    ] {
        writeln!(doc, "### {name}\n").unwrap();
        if let Err(why) = setup(lang, !o.smoke) {
            writeln!(doc, "Not run: {why}.\n").unwrap();
            continue;
        }
        writeln!(doc, "| client | grants/s | server cmds/grant | wait p50 ms | wait p99 ms | grants min/max per client | fairness | errors |").unwrap();
        writeln!(doc, "|---|---|---|---|---|---|---|---|").unwrap();
        let mut results = Vec::new();
        for row in rows.iter().filter(|r| r.ours || !o.smoke) {
            let server = if row.ours { &with } else { &without };
            match run(lang, row, server, seconds) {
                Ok(out) => {
                    let (min, fair) = fairness(&out.per_client);
                    let max = out.per_client.iter().copied().max().unwrap_or(0);
                    writeln!(
                        doc,
                        "| {} | {:.0} | {:.2} | {} | {} | {min}/{max} | {fair} | {}{} |",
                        row.label,
                        out.grants_per_sec(),
                        out.commands_per_grant(),
                        ms(out.waits.p50),
                        ms(out.waits.p99),
                        out.errors,
                        out.first_error
                            .as_deref()
                            .map(|e| format!(" ({e})"))
                            .unwrap_or_default(),
                    )
                    .unwrap();
                    results.push((row.ours, out));
                }
                Err(e) => writeln!(doc, "| {} | failed: {e} | | | | | | |", row.label).unwrap(),
            }
        }
        let ours = results.iter().find(|(o, _)| *o).map(|(_, r)| r);
        let peers: Vec<&Outcome> = results
            .iter()
            .filter(|(o, _)| !*o)
            .map(|(_, r)| r)
            .collect();
        if let (Some(ours), false) = (ours, peers.is_empty()) {
            let best_rate = peers.iter().map(|p| p.grants_per_sec()).fold(0.0, f64::max);
            let best_p99 = peers.iter().map(|p| p.waits.p99).min().unwrap_or(0);
            targets.push(target(
                &format!("{name}: grants/s at least the best peer's ({best_rate:.0})"),
                format!("{:.0}", ours.grants_per_sec()),
                ours.grants_per_sec() >= best_rate,
            ));
            targets.push(target(
                &format!("{name}: server commands per grant ≤ 2.0"),
                format!("{:.2}", ours.commands_per_grant()),
                ours.commands_per_grant() <= 2.0,
            ));
            targets.push(target(
                &format!(
                    "{name}: wait p99 at most a third of the best peer's ({} ms)",
                    ms(best_p99)
                ),
                format!("{} ms", ms(ours.waits.p99)),
                ours.waits.p99 * 3 <= best_p99,
            ));
            targets.push(target(
                &format!("{name}: fairness ≤ 1.2"),
                format!("{:.2}", ours.fairness()),
                ours.fairness() <= 1.2,
            ));
        }
        writeln!(doc).unwrap();
    }
    if !targets.is_empty() {
        writeln!(doc, "### Targets (issue 32)\n").unwrap();
        for t in &targets {
            writeln!(doc, "- {t}").unwrap();
        }
        writeln!(doc, "\n{CLIENTS_NOTES}\n").unwrap();
    }
}
