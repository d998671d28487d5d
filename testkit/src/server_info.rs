//! What a running server tells about itself: its version, how often it ran
//! a command, `INFO lock`,
//! its newest AOF file, and whether it is still persisting.

use std::path::PathBuf;
use std::time::Duration;

use crate::server::Server;
use crate::wait::wait_until;

impl Server {
    /// How many times `command` (lower case, `lock.acquire`) ran here,
    /// from INFO commandstats (0: never).
    pub fn command_calls(&self, command: &str) -> i64 {
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .unwrap();
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
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
}
