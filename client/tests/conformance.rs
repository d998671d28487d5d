//! The shared conformance suite (clients/conformance/scenarios.json), run by
//! the Rust client. The Python (sync and asyncio) and Node.js (ioredis and
//! node-redis) clients run the same file; a client that differs fails.

use redis_lock_testkit as common;

use std::collections::HashMap;
use std::time::Duration;

use common::Server;
use futures_util::StreamExt;
use redis::Value;
use redis_lock_client::{
    Error, Leadership, Lease, LockClient, LockGuard, Observed, Observer, Options,
};
use serde_json::Value as Json;
use tokio::task::JoinHandle;

fn scenarios() -> Vec<Json> {
    let path = common::workspace_root().join("clients/conformance/scenarios.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: Json = serde_json::from_str(&text).expect("scenarios.json parses");
    doc["scenarios"]
        .as_array()
        .expect("a list of scenarios")
        .clone()
}

fn error_name(e: &Error) -> String {
    match e {
        Error::NotHeld(_) => "NotHeld".into(),
        Error::StaleFence { .. } => "StaleFence".into(),
        Error::ModuleMissing { .. } => "ModuleMissing".into(),
        Error::Redis(r) if r.kind() == redis::ErrorKind::ResponseError => "ServerError".into(),
        other => format!("{other:?}"),
    }
}

/// A reply as the scenarios write it: a status or string as text, an
/// integer, null.
fn as_json(v: &Value) -> Json {
    match v {
        Value::Nil => Json::Null,
        Value::Okay => Json::String("OK".into()),
        Value::SimpleString(s) => Json::String(s.clone()),
        Value::BulkString(b) => Json::String(String::from_utf8_lossy(b).into_owned()),
        Value::Int(i) => Json::from(*i),
        other => Json::String(format!("{other:?}")),
    }
}

fn command(words: &Json) -> redis::Cmd {
    let words = words.as_array().expect("a command");
    let mut cmd = redis::Cmd::new();
    for w in words {
        match w {
            Json::String(s) => cmd.arg(s),
            Json::Number(n) => cmd.arg(n.as_i64().expect("an integer")),
            other => panic!("argument {other}"),
        };
    }
    cmd
}

/// A lease of the scenario: its guard (or leadership) until released, and
/// what later steps read of it.
struct Held {
    guard: Option<Holding>,
    fence: i64,
    token: String,
}

/// What a lease step holds: a lock, or a won campaign.
enum Holding {
    Lock(LockGuard),
    Leader(Leadership),
}

impl Holding {
    fn lease(&self) -> Lease {
        match self {
            Holding::Lock(g) => g.lease(),
            Holding::Leader(l) => l.lease(),
        }
    }

    async fn release(self) -> bool {
        match self {
            Holding::Lock(g) => g.release().await.unwrap_or(false),
            Holding::Leader(l) => l.resign().await.unwrap_or(false),
        }
    }
}

fn held_leader(l: Leadership) -> Held {
    let lease = l.lease();
    Held {
        fence: lease.fence(),
        token: lease.token().to_string(),
        guard: Some(Holding::Leader(l)),
    }
}

/// A leader as the scenarios write it: vacant, or `{fence_of, value}`.
fn expected_leader(want: &Json, leases: &HashMap<String, Held>) -> Observed {
    match want {
        Json::String(s) if s == "vacant" => Observed::Vacant,
        Json::Object(o) => Observed::Leader(redis_lock_client::Leader {
            fence: leases[o["fence_of"].as_str().unwrap()].fence,
            value: o["value"].as_str().map(String::from),
        }),
        other => panic!("a leader: {other}"),
    }
}

/// A campaign's outcome against the step's `expect` or `expect_error`;
/// the lease it won is kept under `as`.
fn check_campaign(
    step: &Json,
    at: &str,
    got: redis_lock_client::Result<Option<Leadership>>,
    leases: &mut HashMap<String, Held>,
) {
    match step["expect_error"].as_str() {
        Some(want) => {
            let e = got.err().unwrap_or_else(|| panic!("{at}: no error"));
            assert_eq!(error_name(&e), want, "{at}: {e:?}");
        }
        None => match (
            got.unwrap_or_else(|e| panic!("{at}: {e:?}")),
            step["expect"].as_str(),
        ) {
            (Some(l), Some("granted")) => {
                leases.insert(step["as"].as_str().unwrap().into(), held_leader(l));
            }
            (None, Some("not_granted")) => {}
            (got, want) => panic!("{at}: {:?} for {want:?}", got.map(|l| l.fence())),
        },
    }
}

async fn run(scenario: &Json) {
    let name = scenario["name"].as_str().unwrap();
    let server = match scenario["server"].as_str() {
        Some("plain") => Server::builder().without_module().start(),
        _ => Server::start(),
    };
    let renewing =
        LockClient::with_options(&[server.url()], Options::default().auto_renew(true)).unwrap();
    let still =
        LockClient::with_options(&[server.url()], Options::default().auto_renew(false)).unwrap();
    let data = redis::Client::open(server.url()).unwrap();
    let mut conn = data.get_multiplexed_async_connection().await.unwrap();
    let mut leases: HashMap<String, Held> = HashMap::new();
    let mut campaigns: HashMap<String, JoinHandle<redis_lock_client::Result<Option<Leadership>>>> =
        HashMap::new();
    let mut observers: HashMap<String, Observer> = HashMap::new();
    for (i, step) in scenario["steps"].as_array().unwrap().iter().enumerate() {
        let at = format!("{name}, step {i} {step}");
        let ms = |field: &str| Duration::from_millis(step[field].as_u64().unwrap_or(0));
        match step["do"].as_str().unwrap() {
            "acquire" => {
                let locks = match step["renew"].as_bool() {
                    Some(false) => &still,
                    _ => &renewing,
                };
                let keys: Vec<String> = match step["keys"].as_array() {
                    Some(keys) => keys
                        .iter()
                        .map(|k| k.as_str().unwrap().to_string())
                        .collect(),
                    None => vec![step["key"].as_str().unwrap().to_string()],
                };
                let ttl = ms("ttl_ms");
                let mut acquire = match keys.len() {
                    1 => locks.acquire(&keys[0], ttl),
                    _ => locks.acquire_all(&keys, ttl),
                };
                acquire = acquire.wait(ms("timeout_ms"));
                if step["shared"].as_bool() == Some(true) {
                    acquire = acquire.shared();
                }
                if let Some(n) = step["limit"].as_u64() {
                    acquire = acquire.limit(n as u32);
                }
                if let Some(of) = step["token_of"].as_str() {
                    acquire = acquire.token(leases[of].token.clone());
                }
                let got = acquire.await;
                match step["expect_error"].as_str() {
                    Some(want) => {
                        let e = got.err().unwrap_or_else(|| panic!("{at}: no error"));
                        assert_eq!(error_name(&e), want, "{at}: {e:?}");
                    }
                    None => {
                        let got = got.unwrap_or_else(|e| panic!("{at}: {e:?}"));
                        match step["expect"].as_str() {
                            Some("granted") => {
                                let guard = got.unwrap_or_else(|| panic!("{at}: not granted"));
                                let held = Held {
                                    fence: guard.fence(),
                                    token: guard.token().to_string(),
                                    guard: Some(Holding::Lock(guard)),
                                };
                                leases.insert(step["as"].as_str().unwrap().into(), held);
                            }
                            _ => assert!(got.is_none(), "{at}: granted"),
                        }
                    }
                }
            }
            "release" => {
                let held = leases.get_mut(step["lease"].as_str().unwrap()).unwrap();
                let guard = held.guard.take().expect("not released yet");
                let released = guard.release().await;
                assert_eq!(Json::Bool(released), step["expect"], "{at}");
            }
            kind @ ("exec" | "fenced") => {
                let held = &leases[step["lease"].as_str().unwrap()];
                let guard = held.guard.as_ref().expect("held").lease();
                let cmd = command(&step["command"]);
                let got: redis_lock_client::Result<Value> = match kind {
                    "exec" => guard.exec(&cmd).await,
                    _ => {
                        guard
                            .fenced(&mut conn, step["gate"].as_str().unwrap(), &cmd)
                            .await
                    }
                };
                match step["expect_error"].as_str() {
                    Some(want) => {
                        let e = got.err().unwrap_or_else(|| panic!("{at}: no error"));
                        assert_eq!(error_name(&e), want, "{at}: {e:?}");
                    }
                    None => assert_eq!(as_json(&got.unwrap()), step["expect"], "{at}"),
                }
            }
            "sleep_ms" => tokio::time::sleep(ms("ms")).await,
            "wait_lost" => {
                let guard = leases[step["lease"].as_str().unwrap()]
                    .guard
                    .as_ref()
                    .unwrap()
                    .lease();
                let lost = tokio::time::timeout(ms("within_ms"), guard.lost().cancelled()).await;
                assert!(lost.is_ok(), "{at}: not lost in time");
            }
            "expect_valid" => {
                let guard = leases[step["lease"].as_str().unwrap()]
                    .guard
                    .as_ref()
                    .unwrap()
                    .lease();
                assert_eq!(Json::Bool(guard.is_valid()), step["valid"], "{at}");
            }
            "fence_order" => {
                let (earlier, later) = (
                    step["earlier"].as_str().unwrap(),
                    step["later"].as_str().unwrap(),
                );
                assert!(leases[later].fence > leases[earlier].fence, "{at}");
            }
            "same_fence" => {
                let (a, b) = (step["a"].as_str().unwrap(), step["b"].as_str().unwrap());
                assert_eq!(leases[a].fence, leases[b].fence, "{at}");
            }
            "cancelled_wait" => {
                let waiting = renewing
                    .acquire(step["key"].as_str().unwrap(), ms("ttl_ms"))
                    .wait(Duration::from_secs(30));
                let cut = tokio::time::timeout(
                    ms("cancel_after_ms"),
                    std::future::IntoFuture::into_future(waiting),
                )
                .await;
                assert!(cut.is_err(), "{at}: the wait ended before it was cancelled");
            }
            "server" => {
                let got: Value = command(&step["command"])
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                match step["expect_fence_of"].as_str() {
                    Some(of) => assert_eq!(as_json(&got), Json::from(leases[of].fence), "{at}"),
                    None => assert_eq!(as_json(&got), step["expect"], "{at}"),
                }
            }
            "server_info" => {
                let field = step["field"].as_str().unwrap();
                assert_eq!(Json::from(server.info_field(field)), step["expect"], "{at}");
            }
            "campaign" => {
                let locks = renewing.clone();
                let (key, value) = (
                    step["key"].as_str().unwrap(),
                    step["value"].as_str().unwrap(),
                );
                let (key, value, ttl, wait) = (
                    key.to_string(),
                    value.to_string(),
                    ms("ttl_ms"),
                    ms("timeout_ms"),
                );
                let renew = step["renew"].as_bool() != Some(false);
                let campaign = async move {
                    locks
                        .election(key)
                        .renew(renew)
                        .try_campaign(value, ttl, wait)
                        .await
                };
                match step["background"].as_bool() {
                    Some(true) => {
                        let name = step["as"].as_str().unwrap().to_string();
                        campaigns.insert(name, tokio::spawn(campaign));
                    }
                    _ => check_campaign(step, &at, campaign.await, &mut leases),
                }
            }
            "campaigned" => {
                let handle = campaigns.remove(step["as"].as_str().unwrap()).unwrap();
                let got = tokio::time::timeout(ms("within_ms"), handle)
                    .await
                    .unwrap_or_else(|_| panic!("{at}: not ended in time"))
                    .unwrap();
                check_campaign(step, &at, got, &mut leases);
            }
            "proclaim" => {
                let held = &leases[step["as"].as_str().unwrap()];
                let Some(Holding::Leader(l)) = &held.guard else {
                    panic!("{at}: not a campaign's lease")
                };
                let got = l.proclaim(step["value"].as_str().unwrap()).await;
                match step["expect_error"].as_str() {
                    Some(want) => {
                        let e = got.err().unwrap_or_else(|| panic!("{at}: no error"));
                        assert_eq!(error_name(&e), want, "{at}: {e:?}");
                    }
                    None => assert!(got.unwrap_or_else(|e| panic!("{at}: {e:?}")), "{at}: lost"),
                }
            }
            "leader" => {
                let got = renewing
                    .election(step["key"].as_str().unwrap())
                    .leader()
                    .await;
                let got = match got.unwrap_or_else(|e| panic!("{at}: {e:?}")) {
                    Some(l) => Observed::Leader(l),
                    None => Observed::Vacant,
                };
                assert_eq!(got, expected_leader(&step["expect"], &leases), "{at}");
            }
            "observe" => {
                let o = renewing.election(step["key"].as_str().unwrap()).observe();
                observers.insert(step["as"].as_str().unwrap().into(), o);
            }
            "observed" => {
                let o = observers.get_mut(step["as"].as_str().unwrap()).unwrap();
                let next = tokio::time::timeout(ms("within_ms"), o.next()).await;
                match &step["expect"] {
                    Json::String(s) if s == "nothing" => {
                        assert!(next.is_err(), "{at}: told {next:?}")
                    }
                    want => {
                        let got = next
                            .unwrap_or_else(|_| panic!("{at}: nothing told in time"))
                            .expect("the stream goes on")
                            .unwrap_or_else(|e| panic!("{at}: {e:?}"));
                        assert_eq!(got, expected_leader(want, &leases), "{at}");
                    }
                }
            }
            other => panic!("unknown step {other}"),
        }
    }
    // Whatever is still held goes now (a guard dropped releases too).
    drop(observers);
    for (_, campaign) in campaigns {
        campaign.abort();
    }
    for (_, held) in leases {
        if let Some(g) = held.guard {
            let _ = g.release().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_of_the_shared_suite() {
    if common::skip_unless(
        common::Needs::OwnServer,
        "a server per scenario, one without the module",
    ) {
        return;
    }
    let all = scenarios();
    assert!(all.len() >= 10);
    for scenario in &all {
        run(scenario).await;
    }
}
