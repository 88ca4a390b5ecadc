//! `pagewise hps run` on unmodified programs (real processes): a C program working on the hot
//! part of a large malloc'd array prints the same checksum with and without HPS underneath,
//! and real memcached under `pagewise hps run` answers `get` after `set` correctly. Both check
//! that promotion really happened, by the kernel's own account (ShmemPmdMapped of the
//! program's /proc/PID/smaps_rollup: a 2 MiB region of the tracked memfd mapped by one PMD)
//! and by the shim's end-of-run report; the programs wait (bounded) for it instead of racing.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{compile, ensure_libpagewise, pagewise, tempdir};

/// Compile tests/run/NAME.c, run it with `direct_args`, then under `pagewise hps run
/// --min-alloc 1M` with `hps_args`: (direct output, output under HPS, its stderr), or None when
/// HPS cannot start on this machine (the skip is recorded).
fn direct_and_under_hps(name: &str, direct_args: &[&str], hps_args: &[&str]) -> Option<(Output, Output, String)> {
    direct_and_under_hps_with(name, &[], direct_args, hps_args)
}

/// As [`direct_and_under_hps`], with `flags` for `pagewise hps run` too.
fn direct_and_under_hps_with(
    name: &str,
    flags: &[&str],
    direct_args: &[&str],
    hps_args: &[&str],
) -> Option<(Output, Output, String)> {
    ensure_libpagewise();
    let scratch = tempdir(&format!("hps-{name}"));
    let dir = scratch.path();
    let prog = compile(name, dir);
    let direct = Command::new(&prog).args(direct_args).output().unwrap();
    assert!(direct.status.success(), "{name} on its own: {direct:?}");
    let flags: Vec<&str> = ["--min-alloc", "1M"].iter().chain(flags).copied().collect();
    let (run, err) = run_under_hps(&prog, &flags, hps_args)?;
    let _ = std::fs::remove_dir_all(dir);
    assert!(run.status.success(), "{name} under pagewise hps run: {:?}\n{err}", run.status);
    Some((direct, run, err))
}

/// `prog args` under `pagewise hps run flags`: its output and stderr, or None (after a skip)
/// when HPS cannot start here.
fn run_under_hps(prog: &std::path::Path, flags: &[&str], args: &[&str]) -> Option<(Output, String)> {
    let run = Command::new(pagewise())
        .args(["hps", "run"])
        .args(flags)
        .arg("--")
        .arg(prog)
        .args(args)
        .output()
        .expect("pagewise hps run");
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    if let Some(line) = arena_unavailable(&err) {
        pagewise_kernel::testing::skip(format!("HPS cannot start here: {line}"));
        return None;
    }
    Some((run, err))
}

/// The allocations the shim's end-of-run report says went to HPS's arenas.
fn routed_allocations(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("pagewise: ")?.split(" allocation(s) on hps memory").next()?.parse().ok())
        .unwrap_or_else(|| panic!("no routing report:\n{stderr}"))
}

fn arena_unavailable(stderr: &str) -> Option<&str> {
    stderr.lines().find(|l| l.contains("starting the hps arena failed"))
}

/// The shim's "N region(s) promoted" from its end-of-run report.
fn promoted(stderr: &str) -> Option<u64> {
    stderr.lines().find_map(|l| l.strip_prefix("pagewise: hps: ")?.split(" region(s) promoted").next()?.parse().ok())
}

