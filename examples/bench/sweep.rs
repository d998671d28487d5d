//! Section 6: the background sweep at scale. A lock whose lease ended and
//! that nobody touches again is reclaimed by the sweep, which scans the
//! whole keyspace (RM_Scan, 1 ms slices, a second apart while it finds
//! nothing): how long that takes grows with the *other* keys of the server.
//! Measured per keyspace size: the sweep's rate (`lock_sweep_keys` over a
//! window), the time of one pass over the keyspace (keys / rate: the
//! longest an ended lock can stay), the delay of one ended lock measured
//! directly where a pass is short enough, and the server's CPU time with no
//! lock held (the sweep stops) and with one (the sweep runs).

use std::fmt::Write;
use std::time::{Duration, Instant};

use redis_lock_testkit as common;

use common::Server;

struct Row {
    others: u64,
    rate: f64,
    pass_s: f64,
    measured_s: Option<f64>,
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
        let _: () = redis::cmd("DEBUG")
            .arg("POPULATE")
            .arg(others)
            .arg("other")
            .query(&mut c)
            .expect("DEBUG POPULATE");
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
    // An ended lock nobody touches: how long until it is gone, where a
    // pass is short enough to wait for.
    let measured_s = (pass_s * 2.0 < measure_up_to.as_secs_f64()).then(|| {
        common::acquire(&mut c, "ended", "t", 100).expect("a grant");
        let ended_at = Instant::now() + Duration::from_millis(100);
        std::thread::sleep(Duration::from_millis(100));
        let limit = Instant::now() + measure_up_to;
        while Instant::now() < limit {
            let exists: i64 = redis::cmd("EXISTS").arg("ended").query(&mut c).unwrap();
            if exists == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        ended_at.elapsed().as_secs_f64()
    });
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

pub fn section(doc: &mut String, smoke: bool) {
    let (sizes, window, up_to): (&[u64], _, _) = if smoke {
        (
            &[10_000],
            Duration::from_millis(1500),
            Duration::from_secs(5),
        )
    } else {
        (
            &[0, 100_000, 1_000_000, 10_000_000],
            Duration::from_secs(10),
            Duration::from_secs(120),
        )
    };
    let binary = common::shown_path(&common::server_binary());
    writeln!(doc, "## 6. The sweep at scale\n").unwrap();
    writeln!(
        doc,
        "`cargo run --release --example bench -- --only sweep` (part of `make bench`), on `{binary}`: \
         one server per row, filled with N other keys (`DEBUG POPULATE N`). The sweep's rate is \
         `lock_sweep_keys` over {:.0} s with one lock held; a pass over the keyspace takes \
         (N + 1) / rate, the longest an ended lock that nobody touches can stay (about half of it \
         on average); the delay is measured directly where a pass is short enough to wait for. \
         CPU is the server's (user + system) per second of wall time, with no lock held (the \
         sweep does not run) and with one.\n",
        window.as_secs_f64()
    )
    .unwrap();
    writeln!(
        doc,
        "| other keys | sweep rate (keys/s) | one pass | an ended lock stayed (measured) | server CPU, no lock | server CPU, one lock held |\n|---|---|---|---|---|---|"
    )
    .unwrap();
    for &n in sizes {
        let r = row(n, window, up_to);
        writeln!(
            doc,
            "| {} | {:.0} | {} | {} | {:.2}% | {:.2}% |",
            r.others,
            r.rate,
            duration(r.pass_s),
            r.measured_s.map_or("not waited for".into(), duration),
            r.cpu_idle * 100.0,
            r.cpu_sweeping * 100.0,
        )
        .unwrap();
    }
    writeln!(
        doc,
        "\nKeys with waiters do not depend on the sweep (their hand-off is timed by the node), \
         nor does any lock a command touches (reclaimed then). Why there is no index that would \
         make reclamation independent of the other keys: ARCHITECTURE.md, The sweep.\n"
    )
    .unwrap();
}
