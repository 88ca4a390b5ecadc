//! The paper's threshold files, in user space: `/run/pagewise/percpu_free_mem/cpuN` (one per
//! core: `min_free_kbytes`, `pages_low_ratio`, `pages_high_ratio`, one `key value` per line) and
//! `min_free_kbytes` (the global value: writing it sets every core, with ratios 125/150).
//! Writing a core file makes the global file the sum of the cores' mins.
//!
//! reclaimd creates the tree, polls it (content comparison, so a write within the same mtime
//! tick is not missed), applies valid writes, writes back the canonical text of every file,
//! and refuses invalid writes by restoring the file and logging why. `daemon.pid` says which
//! daemon owns the tree.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::policy::{CoreThresholds, PerCoreTable};

/// Where reclaimd exposes the thresholds.
pub const TREE_DIR: &str = "/run/pagewise/percpu_free_mem";

/// The tree as last written.
pub struct Tree {
    dir: PathBuf,
    last: BTreeMap<PathBuf, String>,
}

fn core_file(dir: &Path, cpu: usize) -> PathBuf {
    dir.join(format!("cpu{cpu}"))
}

impl Tree {
    /// Create the tree for `table` (replacing a dead daemon's leftover).
    pub fn create(dir: &Path, table: &PerCoreTable) -> io::Result<Self> {
        if dir.exists() {
            if let Some(pid) = running_daemon(dir) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} belongs to running reclaimd pid {pid}", dir.display()),
                ));
            }
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("daemon.pid"), std::process::id().to_string())?;
        let mut t = Tree { dir: dir.to_path_buf(), last: BTreeMap::new() };
        t.write_all(table)?;
        Ok(t)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Write every file's canonical text.
    pub fn write_all(&mut self, table: &PerCoreTable) -> io::Result<()> {
        for (&cpu, t) in table.cores() {
            self.put(core_file(&self.dir, cpu), t.to_text())?;
        }
        self.put(self.dir.join("min_free_kbytes"), format!("{}\n", table.global_min_free_kbytes()))
    }

    fn put(&mut self, path: PathBuf, text: String) -> io::Result<()> {
        if self.last.get(&path) != Some(&text) {
            std::fs::write(&path, &text)?;
        }
        self.last.insert(path, text);
        Ok(())
    }

    /// Apply what users wrote since the last poll. Returns one message per change or refusal;
    /// `true` in the second field when the table changed.
    pub fn poll(&mut self, table: &mut PerCoreTable) -> (Vec<String>, bool) {
        let mut msgs = Vec::new();
        let mut changed = false;
        let global = self.dir.join("min_free_kbytes");
        if let Ok(text) = std::fs::read_to_string(&global) {
            if self.last.get(&global) != Some(&text) {
                match text.trim().parse::<u64>() {
                    Ok(kb) => match table.set_global(kb) {
                        Ok(()) => {
                            msgs.push(format!("min_free_kbytes = {kb}: every core set to it with ratios 125/150"));
                            changed = true;
                        }
                        Err(e) => msgs.push(format!("refused {}: {e}", global.display())),
                    },
                    Err(_) => msgs.push(format!("refused {}: {:?} is not a number", global.display(), text.trim())),
                }
                self.last.remove(&global);
            }
        }
        let cpus: Vec<usize> = table.cores().keys().copied().collect();
        for cpu in cpus {
            let path = core_file(&self.dir, cpu);
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            if self.last.get(&path) == Some(&text) {
                continue;
            }
            let base = table.get(cpu).expect("known core");
            match CoreThresholds::parse_text(&text, base).and_then(|t| table.set_core(cpu, t)) {
                Ok(sum) => {
                    msgs.push(format!("cpu{cpu} = {:?}; min_free_kbytes is now {sum}", table.get(cpu).expect("set")));
                    changed = true;
                }
                Err(e) => msgs.push(format!("refused {}: {e}", path.display())),
            }
            self.last.remove(&path);
        }
        if let Err(e) = self.write_all(table) {
            msgs.push(format!("cannot rewrite {}: {e}", self.dir.display()));
        }
        (msgs, changed)
    }

    /// Remove the tree (the daemon's exit).
    pub fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The pid of the live daemon owning `dir`, if any.
pub fn running_daemon(dir: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(dir.join("daemon.pid")).ok()?.trim().parse().ok()?;
    pagewise_kernel::signal::process_alive(pid).then_some(pid)
}

/// Read the tree: every cpuN file and the global value.
pub fn read_tree(dir: &Path) -> io::Result<(BTreeMap<usize, CoreThresholds>, u64)> {
    let mut cores = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(cpu) = name.strip_prefix("cpu").and_then(|n| n.parse::<usize>().ok()) {
            let text = std::fs::read_to_string(entry.path())?;
            let t = CoreThresholds::parse_text(&text, CoreThresholds::with_defaults(0))
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {e}")))?;
            cores.insert(cpu, t);
        }
    }
    let global = std::fs::read_to_string(dir.join("min_free_kbytes"))?
        .trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "min_free_kbytes: not a number"))?;
    Ok((cores, global))
}

/// Write one core's file (the daemon applies it on its next poll).
pub fn write_core(dir: &Path, cpu: usize, t: &CoreThresholds) -> io::Result<()> {
    std::fs::write(core_file(dir, cpu), t.to_text())
}

/// Write the global file.
pub fn write_global(dir: &Path, kb: u64) -> io::Result<()> {
    std::fs::write(dir.join("min_free_kbytes"), format!("{kb}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn writes_are_applied_and_bad_ones_refused() {
        let scratch = pagewise_kernel::private_dir::PrivateDir::new("tree-test").unwrap();
        let dir = scratch.join("tree");
        let mut table = PerCoreTable::uniform(&BTreeSet::from([0, 1]), 3831);
        let mut tree = Tree::create(&dir, &table).unwrap();
        assert_eq!(running_daemon(&dir), Some(std::process::id() as i32));
        let (cores, global) = read_tree(&dir).unwrap();
        assert_eq!((cores[&1], global), (CoreThresholds::with_defaults(3831), 3831));

        write_core(&dir, 0, &CoreThresholds { min_free_kbytes: 12288, pages_low_ratio: 240, pages_high_ratio: 400 })
            .unwrap();
        std::fs::write(dir.join("cpu1"), "min_free_kbytes 256\npages_low_ratio 3300\npages_high_ratio 4000\n").unwrap();
        let (msgs, changed) = tree.poll(&mut table);
        assert!(changed, "{msgs:?}");
        assert_eq!(table.global_min_free_kbytes(), 12544);
        assert_eq!(read_tree(&dir).unwrap().1, 12544, "global file rewritten as the sum");

        std::fs::write(dir.join("cpu1"), "pages_low_ratio 50\n").unwrap();
        let (msgs, changed) = tree.poll(&mut table);
        assert!(!changed && msgs[0].contains("refused") && msgs[0].contains("pages_low_ratio"), "{msgs:?}");
        assert_eq!(read_tree(&dir).unwrap().0[&1].pages_low_ratio, 3300, "refused write undone in the file");

        write_global(&dir, 4000).unwrap();
        let (_, changed) = tree.poll(&mut table);
        assert!(changed);
        assert_eq!(read_tree(&dir).unwrap().0[&0], CoreThresholds::with_defaults(4000));
        tree.remove();
        assert!(!dir.exists());
    }
}
