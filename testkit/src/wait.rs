//! Polling until a condition holds.

use std::thread::sleep;
use std::time::{Duration, Instant};

/// Polls `cond` until it holds; panics after `limit`.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "condition not met within {limit:?}"
        );
        sleep(Duration::from_millis(10));
    }
}
