//! The Node.js package (clients/node): its committed build (`dist/`) is the
//! one its TypeScript sources compile to; it installs into a fresh project
//! as its README says (`npm install ./clients/node`) and loads there as an
//! ES module and through `require`, its types checked by `tsc`; and its
//! `node --test` suite (ioredis and node-redis, the shared conformance
//! suite) passes against servers it starts with the module built here. The
//! package's dependencies (`npm ci` in clients/node) come from
//! `scripts/prereqs.sh test`.

use redis_lock_testkit as common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn package() -> PathBuf {
    common::workspace_root().join("clients/node")
}

fn run(dir: &Path, program: &str, args: &[&str]) -> std::process::Output {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("REDIS_SERVER", common::server_binary())
        .env("REDIS_LOCK_MODULE", common::module_path())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn ok(out: &std::process::Output, what: &str) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what}:\n{text}");
    text
}

fn ready() -> bool {
    if common::skip_unless(
        common::Needs::LocalProcess,
        "node --test starts its own servers",
    ) {
        return false;
    }
    if !package().join("node_modules/typescript").exists() {
        common::skip(
            common::Skip::Missing,
            "the Node package's dependencies are not installed (scripts/prereqs.sh test runs npm ci in clients/node)",
        );
        return false;
    }
    true
}

/// Every file under `dir`, relative to it, with its contents.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push((
                    path.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&path).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_committed_build_is_the_sources() {
    if !ready() {
        return;
    }
    let fresh = std::env::temp_dir().join(format!("redis-lock-node-dist-{}", std::process::id()));
    ok(
        &run(
            &package(),
            "node",
            &["scripts/build.mjs", fresh.to_str().unwrap()],
        ),
        "build",
    );
    let (built, committed) = (files(&fresh), files(&package().join("dist")));
    let _ = std::fs::remove_dir_all(&fresh);
    let names = |f: &[(PathBuf, Vec<u8>)]| f.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&built),
        names(&committed),
        "dist/ is stale: npm run build in clients/node"
    );
    for ((path, a), (_, b)) in built.iter().zip(&committed) {
        assert!(
            a == b,
            "dist/{} is stale: npm run build in clients/node",
            path.display()
        );
    }
}

#[test]
fn the_node_package_passes_its_suite_on_ioredis_and_node_redis() {
    if !ready() {
        return;
    }
    let text = ok(
        &run(&package(), "node", &["--test", "test/"]),
        "node --test",
    );
    let count = |word: &str| -> usize {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("# {word} ")))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(usize::MAX)
    };
    println!(
        "{}",
        text.lines()
            .filter(|l| l.starts_with("# "))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(count("pass") > 30 && count("pass") != usize::MAX, "{text}");
    assert_eq!(count("fail"), 0);
    assert_eq!(count("skipped"), 0);
}

#[test]
fn the_node_package_installs_from_the_repo_and_loads_both_ways() {
    if !ready() {
        return;
    }
    let project =
        std::env::temp_dir().join(format!("redis-lock-node-project-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&project);
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("package.json"),
        "{ \"name\": \"app\", \"private\": true }\n",
    )
    .unwrap();
    let pkg = package();
    // As the README says; offline from the package's own node_modules for
    // the type check's compiler.
    ok(
        &run(
            &project,
            "npm",
            &["install", "--no-audit", "--no-fund", pkg.to_str().unwrap()],
        ),
        "npm install ./clients/node",
    );
    std::fs::write(
        project.join("esm.mjs"),
        "import { Locks, StaleFenceError } from 'redis-lock-client';\n\
         if (typeof Locks !== 'function' || !(new StaleFenceError(1, 2) instanceof Error)) process.exit(1);\n\
         console.log('esm ok');\n",
    )
    .unwrap();
    std::fs::write(
        project.join("cjs.cjs"),
        "const { Locks, NotHeldError } = require('redis-lock-client');\n\
         if (typeof Locks !== 'function' || typeof NotHeldError !== 'function') process.exit(1);\n\
         console.log('cjs ok');\n",
    )
    .unwrap();
    assert!(ok(&run(&project, "node", &["esm.mjs"]), "import").contains("esm ok"));
    assert!(ok(&run(&project, "node", &["cjs.cjs"]), "require").contains("cjs ok"));
    // The types, as a TypeScript user's code meets them (await using).
    std::fs::write(
        project.join("app.ts"),
        "import { Locks, Lease, StaleFenceError } from 'redis-lock-client';\n\
         export async function work(locks: Locks): Promise<number> {\n\
           await using lease = await locks.acquire('k', 30_000, { timeoutMs: 1000 });\n\
           if (!lease) return 0;\n\
           const l: Lease = lease;\n\
           await l.exec(['SET', 'k2', 'v']);\n\
           try { await l.fenced('gate', ['SET', 'd', 'x']); } catch (e) { if (e instanceof StaleFenceError) return e.mark; }\n\
           return await locks.using('k', 1000, async (signal, held) => (signal.aborted ? 0 : held.fence));\n\
         }\n",
    )
    .unwrap();
    let tsc = pkg.join("node_modules/typescript/bin/tsc");
    ok(
        &run(
            &project,
            "node",
            &[
                tsc.to_str().unwrap(),
                "--noEmit",
                "--strict",
                "--target",
                "ES2022",
                "--lib",
                "ES2022,ESNext.Disposable",
                "--module",
                "nodenext",
                "--moduleResolution",
                "nodenext",
                "--types",
                "node",
                "--typeRoots",
                pkg.join("node_modules/@types").to_str().unwrap(),
                "app.ts",
            ],
        ),
        "tsc over the installed package",
    );
    let _ = std::fs::remove_dir_all(&project);
}
