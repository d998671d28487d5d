//! `redis-lock`: run any program under a lock, or hold one across the
//! steps of a script. See `redis-lock --help`.

// The same unsafe discipline as the module: every unsafe block says why
// it is sound, and an unsafe fn's body is not one unsafe block. Unsafe code
// only in `sys` (every system call) and `job` (the fork and the pre-exec,
// whose soundness depends on what follows them).
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
// Doc comments on the arguments are --help text (URLs with [user@]), not rustdoc.
#![allow(rustdoc::broken_intra_doc_links)]

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use redis_lock_client::{drift, Acquire, Keys, LockClient, Options};

use doctor::{doctor, warn_unsafe_group};
use run::run_under_lock;

mod doctor;
mod duration;
mod exporter;
#[allow(unsafe_code)]
mod job;
mod run;
#[allow(unsafe_code)]
mod sys;
mod top;

/// Exit codes besides the child's own status.
mod exit {
    /// Usage errors (bad flags, durations).
    pub const USAGE: u8 = 64;
    /// The lock nodes could not be reached or answered with an error.
    pub const UNAVAILABLE: u8 = 69;
    /// Not acquired within --wait (or not held, for release/extend), or a
    /// node refused for now (TRYAGAIN during its restart delay): try again.
    pub const NOT_ACQUIRED: u8 = 75;
    /// A node refused the user the command or the key (NOPERM).
    pub const NO_PERMISSION: u8 = 77;
    /// `doctor` found something to fix in the deployment.
    pub const CONFIG: u8 = 78;
    /// The lock was lost while the command ran; it was signalled.
    pub const LOST: u8 = 76;
    /// The command could not be started.
    pub const CANNOT_RUN: u8 = 126;
    pub const NOT_FOUND: u8 = 127;
}

#[derive(Parser)]
#[command(
    name = "redis-lock",
    version,
    about = "Run a command under a lock held in Redis (the redis-lock module), or hold one across the steps of a script.",
    after_help = "\
Examples:
  # Run a nightly job on at most one machine at a time; wait up to 10 s for the lock.
  redis-lock run --url redis://10.0.0.5:6379/ --key job:nightly --ttl 30s --wait 10s -- ./nightly.sh

  # Redlock over five independent nodes (a majority must grant).
  redis-lock run --url redis://n1:6379/ --url redis://n2:6379/ --url redis://n3:6379/ \\
                 --url redis://n4:6379/ --url redis://n5:6379/ --key deploy --ttl 1m -- make deploy

  # Hold a lock across the steps of a shell script.
  eval \"$(redis-lock acquire --key orders:42 --ttl 30s --wait 5s)\"
  ./step1 --fence \"$REDIS_LOCK_FENCE\" && redis-lock extend --key orders:42 --token \"$REDIS_LOCK_TOKEN\" --ttl 30s
  ./step2 --fence \"$REDIS_LOCK_FENCE\"
  redis-lock release --key orders:42 --token \"$REDIS_LOCK_TOKEN\"

The command gets REDIS_LOCK_FENCE (the fencing token: pass it to the resource
you protect), REDIS_LOCK_TOKEN, REDIS_LOCK_KEY (the first --key), REDIS_LOCK_KEYS
(every --key, one per line) and REDIS_LOCK_VALIDITY_MS (the lock's validity
when the command started; renewals extend it) in its environment. Several
--key options make one lock over all of them, taken all or nothing with one
fencing token (callers naming them in any order cannot deadlock). The job
is every process the command starts (its process group, and descendants
outside it: a shell's jobs, setsid children, daemons), and no
process of it runs without the lock: the job ends with the command (what it
left running gets SIGTERM, then SIGKILL after --grace, 10s by default) and
the lock is held until all of them have exited; they are killed if
redis-lock dies (even by SIGKILL); the job runs as
the terminal's foreground job (it may read the terminal; Ctrl-C and Ctrl-Z
reach it, and Ctrl-Z stops redis-lock, and the script or make that runs it,
with it); once continued, redis-lock
renews the lock before the command may run again. Signals sent to redis-lock
(TERM, INT, HUP, QUIT, USR1, USR2, ALRM, ...) are passed on to the job, and
the lock is released once the job has exited.

