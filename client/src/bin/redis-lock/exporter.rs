//! `redis-lock exporter`: every node's `INFO lock` as Prometheus metrics,
//! and its `--top` locks with the most waiters (`LOCK.SCAN WAITING`) by
//! key, read when scraped (no background polling) and served over a minimal
//! HTTP/1.1 responder: `GET /metrics` answers the text exposition format
//! (version 0.0.4), any other path 404. Each connection is a task of its
//! own with deadlines on reading the request and writing the answer, so a
//! slow or half-open client holds up no other scrape.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis_lock_client::{ListedLock, LockClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::{exit, fail};

/// How long a client has to send its request head, and to take the answer.
const CLIENT_DEADLINE: Duration = Duration::from_secs(10);
/// The longest request head read (a scrape's is a few hundred bytes).
const MAX_REQUEST: usize = 16 * 1024;
/// Connections served at once; beyond that a new one is closed at once.
const MAX_CONNECTIONS: usize = 256;

/// What a metric is in Prometheus' terms.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

/// A plain `INFO lock` field and the metric it becomes.
struct Field {
    /// The field without its `lock_` prefix.
    info: &'static str,
    /// The metric's name (counters end in `_total`).
    metric: &'static str,
    kind: Kind,
    /// The field is in milliseconds and the metric in seconds.
    ms: bool,
    help: &'static str,
}

const fn counter(info: &'static str, metric: &'static str, help: &'static str) -> Field {
    Field {
        info,
        metric,
        kind: Kind::Counter,
        ms: false,
        help,
    }
}

const fn gauge(info: &'static str, metric: &'static str, help: &'static str) -> Field {
    Field {
        info,
        metric,
        kind: Kind::Gauge,
        ms: false,
        help,
    }
}

const fn in_seconds(field: Field) -> Field {
    Field { ms: true, ..field }
}

/// Every plain field the module emits (docs/operations.md, INFO lock).
const FIELDS: &[Field] = &[
    counter("grants", "redis_lock_grants_total", "New grants, each issued a fencing token (hand-offs included)."),
    counter("contended", "redis_lock_contended_total", "LOCK.ACQUIRE that replied nil because another token held the lock."),
    counter("releases", "redis_lock_releases_total", "Successful LOCK.RELEASE."),
    counter("extends", "redis_lock_extends_total", "Successful LOCK.EXTEND, and same-token LOCK.ACQUIRE."),
    counter("expirations", "redis_lock_expirations_total", "Leases that ran out while held."),
    counter("handoffs", "redis_lock_handoffs_total", "Grants made by handing a lock to a BLOCK waiter."),
    counter("block_timeouts", "redis_lock_block_timeouts_total", "BLOCK waiters that left by timeout or CLIENT UNBLOCK."),
    counter("take_backs", "redis_lock_take_backs_total", "Grants taken back because their client vanished before the reply."),
    counter("refused_evictable", "redis_lock_refused_evictable_total", "ACQUIREs refused because maxmemory-policy could evict locks."),
    counter("redirects", "redis_lock_redirects_total", "Waiters sent to another cluster node because their key moved away."),
    counter("sweep_keys", "redis_lock_sweep_keys_total", "Keys the background sweep has looked at (every key, not only locks)."),
    counter("sweep_passes", "redis_lock_sweep_passes_total", "Passes the background sweep has finished over the whole keyspace."),
    counter("exec_ran", "redis_lock_exec_ran_total", "LOCK.EXEC whose command ran (its own error replies included)."),
    counter("exec_notheld", "redis_lock_exec_notheld_total", "LOCK.EXEC refused because the token did not hold the lock (NOTHELD)."),
    counter("fenced_ran", "redis_lock_fenced_ran_total", "LOCK.FENCED that ran its command or recorded its fence."),
    counter("fenced_stale", "redis_lock_fenced_stale_total", "LOCK.FENCED refused because its fence was below the gate's mark (STALEFENCE)."),
    counter("gates_put_back", "redis_lock_gates_put_back_total", "Fence gates maxmemory evicted and put back with their kept mark."),
    in_seconds(counter("wait_time_total_ms", "redis_lock_wait_time_seconds_total", "Total time BLOCK waiters waited before their hand-off, in seconds.")),
    gauge("locks", "redis_lock_locks", "Holders in memory now (one per exclusive lock key, one per holder of a shared key; an ended lease counts until reclaimed)."),
    gauge("waiters", "redis_lock_waiters", "Clients waiting with BLOCK in a lock's line now."),
    gauge("observers", "redis_lock_observers", "Clients blocked in LOCK.OBSERVE ... BLOCK now."),
    gauge("lease_ends", "redis_lock_lease_ends", "Leases filed by their end for the timer to reclaim (one per held key, plus one per grant released early, for at most 30 s)."),
    in_seconds(gauge("wait_time_max_ms", "redis_lock_wait_time_max_seconds", "The longest wait of a BLOCK waiter before its hand-off since the server started, in seconds.")),
    gauge("fence_hwm", "redis_lock_fence_hwm", "The fencing high-water mark: the largest token issued or applied."),
    in_seconds(gauge("grants_paused_ms", "redis_lock_grants_paused_seconds", "Seconds left of lock.restart-delay-ms (0 when grants are allowed).")),
    gauge("eviction_unsafe", "redis_lock_eviction_unsafe", "1 while maxmemory-policy can evict locks."),
];

