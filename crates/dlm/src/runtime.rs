//! The client runtime: DLM areas, their fault handling, page sets, the local limit, eviction
//! and write-back.
//!
//! Where things are: this file holds the API (`Dlm`), the areas, the resident set and its
//! eviction, requesting and installing units; `runtime/fault.rs` the fault path (handler
//! thread, `serve`); `runtime/remote.rs` the connections and the checking of every reply.
//!
//! # How a fault is served
//! All state sits behind one mutex (`State`); a fault is served by whoever receives it — the
//! handler thread (userfaultfd messages) or the faulting thread itself (SIGBUS / SIGSEGV
//! handler). Serving page p at set count s:
//! 1. the unit is the s-page range aligned to s around p (`Layout::unit`);
//! 2. if it is already on its way (read-ahead), the replies queued before it on its home's
//!    connection are installed in order, then it;
//! 3. otherwise room is made under the local limit (CLOCK victims, see "Reference bits";
//!    clean ones dropped, dirty ones written back first), a READ is sent to the home and its
//!    reply installed. Pages that
//!    were never written back are installed as zeros without a message;
//! 4. faults that continue a sequential run grow a read-ahead window: READs for the next units
//!    are sent without waiting, so the stream keeps the network busy while the program works.
//!    The window is topped up in batches — only when less than half of it is still ahead, then
//!    all of it: room for the whole batch is made at once (adjacent victims, the stream's oldest
//!    units, dropped or moved to the shadow with one call: `Run`) and the batch's READs leave in
//!    one `write` (`Transport::send_headers`). A demand READ leaves at once;
//! 5. read-ahead replies that have arrived whole behind the faulting unit are installed too
//!    (`complete_arrived`): the program runs into them without a fault, and adjacent ones are
//!    moved in and write-protected together (`MoveIns`). `Run` says why batching pays: TLB
//!    flushes.
//!
//! # Dirty tracking: synchronous write-protect, not WP_ASYNC
//! Pages are installed write-protected (UFFDIO_COPY mode WP; PROT_READ in the SIGSEGV mode); the
//! first write faults, marks the unit dirty and un-protects it. A unit fetched for a fault
//! known to be a write (the x86 error code under SIGBUS, the message's flag under the handler
//! thread) is installed writable and dirty at once: one fault and no protect-then-open.
//! Eviction of a dirty unit write-protects it again *before* reading it for write-back, so a
//! concurrent writer waits for the handler and never loses a store. UFFD_FEATURE_WP_ASYNC would resolve WP faults in the
//! kernel, cheaper per first write, but then nothing holds a writer back between the write-back
//! read and MADV_DONTNEED, which loses updates from other threads (`examples/dlm_local_fault.rs`
//! measures both costs).
//!
//! Small units received into the program's view (below) are not protected at all
//! (`Config::hash_clean`): the runtime keeps a hash of their bytes (xxh3, keyed per runtime)
//! and eviction hashes them again — equal: clean, dropped; different: written home. Protecting
//! a few pages costs a TLB flush per page on this VM (`HASH_MAX`), on the fault's critical
//! path, and their first write would cost a fault; hashing is cheaper up to 128 KiB and moves
//! half its cost to eviction. A written unit keeps its hash with probability 2^-64. Eviction
//! protects a hashed unit before hashing it when another thread could write it meanwhile, as
//! for a write-back.
//!
//! # Fault delivery
//! SIGBUS (UFFD_FEATURE_SIGBUS, `signals.rs`) serves the fault on the faulting thread and saves
//! two thread wake-ups per fault (`pagewise eval dlm-fault` compares it with the handler
//! thread). It cannot serve faults the kernel takes on the program's behalf (a `read(2)` into a
//! missing page returns EFAULT); the handler thread can, so programs that hand DLM memory to
//! system calls (and every program under `pagewise run`) use it.
//!
//! # Reference bits
//! A read of a resident unit does not fault, so CLOCK would see a unit used only when it is
//! faulted in or first written — FIFO by fault time. The bit is sampled instead, as the
//! classic software-referenced-bit schemes do: when the hand clears a unit's bit it *arms* the
//! unit — takes it out of the program's page tables, keeping its pages — and the unit's next
//! access faults, sets the bit and puts the same pages back. Anonymous areas (the default, on
//! kernels with UFFDIO_MOVE): the pages are moved into the unit's place in the area's shadow
//! and moved back (`move_in`: write-protected while clean). Memfd areas: MADV_DONTNEED on the
//! shared view (the pages stay in the memfd), a minor fault, UFFDIO_CONTINUE. SIGSEGV areas:
//! PROT_NONE. The cost is one move or madvise per pass of the hand and one fault per unit
//! still in use; `Stats::second_chances` and `reference_faults` count them. When every unit
//! is referenced (a scan outruns the hand) the tie goes to a unit never used since it came in
//! (`clock.rs`). Anonymous areas without a shadow (kernels without UFFDIO_MOVE nor shmem
//! userfaultfd) cannot be armed — dropping their pages would lose the only copy — so there
//! reads stay unseen; so with `Config::sample_references` off.
//!
//! # Installing pages
//! Default: anonymous areas. With UFFDIO_MOVE each has a *shadow*, a private mapping of the
//! same size the program never sees, where evicted units' pages are moved and kept as frames
//! (`runtime/frames.rs`, which also says why a clean unit is moved in only while the program
//! has one thread). Where a READ of a wholly missing unit is received (`Inner::reply_target`):
//! - a demand fault served on the faulting thread (SIGBUS) of a program with one thread, unit
//!   of 16 KiB or more (`VIEW_MIN`; any size with `hash_clean`): into the program's view
//!   itself. While the request travels, frames are moved to the unit's place there (its own,
//!   else any kept, else fresh pages); the reply is received into them and write-protected
//!   (or hashed). The program cannot see the place before that: its one thread is the one in
//!   the handler, with every signal blocked. After the reply only the write-protect (or hash)
//!   is left, where the other ways also move or copy every page.
//! - else, units of 128 KiB or more: into frames in the shadow — the unit's own, still at its
//!   place, else a kept run as large as the unit wherever it lies (*borrowed*), else frames
//!   gathered into the unit's place while the request travels — and moved from there into the
//!   program's view.
//! - smaller units, and kernels without UFFDIO_MOVE: into the buffer, then UFFDIO_COPY (atomic
//!   per page, mode WP).
//!
//! While the reply is awaited, the pages it will land in are read into the cache (`warm` in
//! `runtime/remote.rs`), so the copy out of the socket does not wait on memory.
//!
//! Zero-copy (`Config::zero_copy`): the area is a memfd mapped twice, the program's view
//! registered MISSING + MINOR + WP and an alias the runtime reads and writes through; a READ
//! of a wholly missing unit populates the unit's page-cache pages through the alias while the
//! request travels, receives the reply straight into them and maps them with UFFDIO_CONTINUE
//! mode WP. Eviction punches the unit out of the memfd (MADV_REMOVE).
//! SIGSEGV mode: the area is a memfd mapped twice, the program's view (PROT_NONE until
//! installed) and a private read-write view; data is copied through the private view, then
//! the program's view is opened (mprotect), so no thread ever sees a half-copied page.
//! Dirty data for write-back is read through the runtime's own view (shadow, alias or private
//! view) where the unit is armed, so the runtime never faults on its own areas.
//!
//! Reply headers are busy-polled briefly before the thread sleeps (`TcpTransport`): on a VM a
//! wake-up costs about as much as a small transfer.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use pagewise_kernel::mem::{madvise, memfd_create, mprotect, Advice, MapOptions, Mapping, Protection};
use pagewise_kernel::uffd::{feature, RegisterMode, Uffd, UffdBuilder};

mod fault;
mod frames;
mod remote;

use frames::Frames;

/// Smallest unit received into the shadow and moved in after its reply (a read-ahead unit, or
/// any unit of a program with more threads or under the handler thread). Below it one
/// UFFDIO_COPY costs less than gathering frames, reading the thread count, a move and a
/// write-protect: `pagewise eval dlm-fault` measured moving at 1.15× copying for 64 KiB units,
/// 0.69× for 256 KiB and 0.64× for 1 MiB (server on the other core).
const MOVE_MIN: usize = 128 << 10;

/// Smallest unit whose demand fault's reply is received into the program's view. For a
/// 4 KiB unit the move before and the write-protect after cost more than one UFFDIO_COPY
/// (medians of four interleaved runs of `examples/dlm_remote_fault`, server on the other core:
/// 4 KiB 25.3 µs against 21.6; 16 KiB 28.1 against 30.4, and 1.006× over 8 more pairs: even).
/// From 64 KiB on it wins clearly (0.78× at 64 KiB, 0.95× at 1 MiB).
const VIEW_MIN: usize = 16 << 10;

/// Largest unit installed hashed rather than write-protected (`Config::hash_clean`), and then
/// received into the program's view from one page on. Write-protecting n ≤ 33 pages flushes
/// them from the TLB one at a time (arch/x86/mm/tlb.c, tlb_single_page_flush_ceiling): 1.3 µs
/// for one page, 2.0 µs for 4, 5.0 µs for 16 and about 9 µs for 32 on this VM; hashing them
/// (xxh3 with AVX2, 17-30 GB/s as the host allows) takes 0.14-0.27 µs a page, twice over a
/// unit's stay (install and eviction). From 34 pages on one full flush is cheaper.
const HASH_MAX: usize = 128 << 10;

