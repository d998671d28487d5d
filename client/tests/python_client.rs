//! The Python package (clients/python): installed into a virtual
//! environment as its README says (`pip install ./clients/python`), then
//! its pytest suite (sync, asyncio, the shared conformance suite, which
//! also runs over RESP2) against servers it starts with the module built
//! here. The environment, with pytest and redis-py, is made by
//! `scripts/prereqs.sh test`.

use redis_lock_testkit as common;

use std::path::PathBuf;
use std::process::Command;

fn venv() -> PathBuf {
    common::workspace_root().join("target/clients/python-venv")
}

/// Runs `args` with the environment's python; its output, or a panic.
fn python(args: &[&str]) -> std::process::Output {
    python_with(args, &[])
}

fn python_with(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let out = Command::new(venv().join("bin/python"))
        .args(args)
        .current_dir(common::workspace_root())
        .env("REDIS_SERVER", common::server_binary())
        .env("REDIS_LOCK_MODULE", common::module_path())
        .envs(env.iter().copied())
        .output()
        .expect("run the environment's python");
    out
}

/// pytest on `paths`: its summary line, asserted all passed and none
/// skipped.
fn pytest(paths: &[&str], env: &[(&str, &str)]) {
    let mut args = vec!["-m", "pytest", "-q", "-p", "no:cacheprovider"];
    args.extend_from_slice(paths);
    let out = python_with(&args, env);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    let summary = text.lines().last().unwrap_or_default().to_string();
    assert!(out.status.success(), "pytest {env:?} failed: {summary}");
    assert!(
        summary.contains(" passed") && !summary.contains("failed") && !summary.contains("skipped"),
        "{summary}"
    );
}

#[test]
fn the_python_package_installs_and_passes_its_suite() {
    if common::skip_unless(common::Needs::LocalProcess, "pytest starts its own servers") {
        return;
    }
    if !venv().join("bin/python").exists() {
        common::skip(
            common::Skip::Missing,
            "no Python environment for the client (scripts/prereqs.sh test makes target/clients/python-venv)",
        );
        return;
    }
    // As the package's README says (again each run: the sources change).
    let install = python(&[
        "-m",
        "pip",
        "install",
        "-q",
        "--force-reinstall",
        "--no-deps",
        "--no-build-isolation",
        "./clients/python",
    ]);
    assert!(
        install.status.success(),
        "pip install ./clients/python: {}",
        String::from_utf8_lossy(&install.stderr)
    );
    pytest(&["clients/python/tests"], &[]);
    // The shared scenarios once more over RESP2 (redis-py before 8 speaks
    // it by default; the environment's redis-py speaks RESP3), where the
    // replies are flat arrays instead of maps.
    pytest(
        &["clients/python/tests/test_conformance.py"],
        &[("PY_PROTOCOL", "2")],
    );
    // The import is the installed package's, not the source tree's.
    let which = python(&[
        "-c",
        "import redis_lock_client; print(redis_lock_client.__file__)",
    ]);
    let path = String::from_utf8_lossy(&which.stdout);
    assert!(path.contains("site-packages"), "{path}");
}
