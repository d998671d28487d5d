//! Model check of the core: random histories over several keys drive the
//! real engine (`lock` + `waiters` + `fence`, wired as the Redis glue wires
//! them, with a hand-driven clock and a timer that fires only when the
//! engine asks) and a deliberately simple reference model side by side.
//! After every step both must agree on every reply, every wake and every
//! lock; and whole-history properties must hold: fences strictly increase,
//! a waiter is granted only its own key, only once, never at or after its
//! timeout, and no waiter is left in line while its lock is free.
//!
//! Client handles come from a small pool and are reused as soon as their
//! waiter is answered or leaves, as Redis reuses blocked-client addresses.
//! `PROPTEST_CASES` raises the case count (`make stress` does).

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::fence::FenceCounter;
use super::lock::tests::MemSlot;
use super::lock::{self, Acquired, LockSlot};
use super::waiters::{Outcome, Request, Waiters, Wake};

const KEYS: u8 = 3;
const CLIENTS: u8 = 6;
const T0_MS: i64 = 1_700_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        client: u8,
        key: u8,
        token: u8,
        ttl: i64,
        block: Option<i64>,
    },
    Release {
        key: u8,
        token: u8,
    },
    Extend {
        key: u8,
        token: u8,
        ttl: i64,
    },
    /// DEL / UNLINK / FLUSHALL of one key: the lock is gone, waiters stay.
    Delete {
        key: u8,
    },
    /// The client disconnects (or CLIENT UNBLOCK): it leaves its line.
    Disconnect {
        client: u8,
    },
    Advance {
        ms: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..CLIENTS, 0..KEYS, 0..4u8, 1..40i64, prop::option::weighted(0.7, 0..30i64))
            .prop_map(|(client, key, token, ttl, block)| Op::Acquire { client, key, token, ttl, block }),
        2 => (0..KEYS, 0..4u8).prop_map(|(key, token)| Op::Release { key, token }),
        1 => (0..KEYS, 0..4u8, 1..40i64).prop_map(|(key, token, ttl)| Op::Extend { key, token, ttl }),
        1 => (0..KEYS).prop_map(|key| Op::Delete { key }),
        1 => (0..CLIENTS).prop_map(|client| Op::Disconnect { client }),
        3 => (0..25i64).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn token(t: u8) -> Vec<u8> {
    vec![b'a' + t]
}

/// What a command or a wake-up told a client, comparable across both sides.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Told {
    Fence(i64),
    Nil,
    Blocked,
    Released(bool),
    Extended(bool),
}

// ---- the reference model: plain vectors, rules written out longhand ----

#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    token: Vec<u8>,
    fence: i64,
    deadline_ms: i64,
}

struct RefWaiter {
    client: u8,
    token: Vec<u8>,
    ttl: i64,
    timeout_at: Option<i64>,
}

#[derive(Default)]
struct Reference {
    hwm: i64,
    locks: BTreeMap<u8, Held>,
    lines: BTreeMap<u8, Vec<RefWaiter>>,
}

impl Reference {
    fn live(&self, key: u8, now: i64) -> Option<&Held> {
        self.locks.get(&key).filter(|h| now < h.deadline_ms)
    }

    fn grant(&mut self, key: u8, token: &[u8], ttl: i64, now: i64) -> i64 {
        if let Some(h) = self.locks.get_mut(&key).filter(|h| now < h.deadline_ms) {
            assert_eq!(h.token, token);
            h.deadline_ms = now + ttl;
            return h.fence;
        }
        self.hwm = (self.hwm + 1).max(now * 1000);
        self.locks.insert(
            key,
            Held {
                token: token.to_vec(),
                fence: self.hwm,
                deadline_ms: now + ttl,
            },
        );
        self.hwm
    }

    /// The front of `key`'s line: timed out, or granted while the lock is
    /// free or its own.
    fn settle(&mut self, key: u8, now: i64, told: &mut Vec<(u8, Told)>) {
        loop {
            let Some(front) = self.lines.get(&key).and_then(|l| l.first()) else {
                return;
            };
            if front.timeout_at.is_some_and(|t| t <= now) {
                let w = self.lines.get_mut(&key).unwrap().remove(0);
                told.push((w.client, Told::Nil));
                continue;
            }
            if self.live(key, now).is_some_and(|h| h.token != front.token) {
                return;
            }
            let w = self.lines.get_mut(&key).unwrap().remove(0);
            let fence = self.grant(key, &w.token, w.ttl, now);
            told.push((w.client, Told::Fence(fence)));
        }
    }

    /// The timer at `now`: every timeout, then every key.
    fn tick(&mut self, now: i64, told: &mut Vec<(u8, Told)>) {
        for line in self.lines.values_mut() {
            line.retain(|w| {
                let out = w.timeout_at.is_some_and(|t| t <= now);
                if out {
                    told.push((w.client, Told::Nil));
                }
                !out
            });
        }
        for key in 0..KEYS {
            self.settle(key, now, told);
        }
    }

    fn waiting(&self, client: u8) -> bool {
        self.lines.values().flatten().any(|w| w.client == client)
    }
}

