//! The workload: the clients (one thread each) and their operations on a
//! few keys, with and without BLOCK, renewals, releases and writes to the
//! fenced resource; each records every operation it sent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use redis_lock_testkit::{RawConn, Resp};

use crate::model::{Kind, Mode, Op, Outcome, Us, Write};

/// Exclusive locks (plain ACQUIRE), alone or taken together by ACQUIREALL.
pub const KEYS: [&str; 3] = ["k0", "k1", "k2"];
/// Read/write locks: readers ask `SHARED`, writers plain; alone or both
/// at once by ACQUIREALL.
pub const RW_KEYS: [&str; 2] = ["r0", "r1"];
/// A counting semaphore: every holder asks `SHARED LIMIT 2`.
pub const SEMAPHORE: &str = "s0";
pub const SEMAPHORE_LIMIT: u32 = 2;
/// Every key of the workload (the nemesis picks among them).
pub const ALL_KEYS: [&str; 6] = ["k0", "k1", "k2", "r0", "r1", "s0"];
/// Leases in ms. The longest is below the restart delay used.
pub const TTLS: [i64; 6] = [30, 60, 120, 250, 500, 800];
/// `restart-delay-ms` where a fault uses one: at least the longest TTL.
pub const RESTART_DELAY: i64 = 1_000;
/// BLOCK timeouts in ms, from 1 ms up.
pub const TIMEOUTS: [i64; 10] = [1, 2, 5, 10, 30, 100, 300, 600, 1000, 2000];
pub const CLIENTS: usize = 8;
/// How long a client waits for a reply beyond its BLOCK timeout.
const READ_LIMIT: Duration = Duration::from_secs(10);

pub const IDLE: u8 = 0;
const WAITING: u8 = 1;
pub const HOLDING: u8 = 2;

/// The fenced resource: remembers the highest fence written per key and
/// rejects lower ones (Kleppmann's storage check); logs every write.
#[derive(Default)]
pub struct FencedStore {
    pub inner: Mutex<(HashMap<String, i64>, Vec<Write>)>,
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
pub struct Shared {
    pub t0: Instant,
    pub stop: AtomicBool,
    /// The master clients should use: (port, epoch); port 0 while there is
    /// none (a restart or failover in progress).
    pub master: Mutex<(u16, u32)>,
    /// Per client: IDLE, WAITING (in a BLOCK) or HOLDING.
    pub state: Vec<AtomicU8>,
    pub store: FencedStore,
}

impl Shared {
    pub fn now(&self) -> Us {
        self.t0.elapsed().as_micros() as Us
    }

    pub fn master(&self) -> (u16, u32) {
        *self.master.lock().unwrap()
    }
}

pub struct Client {
    pub id: usize,
    pub shared: Arc<Shared>,
    pub rng: StdRng,
    pub link: Option<(RawConn, u32)>,
    pub ops: Vec<Op>,
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
            Kind::Acquire { ttl, block, mode } => {
                let mut a = vec![
                    "LOCK.ACQUIRE".into(),
                    key.into(),
                    token.into(),
                    ttl.to_string(),
                ];
                a.extend(mode.args());
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
        self.send(&[key], token, kind, args)
    }

    /// `LOCK.ACQUIREALL` of `keys` (distinct): recorded as one op per key.
    fn call_all(
        &mut self,
        keys: &[&str],
        token: &str,
        ttl: i64,
        block: Option<i64>,
        mode: Mode,
    ) -> Option<Outcome> {
        let mut args: Vec<String> = vec!["LOCK.ACQUIREALL".into(), keys.len().to_string()];
        args.extend(keys.iter().map(|k| k.to_string()));
        args.extend([token.to_string(), ttl.to_string()]);
        args.extend(mode.args());
        if let Some(t) = block {
            args.extend(["BLOCK".into(), t.to_string()]);
        }
        self.send(keys, token, Kind::Acquire { ttl, block, mode }, args)
    }

    /// A reader (usually) or a writer of a read/write lock.
    fn rw_mode(&mut self) -> Mode {
        match self.rng.gen_bool(0.7) {
            true => Mode::Shared,
            false => Mode::Exclusive,
        }
    }

    /// Sends one command about `keys` and records it, once per key.
    fn send(
        &mut self,
        keys: &[&str],
        token: &str,
        kind: Kind,
        args: Vec<String>,
    ) -> Option<Outcome> {
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
        for key in keys {
            self.ops.push(Op {
                client: self.id,
                epoch,
                key: key.to_string(),
                token: token.into(),
                kind,
                send,
                reply: reply_at,
                outcome: outcome.clone(),
                also: keys.len() - 1,
            });
        }
        Some(outcome)
    }

    fn set_state(&self, state: u8) {
        self.shared.state[self.id].store(state, SeqCst);
    }

