//! `redis-lock exporter`: its `/metrics` read with a strict parser of the
//! Prometheus text format and compared with each node's `INFO lock`, and
//! scraped by a real Prometheus that answers every query of the Grafana
//! dashboard (`docs/grafana/redis-lock.json`).

use redis_lock_testkit as common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, RawConn, Resp, Server};

const BIN: &str = env!("CARGO_BIN_EXE_redis-lock");

/// A child process killed (by its pid) and reaped on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The exporter over `urls` on a free port, waited for until it answers.
fn start_exporter(urls: &[String]) -> (Running, u16) {
    start_exporter_with(urls, &["--timeout", "1s"])
}

/// The exporter over `urls` with `args` besides, on a free port, waited
/// for until it answers.
fn start_exporter_with(urls: &[String], args: &[&str]) -> (Running, u16) {
    let port = free_port();
    let mut cmd = Command::new(BIN);
    cmd.arg("exporter");
    for u in urls {
        cmd.args(["--url", u]);
    }
    let child = cmd
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        .env_remove("REDIS_LOCK_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start redis-lock exporter");
    let running = Running(child);
    common::wait_until(Duration::from_secs(20), || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    (running, port)
}

/// `GET path` over HTTP/1.0 (so the answer is never chunked): the status
/// line, the headers and the body.
fn http_get(port: u16, path: &str) -> (String, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the answer");
    let raw = String::from_utf8(raw).expect("UTF-8 answer");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head and a body");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}

// ---- a strict parser of the text exposition format (version 0.0.4) ----

#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

#[derive(Debug)]
struct Family {
    kind: String,
    samples: Vec<Sample>,
}

/// Families by name, or a panic saying which line breaks the format: a
/// sample without a TYPE line before it, a family's samples not together,
/// a HELP or TYPE given twice, a counter not ending in `_total`, a sample
/// name that is not its family's, a bad label or value.
fn parse_exposition(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut helps: BTreeSet<String> = BTreeSet::new();
    let mut current: Option<String> = None;
    let mut closed: BTreeSet<String> = BTreeSet::new();
    // Each series (name and labels) once: Prometheus refuses a scrape that
    // has one twice.
    let mut series: BTreeSet<(String, BTreeMap<String, String>)> = BTreeSet::new();
    assert!(text.ends_with('\n'), "the exposition ends with a newline");
    for line in text.lines() {
        assert!(!line.is_empty(), "no empty lines");
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP name text");
            assert!(!help.trim().is_empty(), "{line}: empty HELP");
            assert!(helps.insert(name.to_string()), "{line}: HELP twice");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}: unknown type"
            );
            assert!(valid_name(name), "{line}: bad metric name");
            assert!(!families.contains_key(name), "{line}: TYPE twice");
            assert!(helps.contains(name), "{line}: HELP before TYPE");
            if kind == "counter" {
                assert!(name.ends_with("_total"), "{line}: a counter ends in _total");
            }
            if let Some(previous) = current.replace(name.to_string()) {
                closed.insert(previous);
            }
            families.insert(
                name.to_string(),
                Family {
                    kind: kind.to_string(),
                    samples: vec![],
                },
            );
            continue;
        }
        assert!(!line.starts_with('#'), "{line}: an unknown comment");
        let sample = parse_sample(line);
        let family = current
            .as_ref()
            .unwrap_or_else(|| panic!("{line}: a sample before any TYPE line"));
        let f = families.get_mut(family).unwrap();
        let own = match f.kind.as_str() {
            "histogram" => ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| sample.name == format!("{family}{s}")),
            _ => sample.name == *family,
        };
        assert!(
            own,
            "{line}: not a sample of {family} (its TYPE line is missing, or the families interleave)"
        );
        assert!(!closed.contains(family));
        assert!(
            series.insert((sample.name.clone(), sample.labels.clone())),
            "{line}: the same series twice"
        );
        f.samples.push(sample);
    }
    for (name, f) in &families {
        assert!(!f.samples.is_empty(), "{name}: a TYPE line without samples");
        if f.kind == "histogram" {
            check_histogram(name, f);
        }
    }
    families
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `name{k="v",...} value` (labels escaped as the format says).
fn parse_sample(line: &str) -> Sample {
    let (name_and_labels, value) = line.rsplit_once(' ').expect("name value");
    let value: f64 = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse()
            .unwrap_or_else(|_| panic!("{line}: bad value {v}")),
    };
    let (name, labels) = match name_and_labels.split_once('{') {
        Some((name, rest)) => (
            name,
            parse_labels(rest.strip_suffix('}').expect("labels end in }"), line),
        ),
        None => (name_and_labels, BTreeMap::new()),
    };
    assert!(valid_name(name), "{line}: bad metric name");
    Sample {
        name: name.to_string(),
        labels,
        value,
    }
}

