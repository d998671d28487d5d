//! `redis-lock`: run any program under a lock, or hold one across the
//! steps of a script. See `redis-lock --help`.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use redis_lock_client::{duration, random_token, LockClient, Options};

/// Exit codes besides the child's own status.
mod exit {
    /// Usage errors (bad flags, durations).
    pub const USAGE: u8 = 64;
    /// The lock nodes could not be reached or answered with an error.
    pub const UNAVAILABLE: u8 = 69;
    /// Not acquired within --wait (or not held, for release/extend).
    pub const NOT_ACQUIRED: u8 = 75;
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
you protect), REDIS_LOCK_TOKEN and REDIS_LOCK_KEY in its environment. It runs
in its own process group; SIGTERM, SIGINT and SIGHUP sent to redis-lock are
passed on to that group, and the lock is released once the command exits.

Exit status: the command's own status (128+N if killed by signal N); 64 usage
error; 69 lock nodes unreachable; 75 not acquired within --wait (or, for
release/extend, the lock was not held); 76 the lock was lost while the
command ran (it got SIGTERM, then SIGKILL after --grace); 126/127 the command
could not be run / was not found.
Durations: 1500ms, 30s, 2m, 1h, 1m30s (a bare number is seconds)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Nodes {
    /// A lock node, as redis://[user:password@]host:port/[db]. Give it once for
    /// one node, or several times for Redlock (use an odd number, e.g. 5).
    /// Default: $REDIS_LOCK_URL (comma-separated), else redis://127.0.0.1:6379/.
    #[arg(long = "url", value_name = "URL")]
    urls: Vec<String>,
    /// The lock's key.
    #[arg(long, value_name = "KEY")]
    key: String,
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
        /// After the lock is lost and CMD got SIGTERM, how long before SIGKILL.
        #[arg(long, value_parser = duration::parse, default_value = "10s")]
        grace: Duration,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Acquire and print REDIS_LOCK_TOKEN=... and REDIS_LOCK_FENCE=... lines
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
    },
    /// Release a lock held by TOKEN. Exit 0 if released, 75 if it was not held.
    Release {
        #[command(flatten)]
        nodes: Nodes,
        #[arg(long)]
        token: String,
    },
    /// Set the lease of a lock held by TOKEN to TTL from now. Exit 0 if
    /// extended, 75 if it was not held.
    Extend {
        #[command(flatten)]
        nodes: Nodes,
        #[arg(long)]
        token: String,
        #[arg(long, value_parser = duration::parse)]
        ttl: Duration,
    },
    /// Show the lock on every node.
    Info {
        #[command(flatten)]
        nodes: Nodes,
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
    eprintln!("redis-lock: {message}");
    ExitCode::from(code)
}