/// The two histograms: the `INFO lock` prefix (`wait_ms` for
/// `lock_wait_ms_le_N`, `_count`, `_sum`), the metric and its help.
const HISTOGRAMS: &[(&str, &str, &str)] = &[
    (
        "wait_ms",
        "redis_lock_wait_seconds",
        "How long BLOCK waiters waited before they were granted the lock.",
    ),
    (
        "hold_ms",
        "redis_lock_hold_seconds",
        "How long holders held the lock (to release, take-back, or the end of the lease).",
    ),
];

/// `redis-lock exporter`: serves until killed (or the listener fails).
pub(crate) async fn exporter(
    locks: LockClient,
    listen: &str,
    timeout: Duration,
    top: usize,
) -> ExitCode {
    let listener = match TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            return fail(
                exit::UNAVAILABLE,
                &format!("cannot listen on {listen}: {e}"),
            )
        }
    };
    let shown = listener
        .local_addr()
        .map_or_else(|_| listen.to_string(), |a| a.to_string());
    eprintln!(
        "redis-lock: exporter: serving http://{shown}/metrics for {} node(s)",
        locks.nodes()
    );
    let state = Arc::new(Exporter {
        locks,
        timeout,
        top,
        last: Mutex::new(HashMap::new()),
        latest: tokio::sync::Mutex::new(None),
    });
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let reading = Arc::new(Mutex::new(Reading::default()));
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: wait, do not spin.
                eprintln!("redis-lock: exporter: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            // Every slot taken: the connection that has waited longest
            // without sending its request gives way (clients that open
            // connections and send nothing cannot keep a scrape out),
            // unless every one is being answered.
            Err(_) => {
                let Some(oldest) = lock(&reading).oldest() else {
                    continue; // dropped: closed at once
                };
                oldest.notify_one();
                match tokio::time::timeout(Duration::from_secs(1), slots.clone().acquire_owned())
                    .await
                {
                    Ok(Ok(slot)) => slot,
                    _ => continue,
                }
            }
        };
        let (id, gone) = lock(&reading).enter();
        let (state, reading) = (state.clone(), reading.clone());
        tokio::spawn(async move {
            serve(stream, &state, &gone, || lock(&reading).leave(id)).await;
            lock(&reading).leave(id);
            drop(slot);
        });
    }
}

