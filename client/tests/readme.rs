//! The README's Rust election example compiles as it is shown: its lines
//! are the body of `election_example` below, and the test checks that
//! README.md shows exactly them (an earlier version borrowed a temporary
//! inside `tokio::select!` and did not compile).

use std::time::Duration;

use futures_util::StreamExt;
use redis_lock_client::LockClient;

/// The leader's work in the example: here, nothing.
async fn serve(_fence: i64) {}

#[allow(dead_code)] // compiled, not run: its observer loop never ends
#[rustfmt::skip] // as the README shows it
async fn election_example() -> Result<(), Box<dyn std::error::Error>> {
    // README begin
    let locks = LockClient::new(&["redis://127.0.0.1:6379/"])?;
    let election = locks.election("svc:leader");
    let leader = election.campaign("10.0.0.1:7000", Duration::from_secs(10)).await?;
    let lost = leader.lost();
    tokio::select! {
        _ = lost.cancelled() => {}               // deposed: stop acting as leader
        _ = serve(leader.fence()) => {}           // send the fence with every write
    }
    leader.resign().await?;                       // the next candidate leads at once
    let mut changes = election.observe();         // followers: Leader { fence, value } or Vacant
    while let Some(change) = changes.next().await { println!("{:?}", change?); }
    // README end
    Ok(())
}

#[test]
fn the_readmes_election_example_is_the_code_here() {
    let root = redis_lock_testkit::workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = readme
        .split("## Leader election")
        .nth(1)
        .expect("a Leader election section");
    let shown = section
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a Rust block in it");
    let this = include_str!("readme.rs");
    let body = this
        .split("// README begin\n")
        .nth(1)
        .and_then(|rest| rest.split("    // README end").next())
        .unwrap();
    let body: String = body
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        shown, body,
        "README.md's election example differs from this file's"
    );
}
