//! Keyspace notifications: with `notify-keyspace-events` including the
//! module class (`d`, or `A`), a lock key emits lock.acquire, lock.extend,
//! lock.release, lock.expire and lock.handoff, in the order they happen.

use redis_lock_testkit as common;

use std::time::Duration;

use common::*;

/// Subscribes to `pattern` and returns the connection, confirmed.
fn subscribe(s: &Server, pattern: &str) -> RawConn {
    let mut sub = RawConn::connect(s);
    let reply = sub.call(&["PSUBSCRIBE", pattern]);
    assert!(matches!(reply, Resp::Array(_)), "{reply:?}");
    sub
}

/// The next event's (channel, message), within `limit`.
fn next_event(sub: &mut RawConn, limit: Duration) -> Option<(String, String)> {
    let text = |r: &Resp| match r {
        Resp::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("{other:?}"),
    };
    match sub.read_within(limit)? {
        Resp::Array(items) if items.len() == 4 => Some((text(&items[2]), text(&items[3]))),
        other => panic!("{other:?}"),
    }
}

/// The lock events among the messages that arrive within `limit` of each
/// other (Redis's own, like `expired`, are left out).
fn events(sub: &mut RawConn, limit: Duration) -> Vec<String> {
    let mut out = Vec::new();
    while let Some((_, message)) = next_event(sub, limit) {
        if message.starts_with("lock.") {
            out.push(message);
        }
    }
    out
}

#[test]
fn a_locks_life_shows_in_keyspace_events() {
    let s = Server::builder()
        .config("notify-keyspace-events", "KEA")
        .start();
    let mut c = s.conn();
    let mut sub = subscribe(&s, "__keyspace@0__:orders:*");
    let quiet = Duration::from_millis(300);

    acquire(&mut c, "orders:1", "a", 60_000).unwrap();
    assert_eq!(extend(&mut c, "orders:1", "a", 60_000), 1);
    acquire(&mut c, "orders:1", "a", 60_000).unwrap(); // same token: an extend
    assert_eq!(release(&mut c, "orders:1", "a"), 1);
    // Refused or contended commands emit nothing.
    assert_eq!(release(&mut c, "orders:1", "a"), 0);
    assert_eq!(extend(&mut c, "orders:1", "a", 1000), 0);
    assert_eq!(
        events(&mut sub, quiet),
        ["lock.acquire", "lock.extend", "lock.extend", "lock.release"]
    );

    // A release that hands the lock on: release, then handoff.
    acquire(&mut c, "orders:2", "a", 60_000).unwrap();
    let mut w = RawConn::block_acquire(&s, "orders:2", "w", 300, 10_000);
    wait_until(Duration::from_secs(5), || s.info_field("waiters") == 1);
    assert_eq!(release(&mut c, "orders:2", "a"), 1);
    assert!(matches!(w.read(), Resp::Int(_)));
    // W's 300 ms lease then ends with nobody waiting: Redis expires the key.
    let seen = events(&mut sub, Duration::from_secs(3));
    assert_eq!(
        seen,
        [
            "lock.acquire",
            "lock.release",
            "lock.handoff",
            "lock.expire"
        ],
        "{seen:?}"
    );

    // A lease that ends with a waiter queued: expire, then handoff.
    acquire(&mut c, "orders:3", "a", 200).unwrap();
    let mut w = RawConn::block_acquire(&s, "orders:3", "w", 60_000, 10_000);
    assert!(matches!(
        w.read_within(Duration::from_secs(5)),
        Some(Resp::Int(_))
    ));
    let seen = events(&mut sub, quiet);
    assert_eq!(
        seen,
        ["lock.acquire", "lock.expire", "lock.handoff"],
        "{seen:?}"
    );

    // Other keys' events and other types' expiry are not lock events, also
    // for a name that held a lock a moment ago (DEL, an admin removal, emits
    // Redis's `del` only).
    acquire(&mut c, "orders:plain", "a", 60_000).unwrap();
    let _: () = redis::cmd("DEL").arg("orders:plain").query(&mut c).unwrap();
    let _: () = redis::cmd("SET")
        .arg("orders:plain")
        .arg("v")
        .arg("PX")
        .arg(50)
        .query(&mut c)
        .unwrap();
    let mut seen = Vec::new();
    while let Some((_, message)) = next_event(&mut sub, Duration::from_secs(2)) {
        seen.push(message);
    }
    assert!(seen.contains(&"expired".to_string()), "{seen:?}");
    assert_eq!(
        seen.iter()
            .filter(|e| e.starts_with("lock."))
            .collect::<Vec<_>>(),
        ["lock.acquire"],
        "{seen:?}"
    );
}

#[test]
fn the_keyevent_channel_names_the_key_and_the_class_can_be_off() {
    let s = Server::builder()
        .config("notify-keyspace-events", "Ed")
        .start();
    let mut c = s.conn();
    let mut sub = subscribe(&s, "__keyevent@0__:lock.*");
    acquire(&mut c, "jobs:7", "a", 60_000).unwrap();
    let (channel, key) = next_event(&mut sub, Duration::from_secs(2)).expect("an event");
    assert_eq!(
        (channel.as_str(), key.as_str()),
        ("__keyevent@0__:lock.acquire", "jobs:7")
    );

    // Without the module class (g: generic only), no lock event.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("Eg")
        .query(&mut c)
        .unwrap();
    assert_eq!(release(&mut c, "jobs:7", "a"), 1);
    assert_eq!(next_event(&mut sub, Duration::from_millis(300)), None);
}

/// The node queues lock events only while the server emits them, and reads
/// that at every entry: turned on at runtime, the very next command's
/// events and the timer's arrive; turned off again, none does.
#[test]
fn lock_events_follow_notify_keyspace_events_as_it_changes() {
    let s = Server::builder()
        .config("notify-keyspace-events", "")
        .start();
    let mut c = s.conn();
    let mut sub = subscribe(&s, "__keyevent@0__:lock.*");
    let set_events = |c: &mut redis::Connection, flags: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg(flags)
            .query(c)
            .unwrap();
    };
    acquire(&mut c, "jobs:1", "a", 60_000).unwrap();
    assert_eq!(next_event(&mut sub, Duration::from_millis(300)), None);

    set_events(&mut c, "Ed");
    acquire(&mut c, "jobs:2", "a", 300).unwrap();
    assert_eq!(
        next_event(&mut sub, Duration::from_secs(2)),
        Some(("__keyevent@0__:lock.acquire".into(), "jobs:2".into()))
    );
    // jobs:2's lease ends with nobody touching it: the timer reclaims it.
    assert_eq!(
        next_event(&mut sub, Duration::from_secs(5)),
        Some(("__keyevent@0__:lock.expire".into(), "jobs:2".into()))
    );

    set_events(&mut c, "");
    assert_eq!(release(&mut c, "jobs:1", "a"), 1);
    acquire(&mut c, "jobs:3", "a", 100).unwrap();
    assert_eq!(next_event(&mut sub, Duration::from_millis(600)), None);
}
