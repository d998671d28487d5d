//! Replication between test servers: one made a replica of another, and
//! the wait until replicas acknowledge.

use std::time::Duration;

use crate::server::Server;
use crate::wait::wait_until;

impl Server {
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

    /// Makes this server a replica of `master` and waits for the initial sync.
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
