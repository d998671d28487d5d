//! etcd's side of the election benchmark: a single member started here on
//! free loopback ports (stopped by its pid), driven through its v3 JSON
//! gateway over kept-alive HTTP/1.1 connections, every answer awaited from
//! one thread ([`crate::wire`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{us, Measured, NoIdle, Rounds, OBSERVERS, SETTLE, TTL_MS, TTL_S};
use crate::common::free_port;
use crate::stats::Summary;
use crate::wire::{since, until_each, Awaited};

/// A single etcd member on free loopback ports with its data in `dir`;
/// killed by its pid and its directory removed on drop.
pub(super) struct Etcd {
    port: u16,
    pub(super) version: String,
    dir: PathBuf,
    child: Child,
}

fn etcd_version() -> Result<String, String> {
    let out = Command::new("etcd")
        .arg("--version")
        .output()
        .map_err(|e| format!("etcd is not installed ({e}; apt-get install -y etcd-server)"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("etcd Version:"))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| format!("etcd --version said {text:?}"))
}

impl Etcd {
    pub(super) fn start(parent: &Path) -> Result<Etcd, String> {
        let version = etcd_version()?;
        let (port, peer) = (free_port(), free_port());
        let dir = parent.join(format!(
            "redis-lock-bench-etcd-{}-{port}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let log = std::fs::File::create(dir.join("etcd.log")).map_err(|e| e.to_string())?;
        let client_url = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .arg("--name=bench")
            .arg(format!("--data-dir={}", dir.join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=bench={peer_url}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("etcd did not start: {e}"))?;
        let etcd = Etcd {
            port,
            version,
            dir,
            child,
        };
        let started = Instant::now();
        loop {
            let ok = Http::connect(port)
                .and_then(|mut h| h.post("/v3/maintenance/status", "{}"))
                .is_ok();
            if ok {
                return Ok(etcd);
            }
            if started.elapsed() > Duration::from_secs(30) {
                let log = std::fs::read_to_string(etcd.dir.join("etcd.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                return Err(format!("etcd did not answer in 30 s: {}", tail.join(" / ")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn http(&self) -> Result<Http, String> {
        Http::connect(self.port)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One kept-alive HTTP/1.1 connection to etcd's JSON gateway.
struct Http {
    r: BufReader<TcpStream>,
    /// A stream's bytes read past the last whole message.
    pending: Vec<u8>,
}

impl Http {
    fn connect(port: u16) -> Result<Http, String> {
        let s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Http {
            r: BufReader::new(s),
            pending: Vec::new(),
        })
    }

    fn send(&mut self, path: &str, body: &str) -> Result<(), String> {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.r
            .get_mut()
            .write_all(req.as_bytes())
            .map_err(|e| e.to_string())
    }

    fn line(&mut self) -> Result<String, String> {
        let mut l = String::new();
        match self.r.read_line(&mut l) {
            Ok(0) => Err("connection closed".into()),
            Ok(_) => Ok(l.trim_end().to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The status line and headers: whether the body is chunked, else its
    /// length.
    fn head(&mut self) -> Result<(bool, usize), String> {
        let status = self.line()?;
        let (mut chunked, mut len) = (false, 0);
        loop {
            let h = self.line()?;
            if h.is_empty() {
                break;
            }
            let lower = h.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            } else if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                chunked = true;
            }
        }
        if !status.contains(" 200 ") {
            let body = if chunked {
                self.chunked_body()?
            } else {
                self.exact(len)?
            };
            return Err(format!("{status}: {body}"));
        }
        Ok((chunked, len))
    }

    fn exact(&mut self, n: usize) -> Result<String, String> {
        let mut b = vec![0; n];
        self.r.read_exact(&mut b).map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    /// The next chunk of a chunked body; None at its end.
    fn chunk(&mut self) -> Result<Option<Vec<u8>>, String> {
        let size = self.line()?;
        let n = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("bad chunk size {size:?}"))?;
        if n == 0 {
            // The last chunk: trailers (the gateway sends gRPC's), then an
            // empty line.
            while !self.line()?.is_empty() {}
            return Ok(None);
        }
        let mut b = vec![0; n + 2];
        self.r.read_exact(&mut b).map_err(|e| e.to_string())?;
        b.truncate(n);
        Ok(Some(b))
    }

    fn chunked_body(&mut self) -> Result<String, String> {
        let mut all = Vec::new();
        while let Some(c) = self.chunk()? {
            all.extend(c);
        }
        Ok(String::from_utf8_lossy(&all).into_owned())
    }

    /// A unary call (a keepalive's stream of one answer included).
    fn post(&mut self, path: &str, body: &str) -> Result<String, String> {
        self.send(path, body)?;
        self.response()
    }

    /// The answer to the call sent last.
    fn response(&mut self) -> Result<String, String> {
        let (chunked, len) = self.head()?;
        if chunked {
            self.chunked_body()
        } else {
            self.exact(len)
        }
    }

    /// Starts a server stream (observe): its messages come from `message`.
    fn open_stream(&mut self, path: &str, body: &str) -> Result<(), String> {
        self.send(path, body)?;
        match self.head()? {
            (true, _) => Ok(()),
            _ => Err(format!("{path}: not a stream")),
        }
    }

    /// The stream's next message (one JSON object a line).
    fn message(&mut self) -> Result<String, String> {
        loop {
            if let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=i).collect();
                let text = String::from_utf8_lossy(&line).trim().to_string();
                if !text.is_empty() {
                    return Ok(text);
                }
                continue;
            }
            match self.chunk()? {
                Some(c) => self.pending.extend(c),
                None => return Err("the stream ended".into()),
            }
        }
    }
}

fn b64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The string or number value of the first `"name":` in a gateway reply.
fn jfield(json: &str, name: &str) -> Option<String> {
    let pat = format!("\"{name}\":");
    let rest = json[json.find(&pat)? + pat.len()..].trim_start();
    if let Some(s) = rest.strip_prefix('"') {
        Some(s[..s.find('"')?].to_string())
    } else {
        let end = rest.find([',', '}']).unwrap_or(rest.len());
        Some(rest[..end].trim().to_string())
    }
}

/// The object value of `"name":` (flat objects: the gateway's leader key
/// and kv have no nested objects).
fn jobject<'a>(json: &'a str, name: &str) -> Option<&'a str> {
    let pat = format!("\"{name}\":");
    let start = json.find(&pat)? + pat.len();
    let rest = &json[start..];
    let open = rest.find('{')?;
    let close = rest[open..].find('}')? + open;
    Some(&rest[open..=close])
}

/// The leader key a stream message or campaign names (`kv.key` of an
/// observe message).
fn observed_key(msg: &str) -> Option<String> {
    jfield(jobject(msg, "kv")?, "key")
}

struct EtcdClient {
    http: Http,
}

impl EtcdClient {
    fn grant(&mut self) -> Result<String, String> {
        let r = self
            .http
            .post("/v3/lease/grant", &format!("{{\"TTL\":{TTL_S}}}"))?;
        jfield(&r, "ID").ok_or(format!("no lease ID in {r}"))
    }
    fn keepalive(&mut self, lease: &str) -> Result<(), String> {
        self.http
            .post("/v3/lease/keepalive", &format!("{{\"ID\":\"{lease}\"}}"))
            .map(drop)
    }
    fn revoke(&mut self, lease: &str) {
        let _ = self
            .http
            .post("/v3/lease/revoke", &format!("{{\"ID\":\"{lease}\"}}"));
    }
    /// Campaigns until leader; the leader key (a JSON object, for resign).
    fn campaign(&mut self, name: &str, lease: &str) -> Result<String, String> {
        self.send_campaign(name, lease)?;
        let r = self.http.response()?;
        jobject(&r, "leader")
            .map(str::to_string)
            .ok_or(format!("no leader in {r}"))
    }
    /// Starts a campaign, its answer awaited later ([`Campaign`]).
    fn send_campaign(&mut self, name: &str, lease: &str) -> Result<(), String> {
        let body = format!(
            "{{\"name\":\"{}\",\"lease\":\"{lease}\",\"value\":\"{}\"}}",
            b64(name.as_bytes()),
            b64(lease.as_bytes())
        );
        self.http.send("/v3/election/campaign", &body)
    }
    /// Sends a resign, its answer read later (`http.response()`).
    fn send_resign(&mut self, leader: &str) -> Result<(), String> {
        self.http
            .send("/v3/election/resign", &format!("{{\"leader\":{leader}}}"))
    }
    /// How many candidates have a key in election `name` (leader included).
    fn candidates(&mut self, name: &str) -> Result<u64, String> {
        let prefix = format!("{name}/");
        let end = format!("{name}0");
        let r = self.http.post(
            "/v3/kv/range",
            &format!(
                "{{\"key\":\"{}\",\"range_end\":\"{}\",\"count_only\":true}}",
                b64(prefix.as_bytes()),
                b64(end.as_bytes())
            ),
        )?;
        Ok(jfield(&r, "count")
            .and_then(|c| c.parse().ok())
            .unwrap_or(0))
    }
    /// Waits (polling every 200 µs, outside any timed window) until `n`
    /// candidates are in election `name`.
    fn until_candidates(&mut self, name: &str, n: u64) -> Result<(), String> {
        let started = Instant::now();
        while self.candidates(name)? < n {
            if started.elapsed() > Duration::from_secs(10) {
                return Err(format!("{n} candidates never seen in {name}"));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }
    /// An observe stream of election `name`, past its first message (the
    /// current leader, whose key it returns): from here on it is told of
    /// every change.
    fn observer(etcd: &Etcd, name: &str) -> Result<(Http, String), String> {
        let mut h = etcd.http()?;
        h.open_stream(
            "/v3/election/observe",
            &format!("{{\"name\":\"{}\"}}", b64(name.as_bytes())),
        )?;
        let first = h.message()?;
        let key = observed_key(&first).ok_or(format!("no leader in {first}"))?;
        Ok((h, key))
    }
}

/// Keeps `lease` alive every TTL/3 (what etcd's client session does) until
/// told to stop.
fn keep_alive(
    etcd: &Etcd,
    lease: String,
) -> Result<(mpsc::Sender<()>, std::thread::JoinHandle<()>), String> {
    let mut c = EtcdClient { http: etcd.http()? };
    let (stop, stopped) = mpsc::channel::<()>();
    let h = std::thread::spawn(move || loop {
        let _ = c.keepalive(&lease);
        if stopped
            .recv_timeout(Duration::from_millis(TTL_MS / 3))
            .is_ok()
        {
            return;
        }
    });
    Ok((stop, h))
}

/// A campaign sent before, awaited in [`until_each`]: done when it returns.
struct Campaign<'a>(&'a mut Http);

impl Awaited for Campaign<'_> {
    fn fd(&self) -> RawFd {
        self.0.r.get_ref().as_raw_fd()
    }
    fn buffered(&self) -> bool {
        !self.0.r.buffer().is_empty()
    }
    /// Readable: the answer (one small chunked body) is read whole.
    fn advance(&mut self) -> Result<bool, String> {
        self.0.response().map(|_| true)
    }
}

/// An observe stream awaited in [`until_each`]: done at the first message
/// naming a leader other than `old`.
struct NextLeader<'a> {
    h: &'a mut Http,
    old: &'a str,
}

impl Awaited for NextLeader<'_> {
    fn fd(&self) -> RawFd {
        self.h.r.get_ref().as_raw_fd()
    }
    fn buffered(&self) -> bool {
        !self.h.r.buffer().is_empty() || self.h.pending.contains(&b'\n')
    }
    fn advance(&mut self) -> Result<bool, String> {
        let msg = self.h.message()?;
        Ok(observed_key(&msg).as_deref() != Some(self.old))
    }
}

pub(super) fn etcd_side(etcd: &Etcd, r: &Rounds, variant: usize) -> Result<Measured, String> {
    let mut m = Measured::default();
    let mut a = EtcdClient { http: etcd.http()? };
    let mut b = EtcdClient { http: etcd.http()? };
    let mut admin = EtcdClient { http: etcd.http()? };
    let name = |what: &str, round: usize| format!("bench-election-{variant}-{what}-{round}");

    // 1. Resign → next leader: the next candidate waiting SETTLE in line,
    // then campaigning since just before. One thread sends the resign and
    // awaits B's campaign; A's own answer is read after.
    for (settle, what, no_idle, out) in [
        (SETTLE, "resign", false, &mut m.resign),
        (Duration::ZERO, "resign-now", false, &mut m.resign_now),
        (SETTLE, "resign-no-idle", true, &mut m.resign_no_idle),
    ] {
        let held = no_idle.then(NoIdle::hold);
        if held.as_ref().is_some_and(Option::is_none) {
            continue; // not to be had: the row stays empty
        }
        for round in 0..r.resign {
            let e = name(what, round);
            let (la, lb) = (a.grant()?, b.grant()?);
            let leader = a.campaign(&e, &la)?;
            b.send_campaign(&e, &lb)?;
            admin.until_candidates(&e, 2)?;
            std::thread::sleep(settle);
            let t0 = Instant::now();
            a.send_resign(&leader)?;
            let at = until_each(&mut [&mut Campaign(&mut b.http)], None)?;
            out.push(since(t0, &at)[0].ok_or("no campaign answer")?);
            a.http.response()?;
            a.revoke(&la);
            b.revoke(&lb);
        }
    }

    // 3. A change → every one of 16 observers told; again with the CPUs
    // kept from idling.
    for (no_idle, what, out) in [
        (false, "observe", &mut m.observers),
        (true, "observe-no-idle", &mut m.observers_no_idle),
    ] {
        let held = no_idle.then(NoIdle::hold);
        if held.as_ref().is_some_and(Option::is_none) {
            continue; // not to be had: the row stays empty
        }
        for round in 0..r.observe {
            let e = name(what, round);
            let (la, lb) = (a.grant()?, b.grant()?);
            let leader = a.campaign(&e, &la)?;
            let mut observers = Vec::new();
            for _ in 0..OBSERVERS {
                observers.push(EtcdClient::observer(etcd, &e)?);
            }
            b.send_campaign(&e, &lb)?;
            admin.until_candidates(&e, 2)?;
            std::thread::sleep(SETTLE);
            let t0 = Instant::now();
            a.send_resign(&leader)?;
            let mut campaign = Campaign(&mut b.http);
            let mut told: Vec<NextLeader> = observers
                .iter_mut()
                .map(|(h, old)| NextLeader { h, old })
                .collect();
            let mut waited: Vec<&mut dyn Awaited> = vec![&mut campaign];
            waited.extend(told.iter_mut().map(|t| t as &mut dyn Awaited));
            let at = until_each(&mut waited, None)?;
            for t in since(t0, &at[1..]) {
                out.push(t.ok_or("an observer's stream failed")?);
            }
            a.http.response()?;
            a.revoke(&la);
            b.revoke(&lb);
        }
    }

    // 4a. Vacancy: the leader resigns with nobody in line.
    for round in 0..r.etcd_vacancy {
        let e = name("vacancy", round);
        let la = a.grant()?;
        let leader = a.campaign(&e, &la)?;
        let (mut h, old) = EtcdClient::observer(etcd, &e)?;
        let t0 = Instant::now();
        a.send_resign(&leader)?;
        let mut next = NextLeader {
            h: &mut h,
            old: &old,
        };
        let at = until_each(&mut [&mut next], Some(t0 + r.vacancy_window))?;
        m.vacancy.push(since(t0, &at)[0]);
        a.http.response()?;
        a.revoke(&la);
    }

    // 2. Leader killed → next leader: the leader renews its lease once
    // more, then stops (no resign, no revoke); the next candidate keeps its
    // own lease alive while it waits, as a client session does. Again with
    // the CPUs kept from idling.
    for (no_idle, what, out) in [
        (false, "killed", &mut m.killed),
        (true, "killed-no-idle", &mut m.killed_no_idle),
    ] {
        let held = no_idle.then(NoIdle::hold);
        if held.as_ref().is_some_and(Option::is_none) {
            continue; // not to be had: the row stays empty
        }
        for round in 0..r.killed {
            let e = name(what, round);
            let (la, lb) = (a.grant()?, b.grant()?);
            a.campaign(&e, &la)?;
            let (stop, keeper) = keep_alive(etcd, lb.clone())?;
            b.send_campaign(&e, &lb)?;
            let elapsed = admin.until_candidates(&e, 2).and_then(|()| {
                let t0 = Instant::now();
                a.keepalive(&la)?;
                let at = until_each(&mut [&mut Campaign(&mut b.http)], None)?;
                since(t0, &at)[0].ok_or("no campaign answer".to_string())
            });
            let _ = stop.send(());
            let _ = keeper.join();
            out.push(elapsed?);
            b.revoke(&lb);
        }
    }

    // 4b. Vacancy: the lease runs out with nobody in line.
    for round in 0..r.etcd_lease_vacancy {
        let e = name("lease-vacancy", round);
        let la = a.grant()?;
        a.campaign(&e, &la)?;
        let (mut h, old) = EtcdClient::observer(etcd, &e)?;
        let t0 = Instant::now();
        a.keepalive(&la)?;
        let window = r.vacancy_window + Duration::from_millis(TTL_MS);
        let mut next = NextLeader {
            h: &mut h,
            old: &old,
        };
        let at = until_each(&mut [&mut next], Some(t0 + window))?;
        m.lease_vacancy.push(since(t0, &at)[0]);
    }
    Ok(m)
}

/// The p50 round trip of a call etcd answers without consensus
/// (maintenance status): what the gateway and HTTP add to every call.
pub(super) fn gateway_round_trip(etcd: &Etcd) -> Result<u64, String> {
    let mut h = etcd.http()?;
    let mut v = Vec::new();
    for _ in 0..200 {
        let t0 = Instant::now();
        h.post("/v3/maintenance/status", "{}")?;
        v.push(us(t0.elapsed()));
    }
    Ok(Summary::of(&mut v).p50)
}
