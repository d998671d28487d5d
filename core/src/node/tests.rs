//! The node's decisions, call by call (the model test, `crate::model`,
//! checks whole random histories against a reference).

use super::*;
use crate::error::LockError;
use crate::lock::tests::MemStore;
use crate::lock::{Lock, LockRead, LockStore, Mode};
use crate::node::gate::tests::MemGate;
use crate::observers::Leader;
use crate::output::{Event, Output, Stat};
use crate::time::Now;
use crate::waiters::{Outcome, Wake};

type N = Node<&'static str, u32>;
const T0: i64 = 1_700_000_000_000;

fn now(ms: i64) -> Now {
    Now::same(ms * 1000)
}

fn req(token: &[u8], ttl_ms: i64, block_ms: Option<i64>) -> AcquireRequest<'_> {
    AcquireRequest {
        token,
        value: None,
        mode: Mode::Exclusive,
        ttl_ms,
        block_ms,
        min_fence: 0,
    }
}

const BLOCKING: Conditions = Conditions::MAY_BLOCK;

type Out = Output<&'static str, u32>;

/// Everything the node queued since the last drain.
fn outputs(node: &mut N) -> Vec<Out> {
    std::iter::from_fn(|| node.poll_output()).collect()
}

/// The waiters to answer among `outputs`.
fn wakes_in(outputs: &[Out]) -> Vec<Wake<&'static str, u32>> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Wake(w) => Some((**w).clone()),
            _ => None,
        })
        .collect()
}

/// The waiters to answer, drained with everything else queued.
fn wakes(node: &mut N) -> Vec<Wake<&'static str, u32>> {
    wakes_in(&outputs(node))
}

/// Whether `outputs` report a take-back of `key` (a release by the timer).
fn took_back(outputs: &[Out], key: &'static str) -> bool {
    outputs.contains(&Output::Count(Stat::TakeBack))
        && outputs.contains(&Output::Event(key, Event::Release))
}

fn wait(node: &mut N, store: &mut MemStore, client: u32, r: AcquireRequest<'_>, now_ms: i64) {
    match node.acquire(&"k", Ok(store), r, BLOCKING, &mut AdmitAll, now(now_ms)) {
        Ok(Acquire::Wait(ticket)) => node.enqueue(*ticket, client).unwrap(),
        other => panic!("expected to wait, got {other:?}"),
    }
}

/// The tests' one key, served here or not.
struct OneKey<'a> {
    store: &'a mut MemStore,
    served: Served,
}

impl TimerKeys<&'static str, u32> for OneKey<'_> {
    type Store = MemStore;
    type Admit = AdmitAll;
    type Gate = MemGate;

    fn with_gate<R>(
        &mut self,
        _: &&'static str,
        _: impl FnOnce(Result<&mut MemGate, LockError>) -> R,
    ) -> R {
        unreachable!("no gates in these tests")
    }

    fn with_key<R>(
        &mut self,
        _key: &&'static str,
        f: impl FnOnce(Result<&mut MemStore, LockError>, Served, &mut AdmitAll) -> R,
    ) -> R {
        f(Ok(self.store), self.served.clone(), &mut AdmitAll)
    }