fn parse_labels(mut text: &str, line: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    while !text.is_empty() {
        let (key, rest) = text
            .split_once("=\"")
            .unwrap_or_else(|| panic!("{line}: label"));
        assert!(valid_name(key) && !key.contains(':'), "{line}: label name");
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    other => panic!("{line}: bad escape {other:?}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("{line}: unterminated label value"),
            }
        };
        assert!(
            labels.insert(key.to_string(), value).is_none(),
            "{line}: label twice"
        );
        text = &rest[end + 1..];
        text = text.strip_prefix(',').unwrap_or(text);
    }
    labels
}

/// Per node: buckets in ascending `le`, cumulative, the last `+Inf` and
/// equal to `_count`, and a `_sum`.
fn check_histogram(name: &str, f: &Family) {
    let mut nodes: BTreeMap<String, Vec<&Sample>> = BTreeMap::new();
    for s in &f.samples {
        nodes.entry(s.labels["node"].clone()).or_default().push(s);
    }
    for (node, samples) in nodes {
        let buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter(|s| s.name.ends_with("_bucket"))
            .map(|s| {
                let le = match s.labels["le"].as_str() {
                    "+Inf" => f64::INFINITY,
                    le => le.parse().expect("le is a number"),
                };
                (le, s.value)
            })
            .collect();
        assert!(buckets.len() > 1, "{name} {node}: buckets");
        for pair in buckets.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{name} {node}: le ascending");
            assert!(pair[0].1 <= pair[1].1, "{name} {node}: cumulative");
        }
        let last = buckets.last().unwrap();
        assert!(last.0.is_infinite(), "{name} {node}: ends with +Inf");
        let one = |suffix: &str| -> f64 {
            let found: Vec<_> = samples
                .iter()
                .filter(|s| s.name == format!("{name}{suffix}"))
                .collect();
            assert_eq!(found.len(), 1, "{name} {node}: one {suffix}");
            found[0].value
        };
        assert_eq!(last.1, one("_count"), "{name} {node}: +Inf == _count");
        assert!(one("_sum") >= 0.0);
    }
}

// ---- traffic ----

