//! Section 6: ended locks nobody touches, at scale. The node files every
//! lease by its end and its timer reclaims the lock when that comes; the
//! background sweep (RM_Scan over the whole keyspace, 1 ms slices, a
//! second apart while it finds nothing) stays as the backstop for locks the
//! index cannot see (renamed or moved keys). Measured per keyspace size:
//! how long past their lease's end ended locks stayed (50 of them, polled
//! every 5 ms), the sweep's rate and pass, and the server's CPU time with
//! no lock held and with one. Then fire-and-forget side by side: locks
//! taken at a steady rate with a 1 s lease and never released, against
//! `SET NX PX` keys on a server without the module, counting what is left
//! in the keyspace.

use std::fmt::Write;
use std::time::{Duration, Instant};

use redis_lock_testkit as common;

use common::Server;

struct Row {
    others: u64,
    rate: f64,
    pass_s: f64,
    /// Ended locks' stay past their lease's end: median and longest.
    measured_s: (f64, f64),
    cpu_idle: f64,
    cpu_sweeping: f64,
}

/// The server process's CPU time (user + system), seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces): state is field 3.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15: 11 and 12 after the state.
    // SAFETY: sysconf takes a constant and reads nothing of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) / hz
}

/// CPU time per second of wall time over `window`, and `lock_sweep_keys`
/// per second over the same window.
fn measure(server: &Server, window: Duration) -> (f64, f64) {
    let pid = server.pid();
    let (cpu0, keys0, t0) = (
        cpu_seconds(pid),
        server.info_field("sweep_keys"),
        Instant::now(),
    );
    std::thread::sleep(window);
    let secs = t0.elapsed().as_secs_f64();
    let cpu = (cpu_seconds(pid) - cpu0) / secs;
    let keys = (server.info_field("sweep_keys") - keys0) as f64 / secs;
    (cpu, keys)
}

