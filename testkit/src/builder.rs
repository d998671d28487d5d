//! The options of a server to start ([`Builder`], from `Server::builder()`);
//! its last step, `start`, is in `server.rs`, with the server it makes.

use std::path::Path;

use crate::binaries::libfaketime;

pub struct Builder {
    pub(crate) args: Vec<String>,
    pub(crate) module_args: Vec<String>,
    pub(crate) with_module: bool,
    pub(crate) wrapper: Vec<String>,
    pub(crate) binary: String,
    pub(crate) port: Option<u16>,
}

impl Builder {
    /// Starts on this port rather than a free one (a test that takes
    /// another server's port while it is down).
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// A server without the module: what a user would run instead (the
    /// benchmarks' baseline); in docker mode the image's server alone.
    pub fn without_module(mut self) -> Self {
        self.with_module = false;
        self
    }

    /// A server config option, e.g. `.config("appendonly", "yes")`.
    pub fn config(mut self, name: &str, value: &str) -> Self {
        set_arg(&mut self.args, name, value);
        self
    }

    /// A module argument after the .so path, e.g. `.module_arg("restart-delay-ms", "500")`.
    pub fn module_arg(mut self, name: &str, value: &str) -> Self {
        self.module_args.push(name.into());
        self.module_args.push(value.into());
        self
    }

    /// Runs the server under a command (e.g. `valgrind --tool=callgrind`),
    /// in its data directory.
    pub fn wrapped_in(mut self, wrapper: &[&str]) -> Self {
        self.wrapper = wrapper.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Another server binary than `REDIS_SERVER` for this server.
    pub fn binary(mut self, path: &str) -> Self {
        self.binary = path.into();
        self
    }

    /// Runs the server under libfaketime with its wall clock (only: the
    /// monotonic clock stays real, as with an NTP step) offset by what
    /// `clock_file` says ([`set_clock_offset`]), read at every clock read.
    /// Not every server runs under it: see [`faketime_servers`].
    ///
    /// [`set_clock_offset`]: crate::set_clock_offset
    /// [`faketime_servers`]: crate::faketime_servers
    pub fn faked_wall_clock(self, clock_file: &Path) -> Self {
        let library = libfaketime().expect("libfaketime is missing: apt-get install faketime");
        let preload = format!("LD_PRELOAD={}", library.display());
        let timestamp_file = format!("FAKETIME_TIMESTAMP_FILE={}", clock_file.display());
        self.wrapped_in(&[
            "env",
            &preload,
            &timestamp_file,
            "FAKETIME_NO_CACHE=1",
            "FAKETIME_DONT_FAKE_MONOTONIC=1",
        ])
    }
}

/// Sets `--name value` in a server argument list, replacing an earlier value.
pub(crate) fn set_arg(args: &mut Vec<String>, name: &str, value: &str) {
    let flag = format!("--{name}");
    match args.iter().position(|a| *a == flag) {
        Some(i) => args[i + 1] = value.into(),
        None => args.extend([flag, value.into()]),
    }
}
