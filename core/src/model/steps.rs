//! Each operation of a history, applied to the reference and to the node
//! (through the harness): false when it is skipped (a blocked client sends
//! nothing, Redis redirects a key that left, ...).

use super::ops::*;
use super::reference::*;
use super::run::*;
use crate::error::{LockError, NotHeld};
use crate::limits::SERVING_FENCE_GAP;
use crate::lock;
use crate::node::{Acquire, AcquireRequest, Conditions, Limits};

impl Run {
    pub(super) fn acquire(&mut self, st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::Acquire {
            client,
            key,
            token: t,
            mode,
            ttl,
            block,
            min_fence,
        } = *op
        else {
            unreachable!()
        };
        let Run {
            now,
            model,
            h,
            asked,
            ..
        } = self;
        let now = *now;
        let Step {
            replies,
            model_told,
            ..
        } = st;
        if model.gone.contains(&key) {
            return false; // Redis redirects the command itself
        }
        let r = Request {
            token: token(t),
            mode: MODES[mode],
            ttl,
            block,
            min_fence: min_fence.map_or(0, |d| (model.hwm + d as i64).max(1)),
        };
        if ttl > model.max_ttl {
            // Refused by the parser, before the node is asked.
            return false;
        }
        replies.0 = Some(model.acquire(client, key, &r, now, model_told));
        let reply = h.acquire(client, key, &r, now);
        if reply == Told::Blocked {
            asked.insert(
                client,
                (
                    vec![key],
                    r.token.clone(),
                    block.filter(|t| *t > 0).map(|t| now + t),
                ),
            );
        }
        replies.1 = Some(reply);
        true
    }

    pub(super) fn acquire_all(&mut self, st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::AcquireAll {
            client,
            keys: set,
            reversed,
            token: t,
            mode,
            ttl,
            block,
            min_fence,
        } = *op
        else {
            unreachable!()
        };
        let Run {
            now,
            model,
            h,
            asked,
            multi_grants,
            ..
        } = self;
        let now = *now;
        let Step {
            replies,
            model_told,
            ..
        } = st;
        let mode = MODES[mode];
        let min_fence = min_fence.map_or(0, |d| (model.hwm + d as i64).max(1));
        let keys = keys_of(set, reversed);
        let unusable = keys
            .iter()
            .any(|k| model.gone.contains(k) || model.wrongtype.contains(k));
        if unusable || ttl > model.max_ttl {
            return false;
        }
        let r = Request {
            token: token(t),
            mode,
            ttl,
            block,
            min_fence,
        };
        replies.0 = Some(model.acquire_all(client, &keys, &r, now, model_told));
        let cond = h.cond(block.is_some());
        let at = h.at(now);
        let out = h.with_stores(&keys, |node, stores, denied| {
            let mut admits: Vec<_> = keys.iter().map(|_| |c: u8| !denied.contains(&c)).collect();
            let req = AcquireRequest {
                token: &r.token,
                value: None,
                mode,
                ttl_ms: ttl,
                block_ms: block,
                min_fence,
            };
            node.acquire_all(&keys, Ok(stores), req, cond, &mut admits, at)
        });
        replies.1 = Some(match out {
            Ok(Acquire::Granted(f) | Acquire::Renewed(f)) => {
                multi_grants.entry(f).or_default().extend(&keys);
                Told::Fence(f)
            }
            Ok(Acquire::Contended) => Told::Nil,
            Ok(Acquire::Wait(ticket)) => {
                h.node.enqueue(*ticket, client).unwrap();
                let timeout_at = block.filter(|t| *t > 0).map(|t| now + t);
                asked.insert(client, (keys.clone(), r.token.clone(), timeout_at));
                Told::Blocked
            }
            Err(e) => error(e),
        });
        true
    }

