use std::fmt;

use redis_lock_core::protocol::code;

/// What can go wrong talking to the lock nodes. More variants may come:
/// match with a wildcard arm.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A node answered with an error, or the connection failed.
    Redis(redis::RedisError),
    /// A node did not answer within the node timeout.
    Timeout,
    /// `with_lock`: the lock was lost while the closure ran (a renewal was
    /// refused, or none succeeded within the validity), so its work may
    /// have overlapped another holder's. The closure's output is dropped.
    Lost,
    /// A bad argument or configuration (no URLs, a TTL of zero, ...).
    Config(String),
    /// [`Options::wait_replicas`](crate::Options::wait_replicas): a node
    /// granted the lock but fewer of its replicas than asked acknowledged
    /// the grant in time, so it was released there (a failover could have
    /// lost it). Not acquired.
    NotReplicated {
        /// How many replicas acknowledged the grant.
        acknowledged: i64,
        /// How many were asked for.
        wanted: u32,
    },
    /// A guarded command (`LOCK.EXEC`, [`LockGuard::exec`](crate::LockGuard::exec))
    /// found that this grant no longer holds the lock (the lease ended, it
    /// was released, or another holder has it): nothing ran. The server's
    /// reason is given.
    NotHeld(String),
    /// A gate write (`LOCK.FENCED`, [`Lease::fenced`](crate::Lease::fenced))
    /// carried a fence below the gate's mark: a later holder has written,
    /// so this holder is stale. Nothing ran.
    StaleFence {
        /// This holder's fence.
        fence: i64,
        /// The highest fence the gate has accepted.
        mark: i64,
    },
    /// A node answered but does not know the `LOCK.*` commands: the
    /// redis-lock module is not loaded there. Never counted as a node
    /// that is down: a Redlock group with such a node refuses every
    /// acquisition (releasing what the others granted) instead of running
    /// on the rest, which would survive no further failure.
    ModuleMissing {
        /// The node, without credentials.
        node: String,
    },
    /// A `rediss://` node ended a connection as it was set up: the TLS
    /// handshake failed on the server's side, most often because it asks
    /// clients for a certificate (`tls-auth-clients yes`) and none, or one
    /// its CA did not sign, was given. Retried like any connection
    /// failure (a server restarting fails the same way).
    TlsRefused {
        /// The node, without credentials.
        node: String,
        /// What the connection reported.
        detail: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Redis(e) => write!(f, "{e}"),
            Error::Timeout => write!(f, "the lock node did not answer in time"),
            Error::Lost => write!(
                f,
                "the lock was lost while the work ran (it may have overlapped another holder)"
            ),
            Error::Config(why) => write!(f, "{why}"),
            Error::NotReplicated {
                acknowledged,
                wanted,
            } => write!(
                f,
                "the grant reached {acknowledged} of the {wanted} replicas asked for in time, so it was released (a failover could have lost it)"
            ),
            Error::NotHeld(why) => write!(f, "the lock is not held: {why}"),
            Error::StaleFence { fence, mark } => write!(
                f,
                "stale fence {fence}: the gate has accepted {mark}, so a later holder has written; nothing ran"
            ),
            Error::TlsRefused { node, detail } => write!(
                f,
                "{node} ended the TLS connection as it was set up ({detail}): if the server asks for a client certificate (tls-auth-clients yes), give one its CA signed, as tls_cert and tls_key in the URL's query; check tls_ca too (the CA that signed the server's certificate)"
            ),
            Error::ModuleMissing { node } => write!(
                f,
                "{node} does not know the LOCK commands: load the redis-lock module there (--loadmodule /path/to/libredis_lock.so, or MODULE LOAD), or leave that node out"
            ),
        }
    }
}

impl Error {
    /// Whether a node asks to be tried again later rather than refusing or
    /// failing: it is in its restart delay (`TRYAGAIN`), or the lock's
    /// line of waiters is full (`lock.max-waiters-per-key`).
    pub fn is_busy(&self) -> bool {
        match self {
            Error::Redis(r) => {
                matches!(r.code(), Some(code::TRY_AGAIN | code::LINE_FULL))
                    // Modules before LINEFULL said it with ERR.
                    || (r.kind() == redis::ErrorKind::ResponseError
                        && r.to_string().contains("too many waiters"))
            }
            _ => false,
        }
    }

    /// Whether a later attempt may succeed where this one failed: the node
    /// did not answer or its connection broke (a restart, a failover), it
    /// is loading its data, it was demoted (READONLY, or UNBLOCKED for a
    /// client blocked on it then), or it asks to be tried again
    /// ([`is_busy`](Self::is_busy)). A wait goes on through these.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Error::Timeout | Error::TlsRefused { .. } => true,
            Error::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_timeout()
                    || matches!(
                        e.kind(),
                        redis::ErrorKind::ReadOnly
                            | redis::ErrorKind::BusyLoadingError
                            | redis::ErrorKind::MasterDown
                            | redis::ErrorKind::ClusterDown
                            | redis::ErrorKind::TryAgain
                    )
                    || e.code() == Some(code::UNBLOCKED)
                    || self.is_busy()
            }
            _ => false,
        }
    }

    /// Whether a node's ACL refused this user the command (`NOPERM`).
    pub fn is_acl_refusal(&self) -> bool {
        matches!(self, Error::Redis(r) if r.code() == Some(code::NO_PERMISSION))
    }

    /// Whether a node refused this client's credentials (a wrong password
    /// or user, or none given where one is required).
    pub fn is_auth_failure(&self) -> bool {
        matches!(self, Error::Redis(r)
            if r.kind() == redis::ErrorKind::AuthenticationFailed
                || matches!(r.code(), Some("NOAUTH" | "WRONGPASS")))
    }

    /// Whether a node does not know the `LOCK.*` commands (the module is
    /// not loaded there).
    pub fn is_module_missing(&self) -> bool {
        match self {
            Error::ModuleMissing { .. } => true,
            Error::Redis(r) => {
                r.kind() == redis::ErrorKind::ResponseError
                    && r.to_string().contains("unknown command")
            }
            _ => false,
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    /// A guarded command's refusals (`NOTHELD`, `STALEFENCE`) are their
    /// own variants; everything else is [`Error::Redis`].
    fn from(e: redis::RedisError) -> Self {
        match e.code() {
            Some(code::NOT_HELD) => Error::NotHeld(e.detail().unwrap_or_default().to_string()),
            Some(code::STALE_FENCE) => {
                match e
                    .detail()
                    .and_then(redis_lock_core::error::parse_stale_fence)
                {
                    Some((fence, mark)) => Error::StaleFence { fence, mark },
                    None => Error::Redis(e),
                }
            }
            _ => Error::Redis(e),
        }
    }
}

/// The result of every fallible call of this crate.
pub type Result<T> = std::result::Result<T, Error>;
