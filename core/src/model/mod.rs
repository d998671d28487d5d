//! Model check of the production [`Node`]: random histories over three keys
//! drive the same `Node` the Redis glue drives (the harness plays the glue:
//! it opens a key as a [`MemStore`], passes the server's conditions in and
//! runs the timer only when the node asks), and a deliberately simple
//! reference model side by side, which settles every key on every tick.
//! After every step both must agree on every reply, every wake, every
//! holder and mode of every key, and the fence mark; and whole-history
//! properties must hold: no more holders than the key's mode allows (one
//! when exclusive), fences strictly increasing and never shared by two
//! holders, a
//! waiter answered exactly once and granted only its own key, in FIFO order,
//! never at or after its timeout, and no waiter left in line while its lock
//! is free and grants are allowed.
//!
//! The history covers shared holders (`SHARED`, with and without `LIMIT`:
//! readers together, a writer alone, one FIFO line for both, downgrades,
//! refused upgrades and limits, a lower `lock.max-holders-per-key`),
//! LOCK.ACQUIREALL (all keys or none, and with BLOCK a
//! waiter standing in several lines at once, granted every key with one
//! fence), MINFENCE, restart-delay and its runtime changes, a
//! lower max-ttl-ms, max-token-len or max-waiters-per-key while clients
//! wait, memory above
//! maxmemory and an evicting policy (new holders refused, hand-offs
//! included, renewals not), take-back of an undelivered grant,
//! ACL denial at hand-off, WRONGTYPE, SWAPDB, replica demotion and
//! promotion, CLIENT PAUSE WRITE (timeouts answered, nothing handed on or
//! taken back until the node's first timer run after it, within
//! `RETRY_MS`), and a key that leaves the node (cluster redirect). The
//! harness runs the production timer sequence (`Node::run_timer`) and the
//! keys it took back are checked against the reference's.
//!
//! Client handles come from a small pool and are reused as soon as their
//! waiter is answered or leaves: the node must not depend on the glue's
//! never reusing one (the glue's ids are never reused; Redis's handle
//! addresses, which it once used, are).
//! 20,000 cases by default (seconds in release, as `make test` runs it);
//! `PROPTEST_CASES` sets another count (`make stress` runs 300,000).

mod harness;
mod ops;
mod reference;
mod run;
mod steps;

use proptest::prelude::*;

use ops::op;
use run::run;

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(20_000),
        .. ProptestConfig::default()
    })]

    #[test]
    fn the_node_agrees_with_the_reference_model(ops in prop::collection::vec(op(), 1..80)) {
        run(&ops);
    }
}
