//! `redis-lock top`: a live view of the nodes' locks, redrawn every
//! `--interval`: each node's counters (locks, waiters, observers, grants
//! and hand-offs a second), then its locks (`LOCK.SCAN`), the most waited
//! for first, with holders, fence, lease left, hold time, the line and its
//! grants a second.
//! Keys: `s` sorts by the next column, `/` filters by a glob (`LOCK.SCAN
//! MATCH`), `j`/`k` or the arrows choose a lock, Enter shows its every
//! holder (Enter or Esc goes back), `q` or Ctrl-C quits. Without a terminal
//! (or with `--once`) it prints one frame, plain, and exits.
//!
//! Drawing is a pure function of the view and the frame ([`draw`]); the
//! loop only reads the nodes, the keys and the clock.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use redis_lock_client::{ListedLock, LockClient};

use crate::{exit, sys};

/// What the locks are ordered by; `s` goes to the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Sort {
    /// The most waiters first (then the longest wait).
    #[default]
    Waiters,
    /// The longest wait of the first in line first.
    Wait,
    /// The most grants a second first.
    Grants,
    /// The longest held first.
    Held,
    /// The least lease left first.
    Ttl,
    /// The newest grant (highest fence) first.
    Fence,
    /// By key.
    Key,
}

impl Sort {
    fn next(self) -> Sort {
        match self {
            Sort::Waiters => Sort::Wait,
            Sort::Wait => Sort::Grants,
            Sort::Grants => Sort::Held,
            Sort::Held => Sort::Ttl,
            Sort::Ttl => Sort::Fence,
            Sort::Fence => Sort::Key,
            Sort::Key => Sort::Waiters,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Sort::Waiters => "waiters",
            Sort::Wait => "wait",
            Sort::Grants => "grants",
            Sort::Held => "held",
            Sort::Ttl => "ttl",
            Sort::Fence => "fence",
            Sort::Key => "key",
        }
    }
}

/// One node's part of a frame.
#[derive(Debug)]
pub(crate) struct NodeView {
    pub name: String,
    /// `INFO lock`'s fields (without `lock_`), or why they could not be read.
    pub counters: Result<HashMap<String, i64>, String>,
    /// Grants, hand-offs and contended acquires a second since the last frame.
    pub rates: Option<(f64, f64, f64)>,
    /// Its locks, or why they could not be listed.
    pub locks: Result<Vec<ListedLock>, String>,
    /// Each listed lock's grants a second since the last frame, where both
    /// listed it (its server's count of the key's grants, `LOCK.INFO`'s
    /// `grants`, goes on while the key is free).
    pub key_rates: HashMap<Vec<u8>, f64>,
    /// Each listed lock's count of grants, kept for the next frame's rates.
    pub counted: HashMap<Vec<u8>, u64>,
}

/// What the person watching chose.
#[derive(Debug, Default)]
pub(crate) struct View {
    pub sort: Sort,
    pub filter: Option<String>,
    /// The chosen row, counted from the top of the list.
    pub selected: usize,
    /// The key (and node) whose every holder is shown.
    pub detail: Option<(String, Vec<u8>)>,
    /// A filter being typed after `/`.
    pub typing: Option<String>,
}

/// A key pressed, as `top` reads it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Key {
    Quit,
    Up,
    Down,
    Enter,
    Escape,
    Backspace,
    Char(char),
}

/// The keys in one read from the terminal (an arrow is three bytes).
pub(crate) fn keys_of(bytes: &[u8]) -> Vec<Key> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let key = match &bytes[i..] {
            [0x1b, b'[', b'A', ..] => {
                i += 2;
                Key::Up
            }
            [0x1b, b'[', b'B', ..] => {
                i += 2;
                Key::Down
            }
            [0x1b, ..] => Key::Escape,
            [0x03, ..] => Key::Quit,
            [b'\r' | b'\n', ..] => Key::Enter,
            [0x7f | 0x08, ..] => Key::Backspace,
            [b, ..] => Key::Char(*b as char),
            [] => break,
        };
        out.push(key);
        i += 1;
    }
    out
}

