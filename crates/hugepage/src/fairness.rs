//! Fair sharing of hugepages between the processes using HPS on one host.
//!
//! The seed's complaint about THP is unfairness: the first process takes every hugepage. Here
//! each HPS process declares its demand (hugepages it would use) in a small shared table,
//! `/run/pagewise/hps/budget` (one `pid used demand` line each), guarded by flock(2). Shares
//! are max-min fair (water-filling): a process demanding less than an equal split gets its
//! demand, the rest is split evenly among the others, so a newcomer gets its fair share at once
//! and later arrivals shrink the earlier ones' shares. A process may take a hugepage only while
//! `used < share`. Entries of dead processes are dropped on every access (kill(pid, 0)), so their
//! share is reclaimed without their cooperation.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use crate::{Error, Result};

/// Max-min fair shares of `total` among `demands` (same order).
pub fn fair_shares(total: u64, demands: &[u64]) -> Vec<u64> {
    let mut shares = vec![0u64; demands.len()];
    let mut left = total;
    let mut open: Vec<usize> = (0..demands.len()).filter(|&i| demands[i] > 0).collect();
    while !open.is_empty() && left > 0 {
        let each = left / open.len() as u64;
        if each == 0 {
            // Fewer units than claimants: one each in table order.
            for &i in open.iter().take(left as usize) {
                shares[i] += 1;
            }
            break;
        }
        let mut still = Vec::new();
        for &i in &open {
            let want = demands[i] - shares[i];
            let give = want.min(each);
            shares[i] += give;
            left -= give;
            if shares[i] < demands[i] {
                still.push(i);
            }
        }
        open = still;
    }
    shares
}

/// One process's line of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub pid: i32,
    pub used: u64,
    pub demand: u64,
}

/// Parse the table text.
pub fn parse_table(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace().map(|x| x.parse::<i64>().ok());
            Some(Entry { pid: it.next()?? as i32, used: it.next()?? as u64, demand: it.next()?? as u64 })
        })
        .collect()
}

/// Render the table text.
pub fn format_table(entries: &[Entry]) -> String {
    entries.iter().map(|e| format!("{} {} {}\n", e.pid, e.used, e.demand)).collect()
}

/// The shared hugepage budget of this host.
pub struct Budget {
    path: PathBuf,
    /// Hugepages shared by every HPS process.
    pub total: u64,
    pid: i32,
}

/// The default location of the table.
pub fn default_path() -> PathBuf {
    PathBuf::from("/run/pagewise/hps/budget")
}

impl Budget {
    /// Join the budget at `path` as `pid` with a host total of `total` hugepages.
    pub fn join(path: PathBuf, total: u64, pid: i32) -> Result<Self> {
        let b = Budget { path, total, pid };
        b.update(|_| {})?;
        Ok(b)
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io { path: self.path.display().to_string(), source }
    }