/// The connections still sending their request head, oldest first, each
/// with the signal that makes it give its slot away.
#[derive(Default)]
struct Reading {
    next: u64,
    waiting: std::collections::BTreeMap<u64, Arc<tokio::sync::Notify>>,
}

impl Reading {
    fn enter(&mut self) -> (u64, Arc<tokio::sync::Notify>) {
        let id = self.next;
        self.next += 1;
        let gone = Arc::new(tokio::sync::Notify::new());
        self.waiting.insert(id, gone.clone());
        (id, gone)
    }

    fn leave(&mut self, id: u64) {
        self.waiting.remove(&id);
    }

    /// The oldest one's signal, taken out (it is leaving).
    fn oldest(&mut self) -> Option<Arc<tokio::sync::Notify>> {
        self.waiting.pop_first().map(|(_, gone)| gone)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Exporter {
    locks: LockClient,
    /// How long each node has to answer `INFO lock`.
    timeout: Duration,
    /// How many locks with waiters to export per node, by key.
    top: usize,
    /// Each node's last state (None: up, Some: why not), logged on change.
    last: Mutex<HashMap<String, Option<String>>>,
    /// The last scrape's exposition and when it was done: one scrape runs
    /// at a time, and a request that came while it ran takes its answer.
    latest: tokio::sync::Mutex<Option<(tokio::time::Instant, Arc<String>)>>,
}

/// One connection: one request, one answer, closed. Told `gone` while it
/// is still reading the request, it gives up; `read` is called once the
/// request is in.
async fn serve(
    mut stream: TcpStream,
    state: &Exporter,
    gone: &tokio::sync::Notify,
    read: impl FnOnce(),
) {
    let head = tokio::select! {
        head = tokio::time::timeout(CLIENT_DEADLINE, read_head(&mut stream)) => head,
        _ = gone.notified() => return, // made way for a newer connection
    };
    read();
    let Ok(Some(head)) = head else {
        return; // slow, half-open, too long or not HTTP: dropped
    };
    let mut words = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let answer = match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let body = state.shared_scrape().await;
            response(
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                &body,
                method == "HEAD",
            )
        }
        (_, "/metrics") => response(
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET\n",
            false,
        ),
        _ => response(
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n",
            method == "HEAD",
        ),
    };
    let _ = tokio::time::timeout(CLIENT_DEADLINE, async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

/// The request line and headers (up to the blank line), or None if the
/// client closed first, sent too much, or not text.
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        if head.len() > MAX_REQUEST {
            return None;
        }
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(head).ok()
}

fn response(status: &str, content_type: &str, body: &str, head_only: bool) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        body.len(),
        if head_only { "" } else { body }
    )
}

/// One node's `INFO lock` fields (without the `lock_` prefix).
type Fields = Vec<(String, i64)>;

impl Exporter {
    /// The exposition for a request that came now: a scrape of its own, or
    /// the one that was under way when it came (so however many clients
    /// ask at once, the nodes are read by one scrape at a time).
    async fn shared_scrape(&self) -> Arc<String> {
        let asked = tokio::time::Instant::now();
        let mut latest = self.latest.lock().await;
        if let Some((done, body)) = latest.as_ref() {
            if *done >= asked {
                return body.clone();
            }
        }
        let body = Arc::new(self.scrape().await);
        *latest = Some((tokio::time::Instant::now(), body.clone()));
        body
    }

