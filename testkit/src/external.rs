//! The external server (`REDIS_LOCK_TEST_URL`): one test at a time, each
//! finding it as this test binary first found it.

use redis::Connection;

/// One test at a time on an external server (`REDIS_LOCK_TEST_URL`): in
/// use, and its change.
pub(crate) static EXTERNAL: (std::sync::Mutex<bool>, std::sync::Condvar) =
    (std::sync::Mutex::new(false), std::sync::Condvar::new());

thread_local! {
    /// This thread's test holds the external server (a second one would wait
    /// for itself).
    pub(crate) static USING_EXTERNAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The external server's configuration and ACL users when this test binary
/// first used it.
type Baseline = (Vec<(String, String)>, Vec<String>);
static EXTERNAL_BASELINE: std::sync::OnceLock<Baseline> = std::sync::OnceLock::new();

fn config_all(c: &mut Connection) -> Vec<(String, String)> {
    let flat: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("*").query(c).unwrap();
    flat.chunks(2)
        .map(|kv| (kv[0].clone(), kv[1].clone()))
        .collect()
}

fn acl_users(c: &mut Connection) -> Vec<String> {
    redis::cmd("ACL").arg("USERS").query(c).unwrap()
}

/// Puts the external server back as this test binary found it: empty, its
/// configuration (`lock.*` included) and ACL users as at first use, not
/// paused, active expiry on, no scripts. What cannot be undone (the
/// module's counters, its fence mark) is why some tests skip.
pub(crate) fn reset_external(c: &mut Connection) {
    let (config, users) = EXTERNAL_BASELINE.get_or_init(|| (config_all(c), acl_users(c)));
    let _: redis::RedisResult<()> = redis::cmd("CLIENT").arg("UNPAUSE").query(c);
    for (name, value) in config_all(c) {
        if let Some((_, was)) = config.iter().find(|(n, _)| *n == name) {
            if *was != value {
                let _: redis::RedisResult<()> =
                    redis::cmd("CONFIG").arg("SET").arg(&name).arg(was).query(c);
            }
        }
    }
    for user in acl_users(c) {
        if !users.contains(&user) {
            let _: redis::RedisResult<()> = redis::cmd("ACL").arg("DELUSER").arg(&user).query(c);
        }
    }
    let _: redis::RedisResult<()> = redis::cmd("DEBUG").arg("SET-ACTIVE-EXPIRE").arg(1).query(c);
    let _: redis::RedisResult<()> = redis::cmd("SCRIPT").arg("FLUSH").query(c);
    let _: () = redis::cmd("FLUSHALL").query(c).unwrap();
}
