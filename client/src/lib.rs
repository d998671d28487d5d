//! Client for the [redis-lock](https://github.com/) Redis module: locks
//! with fencing tokens on one node, or Redlock over several independent
//! nodes, with auto-renewal. Async on tokio over the `redis` crate.
//!
//! A blocking facade for code without a runtime is in [`blocking`].
//!
//! # One node
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::LockClient;
//!
//! # async fn demo() -> redis_lock_client::Result<()> {
//! let locks = LockClient::new(&["redis://127.0.0.1:6379/"])?;
//! // A 30 s lease; wait up to 10 s in the server's FIFO line (no polling).
//! let acquired = locks
//!     .acquire("order:42", Duration::from_secs(30))
//!     .wait(Duration::from_secs(10))
//!     .await?;
//! if let Some(guard) = acquired {
//!     // Send the fencing token with every write to the protected resource.
//!     println!("holding order:42 with fence {}", guard.fence());
//!     guard.release().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! The wait, a token of the caller's choosing and auto-renewal are named on
//! the [`Acquire`] that `acquire` returns; without `.wait(..)` it makes one
//! attempt (`None` if another holder has the lock), as `try_acquire` does.
//! `with_lock` runs a closure under the lock, renewing it meanwhile:
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::LockClient;
//!
//! # async fn demo() -> redis_lock_client::Result<()> {
//! let locks = LockClient::new(&["redis://127.0.0.1:6379/"])?;
//! let total = locks
//!     .acquire("stock:7", Duration::from_secs(5))
//!     .wait(Duration::from_secs(2))
//!     .with_lock(|lease| async move {
//!         // Stop if the lock is lost (a renewal refused, or its validity ran out).
//!         tokio::select! {
//!             _ = lease.lost().cancelled() => None,
//!             n = async { 41 + 1 } => Some((n, lease.fence())),
//!         }
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # What else a lock can be
//!
//! * **Shared** ([`Acquire::shared`]): the reader's side of a read/write
//!   lock; a plain acquisition is the writer, and both wait in one FIFO
//!   line.
//! * **A counting semaphore** ([`Acquire::limit`]): at most `n` holders of
//!   the key at once (one node, with replicas if you like).
//! * **Several keys at once** ([`LockClient::acquire_all`]): all or
//!   nothing, one fence for every key, without deadlocks between callers
//!   that name the keys in different orders.
//! * **Guarded writes**: [`Lease::exec`] runs a command on the lock's node
//!   only while this grant holds the lock (`LOCK.EXEC`), checked and run
//!   in one step; [`Lease::fenced`] runs it on any node with the module
//!   only if the fence is at least the highest a gate has accepted
//!   (`LOCK.FENCED`): a holder paused past its lease cannot write once a
//!   later holder has. [`Error::NotHeld`] and [`Error::StaleFence`] say so.
//! * **Grants that survive a failover** ([`Options::wait_replicas`]): a
//!   grant counts only once that many replicas of each node acknowledged
//!   it (`WAIT`); otherwise it is released and not acquired.
//!
//! # Node URLs
//!
//! Each URL given to [`LockClient::new`] is one node of the group:
//!
//! * `redis://[user:password@]host:port/[db]`: one server (`rediss://` for
//!   TLS, `redis+unix:///path` for a Unix socket), as the `redis` crate
//!   reads them; a `rediss://` URL may name PEM files in its query for
//!   mutual TLS and a private CA:
//!   `?tls_cert=client.pem&tls_key=client.key&tls_ca=ca.pem`;
//! * `redis-sentinel://host:port[,host:port...]/service[/db]`: the master
//!   the sentinels report for `service`, asked for again after a failover
//!   (a connection error, or READONLY from a demoted master);
//! * `redis-cluster://host:port[,host:port...]/`: a whole Redis Cluster as
//!   one node, each key's commands sent to its master (MOVED and ASK
//!   followed).
//!
//! One URL is a single node; several are a Redlock group (use an odd
//! number). To bring your own TLS settings or credentials, pass
//! `redis::Client`s to [`LockClient::from_clients`].
//!
//! # Cancellation
//!
//! Acquiring is cancel-safe: dropping the future of an acquisition (a
//! `tokio::time::timeout`, a `select!` against a shutdown signal) at any
//! point leaves no lock behind, also when the program returns from `main`
//! right after (a `select!` against Ctrl-C): its token is made by the
//! library, so the drop releases it at once, on every node the request may
//! have reached, from the dropping thread (a round trip per node, before
//! the runtime can stop), and once more a little later in the background,
//! over the connections the request used (so a request still queued there
//! cannot land after the release). A wait in a server's line leaves it at
//! once: its connection is closed, so the server drops the waiter, or takes
//! back a grant it had not yet delivered (one it had delivered is released
//! as above). A token named with
//! [`Acquire::token`] is not released so (it may hold the lock already).
//!
//! # Auto-renewal
//!
//! With [`Options::auto_renew`] a guard extends its lock at about a third
//! of the TTL. [`Lease::lost`] (a [`LostSignal`]) fires when the
//! lock is lost: a renewal that a majority answered without extending it
//! on a majority in time, one that failed with too little validity left
//! to retry, or no successful renewal before [`Lease::valid_until`]. Releasing stops the renewal
//! first and waits for one in flight, so no renewal follows a release.
//!
//! # Redlock, with fencing tokens that never go backwards
//!
//! Given several URLs (N independent masters, usually 5) the client runs
//! Redlock as published: try every node in parallel, each with a timeout far
//! below the TTL; the lock is held only if a majority (N/2 + 1) granted it
//! and less than the TTL has passed; its validity is TTL − elapsed − drift,
//! drift = 1% of the TTL + 2 ms; on failure it is released on **all** nodes.
//! Extending counts only if a majority extended within the validity.
//!
//! While another client holds the lock, a waiting client does not retry
//! after random pauses (as published Redlock does) but waits in the server:
//! in the FIFO line (`LOCK.ACQUIRE ... BLOCK`) of one node per key, the
//! **ordering node** ([`LockClient::ordering_node`], chosen by rendezvous
//! hashing of the key with the nodes' addresses, so every client agrees).
//! When that node hands it the lock, it takes the others (retrying them,
//! still holding the ordering node, until they are free); the waiters take
//! turns in arrival order. A round counts only if the ordering node granted
//! it or did not answer, so a newcomer cannot take the other nodes from
//! under the waiter first in line. While the ordering node does not answer
//! (it is pinged during the wait), and with [`Options::queue`] off,
//! attempts are retried after random pauses until the caller's wait ends.
//! Mutual exclusion and fencing rest on the majority as before; the line
//! only decides who tries next.
//!
//! Each node issues its own fencing tokens, so the client makes one token
//! for the whole group (**quorum fencing**):
//!
//! 1. acquire on every node and collect the tokens of the granting nodes;
//!    T = the smallest token a majority can hold: the majority's when a
//!    majority granted one token, else the quorum-th smallest granted;
//! 2. only when no majority granted T: send `LOCK.ACQUIRE key token ttl
//!    MINFENCE T` to the granting nodes below it: each raises this lock's
//!    token, and its node-wide high-water mark, to at least T, so every
//!    later grant on that node exceeds T.
//!
//! The lock and T reach the caller only once a majority holds T (from step
//! 1 or step 2) within the validity.
//!
//! Step 1 already asks for a token: `MINFENCE g` with g 2 ms above **the
//! nodes' clock** and above every group token this client was granted. The nodes'
//! clock is the median of their `TIME` replies, read at most 30 s before
//! and carried forward on this client's monotonic clock, never this
//! client's wall clock. A node grants exactly g when its own clock and
//! high-water mark are below g, the rule when the nodes' clocks agree, so
//! usually a majority (every node) has T = g after step 1 and step 2 is
//! skipped (one round trip, as without fencing). A node that granted more
//! (its clock ahead, or a mark raised) keeps its own larger token, which a
//! later grant there exceeds; only when no majority agreed are the nodes
//! below T raised in step 2 (those above keep theirs). T is never a token only a minority holds: an observer
//! of the group (an election's) sees a majority agree on the leader's own
//! fence, never on another on the way to it. No client's clock moves the
//! tokens: they rest on the nodes alone.
//!
//! Any two majorities of the N nodes share a node. A later Redlock grant of
//! the same key gets a token T' that a majority holds too, so one of the
//! nodes holding T' held T before: its token in the later grant is above
//! T, and T' is at least that token, so **T' > T**. The resource rejects
//! the older holder.
//!
//! Assumptions: each node keeps its high-water mark across restarts (only
//! `appendfsync always` keeps it across a crash), or, having lost it,
//! restarts with a wall clock that was not set back and agrees with the
//! other nodes' within its `lock.restart-delay-ms` less a few ms (its first
//! token is then its clock, above every token the group issued before); a node that restarts without its data may also have lost the lock
//! itself, so run nodes with `appendfsync always` or with
//! `lock.restart-delay-ms` ≥ the longest TTL (Redlock's delayed restart).
//! Mutual exclusion itself needs bounded process pauses and clock drift
//! below the allowance; fencing tokens catch the holder a pause or a clock
//! jump let slip through.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::{LockClient, Options};
//!
//! # async fn demo() -> redis_lock_client::Result<()> {
//! let nodes = ["redis://10.0.0.1:6379/", "redis://10.0.0.2:6379/", "redis://10.0.0.3:6379/",
//!              "redis://10.0.0.4:6379/", "redis://10.0.0.5:6379/"];
//! let locks = LockClient::with_options(&nodes, Options::default().auto_renew(true))?;
//! let acquired = locks.acquire("job:nightly", Duration::from_secs(60)).wait(Duration::from_secs(5));
//! if let Some(guard) = acquired.await? {
//!     let fence = guard.fence(); // above every earlier Redlock grant of job:nightly
//!     # let _ = fence;
//!     guard.release().await?;
//! }
//! # Ok(()) }
//! ```

// The same unsafe discipline as the module: every unsafe block says why
// it is sound, and an unsafe fn's body is not one unsafe block.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs, missing_debug_implementations)]

pub mod blocking;

mod client;
mod clock;
mod deployment;
mod election;
mod error;
mod group;
mod guard;
mod keys;
mod node;
mod node_settings;
mod node_url;
mod options;
mod redlock;
mod scan;
mod settle;

/// Support for the `redis-lock` command; not part of the library's API.
#[doc(hidden)]
pub use client::random_token;
pub use client::{Acquire, LockClient, Options};
#[doc(hidden)]
pub use clock::{boot_clock, drift, later_by};
pub use election::{Election, Leader, Leadership, Observed, Observer};
pub use error::{Error, Result};
pub use guard::{Lease, LockGuard, LostSignal, ValidityWatch};
pub use keys::Keys;
pub use node::LockInfo;
pub use node_settings::NodeSettings;
pub use scan::{ListedHolder, ListedLock};