    /// Lock the table, drop dead processes, let `f` edit the entries (this process's at the
    /// given index, with the shares computed before the edit), write back. Returns `f`'s result
    /// and `(share, used)` of this process after the edit.
    fn locked<R>(
        &self,
        f: impl FnOnce(&mut Vec<Entry>, usize, &dyn Fn(&[Entry]) -> Vec<u64>) -> R,
    ) -> Result<(R, u64, u64)> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| self.io(e))?;
        }
        // The last process to leave unlinks the table; a process that opened the old file
        // before that and then got the lock must not write into the unlinked inode, so it
        // checks that the path still names the file it locked, and retries otherwise.
        let mut file = loop {
            let file: File = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.path)
                .map_err(|e| self.io(e))?;
            // The lock is released when the file closes.
            pagewise_kernel::fd::lock_exclusive(&file)?;
            let same = match (file.metadata(), std::fs::metadata(&self.path)) {
                (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                _ => false,
            };
            if same {
                break file;
            }
        };
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(|e| self.io(e))?;
        let mut entries: Vec<Entry> =
            parse_table(&text).into_iter().filter(|e| pagewise_kernel::signal::process_alive(e.pid)).collect();
        let idx = match entries.iter().position(|e| e.pid == self.pid) {
            Some(i) => i,
            None => {
                entries.push(Entry { pid: self.pid, used: 0, demand: 0 });
                entries.len() - 1
            }
        };
        let total = self.total;
        let shares_of = move |es: &[Entry]| -> Vec<u64> {
            fair_shares(total, &es.iter().map(|e| e.demand.max(e.used)).collect::<Vec<_>>())
        };
        let r = f(&mut entries, idx, &shares_of);
        let me = entries[idx];
        let share = shares_of(&entries)[idx];
        if me.used == 0 && me.demand == 0 {
            entries.remove(idx);
        }
        if entries.is_empty() {
            // Nobody uses HPS any more: leave nothing behind (still under the lock).
            std::fs::remove_file(&self.path).map_err(|e| self.io(e))?;
            return Ok((r, share, me.used));
        }
        file.set_len(0).map_err(|e| self.io(e))?;
        file.seek(SeekFrom::Start(0)).map_err(|e| self.io(e))?;
        file.write_all(format_table(&entries).as_bytes()).map_err(|e| self.io(e))?;
        Ok((r, share, me.used))
    }

    fn update(&self, f: impl FnOnce(&mut Entry)) -> Result<(u64, u64)> {
        self.locked(|es, i, _| f(&mut es[i])).map(|(_, s, u)| (s, u))
    }

    /// Declare how many hugepages this process would use; returns its share.
    pub fn set_demand(&self, demand: u64) -> Result<u64> {
        Ok(self.update(|e| e.demand = demand)?.0)
    }

    /// Take `n` hugepages if this process's share allows; returns whether it did.
    pub fn try_take(&self, n: u64) -> Result<bool> {
        let (granted, _, _) = self.locked(|es, i, shares_of| {
            es[i].demand = es[i].demand.max(es[i].used + n);
            let share = shares_of(es)[i];
            if es[i].used + n <= share {
                es[i].used += n;
                true
            } else {
                false
            }
        })?;
        Ok(granted)
    }

    /// Give back `n` hugepages.
    pub fn give_back(&self, n: u64) -> Result<()> {
        self.update(|e| e.used = e.used.saturating_sub(n)).map(|_| ())
    }

    /// `(share, used)` now.
    pub fn status(&self) -> Result<(u64, u64)> {
        self.update(|_| {})
    }

    /// Leave the table.
    pub fn leave(&self) -> Result<()> {
        self.update(|e| {
            e.used = 0;
            e.demand = 0;
        })
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn newcomer_gets_its_fair_share() {
        assert_eq!(fair_shares(100, &[100]), vec![100]);
        assert_eq!(fair_shares(100, &[100, 100]), vec![50, 50]);
        assert_eq!(fair_shares(100, &[10, 100, 100]), vec![10, 45, 45]);
        assert_eq!(fair_shares(2, &[5, 5, 5]), vec![1, 1, 0]);
    }

    proptest! {
        #[test]
        fn shares_are_max_min_fair(total in 0u64..10_000, demands in proptest::collection::vec(0u64..5_000, 0..12)) {
            let s = fair_shares(total, &demands);
            let sum: u64 = s.iter().sum();
            let want: u64 = demands.iter().sum();
            // Never more than asked, never more than there is, and nothing left idle while
            // someone is short.
            prop_assert!(sum <= total);
            prop_assert_eq!(sum, total.min(want));
            for (i, &d) in demands.iter().enumerate() {
                prop_assert!(s[i] <= d);
            }
            // Max-min: a process short of its demand has at least the share of any other
            // (up to one unit of rounding).
            for i in 0..s.len() {
                if s[i] < demands[i] {
                    for j in 0..s.len() {
                        prop_assert!(s[i] + 1 >= s[j], "{:?} {:?}", s, demands);
                    }
                }
            }
        }
    }

    #[test]
    fn table_shares_between_live_processes_and_reclaims_the_dead() {
        let scratch = pagewise_kernel::private_dir::PrivateDir::new("budget-test").unwrap();
        let dir = scratch.path().to_path_buf();
        let path = dir.join("budget");
        let _ = std::fs::remove_file(&path);
        let me = pagewise_kernel::signal::getpid();
        let a = Budget::join(path.clone(), 10, me).unwrap();
        a.set_demand(10).unwrap();
        for _ in 0..10 {
            assert!(a.try_take(1).unwrap());
        }
        assert!(!a.try_take(1).unwrap(), "over the host total");
        // A live newcomer (a child process that sleeps) halves the share.
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let b = Budget::join(path.clone(), 10, child.id() as i32).unwrap();
        assert_eq!(b.set_demand(10).unwrap(), 5);
        assert!(!a.try_take(1).unwrap());
        assert_eq!(a.status().unwrap(), (5, 10));
        a.give_back(5).unwrap();
        assert!(b.try_take(5).unwrap());
        assert!(!b.try_take(1).unwrap());
        // The newcomer dies: its share comes back.
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(a.status().unwrap(), (10, 5));
        assert!(a.try_take(5).unwrap());
        a.leave().unwrap();
        assert!(!path.exists(), "the last process to leave removes the table");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
