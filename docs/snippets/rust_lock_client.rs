// redis-lock from Rust with this project's client crate (redis-lock-client,
// tokio). One URL: one node; several URLs: Redlock with quorum fencing.
use std::time::Duration;

use redis_lock_client::{LockClient, Options};

#[tokio::main]
pub async fn main() -> redis_lock_client::Result<()> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let options = Options::default().auto_renew(true); // renews at ttl/3
    let locks = LockClient::with_options(&[url], options)?;

    // Wait up to 5 s in the server's line for a 30 s lease.
    let guard = locks
        .acquire("lock:invoice:42", Duration::from_secs(30))
        .wait(Duration::from_secs(5))
        .await?;
    let Some(guard) = guard else {
        println!("busy");
        return Ok(());
    };
    println!("acquired: fence {}", guard.fence());
    let busy = locks
        .try_acquire("lock:invoice:42", Duration::from_secs(30))
        .await?;
    println!(
        "second try_acquire: {}",
        if busy.is_some() { "granted" } else { "busy" }
    );
    println!("extends: {}", guard.extend(Duration::from_secs(30)).await?);
    let first = guard.fence();
    println!("releases: {}", guard.release().await?);

    // Or run a closure under the lock, renewed while it runs, then released.
    let fence = locks
        .acquire("lock:invoice:42", Duration::from_secs(30))
        .wait(Duration::from_secs(5))
        .with_lock(|lease| async move {
            // Stop if the lock is lost; pass lease.fence() to every write.
            tokio::select! {
                _ = lease.lost().cancelled() => None,
                fence = async { lease.fence() } => Some(fence),
            }
        })
        .await? // Err(Lost) if the lock was lost while the closure ran
        .flatten(); // None: not acquired within the wait
    println!(
        "with_lock: fence {} higher: {}",
        fence.unwrap_or(0),
        fence > Some(first)
    );
    Ok(())
}
