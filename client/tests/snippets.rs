//! The snippets of docs/clients.md and docs/migrating.md, run against real
//! servers with the module: each file under docs/snippets/ runs as its own
//! process with the server's URL in `REDIS_URL` (`REDIS_URLS` for Redlock),
//! and its output is checked line by line. The docs show those files
//! verbatim (checked here too; `SNIPPETS_BLESS=1` rewrites their blocks
//! from the files).
//!
//! redis-py and the Node libraries are installed on first use under
//! target/snippet-deps/ (`pip install --target`, `npm install --prefix`).
//! If the registry cannot be reached, that snippet's test says so and
//! passes without running it; any other install failure fails the test.

use redis_lock_testkit as common;

#[path = "../../docs/snippets/rust_lock_client.rs"]
mod rust_lock_client;
#[path = "../../docs/snippets/rust_redis.rs"]
mod rust_redis;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use common::{urls, workspace_root, Server};

/// Pinned so a new release cannot change what the snippets do unnoticed.
const PYTHON_DEPS: &[&str] = &["redis==8.1.0"];
const NODE_DEPS: &[&str] = &["ioredis@5.11.1", "redis@5.9.0"];

const LOCK_KEY: &str = "lock:invoice:42";

fn snippet(name: &str) -> PathBuf {
    workspace_root().join("docs/snippets").join(name)
}

/// Runs a snippet; its stdout, or a panic with both streams.
fn run(what: &str, cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    stdout
}

/// The lines of `out` that start with one of `prefixes`, in order, with
/// each fencing token (a run of 13+ digits) replaced by the name the
/// caller gives it, e.g. `<A>`: the transcript a test compares.
fn transcript(out: &str, prefixes: &[&str], names: &[(i64, &str)]) -> Vec<String> {
    out.lines()
        .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
        .map(|l| {
            let mut l = l.to_string();
            for (fence, name) in names {
                l = l.replace(&fence.to_string(), &format!("<{name}>"));
            }
            l
        })
        .collect()
}

/// The number after `prefix` on the first line that starts with it.
fn number_after(out: &str, prefix: &str) -> i64 {
    let line = out
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{out}"));
    line[prefix.len()..]
        .split(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())
        .unwrap_or_else(|| panic!("no number in {line:?}"))
        .parse()
        .unwrap()
}

// ------------------------------------------------------------ installs

static INSTALLING: Mutex<()> = Mutex::new(());

/// Network failures of pip and npm: only these let a test skip.
const UNREACHABLE: &[&str] = &[
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Max retries exceeded",
    "ConnectTimeoutError",
    "ENOTFOUND",
    "EAI_AGAIN",
    "ECONNREFUSED",
    "ENETUNREACH",
    "ETIMEDOUT",
];

/// Installs `deps` under target/snippet-deps/<name>-<deps> once: into a
/// fresh directory that is renamed into place when complete, so parallel
/// runs never see half an install. None if the registry is unreachable.
fn install(kind: &str, deps: &[&str]) -> Option<PathBuf> {
    let _one_at_a_time = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    let tag: String = format!("{kind}-{}", deps.join("-"))
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let base = workspace_root().join("target/snippet-deps");
    let dir = base.join(&tag);
    if dir.exists() {
        return Some(dir);
    }
    let tmp = base.join(format!("{tag}.partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let mut cmd = match kind {
        "python" => {
            let mut c = Command::new("python3");
            c.args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-warn-script-location",
            ])
            .arg("--target")
            .arg(&tmp);
            c
        }
        _ => {
            let mut c = Command::new("npm");
            c.args(["install", "--no-audit", "--no-fund", "--prefix"])
                .arg(&tmp);
            c
        }
    };
    eprintln!("installing {} into {}", deps.join(" "), dir.display());
    let out = cmd
        .args(deps)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the {kind} installer: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        if UNREACHABLE.iter().any(|m| stderr.contains(m)) || !registry_reachable(kind) {
            common::skip(
                common::Skip::Missing,
                &format!(
                    "the {kind} package registry cannot be reached, so this \
                     snippet did not run. The installer said: {stderr}"
                ),
            );
            return None;
        }
        panic!("installing {} failed:\n{stderr}", deps.join(" "));
    }
    // Another process may have finished first: keep its copy.
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
        assert!(dir.exists(), "could not move the install into {dir:?}");
    }
    Some(dir)
}