use crate::clock::Clock;
use crate::config::{Config, FaultMode};
use crate::layout::Layout;
use crate::proto::{Header, Opcode};
use crate::transport::TcpTransport;
use crate::DlmError;

/// A second mapping of an area's memfd, and the memfd.
type MemfdView = (Mapping, OwnedFd);

/// Page table value: not resident.
const NONE: u32 = u32::MAX;
/// Page table value: requested from its home, reply not yet installed.
const INFLIGHT: u32 = u32::MAX - 1;
/// Pending replies a connection may owe at most.
const MAX_PENDING: usize = 2048;

/// Counters of the runtime (`dlm_stats`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    pub mode: &'static str,
    /// How fetched pages are installed: "continue" (received straight into the memfd page
    /// cache, mapped with UFFDIO_CONTINUE), "copy" (UFFDIO_COPY) or "mprotect" (SIGSEGV mode).
    pub install: &'static str,
    /// The userfaultfd handles user-mode faults only (an unprivileged process).
    pub uffd_user_mode_only: bool,
    pub base_page: usize,
    pub set_count: u32,
    pub max_set: u32,
    pub local_limit: usize,
    pub resident_bytes: usize,
    pub peak_resident_bytes: usize,
    /// Missing-page faults served.
    pub faults: u64,
    /// First-write (write-protect) faults served.
    pub wp_faults: u64,
    /// Units opened for writing after they were installed write-protected: at first-write
    /// faults, and at known writes to units installed clean (read-ahead). A store to a unit
    /// that is not resident installs it open, and counts in neither.
    pub opened_units: u64,
    /// Resident units the CLOCK hand gave a second chance and armed (unmapped from the
    /// program's view, data kept) to see their next use.
    pub second_chances: u64,
    /// Accesses to armed units: each a reference the eviction policy saw.
    pub reference_faults: u64,
    /// Units installed by moving their received pages into the program's view (`frames.rs`).
    pub moved_units: u64,
    /// Of those, units received into kept frames where those lay (another unit's place in the
    /// shadow) rather than at their own place (`Inner::receive_target`).
    pub borrowed_receives: u64,
    /// Of those, units received straight into the program's view (`Inner::fill_view`).
    pub view_receives: u64,
    /// Units fetched from a home (demand and read-ahead).
    pub fetched_units: u64,
    pub fetched_bytes: u64,
    pub readahead_units: u64,
    /// Read-ahead units installed before the program reached them, their reply having
    /// arrived whole when a fault was served (`Inner::complete_arrived`): no fault of their own.
    pub arrived_installs: u64,
    /// Units moved into the program's view together with the unit before them, one move and
    /// one write-protect for both (`MoveIns`).
    pub joined_move_ins: u64,
    /// Units installed as zeros because they were never written back.
    pub zero_units: u64,
    /// Clean units left writable and remembered by a hash of their bytes instead of
    /// write-protected (`Config::hash_clean`; module doc, "Dirty tracking").
    pub hashed_installs: u64,
    /// Evicted hashed units whose bytes still had their hash (dropped) or not (written home).
    pub clean_by_hash: u64,
    pub written_by_hash: u64,
    pub evictions: u64,
    pub writebacks: u64,
    pub writeback_bytes: u64,
    pub areas: usize,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    area: u32,
    first: u32,
    count: u32,
    dirty: bool,
    /// Clean but writable: the hash of its bytes when installed (`Config::hash_clean`).
    /// Eviction compares; a difference means the program wrote it.
    clean_hash: Option<u64>,
    /// The hand cleared its reference bit and unmapped it from the program's view (its data
    /// stays in the memfd): its next access faults and counts as a reference.
    armed: bool,
}

struct Area {
    addr: usize,
    len: usize,
    layout: Layout,
    /// Region id on each server (0: none there).
    regions: Vec<u32>,
    /// Per base page: clock slot, NONE or INFLIGHT.
    slot: Vec<u32>,
    /// Per base page: its home holds data written back (else it still reads as zeros).
    home_written: Vec<bool>,
    /// Per base page: the loop or window being measured faulted on it (`measure.rs`).
    touched: Vec<u64>,
    /// Sequential-stream detection: end page of the last demand fault and the window.
    last_end: usize,
    window: usize,
    /// The program's view; unmapped when the area is dropped.
    _view: Mapping,
    /// SIGSEGV mode: the private read-write view and the memfd behind both.
    staging: Option<(Mapping, OwnedFd)>,
    /// Zero-copy userfaultfd mode: the runtime's own read-write view of the memfd behind the
    /// program's view (not registered with the userfaultfd), and the memfd.
    alias: Option<(Mapping, OwnedFd)>,
    /// Anonymous areas with UFFDIO_MOVE: the runtime's private mapping of the area's size,
    /// where replies are received, armed units wait and kept frames lie (`frames.rs`).
    shadow: Option<Mapping>,
}

pub(crate) struct State {
    conns: Vec<Conn>,
    areas: Vec<Option<Area>>,
    clock: Clock<Entry>,
    /// Frames of evicted units kept for the next fetch (shadow areas).
    frames: Frames,
    /// Kept frames a reply in flight is being received into, away from their place: nothing
    /// may be moved into these ranges of the shadow until that reply is installed (`frames.rs`).
    borrowed: Vec<(usize, usize)>,
    /// `Inner::sole_program_thread`, found once per holding of the lock.
    sole_thread: Option<bool>,
    /// Clean units moved in while a fault takes its replies, not yet write-protected.
    move_ins: MoveIns,
    set_count: u32,
    resident: usize,
    buf: Vec<u8>,
    zeros: Vec<u8>,
    stats: Stats,
    measure: crate::measure::Measure,
}

pub(crate) struct Inner {
    cfg: Config,
    mode: FaultMode,
    /// Areas are memfd-backed (shmem userfaultfd is available): reference bits can be
    /// sampled (module doc, "Reference bits").
    memfd: bool,
    /// Replies are received into the memfd's page cache and mapped with UFFDIO_CONTINUE.
    zero_copy: bool,
    /// The userfaultfd has UFFDIO_MOVE: anonymous areas get a shadow (`frames.rs`).
    moving: bool,
    /// This process's thread count (`Inner::sole_program_thread`).
    threads: Option<pagewise_kernel::procfs::ThreadCount>,
    /// Key of the clean units' hashes, random per runtime: what a program writes cannot be
    /// chosen to collide.
    hash_seed: u64,
    uffd: Option<Uffd>,
    state: Mutex<State>,
    stop: AtomicBool,
}

/// The DLM runtime of this process (at most one at a time).
pub struct Dlm {
    inner: Arc<Inner>,
    handler: Option<JoinHandle<()>>,
    signal: Option<crate::signals::Installed>,
}

use fault::handler_thread;
pub(crate) use fault::Served;
use remote::{Conn, Pending, ReplyInto};

/// The runtime the signal handlers serve; set while a signal mode is active.
pub(crate) static ACTIVE: AtomicPtr<Inner> = AtomicPtr::new(std::ptr::null_mut());
static INITIALISED: AtomicBool = AtomicBool::new(false);

/// Open the userfaultfd for `mode`; returns it and whether it handles user-mode faults only.
///
/// Without CAP_SYS_PTRACE and with vm.unprivileged_userfaultfd=0, userfaultfd(2) is still
/// allowed with UFFD_USER_MODE_ONLY (Linux 5.11, fs/userfaultfd.c userfaultfd_syscall_allowed).
/// Such a descriptor does not see faults taken inside the kernel (a read(2) into a missing DLM
/// page gets EFAULT) — which the SIGBUS mode cannot serve anyway — so an unprivileged program
/// still gets the userfaultfd path; PROT_NONE + SIGSEGV remains for kernels or sandboxes
/// (e.g. container seccomp profiles) where userfaultfd cannot be opened at all.
/// `kernel_features`: what the kernel's userfaultfd offers (queried once by the caller).
fn open_uffd(mode: FaultMode, shmem: bool, kernel_features: u64) -> Result<(Uffd, bool), pagewise_kernel::Error> {
    let builder = |user_mode_only: bool| {
        let mut b = UffdBuilder::new()
            .require(feature::PAGEFAULT_FLAG_WP | (feature::MOVE & kernel_features))
            .user_mode_only(user_mode_only);
        if shmem {
            b = b.require(feature::MISSING_SHMEM | feature::MINOR_SHMEM | feature::WP_HUGETLBFS_SHMEM);
        }
        if mode == FaultMode::Sigbus {
            b.require(feature::SIGBUS)
        } else {
            b.nonblocking(true)
        }
    };
    match builder(false).open() {
        Ok(u) => Ok((u, false)),
        Err(first) => builder(true).open().map(|u| (u, true)).map_err(|_| first),
    }
}

impl Dlm {
    /// Connect to the servers and start serving faults.
    pub fn init(cfg: Config) -> Result<Dlm, DlmError> {
        cfg.validate()?;
        if INITIALISED.swap(true, Ordering::AcqRel) {
            return Err(DlmError::AlreadyInitialised);
        }
        match Self::start(cfg) {
            Ok(d) => Ok(d),
            Err(e) => {
                INITIALISED.store(false, Ordering::Release);
                Err(e)
            }
        }
    }