// ---- the engine, wired as the glue wires it ----

struct Engine {
    fences: FenceCounter,
    slots: HashMap<u8, MemSlot>,
    waiters: Waiters<u8, u8>,
    next_lease: u64,
}

impl Engine {
    fn slot(&mut self, key: u8) -> MemSlot {
        let mut slot = self.slots.remove(&key).unwrap_or_default();
        slot.next_lease = self.next_lease;
        slot
    }

    fn put_back(&mut self, key: u8, slot: MemSlot) {
        self.next_lease = slot.next_lease;
        self.slots.insert(key, slot);
    }

    fn settle(&mut self, key: u8, now: i64, wakes: &mut Vec<Wake<u8, u8>>) {
        if self.waiters.waiting_on(&key) == 0 {
            return;
        }
        let mut slot = self.slot(key);
        wakes.extend(
            self.waiters
                .settle(&key, &mut slot, &mut self.fences, now * 1000, 0),
        );
        self.put_back(key, slot);
    }

    /// The module timer: runs only when the engine asked for `now` or before.
    fn timer(&mut self, now: i64, wakes: &mut Vec<Wake<u8, u8>>) {
        if self.waiters.next_wakeup().is_none_or(|at| at > now) {
            return;
        }
        wakes.extend(self.waiters.poll_timeouts(now, now * 1000));
        for key in self.waiters.due_keys(now) {
            self.settle(key, now, wakes);
        }
    }
}

fn told_of(wake: &Wake<u8, u8>) -> Told {
    match wake.outcome {
        Outcome::Granted { fence, .. } => Told::Fence(fence),
        Outcome::TimedOut => Told::Nil,
        Outcome::Failed(ref e) => panic!("no failure expected here: {e}"),
    }
}

fn compare(step: usize, op: &Op, mut model_told: Vec<(u8, Told)>, wakes: &[Wake<u8, u8>]) {
    let mut engine_told: Vec<(u8, Told)> = wakes.iter().map(|w| (w.client, told_of(w))).collect();
    model_told.sort();
    engine_told.sort();
    assert_eq!(model_told, engine_told, "step {step} {op:?}: wakes");
}

/// Each wake answers a client that was waiting, on the key it asked for;
/// a grant is of a live lock that it now holds, before its timeout, with
/// the largest fence yet unless it is its own renewal.
fn check_wakes(
    engine: &Engine,
    asked: &mut HashMap<u8, (u8, Vec<u8>, Option<i64>)>,
    last_fence: &mut i64,
    wakes: &[Wake<u8, u8>],
    now: i64,
) {
    for wake in wakes {
        let (key, token, timeout_at) = asked
            .remove(&wake.client)
            .expect("woken once, while waiting");
        assert_eq!(wake.key, key, "granted only its own key");
        if let Outcome::Granted { fence, renewed, .. } = wake.outcome {
            if !renewed {
                assert!(
                    fence > *last_fence,
                    "a new grant's fence is the largest yet"
                );
                *last_fence = fence;
            }
            assert!(
                timeout_at.is_none_or(|t| now < t),
                "granted after its timeout"
            );
            let held = engine.slots.get(&key).and_then(|s| s.live(now));
            let held = held.expect("the granted lock is live when granted");
            assert_eq!((held.token, held.fence), (&token[..], fence));
        }
    }
}

