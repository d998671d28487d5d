//! One lock node: the module's commands over a lazily (re)connected
//! multiplexed connection, every call bounded by a timeout.

use redis_lock_core::protocol::{self, command, info_field};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use tokio::sync::Mutex;

use crate::clock::millis;
use crate::error::{Error, Result};
use crate::keys::Keys;
use crate::node_url::{check_url, tls_files, CLUSTER_SCHEME, SENTINEL_SCHEME};
use futures_util::future::join_all;

pub(crate) struct Node {
    /// The server to talk to (for a Sentinel node, the current master).
    client: std::sync::Mutex<redis::Client>,
    /// Set for a node found through Sentinel: asked again for the master
    /// after a connection fails or the server answers READONLY (a failover).
    sentinel: Option<Sentinel>,
    /// `host:port` (or the socket path): what Redlock's ordering node is
    /// chosen by, the same for every client given the same nodes.
    addr: String,
    /// The URL as given, without a password (for messages).
    pub(crate) shown: String,
    /// Shared by every lock of this client; replaced after an error, so a
    /// restarted node is reached again.
    conn: Mutex<Option<Conn>>,
    /// Connections for BLOCK (a blocked command would hold up everything
    /// multiplexed behind it), kept after a wait that ended normally.
    /// (Shared with the task that runs each wait: see `acquire_waiting_once`.)
    spare: Arc<std::sync::Mutex<Vec<Conn>>>,
    /// Set for a Redis Cluster: every command goes to its key's master
    /// (MOVED and ASK followed by the redis crate's cluster client).
    pub(crate) cluster: Option<redis::cluster::ClusterClient>,
    /// `Options::wait_replicas`: how many replicas must acknowledge each
    /// grant, and within how long (set by the client that owns the node).
    pub(crate) wait_replicas: Option<(u32, Duration)>,
}

