//! Redis Cluster routing, for waiters whose key left this node.
//!
//! When `MIGRATE` moves a held lock to another node (resharding), Redis
//! deletes the key here. Granting the waiters here would create a second
//! lock for the key in a slot this node is giving away, so the waiters are
//! told where the key went instead, with the same redirect Redis itself
//! gives for a key that is not here: `ASK` while the slot is migrating,
//! `MOVED` once another node owns it. Cluster clients follow these.
//!
//! Pure: the glue hands in the text of `CLUSTER NODES`.

/// The hash slot of a key: CRC16 (XMODEM) of the key, or of its hash tag
/// (the bytes between the first `{` and the next `}`, if not empty), mod 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16(hashed) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Where a slot is served, seen from this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This node serves the slot (as a master, not migrating it away).
    Here,
    /// The slot is migrating from this node: keys not here are at `addr`.
    Ask { slot: u16, addr: String },
    /// Another node owns the slot.
    Moved { slot: u16, addr: String },
    /// No node owns the slot (or this node's view is incomplete).
    Unserved,
}

impl Route {
    /// The error reply for a waiter whose key is not here, in the form
    /// cluster clients parse (`ASK 3999 127.0.0.1:6381`); None for `Here`.
    pub fn redirect(&self) -> Option<String> {
        match self {
            Route::Here => None,
            Route::Ask { slot, addr } => Some(format!("ASK {slot} {addr}")),
            Route::Moved { slot, addr } => Some(format!("MOVED {slot} {addr}")),
            Route::Unserved => Some("CLUSTERDOWN Hash slot not served".into()),
        }
    }
}

/// Reads `CLUSTER NODES` output: where is `slot` served?
///
/// Each line: `id ip:port@cport[,host] flags master ping pong epoch link slot...`
/// where a slot entry is `n`, `a-b`, or, on this node's own line only,
/// `[n->-id]` (migrating to node `id`) or `[n-<-id]` (importing).
pub fn route(nodes: &str, slot: u16) -> Route {
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() >= 8)
        .collect();
    let addr_of = |id: &str| {
        lines
            .iter()
            .find(|f| f[0] == id)
            .map(|f| f[1].split(['@', ',']).next().unwrap_or("").to_string())
    };
    let is_master = |f: &[&str]| f[2].split(',').any(|flag| flag == "master");
    let is_myself = |f: &[&str]| f[2].split(',').any(|flag| flag == "myself");
    if let Some(me) = lines.iter().find(|f| is_myself(f)) {
        for entry in &me[8..] {
            if let Some(target) = migrating_to(entry, slot) {
                return match addr_of(target) {
                    Some(addr) => Route::Ask { slot, addr },
                    None => Route::Unserved,
                };
            }
        }
        if is_master(me) && me[8..].iter().any(|e| owns(e, slot)) {
            return Route::Here;
        }
    }
    for f in &lines {
        if !is_myself(f) && is_master(f) && f[8..].iter().any(|e| owns(e, slot)) {
            let addr = f[1].split(['@', ',']).next().unwrap_or("").to_string();
            return Route::Moved { slot, addr };
        }
    }
    Route::Unserved
}

/// `entry` is `n` or `a-b` covering `slot`.
fn owns(entry: &str, slot: u16) -> bool {
    if entry.starts_with('[') {
        return false;
    }
    let (lo, hi) = entry.split_once('-').unwrap_or((entry, entry));
    match (lo.parse::<u16>(), hi.parse::<u16>()) {
        (Ok(lo), Ok(hi)) => (lo..=hi).contains(&slot),
        _ => false,
    }
}

/// `entry` is `[slot->-id]`: the node id `slot` migrates to.
fn migrating_to(entry: &str, slot: u16) -> Option<&str> {
    let inner = entry.strip_prefix('[')?.strip_suffix(']')?;
    let (n, target) = inner.split_once("->-")?;
    (n.parse::<u16>().ok()? == slot).then_some(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_match_redis() {
        // Values from CLUSTER KEYSLOT and the cluster spec's CRC16 check.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b""), 0);
    }

    const NODES: &str = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460 [5461->-b2] [100-<-c3]
b2 127.0.0.1:7002@17002,host-b master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7003@17003 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7004@17004 slave a1 0 1 1 connected
";

    #[test]
    fn routes_from_cluster_nodes() {
        assert_eq!(route(NODES, 0), Route::Here);
        assert_eq!(route(NODES, 5460), Route::Here);
        assert_eq!(
            route(NODES, 5461),
            Route::Ask {
                slot: 5461,
                addr: "127.0.0.1:7002".into()
            }
        );
        assert_eq!(
            route(NODES, 10923),
            Route::Moved {
                slot: 10923,
                addr: "127.0.0.1:7003".into()
            }
        );
        assert_eq!(
            route(NODES, 5462).redirect().as_deref(),
            Some("MOVED 5462 127.0.0.1:7002")
        );
        assert_eq!(
            route(NODES, 5461).redirect().as_deref(),
            Some("ASK 5461 127.0.0.1:7002")
        );
        assert_eq!(route(NODES, 0).redirect(), None);
    }

    #[test]
    fn a_replica_redirects_to_the_master() {
        let nodes = NODES.replace("myself,master", "master").replace(
            "d4 127.0.0.1:7004@17004 slave",
            "d4 127.0.0.1:7004@17004 myself,slave",
        );
        assert_eq!(
            route(&nodes, 3),
            Route::Moved {
                slot: 3,
                addr: "127.0.0.1:7001".into()
            }
        );
    }

    #[test]
    fn unknown_or_garbled_views_are_unserved() {
        assert_eq!(route("", 7), Route::Unserved);
        assert_eq!(route("garbage\n\n x y", 7), Route::Unserved);
        let no_target = "a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-16383 [7->-zz]";
        assert_eq!(route(no_target, 7), Route::Unserved);
        assert_eq!(route(no_target, 8), Route::Here);
        let bad_ranges = "a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected x-y 9-";
        assert_eq!(route(bad_ranges, 9), Route::Unserved);
    }
}