fn run(ops: &[Op]) {
    let mut now = T0_MS;
    let mut model = Reference::default();
    let mut engine = Engine {
        fences: FenceCounter::default(),
        slots: HashMap::new(),
        waiters: Waiters::default(),
        next_lease: 0,
    };
    // client -> (key, token, timeout_at) of its current wait
    let mut asked: HashMap<u8, (u8, Vec<u8>, Option<i64>)> = HashMap::new();
    let mut last_fence = 0;

    for (step, op) in ops.iter().enumerate() {
        let mut model_told: Vec<(u8, Told)> = Vec::new();
        let mut wakes: Vec<Wake<u8, u8>> = Vec::new();
        let mut replies: (Option<Told>, Option<Told>) = (None, None);
        match *op {
            Op::Acquire {
                client,
                key,
                token: t,
                ttl,
                block,
            } => {
                if model.waiting(client) {
                    continue; // a blocked client sends nothing
                }
                let token = token(t);
                // Model.
                model.settle(key, now, &mut model_told);
                let reply = match model.live(key, now) {
                    Some(h) if h.token != token => match block {
                        Some(timeout) => {
                            model.lines.entry(key).or_default().push(RefWaiter {
                                client,
                                token: token.clone(),
                                ttl,
                                timeout_at: (timeout > 0).then_some(now + timeout),
                            });
                            Told::Blocked
                        }
                        None => Told::Nil,
                    },
                    _ => Told::Fence(model.grant(key, &token, ttl, now)),
                };
                replies.0 = Some(reply);
                // Engine.
                engine.settle(key, now, &mut wakes);
                let mut slot = engine.slot(key);
                let held = slot.live(now).map(|l| (l.token == token, l.deadline_ms));
                let reply = match (held, block) {
                    (Some((false, until)), Some(timeout)) => {
                        let request = Request {
                            token: &token,
                            ttl_ms: ttl,
                            timeout_ms: timeout,
                            min_fence: 0,
                        };
                        engine
                            .waiters
                            .enqueue(key, client, request, now * 1000, until, 100)
                            .unwrap();
                        asked.insert(
                            client,
                            (key, token.clone(), (timeout > 0).then_some(now + timeout)),
                        );
                        Told::Blocked
                    }
                    _ => match lock::acquire(
                        &mut slot,
                        &mut engine.fences,
                        &token,
                        ttl,
                        now * 1000,
                        0,
                    )
                    .unwrap()
                    {
                        Acquired::Granted(f) => {
                            assert!(f > last_fence, "a new grant's fence is the largest yet");
                            last_fence = f;
                            Told::Fence(f)
                        }
                        Acquired::Renewed(f) => {
                            // The lease may now end sooner: look again then.
                            engine.waiters.schedule(&key, now + ttl);
                            Told::Fence(f)
                        }
                        Acquired::Contended => Told::Nil,
                    },
                };
                engine.put_back(key, slot);
                replies.1 = Some(reply);
            }
            Op::Release { key, token: t } => {
                let token = token(t);
                model.settle(key, now, &mut model_told);
                let released = model.live(key, now).is_some_and(|h| h.token == token);
                if released {
                    model.locks.remove(&key);
                    model.settle(key, now, &mut model_told);
                }
                replies.0 = Some(Told::Released(released));
                engine.settle(key, now, &mut wakes);
                let mut slot = engine.slot(key);
                let released = lock::release(&mut slot, &token, now);
                engine.put_back(key, slot);
                if released {
                    engine.settle(key, now, &mut wakes);
                }
                replies.1 = Some(Told::Released(released));
            }
            Op::Extend { key, token: t, ttl } => {
                let token = token(t);
                model.settle(key, now, &mut model_told);
                let extended = match model.locks.get_mut(&key) {
                    Some(h) if now < h.deadline_ms && h.token == token => {
                        h.deadline_ms = now + ttl;
                        true
                    }
                    _ => false,
                };
                replies.0 = Some(Told::Extended(extended));
                engine.settle(key, now, &mut wakes);
                let mut slot = engine.slot(key);
                let extended = lock::extend(&mut slot, &token, ttl, now).unwrap();
                engine.put_back(key, slot);
                if extended {
                    engine.waiters.schedule(&key, now + ttl);
                }
                replies.1 = Some(Told::Extended(extended));
            }
            Op::Delete { key } => {
                model.locks.remove(&key);
                let mut slot = engine.slot(key);
                slot.remove();
                engine.put_back(key, slot);
                // unlink2 queues a check for the next timer run.
                engine.waiters.schedule(&key, now);
            }
            Op::Disconnect { client } => {
                for line in model.lines.values_mut() {
                    line.retain(|w| w.client != client);
                }
                let left = engine.waiters.leave(client, now);
                assert_eq!(left.is_some(), asked.remove(&client).is_some());
            }
            Op::Advance { ms } => {
                for _ in 0..ms {
                    now += 1;
                    let mut model_tick = Vec::new();
                    let mut engine_tick = Vec::new();
                    model.tick(now, &mut model_tick);
                    engine.timer(now, &mut engine_tick);
                    compare(step, op, model_tick, &engine_tick);
                    check_wakes(&engine, &mut asked, &mut last_fence, &engine_tick, now);
                }
            }
        }
        // The timer also runs at the end of the event-loop iteration.
        model.tick(now, &mut model_told);
        engine.timer(now, &mut wakes);

        assert_eq!(replies.0, replies.1, "step {step} {op:?}: reply");
        let mut engine_told: Vec<(u8, Told)> =
            wakes.iter().map(|w| (w.client, told_of(w))).collect();
        model_told.sort();
        engine_told.sort();
        assert_eq!(model_told, engine_told, "step {step} {op:?}: wakes");

        check_wakes(&engine, &mut asked, &mut last_fence, &wakes, now);
        for key in 0..KEYS {
            let engine_lock = engine
                .slots
                .get(&key)
                .and_then(|s| s.live(now))
                .map(|l| (l.token.to_vec(), l.fence, l.deadline_ms));
            let model_lock = model
                .live(key, now)
                .map(|h| (h.token.clone(), h.fence, h.deadline_ms));
            assert_eq!(engine_lock, model_lock, "step {step}: lock {key}");
            if engine.waiters.waiting_on(&key) > 0 {
                assert!(
                    engine_lock.is_some(),
                    "step {step}: a waiter is stranded on a free lock {key}"
                );
            }
        }
        assert_eq!(engine.fences.hwm(), model.hwm, "step {step}: fence mark");
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(2000),
        .. ProptestConfig::default()
    })]

    #[test]
    fn the_engine_agrees_with_the_reference_model(ops in prop::collection::vec(op(), 1..80)) {
        run(&ops);
    }
}