    pub(super) fn release_all(&mut self, st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::ReleaseAll {
            keys: set,
            token: t,
            ..
        } = *op
        else {
            unreachable!()
        };
        let Run { now, model, h, .. } = self;
        let now = *now;
        let Step {
            replies,
            model_told,
            ..
        } = st;
        let keys = keys_of(set, false);
        let unusable = keys
            .iter()
            .any(|k| model.gone.contains(k) || model.wrongtype.contains(k));
        if unusable {
            return false;
        }
        let token = token(t);
        replies.0 = Some(if model.replica {
            error(LockError::ReadOnlyReplica)
        } else {
            let mut n = 0;
            for &key in &keys {
                model.settle(key, now, model_told);
                let released = model.holder(key, &token, now).is_some();
                if released {
                    model.remove_holder(key, &token);
                    n += 1;
                }
                model.reclaim_touched(key, now);
                model.settle(key, now, model_told);
            }
            Told::ReleasedAll(n)
        });
        let cond = h.cond(false);
        let at = h.at(now);
        let out = h.with_stores(&keys, |node, stores, denied| {
            let mut admits: Vec<_> = keys.iter().map(|_| |c: u8| !denied.contains(&c)).collect();
            node.release_all(&keys, stores, &token, cond, &mut admits, at)
        });
        replies.1 = Some(out.map_or_else(error, Told::ReleasedAll));
        true
    }

    pub(super) fn exec(&mut self, st: &mut Step, step: usize, op: &Op) -> bool {
        let Op::Exec {
            key,
            token: t,
            fence,
        } = *op
        else {
            unreachable!()
        };
        let Run { now, model, h, .. } = self;
        let now = *now;
        let Step { replies, .. } = st;
        if model.gone.contains(&key) {
            return false; // Redis redirects the command itself
        }
        let token = token(t);
        let own = model
            .holder(key, &token, now)
            .map_or(model.hwm, |h| h.fence);
        let fence = fence.map(|right| if right { own } else { own - 1 });
        replies.0 = Some(model.exec(key, &token, fence, now));
        let cond = h.cond(false);
        let out = h.with_store(key, |node, store, _| {
            store.and_then(|s| node.check_holder(&*s, &token, fence, cond, now))
        });
        // Free or ended: which of the two depends on whether the
        // ended lease is still stored (the sweep's timing); each
        // must agree with who holds the key now.
        let held = model.held(key, now);
        replies.1 = Some(match out {
            Ok(f) => Told::Fence(f),
            Err(LockError::NotHeld(NotHeld::Free)) => {
                assert!(!held, "step {step}: EXEC says free, the key is held");
                Told::FreeOrEnded
            }
            Err(LockError::NotHeld(NotHeld::Ended)) => match held {
                true => error(LockError::NotHeld(NotHeld::OtherToken)),
                false => Told::FreeOrEnded,
            },
            Err(e) => error(e),
        });
        true
    }

    pub(super) fn fenced(&mut self, st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::Fenced { gate, pick } = *op else {
            unreachable!()
        };
        let Run { now, model, h, .. } = self;
        let now = *now;
        let Step { replies, .. } = st;
        let fence = match pick {
            0 => 1,
            1 => 2,
            2 => model.hwm,
            3 => model.hwm - 1,
            4 => model.hwm + 1,
            _ => model.gate_floor - 1,
        }
        .max(1);
        replies.0 = Some(model.fenced(gate, fence));
        let key = GATE0 + gate;
        let cond = h.cond(false);
        let at = h.at(now);
        let store = h.gates.entry(key).or_default();
        let passed = h.node.pass_gate(&key, &*store, fence, cond, at.wall_us);
        replies.1 = Some(match passed {
            Ok(()) => {
                h.node.record_fence(&key, store, fence);
                Told::Passed
            }
            Err(e) => error(e),
        });
        true
    }

    pub(super) fn delete_gate(&mut self, _st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::DeleteGate { gate } = *op else {
            unreachable!()
        };
        let Run { model, h, .. } = self;
        model.gates.remove(&gate);
        h.gates.remove(&(GATE0 + gate));
        h.replicated_gates.remove(&(GATE0 + gate));
        true
    }

