//! The C API of HPS (`include/pagewise/hps.h`), with the seed's names.
//!
//! One HPS instance per process, created by `hps_enable_track` (or by the first
//! `hps_arena_alloc`, with tracking off until enabled). Functions return 0 or a count on
//! success and a negative errno on failure; pointer-returning functions return NULL and set
//! errno. No function unwinds into C: a Rust panic becomes -EIO.

use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::fill::FirstTouch;
use crate::hps::{ActivePage, Hps, HpsConfig, Notify};
use crate::pace::Pace;
use crate::policy::{Decision, RegionRule, RegionView, TrackState};

/// `struct hps_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HpsConfigC {
    pub interval_ms: u32,
    pub max_interval_ms: u32,
    pub active_threshold: u32,
    pub sample_pages: u32,
    pub budget_pages: u32,
    /// HPS_NOTIFY_NONE 0, HPS_NOTIFY_HANDLER 1, HPS_NOTIFY_WAIT 2.
    pub notify: c_int,
    pub signal_offset: c_int,
    pub publish: c_int,
    pub promote_fraction: f64,
    /// 0: no host-wide budget.
    pub host_hugepages: u64,
}

/// `struct hps_page`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HpsPageC {
    pub addr: usize,
    pub count: u32,
    pub reserved: u32,
}

/// `struct hps_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HpsStatsC {
    pub periods: u64,
    pub armed_pages: u64,
    pub faults: u64,
    pub promoted_regions: u64,
    pub compacted_pages: u64,
    pub notifications_sent: u64,
    pub notifications_received: u64,
}

/// `hps_decide_fn`: returns HPS_DEFAULT (-1), HPS_OBSERVE (0), HPS_PROMOTE (1),
/// HPS_COMPACT (2) or HPS_OBSERVE_FULLY (3).
pub type DecideFnC = extern "C" fn(ctx: *mut c_void, region: usize, total: u32, observed: u32, active: u32) -> c_int;
/// `hps_compact_fn`: move the objects on `pages`; returns how many pages were moved.
pub type CompactFnC = extern "C" fn(ctx: *mut c_void, pages: *const HpsPageC, n: usize) -> usize;

static INSTANCE: OnceLock<Mutex<Option<Arc<Hps>>>> = OnceLock::new();

fn slot() -> &'static Mutex<Option<Arc<Hps>>> {
    INSTANCE.get_or_init(|| Mutex::new(None))
}

fn current() -> Option<Arc<Hps>> {
    slot().lock().ok()?.clone()
}

fn guarded(f: impl FnOnce() -> i64) -> i64 {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(-(libc::EIO as i64))
}

fn set_errno(e: i32) {
    pagewise_kernel::error::set_errno(e);
}

fn to_config(c: &HpsConfigC) -> Result<HpsConfig, i32> {
    let d = HpsConfig::default();
    let notify = match c.notify {
        0 => Notify::None,
        1 => Notify::Handler,
        2 => Notify::Wait,
        _ => return Err(libc::EINVAL),
    };
    if !(0.0..=1.0).contains(&c.promote_fraction) {
        return Err(libc::EINVAL);
    }
    let pick = |v: u32, dflt: u64| if v == 0 { dflt } else { v as u64 };
    Ok(HpsConfig {
        interval_ms: pick(c.interval_ms, d.interval_ms),
        max_interval_ms: pick(c.max_interval_ms, d.max_interval_ms),
        active_threshold: pick(c.active_threshold, d.active_threshold as u64) as u32,
        rule: RegionRule {
            promote_fraction: if c.promote_fraction == 0.0 { d.rule.promote_fraction } else { c.promote_fraction },
            ..d.rule
        },
        sample_pages: pick(c.sample_pages, d.sample_pages as u64) as usize,
        budget_pages: pick(c.budget_pages, d.budget_pages as u64) as usize,
        notify,
        signal_offset: c.signal_offset,
        publish: c.publish != 0,
        host_hugepages: if c.host_hugepages == 0 { None } else { Some(c.host_hugepages) },
        ..d
    })
}