    fn start(cfg: Config) -> Result<Dlm, DlmError> {
        // Areas are anonymous memory with a shadow when the kernel has UFFDIO_MOVE (armed
        // units wait in the shadow). They are memfd-backed — shmem userfaultfd (MISSING, MINOR
        // and WP on shmem) — for zero-copy, and for reference sampling without UFFDIO_MOVE.
        let kernel_features = pagewise_kernel::uffd::api_info().map_or(0, |i| i.features);
        let has_move = kernel_features & feature::MOVE != 0;
        let open = |m: FaultMode| -> Result<(Uffd, bool, bool), pagewise_kernel::Error> {
            if cfg.zero_copy || (cfg.sample_references && !has_move) {
                if let Ok((u, umo)) = open_uffd(m, true, kernel_features) {
                    return Ok((u, umo, true));
                }
            }
            open_uffd(m, false, kernel_features).map(|(u, umo)| (u, umo, false))
        };
        let (mode, uffd, user_mode_only, memfd) = match cfg.fault_mode {
            FaultMode::Sigsegv => (FaultMode::Sigsegv, None, false, false),
            FaultMode::Auto => match open(FaultMode::Sigbus) {
                Ok((u, umo, zc)) => (FaultMode::Sigbus, Some(u), umo, zc),
                Err(_) => (FaultMode::Sigsegv, None, false, false),
            },
            m => {
                let (u, umo, zc) = open(m).map_err(DlmError::Kernel)?;
                (m, Some(u), umo, zc)
            }
        };
        let mut conns = Vec::new();
        for addr in &cfg.servers {
            let t = TcpTransport::connect(addr)
                .and_then(|t| t.with_timeout(cfg.fault_timeout))
                .map_err(|e| DlmError::Connect { server: addr.clone(), source: e })?;
            conns.push(Conn {
                t: Box::new(t),
                addr: addr.clone(),
                next_id: 1,
                pending: VecDeque::with_capacity(MAX_PENDING),
                corked: Vec::with_capacity(MAX_PENDING),
            });
        }
        let zero_copy = memfd && cfg.zero_copy;
        let moving = !memfd && uffd.as_ref().is_some_and(|u| u.has(feature::MOVE));
        let threads = if moving { pagewise_kernel::procfs::ThreadCount::open().ok() } else { None };
        let max_units = cfg.local_mem / cfg.base_page + 1;
        let tuner = crate::tune::TunerConfig {
            base_page: cfg.base_page,
            local_mem: cfg.local_mem,
            min_set: cfg.min_set,
            max_set: cfg.max_set,
        };
        let state = State {
            measure: crate::measure::Measure::new(tuner, cfg.auto_tune, cfg.tune_window, cfg.set_count),
            conns,
            areas: Vec::new(),
            clock: Clock::with_capacity(max_units),
            frames: Frames::with_capacity(1024),
            borrowed: Vec::with_capacity(MAX_PENDING),
            sole_thread: None,
            move_ins: MoveIns::default(),
            set_count: cfg.set_count,
            resident: 0,
            buf: vec![0u8; cfg.block()],
            zeros: vec![0u8; cfg.block()],
            stats: Stats {
                mode: mode.name(),
                install: match (mode, zero_copy, moving) {
                    (FaultMode::Sigsegv, ..) => "mprotect",
                    (_, true, _) => "continue",
                    (_, false, true) if cfg.move_install => "move",
                    (_, false, _) => "copy",
                },
                uffd_user_mode_only: user_mode_only,
                base_page: cfg.base_page,
                max_set: cfg.max_set,
                local_limit: cfg.local_mem,
                ..Default::default()
            },
        };
        let inner = Arc::new(Inner {
            cfg,
            mode,
            memfd,
            zero_copy,
            moving,
            threads,
            hash_seed: std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u64),
            uffd,
            state: Mutex::new(state),
            stop: AtomicBool::new(false),
        });
        let mut dlm = Dlm { inner: Arc::clone(&inner), handler: None, signal: None };
        match mode {
            FaultMode::HandlerThread => {
                let i = Arc::clone(&inner);
                let h = std::thread::Builder::new()
                    .name("dlm-fault-handler".into())
                    .spawn(move || handler_thread(&i))
                    .map_err(DlmError::Thread)?;
                dlm.handler = Some(h);
            }
            FaultMode::Sigbus | FaultMode::Sigsegv => {
                ACTIVE.store(Arc::as_ptr(&inner) as *mut Inner, Ordering::Release);
                let sig = if mode == FaultMode::Sigbus { libc::SIGBUS } else { libc::SIGSEGV };
                dlm.signal = Some(crate::signals::install(sig).map_err(DlmError::Signal)?);
            }
            FaultMode::Auto => unreachable!("resolved above"),
        }
        Ok(dlm)
    }

    /// The fault mode in use.
    pub fn mode(&self) -> FaultMode {
        self.inner.mode
    }

    /// A new area of `len` bytes: ordinary memory to every thread, backed by the servers.
    pub fn alloc(&self, len: usize) -> Result<*mut u8, DlmError> {
        self.alloc_inner(len, None)
    }

    /// Make `[addr, addr + n)` an area, where n is `len` rounded down to whole largest units
    /// (returned), replacing what is mapped there now; its content starts as zeros. For memory
    /// that must keep its address, such as a program's zero-initialised data (`pagewise run
    /// --bss`). Userfaultfd modes only (not SIGSEGV). The area is anonymous memory, keeping the
    /// private semantics of what it replaces.
    ///
    /// # Safety
    /// The caller owns `[addr, addr + len)`: nothing else uses or unmaps what is there now.
    pub unsafe fn alloc_at(&self, addr: usize, len: usize) -> Result<usize, DlmError> {
        let n = len / self.inner.cfg.block() * self.inner.cfg.block();
        if n == 0 {
            return Err(DlmError::Config(format!("{len} bytes are less than one largest unit")));
        }
        if self.inner.mode == FaultMode::Sigsegv {
            return Err(DlmError::Config("a fixed-address area needs userfaultfd (not the SIGSEGV mode)".into()));
        }
        self.alloc_inner(n, Some(addr))?;
        Ok(n)
    }

    fn alloc_inner(&self, len: usize, at: Option<usize>) -> Result<*mut u8, DlmError> {
        if len == 0 {
            return Err(DlmError::Config("zero-length allocation".into()));
        }
        let cfg = &self.inner.cfg;
        let mut st = self.inner.lock();
        self.inner.drain_all(&mut st);
        let layout = Layout::new(len, cfg.base_page, cfg.max_set as usize, st.conns.len());
        let bytes = layout.pages * cfg.base_page;
        if layout.pages >= INFLIGHT as usize {
            return Err(DlmError::Config(format!("allocation of {len} bytes has too many pages")));
        }
        let (view, staging, alias): (Mapping, Option<MemfdView>, Option<MemfdView>) = if let Some(addr) = at {
            let opts = MapOptions { noreserve: true, ..Default::default() };
            // SAFETY: alloc_at's contract: the caller owns [addr, addr+len), and bytes == len
            // (len is whole largest units).
            let view = unsafe { Mapping::anonymous_at(addr, bytes, &opts) }?;
            madvise(view.addr(), bytes, Advice::NoHugePage)?;
            let uffd = self.inner.uffd.as_ref().expect("userfaultfd modes have a uffd");
            uffd.register(view.addr(), bytes, RegisterMode { missing: true, write_protect: true, minor: false })?;
            (view, None, None)
        } else if self.inner.mode == FaultMode::Sigsegv {
            let fd = memfd_create("pagewise-dlm", None)?;
            pagewise_kernel::mem::ftruncate(&fd, bytes as u64)?;
            let view =
                Mapping::of_fd(&fd, bytes, 0, &MapOptions { shared: true, no_access: true, ..Default::default() })?;
            let stage = Mapping::of_fd(&fd, bytes, 0, &MapOptions { shared: true, ..Default::default() })?;
            (view, Some((stage, fd)), None)
        } else if self.inner.memfd {
            let fd = memfd_create("pagewise-dlm", None)?;
            pagewise_kernel::mem::ftruncate(&fd, bytes as u64)?;
            let shared = MapOptions { shared: true, ..Default::default() };
            let view = Mapping::of_fd(&fd, bytes, 0, &shared)?;
            madvise(view.addr(), bytes, Advice::NoHugePage)?;
            let alias = Mapping::of_fd(&fd, bytes, 0, &shared)?;
            madvise(alias.addr(), bytes, Advice::NoHugePage)?;
            let uffd = self.inner.uffd.as_ref().expect("userfaultfd modes have a uffd");
            uffd.register(view.addr(), bytes, RegisterMode { missing: true, write_protect: true, minor: true })?;
            (view, None, Some((alias, fd)))
        } else {
            let view = Mapping::anonymous(bytes, &MapOptions { noreserve: true, ..Default::default() })?;
            madvise(view.addr(), bytes, Advice::NoHugePage)?;
            let uffd = self.inner.uffd.as_ref().expect("userfaultfd modes have a uffd");
            uffd.register(view.addr(), bytes, RegisterMode { missing: true, write_protect: true, minor: false })?;
            (view, None, None)
        };
        if cfg.dont_fork {
            madvise(view.addr(), bytes, Advice::DontFork)?;
            for (m, _) in staging.iter().chain(alias.iter()) {
                madvise(m.addr(), bytes, Advice::DontFork)?;
            }
        }
        let shadow = if self.inner.moving && staging.is_none() && alias.is_none() {
            let m = Mapping::anonymous(bytes, &MapOptions { noreserve: true, ..Default::default() })?;
            madvise(m.addr(), bytes, Advice::NoHugePage)?;
            // A fork's copy-on-write pages cannot be moved; the child has no use for them.
            madvise(m.addr(), bytes, Advice::DontFork)?;
            // UFFDIO_MOVE needs its destination registered; WP mode only, so that receiving
            // into a not yet populated part is an ordinary fault the kernel serves itself.
            let uffd = self.inner.uffd.as_ref().expect("moving implies a uffd");
            uffd.register(m.addr(), bytes, RegisterMode { missing: false, write_protect: true, minor: false })?;
            Some(m)
        } else {
            None
        };
        let mut regions = vec![0u32; st.conns.len()];
        for s in 0..st.conns.len() {
            let pages = layout.region_pages(s);
            if pages == 0 {
                continue;
            }
            let mut h = Header::request(Opcode::Alloc, 0);
            h.page = pages as u64;
            h.length = 4;
            let payload = (cfg.base_page as u32).to_le_bytes();
            let rep = st.call(s, h, &payload).inspect_err(|_| {
                // Give back what was reserved on the servers before this one.
                for (i, &r) in regions.iter().enumerate().take(s) {
                    if r != 0 {
                        let mut f = Header::request(Opcode::Free, 0);
                        f.region = r;
                        let _ = st.call(i, f, &[]);
                    }
                }
            })?;
            regions[s] = rep.region;
        }
        let addr = view.addr();
        let area = Area {
            addr,
            len: bytes,
            layout,
            regions,
            slot: vec![NONE; layout.pages],
            home_written: vec![false; layout.pages],
            touched: vec![0u64; layout.pages.div_ceil(64)],
            last_end: usize::MAX,
            window: 0,
            _view: view,
            staging,
            alias,
            shadow,
        };
        // A freed slot is reused: free_locked drained every reply and CLOCK entry naming it.
        match st.areas.iter().position(|a| a.is_none()) {
            Some(i) => st.areas[i] = Some(area),
            None => st.areas.push(Some(area)),
        }
        st.stats.areas += 1;
        Ok(addr as *mut u8)
    }

    /// Free an area returned by [`Dlm::alloc`]: its local pages are dropped and its homes freed.
    pub fn free(&self, ptr: *mut u8) -> Result<(), DlmError> {
        let mut st = self.inner.lock();
        self.inner.free_locked(&mut st, ptr as usize)
    }

    /// Change the set count (page size = base page × count) from now on.
    pub fn set_count(&self, count: u32) -> Result<(), DlmError> {
        if !count.is_power_of_two() || count > self.inner.cfg.max_set {
            return Err(DlmError::Config(format!(
                "set count {count} must be a power of two ≤ {}",
                self.inner.cfg.max_set
            )));
        }
        let mut st = self.inner.lock();
        st.apply_set_count(count);
        Ok(())
    }

    /// Begin measuring loop `id` (`dlm_start`): its own unit size comes into force and the
    /// pages it faults on are recorded until [`Dlm::loop_end`]. Loops do not nest.
    pub fn loop_start(&self, id: u64) -> Result<(), DlmError> {
        if id == crate::measure::WINDOW_ID {
            return Err(DlmError::Config(format!("loop id {id} is reserved for tuning windows")));
        }
        let mut st = self.inner.lock();
        if let Some((other, _)) = st.measure.active {
            return Err(DlmError::Config(format!("loop {other} is still being measured (no dlm_end yet)")));
        }
        let cur = st.set_count;
        let set = st.measure.loops.entry(id).or_insert_with(|| crate::tune::LoopState::new(cur)).set;
        st.apply_set_count(set);
        st.clear_touched();
        st.measure.loop_faults = 0;
        st.measure.active = Some((id, std::time::Instant::now()));
        Ok(())
    }

    /// End measuring loop `id` (`dlm_end`): the tuner decides the loop's next unit size, which
    /// is in force from now on. Returns the decision.
    pub fn loop_end(&self, id: u64) -> Result<crate::tune::Decision, DlmError> {
        let mut st = self.inner.lock();
        let (active, started) =
            st.measure.active.ok_or_else(|| DlmError::Config(format!("dlm_end({id}) without dlm_start")))?;
        if active != id {
            return Err(DlmError::Config(format!("dlm_end({id}) while loop {active} is being measured")));
        }
        let time = started.elapsed().as_secs_f64();
        let touched = st.touched();
        let tuner = st.measure.tuner;
        let state = st.measure.loops.get_mut(&id).expect("created at start");
        let d = crate::tune::decide(&tuner, state, &touched, time, id);
        let set = state.set;
        st.measure.log(d);
        st.measure.active = None;
        st.measure.reset_window(std::time::Instant::now());
        st.apply_set_count(set);
        st.clear_touched();
        Ok(d)
    }

    /// Write the tuner's decisions to `Config::decisions_path` (if set) now; the runtime keeps
    /// running. For a process about to exit (`dlm_finish`).
    pub fn write_decisions(&self) {
        let st = self.inner.lock();
        write_decisions(&self.inner.cfg, &st.measure);
    }

    /// Every tuning decision so far, oldest first.
    pub fn decisions(&self) -> Vec<crate::tune::Decision> {
        self.inner.lock().measure.decisions.clone()
    }

    /// The decisions as JSON: `{"decisions": [...], "dropped": N, "table": "..."}`.
    pub fn decisions_json(&self) -> String {
        let st = self.inner.lock();
        decisions_json(&st.measure)
    }

    pub fn stats(&self) -> Stats {
        let st = self.inner.lock();
        let mut s = st.stats.clone();
        s.resident_bytes = st.resident;
        s.set_count = st.set_count;
        s
    }

    /// Write every dirty unit back to its home and drop every local copy (the next touch of
    /// any page fetches it again). Returns the bytes that were resident.
    pub fn evict_all(&self) -> usize {
        let mut st = self.inner.lock();
        self.inner.drain_all(&mut st);
        let before = st.resident;
        let mut run = Run::new(self.inner.uffd.as_ref());
        while let Some(v) = st.clock.victim(|_| {}) {
            self.inner.evict(&mut st, v, &mut run);
        }
        run.flush();
        self.inner.drain_all(&mut st);
        for a in st.areas.iter_mut().flatten() {
            a.window = 0;
            a.last_end = usize::MAX;
        }
        before
    }

    /// Check the runtime's bookkeeping against itself: the resident byte count equals the pages
    /// resident or in flight, every resident page belongs to a live CLOCK entry covering it,
    /// and the limit holds. For tests; returns what is wrong.
    pub fn audit(&self) -> Result<(), String> {
        let st = self.inner.lock();
        let b = self.inner.cfg.base_page;
        let mut pages = 0usize;
        let mut entries = std::collections::HashSet::new();
        for (ai, a) in st.areas.iter().enumerate() {
            let Some(a) = a else { continue };
            for (p, &s) in a.slot.iter().enumerate() {
                if s == NONE {
                    continue;
                }
                pages += 1;
                if s == INFLIGHT {
                    continue;
                }
                let e = st.clock.get(s as usize).ok_or(format!("page {p} of area {ai} names dead slot {s}"))?;
                if e.area as usize != ai || p < e.first as usize || p >= (e.first + e.count) as usize {
                    return Err(format!("page {p} of area {ai}: slot {s} covers {:?}", e));
                }
                entries.insert(s);
            }
        }
        if pages * b != st.resident {
            return Err(format!("resident {} bytes, pages say {}", st.resident, pages * b));
        }
        if entries.len() != st.clock.len() {
            return Err(format!("{} live CLOCK entries, pages reference {}", st.clock.len(), entries.len()));
        }
        if st.resident > self.inner.cfg.local_mem {
            return Err(format!("resident {} over the limit {}", st.resident, self.inner.cfg.local_mem));
        }
        Ok(())
    }

    /// Ask one memory server for its statistics (a STATS request).
    pub fn server_stats(&self, server: usize) -> Result<crate::server::ServerStats, DlmError> {
        let mut st = self.inner.lock();
        if server >= st.conns.len() {
            return Err(DlmError::Config(format!("no server {server}")));
        }
        self.inner.drain_all(&mut st);
        let h = Header::request(Opcode::Stats, 0);
        let rep = st.call_raw(server, h, &[])?;
        let mut body = vec![0u8; rep.length as usize];
        st.conns[server].t.recv_payload(&mut body).map_err(|e| st.lost(server, e))?;
        serde_json::from_slice(&body).map_err(|e| DlmError::Config(format!("bad STATS reply: {e}")))
    }

    /// Free every area, stop fault handling and disconnect.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        {
            let mut st = self.inner.lock();
            write_decisions(&self.inner.cfg, &st.measure);
            let addrs: Vec<usize> = st.areas.iter().flatten().map(|a| a.addr).collect();
            for a in addrs {
                let _ = self.inner.free_locked(&mut st, a);
            }
        }
        self.inner.stop.store(true, Ordering::Release);
        if let Some(h) = self.handler.take() {
            let _ = h.join();
        }
        if let Some(s) = self.signal.take() {
            crate::signals::restore(s);
            ACTIVE.store(std::ptr::null_mut(), Ordering::Release);
        }
        INITIALISED.store(false, Ordering::Release);
    }
}

