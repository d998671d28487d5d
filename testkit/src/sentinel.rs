//! A Sentinel process watching a test server (service `m`), for the
//! client's failover tests.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{wait_until, Server};

/// A sentinel process on loopback, monitoring `master` as service `m`.
pub struct Sentinel {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: std::path::PathBuf,
}

impl Sentinel {
    /// Starts a sentinel watching `master` (quorum 1, down after 2 s), and
    /// waits until it reports the master.
    pub fn start(master: &Server) -> Sentinel {
        let port = crate::free_port();
        let dir =
            std::env::temp_dir().join(format!("redis-lock-sentinel-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor m 127.0.0.1 {} 1\nsentinel down-after-milliseconds m 2000\nsentinel failover-timeout m 10000\n",
                dir.display(),
                master.port
            ),
        )
        .unwrap();
        let child = Command::new(crate::server_binary())
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a sentinel");
        let sentinel = Sentinel { child, port, dir };
        wait_until(Duration::from_secs(20), || sentinel.master_port().is_some());
        sentinel
    }

    /// A connection to the sentinel (None while it does not answer).
    pub fn conn(&self) -> Option<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
            .ok()?
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()
    }

    /// The port of the master it reports for `m`.
    pub fn master_port(&self) -> Option<u16> {
        let mut c = self.conn()?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("m")
            .query(&mut c)
            .ok()?;
        addr.map(|(_, p)| p)
    }
}

impl Sentinel {
    /// Waits until the sentinel knows a replica of `m` (it cannot fail
    /// over before).
    pub fn wait_knows_a_replica(&self) {
        wait_until(Duration::from_secs(30), || {
            self.conn().is_some_and(|mut c| {
                let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                    .arg("replicas")
                    .arg("m")
                    .query(&mut c)
                    .unwrap_or_default();
                !replicas.is_empty()
            })
        });
    }

    /// A manual failover to `replica`, once the sentinel reports it master
    /// (NOGOODSLAVE until the sentinel has heard from the replica itself).
    pub fn fail_over_to(&self, replica: &Server) {
        let mut c = self.conn().unwrap();
        wait_until(Duration::from_secs(30), || {
            redis::cmd("SENTINEL")
                .arg("failover")
                .arg("m")
                .query::<()>(&mut c)
                .is_ok()
        });
        wait_until(Duration::from_secs(30), || {
            self.master_port() == Some(replica.port)
        });
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