/// Every kind of event the dashboard shows, on one node: grants, a
/// contended acquire, an extend, a hand-off after a wait, an expiration,
/// a block timeout, LOCK.EXEC run and refused, LOCK.FENCED run and stale.
/// `tag` keeps each call's keys apart.
fn traffic(s: &Server, tag: &str) {
    let mut c = s.conn();
    let key = format!("{tag}:k");
    common::acquire(&mut c, &key, "t1", 10_000).expect("granted");
    assert_eq!(
        common::acquire(&mut c, &key, "t2", 10_000),
        None,
        "contended"
    );
    let extended: i64 = redis::cmd("LOCK.EXTEND")
        .arg(&key)
        .arg("t1")
        .arg(10_000)
        .query(&mut c)
        .unwrap();
    assert_eq!(extended, 1);
    // A waiter, handed the lock after waiting a little.
    let mut waiter = RawConn::block_acquire(s, &key, "w", 10_000, 10_000);
    common::wait_until(Duration::from_secs(10), || {
        common::lock_info(&mut s.conn(), &key).is_some_and(|i| i.waiters == 1)
    });
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(common::release(&mut c, &key, "t1"), 1);
    let _ = waiter.read();
    assert_eq!(common::release(&mut c, &key, "w"), 1);
    // An expiration: a lease that runs out, then replaced.
    let short = format!("{tag}:short");
    common::acquire(&mut c, &short, "a", 30).expect("granted");
    std::thread::sleep(Duration::from_millis(80));
    common::acquire(&mut c, &short, "b", 10_000).expect("granted after the lease ended");
    assert_eq!(common::release(&mut c, &short, "b"), 1);
    // A block timeout.
    let busy = format!("{tag}:busy");
    common::acquire(&mut c, &busy, "a", 10_000).expect("granted");
    let timed_out: Option<i64> = redis::cmd("LOCK.ACQUIRE")
        .arg(&busy)
        .arg("b")
        .arg(10_000)
        .arg("BLOCK")
        .arg(30)
        .query(&mut c)
        .unwrap();
    assert_eq!(timed_out, None);
    assert_eq!(common::release(&mut c, &busy, "a"), 1);
    // LOCK.EXEC: run by the holder, refused to a token that holds nothing.
    let exec = format!("{tag}:exec");
    common::acquire(&mut c, &exec, "h", 10_000).expect("granted");
    let _: () = redis::cmd("LOCK.EXEC")
        .arg(&exec)
        .arg("h")
        .arg("SET")
        .arg(format!("{tag}:data"))
        .arg(1)
        .query(&mut c)
        .unwrap();
    let refused = redis::cmd("LOCK.EXEC")
        .arg(&exec)
        .arg("nobody")
        .arg("SET")
        .arg(format!("{tag}:data"))
        .arg(2)
        .query::<()>(&mut c)
        .unwrap_err();
    assert_eq!(refused.code(), Some("NOTHELD"), "{refused}");
    assert_eq!(common::release(&mut c, &exec, "h"), 1);
    // LOCK.FENCED: a fence recorded, then a lower one refused.
    let gate = format!("{tag}:gate");
    let _: redis::Value = redis::cmd("LOCK.FENCED")
        .arg(&gate)
        .arg(200)
        .query(&mut c)
        .unwrap();
    let stale = redis::cmd("LOCK.FENCED")
        .arg(&gate)
        .arg(100)
        .query::<redis::Value>(&mut c)
        .unwrap_err();
    assert_eq!(stale.code(), Some("STALEFENCE"), "{stale}");
}

/// Holds `key` with one waiter and one observer blocked on it, so the
/// gauges have something to show, for as long as the connections live.
fn hold_with_waiter_and_observer(s: &Server, key: &str) -> (RawConn, RawConn) {
    let fence = common::acquire(&mut s.conn(), key, "holder", 60_000).expect("granted");
    let waiter = RawConn::block_acquire(s, key, "next", 60_000, 0);
    let mut observer = RawConn::connect(s);
    observer.send(&[
        "LOCK.OBSERVE",
        key,
        "AFTER",
        &fence.to_string(),
        "BLOCK",
        "0",
    ]);
    common::wait_until(Duration::from_secs(10), || {
        let info = s.info_lock();
        let get = |k: &str| info.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        get("waiters").as_deref() == Some("1") && get("observers").as_deref() == Some("1")
    });
    (waiter, observer)
}

// ---- INFO lock and the metrics ----

/// The `INFO lock` field a metric comes from, and the factor from the
/// metric's unit to the field's (seconds to ms).
fn info_field_of(metric: &str) -> (String, f64) {
    let name = metric
        .strip_prefix("redis_lock_")
        .expect("redis_lock_ prefix");
    match name {
        "wait_time_seconds_total" => ("wait_time_total_ms".into(), 1000.0),
        "wait_time_max_seconds" => ("wait_time_max_ms".into(), 1000.0),
        "grants_paused_seconds" => ("grants_paused_ms".into(), 1000.0),
        n => (n.strip_suffix("_total").unwrap_or(n).to_string(), 1.0),
    }
}

fn info_map(s: &Server) -> BTreeMap<String, f64> {
    s.info_lock()
        .into_iter()
        .map(|(k, v)| (k, v.parse().expect("a number")))
        .collect()
}

