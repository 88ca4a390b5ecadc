//! `pagewise run` on unmodified C programs (tests/run/*.c): each gives the same output with
//! and without DLM underneath, with a local limit well below its data so pages really travel
//! to and from a memory server — a matrix multiply and a stencil on malloc'd arrays, a large
//! static array under --bss, fork + exec, fork without exec, threads, read(2)/fread into DLM memory, and
//! reservations unmapped, moved from and committed as the kernel keeps their mappings. Also:
//! a program that closes every descriptor keeps its memory, the runtime maps no library but
//! its own, and
//! unreachable servers are reported before the program starts, a program with no eligible
//! allocation runs normally with a warning, the tuner's decisions are the started
//! program's even when a process it started ends later, and the private directory of a run
//! killed with its program is removed by the next run.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{compile, ensure_libpagewise, pagewise, tempdir};

fn under_run(flags: &[&str], prog: &Path, args: &[&str]) -> Output {
    Command::new(pagewise()).arg("run").args(flags).arg("--").arg(prog).args(args).output().expect("pagewise run")
}

/// Run `name` directly and under `pagewise run`; the outputs must match and the run must
/// really have used DLM memory.
fn same_output(name: &str, flags: &[&str], args: impl Fn(&Path) -> Vec<String>) {
    ensure_libpagewise();
    let scratch = tempdir(name);
    let dir = scratch.path();
    let prog = compile(name, dir);
    let a = args(&dir.join("direct"));
    let direct = Command::new(&prog).args(&a).output().unwrap();
    assert!(direct.status.success(), "{name} failed on its own: {direct:?}");
    let mut all = vec!["--local-mem", "1M", "--min-alloc", "256K"];
    all.extend_from_slice(flags);
    let a = args(&dir.join("run"));
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let run = under_run(&all, &prog, &a);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{name} under pagewise run: {:?}\n{err}", run.status);
    assert_eq!(String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&direct.stdout), "{name}: {err}");
    assert!(!direct.stdout.is_empty());
    let routed = err
        .lines()
        .find_map(|l| l.strip_prefix("pagewise: ")?.split(" allocation(s) on dlm memory").next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{name}: no routing report in\n{err}"));
    assert!(routed >= 1, "{name}: nothing ran on DLM memory\n{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn matrix_multiply_gives_the_same_result() {
    same_output("matmul", &[], |_| vec![]);
}

#[test]
fn stencil_gives_the_same_result_at_a_fixed_and_an_auto_page_size() {
    same_output("stencil", &["--page-size", "32K"], |_| vec![]);
    same_output("stencil", &["--page-size", "auto"], |_| vec![]);
}

#[test]
fn stores_from_signal_handlers_during_faults_survive_eviction() {
    same_output("sigstore", &["--page-size", "128K"], |_| vec![]);
}

/// A signal delivered to a thread while it is inside a call into the runtime (here each
/// MADV_DONTNEED of its signal stack), whose frame lands on routed memory that is not there
/// (the signal stack just discarded; Go keeps each thread's on its heap and preempts with
/// SIGURG), once faulted to a fault handler waiting on a lock that very call held: the run hung
/// (6 of 6 tries; a cgo program hung so now and then). The shim now holds a thread's
/// asynchronous signals until its call into the runtime returns.
#[test]
fn signals_on_a_signal_stack_in_routed_memory_never_hang_the_run() {
    let (output, runs) = same_output_under_both("altstack", "1M");
    assert_eq!(output, "ok\n");
    for Wrapped { wrapper, arena, err } in runs {
        assert!(err.contains(&format!("1 allocation(s) on {arena} memory")), "{wrapper:?}: not routed:\n{err}");
    }
}

#[test]
fn static_array_under_bss_gives_the_same_result() {
    same_output("bss", &["--bss"], |_| vec![]);
}

#[test]
fn reservations_are_kept_as_the_kernel_keeps_their_mappings() {
    same_output("reserved", &[], |_| vec![]);
}

#[test]
fn fork_and_exec_leave_parent_and_child_correct() {
    same_output("forkexec", &[], |_| vec![]);
}

/// A child made by fork (no exec) reads its parent's memory, most of it on the server (1 MiB
/// of local memory for 48 MiB), as it was at the fork, and each side keeps its own writes: the
/// parent streams the routed ranges to the child (preload/fork.c). Before, the child died of
/// SIGSEGV.
#[test]
fn a_forked_child_sees_its_parents_memory_and_each_keeps_its_own_writes() {
    same_output("forkread", &[], |_| vec![]);
}

/// A child made by fork gets its copy of its parent's memory before its allocator's fork
/// handler, registered before the shim's, touches the allocator's state there (jemalloc's
/// does: rustc's fork to run its linker). Before, that child died of SIGSEGV.
#[test]
fn a_forked_child_has_its_copy_before_its_allocators_fork_handler_runs() {
    same_output("forkfirst", &[], |_| vec![]);
}

/// A child made by fork holds about what its parent wrote of a large block, not the block:
/// the pages the runtime knows read as zeros are neither fetched nor sent (`dlm_holds_data`).
#[test]
fn a_forked_child_gets_no_copy_of_never_written_memory() {
    same_output("forkholes", &[], |_| vec![]);
}

/// `--on-fork none`: fork + exec as plain (`forkexec`); a child that reads its parent's DLM
/// memory faults, and the parent is unharmed.
#[test]
fn with_no_copy_on_fork_exec_works_and_a_child_reading_its_parents_memory_faults() {
    same_output("forkexec", &["--on-fork", "none"], |_| vec![]);
    ensure_libpagewise();
    let scratch = tempdir("forkread-none");
    let prog = compile("forkread", scratch.path());
    let run = under_run(&["--local-mem", "1M", "--min-alloc", "256K", "--on-fork", "none"], &prog, &[]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(String::from_utf8_lossy(&run.stdout), "parent errors 0, child signal 11\n", "{err}");
}

#[test]
fn threads_give_the_same_result() {
    same_output("threads", &["--spawn-servers", "2"], |_| vec![]);
}

#[test]
fn read_and_fread_into_dlm_memory_get_the_file() {
    same_output("readfile", &[], |d| vec![d.to_string_lossy().into_owned()]);
}

#[test]
fn the_decisions_are_the_started_programs_though_a_process_it_started_ends_later() {
    ensure_libpagewise();
    let scratch = tempdir("outlived");
    let prog = compile("outlived", scratch.path());
    let file = scratch.path().join("decisions.json");
    let file_arg = file.display().to_string();
    let run = Command::new(pagewise())
        .args(["run", "--local-mem", "1M", "--min-alloc", "256K", "--page-size", "auto", "--decisions", &file_arg])
        .arg("--")
        .arg(&prog)
        // Short windows: the tuner decides many times within the program's run.
        .env("PAGEWISE_DLM_TUNE_WINDOW_MS", "5")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{:?}\n{err}", run.status);
    // The program's `sleep 1 &` (the shim loaded in it too) ends after the run: once it has,
    // the file still holds the program's decisions.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let n = json["decisions"].as_array().map_or(0, Vec::len);
    assert!(n >= 2, "{n} decision(s) in {json}\n{err}");
}

/// A wrapper that execs the program in its place (pyenv's `python3` script, `env`, `nice`)
/// passes the report on: the program it became reports at its exit, as the one started.
/// Before, nothing was reported (the wrapper, which the shim told to report, never exits).
#[test]
fn a_program_execd_in_the_started_ones_place_reports() {
    ensure_libpagewise();
    let scratch = tempdir("exec-report");
    let prog = compile("three_blocks", scratch.path());
    let direct = Command::new(&prog).output().unwrap();
    let run = under_run(
        &["--local-mem", "1M", "--min-alloc", "16K"],
        Path::new("/bin/sh"),
        &["-c", &format!("exec {}", prog.display())],
    );
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{:?}\n{err}", run.status);
    assert_eq!(run.stdout, direct.stdout, "{err}");
    assert!(err.contains("pagewise: 3 allocation(s) on dlm memory"), "{err}");
    assert_eq!(err.matches("pagewise: dlm: ").count(), 1, "{err}");
}

/// bash brings its own getenv and setenv, which keep its shell variables, and the shim's and
/// libpagewise's getenv is then bash's. The shim once set its report mark with setenv before
/// bash's main: that made bash's variable table early, bash's getenv answered from it alone,
/// and the runtime found none of its settings ("PAGEWISE_DLM_SERVERS is not set": bash itself
/// ran with nothing routed).
#[test]
fn a_shell_with_its_own_getenv_gets_its_memory_routed() {
    ensure_libpagewise();
    let script = r#"x=$(seq 1 200000 | tr "\n" " "); echo ${#x}"#;
    let run = under_run(&["--local-mem", "1M", "--min-alloc", "16K"], Path::new("/bin/bash"), &["-c", script]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!err.contains("nothing is routed"), "{err}");
    assert_bash_counted_and_routed(&run);
}

/// A bash script that prints the length of `seq 1 200000` joined by spaces ran right under
/// `pagewise run`, with memory routed.
fn assert_bash_counted_and_routed(run: &Output) {
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{:?}\n{err}", run.status);
    assert_eq!(String::from_utf8_lossy(&run.stdout), "1288895\n", "{err}");
    let routed = err
        .lines()
        .find_map(|l| l.strip_prefix("pagewise: ")?.split(" allocation(s) on dlm memory").next()?.parse::<u64>().ok());
    assert!(routed.is_some_and(|n| n > 0), "bash routed nothing:\n{err}");
}

/// A program places its own descriptors by number (bash's `exec N>file` is dup2 onto N, which
/// closes what was there). The runtime's userfaultfd and server connections once held the
/// lowest numbers after the program's, 3 to 9 here: bash redirecting 3 to 9 replaced them,
/// every routed range was unregistered with the userfaultfd, and the run died (SIGABRT,
/// "reading the userfaultfd failed"). They live far above now, and bash's memory comes back
/// right.
#[test]
fn a_program_placing_descriptors_by_number_keeps_its_memory_routed() {
    ensure_libpagewise();
    // Routed memory first (the runtime starts with the first routed allocation), then 3 to 9
    // redirected, then the same work twice more, compared.
    let script = r#"x=$(seq 1 100000 | tr "\n" " ")
exec 3>/dev/null 4>/dev/null 5>/dev/null 6>/dev/null 7>/dev/null 8>/dev/null 9>/dev/null
x=$(seq 1 200000 | tr "\n" " "); y=$(seq 1 200000 | tr "\n" " "); [ "$x" = "$y" ] && echo ${#x}"#;
    let run = under_run(&["--local-mem", "1M", "--min-alloc", "16K"], Path::new("/bin/bash"), &["-c", script]);
    // The report is checked too: it once went into the script's file on 3.
    assert_bash_counted_and_routed(&run);
}

/// A daemon closes every descriptor it did not open (close_range, closefrom, close on what
/// /proc/self/fd lists) while its memory is in use. That once closed the runtime's too: the
/// run died of SIGABRT ("reading the userfaultfd failed: Bad file descriptor") under
/// `pagewise run`, and the end-of-run report was lost under both. Now the runtime's
/// descriptors are outside the program's reach (close and dup2 onto them: EBADF), its memory
/// comes back right under both, the report is there, and a forked child holds none of them.
#[test]
fn a_program_closing_every_descriptor_keeps_its_memory_and_the_report() {
    let (expected, runs) = same_output_under_both("close_all", "8M");
    assert!(expected.contains("within reach after closing all: 0") && expected.contains("child: 0"), "{expected}");
    for Wrapped { wrapper, arena, err } in runs {
        assert!(err.contains(&format!("2 allocation(s) on {arena} memory")), "{wrapper:?}: no report:\n{err}");
        assert!(!err.contains("without running its exit handlers"), "{wrapper:?}: {err}");
    }
}

/// A program that leaves by the exit_group system call itself (Go programs do) runs no exit
/// handler, so the shim's end-of-run report never comes: `pagewise run` and `pagewise hps run`
/// say so instead of ending in silence.
#[test]
fn a_program_leaving_without_its_exit_handlers_is_told_apart() {
    for Wrapped { wrapper, err, .. } in same_output_under_both("exit_group", "4M").1 {
        assert!(err.contains("ended without running its exit handlers"), "{wrapper:?}: nothing said:\n{err}");
        assert!(!err.contains("allocation(s) on"), "{wrapper:?}: a report after all:\n{err}");
    }
}

/// Another process copying to and from the program's memory with process_vm_readv/writev
/// (Open MPI's shared-memory transport between ranks on one host) pins the pages it copies,
/// and the kernel will not move a pinned page: the runtime keeps such pages rather than stop
/// the program (`pinned.rs` in crates/dlm). Before, `pagewise run` died with "moving … to the
/// shadow failed: ioctl(UFFDIO_MOVE) failed: Device or resource busy" in 3 runs of 3.
#[test]
fn pages_another_process_copies_keep_their_data_and_the_run_goes_on() {
    for Wrapped { wrapper, arena, err } in same_output_under_both("cma", "4M").1 {
        assert!(err.contains(&format!("2 allocation(s) on {arena} memory")), "{wrapper:?}: no report:\n{err}");
    }
}

/// A program whose work is done by processes it starts (mpirun's ranks): each runs with a
/// runtime of its own, and the report says what they put on the arena in one line, where it
/// used to warn that nothing ran there.
#[test]
fn what_the_processes_a_program_starts_put_on_the_arena_is_reported() {
    for Wrapped { wrapper, arena, err } in same_output_under_both("starts_worker", "4M").1 {
        let line = format!(
            "pagewise: 2 processes the program started ran on {arena} memory too, each with its own runtime and its \
             own limits: 4 allocation(s) (32 MiB over their runs, at most 8 MiB at once in one), 0 refused"
        );
        assert!(err.contains(&line), "{wrapper:?}: not reported:\n{err}");
        assert!(!err.contains("warning: the program made no allocation"), "{wrapper:?}: {err}");
    }
}

/// A pre-fork server (PostgreSQL's backends do its work): a forked child routes nothing of its
/// own, and the report says what the children kept in local memory, where the program's own
/// line alone made it look as if the work had run on the arena.
#[test]
fn what_forked_workers_keep_in_local_memory_is_reported() {
    for Wrapped { wrapper, arena, err } in same_output_under_both("forks_workers", "4M").1 {
        assert!(err.contains(&format!("1 allocation(s) on {arena} memory")), "{wrapper:?}: no report:\n{err}");
        let line = format!(
            "pagewise: 2 processes the program forked kept 8 allocation(s) of at least 1048576 bytes (16 MiB over \
             their runs) in local memory, not on {arena} memory"
        );
        assert!(err.contains(&line), "{wrapper:?}: not reported:\n{err}");
    }
}

/// A program that writes its process title over its environment (redis-server, nginx,
/// PostgreSQL) still gets its report, and the line for the worker it starts: the shim keeps
/// copies of what it read there. With pointers into the environment, `pagewise run` said
/// redis-server had left without its exit handlers, and a worker's counts went to a file named
/// by its pid in /.
#[test]
fn a_program_writing_over_its_environment_keeps_its_report() {
    for Wrapped { wrapper, arena, err } in same_output_under_both("proctitle", "4M").1 {
        assert!(err.contains(&format!("1 allocation(s) on {arena} memory")), "{wrapper:?}: no report:\n{err}");
        assert!(
            err.contains(&format!("1 process the program started ran on {arena} memory too")),
            "{wrapper:?}: {err}"
        );
        assert!(!err.contains("without running its exit handlers"), "{wrapper:?}: {err}");
    }
}

/// The libraries a process maps under each wrapper are its own, the shim, libpagewise.so and
/// the unwinder Rust's panics need (libgcc_s): nothing more, since every process the program
/// starts pays for each in memory and start-up time. libm once came in for two calls.
#[test]
fn the_runtime_brings_no_library_but_its_own() {
    ensure_libpagewise();
    let libraries = |wrapper: &[&str]| -> std::collections::BTreeSet<String> {
        let mut cmd = match wrapper {
            [] => Command::new("/bin/cat"),
            _ => {
                let mut c = Command::new(pagewise());
                c.args(wrapper).args(["--", "/bin/cat"]);
                c
            }
        };
        let out = cmd.arg("/proc/self/maps").output().unwrap();
        assert!(out.status.success(), "{wrapper:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter(|path| path.contains(".so"))
            .map(|path| path.rsplit('/').next().unwrap().to_string())
            .collect()
    };
    let own = libraries(&[]);
    assert!(own.iter().any(|l| l.starts_with("libc.so")), "{own:?}");
    let extra = ["libpagewise_preload.so", "libpagewise.so", "libgcc_s.so.1"];
    for (wrapper, _) in both_wrappers("4M") {
        let mapped = libraries(&wrapper);
        let more: Vec<&String> = mapped.iter().filter(|l| !own.contains(*l) && !extra.contains(&l.as_str())).collect();
        assert!(more.is_empty(), "{wrapper:?} maps {more:?} beyond cat's own {own:?}");
        assert!(mapped.contains("libpagewise.so"), "{wrapper:?}: no runtime in {mapped:?}");
    }
}

/// What a program printed on its own, and what each wrapper printed on stderr (`wrapper`, the
/// arena its report names, `err`).
struct Wrapped {
    wrapper: Vec<&'static str>,
    arena: &'static str,
    err: String,
}

/// tests/run/NAME.c run on its own and then under both wrappers (`both_wrappers(local_mem)`):
/// every run succeeds with the same output. Returns that output and each wrapper's stderr, for
/// the test's checks of what the run said.
fn same_output_under_both(name: &str, local_mem: &'static str) -> (String, Vec<Wrapped>) {
    let (_scratch, prog, direct) = built_and_run_alone(name);
    let runs = both_wrappers(local_mem)
        .into_iter()
        .map(|(wrapper, arena)| {
            let (run, err) = under_wrapper(&wrapper, &prog);
            assert!(run.status.success(), "{name} under {wrapper:?}: {:?}\n{err}", run.status);
            assert_eq!(run.stdout, direct.stdout, "{name} under {wrapper:?}: {err}");
            Wrapped { wrapper, arena, err }
        })
        .collect();
    (String::from_utf8_lossy(&direct.stdout).into_owned(), runs)
}

/// tests/run/NAME.c built, and run on its own, which must succeed: its scratch directory (kept
/// while the test runs), the program and that run's output.
fn built_and_run_alone(name: &str) -> (pagewise_kernel::private_dir::PrivateDir, std::path::PathBuf, Output) {
    ensure_libpagewise();
    let scratch = tempdir(name);
    let prog = compile(name, scratch.path());
    let direct = Command::new(&prog).output().unwrap();
    assert!(direct.status.success(), "{name} on its own: {direct:?}");
    (scratch, prog, direct)
}

/// The two wrappers a program runs under unmodified, each with the arena its report names:
/// `pagewise run` on one spawned server with `local_mem` of local memory, and `pagewise hps run`;
/// both route allocations of 1 MiB and more.
fn both_wrappers(local_mem: &'static str) -> [(Vec<&'static str>, &'static str); 2] {
    [
        (vec!["run", "--spawn-servers", "1", "--local-mem", local_mem, "--min-alloc", "1M"], "dlm"),
        (vec!["hps", "run", "--min-alloc", "1M"], "hps"),
    ]
}

/// `prog` under `wrapper`: its output and stderr. A run still going after 60 s (these programs
/// take at most seconds) is killed and fails the test, rather than hanging it.
fn under_wrapper(wrapper: &[&str], prog: &Path) -> (Output, String) {
    let mut child = Command::new(pagewise())
        .args(wrapper)
        .arg("--")
        .arg(prog)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{wrapper:?}: still running after 60 s:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, err)
}

#[test]
fn unreachable_servers_are_reported_before_the_program_starts() {
    ensure_libpagewise();
    // Port 1 on loopback: nothing listens there.
    let out = under_run(&["--servers", "127.0.0.1:1"], Path::new("/bin/echo"), &["started"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("127.0.0.1:1") && err.contains("unreachable"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("started"));
}

#[test]
fn a_program_without_large_allocations_runs_with_a_warning() {
    ensure_libpagewise();
    let out = under_run(&[], Path::new("/bin/echo"), &["hello"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    assert!(err.contains("warning: the program made no allocation"), "{err}");
}

/// A statically linked program never loads the shim: `pagewise run` and `pagewise hps run`
/// refuse it with the reason before it starts, instead of running it with nothing on
/// Pagewise's memory and no word about it.
#[test]
fn a_statically_linked_program_is_refused_before_it_starts() {
    ensure_libpagewise();
    let dir = tempdir("static");
    let src = dir.join("hello.c");
    std::fs::write(&src, "#include <stdio.h>\nint main(void) { puts(\"started\"); return 0; }\n").unwrap();
    let prog = dir.join("hello-static");
    let st = Command::new("cc").args(["-O2", "-static", "-o"]).arg(&prog).arg(&src).status().expect("cc");
    assert!(st.success(), "cc -static failed (build-essential provides libc.a)");
    assert_eq!(String::from_utf8_lossy(&Command::new(&prog).output().unwrap().stdout), "started\n");
    for wrapper in [&["run", "--spawn-servers", "1"][..], &["hps", "run"][..]] {
        let out = Command::new(pagewise()).args(wrapper).arg("--").arg(&prog).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{wrapper:?} ran it: {err}");
        assert!(err.contains("statically linked") && err.contains("hello-static"), "{wrapper:?}: {err}");
        assert!(out.stdout.is_empty(), "{wrapper:?} started the program");
    }
}

/// What another user of the host (uid 65534) planted at the names the old code used —
/// `pagewise-preload-{pid}.so` and `pagewise-run-{pid}.decisions.json` in the temporary
/// directory, the second a symlink to a file of ours — is neither followed nor removed:
/// `pagewise run` and `pagewise hps run` keep their files in a private directory (issue 23).
#[test]
fn paths_planted_by_another_user_are_neither_followed_nor_touched() {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    use std::process::Stdio;
    ensure_libpagewise();
    let scratch = tempdir("planted");
    let prog = compile("matmul", scratch.path());
    let victim = scratch.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let tmp = std::env::temp_dir();
    for sub in [&["run", "--local-mem", "1M", "--min-alloc", "256K", "--page-size", "auto"][..], &["hps", "run"][..]] {
        // `exec` keeps the shell's pid: pagewise runs with a pid known before it starts.
        let mut child = Command::new("sh")
            .args(["-c", r#"read go; exec "$@""#, "sh"])
            .arg(pagewise())
            .args(sub)
            .arg("--")
            .arg(&prog)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let shim = tmp.join(format!("pagewise-preload-{pid}.so"));
        let decisions = tmp.join(format!("pagewise-run-{pid}.decisions.json"));
        let planted = pagewise_kernel::testing::run_as_user(
            65534,
            &format!("printf planted > '{}' && ln -s '{}' '{}'", shim.display(), victim.display(), decisions.display()),
        );
        writeln!(child.stdin.take().unwrap(), "go").unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let left = (std::fs::read_to_string(&shim).ok(), std::fs::symlink_metadata(&decisions).ok());
        let owner = std::fs::symlink_metadata(&shim).map(|m| m.uid()).ok();
        let _ = std::fs::remove_file(&shim);
        let _ = std::fs::remove_file(&decisions);
        if !planted {
            return;
        }
        assert!(out.status.success(), "{sub:?}: {err}");
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("matmul n=256"), "{sub:?}: {err}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious", "{sub:?} wrote through the symlink");
        assert_eq!(left.0.as_deref(), Some("planted"), "{sub:?} removed or rewrote the other user's file");
        assert_eq!(owner, Some(65534));
        assert!(left.1.is_some_and(|m| m.file_type().is_symlink()), "{sub:?} removed the other user's symlink");
    }
}

/// The secret `pagewise run --spawn-servers` makes for its servers reaches the program in its
/// environment and appears on no command line of the host while the program runs.
#[test]
fn the_run_secret_travels_in_the_environment_only() {
    ensure_libpagewise();
    let script = r#"s="$PAGEWISE_DLM_SECRET"
[ ${#s} -ge 32 ] || { echo "no secret in the environment"; exit 3; }
for f in /proc/[0-9]*/cmdline; do
  c=$(tr '\0' ' ' < "$f" 2>/dev/null)
  case "$c" in *"$s"*) echo "the secret is on the command line of $f: $c"; exit 4;; esac
done
echo ENV-ONLY"#;
    let out = under_run(&["--spawn-servers", "2"], Path::new("/bin/sh"), &["-c", script]);
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && so.contains("ENV-ONLY"), "{so}\n{}", String::from_utf8_lossy(&out.stderr));
}

/// A run SIGKILLed together with its program (as an experiment stops one at its time budget)
/// cannot remove its private directory; the next `pagewise run` does, once it is a minute old.
#[test]
fn the_next_run_removes_the_directory_of_a_killed_run() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    ensure_libpagewise();
    let mut child = Command::new(pagewise())
        .args(["run", "--", "/bin/sh", "-c", "echo \"$LD_PRELOAD\"; exec sleep 600"])
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let shim = Path::new(line.trim().split(':').next().unwrap()).to_path_buf();
    let dir = shim.parent().unwrap().to_path_buf();
    assert!(dir.file_name().unwrap().to_str().unwrap().starts_with("pagewise-run."), "{line}");
    // SAFETY: kill(2) takes no pointers; the group is the wrapper's own (process_group(0)).
    assert_eq!(unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) }, 0);
    child.wait().unwrap();
    assert!(shim.is_file(), "a SIGKILLed run cannot have removed {}", dir.display());
    let aged = Command::new("touch").args(["-d", "2 minutes ago"]).arg(&dir).status().unwrap();
    assert!(aged.success());
    let next = under_run(&[], Path::new("/bin/true"), &[]);
    assert!(next.status.success(), "{}", String::from_utf8_lossy(&next.stderr));
    assert!(!dir.exists(), "the next run left the killed run's {}", dir.display());
}

/// Whether uid 65534 may open a userfaultfd that serves the kernel's own accesses too: with
/// vm.unprivileged_userfaultfd = 1, or through a /dev/userfaultfd it may read and write.
fn nobody_gets_a_full_userfaultfd() -> bool {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").is_ok_and(|v| v.trim() == "1");
    let dev = std::fs::metadata("/dev/userfaultfd").is_ok_and(|m| {
        let mode = m.permissions().mode();
        (m.uid() == 65534 && mode & 0o600 == 0o600)
            || (m.gid() == 65534 && mode & 0o060 == 0o060)
            || mode & 0o006 == 0o006
    });
    sysctl || dev
}

/// An ordinary user (uid 65534) whose userfaultfd would ignore the kernel's own accesses — this
/// machine kind: vm.unprivileged_userfaultfd = 0, /dev/userfaultfd root's — would see read(2)
/// into routed memory fail with EFAULT (a Python `readinto` of a 64 MiB file did). So
/// `pagewise run` and `pagewise hps run` refuse before the program starts, and say how to allow
/// it; where that user may open a full userfaultfd, the program reads its file right.
#[test]
fn an_ordinary_user_gets_the_file_read_right_or_a_refusal_never_efault() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    ensure_libpagewise();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        pagewise_kernel::testing::skip("acting as another user needs root");
        return;
    }
    let scratch = tempdir("unprivileged");
    let dir = scratch.path();
    // The other user needs to reach the binaries and to write its files.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let prog = compile("readfile", dir);
    let bin = dir.join("pagewise");
    std::fs::copy(pagewise(), &bin).unwrap();
    std::fs::copy(pagewise().with_file_name("libpagewise.so"), dir.join("libpagewise.so")).unwrap();
    let out_dir = dir.join("out");
    std::fs::create_dir(&out_dir).unwrap();
    std::os::unix::fs::chown(&out_dir, Some(65534), Some(65534)).unwrap();
    let direct = Command::new(&prog).arg(out_dir.join("direct")).uid(65534).gid(65534).output().unwrap();
    assert!(direct.status.success(), "readfile failed on its own: {direct:?}");
    let allowed = nobody_gets_a_full_userfaultfd();
    for (sub, file) in [(&["run", "--local-mem", "1M"][..], "run"), (&["hps", "run"][..], "hps")] {
        let out = Command::new(&bin)
            .args(sub)
            .args(["--min-alloc", "256K", "--"])
            .arg(&prog)
            .arg(out_dir.join(file))
            .env("TMPDIR", "/tmp")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if allowed {
            assert!(out.status.success(), "{sub:?} as uid 65534: {err}");
            assert_eq!(out.stdout, direct.stdout, "{sub:?}: {err}");
        } else {
            assert!(!out.status.success(), "{sub:?} started the program as uid 65534:\n{err}");
            assert!(out.stdout.is_empty(), "{sub:?} ran the program: {}", String::from_utf8_lossy(&out.stdout));
            assert!(!out_dir.join(file).exists(), "{sub:?} ran the program");
            for words in ["userfaultfd", "EFAULT", "was not started", "/dev/userfaultfd", "vm.unprivileged_userfaultfd"]
            {
                assert!(err.contains(words), "{sub:?}: the refusal does not mention {words:?}: {err}");
            }
        }
    }
}