    pub fn run(mut self) -> Vec<Op> {
        let mut n = 0;
        while !self.shared.stop.load(SeqCst) {
            n += 1;
            if self.rng.gen_bool(0.2) {
                self.run_all(n, &KEYS, Mode::Exclusive);
                continue;
            }
            if self.rng.gen_bool(0.1) {
                let mode = self.rw_mode();
                self.run_all(n, &RW_KEYS, mode);
                continue;
            }
            let key = *ALL_KEYS.choose(&mut self.rng).unwrap();
            let mode = match key {
                SEMAPHORE => Mode::Limit(SEMAPHORE_LIMIT),
                _ if RW_KEYS.contains(&key) => self.rw_mode(),
                _ => Mode::Exclusive,
            };
            let token = format!("c{}.{n}", self.id);
            let ttl = *TTLS.choose(&mut self.rng).unwrap();
            let block = self
                .rng
                .gen_bool(0.5)
                .then(|| *TIMEOUTS.choose(&mut self.rng).unwrap());
            self.set_state(if block.is_some() { WAITING } else { IDLE });
            let outcome = self.call(key, &token, Kind::Acquire { ttl, block, mode });
            self.set_state(IDLE);
            let waited = block.is_some() && matches!(outcome, Some(Outcome::Int(_)));
            let fence = match outcome {
                Some(Outcome::Int(f)) => Some(f),
                // The reply was lost: retrying with the same token is safe.
                Some(Outcome::Lost) => {
                    let again = Kind::Acquire {
                        ttl,
                        block: None,
                        mode,
                    };
                    match self.call(key, &token, again) {
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
                self.hold(key, &token, fence, ttl, waited, mode);
                self.set_state(IDLE);
            }
        }
        self.ops
    }

    /// One all-or-nothing lock over two or more of `group` (named in a
    /// random order) in `mode`, held as [`hold`](Self::hold) holds one, key
    /// by key.
    fn run_all(&mut self, n: usize, group: &[&'static str], mode: Mode) {
        let mut keys: Vec<&str> = group.to_vec();
        keys.shuffle(&mut self.rng);
        keys.truncate(self.rng.gen_range(2..=group.len()));
        let token = format!("c{}.{n}", self.id);
        let ttl = *TTLS.choose(&mut self.rng).unwrap();
        let block = self
            .rng
            .gen_bool(0.5)
            .then(|| *TIMEOUTS.choose(&mut self.rng).unwrap());
        self.set_state(if block.is_some() { WAITING } else { IDLE });
        let outcome = self.call_all(&keys, &token, ttl, block, mode);
        self.set_state(IDLE);
        let waited = block.is_some() && matches!(outcome, Some(Outcome::Int(_)));
        let fence = match outcome {
            Some(Outcome::Int(f)) => Some(f),
            // A retry with the same token renews what it got, or grants anew.
            Some(Outcome::Lost) => match self.call_all(&keys, &token, ttl, None, mode) {
                Some(Outcome::Int(f)) => Some(f),
                _ => None,
            },
            Some(Outcome::Nil) if block.is_none() => {
                sleep(Duration::from_millis(self.rng.gen_range(0..5)));
                None
            }
            _ => None,
        };
        let Some(fence) = fence else {
            return;
        };
        self.set_state(HOLDING);
        for key in &keys {
            self.call(key, &token, Kind::Fence);
        }
        let mut held = keys.clone();
        if waited && self.rng.gen_bool(0.7) {
            held.retain(|key| {
                self.call(key, &token, Kind::Extend { ttl }) != Some(Outcome::Int(0))
            });
        }
        for _ in 0..self.rng.gen_range(1..=3) {
            if held.len() < keys.len() || self.shared.stop.load(SeqCst) {
                break; // one key lost: the lock is
            }
            let pause = if self.rng.gen_bool(0.1) {
                ttl + self.rng.gen_range(0..ttl) // a GC pause past the lease
            } else {
                self.rng.gen_range(0..=ttl / 3)
            };
            sleep(Duration::from_millis(pause as u64));
            let shared = self.shared.clone();
            // Readers read: only an exclusive holder writes.
            for key in keys.iter().filter(|_| mode == Mode::Exclusive) {
                shared.store.write(key, &token, fence, || shared.now());
            }
            let ttl = *TTLS.choose(&mut self.rng).unwrap();
            if self.rng.gen_bool(0.6) {
                held.retain(|key| {
                    self.call(key, &token, Kind::Extend { ttl }) != Some(Outcome::Int(0))
                });
            }
        }
        if self.rng.gen_bool(0.8) {
            for key in &keys {
                self.call(key, &token, Kind::Release);
            }
        }
        self.set_state(IDLE);
    }

    /// Works as the holder: checks the grant, writes to the resource when
    /// exclusive (a shared holder reads; sometimes after a pause longer
    /// than the lease), extends or renews,
    /// and usually releases. After waiting in BLOCK it does not know when
    /// its lease began, so it mostly renews it first.
    fn hold(&mut self, key: &str, token: &str, mut fence: i64, ttl: i64, waited: bool, mode: Mode) {
        self.call(key, token, Kind::Fence);
        if waited
            && self.rng.gen_bool(0.7)
            && self.call(key, token, Kind::Extend { ttl }) == Some(Outcome::Int(0))
        {
            return;
        }
        let other = *ALL_KEYS
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
            if mode == Mode::Exclusive {
                shared.store.write(key, token, fence, || shared.now());
            }
            let ttl = *TTLS.choose(&mut self.rng).unwrap();
            let renewal = Kind::Acquire {
                ttl,
                block: None,
                mode,
            };
            let kept = match self.rng.gen_range(0..10) {
                0..=4 => self.call(key, token, Kind::Extend { ttl }) != Some(Outcome::Int(0)),
                5 => match self.call(key, token, renewal) {
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