/// The shim's "N region(s) moved into tracked memory" from its end-of-run report.
fn moved_in(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| {
            let (before, _) = l.strip_prefix("pagewise: hps: ")?.split_once(" region(s) moved into tracked memory")?;
            before.rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no late-routing report:\n{stderr}"))
}

fn shmem_pmd_kb(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("ShmemPmdMapped:")?.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or(0)
}

/// The hot_array program under `pagewise hps run FLAGS`: same checksum, a promoted region;
/// returns the CPUs the program could run on once it saw the hugepage.
fn hot_array_under_hps(flags: &[&str]) -> Option<String> {
    let (direct, run, err) = direct_and_under_hps_with("hot_array", flags, &["0"], &["60"])?;
    assert!(direct.stdout.starts_with(b"checksum "));
    assert_eq!(String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&direct.stdout), "{err}");
    assert!(err.contains("pagewise: 1 allocation(s) on hps memory"), "the array was not routed:\n{err}");
    let (pmd, cpus) = err
        .lines()
        .find_map(|l| {
            let (pmd, cpus) = l.strip_prefix("hot_array: ShmemPmdMapped ")?.split_once(" kB, CPUs ")?;
            Some((pmd.parse::<u64>().ok()?, cpus.to_string()))
        })
        .unwrap_or_else(|| panic!("no ShmemPmdMapped line:\n{err}"));
    assert!(pmd >= 2048, "no region of the array was promoted within 60 s:\n{err}");
    assert!(promoted(&err).unwrap_or(0) >= 1, "the shim reports no promotion:\n{err}");
    if !flags.contains(&"--late-routing") {
        // Young at first (late routing): promoted only once moved into tracked memory.
        assert!(moved_in(&err) >= 1, "nothing moved into tracked memory:\n{err}");
    }
    assert!(err.contains("the pace ramped with the program's age"), "hot_array never listens:\n{err}");
    Some(cpus)
}

/// A program that ends before its memory is a second old never gets tracked memory: the array
/// stays its own private memory, nothing moves in, and the result is the same.
#[test]
fn a_program_that_ends_young_keeps_private_memory() {
    let Some((direct, run, err)) = direct_and_under_hps("hot_array", &["0"], &["0"]) else { return };
    assert_eq!(run.stdout, direct.stdout, "{err}");
    assert!(err.contains("pagewise: 1 allocation(s) on hps memory"), "the array was not routed:\n{err}");
    assert_eq!(moved_in(&err), 0, "{err}");
    assert!(err.contains("1 arena(s) began as the program's private memory"), "{err}");
    // With late routing off the same array is tracked memory from the start, and tracked.
    let Some((_, run, err)) = direct_and_under_hps_with("hot_array", &["--late-routing", "off"], &["0"], &["0"]) else {
        return;
    };
    assert_eq!(run.stdout, direct.stdout, "{err}");
    assert!(err.contains("0 arena(s) began as the program's private memory"), "{err}");
}

/// listen(2) through the shim means what it means without it, and a program that listens is
/// a server to HPS: the pace's ramp ends (the end-of-run line says so).
#[test]
fn listen_keeps_its_meaning_and_makes_the_program_a_server() {
    let Some((direct, run, err)) = direct_and_under_hps("listen", &[], &[]) else { return };
    let out = String::from_utf8_lossy(&direct.stdout);
    assert!(out.contains("listen on a bound socket: 0\nconnect: 0\naccept: ok"), "{out}");
    assert!(out.contains("listen on -1: -1 Bad file descriptor"), "{out}");
    assert_eq!(String::from_utf8_lossy(&run.stdout), out, "{err}");
    assert!(err.contains("since the program began serving at"), "the shim's listen did not reach HPS:\n{err}");
}

/// Promotion: the array written in 4 KiB pages, its hot part collapsed.
#[test]
fn hot_array_gives_the_same_checksum_and_gets_hugepages() {
    hot_array_under_hps(&["--no-first-touch"]);
}

/// A collapse gives a region every page the program never touched: by default HPS promotes
/// only full regions, so the four the program fills get hugepages and the four it half fills,
/// as hot, do not (the report says promotions waited for them); with `--min-filled 0` they do.
#[test]
fn only_regions_the_program_filled_get_hugepages_unless_told_otherwise() {
    let pmd_of = |err: &str| -> u64 {
        err.lines()
            .find_map(|l| l.strip_prefix("half_filled: ShmemPmdMapped ")?.strip_suffix(" kB")?.parse().ok())
            .unwrap_or_else(|| panic!("no ShmemPmdMapped line:\n{err}"))
    };
    let waited = |err: &str| -> u64 {
        err.lines()
            .find_map(|l| {
                let part = l.split("; ").find(|p| p.ends_with(" promotion(s) waited for a region to fill"))?;
                part.split(' ').next()?.parse().ok()
            })
            .unwrap_or_else(|| panic!("no count of promotions waiting for a fill:\n{err}"))
    };
    // The full regions' 8 MiB within 60 s, then 3 s more in which the half-filled stay small.
    let Some((direct, run, err)) =
        direct_and_under_hps_with("half_filled", &[], &["0", "0", "0"], &["60", "8192", "3"])
    else {
        return;
    };
    assert_eq!(run.stdout, direct.stdout, "{err}");
    assert_eq!(pmd_of(&err), 8192, "not exactly the four full regions promoted:\n{err}");
    assert!(waited(&err) >= 1, "the half-filled regions were never found hot:\n{err}");
    let Some((_, run, err)) =
        direct_and_under_hps_with("half_filled", &["--min-filled", "0"], &["0", "0", "0"], &["60", "16384", "0"])
    else {
        return;
    };
    assert_eq!(run.stdout, direct.stdout, "{err}");
    assert_eq!(pmd_of(&err), 16384, "with --min-filled 0 every hot region is promoted:\n{err}");
    assert_eq!(waited(&err), 0, "{err}");
}