impl Drop for Dlm {
    fn drop(&mut self) {
        if !self.inner.stop.load(Ordering::Acquire) {
            self.stop();
        }
    }
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.sole_thread = None;
        st
    }

    fn free_locked(&self, st: &mut State, addr: usize) -> Result<(), DlmError> {
        let idx = st
            .areas
            .iter()
            .position(|a| a.as_ref().is_some_and(|a| a.addr == addr))
            .ok_or_else(|| DlmError::Config(format!("{addr:#x} is not a DLM area")))?;
        self.drain_all(st);
        // Drop the area's clock entries.
        let pages = st.areas[idx].as_ref().map(|a| a.layout.pages).unwrap_or(0);
        for p in 0..pages {
            let s = st.areas[idx].as_ref().map(|a| a.slot[p]).unwrap_or(NONE);
            if s != NONE && s != INFLIGHT {
                if let Some(e) = st.clock.remove(s as usize) {
                    st.resident -= e.count as usize * self.cfg.base_page;
                    for q in e.first..e.first + e.count {
                        st.areas[idx].as_mut().expect("present").slot[q as usize] = NONE;
                    }
                }
            }
        }
        let area = st.areas[idx].take().expect("present");
        if let Some(sh) = &area.shadow {
            // Unmapped with the area below.
            st.frames.remove_within(sh.addr(), area.len, |_, _| {});
        }
        if let Some(u) = &self.uffd {
            let _ = u.unregister(area.addr, area.len);
        }
        for (s, &r) in area.regions.iter().enumerate() {
            if r != 0 {
                let mut h = Header::request(Opcode::Free, 0);
                h.region = r;
                st.call(s, h, &[])?;
            }
        }
        st.stats.areas -= 1;
        drop(area);
        Ok(())
    }

    fn drain_all(&self, st: &mut State) {
        for s in 0..st.conns.len() {
            while self.complete_one(st, s) {}
        }
    }

    /// Make room for `bytes` more under the local limit. Units the hand gives a second chance
    /// are armed (`arm`) on the way.
    fn make_room(&self, st: &mut State, bytes: usize) {
        debug_assert!(!st.move_ins.gathering, "gathered move-ins are done before evicting");
        let mut run = Run::new(self.uffd.as_ref());
        while st.resident + bytes > self.cfg.local_mem {
            let State { clock, areas, stats, frames, borrowed, .. } = &mut *st;
            let b = self.cfg.base_page;
            let sample = self.cfg.sample_references;
            let victim = clock.victim(|e| {
                let a = areas[e.area as usize].as_ref().expect("live area");
                if sample && !e.armed && self.arm(a, e, b, &mut run, frames, borrowed) {
                    e.armed = true;
                    stats.second_chances += 1;
                }
            });
            match victim {
                Some(v) => self.evict(st, v, &mut run),
                None => {
                    run.flush();
                    // Only in-flight units hold the memory: install them, then they can go.
                    if !st.conns.iter().any(|c| !c.pending.is_empty()) {
                        crate::fatal(format_args!(
                            "pagewise dlm: internal error: {} bytes resident, none evictable",
                            st.resident
                        ));
                    }
                    self.drain_all(st);
                }
            }
        }
        run.flush();
    }

    /// Evict the unit in CLOCK slot `slot`. Its pages are dropped, or moved to the shadow to
    /// be kept, with the next [`Run::flush`] of `run` (consecutive victims of a stream: one
    /// system call for many units); the caller flushes `run` before anything can install
    /// pages into its ranges or take the kept frames.
    fn evict(&self, st: &mut State, slot: usize, run: &mut Run) {
        let e = st.clock.remove(slot).expect("victim is live");
        let b = self.cfg.base_page;
        let ai = e.area as usize;
        let (first, count) = (e.first as usize, e.count as usize);
        let (start, len, layout) = {
            let a = st.areas[ai].as_ref().expect("live area");
            (a.addr + first * b, count * b, a.layout)
        };
        st.stats.evictions += 1;
        // Read through the runtime's own view where there is one: the program's view of an
        // armed unit is unmapped (it would fault).
        let own = {
            let a = st.areas[ai].as_ref().expect("live");
            match (&a.shadow, e.armed) {
                (Some(sh), true) => sh.addr() + first * b,
                _ => a.alias.as_ref().or(a.staging.as_ref()).map_or(start, |(m, _)| m.addr() + first * b),
            }
        };
        // Writers are held back (module doc) before the data is read: always for a write-back,
        // and before a hashed unit is hashed again unless nobody can write it meanwhile — its
        // view unmapped (armed), or the program's one thread the one evicting.
        let protect = |start: usize, len: usize| {
            let r = match &self.uffd {
                // DONTWAKE is refused when protecting (fs/userfaultfd.c: mode_wp && mode_dontwake).
                Some(u) => u.write_protect(start, len, true, true),
                None => mprotect(start, len, Protection::Read),
            };
            if let Err(err) = r {
                crate::fatal(format_args!("pagewise dlm: write-protecting {start:#x}+{len:#x} failed: {err}"));
            }
        };
        if e.dirty || e.clean_hash.is_some() {
            // The unit's data is read below, an armed unit's from its place in the shadow: be
            // sure it is there.
            run.flush();
        }
        let mut protected = false;
        let written = match e.clean_hash {
            None => e.dirty,
            Some(h) => {
                if !e.armed && !self.sole_program_thread(st) {
                    protect(start, len);
                    protected = true;
                }
                // SAFETY: [own, own+len) maps the unit's resident pages (the program's view, or
                // the shadow where an armed unit's pages wait); nobody writes them meanwhile.
                let written = unsafe { content_hash(self.hash_seed, own, len) } != h;
                if written {
                    st.stats.written_by_hash += 1;
                } else {
                    st.stats.clean_by_hash += 1;
                }
                written
            }
        };
        if written {
            if !protected {
                protect(start, len);
            }
            let (srv, spage) = layout.home(first);
            // Replies owed on this connection are taken first: a blocking send must never wait
            // on a server that is itself blocked sending us replies.
            while !st.conns[srv].pending.is_empty() {
                self.complete_one(st, srv);
            }
            let region = st.areas[ai].as_ref().expect("live").regions[srv];
            let mut h = Header::request(Opcode::Write, 0);
            h.region = region;
            h.page = spage as u64;
            h.set_count = count as u32;
            h.length = len as u32;
            // SAFETY: [own, own+len) maps the unit's resident pages, now write-protected in
            // the program's view; reading does not fault and nobody can change them until
            // they are dropped below.
            let data = unsafe { std::slice::from_raw_parts(own as *const u8, len) };
            let sent = st.send(srv, h, data, start, len);
            st.conns[srv].pending.push_back(Pending::Write { area: e.area, first, count, sent });
            st.stats.writebacks += 1;
            st.stats.writeback_bytes += len as u64;
            let a = st.areas[ai].as_mut().expect("live");
            a.home_written[first..first + count].iter_mut().for_each(|w| *w = true);
        }
        let keeps_frames = self.keeps_frames(st, len);
        let a = st.areas[ai].as_mut().expect("live");
        let shadow = a.shadow.as_ref().map(|m| m.addr() + first * b);
        // Another unit's reply is being received into frames at this unit's place: its pages
        // cannot go there, they are freed instead.
        let place_taken = shadow.is_some_and(|sh| overlaps(&st.borrowed, sh, len));
        let mut kept = None;
        let r = match (&a.staging, &a.alias, shadow) {
            (Some((stage, _)), ..) => mprotect(start, len, Protection::None)
                .and_then(|_| madvise(stage.addr() + first * b, len, Advice::Remove)),
            // Punching the pages out of the memfd unmaps them from both views and frees them.
            (None, Some((alias, _)), _) => madvise(alias.addr() + first * b, len, Advice::Remove),
            // An armed unit's pages wait in the shadow already.
            (None, None, Some(sh)) if e.armed => {
                kept = Some(sh);
                Ok(())
            }
            // Frames a unit will be received into go to the shadow, to be reused.
            (None, None, Some(sh)) if keeps_frames && !place_taken => {
                st.frames.remove_within(sh, len, free_frames);
                kept = Some(sh);
                run.move_to_shadow_later(start, sh, len);
                Ok(())
            }
            (None, None, _) => {
                run.drop_later(start, len);
                Ok(())
            }
        };
        if let Err(err) = r {
            crate::fatal(format_args!("pagewise dlm: dropping {start:#x}+{len:#x} failed: {err}"));
        }
        let a = st.areas[ai].as_mut().expect("live");
        a.slot[first..first + count].iter_mut().for_each(|s| *s = NONE);
        st.resident -= len;
        if let Some(sh) = kept {
            if !self.keep_frames(st, sh, len) {
                run.flush();
                free_frames(sh, len);
            }
        }
    }

    /// Smallest unit whose demand fault's reply is received into the program's view: any
    /// when it is then hashed instead of write-protected (`HASH_MAX`), else `VIEW_MIN`.
    fn view_min(&self) -> usize {
        if self.cfg.hash_clean {
            self.cfg.base_page
        } else {
            VIEW_MIN
        }
    }

    /// Whether an evicted unit of `len` bytes leaves its frames in the shadow for a later reply
    /// to be received into (`reply_target`): in a program with one thread (replies are received
    /// into frames only there), under SIGBUS from `view_min` on (demand faults are received into
    /// the program's view), else from `MOVE_MIN` on. Otherwise the pages are dropped, many
    /// victims with one call: moving each to the shadow and freeing it there when it is not
    /// needed made the solver with 4 KiB units at 10% and 5% local memory 5-6× slower
    /// (`pagewise eval dlm-autotune`, whose solver shares its process with other threads).
    fn keeps_frames(&self, st: &mut State, len: usize) -> bool {
        self.cfg.move_install
            && (len >= MOVE_MIN || self.mode == FaultMode::Sigbus && len >= self.view_min())
            && self.sole_program_thread(st)
    }

    /// Keep the shadow frames `[addr, addr + len)` for the next fetch; false when the resident
    /// set plus the kept frames would exceed the local limit, or no run can be added: the
    /// caller frees them.
    #[must_use]
    fn keep_frames(&self, st: &mut State, addr: usize, len: usize) -> bool {
        st.resident + st.frames.bytes() + len <= self.cfg.local_mem && st.frames.push(addr, len)
    }

    /// Where the reply for a wholly missing unit whose place in its area's shadow is `place`
    /// is received, decided before its request leaves (cheap: no page is touched):
    /// - the unit's own frames, still at its place: received there;
    /// - else one kept run of frames as large as the unit, *borrowed* where it lies (received
    ///   there and moved straight into the program's view: one move less than gathering it to
    ///   the place first — a stream's evicted units leave exactly such runs);
    /// - else the place, filled by [`Inner::fill_place`] while the request travels;
    /// - None when the place holds frames borrowed by another reply in flight and no run can be
    ///   borrowed: the reply is copied in (UFFDIO_COPY) instead.
    fn receive_target(&self, st: &mut State, place: usize, len: usize) -> Option<ReceiveAt> {
        let place_free = !overlaps(&st.borrowed, place, len);
        if place_free && st.frames.take_in_place(place, len) {
            return Some(ReceiveAt::Ready(place));
        }
        if st.borrowed.len() < st.borrowed.capacity() {
            // From the run's start: a read-ahead batch's units get adjacent frames in their
            // order, and arrived replies are moved in together (`install_arrived`).
            if let Some(addr) = st.frames.take_head(len) {
                st.borrowed.push((addr, len));
                st.stats.borrowed_receives += 1;
                return Some(ReceiveAt::Ready(addr));
            }
        }
        place_free.then_some(ReceiveAt::Fill(place))
    }

    /// Fill `[dst, dst + len)`, a unit's place in its area's shadow, with kept frames (moved
    /// there) and fresh pages for the rest, so that the reply is received into pages that
    /// exist. Runs while the request travels.
    fn fill_place(&self, st: &mut State, dst: usize, len: usize) {
        st.frames.remove_within(dst, len, free_frames);
        let uffd = self.uffd.as_ref().expect("shadow areas have a uffd");
        let mut off = 0;
        while off < len {
            let Some((src, n)) = st.frames.pop(len - off) else { break };
            if let Err(err) = uffd.move_pages(dst + off, src, n, false, true) {
                crate::fatal(format_args!("pagewise dlm: reusing frames {src:#x}+{n:#x} failed: {err}"));
            }
            off += n;
        }
        if off < len {
            if let Err(err) = madvise(dst + off, len - off, Advice::PopulateWrite) {
                crate::fatal(format_args!("pagewise dlm: allocating {:#x}+{:#x} failed: {err}", dst + off, len - off));
            }
        }
    }

    /// Whether the program cannot touch memory while the runtime holds its lock: the program
    /// has one thread, and it is the one in the runtime (or waiting on the fault the handler
    /// thread serves). Only then may a clean unit be moved in — moved pages arrive writable
    /// and are write-protected just after (`frames.rs`). Found once per holding of the lock:
    /// a program with one thread cannot start another while that thread is in here.
    pub(super) fn sole_program_thread(&self, st: &mut State) -> bool {
        let own = if self.mode == FaultMode::HandlerThread { 2 } else { 1 };
        *st.sole_thread
            .get_or_insert_with(|| self.threads.as_ref().and_then(|t| t.get().ok()).is_some_and(|n| n <= own))
    }

    /// Map the shadow's `[src, src + len)` at `[dst, dst + len)` in the program's view,
    /// write-protected unless `dirty`: moved when nothing can write to it meanwhile (gathered
    /// with its neighbours while a fault takes its replies, `MoveIns`), else copied
    /// (UFFDIO_COPY mode WP) and the shadow frames kept.
    pub(super) fn move_in(&self, st: &mut State, dst: usize, src: usize, len: usize, dirty: bool) {
        if !(dirty || self.sole_program_thread(st)) {
            let uffd = self.uffd.as_ref().expect("shadow areas have a uffd");
            // SAFETY: the shadow range is populated (received into, or an armed unit's pages)
            // and readable.
            if let Err(err) = unsafe { uffd.copy(dst, src as *const u8, len, true, true) } {
                crate::fatal(format_args!("pagewise dlm: installing {dst:#x}+{len:#x} failed: {err}"));
            }
            if !self.keep_frames(st, src, len) {
                free_frames(src, len);
            }
            return;
        }
        st.stats.moved_units += 1;
        if dirty || !st.move_ins.gathering {
            return self.move_in_now(dst, src, len, dirty);
        }
        if st.move_ins.joins(dst, src) {
            st.stats.joined_move_ins += 1;
        } else if let Some((d, s, l)) = st.move_ins.take() {
            self.move_in_now(d, s, l, false);
        }
        st.move_ins.add(dst, src, len);
    }

    /// Move pages in from the shadow, write-protect them unless `dirty`, and wake whoever
    /// waits on them.
    fn move_in_now(&self, dst: usize, src: usize, len: usize, dirty: bool) {
        let uffd = self.uffd.as_ref().expect("shadow areas have a uffd");
        let r = uffd
            .move_pages(dst, src, len, false, false)
            // Protecting never wakes (fs/userfaultfd.c wakes only on un-protecting).
            .and_then(|()| if dirty { Ok(()) } else { uffd.write_protect(dst, len, true, true) })
            .and_then(|()| uffd.wake(dst, len));
        if let Err(err) = r {
            crate::fatal(format_args!("pagewise dlm: installing {dst:#x}+{len:#x} failed: {err}"));
        }
    }

    /// Install the units gathered since [`MoveIns::gather`], and stop gathering.
    pub(super) fn move_in_gathered(&self, st: &mut State) {
        if let Some((d, s, l)) = st.move_ins.finish() {
            self.move_in_now(d, s, l, false);
        }
    }

    /// Request the non-resident pages of unit [first, first+count) of area `ai`, for a demand
    /// fault or read-ahead (zeros are installed at once; others get a READ). `open`: the
    /// demand fault is a known write to this page, so the part of the unit holding it is
    /// installed writable and dirty: no write-protect now and no opening after.
    fn request(&self, st: &mut State, ai: usize, first: usize, count: usize, readahead: bool, open: Option<usize>) {
        let b = self.cfg.base_page;
        let count_missing = |st: &State| {
            st.areas[ai].as_ref().expect("live").slot[first..first + count].iter().filter(|&&s| s == NONE).count()
        };
        let mut missing = count_missing(st);
        if missing == 0 {
            return;
        }
        // Making room may evict resident pages of this very unit (units of an older set count
        // inside it), which then are missing too: repeat until the count is stable.
        loop {
            self.make_room(st, missing * b);
            let now = count_missing(st);
            if now == missing {
                break;
            }
            missing = now;
        }
        let a = st.areas[ai].as_mut().expect("live");
        let needs_home = (first..first + count).any(|p| a.slot[p] == NONE && a.home_written[p]);
        for p in first..first + count {
            if a.slot[p] == NONE {
                a.slot[p] = INFLIGHT;
            }
        }
        st.resident += missing * b;
        st.stats.peak_resident_bytes = st.stats.peak_resident_bytes.max(st.resident);
        if !needs_home {
            st.stats.zero_units += 1;
            self.install(st, ai, first, count, Fill::Zeros, open);
            return;
        }
        let (srv, spage) = a.layout.home(first);
        let mut h = Header::request(Opcode::Read, 0);
        h.region = a.regions[srv];
        h.page = spage as u64;
        h.set_count = count as u32;
        let (start, len) = (a.addr + first * b, count * b);
        let sent = st.queue_read(srv, h, start, len);
        if !readahead {
            // A demand fault waits for this reply: it leaves now.
            st.flush(srv, start, len);
        }
        // While the request travels: where its reply is received, and the pages it is
        // received into made to exist. Nothing in between takes a reply, so the entry still
        // joins the queue in the order the request left.
        let into = self.reply_target(st, ai, first, count, missing, readahead);
        st.conns[srv].pending.push_back(Pending::Read { area: ai as u32, first, count, into, sent, open });
        if readahead {
            st.stats.readahead_units += 1;
        }
    }

    /// Where the reply for unit `[first, first + count)` of area `ai` (`missing` of its pages
    /// not resident), requested just now, is received, with the pages it is received into made
    /// to exist. In place needs the whole unit missing: the reply then lands as is
    /// - in the program's view (`ReplyInto::View`): a demand fault on the faulting thread
    ///   (SIGBUS) of a program with no other thread, which cannot run before the reply is
    ///   installed; units of `VIEW_MIN` and more. Only the write-protect is left for after
    ///   the reply. Not for read-ahead: the program runs on before that reply arrives;
    /// - in the memfd's page cache through the alias (zero-copy), mapped with UFFDIO_CONTINUE;
    /// - in the shadow (units of `MOVE_MIN` and more, program with one thread), moved in.
    ///
    /// Else in the runtime's buffer, copied in (UFFDIO_COPY).
    fn reply_target(
        &self,
        st: &mut State,
        ai: usize,
        first: usize,
        count: usize,
        missing: usize,
        readahead: bool,
    ) -> ReplyInto {
        if missing != count {
            return ReplyInto::Buffer;
        }
        let b = self.cfg.base_page;
        let a = st.areas[ai].as_ref().expect("live");
        let (start, len) = (a.addr + first * b, count * b);
        if let Some((alias, _)) = a.alias.as_ref().filter(|_| self.zero_copy) {
            let at = alias.addr() + first * b;
            if let Err(e) = madvise(at, len, Advice::PopulateWrite) {
                crate::fatal(format_args!("pagewise dlm: allocating {start:#x}+{len:#x} failed: {e}"));
            }
            return ReplyInto::Runtime(at);
        }
        let Some(place) = a.shadow.as_ref().filter(|_| self.cfg.move_install).map(|m| m.addr() + first * b) else {
            return ReplyInto::Buffer;
        };
        let to_view = !readahead && self.mode == FaultMode::Sigbus && len >= self.view_min();
        if !(to_view || len >= MOVE_MIN) || !self.sole_program_thread(st) {
            return ReplyInto::Buffer;
        }
        if to_view {
            self.fill_view(st, place, start, len);
            return ReplyInto::View;
        }
        match self.receive_target(st, place, len) {
            Some(ReceiveAt::Ready(at)) => ReplyInto::Runtime(at),
            Some(ReceiveAt::Fill(at)) => {
                self.fill_place(st, at, len);
                ReplyInto::Runtime(at)
            }
            None => ReplyInto::Buffer,
        }
    }

    /// Put pages at `[view, view + len)`, a wholly missing unit of the program's view whose
    /// reply is to be received there (`ReplyInto::View`): its own kept frames from its `place`
    /// in the shadow, else kept runs from anywhere, else fresh pages. All moved or copied in
    /// writable and without waking anyone; `install` write-protects them once the data is in
    /// (unless the fault is a known write).
    fn fill_view(&self, st: &mut State, place: usize, view: usize, len: usize) {
        st.stats.view_receives += 1;
        let uffd = self.uffd.as_ref().expect("shadow areas have a uffd");
        let move_in = |dst: usize, src: usize, n: usize| {
            if let Err(err) = uffd.move_pages(dst, src, n, false, false) {
                crate::fatal(format_args!("pagewise dlm: moving frames {src:#x}+{n:#x} to {dst:#x} failed: {err}"));
            }
        };
        if !overlaps(&st.borrowed, place, len) && st.frames.take_in_place(place, len) {
            move_in(view, place, len);
            return;
        }
        let mut off = 0;
        while off < len {
            let Some((src, n)) = st.frames.pop(len - off) else { break };
            move_in(view + off, src, n);
            off += n;
        }
        if off < len {
            // SAFETY: `zeros` is a block long, at least as long as any unit.
            if let Err(err) = unsafe { uffd.copy(view + off, st.zeros.as_ptr(), len - off, false, false) } {
                crate::fatal(format_args!("pagewise dlm: allocating {:#x}+{:#x} failed: {err}", view + off, len - off));
            }
        }
    }

    /// Install the in-flight pages of a unit, write-protected — except the run holding page
    /// `open`, the page of a known write (`request`), which is installed writable and dirty.
    fn install(&self, st: &mut State, ai: usize, first: usize, count: usize, data: Fill<'_>, open: Option<usize>) {
        let b = self.cfg.base_page;
        let mut p = first;
        while p < first + count {
            if st.areas[ai].as_ref().expect("live").slot[p] != INFLIGHT {
                p += 1;
                continue;
            }
            let run_start = p;
            while p < first + count && st.areas[ai].as_ref().expect("live").slot[p] == INFLIGHT {
                p += 1;
            }
            let n = p - run_start;
            let off = (run_start - first) * b;
            let dirty = open.is_some_and(|o| (run_start..p).contains(&o));
            // Received into the view by the program's one thread: hashed, not protected.
            let hashed = !dirty && self.cfg.hash_clean && matches!(data, Fill::InView) && n * b <= HASH_MAX;
            let src = match data {
                Fill::Data(d) => d[off..off + n * b].as_ptr(),
                Fill::Zeros | Fill::InPlace(_) | Fill::InView => st.zeros.as_ptr(),
            };
            let a = st.areas[ai].as_ref().expect("live");
            let dst = a.addr + run_start * b;
            let r = match (&self.uffd, &a.staging) {
                // Received into the program's view itself (`ReplyInto::View`), where it is
                // writable: write-protect unless dirty. Protecting never wakes
                // (fs/userfaultfd.c), nor has it anyone to wake: the program's one thread is
                // the one serving this fault.
                (Some(_), _) if (dirty || hashed) && matches!(data, Fill::InView) => Ok(()),
                (Some(u), _) if matches!(data, Fill::InView) => u.write_protect(dst, n * b, true, true),
                // The data is in the shadow (the unit's place or borrowed frames): move it in.
                (Some(_), _) if a.shadow.is_some() && matches!(data, Fill::InPlace(_)) => {
                    let Fill::InPlace(at) = data else { unreachable!("matched above") };
                    self.move_in(st, dst, at + off, n * b, dirty);
                    Ok(())
                }
                // The data is already in the memfd's page cache: map it.
                (Some(u), _) if matches!(data, Fill::InPlace(_)) => u.continue_wp(dst, n * b, !dirty, true),
                (Some(u), _) => {
                    // SAFETY: src points at n*b readable bytes (the reply buffer or zeros,
                    // both at least one block long).
                    unsafe { u.copy(dst, src, n * b, !dirty, true) }.map(|_| ())
                }
                (None, Some((stage, _))) => {
                    // SAFETY: the staging view covers the area; these pages are not yet
                    // readable through the program's view, so nobody observes the copy.
                    unsafe { std::ptr::copy_nonoverlapping(src, (stage.addr() + run_start * b) as *mut u8, n * b) };
                    mprotect(dst, n * b, if dirty { Protection::ReadWrite } else { Protection::Read })
                }
                (None, None) => unreachable!("an area has a uffd or a staging view"),
            };
            if let Err(e) = r {
                crate::fatal(format_args!("pagewise dlm: installing {dst:#x}+{:#x} failed: {e}", n * b));
            }
            let clean_hash = hashed.then(|| {
                st.stats.hashed_installs += 1;
                // SAFETY: the reply was received into [dst, dst + n*b), present and readable.
                unsafe { content_hash(self.hash_seed, dst, n * b) }
            });
            let entry =
                Entry { area: ai as u32, first: run_start as u32, count: n as u32, dirty, clean_hash, armed: false };
            let Some(slot) = st.clock.insert(entry) else {
                crate::fatal(format_args!("pagewise dlm: internal error: clock full"));
            };
            let a = st.areas[ai].as_mut().expect("live");
            a.slot[run_start..p].iter_mut().for_each(|s| *s = slot as u32);
        }
    }
}