/// Every sample of `node` in `families` agrees with its `INFO lock` field
/// (between two reads, one before the scrape and one after: the sweep's
/// counters move on their own), and every field of INFO lock is exported.
fn check_against_info(
    families: &BTreeMap<String, Family>,
    node: &str,
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) {
    let mut covered: BTreeSet<String> = BTreeSet::new();
    let mut agree = |field: String, value: f64, what: &str| {
        let (lo, hi) = (before[&field], after[&field]);
        assert!(
            lo.min(hi) <= value && value <= lo.max(hi),
            "{what} on {node} is {value}, INFO lock's lock_{field} was {lo} then {hi}"
        );
        covered.insert(field);
    };
    for (name, f) in families {
        // Up, and the per-key families (LOCK.SCAN's, not INFO's).
        if name == "redis_lock_up" || name.starts_with("redis_lock_key_") {
            continue;
        }
        for sample in f.samples.iter().filter(|s| s.labels["node"] == node) {
            if f.kind == "histogram" {
                let base = name
                    .strip_prefix("redis_lock_")
                    .and_then(|n| n.strip_suffix("_seconds"))
                    .expect("redis_lock_*_seconds");
                let field = if sample.name.ends_with("_bucket") {
                    match sample.labels["le"].as_str() {
                        "+Inf" => format!("{base}_ms_le_inf"),
                        le => {
                            let ms = (le.parse::<f64>().unwrap() * 1000.0).round();
                            format!("{base}_ms_le_{ms}")
                        }
                    }
                } else if sample.name.ends_with("_sum") {
                    format!("{base}_ms_sum")
                } else {
                    format!("{base}_ms_count")
                };
                let scale = if field.ends_with("_sum") { 1000.0 } else { 1.0 };
                agree(field, (sample.value * scale).round(), &sample.name);
            } else {
                let (field, scale) = info_field_of(name);
                agree(field, (sample.value * scale).round(), name);
            }
        }
    }
    let missing: Vec<&String> = before.keys().filter(|k| !covered.contains(*k)).collect();
    assert!(
        missing.is_empty(),
        "INFO lock fields not exported for {node}: {missing:?}"
    );
}

fn value(families: &BTreeMap<String, Family>, metric: &str, node: &str) -> Option<f64> {
    families
        .get(metric)?
        .samples
        .iter()
        .find(|s| s.labels["node"] == node && s.name == metric)
        .map(|s| s.value)
}