    fn with_keys<R>(
        &mut self,
        _keys: &[&'static str],
        _f: impl FnOnce(Result<&mut [MemStore], LockError>, Served, &mut [AdmitAll]) -> R,
    ) -> R {
        unreachable!("one key, no multi-key waiters")
    }
}

/// A timer run over the one key, with the server's `cond`.
fn run_timer(node: &mut N, store: &mut MemStore, cond: Conditions, now_ms: i64) {
    let mut keys = OneKey {
        store,
        served: Served::Here,
    };
    node.run_timer(&mut keys, cond, now(now_ms))
}

fn tick(node: &mut N, store: &mut MemStore, now_ms: i64) {
    run_timer(node, store, Conditions::empty(), now_ms);
}

/// `(client, granted)` of each waiter answered.
fn answered(woken: &[Wake<&'static str, u32>]) -> Vec<(u32, bool)> {
    woken.iter().map(|w| (w.client, is_grant(w))).collect()
}

fn hold(node: &mut N, store: &mut MemStore, token: &[u8], mode: Mode, ttl_ms: i64, at_ms: i64) {
    let r = AcquireRequest {
        mode,
        ..req(token, ttl_ms, None)
    };
    let got = node.acquire(&"k", Ok(store), r, BLOCKING, &mut AdmitAll, now(at_ms));
    assert!(matches!(got, Ok(Acquire::Granted(_))), "{got:?}");
}

fn release(node: &mut N, store: &mut MemStore, token: &[u8], at_ms: i64) {
    let cond = Conditions::empty();
    let got = node.release(&"k", Ok(store), token, cond, &mut AdmitAll, now(at_ms));
    assert_eq!(got, Ok(true));
}

#[test]
fn the_lock_goes_to_the_first_in_line_when_its_lease_ends() {
    let (mut node, mut store) = (N::default(), MemStore::default());
    hold(&mut node, &mut store, b"h", Mode::Exclusive, 100, T0);
    wait(&mut node, &mut store, 1, req(b"a", 1000, Some(0)), T0);
    wait(&mut node, &mut store, 2, req(b"b", 1000, Some(0)), T0);
    assert_eq!(
        node.next_wakeup_but_lease_ends(),
        Some(T0 + 100),
        "the lease's end"
    );
    tick(&mut node, &mut store, T0 + 99);
    assert!(wakes(&mut node).is_empty());
    tick(&mut node, &mut store, T0 + 100);
    assert_eq!(answered(&wakes(&mut node)), vec![(1, true)]);
    assert_eq!(store.lock().unwrap().token, b"a");
    assert_eq!(
        node.next_wakeup_but_lease_ends(),
        Some(T0 + 1100),
        "a's lease end"
    );
}

/// With the server's keyspace events off for an entry, its decisions queue
/// every output but the events (a grant, a hand-off at a lease's end, a
/// release); from the next swap on, events are queued again.
#[test]
fn an_entry_without_keyspace_events_queues_everything_else() {
    let run = |events: bool| {
        let (mut node, mut store) = (N::default(), MemStore::default());
        node.set_events(events);
        hold(&mut node, &mut store, b"h", Mode::Exclusive, 100, T0);
        wait(&mut node, &mut store, 1, req(b"a", 1000, Some(0)), T0);
        tick(&mut node, &mut store, T0 + 100);
        release(&mut node, &mut store, b"a", T0 + 200);
        let mut taken = std::collections::VecDeque::new();
        node.swap_outputs(&mut taken);
        (node, store, Vec::from(taken))
    };
    let (_, _, with) = run(true);
    let (mut node, mut store, without) = run(false);
    let is_event = |o: &Out| matches!(o, Output::Event(..));
    assert!(with.iter().filter(|o| is_event(o)).count() >= 4, "{with:?}");
    assert!(!without.iter().any(is_event), "{without:?}");
    let rest: Vec<_> = with.into_iter().filter(|o| !is_event(o)).collect();
    assert_eq!(without, rest);
    hold(&mut node, &mut store, b"b", Mode::Exclusive, 100, T0 + 300);
    assert!(outputs(&mut node).contains(&Output::Event("k", Event::Acquire)));
}

/// A waiter whose timeout comes in the millisecond the lock frees is
/// answered timed out, never granted; the next in line gets the lock.
#[test]
fn a_waiter_is_never_granted_at_its_timeout() {
    let (mut node, mut store) = (N::default(), MemStore::default());
    hold(&mut node, &mut store, b"h", Mode::Exclusive, 100, T0);
    wait(&mut node, &mut store, 1, req(b"a", 1000, Some(100)), T0);
    wait(&mut node, &mut store, 2, req(b"b", 1000, Some(0)), T0);
    tick(&mut node, &mut store, T0 + 100);
    let woken = wakes(&mut node);
    assert_eq!(woken[0].outcome, Outcome::TimedOut);
    assert_eq!(answered(&woken), vec![(1, false), (2, true)]);
    tick(&mut node, &mut store, T0 + 200);
    assert!(wakes(&mut node).is_empty(), "answered once");
}

/// One line for every mode: readers at the head go together up to the
/// limit; a writer waits for every holder, and readers behind it wait
/// behind it (writers are not starved, readers are not either).
#[test]
fn one_line_serves_readers_together_and_a_writer_alone_in_arrival_order() {
    let shared = Mode::Shared { limit: Some(2) };
    let (mut node, mut store) = (N::default(), MemStore::default());
    hold(&mut node, &mut store, b"h", Mode::Exclusive, 100, T0);
    for (client, token, mode) in [
        (1, &b"r1"[..], shared),
        (2, b"r2", shared),
        (3, b"r3", shared),
        (4, b"w", Mode::Exclusive),
        (5, b"r5", shared),
    ] {
        let r = AcquireRequest {
            mode,
            ..req(token, 1000, Some(0))
        };
        wait(&mut node, &mut store, client, r, T0);
    }
    tick(&mut node, &mut store, T0 + 100);
    let two = answered(&wakes(&mut node));
    assert_eq!(
        two,
        vec![(1, true), (2, true)],
        "two readers at once: the limit"
    );
    assert_eq!(
        node.next_wakeup_but_lease_ends(),
        Some(T0 + 1100),
        "the first reader's end"
    );
    release(&mut node, &mut store, b"r1", T0 + 200);
    assert_eq!(answered(&wakes(&mut node)), vec![(3, true)]);
    release(&mut node, &mut store, b"r2", T0 + 300);
    assert!(wakes(&mut node).is_empty(), "r5 does not pass the writer");
    assert_eq!(
        node.next_wakeup_but_lease_ends(),
        Some(T0 + 1200),
        "r3's end"
    );
    release(&mut node, &mut store, b"r3", T0 + 400);
    assert_eq!(answered(&wakes(&mut node)), vec![(4, true)]);
    assert_eq!(store.mode(), Some(Mode::Exclusive));
    release(&mut node, &mut store, b"w", T0 + 500);
    assert_eq!(answered(&wakes(&mut node)), vec![(5, true)]);
    assert_eq!(node.total_waiters(), 0);
}

/// A waiter that can never be served as it asked (another limit than
/// the key's) is answered with why when its turn comes, and the line
/// goes on.
#[test]
fn a_waiter_asking_another_limit_is_refused_at_its_turn_and_the_line_goes_on() {
    let (two, three) = (
        Mode::Shared { limit: Some(2) },
        Mode::Shared { limit: Some(3) },
    );
    let (mut node, mut store) = (N::default(), MemStore::default());
    hold(&mut node, &mut store, b"h", Mode::Exclusive, 100, T0);
    for (client, token, mode) in [(1, &b"x"[..], two), (2, b"y", three), (3, b"z", two)] {
        let r = AcquireRequest {
            mode,
            ..req(token, 1000, Some(0))
        };
        wait(&mut node, &mut store, client, r, T0);
    }
    release(&mut node, &mut store, b"h", T0 + 1);
    let woken = wakes(&mut node);
    assert_eq!(answered(&woken), vec![(1, true), (2, false), (3, true)]);
    let mismatch = LockError::LimitMismatch {
        held: Some(2),
        asked: Some(3),
    };
    assert_eq!(woken[1].outcome, Outcome::Failed(mismatch));
}

/// A waiter whose token came to hold the key while it waited (written
/// from outside: a master's `LOCK._SET`, a `RESTORE`) is answered with
/// a renewal: the same fence, no new grant.
#[test]
fn a_waiter_whose_token_holds_the_key_at_its_turn_is_renewed() {
    let (mut node, mut store) = (N::default(), MemStore::default());
    hold(&mut node, &mut store, b"h", Mode::Exclusive, 100, T0);
    wait(&mut node, &mut store, 1, req(b"a", 1000, Some(0)), T0);
    // The key now holds "a"'s lock, as a master's LOCK._SET writes it.
    let wall_deadline_ms = T0 + 500;
    node.apply_set(
        &"k",
        &mut store,
        &set_args(b"a", 77, wall_deadline_ms, T0),
        now(T0 + 1),
    )
    .unwrap();
    node.keys_changed(|_| true, T0 + 1);
    tick(&mut node, &mut store, T0 + 2);
    let woken = wakes(&mut node);
    assert!(
        matches!(
            woken[0].outcome,
            Outcome::Granted {
                fence: 77,
                renewed: true,
                ..
            }
        ),
        "{woken:?}"
    );
}

#[test]
fn a_paused_node_refuses_new_grants_and_lets_holders_renew() {
    let mut node = N::default();
    let mut store = MemStore::default();
    node.set_limits(
        Limits {
            restart_delay_ms: 500,
            ..Limits::default()
        },
        T0,
    );
    let got = node.acquire(
        &"k",
        Ok(&mut store),
        req(b"a", 100, None),
        Conditions::empty(),
        &mut AdmitAll,
        now(T0),
    );
    assert_eq!(
        got,
        Ok(Acquire::Granted(T0 * 1000)),
        "not serving yet: no delay"
    );
    node.start_serving(now(T0));
    let renew = node.acquire(
        &"k",
        Ok(&mut store),
        req(b"a", 100, None),
        Conditions::empty(),
        &mut AdmitAll,
        now(T0 + 1),
    );
    assert_eq!(renew, Ok(Acquire::Renewed(T0 * 1000)));
    assert_eq!(
        node.release(
            &"k",
            Ok(&mut store),
            b"a",
            Conditions::empty(),
            &mut AdmitAll,
            now(T0 + 2)
        ),
        Ok(true)
    );
    let paused = node.acquire(
        &"k",
        Ok(&mut store),
        req(b"b", 100, None),
        Conditions::empty(),
        &mut AdmitAll,
        now(T0 + 100),
    );
    assert_eq!(paused, Err(LockError::GrantsPaused(400)));
    assert!(store.lock().is_none());
}

/// Defect 1 of issue 15: lowering lock.restart-delay-ms while a client
/// waits out the delay must serve it at once.
#[test]
fn lowering_the_restart_delay_serves_the_waiters_it_held() {
    let mut node = N::default();
    let mut store = MemStore::default();
    node.set_limits(
        Limits {
            restart_delay_ms: 20_000,
            ..Limits::default()
        },
        T0,
    );
    node.start_serving(now(T0));
    wait(&mut node, &mut store, 1, req(b"w", 5000, Some(5000)), T0);
    assert_eq!(
        node.next_wakeup(),
        Some(T0 + 5000),
        "its timeout comes first"
    );
    node.set_limits(Limits::default(), T0 + 300);
    assert_eq!(node.next_wakeup(), Some(T0 + 300));
    tick(&mut node, &mut store, T0 + 300);
    let woken = wakes(&mut node);
    assert_eq!(woken.len(), 1);
    assert!(is_grant(&woken[0]), "{woken:?}");
    assert_eq!(store.lock().unwrap().token, b"w");
}

/// Defect 2 of issue 15: a hand-off applies the max-ttl-ms in force
/// when it grants; the waiter is told so instead of getting a lease
/// the node no longer allows.
#[test]
fn a_hand_off_applies_the_limits_in_force_then() {
    let mut node = N::default();
    let mut store = MemStore::default();
    node.acquire(
        &"k",
        Ok(&mut store),
        req(b"h", 300, None),
        BLOCKING,
        &mut AdmitAll,
        now(T0),
    )
    .unwrap();
    wait(&mut node, &mut store, 1, req(b"w", 600_000, Some(5000)), T0);
    wait(&mut node, &mut store, 2, req(b"v", 500, Some(5000)), T0);
    node.set_limits(
        Limits {
            max_ttl_ms: 1000,
            ..Limits::default()
        },
        T0 + 10,
    );
    tick(&mut node, &mut store, T0 + 10);
    assert!(wakes(&mut node).is_empty(), "still held");
    tick(&mut node, &mut store, T0 + 300);
    let woken = wakes(&mut node);
    assert_eq!(woken.len(), 2);
    assert_eq!(woken[0].client, 1);
    assert_eq!(
        woken[0].outcome,
        Outcome::Failed(LockError::TtlTooLarge("'600000'".into(), 1000))
    );
    assert!(is_grant(&woken[1]));
    assert_eq!(store.lock().unwrap().deadline_ms, T0 + 800);
}

#[test]
fn a_waiter_whose_user_lost_the_command_is_refused_and_skipped() {
    let mut node = N::default();
    let mut store = MemStore::default();
    node.acquire(
        &"k",
        Ok(&mut store),
        req(b"h", 100, None),
        BLOCKING,
        &mut AdmitAll,
        now(T0),
    )
    .unwrap();
    wait(&mut node, &mut store, 1, req(b"a", 100, Some(0)), T0);
    wait(&mut node, &mut store, 2, req(b"b", 100, Some(0)), T0);
    let released = node.release(
        &"k",
        Ok(&mut store),
        b"h",
        Conditions::empty(),
        &mut |c: u32| c != 1,
        now(T0 + 5),
    );
    assert_eq!(released, Ok(true));
    let woken = wakes(&mut node);
    assert_eq!(woken[0].outcome, Outcome::Failed(LockError::NoPermission));
    assert!(is_grant(&woken[1]));
    assert_eq!(store.lock().unwrap().token, b"b");
}

#[test]
fn an_undelivered_grant_is_taken_back_and_handed_on() {
    let mut node = N::default();
    let mut store = MemStore::default();
    node.acquire(
        &"k",
        Ok(&mut store),
        req(b"h", 100, None),
        BLOCKING,
        &mut AdmitAll,
        now(T0),
    )
    .unwrap();
    wait(&mut node, &mut store, 1, req(b"a", 100, Some(0)), T0);
    wait(&mut node, &mut store, 2, req(b"b", 100, Some(0)), T0);
    node.release(
        &"k",
        Ok(&mut store),
        b"h",
        Conditions::empty(),
        &mut AdmitAll,
        now(T0 + 1),
    )
    .unwrap();
    let Outcome::Granted { fence, lease, .. } = wakes(&mut node)[0].outcome.clone() else {
        panic!()
    };
    node.undelivered("k", fence, lease, T0 + 1);
    // While writes are paused it waits; on the next run it goes.
    run_timer(&mut node, &mut store, Conditions::WRITES_PAUSED, T0 + 1);
    assert_eq!(outputs(&mut node), []);
    assert_eq!(store.lock().unwrap().token, b"a", "still granted");
    assert_eq!(node.next_wakeup(), Some(T0 + 1 + RETRY_MS));
    run_timer(&mut node, &mut store, Conditions::empty(), T0 + 11);
    let out = outputs(&mut node);
    assert!(took_back(&out, "k"), "{out:?}");
    let woken = wakes_in(&out);
    assert_eq!((woken.len(), woken[0].client), (1, 2));
    assert_eq!(store.lock().unwrap().token, b"b");
}

/// Keys by name, all served here.
#[derive(Default)]
struct Keys(std::collections::HashMap<&'static str, MemStore>);

impl TimerKeys<&'static str, u32> for Keys {
    type Store = MemStore;
    type Admit = AdmitAll;
    type Gate = MemGate;

    fn with_gate<R>(
        &mut self,
        _: &&'static str,
        _: impl FnOnce(Result<&mut MemGate, LockError>) -> R,
    ) -> R {
        unreachable!("no gates in these tests")
    }

    fn with_key<R>(
        &mut self,
        key: &&'static str,
        f: impl FnOnce(Result<&mut MemStore, LockError>, Served, &mut AdmitAll) -> R,
    ) -> R {
        f(
            Ok(self.0.entry(*key).or_default()),
            Served::Here,
            &mut AdmitAll,
        )
    }

    fn with_keys<R>(
        &mut self,
        keys: &[&'static str],
        f: impl FnOnce(Result<&mut [MemStore], LockError>, Served, &mut [AdmitAll]) -> R,
    ) -> R {
        let mut stores: Vec<MemStore> = keys
            .iter()
            .map(|k| self.0.remove(k).unwrap_or_default())
            .collect();
        let mut admits: Vec<AdmitAll> = keys.iter().map(|_| AdmitAll).collect();
        let out = f(Ok(&mut stores), Served::Here, &mut admits);
        for (k, s) in keys.iter().zip(stores) {
            self.0.insert(k, s);
        }
        out
    }
}

/// Keys that came due at different times during a pause are all handed
/// on at the first timer run after it: one retry instant, not one per
/// key (which would hand each on up to RETRY_MS apart after the pause).
#[test]
fn what_a_pause_held_back_goes_on_at_one_run() {
    // Two keys whose leases end during a pause, at T0 + 5 and T0 + 8.
    let paused_node = || {
        let mut node = N::default();
        let mut keys = Keys::default();
        for (key, ttl) in [("a", 5), ("b", 8)] {
            let store = keys.0.entry(key).or_default();
            let held = node.acquire(
                &key,
                Ok(store),
                req(b"h", ttl, None),
                BLOCKING,
                &mut AdmitAll,
                now(T0),
            );
            assert!(matches!(held, Ok(Acquire::Granted(_))));
            let wait = node.acquire(
                &key,
                Ok(store),
                req(b"w", 100, Some(0)),
                BLOCKING,
                &mut AdmitAll,
                now(T0),
            );
            let Ok(Acquire::Wait(ticket)) = wait else {
                panic!("{wait:?}")
            };
            node.enqueue(*ticket, if key == "a" { 1 } else { 2 })
                .unwrap();
        }
        let paused = Conditions::WRITES_PAUSED;
        assert_eq!(node.next_wakeup_but_lease_ends(), Some(T0 + 5));
        node.run_timer(&mut keys, paused, now(T0 + 5));
        assert_eq!(node.next_wakeup_but_lease_ends(), Some(T0 + 8));
        node.run_timer(&mut keys, paused, now(T0 + 8));
        assert_eq!(
            node.next_wakeup_but_lease_ends(),
            Some(T0 + 5 + RETRY_MS),
            "one instant"
        );
        assert!(wakes(&mut node).is_empty());
        (node, keys)
    };
    // The pause ended: the run at the retry instant hands both on, and
    // so does any earlier run that acts alone (woken by something
    // else): the hold is over.
    for resumed_at in [T0 + 5 + RETRY_MS, T0 + 9] {
        let (mut node, mut keys) = paused_node();
        node.run_timer(&mut keys, Conditions::empty(), now(resumed_at));
        let mut woken: Vec<u32> = wakes(&mut node).iter().map(|w| w.client).collect();
        woken.sort();
        assert_eq!(woken, [1, 2], "resumed at T0 + {}", resumed_at - T0);
        assert_eq!(node.next_wakeup_but_lease_ends(), None);
    }
}

#[test]
fn a_replica_hands_nothing_on_and_drops_take_backs() {
    let mut node = N::default();
    let mut store = MemStore::default();
    node.acquire(
        &"k",
        Ok(&mut store),
        req(b"h", 100, None),
        BLOCKING,
        &mut AdmitAll,
        now(T0),
    )
    .unwrap();
    wait(&mut node, &mut store, 1, req(b"a", 100, Some(50)), T0);
    node.undelivered("k", 1, 1, T0);
    run_timer(&mut node, &mut store, Conditions::REPLICA, T0 + 100);
    assert_eq!(store.lock().unwrap().token, b"h", "nothing handed on");
    let out = outputs(&mut node);
    assert!(!took_back(&out, "k"));
    let woken = wakes_in(&out);
    assert_eq!(woken[0].outcome, Outcome::TimedOut, "timeouts still run");
    assert_eq!(node.next_wakeup_but_lease_ends(), None, "take-back dropped");
    let refused = node.acquire(
        &"k",
        Ok(&mut store),
        req(b"x", 100, None),
        Conditions::REPLICA,
        &mut AdmitAll,
        now(T0),
    );
    assert_eq!(refused, Err(LockError::ReadOnlyReplica));
}

#[test]
fn a_key_that_left_the_node_redirects_its_line() {
    let mut node = N::default();
    let mut store = MemStore::default();
    node.acquire(
        &"k",
        Ok(&mut store),
        req(b"h", 100, None),
        BLOCKING,
        &mut AdmitAll,
        now(T0),
    )
    .unwrap();
    wait(&mut node, &mut store, 1, req(b"a", 100, Some(0)), T0);
    store.clear();
    node.keys_changed(|_| true, T0 + 1);
    let mut keys = OneKey {
        store: &mut store,
        served: Served::Elsewhere("ASK 1 127.0.0.1:7001".into()),
    };
    node.run_timer(&mut keys, Conditions::empty(), now(T0 + 1));
    let woken = wakes(&mut node);
    assert_eq!(
        woken[0].outcome,
        Outcome::Failed(LockError::Redirect("ASK 1 127.0.0.1:7001".into()))
    );
    assert!(
        store.lock().is_none(),
        "no lock granted for a key given away"
    );
}

#[test]
fn full_lines_refuse_before_anyone_blocks() {
    let mut node = N::default();
    let mut store = MemStore::default();
    node.set_limits(
        Limits {
            max_waiters_per_key: 1,
            ..Limits::default()
        },
        T0,
    );
    node.acquire(
        &"k",
        Ok(&mut store),
        req(b"h", 100, None),
        BLOCKING,
        &mut AdmitAll,
        now(T0),
    )
    .unwrap();
    wait(&mut node, &mut store, 1, req(b"a", 100, Some(0)), T0);
    let full = node.acquire(
        &"k",
        Ok(&mut store),
        req(b"b", 100, Some(0)),
        BLOCKING,
        &mut AdmitAll,
        now(T0),
    );
    assert_eq!(full, Err(LockError::TooManyWaiters(1)));
    let not_blocking = node.acquire(
        &"k",
        Ok(&mut store),
        req(b"b", 100, Some(0)),
        Conditions::empty(),
        &mut AdmitAll,
        now(T0),
    );
    assert_eq!(not_blocking, Ok(Acquire::Contended), "MULTI: nil at once");
}

#[test]
fn eviction_unsafe_servers_refuse_new_locks_and_hand_offs_but_not_renewals() {
    let mut node = N::default();
    let mut store = MemStore::default();
    node.acquire(
        &"k",
        Ok(&mut store),
        req(b"h", 100, None),
        BLOCKING,
        &mut AdmitAll,
        now(T0),
    )
    .unwrap();
    wait(&mut node, &mut store, 1, req(b"a", 100, Some(0)), T0);
    let evictable = Conditions::EVICTABLE | Conditions::MAY_BLOCK;
    let renew = node.acquire(
        &"k",
        Ok(&mut store),
        req(b"h", 100, None),
        evictable,
        &mut AdmitAll,
        now(T0 + 1),
    );
    assert_eq!(renew, Ok(Acquire::Renewed(T0 * 1000)));
    node.release(
        &"k",
        Ok(&mut store),
        b"h",
        evictable,
        &mut AdmitAll,
        now(T0 + 2),
    )
    .unwrap();
    let woken = wakes(&mut node);
    assert_eq!(woken[0].outcome, Outcome::Failed(LockError::EvictionUnsafe));
    assert!(store.lock().is_none());
    let fresh = node.acquire(
        &"k",
        Ok(&mut store),
        req(b"x", 100, None),
        evictable,
        &mut AdmitAll,
        now(T0 + 3),
    );
    assert_eq!(fresh, Err(LockError::EvictionUnsafe));
}

/// Issue 22: a holder's same-token ACQUIRE (the safe retry) renews
/// whatever lock.max-token-len became since its grant; new holders, in
/// line or not, are held to it.
#[test]
fn a_holder_retries_after_the_token_limit_was_lowered() {
    let mut node = N::default();
    let mut store = MemStore::default();
    let long = b"a-rather-long-token";
    let got = node.acquire(
        &"k",
        Ok(&mut store),
        req(long, 100, None),
        BLOCKING,
        &mut AdmitAll,
        now(T0),
    );
    assert_eq!(got, Ok(Acquire::Granted(T0 * 1000)));
    node.set_limits(
        Limits {
            max_token_len: 4,
            ..Limits::default()
        },
        T0,
    );
    let retry = node.acquire(
        &"k",
        Ok(&mut store),
        req(long, 100, None),
        BLOCKING,
        &mut AdmitAll,
        now(T0 + 1),
    );
    assert_eq!(retry, Ok(Acquire::Renewed(T0 * 1000)));
    let line = node.acquire(
        &"k",
        Ok(&mut store),
        req(b"12345", 100, Some(0)),
        BLOCKING,
        &mut AdmitAll,
        now(T0 + 2),
    );
    assert_eq!(line, Err(LockError::TokenOverLimit(5, 4)));
}

/// Issue 22: above maxmemory a hand-off is refused as a new grant is.
#[test]
fn a_hand_off_above_maxmemory_fails_the_waiter_with_oom() {
    let mut node = N::default();
    let mut store = MemStore::default();
    node.acquire(
        &"k",
        Ok(&mut store),
        req(b"h", 100, None),
        BLOCKING,
        &mut AdmitAll,
        now(T0),
    )
    .unwrap();
    wait(&mut node, &mut store, 1, req(b"a", 100, Some(0)), T0);
    let oom = Conditions::OOM;
    let released = node.release(&"k", Ok(&mut store), b"h", oom, &mut AdmitAll, now(T0 + 1));
    assert_eq!(released, Ok(true));
    let woken = wakes(&mut node);
    assert_eq!(woken[0].outcome, Outcome::Failed(LockError::OutOfMemory));
    assert!(store.lock().is_none());
}

/// A store that panics on the n-th write: a decision cut short.
struct PanickingStore {
    inner: MemStore,
    writes_left: u32,
}

impl PanickingStore {
    fn write(&mut self) {
        if self.writes_left == 0 {
            panic!("injected: the store failed mid-decision");
        }
        self.writes_left -= 1;
    }
}

impl LockRead for PanickingStore {
    fn mode(&self) -> Option<Mode> {
        self.inner.mode()
    }
    fn holder_at(&self, i: usize) -> Option<Lock<'_>> {
        self.inner.holder_at(i)
    }
}

impl LockStore for PanickingStore {
    fn put(&mut self, mode: Mode, lock: Lock<'_>) {
        self.write();
        LockStore::put(&mut self.inner, mode, lock)
    }
    fn add(&mut self, lock: Lock<'_>) {
        self.write();
        LockStore::add(&mut self.inner, lock)
    }
    fn renew(&mut self, token: &[u8], deadline_ms: i64, lease: u64) {
        self.write();
        LockStore::renew(&mut self.inner, token, deadline_ms, lease)
    }
    fn set_mode(&mut self, mode: Mode) {
        self.write();
        LockStore::set_mode(&mut self.inner, mode)
    }
    fn remove(&mut self, token: &[u8]) {
        self.write();
        LockStore::remove(&mut self.inner, token)
    }
}

/// Issue 22: a panic inside a decision (here: the hand-off's write,
/// after the release's) leaves no barging and no stranded waiter once
/// the glue recovered as it does (`recover_from_panic`, then the timer).
#[test]
fn a_panic_inside_a_hand_off_strands_no_waiter_and_lets_nobody_barge() {
    for writes_before_panic in 0..3 {
        let mut node = N::default();
        let mut store = PanickingStore {
            inner: MemStore::default(),
            writes_left: u32::MAX,
        };
        node.acquire(
            &"k",
            Ok(&mut store),
            req(b"h", 100, None),
            BLOCKING,
            &mut AdmitAll,
            now(T0),
        )
        .unwrap();
        match node.acquire(
            &"k",
            Ok(&mut store),
            req(b"w", 100, Some(0)),
            BLOCKING,
            &mut AdmitAll,
            now(T0),
        ) {
            Ok(Acquire::Wait(ticket)) => node.enqueue(*ticket, 1).unwrap(),
            other => panic!("expected to wait, got {other:?}"),
        }
        store.writes_left = writes_before_panic;
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            node.release(
                &"k",
                Ok(&mut store),
                b"h",
                Conditions::empty(),
                &mut AdmitAll,
                now(T0 + 1),
            )
        }));
        store.writes_left = u32::MAX;
        let handed = wakes(&mut node);
        if caught.is_ok() {
            // The hand-off went through before the injected failure.
            assert!(
                handed.iter().any(is_grant),
                "{writes_before_panic}: {handed:?}"
            );
            continue;
        }
        node.recover_from_panic(T0 + 1);
        // Before the timer runs: a plain ACQUIRE does not barge past
        // the line, whatever the lock's state was left in.
        let barge = node.acquire(
            &"k",
            Ok(&mut store),
            req(b"x", 100, None),
            Conditions::empty(),
            &mut AdmitAll,
            now(T0 + 1),
        );
        assert_eq!(barge, Ok(Acquire::Contended), "{writes_before_panic}");
        // The timer runs when the node asks, and the waiter is served
        // once the lock is free (at once, or at the holder's lease end
        // when the release never happened): never left waiting.
        let mut all = handed;
        all.extend(wakes(&mut node));
        while !all.iter().any(|w| w.client == 1) {
            let due = node
                .next_wakeup()
                .expect("the waiter has a timer run coming");
            assert!(
                due <= T0 + 100,
                "{writes_before_panic}: stranded until {due}"
            );
            tick(&mut node, &mut store.inner, due);
            all.extend(wakes(&mut node));
        }
        assert!(all.iter().any(|w| w.client == 1 && is_grant(w)), "{all:?}");
        assert_eq!(store.inner.lock().unwrap().token, b"w");
    }
}