impl Inner {
    /// Arm unit `e` of area `a` (module doc, "Reference bits"): unmap it from the program's
    /// view, keeping its data, so that its next access faults. Shadow areas: its pages are
    /// moved to its place in the shadow (with `run`). Memfd areas: its program-view range joins `run`
    /// (MADV_DONTNEED of a shared mapping drops the page-table entries only). SIGSEGV areas:
    /// PROT_NONE. Other anonymous areas cannot be armed (their only copy of the data is what
    /// would be dropped), nor can a shadow area's unit whose place holds frames borrowed by a
    /// reply in flight: false.
    fn arm(
        &self,
        a: &Area,
        e: &Entry,
        b: usize,
        run: &mut Run,
        frames: &mut Frames,
        borrowed: &[(usize, usize)],
    ) -> bool {
        let (start, len) = (a.addr + e.first as usize * b, e.count as usize * b);
        if let Some(sh) = a.shadow.as_ref().map(|m| m.addr() + e.first as usize * b) {
            if overlaps(borrowed, sh, len) {
                return false;
            }
            frames.remove_within(sh, len, free_frames);
            run.move_to_shadow_later(start, sh, len);
            return true;
        }
        arm_mapped(a, start, len, run)
    }
}

/// Where a reply received in place lands (`Inner::receive_target`).
#[derive(Clone, Copy)]
enum ReceiveAt {
    /// Pages are there already.
    Ready(usize),
    /// The pages are to be made to exist there while the request travels.
    Fill(usize),
}

