//! The client runtime: DLM areas, their fault handling, page sets, the local limit, eviction
//! and write-back.
//!
//! Where things are: this file holds the API (`Dlm`) and the runtime's state; `runtime/area.rs`
//! makes and unmakes areas; `runtime/start.rs` starts the runtime; `runtime/fault.rs` is the
//! fault path (handler thread, `serve`); `runtime/install.rs` requests units and installs
//! their replies; `runtime/evict.rs` makes room (eviction, write-back, reference sampling);
//! `runtime/frames.rs` keeps evicted units' frames; `runtime/remote.rs` the connections and
//! the checking of every reply; `runtime/tuning.rs` the unit size's loops and decisions.
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
//! Small units received into the program's view (below), or copied in from a reply buffer or
//! zeros, are not protected at all (`Config::hash_clean`): the runtime keeps a hash of their
//! bytes (xxh3, keyed per runtime; a copy's taken of its source, since the copy wakes the
//! program) and eviction hashes them again — equal: clean, dropped; different: written home.
//! Protected instead, copies cost the 4 KiB solver of `dlm-programs` 15,000 first-write faults
//! (for 10,000 missing-page faults), each a round trip through the handler thread. Protecting
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
//! still in use; `Stats::second_chances` and `reference_faults` count them. That cost pays
//! only while the bits tell units apart: when nearly every armed unit comes back (a program
//! using all it holds), second chances thin out and the hand takes units as they come
//! (`sampling.rs`; `Stats::second_chances_refused`). When every unit is referenced (a scan
//! outruns the hand) the tie goes to a unit never used since it came in (`clock.rs`).
//! Anonymous areas without a shadow (kernels without UFFDIO_MOVE nor shmem
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

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use pagewise_kernel::mem::Mapping;
use pagewise_kernel::uffd::Uffd;

pub use pagewise_kernel::colocate::PROGRAM_CPUS_ENV;

mod area;
mod audit;
mod evict;
mod fault;
mod frames;
mod install;
mod journal;
mod pinned;
mod ranges;
mod redundant;
mod remote;
mod start;
mod tuning;

use evict::Run;
use frames::Frames;
use install::{Fill, MoveIns};

/// Smallest unit received into the shadow and moved in after its reply (a read-ahead unit, or
/// any unit of a program with more threads or under the handler thread). Below it one
/// UFFDIO_COPY costs less than gathering frames, reading the thread count, a move and a
/// write-protect: `pagewise eval dlm-fault` measured moving at 1.15× copying for 64 KiB units,
/// 0.69× for 256 KiB and 0.64× for 1 MiB (server on the other core). Not while the handler
/// thread shares the program's one CPU (`Inner::move_min`): there a move flushes one TLB, and
/// the project's solver with 4 KiB units at 5% ran 0.93× as long moving as copying, with
/// evicted units moved out before they are read (`Inner::evict`; median of 12 interleaved pairs).
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
use crate::DlmError;

/// A second mapping of an area's memfd, and the memfd.
type MemfdView = (Mapping, OwnedFd);

/// Page table value: not resident.
const NONE: u32 = u32::MAX;
/// Page table value: requested from its home, reply not yet installed.
const INFLIGHT: u32 = u32::MAX - 1;
/// Page table value: unmapped by the program (`Dlm::unmap`), or beyond the allocation: not
/// DLM's any more, and whatever the program maps there later is not either.
const GONE: u32 = u32::MAX - 2;
/// Page table value: left DLM with its data (`Dlm::detach`): ordinary memory of the program.
const DETACHED: u32 = u32::MAX - 3;

/// Whether a page table value names a CLOCK slot (a resident page), not a state.
fn is_resident(slot: u32) -> bool {
    slot < DETACHED
}

/// Whether a page table value is a page DLM still serves (resident, on its way, or at home).
fn is_live(slot: u32) -> bool {
    slot != GONE && slot != DETACHED
}

