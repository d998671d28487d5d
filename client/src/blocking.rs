//! A blocking facade for code without an async runtime. It runs its own
//! small tokio runtime (one worker, which also renews held locks). Called
//! from inside another runtime (async code that uses it anyway) it blocks
//! that thread instead of panicking: the work then runs on a thread of its
//! own.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::blocking::LockClient;
//!
//! let locks = LockClient::new(&["redis://127.0.0.1:6379/"])?;
//! if let Some(guard) = locks.acquire("order:42", Duration::from_secs(30)).wait(Duration::from_secs(10)).call()? {
//!     println!("fence {}", guard.fence());
//!     guard.release()?;
//! }
//! # Ok::<(), redis_lock_client::Error>(())
//! ```

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;

use crate::error::{Error, Result};
use crate::Options;

/// A handle on one lock node or a Redlock group, for code without an async
/// runtime (see [`crate::LockClient`]); cheap to clone.
#[derive(Clone, Debug)]
pub struct LockClient {
    inner: crate::LockClient,
    runtime: Arc<OwnRuntime>,
}

/// The facade's runtime. Dropped inside another runtime (where dropping a
/// runtime panics) it is shut down in the background instead.
#[derive(Debug)]
struct OwnRuntime(Option<Runtime>);

impl std::ops::Deref for OwnRuntime {
    type Target = Runtime;
    fn deref(&self) -> &Runtime {
        self.0.as_ref().expect("present until dropped")
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                runtime.shutdown_background();
            }
        }
    }
}

impl LockClient {
    /// A client of these nodes (see [`crate::LockClient::new`]).
    pub fn new<S: AsRef<str>>(urls: &[S]) -> Result<LockClient> {
        Self::with_options(urls, Options::default())
    }

    /// A client of these nodes with these options (see
    /// [`crate::LockClient::with_options`]).
    pub fn with_options<S: AsRef<str>>(urls: &[S], options: Options) -> Result<LockClient> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| Error::Config(format!("cannot start a runtime: {e}")))?;
        let inner = {
            let _entered = runtime.enter();
            crate::LockClient::with_options(urls, options)?
        };
        Ok(LockClient {
            inner,
            runtime: Arc::new(OwnRuntime(Some(runtime))),
        })
    }

    /// One attempt; see [`crate::LockClient::try_acquire`].
    pub fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Option<LockGuard>> {
        self.acquire(key, ttl).call()
    }

    /// The lock on `key` for `ttl`, with the wait and token named on the
    /// returned [`Acquire`]; [`call`](Acquire::call) runs it. See
    /// [`crate::LockClient::acquire`].
    pub fn acquire<'a>(&'a self, key: &'a str, ttl: Duration) -> Acquire<'a> {
        Acquire {
            client: self,
            inner: self.inner.acquire(key, ttl),
        }
    }

    /// Every key of `keys` for `ttl`, or none, with one fencing token; see
    /// [`crate::LockClient::acquire_all`].
    pub fn acquire_all<'a, S: AsRef<str>>(&'a self, keys: &[S], ttl: Duration) -> Acquire<'a> {
        Acquire {
            client: self,
            inner: self.inner.acquire_all(keys, ttl),
        }
    }
}

/// One blocking acquisition, made by [`LockClient::acquire`]; nothing
/// happens until [`call`](Acquire::call).
#[must_use = "an acquisition does nothing until call()"]
#[derive(Debug)]
pub struct Acquire<'a> {
    client: &'a LockClient,
    inner: crate::Acquire<'a>,
}

impl<'a> Acquire<'a> {
    /// See [`crate::Acquire::wait`].
    pub fn wait(self, wait: Duration) -> Self {
        Acquire {
            inner: self.inner.wait(wait),
            ..self
        }
    }

    /// See [`crate::Acquire::shared`].
    pub fn shared(self) -> Self {
        Acquire {
            inner: self.inner.shared(),
            ..self
        }
    }

    /// See [`crate::Acquire::limit`].
    pub fn limit(self, n: u32) -> Self {
        Acquire {
            inner: self.inner.limit(n),
            ..self
        }
    }

    /// See [`crate::Acquire::token`].
    pub fn token(self, token: impl Into<String>) -> Self {
        Acquire {
            inner: self.inner.token(token),
            ..self
        }
    }

    /// See [`crate::Acquire::auto_renew`] (renewals run on the facade's
    /// own runtime).
    pub fn auto_renew(self, on: bool) -> Self {
        Acquire {
            inner: self.inner.auto_renew(on),
            ..self
        }
    }

    /// Acquires, waiting as set: the guard, or None if not acquired.
    pub fn call(self) -> Result<Option<LockGuard>> {
        let runtime = &self.client.runtime;
        let guard = wait_on(runtime, self.inner.into_future())?;
        Ok(guard.map(|g| LockGuard {
            inner: Some(g),
            runtime: runtime.clone(),
        }))
    }

