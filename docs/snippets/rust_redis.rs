// redis-lock from Rust with the `redis` crate (redis = "0.27", rand = "0.8").
use redis::{Commands, Connection, RedisResult};

const KEY: &str = "lock:invoice:42";

fn acquire(
    con: &mut Connection,
    token: &str,
    ttl_ms: u64,
    wait_ms: u64,
) -> RedisResult<Option<i64>> {
    // Some(fencing token), or None if the lock stayed taken for wait_ms.
    redis::cmd("LOCK.ACQUIRE")
        .arg(KEY)
        .arg(token)
        .arg(ttl_ms)
        .arg("BLOCK")
        .arg(wait_ms)
        .query(con)
}

fn extend(con: &mut Connection, token: &str, ttl_ms: u64) -> RedisResult<bool> {
    redis::cmd("LOCK.EXTEND")
        .arg(KEY)
        .arg(token)
        .arg(ttl_ms)
        .query(con)
}

fn release(con: &mut Connection, token: &str) -> RedisResult<bool> {
    redis::cmd("LOCK.RELEASE").arg(KEY).arg(token).query(con)
}

pub fn main() -> RedisResult<()> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let client = redis::Client::open(url)?;
    // A BLOCKed command holds its connection: one connection per waiter.
    let (mut a, mut b) = (client.get_connection()?, client.get_connection()?);
    let (token_a, token_b) = (
        format!("{:032x}", rand::random::<u128>()),
        format!("{:032x}", rand::random::<u128>()),
    );

    let fence_a = acquire(&mut a, &token_a, 500, 5_000)?.expect("free");
    println!("A acquired: fence {fence_a}");
    let _: () = a.set("invoice:42:fence", fence_a)?; // A writes with its fence

    // B waits in line and gets the lock when A's 500 ms lease ends.
    let fence_b = acquire(&mut b, &token_b, 30_000, 5_000)?.expect("handed over");
    println!("B acquired: fence {fence_b}");
    println!("B extends: {}", extend(&mut b, &token_b, 30_000)?);

    // The resource accepts a write only with a fence at least as high as the
    // last one it saw (here a Lua check-and-set; a SQL `WHERE fence <= ?` too).
    let fenced_set = redis::Script::new(
        "if tonumber(redis.call('GET', KEYS[1]) or '0') <= tonumber(ARGV[1]) \
         then redis.call('SET', KEYS[1], ARGV[1]) return 1 else return 0 end",
    );
    let b_wrote: bool = fenced_set
        .key("invoice:42:fence")
        .arg(fence_b)
        .invoke(&mut b)?;
    let a_wrote: bool = fenced_set
        .key("invoice:42:fence")
        .arg(fence_a)
        .invoke(&mut a)?;
    println!("B writes: {b_wrote}");
    println!("A writes: {a_wrote}");
    println!("A extends: {}", extend(&mut a, &token_a, 30_000)?);
    println!("A releases: {}", release(&mut a, &token_a)?);
    println!("B releases: {}", release(&mut b, &token_b)?);
    Ok(())
}