    pub(super) fn release(&mut self, st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::Release { key, token: t, .. } = *op else {
            unreachable!()
        };
        let Run { now, model, h, .. } = self;
        let now = *now;
        let Step {
            replies,
            model_told,
            ..
        } = st;
        if model.gone.contains(&key) {
            return false;
        }
        let token = token(t);
        replies.0 = Some(if model.replica {
            error(LockError::ReadOnlyReplica)
        } else {
            model.settle(key, now, model_told);
            if model.wrongtype.contains(&key) {
                error(LockError::WrongType)
            } else {
                let released = model.holder(key, &token, now).is_some();
                if released {
                    model.remove_holder(key, &token);
                }
                model.reclaim_touched(key, now);
                model.settle(key, now, model_told);
                Told::Released(released)
            }
        });
        let cond = h.cond(false);
        let at = h.at(now);
        let out = h.with_store(key, |node, store, denied| {
            node.release(
                &key,
                store,
                &token,
                cond,
                &mut |c: u8| !denied.contains(&c),
                at,
            )
        });
        replies.1 = Some(out.map_or_else(error, Told::Released));
        true
    }

    pub(super) fn extend(&mut self, st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::Extend {
            key,
            token: t,
            ttl,
            value,
            ..
        } = *op
        else {
            unreachable!()
        };
        let value = value.map(value_bytes);
        let Run { now, model, h, .. } = self;
        let now = *now;
        let Step {
            replies,
            model_told,
            ..
        } = st;
        if model.gone.contains(&key) || ttl > model.max_ttl {
            return false;
        }
        let token = token(t);
        replies.0 = Some(if model.replica {
            error(LockError::ReadOnlyReplica)
        } else {
            model.settle(key, now, model_told);
            if model.wrongtype.contains(&key) {
                error(LockError::WrongType)
            } else {
                let held = model.holder(key, &token, now).is_some();
                let shared = model.locks.get(&key).is_some_and(|l| l.mode.is_shared());
                if held && value.is_some() && shared {
                    error(LockError::ValueShared)
                } else {
                    if held {
                        model.leases += 1;
                        let lease = model.leases;
                        let lock = model.locks.get_mut(&key).unwrap();
                        let l = lock.holders.iter_mut().find(|h| h.token == token).unwrap();
                        l.deadline_ms = now + ttl;
                        l.lease = lease;
                        if let Some(v) = &value {
                            model.proclaim(key, &token, v);
                        }
                    }
                    model.reclaim_touched(key, now);
                    model.settle(key, now, model_told);
                    Told::Extended(held)
                }
            }
        });
        let cond = h.cond(false);
        let at = h.at(now);
        let out = h.with_store(key, |node, store, denied| {
            node.extend(
                &key,
                store,
                (&token, value.as_deref()),
                ttl,
                cond,
                &mut |c: u8| !denied.contains(&c),
                at,
            )
        });
        replies.1 = Some(out.map_or_else(error, Told::Extended));
        true
    }

    pub(super) fn delete(&mut self, _st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::Delete { key } = *op else {
            unreachable!()
        };
        let Run { now, model, h, .. } = self;
        let now = *now;
        if model.gone.contains(&key) || model.replica {
            return false;
        }
        model.locks.remove(&key);
        model.wrongtype.remove(&key);
        h.wrongtype.remove(&key);
        h.stores.remove(&key);
        h.replicated.remove(&key);
        // unlink2 queues a check for the next timer run.
        h.node.keys_changed(|k| *k == key, now);
        true
    }

    pub(super) fn wrong_type(&mut self, _st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::WrongType { key } = *op else {
            unreachable!()
        };
        let Run { now, model, h, .. } = self;
        let now = *now;
        if model.gone.contains(&key) || model.replica {
            return false;
        }
        model.locks.remove(&key);
        model.wrongtype.insert(key);
        h.wrongtype.insert(key);
        h.stores.remove(&key);
        h.replicated.remove(&key);
        h.node.keys_changed(|k| *k == key, now);
        true
    }