fn client(nodes: &Nodes, auto_renew: bool) -> Result<LockClient, ExitCode> {
    let urls: Vec<String> = if nodes.urls.is_empty() {
        match std::env::var("REDIS_LOCK_URL") {
            Ok(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
            Err(_) => vec!["redis://127.0.0.1:6379/".into()],
        }
    } else {
        nodes.urls.clone()
    };
    let options = Options {
        auto_renew,
        ..Options::default()
    };
    LockClient::with_options(&urls, options).map_err(|e| {
        fail(
            exit::USAGE,
            &format!("bad --url: {e} (expected redis://host:port/)"),
        )
    })
}

fn unavailable(e: redis_lock_client::Error) -> ExitCode {
    fail(
        exit::UNAVAILABLE,
        &format!(
            "lock nodes unavailable: {e} (check --url and that the redis-lock module is loaded)"
        ),
    )
}

async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Run {
            nodes,
            ttl,
            wait,
            grace,
            cmd,
        } => {
            let locks = match client(&nodes, true) {
                Ok(c) => c,
                Err(code) => return code,
            };
            run_under_lock(&locks, &nodes.key, ttl, wait, grace, &cmd).await
        }
        Command::Acquire {
            nodes,
            ttl,
            wait,
            token,
        } => {
            let locks = match client(&nodes, false) {
                Ok(c) => c,
                Err(code) => return code,
            };
            let token = token.unwrap_or_else(random_token);
            match locks.acquire_as(&nodes.key, &token, ttl, wait).await {
                Ok(Some(guard)) => {
                    println!("REDIS_LOCK_TOKEN={}", guard.token());
                    println!("REDIS_LOCK_FENCE={}", guard.fence());
                    // Keep the lock: the script releases it.
                    std::mem::forget(guard);
                    ExitCode::SUCCESS
                }
                Ok(None) => not_acquired(&nodes.key, wait),
                Err(e) => unavailable(e),
            }
        }
        Command::Release { nodes, token } => {
            let locks = match client(&nodes, false) {
                Ok(c) => c,
                Err(code) => return code,
            };
            match locks.release_token(&nodes.key, &token).await {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => fail(
                    exit::NOT_ACQUIRED,
                    &format!(
                        "{} was not held by this token (expired, or another holder)",
                        nodes.key
                    ),
                ),
                Err(e) => unavailable(e),
            }
        }
        Command::Extend { nodes, token, ttl } => {
            let locks = match client(&nodes, false) {
                Ok(c) => c,
                Err(code) => return code,
            };
            match locks.extend_token(&nodes.key, &token, ttl).await {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => fail(
                    exit::NOT_ACQUIRED,
                    &format!(
                        "{} is not held by this token any more: acquire it again",
                        nodes.key
                    ),
                ),
                Err(e) => unavailable(e),
            }
        }
        Command::Info { nodes } => {
            let locks = match client(&nodes, false) {
                Ok(c) => c,
                Err(code) => return code,
            };
            let mut failed = 0;
            for (i, reply) in locks.info(&nodes.key).await.into_iter().enumerate() {
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
            if failed > 0 {
                ExitCode::from(exit::UNAVAILABLE)
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}

fn not_acquired(key: &str, wait: Duration) -> ExitCode {
    fail(
        exit::NOT_ACQUIRED,
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

async fn run_under_lock(
    locks: &LockClient,
    key: &str,
    ttl: Duration,
    wait: Duration,
    grace: Duration,
    cmd: &[String],
) -> ExitCode {
    use tokio::signal::unix::{signal, SignalKind};

    // Handlers first: a signal that arrives while acquiring must not kill
    // redis-lock with a grant in flight.
    let (Ok(mut sigterm), Ok(mut sigint), Ok(mut sighup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        return fail(exit::CANNOT_RUN, "cannot install signal handlers");
    };
    let token = random_token();
    let acquired = tokio::select! {
        result = locks.acquire_as(key, &token, ttl, wait) => Ok(result),
        _ = sigterm.recv() => Err(libc::SIGTERM),
        _ = sigint.recv() => Err(libc::SIGINT),
        _ = sighup.recv() => Err(libc::SIGHUP),
    };
    let guard = match acquired {
        Ok(Ok(Some(guard))) => guard,
        Ok(Ok(None)) => return not_acquired(key, wait),
        Ok(Err(e)) => return unavailable(e),
        Err(sig) => {
            // Interrupted: give back whatever was granted meanwhile.
            let _ = locks.release_token(key, &token).await;
            return ExitCode::from(128 + sig as u8);
        }
    };
    let mut child = match tokio::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .env("REDIS_LOCK_FENCE", guard.fence().to_string())
        .env("REDIS_LOCK_TOKEN", guard.token())
        .env("REDIS_LOCK_KEY", key)
        // Its own process group, so that stopping it after a lost lock
        // stops everything it started (a stray grandchild could go on
        // writing without the lock).
        .process_group(0)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            let _ = guard.release().await;
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_RUN
            };
            return fail(code, &format!("cannot run {}: {e}", cmd[0]));
        }
    };
    let pid = child.id().map(|p| p as libc::pid_t);
    // To the whole group (the child is its leader).
    let send = |sig: libc::c_int| {
        if let Some(pid) = pid {
            unsafe { libc::kill(-pid, sig) };
        }
    };
    let lost = guard.lost().clone();
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            // Passed on: the command decides how to stop; the lock is
            // released when it has exited.
            _ = sigterm.recv() => send(libc::SIGTERM),
            _ = sigint.recv() => send(libc::SIGINT),
            _ = sighup.recv() => send(libc::SIGHUP),
            _ = lost.cancelled() => {
                eprintln!(
                    "redis-lock: lost the lock on {key} (a renewal was refused or timed out); stopping the command"
                );
                send(libc::SIGTERM);
                if tokio::time::timeout(grace, child.wait()).await.is_err() {
                    send(libc::SIGKILL);
                    let _ = child.wait().await;
                }
                let _ = guard.release().await;
                return ExitCode::from(exit::LOST);
            }
        }
    };
    let _ = guard.release().await;
    match status {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (Some(code), _) => ExitCode::from(code as u8),
                (None, Some(sig)) => ExitCode::from(128u8.wrapping_add(sig as u8)),
                _ => ExitCode::FAILURE,
            }
        }
        Err(e) => fail(exit::CANNOT_RUN, &format!("waiting for the command: {e}")),
    }
}
