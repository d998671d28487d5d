//! The lock commands, one helper each, and LOCK.INFO typed ([`LockInfo`]);
//! a key's own expiry and the wall clock to compare them with.

use redis::{Connection, Value};
use redis_lock_core::protocol::{command, info_field};

pub fn acquire(c: &mut Connection, key: &str, token: &str, ttl: i64) -> Option<i64> {
    redis::cmd(command::ACQUIRE)
        .arg(key)
        .arg(token)
        .arg(ttl)
        .query(c)
        .unwrap()
}

pub fn release(c: &mut Connection, key: &str, token: &str) -> i64 {
    redis::cmd(command::RELEASE)
        .arg(key)
        .arg(token)
        .query(c)
        .unwrap()
}

pub fn extend(c: &mut Connection, key: &str, token: &str, ttl: i64) -> i64 {
    redis::cmd(command::EXTEND)
        .arg(key)
        .arg(token)
        .arg(ttl)
        .query(c)
        .unwrap()
}

pub fn fence(c: &mut Connection, key: &str) -> Option<i64> {
    redis::cmd(command::FENCE).arg(key).query(c).unwrap()
}

/// A held lock, as LOCK.INFO describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// The holder's token; None for a user who may not write the key
    /// (LOCK.INFO hides it from them).
    pub token: Option<Vec<u8>>,
    /// The holder's fencing token.
    pub fence: i64,
    /// What is left of the lease, ms.
    pub ttl: i64,
    /// Clients queued for the lock with BLOCK.
    pub waiters: i64,
    /// When the holder was granted (Unix ms, kept by its renewals); None
    /// when unknown (a lock loaded from an AOF of an earlier build).
    pub granted: Option<i64>,
}

impl LockInfo {
    /// Reads a LOCK.INFO reply: None for nil (the lock is free), else its
    /// fields, from RESP2's flat field/value array or RESP3's map.
    pub fn from_reply(reply: &Value) -> Option<LockInfo> {
        let pairs: Vec<(&Value, &Value)> = match reply {
            Value::Nil => return None,
            Value::Array(items) if items.len() % 2 == 0 => {
                items.chunks(2).map(|p| (&p[0], &p[1])).collect()
            }
            Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
            other => panic!("LOCK.INFO replied {other:?}"),
        };
        fn field<T: redis::FromRedisValue>(pairs: &[(&Value, &Value)], name: &str) -> T {
            let (_, value) = pairs
                .iter()
                .find(|(k, _)| match k {
                    Value::BulkString(k) => k == name.as_bytes(),
                    Value::SimpleString(k) => k == name,
                    _ => false,
                })
                .unwrap_or_else(|| panic!("no {name} in LOCK.INFO's {pairs:?}"));
            redis::from_redis_value(value)
                .unwrap_or_else(|e| panic!("LOCK.INFO's {name} is {value:?}: {e}"))
        }
        Some(LockInfo {
            token: field(&pairs, info_field::TOKEN),
            fence: field(&pairs, info_field::FENCE),
            ttl: field(&pairs, info_field::TTL),
            waiters: field(&pairs, info_field::WAITERS),
            granted: field(&pairs, info_field::GRANTED),
        })
    }

    /// The holder's token as text: panics if LOCK.INFO hid it (from a user
    /// who may not write the key) or it is not UTF-8.
    pub fn token_text(&self) -> String {
        let token = self
            .token
            .clone()
            .expect("LOCK.INFO hides the token from this user");
        String::from_utf8(token).expect("a UTF-8 token")
    }
}

/// `LOCK.INFO key` as the server replied it: nil, a flat field/value array
/// (RESP2) or a map (RESP3). For tests of the reply itself; the others
/// read it typed, with [`lock_info`].
pub fn lock_info_reply(c: &mut Connection, key: &str) -> Value {
    redis::cmd(command::INFO).arg(key).query(c).unwrap()
}

/// `LOCK.INFO key`, typed: None when the lock is free.
pub fn lock_info(c: &mut Connection, key: &str) -> Option<LockInfo> {
    LockInfo::from_reply(&lock_info_reply(c, key))
}

/// The token of the lock's holder (None when the lock is free), as a user
/// who may write the key sees it: panics if LOCK.INFO hides it from this
/// connection's user. Tokens that are not UTF-8: [`lock_info`].
pub fn holder(c: &mut Connection, key: &str) -> Option<String> {
    lock_info(c, key).map(|info| info.token_text())
}

/// The holder's token and fence (None when the lock is free), as
/// [`holder`] sees them.
pub fn holder_and_fence(c: &mut Connection, key: &str) -> Option<(String, i64)> {
    lock_info(c, key).map(|info| (info.token_text(), info.fence))
}

/// What is left of the lock's lease, ms (LOCK.INFO's `ttl`; -2 when no lock
/// is held). Lock keys carry no Redis expiry: PTTL says -1.
pub fn lease_ms(c: &mut Connection, key: &str) -> i64 {
    lock_info(c, key).map_or(-2, |info| info.ttl)
}

/// Redis's own expiry of `key` (PTTL), ms: -1 for a key without one (a
/// lock's key: the lease is the module's, [`lease_ms`]), -2 for no key.
pub fn pttl(c: &mut Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(c).unwrap()
}

/// The wall clock, Unix ms (as LOCK.INFO's `granted`).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