/// What a key does to the view; false: quit.
pub(crate) fn press(view: &mut View, key: Key, rows: usize) -> bool {
    if let Some(typed) = &mut view.typing {
        match key {
            Key::Enter => {
                let typed = std::mem::take(typed);
                view.filter = (!typed.is_empty()).then_some(typed);
                view.typing = None;
                view.selected = 0;
            }
            Key::Escape => view.typing = None,
            Key::Backspace => {
                typed.pop();
            }
            Key::Char(c) if !c.is_control() => typed.push(c),
            Key::Quit => return false,
            _ => {}
        }
        return true;
    }
    if view.detail.is_some() {
        match key {
            Key::Enter | Key::Escape | Key::Backspace => view.detail = None,
            Key::Quit | Key::Char('q') => return false,
            _ => {}
        }
        return true;
    }
    match key {
        Key::Quit | Key::Char('q') => return false,
        Key::Char('s') => view.sort = view.sort.next(),
        Key::Char('/') => view.typing = Some(String::new()),
        Key::Up | Key::Char('k') => view.selected = view.selected.saturating_sub(1),
        Key::Down | Key::Char('j') => {
            view.selected = (view.selected + 1).min(rows.saturating_sub(1))
        }
        // Enter's choice is made where the rows are known (`choose`).
        _ => {}
    }
    true
}

/// One lock of a frame: its node, the lock, its grants a second (None:
/// not listed in the frame before).
pub(crate) type Row<'a> = (&'a str, &'a ListedLock, Option<f64>);

/// Every lock of the frame in the view's order, with its node.
pub(crate) fn rows(nodes: &[NodeView], sort: Sort, now_ms: i64) -> Vec<Row<'_>> {
    let mut rows: Vec<Row<'_>> = nodes
        .iter()
        .flat_map(|n| {
            let locks = n.locks.as_ref().map(|l| l.as_slice()).unwrap_or(&[]);
            locks
                .iter()
                .map(move |l| (n.name.as_str(), l, n.key_rates.get(&l.key).copied()))
        })
        .collect();
    let held = |l: &ListedLock| held_ms(l, now_ms).unwrap_or(0);
    rows.sort_by(|(na, a, ra), (nb, b, rb)| {
        let by = match sort {
            Sort::Waiters => (b.waiters, b.longest_wait_ms).cmp(&(a.waiters, a.longest_wait_ms)),
            Sort::Wait => b.longest_wait_ms.cmp(&a.longest_wait_ms),
            Sort::Grants => rb.unwrap_or(-1.0).total_cmp(&ra.unwrap_or(-1.0)),
            Sort::Held => held(b).cmp(&held(a)),
            Sort::Ttl => a.ttl_ms.cmp(&b.ttl_ms),
            Sort::Fence => b.fence.cmp(&a.fence),
            Sort::Key => std::cmp::Ordering::Equal,
        };
        by.then_with(|| a.key.cmp(&b.key)).then_with(|| na.cmp(nb))
    });
    rows
}

/// How long the newest holder has held the lock (None: its grant time is
/// unknown).
fn held_ms(l: &ListedLock, now_ms: i64) -> Option<i64> {
    let newest = l.holders.iter().max_by_key(|h| h.fence)?;
    newest.granted_ms.map(|at| (now_ms - at).max(0))
}