#[test]
fn metrics_of_two_nodes_match_info_lock_and_a_down_node_reads_zero() {
    if common::skip_unless(common::Needs::OwnServer, "two servers, INFO lock from zero") {
        return;
    }
    let a = Server::start();
    let b = Server::start();
    let plain = Server::builder().without_module().start();
    let down = free_port(); // nothing listens there
    let urls = vec![
        a.url(),
        b.url(),
        format!("redis://127.0.0.1:{down}/"),
        plain.url(),
    ];
    let (mut exporter, port) = start_exporter(&urls);
    traffic(&a, "a");
    traffic(&a, "a2");
    traffic(&b, "b");
    let _held = hold_with_waiter_and_observer(&a, "held");

    // A client that connects and sends nothing holds up no scrape.
    let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut half = TcpStream::connect(("127.0.0.1", port)).unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();

    let before = [info_map(&a), info_map(&b)];
    let started = Instant::now();
    let (status, headers, body) = http_get(port, "/metrics");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a scrape took {:?} (a down node's timeout is 1s)",
        started.elapsed()
    );
    let after = [info_map(&a), info_map(&b)];
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        headers
            .to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{headers}"
    );
    let families = parse_exposition(&body);
    for (name, f) in &families {
        assert!(name.starts_with("redis_lock_"), "{name}");
        assert_ne!(
            f.kind, "untyped",
            "{name}: a field the exporter does not know"
        );
        for s in &f.samples {
            assert!(urls.iter().any(|u| u.contains(&s.labels["node"])), "{s:?}");
        }
    }
    let node = |s: &Server| format!("127.0.0.1:{}", s.port);
    let (na, nb) = (node(&a), node(&b));
    let (nd, np) = (format!("127.0.0.1:{down}"), node(&plain));
    assert_eq!(families["redis_lock_up"].kind, "gauge");
    assert_eq!(value(&families, "redis_lock_up", &na), Some(1.0));
    assert_eq!(value(&families, "redis_lock_up", &nb), Some(1.0));
    assert_eq!(value(&families, "redis_lock_up", &nd), Some(0.0), "down");
    assert_eq!(
        value(&families, "redis_lock_up", &np),
        Some(0.0),
        "no module"
    );
    for (name, f) in &families {
        // The per-key families name only the nodes with waiting locks.
        if name != "redis_lock_up" && !name.starts_with("redis_lock_key_") {
            let nodes: BTreeSet<&str> = f
                .samples
                .iter()
                .map(|s| s.labels["node"].as_str())
                .collect();
            assert_eq!(nodes, BTreeSet::from([na.as_str(), nb.as_str()]), "{name}");
        }
    }
    for (kind, names) in [
        (
            "counter",
            &[
                "grants",
                "contended",
                "releases",
                "extends",
                "expirations",
                "handoffs",
                "block_timeouts",
                "take_backs",
                "refused_evictable",
                "redirects",
                "sweep_keys",
                "sweep_passes",
                "exec_ran",
                "exec_notheld",
                "fenced_ran",
                "fenced_stale",
                "gates_put_back",
                "wait_time_seconds",
            ][..],
        ),
        (
            "gauge",
            &[
                "locks",
                "waiters",
                "observers",
                "fence_hwm",
                "grants_paused_seconds",
                "wait_time_max_seconds",
                "eviction_unsafe",
            ][..],
        ),
        ("histogram", &["wait_seconds", "hold_seconds"][..]),
    ] {
        for n in names {
            let metric = match kind {
                "counter" => format!("redis_lock_{n}_total"),
                _ => format!("redis_lock_{n}"),
            };
            let f = families
                .get(&metric)
                .unwrap_or_else(|| panic!("no {metric}"));
            assert_eq!(f.kind, kind, "{metric}");
        }
    }
    check_against_info(&families, &na, &before[0], &after[0]);
    check_against_info(&families, &nb, &before[1], &after[1]);
    // The traffic shows.
    for (metric, at_least) in [
        ("redis_lock_grants_total", 10.0),
        ("redis_lock_handoffs_total", 2.0),
        ("redis_lock_expirations_total", 2.0),
        ("redis_lock_contended_total", 2.0),
        ("redis_lock_block_timeouts_total", 2.0),
        ("redis_lock_exec_notheld_total", 2.0),
        ("redis_lock_fenced_stale_total", 2.0),
        ("redis_lock_wait_seconds_count", 2.0),
        ("redis_lock_waiters", 1.0),
        ("redis_lock_observers", 1.0),
    ] {
        let family = metric.strip_suffix("_count").unwrap_or(metric);
        let v = families[family]
            .samples
            .iter()
            .find(|s| s.labels["node"] == na && s.name == metric)
            .map(|s| s.value);
        assert!(v.is_some_and(|v| v >= at_least), "{metric} on {na}: {v:?}");
    }
    let waited = value(&families, "redis_lock_wait_time_seconds_total", &na).unwrap();
    assert!(waited >= 0.02, "{waited}");
    // The locks with the most waiters, by key (LOCK.SCAN WAITING): only
    // "held", the one lock with a waiter, on a.
    for (metric, kind, check) in [
        (
            "redis_lock_key_waiters",
            "gauge",
            (|v| v == 1.0) as fn(f64) -> bool,
        ),
        ("redis_lock_key_holders", "gauge", |v| v == 1.0),
        ("redis_lock_key_longest_wait_seconds", "gauge", |v| v > 0.0),
        // Its one grant so far (the waiter has not been handed it).
        ("redis_lock_key_grants_total", "counter", |v| v == 1.0),
    ] {
        let f = families
            .get(metric)
            .unwrap_or_else(|| panic!("no {metric}"));
        assert_eq!(f.kind, kind, "{metric}");
        let samples: Vec<_> = f.samples.iter().map(|s| (&s.labels, s.value)).collect();
        assert_eq!(samples.len(), 1, "{metric}: {samples:?}");
        assert_eq!(samples[0].0["node"], na, "{metric}");
        assert_eq!(samples[0].0["key"], "held", "{metric}");
        assert!(check(samples[0].1), "{metric}: {samples:?}");
    }

    // Anything but /metrics: 404.
    for path in ["/", "/metric", "/metrics/x", "/favicon.ico"] {
        let (status, _, _) = http_get(port, path);
        assert_eq!(status, "HTTP/1.1 404 Not Found", "{path}");
    }
    // The half-open client still gets its answer when it ends its request.
    half.write_all(b"\r\n").unwrap();
    half.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut answer = String::new();
    half.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");

    // Each node that is not up was named on stderr, with why.
    let _ = exporter.0.kill();
    let _ = exporter.0.wait();
    let mut stderr = String::new();
    exporter
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(stderr.contains(&format!("node {nd} is down")), "{stderr}");
    assert!(
        stderr.contains(&format!("node {np} is down")) && stderr.contains("module is not loaded"),
        "{stderr}"
    );
    assert!(!stderr.contains(&format!("node {na} is down")), "{stderr}");
}

