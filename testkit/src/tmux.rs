//! A real terminal for tests of what draws on one (`redis-lock top`): a
//! tmux session on a server of its own (`tmux -L`, so a test never meets
//! another's sessions or the user's), keys sent and the pane read back as
//! text. Killed, server and all, on drop.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One tmux session running a shell command in a pane of a fixed size.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    /// Whether tmux is installed.
    pub fn available() -> bool {
        Command::new("tmux")
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A session `width` × `height` running `command` (through `sh -c`);
    /// the pane stays after the command ends, so what it left is read.
    pub fn start(command: &str, width: u16, height: u16) -> Tmux {
        let socket = format!(
            "redis-lock-test-{}-{}",
            std::process::id(),
            crate::free_port()
        );
        let t = Tmux { socket };
        let (w, h) = (width.to_string(), height.to_string());
        t.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            &w,
            "-y",
            &h,
            command,
        ]);
        t.run(&["set-option", "-t", "t", "remain-on-exit", "on"]);
        t
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Sends keys as `tmux send-keys` names them (`"s"`, `"Enter"`,
    /// `"Escape"`, `"Down"`), or literal text with `literal`.
    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "t"];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    /// Sends `text` as typed, key by key.
    pub fn type_text(&self, text: &str) {
        self.run(&["send-keys", "-t", "t", "-l", text]);
    }

    /// The pane's text now.
    pub fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "t"])
    }

    /// Waits up to `limit` for the pane to satisfy `done`; the screen then
    /// (a panic with the screen if it never did).
    pub fn wait_for(&self, limit: Duration, what: &str, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(
                start.elapsed() < limit,
                "the pane never showed {what}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the pane's command has ended.
    pub fn ended(&self) -> bool {
        self.run(&["display-message", "-p", "-t", "t", "#{pane_dead}"])
            .trim()
            == "1"
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .arg("kill-server")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