    /// Runs `f` while holding the lock, renewing it on the facade's runtime
    /// meanwhile, then releases it; as [`crate::Acquire::with_lock`]:
    /// `Ok(None)` not acquired within the wait, [`Error::Lost`] lost before
    /// `f` returned. `f` gets the guard, to read its fence or to ask
    /// whether the lock is still held ([`LockGuard::is_valid`],
    /// [`LockGuard::wait_for_loss`]).
    pub fn with_lock<T>(self, f: impl FnOnce(&LockGuard) -> T) -> Result<Option<T>> {
        let Some(guard) = self.auto_renew(true).call()? else {
            return Ok(None);
        };
        let out = f(&guard);
        // Judged before the release: was the lock held all along?
        let kept = guard.is_valid();
        // The work is done: a failed release only means the lease ends by itself.
        let _ = guard.release();
        match kept {
            true => Ok(Some(out)),
            false => Err(Error::Lost),
        }
    }
}

/// A held lock; released on drop (waiting for the release). Its times are
/// `std::time::Instant`s; [`lease`](Self::lease) is the async view.
#[derive(Debug)]
pub struct LockGuard {
    inner: Option<crate::LockGuard>,
    runtime: Arc<OwnRuntime>,
}

impl LockGuard {
    fn guard(&self) -> &crate::LockGuard {
        self.inner.as_ref().expect("present until released")
    }

    /// The locked key (the first of several; see [`crate::Lease::key`]).
    pub fn key(&self) -> &str {
        self.guard().key()
    }

    /// Every key of the lock.
    pub fn keys(&self) -> &crate::Keys {
        self.guard().keys()
    }

    /// The token identifying this holder (see [`crate::Lease::token`]).
    pub fn token(&self) -> &str {
        self.guard().token()
    }

    /// The fencing token to send with every write to the resource.
    pub fn fence(&self) -> i64 {
        self.guard().fence()
    }

    /// The TTL of the last grant or extend.
    pub fn ttl(&self) -> Duration {
        self.guard().ttl()
    }

    /// Until when the lock is held for sure, unless lost earlier (see
    /// [`crate::Lease::valid_until`]).
    pub fn valid_until(&self) -> std::time::Instant {
        self.guard().valid_until().into_std()
    }

    /// Held and within its validity.
    pub fn is_valid(&self) -> bool {
        self.guard().is_valid()
    }

    /// True once the lock is known lost (see [`crate::Lease::lost`]).
    pub fn is_lost(&self) -> bool {
        self.guard().lost().is_cancelled()
    }

    /// Blocks until the lock is lost or `limit` has passed: true if it was
    /// lost. (With renewal the loss is a refused or failed renewal; without
    /// it, the validity running out.)
    pub fn wait_for_loss(&self, limit: Duration) -> bool {
        let lost = self.guard().lost().clone();
        wait_on(&self.runtime, async move {
            tokio::time::timeout(limit, lost.cancelled()).await.is_ok()
        })
    }

    /// The async view of this lock, for tasks on a runtime of their own.
    pub fn lease(&self) -> crate::Lease {
        self.guard().lease()
    }

    /// Sets the lease to `ttl` from now (see [`crate::LockGuard::extend`]).
    pub fn extend(&self, ttl: Duration) -> Result<bool> {
        wait_on(&self.runtime, self.guard().extend(ttl))
    }

    /// Runs `cmd` on the lock's node only while this grant holds the lock
    /// (see [`crate::LockGuard::exec`]).
    pub fn exec<T: redis::FromRedisValue + Send>(&self, cmd: &redis::Cmd) -> Result<T> {
        wait_on(&self.runtime, self.guard().exec(cmd))
    }

    /// Runs `cmd` on `conn` behind the fence gate `gate` (see
    /// [`crate::Lease::fenced_cmd`]): `cmd`'s reply, or
    /// [`Error::StaleFence`] when a later holder has written.
    pub fn fenced<T: redis::FromRedisValue>(
        &self,
        conn: &mut impl redis::ConnectionLike,
        gate: &str,
        cmd: &redis::Cmd,
    ) -> Result<T> {
        Ok(self.guard().fenced_cmd(gate, cmd).query(conn)?)
    }

    /// Stops renewing and releases (see [`crate::LockGuard::release`]).
    pub fn release(mut self) -> Result<bool> {
        let guard = self.inner.take().expect("present until released");
        wait_on(&self.runtime, guard.release())
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(guard) = self.inner.take() {
            let _ = wait_on(&self.runtime, guard.release());
        }
    }
}

/// `runtime.block_on(work)`, from a scoped thread when the caller is itself
/// inside a runtime (where `block_on` would panic).
fn wait_on<F: std::future::Future + Send>(runtime: &Runtime, work: F) -> F::Output
where
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return runtime.block_on(work);
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| runtime.block_on(work))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}