/// `--top N` exports the N locks with the most waiters, the most first,
/// and a key's label is escaped as the text format asks.
#[test]
fn top_exports_the_locks_with_the_most_waiters_by_key() {
    let s = Server::start();
    let mut c = s.conn();
    let mut waiters = Vec::new();
    for (key, n) in [("one", 1), ("three \"q\"", 3), ("two", 2), ("none", 0)] {
        common::acquire(&mut c, key, "holder", 60_000).expect("granted");
        for i in 0..n {
            waiters.push(RawConn::block_acquire(&s, key, &format!("w{i}"), 60_000, 0));
        }
    }
    common::wait_until(Duration::from_secs(10), || s.info_field("waiters") == 6);
    let (_exporter, port) = start_exporter_with(&[s.url()], &["--top", "2"]);
    let (_, _, body) = http_get(port, "/metrics");
    let families = parse_exposition(&body);
    let by_key: BTreeMap<String, f64> = families["redis_lock_key_waiters"]
        .samples
        .iter()
        .map(|s| (s.labels["key"].clone(), s.value))
        .collect();
    let wanted: BTreeMap<String, f64> =
        [("three \"q\"".to_string(), 3.0), ("two".to_string(), 2.0)].into();
    assert_eq!(by_key, wanted);
    assert!(body.contains("key=\"three \\\"q\\\"\"}"), "escaped: {body}");
}

/// Key names are any bytes: two that differ only in bytes that are not
/// UTF-8, and one with a backslash, each get a series of their own, and a
/// server given twice (two URLs) has its series once.
#[test]
fn binary_keys_and_a_server_under_two_urls_give_each_series_once() {
    let s = Server::start();
    let mut raw = RawConn::connect(&s);
    let keys: [&[u8]; 3] = [b"a\xff", b"a\xfe", b"back\\slash"];
    let mut waiters = Vec::new();
    for key in keys {
        let granted = raw.call_binary(&[b"LOCK.ACQUIRE", key, b"holder", b"60000"]);
        assert!(matches!(granted, Resp::Int(_)), "{granted:?}");
        let mut w = RawConn::connect(&s);
        w.send_binary(&[vec![
            b"LOCK.ACQUIRE".to_vec(),
            key.to_vec(),
            b"waiter".to_vec(),
            b"60000".to_vec(),
            b"BLOCK".to_vec(),
            b"0".to_vec(),
        ]]);
        waiters.push(w);
    }
    common::wait_until(Duration::from_secs(10), || s.info_field("waiters") == 3);
    let (_exporter, port) = start_exporter_with(&[s.url(), s.url()], &["--top", "10"]);
    let (_, _, body) = http_get(port, "/metrics");
    let families = parse_exposition(&body); // panics on a series twice
    let labels: BTreeSet<String> = families["redis_lock_key_waiters"]
        .samples
        .iter()
        .map(|s| s.labels["key"].clone())
        .collect();
    let wanted: BTreeSet<String> = [r"a\xff", r"a\xfe", r"back\\slash"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(labels, wanted, "{body}");
}

/// Connections that send nothing cannot keep a scrape out: with every
/// slot taken by one, a new connection takes the oldest one's place.
#[test]
fn idle_connections_do_not_keep_a_scrape_out() {
    let s = Server::start();
    let (_exporter, port) = start_exporter(&[s.url()]);
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).expect("connect"))
        .collect();
    let (status, _, body) = http_get(port, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    assert!(body.contains("redis_lock_up{"), "{body}");
    drop(idle);
}

