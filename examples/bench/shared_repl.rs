//! What a change to a shared key costs behind a replica and an AOF, at 10,
//! 1,000 and 10,000 holders: the bytes the master sends its replica per
//! change (`master_repl_offset`), and the server's time per change (INFO
//! commandstats). A change replicates the one holder it adds, renews or
//! removes (`LOCK._HOLD`, `LOCK._DROP`), so neither figure should grow
//! with the holders; before, every change wrote the whole key.

use std::fmt::Write as _;

use crate::common::{info_number, Server};
use crate::{target, Options};

struct Row {
    holders: usize,
    changes: u64,
    bytes_per_change: f64,
    usec_per_change: f64,
}

/// The calls and total µs INFO commandstats gives `name`.
fn command_stats(c: &mut redis::Connection, name: &str) -> (u64, u64) {
    let info: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    let prefix = format!("cmdstat_{name}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|rest| {
            let field = |f: &str| -> u64 {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            (field("calls="), field("usec="))
        })
        .unwrap_or((0, 0))
}

fn measure(holders: usize, rounds: usize) -> Row {
    // Room for the newcomer beside 10,000 holders (the default bound).
    let master = Server::builder()
        .module_arg("max-holders-per-key", "20000")
        .config("appendonly", "yes")
        .config("appendfsync", "everysec")
        .start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut c = master.conn();
    let key = "readers";
    for chunk in (0..holders).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            pipe.cmd("LOCK.ACQUIRE")
                .arg(key)
                .arg(format!("holder-{i:06}"))
                .arg(3_600_000)
                .arg("SHARED")
                .ignore();
        }
        pipe.query::<()>(&mut c).unwrap();
    }
    master.wait_acknowledged(1, "scratch");
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c).unwrap();
    let before = info_number(&mut c, "replication", "master_repl_offset");
    // Each round: a newcomer is granted, one holder renews, one extends,
    // the newcomer releases: four changes.
    for r in 0..rounds {
        let token = format!("newcomer-{r}");
        let renewer = format!("holder-{:06}", r % holders);
        let granted: Option<i64> = redis::cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg(&token)
            .arg(3_600_000)
            .arg("SHARED")
            .query(&mut c)
            .unwrap();
        assert!(granted.is_some(), "the newcomer is granted");
        let _: Option<i64> = redis::cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg(&renewer)
            .arg(3_600_000)
            .arg("SHARED")
            .query(&mut c)
            .unwrap();
        let _: i64 = redis::cmd("LOCK.EXTEND")
            .arg(key)
            .arg(&renewer)
            .arg(3_600_000)
            .query(&mut c)
            .unwrap();
        let released: i64 = redis::cmd("LOCK.RELEASE")
            .arg(key)
            .arg(&token)
            .query(&mut c)
            .unwrap();
        assert_eq!(released, 1, "the newcomer releases");
    }
    let bytes = info_number(&mut c, "replication", "master_repl_offset") - before;
    let mut usec = 0;
    let mut calls = 0;
    for name in ["lock.acquire", "lock.extend", "lock.release"] {
        let (n, us) = command_stats(&mut c, name);
        calls += n;
        usec += us;
    }
    let changes = rounds as u64 * 4;
    Row {
        holders,
        changes,
        bytes_per_change: bytes as f64 / changes as f64,
        usec_per_change: usec as f64 / calls.max(1) as f64,
    }
}

pub fn section(doc: &mut String, o: &Options) {
    let sizes: &[usize] = if o.smoke {
        &[10, 100]
    } else {
        &[10, 1_000, 10_000]
    };
    let rounds = if o.smoke { 20 } else { 500 };
    writeln!(
        doc,
        "## 9. A shared key's changes behind a replica and an AOF\n"
    )
    .unwrap();
    writeln!(
        doc,
        "One key with N readers (`SHARED`, no limit), a replica attached and `appendonly yes`. \
         {rounds} rounds of four changes each: a newcomer granted, a holder renewing by \
         `LOCK.ACQUIRE`, the same holder's `LOCK.EXTEND`, the newcomer's release. *Bytes* are \
         the master's replication offset per change (what the replica and the AOF receive); \
         *server µs* the commands' own time per call (INFO commandstats). Before, every change \
         wrote the whole key: 3,000 holders made 374 MB of replication traffic for a few \
         thousand changes, 2 to 8 ms of server time each, and the replica was cut off at its \
         output-buffer limit.\n"
    )
    .unwrap();
    writeln!(
        doc,
        "| holders | changes | bytes per change | server µs per change |"
    )
    .unwrap();
    writeln!(doc, "|---|---|---|---|").unwrap();
    let rows: Vec<Row> = sizes.iter().map(|&n| measure(n, rounds)).collect();
    for r in &rows {
        writeln!(
            doc,
            "| {} | {} | {:.0} | {:.1} |",
            r.holders, r.changes, r.bytes_per_change, r.usec_per_change
        )
        .unwrap();
    }
    let (first, last) = (&rows[0], &rows[rows.len() - 1]);
    let growth = last.bytes_per_change / first.bytes_per_change.max(1.0);
    writeln!(
        doc,
        "\n### Targets (issue 31: a change costs what it changes)\n"
    )
    .unwrap();
    writeln!(
        doc,
        "- {}",
        target(
            &format!(
                "bytes per change at {} holders within 1.1× of those at {}",
                last.holders, first.holders
            ),
            format!("{growth:.2}×"),
            growth <= 1.1,
        )
    )
    .unwrap();
    writeln!(
        doc,
        "\nServer time still grows with the holders: finding a holder by its token is a walk \
         of the key's holders (a few ns each), not a copy of them.\n"
    )
    .unwrap();
}