    pub(super) fn swap(&mut self, _st: &mut Step, _step: usize, _op: &Op) -> bool {
        let Run {
            now,
            model,
            h,
            asked,
            granted,
            holder_counts,
            ..
        } = self;
        let now = *now;
        if !model.gone.is_empty() || model.replica {
            return false; // no SWAPDB in a cluster; a replica's master swaps
        }
        let swap = |k: &u8| match *k {
            0 => 1,
            1 => 0,
            k => k,
        };
        let (l0, l1) = (model.locks.remove(&0), model.locks.remove(&1));
        l1.map(|l| model.locks.insert(0, l));
        l0.map(|l| model.locks.insert(1, l));
        let (w0, w1) = (model.lines.remove(&0), model.lines.remove(&1));
        w1.map(|l| model.lines.insert(0, l));
        w0.map(|l| model.lines.insert(1, l));
        for w in model.lines.values_mut().flatten() {
            w.keys = w.keys.iter().map(swap).collect();
        }
        for o in &mut model.observers {
            o.key = swap(&o.key);
        }
        for set in [&mut model.wrongtype, &mut h.wrongtype] {
            *set = set.iter().map(swap).collect();
        }
        let (s0, s1) = (h.stores.remove(&0), h.stores.remove(&1));
        s1.map(|s| h.stores.insert(0, s));
        s0.map(|s| h.stores.insert(1, s));
        let (r0, r1) = (h.replicated.remove(&0), h.replicated.remove(&1));
        r1.map(|r| h.replicated.insert(0, r));
        r0.map(|r| h.replicated.insert(1, r));
        for (keys, _, _) in asked.values_mut() {
            *keys = keys.iter().map(swap).collect();
        }
        for (key, _, _) in granted.values_mut().flatten() {
            *key = swap(key);
        }
        for (key, _, _) in &mut model.take_backs {
            *key = swap(key);
        }
        h.node.rename_keys(swap, |k| *k < 2, now);
        holder_counts.swap(0, 1);
        true
    }

    pub(super) fn migrate(&mut self, _st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::Migrate { key } = *op else {
            unreachable!()
        };
        let Run { now, model, h, .. } = self;
        let now = *now;
        if model.replica {
            return false;
        }
        model.locks.remove(&key);
        model.wrongtype.remove(&key);
        model.gone.insert(key);
        h.wrongtype.remove(&key);
        h.gone.insert(key);
        h.stores.remove(&key);
        h.replicated.remove(&key);
        h.node.keys_changed(|k| *k == key, now);
        true
    }

    pub(super) fn observe(&mut self, st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::Observe {
            client,
            key,
            after,
            value,
            block,
        } = *op
        else {
            unreachable!()
        };
        let Run {
            now,
            model,
            h,
            asked,
            ..
        } = self;
        let now = *now;
        if model.gone.contains(&key) {
            return false; // Redis redirects the command itself
        }
        let current = model.leader(key, now);
        let after = match AFTERS[after] {
            After::None => None,
            After::Vacant => Some(0),
            After::Current => Some(current),
            After::Stale => Some(current + 1_000_000),
        };
        // VALUE goes with a leader's fence only (the parser refuses it
        // else): the value seen, which may be the one now or not.
        let value = value
            .filter(|_| after.is_some_and(|a| a > 0))
            .map(seen_value);
        let value = value.as_deref();
        let Step { replies, .. } = st;
        replies.0 = Some(model.observe(client, key, after, value, block, now));
        let reply = h.observe(client, key, after, value, block, now);
        if reply == Told::Blocked {
            let timeout_at = block.filter(|t| *t > 0).map(|t| now + t);
            asked.insert(client, (vec![key], Vec::new(), timeout_at));
        }
        replies.1 = Some(reply);
        true
    }