    /// Reads every node now and renders the exposition.
    async fn scrape(&self) -> String {
        let listing = async {
            match self.top {
                0 => Vec::new(),
                _ => self.locks.list_locks(None, true, self.timeout).await,
            }
        };
        let (replies, listed) =
            tokio::join!(self.locks.info_sections("lock", self.timeout), listing);
        let mut nodes: Vec<(String, Option<Fields>)> = Vec::new();
        for (node, reply) in replies {
            if nodes.iter().any(|(seen, _)| *seen == node) {
                continue; // one server under two URLs: its series once
            }
            let fields = match reply {
                Ok(text) => {
                    let fields = parse(&text);
                    if fields.iter().any(|(k, _)| k == "fence_hwm") {
                        Ok(fields)
                    } else {
                        Err("answers, but the redis-lock module is not loaded there (INFO lock has no lock_ fields)".to_string())
                    }
                }
                Err(e) => Err(format!("did not answer INFO lock: {e}")),
            };
            self.log_change(&node, fields.as_ref().err());
            nodes.push((node, fields.ok()));
        }
        let mut out = render(&nodes);
        // A node that cannot list (an older module, no LOCK.SCAN in its
        // ACL) exports its INFO fields without the per-key series.
        let mut hottest_by_node: Vec<(String, Vec<ListedLock>)> = Vec::new();
        for (node, listing) in listed {
            if hottest_by_node.iter().any(|(seen, _)| *seen == node) {
                continue; // one server under two URLs: the first one's
            }
            if let Ok(locks) = listing {
                hottest_by_node.push((node, hottest(locks, self.top)));
            }
        }
        let hottest = hottest_by_node;
        render_hottest(&mut out, &hottest);
        out
    }

    /// Says on stderr when a node goes down (and why) or comes back.
    fn log_change(&self, node: &str, why: Option<&String>) {
        let mut last = lock(&self.last);
        let before = last.get(node);
        if before.map(|b| b.as_ref()) == Some(why) {
            return;
        }
        match why {
            Some(why) => {
                eprintln!("redis-lock: exporter: node {node} is down (redis_lock_up 0): {why}")
            }
            None if before.is_some() => eprintln!("redis-lock: exporter: node {node} is up again"),
            None => {}
        }
        last.insert(node.to_string(), why.cloned());
    }
}

/// The `lock_` fields of an `INFO lock` text with integer values.
pub(crate) fn parse(text: &str) -> Fields {
    text.lines()
        .filter_map(|l| l.strip_prefix("lock_")?.split_once(':'))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect()
}

/// The exposition: each family's HELP and TYPE, then its samples, one per
/// node that has it.
fn render(nodes: &[(String, Option<Fields>)]) -> String {
    let mut out = String::new();
    family_head(
        &mut out,
        "redis_lock_up",
        "gauge",
        "1 if the node answered INFO lock with the redis-lock module loaded, 0 if not.",
    );
    for (node, fields) in nodes {
        let _ = writeln!(
            out,
            "redis_lock_up{{node=\"{}\"}} {}",
            label(node),
            u8::from(fields.is_some())
        );
    }
    let up: Vec<(&str, &Fields)> = nodes
        .iter()
        .filter_map(|(node, f)| Some((node.as_str(), f.as_ref()?)))
        .collect();
    let value =
        |fields: &Fields, name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
    for field in FIELDS {
        let samples: Vec<(&str, i64)> = up
            .iter()
            .filter_map(|(node, f)| Some((*node, value(f, field.info)?)))
            .collect();
        if samples.is_empty() {
            continue;
        }
        let kind = if field.kind == Kind::Counter {
            "counter"
        } else {
            "gauge"
        };
        family_head(&mut out, field.metric, kind, field.help);
        for (node, v) in samples {
            let v = if field.ms { seconds(v) } else { v.to_string() };
            let _ = writeln!(out, "{}{{node=\"{}\"}} {v}", field.metric, label(node));
        }
    }
    for (prefix, metric, help) in HISTOGRAMS {
        let mut head = false;
        for (node, fields) in &up {
            let Some(h) = histogram(fields, prefix) else {
                continue;
            };
            if !head {
                family_head(&mut out, metric, "histogram", help);
                head = true;
            }
            let node = label(node);
            for (bound, n) in &h.buckets {
                let le = bound.map_or_else(|| "+Inf".to_string(), seconds);
                let _ = writeln!(out, "{metric}_bucket{{node=\"{node}\",le=\"{le}\"}} {n}");
            }
            let _ = writeln!(out, "{metric}_sum{{node=\"{node}\"}} {}", seconds(h.sum));
            let _ = writeln!(out, "{metric}_count{{node=\"{node}\"}} {}", h.count);
        }
    }
    // Fields this exporter does not know (a newer module): exported as
    // they are, untyped, rather than dropped.
    let mut unknown: Vec<&str> = Vec::new();
    for (_, fields) in &up {
        for (k, _) in fields.iter() {
            let known = FIELDS.iter().any(|f| f.info == k)
                || HISTOGRAMS
                    .iter()
                    .any(|(p, _, _)| k.starts_with(&format!("{p}_")));
            let valid = k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !known && valid && !unknown.contains(&k.as_str()) {
                unknown.push(k);
            }
        }
    }
    for k in unknown {
        let metric = format!("redis_lock_{k}");
        family_head(
            &mut out,
            &metric,
            "untyped",
            &format!("INFO lock field lock_{k} (not known to this exporter)."),
        );
        for (node, fields) in &up {
            if let Some(v) = value(fields, k) {
                let _ = writeln!(out, "{metric}{{node=\"{}\"}} {v}", label(node));
            }
        }
    }
    out
}

