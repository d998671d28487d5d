//! The client's `tracing` events (issue 17), in a test binary of their own.
//!
//! `tracing` caches per call site, process-wide, whether anyone listens.
//! Scoped subscribers (`with_default`) raced that cache: a call site first
//! hit on another test's thread while a subscriber was being set up could
//! keep "nobody listens" ("lock acquired" went missing on a loaded CI run,
//! even after `rebuild_interest_cache`). Here one global subscriber is in
//! force before any test emits an event, and it routes each thread's events
//! to the buffer that thread's test installed.

use redis_lock_testkit as common;

use std::cell::RefCell;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::Server;
use redis_lock_client::{LockClient, Options};
use tokio::time::{sleep, Instant};

/// The `tracing` events logged so far, as text.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

thread_local! {
    /// Where this thread's events go (none: dropped).
    static SINK: RefCell<Option<Log>> = const { RefCell::new(None) };
}

/// Writes into the calling thread's sink.
struct ThreadSink;

impl std::io::Write for ThreadSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        SINK.with(|sink| {
            if let Some(log) = sink.borrow().as_ref() {
                log.0.lock().unwrap().extend_from_slice(b);
            }
        });
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the one global subscriber (DEBUG and up), first thing in every
/// test, so no call site is registered before it.
fn listen() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(|| ThreadSink)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    });
}

/// What `tracing` events (DEBUG and up) `work` emits, as text, while it
/// runs on a current-thread runtime on this thread (so also the tasks it
/// spawns); `work` may read them as they come.
fn traced<F: std::future::Future<Output = ()>>(work: impl FnOnce(Log) -> F) -> String {
    listen();
    let log = Log::default();
    SINK.with(|sink| *sink.borrow_mut() = Some(log.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(work(log.clone()));
    drop(runtime);
    SINK.with(|sink| *sink.borrow_mut() = None);
    log.text()
}

fn renewing_url(url: &str) -> LockClient {
    let options = Options::default().auto_renew(true);
    LockClient::with_options(&[url], options).unwrap()
}

/// Issue 17: acquire, loss and release show up as `tracing` events with the
/// key and fence, so an application's existing logs and metrics see them.
#[test]
fn acquire_loss_and_release_are_tracing_events() {
    let s = Server::start();
    let url = s.url();
    let mut c = s.conn();
    let text = traced(|_| async {
        let locks = renewing_url(&url);
        let guard = locks
            .try_acquire("traced", Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        assert!(guard.release().await.unwrap());
        let guard = locks
            .try_acquire("traced", Duration::from_millis(600))
            .await
            .unwrap()
            .unwrap();
        let _: i64 = redis::cmd("DEL").arg("traced").query(&mut c).unwrap();
        guard.lost().cancelled().await;
    });
    for want in [
        "lock acquired",
        "lock released",
        "lock lost",
        "key=\"traced\"",
        "fence=",
    ] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
}

/// Issue 17 (deployment checks): after its first grant the library reads
/// each node's restart delay and persistence in the background and warns,
/// once per node, about one a crash would make unsafe for the TTL in use
/// (the rule `redis-lock doctor` applies); a node set up safely, or a TTL
/// within its restart delay, gets no warning.
#[test]
fn the_library_warns_once_about_a_node_unsafe_after_a_crash() {
    if common::skip_unless(common::Needs::OwnServer, "sets restart delays") {
        return;
    }
    let nodes: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    // Node 0: no restart delay, no AOF (the defaults); node 1: a delay of
    // 10 s; node 2: appendfsync always.
    let config = |s: &Server, name: &str, value: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut s.conn())
            .unwrap();
    };
    config(&nodes[1], "lock.restart-delay-ms", "10000");
    config(&nodes[2], "appendonly", "yes");
    config(&nodes[2], "appendfsync", "always");
    let urls = common::urls(&nodes);
    let checked = "lock nodes' deployment checked";
    let given = urls.clone();
    let text = traced(|log| async move {
        let locks = LockClient::new(&given).unwrap();
        // Within node 1's delay: only node 0 is unsafe.
        for _ in 0..2 {
            let guard = locks
                .try_acquire("deployed", Duration::from_secs(5))
                .await
                .unwrap()
                .expect("free");
            assert!(guard.release().await.unwrap());
        }
        let start = Instant::now();
        while !log.text().contains(checked) {
            assert!(start.elapsed() < Duration::from_secs(10), "never checked");
            sleep(Duration::from_millis(20)).await;
        }
        // Beyond it: node 1 too, judged on the settings already read.
        let guard = locks
            .try_acquire("deployed", Duration::from_secs(20))
            .await
            .unwrap()
            .expect("free");
        assert!(guard.release().await.unwrap());
    });
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("unsafe after a crash"))
        .collect();
    assert_eq!(warnings.len(), 2, "{text}");
    assert!(
        warnings[0].contains(&urls[0])
            && warnings[0].contains("restart-delay-ms 0 is below the TTL (5000 ms)"),
        "{text}"
    );
    assert!(
        warnings[1].contains(&urls[1])
            && warnings[1].contains("restart-delay-ms 10000 is below the TTL (20000 ms)"),
        "{text}"
    );
    assert!(!text.contains(&format!("{}:", urls[2])), "{text}");
    // One node: the same check, read in the background after the grant.
    let single = urls[0].clone();
    let text = traced(|log| async move {
        let locks = LockClient::new(&[single]).unwrap();
        let guard = locks
            .try_acquire("deployed", Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free");
        let start = Instant::now();
        while !log.text().contains(checked) {
            assert!(start.elapsed() < Duration::from_secs(10), "never checked");
            sleep(Duration::from_millis(20)).await;
        }
        assert!(guard.release().await.unwrap());
    });
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("WARN") && l.contains("unsafe after a crash"))
            .count(),
        1,
        "{text}"
    );
}

