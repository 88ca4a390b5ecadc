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

/// A private scratch directory under /var/tmp (on disk, not tmpfs: its files must be read
/// from storage), made by mkdtemp (0700, so no other user can plant or redirect its files;
/// issue 23) and removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let dir = pagewise_kernel::private_dir::PrivateDir::new_in("/var/tmp", tag)
            .with_context(|| format!("creating a scratch directory for {tag} in /var/tmp"))?;
        Ok(Scratch(dir.keep()))
    }

    /// A file of `mb` MiB, written, synced and dropped from the page cache.
    pub fn file(&self, name: &str, mb: usize) -> anyhow::Result<PathBuf> {
        let path = self.0.join(name);
        let chunk = vec![0xa5u8; 1 << 20];
        let mut f = pagewise_kernel::private_dir::create_new_file(&path, 0o600)
            .with_context(|| format!("creating {}", path.display()))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory another user (uid 65534) made at the name the old code used —
    /// `/var/tmp/pagewise-{tag}-{pid}`, holding a symlink named like the scratch file to a file
    /// of ours — is neither written through nor used (issue 23).
    #[test]
    fn scratch_files_never_go_where_another_user_pointed() {
        let ours = pagewise_kernel::private_dir::PrivateDir::new("victim").unwrap();
        let victim = ours.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let planted = PathBuf::from(format!("/var/tmp/pagewise-planted-test-{}", std::process::id()));
        let script = format!(
            "mkdir -m 0777 '{d}' && ln -s '{v}' '{d}/pressure.bin'",
            d = planted.display(),
            v = victim.display()
        );
        if !pagewise_kernel::testing::run_as_user(65534, &script) {
            return;
        }
        let made = Scratch::new("planted-test").and_then(|s| {
            let f = s.file("pressure.bin", 1)?;
            Ok((s, f))
        });
        let _ = std::fs::remove_dir_all(&planted);
        let (scratch, file) = made.unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious", "written through a planted symlink");
        assert!(file.starts_with(&scratch.0) && !file.starts_with(&planted));
        assert_eq!(std::fs::metadata(&file).unwrap().len(), 1 << 20);
    }
}
