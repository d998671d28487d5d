//! Fresh directories: each test server's data directory, and a test's own
//! scratch directory.
//!
//! Names carry the test process's PID, and PIDs are reused: a machine's
//! `pid_max` is often 32,768, so a CI run that starts thousands of
//! processes (image builds, Redis's own suite) reaches the same PID again.
//! A directory an earlier run left under the same name (a child's pid file,
//! a marker) must never be read as this run's: each is emptied when made.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// `<tmp>/<prefix>-<pid>-<n>`, empty (whatever was there is removed first).
fn empty_dir(prefix: &str) -> PathBuf {
    let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A fresh, empty data directory, removed when the server is dropped.
pub(crate) fn fresh_dir() -> PathBuf {
    empty_dir("redis-lock-test")
}

/// A test's own scratch directory: empty when made (nothing a run before
/// it left under the same name), removed with what it holds on drop (also
/// when the test panics).
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// A new empty directory named after `what` (letters, digits, `-`).
    pub fn new(what: &str) -> ScratchDir {
        ScratchDir(empty_dir(&format!("redis-lock-{what}")))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// Read as the directory's path (`dir.join(..)`, `&dir` where a `&Path`
/// is wanted).
impl std::ops::Deref for ScratchDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a run before this one left under the same name is gone: the
    /// next directory's name is made now, a stale one put there first.
    #[test]
    fn a_scratch_dir_is_empty_even_where_an_earlier_run_left_files() {
        let n = NEXT_DIR.load(Ordering::Relaxed);
        let name =
            std::env::temp_dir().join(format!("redis-lock-stale-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&name).unwrap();
        std::fs::write(name.join("pid"), "12345\n").unwrap();
        let dir = ScratchDir::new("stale");
        assert_eq!(dir.path(), name.as_path());
        assert!(
            std::fs::read_dir(dir.path()).unwrap().next().is_none(),
            "the stale pid file is gone"
        );
        std::fs::write(dir.join("mine"), "x").unwrap();
        drop(dir);
        assert!(!name.exists(), "removed on drop");
    }
}
