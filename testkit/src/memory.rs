//! `INFO` numbers, and the memory a server settles at once a workload is
//! gone.

use std::time::{Duration, Instant};

use redis::Connection;

use crate::server::Server;
use crate::wait::wait_until;

/// The numeric field `name` of `INFO section`.
pub fn info_number(c: &mut Connection, section: &str, name: &str) -> i64 {
    let text: String = redis::cmd("INFO").arg(section).query(c).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in INFO {section}"))
        .trim()
        .parse()
        .unwrap()
}

pub fn used_memory(c: &mut Connection) -> i64 {
    info_number(c, "memory", "used_memory")
}

/// `connected_clients` of `INFO clients`.
pub fn connected_clients(c: &mut Connection) -> i64 {
    info_number(c, "clients", "connected_clients")
}

/// `used_memory` with nothing left of the workload: no waiter, no key, no
/// pending lazy free, `c` the only client, and the server's pool of
/// temporary module clients drained. (Every blocked client takes two of
/// them, about 16 KiB each; they go back to a pool that the server's cron
/// frees 50 at a time every 100 ms, down to 8.)
pub fn settled_memory(s: &Server, c: &mut Connection) -> i64 {
    wait_until(Duration::from_secs(60), || s.info_field("waiters") == 0);
    let _: () = redis::cmd("FLUSHALL").arg("SYNC").query(c).unwrap();
    wait_until(Duration::from_secs(60), || {
        s.info_field("locks") == 0
            && info_number(c, "memory", "lazyfree_pending_objects") == 0
            && connected_clients(c) == 1
    });
    // info_field opened connections of its own: let them go too.
    wait_until(Duration::from_secs(10), || connected_clients(c) == 1);
    // What the server keeps about slow commands is not the module's: on a
    // loaded machine more commands pass slowlog-log-slower-than in one
    // round than in another, and each entry keeps its arguments (128
    // entries of up to 32 arguments: a hundred KB). Dropped before every
    // reading, so rounds compare what the module keeps.
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query(c).unwrap();
    let _: i64 = redis::cmd("LATENCY").arg("RESET").query(c).unwrap();
    let start = Instant::now();
    let (mut last, mut same) = (used_memory(c), 0);
    while same < 4 {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "used_memory does not settle"
        );
        std::thread::sleep(Duration::from_millis(250));
        let _: () = redis::cmd("SLOWLOG").arg("RESET").query(c).unwrap();
        let now = used_memory(c);
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}