    pub(super) fn disconnect(&mut self, _st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::Disconnect { client } = *op else {
            unreachable!()
        };
        let Run {
            now,
            model,
            h,
            asked,
            granted,
            ..
        } = self;
        let now = *now;
        for line in model.lines.values_mut() {
            line.retain(|w| w.client != client);
        }
        model.observers.retain(|o| o.client != client);
        let left = h.node.leave(client, now);
        assert_eq!(left, asked.remove(&client).is_some());
        granted.remove(&client);
        true
    }

    pub(super) fn vanish(&mut self, _st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::Vanish { client } = *op else {
            unreachable!()
        };
        let Run {
            now,
            model,
            h,
            granted,
            ..
        } = self;
        let now = *now;
        let Some(grants) = granted.remove(&client) else {
            return false;
        };
        for (key, fence, lease) in grants {
            model.take_backs.push((key, fence, lease));
            h.node.undelivered(key, fence, lease, now);
        }
        true
    }

    pub(super) fn deny(&mut self, _st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::Deny { client } = *op else {
            unreachable!()
        };
        let Run { model, h, .. } = self;
        model.denied.insert(client);
        h.denied.insert(client);
        true
    }

    pub(super) fn config(&mut self, _st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::Config {
            max_ttl,
            delay,
            max_token,
            max_line,
            lock_delay,
            max_holders,
        } = *op
        else {
            unreachable!()
        };
        let Run { now, model, h, .. } = self;
        let now = *now;
        model.lock_delay = LOCK_DELAY[lock_delay];
        model.lock_delay_max = model.lock_delay_max.max(model.lock_delay);
        model.max_ttl = MAX_TTL[max_ttl];
        model.delay = DELAY[delay];
        model.max_token_len = MAX_TOKEN[max_token];
        model.max_line = MAX_LINE[max_line];
        model.max_holders = MAX_HOLDERS[max_holders];
        let limits = Limits {
            max_ttl_ms: MAX_TTL[max_ttl],
            restart_delay_ms: DELAY[delay],
            max_token_len: MAX_TOKEN[max_token],
            max_waiters_per_key: MAX_LINE[max_line],
            lock_delay_ms: LOCK_DELAY[lock_delay],
            max_holders_per_key: MAX_HOLDERS[max_holders],
            ..Limits::default()
        };
        h.node.set_limits(limits, now);
        true
    }

    pub(super) fn memory(&mut self, _st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::Memory { oom, evictable } = *op else {
            unreachable!()
        };
        let Run { model, h, .. } = self;
        (model.oom, model.evictable) = (oom, evictable);
        (h.oom, h.evictable) = (oom, evictable);
        true
    }

    pub(super) fn demote(&mut self, _st: &mut Step, step: usize, _op: &Op) -> bool {
        let Run {
            now,
            model,
            h,
            asked,
            ..
        } = self;
        let now = *now;
        if model.replica {
            return false;
        }
        model.replica = true;
        h.replica = true;
        // Redis answers every waiter itself (-UNBLOCKED); the
        // module only learns that each one left.
        let mut model_left: Vec<u8> = std::mem::take(&mut model.lines)
            .into_values()
            .flatten()
            .map(|w| w.client)
            .chain(
                std::mem::take(&mut model.observers)
                    .into_iter()
                    .map(|o| o.client),
            )
            .collect();
        let mut engine_left: Vec<u8> = asked.drain().map(|(client, _)| client).collect();
        for client in &engine_left {
            assert!(
                h.node.leave(*client, now),
                "step {step}: a waiter leaves on demotion"
            );
        }
        model_left.sort();
        model_left.dedup(); // a multi-key waiter is in several lines
        engine_left.sort();
        assert_eq!(
            model_left, engine_left,
            "step {step}: the lines on demotion"
        );
        true
    }