/// Fill `cfg` with the defaults (`hps_config_default`).
///
/// # Safety
/// `cfg` must point to a writable `struct hps_config`.
#[no_mangle]
pub unsafe extern "C" fn hps_config_default(cfg: *mut HpsConfigC) -> c_int {
    if cfg.is_null() {
        return -libc::EINVAL;
    }
    let d = HpsConfig::default();
    let c = HpsConfigC {
        interval_ms: d.interval_ms as u32,
        max_interval_ms: d.max_interval_ms as u32,
        active_threshold: d.active_threshold,
        sample_pages: d.sample_pages as u32,
        budget_pages: d.budget_pages as u32,
        notify: 1,
        signal_offset: d.signal_offset,
        publish: 1,
        promote_fraction: d.rule.promote_fraction,
        host_hugepages: 0,
    };
    // SAFETY: the caller guarantees cfg is writable.
    unsafe { cfg.write(c) };
    0
}

/// Start tracking this process's HPS arenas (`hps_enable_track`). `cfg` may be NULL for the
/// defaults (handler mode). Calling it again restarts tracking after `hps_disable_track`.
///
/// # Safety
/// `cfg` is NULL or points to a valid `struct hps_config`.
#[no_mangle]
pub unsafe extern "C" fn hps_enable_track(cfg: *const HpsConfigC) -> c_int {
    guarded(|| {
        let cfg = if cfg.is_null() {
            HpsConfig { notify: Notify::Handler, ..Default::default() }
        } else {
            // SAFETY: the caller guarantees cfg is valid.
            match to_config(unsafe { &*cfg }) {
                Ok(c) => c,
                Err(e) => return -(e as i64),
            }
        };
        let mut s = match slot().lock() {
            Ok(s) => s,
            Err(_) => return -(libc::EIO as i64),
        };
        match s.as_ref() {
            Some(h) => {
                h.configure(|c| {
                    c.interval_ms = cfg.interval_ms;
                    c.max_interval_ms = cfg.max_interval_ms;
                    c.active_threshold = cfg.active_threshold;
                    c.rule = cfg.rule;
                    c.sample_pages = cfg.sample_pages;
                    c.budget_pages = cfg.budget_pages;
                    c.publish = cfg.publish;
                });
                h.set_tracking(true);
                0
            }
            None => match Hps::start(cfg) {
                Ok(h) => {
                    *s = Some(Arc::new(h));
                    0
                }
                Err(e) => -(e.errno() as i64),
            },
        }
    }) as c_int
}