/// Whether a TCP connection to the installer's registry opens (asked only
/// after an install failed, to tell "offline" from a real failure).
fn registry_reachable(kind: &str) -> bool {
    let configured = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|url| url.contains("://"))
    };
    let url = match kind {
        "python" => std::env::var("PIP_INDEX_URL")
            .ok()
            .or_else(|| {
                configured(
                    "python3",
                    &["-m", "pip", "config", "get", "global.index-url"],
                )
            })
            .unwrap_or_else(|| "https://pypi.org/simple".into()),
        _ => configured("npm", &["config", "get", "registry"])
            .unwrap_or_else(|| "https://registry.npmjs.org/".into()),
    };
    let (scheme, rest) = url.split_once("://").unwrap_or(("https", &url));
    let authority = rest.split('/').next().unwrap_or_default();
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let address = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:{}", if scheme == "http" { 80 } else { 443 })
    };
    use std::net::ToSocketAddrs;
    let reachable = address.to_socket_addrs().is_ok_and(|mut addrs| {
        addrs.any(|a| {
            std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(5)).is_ok()
        })
    });
    if !reachable {
        eprintln!("{url} ({address}) cannot be reached");
    }
    reachable
}

// ------------------------------------------------------------ the docs

/// The docs that show snippets.
const DOCS: &[&str] = &["docs/clients.md", "docs/migrating.md"];

/// A doc marks each block that shows a file with
/// `<!-- snippet: docs/snippets/NAME -->` on the line before its fence,
/// and a block that shows a snippet's output with `<!-- output: ... -->`.
/// Returns (file, the block's text, the byte range of the text in the doc).
fn marked_blocks(doc: &str, kind: &str) -> Vec<(String, String, std::ops::Range<usize>)> {
    let mark = format!("<!-- {kind}: ");
    let mut blocks = vec![];
    let mut at = 0;
    while let Some(found) = doc[at..].find(&mark) {
        let start = at + found + mark.len();
        let end = start + doc[start..].find(" -->").expect("unterminated marker");
        let file = doc[start..end].to_string();
        let fence_line = end + doc[end..].find('\n').unwrap() + 1;
        assert!(
            doc[fence_line..].starts_with("```"),
            "the marker for {file} must be followed by a ``` block"
        );
        let body = fence_line + doc[fence_line..].find('\n').unwrap() + 1;
        let close = if doc[body..].starts_with("```\n") {
            body // an empty block
        } else {
            body + doc[body..]
                .find("\n```\n")
                .map(|i| i + 1)
                .unwrap_or_else(|| panic!("unclosed block for {file}"))
        };
        blocks.push((file, doc[body..close].to_string(), body..close));
        at = close;
    }
    blocks
}

