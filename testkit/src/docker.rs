//! Docker mode's parts: the `docker` command, the module's path inside the
//! image, and a test server's container.

use std::process::{Command, Stdio};

/// The module's path inside the image (`Dockerfile`).
pub const MODULE_IN_IMAGE: &str = "/usr/local/lib/redis/modules/libredis_lock.so";

/// Runs `docker args...`; its stdout, trimmed, or Err with its stderr.
pub fn docker(args: &[&str]) -> Result<String, String> {
    let out = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run docker: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A test server's container (docker mode).
pub(crate) struct Container {
    pub(crate) name: String,
    /// The server arguments it was created with.
    pub(crate) args: Vec<String>,
    pub(crate) running: bool,
    /// `docker pause`d (set through `&self` by [`Server::signal`]).
    pub(crate) paused: std::sync::atomic::AtomicBool,
}