/// Start HPS for `pagewise hps run` (the preload shim's HPS arena): promote-only (hot regions
/// are collapsed; sparse ones are only observed, since an unmodified program cannot move its
/// objects), faults heard by a handler thread (so system calls that write into tracked
/// memory, such as read(2) into a malloc'd buffer, are served rather than failed with EFAULT),
/// and the decision step run by the handler-mode service thread. `promote_fraction` 0 and
/// `interval_ms` 0 take the defaults. Not in hps.h: the shim's entry point, not an API.
#[no_mangle]
pub extern "C" fn hps_preload_start(promote_fraction: f64, interval_ms: u32) -> c_int {
    guarded(|| {
        if !(0.0..=1.0).contains(&promote_fraction) {
            return -(libc::EINVAL as i64);
        }
        let d = HpsConfig::default();
        // A program nobody tuned for HPS pays a fault for every page observed: a region is
        // judged on 16 pages a period, not 64 (GNU sort with a 256 MiB buffer, which touches
        // everything: 0.82 s -> 0.76 s median of 5, plain 0.65 s).
        // A collapse waits for a full region (`--min-filled`): the program's own memory,
        // not THP's bloat (redis: 53 regions promoted right after its fill added 2.9 MiB).
        let rule = RegionRule {
            promote_fraction: if promote_fraction == 0.0 { d.rule.promote_fraction } else { promote_fraction },
            min_observed: PRELOAD_SAMPLE_PAGES as u32,
            min_filled: env_number("PAGEWISE_HPS_MIN_FILLED").filter(|f| (0.0..=1.0).contains(f)).unwrap_or(1.0),
        };
        // Promotion and tracking each have a bucket of this pace (`PRELOAD_PACE_SHARE`).
        let pace = Pace::new(
            env_number("PAGEWISE_HPS_PACE").filter(|s| *s > 0.0 && *s <= 1.0).unwrap_or(PRELOAD_PACE_SHARE),
            PRELOAD_PACE_BURST.as_nanos() as u64,
            env_number("PAGEWISE_HPS_PACE_RAMP_S")
                .filter(|s| (0.0..=86_400.0).contains(s))
                .map_or(PRELOAD_PACE_RAMP, Duration::from_secs_f64)
                .as_nanos() as u64,
        );
        let cfg = HpsConfig {
            interval_ms: if interval_ms == 0 { d.interval_ms } else { interval_ms as u64 },
            max_interval_ms: d.max_interval_ms.max(interval_ms as u64),
            rule,
            notify: Notify::Handler,
            delivery: Some(pagewise_track::Delivery::HandlerThread),
            converge: Some(preload_converge_rule()),
            probe_pages: 32,
            sample_pages: PRELOAD_SAMPLE_PAGES,
            log_state: std::env::var_os("PAGEWISE_HPS_LOG").is_some_and(|v| v == "1"),
            colocate: std::env::var_os("PAGEWISE_HPS_COLOCATE").is_none_or(|v| v != "0"),
            first_touch: std::env::var("PAGEWISE_HPS_FIRST_TOUCH")
                .ok()
                .and_then(|v| FirstTouch::parse(&v))
                .unwrap_or_default(),
            pace: Some(pace),
            track_pace: Some(pace),
            // Seconds, or `off` (`pagewise hps run --late-routing`); unset: off.
            late_routing: env_number("PAGEWISE_HPS_LATE_ROUTING_S")
                .filter(|s| (0.0..=86_400.0).contains(s))
                .map(Duration::from_secs_f64),
            ..d
        };
        // A process exec'd by a pinned program gets the program's CPUs back.
        pagewise_kernel::colocate::widen_inherited_mask();
        let mut s = match slot().lock() {
            Ok(s) => s,
            Err(_) => return -(libc::EIO as i64),
        };
        if s.is_some() {
            return -(libc::EBUSY as i64);
        }
        match Hps::start(cfg) {
            Ok(h) => {
                h.set_functions(Some(Box::new(move |_, v| Some(promote_only(v, &rule)))), None);
                *s = Some(Arc::new(h));
                0
            }
            Err(e) => -(e.errno() as i64),
        }
    }) as c_int
}

/// The program `pagewise hps run` started began listening for connections (the shim's
/// `listen`): a server, which runs until stopped, so the pace's ramp ends ([`Hps::program_serves`]).
/// 0 or a negative errno. Not in hps.h, like `hps_preload_start`.
#[no_mangle]
pub extern "C" fn hps_preload_serving() -> c_int {
    guarded(|| {
        let Some(h) = current() else { return -(libc::EINVAL as i64) };
        h.program_serves();
        0
    }) as c_int
}

