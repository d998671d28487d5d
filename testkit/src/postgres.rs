//! A real PostgreSQL server for the fenced-writes recipes: Debian's
//! `postgresql` package, a fresh cluster in a temporary directory, on a
//! free loopback port, trust authentication for user `postgres`. PostgreSQL
//! refuses to run as root, so as root it runs as the `postgres` user (the
//! package creates it) through `setpriv`, which execs (the child is the
//! server itself, stopped by its pid).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, skip, Skip};

pub struct Postgres {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// The newest `/usr/lib/postgresql/N/bin` that has `initdb`.
fn bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let version = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, bin)| bin)
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `program args...`, as the `postgres` user when this process is root.
fn as_server_user(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
        ])
        .arg(program);
        c
    } else {
        Command::new(program)
    }
}

impl Postgres {
    /// Starts a server, or records a skip (PostgreSQL is not installed:
    /// `make test` installs it) and returns None.
    pub fn start_or_skip() -> Option<Postgres> {
        let Some(bin) = bin_dir() else {
            skip(
                Skip::Missing,
                "PostgreSQL is not installed (apt-get install -y postgresql)",
            );
            return None;
        };
        if Command::new("psql").arg("--version").output().is_err() {
            skip(
                Skip::Missing,
                "psql is not installed (apt-get install -y postgresql)",
            );
            return None;
        }
        Some(Self::start(&bin))
    }

    fn start(bin: &Path) -> Postgres {
        let dir = std::env::temp_dir().join(format!(
            "redis-lock-pg-{}-{}",
            std::process::id(),
            free_port()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown of {}", dir.display());
        }
        let data = dir.join("data");
        let out = as_server_user(&bin.join("initdb"))
            .args(["-D"])
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        let child = as_server_user(&bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-c", "listen_addresses=127.0.0.1", "-p", &port.to_string()])
            .arg("-k")
            .arg(&dir)
            .args(["-c", "fsync=off"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let pg = Postgres {
            port,
            dir,
            child: Some(child),
        };
        let started = Instant::now();
        while pg.psql("SELECT 1").is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "PostgreSQL did not start: {}",
                std::fs::read_to_string(pg.dir.join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        pg
    }

    /// The psql command line (without the SQL) that reaches this server:
    /// for shell scripts of the recipes.
    pub fn psql_args(&self) -> Vec<String> {
        [
            "psql",
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-p",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([self.port.to_string()])
        .collect()
    }

    /// Runs `sql` through psql: its output (unaligned, tuples only), or
    /// its error text.
    pub fn psql(&self, sql: &str) -> Result<String, String> {
        let args = self.psql_args();
        let out = Command::new(&args[0])
            .args(&args[1..])
            .arg("-c")
            .arg(sql)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGINT: PostgreSQL's fast shutdown (its children go with it).
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(20) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