Exit status: the command's own status (128+N if killed by signal N); 64 usage
error (also a TTL a node refuses, or a key holding another type); 69 lock
nodes unreachable (or without the module); 75 (or --conflict-exit-code) not acquired within --wait, or
a node asked to try again later (its restart delay, a full line), or, for
release/extend, the lock was not held; 76 (or --lost-exit-code) the lock was lost, or its validity
ran out, before the job ended (the group got SIGTERM as soon as the lock could not be kept, then SIGKILL halfway
to the end of the lease's validity, or after --grace); 77 authentication failed or permission denied (ACL);
126/127 the command could not be run / was not found.
Durations: 1500ms, 30s, 2m, 1h, 1m30s (a bare number is seconds)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

impl Nodes {
    /// The lock's keys, as the client takes them.
    fn lock_keys(&self) -> Keys {
        Keys::from(&self.keys[..])
    }

    /// An acquisition in the mode asked for (--shared, --limit: a limit
    /// is a shared key's).
    fn mode<'a>(&self, acquisition: Acquire<'a>) -> Acquire<'a> {
        match (self.shared, self.limit) {
            (_, Some(n)) => acquisition.limit(n),
            (true, None) => acquisition.shared(),
            (false, None) => acquisition,
        }
    }
}

/// `REDIS_LOCK_KEYS`: every key of the lock, one per line.
fn keys_env(keys: &Keys) -> String {
    keys.as_slice().join("\n")
}

/// The keys as a JSON array.
fn json_keys(keys: &Keys) -> String {
    let items: Vec<String> = keys.as_slice().iter().map(|k| json_string(k)).collect();
    format!("[{}]", items.join(","))
}

#[derive(Args)]
struct Nodes {
    /// A lock node, as redis://[user:password@]host:port/[db]. Give it once for
    /// one node, or several times for Redlock (use an odd number, e.g. 5).
    /// Default: $REDIS_LOCK_URL (comma-separated), else redis://127.0.0.1:6379/.
    #[arg(long = "url", value_name = "URL")]
    urls: Vec<String>,
    /// The lock's key. Give it several times for one lock over every key
    /// named, taken all or nothing with one fencing token (a wait stands in
    /// every key's line at once; on Redis Cluster the keys must share a
    /// slot: one hash tag).
    #[arg(long = "key", value_name = "KEY", required = true,
          value_parser = clap::builder::NonEmptyStringValueParser::new())]
    keys: Vec<String>,
    /// Take the lock shared: the reader's side of a read/write lock (many
    /// shared holders at once, a plain holder alone; one FIFO line).
    #[arg(long)]
    shared: bool,
    /// At most N holders at once: a counting semaphore, shared (--shared
    /// is implied). The limit belongs to the key, so every holder names
    /// the same; one node only.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    limit: Option<u32>,
    /// The --url nodes are distinct servers: use a Redlock group even where
    /// the nodes' user may not run INFO, by which they are told apart
    /// (without it such a group is refused: one server under two names
    /// would count as two votes).
    #[arg(long)]
    distinct_nodes: bool,
}

/// The statuses that say "not acquired" and "lost", settable so a
/// command's own 75 or 76 cannot be mistaken for them (like `flock -E`).
#[derive(Args, Clone, Copy)]
struct Codes {
    /// Exit with N (1 to 255: 0 would report a lock not taken as success)
    /// when the lock is not acquired within --wait.
    #[arg(long, value_name = "N", default_value_t = exit::NOT_ACQUIRED, value_parser = exit_code)]
    conflict_exit_code: u8,
    /// Exit with N (1 to 255) when the lock is lost (or its validity ran
    /// out) before the command ended.
    #[arg(long, value_name = "N", default_value_t = exit::LOST, value_parser = exit_code)]
    lost_exit_code: u8,
}

