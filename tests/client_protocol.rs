//! The facts the module and its clients share live once, in
//! `core::protocol`: the Python and Node.js packages carry a copy generated
//! from it (`clients/python/src/redis_lock_client/_protocol.py`,
//! `clients/node/src/protocol.ts`), which this test holds to it.
//! `CLIENT_PROTOCOL_BLESS=1` rewrites the copies. Needs no server.

use std::path::PathBuf;

use redis_lock_core::protocol::{code, command, MAX_BLOCK_MS, OBSERVE_GRACE_MS, OBSERVE_WAIT_MS};

/// (name, value) of every shared string, in the order the copies list them.
fn strings() -> Vec<(&'static str, &'static str)> {
    vec![
        ("ACQUIRE", command::ACQUIRE),
        ("RELEASE", command::RELEASE),
        ("EXTEND", command::EXTEND),
        ("FENCE", command::FENCE),
        ("INFO", command::INFO),
        ("ACQUIRE_ALL", command::ACQUIRE_ALL),
        ("RELEASE_ALL", command::RELEASE_ALL),
        ("EXEC", command::EXEC),
        ("FENCED", command::FENCED),
        ("OBSERVE", command::OBSERVE),
        ("BLOCK", command::BLOCK),
        ("AFTER", command::AFTER),
        ("VALUE", command::VALUE),
        ("MINFENCE", command::MINFENCE),
        ("SHARED", command::SHARED),
        ("LIMIT", command::LIMIT),
        ("FENCE_WORD", command::FENCE_WORD),
        ("LINE_FULL", code::LINE_FULL),
        ("TRY_AGAIN", code::TRY_AGAIN),
        ("READ_ONLY", code::READ_ONLY),
        ("OUT_OF_MEMORY", code::OUT_OF_MEMORY),
        ("WRONG_TYPE", code::WRONG_TYPE),
        ("NO_PERMISSION", code::NO_PERMISSION),
        ("NOT_HELD", code::NOT_HELD),
        ("STALE_FENCE", code::STALE_FENCE),
        ("NOT_GUARDABLE", code::NOT_GUARDABLE),
    ]
}

const HEADER: [&str; 4] = [
    "Generated from core/src/protocol.rs by tests/client_protocol.rs",
    "(CLIENT_PROTOCOL_BLESS=1 cargo test --test client_protocol rewrites it):",
    "the command names, option words, error codes and waits the module and",
    "every client share. Do not edit.",
];

fn python() -> String {
    let mut s: String = HEADER.iter().map(|l| format!("# {l}\n")).collect();
    for (name, value) in strings() {
        s += &format!("{name} = \"{value}\"\n");
    }
    s += &format!("MAX_BLOCK_MS = {MAX_BLOCK_MS}\n");
    s += &format!("OBSERVE_WAIT_MS = {OBSERVE_WAIT_MS}\n");
    s += &format!("OBSERVE_GRACE_MS = {OBSERVE_GRACE_MS}\n");
    s
}

fn typescript() -> String {
    let mut s: String = HEADER.iter().map(|l| format!("// {l}\n")).collect();
    for (name, value) in strings() {
        s += &format!("export const {name} = '{value}';\n");
    }
    s += &format!("export const MAX_BLOCK_MS = {MAX_BLOCK_MS};\n");
    s += &format!("export const OBSERVE_WAIT_MS = {OBSERVE_WAIT_MS};\n");
    s += &format!("export const OBSERVE_GRACE_MS = {OBSERVE_GRACE_MS};\n");
    s
}

#[test]
fn the_clients_copies_of_the_protocol_are_the_cores() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let bless = std::env::var_os("CLIENT_PROTOCOL_BLESS").is_some();
    for (path, want) in [
        (
            "clients/python/src/redis_lock_client/_protocol.py",
            python(),
        ),
        ("clients/node/src/protocol.ts", typescript()),
    ] {
        let path = root.join(path);
        if bless {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            have,
            want,
            "{} is not core::protocol's: CLIENT_PROTOCOL_BLESS=1 cargo test --test client_protocol",
            path.display()
        );
    }
}