/// How fast `pagewise hps run` promotes ([`crate::pace`]): collapses take at most 20% of a
/// CPU over the program's run (`--pace`), a share reached after 10 s and growing to it from
/// none (`--pace-ramp`), saved up to 25 ms at most. Measured on this VM kind from settled
/// memory, each collapse after [`crate::promote::warm_hugepage`]: GNU sort of 64 MiB with its
/// output read through a pipe ran 1.16× plain at a flat 20%, 1.10× at 5% and 1.04× at 2% (the
/// reader wants the core the collapses run on); memcached's zipfian reads after its warm-up
/// took 1.87 s at 5%, 1.73 at 20% and 1.74 unpaced (plain 1.92): promotion put off is
/// tracking prolonged, and a server has run for seconds before its reads. Tracking has a bucket
/// of its own at the same pace, charged with its handler's CPU time and the time spent arming:
/// unpaced, observing GNU sort's buffer took 23–31 ms of its 0.8 s (4%; median of 8: 1.068×
/// plain, 1.029× with tracking off). A program that listens for connections skips the ramp
/// ([`hps_preload_serving`]): memcached's hugepages then come during its warm-up, not after.
const PRELOAD_PACE_SHARE: f64 = 0.2;
const PRELOAD_PACE_BURST: Duration = Duration::from_millis(25);
const PRELOAD_PACE_RAMP: Duration = Duration::from_secs(10);

/// A number from the environment, if set and parsable.
fn env_number(key: &str) -> Option<f64> {
    std::env::var(key).ok().and_then(|v| v.parse::<f64>().ok())
}

/// Pages of a region `pagewise hps run` observes per period, and judges it on.
const PRELOAD_SAMPLE_PAGES: usize = 16;

/// When `pagewise hps run` stops tracking: 20 periods without a new promotion after one (0.4 s
/// at the 20 ms period, about 5 s once it has thinned out to 320 ms), or after 250 periods
/// whatever happened (new memory restarts it: memcached filling its cache); then a
/// probe every 16 periods of 320 ms, about 5 s: the counts of undecided regions are forgotten
/// and 32 pages of each are observed for one period, and a region the rule then promotes
/// restarts tracking, as does new memory. An unmodified program gives no hit counts, so drift
/// is found by the probes alone.
fn preload_converge_rule() -> crate::policy::ConvergeRule {
    crate::policy::ConvergeRule { quiet_steps: 20, max_session_steps: 250, probe_every: 16, ..Default::default() }
}

/// One line on the tracking state for the shim's end-of-run report (`pagewise hps run`):
/// NUL-terminated into `buf`; 0 or a negative errno. Not in hps.h, like `hps_preload_start`.
///
/// # Safety
/// `buf` must be valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn hps_preload_state(buf: *mut c_char, n: usize) -> c_int {
    guarded(|| {
        let Some(h) = current() else { return -(libc::EINVAL as i64) };
        if buf.is_null() || n == 0 {
            return -(libc::EINVAL as i64);
        }
        let st = h.stats();
        let at_exit = match h.track_state() {
            TrackState::Tracking => "still tracking at exit",
            TrackState::Converged => "tracking converged at exit",
        };
        let pace = match st.serving_since_ns {
            Some(t) => format!("the whole pace share since the program began serving at {:.2} s", t as f64 / 1e9),
            None => "the pace ramped with the program's age".to_string(),
        };
        // A move refused by the kernel leaves its region private (untracked, never promoted).
        let failed = match st.move_in_failures {
            0 => String::new(),
            n => format!(", {n} move(s) failed and left private"),
        };
        let line = format!(
            "hps: {} arena(s) began as the program's private memory, {} region(s) moved into tracked memory ({} page(s) copied, {:.1} ms{failed}); {} region(s) advised ahead of a dense fill, {} declined (hugepages dear); the pace put off {} promotion(s) and {} tracking period(s); {} promotion(s) waited for a region to fill; {pace}; {at_exit}; converged {} time(s), restarted {} time(s), {} probe(s) while converged",
            st.young_arenas, st.moved_in_regions, st.moved_in_pages, st.move_in_ns as f64 / 1e6,
            st.first_touch_regions, st.first_touch_declined, st.paced_promotions, st.paced_periods, st.unfilled_promotions, st.converge_stops, st.converge_restarts, st.probes
        );
        let len = line.len().min(n - 1);
        // SAFETY: the caller guarantees `buf` is valid for `n` bytes and `len < n`.
        unsafe {
            std::ptr::copy_nonoverlapping(line.as_ptr(), buf as *mut u8, len);
            *buf.add(len) = 0;
        }
        0
    }) as c_int
}