/// First-touch hugepages: hot_array writes its 64 MiB front to back, so the regions ahead of
/// the fill are advised and get their hugepages when first written (the kernel's count), and
/// the checksum is the plain run's.
#[test]
fn a_dense_fill_gets_hugepages_at_first_touch() {
    let Some((advised, _, pmd, err)) = dense_fill_under_hps("always") else { return };
    assert!(advised >= 8, "only {advised} of the 32 regions advised:\n{err}");
    assert!(pmd >= 8 * 2048, "{pmd} kB PMD-mapped:\n{err}");
}

/// Priced first touch (the default): the fill is followed whatever hugepages cost here, each
/// window given or declined by the price measured, and the checksum is the plain run's.
#[test]
fn a_priced_first_touch_gives_or_declines_every_window() {
    let Some((advised, declined, _, err)) = dense_fill_under_hps("auto") else { return };
    assert!(advised + declined >= 8, "the fill was not followed: {advised} advised, {declined} declined:\n{err}");
}

/// hot_array under `pagewise hps run --first-touch WHEN`, checked against its plain run: the
/// regions advised and declined ahead of its fill, and its ShmemPmdMapped kB.
fn dense_fill_under_hps(when: &str) -> Option<(u64, u64, u64, String)> {
    let (direct, run, err) = direct_and_under_hps_with("hot_array", &["--first-touch", when], &["0"], &["60"])?;
    assert_eq!(String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&direct.stdout), "{err}");
    let (advised, declined) = err
        .lines()
        .find_map(|l| {
            let part = l.split("; ").find(|p| p.contains(" region(s) advised ahead of a dense fill, "))?;
            let (advised, declined) = part.split_once(" region(s) advised ahead of a dense fill, ")?;
            let declined = declined.strip_suffix(" declined (hugepages dear)")?;
            Some((advised.rsplit(' ').next()?.parse().ok()?, declined.parse().ok()?))
        })
        .unwrap_or_else(|| panic!("no first-touch count in the report:\n{err}"));
    let pmd: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("hot_array: ShmemPmdMapped ")?.split_once(" kB")?.0.parse().ok())
        .unwrap_or_else(|| panic!("no ShmemPmdMapped line:\n{err}"));
    Some((advised, declined, pmd, err))
}

/// The tracker's handler keeps the program's one thread company: pinned together to one CPU
/// while it tracks (the program saw a one-CPU mask), not with `--no-colocate` (the program
/// kept this test's mask).
#[test]
fn the_tracker_handler_pins_a_one_thread_program_unless_told_not_to() {
    let mine = pagewise_kernel::cpu::affinity(0).unwrap();
    if mine.len() < 2 {
        pagewise_kernel::testing::skip("co-location needs two CPUs in this test's mask");
        return;
    }
    let Some(pinned) = hot_array_under_hps(&["--no-first-touch"]) else { return };
    let pinned = pagewise_kernel::cpu::parse_cpulist(&pinned).unwrap();
    assert_eq!(pinned.len(), 1, "pinned to one CPU: {pinned:?}");
    assert!(pinned.is_subset(&mine), "{pinned:?} within {mine:?}");
    let Some(free) = hot_array_under_hps(&["--no-colocate", "--no-first-touch"]) else { return };
    assert_eq!(pagewise_kernel::cpu::parse_cpulist(&free).unwrap(), mine, "--no-colocate leaves the mask alone");
}

