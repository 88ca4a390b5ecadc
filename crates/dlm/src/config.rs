//! Runtime configuration: a struct, or the environment (`PAGEWISE_DLM_*`). Pure parsing.

use crate::auth::{Secret, SECRET_ENV};
use crate::DlmError;

/// How faults on a DLM area reach the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultMode {
    /// The fastest this machine offers: userfaultfd with SIGBUS delivery when userfaultfd can be
    /// opened (measured faster than a handler thread, see dlm-fault), else SIGSEGV.
    Auto,
    /// A handler thread reads fault messages from the userfaultfd.
    HandlerThread,
    /// UFFD_FEATURE_SIGBUS: the faulting thread serves its own fault in a SIGBUS handler.
    Sigbus,
    /// No userfaultfd: PROT_NONE + SIGSEGV + mprotect on a memfd with a second, private view.
    Sigsegv,
}

impl FaultMode {
    pub fn parse(s: &str) -> Result<Self, DlmError> {
        Ok(match s {
            "auto" => FaultMode::Auto,
            "thread" | "handler-thread" | "handler_thread" => FaultMode::HandlerThread,
            "sigbus" => FaultMode::Sigbus,
            "sigsegv" => FaultMode::Sigsegv,
            _ => return Err(DlmError::Config(format!("unknown fault mode {s:?} (auto|thread|sigbus|sigsegv)"))),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultMode::Auto => "auto",
            FaultMode::HandlerThread => "handler_thread",
            FaultMode::Sigbus => "sigbus",
            FaultMode::Sigsegv => "sigsegv",
        }
    }
}

/// The runtime's configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Memory servers, `host:port` each.
    pub servers: Vec<String>,
    /// Most bytes of DLM pages resident on this host at any time.
    pub local_mem: usize,
    /// Base page size B: a power of two ≥ 4 KiB.
    pub base_page: usize,
    /// Largest set count (power of two); allocations are striped in blocks of B × max_set.
    pub max_set: u32,
    /// Set count at start (power of two ≤ max_set).
    pub set_count: u32,
    pub fault_mode: FaultMode,
    /// Most units requested ahead of a sequential stream of faults (0: no read-ahead).
    pub readahead: usize,
    /// userfaultfd modes: areas are memfd-backed and replies received straight into the
    /// memfd's page cache, mapped with UFFDIO_CONTINUE; false (default): anonymous areas
    /// (`move_install`). Ignored (off) when the kernel lacks shmem userfaultfd. Memfd areas are
    /// shared mappings: a child made by fork(2) shares them with its parent instead of getting
    /// a copy (see `dont_fork`).
    pub zero_copy: bool,
    /// Anonymous areas (kernels with UFFDIO_MOVE): units of 128 KiB or more are received into
    /// the area's shadow and moved into the program's view, reusing the frames of evicted
    /// units (runtime/frames.rs); false: copied in from a buffer with UFFDIO_COPY, which
    /// allocates every page (`pagewise eval dlm-fault` compares the two).
    pub move_install: bool,
    /// A small unit whose demand fault's reply lands in the program's view (SIGBUS, one
    /// program thread) is left writable and remembered by a hash of its bytes instead of being
    /// write-protected; eviction hashes it again and writes it home when it differs
    /// (runtime.rs, "Dirty tracking"). false: every clean unit is write-protected.
    pub hash_clean: bool,
    /// Eviction sees reads: the CLOCK hand unmaps a unit when it gives it a second chance,
    /// keeping its data (in the area's shadow, or its memfd), and the unit's next access sets
    /// its reference bit (runtime.rs, "Reference bits"). false: eviction sees only faults and
    /// first writes, which makes it FIFO by fault time.
    pub sample_references: bool,
    /// Tune the set count over windows of time while no loop is measured (programs without
    /// `dlm_start`/`dlm_end`, `pagewise run --page-size auto`). Loops are tuned regardless.
    pub auto_tune: bool,
    /// Smallest set count the tuner may choose (power of two ≤ max_set).
    pub min_set: u32,
    /// Length of a tuning window (`auto_tune`).
    pub tune_window: std::time::Duration,
    /// Where to write the tuner's decisions (JSON) when the runtime stops.
    pub decisions_path: Option<std::path::PathBuf>,
    /// A fault waiting longer than this for its memory server stops the program with a message
    /// naming the server (`None`: wait forever). Also bounds how long a dead peer goes unseen
    /// (TCP keepalive and TCP_USER_TIMEOUT).
    pub fault_timeout: Option<std::time::Duration>,
    /// Areas are not inherited by children made with fork(2) (MADV_DONTFORK, the default): a
    /// child would otherwise see zeros where the parent's pages live on a server, and the
    /// parent could not move pages the child shares copy-on-write (UFFDIO_MOVE: EBUSY).
    /// false: the child gets the pages resident at fork and zeros elsewhere — only for a
    /// child that never reads DLM memory.
    pub dont_fork: bool,
    /// The secret the memory servers expect (PROTOCOL.md, "Handshake"); `None`: the one in
    /// `PAGEWISE_DLM_SECRET` when the runtime connects.
    pub secret: Option<Secret>,
    /// How units are stored across the servers (`redundancy.rs`): once (a lost server ends the
    /// program), erasure-coded, or copied (a lost server loses nothing).
    pub redundancy: crate::redundancy::Redundancy,
    /// Handler-thread mode: while the program has one thread, the handler pins it and itself
    /// to one CPU, and gives both their masks back when the program has more threads
    /// (`runtime/colocate.rs`: a fault's wake-ups and TLB flushes then stay on one CPU).
    pub colocate: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            servers: Vec::new(),
            local_mem: 64 << 20,
            base_page: 16 << 10,
            max_set: 8,
            set_count: 8,
            fault_mode: FaultMode::Auto,
            readahead: 32,
            zero_copy: false,
            move_install: true,
            hash_clean: true,
            sample_references: true,
            auto_tune: false,
            min_set: 1,
            tune_window: std::time::Duration::from_millis(100),
            decisions_path: None,
            fault_timeout: Some(std::time::Duration::from_secs(30)),
            dont_fork: true,
            secret: None,
            redundancy: crate::redundancy::Redundancy::None,
            colocate: true,
        }
    }
}