/// Whether `[addr, addr + len)` overlaps any of `ranges`.
fn overlaps(ranges: &[(usize, usize)], addr: usize, len: usize) -> bool {
    ranges.iter().any(|&(a, l)| a < addr + len && addr < a + l)
}

/// Free kept frames (MADV_DONTNEED on the shadow).
fn free_frames(addr: usize, len: usize) {
    if let Err(err) = madvise(addr, len, Advice::DontNeed) {
        crate::fatal(format_args!("pagewise dlm: freeing frames {addr:#x}+{len:#x} failed: {err}"));
    }
}

/// `Inner::arm` for areas without a shadow.
fn arm_mapped(a: &Area, start: usize, len: usize, run: &mut Run) -> bool {
    if a.alias.is_some() {
        run.drop_later(start, len);
        true
    } else if a.staging.is_some() {
        if let Err(err) = mprotect(start, len, Protection::None) {
            crate::fatal(format_args!("pagewise dlm: arming {start:#x}+{len:#x} failed: {err}"));
        }
        true
    } else {
        false
    }
}

/// Page-table changes of evicted and armed units not yet made, gathered while adjacent so that
/// a stream's units (evicted and armed in address order) cost one system call together —
/// and one TLB flush. That is what makes it pay: a move or write-protect of up to 33 pages
/// invalidates the TLB entry of each page, at about 0.3 µs a page on this VM; beyond that
/// the kernel flushes the whole TLB at once (x86 `tlb_single_page_flush_ceiling`).
/// The hash a clean unit is remembered by (`Entry::clean_hash`): xxh3 keyed with the
/// runtime's random seed. A written unit keeps its hash with probability 2^-64.
///
/// # Safety
/// `[addr, addr + len)` must be mapped readable with its pages present: no load may fault
/// (this runs in the SIGBUS handler with the runtime's lock held).
unsafe fn content_hash(seed: u64, addr: usize, len: usize) -> u64 {
    // SAFETY: the caller's range.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
    twox_hash::XxHash3_64::oneshot_with_seed(seed, bytes)
}