/// Tracking stops once placement converged and comes back when the hot set moves: the program
/// sees its first hot set promoted and the published state turn to "converged", then a second
/// hot set on memory it never touched gets promoted too (found by a probe), and the shim's log
/// shows the stop before the restart.
#[test]
fn tracking_stops_when_converged_and_restarts_when_the_hot_set_moves() {
    let Some(err) = drift_under(&["--first-touch", "never"], true) else { return };
    let stop = err.find("pagewise: hps: tracking stopped").unwrap_or_else(|| panic!("no stop logged:\n{err}"));
    let restart = err.find("pagewise: hps: tracking restarted").unwrap_or_else(|| panic!("no restart logged:\n{err}"));
    assert!(stop < restart, "{err}");
    assert!(err.contains("restarted 1 time(s)") || err.contains("restarted 2 time(s)"), "{err}");
}

/// The same with hugepages at first touch ahead of the program's fill: each hot region ends up
/// PMD-mapped, whether its first touch got a hugepage or not. (Tracking need not restart: the
/// second hot set may lie in regions advised ahead of the first fill.) Once, an advised region
/// could stay out of tracking for good: filled in small pages (the advice came as the program
/// wrote it), or a hugepage mapped by 512 PTEs (a page table was there before the advice);
/// and an un-advised one could not be collapsed (MADV_NOHUGEPAGE). Under `auto` that left a
/// hot region of four on small pages in most runs on a VM whose host takes memory back.
#[test]
fn with_first_touch_hugepages_every_hot_region_ends_up_huge() {
    drift_under(&["--first-touch", "always"], false);
    drift_under(&["--first-touch", "auto"], false);
}

/// The drift program under `pagewise hps run FLAGS`: both hot sets promoted, tracking stopped
/// in between (and, if `restart`, seen again before the second hot set counts as promoted).
/// Returns the run's stderr; None if HPS cannot start here (a skip).
fn drift_under(flags: &[&str], restart: bool) -> Option<String> {
    let args = ["60", if restart { "1" } else { "0" }];
    let (_, run, err) = direct_and_under_hps_with("drift", flags, &["0"], &args)?;
    let out = String::from_utf8_lossy(&run.stdout);
    let nums: Vec<i64> = out
        .strip_prefix("drift: ")
        .unwrap_or_else(|| panic!("no drift line: {out}\n{flags:?}\n{err}"))
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let [p1, conv, p2] = nums[..] else { panic!("bad drift line: {out} ({flags:?})") };
    assert!(p1 >= 8192, "the first hot set was not promoted within 60 s: {out}\n{flags:?}\n{err}");
    assert_eq!(conv, 1, "tracking did not stop after the first hot set was promoted: {out}\n{flags:?}\n{err}");
    assert!(p2 >= p1 + 8192, "the moved hot set was not promoted within 60 s: {out}\n{flags:?}\n{err}");
    Some(err)
}

#[test]
fn bad_flags_are_refused() {
    for flags in [
        &["--min-alloc", "1K"][..],
        &["--promote-fraction", "1.5"],
        &["--min-filled", "-0.1"],
        &["--min-filled", "2"],
        &["--min-alloc", "lots"],
        &["--pace", "0"],
        &["--pace", "2"],
        &["--pace-ramp", "-1"],
        &["--pace-ramp", "1e9"],
        &["--first-touch", "sometimes"],
        &["--first-touch", "never", "--no-first-touch"],
    ] {
        let out = Command::new(pagewise()).args(["hps", "run"]).args(flags).args(["--", "true"]).output().unwrap();
        assert!(!out.status.success(), "{flags:?} accepted");
        assert!(!out.stderr.is_empty());
    }
}

/// memcached under `pagewise hps run`, killed (SIGKILL) on drop whatever happens.
struct Server {
    wrapper: Child,
    memcached: Option<u32>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(pid) = self.memcached {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            // pagewise hps run reaps it and exits.
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until && matches!(self.wrapper.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.wrapper.kill();
        let _ = self.wrapper.wait();
    }
}

fn child_of(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?.split_whitespace().next()?.parse().ok()
}

fn connect(port: u16, deadline: Instant) -> TcpStream {
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
                return s;
            }
            Err(e) if Instant::now() > deadline => panic!("memcached did not listen on port {port}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn value_of(i: usize) -> Vec<u8> {
    (0..1000).map(|j| b'a' + ((i * 7 + j) % 26) as u8).collect()
}

/// `get` of keys `lo..hi`, pipelined; checks every value.
fn get_all(r: &mut BufReader<TcpStream>, lo: usize, hi: usize) {
    let mut req = String::new();
    for i in lo..hi {
        req.push_str(&format!("get k{i}\r\n"));
    }
    r.get_mut().write_all(req.as_bytes()).unwrap();
    for i in lo..hi {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, format!("VALUE k{i} 0 1000\r\n"));
        let mut buf = vec![0u8; 1002];
        r.read_exact(&mut buf).unwrap();
        assert_eq!(&buf[..1000], &value_of(i)[..], "value of k{i}");
        line.clear();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, "END\r\n");
    }
}

