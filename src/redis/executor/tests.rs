//! The executor's routing and order, against a recorder of effects (no
//! Redis): which place each output reaches, what is replicated once, and
//! what a panic in an effect leaves queued.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;

use super::route::{execute, At, Effects, Shape};
use crate::core::output::{Event, Output, Stat};
use crate::core::{Outcome, Wake};

type K = &'static str;

/// One effect as the recorder saw it; a place is `Command`, `Gate`, the
/// index of a site's key, or a key found by name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Done {
    Answer(u32),
    Replicate(Place),
    Holder(Place, u64),
    Drop(Place, Vec<u8>),
    Notify(Place, Event),
    GateRaised(Place, i64),
    Count(Stat),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    Command,
    Nth(usize),
    Gate,
    Found(K),
}

impl From<At<'_, K>> for Place {
    fn from(at: At<'_, K>) -> Place {
        match at {
            At::Command => Place::Command,
            At::Nth(i) => Place::Nth(i),
            At::Gate => Place::Gate,
            At::Found(k) => Place::Found(k),
        }
    }
}

/// Records every effect; panics on the effect numbered `panic_at`.
#[derive(Default)]
struct Recorder {
    done: Vec<Done>,
    panic_at: Option<usize>,
}

impl Recorder {
    fn push(&mut self, done: Done) {
        if self.panic_at == Some(self.done.len()) {
            self.panic_at = None;
            panic!("an effect failed");
        }
        self.done.push(done);
    }
}

impl Effects<K, u32> for Recorder {
    fn answer(&mut self, wake: Wake<K, u32>) {
        self.push(Done::Answer(wake.client));
    }
    fn replicate(&mut self, at: At<'_, K>) {
        self.push(Done::Replicate(at.into()));
    }
    fn replicate_holder(&mut self, at: At<'_, K>, lease: u64) {
        self.push(Done::Holder(at.into(), lease));
    }
    fn replicate_drop(&mut self, at: At<'_, K>, token: &[u8]) {
        self.push(Done::Drop(at.into(), token.to_vec()));
    }
    fn notify(&mut self, at: At<'_, K>, event: Event) {
        self.push(Done::Notify(at.into(), event));
    }
    fn gate_raised(&mut self, at: At<'_, K>, mark: i64) {
        self.push(Done::GateRaised(at.into(), mark));
    }
    fn count(&mut self, stat: Stat) {
        self.push(Done::Count(stat));
    }
}

fn wake(client: u32, key: K) -> Output<K, u32> {
    Output::Wake(Box::new(Wake {
        client,
        key,
        outcome: Outcome::TimedOut,
        waited_us: 0,
        also: Vec::new(),
    }))
}

fn run(outputs: Vec<Output<K, u32>>, shape: Shape<'_, K>) -> Vec<Done> {
    let mut queue: VecDeque<_> = outputs.into();
    let mut recorder = Recorder::default();
    execute(&mut queue, shape, &mut recorder);
    assert!(queue.is_empty(), "every output is taken");
    recorder.done
}

#[test]
fn a_command_replicates_its_key_once_and_keeps_the_order() {
    let done = run(
        vec![
            Output::Changed("k"),
            Output::Event("k", Event::Acquire),
            Output::Count(Stat::Grant),
            Output::Changed("k"),
            Output::Holder("k", 7),
            Output::HolderLeft("k", b"t".to_vec().into()),
            wake(3, "k"),
        ],
        Shape::Command,
    );
    assert_eq!(
        done,
        vec![
            Done::Replicate(Place::Command),
            Done::Notify(Place::Command, Event::Acquire),
            Done::Count(Stat::Grant),
            Done::Holder(Place::Command, 7),
            Done::Drop(Place::Command, b"t".to_vec()),
            Done::Answer(3),
        ]
    );
}

#[test]
fn a_multi_key_command_finds_each_key_by_its_place() {
    let keys = ["a", "b", "c"];
    let done = run(
        vec![
            Output::Changed("c"),
            Output::Changed("c"),
            Output::Changed("a"),
            Output::Changed("c"),
            Output::Event("b", Event::Release),
            Output::Holder("a", 1),
            // A key the command does not have reaches nothing.
            Output::Changed("z"),
            Output::Event("z", Event::Acquire),
        ],
        Shape::Keys(&keys),
    );
    assert_eq!(
        done,
        vec![
            Done::Replicate(Place::Nth(2)),
            Done::Replicate(Place::Nth(0)),
            Done::Replicate(Place::Nth(2)),
            Done::Notify(Place::Nth(1), Event::Release),
            Done::Holder(Place::Nth(0), 1),
        ]
    );
}

#[test]
fn the_timer_finds_keys_by_identity() {
    let done = run(
        vec![
            Output::Changed("a"),
            Output::Changed("a"),
            Output::Changed("b"),
            Output::GateRaised("g", 12),
            wake(1, "b"),
        ],
        Shape::Background,
    );
    assert_eq!(
        done,
        vec![
            Done::Replicate(Place::Found("a")),
            Done::Replicate(Place::Found("b")),
            Done::GateRaised(Place::Found("g"), 12),
            Done::Answer(1),
        ]
    );
}

