//! Starting the runtime: the userfaultfd (or none, for SIGSEGV), the connections to the
//! servers, the state, and the fault handling of the chosen mode (the handler thread, or the
//! signal handlers of `signals.rs`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pagewise_kernel::uffd::{feature, Uffd, UffdBuilder};

use super::fault::handler_thread;
use super::frames::Frames;
use super::install::MoveIns;
use super::remote::Conn;
use super::{redundant, Clock, Dlm, DlmError, Inner, State, Stats, ACTIVE, INITIALISED, MAX_PENDING};
use crate::config::{Config, FaultMode};
use crate::transport::TcpTransport;

/// Open the userfaultfd for `mode`; returns it and whether it handles user-mode faults only.
///
/// Without CAP_SYS_PTRACE and with vm.unprivileged_userfaultfd=0, userfaultfd(2) is still
/// allowed with UFFD_USER_MODE_ONLY (Linux 5.11, fs/userfaultfd.c userfaultfd_syscall_allowed).
/// Such a descriptor does not see faults taken inside the kernel (a read(2) into a missing DLM
/// page gets EFAULT) — which the SIGBUS mode cannot serve anyway — so an unprivileged program
/// still gets the userfaultfd path; PROT_NONE + SIGSEGV remains for kernels or sandboxes
/// (e.g. container seccomp profiles) where userfaultfd cannot be opened at all. The handler
/// thread gets no such fallback: serving the kernel's faults is what it is for.
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
            // The faulting thread's id: the handler keeps it company (`runtime/colocate.rs`).
            b.require(feature::THREAD_ID & kernel_features).nonblocking(true)
        }
    };
    match builder(false).open() {
        Ok(u) => Ok((u, false)),
        // The handler thread is there to serve the kernel's faults too (a read(2) into a unit
        // not resident): a user-mode-only descriptor would fail those with EFAULT.
        Err(first) if mode == FaultMode::HandlerThread => Err(first),
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
        if cfg.colocate {
            pagewise_kernel::colocate::widen_inherited_mask();
        }
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
        let mut links: Vec<(Box<dyn crate::transport::Transport>, String)> = Vec::new();
        for addr in &cfg.servers {
            let t = TcpTransport::open(addr, cfg.secret.as_ref(), cfg.fault_timeout)
                .map_err(|e| DlmError::Connect { server: addr.clone(), source: e })?;
            links.push((Box::new(t), addr.clone()));
        }
        // With redundancy the servers are one home to the rest of the runtime: the transport
        // spreads each unit's pieces over them (`runtime/redundant.rs`).
        if cfg.redundancy.is_redundant() {
            let r = redundant::Redundant::new(cfg.redundancy, cfg.base_page, cfg.max_set as usize, links)
                .map_err(DlmError::Config)?;
            let name = crate::transport::Transport::peer(&r);
            links = vec![(Box::new(r), name)];
        }
        let conns: Vec<Conn> = links
            .into_iter()
            .map(|(t, addr)| Conn {
                t,
                addr,
                next_id: 1,
                pending: VecDeque::with_capacity(MAX_PENDING),
                corked: Vec::with_capacity(MAX_PENDING),
            })
            .collect();
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
        let measure = crate::measure::Measure::new(
            tuner,
            cfg.auto_tune,
            cfg.tune_window,
            mode != FaultMode::HandlerThread,
            pagewise_kernel::cpu::CpuClock::PROCESS.now(),
        );
        // Tuned over windows, the unit starts where the window tuner starts (`tune/window.rs`).
        let set_count = if cfg.auto_tune { measure.window_state.set() } else { cfg.set_count };
        let state = State {
            measure,
            handler_clock: None,
            conns,
            areas: Vec::new(),
            clock: Clock::with_capacity(max_units),
            frames: Frames::with_capacity(1024),
            borrowed: Vec::with_capacity(MAX_PENDING),
            sole_thread: None,
            colocated: false,
            move_ins: MoveIns::default(),
            set_count,
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
            sampling: Default::default(),
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
            owner: std::process::id(),
        });
        let mut dlm = Dlm { inner: Arc::clone(&inner), handler: None, signal: None };
        match mode {
            FaultMode::HandlerThread => {
                let i = Arc::clone(&inner);
                let h = pagewise_kernel::signal::spawn_blocking_signals(
                    std::thread::Builder::new().name("dlm-fault-handler".into()),
                    move || handler_thread(&i),
                )
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
}
