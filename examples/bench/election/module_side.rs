//! The module's side of the election benchmark: a candidate campaigns
//! with `LOCK.ACQUIRE key token ttl BLOCK 0`, resigns with `LOCK.RELEASE`,
//! followers wait in `LOCK.OBSERVE key AFTER fence BLOCK 0`; every answer
//! awaited from one thread ([`crate::wire`]).

use std::time::{Duration, Instant};

use super::{Measured, NoIdle, Rounds, KEY, OBSERVERS, SETTLE, TTL_MS};
use crate::common::{RawConn, Resp, Server};
use crate::wire::{since, until_each, Answer, Awaited};

fn blocked_clients(c: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("clients").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits (polling every 200 µs, outside any timed window) until `n`
/// clients are blocked in the server.
fn until_blocked(admin: &mut redis::Connection, n: u64) {
    let started = Instant::now();
    while blocked_clients(admin) < n && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A field of a flat field/value array (RESP2); unknown fields are ignored.
fn reply_field(v: &Resp, name: &str) -> Option<i64> {
    let Resp::Array(items) = v else { return None };
    items.chunks(2).find_map(|c| match c {
        [Resp::Bulk(k), Resp::Int(i)] if k == name.as_bytes() => Some(*i),
        _ => None,
    })
}

fn acquire(c: &mut RawConn, token: &str) -> i64 {
    match c.call(&["LOCK.ACQUIRE", KEY, token, &TTL_MS.to_string()]) {
        Resp::Int(fence) => fence,
        other => panic!("LOCK.ACQUIRE: {other:?}"),
    }
}

/// Campaigns: a place in the server's line, its answer awaited later.
fn send_campaign(c: &mut RawConn, token: &str) {
    c.send(&[
        "LOCK.ACQUIRE",
        KEY,
        token,
        &TTL_MS.to_string(),
        "BLOCK",
        "0",
    ]);
}

fn send_release(c: &mut RawConn, token: &str) {
    c.send(&["LOCK.RELEASE", KEY, token]);
}

fn release(c: &mut RawConn, token: &str) {
    send_release(c, token);
    assert_eq!(c.read(), Resp::Int(1), "LOCK.RELEASE");
}

/// Waits until the leader is no longer the one with `fence`; the answer is
/// awaited later.
fn send_observe(c: &mut RawConn, fence: i64) {
    c.send(&[
        "LOCK.OBSERVE",
        KEY,
        "AFTER",
        &fence.to_string(),
        "BLOCK",
        "0",
    ]);
}

/// Awaits one answer on each of `conns` (sent before), in this thread; when
/// each came after `t0` (µs) and what it was.
fn answers(t0: Instant, conns: &mut [&mut RawConn]) -> Vec<(u64, Resp)> {
    let mut waits: Vec<Answer> = conns.iter_mut().map(|c| Answer::on(c)).collect();
    let mut items: Vec<&mut dyn Awaited> =
        waits.iter_mut().map(|w| w as &mut dyn Awaited).collect();
    let at = since(t0, &until_each(&mut items, None).expect("poll"));
    at.into_iter()
        .zip(waits)
        .map(|(at, w)| (at.expect("every answer came"), w.got.expect("read")))
        .collect()
}

pub(super) fn module_side(server: &Server, r: &Rounds) -> Measured {
    let mut m = Measured::default();
    let mut admin = server.conn();
    let _: () = redis::cmd("FLUSHALL").query(&mut admin).unwrap();
    let (mut a, mut b) = (RawConn::connect(server), RawConn::connect(server));

    // 1. Resign → next leader: the next candidate waiting SETTLE in line,
    // then campaigning since just before. One thread sends the resign and
    // awaits B's grant; A's own answer is read after.
    let variants = [
        (SETTLE, false, &mut m.resign),
        (Duration::ZERO, false, &mut m.resign_now),
        (SETTLE, true, &mut m.resign_no_idle),
    ];
    for (settle, no_idle, out) in variants {
        let held = no_idle.then(NoIdle::hold);
        if held.as_ref().is_some_and(Option::is_none) {
            continue; // not to be had: the row stays empty
        }
        for _ in 0..r.resign {
            acquire(&mut a, "candidate-a");
            send_campaign(&mut b, "candidate-b");
            until_blocked(&mut admin, 1);
            std::thread::sleep(settle);
            let t0 = Instant::now();
            send_release(&mut a, "candidate-a");
            out.push(answers(t0, &mut [&mut b])[0].0);
            assert_eq!(a.read(), Resp::Int(1), "LOCK.RELEASE");
            release(&mut b, "candidate-b");
        }
    }

    // 3. A change → every one of 16 observers told; again with the CPUs
    // kept from idling.
    let mut observers: Vec<RawConn> = (0..OBSERVERS).map(|_| RawConn::connect(server)).collect();
    for (no_idle, out) in [(false, &mut m.observers), (true, &mut m.observers_no_idle)] {
        let held = no_idle.then(NoIdle::hold);
        if held.as_ref().is_some_and(Option::is_none) {
            continue; // not to be had: the row stays empty
        }
        for _ in 0..r.observe {
            let fa = acquire(&mut a, "candidate-a");
            send_campaign(&mut b, "candidate-b");
            for o in &mut observers {
                send_observe(o, fa);
            }
            until_blocked(&mut admin, 1 + OBSERVERS as u64);
            std::thread::sleep(SETTLE);
            let t0 = Instant::now();
            send_release(&mut a, "candidate-a");
            let mut waited: Vec<&mut RawConn> = vec![&mut b];
            waited.extend(observers.iter_mut());
            let told = answers(t0, &mut waited);
            out.extend(told[1..].iter().map(|(at, _)| *at));
            assert_eq!(a.read(), Resp::Int(1), "LOCK.RELEASE");
            release(&mut b, "candidate-b");
        }
    }

    // 4a. Vacancy: the leader resigns with nobody in line.
    for _ in 0..r.vacancy {
        let fa = acquire(&mut a, "candidate-a");
        let obs = &mut observers[0];
        send_observe(obs, fa);
        until_blocked(&mut admin, 1);
        let t0 = Instant::now();
        send_release(&mut a, "candidate-a");
        let told = answers(t0, &mut [obs]);
        let (at, reply) = &told[0];
        m.vacancy
            .push((reply_field(reply, "fence") == Some(0)).then_some(*at));
        assert_eq!(a.read(), Resp::Int(1), "LOCK.RELEASE");
    }

    // 2. Leader killed → next leader: the leader renews, then its
    // connection is dropped without a release; the lease must run out.
    // Again with the CPUs kept from idling.
    for (no_idle, out) in [(false, &mut m.killed), (true, &mut m.killed_no_idle)] {
        let held = no_idle.then(NoIdle::hold);
        if held.as_ref().is_some_and(Option::is_none) {
            continue; // not to be had: the row stays empty
        }
        for _ in 0..r.killed {
            let mut leader = RawConn::connect(server);
            acquire(&mut leader, "candidate-a");
            send_campaign(&mut b, "candidate-b");
            until_blocked(&mut admin, 1);
            let t0 = Instant::now();
            let extended = leader.call(&["LOCK.EXTEND", KEY, "candidate-a", &TTL_MS.to_string()]);
            assert!(
                matches!(extended, Resp::Int(_)),
                "LOCK.EXTEND: {extended:?}"
            );
            drop(leader);
            out.push(answers(t0, &mut [&mut b])[0].0);
            release(&mut b, "candidate-b");
        }
    }

    // 4b. Vacancy: the lease runs out with nobody in line and no command.
    for _ in 0..r.lease_vacancy {
        let mut leader = RawConn::connect(server);
        let obs = &mut observers[0];
        let t0 = Instant::now();
        let fa = acquire(&mut leader, "candidate-a");
        drop(leader);
        send_observe(obs, fa);
        let told = answers(t0, &mut [obs]);
        let (at, reply) = &told[0];
        m.lease_vacancy
            .push((reply_field(reply, "fence") == Some(0)).then_some(*at));
    }
    m
}