/// A duration in ms, short: `850ms`, `12.3s`, `4m05s`, `2h10m`.
fn short(ms: i64) -> String {
    match ms {
        ms if ms < 1_000 => format!("{ms}ms"),
        ms if ms < 60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        ms if ms < 3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        ms => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

/// The first of the rows shown when `room` fit and row `selected` is
/// chosen: the list scrolls so the chosen row is the last that fits.
fn first_shown(selected: usize, room: usize) -> usize {
    (selected + 1).saturating_sub(room.max(1))
}

/// A key as shown: its bytes, non-printable ones escaped.
fn shown(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

/// Why a listing failed, said so a person can act on it.
pub(crate) fn why_unlisted(error: &str) -> String {
    if error.contains("NOPERM") {
        return "this user may not run LOCK.SCAN (ACL): locks are not listed (ACL SETUSER <user> +lock.scan %R~<keys>)".into();
    }
    if error.to_ascii_lowercase().contains("unknown command") {
        return "no LOCK.SCAN there (the redis-lock module is older or not loaded)".into();
    }
    format!("locks not listed: {error}")
}

/// One frame: the header, each node's counters, then the locks (or one
/// lock's every holder), cut to `width` × `height`.
pub(crate) fn draw(
    view: &View,
    nodes: &[NodeView],
    now_ms: i64,
    width: usize,
    height: usize,
) -> String {
    let mut lines: Vec<String> = Vec::new();
    let filter = view.filter.as_deref().unwrap_or("*");
    lines.push(format!(
        "redis-lock top: {} node(s), sort: {} (s), filter: {filter} (/), q quits",
        nodes.len(),
        view.sort.name()
    ));
    for n in nodes {
        let line = match &n.counters {
            Ok(c) => {
                let get = |k: &str| c.get(k).copied().unwrap_or(0);
                let rates = match n.rates {
                    Some((g, h, x)) => {
                        format!("grants/s {g:.1}  hand-offs/s {h:.1}  contended/s {x:.1}")
                    }
                    None => "grants/s -".into(),
                };
                format!(
                    "{}  locks {}  waiters {}  observers {}  {rates}",
                    n.name,
                    get("locks"),
                    get("waiters"),
                    get("observers")
                )
            }
            Err(why) => format!("{}  counters not read: {why}", n.name),
        };
        lines.push(line);
        if let Err(why) = &n.locks {
            lines.push(format!("{}  {}", n.name, why_unlisted(why)));
        }
    }
    if let Some(typed) = &view.typing {
        lines.push(format!(
            "filter (glob, Enter applies, Esc cancels): {typed}_"
        ));
    } else {
        lines.push(String::new());
    }
    let rows = rows(nodes, view.sort, now_ms);
    if let Some((node, key)) = &view.detail {
        match rows.iter().find(|(n, l, _)| n == node && &l.key == key) {
            Some((node, l, rate)) => detail(&mut lines, node, l, *rate, now_ms),
            None => lines.push(format!(
                "{} on {node}: no longer held (Enter goes back)",
                shown(key)
            )),
        }
    } else {
        lines.push(format!(
            "  {:<28} {:<21} {:<9} {:>7} {:>16} {:>8} {:>8} {:>7} {:>9} {:>8}",
            "KEY",
            "NODE",
            "MODE",
            "HOLDERS",
            "FENCE",
            "TTL",
            "HELD",
            "WAITERS",
            "WAITED",
            "GRANTS/S"
        ));
        if rows.is_empty() {
            lines.push("  (no locks held)".into());
        }
        // The rows that fit below the header, scrolled so the chosen one
        // is among them.
        let room = height.saturating_sub(lines.len()).max(1);
        let first = first_shown(view.selected, room);
        for (i, (node, l, rate)) in rows.iter().enumerate().skip(first).take(room) {
            let mark = if i == view.selected { '>' } else { ' ' };
            lines.push(format!(
                "{mark} {:<28} {:<21} {:<9} {:>7} {:>16} {:>8} {:>8} {:>7} {:>9} {:>8}",
                shown(&l.key),
                node,
                l.mode,
                l.holders.len(),
                l.fence,
                short(l.ttl_ms),
                held_ms(l, now_ms).map_or("-".into(), short),
                l.waiters,
                l.longest_wait_ms.map_or("-".into(), short),
                per_second(*rate),
            ));
        }
    }
    let mut out = String::new();
    for line in lines.iter().take(height.max(1)) {
        let cut: String = line.chars().take(width.max(1)).collect();
        let _ = writeln!(out, "{cut}");
    }
    out
}

/// A rate as shown: `12.5`, `-` when unknown.
fn per_second(rate: Option<f64>) -> String {
    rate.map_or("-".into(), |r| format!("{r:.1}"))
}

/// One lock's every holder.
fn detail(lines: &mut Vec<String>, node: &str, l: &ListedLock, rate: Option<f64>, now_ms: i64) {
    lines.push(format!(
        "{} on {node}: {}{}, {} waiting{}, grants/s {}{} (Enter goes back)",
        shown(&l.key),
        l.mode,
        l.limit.map_or(String::new(), |n| format!(" of {n}")),
        l.waiters,
        l.longest_wait_ms
            .map_or(String::new(), |w| format!(", the first for {}", short(w))),
        per_second(rate),
        l.grants
            .map_or(String::new(), |g| format!(", {g} grants here in all")),
    ));
    lines.push(format!(
        "  {:<36} {:>16} {:>8} {:>8}  VALUE",
        "TOKEN", "FENCE", "TTL", "HELD"
    ));
    for h in &l.holders {
        let token = h
            .token
            .as_deref()
            .map_or("(hidden: no write access)".into(), shown);
        let held = h
            .granted_ms
            .map_or("-".into(), |at| short((now_ms - at).max(0)));
        let value = h.value.as_deref().map_or(String::new(), shown);
        lines.push(format!(
            "  {token:<36} {:>16} {:>8} {held:>8}  {value}",
            h.fence,
            short(h.ttl_ms)
        ));
    }
}

/// The node's counters from an `INFO lock` text.
fn counters_of(text: &str) -> HashMap<String, i64> {
    crate::exporter::parse(text).into_iter().collect()
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Reads every node: its counters (with rates against `before`, read at
/// `before_at`) and its locks.
async fn read_frame(
    locks: &LockClient,
    pattern: Option<&str>,
    timeout: Duration,
    before: &mut Option<(Instant, Vec<NodeView>)>,
) -> Vec<NodeView> {
    let (infos, listed) = tokio::join!(
        locks.info_sections("lock", timeout),
        locks.list_locks(pattern, false, timeout)
    );
    let mut listed: HashMap<String, _> = listed.into_iter().collect();
    let now = Instant::now();
    let mut nodes: Vec<NodeView> = infos
        .into_iter()
        .map(|(name, info)| {
            let counters = info
                .map(|t| counters_of(&t))
                .map_err(|e| e.to_string())
                .and_then(|c| match c.contains_key("fence_hwm") {
                    true => Ok(c),
                    false => Err("no redis-lock module there (INFO lock is empty)".into()),
                });
            let locks = listed
                .remove(&name)
                .unwrap_or_else(|| Ok(Vec::new()))
                .map_err(|e| e.to_string());
            NodeView {
                name,
                counters,
                rates: None,
                counted: counted(&locks),
                locks,
                key_rates: HashMap::new(),
            }
        })
        .collect();
    if let Some((at, prev)) = before.as_ref() {
        let secs = now.duration_since(*at).as_secs_f64().max(0.001);
        for n in &mut nodes {
            let (Ok(c), Some(Ok(p))) = (
                &n.counters,
                prev.iter().find(|p| p.name == n.name).map(|p| &p.counters),
            ) else {
                continue;
            };
            let rate = |k: &str| {
                (c.get(k).copied().unwrap_or(0) - p.get(k).copied().unwrap_or(0)).max(0) as f64
                    / secs
            };
            n.rates = Some((rate("grants"), rate("handoffs"), rate("contended")));
        }
        for n in &mut nodes {
            let Some(p) = prev.iter().find(|p| p.name == n.name) else {
                continue;
            };
            n.key_rates = key_rates(&n.counted, &p.counted, secs);
        }
    }
    // Only the counters and each lock's grants are kept for the next rates.
    let kept = nodes
        .iter()
        .map(|n| NodeView {
            name: n.name.clone(),
            counters: n.counters.clone(),
            counted: n.counted.clone(),
            ..NodeView::default()
        })
        .collect();
    *before = Some((now, kept));
    nodes
}

/// Each listed lock's count of grants (where its server counts them).
fn counted(locks: &Result<Vec<ListedLock>, String>) -> HashMap<Vec<u8>, u64> {
    let locks = locks.as_ref().map(|l| l.as_slice()).unwrap_or(&[]);
    locks
        .iter()
        .filter_map(|l| Some((l.key.clone(), l.grants?)))
        .collect()
}

/// Each lock's grants a second between two frames `secs` apart: only locks
/// both counted (a count that went down is a restarted server: no rate).
pub(crate) fn key_rates(
    now: &HashMap<Vec<u8>, u64>,
    before: &HashMap<Vec<u8>, u64>,
    secs: f64,
) -> HashMap<Vec<u8>, f64> {
    now.iter()
        .filter_map(|(key, &g1)| {
            let g0 = *before.get(key)?;
            (g1 >= g0).then(|| (key.clone(), (g1 - g0) as f64 / secs.max(0.001)))
        })
        .collect()
}

impl Default for NodeView {
    fn default() -> Self {
        NodeView {
            name: String::new(),
            counters: Err(String::new()),
            rates: None,
            locks: Ok(Vec::new()),
            key_rates: HashMap::new(),
            counted: HashMap::new(),
        }
    }
}

/// `redis-lock top`.
pub(crate) async fn top(
    locks: LockClient,
    sort: Sort,
    filter: Option<String>,
    interval: Duration,
    once: bool,
) -> ExitCode {
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
        return crate::fail(
            exit::USAGE,
            &format!(
                "--interval must be from {}ms to {}h",
                MIN_INTERVAL.as_millis(),
                MAX_INTERVAL.as_secs() / 3600
            ),
        );
    }
    let timeout = interval.max(Duration::from_millis(500));
    let mut view = View {
        sort,
        filter,
        ..View::default()
    };
    let mut before = None;
    let stdout = std::io::stdout();
    let interactive = !once && stdout.is_terminal() && std::io::stdin().is_terminal();
    if !interactive {
        let nodes = read_frame(&locks, view.filter.as_deref(), timeout, &mut before).await;
        let frame = printable(&draw(&view, &nodes, wall_ms(), usize::MAX, usize::MAX));
        // A closed pipe (`top --once | head`) is not an error worth a panic.
        let _ = stdout.lock().write_all(frame.as_bytes());
        let _ = stdout.lock().flush();
        let any = nodes.iter().any(|n| n.counters.is_ok());
        return if any {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(exit::UNAVAILABLE)
        };
    }
    let Some(_screen) = Screen::enter() else {
        return crate::fail(exit::UNAVAILABLE, "cannot put the terminal in raw mode");
    };
    let (keys_tx, mut keys_rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        loop {
            match sys::read(0, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if keys_tx.send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    use tokio::signal::unix::{signal, SignalKind};
    // Each signal that would end the process ends the view instead, so
    // the terminal is put back (SIGINT, SIGQUIT: sent by another process;
    // the keys are read raw).
    let mut stops: Vec<_> = [
        SignalKind::terminate(),
        SignalKind::hangup(),
        SignalKind::interrupt(),
        SignalKind::quit(),
    ]
    .into_iter()
    .filter_map(|kind| signal(kind).ok())
    .collect();
    let filter = view.filter.clone();
    let Some(mut nodes) = reading(
        read_frame(&locks, filter.as_deref(), timeout, &mut before),
        &mut keys_rx,
        any_signal(&mut stops),
        (&mut view, &[]),
    )
    .await
    else {
        return ExitCode::SUCCESS;
    };
    let mut next_read = Instant::now() + interval;
    let mut filter_read = view.filter.clone();
    'run: loop {
        let (width, height) = sys::window_size(stdout.as_fd()).unwrap_or((120, 40));
        let frame = printable(&draw(
            &view,
            &nodes,
            wall_ms(),
            width as usize,
            height as usize,
        ));
        let mut screen = String::from("\x1b[H\x1b[2J");
        // No newline after the last line: on a full screen it would scroll
        // the header away.
        screen.push_str(&frame.trim_end_matches('\n').replace('\n', "\r\n"));
        let _ = stdout.lock().write_all(screen.as_bytes());
        let _ = stdout.lock().flush();
        let wait = tokio::time::sleep_until(next_read.into());
        tokio::select! {
            _ = wait => {}
            bytes = keys_rx.recv() => {
                let Some(bytes) = bytes else { break 'run };
                if !apply_keys(&mut view, &nodes, &bytes) {
                    break 'run;
                }
                if view.filter == filter_read {
                    continue;
                }
            }
            _ = any_signal(&mut stops) => break 'run,
        }
        let filter = view.filter.clone();
        let read = read_frame(&locks, filter.as_deref(), timeout, &mut before);
        match reading(
            read,
            &mut keys_rx,
            any_signal(&mut stops),
            (&mut view, &nodes),
        )
        .await
        {
            Some(read) => nodes = read,
            None => break 'run,
        }
        filter_read = filter;
        next_read = Instant::now() + interval;
    }
    ExitCode::SUCCESS
}

/// The shortest and longest `--interval`.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
const MAX_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// Waits for `read` (the nodes, which may take a timeout per node) while
/// the keys still work on the frame shown (`view` over `shown`): None when
/// one quits or a signal stops the view.
async fn reading<T>(
    read: impl std::future::Future<Output = T>,
    keys: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    stopped: impl std::future::Future<Output = ()>,
    (view, shown): (&mut View, &[NodeView]),
) -> Option<T> {
    tokio::pin!(read, stopped);
    loop {
        tokio::select! {
            done = &mut read => return Some(done),
            _ = &mut stopped => return None,
            bytes = keys.recv() => match bytes {
                Some(bytes) if apply_keys(view, shown, &bytes) => {}
                _ => return None,
            },
        }
    }
}

/// Applies the keys in `bytes` to `view` over the frame's `nodes`; false
/// when one of them quits.
fn apply_keys(view: &mut View, nodes: &[NodeView], bytes: &[u8]) -> bool {
    let count = rows(nodes, view.sort, wall_ms()).len();
    for key in keys_of(bytes) {
        if key == Key::Enter && view.typing.is_none() && view.detail.is_none() {
            let all = rows(nodes, view.sort, wall_ms());
            if let Some((node, l, _)) = all.get(view.selected) {
                view.detail = Some((node.to_string(), l.key.clone()));
            }
            continue;
        }
        if !press(view, key, count) {
            return false;
        }
    }
    true
}

/// When the first of `stops` is received (never, if there are none).
async fn any_signal(stops: &mut [tokio::signal::unix::Signal]) {
    if stops.is_empty() {
        std::future::pending::<()>().await;
    }
    std::future::poll_fn(|cx| {
        for s in stops.iter_mut() {
            if s.poll_recv(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// The terminal as `top` uses it (raw input, the alternate screen, no
/// cursor), put back when dropped: on every way out, a panic included.
struct Screen {
    mode: sys::TermMode,
}

impl Screen {
    fn enter() -> Option<Screen> {
        let mode = sys::raw_mode(std::io::stdin().as_fd())?;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(b"\x1b[?1049h\x1b[?25l");
        let _ = out.flush();
        Some(Screen { mode })
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(b"\x1b[?25h\x1b[?1049l");
        let _ = out.flush();
        sys::restore_mode(std::io::stdin().as_fd(), &self.mode);
    }
}

/// A frame with every control character but the newline written out
/// (`\x1b` and so on): what a server sends (a node's name, an error's
/// text) never reaches the terminal as an escape sequence.
fn printable(frame: &str) -> String {
    let mut out = String::with_capacity(frame.len());
    for c in frame.chars() {
        match c {
            '\n' => out.push('\n'),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_read_from_raw_bytes() {
        assert_eq!(keys_of(b"q"), vec![Key::Char('q')]);
        assert_eq!(
            keys_of(b"\x1b[A\x1b[Bs"),
            vec![Key::Up, Key::Down, Key::Char('s')]
        );
        assert_eq!(keys_of(b"\x1b"), vec![Key::Escape]);
        assert_eq!(
            keys_of(b"\x03\r\x7f"),
            vec![Key::Quit, Key::Enter, Key::Backspace]
        );
    }

    #[test]
    fn a_filter_is_typed_applied_and_cleared() {
        let mut v = View::default();
        assert!(press(&mut v, Key::Char('/'), 3));
        for c in "ord*".chars() {
            press(&mut v, Key::Char(c), 3);
        }
        press(&mut v, Key::Backspace, 3);
        press(&mut v, Key::Char('*'), 3);
        press(&mut v, Key::Enter, 3);
        assert_eq!(v.filter.as_deref(), Some("ord*"));
        assert!(v.typing.is_none());
        press(&mut v, Key::Char('/'), 3);
        press(&mut v, Key::Enter, 3);
        assert_eq!(v.filter, None, "an empty filter clears it");
        press(&mut v, Key::Char('s'), 3);
        assert_eq!(v.sort, Sort::Wait);
        press(&mut v, Key::Down, 3);
        press(&mut v, Key::Down, 3);
        press(&mut v, Key::Down, 3);
        assert_eq!(v.selected, 2, "the selection stays on the rows");
        assert!(!press(&mut v, Key::Char('q'), 3));
    }

    #[test]
    fn a_frame_reaches_the_terminal_without_control_characters() {
        assert_eq!(printable("a\nb"), "a\nb");
        assert_eq!(printable("node\x1b[2J\r"), "node\\u{1b}[2J\\r");
        assert_eq!(printable("é ok"), "é ok");
    }

    #[test]
    fn the_list_scrolls_to_the_chosen_lock() {
        assert_eq!(first_shown(0, 5), 0);
        assert_eq!(first_shown(4, 5), 0, "the fifth of five rows fits");
        assert_eq!(first_shown(5, 5), 1, "the sixth scrolls one");
        assert_eq!(first_shown(20, 5), 16);
        assert_eq!(first_shown(3, 1), 3, "one row: the chosen one");
    }

    #[test]
    fn a_locks_rate_needs_two_counts() {
        let before = HashMap::from([(b"a".to_vec(), 10), (b"b".to_vec(), 50)]);
        let now = HashMap::from([(b"a".to_vec(), 30), (b"b".to_vec(), 5), (b"c".to_vec(), 9)]);
        let rates = key_rates(&now, &before, 2.0);
        assert_eq!(rates.get(&b"a"[..]), Some(&10.0), "20 grants in 2 s");
        assert_eq!(
            rates.get(&b"b"[..]),
            None,
            "a count that went down: restarted"
        );
        assert_eq!(rates.get(&b"c"[..]), None, "not counted the frame before");
        assert_eq!(per_second(Some(2.25)), "2.2");
        assert_eq!(per_second(None), "-");
    }

    #[test]
    fn durations_are_short() {
        assert_eq!(short(850), "850ms");
        assert_eq!(short(12_340), "12.3s");
        assert_eq!(short(245_000), "4m05s");
        assert_eq!(short(7_800_000), "2h10m");
    }
}
