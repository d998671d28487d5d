//! How the test servers run, as the environment says: local processes,
//! docker containers (`REDIS_LOCK_DOCKER_IMAGE`) or an external server
//! (`REDIS_LOCK_TEST_URL`).

/// Where the test servers run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A local process of `REDIS_SERVER`.
    Local,
    /// A container of this image (`REDIS_LOCK_DOCKER_IMAGE`).
    Docker(String),
    /// A server someone else started (`REDIS_LOCK_TEST_URL`), at this port
    /// of 127.0.0.1.
    External(u16),
}

pub fn mode() -> Mode {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let Some(url) = var("REDIS_LOCK_TEST_URL") {
        return Mode::External(parse_test_url(&url));
    }
    match var("REDIS_LOCK_DOCKER_IMAGE") {
        Some(image) => Mode::Docker(image),
        None => Mode::Local,
    }
}

/// The port of a `redis://127.0.0.1:PORT[/]` URL. Tests only ever talk to
/// the loopback range, so any other host is refused.
fn parse_test_url(url: &str) -> u16 {
    let rest = url
        .strip_prefix("redis://")
        .unwrap_or_else(|| panic!("REDIS_LOCK_TEST_URL={url}: expected redis://127.0.0.1:PORT"));
    let rest = rest.trim_end_matches('/');
    let (host, port) = rest
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("REDIS_LOCK_TEST_URL={url}: no port"));
    assert!(
        host == "127.0.0.1",
        "REDIS_LOCK_TEST_URL={url}: the tests talk only to 127.0.0.1 (no password, database 0)"
    );
    port.parse()
        .unwrap_or_else(|_| panic!("REDIS_LOCK_TEST_URL={url}: bad port"))
}