fn row(others: u64, window: Duration, measure_up_to: Duration) -> Row {
    let server = Server::start();
    let mut c = server.conn();
    if others > 0 {
        common::populate(&mut c, others);
    }
    // No lock: the sweep does not run.
    std::thread::sleep(Duration::from_millis(500));
    let (cpu_idle, _) = measure(&server, window);
    // One held lock: the sweep runs, looking at every key in turn.
    common::acquire(&mut c, "held", "t", 3_600_000).expect("a grant");
    let (cpu_sweeping, rate) = measure(&server, window);
    let pass_s = if rate > 0.0 {
        (others + 1) as f64 / rate
    } else {
        f64::INFINITY
    };
    // Ended locks nobody touches: how long past its lease's end each one
    // stayed (50 locks, leases 20 ms apart, all polled every 5 ms).
    let measured_s = {
        let names: Vec<String> = (0..50).map(|i| format!("ended:{i}")).collect();
        let started = Instant::now();
        let mut ends = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let ttl = 200 + 20 * i as i64;
            common::acquire(&mut c, name, "t", ttl).expect("a grant");
            ends.push(started + Duration::from_millis(ttl as u64));
        }
        let mut gone: Vec<Option<Instant>> = vec![None; names.len()];
        let limit = Instant::now() + measure_up_to;
        while gone.iter().any(Option::is_none) && Instant::now() < limit {
            let mut pipe = redis::pipe();
            for name in &names {
                pipe.cmd("EXISTS").arg(name);
            }
            let there: Vec<i64> = pipe.query(&mut c).unwrap();
            let now = Instant::now();
            for (g, e) in gone.iter_mut().zip(there) {
                if g.is_none() && e == 0 {
                    *g = Some(now);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut delays: Vec<f64> = gone
            .iter()
            .zip(&ends)
            .map(|(g, e)| {
                g.map_or(f64::INFINITY, |g| {
                    g.saturating_duration_since(*e).as_secs_f64()
                })
            })
            .collect();
        delays.sort_by(f64::total_cmp);
        (delays[delays.len() / 2], delays[delays.len() - 1])
    };
    Row {
        others,
        rate,
        pass_s,
        measured_s,
        cpu_idle,
        cpu_sweeping,
    }
}

fn duration(s: f64) -> String {
    match s {
        s if !s.is_finite() => "never".into(),
        s if s < 1.0 => format!("{:.0} ms", s * 1000.0),
        s if s < 120.0 => format!("{s:.1} s"),
        s if s < 7200.0 => format!("{:.0} min", s / 60.0),
        s => format!("{:.1} h", s / 3600.0),
    }
}

/// Fire-and-forget: `rate` locks a second with a 1 s lease, never
/// released, for `run`, on a server holding `others` other keys: how many
/// ended ones are still in the keyspace at the end, and `after` later.
fn fire_and_forget(
    module: bool,
    others: u64,
    rate: u64,
    run: Duration,
    after: Duration,
) -> (i64, i64) {
    let server = match module {
        true => Server::start(),
        false => Server::builder().without_module().start(),
    };
    let mut c = server.conn();
    common::populate(&mut c, others);
    let started = Instant::now();
    let mut taken: u64 = 0;
    while started.elapsed() < run {
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        let mut pipe = redis::pipe();
        for i in taken..due {
            let key = format!("job:{i}");
            match module {
                true => pipe.cmd("LOCK.ACQUIRE").arg(key).arg("t").arg(1000),
                false => pipe
                    .cmd("SET")
                    .arg(key)
                    .arg("t")
                    .arg("NX")
                    .arg("PX")
                    .arg(1000),
            };
            pipe.ignore();
        }
        if due > taken {
            let _: () = pipe.query(&mut c).unwrap();
            taken = due;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let left = |c: &mut redis::Connection| {
        let n: i64 = redis::cmd("DBSIZE").query(c).unwrap();
        // Those of the last second are live: ended ones are the rest.
        (n - others as i64 - rate as i64).max(0)
    };
    let at_end = left(&mut c);
    std::thread::sleep(after);
    let later: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    (at_end, (later - others as i64).max(0))
}

pub fn section(doc: &mut String, smoke: bool) {
    let (sizes, window, up_to): (&[u64], _, _) = if smoke {
        (
            &[10_000],
            Duration::from_millis(1500),
            Duration::from_secs(5),
        )
    } else {
        (
            &[0, 1_000_000, 10_000_000],
            Duration::from_secs(10),
            Duration::from_secs(30),
        )
    };
    let binary = common::shown_path(&common::server_binary());
    writeln!(doc, "## 6. Ended locks nobody touches, at scale\n").unwrap();
    writeln!(
        doc,
        "`cargo run --release --example bench -- --only sweep` (part of `make bench`), on `{binary}`: \
         one server per row, filled with N other keys (`DEBUG POPULATE N`). *Stayed past the \
         lease* is how long 50 locks nobody touched were still in the keyspace after their \
         lease ended (leases 20 ms apart, every key polled with `EXISTS` every 5 ms): the node \
         files every lease by its end (slots of 64 ms) and its timer reclaims it. The sweep \
         remains as a backstop (for a lock key renamed or moved, which the index does not \
         follow): its rate is `lock_sweep_keys` over {:.0} s with one lock held, and a pass \
         over the keyspace takes (N + 1) / rate. CPU is the server's (user + system) per second \
         of wall time, with no lock held (the sweep does not run) and with one.\n",
        window.as_secs_f64()
    )
    .unwrap();
    writeln!(
        doc,
        "| other keys | ended locks stayed past the lease (median / longest) | sweep rate (keys/s) | one sweep pass | server CPU, no lock | server CPU, one lock held |\n|---|---|---|---|---|---|"
    )
    .unwrap();
    for &n in sizes {
        let r = row(n, window, up_to);
        writeln!(
            doc,
            "| {} | {} / {} | {:.0} | {} | {:.2}% | {:.2}% |",
            r.others,
            duration(r.measured_s.0),
            duration(r.measured_s.1),
            r.rate,
            duration(r.pass_s),
            r.cpu_idle * 100.0,
            r.cpu_sweeping * 100.0,
        )
        .unwrap();
    }
    let (others, rate, run, after) = match smoke {
        true => (10_000, 100, Duration::from_secs(3), Duration::from_secs(2)),
        false => (
            1_000_000,
            500,
            Duration::from_secs(60),
            Duration::from_secs(30),
        ),
    };
    writeln!(
        doc,
        "\n**Fire-and-forget, side by side.** {others} other keys; {rate} locks a second, each a new \
         key with a 1 s lease, never released, for {} s; then the ended ones still in the keyspace \
         (all keys but the other ones and the last second's {rate} live ones), and {} s later. \
         `SET NX PX` keys on a server of the same binary without the module are Redis's own \
         expiry at work.\n",
        run.as_secs(),
        after.as_secs()
    )
    .unwrap();
    writeln!(
        doc,
        "| | ended locks left at the end | {} s later |\n|---|---|---|",
        after.as_secs()
    )
    .unwrap();
    for (module, what) in [(true, "LOCK.ACQUIRE"), (false, "SET NX PX, no module")] {
        let (at_end, later) = fire_and_forget(module, others, rate, run, after);
        writeln!(doc, "| {what} | {at_end} | {later} |").unwrap();
    }
    writeln!(
        doc,
        "\nKeys with waiters never depended on the sweep (their hand-off is timed by the node), \
         nor does any lock a command touches (reclaimed then). ARCHITECTURE.md (Ended locks) \
         says how the index works and what it costs.\n"
    )
    .unwrap();
}