#[test]
fn docs_show_every_snippet_file_verbatim() {
    let bless = std::env::var_os("SNIPPETS_BLESS").is_some();
    let mut shown = vec![];
    for doc_name in DOCS {
        let path = workspace_root().join(doc_name);
        let mut doc = std::fs::read_to_string(&path).unwrap();
        let blocks = marked_blocks(&doc, "snippet");
        assert!(!blocks.is_empty(), "{doc_name} shows no snippet file");
        let mut stale = vec![];
        for (file, text, range) in blocks.iter().rev() {
            let source = std::fs::read_to_string(workspace_root().join(file))
                .unwrap_or_else(|e| panic!("{doc_name} shows {file}, which cannot be read: {e}"));
            if &source != text {
                stale.push(file.clone());
                if bless {
                    doc.replace_range(range.clone(), &source);
                }
            }
        }
        if bless && !stale.is_empty() {
            std::fs::write(&path, &doc).unwrap();
            eprintln!("rewrote the blocks of {stale:?} in {doc_name}");
            stale.clear();
        }
        assert!(
            stale.is_empty(),
            "{doc_name} differs from {stale:?}: edit the file under docs/snippets/, then \
             SNIPPETS_BLESS=1 cargo test -p redis-lock-client --test snippets"
        );
        shown.extend(blocks.into_iter().map(|(f, _, _)| f));
    }
    for entry in std::fs::read_dir(workspace_root().join("docs/snippets")).unwrap() {
        let name = format!(
            "docs/snippets/{}",
            entry.unwrap().file_name().to_string_lossy()
        );
        assert!(shown.contains(&name), "{name} is not shown in {DOCS:?}");
    }
}

/// The output docs/clients.md shows for a snippet, as lines.
fn documented_output(file: &str) -> Vec<String> {
    let doc = std::fs::read_to_string(workspace_root().join("docs/clients.md")).unwrap();
    let (_, text, _) = marked_blocks(&doc, "output")
        .into_iter()
        .find(|(f, _, _)| f == &format!("docs/snippets/{file}"))
        .unwrap_or_else(|| panic!("docs/clients.md shows no output of {file}"));
    text.lines().map(str::to_string).collect()
}

// ------------------------------------------------------------ Python

#[test]
fn python_redis_py_waits_fences_renews_and_releases() {
    let Some(deps) = install("python", PYTHON_DEPS) else {
        return;
    };
    let s = Server::start();
    let handoffs = s.info_field("handoffs"); // counters are relative: the server may be shared
    let out = run(
        "python_redis_py.py",
        Command::new("python3")
            .arg(snippet("python_redis_py.py"))
            .env("PYTHONPATH", &deps)
            .env("REDIS_URL", format!("{}0", s.url())),
    );
    let a = number_after(&out, "A acquired: fence");
    let b = number_after(&out, "B acquired: fence");
    assert!(b > a, "B's fence {b} must be above A's {a}");
    let lines = transcript(&out, &["A ", "B ", "invoice"], &[(a, "A"), (b, "B")]);
    assert_eq!(lines, documented_output("python_redis_py.py"), "{out}");
    assert_eq!(
        lines,
        [
            "A acquired: fence <A>",
            "A writes: True",
            "B acquired: fence <B>",
            "B writes: True",
            "B renewed: True lost: False",
            "A writes: False",
            "A extends: False",
            "A releases: False",
            "B releases: True",
            "invoice 42: ('refunded', <B>)",
        ],
        "{out}"
    );
    // B waited in line (BLOCK) and was handed the lock when A's lease ended.
    assert_eq!(s.info_field("handoffs") - handoffs, 1);
    assert_eq!(common::fence(&mut s.conn(), LOCK_KEY), None);
}

#[test]
fn python_fenced_lock_replaces_redis_py_lock_on_the_same_key() {
    let Some(deps) = install("python", PYTHON_DEPS) else {
        return;
    };
    let s = Server::start();
    let out = run(
        "python_fenced_lock.py",
        Command::new("python3")
            .arg(snippet("python_fenced_lock.py"))
            .env("PYTHONPATH", &deps)
            .env("REDIS_URL", format!("{}0", s.url())),
    );
    let fence = number_after(&out, "new FencedLock acquires: True fence");
    assert_eq!(
        transcript(&out, &["old", "new"], &[(fence, "F")]),
        [
            "old Lock acquires: True",
            "new FencedLock acquires: True fence <F>",
            "old Lock acquires: False",
            "new extends: True",
            "new releases: True",
            "new releases again: False",
        ],
        "{out}"
    );
    // Released, and nothing left behind by either kind of lock.
    assert_eq!(common::fence(&mut s.conn(), "invoice:42"), None);
}

// ------------------------------------------------------------ Node.js