/// The region rule without compaction: promote a dense region, keep observing the rest.
fn promote_only(v: &RegionView, rule: &RegionRule) -> Decision {
    match crate::policy::decide(v, rule) {
        Decision::Promote => Decision::Promote,
        _ => Decision::Observe,
    }
}

/// Stop tracking (`hps_disable_track`); arenas, counts and callbacks stay.
#[no_mangle]
pub extern "C" fn hps_disable_track() -> c_int {
    guarded(|| match current() {
        Some(h) => {
            h.set_tracking(false);
            0
        }
        None => -(libc::EINVAL as i64),
    }) as c_int
}

/// End HPS in this process: stop every thread, free the arenas (`hps_shutdown`). Memory from
/// `hps_arena_alloc`/`hps_huge_alloc` must not be used afterwards.
#[no_mangle]
pub extern "C" fn hps_shutdown() -> c_int {
    guarded(|| {
        let h = slot().lock().ok().and_then(|mut s| s.take());
        if let Some(h) = h {
            h.set_functions(None, None);
        }
        0
    }) as c_int
}

/// Install the application's decide and compact functions (`hps_set_functions`); either may
/// be NULL (default rule; no compaction). `ctx` is passed back to both.
#[no_mangle]
pub extern "C" fn hps_set_functions(decide: Option<DecideFnC>, compact: Option<CompactFnC>, ctx: *mut c_void) -> c_int {
    guarded(|| {
        let Some(h) = current() else { return -(libc::EINVAL as i64) };
        let ctx = ctx as usize;
        let d = decide.map(|f| -> crate::hps::DecideFn {
            Box::new(move |region, v| match f(ctx as *mut c_void, region, v.total, v.observed, v.active) {
                0 => Some(Decision::Observe),
                1 => Some(Decision::Promote),
                2 => Some(Decision::Compact),
                3 => Some(Decision::ObserveFully),
                _ => None,
            })
        });
        let c = compact.map(|f| -> crate::hps::CompactFn {
            Box::new(move |pages: &[ActivePage]| {
                let v: Vec<HpsPageC> =
                    pages.iter().map(|p| HpsPageC { addr: p.addr, count: p.count, reserved: 0 }).collect();
                f(ctx as *mut c_void, v.as_ptr(), v.len()).min(v.len())
            })
        });
        h.set_functions(d, c);
        0
    }) as c_int
}

/// Block until a notification (`timeout_ms` < 0: forever), then run the decision step in this
/// thread (`hps_wait_signal`). Returns the number of active pages notified, 0 on timeout.
#[no_mangle]
pub extern "C" fn hps_wait_signal(timeout_ms: c_int) -> i64 {
    guarded(|| {
        let Some(h) = current() else { return -(libc::EINVAL as i64) };
        let t = if timeout_ms < 0 { None } else { Some(Duration::from_millis(timeout_ms as u64)) };
        match h.wait_signal(t) {
            Ok(Some(n)) => n as i64,
            Ok(None) => 0,
            Err(e) => -(e.errno() as i64),
        }
    })
}

/// Run the decision step now (`hps_process`); returns promoted regions + compacted pages.
#[no_mangle]
pub extern "C" fn hps_process() -> i64 {
    guarded(|| {
        let Some(h) = current() else { return -(libc::EINVAL as i64) };
        match h.process() {
            Ok(o) => (o.promoted + o.compacted_pages) as i64,
            Err(e) => -(e.errno() as i64),
        }
    })
}