/// Twenty scrapes at once are answered by fewer reads of the node: one
/// scrape runs at a time and those that came meanwhile take its answer,
/// so clients that ask in a burst cannot multiply the load on Redis.
#[test]
fn scrapes_at_once_share_one_read_of_the_nodes() {
    let s = Server::start();
    let (_exporter, port) = start_exporter(&[s.url()]);
    http_get(port, "/metrics"); // connections made, one scrape done
    let before = s.command_calls("lock.scan");
    let mut conns: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).expect("connect"))
        .collect();
    for c in &mut conns {
        write!(c, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    }
    for c in &mut conns {
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut raw = String::new();
        c.read_to_string(&mut raw).expect("an answer");
        assert!(raw.starts_with("HTTP/1.1 200 OK"), "{raw}");
        assert!(raw.contains("redis_lock_up{"), "{raw}");
    }
    let scrapes = s.command_calls("lock.scan") - before;
    assert!(scrapes >= 1, "the nodes were read");
    assert!(scrapes < 20, "{scrapes} reads for 20 scrapes at once");
}

#[test]
fn a_cluster_url_is_read_on_each_master() {
    if common::skip_unless(common::Needs::OwnServer, "starts a cluster") {
        return;
    }
    let cluster = common::cluster::Cluster::start(false);
    let url = format!("redis-cluster://127.0.0.1:{}/", cluster.nodes[0].port);
    // A lock with a waiter on the master of its slot (the one node that
    // grants it; the others answer MOVED): listed there, by key.
    let owner = cluster.acquire_on_owner("hot", "holder", 60_000);
    let _waiter = RawConn::block_acquire(owner, "hot", "next", 60_000, 0);
    common::wait_until(Duration::from_secs(10), || owner.info_field("waiters") == 1);
    let (_exporter, port) = start_exporter(&[url]);
    let before: Vec<_> = cluster.nodes.iter().map(info_map).collect();
    let (status, _, body) = http_get(port, "/metrics");
    let after: Vec<_> = cluster.nodes.iter().map(info_map).collect();
    assert_eq!(status, "HTTP/1.1 200 OK");
    let families = parse_exposition(&body);
    for (i, master) in cluster.nodes.iter().enumerate() {
        let node = format!("127.0.0.1:{}", master.port);
        assert_eq!(
            value(&families, "redis_lock_up", &node),
            Some(1.0),
            "{body}"
        );
        check_against_info(&families, &node, &before[i], &after[i]);
    }
    assert_eq!(families["redis_lock_up"].samples.len(), 3, "{body}");
    let hot: Vec<_> = families["redis_lock_key_waiters"]
        .samples
        .iter()
        .map(|s| (s.labels["node"].clone(), s.labels["key"].clone(), s.value))
        .collect();
    assert_eq!(
        hot,
        [(format!("127.0.0.1:{}", owner.port), "hot".into(), 1.0)]
    );
    // One master down (as in a failover): it reads 0, the others still 1
    // with their series. Before, one master's error was every master's.
    let owner_port = owner.port;
    let mut cluster = cluster;
    // Neither the owner of "hot" nor the seed the URL names (a client
    // with one seed cannot start while it is down).
    let down = cluster
        .nodes
        .iter()
        .enumerate()
        .position(|(i, n)| i != 0 && n.port != owner_port)
        .expect("a third master");
    cluster.nodes[down].kill9();
    // (The cluster client may take a scrape or two to stop trying the dead
    // node first, as Prometheus' next scrapes would.)
    let hot = format!("redis_lock_key_waiters{{node=\"127.0.0.1:{owner_port}\",key=\"hot\"}} 1");
    let started = Instant::now();
    let body = loop {
        let (_, _, body) = http_get(port, "/metrics");
        let families = parse_exposition(&body);
        let each = cluster.nodes.iter().enumerate().all(|(i, master)| {
            let node = format!("127.0.0.1:{}", master.port);
            let up = if i == down { 0.0 } else { 1.0 };
            value(&families, "redis_lock_up", &node) == Some(up)
        });
        if each && body.contains(&hot) {
            break body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "each live master with its series, the dead one 0: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(!body.contains("node=\"cluster:"), "{body}");
}