/// How a grant is acknowledged (default: as soon as the node grants it).
#[derive(Args, Clone, Copy, Default)]
struct Grant {
    /// Count a grant only once N replicas of each node have it, waiting up
    /// to TIMEOUT (default 1s) for them (WAIT); with fewer, it is released
    /// and counts as not acquired (exit 75), so a failover cannot lose it.
    #[arg(long, value_name = "N[:TIMEOUT]", value_parser = parse_replicas)]
    wait_replicas: Option<(u32, Duration)>,
}

/// An exit status that says something went wrong: 1 to 255 (0 would say
/// the lock was taken, or held to the end, when it was not).
fn exit_code(text: &str) -> Result<u8, String> {
    match text.trim().parse::<u8>() {
        Ok(0) => Err("0 means success: give a status from 1 to 255".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "invalid exit status '{text}': give a number from 1 to 255"
        )),
    }
}

/// `N` or `N:TIMEOUT` for --wait-replicas.
fn parse_replicas(text: &str) -> Result<(u32, Duration), String> {
    let (count, timeout) = match text.split_once(':') {
        Some((n, t)) => (n, duration::parse(t)?),
        None => (text, Duration::from_secs(1)),
    };
    let count: u32 = count
        .trim()
        .parse()
        .map_err(|_| format!("invalid replica count '{count}': use e.g. 1 or 1:500ms"))?;
    Ok((count, timeout))
}