/// Copy up to `n` active pages into `buf` (`hps_get_active`); returns how many there are in
/// all (may exceed `n`; `buf` may be NULL to ask the number).
///
/// # Safety
/// `buf` is NULL or writable for `n` entries.
#[no_mangle]
pub unsafe extern "C" fn hps_get_active(buf: *mut HpsPageC, n: usize) -> i64 {
    guarded(|| {
        let Some(h) = current() else { return -(libc::EINVAL as i64) };
        let active = h.get_active();
        if !buf.is_null() {
            for (i, p) in active.iter().take(n).enumerate() {
                // SAFETY: i < n and the caller guarantees n writable entries.
                unsafe { buf.add(i).write(HpsPageC { addr: p.addr, count: p.count, reserved: 0 }) };
            }
        }
        active.len() as i64
    })
}

fn ensure_instance() -> Result<Arc<Hps>, i32> {
    let mut s = slot().lock().map_err(|_| libc::EIO)?;
    if let Some(h) = s.as_ref() {
        return Ok(h.clone());
    }
    let h = Arc::new(Hps::start(HpsConfig { notify: Notify::Handler, ..Default::default() }).map_err(|e| e.errno())?);
    h.set_tracking(false);
    *s = Some(h.clone());
    Ok(h)
}

/// Memory HPS tracks (`hps_arena_alloc`): 2 MiB aligned, `len` rounded up to 2 MiB, zeroed.
#[no_mangle]
pub extern "C" fn hps_arena_alloc(len: usize) -> *mut c_void {
    guarded_alloc(|| ensure_instance()?.alloc(len).map_err(|e| e.errno()))
}

/// Memory HPS tracks at exactly `[addr, addr+len)` (page aligned), mapped over what is there
/// (`hps_arena_alloc_at`): `addr`, or NULL with errno set, the range then plain zero-filled
/// read-write private memory, or as it was if nothing was mapped over it yet. Freed with
/// `hps_arena_free(addr)`.
///
/// # Safety
/// The caller owns `[addr, addr+len)`: what is mapped there is replaced.
#[no_mangle]
pub unsafe extern "C" fn hps_arena_alloc_at(addr: *mut c_void, len: usize) -> *mut c_void {
    // SAFETY: the caller's contract.
    guarded_alloc(|| unsafe { ensure_instance()?.alloc_at(addr as usize, len) }.map_err(|e| e.errno()))
}

/// Run an allocation for C: the pointer, or NULL with errno set (EIO when it panicked).
fn guarded_alloc(f: impl FnOnce() -> Result<*mut u8, i32> + std::panic::UnwindSafe) -> *mut c_void {
    match std::panic::catch_unwind(f) {
        Ok(Ok(p)) => p as *mut c_void,
        Ok(Err(e)) => {
            set_errno(e);
            std::ptr::null_mut()
        }
        Err(_) => {
            set_errno(libc::EIO);
            std::ptr::null_mut()
        }
    }
}

/// Free an arena (`hps_arena_free`).
#[no_mangle]
pub extern "C" fn hps_arena_free(p: *mut c_void) -> c_int {
    guarded(|| {
        let Some(h) = current() else { return -(libc::EINVAL as i64) };
        match h.free(p as *mut u8) {
            Ok(()) => 0,
            Err(e) => -(e.errno() as i64),
        }
    }) as c_int
}

/// Free the memory of `[p, p+len)` inside an arena, e.g. pages whose objects were compacted
/// away (`hps_release`). Page aligned.
#[no_mangle]
pub extern "C" fn hps_release(p: *mut c_void, len: usize) -> c_int {
    guarded(|| {
        let Some(h) = current() else { return -(libc::EINVAL as i64) };
        match h.release(p as usize, len) {
            Ok(()) => 0,
            Err(e) => -(e.errno() as i64),
        }
    }) as c_int
}