    pub(super) fn promote(&mut self, _st: &mut Step, _step: usize, _op: &Op) -> bool {
        let Run { now, model, h, .. } = self;
        let now = *now;
        if !model.replica {
            return false;
        }
        model.replica = false;
        model.serving_since = now;
        // The clock when it is past the mark, else the gap above it.
        let clock_us = (now + model.wall_offset) * 1000;
        model.hwm = match clock_us > model.hwm {
            true => clock_us,
            false => model
                .hwm
                .checked_add(SERVING_FENCE_GAP)
                .unwrap_or(model.hwm),
        };
        model.gate_floor = model.hwm + 1;
        h.replica = false;
        let at = h.at(now);
        h.node.start_serving(at);
        true
    }

    pub(super) fn pause_writes(&mut self, _st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::PauseWrites { on } = *op else {
            unreachable!()
        };
        let Run {
            now,
            model,
            h,
            resumed_at,
            ..
        } = self;
        let now = *now;
        if on == model.writes_paused {
            return false;
        }
        model.writes_paused = on;
        h.writes_paused = on;
        if !on {
            model.resume_pending = true;
            *resumed_at = now;
        }
        true
    }

    pub(super) fn sweep(&mut self, st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::Sweep { key } = *op else {
            unreachable!()
        };
        let Run { now, model, h, .. } = self;
        let now = *now;
        let Step {
            model_told,
            expected_expiry,
            ..
        } = st;
        let acts_alone = !model.replica && !model.writes_paused;
        let delay = model.lock_delay;
        let ended = model
            .holders(key)
            .iter()
            .any(|h| now >= h.deadline_ms + delay);
        if ended && acts_alone {
            model.reclaim_touched(key, now);
            // A lock it reclaims, it hands on: usually the timer
            // did already, but not a hand-off a write pause held
            // back, before the node's first run after it.
            model.settle(key, now, model_told);
        }
        // The sweep runs with the timer's conditions.
        let mut cond = h.cond(false);
        cond.set(Conditions::WRITES_PAUSED, h.writes_paused);
        let at = h.at(now);
        let reclaimed = h.with_store(key, |node, store, denied| {
            let admit = &mut |c: u8| !denied.contains(&c);
            store.is_ok_and(|s| {
                let delay = node.limits().lock_delay_ms;
                let ended = lock::holders(s).any(|l| now >= l.grants_held_until(delay));
                let reclaimed = node.reclaim(&key, s, cond, admit, at);
                assert_eq!(reclaimed, ended && acts_alone);
                reclaimed
            })
        });
        // Reported as an expiration when the outputs are drained.
        *expected_expiry = reclaimed.then_some(key);
        true
    }

    pub(super) fn clock_step(&mut self, _st: &mut Step, _step: usize, op: &Op) -> bool {
        let Op::ClockStep { ms } = *op else {
            unreachable!()
        };
        let Run { model, h, .. } = self;
        // Leases, timeouts and the restart delay do not move;
        // fences still rise (max(mark + 1, wall clock)).
        model.wall_offset += ms;
        h.wall_offset += ms;
        true
    }

    pub(super) fn advance(&mut self, st: &mut Step, step: usize, op: &Op) -> bool {
        let Op::Advance { ms } = *op else {
            unreachable!()
        };
        let Run {
            now: clock,
            model,
            h,
            asked,
            granted,
            resumed_at,
            ..
        } = self;
        let Step { tick_wakes, .. } = st;
        for _ in 0..ms {
            *clock += 1;
            let now = *clock;
            let mut model_tick = Vec::new();
            let ran = h.timer(now);
            let taken = model.tick(now, ran, &mut model_tick);
            let d = h.drain();
            follow_timer_reclaims(model, h, now);
            lease_ends_kept(step, model, h, now, *resumed_at);
            assert_eq!(d.released, taken, "step {step}: taken back");
            assert_eq!(d.take_backs, taken.len(), "step {step}: take-backs counted");
            let wakes = d.wakes;
            compare(step, op, model_tick, &wakes);
            check_wakes(h, asked, granted, &wakes, now, &[]);
            tick_wakes.extend(wakes);
        }
        true
    }
}
