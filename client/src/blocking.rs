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

pub struct LockClient {
    inner: crate::LockClient,
    runtime: Arc<OwnRuntime>,
}

/// The facade's runtime. Dropped inside another runtime (where dropping a
/// runtime panics) it is shut down in the background instead.
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
    pub fn new<S: AsRef<str>>(urls: &[S]) -> Result<LockClient> {
        Self::with_options(urls, Options::default())
    }

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
}

/// One blocking acquisition, made by [`LockClient::acquire`]; nothing
/// happens until [`call`](Acquire::call).
#[must_use = "an acquisition does nothing until call()"]
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
}

/// A held lock; released on drop (waiting for the release).
pub struct LockGuard {
    inner: Option<crate::LockGuard>,
    runtime: Arc<OwnRuntime>,
}

impl LockGuard {
    fn guard(&self) -> &crate::LockGuard {
        self.inner.as_ref().expect("present until released")
    }

    /// True once the lock is known lost (see [`crate::Lease::lost`]).
    pub fn is_lost(&self) -> bool {
        self.guard().lost().is_cancelled()
    }

    pub fn extend(&self, ttl: Duration) -> Result<bool> {
        wait_on(&self.runtime, self.guard().extend(ttl))
    }

    pub fn release(mut self) -> Result<bool> {
        let guard = self.inner.take().expect("present until released");
        wait_on(&self.runtime, guard.release())
    }
}

/// One set of getters: a guard reads as its [`crate::Lease`] (`key`,
/// `token`, `fence`, `valid_until`, `is_valid`, ...).
impl std::ops::Deref for LockGuard {
    type Target = crate::Lease;
    fn deref(&self) -> &crate::Lease {
        self.guard()
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
