//! `pagewise run` on unmodified C programs (tests/run/*.c): each gives the same output with
//! and without DLM underneath, with a local limit well below its data so pages really travel
//! to and from a memory server — a matrix multiply and a stencil on malloc'd arrays, a large
//! static array under --bss, fork + exec, threads, and read(2)/fread into DLM memory. Also:
//! unreachable servers are reported before the program starts, and a program with no
//! eligible allocation runs normally with a warning.

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
    let dir = tempdir(name);
    let prog = compile(name, &dir);
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
    let _ = std::fs::remove_dir_all(&dir);
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

#[test]
fn static_array_under_bss_gives_the_same_result() {
    same_output("bss", &["--bss"], |_| vec![]);
}

#[test]
fn fork_and_exec_leave_parent_and_child_correct() {
    same_output("forkexec", &[], |_| vec![]);
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