/// Measured (UFFDIO_MOVE, 4 KiB pages): 32 pages 11.4 µs, 34 pages 4.9 µs, 256 pages 22 µs.
///
/// Whoever makes one [`Run::flush`]es it before anything reads or reuses the pages it moves
/// or drops (`make_room`, `evict`).
struct Run<'u> {
    uffd: Option<&'u Uffd>,
    /// Program-view range to MADV_DONTNEED: evicted anonymous units (freed) and armed memfd
    /// units (unmapped, data kept).
    drop: (usize, usize),
    /// Program-view range `(view, shadow, len)` whose pages move to the same offsets of its
    /// area's shadow: evicted units whose frames are kept, and armed units.
    to_shadow: (usize, usize, usize),
}

impl<'u> Run<'u> {
    fn new(uffd: Option<&'u Uffd>) -> Self {
        Run { uffd, drop: (0, 0), to_shadow: (0, 0, 0) }
    }

    /// MADV_DONTNEED `[start, start + len)` of a program's view (its next touch faults).
    fn drop_later(&mut self, start: usize, len: usize) {
        let (s, l) = self.drop;
        if l > 0 && (s + l == start || start + len == s) {
            self.drop = (s.min(start), l + len);
        } else {
            self.drop_now();
            self.drop = (start, len);
        }
    }