/// How the program will access an area (`madvise` MADV_NORMAL / MADV_SEQUENTIAL /
/// MADV_RANDOM), as the kernel reads it for its own read-ahead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Access {
    /// Read ahead once faults continue a sequential run (the default).
    #[default]
    Normal,
    /// Read ahead from the first fault on.
    Sequential,
    /// No read-ahead.
    Random,
}
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
    /// Referenced units the hand evicted without a second chance: armed units came back too
    /// often for arming to pay (`sampling.rs`).
    pub second_chances_refused: u64,
    /// Times the handler thread pinned the program's one thread and itself to one CPU
    /// (`Config::colocate`, `runtime/colocate.rs`).
    pub colocations: u64,
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
    /// READs that carried several read-ahead units (`Inner::request_ahead`).
    pub grouped_reads: u64,
    /// Read-ahead units installed before the program reached them, their reply having
    /// arrived whole when a fault was served (`Inner::complete_arrived`): no fault of their own.
    pub arrived_installs: u64,
    /// Units moved into the program's view together with the unit before them, one move (and
    /// one write-protect) for both (`MoveIns`).
    pub joined_move_ins: u64,
    /// Units installed as zeros because they were never written back.
    pub zero_units: u64,
    /// Bytes the program dropped (`Dlm::discard`, `unmap`, `detach`) that their homes were
    /// told to forget (DISCARD).
    pub discarded_bytes: u64,
    /// Clean units left writable and remembered by a hash of their bytes instead of
    /// write-protected (`Config::hash_clean`; module doc, "Dirty tracking").
    pub hashed_installs: u64,
    /// Evicted hashed units whose bytes still had their hash (dropped) or not (written home).
    pub clean_by_hash: u64,
    pub written_by_hash: u64,
    pub evictions: u64,
    pub writebacks: u64,
    pub writeback_bytes: u64,
    /// Bytes of pages found where a unit's pages were to be moved in the shadow, owned by no
    /// unit, and freed (`Inner::move_over_strays`): 0 unless the bookkeeping slipped.
    pub stray_shadow_bytes: u64,
    /// Bytes of units kept resident because the kernel would not let them go: pages it held
    /// pinned (O_DIRECT I/O, io_uring's registered buffers, another process's
    /// process_vm_readv/writev) refuse to move (`pinned.rs`). Counted at each refusal.
    pub pinned_kept_bytes: u64,
    /// Moves the kernel refused after making them, counted as made (`Uffd::move_pages`), in
    /// this process.
    pub moves_refused_yet_made: u64,
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
    /// Per base page: clock slot, NONE, INFLIGHT, or not DLM's any more (GONE, DETACHED).
    slot: Vec<u32>,
    /// Per base page: its home holds data written back (else it still reads as zeros).
    home_written: Vec<bool>,
    /// Per base page: the loop or window being measured faulted on it (`measure.rs`).
    touched: Vec<u64>,
    /// Sequential-stream detection: end page of the last demand fault and the window.
    last_end: usize,
    window: usize,
    /// Bytes of the program's view mapped when the area was made: the allocation rounded up to
    /// whole base pages (the layout's pages beyond it are GONE from the start). The view is
    /// unmapped a live run at a time when the area is freed (`free_locked`), since the program
    /// may have unmapped parts of it and mapped something else there since.
    view_len: usize,
    /// How the program said it will access the area (`madvise`): steers read-ahead.
    access: Access,
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
    /// Whether the program has one thread (`Inner::program_stopped`), found once per holding of
    /// the lock.
    sole_thread: Option<bool>,
    /// The handler thread and the program's one thread share a CPU (handler-thread mode,
    /// `Colocation`): page-table moves then flush the TLB of that CPU only (`Inner::move_min`).
    colocated: bool,
    /// Clean units moved in while a fault takes its replies, not yet write-protected.
    move_ins: MoveIns,
    set_count: u32,
    resident: usize,
    buf: Vec<u8>,
    zeros: Vec<u8>,
    stats: Stats,
    /// How often the hand arms units (`sampling.rs`).
    sampling: crate::sampling::Sampling,
    measure: crate::measure::Measure,
    /// The handler thread's CPU clock (handler-thread mode, once it runs): its time is the
    /// runtime's, not the program's (`State::program_cpu`).
    handler_clock: Option<pagewise_kernel::cpu::CpuClock>,
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
    /// This process's thread count (`Inner::program_stopped`).
    threads: Option<pagewise_kernel::procfs::ThreadCount>,
    /// Key of the clean units' hashes, random per runtime: what a program writes cannot be
    /// chosen to collide.
    hash_seed: u64,
    uffd: Option<Uffd>,
    state: Mutex<State>,
    stop: AtomicBool,
    /// The process that started the runtime: the only one that may use it (`check_owner`).
    owner: u32,
}

/// The DLM runtime of this process (at most one at a time).
pub struct Dlm {
    inner: Arc<Inner>,
    handler: Option<JoinHandle<()>>,
    signal: Option<crate::signals::Installed>,
}