/// Parse a size: bytes, or with a K/M/G suffix (powers of 1024; "KiB", "MB" accepted too).
pub fn parse_size(s: &str) -> Result<usize, DlmError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num.parse().map_err(|_| DlmError::Config(format!("bad size {s:?}")))?;
    let mult: usize = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        _ => return Err(DlmError::Config(format!("bad size unit in {s:?}"))),
    };
    n.checked_mul(mult).ok_or_else(|| DlmError::Config(format!("size {s:?} overflows")))
}

impl Config {
    /// Read `PAGEWISE_DLM_SERVERS` (required), `PAGEWISE_DLM_LOCAL_MEM`, `PAGEWISE_DLM_PAGE_SIZE`,
    /// `PAGEWISE_DLM_MAX_SET`, `PAGEWISE_DLM_SET_COUNT`, `PAGEWISE_DLM_FAULT_MODE`,
    /// `PAGEWISE_DLM_READAHEAD`, `PAGEWISE_DLM_ZERO_COPY` (0/1), `PAGEWISE_DLM_MOVE` (0/1:
    /// `move_install`), `PAGEWISE_DLM_HASH_CLEAN` (0/1: `hash_clean`), `PAGEWISE_DLM_REFERENCES` (0/1: `sample_references`), `PAGEWISE_DLM_AUTO_TUNE` (0/1),
    /// `PAGEWISE_DLM_MIN_SET`, `PAGEWISE_DLM_TUNE_WINDOW_MS`, `PAGEWISE_DLM_DECISIONS` (a file),
    /// `PAGEWISE_DLM_FAULT_TIMEOUT_MS` (0: none), `PAGEWISE_DLM_DONTFORK` (0/1), `PAGEWISE_DLM_COLOCATE` (0/1),
    /// `PAGEWISE_DLM_SECRET` (the servers' shared secret), `PAGEWISE_DLM_REDUNDANCY`
    /// (`none`, `ec:K+M`, `copies:N`) through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, DlmError> {
        let mut c = Config::default();
        let servers =
            get("PAGEWISE_DLM_SERVERS").ok_or_else(|| DlmError::Config("PAGEWISE_DLM_SERVERS is not set".into()))?;
        c.servers = servers.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        if let Some(v) = get("PAGEWISE_DLM_LOCAL_MEM") {
            c.local_mem = parse_size(&v)?;
        }
        if let Some(v) = get("PAGEWISE_DLM_PAGE_SIZE") {
            c.base_page = parse_size(&v)?;
        }
        let num = |k: &str, v: String| {
            v.trim().parse::<u32>().map_err(|_| DlmError::Config(format!("{k}={v:?} is not a number")))
        };
        if let Some(v) = get("PAGEWISE_DLM_MAX_SET") {
            c.max_set = num("PAGEWISE_DLM_MAX_SET", v)?;
            c.set_count = c.max_set;
        }
        if let Some(v) = get("PAGEWISE_DLM_SET_COUNT") {
            c.set_count = num("PAGEWISE_DLM_SET_COUNT", v)?;
        }
        if let Some(v) = get("PAGEWISE_DLM_FAULT_MODE") {
            c.fault_mode = FaultMode::parse(v.trim())?;
        }
        if let Some(v) = get("PAGEWISE_DLM_READAHEAD") {
            c.readahead = num("PAGEWISE_DLM_READAHEAD", v)? as usize;
        }
        if let Some(v) = get("PAGEWISE_DLM_ZERO_COPY") {
            c.zero_copy = num("PAGEWISE_DLM_ZERO_COPY", v)? != 0;
        }
        if let Some(v) = get("PAGEWISE_DLM_MOVE") {
            c.move_install = num("PAGEWISE_DLM_MOVE", v)? != 0;
        }
        if let Some(v) = get("PAGEWISE_DLM_HASH_CLEAN") {
            c.hash_clean = num("PAGEWISE_DLM_HASH_CLEAN", v)? != 0;
        }
        if let Some(v) = get("PAGEWISE_DLM_REFERENCES") {
            c.sample_references = num("PAGEWISE_DLM_REFERENCES", v)? != 0;
        }
        if let Some(v) = get("PAGEWISE_DLM_AUTO_TUNE") {
            c.auto_tune = num("PAGEWISE_DLM_AUTO_TUNE", v)? != 0;
        }
        if let Some(v) = get("PAGEWISE_DLM_MIN_SET") {
            c.min_set = num("PAGEWISE_DLM_MIN_SET", v)?;
        }
        if let Some(v) = get("PAGEWISE_DLM_TUNE_WINDOW_MS") {
            c.tune_window = std::time::Duration::from_millis(num("PAGEWISE_DLM_TUNE_WINDOW_MS", v)?.into());
        }
        if let Some(v) = get("PAGEWISE_DLM_DECISIONS") {
            c.decisions_path = Some(v.into());
        }
        if let Some(v) = get("PAGEWISE_DLM_DONTFORK") {
            c.dont_fork = num("PAGEWISE_DLM_DONTFORK", v)? != 0;
        }
        if let Some(v) = get(SECRET_ENV) {
            c.secret = Some(Secret::new(v).map_err(|e| DlmError::Config(format!("{SECRET_ENV}: {e}")))?);
        }
        if let Some(v) = get("PAGEWISE_DLM_REDUNDANCY") {
            c.redundancy = crate::redundancy::Redundancy::parse(&v)
                .map_err(|e| DlmError::Config(format!("PAGEWISE_DLM_REDUNDANCY: {e}")))?;
        }
        if let Some(v) = get("PAGEWISE_DLM_COLOCATE") {
            c.colocate = num("PAGEWISE_DLM_COLOCATE", v)? != 0;
        }
        if let Some(v) = get("PAGEWISE_DLM_FAULT_TIMEOUT_MS") {
            let ms = num("PAGEWISE_DLM_FAULT_TIMEOUT_MS", v)?;
            c.fault_timeout = (ms > 0).then(|| std::time::Duration::from_millis(ms.into()));
        }
        c.validate()?;
        Ok(c)
    }

    pub fn from_env() -> Result<Self, DlmError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Largest unit in bytes.
    pub fn block(&self) -> usize {
        self.base_page * self.max_set as usize
    }

    pub fn validate(&self) -> Result<(), DlmError> {
        let bad = |m: String| Err(DlmError::Config(m));
        if self.servers.is_empty() {
            return bad("no memory servers given".into());
        }
        if !self.base_page.is_power_of_two() || self.base_page < 4096 || self.base_page > (16 << 20) {
            return bad(format!("base page size {} must be a power of two in 4 KiB..16 MiB", self.base_page));
        }
        if !self.max_set.is_power_of_two() || self.max_set as usize * self.base_page > (64 << 20) {
            return bad(format!("max set count {} must be a power of two with B × max_set ≤ 64 MiB", self.max_set));
        }
        if !self.set_count.is_power_of_two() || self.set_count > self.max_set {
            return bad(format!("set count {} must be a power of two ≤ max set {}", self.set_count, self.max_set));
        }
        if self.local_mem < 2 * self.block() {
            return bad(format!("local memory {} is below two largest units ({})", self.local_mem, 2 * self.block()));
        }
        if !self.min_set.is_power_of_two() || self.min_set > self.max_set {
            return bad(format!(
                "minimum set count {} must be a power of two ≤ max set {}",
                self.min_set, self.max_set
            ));
        }
        if self.fault_timeout.is_some_and(|t| t < std::time::Duration::from_millis(100)) {
            return bad("fault timeout must be at least 100 ms".into());
        }
        if self.readahead > 1024 {
            return bad(format!("read-ahead {} units is more than 1024", self.readahead));
        }
        self.redundancy.check(self.base_page, self.servers.len()).map_err(DlmError::Config)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("16K").unwrap(), 16 << 10);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn env_is_read_and_validated() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let c = Config::from_lookup(env(&[
            ("PAGEWISE_DLM_SERVERS", "a:1, b:2"),
            ("PAGEWISE_DLM_LOCAL_MEM", "16M"),
            ("PAGEWISE_DLM_PAGE_SIZE", "4K"),
            ("PAGEWISE_DLM_MAX_SET", "4"),
        ]))
        .unwrap();
        assert_eq!(c.servers, vec!["a:1", "b:2"]);
        assert_eq!((c.local_mem, c.base_page, c.max_set, c.set_count), (16 << 20, 4096, 4, 4));
        assert!(Config::from_lookup(env(&[])).is_err());
        assert!(
            Config::from_lookup(env(&[("PAGEWISE_DLM_SERVERS", "a:1"), ("PAGEWISE_DLM_PAGE_SIZE", "5000")])).is_err()
        );
        assert!(Config::from_lookup(env(&[("PAGEWISE_DLM_SERVERS", "a:1"), ("PAGEWISE_DLM_MAX_SET", "3")])).is_err());
        assert!(
            Config::from_lookup(env(&[("PAGEWISE_DLM_SERVERS", "a:1"), ("PAGEWISE_DLM_LOCAL_MEM", "64K")])).is_err()
        );
        let ec =
            Config::from_lookup(env(&[("PAGEWISE_DLM_SERVERS", "a:1,b:2,c:3"), ("PAGEWISE_DLM_REDUNDANCY", "ec:2+1")]))
                .unwrap();
        assert_eq!(ec.redundancy, crate::redundancy::Redundancy::Erasure { data: 2, parity: 1 });
        let few =
            Config::from_lookup(env(&[("PAGEWISE_DLM_SERVERS", "a:1,b:2"), ("PAGEWISE_DLM_REDUNDANCY", "ec:2+1")]));
        assert!(few.unwrap_err().to_string().contains("at least 3"));
        let bad = Config::from_lookup(env(&[("PAGEWISE_DLM_SERVERS", "a:1,b:2"), ("PAGEWISE_DLM_REDUNDANCY", "raid")]));
        assert!(bad.unwrap_err().to_string().contains("PAGEWISE_DLM_REDUNDANCY"));
    }
}
