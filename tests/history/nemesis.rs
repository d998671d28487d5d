//! The nemesis: injects every fault class into a master and its replica
//! (client kills and unblocks, pauses, deletes and expiries, restarts,
//! failovers, wall-clock steps), moves the clients to the new master, and
//! records each fault's window.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use redis_lock_testkit::{set_clock_offset, wait_until, Connection, Server};

use crate::checker::MARGIN;
use crate::model::FaultClass::{self, *};
use crate::model::{Epoch, Fault, Us};
use crate::workload::{Shared, ALL_KEYS, HOLDING, RESTART_DELAY};

/// Injects faults into a master and its replica and records them.
pub struct Nemesis {
    pub nodes: [Server; 2],
    pub master: usize,
    pub shared: Arc<Shared>,
    pub rng: StdRng,
    pub faults: Vec<Fault>,
    pub epochs: Vec<Epoch>,
    pub skipped: BTreeMap<FaultClass, usize>,
    /// Each node's libfaketime offset file, when the server runs under it.
    pub clocks: Option<[PathBuf; 2]>,
}

fn query<T: redis::FromRedisValue>(c: &mut Connection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

pub fn info_value(c: &mut Connection, section: &str, field: &str) -> Option<String> {
    let info: String = query(c, &["INFO", section]);
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

impl Nemesis {
    fn now(&self) -> Us {
        self.shared.now()
    }

    pub fn master(&self) -> &Server {
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
        // A replica that exited (a full sync it refused) says why in its log.
        let mut r = self.replica().try_conn().unwrap_or_else(|e| {
            let log = self.replica().log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "the replica is down ({e}); its log ends:\n{}",
                tail.join("\n")
            )
        });
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

    pub fn inject(&mut self, class: FaultClass) {
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
                let key = *ALL_KEYS.choose(&mut self.rng).unwrap();
                let cmd = *["DEL", "UNLINK"].choose(&mut self.rng).unwrap();
                let _: i64 = query(&mut self.master().conn(), &[cmd, key]);
                self.record(class, start, Some(key.into()), None);
            }
            Flushall => {
                let _: () = query(&mut self.master().conn(), &["FLUSHALL"]);
                self.record(class, start, None, None);
            }
            Pexpire => {
                let key = *ALL_KEYS.choose(&mut self.rng).unwrap();
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
                let key = *ALL_KEYS.choose(&mut self.rng).unwrap();
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
                set_clock_offset(&file, step);
                sleep(Duration::from_millis(self.rng.gen_range(200..600)));
                set_clock_offset(&file, "+0");
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