fn node(s: &Server, deps: &Path, file: &str) -> String {
    run(
        file,
        Command::new("node")
            .arg(snippet(file))
            .env("NODE_PATH", deps.join("node_modules"))
            .env("REDIS_URL", format!("{}0", s.url())),
    )
}

#[test]
fn node_ioredis_waits_fences_renews_and_releases() {
    let Some(deps) = install("node", NODE_DEPS) else {
        return;
    };
    let s = Server::start();
    let handoffs = s.info_field("handoffs");
    let out = node(&s, &deps, "node_ioredis.js");
    let a = number_after(&out, "A acquired: fence");
    let b = number_after(&out, "B acquired: fence");
    assert!(b > a, "B's fence {b} must be above A's {a}");
    assert_eq!(
        transcript(&out, &["A ", "B ", "invoice"], &[(a, "A"), (b, "B")]),
        [
            "A acquired: fence <A>",
            "A writes: true",
            "B acquired: fence <B>",
            "B extends: true",
            "B writes: true",
            "A writes: false",
            "A extends: false",
            "A releases: false",
            "B releases: true",
            "invoice 42: refunded <B>",
        ],
        "{out}"
    );
    assert_eq!(s.info_field("handoffs") - handoffs, 1);
    assert_eq!(common::fence(&mut s.conn(), LOCK_KEY), None);
}

#[test]
fn node_redis_hands_the_lock_to_a_blocked_waiter() {
    let Some(deps) = install("node", NODE_DEPS) else {
        return;
    };
    let s = Server::start();
    let grants = s.info_field("grants");
    let out = node(&s, &deps, "node_redis.js");
    let first = number_after(&out, "holder acquired: fence");
    let next = number_after(&out, "next acquired: fence");
    assert!(next > first, "{out}");
    assert_eq!(
        transcript(&out, &["holder", "next"], &[(first, "1"), (next, "2")]),
        [
            "holder acquired: fence <1>",
            "holder is the holder",
            "holder extends: 1",
            "holder releases: 1",
            "next acquired: fence <2> (higher)",
            "next releases: 1",
        ],
        "{out}"
    );
    assert_eq!(s.info_field("grants") - grants, 2);
    assert_eq!(common::fence(&mut s.conn(), "lock:report"), None);
}

#[test]
fn node_redlock_gives_the_group_one_fence() {
    if std::env::var_os("REDIS_LOCK_TEST_URL").is_some() {
        common::skip(
            common::Skip::NotInThisMode,
            "the Redlock snippet needs three servers, not REDIS_LOCK_TEST_URL's one",
        );
        return;
    }
    let Some(deps) = install("node", NODE_DEPS) else {
        return;
    };
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    // The first node's fence mark runs an hour ahead of the others (as if
    // its clock had been ahead): the group must still agree on one token.
    let mut c = servers[0].conn();
    let now: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg("probe")
        .arg("t")
        .arg(1000)
        .query(&mut c)
        .unwrap();
    let ahead = now + 3_600_000_000;
    let _: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg("raise")
        .arg("t")
        .arg(1000)
        .arg("MINFENCE")
        .arg(ahead)
        .query(&mut c)
        .unwrap();
    let urls = urls(&servers);
    let out = run(
        "node_redlock.js",
        Command::new("node")
            .arg(snippet("node_redlock.js"))
            .env("NODE_PATH", deps.join("node_modules"))
            .env("REDIS_URLS", urls.join(",")),
    );
    let a = number_after(&out, "A acquired on 3 of 3 nodes: fence");
    let c_fence = number_after(&out, "C acquired: fence");
    assert!(
        a > ahead,
        "A's fence {a} must be above the raised mark {ahead}"
    );
    assert_eq!(
        transcript(
            &out,
            &["A ", "B ", "C ", "every"],
            &[(a, "A"), (c_fence, "C")]
        ),
        [
            "A acquired on 3 of 3 nodes: fence <A>",
            "every node has fence <A>",
            "B acquired: false",
            "A extends: true",
            "A releases: true",
            "C acquired: fence <C> (above A's)",
            "C releases: true",
        ],
        "{out}"
    );
    for s in &servers {
        assert_eq!(common::fence(&mut s.conn(), "invoice:42"), None);
    }
}

