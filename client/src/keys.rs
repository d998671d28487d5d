//! The keys one lock covers: one key (`LOCK.ACQUIRE`), or several taken
//! all or nothing with one fencing token (`LOCK.ACQUIREALL`). Every command
//! the client sends about a lock is written here, so the one-key and the
//! several-keys forms cannot drift apart.

use std::fmt;

use redis_lock_core::protocol::command;
use redis_lock_core::Mode;

use crate::clock::millis;
use crate::error::{Error, Result};

/// The keys of one lock: one key, or several held all or nothing (in one
/// slot on Redis Cluster: give them one hash tag). Made from a `&str`, a
/// `String`, or a slice or `Vec` of either. It also says how the lock is
/// taken (exclusive unless [`Acquire::shared`](crate::Acquire::shared) or
/// [`Acquire::limit`](crate::Acquire::limit) said otherwise), so every
/// command that takes it says so too.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Keys(Vec<String>, Mode, Option<String>);

impl Keys {
    /// The first key named: the lock's key when there is one, and the key
    /// `LOCK.EXEC` checks for a multi-key lock (every key has the same
    /// holder and fence).
    pub fn first(&self) -> &str {
        self.0.first().map_or("", String::as_str)
    }

    /// Every key, in the order named.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// More than one key (an all-or-nothing lock).
    pub fn is_several(&self) -> bool {
        self.0.len() > 1
    }

    /// The lock's name in logs and messages: its key, or `{a, b, c}`.
    pub(crate) fn name(&self) -> std::borrow::Cow<'_, str> {
        match self.is_several() {
            false => self.first().into(),
            true => self.to_string().into(),
        }
    }

    /// How the lock is taken: exclusive, or shared (with a limit).
    pub(crate) fn mode(&self) -> Mode {
        self.1
    }

    /// The same keys, taken in `mode`.
    pub(crate) fn in_mode(mut self, mode: Mode) -> Keys {
        self.1 = mode;
        self
    }

    /// The same keys, each holder with this public value (`VALUE v`, sent
    /// with every ACQUIRE of the lock).
    pub(crate) fn with_value(mut self, value: Option<String>) -> Keys {
        self.2 = value;
        self
    }

    /// At least one key, none named twice; a limit of at least 1; a value
    /// only for an exclusive lock.
    pub(crate) fn check(&self) -> Result<()> {
        if self.2.is_some() && self.1.is_shared() {
            return Err(Error::Config(
                "a value names one holder (a leader): not with shared or limit".into(),
            ));
        }
        if self.0.is_empty() {
            return Err(Error::Config("a lock needs at least one key".into()));
        }
        if self.1 == (Mode::Shared { limit: Some(0) }) {
            return Err(Error::Config("a limit must be at least 1".into()));
        }
        let mut seen = std::collections::HashSet::new();
        match self.0.iter().find(|k| !seen.insert(k.as_str())) {
            Some(k) => Err(Error::Config(format!("key {k} is named twice"))),
            None => Ok(()),
        }
    }

    /// The key that orders a Redlock group's waiters for this lock: the
    /// smallest, so every caller naming the same keys, in any order, waits
    /// in the same node's lines.
    pub(crate) fn ordering_key(&self) -> &str {
        self.0.iter().min().map_or("", String::as_str)
    }

    /// `LOCK.ACQUIRE key ...` or `LOCK.ACQUIREALL numkeys key ... token
    /// ttl-ms [SHARED [LIMIT n]] [BLOCK block-ms] [MINFENCE n]`.
    pub(crate) fn acquire_cmd(
        &self,
        token: &str,
        ttl: std::time::Duration,
        block_ms: Option<i64>,
        min_fence: Option<i64>,
    ) -> redis::Cmd {
        let mut cmd = self.named(command::ACQUIRE, command::ACQUIRE_ALL);
        cmd.arg(token).arg(millis(ttl));
        if let Mode::Shared { limit } = self.1 {
            cmd.arg(command::SHARED);
            if let Some(n) = limit {
                cmd.arg(command::LIMIT).arg(n);
            }
        }
        if let Some(ms) = block_ms {
            cmd.arg(command::BLOCK).arg(ms);
        }
        if let Some(n) = min_fence {
            cmd.arg(command::MINFENCE).arg(n);
        }
        if let Some(value) = &self.2 {
            cmd.arg(command::VALUE).arg(value);
        }
        cmd
    }

    /// `LOCK.RELEASE key token` or `LOCK.RELEASEALL numkeys key ... token`;
    /// its integer reply is how many keys it released ([`released`](Self::released)).
    pub(crate) fn release_cmd(&self, token: &str) -> redis::Cmd {
        let mut cmd = self.named(command::RELEASE, command::RELEASE_ALL);
        cmd.arg(token);
        cmd
    }

    /// `one key` for one key, `all numkeys key ...` for several.
    fn named(&self, one: &str, all: &str) -> redis::Cmd {
        match self.is_several() {
            true => {
                let mut cmd = redis::cmd(all);
                cmd.arg(self.0.len()).arg(&self.0);
                cmd
            }
            false => {
                let mut cmd = redis::cmd(one);
                cmd.arg(self.first());
                cmd
            }
        }
    }

    /// Whether a release's reply says the token held anything there.
    pub(crate) fn released(reply: i64) -> bool {
        reply > 0
    }

    /// `LOCK.EXTEND key token ttl-ms [VALUE v]`, one per key (a lock is
    /// extended where every key's EXTEND answers 1); with `value`, each
    /// key's holder proclaims it.
    pub(crate) fn extend_cmds(
        &self,
        token: &str,
        ttl: std::time::Duration,
        value: Option<&str>,
    ) -> Vec<redis::Cmd> {
        self.0
            .iter()
            .map(|key| {
                let mut cmd = redis::cmd(command::EXTEND);
                cmd.arg(key).arg(token).arg(millis(ttl));
                if let Some(value) = value {
                    cmd.arg(command::VALUE).arg(value);
                }
                cmd
            })
            .collect()
    }
}

