//! `redis-lock doctor`: each node's deployment checked and reported, and
//! the short warning about an unsafe Redlock group before a run.

use std::process::ExitCode;
use std::time::Duration;

use redis_lock_client::LockClient;

use crate::{exit, json_string};

/// Redlock: a node that restarts after a crash with less than the TTL of
/// restart delay and without `appendfsync always` may grant a lock a
/// majority still holds elsewhere. Said once, on stderr, before acquiring
/// (`redis-lock doctor` checks single nodes too).
pub(crate) async fn warn_unsafe_group(locks: &LockClient, ttl: Duration) {
    if locks.nodes() < 2 {
        return;
    }
    // Read once: the acquire that follows reuses this read.
    let Ok(settings) = locks.group_settings(ttl).await else {
        return; // the acquire reports why
    };
    for s in settings.into_iter().flatten() {
        if let Some(warning) = s.crash_warning(ttl) {
            eprintln!("redis-lock: warning: {warning} (see redis-lock doctor)");
        }
    }
}

/// `redis-lock doctor`: what each node says about itself, then findings.
pub(crate) async fn doctor(locks: &LockClient, ttl: Duration, json: bool) -> ExitCode {
    let reports = locks.settings().await;
    let mut findings: Vec<String> = Vec::new();
    let mut unreachable = 0;
    let mut seen: Vec<(String, String)> = Vec::new();
    for (i, report) in reports.iter().enumerate() {
        let s = match report {
            Ok(s) => s,
            Err(e) if e.is_acl_refusal() => {
                findings.push(format!(
                    "node {i}: its user may not run INFO (ACL), so it cannot be checked (nor told apart from the others by the client): grant +info and +config|get to this user ({e})"
                ));
                if json {
                    println!("{{\"node\":{i},\"error\":{}}}", json_string(&e.to_string()));
                } else {
                    println!("node {i}: refused INFO (ACL): {e}");
                }
                continue;
            }
            Err(e) => {
                unreachable += 1;
                if json {
                    println!("{{\"node\":{i},\"error\":{}}}", json_string(&e.to_string()));
                } else {
                    println!("node {i}: error: {e}");
                }
                continue;
            }
        };
        let opt = |v: Option<String>| v.unwrap_or_else(|| "null".into());
        if json {
            println!(
                "{{\"node\":{i},\"url\":{},\"run_id\":{},\"version\":{},\"module\":{},\"fence_hwm\":{},\"restart_delay_ms\":{},\"appendonly\":{},\"appendfsync\":{}}}",
                json_string(&s.url),
                json_string(&s.run_id),
                json_string(&s.version),
                s.module_loaded,
                opt(s.fence_hwm.map(|v| v.to_string())),
                opt(s.restart_delay_ms.map(|v| v.to_string())),
                opt(s.appendonly.map(|v| v.to_string())),
                opt(s.appendfsync.as_deref().map(json_string)),
            );
        } else {
            let show = |v: Option<String>| v.unwrap_or_else(|| "(not readable)".into());
            println!(
                "node {i}: {} version {} run_id {} module {} fence_hwm {} restart-delay-ms {} appendonly {} appendfsync {}",
                s.url,
                s.version,
                s.run_id,
                if s.module_loaded { "loaded" } else { "MISSING" },
                show(s.fence_hwm.map(|v| v.to_string())),
                show(s.restart_delay_ms.map(|v| v.to_string())),
                show(s.appendonly.map(|v| if v { "yes".into() } else { "no".into() })),
                show(s.appendfsync.clone()),
            );
        }
        if !s.module_loaded {
            findings.push(format!(
                "node {i} ({}): the redis-lock module is not loaded",
                s.url
            ));
        }
        if let Some((other, _)) = seen.iter().find(|(_, id)| *id == s.run_id) {
            findings.push(format!(
                "node {i} ({}) is the same server as {other} (run_id {}): it would count as two votes",
                s.url, s.run_id
            ));
        }
        seen.push((s.url.clone(), s.run_id.clone()));
        match s.unsafe_after_crash(ttl) {
            Some(true) => findings.push(format!(
                "node {i}: {}",
                s.crash_warning(ttl).unwrap_or_default()
            )),
            None => findings.push(format!(
                "node {i} ({}): cannot read lock.restart-delay-ms or appendfsync (CONFIG GET refused?): check them by hand",
                s.url
            )),
            _ => {}
        }
    }
    let n = reports.len();
    if n > 1 && n % 2 == 0 {
        findings.push(format!(
            "{n} nodes: an even count tolerates no more failures than {} (use an odd number)",
            n - 1
        ));
    }
    let hwms: Vec<i64> = reports
        .iter()
        .filter_map(|r| r.as_ref().ok()?.fence_hwm)
        .collect();
    if let (Some(lo), Some(hi)) = (hwms.iter().min(), hwms.iter().max()) {
        if !json {
            println!(
                "fence marks: lowest {lo}, highest {hi} (spread {} ms; the next grant on a majority exceeds the highest of its nodes)",
                (hi - lo) / 1000
            );
        }
    }
    if json {
        let list: Vec<String> = findings.iter().map(|f| json_string(f)).collect();
        println!(
            "{{\"findings\":[{}],\"unreachable\":{unreachable}}}",
            list.join(",")
        );
    } else if findings.is_empty() && unreachable == 0 {
        println!("ok: nothing to fix");
    } else {
        for f in &findings {
            println!("problem: {f}");
        }
    }
    if unreachable > 0 {
        ExitCode::from(exit::UNAVAILABLE)
    } else if !findings.is_empty() {
        ExitCode::from(exit::CONFIG)
    } else {
        ExitCode::SUCCESS
    }
}