// ---- a real Prometheus ----

/// Percent-encoding for a query string.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `/api/v1/query?query=expr`: the result's series.
fn prom_query(port: u16, expr: &str) -> Vec<serde_json::Value> {
    let (status, _, body) = http_get(port, &format!("/api/v1/query?query={}", encode(expr)));
    assert!(status.contains(" 200 "), "{expr}: {status} {body}");
    let reply: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(reply["status"], "success", "{expr}: {body}");
    reply["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Every target's `expr` of the dashboard, with Grafana's variables given
/// values: the rate interval 5s, every node.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = common::workspace_root().join("docs/grafana/redis-lock.json");
    let text = std::fs::read_to_string(&path).expect("read the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("a title").to_string();
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("expr");
            let mut expr = expr.to_string();
            for (var, value) in [
                ("${__rate_interval}", "5s"),
                ("$__rate_interval", "5s"),
                ("${__interval}", "5s"),
                ("$__interval", "5s"),
                ("$interval", "5s"),
                ("${node}", ".*"),
                ("$node", ".*"),
            ] {
                expr = expr.replace(var, value);
            }
            assert!(!expr.contains('$'), "{title}: a variable left in {expr}");
            queries.push((title.clone(), expr));
        }
    }
    queries
}

#[test]
fn prometheus_scrapes_the_exporter_and_answers_every_dashboard_query() {
    if common::skip_unless(common::Needs::OwnServer, "two servers, INFO lock from zero") {
        return;
    }
    if Command::new("prometheus")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        common::skip(
            common::Skip::Missing,
            "prometheus is not installed (apt-get install -y prometheus)",
        );
        return;
    }
    let queries = dashboard_queries();
    assert!(queries.len() >= 12, "{queries:?}");
    let a = Server::start();
    let b = Server::start();
    let (_exporter, port) = start_exporter(&[a.url(), b.url()]);

    let dir = common::ScratchDir::new("prometheus");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: redis-lock\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .unwrap();
    let prom_port = free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let prometheus = Running(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );
    let prom_log = || std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    let scraped = |n: usize| {
        TcpStream::connect(("127.0.0.1", prom_port)).is_ok()
            && prom_query(prom_port, "redis_lock_up == 1").len() == 2
            && prom_query(prom_port, "count_over_time(redis_lock_up[1m])")
                .iter()
                .all(|s| s["value"][1].as_str().and_then(|v| v.parse::<usize>().ok()) >= Some(n))
    };
    let wait_scraped = |n: usize| {
        let started = Instant::now();
        while !scraped(n) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "Prometheus did not scrape the exporter {n} times: {}",
                prom_log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait_scraped(1);

    // The traffic every panel needs, between scrapes.
    traffic(&a, "a");
    traffic(&b, "b");
    let _held = hold_with_waiter_and_observer(&a, "held");
    std::thread::sleep(Duration::from_millis(1500));
    traffic(&a, "a2");
    wait_scraped(4);

    let mut empty = Vec::new();
    for (title, expr) in &queries {
        let series = prom_query(prom_port, expr);
        if series.is_empty() {
            empty.push(format!("{title}: {expr}"));
        }
    }
    assert!(empty.is_empty(), "panels without data: {empty:#?}");
    // The refusals reached Prometheus, not only zeros.
    for metric in [
        "redis_lock_fenced_stale_total",
        "redis_lock_exec_notheld_total",
        "redis_lock_handoffs_total",
    ] {
        let series = prom_query(prom_port, &format!("sum({metric})"));
        let v: f64 = series[0]["value"][1].as_str().unwrap().parse().unwrap();
        assert!(v >= 3.0, "{metric}: {v}");
    }
    // The dashboard's node variable: label_values(redis_lock_up, node).
    let (_, _, body) = http_get(prom_port, "/api/v1/label/node/values?match[]=redis_lock_up");
    let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reply["data"].as_array().map(Vec::len), Some(2), "{body}");
    drop(prometheus);
}