// ------------------------------------------------------------ Rust

/// The Rust snippets are compiled into this test binary (as modules) and
/// run in a child process of it, so each has its own environment and exit.
fn rust_child(s: &Server, test: &str) -> String {
    run(
        test,
        Command::new(std::env::current_exe().unwrap())
            .args([
                test,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
                "-q",
            ])
            .env("SNIPPET_CHILD", "1")
            .env("REDIS_URL", s.url()),
    )
}

#[test]
#[ignore = "run in a child process by rust_redis_crate_waits_fences_and_releases"]
fn child_rust_redis() {
    if std::env::var_os("SNIPPET_CHILD").is_some() {
        rust_redis::main().unwrap();
    }
}

#[test]
#[ignore = "run in a child process by rust_lock_client_acquires_renews_and_releases"]
fn child_rust_lock_client() {
    if std::env::var_os("SNIPPET_CHILD").is_some() {
        rust_lock_client::main().unwrap();
    }
}

#[test]
fn rust_redis_crate_waits_fences_and_releases() {
    let s = Server::start();
    let handoffs = s.info_field("handoffs");
    let out = rust_child(&s, "child_rust_redis");
    let a = number_after(&out, "A acquired: fence");
    let b = number_after(&out, "B acquired: fence");
    assert!(b > a, "{out}");
    assert_eq!(
        transcript(&out, &["A ", "B "], &[(a, "A"), (b, "B")]),
        [
            "A acquired: fence <A>",
            "B acquired: fence <B>",
            "B extends: true",
            "B writes: true",
            "A writes: false",
            "A extends: false",
            "A releases: false",
            "B releases: true",
        ],
        "{out}"
    );
    assert_eq!(s.info_field("handoffs") - handoffs, 1);
    assert_eq!(common::fence(&mut s.conn(), LOCK_KEY), None);
}

#[test]
fn rust_lock_client_acquires_renews_and_releases() {
    let s = Server::start();
    let out = rust_child(&s, "child_rust_lock_client");
    let first = number_after(&out, "acquired: fence");
    assert_eq!(
        transcript(
            &out,
            &["acquired", "second", "extends", "releases", "with_lock"],
            &[(first, "1")]
        ),
        [
            "acquired: fence <1>",
            "second try_acquire: busy",
            "extends: true",
            "releases: true",
            &format!(
                "with_lock: fence {} higher: true",
                number_after(&out, "with_lock: fence")
            ),
        ],
        "{out}"
    );
    assert!(number_after(&out, "with_lock: fence") > first);
    assert_eq!(common::fence(&mut s.conn(), LOCK_KEY), None);
}

// ------------------------------------------------------------ redis-lock

#[test]
fn redis_lock_command_runs_a_program_and_holds_across_steps() {
    let s = Server::start();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_redis-lock"))
        .parent()
        .unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = run(
        "redis_lock_command.sh",
        Command::new("sh")
            .arg("-e")
            .arg(snippet("redis_lock_command.sh"))
            .env("PATH", path)
            .env("REDIS_URL", s.url()),
    );
    let run_fence = number_after(&out, "nightly job runs with fence");
    let step_fence = number_after(&out, "step 1 with fence");
    assert!(step_fence > run_fence, "{out}");
    assert_eq!(
        transcript(
            &out,
            &["nightly", "step", "extended", "released"],
            &[(run_fence, "1"), (step_fence, "2")]
        ),
        [
            "nightly job runs with fence <1>",
            "step 1 with fence <2>",
            "extended",
            "released",
        ],
        "{out}"
    );
    assert_eq!(common::fence(&mut s.conn(), "job:nightly"), None);
}