pub(crate) use fault::Served;
use remote::Conn;
use tuning::write_decisions;

/// The runtime the signal handlers serve; set while a signal mode is active.
pub(crate) static ACTIVE: AtomicPtr<Inner> = AtomicPtr::new(std::ptr::null_mut());
static INITIALISED: AtomicBool = AtomicBool::new(false);

impl Dlm {
    /// Whether this process started the runtime (false in a child made by fork(2), which
    /// must not use it: its connections and areas are the parent's).
    pub fn owned_here(&self) -> bool {
        self.inner.check_owner().is_ok()
    }

    /// The fault mode in use.
    pub fn mode(&self) -> FaultMode {
        self.inner.mode
    }

    /// A new area of `len` bytes: ordinary memory to every thread, backed by the servers.
    pub fn alloc(&self, len: usize) -> Result<*mut u8, DlmError> {
        self.alloc_inner(len, None)
    }

    /// Make `[addr, addr + n)` an area, where n is `len` rounded down to whole base pages
    /// (returned), replacing what is mapped there now; its content starts as zeros. For memory
    /// that must keep its address: a program's zero-initialised data (`pagewise run --bss`),
    /// or an anonymous mapping the program places itself (MAP_FIXED, or a reservation it
    /// commits). Userfaultfd modes only (not SIGSEGV). The area is anonymous memory, keeping
    /// the private semantics of what it replaces.
    ///
    /// # Safety
    /// The caller owns `[addr, addr + len)`: nothing else uses or unmaps what is there now.
    pub unsafe fn alloc_at(&self, addr: usize, len: usize) -> Result<usize, DlmError> {
        let n = len / self.inner.cfg.base_page * self.inner.cfg.base_page;
        if n == 0 {
            return Err(DlmError::Config(format!("{len} bytes are less than one base page")));
        }
        if self.inner.mode == FaultMode::Sigsegv {
            return Err(DlmError::Config("a fixed-address area needs userfaultfd (not the SIGSEGV mode)".into()));
        }
        self.alloc_inner(n, Some(addr))?;
        Ok(n)
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

    /// The base page: every unit is a whole number of them.
    pub fn base_page(&self) -> usize {
        self.inner.cfg.base_page
    }

    pub fn stats(&self) -> Stats {
        let st = self.inner.lock();
        let mut s = st.stats.clone();
        s.resident_bytes = st.resident;
        s.set_count = st.set_count;
        s.moves_refused_yet_made = pagewise_kernel::uffd::moves_refused_yet_made();
        s
    }

    /// Write every dirty unit back to its home and drop every local copy (the next touch of
    /// any page fetches it again), but those of pages the kernel holds pinned (`pinned.rs`).
    /// Returns the bytes that were resident.
    pub fn evict_all(&self) -> usize {
        let mut st = self.inner.lock();
        self.inner.drain_all(&mut st);
        let before = st.resident;
        let mut run = Run::new(self.inner.uffd.as_ref());
        // Units the kernel will not let go stay (`pinned.rs`): each is met again once the
        // hand has gone round, and then there is nothing else left to evict.
        let mut refused = 0;
        while let Some(v) = st.clock.victim(|_| true) {
            if !self.inner.evict(&mut st, v, &mut run) {
                refused += 1;
            }
            if refused > st.clock.len() {
                break;
            }
        }
        self.inner.flush_run(&mut st, &mut run);
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
        self.inner.audit_slots(&st)?;
        if st.resident > self.inner.cfg.local_mem {
            return Err(format!("resident {} over the limit {}", st.resident, self.inner.cfg.local_mem));
        }
        self.inner.audit_shadows(&st)?;
        self.inner.audit_views(&st)
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
        if self.inner.check_owner().is_err() {
            // A child made by fork(2): the connections, areas and handler thread are its
            // parent's (the areas and the runtime's mappings are not even mapped here, and the
            // child may have mapped its own memory where they lie). Touch nothing; forget it.
            std::mem::forget(self.handler.take());
            let _ = self.signal.take();
            std::mem::forget(Arc::clone(&self.inner));
            self.inner.stop.store(true, Ordering::Release);
            INITIALISED.store(false, Ordering::Release);
            return;
        }
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

    fn drain_all(&self, st: &mut State) {
        for s in 0..st.conns.len() {
            while self.complete_one(st, s) {}
        }
    }
}
