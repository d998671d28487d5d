//! A test server ([`Server`]): started (a local process, a container, or
//! the external server) and waited for, connected to, restarted, killed,
//! signalled, and stopped on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::Connection;

use crate::binaries::{module_path, server_binary};
use crate::builder::{set_arg, Builder};
use crate::dirs::fresh_dir;
use crate::docker::{docker, Container, MODULE_IN_IMAGE};
use crate::external::{reset_external, EXTERNAL, USING_EXTERNAL};
use crate::mode::{mode, Mode};
use crate::ports::free_port;

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

// The builder's last step, here with the server it makes (whose fields
// only this file sees).
impl Builder {
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
                // A port was taken between choosing and binding: pick others,
                // the cluster bus's too (it is a port of its own, fixed in
                // the arguments, and the one a retry kept failing on).
                self.port = free_port();
                if self.args.iter().any(|a| a == "--cluster-port") {
                    set_arg(&mut self.args, "cluster-port", &free_port().to_string());
                }
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

/// The `redis://` URLs of `nodes` (a Redlock group).
pub fn urls(nodes: &[Server]) -> Vec<String> {
    nodes.iter().map(Server::url).collect()
}