/// Issue 22: a lock from outside is checked and observed in one step;
/// a refused one changes nothing (the store and the mark), an accepted
/// one raises the mark and is capped at this node's max-ttl.
#[test]
fn a_lock_from_outside_is_taken_whole_or_not_at_all() {
    let mut node = N::default();
    node.set_limits(
        Limits {
            max_ttl_ms: 1_000,
            ..Limits::default()
        },
        T0,
    );
    let mut store = MemStore::default();
    let at = now(T0);
    let too_far = T0 * 1000 + crate::limits::MAX_FENCE_LEAD + 10;
    let refused = node.apply_set(
        &"k",
        &mut store,
        &set_args(b"t", too_far, T0 + 60_000, T0),
        at,
    );
    assert!(refused.is_err());
    assert!(store.lock().is_none(), "nothing stored");
    assert_eq!(node.fence_hwm(), 0, "the mark did not move");
    assert!(node
        .accept_value(None, &[(too_far, T0 + 60_000, T0)], true, at)
        .is_err());
    assert_eq!(node.fence_hwm(), 0);
    // One refused holder refuses the value whole: the mark stays.
    let ok = T0 * 1000 + 1;
    let two = [(ok, T0 + 60_000, T0), (too_far, T0 + 60_000, T0)];
    assert_eq!(
        node.accept_value(None, &two, true, at).unwrap_err().0,
        too_far
    );
    assert_eq!(node.fence_hwm(), 0);

    let fence = T0 * 1000 + 5;
    node.apply_set(
        &"k",
        &mut store,
        &set_args(b"t", fence, T0 + 60_000, T0),
        at,
    )
    .unwrap();
    assert_eq!(node.fence_hwm(), fence);
    let held = store.lock().unwrap();
    assert_eq!(held.deadline_ms, T0 + 1_000, "capped at max-ttl");
    assert_eq!(node.fence_of(&store, Some(b"t"), T0 + 1), Some(fence));
    assert_eq!(node.fence_of(&store, Some(b"x"), T0 + 1), None);
    assert_eq!(
        node.info(&"k", &store, T0 + 1)
            .map(|h| (h.live[h.newest].fence, h.live.len(), h.waiters)),
        Some((fence, 1, 0))
    );
    // A RESTORE raises the mark; an RDB value leaves it to the aux field.
    let loaded = node
        .accept_value(None, &[(fence + 10, T0 + 500, 0)], false, at)
        .unwrap()[0];
    assert_eq!((loaded.deadline_ms, node.fence_hwm()), (T0 + 500, fence));
    let restored = node
        .accept_value(
            None,
            &[(fence + 10, T0 + 500, 0), (fence + 20, T0 + 500, 0)],
            true,
            at,
        )
        .unwrap();
    assert_eq!(node.fence_hwm(), fence + 20, "raised to the highest");
    assert!(restored[0].lease > loaded.lease, "a new lease id each");
    assert!(restored[1].lease > restored[0].lease);
}