#[test]
fn memcached_answers_get_after_set_and_gets_hugepages() {
    if Command::new("memcached").arg("-V").output().is_err() {
        pagewise_kernel::testing::skip("memcached is not installed (make deps)");
        return;
    }
    ensure_libpagewise();
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let wrapper = Command::new(pagewise())
        .args([
            "hps",
            "run",
            "--min-alloc",
            "1M",
            "--",
            "memcached",
            "-U",
            "0",
            "-l",
            "127.0.0.1",
            "-t",
            "2",
            "-m",
            "64",
        ])
        // memcached refuses to run as root without -u (ignored when not root).
        .args(["-u", "root"])
        .args(["-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pagewise hps run memcached");
    let mut server = Server { wrapper, memcached: None };
    let deadline = Instant::now() + Duration::from_secs(20);
    let stream = loop {
        if let Some(st) = server.wrapper.try_wait().unwrap() {
            let mut err = String::new();
            server.wrapper.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            panic!("memcached under pagewise hps run ended before listening ({st}):\n{err}");
        }
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
        if Instant::now() > deadline {
            break connect(port, deadline);
        }
    };
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let mc = child_of(server.wrapper.id()).expect("memcached is not a child of pagewise hps run");
    server.memcached = Some(mc);
    let mut r = BufReader::new(stream);

    r.get_mut().write_all(b"set greeting 5 0 5\r\nhello\r\n").unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "STORED\r\n");
    r.get_mut().write_all(b"get greeting\r\n").unwrap();
    let mut reply = [0u8; 32];
    r.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[..], b"VALUE greeting 5 5\r\nhello\r\nEND\r\n");

    // 3000 items of 1000 bytes: about 3 MiB of slab pages (1 MiB mallocs, in tracked memory).
    const N: usize = 3000;
    let mut req = Vec::new();
    for i in 0..N {
        req.extend_from_slice(format!("set k{i} 0 0 1000 noreply\r\n").as_bytes());
        req.extend_from_slice(&value_of(i));
        req.extend_from_slice(b"\r\n");
    }
    r.get_mut().write_all(&req).unwrap();
    // Read them all until a slab region is PMD-mapped (bounded: 60 s).
    let until = Instant::now() + Duration::from_secs(60);
    let mut pmd = 0;
    while pmd == 0 && Instant::now() < until {
        get_all(&mut r, 0, N);
        pmd = shmem_pmd_kb(mc);
    }
    // Still correct after promotion.
    get_all(&mut r, 0, N);
    r.get_mut().write_all(b"get greeting\r\n").unwrap();
    r.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[..], b"VALUE greeting 5 5\r\nhello\r\nEND\r\n");

    // A graceful stop, so the shim prints its report.
    let _ = Command::new("kill").args(["-TERM", &mc.to_string()]).status();
    let stop = Instant::now() + Duration::from_secs(10);
    while Instant::now() < stop && server.wrapper.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = server.wrapper.try_wait().unwrap();
    assert!(st.is_some(), "memcached did not stop within 10 s of SIGTERM");
    server.memcached = None;
    let mut err = String::new();
    server.wrapper.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    eprintln!("{err}");
    if let Some(line) = arena_unavailable(&err) {
        pagewise_kernel::testing::skip(format!("HPS cannot start here: {line}"));
        return;
    }
    assert!(pmd >= 2048, "no slab region of memcached was promoted within 60 s\n{err}");
    assert!(err.contains("allocation(s) on hps memory"), "no slab page was routed:\n{err}");
    assert!(promoted(&err).unwrap_or(0) >= 1, "the shim reports no promotion:\n{err}");
    assert!(err.contains("since the program began serving at"), "memcached's listen(2) did not reach HPS:\n{err}");
}