    /// Move the pages of `[view, view + len)` of a program's view to `shadow`, the same
    /// offset of its area's shadow (its next touch faults; the pages wait there).
    fn move_to_shadow_later(&mut self, view: usize, shadow: usize, len: usize) {
        let (v, sh, l) = self.to_shadow;
        // The hand may meet a stream's units in either address order.
        if l > 0 && v.wrapping_sub(sh) == view.wrapping_sub(shadow) && (v + l == view || view + len == v) {
            self.to_shadow = (v.min(view), sh.min(shadow), l + len);
        } else {
            self.move_now();
            self.to_shadow = (view, shadow, len);
        }
    }

    /// Make every change gathered.
    fn flush(&mut self) {
        self.drop_now();
        self.move_now();
    }

    fn drop_now(&mut self) {
        let (start, len) = std::mem::take(&mut self.drop);
        if len == 0 {
            return;
        }
        if let Err(err) = madvise(start, len, Advice::DontNeed) {
            crate::fatal(format_args!("pagewise dlm: dropping {start:#x}+{len:#x} failed: {err}"));
        }
    }

    fn move_now(&mut self) {
        let (view, shadow, len) = std::mem::take(&mut self.to_shadow);
        if len == 0 {
            return;
        }
        let uffd = self.uffd.expect("shadow areas have a uffd");
        if let Err(err) = uffd.move_pages(shadow, view, len, false, true) {
            crate::fatal(format_args!("pagewise dlm: moving {view:#x}+{len:#x} to the shadow failed: {err}"));
        }
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        debug_assert!(self.drop.1 == 0 && self.to_shadow.2 == 0, "a Run was dropped unflushed");
    }
}

/// Clean units moved from the shadow into the program's view, gathered while adjacent in both,
/// so that a stream's replies taken together are moved in and write-protected with one system
/// call each, and one TLB flush ([`Run`] says why that pays). Only between `gather` and
/// `finish`, which `Inner::serve` brackets around taking replies; nothing in between reads
/// the gathered ranges of the view or the shadow.
#[derive(Default)]
pub(crate) struct MoveIns {
    gathering: bool,
    dst: usize,
    src: usize,
    len: usize,
}

impl MoveIns {
    pub(crate) fn gather(&mut self) {
        debug_assert!(self.len == 0, "nothing left over from the last gathering");
        self.gathering = true;
    }

    /// Whether pages moving from `src` to `dst` continue the range gathered so far.
    fn joins(&self, dst: usize, src: usize) -> bool {
        self.len > 0 && self.dst + self.len == dst && self.src + self.len == src
    }

    /// Gather `[src, src + len)` moving to `[dst, dst + len)`: joined to the range gathered
    /// so far, or a new range if that is empty (the caller [`MoveIns::take`]s it first).
    fn add(&mut self, dst: usize, src: usize, len: usize) {
        if self.joins(dst, src) {
            self.len += len;
        } else {
            debug_assert!(self.len == 0, "a range that does not join is taken first");
            (self.dst, self.src, self.len) = (dst, src, len);
        }
    }

    /// The range gathered, to be moved in now; gathering goes on.
    fn take(&mut self) -> Option<(usize, usize, usize)> {
        let r = (self.len > 0).then_some((self.dst, self.src, self.len));
        self.len = 0;
        r
    }

    /// Stop gathering; the range gathered, to be moved in now.
    fn finish(&mut self) -> Option<(usize, usize, usize)> {
        self.gathering = false;
        self.take()
    }
}

/// Where the data of pages being installed comes from.
#[derive(Clone, Copy)]
enum Fill<'a> {
    /// Zeros (never written home).
    Zeros,
    /// A reply in a buffer (copied in).
    Data(&'a [u8]),
    /// Received where it is to be mapped from: at this address of the shadow (moved in), or of
    /// the alias (already in the memfd's page cache, zero-copy).
    InPlace(usize),
    /// Received into the program's view itself (`ReplyInto::View`).
    InView,
}

fn write_decisions(cfg: &Config, m: &crate::measure::Measure) {
    if let Some(path) = &cfg.decisions_path {
        if let Err(e) = std::fs::write(path, decisions_json(m)) {
            eprintln!("pagewise dlm: writing the tuner's decisions to {} failed: {e}", path.display());
        }
    }
}

fn decisions_json(m: &crate::measure::Measure) -> String {
    serde_json::json!({
        "decisions": m.decisions,
        "dropped": m.dropped,
        "table": crate::tune::format_table(&m.decisions),
    })
    .to_string()
}

impl State {
    /// Put set count `count` in force (read-ahead windows restart).
    fn apply_set_count(&mut self, count: u32) {
        self.set_count = count;
        for a in self.areas.iter_mut().flatten() {
            a.window = 0;
            a.last_end = usize::MAX;
        }
    }

    /// For each candidate unit size, the units the pages marked since the last clear touch.
    fn touched(&self) -> crate::tune::Touched {
        let mut t = crate::tune::Touched::default();
        for a in self.areas.iter().flatten() {
            t.add_bitmap(&a.touched, a.layout.pages, a.layout.max_set as u32);
        }
        t
    }

    fn clear_touched(&mut self) {
        for a in self.areas.iter_mut().flatten() {
            a.touched.iter_mut().for_each(|w| *w = 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MoveIns;

    #[test]
    fn move_ins_join_only_ranges_adjacent_in_both_mappings() {
        let mut m = MoveIns::default();
        m.gather();
        assert!(!m.joins(0x10000, 0x90000), "nothing gathered yet");
        m.add(0x10000, 0x90000, 0x1000);
        assert!(m.joins(0x11000, 0x91000));
        m.add(0x11000, 0x91000, 0x2000);
        assert!(!m.joins(0x13000, 0x95000), "adjacent in the view, not in the shadow");
        assert!(!m.joins(0x14000, 0x93000), "adjacent in the shadow, not in the view");
        assert_eq!(m.take(), Some((0x10000, 0x90000, 0x3000)));
        m.add(0x13000, 0x95000, 0x1000);
        assert_eq!(m.finish(), Some((0x13000, 0x95000, 0x1000)));
        assert!(!m.gathering);
        assert_eq!(m.finish(), None);
    }
}
