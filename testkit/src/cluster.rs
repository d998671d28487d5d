//! A Redis Cluster on loopback for tests: three masters (and, if asked, a
//! replica of each), the module on every node.

use std::time::Duration;

use crate::{free_port, wait_until, Server};

/// The slots of masters 0, 1 and 2.
pub const MASTER_RANGES: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

pub struct Cluster {
    /// Masters 0..3, then (if any) replica i+3 of master i.
    pub nodes: Vec<Server>,
    pub ids: Vec<String>,
}

impl Cluster {
    pub fn start(with_replicas: bool) -> Cluster {
        let count = if with_replicas { 6 } else { 3 };
        let nodes: Vec<Server> = (0..count)
            .map(|_| {
                Server::builder()
                    .config("cluster-enabled", "yes")
                    .config("cluster-port", &free_port().to_string())
                    .config("cluster-config-file", "nodes.conf")
                    .config("cluster-node-timeout", "2000")
                    .start()
            })
            .collect();
        let ids: Vec<String> = nodes
            .iter()
            .map(|n| {
                redis::cmd("CLUSTER")
                    .arg("MYID")
                    .query(&mut n.conn())
                    .unwrap()
            })
            .collect();
        for (node, (lo, hi)) in nodes.iter().zip(MASTER_RANGES) {
            let _: () = redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(lo)
                .arg(hi)
                .query(&mut node.conn())
                .unwrap();
        }
        let bus_port = |n: &Server| -> u16 {
            let v: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg("cluster-port")
                .query(&mut n.conn())
                .unwrap();
            v[1].parse().unwrap()
        };
        let first_bus = bus_port(&nodes[0]);
        for node in &nodes[1..] {
            let _: () = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(nodes[0].port)
                .arg(first_bus)
                .query(&mut node.conn())
                .unwrap();
        }
        let cluster = Cluster { nodes, ids };
        wait_until(Duration::from_secs(30), || {
            cluster.nodes.iter().all(|n| {
                let text: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query(&mut n.conn())
                    .unwrap();
                text.lines().count() == count && !text.contains("handshake")
            })
        });
        for i in 3..count {
            let id = cluster.ids[i - 3].clone();
            wait_until(Duration::from_secs(30), || {
                redis::cmd("CLUSTER")
                    .arg("REPLICATE")
                    .arg(&id)
                    .query::<()>(&mut cluster.nodes[i].conn())
                    .is_ok()
            });
        }
        cluster.wait_healthy();
        cluster
    }

    /// Acquires `key` for `token` on the master that serves its slot (the
    /// others answer MOVED), and returns that master.
    pub fn acquire_on_owner(&self, key: &str, token: &str, ttl_ms: i64) -> &Server {
        self.nodes
            .iter()
            .find(|n| {
                redis::cmd("LOCK.ACQUIRE")
                    .arg(key)
                    .arg(token)
                    .arg(ttl_ms)
                    .query::<Option<i64>>(&mut n.conn())
                    .is_ok()
            })
            .unwrap_or_else(|| panic!("no master takes {key}"))
    }

    pub fn wait_healthy(&self) {
        wait_until(Duration::from_secs(30), || {
            self.nodes.iter().all(|n| {
                let mut c = n.conn();
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).unwrap();
                let repl: String = redis::cmd("INFO").arg("replication").query(&mut c).unwrap();
                info.contains("cluster_state:ok")
                    && (repl.contains("role:master") || repl.contains("master_link_status:up"))
            })
        });
    }

    /// A cluster-aware client of the masters.
    pub fn client(&self) -> redis::cluster::ClusterConnection {
        let urls: Vec<String> = self.nodes[..3]
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port))
            .collect();
        redis::cluster::ClusterClient::new(urls)
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// `CLUSTER SETSLOT slot NODE id` on every master: the end of a move.
    pub fn assign(&self, slot: u16, to: usize) {
        for node in &self.nodes[..3] {
            let reply: redis::RedisResult<()> = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&self.ids[to])
                .query(&mut node.conn());
            reply.unwrap_or_else(|e| panic!("SETSLOT {slot} NODE on :{}: {e}", node.port));
        }
    }

    /// The first steps of moving `slot` from master `from` to `to`.
    pub fn start_moving(&self, slot: u16, from: usize, to: usize) {
        let set = |node: usize, state: &str, id: &str| {
            let _: () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(id)
                .query(&mut self.nodes[node].conn())
                .unwrap();
        };
        set(to, "IMPORTING", &self.ids[from]);
        set(from, "MIGRATING", &self.ids[to]);
    }
}
