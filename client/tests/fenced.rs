//! Fenced writes end to end: a holder paused past its lease (SIGSTOP, as a
//! GC pause or swap would) must not be able to write once a later holder
//! has, whatever the data lives in. Each scenario: holder A gets a grant
//! (key, token and fence, exported as `redis-lock run` exports them), its
//! process stops itself before writing; the lease ends; B is granted a
//! higher fence by `redis-lock run` and writes with the same recipe; A
//! resumes and writes: A's write changes nothing, which the test reads
//! back from the data.
//!
//! Recipes: PostgreSQL (a row update `WHERE fence <= $fence`, an upsert
//! that keeps the higher fence, a transaction that locks a fence row
//! first), Redis data through `LOCK.EXEC` (the lock's own node) and through
//! `LOCK.FENCED` (a gate on a data node, the lock on a Redlock group of
//! three other nodes). Also the client's `exec` and `fenced`.

use redis_lock_testkit as common;

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::postgres::Postgres;
use common::Server;
use redis_lock_client::{Error, LockClient, Options};

const BIN: &str = env!("CARGO_BIN_EXE_redis-lock");

/// A's grant: what `redis-lock run` exports to its command.
struct Grant {
    key: String,
    token: String,
    fence: i64,
}

impl Grant {
    fn env(&self) -> [(&'static str, String); 3] {
        [
            ("REDIS_LOCK_KEY", self.key.clone()),
            ("REDIS_LOCK_TOKEN", self.token.clone()),
            ("REDIS_LOCK_FENCE", self.fence.to_string()),
        ]
    }
}

/// Holder A: `sh -c 'kill -STOP $$; WRITE'` with A's grant in its
/// environment, returned once it has stopped.
fn paused_holder(grant: &Grant, write: &str) -> Child {
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("kill -STOP $$; {write}"))
        .envs(grant.env())
        .env("WHO", "A")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    common::wait_until(Duration::from_secs(20), || process_state(pid) == Some('T'));
    child
}

fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Resumes A and waits for its write to finish: its output.
fn resume(child: Child) -> Output {
    let ok = Command::new("kill")
        .args(["-CONT", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    child.wait_with_output().unwrap()
}

/// Holder B: `redis-lock run` on `urls`, running `write` with the grant it
/// exports: its output (the run must succeed).
fn run_holder(urls: &[String], key: &str, write: &str) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("run");
    for u in urls {
        cmd.args(["--url", u]);
    }
    let out = cmd
        .args(["--key", key, "--ttl", "10s", "--wait", "20s", "--"])
        .args(["sh", "-c", write])
        .env("WHO", "B")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "B: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A grant for A on `urls` with a short lease and no renewal.
async fn grant_for_a(urls: &[String], key: &str) -> Grant {
    let options = Options::default().auto_renew(false);
    let locks = LockClient::with_options(urls, options).unwrap();
    // A wait rides through a Redlock node's restart delay (TRYAGAIN).
    let guard = locks
        .acquire(key, Duration::from_millis(400))
        .wait(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free");
    let grant = Grant {
        key: key.into(),
        token: guard.token().into(),
        fence: guard.fence(),
    };
    // Not released: A keeps the lock until its lease ends.
    std::mem::forget(guard);
    grant
}

/// Waits until no node of `urls` holds `key` (A's lease ended).
fn wait_free(nodes: &[&Server], key: &str) {
    common::wait_until(Duration::from_secs(20), || {
        nodes
            .iter()
            .all(|n| common::fence(&mut n.conn(), key).is_none())
    });
}

// ---- PostgreSQL ----

fn recipe_file(dir: &std::path::Path, name: &str, sql: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, sql).unwrap();
    path
}

/// What a PostgreSQL scenario leaves to judge.
struct Stale {
    /// A's fence, and what its stale write printed (its status too).
    a_fence: i64,
    a: Output,
    /// B's fence, as its write saw it (`REDIS_LOCK_FENCE`).
    b_fence: i64,
}

impl Stale {
    /// A's psql ran to its end (exit 0: it reached the server and its SQL
    /// was valid) and printed `rows=0` after its write, if it wrote.
    fn a_ran(&self) -> String {
        let a = text(&self.a);
        assert!(self.a.status.success(), "A's psql failed: {a}");
        a
    }
}

/// Runs one PostgreSQL recipe through the scenario: `sql` is a psql file
/// using `:fence` and `:'who'`; each holder first prints its fence
/// (`A fence=...`), and the recipe `rows=:ROW_COUNT` after its write.
/// B's write must succeed; the caller judges the table and A.
async fn postgres_scenario(pg: &Postgres, sql: &str) -> Stale {
    let s = Server::start();
    let dir = std::env::temp_dir().join(format!("redis-lock-recipe-{}", common::free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = recipe_file(&dir, "write.sql", sql);
    let psql = pg.psql_args().join(" ");
    let write = format!(
        "echo \"$WHO fence=$REDIS_LOCK_FENCE\" && \
         {psql} -v fence=\"$REDIS_LOCK_FENCE\" -v who=\"$WHO\" -f {}",
        file.display()
    );
    let key = "pg:resource";
    let a_grant = grant_for_a(&[s.url()], key).await;
    let a = paused_holder(&a_grant, &write);
    wait_free(&[&s], key);
    let b = text(&run_holder(&[s.url()], key, &write));
    assert!(!b.contains("stale"), "B: {b}");
    let b_fence: i64 = b
        .lines()
        .find_map(|l| l.strip_prefix("B fence="))
        .and_then(|f| f.trim().parse().ok())
        .unwrap_or_else(|| panic!("B printed no fence: {b}"));
    assert!(b_fence > a_grant.fence, "B's grant is the later one");
    let a = resume(a);
    let _ = std::fs::remove_dir_all(&dir);
    Stale {
        a_fence: a_grant.fence,
        a,
        b_fence,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_row_update_with_a_fence_column_refuses_the_stale_holder() {
    let Some(pg) = Postgres::start_or_skip() else {
        return;
    };
    pg.psql(
        "CREATE TABLE accounts (id int PRIMARY KEY, owner text, fence bigint NOT NULL DEFAULT 0);
         INSERT INTO accounts (id, owner) VALUES (1, 'nobody');",
    )
    .unwrap();
    let run = postgres_scenario(
        &pg,
        "UPDATE accounts SET owner = :'who', fence = :fence \
         WHERE id = 1 AND fence <= :fence RETURNING 'updated';\n\
         \\echo rows=:ROW_COUNT\n",
    )
    .await;
    // A's update ran and matched no row: A learns it is stale.
    let a = run.a_ran();
    assert!(a.contains(&format!("A fence={}", run.a_fence)), "A: {a}");
    assert!(a.contains("rows=0") && !a.contains("updated"), "A: {a}");
    assert_eq!(
        pg.psql("SELECT owner || ':' || fence FROM accounts WHERE id = 1")
            .unwrap(),
        format!("B:{}", run.b_fence),
        "the row is B's, with B's fence"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_upsert_keeps_the_higher_fence() {
    let Some(pg) = Postgres::start_or_skip() else {
        return;
    };
    pg.psql("CREATE TABLE settings (k text PRIMARY KEY, v text, fence bigint NOT NULL);")
        .unwrap();
    let run = postgres_scenario(
        &pg,
        "INSERT INTO settings (k, v, fence) VALUES ('mode', :'who', :fence) \
         ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v, fence = EXCLUDED.fence \
         WHERE settings.fence <= EXCLUDED.fence RETURNING 'written';\n\
         \\echo rows=:ROW_COUNT\n",
    )
    .await;
    let a = run.a_ran();
    assert!(a.contains("rows=0") && !a.contains("written"), "A: {a}");
    assert_eq!(
        pg.psql("SELECT v || ':' || fence FROM settings WHERE k = 'mode'")
            .unwrap(),
        format!("B:{}", run.b_fence),
        "the setting is B's, with B's fence"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_transaction_that_locks_the_fence_row_first() {
    let Some(pg) = Postgres::start_or_skip() else {
        return;
    };
    pg.psql(
        "CREATE TABLE fences (resource text PRIMARY KEY, fence bigint NOT NULL);
         INSERT INTO fences VALUES ('stock', 0);
         CREATE TABLE items (sku text PRIMARY KEY, qty int NOT NULL, last_by text);
         INSERT INTO items VALUES ('a', 10, NULL), ('b', 10, NULL);",
    )
    .unwrap();
    let run = postgres_scenario(
        &pg,
        "BEGIN;\n\
         SELECT fence <= :fence AS fresh FROM fences WHERE resource = 'stock' FOR UPDATE \\gset\n\
         \\if :fresh\n\
           UPDATE fences SET fence = :fence WHERE resource = 'stock';\n\
           UPDATE items SET qty = qty - 1, last_by = :'who' WHERE sku IN ('a', 'b');\n\
           \\echo rows=:ROW_COUNT\n\
           COMMIT;\n\
         \\else\n\
           ROLLBACK;\n\
           \\echo stale\n\
         \\endif\n",
    )
    .await;
    // A read the fence row, saw it stale and rolled back: no update ran.
    let a = run.a_ran();
    assert!(a.contains("stale") && !a.contains("rows="), "A: {a}");
    assert_eq!(
        pg.psql("SELECT fence FROM fences WHERE resource = 'stock'")
            .unwrap(),
        run.b_fence.to_string(),
        "the fence row holds B's fence"
    );
    assert_eq!(
        pg.psql(
            "SELECT string_agg(sku || '=' || qty || ':' || last_by, ',' ORDER BY sku) FROM items"
        )
        .unwrap(),
        "a=9:B,b=9:B",
        "only B's transaction changed the items"
    );
}

// ---- Redis ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_exec_refuses_the_stale_holders_write_on_the_locks_node() {
    let s = Server::start();
    let key = "order:17";
    let port = s.port;
    let write = format!(
        "redis-cli -p {port} LOCK.EXEC \"$REDIS_LOCK_KEY\" \"$REDIS_LOCK_TOKEN\" \
         FENCE \"$REDIS_LOCK_FENCE\" SET order:17:state \"paid-by-$WHO\""
    );
    let a_grant = grant_for_a(&[s.url()], key).await;
    let a = paused_holder(&a_grant, &write);
    wait_free(&[&s], key);
    let b = run_holder(&[s.url()], key, &write);
    assert!(text(&b).contains("OK"), "B: {}", text(&b));
    let a = text(&resume(a));
    assert!(a.contains("NOTHELD"), "A: {a}");
    let state: String = redis::cmd("GET")
        .arg("order:17:state")
        .query(&mut s.conn())
        .unwrap();
    assert_eq!(state, "paid-by-B");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_fenced_refuses_the_stale_holder_of_a_redlock_groups_lock() {
    let nodes = Server::redlock_nodes(3, 400);
    let data = Server::start();
    let urls = common::urls(&nodes);
    let key = "report:daily";
    let write = format!(
        "redis-cli -p {} LOCK.FENCED report:gate \"$REDIS_LOCK_FENCE\" SET report:owner \"$WHO\"",
        data.port
    );
    let a_grant = grant_for_a(&urls, key).await;
    let a = paused_holder(&a_grant, &write);
    let refs: Vec<&Server> = nodes.iter().collect();
    wait_free(&refs, key);
    let b = run_holder(&urls, key, &write);
    assert!(text(&b).contains("OK"), "B: {}", text(&b));
    let a = text(&resume(a));
    assert!(a.contains("STALEFENCE"), "A: {a}");
    let mut d = data.conn();
    let owner: String = redis::cmd("GET").arg("report:owner").query(&mut d).unwrap();
    assert_eq!(owner, "B");
    let mark = common::fence(&mut d, "report:gate").unwrap();
    assert!(mark > a_grant.fence, "the gate's mark is B's fence");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_exec_and_fenced_say_not_held_and_stale_as_their_own_errors() {
    let s = Server::start();
    let options = Options::default().auto_renew(false);
    let locks = LockClient::with_options(&[s.url()], options.clone()).unwrap();
    let guard = locks
        .try_acquire("job", Duration::from_millis(300))
        .await
        .unwrap()
        .unwrap();
    let mut set = redis::cmd("SET");
    set.arg("job:out").arg("first");
    let ok: String = guard.exec(&set).await.unwrap();
    assert_eq!(ok, "OK");
    let mut incr = redis::cmd("INCR");
    incr.arg("job:n");
    let n: i64 = guard.exec(&incr).await.unwrap();
    assert_eq!(n, 1);
    tokio::time::sleep(Duration::from_millis(450)).await;
    set.arg("XX");
    match guard.exec::<String>(&set).await {
        Err(Error::NotHeld(why)) => assert!(why.contains("ended") || why.contains("free"), "{why}"),
        other => panic!("expected NotHeld, got {other:?}"),
    }
    // A gate on a data node, with a lock of a Redlock group.
    let nodes = Server::redlock_nodes(3, 300);
    let data = Server::start();
    let group = LockClient::with_options(&common::urls(&nodes), options).unwrap();
    let old = group
        .acquire("g", Duration::from_millis(300))
        .wait(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    let mut write = redis::cmd("SET");
    write.arg("data").arg("x");
    match old.exec::<String>(&write).await {
        Err(Error::Config(why)) => assert!(why.contains("gate"), "{why}"),
        other => panic!("expected Config, got {other:?}"),
    }
    let client = redis::Client::open(data.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let ok: String = old.fenced(&mut conn, "gate", &write).await.unwrap();
    assert_eq!(ok, "OK");
    tokio::time::sleep(Duration::from_millis(450)).await;
    let new = group
        .try_acquire("g", Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    let ok: String = new.fenced(&mut conn, "gate", &write).await.unwrap();
    assert_eq!(ok, "OK");
    match old.fenced::<String, _>(&mut conn, "gate", &write).await {
        Err(Error::StaleFence { fence, mark }) => {
            assert_eq!((fence, mark), (old.fence(), new.fence()));
        }
        other => panic!("expected StaleFence, got {other:?}"),
    }
    drop(guard);
    drop(old);
}

/// Issue 31: `with_lock` hands its closure a `Lease`, which had no `exec`
/// (the blocking facade's closure gets the guard): the async closure could
/// not write under the lock's own check. The lease writes as its guard
/// does, also from a task it was handed to, and not once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_locks_lease_runs_guarded_writes_as_its_guard_does() {
    let s = Server::start();
    let locks = LockClient::new(&[s.url()]).unwrap();
    let kept = locks
        .acquire("job", Duration::from_secs(30))
        .with_lock(|lease| async move {
            let mut set = redis::cmd("SET");
            set.arg("job:out").arg("done");
            let ok: String = lease.exec(&set).await.unwrap();
            assert_eq!(ok, "OK");
            let in_task = lease.clone();
            let n: i64 = tokio::spawn(async move {
                let mut incr = redis::cmd("INCR");
                incr.arg("job:n");
                in_task.exec(&incr).await.unwrap()
            })
            .await
            .unwrap();
            assert_eq!(n, 1);
            lease
        })
        .await
        .unwrap()
        .expect("acquired");
    // Released when the closure returned: the lease writes nothing now.
    let mut set = redis::cmd("SET");
    set.arg("job:out").arg("late");
    match kept.exec::<String>(&set).await {
        Err(Error::NotHeld(_)) => {}
        other => panic!("expected NotHeld, got {other:?}"),
    }
    let out: String = redis::cmd("GET")
        .arg("job:out")
        .query(&mut s.conn())
        .unwrap();
    assert_eq!(out, "done");
}

/// docs/fencing.md's "many rows" recipe, with A paused *inside* its
/// transaction, after its fence check passed (issue 31: the doc did not
/// say what then happens). B, granted once A's lease ended, waits on the
/// row lock A holds; A resumes and commits; then B runs, reading what A
/// wrote. Both decrements land, in that order, and the fence row ends
/// with B's fence: the database serialized the two, as the doc now says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_transaction_paused_after_its_check_commits_before_the_next_holder() {
    let Some(pg) = Postgres::start_or_skip() else {
        return;
    };
    pg.psql(
        "CREATE TABLE fences (resource text PRIMARY KEY, fence bigint NOT NULL);
         INSERT INTO fences VALUES ('stock', 0);
         CREATE TABLE items (sku text PRIMARY KEY, qty int NOT NULL, last_by text);
         INSERT INTO items VALUES ('a', 10, NULL), ('b', 10, NULL);",
    )
    .unwrap();
    let recipe = |pause: &str| {
        format!(
            "BEGIN;\n\
             SELECT fence <= :fence AS fresh FROM fences WHERE resource = 'stock' FOR UPDATE \\gset\n\
             \\if :fresh\n\
               {pause}\
               UPDATE fences SET fence = :fence WHERE resource = 'stock';\n\
               UPDATE items SET qty = qty - 1, last_by = :'who' WHERE sku IN ('a', 'b');\n\
               \\echo rows=:ROW_COUNT\n\
               COMMIT;\n\
             \\else\n\
               ROLLBACK;\n\
               \\echo stale\n\
             \\endif\n"
        )
    };
    let s = Server::start();
    let dir = std::env::temp_dir().join(format!("redis-lock-recipe-{}", common::free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    // A stops itself (psql, the shell's parent) right after its check.
    let a_sql = recipe_file(&dir, "a.sql", &recipe("\\! kill -STOP $PPID\n"));
    let b_sql = recipe_file(&dir, "b.sql", &recipe(""));
    let key = "pg:paused";
    let a_grant = grant_for_a(&[s.url()], key).await;
    let psql = pg.psql_args();
    let a = Command::new(&psql[0])
        .args(&psql[1..])
        .args([
            "-v",
            &format!("fence={}", a_grant.fence),
            "-v",
            "who=A",
            "-f",
        ])
        .arg(&a_sql)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let a_pid = a.id();
    common::wait_until(Duration::from_secs(20), || {
        process_state(a_pid) == Some('T')
    });
    wait_free(&[&s], key);
    // B: granted now, its transaction waits on A's row lock.
    let write = format!(
        "echo \"B fence=$REDIS_LOCK_FENCE\" && {} -v fence=\"$REDIS_LOCK_FENCE\" -v who=B -f {}",
        psql.join(" "),
        b_sql.display()
    );
    let b = Command::new(BIN)
        .args([
            "run",
            "--url",
            &s.url(),
            "--key",
            key,
            "--ttl",
            "10s",
            "--wait",
            "20s",
            "--",
        ])
        .args(["sh", "-c", &write])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_until(Duration::from_secs(20), || {
        pg.psql("SELECT count(*) FROM pg_locks WHERE NOT granted")
            .is_ok_and(|n| n.trim() != "0")
    });
    let a = resume(a);
    let b = b.wait_with_output().unwrap();
    assert!(b.status.success(), "B: {}", text(&b));
    let (a, b) = (text(&a), text(&b));
    assert!(
        a.contains("rows=2") && !a.contains("stale"),
        "A committed: {a}"
    );
    assert!(
        b.contains("rows=2") && !b.contains("stale"),
        "B ran after: {b}"
    );
    let b_fence: i64 = b
        .lines()
        .find_map(|l| l.strip_prefix("B fence="))
        .and_then(|f| f.trim().parse().ok())
        .unwrap();
    assert!(b_fence > a_grant.fence);
    assert_eq!(
        pg.psql("SELECT fence FROM fences WHERE resource = 'stock'")
            .unwrap(),
        b_fence.to_string(),
        "the fence row ends with B's fence"
    );
    assert_eq!(
        pg.psql(
            "SELECT string_agg(sku || '=' || qty || ':' || last_by, ',' ORDER BY sku) FROM items"
        )
        .unwrap(),
        "a=8:B,b=8:B",
        "both decrements landed, A's first"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