#[test]
fn a_fenced_command_raises_its_gate_and_finds_locks_by_identity() {
    let done = run(
        vec![
            Output::GateRaised("g", 40),
            Output::Count(Stat::FencedRan),
            Output::Changed("lock"),
        ],
        Shape::Gate,
    );
    assert_eq!(
        done,
        vec![
            Done::GateRaised(Place::Gate, 40),
            Done::Count(Stat::FencedRan),
            Done::Replicate(Place::Found("lock")),
        ]
    );
}

#[test]
fn a_panicking_effect_leaves_the_rest_queued_and_is_not_retried() {
    let mut queue: VecDeque<Output<K, u32>> = vec![
        wake(1, "k"),
        wake(2, "k"),
        wake(3, "k"),
        Output::Count(Stat::Release),
    ]
    .into();
    let mut recorder = Recorder {
        panic_at: Some(1),
        ..Default::default()
    };
    let cut = catch_unwind(AssertUnwindSafe(|| {
        execute(&mut queue, Shape::Background, &mut recorder)
    }));
    assert!(cut.is_err());
    assert_eq!(recorder.done, vec![Done::Answer(1)]);
    // The second waiter's answer panicked: it is gone; the rest is left.
    assert_eq!(queue.len(), 2);
    execute(&mut queue, Shape::Background, &mut recorder);
    assert_eq!(
        recorder.done,
        vec![Done::Answer(1), Done::Answer(3), Done::Count(Stat::Release)]
    );
}

/// An output over the keys a..d (d is outside a three-key site).
fn any_output() -> impl Strategy<Value = Output<K, u32>> {
    let key = prop::sample::select(vec!["a", "b", "c", "d"]);
    prop_oneof![
        key.clone().prop_map(Output::Changed),
        (key.clone(), 0u64..4).prop_map(|(k, l)| Output::Holder(k, l)),
        key.clone()
            .prop_map(|k| Output::HolderLeft(k, b"x".to_vec().into())),
        key.clone().prop_map(|k| Output::Event(k, Event::Extend)),
        (key.clone(), 0i64..9).prop_map(|(k, m)| Output::GateRaised(k, m)),
        (0u32..9, key).prop_map(|(c, k)| wake(c, k)),
        Just(Output::Count(Stat::Grant)),
    ]
}

/// The effects a site of these keys must see, written plainly: every
/// output but a repeated change in order, at its key's place.
fn expected(outputs: &[Output<K, u32>], keys: &[K]) -> Vec<Done> {
    let at = |k: &K| keys.iter().position(|x| x == k).map(Place::Nth);
    let mut done = Vec::new();
    let mut last: Option<K> = None;
    for output in outputs {
        match output {
            Output::Wake(w) => done.push(Done::Answer(w.client)),
            Output::Changed(k) => {
                if last != Some(*k) {
                    done.extend(at(k).map(Done::Replicate));
                    last = Some(*k);
                }
            }
            Output::Holder(k, l) => done.extend(at(k).map(|p| Done::Holder(p, *l))),
            Output::HolderLeft(k, t) => done.extend(at(k).map(|p| Done::Drop(p, t.to_vec()))),
            Output::Event(k, e) => done.extend(at(k).map(|p| Done::Notify(p, *e))),
            Output::GateRaised(k, m) => done.extend(at(k).map(|p| Done::GateRaised(p, *m))),
            Output::Count(s) => done.push(Done::Count(*s)),
        }
    }
    done
}

proptest! {
    #[test]
    fn any_decision_is_carried_out_as_the_plain_reading_says(
        outputs in prop::collection::vec(any_output(), 0..24),
    ) {
        let keys = ["a", "b", "c"];
        let done = run(outputs.clone(), Shape::Keys(&keys));
        prop_assert_eq!(done, expected(&outputs, &keys));
        // The timer: the same, every key found by its name.
        let done = run(outputs.clone(), Shape::Background);
        let found: Vec<Done> = expected(&outputs, &["a", "b", "c", "d"])
            .into_iter()
            .map(|d| match d {
                Done::Replicate(Place::Nth(i)) => Done::Replicate(Place::Found(["a", "b", "c", "d"][i])),
                Done::Holder(Place::Nth(i), l) => Done::Holder(Place::Found(["a", "b", "c", "d"][i]), l),
                Done::Drop(Place::Nth(i), t) => Done::Drop(Place::Found(["a", "b", "c", "d"][i]), t),
                Done::Notify(Place::Nth(i), e) => Done::Notify(Place::Found(["a", "b", "c", "d"][i]), e),
                Done::GateRaised(Place::Nth(i), m) => Done::GateRaised(Place::Found(["a", "b", "c", "d"][i]), m),
                other => other,
            })
            .collect();
        prop_assert_eq!(done, found);
    }
}
