//! Shared by the reclaim experiments: the `pagewise-reclaim-load` helper (built next to the
//! `pagewise` binary), scratch files under /var/tmp removed afterwards, and a memory cgroup
//! per run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context as _};

/// The helper binary, a sibling of the running executable.
pub fn load_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dirs = vec![exe.parent().map(Path::to_path_buf)];
    // Test binaries live one level deeper (target/release/deps).
    dirs.push(exe.parent().and_then(Path::parent).map(Path::to_path_buf));
    for d in dirs.into_iter().flatten() {
        let p = d.join("pagewise-reclaim-load");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "pagewise-reclaim-load not found next to {}: build it with `cargo build --release --workspace`",
        exe.display()
    )
}

/// A scratch directory under /var/tmp, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let dir = PathBuf::from(format!("/var/tmp/pagewise-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }

    /// A file of `mb` MiB, written, synced and dropped from the page cache.
    pub fn file(&self, name: &str, mb: usize) -> anyhow::Result<PathBuf> {
        let path = self.0.join(name);
        let chunk = vec![0xa5u8; 1 << 20];
        let mut f = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        for _ in 0..mb {
            std::io::Write::write_all(&mut f, &chunk)?;
        }
        f.sync_all()?;
        pagewise_kernel::pagecache::drop_file_cache(&path)?;
        Ok(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Start the helper in `mode` with `args`.
pub fn spawn(bin: &Path, mode: &str, args: &[(&str, String)]) -> anyhow::Result<Child> {
    let mut c = Command::new(bin);
    c.arg(mode);
    for (k, v) in args {
        c.arg(format!("--{k}")).arg(v);
    }
    c.stdout(Stdio::piped()).spawn().with_context(|| format!("starting {} {mode}", bin.display()))
}

/// Wait for the helper and parse its JSON line.
pub fn finish(child: Child) -> anyhow::Result<serde_json::Value> {
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("pagewise-reclaim-load failed: {}", out.status);
    }
    serde_json::from_slice(&out.stdout).context("parsing the load's output")
}