/// Run one of the calls on part of an arena for C: 0 or a negative errno.
fn on_range(f: impl FnOnce(&Hps) -> crate::Result<()>) -> c_int {
    guarded(|| {
        let Some(h) = current() else { return -(libc::EINVAL as i64) };
        match f(&h) {
            Ok(()) => 0,
            Err(e) => -(e.errno() as i64),
        }
    }) as c_int
}

/// `[p, p+len)` of an arena is unmapped (munmap of part of it, `hps_unmap`); an arena of which
/// nothing is left is freed. Page aligned.
#[no_mangle]
pub extern "C" fn hps_unmap(p: *mut c_void, len: usize) -> c_int {
    on_range(|h| h.unmap(p as usize, len, false))
}

/// As `hps_unmap`, but the range stays mapped for the caller to map over it at once
/// (MAP_FIXED), so no other thread's mmap can take it in between (`hps_forget`).
#[no_mangle]
pub extern "C" fn hps_forget(p: *mut c_void, len: usize) -> c_int {
    on_range(|h| h.unmap(p as usize, len, true))
}

/// `[p, p+len)` of an arena leaves HPS with its data: plain private anonymous memory at the
/// same address from now on (`hps_detach`). Page aligned.
#[no_mangle]
pub extern "C" fn hps_detach(p: *mut c_void, len: usize) -> c_int {
    on_range(|h| h.detach(p as usize, len))
}

/// Hugepage-backed memory for hot objects, the compaction target (`hps_huge_alloc`).
#[no_mangle]
pub extern "C" fn hps_huge_alloc(len: usize) -> *mut c_void {
    guarded_alloc(|| ensure_instance()?.huge_alloc(len).map_err(|e| e.errno()))
}

/// Counters (`hps_stats`).
///
/// # Safety
/// `out` must point to a writable `struct hps_stats`.
#[no_mangle]
pub unsafe extern "C" fn hps_stats(out: *mut HpsStatsC) -> c_int {
    guarded(|| {
        let Some(h) = current() else { return -(libc::EINVAL as i64) };
        if out.is_null() {
            return -(libc::EINVAL as i64);
        }
        let s = h.stats();
        let c = HpsStatsC {
            periods: s.tracker.periods,
            armed_pages: s.tracker.armed_pages,
            faults: s.tracker.faults,
            promoted_regions: s.promoted_regions,
            compacted_pages: s.compacted_pages,
            notifications_sent: s.notifications_sent,
            notifications_received: s.notifications_received,
        };
        // SAFETY: the caller guarantees out is writable.
        unsafe { out.write(c) };
        0
    }) as c_int
}

/// The seed's page_acs report of this process's arenas into `buf` (NUL-terminated, truncated
/// to `n`); returns the full length (`hps_page_acs`).
///
/// # Safety
/// `buf` is NULL or writable for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn hps_page_acs(buf: *mut c_char, n: usize) -> i64 {
    guarded(|| {
        let Some(h) = current() else { return -(libc::EINVAL as i64) };
        let text = h.page_acs();
        if !buf.is_null() && n > 0 {
            let k = text.len().min(n - 1);
            // SAFETY: k + 1 <= n bytes are writable.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, k);
                buf.add(k).write(0);
            }
        }
        text.len() as i64
    })
}

#[cfg(test)]
mod preload_tests {
    use super::*;

    #[test]
    fn promote_only_never_compacts() {
        let rule = RegionRule::default();
        let dense = RegionView { total: 512, observed: 64, active: 32 };
        let sparse_full = RegionView { total: 512, observed: 512, active: 8 };
        let sparse_part = RegionView { total: 512, observed: 256, active: 8 };
        assert_eq!(promote_only(&dense, &rule), Decision::Promote);
        assert_eq!(crate::policy::decide(&sparse_full, &rule), Decision::Compact);
        assert_eq!(promote_only(&sparse_full, &rule), Decision::Observe);
        assert_eq!(promote_only(&sparse_part, &rule), Decision::Observe);
    }
}