/// Gates only, by name (a timer run puts evicted ones back).
#[derive(Default)]
struct Gates(std::collections::HashMap<&'static str, MemGate>);

impl TimerKeys<&'static str, u32> for Gates {
    type Store = MemStore;
    type Admit = AdmitAll;
    type Gate = MemGate;

    fn with_gate<R>(
        &mut self,
        key: &&'static str,
        f: impl FnOnce(Result<&mut MemGate, LockError>) -> R,
    ) -> R {
        f(Ok(self.0.entry(*key).or_default()))
    }

    fn with_key<R>(
        &mut self,
        _: &&'static str,
        _: impl FnOnce(Result<&mut MemStore, LockError>, Served, &mut AdmitAll) -> R,
    ) -> R {
        unreachable!("gates only")
    }

    fn with_keys<R>(
        &mut self,
        _: &[&'static str],
        _: impl FnOnce(Result<&mut [MemStore], LockError>, Served, &mut [AdmitAll]) -> R,
    ) -> R {
        unreachable!("gates only")
    }
}

/// A fence through the gate `g` of `gates`, as `LOCK.FENCED` asks it.
fn fenced(node: &mut N, gates: &mut Gates, g: &'static str, fence: i64) -> Result<(), LockError> {
    let gate = gates.0.entry(g).or_default();
    let wall_us = now(T0).wall_us;
    node.pass_gate(&g, &*gate, fence, Conditions::empty(), wall_us)?;
    node.record_fence(&g, gate, fence);
    Ok(())
}

#[test]
fn a_gate_only_rises_and_counts_what_it_refuses() {
    let (mut node, mut gates) = (N::default(), Gates::default());
    assert_eq!(fenced(&mut node, &mut gates, "g", 10), Ok(()));
    assert_eq!(
        fenced(&mut node, &mut gates, "g", 10),
        Ok(()),
        "the same holder again"
    );
    let out = outputs(&mut node);
    assert_eq!(
        out,
        vec![
            Output::GateRaised("g", 10),
            Output::Count(Stat::FencedRan),
            Output::Count(Stat::FencedRan),
        ],
        "raised once: the same mark is no change to replicate"
    );
    assert_eq!(
        fenced(&mut node, &mut gates, "g", 9),
        Err(LockError::StaleFence { fence: 9, mark: 10 })
    );
    assert_eq!(outputs(&mut node), vec![Output::Count(Stat::FencedStale)]);
    // From the master: never lowered; another type refused.
    let gate = gates.0.get_mut("g").unwrap();
    assert_eq!(node.apply_gate(gate, 5, now(T0).wall_us), Ok(false));
    assert_eq!(node.apply_gate(gate, 12, now(T0).wall_us), Ok(true));
    assert_eq!(gate.mark, Some(12));
    assert!(
        outputs(&mut node).is_empty(),
        "a mark from outside is not replicated again"
    );
    let mut other = MemGate {
        other_type: true,
        ..MemGate::default()
    };
    assert_eq!(
        node.apply_gate(&mut other, 12, now(T0).wall_us),
        Err(LockError::WrongType)
    );
    // The command made the gate's key another type: left as it made it.
    node.record_fence(&"g", &mut other, 20);
    assert_eq!(other.mark, None);
    assert_eq!(outputs(&mut node), vec![Output::Count(Stat::FencedRan)]);
}

#[test]
fn an_evicted_gate_keeps_its_mark_until_it_is_put_back() {
    let (mut node, mut gates) = (N::default(), Gates::default());
    fenced(&mut node, &mut gates, "g", 50).unwrap();
    outputs(&mut node);
    // Maxmemory evicts it: the key is gone, its mark kept.
    let mark = gates.0.remove("g").unwrap().mark.unwrap();
    node.gate_evicted("g", mark, T0);
    assert_eq!(node.next_wakeup(), Some(T0), "put back at once");
    assert_eq!(
        fenced(&mut node, &mut gates, "g", 40),
        Err(LockError::StaleFence {
            fence: 40,
            mark: 50
        }),
        "a stale fence does not pass the evicted gate"
    );
    gates.0.remove("g");
    outputs(&mut node);
    // Writes paused: it waits; then it is put back.
    node.run_timer(&mut gates, Conditions::WRITES_PAUSED, now(T0));
    assert!(!gates.0.contains_key("g"));
    assert_eq!(node.next_wakeup(), Some(T0 + RETRY_MS));
    node.run_timer(&mut gates, Conditions::empty(), now(T0 + RETRY_MS));
    assert_eq!(gates.0["g"].mark, Some(50));
    assert_eq!(
        outputs(&mut node),
        vec![
            Output::GateRaised("g", 50),
            Output::Count(Stat::GatePutBack)
        ]
    );
    assert_eq!(node.next_wakeup(), None);
    // A fence that passes settles a kept mark at once; on a replica kept
    // marks are dropped (its master's data wins).
    node.gate_evicted("g", 60, T0 + 20);
    gates.0.remove("g");
    assert_eq!(fenced(&mut node, &mut gates, "g", 61), Ok(()));
    node.gate_evicted("h", 70, T0 + 20);
    node.run_timer(&mut gates, Conditions::REPLICA, now(T0 + 20));
    assert!(!gates.0.contains_key("h"));
    assert_eq!(node.next_wakeup(), None);
}

/// What an observer of `"k"` was told, among `wakes`.
fn observed(wakes: &[Wake<&'static str, u32>]) -> Vec<(u32, Outcome)> {
    wakes
        .iter()
        .map(|w| (w.client, w.outcome.clone()))
        .collect()
}

/// `client` observes `"k"` having seen `after`, blocking `block_ms`.
fn watch(node: &mut N, store: &MemStore, client: u32, after: i64, block_ms: i64, at_ms: i64) {
    match node.observe(
        &"k",
        Ok(store),
        Some(after),
        None,
        Some(block_ms),
        BLOCKING,
        now(at_ms),
    ) {
        Ok(Observation::Wait(ticket)) => node.start_observing(ticket, client).unwrap(),
        other => panic!("expected to observe, got {other:?}"),
    }
}

#[test]
fn an_observer_is_told_of_a_vacancy_when_the_lease_ends_without_any_command() {
    let mut node = N::default();
    let mut store = MemStore::default();
    hold(&mut node, &mut store, b"a", Mode::Exclusive, 100, T0);
    let fence = node.fence_of(&store, None, T0).unwrap();
    outputs(&mut node);
    let seen = node.observe(&"k", Ok(&store), None, None, None, BLOCKING, now(T0 + 1));
    assert_eq!(
        seen,
        Ok(Observation::Now(Leader::Held {
            fence,
            ttl_ms: 99,
            value: Box::default()
        }))
    );
    // It saw that leader and waits: the node wakes at the lease's end.
    watch(&mut node, &store, 7, fence, 0, T0 + 1);
    assert_eq!(node.next_wakeup(), Some(T0 + 100));
    tick(&mut node, &mut store, T0 + 99);
    assert!(wakes(&mut node).is_empty());
    tick(&mut node, &mut store, T0 + 100);
    assert_eq!(
        observed(&wakes(&mut node)),
        vec![(7, Outcome::Observed(Leader::Vacant))]
    );
    assert_eq!(node.observing(&"k"), 0);
}

#[test]
fn a_hand_off_at_the_lease_end_tells_the_new_leader_and_a_renewal_tells_nobody() {
    let mut node = N::default();
    let mut store = MemStore::default();
    hold(&mut node, &mut store, b"a", Mode::Exclusive, 100, T0);
    let fence = node.fence_of(&store, None, T0).unwrap();
    wait(&mut node, &mut store, 1, req(b"b", 100, Some(0)), T0);
    watch(&mut node, &store, 7, fence, 1_000, T0);
    // The holder renews: the same leader, nobody is told, the check moves.
    let cond = Conditions::empty();
    let extended = node.extend(
        &"k",
        Ok(&mut store),
        (b"a", None),
        150,
        cond,
        &mut AdmitAll,
        now(T0 + 50),
    );
    assert_eq!(extended, Ok(true));
    tick(&mut node, &mut store, T0 + 51);
    assert!(observed(&wakes(&mut node)).is_empty());
    tick(&mut node, &mut store, T0 + 100);
    assert!(observed(&wakes(&mut node)).is_empty());
    // At the new end the waiter takes it: the observer hears of it, not of
    // the instant between.
    tick(&mut node, &mut store, T0 + 200);
    let told = observed(&wakes(&mut node));
    let next = node.fence_of(&store, None, T0 + 200).unwrap();
    assert!(next > fence);
    let new_leader = Leader::Held {
        fence: next,
        ttl_ms: 100,
        value: Box::default(),
    };
    assert!(
        told.contains(&(7, Outcome::Observed(new_leader))),
        "{told:?}"
    );
}

#[test]
fn an_observer_that_saw_another_leader_is_answered_at_once_or_nil_without_block() {
    let mut node = N::default();
    let mut store = MemStore::default();
    let free = node.observe(&"k", Ok(&store), Some(0), None, None, BLOCKING, now(T0));
    assert_eq!(free, Ok(Observation::Nil));
    // Inside MULTI or a script, BLOCK answers at once.
    let free = node.observe(
        &"k",
        Ok(&store),
        Some(0),
        None,
        Some(0),
        Conditions::empty(),
        now(T0),
    );
    assert_eq!(free, Ok(Observation::Nil));
    hold(&mut node, &mut store, b"a", Mode::Exclusive, 100, T0);
    let seen = node.observe(&"k", Ok(&store), Some(0), None, Some(0), BLOCKING, now(T0));
    assert!(matches!(seen, Ok(Observation::Now(Leader::Held { .. }))));
    let wrong: Result<&MemStore, LockError> = Err(LockError::WrongType);
    assert_eq!(
        node.observe(&"k", wrong, None, None, None, BLOCKING, now(T0)),
        Err(LockError::WrongType)
    );
}

#[test]
fn an_observer_that_leaves_or_times_out_leaves_nothing() {
    let mut node = N::default();
    let mut store = MemStore::default();
    watch(&mut node, &store, 7, 0, 10, T0);
    watch(&mut node, &store, 8, 0, 0, T0);
    assert!(node.leave(8, T0));
    assert_eq!(node.next_wakeup(), Some(T0 + 10));
    tick(&mut node, &mut store, T0 + 10);
    assert_eq!(observed(&wakes(&mut node)), vec![(7, Outcome::TimedOut)]);
    assert_eq!(node.observing(&"k"), 0);
    assert_eq!(node.next_wakeup(), None);
}

/// `LOCK._SET`'s arguments for a holder without a value.
fn set_args(
    token: &[u8],
    fence: i64,
    deadline_ms: i64,
    granted_ms: i64,
) -> crate::args::SetArgs<'_> {
    crate::args::SetArgs {
        token,
        value: b"",
        fence,
        deadline_ms,
        granted_ms,
    }
}

/// `AFTER fence VALUE v`: what the client saw is that fence with that
/// value, so a proclaim it missed between two calls is answered at once;
/// the value it names as the holder's now waits as `AFTER` alone does.
#[test]
fn after_with_the_value_seen_answers_a_proclaim_made_meanwhile() {
    let mut node = N::default();
    let mut store = MemStore::default();
    let r = AcquireRequest {
        value: Some(&b"v2"[..]),
        ..req(b"a", 100, None)
    };
    let got = node.acquire(&"k", Ok(&mut store), r, BLOCKING, &mut AdmitAll, now(T0));
    let Ok(Acquire::Granted(fence)) = got else {
        panic!("{got:?}")
    };
    let ask = |node: &N, value: &[u8]| {
        node.observe(
            &"k",
            Ok(&store),
            Some(fence),
            Some(value),
            Some(0),
            BLOCKING,
            now(T0 + 1),
        )
    };
    let now_leader = Leader::Held {
        fence,
        ttl_ms: 99,
        value: b"v2"[..].into(),
    };
    assert_eq!(ask(&node, b"v1"), Ok(Observation::Now(now_leader)));
    assert_eq!(
        ask(&node, b""),
        Ok(Observation::Now(Leader::Held {
            fence,
            ttl_ms: 99,
            value: b"v2"[..].into(),
        })),
        "seen with no value"
    );
    let Ok(Observation::Wait(ticket)) = ask(&node, b"v2") else {
        panic!("the value it saw is the value now: it waits")
    };
    node.start_observing(ticket, 7).unwrap();
    assert_eq!(node.observing(&"k"), 1);
}

/// A leader's public value: granted with the lock, changed by a renewal
/// that names another (ACQUIRE or EXTEND: a proclaim, which observers are
/// told of with the same fence), kept by one that names none or the same.
#[test]
fn a_proclaim_tells_the_observers_and_a_plain_renewal_keeps_the_value() {
    let mut node = N::default();
    let mut store = MemStore::default();
    let with_value = |value| AcquireRequest {
        value: Some(value),
        ..req(b"a", 100, None)
    };
    let got = node.acquire(
        &"k",
        Ok(&mut store),
        with_value(&b"v1"[..]),
        BLOCKING,
        &mut AdmitAll,
        now(T0),
    );
    let Ok(Acquire::Granted(fence)) = got else {
        panic!("{got:?}")
    };
    assert_eq!(store.lock().unwrap().value, b"v1");
    outputs(&mut node);
    watch(&mut node, &store, 7, fence, 0, T0);
    let extend = |node: &mut N, store: &mut MemStore, value: Option<&[u8]>, at_ms| {
        let cond = Conditions::empty();
        node.extend(
            &"k",
            Ok(store),
            (b"a", value),
            100,
            cond,
            &mut AdmitAll,
            now(at_ms),
        )
    };
    // No value, or the same one: nobody is told, the value stays.
    assert_eq!(extend(&mut node, &mut store, None, T0 + 10), Ok(true));
    assert_eq!(
        extend(&mut node, &mut store, Some(b"v1"), T0 + 11),
        Ok(true)
    );
    tick(&mut node, &mut store, T0 + 12);
    assert!(observed(&wakes(&mut node)).is_empty());
    assert_eq!(store.lock().unwrap().value, b"v1");
    // Another value: the same fence, the new value, the observer told.
    assert_eq!(
        extend(&mut node, &mut store, Some(b"v2"), T0 + 20),
        Ok(true)
    );
    tick(&mut node, &mut store, T0 + 21);
    let told = Leader::Held {
        fence,
        ttl_ms: 99,
        value: b"v2"[..].into(),
    };
    assert_eq!(
        observed(&wakes(&mut node)),
        vec![(7, Outcome::Observed(told))]
    );
    // A same-token ACQUIRE proclaims too; without VALUE it keeps it.
    let again = node.acquire(
        &"k",
        Ok(&mut store),
        with_value(&b"v3"[..]),
        BLOCKING,
        &mut AdmitAll,
        now(T0 + 30),
    );
    assert_eq!(again, Ok(Acquire::Renewed(fence)));
    assert_eq!(store.lock().unwrap().value, b"v3");
    let plain = node.acquire(
        &"k",
        Ok(&mut store),
        req(b"a", 100, None),
        BLOCKING,
        &mut AdmitAll,
        now(T0 + 31),
    );
    assert_eq!(plain, Ok(Acquire::Renewed(fence)));
    assert_eq!(store.lock().unwrap().value, b"v3");
    // Another token changes nothing; over the option, refused.
    assert_eq!(
        extend(&mut node, &mut store, Some(b"x"), T0 + 40).map(|_| ()),
        Ok(())
    );
    let other = node.extend(
        &"k",
        Ok(&mut store),
        (b"b", Some(b"x")),
        100,
        Conditions::empty(),
        &mut AdmitAll,
        now(T0 + 41),
    );
    assert_eq!(other, Ok(false));
    node.set_limits(
        Limits {
            max_value_len: 2,
            ..Limits::default()
        },
        T0 + 42,
    );
    let long = extend(&mut node, &mut store, Some(b"long"), T0 + 42);
    assert_eq!(long, Err(LockError::ValueTooLong(4, 2)));
    assert_eq!(store.lock().unwrap().value, b"x");
}

/// Every lease is filed by its end, at most 30 s ahead: an ended lock
/// nobody touches is reclaimed by the timer, a held one is looked at and
/// kept, and the entry a release leaves is gone within the look-ahead,
/// whatever lease it asked for.
#[test]
fn the_timer_reclaims_ended_leases_keeps_held_ones_and_forgets_released_ones() {
    use crate::lease_ends::{LOOK_AHEAD_MS, SLOT_MS};
    let (mut node, mut store) = (N::default(), MemStore::default());
    hold(&mut node, &mut store, b"h", Mode::Exclusive, 100, T0);
    assert_eq!(node.lease_ends_filed(), 1);
    let due = node.next_wakeup().unwrap();
    assert!(
        (T0 + 100..T0 + 100 + SLOT_MS).contains(&due),
        "{}",
        due - T0
    );
    tick(&mut node, &mut store, due - 1);
    assert!(store.lock().is_some(), "not before its slot");
    tick(&mut node, &mut store, due);
    assert!(store.lock().is_none(), "reclaimed at its slot");
    assert!(outputs(&mut node).contains(&Output::Event("k", Event::Expire)));
    assert_eq!((node.lease_ends_filed(), node.next_wakeup()), (0, None));

    // An hour's lease: looked at 30 s on, found held, filed again.
    let at = T0 + 1_000;
    hold(
        &mut node,
        &mut store,
        b"long",
        Mode::Exclusive,
        3_600_000,
        at,
    );
    let look = node.next_wakeup().unwrap();
    assert!(look <= at + LOOK_AHEAD_MS + SLOT_MS, "{}", look - at);
    tick(&mut node, &mut store, look);
    assert_eq!(store.lock().unwrap().token, b"long");
    assert_eq!(node.lease_ends_filed(), 1);
    let next = node.next_wakeup().unwrap();
    assert!(next > look && next <= look + LOOK_AHEAD_MS + SLOT_MS);
    // Released: its entry stays until then, and then leaves.
    release(&mut node, &mut store, b"long", look + 1);
    assert_eq!(node.lease_ends_filed(), 1);
    tick(&mut node, &mut store, next);
    assert_eq!((node.lease_ends_filed(), node.next_wakeup()), (0, None));
}