#[derive(Subcommand)]
enum Command {
    /// Acquire, run CMD with the lock renewed while it runs, release, and
    /// exit with CMD's status.
    Run {
        #[command(flatten)]
        nodes: Nodes,
        /// Lease length; renewed at about a third of it while CMD runs.
        #[arg(long, value_parser = duration::parse, default_value = "30s")]
        ttl: Duration,
        /// How long to wait for the lock (0: one attempt).
        #[arg(long, value_parser = duration::parse, default_value = "0")]
        wait: Duration,
        /// After SIGTERM, how long before SIGKILL. When the lock is lost
        /// (default: halfway to the end of the lease's validity, after which
        /// another holder may be granted; a longer grace lets the job run
        /// without the lock), and for what CMD left running in its process
        /// group when it exited (default 10s; the lock is held meanwhile).
        #[arg(long, value_parser = duration::parse)]
        grace: Option<Duration>,
        #[command(flatten)]
        codes: Codes,
        #[command(flatten)]
        grant: Grant,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Wait (for ever) to lead KEY with the public VALUE, run CMD while
    /// leading (as `run` does: renewed, stopped when leadership is lost,
    /// its environment with REDIS_LOCK_VALUE too), resign when it ends,
    /// and exit with CMD's status.
    Elect {
        #[command(flatten)]
        nodes: Nodes,
        /// What followers see of this leader (an address, an id):
        /// `redis-lock observe`, LOCK.OBSERVE and LOCK.INFO show it.
        #[arg(long)]
        value: String,
        /// Lease length; renewed at about a third of it while CMD runs. A
        /// leader that dies is replaced when its lease ends.
        #[arg(long, value_parser = duration::parse, default_value = "10s")]
        ttl: Duration,
        /// After SIGTERM, how long before SIGKILL (as for `run`).
        #[arg(long, value_parser = duration::parse)]
        grace: Option<Duration>,
        #[command(flatten)]
        codes: Codes,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Print KEY's leader, then one line per change as it happens (a new
    /// leader, a new value, or vacant: released, or its lease ended),
    /// resuming across lost connections; runs until interrupted.
    Observe {
        #[command(flatten)]
        nodes: Nodes,
        /// One JSON object per change: {"key","leader":true,"fence","value"}
        /// or {"key","leader":false}.
        #[arg(long)]
        json: bool,
    },
    /// Acquire and print `export REDIS_LOCK_TOKEN=...` lines (also _KEY, _FENCE
    /// and _VALIDITY_MS, quoted for the shell)
    /// (for `eval`). The lock is not renewed: extend it, then release it.
    Acquire {
        #[command(flatten)]
        nodes: Nodes,
        #[arg(long, value_parser = duration::parse)]
        ttl: Duration,
        #[arg(long, value_parser = duration::parse, default_value = "0")]
        wait: Duration,
        /// The holder token to use (default: a random one).
        #[arg(long)]
        token: Option<String>,
        /// Print one JSON object (key, token, fence, validity_ms) instead
        /// of export lines.
        #[arg(long)]
        json: bool,
        /// Exit with N (1 to 255) when the lock is not acquired within
        /// --wait (default 75).
        #[arg(long, value_name = "N", default_value_t = exit::NOT_ACQUIRED, value_parser = exit_code)]
        conflict_exit_code: u8,
        #[command(flatten)]
        grant: Grant,
    },
    /// Release a lock held by TOKEN. Exit 0 if released, 75 if it was not held.
    Release {
        #[command(flatten)]
        nodes: Nodes,
        #[arg(long)]
        token: String,
    },
    /// Set the lease of a lock held by TOKEN to TTL from now, and print
    /// `export REDIS_LOCK_VALIDITY_MS=...`. Exit 0 if extended, 75 if it was
    /// not held on a majority (then it is released where it was extended).
    Extend {
        #[command(flatten)]
        nodes: Nodes,
        #[arg(long)]
        token: String,
        #[arg(long, value_parser = duration::parse)]
        ttl: Duration,
        /// Print one JSON object (key, token, validity_ms) instead of the
        /// export line (an extend keeps the fencing token acquire printed).
        #[arg(long)]
        json: bool,
    },
    /// A live view of the nodes' locks, redrawn every --interval: each
    /// node's counters (grants and hand-offs a second), then its locks
    /// (LOCK.SCAN), the most waited for first, with holders, fence, lease
    /// left, hold time, the line and grants a second. Keys: s sorts, / filters (a glob), j/k
    /// or the arrows choose, Enter shows every holder, q quits. Without a
    /// terminal, or with --once, one frame is printed and it exits.
    Top {
        /// A node to read; give it once per node (a Redlock group's nodes
        /// each, a redis-cluster:// URL is read on each master).
        #[arg(long = "url", value_name = "URL")]
        urls: Vec<String>,
        /// The first order (s goes to the next).
        #[arg(long, value_enum, default_value = "waiters")]
        sort: top::Sort,
        /// Only keys matching this glob (LOCK.SCAN MATCH; / changes it).
        #[arg(long = "match", value_name = "GLOB")]
        pattern: Option<String>,
        /// How often to read the nodes again.
        #[arg(long, value_parser = duration::parse, default_value = "1s")]
        interval: Duration,
        /// Print one frame and exit (as without a terminal).
        #[arg(long)]
        once: bool,
    },
    /// Show the lock on every node.
    Info {
        #[command(flatten)]
        nodes: Nodes,
        /// One JSON object per node, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Check the lock nodes' deployment: each node's identity, module,
    /// persistence and restart delay, duplicates, an even count, and
    /// whether a node restarted after a crash could grant a lock that is
    /// still held (restart delay below TTL without `appendfsync always`).
    /// Exit 0 if nothing is wrong, 78 if something is, 69 if a node did not
    /// answer.
    Doctor {
        /// The lock nodes (as for the other subcommands).
        #[arg(long = "url", value_name = "URL")]
        urls: Vec<String>,
        /// The longest TTL you use, to judge the restart delay against.
        #[arg(long, value_parser = duration::parse, default_value = "30s")]
        ttl: Duration,
        /// One JSON object per node, then one with the findings.
        #[arg(long)]
        json: bool,
    },
    /// Serve every node's INFO lock as Prometheus metrics on
    /// http://ADDR/metrics, read from the nodes at each scrape: counters
    /// (redis_lock_*_total), gauges (locks, waiters, observers, ...), the
    /// wait and hold histograms (redis_lock_wait_seconds,
    /// redis_lock_hold_seconds) and redis_lock_up, each labelled
    /// node="host:port". Runs until killed.
    Exporter {
        /// A node to read (as for the other subcommands); give it once per
        /// node. A redis-cluster:// URL is read on each of its masters.
        #[arg(long = "url", value_name = "URL")]
        urls: Vec<String>,
        /// Where to listen, as host:port (e.g. 0.0.0.0:9635, or
        /// 127.0.0.1:0 for a free port, printed on stderr).
        #[arg(long, value_name = "ADDR")]
        listen: String,
        /// How long each node has to answer INFO lock at a scrape (one that
        /// does not is reported with redis_lock_up 0).
        #[arg(long, value_parser = duration::parse, default_value = "2s")]
        timeout: Duration,
        /// How many of each node's locks with waiters to export by key
        /// (the most waiters first; LOCK.SCAN WAITING at each scrape): the
        /// key is a label, so this bounds the series. 0: none.
        #[arg(long, value_name = "N", default_value_t = 10)]
        top: usize,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(exit::USAGE),
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(exit::UNAVAILABLE, &format!("cannot start: {e}")),
    };
    runtime.block_on(run(cli))
}

fn fail(code: u8, message: &str) -> ExitCode {
    job::say(format_args!("redis-lock: {message}"));
    ExitCode::from(code)
}

fn client(nodes: &Nodes, auto_renew: bool, grant: Grant) -> Result<LockClient, ExitCode> {
    let mut options = Options::default()
        .auto_renew(auto_renew)
        .distinct_nodes(nodes.distinct_nodes);
    if let Some((count, timeout)) = grant.wait_replicas {
        options = options.wait_replicas(count, timeout);
    }
    client_for(&nodes.urls, options)
}

/// The --url nodes, else $REDIS_LOCK_URL's, else the local default.
fn node_urls(given: &[String]) -> Vec<String> {
    if given.is_empty() {
        match std::env::var("REDIS_LOCK_URL") {
            Ok(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
            Err(_) => vec!["redis://127.0.0.1:6379/".into()],
        }
    } else {
        given.to_vec()
    }
}

fn client_for(given: &[String], options: Options) -> Result<LockClient, ExitCode> {
    let urls = node_urls(given);
    if urls.len() > 1 && urls.len() % 2 == 0 {
        eprintln!(
            "redis-lock: warning: {} nodes: an even count tolerates no more failures than one node fewer (a majority of {} is {}); use an odd number",
            urls.len(),
            urls.len(),
            urls.len() / 2 + 1
        );
    }
    open_client(&urls, options)
}

/// A client of exactly these nodes, or the usage error a bad URL is.
fn open_client(urls: &[String], options: Options) -> Result<LockClient, ExitCode> {
    LockClient::with_options(urls, options).map_err(|e| match e {
        // The URL did not parse at all: show the form.
        redis_lock_client::Error::Redis(_) => fail(
            exit::USAGE,
            &format!("bad --url: {e} (expected redis://host:port/)"),
        ),
        // The client's own refusal says what is wrong.
        _ => fail(exit::USAGE, &format!("bad --url: {e}")),
    })
}

/// A call that failed: a usage error if a node refused the arguments (a
/// TTL above its `lock.max-ttl-ms`, a key holding another type), "try
/// again" if a node is in its restart delay or the lock's line is full,
/// "permission denied" for refused credentials and ACL refusals, else the
/// nodes are unavailable (unreachable, a failed TLS handshake, or the
/// module not loaded).
fn failed_call(e: redis_lock_client::Error) -> ExitCode {
    use redis_lock_client::Error;
    match &e {
        Error::Config(why) => fail(exit::USAGE, why),
        e if e.is_busy() => fail(
            exit::NOT_ACQUIRED,
            &format!("a lock node asks to try again later: {e}"),
        ),
        Error::ModuleMissing { .. } | Error::TlsRefused { .. } => {
            fail(exit::UNAVAILABLE, &e.to_string())
        }
        e if e.is_module_missing() => fail(
            exit::UNAVAILABLE,
            &format!("a node does not know the LOCK commands: is the redis-lock module loaded there? ({e})"),
        ),
        e if e.is_auth_failure() => fail(
            exit::NO_PERMISSION,
            &format!("authentication failed: {e} (check the user and password in --url or $REDIS_LOCK_URL)"),
        ),
        Error::Redis(r) if r.code() == Some(redis_lock_core::protocol::code::NO_PERMISSION) => {
            fail(exit::NO_PERMISSION, &format!("permission denied: {r}"))
        }
        Error::Redis(r) if r.code() == Some("WRONGTYPE") => fail(
            exit::USAGE,
            &format!("the key holds a value that is not a lock: {r}"),
        ),
        Error::Redis(r) if r.kind() == redis::ErrorKind::ResponseError => fail(
            exit::USAGE,
            &format!("a lock node refused the request: {r}"),
        ),
        _ => fail(
            exit::UNAVAILABLE,
            &format!(
                "lock nodes unavailable: {e} (check --url and that the server is up; for rediss:// also its TLS: the CA in SSL_CERT_FILE, and whether it asks for a client certificate)"
            ),
        ),
    }
}

/// A TTL that leaves no validity after Redlock's drift allowance is a usage
/// error, not a lock that is lost as soon as it is granted.
fn check_ttl(ttl: Duration) -> Result<(), ExitCode> {
    if ttl < Duration::from_millis(10) || ttl <= drift(ttl) {
        return Err(fail(
            exit::USAGE,
            &format!(
                "--ttl {} leaves no validity after the clock-drift allowance ({} ms): give at least 10ms",
                show(ttl),
                drift(ttl).as_millis()
            ),
        ));
    }
    Ok(())
}

/// A value quoted for a POSIX shell: single quotes, with each ' as '\''.
fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Run {
            nodes,
            ttl,
            wait,
            grace,
            codes,
            grant,
            cmd,
        } => {
            if let Err(code) = check_ttl(ttl) {
                return code;
            }
            let locks = match client(&nodes, true, grant) {
                Ok(c) => c,
                Err(code) => return code,
            };
            warn_unsafe_group(&locks, ttl).await;
            run_under_lock(&locks, &nodes, ttl, wait, grace, codes, &cmd, None).await
        }
        Command::Elect {
            nodes,
            value,
            ttl,
            grace,
            codes,
            cmd,
        } => {
            if let Err(code) = check_ttl(ttl) {
                return code;
            }
            if nodes.shared || nodes.limit.is_some() || nodes.keys.len() > 1 {
                return fail(
                    exit::USAGE,
                    "elect leads one key, exclusively: no --shared, --limit or second --key",
                );
            }
            let locks = match client(&nodes, true, Grant::default()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            warn_unsafe_group(&locks, ttl).await;
            let forever = Duration::from_secs(10 * 365 * 86_400);
            let value = Some(value.as_str());
            run_under_lock(&locks, &nodes, ttl, forever, grace, codes, &cmd, value).await
        }
        Command::Observe { nodes, json } => {
            if nodes.keys.len() > 1 {
                return fail(exit::USAGE, "observe follows one --key");
            }
            let locks = match client(&nodes, false, Grant::default()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            observe(&locks, &nodes.keys[0], json).await
        }
        Command::Acquire {
            nodes,
            ttl,
            wait,
            token,
            json,
            conflict_exit_code,
            grant,
        } => {
            if let Err(code) = check_ttl(ttl) {
                return code;
            }
            let locks = match client(&nodes, false, grant) {
                Ok(c) => c,
                Err(code) => return code,
            };
            let keys = nodes.lock_keys();
            let acquisition = nodes
                .mode(locks.acquire_all(keys.as_slice(), ttl))
                .wait(wait);
            // A given token may hold the lock already (a re-acquire keeps
            // its fence); without one the library makes a fresh one.
            let acquisition = match token {
                Some(token) => acquisition.token(token),
                None => acquisition,
            };
            match acquisition.await {
                Ok(Some(guard)) => {
                    // Exported (a program the script runs sees them, as
                    // under `run`) and quoted (a token is any bytes).
                    let validity = guard
                        .valid_until()
                        .saturating_duration_since(tokio::time::Instant::now());
                    if json {
                        println!(
                            "{{\"key\":{},\"token\":{},\"fence\":{},\"validity_ms\":{},\"keys\":{}}}",
                            json_string(keys.first()),
                            json_string(guard.token()),
                            guard.fence(),
                            validity.as_millis(),
                            json_keys(&keys)
                        );
                        std::mem::forget(guard);
                        return ExitCode::SUCCESS;
                    }
                    println!("export REDIS_LOCK_KEY={}", shell_quote(keys.first()));
                    println!("export REDIS_LOCK_KEYS={}", shell_quote(&keys_env(&keys)));
                    println!("export REDIS_LOCK_TOKEN={}", shell_quote(guard.token()));
                    println!("export REDIS_LOCK_FENCE={}", guard.fence());
                    println!("export REDIS_LOCK_VALIDITY_MS={}", validity.as_millis());
                    // Keep the lock: the script releases it.
                    std::mem::forget(guard);
                    ExitCode::SUCCESS
                }
                Ok(None) => not_acquired(&keys, wait, conflict_exit_code),
                Err(e @ redis_lock_client::Error::NotReplicated { .. }) => {
                    fail(conflict_exit_code, &format!("not acquired: {e}"))
                }
                Err(e) => failed_call(e),
            }
        }
        Command::Release { nodes, token } => {
            let locks = match client(&nodes, false, Grant::default()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            match locks.release_token_count(nodes.lock_keys(), &token).await {
                Ok(n) if n >= locks.quorum() => ExitCode::SUCCESS,
                Ok(0) => fail(
                    exit::NOT_ACQUIRED,
                    &format!(
                        "{} was not held by this token (expired, or another holder)",
                        nodes.lock_keys()
                    ),
                ),
                Ok(n) => fail(
                    exit::NOT_ACQUIRED,
                    &format!(
                        "{} was held by this token on {n} of {} nodes only, not a majority: the lock was no longer held (lost, or a failed extend left its lease there); released on those {n}",
                        nodes.lock_keys(),
                        locks.nodes()
                    ),
                ),
                Err(e) => failed_call(e),
            }
        }
        Command::Extend {
            nodes,
            token,
            ttl,
            json,
        } => {
            if let Err(code) = check_ttl(ttl) {
                return code;
            }
            let locks = match client(&nodes, false, Grant::default()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            match locks.extend_token_until(nodes.lock_keys(), &token, ttl).await {
                Ok(Some(valid_until)) => {
                    // The validity, not the TTL, is how long it is surely held.
                    let validity =
                        valid_until.saturating_duration_since(tokio::time::Instant::now());
                    if json {
                        println!(
                            "{{\"key\":{},\"token\":{},\"validity_ms\":{},\"keys\":{}}}",
                            json_string(nodes.lock_keys().first()),
                            json_string(&token),
                            validity.as_millis(),
                            json_keys(&nodes.lock_keys())
                        );
                    } else {
                        println!("export REDIS_LOCK_VALIDITY_MS={}", validity.as_millis());
                    }
                    ExitCode::SUCCESS
                }
                Ok(None) => fail(
                    exit::NOT_ACQUIRED,
                    &format!(
                        "{} is not held by this token any more (released where it was extended): acquire it again",
                        nodes.lock_keys()
                    ),
                ),
                Err(e) => failed_call(e),
            }
        }
        Command::Doctor { urls, ttl, json } => {
            let locks = match client_for(&urls, Options::default()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            doctor(&locks, ttl, json).await
        }
        Command::Exporter {
            urls,
            listen,
            timeout,
            top,
        } => {
            // Any count of nodes: they are read one by one, not a group.
            let locks = match open_client(&node_urls(&urls), Options::default()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            exporter::exporter(locks, &listen, timeout, top).await
        }
        Command::Top {
            urls,
            sort,
            pattern,
            interval,
            once,
        } => {
            // Any count of nodes: each is read on its own.
            let locks = match open_client(&node_urls(&urls), Options::default()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            top::top(locks, sort, pattern, interval, once).await
        }
        Command::Info { nodes, json } => {
            let locks = match client(&nodes, false, Grant::default()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            let mut failed = 0;
            let several = nodes.keys.len() > 1;
            for key in &nodes.keys {
                if several && !json {
                    println!("{key}:");
                }
                for (i, reply) in locks.info(key).await.into_iter().enumerate() {
                    if json {
                        match &reply {
                        Ok(None) => println!("{{\"node\":{i},\"held\":false,\"key\":{}}}", json_string(key)),
                        Ok(Some(info)) => println!(
                            "{{\"node\":{i},\"held\":true,\"token\":{},\"fence\":{},\"ttl_ms\":{},\"waiters\":{},\"key\":{}}}",
                            info.token
                                .as_ref()
                                .map(|t| json_string(&String::from_utf8_lossy(t)))
                                .unwrap_or_else(|| "null".into()),
                            info.fence,
                            info.ttl_ms,
                            info.waiters,
                            json_string(key)
                        ),
                        Err(e) => println!(
                            "{{\"node\":{i},\"error\":{},\"key\":{}}}",
                            json_string(&e.to_string()),
                            json_string(key)
                        ),
                    }
                        if reply.is_err() {
                            failed += 1;
                        }
                        continue;
                    }
                    match reply {
                        Ok(None) => println!("node {i}: free"),
                        Ok(Some(info)) => println!(
                            "node {i}: held token={} fence={} ttl={}ms waiters={}",
                            info.token
                                .map(|t| String::from_utf8_lossy(&t).into_owned())
                                .unwrap_or_else(|| "(hidden)".into()),
                            info.fence,
                            info.ttl_ms,
                            info.waiters
                        ),
                        Err(e) => {
                            failed += 1;
                            println!("node {i}: error: {e}")
                        }
                    }
                }
            }
            if failed > 0 {
                ExitCode::from(exit::UNAVAILABLE)
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}

/// A JSON string literal.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `redis-lock observe`: one line per change of `key`'s leader, until
/// interrupted (or a node refuses: an error).
async fn observe(locks: &LockClient, key: &str, json: bool) -> ExitCode {
    use futures_util::StreamExt;
    use redis_lock_client::Observed;
    let mut changes = locks.election(key).observe();
    while let Some(change) = changes.next().await {
        let line = match (change, json) {
            (Err(e), _) => return failed_call(e),
            (Ok(Observed::Leader(l)), false) => format!(
                "leader fence={} value={}",
                l.fence,
                l.value.as_deref().map_or("(none)".to_string(), shell_quote)
            ),
            (Ok(Observed::Vacant), false) => "vacant".to_string(),
            (Ok(Observed::Leader(l)), true) => format!(
                "{{\"key\":{},\"leader\":true,\"fence\":{},\"value\":{}}}",
                json_string(key),
                l.fence,
                l.value.as_deref().map_or("null".to_string(), json_string)
            ),
            (Ok(Observed::Vacant), true) => {
                format!("{{\"key\":{},\"leader\":false}}", json_string(key))
            }
        };
        println!("{line}");
    }
    ExitCode::SUCCESS
}

fn not_acquired(key: &Keys, wait: Duration, code: u8) -> ExitCode {
    fail(
        code,
        &format!(
            "{key} is held by another holder; not acquired within {} (raise --wait to wait longer)",
            show(wait)
        ),
    )
}

fn show(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}