fn family_head(out: &mut String, metric: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {metric} {}", help.replace('\\', "\\\\"));
    let _ = writeln!(out, "# TYPE {metric} {kind}");
}

/// One node's histogram: cumulative buckets by upper bound in ms (None:
/// +Inf, last), the sum in ms and the count.
struct Histogram {
    buckets: Vec<(Option<i64>, i64)>,
    sum: i64,
    count: i64,
}

/// `PREFIX_le_N`, `PREFIX_le_inf`, `PREFIX_sum` and `PREFIX_count`, if
/// the node has them all.
fn histogram(fields: &Fields, prefix: &str) -> Option<Histogram> {
    let mut buckets: Vec<(Option<i64>, i64)> = Vec::new();
    let (mut sum, mut count) = (None, None);
    for (k, v) in fields {
        let Some(rest) = k.strip_prefix(prefix).and_then(|r| r.strip_prefix('_')) else {
            continue;
        };
        match rest {
            "sum" => sum = Some(*v),
            "count" => count = Some(*v),
            "le_inf" => buckets.push((None, *v)),
            _ => {
                if let Some(bound) = rest.strip_prefix("le_").and_then(|n| n.parse().ok()) {
                    buckets.push((Some(bound), *v));
                }
            }
        }
    }
    // Finite bounds ascending, +Inf last.
    buckets.sort_by_key(|(bound, _)| bound.unwrap_or(i64::MAX));
    let has_inf = buckets.last().is_some_and(|(b, _)| b.is_none());
    has_inf.then_some(())?;
    Some(Histogram {
        buckets,
        sum: sum?,
        count: count?,
    })
}

/// Milliseconds as seconds, exactly (`1` -> `0.001`, `1024` -> `1.024`).
fn seconds(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let ms = ms.unsigned_abs();
    let (whole, frac) = (ms / 1000, ms % 1000);
    if frac == 0 {
        return format!("{sign}{whole}");
    }
    let frac = format!("{frac:03}");
    format!("{sign}{whole}.{}", frac.trim_end_matches('0'))
}

/// The `n` locks with the most waiters (the longest wait first among
/// equals, then by key: a stable order).
fn hottest(mut locks: Vec<ListedLock>, n: usize) -> Vec<ListedLock> {
    locks.sort_by(|a, b| {
        (b.waiters, b.longest_wait_ms, &a.key).cmp(&(a.waiters, a.longest_wait_ms, &b.key))
    });
    locks.truncate(n);
    locks
}