impl fmt::Display for Keys {
    /// One key as itself; several as `{a, b, c}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.is_several() {
            false => f.write_str(self.first()),
            true => write!(f, "{{{}}}", self.0.join(", ")),
        }
    }
}

impl From<&str> for Keys {
    fn from(key: &str) -> Keys {
        Keys(vec![key.to_string()], Mode::Exclusive, None)
    }
}

impl From<String> for Keys {
    fn from(key: String) -> Keys {
        Keys(vec![key], Mode::Exclusive, None)
    }
}

impl From<&String> for Keys {
    fn from(key: &String) -> Keys {
        Keys(vec![key.clone()], Mode::Exclusive, None)
    }
}

impl<S: AsRef<str>> From<&[S]> for Keys {
    fn from(keys: &[S]) -> Keys {
        Keys(
            keys.iter().map(|k| k.as_ref().to_string()).collect(),
            Mode::Exclusive,
            None,
        )
    }
}

impl<S: AsRef<str>> From<Vec<S>> for Keys {
    fn from(keys: Vec<S>) -> Keys {
        Keys(
            keys.iter().map(|k| k.as_ref().to_string()).collect(),
            Mode::Exclusive,
            None,
        )
    }
}

impl<S: AsRef<str>, const N: usize> From<&[S; N]> for Keys {
    fn from(keys: &[S; N]) -> Keys {
        Keys(
            keys.iter().map(|k| k.as_ref().to_string()).collect(),
            Mode::Exclusive,
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_and_several_are_written_as_the_server_reads_them() {
        let ttl = std::time::Duration::from_millis(1500);
        let one = Keys::from("a");
        let packed = |c: redis::Cmd| String::from_utf8_lossy(&c.get_packed_command()).into_owned();
        assert!(packed(one.acquire_cmd("t", ttl, Some(5), None)).contains(
            "LOCK.ACQUIRE\r\n$1\r\na\r\n$1\r\nt\r\n$4\r\n1500\r\n$5\r\nBLOCK\r\n$1\r\n5"
        ));
        let several = Keys::from(&["b", "a"]);
        let acquire = packed(several.acquire_cmd("t", ttl, None, Some(9)));
        assert!(acquire.contains("LOCK.ACQUIREALL\r\n$1\r\n2\r\n$1\r\nb\r\n$1\r\na\r\n$1\r\nt\r\n$4\r\n1500\r\n$8\r\nMINFENCE"), "{acquire}");
        assert!(packed(several.release_cmd("t")).contains("LOCK.RELEASEALL\r\n$1\r\n2\r\n"));
        assert_eq!(several.extend_cmds("t", ttl, None).len(), 2);
        assert_eq!(several.ordering_key(), "a");
        assert_eq!(several.to_string(), "{b, a}");
        assert!(Keys::from(Vec::<String>::new()).check().is_err());
        assert!(Keys::from(&["a", "a"]).check().is_err());
        assert!(several.check().is_ok());
    }
}