/// Issue 17 (deployment checks): an even count of nodes is warned about
/// when the client is made (it tolerates no more failures than one fewer).
#[test]
fn an_even_count_of_nodes_is_warned_about() {
    let text = traced(|_| async {
        LockClient::new(&["redis://127.0.0.1:1/", "redis://127.0.0.1:2/"]).unwrap();
        LockClient::new(&["redis://127.0.0.1:1/"]).unwrap();
        LockClient::new(&[
            "redis://127.0.0.1:1/",
            "redis://127.0.0.1:2/",
            "redis://127.0.0.1:3/",
        ])
        .unwrap();
    });
    let warnings: Vec<&str> = text.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(
        warnings[0].contains("even count") && warnings[0].contains("nodes=2"),
        "{text}"
    );
}

/// Issue 23, item 6: a node whose ACL refuses a command the client would
/// use is warned about once, naming the command and what is lost (before:
/// nothing was said). Three acquisitions by a user with the lock commands
/// alone, the nodes said to be distinct: one warning for TIME, one for INFO.
#[test]
fn a_refused_command_is_warned_about_once() {
    if common::skip_unless(common::Needs::OwnServer, "ACL users") {
        return;
    }
    let nodes: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let urls: Vec<String> = nodes
        .iter()
        .map(|s| {
            let _: () = redis::cmd("ACL")
                .arg(&["SETUSER", "bare", "on", ">pw", "~*"][..])
                .arg(&["+lock.acquire", "+lock.release", "+lock.extend"][..])
                .arg(&["+lock.fence", "+lock.info"][..])
                .query(&mut s.conn())
                .unwrap();
            format!("redis://bare:pw@127.0.0.1:{}/", s.port)
        })
        .collect();
    let text = traced(|_| async {
        let options = Options::default().distinct_nodes(true);
        let locks = LockClient::with_options(&urls, options).unwrap();
        for round in 0..3 {
            let guard = locks
                .try_acquire(&format!("acl:{round}"), Duration::from_secs(5))
                .await
                .unwrap()
                .expect("free");
            assert!(guard.release().await.unwrap());
        }
    });
    for command in ["TIME", "INFO"] {
        let warned = text
            .lines()
            .filter(|l| l.contains("WARN") && l.contains(&format!("refuses {command}")))
            .count();
        assert_eq!(warned, 1, "{command} warned {warned} times:\n{text}");
    }
    assert!(text.contains("+time"), "no remedy named:\n{text}");
}