/// A connection to one server, or to a cluster (routed by key).
#[derive(Clone)]
pub(crate) enum Conn {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Server(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Server(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// What `LOCK.INFO` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The holder's token; None if this connection's user may not write the key.
    pub token: Option<Vec<u8>>,
    /// The holder's fencing token.
    pub fence: i64,
    /// Milliseconds left of the lease.
    pub ttl_ms: i64,
    /// How many clients wait in the key's line.
    pub waiters: i64,
    /// When the holder was granted (Unix ms); None when the server does not
    /// know (a lock loaded from an earlier build's data, or an older module).
    pub granted_ms: Option<i64>,
}

/// Sentinels that know the master of `service`.
struct Sentinel {
    sentinels: Vec<redis::Client>,
    service: String,
    /// The database and credentials for the master, from the URL.
    db: i64,
    /// Whether the master must be asked for again before the next command.
    stale: std::sync::atomic::AtomicBool,
}

impl Node {
    pub fn new(url: &str) -> Result<Node> {
        check_url(url)?;
        if let Some(rest) = url.strip_prefix(SENTINEL_SCHEME) {
            return Node::sentinel(url, rest);
        }
        if let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) {
            return Node::cluster(url, rest);
        }
        match tls_files(url)? {
            (url, Some(certs)) => Ok(Node::from_client(redis::Client::build_with_tls(
                url.as_str(),
                certs,
            )?)),
            (_, None) => Ok(Node::from_client(redis::Client::open(url)?)),
        }
    }

    fn sentinel(url: &str, rest: &str) -> Result<Node> {
        let bad = |why: &str| {
            Error::Config(format!(
                "{url}: {why} (expected redis-sentinel://host:port[,host:port]/service[/db])"
            ))
        };
        let (hosts, path) = rest.split_once('/').ok_or_else(|| bad("no service name"))?;
        let mut parts = path.trim_end_matches('/').split('/');
        let service = parts
            .next()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("no service name"))?;
        let db: i64 = match parts.next() {
            Some(d) => d.parse().map_err(|_| bad("bad database number"))?,
            None => 0,
        };
        let sentinels = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| redis::Client::open(format!("redis://{h}/")))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if sentinels.is_empty() {
            return Err(bad("no sentinel address"));
        }
        // Until a sentinel is asked, the first one stands in (never used
        // for a command: `stale` forces the question first).
        let placeholder = sentinels[0].clone();
        Ok(Node {
            client: std::sync::Mutex::new(placeholder),
            addr: format!("sentinel:{hosts}/{service}"),
            shown: format!("{SENTINEL_SCHEME}{hosts}/{service}/{db}"),
            sentinel: Some(Sentinel {
                sentinels,
                service: service.to_string(),
                db,
                stale: std::sync::atomic::AtomicBool::new(true),
            }),
            conn: Mutex::new(None),
            spare: Arc::new(std::sync::Mutex::new(Vec::new())),
            cluster: None,
            wait_replicas: None,
        })
    }

    /// `redis-cluster://host:port[,host:port...]/`: a Redis Cluster, given
    /// by some of its nodes.
    fn cluster(url: &str, rest: &str) -> Result<Node> {
        let hosts = rest.trim_end_matches('/');
        let urls: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("redis://{h}/"))
            .collect();
        if urls.is_empty() {
            return Err(Error::Config(format!(
                "{url}: no node address (expected redis-cluster://host:port[,host:port]/)"
            )));
        }
        let cluster = redis::cluster::ClusterClient::builder(urls.clone())
            .connection_timeout(Duration::from_secs(1))
            .build()?;
        Ok(Node {
            client: std::sync::Mutex::new(redis::Client::open(urls[0].as_str())?),
            sentinel: None,
            addr: format!("cluster:{hosts}"),
            shown: format!("{CLUSTER_SCHEME}{hosts}/"),
            conn: Mutex::new(None),
            spare: Arc::new(std::sync::Mutex::new(Vec::new())),
            cluster: Some(cluster),
            wait_replicas: None,
        })
    }

    /// A new connection: to the server (for Sentinel, the current master),
    /// or to the cluster.
    pub(crate) async fn open(&self, limit: Duration) -> Result<Conn> {
        within(limit, async {
            if let Some(cluster) = &self.cluster {
                return Ok(Conn::Cluster(cluster.get_async_connection().await?));
            }
            let client = self.target(limit).await?;
            Ok(Conn::Server(
                client.get_multiplexed_async_connection().await?,
            ))
        })
        .await
    }

    /// The client for the server to talk to; for Sentinel, asks the
    /// sentinels for the master first when the last answer may be stale.
    async fn target(&self, limit: Duration) -> Result<redis::Client> {
        if let Some(sentinel) = &self.sentinel {
            if sentinel.stale.load(std::sync::atomic::Ordering::Acquire) {
                let master = self.ask_sentinels(sentinel, limit).await?;
                *self.client.lock().unwrap_or_else(|p| p.into_inner()) = master;
                sentinel
                    .stale
                    .store(false, std::sync::atomic::Ordering::Release);
            }
        }
        Ok(self
            .client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone())
    }

    /// `SENTINEL get-master-addr-by-name`, from the first sentinel that
    /// answers.
    async fn ask_sentinels(&self, sentinel: &Sentinel, limit: Duration) -> Result<redis::Client> {
        let mut last = Error::Timeout;
        for s in &sentinel.sentinels {
            let answer = within(limit, async {
                let mut conn = s.get_multiplexed_async_connection().await?;
                let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&sentinel.service)
                    .query_async(&mut conn)
                    .await?;
                Ok(addr)
            })
            .await;
            match answer {
                Ok(Some((host, port))) => {
                    return Ok(redis::Client::open(format!(
                        "redis://{host}:{port}/{}",
                        sentinel.db
                    ))?)
                }
                Ok(None) => {
                    last = Error::Config(format!(
                        "sentinels know no master named {}",
                        sentinel.service
                    ))
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A node reached through the application's own client (its TLS,
    /// credentials and database carry over).
    pub fn from_client(client: redis::Client) -> Node {
        let info = client.get_connection_info();
        let scheme = match info.addr {
            redis::ConnectionAddr::TcpTls { .. } => "rediss",
            _ => "redis",
        };
        let shown = format!("{scheme}://{}/{}", info.addr, info.redis.db);
        Node {
            shown,
            addr: info.addr.to_string(),
            client: std::sync::Mutex::new(client),
            sentinel: None,
            conn: Mutex::new(None),
            spare: Arc::new(std::sync::Mutex::new(Vec::new())),
            cluster: None,
            wait_replicas: None,
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// A connection this call opened that broke at its first command, on a
    /// `rediss://` node: the server ended the TLS setup
    /// ([`Error::TlsRefused`]), which the connection reports only as a
    /// driver that "unexpectedly terminated".
    fn as_tls_refusal(&self, e: Error) -> Error {
        let broke = matches!(&e, Error::Redis(r) if r.is_io_error() || r.is_connection_dropped());
        if broke && self.shown.starts_with("rediss://") {
            let detail = e.to_string();
            return Error::TlsRefused {
                node: self.shown.clone(),
                detail,
            };
        }
        e
    }

    /// An error as this node's: "unknown command" is
    /// [`Error::ModuleMissing`], naming it.
    pub(crate) fn named(&self, e: Error) -> Error {
        match e {
            e @ Error::Redis(_) if e.is_module_missing() => Error::ModuleMissing {
                node: self.shown.clone(),
            },
            e => e,
        }
    }

    /// The node as `redis://host:port/db`, without credentials.
    pub fn url(&self) -> &str {
        &self.shown
    }

    pub(crate) async fn connection(&self, limit: Duration) -> Result<Conn> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            return Ok(c.clone());
        }
        let fresh = self.open(limit).await?;
        *conn = Some(fresh.clone());
        Ok(fresh)
    }

    /// For Sentinel, the master's address is asked for again at the next
    /// connection: a connection of its own (an observer's) found the one
    /// it had gone.
    pub(crate) fn ask_sentinels_again(&self) {
        if let Some(sentinel) = &self.sentinel {
            sentinel
                .stale
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Drops the shared connection (and, for Sentinel, the master's
    /// address), so the next call connects afresh.
    async fn forget_connection(&self) {
        *self.conn.lock().await = None;
        if let Some(sentinel) = &self.sentinel {
            sentinel
                .stale
                .store(true, std::sync::atomic::Ordering::Release);
            self.spare.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    /// Runs `cmd` on the shared connection within `limit`; an I/O error or a
    /// timeout drops the connection so the next call reconnects. A cached
    /// connection found broken (the node restarted since) is replaced and
    /// the command sent once more: every lock command is safe to repeat
    /// (a same-token ACQUIRE renews, EXTEND sets the same lease).
    pub(crate) async fn run<T: redis::FromRedisValue>(
        &self,
        cmd: redis::Cmd,
        limit: Duration,
    ) -> Result<T> {
        let start = tokio::time::Instant::now();
        let was_cached = self.conn.lock().await.is_some();
        let result = self.run_once(&cmd, limit).await;
        let dropped =
            matches!(&result, Err(Error::Redis(e)) if e.is_connection_dropped() || e.is_io_error());
        // After a failover the old master answers READONLY: ask Sentinel
        // again and retry on the new master.
        let demoted = self.sentinel.is_some()
            && matches!(&result, Err(Error::Redis(e)) if e.kind() == redis::ErrorKind::ReadOnly);
        if demoted {
            self.forget_connection().await;
        }
        if (was_cached && dropped) || demoted {
            let left = limit.saturating_sub(start.elapsed());
            if !left.is_zero() {
                return self.run_once(&cmd, left).await;
            }
        }
        result
    }

    /// Sends `cmd` once within `limit`, never again after a broken
    /// connection (a guarded write must not run twice).
    pub async fn send_once<T: redis::FromRedisValue>(
        &self,
        cmd: redis::Cmd,
        limit: Duration,
    ) -> Result<T> {
        self.run_once(&cmd, limit).await
    }

    async fn run_once<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        limit: Duration,
    ) -> Result<T> {
        let fresh = self.conn.lock().await.is_none();
        let mut conn = match self.connection(limit).await {
            Ok(conn) => conn,
            Err(e) => return Err(self.as_tls_refusal(e)),
        };
        let result = within(limit, async { Ok(cmd.query_async::<T>(&mut conn).await?) })
            .await
            .map_err(|e| self.named(e))
            .map_err(|e| match fresh {
                true => self.as_tls_refusal(e),
                false => e,
            });
        let broken = match &result {
            Err(Error::Timeout) => true,
            Err(Error::Redis(e)) => {
                e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error()
            }
            _ => false,
        };
        if broken {
            self.forget_connection().await;
        }
        result
    }

    /// `LOCK.ACQUIRE key token ttl [MINFENCE n]` (`LOCK.ACQUIREALL` for
    /// several keys): the fence, or None if held by another token. With
    /// replica acknowledgement the ACQUIRE and its `WAIT` go on a
    /// connection of their own (WAIT blocks its connection).
    pub async fn acquire(
        &self,
        keys: &Keys,
        token: &str,
        ttl: Duration,
        min_fence: Option<i64>,
        limit: Duration,
    ) -> Result<Option<i64>> {
        let cmd = keys.acquire_cmd(token, ttl, None, min_fence);
        if self.wait_replicas.is_none() {
            return self.run(cmd, limit).await;
        }
        self.acquire_on_own(keys, token, |_| cmd.clone(), Duration::ZERO, limit)
            .await
    }

    /// `LOCK.ACQUIRE ... BLOCK wait`: waits in the server, on a connection
    /// of its own (a blocked connection would hold up every other command
    /// multiplexed on it), reused for the next wait if this one ended with
    /// a reply.
    pub async fn acquire_waiting(
        &self,
        keys: &Keys,
        token: &str,
        ttl: Duration,
        wait: Duration,
        limit: Duration,
    ) -> Result<Option<i64>> {
        let blocking = |wait: Duration| {
            // BLOCK 0 would wait forever: wait at least a millisecond.
            let block_ms = millis(wait).clamp(1, MAX_BLOCK_MS);
            keys.acquire_cmd(token, ttl, Some(block_ms as i64), None)
        };
        self.acquire_on_own(keys, token, blocking, wait, limit)
            .await
            .map_err(|e| self.named(e))
    }

    /// An ACQUIRE (`cmd(wait)`, made again for a retry with the wait left)
    /// on a connection of its own, see [`acquire_on_own_once`](Self::acquire_on_own_once).
    async fn acquire_on_own(
        &self,
        keys: &Keys,
        token: &str,
        cmd: impl Fn(Duration) -> redis::Cmd,
        wait: Duration,
        limit: Duration,
    ) -> Result<Option<i64>> {
        let start = tokio::time::Instant::now();
        let (reply, was_spare) = self
            .acquire_on_own_once(keys, token, cmd(wait), wait, limit)
            .await;
        let dropped =
            matches!(&reply, Err(Error::Redis(e)) if e.is_io_error() || e.is_connection_dropped());
        // Sentinel: as for every other command (see `run`), a demoted
        // master (READONLY) or one not answering is asked for again.
        let demoted = self.sentinel.is_some()
            && matches!(&reply, Err(Error::Redis(e)) if e.kind() == redis::ErrorKind::ReadOnly);
        if self.sentinel.is_some() && (demoted || dropped || matches!(&reply, Err(Error::Timeout)))
        {
            self.forget_connection().await;
        }
        // A kept connection found closed (the server restarted, or dropped
        // its clients at a failover), or a demoted master: the wait goes on
        // over a fresh connection (a same-token ACQUIRE is safe to repeat).
        if demoted || (was_spare && dropped) {
            // The other kept connections are as stale as this one.
            self.spare.lock().unwrap_or_else(|p| p.into_inner()).clear();
            let left = wait.saturating_sub(start.elapsed());
            return self
                .acquire_on_own_once(keys, token, cmd(left), left, limit)
                .await
                .0;
        }
        reply
    }

    /// One ACQUIRE (a BLOCK wait, or one with replica acknowledgement) on a
    /// connection of its own, run by a task that owns the connection. When
    /// the caller's future is dropped (a `timeout`, a `select!`) the task
    /// drops the connection, which closes it: the server drops the waiter
    /// from its line, or takes back a grant it had not delivered. When the
    /// caller gives up on it (its patience ran out) the task waits for the
    /// reply, and releases a grant the caller is no longer there to take,
    /// over the same connection.
    async fn acquire_on_own_once(
        &self,
        keys: &Keys,
        token: &str,
        cmd: redis::Cmd,
        wait: Duration,
        limit: Duration,
    ) -> (Result<Option<i64>>, bool) {
        let spare = self.spare.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let was_spare = spare.is_some();
        let conn = match spare {
            Some(c) => c,
            None => match self.open(limit).await {
                Ok(c) => c,
                Err(e) => return (Err(e), false),
            },
        };
        let release = keys.release_cmd(token);
        let acked = self.wait_replicas.map_or(Duration::ZERO, |(_, t)| t);
        // Outside an acquisition (none yet) a late grant is released.
        let settle = crate::settle::SETTLE.try_with(Arc::clone).ok();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(acquire_in_task(
            conn,
            Acquisition {
                cmd,
                wait_replicas: self.wait_replicas,
                release,
            },
            wait.saturating_add(limit).saturating_add(acked),
            limit,
            Arc::clone(&self.spare),
            settle,
            tx,
        ));
        // The task ends only by sending (or by a panic in the redis crate).
        let reply = rx.await.unwrap_or(Err(Error::Timeout));
        (reply, was_spare)
    }

    /// PING within `limit`: is the node answering?
    /// An ACL refusal (NOPERM) is an answer too: the node is up, and a
    /// user with only the lock commands keeps its place in the line.
    pub async fn ping(&self, limit: Duration) -> Result<()> {
        match self.run::<String>(redis::cmd("PING"), limit).await {
            Err(e) if !e.is_acl_refusal() => Err(e),
            _ => Ok(()),
        }
    }

    /// The node's wall clock (`TIME`), in µs since the Unix epoch.
    pub async fn time_us(&self, limit: Duration) -> Result<i64> {
        let (secs, micros): (i64, i64) = self.run(redis::cmd("TIME"), limit).await?;
        Ok(secs * 1_000_000 + micros)
    }

    /// `LOCK.RELEASE` (`LOCK.RELEASEALL` for several keys): whether the
    /// token held anything here.
    pub async fn release(&self, keys: &Keys, token: &str, limit: Duration) -> Result<bool> {
        let cmd = keys.release_cmd(token);
        Ok(Keys::released(self.run::<i64>(cmd, limit).await?))
    }

    /// `LOCK.RELEASE` over a fresh blocking connection, for a release that
    /// must finish without an async runtime (a guard dropped as its runtime
    /// shuts down, when the shared connection's task no longer runs).
    pub fn release_blocking(&self, keys: &Keys, token: &str, limit: Duration) -> Result<bool> {
        if self
            .sentinel
            .as_ref()
            .is_some_and(|s| s.stale.load(std::sync::atomic::Ordering::Acquire))
        {
            return Err(Error::Config("no known master to release on".into()));
        }
        if let Some(cluster) = &self.cluster {
            let mut conn = cluster.get_connection()?;
            let released: i64 = keys.release_cmd(token).query(&mut conn)?;
            return Ok(Keys::released(released));
        }
        let client = self
            .client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut conn = client.get_connection_with_timeout(limit)?;
        conn.set_read_timeout(Some(limit))?;
        conn.set_write_timeout(Some(limit))?;
        let released: i64 = keys.release_cmd(token).query(&mut conn)?;
        Ok(Keys::released(released))
    }

    /// `LOCK.EXTEND` of every key (pipelined on the node's connection),
    /// with `value` a proclaim: true when the token still held each one.
    pub async fn extend(
        &self,
        keys: &Keys,
        (token, value): (&str, Option<&str>),
        ttl: Duration,
        limit: Duration,
    ) -> Result<bool> {
        let extends = keys.extend_cmds(token, ttl, value);
        let replies = join_all(extends.into_iter().map(|cmd| self.run::<i64>(cmd, limit))).await;
        let mut held = true;
        for reply in replies {
            held &= reply? == 1;
        }
        Ok(held)
    }

    pub async fn info(&self, key: &str, limit: Duration) -> Result<Option<LockInfo>> {
        let mut cmd = redis::cmd(command::INFO);
        cmd.arg(key);
        // An array of name, value pairs on RESP2; a map on RESP3.
        let pairs: Vec<(redis::Value, redis::Value)> = match self.run(cmd, limit).await? {
            redis::Value::Nil => return Ok(None),
            redis::Value::Map(pairs) => pairs,
            redis::Value::Array(items) => items
                .chunks_exact(2)
                .map(|pair| (pair[0].clone(), pair[1].clone()))
                .collect(),
            other => {
                return Err(Error::Redis(redis::RedisError::from((
                    redis::ErrorKind::TypeError,
                    "LOCK.INFO did not answer a map",
                    format!("{other:?}"),
                ))))
            }
        };
        let mut info = LockInfo {
            token: None,
            fence: 0,
            ttl_ms: 0,
            waiters: 0,
            granted_ms: None,
        };
        for (name, value) in &pairs {
            let name: String = redis::from_redis_value(name)?;
            match name.as_str() {
                info_field::TOKEN => info.token = redis::from_redis_value(value)?,
                info_field::FENCE => info.fence = redis::from_redis_value(value)?,
                info_field::TTL => info.ttl_ms = redis::from_redis_value(value)?,
                info_field::WAITERS => info.waiters = redis::from_redis_value(value)?,
                info_field::GRANTED => info.granted_ms = redis::from_redis_value(value)?,
                _ => {}
            }
        }
        Ok(Some(info))
    }
}

/// The longest BLOCK the module takes (about ten years): a longer wait is
/// asked as this one.
const MAX_BLOCK_MS: u64 = protocol::MAX_BLOCK_MS as u64;

/// How long an acquisition's task keeps listening for the server's answer
/// after its caller stopped waiting for it (see [`acquire_in_task`]).
const LATE_REPLY_LIMIT: Duration = Duration::from_secs(60);

/// What [`acquire_in_task`] sends: the ACQUIRE, whether to `WAIT` for
/// replicas after it, and the RELEASE that undoes it.
struct Acquisition {
    cmd: redis::Cmd,
    wait_replicas: Option<(u32, Duration)>,
    release: redis::Cmd,
}

/// Runs one ACQUIRE on `conn` (followed by `WAIT` in the same round trip
/// when replicas must acknowledge it: the server runs the WAIT only once a
/// BLOCK before it has been answered) and sends the outcome to the caller
/// (an error after `patience`). A grant too few replicas acknowledged, or
/// one that arrives when nobody is there to take it (the caller's future
/// was dropped, or `patience` passed first) once its acquisition is over
/// (`Settle`), is released over the same connection, so the release cannot
/// come before the grant. A connection
/// that answered goes back to `spares`.
async fn acquire_in_task(
    mut conn: Conn,
    acquisition: Acquisition,
    patience: Duration,
    limit: Duration,
    spares: Arc<std::sync::Mutex<Vec<Conn>>>,
    settle: Option<Arc<crate::settle::Settle>>,
    tx: tokio::sync::oneshot::Sender<Result<Option<i64>>>,
) {
    let Acquisition {
        cmd,
        wait_replicas,
        release,
    } = acquisition;
    let mut tx = Some(tx);
    let mut sending = conn.clone();
    let query = async {
        match wait_replicas {
            None => cmd
                .query_async::<Option<i64>>(&mut sending)
                .await
                .map(|fence| (fence, None)),
            Some((count, timeout)) => {
                let mut pipe = redis::pipe();
                pipe.add_command(cmd.clone())
                    .cmd("WAIT")
                    .arg(count)
                    .arg(millis(timeout));
                pipe.query_async::<(Option<i64>, i64)>(&mut sending)
                    .await
                    .map(|(fence, acked)| (fence, Some(acked)))
            }
        }
    };
    tokio::pin!(query);
    let answered = tokio::select! {
        reply = &mut query => Some(Some(reply)),
        _ = tokio::time::sleep(patience) => Some(None),
        // The acquisition was dropped (a `select!`, a `timeout`): nobody
        // waits for this any more.
        _ = tx.as_mut().expect("not sent yet").closed() => None,
    };
    let reply = match answered {
        // Leave the line now: dropping every handle of the connection (the
        // request, its clone, the connection) stops its driver and closes
        // the socket, and the server drops this waiter, or takes back a
        // grant it had not delivered yet. A grant it had delivered is the
        // dropped acquisition's to release (`Unclaimed`), which it does at
        // once and again a little later. (A cluster connection may keep its
        // place until its turn or its timeout.)
        None => return,
        Some(Some(reply)) => reply,
        Some(None) => {
            if let Some(tx) = tx.take() {
                let _ = tx.send(Err(Error::Timeout));
            }
            match tokio::time::timeout(LATE_REPLY_LIMIT, &mut query).await {
                Ok(reply) => reply,
                Err(_) => return,
            }
        }
    };
    // Only a connection that answered is idle for sure.
    let idle = match &reply {
        Ok(_) => true,
        Err(e) => !(e.is_io_error() || e.is_connection_dropped()),
    };
    let outcome = match reply {
        Ok((Some(_), Some(acked))) if acked < i64::from(wait_replicas.map_or(0, |(n, _)| n)) => {
            Err(Error::NotReplicated {
                acknowledged: acked,
                wanted: wait_replicas.map_or(0, |(n, _)| n),
            })
        }
        Ok((fence, _)) => Ok(fence),
        Err(e) => Err(Error::from(e)),
    };
    let must_release = matches!(outcome, Err(Error::NotReplicated { .. }));
    let undelivered = match tx {
        Some(tx) => tx.send(outcome).err(),
        None => Some(outcome),
    };
    // A grant its caller never heard of: released if the acquisition is
    // over, else left to it (see `Settle`).
    let late = undelivered.is_some_and(|r| matches!(r, Ok(Some(_))))
        && settle.is_none_or(|s| s.release_late_grant());
    if must_release || late {
        let released = within(limit, async {
            Ok(release.query_async::<i64>(&mut conn).await?)
        })
        .await;
        tracing::debug!(
            released = matches!(released, Ok(1)),
            too_few_replicas = must_release,
            "released a grant its caller could not keep"
        );
        if released.is_err() {
            return;
        }
    }
    if idle {
        keep_spare(conn, &spares);
    }
}

/// Keeps a connection that answered for the next wait (two at most).
fn keep_spare(conn: Conn, spares: &std::sync::Mutex<Vec<Conn>>) {
    let mut spare = spares.lock().unwrap_or_else(|p| p.into_inner());
    if spare.len() < 2 {
        spare.push(conn);
    }
}

pub(crate) async fn within<T>(
    limit: Duration,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or(Err(Error::Timeout))
}
