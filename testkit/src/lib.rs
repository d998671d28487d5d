//! What the integration tests share (`tests/` of the module, `client/tests/`,
//! and the benchmarks): a real redis-server (or valkey-server) per test, on
//! a free 127.0.0.1 port, with the freshly built module loaded, stopped (by
//! PID) on drop; raw RESP connections ([`RawConn`]) for replies that come
//! later; and one helper per lock command, [`lock_info`] (LOCK.INFO, typed
//! as [`LockInfo`]) and [`holder`] among them.
//!
//! The tests use it as `use redis_lock_testkit as common;`. The client's
//! partition tests also put nodes behind a [`proxy::Proxy`].
//!
//! Environment:
//! * `REDIS_SERVER`      — the server binary (default `redis-server`)
//! * `REDIS_LOCK_MODULE` — the module (default `target/release/libredis_lock.so`)
//! * `REDIS_LOCK_DOCKER_IMAGE` — run every test server as a container of
//!   this image instead (`make docker-test`): `docker run --network host`,
//!   bound to 127.0.0.1, its data directory mounted at its own path (the
//!   container's working directory, so `CONFIG GET dir` tells test servers
//!   apart when a restart finds its port taken), the module
//!   the image's own (`/usr/local/lib/redis/modules/libredis_lock.so`).
//!   Restart is `docker start` of the same container (a new container on the
//!   same data directory when its arguments changed), kill -9 is `docker
//!   kill`, SIGSTOP/SIGCONT are `docker pause`/`unpause`, `pid()` is the
//!   server's host PID. Containers are named `redis-lock-test-<pid>-<n>`,
//!   labelled `redis-lock-test`, and removed on drop (also when a test
//!   panics); `make docker-test` removes any a killed test run left behind.
//! * `REDIS_LOCK_TEST_URL` — `redis://127.0.0.1:PORT`: the single-server
//!   suites use this server, one test at a time, flushed before each test.
//!   Tests that need a server of their own (restarts, kill, persistence,
//!   start-up options, more than one server) skip themselves with a reason.
//!
//! Tests that cannot run in a mode call [`skip_unless`] first, which prints
//! why, records the skip ([`skip`]) and returns true; a test that finds
//! something else missing calls [`skip`] itself.

pub use redis::{Connection, Value};

mod binaries;
mod builder;
mod commands;
mod dirs;
mod docker;
mod external;
mod lock_commands;
mod memory;
mod mode;
mod ports;
mod raw_conn;
mod regression;
mod replication;
mod sentinel;
mod server;
mod server_info;
mod skip;
mod tmux;
mod wait;

pub mod cluster;
pub mod postgres;
pub mod proxy;

pub use binaries::{
    faketime_servers, libfaketime, module_path, server_binary, set_clock_offset, shown_path,
    workspace_root,
};
pub use builder::Builder;
pub use commands::{active_expire, digest, error_text, login, populate, run, run_err, set_user};
pub use dirs::ScratchDir;
pub use docker::{docker, MODULE_IN_IMAGE};
pub use lock_commands::{
    acquire, extend, fence, holder, holder_and_fence, lease_ms, lock_info, lock_info_reply, now_ms,
    pttl, release, LockInfo,
};
pub use memory::{connected_clients, info_number, settled_memory, used_memory};
pub use mode::{mode, Mode};
pub use ports::free_port;
pub use raw_conn::{RawConn, Resp};
pub use regression::{
    alive, block_on, blocked_clients, blocked_ids, fence_of_a_run, first_blocked_client, restore,
    wait_blocked,
};
pub use sentinel::Sentinel;
pub use server::{urls, Server};
pub use skip::{faketime_servers_or_skip, skip, skip_unless, Needs, Skip};
pub use tmux::Tmux;
pub use wait::wait_until;