#[test]
fn fork_and_exec_leave_parent_and_child_correct() {
    let Some((direct, run, err)) = direct_and_under_hps("forkexec", &[], &[]) else { return };
    assert!(!direct.stdout.is_empty());
    assert_eq!(String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&direct.stdout), "{err}");
    assert!(err.contains("allocation(s) on hps memory"), "nothing was routed:\n{err}");
}

/// With a threshold below what the runtime's own threads allocate (HPS's tracker lists a
/// directory with a 32 KiB buffer), only the program's allocations are routed: a tracker
/// thread given arena memory would fault on memory it serves itself and wait forever.
#[test]
fn the_runtimes_own_threads_never_get_arena_memory() {
    ensure_libpagewise();
    let scratch = tempdir("hps-three-blocks");
    let prog = compile("three_blocks", scratch.path());
    let direct = Command::new(&prog).output().unwrap();
    let Some((run, err)) = run_under_hps(&prog, &["--min-alloc", "16K"], &[]) else { return };
    assert!(run.status.success(), "{:?}\n{err}", run.status);
    assert_eq!(String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&direct.stdout), "{err}");
    assert_eq!(routed_allocations(&err), 3, "the program made 3 allocations of 16 KiB or more:\n{err}");
}

#[test]
fn a_forked_child_sees_its_parents_memory_and_each_keeps_its_own_writes() {
    let Some((direct, run, err)) = direct_and_under_hps("forkread", &[], &[]) else { return };
    assert_eq!(String::from_utf8_lossy(&direct.stdout), "child errors 0\nparent errors 0, child exit 0\n");
    assert_eq!(String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&direct.stdout), "{err}");
    assert_eq!(routed_allocations(&err), 2, "the malloc'd and the mmap'd memory were not routed:\n{err}");
}

/// The child's copy is made before its allocator's fork handler, registered before the
/// shim's, writes the allocator's state: the write stays the child's, never the parent's
/// tracked memory (a memfd, `--late-routing off`) still shared with it.
#[test]
fn a_forked_child_has_its_copy_before_its_allocators_fork_handler_runs() {
    let Some((direct, run, err)) = direct_and_under_hps_with("forkfirst", &["--late-routing", "off"], &[], &[]) else {
        return;
    };
    assert_eq!(String::from_utf8_lossy(&direct.stdout), "child errors 0\nparent errors 0, child exit 0\n");
    assert_eq!(String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&direct.stdout), "{err}");
    assert_eq!(routed_allocations(&err), 1, "the allocator's state was not routed:\n{err}");
}

/// A forked child holds about what its parent wrote of a large block: holes are not copied.
#[test]
fn a_forked_child_gets_no_copy_of_never_written_memory() {
    let Some((direct, run, err)) = direct_and_under_hps("forkholes", &[], &[]) else { return };
    assert_eq!(String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&direct.stdout), "{err}");
    assert!(String::from_utf8_lossy(&direct.stdout).contains("holds little"));
}

/// `--on-fork none`: no copy; the child's routed ranges are gone (never its parent's memory,
/// shared), so the child faults where it reads them, and the parent is unharmed.
#[test]
fn with_no_copy_on_fork_a_child_reading_its_parents_memory_faults_and_the_parent_is_unharmed() {
    ensure_libpagewise();
    let scratch = tempdir("hps-forkread-none");
    let prog = compile("forkread", scratch.path());
    let Some((run, err)) = run_under_hps(&prog, &["--min-alloc", "1M", "--on-fork", "none"], &[]) else { return };
    assert_eq!(String::from_utf8_lossy(&run.stdout), "parent errors 0, child signal 11\n", "{err}");
    assert_eq!(routed_allocations(&err), 2, "the malloc'd and the mmap'd memory were not routed:\n{err}");
}

#[test]
fn packed_blocks_freed_and_reallocated_keep_their_content() {
    let Some((direct, run, err)) = direct_and_under_hps("pieces", &[], &[]) else { return };
    assert!(String::from_utf8_lossy(&direct.stdout).ends_with(" errors 0\n"));
    assert_eq!(String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&direct.stdout), "{err}");
    assert!(routed_allocations(&err) >= 3 * 96, "the blocks were not routed:\n{err}");
}
