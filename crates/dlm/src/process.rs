//! Memory servers as child processes (`pagewise dlm-server`), for experiments and tools.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::auth::{Secret, SECRET_ENV};

/// The `pagewise` binary next to the running executable (the CLI itself, or a test binary's
/// target directory one level up).
pub fn pagewise_binary() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf);
    while let Some(d) = dir {
        let bin = d.join("pagewise");
        if bin.is_file() {
            return Ok(bin);
        }
        dir = d.parent().map(Path::to_path_buf);
        if d.file_name().is_some_and(|n| n == "target") {
            break;
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!("no `pagewise` binary next to {} (cargo build --release -p pagewise-cli)", exe.display()),
    ))
}

/// A `pagewise dlm-server` child process.
pub struct ServerProcess {
    child: Child,
    /// The address it listens on.
    pub addr: String,
}

impl ServerProcess {
    /// Start `bin dlm-server --listen 127.0.0.1:0 --capacity CAPACITY --json` for clients that
    /// know `secret` (handed over in the environment, never in argv), and wait for its banner.
    pub fn spawn(bin: &Path, capacity: &str, secret: &Secret) -> std::io::Result<Self> {
        Self::spawn_cmd(Command::new(bin), "127.0.0.1:0", capacity, secret)
    }

    /// Start through `cmd` (already naming the binary, possibly behind a wrapper).
    pub fn spawn_cmd(mut cmd: Command, listen: &str, capacity: &str, secret: &Secret) -> std::io::Result<Self> {
        cmd.env(SECRET_ENV, secret.as_env_value());
        // SAFETY: the closure only calls prctl, which is async-signal-safe. The server gets
        // SIGTERM when the spawning thread dies, so a killed experiment leaves no server behind.
        unsafe {
            cmd.pre_exec(|| {
                pagewise_kernel::net::set_parent_death_signal(libc::SIGTERM)
                    .map_err(|e| std::io::Error::from_raw_os_error(e.errno().unwrap_or(libc::EINVAL)))
            })
        };
        let mut child = cmd
            .args(["dlm-server", "--listen", listen, "--capacity", capacity, "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut err = BufReader::new(child.stderr.take().expect("piped"));
        let mut line = String::new();
        err.read_line(&mut line)?;
        let Some(addr) = line.split("listening on ").nth(1).and_then(|r| r.split_whitespace().next()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!("dlm-server did not start: {line:?}")));
        };
        let addr = addr.to_string();
        // Drained, not kept: a server that logs for hours must not grow this process.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut err, &mut std::io::sink());
        });
        Ok(ServerProcess { child, addr })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status if it has ended, without waiting.
    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.child.try_wait()
    }

    /// SIGTERM; returns its `--json` statistics line.
    pub fn stop(mut self) -> std::io::Result<String> {
        let _ = pagewise_kernel::net::kill(self.child.id() as i32, libc::SIGTERM);
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            o.read_to_string(&mut out)?;
        }
        self.child.wait()?;
        Ok(out)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