/// The per-key families of each node's hottest locks.
fn render_hottest(out: &mut String, nodes: &[(String, Vec<ListedLock>)]) {
    type Read = fn(&ListedLock) -> Option<String>;
    let families: [(&str, &str, &str, Read); 4] = [
        (
            "redis_lock_key_waiters",
            "gauge",
            "Clients waiting in the line of one of the node's locks with the most waiters (--top of them, by key).",
            |l| Some(l.waiters.to_string()),
        ),
        (
            "redis_lock_key_longest_wait_seconds",
            "gauge",
            "How long the first in that lock's line has waited, in seconds.",
            |l| Some(seconds(l.longest_wait_ms.unwrap_or(0))),
        ),
        (
            "redis_lock_key_holders",
            "gauge",
            "That lock's live holders (1 when exclusive).",
            |l| Some(l.holders.len().to_string()),
        ),
        (
            "redis_lock_key_grants_total",
            "counter",
            "That key's grants on the node since it started, across frees (LOCK.INFO grants: never fewer, more only where the node's sketch shares counters).",
            |l| l.grants.map(|g| g.to_string()),
        ),
    ];
    if nodes.iter().all(|(_, locks)| locks.is_empty()) {
        return;
    }
    for (metric, kind, help, read) in families {
        family_head(out, metric, kind, help);
        for (node, locks) in nodes {
            for l in locks {
                // A module that does not count a key's grants: no sample.
                let Some(value) = read(l) else { continue };
                let key = label(&key_label(&l.key));
                let _ = writeln!(
                    out,
                    "{metric}{{node=\"{}\",key=\"{key}\"}} {value}",
                    label(node),
                );
            }
        }
    }
}

/// A key name as a label value, one to one: label values are UTF-8 and a
/// key is any bytes, so a byte that is not UTF-8 is written `\xNN` and a
/// backslash `\\` (a lossy decoding would give two keys one series, and
/// Prometheus refuses a scrape with a series twice).
fn key_label(key: &[u8]) -> String {
    let mut out = String::with_capacity(key.len());
    for chunk in key.utf8_chunks() {
        out.push_str(&chunk.valid().replace('\\', "\\\\"));
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// A label value escaped as the text format asks.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_label_is_one_to_one() {
        assert_eq!(key_label(b"orders:1"), "orders:1");
        assert_eq!(key_label("é".as_bytes()), "é");
        assert_eq!(key_label(b"a\xff"), r"a\xff");
        assert_eq!(key_label(br"a\xff"), r"a\\xff", "a backslash is doubled");
        assert_ne!(key_label(b"a\xfe"), key_label(b"a\xff"));
    }

    #[test]
    fn milliseconds_become_exact_seconds() {
        assert_eq!(seconds(0), "0");
        assert_eq!(seconds(1), "0.001");
        assert_eq!(seconds(20), "0.02");
        assert_eq!(seconds(1024), "1.024");
        assert_eq!(seconds(1_048_576), "1048.576");
        assert_eq!(seconds(3000), "3");
        assert_eq!(seconds(-1500), "-1.5");
    }

    #[test]
    fn a_histogram_keeps_its_order_and_ends_in_inf() {
        let fields: Fields = vec![
            ("wait_ms_le_2".into(), 3),
            ("wait_ms_le_1".into(), 1),
            ("wait_ms_le_inf".into(), 4),
            ("wait_ms_count".into(), 4),
            ("wait_ms_sum".into(), 2005),
        ];
        let h = histogram(&fields, "wait_ms").unwrap();
        assert_eq!(h.buckets, vec![(Some(1), 1), (Some(2), 3), (None, 4)]);
        assert_eq!((h.sum, h.count), (2005, 4));
        let out = render(&[("h:1".into(), Some(fields))]);
        assert!(
            out.contains("redis_lock_wait_seconds_bucket{node=\"h:1\",le=\"0.002\"} 3\n"),
            "{out}"
        );
        assert!(
            out.contains("redis_lock_wait_seconds_sum{node=\"h:1\"} 2.005\n"),
            "{out}"
        );
    }
}
